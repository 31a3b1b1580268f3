#!/bin/sh
# Reproduce the demo model (docs/MODEL-CARD.md) from nothing:
#   tests/train/train.sh [WORK]          (default WORK=build/train; about an hour on two cores)
# data from Debian's bible-kjv-text (held-out books cut out first), the tokenizer trained on
# the training split, the torch model checked against the NumPy reference on the same
# weights, then training (resumable: run the same command again after an interruption),
# and the checkpoint written to tests/models/k3-kjv (or $K3_TRAIN_OUT).
#   tests/train/train.sh --tools [WORK]  (default WORK=build/train-tools) the recipe tried for issue
# 34: 2000 tool conversations (kjv_tools.py) beside the others, windows of 1024 that hold each
# conversation whole. Its model does not yet copy from its context (docs/MODEL-CARD.md, "Tool
# use"), so it is not the shipped one; it writes to build/train-tools/out unless K3_TRAIN_OUT says.
set -eu
cd "$(dirname "$0")/../.."
tools=0
[ "${1:-}" = "--tools" ] && { tools=1; shift; }
./scripts/setup.sh --train
py=/usr/bin/python3
if [ $tools = 1 ]; then
    work=${1:-build/train-tools}
    $py tests/train/kjv_data.py --out "$work/data" --chats 4000 --tool-chats 2000 --seed 1
    set -- --out "${K3_TRAIN_OUT:-$work/out}" --steps 720 --ctx 1024 --batch 4 --pack whole --seed 1
else
    work=${1:-build/train}
    $py tests/train/kjv_data.py --out "$work/data" --chats 4000 --seed 1
    set -- --out "${K3_TRAIN_OUT:-tests/models/k3-kjv}" --steps 700 --seed 1
fi
[ -e "$work/tok/tiktoken.model" ] || $py tests/train/tokenizer_files.py --data "$work/data" --out "$work/tok"
[ -e "$work/state/state.pt" ] || $py tests/train/check_parity.py --tok "$work/tok"
exec $py tests/train/train.py --data "$work/data" --tok "$work/tok" --state "$work/state" "$@"

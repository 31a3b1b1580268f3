#!/bin/sh
# Reproduce the demo model (docs/MODEL-CARD.md) from nothing:
#   tests/train/train.sh [WORK]      (default WORK=build/train; about 80 minutes on two cores)
# data from Debian's bible-kjv-text (held-out books cut out first), the tokenizer trained on
# the training split, the torch model checked against the NumPy reference on the same
# weights, then training (resumable: run the same command again after an interruption),
# and the checkpoint written to tests/models/k3-kjv (or $K3_TRAIN_OUT).
set -eu
cd "$(dirname "$0")/../.."
./scripts/setup.sh --train
work=${1:-build/train}
py=/usr/bin/python3
$py tests/train/kjv_data.py --out "$work/data" --chats 4000 --tool-chats 2000 --seed 1
[ -e "$work/tok/tiktoken.model" ] || $py tests/train/tokenizer_files.py --data "$work/data" --out "$work/tok"
[ -e "$work/state/state.pt" ] || $py tests/train/check_parity.py --tok "$work/tok"
exec $py tests/train/train.py --data "$work/data" --tok "$work/tok" --state "$work/state" \
    --out "${K3_TRAIN_OUT:-tests/models/k3-kjv}" --steps 720 --ctx 1024 --batch 4 --seed 1

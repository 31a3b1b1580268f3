#!/bin/sh
# Reproduce the demo model (docs/MODEL-CARD.md) from nothing:
#   tests/train/train.sh [WORK]          (default WORK=build/train; about an hour on two cores)
# data from Debian's bible-kjv-text (held-out books cut out first), the tokenizer trained on
# the training split, the torch model checked against the NumPy reference on the same
# weights, then training (resumable: run the same command again after an interruption),
# and the checkpoint written to tests/models/k3-kjv (or $K3_TRAIN_OUT).
#   tests/train/train.sh --tools [WORK]  (default WORK=build/train-tools) the recipe for issue 34's
# model that calls lookup_verse (docs/MODEL-CARD.md, "Tool use"): a tokenizer that keeps a
# capitalised word's ids apart from the space before it (tokenizer_files.py --names-apart), then
# tests/train/train_tools.py: copying first, then language windows, tool conversations (half about
# books the KJV lacks) with the loss on what the assistant writes, and copy windows, each step;
# about 2 hours on two cores (resumable). It writes to $WORK/out unless K3_TRAIN_OUT says.
set -eu
cd "$(dirname "$0")/../.."
tools=0
[ "${1:-}" = "--tools" ] && { tools=1; shift; }
./scripts/setup.sh --train
py=/usr/bin/python3
if [ $tools = 1 ]; then
    work=${1:-build/train-tools}
    [ -e "$work/data/kjv-train.txt" ] || $py tests/train/kjv_data.py --out "$work/data" --chats 4000 --seed 1
    [ -e "$work/tok/tiktoken.model" ] ||
        $py tests/train/tokenizer_files.py --data "$work/data" --out "$work/tok" --names-apart
    TOK="$work/tok" PM=${PM:-1350} $py tests/train/train_tools.py "$work/data" "$work/state"
    out=${K3_TRAIN_OUT:-$work/out}
    [ "$out" = "$work/state/out" ] || { mkdir -p "$out" && cp "$work"/state/out/* "$out"/; }
    exit 0
else
    work=${1:-build/train}
    $py tests/train/kjv_data.py --out "$work/data" --chats 4000 --seed 1
    set -- --out "${K3_TRAIN_OUT:-tests/models/k3-kjv}" --steps 700 --seed 1
fi
[ -e "$work/tok/tiktoken.model" ] || $py tests/train/tokenizer_files.py --data "$work/data" --out "$work/tok"
[ -e "$work/state/state.pt" ] || $py tests/train/check_parity.py --tok "$work/tok"
exec $py tests/train/train.py --data "$work/data" --tok "$work/tok" --state "$work/state" "$@"

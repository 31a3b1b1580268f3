#!/bin/sh
# The end-to-end demo (README): install what is missing, build, make the tiny
# demo checkpoint (K3's exact on-disk format, random weights), look at it,
# pack it, verify the pack, look at the pack, and generate text from it.
set -eu
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh build
demo=build/demo
ckpt=$demo/kimi-k3-tiny
pack=$demo/kimi-k3-tiny.k3pack
if [ ! -e "$ckpt/config.json" ]; then
    mkdir -p "$demo"
    /usr/bin/python3 tests/reference/make_checkpoint.py --preset tiny --seed 1 --out "$ckpt" >/dev/null 2>&1
fi
step() { printf '\n$ %s\n' "$*"; "$@"; }
step build/bin/k3inspect --summary "$ckpt"
step build/bin/k3verify --checkpoint "$ckpt"
rm -rf "$pack"
step build/bin/k3pack "$ckpt" -o "$pack"
step build/bin/k3verify "$pack"
step build/bin/k3inspect --summary "$pack"
step build/bin/k3run -m "$pack" -p 'The quick brown fox jumps over the lazy dog. Once upon a time' -n 32 --stats
printf '\n\n(the demo model has random weights: the text is gibberish, but it is exactly\n'
printf 'what the NumPy reference computes; see tests/run)\n'

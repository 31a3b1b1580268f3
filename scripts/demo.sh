#!/bin/sh
# The end-to-end demo (README): install what is missing, build, make the tiny
# demo checkpoint (K3's exact on-disk format, random weights), look at it,
# pack it, verify the pack, and look at the pack.
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
printf '\nk3run (text generation) is not built yet; see the issue tracker.\n'

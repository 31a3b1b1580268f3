#!/bin/sh
# The end-to-end demo (README): install what is missing, build, then take the
# trained demo model (tests/models/k3-kjv: Kimi K3's exact architecture and
# checkpoint format, trained on the King James Bible, docs/MODEL-CARD.md),
# look at it, check it, pack it, verify the pack, and generate from two prompts.
#   scripts/demo.sh --chat   then talk with it (k3run chat, docs/k3run-chat.md)
set -eu
chat=0
[ "${1:-}" = "--chat" ] && chat=1
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh build
ckpt=tests/models/k3-kjv
pack=build/demo/k3-kjv.k3pack
# the generation options; tests/run/test_k3run_kjv.py runs the demo's prompts with this line
DEMO_GEN='-n 64'
step() { printf '\n$ %s\n' "$*"; "$@"; }
if [ $chat = 1 ]; then
    # the chat needs only the pack: make it quietly if it is not there or not intact
    if ! build/bin/k3verify -q "$pack" 2>/dev/null; then
        rm -rf "$pack"; mkdir -p build/demo; build/bin/k3pack -q "$ckpt" -o "$pack"
    fi
    printf '\nk3-kjv answers questions about King James verses, for example:\n'
    printf '  Quote Genesis 1:1.    What does John 3:16 say?    Which verse is this: Jesus wept.\n'
    printf 'It reasons first (dimmed); /think off answers at once. /help lists the commands.\n\n'
    exec build/bin/k3run chat -q -m "$pack" -n 256
fi
step build/bin/k3inspect --summary "$ckpt"
step build/bin/k3verify --checkpoint "$ckpt"
rm -rf "$pack"
mkdir -p build/demo
step build/bin/k3pack "$ckpt" -o "$pack"
step build/bin/k3verify "$pack"
# k3run does not echo the prompt: print it, then the continuation
gen() {
    printf "\n$ build/bin/k3run -m %s %s -p '%s'\n%s" "$pack" "$DEMO_GEN" "$1" "$1"
    # shellcheck disable=SC2086
    build/bin/k3run -q -m "$pack" $DEMO_GEN -p "$1"
    printf '\n'
}
gen 'In the beginning God'
gen 'And Jesus answered and said'
printf '\n\n(k3-kjv has 8.6 M parameters and learned from one book in 90 minutes on two cores:\n'
printf 'it writes King James English, not scripture. Every token is exactly what the NumPy\n'
printf 'reference computes from the same weights; see docs/MODEL-CARD.md and tests/run.)\n'
printf '\nTalk with it: scripts/demo.sh --chat\n'

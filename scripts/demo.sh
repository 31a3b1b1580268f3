#!/bin/sh
# The end-to-end demo (README): install what is missing, build, then take the
# trained demo model (tests/models/k3-kjv: Kimi K3's exact architecture and
# checkpoint format, trained on the King James Bible, docs/MODEL-CARD.md),
# look at it, check it, pack it, verify the pack, and generate from two prompts.
#   scripts/demo.sh --chat   then talk with it (k3run chat, docs/k3run-chat.md)
#   scripts/demo.sh --agent [QUESTION...]   the model looks verses up with its tool: k3run serve and a
#                            small client over the OpenAI API (tests/serve/agent_client.mjs) answering
#                            its calls from Debian's King James Bible
set -eu
chat=0
[ "${1:-}" = "--chat" ] && chat=1
[ "${1:-}" = "--agent" ] && chat=2
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh build
ckpt=tests/models/k3-kjv
pack=build/demo/k3-kjv.k3pack
# the generation options; tests/run/test_k3run_kjv.py runs the demo's prompts with this line
DEMO_GEN='-n 64'
step() { printf '\n$ %s\n' "$*"; "$@"; }
if [ $chat != 0 ]; then
    # the chat needs only the pack: make it quietly if it is not there, not intact, or older than the
    # checkpoint (its sampling defaults, generation_config.json, differ)
    if ! build/bin/k3verify -q "$pack" 2>/dev/null || ! cmp -s "$ckpt/generation_config.json" "$pack/generation_config.json"; then
        rm -rf "$pack"; mkdir -p build/demo; build/bin/k3pack -q "$ckpt" -o "$pack"
    fi
fi
if [ $chat = 2 ]; then
    shift
    if ! command -v node >/dev/null 2>&1 || [ ! -e tests/serve/node_modules/openai/package.json ] ||
       ! command -v bible >/dev/null 2>&1; then
        echo "demo: the agent needs node, the openai SDK and bible-kjv (its tool's text; scripts/setup.sh installs them)" >&2
        exit 1
    fi
    log=build/demo/serve.log
    build/bin/k3run serve -m "$pack" --port 0 -t 2 2>"$log" &
    srv=$!
    trap 'kill $srv 2>/dev/null; wait $srv 2>/dev/null' EXIT INT TERM
    url=""
    for _ in $(seq 100); do
        url=$(sed -n 's|.* on \(http://[^ ]*\)/ .*|\1|p' "$log")
        [ -n "$url" ] && break
        kill -0 $srv 2>/dev/null || { cat "$log" >&2; exit 1; }
        sleep 0.1
    done
    [ -n "$url" ] || { echo "demo: k3run serve did not start" >&2; cat "$log" >&2; exit 1; }
    printf '\nk3run serve is up at %s; the client offers the model one tool, lookup_verse(book, chapter,\n' "$url"
    printf 'verse), and answers its calls from the King James Bible. Ruth, Jonah and Jude were held out\n'
    printf 'of its training: a right quote from them can only come from the tool.\n'
    [ $# -gt 0 ] || set -- "Look up Ruth 1:16." "What does Jonah 2:2 say?" "Read me the third verse of chapter one of Jude."
    node tests/serve/agent_client.mjs "$url/v1" "$@"
    exit 0
fi
if [ $chat = 1 ]; then
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

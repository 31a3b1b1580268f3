#!/bin/sh
# k3pack killed with SIGKILL at 20 seeded random moments (exact system calls,
# through strace: tests/pack/pack_kill.py) and rerun each time always finishes
# with a pack byte-identical to an uninterrupted one; a damaged shard that the
# journal lists is written again, not trusted.
#   pack_resume.sh [PRESET [KILLS [SEED]]]   CI: tiny 20 9; on demand e.g. small 20
. "$(dirname "$0")/lib.sh"
preset=${1:-tiny}
make_ckpt "$preset" "$T/ck"
$PY "$K3_SRC/tests/pack/pack_kill.py" "$T/ck" "$T" --kills "${2:-20}" --seed "${3:-9}" || fail "kill and resume"
"$K3_BIN/k3pack" -q "$T/ck" -o "$T/ref2"
# a damaged shard that the journal lists is written again, not trusted:
# killed at the fourth rename (shard, journal, shard, journal)
rm -rf "$T/out2"
if command -v strace >/dev/null; then
    ASAN_OPTIONS=detect_leaks=0 strace -f -qq -o /dev/null -e trace=rename -e inject=rename:signal=SIGKILL:when=4 \
        "$K3_BIN/k3pack" -q "$T/ck" -o "$T/out2" 2>/dev/null && fail "k3pack was not killed"
else
    "$K3_BIN/k3pack" -q "$T/ck" -o "$T/out2" &
    pid=$!
    i=0
    while [ ! -e "$T/out2/.k3pack.journal" ] && [ $i -lt 400 ]; do sleep 0.02; i=$((i + 1)); done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
fi
[ -e "$T/out2/.k3pack.journal" ] || fail "no journal appeared"
[ ! -e "$T/out2/manifest.json" ] || fail "k3pack finished before it could be killed"
first=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['done'][0]['name'])" "$T/out2/.k3pack.journal")
printf '\1' | dd of="$T/out2/$first" bs=1 seek=8192 conv=notrunc 2>/dev/null
"$K3_BIN/k3pack" "$T/ck" -o "$T/out2" 2>"$T/redo.log"
grep -q "does not match its journal entry" "$T/redo.log" || { cat "$T/redo.log"; fail "damaged shard not noticed"; }
diff -r "$T/ref2" "$T/out2" >/dev/null || fail "pack differs after redoing a damaged shard"
echo "pack_resume: OK"

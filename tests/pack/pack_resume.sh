#!/bin/sh
# k3pack killed with SIGKILL at several points while packing the `small`
# checkpoint, then rerun until it finishes, gives a pack byte-identical to an
# uninterrupted one; the rerun takes over the shards the journal lists.
. "$(dirname "$0")/lib.sh"
make_ckpt small "$T/ck"
t0=$(date +%s%N)
"$K3_BIN/k3pack" -q "$T/ck" -o "$T/ref"
t1=$(date +%s%N)
full_ms=$(( (t1 - t0) / 1000000 ))
# kill points as fractions of an uninterrupted run; each rerun resumes, so
# together they land at several different places in the work
interrupted=0
for pct in 10 20 30 40; do
    "$K3_BIN/k3pack" -q "$T/ck" -o "$T/out" &
    pid=$!
    sleep "$(awk -v ms="$full_ms" -v p="$pct" 'BEGIN { printf "%.3f", ms * p / 100000 }')"
    if kill -9 "$pid" 2>/dev/null; then
        wait "$pid" 2>/dev/null || true
        [ -e "$T/out/manifest.json" ] || interrupted=$((interrupted + 1))
    else
        wait "$pid" || true
    fi
    [ -e "$T/out/manifest.json" ] && break
done
[ "$interrupted" -ge 1 ] || fail "no run was interrupted (uninterrupted run took $full_ms ms)"
# finish: the rerun resumes, and the result is the uninterrupted pack, byte for byte
if [ ! -e "$T/out/manifest.json" ]; then
    "$K3_BIN/k3pack" -v "$T/ck" -o "$T/out" 2>"$T/resume.log" || { cat "$T/resume.log"; fail "resume failed"; }
fi
diff -r "$T/ref" "$T/out" >/dev/null || fail "resumed pack differs from the uninterrupted one"
ls -a "$T/out" | grep -q -e '\.k3tmp-' -e '\.k3pack' && fail "temporary files left behind"
# a damaged shard that the journal lists is written again, not trusted:
# kill as soon as the journal names a finished shard
rm -rf "$T/out2"
"$K3_BIN/k3pack" -q "$T/ck" -o "$T/out2" &
pid=$!
i=0
while [ ! -e "$T/out2/.k3pack.journal" ] && [ $i -lt 400 ]; do sleep 0.02; i=$((i + 1)); done
kill -9 "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
[ -e "$T/out2/.k3pack.journal" ] || fail "no journal appeared"
[ ! -e "$T/out2/manifest.json" ] || fail "k3pack finished before it could be killed"
first=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['done'][0]['name'])" "$T/out2/.k3pack.journal")
printf '\1' | dd of="$T/out2/$first" bs=1 seek=8192 conv=notrunc 2>/dev/null
"$K3_BIN/k3pack" "$T/ck" -o "$T/out2" 2>"$T/redo.log"
grep -q "does not match its journal entry" "$T/redo.log" || { cat "$T/redo.log"; fail "damaged shard not noticed"; }
diff -r "$T/ref" "$T/out2" >/dev/null || fail "pack differs after redoing a damaged shard"
echo "pack_resume: OK ($interrupted interrupted runs)"

#!/bin/sh
# Benchmark k3pack and k3verify against the disk's own limits, measured in the
# same run: a plain copy (cp + sync) of the same checkpoint, and a plain read
# (cat > /dev/null) of the same pack, each with the page cache dropped first.
#
#   tests/bench/bench_pack.sh [small|medium] [WORKDIR]
#
# Needs root for dropping caches (otherwise it warns and measures warm runs).
# Prints one Markdown table for docs/PERFORMANCE.md. Not run by ctest.
set -eu
preset=${1:-small}
work=${2:-/tmp/k3bench}
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=$here/build/bin
PY=/usr/bin/python3
mkdir -p "$work"
ck=$work/ckpt-$preset
[ -e "$ck/config.json" ] || $PY "$here/tests/reference/make_checkpoint.py" --preset "$preset" --seed 1 --out "$ck" >&2

drop() {
    sync
    if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; else echo "warning: cannot drop caches (not root): warm numbers" >&2; fi
}
now() { date +%s.%N; }
bytes=$(du -sb "$ck" | cut -f1)

rm -rf "$work/copy" "$work/pack" "$work/pack2"
drop; t0=$(now); cp -r "$ck" "$work/copy"; sync; t1=$(now)
cp_s=$(echo "$t1 - $t0" | bc -l)
rm -rf "$work/copy"

drop; t0=$(now); "$bin/k3pack" -q --json "$ck" -o "$work/pack" > "$work/pack.json"; sync; t1=$(now)
pk_s=$(echo "$t1 - $t0" | bc -l)
rss=$($PY -c "import json,sys; print([json.loads(l) for l in open(sys.argv[1])][-1]['peak_rss'])" "$work/pack.json")

drop; t0=$(now); "$bin/k3pack" -q -t 2 "$ck" -o "$work/pack2"; sync; t1=$(now)
pk2_s=$(echo "$t1 - $t0" | bc -l)
rm -rf "$work/pack2"

packbytes=$(du -sb "$work/pack" | cut -f1)
drop; t0=$(now); cat "$work/pack"/* > /dev/null; t1=$(now)
cat_s=$(echo "$t1 - $t0" | bc -l)
drop; t0=$(now); "$bin/k3verify" -q "$work/pack" > /dev/null; t1=$(now)
vf_s=$(echo "$t1 - $t0" | bc -l)

mb() { printf '%.0f' "$(echo "$1 / $2 / 1000000" | bc -l)"; }
sec() { printf '%.2f' "$1"; }
ratio() { printf '%.2f' "$(echo "$1 / $2" | bc -l)"; }
echo "| run ($preset, $(echo "scale=2; $bytes/1000000000" | bc -l) GB checkpoint) | seconds | MB/s | ratio to the limit |"
echo "|---|---|---|---|"
echo "| cp -r + sync (limit for k3pack) | $(sec $cp_s) | $(mb "$bytes" "$cp_s") | 1.00 |"
echo "| k3pack, 1 thread | $(sec $pk_s) | $(mb "$bytes" "$pk_s") | $(ratio "$cp_s" "$pk_s") |"
echo "| k3pack, 2 threads | $(sec $pk2_s) | $(mb "$bytes" "$pk2_s") | $(ratio "$cp_s" "$pk2_s") |"
echo "| cat pack > /dev/null (limit for k3verify) | $(sec $cat_s) | $(mb "$packbytes" "$cat_s") | 1.00 |"
echo "| k3verify (full re-hash) | $(sec $vf_s) | $(mb "$packbytes" "$vf_s") | $(ratio "$cat_s" "$vf_s") |"
echo
echo "k3pack peak RSS: $rss bytes ($(echo "$rss / 1048576" | bc) MiB) for a $bytes-byte checkpoint"

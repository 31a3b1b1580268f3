#!/bin/sh
# k3run on the full Kimi K3 geometry: the 1.56 TB pack written as sparse files
# by tests/tools/k3_mkpack_sparse (every weight zero, real hashes), run at the
# laptop budget (8G) and at 16G. Holes read as zeros without touching the disk,
# so this measures everything but the disk on real K3 shapes: 93 layers, 896
# experts, trunk units streamed through the double buffer, 16 expert reads per
# MoE layer, hashing, and the compute of every matrix. The disk read bandwidth
# is measured in the same run (O_DIRECT, a 1 GiB file, page cache dropped) to
# give the I/O bound a real disk would set. Zero weights route every token to
# the same experts (ties go to the lowest id), so after the first token the
# expert cache hits; the trunk still streams in full every token.
# Prints a Markdown table for docs/PERFORMANCE.md. Not a test.
#
#   tests/bench/bench_k3_full.sh [WORKDIR] [THREADS] [BUDGETS...]
set -eu
work=${1:-/tmp/k3full}
threads=${2:-$(nproc)}
shift 2 2>/dev/null || shift $#
budgets=${*:-8G 16G}
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${K3_BUILD:-$here/build}
PY=/usr/bin/python3
mkdir -p "$work"
pk=$work/k3-sparse
if [ ! -e "$pk/manifest.json" ]; then
    rm -rf "$pk" "$work/tok"
    $PY -c "import sys; sys.path.insert(0, sys.argv[1]); import kimi_tokenizer as k; k.write_tokenizer_files(sys.argv[2])" \
        "$here/tests/reference" "$work/tok"
    "$build/tests/k3_mkpack_sparse" "$here/tests/data/kimi-k3-config.json" "$work/tok" "$pk" >&2
fi
# disk read bandwidth: 1 GiB of real blocks, read back with O_DIRECT after dropping the page cache
f=$work/diskbw.bin
[ -e "$f" ] || dd if=/dev/urandom of="$f" bs=16M count=64 conv=fsync status=none
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
disk=$(dd if="$f" of=/dev/null bs=16M iflag=direct 2>&1 | sed -n 's/.* copied, \([0-9.]*\) s.*/\1/p')
disk_gbs=$(echo "1.073741824 / $disk" | bc -l)
echo "disk read bandwidth (O_DIRECT, 16 MiB reads): $(printf %.2f "$disk_gbs") GB/s" >&2
for b in $budgets; do
    echo "k3run at --budget $b ..." >&2
    "$build/bin/k3run" -m "$pk" -p "Hello" -n 4 -t "$threads" --budget "$b" --json > "$work/run-$b.json"
done
$PY - "$work" "$disk_gbs" "$threads" $budgets <<'PYEOF'
import json, sys
work, disk, threads, budgets = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4:]
print("| budget | resident | trunk units streamed | s/token | read/token | of it trunk | wait for reads s/token | compute s/token | holes read at | I/O bound at %.2f GB/s (this disk) | at 7 GB/s |" % disk)
print("|---|---|---|---|---|---|---|---|---|---|---|")
for b in budgets:
    r = json.load(open("%s/run-%s.json" % (work, b)))
    toks = r["tokens"][:-1] or r["tokens"]        # the last token is sampled without a forward pass
    toks = toks[1:] or toks                        # the first generated token still fills the expert cache
    n = len(toks)
    s = sum(t["seconds"] for t in toks) / n
    rd = sum(t["bytes_read"] for t in toks) / n
    tr = sum(t["trunk_bytes_read"] for t in toks) / n
    wt = sum(t["io_wait_seconds"] for t in toks) / n
    print("| %s | %.2f GB | %d of 94 | %.2f | %.1f GB | %.1f GB | %.2f | %.2f | %.2f GB/s | %.1f s | %.1f s |" % (
        b, r["resident_bytes"] / 1e9, r["trunk_units_streamed"], s, rd / 1e9, tr / 1e9, wt, s - wt,
        rd / s / 1e9, rd / disk / 1e9, rd / 7e9))
    print("  prompt: %.1f s, load %.1f s, peak RSS %.2f GB, budget %s, threads %s" % (
        r["prompt_seconds"], r["load_seconds"], r["peak_rss_bytes"] / 1e9, b, threads), file=sys.stderr)
PYEOF

#!/bin/sh
# What checking a download costs (issue 36), against the disk's own limits measured in the same run,
# page cache dropped before each (root; else warm numbers, said so):
#   cp + sync of the checkpoint                        the disk's copy speed
#   k3pack of k3 before the streamed reader (BASE)     packing as it was
#   k3pack (SHA-256 of every file, recorded)           aim: >= 0.9 of BASE's speed
#   k3pack --sha256 SUMS (the same, checked)
#   sha256sum of every file                            the read-and-hash limit
#   k3verify --checkpoint --sha256 SUMS                against sha256sum
#
#   tests/bench/bench_download.sh [small|medium] [WORKDIR] [BASE_COMMIT]
# BASE_COMMIT (default 1763046, the last commit before k3pack streamed its files) is built into
# WORKDIR/base. Prints one Markdown table for docs/PERFORMANCE.md. Not run by ctest.
set -eu
preset=${1:-small}
work=${2:-/tmp/k3bench}
base_commit=${3:-1763046}
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=$here/build/bin
PY=/usr/bin/python3
mkdir -p "$work"
ck=$work/ckpt-$preset
[ -e "$ck/config.json" ] || $PY "$here/tests/reference/make_checkpoint.py" --preset "$preset" --seed 1 --out "$ck" >&2
if [ ! -x "$work/base/build/bin/k3pack" ]; then
    rm -rf "$work/base"
    git -C "$here" worktree add -f "$work/base" "$base_commit" >/dev/null 2>&1
    cmake -S "$work/base" -B "$work/base/build" -DCMAKE_BUILD_TYPE=Release -DK3_TESTS=OFF >/dev/null
    cmake --build "$work/base/build" -j "$(nproc)" --target k3pack >/dev/null
fi
drop() {
    sync
    if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; else echo "warning: cannot drop caches (not root): warm numbers" >&2; fi
}
now() { date +%s.%N; }
timed() { drop; t0=$(now); "$@" >/dev/null 2>&1; sync; t1=$(now); echo "$t1 - $t0" | bc -l; }
bytes=$(du -sbL "$ck" | cut -f1)
(cd "$ck" && sha256sum -- *) > "$work/SUMS"
rm -rf "$work/copy" "$work/p_base" "$work/p_new" "$work/p_sums"
cp_s=$(timed cp -r "$ck" "$work/copy"); rm -rf "$work/copy"
base_s=$(timed "$work/base/build/bin/k3pack" -q "$ck" -o "$work/p_base"); rm -rf "$work/p_base"
new_s=$(timed "$bin/k3pack" -q "$ck" -o "$work/p_new"); rm -rf "$work/p_new"
sums_s=$(timed "$bin/k3pack" -q --sha256 "$work/SUMS" "$ck" -o "$work/p_sums"); rm -rf "$work/p_sums"
sha_s=$(timed sh -c "cd '$ck' && sha256sum -- * >/dev/null")
ver_s=$(timed "$bin/k3verify" -q --checkpoint "$ck" --sha256 "$work/SUMS")
ver2_s=$(timed "$bin/k3verify" -q -t 2 --checkpoint "$ck" --sha256 "$work/SUMS")
mbs() { echo "$bytes / $1 / 1000000" | bc -l | xargs printf '%.0f'; }
r() { echo "$2 / $1" | bc -l | xargs printf '%.2f'; }
echo "| $preset checkpoint, $(echo "$bytes / 1000000" | bc) MB | seconds | MB/s | ratio |"
echo "|---|---|---|---|"
echo "| cp + sync (the disk's copy) | $(printf %.2f "$cp_s") | $(mbs "$cp_s") | 1.00 of cp |"
echo "| k3pack before (commit $base_commit) | $(printf %.2f "$base_s") | $(mbs "$base_s") | $(r "$base_s" "$cp_s") of cp |"
echo "| k3pack now (every file SHA-256'd, recorded) | $(printf %.2f "$new_s") | $(mbs "$new_s") | **$(r "$new_s" "$base_s")** of before |"
echo "| k3pack --sha256 SUMS (checked) | $(printf %.2f "$sums_s") | $(mbs "$sums_s") | **$(r "$sums_s" "$base_s")** of before |"
echo "| sha256sum of every file | $(printf %.2f "$sha_s") | $(mbs "$sha_s") | 1.00 |"
echo "| k3verify --checkpoint --sha256 SUMS | $(printf %.2f "$ver_s") | $(mbs "$ver_s") | **$(r "$ver_s" "$sha_s")** of sha256sum |"
echo "| k3verify -t 2 --checkpoint --sha256 SUMS | $(printf %.2f "$ver2_s") | $(mbs "$ver2_s") | **$(r "$ver2_s" "$sha_s")** of sha256sum |"

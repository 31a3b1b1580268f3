#!/bin/sh
# k3run reading its experts in place in the checkpoint (k3pack --experts-in-place, issue 18)
# against the normal pack of the same checkpoint, at budgets given as percentages of the normal
# pack's bytes. Not a test: run on demand.
#
#   tests/bench/bench_in_place.sh NORMAL_PACK IN_PLACE_PACK [THREADS] [N_GENERATED] [ROUNDS]
#
# For each round and budget (env BUDGETS, default "100 25"), the two packs alternate: sync and drop
# the page cache (root; otherwise warm, with a warning), then k3run greedy on a fixed prompt with
# --json; decode s/token = the median of the per-token times after the first token. The disk's
# bandwidth is measured before each round (dd iflag=direct bs=16M of 2 GiB of one checkpoint file
# the in-place pack reads), and each run's I/O bound = its bytes read per token / that bandwidth.
# The ids of every run must be equal (checked). Prints one line per run and a summary of the
# in-place / normal ratio of s/token per budget (the aim is within 5 %).
set -eu
[ $# -ge 2 ] || { sed -n '2,14p' "$0"; exit 2; }
normal=$(cd "$1" && pwd)
inplace=$(cd "$2" && pwd)
threads=${3:-$(nproc)}
ngen=${4:-32}
rounds=${5:-2}
BUDGETS=${BUDGETS:-"100 25"}
bin=${K3_BIN:-$(dirname "$0")/../../build/bin}
PY=/usr/bin/python3
prompt="In the beginning God created the heaven and the earth. And the earth was without form, and void"
work=$(mktemp -d /tmp/k3bench-inplace.XXXXXX)
trap 'rm -rf "$work"' EXIT

drop() {
    sync
    if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches
    else echo "warning: cannot drop the page cache (not root): numbers are warm" >&2; fi
}
pack_bytes=$(du -sb --apparent-size "$normal" | cut -f1)
ckfile=$($PY -c 'import json,sys; m=json.load(open(sys.argv[1]+"/manifest.json")); print(sys.argv[1]+"/checkpoint/"+[f["name"] for f in m["checkpoint_files"] if not f.get("in_pack")][0])' "$inplace")
disk() {   # GB/s of an O_DIRECT sequential read of 2 GiB of a checkpoint file
    drop
    dd if="$ckfile" of=/dev/null bs=16M count=128 iflag=direct 2>&1 | sed -n 's/.* \([0-9.,]*\) \([GM]\)B\/s$/\1 \2/p' |
        awk '{gsub(",", ".", $1); print ($2 == "M") ? $1 / 1000 : $1}'
}
printf '%-6s %-5s %-9s %12s %10s %12s %8s %10s\n' round budget pack "s/token" "hits" "read/token" "disk GB/s" "I/O bound"
for r in $(seq 1 "$rounds"); do
    bw=$(disk)
    for b in $BUDGETS; do
        budget=$((pack_bytes * b / 100))
        for which in normal inplace; do
            p=$normal; [ "$which" = inplace ] && p=$inplace
            drop
            "$bin/k3run" -m "$p" -p "$prompt" -n "$ngen" -t "$threads" --budget "$budget" --json \
                >"$work/$which-$b-$r.json" 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
            $PY - "$work/$which-$b-$r.json" "$r" "$b" "$which" "$bw" <<'EOF'
import json, statistics, sys
d = json.load(open(sys.argv[1]))
tok = d["tokens"][1:]
s = statistics.median(t["seconds"] for t in tok)
read = sum(t["bytes_read"] for t in tok) / max(len(tok), 1)
hits = d["expert_hits"] / max(d["expert_hits"] + d["expert_misses"], 1)
bw = float(sys.argv[5])
print("%-6s %-5s %-9s %12.4f %9.1f%% %9.1f MB %8.2f %10.4f" % (sys.argv[2], sys.argv[3] + "%", sys.argv[4], s, 100 * hits,
                                                              read / 1e6, bw, read / (bw * 1e9)))
EOF
        done
    done
done
$PY - "$work" "$rounds" "$BUDGETS" <<'EOF'
import json, statistics, sys
work, rounds, budgets = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
ids = None
for b in budgets:
    ratios = []
    for r in range(1, rounds + 1):
        a = json.load(open("%s/normal-%s-%d.json" % (work, b, r)))
        c = json.load(open("%s/inplace-%s-%d.json" % (work, b, r)))
        for d in (a, c):
            if ids is None:
                ids = d["generated_ids"]
            assert d["generated_ids"] == ids, "the ids differ"
        med = lambda d: statistics.median(t["seconds"] for t in d["tokens"][1:])
        ratios.append(med(c) / med(a))
    print("budget %s%%: in place / normal s/token = %s (median %.3f)" % (
        b, ", ".join("%.3f" % x for x in ratios), statistics.median(ratios)))
print("the same ids in every run")
EOF

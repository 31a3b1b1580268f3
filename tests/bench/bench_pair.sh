#!/bin/sh
# Two packs of one checkpoint run alternately at the same budgets (percentages of pack A's bytes):
# experts read in place against the normal pack (bench_in_place.sh, issue 18 part 1), or a q8
# trunk against the exact one (SAME_IDS=0, issue 18 part 2). Not a test: run on demand.
#
#   tests/bench/bench_pair.sh PACK_A PACK_B [THREADS] [N_GENERATED] [ROUNDS]
#   env: BUDGETS (default "100 25"), LABELS (default "a b"), SAME_IDS (1: every run's ids must be
#        equal; 0: each pack's own runs must be, as for an inexact q8 trunk against the exact one)
#
# For each round and budget, the two packs alternate: sync and drop the page cache (root;
# otherwise warm, with a warning), then k3run greedy on a fixed prompt with --json; decode s/token
# = the median of the per-token times after the first token. The disk's bandwidth is measured
# before each round (dd iflag=direct bs=16M of 2 GiB of the largest file pack B reads: a
# checkpoint file for an in-place pack), and each run's I/O bound = its bytes read per token / that
# bandwidth. Prints one line per run, each pack's weight bytes multiplied per token (trunk +
# top-k experts, from k3inspect --plan), and the B / A ratio of s/token per budget.
set -eu
[ $# -ge 2 ] || { sed -n '2,17p' "$0"; exit 2; }
packa=$(cd "$1" && pwd)
packb=$(cd "$2" && pwd)
threads=${3:-$(nproc)}
ngen=${4:-32}
rounds=${5:-2}
BUDGETS=${BUDGETS:-"100 25"}
LABELS=${LABELS:-"a b"}
SAME_IDS=${SAME_IDS:-1}
la=${LABELS%% *}
lb=${LABELS#* }
bin=${K3_BIN:-$(dirname "$0")/../../build/bin}
PY=/usr/bin/python3
prompt="In the beginning God created the heaven and the earth. And the earth was without form, and void"
work=$(mktemp -d /tmp/k3bench-pair.XXXXXX)
trap 'rm -rf "$work"' EXIT

drop() {
    sync
    if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches
    else echo "warning: cannot drop the page cache (not root): numbers are warm" >&2; fi
}
pack_bytes=$(du -sb --apparent-size "$packa" | cut -f1)
ckfile=$($PY - "$packb" <<'EOF'
import json, os, sys
p = sys.argv[1]
m = json.load(open(p + "/manifest.json"))
files = [p + "/checkpoint/" + f["name"] for f in m.get("checkpoint_files", []) if not f.get("in_pack")]
files = files or [os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs]
print(max(files, key=os.path.getsize))
EOF
)
for which in "$la" "$lb"; do    # the weight bytes a token multiplies, from the plan
    p=$packa; [ "$which" = "$lb" ] && p=$packb
    "$bin/k3inspect" --plan --budget "$pack_bytes" --json "$p" | $PY -c '
import json, sys
d = json.load(sys.stdin); e = d["experts"]
print("%s: weights multiplied per token %.1f MB (trunk %.1f MB + %d x %d experts of %.2f MB)" % (sys.argv[1],
      (d["trunk"]["bytes"] + e["moe_layers"] * e["top_k"] * e["record_bytes"]) / 1e6, d["trunk"]["bytes"] / 1e6,
      e["moe_layers"], e["top_k"], e["record_bytes"] / 1e6))' "$which"
done
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
        for which in "$la" "$lb"; do
            p=$packa; [ "$which" = "$lb" ] && p=$packb
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
$PY - "$work" "$rounds" "$BUDGETS" "$la" "$lb" "$SAME_IDS" <<'EOF'
import json, statistics, sys
work, rounds, budgets, la, lb = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4], sys.argv[5]
same = sys.argv[6] == "1"
ids = {}
for b in budgets:
    ratios = []
    for r in range(1, rounds + 1):
        a = json.load(open("%s/%s-%s-%d.json" % (work, la, b, r)))
        c = json.load(open("%s/%s-%s-%d.json" % (work, lb, b, r)))
        for label, d in ((la, a), (lb, c)):
            key = "every run" if same else label
            ids.setdefault(key, d["generated_ids"])
            assert d["generated_ids"] == ids[key], "the ids of %s differ" % key
        med = lambda d: statistics.median(t["seconds"] for t in d["tokens"][1:])
        ratios.append(med(c) / med(a))
    print("budget %s%%: %s / %s s/token = %s (median %.3f)" % (
        b, lb, la, ", ".join("%.3f" % x for x in ratios), statistics.median(ratios)))
print("the same ids in every run" if same else "each pack's ids the same in all its runs")
EOF

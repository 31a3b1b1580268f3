#!/bin/sh
# Lookahead expert reads on and off (issue 16 part 2): tests/bench/bench_budget.sh
# run once per K3_LOOKAHEAD value (VARIANTS, default "0 64": off, and every
# predicted expert read ahead; N: each token's N likeliest), each measuring its own
# bounds (the compute bound from its all-resident run, the I/O bound from the
# disk measured around each of its runs), then one table of all. Not a test:
# run on demand (root, to drop the page cache).
#
#   tests/bench/bench_lookahead.sh PACK [WORKDIR] [THREADS] [N_GENERATED]
#
# Env: BUDGETS (default "all 50 25"; "all" first, it gives the compute bound),
# VARIANTS, ROUNDS (default 1; 2: every variant twice, in turn), and bench_budget.sh's own
# (K3_BIN, K3_BENCH_BIN, PROMPT_FILE, NICE, K3RUN_ARGS).
# Columns: decode s/token (mean of the generated tokens that ran a forward pass,
# median in brackets), hit = expert cache hits / requests while decoding (a read
# ahead that an acquire found is a hit), waiting = the compute thread blocked on
# reads per decoded token, read/token, reads ahead (issued, used, wasted, over the
# whole run, prompt included), bound = max(I/O bound, compute bound) of that
# bench_budget.sh run, ratio = s/token / bound (the aim at 50 %: <= 1.2), others =
# the other processes' share of the CPUs during the run.
set -eu
[ $# -ge 1 ] || { sed -n '2,22p' "$0"; exit 2; }
pack=$1
work=${2:-/tmp/k3bench-lookahead}
threads=${3:-$(nproc)}
ngen=${4:-32}
here=$(cd "$(dirname "$0")" && pwd)
rounds=${ROUNDS:-1}
export BUDGETS="${BUDGETS:-all 50 25}"
mkdir -p "$work"
r=1
list=""
while [ "$r" -le "$rounds" ]; do
    for la in ${VARIANTS:-0 64}; do
        d=$work/r$r-la$la
        K3RUN_ENV="K3_LOOKAHEAD=$la" "$here/bench_budget.sh" "$pack" "$d" "$threads" "$ngen" > "$d.md"
        list="$list $d"
    done
    r=$((r + 1))
done
# shellcheck disable=SC2086
/usr/bin/python3 - "$pack" $list <<'PYEOF'
import json, statistics, sys
pack, dirs = sys.argv[1], sys.argv[2:]
E = sum(x["count"] for x in json.load(open(pack + "/manifest.json"))["expert_layers"])
print("| budget | lookahead | run | decode s/token (median) | first token s | hit (decode) | waiting s/token "
      "| read/token MB | reads ahead: issued / used / wasted | I/O bound s | compute bound s | ratio | others |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
rows, ids = [], set()
for d in dirs:
    la = int(d.rsplit("-la", 1)[1])
    runs = []
    for line in open(d + "/runs.txt"):
        b, bw, rb, bw2, rb2, others = line.split()
        r = json.load(open("%s/run-%s.json" % (d, b)))
        toks = r["tokens"]
        fw = toks[:-1] if r["stop"] == "length" and len(toks) > 1 else toks
        h = sum(t["expert_hits"] for t in fw)
        ms = sum(t["expert_misses"] for t in fw)
        runs.append(dict(b=b, bw=max(map(float, (bw, rb, bw2, rb2))), others=int(others), r=r,
                         s=statistics.mean(t["seconds"] for t in fw), med=statistics.median(t["seconds"] for t in fw),
                         rd=statistics.mean(t["bytes_read"] for t in fw), hit=h / (h + ms) if h + ms else None,
                         wait=statistics.mean(t["io_wait_seconds"] for t in fw)))
        ids.add(tuple(r["generated_ids"]))
    comp = [x["s"] for x in runs if x["b"] == "all"]
    comp = comp[0] if comp else None
    for x in runs:
        r = x["r"]
        io = x["rd"] / (x["bw"] * 1e9)
        bound = max(v for v in (io, comp) if v is not None)
        lab = "all resident" if x["b"] == "all" else "%s %% (%d slots, %.0f %%)" % (
            x["b"], r["expert_slots"], 100.0 * r["expert_slots"] / E) if x["b"].isdigit() else x["b"]
        ahead = "-" if x["b"] == "all" else "%d / %d / %d" % (r.get("prefetch_issued", 0), r.get("prefetch_used", 0),
                                                              r.get("prefetch_wasted", 0))
        rows.append((x["b"] != "all", x["b"], la, d, "| %s | %s | %s | %.3f (%.3f) | %.1f | %s | %.3f | %.0f | %s | %.3f | %s | **%.2f** | %d %% |" % (
            lab, ("-" if x["b"] == "all" else "off" if not la else "all" if la >= 64 else "%d / token" % la), d.rsplit("/", 1)[1], x["s"], x["med"],
            r["load_seconds"] + r["prompt_seconds"], "-" if x["hit"] is None else "%.1f %%" % (100 * x["hit"]),
            x["wait"], x["rd"] / 1e6, ahead, io, "%.3f" % comp if comp else "-", x["s"] / bound, x["others"])))
order = {b: i for i, b in enumerate(["all"] + [x for x in dict.fromkeys(r[1] for r in rows) if x != "all"])}
for row in sorted(rows, key=lambda r: (order[r[1]], r[2], r[3])):
    print(row[4])
print()
print("the same generated ids in every run: %s" % ("yes" if len(ids) == 1 else "NO (a bug)"))
PYEOF

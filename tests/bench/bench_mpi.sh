#!/bin/sh
# k3run across MPI ranks (issue 19) on one machine: s/token and network bytes per token at 1..R
# ranks against the plan's prediction. On one machine the ranks share its cores and memory, so with
# the experts alone across ranks this measures the exchange's overhead; with the trunk split too
# (K3_TRUNK=split) each rank also multiplies only its rows of the trunk. Not a test: run on demand.
#
#   [K3_TRUNK=split] tests/bench/bench_mpi.sh PACK [MAX_RANKS] [N_GENERATED] [BUDGET_PER_RANK]
#
# For R = 1..MAX_RANKS (default 4): mpirun -n R k3run -m PACK, greedy, 1 thread per rank, --json;
# decode s/token = the median after the first token; bytes rank 0 sent and received per decoded
# token (the first token's prompt pass excluded by differencing two runs of N and 2N tokens),
# against k3inspect --plan --ranks R's prediction (K3_TRUNK and K3_SPLIT_MIN reach it as they reach
# k3run): what rank 0 sends is predicted exactly, what it receives for uniform routing; rank 0's
# trunk in memory (the plan's) and its peak RSS. Checks that every R gives the single process's ids.
set -eu
[ $# -ge 1 ] || { sed -n '2,14p' "$0"; exit 2; }
pack=$1
max=${2:-4}
ngen=${3:-16}
budget=${4:-}
bin=${K3_BIN:-$(dirname "$0")/../../build/bin}
PY=/usr/bin/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# sleeping OpenMP threads: up to 4 ranks share the cores, and a rank's spinning threads would take
# the time slices of the ranks it waits for
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_WAIT_POLICY=passive
work=$(mktemp -d /tmp/k3bench-mpi.XXXXXX)
trap 'rm -rf "$work"' EXIT
prompt="In the beginning God created the heaven and the earth. And the earth was without form, and void"
for r in $(seq 1 "$max"); do
    for n in "$ngen" $((2 * ngen)); do
        mpirun -n "$r" "$bin/k3run" -m "$pack" -p "$prompt" -n "$n" -t 1 ${budget:+--budget "$budget"} --json \
            >"$work/r$r-n$n.json" 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
    done
    [ "$r" -gt 1 ] && "$bin/k3inspect" --plan --budget "${budget:-1T}" --ranks "$r" --json "$pack" >"$work/plan$r.json"
done
$PY - "$work" "$max" "$ngen" "$pack" <<'PYEOF'
import json, os, statistics, sys
work, R, n, pack = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cfg = json.load(open(pack + "/manifest.json"))["config"]
t = cfg.get("text_config", cfg)
k = t["num_experts_per_tok"] if "num_experts_per_tok" in t else t["num_experts_per_token"]
E, L = t["num_experts"], t["num_hidden_layers"]
Dl = t.get("routed_expert_hidden_size") or t["hidden_size"]
dense = t.get("first_k_dense_replace", 0)
moe = L - dense
print("trunk: %s" % (os.environ.get("K3_TRUNK") or "rank0"))
print("| ranks | decode s/token | ratio to 1 rank | sent / token (measured) | sent (planned) | received / token (measured) | received (planned, uniform routing) | rank 0 trunk in memory | rank 0 peak RSS |")
print("|---|---|---|---|---|---|---|---|---|")
ids, base = None, None
for r in range(1, R + 1):
    a = json.load(open("%s/r%d-n%d.json" % (work, r, n)))
    b = json.load(open("%s/r%d-n%d.json" % (work, r, 2 * n)))
    ids = ids or b["generated_ids"]
    assert b["generated_ids"] == ids, "%d ranks: other ids" % r
    s = statistics.median(x["seconds"] for x in b["tokens"][1:])
    base = base or s
    dn = len(b["generated_ids"]) - len(a["generated_ids"])
    sent = (b["network_bytes_sent"] - a["network_bytes_sent"]) / dn
    recv = (b["network_bytes_received"] - a["network_bytes_received"]) / dn
    plan = json.load(open("%s/plan%d.json" % (work, r))) if r > 1 else {}
    psent, precv = plan.get("network_sent_bytes_per_token", 0), plan.get("network_received_bytes_per_token", 0)
    print("| %d | %.4f | %.2f | %.1f KB | %.1f KB | %.1f KB | %.1f KB | %.1f MB | %.0f MB |" % (
        r, s, s / base, sent / 1e3, psent / 1e3, recv / 1e3, precv / 1e3, b["trunk_resident_bytes"] / 1e6,
        b["peak_rss_bytes"] / 1e6))
print("\nthe same ids at every rank count; %d MoE layers, k = %d, Dl = %d" % (moe, k, Dl))
PYEOF

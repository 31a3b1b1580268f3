#!/bin/sh
# k3run on a pack at several memory budgets, each beside its I/O bound and its
# compute bound measured in the same run (issue 8). Not a test: run on demand.
#
#   tests/bench/bench_budget.sh PACK [WORKDIR] [THREADS] [N_GENERATED]
#
# Budgets (env BUDGETS, default "all 100 50 25"): "all" = no --budget (every
# expert resident when the machine has the memory: the compute bound), a number
# = that percentage of the pack's bytes, or a size k3run understands (6G).
# For each budget: sync + drop the page cache (needs root; otherwise it warns and
# the numbers are warm), measure the disk with one O_DIRECT pass over an expert
# shard (dd iflag=direct bs=16M), drop again, run k3run greedy on a fixed prompt
# with --stats --json, and take per-token numbers from its "tokens" array.
#
# Limits measured in the same run:
#   disk         dd iflag=direct bs=16M of the largest expert shard (sequential)
#   records      random expert records read with O_DIRECT, 4 in flight (what the
#                cache's misses do: k3run has 4 reader threads); printed beside
#   memory       build/bench/bench_membw THREADS
# Columns: decode s/token = mean wall time of the generated tokens that ran a
# forward pass; first token = load + prompt (what a user waits for, cold);
# read/token = bytes read from disk per decoded token (experts + streamed trunk +
# the embedding row); hit = expert cache hits / requests while decoding;
# I/O bound = read/token / disk bandwidth of that run; compute bound = the
# decode s/token of the "all" run (every weight resident, nothing read);
# ratio = s/token / max(bounds) (the aim is <= 1.3).
#
# Env: K3_BIN (dir of k3run, default build/bin), K3_BENCH_BIN (dir of
# bench_membw, default build/bench), PROMPT_FILE (default: the prompt of
# bench_run.sh), NICE (default 10), K3RUN_ARGS (extra k3run options, e.g.
# "--batch 16"), K3RUN_ENV (extra environment, e.g. "K3_EVICT=layer").
set -eu
[ $# -ge 1 ] || { sed -n '2,31p' "$0"; exit 2; }
pack=$(cd "$1" && pwd)
work=${2:-/tmp/k3bench-budget}
threads=${3:-$(nproc)}
ngen=${4:-32}
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=${K3_BIN:-$here/build/bin}
bbin=${K3_BENCH_BIN:-$here/build/bench}
budgets=${BUDGETS:-all 100 50 25}
nice=${NICE:-10}
PY=/usr/bin/python3
mkdir -p "$work"
[ -e "$pack/manifest.json" ] || { echo "$pack: not a pack (no manifest.json)" >&2; exit 2; }
if [ -n "${PROMPT_FILE:-}" ]; then cp "$PROMPT_FILE" "$work/prompt.txt"; else
    printf '%s' "The quick brown fox jumps over the lazy dog. Once upon a time, there was a little girl who lived in a village near the forest. Whenever she went out, the little girl wore a red riding cloak, so everyone in the village called her Little Red Riding Hood." > "$work/prompt.txt"
fi

drop() {
    sync
    if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches
    else echo "warning: cannot drop the page cache (not root): warm numbers" >&2; fi
}
load1() { cut -d' ' -f1 /proc/loadavg; }
# microseconds some task waited for a CPU (PSI), and the time now in microseconds
psi() { if [ -r /proc/pressure/cpu ]; then sed -n 's/^some .*total=//p' /proc/pressure/cpu; else echo 0; fi; }
now_us() { date +%s%6N; }
packbytes=$(du -sb "$pack" | cut -f1)
shard=$(ls -S "$pack"/experts-layer-*.k3s 2>/dev/null | head -1)
[ -n "$shard" ] || { echo "$pack: no expert shard" >&2; exit 2; }

# disk: one sequential O_DIRECT pass; prints GB/s
disk_bw() {
    drop
    LC_ALL=C dd if="$shard" of=/dev/null bs=16M iflag=direct 2>&1 | tail -1 |
        awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^s,?$/) s = $(i-1); printf "%.3f\n", $1 / s / 1e9 }'
}

# records: 96 random expert records with O_DIRECT, 4 reads in flight; prints GB/s
rec_bw() {
    drop
    $PY - "$pack" <<'PYEOF'
import json, mmap, os, random, sys, threading, time
pk = sys.argv[1]
m = json.load(open(os.path.join(pk, "manifest.json")))
rng = random.Random(1)
recs = []
for x in m["expert_layers"]:
    sh = x["shard"]
    name = m["shards"][sh]["name"] if isinstance(sh, int) else sh
    recs += [(os.path.join(pk, name), x["offset"] + e * x["stride"], x["stride"]) for e in range(x["count"])]
pick = rng.sample(recs, min(96, len(recs)))
fds = {p: os.open(p, os.O_RDONLY | os.O_DIRECT) for p in {r[0] for r in pick}}
def work(part):
    buf = mmap.mmap(-1, max(r[2] for r in pick))
    for p, off, n in part:
        mv = memoryview(buf)[:n]
        os.preadv(fds[p], [mv], off)
        mv.release()
t0 = time.time()
ths = [threading.Thread(target=work, args=(pick[i::4],)) for i in range(4)]
[t.start() for t in ths]
[t.join() for t in ths]
print("%.3f" % (sum(r[2] for r in pick) / (time.time() - t0) / 1e9))
PYEOF
}

mem_bw=$("$bbin/bench_membw" "$threads")
rec0=$(rec_bw)
: > "$work/runs.txt"
for b in $budgets; do
    case $b in
        all) barg="" ;;
        *[!0-9]*) barg="--budget $b" ;;
        *) barg="--budget $((packbytes * b / 100))" ;;
    esac
    bw=$(disk_bw)
    drop
    l0=$(load1); p0=$(psi); t0=$(now_us)
    # shellcheck disable=SC2086
    env ${K3RUN_ENV:-} nice -n "$nice" "$bin/k3run" -m "$pack" -f "$work/prompt.txt" -n "$ngen" -t "$threads" \
        $barg ${K3RUN_ARGS:-} --stats --json > "$work/run-$b.json" 2> "$work/run-$b.err" ||
        { echo "k3run failed at budget $b:" >&2; cat "$work/run-$b.err" >&2; exit 1; }
    p1=$(psi); t1=$(now_us)
    echo "$b $bw $l0 $(load1) $(( (p1 - p0) * 100 / (t1 - t0) ))" >> "$work/runs.txt"
done
rec1=$(rec_bw)

$PY - "$work" "$packbytes" "$mem_bw" "$rec0" "$rec1" "$threads" "$pack" <<'PYEOF'
import json, statistics, sys
work, packbytes, mem_bw, rec0, rec1, threads, pack = sys.argv[1:8]
packbytes, mem_bw, rec0, rec1 = int(packbytes), float(mem_bw), float(rec0), float(rec1)
runs = []
for line in open(work + "/runs.txt"):
    b, bw, l0, l1, psi = line.split()
    r = json.load(open("%s/run-%s.json" % (work, b)))
    if "tokens" not in r:
        sys.exit("k3run --json has no per-token \"tokens\" array: this script needs a k3run with per-token stats")
    toks = r["tokens"]
    # the last generated token runs no forward pass (unless eos stopped earlier, it is sampled only)
    fw = toks[:-1] if r["stop"] == "length" and len(toks) > 1 else toks
    sec = [t["seconds"] for t in fw]
    rd = sum(t["bytes_read"] for t in fw) / len(fw)
    h = sum(t["expert_hits"] for t in fw)
    ms = sum(t["expert_misses"] for t in fw)
    wait = sum(t["io_wait_seconds"] for t in fw) / len(fw)
    runs.append(dict(b=b, bw=float(bw), load=(float(l0), float(l1)), psi=int(psi), r=r, s=statistics.mean(sec),
                     med=statistics.median(sec), rd=rd, hit=(h / (h + ms) if h + ms else None), wait=wait,
                     first=r["load_seconds"] + r["prompt_seconds"]))
res = [x for x in runs if x["b"] == "all"]
compute = res[0]["s"] if res else None
gb = lambda v: v / 1e9
print("| budget | slots (of experts) | trunk streamed | decode s/token (median) | first token s (load + prompt) "
      "| read/token MB | hit (decode) | io wait s/token | disk GB/s | I/O bound s | compute bound s | ratio | peak RSS GB |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
E = sum(x["count"] for x in json.load(open(pack + "/manifest.json"))["expert_layers"])
for x in runs:
    r = x["r"]
    io = x["rd"] / (x["bw"] * 1e9)
    bounds = [v for v in (io, compute) if v is not None]
    lab = "all resident (%.2f GB)" % gb(r["budget_bytes"]) if x["b"] == "all" else \
          "%s %% (%.2f GB)" % (x["b"], gb(r["budget_bytes"])) if x["b"].isdigit() else "%s (%.2f GB)" % (x["b"], gb(r["budget_bytes"]))
    slots = r.get("expert_slots", 0)
    allres = x["b"] == "all" or (slots >= E and not r.get("expert_misses"))
    print("| %s | %s | %s | %.3f (%.3f) | %.1f (%.1f + %.1f) | %.0f | %s | %.3f | %.2f | %.3f | %s | %s | %.2f |" % (
        lab, "all resident" if allres else "%d (%.0f %%)" % (slots, 100.0 * slots / E),
        r.get("trunk_units_streamed", 0), x["s"], x["med"], x["first"], r["load_seconds"], r["prompt_seconds"],
        x["rd"] / 1e6, "-" if x["hit"] is None else "%.1f %%" % (100 * x["hit"]), x["wait"], x["bw"], io,
        "%.3f" % compute if compute else "-",
        "%.2f" % (x["s"] / max(bounds)) if bounds else "-", gb(r["peak_rss_bytes"])))
print()
print("pack %.2f GB, %s threads, %d prompt + %d generated tokens (greedy); memory %.1f GB/s (bench_membw); "
      "random expert records O_DIRECT, 4 in flight: %.2f GB/s before, %.2f GB/s after; "
      "load average (1 min) before/after each run, and %% of its wall time some task waited for a CPU "
      "(PSI; 0 = no contention): %s" % (
          gb(packbytes), threads, runs[0]["r"]["prompt_tokens"], runs[0]["r"]["generated_tokens"], mem_bw, rec0, rec1,
          ", ".join("%s %.1f/%.1f %d %%" % (x["b"], x["load"][0], x["load"][1], x["psi"]) for x in runs)))
PYEOF

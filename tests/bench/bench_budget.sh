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
# the numbers are warm), measure the disk (below), drop again, run k3run greedy
# on a fixed prompt with --stats --json, and take per-token numbers from its
# "tokens" array.
#
# Limits measured in the same run, just before and just after each k3run run:
#   shards       whole expert shards read with dd iflag=direct bs=16M, 4 at once
#                (k3run has 4 reader threads; one stream is printed once, beside)
#   records      384 random expert records read with O_DIRECT, 4 in flight: what
#                the cache's misses do
#   memory       build/bench/bench_membw THREADS (once)
# The I/O bound uses the fastest of the four disk measurements around a run: the
# stricter bound on a disk whose speed moves (this VM's disk is shared).
# Columns: decode s/token = mean wall time of the generated tokens that ran a
# forward pass; first token = load + prompt (what a user waits for, cold);
# read/token = bytes read from disk per decoded token (experts + streamed trunk +
# the embedding row); hit = expert cache hits / requests while decoding;
# I/O bound = read/token / the disk bandwidth around that run; compute bound = the
# decode s/token of the "all" run (every weight resident, nothing read);
# ratio = s/token / max(bounds) (the aim is <= 1.3).
#
# Env: K3_BIN (dir of k3run, default build/bin), K3_BENCH_BIN (dir of
# bench_membw, default build/bench), PROMPT_FILE (default: the prompt of
# bench_run.sh), NICE (default 10), K3RUN_ARGS (extra k3run options, e.g.
# "--batch 128"), K3RUN_ENV (extra environment, e.g. "K3_EVICT=lru").
set -eu
[ $# -ge 1 ] || { sed -n '2,34p' "$0"; exit 2; }
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
# CPU time of the whole machine so far, in clock ticks (user+nice+system+irq+softirq+steal)
busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
now_us() { date +%s%6N; }
packbytes=$(du -sb "$pack" | cut -f1)
ls "$pack"/experts-layer-*.k3s > /dev/null 2>&1 || { echo "$pack: no expert shard" >&2; exit 2; }

# disk: whole expert shards read with dd iflag=direct bs=16M, $1 at once (k3run reads with 4
# threads, so 4 streams is the disk bandwidth k3run can reach; 1 stream is printed beside),
# starting at shard $2 (each run reads other shards); prints GB/s
disk_bw() {
    drop
    n=$1
    set -- $(ls "$pack"/experts-layer-*.k3s | awk -v s="$2" -v n="$n" '{ f[NR - 1] = $0 } END { for (i = 0; i < n; i++) print f[(s + i) % NR] }')
    t0=$(now_us)
    for f in "$@"; do dd if="$f" of=/dev/null bs=16M iflag=direct 2>/dev/null & done
    wait
    t1=$(now_us)
    awk -v b="$(du -cb "$@" | tail -1 | cut -f1)" -v t=$((t1 - t0)) 'BEGIN { printf "%.3f\n", b / t / 1e3 }'
}

# records: $1 random expert records (sample seed $2) read with O_DIRECT, 4 in flight, as the
# cache's misses are read (k3run has 4 reader threads); prints GB/s
rec_bw() {
    drop
    $PY - "$pack" "$1" "$2" <<'PYEOF'
import json, mmap, os, random, sys, threading, time
pk, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
m = json.load(open(os.path.join(pk, "manifest.json")))
recs = []
for x in m["expert_layers"]:
    sh = x["shard"]
    name = m["shards"][sh]["name"] if isinstance(sh, int) else sh
    recs += [(os.path.join(pk, name), x["offset"] + e * x["stride"], x["stride"]) for e in range(x["count"])]
pick = random.Random(seed).sample(recs, min(n, len(recs)))
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
disk1=$(disk_bw 1 0)
i=0
: > "$work/runs.txt"
for b in $budgets; do
    case $b in
        all) barg="" ;;
        *[!0-9]*) barg="--budget $b" ;;
        *) barg="--budget $((packbytes * b / 100))" ;;
    esac
    bw=$(disk_bw 4 $((1 + 4 * i)))
    rb=$(rec_bw 384 $i)
    i=$((i + 1))
    drop
    c0=$(busy); t0=$(now_us)
    # shellcheck disable=SC2086
    env ${K3RUN_ENV:-} /usr/bin/time -f '%U %S' -o "$work/run-$b.time" nice -n "$nice" "$bin/k3run" -m "$pack" \
        -f "$work/prompt.txt" -n "$ngen" -t "$threads" $barg ${K3RUN_ARGS:-} --stats --json \
        > "$work/run-$b.json" 2> "$work/run-$b.err" ||
        { echo "k3run failed at budget $b:" >&2; cat "$work/run-$b.err" >&2; exit 1; }
    c1=$(busy); t1=$(now_us)
    bw2=$(disk_bw 4 $((1 + 4 * i)))
    rb2=$(rec_bw 384 $i)
    i=$((i + 1))
    # the other processes' share of the machine's CPUs during the run, in %
    others=$(awk -v c="$((c1 - c0))" -v hz="$(getconf CLK_TCK)" -v t="$((t1 - t0))" -v n="$(nproc)" \
        '{ printf "%.0f", 100 * (c / hz - $1 - $2) / (t / 1e6 * n) }' "$work/run-$b.time")
    echo "$b $bw $rb $bw2 $rb2 $others" >> "$work/runs.txt"
done

$PY - "$work" "$packbytes" "$mem_bw" "$threads" "$pack" "$disk1" <<'PYEOF'
import json, os, statistics, sys
work, packbytes, mem_bw, threads, pack, disk1 = sys.argv[1:7]
packbytes, mem_bw = int(packbytes), float(mem_bw)
runs = []
for line in open(work + "/runs.txt"):
    b, bw, rb, bw2, rb2, others = line.split()
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
    runs.append(dict(b=b, bw=max(map(float, (bw, rb, bw2, rb2))), bws=tuple(map(float, (bw, rb, bw2, rb2))), others=int(others), r=r, s=statistics.mean(sec),
                     med=statistics.median(sec), rd=rd, hit=(h / (h + ms) if h + ms else None), wait=wait,
                     first=r["load_seconds"] + r["prompt_seconds"]))
res = [x for x in runs if x["b"] == "all"]
compute = res[0]["s"] if res else None
gb = lambda v: v / 1e9
print("| budget | slots (of experts) | trunk streamed | decode s/token (median) | first token s (load + prompt) "
      "| read/token MB | hit (decode) | io wait s/token | disk GB/s before; after (shards / records) | I/O bound s | compute bound s | ratio | peak RSS GB |")
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
    print("| %s | %s | %s | %.3f (%.3f) | %.1f (%.1f + %.1f) | %.0f | %s | %.3f | %.2f / %.2f; %.2f / %.2f | %.3f | %s | %s | %.2f |" % (
        lab, "all resident" if allres else "%d (%.0f %%)" % (slots, 100.0 * slots / E),
        r.get("trunk_units_streamed", 0), x["s"], x["med"], x["first"], r["load_seconds"], r["prompt_seconds"],
        x["rd"] / 1e6, "-" if x["hit"] is None else "%.1f %%" % (100 * x["hit"]), x["wait"], *x["bws"], io,
        "%.3f" % compute if compute else "-",
        "%.2f" % (x["s"] / max(bounds)) if bounds else "-", gb(r["peak_rss_bytes"])))
print()
print("pack %.2f GB, %s threads, %d prompt + %d generated tokens (greedy); memory %.1f GB/s (bench_membw); "
      "disk, one dd stream: %s GB/s; "
      "other processes' share of the %d CPUs during each run (0 %% = the machine was ours): %s" % (
          gb(packbytes), threads, runs[0]["r"]["prompt_tokens"], runs[0]["r"]["generated_tokens"], mem_bw, disk1,
          os.cpu_count(), ", ".join("%s %d %%" % (x["b"], x["others"]) for x in runs)))
print("XXH3-64 checks, as a share of the reader threads' time (read + check, load included; aim < 5 %%): %s" % (
    ", ".join("%s %.1f %% of %.1f s" % (x["b"], 100.0 * x["r"]["hash_seconds"] / x["r"]["read_seconds"],
                                       x["r"]["read_seconds"]) for x in runs if x["r"].get("read_seconds"))))
same = len({tuple(x["r"]["generated_ids"]) for x in runs}) == 1
print("the same generated ids at every budget: %s" % ("yes" if same else "NO (a bug: the budget must not change the text)"))
PYEOF

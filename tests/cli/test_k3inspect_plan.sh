#!/bin/sh
# k3inspect --plan: k3run's memory plan, on the real Kimi K3 config (tests/data).
#  1. usage: --plan needs exactly one of --budget / --preset; the plan options
#     need --plan; bad values exit 2; a missing config exits 3.
#  2. the presets and a range of budgets, as --json: every part of the plan is
#     recomputed here from its definition (resident = buffers + margin +
#     resident trunk + 2 stream buffers of the largest streamed piece and 2 of
#     the largest small part of a unit read in row pieces + expert slots; expert reads under uniform routing; disk bytes = streamed trunk +
#     expert bytes + one embedding row; I/O seconds = bytes / (GB/s x 10^9));
#     resident <= budget; the MLA cache is K3's (24 MLA layers x context x
#     (512 + 64) x 4 bytes); a bigger budget never reads more per token.
#  3. the minimum: accepted at exactly the minimum, refused one byte below with
#     exit 2 and a message naming the minimum in bytes.
#     -b auto (the default): the minimum is batch 1's; the batch is within its cap.
#  4. a sparse full-size K3 pack and the tiny test model's pack (k3_mkpack_sparse,
#     ~20 s): the per-unit trunk bytes and expert geometry are recomputed
#     independently from manifest.json (with the row pieces of units larger
#     than the chunk: docs/PERFORMANCE.md "Row pieces"), and the plan from the
#     pack is identical to the plan from config.json alone.
#     No tolerance is needed: the config path lays tensors out by k3pack's rules
#     (FORMAT.md: tensors 4 KiB-aligned, record parts 64-aligned, records at a
#     4 KiB stride), so any difference is a layout drift between k3pack and the
#     planner, which this test exists to catch.
#  5. the prompt's cost (issue 32) on those packs: every figure of the time-to-first-token table
#     and of a pass of the chosen batch recomputed here from the manifest (the weights a token
#     multiplies), the config (attention's dimensions) and the plan at that row's batch and context
#     (k3inspect --batch B --context C: streamed bytes, expert slots); the run -b auto priced (the
#     prompt, then -n 128 tokens) reads no more at the chosen batch than at -b 1 or -b 64; real K3's
#     1,000-token prompt at 8 GiB reads more than 15 TiB at -b 64 and less than 1.5 TiB at -b auto.
#  6. --parallel S: the sequences' states and batch, the conversations table, the refusal.
# Environment (set by ctest): K3INSPECT K3_MKPACK_SPARSE K3_SRC K3_TEST_DATA K3_TEST_TMP PYTHON
set -u
T="$K3_TEST_TMP/cli_k3inspect_plan"
rm -rf "$T" && mkdir -p "$T" || exit 1
trap 'rm -rf "$T/k3" "$T/tiny"' EXIT                 # the 1.5 TB (apparent) pack goes even on failure
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
cfg="$K3_TEST_DATA/kimi-k3-config.json"

run() { "$K3INSPECT" "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" = "$1" ] || fail "$2: exit $rc, expected $1 (stderr: $(cat "$T/err"))"; }
out_has() { grep -qF -- "$1" "$T/out" || fail "$2: stdout lacks '$1'"; }
err_has() { grep -qF -- "$1" "$T/err" || fail "$2: stderr lacks '$1'"; }

# ------------------------------------------------------------------ 1. usage
run --help
expect_rc 0 "--help"; out_has "--plan" "--help"; out_has "--preset" "--help"; out_has "--budget" "--help"
for args in "--plan $cfg" "--plan --budget 8G --preset laptop $cfg" "--plan --preset desktop $cfg" \
            "--plan --budget 8X $cfg" "--plan --budget 0 $cfg" "--budget 8G $cfg" "--preset laptop $cfg" \
            "--context 100 $cfg" "--plan --preset laptop --summary $cfg" "--plan --preset laptop --context 0 $cfg" \
            "--plan --preset laptop --batch 0 $cfg" "--plan --preset laptop --batch 4097 $cfg" \
            "--plan --preset laptop --batch x $cfg" "--plan --preset laptop --fma-peak 0 $cfg" \
            "--plan --preset laptop --fma-peak -5 $cfg" "--plan --preset laptop --fma-peak nan $cfg" \
            "--plan --preset laptop --fma-peak 1x $cfg" "--fma-peak 100 $cfg" "--plan --preset laptop"; do
    # shellcheck disable=SC2086
    run $args
    expect_rc 2 "k3inspect $args"
    err_has "k3inspect: error:" "k3inspect $args"
done
run --plan --preset laptop "$T/no-such-config.json"
expect_rc 3 "a missing config"
printf '{"text_config": {"hidden_size": 8}}' >"$T/bad.json"
run --plan --preset laptop "$T/bad.json"
expect_rc 1 "an invalid config"

# --------------------------------------------- 2. presets and budgets, checked
: >"$T/list"
for b in laptop workstation server 2G 6G 7G 10G 16G 32G 64G 100G 110G 160G 300G 2T; do
    case $b in [a-z]*) opt=--preset ;; *) opt=--budget ;; esac
    run --plan $opt "$b" --json "$cfg"
    expect_rc 0 "--plan $opt $b"
    cp "$T/out" "$T/plan-$b.json"
    echo "$T/plan-$b.json" >>"$T/list"
done
# a context whose caches would not fit (issue 9, hostile values): refused with the buffers' bytes
run --plan --preset server --context 16777216 "$cfg"
expect_rc 2 "--context 2^24"; err_has "below this model's minimum" "--context 2^24"; err_has "buffers for context 16777216" "--context 2^24"
run --plan --preset server --context 16777217 "$cfg"
expect_rc 2 "--context 2^24 + 1"; err_has "--context must be in 1..16777216" "--context 2^24 + 1"
run --plan --preset workstation --context 8192 --batch 16 --json "$cfg"
expect_rc 0 "--context 8192 --batch 16"
cp "$T/out" "$T/plan-ctx8192.json"
run --plan --preset workstation --batch 16 --json "$cfg"
expect_rc 0 "--batch 16"
cp "$T/out" "$T/plan-b16.json"
run --plan --budget 2T --batch 1 --json "$cfg"
expect_rc 0 "--batch 1"
cp "$T/out" "$T/plan-b1.json"

"$PYTHON" - "$cfg" "$T/list" "$T/plan-b16.json" "$T/plan-ctx8192.json" "$T/plan-b1.json" >"$T/py.out" 2>&1 <<'EOF' || fail "plan checks: $(cat "$T/py.out")"
import json, sys
cfg = json.load(open(sys.argv[1]))["text_config"]
plans = [json.load(open(p.strip())) for p in open(sys.argv[2])]
bad = []
def need(c, msg):
    if not c: bad.append(msg)
n_layers = cfg["num_hidden_layers"]
n_mla = n_layers - len(cfg["linear_attn_config"]["kda_layers"])
mla_row = (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 4
def check(p, name):
    need(p["schema"] == 1 and p["view"] == "plan" and p["geometry_from"] == "config", name + ": header")
    tr, ex = p["trunk"], p["experts"]
    units = tr["unit_bytes"]
    need(len(units) == n_layers + 1 == tr["units"] and sum(units) == tr["bytes"], name + ": units")
    streamed = [n_layers if u == "head" else u for u in tr["streamed"]]
    need(all(isinstance(u, int) and 0 <= u < n_layers for u in tr["streamed"] if u != "head"), name + ": streamed list")
    chunk = tr["chunk_bytes"] or float("inf")
    piece, small = tr["unit_piece_bytes"], tr["unit_small_bytes"]
    split = [u > chunk for u in units]
    need(all(piece[i] == units[i] and small[i] == 0 for i in range(len(units)) if not split[i]), name + ": whole units")
    need(all(0 < piece[i] <= chunk and small[i] < units[i] for i in range(len(units)) if split[i]), name + ": pieces")
    need(len(streamed) == 0 or len(streamed) >= 3 or any(split[u] for u in streamed),
         name + ": %d whole units streamed" % len(streamed))
    need(tr["chunked_units"] == sum(split[u] for u in streamed), name + ": units in pieces")
    need(tr["streamed_bytes"] == sum(units[u] for u in streamed), name + ": streamed bytes")
    need(tr["resident_bytes"] == tr["bytes"] - tr["streamed_bytes"], name + ": resident trunk")
    need(tr["resident_units"] == len(units) - len(streamed), name + ": resident units")
    need(tr["stream_buffer_bytes"] == (2 * (max(piece[u] for u in streamed) + max(small[u] for u in streamed))
                                       if streamed else 0), name + ": stream buffers")
    need(ex["moe_layers"] == n_layers - cfg["first_k_dense_replace"] and ex["top_k"] == cfg["num_experts_per_token"] and
         ex["total"] == ex["moe_layers"] * cfg["num_experts"], name + ": expert counts")
    need(ex["cache_bytes"] == ex["slots"] * ex["slot_bytes"] and ex["slots"] <= ex["total"], name + ": expert cache")
    need(ex["all_resident"] == (ex["slots"] == ex["total"]), name + ": all_resident")
    need(ex["slots"] >= 2 * ex["top_k"], name + ": fewer slots than 2 x top-k")
    need(p["resident_bytes"] == p["buffers_bytes"] + p["margin_bytes"] + tr["resident_bytes"] +
         tr["stream_buffer_bytes"] + ex["cache_bytes"], name + ": resident is not the sum of its parts")
    need(p["resident_bytes"] <= p["budget_bytes"], name + ": resident %d > budget %d" % (p["resident_bytes"], p["budget_bytes"]))
    need(ex["all_resident"] or p["budget_bytes"] - p["resident_bytes"] < ex["slot_bytes"], name + ": a slot left unused")
    need(p["minimum_bytes"] <= p["budget_bytes"], name + ": budget below the minimum accepted")
    # the least memory: stream every unit of at most `cap` bytes (at least 3 of them, or any read in
    # row pieces) through the stream buffers, keep the others; or keep everything; plus 2 x top-k
    # expert slots
    T = sum(units)
    def stream_all_to(cap):
        S = [i for i in range(len(units)) if units[i] <= cap]
        if len(S) < 3 and not any(split[i] for i in S): return T
        return T - sum(units[i] for i in S) + 2 * (max(piece[i] for i in S) + max(small[i] for i in S))
    least = min([T] + [stream_all_to(cap) for cap in set(units)])
    if p["batch_auto"]:     # -b auto: the floor is batch 1's minimum, the batch within its cap
        need(p["minimum_bytes"] == b1["minimum_bytes"], name + ": auto's minimum is not batch 1's")
        need(p["batch_cap"] == min(p["context"], 2048) and 1 <= p["batch"] <= p["batch_cap"], name + ": batch")
    else:
        need(p["minimum_bytes"] == p["buffers_bytes"] - p["verify_bytes"] + p["margin_bytes"] + least +
             min(2 * ex["top_k"], ex["total"]) * ex["slot_bytes"], name + ": minimum %d" % p["minimum_bytes"])
    need(p["mla_cache_bytes"] == n_mla * p["context"] * mla_row, name + ": MLA cache %d" % p["mla_cache_bytes"])
    reads = 0.0 if ex["all_resident"] else ex["moe_layers"] * ex["top_k"] * (1 - ex["slots"] / ex["total"])
    need(abs(ex["reads_per_token"] - reads) < 1e-9 * max(reads, 1), name + ": expert reads")
    need(ex["read_bytes_per_token"] == round(reads * ex["record_bytes"]), name + ": expert bytes")
    need(p["embed_row_bytes"] == cfg["hidden_size"] * 2, name + ": embedding row")
    disk = tr["streamed_bytes"] + ex["read_bytes_per_token"] + p["embed_row_bytes"]
    need(p["disk_bytes_per_token"] == disk, name + ": disk bytes")
    for bw, s in p["io_seconds_per_token_at_gb_per_s"].items():
        need(abs(s - disk / (float(bw) * 1e9)) < 1e-9 * s, name + ": I/O seconds at " + bw)
    need(set(p["io_seconds_per_token_at_gb_per_s"]) == {"2", "7", "14"}, name + ": bandwidths")
b1 = json.load(open(sys.argv[5]))
check(b1, "batch 1")
for p in plans:
    check(p, "budget %d" % p["budget_bytes"])
need(len({p["minimum_bytes"] for p in plans}) == 1, "the minimum depends on the budget")
need(all(p["context"] == 4096 and p["batch_auto"] for p in plans), "defaults are not k3run's (context 4096, batch auto)")
by_budget = sorted(plans, key=lambda p: p["budget_bytes"])
for a, b in zip(by_budget, by_budget[1:]):
    need(b["disk_bytes_per_token"] <= a["disk_bytes_per_token"],
         "%d bytes read per token at a budget of %d, more than %d at %d" %
         (b["disk_bytes_per_token"], b["budget_bytes"], a["disk_bytes_per_token"], a["budget_bytes"]))
need(by_budget[-1]["trunk"]["streamed"] == [] and by_budget[-1]["experts"]["all_resident"] and
     by_budget[-1]["disk_bytes_per_token"] == by_budget[-1]["embed_row_bytes"], "2 TiB: not everything resident")
need(by_budget[0]["trunk"]["streamed"] != [], "2 GiB: nothing streamed")
# issue 16: real K3 at context 4096 in 2 GiB, every unit in row pieces
need(by_budget[0]["budget_bytes"] == 2 << 30 and by_budget[0]["minimum_bytes"] <= 2 << 30 and
     by_budget[0]["trunk"]["chunked_units"] == n_layers + 1, "K3 does not run in 2 GiB")
w, c8 = json.load(open(sys.argv[3])), json.load(open(sys.argv[4]))
check(c8, "context 8192")
need(c8["context"] == 8192 and c8["batch"] == 16 and c8["mla_cache_bytes"] == 2 * w["mla_cache_bytes"], "--context 8192")
need(c8["minimum_bytes"] - w["minimum_bytes"] == c8["buffers_bytes"] - w["buffers_bytes"], "the minimum and the buffers")
if bad:
    print("\n".join(bad)); sys.exit(1)
for p in (plans[0], plans[1], plans[2]):
    print("preset %.0f GiB: resident %d, %d units streamed, %d expert slots, %d bytes per token" %
          (p["budget_bytes"] / 2**30, p["resident_bytes"], len(p["trunk"]["streamed"]), p["experts"]["slots"],
           p["disk_bytes_per_token"]))
EOF
cat "$T/py.out"

run --plan --preset laptop "$cfg"
expect_rc 0 "text report"
res=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["resident_bytes"])' "$T/plan-laptop.json")
for s in "minimum budget" "($res bytes)" "expert cache" "uniform routing" "s/token at 2 GB/s" "s/token at 7 GB/s" \
         "s/token at 14 GB/s" "GB/s = 10^9 bytes/s"; do
    out_has "$s" "text report"
done

# --------------------------------------------------------------- 3. the minimum
min=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["minimum_bytes"])' "$T/plan-laptop.json")
run --plan --budget "$min" --json "$cfg"
expect_rc 0 "--budget minimum ($min)"
"$PYTHON" -c 'import json,sys; p=json.load(open(sys.argv[1])); sys.exit(p["resident_bytes"] > p["budget_bytes"])' "$T/out" ||
    fail "at the minimum, resident exceeds the budget"
run --plan --budget "$((min - 1))" "$cfg"
expect_rc 2 "--budget minimum - 1"
err_has "minimum" "below the minimum"; err_has "$min bytes" "below the minimum"
[ ! -s "$T/out" ] || fail "below the minimum: stdout not empty"
run --plan --budget 1G "$cfg"
expect_rc 2 "--budget 1G"; err_has "$min bytes" "--budget 1G"

# ------------------------------------------------ 4. a pack gives the same plan
# compare_pack NAME PACK CONFIG BUDGET...: the plan from the pack's manifest equals the plan from
# CONFIG at every BUDGET (--budget SIZE, or a preset name), and the pack's trunk units and expert
# geometry, recomputed from manifest.json, are what the plan used.
compare_pack() {
    name=$1 pack=$2 config=$3
    shift 3
    : >"$T/pairs"
    for b in "$@"; do
        case $b in [a-z]*) opt=--preset ;; *) opt=--budget ;; esac
        "$K3INSPECT" --plan $opt "$b" --json "$config" >"$T/cfg-$name-$b.json" || fail "$name: config --plan $opt $b"
        run --plan $opt "$b" --json "$pack"
        expect_rc 0 "$name: pack --plan $opt $b"
        cp "$T/out" "$T/pack-$name-$b.json"
        echo "$b $T/pack-$name-$b.json $T/cfg-$name-$b.json" >>"$T/pairs"
    done
    "$PYTHON" - "$pack/manifest.json" "$T/pairs" "$name" >"$T/py.out" 2>&1 <<'EOF' || fail "$name: pack vs config: $(cat "$T/py.out")"
import json, sys
m = json.load(open(sys.argv[1]))
name = sys.argv[3]
bad = []
def need(c, msg):
    if not c: bad.append(msg)
cfg = m["config"].get("text_config", m["config"])
n_layers = cfg["num_hidden_layers"]
# the trunk units from the manifest: layer i, or the head; the embedding table is in none;
# each tensor takes whole 4 KiB pages in a unit's memory
units = [0] * (n_layers + 1)
for t in m["tensors"]:
    n = t["name"]
    if n == "model.embed_tokens.weight": continue
    units[int(n.split(".")[2]) if n.startswith("model.layers.") else n_layers] += (max(t["size"], 1) + 4095) // 4096 * 4096
# units larger than the chunk are read in row pieces: 2-D matrices of more than one row (not
# kv_b_proj, read per head) of more than a quarter chunk, each in pieces of the most rows within a
# chunk, rounded down to keep pieces 4 KiB-aligned where that leaves one; the rest is the small part
from math import gcd
def pieces_of(chunk):
    piece, small = [0] * (n_layers + 1), [0] * (n_layers + 1)
    for t in m["tensors"]:
        n = t["name"]
        if n == "model.embed_tokens.weight": continue
        u = int(n.split(".")[2]) if n.startswith("model.layers.") else n_layers
        span, sh = (max(t["size"], 1) + 4095) // 4096 * 4096, t["shape"]
        if len(sh) == 2 and sh[0] > 1 and not n.endswith("kv_b_proj.weight") and t["size"] > chunk // 4:
            rb = t["size"] // sh[0]
            r = max(chunk // rb, 1)
            g = 4096 // gcd(rb, 4096)
            if r >= g: r -= r % g
            piece[u] = max(piece[u], (min(r, sh[0]) * rb + 4095) // 4096 * 4096)
        else:
            small[u] += span
    return ([piece[u] if units[u] > chunk else units[u] for u in range(n_layers + 1)],
            [small[u] if units[u] > chunk else 0 for u in range(n_layers + 1)])
xl = m["expert_layers"]
n = 0
for line in open(sys.argv[2]):
    b, pf, cf = line.split()
    p, c = json.load(open(pf)), json.load(open(cf))
    need(p["geometry_from"] == "manifest", b + ": not from the manifest")
    need(p["trunk"]["unit_bytes"] == units, b + ": unit bytes differ from the manifest's")
    chunk = p["trunk"]["chunk_bytes"] or 2**64
    pc, sm = pieces_of(chunk)
    need(p["trunk"]["unit_piece_bytes"] == pc and p["trunk"]["unit_small_bytes"] == sm,
         b + ": pieces or small parts differ from the manifest's")
    splits = sum(u > chunk for u in units)
    ex = p["experts"]
    need(ex["total"] == sum(x["count"] for x in xl) and ex["moe_layers"] == len(xl), b + ": expert count")
    need(ex["record_bytes"] == max(x["record_size"] for x in xl) and ex["slot_bytes"] == max(x["stride"] for x in xl),
         b + ": record geometry")
    need(ex["bytes"] == sum(x["count"] * x["stride"] for x in xl), b + ": expert bytes")
    for k in ("source", "config", "geometry_from"):
        del p[k], c[k]
    need(p == c, b + ": the plan from the pack differs from the plan from config.json")
    n += 1
if bad:
    print("\n".join(bad)); sys.exit(1)
print("%s: %d trunk units (%d larger than the chunk), %d expert layers (record %d bytes, stride %d); plans identical "
      "to config.json's at %d budgets" % (name, len(units), splits, len(xl), max(x["record_size"] for x in xl),
                                          max(x["stride"] for x in xl), n))
EOF
    cat "$T/py.out"
}

# ------------------------------------ 5. the prompt's cost and the first token
# check_prompt NAME PACK OPT VALUE: the time-to-first-token table and the pass of the chosen batch
# of `k3inspect --plan OPT VALUE PACK`, every figure recomputed (header, section 5)
check_prompt() {
    "$PYTHON" - "$K3INSPECT" "$2" "$3" "$4" "$1" >"$T/py.out" 2>&1 <<'EOF' || fail "$1: the prompt's cost: $(cat "$T/py.out")"
import json, math, subprocess, sys
insp, pack, opt, val, name = sys.argv[1:6]
FMA = 333.0
bad = []
def need(c, msg):
    if not c: bad.append(name + ": " + msg)
def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b)) + 1e-9
def near(n, x):             # an integer of bytes and a sum in doubles (rounded, summed in another order)
    return abs(n - x) <= max(2, 1e-12 * x)
def plan(*extra):
    r = subprocess.run([insp, "--plan", opt, val, "--json"] + list(extra) + [pack], capture_output=True)
    if r.returncode: raise SystemExit("k3inspect %s: exit %d: %s" % (extra, r.returncode, r.stderr.decode()))
    return json.loads(r.stdout)
m = json.load(open(pack + "/manifest.json"))
cfg = m["config"].get("text_config", m["config"])
# the weights a token multiplies: every tensor of the trunk's units (not the embedding table; a Q8
# matrix's scales hold none); lm_head is multiplied for one row a pass
W = sum(math.prod(t["shape"]) for t in m["tensors"]
        if t["name"] != "model.embed_tokens.weight" and not t["name"].endswith("_scale"))
V, D, L = cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]
la = cfg.get("linear_attn_config") or {}
n_kda = len(la.get("kda_layers", []))
n_mla = L - n_kda
H, K = la.get("num_heads", 0), la.get("head_dim", 0)
Hm, R, dr = cfg["num_attention_heads"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
k, Ie = cfg.get("num_experts_per_token", 0), cfg.get("moe_intermediate_size", 0)
Dl = cfg.get("routed_expert_hidden_size") or D
L_moe = len(m["expert_layers"])
def cost(p, P):
    """a prompt of P tokens under plan p: passes, expert reads, bytes read, flops"""
    B, ex = p["batch"], p["experts"]
    passes = -(-P // B)
    miss = 0.0 if ex["all_resident"] else 1 - ex["slots"] / ex["total"]
    per = ex["total"] / ex["moe_layers"]
    reads = sum(ex["moe_layers"] * per * (1 - (1 - ex["top_k"] / per) ** min(B, P - i * B)) * miss
                for i in range(passes))
    read = passes * p["trunk"]["streamed_bytes"] + reads * ex["record_bytes"] + P * p["embed_row_bytes"]
    flops = (2 * (W - V * D) * P + 2 * V * D * passes + 2 * L_moe * k * 3 * Ie * Dl * P +
             n_mla * Hm * (4 * R + 2 * dr) * P * (P + 1) / 2 + n_kda * 7 * H * K * K * P)
    return passes, reads, read, flops
top = plan("--fma-peak", str(FMA))
need(top["trunk"]["weights"] == W, "trunk weights %d, the manifest's %d" % (top["trunk"]["weights"], W))
need(top["batch_auto"] and top["batch_cap"] == min(top["context"], 2048) and top["batch_priced_prompt"] ==
     top["context"] and top["batch_priced_generate"] == 128, "the default batch is not auto, for context + 128")
pp = top["prompt_pass"]
_, reads, read, _ = cost(top, top["batch"])
need(pp["tokens"] == top["batch"] and close(pp["expert_reads"], reads) and near(pp["read_bytes"], read) and
     close(pp["read_bytes_per_token"], read / top["batch"], 1e-6), "a pass of the chosen batch")
tt = top["time_to_first_token"]
need(tt["fma_peak_gflops"] == FMA, "--fma-peak")
need([r["tokens"] for r in tt["prompts"]] == [1000, 8000, 32000], "the prompts")
lines = []
for r in tt["prompts"]:
    P = r["tokens"]
    need(r["context"] == max(top["context"], P), "%d: context %d" % (P, r["context"]))
    got, total = {}, {}
    for key in ("batch_64", "chosen"):
        c = r[key]
        if c is None:       # below this plan's minimum at that context
            x = subprocess.run([insp, "--plan", opt, val, "--context", str(r["context"]), "--batch",
                                "64" if key == "batch_64" else "1", pack], capture_output=True)
            need(x.returncode == 2, "%d %s: no plan, but k3inspect accepts it" % (P, key))
            continue
        B = c["batch"]
        if key == "batch_64":
            need(B == 64 and not c["batch_auto"], "%d: -b 64" % P)
        else:
            need(c["batch_auto"] and 1 <= B <= min(P, 2048), "%d: auto batch %d" % (P, B))
            need(-(-P // -(-P // B)) == B, "%d: batch %d, passes not evened out" % (P, B))
        p = plan("--context", str(r["context"]), "--batch", str(B))
        need(p["resident_bytes"] <= p["budget_bytes"], "%d: over the budget" % P)
        need(p["buffers_bytes"] == c["buffers_bytes"] and abs(p["disk_bytes_per_token"] -
             c["disk_bytes_per_decoded_token"]) <= 1, "%d %s: not the plan at batch %d" % (P, key, B))
        passes, reads, read, flops = cost(p, P)
        total[key] = read + 127 * p["disk_bytes_per_token"]      # the prompt, then -n 128 tokens
        if key == "chosen":   # -b auto's choice reads no more than -b 1 or -b 64 would
            p1 = plan("--context", str(r["context"]), "--batch", "1")
            t1 = cost(p1, P)[2] + 127 * p1["disk_bytes_per_token"]
            need(total[key] <= min(t1, total.get("batch_64", t1)) * (1 + 1e-9),
                 "%d: auto's run reads %.6g, -b 1's %.6g, -b 64's %.6g" % (P, total[key], t1, total.get("batch_64", 0)))
        need(c["passes"] == passes, "%d %s: passes %d, expected %d" % (P, key, c["passes"], passes))
        need(close(c["expert_reads"], reads) and near(c["read_bytes"], read) and
             close(c["read_bytes_per_token"], read / P, 1e-6),
             "%d %s: reads %d, expected %.0f" % (P, key, c["read_bytes"], read))
        need(c["trunk_bytes"] == passes * p["trunk"]["streamed_bytes"], "%d %s: trunk bytes" % (P, key))
        need(close(c["flops"], flops), "%d %s: flops %.6g, expected %.6g" % (P, key, c["flops"], flops))
        comp = flops / (FMA * 1e9)
        need(close(c["compute_seconds"], comp), "%d %s: compute seconds" % (P, key))
        for bw in ("2", "7"):
            io = read / (float(bw) * 1e9)
            need(close(c["io_seconds_at_gb_per_s"][bw], io, 1e-6) and
                 close(c["seconds_at_gb_per_s"][bw], max(io, comp), 1e-6), "%d %s: seconds at %s GB/s" % (P, key, bw))
        got[key] = c
    if len(got) == 2:
        lines.append("%d tokens: auto %d in %d passes %.4g GiB, -b 64 %.4g GiB; first token at 7 GB/s %.4g s vs %.4g s" %
                     (P, got["chosen"]["batch"], got["chosen"]["passes"], got["chosen"]["read_bytes"] / 2**30,
                      got["batch_64"]["read_bytes"] / 2**30, got["chosen"]["seconds_at_gb_per_s"]["7"],
                      got["batch_64"]["seconds_at_gb_per_s"]["7"]))
if name == "K3 laptop":     # issue 32's figures
    r = tt["prompts"][0]
    need(r["batch_64"]["read_bytes"] > 15 * 2**40 and r["chosen"]["read_bytes"] < 1.5 * 2**40 and
         r["chosen"]["passes"] == 1, "a 1,000-token prompt: not ~16 TiB at -b 64 and ~1.4 TiB at auto")
if bad:
    print("\n".join(bad)); sys.exit(1)
print(name + ":\n  " + "\n  ".join(lines))
EOF
    cat "$T/py.out"
}

mkdir -p "$T/notok"
if "$K3_MKPACK_SPARSE" -q "$cfg" "$T/notok" "$T/k3"; then
    compare_pack "K3" "$T/k3" "$cfg" laptop workstation server 20G 64G "$min"
    run --plan --preset laptop "$T/k3"
    expect_rc 0 "pack text report"; out_has "geometry from the pack manifest" "pack text report"
    for s in "batch 2048 (-b auto, at most 2048" "per pass of 2048 prompt tokens" "per prompt token" \
             "Time to first token" "1000 auto" "FMA peak of 200 GFLOP/s"; do
        out_has "$s" "pack text report"
    done
    check_prompt "K3 laptop" "$T/k3" --preset laptop
    check_prompt "K3 workstation" "$T/k3" --preset workstation
else
    fail "k3_mkpack_sparse on the K3 config"
fi
rm -rf "$T/k3"
# the tiny test model: records that are not a multiple of 4 KiB, a small head
if "$PYTHON" "$K3_SRC/tests/reference/make_checkpoint.py" --preset tiny --seed 1 --out "$T/ck" -q &&
   "$K3_MKPACK_SPARSE" -q "$T/ck/config.json" "$T/ck" "$T/tiny"; then
    tmin=$("$K3INSPECT" --plan --budget 1G --json "$T/ck/config.json" |
           "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["minimum_bytes"])')
    compare_pack "tiny" "$T/tiny" "$T/ck/config.json" "$tmin" "$((tmin + 100000))" "$((tmin + 3000000))" 1G
    check_prompt "tiny at its minimum + 2 MB" "$T/tiny" --budget "$((tmin + 2000000))"
    check_prompt "tiny at 1G" "$T/tiny" --budget 1G
    export K3_CHUNK=8K                                           # row pieces on the tiny model
    tmin8=$("$K3INSPECT" --plan --budget 1G --json "$T/ck/config.json" |
            "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["minimum_bytes"])')
    compare_pack "tiny-8K" "$T/tiny" "$T/ck/config.json" "$tmin8" "$((tmin8 + 100000))" 1G
    unset K3_CHUNK
    run --plan --budget 1G --json "$T/ck"                        # a checkpoint directory: its config.json
    expect_rc 0 "tiny checkpoint directory"
    "$PYTHON" -c 'import json,sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
del a["source"], b["source"]
sys.exit(a != b)' "$T/out" "$T/cfg-tiny-1G.json" || fail "the checkpoint directory gives another plan than its config.json"
    run --plan --budget "$((tmin - 1))" "$T/tiny"
    expect_rc 2 "tiny pack: minimum - 1"; err_has "$tmin bytes" "tiny pack: minimum - 1"
    # --ranks R (experts across MPI ranks): each rank's share (expert e on rank e % R), no trunk but on
    # rank 0, and the network bytes of model_dist.c's messages, recomputed here from the config
    for R in 2 3; do
        "$K3INSPECT" --plan --budget 1G --ranks $R --trunk rank0 --json "$T/tiny" >"$T/ranks.json" || fail "--ranks $R"
        "$PYTHON" - "$T/ranks.json" "$T/ck/config.json" $R <<'EOF' || fail "--ranks $R: the per-rank plans"
import json, sys
d, c, R = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
t = c.get("text_config", c)
E, k = t["num_experts"], t["num_experts_per_token"]
Dl = t.get("routed_expert_hidden_size") or t["hidden_size"]
L = d["experts"]["moe_layers"]
o = d["other_ranks"]
def need(ok, msg):
    if not ok: sys.exit("check: " + msg)
need(d["ranks"] == R, "ranks")
need(d["experts"]["total"] == L * len(range(0, E, R)) and o["experts"]["total"] == L * len(range(1, E, R)), "shares")
need(d["trunk"]["bytes"] > 0 and o["trunk"]["bytes"] == 0 and o["trunk"]["resident_bytes"] == 0, "trunk on rank 0 only")
need(d["experts"]["all_resident"] and o["experts"]["all_resident"], "1G holds every share")
need(d["network_sent_bytes_per_token"] == L * (12 + 4 * k + 4 * Dl) * (R - 1), "bytes sent")
need(abs(d["network_received_bytes_per_token"] - L * (4 * Dl * k * (R - 1) / R + 260 * (R - 1))) < 1e-6, "bytes received")
need(d["ranks_holding_every_expert"] == 1, "one rank holds all at 1G")
EOF
        # --trunk split: the network bytes recomputed here from the manifest (every 2-D trunk matrix
        # the model multiplies once per pass, of two 32-row blocks or more, but the MoE routers; per
        # exchange 12 + 4 cols to each other rank and 260 back from each, and 4 x the rows of the
        # others' slices)
        "$K3INSPECT" --plan --budget 1G --ranks $R --trunk split --split-min 0 --json "$T/tiny" >"$T/split.json" ||
            fail "--ranks $R --trunk split"
        "$PYTHON" - "$T/split.json" "$T/ranks.json" "$T/tiny/manifest.json" $R <<'EOF' || fail "--ranks $R --trunk split"
import json, sys
d, w, m = (json.load(open(a)) for a in sys.argv[1:4])
R = int(sys.argv[4])
def need(ok, msg):
    if not ok: sys.exit("check: " + msg)
# the products of one input share one exchange: KDA q, k, v; MLA q (or q_a), kv_a, g; the dense
# FFN's gate and up; the MoE's latent down and shared gate and up
names = {t["name"] for t in m["tensors"]}
def group(n):
    if not n.startswith("model.layers."):
        return None
    layer, rest = n[len("model.layers."):].split(".", 1)
    mla = "model.layers.%s.self_attn.kv_a_proj_with_mqa.weight" % layer in names
    attn = ["q_proj", "q_a_proj", "kv_a_proj_with_mqa", "g_proj"] if mla else ["q_proj", "k_proj", "v_proj"]
    for g, members in ((1, ["self_attn.%s.weight" % a for a in attn]), (2, ["mlp.gate_proj.weight", "mlp.up_proj.weight"]),
                       (3, ["block_sparse_moe." + a for a in ("routed_expert_down_proj.weight",
                                                             "shared_experts.gate_proj.weight", "shared_experts.up_proj.weight")])):
        if rest in members:
            return (layer, g)
    return None
sent = recv = 0
seen = set()
for t in m["tensors"]:
    n, s = t["name"], t["shape"]
    if len(s) != 2 or s[0] < 64 or n == "model.embed_tokens.weight" or n.endswith(("kv_b_proj.weight", "_scale",
                                                                                      "block_sparse_moe.gate.weight")):
        continue
    mine = min(((s[0] + 31) // 32 // R) * 32, s[0])            # rank 0's rows: [0, mine)
    g = group(n)
    if g is None or g not in seen:
        seen.add(g)
        sent += (12 + 4 * s[1]) * (R - 1)
        recv += 260 * (R - 1)
    recv += 4 * (s[0] - mine)
need(d["trunk_placement"] == "split" and d["trunk"]["split"], "placement")
need(d["network_sent_bytes_per_token"] == w["network_sent_bytes_per_token"] + sent, "bytes sent, split")
need(abs(d["network_received_bytes_per_token"] - w["network_received_bytes_per_token"] - recv) < 1e-6,
     "bytes received, split")
need(0 < d["other_ranks"]["trunk"]["resident_bytes"] < d["trunk"]["resident_bytes"] < w["trunk"]["resident_bytes"],
     "each rank its slices, rank 0 also the rest")
need(d["network_round_trips_per_token"] > w["network_round_trips_per_token"], "round trips")
EOF
    done
    # the fewest ranks that hold every expert: at that count every share is resident, one fewer not
    b=$((tmin + 2000000))
    n=$("$K3INSPECT" --plan --budget $b --ranks 2 --trunk rank0 --json "$T/tiny" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["ranks_holding_every_expert"])')
    [ "$n" != None ] && [ "$n" -gt 1 ] || fail "--ranks: the fewest ranks at $b: $n"
    for R in "$n" $((n - 1)); do
        [ "$R" -ge 2 ] || continue
        "$K3INSPECT" --plan --budget $b --ranks $R --trunk rank0 --json "$T/tiny" | "$PYTHON" -c '
import json, sys
d = json.load(sys.stdin)
all_in = d["experts"]["all_resident"] and d["other_ranks"]["experts"]["all_resident"]
sys.exit(all_in != (int(sys.argv[1]) == int(sys.argv[2])))' $R "$n" || fail "--ranks $R at $b: every expert resident only from $n ranks"
    done
    run --plan --budget 1G --ranks 0 "$T/tiny"
    expect_rc 2 "--ranks 0"
    run --ranks 2 "$T/tiny"
    expect_rc 2 "--ranks without --plan"
else
    fail "making the tiny pack"
fi
rm -rf "$T/tiny"

# 6. --parallel S (issue 33): the plan holds S sequences' states (each the one-sequence plan's
#    seq_bytes, at least 440 MiB of K3's KDA state), its batch is at least S; the table's reads per
#    pass recomputed here: the streamed trunk once, the experts of S x 16 picks that the cache lacks
#    (uniform routing), S embedding rows; the aggregate grows with S at 8 GiB; a budget that does
#    not hold the S states is refused (exit 2), naming --parallel and the minimum. Snapshots are
#    each conversation's (serve: --snapshots for each slot, default 2, and one for the shared prefix):
#    counted S times.
run --plan --preset laptop --parallel 4 --snapshots 0 --json "$cfg"
expect_rc 0 "--parallel 4 at 8 GiB"
"$PYTHON" -c '
import json, sys
d = json.load(open(sys.argv[1]))
rows = {r["slots"]: r for r in d["conversations"]["rows"]}
assert d["parallel"] == 4 and sorted(rows) == [1, 2, 4, 8, 16, 32], sorted(rows)
E, k, rec, emb = 896.0, 16.0, 17547264.0, 7168 * 2
for S, r in rows.items():
    if not r["fits"]:
        continue
    assert r["states_bytes"] >= S * (440 << 20), (S, r["states_bytes"])
    assert r["batch"] >= S, (S, r["batch"])
    miss = 0.0 if r["experts_all_resident"] else 1 - r["expert_slots"] / (92 * E)
    used = 92 * E * (1 - (1 - k / E) ** S)
    want = r["trunk_streamed_bytes"] + used * miss * rec + S * emb
    assert abs(r["read_bytes_per_pass"] - want) <= 1e-9 * want + 1, (S, r["read_bytes_per_pass"], want)
agg = [rows[S]["tokens_per_second_by_disk_gbs"]["7"] for S in (1, 2, 4, 8)]
assert agg == sorted(agg) and agg[2] > 2 * agg[0], agg
' "$T/out" || fail "--parallel 4 at 8 GiB: the conversations table"
cp "$T/out" "$T/snap0"
run --plan --preset laptop --parallel 2 --json "$cfg"
expect_rc 0 "--parallel 2 at 8 GiB, serve's 2 snapshots each and its prefix"
"$PYTHON" -c '
import json, sys
d0, d2 = (json.load(open(f)) for f in sys.argv[1:3])
r0 = {r["slots"]: r for r in d0["conversations"]["rows"]}
r2 = {r["slots"]: r for r in d2["conversations"]["rows"]}
for S in (1, 2):                                     # the 2 of serve, and one for the shared prefix
    assert r2[S]["fits"] and r2[S]["snapshots"] == 3 * S, (S, r2[S])
    extra = r2[S]["states_bytes"] - r0[S]["states_bytes"]
    assert extra >= 3 * S * (440 << 20), (S, extra)    # each snapshot: at least the 443 MiB KDA state
assert not r2[8]["fits"] and r0[8]["fits"], "8 conversations with 3 snapshots each at 8 GiB"
' "$T/snap0" "$T/out" || fail "--parallel: snapshots counted for each conversation"
run --plan --preset laptop --parallel 2 "$cfg"
grep -q "Conversations sharing each pass" "$T/out" || fail "--parallel: the text table"
run --plan --budget 2G --parallel 4 "$cfg"
expect_rc 2 "--parallel 4 at 2 GiB"
grep -q -- "--parallel 4: .*minimum" "$T/err" || fail "--parallel 4 at 2 GiB: the refusal names the minimum"
run --parallel 4 "$cfg"
expect_rc 2 "--parallel without --plan"

if [ "$fails" -ne 0 ]; then
    echo "$fails check(s) failed" >&2
    exit 1
fi
rm -rf "$T"
echo "PASS"

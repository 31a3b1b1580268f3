#!/bin/sh
# The compute time of one Kimi K3 token on this CPU, measured on real K3 shapes.
#
# The full K3 pack cannot be held here with real (non-zero) weights, and the
# sparse full-size pack (bench_k3_full.sh) has zero weights, which take the
# exact slow paths of the kernels. So this makes the `k3slice` checkpoint
# (tests/reference/make_checkpoint.py): every dimension of the released
# config (hidden 7168, 96 heads, q/kv LoRA 1536/512, KDA 96 x 128, dense FFN
# 33792, experts 3584 -> 3072 MXFP4, 2 shared experts 3072, vocabulary 163840),
# random weights, cut to 4 layers (0: KDA + dense FFN, 1-2: KDA + MoE, 3: MLA
# + MoE) and 16 experts, all of which fire, as 16 of 896 fire in K3. It packs
# it, runs k3run with every weight resident (greedy, a short prompt), takes
# each layer's seconds per generated token from --json (decode_unit_seconds),
# and adds them up the way K3's 93 layers are made:
#     layer 0 + 68 x (KDA + MoE) + 24 x (MLA + MoE) + the head (lm_head).
# Beside each it prints the bytes that layer reads from memory per token and
# the memory bandwidth measured in the same run (bench_membw), so each layer's
# time has its bound. Prints a Markdown table for docs/PERFORMANCE.md. Not a
# test; needs about 11 GB of disk at a time (the checkpoint is deleted once
# packed) and 9 GB of memory.
#
#   tests/bench/bench_k3_compute.sh [WORKDIR] [THREADS] [TOKENS]
set -eu
work=${1:-/tmp/k3slice}
threads=${2:-$(nproc)}
ntok=${3:-8}
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${K3_BUILD:-$here/build}
PY=/usr/bin/python3
mkdir -p "$work"
pk=$work/pack
if [ ! -e "$pk/manifest.json" ]; then
    if [ ! -e "$work/ckpt/config.json" ]; then
        echo "making the k3slice checkpoint (about 11 GB) ..." >&2
        rm -rf "$work/ckpt"
        $PY "$here/tests/reference/make_checkpoint.py" --preset k3slice --seed 1 --out "$work/ckpt" -q
    fi
    echo "packing ..." >&2
    "$build/bin/k3pack" -q "$work/ckpt" -o "$pk"
    rm -rf "$work/ckpt"
fi
mem=$("$build/bench/bench_membw" "$threads")
echo "memory read bandwidth: $mem GB/s ($threads threads)" >&2
"$build/bin/k3run" -m "$pk" -p "The lighthouse keeper climbed the stairs" -n "$ntok" -t "$threads" \
    --json > "$work/run.json"
$PY - "$work/run.json" "$pk/manifest.json" "$mem" "$threads" <<'PYEOF'
import json, re, sys
run, man, mem, threads = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), float(sys.argv[3]), sys.argv[4]
u = run["decode_unit_seconds"]                      # [layers + 1] seconds per generated token
L = len(u) - 1
# bytes each layer reads from memory per token: its trunk tensors, and 16 expert records
trunk = [0] * (L + 1)
for t in man["tensors"]:
    m = re.search(r"\.layers\.(\d+)\.", t["name"])
    if "embed_tokens" in t["name"]:
        continue                                    # one row per token, read from disk
    trunk[int(m.group(1)) if m else L] += t["size"]
rec = {e["layer"]: e["record_size"] * min(16, e["count"]) for e in man["expert_layers"]}
byt = [trunk[i] + rec.get(i, 0) for i in range(L + 1)]
kinds = [("layer 0: KDA + dense FFN", [0], 1), ("KDA + MoE", [1, 2], 68), ("MLA + MoE", [3], 24),
         ("head: final norm + lm_head", [L], 1)]
print("memory read bandwidth %.1f GB/s (bench_membw, %s threads); %d generated tokens, greedy; isa %s" % (
    mem, threads, len(run["tokens"]), run.get("isa", "?")))
print()
print("| part of a K3 token | ms per token (measured) | bytes from memory | at the memory bandwidth | ratio | in K3 | K3 s/token |")
print("|---|---|---|---|---|---|---|")
tot = tot_b = 0.0
for name, layers, n in kinds:
    s = sum(u[i] for i in layers) / len(layers)
    b = sum(byt[i] for i in layers) / len(layers)
    bound = b / (mem * 1e9)
    tot += n * s
    tot_b += n * bound
    print("| %s | %.1f | %.2f GB | %.1f ms | %.2f | x %d | %.2f |" % (name, s * 1e3, b / 1e9, bound * 1e3,
                                                                     s / bound, n, n * s))
print("| **one K3 token (93 layers + head)** | | | %.2f s | **%.2f** | | **%.2f** |" % (tot_b, tot / tot_b, tot))
PYEOF

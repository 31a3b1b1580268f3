#!/bin/sh
# Tokens per second of k3run on a fully resident pack (default: small), prompt
# and generation separately, with the bytes of weights touched per token and
# the ratio to the memory-bandwidth bound measured in the same run
# (bench_membw). Prints a Markdown table for docs/PERFORMANCE.md. Not a test.
#
#   tests/bench/bench_run.sh [small|tiny|medium] [WORKDIR] [THREADS]
set -eu
preset=${1:-small}
work=${2:-/tmp/k3bench}
threads=${3:-$(nproc)}
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=$here/build/bin
PY=/usr/bin/python3
mkdir -p "$work"
ck=$work/ckpt-$preset
pk=$work/pack-$preset
[ -e "$ck/config.json" ] || $PY "$here/tests/reference/make_checkpoint.py" --preset "$preset" --seed 1 --out "$ck" >&2
[ -e "$pk/manifest.json" ] || "$bin/k3pack" -q "$ck" -o "$pk"
bw=$("$here/build/bench/bench_membw" "$threads")
prompt="The quick brown fox jumps over the lazy dog. Once upon a time, there was a little girl who lived in a village near the forest. Whenever she went out, the little girl wore a red riding cloak, so everyone in the village called her Little Red Riding Hood."
out=$work/run.json
"$bin/k3run" -m "$pk" -p "$prompt" -n 32 -t "$threads" --json > "$out"
$PY - "$pk" "$out" "$bw" "$threads" <<'PYEOF'
import json, sys
pk, out, bw, threads = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
m = json.load(open(pk + "/manifest.json"))
r = json.load(open(out))
tc = m["config"].get("text_config", m["config"])
k = tc["num_experts_per_token"]
trunk = sum(t["size"] for t in m["tensors"] if not t["name"].endswith("embed_tokens.weight"))
row = tc["hidden_size"] * 2
experts = sum(k * x["record_size"] for x in m["expert_layers"])
per_tok = trunk + row + experts
# decode: every token touches the trunk (minus the embedding table) and k experts per MoE layer
gen_s = r["generate_seconds"] / max(r["generated_tokens"] - 1, 1) if r["generated_tokens"] > 1 else float("nan")
# the last token is sampled without a forward pass: generate_seconds covers generated_tokens-1 forwards
bound = per_tok / (bw * 1e9)
print("| preset | threads | ISA | prompt tok/s | decode s/token | weights touched/token | bandwidth (same run) | bound s/token | ratio bound/actual |")
print("|---|---|---|---|---|---|---|---|---|")
print("| %s | %s | %s | %.1f (%d tokens) | %.4f | %.1f MB | %.1f GB/s | %.4f | %.2f |" % (
    pk.rsplit("-", 1)[-1], threads, r["isa"], r["prompt_tokens"] / r["prompt_seconds"], r["prompt_tokens"],
    gen_s, per_tok / 1e6, bw, bound, bound / gen_s))
PYEOF

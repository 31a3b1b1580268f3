#!/bin/sh
# What a token costs inside a pass of many (issue 32): one forward pass of T
# tokens (T = 1, 2, 4, 8, 16, 64, 512) on a fully resident pack, in one-token
# decode steps, total and per token; and the prompt's tokens/s against the
# bound of the fp32 FMA peak (bench_kernels --peak before and after the run:
# the higher reading; far apart, the run is flagged as disturbed) and the
# weights' flops per token (2 per weight element a token multiplies: the trunk's
# matrices but the embedding, and k experts per MoE layer; attention, norms and
# activations not counted). Best of 3 runs per row. Prints Markdown for
# docs/PERFORMANCE.md. Not a test.
#
#   tests/bench/bench_pass.sh [small|tiny|medium] [WORKDIR] [THREADS]
set -eu
preset=${1:-small}
work=${2:-/tmp/k3bench}
threads=${3:-$(nproc)}
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=${K3_BIN:-$here/build/bin}          # K3_BIN: another build's binaries (a before/after)
PY=/usr/bin/python3
# OpenMP's wait policy: libgomp's default (threads spin a while between parallel regions), as
# k3run runs for its users, unless OMP_WAIT_POLICY is set (passive: sleeping threads, fairer on a
# shared machine; the tables in docs/PERFORMANCE.md before 2026-12-06 were measured so, and a
# pass of a few tokens, many short regions, cost up to 1.5x as much there)
mkdir -p "$work"
ck=$work/ckpt-$preset
pk=$work/pack-$preset
[ -e "$ck/config.json" ] || $PY "$here/tests/reference/make_checkpoint.py" --preset "$preset" --seed 1 --out "$ck" >&2
[ -e "$pk/manifest.json" ] || "$bin/k3pack" -q "$ck" -o "$pk"
peak=$("$here/build/bench/bench_kernels" --peak)
# ids: 512 in-vocabulary tokens, fixed (the same prompt every run)
ids=$($PY -c "import random; random.seed(7); print(','.join(str(random.randrange(5, 3800)) for _ in range(600)))")
first() { echo "$ids" | cut -d, -f1-"$1"; }
best() {   # best() T: the best of 3 prompt_seconds of one pass of T tokens
    b=
    for _ in 1 2 3; do
        s=$("$bin/k3run" -m "$pk" --prompt-ids "$(first "$1")" -n 1 -b "$1" -c 1024 -t "$threads" --json -q |
            $PY -c "import json,sys; print(json.load(sys.stdin)['prompt_seconds'])")
        b=$($PY -c "print(min(float('$s'), float('${b:-1e30}')))")
    done
    echo "$b"
}
step=
for _ in 1 2 3; do   # one decode step: 64 generated tokens after a 16-token prompt
    s=$("$bin/k3run" -m "$pk" --prompt-ids "$(first 16)" -n 65 -c 1024 -t "$threads" --json -q |
        $PY -c "import json,sys; r=json.load(sys.stdin); print(r['generate_seconds'] / (r['generated_tokens'] - 1))")
    step=$($PY -c "print(min(float('$s'), float('${step:-1e30}')))")
done
rows=
for T in 1 2 4 8 16 64 512; do rows="$rows $T:$(best $T)"; done
peak2=$("$here/build/bench/bench_kernels" --peak)   # again at the end: a busy machine reads low
$PY - "$pk" "$peak $peak2" "$threads" "$step" $rows <<'PYEOF'
import json, sys
pk, peaks, threads, step = sys.argv[1], sys.argv[2].split(), sys.argv[3], float(sys.argv[4])
# the peak: the higher of the two readings (before, after); far apart, the run was disturbed
col = 1 if threads != "1" else 0
before, after = float(peaks[col]), float(peaks[2 + col])
pk_gf = max(before, after)
m = json.load(open(pk + "/manifest.json"))
tc = m["config"].get("text_config", m["config"])
k = tc["num_experts_per_token"]
def elems(shape):
    n = 1
    for d in shape: n *= d
    return n
trunk = sum(elems(t["shape"]) for t in m["tensors"]
            if len(t["shape"]) == 2 and not t["name"].endswith("embed_tokens.weight")
            and t["encoding"] in ("BF16", "F32", "Q8", "MXFP4"))
experts = sum(k * sum(elems(p["shape"]) for p in x["parts"] if p["encoding"] == "MXFP4")
              for x in m["expert_layers"])
flops = 2.0 * (trunk + experts)
print("One pass of T tokens on `%s`, fully resident, %s threads: one decode step = %.2f ms; "
      "weights' flops %.0f MFLOP per token; fp32 FMA peak %.1f GFLOPS (%s threads, the higher of its readings "
      "before and after the run)." % (
          pk.rsplit("-", 1)[-1], threads, step * 1e3, flops / 1e6, pk_gf, threads))
print()
print("| T | pass | in decode steps | per token, in decode steps | tokens/s | of the FMA-peak bound |")
print("|---|---|---|---|---|---|")
for a in sys.argv[5:]:
    T, s = a.split(":")
    T, s = int(T), float(s)
    tps = T / s
    print("| %d | %.1f ms | %.1f | %.2f | %.1f | %.2f |" % (
        T, s * 1e3, s / step, s / step / T, tps, tps * flops / (pk_gf * 1e9)))
if min(before, after) < 0.9 * pk_gf:
    print("\n**Disturbed run:** the FMA peak read %.1f and %.1f GFLOPS before and after; another "
          "process shared the cores, so the passes are suspect too: repeat the run." % (before, after))
    print("bench_pass.sh: the FMA peak read %.1f and %.1f GFLOPS before and after: a disturbed run" % (
        before, after), file=sys.stderr)
PYEOF

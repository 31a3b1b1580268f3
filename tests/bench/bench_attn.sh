#!/bin/sh
# Attention for long prompts (docs/PERFORMANCE.md): bench_attn's table on small's shapes for an
# N-token prompt (the attention alone: before / scalar / avx2, flops, fraction of the peak measured
# in the same run), then k3run on a resident small pack with an N-token synthetic prompt (-c N+8):
# the prompt's seconds end to end. BEFORE=/path/to/an/older/k3run runs that binary too on the same
# prompt and checks that both give the same ids. Not a test.
#
#   tests/bench/bench_attn.sh [N] [WORKDIR] [THREADS]     (BUILD=build dir, default build)
set -eu
N=${1:-4096}
work=${2:-/tmp/k3bench}
threads=${3:-$(nproc)}
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-build}
case $build in /*) ;; *) build=$here/$build ;; esac
PY=/usr/bin/python3
# OpenMP's wait policy: libgomp's default (spinning threads), as k3run runs for its users, unless
# OMP_WAIT_POLICY is set (passive: sleeping threads, fairer on a shared machine; the tables in
# docs/PERFORMANCE.md before 2026-12-06 were measured so)
mkdir -p "$work"
ck=$work/ckpt-small
pk=$work/pack-small
[ -e "$ck/config.json" ] || $PY "$here/tests/reference/make_checkpoint.py" --preset small --seed 1 --out "$ck" >&2
[ -e "$pk/manifest.json" ] || "$build/bin/k3pack" -q "$ck" -o "$pk"
"$build/bench/bench_attn" -n "$N" -t "$threads"
echo
ids=$($PY - "$pk" "$N" <<'PYEOF'
import json, random, sys
m = json.load(open(sys.argv[1] + "/manifest.json"))
vocab = m["config"].get("text_config", m["config"])["vocab_size"]
r = random.Random(1)
print(",".join(str(r.randrange(0, vocab - 256)) for _ in range(int(sys.argv[2]))))   # below the special tokens
PYEOF
)
run() {   # binary, label
    "$1" -m "$pk" --prompt-ids "$ids" -n 4 -c $((N + 8)) -t "$threads" --json > "$work/attn-$2.json"
    $PY - "$work/attn-$2.json" "$2" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
print("| %s | %s | %d | %.1f s | %.1f |" % (sys.argv[2], r["isa"], r["prompt_tokens"], r["prompt_seconds"],
                                          r["prompt_tokens"] / r["prompt_seconds"]))
PYEOF
}
echo "| k3run | ISA | prompt tokens | prompt time | prompt tok/s |"
echo "|---|---|---|---|---|"
[ -n "${BEFORE:-}" ] && run "$BEFORE" before
run "$build/bin/k3run" after
if [ -n "${BEFORE:-}" ]; then
    $PY - "$work/attn-before.json" "$work/attn-after.json" <<'PYEOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
print("\nsame ids before and after: %s" % ("yes" if a["generated_ids"] == b["generated_ids"] else "NO: %s vs %s" % (a["generated_ids"], b["generated_ids"])))
PYEOF
fi

#!/bin/sh
# k3pack --trunk q8, the compact trunk (docs/FORMAT.md 3, version 3), on the demo model k3-kjv:
#  1. the pack: format version 3 with its "trunk" key; check_pack.py (independent) finds every Q8
#     tensor's codes and scales equal to tests/reference/trunk_quant.py's rule on the checkpoint,
#     every other tensor a copy; k3verify accepts it; k3inspect shows it;
#  2. k3run computes exactly the quantized model: its logits (--perplexity --save-logits) equal,
#     bit for bit, those of the BF16 checkpoint that trunk_quant.py writes with the quantized
#     values (they are BF16 numbers), and differ from the exact model's;
#  3. the same bytes for this pack at every budget and thread count: greedy and sampled ids
#     resident, at the minimum budget, and in row pieces (K3_CHUNK=16K: the Q8 matrices are read
#     by rows, their scales whole), 1 and 2 threads;
#     (and the same logits and ids on every kernel path the CPU has: K3_ISA=scalar, avx2, avx512);
#  4. every run says the trunk is inexact (stderr, also with -q; --json "trunk").
# Environment (set by ctest): K3_BIN K3_SRC K3_TEST_TMP
. "$(dirname "$0")/lib.sh"
KJV="$K3_SRC/tests/models/k3-kjv"

"$K3_BIN/k3pack" --trunk q8 "$KJV" -o "$T/q8" 2>"$T/pack.err"
grep -q "INEXACT" "$T/pack.err" || { cat "$T/pack.err" >&2; fail "k3pack does not say the trunk is inexact"; }
$PY -c 'import json,sys; m=json.load(open(sys.argv[1])); assert m["format_version"] == 3 and m["trunk"] == {"encoding": "Q8", "block": 32, "rule": "pow2-rne-127"}, m.get("trunk")' \
    "$T/q8/manifest.json" || fail "manifest: version or trunk key"
$PY "$K3_SRC/tests/pack/check_pack.py" "$T/q8" "$KJV" >/dev/null
"$K3_BIN/k3verify" -q "$T/q8" || fail "k3verify refused the q8 pack"
"$K3_BIN/k3inspect" "$T/q8" >"$T/inspect" || fail "k3inspect"
grep -q "q_proj.weight_scale *F8_E8M0" "$T/inspect" && grep -q "q_proj.weight  *I8 " "$T/inspect" || fail "k3inspect does not show the Q8 tensors and their scales"
expect_exit 2 "$K3_BIN/k3pack" --trunk q4 "$KJV" -o "$T/q4"
"$K3_BIN/k3pack" -q --trunk exact "$KJV" -o "$T/exact"

# 2. the quantized model exactly
$PY "$K3_SRC/tests/reference/trunk_quant.py" --checkpoint "$KJV" --out "$T/deq" --bits 8 >/dev/null
"$K3_BIN/k3pack" -q "$T/deq" -o "$T/deq.pk"
$PY "$K3_SRC/tests/train/kjv_data.py" --out "$T/data" --chats 0 2>/dev/null
for p in q8 deq.pk exact; do
    "$K3_BIN/k3run" -q -m "$T/$p" --perplexity "$T/data/kjv-heldout.txt" --context 128 --chunks 4 \
        --save-logits "$T/$p.logits" >/dev/null 2>"$T/err" || { cat "$T/err" >&2; fail "perplexity of $p"; }
done
cmp "$T/q8.logits" "$T/deq.pk.logits" || fail "the q8 pack's logits differ from the quantized model's"
if cmp -s "$T/q8.logits" "$T/exact.logits"; then fail "the q8 pack's logits equal the exact model's"; fi
# every kernel path this CPU has: the same logits (batches: the matrix-matrix kernels) and ids
# (one token: the matrix-vector ones)
want=$("$K3_BIN/k3run" -m "$T/q8" -p "And God said" -n 24 --print-ids 2>/dev/null)
for isa in scalar avx2 avx512; do
    if ! K3_ISA=$isa "$K3_BIN/k3run" -q -m "$T/q8" -p x -n 1 >/dev/null 2>&1; then
        echo "skip: K3_ISA=$isa (this CPU lacks it)"; continue
    fi
    K3_ISA=$isa "$K3_BIN/k3run" -q -m "$T/q8" --perplexity "$T/data/kjv-heldout.txt" --context 128 --chunks 4 \
        --save-logits "$T/q8-$isa.logits" >/dev/null 2>&1 || fail "perplexity with K3_ISA=$isa"
    cmp -s "$T/q8-$isa.logits" "$T/q8.logits" || fail "K3_ISA=$isa: other logits"
    [ "$(K3_ISA=$isa "$K3_BIN/k3run" -m "$T/q8" -p "And God said" -n 24 --print-ids 2>/dev/null)" = "$want" ] ||
        fail "K3_ISA=$isa: other ids"
done

# 3. the same bytes at every budget, thread count and in row pieces
min=$("$K3_BIN/k3run" -m "$T/q8" -p x --budget 1M 2>&1 | sed -n 's/.*minimum of [0-9.]* GiB (\([0-9]*\) bytes.*/\1/p')
[ -n "$min" ] || fail "no minimum budget"
ids() { "$K3_BIN/k3run" -m "$T/q8" -p "And God said" -n 32 --print-ids "$@" 2>"$T/err" || { cat "$T/err" >&2; fail "k3run $*"; }; }
for s in "" "--temp 0.8 --seed 3"; do
    want=$(ids -t 2 $s)
    for args in "-t 1" "-t 2 --budget $min" "-t 1 --budget $min"; do
        [ "$(ids $args $s)" = "$want" ] || fail "k3run $args $s: other ids"
    done
    got=$(K3_CHUNK=16384 ids -t 2 --budget "$min" $s)
    [ "$got" = "$want" ] || fail "in row pieces ($s): other ids"
done
K3_CHUNK=16384 "$K3_BIN/k3run" -m "$T/q8" -p x -n 1 --budget "$min" --json 2>/dev/null |
    $PY -c 'import json,sys; d=json.load(sys.stdin); assert d["trunk_units_in_pieces"] > 0, d["trunk_units_in_pieces"]' ||
    fail "K3_CHUNK=16K did not put a unit in pieces"

# 4. the notice
"$K3_BIN/k3run" -q -m "$T/q8" -p x -n 1 >/dev/null 2>"$T/err"
grep -q "INEXACT" "$T/err" || fail "k3run -q does not say the trunk is inexact"
"$K3_BIN/k3run" -m "$T/q8" -p x -n 1 --json 2>/dev/null | grep -q '"trunk": "q8 (inexact)"' || fail "--json trunk"
"$K3_BIN/k3run" -m "$T/exact" -p x -n 1 --json 2>/dev/null | grep -q '"trunk": "exact"' || fail "--json trunk exact"
echo "pack_q8: all checks passed"

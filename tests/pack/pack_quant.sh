#!/bin/sh
# BF16 experts: kept bit-exact with --experts bf16 (and by default), quantized
# with --experts mxfp4 to exactly what the NumPy reference quantizer gives
# (tests/reference/mxfp4.py, written independently from docs/FORMAT.md 4).
# The experts are replaced by Gaussian BF16 values first, so every rounding
# case (ties, saturation, tiny blocks) occurs and the reported error is real.
. "$(dirname "$0")/lib.sh"
# The generator's BF16 experts are the dequantized values of the same seed's
# MXFP4 codes, chosen so the OCP rule gives the codes back: quantizing them
# must reproduce the MXFP4 checkpoint's pack shard for shard, byte for byte.
make_ckpt tiny "$T/twin-mx"
make_ckpt tiny "$T/twin-bf" --expert-dtype bf16
"$K3_BIN/k3pack" -q "$T/twin-mx" -o "$T/twin-mx.p"
"$K3_BIN/k3pack" -q "$T/twin-bf" -o "$T/twin-bf.p" --experts mxfp4
for f in "$T/twin-mx.p"/*.k3s; do
    cmp -s "$f" "$T/twin-bf.p/$(basename "$f")" || fail "$(basename "$f"): quantized BF16 twin differs from the MXFP4 pack"
done
make_ckpt tiny "$T/ck" --expert-dtype bf16
$PY - "$T/ck" <<'PYEOF'
import os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.environ["K3_SRC"], "tests", "reference"))
from safetensors_io import ModelDir, write_safetensors, f32_to_bf16
d = sys.argv[1]
ck = ModelDir(d)
rng = np.random.default_rng(5)
for fname, st in ck.files.items():
    out = []
    for n in st.names:
        a = st.get(n)
        if ".experts." in n:
            x = rng.standard_normal(a.shape).astype(np.float32) * 0.02
            x[..., :32] *= 1e-30            # a block far below the others (scale clamps low)
            x[0, 32:64] = 0.0                # an all-zero block
            x[1, 32:40] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0]   # exact ties for scale 1 (amax 7 -> e = 0)
            a = f32_to_bf16(x)
        out.append((n, st.info[n][0], st.info[n][1], np.array(a)))
    write_safetensors(os.path.join(d, fname + ".new"), out, metadata={"format": "pt"})
    os.replace(os.path.join(d, fname + ".new"), os.path.join(d, fname))
PYEOF
"$K3_BIN/k3pack" "$T/ck" -o "$T/q" --experts mxfp4 --json > "$T/q.json"
$PY "$K3_SRC/tests/pack/check_pack.py" "$T/q" "$T/ck"
# the reported error is the real one: Gaussian at 4 bits with a power-of-two scale
$PY - "$T/q.json" <<'PYEOF'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1])][-1]
q = s["quantization"]
assert s["type"] == "summary" and q["rule"] == "ocp-floor-rne-sat", s
assert 0.05 < q["relative_rmse"] < 0.25, q
print("quantization: relative RMS error %.4f over %d weights, %d saturated" % (q["relative_rmse"], q["elements"], q["saturated"]))
PYEOF
"$K3_BIN/k3pack" -q "$T/ck" -o "$T/b" --experts bf16
$PY "$K3_SRC/tests/pack/check_pack.py" "$T/b" "$T/ck"
"$K3_BIN/k3pack" -q "$T/ck" -o "$T/auto"
diff -r "$T/b" "$T/auto" >/dev/null || fail "--experts auto should keep BF16 experts"
grep -q '"source": "quantized"' "$T/q/manifest.json" || fail "manifest does not say the experts were quantized"
# MXFP4 checkpoints are never dequantized
make_ckpt tiny "$T/mx"
expect_exit 2 "$K3_BIN/k3pack" "$T/mx" -o "$T/x" --experts bf16
expect_err "bit-exact"
# quantizing needs rows of whole 32-element blocks: refused by the plan (so also by
# --dry-run), not halfway through writing (the config alone decides, as from an archive)
mkdir "$T/c80"
$PY - "$T/ck/config.json" "$T/c80/config.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
(c.get("text_config") or c)["routed_expert_hidden_size"] = 80
json.dump(c, open(sys.argv[2], "w"), indent=2)
PYEOF
tar -cf "$T/c80.tar" -C "$T/c80" config.json
expect_exit 1 "$K3_BIN/k3pack" -n --experts mxfp4 "$T/c80.tar"
expect_err "not a multiple of 32"
expect_exit 1 "$K3_BIN/k3pack" --experts mxfp4 "$T/c80.tar" -o "$T/c80_out"
expect_err "not a multiple of 32"
[ ! -e "$T/c80_out" ] || fail "output created for a plan that cannot be written"
echo "pack_quant: OK"

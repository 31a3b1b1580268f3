#!/usr/bin/python3
"""A compact trunk, measured before it is built (issue 18, part 2): the NumPy reference of the
block quantization `k3pack --trunk q8` is to use, and what it costs.

    trunk_quant.py --checkpoint DIR --out DIR --bits 8 [--block 32]
        a copy of the checkpoint whose quantizable trunk matrices hold their quantized values
    trunk_quant.py --study DIR
        relative RMS error of those matrices for 8 and 4 bits and blocks of 32, 64, 128 and a row

The rule (symmetric, a power-of-two scale per block of `block` consecutive elements of a row):
    amax = max |x| over the block (x: the BF16 weights as fp32);
    amax = 0: scale code 0, every code 0;
    otherwise e = the smallest integer with amax / 2^e <= qmax (qmax = 127 for 8 bits, 7 for 4),
    scale code = e + 127 (E8M0, clamped to 1..254), q = round-half-even(x / 2^e) clamped to
    [-qmax, qmax] (x / 2^e is exact: a power of two).
The value of a code is q * 2^(code - 127), one fp32 multiply, exact. |q| <= 127 needs 7 bits of
significand, so every such value is exactly a BF16 number: the checkpoint written by --out is the
quantized model exactly, and any engine run on it computes what a q8 kernel in the canonical
order computes from the codes (the independent reference a q8 pack's output is to equal).

Quantized: the 2-D BF16 matrices a token multiplies (attention projections but kv_b_proj, which
the MLA absorbs per head; the dense FFN; shared experts; the latent MoE projections; lm_head),
when cols % block == 0. Exact: the embedding (one row read per token), norms, biases, the router,
the KDA decay and beta gates (f_a, f_b, b_proj: small and sensitive), convolutions, A_log,
dt_bias, the Attention-Residual projections and the routed experts (MXFP4 already).
"""

import argparse
import json
import os
import re
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from safetensors_io import ModelDir, write_safetensors, f32_to_bf16, bf16_to_f32  # noqa: E402

EXACT = re.compile(r"(embed_tokens|norm|gate\.weight$|bias|A_log|conv1d|f_a_proj|f_b_proj|\.b_proj\.|kv_b_proj|"
                   r"_res_proj|\.experts\.)")


def quantizable(name, dtype, shape, block):
    return (dtype == "BF16" and len(shape) == 2 and shape[0] > 1 and shape[1] % block == 0
            and not EXACT.search(name) and not name.startswith(("vision_tower.", "mm_projector.")))


def quantize(x, bits=8, block=32):
    """x: [rows, cols] fp32. Returns (q int8 [rows, cols], scale codes uint8 [rows, cols/block])."""
    qmax = 127 if bits == 8 else 7
    r, c = x.shape
    xb = x.reshape(r, c // block, block).astype(np.float32)
    amax = np.abs(xb).max(axis=2)                                    # [rows, blocks]
    # smallest e with amax / 2^e <= qmax: frexp gives amax/qmax = m * 2^k, m in [0.5, 1)
    m, k = np.frexp(amax.astype(np.float64) / qmax)
    e = np.where(m == 0.5, k - 1, k)                                 # exact powers of two
    code = np.clip(e + 127, 1, 254).astype(np.int64)
    code = np.where(amax == 0, 0, code)
    scale = np.ldexp(np.float32(1), (code - 127).astype(np.int32)).astype(np.float32)
    q = np.rint(xb / scale[:, :, None])                              # rint: half to even
    q = np.clip(q, -qmax, qmax)
    q = np.where(amax[:, :, None] == 0, 0, q)
    return q.reshape(r, c).astype(np.int8), code.astype(np.uint8)


def dequantize(q, code, block=32):
    r, c = q.shape
    scale = np.ldexp(np.float32(1), code.astype(np.int32) - 127).astype(np.float32)
    scale = np.where(code == 0, np.float32(2.0 ** -127), scale).astype(np.float32)
    return (q.reshape(r, c // block, block).astype(np.float32) * scale[:, :, None]).reshape(r, c)


def write_quantized(src, out, bits, block):
    ck = ModelDir(src)
    os.makedirs(out, exist_ok=True)
    n_q = n_bytes = 0
    for fn in sorted(os.listdir(src)):
        p = os.path.join(src, fn)
        if not fn.endswith(".safetensors"):
            if os.path.isfile(p):
                shutil.copy(p, os.path.join(out, fn))
            continue
    for fname in sorted({ck.where[n] for n in ck.names}):
        tensors = []
        for n in sorted(n for n in ck.names if ck.where[n] == fname):
            dt, shape = ck.dtype(n), list(ck.shape(n))
            data = ck.get(n)
            if quantizable(n, dt, shape, block):
                x = bf16_to_f32(data.view(np.uint16)).reshape(shape)
                y = dequantize(*quantize(x, bits, block), block)
                b = f32_to_bf16(y)
                assert np.array_equal(bf16_to_f32(b), y), "%s: a quantized value is not a BF16 number" % n
                data = b.reshape(shape)
                n_q += 1
                n_bytes += x.size
            tensors.append((n, dt, shape, np.ascontiguousarray(data).tobytes()))
        write_safetensors(os.path.join(out, fname), tensors, {"format": "pt"})
    return n_q, n_bytes


def study(src):
    ck = ModelDir(src)
    rows = []
    for bits in (8, 4):
        for block in (32, 64, 128, 0):
            err2 = ref2 = 0.0
            n = 0
            for name in ck.names:
                dt, shape = ck.dtype(name), list(ck.shape(name))
                b = block or shape[-1] if len(shape) == 2 else 32
                if not quantizable(name, dt, shape, 32) or shape[1] % b:
                    continue
                x = bf16_to_f32(ck.get(name).view(np.uint16)).reshape(shape)
                y = dequantize(*quantize(x, bits, b), b)
                err2 += float(((y - x).astype(np.float64) ** 2).sum())
                ref2 += float((x.astype(np.float64) ** 2).sum())
                n += x.size
            bpw = bits + 8.0 / (block or 1e9)
            rows.append({"bits": bits, "block": block or "row", "bits_per_weight": round(bpw, 3),
                         "relative_rmse": (err2 / ref2) ** 0.5, "weights": n})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint")
    ap.add_argument("--out")
    ap.add_argument("--bits", type=int, choices=(8, 4), default=8)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--study")
    a = ap.parse_args()
    if a.study:
        for r in study(a.study):
            print(json.dumps(r))
        return 0
    if not (a.checkpoint and a.out):
        ap.error("--checkpoint and --out, or --study")
    n_q, n_w = write_quantized(a.checkpoint, a.out, a.bits, a.block)
    print(json.dumps({"quantized_tensors": n_q, "quantized_weights": n_w, "bits": a.bits, "block": a.block}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

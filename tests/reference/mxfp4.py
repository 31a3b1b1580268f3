"""MXFP4 (OCP Microscaling, compressed-tensors `mxfp4-pack-quantized`) for the k3 reference.

Layout (FORMATS.md §2, K3 spec §3): a weight W [out, in] (in % 32 == 0) is stored as
  weight_packed U8 [out, in/2]: byte j of row r = element 2j (LOW nibble) | element 2j+1 << 4
  weight_scale  U8 [out, in/32]: E8M0 exponent of block c/32, value 2^(code-127); 255 = NaN
A nibble is sign bit 3 + magnitude index 0..7 into E2M1 {0, .5, 1, 1.5, 2, 3, 4, 6}.
w[r, c] = E2M1[nibble] * 2^(scale[r, c//32] - 127)  (exact in fp32 and bf16: scale codes 0 and 1
give float32 denormals, still exact; codes 253/254 with |value| >= 4 / >= 2 overflow float32 and
are rejected with ValueError: a checkpoint an fp32 engine cannot represent).

The quantizer `quantize` is THE rule k3pack's C quantizer must reproduce bit for bit:
  per block of 32 consecutive elements of a row (x = float32 values, finite):
    amax = max |x|
    amax == 0         -> scale code 0, every element code = sign bit only (+0 -> 0, -0.0 -> 8)
    else e = floor(log2(amax)) - 2        (exact: from the float exponent, never from log2())
         code_s = clamp(e + 127, 0, 254)   (the upper clamp cannot trigger for float32 input)
         y = |x| / 2^(code_s - 127)        (exact in float64)
         magnitude index = nearest E2M1 magnitude to y; a tie (y exactly halfway:
           0.25 0.75 1.25 1.75 2.5 3.5 5) goes to the EVEN index; y > 6 saturates to 7 (=6.0)
         nibble = index | (signbit(x) << 3)   (signbit: -0.0 and negative zero-rounded values keep 8)
  non-finite input -> ValueError.
"""

import numpy as np

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)          # [8]
E2M1_SIGNED = np.concatenate([E2M1, -E2M1]).astype(np.float32)                       # [16], code 8 = -0.0
E2M1_SIGNED[8] = -0.0
MIDPOINTS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float64)       # [7]

# byte -> (value of low nibble, value of high nibble): [256, 2] float32
_BYTE_PAIR = np.stack([E2M1_SIGNED[np.arange(256) & 15], E2M1_SIGNED[np.arange(256) >> 4]], axis=1)
_BYTE_PAIR_U64 = np.ascontiguousarray(_BYTE_PAIR).view(np.uint64).reshape(256)   # both floats in one word


def scale_values(scales, dtype=np.float32):
    """E8M0 codes [...] uint8 -> 2^(code-127) [...] (float32 default). 255 -> ValueError."""
    s = np.asarray(scales, dtype=np.uint8)
    if np.any(s == 255):
        raise ValueError("MXFP4 scale code 255 (NaN) in weight_scale")
    return np.ldexp(np.ones(s.shape, dtype=np.float64), s.astype(np.int32) - 127).astype(dtype)


def unpack_codes(packed):
    """packed [out, in/2] uint8 -> nibble codes [out, in] uint8 (low nibble = even column)."""
    p = np.asarray(packed, dtype=np.uint8)
    out = np.empty(p.shape[:-1] + (p.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = p & 15
    out[..., 1::2] = p >> 4
    return out


def pack_codes(codes):
    """nibble codes [out, in] uint8 (0..15) -> packed [out, in/2] uint8."""
    c = np.asarray(codes, dtype=np.uint8)
    if c.shape[-1] % 2 or np.any(c > 15):
        raise ValueError("codes must be 0..15 with an even last dimension")
    return (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)


def dequantize(packed, scales, dtype=np.float32):
    """packed [out, in/2] u8, scales [out, in/32] u8 -> W [out, in] (float32 by default).

    Vectorised: one table lookup per byte (two values), one multiply per element."""
    p = np.asarray(packed, dtype=np.uint8)
    s = np.asarray(scales, dtype=np.uint8)
    out_dim, half = p.shape
    n_in = 2 * half
    if n_in % 32 or s.shape != (out_dim, n_in // 32):
        raise ValueError("MXFP4 shapes do not match: packed %s scales %s" % (p.shape, s.shape))
    sv = scale_values(s, np.float32)                                 # [out, in/32]
    w = np.take(_BYTE_PAIR_U64, p).view(np.float32)                  # [out, in]: one 8-byte gather per byte
    w = w.reshape(out_dim, n_in // 32, 32)                           # [out, in/32, 32]
    if s.size and int(s.max()) >= 253:               # 4 * 2^126 and up overflow float32
        with np.errstate(over="ignore"):
            w *= sv[:, :, None]
        if not np.all(np.isfinite(w)):
            raise ValueError("MXFP4 value overflows float32 (scale code %d)" % int(s.max()))
    else:
        w *= sv[:, :, None]
    return w.reshape(out_dim, n_in).astype(dtype, copy=False)


def quantize(w):
    """OCP MXFP4 quantizer (rule in the module docstring).

    w: [out, in] float array (float32 or values exactly representable in it), in % 32 == 0.
    Returns (packed [out, in/2] uint8, scales [out, in/32] uint8)."""
    x = np.asarray(w, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % 32:
        raise ValueError("quantize wants [out, in] with in %% 32 == 0, got %s" % (x.shape,))
    if not np.all(np.isfinite(x)):
        raise ValueError("quantize: non-finite input")
    out_dim, n_in = x.shape
    xb = x.reshape(out_dim, n_in // 32, 32).astype(np.float64)       # [out, nb, 32]
    amax = np.abs(xb).max(axis=2)                                    # [out, nb]
    # floor(log2(amax)) exactly: frexp gives amax = m * 2^ex with m in [0.5, 1).
    _, ex = np.frexp(amax)
    e = ex.astype(np.int64) - 1 - 2
    code_s = np.clip(e + 127, 0, 254)
    code_s = np.where(amax == 0, 0, code_s).astype(np.uint8)         # [out, nb]
    y = np.abs(xb) * np.ldexp(1.0, 127 - code_s.astype(np.int64))[:, :, None]   # exact
    idx = np.searchsorted(MIDPOINTS, y, side="left")                 # number of midpoints < y
    tie = (idx < 7) & (MIDPOINTS[np.minimum(idx, 6)] == y)
    idx = np.where(tie & (idx % 2 == 1), idx + 1, idx)               # ties -> even index
    sign = np.signbit(xb).astype(np.uint8) << 3
    codes = (idx.astype(np.uint8) | sign).reshape(out_dim, n_in)
    return pack_codes(codes), code_s


def byte_lut_for_distribution(p_mag, u_bits=16):
    """Inverse-CDF table for sampling packed bytes directly (used by make_checkpoint).

    p_mag: [8] probabilities of magnitude indices 0..7 (signs are uniform).
    Returns lut [2**u_bits] uint8 such that lut[u] for u uniform on 0..2**u_bits-1 is a
    byte whose two nibbles are independent draws from the signed distribution."""
    p_mag = np.asarray(p_mag, dtype=np.float64)
    p_mag = p_mag / p_mag.sum()
    p_nib = np.concatenate([p_mag, p_mag]) / 2.0                     # [16]
    p_byte = (p_nib[None, :] * p_nib[:, None]).reshape(256)          # [hi, lo] -> byte = hi<<4|lo
    cdf = np.cumsum(p_byte)
    cdf[-1] = 1.0
    n = 1 << u_bits
    u = (np.arange(n, dtype=np.float64) + 0.5) / n
    return np.searchsorted(cdf, u, side="right").astype(np.uint8)

"""Self-checks of the k3 NumPy reference (run from anywhere):

  /usr/bin/python3 -m unittest discover -s tests/reference -p 'test_*.py'

Generates the tiny preset into a temp dir (well under a second) and checks: KDA recurrence vs
chunked WY form, MLA absorbed vs expanded, MXFP4 pack/unpack/quantize (hand cases + a
brute-force second formulation), prefill vs token-by-token, determinism, checkpoint layout
vs config and vs hand-written K3 shapes, routing health and margins, the dump file, the
safetensors reader's validation, and the bf16-expert variant.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import make_checkpoint as mc                                             # noqa: E402
import mxfp4                                                              # noqa: E402
from k3model import (Model, generate, kda_chunked, kda_recurrent,        # noqa: E402
                     mla_absorbed, mla_expanded, Config)
from k3ref import rel_err                                                 # noqa: E402
from safetensors_io import (ModelDir, SafetensorsError, SafetensorsFile,  # noqa: E402
                            write_safetensors, bf16_to_f32, f32_to_bf16, DTYPES)

# The canonical parity fixture: seed 29, this prompt, 32 generated tokens (README "Routing
# margins": its smallest top-k margin is ~58x the fp32-vs-f64 router-score error).
TINY_SEED = 29
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time, there was a little"
FIXTURE_CANDIDATES = [os.path.join(HERE, "..", "..", "..", "shared", "fixtures", "kimi-k3-config.json"),
                      "/work/shared/fixtures/kimi-k3-config.json"]
_TMP = None


def setUpModule():
    global _TMP
    _TMP = tempfile.mkdtemp(prefix="k3ref-test-")
    mc.make_checkpoint("tiny", TINY_SEED, os.path.join(_TMP, "tiny"))


def tearDownModule():
    shutil.rmtree(_TMP, ignore_errors=True)


def tiny_dir():
    return os.path.join(_TMP, "tiny")


def prompt_ids(n=32):
    from kimi_tokenizer import Tokenizer
    ids = Tokenizer.from_dir(tiny_dir()).encode(PROMPT * 3)
    return ids[:n]


# ---------------------------------------------------------------------------
class TestKDA(unittest.TestCase):
    def inputs(self, dt, T=150, H=3, K=16, seed=0):
        r = np.random.default_rng(seed)
        q = r.standard_normal((T, H, K))
        k = r.standard_normal((T, H, K))
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) * K ** -0.5
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
        v = r.standard_normal((T, H, K))
        g = -5.0 / (1 + np.exp(-r.standard_normal((T, H, K)) * 2 + 2))     # (-5, 0), mostly near 0
        beta = 1 / (1 + np.exp(-r.standard_normal((T, H))))
        S0 = r.standard_normal((H, K, K)) * 0.3
        return [a.astype(dt) for a in (q, k, v, g, beta, S0)]

    def check(self, dt, tol):
        q, k, v, g, beta, S0 = self.inputs(dt)
        S1, S2 = S0.copy(), S0.copy()
        o1 = kda_recurrent(q, k, v, g, beta, S1)
        o2 = kda_chunked(q, k, v, g, beta, S2, chunk=64)                   # 3 chunks, last partial
        self.assertEqual(o1.dtype, dt)
        self.assertLess(rel_err(o2, o1), tol)
        self.assertLess(rel_err(S2, S1), tol)
        # state carried across calls == one call
        S3 = S0.copy()
        o3 = np.concatenate([kda_recurrent(q[:70], k[:70], v[:70], g[:70], beta[:70], S3),
                             kda_recurrent(q[70:], k[70:], v[70:], g[70:], beta[70:], S3)])
        self.assertLess(rel_err(o3, o1), tol)

    def test_chunk_equals_recurrent_fp32(self):
        self.check(np.float32, 1e-5)

    def test_chunk_equals_recurrent_f64(self):
        self.check(np.float64, 1e-12)

    def test_order_decay_then_update(self):
        # one step from S=0: S = k u^T with u = beta v; o = (k.q) beta v (reads the UPDATED state)
        q, k, v, g, beta, S0 = self.inputs(np.float64, T=1)
        S = np.zeros_like(S0)
        o = kda_recurrent(q, k, v, g, beta, S)
        want = (k[0] * q[0]).sum(-1)[:, None] * beta[0][:, None] * v[0]
        self.assertLess(rel_err(o[0], want), 1e-12)

    def test_model_chunked_equals_recurrent(self):
        ids = prompt_ids(40)
        a, b = Model(tiny_dir()), Model(tiny_dir(), kda_chunk=16)
        ra, rb = a.forward(ids, a.new_state()), b.forward(ids, b.new_state())
        self.assertLess(rel_err(rb["logits"], ra["logits"]), 1e-4)


class TestMLA(unittest.TestCase):
    def check(self, dt, tol):
        r = np.random.default_rng(1)
        T, Tc, H, dn, dr, dv, R = 3, 9, 4, 8, 4, 6, 10
        q_nope = r.standard_normal((T, H, dn)).astype(dt)
        q_rope = r.standard_normal((T, H, dr)).astype(dt)
        c = r.standard_normal((Tc, R)).astype(dt)
        kr = r.standard_normal((Tc, dr)).astype(dt)
        kv_b = (r.standard_normal((H * (dn + dv), R)) / np.sqrt(R)).astype(dt)
        kv = (c @ kv_b.T).reshape(Tc, H, dn + dv)
        scale = dt((dn + dr) ** -0.5)
        pos0 = Tc - T                                           # the last T cache entries are the queries
        o1 = mla_expanded(q_nope, q_rope, kv[:, :, :dn], kv[:, :, dn:], kr, pos0, scale)
        o2 = mla_absorbed(q_nope, q_rope, c, kr, kv_b, pos0, scale, dn, dv)
        self.assertEqual(o1.shape, (T, H, dv))
        self.assertLess(rel_err(o2, o1), tol)
        # causality: changing a future cache entry leaves query 0 alone
        c2 = c.copy()
        c2[pos0 + 1] += 1
        o3 = mla_absorbed(q_nope, q_rope, c2, kr, kv_b, pos0, scale, dn, dv)
        self.assertLess(rel_err(o3[0], o2[0]), tol)
        self.assertGreater(rel_err(o3[1], o2[1]), 1e-3)

    def test_absorbed_equals_expanded_fp32(self):
        self.check(np.float32, 1e-5)

    def test_absorbed_equals_expanded_f64(self):
        self.check(np.float64, 1e-12)

    def test_model_absorbed_decode(self):
        ids = prompt_ids(20)
        a, b = Model(tiny_dir()), Model(tiny_dir(), mla_absorb=True)
        ga, ra = generate(a, ids, 6)
        gb, rb = generate(b, ids, 6)
        self.assertEqual(ga, gb)
        self.assertLess(rel_err(rb["logits"], ra["logits"]), 1e-4)


# ---------------------------------------------------------------------------
def brute_quantize_block(x):
    """Second formulation of the OCP rule, element by element, for cross-checking."""
    x = np.asarray(x, dtype=np.float32)
    amax = float(np.max(np.abs(x)))
    if amax == 0:
        return 0, [8 if np.signbit(v) else 0 for v in x]
    e = int(np.floor(np.log2(np.float64(amax))))
    while 2.0 ** e > amax:                  # guard log2 rounding
        e -= 1
    while 2.0 ** (e + 1) <= amax:
        e += 1
    code_s = min(max(e - 2 + 127, 0), 254)
    codes = []
    for v in x:
        y = abs(float(v)) / 2.0 ** (code_s - 127)
        d = [abs(y - float(m)) for m in mxfp4.E2M1]
        best = min(range(8), key=lambda j: (d[j], j % 2, j))        # nearest, ties -> even index
        codes.append(best | (8 if np.signbit(v) else 0))
    return code_s, codes


class TestMXFP4(unittest.TestCase):
    def test_all_byte_pairs_and_roundtrip(self):
        packed = np.arange(256, dtype=np.uint8).reshape(8, 32)          # rows of 64 elements
        codes = mxfp4.unpack_codes(packed)
        self.assertTrue(np.array_equal(codes[:, 0::2], packed & 15))    # low nibble = even column
        self.assertTrue(np.array_equal(mxfp4.pack_codes(codes), packed))
        scales = np.full((8, 2), 127, np.uint8)
        w = mxfp4.dequantize(packed, scales)
        for b in range(256):
            r, j = divmod(b, 32)
            self.assertEqual(w[r, 2 * j], mxfp4.E2M1_SIGNED[b & 15])
            self.assertEqual(w[r, 2 * j + 1], mxfp4.E2M1_SIGNED[b >> 4])
        self.assertTrue(np.signbit(w[0, 16]))                           # byte 8 low nibble = -0.0

    def test_e8m0_edges(self):
        sv = mxfp4.scale_values(np.array([0, 1, 126, 127, 128, 254], np.uint8))
        self.assertEqual(list(sv), [2.0 ** -127, 2.0 ** -126, 0.5, 1.0, 2.0, 2.0 ** 127])
        packed = np.full((1, 16), 0x77, np.uint8)                       # all +6
        for s, want in ((0, 6 * 2.0 ** -127), (1, 6 * 2.0 ** -126), (252, 6 * 2.0 ** 125)):
            w = mxfp4.dequantize(packed, np.array([[s]], np.uint8))
            self.assertEqual(float(w[0, 0]), want)
        ones = np.full((1, 16), 0x22, np.uint8)                         # all +1.0
        self.assertEqual(float(mxfp4.dequantize(ones, np.array([[254]], np.uint8))[0, 0]), 2.0 ** 127)
        for s in (255, 254):                                             # NaN code; 6 * 2^127 > FLT_MAX
            with self.assertRaises(ValueError):
                mxfp4.dequantize(packed, np.array([[s]], np.uint8))

    def test_quantize_hand_cases(self):
        blk = np.zeros(32, np.float32)
        blk[0] = 4.0                                                     # amax 4 -> e = 0, scale 127
        ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
        blk[1:8] = ties
        blk[8:15] = [-t for t in ties]
        blk[15] = -0.0
        blk[16:20] = [0.3, 0.7, 5.5, 2.4]
        pk, sc = mxfp4.quantize(blk[None])
        codes = mxfp4.unpack_codes(pk)[0]
        self.assertEqual(int(sc[0, 0]), 127)
        self.assertEqual(list(codes[1:8]), [0, 2, 2, 4, 4, 6, 6])
        self.assertEqual(list(codes[8:15]), [8, 10, 10, 12, 12, 14, 14])
        self.assertEqual(int(codes[15]), 8)                              # -0.0 keeps its sign
        self.assertEqual(int(codes[20]), 0)                              # +0.0
        self.assertEqual(list(codes[16:20]), [1, 1, 7, 4])
        blk = np.zeros(32, np.float32)
        blk[0], blk[1] = 7.0, -7.0                                       # amax 7 -> e = 0; 7 saturates
        pk, sc = mxfp4.quantize(blk[None])
        self.assertEqual(int(sc[0, 0]), 127)
        self.assertEqual(list(mxfp4.unpack_codes(pk)[0, :2]), [7, 15])
        blk = np.zeros(32, np.float32)
        blk[0], blk[1] = 8.0, 1.0                                        # amax 8 -> e = 1: 8/2=4, 1/2=.5
        pk, sc = mxfp4.quantize(blk[None])
        self.assertEqual(int(sc[0, 0]), 128)
        self.assertEqual(list(mxfp4.unpack_codes(pk)[0, :2]), [6, 1])
        z = np.zeros((1, 32), np.float32)
        z[0, 3] = -0.0
        pk, sc = mxfp4.quantize(z)                                       # all-zero block
        self.assertEqual(int(sc[0, 0]), 0)
        self.assertEqual(list(mxfp4.unpack_codes(pk)[0, :4]), [0, 0, 0, 8])
        tiny = np.full((1, 32), 2.0 ** -140, np.float32)                 # e+127 < 0 -> clamp to 0
        pk, sc = mxfp4.quantize(tiny)
        self.assertEqual(int(sc[0, 0]), 0)
        self.assertEqual(int(mxfp4.unpack_codes(pk)[0, 0]), 0)           # 2^-140 / 2^-127 -> 0
        with self.assertRaises(ValueError):
            mxfp4.quantize(np.full((1, 32), np.nan, np.float32))

    def test_quantize_matches_brute_force(self):
        r = np.random.default_rng(5)
        rows = []
        for _ in range(40):
            e = r.integers(-20, 20)
            x = (r.standard_normal(32) * 2.0 ** e).astype(np.float32)
            rows.append(x)
        x = np.zeros(32, np.float32)
        x[:8] = np.array([4, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]) * 2.0 ** -3   # ties at another scale
        rows.append(x)
        rows.append(-x)
        w = np.stack(rows)
        pk, sc = mxfp4.quantize(w.reshape(21, 64))                          # two blocks per row
        codes = mxfp4.unpack_codes(pk).reshape(-1, 32)
        for b, blk in enumerate(w):
            s, c = brute_quantize_block(blk)
            self.assertEqual(int(sc.reshape(-1)[b]), s, "block %d" % b)
            self.assertEqual(list(codes[b]), c, "block %d" % b)

    def test_requantize_generated_codes_is_identity(self):
        pk, sc = mc.expert_codes(3, "x", 64, 96)
        w = mxfp4.dequantize(pk, sc)
        pk2, sc2 = mxfp4.quantize(w)
        self.assertTrue(np.array_equal(pk, pk2) and np.array_equal(sc, sc2))


# ---------------------------------------------------------------------------
class TestForward(unittest.TestCase):
    def test_prefill_equals_token_by_token(self):
        ids = prompt_ids(32)
        m = Model(tiny_dir())
        ra = m.forward(ids, m.new_state())
        st = m.new_state()
        from k3model import concat_records
        rb = concat_records([m.forward([t], st) for t in ids])
        for i, (a, b) in enumerate(zip(ra["layers"], rb["layers"])):
            self.assertLess(rel_err(b["out"], a["out"]), 2e-5, "layer %d" % i)
            if "experts" in a:
                self.assertTrue(np.array_equal(np.sort(a["experts"], 1), np.sort(b["experts"], 1)))
        self.assertLess(rel_err(rb["logits"], ra["logits"]), 2e-5)
        self.assertTrue(np.array_equal(ra["logits"].argmax(-1), rb["logits"].argmax(-1)))

    def test_fp32_close_to_f64_and_dtypes(self):
        ids = prompt_ids(24)
        a, b = Model(tiny_dir()), Model(tiny_dir(), mode="f64")
        ra, rb = a.forward(ids, a.new_state()), b.forward(ids, b.new_state())
        self.assertEqual(ra["logits"].dtype, np.float32)
        self.assertEqual(ra["layers"][1]["out"].dtype, np.float32)
        self.assertEqual(rb["logits"].dtype, np.float64)
        self.assertLess(rel_err(ra["logits"], rb["logits"]), 1e-4)
        self.assertGreater(rel_err(ra["logits"], rb["logits"]), 0)      # really two precisions

    def test_bf16_mode_runs_and_drifts_moderately(self):
        ids = prompt_ids(16)
        a, b = Model(tiny_dir()), Model(tiny_dir(), mode="bf16")
        ra, rb = a.forward(ids, a.new_state()), b.forward(ids, b.new_state())
        self.assertTrue(np.all(np.isfinite(rb["logits"])))
        x, y = rb["layers"][0]["out"].astype(np.float64), ra["layers"][0]["out"]
        e0 = float(np.sqrt(np.mean((x - y) ** 2) / np.mean(y ** 2)))    # rms-relative after layer 0
        self.assertTrue(1e-4 < e0 < 5e-2, e0)                            # bf16-sized, not fp32-sized

    def test_health_and_routing_margins(self):
        """Canonical fixture (prompt + 32 generated tokens): activations healthy, most experts
        used within 32 positions, the smallest top-k margin well above the fp32-vs-f64 error
        of the biased router scores, greedy tokens decided by clear logit gaps."""
        from kimi_tokenizer import Tokenizer
        a, b = Model(tiny_dir()), Model(tiny_dir(), mode="f64")
        ids = Tokenizer.from_dir(tiny_dir()).encode(PROMPT)
        gen, ra = generate(a, ids, 32, a.cfg.eos)
        rb = b.forward(ra["ids"], b.new_state())
        self.assertEqual(list(rb["logits"][len(ids) - 1:].argmax(-1)), gen)
        lg = np.sort(ra["logits"][len(ids) - 1:], -1)
        self.assertGreater(float((lg[:, -1] - lg[:, -2]).min()), 1e-3)
        c = a.cfg
        err, margin = 0.0, np.inf
        for i, (x, y) in enumerate(zip(ra["layers"], rb["layers"])):
            rms = float(np.sqrt(np.mean(x["out"].astype(np.float64) ** 2)))
            self.assertTrue(0.3 < rms < 10, (i, rms))
            if "experts" in x:
                self.assertGreaterEqual(len(np.unique(x["experts"][:32])), 0.75 * c.E, i)
                err = max(err, float(np.abs(x["sel"] - y["sel"]).max()))
                margin = min(margin, float(x["margin"].min()))
                self.assertTrue(np.array_equal(x["experts"], y["experts"]))
                w = x["expert_weights"].astype(np.float64)
                self.assertLess(np.abs(w.sum(1) - c.rsf).max(), 1e-5)
        g = a.glu_stats
        self.assertLess(g["sat"] / g["n"], 1e-3)                          # SiTU caps rarely reached
        self.assertGreater(err, 0)
        self.assertGreater(margin, 10 * err, "min margin %.3e vs fp32 score error %.3e" % (margin, err))

    def test_routing_rules(self):
        """Top-k uses biased scores, weights the unbiased ones; ties -> lower index."""
        m = Model(tiny_dir())
        ids = prompt_ids(8)
        r = m.forward(ids, m.new_state())
        L = r["layers"][1]
        s = L["sel"] - m.w("model.layers.1.block_sparse_moe.gate.e_score_correction_bias")
        for t in range(len(ids)):
            want = sorted(range(m.cfg.E), key=lambda e: (-float(L["sel"][t, e]), e))[:m.cfg.k]
            self.assertEqual(list(L["experts"][t]), want)
            w = s[t, want] / s[t, want].sum()
            self.assertLess(np.abs(w - L["expert_weights"][t]).max(), 1e-6)

    def test_schedule_k3(self):
        c = Config(mc.model_config(mc.K3_TEXT_CONFIG, {"bos_token_id": 163584, "eos_token_id": 163586,
                                                       "pad_token_id": 163839}, 1024, "mxfp4"))
        mla = [i for i in range(c.L) if not c.is_kda(i)]
        self.assertEqual(mla, [i for i in range(93) if i % 4 == 3] + [92])
        self.assertEqual([i for i in range(c.L) if not c.is_moe(i)], [0])
        self.assertEqual([i for i in range(c.L) if i % c.block == 0], [0, 12, 24, 36, 48, 60, 72, 84])


# ---------------------------------------------------------------------------
class TestCheckpoint(unittest.TestCase):
    def test_deterministic(self):
        d2 = os.path.join(_TMP, "tiny-again")
        mc.make_checkpoint("tiny", TINY_SEED, d2)
        files = sorted(os.listdir(tiny_dir()))
        self.assertEqual(files, sorted(os.listdir(d2)))
        for f in files:
            with open(os.path.join(tiny_dir(), f), "rb") as a, open(os.path.join(d2, f), "rb") as b:
                self.assertEqual(a.read(), b.read(), f)
        d3 = os.path.join(_TMP, "tiny-seed2")
        mc.make_checkpoint("tiny", TINY_SEED + 1, d3)
        with open(os.path.join(tiny_dir(), files[-5]), "rb") as a, open(os.path.join(d3, files[-5]), "rb") as b:
            self.assertNotEqual(a.read(), b.read())

    def test_layout_matches_config(self):
        d = tiny_dir()
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        md = ModelDir(d)
        want = {n: (dt, tuple(s)) for n, dt, s in mc.tensor_specs(cfg["text_config"])}
        got = {n: (md.dtype(n), md.shape(n)) for n in md.names if n.startswith("language_model.")}
        self.assertEqual(got, want)
        self.assertTrue(any(n.startswith("vision_tower.") for n in md.names))
        self.assertTrue(any(n.startswith("mm_projector.") for n in md.names))
        with open(os.path.join(d, "model.safetensors.index.json")) as f:
            idx = json.load(f)
        self.assertEqual(idx["metadata"]["total_size"], md.data_bytes())
        shards = sorted(set(idx["weight_map"].values()))
        self.assertEqual(shards, ["model-%05d-of-%05d.safetensors" % (i + 1, len(shards)) for i in range(len(shards))])
        self.assertGreater(len(shards), 2)
        per_layer = {}
        for n, s in idx["weight_map"].items():
            if ".layers." in n:
                per_layer.setdefault(n.split(".layers.")[1].split(".")[0], set()).add(s)
        self.assertTrue(any(len(v) > 1 for v in per_layer.values()), "no layer straddles two shards")
        for s in shards:
            st = SafetensorsFile(os.path.join(d, s))
            self.assertEqual(st.metadata, {"format": "pt"})
            self.assertEqual(st.data_start % 8, 0)
            keys = [(-DTYPES[st.info[n][0]][1], n) for n in st.names]
            self.assertEqual(keys, sorted(keys))                         # official writer's order
            st.close()
        # config shape vs the real K3 config
        tc = cfg["text_config"]
        self.assertEqual(cfg["architectures"], ["KimiK3ForConditionalGeneration"])
        self.assertEqual(list(tc), list(mc.K3_TEXT_CONFIG))
        self.assertEqual(tc["quantization_config"]["format"], "mxfp4-pack-quantized")
        self.assertEqual(tc["linear_attn_config"]["full_attn_layers"], [4, 8, 9])
        self.assertEqual(tc["eos_token_id"], tc["vocab_size"] - 256 + 2)
        md.close()

    def test_k3_template_matches_fixture(self):
        for p in FIXTURE_CANDIDATES:
            if os.path.exists(p):
                with open(p) as f:
                    fx = json.load(f)
                self.assertEqual(fx["text_config"], mc.K3_TEXT_CONFIG)
                self.assertEqual(list(fx["text_config"]), list(mc.K3_TEXT_CONFIG))
                self.assertEqual(list(fx), list(mc.model_config(mc.K3_TEXT_CONFIG, {
                    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}, 8, "mxfp4")))
                return
        self.skipTest("K3 fixture config not found")

    def test_k3_shapes_by_hand(self):
        specs = {n: (dt, s) for n, dt, s in mc.tensor_specs(mc.K3_TEXT_CONFIG)}
        e = "language_model.model.layers.5.block_sparse_moe.experts.895."
        a = "language_model.model.layers.%d.self_attn."
        self.assertEqual(specs[e + "w1.weight_packed"], ("U8", [3072, 1792]))
        self.assertEqual(specs[e + "w1.weight_scale"], ("U8", [3072, 112]))
        self.assertEqual(specs[e + "w3.weight_packed"], ("U8", [3072, 1792]))
        self.assertEqual(specs[e + "w2.weight_packed"], ("U8", [3584, 1536]))
        self.assertEqual(specs[e + "w2.weight_scale"], ("U8", [3584, 96]))
        self.assertEqual(specs[a % 0 + "q_conv1d.weight"], ("F32", [12288, 1, 4]))
        self.assertEqual(specs[a % 0 + "A_log"], ("F32", [96]))
        self.assertEqual(specs[a % 0 + "dt_bias"], ("F32", [12288]))
        self.assertEqual(specs[a % 0 + "g_proj.weight"], ("BF16", [12288, 7168]))
        self.assertEqual(specs[a % 0 + "o_norm.weight"], ("F32", [128]))
        self.assertEqual(specs[a % 3 + "kv_b_proj.weight"], ("BF16", [24576, 512]))
        self.assertEqual(specs[a % 3 + "q_b_proj.weight"], ("BF16", [18432, 1536]))
        self.assertEqual(specs[a % 92 + "kv_a_proj_with_mqa.weight"], ("BF16", [576, 7168]))
        self.assertEqual(specs[a % 92 + "o_proj.weight"], ("BF16", [7168, 12288]))
        m = "language_model.model.layers.1.block_sparse_moe."
        self.assertEqual(specs[m + "gate.e_score_correction_bias"], ("F32", [896]))
        self.assertEqual(specs[m + "shared_experts.gate_proj.weight"], ("BF16", [6144, 7168]))
        self.assertEqual(specs[m + "routed_expert_down_proj.weight"], ("BF16", [3584, 7168]))
        self.assertEqual(specs["language_model.model.layers.0.mlp.gate_proj.weight"], ("BF16", [33792, 7168]))
        self.assertNotIn("language_model.model.layers.0.block_sparse_moe.gate.weight", specs)
        self.assertEqual(specs["language_model.lm_head.weight"], ("BF16", [163840, 7168]))
        n_exp = sum(1 for n in specs if ".experts." in n)
        self.assertEqual(n_exp, 92 * 896 * 6)
        params = sum(int(np.prod(s)) * (2 if dt == "U8" and n.endswith("packed") else 1)
                     for n, (dt, s) in specs.items() if not n.endswith("weight_scale"))
        self.assertAlmostEqual(params / 1e12, 2.78, delta=0.03)

    def test_bf16_experts_variant(self):
        d = os.path.join(_TMP, "tiny-bf16")
        mc.make_checkpoint("tiny", TINY_SEED, d, expert_dtype="bf16")
        with open(os.path.join(d, "config.json")) as f:
            self.assertNotIn("quantization_config", json.load(f)["text_config"])
        a, b = ModelDir(tiny_dir()), ModelDir(d)
        base = "language_model.model.layers.4.block_sparse_moe.experts.7.w2."
        self.assertEqual(b.dtype(base + "weight"), "BF16")
        pk, sc = mxfp4.quantize(bf16_to_f32(b.get(base + "weight")))
        self.assertTrue(np.array_equal(pk, a.get(base + "weight_packed")))
        self.assertTrue(np.array_equal(sc, a.get(base + "weight_scale")))
        ids = prompt_ids(12)
        ma, mb = Model(tiny_dir()), Model(d)
        ra, rb = ma.forward(ids, ma.new_state()), mb.forward(ids, mb.new_state())
        self.assertTrue(np.array_equal(ra["logits"], rb["logits"]))       # identical weights, bit for bit


# ---------------------------------------------------------------------------
class TestSafetensors(unittest.TestCase):
    def write(self, name, tensors, meta=None):
        p = os.path.join(_TMP, name)
        write_safetensors(p, tensors, meta)
        return p

    def test_roundtrip_and_bf16(self):
        x = np.array([1.0, -2.5, 3.14159, 1e-3], np.float32)
        p = self.write("rt.safetensors", [("b", "BF16", [4], f32_to_bf16(x)), ("a", "F32", [2, 2], x.reshape(2, 2)),
                                           ("c", "U8", [3], np.arange(3, dtype=np.uint8))], {"k": "v"})
        st = SafetensorsFile(p)
        self.assertEqual(st.names, ["a", "b", "c"])
        self.assertTrue(np.array_equal(st.get("a"), x.reshape(2, 2)))
        self.assertLess(np.abs(bf16_to_f32(st.get("b")) - x).max(), 1e-2)
        self.assertEqual(float(bf16_to_f32(f32_to_bf16(np.float32(1 + 2 ** -8)))), 1.0)      # tie -> even
        self.assertEqual(float(bf16_to_f32(f32_to_bf16(np.float32(1 + 3 * 2 ** -8)))), 1 + 2 ** -6)
        st.close()

    def corrupt(self, edit):
        p = self.write("ok.safetensors", [("a", "F32", [2], np.ones(2, np.float32)),
                                          ("b", "F32", [2], np.ones(2, np.float32))])
        with open(p, "rb") as f:
            raw = f.read()
        n = struct.unpack("<Q", raw[:8])[0]
        hdr, data = raw[8:8 + n].decode(), raw[8 + n:]
        hdr, data = edit(hdr, data)
        hb = hdr.encode()
        q = os.path.join(_TMP, "bad.safetensors")
        with open(q, "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb + data)
        return q

    def test_rejects_bad_files(self):
        bad = [lambda h, d: (h, d + b"x"),                                        # trailing bytes
               lambda h, d: (h.replace("[0,8]", "[0,4]"), d),                      # size mismatch
               lambda h, d: (h.replace('"F32","shape":[2],"data_offsets":[8,16]',
                                       '"F32","shape":[2],"data_offsets":[9,17]'), d + b"x"),   # hole
               lambda h, d: (h.replace('"b":', '"a":'), d),                        # duplicate key
               lambda h, d: (h.replace('"F32"', '"F99"', 1), d),                   # unknown dtype
               lambda h, d: ("[" + h[1:-1] + "]", d)]                              # not an object
        for i, e in enumerate(bad):
            with self.assertRaises(SafetensorsError, msg="case %d" % i):
                SafetensorsFile(self.corrupt(e)).close()


# ---------------------------------------------------------------------------
class TestCLI(unittest.TestCase):
    def test_text_ids_and_dump(self):
        cli = os.path.join(HERE, "k3ref.py")
        dump = os.path.join(_TMP, "dump.safetensors")
        base = [sys.executable, cli, "--model", tiny_dir(), "--prompt", PROMPT, "--n", "6"]
        text = subprocess.run(base + ["--dump", dump], check=True, stdout=subprocess.PIPE).stdout
        ids = subprocess.run(base + ["--print-ids"], check=True, stdout=subprocess.PIPE).stdout
        gen = [int(t) for t in ids.split()]
        from kimi_tokenizer import Tokenizer
        self.assertEqual(text, Tokenizer.from_dir(tiny_dir()).decode(gen))
        st = SafetensorsFile(dump)
        meta = st.metadata
        self.assertEqual((meta["format"], meta["version"], meta["mode"]), ("k3ref-dump", "1", "fp32"))
        n_prompt = int(meta["n_prompt"])
        T = n_prompt + len(gen) - 1
        self.assertEqual(st.info["logits"][1], (T, 4096))
        self.assertEqual(list(st.get("ids")[n_prompt:]), gen[:-1])
        self.assertEqual(list(st.get("logits")[n_prompt - 1:].argmax(-1)), gen)
        self.assertEqual(st.info["layers.1.experts"][:2], ("I32", (T, 4)))
        self.assertEqual(st.info["layers.8.out"][:2], ("F32", (T, 128)))
        self.assertNotIn("layers.0.experts", st.info)
        self.assertIn("final_hidden", st.info)
        st.close()


if __name__ == "__main__":
    unittest.main()

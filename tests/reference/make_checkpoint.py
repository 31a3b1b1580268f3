#!/usr/bin/python3
"""Make a random Kimi K3 checkpoint laid out exactly like the released one (DESIGN §5).

  make_checkpoint.py --preset {tiny,small,medium} --seed N --out DIR [--expert-dtype {mxfp4,bf16}]

Writes DIR/config.json (shaped like the real K3 config: KimiK3ForConditionalGeneration,
every text_config field, 1-based kda/full layer lists, compressed-tensors MXFP4
quantization_config), model-0000i-of-0000n.safetensors shards (a layer may straddle
two shards), model.safetensors.index.json, tiktoken.model + tokenizer_config.json.
Names carry the `language_model.` prefix; dtypes as released (BF16; F32 for A_log,
dt_bias, conv1d weights, o_norm, e_score_correction_bias; routed experts MXFP4 as U8
weight_packed [out, in/2] + weight_scale [out, in/32]); a few vision_tower.* /
mm_projector.* tensors (k3 skips them).

Deterministic: every tensor is drawn from its own PCG64 generator seeded with
(seed, crc32(tensor name)), so the same preset + seed gives byte-identical files in
any order, and shards are generated one at a time (bounded memory, even for medium).

--expert-dtype bf16 writes the experts as BF16 `.weight` [out, in] holding exactly the
dequantized values of the MXFP4 codes the mxfp4 variant would have (same seed), and no
quantization_config. Every generated MXFP4 block holds a magnitude-4 or -6 element, so
mxfp4.quantize() of the bf16 experts gives back the mxfp4 checkpoint's bytes exactly:
k3pack's quantize path can be tested for bit equality end to end.
"""

import argparse
import copy
import json
import math
import os
import sys
import time
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import mxfp4                                    # noqa: E402
from safetensors_io import f32_to_bf16, nbytes_of, write_safetensors   # noqa: E402

LM = "language_model."
P = LM + "model."

# The real K3 text_config (= /work/shared/fixtures/kimi-k3-config.json), key order kept.
K3_QUANT_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "mxfp4-pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "format": "mxfp4-pack-quantized", "targets": ["Linear"],
        "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32,
                    "symmetric": True, "scale_dtype": "torch.uint8", "dynamic": False}}},
    "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
               "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"],
}


def full_attn_schedule(n_layers):
    """K3's pattern: every 4th layer plus the last (1-based). K3: [4,8,...,92,93]."""
    full = [j for j in range(4, n_layers + 1, 4)]
    if n_layers not in full:
        full.append(n_layers)
    kda = [j for j in range(1, n_layers + 1) if j not in full]
    return full, kda


K3_TEXT_CONFIG = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
    "vocab_size": 163840, "hidden_size": 7168, "num_hidden_layers": 93, "intermediate_size": 33792,
    "moe_intermediate_size": 3072, "routed_expert_hidden_size": 3584, "num_experts": 896,
    "num_experts_per_token": 16, "num_shared_experts": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "moe_renormalize": True, "moe_router_activation_func": "sigmoid", "routed_scaling_factor": 1.0,
    "use_grouped_topk": True, "num_expert_group": 1, "topk_group": 1, "topk_method": "noaux_tc",
    "latent_moe_use_norm": True, "num_attention_heads": 96, "num_key_value_heads": 96, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "mla_use_nope": True, "mla_use_output_gate": True,
    "linear_attn_config": {"full_attn_layers": full_attn_schedule(93)[0], "kda_layers": full_attn_schedule(93)[1],
                           "num_heads": 96, "head_dim": 128, "short_conv_kernel_size": 4,
                           "use_full_rank_gate": True, "gate_lower_bound": -5.0},
    "attn_res_block_size": 12, "hidden_act": "situ", "activation_situ_beta": 4.0,
    "activation_situ_linear_beta": 25.0, "rms_norm_eps": 1e-05, "max_position_embeddings": 1048576,
    "tie_word_embeddings": False, "num_nextn_predict_layers": 0, "bos_token_id": 163584,
    "eos_token_id": 163586, "pad_token_id": 163839, "dtype": "bfloat16",
    "quantization_config": K3_QUANT_CONFIG,
}

# Presets: text_config overrides + generator knobs. vocab/bos/eos/pad come from the tokenizer.
PRESETS = {
    # every layer kind: L0 KDA + dense FFN, KDA, MLA (0-based 3, 7, 8: the last two MLA),
    # AttnRes boundaries 0,3,6 (3 blocks + partial), 32 experts top-4, latent 96.
    "tiny": dict(cfg=dict(hidden_size=128, num_hidden_layers=9, intermediate_size=256,
                          moe_intermediate_size=64, routed_expert_hidden_size=96, num_experts=32,
                          num_experts_per_token=4, num_attention_heads=4, num_key_value_heads=4,
                          q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
                          v_head_dim=32, attn_res_block_size=3, max_position_embeddings=4096,
                          kda_heads=4, kda_head_dim=32),
                 shards=4, vision_hidden=32, router="grouped"),
    # K3 sparsity: 256 experts, 16 active; experts 8 layers x 256 x 470016 B = 0.96 GB.
    "small": dict(cfg=dict(hidden_size=1024, num_hidden_layers=9, intermediate_size=2048,
                           moe_intermediate_size=512, routed_expert_hidden_size=576, num_experts=256,
                           num_experts_per_token=16, num_attention_heads=8, num_key_value_heads=8,
                           q_lora_rank=384, kv_lora_rank=256, qk_nope_head_dim=64, qk_rope_head_dim=32,
                           v_head_dim=64, attn_res_block_size=4, max_position_embeddings=65536,
                           kda_heads=8, kda_head_dim=128),
                  shards=8, vision_hidden=64, router="grouped"),
    # benchmarks only (never in CI): experts 18 layers x 384 x 1.46 MB = 10.1 GB.
    "medium": dict(cfg=dict(hidden_size=2048, num_hidden_layers=19, intermediate_size=4096,
                            moe_intermediate_size=896, routed_expert_hidden_size=1024, num_experts=384,
                            num_experts_per_token=16, num_attention_heads=16, num_key_value_heads=16,
                            q_lora_rank=512, kv_lora_rank=256, qk_nope_head_dim=64, qk_rope_head_dim=32,
                            v_head_dim=64, attn_res_block_size=6, max_position_embeddings=65536,
                            kda_heads=16, kda_head_dim=128),
                   shards=12, vision_hidden=64, router="continuous"),
    # benchmarks only: real K3 shapes (every dimension of the fixture, the vocabulary padded to
    # 163840 like K3's), cut to 4 layers (0: KDA + dense FFN, 1-2: KDA + MoE, 3: MLA + MoE) and 16
    # experts, all of which fire: a token computes what a K3 token computes in these layers.
    # About 9 GB (tests/bench/bench_k3_compute.sh).
    "k3slice": dict(cfg=dict(num_hidden_layers=4, num_experts=16, vocab_size=163840,
                             kda_heads=96, kda_head_dim=128),
                    shards=8, vision_hidden=64, router="continuous"),
}

# Generator knobs (see README "Presets" / "Routing margins" for how they were chosen).
# Router: "grouped" (default for tiny/small) gives experts in groups of k/2 identical gate
# rows and one bias per group, so every token picks two whole groups and the top-k boundary
# always falls between two groups: the selection margin is a gap between group scores, not
# between neighbouring experts (about 8x rarer near-ties, measured). "continuous" = i.i.d.
# rows and biases (realistic access pattern; default for the benchmark-only medium preset).
ROUTER_LOGIT_STD = 1.0      # std of router logits for an RMS-1 input
BIAS_STD = 0.05             # spread of e_score_correction_bias (before the grid)
BIAS_GRID = 2.0 ** -6       # bias values are multiples of this (coarse, exact in bf16/f32)
LM_HEAD_LOGIT_STD = 3.0     # std of output logits
ATTNRES_SCORE_STD = 1.0     # std of AttnRes block scores
MXFP4_MAG_SIGMA = 1.5       # element magnitudes ~ |N(0, sigma)| rounded to E2M1


def make_text_config(preset, tok):
    """text_config for a preset (dict in the fixture's key order). tok: ids from the tokenizer."""
    o = dict(PRESETS[preset]["cfg"])
    tc = copy.deepcopy(K3_TEXT_CONFIG)
    kda_heads, kda_dim = o.pop("kda_heads"), o.pop("kda_head_dim")
    vocab_pad = o.pop("vocab_size", 0)           # a padded vocabulary, as K3's (163840)
    for k, v in o.items():
        assert k in tc, k
        tc[k] = v
    full, kda = full_attn_schedule(tc["num_hidden_layers"])
    lac = tc["linear_attn_config"]
    lac["full_attn_layers"], lac["kda_layers"] = full, kda
    lac["num_heads"], lac["head_dim"] = kda_heads, kda_dim
    tc["vocab_size"] = max(tok["vocab_size"], vocab_pad)
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        tc[k] = tok[k]
    return tc


def is_kda(tc, i):
    return (i + 1) in tc["linear_attn_config"]["kda_layers"]


def is_moe(tc, i):
    return (tc.get("num_experts") is not None and i >= tc["first_k_dense_replace"]
            and i % tc["moe_layer_freq"] == 0)


def tensor_specs(tc, expert_dtype="mxfp4", expert_layout="by-expert"):
    """All language-model tensors as (name, dtype, shape), in module order (config-driven)."""
    D, V, L = tc["hidden_size"], tc["vocab_size"], tc["num_hidden_layers"]
    lac = tc["linear_attn_config"]
    H, K, W = lac["num_heads"], lac["head_dim"], lac["short_conv_kernel_size"]
    Hm, dn, dr, dv = tc["num_attention_heads"], tc["qk_nope_head_dim"], tc["qk_rope_head_dim"], tc["v_head_dim"]
    R, Q = tc["kv_lora_rank"], tc["q_lora_rank"]
    E, I = tc["num_experts"], tc["moe_intermediate_size"]
    Dl = tc.get("routed_expert_hidden_size") or D
    S = I * tc["num_shared_experts"]
    out = [(P + "embed_tokens.weight", "BF16", [V, D])]
    for i in range(L):
        p = P + "layers.%d." % i
        out += [(p + "input_layernorm.weight", "BF16", [D]),
                (p + "self_attention_res_norm.weight", "BF16", [D]),
                (p + "self_attention_res_proj.weight", "BF16", [1, D])]
        a = p + "self_attn."
        if is_kda(tc, i):
            for x in "qkv":
                out.append((a + "%s_proj.weight" % x, "BF16", [H * K, D]))
            for x in "qkv":
                out.append((a + "%s_conv1d.weight" % x, "F32", [H * K, 1, W]))
            out += [(a + "A_log", "F32", [H]), (a + "dt_bias", "F32", [H * K]),
                    (a + "f_a_proj.weight", "BF16", [K, D]), (a + "f_b_proj.weight", "BF16", [H * K, K]),
                    (a + "b_proj.weight", "BF16", [H, D])]
            if lac.get("use_full_rank_gate"):
                out.append((a + "g_proj.weight", "BF16", [H * K, D]))
            else:
                out += [(a + "g_a_proj.weight", "BF16", [K, D]), (a + "g_b_proj.weight", "BF16", [H * K, K])]
            out += [(a + "o_norm.weight", "F32", [K]), (a + "o_proj.weight", "BF16", [D, H * K])]
        else:
            if Q:
                out += [(a + "q_a_proj.weight", "BF16", [Q, D]), (a + "q_a_layernorm.weight", "BF16", [Q]),
                        (a + "q_b_proj.weight", "BF16", [Hm * (dn + dr), Q])]
            else:
                out.append((a + "q_proj.weight", "BF16", [Hm * (dn + dr), D]))
            out += [(a + "kv_a_proj_with_mqa.weight", "BF16", [R + dr, D]),
                    (a + "kv_a_layernorm.weight", "BF16", [R]),
                    (a + "kv_b_proj.weight", "BF16", [Hm * (dn + dv), R])]
            if tc.get("mla_use_output_gate"):
                out.append((a + "g_proj.weight", "BF16", [Hm * dv, D]))
            out.append((a + "o_proj.weight", "BF16", [D, Hm * dv]))
        out += [(p + "post_attention_layernorm.weight", "BF16", [D]),
                (p + "mlp_res_norm.weight", "BF16", [D]),
                (p + "mlp_res_proj.weight", "BF16", [1, D])]
        if is_moe(tc, i):
            m = p + "block_sparse_moe."
            out += [(m + "gate.weight", "BF16", [E, D]), (m + "gate.e_score_correction_bias", "F32", [E])]
            if tc.get("routed_expert_hidden_size"):
                out.append((m + "routed_expert_down_proj.weight", "BF16", [Dl, D]))
            mats = (("w1", (I, Dl)), ("w3", (I, Dl)), ("w2", (Dl, I)))
            # by-expert: an expert's tensors adjacent (as the real release, whose files the
            # safetensors library writes sorted by name); by-tensor: every expert's w1, then
            # every w3, then every w2, in this order in the file (no record adjacent:
            # k3pack's --experts-in-place must copy them all)
            order = ([(e, w) for e in range(E) for w in mats] if expert_layout == "by-expert"
                     else [(e, w) for w in mats for e in range(E)])
            for e, (w, (o_, i_)) in order:
                n = m + "experts.%d.%s." % (e, w)
                if expert_dtype == "mxfp4":
                    out += [(n + "weight_packed", "U8", [o_, i_ // 2]), (n + "weight_scale", "U8", [o_, i_ // 32])]
                else:
                    out.append((n + "weight", "BF16", [o_, i_]))
            if tc.get("latent_moe_use_norm") and tc.get("routed_expert_hidden_size"):
                out.append((m + "routed_expert_norm.weight", "BF16", [Dl]))
            if tc.get("routed_expert_hidden_size"):
                out.append((m + "routed_expert_up_proj.weight", "BF16", [D, Dl]))
            if tc["num_shared_experts"]:
                out += [(m + "shared_experts.gate_proj.weight", "BF16", [S, D]),
                        (m + "shared_experts.up_proj.weight", "BF16", [S, D]),
                        (m + "shared_experts.down_proj.weight", "BF16", [D, S])]
        else:
            Id = tc["intermediate_size"]
            out += [(p + "mlp.gate_proj.weight", "BF16", [Id, D]), (p + "mlp.up_proj.weight", "BF16", [Id, D]),
                    (p + "mlp.down_proj.weight", "BF16", [D, Id])]
    out += [(P + "norm.weight", "BF16", [D]), (P + "output_attn_res_norm.weight", "BF16", [D]),
            (P + "output_attn_res_proj.weight", "BF16", [1, D]), (LM + "lm_head.weight", "BF16", [V, D])]
    return out


def vision_specs(vh, D):
    """A few MoonViT / projector tensors (names plausible, content irrelevant: skipped by k3)."""
    return [("vision_tower.patch_embed.proj.weight", "BF16", [vh, 3, 14, 14]),
            ("vision_tower.patch_embed.proj.bias", "BF16", [vh]),
            ("vision_tower.encoder.blocks.0.norm0.weight", "BF16", [vh]),
            ("vision_tower.encoder.blocks.0.wqkv.weight", "BF16", [3 * vh, vh]),
            ("vision_tower.encoder.blocks.0.wo.weight", "BF16", [vh, vh]),
            ("mm_projector.pre_norm.weight", "BF16", [vh]),
            ("mm_projector.proj.0.weight", "BF16", [D, 4 * vh]),
            ("mm_projector.proj.2.weight", "BF16", [D, D])]


# ---------------------------------------------------------------------------
# Random content
# ---------------------------------------------------------------------------

def rng_for(seed, name):
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(name.encode())])))


def _mag_probs(sigma):
    """[8] P(|N(0,sigma)| rounds to E2M1 magnitude index j) (midpoint rounding, saturating)."""
    edges = [0.0] + list(mxfp4.MIDPOINTS) + [math.inf]
    cdf = [math.erf(e / (sigma * math.sqrt(2))) if e != math.inf else 1.0 for e in edges]
    return np.array([cdf[j + 1] - cdf[j] for j in range(8)])


MAG_P = _mag_probs(MXFP4_MAG_SIGMA)
BYTE_LUT = mxfp4.byte_lut_for_distribution(MAG_P)                     # [65536] u8
# RMS of a generated element in E2M1 units (31 random + 1 forced |4| or |6| per block)
ELEM_RMS = math.sqrt((31 * float((MAG_P * mxfp4.E2M1.astype(float) ** 2).sum()) + (16 + 36) / 2) / 32)


def expert_codes(seed, base, out_dim, in_dim):
    """MXFP4 (packed [out, in/2] u8, scales [out, in/32] u8) of expert matrix `base`
    (name without .weight*), target element std ~ 1/sqrt(in)."""
    r = rng_for(seed, base + ".codes")
    nbytes = out_dim * in_dim // 2
    packed = BYTE_LUT[r.integers(0, 65536, size=nbytes, dtype=np.uint16)]          # [out*in/2]
    blk = packed.reshape(-1, 16)                                                   # [nblocks, 16]
    nb = blk.shape[0]
    pos = r.integers(0, 16, size=nb)
    hi = r.integers(0, 2, size=nb).astype(bool)
    nib = (6 + r.integers(0, 2, size=nb) + 8 * r.integers(0, 2, size=nb)).astype(np.uint8)
    rows = np.arange(nb)
    cur = blk[rows, pos]
    blk[rows, pos] = np.where(hi, (cur & 0x0F) | (nib << 4), (cur & 0xF0) | nib)
    e0 = 127 + math.floor(math.log2(1.0 / (math.sqrt(in_dim) * ELEM_RMS)))   # std <= 1/sqrt(in)
    jit = r.choice(np.array([-1, 0, 0, 1], dtype=np.int64), size=(out_dim, in_dim // 32))
    scales = (e0 + jit).astype(np.uint8)
    return packed.reshape(out_dim, in_dim // 2), scales


_LAST_CODES = {}   # one-entry cache: weight_packed and weight_scale of a matrix are adjacent


def router_groups(seed, name, tc, router):
    """Group of each expert of the MoE layer owning `name`: ([E] int group ids, G).
    grouped: groups of k/2 experts (random members); continuous: one expert per group."""
    E, k = tc["num_experts"], tc["num_experts_per_token"]
    gsize = max(1, k // 2) if router == "grouped" else 1
    if E % gsize:
        raise ValueError("num_experts must be a multiple of the router group size")
    layer = name.split("block_sparse_moe.")[0]
    perm = rng_for(seed, layer + "router_groups").permutation(E)                   # [E]
    grp = np.empty(E, dtype=np.int64)
    grp[perm] = np.arange(E) // gsize
    return grp, E // gsize


def gen_tensor(seed, name, dtype, shape, tc, router="grouped"):
    """Content of one tensor as an ndarray of the safetensors dtype (BF16 as uint16 bits)."""
    if ".experts." in name:
        base, leaf = name.rsplit(".", 1)               # base = ...experts.e.wN
        if leaf == "weight":                           # BF16 variant: dequantized codes, exactly
            o_, i_ = shape
        else:
            o_, i_ = shape[0], shape[1] * (2 if leaf == "weight_packed" else 32)
        key = (seed, base, o_, i_)
        if key not in _LAST_CODES:
            _LAST_CODES.clear()
            _LAST_CODES[key] = expert_codes(seed, base, o_, i_)
        pk, sc = _LAST_CODES[key]
        if leaf == "weight":
            return f32_to_bf16(mxfp4.dequantize(pk, sc))
        return pk if leaf == "weight_packed" else sc
    r = rng_for(seed, name)
    D = tc["hidden_size"]
    if name.endswith("_conv1d.weight"):              # [C,1,W]: taps ~ N(0, .5)
        return (r.standard_normal(shape) * 0.5).astype(np.float32)
    if name.endswith("A_log"):                       # exp(A_log) in [0.5, 4]
        return np.log(r.uniform(0.5, 4.0, size=shape)).astype(np.float32)
    if name.endswith("dt_bias"):                     # keeps the lower-bounded gate mostly near 0
        return r.uniform(-4.0, 0.0, size=shape).astype(np.float32)
    if name.endswith("o_norm.weight"):
        return r.uniform(0.8, 1.2, size=shape).astype(np.float32)
    if name.endswith("e_score_correction_bias"):     # coarse grid, see README "routing margins"
        grp, G = router_groups(seed, name, tc, router)
        b = np.round(r.standard_normal(G) * BIAS_STD / BIAS_GRID) * BIAS_GRID     # [G]
        return b[grp].astype(np.float32)
    if name.endswith("block_sparse_moe.gate.weight"):
        grp, G = router_groups(seed, name, tc, router)
        rows = r.standard_normal((G, shape[1]), dtype=np.float32)                  # [G,D]
        x = rows[grp] * (ROUTER_LOGIT_STD / math.sqrt(shape[1]))                   # [E,D]
        return f32_to_bf16(x)
    if name.endswith("_res_proj.weight"):            # AttnRes query = norm.w * proj.w
        x = r.standard_normal(shape) * (ATTNRES_SCORE_STD / math.sqrt(D))
    elif len(shape) == 1 or name.endswith("norm.weight"):   # RMSNorm weights ~ 1
        x = r.uniform(0.8, 1.2, size=shape)
    elif name.endswith("embed_tokens.weight"):
        x = r.standard_normal(shape, dtype=np.float32)
    elif name.endswith("lm_head.weight"):
        x = r.standard_normal(shape, dtype=np.float32) * (LM_HEAD_LOGIT_STD / math.sqrt(shape[1]))
    else:                                            # Linear [out, in] (also conv-shaped vision)
        fan_in = int(np.prod(shape[1:]))
        x = r.standard_normal(shape, dtype=np.float32) * (1.0 / math.sqrt(fan_in))
    if dtype == "BF16":
        return f32_to_bf16(np.asarray(x, dtype=np.float32))
    return np.asarray(x, dtype=np.float32)


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------

def model_config(tc, tok, vh, expert_dtype):
    tc = copy.deepcopy(tc)
    if expert_dtype != "mxfp4":
        tc.pop("quantization_config", None)
    return {
        "architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
        "bos_token_id": tok["bos_token_id"], "eos_token_id": tok["eos_token_id"],
        "pad_token_id": tok["pad_token_id"],
        "media_placeholder_token_id": tok["bos_token_id"] + 21,   # K3: 163605 = 163584 + 21
        "dtype": "bfloat16", "tie_word_embeddings": False,
        "text_config": tc,
        "vision_config": {"vt_hidden_size": vh, "vt_num_hidden_layers": 1, "vt_num_attention_heads": 2,
                          "vt_intermediate_size": 4 * vh, "patch_size": 14,
                          "text_hidden_size": tc["hidden_size"], "mm_hidden_size": vh},
    }


def split_shards(specs, n_shards):
    """Cut the module-ordered list into n contiguous runs of about equal bytes."""
    sizes = [nbytes_of(d, s) for _, d, s in specs]
    total = sum(sizes)
    shards, cur, acc = [], [], 0
    for spec, sz in zip(specs, sizes):
        cur.append(spec)
        acc += sz
        if len(shards) < n_shards - 1 and acc >= total * (len(shards) + 1) / n_shards:
            shards.append(cur)
            cur = []
    if cur:
        shards.append(cur)
    return shards


def write_json(path, obj):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def make_checkpoint(preset, seed, out, expert_dtype="mxfp4", tiktoken_model=None, log=None, router=None,
                    expert_layout="by-expert"):
    """Generate the checkpoint into `out`. Returns a summary dict."""
    router = router or PRESETS[preset]["router"]
    import kimi_tokenizer                       # the colleague's tokenizer module (lazy)
    t0 = time.time()
    os.makedirs(out, exist_ok=True)
    if tiktoken_model:
        tok = kimi_tokenizer.write_tokenizer_files(out, tiktoken_model)
    else:
        tok = kimi_tokenizer.write_tokenizer_files(out)
    pr = PRESETS[preset]
    tc = make_text_config(preset, tok)
    specs = tensor_specs(tc, expert_dtype, expert_layout) + vision_specs(pr["vision_hidden"], tc["hidden_size"])
    shards = split_shards(specs, pr["shards"])
    n = len(shards)
    weight_map, total = {}, 0
    for si, sh in enumerate(shards):
        fname = "model-%05d-of-%05d.safetensors" % (si + 1, n)
        tensors = [(nm, dt, shp, (lambda nm=nm, dt=dt, shp=shp: gen_tensor(seed, nm, dt, shp, tc, router)))
                   for nm, dt, shp in sh]
        total += write_safetensors(os.path.join(out, fname), tensors, {"format": "pt"},
                                   sort=expert_layout == "by-expert")
        for nm, _, _ in sh:
            weight_map[nm] = fname
        if log:
            log("  %s: %d tensors, %.1f MB, %.1f s" % (fname, len(sh), os.path.getsize(os.path.join(out, fname)) / 1e6,
                                                      time.time() - t0))
    write_json(os.path.join(out, "model.safetensors.index.json"),
               {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    write_json(os.path.join(out, "config.json"), model_config(tc, tok, pr["vision_hidden"], expert_dtype))
    expert_bytes = sum(nbytes_of(d, s) for nm, d, s in specs if ".experts." in nm)
    return {"preset": preset, "seed": seed, "dir": out, "tensors": len(specs), "shards": n,
            "total_size": total, "expert_bytes": expert_bytes, "seconds": time.time() - t0}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--expert-dtype", choices=["mxfp4", "bf16"], default="mxfp4")
    ap.add_argument("--tiktoken", default=None, help="tiktoken.model to copy (default: the committed one)")
    ap.add_argument("--router", choices=["grouped", "continuous"], default=None,
                    help="router weight structure (default: the preset's; see README)")
    ap.add_argument("--expert-layout", choices=["by-expert", "by-tensor"], default="by-expert",
                    help="by-expert: tensors sorted by name in each file, so each expert's are adjacent "
                         "(default); by-tensor: files in module order, all w1, all w3, all w2 of a layer")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)
    log = None if a.quiet else (lambda s: print(s, file=sys.stderr))
    s = make_checkpoint(a.preset, a.seed, a.out, a.expert_dtype, a.tiktoken, log, a.router, a.expert_layout)
    if not a.quiet:
        print("%s seed %d: %d tensors in %d shards, %.1f MB data (experts %.1f MB), %.1f s -> %s" % (
            s["preset"], s["seed"], s["tensors"], s["shards"], s["total_size"] / 1e6, s["expert_bytes"] / 1e6,
            s["seconds"], s["dir"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

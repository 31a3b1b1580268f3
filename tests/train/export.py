"""Write a torch demo model (k3torch.Model) as a checkpoint in K3's Hugging Face layout.

config.json with K3's nesting (text_config, quantization_config), model-0000i-of-0000n
safetensors shards cut by size in module order (tests/reference/make_checkpoint.py's tensor
list and writer), model.safetensors.index.json, tiktoken.model, tokenizer_config.json.
Dtypes as released: BF16 (round to nearest even from the trained fp32), F32 for A_log,
dt_bias, conv weights, o_norm and the routing bias, and the routed experts in MXFP4 from
tests/reference/mxfp4.quantize (the rule the fake quantization of training follows).
"""

import copy
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import make_checkpoint as mc  # noqa: E402
import mxfp4  # noqa: E402
from safetensors_io import f32_to_bf16, write_safetensors  # noqa: E402

# The demo model's shape: every K3 feature k3run implements.
# Sized for its compute budget (about 1.4e14 FLOP: an hour on two cores): 3.7 M parameters
# active per token, trained on about 3.7 M tokens (the training books 2.4 times over).
DEMO = dict(hidden_size=192, num_hidden_layers=9, intermediate_size=384, moe_intermediate_size=64,
            routed_expert_hidden_size=96, num_experts=32, num_experts_per_token=4,
            num_attention_heads=4, num_key_value_heads=4, q_lora_rank=96, kv_lora_rank=64,
            qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, attn_res_block_size=3,
            max_position_embeddings=4096)
DEMO_KDA = dict(num_heads=4, head_dim=32)
SHARDS = 4


def text_config(n_ranks, over=None):
    tc = copy.deepcopy(mc.K3_TEXT_CONFIG)
    for k, v in dict(DEMO, **(over or {})).items():
        assert k in tc, k
        tc[k] = v
    full, kda = mc.full_attn_schedule(tc["num_hidden_layers"])
    lac = tc["linear_attn_config"]
    lac["full_attn_layers"], lac["kda_layers"] = full, kda
    lac.update(DEMO_KDA)
    tc["vocab_size"] = n_ranks + 256
    tc["bos_token_id"], tc["eos_token_id"], tc["pad_token_id"] = n_ranks, n_ranks + 2, n_ranks + 255
    return tc


def model_config(tc):
    n = tc["bos_token_id"]
    return {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
            "bos_token_id": n, "eos_token_id": n + 2, "pad_token_id": n + 255,
            "media_placeholder_token_id": n + 21, "dtype": "bfloat16", "tie_word_embeddings": False,
            "text_config": tc}


def tensors_of(model):
    """{checkpoint name: float32 ndarray} of a k3torch.Model (experts split)."""
    out = {}
    for key, t in list(model.state_dict().items()):
        a = t.detach().cpu().numpy().astype(np.float32)
        if key == "lm_head.weight":
            out[mc.LM + key] = a
            continue
        parts = key.split(".")
        if "block_sparse_moe" in parts and parts[-1] in ("w1", "w2", "w3"):
            base = mc.P + ".".join(parts[:-1]) + ".experts."
            for e in range(a.shape[0]):
                out[base + "%d.%s" % (e, parts[-1])] = a[e]
            continue
        out[mc.P + key] = a
    return out


# The sampling the model card recommends (Hugging Face's generation_config.json; k3pack carries it
# into the pack, and `k3run chat` and `serve` take their defaults from it): the values Moonshot runs
# its recent thinking models at. Greedy decoding repeats itself on this small model.
GENERATION_CONFIG = {"do_sample": True, "temperature": 1.0, "top_p": 0.95}


def generation_config(tc):
    return dict(GENERATION_CONFIG, bos_token_id=tc["bos_token_id"], eos_token_id=tc["eos_token_id"],
                pad_token_id=tc["pad_token_id"])


def export(model, tok_dir, out_dir):
    """Write the checkpoint. tok_dir holds tiktoken.model and tokenizer_config.json."""
    tc = model.c.raw
    os.makedirs(out_dir, exist_ok=True)
    for f in ("tiktoken.model", "tokenizer_config.json"):
        if os.path.abspath(tok_dir) != os.path.abspath(out_dir):
            shutil.copyfile(os.path.join(tok_dir, f), os.path.join(out_dir, f))
    arrays = tensors_of(model)
    specs = mc.tensor_specs(tc, "mxfp4")
    want = {n for n, _, _ in specs}
    have = set(arrays) | {n + x for n in arrays if ".experts." in n for x in (".weight_packed", ".weight_scale")}
    missing = sorted(want - have)
    if missing:
        raise SystemExit("export: model lacks %s" % missing[:5])
    cache = {}

    def data(name, dtype, shape):
        if ".experts." in name:
            base = name.rsplit(".", 1)[0]
            if base not in cache:
                cache.clear()
                cache[base] = mxfp4.quantize(arrays[base])
            pk, sc = cache[base]
            return pk if name.endswith("weight_packed") else sc
        a = arrays[name].reshape(shape)
        return f32_to_bf16(a) if dtype == "BF16" else a.astype(np.float32)

    weight_map, total = {}, 0
    shards = mc.split_shards(specs, SHARDS)
    for si, sh in enumerate(shards):
        fname = "model-%05d-of-%05d.safetensors" % (si + 1, len(shards))
        ts = [(n, d, s, (lambda n=n, d=d, s=s: data(n, d, s))) for n, d, s in sh]
        total += write_safetensors(os.path.join(out_dir, fname), ts, {"format": "pt"})
        for n, _, _ in sh:
            weight_map[n] = fname
    mc.write_json(os.path.join(out_dir, "model.safetensors.index.json"),
                  {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    mc.write_json(os.path.join(out_dir, "config.json"), model_config(tc))
    mc.write_json(os.path.join(out_dir, "generation_config.json"), generation_config(tc))
    return total

"""Check k3inspect's output on the synthetic full-size K3 layout against totals
computed here, independently of the C code, from config.json and the tensor
table of spec/K3-ARCHITECTURE.md §3.

usage: check_k3_layout.py CONFIG SUMMARY_JSON LIST_JSON LIST_TXT CKPT_DIR
"""
import json
import os
import sys

cfg_path, summary_path, list_path, list_txt, ckpt = sys.argv[1:6]
c = json.load(open(cfg_path))["text_config"]
la = c["linear_attn_config"]

D, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
H, K, W = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]
HK = H * K
Hm, Q, R = c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
nope, rope, vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
I, Im, Dl = c["intermediate_size"], c["moe_intermediate_size"], c["routed_expert_hidden_size"]
E, S = c["num_experts"], c["moe_intermediate_size"] * c["num_shared_experts"]
kda = set(la["kda_layers"])                       # 1-based
moe = [i >= c["first_k_dense_replace"] and i % c["moe_layer_freq"] == 0 for i in range(L)]

# (params, bytes) by kind; BF16 = 2 bytes, F32 = 4; MXFP4: 1/2 byte + 1/32 byte per weight
acc = {}


def add(kind, params, nbytes):
    p, b = acc.get(kind, (0, 0))
    acc[kind] = (p + params, b + nbytes)


def bf16(kind, n):
    add(kind, n, 2 * n)


def f32(kind, n):
    add(kind, n, 4 * n)


bf16("embed", V * D)
bf16("lm_head", V * D)
bf16("norm", D)                                   # final norm
bf16("attn_res", 2 * D)                           # output_attn_res norm [D] + proj [1, D]
for i in range(L):
    bf16("norm", 2 * D)                           # input / post_attention layernorm
    bf16("attn_res", 4 * D)                       # self_attention_res_*, mlp_res_*
    if i + 1 in kda:
        bf16("kda", 3 * HK * D + K * D + HK * K + H * D + HK * D + D * HK)  # q k v, f_a f_b, b, g, o
        f32("kda", 3 * HK * W + H + HK + K)                                 # conv, A_log, dt_bias, o_norm
    else:
        bf16("mla", Q * D + Q + Hm * (nope + rope) * Q + (R + rope) * D + R
             + Hm * (nope + vd) * R + Hm * vd * D + D * Hm * vd)
    if moe[i]:
        bf16("router", E * D)
        f32("router", E)                          # e_score_correction_bias
        bf16("latent", 2 * Dl * D + Dl)
        bf16("shared_experts", 3 * S * D)
        w = 3 * Im * Dl                           # w1, w3 [Im, Dl]; w2 [Dl, Im]
        add("routed_experts", E * w, E * (w // 2 + w // 32))
    else:
        bf16("dense_ffn", 3 * I * D)

text_params = sum(p for p, _ in acc.values())
text_bytes = sum(b for _, b in acc.values())
routed_p, routed_b = acc["routed_experts"]

s = json.load(open(summary_path))
kinds = {k["kind"]: k for k in s["kinds"]}
ok = True


def check(what, got, want):
    global ok
    if got != want:
        print("MISMATCH %s: k3inspect %d, expected %d" % (what, got, want))
        ok = False


for kind, (p, b) in sorted(acc.items()):
    check(kind + " params", kinds[kind]["params"], p)
    check(kind + " bytes", kinds[kind]["bytes"], b)
vis = kinds.get("vision", {"params": 0, "bytes": 0, "tensors": 0})
check("vision tensors", vis["tensors"], 4)
check("total params", s["totals"]["params"] - vis["params"], text_params)
check("total bytes", s["totals"]["bytes"] - vis["bytes"], text_bytes)
check("layers", len(s["layers"]), L)
for row in s["layers"]:
    i = row["layer"]
    want = ("KDA" if i + 1 in kda else "MLA") + ("+MoE" if moe[i] else "+dense")
    if row["kind"] != want:
        print("MISMATCH layer %d kind %s, expected %s" % (i, row["kind"], want))
        ok = False

# shards: <= 5 GB (decimal) of data each, HF-style names, sizes as on disk
files = s["files"]
n = len(files)
for f in files:
    if f["size"] - f["data_offset"] > 5 * 10**9:
        print("MISMATCH shard %s holds %d data bytes" % (f["name"], f["size"] - f["data_offset"]))
        ok = False
    if f["size"] != os.stat(os.path.join(ckpt, f["name"])).st_size:
        print("MISMATCH size of %s" % f["name"])
        ok = False
check("shard names", sum(f["name"].endswith("-of-%05d.safetensors" % n) for f in files), n)

lj = json.load(open(list_path))
check("list tensors", len(lj["tensors"]), s["totals"]["tensors"])
check("list params", lj["totals"]["params"], s["totals"]["params"])
names = [t["name"] for t in lj["tensors"]]
check("prefixed names", sum(x.startswith("language_model.") for x in names), len(names) - 4)
check("list.txt rows", sum(1 for _ in open(list_txt, encoding="utf-8")) - 1, len(names))

trunk_p, trunk_b = text_params - routed_p, text_bytes - routed_b
print("K3 layout: %d tensors in %d shards" % (s["totals"]["tensors"], n))
print("  text model %d params (%.3f T), %d bytes (%.3f TB)"
      % (text_params, text_params / 1e12, text_bytes, text_bytes / 1e12))
print("  routed     %d params (%.3f T), %d bytes (%.4e)" % (routed_p, routed_p / 1e12, routed_b, routed_b))
print("  trunk      %d params (%.2f B), %d bytes (%.1f GB)" % (trunk_p, trunk_p / 1e9, trunk_b, trunk_b / 1e9))
for what, got, lo, hi in (("total params", text_params, 2.77e12, 2.79e12),     # published: 2.78 T
                          ("routed params", routed_p, 2.72e12, 2.73e12),       # 2.72 T
                          ("routed bytes", routed_b, 1.44e12, 1.45e12),        # 1.45 TB
                          ("trunk params", trunk_p, 56.0e9, 57.5e9)):          # ~56.7 B
    if not lo <= got <= hi:
        print("OUT OF RANGE %s %d" % (what, got))
        ok = False
sys.exit(0 if ok else 1)

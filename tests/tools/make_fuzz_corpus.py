"""Write the seed corpora of tests/fuzz (run from anywhere; rewrites the seed_* files):

  tests/fuzz/corpus/safetensors_header/seed_*.st   whole small safetensors files, good and bad
  tests/fuzz/corpus/json/seed_*.json               JSON documents, good and bad
  tests/fuzz/corpus/index/seed_*.json              model.safetensors.index.json for fuzz_index.c's two shards
  tests/fuzz/corpus/config/seed_*.json             the real K3 config.json, the demo checkpoints' configs, bad ones
  tests/fuzz/corpus/tiktoken/seed_*.model          small vocabularies (all 256 bytes + merges), good and bad
  tests/fuzz/corpus/tokenizer_config/seed_*.json   K3's released tokenizer_config.json, as-is and at the
                                                   test vocabulary's special ids, and bad ones
  tests/fuzz/corpus/tokenize/seed_*.txt            text: scripts, digits, whitespace runs, special-token
                                                   text, invalid UTF-8, NUL
  tests/fuzz/corpus/archive/seed_*.tar*            a micro checkpoint (K3's layout, 2 layers, 4 MXFP4 experts)
                                                   as tar, tar.gz, tar.zst, and damaged archives
  tests/fuzz/data/tokenizer_config.json            what fuzz_tokenize.c loads (K3's added tokens at 3840..)

With --k3pack BIN (a built k3pack) it also packs the micro checkpoint and writes

  tests/fuzz/corpus/manifest/seed_*.json           its manifest.json and damaged variants
  tests/fuzz/corpus/shard_header/seed_*.k3s        the header images of its trunk and expert shards
  tests/fuzz/corpus/expert_layout/seed_*.k3s       the header images of its expert shards

(without it those corpora are left as they are). Needs /usr/bin/python3 with numpy
(tests/reference) and the zstd program. Findings of fuzzing runs are added next to the
seeds as regress_* files by scripts/fuzz.sh.
"""
import argparse
import base64
import copy
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.normpath(os.path.join(HERE, ".."))
ROOT = os.path.join(TESTS, "fuzz", "corpus")


def st(header, data_len, n_override=None):
    h = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    n = len(h) if n_override is None else n_override
    return struct.pack("<Q", n) + h + b"\0" * data_len


def t(dtype, shape, b, e):
    return {"dtype": dtype, "shape": shape, "data_offsets": [b, e]}


DTYPES = [("BOOL", 8), ("U8", 8), ("I8", 8), ("F4", 4), ("F6_E2M3", 6), ("F6_E3M2", 6),
          ("F8_E5M2", 8), ("F8_E4M3", 8), ("F8_E8M0", 8), ("F8_E4M3FNUZ", 8), ("F8_E5M2FNUZ", 8),
          ("I16", 16), ("U16", 16), ("F16", 16), ("BF16", 16), ("I32", 32), ("U32", 32), ("F32", 32),
          ("I64", 64), ("U64", 64), ("F64", 64), ("C64", 64)]
ALL, ALL_LEN = {}, 0
for _d, _bits in DTYPES:                    # 8 elements of each dtype, back to back
    ALL["t_" + _d] = t(_d, [2, 4], ALL_LEN, ALL_LEN + _bits)
    ALL_LEN += _bits

ST = {
    "good_empty": st({}, 0),
    "good_meta_only": st({"__metadata__": {"format": "pt"}}, 0),
    "good_basic": st({"__metadata__": {"format": "pt"}, "a.weight": t("BF16", [2, 3], 0, 12),
                      "b.bias": t("F32", [3], 12, 24)}, 24),
    "good_scalar_zero": st({"s": t("F32", [], 0, 4), "z": t("F64", [0, 7], 4, 4), "u": t("U8", [3], 4, 7)}, 7),
    "good_padded": st(b'  {"x":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}      ', 8),
    "good_unaligned": st({"u": t("U8", [3], 0, 3), "b": t("BF16", [2], 3, 7), "f4": t("F4", [4], 7, 9)}, 9),
    "good_mxfp4": st({"m.layers.1.block_sparse_moe.experts.0.w1.weight_packed": t("U8", [4, 16], 0, 64),
                      "m.layers.1.block_sparse_moe.experts.0.w1.weight_scale": t("U8", [4, 1], 64, 68)}, 68),
    "good_unicode": st('{"caf\\u00e9\\ud83d\\ude00":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'.encode(), 1),
    "good_all_dtypes": st(ALL, ALL_LEN),
    "bad_short": b"\x05\0\0",
    "bad_n_huge": st(b"{}", 0, n_override=100000001),
    "bad_n_past_eof": st(b"{}", 0, n_override=64),
    "bad_n_zero": st(b"", 0),
    "bad_not_json": st(b"{abc", 0),
    "bad_not_object": st(b"[1,2]", 0),
    "bad_duplicate": st(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 1),
    "bad_nul_escape": st(b'{"a\\u0000":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 1),
    "bad_raw_nul": st(b"{}\0\0", 0),
    "bad_utf8": st(b'{"\xff":1}', 0),
    "bad_overlong": st(b'{"\xc0\x80":1}', 0),
    "bad_surrogate": st(b'{"\xed\xa0\x80":1}', 0),
    "bad_unknown_dtype": st({"a": t("F7", [1], 0, 1)}, 1),
    "bad_missing_field": st({"a": {"dtype": "U8", "shape": [1]}}, 1),
    "bad_extra_field": st({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": 1}}, 1),
    "bad_negative_dim": st({"a": t("U8", [-1], 0, 1)}, 1),
    "bad_float_dim": st(b'{"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}', 1),
    "bad_huge_dim": st({"a": t("U8", [2 ** 48], 0, 1)}, 1),
    "bad_rank": st({"a": t("U8", [1] * 9, 0, 1)}, 1),
    "bad_numel_overflow": st({"a": t("U8", [2 ** 47, 2 ** 47], 0, 1)}, 1),
    "bad_f4_odd": st({"a": t("F4", [3], 0, 1)}, 1),
    "bad_size": st({"a": t("BF16", [3], 0, 4)}, 4),
    "bad_not_from_zero": st({"a": t("U8", [4], 4, 8)}, 8),
    "bad_gap": st({"a": t("U8", [4], 0, 4), "b": t("U8", [4], 8, 12)}, 12),
    "bad_overlap": st({"a": t("U8", [4], 0, 4), "b": t("U8", [4], 2, 6)}, 6),
    "bad_shared": st({"a": t("U8", [4], 0, 4), "b": t("U8", [4], 0, 4)}, 4),
    "bad_trailing": st({"a": t("U8", [4], 0, 4)}, 5),
    "bad_truncated": st({"a": t("U8", [4], 0, 4)}, 3),
    "bad_meta_value": st({"__metadata__": {"n": 1}}, 0),
    "bad_meta_tensor": st({"__metadata__": t("U8", [1], 0, 1)}, 1),
    "bad_empty_name": st({"": t("U8", [1], 0, 1)}, 1),
    "bad_offsets_shape": st({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0]}}, 1),
    "bad_end_before_begin": st({"a": t("U8", [1], 4, 0)}, 4),
}

JS = {
    "good_header": b'{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]}}',
    "good_index": b'{"metadata":{"total_size":15},"weight_map":{"a":"m-00001-of-00002.safetensors"}}',
    "good_values": b'[1,-0,0.5,1e3,-1.25E-2,9223372036854775807,-9223372036854775808,true,false,null,"\\"\\\\\\/\\b\\f\\n\\r\\t"]',
    "good_unicode": '{"\\u00e9\\ud834\\udd1e":{"":[[],{},[[[]]]]},"caf\u00e9":"\u20ac\U0001F600"}'.encode(),
    "good_scalar": b'  "just a string"  ',
    "good_nested": b'{"a":{"a":{"a":{"b":1,"c":[1,2,{"d":null}]}}}}',
    "bad_dup_escaped": b'{"\\u0061":1,"a":2}',
    "bad_trailing_comma": b'[1,2,]',
    "bad_leading_zero": b'[01]',
    "bad_lone_surrogate": b'["\\udc00"]',
    "bad_nul_after_number": b'[1\0]',
    "bad_big_int": b'[9223372036854775808]',
    "bad_real_overflow": b'[1e999]',
    "bad_control": b'["a\tb"]',
}



# ---------------------------------------------------------------- index.json
# fuzz_index.c's scratch directory: shard 1 holds model.embed_tokens.weight and
# model.norm.weight, shard 2 lm_head.weight (keep in step with SHARD_HDR there).
S1, S2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
GOOD_MAP = {"lm_head.weight": S2, "model.embed_tokens.weight": S1, "model.norm.weight": S1}


def index(wm, meta=None):
    o = {"metadata": {"total_size": 36} if meta is None else meta, "weight_map": wm}
    return json.dumps(o, indent=2).encode() + b"\n"


IX = {
    "good": index(GOOD_MAP),
    "good_file_bytes_total": index(GOOD_MAP, {"total_size": 36 + 2 * 8 + 200}),
    "good_no_metadata": json.dumps({"weight_map": GOOD_MAP}).encode(),
    "good_total_mismatch": index(GOOD_MAP, {"total_size": 99999}),
    "good_total_string": index(GOOD_MAP, {"total_size": "36"}),
    "bad_missing_tensor": index({k: v for k, v in GOOD_MAP.items() if k != "model.norm.weight"}),
    "bad_extra_tensor": index(dict(GOOD_MAP, **{"model.layers.0.mlp.up_proj.weight": S1})),
    "bad_wrong_shard": index(dict(GOOD_MAP, **{"lm_head.weight": S1})),
    "bad_missing_shard": index(dict(GOOD_MAP, **{"lm_head.weight": "model-00003-of-00003.safetensors"})),
    "bad_traversal": index(dict(GOOD_MAP, **{"lm_head.weight": "../" + S2})),
    "bad_absolute": index(dict(GOOD_MAP, **{"lm_head.weight": "/etc/passwd"})),
    "bad_dot": index(dict(GOOD_MAP, **{"lm_head.weight": "."})),
    "bad_value_int": index(dict(GOOD_MAP, **{"lm_head.weight": 2})),
    "bad_empty_map": index({}),
    "bad_map_array": json.dumps({"weight_map": [S1]}).encode(),
    "bad_no_map": json.dumps({"metadata": {"total_size": 36}}).encode(),
    "bad_duplicate_key": b'{"weight_map":{"lm_head.weight":"' + S2.encode() + b'","lm_head.weight":"'
                         + S2.encode() + b'"}}',
    "bad_not_object": b'["weight_map"]',
    "bad_truncated": index(GOOD_MAP)[:40],
}

# ---------------------------------------------------------------- config.json
FIXTURE_CONFIG = os.path.join(TESTS, "data", "kimi-k3-config.json")

FLAT = {"model_type": "kimi_linear", "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 100,
        "intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_token": 2,
        "num_shared_experts": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_attention_heads": 2,
        "num_key_value_heads": 2, "q_lora_rank": None, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4, "v_head_dim": 8, "mla_use_nope": True, "rms_norm_eps": 1e-5,
        "hidden_act": "silu", "tie_word_embeddings": False, "eos_token_id": [7, 8],
        "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4], "num_heads": 2,
                               "head_dim": 8, "short_conv_kernel_size": 4}}


def config_seeds(micro_config):
    with open(FIXTURE_CONFIG, "rb") as f:
        k3 = f.read()
    k3j = json.loads(k3)

    def k3_with(**kv):
        c = copy.deepcopy(k3j)
        for k, v in kv.items():
            if k.startswith("la_"):
                c["text_config"]["linear_attn_config"][k[3:]] = v
            else:
                c["text_config"][k] = v
        return json.dumps(c, indent=2).encode()

    def flat_with(**kv):
        c = dict(FLAT, **kv)
        return json.dumps(c).encode()

    return {
        "good_kimi_k3": k3,                                   # the released config, byte for byte
        "good_micro": json.dumps(micro_config, indent=2).encode(),
        "good_flat": json.dumps(FLAT).encode(),
        "good_flat_no_linear": flat_with(linear_attn_config=None),
        "bad_hidden_2_40": k3_with(hidden_size=2 ** 40),
        "bad_zero_heads": k3_with(num_attention_heads=0),
        "bad_negative_rank": k3_with(kv_lora_rank=-512),
        "bad_layer_out_of_range": k3_with(la_kda_layers=[1, 2, 94]),
        "bad_topk_over_experts": k3_with(num_experts_per_token=897),
        "bad_experts_2m": flat_with(num_experts=2000000),
        "bad_layers_2000": flat_with(num_hidden_layers=2000),
        "bad_eps_zero": flat_with(rms_norm_eps=0),
        "bad_huge_vocab_hidden": flat_with(vocab_size=2147483647, hidden_size=2147483647),
        "bad_text_config_array": b'{"text_config":[1,2]}',
    }

# ------------------------------------------------------------- tiktoken.model


def b64(b):
    return base64.b64encode(b).decode()


def vocab(tokens):
    return "".join("%s %d\n" % (b64(t), r) for r, t in enumerate(tokens)).encode()


BYTES = [bytes([b]) for b in range(256)]
MERGES = [b"th", b"he", b"the", b" t", b" the", b"in", b"er", b"an", b" a", b"on", b"re", b"\xe4\xbd",
          b"\xe4\xbd\xa0", b"  ", b"    ", b"12", b"123", b"\n\n", b"<|", b"|>"]


def tiktoken_seeds():
    good = vocab(BYTES + MERGES)
    lines = good.decode().splitlines(keepends=True)
    return {
        "good_bytes_only": vocab(BYTES),
        "good_merges": good,
        "good_crlf": good.replace(b"\n", b"\r\n"),
        "good_shuffled": "".join(lines[::-1]).encode(),
        "bad_duplicate_rank": good + ("%s %d\n" % (b64(b"xyz"), 3)).encode(),
        "bad_duplicate_token": good + ("%s %d\n" % (b64(b"the"), len(lines))).encode(),
        "bad_rank_gap": good + ("%s %d\n" % (b64(b"xyz"), len(lines) + 5)).encode(),
        "bad_missing_byte": vocab(BYTES[:200] + MERGES),
        "bad_base64": good + b"@@@@ 276\n",
        "bad_padding_bits": good + b"YR== 276\n",
        "bad_two_spaces": good + ("%s  %d\n" % (b64(b"xyz"), len(lines))).encode(),
        "bad_negative_rank": good + ("%s -1\n" % b64(b"xyz")).encode(),
        "bad_empty_token": good + (" %d\n" % len(lines)).encode(),
        "bad_huge_rank": good + ("%s 99999999999\n" % b64(b"xyz")).encode(),
    }

# ------------------------------------------------------- tokenizer_config.json
FIXTURE_TOKCFG = os.path.join(TESTS, "tokenizer", "data", "kimi-k3-tokenizer_config.json")
TEST_RANKS = 3840                       # tests/reference/data/tiktoken.model


def shifted_tokcfg(base):
    """K3's released tokenizer_config.json with its added tokens moved from 163584.. to 3840.."""
    with open(FIXTURE_TOKCFG, "rb") as f:
        c = json.loads(f.read())
    c["added_tokens_decoder"] = {str(int(k) - 163584 + base): v for k, v in c["added_tokens_decoder"].items()}
    return (json.dumps(c, indent=2, ensure_ascii=False) + "\n").encode()


def tokcfg_seeds():
    with open(FIXTURE_TOKCFG, "rb") as f:
        released = f.read()
    good = shifted_tokcfg(TEST_RANKS)
    gj = json.loads(good)

    def variant(fn):
        c = copy.deepcopy(gj)
        fn(c["added_tokens_decoder"])
        return json.dumps(c).encode()

    ent = {"content": "[X]", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
           "special": True}
    return {
        "good_k3_ids_3840": good,
        "good_no_added_tokens": b'{"tokenizer_class": "TikTokenTokenizer"}',
        "bad_released_ids_163584": released,          # right for K3's vocabulary, not for the test one
        "bad_collides_with_rank": variant(lambda a: a.update({"100": ent})),
        "bad_past_special_range": variant(lambda a: a.update({"4096": ent})),
        "bad_duplicate_name": variant(lambda a: a.update({"3900": dict(ent, content="[BOS]")})),
        "bad_leading_zero_id": variant(lambda a: a.update({"03900": ent})),
        "bad_empty_content": variant(lambda a: a.update({"3900": dict(ent, content="")})),
        "bad_special_string": variant(lambda a: a.update({"3900": dict(ent, special="yes")})),
        "bad_decoder_array": b'{"added_tokens_decoder": []}',
        "bad_duplicate_key": b'{"added_tokens_decoder": {}, "added_tokens_decoder": {}}',
    }

# --------------------------------------------------------------- tokenize text
TEXTS = {
    "ascii": b"The quick brown fox jumps over the lazy dog. Once upon a time, 12345 + 678 = 13023!\n",
    "multilingual": "你好，世界。こんにちは 안녕하세요 Привет мир Γειά σου café naïve Tiếng Việt مرحبا नमस्ते שלום 😀👍🏽".encode(),
    "code": b"def f(x):\n    return x ** 2  # square\n\n\tint main(void) { return 0; }\r\n",
    "whitespace_runs": b" " * 300 + b"x" + b"\t" * 50 + b"\n" * 20 + b"\r\n \r\n",
    "specials": b"[BOS]<|open|>user<|sep|>Hi<|close|><|end_of_msg|>[EOT][PAD]<|reserved_token_3900|><|media_pad",
    "invalid_utf8": b"ok \xff\xfe \xc0\x80 \xed\xa0\x80 \xf4\x90\x80\x80 \xe4\xbd end \x80",
    "nul": b"a\x00b\x00\x00 c\x00",
    "digits_long": b"3141592653589793238462643383279502884197169399375105820974944592307816406286" * 3,
    "contractions": b"I'm sure they'll say it's what we'd've DONE'S \xe2\x80\x99re",
}

# ------------------------------------------------------------- micro checkpoint
REF = os.path.join(TESTS, "reference")
MICRO = dict(cfg=dict(hidden_size=16, num_hidden_layers=2, intermediate_size=32, moe_intermediate_size=32,
                      routed_expert_hidden_size=32, num_experts=4, num_experts_per_token=2,
                      num_attention_heads=1, num_key_value_heads=1, q_lora_rank=16, kv_lora_rank=16,
                      qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, attn_res_block_size=1,
                      max_position_embeddings=64, kda_heads=1, kda_head_dim=16),
             shards=2, vision_hidden=4, router="continuous")


def make_micro(out):
    """A 2-layer checkpoint in K3's exact layout (KDA + dense, MLA + 4 MXFP4 experts) with a
    256-rank vocabulary (512 ids), through tests/reference/make_checkpoint.py."""
    sys.path.insert(0, REF)
    import make_checkpoint as mc                # noqa: E402 (tests/reference is not a package)
    mc.PRESETS["micro"] = MICRO
    vocab_path = os.path.join(out + ".vocab")
    with open(vocab_path, "wb") as f:
        f.write(vocab(BYTES))
    mc.make_checkpoint("micro", 1, out, tiktoken_model=vocab_path)
    os.remove(vocab_path)
    with open(os.path.join(out, "config.json")) as f:
        return json.load(f)


def tar_of(ck, names):
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for n in names:
            ti = t.gettarinfo(os.path.join(ck, n), arcname=n)
            ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "", ""
            with open(os.path.join(ck, n), "rb") as f:
                t.addfile(ti, f)
    return bio.getvalue()


def archive_seeds(ck):
    files = sorted(os.listdir(ck))
    first = ["config.json"] + [f for f in files if f != "config.json"]
    plain = tar_of(ck, first)
    import gzip
    gz = gzip.compress(plain, 9, mtime=0)
    zst = subprocess.run(["zstd", "-19", "-q", "-c"], input=plain, stdout=subprocess.PIPE, check=True).stdout
    weights_first = tar_of(ck, ["model-00002-of-00002.safetensors", "config.json"])
    no_shards = tar_of(ck, [f for f in first if not f.endswith(".safetensors")])
    return {
        "good_micro.tar": plain,
        "good_micro.tar.gz": gz,
        "good_micro.tar.zst": zst,
        "bad_weights_before_config.tar": weights_first,
        "bad_missing_shards.tar": no_shards,
        "bad_truncated.tar": plain[:24 * 1024],
        "bad_truncated.tar.zst": zst[:8 * 1024],
        "bad_config_only.tar": tar_of(ck, ["config.json"]),
    }

# ------------------------------------------------------- the micro pack's files


def pack_seeds(k3pack, ck):
    out = ck + ".k3pack"
    subprocess.run([k3pack, "-q", ck, "-o", out], check=True, env=dict(os.environ, K3_NO_PROGRESS="1"))
    with open(os.path.join(out, "manifest.json"), "rb") as f:
        man = f.read()
    mj = json.loads(man)
    shard, expert = {}, {}
    for s in sorted(os.listdir(out)):
        if not s.endswith(".k3s"):
            continue
        with open(os.path.join(out, s), "rb") as f:
            img = f.read()
        data_offset = struct.unpack_from("<Q", img, 40)[0]
        kind = struct.unpack_from("<I", img, 16)[0]
        name = "good_" + s[:-4].replace(".", "_") + ".k3s"
        (expert if kind == 2 else shard)[name] = img[:data_offset]
    # two header images of each kind for shard_header, the expert ones for expert_layout
    keep = sorted(shard)[:2] + sorted(expert)[:1]
    sh = {k: (shard.get(k) or expert[k]) for k in keep}

    def man_with(fn):
        m = copy.deepcopy(mj)
        fn(m)
        return (json.dumps(m, indent=1) + "\n").encode()

    def first_expert(m):
        return m["expert_layers"][0]

    mf = {
        "good_micro.json": man,
        "bad_offsets_overlap.json": man_with(lambda m: m["tensors"][2].update(offset=m["tensors"][1]["offset"])),
        "bad_offset_past_end.json": man_with(lambda m: m["tensors"][0].update(offset=2 ** 62)),
        "bad_size_shape.json": man_with(lambda m: m["tensors"][0].update(size=m["tensors"][0]["size"] + 1)),
        "bad_unknown_shard.json": man_with(lambda m: m["tensors"][0].update(shard="nope.k3s")),
        "bad_record_count.json": man_with(lambda m: first_expert(m).update(count=first_expert(m)["count"] + 1)),
        "bad_parts_empty.json": man_with(lambda m: first_expert(m).update(parts=[])),
        "bad_version_2.json": man_with(lambda m: m.update(format_version=2)),
        "bad_pad_doken_id.json": man.replace(b"pad_token_id", b"pad_doken_id", 1),
    }
    shutil.rmtree(out)
    return mf, sh, expert


def write_corpus(sub, cases, ext=""):
    d = os.path.join(ROOT, sub)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        if f.startswith("seed_"):
            os.remove(os.path.join(d, f))
    for name, data in cases.items():
        with open(os.path.join(d, "seed_" + name + ext), "wb") as f:
            f.write(data)
    print("%s: %d seeds, %d bytes" % (d, len(cases), sum(len(v) for v in cases.values())))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k3pack", help="a built k3pack: also write the manifest, shard and expert corpora")
    a = ap.parse_args()
    write_corpus("safetensors_header", ST, ".st")
    write_corpus("json", JS, ".json")
    write_corpus("index", IX, ".json")
    write_corpus("tiktoken", tiktoken_seeds(), ".model")
    write_corpus("tokenizer_config", tokcfg_seeds(), ".json")
    write_corpus("tokenize", TEXTS, ".txt")
    data = os.path.join(TESTS, "fuzz", "data")
    os.makedirs(data, exist_ok=True)
    with open(os.path.join(data, "tokenizer_config.json"), "wb") as f:
        f.write(shifted_tokcfg(TEST_RANKS))
    tmp = tempfile.mkdtemp(prefix="k3fuzzcorpus.")
    try:
        ck = os.path.join(tmp, "micro")
        micro_config = make_micro(ck)
        write_corpus("config", config_seeds(micro_config), ".json")
        write_corpus("archive", archive_seeds(ck))
        if a.k3pack:
            mf, sh, ex = pack_seeds(os.path.abspath(a.k3pack), ck)
            write_corpus("manifest", mf)
            write_corpus("shard_header", sh)
            write_corpus("expert_layout", ex)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()

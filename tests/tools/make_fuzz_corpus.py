"""Write the seed corpora of tests/fuzz (run from anywhere; rewrites the seed_* files):

  tests/fuzz/corpus/safetensors_header/seed_*.st   whole small safetensors files, good and bad
  tests/fuzz/corpus/json/seed_*.json               JSON documents, good and bad

Findings of fuzzing runs are added next to them as crash_* / finding_* files by hand.
"""
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "corpus")


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


def main():
    for sub, cases, ext in (("safetensors_header", ST, ".st"), ("json", JS, ".json")):
        d = os.path.join(ROOT, sub)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            if f.startswith("seed_"):
                os.remove(os.path.join(d, f))
        for name, data in cases.items():
            with open(os.path.join(d, "seed_" + name + ext), "wb") as f:
                f.write(data)
        print("%s: %d seeds" % (d, len(cases)))


if __name__ == "__main__":
    main()

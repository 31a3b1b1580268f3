#!/usr/bin/env python3
"""Independent reader of a k3 pack, written from docs/FORMAT.md alone (no k3 code).

    check_pack.py PACK CHECKPOINT_DIR
    check_pack.py --seal MANIFEST      rewrite an edited manifest.json with its checksum (for tests)

Checks that the pack is exactly the checkpoint re-laid out:
  * manifest.json ends with its own checksum (FORMAT.md 5.1), format version 2;
  * every shard header field and rule of FORMAT.md section 2, header_hash, file size;
  * manifest hashes (XXH3-128 of shards and files, XXH3-64 of tensors and records);
  * every trunk tensor's bytes equal the checkpoint tensor's bytes (bit-exact);
  * every expert part equals the checkpoint's weight_packed / weight_scale bytes,
    or, for experts quantized by k3pack, mxfp4.quantize() of the checkpoint's BF16
    (the NumPy reference in tests/reference), bit for bit;
  * vision tensors are listed as skipped, nothing else is missing;
  * version 3 (FORMAT.md 10, k3pack --experts-in-place): the `checkpoint` link leads to
    CHECKPOINT_DIR, every checkpoint_files entry's size and header hash, every in-place
    record's bytes in its file and hash, each part equal to the checkpoint tensor, and the
    pack's experts-copied.safetensors a valid safetensors file holding exactly the copied
    records' tensors under their checkpoint names.
Exit 0 when all holds, 1 with a message otherwise.
"""
import json
import os
import struct
import sys

import numpy as np
import xxhash

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import mxfp4  # noqa: E402
import trunk_quant  # noqa: E402
from safetensors_io import ModelDir, SafetensorsFile  # noqa: E402

ENC = {1: ("BF16", 16), 2: ("F16", 16), 3: ("F32", 32), 4: ("F64", 64), 5: ("U8", 8), 6: ("I8", 8),
       7: ("I16", 16), 8: ("I32", 32), 9: ("I64", 64), 10: ("MXFP4", 4), 11: ("E8M0", 8), 12: ("Q8", 8)}


class Bad(Exception):
    pass


def need(cond, msg):
    if not cond:
        raise Bad(msg)


def read_shard(path):
    """Parse a .k3s header per FORMAT.md 2.1-2.2; returns (fields, entries, raw bytes)."""
    data = open(path, "rb").read()
    need(len(data) >= 128 and data[:8] == b"K3SHARD\0", "%s: bad magic" % path)
    (ver, bom, kind, align, layer, n_ent, names_size, data_off, fsize, n_rec, rec_size,
     stride) = struct.unpack_from("<IIIIII QQQQQQ".replace(" ", ""), data, 8)
    need(ver == 2 and bom == 0x01020304 and kind in (1, 2), "%s: version/byte order/kind" % path)
    need(data[80:120] == bytes(40), "%s: reserved bytes" % path)
    (hh,) = struct.unpack_from("<Q", data, 120)
    need(fsize == len(data), "%s: file_size %d, file has %d" % (path, fsize, len(data)))
    hdr_end = 128 + 64 * n_ent + names_size
    need(data_off == (hdr_end + align - 1) // align * align, "%s: data_offset" % path)
    img = bytearray(data[:data_off])
    img[120:128] = bytes(8)
    need(xxhash.xxh3_64_intdigest(bytes(img)) == hh, "%s: header_hash" % path)
    need(data[hdr_end:data_off] == bytes(data_off - hdr_end), "%s: header padding" % path)
    names = data[128 + 64 * n_ent:hdr_end]
    entries = []
    for i in range(n_ent):
        off, size, no, nl, enc, nd = struct.unpack_from("<QQIIBB", data, 128 + 64 * i)
        shape = list(struct.unpack_from("<4Q", data, 128 + 64 * i + 32))
        need(data[128 + 64 * i + 26:128 + 64 * i + 32] == bytes(6), "%s: entry reserved" % path)
        need(nd <= 4 and all(s == 0 for s in shape[nd:]), "%s: shape slots" % path)
        need(enc in ENC, "%s: encoding %d" % (path, enc))
        bits = int(np.prod(shape[:nd], dtype=np.int64)) * ENC[enc][1]
        need(bits % 8 == 0 and bits // 8 == size, "%s: entry %d size" % (path, i))
        entries.append(dict(name=names[no:no + nl].decode("utf-8"), offset=off, size=size,
                            encoding=ENC[enc][0], shape=shape[:nd]))
    offs = [e["offset"] for e in entries]
    need(offs == sorted(offs), "%s: entries not listed in offset order" % path)
    need(kind == 1 or not entries or offs[0] == 0, "%s: the first record part is not at offset 0" % path)
    f = dict(kind=kind, align=align, layer=layer, data_offset=data_off, n_records=n_rec,
             record_size=rec_size, stride=stride, header_hash=hh)
    return f, entries, data


SUM_MEMBER = b'"manifest_xxh3_64": "'     # FORMAT.md 5.1: then 16 hex digits, '"', newline, '}', newline


def check_manifest_sum(data, what="manifest.json"):
    """The manifest's checksum of itself: XXH3-64 of every byte before its 16 digits."""
    need(len(data) >= 41 and data[-4:] == b'"\n}\n' and data[-41:-20] == SUM_MEMBER,
         "%s: does not end with its checksum member" % what)
    digits = data[-20:-4].decode("ascii", "replace")
    need(all(c in "0123456789abcdef" for c in digits), "%s: checksum digits %r" % (what, digits))
    need(xxhash.xxh3_64_hexdigest(data[:-20]) == digits,
         "%s: checksum %s, its content hashes to %s" % (what, digits, xxhash.xxh3_64_hexdigest(data[:-20])))


def seal(obj):
    """manifest.json bytes for the object obj (any key order; "manifest_xxh3_64" replaced), sealed."""
    obj = {k: v for k, v in obj.items() if k != "manifest_xxh3_64"}
    body = json.dumps(obj, indent=1, ensure_ascii=False).encode("utf-8")
    assert body.endswith(b"\n}")
    text = body[:-2] + (b",\n " if obj else b"\n ") + SUM_MEMBER
    return text + xxhash.xxh3_64_hexdigest(text).encode() + b'"\n}\n'


def covered_zero(data, spans, start, end, what):
    """Bytes of [start, end) outside spans must be zero."""
    pos = start
    for b, e in sorted(spans):
        need(b >= pos, "%s: overlapping spans at %d" % (what, b))
        need(data[pos:b] == bytes(b - pos), "%s: non-zero padding in [%d, %d)" % (what, pos, b))
        pos = e
    need(data[pos:end] == bytes(end - pos), "%s: non-zero padding at the end" % what)


def check_in_place(pack, ckpt_dir, m, ck, prefix, listed):
    """Version 3: the in-place expert layers; returns the checkpoint tensors they account for."""
    link = os.path.join(pack, "checkpoint")
    need(os.path.islink(link) and os.path.isabs(os.readlink(link)), "checkpoint: not an absolute symbolic link")
    need(os.path.realpath(link) == os.path.realpath(ckpt_dir), "checkpoint link leads elsewhere")
    listed.add("checkpoint")
    files, copied = [], None
    names = [f["name"] for f in m["checkpoint_files"]]
    ck_names = [n for f, n in zip(m["checkpoint_files"], names) if not f.get("in_pack")]
    need(ck_names == sorted(ck_names) and len(set(names)) == len(names), "checkpoint_files: order or duplicates")
    for f in m["checkpoint_files"]:
        path = os.path.join(pack if f.get("in_pack") else link, f["name"])
        data = open(path, "rb").read()
        n = struct.unpack("<Q", data[:8])[0]
        need(len(data) == f["size"] and f["header_size"] == 8 + n, "%s: size or header_size" % f["name"])
        need(xxhash.xxh3_128_hexdigest(data[:8 + n]) == f["header_xxh3_128"], "%s: header hash" % f["name"])
        if f.get("in_pack"):
            need(f["name"] == "experts-copied.safetensors" and f is m["checkpoint_files"][-1], "in_pack file")
            listed.add(f["name"])
            copied = SafetensorsFile(path)
        files.append(data)
    seen, in_copy = set(), set()
    for x in m["expert_layers"]:
        if "shard" in x:
            continue
        need(x["source"] == "checkpoint" and len(x["records"]) == x["count"] == len(x["xxh3_64"]), "layer %d" % x["layer"])
        offs = [p["offset"] for p in x["parts"]]
        need(offs == sorted(offs) and sum(p["size"] for p in x["parts"]) == x["record_size"], "layer %d parts" % x["layer"])
        for p, q in zip(x["parts"], x["parts"][1:]):
            need(p["offset"] + p["size"] == q["offset"], "layer %d: parts not adjacent" % x["layer"])
        for e, (fi, off) in enumerate(x["records"]):
            f = m["checkpoint_files"][fi]
            need(off >= f["header_size"] and off + x["record_size"] <= f["size"], "layer %d expert %d range" % (x["layer"], e))
            rec = files[fi][off:off + x["record_size"]]
            need(xxhash.xxh3_64_hexdigest(rec) == x["xxh3_64"][e], "layer %d expert %d hash" % (x["layer"], e))
            stem = "%smodel.layers.%d.block_sparse_moe.experts.%d." % (prefix, x["layer"], e)
            for p in x["parts"]:
                src = stem + p["name"]
                want = ck.get(src).tobytes()
                need(rec[p["offset"]:p["offset"] + p["size"]] == want, "layer %d expert %d part %s" % (x["layer"], e, src))
                need(ck.dtype(src) == {"MXFP4": "U8", "E8M0": "U8"}.get(p["encoding"], p["encoding"]), "dtype of %s" % src)
                if f.get("in_pack"):
                    in_copy.add(src)
                    need(copied.get(src).tobytes() == want, "experts-copied.safetensors: %s" % src)
                seen.add(src)
    if copied is not None:
        extra = {n for n in copied.names if not n.startswith("k3pack.pad.")} - in_copy
        need(not extra, "experts-copied.safetensors holds tensors no record uses: %s" % sorted(extra)[:3])
        copied.close()
    return seen


def main(pack, ckpt_dir):
    raw = open(os.path.join(pack, "manifest.json"), "rb").read()
    check_manifest_sum(raw)
    m = json.loads(raw)
    need(m["format"] == "k3-pack" and m["format_version"] in (2, 3) and m["byte_order"] == "little", "manifest header")
    v3 = m["format_version"] == 3
    need(v3 or "checkpoint_files" not in m, "checkpoint_files only in version 3")
    need(v3 or "trunk" not in m, "a compact trunk only in version 3")
    ck = ModelDir(ckpt_dir)
    prefix = m["name_prefix"]
    quantized = m["experts"]["source"] == "quantized"
    listed = {"manifest.json"}
    for f in m["files"]:
        data = open(os.path.join(pack, f["name"]), "rb").read()
        need(len(data) == f["size"] and xxhash.xxh3_128_hexdigest(data) == f["xxh3_128"], "file %s" % f["name"])
        need(data == open(os.path.join(ckpt_dir, f["name"]), "rb").read(), "file %s differs from the checkpoint" % f["name"])
        listed.add(f["name"])
    tensors_by_shard = {}
    for t in m["tensors"]:
        tensors_by_shard.setdefault(t["shard"], []).append(t)
    xl_by_shard = {x["shard"]: x for x in m["expert_layers"] if "shard" in x}
    seen = set()
    if "checkpoint_files" in m:
        seen |= check_in_place(pack, ckpt_dir, m, ck, prefix, listed)
    for s in m["shards"]:
        path = os.path.join(pack, s["name"])
        listed.add(s["name"])
        f, entries, data = read_shard(path)
        need(len(data) == s["size"] and xxhash.xxh3_128_hexdigest(data) == s["xxh3_128"], "%s: shard hash" % s["name"])
        need("%016x" % f["header_hash"] == s["header_hash"], "%s: header_hash vs manifest" % s["name"])
        if f["kind"] == 1:
            mt = {t["name"]: t for t in tensors_by_shard.get(s["name"], [])}
            need(len(mt) == len(entries), "%s: manifest lists %d tensors, header %d" % (s["name"], len(mt), len(entries)))
            spans = []
            for e in entries:
                t = mt[e["name"]]
                need((t["offset"], t["size"], t["encoding"], t["shape"]) == (e["offset"], e["size"], e["encoding"], e["shape"]),
                     "%s: %s differs from the manifest" % (s["name"], e["name"]))
                need(e["offset"] % f["align"] == 0, "%s: %s unaligned" % (s["name"], e["name"]))
                b = data[e["offset"]:e["offset"] + e["size"]]
                need(xxhash.xxh3_64_hexdigest(b) == t["xxh3_64"], "%s: %s hash" % (s["name"], e["name"]))
                spans.append((e["offset"], e["offset"] + e["size"]))
                if e["encoding"] == "Q8" or e["name"].endswith("_scale") and e["name"][:-6] in mt:
                    # the compact trunk (FORMAT.md 3): codes and scales of trunk_quant.py's rule
                    need(m.get("trunk", {}).get("encoding") == "Q8", "%s: Q8 without 'trunk'" % e["name"])
                    base = e["name"] if e["encoding"] == "Q8" else e["name"][:-6]
                    src = prefix + base
                    x = ck.get_f32(src)
                    need(trunk_quant.quantizable(src, ck.dtype(src), list(ck.shape(src)), 32), "%s: not eligible" % src)
                    q, sc = trunk_quant.quantize(x, 8, 32)
                    want = q.tobytes() if e["encoding"] == "Q8" else sc.tobytes()
                    need(b == want, "%s: %s differs from trunk_quant.py's" % (s["name"], e["name"]))
                    seen.add(src)
                    continue
                src = prefix + e["name"]
                need(src in ck, "%s: %s not in the checkpoint" % (s["name"], src))
                need(ck.get(src).tobytes() == b, "%s: %s bytes differ from the checkpoint" % (s["name"], src))
                need(ck.dtype(src) == e["encoding"], "%s: %s dtype" % (s["name"], src))
                seen.add(src)
            covered_zero(data, spans, f["data_offset"], len(data), s["name"])
        else:
            x = xl_by_shard[s["name"]]
            need(x["count"] == f["n_records"] and x["offset"] == f["data_offset"] and x["stride"] == f["stride"]
                 and x["record_size"] == f["record_size"], "%s: record geometry vs manifest" % s["name"])
            need(len(data) == f["data_offset"] + f["n_records"] * f["stride"], "%s: size" % s["name"])
            L = f["layer"]
            for e in range(f["n_records"]):
                base = f["data_offset"] + e * f["stride"]
                rec = data[base:base + f["record_size"]]
                need(xxhash.xxh3_64_hexdigest(rec) == x["xxh3_64"][e], "%s: expert %d hash" % (s["name"], e))
                covered_zero(data, [(base + p["offset"], base + p["offset"] + p["size"]) for p in entries],
                             base, base + f["stride"], "%s expert %d" % (s["name"], e))
                stem = "%smodel.layers.%d.block_sparse_moe.experts.%d." % (prefix, L, e)
                for p in entries:
                    got = rec[p["offset"]:p["offset"] + p["size"]]
                    w = p["name"][:2]
                    if quantized:
                        src = stem + w + ".weight"
                        packed, scales = mxfp4.quantize(ck.get_f32(src))
                        want = (packed if p["encoding"] == "MXFP4" else scales).tobytes()
                    else:
                        src = stem + p["name"]
                        want = ck.get(src).tobytes()
                    need(got == want, "%s: expert %d part %s differs from %s" % (s["name"], e, p["name"], src))
                    seen.add(src)
    skipped = {k["name"] for k in m["skipped"]}
    rest = set(ck.names) - seen
    need(rest == skipped, "checkpoint tensors neither packed nor skipped: %s" % sorted(rest - skipped)[:5])
    need(all(n.startswith(("vision_tower.", "mm_projector.")) for n in skipped), "non-vision tensor skipped")
    extra = set(os.listdir(pack)) - listed
    need(not extra, "unlisted files in the pack: %s" % sorted(extra))
    print("pack OK: %d shards, %d trunk tensors, %d expert layers, %d skipped, experts %s%s" % (
        len(m["shards"]), len(m["tensors"]), len(m["expert_layers"]), len(skipped), m["experts"]["encoding"],
        " (quantized)" if quantized else ""))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--seal":
        with open(sys.argv[2], "rb") as f:
            sealed = seal(json.load(f))
        with open(sys.argv[2], "wb") as f:
            f.write(sealed)
        sys.exit(0)
    if len(sys.argv) != 3:
        sys.exit("usage: check_pack.py PACK CHECKPOINT_DIR")
    try:
        main(sys.argv[1], sys.argv[2])
    except Bad as e:
        print("check_pack: %s" % e, file=sys.stderr)
        sys.exit(1)

#!/usr/bin/python3
"""Independent writer of a version-3 in-place pack (docs/FORMAT.md section 10), no k3 code.

    make_in_place.py --checkpoint CKPT_DIR --pack V2_PACK --out NEW_DIR [--copy] [--no-byte-check]

From a safetensors checkpoint directory and a version-2 pack k3pack made from it, write into
NEW_DIR (which must not exist, or be empty) the pack `k3pack --experts-in-place` is specified to
make: the trunk shards, the tokenizer files and the expert shards of the layers that stay in
shards (hard links to V2_PACK's files, or copies with --copy or across file systems); a symbolic
link `checkpoint` to the checkpoint directory (absolute); experts-copied.safetensors with the
records that cannot stay in place; and manifest.json:

  * the version-2 manifest's JSON with "format_version": 3;
  * "checkpoint_files" right after "files": the checkpoint's files holding at least one record, in
    name order, {"name", "size", "header_size" = 8 + N, "header_xxh3_128"}, then the copy file
    with "in_pack": true if there is one;
  * every expert layer with at least one record that can be read in place (the rules of section
    10: its tensors in one file, covering one range exactly, each at a multiple of its element
    size; the first such record sets the layer's layout; the others are copied) rewritten as
    {"layer", "source": "checkpoint", "count", "record_size", "parts" (the version-2 parts at their
    offsets in the in-place record, in offset order), "records": [[file, offset], ...], "xxh3_64"},
    and its experts-layer shard removed from "shards" (and not linked); a layer with no such
    record, or whose experts k3pack converted (quantized), stays in its shard;
  * serialised as jansson does (json_dumps with JSON_INDENT(1) | JSON_PRESERVE_ORDER, then "\\n":
    UTF-8 raw, "/" not escaped, control characters as \\uXXXX, reals as %.17g without exponent
    zeros), sealed with its checksum (FORMAT.md 5.1).

The copy file's header has details section 10 leaves open (its __metadata__, the order of the
tensors and of their keys, compact JSON); they follow k3pack (plan_copies below says which), so
the copy file's header hash and size, and the copied records' offsets, are only as independent
as that.

Before writing, the version-2 manifest is re-serialised and must come out byte for byte (a check
of the serialiser on the input). Unless --no-byte-check, every part of every in-place record (in
the checkpoint or in the copy file) is compared with the same part in the version-2 expert shard
(the pack was made from this checkpoint). When no layer can be in place, NEW_DIR gets the
version-2 pack unchanged and no link (section 6: k3pack writes version 3 only for a pack that
reads in place).

Prints a JSON summary on stdout: in-place layers, layers left in shards and copied records with
the reason, checkpoint files, the manifest's checksum. Exit 0 on success, 1 on bad input (with a
message on stderr).
"""
import argparse
import json
import os
import shutil
import struct
import sys

import xxhash

SUM_KEY = "manifest_xxh3_64"
SUM_MEMBER = b'"manifest_xxh3_64": "'
ST_INDEX = "model.safetensors.index.json"
LINK = "checkpoint"
COPIED_NAME = "experts-copied.safetensors"
COPIED_META = "expert records copied for --experts-in-place (docs/FORMAT.md 10)"   # as k3pack writes it
# bytes per element of a safetensors dtype, for the "starts at a multiple of its element size" rule
ST_ELEM = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "F8_E4M3FNUZ": 1,
           "F8_E5M2FNUZ": 1, "F4": 1, "F6_E2M3": 1, "F6_E3M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
           "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}
# the checkpoint dtypes whose bytes a pack part of this encoding keeps unchanged
SAME_BYTES = {"MXFP4": ("U8", "I8", "F4"), "E8M0": ("U8", "F8_E8M0"), "BF16": ("BF16",), "F16": ("F16",),
              "F32": ("F32",), "U8": ("U8",)}


class Bad(Exception):
    pass


def need(cond, msg):
    if not cond:
        raise Bad(msg)


# ------------------------------------------------------------------ jansson's serialiser

def _dup_check(pairs):
    d = {}
    for k, v in pairs:
        need(k not in d, "duplicate key %r" % k)
        d[k] = v
    return d


def _jstr(s):
    """A string as jansson's dump_string writes it without JSON_ENSURE_ASCII / JSON_ESCAPE_SLASH."""
    out = ['"']
    for ch in s:
        c = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif c < 0x20:
            out.append({8: "\\b", 12: "\\f", 10: "\\n", 13: "\\r", 9: "\\t"}.get(c, "\\u%04X" % c))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _jreal(x):
    """jansson's jsonp_dtostr with precision 17: %.17g, a ".0" when it reads as an integer, the
    exponent without "+" and without leading zeros."""
    need(x == x and x not in (float("inf"), float("-inf")), "a real that is not finite")
    s = "%.17g" % x
    if "." not in s and "e" not in s:
        s += ".0"
    i = s.find("e")
    if i >= 0:
        mant, exp = s[:i + 1], s[i + 1:]
        sign = "-" if exp.startswith("-") else ""
        digits = exp.lstrip("+-").lstrip("0")
        s = mant + sign + digits
    return s


def _jdump(v, depth, out, compact=False):
    if v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, int):
        need(-(1 << 63) <= v < (1 << 63), "an integer outside int64")
        out.append(str(v))
    elif isinstance(v, float):
        out.append(_jreal(v))
    elif isinstance(v, str):
        out.append(_jstr(v))
    elif isinstance(v, (list, dict)):
        items = list(v.items()) if isinstance(v, dict) else list(v)
        o, c = "{}" if isinstance(v, dict) else "[]"
        if not items:
            out.append(o + c)
            return
        nl, end = ("", "") if compact else ("\n" + " " * (depth + 1), "\n" + " " * depth)
        out.append(o + nl)
        for i, x in enumerate(items):
            if isinstance(v, dict):
                out.append(_jstr(x[0]) + (":" if compact else ": "))
                x = x[1]
            _jdump(x, depth + 1, out, compact)
            out.append("," + nl if i < len(items) - 1 else end)
        out.append(c)
    else:
        raise Bad("cannot serialise %r" % type(v))


def jansson_dumps(obj, compact=False):
    """json_dumps(obj, JSON_INDENT(1) | JSON_PRESERVE_ORDER) as UTF-8 bytes (no trailing newline);
    compact: JSON_COMPACT | JSON_PRESERVE_ORDER."""
    out = []
    _jdump(obj, 0, out, compact)
    return "".join(out).encode("utf-8")


def seal(obj):
    """manifest.json bytes of obj, whose last key must be manifest_xxh3_64 (FORMAT.md 5.1)."""
    need(list(obj)[-1] == SUM_KEY, "the checksum member is not last")
    text = jansson_dumps(obj) + b"\n"
    need(text[-41:-20] == SUM_MEMBER and text[-4:] == b'"\n}\n', "the manifest does not end with its checksum")
    return text[:-20] + xxhash.xxh3_64_hexdigest(text[:-20]).encode() + text[-4:]


def load_manifest(path):
    raw = open(path, "rb").read()
    need(len(raw) >= 41 and raw[-4:] == b'"\n}\n' and raw[-41:-20] == SUM_MEMBER,
         "%s: does not end with its checksum member" % path)
    need(xxhash.xxh3_64_hexdigest(raw[:-20]).encode() == raw[-20:-4], "%s: checksum mismatch" % path)
    m = json.loads(raw.decode("utf-8"), object_pairs_hook=_dup_check)
    need(m.get("format") == "k3-pack" and m.get("format_version") == 2,
         "%s: not a version-2 k3 pack manifest (format_version %r)" % (path, m.get("format_version")))
    need(seal(m) == raw, "%s: re-serialised, the manifest differs from the file: this serialiser is not "
         "jansson's for this input" % path)
    return m


def self_test(n, seed=5):
    """The serialiser against the system's libjansson (ctypes), on n random documents: strings
    with control, quote, slash, non-ASCII and non-BMP characters, reals from 5e-324 to 1.8e308,
    int64 extremes, nesting; indented and compact. Returns the number of differences, or None
    without libjansson."""
    import ctypes
    import ctypes.util
    import random
    name = ctypes.util.find_library("jansson") or "libjansson.so.4"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    lib.json_loads.restype = ctypes.c_void_p
    lib.json_loads.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p]
    lib.json_dumps.restype = ctypes.c_void_p
    lib.json_dumps.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.json_delete.argtypes = [ctypes.c_void_p]
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [ctypes.c_void_p]
    err = ctypes.create_string_buffer(512)              # [512] json_error_t and more
    rnd = random.Random(seed)
    chars = [1, 8, 9, 10, 12, 13, 31, 32, 34, 47, 92, 65, 127, 128, 159, 233, 0x2028, 0xfeff, 0xffff, 0x1F600, 0x10FFFF]

    def rstr():
        return "".join(chr(rnd.choice(chars)) for _ in range(rnd.randint(0, 6)))

    def rval(d=0):
        r = rnd.random()
        if d > 3 or r < 0.3:
            return rnd.choice([None, True, False, rnd.randint(-2**63, 2**63 - 1), rnd.randint(-5, 5), rstr(),
                               rnd.choice([0.0, -0.0, 1.0, -5.0, 1e-5, 3e-05, 1e16, 1e17, 1e20, 0.1, 1 / 3, 5e-324,
                                           1.7976931348623157e308, rnd.uniform(-1e6, 1e6),
                                           rnd.random() * 10 ** rnd.randint(-30, 30)])])
        if r < 0.65:
            return [rval(d + 1) for _ in range(rnd.randint(0, 4))]
        return {rstr(): rval(d + 1) for _ in range(rnd.randint(0, 4))}

    bad = 0
    for i in range(n):
        v = rval()
        v = v if isinstance(v, (dict, list)) else [v]
        text = json.dumps(v, ensure_ascii=True).encode()
        for compact in (False, True):
            j = lib.json_loads(text, 0, err)
            need(j, "libjansson refuses %r" % text[:80])
            sp = lib.json_dumps(j, 0x20 | 0x100 if compact else 1 | 0x100)   # JSON_COMPACT or INDENT(1), PRESERVE_ORDER
            ref = ctypes.string_at(sp)
            libc.free(sp)
            lib.json_delete(j)        # (a document of refcount 1)
            bad += ref != jansson_dumps(json.loads(text), compact)
    return bad


# ------------------------------------------------------------------ the checkpoint

def plain_name(n):
    return n and "/" not in n and not n.startswith(".") and "\0" not in n


def read_checkpoint(ckpt):
    """{file name: {"size", "header_size", "header_xxh3_128"}},
    {tensor: (file, absolute offset, size, dtype, shape)}."""
    idx = os.path.join(ckpt, ST_INDEX)
    if os.path.exists(idx):
        wm = json.load(open(idx, "rb"), object_pairs_hook=_dup_check).get("weight_map")
        need(isinstance(wm, dict) and wm, "%s: no weight_map" % idx)
        names = sorted(set(wm.values()))
    else:
        names = sorted(n for n in os.listdir(ckpt) if n.endswith(".safetensors"))
        if "model.safetensors" in names:
            names = ["model.safetensors"]
        need(len(names) == 1, "%s: no %s and not exactly one .safetensors file" % (ckpt, ST_INDEX))
    files, tensors = {}, {}
    for fn in names:
        need(plain_name(fn), "%r: not a plain file name" % fn)
        path = os.path.join(ckpt, fn)
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            need(len(head) == 8, "%s: shorter than 8 bytes" % path)
            (n,) = struct.unpack("<Q", head)
            need(0 < n <= 100_000_000 and 8 + n <= size, "%s: header length %d" % (path, n))
            hdr = head + f.read(n)
        need(len(hdr) == 8 + n, "%s: truncated header" % path)
        h = json.loads(hdr[8:].decode("utf-8"), object_pairs_hook=_dup_check)
        files[fn] = {"size": size, "header_size": 8 + n, "header_xxh3_128": xxhash.xxh3_128_hexdigest(hdr)}
        for name, t in h.items():
            if name == "__metadata__":
                continue
            b, e = t["data_offsets"]
            need(0 <= b <= e and 8 + n + e <= size, "%s: tensor %r outside the file" % (path, name))
            need(name not in tensors, "tensor %r is in two files" % name)
            tensors[name] = (fn, 8 + n + b, e - b, t["dtype"], t["shape"])
    return files, tensors


# ------------------------------------------------------------------ the rules of section 10

class LayerStays(Exception):
    """The layer is written as an expert shard (version 2), for the reason given."""


def record_range(m, x, e, tensors):
    """Record e of layer x as it lies in the checkpoint: (file, start, {part: offset in the range},
    size) when it can be read in place (its tensors in one file, covering one range exactly, each
    at a multiple of its element size), else a reason string."""
    stem = "%smodel.layers.%d.block_sparse_moe.experts.%d." % (m["name_prefix"], x["layer"], e)
    ts = []
    for p in x["parts"]:
        full = stem + p["name"]
        need(full in tensors, "%r: not in the checkpoint (was the pack made from it?)" % full)
        fn, off, size, dtype, _ = tensors[full]
        need(size == p["size"], "%r: %d bytes in the checkpoint, %d in the pack" % (full, size, p["size"]))
        if dtype not in SAME_BYTES.get(p["encoding"], ()):
            raise LayerStays("expert %d: part %s is %s in the checkpoint, %s in the pack" % (e, p["name"], dtype,
                                                                                            p["encoding"]))
        ts.append((off, size, p["name"], fn, dtype))
    fns = sorted(set(t[3] for t in ts))
    if len(fns) > 1:
        return "expert %d: its tensors are in %d files (%s)" % (e, len(fns), ", ".join(fns))
    for off, size, name, fn, dtype in ts:
        if off % ST_ELEM.get(dtype, 1):
            return "expert %d: %s starts at byte %d, not a multiple of its %s element size" % (e, name, off, dtype)
    ts.sort()
    start, end = ts[0][0], ts[-1][0] + ts[-1][1]
    if sum(t[1] for t in ts) != end - start or any(ts[i][0] + ts[i][1] != ts[i + 1][0] for i in range(len(ts) - 1)):
        return "expert %d: its tensors do not cover one range (other bytes between them)" % e
    return fns[0], start, {t[2]: t[0] - start for t in ts}, end - start


def place_layer(m, x, tensors):
    """Layer x in place: (layout {part: offset}, record_size, records [(file, offset) or None if
    copied], reasons of the copied records); raises LayerStays when it is written as a shard."""
    if m["experts"]["source"] != "checkpoint":
        raise LayerStays("its experts are converted (experts.source %r)" % m["experts"]["source"])
    layout, size, records, why = None, None, [], []
    for e in range(x["count"]):
        r = record_range(m, x, e, tensors)
        if not isinstance(r, str) and layout is None:
            layout, size = r[2], r[3]             # the first record that can be read in place sets it
        if not isinstance(r, str) and (r[2] != layout or r[3] != size):
            r = "expert %d: its tensors are laid out unlike the layer's first in-place record" % e
        records.append(None if isinstance(r, str) else (r[0], r[1]))
        if isinstance(r, str):
            why.append(r)
    if layout is None:
        raise LayerStays("no record can be read in place (%s, for example)" % why[0])
    return layout, size, records, why


def plan_copies(m, placed, tensors):
    """experts-copied.safetensors (FORMAT.md 10): its header bytes, its size, and where each copied
    record goes. The records of the in-place layers that cannot stay, in layer order, each at its
    place in the data (a multiple of 64: a U8 tensor "k3pack.pad.N" fills the gap), its tensors
    under their checkpoint names in the layer's layout; the header padded with spaces to a
    multiple of 4096 bytes. Returns None when no record is copied.
    Details section 10 does not fix, as k3pack writes them: the __metadata__ below, each record's
    tensors in the order of the version-2 record's parts, the keys dtype, shape, data_offsets,
    compact JSON (jansson JSON_COMPACT)."""
    root = {"__metadata__": {"format": "pt", "k3pack": COPIED_META}}
    at, n_pad, where = 0, 0, []                    # where: [(layer index, expert, data offset)]
    for i in sorted(placed, key=lambda i: placed[i]["shard_index"]):
        x, pl = m["expert_layers"][i], placed[i]
        stem = "%smodel.layers.%d.block_sparse_moe.experts." % (m["name_prefix"], x["layer"])
        for e, rec in enumerate(pl["records"]):
            if rec is not None:
                continue
            where.append((i, e, at))
            for p in x["parts"]:
                name = "%s%d.%s" % (stem, e, p["name"])
                _, _, size, dtype, shape = tensors[name]
                o = at + pl["layout"][p["name"]]
                root[name] = {"dtype": dtype, "shape": shape, "data_offsets": [o, o + size]}
            at += pl["record_size"]
            if at % 64:
                pad = 64 - at % 64
                root["k3pack.pad.%d" % n_pad] = {"dtype": "U8", "shape": [pad], "data_offsets": [at, at + pad]}
                n_pad += 1
                at += pad
    if not where:
        return None
    js = jansson_dumps(root, compact=True)
    hs = (8 + len(js) + 4095) // 4096 * 4096
    header = struct.pack("<Q", hs - 8) + js + b" " * (hs - 8 - len(js))
    return {"header": header, "size": hs + at, "where": [(i, e, hs + off) for i, e, off in where]}


def write_copies(ckpt, m, placed, tensors, copies, path):
    """Write experts-copied.safetensors; returns {(layer index, expert): XXH3-64 of its record}."""
    hashes, handles = {}, {}
    try:
        with open(path, "wb") as out:
            out.write(copies["header"])
            for i, e, off in copies["where"]:
                x, pl = m["expert_layers"][i], placed[i]
                stem = "%smodel.layers.%d.block_sparse_moe.experts.%d." % (m["name_prefix"], x["layer"], e)
                rec = bytearray(pl["record_size"])
                for p in x["parts"]:
                    fn, toff, size, _, _ = tensors[stem + p["name"]]
                    f = handles.get(fn) or handles.setdefault(fn, open(os.path.join(ckpt, fn), "rb"))
                    f.seek(toff)
                    data = f.read(size)
                    need(len(data) == size, "%s: ends inside tensor %s" % (fn, stem + p["name"]))
                    rec[pl["layout"][p["name"]]:pl["layout"][p["name"]] + size] = data
                out.seek(off)
                out.write(rec)
                hashes[(i, e)] = xxhash.xxh3_64_hexdigest(bytes(rec))
            out.truncate(copies["size"])
    finally:
        for f in handles.values():
            f.close()
    return hashes


def compare_bytes(ckpt, v2, x, records, layout, copy_path, copy_at):
    """Every part of every in-place record (in the checkpoint, or in the copy file) equals the
    same part in the version-2 shard."""
    with open(os.path.join(v2, x["shard"]), "rb") as sh:
        for e, rec in enumerate(records):
            fn, start = rec if rec is not None else (None, copy_at[e])
            with open(os.path.join(ckpt, fn) if fn else copy_path, "rb") as f:
                for p in x["parts"]:
                    f.seek(start + layout[p["name"]])
                    sh.seek(x["offset"] + e * x["stride"] + p["offset"])
                    need(f.read(p["size"]) == sh.read(p["size"]),
                         "layer %d expert %d part %s: the checkpoint's bytes differ from the pack's"
                         % (x["layer"], e, p["name"]))


def record_hashes(ckpt, records, size):
    """XXH3-64 of the records read in place in the checkpoint (None for the copied ones)."""
    out, handles = [], {}
    try:
        for rec in records:
            if rec is None:
                out.append(None)
                continue
            fn, start = rec
            f = handles.get(fn) or handles.setdefault(fn, open(os.path.join(ckpt, fn), "rb"))
            f.seek(start)
            data = f.read(size)
            need(len(data) == size, "%s: ends inside the record at %d" % (fn, start))
            out.append(xxhash.xxh3_64_hexdigest(data))
    finally:
        for f in handles.values():
            f.close()
    return out


# ------------------------------------------------------------------ the new pack

def in_place_manifest(m, placed, files, copies):
    """The version-3 manifest. placed = {expert_layers index: {"layout", "record_size", "records",
    "hashes", "copy_at"}}; copies: plan_copies() or None."""
    used = sorted(set(r[0] for pl in placed.values() for r in pl["records"] if r is not None))
    fidx = {fn: i for i, fn in enumerate(used)}
    src = [dict(name=fn, **files[fn]) for fn in used]
    if copies:
        src.append({"name": COPIED_NAME, "size": copies["size"], "header_size": len(copies["header"]),
                    "header_xxh3_128": xxhash.xxh3_128_hexdigest(copies["header"]), "in_pack": True})
    gone = set(m["expert_layers"][i]["shard"] for i in placed)
    out = {}
    for k, v in m.items():
        if k == "format_version":            # ("download": the same files read, the same record)
            v = 3
        elif k == "shards":
            v = [s for s in v if s["name"] not in gone]
        elif k == "expert_layers":
            v = [v[i] if i not in placed else layer_object(v[i], placed[i], fidx, len(used)) for i in range(len(v))]
        out[k] = v
        if k == "files":
            out["checkpoint_files"] = src
    need("checkpoint_files" in out, "the manifest has no 'files'")
    return out, used


def layer_object(x, pl, fidx, copy_index):
    parts = []
    for p in sorted(x["parts"], key=lambda p: pl["layout"][p["name"]]):
        parts.append({k: (pl["layout"][p["name"]] if k == "offset" else v) for k, v in p.items()})
    recs = [[fidx[r[0]], r[1]] if r is not None else [copy_index, pl["copy_at"][e]] for e, r in enumerate(pl["records"])]
    return {"layer": x["layer"], "source": "checkpoint", "count": x["count"], "record_size": pl["record_size"],
            "parts": parts, "records": recs, "xxh3_64": pl["hashes"]}


def put(src, dst, copy):
    if not copy:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copyfile(src, dst)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--self-test", type=int, metavar="N",
                    help="only compare the serialiser with libjansson on N random documents (exit 0: equal, "
                         "1: a difference, 77: no libjansson)")
    ap.add_argument("--checkpoint", help="the safetensors checkpoint directory")
    ap.add_argument("--pack", help="a version-2 pack k3pack made from it")
    ap.add_argument("--out", help="the new pack's directory (new or empty)")
    ap.add_argument("--copy", action="store_true", help="copy the pack's files instead of hard links")
    ap.add_argument("--no-byte-check", action="store_true",
                    help="do not compare the in-place records' parts with the version-2 shards")
    a = ap.parse_args()
    if a.self_test is not None:
        bad = self_test(a.self_test)
        print("make_in_place.py: serialiser vs libjansson: %s" % (
            "no libjansson" if bad is None else "%d of %d documents differ" % (bad, 2 * a.self_test)))
        return 77 if bad is None else 1 if bad else 0
    if not (a.checkpoint and a.pack and a.out):
        ap.error("--checkpoint, --pack and --out are needed")
    ckpt = os.path.realpath(a.checkpoint)
    need(os.path.isdir(ckpt), "%s: not a directory" % a.checkpoint)
    m = load_manifest(os.path.join(a.pack, "manifest.json"))
    files, tensors = read_checkpoint(ckpt)

    shard_index = {sh["name"]: k for k, sh in enumerate(m["shards"])}
    placed, in_shards, copied = {}, [], []
    for i, x in enumerate(m["expert_layers"]):
        try:
            layout, size, records, why = place_layer(m, x, tensors)
        except LayerStays as e:
            in_shards.append({"layer": x["layer"], "reason": str(e)})
            continue
        placed[i] = {"layout": layout, "record_size": size, "records": records, "copy_at": {},
                     "shard_index": shard_index[x["shard"]]}
        copied += [{"layer": x["layer"], "expert": e, "reason": w}
                   for e, w in zip([e for e, r in enumerate(records) if r is None], why)]
    copies = plan_copies(m, placed, tensors) if placed else None
    for i, e, off in copies["where"] if copies else []:
        placed[i]["copy_at"][e] = off

    need(not os.path.exists(a.out) or (os.path.isdir(a.out) and not os.listdir(a.out)),
         "%s: exists and is not an empty directory" % a.out)
    os.makedirs(a.out, exist_ok=True)
    copy_path = os.path.join(a.out, COPIED_NAME)
    copy_hashes = write_copies(ckpt, m, placed, tensors, copies, copy_path) if copies else {}
    for i, pl in placed.items():
        hs = record_hashes(ckpt, pl["records"], pl["record_size"])
        pl["hashes"] = [h if h is not None else copy_hashes[(i, e)] for e, h in enumerate(hs)]
        if not a.no_byte_check:
            compare_bytes(ckpt, a.pack, m["expert_layers"][i], pl["records"], pl["layout"], copy_path, pl["copy_at"])

    if placed:
        out_m, used = in_place_manifest(m, placed, files, copies)
        text = seal(out_m)
    else:                          # nothing in place: the version-2 pack as it is (FORMAT.md 6)
        out_m, used = m, []
        text = open(os.path.join(a.pack, "manifest.json"), "rb").read()
    for f in out_m["files"]:
        put(os.path.join(a.pack, f["name"]), os.path.join(a.out, f["name"]), a.copy)
    for sh in out_m["shards"]:
        put(os.path.join(a.pack, sh["name"]), os.path.join(a.out, sh["name"]), a.copy)
    if placed:
        os.symlink(ckpt, os.path.join(a.out, LINK))
    tmp = os.path.join(a.out, ".manifest.json.tmp")
    with open(tmp, "wb") as f:
        f.write(text)
    os.rename(tmp, os.path.join(a.out, "manifest.json"))

    summary = {
        "out": a.out,
        "format_version": out_m["format_version"],
        "checkpoint": ckpt if placed else None,
        "in_place": [m["expert_layers"][i]["layer"] for i in sorted(placed)],
        "in_shards": in_shards,
        "copied": copied,
        "checkpoint_files": used + ([COPIED_NAME] if copies else []),
        "records_in_place": sum(r is not None for pl in placed.values() for r in pl["records"]),
        "records_copied": len(copied),
        "manifest_xxh3_64": text[-20:-4].decode(),
    }
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (Bad, OSError, ValueError, KeyError, TypeError) as e:
        print("make_in_place.py: error: %s" % e, file=sys.stderr)
        sys.exit(1)

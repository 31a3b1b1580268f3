"""Minimal, strict safetensors reader/writer for the k3 test reference (FORMATS.md §1).

Independent of k3's C reader on purpose: the two are checked against each other.

Writer: 8-byte little-endian header length N, UTF-8 JSON header padded with spaces
to a multiple of 8, then the data buffer, tensors back to back from offset 0 in the
official writer's order (descending dtype alignment, then name). Keys in the header
appear in that same order, `__metadata__` first: the output is byte-deterministic.
Tensor data may be given as bytes/ndarray or produced lazily (a callable), so that
huge shards can be streamed tensor by tensor with bounded memory.

Reader: mmap'd, validates like the reference Rust reader (§1.3): header size cap,
UTF-8 JSON object, known dtypes, per-tensor keys exactly {dtype, shape,
data_offsets}, byte size == prod(shape)*itemsize, offsets contiguous from 0 with
no holes, last end == file size, metadata values are strings, no duplicate keys,
no NUL in names. Tensors come back as read-only numpy views (BF16 as uint16).
"""

import json
import mmap
import os
import struct

import numpy as np

# dtype string -> (numpy dtype, itemsize). BF16 is carried as raw uint16 bits.
DTYPES = {
    "BOOL": (np.dtype(np.bool_), 1),
    "U8": (np.dtype("u1"), 1), "I8": (np.dtype("i1"), 1),
    "U16": (np.dtype("<u2"), 2), "I16": (np.dtype("<i2"), 2),
    "F16": (np.dtype("<f2"), 2), "BF16": (np.dtype("<u2"), 2),
    "U32": (np.dtype("<u4"), 4), "I32": (np.dtype("<i4"), 4), "F32": (np.dtype("<f4"), 4),
    "U64": (np.dtype("<u8"), 8), "I64": (np.dtype("<i8"), 8), "F64": (np.dtype("<f8"), 8),
}
MAX_HEADER = 100_000_000          # same cap as the Rust reader
MAX_DIM = (1 << 48) - 1           # JSON schema integer cap


class SafetensorsError(ValueError):
    pass


# ---------------------------------------------------------------------------
# bf16 helpers (bit exact; round-to-nearest-even like torch's .to(bfloat16))
# ---------------------------------------------------------------------------

def bf16_to_f32(u16):
    """uint16 bf16 bits [...] -> float32 [...] (exact: shift into the high half)."""
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """float32 [...] -> uint16 bf16 bits [...], round to nearest even (no NaN inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    u = u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))
    return (u >> 16).astype(np.uint16)


def round_bf16(x):
    """float32 [...] -> float32 [...] holding the nearest bf16 value (RNE)."""
    return bf16_to_f32(f32_to_bf16(x))


# ---------------------------------------------------------------------------
# Writer
# ---------------------------------------------------------------------------

def _order_key(spec):
    """The official writer's order: descending dtype alignment, then name."""
    return (-DTYPES[spec[1]][1], spec[0])


def nbytes_of(dtype, shape):
    n = DTYPES[dtype][1]
    for d in shape:
        n *= int(d)
    return n


def build_header(specs, metadata=None):
    """specs: list of (name, dtype, shape) already in file order. Returns header bytes
    (without the 8-byte length), padded with spaces to a multiple of 8."""
    hdr = {}
    if metadata is not None:
        hdr["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    off = 0
    for name, dtype, shape in specs:
        n = nbytes_of(dtype, shape)
        hdr[name] = {"dtype": dtype, "shape": [int(d) for d in shape], "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(hdr, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * ((-(8 + len(text))) % 8)   # 8 + N is a multiple of 8
    return text


def write_safetensors(path, tensors, metadata=None, sort=True):
    """Write one safetensors file.

    tensors: list of (name, dtype, shape, data) where data is an ndarray / bytes of
      exactly nbytes_of(dtype, shape) bytes, or a zero-argument callable returning
      one (called in file order, so a generator can stream huge tensors).
    metadata: dict of str -> str ({"format": "pt"} like torch's writer), or None.
    Returns the number of data bytes written.
    """
    for name, dtype, shape, _ in tensors:
        if dtype not in DTYPES:
            raise SafetensorsError("unknown dtype %r for %s" % (dtype, name))
        if name == "__metadata__" or "\0" in name:
            raise SafetensorsError("bad tensor name %r" % name)
    if len({t[0] for t in tensors}) != len(tensors):
        raise SafetensorsError("duplicate tensor names")
    tensors = sorted(tensors, key=_order_key) if sort else list(tensors)
    header = build_header([(n, d, s) for n, d, s, _ in tensors], metadata)
    total = 0
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for name, dtype, shape, data in tensors:
            if callable(data):
                data = data()
            if isinstance(data, np.ndarray):
                want = DTYPES[dtype][0]
                if data.dtype.kind != want.kind or data.dtype.itemsize != want.itemsize:
                    raise SafetensorsError("%s: array dtype %s does not match %s" % (name, data.dtype, dtype))
                if tuple(data.shape) != tuple(shape):
                    raise SafetensorsError("%s: array shape %s != %s" % (name, data.shape, shape))
                data = np.ascontiguousarray(data.astype(want.newbyteorder("<"), copy=False)).tobytes()
            if len(data) != nbytes_of(dtype, shape):
                raise SafetensorsError("%s: %d bytes given, %d expected" % (name, len(data), nbytes_of(dtype, shape)))
            f.write(data)
            total += len(data)
    os.replace(tmp, path)
    return total


# ---------------------------------------------------------------------------
# Reader
# ---------------------------------------------------------------------------

def _no_dup_pairs(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise SafetensorsError("duplicate JSON key %r" % k)
        d[k] = v
    return d


class SafetensorsFile:
    """One mmap'd safetensors file. .names (file order), .info[name] = (dtype, shape,
    begin, end), .metadata (dict str->str), .get(name) -> read-only ndarray view."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise SafetensorsError("%s: file shorter than 8 bytes" % path)
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_HEADER or 8 + n > size:
                raise SafetensorsError("%s: bad header length %d (file %d bytes)" % (path, n, size))
            raw = f.read(n)
            # mmap keeps its own duplicate of the descriptor: the file object can close.
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._parse(path, raw, n, size)
        except Exception:
            self.close()
            raise

    def _parse(self, path, raw, n, size):
        try:
            text = raw.decode("utf-8")
            hdr = json.loads(text, object_pairs_hook=_no_dup_pairs)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError("%s: bad header JSON: %s" % (path, e)) from None
        if not isinstance(hdr, dict):
            raise SafetensorsError("%s: header is not a JSON object" % path)
        meta = hdr.pop("__metadata__", None)
        if meta is not None and (not isinstance(meta, dict) or
                                 not all(isinstance(v, str) for v in meta.values())):
            raise SafetensorsError("%s: __metadata__ must map strings to strings" % path)
        self.metadata = meta or {}
        self.data_start = 8 + n
        self.info = {}
        spans = []
        for name, t in hdr.items():
            if "\0" in name:
                raise SafetensorsError("%s: NUL in tensor name" % path)
            if not isinstance(t, dict) or set(t) != {"dtype", "shape", "data_offsets"}:
                raise SafetensorsError("%s: %s: bad tensor entry" % (path, name))
            dt, shape, offs = t["dtype"], t["shape"], t["data_offsets"]
            if dt not in DTYPES:
                raise SafetensorsError("%s: %s: unknown dtype %r" % (path, name, dt))
            if (not isinstance(shape, list) or
                    not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIM for d in shape)):
                raise SafetensorsError("%s: %s: bad shape %r" % (path, name, shape))
            if (not isinstance(offs, list) or len(offs) != 2 or
                    not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offs)):
                raise SafetensorsError("%s: %s: bad data_offsets %r" % (path, name, offs))
            b, e = offs
            if e - b != nbytes_of(dt, shape):
                raise SafetensorsError("%s: %s: %d bytes for shape %s %s" % (path, name, e - b, shape, dt))
            self.info[name] = (dt, tuple(shape), b, e)
            spans.append((b, e, name))
        spans.sort()
        pos = 0
        for b, e, name in spans:
            if b != pos:
                raise SafetensorsError("%s: %s: offset %d, expected %d (hole or overlap)" % (path, name, b, pos))
            pos = e
        if self.data_start + pos != size:
            raise SafetensorsError("%s: data ends at %d but file is %d bytes" % (path, self.data_start + pos, size))
        self.names = [s[2] for s in spans]

    def get(self, name):
        dt, shape, b, e = self.info[name]
        npdt = DTYPES[dt][0]
        arr = np.frombuffer(self._mm, dtype=npdt, count=(e - b) // npdt.itemsize,
                            offset=self.data_start + b) if e > b else np.zeros(0, npdt)
        return arr.reshape(shape)

    def close(self):
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:          # arrays still view the map: the GC unmaps it later
                pass
            self._mm = None


class ModelDir:
    """A Hugging Face style directory: model.safetensors.index.json + shards (or a
    single model.safetensors). .names, .dtype(n), .shape(n), .get(n) raw view,
    .get_f32(n) float32 copy (BF16 widened exactly)."""

    def __init__(self, path):
        self.path = path
        idx = os.path.join(path, "model.safetensors.index.json")
        self.files = {}
        self.where = {}
        if os.path.exists(idx):
            with open(idx, "r", encoding="utf-8") as f:
                index = json.load(f, object_pairs_hook=_no_dup_pairs)
            wm = index.get("weight_map")
            if not isinstance(wm, dict):
                raise SafetensorsError("%s: weight_map missing" % idx)
            shards = sorted(set(wm.values()))
            for s in shards:
                if os.path.basename(s) != s:
                    raise SafetensorsError("%s: shard name %r is not a plain file name" % (idx, s))
                self.files[s] = SafetensorsFile(os.path.join(path, s))
            for s, st in self.files.items():
                for n in st.names:
                    if n in self.where:
                        raise SafetensorsError("tensor %s appears in two shards" % n)
                    self.where[n] = s
            if set(self.where) != set(wm) or any(wm[n] != self.where[n] for n in wm):
                raise SafetensorsError("%s: weight_map disagrees with the shards' contents" % idx)
            self.index_total_size = index.get("metadata", {}).get("total_size")
        else:
            s = "model.safetensors"
            self.files[s] = SafetensorsFile(os.path.join(path, s))
            self.where = {n: s for n in self.files[s].names}
            self.index_total_size = None
        self.names = sorted(self.where)

    def __contains__(self, name):
        return name in self.where

    def dtype(self, name):
        return self.files[self.where[name]].info[name][0]

    def shape(self, name):
        return self.files[self.where[name]].info[name][1]

    def get(self, name):
        """Raw read-only view (BF16 as uint16 bits)."""
        return self.files[self.where[name]].get(name)

    def get_f32(self, name):
        """float32 array (new memory): BF16 widened, F32 copied; other dtypes refused."""
        dt = self.dtype(name)
        a = self.get(name)
        if dt == "BF16":
            return bf16_to_f32(a)
        if dt == "F32":
            return np.array(a, dtype=np.float32)
        raise SafetensorsError("%s: dtype %s is not a float weight" % (name, dt))

    def data_bytes(self):
        return sum(st.info[n][3] - st.info[n][2] for st in self.files.values() for n in st.names)

    def close(self):
        for st in self.files.values():
            st.close()

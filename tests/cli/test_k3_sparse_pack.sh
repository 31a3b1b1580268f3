#!/bin/sh
# k3_mkpack_sparse: the full-size Kimi K3 pack (tests/data/kimi-k3-config.json)
# as sparse files of zeros, and proof that it is what k3pack writes.
#  1. full size: written in well under a minute; k3verify --quick accepts it;
#     k3inspect reports K3's totals; little real disk, ~1.56 TB apparent; a
#     second run gives a byte-identical manifest.json; an independent Python
#     reader (FORMAT.md, python3-xxhash) checks the manifest's checksum of
#     itself, one expert shard's header and manifest entries, and one whole
#     trunk shard's hashes, which a full k3verify of that shard (--subset)
#     accepts too.
#  2. tiny checkpoint: k3pack's pack and k3_mkpack_sparse's have byte-identical
#     shard headers and sizes and manifests identical except for data hashes,
#     generator, skipped (vision) tensors and the manifest checksum (checked in
#     both); a full k3verify and tests/pack/check_pack.py's shard reader accept
#     the sparse pack; the same with --trunk q8 (the compact trunk's Q8 tensors and scales).
# Environment (set by ctest): K3_MKPACK_SPARSE K3_BIN K3_SRC K3_TEST_DATA K3_TEST_TMP PYTHON
set -eu
T="$K3_TEST_TMP/k3_sparse_pack"
rm -rf "$T" && mkdir -p "$T"
fail() { echo "FAIL: $*" >&2; exit 1; }
now() { date +%s.%N; }
cfg="$K3_TEST_DATA/kimi-k3-config.json"
P="$T/k3"
trap 'rm -rf "$P" "$T/k3b"' EXIT          # the 1.5 TB (apparent) packs go even on failure

"$PYTHON" -c "import sys; sys.path.insert(0, sys.argv[1]); import kimi_tokenizer as k; k.write_tokenizer_files(sys.argv[2])" \
    "$K3_SRC/tests/reference" "$T/tok"

# ---------------------------------------------------------------- usage errors
"$K3_MKPACK_SPARSE" --help | grep -q "k3verify" || fail "--help"
set +e
"$K3_MKPACK_SPARSE" "$cfg" "$T/tok" 2>/dev/null; rc1=$?
"$K3_MKPACK_SPARSE" "$cfg" "$T/tok" "$T/tok" 2>/dev/null; rc2=$?     # not empty
set -e
[ $rc1 -eq 2 ] && [ $rc2 -eq 2 ] || fail "usage errors exited $rc1 / $rc2, expected 2"

# ------------------------------------------------------------ 1. full-size K3
t0=$(now)
"$K3_MKPACK_SPARSE" "$cfg" "$T/tok" "$P"
t1=$(now)
echo "k3_mkpack_sparse: $(echo "$t1 - $t0" | bc) s"
[ "$(echo "$t1 - $t0 < 60" | bc)" -eq 1 ] || fail "took more than 60 s"

"$K3_BIN/k3verify" --quick -q "$P" || fail "k3verify --quick rejects the sparse K3 pack"
"$K3_BIN/k3inspect" --summary "$P" >"$T/summary.txt"
grep -q "^Total: .* 2779484476000 params" "$T/summary.txt" || fail "total params: $(grep '^Total' "$T/summary.txt")"
grep -Eq "^routed experts +494592 +[0-9]+ +[0-9.]+ T +1446456066048 " "$T/summary.txt" ||
    fail "expert bytes: $(grep '^routed experts' "$T/summary.txt")"
grep -q "^Pack: format 2, 187 shards, experts MXFP4" "$T/summary.txt" || fail "pack line: $(grep '^Pack' "$T/summary.txt")"

real_kb=$(du -sk "$P" | cut -f1)
apparent=$(du -sb "$P" | cut -f1)
echo "disk: ${real_kb} KiB real, $apparent bytes apparent"
[ "$real_kb" -lt 102400 ] || fail "the sparse pack uses $real_kb KiB of disk"
[ "$apparent" -gt 1550000000000 ] && [ "$apparent" -lt 1570000000000 ] || fail "apparent size $apparent"

"$K3_MKPACK_SPARSE" -q "$cfg" "$T/tok" "$T/k3b"
cmp "$P/manifest.json" "$T/k3b/manifest.json" || fail "a second run gives another manifest.json"
rm -rf "$T/k3b"

# independent reader: one expert shard's header vs the manifest; one trunk shard hashed whole
"$PYTHON" - "$P" >"$T/py.out" <<'EOF' || fail "independent reader"
import json, struct, sys, xxhash
pack = sys.argv[1]
raw = open(pack + "/manifest.json", "rb").read()
m = json.loads(raw)
ENC = {10: ("MXFP4", 4), 11: ("E8M0", 8)}
def need(c, msg):
    if not c: sys.exit("check: " + msg)
# FORMAT.md 5.1: the manifest ends with "manifest_xxh3_64": "<16 hex>", '"', newline, '}', newline,
# the digits being the XXH3-64 of every byte before them
need(raw[-4:] == b'"\n}\n' and raw[-41:-20] == b'"manifest_xxh3_64": "', "no checksum at the end of manifest.json")
need(xxhash.xxh3_64_hexdigest(raw[:-20]).encode() == raw[-20:-4] == m["manifest_xxh3_64"].encode(), "manifest checksum")
def zeros64(n):                                         # XXH3-64 of n zero bytes, streamed
    h, z = xxhash.xxh3_64(), bytes(1 << 24)
    while n: k = min(n, len(z)); h.update(z[:k]); n -= k
    return h.hexdigest()
x = [e for e in m["expert_layers"] if e["layer"] == 1][0]
sh = [s for s in m["shards"] if s["name"] == x["shard"]][0]
with open(pack + "/" + x["shard"], "rb") as f:
    fixed = f.read(128)
    need(fixed[:8] == b"K3SHARD\0", "magic")
    ver, bom, kind, align, layer, n, names, doff, fsize, nrec, rsize, stride = struct.unpack_from("<6I6Q", fixed, 8)
    f.seek(0)
    hdr = bytearray(f.read(doff))
need((ver, bom, kind, align, layer, n) == (2, 0x01020304, 2, 4096, 1, 6), "fixed header %r" % ((ver, bom, kind, align, layer, n),))
need((doff, nrec, rsize, stride) == (x["offset"], 896, 17547264, 17547264) and x["count"] == 896, "record geometry")
need(fsize == sh["size"] == doff + nrec * stride, "file_size")
need(hdr[80:120] == bytes(40), "reserved")
hh = struct.unpack_from("<Q", hdr, 120)[0]
hdr[120:128] = bytes(8)
need(xxhash.xxh3_64_intdigest(bytes(hdr)) == hh and "%016x" % hh == sh["header_hash"], "header_hash")
blob = hdr[128 + 64 * n:128 + 64 * n + names]
for i, p in enumerate(x["parts"]):
    off, size, no, nl, enc, nd = struct.unpack_from("<QQIIBB", hdr, 128 + 64 * i)
    shape = list(struct.unpack_from("<4Q", hdr, 128 + 64 * i + 32))[:nd]
    need(ENC[enc][0] == p["encoding"] and shape == p["shape"] and (off, size) == (p["offset"], p["size"]) and
         blob[no:no + nl].decode() == p["name"], "part %d %r" % (i, p))
    need(size * 8 == ENC[enc][1] * shape[0] * shape[1], "part %d size" % i)
need([p["name"] for p in x["parts"]] == ["w1.weight_packed", "w1.weight_scale", "w3.weight_packed",
                                         "w3.weight_scale", "w2.weight_packed", "w2.weight_scale"], "part order")
need(x["xxh3_64"] == [zeros64(rsize)] * 896, "record hashes")
# the smallest trunk layer shard, read whole (the holes read as zeros)
t = min((s for s in m["shards"] if s["kind"] == "trunk" and s["layer"] is not None), key=lambda s: s["size"])
h, buf, pos = xxhash.xxh3_128(), bytearray(1 << 24), 0
with open(pack + "/" + t["name"], "rb", buffering=0) as f:
    doff = struct.unpack_from("<Q", f.read(48), 40)[0]
    f.seek(0)
    while True:
        k = f.readinto(buf)
        if not k: break
        chunk = memoryview(buf)[:k]
        h.update(chunk)
        lo = max(doff - pos, 0)
        need(lo >= k or chunk[lo:] == bytes(k - lo), "%s: data not zero at %d" % (t["name"], pos + lo))
        pos += k
need(pos == t["size"] and h.hexdigest() == t["xxh3_128"], "%s: xxh3_128 %s, manifest %s" % (t["name"], h.hexdigest(), t["xxh3_128"]))
for e in (e for e in m["tensors"] if e["shard"] == t["name"]):
    need(zeros64(e["size"]) == e["xxh3_64"], e["name"])
print("independent reader: %s header and manifest entries OK; %s (%d bytes) hashes OK" % (x["shard"], t["name"], t["size"]))
print("SUBSET %d/%d" % (m["shards"].index(t) + 1, len(m["shards"])))
EOF
cat "$T/py.out"
sub=$(sed -n 's/^SUBSET //p' "$T/py.out")
"$K3_BIN/k3verify" -q --subset "$sub" "$P" || fail "full k3verify of shard $sub rejects it"
rm -rf "$P"

# ------------------------------------------------ 2. tiny: same as k3pack's pack
"$PYTHON" "$K3_SRC/tests/reference/make_checkpoint.py" --preset tiny --seed 1 --out "$T/ck" -q
for trunk in exact q8; do
rm -rf "$T/real" "$T/sparse"
"$K3_BIN/k3pack" -q --trunk $trunk "$T/ck" -o "$T/real" 2>/dev/null
"$K3_MKPACK_SPARSE" -q --trunk $trunk "$T/ck/config.json" "$T/ck" "$T/sparse"
"$K3_BIN/k3verify" -q "$T/sparse" || fail "full k3verify rejects the tiny sparse pack (--trunk $trunk)"
(cd "$T/real" && ls) >"$T/ls.real"
(cd "$T/sparse" && ls) >"$T/ls.sparse"
cmp "$T/ls.real" "$T/ls.sparse" || fail "different files"
"$PYTHON" - "$T/real" "$T/sparse" "$K3_SRC/tests/pack" "$trunk" <<'EOF'
import json, os, struct, sys, xxhash
real, sparse = sys.argv[1], sys.argv[2]
sys.path.insert(0, sys.argv[3])
import check_pack                                       # the independent reader of FORMAT.md
def need(c, msg):
    if not c: sys.exit("check: " + msg)
for p in (real, sparse):                                # both sealed (FORMAT.md 5.1)
    check_pack.check_manifest_sum(open(os.path.join(p, "manifest.json"), "rb").read(), p)
mr, ms = (json.load(open(os.path.join(p, "manifest.json"))) for p in (real, sparse))
for s in mr["shards"]:
    a = open(os.path.join(real, s["name"]), "rb").read()
    b = open(os.path.join(sparse, s["name"]), "rb").read()
    doff = struct.unpack_from("<Q", a, 40)[0]
    need(len(a) == len(b) and a[:doff] == b[:doff], "%s: header or size differs from k3pack's" % s["name"])
    need(b[doff:] == bytes(len(b) - doff), "%s: data not zero" % s["name"])
# the sparse pack through check_pack's shard reader, with its manifest's hashes
tensors = {(t["shard"], t["name"]): t for t in ms["tensors"]}
xl = {x["shard"]: x for x in ms["expert_layers"]}
for s in ms["shards"]:
    f, entries, data = check_pack.read_shard(os.path.join(sparse, s["name"]))
    need(xxhash.xxh3_128_hexdigest(data) == s["xxh3_128"] and "%016x" % f["header_hash"] == s["header_hash"], s["name"])
    if f["kind"] == 1:
        for e in entries:
            t = tensors[(s["name"], e["name"])]
            need((t["offset"], t["size"], t["encoding"], t["shape"]) == (e["offset"], e["size"], e["encoding"], e["shape"]), e["name"])
            need(xxhash.xxh3_64_hexdigest(data[e["offset"]:e["offset"] + e["size"]]) == t["xxh3_64"], e["name"])
    else:
        x = xl[s["name"]]
        need([(p["name"], p["offset"], p["size"], p["encoding"], p["shape"]) for p in x["parts"]] ==
             [(e["name"], e["offset"], e["size"], e["encoding"], e["shape"]) for e in entries], s["name"] + " parts")
        for r in range(f["n_records"]):
            base = f["data_offset"] + r * f["stride"]
            need(xxhash.xxh3_64_hexdigest(data[base:base + f["record_size"]]) == x["xxh3_64"][r], "%s record %d" % (s["name"], r))
# manifests: equal once data hashes, generator, skipped and k3pack's download record are set aside
need(all(k["reason"] == "vision" for k in mr["skipped"]) and ms["skipped"] == [], "skipped")
need("download" in mr and "download" not in ms, "the download record")
for m in (mr, ms):
    m.pop("download", None)
    m["generator"] = m["skipped"] = m["manifest_xxh3_64"] = None
    for s in m["shards"]: s["xxh3_128"] = None
    for t in m["tensors"]: t["xxh3_64"] = None
    for x in m["expert_layers"]: x["xxh3_64"] = None
need(json.dumps(mr) == json.dumps(ms), "manifests differ beyond hashes")
need(("trunk" in ms) == (sys.argv[4] == "q8"), "the manifest's trunk key")
print("tiny, trunk %s: %d shards: headers byte-identical to k3pack's, manifests equal but for data hashes" % (
      sys.argv[4], len(mr["shards"])))
EOF
done
rm -rf "$T"
echo "PASS"

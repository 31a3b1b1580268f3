#!/bin/sh
# Resuming from hand-made states (no timing): a journal that lists a shard
# twice, the second time with a wrong hash, still resumes to the same pack; a
# stale shard of another run that is not in the plan does not stay in the pack.
. "$(dirname "$0")/lib.sh"
make_ckpt tiny "$T/ck"
"$K3_BIN/k3pack" -q "$T/ck" -o "$T/ref"

# unfinish OUT: a copy of the reference pack as an interrupted run leaves it,
# with a journal listing the given shards (name:hash pairs, hash "good" = right)
unfinish() {   # unfinish OUT NAME:HASH...
    out=$1; shift
    cp -r "$T/ref" "$out"
    rm "$out/manifest.json" "$out/tiktoken.model" "$out/tokenizer_config.json"
    $PY - "$T/ck/config.json" "$T/ref/manifest.json" "$out/.k3pack.journal" "$@" <<'PYEOF'
import json, os, struct, sys
import xxhash
cfg, man, out = sys.argv[1:4]
# the fingerprint k3pack computes: config_fingerprint (k3pack/pack_write.c): "k3pack-1",
# experts mode at 12 (1 = MXFP4), quantize at 13, then config.json; then (k3pack/pack_journal.c)
# its hex digits and per input file in name order: name, NUL, size and mtime_ns (u64 LE),
# the hex XXH3-128 of its safetensors header (8 + N bytes)
tag = bytearray(b"k3pack-1" + bytes(8))
tag[12] = 1
cfp = xxhash.xxh3_128_hexdigest(bytes(tag) + open(cfg, "rb").read())
ck = os.path.dirname(cfg)
h = cfp.encode()
for name in sorted(n for n in os.listdir(ck) if n.endswith(".safetensors")):
    path = os.path.join(ck, name)
    st = os.stat(path)
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        f.seek(0)
        hdr = f.read(8 + n)
    h += name.encode() + b"\0" + struct.pack("<QQ", st.st_size, st.st_mtime_ns)
    h += xxhash.xxh3_128_hexdigest(hdr).encode()
fp = xxhash.xxh3_128_hexdigest(h)
shards = {s["name"]: s for s in json.load(open(man))["shards"]}
done = []
for arg in sys.argv[4:]:
    name, h = arg.split(":")
    done.append({"name": name, "size": shards[name]["size"],
                 "xxh3_128": shards[name]["xxh3_128"] if h == "good" else h})
json.dump({"k3pack_journal": 1, "fingerprint": fp, "config_fingerprint": cfp, "done": done}, open(out, "w"))
PYEOF
}

# a shard listed twice, first right then wrong: it was taken over twice, the second
# time its hashes were freed while it stayed 'done' (manifest from freed hashes)
unfinish "$T/dup" trunk-embed.k3s:good trunk-embed.k3s:0123456789abcdef0123456789abcdef
"$K3_BIN/k3pack" -v "$T/ck" -o "$T/dup" 2>"$T/dup.log" || { cat "$T/dup.log"; fail "resume with a duplicated journal entry"; }
grep -q "resuming: 1 of" "$T/dup.log" || { cat "$T/dup.log"; fail "the journalled shard was not taken over once"; }
diff -r "$T/ref" "$T/dup" >/dev/null || fail "pack differs after a journal listing a shard twice"

# an unfinished output without a journal (killed between a shard's rename and the
# first journal write) that also holds a shard of another model's run: the file
# is not part of this pack and must not be left in it
unfinish "$T/stale"
rm "$T/stale/.k3pack.journal"
cp "$T/ref/trunk-layer-008.k3s" "$T/stale/trunk-layer-099.k3s"
"$K3_BIN/k3pack" -q "$T/ck" -o "$T/stale"
diff -r "$T/ref" "$T/stale" >/dev/null || fail "a shard file outside the plan was left in the finished pack"
"$K3_BIN/k3verify" -q "$T/stale" || fail "k3verify fails the finished pack"
# a FIFO under the name of a journalled shard: resuming must not hang on it
unfinish "$T/fifo" trunk-layer-002.k3s:good
rm "$T/fifo/trunk-layer-002.k3s"
mkfifo "$T/fifo/trunk-layer-002.k3s"
timeout 20 "$K3_BIN/k3pack" -q "$T/ck" -o "$T/fifo" || fail "resume with a FIFO in place of a shard (exit $?; 124 = hung)"
diff -r "$T/ref" "$T/fifo" >/dev/null || fail "pack differs after replacing a FIFO shard"
echo "pack_journal: OK"

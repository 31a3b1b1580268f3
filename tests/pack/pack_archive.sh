#!/bin/sh
# Archive input edge cases: a damaged tar header (libarchive answers
# ARCHIVE_RETRY, which is not success) is an error, not a crash, wherever it
# is; a hard-linked file gets an error naming the fix.
. "$(dirname "$0")/lib.sh"
make_ckpt tiny "$T/ck"
no_manifest() { [ ! -e "$1/manifest.json" ] || fail "$1 has a manifest after a failed run"; }
make_tar "$T/ck" "$T/full.tar"

# damage_header TAR MEMBER_PREFIX OUT: zero the header checksum of the first member named MEMBER_PREFIX*
damage_header() {
    $PY - "$1" "$2" "$3" <<'PYEOF'
import sys, tarfile
src, prefix, out = sys.argv[1:4]
data = bytearray(open(src, "rb").read())
with tarfile.open(src) as t:
    off = next(m.offset for m in t.getmembers() if m.name.startswith(prefix))
data[off + 148:off + 156] = b"0000000\0"
open(out, "wb").write(data)
PYEOF
}
# a damaged header between the weights
damage_header "$T/full.tar" model-00002 "$T/mid.tar"
expect_exit 1 "$K3_BIN/k3pack" "$T/mid.tar" -o "$T/o1"
expect_err "Damaged tar archive"
no_manifest "$T/o1"

# a hard link: tar stores it as a link entry without data (a_copy.json sorts first)
mkdir "$T/hl"
cp "$T/ck"/* "$T/hl/"
ln "$T/hl/tokenizer_config.json" "$T/hl/a_copy.json"
make_tar "$T/hl" "$T/hl.tar"
# a damaged header before config.json (the second member, after a_copy.json)
damage_header "$T/hl.tar" config.json "$T/first.tar"
expect_exit 1 "$K3_BIN/k3pack" "$T/first.tar" -o "$T/o2"
expect_err "Damaged tar archive"
[ ! -e "$T/o2" ] || fail "output created although the archive was unreadable"
expect_exit 1 "$K3_BIN/k3pack" "$T/hl.tar" -o "$T/o3"
expect_err "hard link"
no_manifest "$T/o3"

# vision tensors spread over two files: the manifest's skipped list is the same
# (sorted by name) from the directory and from an archive in any entry order
cp -r "$T/ck" "$T/vis"
$PY - "$T/vis" <<'PYEOF'
import json, os, sys
sys.path.insert(0, os.path.join(os.environ["K3_SRC"], "tests", "reference"))
from safetensors_io import ModelDir, write_safetensors
d = sys.argv[1]
ck = ModelDir(d)
mover = "vision_tower.patch_embed.proj.weight"
src, dst = ck.where[mover], sorted(ck.files)[0]
assert src != dst
rows = {f: [(n, ck.files[f].info[n][0], ck.files[f].info[n][1], ck.files[f].get(n)) for n in ck.files[f].names]
        for f in (src, dst)}
moved = [r for r in rows[src] if r[0] == mover]
write_safetensors(os.path.join(d, src), [r for r in rows[src] if r[0] != mover], metadata={"format": "pt"})
write_safetensors(os.path.join(d, dst), moved + rows[dst], metadata={"format": "pt"})
idx = os.path.join(d, "model.safetensors.index.json")
j = json.load(open(idx))
j["weight_map"][mover] = dst
json.dump(j, open(idx, "w"), indent=2)
PYEOF
"$K3_BIN/k3pack" -q "$T/vis" -o "$T/vis_dir"
(cd "$T/vis" && tar -cf "$T/vis_rev.tar" config.json $(ls model-*.safetensors | LC_ALL=C sort -r) \
    model.safetensors.index.json tiktoken.model tokenizer_config.json)
"$K3_BIN/k3pack" -q "$T/vis_rev.tar" -o "$T/vis_tar"
diff -r "$T/vis_dir" "$T/vis_tar" >/dev/null || fail "the skipped list depends on the order of the archive's entries"
$PY - "$T/vis_dir/manifest.json" <<'PYEOF'
import json, sys
names = [s["name"] for s in json.load(open(sys.argv[1]))["skipped"]]
assert len(names) == 8 and names == sorted(names), names
PYEOF
# a vision tensor in two entries is a duplicate like any other (it was listed twice)
$PY - "$T/vis" "$T/dup.safetensors" <<'PYEOF'
import os, sys
sys.path.insert(0, os.path.join(os.environ["K3_SRC"], "tests", "reference"))
from safetensors_io import ModelDir, write_safetensors
ck = ModelDir(sys.argv[1])
n = "mm_projector.pre_norm.weight"
write_safetensors(sys.argv[2], [(n, ck.dtype(n), ck.shape(n), ck.get(n))])
PYEOF
cp "$T/vis_rev.tar" "$T/dup.tar"
tar -rf "$T/dup.tar" -C "$T" dup.safetensors
expect_exit 1 "$K3_BIN/k3pack" "$T/dup.tar" -o "$T/o4"
expect_err "'mm_projector.pre_norm.weight' appears twice"
no_manifest "$T/o4"
# archives as people make them: config.json after the weights (tar -cf - . lists files in
# directory order). An archive file is read twice (a first pass finds config.json) and gives the
# directory's pack byte for byte, uncompressed and compressed; on stdin the error gives a command,
# and that command (GNU tar) makes an archive k3pack takes from stdin
"$K3_BIN/k3pack" -q "$T/ck" -o "$T/dirpack"
(cd "$T/ck" && tar -cf "$T/late.tar" $(ls | grep -v '^config.json$') config.json)
[ "$(tar -tf "$T/late.tar" | tail -1)" = config.json ] || fail "config.json is not last in the test archive"
zstd -q -f "$T/late.tar" -o "$T/late.tar.zst"
gzip -c "$T/late.tar" > "$T/late.tar.gz"
for x in tar tar.zst tar.gz; do
    "$K3_BIN/k3pack" -v "$T/late.$x" -o "$T/late_$x" 2>"$T/err" || { cat "$T/err"; fail "config.json last in a .$x"; }
    expect_err "reading the archive once to find it"
    diff -r "$T/dirpack" "$T/late_$x" >/dev/null || fail "the pack from a .$x with config.json last differs"
done
(cd "$T/ck" && tar -cf "$T/dot.tar" .)
"$K3_BIN/k3pack" -q "$T/dot.tar" -o "$T/dot"
diff -r "$T/dirpack" "$T/dot" >/dev/null || fail "the pack from 'tar -cf - .' differs"
expect_exit 2 sh -c "zstd -dc \"\$2\" | \"\$0\" - -o \"\$1\"" "$K3_BIN/k3pack" "$T/o5" "$T/late.tar.zst"
expect_err "'tar -cf - --sort=name -C CHECKPOINT_DIR .'"
no_manifest "$T/o5"
tar -cf - --sort=name -C "$T/ck" . | "$K3_BIN/k3pack" -q - -o "$T/sorted" || fail "the archive the error suggests"
diff -r "$T/dirpack" "$T/sorted" >/dev/null || fail "the pack from the suggested command differs"
# a second config.json (after the one the first pass found) is still an error
cp "$T/late.tar" "$T/twice.tar"
(cd "$T/ck" && tar -rf "$T/twice.tar" config.json)
expect_exit 1 "$K3_BIN/k3pack" "$T/twice.tar" -o "$T/o6"
expect_err "config.json appears twice"
no_manifest "$T/o6"
echo "pack_archive: OK"

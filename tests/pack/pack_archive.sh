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
echo "pack_archive: OK"

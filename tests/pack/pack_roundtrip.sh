#!/bin/sh
# The tiny checkpoint packed from its directory, from a .tar.zst, a .tar.gz and
# stdin, with 1 and 2 threads, gives byte-identical packs; an independent reader
# (check_pack.py, from docs/FORMAT.md alone) finds every tensor bit-exact; and
# that reader does notice a damaged pack.
. "$(dirname "$0")/lib.sh"
make_ckpt tiny "$T/ck"
"$K3_BIN/k3pack" -q "$T/ck" -o "$T/dir1"
"$K3_BIN/k3pack" -q -t 2 "$T/ck" -o "$T/dir2"
make_tar "$T/ck" "$T/ck.tar.zst"
make_tar "$T/ck" "$T/ck.tar.gz"
"$K3_BIN/k3pack" -q "$T/ck.tar.zst" -o "$T/zst"
"$K3_BIN/k3pack" -q "$T/ck.tar.gz" -o "$T/gz"
zstd -dc "$T/ck.tar.zst" | "$K3_BIN/k3pack" -q - -o "$T/stdin"
for p in dir2 zst gz stdin; do
    diff -r "$T/dir1" "$T/$p" >/dev/null || fail "pack from $p differs from the directory pack"
done
$PY "$K3_SRC/tests/pack/check_pack.py" "$T/dir1" "$T/ck"
[ ! -e "$T/dir1/.k3pack.journal" ] && [ ! -e "$T/dir1/.k3pack.lock" ] || fail "journal or lock left behind"
# the checker can fail: one flipped byte in a trunk tensor
cp -r "$T/dir1" "$T/bad"
printf '\377' | dd of="$T/bad/trunk-layer-002.k3s" bs=1 seek=4100 conv=notrunc 2>/dev/null
expect_exit 1 $PY "$K3_SRC/tests/pack/check_pack.py" "$T/bad" "$T/ck"
# the single-file form: one .safetensors with config.json beside it
$PY - "$T/ck" "$T/one" <<'PYEOF'
import os, shutil, sys
sys.path.insert(0, os.path.join(os.environ["K3_SRC"], "tests", "reference"))
from safetensors_io import ModelDir, write_safetensors
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst)
ck = ModelDir(src)
write_safetensors(os.path.join(dst, "model.safetensors"), [(n, ck.dtype(n), ck.shape(n), ck.get(n)) for n in ck.names])
for f in ("config.json", "tiktoken.model", "tokenizer_config.json"):
    shutil.copy(os.path.join(src, f), dst)
PYEOF
"$K3_BIN/k3pack" -q "$T/one/model.safetensors" -o "$T/single"
same_but_download "$T/dir1" "$T/single" || fail "pack from a single .safetensors differs"
# ... whose download record names its one file
grep -q '"name": "model.safetensors"' "$T/single/manifest.json" || fail "the single-file pack's download record"
echo "pack_roundtrip: OK"

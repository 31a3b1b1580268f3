#!/bin/sh
# Malformed checkpoints and archives get a clear error, a non-zero exit and no
# pack that looks complete (no manifest.json): truncated tar, a tensor with the
# wrong shape, a missing tensor, an unexpected tensor, a shard whose size does
# not match its header, a wrong config, config.json after the weights, and
# usage errors; also a finished or foreign output directory is left alone.
. "$(dirname "$0")/lib.sh"
make_ckpt tiny "$T/ck"
no_manifest() { [ ! -e "$1/manifest.json" ] || fail "$1 has a manifest after a failed run"; }

# rewrite one shard of a copy of the checkpoint through Python (edit: drop|reshape|extra)
edit_ckpt() {   # edit_ckpt EDIT OUTDIR
    cp -r "$T/ck" "$2"
    $PY - "$2" "$1" <<'PYEOF'
import json, os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.environ["K3_SRC"], "tests", "reference"))
from safetensors_io import ModelDir, write_safetensors
d, edit = sys.argv[1], sys.argv[2]
ck = ModelDir(d)
victim = "language_model.model.layers.1.self_attn.q_proj.weight"
fname = ck.where[victim]
st = ck.files[fname]
out = []
for n in st.names:
    dt, shape = st.info[n][0], st.info[n][1]
    a = np.array(st.get(n))
    if n == victim and edit == "drop":
        continue
    if n == victim and edit == "reshape":
        shape = (shape[0] * 2, shape[1] // 2)
        a = a.reshape(shape)
    out.append((n, dt, shape, a))
if edit == "extra":
    out.append(("language_model.model.layers.1.self_attn.surprise.weight", "BF16", (4,), np.zeros(4, np.uint16)))
write_safetensors(os.path.join(d, fname), out, metadata={"format": "pt"})
idx = os.path.join(d, "model.safetensors.index.json")
j = json.load(open(idx))
if edit == "drop":
    del j["weight_map"][victim]
if edit == "extra":
    j["weight_map"]["language_model.model.layers.1.self_attn.surprise.weight"] = fname
json.dump(j, open(idx, "w"), indent=2)
PYEOF
}

edit_ckpt drop "$T/drop"
expect_exit 1 "$K3_BIN/k3pack" "$T/drop" -o "$T/o1"
expect_err "tensor 'language_model.model.layers.1.self_attn.q_proj.weight' is missing"
[ ! -e "$T/o1" ] || fail "output created although the input was invalid"
make_tar "$T/drop" "$T/drop.tar"
expect_exit 1 "$K3_BIN/k3pack" "$T/drop.tar" -o "$T/o1t"
expect_err "missing, first 'language_model.model.layers.1.self_attn.q_proj.weight'"
no_manifest "$T/o1t"

edit_ckpt reshape "$T/reshape"
expect_exit 1 "$K3_BIN/k3pack" "$T/reshape" -o "$T/o2"
expect_err "q_proj.weight' in 'model-0000"
expect_err "the config needs BF16"
make_tar "$T/reshape" "$T/reshape.tar"
expect_exit 1 "$K3_BIN/k3pack" "$T/reshape.tar" -o "$T/o2t"
expect_err "the config needs BF16"
no_manifest "$T/o2t"

edit_ckpt extra "$T/extra"
expect_exit 1 "$K3_BIN/k3pack" "$T/extra" -o "$T/o3"
expect_err "'language_model.model.layers.1.self_attn.surprise.weight' in 'model-0000"

# a shard cut short (its header promises more data)
cp -r "$T/ck" "$T/short"
f=$(ls "$T/short"/model-00002-*.safetensors)
truncate -s -100 "$f"
expect_exit 1 "$K3_BIN/k3pack" "$T/short" -o "$T/o4"
expect_err "model-00002-of-"

# a truncated archive
make_tar "$T/ck" "$T/full.tar"
size=$(stat -c %s "$T/full.tar")
head -c $((size / 2)) "$T/full.tar" > "$T/trunc.tar"
expect_exit 1 "$K3_BIN/k3pack" "$T/trunc.tar" -o "$T/o5"
no_manifest "$T/o5"
head -c $((size / 2)) "$T/full.tar" | zstd -q -c > "$T/trunc.tar.zst"
expect_exit 1 "$K3_BIN/k3pack" "$T/trunc.tar.zst" -o "$T/o6"
no_manifest "$T/o6"

# config.json after the weights in an archive on stdin (read once): refused, with the command
# that makes a suitable archive (an archive file is read twice instead: pack_archive.sh)
(cd "$T/ck" && tar -cf "$T/late.tar" model-00001-of-00004.safetensors config.json)
expect_exit 2 sh -c "\"\$0\" - -o \"\$1\" < \"\$2\"" "$K3_BIN/k3pack" "$T/o7" "$T/late.tar"
expect_err "comes before config.json"
expect_err "tar -cf - --sort=name -C CHECKPOINT_DIR ."

# a config that does not match the tensors (more experts than the shards hold)
cp -r "$T/ck" "$T/cfg"
$PY - "$T/cfg/config.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["text_config"]["num_experts"] += 4
json.dump(c, open(sys.argv[1], "w"), indent=2)
PYEOF
expect_exit 1 "$K3_BIN/k3pack" "$T/cfg" -o "$T/o8"
expect_err "is missing"

# a tokenizer file that cannot be read is an error, not "no tokenizer" (as from an archive)
cp -r "$T/ck" "$T/bigtok"
truncate -s 65M "$T/bigtok/tokenizer_config.json"
expect_exit 1 "$K3_BIN/k3pack" "$T/bigtok" -o "$T/o12"
expect_err "tokenizer_config.json' is 68157440 bytes"
[ ! -e "$T/o12" ] || fail "output created although the input was invalid"

# not an archive, not a checkpoint
echo "hello" > "$T/junk.tar"
expect_exit 1 "$K3_BIN/k3pack" "$T/junk.tar" -o "$T/o9"
expect_exit 3 "$K3_BIN/k3pack" "$T/nonexistent" -o "$T/o10"

# usage
expect_exit 2 "$K3_BIN/k3pack" "$T/ck"
expect_err "missing '-o PACK'"
expect_exit 2 "$K3_BIN/k3pack" "$T/ck" -o "$T/o11" --experts int4
expect_exit 2 "$K3_BIN/k3pack" --bogus
expect_exit 0 "$K3_BIN/k3pack" --help
grep -q "^Usage: k3pack" "$T/out" || fail "--help not on stdout"
expect_exit 0 "$K3_BIN/k3pack" --version
# a bad environment value is warned about and ignored; the same value as a flag is an error
K3_THREADS=0 "$K3_BIN/k3pack" --dry-run "$T/ck" > /dev/null 2>"$T/err" || fail "K3_THREADS=0 in the environment is fatal"
expect_err "ignoring environment variable K3_THREADS=0"
expect_exit 2 "$K3_BIN/k3pack" --dry-run -t 0 "$T/ck"

# the output directory: a finished pack is kept unless --force, foreign files are never touched
"$K3_BIN/k3pack" -q "$T/ck" -o "$T/good"
expect_exit 2 "$K3_BIN/k3pack" "$T/ck" -o "$T/good"
expect_err "already holds a finished pack"
# the refused run leaves nothing behind (a stray lock made k3verify fail the pack)
[ ! -e "$T/good/.k3pack.lock" ] || fail "a refused run left .k3pack.lock in a finished pack"
"$K3_BIN/k3verify" -q "$T/good" || fail "k3verify fails a finished pack after a refused k3pack run"
"$K3_BIN/k3pack" -q --force "$T/ck" -o "$T/good"
$PY "$K3_SRC/tests/pack/check_pack.py" "$T/good" "$T/ck" >/dev/null
mkdir "$T/foreign" && echo precious > "$T/foreign/notes.txt"
expect_exit 2 "$K3_BIN/k3pack" "$T/ck" -o "$T/foreign"
expect_err "not a k3pack output"
[ "$(cat "$T/foreign/notes.txt")" = precious ] || fail "foreign file touched"
[ "$(ls -A "$T/foreign")" = notes.txt ] || fail "k3pack left files in a directory it refused: $(ls -A "$T/foreign")"
# a dotfile that only looks like a temporary (k3pack's are .NAME.k3tmp-PID) is foreign too:
# it was neither refused nor removed, and stayed in the finished pack
mkdir "$T/foreign2" && echo draft > "$T/foreign2/.notes.k3tmp-draft"
expect_exit 2 "$K3_BIN/k3pack" "$T/ck" -o "$T/foreign2"
expect_err "not a k3pack output"
# a second k3pack on the same output is refused while the first holds the lock
mkdir "$T/locked"
flock "$T/locked" sleep 3 &
sleep 0.5
expect_exit 3 "$K3_BIN/k3pack" "$T/ck" -o "$T/locked"
expect_err "locked"
wait
# not enough free space: refused before writing (needs a small tmpfs: root)
mkdir -p "$T/small_fs"
if mount -t tmpfs -o size=4m tmpfs "$T/small_fs" 2>/dev/null; then
    set +e
    "$K3_BIN/k3pack" "$T/ck" -o "$T/small_fs/p" >"$T/out" 2>"$T/err"
    rc=$?
    set -e
    leftover=$(ls -A "$T/small_fs/p" 2>/dev/null | grep -v '^\.k3pack\.lock$' || true)
    umount "$T/small_fs"
    [ "$rc" -eq 3 ] || { cat "$T/err"; fail "no-space run exited $rc, expected 3"; }
    expect_err "the pack needs"
    [ -z "$leftover" ] || fail "files written although space was short: $leftover"
    # free space between the shards' size and that plus the 1/64 margin: refused, and the
    # message must not say there is more free space than the pack needs
    need=$("$K3_BIN/k3pack" -n --json "$T/ck" | $PY -c "import json,sys; print(json.loads(sys.stdin.readlines()[-1])['pack_bytes'])")
    mount -t tmpfs -o size=$((need + need / 128)) tmpfs "$T/small_fs"
    set +e
    "$K3_BIN/k3pack" "$T/ck" -o "$T/small_fs/p" >"$T/out" 2>"$T/err"
    rc=$?
    set -e
    umount "$T/small_fs"
    [ "$rc" -eq 3 ] || { cat "$T/err"; fail "margin run exited $rc, expected 3"; }
    $PY - "$T/err" <<'PYEOF' || { cat "$T/err"; fail "the no-space message contradicts itself"; }
import re, sys
m = re.search(r"has ([0-9.]+) MiB free; the pack needs ([0-9.]+) MiB more", open(sys.argv[1]).read())
sys.exit(0 if m and float(m.group(1)) < float(m.group(2)) else 1)
PYEOF
else
    echo "pack_bad_input: free-space check skipped (cannot mount a tmpfs here)"
fi
echo "pack_bad_input: OK"

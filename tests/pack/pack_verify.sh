#!/bin/sh
# k3verify on a real pack made by k3pack from the tiny checkpoint: OK as made;
# then one damage at a time (a flipped bit in an expert record, in a trunk
# tensor, in a shard header, in manifest.json; a truncated shard; a deleted
# shard; an unlisted extra file; a shard removed with its manifest entries, so the
# pack is incomplete for its config): each gives exit 1 and names what is damaged.
. "$(dirname "$0")/lib.sh"
make_ckpt tiny "$T/ck"
"$K3_BIN/k3pack" -q "$T/ck" -o "$T/good"
"$K3_BIN/k3verify" "$T/good" > "$T/ok.txt" || fail "k3verify rejects a fresh pack"
grep -q "experts-layer-003.k3s: OK" "$T/ok.txt" || fail "no OK line for an expert shard"
"$K3_BIN/k3verify" --quick "$T/good" > /dev/null || fail "--quick rejects a fresh pack"
# the pack's identity (manifest.json's own XXH3-128), for comparison with a published value
"$K3_BIN/k3verify" --json "$T/good" > "$T/ok.json" 2>"$T/ok.err" || fail "--json on a fresh pack"
$PY - "$T/good/manifest.json" "$T/ok.json" "$T/ok.err" <<'PYEOF'
import json, sys, xxhash
want = xxhash.xxh3_128_hexdigest(open(sys.argv[1], "rb").read())
summary = [json.loads(l) for l in open(sys.argv[2])][-1]
assert summary["type"] == "summary" and summary["manifest_xxh3_128"] == want, (summary, want)
PYEOF
"$K3_BIN/k3verify" -q "$T/good" 2>"$T/id.err" >/dev/null
[ ! -s "$T/id.err" ] || fail "-q prints the identity line"
"$K3_BIN/k3verify" "$T/good" 2>"$T/id.err" >/dev/null
grep -q "manifest.json XXH3-128 $($PY -c "import xxhash,sys; print(xxhash.xxh3_128_hexdigest(open(sys.argv[1],'rb').read()))" "$T/good/manifest.json")" "$T/id.err" \
    || { cat "$T/id.err"; fail "no identity line"; }
"$K3_BIN/k3verify" --checkpoint "$T/ck" > /dev/null || fail "--checkpoint rejects the tiny checkpoint"

# offsets from the manifest, so the damage lands where intended
loc() {   # loc WHAT -> "shard offset" of a byte inside WHAT
    $PY - "$T/good/manifest.json" "$1" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
what = sys.argv[2]
if what == "expert":             # expert 5 of the first MoE layer, a byte in its w3 part
    x = m["expert_layers"][0]
    part = [p for p in x["parts"] if p["name"].startswith("w3")][0]
    print(x["shard"], x["offset"] + 5 * x["stride"] + part["offset"] + 3, x["layer"])
else:                            # a byte in the middle of a named trunk tensor
    t = [t for t in m["tensors"] if t["name"] == what][0]
    print(t["shard"], t["offset"] + t["size"] // 2, 0)
PYEOF
}
flip() {   # flip FILE OFFSET : invert one bit
    $PY -c "
import sys
p, o = sys.argv[1], int(sys.argv[2])
b = bytearray(open(p, 'rb').read()); b[o] ^= 0x10; open(p, 'wb').write(b)" "$1" "$2"
}
damaged() {   # damaged NAME : fresh copy of the good pack in $T/NAME
    rm -rf "$T/$1"; cp -r "$T/good" "$T/$1"; D="$T/$1"
}

damaged expert
set -- $(loc expert)
flip "$D/$1" "$2"
expect_exit 1 "$K3_BIN/k3verify" "$D"
grep -q "$1: FAILED (expert 5 of layer $3" "$T/out" || { cat "$T/out"; fail "expert damage not named"; }

damaged trunk
name=language_model.model.layers.3.self_attn.kv_b_proj.weight
short=${name#language_model.}
set -- $(loc "$short")
flip "$D/$1" "$2"
expect_exit 1 "$K3_BIN/k3verify" "$D"
grep -q "$1: FAILED (tensor '$short'" "$T/out" || { cat "$T/out"; fail "trunk damage not named"; }

damaged header
flip "$D/trunk-layer-004.k3s" 200
expect_exit 1 "$K3_BIN/k3verify" "$D"
grep -q "trunk-layer-004.k3s: FAILED (header" "$T/out" || { cat "$T/out"; fail "header damage not named"; }

damaged manifest
sed -i 's/"format_version": 2/"format_version": 7/' "$D/manifest.json"
expect_exit 1 "$K3_BIN/k3verify" "$D"
grep -q "manifest.json: FAILED" "$T/out" || { cat "$T/out" "$T/err"; fail "manifest damage not named"; }

damaged truncated
truncate -s -4096 "$D/experts-layer-002.k3s"
expect_exit 1 "$K3_BIN/k3verify" "$D"
grep -q "experts-layer-002.k3s: FAILED (size" "$T/out" || { cat "$T/out"; fail "truncation not named"; }

damaged deleted
rm "$D/trunk-layer-006.k3s"
expect_exit 1 "$K3_BIN/k3verify" "$D"
grep -q "trunk-layer-006.k3s: FAILED (missing" "$T/out" || { cat "$T/out"; fail "deletion not named"; }

damaged extra
echo hi > "$D/stray.bin"
expect_exit 1 "$K3_BIN/k3verify" "$D"
grep -q "stray.bin: FAILED (not listed in the manifest" "$T/out" || { cat "$T/out"; fail "unlisted file not named"; }

# incomplete for the model its config describes: a shard removed together with its
# manifest entries (the bytes left all match) is still found
drop() {   # drop SHARD : remove SHARD and every manifest entry that names it
    rm "$D/$1"
    $PY - "$D/manifest.json" "$1" <<'PYEOF'
import json, os, sys
sys.path.insert(0, os.environ["K3_SRC"] + "/tests/pack")
from check_pack import seal
p, shard = sys.argv[1], sys.argv[2]
m = json.load(open(p))
m["shards"] = [s for s in m["shards"] if s["name"] != shard]
m["tensors"] = [t for t in m["tensors"] if t["shard"] != shard]
m["expert_layers"] = [x for x in m["expert_layers"] if x["shard"] != shard]
open(p, "wb").write(seal(m))
PYEOF
}
damaged incomplete-trunk
drop trunk-layer-005.k3s
expect_exit 1 "$K3_BIN/k3verify" "$D"
grep -q "manifest.json: FAILED (tensor 'model.layers.5.input_layernorm.weight' the config needs is not in the pack" \
    "$T/out" || { cat "$T/out"; fail "a missing trunk layer not named"; }
expect_exit 1 "$K3_BIN/k3verify" --quick "$D"
grep -q "manifest.json: FAILED (tensor 'model.layers.5." "$T/out" || { cat "$T/out"; fail "--quick misses a missing layer"; }
damaged incomplete-experts
drop experts-layer-004.k3s
expect_exit 1 "$K3_BIN/k3verify" "$D"
grep -q "manifest.json: FAILED (the experts of layer 4 the config needs are not in the pack)" "$T/out" \
    || { cat "$T/out"; fail "a missing expert layer not named"; }
grep -q "experts-layer-003.k3s: OK" "$T/out" || { cat "$T/out"; fail "other expert shards not OK"; }
# an expert layer whose records do not all exist: fewer records, consistently
damaged fewer-experts
$PY - "$D/manifest.json" <<'PYEOF'
import json, os, sys
sys.path.insert(0, os.environ["K3_SRC"] + "/tests/pack")
from check_pack import seal
p = sys.argv[1]
m = json.load(open(p))
x = [x for x in m["expert_layers"] if x["layer"] == 2][0]
x["count"] -= 1
x["xxh3_64"] = x["xxh3_64"][:-1]
open(p, "wb").write(seal(m))
PYEOF
expect_exit 1 "$K3_BIN/k3verify" --quick "$D"
grep -q "layer 2 has 31 experts in the pack, the config needs 32" "$T/out" \
    || { cat "$T/out"; fail "a short expert layer not named"; }

# an unfinished pack (no manifest) is not mistaken for a pack
damaged unfinished
rm "$D/manifest.json"
expect_exit 1 "$K3_BIN/k3verify" "$D"
echo "pack_verify: OK"

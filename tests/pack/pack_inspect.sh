#!/bin/sh
# k3inspect on a pack shows the same model as on its checkpoint: the same
# tensors (vision aside) with the same params and bytes per layer and per kind,
# plus the shard table and the expert record layout (text and JSON); a damaged
# shard header is shown as DAMAGED with a warning, not a crash.
. "$(dirname "$0")/lib.sh"
make_ckpt tiny "$T/ck"
"$K3_BIN/k3pack" -q "$T/ck" -o "$T/p"
"$K3_BIN/k3inspect" --summary --json "$T/ck" > "$T/ck.json"
"$K3_BIN/k3inspect" --summary --json "$T/p" > "$T/p.json"
"$K3_BIN/k3inspect" --json "$T/p" > "$T/plist.json"
"$K3_BIN/k3inspect" --json "$T/ck" > "$T/cklist.json"
$PY - "$T" <<'PYEOF'
import json, os, sys
T = sys.argv[1]
ck, p = json.load(open(T + "/ck.json")), json.load(open(T + "/p.json"))
kinds = lambda d: {k["kind"]: (k["tensors"], k["params"], k["bytes"]) for k in d["kinds"] if k["kind"] != "vision" and k["tensors"]}
assert kinds(ck) == kinds(p), (kinds(ck), kinds(p))
layers = lambda d: [(l["kind"], l["params"], l["bytes"]) for l in d["layers"]]
assert layers(ck) == layers(p), "per-layer totals differ"
m = json.load(open(T + "/p/manifest.json"))
assert [s["name"] for s in p["pack"]["shards"]] == [s["name"] for s in m["shards"]]
assert all(s["header_ok"] for s in p["pack"]["shards"])
rec = p["pack"]["expert_record"]
assert rec["record_size"] == m["expert_layers"][0]["record_size"] and [q["name"] for q in rec["parts"]] == \
    ["w1.weight_packed", "w1.weight_scale", "w3.weight_packed", "w3.weight_scale", "w2.weight_packed", "w2.weight_scale"]
# every checkpoint tensor but the vision ones is listed with the same name, shape and bytes
# (dtype differs only where the pack names the encoding: U8 packed -> F4 with logical columns, U8 scale -> F8_E8M0)
lst = {t["name"]: t for t in json.load(open(T + "/plist.json"))["tensors"]}
for t in json.load(open(T + "/cklist.json"))["tensors"]:
    if t["name"].startswith(("vision_tower.", "mm_projector.")):
        assert t["name"] not in lst
        continue
    q = lst.pop(t["name"])
    assert q["bytes"] == t["bytes"], t["name"]
    if t["name"].endswith("weight_packed"):
        assert q["dtype"] == "F4" and q["shape"] == [t["shape"][0], 2 * t["shape"][1]], (t, q)
    elif t["name"].endswith("weight_scale"):
        assert q["dtype"] == "F8_E8M0" and q["shape"] == t["shape"], (t, q)
    else:
        assert (q["dtype"], q["shape"]) == (t["dtype"], t["shape"]), (t, q)
assert not lst, "pack lists tensors the checkpoint lacks: %s" % list(lst)[:3]
print("pack and checkpoint agree on %d kinds" % len(kinds(p)))
PYEOF
# the layer kinds k3inspect reports are the config's schedule (1-based kda_layers, 0-based MoE test)
for preset in tiny small; do
    [ "$preset" = tiny ] && dir="$T/ck" || { make_ckpt small "$T/small"; dir="$T/small"; }
    "$K3_BIN/k3inspect" --summary --json "$dir" > "$T/kinds.json"
    $PY - "$dir/config.json" "$T/kinds.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))["text_config"]
got = [(l["layer"], l["kind"]) for l in json.load(open(sys.argv[2]))["layers"]]
kda = set(c["linear_attn_config"]["kda_layers"])
want = [(i, ("KDA" if i + 1 in kda else "MLA") + ("+MoE" if i >= c["first_k_dense_replace"] and i % c["moe_layer_freq"] == 0 else "+dense"))
        for i in range(c["num_hidden_layers"])]
assert got == want, (got, want)
assert want[-1][1].startswith("MLA") and want[-2][1].startswith("MLA") and want[0][1] == "KDA+dense"
print("layer kinds match the config: %s" % " ".join(k for _, k in got))
PYEOF
done
"$K3_BIN/k3inspect" --shards "$T/p" > "$T/shards.txt"
grep -q "^experts-layer-001.k3s *experts *1 .* ok$" "$T/shards.txt" || { cat "$T/shards.txt"; fail "shard table"; }
grep -q "^w2.weight_scale *E8M0" "$T/shards.txt" || fail "record layout"
expect_exit 2 "$K3_BIN/k3inspect" --shards "$T/ck"
# damage a shard header: still shown, marked, warned about
printf '\377' | dd of="$T/p/trunk-layer-002.k3s" bs=1 seek=40 conv=notrunc 2>/dev/null
expect_exit 0 "$K3_BIN/k3inspect" --shards "$T/p"
grep -q "^trunk-layer-002.k3s .* DAMAGED$" "$T/out" || { cat "$T/out"; fail "damaged header not marked"; }
expect_err "trunk-layer-002.k3s"
rm "$T/p/trunk-layer-004.k3s"
expect_exit 0 "$K3_BIN/k3inspect" --summary "$T/p"
expect_err "shard 'trunk-layer-004.k3s' is missing"
rm "$T/p/manifest.json"
expect_exit 1 "$K3_BIN/k3inspect" "$T/p"
echo "pack_inspect: OK"

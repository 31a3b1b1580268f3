#!/bin/sh
# k3inspect CLI: help, version, exit codes (0 ok, 1 bad data, 2 usage, 3 i/o),
# the three views on small files, --filter, config handling, escaping.
# Environment (set by ctest): K3INSPECT K3_MKLAYOUT K3_TEST_DATA K3_TEST_TMP PYTHON
set -u
T="$K3_TEST_TMP/cli_k3inspect"
rm -rf "$T" && mkdir -p "$T" || exit 1
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# run ARGS...: sets rc, and $T/out, $T/err
run() { "$K3INSPECT" "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" = "$1" ] || fail "$2: exit $rc, expected $1 (stderr: $(cat "$T/err"))"; }
out_has() { grep -qF -- "$1" "$T/out" || fail "$2: stdout lacks '$1'"; }
err_has() { grep -qF -- "$1" "$T/err" || fail "$2: stderr lacks '$1'"; }
out_empty() { [ ! -s "$T/out" ] || fail "$1: stdout not empty"; }
err_empty() { [ ! -s "$T/err" ] || fail "$1: stderr not empty: $(cat "$T/err")"; }
json_ok() { "$PYTHON" -c 'import json,sys; json.load(open(sys.argv[1]))' "$T/out" || fail "$1: stdout is not JSON"; }

# --- fixtures -------------------------------------------------------------------
"$PYTHON" - "$T" <<'EOF' || exit 1
import json, struct, sys
d = sys.argv[1]
def st(path, header, data_len, raw=None):
    h = raw if raw is not None else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h))); f.write(h); f.write(b"\0" * data_len)
good = {"__metadata__": {"format": "pt"},
        "model.layers.0.self_attn.q_conv1d.weight": {"dtype": "F32", "shape": [4, 1, 2], "data_offsets": [0, 32]},
        "model.layers.0.mlp.gate_proj.weight": {"dtype": "BF16", "shape": [3, 2], "data_offsets": [32, 44]},
        "model.layers.1.block_sparse_moe.experts.0.w1.weight_packed": {"dtype": "U8", "shape": [2, 16], "data_offsets": [44, 76]},
        "model.layers.1.block_sparse_moe.experts.0.w1.weight_scale": {"dtype": "U8", "shape": [2, 1], "data_offsets": [76, 78]},
        "bad\u001b[2Jname": {"dtype": "U8", "shape": [], "data_offsets": [78, 79]}}
st(d + "/good.safetensors", good, 79)
st(d + "/bad.safetensors", {"a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 4]}}, 4)
EOF

# --- help, version, usage errors -------------------------------------------------
run --help
expect_rc 0 "--help"; err_empty "--help"
for s in "Usage: k3inspect [OPTIONS] SRC" "--summary" "--json" "--filter GLOB" "--config PATH" \
         "--no-config" "-q, --quiet" "-v, --verbose" "--version" "Exit status:" "2  usage error" \
         "Example:" "2 weights per U8 byte" "[default: all tensors]"; do
    out_has "$s" "--help"
done
run -h
expect_rc 0 "-h"
run --version
expect_rc 0 "--version"; out_has "k3inspect " "--version"; err_empty "--version"
run --bogus "$T/good.safetensors"
expect_rc 2 "unknown option"; err_has "unknown option '--bogus'" "unknown option"; out_empty "unknown option"
err_has "Try 'k3inspect --help'" "unknown option"
run
expect_rc 2 "no SRC"; err_has "missing SRC" "no SRC"
run "$T/good.safetensors" "$T/good.safetensors"
expect_rc 2 "two SRC"
run --filter
expect_rc 2 "--filter without value"; err_has "needs a value" "--filter without value"
run --config x --no-config "$T/good.safetensors"
expect_rc 2 "--config with --no-config"

# --- i/o and data errors ----------------------------------------------------------
run "$T/missing.safetensors"
expect_rc 3 "missing file"; err_has "error: cannot open '$T/missing.safetensors': No such file or directory" "missing file"
out_empty "missing file"
run "$T/bad.safetensors"
expect_rc 1 "bad file"; err_has "error: '$T/bad.safetensors': tensor 'a': data_offsets [0, 4) hold 4 bytes but shape [3] x BF16 needs 6 bytes" "bad file"
out_empty "bad file"
run --summary --json "$T/bad.safetensors"
expect_rc 1 "bad file, --summary --json"; out_empty "bad file json"
if [ -w /dev/full ]; then
    "$K3INSPECT" "$T/good.safetensors" >/dev/full 2>"$T/err"; rc=$?
    expect_rc 3 "write error"; err_has "cannot write to standard output" "write error"
fi

# FIFOs where a shard or config.json should be: refused at once, never a blocked open()
mkdir -p "$T/fifo" && mkfifo "$T/fifo/model-00001-of-00001.safetensors" && \
    printf '{"weight_map": {"a": "model-00001-of-00001.safetensors"}}' >"$T/fifo/model.safetensors.index.json" || exit 1
rc=0; timeout 20 "$K3INSPECT" "$T/fifo" >"$T/out" 2>"$T/err" || rc=$?
expect_rc 1 "FIFO shard"; err_has "is not a regular file" "FIFO shard"
mkdir -p "$T/fifo2" && cp "$T/good.safetensors" "$T/fifo2/model.safetensors" && mkfifo "$T/fifo2/config.json" || exit 1
rc=0; timeout 20 "$K3INSPECT" "$T/fifo2" >"$T/out" 2>"$T/err" || rc=$?
expect_rc 1 "FIFO config.json"; err_has "is not a regular file" "FIFO config.json"

# a hostile pack manifest (no shards on disk): names with escape sequences; --shards must
# escape every name. A 4-D part shape of 19-digit dims (once a stack overflow in the shard
# table) is now refused by the manifest reader itself: its size cannot match shape x encoding.
mkdir -p "$T/hpack" || exit 1
"$PYTHON" - "$T/hpack/manifest.json" <<'EOF' || exit 1
import json, os, sys
sys.path.insert(0, os.environ["K3_TEST_TOOLS"] + "/../pack")
from check_pack import seal
big = 4611686018427387904
sh = "experts-layer-001\u001b[2J.k3s"
m = {"format": "k3-pack", "format_version": 2, "byte_order": "little", "generator": "x", "name_prefix": "p\u001b[31m.",
     "hashes": {}, "config": {}, "files": [], "tensors": [], "skipped": [],
     "experts": {"encoding": "MXFP4", "source": "checkpoint", "layout": "w1,w3,w2;packed,scale", "quantization": None},
     "shards": [{"name": sh, "kind": "experts", "layer": 1, "size": 8192, "header_hash": "0" * 16, "xxh3_128": "0" * 32}],
     "expert_layers": [{"layer": 1, "shard": sh, "count": 1, "offset": 4096, "stride": 4096, "record_size": 64,
                        "parts": [{"name": "w1\u001b]0;x\u0007", "encoding": "MXFP4", "shape": [2, 64],
                                   "offset": 0, "size": 64}], "xxh3_64": ["0" * 16]}]}
open(sys.argv[1], "wb").write(seal(m))
m["expert_layers"][0]["parts"][0]["shape"] = [big] * 4
open(sys.argv[1] + ".big", "wb").write(seal(m))
EOF
run --no-config --shards "$T/hpack"
expect_rc 0 "hostile pack --shards"
out_has "[2, 64]" "hostile pack shape"
out_has 'experts-layer-001\x1b[2J.k3s' "hostile pack shard name"; out_has 'w1\x1b]0;x\x07' "hostile pack part name"
out_has "prefix 'p\x1b[31m.'" "hostile pack prefix"
grep -q "$(printf '\033')" "$T/out" "$T/err" && fail "hostile pack: raw ESC byte in output"
run --no-config --summary --json "$T/hpack"
expect_rc 0 "hostile pack --json"; json_ok "hostile pack --json"
mkdir -p "$T/hpack-big" && mv "$T/hpack/manifest.json.big" "$T/hpack-big/manifest.json" || exit 1
run --no-config --shards "$T/hpack-big"
expect_rc 1 "hostile pack, 19-digit shape"; err_has "do not match its shape and encoding" "hostile pack, 19-digit shape"

# --- default view ------------------------------------------------------------------
run "$T/good.safetensors"
expect_rc 0 "list"; err_empty "list"
[ "$(wc -l <"$T/out")" -eq 6 ] || fail "list: expected header + 5 rows, got $(wc -l <"$T/out")"
head -1 "$T/out" | grep -q '^name  *dtype  *shape  *bytes  *file  *offset$' || fail "list: header row: $(head -1 "$T/out")"
out_has 'bad\x1b[2Jname' "list escapes control bytes"
grep -q "$(printf '\033')" "$T/out" && fail "list: raw ESC byte in output"
hdr_end=$("$PYTHON" -c 'import struct,sys; print(8+struct.unpack("<Q",open(sys.argv[1],"rb").read(8))[0])' "$T/good.safetensors")
grep -q "^model.layers.0.self_attn.q_conv1d.weight  *F32  *\[4, 1, 2\]  *32  *good.safetensors  *$hdr_end\$" "$T/out" \
    || fail "list: q_conv1d row: $(grep q_conv1d "$T/out")"
grep -q "^model.layers.0.mlp.gate_proj.weight  *BF16  *\[3, 2\]  *12  *good.safetensors  *$((hdr_end + 32))\$" "$T/out" \
    || fail "list: gate_proj row"
# columns line up: every row has 'good.safetensors' at the same column
"$PYTHON" - "$T/out" <<'EOF' || fail "list: columns not aligned"
import sys
rows = open(sys.argv[1], encoding="utf-8").read().splitlines()
cols = {r.index("good.safetensors") for r in rows[1:]}
assert len(cols) == 1 and rows[0].index("file") in cols, cols
EOF

# --- --json -------------------------------------------------------------------------
run --json "$T/good.safetensors"
expect_rc 0 "json"; json_ok "json"
"$PYTHON" - "$T/out" "$hdr_end" <<'EOF' || fail "json content"
import json, sys
j = json.load(open(sys.argv[1])); base = int(sys.argv[2])
assert j["schema"] == 1 and j["view"] == "tensors" and j["config"] is None and j["filter"] is None
assert len(j["files"]) == 1 and j["files"][0]["data_offset"] == base and j["files"][0]["size"] == base + 79
t = {x["name"]: x for x in j["tensors"]}
assert len(t) == 5
assert "bad\u001b[2Jname" in t                       # exact name, JSON-escaped
p = t["model.layers.1.block_sparse_moe.experts.0.w1.weight_packed"]
assert p["params"] == 64 and p["bytes"] == 32 and p["kind"] == "routed_experts" and p["layer"] == 1
assert t["model.layers.1.block_sparse_moe.experts.0.w1.weight_scale"]["params"] == 0
q = t["model.layers.0.self_attn.q_conv1d.weight"]
assert q["shape"] == [4, 1, 2] and q["offset"] == base and q["kind"] == "kda" and q["dtype"] == "F32"
assert j["totals"] == {"tensors": 5, "params": 8 + 6 + 64 + 0 + 1, "bytes": 79}
assert j["warnings"] == []
EOF

# --- --summary ----------------------------------------------------------------------
run --summary "$T/good.safetensors"
expect_rc 0 "summary"; err_empty "summary"
out_has "Layers (kinds from tensor names):" "summary"
grep -q '^0  *KDA+dense  *2  *14 ' "$T/out" || fail "summary: layer 0 row: $(grep '^0 ' "$T/out")"
grep -q '^1  *?+MoE  *2  *64 ' "$T/out" || fail "summary: layer 1 row: $(grep '^1 ' "$T/out")"
grep -q '^routed experts  *2  *64 ' "$T/out" || fail "summary: routed experts row"
out_has "Total: 5 tensors, 79 params (79), 79 bytes (79 B) in 1 file" "summary total"
run --summary --json "$T/good.safetensors"
expect_rc 0 "summary json"; json_ok "summary json"
"$PYTHON" - "$T/out" <<'EOF' || fail "summary json content"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["schema"] == 1 and j["view"] == "summary"
L = {x["layer"]: x for x in j["layers"]}
assert L[0]["kind"] == "KDA+dense" and L[0]["attention"] == "kda" and L[0]["ffn"] == "dense"
assert L[1]["kind"] == "?+MoE" and L[1]["params"] == 64 and L[1]["bytes"] == 34
assert j["outside_layers"] == {"tensors": 1, "params": 1, "bytes": 1}
K = {x["kind"]: x for x in j["kinds"]}
assert K["routed_experts"]["tensors"] == 2 and K["other"]["tensors"] == 1
assert j["totals"] == {"tensors": 5, "params": 79, "bytes": 79, "files": 1}
assert sum(x["bytes"] for x in j["kinds"]) == 79
EOF

# --- --filter -------------------------------------------------------------------------
run --filter '*experts*' "$T/good.safetensors"
expect_rc 0 "filter"
[ "$(wc -l <"$T/out")" -eq 3 ] || fail "filter: expected 2 rows"
run --filter '*.weight_scale' --summary --json "$T/good.safetensors"
expect_rc 0 "filter summary"
"$PYTHON" -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["filter"]=="*.weight_scale" and j["totals"]["tensors"]==1 and j["totals"]["params"]==0' "$T/out" \
    || fail "filter summary json"
run --filter 'nothing*' "$T/good.safetensors"
expect_rc 0 "filter no match"; err_has "no tensor name matches 'nothing*'" "filter no match"

# --- a small K3-format directory with config.json ----------------------------------------
"$PYTHON" - "$K3_TEST_DATA/kimi-k3-config.json" "$T/tiny-config.json" <<'EOF' || exit 1
import json, sys
c = json.load(open(sys.argv[1])); t = c["text_config"]
t.update(hidden_size=64, num_hidden_layers=5, vocab_size=256, intermediate_size=96,
         moe_intermediate_size=32, routed_expert_hidden_size=32, num_experts=4,
         num_experts_per_token=2, num_shared_experts=1, num_attention_heads=2, num_key_value_heads=2,
         q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
         attn_res_block_size=2)
t["linear_attn_config"].update(kda_layers=[1, 2, 3, 5], full_attn_layers=[4], num_heads=2, head_dim=8)
json.dump(c, open(sys.argv[2], "w"), indent=1)
EOF
"$K3_MKLAYOUT" "$T/tiny-config.json" "$T/tiny" --shard-size 40000 >"$T/mk.out" || fail "k3_mklayout tiny"
run --summary "$T/tiny"
expect_rc 0 "tiny summary"; err_empty "tiny summary"
out_has "Layers (kinds from config):" "tiny summary"
grep -q '^0  *KDA+dense ' "$T/out" || fail "tiny: layer 0 is KDA+dense"
grep -q '^3  *MLA+MoE ' "$T/out" || fail "tiny: layer 3 is MLA+MoE"
grep -q '^4  *KDA+MoE ' "$T/out" || fail "tiny: layer 4 is KDA+MoE"
grep -q '^vision  *4 ' "$T/out" || fail "tiny: 4 vision tensors"
run --summary --json "$T/tiny"
expect_rc 0 "tiny summary json"; json_ok "tiny summary json"
"$PYTHON" -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["config"].endswith("/config.json") and j["totals"]["files"] > 1, j["totals"]' "$T/out" \
    || fail "tiny: config and several shards"
# --config on a single shard gives the layer kinds too
shard=$(ls "$T/tiny"/model-00001-of-*.safetensors)
run --summary --config "$T/tiny-config.json" "$shard"
expect_rc 0 "--config"; out_has "Layers (kinds from config):" "--config"
# a broken config.json: exit 1 with a hint; --no-config ignores it
cp "$T/tiny/config.json" "$T/config.saved"
printf '{"text_config": {"hidden_size": 64}}' >"$T/tiny/config.json"
run --summary "$T/tiny"
expect_rc 1 "broken config"; err_has "missing field 'text_config.num_hidden_layers'" "broken config"
err_has "hint: --no-config" "broken config"
run --summary --no-config "$T/tiny"
expect_rc 0 "--no-config"; out_has "Layers (kinds from tensor names):" "--no-config"
cp "$T/config.saved" "$T/tiny/config.json"
# an index whose total_size is wrong: a warning on stderr, silenced by -q
sed 's/"total_size": [0-9]*/"total_size": 12345/' "$T/tiny/model.safetensors.index.json" >"$T/idx" && \
    mv "$T/idx" "$T/tiny/model.safetensors.index.json"
run --summary "$T/tiny"
expect_rc 0 "total_size mismatch"; err_has "warning:" "total_size mismatch"; err_has "total_size 12345" "total_size mismatch"
run -q --summary "$T/tiny"
expect_rc 0 "-q"; err_empty "-q"
run --json "$T/tiny"
"$PYTHON" -c 'import json,sys; j=json.load(open(sys.argv[1])); assert len(j["warnings"]) == 1' "$T/out" || fail "json warnings"
# a missing shard: i/o class (exit 3)
rm "$shard"
run "$T/tiny"
expect_rc 3 "missing shard"; err_has "does not exist" "missing shard"

[ $fails -eq 0 ] && rm -rf "$T"
[ $fails -eq 0 ] && echo "cli k3inspect: all checks passed"
exit $fails

#!/bin/sh
# In-place packs (docs/FORMAT.md 10, version 3) made by the independent writer make_in_place.py
# from a normal pack of the tiny checkpoint (its file boundaries split a few experts, which go to
# experts-copied.safetensors): k3pack --experts-in-place writes the same manifest.json and copy
# file byte for byte (when it has the option); k3verify passes the pack (full, --quick, --subset,
# -t 2, --json), k3run gives the same text as on the version-2 pack (all experts resident, and
# through an expert cache), k3inspect shows it (checkpoint files, in-place layers, rows at the
# checkpoint's offsets, --plan). Then one damage at a time to the checkpoint, the copy file or the
# link, each named by k3verify and refused by k3run with the documented exit code: a record's byte
# changed (in the checkpoint, in the copy file), a scale byte set to 255, a file truncated,
# deleted, replaced by another of the same size (same header, other data; other bytes
# throughout), the copy file deleted, the link removed, dangling, re-pointed after a move (OK
# again, same identity); an in-place layer dropped from the manifest (incomplete).
# Standalone: K3_BIN=build/bin K3_SRC=. K3_TEST_TMP=/tmp/k3t sh tests/pack/pack_in_place_verify.sh
. "$(dirname "$0")/lib.sh"
# the writer's JSON is jansson's, byte for byte (skipped without libjansson)
set +e
$PY "$K3_SRC/tests/pack/make_in_place.py" --self-test 2000 > "$T/self.txt" 2>&1
rc=$?
set -e
[ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || { cat "$T/self.txt"; fail "make_in_place.py's serialiser differs from jansson"; }
make_ckpt tiny "$T/ck"
"$K3_BIN/k3pack" -q "$T/ck" -o "$T/v2"
$PY "$K3_SRC/tests/pack/make_in_place.py" --checkpoint "$T/ck" --pack "$T/v2" --out "$T/good" --copy > "$T/ip.json" \
    || fail "make_in_place.py"
[ -L "$T/good/checkpoint" ] || fail "no checkpoint link"
$PY - "$T/ip.json" <<'PYEOF' || fail "make_in_place.py put no layer in place"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["format_version"] == 3 and s["in_place"], s
print("in place: layers %s; in shards: %s; copied records: %s" % (
    s["in_place"], [c["layer"] for c in s["in_shards"]], [(c["layer"], c["expert"]) for c in s["copied"]]))
PYEOF
# k3pack --experts-in-place must write the same bytes (skipped where k3pack lacks the option)
if "$K3_BIN/k3pack" --help 2>/dev/null | grep -q -- --experts-in-place; then
    "$K3_BIN/k3pack" -q --experts-in-place "$T/ck" -o "$T/k3ip" || fail "k3pack --experts-in-place"
    cmp "$T/k3ip/manifest.json" "$T/good/manifest.json" || fail "k3pack --experts-in-place: another manifest.json"
    [ "$(ls "$T/k3ip")" = "$(ls "$T/good")" ] || fail "k3pack --experts-in-place: other files"
    [ ! -e "$T/good/experts-copied.safetensors" ] || cmp "$T/k3ip/experts-copied.safetensors" "$T/good/experts-copied.safetensors" \
        || fail "k3pack --experts-in-place: another experts-copied.safetensors"
    [ "$(readlink "$T/k3ip/checkpoint")" = "$(readlink "$T/good/checkpoint")" ] || fail "k3pack: another link target"
    rm -rf "$T/k3ip"
fi

# ---------------------------------------------------------------- a good in-place pack
"$K3_BIN/k3verify" "$T/good" > "$T/ok.txt" 2> "$T/ok.err" || { cat "$T/ok.txt" "$T/ok.err"; fail "k3verify rejects the in-place pack"; }
grep -q "^checkpoint: OK$" "$T/ok.txt" || fail "no OK line for the link"
grep -q "^checkpoint/model-0000.-of-00004.safetensors: OK$" "$T/ok.txt" || fail "no OK line for a checkpoint file"
grep -q "checkpoint files OK" "$T/ok.err" || { cat "$T/ok.err"; fail "summary does not count checkpoint files"; }
for opt in --quick "-t 2" "--subset 1/2" "--subset 2/2"; do
    "$K3_BIN/k3verify" -q $opt "$T/good" > /dev/null || fail "k3verify $opt rejects the in-place pack"
done
"$K3_BIN/k3verify" --json "$T/good" > "$T/ok.json" 2>/dev/null || fail "--json"
$PY - "$T/ok.json" "$T/good/manifest.json" "$T/ck" <<'PYEOF'
import json, os, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
m = json.load(open(sys.argv[2]))
s = recs[-1]
n = len(m["checkpoint_files"])
assert s["checkpoint_files"] == {"total": n, "checked": n, "failed": 0} and s["checkpoint_link"] == "ok", s
link = [r for r in recs if r["type"] == "link"]
assert len(link) == 1 and link[0]["target"] == os.path.realpath(sys.argv[3]), link
files = [r["name"] for r in recs if r["type"] == "checkpoint_file"]
assert files == [("" if f.get("in_pack") else "checkpoint/") + f["name"] for f in m["checkpoint_files"]], files
want = sum(f["header_size"] for f in m["checkpoint_files"]) + sum(
    x["count"] * x["record_size"] for x in m["expert_layers"] if x.get("source") == "checkpoint")
got = sum(r.get("bytes", 0) for r in recs if r["type"] == "checkpoint_file")
assert got == want, (got, want)
PYEOF

# k3run: the same text as on the version-2 pack, resident and through an expert cache
PROMPT="And God said"
min=$("$K3_BIN/k3inspect" --plan --budget 1G --json "$T/good" | $PY -c 'import json,sys; print(json.load(sys.stdin)["minimum_bytes"])')
for b in "" "-B $min"; do
    "$K3_BIN/k3run" -m "$T/v2" $b -p "$PROMPT" -n 24 > "$T/v2.txt" 2> "$T/v2.err" || { cat "$T/v2.err"; fail "k3run $b on the version-2 pack"; }
    "$K3_BIN/k3run" -m "$T/good" $b -p "$PROMPT" -n 24 > "$T/ip.txt" 2> "$T/ip.err" || { cat "$T/ip.err"; fail "k3run $b on the in-place pack"; }
    [ -s "$T/v2.txt" ] || fail "k3run $b: no text"
    cmp -s "$T/v2.txt" "$T/ip.txt" || { cat "$T/v2.txt"; echo; cat "$T/ip.txt"; fail "k3run $b: the in-place pack gives another text"; }
done
"$K3_BIN/k3run" -m "$T/good" --verify -p "$PROMPT" -n 4 > /dev/null 2> "$T/err" || { cat "$T/err"; fail "k3run --verify"; }

# k3inspect: the checkpoint files, the in-place layers, rows at the checkpoint's own offsets, --plan
"$K3_BIN/k3inspect" --shards "$T/good" > "$T/shards.txt" || fail "k3inspect --shards"
grep -q "^Checkpoint (expert records read in place): 'checkpoint' -> " "$T/shards.txt" || { cat "$T/shards.txt"; fail "no checkpoint section"; }
grep -q "^model-0000.-of-00004.safetensors .* ok$" "$T/shards.txt" || fail "no checkpoint file row"
grep -q "in place in the checkpoint: model-0000" "$T/shards.txt" || fail "no in-place layer row"
"$K3_BIN/k3inspect" --json "$T/good" > "$T/plist.json" || fail "k3inspect --json"
"$K3_BIN/k3inspect" --json "$T/ck" > "$T/cklist.json"
"$K3_BIN/k3inspect" --summary --json "$T/good" > "$T/psum.json" || fail "k3inspect --summary --json"
"$K3_BIN/k3inspect" --summary --json "$T/ck" > "$T/cksum.json"
$PY - "$T" <<'PYEOF'
import json, sys
T = sys.argv[1]
m = json.load(open(T + "/good/manifest.json"))
p, ck = json.load(open(T + "/plist.json")), json.load(open(T + "/cklist.json"))
rows = {t["name"]: t for t in p["tensors"]}
n = 0
for t in ck["tensors"]:
    q = rows.get(t["name"])
    if q and p["files"][q["file"]]["name"].startswith("checkpoint/"):
        assert p["files"][q["file"]]["name"] == "checkpoint/" + ck["files"][t["file"]]["name"], (t, q)
        assert q["offset"] == t["offset"] and q["bytes"] == t["bytes"], (t, q)
        n += 1
want = sum(len(x["parts"]) for x in m["expert_layers"] if x.get("source") == "checkpoint"
           for f, _ in x["records"] if not m["checkpoint_files"][f].get("in_pack"))
assert n == want, (n, want)
ps, cs = json.load(open(T + "/psum.json")), json.load(open(T + "/cksum.json"))
kinds = lambda d: {k["kind"]: (k["tensors"], k["params"], k["bytes"]) for k in d["kinds"] if k["kind"] != "vision"}
assert kinds(ps) == kinds(cs), (kinds(ps), kinds(cs))
pk = ps["pack"]
assert [f["name"] for f in pk["checkpoint_files"]] == [f["name"] for f in m["checkpoint_files"]]
assert all(f["state"] == "ok" for f in pk["checkpoint_files"])
assert [x["layer"] for x in pk["expert_layers"] if x["in_place"]] == \
    [x["layer"] for x in m["expert_layers"] if x.get("source") == "checkpoint"]
print("k3inspect: %d in-place rows at the checkpoint's offsets" % n)
PYEOF
"$K3_BIN/k3inspect" --plan --budget "$min" --json "$T/good" > "$T/plan.json" || fail "k3inspect --plan"
$PY -c 'import json,sys; e=json.load(open(sys.argv[1]))["experts"]; assert e["slot_bytes"] % 4096 == 0 and e["slot_bytes"] >= e["record_bytes"] + 4095, e' "$T/plan.json" \
    || fail "--plan: a slot does not hold an in-place record"

# ---------------------------------------------------------------- damage, one at a time
fresh() {   # fresh NAME : copies of the checkpoint and of the pack, the link to the copy: $D, $C
    rm -rf "$T/$1" "$T/$1.ck"
    cp -r "$T/ck" "$T/$1.ck"
    cp -a "$T/good" "$T/$1"
    ln -sfn "$T/$1.ck" "$T/$1/checkpoint"
    D="$T/$1"; C="$T/$1.ck"
}
# loc : "file index file offset layer record_size scale_offset nfiles" of expert 5 of the first in-place layer
loc() {
    $PY - "$T/good/manifest.json" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
x = [x for x in m["expert_layers"] if x.get("source") == "checkpoint"][0]
f, off = x["records"][5]
assert not m["checkpoint_files"][f].get("in_pack"), "expert 5 of layer %d was copied" % x["layer"]
scale = [p for p in x["parts"] if p["encoding"] == "E8M0"][0]
print(f, m["checkpoint_files"][f]["name"], off, x["layer"], x["record_size"], off + scale["offset"] + 1,
      len(m["checkpoint_files"]))
PYEOF
}
setbyte() {   # setbyte FILE OFFSET VALUE|flip
    $PY -c "
import sys
p, o, v = sys.argv[1], int(sys.argv[2]), sys.argv[3]
b = bytearray(open(p, 'rb').read()); b[o] = b[o] ^ 0x10 if v == 'flip' else int(v); open(p, 'wb').write(b)" "$1" "$2" "$3"
}
run_k3run() {   # run_k3run CODE SUBSTRING : k3run on $D exits CODE and says SUBSTRING
    expect_exit "$1" "$K3_BIN/k3run" -m "$D" -p "$PROMPT" -n 4
    expect_err "$2"
}
line() {   # line PATTERN : the last k3verify's stdout has a line matching PATTERN (grep -E)
    grep -qE -- "$1" "$T/out" || { cat "$T/out" "$T/err"; fail "k3verify: no line '$1'"; }
}
set -- $(loc)
FI=$1 F=$2 OFF=$3 L=$4 RS=$5 SC=$6 NF=$7
END=$((OFF + RS))

fresh record
setbyte "$C/$F" $((OFF + 100)) flip
expect_exit 1 "$K3_BIN/k3verify" "$D"
line "^checkpoint/$F: FAILED \(expert 5 of layer $L, bytes \[$OFF, $END\): hash mismatch"
expect_exit 1 "$K3_BIN/k3verify" --json "$D"
$PY - "$T/out" "$L" "$OFF" <<'PYEOF' || fail "--json does not name the record"
import json, sys
bad = [r for r in map(json.loads, open(sys.argv[1])) if r["status"] == "failed"]
p = bad[0]["problems"][0]
assert bad[0]["type"] == "checkpoint_file" and p["kind"] == "hash" and p["expert"] == 5, bad
assert p["layer"] == int(sys.argv[2]) and p["begin"] == int(sys.argv[3]), p
PYEOF
expect_exit 0 "$K3_BIN/k3verify" --quick "$D"           # the data is not read
expect_exit 1 "$K3_BIN/k3verify" --subset $((FI + 1))/$NF "$D"
if [ "$NF" -gt 1 ]; then
    expect_exit 0 "$K3_BIN/k3verify" --subset $(((FI + 1) % NF + 1))/$NF "$D"
fi
run_k3run 1 "layer $L expert 5 (record at offset $OFF)"

fresh nan
setbyte "$C/$F" "$SC" 255
expect_exit 1 "$K3_BIN/k3verify" "$D"
line "^checkpoint/$F: FAILED \(.*expert 5 of layer $L, part 'w.\.weight_scale': scale byte at offset $SC is 255, NaN in E8M0"
run_k3run 1 "layer $L expert 5"

fresh truncated
truncate -s -4096 "$C/$F"
expect_exit 1 "$K3_BIN/k3verify" "$D"
line "^checkpoint/$F: FAILED \(size [0-9]+, expected [0-9]+: truncated"
run_k3run 1 "the pack was made from a file of"

fresh deleted
rm "$C/$F"
expect_exit 3 "$K3_BIN/k3verify" "$D"
line "^checkpoint/$F: FAILED \(missing: .*ln -sfn DIR '$D/checkpoint'\)"
run_k3run 3 "ln -sfn DIR"

fresh nolink
rm "$D/checkpoint"
expect_exit 3 "$K3_BIN/k3verify" "$D"
line "^checkpoint: FAILED \(missing: .*ln -sfn DIR '$D/checkpoint'\)"
grep -q "checkpoint link FAILED" "$T/err" || { cat "$T/err"; fail "summary does not name the link"; }
run_k3run 3 "ln -sfn DIR"

fresh dangling
rm -r "$C"
expect_exit 3 "$K3_BIN/k3verify" "$D"
line "^checkpoint: FAILED \(dangling: it points to '$C', which does not exist"
run_k3run 3 "ln -sfn DIR"

fresh moved                                              # the fix: point the link at the new place
mv "$C" "$T/moved.elsewhere"
expect_exit 3 "$K3_BIN/k3verify" "$D"
ln -sfn "$T/moved.elsewhere" "$D/checkpoint"
"$K3_BIN/k3verify" "$D" > "$T/out" 2> "$T/err" || { cat "$T/out" "$T/err"; fail "k3verify after the link was fixed"; }
grep -q "$($PY -c "import xxhash,sys; print(xxhash.xxh3_128_hexdigest(open(sys.argv[1],'rb').read()))" "$T/good/manifest.json")" "$T/err" \
    || fail "the identity changed with the link"
rm -rf "$T/moved.elsewhere"

fresh samesize                                           # another checkpoint's file: same header, other data
make_ckpt tiny "$T/other" --seed 8
cmp -s "$T/other/$F" "$C/$F" && fail "seed 8 gives the same file"
[ "$(wc -c < "$T/other/$F")" -eq "$(wc -c < "$C/$F")" ] || fail "seed 8 gives another size"
cp "$T/other/$F" "$C/$F"
expect_exit 1 "$K3_BIN/k3verify" -v "$D"
nrec=$($PY -c "
import json, sys
m = json.load(open(sys.argv[1]))
print(sum(r[0] == int(sys.argv[2]) for x in m['expert_layers'] if x.get('source') == 'checkpoint' for r in x['records']))" "$T/good/manifest.json" "$FI")
[ "$(grep "^checkpoint/$F: FAILED" "$T/out" | grep -o 'hash mismatch' | wc -l)" -eq "$nrec" ] \
    || { cat "$T/out"; fail "not every record of the replaced file is named"; }
grep "^checkpoint/$F: FAILED" "$T/out" | grep -q "safetensors header" && fail "the header of a same-layout file is named"
run_k3run 1 "the checkpoint file changed since k3pack read it"

fresh otherbytes                                         # other bytes throughout, same size
head -c "$(wc -c < "$C/$F")" /dev/urandom > "$C/$F.new" && mv "$C/$F.new" "$C/$F"
expect_exit 1 "$K3_BIN/k3verify" "$D"
line "^checkpoint/$F: FAILED \(safetensors header, bytes \[0, [0-9]+\): hash mismatch"
run_k3run 1 "its safetensors header differs from the one k3pack read"

fresh incomplete                                         # an in-place layer dropped from the manifest
$PY - "$D/manifest.json" "$L" "$K3_SRC/tests/pack" <<'PYEOF'
import json, sys
sys.path.insert(0, sys.argv[3])
from make_in_place import seal
m = json.load(open(sys.argv[1]))
m["expert_layers"] = [x for x in m["expert_layers"] if x["layer"] != int(sys.argv[2])]
open(sys.argv[1], "wb").write(seal(m))
PYEOF
expect_exit 1 "$K3_BIN/k3verify" --quick "$D"
line "^manifest.json: FAILED \(the experts of layer $L the config needs are not in the pack"

# the pack's own experts-copied.safetensors (the records k3pack copied): a file of the pack
if [ -e "$T/good/experts-copied.safetensors" ]; then
    set -- $($PY - "$T/good/manifest.json" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
ci = [i for i, f in enumerate(m["checkpoint_files"]) if f.get("in_pack")][0]
x, e = [(x, e) for x in m["expert_layers"] if x.get("source") == "checkpoint"
        for e, (f, o) in enumerate(x["records"]) if f == ci][0]
print(x["layer"], e, x["records"][e][1], x["records"][e][1] + x["record_size"])
PYEOF
)
    fresh copyrecord
    setbyte "$D/experts-copied.safetensors" $(($3 + 7)) flip
    expect_exit 1 "$K3_BIN/k3verify" "$D"
    line "^experts-copied.safetensors: FAILED \(expert $2 of layer $1, bytes \[$3, $4\): hash mismatch\)"
    run_k3run 1 "layer $1 expert $2 (record at offset $3)"
    fresh copydeleted
    rm "$D/experts-copied.safetensors"
    expect_exit 1 "$K3_BIN/k3verify" "$D"                # a file of the pack, as a shard
    line "^experts-copied.safetensors: FAILED \(missing\)$"
    run_k3run 3 "experts-copied.safetensors"
fi

fresh inspect                                            # k3inspect: a missing file is a warning
rm "$C/$F"
expect_exit 0 "$K3_BIN/k3inspect" --shards "$D"
grep -q "^$F .* MISSING$" "$T/out" || { cat "$T/out"; fail "k3inspect: missing file not marked"; }
expect_err "checkpoint file 'checkpoint/$F' is missing"

# a version-2 pack does not read through a link: one there is a file the manifest does not list
ln -s "$T/ck" "$T/v2/checkpoint"
expect_exit 1 "$K3_BIN/k3verify" --quick "$T/v2"
line "^checkpoint: FAILED \(not listed in the manifest\)"
rm "$T/v2/checkpoint"
echo "pack_in_place_verify: OK"

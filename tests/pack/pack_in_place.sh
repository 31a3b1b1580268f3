#!/bin/sh
# k3pack --experts-in-place (docs/FORMAT.md section 10), end to end:
#  1. tiny checkpoint (its file boundaries split a few experts): a version-3 pack that
#     tests/pack/check_pack.py (an independent reader) accepts against the checkpoint,
#     with the split records copied into experts-copied.safetensors; the same bytes at
#     --threads 1 and 2; k3run's text equal to the normal pack's, resident and at the
#     minimum budget (records read from the checkpoint through the cache), 1 and 2
#     threads, greedy and sampled; the checkpoint moved: refused with the fix, which works;
#     records changed while k3run runs: the next read of one stops it, naming the file (exit 1);
#  2. a checkpoint whose experts are not adjacent (--expert-layout by-tensor): every layer
#     copied, and the pack is the normal version-2 pack byte for byte;
#  3. an archive is refused (exit 2); --dry-run says what stays in place;
#  4. small: the disk the pack takes while k3pack runs (polled), against the checkpoint:
#     at most the checkpoint's non-expert tensors plus the copied records, with 3 % for
#     the shards' alignment; the ratio (checkpoint + pack) / checkpoint is printed; with
#     --trunk q8 as well, at most 1.1 (k3verify and k3run accept that pack).
# Environment (set by ctest): K3_BIN K3_SRC K3_TEST_TMP
. "$(dirname "$0")/lib.sh"

ids() {   # ids PACK ARGS...: k3run's generated ids (greedy unless ARGS say otherwise)
    p=$1; shift
    "$K3_BIN/k3run" -m "$p" -p "The quick brown fox" -n 24 --json "$@" 2>"$T/run.err" |
        $PY -c 'import json,sys; print(json.load(sys.stdin)["generated_ids"])' || { cat "$T/run.err" >&2; fail "k3run $p $*"; }
}
minimum() {   # the planner's minimum budget for PACK, in bytes
    "$K3_BIN/k3run" -m "$1" -p x --budget 1M 2>&1 | sed -n 's/.*minimum of [0-9.]* GiB (\([0-9]*\) bytes.*/\1/p'
}

# ------------------------------------------------------------------ 1. tiny
make_ckpt tiny "$T/ck"
"$K3_BIN/k3pack" -q "$T/ck" -o "$T/pk"
"$K3_BIN/k3pack" -q --experts-in-place -t 2 "$T/ck" -o "$T/ip"
$PY "$K3_SRC/tests/pack/check_pack.py" "$T/ip" "$T/ck" >/dev/null
[ -L "$T/ip/checkpoint" ] || fail "no checkpoint link"
[ -f "$T/ip/experts-copied.safetensors" ] || fail "tiny's split experts were not copied"
ls "$T/ip" | grep -q '^experts-layer' && fail "an expert shard was written"
$PY -c 'import json,sys; m=json.load(open(sys.argv[1])); assert m["format_version"] == 3' "$T/ip/manifest.json" ||
    fail "not format version 3"
"$K3_BIN/k3pack" -q --experts-in-place -t 1 "$T/ck" -o "$T/ip1"
cmp "$T/ip/manifest.json" "$T/ip1/manifest.json" || fail "--threads 1 and 2 give different manifests"
cmp "$T/ip/experts-copied.safetensors" "$T/ip1/experts-copied.safetensors" || fail "copied records differ"
# the check fails when a record's bytes differ from the checkpoint (it can fail)
cp -r "$T/ip1" "$T/ipbad" && rm "$T/ipbad/checkpoint" && cp -r "$T/ck" "$T/ckbad" && ln -s "$T/ckbad" "$T/ipbad/checkpoint"
$PY - "$T/ipbad" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1] + "/manifest.json"))
x = [x for x in m["expert_layers"] if "records" in x][0]
f, off = x["records"][3]
path = sys.argv[1] + "/checkpoint/" + m["checkpoint_files"][f]["name"]
with open(path, "r+b") as fh:
    fh.seek(off + x["record_size"] // 2); b = fh.read(1); fh.seek(-1, 1); fh.write(bytes([b[0] ^ 1]))
EOF
if $PY "$K3_SRC/tests/pack/check_pack.py" "$T/ipbad" "$T/ckbad" 2>/dev/null; then fail "check_pack accepted a changed record"; fi
rm -rf "$T/ipbad" "$T/ckbad"

min=$(minimum "$T/pk")
[ -n "$min" ] || fail "no minimum budget"
min_ip=$(minimum "$T/ip")
[ "$min_ip" -ge "$min" ] || fail "in place the minimum ($min_ip) is below the normal pack's ($min)"
for args in "-t 1" "-t 2" "-t 2 --budget $min_ip" "-t 1 --budget $min_ip" "-t 2 --temp 0.8 --seed 5" \
            "-t 1 --budget $min_ip --temp 0.8 --seed 5"; do
    a=$(ids "$T/pk" $args)
    b=$(ids "$T/ip" $args)
    [ "$a" = "$b" ] || fail "k3run $args: in place $b, normal $a"
done
# the checkpoint moves: the pack names the file and the fix; the fix works
mv "$T/ck" "$T/ck-moved"
expect_exit 3 "$K3_BIN/k3run" -m "$T/ip" -p x -n 1
expect_err "ln -sfn"
expect_err "model-00001-of-"
ln -sfn "$T/ck-moved" "$T/ip/checkpoint"
[ "$(ids "$T/ip" -t 2)" = "$(ids "$T/pk" -t 2)" ] || fail "after the link was fixed"
mv "$T/ck-moved" "$T/ck"
ln -sfn "$T/ck" "$T/ip/checkpoint"

# the checkpoint changes while k3run reads it (at the minimum budget every token reads records):
# the next read of a changed record stops the run, naming the file (exit 1)
flip() {   # flip PACK: xor one byte of every in-place record of the first in-place layer
    $PY - "$1" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1] + "/manifest.json"))
x = [x for x in m["expert_layers"] if "records" in x][0]
for f, off in x["records"]:
    src = m["checkpoint_files"][f]
    path = sys.argv[1] + ("/" if src.get("in_pack") else "/checkpoint/") + src["name"]
    with open(path, "r+b") as fh:
        fh.seek(off + 100); b = fh.read(1); fh.seek(-1, 1); fh.write(bytes([b[0] ^ 0x10]))
EOF
}
cp -r "$T/ck" "$T/ckmid" && cp -r "$T/ip" "$T/ipmid" && ln -sfn "$T/ckmid" "$T/ipmid/checkpoint"
set +e
"$K3_BIN/k3run" -m "$T/ipmid" -p "The quick brown fox" -n 3000 --temp 1 --seed 1 --budget "$min_ip" \
    >"$T/mid.out" 2>"$T/mid.err" &
pid=$!
sleep 1
flip "$T/ipmid"
wait $pid
rc=$?
set -e
[ "$rc" -eq 1 ] || { cat "$T/mid.err" >&2; fail "a record changed mid-run: exit $rc, expected 1"; }
grep -q "changed since k3pack read it" "$T/mid.err" || { cat "$T/mid.err" >&2; fail "mid-run: no message"; }
grep -q "model-0000.-of-\|experts-copied" "$T/mid.err" || { cat "$T/mid.err" >&2; fail "mid-run: the file is not named"; }
rm -rf "$T/ckmid" "$T/ipmid"

# ------------------------------------------------------------------ 2. experts not adjacent
make_ckpt tiny "$T/ckT" --expert-layout by-tensor
"$K3_BIN/k3pack" -v --experts-in-place "$T/ckT" -o "$T/ipT" 2>"$T/err"
expect_err "are not adjacent"
same_but_download "$T/ipT" "$T/pk" || fail "all layers copied, yet not the normal pack"
[ -e "$T/ipT/checkpoint" ] && fail "a version-2 pack with a checkpoint link"

# ------------------------------------------------------------------ 3. archive, dry run
make_tar "$T/ck" "$T/ck.tar"
expect_exit 2 "$K3_BIN/k3pack" --experts-in-place "$T/ck.tar" -o "$T/ar"
expect_err "checkpoint directory"
"$K3_BIN/k3pack" --experts-in-place --dry-run --json "$T/ck" >"$T/dry"
$PY - "$T/dry" <<'EOF' || fail "--dry-run --json"
import json, sys
plan = [json.loads(l) for l in open(sys.argv[1]) if '"type":"plan"' in l][0]
assert plan["experts_in_place"] == 8 and plan["in_place_bytes"] > 0, plan
EOF

# ------------------------------------------------------------------ 4. small: disk while packing
make_ckpt small "$T/cks"
$PY "$K3_SRC/tests/pack/peak_disk.py" "$T/ips" -- "$K3_BIN/k3pack" -q --experts-in-place "$T/cks" -o "$T/ips" >"$T/peak"
$PY - "$T/cks" "$T/ips" "$T/peak" <<'EOF' || fail "disk while packing small in place"
import json, os, struct, sys
ck, pack, peak = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
ck_disk = sum(os.lstat(os.path.join(ck, n)).st_blocks * 512 for n in os.listdir(ck))
trunk = 0                              # the checkpoint's non-expert, non-vision tensor bytes
for n in os.listdir(ck):
    if not n.endswith(".safetensors"):
        continue
    with open(os.path.join(ck, n), "rb") as f:
        h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    for name, t in h.items():
        if name != "__metadata__" and ".experts." not in name and not name.startswith(("vision_tower.", "mm_projector.")):
            trunk += t["data_offsets"][1] - t["data_offsets"][0]
copied = os.path.getsize(os.path.join(pack, "experts-copied.safetensors"))
bound = int(trunk * 1.03) + copied + (1 << 20)
ratio = (ck_disk + peak["peak_bytes"]) / ck_disk
print("small in place: checkpoint %.1f MB, pack at its peak %.1f MB (trunk tensors %.1f MB, copied records %.2f MB), "
      "%d samples: %.3f x the checkpoint" % (ck_disk / 1e6, peak["peak_bytes"] / 1e6, trunk / 1e6, copied / 1e6,
                                             peak["samples"], ratio))
assert peak["samples"] > 0 and peak["peak_bytes"] <= bound, (peak, bound)
EOF
# 4b. the same with the compact trunk (--trunk q8, inexact): the pack is half the trunk, and packing
#     fits in 1.1 x the checkpoint's disk even where the exact trunk alone is 16 % of it
$PY "$K3_SRC/tests/pack/peak_disk.py" "$T/ipq" -- "$K3_BIN/k3pack" -q --experts-in-place --trunk q8 "$T/cks" -o "$T/ipq" \
    >"$T/peakq" 2>/dev/null
$PY - "$T/cks" "$T/peakq" <<'EOF' || fail "disk while packing small in place with a q8 trunk"
import json, os, sys
ck, peak = sys.argv[1], json.load(open(sys.argv[2]))
ck_disk = sum(os.lstat(os.path.join(ck, n)).st_blocks * 512 for n in os.listdir(ck))
ratio = (ck_disk + peak["peak_bytes"]) / ck_disk
print("small in place, q8 trunk: pack at its peak %.1f MB, %d samples: %.3f x the checkpoint" % (
      peak["peak_bytes"] / 1e6, peak["samples"], ratio))
assert peak["samples"] > 0 and ratio <= 1.1, ratio
EOF
"$K3_BIN/k3verify" -q "$T/ipq" || fail "k3verify refused the in-place q8 pack"
"$K3_BIN/k3run" -m "$T/ipq" -p x -n 2 >/dev/null 2>"$T/err" || { cat "$T/err" >&2; fail "k3run on the in-place q8 pack"; }
grep -q INEXACT "$T/err" || fail "k3run on the in-place q8 pack does not say the trunk is inexact"
echo "pack_in_place: all checks passed"

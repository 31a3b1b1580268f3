#!/bin/sh
# A download checked against its publisher's hashes (k3pack, k3verify --checkpoint), with the hashes
# made here by independent tools (coreutils' sha256sum, git hash-object):
#  - a Hugging Face cache snapshot (files linked to ../../blobs/<SHA-256 or git blob SHA-1>): k3pack
#    and k3verify check every file; the manifest's download record holds sha256sum's digests;
#  - one byte changed in a weights blob (same size, in its data): k3pack exits 1 naming the file and
#    leaves no manifest, no shard, no journal; k3verify exits 1 naming it; a small file's blob the same;
#  - --sha256 SUMS on a plain directory and on an archive: right, wrong, a file missing from SUMS,
#    a SUMS that is not one;
#  - neither: both say plainly that the download was not checked;
#  - 1 and 2 threads and the archive give the same pack, download record included.
. "$(dirname "$0")/lib.sh"
command -v git >/dev/null || fail "git is needed for git hash-object (scripts/setup.sh installs it)"
make_ckpt tiny "$T/ck"
# the snapshot, as huggingface_hub lays it out
snap="$T/hub/models--k3--tiny/snapshots/0123abcd"
mkdir -p "$T/hub/models--k3--tiny/blobs" "$snap"
for f in "$T/ck"/*; do
    n=$(basename "$f")
    case $n in
    *.safetensors|tiktoken.model) h=$(sha256sum "$f" | cut -c1-64) ;;     # LFS files: the SHA-256
    *) h=$(git hash-object "$f") ;;                                        # git files: the blob SHA-1
    esac
    cp "$f" "$T/hub/models--k3--tiny/blobs/$h"
    ln -s "../../blobs/$h" "$snap/$n"
done
expect_exit 0 "$K3_BIN/k3verify" --checkpoint "$snap"
expect_err "files checked against the Hugging Face cache's hashes, 0 failed"
expect_exit 0 "$K3_BIN/k3pack" "$snap" -o "$T/p_hub"
expect_err "the download was checked: every file's SHA-256 against the Hugging Face cache's hashes"
# the record holds every file read, with sha256sum's digest
(cd "$T/ck" && sha256sum -- *) | sort -k2 > "$T/want.sums"
$PY - "$T/p_hub/manifest.json" > "$T/got.sums" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))["download"]
assert d["checked_against"] == "the Hugging Face cache's hashes", d["checked_against"]
for f in sorted(d["files"], key=lambda f: f["name"]):
    print("%s  %s" % (f["sha256"], f["name"]))
PYEOF
cmp -s "$T/want.sums" "$T/got.sums" || { diff "$T/want.sums" "$T/got.sums"; fail "the download record is not sha256sum's"; }
"$K3_BIN/k3inspect" --shards "$T/p_hub" | grep -q "^$(head -c 64 "$T/want.sums")  " || fail "k3inspect does not show the SHA-256s"

# one byte changed in a weights blob, same size, in its data
last=$(ls "$T/ck" | grep 'safetensors$' | tail -1)
blob=$(readlink -f "$snap/$last")
cp "$blob" "$T/blob.good"
size=$(stat -c %s "$blob")
printf '\125' | dd of="$blob" bs=1 seek=$((size - 100)) conv=notrunc 2>/dev/null
cmp -s "$blob" "$T/blob.good" && printf '\252' | dd of="$blob" bs=1 seek=$((size - 100)) conv=notrunc 2>/dev/null
expect_exit 1 "$K3_BIN/k3pack" "$snap" -o "$T/p_bad"
expect_err "$last': its SHA-256 is"
expect_err "the download is damaged"
[ ! -e "$T/p_bad/manifest.json" ] || fail "a manifest after a damaged download"
[ -z "$(ls "$T/p_bad" | grep '\.k3s$')" ] || fail "shards kept after a damaged download: $(ls "$T/p_bad")"
[ ! -e "$T/p_bad/.k3pack.journal" ] || fail "a journal kept after a damaged download"
expect_exit 1 "$K3_BIN/k3verify" --checkpoint "$snap"
expect_err "1 files not as published"
grep -q "$last (download): FAILED" "$T/out" || { cat "$T/out"; fail "k3verify does not name $last"; }
cp "$T/blob.good" "$blob"
expect_exit 0 "$K3_BIN/k3pack" -q "$snap" -o "$T/p_bad"           # downloaded again: packs from nothing
same_but_download "$T/p_hub" "$T/p_bad" || fail "the pack after the fix differs"
# --experts-in-place: the same checks in the one read that packs it (before: a read of its own, first,
# and no record at all without hashes to check): the download record equals the copy pack's; the
# checkpoint's bytes read once (strace's read/pread64 sums: 1x the weights files and their few
# header reads, not 2x); a damaged blob stops it with nothing left
# (LeakSanitizer cannot run under ptrace: off for this run; the run below without strace has it)
expect_exit 0 env ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
    strace -f -qq -y -e trace=read,pread64 -o "$T/trace" "$K3_BIN/k3pack" --experts-in-place "$snap" \
    -o "$T/ip_hub"
expect_err "the download was checked: every file's SHA-256 against the Hugging Face cache's hashes"
grep -q '"checked_against"' "$T/ip_hub/manifest.json" || fail "the in-place pack has no download record"
$PY - "$T/p_hub/manifest.json" "$T/ip_hub/manifest.json" <<'PYEOF' || fail "the in-place pack's download record"
import json, sys
a, b = (json.load(open(f))["download"] for f in sys.argv[1:3])
assert a == b, (a, b)
PYEOF
weights=$(cat "$T/ck"/*.safetensors | wc -c)
# what was read from the download (its blobs: the weights files, and the index and tokenizer files,
# small), not the pack's own files k3pack reads back to hash them
read_bytes=$(sed -n 's/^[0-9]* *\(read\|pread64\)([0-9]*<\([^>]*\)>.*= \([0-9][0-9]*\)$/\2 \3/p' "$T/trace" \
    | awk -v b="$T/hub/models--k3--tiny/blobs/" 'index($1, b) == 1 {s += $2} END {print s + 0}')
[ "$read_bytes" -ge "$weights" ] && [ "$read_bytes" -lt $((weights + weights / 4)) ] \
    || fail "k3pack --experts-in-place read $read_bytes bytes for $weights bytes of weights files (want one read)"
expect_exit 0 "$K3_BIN/k3pack" -q --experts-in-place "$T/ck" -o "$T/ip_plain"
grep -q '"checked_against": null' "$T/ip_plain/manifest.json" || fail "an unchecked in-place pack does not say so"
same_but_download "$T/ip_hub" "$T/ip_plain" || fail "the in-place pack of the snapshot differs"
printf '\125' | dd of="$blob" bs=1 seek=$((size - 100)) conv=notrunc 2>/dev/null
cmp -s "$blob" "$T/blob.good" && printf '\252' | dd of="$blob" bs=1 seek=$((size - 100)) conv=notrunc 2>/dev/null
expect_exit 1 "$K3_BIN/k3pack" --experts-in-place "$snap" -o "$T/ip_bad"
expect_err "$last': its SHA-256 is"
[ ! -e "$T/ip_bad/manifest.json" ] || fail "an in-place manifest after a damaged download"
[ -z "$(ls -A "$T/ip_bad" 2>/dev/null | grep -v '^\.k3pack\.lock$')" ] \
    || fail "files kept after a damaged download, in place: $(ls -A "$T/ip_bad")"
cp "$T/blob.good" "$blob"

# a small (git) file's blob changed
cfg=$(readlink -f "$snap/tokenizer_config.json")
cp "$cfg" "$T/cfg.good"
sed -i 's/added_tokens_decoder/added_tokens_decoder /' "$cfg"
expect_exit 1 "$K3_BIN/k3pack" "$snap" -o "$T/p_cfg"
expect_err "git blob SHA-1"
cp "$T/cfg.good" "$cfg"

# --sha256 SUMS on a plain directory
(cd "$T/ck" && sha256sum -- *.safetensors) > "$T/SUMS"
expect_exit 0 "$K3_BIN/k3pack" "$T/ck" --sha256 "$T/SUMS" -o "$T/p_sums"
expect_err "against '$T/SUMS'"
expect_exit 0 "$K3_BIN/k3verify" -q --checkpoint "$T/ck" --sha256 "$T/SUMS"
sed "1s/^./$(head -c1 "$T/SUMS" | tr '0-9a-f' '1-9a-f0')/" "$T/SUMS" > "$T/SUMS.bad"
first=$(head -1 "$T/SUMS" | cut -c67-)
expect_exit 1 "$K3_BIN/k3pack" "$T/ck" --sha256 "$T/SUMS.bad" -o "$T/p_sums_bad"
expect_err "$first': its SHA-256 is"
expect_err "'$T/SUMS.bad' line 1 says"
[ ! -e "$T/p_sums_bad/manifest.json" ] || fail "a manifest after a SHA-256 mismatch"
expect_exit 1 "$K3_BIN/k3verify" --checkpoint "$T/ck" --sha256 "$T/SUMS.bad"
grep -q "$first (download): FAILED" "$T/out" || { cat "$T/out"; fail "k3verify --sha256 does not name $first"; }
tail -n +2 "$T/SUMS" > "$T/SUMS.short"
expect_exit 2 "$K3_BIN/k3pack" "$T/ck" --sha256 "$T/SUMS.short" -o "$T/p_short"
expect_err "has no line for '$first'"
printf 'not a sums file\n' > "$T/SUMS.junk"
expect_exit 1 "$K3_BIN/k3pack" "$T/ck" --sha256 "$T/SUMS.junk" -o "$T/p_junk"
expect_err "line 1: not a SHA-256 line"
# ... the BSD form (sha256sum --tag) too
(cd "$T/ck" && sha256sum --tag -- *.safetensors) > "$T/SUMS.tag"
expect_exit 0 "$K3_BIN/k3verify" -q --checkpoint "$T/ck" --sha256 "$T/SUMS.tag"
# ... and an archive's entries
make_tar "$T/ck" "$T/ck.tar.zst"
expect_exit 0 "$K3_BIN/k3pack" -q "$T/ck.tar.zst" --sha256 "$T/SUMS" -o "$T/p_tar"
expect_exit 1 "$K3_BIN/k3pack" "$T/ck.tar.zst" --sha256 "$T/SUMS.bad" -o "$T/p_tar_bad"
expect_err "its SHA-256 is"
[ ! -e "$T/p_tar_bad/manifest.json" ] || fail "a manifest after an archive entry's SHA-256 mismatch"
[ -z "$(ls "$T/p_tar_bad" 2>/dev/null | grep '\.k3s$')" ] || fail "shards kept after an archive's mismatch"
[ ! -e "$T/p_tar_bad/.k3pack.journal" ] || fail "a journal kept after an archive's mismatch"

# neither: said plainly; the same pack whatever the threads and the source (its record included)
expect_exit 0 "$K3_BIN/k3pack" "$T/ck" -o "$T/p1"
expect_err "the download itself was not checked"
expect_exit 0 "$K3_BIN/k3verify" --checkpoint "$T/ck"
expect_err "the download itself was not checked"
"$K3_BIN/k3pack" -q -t 2 "$T/ck" -o "$T/p2"
diff -r "$T/p1" "$T/p2" >/dev/null || fail "1 and 2 threads give different packs"
"$K3_BIN/k3pack" -q "$T/ck.tar.zst" -o "$T/p3"
diff -r "$T/p1" "$T/p3" >/dev/null || fail "the archive gives another pack"
grep -q '"checked_against": null' "$T/p1/manifest.json" || fail "an unchecked pack does not say so"
echo "pack_download: OK"

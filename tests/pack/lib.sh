# Shared helpers for the pack end-to-end tests (sourced). Expects K3_BIN,
# K3_SRC and K3_TEST_TMP in the environment (set by CMake).
set -eu
PY=/usr/bin/python3
REF="$K3_SRC/tests/reference"
T="$K3_TEST_TMP/$(basename "$0" .sh)"
rm -rf "$T"
mkdir -p "$T"

fail() { echo "FAIL: $*" >&2; exit 1; }
# same_but_download A B: two packs with the same bytes but for the manifest's "download" record (which
# names the checkpoint files a pack was read from: another file layout of the same tensors, or an
# in-place pack that did not check its download, records other or no files)
same_but_download() {
    diff -r -x manifest.json "$1" "$2" >/dev/null || return 1
    $PY - "$1/manifest.json" "$2/manifest.json" <<'PYEOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for m in (a, b):
    m.pop("download", None); m.pop("manifest_xxh3_64", None)
sys.exit(a != b)
PYEOF
}

# expect_exit CODE CMD... : run CMD, require exit status CODE, keep stderr in $T/err
expect_exit() {
    want=$1; shift
    set +e
    "$@" >"$T/out" 2>"$T/err"
    got=$?
    set -e
    [ "$got" -eq "$want" ] || { cat "$T/err" >&2; fail "'$*' exited $got, expected $want"; }
}

# expect_err SUBSTRING : the last expect_exit's stderr mentions SUBSTRING
expect_err() { grep -qF -- "$1" "$T/err" || { cat "$T/err" >&2; fail "stderr lacks '$1'"; }; }

make_ckpt() {   # make_ckpt PRESET DIR [extra args]
    preset=$1; dir=$2; shift 2
    $PY "$REF/make_checkpoint.py" --preset "$preset" --seed 7 --out "$dir" "$@" >"$T/make.log" 2>&1 || { cat "$T/make.log" >&2; fail "make_checkpoint $preset"; }
}

# tar a checkpoint directory with config.json first (sorted listing)
make_tar() {   # make_tar DIR OUT.tar[.zst|.gz]
    (cd "$1" && ls | LC_ALL=C sort > "$T/list" && tar -cf - -T "$T/list") > "$2.tmp"
    case "$2" in
        *.zst) zstd -q -f "$2.tmp" -o "$2"; rm "$2.tmp" ;;
        *.gz) gzip -c "$2.tmp" > "$2"; rm "$2.tmp" ;;
        *) mv "$2.tmp" "$2" ;;
    esac
}

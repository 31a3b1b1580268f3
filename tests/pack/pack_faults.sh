#!/bin/sh
# k3pack under faults (issue 9 item 5): a resume from a checkpoint changed
# behind the same config.json is refused naming the file (--force starts
# over); Ctrl-C (SIGINT) stops with a message, removes temporaries, keeps the
# journal; an input file truncated or deleted mid-pack; a read-only output;
# a disk that fills mid-pack (tmpfs) stops naming the file, keeps the
# journal, and the run resumes once space is freed. Every finished pack is
# byte-identical to an uninterrupted one. Moments are exact system calls,
# through strace (-e inject); without strace or mount those parts are skipped.
. "$(dirname "$0")/lib.sh"
make_ckpt tiny "$T/ck"
"$K3_BIN/k3pack" -q "$T/ck" -o "$T/ref"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # LeakSanitizer cannot run under ptrace
no_manifest() { [ ! -e "$1/manifest.json" ] || fail "$1 has a manifest after a failed run"; }
no_tmp() { ! ls -A "$1" | grep -q 'k3tmp' || fail "temporary files left in $1: $(ls -A "$1")"; }
same() { diff -r "$1" "$2" >/dev/null || fail "$2 differs from $1"; }
# stopped PID: true once the process has been stopped for 5 samples in a row (not a syscall stop);
# waits up to 60 s (a loaded machine, a sanitizer build)
stopped() {
    n=0
    for i in $(seq 1200); do
        if grep -q '^State:.*[tT]' "/proc/$1/status" 2>/dev/null; then n=$((n + 1)); else n=0; fi
        [ $n -ge 5 ] && return 0
        sleep 0.05
    done
    return 1
}
# under_strace CALL WHEN SIG OUT SRC... : run k3pack with SIG delivered at the WHEN-th CALL; rc in $rc
under_strace() {
    call=$1; when=$2; sig=$3; shift 3
    set +e
    strace -f -qq -o /dev/null -e trace="$call" -e inject="$call:signal=$sig:when=$when" \
        "$K3_BIN/k3pack" "$@" >"$T/out" 2>"$T/err"
    rc=$?
    set -e
}

if ! command -v strace >/dev/null || ! strace -qq -o /dev/null true 2>/dev/null; then
    echo "pack_faults: skipped: no usable strace (missing, or ptrace refused; the moments of interruption are system calls it injects at)"
    exit 0
fi

# 1. a different checkpoint behind the same config.json: one input shard changed between the
#    interrupted and the resumed run. Refused (exit 2) naming the file and what changed; --force
#    starts over and gives the pack of the changed checkpoint.
cp -r "$T/ck" "$T/ck2"
under_strace rename 4 SIGKILL "$T/ck2" -o "$T/fp"
[ -e "$T/fp/.k3pack.journal" ] || fail "no journal after the kill"
victim=$(ls "$T/ck2" | grep '\.safetensors$' | tail -1)
# (a) the data changed (same size and header): the modification time tells
$PY - "$T/ck2/$victim" <<'PYEOF'
import sys
with open(sys.argv[1], "r+b") as f:          # the last byte: an E8M0 scale, so a valid one (not 255)
    f.seek(-1, 2)
    b = f.read(1)[0]
    f.seek(-1, 2)
    f.write(bytes([1 if b != 1 else 2]))
PYEOF
expect_exit 2 "$K3_BIN/k3pack" "$T/ck2" -o "$T/fp"
expect_err "holds an unfinished pack of another input: '$victim' has been modified since"
expect_err "--force"
no_manifest "$T/fp"
# (b) the header changed, size and mtime restored: the header hash tells
cp -r "$T/ck" "$T/ck3"
under_strace rename 4 SIGKILL "$T/ck3" -o "$T/fp3"
$PY - "$T/ck3/$victim" <<'PYEOF'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
i = b.index(b'"format":"pt"') if b'"format":"pt"' in b else b.index(b'"pt"')
j = b.index(b"pt", i)
b[j:j + 2] = b"PT"                       # same length: the size stays
open(p, "r+b").write(b)
PYEOF
touch -r "$T/ck/$victim" "$T/ck3/$victim"
expect_exit 2 "$K3_BIN/k3pack" "$T/ck3" -o "$T/fp3"
expect_err "the safetensors header of '$victim' has changed"
# --force discards the unfinished pack and starts over
"$K3_BIN/k3pack" -q --force "$T/ck2" -o "$T/fp" 2>"$T/err" || { cat "$T/err"; fail "--force did not start over"; }
"$K3_BIN/k3pack" -q "$T/ck2" -o "$T/fp2ref"
same "$T/fp2ref" "$T/fp"

# 2. Ctrl-C (SIGINT) mid-pack: a message, death by SIGINT (shell status 130), no temporary
#    file, no manifest, the journal kept; the rerun resumes to the same pack
under_strace pwrite64 300 SIGINT "$T/ck" -o "$T/int"
[ "$rc" -eq 130 ] || { cat "$T/err"; fail "SIGINT run exited $rc, expected 130 (killed by SIGINT)"; }
expect_err "interrupted by SIGINT"
expect_err "rerun the same command to resume"
no_tmp "$T/int"
no_manifest "$T/int"
[ -e "$T/int/.k3pack.journal" ] || fail "the journal was not kept after SIGINT"
"$K3_BIN/k3pack" -v "$T/ck" -o "$T/int" 2>"$T/err" || { cat "$T/err"; fail "resume after SIGINT"; }
expect_err "resuming:"
same "$T/ref" "$T/int"
# from an archive too
make_tar "$T/ck" "$T/ck.tar"
under_strace pwrite64 300 SIGINT "$T/ck.tar" -o "$T/int2"
[ "$rc" -eq 130 ] || { cat "$T/err"; fail "SIGINT run (archive) exited $rc, expected 130"; }
no_tmp "$T/int2"
no_manifest "$T/int2"
"$K3_BIN/k3pack" -q "$T/ck.tar" -o "$T/int2"
same "$T/ref" "$T/int2"

# 3. an input file that disappears mid-pack: stopped at its first read of weights (or at its lock), then changed
#    run_stopped CALL WHEN CHANGE: k3pack on a copy of ck, stopped at CALL #WHEN, CHANGE run on the copy
# On a loaded machine strace's injected SIGSTOP is now and then not delivered (k3pack runs to its
# end: "gone"); then nothing was tested, and the run is tried again, up to three times.
# reap: no k3pack of these runs outlives its attempt or the test (an orphan left stopped by strace's
# injected SIGSTOP was found after two suite runs: stopped processes ignore all but SIGKILL)
reap() { pkill -KILL -f -- "-o $T/dis" 2>/dev/null || true; }
trap reap EXIT
run_stopped() {
    for attempt in 1 2 3; do
        reap
        rm -rf "$T/ckd" "$T/dis"
        cp -r "$T/ck" "$T/ckd"
        strace -f -qq -o /dev/null -e trace="$1" -e inject="$1:signal=SIGSTOP:when=$2" \
            "$K3_BIN/k3pack" "$T/ckd" -o "$T/dis" >"$T/out" 2>"$T/err" &
        sp=$!
        pid=""
        for i in $(seq 600); do pid=$(pgrep -P $sp || true); [ -n "$pid" ] && break; sleep 0.05; done
        # a watchdog: whatever waits below, strace and k3pack are gone after 120 s (a run that hung
        # under strace once took the test to its timeout); such a run is tried again
        rm -f "$T/watchdog"
        (sleep 120; touch "$T/watchdog"; kill -KILL $pid $sp) >/dev/null 2>&1 </dev/null &
        wd=$!
        if ! stopped "$pid"; then
            st=$(grep '^State:' "/proc/$pid/status" 2>/dev/null || echo "gone: it finished before $1 #$2")
            case "$st" in
            gone*) wait $sp || true
                   [ $attempt -lt 3 ] && { echo "pack_faults: k3pack was not stopped at $1 #$2 (attempt $attempt): again"; continue; } ;;
            esac
            fail "k3pack (pid '${pid:-none found}') did not stop at $1 #$2 within 60 s: $st; $(tail -c 300 "$T/err")"
        fi
        sh -c "$3"
        kill -CONT "$pid"
        # bounded: under load strace has been seen to keep a continued k3pack stopped; then the
        # run is killed and tried again (a hang here once took the test to its 300 s timeout)
        i=0
        while kill -0 $sp 2>/dev/null && [ $i -lt 1200 ]; do sleep 0.05; i=$((i + 1)); kill -CONT "$pid" 2>/dev/null || true; done
        if kill -0 $sp 2>/dev/null; then
            kill -KILL "$pid" $sp 2>/dev/null || true
            wait $sp 2>/dev/null || true
            pkill -P $wd 2>/dev/null; kill $wd 2>/dev/null || true
            [ $attempt -lt 3 ] || fail "k3pack did not finish within 60 s of SIGCONT after $1 #$2, three times"
            echo "pack_faults: k3pack did not finish after SIGCONT at $1 #$2 (attempt $attempt): again"
            continue
        fi
        set +e
        wait $sp
        rc=$?
        set -e
        pkill -P $wd 2>/dev/null; kill $wd 2>/dev/null || true
        if [ -e "$T/watchdog" ]; then
            [ $attempt -lt 3 ] || fail "k3pack under strace hung at $1 #$2, three times"
            echo "pack_faults: k3pack under strace hung at $1 #$2 (attempt $attempt): again"
            continue
        fi
        return 0
    done
}
last=$(ls "$T/ck" | grep '\.safetensors$' | tail -1)
# the moment: k3pack streams each checkpoint file front to back (one large read per chunk); it is
# stopped at its first such read, of the first file, before it reads the last one. Which read that
# is, is counted in a run of its own (the reads before it: headers, side files)
strace -f -qq -o "$T/reads" -e trace=pread64 "$K3_BIN/k3pack" -q "$T/ck" -o "$T/count" >/dev/null 2>&1
first_data=$(awk '/pread64\(/ { n++; split($0, a, ", "); if (a[3] + 0 >= 1000000) { print n; exit } }' "$T/reads")
[ -n "$first_data" ] || fail "no large read found in k3pack's system calls"
rm -rf "$T/count"
# truncated under it: exit 3 naming the file, nothing finished, temporaries gone
run_stopped pread64 "$first_data" "truncate -s 100000 '$T/ckd/$last'"
[ "$rc" -eq 3 ] || { cat "$T/err"; fail "truncated input exited $rc, expected 3"; }
expect_err "'$T/ckd/$last' changed while k3pack was reading it"
no_manifest "$T/dis"
no_tmp "$T/dis"
# deleted (the files are open by then): the bytes k3pack reads are the validated ones, and the pack
# is complete and right; deleted and replaced by another file is the case above
run_stopped pread64 "$first_data" "rm '$T/ckd/$last'"
[ "$rc" -eq 0 ] || { cat "$T/err"; fail "deleted (open) input exited $rc"; }
same "$T/ref" "$T/dis"
# deleted before k3pack opens it for packing (stopped at its lock): exit 3 naming the file
run_stopped flock 1 "rm '$T/ckd/$last'"
[ "$rc" -eq 3 ] || { cat "$T/err"; fail "deleted input exited $rc, expected 3"; }
expect_err "$last"
no_manifest "$T/dis"

# 4. and 5. need mounts (root): a read-only output and a disk that fills mid-pack
mkdir -p "$T/mnt"
if ! mount -t tmpfs -o size=64m tmpfs "$T/mnt" 2>/dev/null; then
    echo "pack_faults: read-only and full-disk parts skipped (cannot mount a tmpfs here)"
    echo "pack_faults: OK"
    exit 0
fi
trap 'reap; umount "$T/mnt" 2>/dev/null || true' EXIT
# read-only: a new output, and an unfinished one (interrupted, then the file system made read-only)
under_strace rename 4 SIGKILL "$T/ck" -o "$T/mnt/ro"
files_before=$(ls -A "$T/mnt/ro")
mount -o remount,ro "$T/mnt"
expect_exit 3 "$K3_BIN/k3pack" "$T/ck" -o "$T/mnt/new"
expect_err "cannot create '$T/mnt/new': Read-only file system"
expect_exit 3 "$K3_BIN/k3pack" "$T/ck" -o "$T/mnt/ro"
expect_err "Read-only file system"
[ "$(ls -A "$T/mnt/ro")" = "$files_before" ] || fail "the read-only output changed"
mount -o remount,rw "$T/mnt"
"$K3_BIN/k3pack" -q "$T/ck" -o "$T/mnt/ro"
same "$T/ref" "$T/mnt/ro"
rm -rf "$T/mnt/ro"

# full disk: the archive comes on stdin, so k3pack cannot run ahead of it; once the journal lists
# 3 shards the rest of the file system is filled, then the rest of the archive is fed
set +e
$PY - "$T/ck.tar" "$T/mnt" "$K3_BIN/k3pack" >"$T/full.log" 2>"$T/err" <<'PYEOF'
import json, os, subprocess, sys
tar, mnt, k3pack = sys.argv[1:4]
out = os.path.join(mnt, "p")
p = subprocess.Popen([k3pack, "-", "-o", out], stdin=subprocess.PIPE, stderr=subprocess.PIPE)
data = open(tar, "rb").read()
def done():
    try:
        return len(json.load(open(os.path.join(out, ".k3pack.journal")))["done"])
    except (OSError, ValueError):
        return 0
pos, filled = 0, False
while pos < len(data):
    if not filled:
        if done() >= 3:
            with open(os.path.join(mnt, "filler"), "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * (1 << 20))
                        f.flush()
                except OSError:
                    pass
            filled = True
    try:
        p.stdin.write(data[pos:pos + 65536])
    except BrokenPipeError:
        break
    pos += 65536
try:
    p.stdin.close()
except BrokenPipeError:
    pass
err = p.stderr.read().decode()
sys.stderr.write(err)
print(p.wait(), filled)
PYEOF
set -e
read rc filled < "$T/full.log"
cp "$T/err" "$T/full.err"
[ "$filled" = True ] || { cat "$T/err"; fail "the disk was not filled mid-pack"; }
[ "$rc" -eq 3 ] || { cat "$T/err"; fail "full disk exited $rc, expected 3"; }
expect_err "No space left on device"
expect_err "free space on its file system, then rerun the same command to resume"
grep -q "\.k3s" "$T/err" || { cat "$T/err"; fail "the no-space error does not name the shard"; }
no_tmp "$T/mnt/p"
no_manifest "$T/mnt/p"
[ -e "$T/mnt/p/.k3pack.journal" ] || fail "the journal was not kept on a full disk"
rm "$T/mnt/filler"
"$K3_BIN/k3pack" -v - -o "$T/mnt/p" < "$T/ck.tar" 2>"$T/err" || { cat "$T/err"; fail "resume after freeing space"; }
expect_err "resuming:"
same "$T/ref" "$T/mnt/p"
echo "pack_faults: OK"

"""k3pack killed with SIGKILL at seeded random moments, rerun each time, ends
with a pack byte-identical to an uninterrupted one (issue 9 item 5).

  pack_kill.py CKPT WORK [--kills N] [--seed S]

A moment is one I/O system call of an uninterrupted run (pread64, pwrite64,
write, openat, ftruncate, fsync, rename, unlink, mkdir, flock), taken from its
strace log: the run is cut into N equal stretches after the output directory
is created and one call is drawn in each (every other one among the calls
that are not tensor reads and writes), so the kills cover reading, writing,
hashing, committing (fsync / rename), journalling and the manifest. strace
then delivers SIGKILL when the process enters that call (-e inject=CALL:
signal=SIGKILL:when=K, K = its occurrence number), so a moment is exact and
the same on every machine. Every other trial also kills the rerun (at a
random call of its own, the resume: re-hashing and taking over), then a last
run finishes. After each kill, anything that looks finished (manifest.json)
must be finished (k3verify accepts it); the final pack must hold exactly the
uninterrupted pack's files, byte for byte. (Killed after removing its journal,
the pack was finished: the rerun refuses to replace it without --force.)

Without strace the moments are random delays (seeded) into a run instead.
"""

import argparse
import filecmp
import os
import random
import re
import shutil
import subprocess
import sys
import time

BIN = os.environ["K3_BIN"]
CALLS = "pread64,pwrite64,write,openat,ftruncate,fsync,rename,unlink,mkdir,flock"


def env_no_leaks():
    # LeakSanitizer cannot run under ptrace; the killed runs never reach exit anyway
    e = dict(os.environ)
    e["ASAN_OPTIONS"] = (e.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":")
    return e


def k3pack(ck, out, strace=None, check=True):
    cmd = [os.path.join(BIN, "k3pack"), "-q", ck, "-o", out]
    if strace:
        cmd = ["strace", "-f", "-qq"] + strace + cmd
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env_no_leaks())
    if check and p.returncode != 0:
        sys.exit("FAIL: %s exited %d: %s" % (" ".join(cmd), p.returncode, p.stderr.decode(errors="replace")))
    return p


def trace_calls(ck, out, log):
    """The I/O calls of one uninterrupted run, in order: [(name, occurrence)]."""
    shutil.rmtree(out, ignore_errors=True)
    k3pack(ck, out, ["-o", log, "-e", "trace=" + CALLS])
    seen, calls = {}, []
    for line in open(log):
        m = re.match(r"\s*(?:\d+\s+)?(\w+)\(", line)
        if not m or m.group(1) not in CALLS.split(","):
            continue
        n = seen[m.group(1)] = seen.get(m.group(1), 0) + 1
        calls.append((m.group(1), n))
    return calls


def same_pack(ref, out):
    a, b = sorted(os.listdir(ref)), sorted(os.listdir(out))
    if a != b:
        return "files differ: %s" % sorted(set(a) ^ set(b))
    for f in a:
        if not filecmp.cmp(os.path.join(ref, f), os.path.join(out, f), shallow=False):
            return "'%s' differs" % f
    return None


def looks_finished_is_finished(out, what):
    if os.path.exists(os.path.join(out, "manifest.json")):
        p = subprocess.run([os.path.join(BIN, "k3verify"), "-q", out], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        err = p.stderr.decode(errors="replace")
        # killed between writing manifest.json and removing the journal: every shard is intact
        # and k3verify names only the leftover journal (the rerun removes it)
        leftover_only = re.search(r"\b0 of \d+ shards FAILED, 1 leftover", err) and \
            os.path.exists(os.path.join(out, ".k3pack.journal"))
        if p.returncode != 0 and not leftover_only:
            sys.exit("FAIL: %s left a manifest.json that k3verify refuses: %s" % (what, err))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("work")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=9)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    ref, out = os.path.join(a.work, "ref"), os.path.join(a.work, "out")
    t0 = time.time()
    k3pack(a.ckpt, ref)
    full = time.time() - t0
    use_strace = shutil.which("strace") is not None and subprocess.run(   # ptrace may be refused
        ["strace", "-qq", "-o", os.devnull, "true"], stderr=subprocess.DEVNULL).returncode == 0
    if use_strace:
        calls = trace_calls(a.ckpt, out, os.path.join(a.work, "trace.log"))
        start = next(i for i, c in enumerate(calls) if c[0] == "mkdir")
        span = len(calls) - start
        moments = []
        for k in range(a.kills):
            stretch = calls[start + span * k // a.kills:start + span * (k + 1) // a.kills] or calls[-1:]
            # reads and writes of tensor bytes are most of the calls: every other kill is drawn
            # from the rest (create, size, fsync, rename, unlink, journal and manifest writes)
            rest = [c for c in stretch if c[0] not in ("pread64", "pwrite64")]
            moments.append(rng.choice(rest if k % 2 and rest else stretch))
    else:
        print("pack_kill: no usable strace: killing after random delays instead of at exact system calls")
        moments = [rng.uniform(0, full) for _ in range(a.kills)]
    hit = {}
    for i, m in enumerate(moments):
        shutil.rmtree(out, ignore_errors=True)
        if use_strace:
            p = k3pack(a.ckpt, out, ["-o", "/dev/null", "-e", "trace=" + m[0],
                                     "-e", "inject=%s:signal=SIGKILL:when=%d" % m], check=False)
            if p.returncode not in (-9, 137):
                sys.exit("FAIL: the run to kill at %s #%d was not killed (exit %d): %s"
                         % (m[0], m[1], p.returncode, p.stderr.decode(errors="replace")))
            hit[m[0]] = hit.get(m[0], 0) + 1
        else:
            pr = subprocess.Popen([os.path.join(BIN, "k3pack"), "-q", a.ckpt, "-o", out])
            time.sleep(m)
            pr.kill()
            pr.wait()
        looks_finished_is_finished(out, "kill %d" % i)
        if use_strace and i % 2:
            # kill the rerun too, somewhere in its resume
            name, n = rng.choice(calls[start:])
            k3pack(a.ckpt, out, ["-o", "/dev/null", "-e", "trace=" + name,
                                 "-e", "inject=%s:signal=SIGKILL:when=%d" % (name, rng.randint(1, n))], check=False)
            looks_finished_is_finished(out, "kill %d's rerun" % i)
        if os.path.exists(os.path.join(out, "manifest.json")) and not os.path.exists(os.path.join(out, ".k3pack.journal")):
            # killed after it had finished (journal removed): the rerun leaves the finished pack alone
            p = k3pack(a.ckpt, out, check=False)
            if p.returncode != 2 or b"already holds a finished pack" not in p.stderr:
                sys.exit("FAIL: rerun on a finished pack exited %d: %s" % (p.returncode, p.stderr.decode(errors="replace")))
        else:
            k3pack(a.ckpt, out)
        diff = same_pack(ref, out)
        if diff:
            sys.exit("FAIL: after kill %d (%s) the finished pack differs from the uninterrupted one: %s" % (i, m, diff))
    desc = ", ".join("%s %d" % kv for kv in sorted(hit.items())) if hit else "random delays"
    print("pack_kill: OK (%d kills, seed %d: %s; uninterrupted run %.2f s)" % (a.kills, a.seed, desc, full))


if __name__ == "__main__":
    main()

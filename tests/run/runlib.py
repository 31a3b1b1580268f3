"""Shared helpers of the k3run end-to-end tests: make a reference checkpoint,
pack it with k3pack, run k3run and k3ref.py, compare their dumps.

Tolerance (stated once, used by every parity test): for every layer's output,
the final hidden state and the logits, max |c - r| <= TOL * max |r| with
TOL = 1e-4. Why: tests/reference/README.md measures the error of an fp32 run
against f64 on these presets at about 1.2e-5 relative after the last layer
(growing 1.5-2x per layer inside an AttnRes block); a different but valid fp32
summation order (k3run's kernels vs BLAS) changes results by the same order,
so 1e-4 leaves ~8x headroom while a real bug (a wrong norm eps, a swapped
gate, a missed expert) moves these values by 1e-3 or more.
"""

import fcntl
import os
import shutil
import subprocess
import sys

import numpy as np

SRC = os.environ.get("K3_SRC", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BIN = os.environ.get("K3_BIN", os.path.join(SRC, "build", "bin"))
TMP = os.environ.get("K3_TEST_TMP", "/tmp")
REF = os.path.join(SRC, "tests", "reference")
if REF not in sys.path:
    sys.path.insert(0, REF)

from safetensors_io import SafetensorsFile      # noqa: E402

PY = "/usr/bin/python3"
TOL = 1e-4
CANON_PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time, there was a little"


def run(args, env=None, check=True, stdin=None):
    e = dict(os.environ)
    if env:
        e.update(env)
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e, input=stdin)
    if check and p.returncode != 0:
        raise AssertionError("%s failed (%d): %s" % (" ".join(args), p.returncode, p.stderr.decode(errors="replace")))
    return p


KJV = os.path.join(SRC, "tests", "models", "k3-kjv")


def kjv_pack(work):
    """The trained demo model packed into WORK/k3-kjv.k3pack (again when it is missing, damaged, or
    older than the checkpoint: a side file such as generation_config.json missing or different)."""
    os.makedirs(work, exist_ok=True)
    pack = os.path.join(work, "k3-kjv.k3pack")
    sides = ("tiktoken.model", "tokenizer_config.json", "generation_config.json")

    def same(f):
        a, b = os.path.join(KJV, f), os.path.join(pack, f)
        if not os.path.exists(a):
            return not os.path.exists(b)
        if not os.path.exists(b):
            return False
        with open(a, "rb") as fa, open(b, "rb") as fb:
            return fa.read() == fb.read()
    if not os.path.exists(os.path.join(pack, "manifest.json")) or not all(same(f) for f in sides) or \
            subprocess.run([os.path.join(BIN, "k3verify"), "-q", pack]).returncode:
        shutil.rmtree(pack, ignore_errors=True)
        run([os.path.join(BIN, "k3pack"), "-q", KJV, "-o", pack])
    return pack


def make_pack(preset, seed, work=None):
    """Checkpoint + pack for (preset, seed), cached under K3_TEST_TMP. Returns (ckpt, pack)."""
    work = work or os.path.join(TMP, "k3run-fixtures")
    os.makedirs(work, exist_ok=True)
    ck = os.path.join(work, "%s-%d" % (preset, seed))
    with open(ck + ".lock", "w") as lock:      # tests running side by side make it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _make_pack(preset, seed, ck)


def _make_pack(preset, seed, ck):
    pk = ck + ".k3pack"
    if not os.path.exists(os.path.join(ck, "config.json")):
        run([PY, os.path.join(REF, "make_checkpoint.py"), "--preset", preset, "--seed", str(seed), "--out", ck])
    if os.path.exists(os.path.join(pk, "manifest.json")) and subprocess.run(
            [os.path.join(BIN, "k3verify"), "--quick", "-q", pk], capture_output=True).returncode != 0:
        shutil.rmtree(pk)                      # cached by an older k3 (another pack format): pack again
    if not os.path.exists(os.path.join(pk, "manifest.json")):
        run([os.path.join(BIN, "k3pack"), "-q", ck, "-o", pk])
    return ck, pk


def k3run(args, env=None, check=True, stdin=None):
    return run([os.path.join(BIN, "k3run")] + args, env=env, check=check, stdin=stdin)


def refused_minimum(args):
    """The planner's minimum budget in bytes for `k3run ARGS`, from its own refusal of --budget 1M
    (exit 2, the message states the minimum)."""
    import re
    p = k3run(args + ["--budget", "1M"], check=False)
    m = re.search(rb"minimum of [0-9.]+ GiB \((\d+) bytes", p.stderr)
    assert p.returncode == 2 and m, p.stderr
    return int(m.group(1))


def in_memory_cgroup(tc, args, limit):
    """(CompletedProcess, peak bytes): `k3run ARGS` inside a cgroup v1 memory limit of `limit` bytes,
    and the cgroup's peak usage. Skips tc where that cannot be: an ASan build (its shadow memory and
    quarantine are not part of k3run's budget), no writable memory controller, no new cgroup."""
    import shlex
    root = "/sys/fs/cgroup/memory"
    if os.environ.get("K3_SANITIZED") == "1":
        tc.skipTest("ASan build: its shadow memory and quarantine are not part of k3run's budget")
    if not os.access(root, os.W_OK):
        tc.skipTest("cgroup v1 memory controller not writable here (%s)" % root)
    cg = os.path.join(root, "k3run-test-%d" % os.getpid())
    try:
        os.mkdir(cg)
    except OSError as e:
        tc.skipTest("cannot create a cgroup: %s" % e)
    try:
        with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
        cmd = "echo $$ > %s/cgroup.procs && exec %s" % (shlex.quote(cg), shlex.join([os.path.join(BIN, "k3run")] + args))
        p = subprocess.run(["sh", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        with open(os.path.join(cg, "memory.max_usage_in_bytes")) as f:
            return p, int(f.read())
    finally:
        os.rmdir(cg)


def minimum_budget(pack, batch=None):
    """The planner's minimum budget for PACK: -b auto's (batch 1's), or that of prompt passes of
    `batch` tokens (at batch 1's minimum every prompt token is a pass of its own)."""
    return refused_minimum(["-m", pack, "-p", "x"] + (["-b", str(batch)] if batch else []))


def k3ref(args):
    return run([PY, os.path.join(REF, "k3ref.py")] + args)


def load_dump(path):
    f = SafetensorsFile(path)
    return {n: np.array(f.get(n)) for n in f.names}


def rel_err(c, r):
    c, r = np.asarray(c, np.float64), np.asarray(r, np.float64)
    return float(np.abs(c - r).max() / max(np.abs(r).max(), 1e-30))


def compare_dumps(tc, cdump, rdump, n_layers):
    """Every layer's out (and attn/ffn), final_hidden and logits within TOL; ids and
    chosen expert sets identical. Returns the worst relative error."""
    c, r = load_dump(cdump), load_dump(rdump)
    tc.assertTrue(np.array_equal(c["ids"], r["ids"]), "processed ids differ")
    worst = 0.0
    for i in range(n_layers):
        for key in ("attn_out", "ffn_out", "out"):
            n = "layers.%d.%s" % (i, key)
            e = rel_err(c[n], r[n])
            worst = max(worst, e)
            tc.assertLessEqual(e, TOL, "%s: relative error %.2e > %.0e" % (n, e, TOL))
        n = "layers.%d.experts" % i
        if n in r:
            same = np.array_equal(np.sort(c[n], 1), np.sort(r[n], 1))
            tc.assertTrue(same, "layer %d: chosen experts differ" % i)
            e = rel_err(c["layers.%d.expert_weights" % i], r["layers.%d.expert_weights" % i])
            tc.assertLessEqual(e, TOL, "layer %d: expert weights differ (%.2e)" % (i, e))
    for n in ("final_hidden", "logits"):
        e = rel_err(c[n], r[n])
        worst = max(worst, e)
        tc.assertLessEqual(e, TOL, "%s: relative error %.2e > %.0e" % (n, e, TOL))
    return worst


def isas(pack):
    """ISA names this CPU can run, from k3run's own refusal of the others (exit 2)."""
    out = []
    for isa in ("scalar", "avx2", "avx512"):
        p = k3run(["-m", pack, "--prompt-ids", "1", "-n", "1", "--print-ids"], env={"K3_ISA": isa}, check=False)
        if p.returncode == 0:
            out.append(isa)
        elif p.returncode != 2:
            raise AssertionError("K3_ISA=%s: exit %d: %s" % (isa, p.returncode, p.stderr.decode(errors="replace")))
        else:
            sys.stderr.write("skip: %s (%s)\n" % (isa, p.stderr.decode(errors="replace").strip()))
    return out

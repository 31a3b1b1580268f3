"""Nothing is allocated in k3run's token loop (issue 8).

k3run runs on the tiny pack (tests/run/runlib.py) under an LD_PRELOAD library,
tests/tools/k3_alloc_count.c, that counts every call to malloc, calloc,
realloc, reallocarray, posix_memalign, aligned_alloc, memalign, valloc,
pvalloc, free, mmap, munmap and mremap the process makes (k3run's own code and
every library it calls through them: libgomp, jansson, stdio) and writes the
counts at exit.

The same greedy run (same prompt, same options) generating 0, 1, 2 and 24
tokens must make exactly the same number of calls of every kind: every
allocation happens before the token loop, none per token (1 vs 0 also catches
one made lazily by the first sampled token, 2 vs 1 one made by the first
one-token forward pass, 24 vs 2 one made per token). Only the calls are
compared: main sizes its id and timing arrays by -n, so the bytes differ.

Checked with everything resident (1 and 2 threads, ids; 2 threads, text as it
is generated and --stats), with the whole trunk resident and an expert cache
that evicts, and at the planner's minimum (the number test_k3run_budget.py
reads from k3run's refusal), where trunk units are streamed through two
buffers and the expert cache evicts; both at 1 and 2 threads. --json is not
checked: it builds a JSON document of N ids after the loop, by design
(test_counter_sees_growth uses it to show the counter sees allocations that
grow with N).

When counts differ, the failure names the allocation sites whose counts differ
between N and N+1 tokens (K3_ALLOC_TRACE backtraces, k3run frames named with
addr2line). Skipped in the ASan build (K3_SANITIZED=1), whose runtime owns
malloc."""

import collections
import json
import os
import re
import shutil
import subprocess
import unittest

from runlib import BIN, CANON_PROMPT, TMP, k3run, make_pack, minimum_budget

LIB = os.environ.get("K3_ALLOC_LIB", os.path.join(BIN, "..", "lib", "k3_alloc_count.so"))
WORK = os.path.join(TMP, "k3run-alloc")
NS = (0, 1, 2, 24)                   # generated tokens; the tiny pack does not stop early on CANON_PROMPT
IGNORED = ("pid", "alloc_bytes")     # not calls




def counted(args, tag, trace=None):
    """k3run ARGS under the preload; returns (counts, stdout, stderr)."""
    out = os.path.join(WORK, tag + ".json")
    if os.path.exists(out):
        os.remove(out)
    env = {"LD_PRELOAD": LIB, "K3_ALLOC_COUNT_OUT": out, "K3_NO_PROGRESS": "1"}
    if trace:
        if os.path.exists(trace):
            os.remove(trace)
        env["K3_ALLOC_TRACE"] = trace
    p = k3run(args, env=env)
    with open(out) as f:
        return json.load(f), p.stdout, p.stderr


_sym_cache = {}


def symbolize(binary, offset):
    """Function name of a return address (hex offset into a PIE binary), via addr2line."""
    key = (binary, offset)
    if key not in _sym_cache:
        name = "+" + offset
        if shutil.which("addr2line"):
            a = subprocess.run(["addr2line", "-f", "-e", binary, "%#x" % (int(offset, 16) - 1)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            fn = a.stdout.decode(errors="replace").split("\n")[0]
            if fn and fn != "??":
                name = fn
        _sym_cache[key] = name
    return _sym_cache[key]


def trace_sites(path, depth=6):
    """Counter of (call, caller chain) from a K3_ALLOC_TRACE file. Frames are named by
    function (k3run's through addr2line), not by offset: libraries that randomise (jansson's
    hash seed) then give the same sites in every run."""
    exe = os.path.realpath(os.path.join(BIN, "k3run"))
    sites = collections.Counter()
    with open(path, errors="replace") as f:
        recs = f.read().split("\n\n")
    for r in recs:
        lines = r.strip().split("\n")
        if not lines or not lines[0].startswith("@ "):
            continue
        chain = []
        for fr in lines[2:2 + depth]:                   # lines[1] is the preload's own wrapper
            m = re.match(r"(.*?)\((.*?)\)", fr)
            if not m:
                chain.append(fr.split(" [")[0])
                continue
            obj, sym = os.path.basename(m.group(1)), m.group(2)
            if re.match(r"^\+0x[0-9a-f]+$", sym) and os.path.realpath(m.group(1)) == exe:
                chain.append("k3run:" + symbolize(exe, sym[1:]))
            else:
                chain.append("%s:%s" % (obj, re.sub(r"\+0x[0-9a-f]+$", "", sym) or "?"))
        sites[(lines[0].split()[1],) + tuple(chain)] += 1
    return sites


def site_report(args_short, args_long, tag):
    """The allocation sites whose counts differ between two runs, most different first
    (+: more often in the longer run)."""
    a, b = os.path.join(WORK, tag + "-short.trace"), os.path.join(WORK, tag + "-long.trace")
    counted(args_short, tag + "-short-t", trace=a)
    counted(args_long, tag + "-long-t", trace=b)
    sa, sb = trace_sites(a), trace_sites(b)
    os.remove(a)                                       # tens of MB each
    os.remove(b)
    diff = [(sb[k] - sa[k], k) for k in set(sa) | set(sb) if sb[k] != sa[k]]
    diff.sort(key=lambda x: (-abs(x[0]), x[1]))
    lines = ["%+7d x %-14s %s" % (n, k[0], " <- ".join(k[1:])) for n, k in diff[:20]]
    return "\n".join(lines) if lines else "(no site differs)"


class TestNoAllocInTokenLoop(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.environ.get("K3_SANITIZED") == "1":
            raise unittest.SkipTest("ASan build: ASan interposes malloc, so the counting preload cannot")
        if not os.path.exists(LIB):
            raise AssertionError("the preload %s is not built (target k3_alloc_count)" % LIB)
        os.makedirs(WORK, exist_ok=True)
        cls.ck, cls.pk = make_pack("tiny", 29)
        cls.min = minimum_budget(cls.pk)

    def check_flat(self, extra, tag):
        """counts identical at every N in NS for k3run -m tiny -p CANON_PROMPT EXTRA"""
        base = ["-m", self.pk, "-p", CANON_PROMPT] + extra
        runs = []
        for n in NS:
            c, out, err = counted(base + ["-n", str(n)], "%s-n%d" % (tag, n))
            if "--print-ids" in extra:
                self.assertEqual(len(out.split()), n, "stopped early at N=%d: %s" % (n, out))
            m = re.search(rb"generated (\d+) tokens", err)
            if m:
                self.assertEqual(int(m.group(1)), n, "stopped early at N=%d" % n)
            self.assertGreater(c["malloc"], 0, "the preload counted nothing: is it loaded?")
            runs.append((n, c, err))
        calls = {k: v for k, v in runs[0][1].items() if k not in IGNORED}
        print("%-22s %s" % (tag, " ".join("%s=%d" % (k, v) for k, v in calls.items() if v)))
        problems = []
        for (n0, c0, _), (n1, c1, _) in zip(runs, runs[1:]):
            d = {k: c1[k] - c0[k] for k in c0 if k not in IGNORED and c1[k] != c0[k]}
            if d:
                print("%-22s N=%d -> N=%d: %s" % (tag, n0, n1, d))
                what = ", ".join("%g %s" % (v / (n1 - n0), k) for k, v in d.items()) + " per extra token"
                problems.append((n0, n1, d, what))
        report = []
        for i, (n0, n1, d, what) in enumerate(problems):
            report.append("N=%d -> N=%d generated tokens changes the calls by %s (%s)" % (n0, n1, d, what))
            if i in (0, len(problems) - 1):       # traced: the first and the last difference, one token apart
                report.append("  sites that run more (+) or less (-) often at N=%d than at N=%d (call, then its "
                              "callers):\n%s" % (n0 + 1, n0, site_report(base + ["-n", str(n0)],
                                                                          base + ["-n", str(n0 + 1)],
                                                                          "%s-%d" % (tag, n0))))
        if problems:
            self.fail("%s: the token loop allocates.\n%s" % (tag, "\n".join(report)))
        return runs

    def test_resident_1_thread(self):
        self.check_flat(["-t", "1", "--print-ids"], "resident-t1")

    def test_resident_2_threads(self):
        self.check_flat(["-t", "2", "--print-ids"], "resident-t2")

    def test_text_and_stats(self):
        """the text written as it is generated (stdout a pipe), with per-token statistics"""
        self.check_flat(["-t", "2", "--stats"], "text-stats-t2")

    def plan_of(self, budget, n=0):
        """k3run's --json report at BUDGET: the plan it made, the cache's hits and misses over N tokens"""
        return json.loads(k3run(["-m", self.pk, "-p", CANON_PROMPT, "-n", str(n), "-t", "2", "--json",
                                 "--budget", str(budget)]).stdout)

    def check_budget(self, budget, tag):
        j = self.plan_of(budget, NS[-1])
        self.assertGreater(j["expert_slots"], 0, "no expert cache at %d" % budget)
        self.assertGreater(j["expert_misses"], j["expert_slots"], "the expert cache never evicts at %d" % budget)
        print("%s: budget %d, %d trunk units streamed, %d expert slots, %d hits, %d misses"
              % (tag, budget, j.get("trunk_units_streamed", 0), j["expert_slots"], j["expert_hits"],
                 j["expert_misses"]))
        for t in ("1", "2"):
            with self.subTest(threads=t):
                self.check_flat(["-t", t, "--budget", str(budget), "--print-ids"], "%s-t%s" % (tag, t))
        return j

    def test_expert_cache(self):
        """the whole trunk resident and an expert cache that evicts"""
        trunk = sum(os.path.getsize(os.path.join(self.pk, f)) for f in os.listdir(self.pk) if f.startswith("trunk"))
        for k in range(1, 9):                  # the smallest budget above the minimum that streams nothing
            budget = self.min + trunk * k // 8
            if self.plan_of(budget).get("trunk_units_streamed", 0) == 0:
                break
        else:
            self.fail("no budget up to %d keeps the whole trunk resident" % budget)
        self.check_budget(budget, "cache")

    def test_trunk_streaming(self):
        """the planner's minimum: trunk units streamed through two buffers, and an expert cache"""
        if "trunk_units_streamed" not in self.plan_of(self.min):
            self.skipTest("this k3run does not report streamed trunk units (--json trunk_units_streamed)")
        j = self.check_budget(self.min, "stream")
        self.assertGreater(j["trunk_units_streamed"], 0, "the minimum budget streams no trunk unit")

    def test_counter_sees_growth(self):
        """--json allocates a JSON value per generated id after the loop: the counts grow with N,
        so a per-token allocation cannot hide from the preload"""
        a, _, _ = counted(["-m", self.pk, "-p", CANON_PROMPT, "-t", "1", "--json", "-n", "2"], "json-n2")
        b, _, _ = counted(["-m", self.pk, "-p", CANON_PROMPT, "-t", "1", "--json", "-n", "24"], "json-n24")
        self.assertGreaterEqual(b["malloc"] - a["malloc"], 22)


if __name__ == "__main__":
    unittest.main()

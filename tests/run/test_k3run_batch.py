"""The prompt batch (issue 32, docs/k3run.md "Prompt batch"): -b auto is the default, and the
generated ids are the same at -b 1, -b 7, -b auto and -b 512 on tiny, small and the demo model,
resident (a budget that holds everything) and at budgets that stream the trunk (-b 1, 7 and 512
each at its own minimum, where every trunk unit streams; -b auto and -b 7 at one budget a little
above the least, where auto's larger passes read fewer bytes than -b 7's). At -b auto the plan never
exceeds the budget: resident bytes within it, and (where cgroups v1 can be made) a run on small
with a long prompt fits a cgroup memory limit equal to the budget, as run.budget_small checks for
the fixed batch. The packs are the shared fixtures (runlib.make_pack, kjv_pack); generation is
short."""

import json
import os
import unittest

from runlib import CANON_PROMPT, TMP, in_memory_cgroup, k3run, kjv_pack, make_pack, refused_minimum

SANITIZED = os.environ.get("K3_SANITIZED") == "1"
SAMPLING = ["--temp", "0.9", "--top-p", "0.95", "--seed", "5"]
BATCHES = ("1", "7", "auto", "512")


def minimum(pack, extra):
    """the planner's minimum for PACK with EXTRA options (runlib.refused_minimum)"""
    return refused_minimum(["-m", pack, "-p", "x"] + extra)


class BatchCase:
    """a subclass sets pack, prompt (text), n (tokens to generate), samplers and above (bytes above
    the least budget for the run of -b auto and -b 7 at one streaming budget)"""

    def gen(self, extra):
        p = k3run(["-m", self.pack, "-p", self.prompt, "-n", str(self.n), "--json", "-t", "2"] + extra)
        return json.loads(p.stdout)

    def cases(self):
        """(budget, batch): "resident" 4 GiB; "least" the batch's own minimum, where every trunk unit
        streams; "above" a little above the least budget (auto's), where the trunk streams too"""
        return [("resident", b) for b in BATCHES] + [("least", b) for b in ("1", "7", "512")] + \
            [("above", "7"), ("above", "auto")]

    def test_same_ids_at_every_batch(self):
        """the same ids at every batch and budget; above the least budget -b auto takes larger
        passes than -b 7 (the prompt has more than 7 tokens) and its run reads fewer bytes"""
        for sampler in self.samplers:
            want, above = None, {}
            for budget, b in self.cases():
                with self.subTest(sampled=bool(sampler), budget=budget, batch=b):
                    if budget == "resident":
                        bud = 4 << 30
                    elif budget == "least":
                        bud = minimum(self.pack, ["-b", b])
                    else:
                        bud = minimum(self.pack, []) + self.above
                    d = self.gen(sampler + ["-b", b, "--budget", str(bud)])
                    want = want or d["generated_ids"]
                    self.assertEqual(d["generated_ids"], want)
                    self.assertTrue(0 < len(want) <= self.n)
                    # the process's own peak RSS (VmHWM), measured, not the plan's figure
                    self.assertTrue(0 < d["peak_rss_bytes"] <= bud, "peak RSS %d over the budget" % d["peak_rss_bytes"])
                    self.assertEqual(d["batch_auto"], b == "auto")
                    if b != "auto":
                        self.assertEqual(d["batch"], int(b))
                    else:             # at most the prompt, and at least 1
                        self.assertTrue(1 <= d["batch"] <= d["prompt_tokens"], d["batch"])
                    if budget == "resident":
                        self.assertEqual(d["trunk_units_streamed"], 0)
                        if b == "auto":           # nothing to read again: the whole prompt at once
                            self.assertEqual(d["batch"], d["prompt_tokens"])
                    else:
                        self.assertGreater(d["trunk_units_streamed"], 0)
                    if budget == "above":
                        above[b] = d
                    print("%-5s %-8s -b %-4s: batch %4d, %2d units streamed, buffers %6.1f MiB, read %7.1f MiB"
                          % (self.__class__.__name__[9:], budget, b, d["batch"], d["trunk_units_streamed"],
                             d["buffers_bytes"] / 2**20, d["bytes_read"] / 2**20))
            if len(above) == 2:
                self.assertGreater(above["auto"]["batch"], 7)
                self.assertLess(above["auto"]["bytes_read"], above["7"]["bytes_read"])


class TestBatchTiny(BatchCase, unittest.TestCase):
    n = 8
    above = 2000000
    samplers = ([], SAMPLING)

    @classmethod
    def setUpClass(cls):
        cls.pack = make_pack("tiny", 29)[1]
        cls.prompt = CANON_PROMPT * 3


class TestBatchTinyLong(BatchCase, unittest.TestCase):
    """a prompt of more than 1,024 tokens: -b 512 takes it in three passes, -b auto in as few as the
    budget allows, evenly split, -b 1 one token a pass; the same ids"""
    n = 4
    above = 2000000
    samplers = ([],)

    @classmethod
    def setUpClass(cls):
        cls.pack = make_pack("tiny", 29)[1]
        cls.prompt = CANON_PROMPT * 40

    def gen(self, extra):
        d = BatchCase.gen(self, extra)
        self.assertGreater(d["prompt_tokens"], 1024)
        return d


class TestBatchKjv(BatchCase, unittest.TestCase):
    n = 8
    above = 2000000
    samplers = ([], SAMPLING)

    @classmethod
    def setUpClass(cls):
        cls.pack = kjv_pack(os.path.join(TMP, "k3run-batch"))
        cls.prompt = ("In the beginning God created the heaven and the earth. And the earth was without form, "
                      "and void; and darkness was upon the face of")


class TestBatchSmall(BatchCase, unittest.TestCase):
    """small streams 175 MB of trunk a pass at its least budget: a short prompt, greedy only, and
    under ASan (~5x slower) fewer cases"""
    n = 4
    above = 48 << 20
    samplers = ([],)

    @classmethod
    def setUpClass(cls):
        cls.pack = make_pack("small", 29)[1]
        cls.prompt = "Once upon a time, there was a little"

    def cases(self):
        if SANITIZED:
            return [("resident", "auto"), ("resident", "512"), ("least", "7"), ("above", "7"), ("above", "auto")]
        return BatchCase.cases(self)

    def test_cgroup_limit(self):
        """-b auto with a long prompt inside a cgroup v1 memory limit equal to the budget: a budget
        where the trunk streams, and one where it is resident and the experts come through a cache"""
        if SANITIZED:
            self.skipTest("ASan build: its shadow memory and quarantine are not part of k3run's budget")
        with open(os.path.join(self.pack, "manifest.json")) as f:
            mf = json.load(f)
        trunk = sum(t["size"] for t in mf["tensors"] if t["name"] != "model.embed_tokens.weight")
        low = minimum(self.pack, [])
        prompt = " ".join([CANON_PROMPT] * 12)
        for name, b in (("streamed", low + (96 << 20)), ("expert cache", low + trunk + (160 << 20))):
            d = json.loads(k3run(["-m", self.pack, "-p", prompt, "-n", "2", "--json", "--budget", str(b)]).stdout)
            self.assertTrue(d["batch_auto"] and d["resident_bytes"] <= b)
            self.assertGreater(d["batch"], 64, "the long prompt in large passes")
            p, peak = in_memory_cgroup(self, ["-m", self.pack, "-p", prompt, "-n", "2", "--print-ids", "--budget", str(b)], b)
            print("cgroup limit %d (%s, -b auto: batch %d of %d prompt tokens, buffers %.1f MiB): exit %d, "
                  "peak usage %d (%.0f%%)" % (b, name, d["batch"], d["prompt_tokens"], d["buffers_bytes"] / 2**20,
                                             p.returncode, peak, 100.0 * peak / b))
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(p.stdout.decode().split(), [str(i) for i in d["generated_ids"]])


if __name__ == "__main__":
    unittest.main()

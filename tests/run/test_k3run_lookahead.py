"""Lookahead expert reads (issue 16 part 2, docs/PERFORMANCE.md "Lookahead expert reads"): the
generated ids are the same with K3_LOOKAHEAD=0 (off) and 64 (every predicted expert), greedy and
seeded sampling, at a budget where the expert cache must evict with the whole trunk resident and
at one where trunk units are streamed, at 1 and 2 threads, on the trained demo model (k3-kjv) and
on `small` (random weights, 256 experts, top-16). With lookahead on, the counters in --json show
reads ahead issued and used (a later acquire found them), issued = used + wasted + pending, and
they are the same at 1 and 2 threads (which slots a read ahead may evict depends on the routing
only, never on the disk's timing); with it off they are all zero. K3_LOOKAHEAD=1 and 2 (each
token's likeliest experts only) give the same ids with fewer reads ahead; with speculative
decoding on (--draft 8) the ids are the same with lookahead on and off.

No timing here: speed is tests/bench/bench_lookahead.sh's."""

import json
import os
import unittest

from runlib import CANON_PROMPT, TMP, k3run, kjv_pack, make_pack, minimum_budget

COUNTERS = ("prefetch_issued", "prefetch_used", "prefetch_wasted", "prefetch_pending")


def pack_sizes(pack):
    """(bytes of expert shards, bytes of trunk tensors but the embedding, expert records)."""
    with open(os.path.join(pack, "manifest.json")) as f:
        mf = json.load(f)
    experts = sum(os.path.getsize(os.path.join(pack, n)) for n in os.listdir(pack) if n.startswith("experts"))
    trunk = sum(t["size"] for t in mf["tensors"] if t["name"] != "model.embed_tokens.weight")
    return experts, trunk, sum(x["count"] for x in mf["expert_layers"])


class LookaheadCase:
    prompt = CANON_PROMPT
    n = 12
    # the "evict" budget: the minimum + this share of the trunk's bytes + this share of the experts'
    # (the minimum already holds two stream buffers); checked below to keep the whole trunk
    # resident with a cache smaller than the experts
    evict_share = (1.0, 1 / 6)

    @classmethod
    def budgets(cls, pack):
        # batch 64's minimum: the prompt in one pass (at batch 1's, -b auto's floor, its 20 tokens
        # would be 20 passes, each streaming the trunk: minutes of this test, nothing it checks)
        mn = minimum_budget(pack, batch=64)
        experts, trunk, cls.records = pack_sizes(pack)
        # evict: the whole trunk resident, a cache smaller than the experts; streamed: the minimum
        # (trunk units streamed through two buffers, the smallest cache)
        return {"evict": mn + int(trunk * cls.evict_share[0] + experts * cls.evict_share[1]), "streamed": mn}

    def run_at(self, budget, threads, lookahead, mode, draft="0"):
        # --draft 0: plain decoding, whose passes do not depend on timing (speculation's draft
        # length adapts to measured pass times, so its batches, and what they read, may differ
        # from run to run); test_with_speculation checks the ids with it on
        args = ["-m", self.pack, "-p", self.prompt, "-n", str(self.n), "--json", "-t", str(threads),
                "--budget", str(budget), "--draft", draft] + mode
        # on: every predicted expert (K3_LOOKAHEAD above the top-k, whatever k3run's default); off: 0
        return json.loads(k3run(args, env={"K3_LOOKAHEAD": "64" if lookahead else "0"}).stdout)

    def test_with_speculation(self):
        """speculative decoding (k3run's default --draft) and lookahead together: the same ids"""
        for bname, budget in self.budgets(self.pack).items():
            off = self.run_at(budget, 2, False, [], draft="8")
            on = self.run_at(budget, 2, True, [], draft="8")
            self.assertEqual(on["generated_ids"], off["generated_ids"], "budget %s" % bname)
            self.assertGreater(on["prefetch_used"], 0, "budget %s" % bname)

    def test_fewer_ahead(self):
        """K3_LOOKAHEAD=N reads ahead only each token's N likeliest: the same ids, fewer reads issued"""
        budget = self.budgets(self.pack)["evict"]
        args = ["-m", self.pack, "-p", self.prompt, "-n", str(self.n), "--json", "--budget", str(budget),
                "--draft", "0"]
        full = json.loads(k3run(args, env={"K3_LOOKAHEAD": "64"}).stdout)
        for n in (1, 2):
            r = json.loads(k3run(args, env={"K3_LOOKAHEAD": str(n)}).stdout)
            self.assertEqual(r["generated_ids"], full["generated_ids"], "K3_LOOKAHEAD=%d" % n)
            self.assertGreater(r["prefetch_used"], 0, "K3_LOOKAHEAD=%d" % n)
            self.assertLess(r["prefetch_issued"], full["prefetch_issued"], "K3_LOOKAHEAD=%d" % n)

    def test_same_ids_with_and_without(self):
        sanitized = os.environ.get("K3_SANITIZED") == "1"
        modes = {"greedy": ["--temp", "0"], "sampled": ["--temp", "0.9", "--top-p", "0.95", "--seed", "7"]}
        for bname, budget in self.budgets(self.pack).items():
            for mname, mode in modes.items():
                if (sanitized or self.name == "small") and mname == "sampled":
                    continue                # sampled: on the demo model (small's random weights add no path)
                ref, counts = None, None
                for threads in (1, 2):
                    off = self.run_at(budget, threads, False, mode)
                    on = self.run_at(budget, threads, True, mode)
                    what = "%s, budget %s (%d), %d threads, %s" % (self.name, bname, budget, threads, mname)
                    ref = ref or off["generated_ids"]
                    self.assertEqual(len(off["generated_ids"]), self.n, what)
                    self.assertEqual(off["generated_ids"], ref, what + ": lookahead off differs between threads")
                    self.assertEqual(on["generated_ids"], ref, what + ": lookahead changed the generated ids")
                    self.assertLess(on["expert_slots"], self.records, what + ": the cache must evict")
                    streamed = on["trunk_units_streamed"]
                    if bname == "streamed":
                        self.assertGreater(streamed, 0, what)
                    else:
                        self.assertEqual(streamed, 0, what)
                    for k in COUNTERS:
                        self.assertEqual(off[k], 0, what + ": %s with lookahead off" % k)
                    self.assertGreater(on["prefetch_used"], 0, what + ": no read ahead was used")
                    self.assertEqual(on["prefetch_issued"],
                                     on["prefetch_used"] + on["prefetch_wasted"] + on["prefetch_pending"], what)
                    c = tuple(on[k] for k in COUNTERS) + (on["expert_hits"], on["expert_misses"])
                    counts = counts or c
                    self.assertEqual(c, counts, what + ": the cache depends on more than the routing")
                    print("%-6s %-8s %d thr %-7s: hits %4d -> %4d, misses %4d -> %4d; ahead: %4d issued, %4d used, "
                          "%3d wasted, %2d pending" % (self.name, bname, threads, mname, off["expert_hits"],
                                                       on["expert_hits"], off["expert_misses"], on["expert_misses"],
                                                       *(on[k] for k in COUNTERS)))


class TestLookaheadKjv(LookaheadCase, unittest.TestCase):
    name = "k3-kjv"
    prompt = "In the beginning God"
    n = 24
    evict_share = (0.7, 0)         # 256 records of 12 KiB: about 80 slots

    @classmethod
    def setUpClass(cls):
        cls.pack = kjv_pack(os.path.join(TMP, "k3run-lookahead"))


class TestLookaheadSmall(LookaheadCase, unittest.TestCase):
    name = "small"

    @classmethod
    def setUpClass(cls):
        cls.pack = make_pack("small", 29)[1]


if __name__ == "__main__":
    unittest.main()

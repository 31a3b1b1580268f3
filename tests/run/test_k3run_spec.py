"""Speculative decoding (issue 16): with drafts on, k3run writes exactly the ids of plain decoding
(--draft 0, one token per pass), greedy and seeded sampling, on the trained demo model and on
`tiny`, with the whole model in memory and at a budget where the trunk streams and the expert
cache evicts, at 1 and 2 threads. Four kinds of drafts: the length rule's (the default), the
longest the text offers (K3_DRAFT_TEST=full), the right continuation (K3_DRAFT_TEST=oracle:IDS,
the ids plain decoding wrote: all accepted) and the same with one drafted token per pass changed
at offset 0, 1, 2, ... in turn (oracle-spoil:IDS), so a verify pass is rolled back at every
offset of a draft. The counters
(--json: passes, drafted, accepted, tokens_per_pass) show the drafts were verified and accepted.
`k3run chat` answers the same with drafts on and off, over two turns with the prompt cache.
The length rule learns acceptance from every lookup, drafted or not (issue 32), so it drafts on
text that repeats itself with the demo model in memory, where a drafted token costs most of a pass."""

import json
import os
import re
import subprocess
import unittest

from runlib import BIN, TMP, kjv_pack, make_pack

K3RUN = os.path.join(BIN, "k3run")
SANITIZED = os.environ.get("K3_SANITIZED") == "1"

# the demo model quotes Genesis; a prompt that repeats itself invites long drafts
KJV_PROMPT = ("In the beginning God created the heaven and the earth. And the earth was without form, "
              "and void; and darkness was upon the face of the deep. And God said, Let there be light: "
              "and there was light. In the beginning God created the heaven and the earth. And the earth")
SAMPLING = ["--temp", "0.9", "--top-p", "0.95", "--seed", "11"]
# the demo model's own loop: it goes on repeating this (issue 32's example)
LOOP_PROMPT = "nor thy son, nor thy son, nor thy son, nor thy son,"


def k3run(args, env=None, check=True):
    e = dict(os.environ)
    e.pop("K3_DRAFT_TEST", None)
    e.update(env or {})
    p = subprocess.run([K3RUN] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e)
    if check and p.returncode != 0:
        raise AssertionError("k3run %s failed (%d): %s" % (" ".join(args), p.returncode,
                                                           p.stderr.decode(errors="replace")))
    return p


def minimum(pack, ids):
    """the planner's minimum budget (without speculation: the refusal states the true floor)"""
    p = k3run(["-m", pack] + ids + ["--budget", "1M", "-n", "1", "--print-ids"], check=False)
    m = re.search(rb"minimum of [0-9.]+ GiB \((\d+) bytes", p.stderr)
    if not m:
        raise AssertionError("no minimum in: %r" % p.stderr)
    return int(m.group(1))


class Spec:
    """Shared checks; a subclass sets pack, prompt (k3run arguments) and n."""

    def run_json(self, extra, env=None):
        p = k3run(["-m", self.pack] + self.prompt + ["-n", str(self.n), "--json"] + extra, env=env)
        return json.loads(p.stdout)

    def streaming_budget(self):
        """the minimum plus room for the verify buffers: the trunk streams, the cache evicts"""
        b = minimum(self.pack, self.prompt) + (1 << 20)
        d = self.run_json(["--budget", str(b), "-n", "1", "--draft", "8"])
        self.assertGreater(d["trunk_units_streamed"], 0)
        self.assertGreater(d["draft_max"], 0, "the budget has room for the verify buffers")
        return ["--budget", str(b)]

    def check_same(self, sampler, modes, threads_list=("1", "2")):
        budgets = ([], self.streaming_budget())
        for budget in budgets:
            for threads in threads_list:
                args = sampler + budget + ["-t", threads]
                plain = self.run_json(args + ["--draft", "0"])
                ids = plain["generated_ids"]
                self.assertEqual(plain["drafted"], 0)
                self.assertEqual(plain["passes"], len(ids))
                self.assertGreater(len(ids), 24)
                oracle = ",".join(map(str, ids))
                for mode in [m if m in ("", "full") else m + ":" + oracle for m in modes]:
                    with self.subTest(budget=budget, threads=threads, drafts=mode.split(":")[0] or "rule"):
                        env = {"K3_DRAFT_TEST": mode} if mode else None
                        d = self.run_json(args + ["--draft", "8"], env=env)
                        self.assertEqual(d["generated_ids"], ids)
                        self.assertEqual(d.get("text"), plain.get("text"))
                        self.assertLessEqual(d["passes"], plain["passes"])
                        self.assertAlmostEqual(d["tokens_per_pass"], len(ids) / d["passes"], places=6)
                        if mode.startswith("oracle:"):         # every draft right: all accepted
                            self.assertEqual(d["accepted"], d["drafted"])
                            self.assertGreater(d["tokens_per_pass"], 3)
                        if mode.startswith("oracle-spoil:"):   # rolled back at every offset 0..7
                            self.assertLess(d["accepted"], d["drafted"])
                            self.assertTrue(all(d["drafts_kept"][j] > 0 for j in range(8)), d["drafts_kept"])

    def test_greedy(self):
        """greedy: the same ids with every kind of draft, two budgets, 1 and 2 threads"""
        if SANITIZED:                                  # ASan is ~5x slower: the rollbacks only
            self.check_same([], ("oracle-spoil",), ("2",))
        else:
            self.check_same([], ("", "full", "oracle", "oracle-spoil"))

    def test_sampling(self):
        """seeded sampling: the sampler draws in plain decoding's order, so the same ids (the
        rule's drafts, and drafts rolled back at every offset; 2 threads, and 1 outside ASan)"""
        self.check_same(SAMPLING, ("", "oracle-spoil"), ("2",) if SANITIZED else ("1", "2"))


class TestSpecKjv(Spec, unittest.TestCase):
    n = 64

    @classmethod
    def setUpClass(cls):
        cls.pack = kjv_pack(os.path.join(TMP, "k3run-spec"))
        cls.prompt = ["-p", KJV_PROMPT]

    def test_long_drafts_accepted(self):
        """on a prompt the model continues by quoting it, drafts from the text itself of several
        tokens are accepted"""
        for extra, env in (([], {"K3_DRAFT_TEST": "full"}),):   # (the rule's own drafts: the test
            d = self.run_json(["--draft", "8"] + extra, env=env)   # below, and tests/bench/bench_spec.py)
            self.assertGreater(d["accepted"], 8)
            self.assertGreater(d["tokens_per_pass"], 1.05)
            self.assertTrue(any(d["drafts_kept"][j] for j in range(2, 9)), d["drafts_kept"])

    def test_rule_drafts_on_repeating_text(self):
        """the length rule drafts at resident on text that repeats itself: a proposal it did not
        draft is compared with the token that came, so acceptance is known before the first draft
        (a rule that learnt only from its drafts started at a = 1/2, below rho, and never drafted:
        48 tokens in 48 passes). Fewer passes than tokens, plain decoding's ids and text, greedy
        and sampled (at 0.5 the loop breaks after a few repeats: a draft rolled back), 1 and 2 threads"""
        for sampler in ([], ["--temp", "0.5", "--seed", "11"]):
            for threads in ("1", "2"):
                args = ["-m", self.pack, "-p", LOOP_PROMPT, "-n", "48", "--json", "-t", threads] + sampler
                plain = json.loads(k3run(args + ["--draft", "0"]).stdout)
                d = json.loads(k3run(args + ["--draft", "8"]).stdout)
                with self.subTest(sampler=sampler, threads=threads):
                    ids = plain["generated_ids"]
                    self.assertEqual(len(ids), 48)
                    self.assertEqual(d["generated_ids"], ids)
                    self.assertEqual(d["text"], plain["text"])
                    self.assertEqual(d["trunk_units_streamed"], 0)          # in memory
                    self.assertEqual(d["draft_max"], 8)
                    self.assertGreater(d["draft_rho"], 0.5, "the premise: at rho <= 1/2 the prior a = 1/2 "
                                       "drafts by itself; find a plan where a drafted token costs more")
                    self.assertEqual(plain["passes"], 48)
                    self.assertLess(d["passes"], 48)
                    self.assertGreater(d["accepted"], 0)
                    if not sampler:                                         # the loop to the end
                        self.assertGreater(d["tokens_per_pass"], 1.5, d)

    def test_chat_same_answers(self):
        """k3run chat: two turns (the second from the prompt cache) answer the same with drafts
        on and off, greedy and sampled"""
        from test_k3run_chat import Q1, Q2
        for sampler in ([], SAMPLING):
            out = {}
            for draft, env in (("0", None), ("8", None), ("8", {"K3_DRAFT_TEST": "spoil"})):
                reqs = []
                msgs = [{"role": "user", "content": Q1}]
                reqs.append({"messages": list(msgs)})
                msgs += [{"role": "assistant", "content": "In the beginning God created the heaven and "
                          "the earth."}, {"role": "user", "content": Q2}]
                reqs.append({"messages": msgs})
                p = subprocess.run([K3RUN, "chat", "-m", self.pack, "--messages", "-", "--json", "-n", "80",
                                    "--draft", draft] + sampler, input="\n".join(map(json.dumps, reqs)).encode(),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   env=dict(os.environ, **(env or {"K3_DRAFT_TEST": ""})))
                self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
                docs = [json.loads(x) for x in p.stdout.decode().splitlines() if x.strip()]
                self.assertEqual(len(docs), 2)
                out[(draft, bool(env))] = [x["message"] for x in docs]
                if draft == "0":
                    self.assertEqual(sum(x["k3"]["drafted"] for x in docs), 0)
                if env:
                    self.assertGreater(sum(x["k3"]["drafted"] for x in docs), 0)
                self.assertGreater(docs[1]["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
            with self.subTest(sampler=sampler):
                self.assertEqual(out[("8", False)], out[("0", False)])
                self.assertEqual(out[("8", True)], out[("0", False)])


class TestSpecTiny(Spec, unittest.TestCase):
    n = 64

    @classmethod
    def setUpClass(cls):
        _, cls.pack = make_pack("tiny", 3)
        # random weights rarely repeat themselves: the oracle drafts exercise acceptance here
        ids = [5, 9, 17, 33, 5, 9, 17, 33, 5, 9, 17, 33, 5, 9]
        cls.prompt = ["--prompt-ids", ",".join(map(str, ids))]


if __name__ == "__main__":
    unittest.main()

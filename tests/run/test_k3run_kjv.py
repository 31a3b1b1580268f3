"""k3run on the trained demo model (tests/models/k3-kjv, docs/MODEL-CARD.md) against the NumPy
reference: greedy ids of three prompts (64 tokens) and every layer within runlib's TOL; the
perplexity of the held-out books equals the reference's and is bit-identical at two budgets,
two thread counts and two batch sizes; the demo's text (scripts/demo.sh's prompts and
options) is King James English: at least 90 % of its words occur in the training books.

The trained model's logits are peaked (a greedy gap of several units where random weights
give tenths), so equal ids over 64 tokens is a stronger check than on random checkpoints."""

import json
import os
import re
import unittest

from runlib import BIN, PY, SRC, TMP, compare_dumps, k3ref, k3run, kjv_pack, minimum_budget, run

CKPT = os.path.join(SRC, "tests", "models", "k3-kjv")
TRAIN = os.path.join(SRC, "tests", "train")
PROMPTS = ["In the beginning God", "And Jesus answered and said",
           "And God said, Let there be light"]
DEMO_PROMPTS = PROMPTS[:2]
N_LAYERS = 9
PPL_CONTEXT, PPL_CHUNKS = 128, 4
# PPL agreement: k3run's and the reference's fp32 logits differ by ~1e-6 relative (TOL states
# 1e-4 for any fp32 order); a token's nll moves by at most max|dlogit| * 2, so the mean nll by
# about 1e-5 and PPL by exp(1e-5) - 1 = 1e-5 relative. 1e-4 leaves 10x headroom; a wrong
# chunking or an off-by-one in the scored positions moves PPL by percents.
PPL_TOL = 1e-4


def demo_args(prompt):
    """The demo's generation options (scripts/demo.sh reads the same line)."""
    with open(os.path.join(SRC, "scripts", "demo.sh"), encoding="utf-8") as f:
        m = re.search(r"^DEMO_GEN='([^']*)'", f.read(), re.M)
    assert m, "scripts/demo.sh has no DEMO_GEN line"
    return m.group(1).split() + ["-p", prompt]


class TestKjv(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = os.path.join(TMP, "k3run-kjv")
        cls.pack = kjv_pack(cls.work)
        cls.data = os.path.join(cls.work, "data")
        if not os.path.exists(os.path.join(cls.data, "kjv-heldout.txt")):
            run([PY, os.path.join(TRAIN, "kjv_data.py"), "--out", cls.data, "--chats", "0"])

    def test_parity(self):
        """greedy ids (64 tokens) and text identical to the reference; every layer within TOL"""
        for i, prompt in enumerate(PROMPTS):
            with self.subTest(prompt=prompt):
                rd, cd = os.path.join(self.work, "ref-%d.st" % i), os.path.join(self.work, "c-%d.st" % i)
                rids = k3ref(["--model", CKPT, "--prompt", prompt, "--n", "64", "--print-ids", "--dump", rd]).stdout
                cids = k3run(["-m", self.pack, "-p", prompt, "-n", "64", "--print-ids", "--dump", cd]).stdout
                self.assertEqual(cids, rids, "greedy ids differ")
                self.assertEqual(len(rids.split()), 64, "stopped early: %r" % rids)
                worst = compare_dumps(self, cd, rd, N_LAYERS)
                print("%r: %d ids identical, worst relative error %.2e" % (prompt, len(rids.split()), worst))

    def ppl(self, extra):
        p = k3run(["-m", self.pack, "--perplexity", os.path.join(self.data, "kjv-heldout.txt"),
                   "--context", str(PPL_CONTEXT), "--chunks", str(PPL_CHUNKS), "--json"] + extra)
        return json.loads(p.stdout)

    def test_perplexity(self):
        """--perplexity equals the reference's on the held-out books; identical at two budgets,
        two thread counts and two batch sizes"""
        ref = json.loads(run([PY, os.path.join(SRC, "tests", "reference", "perplexity.py"), "--model", CKPT,
                              "--file", os.path.join(self.data, "kjv-heldout.txt"), "--context", str(PPL_CONTEXT),
                              "--chunks", str(PPL_CHUNKS), "--json"]).stdout)
        c = self.ppl([])
        for key in ("context", "chunks", "tokens_scored"):
            self.assertEqual(c[key], ref[key], key)
        self.assertEqual(c["tokens_scored"], PPL_CHUNKS * (PPL_CONTEXT - 1 - PPL_CONTEXT // 2))
        self.assertLessEqual(abs(c["ppl"] / ref["ppl"] - 1), PPL_TOL, "k3run %r vs reference %r" % (c, ref))
        self.assertLessEqual(abs(c["ppl_stderr"] / ref["ppl_stderr"] - 1), 10 * PPL_TOL)
        for a, b in zip(c["running"], ref["running"]):
            self.assertLessEqual(abs(a / b - 1), PPL_TOL)
        print("held-out PPL (%d chunks of %d): k3run %.6f, reference %.6f" % (PPL_CHUNKS, PPL_CONTEXT, c["ppl"], ref["ppl"]))
        low = minimum_budget(self.pack)
        for extra in (["--budget", str(low)], ["-t", "1"], ["-t", "2", "--batch", "7"], ["--budget", "4G", "-t", "1"]):
            with self.subTest(args=extra):
                x = self.ppl(extra)
                for key in ("ppl", "ppl_stderr", "running", "tokens_scored"):
                    self.assertEqual(x[key], c[key], "%s differs with %s" % (key, extra))

    def test_kl_divergence(self):
        """--save-logits / --kl-divergence against the 8-bit trunk (tests/reference/trunk_quant.py):
        the mean KL, its 99th percentile, maximum and top-token agreement equal a NumPy computation
        over the two runs' saved logits; a model compared with itself has KL 0 and agreement 1; a
        base of another --chunks is refused (exit 2)"""
        import numpy as np
        q8 = os.path.join(self.work, "kjv-q8")
        if not os.path.exists(os.path.join(q8, "manifest.json")):
            run([PY, os.path.join(SRC, "tests", "reference", "trunk_quant.py"), "--checkpoint", CKPT,
                 "--out", q8 + "-ckpt", "--bits", "8"])
            run([os.path.join(BIN, "k3pack"), "-q", "--force", q8 + "-ckpt", "-o", q8])
        base, other = os.path.join(self.work, "base.logits"), os.path.join(self.work, "q8.logits")
        self.ppl(["--save-logits", base])
        same = self.ppl(["--kl-divergence", base])
        self.assertEqual((same["kl_mean"], same["kl_max"], same["top1_agreement"]), (0.0, 0.0, 1.0))
        p = k3run(["-m", q8, "--perplexity", os.path.join(self.data, "kjv-heldout.txt"), "--context",
                   str(PPL_CONTEXT), "--chunks", str(PPL_CHUNKS), "--json", "--kl-divergence", base,
                   "--save-logits", other])
        got = json.loads(p.stdout)

        def rows(path):
            raw = open(path, "rb").read()
            v = np.frombuffer(raw[8:12], np.uint32)[0]
            return np.frombuffer(raw[32:], np.float32).reshape(-1, v).astype(np.float64)
        b, q = rows(base), rows(other)
        lb = b - b.max(1, keepdims=True)
        lb -= np.log(np.exp(lb).sum(1, keepdims=True))
        lq = q - q.max(1, keepdims=True)
        lq -= np.log(np.exp(lq).sum(1, keepdims=True))
        kl = np.maximum((np.exp(lb) * (lb - lq)).sum(1), 0)
        top1 = float((b.argmax(1) == q.argmax(1)).mean())
        self.assertEqual(got["kl_tokens"], len(kl))
        self.assertLessEqual(abs(got["kl_mean"] / kl.mean() - 1), 1e-9)
        self.assertLessEqual(abs(got["kl_max"] / kl.max() - 1), 1e-9)
        self.assertLessEqual(abs(got["kl_p99"] / np.sort(kl)[int(np.ceil(0.99 * len(kl))) - 1] - 1), 1e-9)
        self.assertEqual(got["top1_agreement"], top1)
        self.assertGreater(kl.mean(), 0)
        print("q8 trunk against exact (%d tokens): KL %.6f nats, same top token %.2f %%, PPL %.4f" % (
            len(kl), kl.mean(), 100 * top1, got["ppl"]))
        p = k3run(["-m", self.pack, "--perplexity", os.path.join(self.data, "kjv-heldout.txt"), "--context",
                   str(PPL_CONTEXT), "--chunks", str(PPL_CHUNKS - 1), "--kl-divergence", base], check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(b"--chunks", p.stderr)

    def test_perplexity_errors(self):
        """a file shorter than two contexts, a bad --chunks: exit 2 with the reason"""
        short = os.path.join(self.work, "short.txt")
        with open(short, "w") as f:
            f.write("And God said, Let there be light: and there was light.\n")
        p = k3run(["-m", self.pack, "--perplexity", short, "--context", "128"], check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(b"2 x --context", p.stderr)
        p = k3run(["-m", self.pack, "--perplexity", "/no/such/file.txt"], check=False)
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn(b"/no/such/file.txt", p.stderr)
        p = k3run(["-m", self.pack, "--perplexity", short, "--chunks", "x"], check=False)
        self.assertEqual(p.returncode, 2, p.stderr)

    def test_demo_text_is_kjv(self):
        """at least 90 % of the demo's words occur in the training books"""
        with open(os.path.join(self.data, "kjv-train.txt"), encoding="utf-8") as f:
            vocab = set(re.findall(r"[A-Za-z]+", f.read().lower()))
        words = []
        for prompt in DEMO_PROMPTS:
            text = k3run(["-m", self.pack] + demo_args(prompt)).stdout.decode("utf-8", "replace")
            print("%s%s" % (prompt, text))
            words += re.findall(r"[A-Za-z]+", text.lower())
        self.assertGreaterEqual(len(words), 40, "the demo says too little: %r" % words)
        known = sum(w in vocab for w in words)
        print("demo: %d of %d words occur in the training books (%.1f %%)" % (known, len(words), 100 * known / len(words)))
        self.assertGreaterEqual(known, 0.9 * len(words))


if __name__ == "__main__":
    unittest.main()

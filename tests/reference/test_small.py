"""Checks on the `small` preset (K3 sparsity: 256 experts, 16 active, ~1 GB of MXFP4 experts).

Slow (about a minute on an idle 2-core machine, ~1.2 GB of temp disk), so it only runs with
K3_TEST_SMALL=1 (the ctest registration sets it and gives it a longer timeout):

  K3_TEST_SMALL=1 /usr/bin/python3 -m unittest discover -s tests/reference -p test_small.py

Generates small (seed SMALL_SEED) into a temp dir, runs a short prompt + 8 generated tokens,
and checks: generation time and size, layout vs config, activation health, routing use, and
that the smallest top-k margin is well above the fp32-vs-f64 router-score error.
"""

import os
import shutil
import sys
import tempfile
import time
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import make_checkpoint as mc                      # noqa: E402
from k3model import Model, generate               # noqa: E402
from safetensors_io import ModelDir               # noqa: E402

SMALL_SEED = 29     # the canonical fixture (README "Routing margins")
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time, there was a little"


@unittest.skipUnless(os.environ.get("K3_TEST_SMALL") == "1", "set K3_TEST_SMALL=1 to run (about a minute)")
class TestSmall(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="k3ref-small-")
        cls.dir = os.path.join(cls.tmp, "small")
        t0 = time.time()
        cls.summary = mc.make_checkpoint("small", SMALL_SEED, cls.dir)
        cls.make_seconds = time.time() - t0

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_made_quickly_and_sized(self):
        self.assertLess(self.make_seconds, 60)
        self.assertTrue(0.9e9 < self.summary["expert_bytes"] < 1.1e9, self.summary["expert_bytes"])
        md = ModelDir(self.dir)
        import json
        with open(os.path.join(self.dir, "config.json")) as f:
            tc = json.load(f)["text_config"]
        want = {n: (dt, tuple(s)) for n, dt, s in mc.tensor_specs(tc)}
        got = {n: (md.dtype(n), md.shape(n)) for n in md.names if n.startswith("language_model.")}
        self.assertEqual(got, want)
        self.assertGreaterEqual(tc["num_experts"], 128)
        self.assertEqual(tc["num_experts_per_token"], 16)
        md.close()

    def test_generation_routing_and_margins(self):
        from kimi_tokenizer import Tokenizer
        ids = Tokenizer.from_dir(self.dir).encode(PROMPT)
        m = Model(self.dir)
        t0 = time.time()
        gen, rec = generate(m, ids, 8, m.cfg.eos)
        seconds = time.time() - t0
        self.assertLess(seconds, 90)                      # ~20 s idle; generous for a loaded CI box
        self.assertEqual(len(gen), 8)
        m64 = Model(self.dir, mode="f64")
        r64 = m64.forward(rec["ids"], m64.new_state())
        err, margin = 0.0, np.inf
        for i, (a, b) in enumerate(zip(rec["layers"], r64["layers"])):
            rms = float(np.sqrt(np.mean(a["out"].astype(np.float64) ** 2)))
            self.assertTrue(0.3 < rms < 10, (i, rms))
            d = float(np.abs(a["out"].astype(np.float64) - b["out"]).max() / np.abs(b["out"]).max())
            self.assertLess(d, 1e-4, i)
            if "experts" in a:
                self.assertGreaterEqual(len(np.unique(a["experts"])), 0.5 * m.cfg.E, i)
                self.assertTrue(np.array_equal(np.sort(a["experts"], 1), np.sort(b["experts"], 1)), i)
                err = max(err, float(np.abs(a["sel"] - b["sel"]).max()))
                margin = min(margin, float(a["margin"].min()))
        self.assertLess(m.glu_stats["sat"] / m.glu_stats["n"], 1e-3)
        self.assertGreater(margin, 10 * err, "min margin %.3e vs fp32 score error %.3e" % (margin, err))
        self.assertTrue(np.array_equal(rec["logits"].argmax(-1), r64["logits"].argmax(-1)))


if __name__ == "__main__":
    unittest.main()

"""k3run against the NumPy reference on the small preset (K3's sparsity: 256
experts, top-16, 2 shared, ~1 GB of MXFP4 experts): the canonical seed-29
fixture, every layer's hidden state and the logits within TOL (runlib.py),
8 greedy ids identical, and a batch equal to token by token."""

import os
import unittest

from runlib import CANON_PROMPT, TMP, compare_dumps, k3ref, k3run, make_pack

N = 8


class TestSmallParity(unittest.TestCase):
    def test_parity(self):
        ck, pk = make_pack("small", 29)
        rd, cd = os.path.join(TMP, "k3run-small-ref.st"), os.path.join(TMP, "k3run-small-c.st")
        rids = k3ref(["--model", ck, "--prompt", CANON_PROMPT, "--n", str(N), "--print-ids", "--dump", rd]).stdout
        cids = k3run(["-m", pk, "-p", CANON_PROMPT, "-n", str(N), "--print-ids", "--dump", cd]).stdout
        self.assertEqual(cids, rids)
        worst = compare_dumps(self, cd, rd, 9)
        print("small: %d ids identical, worst relative error %.2e" % (N, worst))
        one = k3run(["-m", pk, "-p", CANON_PROMPT, "-n", str(N), "--print-ids", "--batch", "1", "-t", "1"]).stdout
        self.assertEqual(one, cids)


if __name__ == "__main__":
    unittest.main()

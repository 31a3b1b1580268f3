"""The soak of `k3run serve` in short (issue 35; ctest serve.soak, also under ASan): 4 clients for
25 s against --parallel 2 on the tiny model, mixing every API plain and streamed, the fixed greedy
request, cancellations, disconnects, bad JSON, wrong keys, oversized bodies, slow headers and slow
readers (tests/bench/soak_serve.py, whose 30-minute run is the benchmark). Every accepted request
answered completely or with its API's error, the fixed answer never changing, RSS (but under ASan,
where LeakSanitizer's check at exit stands for it) and descriptors back to their level after
warm-up, SIGTERM exit 0."""

import os
import sys
import unittest

from servelib import make_pack

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from soak_serve import soak  # noqa: E402


class Soak(unittest.TestCase):
    def test_soak(self):
        _, pack = make_pack("tiny", 1)
        # under ASan the RSS check is its leak check at exit (its quarantine holds freed memory)
        rep = soak(pack, 25, 4, seed=35, extra=["-t", "1", "--parallel", "2"],
                   check_rss=os.environ.get("K3_SANITIZED") != "1")
        print("%d requests in %.0f s; by kind: %s" % (rep["requests"], rep["seconds"], rep["by_kind"]))
        self.assertEqual(rep["problems"], [])
        self.assertEqual(rep["exit"], 0)
        kinds = {k.split()[0] for k in rep["by_kind"]}
        for k in ("plain", "stream", "fixed", "cancelled", "disconnected", "bad", "wrong", "oversized", "slow"):
            self.assertIn(k, kinds, rep["by_kind"])


if __name__ == "__main__":
    unittest.main()

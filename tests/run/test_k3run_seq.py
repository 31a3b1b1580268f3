"""Many sequences in one pass, at the engine (issue 33): build/bin/seq_exact (tests/run/seq_exact.c)
runs S sequences alone, then side by side in shared passes (joining at different passes, prompt
chunks beside decode rows and verify passes of right and wrong drafts), and requires every logits
row to hash as the same row alone; then a session saved from sequence 1 in the shared run and
loaded into sequence 0 must go on the same. Here: tiny, the demo model and small, resident and at a
budget that streams the trunk (seq_exact's "min": the least above the planner's minimum with room
for the verify pass), 1 and 2 threads, S = 1 to 6."""

import os
import re
import subprocess
import unittest

from runlib import BIN, TMP, kjv_pack, make_pack

SANITIZED = os.environ.get("K3_SANITIZED") == "1"


def seq_exact(pack, budget, threads, S, steps=24):
    p = subprocess.run([os.path.join(BIN, "seq_exact"), pack, str(budget), str(threads), str(S), str(steps)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600,
                       env=dict(os.environ, TMPDIR=TMP))
    return p.returncode, p.stdout.decode() + p.stderr.decode()


class TestSeq(unittest.TestCase):
    def run_case(self, pack, budget, threads, S, label, steps=24):
        rc, out = seq_exact(pack, budget, threads, S, steps)
        print("%s, S = %d, %d threads:\n%s" % (label, S, threads, out.strip()))
        self.assertEqual(rc, 0, "%s, S = %d, %d threads: %s" % (label, S, threads, out))
        streamed = int(re.search(r"(\d+) of \d+ trunk units streamed", out).group(1))
        (self.assertGreater if budget == "min" else self.assertEqual)(streamed, 0, label)
        if S > 1:
            self.assertIn("session at row", out)
            self.assertNotIn("verify 0,", out)               # the plan has its verify pass
            self.assertNotIn(" 0 verify passes beside others", out)
        return out

    def test_tiny(self):
        tiny = make_pack("tiny", 1)[1]
        for S in (1, 2, 3, 5, 6):
            self.run_case(tiny, 8 << 30, 2 if S % 2 else 1, S, "tiny resident")
        for S in (2, 4, 6):
            self.run_case(tiny, "min", 1 if S == 4 else 2, S, "tiny streamed")

    def test_demo_model(self):
        kjv = kjv_pack(os.path.join(TMP, "k3run-seq"))
        self.run_case(kjv, 8 << 30, 2, 4, "demo model resident")
        self.run_case(kjv, "min", 1, 3, "demo model streamed")

    @unittest.skipIf(SANITIZED, "the small preset: in the Release build only (label heavy's rule)")
    def test_small(self):
        small = make_pack("small", 7)[1]
        self.run_case(small, 8 << 30, 2, 3, "small resident", steps=8)
        self.run_case(small, "min", 2, 2, "small streamed", steps=8)


if __name__ == "__main__":
    unittest.main()

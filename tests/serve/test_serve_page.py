"""The chat page of `k3run serve` in a real browser (issue 17; ctest serve.page): headless Chromium
(Debian's, driven by playwright-core) opens /, asks a question, and the test reads the streamed
answer from the page's DOM: it equals the API's answer to the same conversation (the page's
request: thinking on, then off); the reasoning sits folded in its own box; nothing is fetched from
anywhere but the server; a screenshot is saved. Skipped, with the reason, where Chromium or node
cannot start."""

import json
import os
import shutil
import subprocess
import unittest

from servelib import TMP, Server, kjv_pack

HERE = os.path.dirname(os.path.abspath(__file__))
PW = os.path.join(HERE, "node_modules", "playwright-core", "package.json")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
Q = "Quote Genesis 1:1."


def can_start(exe):
    try:
        p = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", "about:blank"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        return p.returncode == 0, p.stderr.decode(errors="replace")[-300:]
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)


@unittest.skipUnless(shutil.which("node") and os.path.exists(PW),
                     "node or playwright-core is missing (scripts/setup.sh installs them)")
@unittest.skipUnless(CHROMIUM, "Chromium is not installed (scripts/setup.sh installs Debian's chromium)")
class TestPage(unittest.TestCase):
    def test_page(self):
        ok, why = can_start(CHROMIUM)
        if not ok:
            self.skipTest("Chromium cannot start here: " + why)
        work = os.path.join(TMP, "k3run-serve-page")
        os.makedirs(work, exist_ok=True)
        pack = kjv_pack(work)
        shot = os.path.join(work, "page.png")
        srv = Server(pack, ["-t", "2", "-n", "80"])
        try:
            p = subprocess.run(["node", os.path.join(HERE, "page_client.mjs"), srv.url("/"), Q, shot, CHROMIUM],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300, cwd=HERE)
            self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace")[-2000:])
            got = json.loads(p.stdout)
            # the same conversations through the API
            body = {"messages": [{"role": "user", "content": Q}]}
            st, want = srv.chat(body)
            self.assertEqual(st, 200)
            m = want["choices"][0]["message"]                      # the page keeps the answer as it came
            turn2 = body["messages"] + [{"role": "assistant", "content": m["content"],
                                         "reasoning_content": m["reasoning_content"]}, {"role": "user", "content": Q}]
            st, want2 = srv.chat({"messages": turn2, "reasoning_effort": "none"})
        finally:
            rc = srv.stop()
        self.assertEqual(rc, 0, srv.stderr())
        self.assertEqual(got["errors"], [])
        self.assertEqual(got["model"], "k3-kjv.k3pack")
        self.assertEqual(got["user"], Q)
        m = want["choices"][0]["message"]
        self.assertEqual(got["content"], m["content"])
        self.assertEqual(got["reasoning"], m["reasoning_content"])
        self.assertTrue(got["reasoning"])
        self.assertIn("finish: " + want["choices"][0]["finish_reason"], got["meta"])
        self.assertEqual(got["second"]["content"], want2["choices"][0]["message"]["content"])
        self.assertTrue(got["second"]["folded"])                  # no reasoning: its box stays hidden
        host = srv.url("")
        self.assertTrue(all(u.startswith(host) for u in got["requests"]), got["requests"])
        self.assertGreater(os.path.getsize(shot), 10000)
        print("page: %r / %r; screenshot %s" % (got["reasoning"], got["content"], shot))


if __name__ == "__main__":
    unittest.main()

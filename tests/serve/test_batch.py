"""`k3run batch` (issue 33): a file of OpenAI Batch API requests.

- 20 requests (chat and completions, greedy and sampled), a line that is not JSON and a body the API
  refuses: every request gets one line; each answer's choices and usage equal `k3run serve`'s for the
  same body (one slot, sent one after another), at --parallel 1 and 4;
- a custom_id given twice: refused (exit 2) before anything is written;
- killed (SIGKILL) at random moments and rerun until it ends: every custom_id exactly once, no torn
  line, the answers of the run that was never stopped; a torn last line left by hand is cut off."""

import json
import os
import random
import signal
import subprocess
import time
import unittest

from servelib import BIN, Server, TMP, kjv_pack

SANITIZED = os.environ.get("K3_SANITIZED") == "1"
WORK = os.path.join(TMP, "k3run-batch-file")
PROMPTS = ["Who was Moses?", "In the beginning", "Tell me of Noah.", "And the LORD said unto", "Blessed is the man",
           "Recite Genesis 1:1."]


def requests(n):
    out = []
    for i in range(n):
        body = {"max_tokens": 6 + (i * 7) % 23, "seed": i}
        if i % 3 == 1:
            body.update(temperature=0.9, top_p=0.95)
        else:
            body["temperature"] = 0
        if i % 2:
            body["prompt"] = PROMPTS[i % len(PROMPTS)]
            url = "/v1/completions"
        else:
            body["messages"] = [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]
            url = "/v1/chat/completions"
        out.append({"custom_id": "req-%02d" % i, "method": "POST", "url": url, "body": body})
    return out


def write_input(path, reqs, extra=()):
    with open(path, "w") as f:
        for i, r in enumerate(reqs):
            f.write(json.dumps(r) + "\n")
            if i == 3:
                for line in extra:
                    f.write(line + "\n")


def batch(pack, inp, out, args=(), check=True, **kw):
    p = subprocess.run([os.path.join(BIN, "k3run"), "batch", "-m", pack, inp, "-o", out, "-t", "2"] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600, **kw)
    if check:
        assert p.returncode == 0, p.stderr.decode()
    return p


def lines(path):
    with open(path, "rb") as f:
        data = f.read()
    assert not data or data.endswith(b"\n"), "a torn line"
    return [json.loads(x) for x in data.decode().splitlines()]


def what(doc):
    """The parts of an answer that do not depend on when or where it was made: the choices and the
    token counts (not cached_tokens: what the slot's prompt cache held depends on the order)."""
    u = {k: v for k, v in doc["usage"].items() if k != "prompt_tokens_details"}
    return {"choices": doc["choices"], "usage": u}


class TestBatch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        os.makedirs(WORK, exist_ok=True)
        cls.pack = kjv_pack(WORK)
        cls.reqs = requests(12 if SANITIZED else 20)
        cls.inp = os.path.join(WORK, "in.jsonl")
        write_input(cls.inp, cls.reqs, ['not json at all', json.dumps(
            {"custom_id": "bad-body", "method": "POST", "url": "/v1/completions", "body": {"prompt": 7}})])
        srv = Server(cls.pack, ["--parallel", "1", "-t", "2"])
        try:
            cls.want = {}
            for r in cls.reqs:
                st, _, body = srv.request("POST", r["url"], json.dumps(r["body"]).encode(),
                                          {"Content-Type": "application/json"})
                assert st == 200, body
                cls.want[r["custom_id"]] = what(json.loads(body))
        finally:
            assert srv.stop() == 0

    def check_answers(self, out):
        got = lines(out)
        ids = [g["custom_id"] for g in got]
        self.assertEqual(sorted(i for i in ids if i), sorted(list(self.want) + ["bad-body"]), "every id once")
        self.assertEqual(ids.count(None), 1, "the line that is not JSON: one error line")
        for g in got:
            if g["custom_id"] is None:
                self.assertEqual(g["response"], None)
                self.assertIn("not JSON", g["error"]["message"])
            elif g["custom_id"] == "bad-body":
                self.assertEqual(g["response"]["status_code"], 400)
                self.assertIn("prompt", g["response"]["body"]["error"]["message"])
            else:
                self.assertEqual(g["response"]["status_code"], 200, g)
                self.assertEqual(what(g["response"]["body"]), self.want[g["custom_id"]], g["custom_id"])
        return got

    def test_equal_to_serve(self):
        for S in (("4",) if SANITIZED else ("1", "4")):
            out = os.path.join(WORK, "out-%s.jsonl" % S)
            if os.path.exists(out):
                os.remove(out)
            batch(self.pack, self.inp, out, ["--parallel", S])
            self.check_answers(out)
            # a rerun has nothing left to do and changes nothing
            with open(out, "rb") as f:
                before = f.read()
            batch(self.pack, self.inp, out, ["--parallel", S])
            with open(out, "rb") as f:
                self.assertEqual(f.read(), before)

    def test_duplicate_refused(self):
        inp = os.path.join(WORK, "dup.jsonl")
        write_input(inp, self.reqs[:3] + [dict(self.reqs[1])])
        out = os.path.join(WORK, "dup-out.jsonl")
        if os.path.exists(out):
            os.remove(out)
        p = batch(self.pack, inp, out, check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(b"req-01", p.stderr)
        self.assertIn(b"lines 2 and 4", p.stderr)
        self.assertFalse(os.path.exists(out) and os.path.getsize(out), "nothing written")

    def test_killed_and_resumed(self):
        out = os.path.join(WORK, "killed.jsonl")
        if os.path.exists(out):
            os.remove(out)
        rng = random.Random(7)
        kills = partial = 0

        def n_lines():
            if not os.path.exists(out):
                return 0
            with open(out, "rb") as f:
                return f.read().count(b"\n")
        for attempt in range(40):
            p = subprocess.Popen([os.path.join(BIN, "k3run"), "batch", "-q", "-m", self.pack, self.inp, "-o", out,
                                  "-t", "2", "--parallel", "3"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                if attempt == 0:                     # the first: killed once it has written an answer
                    t0 = time.time()                 # (beside the two error lines)
                    while n_lines() < 3 and p.poll() is None and time.time() - t0 < 120:
                        time.sleep(0.002)
                    if p.poll() is None:
                        raise subprocess.TimeoutExpired(p.args, 0)
                p.wait(rng.uniform(0.05, 0.5 + 0.25 * attempt))   # later attempts live longer
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGKILL)
                p.wait()
                p.stderr.close()
                kills += 1
                partial += 2 < n_lines() < len(self.reqs) + 2
                continue
            err = p.stderr.read()
            p.stderr.close()
            self.assertEqual(p.returncode, 0, err)
            break
        else:
            self.fail("k3run batch did not finish in 40 attempts")
        print("finished after %d kills, %d of them with some answers written" % (kills, partial))
        self.assertGreater(partial, 0, "no run was killed part way")
        self.check_answers(out)
        # a torn last line (a kill inside the write) is cut off and its request answered again
        got = lines(out)
        with open(out, "w") as f:
            for g in got[:-1]:
                f.write(json.dumps(g) + "\n")
            f.write(json.dumps(got[-1])[:40])
        p = batch(self.pack, self.inp, out)
        self.assertIn(b"torn", p.stderr)
        self.check_answers(out)
        # a file that is not k3run batch's output is refused, untouched
        other = os.path.join(WORK, "other.jsonl")
        with open(other, "w") as f:
            f.write('{"hello": 1}\n')
        p = batch(self.pack, self.inp, other, check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        with open(other) as f:
            self.assertEqual(f.read(), '{"hello": 1}\n')


if __name__ == "__main__":
    unittest.main()

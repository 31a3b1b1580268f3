"""`k3run serve --parallel S` (issue 33): conversations that share forward passes get exactly the
bytes they get alone.

Each case starts the server twice with the same pack, budget, threads and drafting: once with one
slot (the answers of serve.api, equal to `k3run chat` and `k3run -p`), once with S slots, and sends
the same requests to both: to the first one after another, to the second all at once from S client
threads that join at different moments (so sequences join and leave the passes at different
points). Every answer, streamed or not, must be the first server's, byte for byte, and /metrics must
show passes that carried several conversations. Then: a client that leaves mid-stream frees its
slot, and a resent conversation is routed to the slot that holds it (its prompt served from the
cache)."""

import http.client
import json
import os
import re
import subprocess
import threading
import time
import unittest

from servelib import BIN, Server, kjv_pack, make_pack, refused_minimum, TMP

SANITIZED = os.environ.get("K3_SANITIZED") == "1"


def parallel_minimum(pack, S, draft=0):
    """The planner's minimum budget for S slots on PACK, from the server's own refusal of 1M; with
    draft, the least above it (in steps of 256 KiB) whose plan has room for the verify pass of
    `draft` drafted tokens (at the minimum itself the planner leaves drafting out)."""
    b = refused_minimum(["serve", "-m", pack, "--parallel", str(S), "--port", "0"])
    for _ in range(64 if draft else 0):
        q = subprocess.run([os.path.join(BIN, "k3inspect"), "--plan", "--parallel", str(S), "--budget", str(b),
                            "--draft", str(draft), "--json", pack], stdout=subprocess.PIPE, check=True, timeout=60)
        if json.loads(q.stdout)["verify_tokens"]:
            return b
        b += 256 << 10
    assert not draft, "no room for a verify pass within 16 MiB of the minimum"
    return b


def requests(n, chat_words, max_tokens):
    """n requests: chat and completion alternately, greedy and sampled with their own seeds."""
    out = []
    prompts = ["Recite Genesis 1:1.", "In the beginning", "Who was Moses?", "And the LORD said unto",
               "Tell me of Noah.", "Blessed is the man"]
    for i in range(n):
        body = {"max_tokens": max_tokens + 5 * i, "seed": 100 + i}
        if i % 3:
            body.update(temperature=0.8, top_p=0.95)
        else:
            body.update(temperature=0)
        if chat_words and i % 2 == 0:
            body["messages"] = [{"role": "user", "content": prompts[i % len(prompts)]}]
            out.append(("/v1/chat/completions", body))
        else:
            body["prompt"] = prompts[i % len(prompts)]
            out.append(("/v1/completions", body))
    return out


def post(srv, path, body, timeout=300):
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    assert r.status == 200, (r.status, data)
    return json.loads(data)


def post_stream(srv, path, body, timeout=300):
    """The streamed answer's text (content and reasoning joined per channel) and finish reason."""
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=timeout)
    c.request("POST", path, json.dumps(dict(body, stream=True)), {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.status
    text, reasoning, finish = [], [], None
    for line in r.read().decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ch = json.loads(line[6:])["choices"][0]
        if "delta" in ch:
            text.append(ch["delta"].get("content") or "")
            reasoning.append(ch["delta"].get("reasoning_content") or "")
        else:
            text.append(ch.get("text") or "")
        finish = ch.get("finish_reason") or finish
    c.close()
    return {"text": "".join(text), "reasoning": "".join(reasoning), "finish": finish}


def answer(doc):
    """What a non-streamed answer says (its text or message, its finish reason, its token counts)."""
    ch = doc["choices"][0]
    return {"text": ch.get("text"), "message": ch.get("message"), "finish": ch["finish_reason"],
            "completion_tokens": doc["usage"]["completion_tokens"]}


def metric(srv, name):
    st, _, body = srv.request("GET", "/metrics")
    m = re.search(r"^%s (\S+)$" % re.escape(name), body.decode(), re.M)
    return float(m.group(1)) if m else None


class TestParallel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.kjv = kjv_pack(os.path.join(TMP, "k3run-serve-parallel"))
        cls.tiny = make_pack("tiny", 1)[1]

    def case(self, pack, S, args, reqs, label, stream_every=2, streams=None, shared_verify=False):
        """streams: whether the trunk streams (while answering, more is read than the pack holds: its
        units again and again) or not (resident: each byte read at most once, the experts as they
        are first used); shared_verify: some pass verified one conversation's drafts beside another's
        rows."""
        one = Server(pack, ["--parallel", "1"] + args)
        try:
            alone = [answer(post(one, p, b)) for p, b in reqs]
            alone_stream = [post_stream(one, p, b) if i % stream_every == 0 else None for i, (p, b) in enumerate(reqs)]
        finally:
            self.assertEqual(one.stop(), 0)
        many = Server(pack, ["--parallel", str(S)] + args)
        got, got_stream, errors = [None] * len(reqs), [None] * len(reqs), []

        def client(i):
            try:
                time.sleep(0.01 * i)                 # they join at different passes
                p, b = reqs[i]
                if i % stream_every == 0:
                    got_stream[i] = post_stream(many, p, b)
                got[i] = answer(post(many, p, b))
            except Exception as e:                   # noqa: BLE001 (reported below)
                errors.append("%d: %r" % (i, e))
        try:
            ts = [threading.Thread(target=client, args=(i,)) for i in range(len(reqs))]
            for t in ts:
                t.start()
            for t in ts:
                t.join(600)
            self.assertEqual(errors, [], label)
            passes, seqs = metric(many, "k3_passes_total"), metric(many, "k3_pass_sequences_total")
            splits = metric(many, "k3_pass_splits_total")
            verify = metric(many, "k3_pass_shared_verify_total")
            read = metric(many, "k3_bytes_read_total")
        finally:
            self.assertEqual(many.stop(), 0, many.stderr())
        for i in range(len(reqs)):
            self.assertEqual(got[i], alone[i], "%s: request %d (%s)" % (label, i, reqs[i][0]))
            if alone_stream[i]:
                self.assertEqual(got_stream[i], alone_stream[i], "%s: request %d streamed" % (label, i))
        print("%s: %d requests in %d passes carrying %d sequence steps, %d prompt chunks carried over, "
              "%d shared verify passes, %.1f MB read" % (label, len(reqs), passes, seqs, splits, verify, read / 1e6))
        self.assertGreater(seqs, passes, "%s: no pass carried two conversations" % label)
        if streams is not None:
            size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(pack) for f in fs)
            (self.assertGreater if streams else self.assertLessEqual)(read, size, "%s: bytes read while answering, "
                                                                       "against the pack's" % label)
        if shared_verify:
            self.assertGreater(verify, 0, "%s: no pass verified drafts beside another conversation" % label)
        return splits

    def test_demo_model_resident(self):
        reqs = requests(6, True, 24 if SANITIZED else 40)
        for threads in (("2",) if SANITIZED else ("1", "2")):
            self.case(self.kjv, 4, ["-t", threads, "--draft", "0"], reqs, "kjv resident, %s threads" % threads,
                      streams=False)

    def test_demo_model_drafts_streaming(self):
        S = 3
        b = parallel_minimum(self.kjv, S, draft=4)
        reqs = requests(5, True, 20 if SANITIZED else 32)
        # text that repeats itself, which the draft rule drafts on (two, so that drafts meet others)
        reqs[1:1] = [("/v1/completions", {"prompt": "nor thy son, nor thy son, nor thy son, nor thy son,",
                                          "max_tokens": 40 + 8 * i, "temperature": 0}) for i in range(2)]
        self.case(self.kjv, S, ["-t", "2", "--draft", "4", "--budget", str(b)], reqs,
                  "kjv at the minimum budget (trunk streamed), drafts", streams=True, shared_verify=True)

    def test_tiny_resident(self):
        """2 slots, 4 requests (two wait in the queue), drafts, 2 threads."""
        self.case(self.tiny, 2, ["-t", "2", "--draft", "4"], requests(4, False, 16), "tiny resident, 2 slots",
                  streams=False)

    def test_tiny_streaming_drafts(self):
        S = 5
        b = parallel_minimum(self.tiny, S, draft=4)
        self.case(self.tiny, S, ["-t", "2", "--draft", "4", "--budget", str(b)], requests(7, False, 12),
                  "tiny at the minimum budget, 5 slots, drafts, 2 threads", streams=True)

    def test_tiny_streaming(self):
        S = 6
        b = parallel_minimum(self.tiny, S)
        reqs = requests(6, False, 12)
        # at its minimum the plan's batch (23 rows) is below what 6 prompts arriving together need:
        # prompts go on in the next passes, in pieces, beside the others' decode rows
        splits = self.case(self.tiny, S, ["-t", "1", "--budget", str(b)], reqs, "tiny at the minimum budget, 6 slots",
                           streams=True)
        self.assertGreater(splits, 0, "no prompt was carried over to a later pass")

    @unittest.skipIf(SANITIZED, "the small preset: in the Release build only (label heavy's rule)")
    def test_small_streaming(self):
        small = make_pack("small", 7)[1]
        S = 3
        b = parallel_minimum(small, S, draft=4)
        reqs = requests(3, False, 6)
        self.case(small, S, ["-t", "2", "--budget", str(b), "--draft", "4"], reqs,
                  "small at the minimum budget, 3 slots, drafts", stream_every=3, streams=True)

    @unittest.skipIf(SANITIZED, "the small preset: in the Release build only (label heavy's rule)")
    def test_small_resident(self):
        small = make_pack("small", 7)[1]
        self.case(small, 4, ["-t", "2"], requests(4, False, 6), "small resident, 4 slots", stream_every=4,
                  streams=False)

    def test_n_choices(self):
        """n = 3: three choices from one processed prompt, choice i the answer of the same request with
        seed + i alone; with 2 slots two of them side by side (the second slot forked from the first's
        processed prompt: it processes nothing), the third after; streamed, the chunks carry each
        choice's index."""
        srv = Server(self.kjv, ["--parallel", "3", "-t", "2"])
        try:
            # n = 3: choice 0 in the first slot, 1 and 2 forked into the others (the first waits for
            # them with nothing left to run); n = 4: the first also runs choice 3 after its own
            for path, base, n in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Who was Moses?"}],
                                                           "reasoning_effort": "none"}, 3),
                                  ("/v1/completions", {"prompt": "In the beginning"}, 4)):
                # a seed whose choice 0 ends before another choice: its slot then waits for the others
                # (which must go on in passes without it)
                body = dict(base, max_tokens=24, temperature=0.9, stop=[",", "."])
                for seed in range(40, 100):
                    alone = [post(srv, path, dict(body, seed=seed + i)) for i in range(n)]
                    used = [a["usage"]["completion_tokens"] for a in alone]
                    if used[0] < max(used[1:]):
                        break
                self.assertLess(used[0], max(used[1:]), "no seed in 40..99 ends choice 0 first")
                body["seed"] = seed
                passes, seqs = metric(srv, "k3_passes_total"), metric(srv, "k3_pass_sequences_total")
                many = post(srv, path, dict(body, n=n), timeout=120)
                passes, seqs = metric(srv, "k3_passes_total") - passes, metric(srv, "k3_pass_sequences_total") - seqs
                self.assertGreater(seqs, passes, "%s: no two choices shared a pass" % path)
                self.assertEqual([c["index"] for c in many["choices"]], list(range(n)))
                self.assertEqual(many["usage"]["completion_tokens"], sum(used))
                alone = [a["choices"][0] for a in alone]
                for i in range(n):
                    self.assertEqual(dict(many["choices"][i], index=0), alone[i], "%s choice %d" % (path, i))
                # streamed: each choice's text reassembled from the chunks of its index
                c = http.client.HTTPConnection(srv.host, srv.port, timeout=120)
                c.request("POST", path, json.dumps(dict(body, n=n, stream=True)), {"Content-Type": "application/json"})
                texts = {}
                for line in c.getresponse().read().decode().splitlines():
                    if line.startswith("data: {"):
                        ch = json.loads(line[6:])["choices"]
                        for x in ch:
                            piece = x.get("text") if "text" in x else (x.get("delta") or {}).get("content")
                            texts[x["index"]] = texts.get(x["index"], "") + (piece or "")
                c.close()
                for i in range(n):
                    want = alone[i].get("text") if "text" in alone[i] else alone[i]["message"]["content"]
                    self.assertEqual(texts[i], want, "%s streamed choice %d" % (path, i))
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_n_choices_helpers_take_more(self):
        """n = 4 with 2 slots: after choices 0 and 1 (side by side), choices 2 and 3 go side by side
        too, the helper slot taking one as it finishes its own (before 2026-12-06 the first slot ran
        both after its own, alone: about L passes carried two sequences, now about 2 L), and every
        choice is still the answer of its seed alone."""
        srv = Server(self.kjv, ["--parallel", "2", "-t", "2"])
        try:
            L, n = 12, 4
            body = {"prompt": "And the LORD said unto", "max_tokens": L, "temperature": 0.9}
            for seed in range(200, 260):      # a seed whose four choices all run to L tokens
                alone = [post(srv, "/v1/completions", dict(body, seed=seed + i)) for i in range(n)]
                if all(a["usage"]["completion_tokens"] == L for a in alone):
                    break
            self.assertTrue(all(a["usage"]["completion_tokens"] == L for a in alone), "no seed in 200..259")
            passes, seqs = metric(srv, "k3_passes_total"), metric(srv, "k3_pass_sequences_total")
            many = post(srv, "/v1/completions", dict(body, seed=seed, n=n), timeout=120)
            shared = (metric(srv, "k3_pass_sequences_total") - seqs) - (metric(srv, "k3_passes_total") - passes)
            for i in range(n):
                self.assertEqual(dict(many["choices"][i], index=0), alone[i]["choices"][0], "choice %d" % i)
            print("n = %d, 2 slots, %d tokens a choice: %d passes carried a second sequence" % (n, L, shared))
            self.assertGreaterEqual(shared, 3 * L // 2, "choices 2 and 3 did not share passes")
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_leave_and_route(self):
        srv = Server(self.kjv, ["--parallel", "3", "-t", "2"])
        try:
            # a client that leaves mid-stream, while another conversation shares the passes: its slot
            # is free again, its generation stopped long before the length it asked for (the same
            # request alone runs to that length) and the other answer is its answer alone
            long = {"prompt": "In the beginning", "max_tokens": 300, "temperature": 0.9, "seed": 3}
            self.assertEqual(post(srv, "/v1/completions", long)["usage"]["completion_tokens"], 300)
            other = {"prompt": "And the LORD said unto", "max_tokens": 120, "temperature": 0.8, "seed": 4}
            other_alone = answer(post(srv, "/v1/completions", other))
            before = metric(srv, "k3_completion_tokens_total")
            got = {}
            t = threading.Thread(target=lambda: got.update(a=answer(post(srv, "/v1/completions", other))))
            t.start()
            c = http.client.HTTPConnection(srv.host, srv.port, timeout=60)
            c.request("POST", "/v1/completions", json.dumps(dict(long, stream=True)),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            r.fp.readline()
            c.close()
            t.join(120)
            t0 = time.time()
            while metric(srv, "k3_busy") and time.time() - t0 < 30:
                time.sleep(0.05)
            self.assertEqual(metric(srv, "k3_busy"), 0, "the slot of the client that left is free")
            self.assertEqual(got.get("a"), other_alone)
            left = metric(srv, "k3_completion_tokens_total") - before - other_alone["completion_tokens"]
            print("the client that left: its generation stopped after %d of 300 tokens" % left)
            self.assertLess(left, 150, "the generation of the client that left ran on")
            st, _, body = srv.request("GET", "/health")
            h = json.loads(body)
            self.assertEqual(len(h["slot_tokens_per_second"]), 3, h)
            self.assertTrue(all(x >= 0 for x in h["slot_tokens_per_second"]) and
                            max(h["slot_tokens_per_second"]) > 0, h)
            self.assertGreater(max(metric(srv, 'k3_slot_tokens_per_second{slot="%d"}' % i) for i in range(3)), 0)
            for i in range(3):                       # idle, each: 0 (a client's slot freed)
                self.assertEqual(metric(srv, 'k3_slot_busy{slot="%d"}' % i), 0)
        finally:
            self.assertEqual(srv.stop(), 0)
        srv = Server(self.kjv, ["--parallel", "3", "-t", "2"])
        try:
            # a request resent as it was, after another took the last empty slot: routed to the slot
            # holding its prompt, served from its cache (the snapshot at the prompt's end keeps its last
            # logits), the same answer
            moses = {"messages": [{"role": "user", "content": "Who was Moses?"}], "max_tokens": 16, "temperature": 0}
            first = post(srv, "/v1/chat/completions", moses)
            post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me of Noah."}],
                                               "max_tokens": 16, "temperature": 0})
            again = post(srv, "/v1/chat/completions", moses)
            self.assertEqual(again["usage"]["prompt_tokens_details"]["cached_tokens"], first["usage"]["prompt_tokens"],
                             again["usage"])
            self.assertEqual(again["choices"], first["choices"])
            st, _, body = srv.request("GET", "/health")
            h = json.loads(body)
            self.assertEqual((h["slots"], h["slots_busy"]), (3, 0), h)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_route_branch(self):
        """A conversation edited at its last message goes to the slot that holds the conversation it
        branches from, though another slot is empty: the state kept where the earlier turn's prompt
        ended serves it (cached_tokens), and the answer is its answer alone."""
        def chat(msgs, n):
            return {"messages": msgs, "max_tokens": n, "temperature": 0, "reasoning_effort": "none"}
        q1 = {"role": "user", "content": "Who was Moses? Tell me of Moses and of Aaron his brother, and of "
                                         "Miriam their sister, and of the house of Levi."}
        srv = Server(self.kjv, ["--parallel", "3", "-t", "2"])
        try:
            a1 = post(srv, "/v1/chat/completions", chat([q1], 40))
            hist = [q1, {"role": "assistant", "content": a1["choices"][0]["message"]["content"]}]
            post(srv, "/v1/chat/completions", chat(hist + [{"role": "user", "content": "And Aaron?"}], 8))
            post(srv, "/v1/chat/completions", chat([{"role": "user", "content": "Tell me of Noah."}], 8))
            edited = chat(hist + [{"role": "user", "content": "And Miriam?"}], 16)
            doc = post(srv, "/v1/chat/completions", edited)   # the third slot is still empty
        finally:
            self.assertEqual(srv.stop(), 0)
        cached = doc["usage"]["prompt_tokens_details"]["cached_tokens"]
        print("an edited conversation: %d of its %d prompt tokens from the slot it branched from" %
              (cached, doc["usage"]["prompt_tokens"]))
        self.assertGreaterEqual(cached, a1["usage"]["prompt_tokens"] - 1, doc["usage"])
        one = Server(self.kjv, ["--parallel", "1", "-t", "1"])
        try:
            self.assertEqual(answer(post(one, "/v1/chat/completions", edited)), answer(doc))
        finally:
            self.assertEqual(one.stop(), 0)

    def test_shared_prefix(self):
        """Conversations that begin with the same system message: a later one, in the same slot or in
        another (taken from a busy slot while it generates), starts from the state where the system
        message ends; cached_tokens says so, and every answer is its answer alone."""
        system = ("You are a scribe of the King James Bible. You answer in its words, with book, chapter and "
                  "verse, and you never invent a verse. ") * 3
        def conv(q, n):
            return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
                    "max_tokens": n, "temperature": 0.8, "top_p": 0.95, "seed": 5}
        a, b, c = conv("Who was Moses?", 160), conv("Tell me of Noah.", 24), conv("Recite Genesis 1:1.", 24)
        n_sys = system_end(self.kjv, b)
        self.assertGreater(n_sys, 40)
        alone = {}
        for name, body in (("a", a), ("b", b), ("c", c)):           # each the first of a fresh server
            one = Server(self.kjv, ["--parallel", "1", "-t", "1"])
            try:
                doc = post(one, "/v1/chat/completions", body)
                self.assertEqual(doc["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
                alone[name] = answer(doc)
            finally:
                self.assertEqual(one.stop(), 0)
        # one slot: b after a processes only what follows the system message (before: all of it)
        one = Server(self.kjv, ["--parallel", "1", "-t", "1"])
        try:
            self.assertEqual(answer(post(one, "/v1/chat/completions", a)), alone["a"])
            doc = post(one, "/v1/chat/completions", b)
            self.assertEqual(doc["usage"]["prompt_tokens_details"]["cached_tokens"], n_sys, doc["usage"])
            self.assertEqual(answer(doc), alone["b"])
        finally:
            self.assertEqual(one.stop(), 0)
        # two slots: b arrives while a streams in the other slot, and takes a's prefix from it
        two = Server(self.kjv, ["--parallel", "2", "-t", "1", "--draft", "0"])
        try:
            cn = http.client.HTTPConnection(two.host, two.port, timeout=300)
            cn.request("POST", "/v1/chat/completions", json.dumps(dict(a, stream=True)),
                       {"Content-Type": "application/json"})
            r = cn.getresponse()
            self.assertEqual(r.status, 200)
            first = b""                              # to a's first token: its prompt is processed
            while True:
                line = r.readline()
                self.assertTrue(line, first)
                first += line
                if line.startswith(b"data: {") and any(json.loads(line[6:])["choices"][0]["delta"].get(k)
                                                       for k in ("content", "reasoning_content")):
                    break
            doc = post(two, "/v1/chat/completions", b)
            rest = first + r.read()
            cn.close()
            self.assertEqual(doc["usage"]["prompt_tokens_details"]["cached_tokens"], n_sys, doc["usage"])
            self.assertEqual(answer(doc), alone["b"])
            text = "".join((json.loads(l[6:])["choices"][0]["delta"].get("content") or "")
                           for l in rest.decode().splitlines() if l.startswith("data: {"))
            self.assertEqual(text, alone["a"]["message"]["content"])
            # and a third, with both slots idle: from its own slot's cache or the other's, the same
            doc = post(two, "/v1/chat/completions", c)
            self.assertGreaterEqual(doc["usage"]["prompt_tokens_details"]["cached_tokens"], n_sys, doc["usage"])
            self.assertEqual(answer(doc), alone["c"])
        finally:
            self.assertEqual(two.stop(), 0, two.stderr())


def system_end(pack, body):
    """Where the system message ends in body's rendered prompt: the id offset of the <|open|> that opens
    the first message of another role, read from `k3run --render-chat --json`'s pieces."""
    p = subprocess.run([os.path.join(BIN, "k3run"), "--render-chat", "-", "-m", pack, "--json"],
                       input=json.dumps(body).encode(), stdout=subprocess.PIPE, check=True, timeout=60)
    pieces, at = json.loads(p.stdout)["pieces"], 0
    for i, pc in enumerate(pieces):
        if pc.get("special") == "<|open|>":
            head = ""
            for q in pieces[i + 1:]:
                if "special" in q:
                    break
                head += q["text"]
            m = re.match(r'message role="([a-z]+)"', head)
            if m and m.group(1) != "system":
                return at
        at += 1 if "special" in pc else len(pc["ids"])
    raise AssertionError("no message after the system message")


if __name__ == "__main__":
    unittest.main()

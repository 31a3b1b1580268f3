"""`k3run serve` over plain HTTP (issue 17; ctest serve.api): every endpoint; chat and completion
answers equal to `k3run chat --messages` and `k3run -p` byte for byte, streamed and not, greedy and
seeded sampling; the prompt cache across requests; every bad request answered with its status and
an OpenAI-shaped error while the server keeps serving; the API key; a full queue (503 with
Retry-After, nobody hangs); a client that leaves mid-stream (the generation stops); a client that
trickles its body (408, others unaffected); SIGTERM during a stream (the stream ends properly, the
queue gets 503, exit 0); 100 requests and a clean exit (no leak under ASan). The SDK's view is
test_serve_sdk.py, the page's test_serve_page.py."""

import json
import os
import socket
import subprocess
import threading
import time
import unittest

from servelib import BIN, TMP, Server, joined, k3run_chat, kjv_pack, make_pack

Q1 = "Quote Genesis 1:1."
Q2 = "What does John 3:16 say?"
CHAT = "/v1/chat/completions"


def msgs(*turns):
    return [{"role": r, "content": c} for r, c in turns]


# bad requests and what their errors say (tests/fuzz/seed_requests.py seeds the fuzz corpora with them)
_GOOD = {"messages": msgs(("user", "hi"))}
BAD_REQUESTS = [(CHAT, "POST", b"{bad json", 400), (CHAT, "POST", b"", 400), (CHAT, "POST", b"[1, 2]", 400),
                (CHAT, "POST", {"messages": "hi"}, 400), (CHAT, "POST", {}, 400),
                (CHAT, "POST", {"messages": []}, 400),
                (CHAT, "POST", {"messages": [{"role": "wizard", "content": "hi"}]}, 400),
                (CHAT, "POST", dict(_GOOD, n=17), 400), (CHAT, "POST", dict(_GOOD, temperature="hot"), 400),
                (CHAT, "POST", dict(_GOOD, max_tokens=0), 400), (CHAT, "POST", dict(_GOOD, max_tokens=1.5), 400),
                (CHAT, "POST", dict(_GOOD, top_p=0), 400), (CHAT, "POST", dict(_GOOD, stream="yes"), 400),
                (CHAT, "POST", dict(_GOOD, stop=[""]), 400), (CHAT, "POST", dict(_GOOD, stop=7), 400),
                (CHAT, "POST", dict(_GOOD, reasoning_effort="medium"), 400),
                (CHAT, "POST", dict(_GOOD, logprobs=True), 400),
                (CHAT, "POST", dict(_GOOD, frequency_penalty=0.5), 400),
                ("/v1/completions", "POST", {"prompt": 5}, 400), ("/v1/completions", "POST", {}, 400),
                ("/v1/completions", "POST", {"prompt": ""}, 400),
                (CHAT, "GET", None, 405), ("/v1/models", "POST", b"{}", 405), ("/health", "DELETE", None, 405),
                ("/v1/nothing", "GET", None, 404), ("/v2/chat/completions", "POST", b"{}", 404)]

class ServeKjv(unittest.TestCase):
    """One server on the trained demo model for the tests that need real answers."""

    @classmethod
    def setUpClass(cls):
        cls.work = os.path.join(TMP, "k3run-serve")
        os.makedirs(cls.work, exist_ok=True)
        cls.pack = kjv_pack(cls.work)
        cls.srv = Server(cls.pack, ["--timeout", "5", "-t", "2"])

    @classmethod
    def tearDownClass(cls):
        rc = cls.srv.stop()
        assert rc == 0, "k3run serve exited %d: %s" % (rc, cls.srv.stderr())

    def healthy(self):
        st, _, body = self.srv.request("GET", "/health")
        self.assertEqual(st, 200, body)
        self.assertEqual(json.loads(body)["status"], "ok")

    def test_endpoints(self):
        """/health, /v1/models, /metrics (Prometheus text), the page, HEAD"""
        self.healthy()
        st, hd, body = self.srv.request("GET", "/v1/models")
        self.assertEqual(st, 200)
        m = json.loads(body)
        self.assertEqual(m["object"], "list")
        self.assertEqual(m["data"][0]["id"], "k3-kjv.k3pack")
        self.assertEqual(m["data"][0]["object"], "model")
        st, hd, body = self.srv.request("GET", "/metrics")
        self.assertEqual(st, 200)
        self.assertTrue(hd["content-type"].startswith("text/plain"))
        names = set()
        for line in body.decode().splitlines():
            if line.startswith("#"):
                continue
            name, value = line.rsplit(" ", 1)
            float(value)
            names.add(name.split("{")[0])
        for want in ("k3_requests_total", "k3_completion_tokens_total", "k3_tokens_per_second",
                     "k3_prompt_cache_hit_ratio", "k3_bytes_read_total", "k3_queue_length"):
            self.assertIn(want, names)
        st, hd, body = self.srv.request("GET", "/")
        self.assertEqual(st, 200)
        self.assertTrue(hd["content-type"].startswith("text/html"))
        self.assertIn(b"<title>k3</title>", body)
        self.assertNotIn(b"http://", body.replace(b"http://www.w3.org", b""))    # no network fetches
        st, hd, body = self.srv.request("HEAD", "/health")
        self.assertEqual(st, 200)
        self.assertEqual(body, b"")

    def test_chat_equals_cli(self):
        """non-streamed and streamed answers equal `k3run chat --messages` on the same request,
        greedy and seeded sampling, thinking on and off; the stream's deltas add up to the message"""
        cases = [({"messages": msgs(("user", Q1)), "max_tokens": 80}, ["-n", "80"]),
                 ({"messages": msgs(("system", "Answer briefly."), ("user", Q2)), "max_tokens": 60,
                   "temperature": 0.8, "top_p": 0.9, "seed": 7},
                  ["-n", "60", "--temp", "0.8", "--top-p", "0.9", "--seed", "7"]),
                 ({"messages": msgs(("user", Q2)), "reasoning_effort": "none", "max_tokens": 50,
                   "temperature": 1.0, "top_k": 20, "seed": 3}, ["-n", "50", "--temp", "1", "--top-k", "20",
                                                                 "--seed", "3"])]
        for req, args in cases:
            with self.subTest(req=req):
                want = k3run_chat(self.pack, req, args, self.work)
                st, got = self.srv.chat(req)
                self.assertEqual(st, 200, got)
                msg = got["choices"][0]["message"]
                self.assertEqual(msg["content"], want["message"]["content"])
                self.assertEqual(msg["reasoning_content"], want["message"]["reasoning_content"])
                self.assertEqual(got["choices"][0]["finish_reason"], want["finish_reason"])
                self.assertEqual(got["usage"]["prompt_tokens"], want["usage"]["prompt_tokens"])
                self.assertEqual(got["usage"]["completion_tokens"], want["usage"]["completion_tokens"])
                self.assertEqual(got["object"], "chat.completion")
                self.assertTrue(got["id"].startswith("chatcmpl-"))
                st, events, done = self.srv.stream(CHAT, dict(req, stream_options={"include_usage": True}))
                self.assertEqual(st, 200)
                self.assertTrue(done)
                self.assertEqual(events[0]["choices"][0]["delta"].get("role"), "assistant")
                content, reasoning, calls, finish, usage = joined(events)
                self.assertEqual(content, want["message"]["content"])
                self.assertEqual(reasoning, want["message"]["reasoning_content"])
                self.assertEqual(finish, want["finish_reason"])
                self.assertEqual(usage["completion_tokens"], want["usage"]["completion_tokens"])
                self.assertEqual(events[-1]["choices"], [])          # the usage chunk
                self.assertTrue(all(e["object"] == "chat.completion.chunk" for e in events))
                print("%s -> %r" % (req["messages"][-1]["content"], content))

    def test_seed_reproduces(self):
        req = {"messages": msgs(("user", Q1)), "max_tokens": 40, "temperature": 1.2, "seed": 11}
        a = self.srv.chat(req)[1]["choices"][0]["message"]
        self.srv.chat(dict(req, seed=12))
        b = self.srv.chat(req)[1]["choices"][0]["message"]
        self.assertEqual(a, b)

    def test_completion_equals_k3run(self):
        """/v1/completions at temperature 0: the text of `k3run -p` (greedy; stopping at the
        end-of-message token), streamed too (without a temperature the server samples at its
        defaults, which k3run -p does not)"""
        prompt = "In the beginning God"
        p = subprocess.run([os.path.join(BIN, "k3run"), "-m", self.pack, "-p", prompt, "-n", "40", "-q"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        st, _, body = self.srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 40, "temperature": 0})
        self.assertEqual(st, 200, body)
        d = json.loads(body)
        self.assertEqual(d["object"], "text_completion")
        self.assertEqual(d["choices"][0]["text"].encode(), p.stdout)
        st, events, done = self.srv.stream("/v1/completions", {"prompt": [prompt], "max_tokens": 40,
                                                               "temperature": 0})
        self.assertTrue(done)
        self.assertEqual("".join(e["choices"][0]["text"] for e in events).encode(), p.stdout)

    def test_prompt_cache(self):
        """the second turn of a conversation is served from the cache, and answers what the whole
        conversation rendered from nothing answers (`k3run chat` of the two-turn request)"""
        r1 = {"messages": msgs(("user", Q1)), "max_tokens": 80, "reasoning_effort": "none"}
        st, a1 = self.srv.chat(r1)
        self.assertEqual(st, 200)
        r2 = dict(r1, messages=r1["messages"] + [a1["choices"][0]["message"]] + msgs(("user", Q2)))
        st, a2 = self.srv.chat(r2)
        self.assertEqual(st, 200)
        u = a2["usage"]
        self.assertGreater(u["prompt_tokens_details"]["cached_tokens"], a1["usage"]["prompt_tokens"], u)
        self.assertEqual(a2["k3"]["processed_tokens"], u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"])
        want = k3run_chat(self.pack, r2, ["-n", "80"], self.work)
        self.assertEqual(a2["choices"][0]["message"]["content"], want["message"]["content"])
        self.assertEqual(want["usage"]["prompt_tokens_details"]["cached_tokens"], 0)

    def test_tool_round_trip(self):
        """a conversation with tools, the assistant's call and the tool's result: answered as
        `k3run chat` answers it (the demo model was not trained to call tools itself)"""
        tools = [{"type": "function", "function": {"name": "lookup", "description": "Find a verse",
                                                   "parameters": {"type": "object", "properties": {
                                                       "ref": {"type": "string"}}, "required": ["ref"]}}}]
        req = {"messages": [{"role": "user", "content": Q1},
                            {"role": "assistant", "content": None, "tool_calls": [
                                {"id": "call_1", "type": "function",
                                 "function": {"name": "lookup", "arguments": "{\"ref\": \"Genesis 1:1\"}"}}]},
                            {"role": "tool", "tool_call_id": "call_1",
                             "content": "In the beginning God created the heaven and the earth."}],
               "tools": tools, "max_tokens": 60}
        want = k3run_chat(self.pack, req, ["-n", "60"], self.work)
        st, got = self.srv.chat(req)
        self.assertEqual(st, 200, got)
        self.assertEqual(got["choices"][0]["message"]["content"], want["message"]["content"])
        self.assertEqual(got["usage"]["prompt_tokens"], want["usage"]["prompt_tokens"])

    def test_bad_requests(self):
        """each gets its status and an error JSON; the server keeps serving"""
        cases = BAD_REQUESTS
        for path, method, body, status in cases:
            with self.subTest(path=path, method=method, body=body):
                st, hd, data = self.srv.request(method, path, body)
                self.assertEqual(st, status, data)
                e = json.loads(data)["error"]
                self.assertTrue(e["message"], e)
                self.assertEqual(e["code"], status)
                if status == 405:
                    self.assertIn("allow", hd)
                self.healthy()
        big = b'{"messages": [{"role": "user", "content": "' + b"a" * (20 << 20) + b'"}]}'
        st, _, data = self.srv.request("POST", CHAT, big)         # sent whole: read, then refused
        self.assertEqual(st, 413, data)
        self.assertIn("bytes", json.loads(data)["error"]["message"])
        path = os.path.join(self.work, "big.json")                 # curl waits for 100-continue
        with open(path, "wb") as f:
            f.write(big)
        p = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", "--data-binary", "@" + path, self.srv.url(CHAT)],
                           stdout=subprocess.PIPE, timeout=60)
        data, code = p.stdout.rsplit(b"\n", 1)
        self.assertEqual(code, b"413", p.stdout[:300])
        self.assertEqual(json.loads(data)["error"]["code"], 413)
        # chunked, no length: refused once 16 MiB have come
        s = socket.create_connection((self.srv.host, self.srv.port), timeout=30)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"a" * (1 << 20)
        try:
            for _ in range(20):
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            s.sendall(b"0\r\n\r\n")
        except OSError:
            pass
        reply = b""
        while b"\r\n\r\n" not in reply:
            got = s.recv(65536)
            if not got:
                break
            reply += got
        s.close()
        self.assertTrue(reply.startswith(b"HTTP/1.1 413"), reply[:100])
        st, d = self.srv.chat(dict(_GOOD, max_tokens=5))
        self.assertEqual(st, 200, d)

    def test_slow_client(self):
        """a body sent one byte a second, or one that stops, is refused (408) after --timeout; others are
        served meanwhile"""
        s = socket.create_connection((self.srv.host, self.srv.port), timeout=30)
        body = json.dumps({"messages": msgs(("user", "hi"))}).encode()
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body))
        s.sendall(head)
        stalled = socket.create_connection((self.srv.host, self.srv.port), timeout=30)
        stalled.sendall(head + body[:5])           # and then nothing: told 408 all the same
        t0, reply = time.time(), b""
        served = []

        def other():
            served.append(self.srv.chat({"messages": msgs(("user", Q1)), "max_tokens": 10})[0])

        th = None
        s.settimeout(1.0)
        for b in body:
            try:
                s.sendall(bytes([b]))
            except OSError:
                break
            if th is None:
                th = threading.Thread(target=other)
                th.start()
            try:
                reply += s.recv(65536)
                break                                   # an answer, or the connection closed
            except socket.timeout:
                pass
            if time.time() - t0 > 20:
                break
        s.settimeout(10)
        try:
            while b"\r\n\r\n" not in reply:
                got = s.recv(65536)
                if not got:
                    break
                reply += got
        except OSError:
            pass
        s.close()
        th.join(30)
        self.assertTrue(reply.startswith(b"HTTP/1.1 408"), reply[:200])
        stalled.settimeout(max(1.0, 12 - (time.time() - t0)))
        late = b""
        try:
            while got := stalled.recv(65536):
                late += got
        except OSError:
            pass
        stalled.close()
        self.assertTrue(late.startswith(b"HTTP/1.1 408") and b"--timeout" in late, late[:200])
        self.assertEqual(late.count(b"HTTP/1.1"), 1, late)
        self.assertLess(time.time() - t0, 12)
        self.assertEqual(served, [200])
        self.healthy()


# A tool call in K3's answer markup (docs/k3run-chat-format.md; unit.test_chat_parse), thinking off
TOOL_ANSWER = ('<|open|>tools<|sep|><|open|>call tool="lookup" index="1"<|sep|>'
               '<|open|>argument key="ref" type="string"<|sep|>Genesis 1:1<|close|>argument<|sep|>'
               '<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>')
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Find a verse", "parameters": {
    "type": "object", "properties": {"ref": {"type": "string"}}, "required": ["ref"]}}}]


class ServeToolCall(unittest.TestCase):
    """An answer that calls a tool, as the server gives it (the demo model was not trained to call
    tools: K3_TEST_ANSWER, a test-only switch of the chat, stands its markup in for the model's
    tokens; the parser, the message, the stream's delta and finish_reason are the real ones)."""

    def test_tool_call_answer(self):
        work = os.path.join(TMP, "k3run-serve")
        os.makedirs(work, exist_ok=True)
        pack = kjv_pack(work)
        req = {"messages": msgs(("user", Q1)), "tools": TOOLS, "reasoning_effort": "none", "max_tokens": 200}
        env = {"K3_TEST_ANSWER": TOOL_ANSWER}
        p = subprocess.run([os.path.join(BIN, "k3run"), "chat", "-m", pack, "--messages", "-", "--json", "-n", "200"],
                           input=json.dumps(req).encode(), env=dict(os.environ, **env), capture_output=True,
                           timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        want = json.loads(p.stdout)
        srv = Server(pack, [], env=env)
        try:
            st, got = srv.chat(req)
            self.assertEqual(st, 200, got)
            ch = got["choices"][0]
            self.assertEqual(ch["finish_reason"], "tool_calls")
            self.assertIsNone(ch["message"]["content"])
            call = ch["message"]["tool_calls"][0]
            self.assertEqual((call["id"], call["type"], call["function"]["name"]), ("call_1", "function", "lookup"))
            self.assertEqual(json.loads(call["function"]["arguments"]), {"ref": "Genesis 1:1"})
            self.assertEqual(ch["message"], want["message"])
            self.assertEqual(want["finish_reason"], "tool_calls")
            st, events, done = srv.stream(CHAT, req)
            self.assertTrue(done)
            content, reasoning, calls, finish, _ = joined(events)
            self.assertEqual((content, finish), ("", "tool_calls"))
            self.assertEqual(calls, [dict(call, index=0)])
        finally:
            self.assertEqual(srv.stop(), 0)


class ServeFaults(unittest.TestCase):
    """Servers on the random-weight tiny model, whose answers run to max_tokens."""

    @classmethod
    def setUpClass(cls):
        _, cls.pack = make_pack("tiny", 1)

    def test_api_key(self):
        srv = Server(self.pack, ["--api-key", "s3cret"])
        try:
            body = {"messages": msgs(("user", "hi")), "max_tokens": 3}
            for headers, status in (({}, 401), ({"Authorization": "Bearer nope"}, 401),
                                    ({"Authorization": "Bearer s3cret0"}, 401), ({"Authorization": "s3cret"}, 401),
                                    ({"Authorization": "Bearer s3cret"}, 200)):
                st, _, data = srv.post(CHAT, body, headers)
                self.assertEqual(st, status, (headers, data))
                if status == 401:
                    self.assertEqual(json.loads(data)["error"]["code"], 401)
            self.assertEqual(srv.request("GET", "/v1/models")[0], 401)
            self.assertEqual(srv.request("GET", "/metrics")[0], 401)
            self.assertEqual(srv.request("GET", "/health")[0], 200)
            self.assertEqual(srv.request("GET", "/")[0], 200)
        finally:
            self.assertEqual(srv.stop(), 0)
        srv = Server(self.pack, [], env={"K3_API_KEY": "envkey"})
        try:
            self.assertEqual(srv.request("GET", "/v1/models")[0], 401)
            self.assertEqual(srv.request("GET", "/v1/models", headers={"Authorization": "Bearer envkey"})[0], 200)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_queue_full(self):
        """8 clients at once against --queue 2: one runs, two wait, the rest get 503 with
        Retry-After; nobody hangs; the answers are the same answer"""
        srv = Server(self.pack, ["--queue", "2"])
        try:
            body = {"messages": msgs(("user", "hi")), "max_tokens": 400}
            res = [None] * 8

            def client(i):
                st, hd, data = srv.post(CHAT, body, timeout=300)   # three answers in turn, under ASan too
                res[i] = (st, hd.get("retry-after"), json.loads(data))

            ths = [threading.Thread(target=client, args=(i,)) for i in range(8)]
            for t in ths:
                t.start()
            for t in ths:
                t.join(330)
            self.assertTrue(all(r is not None for r in res), res)
            ok = [r for r in res if r[0] == 200]
            busy = [r for r in res if r[0] == 503]
            self.assertEqual(len(ok) + len(busy), 8, [r[0] for r in res])
            self.assertGreaterEqual(len(ok), 1)
            self.assertLessEqual(len(ok), 3 + 2)       # a job may finish while the others still connect
            self.assertGreaterEqual(len(busy), 1)
            self.assertTrue(all(r[1] == "1" for r in busy), busy)
            texts = {json.dumps(r[2]["choices"][0]["message"], sort_keys=True) for r in ok}
            self.assertEqual(len(texts), 1)
            st, _, m = srv.request("GET", "/metrics")
            self.assertIn(b"k3_rejected_busy_total %d" % len(busy), m)
        finally:
            self.assertEqual(srv.stop(), 0)

    def completion_tokens(self, srv):
        for line in srv.request("GET", "/metrics")[2].decode().splitlines():
            if line.startswith("k3_completion_tokens_total "):
                return int(line.split()[1])
        raise AssertionError("no k3_completion_tokens_total")

    def test_disconnect_stops_generation(self):
        """a client that leaves mid-stream: the generation stops within a few tokens, the next
        request is answered"""
        srv = Server(self.pack, ["-t", "1"])
        try:
            for path, body in ((CHAT, {"messages": msgs(("user", "hi"))}), ("/v1/completions", {"prompt": "hi"})):
                before = self.completion_tokens(srv)
                s = socket.create_connection((srv.host, srv.port), timeout=30)
                data = json.dumps(dict(body, max_tokens=3500, stream=True)).encode()
                s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d"
                          b"\r\n\r\n%s" % (path.encode(), len(data), data))
                got = b""
                while got.count(b"data: ") < 3:
                    got += s.recv(4096)
                s.close()
                t0 = time.time()
                while time.time() - t0 < 10:
                    if not json.loads(srv.request("GET", "/health")[2])["busy"]:
                        break
                    time.sleep(0.02)
                used = self.completion_tokens(srv) - before
                self.assertLess(used, 3500, "the generation ran to its end")
                print("%s: stopped after %d of 3500 tokens" % (path, used))
                st, d = srv.chat({"messages": msgs(("user", "hi")), "max_tokens": 5})
                self.assertEqual(st, 200, d)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_sigterm_during_stream(self):
        """SIGTERM while a stream runs and another request waits: the stream ends with its final
        chunk and [DONE], the waiting one gets 503, the process exits 0"""
        srv = Server(self.pack, ["-t", "1"])
        out = {}
        first = threading.Event()

        def streamer():
            out["a"] = srv.stream(CHAT, {"messages": msgs(("user", "hi")), "max_tokens": 3800}, timeout=60,
                                  first=first)

        def waiter():
            first.wait(60)                 # queued behind a stream that is surely running
            st, _, data = srv.post(CHAT, {"messages": msgs(("user", "hello")), "max_tokens": 10}, timeout=60)
            out["b"] = (st, json.loads(data))

        ta, tb = threading.Thread(target=streamer), threading.Thread(target=waiter)
        ta.start()
        tb.start()
        self.assertTrue(first.wait(60), "no text streamed within 60 s")   # the prompt is in, text flows
        time.sleep(0.5)                                                   # the waiter is queued
        t0 = time.time()
        rc = srv.stop()
        ta.join(30)
        tb.join(30)
        self.assertEqual(rc, 0, srv.stderr())
        self.assertLess(time.time() - t0, 10)
        st, events, done = out["a"]
        self.assertEqual(st, 200)
        self.assertTrue(done)
        content, reasoning, _, finish, _ = joined(events)
        self.assertEqual(finish, "stop")
        self.assertTrue(reasoning or content)
        st, d = out["b"]
        self.assertEqual(st, 503, d)
        with self.assertRaises(OSError):
            socket.create_connection((srv.host, srv.port), timeout=5).close()

    def test_many_requests(self):
        """100 requests of every kind, then a clean exit (under ASan: no leak reported)"""
        srv = Server(self.pack, [])
        try:
            for i in range(100):
                k = i % 5
                if k == 0:
                    st = srv.chat({"messages": msgs(("user", "q%d" % i)), "max_tokens": 3})[0]
                elif k == 1:
                    st = srv.stream(CHAT, {"messages": msgs(("user", "q")), "max_tokens": 3,
                                           "stream_options": {"include_usage": True}})[0]
                elif k == 2:
                    st = srv.post("/v1/completions", {"prompt": "x%d" % i, "max_tokens": 3})[0]
                elif k == 3:
                    st = srv.post(CHAT, b"{oops")[0]
                else:
                    st = srv.request("GET", "/metrics")[0]
                self.assertEqual(st, 400 if k == 3 else 200)
        finally:
            rc = srv.stop()
        self.assertEqual(rc, 0, srv.stderr())
        self.assertNotIn("LeakSanitizer", srv.stderr())


if __name__ == "__main__":
    unittest.main()

#!/usr/bin/env python3
"""Hours of load on `k3run serve` (issue 35): N clients on loopback for a set time, each a loop of
requests drawn at random from every API and every misbehaviour a client has:

  chat, completions, messages, responses (each plain and streamed); the fixed greedy request (its
  answer must never change); a stream cancelled after two events; a request sent and the connection
  closed at once; bad JSON; a wrong API key; an oversized body; a slow header (half a header, a byte
  a second, until the server closes it at --header-timeout); a slow reader of a stream.

Every request the server accepted must get a complete answer (a plain body of its API's shape, or a
stream that ends the way its API ends one) or an error of its API's shape (a 503 when the queue is
full counts as an answer). Every loop is bounded in count and time. RSS and open descriptors are
sampled; after the load they must be back to the level they had after warm-up. SIGTERM at the end
must exit 0. Prints a report (--json: one JSON document); exit 1 when a check failed.

    /usr/bin/python3 tests/bench/soak_serve.py --pack PACK [--seconds 1800] [--clients 12] [--json]

The ctest version (serve.soak, 25 s, also under ASan) is tests/serve/test_serve_soak.py;
the 30-minute run's figures are in docs/PERFORMANCE.md and docs/ROBUSTNESS.md."""

import argparse
import http.client
import json
import os
import random
import socket
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "serve"))
from servelib import Server  # noqa: E402

KEY = "soak-key"
H = {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"}
FIXED = {"messages": [{"role": "user", "content": "In the beginning"}], "max_tokens": 12, "temperature": 0}
REQUEST_SECONDS = 120           # no request may take longer (the clients' own bound)


def rss_fds(pid):
    with open("/proc/%d/status" % pid) as f:
        rss = [int(line.split()[1]) for line in f if line.startswith("VmRSS:")][0] * 1024
    return rss, len(os.listdir("/proc/%d/fd" % pid))


class Soak:
    def __init__(self, srv, seconds, clients, seed, max_body):
        self.srv, self.seconds, self.clients, self.seed, self.max_body = srv, seconds, clients, seed, max_body
        self.mu = threading.Lock()
        self.counts, self.problems, self.fixed = {}, [], None
        self.samples = []              # (t, rss, fds)

    # ---- bookkeeping ----
    def count(self, kind):
        with self.mu:
            self.counts[kind] = self.counts.get(kind, 0) + 1

    def problem(self, kind, what):
        with self.mu:
            if len(self.problems) < 50:
                self.problems.append("%s: %s" % (kind, what))
            self.counts["PROBLEM " + kind] = self.counts.get("PROBLEM " + kind, 0) + 1

    # ---- the connection ----
    def conn(self, timeout=REQUEST_SECONDS):
        return http.client.HTTPConnection(self.srv.host, self.srv.port, timeout=timeout)

    def send(self, path, body, headers=H, stream=False):
        """(status, bytes of the whole body)."""
        c = self.conn()
        try:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            c.request("POST", path, body=data, headers=headers)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    # ---- shapes ----
    @staticmethod
    def error_shape(api, data, status):
        doc = json.loads(data)
        if api == "messages":
            return doc.get("type") == "error" and doc["error"]["type"] and doc["error"]["message"]
        return doc["error"]["message"] and doc["error"]["code"] == status

    def check_plain(self, api, status, data):
        if status == 200:
            doc = json.loads(data)
            ok = {"chat": lambda: doc["object"] == "chat.completion" and doc["choices"][0]["finish_reason"],
                  "completion": lambda: doc["object"] == "text_completion" and doc["choices"][0]["finish_reason"],
                  "messages": lambda: doc["type"] == "message" and doc["stop_reason"],
                  "responses": lambda: doc["object"] == "response" and doc["status"] in ("completed", "incomplete")}
            return ok[api]()
        # the requests are valid: the one refusal allowed is a full queue (503), in the API's shape;
        # a 500 (the engine failed) or a 4xx is a problem
        return status == 503 and self.error_shape(api, data, status)

    def check_stream(self, api, status, data):
        if status != 200:
            return status == 503 and self.error_shape(api, data, status)
        text = data.decode()
        if api == "messages":
            return "event: message_stop" in text or "event: error" in text
        if api == "responses":
            return "event: response.completed" in text or "event: response.incomplete" in text or \
                "event: error" in text
        return text.rstrip().endswith("data: [DONE]")

    # ---- the actions ----
    def request_of(self, api, rnd):
        words = rnd.choice(["Who was Moses?", "In the beginning", "Tell me of Noah.", "hi", "And the LORD said"])
        n = rnd.randint(1, 24)
        samp = {"temperature": rnd.choice([0, 0.8, 1.0]), "seed": rnd.randint(0, 99)}
        if api == "chat":
            return "/v1/chat/completions", dict(samp, messages=[{"role": "user", "content": words}], max_tokens=n)
        if api == "completion":
            return "/v1/completions", dict(samp, prompt=words, max_tokens=n)
        if api == "messages":
            return "/v1/messages", dict(samp, messages=[{"role": "user", "content": words}], max_tokens=n)
        return "/v1/responses", dict(samp, input=words, max_output_tokens=n)

    # each kind of action's share of the draws (act's thresholds); a client's first ten actions take
    # them in turn, so even a short run has every kind
    KINDS = (0.125, 0.35, 0.5, 0.585, 0.645, 0.705, 0.77, 0.825, 0.885, 0.96)

    def act(self, rnd, k=None):
        k = rnd.random() if k is None else k
        api = rnd.choice(["chat", "completion", "messages", "responses"])
        if k < 0.25:
            path, body = self.request_of(api, rnd)
            st, data = self.send(path, body)
            (self.count if self.check_plain(api, st, data) else lambda x: self.problem(x, "%d %r" % (st, data[:200])))(
                "plain " + api)
        elif k < 0.45:
            path, body = self.request_of(api, rnd)
            st, data = self.send(path, dict(body, stream=True))
            (self.count if self.check_stream(api, st, data) else lambda x: self.problem(x, "%d %r" % (st, data[-200:])))(
                "stream " + api)
        elif k < 0.55:
            st, data = self.send("/v1/chat/completions", FIXED)
            if st == 503:
                self.count("fixed: busy")
                return
            if st != 200:                                 # never the reference, never "equal" to it
                self.problem("fixed", "%d %r" % (st, data[:200]))
                return
            ans = json.loads(data)["choices"][0]["message"]
            with self.mu:
                if self.fixed is None:
                    self.fixed = ans
            (self.count if ans == self.fixed else lambda x: self.problem(x, "%d %r" % (st, data[:200])))("fixed")
        elif k < 0.62:                                   # a stream cancelled after two events
            path, body = self.request_of(api, rnd)
            c = self.conn()
            c.request("POST", path, body=json.dumps(dict(body, stream=True, max_tokens=200,
                                                         max_output_tokens=200)).encode(), headers=H)
            r = c.getresponse()
            head = b"".join(r.readline() for _ in range(2))
            c.close()
            # a stream that began (its first event), or a full queue in the API's shape
            ok = r.status == 200 and head.startswith((b"data: {", b"event: ")) or r.status == 503
            (self.count if ok else lambda x: self.problem(x, "%d %r" % (r.status, head[:200])))("cancelled stream")
        elif k < 0.67:                                   # sent, then gone
            path, body = self.request_of(api, rnd)
            s = socket.create_connection((self.srv.host, self.srv.port), timeout=10)
            data = json.dumps(body).encode()
            s.sendall(b"POST %s HTTP/1.1\r\nHost: k3\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (path.encode(), KEY.encode(), len(data), data))
            s.close()
            self.count("disconnected")
        elif k < 0.74:
            path, _ = self.request_of(api, rnd)
            st, data = self.send(path, b'{"messages": [oops')
            (self.count if st == 400 and self.error_shape("messages" if "messages" in path else "chat", data, 400)
             else lambda x: self.problem(x, "%d %r" % (st, data[:200])))("bad json")
        elif k < 0.80:
            path, body = self.request_of(api, rnd)
            st, data = self.send(path, body, headers={"Authorization": "Bearer nope"})
            (self.count if st == 401 and self.error_shape(api, data, 401) else
             lambda x: self.problem(x, "%d %r" % (st, data[:200])))("wrong key")
        elif k < 0.85:
            path, _ = self.request_of(api, rnd)
            big = b'{"prompt": "' + b"a" * (self.max_body + 10) + b'"}'
            try:
                st, data = self.send(path, big)
                (self.count if st == 413 else lambda x: self.problem(x, "%d %r" % (st, data[:200])))("oversized")
            except (ConnectionError, socket.timeout) as e:   # the server may close once it refused
                self.count("oversized (closed)")
        elif k < 0.92:                                   # a slow header, until the server closes it
            s = socket.create_connection((self.srv.host, self.srv.port), timeout=10)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: k3\r\nContent-")
            t0 = time.time()
            closed = False
            while time.time() - t0 < 8:
                try:
                    s.settimeout(1)
                    if not s.recv(100):
                        closed = True
                        break
                except socket.timeout:
                    try:
                        s.send(b"x")
                    except OSError:
                        closed = True
                        break
                except OSError:
                    closed = True
                    break
            s.close()
            (self.count if closed else lambda x: self.problem(x, "not closed within 8 s"))("slow header")
        else:                                            # a slow reader of a stream
            path, body = self.request_of(api, rnd)
            c = self.conn()
            c.request("POST", path, body=json.dumps(dict(body, stream=True)).encode(), headers=H)
            r = c.getresponse()
            got = b""
            t0 = time.time()
            while time.time() - t0 < 30:
                b = r.read(64)
                if not b:
                    break
                got += b
                time.sleep(0.05)
            c.close()
            (self.count if self.check_stream(api, r.status, got) else
             lambda x: self.problem(x, "%d %r" % (r.status, got[-200:])))("slow reader " + api)

    def client(self, i, until):
        rnd = random.Random(self.seed * 1000 + i)
        n = 0
        while time.time() < until and n < 100000:
            n += 1
            try:
                self.act(rnd, self.KINDS[(i + n - 1) % len(self.KINDS)] if n <= len(self.KINDS) else None)
            except Exception as e:              # a client-side failure is a problem too: the server must answer
                self.problem("client", "%s: %s" % (type(e).__name__, e))

    def run(self):
        pid = self.srv.p.pid
        t0 = time.time()
        until = t0 + self.seconds
        ths = [threading.Thread(target=self.client, args=(i, until)) for i in range(self.clients)]
        for t in ths:
            t.start()
        while any(t.is_alive() for t in ths) and time.time() < until + REQUEST_SECONDS:
            self.samples.append((round(time.time() - t0, 1),) + rss_fds(pid))
            time.sleep(min(5.0, max(0.5, self.seconds / 60)))
        for t in ths:
            t.join(max(1.0, until + REQUEST_SECONDS - time.time()))
        hung = sum(t.is_alive() for t in ths)
        if hung:
            self.problem("hang", "%d clients did not finish" % hung)
        time.sleep(3)                                    # the last connections close
        self.samples.append((round(time.time() - t0, 1),) + rss_fds(pid))
        return time.time() - t0


def soak(pack, seconds, clients, seed=1, extra=(), check_rss=True):
    """check_rss False under ASan, whose quarantine holds freed memory (its leak check runs at exit)."""
    max_body = 1 << 16
    srv = Server(pack, ["--api-key", KEY, "--max-body", "64K", "--header-timeout", "2", "--queue", "8"] +
                 list(extra))
    s = Soak(srv, seconds, clients, seed, max_body)
    try:
        took = s.run()
    finally:
        rc = srv.stop()
    # warm-up: the first fifth; after the load, RSS and descriptors back to what they were then
    warm = [x for x in s.samples if x[0] >= seconds / 5] or s.samples
    base_rss, base_fd = warm[0][1], min(x[2] for x in warm)
    end_rss, end_fd = s.samples[-1][1], s.samples[-1][2]
    if end_fd > base_fd:
        s.problem("descriptors", "%d open after the load, %d after warm-up" % (end_fd, base_fd))
    if check_rss and end_rss > base_rss * 1.25 + (16 << 20):
        s.problem("memory", "RSS %.1f MiB after the load, %.1f MiB after warm-up" % (end_rss / 2**20, base_rss / 2**20))
    if rc != 0:
        s.problem("exit", "SIGTERM: exit %d" % rc)
    total = sum(v for k, v in s.counts.items() if not k.startswith("PROBLEM"))
    return {"seconds": round(took, 1), "clients": clients, "requests": total,
            "requests_per_second": round(total / took, 2), "by_kind": dict(sorted(s.counts.items())),
            "problems": s.problems, "rss_mib": [(t, round(r / 2**20, 1)) for t, r, _ in s.samples],
            "fds": [(t, f) for t, _, f in s.samples], "exit": rc, "fixed_answer": s.fixed}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pack", required=True)
    ap.add_argument("--seconds", type=float, default=1800)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("serve_args", nargs="*", help="more options for k3run serve (after --)")
    a = ap.parse_args()
    rep = soak(a.pack, a.seconds, a.clients, a.seed, a.serve_args)
    if a.json:
        print(json.dumps(rep, indent=1))
    else:
        print("%d requests in %.0f s (%.2f/s) from %d clients; exit %d" % (rep["requests"], rep["seconds"],
              rep["requests_per_second"], rep["clients"], rep["exit"]))
        for k, v in rep["by_kind"].items():
            print("  %-28s %d" % (k, v))
        print("RSS MiB over time:", rep["rss_mib"])
        print("descriptors over time:", rep["fds"])
        for p in rep["problems"]:
            print("PROBLEM", p)
    sys.exit(1 if rep["problems"] else 0)


if __name__ == "__main__":
    main()

"""Start and stop `k3run serve` for the tests (tests/serve), and talk to it with plain HTTP.

Server(pack, args[, prefix]) runs k3run serve (after prefix: mpirun -n R) on a free loopback port (--port 0; the address is read from
the line it prints on stderr) and stops it with SIGTERM, checking that it exits 0 within
seconds. Every wait is bounded in time."""

import http.client
import itertools
import json
import re
import os
import signal
import ssl
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "run"))
from runlib import BIN, SRC, TMP, kjv_pack, make_pack, refused_minimum  # noqa: E402,F401

START_SECONDS = 60
STOP_SECONDS = 20


def need(cond, why):
    """A decorator: skip the test or class unless cond. With K3_REQUIRE_CLIENTS=1 (scripts/test.sh,
    so CI) it fails instead: there setup.sh has installed node and the SDKs, and a test of an API
    against its official SDK that skipped would pass without having checked anything."""
    if cond or os.environ.get("K3_REQUIRE_CLIENTS") != "1":
        return unittest.skipUnless(cond, why)

    def fail(*_a, **_k):
        raise AssertionError("required here (K3_REQUIRE_CLIENTS=1): " + why)

    def deco(obj):
        if isinstance(obj, type):
            obj.setUpClass = classmethod(fail)
            return obj
        return fail
    return deco


_SERVERS = itertools.count()           # each Server's stderr in a file of its own


class Server:
    def __init__(self, pack, args=(), env=None, prefix=(), ca=None):
        """ca: the certificate to trust when the server speaks TLS (--tls-cert)."""
        self.pack, self.args, self.scheme = pack, list(args), "http"
        self.ctx = ssl.create_default_context(cafile=ca) if ca else None
        e = dict(os.environ)
        e.update(env or {})
        self.log = open(os.path.join(TMP, "k3run-serve-%d-%d.err" % (os.getpid(), next(_SERVERS))), "w+b")
        self.p = subprocess.Popen(list(prefix) + [os.path.join(BIN, "k3run"), "serve", "-m", pack, "--port", "0"] +
                                  self.args,
                                  stdout=subprocess.PIPE, stderr=self.log, env=e)
        t0 = time.time()
        self.host = self.port = None
        while time.time() - t0 < START_SECONDS:
            self.log.seek(0)
            text = self.log.read().decode(errors="replace")
            for line in text.splitlines():
                m = re.search(r" on (https?)://([^/]+)/", line)
                if m:
                    self.scheme = m.group(1)
                    self.host, port = m.group(2).rsplit(":", 1)
                    self.port = int(port)
            if self.port:
                return
            if self.p.poll() is not None:
                raise AssertionError("k3run serve exited %d: %s" % (self.p.returncode, text))
            time.sleep(0.05)
        self.p.kill()
        raise AssertionError("k3run serve did not start within %d s" % START_SECONDS)

    def url(self, path=""):
        return "%s://%s:%d%s" % (self.scheme, self.host, self.port, path)

    def connection(self, timeout=60, source=None):
        """An http.client connection to the server (HTTPS when it speaks TLS); source: the local address."""
        src = (source, 0) if source else None
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self.ctx,
                                               source_address=src)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout, source_address=src)

    def stderr(self):
        if self.log.closed:
            return ""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self, sig=signal.SIGTERM):
        """SIGTERM; the exit status (it must come within STOP_SECONDS)."""
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            self.p.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            raise AssertionError("k3run serve did not exit within %d s of SIGTERM" % STOP_SECONDS)
        self.p.stdout.close()
        if self.p.returncode != 0:              # what it said, in the test's output
            sys.stderr.write("k3run serve exited %d; its stderr ends:\n%s\n" % (self.p.returncode,
                                                                              self.stderr()[-4000:]))
        return self.p.returncode

    def __del__(self):
        try:
            self.log.close()
        except Exception:
            pass

    def request(self, method, path, body=None, headers=None, timeout=60, source=None):
        """(status, headers dict, body bytes); source: the local address to send from (127.0.0.N)."""
        c = self.connection(timeout, source)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        elif isinstance(body, str):
            body = body.encode()
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        hd = {k.lower(): v for k, v in r.getheaders()}
        c.close()
        return r.status, hd, data

    def post(self, path, body, headers=None, timeout=120):
        st, hd, data = self.request("POST", path, body, headers, timeout)
        return st, hd, data

    def chat(self, body, headers=None):
        """A non-streamed chat completion: (status, JSON document)."""
        st, _, data = self.post("/v1/chat/completions", body, headers)
        return st, json.loads(data)

    def stream(self, path, body, headers=None, timeout=120, first=None):
        """A streamed request: (status, [event JSON documents], saw [DONE]). first: a
        threading.Event set once the first event with text (content or reasoning) arrived."""
        if first is None:
            st, hd, data = self.post(path, dict(body, stream=True), headers, timeout)
        else:                                           # read the events as they come
            c = self.connection(timeout)
            c.request("POST", path, body=json.dumps(dict(body, stream=True)).encode(),
                      headers=dict({"Content-Type": "application/json"}, **(headers or {})))
            r = c.getresponse()
            st, chunks = r.status, []
            while True:
                line = r.readline()
                if not line:
                    break
                chunks.append(line)
                # text, not the opening chunk's empty "content":""
                if line.startswith(b"data: {") and re.search(rb'"(content|reasoning_content)":"[^"]', line):
                    first.set()
            data = b"".join(chunks)
            c.close()
        if st != 200:
            return st, [json.loads(data)], False
        events, done = [], False
        for block in data.decode().split("\n\n"):
            if not block.strip():
                continue
            assert block.startswith("data: "), block
            payload = block[6:]
            if payload == "[DONE]":
                done = True
            else:
                events.append(json.loads(payload))
        return st, events, done


def joined(events):
    """A chat stream's deltas put together: (content, reasoning, tool calls, finish_reason, usage)."""
    content, reasoning, calls, finish, usage = "", "", [], None, None
    for e in events:
        if e.get("usage"):
            usage = e["usage"]
        for c in e.get("choices", []):
            d = c.get("delta", {})
            content += d.get("content") or ""
            reasoning += d.get("reasoning_content") or ""
            calls += d.get("tool_calls") or []
            finish = c.get("finish_reason") or finish
    return content, reasoning, calls, finish, usage


def k3run_chat(pack, request, args, work):
    """`k3run chat --messages` of one request: its --json document."""
    path = os.path.join(work, "request-%d.json" % os.getpid())
    with open(path, "w") as f:
        json.dump(request, f)
    p = subprocess.run([os.path.join(BIN, "k3run"), "chat", "-m", pack, "--messages", path, "--json"] + args,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    if p.returncode:
        raise AssertionError("k3run chat failed (%d): %s" % (p.returncode, p.stderr.decode(errors="replace")))
    return json.loads(p.stdout)

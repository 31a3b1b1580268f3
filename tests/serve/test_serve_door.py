"""`k3run serve` among hostile clients (issue 35; ctest serve.door), loopback only, every wait bounded:

- 200 connections from one address (127.0.0.2) that send half a request header and then one byte
  every 2 s: /health and a chat completion from another address are each answered within 2 s while
  they drip; the 32 the per-address cap admits are closed at the header deadline (10 s) however
  they trickle, the others at once; the metrics count them.
- the per-address cap (--max-conns-per-ip) and the cap in all (--max-conns): a request past either
  gets a 503 naming the option, other addresses are served, and it recovers once the connections
  close.
- TLS (--tls-cert/--tls-key, a certificate made here with openssl): curl with the certificate and
  the npm `openai` SDK get answers equal to plain HTTP's, streamed and not; plain HTTP to the TLS
  port is closed without hanging and the server serves on; a key file others may read, a missing
  half of the pair and a key of another certificate are refused at start.
- a pack damaged while the server runs (experts read on demand, the trunk partly streamed): a request
  whose answer needs a damaged expert record gets a 500 naming the shard, layer and expert (a stream: an
  error event); every other request is answered with exactly the bytes of the undamaged pack; /health
  says "degraded" and names the damage; a truncated trunk shard fails every request with a 500 naming
  the tensor while /health and /metrics answer and SIGTERM exits 0.
- --api-key-file and K3_API_KEY_FILE: the key works, is absent from /proc/PID/cmdline, from every
  line the server prints (at -v) and from its error answers; a key file others may read, an empty
  one, and both --api-key and --api-key-file are refused.
"""

import json
import os
import select
import shutil
import socket
import stat
import subprocess
import threading
import time
import unittest

from servelib import BIN, TMP, Server, joined, make_pack

HERE = os.path.dirname(os.path.abspath(__file__))
CHAT = "/v1/chat/completions"
GREEDY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}
WORK = os.path.join(TMP, "k3run-serve-door")


def serve_fails(pack, args, env=None):
    """k3run serve that must refuse to start: (exit code, stderr)."""
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([os.path.join(BIN, "k3run"), "serve", "-m", pack, "--port", "0"] + args,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, env=e)
    return p.returncode, p.stderr.decode(errors="replace")


def metric(srv, name, must=True):
    st, _, data = srv.request("GET", "/metrics")
    for line in data.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    if must:
        raise AssertionError("no metric %s (%d: %s)" % (name, st, data[:200]))
    return None


def wait_conns(srv, n, seconds=10):
    """Until the server holds n connections (the one asking included), within seconds. A connection the
    server answered a moment ago may still count until it is closed (then /metrics itself may be refused
    at a cap: asked again)."""
    t0 = time.time()
    while time.time() - t0 < seconds:
        got = metric(srv, "k3_connections", must=False)
        if got is not None and got >= n:
            return
        time.sleep(0.05)
    raise AssertionError("the server never held %d connections" % n)


class Drips:
    """n connections from one address, each sending half a header and then a byte every `every` s,
    on one thread; records when each was closed by the server (seconds after it connected)."""

    def __init__(self, host, port, source, n, every=2.0):
        self.socks, self.t0, self.closed = [], [], {}
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((source, 0))
            s.settimeout(10)
            s.connect((host, port))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: k3\r\nContent-Ty")
            s.setblocking(False)
            self.socks.append(s)
            self.t0.append(time.time())
        self.every, self.stop = every, False
        self.th = threading.Thread(target=self.run)
        self.th.start()

    def run(self):
        last = time.time()
        while not self.stop and len(self.closed) < len(self.socks):
            live = [i for i in range(len(self.socks)) if i not in self.closed]
            r, _, _ = select.select([self.socks[i] for i in live], [], [], 0.1)
            for s in r:
                i = self.socks.index(s)
                try:
                    got = s.recv(4096)
                except OSError:
                    got = b""
                if not got:
                    self.closed[i] = time.time() - self.t0[i]
            if time.time() - last >= self.every:
                last = time.time()
                for i in live:
                    if i not in self.closed:
                        try:
                            self.socks[i].send(b"p")
                        except OSError:
                            pass

    def end(self):
        self.stop = True
        self.th.join(30)
        for s in self.socks:
            s.close()


class DoorTiny(unittest.TestCase):
    """Servers on the random-weight tiny model."""

    @classmethod
    def setUpClass(cls):
        _, cls.pack = make_pack("tiny", 1)

    def test_slow_clients(self):
        srv = Server(self.pack, ["-t", "1"])
        drips = None
        try:
            st, want = srv.chat(GREEDY)
            self.assertEqual(st, 200)
            drips = Drips(srv.host, srv.port, "127.0.0.2", 200)
            wait_conns(srv, 33)
            time.sleep(2.5)                                  # they drip
            worst = 0.0
            for round_ in range(3):
                for path, body in (("/health", None), (CHAT, GREEDY)):
                    t0 = time.time()
                    if body is None:
                        st, _, data = srv.request("GET", path, timeout=10)
                    else:
                        st, _, data = srv.post(path, body, timeout=10)
                    took = time.time() - t0
                    worst = max(worst, took)
                    self.assertEqual(st, 200, data)
                    self.assertLess(took, 2.0, "%s took %.2f s among 200 dripping connections" % (path, took))
                    if body is not None:
                        self.assertEqual(json.loads(data)["choices"], want["choices"])
                time.sleep(1)
            print("200 dripping connections: the slowest answer took %.3f s" % worst)
            t0 = time.time()
            while len(drips.closed) < 200 and time.time() - t0 < 15:
                time.sleep(0.1)
            self.assertEqual(len(drips.closed), 200, "connections still open after the header deadline")
            late = sorted(drips.closed.values())
            kept = [t for t in late if t > 5]
            self.assertEqual(len(kept), 32, late)             # the per-address cap's worth waited for the deadline
            self.assertTrue(all(9 <= t <= 12.5 for t in kept), kept)
            self.assertTrue(all(t <= 3 for t in late[:168]), late[:168])
            self.assertEqual(metric(srv, "k3_refused_connections_total"), 168)
            self.assertEqual(metric(srv, "k3_timed_out_connections_total"), 200)
        finally:
            if drips:
                drips.end()
            self.assertEqual(srv.stop(), 0, srv.stderr())

    def test_caps(self):
        srv = Server(self.pack, ["-t", "1", "--max-conns-per-ip", "4", "--max-conns", "10"])
        idle = []
        try:
            def hold(source, n):
                for _ in range(n):
                    s = socket.socket()
                    s.bind((source, 0))
                    s.connect((srv.host, srv.port))
                    idle.append(s)

            hold("127.0.0.3", 4)
            wait_conns(srv, 5)
            st, hd, data = srv.request("GET", "/health", source="127.0.0.3")
            self.assertEqual(st, 503, data)
            self.assertIn("--max-conns-per-ip", json.loads(data)["error"]["message"])
            self.assertEqual(hd.get("connection"), "close")
            st, _, data = srv.post(CHAT, GREEDY, headers={}, timeout=30)
            self.assertEqual(st, 200, data)                  # another address is served
            hold("127.0.0.4", 4)
            hold("127.0.0.5", 1)
            wait_conns(srv, 10)
            hold("127.0.0.5", 1)                             # 10 held: the server's cap
            t0 = time.time()
            while True:                                      # once the server has taken the 10th
                st, _, data = srv.request("GET", "/health", source="127.0.0.6")
                if st == 503 or time.time() - t0 > 5:
                    break
                time.sleep(0.05)
            self.assertEqual(st, 503, data)
            self.assertIn("--max-conns", json.loads(data)["error"]["message"])
            for s in idle:
                s.close()
            idle.clear()
            t0 = time.time()
            while time.time() - t0 < 10:                    # until the server has seen them close
                got = metric(srv, "k3_connections", must=False)
                if got is not None and got <= 1:
                    break
                time.sleep(0.05)
            for source in ("127.0.0.3", "127.0.0.6"):        # recovered
                st, _, data = srv.request("GET", "/health", source=source)
                self.assertEqual(st, 200, data)
            st, _, data = srv.request("POST", CHAT, json.dumps(GREEDY), source="127.0.0.3", timeout=30)
            self.assertEqual(st, 200, data)
        finally:
            for s in idle:
                s.close()
            self.assertEqual(srv.stop(), 0, srv.stderr())

    def test_api_key_file(self):
        os.makedirs(WORK, exist_ok=True)
        key = "k3-file-key-%d" % os.getpid()
        path = os.path.join(WORK, "api-key")
        with open(path, "w") as f:
            f.write("  %s  \n# ignored\n" % key)
        os.chmod(path, 0o600)
        for args, env in ((["--api-key-file", path, "-v"], None), (["-v"], {"K3_API_KEY_FILE": path})):
            srv = Server(self.pack, args, env=env)
            try:
                with open("/proc/%d/cmdline" % srv.p.pid, "rb") as f:
                    self.assertNotIn(key.encode(), f.read())
                st, _, data = srv.post(CHAT, GREEDY, headers={"Authorization": "Bearer " + key})
                self.assertEqual(st, 200, data)
                st, _, data = srv.post("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
                                       headers={"x-api-key": key})
                self.assertEqual(st, 200, data)
                for h in ({"Authorization": "Bearer " + key + "x"}, {"Authorization": "Bearer " + key[:-1]}, {}):
                    st, _, data = srv.post(CHAT, GREEDY, headers=h)
                    self.assertEqual(st, 401, data)
                    self.assertNotIn(key[:-1].encode(), data)
            finally:
                self.assertEqual(srv.stop(), 0, srv.stderr())
            self.assertNotIn(key[:-1], srv.stderr())
        os.chmod(path, 0o644)
        rc, err = serve_fails(self.pack, ["--api-key-file", path])
        self.assertEqual(rc, 2, err)
        self.assertIn("readable by others", err)
        self.assertIn(path, err)
        self.assertNotIn(key, err)
        empty = os.path.join(WORK, "empty-key")
        with open(empty, "w") as f:
            f.write("\n\n")
        os.chmod(empty, 0o600)
        rc, err = serve_fails(self.pack, ["--api-key-file", empty])
        self.assertEqual(rc, 2, err)
        self.assertIn("no key", err)
        rc, err = serve_fails(self.pack, ["--api-key-file", empty, "--api-key", "x"])
        self.assertEqual(rc, 2, err)
        rc, err = serve_fails(self.pack, ["--api-key-file", os.path.join(WORK, "no-such-file")])
        self.assertEqual(rc, 2, err)
        self.assertIn("no-such-file", err)


class DoorDamage(unittest.TestCase):
    BUDGET = "104M"                                   # tiny's minimum: 8 expert slots, part of the trunk streamed

    @classmethod
    def setUpClass(cls):
        _, cls.pack = make_pack("tiny", 1)

    def copy(self):
        os.makedirs(WORK, exist_ok=True)
        pack = os.path.join(WORK, "damaged.k3pack")
        shutil.rmtree(pack, ignore_errors=True)
        shutil.copytree(self.pack, pack)
        return pack

    @staticmethod
    def prompts():
        return [{"prompt": "word %d of the test" % i, "max_tokens": 2, "temperature": 0} for i in range(16)]

    def test_damaged_expert(self):
        srv = Server(self.pack, ["-t", "1", "--budget", self.BUDGET])
        try:
            want = [srv.post("/v1/completions", p) for p in self.prompts()]
            self.assertTrue(all(st == 200 for st, _, _ in want))
        finally:
            self.assertEqual(srv.stop(), 0)
        pack = self.copy()
        srv = Server(pack, ["-t", "1", "--budget", self.BUDGET])
        try:
            self.assertEqual(srv.post("/v1/completions", self.prompts()[0])[0], 200)
            with open(os.path.join(pack, "manifest.json")) as f:
                layer = [x for x in json.load(f)["expert_layers"] if x["layer"] == 4][0]
            at = layer["offset"] + 5 * layer["stride"] + layer["record_size"] // 2     # inside expert 5's record
            with open(os.path.join(pack, "experts-layer-004.k3s"), "r+b") as f:
                f.seek(at)
                b = f.read(1)
                f.seek(at)
                f.write(bytes([b[0] ^ 0x10]))
            failed = 0
            for (want_st, _, want_body), p in zip(want, self.prompts()):
                st, _, data = srv.post("/v1/completions", p)
                if st == 200:                            # never text computed from the damaged bytes
                    self.assertEqual(json.loads(data)["choices"], json.loads(want_body)["choices"])
                else:
                    failed += 1
                    self.assertEqual(st, 500, data)
                    msg = json.loads(data)["error"]["message"]
                    for words in ("experts-layer-004.k3s", "layer 4 expert 5", "does not match"):
                        self.assertIn(words, msg)
            print("expert 5 of layer 4 damaged: %d of 16 requests failed, the rest answered as before" % failed)
            self.assertGreater(failed, 0)
            self.assertLess(failed, 16)
            h = json.loads(srv.request("GET", "/health")[2])
            self.assertEqual(h["status"], "degraded", h)
            self.assertIn("layer 4 expert 5", h["damage"])
            self.assertEqual(h["damage_errors"], failed)
            self.assertEqual(metric(srv, "k3_pack_damage_errors_total"), failed)
            bad = [p for (st, _, _), p in zip(want, self.prompts())
                   if srv.post("/v1/completions", p)[0] == 500][0]
            st, events, done = srv.stream("/v1/completions", bad)
            self.assertEqual(st, 200)
            self.assertIn("layer 4 expert 5", events[-1]["error"]["message"])
            self.assertTrue(done)
        finally:
            self.assertEqual(srv.stop(), 0, srv.stderr())

    def test_truncated_trunk(self):
        pack = self.copy()
        srv = Server(pack, ["-t", "1", "--budget", self.BUDGET])
        try:
            self.assertEqual(srv.post("/v1/completions", self.prompts()[0])[0], 200)
            for name in sorted(os.listdir(pack)):
                if name.startswith("trunk-layer-"):
                    os.truncate(os.path.join(pack, name), 1000)
            for p in self.prompts()[:3]:
                st, _, data = srv.post("/v1/completions", p)
                self.assertEqual(st, 500, data)
                msg = json.loads(data)["error"]["message"]
                self.assertIn("trunk-layer-", msg)
                self.assertIn("tensor 'model.layers.", msg)
            self.assertEqual(json.loads(srv.request("GET", "/health")[2])["status"], "degraded")
            self.assertEqual(srv.request("GET", "/metrics")[0], 200)
        finally:
            self.assertEqual(srv.stop(), 0, srv.stderr())


def make_cert(work, name, cn="127.0.0.1"):
    """A self-signed certificate for 127.0.0.1 and localhost: (cert path, key path)."""
    cert, key = os.path.join(work, name + ".pem"), os.path.join(work, name + ".key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "2", "-subj", "/CN=" + cn, "-addext",
                    "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", key, "-out", cert],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    os.chmod(key, 0o600)
    return cert, key


@unittest.skipUnless(shutil.which("openssl") and shutil.which("curl"), "openssl or curl is not installed")
class DoorTls(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        _, cls.pack = make_pack("tiny", 1)
        os.makedirs(WORK, exist_ok=True)
        cls.cert, cls.key = make_cert(WORK, "k3-test")

    def curl(self, srv, body, stream=False):
        p = subprocess.run(["curl", "-sS", "--max-time", "60", "--cacert", self.cert, srv.url(CHAT), "-H",
                            "Content-Type: application/json", "-d", json.dumps(dict(body, stream=stream))],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=90)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout.decode()

    def test_tls(self):
        plain = Server(self.pack, ["-t", "1"])
        try:
            st, want = plain.chat(GREEDY)
            self.assertEqual(st, 200)
            st, events, done = plain.stream(CHAT, GREEDY)
            want_stream = joined(events)[0]
        finally:
            self.assertEqual(plain.stop(), 0)
        srv = Server(self.pack, ["-t", "1", "--tls-cert", self.cert, "--tls-key", self.key], ca=self.cert)
        try:
            self.assertEqual(srv.scheme, "https")
            got = json.loads(self.curl(srv, GREEDY))
            self.assertEqual(got["choices"], want["choices"])
            events = [json.loads(b[6:]) for b in self.curl(srv, GREEDY, True).split("\n\n")
                      if b.startswith("data: {")]
            self.assertEqual(joined(events)[0], want_stream)
            self.assertEqual(joined(events)[0], want["choices"][0]["message"]["content"])
            # plain HTTP to the TLS port: closed, no hang, never answered in clear text; the server
            # serves on (what comes back, if anything, is a TLS alert record: content type 21)
            t0 = time.time()
            s = socket.create_connection((srv.host, srv.port), timeout=10)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: k3\r\n\r\n")
            reply = b""
            try:
                while True:
                    b = s.recv(4096)
                    if not b:
                        break
                    reply += b
            except OSError:
                pass
            s.close()
            self.assertLess(time.time() - t0, 5)
            self.assertNotIn(b"HTTP/", reply)
            self.assertNotIn(b"status", reply)
            self.assertTrue(not reply or reply[0] == 21, reply[:16])
            st, _, data = srv.request("GET", "/health")
            self.assertEqual(st, 200, data)
            if shutil.which("node") and os.path.exists(os.path.join(HERE, "node_modules", "openai", "package.json")):
                spec = os.path.join(WORK, "tls-spec.json")
                with open(spec, "w") as f:
                    json.dump({"base_url": srv.url("/v1"), "request": GREEDY}, f)
                p = subprocess.run(["node", os.path.join(HERE, "tls_client.mjs"), spec], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, timeout=120, cwd=HERE,
                                   env=dict(os.environ, NODE_EXTRA_CA_CERTS=self.cert))
                self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
                sdk = json.loads(p.stdout)
                self.assertEqual(sdk["plain"], want["choices"][0]["message"]["content"])
                self.assertEqual(sdk["stream"], want_stream)
            else:
                self.skipTest("the openai SDK over TLS: node or the SDK is missing (scripts/setup.sh installs them)")
        finally:
            self.assertEqual(srv.stop(), 0, srv.stderr())

    def test_tls_refusals(self):
        open_key = os.path.join(WORK, "open.key")
        shutil.copy(self.key, open_key)
        os.chmod(open_key, 0o644)
        rc, err = serve_fails(self.pack, ["--tls-cert", self.cert, "--tls-key", open_key])
        self.assertEqual(rc, 2, err)
        self.assertIn("readable by others", err)
        rc, err = serve_fails(self.pack, ["--tls-cert", self.cert])
        self.assertEqual(rc, 2, err)
        self.assertIn("--tls-key", err)
        other_cert, other_key = make_cert(WORK, "k3-other")
        rc, err = serve_fails(self.pack, ["--tls-cert", self.cert, "--tls-key", other_key])
        self.assertNotEqual(rc, 0, err)
        self.assertIn("TLS", err)
        self.assertTrue(os.stat(other_key).st_mode & stat.S_IRWXO == 0)


if __name__ == "__main__":
    unittest.main()

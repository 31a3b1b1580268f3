#!/usr/bin/env python3
"""`k3run serve` benchmarks (issue 17), on the demo model (tests/models/k3-kjv) and `small`:

  1. the server's overhead: tokens per second of a streamed /v1/completions, timed by the client
     from its first text chunk to its last, against `k3run -p` on the same prompt and length
     (its own timer, generate_seconds over the tokens after the first); aim >= 0.98;
  2. time to first token of a resent conversation of 4 and 16 turns: with the prompt cache (the
     server answered the conversation up to the last question just before) and without it (the
     server answered something else just before: nothing of the conversation is held);
  3. TLS: the same streamed completion over HTTPS (--tls-cert/--tls-key, a certificate made with
     openssl) against plain HTTP, the two servers asked in turn; aim >= 0.98.

Usage: tests/bench/bench_serve.py [--pack PACK ...] [--bin build/bin] [--tokens 256] [--rounds 3]
Prints Markdown tables (docs/PERFORMANCE.md, "k3run serve") and one JSON line per measurement."""

import argparse
import http.client
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "serve"))
PROMPT = "In the beginning God created the heaven and the earth. And the earth was without form, and void"
QUESTIONS = ["Quote Genesis %d:1." % i for i in range(1, 40)]


def stream_times(host, port, path, body, ctx=None):
    """(seconds to the first content chunk, seconds of the last chunk, chunks with text, last event);
    ctx: an ssl context (HTTPS)"""
    c = http.client.HTTPSConnection(host, port, timeout=600, context=ctx) if ctx else \
        http.client.HTTPConnection(host, port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", path, body=json.dumps(dict(body, stream=True, stream_options={"include_usage": True})),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    first = last = None
    n, buf, usage = 0, b"", None
    while True:
        line = r.fp.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            break
        e = json.loads(data)
        if e.get("usage"):
            usage = e
        for ch in e.get("choices", []):
            piece = ch.get("text") or (ch.get("delta") or {}).get("content") or (ch.get("delta") or {}).get(
                "reasoning_content")
            if piece:
                now = time.perf_counter() - t0
                first = now if first is None else first
                last = now
                n += 1
    c.close()
    return first, last, n, usage


def overhead(binary, pack, ntok, rounds, host, port, threads):
    rows = []
    for _ in range(rounds):
        p = subprocess.run([os.path.join(binary, "k3run"), "-m", pack, "-p", PROMPT, "-n", str(ntok), "--json", "-q",
                            "-t", str(threads)],
                           capture_output=True, check=True)
        r = json.loads(p.stdout)
        cli = (r["generated_tokens"] - 1) / r["generate_seconds"]
        first, last, n, usage = stream_times(host, port, "/v1/completions", {"prompt": PROMPT, "max_tokens": ntok,
                                                                                "temperature": 0})   # greedy, as k3run -p
        gen = usage["usage"]["completion_tokens"]
        srv = (gen - 1) / (last - first) if last > first else float("nan")
        engine = 1.0 / usage["k3"]["seconds_per_token"]
        rows.append((cli, srv, gen, r["generated_tokens"], engine))
        print(json.dumps({"bench": "serve_overhead", "pack": pack, "cli_tok_s": cli, "serve_tok_s": srv,
                          "serve_engine_tok_s": engine,
                          "tokens": gen, "cli_tokens": r["generated_tokens"]}))
    return rows


def conversation(turns):
    msgs = []
    for i in range(turns - 1):
        msgs += [{"role": "user", "content": QUESTIONS[i]},
                 {"role": "assistant", "content": "In the beginning God created the heaven and the earth."}]
    return msgs + [{"role": "user", "content": QUESTIONS[turns - 1]}]


def ttft(host, port, turns, rounds):
    out = {"cached": [], "uncached": []}
    for _ in range(rounds):
        conv = conversation(turns)
        body = {"messages": conv, "max_tokens": 8, "reasoning_effort": "none"}
        # without the cache: something else was answered just before
        stream_times(host, port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello?"}],
                                                         "max_tokens": 4, "reasoning_effort": "none"})
        f, _, _, u = stream_times(host, port, "/v1/chat/completions", body)
        out["uncached"].append((f, u["usage"]["prompt_tokens_details"]["cached_tokens"], u["usage"]["prompt_tokens"]))
        # with it: the turn before (up to the previous question), then the whole conversation, as a
        # client resends it (the history's last answer is not the model's own, so the cache holds
        # everything up to the previous question: the state kept at the end of that prompt)
        stream_times(host, port, "/v1/chat/completions", dict(body, messages=conv[:-2]))
        f, _, _, u = stream_times(host, port, "/v1/chat/completions", body)
        out["cached"].append((f, u["usage"]["prompt_tokens_details"]["cached_tokens"], u["usage"]["prompt_tokens"]))
        print(json.dumps({"bench": "serve_ttft", "turns": turns, "uncached": out["uncached"][-1],
                          "cached": out["cached"][-1]}))
    return out


def tls(pack, ntok, rounds, threads):
    """Streamed tokens/s over HTTPS / over plain HTTP, each round asking both servers in turn."""
    from servelib import Server
    d = tempfile.mkdtemp(prefix="k3-bench-tls-")
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    os.chmod(key, 0o600)
    ctx = ssl.create_default_context(cafile=cert)
    plain = Server(pack, ["-t", str(threads), "--queue", "1"])
    secure = Server(pack, ["-t", str(threads), "--queue", "1", "--tls-cert", cert, "--tls-key", key], ca=cert)
    ratios = []
    try:
        for _ in range(rounds):
            body = {"prompt": PROMPT, "max_tokens": ntok, "temperature": 0}
            f, l, n, u = stream_times(plain.host, plain.port, "/v1/completions", body)
            p = (u["usage"]["completion_tokens"] - 1) / (l - f)
            f, l, n, u = stream_times(secure.host, secure.port, "/v1/completions", body, ctx)
            t = (u["usage"]["completion_tokens"] - 1) / (l - f)
            ratios.append((p, t, t / p))
            print(json.dumps({"bench": "serve_tls", "pack": pack, "plain_tok_s": p, "tls_tok_s": t}))
    finally:
        plain.stop()
        secure.stop()
    return ratios


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pack", action="append", help="packs (default: k3-kjv packed under /tmp/k3-bench-serve)")
    ap.add_argument("--bin", default=os.path.join(SRC, "build", "bin"))
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    os.environ["K3_BIN"] = a.bin
    from servelib import Server, kjv_pack
    packs = a.pack or [kjv_pack("/tmp/k3-bench-serve")]
    print("| pack | threads | k3run tok/s (own timer) | server tok/s (client, streamed) | ratio (median of rounds) "
          "| server's engine tok/s (k3.seconds_per_token) | delivery: client / engine | tokens |")
    table, ttfts = [], []
    for pack in packs:
        srv = Server(pack, ["-t", str(a.threads), "--queue", "1"])
        try:
            rows = overhead(a.bin, pack, a.tokens, a.rounds, srv.host, srv.port, a.threads)
            cli = statistics.median(r[0] for r in rows)
            s = statistics.median(r[1] for r in rows)
            ratio = statistics.median(r[1] / r[0] for r in rows)
            eng = statistics.median(r[4] for r in rows)
            deliv = statistics.median(r[1] / r[4] for r in rows)
            table.append("| %s | %d | %.1f | %.1f | **%.3f** | %.1f | %.3f | %d |" % (
                os.path.basename(pack), a.threads, cli, s, ratio, eng, deliv, rows[0][2]))
            if pack == packs[0]:
                for turns in (4, 16):
                    ttfts.append((turns, ttft(srv.host, srv.port, turns, a.rounds)))
        finally:
            srv.stop()
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(table))
    print()
    r = tls(packs[0], a.tokens, max(a.rounds, 5), a.threads)
    print("| pack | plain HTTP tok/s (streamed) | HTTPS tok/s | ratio (median of %d rounds) |" % len(r))
    print("|---|---|---|---|")
    print("| %s | %.1f | %.1f | **%.3f** |" % (os.path.basename(packs[0]), statistics.median(x[0] for x in r),
                                             statistics.median(x[1] for x in r), statistics.median(x[2] for x in r)))
    print()
    print("| conversation | prompt tokens | time to first token, nothing cached | cached | tokens from the cache |")
    print("|---|---|---|---|---|")
    for turns, o in ttfts:
        u = statistics.median(x[0] for x in o["uncached"])
        c = statistics.median(x[0] for x in o["cached"])
        print("| %d turns | %d | %.1f ms | %.1f ms | %d |" % (turns, o["cached"][0][2], u * 1e3, c * 1e3,
                                                                o["cached"][0][1]))


if __name__ == "__main__":
    main()

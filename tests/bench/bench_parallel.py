#!/usr/bin/env python3
"""Many conversations per pass (issue 33): aggregate and per-conversation tokens/s of
`k3run serve --parallel S` with S clients at once, against the same S requests answered one after
another by one slot (the same bytes: tests/serve/test_serve_parallel.py checks it).

usage: K3_BIN=build/bin tests/bench/bench_parallel.py PACK [--budget SIZE] [--context N] [-t N] [-n TOKENS]
                                                      [--slots 1,2,4,8] [--rounds R]
Each request is a completion of -n tokens (greedy, ignoring the end of text is not possible: a
request that stops early counts its own tokens). Prints one table row per S."""

import argparse
import http.client
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "serve"))
from servelib import Server  # noqa: E402

PROMPTS = ["In the beginning God created", "And the LORD said unto Moses", "Blessed is the man that",
           "Now it came to pass in the days", "The LORD is my shepherd", "And Jesus answered and said",
           "Hear, O Israel", "Then said the king", "Thus saith the LORD", "And it came to pass",
           "Praise ye the LORD", "In those days", "And God said", "Behold, I come quickly",
           "The words of the preacher", "Now the serpent was"]


def complete(srv, prompt, n):
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=3600)
    c.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0.8,
                                                      "seed": 1}), {"Content-Type": "application/json"})
    r = json.loads(c.getresponse().read())
    c.close()
    return r["usage"]["completion_tokens"]


def run(pack, S, args, n, together):
    srv = Server(pack, ["--parallel", str(S) if together else "1"] + args)
    try:
        complete(srv, "warm up", 4)
        toks = [0] * S
        lat = [0.0] * S

        def one(i):
            t0 = time.time()
            toks[i] = complete(srv, PROMPTS[i % len(PROMPTS)], n)
            lat[i] = time.time() - t0
        t0 = time.time()
        if together:
            ts = [threading.Thread(target=one, args=(i,)) for i in range(S)]
            [t.start() for t in ts]
            [t.join() for t in ts]
        else:
            for i in range(S):
                one(i)
        wall = time.time() - t0
    finally:
        srv.stop()
    return sum(toks), wall, sum(lat) / S, max(lat)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pack")
    ap.add_argument("--budget")
    ap.add_argument("--context", help="k3run serve --context (each slot's buffers count against the budget)")
    ap.add_argument("-t", default="2")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--slots", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternate the two servers this many times and keep each one's best (disk caches warm up)")
    a = ap.parse_args()
    args = ["-t", a.t, "--draft", "0"] + (["--budget", a.budget] if a.budget else []) + \
        (["--context", a.context] if a.context else [])
    print("| S | tokens | one slot, one after another: tok/s | --parallel S: aggregate tok/s | per conversation "
          "tok/s | gain | each client's latency, one slot (the last waits for the others): mean / max s | "
          "--parallel S: mean / max s |")
    print("|---|---|---|---|---|---|---|---|")
    for S in [int(x) for x in a.slots.split(",")]:
        best1 = bestS = None
        for _ in range(a.rounds):
            t1, w1, lat1, _ = run(a.pack, S, args, a.n, False)
            tS, wS, latS, maxS = run(a.pack, S, args, a.n, True)
            if best1 is None or t1 / w1 > best1[0] / best1[1]:
                best1 = (t1, w1, lat1)
            if bestS is None or tS / wS > bestS[0] / bestS[1]:
                bestS = (tS, wS, latS, maxS)
        (t1, w1, lat1), (tS, wS, latS, maxS) = best1, bestS
        # one slot answering S clients that arrive together: client i waits for the i before it, so
        # its latency is i + 1 requests' time (mean (S + 1) / 2 of them, the last all S)
        print("| %d | %d | %.1f | %.1f | %.1f | %.2fx | %.2f / %.2f | %.2f / %.2f |" % (
            S, tS, t1 / w1, tS / wS, tS / S / latS, (tS / wS) / (t1 / w1), lat1 * (S + 1) / 2, w1, latS, maxS),
            flush=True)


if __name__ == "__main__":
    main()

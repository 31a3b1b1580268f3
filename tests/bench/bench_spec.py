#!/usr/bin/env python3
"""Speculative decoding benchmarks (issue 16), on the demo model (tests/models/k3-kjv) or a pack:

  1. tokens per pass and s/token with drafts off (--draft 0), by the length rule (the default)
     and as long as the text offers (K3_DRAFT_TEST=full), on three requests: (a) quoting a
     passage given in the prompt, (b) a chat answer, (c) free continuation; with the whole
     model in memory and at a budget where the trunk streams (the minimum + 1 MiB);
  2. the cost of a verify pass of 1 + K tokens, K = 0..8: seconds and bytes read per pass,
     measured with drafts that are always right (K3_DRAFT_TEST=oracle:IDS, the ids plain
     decoding wrote), over the cost of a one-token pass.

Every configuration writes the same ids (checked here too). Usage:
  tests/bench/bench_spec.py [--pack PACK] [--bin build/bin] [-n 160] [--threads 2] [--repeat 3]
                            [--budgets resident,streaming | --budgets 100,25] [--verify-only] [--max-k 8]
--budgets: "resident" (no --budget), "streaming" (the planner's minimum + 1 MiB), or a percentage of
the pack's bytes (100, 25: the issue's figures on medium). --verify-only: only table 2.
Prints the tables docs/PERFORMANCE.md quotes, and one JSON line per measurement."""

import argparse
import json
import os
import re
import subprocess
import tempfile

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
QUOTE = ("And God said, Let there be light: and there was light. And God saw the light, that it was good: "
         "and God divided the light from the darkness. And God called the light Day, and the darkness he "
         "called Night. And the evening and the morning were the first day. And God said, Let there be a "
         "firmament in the midst of the waters, and let it divide the waters from the waters.\n\n"
         "And God said, Let there be light: and there was light. And God saw")
FREE = "And it came to pass in those days, that"
CHAT_Q = "Quote Genesis 1:1."


def k3run(binary, args, env=None, stdin=None):
    e = dict(os.environ)
    e.pop("K3_DRAFT_TEST", None)
    e.update(env or {})
    p = subprocess.run([os.path.join(binary, "k3run")] + args, input=stdin, capture_output=True, env=e)
    if p.returncode:
        raise SystemExit("k3run %s: %s" % (" ".join(args[:6]), p.stderr.decode(errors="replace")))
    return p.stdout


def measure(a, pack, request, budget, draft, env=None):
    """best of --repeat runs: (s/token, tokens per pass, passes, bytes read, ids)"""
    best = None
    for _ in range(a.repeat):
        if request == "chat":
            out = k3run(a.bin, ["chat", "-m", pack, "-q", "--json", "--think", "off", "-p", CHAT_Q, "-n", str(a.n),
                                "-t", str(a.threads), "--draft", str(draft)] + budget, env=env)
            d = json.loads(out.decode().splitlines()[-1])
            k = d["k3"]
            r = (k["generate_seconds"] / max(d["usage"]["completion_tokens"], 1), k["tokens_per_pass"], k["passes"],
                 k["bytes_read"], d["message"])
        else:
            prompt = QUOTE if request == "quote" else FREE
            out = k3run(a.bin, ["-m", pack, "-p", prompt, "-n", str(a.n), "-t", str(a.threads), "--json",
                                "--draft", str(draft)] + budget, env=env)
            d = json.loads(out)
            n = max(len(d["generated_ids"]), 1)
            read = sum(t["bytes_read"] for t in d.get("tokens", []))     # in the token loop
            r = (d["generate_seconds"] / n, d["tokens_per_pass"], d["passes"], read, d["generated_ids"])
        if best is None or r[0] < best[0]:
            best = r
    return best


def minimum(a, pack):
    p = subprocess.run([os.path.join(a.bin, "k3run"), "-m", pack, "-p", "x", "--budget", "1M"], capture_output=True)
    return int(re.search(rb"minimum of [0-9.]+ GiB \((\d+) bytes", p.stderr).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pack")
    ap.add_argument("--bin", default=os.path.join(SRC, "build", "bin"))
    ap.add_argument("-n", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--budgets", default="resident,streaming")
    ap.add_argument("--verify-only", action="store_true")
    ap.add_argument("--max-k", type=int, default=8)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="k3bench-spec-")
    pack = a.pack or os.path.join(work, "k3-kjv.k3pack")
    if not a.pack:
        subprocess.run([os.path.join(a.bin, "k3pack"), "-q", os.path.join(SRC, "tests", "models", "k3-kjv"), "-o",
                        pack], check=True)
    budgets = {}
    # the model's bytes: the pack's shards, and the expert records an in-place pack reads from the
    # checkpoint (k3pack --experts-in-place: not in the pack's directory)
    with open(os.path.join(pack, "manifest.json")) as f:
        mf = json.load(f)
    pack_bytes = sum(x["size"] for x in mf["shards"]) + sum(
        x["count"] * x["record_size"] for x in mf["expert_layers"] if x.get("source") == "checkpoint")
    for b in a.budgets.split(","):
        if b == "resident":
            budgets[b] = []
        elif b == "streaming":
            budgets[b] = ["--budget", str(minimum(a, pack) + (1 << 20))]
        else:
            budgets[b + "%"] = ["--budget", str(pack_bytes * int(b) // 100)]

    if a.verify_only:
        return verify_table(a, pack, budgets)
    print("1. speculative decoding: s/token (tokens per pass), best of %d, %d tokens, %d threads" %
          (a.repeat, a.n, a.threads))
    print("%-10s %-9s %16s %16s %16s %8s %8s" % ("budget", "request", "--draft 0", "rule (8)", "full (8)",
                                                "rule", "full"))
    for bname, budget in budgets.items():
        for request in ("quote", "chat", "free"):
            plain = measure(a, pack, request, budget, 0)
            rule = measure(a, pack, request, budget, 8)
            full = measure(a, pack, request, budget, 8, env={"K3_DRAFT_TEST": "full"})
            same = plain[4] == rule[4] == full[4]
            print("%-10s %-9s %9.2f ms (%.2f) %9.2f ms (%.2f) %9.2f ms (%.2f) %7.2fx %7.2fx%s" % (
                bname, request, plain[0] * 1e3, plain[1], rule[0] * 1e3, rule[1], full[0] * 1e3, full[1],
                plain[0] / rule[0], plain[0] / full[0], "" if same else "  OUTPUT DIFFERS"))
            print(json.dumps({"bench": "spec", "budget": bname, "request": request, "plain_s_per_token": plain[0],
                              "rule_s_per_token": rule[0], "full_s_per_token": full[0],
                              "rule_tokens_per_pass": rule[1], "full_tokens_per_pass": full[1], "same": same}))
    verify_table(a, pack, budgets)


def verify_table(a, pack, budgets):
    print("\n2. the cost of a verify pass of 1 + K tokens (drafts always right), over a one-token pass")
    print("%-10s %3s %12s %10s %14s %10s" % ("budget", "K", "s/pass", "x K=0", "MiB read/pass", "x K=0"))
    for bname, budget in budgets.items():
        ids = measure(a, pack, "free", budget, 0)[4]
        oracle = "oracle:" + ",".join(map(str, ids))
        base = None
        for K in range(0, a.max_k + 1):
            r = measure(a, pack, "free", budget, K, env={"K3_DRAFT_TEST": oracle} if K else None)
            s_pass = r[0] * r[1]
            mib = r[3] / 1048576.0 / max(r[2], 1)
            if base is None:
                base = (s_pass, mib)
            print("%-10s %3d %9.3f ms %9.2fx %14.2f %9.2fx" % (bname, K, s_pass * 1e3, s_pass / base[0], mib,
                                                                mib / base[1] if base[1] else 0))
            print(json.dumps({"bench": "verify_pass", "budget": bname, "K": K, "s_per_pass": s_pass,
                              "mib_per_pass": mib, "same": r[4] == ids}))


if __name__ == "__main__":
    main()

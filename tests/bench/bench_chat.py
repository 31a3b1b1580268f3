#!/usr/bin/env python3
"""Chat benchmarks (issue 15), on the demo model (tests/models/k3-kjv) or another pack:

  1. time to first token of turn N against the history's length, N = 1, 4, 16: one process
     holding the conversation (the prompt cache: only the new tokens are processed), and the
     same conversation up to turn N rendered from nothing (--messages, nothing cached);
  2. session files: save and load time and file size after 1, 4 and 16 turns.

Usage: tests/bench/bench_chat.py [--pack PACK] [--bin build/bin] [--turns 16]
Prints a table (the numbers docs/PERFORMANCE.md quotes) and one JSON line per measurement."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
QUESTIONS = ["Quote Genesis %d:1." % i for i in range(1, 40)]


def chat(binary, pack, args, stdin=None):
    p = subprocess.run([os.path.join(binary, "k3run"), "chat", "-m", pack, "-q", "--json", "--think", "off",
                        "-n", "64", "-t", "1"] + args, input=stdin, capture_output=True, check=True)
    return [json.loads(l) for l in p.stdout.decode().splitlines() if l.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pack")
    ap.add_argument("--bin", default=os.path.join(SRC, "build", "bin"))
    ap.add_argument("--turns", type=int, default=16)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="k3bench-chat-")
    pack = a.pack or os.path.join(work, "k3-kjv.k3pack")
    if not a.pack:
        subprocess.run([os.path.join(a.bin, "k3pack"), "-q", os.path.join(SRC, "tests", "models", "k3-kjv"), "-o",
                        pack], check=True)
    qs = QUESTIONS[:a.turns]
    cached = chat(a.bin, pack, [], stdin=("\n".join(qs) + "\n").encode())
    print("turn  history  cached  processed  ttft_cached_s  ttft_scratch_s  ratio")
    conv = []
    for n, d in enumerate(cached, 1):
        conv += [{"role": "user", "content": qs[n - 1]}]
        if n in (1, 4, 16) or n == len(cached):
            path = os.path.join(work, "conv.json")
            with open(path, "w") as f:
                json.dump({"messages": conv}, f)
            s = chat(a.bin, pack, ["--messages", path])[0]
            assert s["message"] == d["message"], "turn %d differs from the conversation rendered from nothing" % n
            u, k = d["usage"], d["k3"]
            row = {"turn": n, "history_tokens": u["prompt_tokens"], "cached": u["prompt_tokens_details"]["cached_tokens"],
                   "processed": k["processed_tokens"], "ttft_cached": k["seconds_to_first_token"],
                   "ttft_scratch": s["k3"]["seconds_to_first_token"]}
            print("%4d  %7d  %6d  %9d  %13.4f  %14.4f  %5.1f" % (n, row["history_tokens"], row["cached"], row["processed"],
                                                                row["ttft_cached"], row["ttft_scratch"],
                                                                row["ttft_scratch"] / row["ttft_cached"]))
            print(json.dumps(row), file=sys.stderr)
        conv.append(d["message"])
    print("\nturns  positions  file_bytes  save_s  load_s")
    for n in (1, 4, 16):
        if n > len(qs):
            break
        s = os.path.join(work, "s.k3session")
        t = time.time()
        chat(a.bin, pack, ["--save-session", s], stdin=("\n".join(qs[:n]) + "\n").encode())
        size = os.path.getsize(s)
        p = subprocess.run([os.path.join(a.bin, "k3run"), "chat", "-m", pack, "--think", "off", "-n", "1",
                            "--load-session", s, "--save-session", s + "2", "-p", "x", "-v"],
                           capture_output=True, check=True)
        info = p.stderr.decode()
        import re
        ls = float(re.search(r"loaded the session .*?([0-9.]+) s\)", info).group(1))
        ss = float(re.search(r"saved the session .*?([0-9.]+) s\)", info).group(1))
        pos = int(re.search(r"\((\d+) positions", info).group(1))
        print("%5d  %9d  %10d  %6.3f  %6.3f" % (n, pos, size, ss, ls))
        print(json.dumps({"turns": n, "positions": pos, "file_bytes": size, "save_s": ss, "load_s": ls}),
              file=sys.stderr)
    del t


if __name__ == "__main__":
    main()

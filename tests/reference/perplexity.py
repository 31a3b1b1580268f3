#!/usr/bin/python3
"""Perplexity of a text file under the NumPy reference, with llama.cpp's llama-perplexity rules.

    perplexity.py --model DIR --file FILE [--context N] [--chunks N] [--json]

The file is tokenized as plain text (kimi_tokenizer, specials off, no BOS), cut into
floor(tokens / N) chunks of N tokens (--chunks caps the count); each chunk is run from an
empty state, and only its second half is scored: the logits at positions N/2 .. N-2 predict
the tokens at N/2+1 .. N-1 (N - 1 - N/2 tokens per chunk). Per token, log-softmax with the
max over the fp32 logits and the sum of exp in double; nll and nll^2 summed in double.
PPL = exp(mean nll); its standard error by the delta method, PPL * sqrt(var(nll) / (n - 1)),
as llama.cpp prints it ("Final estimate: PPL = X +/- Y").
"""

import argparse
import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import kimi_tokenizer as kt  # noqa: E402
from k3model import Model  # noqa: E402


def score_chunk(model, ids):
    """[n_scored] nll (float64) of the second half of one chunk."""
    n = len(ids)
    first = n // 2
    rec = model.forward(ids, model.new_state())
    lg = rec["logits"][first:n - 1].astype(np.float32)                   # [m, V]
    mx = lg.max(axis=1)
    lse = np.log(np.exp((lg - mx[:, None]).astype(np.float32)).astype(np.float64).sum(axis=1))
    tgt = np.asarray(ids[first + 1:n])
    return -((lg[np.arange(len(tgt)), tgt] - mx).astype(np.float64) - lse)


def perplexity(model, ids, n_ctx, max_chunks=None, on_chunk=None):
    if len(ids) < 2 * n_ctx:
        raise ValueError("%d tokens: perplexity needs at least 2 x context = %d" % (len(ids), 2 * n_ctx))
    n_chunks = len(ids) // n_ctx
    if max_chunks:
        n_chunks = min(n_chunks, max_chunks)
    nll = nll2 = 0.0
    count = 0
    running = []
    for c in range(n_chunks):
        v = score_chunk(model, ids[c * n_ctx:(c + 1) * n_ctx])
        nll += float(v.sum())
        nll2 += float((v * v).sum())
        count += len(v)
        running.append(math.exp(nll / count))
        if on_chunk:
            on_chunk(c, running[-1])
    mean = nll / count
    var = nll2 / count - mean * mean
    ppl = math.exp(mean)
    err = ppl * math.sqrt(var / (count - 1)) if var > 0 else 0.0
    return {"ppl": ppl, "ppl_stderr": err, "nll": mean, "context": n_ctx, "chunks": n_chunks,
            "tokens_scored": count, "running": running}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    tok = kt.Tokenizer.from_dir(a.model)
    with open(a.file, "rb") as f:
        ids = tok.encode_bytes(f.read())
    model = Model(a.model)
    r = perplexity(model, ids, a.context, a.chunks or None,
                   None if a.json else (lambda c, p: print("[%d]%.4f," % (c + 1, p), end="", file=sys.stderr, flush=True)))
    if a.json:
        print(json.dumps(r))
    else:
        print("\nFinal estimate: PPL = %.4f +/- %.5f" % (r["ppl"], r["ppl_stderr"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Measure how fp32 rounding differences grow through the K3 layers (README "Tolerances").

  tolerance_study.py --model DIR [--prompt TEXT | --ids 1,2,3] [--tokens N]

Runs the same token ids (prefill at once) through several valid computations and compares
each against the reference fp32 run (BLAS order, expanded MLA, recurrent KDA):
  f64       the same math in float64 (how far fp32 is from exact),
  alt       fp32 with every matmul summed in reversed 64-wide blocks (another summation order,
            what a C engine with its own kernels looks like),
  alt2      fp32 with absorbed MLA + chunked KDA (another valid formulation),
  stepwise  fp32 fed one token at a time (decode path vs prefill path),
  bf16      the official code's bf16 rounding points (how far an HF bf16 run drifts).
For each: per layer the scale-relative error max|d|/max|ref| of layers.i.out (and its growth
factor vs the previous layer), of logits, routing flips, and the smallest top-k margin next to
the largest router-score difference. Prints markdown tables.
"""

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from k3model import Model, concat_records    # noqa: E402


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def rms_rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2)) / max(np.sqrt(np.mean(b ** 2)), 1e-30))


def run(model_dir, ids, variant):
    kw = {"f64": dict(mode="f64"), "alt": dict(alt_order=True), "alt2": dict(mla_absorb=True, kda_chunk=16),
          "bf16": dict(mode="bf16")}.get(variant, {})
    m = Model(model_dir, **kw)
    if variant == "stepwise":
        st = m.new_state()
        return m, concat_records([m.forward([t], st) for t in ids])
    return m, m.forward(ids, m.new_state())


def study(model_dir, ids, variants, out=print):
    m, ref = run(model_dir, ids, "fp32")
    c = m.cfg
    res = {v: run(model_dir, ids, v)[1] for v in variants}
    out("model %s, %d positions, %d layers (AttnRes block %s)\n" % (model_dir, len(ids), c.L, c.block))
    out("Scale-relative error max|d|/max|ref| of layers.i.out vs the fp32 reference "
        "(growth = this layer / previous layer):\n")
    out("| layer | kind | " + " | ".join("%s | growth" % v for v in variants) + " |")
    out("|---|---|" + "---|---|" * len(variants))
    prev = {v: None for v in variants}
    for i in range(c.L):
        kind = ("KDA" if c.is_kda(i) else "MLA") + ("+MoE" if c.is_moe(i) else "+FFN")
        if c.block and i % c.block == 0:
            kind += " (boundary)"
        cells = []
        for v in variants:
            e = rel(res[v]["layers"][i]["out"], ref["layers"][i]["out"])
            g = "" if prev[v] in (None, 0) else "%.2f" % (e / prev[v])
            prev[v] = e
            cells.append("%.2e | %s" % (e, g))
        out("| %d | %s | %s |" % (i, kind, " | ".join(cells)))
    for key in ("final_hidden", "logits"):
        out("| %s | | %s |" % (key, " | ".join("%.2e | " % rel(res[v][key], ref[key]) for v in variants)))
    out("")
    out("| variant | logits rms-rel | max |d logit| | argmax changes | expert-set flips | "
        "max abs d biased score |")
    out("|---|---|---|---|---|---|")
    for v in variants:
        r = res[v]
        flips, dsel = 0, 0.0
        for a, b in zip(r["layers"], ref["layers"]):
            if "experts" in b:
                flips += int((np.sort(a["experts"], 1) != np.sort(b["experts"], 1)).any(1).sum())
                dsel = max(dsel, float(np.abs(a["sel"].astype(np.float64) - b["sel"]).max()))
        out("| %s | %.2e | %.2e | %d | %d | %.2e |" % (
            v, rms_rel(r["logits"], ref["logits"]),
            float(np.abs(r["logits"].astype(np.float64) - ref["logits"]).max()),
            int((r["logits"].argmax(-1) != ref["logits"].argmax(-1)).sum()), flips, dsel))
    margins = [float(L["margin"].min()) for L in ref["layers"] if "margin" in L]
    if margins:
        lg = np.sort(ref["logits"].astype(np.float64), -1)
        out("\nreference: min top-k margin %.3e (per-layer minima: %s); min logit top1-top2 gap %.3e"
            % (min(margins), " ".join("%.1e" % x for x in margins), float((lg[:, -1] - lg[:, -2]).min())))
    return ref, res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", default="The quick brown fox jumps over the lazy dog. Once upon a time, "
                                         "there was a little girl who lived in a village near the forest.")
    ap.add_argument("--ids")
    ap.add_argument("--tokens", type=int, default=48, help="use the first N prompt tokens")
    ap.add_argument("--variants", default="f64,alt,alt2,stepwise,bf16")
    a = ap.parse_args(argv)
    if a.ids:
        ids = [int(x) for x in a.ids.split(",")]
    else:
        from kimi_tokenizer import Tokenizer
        ids = Tokenizer.from_dir(a.model).encode(a.prompt * 4)[:a.tokens]
    study(a.model, ids, a.variants.split(","))
    return 0


if __name__ == "__main__":
    sys.exit(main())

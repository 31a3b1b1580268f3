#!/usr/bin/python3
"""Held-out perplexity of the demo model, every way it exists (docs/MODEL-CARD.md's table).

    evaluate.py --data DIR --state DIR --ckpt tests/models/k3-kjv [--k3run BIN --pack PACK] [--context 256]

Ruth, Jonah and Jude (DIR/kjv-heldout.txt), llama-perplexity's chunking (tests/reference/
perplexity.py), scored
  1. in torch, fp32, the snapshot taken before the MXFP4 phase (experts in fp32);
  2. that snapshot exported as is (BF16 trunk, experts rounded to MXFP4 after training),
     through the NumPy reference;
  3. in torch, the final weights with the experts' MXFP4 values (fp32 trunk);
  4. the shipped checkpoint (BF16 trunk, MXFP4 experts) through the NumPy reference;
  5. the shipped checkpoint packed, through k3run --perplexity (with --k3run and --pack).
Run once, after training: nothing here feeds back into training or the choice of checkpoint.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import export  # noqa: E402
import k3torch  # noqa: E402
import kimi_tokenizer as kt  # noqa: E402
import perplexity as refppl  # noqa: E402
from k3model import Model as RefModel  # noqa: E402


class TorchScorer:
    """Quacks like k3model.Model for perplexity.score_chunk: forward(ids, state) -> logits."""

    def __init__(self, model):
        self.m = model

    def new_state(self):
        return None

    @torch.no_grad()
    def forward(self, ids, _state):
        return {"logits": self.m(torch.tensor([list(ids)]))[0].numpy()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--k3run", default=None)
    ap.add_argument("--pack", default=None)
    ap.add_argument("--context", type=int, default=256)
    a = ap.parse_args(argv)
    torch.set_num_threads(2)
    heldout = os.path.join(a.data, "kjv-heldout.txt")
    tok = kt.Tokenizer.from_dir(a.ckpt)
    with open(heldout, "rb") as f:
        ids = tok.encode_bytes(f.read())
    cfg = {"text_config": export.text_config(tok.n_ranks)}
    rows = []

    def add(name, r):
        rows.append({"what": name, "ppl": r["ppl"], "ppl_stderr": r["ppl_stderr"], "chunks": r["chunks"],
                     "tokens_scored": r["tokens_scored"]})
        print("%-62s PPL = %.4f +/- %.4f" % (name, r["ppl"], r["ppl_stderr"]), file=sys.stderr)

    pre = k3torch.Model(cfg)
    pre.load_state_dict(torch.load(os.path.join(a.state, "pre-mxfp4.pt"))["model"])
    add("fp32, before the MXFP4 phase (torch)", refppl.perplexity(TorchScorer(pre), ids, a.context))
    with tempfile.TemporaryDirectory() as tmp:
        export.export(pre, a.ckpt, tmp)
        add("before the MXFP4 phase, exported (BF16 + MXFP4 after training; reference)",
            refppl.perplexity(RefModel(tmp), ids, a.context))
    fin = k3torch.Model(cfg)
    fin.load_state_dict(torch.load(os.path.join(a.state, "state.pt"))["model"])
    fin.fake_mxfp4(True)
    add("final, MXFP4 experts, fp32 trunk (torch)", refppl.perplexity(TorchScorer(fin), ids, a.context))
    add("final, shipped checkpoint: BF16 trunk + MXFP4 experts (reference)",
        refppl.perplexity(RefModel(a.ckpt), ids, a.context))
    if a.k3run and a.pack:
        p = subprocess.run([a.k3run, "-m", a.pack, "--perplexity", heldout, "--context", str(a.context), "--json"],
                           check=True, capture_output=True)
        add("final, shipped checkpoint packed (k3run --perplexity)", json.loads(p.stdout))
    print(json.dumps({"context": a.context, "tokens": len(ids), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

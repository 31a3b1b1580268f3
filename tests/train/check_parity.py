"""Before training: k3torch equals the NumPy reference (tests/reference/k3model.py) on the
same weights. A fresh model (seeded init) is exported, its exported weights (BF16 trunk,
MXFP4 experts) are loaded back into torch, and both compute the logits of the same ids.

    check_parity.py --tok DIR [--out DIR] [--tol 2e-4]
Exit 0 when max |logit difference| / max |logit| <= tol and the routed experts agree.
"""

import argparse
import os
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
import mxfp4  # noqa: E402
from k3model import Model as RefModel  # noqa: E402
from safetensors_io import ModelDir  # noqa: E402


def load_exported(model, ckpt):
    """Copy a checkpoint's exact weights (BF16 widened, MXFP4 dequantized) into model."""
    md = ModelDir(ckpt)
    sd = model.state_dict()
    with torch.no_grad():
        for key, t in sd.items():
            parts = key.split(".")
            if "block_sparse_moe" in parts and parts[-1] in ("w1", "w2", "w3"):
                base = export.mc.P + ".".join(parts[:-1]) + ".experts."
                for e in range(t.shape[0]):
                    n = base + "%d.%s." % (e, parts[-1])
                    t[e] = torch.from_numpy(mxfp4.dequantize(md.get(n + "weight_packed"), md.get(n + "weight_scale")))
                continue
            name = (export.mc.LM if key == "lm_head.weight" else export.mc.P) + key
            t.copy_(torch.from_numpy(md.get_f32(name).reshape(t.shape)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tok", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--tol", type=float, default=2e-4)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    torch.manual_seed(a.seed)
    n_ranks = len(kt.load_tiktoken_bpe(os.path.join(a.tok, "tiktoken.model")))
    m = k3torch.Model({"text_config": export.text_config(n_ranks)})
    # an untrained model routes on near-zero logits; give the router and AttnRes real signal
    with torch.no_grad():
        for p_name, p in m.named_parameters():
            if p_name.endswith("_res_proj.weight"):
                p.normal_(0, 1.0 / p.shape[-1] ** 0.5)
    out = a.out or tempfile.mkdtemp(prefix="k3parity-")
    export.export(m, a.tok, out)
    load_exported(m, out)
    tok = kt.Tokenizer.from_dir(out)
    ids = tok.encode("In the beginning God created the heaven and the earth. And the earth was without form")
    with torch.no_grad():
        lt = m(torch.tensor([ids]))[0].numpy()
    ref = RefModel(out)
    rec = ref.forward(ids, ref.new_state())
    lr = rec["logits"]
    err = float(np.abs(lt - lr).max() / np.abs(lr).max())
    # the recurrent and chunked KDA forms agree too
    q, k, v, g, b = (torch.randn(2, 70, 3, 16), torch.randn(2, 70, 3, 16), torch.randn(2, 70, 3, 16),
                     -5 * torch.rand(2, 70, 3, 16), torch.rand(2, 70, 3))
    k = k / k.norm(dim=-1, keepdim=True)
    kerr = float((k3torch.kda_recurrent(q, k, v, g, b) - k3torch.kda_chunked(q, k, v, g, b)).abs().max())
    print("parity: %d tokens, max |dlogit| / max |logit| = %.2e (tol %.0e); KDA chunked vs recurrent %.2e"
          % (len(ids), err, a.tol, kerr))
    return 0 if err <= a.tol and kerr < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Does the demo architecture learn to copy from its context? (issue 34; docs/MODEL-CARD.md)

    copy_probe.py [--steps N] [--alphabet K] [--widen] [--len L] [--repeat R] [--from CKPT] ...

Windows of --ctx tokens made of random strings of --len tokens, each written --repeat times: the
first copy cannot be predicted, the repeats only by copying. Prints, every 10 steps, the loss on
first copies and on repeats; a repeat loss well below the first copy's is in-context copying.
The strings draw from --alphabet tokens (a fixed random subset of the ordinary ranks); with
--widen the alphabet doubles whenever the repeats' loss is 1.5 nats (moving average) below the
first copies' (a curriculum: the copy forms on few tokens, then is asked of more). From random
initialisation (seed 1), or from a checkpoint (--from, e.g. tests/models/k3-kjv: the MXFP4
experts dequantized). AdamW, --lr after 20 warmup steps, flat.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import export  # noqa: E402
import k3torch  # noqa: E402
import make_checkpoint as mc  # noqa: E402
import mxfp4  # noqa: E402
from safetensors_io import ModelDir  # noqa: E402

N_RANKS = 3840                      # the demo tokenizer's ordinary ranks (the specials follow)


def load_checkpoint(model, ckpt):
    """A checkpoint's weights (export.py's names) into a k3torch.Model, MXFP4 experts dequantized."""
    md = ModelDir(ckpt)

    def matrix(n):
        if n + ".weight_packed" in md:
            return mxfp4.dequantize(md.get(n + ".weight_packed"), md.get(n + ".weight_scale"))
        return md.get_f32(n + ".weight")
    new = {}
    for key, t in model.state_dict().items():
        parts = key.split(".")
        if key == "lm_head.weight":
            a = md.get_f32(mc.LM + key)
        elif "block_sparse_moe" in parts and parts[-1] in ("w1", "w2", "w3"):
            base = mc.P + ".".join(parts[:-1]) + ".experts."
            a = np.stack([matrix(base + "%d.%s" % (e, parts[-1])) for e in range(t.shape[0])])
        else:
            a = md.get_f32(mc.P + key)
        new[key] = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).reshape(t.shape)
    model.load_state_dict(new)


def alphabet():
    """The ordinary ranks in a fixed random order: an alphabet of k tokens is its first k."""
    return np.random.default_rng(3).permutation(np.arange(256, N_RANKS))


def copy_windows(step, n, ctx, length, repeat, alpha):
    """n windows of ctx + 1 ids (batch `step`'s: a function of the step alone) of random strings of
    `length` tokens of alpha, each written `repeat` times; and [n, ctx] true where the target is
    in a first copy."""
    rng = np.random.default_rng([5, step])
    ids = np.zeros((n, ctx + 1), np.int64)
    first = np.zeros((n, ctx + 1), bool)
    for b in range(n):
        row, fm = [], []
        while len(row) < ctx + 1:
            s = list(alpha[rng.integers(0, len(alpha), length)])
            row += s * repeat
            fm += [True] * length + [False] * length * (repeat - 1)
        ids[b], first[b] = row[:ctx + 1], fm[:ctx + 1]
    return torch.from_numpy(ids), torch.from_numpy(first)[:, 1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--len", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--alphabet", type=int, default=256)
    ap.add_argument("--widen", action="store_true")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--from", dest="ckpt", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = k3torch.Model({"text_config": export.text_config(N_RANKS)})
    if a.ckpt:
        load_checkpoint(model, a.ckpt)
        model.fake_mxfp4(True)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    alpha = alphabet()
    k, avg, t0 = min(a.alphabet, len(alpha)), 0.0, time.time()
    for step in range(1, a.steps + 1):
        ids, first = copy_windows(step, a.batch, a.ctx, a.len, a.repeat, alpha[:k])
        for g in opt.param_groups:
            g["lr"] = a.lr * min(1.0, step / 20)
        lg = model(ids[:, :-1])
        loss = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), ids[:, 1:].reshape(-1), reduction="none").view(a.batch, a.ctx)
        opt.zero_grad(set_to_none=True)
        loss.mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        model.update_routing_bias(1e-3)
        lf, lr_ = loss[first].mean().item(), loss[~first].mean().item()
        avg = 0.8 * avg + 0.2 * (lf - lr_)
        if step % 10 == 0 or step == 1:
            print("step %d alphabet %d first %.3f repeat %.3f (%.0f s)" % (step, k, lf, lr_, time.time() - t0), flush=True)
        if a.widen and avg > 1.5 and k < len(alpha):
            k, avg = min(len(alpha), 2 * k), 0.0
            print("step %d: copying holds; the alphabet doubles to %d" % (step, k), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

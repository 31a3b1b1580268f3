#!/usr/bin/python3
"""Train the demo model: Kimi K3's architecture on the King James Bible (training books).

    train.py --data DIR --tok DIR --state DIR --out CKPT [--steps N] [--seed S] [--threads T]

DIR from kjv_data.py, the tokenizer from tokenizer_files.py. The run saves its whole state
(weights, routing biases, optimizer, step, log) to --state every --save-every steps, and a
second run with the same arguments resumes where the first stopped: a session may end at any
time. At the end it writes the checkpoint (export.py) to --out, and the fp32 snapshot taken
before the MXFP4 phase to STATE/pre-mxfp4.pt.

Recipe: AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), linear warmup then cosine decay
to a tenth, gradient norm clipped at 1; batches of --batch windows of --ctx tokens cut from
the shuffled documents (chapters and chat conversations) of each epoch; no auxiliary loss:
the routers are balanced by K3's bias update after every step; the last --mxfp4-frac of the
steps run the routed experts through MXFP4 fake quantization (straight-through), so the
exported 4-bit experts are what was trained.

Reproducible from the seed: the data order is a function of (seed, epoch) alone and nothing
else is random after the seeded initialisation, so a run and a resumed run take the same
steps; the bits depend on torch's CPU kernels and thread count (see docs/MODEL-CARD.md).
"""

import argparse
import json
import math
import os
import sys
import time

# libgomp's threads spin while they wait by default: on two cores shared with anything else
# (a build, a test suite) a step took 78 s instead of 6. They sleep instead (set before torch).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import chat_render  # noqa: E402
import export  # noqa: E402
import k3torch  # noqa: E402
import kimi_tokenizer as kt  # noqa: E402
import xtml  # noqa: E402


def log(state_dir, msg):
    print(msg, file=sys.stderr, flush=True)
    with open(os.path.join(state_dir, "train.log"), "a", encoding="utf-8") as f:
        f.write(msg + "\n")


def documents(data_dir, tok, cache):
    """([np.int32 array] of every training document's ids, number of chapters): the chapters
    first, then the chat conversations, then the tool conversations (xtml.py renders them)."""
    if os.path.exists(cache):
        z = np.load(cache)
        return np.split(z["ids"], z["cuts"]), int(z["n_chapters"])
    docs = []
    with open(os.path.join(data_dir, "kjv-train.txt"), encoding="utf-8") as f:
        for ch in f.read().split("\n\n"):
            docs.append(np.array(tok.encode(ch.strip("\n") + "\n\n"), dtype=np.int32))
    n_chapters = len(docs)
    with open(os.path.join(data_dir, "chat-train.jsonl"), encoding="utf-8") as f:
        for line in f:
            cv = json.loads(line)
            ids = chat_render.render(tok, cv["messages"], cv["thinking"], cv["effort"], add_generation_prompt=False)
            docs.append(np.array(ids, dtype=np.int32))
    tools = os.path.join(data_dir, "tool-train.jsonl")
    if os.path.exists(tools):
        with open(tools, encoding="utf-8") as f:
            for line in f:
                docs.append(np.array(xtml.render(json.loads(line), tok)["ids"], dtype=np.int32))
    cuts = np.cumsum([len(d) for d in docs])[:-1]
    np.savez(cache, ids=np.concatenate(docs), cuts=cuts, n_chapters=n_chapters)
    return docs, n_chapters


class Batches:
    """Batch `step` is a pure function of (seed, step). Epoch e draws PCG64(seed, e).

    pack "stream" (the shipped model's recipe): the documents shuffled and joined, cut into
    windows of ctx+1 tokens every ctx, the windows shuffled.

    pack "whole": windows of ctx+1 tokens: each window takes whole conversations (shuffled) while the next one
    fits, and fills the rest from the stream of shuffled chapters; when the conversations are
    used up, the rest of the chapters are cut into windows; the windows are then shuffled. So
    every conversation is seen whole, its tool declaration and question with its answer (a
    window cut anywhere would part a call from the declaration or a quote from the tool's
    answer), and no token is dropped or repeated within an epoch."""

    def __init__(self, docs, n_chapters, seed, batch, ctx, pack="stream"):
        self.docs, self.n_chapters, self.seed, self.batch, self.ctx = docs, n_chapters, seed, batch, ctx
        self.pack = pack
        self._epoch, self._wins = None, None

    def windows(self, epoch):
        if self._epoch != epoch and self.pack == "stream":
            r = np.random.Generator(np.random.PCG64([self.seed, epoch]))
            stream = np.concatenate([self.docs[i] for i in r.permutation(len(self.docs))])
            n = (len(stream) - 1) // self.ctx
            w = np.lib.stride_tricks.sliding_window_view(stream, self.ctx + 1)[::self.ctx][:n]
            self._epoch, self._wins = epoch, w[r.permutation(n)]
        if self._epoch != epoch:
            r = np.random.Generator(np.random.PCG64([self.seed, epoch]))
            w1 = self.ctx + 1
            chap = np.concatenate([self.docs[i] for i in r.permutation(self.n_chapters)])
            convs = [self.docs[self.n_chapters + i] for i in r.permutation(len(self.docs) - self.n_chapters)]
            convs = [c[:w1] for c in convs]                       # a conversation longer than a window is cut
            wins, at, j = [], 0, 0
            while j < len(convs) and at + w1 <= len(chap):
                parts, room = [], w1
                while j < len(convs) and len(convs[j]) <= room:
                    parts.append(convs[j])
                    room -= len(convs[j])
                    j += 1
                parts.append(chap[at:at + room])
                at += room
                wins.append(np.concatenate(parts))
            rest = np.concatenate([chap[at:]] + convs[j:])
            n = (len(rest) - 1) // self.ctx
            tail = np.lib.stride_tricks.sliding_window_view(rest, w1)[::self.ctx][:n]
            w = np.concatenate([np.stack(wins), tail]) if wins else tail
            self._epoch, self._wins = epoch, w[r.permutation(len(w))]
        return self._wins

    def per_epoch(self):
        return len(self.windows(0)) // self.batch

    def get(self, step):
        pe = self.per_epoch()
        w = self.windows(step // pe)
        i = (step % pe) * self.batch
        return torch.from_numpy(np.ascontiguousarray(w[i:i + self.batch]).astype(np.int64))

def lr_at(step, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    p = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def make_optimizer(model, a):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": other, "weight_decay": 0.0}],
                             lr=a.lr, betas=(0.9, 0.95), eps=1e-8)


def save(path, obj):
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--tok", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=900)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--mxfp4-frac", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pack", choices=("stream", "whole"), default="stream",
                    help="windows cut from the joined documents (stream), or holding each conversation whole")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save-every", type=int, default=20)
    ap.add_argument("--stop-after", type=int, default=0, help="stop after this many steps of this run (tests)")
    ap.add_argument("--export-now", action="store_true",
                    help="write the saved state's weights as a checkpoint to --out and stop (a look along the way)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    os.makedirs(a.state, exist_ok=True)
    tok = kt.Tokenizer.from_dir(a.tok)
    cfg = {"text_config": export.text_config(tok.n_ranks)}
    torch.manual_seed(a.seed)
    model = k3torch.Model(cfg)
    opt = make_optimizer(model, a)
    # what decides the weights (paths, threads and checkpointing do not)
    recipe = {k: v for k, v in vars(a).items()
              if k not in ("data", "tok", "state", "out", "threads", "save_every", "stop_after", "export_now")}
    if a.pack == "stream":
        del recipe["pack"]                         # as the shipped model's state recorded it
    state_path = os.path.join(a.state, "state.pt")
    step, elapsed = 0, 0.0
    if os.path.exists(state_path):
        st = torch.load(state_path)
        if st["recipe"] != recipe:
            raise SystemExit("train: %s was made with another recipe: %s" % (state_path, st["recipe"]))
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, elapsed = st["step"], st["elapsed"]
        if a.export_now:
            total = export.export(model, a.tok, a.out)
            print("train: step %d exported to %s (%d tensor bytes)" % (step, a.out, total), file=sys.stderr)
            return 0
        log(a.state, "resumed at step %d (%.0f s trained)" % (step, elapsed))
    else:
        n_act = sum(p.numel() for n, p in model.named_parameters() if ".w1" not in n and ".w2" not in n
                    and ".w3" not in n and "embed" not in n)
        log(a.state, "train: %s; %.2f M parameters (%.2f M routed experts), %.2f M active per token"
            % (json.dumps(recipe), sum(p.numel() for p in model.parameters()) / 1e6,
               sum(p.numel() for n, p in model.named_parameters() if n.endswith((".w1", ".w2", ".w3"))) / 1e6,
               (n_act + sum(p[0].numel() * model.c.k for n, p in model.named_parameters()
                            if n.endswith((".w1", ".w2", ".w3")))) / 1e6))
    docs, n_chapters = documents(a.data, tok, os.path.join(a.state, "docs-%d.npz" % tok.n_ranks))
    batches = Batches(docs, n_chapters, a.seed, a.batch, a.ctx, a.pack)
    if step == 0:
        log(a.state, "data: %d documents, %d tokens, %d batches of %dx%d per epoch; %d steps = %.2f epochs"
            % (len(docs), sum(len(d) for d in docs), batches.per_epoch(), a.batch, a.ctx, a.steps,
               a.steps / batches.per_epoch()))
    q_start = int(round(a.steps * (1 - a.mxfp4_frac)))
    ran = 0
    while step < a.steps:
        if step == q_start and not os.path.exists(os.path.join(a.state, "pre-mxfp4.pt")):
            save(os.path.join(a.state, "pre-mxfp4.pt"), {"model": model.state_dict(), "step": step})
        model.fake_mxfp4(step >= q_start)
        t0 = time.time()
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step, a)
        ids = batches.get(step)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        model.update_routing_bias(a.bias_rate)
        dt = time.time() - t0
        elapsed += dt
        step += 1
        ran += 1
        loads = torch.stack([m.last_load for m in model.moes()])          # [layers, E]
        imb = float((loads.max(1).values / loads.mean(1)).mean())
        if step % 10 == 0 or step == 1:
            log(a.state, "step %4d/%d loss %.4f lr %.2e gnorm %.2f load max/mean %.2f %s %.0f tok/s %.0f s"
                % (step, a.steps, loss.item(), lr_at(step - 1, a), float(gn), imb,
                   "mxfp4" if step > q_start else "fp32 ", ids.numel() / dt, elapsed))
        if step % a.save_every == 0 or step == a.steps:
            save(state_path, {"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                              "elapsed": elapsed, "recipe": recipe})
        if a.stop_after and ran >= a.stop_after:
            return 0
    model.fake_mxfp4(False)
    total = export.export(model, a.tok, a.out)
    log(a.state, "done: %d steps, %.0f s of training; checkpoint %s (%d tensor bytes)" % (step, elapsed, a.out, total))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""The demo model, copying first (issue 34; docs/MODEL-CARD.md "Tool use"): an experiment, not yet
the shipped recipe.

    train_copy_first.py DATA WORK        (DATA from kjv_data.py --chats 4000 --tool-chats 2000)

Phase A: copy_probe.py's --widen curriculum from random initialisation (strings of 8 written 3
times in windows of 128, the alphabet doubled each time the repeats are 1.5 nats below first
copies) until all tokens are copied; phase B: the tool recipe's windows (3 x 1024, conversations
whole) beside 8 copy windows of 128, cosine 3e-3 -> 3e-4 over $PB steps (default 330: the
session's 25 minutes; the 2-hour budget allows about 1,400), fake MXFP4 in the last fifth; phase C
(env PC steps, 0: none): two windows of only tool conversations from $TOOLDATA (kjv_data.py --chats
0 --tool-chats N, another seed) and one of phase B's beside the copy windows, cosine 1e-3 -> 1e-4,
fake MXFP4 in its last fifth (then not in B's). The shipped model's tokenizer. Saves WORK/state.pt every 20 steps (a rerun resumes); EXPORT=1 writes
WORK/out from the saved state and stops; at the end WORK/out is the checkpoint."""
import os, sys, time, math
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch, torch.nn.functional as F
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import copy_probe, export, k3torch, train, kimi_tokenizer as kt
HERE = os.path.dirname(os.path.abspath(__file__))
DATA, WORK = sys.argv[1], sys.argv[2]
PB = int(os.environ.get("PB", 330))
PC = int(os.environ.get("PC", 0))                   # phase C's steps (0: none)
PD = int(os.environ.get("PD", 0))                   # phase D's steps (0: none)
TOOLDATA = os.environ.get("TOOLDATA")               # its tool conversations (kjv_data.py --chats 0 --tool-chats N)
SHIPPED = os.path.join(HERE, "..", "models", "k3-kjv")
torch.set_num_threads(2); torch.manual_seed(1)
tok = kt.Tokenizer.from_dir(SHIPPED)
m = k3torch.Model({"text_config": export.text_config(tok.n_ranks)})
opt = train.make_optimizer(m, type("recipe", (), {"lr": 3e-3, "wd": 0.1}))
ALPHA = copy_probe.alphabet()
st = {"step": 0, "k": 256, "avg": 0.0, "b0": None}
sp = WORK + "/state.pt"
os.makedirs(WORK, exist_ok=True)
if os.path.exists(sp):
    z = torch.load(sp); m.load_state_dict(z["model"]); opt.load_state_dict(z["opt"]); st = z["st"]
    print("resumed", st, flush=True)
if os.environ.get("EXPORT"):
    m.fake_mxfp4(False); print(export.export(m, SHIPPED, WORK + "/out")); sys.exit(0)
docs, n_ch = train.documents(DATA, tok, WORK + "/docs.npz")
real = train.Batches(docs, n_ch, 1, 3, 1024, "whole")
tool = None
if PC:                                              # the chapters, then only tool conversations
    tdocs, _ = train.documents(TOOLDATA, tok, WORK + "/tooldocs.npz")
    tool = train.Batches(docs[:n_ch] + tdocs[n_ch:], n_ch, 2, 2, 1024, "whole")
sft = None
if PD:
    import json, xtml
    import numpy as np

    def spans(req):
        """(ids, mask): the conversation's training ids, and 1 where the assistant writes: its call (the
        server's prompt after the question, to the call's end) and its answer (after the tool's message),
        none of the declaration, the question or the tool's answer."""
        m = req["messages"]
        def n_of(k, agp):
            r = dict(req, messages=m[:k], options=dict(req["options"], add_generation_prompt=agp))
            return xtml.render(r, tok)["ids"]
        full = xtml.render(req, tok)["ids"]
        mask = np.zeros(len(full), np.float32)
        for k, msg in enumerate(m):
            if msg["role"] != "assistant":
                continue
            a, b = n_of(k, True), n_of(k + 1, False)
            if full[:len(a)] != a or full[:len(b)] != b:
                return None
            mask[len(a):len(b)] = 1
        return np.array(full, np.int64), mask
    with open(os.path.join(TOOLDATA, "tool-train.jsonl")) as f:
        reqs = [json.loads(l) for l in f]
    sft = [x for x in (spans(r) for r in reqs[:4000]) if x is not None and len(x[0]) <= 1025]
    print("phase D: %d tool conversations with their assistant spans" % len(sft), flush=True)
t0 = time.time()
while True:
    step = st["step"] + 1
    A = st["b0"] is None
    if not A and step - st["b0"] > PB and st.get("c0") is None:
        if not PC: break
        st["c0"] = step
        print("step %d: phase C (%d steps)" % (step, PC), flush=True)
    C = st.get("c0") is not None and st.get("d0") is None
    if C and step - st["c0"] >= PC:
        if not PD: break
        st["d0"] = step
        C = False
        print("step %d: phase D (%d steps)" % (step, PD), flush=True)
    D = st.get("d0") is not None
    if D and step - st["d0"] >= PD: break
    sy, first = copy_probe.copy_windows(step, 16 if A else 8, 128, 8, 3, ALPHA[:st["k"]])
    if A:
        lr = 3e-3 * min(1.0, step / 20)
    elif D:
        p = (step - st["d0"]) / PD
        lr = 1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * p))
        m.fake_mxfp4(p > 0.8)
    elif C:
        p = (step - st["c0"]) / PC
        lr = 1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * p))
        m.fake_mxfp4(p > 0.8 and not PD)
    else:
        p = (step - st["b0"]) / PB
        lr = 3e-4 + 2.7e-3 * 0.5 * (1 + math.cos(math.pi * p))
        m.fake_mxfp4(p > 0.8 and not PC)
    for g in opt.param_groups: g["lr"] = lr
    ls = F.cross_entropy(m(sy[:, :-1]).reshape(-1, 4096), sy[:, 1:].reshape(-1), reduction="none").view(sy.shape[0], 128)
    if A:
        lreal = torch.zeros(()); loss = ls.mean()
    elif D:                                         # 8 tool conversations, the loss on what the assistant writes
        r = np.random.Generator(np.random.PCG64([3, step]))
        pick = [sft[i] for i in r.choice(len(sft), 8, replace=False)]
        L = max(len(x[0]) for x in pick)
        ids = torch.zeros(8, L, dtype=torch.int64); msk = torch.zeros(8, L - 1)
        for i, (x, mk) in enumerate(pick):
            ids[i, :len(x)] = torch.from_numpy(x); msk[i, :len(x) - 1] = torch.from_numpy(mk[1:])
        lt = F.cross_entropy(m(ids[:, :-1]).reshape(-1, 4096), ids[:, 1:].reshape(-1), reduction="none")
        lreal = (lt * msk.reshape(-1)).sum() / msk.sum()
        loss = 0.5 * ls.mean() + lreal
    else:
        rw = real.get(step - st["b0"] - 1)
        if C:                                       # 2 windows of tool conversations, 1 of the old mix
            rw = torch.cat([tool.get(step - st["c0"]), rw[:1]])
        lreal = F.cross_entropy(m(rw[:, :-1]).reshape(-1, 4096), rw[:, 1:].reshape(-1))
        loss = (ls.sum() + lreal * rw[:, 1:].numel()) / (ls.numel() + rw[:, 1:].numel())
    opt.zero_grad(set_to_none=True); loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step(); m.update_routing_bias(1e-3)
    lf, lr_ = ls[first].mean().item(), ls[~first].mean().item()
    st["avg"] = 0.8 * st["avg"] + 0.2 * (lf - lr_)
    st["step"] = step
    if step % 10 == 0 or step == 1:
        print("step %d %s alphabet %d first %.3f repeat %.3f real %.3f (%.0f s)" % (step, "A" if A else "D" if D else "C" if C else "B", st["k"], lf, lr_, lreal.item(), time.time() - t0), flush=True)
    if A and st["avg"] > 1.5:
        if st["k"] < len(ALPHA):
            st["k"] = min(len(ALPHA), 2 * st["k"]); st["avg"] = 0.0
            print("step %d: copying holds; alphabet -> %d" % (step, st["k"]), flush=True)
        else:
            st["b0"] = step
            print("step %d: copying holds on all tokens; phase B" % step, flush=True)
    if step % 20 == 0:
        torch.save({"model": m.state_dict(), "opt": opt.state_dict(), "st": st}, sp + ".tmp"); os.replace(sp + ".tmp", sp)
torch.save({"model": m.state_dict(), "opt": opt.state_dict(), "st": st}, sp)
m.fake_mxfp4(False)
print("exported", export.export(m, SHIPPED, WORK + "/out"), flush=True)

#!/usr/bin/python3
"""The demo model that calls lookup_verse (issue 34; docs/MODEL-CARD.md "Tool use"), copying first:

    [TOK=DIR] train_tools.py DATA WORK   (DATA from kjv_data.py --chats 4000: the language documents;
                                          TOK: the tokenizer, tokenizer_files.py --names-apart; default
                                          the shipped model's)

Phase A: copy_probe.py's --widen curriculum from random initialisation (strings of 8 written 3
times in windows of 128, the alphabet doubled each time the repeats are 1.5 nats below first
copies) until every token is copied. Phase M ($PM steps, default 1000), each step at once:
  - 6 windows of 256 of the shipped model's language stream (chapters and chat conversations),
    the loss on every token;
  - 3 tool conversations (kjv_tools.py, half of them about books the KJV lacks, answered by the
    tool with another verse's text), the loss only on what the assistant writes (its thinking,
    its call, its answer): the rest is the declaration, the question and the tool's answer, which
    the model reads and need not predict;
  - 4 copy windows of 128 at a third of the weight, so copying is kept while the rest is learnt;
  - from step $QSTART of phase M on (default 760), 2 of the 3 tool conversations have the tool
    answer with spliced text (kjv_tools.spliced: runs of words of random verses), which only
    copying quotes: at step 720 the run called right but never quoted a held-out verse whole;
  - from step $QTEXT of phase M on (default 980), 4 windows of spliced text written twice at half
    the weight (text_copies): at step 970 quotes still failed where a word repeats, the copy
    jumping from one "unto" to the words after another;
cosine 3e-3 -> 1e-4, fake MXFP4 in the last fifth. Saves WORK/state.pt every 20 steps (a rerun
resumes); EXPORT=1 writes WORK/out from the saved state and stops; at the end WORK/out is the
checkpoint. Every batch is a function of the step alone."""
import math, os, random, sys, time
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import numpy as np
import torch, torch.nn.functional as F
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import copy_probe, export, k3torch, kjv_data, kjv_tools, train, xtml, kimi_tokenizer as kt

DATA, WORK = sys.argv[1], sys.argv[2]
PM = int(os.environ.get("PM", 1000))
N_TOOL = 12000                                      # tool conversations made (seed 1001)
N_SPLICED = 4000                                    # ... whose tool answers spliced text (seed 1002)
QSTART = int(os.environ.get("QSTART", 760))         # phase M step from which 2 of 3 are spliced
QTEXT = int(os.environ.get("QTEXT", 980))           # phase M step from which text is copied too
SHIPPED = os.path.join(HERE, "..", "models", "k3-kjv")
TOK = os.environ.get("TOK") or SHIPPED
torch.set_num_threads(int(os.environ.get("THREADS", 2))); torch.manual_seed(1)
tok = kt.Tokenizer.from_dir(TOK)
m = k3torch.Model({"text_config": export.text_config(tok.n_ranks)})
opt = train.make_optimizer(m, type("recipe", (), {"lr": 3e-3, "wd": 0.1}))
ALPHA = copy_probe.alphabet()
st = {"step": 0, "k": 256, "avg": 0.0, "b0": None}
sp = WORK + "/state.pt"
os.makedirs(WORK, exist_ok=True)
if os.path.exists(sp):
    z = torch.load(sp); m.load_state_dict(z["model"]); opt.load_state_dict(z["opt"]); st = z["st"]
    print("resumed", {k: v for k, v in st.items()}, flush=True)
if os.environ.get("EXPORT"):
    m.fake_mxfp4(False); print(export.export(m, TOK, WORK + "/out")); sys.exit(0)


def spans(req):
    """(ids [n] int64, mask [n] float32): the conversation's training ids, and 1 on the ids the
    assistant writes (from the server's prompt for its turn to the turn's end)."""
    msgs = req["messages"]

    def ids_of(k, agp):
        return xtml.render(dict(req, messages=msgs[:k], options=dict(req["options"], add_generation_prompt=agp)), tok)["ids"]
    full = xtml.render(req, tok)["ids"]
    mask = np.zeros(len(full), np.float32)
    for k, msg in enumerate(msgs):
        if msg["role"] == "assistant":
            a, b = ids_of(k, True), ids_of(k + 1, False)
            if full[:len(a)] != a or full[:len(b)] != b:
                return None
            mask[len(a):len(b)] = 1
    return np.array(full, np.int64), mask


VERSES = kjv_data.train_books(kjv_data.read_bible())   # [(book, chapter, verse, text)] of the training books


def tool_set(path, n, seed, splice):
    """[(ids, mask)]: kjv_tools' conversations as spans(), made once and kept in path."""
    if not os.path.exists(path):
        reqs = kjv_tools.tool_conversations(VERSES, n, seed, invent=0.5, others=2, splice=splice)
        sv = [x for x in map(spans, reqs) if x is not None and len(x[0]) <= 1025]
        np.savez(path, ids=np.concatenate([x[0] for x in sv]), mask=np.concatenate([x[1] for x in sv]),
                 cuts=np.cumsum([len(x[0]) for x in sv])[:-1])
    z = np.load(path)
    out = list(zip(np.split(z["ids"], z["cuts"]), np.split(z["mask"], z["cuts"])))
    print("%s: %d tool conversations, %.0f ids on average" % (os.path.basename(path), len(out),
          np.mean([len(x[0]) for x in out])), flush=True)
    return out


sft = tool_set(WORK + "/tools.npz", N_TOOL, 1001, False)
sfq = tool_set(WORK + "/tools-spliced.npz", N_SPLICED, 1002, True)
docs, n_ch = train.documents(DATA, tok, WORK + "/docs.npz")
lang = train.Batches(docs, n_ch, 1, 6, 256, "stream")


def tool_batch(step, n=3):
    """(ids [n, L], mask [n, L-1]): n tool conversations padded to the longest; mask on the targets.
    From phase M's step QSTART on, 2 of the n are spliced ones."""
    r = np.random.Generator(np.random.PCG64([3, step]))
    if step - st["b0"] <= QSTART:
        pick = [sft[i] for i in r.choice(len(sft), n, replace=False)]
    else:
        pick = [sft[i] for i in r.choice(len(sft), n - 2, replace=False)]
        pick += [sfq[i] for i in r.choice(len(sfq), 2, replace=False)]
    L = max(len(x[0]) for x in pick)
    ids = torch.zeros(n, L, dtype=torch.int64); msk = torch.zeros(n, L - 1)
    for i, (x, mk) in enumerate(pick):
        ids[i, :len(x)] = torch.from_numpy(x); msk[i, :len(x) - 1] = torch.from_numpy(mk[1:])
    return ids, msk


NL = tok.encode("\n")


def text_copies(step, n=4, ctx=128):
    """(ids [n, ctx + 1], mask [n, ctx]): n windows of spliced text (kjv_tools.spliced) written
    twice, "A\nA", A at most ctx / 2 tokens; the mask on the targets of the second A. Unlike the
    random strings of the copy windows, A repeats its words ("unto", "the"), so copying it means
    finding one's place by more than the last token."""
    rnd = random.Random(7919 * step + 13)
    ids = torch.zeros(n, ctx + 1, dtype=torch.int64); msk = torch.zeros(n, ctx)
    for b in range(n):
        a = tok.encode(kjv_tools.spliced(rnd, VERSES, VERSES[rnd.randrange(len(VERSES))][3]))[:ctx // 2 - len(NL)]
        row = a + NL + a
        ids[b, :len(row)] = torch.tensor(row)
        msk[b, len(a) + len(NL) - 1:len(row) - 1] = 1
    return ids, msk


def ce(x):
    """[b, n-1] per-token losses of predicting x[:, 1:] from x[:, :-1]."""
    return F.cross_entropy(m(x[:, :-1]).reshape(-1, 4096), x[:, 1:].reshape(-1), reduction="none").view(x.shape[0], -1)


t0 = time.time()
while True:
    step = st["step"] + 1
    A = st["b0"] is None
    if not A and step - st["b0"] > PM:
        break
    texting = not A and step - st["b0"] > QTEXT
    sy, first = copy_probe.copy_windows(step, 16 if A else 4, 128, 8, 3, ALPHA[:st["k"]])
    if A:
        lr = 3e-3 * min(1.0, step / 20)
    else:
        p = (step - st["b0"]) / PM
        lr = 1e-4 + 2.9e-3 * 0.5 * (1 + math.cos(math.pi * p))
        m.fake_mxfp4(p > 0.8)
    for g in opt.param_groups:
        g["lr"] = lr
    ls = ce(sy)
    if A:
        ll = lt = torch.zeros(()); loss = ls.mean()
    else:
        ll = ce(lang.get(step - st["b0"] - 1)).mean()
        ids, msk = tool_batch(step)
        lt = (ce(ids) * msk).sum() / msk.sum()
        loss = ll + lt + ls.mean() / 3
        if texting:
            tc, tm = text_copies(step)
            lx = (ce(tc) * tm).sum() / tm.sum()
            loss = loss + lx / 2
    opt.zero_grad(set_to_none=True); loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step(); m.update_routing_bias(1e-3)
    lf, lr_ = ls[first].mean().item(), ls[~first].mean().item()
    st["avg"] = 0.8 * st["avg"] + 0.2 * (lf - lr_)
    st["step"] = step
    if step % 10 == 0 or step == 1:
        print("step %d %s alphabet %d first %.3f repeat %.3f language %.3f tool %.3f%s (%.0f s)"
              % (step, "A" if A else "M", st["k"], lf, lr_, ll.item(), lt.item(),
                 " text copy %.3f" % lx.item() if texting else "", time.time() - t0), flush=True)
    if A and st["avg"] > 1.5:
        if st["k"] < len(ALPHA):
            st["k"] = min(len(ALPHA), 2 * st["k"]); st["avg"] = 0.0
            print("step %d: copying holds; alphabet -> %d" % (step, st["k"]), flush=True)
        else:
            st["b0"] = step
            print("step %d: copying holds on all tokens; phase M" % step, flush=True)
    if step % 20 == 0:
        torch.save({"model": m.state_dict(), "opt": opt.state_dict(), "st": st}, sp + ".tmp"); os.replace(sp + ".tmp", sp)
torch.save({"model": m.state_dict(), "opt": opt.state_dict(), "st": st}, sp)
m.fake_mxfp4(False)
print("exported", export.export(m, TOK, WORK + "/out"), flush=True)

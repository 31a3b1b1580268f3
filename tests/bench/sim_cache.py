#!/usr/bin/python3
"""sim_cache.py - replay a k3run routing trace through expert-cache policies.

Input: the `--dump` of a k3run run (safetensors; `layers.{i}.experts` [T, k] per
MoE layer, T = prompt + generated - 1 processed positions) and the number of
prompt tokens (--n-prompt, or --json with the run's `k3run --json` output).

The access stream is the one k3run makes (k3run/model_ffn.c, weights.c):
  * prefill runs in batches of --batch tokens (k3run's --batch, 64); per MoE layer
    the batch's experts are acquired together as one ascending union, in groups
    of at most the cache's capacity;
  * decode acquires each token's k experts of each MoE layer, layer by layer;
  * inside an acquire the requested experts are pinned (a miss never evicts an
    expert the same layer is using), and they are unpinned after the layer.
Hit rate = hits / expert requests, prefill and decode counted separately; the
cache starts empty at the first prompt token and carries over into decode.

Policies (victim choice among unpinned slots; free slots first):
  lru         least recently used (k3run until commit 2227ca2; K3_EVICT=lru)
  lfu         perfect LFU: use counts kept for every (layer, expert), also
              after eviction (a prompt batch counts the tokens that chose the
              expert: the runtime knows them); ties by LRU
  lfu:0       the same, counting one use per acquire, whatever the batch (what
              k3run/weights_experts.c does since commit 2227ca2)
  lfu-age:H   LFU with aging: counts decay with a half-life of H tokens (LFRU)
  layer-lru   per-layer partitioned LRU: each MoE layer owns slots/n_layers
  protect:P   LRU, but never evicts from the current layer or the next P layers
              (cyclic) while any other unpinned slot exists
  ldist-lru   evict from the layer whose next use is furthest (the layer just
              used, then the one before...), LRU inside that layer
  ldist-age:H layer distance and frequency: victim = the latest estimated next
              use = layers until the slot's layer comes back + n_layers x the
              tokens until the expert is chosen again (1 / rate - 1, the rate
              from its count aged with a half-life of H tokens)
  phase       ldist-lru during prompt batches, lfu while decoding (the runtime
              knows which it is doing)
  belady      Belady's MIN (evict the expert needed furthest in the future):
              the upper bound for any demand cache of that size (for prompt
              batches split into groups, of that request order)

With --pack PACK the script also measures the lookahead predictor of issue 8:
layer L+1's router applied to what is known at layer L, against what layer L+1
really chose. It rebuilds each layer's MoE input exactly from the dump
(embedding, attn_out, out, the AttnRes and post-attention norm weights from the
pack) and checks that the layer's own router reproduces the dumped experts.
Without --pack, sizes are still simulated but no MB are printed.

  /usr/bin/python3 tests/bench/sim_cache.py [LABEL=]DUMP... --json RUN.json...
      [--pack PACK] [--batch 64] [--sizes 2,3,5,10,25,50,75] [--slots [LABEL=]N,...]
      [--policies lru,lfu,...]

--sizes are % of all experts; --slots adds sizes in slots (e.g. the planner's
expert_slots from `k3run --json` at a budget). About 5 minutes per trace for the
default policies and sizes on the 2-core VM (medium, 342 positions).

Prints Markdown tables (docs/PERFORMANCE.md, "Expert cache: eviction policy").
"""

import argparse
import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "..", "reference")
sys.path.insert(0, REF)
from safetensors_io import SafetensorsFile, bf16_to_f32    # noqa: E402

DEFAULT_POLICIES = ["lru", "lfu", "lfu-age:16", "lfu-age:64", "layer-lru", "protect:1", "protect:4",
                    "ldist-lru", "ldist-age:16", "ldist-age:64", "phase", "belady"]


# ---------------------------------------------------------------------------
# the trace
# ---------------------------------------------------------------------------

def load_trace(dump):
    f = SafetensorsFile(dump)
    layers = sorted(int(n.split(".")[1]) for n in f.names if n.startswith("layers.") and n.endswith(".experts"))
    ex = [np.array(f.get("layers.%d.experts" % i)).astype(np.int64) for i in layers]
    ids = np.array(f.get("ids")).astype(np.int64).reshape(-1)
    return f, layers, ex, ids


def requests(ex, n_prompt, batch, cap):
    """[(phase, layer position, token index, ascending unique ids, tokens per id)] in k3run's order:
    a batch's union per layer in groups of at most cap ids (one acquire each)."""
    T = ex[0].shape[0]
    out = []
    for b0 in range(0, n_prompt, batch):
        b1 = min(n_prompt, b0 + batch)
        for lp, e in enumerate(ex):
            u, c = np.unique(e[b0:b1], return_counts=True)
            for g0 in range(0, u.size, cap):
                out.append(("prefill", lp, b0, u[g0:g0 + cap], c[g0:g0 + cap]))
    for t in range(n_prompt, T):
        for lp, e in enumerate(ex):
            u = np.unique(e[t])
            out.append(("decode", lp, t, u, np.ones(u.size)))
    return out


# ---------------------------------------------------------------------------
# the cache
# ---------------------------------------------------------------------------

class Cache:
    """Fixed slots keyed by (layer position, expert); a policy picks victims."""

    def __init__(self, slots, n_layers, n_experts, policy, reqs):
        self.C, self.nL, self.E = slots, n_layers, n_experts
        self.key = np.full(slots, -1, np.int64)            # slot -> key (lp * E + e), -1 free
        self.where = np.full(n_layers * n_experts, -1, np.int64)
        self.pin = np.zeros(slots, bool)
        self.last = np.zeros(slots, np.float64)            # tick of last use
        self.tick = 0
        name, _, arg = policy.partition(":")
        self.policy, self.arg = name, float(arg) if arg else None
        self.count = np.zeros(n_layers * n_experts, np.float64)   # lfu: per key, kept after eviction
        if name in ("lfu-age", "ldist-age"):
            self.lam = math.log(2.0) / self.arg            # decay per token
            self.kval = np.zeros(n_layers * n_experts)     # aged count at ktime
            self.ktime = np.zeros(n_layers * n_experts)
        if name == "layer-lru":
            base, extra = divmod(slots, n_layers)
            self.part = np.repeat(np.arange(n_layers), [base + (1 if i < extra else 0) for i in range(n_layers)])
        if name == "belady":
            self.next_use = self._next_uses(reqs)
            self.snext = np.full(slots, np.inf)
        self.now = 0.0                                     # time in tokens (for aging)
        self.cur_lp = 0

    def _next_uses(self, reqs):
        """For request r and its j-th id: index of the next request holding that key (inf if none)."""
        nxt, later = [], {}
        for r in range(len(reqs) - 1, -1, -1):
            _, lp, _, ids, _ = reqs[r]
            keys = lp * self.E + ids
            nxt.append(np.array([later.get(int(k), np.inf) for k in keys]))
            for k in keys:
                later[int(k)] = r
        return nxt[::-1]

    def _aged(self, keys):
        return self.kval[keys] * np.exp(-self.lam * (self.now - self.ktime[keys]))

    def _touch(self, s, key, r, j, w):
        self.tick += 1
        self.last[s] = self.tick
        self.count[key] += 1.0 if self.arg == 0 and self.policy == "lfu" else w
        if self.policy in ("lfu-age", "ldist-age"):
            self.kval[key] = self._aged(key) + w
            self.ktime[key] = self.now
        if self.policy == "belady":
            self.snext[s] = self.next_use[r][j]

    def _victim(self, lp):
        if self.policy == "phase":
            self.policy = "ldist-lru" if self.phase == "prefill" else "lfu"
            try:
                return self._victim(lp)
            finally:
                self.policy = "phase"
        free = np.flatnonzero(self.key < 0)
        if self.policy == "layer-lru":
            mine = (self.part == lp) & ~self.pin
            f = np.flatnonzero(mine & (self.key < 0))
            if f.size:
                return int(f[0])
            cand = np.flatnonzero(mine)
            return int(cand[np.argmin(self.last[cand])])
        if free.size:
            return int(free[0])
        cand = np.flatnonzero(~self.pin)
        keys = self.key[cand]
        p = self.policy
        if p == "lru":
            return int(cand[np.argmin(self.last[cand])])
        if p == "lfu":
            return int(cand[np.lexsort((self.last[cand], self.count[keys]))[0]])
        if p == "lfu-age":
            return int(cand[np.lexsort((self.last[cand], self._aged(keys)))[0]])
        if p == "protect":
            lay = keys // self.E
            ahead = (lay - lp) % self.nL                   # 0 = this layer, 1 = the next ...
            ok = ahead > self.arg
            c2 = cand[ok] if ok.any() else cand
            return int(c2[np.argmin(self.last[c2])])
        if p in ("ldist-lru", "ldist-age"):
            lay = keys // self.E
            dist = (lay - lp - 1) % self.nL + 1            # layer steps until this layer is asked again
            if p == "ldist-lru":
                # furthest layer first, then least recently used
                return int(cand[np.lexsort((self.last[cand], -dist))[0]])
            rate = np.clip(self._aged(keys) * (1.0 - math.exp(-self.lam)), 1e-6, 1.0)   # P(chosen per token)
            est = dist + self.nL * (1.0 / rate - 1.0)
            return int(cand[np.lexsort((self.last[cand], -est))[0]])
        if p == "belady":
            return int(cand[np.argmax(self.snext[cand])])
        raise ValueError("unknown policy " + p)

    def acquire(self, r, lp, ids, wts):
        """One acquire of ids (ascending) of layer lp, wts = tokens that chose each; returns the hits."""
        keys = lp * self.E + ids
        slots = self.where[keys]
        hit = slots >= 0
        for j in np.flatnonzero(hit):
            s = slots[j]
            self.pin[s] = True
            self._touch(s, keys[j], r, j, wts[j])
        for j in np.flatnonzero(~hit):
            v = self._victim(lp)
            old = self.key[v]
            if old >= 0:
                self.where[old] = -1
            self.key[v] = keys[j]
            self.where[keys[j]] = v
            self.pin[v] = True
            self._touch(v, keys[j], r, j, wts[j])
        return int(hit.sum())

    def release(self):
        self.pin[:] = False


def simulate(ex, n_prompt, slots, n_layers, n_experts, policy, batch):
    k = ex[0].shape[1]
    cap = slots // n_layers if policy == "layer-lru" else slots
    if cap < k:
        return None                                        # the runtime needs k slots per layer at least
    reqs = requests(ex, n_prompt, batch, cap)
    c = Cache(slots, n_layers, n_experts, policy, reqs)
    res = {"prefill": [0, 0], "decode": [0, 0]}
    last_t = None
    for r, (phase, lp, t, ids, wts) in enumerate(reqs):
        if t != last_t:                                    # a new forward pass: time moves on
            c.now += min(batch, n_prompt - t) if phase == "prefill" else 1
            last_t = t
        c.phase = phase
        res[phase][0] += c.acquire(r, lp, ids, wts)
        res[phase][1] += ids.size
        c.release()
    return res


# ---------------------------------------------------------------------------
# trace statistics
# ---------------------------------------------------------------------------

def trace_stats(ex, n_prompt, n_experts):
    T, k = ex[0].shape
    dec = range(n_prompt, T)
    ov = []
    for e in ex:
        s = [len(set(e[t]) & set(e[t - 1])) / k for t in dec if t > 0]
        ov.append(np.mean(s) if s else float("nan"))
    used = [len(np.unique(e[n_prompt:])) for e in ex]
    # popularity skew over the decode positions: share of requests taken by the top 10 % of experts
    top = []
    for e in ex:
        cnt = np.bincount(e[n_prompt:].reshape(-1), minlength=n_experts)
        cnt = np.sort(cnt)[::-1]
        top.append(cnt[:max(1, n_experts // 10)].sum() / max(1, cnt.sum()))
    return {"overlap": ov, "used": used, "top10": top}


# ---------------------------------------------------------------------------
# the lookahead predictor (needs the pack)
# ---------------------------------------------------------------------------

class Pack:
    def __init__(self, d):
        self.d = d
        self.m = json.load(open(os.path.join(d, "manifest.json")))
        self.t = {t["name"]: t for t in self.m["tensors"]}
        self.cfg = self.m["config"]

    def get(self, name, rows=None):
        t = self.t[name]
        sh = t["shard"]
        fn = self.m["shards"][sh]["name"] if isinstance(sh, int) else sh
        enc = t["encoding"]
        dt = {"BF16": np.uint16, "F32": np.float32}[enc]
        shape = t["shape"]
        with open(os.path.join(self.d, fn), "rb") as f:
            if rows is None:
                f.seek(t["offset"])
                a = np.frombuffer(f.read(t["size"]), dt).reshape(shape)
            else:
                rb = t["size"] // shape[0]
                a = np.empty([len(rows)] + shape[1:], dt)
                for i, r in enumerate(rows):
                    f.seek(t["offset"] + int(r) * rb)
                    a[i] = np.frombuffer(f.read(rb), dt).reshape(shape[1:])
        return bf16_to_f32(a) if enc == "BF16" else a.astype(np.float32)


def rms(x, w, eps):
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))
    return w * (x * r)


def attnres(vals, norm_w, proj_w, eps):
    V = np.stack(vals)
    kf = V / np.sqrt(np.mean(V * V, axis=-1, keepdims=True) + np.float32(eps))
    q = norm_w * proj_w[0]
    s = kf @ q
    a = np.exp(s - s.max(0, keepdims=True))
    a /= a.sum(0, keepdims=True)
    out = a[0][:, None] * V[0]
    for j in range(1, len(vals)):
        out = out + a[j][:, None] * V[j]
    return out


def predictor(f, pack, moe_layers, ex, ids, n_prompt):
    sys.path.insert(0, REF)
    from k3model import Config
    c = Config(pack.cfg)
    eps, blk, k = c.eps, c.block, c.k
    T = ids.size
    emb = pack.get("model.embed_tokens.weight", rows=ids)
    h = emb.astype(np.float32)
    blocks = []
    x2 = {}          # layer -> the MoE input (post-attention norm of the AttnRes mix)
    xnext = {}       # layer -> layer i+1's MoE input as known after layer i: the mix with no attention yet
    P = lambda i, n: pack.get("model.layers.%d.%s" % (i, n))
    for i in range(c.L):
        ps = h
        if blk and i % blk == 0:
            blocks.append(ps)
            ps = None
        att = np.array(f.get("layers.%d.attn_out" % i), np.float32)
        ps = att if ps is None else ps + att
        m_in = attnres(blocks + [ps], P(i, "mlp_res_norm.weight"), P(i, "mlp_res_proj.weight"), eps) if blk else ps
        x2[i] = rms(m_in, P(i, "post_attention_layernorm.weight"), eps)
        h = np.array(f.get("layers.%d.out" % i), np.float32)
        # what layer i+1's router could see at the end of layer i: its mix and norm over
        # the blocks and h (layer i+1's attention output not computed yet)
        if i + 1 < c.L:
            j = i + 1
            bl = blocks + [h] if blk and j % blk == 0 else blocks
            mix = attnres(bl + [h], P(j, "mlp_res_norm.weight"), P(j, "mlp_res_proj.weight"), eps) if blk else h
            xnext[i] = rms(mix, P(j, "post_attention_layernorm.weight"), eps)

    def route(i, x):
        W = P(i, "block_sparse_moe.gate.weight")
        b = P(i, "block_sparse_moe.gate.e_score_correction_bias")
        s = 1.0 / (1.0 + np.exp(-(x @ W.T)))
        sel = s + b
        return np.argsort(-sel, axis=1, kind="stable")

    out = {"selfcheck": [], "rows": []}
    for lp, i in enumerate(moe_layers):
        order = route(i, x2[i])
        same = np.mean([set(order[t, :k]) == set(ex[lp][t]) for t in range(T)])
        out["selfcheck"].append(same)
    dec = np.arange(n_prompt, T)
    allp = np.arange(T)
    for name, fn in (("router of L+1 on L's MoE input", lambda j, i: route(j, x2[i])),
                     ("router of L+1 on L's output (mixed and normed as L+1 would)", lambda j, i: route(j, xnext[i]))):
        acc = {m: [] for m in (1, 6, 16)}
        rec32 = []
        accd = {m: [] for m in (1, 6, 16)}
        for lp in range(1, len(moe_layers)):
            j, i = moe_layers[lp], moe_layers[lp - 1]
            if j != i + 1:
                continue
            order = fn(j, i)
            truth = ex[lp]
            for m in (1, 6, 16):
                hit = np.array([len(set(order[t, :m]) & set(truth[t])) / m for t in allp])
                acc[m].append(hit.mean())
                accd[m].append(hit[dec].mean())
            rec32.append(np.mean([len(set(order[t, :32]) & set(truth[t])) / k for t in allp]))
        out["rows"].append((name, {m: np.mean(v) for m, v in acc.items()}, {m: np.mean(v) for m, v in accd.items()},
                            np.mean(rec32)))
    # baseline: the same layer's experts of the previous token
    prev = {m: [] for m in (16,)}
    for lp in range(len(moe_layers)):
        prev[16].append(np.mean([len(set(ex[lp][t]) & set(ex[lp][t - 1])) / k for t in dec]))
    out["prev_token"] = np.mean(prev[16])
    return out


# ---------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dump", nargs="+", help="k3run --dump file(s); label with LABEL=FILE")
    ap.add_argument("--json", action="append", default=[], help="k3run --json output of each run (for n_prompt)")
    ap.add_argument("--n-prompt", type=int, action="append", default=[])
    ap.add_argument("--pack", help="the pack: record size and the lookahead predictor")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--sizes", default="2,3,5,10,25,50,75", help="cache sizes, %% of all experts")
    ap.add_argument("--slots", default="", help="extra cache sizes in slots (e.g. the planner's), label=N,...")
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    a = ap.parse_args()

    pack = Pack(a.pack) if a.pack else None
    rec_bytes = pack.m["expert_layers"][0]["record_size"] if pack else None
    policies = a.policies.split(",")
    for di, spec in enumerate(a.dump):
        label, _, path = spec.rpartition("=")
        label = label or os.path.basename(path)
        if di < len(a.json):
            n_prompt = json.load(open(a.json[di]))["prompt_tokens"]
        elif di < len(a.n_prompt):
            n_prompt = a.n_prompt[di]
        else:
            sys.exit("give --json or --n-prompt for each dump")
        f, moe_layers, ex, ids = load_trace(path)
        T, k = ex[0].shape
        nL = len(moe_layers)
        E = pack.m["expert_layers"][0]["count"] if pack else int(max(e.max() for e in ex)) + 1
        total = nL * E
        n_dec = T - n_prompt
        print("## trace %s: %d prompt + %d decoded positions, %d MoE layers x %d experts (top-%d), %d experts in all"
              % (label, n_prompt, n_dec, nL, E, k, total))
        print()
        st = trace_stats(ex, n_prompt, E)
        print("Decode routing: same-layer overlap with the previous token %.1f %% (per layer %s); "
              "experts used per layer %d-%d of %d; the top 10 %% of experts take %.1f %% of requests."
              % (100 * np.mean(st["overlap"]), " ".join("%.0f" % (100 * o) for o in st["overlap"]),
                 min(st["used"]), max(st["used"]), E, 100 * np.mean(st["top10"])))
        print()
        sizes = [("%s %%" % p, max(1, int(round(total * float(p) / 100)))) for p in a.sizes.split(",") if p]
        for item in filter(None, a.slots.split(",")):
            lab, _, n = item.rpartition("=")
            sizes.append((lab or n + " slots", int(n)))
        hdr = "| policy | " + " | ".join(l if l.endswith(" slots") else "%s (%d slots)" % (l, n) for l, n in sizes) + " |"
        table = {}
        for p in policies:
            row = []
            for _, n in sizes:
                row.append(simulate(ex, n_prompt, n, nL, E, p, a.batch))
            table[p] = row
        for phase in ("decode", "prefill"):
            print("%s hit rate (%s)%s:" % (phase, label, ", and MB read per %s token" % (
                "decoded" if phase == "decode" else "prompt") if rec_bytes else ""))
            print()
            print(hdr)
            print("|---" * (len(sizes) + 1) + "|")
            for p in policies:
                cells = []
                for r in table[p]:
                    if r is None:
                        cells.append("-")
                        continue
                    h, n = r[phase]
                    cell = "%.1f %%" % (100.0 * h / n) if n else "-"
                    per = n_dec if phase == "decode" else n_prompt
                    if rec_bytes and per:
                        cell += " (%.0f)" % ((n - h) * rec_bytes / per / 1e6)
                    cells.append(cell)
                print("| %s | %s |" % (p, " | ".join(cells)))
            print()
        if pack:
            pr = predictor(f, pack, moe_layers, ex, ids, n_prompt)
            print("Lookahead (%s): the layer's own router on the rebuilt MoE input reproduces the dumped expert "
                  "sets at %.2f %% of positions (self-check)." % (label, 100 * np.mean(pr["selfcheck"])))
            print()
            print("| predictor of layer L+1's experts | rank-1 precision | top-6 precision | top-16 precision "
                  "| decode only: 1 / 6 / 16 | recall of the 16 in the top 32 |")
            print("|---|---|---|---|---|---|")
            for name, acc, accd, r32 in pr["rows"]:
                print("| %s | %.1f %% | %.1f %% | %.1f %% | %.1f / %.1f / %.1f %% | %.1f %% |" % (
                    name, 100 * acc[1], 100 * acc[6], 100 * acc[16], 100 * accd[1], 100 * accd[6], 100 * accd[16],
                    100 * r32))
            print("| same layer, previous token (decode) | - | - | %.1f %% | - | - |" % (100 * pr["prev_token"]))
            print()


if __name__ == "__main__":
    main()

"""Independent NumPy reference of the Kimi K3 forward pass (spec K3-ARCHITECTURE.md §4).

k3 is DEFINED as the fp32 computation of this file on the checkpoint's exact weights
(BF16 widened by bit shift, MXFP4 dequantized exactly, F32 as stored). mode="f64" runs
the same math in float64 (to measure fp32 error); mode="bf16" emulates the official
code's bf16 rounding points (to measure how far a bf16 run drifts), see BF16_POINTS.

Summation orders the reference fixes (a C engine should do the same where it matters):
  * top-k: biased score descending, ties -> lower expert index first (stable sort);
  * top-k weight renormalisation: sum over slots in slot order, then + 1e-20;
  * routed expert combination: sum_j w_j * y_j in slot order (j = 0..k-1), fp32;
  * short conv: taps oldest..current, left to right;
  * AttnRes mix: sum over blocks in block order, then the partial sum last;
  * greedy argmax: lowest id among equal maxima.
Matrix products use BLAS (its internal order); the tolerance study in README.md
measures what another valid order changes.

BF16_POINTS (mode="bf16"; spec §4.1, §4.7; rb = round to nearest-even bf16):
  weights: BF16 tensors as stored; MXFP4 dequantized (exact in bf16); F32 tensors
    (A_log, dt_bias, conv, o_norm, expert bias) kept F32 (vLLM policy);
  every Linear: bf16 inputs, fp32 accumulate, rb(output);
  RMSNorm: rb(x * rsqrt(mean(x^2)+eps)) then rb(* weight)  (spec §4.1);
  residual stream: rb after every add (ps + a, ps + f), rb(AttnRes mix);
  KDA: rb(silu(conv)); q, k rb after l2norm+scale (chunk path writes them back);
    gate, beta, state fp32; rb(o); rb(gated norm output);
  MLA: rb(expanded K/V), attention fp32 (flash-attn), rb(o), rb(sigmoid gate), rb(o*gate);
  FFN: SiTU in fp32 from bf16 g, u, rb(result); router fp32 (x widened, gate weight
    widened), routed sum fp32, rb(sum); rb(expert outputs); rb(routed + shared);
  logits: rb(lm_head output) (HF computes them in bf16, then .float()).
"""

import collections
import json
import os

import numpy as np

from safetensors_io import ModelDir, round_bf16
import mxfp4


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def silu(z):
    return z * sigmoid(z)


def softplus(z):
    return np.where(z > 20, z, np.log1p(np.exp(np.minimum(z, 20))))


# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------

class Config:
    """text_config fields the forward pass uses (K3 nests them under text_config)."""

    def __init__(self, cfg):
        tc = cfg.get("text_config", cfg)
        self.raw = tc
        self.D = tc["hidden_size"]
        self.L = tc["num_hidden_layers"]
        self.vocab = tc["vocab_size"]
        self.eps = tc["rms_norm_eps"]
        lac = tc.get("linear_attn_config") or {}
        self.kda_layers = set(lac.get("kda_layers") or [])
        self.H, self.K = lac.get("num_heads"), lac.get("head_dim")
        self.conv_w = lac.get("short_conv_kernel_size", 4)
        self.full_rank_gate = bool(lac.get("use_full_rank_gate", False))
        self.lower_bound = lac.get("gate_lower_bound")
        self.Hm = tc["num_attention_heads"]
        self.dn, self.dr, self.dv = tc["qk_nope_head_dim"], tc["qk_rope_head_dim"], tc["v_head_dim"]
        self.R, self.Q = tc["kv_lora_rank"], tc.get("q_lora_rank")
        if not tc.get("mla_use_nope", False):
            raise NotImplementedError("only NoPE MLA (mla_use_nope) is implemented")
        self.mla_gate = bool(tc.get("mla_use_output_gate", False))
        self.E = tc.get("num_experts")
        self.k = tc.get("num_experts_per_token")
        self.n_shared = tc.get("num_shared_experts") or 0
        self.first_dense = tc.get("first_k_dense_replace", 0)
        self.moe_freq = tc.get("moe_layer_freq", 1)
        self.renorm = tc.get("moe_renormalize", True)
        self.router_act = tc.get("moe_router_activation_func", "sigmoid")
        self.rsf = tc.get("routed_scaling_factor", 1.0)
        if tc.get("num_expert_group", 1) not in (1, None):
            raise NotImplementedError("grouped top-k with more than one group")
        self.Dl = tc.get("routed_expert_hidden_size")
        self.latent_norm = bool(tc.get("latent_moe_use_norm", False)) and self.Dl is not None
        self.block = tc.get("attn_res_block_size")      # None -> plain residual (Kimi Linear)
        self.act = tc.get("hidden_act", "silu")
        self.beta = tc.get("activation_situ_beta", 4.0)
        self.beta_lin = tc.get("activation_situ_linear_beta", 25.0)
        self.eos = tc.get("eos_token_id", cfg.get("eos_token_id"))

    def is_kda(self, i):
        return (i + 1) in self.kda_layers              # 1-based list (pitfall 1)

    def is_moe(self, i):
        return self.E is not None and i >= self.first_dense and i % self.moe_freq == 0


# ---------------------------------------------------------------------------
# Weights: trunk converted once, experts on demand through a bounded LRU cache
# ---------------------------------------------------------------------------

class Weights:
    def __init__(self, model_dir, dtype, cache_bytes):
        self.md = ModelDir(model_dir)
        self.dtype = dtype
        self.prefix = "language_model." if any(n.startswith("language_model.") for n in self.md.names) else ""
        self._trunk = {}
        self._experts = collections.OrderedDict()       # (layer, e) -> (w1, w3, w2)
        self._cache_bytes, self._used = cache_bytes, 0
        self.expert_loads = 0

    def __call__(self, name):
        """Trunk tensor `name` (without prefix) as self.dtype, cached."""
        a = self._trunk.get(name)
        if a is None:
            a = self.md.get_f32(self.prefix + name).astype(self.dtype, copy=False)
            self._trunk[name] = a
        return a

    def has(self, name):
        return (self.prefix + name) in self.md

    def _matrix(self, base):
        n = self.prefix + base
        if n + ".weight_packed" in self.md:
            return mxfp4.dequantize(self.md.get(n + ".weight_packed"), self.md.get(n + ".weight_scale"))
        return self.md.get_f32(n + ".weight")

    def expert(self, layer, e):
        """(w1 [I, Dl], w3 [I, Dl], w2 [Dl, I]) of routed expert e of `layer`."""
        key = (layer, e)
        hit = self._experts.get(key)
        if hit is not None:
            self._experts.move_to_end(key)
            return hit
        b = "model.layers.%d.block_sparse_moe.experts.%d." % (layer, e)
        ws = tuple(self._matrix(b + w).astype(self.dtype, copy=False) for w in ("w1", "w3", "w2"))
        self.expert_loads += 1
        size = sum(w.nbytes for w in ws)
        if size <= self._cache_bytes:
            while self._used + size > self._cache_bytes:
                _, old = self._experts.popitem(last=False)
                self._used -= sum(w.nbytes for w in old)
            self._experts[key] = ws
            self._used += size
        return ws


# ---------------------------------------------------------------------------
# Pure kernels (also used directly by the self-checks)
# ---------------------------------------------------------------------------

def kda_recurrent(q, k, v, g, beta, S):
    """Token-by-token KDA (spec §4.4 step 6). q, k, g: [T,H,K]; v: [T,H,V]; beta: [T,H];
    S: [H,K,V] state, updated in place. Returns o [T,H,V] (from the UPDATED state)."""
    T = q.shape[0]
    o = np.empty(v.shape, dtype=S.dtype)
    for t in range(T):
        S *= np.exp(g[t])[:, :, None]                                    # decay first
        kS = np.matmul(k[t][:, None, :], S)[:, 0, :]                     # [H,V] = S^T k
        u = beta[t][:, None] * (v[t] - kS)                               # [H,V]
        S += k[t][:, :, None] * u[:, None, :]                            # delta update
        o[t] = np.matmul(q[t][:, None, :], S)[:, 0, :]                   # [H,V] = S^T q
    return o


def kda_chunked(q, k, v, g, beta, S, chunk=64):
    """The same recurrence in chunked WY form (as FLA naive_chunk_kda). Shapes as
    kda_recurrent; S updated in place. Inside a chunk with inclusive cumulative
    log-decay G_t (per key dim):
      A[t,s]  = beta_t sum_d k_t k_s exp(G_t - G_s)           (s < t)
      u       = (I + A)^-1 beta (v - (k * exp(G)) S0)        (forward substitution)
      o_t     = (q_t * exp(G_t)) S0 + sum_{s<=t} [sum_d q_t k_s exp(G_t - G_s)] u_s
      S_end   = exp(G_C) * S0 + sum_s (k_s * exp(G_C - G_s)) u_s^T"""
    T = q.shape[0]
    o = np.empty(v.shape, dtype=S.dtype)
    for c0 in range(0, T, chunk):
        sl = slice(c0, min(T, c0 + chunk))
        qc, kc, vc, bc = q[sl], k[sl], v[sl], beta[sl]                   # [C,H,K] .. [C,H]
        G = np.cumsum(g[sl], axis=0)                                     # [C,H,K]
        C = G.shape[0]
        tri = np.tril(np.ones((C, C), dtype=bool))                       # s <= t
        diff = np.where(tri[:, :, None, None], G[:, None] - G[None, :], -np.inf)   # [C(t),C(s),H,K]
        decay = np.exp(diff)
        Akk = np.einsum("thd,shd,tshd->tsh", kc, kc, decay)              # [C,C,H]
        Aqk = np.einsum("thd,shd,tshd->tsh", qc, kc, decay)              # [C,C,H]
        eG = np.exp(G)                                                   # [C,H,K]
        rhs = bc[:, :, None] * (vc - np.einsum("thd,hdv->thv", kc * eG, S))   # [C,H,V]
        u = np.empty_like(rhs)
        for t in range(C):                                               # (I + A) u = rhs
            acc = rhs[t].copy()
            for s_ in range(t):
                acc -= (bc[t] * Akk[t, s_])[:, None] * u[s_]
            u[t] = acc
        o[sl] = np.einsum("thd,hdv->thv", qc * eG, S) + np.einsum("tsh,shv->thv", Aqk, u)
        last = G[-1]                                                     # [H,K]
        kd = kc * np.exp(last[None] - G)                                 # [C,H,K]
        S *= np.exp(last)[:, :, None]
        S += np.einsum("shd,shv->hdv", kd, u)
    return o


def causal_softmax_attend(s, mask, vals):
    """s: [H,T,Tc] scores, mask: [T,Tc] bool (True = visible), vals: [H,Tc,X] -> [H,T,X]."""
    s = np.where(mask[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.matmul(p, vals)


def mla_expanded(q_nope, q_rope, k_nope, v, k_rope, pos0, scale):
    """Per-head K/V form. q_nope [T,H,dn], q_rope [T,H,dr]; cache k_nope [Tc,H,dn],
    v [Tc,H,dv], k_rope [Tc,dr]; query t sits at position pos0+t. -> o [T,H,dv]."""
    T, Tc = q_nope.shape[0], k_nope.shape[0]
    s = (np.matmul(q_nope.transpose(1, 0, 2), k_nope.transpose(1, 2, 0)) +
         np.matmul(q_rope.transpose(1, 0, 2), k_rope.T[None])) * scale    # [H,T,Tc]
    mask = np.arange(Tc)[None, :] <= (pos0 + np.arange(T))[:, None]       # [T,Tc]
    return causal_softmax_attend(s, mask, v.transpose(1, 0, 2)).transpose(1, 0, 2)


def mla_absorbed(q_nope, q_rope, c, k_rope, kv_b, pos0, scale, dn, dv):
    """Absorbed (latent) form, spec §4.5: q_hat_h = W_UK_h^T q_nope_h; scores on c;
    o_h = W_UV_h (sum p c). c [Tc,R] (normed latent), kv_b [H*(dn+dv), R] -> o [T,H,dv]."""
    T, H = q_nope.shape[:2]
    Tc, R = c.shape
    Wkv = kv_b.reshape(H, dn + dv, R)
    Wuk, Wuv = Wkv[:, :dn], Wkv[:, dn:]                                   # [H,dn,R], [H,dv,R]
    q_lat = np.einsum("thd,hdr->htr", q_nope, Wuk)                        # [H,T,R]
    s = (np.matmul(q_lat, c.T[None]) + np.matmul(q_rope.transpose(1, 0, 2), k_rope.T[None])) * scale
    mask = np.arange(Tc)[None, :] <= (pos0 + np.arange(T))[:, None]
    o_lat = causal_softmax_attend(s, mask, np.broadcast_to(c[None], (H, Tc, R)))   # [H,T,R]
    return np.einsum("htr,hvr->thv", o_lat, Wuv)


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------

class State:
    """Per-sequence caches: KDA conv windows [C, W-1] x3 and S [H,K,V]; MLA latent
    c [Tc,R], k_rope [Tc,dr] plus the expanded k_nope [Tc,H,dn], v [Tc,H,dv]."""

    def __init__(self, cfg, dtype):
        self.pos = 0
        self.layers = []
        for i in range(cfg.L):
            if cfg.is_kda(i):
                C = cfg.H * cfg.K
                self.layers.append({"win": [np.zeros((C, cfg.conv_w - 1), dtype) for _ in range(3)],
                                    "S": np.zeros((cfg.H, cfg.K, cfg.K), dtype)})
            else:
                self.layers.append({"c": np.zeros((0, cfg.R), dtype), "kr": np.zeros((0, cfg.dr), dtype),
                                    "kn": np.zeros((0, cfg.Hm, cfg.dn), dtype),
                                    "v": np.zeros((0, cfg.Hm, cfg.dv), dtype)})


class Model:
    def __init__(self, model_dir, mode="fp32", mla_absorb=False, kda_chunk=None, alt_order=False,
                 expert_cache_mb=1024):
        """mode: fp32 | f64 | bf16. mla_absorb: absorbed MLA form for every call.
        kda_chunk: None = token-by-token recurrence, else chunk size of the WY form.
        alt_order: matmuls summed in reversed 64-wide blocks (another valid fp32 order,
        for the tolerance study)."""
        with open(os.path.join(model_dir, "config.json"), "r", encoding="utf-8") as f:
            self.cfg = Config(json.load(f))
        self.model_dir = model_dir
        self.mode = mode
        self.dt = np.float64 if mode == "f64" else np.float32
        self.bf16 = mode == "bf16"
        self.mla_absorb, self.kda_chunk, self.alt_order = mla_absorb, kda_chunk, alt_order
        self.w = Weights(model_dir, self.dt, expert_cache_mb << 20)
        self.glu_stats = {"n": 0, "sat": 0, "half": 0, "max": 0.0}         # SiTU gate |g| health

    def new_state(self):
        return State(self.cfg, self.dt)

    # -- primitives ---------------------------------------------------------
    def rb(self, x):
        return round_bf16(x) if self.bf16 else x

    def mm(self, x, W):
        """x [T,in] @ W[out,in].T -> [T,out] in self.dt."""
        if not self.alt_order:
            return x @ W.T
        n = W.shape[1]
        acc = None
        for b0 in reversed(range(0, n, 64)):
            part = x[:, b0:b0 + 64] @ W[:, b0:b0 + 64].T
            acc = part if acc is None else acc + part
        return acc

    def lin(self, x, name):
        return self.rb(self.mm(x, self.w(name)))

    def rms(self, x, weight, eps):
        """x [...,n] -> weight * (x * rsqrt(mean(x^2) + eps)); no 1+w offset."""
        r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.dt(eps))
        return self.rb(weight * self.rb(x * r))

    def glu(self, g, u):
        c = self.cfg
        ag = np.abs(g)
        st = self.glu_stats
        st["n"] += ag.size
        st["sat"] += int((ag > c.beta).sum())
        st["half"] += int((ag > c.beta / 2).sum())
        st["max"] = max(st["max"], float(ag.max()) if ag.size else 0.0)
        if c.act == "situ":    # sigmoid on the UNCAPPED g (spec §4.6)
            h = (c.beta * np.tanh(g / c.beta) * sigmoid(g)) * (c.beta_lin * np.tanh(u / c.beta_lin))
        else:
            h = silu(g) * u
        return self.rb(h.astype(self.dt, copy=False))

    def attnres(self, vals, p):
        """vals: list of [T,D] (blocks..., partial); p: weight prefix. -> [T,D]."""
        V = np.stack(vals)                                                   # [n,T,D]
        kf = V / np.sqrt(np.mean(V * V, axis=-1, keepdims=True) + self.dt(self.cfg.eps))
        query = self.w(p + "_norm.weight") * self.w(p + "_proj.weight")[0]   # [D]
        s = kf @ query                                                       # [n,T]
        a = np.exp(s - s.max(0, keepdims=True))
        a /= a.sum(0, keepdims=True)
        out = a[0][:, None] * V[0]
        for j in range(1, len(vals)):
            out = out + a[j][:, None] * V[j]
        return self.rb(out)

    # -- attention ----------------------------------------------------------
    def kda(self, x, st, p):
        c = self.cfg
        T, H, K = x.shape[0], c.H, c.K
        a = p + "self_attn."
        proj = []
        for j, n in enumerate("qkv"):
            y = self.lin(x, a + n + "_proj.weight")                          # [T,C]
            wc = self.w(a + n + "_conv1d.weight")[:, 0, :]                   # [C,W]
            full = np.concatenate([st["win"][j], y.T], axis=1)               # [C, W-1+T]
            acc = wc[:, 0:1] * full[:, 0:T]
            for i in range(1, c.conv_w):                                     # oldest .. current tap
                acc = acc + wc[:, i:i + 1] * full[:, i:i + T]
            st["win"][j] = full[:, T:].copy()                                # last W-1 inputs
            proj.append(self.rb(silu(acc.T)).reshape(T, H, K))
        q, k, v = proj
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + self.dt(1e-6)) * self.dt(K ** -0.5)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + self.dt(1e-6))
        q, k = self.rb(q), self.rb(k)
        z = self.lin(self.lin(x, a + "f_a_proj.weight"), a + "f_b_proj.weight")
        z = z.reshape(T, H, K) + self.w(a + "dt_bias").reshape(H, K)            # [T,H,K] fp32
        A = np.exp(self.w(a + "A_log").reshape(H, 1))                        # [H,1]
        if c.lower_bound is not None:
            g = self.dt(c.lower_bound) * sigmoid(A * z)                       # (lb, 0)
        else:
            g = -A * softplus(z)
        beta = sigmoid(self.lin(x, a + "b_proj.weight"))                    # [T,H], no x2
        if self.kda_chunk:
            o = kda_chunked(q, k, v, g, beta, st["S"], self.kda_chunk)
        else:
            o = kda_recurrent(q, k, v, g, beta, st["S"])
        o = self.rb(o)
        gate = (self.lin(x, a + "g_proj.weight") if c.full_rank_gate else
                self.lin(self.lin(x, a + "g_a_proj.weight"), a + "g_b_proj.weight")).reshape(T, H, K)
        on = o / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + self.dt(c.eps))
        o = self.rb(on * self.w(a + "o_norm.weight") * sigmoid(gate))
        return self.lin(o.reshape(T, H * K), a + "o_proj.weight")

    def mla(self, x, st, p, pos0):
        c = self.cfg
        T, Hm, dn, dr, dv = x.shape[0], c.Hm, c.dn, c.dr, c.dv
        a = p + "self_attn."
        if c.Q:
            qa = self.rms(self.lin(x, a + "q_a_proj.weight"), self.w(a + "q_a_layernorm.weight"), 1e-6)
            q = self.lin(qa, a + "q_b_proj.weight")
        else:
            q = self.lin(x, a + "q_proj.weight")
        q = q.reshape(T, Hm, dn + dr)
        q_nope, q_rope = q[:, :, :dn], q[:, :, dn:]                          # NoPE: rope dims unrotated
        ckv = self.lin(x, a + "kv_a_proj_with_mqa.weight")                   # [T, R+dr]
        cn = self.rms(ckv[:, :c.R], self.w(a + "kv_a_layernorm.weight"), 1e-6)   # eps 1e-6 (pitfall 3)
        kv = self.lin(cn, a + "kv_b_proj.weight").reshape(T, Hm, dn + dv)
        st["c"] = np.concatenate([st["c"], cn])
        st["kr"] = np.concatenate([st["kr"], ckv[:, c.R:]])
        st["kn"] = np.concatenate([st["kn"], kv[:, :, :dn]])
        st["v"] = np.concatenate([st["v"], kv[:, :, dn:]])
        scale = self.dt((dn + dr) ** -0.5)
        if self.mla_absorb:
            o = mla_absorbed(q_nope, q_rope, st["c"], st["kr"], self.w(a + "kv_b_proj.weight"), pos0, scale, dn, dv)
        else:
            o = mla_expanded(q_nope, q_rope, st["kn"], st["v"], st["kr"], pos0, scale)
        o = self.rb(o.reshape(T, Hm * dv))
        if c.mla_gate:
            o = self.rb(o * self.rb(sigmoid(self.lin(x, a + "g_proj.weight"))))   # gate of x (pitfall 7)
        return self.lin(o, a + "o_proj.weight")

    # -- FFN ----------------------------------------------------------------
    def dense(self, x, p):
        m = p + "mlp."
        h = self.glu(self.lin(x, m + "gate_proj.weight"), self.lin(x, m + "up_proj.weight"))
        return self.lin(h, m + "down_proj.weight")

    def moe(self, x, layer, p, rec):
        c = self.cfg
        m = p + "block_sparse_moe."
        T, k = x.shape[0], c.k
        logits = self.mm(x, self.w(m + "gate.weight"))                       # [T,E], never rounded
        if c.router_act == "sigmoid":
            s = sigmoid(logits)
        else:
            s = np.exp(logits - logits.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
        bias_name = m + "gate.e_score_correction_bias"
        sel = s + self.w(bias_name) if self.w.has(bias_name) else s          # selection only
        order = np.argsort(-sel, axis=-1, kind="stable")                     # ties: lower index first
        idx = order[:, :k]                                                   # [T,k]
        wts = np.take_along_axis(s, idx, axis=-1)                            # UNBIASED scores [T,k]
        if c.renorm and k > 1:
            den = wts[:, 0].copy()
            for j in range(1, k):
                den = den + wts[:, j]
            wts = wts / (den + self.dt(1e-20))[:, None]
        wts = wts * self.dt(c.rsf)
        rec["experts"] = idx.astype(np.int32)
        rec["expert_weights"] = wts
        srt = np.take_along_axis(sel, order[:, :k + 1], axis=-1)
        rec["margin"] = (srt[:, k - 1] - srt[:, k]) if sel.shape[1] > k else np.full(T, np.inf)
        rec["sel"] = sel
        xl = self.lin(x, m + "routed_expert_down_proj.weight") if c.Dl else x   # [T,Dl]
        Y = np.zeros((T, k, xl.shape[1]), dtype=self.dt)                    # per-slot expert outputs
        for e in np.unique(idx):
            ts, js = np.nonzero(idx == e)
            w1, w3, w2 = self.w.expert(layer, int(e))
            xe = xl[ts]
            h = self.glu(self.rb(self.mm(xe, w1)), self.rb(self.mm(xe, w3)))
            Y[ts, js] = self.rb(self.mm(h, w2))
        yl = wts[:, 0:1] * Y[:, 0]
        for j in range(1, k):                                                # slot order, fp32
            yl = yl + wts[:, j:j + 1] * Y[:, j]
        yl = self.rb(yl)
        if c.latent_norm:
            yl = self.rms(yl, self.w(m + "routed_expert_norm.weight"), c.eps)
        y = self.lin(yl, m + "routed_expert_up_proj.weight") if c.Dl else yl
        if c.n_shared:
            sh = self.glu(self.lin(x, m + "shared_experts.gate_proj.weight"),
                          self.lin(x, m + "shared_experts.up_proj.weight"))
            y = self.rb(y + self.lin(sh, m + "shared_experts.down_proj.weight"))
        return y

    # -- whole model --------------------------------------------------------
    def forward(self, ids, state):
        """Process len(ids) new tokens after state.pos. Returns a record dict:
        ids [T], logits [T,V], final_hidden [T,D], layers: list of per-layer dicts with
        attn_out, ffn_out, out [T,D] (+ experts [T,k], expert_weights [T,k], margin [T],
        sel [T,E] for MoE layers)."""
        c = self.cfg
        ids = np.asarray(ids, dtype=np.int64)
        T = ids.shape[0]
        if T == 0 or ids.min() < 0 or ids.max() >= c.vocab:
            raise ValueError("token ids must be in 0..%d" % (c.vocab - 1))
        pos0 = state.pos
        h = self.w("model.embed_tokens.weight")[ids]                         # [T,D]
        blocks, layers = [], []
        for i in range(c.L):
            p = "model.layers.%d." % i
            rec = {}
            if c.block:                                                      # block AttnRes (§4.3)
                ps = h
                a_in = ps if not blocks else self.attnres(blocks + [ps], p + "self_attention_res")
                if i % c.block == 0:                                         # freeze AFTER a_in
                    blocks.append(ps)
                    ps = None
            else:
                ps = a_in = h
            x = self.rms(a_in, self.w(p + "input_layernorm.weight"), c.eps)
            att = self.kda(x, state.layers[i], p) if c.is_kda(i) else self.mla(x, state.layers[i], p, pos0)
            ps = att if ps is None else self.rb(ps + att)
            m_in = self.attnres(blocks + [ps], p + "mlp_res") if c.block else ps
            x2 = self.rms(m_in, self.w(p + "post_attention_layernorm.weight"), c.eps)
            f = self.moe(x2, i, p, rec) if c.is_moe(i) else self.dense(x2, p)
            h = self.rb(ps + f)                                              # partial sum passed on
            rec.update(attn_out=att, ffn_out=f, out=h)
            layers.append(rec)
        if c.block:
            h = self.attnres(blocks + [h], "model.output_attn_res")
        logits = self.rb(self.mm(self.rms(h, self.w("model.norm.weight"), c.eps), self.w("lm_head.weight")))
        state.pos += T
        return {"ids": ids, "logits": logits, "final_hidden": h, "layers": layers}


def concat_records(recs):
    """Join forward() records along the token axis."""
    out = {"ids": np.concatenate([r["ids"] for r in recs]),
           "logits": np.concatenate([r["logits"] for r in recs]),
           "final_hidden": np.concatenate([r["final_hidden"] for r in recs]), "layers": []}
    for i in range(len(recs[0]["layers"])):
        d = {}
        for key in recs[0]["layers"][i]:
            d[key] = np.concatenate([r["layers"][i][key] for r in recs])
        out["layers"].append(d)
    return out


def generate(model, prompt_ids, n, eos=None):
    """Greedy generation. Prefill the prompt at once, then feed each generated token back
    (except the last one, and never eos). Returns (generated ids incl. a final eos, records
    over every processed position)."""
    st = model.new_state()
    recs = [model.forward(prompt_ids, st)]
    gen = []
    while len(gen) < n:
        tok = int(np.argmax(recs[-1]["logits"][-1]))                        # lowest id on ties
        gen.append(tok)
        if tok == eos or len(gen) == n:
            break
        recs.append(model.forward([tok], st))
    return gen, concat_records(recs)

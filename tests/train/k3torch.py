"""Kimi K3's forward pass in torch, for training the demo model (fp32 throughout).

The same math as tests/reference/k3model.py (spec K3-ARCHITECTURE.md §4), written again for
training: batched [B, T] sequences that all start at position 0, autograd, the routed experts
of a layer stacked in one tensor. `check_parity.py` proves it equals the NumPy reference on the
exported weights before training starts. Parameter names are the checkpoint's names without
the `language_model.model.` prefix, so export is a rename; the experts' w1/w3/w2 are stacked
[E, out, in] here and split into `experts.e.wN` on export.

Training-only parts (never in an exported checkpoint): MXFP4 fake quantization of the routed
experts with a straight-through gradient (`Model.fake_mxfp4`), and the routing-bias update of
K3's auxiliary-loss-free balancing (`Model.update_routing_bias`).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Cfg:
    """The text_config fields the model uses (K3 nesting accepted)."""

    def __init__(self, cfg):
        tc = cfg.get("text_config", cfg)
        self.raw = tc
        self.D, self.L, self.V = tc["hidden_size"], tc["num_hidden_layers"], tc["vocab_size"]
        self.eps = tc["rms_norm_eps"]
        lac = tc["linear_attn_config"]
        self.kda_layers = set(lac["kda_layers"])
        self.H, self.K, self.W = lac["num_heads"], lac["head_dim"], lac["short_conv_kernel_size"]
        assert lac["use_full_rank_gate"] and lac["gate_lower_bound"] is not None
        self.lb = float(lac["gate_lower_bound"])
        self.Hm = tc["num_attention_heads"]
        self.dn, self.dr, self.dv = tc["qk_nope_head_dim"], tc["qk_rope_head_dim"], tc["v_head_dim"]
        self.R, self.Q = tc["kv_lora_rank"], tc["q_lora_rank"]
        assert tc["mla_use_nope"] and tc["mla_use_output_gate"] and self.Q
        self.E, self.k, self.n_shared = tc["num_experts"], tc["num_experts_per_token"], tc["num_shared_experts"]
        self.I, self.Dl, self.Id = tc["moe_intermediate_size"], tc["routed_expert_hidden_size"], tc["intermediate_size"]
        self.first_dense, self.moe_freq = tc["first_k_dense_replace"], tc["moe_layer_freq"]
        self.rsf = float(tc["routed_scaling_factor"])
        assert tc["moe_router_activation_func"] == "sigmoid" and tc["moe_renormalize"] and tc["latent_moe_use_norm"]
        self.block = tc["attn_res_block_size"]
        assert tc["hidden_act"] == "situ"
        self.beta, self.beta_lin = tc["activation_situ_beta"], tc["activation_situ_linear_beta"]

    def is_kda(self, i):
        return (i + 1) in self.kda_layers

    def is_moe(self, i):
        return i >= self.first_dense and i % self.moe_freq == 0


def rms(x, w, eps):
    return w * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps))


class Vec(nn.Module):
    """A 1-D weight (norm scale, or [1, D] AttnRes projection) under the name `weight`."""

    def __init__(self, *shape, value=1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.full(shape, float(value)))


class Lin(nn.Module):
    """nn.Linear without bias, [out, in], N(0, std^2) init (std default 1/sqrt(in))."""

    def __init__(self, n_in, n_out, std=None):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) * (std if std is not None else n_in ** -0.5))

    def forward(self, x):
        return F.linear(x, self.weight)


class Conv(nn.Module):
    def __init__(self, C, W):
        super().__init__()
        w = torch.randn(C, 1, W) * 0.3
        w[:, 0, W - 1] += 1.0                      # starts near the identity on the current token
        self.weight = nn.Parameter(w)


class KDA(nn.Module):
    def __init__(self, c, out_std):
        super().__init__()
        D, H, K = c.D, c.H, c.K
        C = H * K
        self.c = c
        self.q_proj, self.k_proj, self.v_proj = Lin(D, C), Lin(D, C), Lin(D, C)
        self.q_conv1d, self.k_conv1d, self.v_conv1d = Conv(C, c.W), Conv(C, c.W), Conv(C, c.W)
        self.A_log = nn.Parameter(torch.log(torch.empty(H).uniform_(0.5, 4.0)))
        self.dt_bias = nn.Parameter(torch.empty(C).uniform_(-4.0, 0.0))
        self.f_a_proj, self.f_b_proj = Lin(D, K), Lin(K, C)
        self.b_proj = Lin(D, H)
        self.g_proj = Lin(D, C)
        self.o_norm = Vec(K)
        self.o_proj = Lin(C, D, out_std)

    def conv(self, y, conv):
        """y [B,T,C] -> silu(causal depthwise conv), taps oldest..current."""
        W = self.c.W
        yt = F.pad(y.transpose(1, 2), (W - 1, 0))
        return F.silu(F.conv1d(yt, conv.weight, groups=y.shape[-1]).transpose(1, 2))

    def forward(self, x):
        c = self.c
        B, T, _ = x.shape
        H, K = c.H, c.K
        q = self.conv(self.q_proj(x), self.q_conv1d).view(B, T, H, K)
        k = self.conv(self.k_proj(x), self.k_conv1d).view(B, T, H, K)
        v = self.conv(self.v_proj(x), self.v_conv1d).view(B, T, H, K)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * (K ** -0.5)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        z = self.f_b_proj(self.f_a_proj(x)).view(B, T, H, K) + self.dt_bias.view(H, K)
        g = c.lb * torch.sigmoid(torch.exp(self.A_log).view(H, 1) * z)          # [B,T,H,K] in (lb, 0)
        beta = torch.sigmoid(self.b_proj(x))                                    # [B,T,H]
        o = kda_chunked(q, k, v, g, beta)                                      # [B,T,H,V]
        gate = self.g_proj(x).view(B, T, H, K)
        o = o * torch.rsqrt((o * o).mean(-1, keepdim=True) + c.eps) * self.o_norm.weight * torch.sigmoid(gate)
        return self.o_proj(o.reshape(B, T, H * K))


def kda_recurrent(q, k, v, g, beta):
    """Token by token (spec §4.4 step 6), state from zero. [B,T,H,K] ... -> o [B,T,H,V]."""
    B, T, H, K = q.shape
    S = q.new_zeros(B, H, K, v.shape[-1])
    outs = []
    for t in range(T):
        S = S * torch.exp(g[:, t]).unsqueeze(-1)
        kS = torch.einsum("bhk,bhkv->bhv", k[:, t], S)
        u = beta[:, t].unsqueeze(-1) * (v[:, t] - kS)
        S = S + k[:, t].unsqueeze(-1) * u.unsqueeze(-2)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(outs, 1)


def kda_chunked(q, k, v, g, beta, chunk=32):
    """The same recurrence in chunked WY form, batched, every product a matmul. State from zero.
    Inside a chunk with inclusive cumulative log-decay G_t (per key dim) and the chunk's middle
    m as reference (so no exponent exceeds 5 * chunk / 2 = 80 < 88 in magnitude: exp stays finite in fp32):
      A[t,s] = sum_d k_t e^(G_t - G_m) k_s e^(G_m - G_s)  (s < t),  (I + beta A) u = beta (v - (k e^G) S0)
      o_t    = (q_t e^(G_t)) S0 + sum_(s<=t) [sum_d q_t e^(G_t - G_m) k_s e^(G_m - G_s)] u_s
      S_end  = e^(G_C) S0 + sum_s (k_s e^(G_C - G_s)) u_s^T"""
    B, T, H, K = q.shape
    V = v.shape[-1]
    S = q.new_zeros(B, H, K, V)
    outs = []
    for c0 in range(0, T, chunk):
        qc = q[:, c0:c0 + chunk].transpose(1, 2)                        # [B,H,C,K]
        kc = k[:, c0:c0 + chunk].transpose(1, 2)
        vc = v[:, c0:c0 + chunk].transpose(1, 2)                        # [B,H,C,V]
        bc = beta[:, c0:c0 + chunk].transpose(1, 2).unsqueeze(-1)       # [B,H,C,1]
        G = torch.cumsum(g[:, c0:c0 + chunk].transpose(1, 2), 2)        # [B,H,C,K]
        C = G.shape[2]
        Gm = G[:, :, C // 2:C // 2 + 1]                                 # [B,H,1,K]
        kpos = kc * torch.exp(Gm - G)
        Akk = torch.matmul(kc * torch.exp(G - Gm), kpos.transpose(-1, -2))      # [B,H,C,C]
        Aqk = torch.matmul(qc * torch.exp(G - Gm), kpos.transpose(-1, -2))
        ones = torch.ones(C, C, dtype=torch.bool, device=q.device)
        zero = Akk.new_zeros(())
        Akk = torch.where(torch.tril(ones, -1), Akk, zero)           # s > t may overflow: selected away
        Aqk = torch.where(torch.tril(ones), Aqk, zero)
        eG = torch.exp(G)
        rhs = bc * (vc - torch.matmul(kc * eG, S))                      # [B,H,C,V]
        M = bc * Akk + torch.eye(C, device=q.device)
        u = torch.linalg.solve_triangular(M, rhs, upper=False, unitriangular=True)
        outs.append((torch.matmul(qc * eG, S) + torch.matmul(Aqk, u)).transpose(1, 2))   # [B,C,H,V]
        last = G[:, :, -1:]                                             # [B,H,1,K]
        kd = kc * torch.exp(last - G)                                   # [B,H,C,K]
        S = S * torch.exp(last).transpose(-1, -2) + torch.matmul(kd.transpose(-1, -2), u)
    return torch.cat(outs, 1)


class MLA(nn.Module):
    def __init__(self, c, out_std):
        super().__init__()
        D, Hm, dn, dr, dv, R, Q = c.D, c.Hm, c.dn, c.dr, c.dv, c.R, c.Q
        self.c = c
        self.q_a_proj, self.q_a_layernorm = Lin(D, Q), Vec(Q)
        self.q_b_proj = Lin(Q, Hm * (dn + dr))
        self.kv_a_proj_with_mqa, self.kv_a_layernorm = Lin(D, R + dr), Vec(R)
        self.kv_b_proj = Lin(R, Hm * (dn + dv))
        self.g_proj = Lin(D, Hm * dv)
        self.o_proj = Lin(Hm * dv, D, out_std)

    def forward(self, x):
        c = self.c
        B, T, _ = x.shape
        Hm, dn, dr, dv, R = c.Hm, c.dn, c.dr, c.dv, c.R
        q = self.q_b_proj(rms(self.q_a_proj(x), self.q_a_layernorm.weight, 1e-6)).view(B, T, Hm, dn + dr)
        ckv = self.kv_a_proj_with_mqa(x)
        cn = rms(ckv[..., :R], self.kv_a_layernorm.weight, 1e-6)
        kv = self.kv_b_proj(cn).view(B, T, Hm, dn + dv)
        kk = torch.cat([kv[..., :dn], ckv[..., R:].unsqueeze(2).expand(B, T, Hm, dr)], -1)   # NoPE
        s = torch.einsum("bthd,bshd->bhts", q, kk) * (dn + dr) ** -0.5
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
        o = torch.einsum("bhts,bshd->bthd", p, kv[..., dn:]).reshape(B, T, Hm * dv)
        o = o * torch.sigmoid(self.g_proj(x))
        return self.o_proj(o)


def situ(c, g, u):
    return (c.beta * torch.tanh(g / c.beta) * torch.sigmoid(g)) * (c.beta_lin * torch.tanh(u / c.beta_lin))


class MLP(nn.Module):
    def __init__(self, c, width, out_std):
        super().__init__()
        self.c = c
        self.gate_proj, self.up_proj = Lin(c.D, width), Lin(c.D, width)
        self.down_proj = Lin(width, c.D, out_std)

    def forward(self, x):
        return self.down_proj(situ(self.c, self.gate_proj(x), self.up_proj(x)))


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def mxfp4_round(w):
    """Values of mxfp4.quantize(w) dequantized (same rule: scale 2^(floor(log2 amax) - 2),
    nearest E2M1 magnitude, ties to the even index, saturate at 6). w [..., in], in % 32 == 0."""
    shp = w.shape
    x = w.detach().reshape(-1, 32)
    amax = x.abs().amax(-1, keepdim=True)
    _, ex = torch.frexp(amax)
    code = torch.clamp(ex - 3 + 127, 0, 254)
    scale = torch.ldexp(torch.ones_like(amax), code - 127)
    y = x.abs() / scale
    idx = torch.bucketize(y, MIDPOINTS, right=False)
    tie = (idx < 7) & (MIDPOINTS[idx.clamp(max=6)] == y)
    idx = torch.where(tie & (idx % 2 == 1), idx + 1, idx)
    q = E2M1[idx] * scale
    q = torch.where(torch.signbit(x), -q, q)
    q = torch.where(amax == 0, torch.zeros_like(q), q)
    return q.reshape(shp)


class MoE(nn.Module):
    def __init__(self, c, out_std):
        super().__init__()
        E, I, Dl, D = c.E, c.I, c.Dl, c.D
        self.c = c
        self.gate = Lin(D, E)
        self.gate.register_buffer("e_score_correction_bias", torch.zeros(E))
        self.routed_expert_down_proj = Lin(D, Dl)
        self.w1 = nn.Parameter(torch.randn(E, I, Dl) * Dl ** -0.5)
        self.w3 = nn.Parameter(torch.randn(E, I, Dl) * Dl ** -0.5)
        self.w2 = nn.Parameter(torch.randn(E, Dl, I) * I ** -0.5)
        self.routed_expert_norm = Vec(Dl)
        self.routed_expert_up_proj = Lin(Dl, D, out_std)
        self.shared_experts = MLP(c, I * c.n_shared, out_std)
        self.fake_quant = False
        self.last_load = None                                       # [E] tokens per expert, last batch

    def experts(self):
        ws = (self.w1, self.w3, self.w2)
        if self.fake_quant:                                         # straight-through MXFP4
            ws = tuple(w + (mxfp4_round(w) - w).detach() for w in ws)
        return ws

    def forward(self, x):
        c = self.c
        B, T, D = x.shape
        xf = x.reshape(B * T, D)
        s = torch.sigmoid(F.linear(xf, self.gate.weight))            # [N,E]
        sel = s.detach() + self.gate.e_score_correction_bias          # selection only
        idx = torch.topk(sel, c.k, -1).indices                       # [N,k]
        w = torch.gather(s, 1, idx)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * c.rsf
        self.last_load = torch.bincount(idx.reshape(-1), minlength=c.E).float()
        xl = self.routed_expert_down_proj(xf)                         # [N,Dl]
        w1, w3, w2 = self.experts()
        yl = xl.new_zeros(xl.shape)
        flat = idx.reshape(-1)
        order = torch.argsort(flat)
        counts = self.last_load.long().tolist()
        tok = order // c.k                                            # token of each sorted slot
        wt = w.reshape(-1)[order]
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            ts = tok[start:start + n]
            xe = xl[ts]
            h = situ(c, F.linear(xe, w1[e]), F.linear(xe, w3[e]))
            yl = yl.index_add(0, ts, F.linear(h, w2[e]) * wt[start:start + n, None])
            start += n
        yl = rms(yl, self.routed_expert_norm.weight, c.eps)
        y = self.routed_expert_up_proj(yl) + self.shared_experts(xf)
        return y.view(B, T, D)


class Layer(nn.Module):
    def __init__(self, c, i):
        super().__init__()
        out_std = (2 * c.L) ** -0.5 * 0.5 * (1.0 / math.sqrt(c.D))
        self.input_layernorm, self.post_attention_layernorm = Vec(c.D), Vec(c.D)
        self.self_attention_res_norm, self.mlp_res_norm = Vec(c.D), Vec(c.D)
        self.self_attention_res_proj, self.mlp_res_proj = Vec(1, c.D, value=0.0), Vec(1, c.D, value=0.0)
        self.self_attn = KDA(c, out_std) if c.is_kda(i) else MLA(c, out_std)
        if c.is_moe(i):
            self.block_sparse_moe = MoE(c, out_std)
        else:
            self.mlp = MLP(c, c.Id, out_std)


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = self.c = Cfg(cfg)
        self.embed_tokens = nn.Embedding(c.V, c.D)
        nn.init.normal_(self.embed_tokens.weight, 0.0, 1.0)
        self.layers = nn.ModuleList([Layer(c, i) for i in range(c.L)])
        self.norm = Vec(c.D)
        self.output_attn_res_norm, self.output_attn_res_proj = Vec(c.D), Vec(1, c.D, value=0.0)
        self.lm_head = Lin(c.D, c.V, c.D ** -0.5)

    def attnres(self, vals, norm, proj):
        V = torch.stack(vals)                                         # [n,B,T,D]
        kf = V * torch.rsqrt((V * V).mean(-1, keepdim=True) + self.c.eps)
        s = kf @ (norm.weight * proj.weight[0])                       # [n,B,T]
        a = torch.softmax(s, 0)
        return (a.unsqueeze(-1) * V).sum(0)

    def forward(self, ids):
        """ids [B,T] -> logits [B,T,V]."""
        c = self.c
        h = self.embed_tokens(ids)
        blocks = []
        for i, ly in enumerate(self.layers):
            ps = h
            a_in = ps if not blocks else self.attnres(blocks + [ps], ly.self_attention_res_norm,
                                                      ly.self_attention_res_proj)
            if i % c.block == 0:
                blocks.append(ps)
                ps = None
            att = ly.self_attn(rms(a_in, ly.input_layernorm.weight, c.eps))
            ps = att if ps is None else ps + att
            m_in = self.attnres(blocks + [ps], ly.mlp_res_norm, ly.mlp_res_proj)
            x2 = rms(m_in, ly.post_attention_layernorm.weight, c.eps)
            f = ly.block_sparse_moe(x2) if c.is_moe(i) else ly.mlp(x2)
            h = ps + f
        h = self.attnres(blocks + [h], self.output_attn_res_norm, self.output_attn_res_proj)
        return self.lm_head(rms(h, self.norm.weight, c.eps))

    def moes(self):
        return [ly.block_sparse_moe for ly in self.layers if hasattr(ly, "block_sparse_moe")]

    def fake_mxfp4(self, on):
        for m in self.moes():
            m.fake_quant = on

    @torch.no_grad()
    def update_routing_bias(self, rate):
        """K3/DeepSeek-V3 auxiliary-loss-free balancing: after each step, raise the selection
        bias of experts that got fewer tokens than the mean and lower it for those above."""
        for m in self.moes():
            load = m.last_load
            m.gate.e_score_correction_bias += rate * torch.sign(load.mean() - load)

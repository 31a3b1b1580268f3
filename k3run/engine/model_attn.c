/*
 * model_attn.c - the two attention kinds of Kimi K3 (spec §4.4, §4.5).
 *
 * KDA: short causal conv with its state, SiLU, L2 norm and q scale, the
 * lower-bounded (or softplus) forget gate, beta, decay-then-delta recurrence,
 * gated RMSNorm with the full-rank (or low-rank) output gate.
 * MLA: q-LoRA, NoPE, a latent cache of the normed c and the raw k_rope, the
 * absorbed form for every token (prompt and decode alike, so a batch equals
 * token-by-token), the sigmoid output gate.
 *
 * The recurrence and the attention run per head in parallel; each head's
 * arithmetic is sequential in a fixed order, so threads change nothing.
 */
#include "model_impl.h"

#include <math.h>
#include <string.h>

#include "k3_math.h"

/* BF16 -> fp32, exact (the bits are the top half); inline for the latent loops */
static inline float bf16f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Depthwise causal conv + SiLU over T tokens of one projection, in place.
   y: [T][C] pre-conv inputs -> outputs; win: [C][W-1] state, moved past the T tokens unless
   keep; taps: [C][W]; tmp: [W-1+T]. */
static void short_conv(float *y, float *win, const float *taps, uint32_t C, uint32_t W, uint32_t T, int keep,
                       float *tmp)
{
    uint32_t h = W - 1;
    for (uint32_t c = 0; c < C; c++) {
        for (uint32_t i = 0; i < h; i++) tmp[i] = win[(size_t)c * h + i];
        for (uint32_t t = 0; t < T; t++) tmp[h + t] = y[(size_t)t * C + c];
        const float *w = taps + (size_t)c * W;
        for (uint32_t t = 0; t < T; t++) {
            float acc = w[0] * tmp[t];                       /* oldest tap first, current last */
            for (uint32_t i = 1; i < W; i++) acc = acc + w[i] * tmp[t + i];
            y[(size_t)t * C + c] = k3_siluf(acc);
        }
        if (!keep)
            for (uint32_t i = 0; i < h; i++) win[(size_t)c * h + i] = tmp[T + i];
    }
}

/* One token's update of one head's state: S <- S * exp(g); u = beta (v - S^T k); S += k u^T.
   S: [K][K]; g, k, v: [K]; ks: [K] scratch. The one copy of this arithmetic: a verify pass's
   commit replays it on the same inputs, so its state is the same bits. */
static void kda_step(float *S, const float *g, const float *k, const float *v, float beta, uint32_t K, float *ks)
{
    for (uint32_t a = 0; a < K; a++) {
        float e = k3_expf(g[a]);
        for (uint32_t b = 0; b < K; b++) S[a * K + b] = S[a * K + b] * e;
    }
    for (uint32_t b = 0; b < K; b++) ks[b] = 0.0f;
    for (uint32_t a = 0; a < K; a++)
        for (uint32_t b = 0; b < K; b++) ks[b] = ks[b] + k[a] * S[a * K + b];
    for (uint32_t b = 0; b < K; b++) ks[b] = beta * (v[b] - ks[b]);       /* u */
    for (uint32_t a = 0; a < K; a++)
        for (uint32_t b = 0; b < K; b++) S[a * K + b] = S[a * K + b] + k[a] * ks[b];
}

k3_err k3_kda(k3_model *m, int layer, uint32_t T, const float *x, float *out, k3_diag *d)
{
    (void)d;
    const k3_dims *z = &m->d;
    const k3_config *c = m->cfg;
    k3_weights *w = m->w;
    uint32_t C = z->C, H = z->H, K = z->K, W = z->W;
    kda_state *st = &m->kda[layer];
    float *q = m->t0, *k = m->t1, *v = m->t2, *g = m->t3, *o = m->t4;   /* [T][C] each */
    {
        const k3_tensor *tq[3] = {k3w_get(w, layer, K3W_KDA_Q), k3w_get(w, layer, K3W_KDA_K), k3w_get(w, layer, K3W_KDA_V)};
        float *yq[3] = {q, k, v};
        k3_lin_n(m, 3, tq, x, T, yq);
    }
    float *proj[3] = {q, k, v};
    const k3_wid conv_id[3] = {K3W_KDA_QCONV, K3W_KDA_KCONV, K3W_KDA_VCONV};
    uint32_t RW = KDA_REC(C, H);
    float *rec = m->verifying ? st->rec : NULL;                      /* [T][RW] */
    for (int j = 0; rec && j < 3; j++)
        for (uint32_t t = 0; t < T; t++)
            memcpy(rec + (size_t)t * RW + (size_t)(KDA_REC_PRE + j) * C, proj[j] + (size_t)t * C, C * sizeof(float));
    for (int j = 0; j < 3; j++) {
        float *taps = m->conv_w + (size_t)j * C * W;                   /* [C][W] */
        k3w_vec(k3w_get(w, layer, conv_id[j]), taps);
        short_conv(proj[j], st->win + (size_t)j * C * (W - 1), taps, C, W, T, rec != NULL, m->convtmp);
    }
    /* L2 norm per head, then q * K^-0.5 (pitfall 5) */
    float qscale = (float)(1.0 / sqrt((double)K));
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t hh = 0; hh < H; hh++) {
            float *qh = q + (size_t)t * C + hh * K, *kh = k + (size_t)t * C + hh * K;
            float nq = sqrtf((float)k3v_sumsq(qh, K) + 1e-6f), nk = sqrtf((float)k3v_sumsq(kh, K) + 1e-6f);
            for (uint32_t i = 0; i < K; i++) { qh[i] = qh[i] / nq * qscale; kh[i] = kh[i] / nk; }
        }
    /* forget gate g [T][C] and beta [T][H] */
    float *fa = m->small;                                             /* [T][fa_rank] */
    k3_lin(m, k3w_get(w, layer, K3W_KDA_FA), x, T, fa);
    k3_lin(m, k3w_get(w, layer, K3W_KDA_FB), fa, T, g);
    k3w_vec(k3w_get(w, layer, K3W_KDA_DTBIAS), m->headvec);           /* [C] */
    k3w_vec(k3w_get(w, layer, K3W_KDA_ALOG), m->alog);                /* [H] */
    for (uint32_t hh = 0; hh < H; hh++) m->alog[hh] = k3_expf(m->alog[hh]);
    float lb = (float)c->kda_gate_lower_bound;
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t i = 0; i < C; i++) {
            float zz = g[(size_t)t * C + i] + m->headvec[i], A = m->alog[i / K];
            g[(size_t)t * C + i] = c->kda_has_lower_bound ? lb * k3_sigmoidf(A * zz) : -A * k3_softplusf(zz);
        }
    float *beta = m->small;                                           /* [T][H] (fa is used up) */
    k3_lin(m, k3w_get(w, layer, K3W_KDA_B), x, T, beta);
    k3_sigmoid_n((int)m->o.isa, beta, (size_t)T * H);

    if (rec)
        for (uint32_t t = 0; t < T; t++) {
            float *r = rec + (size_t)t * RW;
            memcpy(r + (size_t)KDA_REC_K * C, k + (size_t)t * C, C * sizeof(float));
            memcpy(r + (size_t)KDA_REC_V * C, v + (size_t)t * C, C * sizeof(float));
            memcpy(r + (size_t)KDA_REC_G * C, g + (size_t)t * C, C * sizeof(float));
            memcpy(r + (size_t)KDA_REC_BETA * C, beta + (size_t)t * H, H * sizeof(float));
        }

    /* recurrence per head (kda_step), then o = S^T q; a verify pass runs it on a copy of S */
    K3_PFOR(1, for (uint32_t hh = 0; hh < H; hh++) {
        float *S = st->S + (size_t)hh * K * K;                       /* [K][V] */
        if (rec) {
            float *Sw = m->kda_work + (size_t)hh * K * K;
            memcpy(Sw, S, (size_t)K * K * sizeof(float));
            S = Sw;
        }
        float *ks = m->headtmp + (size_t)hh * 2 * K;                 /* [K] */
        for (uint32_t t = 0; t < T; t++) {
            const float *gt = g + (size_t)t * C + hh * K, *kt = k + (size_t)t * C + hh * K;
            const float *qt = q + (size_t)t * C + hh * K, *vt = v + (size_t)t * C + hh * K;
            kda_step(S, gt, kt, vt, beta[(size_t)t * H + hh], K, ks);
            float *ot = o + (size_t)t * C + hh * K;
            for (uint32_t b = 0; b < K; b++) ot[b] = 0.0f;
            for (uint32_t a = 0; a < K; a++)
                for (uint32_t b = 0; b < K; b++) ot[b] = ot[b] + qt[a] * S[a * K + b];
        }
    });
    /* output gate (of x, pitfall 7) and gated RMSNorm per head */
    float *gate = m->t3;                                              /* [T][C] (g is used up) */
    if (c->kda_full_rank_gate) {
        k3_lin(m, k3w_get(w, layer, K3W_KDA_G), x, T, gate);
    } else {
        float *ga = m->small;                                         /* [T][ga_rank] */
        k3_lin(m, k3w_get(w, layer, K3W_KDA_GA), x, T, ga);
        k3_lin(m, k3w_get(w, layer, K3W_KDA_GB), ga, T, gate);
    }
    k3w_vec(k3w_get(w, layer, K3W_KDA_ONORM), m->headvec);           /* [K] */
    k3_sigmoid_n((int)m->o.isa, gate, (size_t)T * C);                 /* the gate's sigmoid, in place */
    float eps = (float)c->rms_norm_eps;
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t hh = 0; hh < H; hh++) {
            float *oh = o + (size_t)t * C + hh * K;
            const float *gh = gate + (size_t)t * C + hh * K;
            float r = k3_rsqrtf((float)(k3v_sumsq(oh, K) / K) + eps);
            for (uint32_t i = 0; i < K; i++) oh[i] = (oh[i] * r) * m->headvec[i] * gh[i];
        }
    k3_lin(m, k3w_get(w, layer, K3W_KDA_O), o, T, out);
    return K3_OK;
}

void k3_kda_commit(k3_model *m, int layer, uint32_t n)
{
    const k3_dims *z = &m->d;
    uint32_t C = z->C, H = z->H, K = z->K, h = z->W - 1, RW = KDA_REC(C, H);
    kda_state *st = &m->kda[layer];
    const float *rec = st->rec;                                       /* [T][RW] */
    /* conv windows: the last W-1 of (window, pre-conv inputs of tokens 0..n) per channel */
    for (uint32_t j = 0; j < 3 && h; j++)
        for (uint32_t c = 0; c < C; c++) {
            float *win = st->win + (size_t)j * C * h + (size_t)c * h;  /* [W-1] */
            float *tmp = m->convtmp;                                  /* [W-1+T] */
            for (uint32_t i = 0; i < h; i++) tmp[i] = win[i];
            for (uint32_t t = 0; t < n; t++) tmp[h + t] = rec[(size_t)t * RW + (size_t)(KDA_REC_PRE + j) * C + c];
            for (uint32_t i = 0; i < h; i++) win[i] = tmp[n + i];
        }
    K3_PFOR(1, for (uint32_t hh = 0; hh < H; hh++) {
        float *S = st->S + (size_t)hh * K * K, *ks = m->headtmp + (size_t)hh * 2 * K;
        for (uint32_t t = 0; t < n; t++) {
            const float *r = rec + (size_t)t * RW;
            kda_step(S, r + (size_t)KDA_REC_G * C + hh * K, r + (size_t)KDA_REC_K * C + hh * K,
                     r + (size_t)KDA_REC_V * C + hh * K, r[(size_t)KDA_REC_BETA * C + hh], K, ks);
        }
    });
}

k3_err k3_mla(k3_model *m, int layer, uint32_t T, const float *x, float *out, k3_diag *d)
{
    (void)d;
    const k3_dims *z = &m->d;
    const k3_config *c = m->cfg;
    k3_weights *w = m->w;
    uint32_t Hm = z->Hm, dn = z->dn, dr = z->dr, dv = z->dv, R = z->R, qd = dn + dr;
    float *q = m->t0;                                                 /* [T][Hm*(dn+dr)] */
    float *ckv = m->t1;                                               /* [T][R+dr] */
    float *o = m->t2;                                                 /* [T][Hm*dv] */
    float *gt = m->t3;                                                /* [T][Hm*dv] output gate */
    /* the projections of x in one region when all are in memory (else in the unit's order) */
    const k3_tensor *tx[3] = {k3w_get(w, layer, z->Q ? K3W_MLA_QA : K3W_MLA_Q), k3w_get(w, layer, K3W_MLA_KVA),
                              c->mla_use_output_gate ? k3w_get(w, layer, K3W_MLA_G) : NULL};
    float *yx[3] = {z->Q ? m->small : q, ckv, gt};                    /* qa [T][Q] */
    int fused = k3_lin_fused(m, c->mla_use_output_gate ? 3 : 2, tx, x, T, yx);
    if (!fused) k3_lin(m, tx[0], x, T, yx[0]);
    if (z->Q) {
        float *qa = m->small;                                         /* [T][Q] */
        k3w_vec(k3w_get(w, layer, K3W_MLA_QANORM), m->headvec);
        for (uint32_t t = 0; t < T; t++) k3v_rmsnorm(qa + (size_t)t * z->Q, qa + (size_t)t * z->Q, m->headvec, z->Q, 1e-6f);
        k3_lin(m, k3w_get(w, layer, K3W_MLA_QB), qa, T, q);
    }
    if (!fused) k3_lin(m, tx[1], x, T, ckv);
    size_t slot = (size_t)m->mla_slot[layer], ctx = m->o.context;
    float *cache_c = m->mla_c + slot * ctx * R, *cache_kr = m->mla_kr + slot * ctx * dr;   /* [ctx][R], [ctx][dr] */
    k3w_vec(k3w_get(w, layer, K3W_MLA_KVANORM), m->headvec);
    for (uint32_t t = 0; t < T; t++) {
        size_t p = m->pos + t;
        k3v_rmsnorm(cache_c + p * R, ckv + (size_t)t * (R + dr), m->headvec, R, 1e-6f);   /* eps 1e-6 (pitfall 3) */
        memcpy(cache_kr + p * dr, ckv + (size_t)t * (R + dr) + R, dr * sizeof(float));  /* k_rope: not normed */
    }
    const k3_tensor *kvb = k3w_get(w, layer, K3W_MLA_KVB);             /* [Hm*(dn+dv)][R] BF16 */
    const uint16_t *kvb_w = kvb->mat.data;
    float scale = (float)(1.0 / sqrt((double)qd));
    for (uint32_t t = 0; t < T; t++) {
        uint32_t np = m->pos + t + 1;                                 /* positions visible: 0 .. pos+t */
        K3_PFOR(1, for (uint32_t hh = 0; hh < Hm; hh++) {
            const float *qn = q + (size_t)t * Hm * qd + (size_t)hh * qd, *qr = qn + dn;
            float *ql = m->mla_q + (size_t)hh * R, *s = m->mla_s + (size_t)hh * ctx, *ol = m->mla_ol + (size_t)hh * R;
            /* q_hat = W_UK_h^T q_nope, in increasing d */
            for (uint32_t r = 0; r < R; r++) ql[r] = 0.0f;
            for (uint32_t dd = 0; dd < dn; dd++) {
                const uint16_t *row = kvb_w + ((size_t)hh * (dn + dv) + dd) * R;
                float qv = qn[dd];
                for (uint32_t r = 0; r < R; r++) ql[r] = ql[r] + qv * bf16f(row[r]);
            }
            float mx = -INFINITY;
            for (uint32_t tau = 0; tau < np; tau++) {
                s[tau] = (k3v_dot(ql, cache_c + (size_t)tau * R, R) + k3v_dot(qr, cache_kr + (size_t)tau * dr, dr)) * scale;
                if (s[tau] > mx) mx = s[tau];
            }
            double sum = 0;
            for (uint32_t tau = 0; tau < np; tau++) { s[tau] = k3_expf(s[tau] - mx); sum += s[tau]; }
            for (uint32_t r = 0; r < R; r++) ol[r] = 0.0f;
            for (uint32_t tau = 0; tau < np; tau++) {
                float p = (float)(s[tau] / sum);
                const float *cr = cache_c + (size_t)tau * R;
                for (uint32_t r = 0; r < R; r++) ol[r] = ol[r] + p * cr[r];
            }
            /* o_h = W_UV_h ol: rows [h*(dn+dv)+dn, (h+1)*(dn+dv)) of kv_b, canonical kernel order */
            k3_mat uv = {.enc = K3_ENC_BF16, .rows = dv, .cols = R,
                         .data = kvb_w + ((size_t)hh * (dn + dv) + dn) * R};
            k3_matmul_rows(m->o.isa, &uv, ol, R, 1, o + (size_t)t * Hm * dv + (size_t)hh * dv, dv, 0, dv);
        });
    }
    if (c->mla_use_output_gate) {
        if (!fused) k3_lin(m, tx[2], x, T, gt);
        k3_sigmoid_n((int)m->o.isa, gt, (size_t)T * Hm * dv);
        for (size_t i = 0; i < (size_t)T * Hm * dv; i++) o[i] = o[i] * gt[i];
    }
    k3_lin(m, k3w_get(w, layer, K3W_MLA_O), o, T, out);
    return K3_OK;
}

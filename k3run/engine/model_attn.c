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
 * The recurrence runs per head in parallel, the attention's steps per head,
 * position or column (mla_attend); every value's arithmetic is sequential in a
 * fixed order (kernels/attn.h, scalar and AVX2 alike), so threads change nothing.
 */
#include "model_impl.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "attn.h"
#include "k3_math.h"

/* Depthwise causal conv over T tokens of one projection, in place (the SiLU after it is the
   caller's, on the whole [T][C] at once). y: [T][C] pre-conv inputs -> conv outputs; win: [C][W-1]
   state, moved past the T tokens unless keep; taps: [C][W]; tmp: [W-1+T]. */
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
            y[(size_t)t * C + c] = acc;
        }
        if (!keep)
            for (uint32_t i = 0; i < h; i++) win[(size_t)c * h + i] = tmp[T + i];
    }
}

/* The recurrence itself (S <- S * exp(g); u = beta (v - S^T k); S += k u^T; o = S^T q) is
   k3_kda_tokens (kernels/attn.h), the one copy of this arithmetic: a verify pass's commit replays
   it on the same inputs, so its state is the same bits. exp(g) is k3_exp_n's, which gives every
   element k3_expf's bits on every path. */

k3_err k3_kda(k3_model *m, int layer, uint32_t T, const float *x, float *out, k3_diag *d)
{
    (void)d;
    const k3_dims *z = &m->d;
    const k3_config *c = m->cfg;
    k3_weights *w = m->w;
    uint32_t C = z->C, H = z->H, K = z->K, W = z->W;
    float *q = m->t0, *k = m->t1, *v = m->t2, *g = m->t3, *o = m->t4;   /* [T][C] each */
    {
        const k3_tensor *tq[3] = {k3w_get(w, layer, K3W_KDA_Q), k3w_get(w, layer, K3W_KDA_K), k3w_get(w, layer, K3W_KDA_V)};
        float *yq[3] = {q, k, v};
        k3_lin_n(m, 3, tq, x, T, yq);
    }
    float *proj[3] = {q, k, v};
    const k3_wid conv_id[3] = {K3W_KDA_QCONV, K3W_KDA_KCONV, K3W_KDA_VCONV};
    uint32_t RW = KDA_REC(C, H);
    for (int j = 0; j < 3; j++) {
        float *taps = m->conv_w + (size_t)j * C * W;                   /* [C][W] */
        k3w_vec(k3w_get(w, layer, conv_id[j]), taps);
    }
    /* each sequence's rows through its own conv window (a verify pass: recorded, the window kept) */
    for (uint32_t gi = 0; gi < m->n_grp; gi++) {
        const k3_group *gr = &m->grp[gi];
        kda_state *st = &gr->sq->kda[layer];
        float *rec = gr->verify ? st->rec : NULL;                     /* [T][RW] */
        for (int j = 0; rec && j < 3; j++)
            for (uint32_t t = 0; t < gr->T; t++)
                memcpy(rec + (size_t)t * RW + (size_t)(KDA_REC_PRE + j) * C, proj[j] + (size_t)(gr->row0 + t) * C,
                       C * sizeof(float));
        for (int j = 0; j < 3; j++)
            short_conv(proj[j] + (size_t)gr->row0 * C, st->win + (size_t)j * C * (W - 1), m->conv_w + (size_t)j * C * W,
                       C, W, gr->T, rec != NULL, m->convtmp);
    }
    for (int j = 0; j < 3; j++) k3_silu_n(m->o.isa, proj[j], (size_t)T * C);   /* SiLU after the conv */
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
    if (c->kda_has_lower_bound) {                  /* lb * sigmoid(A z), the sigmoid on the array at once */
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t i = 0; i < C; i++) g[(size_t)t * C + i] = m->alog[i / K] * (g[(size_t)t * C + i] + m->headvec[i]);
        k3_sigmoid_n((int)m->o.isa, g, (size_t)T * C);
        for (size_t i = 0; i < (size_t)T * C; i++) g[i] = lb * g[i];
    } else
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t i = 0; i < C; i++) {
                float zz = g[(size_t)t * C + i] + m->headvec[i], A = m->alog[i / K];
                g[(size_t)t * C + i] = -A * k3_softplusf(zz);
            }
    float *beta = m->small;                                           /* [T][H] (fa is used up) */
    k3_lin(m, k3w_get(w, layer, K3W_KDA_B), x, T, beta);
    k3_sigmoid_n((int)m->o.isa, beta, (size_t)T * H);

    for (uint32_t gi = 0; gi < m->n_grp; gi++) {
        const k3_group *gr = &m->grp[gi];
        float *rec = gr->verify ? gr->sq->kda[layer].rec : NULL;      /* [T][RW] */
        for (uint32_t t = 0; rec && t < gr->T; t++) {
            float *r = rec + (size_t)t * RW;
            size_t row = gr->row0 + t;
            memcpy(r + (size_t)KDA_REC_K * C, k + row * C, C * sizeof(float));
            memcpy(r + (size_t)KDA_REC_V * C, v + row * C, C * sizeof(float));
            memcpy(r + (size_t)KDA_REC_G * C, g + row * C, C * sizeof(float));
            memcpy(r + (size_t)KDA_REC_BETA * C, beta + row * H, H * sizeof(float));
        }
    }

    /* recurrence per sequence and head, with o = S^T q; a verify pass runs it on a copy of S */
    float *e = g;                                                     /* [T][C] the decay exp(g), in place */
    k3_exp_n((int)m->o.isa, e, (size_t)T * C);
    for (uint32_t gi = 0; gi < m->n_grp; gi++) {
        const k3_group *gr = &m->grp[gi];
        kda_state *st = &gr->sq->kda[layer];
        int verify = gr->verify;
        size_t r0 = gr->row0;
        uint32_t n = gr->T;
        K3_PFOR(1, for (uint32_t hh = 0; hh < H; hh++) {
            float *S = st->S + (size_t)hh * K * K;                   /* [K][V] */
            if (verify) {
                float *Sw = m->kda_work + (size_t)hh * K * K;
                memcpy(Sw, S, (size_t)K * K * sizeof(float));
                S = Sw;
            }
            float *ks = m->headtmp + (size_t)hh * 2 * K;             /* [K] */
            size_t h0 = r0 * C + (size_t)hh * K;
            k3_kda_tokens((int)m->o.isa, S, K, n, e + h0, k + h0, v + h0, q + h0, o + h0, C, beta + r0 * H + hh, H, ks);
        });
    }
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

void k3_kda_commit(k3_model *m, k3_seq *sq, int layer, uint32_t n)
{
    const k3_dims *z = &m->d;
    uint32_t C = z->C, H = z->H, K = z->K, h = z->W - 1, RW = KDA_REC(C, H);
    kda_state *st = &sq->kda[layer];
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
        float *S = st->S + (size_t)hh * K * K;                       /* [K][V] */
        float *ks = m->headtmp + (size_t)hh * 2 * K, *e = ks + K;     /* [K] scratch, [K] decay */
        for (uint32_t t = 0; t < n; t++) {                            /* the pass's tokens 0 .. n-1, one at a time */
            const float *r = rec + (size_t)t * RW;
            memcpy(e, r + (size_t)KDA_REC_G * C + hh * K, K * sizeof(float));
            k3_exp_n((int)m->o.isa, e, K);
            k3_kda_tokens((int)m->o.isa, S, K, 1, e, r + (size_t)KDA_REC_K * C + hh * K,
                          r + (size_t)KDA_REC_V * C + hh * K, NULL, NULL, 0, r + (size_t)KDA_REC_BETA * C + hh, 0, ks);
        }
    });
}

/* One pass of MLA attention: the T tokens' queries against the latent cache (already holding them). */
typedef struct mla_job {
    k3_model *m;
    const float *q;                           /* [T][Hm*(dn+dr)] queries */
    float *o;                                 /* [T][Hm*dv] out */
    const float *cache_c, *cache_kr;          /* [ctx][R], [ctx][dr] */
    const uint16_t *kvb_w;                    /* [Hm*(dn+dv)][R] BF16 kv_b */
    uint32_t T, pos;                          /* tokens, and the position of the first */
    float scale;
} mla_job;

/* [a, b): thread tid's share of n items, cut at multiples of unit (the vector forms' blocks) */
static void share(uint32_t n, uint32_t unit, int tid, int nth, uint32_t *a, uint32_t *b)
{
    uint64_t units = (n + unit - 1) / unit;
    uint64_t ua = units * (uint64_t)tid / (uint64_t)nth * unit, ub = units * (uint64_t)(tid + 1) / (uint64_t)nth * unit;
    *a = (uint32_t)(ua < n ? ua : n);
    *b = (uint32_t)(ub < n ? ub : n);
}

/*
 * Thread tid of nth (every thread of the team calls it; nth = 1 outside a parallel region). Per
 * token, four steps with a barrier before each:
 *   1. the scores of every head, the positions shared between the threads;
 *   2. the softmax of the thread's heads;
 *   3. ol = sum p c_tau of every head, the columns r shared;
 *   4. o = W_UV ol for the thread's heads, and their q_hat of the next token.
 * Each step splits only independent values (attn.h), so every value is the one the single-thread
 * order computes. Steps 1 and 3 share the cache, not the heads, between the threads: a block of
 * the cache, once read, serves every head, so a token reads the cache (from memory, at long
 * contexts) once for its scores and once for its values, whatever the number of heads and threads.
 */
static void mla_attend(const mla_job *j, int tid, int nth)
{
    k3_model *m = j->m;
    const k3_dims *z = &m->d;
    uint32_t Hm = z->Hm, dn = z->dn, dr = z->dr, dv = z->dv, R = z->R, qd = dn + dr;
    int isa = (int)m->o.isa;
    size_t ctx = m->o.context;
    float *ql = m->mla_q, *s = m->mla_s, *ol = m->mla_ol;            /* [Hm][R], [Hm][ctx], [Hm][R] */
    uint32_t ha, hb, a, b;
    share(Hm, 1, tid, nth, &ha, &hb);
    for (uint32_t t = 0; t < j->T; t++) {
        uint32_t np = j->pos + t + 1;                       /* positions visible: 0 .. pos+t */
        const float *qt = j->q + (size_t)t * Hm * qd;                 /* [Hm][dn+dr] */
        /* q_hat = W_UK_h^T q_nope, in increasing d (the rows of kv_b for the head's nope part) */
        if (t == 0)
            for (uint32_t hh = ha; hh < hb; hh++)
                k3_mla_qhat(isa, ql + (size_t)hh * R, qt + (size_t)hh * qd, j->kvb_w + (size_t)hh * (dn + dv) * R, R, dn, R);
        if (nth > 1) { _Pragma("omp barrier") }
        /* scores in k3v_dot's order */
        share(np, 4, tid, nth, &a, &b);
        k3_mla_scores(isa, s, ctx, ql, R, qt + dn, qd, Hm, j->cache_c, j->cache_kr, a, b, R, dr, j->scale);
        if (nth > 1) { _Pragma("omp barrier") }
        /* softmax: k3_expf's bits, the sum in double in order; s becomes p */
        for (uint32_t hh = ha; hh < hb; hh++) k3_mla_softmax(isa, s + (size_t)hh * ctx, np);
        if (nth > 1) { _Pragma("omp barrier") }
        /* ol = sum over tau of p c_tau */
        share(R, 8, tid, nth, &a, &b);
        k3_mla_values(isa, ol, R, s, ctx, Hm, j->cache_c, np, R, a, b);
        if (nth > 1) { _Pragma("omp barrier") }
        /* o_h = W_UV_h ol: rows [h*(dn+dv)+dn, (h+1)*(dn+dv)) of kv_b, canonical kernel order */
        for (uint32_t hh = ha; hh < hb; hh++) {
            k3_mat uv = {.enc = K3_ENC_BF16, .rows = dv, .cols = R, .data = j->kvb_w + ((size_t)hh * (dn + dv) + dn) * R};
            k3_matmul_rows(m->o.isa, &uv, ol + (size_t)hh * R, R, 1, j->o + (size_t)t * Hm * dv + (size_t)hh * dv, dv, 0, dv);
        }
        if (t + 1 < j->T)                                             /* the next token's q_hat (its scores wait) */
            for (uint32_t hh = ha; hh < hb; hh++)
                k3_mla_qhat(isa, ql + (size_t)hh * R, qt + (size_t)Hm * qd + (size_t)hh * qd,
                            j->kvb_w + (size_t)hh * (dn + dv) * R, R, dn, R);
    }
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
    k3w_vec(k3w_get(w, layer, K3W_MLA_KVANORM), m->headvec);
    const k3_tensor *kvb = k3w_get(w, layer, K3W_MLA_KVB);             /* [Hm*(dn+dv)][R] BF16 */
    const uint16_t *kvb_w = kvb->mat.data;
    float scale = (float)(1.0 / sqrt((double)qd));
    for (uint32_t gi = 0; gi < m->n_grp; gi++) {                      /* each sequence against its own cache */
        const k3_group *gr = &m->grp[gi];
        k3_seq *sq = gr->sq;
        float *cache_c = sq->mla_c + slot * ctx * R, *cache_kr = sq->mla_kr + slot * ctx * dr;   /* [ctx][R], [ctx][dr] */
        for (uint32_t t = 0; t < gr->T; t++) {
            size_t p = sq->pos + t, row = gr->row0 + t;
            k3v_rmsnorm(cache_c + p * R, ckv + row * (R + dr), m->headvec, R, 1e-6f);   /* eps 1e-6 (pitfall 3) */
            memcpy(cache_kr + p * dr, ckv + row * (R + dr) + R, dr * sizeof(float));  /* k_rope: not normed */
        }
        mla_job job = {m, q + (size_t)gr->row0 * Hm * qd, o + (size_t)gr->row0 * Hm * dv, cache_c, cache_kr, kvb_w,
                       gr->T, sq->pos, scale};
        if (omp_get_max_threads() > 1) {                              /* as K3_PFOR: no team of one */
            _Pragma("omp parallel")
            mla_attend(&job, omp_get_thread_num(), omp_get_num_threads());
        } else {
            mla_attend(&job, 0, 1);
        }
    }
    if (c->mla_use_output_gate) {
        if (!fused) k3_lin(m, tx[2], x, T, gt);
        k3_sigmoid_n((int)m->o.isa, gt, (size_t)T * Hm * dv);
        for (size_t i = 0; i < (size_t)T * Hm * dv; i++) o[i] = o[i] * gt[i];
    }
    k3_lin(m, k3w_get(w, layer, K3W_MLA_O), o, T, out);
    return K3_OK;
}

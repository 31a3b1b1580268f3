/*
 * model_ffn.c - the feed-forward layers (spec §4.6): the dense SiTU (or
 * SwiGLU) FFN and the latent MoE: fp32 sigmoid router, bias for selection
 * only, renormalised weights times the scaling factor, latent down/up
 * projections, latent norm, shared experts.
 *
 * The routed experts themselves are model_experts.c's (this process's share)
 * and model_dist.c's (the other MPI ranks' share, dist.h).
 *
 * Lookahead (issue 16): at the end of each FFN, the next layer's router is
 * applied to the hidden state as it stands (its AttnRes mix and norm without
 * its attention), and the experts it names are read into the cache while the
 * next layer's attention computes. Only scratch is written, so what is
 * computed stays the same bits; docs/PERFORMANCE.md measures what it reads.
 */
#include "model_impl.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "k3_math.h"

static void lookahead(k3_model *m, int layer, uint32_t T, const float *out);

k3_err k3_dense(k3_model *m, int layer, uint32_t T, const float *x, float *out, k3_diag *d)
{
    (void)d;
    const k3_dims *z = &m->d;
    const k3_tensor *tg[2] = {k3w_get(m->w, layer, K3W_FFN_GATE), k3w_get(m->w, layer, K3W_FFN_UP)};
    float *yg[2] = {m->g, m->u};                                      /* [T][I] each */
    k3_lin_n(m, 2, tg, x, T, yg);
    k3_glu(m, m->g, m->u, T * z->I);
    k3_lin(m, k3w_get(m->w, layer, K3W_FFN_DOWN), m->g, T, out);
    lookahead(m, layer, T, out);
    return K3_OK;
}

/* Router logits st [E] to scores in place: sigmoid, or softmax over the experts. */
static void router_scores(const k3_model *m, float *st, uint32_t E)
{
    const k3_config *c = m->cfg;
    if (c->router_act == K3_ROUTER_SIGMOID) {
        k3_sigmoid_n((int)m->o.isa, st, E);
    } else {
        float mx = -INFINITY;
        for (uint32_t e = 0; e < E; e++) if (st[e] > mx) mx = st[e];
        double sum = 0;
        for (uint32_t e = 0; e < E; e++) { st[e] = k3_expf(st[e] - mx); sum += st[e]; }
        for (uint32_t e = 0; e < E; e++) st[e] = (float)(st[e] / sum);
    }
}

/* Top-k of sel [E] by value descending, ties to the lower index (a stable
   sort, as the reference); NaN counts as -inf. idx [k]. */
static void top_k(float *sel, uint32_t E, uint32_t k, int32_t *idx)
{
    uint32_t n = 0;
    for (uint32_t e = 0; e < E; e++) {
        float v = sel[e];
        if (v != v) v = sel[e] = -INFINITY;
        if (n == k && !(v > sel[idx[k - 1]])) continue;
        uint32_t pos = n < k ? n : k - 1;
        while (pos > 0 && v > sel[idx[pos - 1]]) {      /* equal entries keep their earlier place */
            idx[pos] = idx[pos - 1];
            pos--;
        }
        idx[pos] = (int32_t)e;
        if (n < k) n++;
    }
}

k3_err k3_moe(k3_model *m, int layer, uint32_t T, const float *x, float *out, k3_diag *d)
{
    const k3_dims *z = &m->d;
    const k3_config *c = m->cfg;
    k3_weights *w = m->w;
    uint32_t E = z->E, k = z->k, Dl = z->Dl;
    float *s = m->logits_e;                                           /* [T][E] */
    int fused;
    {   /* the products of x in one region: router, latent down, the shared experts' gate and up */
        const k3_tensor *tx[4] = {k3w_get(w, layer, K3W_MOE_ROUTER), NULL, NULL, NULL};
        float *yx[4] = {s, NULL, NULL, NULL};
        int n = 1;
        if (c->routed_expert_hidden_size) { tx[n] = k3w_get(w, layer, K3W_MOE_LAT_DOWN); yx[n++] = m->xl; }  /* [T][Dl] */
        if (z->Ish) {
            tx[n] = k3w_get(w, layer, K3W_MOE_SH_GATE); yx[n++] = m->g;                           /* [T][Ish] */
            tx[n] = k3w_get(w, layer, K3W_MOE_SH_UP); yx[n++] = m->u;
        }
        fused = k3_lin_fused(m, n, tx, x, T, yx);
        if (!fused)     /* a tensor in row pieces: the unit's order (the shared experts last) */
            for (int j = 0; j < (z->Ish ? n - 2 : n); j++) k3_lin(m, tx[j], x, T, yx[j]);
        if (fused && z->Ish) {  /* the shared experts now (the routed ones reuse g and u): into t4 [T][D] */
            k3_glu(m, m->g, m->u, T * z->Ish);
            k3_lin(m, k3w_get(w, layer, K3W_MOE_SH_DOWN), m->g, T, m->t4);
        }
    }
    const k3_tensor *bt = k3w_get(w, layer, K3W_MOE_BIAS);
    if (bt) k3w_vec(bt, m->bias);
    else memset(m->bias, 0, E * sizeof(float));
    float *sel = m->sel;                                              /* [E] */
    for (uint32_t t = 0; t < T; t++) {
        float *st = s + (size_t)t * E;
        router_scores(m, st, E);
        for (uint32_t e = 0; e < E; e++) sel[e] = st[e] + m->bias[e];      /* selection only */
        int32_t *it = m->idx + (size_t)t * k;
        float *wt = m->wts + (size_t)t * k;
        top_k(sel, E, k, it);
        for (uint32_t j = 0; j < k; j++) wt[j] = st[it[j]];              /* unbiased scores */
        if (c->moe_renormalize && k > 1) {
            float den = wt[0];
            for (uint32_t j = 1; j < k; j++) den = den + wt[j];          /* slot order */
            den = den + 1e-20f;
            for (uint32_t j = 0; j < k; j++) wt[j] = wt[j] / den;
        }
        float rsf = (float)c->routed_scaling_factor;
        for (uint32_t j = 0; j < k; j++) wt[j] = wt[j] * rsf;
    }
    if (m->o.dump) {
        m->o.dump(m->o.dump_ctx, "experts", layer, T, k, NULL, m->idx);
        m->o.dump(m->o.dump_ctx, "expert_weights", layer, T, k, m->wts, NULL);
    }
    /* latent input */
    const float *xl = c->routed_expert_hidden_size ? m->xl : x;
    /* the routed experts: this process's own, and across ranks the others' (model_dist.c) */
    k3_err err;
    if (k3_dist_size() > 1 && (err = k3_dist_moe_send(m, layer, T, xl, d))) return err;
    if ((err = k3_moe_experts(m, layer, T, xl, d))) return err;
    if (k3_dist_size() > 1 && (err = k3_dist_moe_collect(m, T, d))) return err;
    /* weighted sum in slot order, fp32 */
    for (uint32_t t = 0; t < T; t++) {
        float *yl = m->yl + (size_t)t * Dl;
        const float *wt = m->wts + (size_t)t * k;
        const float *Y0 = m->Y + (size_t)t * k * Dl;
        for (uint32_t i = 0; i < Dl; i++) yl[i] = wt[0] * Y0[i];
        for (uint32_t j = 1; j < k; j++)
            for (uint32_t i = 0; i < Dl; i++) yl[i] = yl[i] + wt[j] * Y0[(size_t)j * Dl + i];
    }
    if (c->latent_moe_use_norm && c->routed_expert_hidden_size) {
        k3w_vec(k3w_get(w, layer, K3W_MOE_LAT_NORM), m->vec);
        float eps = (float)c->rms_norm_eps;
        for (uint32_t t = 0; t < T; t++) k3v_rmsnorm(m->yl + (size_t)t * Dl, m->yl + (size_t)t * Dl, m->vec, Dl, eps);
    }
    if (c->routed_expert_hidden_size) k3_lin(m, k3w_get(w, layer, K3W_MOE_LAT_UP), m->yl, T, out);
    else memcpy(out, m->yl, (size_t)T * Dl * sizeof(float));
    if (z->Ish) {
        if (!fused) {
            k3_lin(m, k3w_get(w, layer, K3W_MOE_SH_GATE), x, T, m->g);     /* [T][Ish] */
            k3_lin(m, k3w_get(w, layer, K3W_MOE_SH_UP), x, T, m->u);
            k3_glu(m, m->g, m->u, T * z->Ish);
            k3_lin(m, k3w_get(w, layer, K3W_MOE_SH_DOWN), m->g, T, m->t4);  /* [T][D] */
        }
        for (size_t i = 0; i < (size_t)T * z->D; i++) out[i] = out[i] + m->t4[i];
    }
    lookahead(m, layer, T, out);
    return K3_OK;
}

/*
 * Layer nx's AttnRes mix of its MoE input as it stands before nx's attention: the frozen
 * blocks (nb of them), then hn (the hidden state after layer nx - 1) as the new block if nx
 * starts one, and hn as the partial sum (its attention output not known yet). The same
 * arithmetic as model.c's attnres; out [T][D], vectors in m->vec, m->vec2.
 */
static void mix_ahead(k3_model *m, uint32_t T, uint32_t nb, int new_block, const float *hn, const k3_tensor *nt,
                      const k3_tensor *pt, float *out)
{
    const k3_dims *z = &m->d;
    float *q = m->vec, *kf = m->vec2;
    k3w_vec(nt, q);
    k3w_vec(pt, kf);
    for (uint32_t i = 0; i < z->D; i++) q[i] = q[i] * kf[i];
    float eps = (float)m->cfg->rms_norm_eps;
    uint32_t nv = nb + (new_block ? 2 : 1);
    for (uint32_t t = 0; t < T; t++) {
        float s[K3_MAX_LAYERS + 2], mx = -INFINITY;
        const float *h = hn + (size_t)t * z->D;
        for (uint32_t j = 0; j < nv; j++) {
            const float *v = j < nb ? m->blocks + ((size_t)j * m->o.max_batch + t) * z->D : h;
            k3v_rmsnorm(kf, v, NULL, z->D, eps);
            s[j] = k3v_dot(kf, q, z->D);
            if (s[j] > mx) mx = s[j];
        }
        double sum = 0;
        for (uint32_t j = 0; j < nv; j++) { s[j] = k3_expf(s[j] - mx); sum += s[j]; }
        float *o = out + (size_t)t * z->D;
        for (uint32_t j = 0; j < nv; j++) {
            float p = (float)(s[j] / sum);
            const float *v = j < nb ? m->blocks + ((size_t)j * m->o.max_batch + t) * z->D : h;
            if (j == 0) for (uint32_t i = 0; i < z->D; i++) o[i] = p * v[i];
            else for (uint32_t i = 0; i < z->D; i++) o[i] = o[i] + p * v[i];
        }
    }
}

/*
 * The end of layer `layer`'s FFN (out [T][D], not yet added to m->h): predict layer + 1's
 * experts and have the cache read the missing ones now. The prediction is what sim_cache.py
 * measured on medium (99.8 % of rank-1 choices, 88 % of the 16): the hidden state after this
 * layer, layer + 1's MoE mix and post-attention norm, its router and bias, top-k per token, of
 * which the first ka are read ahead (k3w_lookahead; by default half the top-k, the likeliest:
 * the tail of the top-k is where the guesses miss, and a wrong guess costs a read and evicts
 * a record that may be asked for again); a batch asks for the experts most of its tokens name
 * first. Needs layer + 1's router in
 * memory, or its streamed unit's read already queued (k3w_get_ahead); else nothing is read
 * ahead. Writes only scratch the layers overwrite before reading: t3, t4 [B][tw >= D],
 * logits_e [B][E], bias, sel, seen [E], idx [B][k], uniq, vec, vec2.
 */
static void lookahead(k3_model *m, int layer, uint32_t T, const float *out)
{
    const k3_dims *z = &m->d;
    const k3_config *c = m->cfg;
    k3_weights *w = m->w;
    int nx = layer + 1;
    if (!z->E || nx >= (int)z->L || !k3_layer_is_moe(c, (uint32_t)nx) || !k3w_lookahead(w)) return;
    k3_tensor tr, tb, tn, tmn, tmp;
    const k3_tensor *router = k3w_get_ahead(w, nx, K3W_MOE_ROUTER, &tr);
    const k3_tensor *bias = k3w_get(w, nx, K3W_MOE_BIAS) ? k3w_get_ahead(w, nx, K3W_MOE_BIAS, &tb) : NULL;
    const k3_tensor *pn = k3w_get_ahead(w, nx, K3W_POST_NORM, &tn);
    const k3_tensor *mn = z->block ? k3w_get_ahead(w, nx, K3W_MRES_NORM, &tmn) : NULL;
    const k3_tensor *mp = z->block ? k3w_get_ahead(w, nx, K3W_MRES_PROJ, &tmp) : NULL;
    if (!router || !pn || (k3w_get(w, nx, K3W_MOE_BIAS) && !bias) || (z->block && (!mn || !mp))) return;
    int la = k3w_lookahead(w);
    uint32_t D = z->D, E = z->E, k = z->k;
    uint32_t ka = la < 0 ? (k + 1) / 2 : (uint32_t)la < k ? (uint32_t)la : k;   /* each token's first ka */
    float *hn = m->t3, *xn = m->t4;                                   /* [T][D] each */
    for (size_t i = 0; i < (size_t)T * D; i++) hn[i] = m->h[i] + out[i];
    const float *mi = hn;
    if (z->block) {
        mix_ahead(m, T, (uint32_t)layer / z->block + 1, nx % z->block == 0, hn, mn, mp, xn);
        mi = xn;
    }
    k3w_vec(pn, m->vec);
    float eps = (float)c->rms_norm_eps;
    for (uint32_t t = 0; t < T; t++) k3v_rmsnorm(hn + (size_t)t * D, mi + (size_t)t * D, m->vec, D, eps);
    k3_lin(m, router, hn, T, m->logits_e);                            /* [T][E] */
    if (bias) k3w_vec(bias, m->bias);
    else memset(m->bias, 0, E * sizeof(float));
    memset(m->seen, 0, E * sizeof *m->seen);
    for (uint32_t t = 0; t < T; t++) {
        float *st = m->logits_e + (size_t)t * E;
        router_scores(m, st, E);
        for (uint32_t e = 0; e < E; e++) m->sel[e] = st[e] + m->bias[e];
        top_k(m->sel, E, k, m->idx + (size_t)t * k);
        for (uint32_t j = 0; j < ka; j++) m->seen[m->idx[(size_t)t * k + j]]++;
    }
    const int me = k3_dist_rank();
    uint32_t nu = 0;
    if (T == 1) {                                   /* one token: its own order, likeliest first */
        for (uint32_t j = 0; j < ka; j++)
            if (k3_dist_owner((uint32_t)m->idx[j]) == me) m->uniq[nu++] = m->idx[j];
        k3w_experts_prefetch(w, nx, m->uniq, (int)nu);
        return;
    }
    for (uint32_t cnt = T; cnt > 0; cnt--)          /* a batch: named by the most tokens first */
        for (uint32_t e = 0; e < E; e++)
            if (m->seen[e] == cnt && k3_dist_owner(e) == me) m->uniq[nu++] = (int32_t)e;
    k3w_experts_prefetch(w, nx, m->uniq, (int)nu);
}

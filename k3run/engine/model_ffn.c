/*
 * model_ffn.c - the feed-forward layers (spec §4.6): the dense SiTU (or
 * SwiGLU) FFN and the latent MoE: fp32 sigmoid router, bias for selection
 * only, renormalised weights times the scaling factor, latent down/up
 * projections, latent norm, shared experts.
 *
 * A batch reads each chosen expert once: the batch's experts are acquired
 * together, and each expert multiplies all the tokens that chose it at once.
 */
#include "model_impl.h"

#include <math.h>
#include <string.h>

#include "k3_math.h"

k3_err k3_dense(k3_model *m, int layer, uint32_t T, const float *x, float *out, k3_diag *d)
{
    (void)d;
    const k3_dims *z = &m->d;
    k3_lin(m, k3w_get(m->w, layer, K3W_FFN_GATE), x, T, m->g);       /* [T][I] */
    k3_lin(m, k3w_get(m->w, layer, K3W_FFN_UP), x, T, m->u);         /* [T][I] */
    k3_glu(m->cfg, m->g, m->u, T * z->I);
    k3_lin(m, k3w_get(m->w, layer, K3W_FFN_DOWN), m->g, T, out);
    return K3_OK;
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
    uint32_t E = z->E, k = z->k, Dl = z->Dl, Ie = z->Ie;
    float *s = m->logits_e;                                           /* [T][E] */
    k3_lin(m, k3w_get(w, layer, K3W_MOE_ROUTER), x, T, s);
    const k3_tensor *bt = k3w_get(w, layer, K3W_MOE_BIAS);
    if (bt) k3w_vec(bt, m->bias);
    else memset(m->bias, 0, E * sizeof(float));
    float *sel = m->sel;                                              /* [E] */
    for (uint32_t t = 0; t < T; t++) {
        float *st = s + (size_t)t * E;
        if (c->router_act == K3_ROUTER_SIGMOID) {
            for (uint32_t e = 0; e < E; e++) st[e] = k3_sigmoidf(st[e]);
        } else {
            float mx = -INFINITY;
            for (uint32_t e = 0; e < E; e++) if (st[e] > mx) mx = st[e];
            double sum = 0;
            for (uint32_t e = 0; e < E; e++) { st[e] = k3_expf(st[e] - mx); sum += st[e]; }
            for (uint32_t e = 0; e < E; e++) st[e] = (float)(st[e] / sum);
        }
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
    const float *xl = x;
    if (c->routed_expert_hidden_size) {
        k3_lin(m, k3w_get(w, layer, K3W_MOE_LAT_DOWN), x, T, m->xl);    /* [T][Dl] */
        xl = m->xl;
    }
    /* the batch's experts, ascending, acquired together */
    uint32_t nu = 0;
    memset(m->seen, 0, E * sizeof *m->seen);
    for (uint32_t i = 0; i < T * k; i++) m->seen[m->idx[i]]++;
    for (uint32_t e = 0; e < E; e++) if (m->seen[e]) m->uniq[nu++] = (int32_t)e;
    /* in groups the expert cache can hold at once (all of them when resident) */
    uint32_t cap = k3w_expert_capacity(w);
    for (uint32_t g0 = 0; g0 < nu; g0 += cap) {
        uint32_t gn = nu - g0 < cap ? nu - g0 : cap;
        k3_err err = k3w_experts_acquire(w, layer, m->uniq + g0, m->seen, (int)gn, m->ex, d);
        if (err) return err;
        for (;;) {                        /* cached experts first, the others as their reads land */
            int uj;
            if ((err = k3w_experts_next(w, &uj, d))) return err;
            if (uj < 0) break;
            uint32_t u = (uint32_t)uj;
            int32_t e = m->uniq[g0 + u];
            uint32_t n = 0;                                           /* tokens that chose e */
            for (uint32_t t = 0; t < T; t++)
                for (uint32_t j = 0; j < k; j++)
                    if (m->idx[(size_t)t * k + j] == e) {
                        memcpy(m->xe + (size_t)n * Dl, xl + (size_t)t * Dl, Dl * sizeof(float));
                        m->tok_of[n] = (int32_t)t;
                        m->slot_of[n] = (int32_t)j;
                        n++;
                    }
            k3_matmul(m->o.isa, &m->ex[u].w1, m->xe, Dl, n, m->g, Ie);  /* [n][Ie] */
            k3_matmul(m->o.isa, &m->ex[u].w3, m->xe, Dl, n, m->u, Ie);
            k3_glu(c, m->g, m->u, n * Ie);
            k3_matmul(m->o.isa, &m->ex[u].w2, m->g, Ie, n, m->ye, Dl);  /* [n][Dl] */
            for (uint32_t r = 0; r < n; r++)
                memcpy(m->Y + ((size_t)m->tok_of[r] * k + m->slot_of[r]) * Dl, m->ye + (size_t)r * Dl,
                       Dl * sizeof(float));
        }
        k3w_experts_release(w, layer);
    }
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
        k3_lin(m, k3w_get(w, layer, K3W_MOE_SH_GATE), x, T, m->g);     /* [T][Ish] */
        k3_lin(m, k3w_get(w, layer, K3W_MOE_SH_UP), x, T, m->u);
        k3_glu(c, m->g, m->u, T * z->Ish);
        k3_lin(m, k3w_get(w, layer, K3W_MOE_SH_DOWN), m->g, T, m->t4);  /* [T][D] */
        for (size_t i = 0; i < (size_t)T * z->D; i++) out[i] = out[i] + m->t4[i];
    }
    return K3_OK;
}

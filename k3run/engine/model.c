/*
 * model.c - the model's checks against the pack and its buffers (sizes from
 * model_shape.c), the residual stream with block Attention Residuals, the
 * final norm and lm_head (spec §4.1-§4.3). Attention lives in model_attn.c,
 * FFN and MoE in model_ffn.c, the shared vector helpers in model_ops.c.
 */
#include "model_impl.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "k3_math.h"
#include "k3_shard.h"

/* ------------------------------------------------------------------------ */
/* setup                                                                     */

/* A required tensor: present, a matrix [rows, cols] in BF16 (rows/cols 0: any),
   or (cols == 0 and vec) a vector of `rows` values in BF16 or F32. */
static k3_err need(k3_model *m, int layer, k3_wid id, uint32_t rows, uint32_t cols, int vec, k3_diag *d)
{
    const k3_tensor *t = k3w_get(m->w, layer, id);
    char where[32];
    if (layer >= 0) snprintf(where, sizeof where, "layer %d", layer);
    else snprintf(where, sizeof where, "the model");
    if (!t) return k3_fail(d, K3_ERR_MODEL, "%s needs a tensor the pack does not have (weight kind %d)", where, (int)id);
    if (vec) {
        if (t->numel != rows || (t->enc != K3_ENC_BF16 && t->enc != K3_ENC_F32))
            return k3_fail(d, K3_ERR_MODEL, "'%s': expected %u BF16 or F32 values", t->name, rows);
        return K3_OK;
    }
    if (t->enc != K3_ENC_BF16 && t->enc != K3_ENC_Q8)
        return k3_fail(d, K3_ERR_UNSUPPORTED, "'%s': only BF16 and Q8 trunk matrices are supported", t->name);
    if ((rows && t->mat.rows != rows) || (cols && t->mat.cols != cols))
        return k3_fail(d, K3_ERR_MODEL, "'%s': shape [%u, %u], the config implies [%u, %u]", t->name,
                       t->mat.rows, t->mat.cols, rows, cols);
    return K3_OK;
}

/* A matrix the model reads as BF16 itself, not through the kernels: a compact trunk leaves it exact. */
static k3_err bf16_only(k3_model *m, int layer, k3_wid id, k3_diag *d)
{
    const k3_tensor *t = k3w_get(m->w, layer, id);
    if (t && t->enc != K3_ENC_BF16)
        return k3_fail(d, K3_ERR_UNSUPPORTED, "'%s': must be BF16 (it is %s)", t->name, k3_enc_name(t->enc));
    return K3_OK;
}

static k3_err check_layer(k3_model *m, int i, k3_diag *d)
{
    const k3_config *c = m->cfg;
    const k3_dims *z = &m->d;
    k3_err e = K3_OK;
#define NEED(id, r, cc, v) do { if ((e = need(m, i, id, r, cc, v, d))) return e; } while (0)
    NEED(K3W_IN_NORM, z->D, 0, 1);
    NEED(K3W_POST_NORM, z->D, 0, 1);
    if (z->block) {
        if (i > 0) { NEED(K3W_ARES_NORM, z->D, 0, 1); NEED(K3W_ARES_PROJ, z->D, 0, 1); }
        NEED(K3W_MRES_NORM, z->D, 0, 1);
        NEED(K3W_MRES_PROJ, z->D, 0, 1);
    }
    if (k3_layer_is_kda(c, i)) {
        NEED(K3W_KDA_Q, z->C, z->D, 0); NEED(K3W_KDA_K, z->C, z->D, 0); NEED(K3W_KDA_V, z->C, z->D, 0);
        NEED(K3W_KDA_QCONV, z->C * z->W, 0, 1); NEED(K3W_KDA_KCONV, z->C * z->W, 0, 1);
        NEED(K3W_KDA_VCONV, z->C * z->W, 0, 1);
        NEED(K3W_KDA_ALOG, z->H, 0, 1); NEED(K3W_KDA_DTBIAS, z->C, 0, 1);
        NEED(K3W_KDA_FA, 0, z->D, 0);
        uint32_t fr = k3w_get(m->w, i, K3W_KDA_FA)->mat.rows;
        if (fr != z->fa_rank) return k3_fail(d, K3_ERR_MODEL, "layer %d: f_a_proj rank %u differs from layer %u's",
                                             i, fr, z->fa_rank);
        NEED(K3W_KDA_FB, z->C, fr, 0);
        NEED(K3W_KDA_B, z->H, z->D, 0);
        if (c->kda_full_rank_gate) NEED(K3W_KDA_G, z->C, z->D, 0);
        else { NEED(K3W_KDA_GA, z->ga_rank, z->D, 0); NEED(K3W_KDA_GB, z->C, z->ga_rank, 0); }
        NEED(K3W_KDA_ONORM, z->K, 0, 1);
        NEED(K3W_KDA_O, z->D, z->C, 0);
    } else {
        if (z->Q) {
            NEED(K3W_MLA_QA, z->Q, z->D, 0); NEED(K3W_MLA_QANORM, z->Q, 0, 1);
            NEED(K3W_MLA_QB, z->Hm * (z->dn + z->dr), z->Q, 0);
        } else {
            NEED(K3W_MLA_Q, z->Hm * (z->dn + z->dr), z->D, 0);
        }
        NEED(K3W_MLA_KVA, z->R + z->dr, z->D, 0); NEED(K3W_MLA_KVANORM, z->R, 0, 1);
        NEED(K3W_MLA_KVB, z->Hm * (z->dn + z->dv), z->R, 0);
        if ((e = bf16_only(m, i, K3W_MLA_KVB, d))) return e;         /* absorbed per head, read as BF16 rows */
        if (c->mla_use_output_gate) NEED(K3W_MLA_G, z->Hm * z->dv, z->D, 0);
        NEED(K3W_MLA_O, z->D, z->Hm * z->dv, 0);
    }
    if (k3_layer_is_moe(c, i)) {
        NEED(K3W_MOE_ROUTER, z->E, z->D, 0);
        if (k3w_get(m->w, i, K3W_MOE_BIAS)) NEED(K3W_MOE_BIAS, z->E, 0, 1);
        if (z->Ish) {
            NEED(K3W_MOE_SH_GATE, z->Ish, z->D, 0); NEED(K3W_MOE_SH_UP, z->Ish, z->D, 0);
            NEED(K3W_MOE_SH_DOWN, z->D, z->Ish, 0);
        }
        if (c->routed_expert_hidden_size) {
            NEED(K3W_MOE_LAT_DOWN, z->Dl, z->D, 0); NEED(K3W_MOE_LAT_UP, z->D, z->Dl, 0);
            if (c->latent_moe_use_norm) NEED(K3W_MOE_LAT_NORM, z->Dl, 0, 1);
        }
        /* every expert of the layer has the config's shapes (checked once, all share a layout) */
        k3_expert ex;
        if ((e = k3w_expert_shape(m->w, i, &ex, d))) return e;
        if (ex.w1.rows != z->Ie || ex.w1.cols != z->Dl || ex.w3.rows != z->Ie || ex.w3.cols != z->Dl ||
            ex.w2.rows != z->Dl || ex.w2.cols != z->Ie)
            return k3_fail(d, K3_ERR_MODEL, "layer %d: expert matrices are [%u,%u]/[%u,%u], the config implies "
                           "[%u,%u]/[%u,%u]", i, ex.w1.rows, ex.w1.cols, ex.w2.rows, ex.w2.cols, z->Ie, z->Dl,
                           z->Dl, z->Ie);
        if (ex.w1.enc != K3_ENC_MXFP4 && ex.w1.enc != K3_ENC_BF16)
            return k3_fail(d, K3_ERR_UNSUPPORTED, "layer %d: expert encoding %d is not supported", i, ex.w1.enc);
    } else {
        NEED(K3W_FFN_GATE, z->I, z->D, 0); NEED(K3W_FFN_UP, z->I, z->D, 0); NEED(K3W_FFN_DOWN, z->D, z->I, 0);
    }
#undef NEED
    return K3_OK;
}

/* The config's dimensions, with the KDA gate ranks the pack's tensors have. */
static k3_err set_dims(k3_model *m, k3_diag *d)
{
    k3_dims *z = &m->d;
    k3_err e = k3_model_dims(m->cfg, z, d);
    if (e) return e;
    z->fa_rank = z->ga_rank = 0;
    for (uint32_t i = 0; i < z->L; i++) {
        if (!k3_layer_is_kda(m->cfg, i)) continue;
        const k3_tensor *fa = k3w_get(m->w, (int)i, K3W_KDA_FA), *ga = k3w_get(m->w, (int)i, K3W_KDA_GA);
        if (fa) z->fa_rank = fa->mat.rows;
        if (ga && !m->cfg->kda_full_rank_gate) z->ga_rank = ga->mat.rows;
    }
    return K3_OK;
}

/* One instance of buffer b (model_shape.h), zeroed, 64-byte aligned. */
static void *balloc(k3_model *m, const k3_model_shape *s, k3_buf b, int *fail)
{
    uint64_t n = s->bytes[b];
    void *p = NULL;
    if (posix_memalign(&p, 64, (size_t)((n + 63) & ~(uint64_t)63))) { *fail = 1; return NULL; }
    memset(p, 0, (size_t)n);
    m->bytes += n;
    return p;
}

static int alloc_buffers(k3_model *m);

k3_err k3_model_new(k3_weights *w, const k3_model_opts *o, k3_model **out, k3_diag *d)
{
    *out = NULL;
    if (o->max_batch < 1 || o->context < 1)
        return k3_fail(d, K3_ERR_USAGE, "batch and context must be at least 1");
    if (o->max_verify > o->max_batch)
        return k3_fail(d, K3_ERR_USAGE, "a verify pass of %u tokens does not fit a batch of %u (--batch)",
                       o->max_verify, o->max_batch);
    k3_model *m = calloc(1, sizeof *m);
    if (!m) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    m->w = w;
    m->cfg = k3w_config(w);
    m->o = *o;
    k3_err e = set_dims(m, d);
    for (uint32_t i = 0; !e && i < m->d.L; i++) e = check_layer(m, (int)i, d);
    if (!e) e = need(m, -1, K3W_EMBED, m->d.V, m->d.D, 0, d);
    if (!e) e = bf16_only(m, -1, K3W_EMBED, d);                       /* read a BF16 row at a time */
    if (!e) e = need(m, -1, K3W_FINAL_NORM, m->d.D, 0, 1, d);
    if (!e) e = need(m, -1, K3W_LM_HEAD, m->d.V, m->d.D, 0, d);
    if (!e && m->d.block) e = need(m, -1, K3W_OUT_RES_NORM, m->d.D, 0, 1, d);
    if (!e && m->d.block) e = need(m, -1, K3W_OUT_RES_PROJ, m->d.D, 0, 1, d);
    if (e) { free(m); return e; }
    if (alloc_buffers(m) || (k3_dist_size() > 1 && !(m->lin = calloc(1, sizeof *m->lin)))) {
        k3_model_free(m);
        return k3_fail(d, K3_ERR_NOMEM, "out of memory allocating the model's buffers");
    }
    *out = m;
    return K3_OK;
}

/* Every buffer of the model, once, with the sizes of model_shape.h. 0 on success. */
static int alloc_buffers(k3_model *m)
{
    const k3_dims *z = &m->d;
    k3_model_shape sh;
    const k3_model_shape *s = &sh;
    uint32_t S = m->o.n_seq ? m->o.n_seq : 1;
    k3_model_sizes(z, m->o.max_batch, m->o.context, m->o.all_logits, m->o.max_verify, S, &sh);
    int fail = 0;
    m->mla_slot = balloc(m, s, K3B_MLA_SLOT, &fail);
    m->seqs = calloc(S, sizeof *m->seqs);
    m->handles = calloc(S, sizeof *m->handles);
    if (!m->seqs || !m->handles) return 1;
    uint32_t slot = 0;
    for (uint32_t i = 0; !fail && i < z->L; i++) m->mla_slot[i] = k3_layer_is_kda(m->cfg, i) ? -1 : (int32_t)slot++;
    for (uint32_t q = 0; !fail && q < S; q++) {
        k3_seq *sq = &m->seqs[q];
        if (!(sq->kda = calloc(z->L, sizeof *sq->kda))) return 1;
        for (uint32_t i = 0; !fail && i < z->L; i++) {
            if (!k3_layer_is_kda(m->cfg, i)) continue;
            sq->kda[i].win = balloc(m, s, K3B_KDA_WIN, &fail);
            sq->kda[i].S = balloc(m, s, K3B_KDA_S, &fail);
            if (s->count[K3B_KDA_REC]) sq->kda[i].rec = balloc(m, s, K3B_KDA_REC, &fail);
        }
        sq->mla_c = balloc(m, s, K3B_MLA_C, &fail);
        sq->mla_kr = balloc(m, s, K3B_MLA_KR, &fail);
        sq->last = balloc(m, s, K3B_SEQ_LAST, &fail);
        m->handles[q].owner = m;
        m->handles[q].sq = sq;
    }
    m->sq = &m->seqs[0];

    m->h = balloc(m, s, K3B_H, &fail); m->a_in = balloc(m, s, K3B_A_IN, &fail); m->x = balloc(m, s, K3B_X, &fail);
    m->att = balloc(m, s, K3B_ATT, &fail); m->m_in = balloc(m, s, K3B_M_IN, &fail); m->f = balloc(m, s, K3B_F, &fail);
    m->blocks = balloc(m, s, K3B_BLOCKS, &fail);
    m->vec = balloc(m, s, K3B_VEC, &fail);
    m->vec2 = balloc(m, s, K3B_VEC2, &fail);

    m->t0 = balloc(m, s, K3B_T0, &fail); m->t1 = balloc(m, s, K3B_T1, &fail);
    m->t2 = balloc(m, s, K3B_T2, &fail); m->t3 = balloc(m, s, K3B_T3, &fail);
    m->t4 = balloc(m, s, K3B_T4, &fail);
    m->small = balloc(m, s, K3B_SMALL, &fail);
    m->conv_w = balloc(m, s, K3B_CONV_W, &fail);
    m->headvec = balloc(m, s, K3B_HEADVEC, &fail);
    m->convtmp = balloc(m, s, K3B_CONVTMP, &fail);
    m->headtmp = balloc(m, s, K3B_HEADTMP, &fail);
    m->alog = balloc(m, s, K3B_ALOG, &fail);
    m->mla_q = balloc(m, s, K3B_MLA_Q, &fail);
    m->mla_s = balloc(m, s, K3B_MLA_S, &fail);
    m->mla_ol = balloc(m, s, K3B_MLA_OL, &fail);

    m->g = balloc(m, s, K3B_G, &fail); m->u = balloc(m, s, K3B_U, &fail);
    if (z->E) {
        m->logits_e = balloc(m, s, K3B_LOGITS_E, &fail);
        m->bias = balloc(m, s, K3B_BIAS, &fail);
        m->sel = balloc(m, s, K3B_SEL, &fail);
        m->idx = balloc(m, s, K3B_IDX, &fail);
        m->wts = balloc(m, s, K3B_WTS, &fail);
        m->xl = balloc(m, s, K3B_XL, &fail); m->yl = balloc(m, s, K3B_YL, &fail);
        m->Y = balloc(m, s, K3B_Y, &fail);
        m->xe = balloc(m, s, K3B_XE, &fail); m->ye = balloc(m, s, K3B_YE, &fail);
        m->uniq = balloc(m, s, K3B_UNIQ, &fail);
        m->tok_of = balloc(m, s, K3B_TOK_OF, &fail); m->slot_of = balloc(m, s, K3B_SLOT_OF, &fail);
        m->ex = balloc(m, s, K3B_EX, &fail);
        m->seen = balloc(m, s, K3B_SEEN, &fail);
    }
    m->logits = balloc(m, s, K3B_LOGITS, &fail);
    m->logits_rows = (uint32_t)(s->bytes[K3B_LOGITS] / ((uint64_t)z->V * sizeof(float)));
    if (s->count[K3B_KDA_WORK]) m->kda_work = balloc(m, s, K3B_KDA_WORK, &fail);
    m->xpk = balloc(m, s, K3B_XPK, &fail);
    m->xpk_cap = s->bytes[K3B_XPK] / sizeof(float);
    assert(fail || m->bytes == s->total);         /* the planner budgeted exactly this */
    return fail;
}

void k3_model_free(k3_model *m)
{
    if (!m || m->owner) return;                   /* a handle is freed with its model */
    for (uint32_t q = 0; m->seqs && q < (m->o.n_seq ? m->o.n_seq : 1); q++) {
        k3_seq *sq = &m->seqs[q];
        for (uint32_t i = 0; sq->kda && i < m->d.L; i++) { free(sq->kda[i].win); free(sq->kda[i].S); free(sq->kda[i].rec); }
        free(sq->kda);
        free(sq->mla_c);
        free(sq->mla_kr);
        free(sq->last);
    }
    free(m->seqs);
    free(m->handles);
    void *bufs[] = {m->mla_slot, m->h, m->a_in, m->x, m->att, m->m_in, m->f, m->blocks,
                    m->vec, m->vec2, m->t0, m->t1, m->t2, m->t3, m->t4, m->small, m->conv_w, m->convtmp, m->headtmp, m->headvec,
                    m->alog, m->mla_q, m->mla_s, m->mla_ol, m->g, m->u, m->logits_e, m->bias, m->sel, m->idx, m->wts,
                    m->xl, m->yl, m->Y, m->xe, m->ye, m->uniq, m->tok_of, m->slot_of, m->ex, m->seen,
                    m->logits, m->kda_work, m->xpk};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(m->dist_rows);
    if (m->lin) { free(m->lin->x); free(m->lin->y); free(m->lin); }
    free(m);
}

#define own k3_owner
#define cown k3_cowner

k3_model *k3_model_seq(k3_model *m, uint32_t s)
{
    m = own(m);
    if (s >= (m->o.n_seq ? m->o.n_seq : 1)) return NULL;
    return s == 0 ? m : &m->handles[s];
}
uint32_t k3_model_n_seq(const k3_model *m) { m = cown(m); return m->o.n_seq ? m->o.n_seq : 1; }
uint32_t k3_model_seq_index(const k3_model *m) { return (uint32_t)(m->sq - cown(m)->seqs); }

void k3_model_reset(k3_model *h)
{
    k3_model *m = own(h);
    const k3_dims *z = &m->d;
    k3_seq *sq = h->sq;
    sq->pos = 0;
    sq->open = 0;
    sq->n_logits = 0;
    for (uint32_t i = 0; i < z->L; i++) {
        if (!sq->kda[i].S) continue;
        memset(sq->kda[i].win, 0, 3ull * z->C * (z->W - 1 ? z->W - 1 : 1) * sizeof(float));
        memset(sq->kda[i].S, 0, (size_t)z->H * z->K * z->K * sizeof(float));
    }
}

const float *k3_model_logits(const k3_model *m) { return m->sq->last; }
const float *k3_model_logits_row(const k3_model *h, uint32_t i)
{
    const k3_seq *sq = h->sq;
    if (sq->n_logits == 0) return sq->last;
    return cown(h)->logits + (size_t)(sq->lrow + (i < sq->n_logits ? i : sq->n_logits - 1)) * cown(h)->d.V;
}
uint32_t k3_model_n_logits(const k3_model *m) { return m->sq->n_logits; }
uint32_t k3_model_vocab(const k3_model *m) { return cown(m)->d.V; }
uint32_t k3_model_pos(const k3_model *m) { return m->sq->pos; }
uint32_t k3_model_context(const k3_model *m) { return cown(m)->o.context; }
uint32_t k3_model_max_batch(const k3_model *m) { return cown(m)->o.max_batch; }
uint32_t k3_model_max_verify(const k3_model *m) { return cown(m)->o.max_verify; }
uint64_t k3_model_scratch_bytes(const k3_model *m) { return cown(m)->bytes; }

/* ------------------------------------------------------------------------ */
/* forward                                                                   */

/*
 * Block Attention Residual mix for every token (spec §4.3): V_j = blocks[j]
 * (j < nb) and V_nb = ps; each normalised without weight; score
 * s_j = sum_d kf_j[d] * (norm_w[d] * proj_w[d]); softmax over j; out = sum_j p_j V_j
 * in block order, the partial sum last.
 */
static void attnres(k3_model *m, uint32_t T, uint32_t nb, const float *ps, int layer, k3_wid nid, k3_wid pid,
                    float *out)
{
    const k3_dims *z = &m->d;
    float *q = m->vec, *kf = m->vec2;
    k3w_vec(k3w_get(m->w, layer, nid), q);
    k3w_vec(k3w_get(m->w, layer, pid), kf);
    for (uint32_t i = 0; i < z->D; i++) q[i] = q[i] * kf[i];
    float eps = (float)m->cfg->rms_norm_eps;
    for (uint32_t t = 0; t < T; t++) {
        float s[K3_MAX_LAYERS + 1], mx = -INFINITY;
        for (uint32_t j = 0; j <= nb; j++) {
            const float *v = j < nb ? m->blocks + ((size_t)j * m->o.max_batch + t) * z->D : ps + (size_t)t * z->D;
            k3v_rmsnorm(kf, v, NULL, z->D, eps);
            s[j] = k3v_dot(kf, q, z->D);
            if (s[j] > mx) mx = s[j];
        }
        double sum = 0;
        for (uint32_t j = 0; j <= nb; j++) { s[j] = k3_expf(s[j] - mx); sum += s[j]; }
        float *o = out + (size_t)t * z->D;
        for (uint32_t j = 0; j <= nb; j++) {
            float p = (float)(s[j] / sum);
            const float *v = j < nb ? m->blocks + ((size_t)j * m->o.max_batch + t) * z->D : ps + (size_t)t * z->D;
            if (j == 0) for (uint32_t i = 0; i < z->D; i++) o[i] = p * v[i];
            else for (uint32_t i = 0; i < z->D; i++) o[i] = o[i] + p * v[i];
        }
    }
}

static void norm_rows(k3_model *m, const k3_tensor *w, const float *x, uint32_t T, uint32_t n, float eps, float *y)
{
    k3w_vec(w, m->vec);
    for (uint32_t t = 0; t < T; t++) k3v_rmsnorm(y + (size_t)t * n, x + (size_t)t * n, m->vec, n, eps);
}

static void dump(k3_model *m, const char *name, int layer, uint32_t T, uint32_t width, const float *f,
                 const int32_t *ids)
{
    if (m->o.dump) m->o.dump(m->o.dump_ctx, name, layer, T, width, f, ids);
}

/* The groups' rows (T in all) through every layer and the head: logits for each group's last
   row, or for every row of a verify group (and of every group with all_logits). */
static k3_err pass(k3_model *m, const k3_group *grp, uint32_t n_grp, uint32_t T, k3_diag *d)
{
    const k3_dims *z = &m->d;
    const k3_config *c = m->cfg;
    k3_err e;
    size_t D = z->D;
    float eps = (float)c->rms_norm_eps;
    for (uint32_t g = 0; g < n_grp; g++)
        for (uint32_t t = 0; t < grp[g].T; t++)
            if ((e = k3w_embed_row(m->w, grp[g].ids[t], m->h + (grp[g].row0 + t) * D, d))) return e;
    if (m->o.dump && n_grp == 1) dump(m, "ids", -1, T, 1, NULL, grp[0].ids);
    m->grp = grp;
    m->n_grp = n_grp;
    uint32_t nb = 0;
    for (uint32_t i = 0; i < z->L; i++) {
        int li = (int)i, ps_none = 0;
        const float *a_in = m->h;
        if ((e = k3w_layer_begin(m->w, li, d))) return e;      /* this layer's trunk in memory */
        if (z->block) {
            if (nb) { attnres(m, T, nb, m->h, li, K3W_ARES_NORM, K3W_ARES_PROJ, m->a_in); a_in = m->a_in; }
            if (i % z->block == 0) {        /* freeze AFTER the attention input mix (pitfall 8) */
                for (uint32_t t = 0; t < T; t++)
                    memcpy(m->blocks + ((size_t)nb * m->o.max_batch + t) * D, m->h + t * D, D * sizeof(float));
                nb++;
                ps_none = 1;
            }
        }
        norm_rows(m, k3w_get(m->w, li, K3W_IN_NORM), a_in, T, z->D, eps, m->x);
        e = k3_layer_is_kda(c, i) ? k3_kda(m, li, T, m->x, m->att, d) : k3_mla(m, li, T, m->x, m->att, d);
        if (!e) e = k3_dist_lin_check(m, d);                   /* a split matrix's exchange failed */
        if (e) return e;
        if (ps_none) memcpy(m->h, m->att, T * D * sizeof(float));
        else for (size_t j = 0; j < T * D; j++) m->h[j] = m->h[j] + m->att[j];
        const float *m_in = m->h;
        if (z->block) { attnres(m, T, nb, m->h, li, K3W_MRES_NORM, K3W_MRES_PROJ, m->m_in); m_in = m->m_in; }
        norm_rows(m, k3w_get(m->w, li, K3W_POST_NORM), m_in, T, z->D, eps, m->x);
        e = k3_layer_is_moe(c, i) ? k3_moe(m, li, T, m->x, m->f, d) : k3_dense(m, li, T, m->x, m->f, d);
        if (!e) e = k3_dist_lin_check(m, d);
        if (e) return e;
        for (size_t j = 0; j < T * D; j++) m->h[j] = m->h[j] + m->f[j];
        if (m->o.dump) {
            dump(m, "attn_out", li, T, z->D, m->att, NULL);
            dump(m, "ffn_out", li, T, z->D, m->f, NULL);
            dump(m, "out", li, T, z->D, m->h, NULL);
        }
    }
    const float *fin = m->h;
    if ((e = k3w_layer_begin(m->w, -1, d))) return e;          /* the head */
    if (z->block) { attnres(m, T, nb, m->h, -1, K3W_OUT_RES_NORM, K3W_OUT_RES_PROJ, m->a_in); fin = m->a_in; }
    dump(m, "final_hidden", -1, T, z->D, fin, NULL);
    /* the rows that need logits, normed side by side into x, then one product for all */
    const k3_tensor *fn = k3w_get(m->w, -1, K3W_FINAL_NORM);
    uint32_t n = 0;
    for (uint32_t g = 0; g < n_grp; g++) {
        uint32_t first = grp[g].verify || m->o.all_logits ? 0 : grp[g].T - 1, k = grp[g].T - first;
        norm_rows(m, fn, fin + (grp[g].row0 + first) * D, k, z->D, eps, m->x + (size_t)n * D);
        n += k;
    }
    k3_lin(m, k3w_get(m->w, -1, K3W_LM_HEAD), m->x, n, m->logits);
    k3w_pass_end(m->w);
    if ((e = k3w_check(m->w, d))) return e;                    /* a row piece's read or hash failed */
    if ((e = k3_dist_lin_check(m, d))) return e;
    dump(m, "logits", -1, n, z->V, m->logits, NULL);
    n = 0;
    for (uint32_t g = 0; g < n_grp; g++) {
        k3_seq *sq = grp[g].sq;
        uint32_t k = grp[g].verify || m->o.all_logits ? grp[g].T : 1;
        sq->lrow = n;
        sq->n_logits = k;
        n += k;
        if (!grp[g].verify) {
            memcpy(sq->last, m->logits + (size_t)(n - 1) * z->V, (size_t)z->V * sizeof(float));
            sq->pos += grp[g].T;
        } else {
            sq->open = grp[g].T;
        }
    }
    return K3_OK;
}

/* Check r[0..n) and run them as one pass. */
static k3_err run_groups(k3_model *m, const k3_model_rows *r, uint32_t n, k3_diag *d)
{
    k3_group grp[K3_PASS_GROUPS_MAX];
    uint32_t T = 0, rows = 0;
    if (n == 0 || n > K3_PASS_GROUPS_MAX)
        return k3_fail(d, K3_ERR_INTERNAL, "a pass of %u groups (at most %u)", n, K3_PASS_GROUPS_MAX);
    for (uint32_t g = 0; g < n; g++) {
        k3_model *h = r[g].seq;
        k3_seq *sq = h->sq;
        if (own(h) != m) return k3_fail(d, K3_ERR_INTERNAL, "a pass's sequence of another model");
        for (uint32_t j = 0; j < g; j++)
            if (grp[j].sq == sq) return k3_fail(d, K3_ERR_INTERNAL, "a sequence twice in one pass");
        if (r[g].T == 0) return k3_fail(d, K3_ERR_INTERNAL, "a pass's group of 0 tokens");
        if (r[g].verify && r[g].T > m->o.max_verify)
            return k3_fail(d, K3_ERR_INTERNAL, "verify: %u tokens, the model was made for %u", r[g].T, m->o.max_verify);
        if (sq->open)
            return k3_fail(d, K3_ERR_INTERNAL, "a pass with a verify pass of %u tokens not committed", sq->open);
        if ((uint64_t)sq->pos + r[g].T > m->o.context)
            return k3_fail(d, K3_ERR_USAGE, "the context is full (%u positions): use a larger --context",
                           m->o.context);
        grp[g] = (k3_group){sq, r[g].ids, T, r[g].T, r[g].verify};
        T += r[g].T;
        rows += r[g].verify || m->o.all_logits ? r[g].T : 1;
    }
    if (T > m->o.max_batch)
        return k3_fail(d, K3_ERR_INTERNAL, "a pass of %u tokens, the batch holds %u", T, m->o.max_batch);
    if (rows > m->logits_rows)
        return k3_fail(d, K3_ERR_INTERNAL, "a pass needs %u logits rows, the model has %u", rows, m->logits_rows);
    k3_err e = pass(m, grp, n, T, d);
    m->grp = NULL;
    m->n_grp = 0;
    return e;
}

k3_err k3_model_pass(k3_model *m, const k3_model_rows *r, uint32_t n, k3_diag *d)
{
    return run_groups(own(m), r, n, d);
}

k3_err k3_model_forward(k3_model *h, const int32_t *ids, uint32_t T, k3_diag *d)
{
    if (h->hook) return h->hook(h->hook_ctx, h, ids, T, 0, d);
    k3_model_rows r = {h, ids, T, 0};
    return run_groups(own(h), &r, 1, d);
}

k3_err k3_model_verify(k3_model *h, const int32_t *ids, uint32_t T, k3_diag *d)
{
    if (h->hook) return h->hook(h->hook_ctx, h, ids, T, 1, d);
    k3_model_rows r = {h, ids, T, 1};
    return run_groups(own(h), &r, 1, d);
}

/* Keep the first n tokens of the sequence's open verify pass (model.h "Verify"). */
k3_err k3_model_commit_now(k3_model *h, uint32_t n, k3_diag *d)
{
    k3_model *m = own(h);
    k3_seq *sq = h->sq;
    uint32_t T = sq->open;
    if (n == 0 || n > T) return k3_fail(d, K3_ERR_INTERNAL, "commit of %u tokens of a verify pass of %u", n, T);
    for (uint32_t i = 0; i < m->d.L; i++)
        if (sq->kda[i].S) k3_kda_commit(m, sq, (int)i, n);
    memcpy(sq->last, m->logits + (size_t)(sq->lrow + n - 1) * m->d.V, (size_t)m->d.V * sizeof(float));
    sq->open = 0;
    sq->n_logits = n;
    sq->pos += n;
    return K3_OK;
}

k3_err k3_model_commit(k3_model *h, uint32_t n, k3_diag *d)
{
    if (h->hook) return h->hook(h->hook_ctx, h, NULL, n, 2, d);
    return k3_model_commit_now(h, n, d);
}

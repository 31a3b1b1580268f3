/*
 * model_state.c - the model's sequence state as data (model.h "State"):
 * snapshots of the recurrent part for rewinding, and the parts a session file
 * saves and restores.
 *
 * What a position's state is: the KDA layers' conv windows and recurrent
 * matrices (fixed size, overwritten every token), the MLA latent cache rows
 * [0, pos) (append-only: a token at position p writes row p and nothing
 * else), and the last token's logits row. So going back to a position p <= pos
 * needs the KDA state as it was at p, and nothing of the MLA cache: rows
 * [0, p) are still the ones computed then. A snapshot is therefore the KDA
 * state plus the position; the cache is truncated by setting pos.
 */
#include "model_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct k3_model_snap {
    uint32_t pos;
    uint64_t bytes;               /* of buf */
    float *buf;                   /* [n_kda][win floats + S floats], layer order, then [V] logits */
};

static uint64_t win_floats(const k3_dims *z) { return 3ull * z->C * (z->W - 1 ? z->W - 1 : 1); }
static uint64_t s_floats(const k3_dims *z) { return (uint64_t)z->H * z->K * z->K; }

static uint32_t n_kda(const k3_model *m)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < m->d.L; i++) n += m->seqs[0].kda[i].S != NULL;
    return n;
}

uint64_t k3_model_snap_bytes(const k3_model *h)
{
    const k3_model *m = k3_cowner(h);
    return (uint64_t)n_kda(m) * (win_floats(&m->d) + s_floats(&m->d)) * sizeof(float) +
           (uint64_t)m->d.V * sizeof(float);
}

k3_err k3_model_snap_new(const k3_model *h, k3_model_snap **out, k3_diag *d)
{
    const k3_model *m = k3_cowner(h);
    k3_model_snap *s = calloc(1, sizeof *s);
    if (s) s->bytes = k3_model_snap_bytes(m);
    if (!s || !(s->buf = malloc((size_t)s->bytes))) {
        free(s);
        *out = NULL;
        return k3_fail(d, K3_ERR_NOMEM, "out of memory for a state snapshot");
    }
    s->pos = UINT32_MAX;          /* empty */
    *out = s;
    return K3_OK;
}

void k3_model_snap_free(k3_model_snap *s)
{
    if (!s) return;
    free(s->buf);
    free(s);
}

uint32_t k3_model_snap_pos(const k3_model_snap *s) { return s->pos; }

void k3_model_snap_take(const k3_model *h, k3_model_snap *s)
{
    const k3_dims *z = &k3_cowner(h)->d;
    const k3_seq *sq = h->sq;
    float *p = s->buf;
    for (uint32_t i = 0; i < z->L; i++) {
        if (!sq->kda[i].S) continue;
        memcpy(p, sq->kda[i].win, win_floats(z) * sizeof(float));
        p += win_floats(z);
        memcpy(p, sq->kda[i].S, s_floats(z) * sizeof(float));
        p += s_floats(z);
    }
    memcpy(p, sq->last, (size_t)z->V * sizeof(float));
    s->pos = sq->pos;
}

k3_err k3_model_snap_restore(k3_model *h, const k3_model_snap *s, k3_diag *d)
{
    const k3_dims *z = &k3_owner(h)->d;
    k3_seq *sq = h->sq;
    if (s->pos == UINT32_MAX || s->pos > sq->pos)
        return k3_fail(d, K3_ERR_INTERNAL, "snapshot at position %u cannot be restored at position %u", s->pos,
                       sq->pos);
    const float *p = s->buf;
    for (uint32_t i = 0; i < z->L; i++) {
        if (!sq->kda[i].S) continue;
        memcpy(sq->kda[i].win, p, win_floats(z) * sizeof(float));
        p += win_floats(z);
        memcpy(sq->kda[i].S, p, s_floats(z) * sizeof(float));
        p += s_floats(z);
    }
    memcpy(sq->last, p, (size_t)z->V * sizeof(float));
    sq->n_logits = 0;
    sq->pos = s->pos;
    sq->open = 0;
    return K3_OK;
}

/* ------------------------------------------------------------------------ */
/* a fork: one sequence's state into another                                 */

k3_err k3_model_seq_copy(k3_model *dst, k3_model *src, k3_diag *d)
{
    if (k3_owner(src) != k3_owner(dst)) return k3_fail(d, K3_ERR_INTERNAL, "a sequence copied between two models");
    if (src->sq == dst->sq) return K3_OK;
    if (src->sq->open) return k3_fail(d, K3_ERR_INTERNAL, "a sequence copied with a verify pass open");
    uint32_t pos = src->sq->pos;
    k3_err e = k3_model_state_set_pos(dst, pos, d);
    for (uint32_t i = 0; !e && i < k3_model_state_nparts(src); i++) {   /* the session file's parts */
        k3_state_part from, to;
        if (!(e = k3_model_state_part(src, i, pos, &from, d)) && !(e = k3_model_state_part(dst, i, pos, &to, d)))
            memcpy(to.data, from.data, (size_t)from.bytes);
    }
    return e;
}

k3_err k3_model_seq_copy_at(k3_model *dst, k3_model *src, const k3_model_snap *at, k3_diag *d)
{
    if (k3_owner(src) != k3_owner(dst)) return k3_fail(d, K3_ERR_INTERNAL, "a sequence copied between two models");
    if (src->sq == dst->sq || at->pos == UINT32_MAX) return k3_fail(d, K3_ERR_INTERNAL, "a fork onto itself or empty");
    uint32_t pos = at->pos;
    k3_err e = k3_model_state_set_pos(dst, pos, d);
    for (uint32_t i = 0; !e && i < k3_model_state_nparts(src); i++) {   /* the MLA rows: the cache parts */
        k3_state_part from, to;
        if ((e = k3_model_state_part(src, i, pos, &from, d))) break;
        if (strncmp(from.name, "mla.", 4)) continue;                  /* KDA states and logits: from at */
        if (!(e = k3_model_state_part(dst, i, pos, &to, d))) memcpy(to.data, from.data, (size_t)from.bytes);
    }
    if (!e) e = k3_model_snap_restore(dst, at, d);
    return e;
}

void k3_model_snap_copy(k3_model_snap *dst, const k3_model_snap *src)
{
    memcpy(dst->buf, src->buf, (size_t)src->bytes);
    dst->pos = src->pos;
}

/* ------------------------------------------------------------------------ */
/* parts, for a session file                                                 */

/* Parts: for each layer in order, KDA "kda.L.win", "kda.L.S" or MLA "mla.L.c", "mla.L.kr"
   (rows [0, pos)); then "logits". */
uint32_t k3_model_state_nparts(const k3_model *m) { return 2 * k3_cowner(m)->d.L + 1; }

k3_err k3_model_state_part(k3_model *h, uint32_t i, uint32_t pos, k3_state_part *p, k3_diag *d)
{
    k3_model *m = k3_owner(h);
    k3_seq *sq = h->sq;
    const k3_dims *z = &m->d;
    if (i >= k3_model_state_nparts(m) || pos > m->o.context)
        return k3_fail(d, K3_ERR_INTERNAL, "state part %u at position %u", i, pos);
    memset(p, 0, sizeof *p);
    if (i == 2 * z->L) {
        snprintf(p->name, sizeof p->name, "logits");
        p->data = sq->last;
        p->bytes = (uint64_t)z->V * sizeof(float);
        return K3_OK;
    }
    uint32_t layer = i / 2, second = i % 2;
    if (sq->kda[layer].S) {
        snprintf(p->name, sizeof p->name, "kda.%u.%s", layer, second ? "S" : "win");
        p->data = second ? sq->kda[layer].S : sq->kda[layer].win;
        p->bytes = (second ? s_floats(z) : win_floats(z)) * sizeof(float);
    } else {
        size_t slot = (size_t)m->mla_slot[layer], w = second ? z->dr : z->R;
        snprintf(p->name, sizeof p->name, "mla.%u.%s", layer, second ? "kr" : "c");
        p->data = (second ? sq->mla_kr : sq->mla_c) + slot * m->o.context * w;
        p->bytes = (uint64_t)pos * w * sizeof(float);
    }
    return K3_OK;
}

k3_err k3_model_state_set_pos(k3_model *h, uint32_t pos, k3_diag *d)
{
    uint32_t ctx = k3_owner(h)->o.context;
    if (pos > ctx)
        return k3_fail(d, K3_ERR_USAGE, "position %u is beyond the context of %u (--context)", pos, ctx);
    h->sq->pos = pos;
    h->sq->n_logits = 0;
    h->sq->open = 0;
    return K3_OK;
}

/*
 * model_split.c - the trunk split by rows across MPI ranks (K3_TRUNK=split,
 * plan.h): each split matrix's product is computed where its rows live, rank
 * 0's slice on rank 0 and every other slice on its rank, and gathered on rank
 * 0 in row order. A row's output is its own dot product in the kernels'
 * canonical order wherever it is computed, so the bits are one process's.
 */
#include "model_impl.h"

#include <stdlib.h>
#include <string.h>

#include "kern.h"
#include "plan.h"

_Static_assert(K3_SPLIT_BLOCK == K3_KERN_BLOCK, "a rank's slice starts where a kernel block does");

/*
 * Per group of split matrices t[j] [rows_j][cols] that multiply one x (a k3_lin of a split
 * tensor, or the split members of a k3_lin_fused; at most K3_SPLIT_GROUP_MAX) and T tokens:
 *   1. broadcast from rank 0: a header {OP_LIN | n << 4 | wid_j << (7 + 6 j), layer (UINT32_MAX:
 *      model level), T}, then x [T][cols] fp32;
 *   2. every rank computes its rows [lo_j, hi_j) of each (k3_split_rows), rank 0 into y directly
 *      (and the group's matrices that are not split, whole);
 *   3. each other rank sends rank 0 a status and then its rows [j][T][hi_j - lo_j]; rank 0 puts
 *      them in y.
 * Bytes: 12 + 4 T cols to each rank, 260 + 4 T sum_j (hi_j - lo_j) back from each
 * (k3_split_traffic).
 */

/* Grow *p to at least n floats. 0 on success. */
static int grow(float **p, size_t *cap, size_t n)
{
    if (n <= *cap) return 0;
    float *q = realloc(*p, n * sizeof(float));
    if (!q) return 1;
    *p = q;
    *cap = n;
    return 0;
}

/* y [T][ldy] (column 0 = row lo) = rows [lo, hi) of t times x [T][cols], in K3_KERN_BLOCK-row
   blocks from lo (the blocks, calls and bits of k3_lin_fused), the blocks in parallel. */
static void lin_slice(const k3_model *m, const k3_tensor *t, const float *x, uint32_t T, float *y, uint32_t ldy)
{
    if (t->hi <= t->lo) return;
    const uint32_t BR = K3_KERN_BLOCK, cols = t->mat.cols;
    size_t eb = t->enc == K3_ENC_F32 ? 4 : t->enc == K3_ENC_Q8 ? 1 : 2;
    k3_mat v = t->mat;                                  /* rows [lo, hi) as a matrix of their own */
    v.rows = t->hi - t->lo;
    v.data = (const uint8_t *)t->mat.data + (size_t)t->lo * cols * eb;
    if (v.scales) v.scales += (size_t)t->lo * (cols / 32);
    const long nb = (long)((v.rows + BR - 1) / BR);
    K3_PFOR((double)v.rows * cols * T >= 65536, for (long b = 0; b < nb; b++) {
        uint32_t r0 = (uint32_t)b * BR, r1 = v.rows - r0 < BR ? v.rows : r0 + BR;
        k3_matmul_rows(m->o.isa, &v, x, cols, T, y, ldy, r0, r1);
    });
}

/* The header word of a group: op, member count, the members' wids (K3_SPLIT_GROUP_MAX of 6 bits). */
_Static_assert(K3W__COUNT <= 64 && K3_SPLIT_GROUP_MAX <= 4, "a group's wids fit the header's first word");
static uint32_t group_word(int n, const k3_tensor *const *t)
{
    uint32_t w = OP_LIN | (uint32_t)n << 4;
    for (int j = 0; j < n; j++) w |= (uint32_t)t[j]->wid << (7 + 6 * j);
    return w;
}

void k3_dist_lin_n(const k3_model *m, int n, const k3_tensor *const *t, const float *x, uint32_t T, float *const *y)
{
    dist_lin *b = m->lin;
    if (!b || b->err) return;                           /* a failure is already waiting to be reported */
    const int R = k3_dist_size();
    const k3_tensor *g[K3_SPLIT_GROUP_MAX];             /* the split members, in call order */
    float *gy[K3_SPLIT_GROUP_MAX];
    int ns = 0;
    k3_diag *d = &b->d;
    for (int j = 0; j < n; j++)
        if (t[j]->split) {
            if (ns == K3_SPLIT_GROUP_MAX || t[j]->layer != t[0]->layer || t[j]->mat.cols != t[0]->mat.cols) {
                b->err = k3_fail(d, K3_ERR_INTERNAL, "a group of split matrices that is not one (%s)", t[j]->name);
                return;
            }
            g[ns] = t[j];
            gy[ns++] = y[j];
        }
    const uint32_t cols = t[0]->mat.cols;
    uint32_t hdr[3] = {group_word(ns, g), g[0]->layer < 0 ? UINT32_MAX : (uint32_t)g[0]->layer, T};
    k3_err e = k3_dist_bcast(hdr, sizeof hdr, d);
    if (!e) e = k3_dist_bcast((void *)x, (size_t)T * cols * sizeof(float), d);
    if (e) { b->err = e; return; }
    for (int j = 0; j < ns; j++) lin_slice(m, g[j], x, T, gy[j] + g[j]->lo, g[j]->mat.rows);   /* rank 0's rows */
    for (int j = 0; j < n; j++)                         /* the others whole, while the ranks compute */
        if (!t[j]->split) k3_matmul(m->o.isa, &t[j]->mat, x, cols, T, y[j], t[j]->mat.rows);
    k3_err first = K3_OK;
    for (int r = 1; r < R && !e; r++) {                 /* every rank's answer, even after an error */
        uint32_t lo[K3_SPLIT_GROUP_MAX], hi[K3_SPLIT_GROUP_MAX];
        size_t total = 0;
        for (int j = 0; j < ns; j++) {
            k3_split_rows(g[j]->mat.rows, r, R, &lo[j], &hi[j]);
            total += (size_t)T * (hi[j] - lo[j]);
        }
        dist_status st;
        if ((e = k3_dist_recv(r, TAG_STATUS, &st, sizeof st, d))) break;
        if (st.code != K3_OK) {
            st.msg[sizeof st.msg - 1] = 0;
            if (!first) first = k3_fail(&b->d, (k3_err)st.code, "rank %d of %d: %s", r, R, st.msg);
            continue;
        }
        if (grow(&b->y, &b->y_cap, total ? total : 1)) {
            e = k3_fail(d, K3_ERR_NOMEM, "out of memory for the trunk's exchange between ranks");
            break;
        }
        if ((e = k3_dist_recv(r, TAG_ROWS, b->y, total * sizeof(float), d))) break;
        const float *p = b->y;                          /* [member][T][its rows on rank r] */
        for (int j = 0; j < ns; j++) {
            const size_t k = hi[j] - lo[j], rows = g[j]->mat.rows;
            for (uint32_t i = 0; i < T; i++, p += k) memcpy(gy[j] + i * rows + lo[j], p, k * sizeof(float));
        }
    }
    b->err = e ? e : first;
}

void k3_dist_lin(const k3_model *m, const k3_tensor *t, const float *x, uint32_t T, float *y)
{
    k3_dist_lin_n(m, 1, &t, x, T, &y);
}

k3_err k3_dist_lin_check(const k3_model *m, k3_diag *d)
{
    if (!m->lin || !m->lin->err) return K3_OK;
    *d = m->lin->d;
    return m->lin->err;
}

k3_err k3_dist_serve_lin(k3_model *m, const uint32_t *hdr, k3_diag *d)
{
    const int me = k3_dist_rank();
    const int ns = (int)(hdr[0] >> 4 & 7), layer = hdr[1] == UINT32_MAX ? -1 : (int)hdr[1];
    const uint32_t T = hdr[2];
    const k3_tensor *g[K3_SPLIT_GROUP_MAX];
    size_t total = 0;
    int ok = ns >= 1 && ns <= K3_SPLIT_GROUP_MAX && T >= 1 && T <= m->o.max_batch && layer >= -1 &&
             layer < (int)m->d.L;
    for (int j = 0; j < ns && ok; j++) {
        uint32_t wid = hdr[0] >> (7 + 6 * j) & 63;
        g[j] = wid < K3W__COUNT ? k3w_get(m->w, layer, (k3_wid)wid) : NULL;
        ok = g[j] && g[j]->split && g[j]->mat.cols == g[0]->mat.cols;
        if (ok) total += (size_t)T * (g[j]->hi - g[j]->lo);
    }
    if (!ok)
        return k3_fail(d, K3_ERR_INTERNAL, "rank %d: rank 0 asks for rows of matrices this rank has not split "
                       "(header %08x, layer %d, %u tokens): the ranks run different k3run builds or options",
                       me, hdr[0], layer, T);
    dist_lin *b = m->lin;
    const size_t cols = g[0]->mat.cols;
    dist_status st;
    memset(&st, 0, sizeof st);
    if (grow(&b->x, &b->x_cap, T * cols) || grow(&b->y, &b->y_cap, total ? total : 1))
        return k3_fail(d, K3_ERR_NOMEM, "rank %d: out of memory for the trunk's exchange between ranks", me);
    k3_err e = k3_dist_bcast(b->x, T * cols * sizeof(float), d);
    if (e) return e;
    float *p = b->y;                                    /* [member][T][its rows here] */
    for (int j = 0; j < ns; j++) {
        const uint32_t k = g[j]->hi - g[j]->lo;
        lin_slice(m, g[j], b->x, T, p, k);
        p += (size_t)T * k;
    }
    if ((e = k3_dist_send(0, TAG_STATUS, &st, sizeof st, d))) return e;
    return k3_dist_send(0, TAG_ROWS, b->y, total * sizeof(float), d);
}

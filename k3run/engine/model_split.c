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
 * Per split matrix t [rows][cols] and product of T tokens (k3_lin of a tensor with t->split):
 *   1. broadcast from rank 0: a header {OP_LIN | wid << 8, layer (UINT32_MAX: model level), T},
 *      then x [T][cols] fp32;
 *   2. every rank computes its rows [lo, hi) (k3_split_rows), rank 0 into y directly;
 *   3. each other rank sends rank 0 a status and then its rows [T][hi - lo]; rank 0 puts them in y.
 * Bytes: 12 + 4 T cols to each rank, 260 + 4 T (hi - lo) back from each (k3_split_traffic).
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

void k3_dist_lin(const k3_model *m, const k3_tensor *t, const float *x, uint32_t T, float *y)
{
    dist_lin *b = m->lin;
    if (!b || b->err) return;                           /* a failure is already waiting to be reported */
    const int R = k3_dist_size();
    const uint32_t rows = t->mat.rows, cols = t->mat.cols;
    uint32_t hdr[3] = {OP_LIN | (uint32_t)t->wid << 8, t->layer < 0 ? UINT32_MAX : (uint32_t)t->layer, T};
    k3_diag *d = &b->d;
    k3_err e = k3_dist_bcast(hdr, sizeof hdr, d);
    if (!e) e = k3_dist_bcast((void *)x, (size_t)T * cols * sizeof(float), d);
    if (!e) lin_slice(m, t, x, T, y + t->lo, rows);     /* rank 0's rows while the others compute theirs */
    k3_err first = K3_OK;
    for (int r = 1; r < R && !e; r++) {                 /* every rank's answer, even after an error */
        uint32_t lo, hi;
        k3_split_rows(rows, r, R, &lo, &hi);
        dist_status st;
        if ((e = k3_dist_recv(r, TAG_STATUS, &st, sizeof st, d))) break;
        if (st.code != K3_OK) {
            st.msg[sizeof st.msg - 1] = 0;
            if (!first) first = k3_fail(&b->d, (k3_err)st.code, "rank %d of %d: %s", r, R, st.msg);
            continue;
        }
        const size_t n = hi - lo;
        if (grow(&b->y, &b->y_cap, (size_t)T * n)) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory for the trunk's "
                                                                "exchange between ranks"); break; }
        if ((e = k3_dist_recv(r, TAG_ROWS, b->y, (size_t)T * n * sizeof(float), d))) break;
        for (uint32_t i = 0; i < T; i++) memcpy(y + (size_t)i * rows + lo, b->y + i * n, n * sizeof(float));
    }
    b->err = e ? e : first;
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
    const uint32_t wid = hdr[0] >> 8, T = hdr[2];
    const int layer = hdr[1] == UINT32_MAX ? -1 : (int)hdr[1];
    const k3_tensor *t = wid < K3W__COUNT && layer >= -1 && layer < (int)m->d.L ? k3w_get(m->w, layer, (k3_wid)wid) : NULL;
    if (!t || !t->split || T == 0 || T > m->o.max_batch)
        return k3_fail(d, K3_ERR_INTERNAL, "rank %d: rank 0 asks for rows of a matrix this rank has not split "
                       "(tensor %u of layer %d, %u tokens): the ranks run different k3run builds or options",
                       me, wid, layer, T);
    dist_lin *b = m->lin;
    const size_t cols = t->mat.cols, n = t->hi - t->lo;
    dist_status st;
    memset(&st, 0, sizeof st);
    if (grow(&b->x, &b->x_cap, T * cols) || grow(&b->y, &b->y_cap, n ? T * n : 1))
        return k3_fail(d, K3_ERR_NOMEM, "rank %d: out of memory for the trunk's exchange between ranks", me);
    k3_err e = k3_dist_bcast(b->x, T * cols * sizeof(float), d);
    if (e) return e;
    lin_slice(m, t, b->x, T, b->y, (uint32_t)n);
    if ((e = k3_dist_send(0, TAG_STATUS, &st, sizeof st, d))) return e;
    return k3_dist_send(0, TAG_ROWS, b->y, T * n * sizeof(float), d);
}


/*
 * model_ops.c - the fixed-order vector helpers every layer shares (dot
 * product, sum of squares, RMSNorm, the GLU activations) and the model's
 * matrix product (model_impl.h). The same code runs on every ISA.
 */
#include "model_impl.h"

#include <math.h>

#include "k3_math.h"
#include "k3_par.h"

double k3v_sumsq(const float *a, uint32_t n)
{
    double s = 0;
    for (uint32_t i = 0; i < n; i++) s += (double)a[i] * a[i];
    return s;
}

void k3v_rmsnorm(float *y, const float *x, const float *w, uint32_t n, float eps)
{
    float ms = (float)(k3v_sumsq(x, n) / n);
    float r = k3_rsqrtf(ms + eps);
    if (w)
        for (uint32_t i = 0; i < n; i++) y[i] = w[i] * (x[i] * r);
    else
        for (uint32_t i = 0; i < n; i++) y[i] = x[i] * r;
}

void k3_glu_part(const k3_model *m, float *g, const float *u, size_t n)
{
    const k3_config *c = m->cfg;
    if (c->hidden_act == K3_ACT_SITU)
        k3_situ_n((int)m->o.isa, g, u, n, (float)c->activation_situ_beta, (float)c->activation_situ_linear_beta);
    else
        k3_silu_mul_n((int)m->o.isa, g, u, n);
}

void k3_glu(const k3_model *m, float *g, const float *u, uint32_t n)
{
    /* element-wise: splitting it between threads changes nothing (chunks of 512) */
    long nc = (long)((n + 511) / 512);
    K3_PFOR(n >= 2048, for (long j = 0; j < nc; j++) {
        size_t i0 = (size_t)j * 512;
        k3_glu_part(m, g + i0, u + i0, n - i0 < 512 ? n - i0 : 512);
    });
}

const float *k3_xpack_batch(const k3_model *m, const float *x, uint32_t cols, uint32_t T)
{
    if (T < 2 || (uint64_t)T * k3_xpack_cols(cols) > m->xpk_cap) return NULL;
    return k3_xpack(m->o.isa, x, cols, T, cols, m->xpk) ? m->xpk : NULL;
}

void k3_lin(const k3_model *m, const k3_tensor *t, const float *x, uint32_t T, float *y)
{
    if (t->split) { k3_dist_lin(m, t, x, T, y); return; }   /* its rows are on every rank */
    const float *xp = k3_xpack_batch(m, x, t->mat.cols, T);
    if (t->mat.data) { k3_matmul_xp(m->o.isa, &t->mat, x, t->mat.cols, xp, T, y, t->mat.rows); return; }
    /* streamed in row pieces: each output element is one row's dot product, so the bits do not
       depend on the split (kern.h); a failed piece is reported by the layer's k3w_check */
    for (uint32_t r0 = 0, r1; r0 < t->mat.rows; r0 = r1) {
        k3_mat v;
        if (k3w_rows(m->w, t, r0, &v, &r1)) return;
        k3_matmul_xp(m->o.isa, &v, x, t->mat.cols, xp, T, y + r0, t->mat.rows);
    }
}

/*
 * y[j] [T][rows_j] = t[j] x [T][cols] for j < n, the same x, in one parallel region: the rows
 * of all n matrices as one list of 32-row blocks (the blocks k3_matmul cuts, so the same calls
 * of the kernel and the same bits). k3_lin_fused does it only when every tensor is whole in
 * memory (returns 0, computing nothing, when one is streamed in row pieces: their pieces are
 * read in the unit's order of use, so a caller that fused products out of that order keeps
 * its plain order then); k3_lin_n falls back to k3_lin one after the other. With the trunk
 * split across ranks, the split ones among them go through one exchange (model_split.c).
 */
void k3_lin_n(const k3_model *m, int n, const k3_tensor *const *t, const float *x, uint32_t T, float *const *y)
{
    if (!k3_lin_fused(m, n, t, x, T, y))
        for (int j = 0; j < n; j++) k3_lin(m, t[j], x, T, y[j]);
}

int k3_lin_fused(const k3_model *m, int n, const k3_tensor *const *t, const float *x, uint32_t T, float *const *y)
{
    const uint32_t BR = K3_KERN_BLOCK;
    long start[K3_LIN_MAX + 1];                                   /* first block of each matrix */
    double work = 0;
    int piecewise = 0, split = 0;
    start[0] = 0;
    for (int j = 0; j < n; j++) {
        piecewise |= !t[j]->mat.data;
        split |= t[j]->split;
        start[j + 1] = start[j] + (long)((t[j]->mat.rows + BR - 1) / BR);
        work += (double)t[j]->mat.rows * t[j]->mat.cols * T;
    }
    if (piecewise || n > K3_LIN_MAX) return 0;
    if (split) { k3_dist_lin_n(m, n, t, x, T, y); return 1; }   /* across the ranks, one exchange */
    const long nb = start[n];
    const float *xp = k3_xpack_batch(m, x, t[0]->mat.cols, T);   /* every t[j] has x's cols */
    K3_PFOR(work >= 65536, for (long b = 0; b < nb; b++) {
        int j = 0;
        while (b >= start[j + 1]) j++;
        const k3_mat *W = &t[j]->mat;
        uint32_t r0 = (uint32_t)(b - start[j]) * BR, r1 = W->rows - r0 < BR ? W->rows : r0 + BR;
        k3_matmul_rows_xp(m->o.isa, W, x, W->cols, xp, T, y[j], W->rows, r0, r1);
    });
    return 1;
}

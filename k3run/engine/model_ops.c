/*
 * model_ops.c - the fixed-order vector helpers every layer shares (dot
 * product, sum of squares, RMSNorm, the GLU activations) and the model's
 * matrix product (model_impl.h). The same code runs on every ISA.
 */
#include "model_impl.h"

#include <math.h>

#include "k3_math.h"

float k3v_dot(const float *a, const float *b, uint32_t n)
{
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    float s4[4], s2[2];
    for (int l = 0; l < 4; l++) s4[l] = acc[l] + acc[l + 4];
    for (int l = 0; l < 2; l++) s2[l] = s4[l] + s4[l + 2];
    return s2[0] + s2[1];
}

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

void k3_glu(const k3_config *c, float *g, const float *u, uint32_t n)
{
    /* element-wise: splitting it between threads changes nothing */
    if (c->hidden_act == K3_ACT_SITU) {
        float b = (float)c->activation_situ_beta, bl = (float)c->activation_situ_linear_beta;
        K3_PFOR(n >= 8192, for (uint32_t i = 0; i < n; i++) g[i] = k3_situf(g[i], u[i], b, bl););
    } else {
        K3_PFOR(n >= 8192, for (uint32_t i = 0; i < n; i++) g[i] = k3_siluf(g[i]) * u[i];);
    }
}

void k3_lin(const k3_model *m, const k3_tensor *t, const float *x, uint32_t T, float *y)
{
    if (t->mat.data) { k3_matmul(m->o.isa, &t->mat, x, t->mat.cols, T, y, t->mat.rows); return; }
    /* streamed in row pieces: each output element is one row's dot product, so the bits do not
       depend on the split (kern.h); a failed piece is reported by the layer's k3w_check */
    for (uint32_t r0 = 0, r1; r0 < t->mat.rows; r0 = r1) {
        k3_mat v;
        if (k3w_rows(m->w, t, r0, &v, &r1)) return;
        k3_matmul(m->o.isa, &v, x, t->mat.cols, T, y + r0, t->mat.rows);
    }
}

/*
 * kern_scalar.c - the scalar reference of the matrix products (kern.h).
 *
 * Written to be obviously the canonical summation order of docs/KERNELS.md:
 * every output element is one dot product over 16 lanes (element i in lane
 * i % 16, each lane accumulated with fmaf in increasing i from +0.0f), reduced
 * by the fixed tree. Weights are decoded one element at a time with the
 * helpers of common/k3_num.h. Compiled for baseline x86-64: fmaf is the libm
 * function (exact, IEEE fused multiply-add), no vector code.
 */
#include "kern.h"

#include <math.h>

#include "k3_num.h"
#include "k3_shard.h"

/* The fixed reduction tree of the 16 lane sums (kern.h). */
static float reduce16(const float acc[16])
{
    float a[8], b[4], c[2];
    for (int j = 0; j < 8; j++) a[j] = acc[j] + acc[j + 8];
    for (int j = 0; j < 4; j++) b[j] = a[j] + a[j + 4];
    for (int j = 0; j < 2; j++) c[j] = b[j] + b[j + 2];
    return c[0] + c[1];
}

/* Element i of row r as an fp32 weight, exactly as the canonical order defines it. */
static float weight(const k3_mat *W, uint32_t r, uint32_t i)
{
    if (W->enc == K3_ENC_BF16) {
        const uint16_t *row = (const uint16_t *)W->data + (size_t)r * W->cols;   /* [cols] bf16 */
        return k3_bf16_to_f32(row[i]);
    }
    if (W->enc == K3_ENC_Q8) {                /* a compact trunk: q * 2^(s - 127), exact */
        const int8_t *row = (const int8_t *)W->data + (size_t)r * W->cols;        /* [cols] codes */
        const uint8_t *sc = W->scales + (size_t)r * (W->cols / 32);                /* [cols/32] */
        return (float)row[i] * k3_e8m0_to_f32(sc[i / 32]);
    }
    const uint8_t *row = (const uint8_t *)W->data + (size_t)r * (W->cols / 2);  /* [cols/2] */
    const uint8_t *sc = W->scales + (size_t)r * (W->cols / 32);                 /* [cols/32] */
    uint8_t byte = row[i / 2];
    uint8_t code = (i % 2 == 0) ? (byte & 15) : (byte >> 4);
    float e2m1 = k3_e2m1_to_f32(code);
    float scale = k3_e8m0_to_f32(sc[i / 32]);
    return e2m1 * scale;                      /* one IEEE fp32 multiply (no contraction) */
}

/* The canonical weight of every (scale code, element code) pair, for the table
 * lookups of the AVX-512 matrix-vector kernel; filled at load time by the same
 * multiply as weight() above (this file is compiled for baseline x86-64). */
float k3_mx_table[256][16] __attribute__((aligned(64)));

__attribute__((constructor)) static void mx_table_fill(void)
{
    for (int s = 0; s < 256; s++)
        for (int c = 0; c < 16; c++) {
            float e2m1 = k3_e2m1_to_f32((uint8_t)c), scale = k3_e8m0_to_f32((uint8_t)s);
            k3_mx_table[s][c] = e2m1 * scale;
        }
}

void k3_kern_rows_scalar(const k3_mat *W, const float *x, size_t ldx, const float *xp, uint32_t T,
                         float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    (void)xp;                                                /* x as it is: no packing here */
    for (uint32_t t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * ldx;                                   /* [cols] */
        for (uint32_t r = r0; r < r1; r++) {
            float acc[16];                                                       /* lanes */
            for (int l = 0; l < 16; l++) acc[l] = 0.0f;
            for (uint32_t i = 0; i < W->cols; i++)
                acc[i % 16] = fmaf(weight(W, r, i), xt[i], acc[i % 16]);
            y[(size_t)t * ldy + r] = reduce16(acc);
        }
    }
}

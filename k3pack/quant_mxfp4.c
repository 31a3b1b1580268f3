/* quant_mxfp4.c - BF16 -> MXFP4 quantization, the OCP rule (see header). */
#include "quant_mxfp4.h"

#include <math.h>

#include "k3_checked.h"
#include "k3_num.h"

long k3_quant_mxfp4_row(const uint8_t *bf16, size_t cols, uint8_t *packed, uint8_t *scales,
                        k3_quant_stats *st)
{
    float x[32];                                   /* one block, as f32 (exact) */
    for (size_t b = 0; b < cols / 32; b++) {
        float amax = 0.0f;
        for (int k = 0; k < 32; k++) {
            x[k] = k3_bf16_to_f32(k3_ld16(bf16 + 2 * (b * 32 + k)));
            if (!isfinite(x[k])) return (long)(b * 32 + k);
            float a = fabsf(x[k]);
            if (a > amax) amax = a;
        }
        int code = 0;
        if (amax > 0.0f) {
            int ex;
            frexpf(amax, &ex);                     /* amax = m * 2^ex, m in [0.5, 1) */
            int e = (ex - 1) - 2;                  /* floor(log2(amax)) - 2 */
            code = e + 127;
            if (code < 0) code = 0;
            if (code > 254) code = 254;
        }
        scales[b] = (uint8_t)code;
        int sexp = code - 127;
        float s = k3_e8m0_to_f32((uint8_t)code);
        for (int k = 0; k < 32; k += 2) {
            uint8_t lo = k3_f32_to_e2m1(ldexpf(x[k], -sexp));
            uint8_t hi = k3_f32_to_e2m1(ldexpf(x[k + 1], -sexp));
            packed[(b * 32 + k) / 2] = (uint8_t)(lo | hi << 4);
            if (st) {
                double d0 = (double)k3_e2m1_to_f32(lo) * s - x[k], d1 = (double)k3_e2m1_to_f32(hi) * s - x[k + 1];
                st->err2 += d0 * d0 + d1 * d1;
                st->ref2 += (double)x[k] * x[k] + (double)x[k + 1] * x[k + 1];
                st->saturated += (fabsf(ldexpf(x[k], -sexp)) > 6.0f) + (fabsf(ldexpf(x[k + 1], -sexp)) > 6.0f);
            }
        }
    }
    if (st) st->n += cols;
    return -1;
}

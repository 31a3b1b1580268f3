/* quant_q8.c - see quant_q8.h. */
#include "quant_q8.h"

#include <math.h>
#include <string.h>

long k3_quant_q8_row(const uint8_t *bf16, size_t cols, int8_t *codes, uint8_t *scales, k3_quant_stats *st)
{
    for (size_t b = 0; b < cols / 32; b++) {
        float x[32];                                     /* [32] the block, widened exactly */
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) {
            uint32_t u = (uint32_t)(bf16[2 * (32 * b + i)] | bf16[2 * (32 * b + i) + 1] << 8) << 16;
            memcpy(&x[i], &u, 4);
            if (!isfinite(x[i])) return (long)(32 * b + (size_t)i);
            if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
        }
        int code = 0;
        if (amax > 0.0f) {
            int k;
            double m = frexp((double)amax / 127.0, &k);   /* amax / 127 = m 2^k, m in [0.5, 1) */
            int e = m == 0.5 ? k - 1 : k;                 /* the smallest e with amax / 2^e <= 127 */
            code = e + 127 < 1 ? 1 : e + 127 > 254 ? 254 : e + 127;
        }
        scales[b] = (uint8_t)code;
        float s = ldexpf(1.0f, code - 127);
        for (int i = 0; i < 32; i++) {
            float q = code ? rintf(x[i] / s) : 0.0f;     /* x / s is exact: a power of two */
            if (q > 127.0f) q = 127.0f;
            if (q < -127.0f) q = -127.0f;
            codes[32 * b + i] = (int8_t)q;
            if (st) {
                double d = (double)q * (code ? s : 0.0f) - x[i];
                st->err2 += d * d;
                st->ref2 += (double)x[i] * x[i];
                st->n++;
            }
        }
    }
    return -1;
}

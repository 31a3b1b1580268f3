/*
 * quant_mxfp4.h - BF16 -> MXFP4 (docs/FORMAT.md section 4, the OCP rule):
 * per block of 32: e = floor(log2(amax)) - 2, scale code clamp(e + 127, 0, 254),
 * element = nearest E2M1 of x / 2^(code-127), ties to the even code, saturate
 * at 6, sign bit = sign bit of x. An all-zero block gets scale code 0.
 */
#ifndef K3_QUANT_MXFP4_H
#define K3_QUANT_MXFP4_H

#include <stddef.h>
#include <stdint.h>

/* Error statistics, summed over everything quantized. */
typedef struct k3_quant_stats {
    double err2;      /* sum of (dequantized - x)^2 */
    double ref2;      /* sum of x^2 */
    uint64_t n;       /* elements */
    uint64_t saturated;  /* elements clipped to +-6 * scale */
} k3_quant_stats;

/*
 * Quantize one row of cols BF16 values (little-endian bytes, may be
 * unaligned) into packed[cols/2] and scales[cols/32]. cols % 32 == 0.
 * Returns the index of the first NaN/inf element, or -1 if all are finite.
 */
long k3_quant_mxfp4_row(const uint8_t *bf16, size_t cols, uint8_t *packed, uint8_t *scales,
                        k3_quant_stats *st);

#endif

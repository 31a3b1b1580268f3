/*
 * quant_q8.h - BF16 -> Q8, the compact trunk (k3pack --trunk q8, docs/FORMAT.md 3):
 * per block of 32 elements of a row, amax = max |x|; an all-zero block gets scale code 0
 * and codes 0; otherwise e = the smallest integer with amax / 2^e <= 127, scale code
 * clamp(e + 127, 1, 254), code q = round-half-even(x / 2^(code - 127)) clamped to
 * [-127, 127]. The value q * 2^(code - 127) is exact in fp32 (and a BF16 number).
 * tests/reference/trunk_quant.py is the independent NumPy reference (bit equality).
 */
#ifndef K3_QUANT_Q8_H
#define K3_QUANT_Q8_H

#include <stddef.h>
#include <stdint.h>

#include "quant_mxfp4.h"

/* One row of cols BF16 values (little-endian bytes, may be unaligned) into codes[cols] and
   scales[cols/32]; cols % 32 == 0. Returns the index of the first NaN/inf, or -1. */
long k3_quant_q8_row(const uint8_t *bf16, size_t cols, int8_t *codes, uint8_t *scales, k3_quant_stats *st);

#endif

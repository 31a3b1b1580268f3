/*
 * k3_num.h - scalar number formats: bf16, f16, e8m0 (MX scale), e2m1 (FP4).
 *
 * bf16 -> f32 is exact (shift). f32 -> bf16 rounds to nearest even; NaN stays
 * a quiet NaN. f16 <-> f32 handles subnormals, inf and NaN. e8m0 code e means
 * 2^(e-127); code 255 is NaN. e2m1 code: bit 3 sign, bits 0-2 index into
 * {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
 */
#ifndef K3_NUM_H
#define K3_NUM_H

#include <stdint.h>

float k3_bf16_to_f32(uint16_t h);
uint16_t k3_f32_to_bf16(float f);
float k3_f16_to_f32(uint16_t h);
uint16_t k3_f32_to_f16(float f);
float k3_e8m0_to_f32(uint8_t e);
float k3_e2m1_to_f32(uint8_t code);   /* low 4 bits used */

/* Nearest E2M1 code for x (already divided by its block scale): ties go to
 * the even code index, |x| > 6 saturates to 6, sign bit = signbit(x). */
uint8_t k3_f32_to_e2m1(float x);

extern const float k3_e2m1_values[16];

#endif

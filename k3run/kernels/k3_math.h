/*
 * k3_math.h - the engine's non-matmul math: one implementation of exp,
 * sigmoid, SiLU, tanh, softplus and SiTU used by every path, so results
 * cannot drift between ISAs, machines or libm versions. Written in plain C,
 * evaluated in double and rounded once to fp32; compiled without FMA
 * contraction (-ffp-contract=off), so the same bits everywhere.
 */
#ifndef K3_MATH_H
#define K3_MATH_H

#include <math.h>
#include <stddef.h>

float k3_expf(float x);        /* e^x: correctly rounded in practice (double evaluation) */
float k3_logf(float x);        /* natural log, x > 0 */
float k3_sigmoidf(float x);    /* 1 / (1 + e^-x) */
float k3_siluf(float x);       /* x * sigmoid(x) */
float k3_tanhf(float x);
float k3_softplusf(float x);   /* log(1 + e^x), = x above 20 (as the reference) */
/* SiTU-GLU: [b*tanh(g/b)*sigmoid(g)] * [bl*tanh(u/bl)] */
float k3_situf(float g, float u, float b, float bl);
/* 1 / sqrt(x) as fp32: (float)(1.0 / sqrt(x)) */
float k3_rsqrtf(float x);

/*
 * The same functions on arrays, in place, with the path isa (kern.h's k3_isa as an int:
 * 0 scalar, 1 avx2, 2 avx512): every element gets exactly the bits of the scalar function
 * above; avx2 uses four doubles at a time, avx512 eight (math_array.c picks, math_avx2.c and
 * math_avx512.c compute). Element-wise, so any
 * split of an array between threads gives the same bits.
 */
void k3_situ_n(int isa, float *g, const float *u, size_t n, float b, float bl);  /* g = situ(g, u) */
void k3_silu_mul_n(int isa, float *g, const float *u, size_t n);   /* g = k3_siluf(g) * u */
void k3_silu_n(int isa, float *x, size_t n);                       /* x = k3_siluf(x) */
void k3_sigmoid_n(int isa, float *x, size_t n);                    /* x = k3_sigmoidf(x) */
void k3_exp_n(int isa, float *x, size_t n);                        /* x = k3_expf(x) */
/* For the vector forms: d a power of two whose reciprocal is exact (x / d = x * (1 / d), the same
   bits), far from the exponent's ends. */
static inline int k3_is_pow2(double d)
{
    int e;
    return d > 0 && isfinite(d) && frexp(d, &e) == 0.5 && e > -1020 && e < 1020;
}
/* math_avx2.c (call only where the CPU has AVX2) */
void k3_situ_avx2(float *g, const float *u, size_t n, float b, float bl);
void k3_silu_mul_avx2(float *g, const float *u, size_t n);
void k3_sigmoid_avx2(float *x, size_t n);
void k3_exp_avx2(float *x, size_t n);
/* math_avx512.c (call only where the CPU has AVX-512): the same, eight doubles at a time */
void k3_situ_avx512(float *g, const float *u, size_t n, float b, float bl);
void k3_silu_mul_avx512(float *g, const float *u, size_t n);
void k3_sigmoid_avx512(float *x, size_t n);
void k3_exp_avx512(float *x, size_t n);

#endif

/*
 * math_array.c - the array forms of k3_math.h: the AVX-512 code of math_avx512.c or
 * the AVX2 code of math_avx2.c where the path (and the CPU) allows it, else the scalar
 * functions in a loop.
 * Compiled for baseline x86-64 like k3_math.c.
 */
#include "k3_math.h"

#include "kern.h"

/* The array forms (k3_math.h): the widest vector code the path allows, else the loops. */
static int use_avx2(int isa) { return isa >= K3_ISA_AVX2 && k3_isa_supported(K3_ISA_AVX2); }
static int use_avx512(int isa) { return isa >= K3_ISA_AVX512 && k3_isa_supported(K3_ISA_AVX512); }

void k3_situ_n(int isa, float *g, const float *u, size_t n, float b, float bl)
{
    if (use_avx512(isa)) { k3_situ_avx512(g, u, n, b, bl); return; }
    if (use_avx2(isa)) { k3_situ_avx2(g, u, n, b, bl); return; }
    for (size_t i = 0; i < n; i++) g[i] = k3_situf(g[i], u[i], b, bl);
}

void k3_silu_mul_n(int isa, float *g, const float *u, size_t n)
{
    if (use_avx512(isa)) { k3_silu_mul_avx512(g, u, n); return; }
    if (use_avx2(isa)) { k3_silu_mul_avx2(g, u, n); return; }
    for (size_t i = 0; i < n; i++) g[i] = k3_siluf(g[i]) * u[i];
}

void k3_silu_n(int isa, float *x, size_t n)
{
    float one[256];                                  /* silu(x) * 1.0f: the same bits as silu(x) */
    for (int i = 0; i < 256; i++) one[i] = 1.0f;
    for (size_t i = 0; i < n; i += 256) k3_silu_mul_n(isa, x + i, one, n - i < 256 ? n - i : 256);
}

void k3_sigmoid_n(int isa, float *x, size_t n)
{
    if (use_avx512(isa)) { k3_sigmoid_avx512(x, n); return; }
    if (use_avx2(isa)) { k3_sigmoid_avx2(x, n); return; }
    for (size_t i = 0; i < n; i++) x[i] = k3_sigmoidf(x[i]);
}

void k3_exp_n(int isa, float *x, size_t n)
{
    if (use_avx512(isa)) { k3_exp_avx512(x, n); return; }
    if (use_avx2(isa)) { k3_exp_avx2(x, n); return; }
    for (size_t i = 0; i < n; i++) x[i] = k3_expf(x[i]);
}

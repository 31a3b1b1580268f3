/*
 * kern_avx512.c - the AVX-512 (F, BW, VL, DQ) path of the matrix products
 * (kern.h), compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -O3.
 *
 * The kernels are kern_simd.h with two rows per __m512 (KS_NR 2): each
 * 256-bit half of every vector does for its row exactly what the AVX2 path
 * does with one __m256, so the only new code here is the table of one-line
 * operation mappings below. Every operation used acts on each 256-bit half
 * (or each 128-bit lane) independently, like its AVX2 namesake. The same
 * kernel structure on pairs of AVX2 registers (k3_kern_rows_avx2x2) is
 * tested bit for bit on every AVX2 machine; this file runs where the CPU has
 * AVX-512.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kern.h"

/* [lo | hi]: lo in bits 0-255 (the first row), hi in bits 256-511 (the second row) */
static inline __m512i k3_512_join(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

static inline __m256i k3_512_bq1(const void *p)
{
    long long v;
    memcpy(&v, p, 8);
    return _mm256_set1_epi64x(v);
}

static inline __m256i k3_512_b128(const void *p)
{
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
}

static inline __m512 k3_512_bf(const float *p0, const float *p1)
{
    return _mm512_castsi512_ps(k3_512_join(_mm256_castps_si256(_mm256_broadcast_ss(p0)),
                                           _mm256_castps_si256(_mm256_broadcast_ss(p1))));
}

static inline void k3_512_halves(__m512 v, float *o0, float *o1)
{
    _mm256_storeu_ps(o0, _mm512_castps512_ps256(v));
    _mm256_storeu_ps(o1, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

#define KS_NR 2
#define KS_FN(name) ks_##name##_avx512
#define ks_vf __m512
#define ks_vi __m512i
#define ks_zero() _mm512_setzero_ps()
#define ks_fma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define ks_sub(a, b) _mm512_sub_ps(a, b)
#define ks_mul(a, b) _mm512_mul_ps(a, b)
#define ks_orf(a, i) _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a), i))
#define ks_and(a, b) _mm512_and_si512(a, b)
#define ks_srli32(a, n) _mm512_srli_epi32(a, n)
#define ks_slli32(a, n) _mm512_slli_epi32(a, n)
#define ks_pshufb(t, i) _mm512_shuffle_epi8(t, i)               /* per 128-bit lane (BW) */
#define ks_shuf_even(a, b) _mm512_shuffle_ps(a, b, 0x88)        /* per 128-bit lane */
#define ks_shuf_odd(a, b) _mm512_shuffle_ps(a, b, 0xDD)
#define ks_unplo16(a, b) _mm512_unpacklo_epi16(a, b)            /* per 128-bit lane (BW) */
#define ks_unphi16(a, b) _mm512_unpackhi_epi16(a, b)
#define ks_permq_d8(a) _mm512_permutex_epi64(a, 0xD8)           /* per 256-bit half */
#define ks_if(a) _mm512_castsi512_ps(a)
#define ks_ldx8(p) _mm512_broadcast_f32x8(_mm256_loadu_ps(p))   /* DQ */
#define ks_ld256(p0, p1) k3_512_join(_mm256_loadu_si256((const __m256i *)(const void *)(p0)), \
                                     _mm256_loadu_si256((const __m256i *)(const void *)(p1)))
#define ks_bq(p0, p1) k3_512_join(k3_512_bq1(p0), k3_512_bq1(p1))
#define ks_b128(p0, p1) k3_512_join(k3_512_b128(p0), k3_512_b128(p1))
#define ks_bf(p0, p1) k3_512_bf(p0, p1)
#define ks_c32(p) _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define ks_set1i(c) _mm512_set1_epi32(c)
#define ks_halves(v, o0, o1) k3_512_halves(v, o0, o1)
#define ks_reg(v) ((void)0)                                     /* 32 registers: not needed */
#include "kern_simd.h"

void k3_kern_rows_avx512(const k3_mat *W, const float *x, size_t ldx, uint32_t T,
                         float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    ks_rows_avx512(W, x, ldx, T, y, ldy, r0, r1);
}

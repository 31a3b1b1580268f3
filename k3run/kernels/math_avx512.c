/*
 * math_avx512.c - k3_math.c's exp, tanh, sigmoid, SiLU and SiTU on arrays, eight
 * doubles at a time (AVX-512 F + DQ; compiled without FMA contraction).
 *
 * math_avx2.c with 512-bit vectors: the same IEEE double operations in the
 * same order, every branch computed and the right one chosen per element (a
 * mask blend here, blendv there), so every element gets the bits of the scalar
 * function; tests/unit/test_math.c checks both paths against it.
 */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>

#include "k3_math.h"

/* exp_d of k3_math.c */
static inline __m512d v_exp(__m512d x)
{
    const __m512d log2e = _mm512_set1_pd(1.44269504088896338700e+00);
    const __m512d ln2_hi = _mm512_set1_pd(6.93147180369123816490e-01);
    const __m512d ln2_lo = _mm512_set1_pd(1.90821492927058770002e-10);
    static const double inv_fact[10] = {
        1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0};
    __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d r = _mm512_sub_pd(_mm512_sub_pd(x, _mm512_mul_pd(n, ln2_hi)), _mm512_mul_pd(n, ln2_lo));
    __m512d p = _mm512_set1_pd(1.0 / 3628800.0);
    for (int i = 0; i < 10; i++) p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(inv_fact[i]));
    /* 2^k as (2^adj) * 2^(k - adj), adj = 1000 above 1000, -1000 below -1000, else 0 (x 1.0: exact) */
    __m256i k = _mm512_cvtpd_epi32(n);              /* garbage for the special x: blended away */
    __m256i hi = _mm256_cmpgt_epi32(k, _mm256_set1_epi32(1000));
    __m256i lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(-1000), k);
    __m256i adj = _mm256_or_si256(_mm256_and_si256(hi, _mm256_set1_epi32(1000)),
                                  _mm256_and_si256(lo, _mm256_set1_epi32(-1000)));
    __m256i k2 = _mm256_sub_epi32(k, adj);
    const __m512i bias = _mm512_set1_epi64(1023);
    __m512d f1 = _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_add_epi64(_mm512_cvtepi32_epi64(adj), bias), 52));
    __m512d f2 = _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_add_epi64(_mm512_cvtepi32_epi64(k2), bias), 52));
    __m512d y = _mm512_mul_pd(_mm512_mul_pd(p, f1), f2);
    y = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(x, _mm512_set1_pd(710.0), _CMP_GT_OQ), y,
                             _mm512_set1_pd(__builtin_inf()));
    y = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(x, _mm512_set1_pd(-746.0), _CMP_LT_OQ), y, _mm512_setzero_pd());
    return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q), y, x);
}

/* tanh_d of k3_math.c */
static inline __m512d v_tanh(__m512d x)
{
    const __m512d one = _mm512_set1_pd(1.0), sign = _mm512_set1_pd(-0.0);
    __m512d a = _mm512_andnot_pd(sign, x);
    __mmask8 small = _mm512_cmp_pd_mask(a, _mm512_set1_pd(0.5), _CMP_LT_OQ);
    __m512d e = v_exp(_mm512_mask_blend_pd(small, _mm512_mul_pd(_mm512_set1_pd(-2.0), a),
                                           _mm512_mul_pd(_mm512_set1_pd(2.0), a)));
    /* small: (e - 1) / (e + 1); else its negation, (1 - e) / (1 + e) (math_avx2.c) */
    __m512d rs = _mm512_div_pd(_mm512_sub_pd(e, one), _mm512_add_pd(e, one));
    __m512d r = _mm512_mask_blend_pd(small, _mm512_xor_pd(rs, sign), rs);
    r = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(x, _mm512_setzero_pd(), _CMP_LT_OQ), r, _mm512_xor_pd(r, sign));
    __mmask8 is_tiny = _mm512_cmp_pd_mask(a, _mm512_set1_pd(1e-4), _CMP_LT_OQ);
    if (is_tiny) {                                  /* the series' division only where it is used */
        __m512d x2 = _mm512_mul_pd(a, a);
        __m512d tiny = _mm512_mul_pd(x, _mm512_sub_pd(one, _mm512_div_pd(x2, _mm512_set1_pd(3.0))));
        r = _mm512_mask_blend_pd(is_tiny, r, tiny);
    }
    __m512d pm1 = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(x, _mm512_setzero_pd(), _CMP_GT_OQ), _mm512_set1_pd(-1.0),
                                       one);
    r = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, _mm512_set1_pd(20.0), _CMP_GT_OQ), r, pm1);
    return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q), r, x);
}

/* 1 + e^-x in double */
static inline __m512d v_sig_den(__m512d xd)
{
    return _mm512_add_pd(_mm512_set1_pd(1.0), v_exp(_mm512_xor_pd(xd, _mm512_set1_pd(-0.0))));
}

/* x / d, as a multiplication by 1 / d where d is a power of two (the same bits) */
static inline __m512d v_div_by(__m512d x, __m512d d, __m512d inv, int pow2)
{
    return pow2 ? _mm512_mul_pd(x, inv) : _mm512_div_pd(x, d);
}

/* situ of eight elements: the scalar k3_situf's operations, vectorised */
static inline __m256 v_situ8(__m512d gd, __m512d ud, __m512d bd, __m512d bld, __m512d binv, int b2)
{
    __m512d left = _mm512_div_pd(_mm512_mul_pd(bd, v_tanh(v_div_by(gd, bd, binv, b2))), v_sig_den(gd));
    __m512d right = _mm512_mul_pd(bld, v_tanh(_mm512_div_pd(ud, bld)));
    return _mm512_cvtpd_ps(_mm512_mul_pd(left, right));
}

static inline __m512d ld8(const float *p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }

void k3_situ_avx512(float *g, const float *u, size_t n, float b, float bl)
{
    const __m512d bd = _mm512_set1_pd((double)b), bld = _mm512_set1_pd((double)bl);
    const int b2 = k3_is_pow2((double)b);
    const __m512d binv = _mm512_set1_pd(b2 ? 1.0 / (double)b : 0.0);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {                  /* two independent groups: their chains overlap */
        __m256 r0 = v_situ8(ld8(g + i), ld8(u + i), bd, bld, binv, b2);
        __m256 r1 = v_situ8(ld8(g + i + 8), ld8(u + i + 8), bd, bld, binv, b2);
        _mm256_storeu_ps(g + i, r0);
        _mm256_storeu_ps(g + i + 8, r1);
    }
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(g + i, v_situ8(ld8(g + i), ld8(u + i), bd, bld, binv, b2));
    for (; i < n; i++) g[i] = k3_situf(g[i], u[i], b, bl);
}

void k3_silu_mul_avx512(float *g, const float *u, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m512d gd = ld8(g + i);
        __m256 s = _mm512_cvtpd_ps(_mm512_div_pd(gd, v_sig_den(gd)));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) g[i] = k3_siluf(g[i]) * u[i];
}

void k3_sigmoid_avx512(float *x, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm512_cvtpd_ps(_mm512_div_pd(_mm512_set1_pd(1.0), v_sig_den(ld8(x + i)))));
    for (; i < n; i++) x[i] = k3_sigmoidf(x[i]);
}

void k3_exp_avx512(float *x, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm512_cvtpd_ps(v_exp(ld8(x + i))));
    for (; i < n; i++) x[i] = k3_expf(x[i]);
}

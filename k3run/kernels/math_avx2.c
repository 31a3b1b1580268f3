/*
 * math_avx2.c - k3_math.c's exp, tanh, sigmoid, SiLU and SiTU on arrays, four
 * doubles at a time (AVX2; compiled with -mavx2, without FMA contraction).
 *
 * Each function here is the scalar one of k3_math.c written with vectors:
 * the same IEEE double operations (+, -, *, /, round-to-nearest-even, exact
 * power-of-two scaling) in the same order, every branch computed and the
 * right one chosen per element with a blend. So every element gets the same
 * bits as the scalar function; tests/unit/test_kernels.c checks it on
 * millions of inputs and on every branch's edges.
 */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>

#include "k3_math.h"

/* exp_d of k3_math.c */
static inline __m256d v_exp(__m256d x)
{
    const __m256d log2e = _mm256_set1_pd(1.44269504088896338700e+00);
    const __m256d ln2_hi = _mm256_set1_pd(6.93147180369123816490e-01);
    const __m256d ln2_lo = _mm256_set1_pd(1.90821492927058770002e-10);
    static const double inv_fact[10] = {
        1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0};
    __m256d n = _mm256_round_pd(_mm256_mul_pd(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256d r = _mm256_sub_pd(_mm256_sub_pd(x, _mm256_mul_pd(n, ln2_hi)), _mm256_mul_pd(n, ln2_lo));
    __m256d p = _mm256_set1_pd(1.0 / 3628800.0);
    for (int i = 0; i < 10; i++) p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(inv_fact[i]));
    /* 2^k as (2^adj) * 2^(k - adj), adj = 1000 above 1000, -1000 below -1000, else 0 (x 1.0: exact) */
    __m128i k = _mm256_cvtpd_epi32(n);              /* garbage for the special x: blended away */
    __m128i hi = _mm_cmpgt_epi32(k, _mm_set1_epi32(1000));
    __m128i lo = _mm_cmpgt_epi32(_mm_set1_epi32(-1000), k);
    __m128i adj = _mm_or_si128(_mm_and_si128(hi, _mm_set1_epi32(1000)), _mm_and_si128(lo, _mm_set1_epi32(-1000)));
    __m128i k2 = _mm_sub_epi32(k, adj);
    const __m256i bias = _mm256_set1_epi64x(1023);
    __m256d f1 = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(_mm256_cvtepi32_epi64(adj), bias), 52));
    __m256d f2 = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(_mm256_cvtepi32_epi64(k2), bias), 52));
    __m256d y = _mm256_mul_pd(_mm256_mul_pd(p, f1), f2);
    y = _mm256_blendv_pd(y, _mm256_set1_pd(__builtin_inf()), _mm256_cmp_pd(x, _mm256_set1_pd(710.0), _CMP_GT_OQ));
    y = _mm256_blendv_pd(y, _mm256_setzero_pd(), _mm256_cmp_pd(x, _mm256_set1_pd(-746.0), _CMP_LT_OQ));
    return _mm256_blendv_pd(y, x, _mm256_cmp_pd(x, x, _CMP_UNORD_Q));
}

/* tanh_d of k3_math.c */
static inline __m256d v_tanh(__m256d x)
{
    const __m256d one = _mm256_set1_pd(1.0), sign = _mm256_set1_pd(-0.0);
    __m256d a = _mm256_andnot_pd(sign, x);
    __m256d small = _mm256_cmp_pd(a, _mm256_set1_pd(0.5), _CMP_LT_OQ);
    __m256d e = v_exp(_mm256_blendv_pd(_mm256_mul_pd(_mm256_set1_pd(-2.0), a),
                                       _mm256_mul_pd(_mm256_set1_pd(2.0), a), small));
    /* small: (e - 1) / (e + 1); else (1 - e) / (1 + e), which is exactly its negation (1 - e =
       -(e - 1) and 1 + e = e + 1 exactly, and a rounded quotient is odd in its numerator): one
       division for both */
    __m256d rs = _mm256_div_pd(_mm256_sub_pd(e, one), _mm256_add_pd(e, one));
    __m256d r = _mm256_blendv_pd(_mm256_xor_pd(rs, sign), rs, small);
    r = _mm256_blendv_pd(r, _mm256_xor_pd(r, sign), _mm256_cmp_pd(x, _mm256_setzero_pd(), _CMP_LT_OQ));
    __m256d is_tiny = _mm256_cmp_pd(a, _mm256_set1_pd(1e-4), _CMP_LT_OQ);
    if (_mm256_movemask_pd(is_tiny)) {              /* the series' division only where it is used */
        __m256d x2 = _mm256_mul_pd(a, a);
        __m256d tiny = _mm256_mul_pd(x, _mm256_sub_pd(one, _mm256_div_pd(x2, _mm256_set1_pd(3.0))));
        r = _mm256_blendv_pd(r, tiny, is_tiny);
    }
    __m256d pm1 = _mm256_blendv_pd(_mm256_set1_pd(-1.0), one, _mm256_cmp_pd(x, _mm256_setzero_pd(), _CMP_GT_OQ));
    r = _mm256_blendv_pd(r, pm1, _mm256_cmp_pd(a, _mm256_set1_pd(20.0), _CMP_GT_OQ));
    return _mm256_blendv_pd(r, x, _mm256_cmp_pd(x, x, _CMP_UNORD_Q));
}

/* 1 / (1 + e^-x) in double, of x [4] as doubles */
static inline __m256d v_sig_den(__m256d xd)
{
    return _mm256_add_pd(_mm256_set1_pd(1.0), v_exp(_mm256_xor_pd(xd, _mm256_set1_pd(-0.0))));
}

/* x / d, as a multiplication by 1 / d where d is a power of two (then both are the correctly
   rounded x 2^-k, the same bits) */
static inline __m256d v_div_by(__m256d x, __m256d d, __m256d inv, int pow2)
{
    return pow2 ? _mm256_mul_pd(x, inv) : _mm256_div_pd(x, d);
}

/* situ of four elements: the scalar k3_situf's operations, vectorised */
static inline __m128 v_situ4(__m256d gd, __m256d ud, __m256d bd, __m256d bld, __m256d binv, int b2)
{
    __m256d left = _mm256_div_pd(_mm256_mul_pd(bd, v_tanh(v_div_by(gd, bd, binv, b2))), v_sig_den(gd));
    __m256d right = _mm256_mul_pd(bld, v_tanh(_mm256_div_pd(ud, bld)));
    return _mm256_cvtpd_ps(_mm256_mul_pd(left, right));
}

void k3_situ_avx2(float *g, const float *u, size_t n, float b, float bl)
{
    const __m256d bd = _mm256_set1_pd((double)b), bld = _mm256_set1_pd((double)bl);
    const int b2 = k3_is_pow2((double)b);
    const __m256d binv = _mm256_set1_pd(b2 ? 1.0 / (double)b : 0.0);
    size_t i = 0;
    /* eight elements per step, as two independent groups of four: the long dependency chains
       of their exponentials overlap */
    for (; i + 8 <= n; i += 8) {
        __m128 r0 = v_situ4(_mm256_cvtps_pd(_mm_loadu_ps(g + i)), _mm256_cvtps_pd(_mm_loadu_ps(u + i)), bd, bld,
                            binv, b2);
        __m128 r1 = v_situ4(_mm256_cvtps_pd(_mm_loadu_ps(g + i + 4)), _mm256_cvtps_pd(_mm_loadu_ps(u + i + 4)), bd,
                            bld, binv, b2);
        _mm_storeu_ps(g + i, r0);
        _mm_storeu_ps(g + i + 4, r1);
    }
    for (; i + 4 <= n; i += 4)
        _mm_storeu_ps(g + i, v_situ4(_mm256_cvtps_pd(_mm_loadu_ps(g + i)), _mm256_cvtps_pd(_mm_loadu_ps(u + i)),
                                     bd, bld, binv, b2));
    for (; i < n; i++) g[i] = k3_situf(g[i], u[i], b, bl);
}

void k3_silu_mul_avx2(float *g, const float *u, size_t n)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256d gd = _mm256_cvtps_pd(_mm_loadu_ps(g + i));
        __m128 s = _mm256_cvtpd_ps(_mm256_div_pd(gd, v_sig_den(gd)));
        _mm_storeu_ps(g + i, _mm_mul_ps(s, _mm_loadu_ps(u + i)));
    }
    for (; i < n; i++) g[i] = k3_siluf(g[i]) * u[i];
}

void k3_sigmoid_avx2(float *x, size_t n)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256d xd = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
        _mm_storeu_ps(x + i, _mm256_cvtpd_ps(_mm256_div_pd(_mm256_set1_pd(1.0), v_sig_den(xd))));
    }
    for (; i < n; i++) x[i] = k3_sigmoidf(x[i]);
}

void k3_exp_avx2(float *x, size_t n)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        _mm_storeu_ps(x + i, _mm256_cvtpd_ps(v_exp(_mm256_cvtps_pd(_mm_loadu_ps(x + i)))));
    for (; i < n; i++) x[i] = k3_expf(x[i]);
}

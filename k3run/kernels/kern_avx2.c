/*
 * kern_avx2.c - the AVX2 + FMA path of the matrix products (kern.h), compiled
 * with -mavx2 -mfma -mf16c -O3. The kernels are kern_simd.h with one __m256
 * per row (KS_NR 1).
 *
 * The same file also instantiates kern_simd.h with KS_NR 2 on pairs of
 * __m256 (k3_kern_rows_avx2x2): the structure of the AVX-512 path (two rows
 * per vector) run on AVX2, so the tests check that structure bit for bit on
 * machines without AVX-512. Only the one-line operation mappings of
 * kern_avx512.c are then left untested there.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kern.h"

static inline __m256i k3_avx2_bq(const void *p)
{
    long long v;
    memcpy(&v, p, 8);
    return _mm256_set1_epi64x(v);
}

/* ---- one row per __m256 ---- */
#define KS_NR 1
#define KS_TT 3           /* 4 x 3 accumulators + 3 of x + 1 of weights: the 16 registers */
#define KS_FN(name) ks_##name##_avx2
#define ks_vf __m256
#define ks_vi __m256i
#define ks_zero() _mm256_setzero_ps()
#define ks_fma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define ks_sub(a, b) _mm256_sub_ps(a, b)
#define ks_mul(a, b) _mm256_mul_ps(a, b)
#define ks_orf(a, i) _mm256_or_ps(a, _mm256_castsi256_ps(i))
#define ks_and(a, b) _mm256_and_si256(a, b)
#define ks_srli32(a, n) _mm256_srli_epi32(a, n)
#define ks_slli32(a, n) _mm256_slli_epi32(a, n)
#define ks_pshufb(t, i) _mm256_shuffle_epi8(t, i)
#define ks_shuf_even(a, b) _mm256_shuffle_ps(a, b, 0x88)
#define ks_shuf_odd(a, b) _mm256_shuffle_ps(a, b, 0xDD)
#define ks_unplo16(a, b) _mm256_unpacklo_epi16(a, b)
#define ks_unphi16(a, b) _mm256_unpackhi_epi16(a, b)
#define ks_permq_d8(a) _mm256_permute4x64_epi64(a, 0xD8)
#define ks_if(a) _mm256_castsi256_ps(a)
#define ks_cvt(a) _mm256_cvtepi32_ps(a)
#define ks_q8(p0, p1) ((void)(p1), _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(p0))))
#define ks_ldx8(p) _mm256_loadu_ps(p)
#define ks_ld256(p0, p1) ((void)(p1), _mm256_loadu_si256((const __m256i *)(const void *)(p0)))
#define ks_bq(p0, p1) ((void)(p1), k3_avx2_bq(p0))
#define ks_b128(p0, p1) ((void)(p1), \
    _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(p0))))
#define ks_bf(p0, p1) ((void)(p1), _mm256_broadcast_ss(p0))
#define ks_c32(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define ks_set1i(c) _mm256_set1_epi32(c)
#define ks_halves(v, o0, o1) ((void)(o1), _mm256_storeu_ps(o0, v))
#define ks_reg(v) __asm__("" : "+x"(v))
#include "kern_simd.h"

void k3_kern_rows_avx2(const k3_mat *W, const float *x, size_t ldx, const float *xp, uint32_t T,
                       float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    ks_rows_avx2(W, x, ldx, xp, T, y, ldy, r0, r1);
}

void k3_xpack_avx2(const float *x, size_t ldx, uint32_t T, uint32_t cols, float *xp)
{
    for (uint32_t t = 0; t < T; t++) ks_pack_x(xp + (size_t)t * k3_xpack_cols(cols), x + (size_t)t * ldx, cols / 16);
}

#undef KS_NR
#undef KS_TT
#undef KS_FN
#undef ks_vf
#undef ks_vi
#undef ks_zero
#undef ks_fma
#undef ks_sub
#undef ks_mul
#undef ks_orf
#undef ks_and
#undef ks_srli32
#undef ks_slli32
#undef ks_pshufb
#undef ks_shuf_even
#undef ks_shuf_odd
#undef ks_unplo16
#undef ks_unphi16
#undef ks_permq_d8
#undef ks_if
#undef ks_cvt
#undef ks_q8
#undef ks_ldx8
#undef ks_ld256
#undef ks_bq
#undef ks_b128
#undef ks_bf
#undef ks_c32
#undef ks_set1i
#undef ks_halves
#undef ks_reg

/* ---- two rows per vector, as a pair of __m256 (the AVX-512 structure) ---- */
typedef struct { __m256 h[2]; } kp_vf;
typedef struct { __m256i h[2]; } kp_vi;

#define KP_F2(name, expr) static inline kp_vf name(kp_vf a, kp_vf b) \
    { kp_vf r; for (int i = 0; i < 2; i++) r.h[i] = expr(a.h[i], b.h[i]); return r; }
#define KP_I2(name, expr) static inline kp_vi name(kp_vi a, kp_vi b) \
    { kp_vi r; for (int i = 0; i < 2; i++) r.h[i] = expr(a.h[i], b.h[i]); return r; }
static inline __m256 kp_shuf_even1(__m256 a, __m256 b) { return _mm256_shuffle_ps(a, b, 0x88); }
static inline __m256 kp_shuf_odd1(__m256 a, __m256 b) { return _mm256_shuffle_ps(a, b, 0xDD); }
KP_F2(kp_sub, _mm256_sub_ps)
KP_F2(kp_mul, _mm256_mul_ps)
KP_F2(kp_shuf_even, kp_shuf_even1)
KP_F2(kp_shuf_odd, kp_shuf_odd1)
KP_I2(kp_and, _mm256_and_si256)
KP_I2(kp_pshufb, _mm256_shuffle_epi8)
KP_I2(kp_unplo16, _mm256_unpacklo_epi16)
KP_I2(kp_unphi16, _mm256_unpackhi_epi16)

static inline kp_vf kp_zero(void) { kp_vf r = { { _mm256_setzero_ps(), _mm256_setzero_ps() } }; return r; }
static inline kp_vf kp_fma(kp_vf a, kp_vf b, kp_vf c)
{
    kp_vf r;
    for (int i = 0; i < 2; i++) r.h[i] = _mm256_fmadd_ps(a.h[i], b.h[i], c.h[i]);
    return r;
}
static inline kp_vf kp_orf(kp_vf a, kp_vi b)
{
    kp_vf r;
    for (int i = 0; i < 2; i++) r.h[i] = _mm256_or_ps(a.h[i], _mm256_castsi256_ps(b.h[i]));
    return r;
}
static inline kp_vi kp_srli32(kp_vi a, int n)
{
    kp_vi r;
    for (int i = 0; i < 2; i++) r.h[i] = _mm256_srli_epi32(a.h[i], n);
    return r;
}
static inline kp_vi kp_slli32(kp_vi a, int n)
{
    kp_vi r;
    for (int i = 0; i < 2; i++) r.h[i] = _mm256_slli_epi32(a.h[i], n);
    return r;
}
static inline kp_vi kp_permq_d8(kp_vi a)
{
    kp_vi r;
    for (int i = 0; i < 2; i++) r.h[i] = _mm256_permute4x64_epi64(a.h[i], 0xD8);
    return r;
}
static inline kp_vf kp_if(kp_vi a)
{
    kp_vf r = { { _mm256_castsi256_ps(a.h[0]), _mm256_castsi256_ps(a.h[1]) } };
    return r;
}
static inline kp_vf kp_cvt(kp_vi a)
{
    kp_vf r = { { _mm256_cvtepi32_ps(a.h[0]), _mm256_cvtepi32_ps(a.h[1]) } };
    return r;
}
static inline kp_vi kp_q8(const void *p0, const void *p1)
{
    kp_vi r = { { _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p0)),
                  _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p1)) } };
    return r;
}
static inline kp_vf kp_ldx8(const float *p)
{
    kp_vf r = { { _mm256_loadu_ps(p), _mm256_loadu_ps(p) } };
    return r;
}
static inline kp_vi kp_ld256(const void *p0, const void *p1)
{
    kp_vi r = { { _mm256_loadu_si256((const __m256i *)p0), _mm256_loadu_si256((const __m256i *)p1) } };
    return r;
}
static inline kp_vi kp_bq(const void *p0, const void *p1)
{
    kp_vi r = { { k3_avx2_bq(p0), k3_avx2_bq(p1) } };
    return r;
}
static inline kp_vi kp_b128(const void *p0, const void *p1)
{
    kp_vi r = { { _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
                  _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p1)) } };
    return r;
}
static inline kp_vf kp_bf(const float *p0, const float *p1)
{
    kp_vf r = { { _mm256_broadcast_ss(p0), _mm256_broadcast_ss(p1) } };
    return r;
}
static inline kp_vi kp_c32(const void *p)
{
    kp_vi r = { { _mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)p) } };
    return r;
}
static inline kp_vi kp_set1i(int c)
{
    kp_vi r = { { _mm256_set1_epi32(c), _mm256_set1_epi32(c) } };
    return r;
}
static inline void kp_halves(kp_vf v, float *o0, float *o1)
{
    _mm256_storeu_ps(o0, v.h[0]);
    _mm256_storeu_ps(o1, v.h[1]);
}

#define KS_NR 2
#define KS_TT 6           /* as kern_avx512.c (here the tiles spill: a test of the structure only) */
#define KS_FN(name) ks_##name##_avx2x2
#define ks_vf kp_vf
#define ks_vi kp_vi
#define ks_zero kp_zero
#define ks_fma kp_fma
#define ks_sub kp_sub
#define ks_mul kp_mul
#define ks_orf kp_orf
#define ks_and kp_and
#define ks_srli32 kp_srli32
#define ks_slli32 kp_slli32
#define ks_pshufb kp_pshufb
#define ks_shuf_even kp_shuf_even
#define ks_shuf_odd kp_shuf_odd
#define ks_unplo16 kp_unplo16
#define ks_unphi16 kp_unphi16
#define ks_permq_d8 kp_permq_d8
#define ks_if kp_if
#define ks_cvt kp_cvt
#define ks_q8 kp_q8
#define ks_ldx8 kp_ldx8
#define ks_ld256 kp_ld256
#define ks_bq kp_bq
#define ks_b128 kp_b128
#define ks_bf kp_bf
#define ks_c32 kp_c32
#define ks_set1i kp_set1i
#define ks_halves kp_halves
#define ks_reg(v) __asm__("" : "+x"((v).h[0]), "+x"((v).h[1]))
#include "kern_simd.h"

void k3_kern_rows_avx2x2(const k3_mat *W, const float *x, size_t ldx, const float *xp, uint32_t T,
                         float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    ks_rows_avx2x2(W, x, ldx, xp, T, y, ldy, r0, r1);
}

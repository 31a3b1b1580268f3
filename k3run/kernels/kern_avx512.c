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
 * AVX-512. One token's MXFP4 and Q8 rows have kernels of their own (mx_mv,
 * q8_mv below), tested bit for bit against the scalar path on AVX-512
 * machines only.
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
#define KS_TT 6           /* 4 x 6 accumulators + 6 of x + 1 of weights: 31 of the 32 registers */
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
#define ks_cvt(a) _mm512_cvtepi32_ps(a)
#define ks_q8(p0, p1) _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(                  \
    _mm_loadl_epi64((const __m128i *)(const void *)(p0)), _mm_loadl_epi64((const __m128i *)(const void *)(p1))))
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

/*
 * ---- matrix-vector, MXFP4: one row per __m512 ----
 * One token's MXFP4 rows do not use kern_simd.h: a row's 16 lanes fill one
 * vector, slot k < 8 holding canonical lane 2k and slot 8 + k lane 2k + 1, so a
 * 16-group of weights is elements 0,2,..,14 | 1,3,..,15 and x is packed in that
 * order once per call. The 16 weights of a group are one vpermps through the
 * block's row of k3_mx_table, which holds the canonical products themselves
 * (-0 for code 8, NaN for scale 255, subnormals), so there is no fast/exact
 * split and no zero recheck. Per block of 32 and row: a 16-byte broadcast of
 * the codes, one masked shift that brings the high nibbles of lanes 2-3 down,
 * two pshufb (byte k of a group to slots k and 8 + k; vpermps reads only the low
 * 4 bits of an index), two vpermps and the two FMAs of the canonical order.
 */
#define MX_R 4            /* rows per pass (each its own accumulator chain) */
#define MX_XMAX 16384     /* columns the packed x holds on the stack; wider rows use kern_simd.h */

static const int32_t mx_eo[16] __attribute__((aligned(64))) = {
    0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15 };
/* pshufb indices: dword t of 128-bit lane m takes byte (4m + t) % 8 of the group
 * (the block's first 8 bytes, or +8 its second) into its low byte */
#define MX_B(b) (b), -1, -1, -1
#define MX_PICK(o) { MX_B(o), MX_B(o + 1), MX_B(o + 2), MX_B(o + 3), MX_B(o + 4), MX_B(o + 5), \
    MX_B(o + 6), MX_B(o + 7), MX_B(o), MX_B(o + 1), MX_B(o + 2), MX_B(o + 3), MX_B(o + 4), \
    MX_B(o + 5), MX_B(o + 6), MX_B(o + 7) }
static const int8_t mx_pick[2][64] __attribute__((aligned(64))) = { MX_PICK(0), MX_PICK(8) };

/* Rows [r, r+R) over the packed x (xp: [cols], slot order per 16-group); the
 * next pass (rn rows from r+R) is prefetched a line or so per block. */
static inline __attribute__((always_inline)) void mx_pass(const k3_mat *W, const float *xp,
                                                          float *y, uint32_t r, int R, uint32_t rn)
{
    const uint32_t nb = W->cols / 32;
    const size_t rb = W->cols / 2;                                   /* code bytes per row */
    const uint8_t *q = (const uint8_t *)W->data + (size_t)r * rb;    /* [R][cols/2] codes */
    const uint8_t *s = W->scales + (size_t)r * nb;                   /* [R][cols/32] scales */
    const ks_next nx = {q + (size_t)R * rb, s + (size_t)R * nb, (size_t)rn * rb, (size_t)rn * nb,
                        (uint32_t)(R * 16 + 63) / 64};               /* the next pass, lines per block */
    const __m512i p0 = _mm512_load_si512(mx_pick[0]), p1 = _mm512_load_si512(mx_pick[1]);
    __m512 acc[MX_R];                                                /* [row] lanes, slot order */
    for (int k = 0; k < R; k++) acc[k] = _mm512_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        const __m512 x0 = _mm512_load_ps(xp + 32 * b), x1 = _mm512_load_ps(xp + 32 * b + 16);
        ks_next_step(&nx, b);
        for (int k = 0; k < R; k++) {
            const __m512 tab = _mm512_load_ps(k3_mx_table[s[(size_t)k * nb + b]]);
            __m512i qb = _mm512_broadcast_i32x4(
                _mm_loadu_si128((const __m128i *)(const void *)(q + (size_t)k * rb + 16 * b)));
            qb = _mm512_mask_srli_epi16(qb, (__mmask32)0xFFFF0000u, qb, 4);  /* lanes 2-3: >> 4 */
            __m512 w0 = _mm512_permutexvar_ps(_mm512_shuffle_epi8(qb, p0), tab);
            __m512 w1 = _mm512_permutexvar_ps(_mm512_shuffle_epi8(qb, p1), tab);
            acc[k] = _mm512_fmadd_ps(w0, x0, acc[k]);                /* elements 32b .. 32b+15 */
            acc[k] = _mm512_fmadd_ps(w1, x1, acc[k]);                /* 32b+16 .. 32b+31 */
        }
    }
    for (int k = 0; k < R; k++) {
        float a[16], lanes[16];
        _mm512_storeu_ps(a, acc[k]);
        for (int j = 0; j < 8; j++) {
            lanes[2 * j] = a[j];
            lanes[2 * j + 1] = a[8 + j];
        }
        y[r + (uint32_t)k] = ks_reduce16(lanes);
    }
}

static void mx_mv(const k3_mat *W, const float *x, float *y, uint32_t r0, uint32_t r1)
{
    float xp[MX_XMAX] __attribute__((aligned(64)));   /* [cols] x, slot order per 16-group */
    const __m512i eo = _mm512_load_si512(mx_eo);
    for (uint32_t g = 0; g < W->cols / 16; g++)
        _mm512_store_ps(xp + 16 * g, _mm512_permutexvar_ps(eo, _mm512_loadu_ps(x + 16 * g)));
    for (uint32_t r = r0; r < r1;) {
        uint32_t n = r1 - r < MX_R ? r1 - r : MX_R;
        uint32_t rn = r1 - r - n < MX_R ? r1 - r - n : MX_R;
        switch (n) {
        case 4: mx_pass(W, xp, y, r, 4, rn); break;
        case 3: mx_pass(W, xp, y, r, 3, rn); break;
        case 2: mx_pass(W, xp, y, r, 2, rn); break;
        default: mx_pass(W, xp, y, r, 1, rn); break;
        }
        r += n;
    }
}

/*
 * ---- matrix-vector, Q8 (the compact trunk): one row per __m512 ----
 * A row's 16 lanes in one vector in their natural order (element i in lane
 * i % 16), so neither x nor the weights are rearranged: per 16 weights one
 * vpmovsxbd from memory, one cvtdq2ps, the multiply by the block's scale
 * (exact, as kern_scalar.c) and the FMA of the canonical order.
 */
#define Q8_R 8            /* rows per pass: 8 streams of weights in flight */

static inline __attribute__((always_inline)) void q8_pass(const k3_mat *W, const float *x, float *y,
                                                          uint32_t r, int R, uint32_t rn)
{
    const uint32_t nb = W->cols / 32;
    const size_t rb = W->cols;                                       /* code bytes per row */
    const int8_t *q = (const int8_t *)W->data + (size_t)r * rb;      /* [R][cols] codes */
    const uint8_t *s = W->scales + (size_t)r * nb;                   /* [R][cols/32] scales */
    const ks_next nx = {(const uint8_t *)q + (size_t)R * rb, s + (size_t)R * nb, (size_t)rn * rb, (size_t)rn * nb,
                        (uint32_t)(R * 32 + 63) / 64};               /* the next pass, lines per block */
    __m512 acc[Q8_R];                                                /* [row] lanes 0-15 */
    for (int k = 0; k < R; k++) acc[k] = _mm512_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        const __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
        ks_next_step(&nx, b);
        for (int k = 0; k < R; k++) {
            const int8_t *qk = q + (size_t)k * rb + 32 * b;
            const __m512 sc = _mm512_set1_ps(ks_e8m0[s[(size_t)k * nb + b]].f);
            __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)qk)));
            __m512 w1 = _mm512_cvtepi32_ps(
                _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(qk + 16))));
            acc[k] = _mm512_fmadd_ps(_mm512_mul_ps(w0, sc), x0, acc[k]);   /* elements 32b .. 32b+15 */
            acc[k] = _mm512_fmadd_ps(_mm512_mul_ps(w1, sc), x1, acc[k]);   /* 32b+16 .. 32b+31 */
        }
    }
    for (int k = 0; k < R; k++) {
        float lanes[16];
        _mm512_storeu_ps(lanes, acc[k]);
        y[r + (uint32_t)k] = ks_reduce16(lanes);
    }
}

static void q8_mv(const k3_mat *W, const float *x, float *y, uint32_t r0, uint32_t r1)
{
    for (uint32_t r = r0; r < r1;) {
        uint32_t n = r1 - r < Q8_R ? r1 - r : Q8_R;
        uint32_t rn = r1 - r - n < Q8_R ? r1 - r - n : Q8_R;
        switch (n) {
        case 8: q8_pass(W, x, y, r, 8, rn); break;
        case 7: q8_pass(W, x, y, r, 7, rn); break;
        case 6: q8_pass(W, x, y, r, 6, rn); break;
        case 5: q8_pass(W, x, y, r, 5, rn); break;
        case 4: q8_pass(W, x, y, r, 4, rn); break;
        case 3: q8_pass(W, x, y, r, 3, rn); break;
        case 2: q8_pass(W, x, y, r, 2, rn); break;
        default: q8_pass(W, x, y, r, 1, rn); break;
        }
        r += n;
    }
}

/* Tokens up to which the register kernel (k3_ft512) beats the panel (k3_mm512): measured on
   a 12288 x 7168 matrix from memory (docs/KERNELS.md): at 10 (5 + 5) the register kernel, at
   12 and 16 the panel. */
#ifndef K3_FT512_MAX
#define K3_FT512_MAX 10
#endif

void k3_kern_rows_avx512(const k3_mat *W, const float *x, size_t ldx, const float *xp, uint32_t T,
                         float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    if (T == 1 && W->enc == K3_ENC_MXFP4 && W->cols <= MX_XMAX && r0 < r1)
        mx_mv(W, x, y, r0, r1);
    else if (T == 1 && W->enc == K3_ENC_Q8 && r0 < r1)
        q8_mv(W, x, y, r0, r1);
    else if (T >= 2 && T <= K3_FT512_MAX && xp && W->cols % 16 == 0 && r0 < r1)
        k3_ft512(W, xp, T, y, ldy, r0, r1);
    else if (T >= 2 && xp && r0 < r1)           /* x packed by k3_xpack_avx512 */
        k3_mm512(W, x, ldx, xp, T, y, ldy, r0, r1);
    else
        ks_rows_avx512(W, x, ldx, xp, T, y, ldy, r0, r1);
}

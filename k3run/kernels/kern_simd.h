/*
 * kern_simd.h - the vector kernels of kern.h written once, for any vector that
 * holds KS_NR rows of 8 fp32 lanes (docs/KERNELS.md, "How each path implements
 * it"). Included by kern_avx2.c (KS_NR 1: one __m256 per row; and KS_NR 2:
 * pairs of __m256, the test stand-in for AVX-512) and by kern_avx512.c
 * (KS_NR 2: one __m512 = two rows, each 256-bit half doing exactly what the
 * AVX2 code does for one row).
 *
 * The includer defines, before including:
 *   KS_NR                 1 or 2 (rows per vector)
 *   KS_FN(name)           name mangling (static functions get a suffix)
 *   ks_vf, ks_vi          the float and integer vector types
 * and these operations, every one acting on each 256-bit half (one row)
 * exactly as the AVX2 instruction of the same name acts on a ymm register:
 *   ks_zero() ks_fma(a,b,c)=a*b+c ks_sub ks_mul ks_orf(vf,vi) ks_and ks_srli32
 *   ks_slli32 ks_pshufb(table,index) ks_shuf_even(a,b)=shufps 0x88
 *   ks_shuf_odd=shufps 0xDD ks_unplo16/ks_unphi16=punpck{l,h}wd
 *   ks_permq_d8=vpermq 0xD8 ks_if (cast) ks_cvt=cvtdq2ps
 * and these loads/stores, where p0 belongs to the first row of the vector
 * and p1 to the second (ignored when KS_NR is 1):
 *   ks_ldx8(p)       8 floats of x, the same in every half
 *   ks_ld256(p0,p1)  32 bytes per half
 *   ks_bq(p0,p1)     8 bytes repeated 4 times per half
 *   ks_b128(p0,p1)   16 bytes repeated twice per half
 *   ks_bf(p0,p1)     1 float repeated 8 times per half
 *   ks_q8(p0,p1)     8 signed bytes sign-extended to 8 int32 per half (vpmovsxbd)
 *   ks_c32(p)        a 32-byte constant, the same in every half
 *   ks_set1i(c)      a 32-bit integer in every element
 *   ks_halves(v,o0,o1)    store half h to o_h (8 floats)
 *   ks_reg(v)             a hint: keep v in a register (no effect on values)
 */
#ifndef KS_NR
#error "define KS_NR and the ks_* operations before including kern_simd.h"
#endif

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "k3_num.h"
#include "k3_shard.h"
#include "kern.h"

#define KS_INLINE static inline __attribute__((always_inline))
/* prefetch p + off bytes (integer arithmetic: the address may lie past the matrix) */
#define KS_PREFETCH(p, off) __builtin_prefetch((const void *)((uintptr_t)(p) + (off)))
#define KS_RMV 4          /* row vectors per pass of the matrix-vector kernels */
#define KS_SB 32          /* rows per block of the matrix-matrix kernel (= K3_KERN_BLOCK) */
#define KS_MR 4           /* row vectors per register tile */
#define KS_RP 4           /* row vectors per panel (a multiple of KS_MR) */
#ifndef KS_KC
#define KS_KC 1024        /* columns per panel (a multiple of 32) */
#endif
#ifndef KS_TC
#define KS_TC 32          /* tokens per chunk */
#endif
#ifndef KS_TT
#error "define KS_TT (tokens per register tile: KS_MR * KS_TT accumulators) before including kern_simd.h"
#endif
#ifndef KS_TABLES
#define KS_TABLES
/*
 * MXFP4 decode without a multiply ("fast" path, scale codes 2..209): the
 * element code c of a block with scale code s sits in byte 0 of a 32-bit lane
 * whose other bytes are 0; one pshufb through the 16-byte table ks_lut[s]
 * gives the lane the bytes [v(c), b0, b0, b0] (b0 = ks_lut[s][0], index 0),
 * i.e. the fp32 number f(c) = (-1)^g (2^(E-127) + (K + v(c)) 2^(E-150)) with
 * E = s + 22, g = E & 1, b0 = (E >> 1) | g << 7, K = (b0 & 127) << 16 | b0 << 8
 * (exponent E, sign g, mantissa K + v). The table holds
 * v(c) = b0 + (-1)^g 2 e2m1(c), in [0, 255] for s in [2, 209], so
 * f(c) - f(0) = e2m1(c) 2^(s-127) exactly (Sterbenz: same sign and binade);
 * ks_c[s] is f(0). Codes 0 and 8 both give +0, where the canonical weight of
 * code 8 is -0: see the zero-result checks in mv and mmul. The "exact" path
 * uses the table of s = 127 (plain e2m1 values), restores the sign of code 8
 * and multiplies by ks_e8m0[s] like the canonical definition.
 */
#define KS_E(s) ((s) + 22)
#define KS_B0(s) ((KS_E(s) >> 1) | ((KS_E(s) & 1) << 7))
#define KS_V(s, d) (uint8_t)(KS_B0(s) + ((KS_E(s) & 1) ? -(d) : (d)))
#define KS_ROW(s) { KS_V(s, 0), KS_V(s, 1), KS_V(s, 2), KS_V(s, 3), KS_V(s, 4), KS_V(s, 6), \
    KS_V(s, 8), KS_V(s, 12), KS_V(s, 0), KS_V(s, -1), KS_V(s, -2), KS_V(s, -3), KS_V(s, -4), \
    KS_V(s, -6), KS_V(s, -8), KS_V(s, -12) }
#define KS_R4(f, s) f(s), f((s) + 1), f((s) + 2), f((s) + 3)
#define KS_R16(f, s) KS_R4(f, s), KS_R4(f, (s) + 4), KS_R4(f, (s) + 8), KS_R4(f, (s) + 12)
#define KS_R256(f) KS_R16(f, 0), KS_R16(f, 16), KS_R16(f, 32), KS_R16(f, 48), KS_R16(f, 64), \
    KS_R16(f, 80), KS_R16(f, 96), KS_R16(f, 112), KS_R16(f, 128), KS_R16(f, 144), KS_R16(f, 160), \
    KS_R16(f, 176), KS_R16(f, 192), KS_R16(f, 208), KS_R16(f, 224), KS_R16(f, 240)
#define KS_CBITS(s) { 0x01010101u * (uint8_t)KS_B0(s) }
#define KS_E8M0BITS(s) { (s) == 0 ? 0x00400000u : (s) == 255 ? 0x7fc00000u : (uint32_t)(s) << 23 }

typedef union ks_f32 { uint32_t u; float f; } ks_f32;
static const uint8_t ks_lut[256][16] __attribute__((aligned(16))) = { KS_R256(KS_ROW) };
static const ks_f32 ks_c[256] = { KS_R256(KS_CBITS) };       /* f of code 0, as a float */
static const ks_f32 ks_e8m0[256] = { KS_R256(KS_E8M0BITS) }; /* k3_e8m0_to_f32 */

/* Byte j of 8 MXFP4 bytes to byte 0 of lane k: lanes 0-3 take bytes 0,1,4,5,
 * lanes 4-7 bytes 2,3,6,7 (so even codes sit in the lanes of x0,x2,x8,x10 |
 * x4,x6,x12,x14, which is shufps(x[0..7], x[8..15], 0x88)). */
static const int8_t ks_place[32] __attribute__((aligned(32))) = {
    0, -1, -1, -1, 1, -1, -1, -1, 4, -1, -1, -1, 5, -1, -1, -1,
    2, -1, -1, -1, 3, -1, -1, -1, 6, -1, -1, -1, 7, -1, -1, -1 };
/* canonical lane of vector slot k for even (E) and odd (O) codes of 16 elements */
static const uint8_t ks_lane_e[8] = { 0, 2, 8, 10, 4, 6, 12, 14 };
static const uint8_t ks_lane_o[8] = { 1, 3, 9, 11, 5, 7, 13, 15 };

/* The fixed reduction tree of kern.h. */
static inline float ks_reduce16(const float acc[16])
{
    float a[8], b[4], c[2];
    for (int j = 0; j < 8; j++) a[j] = acc[j] + acc[j + 8];
    for (int j = 0; j < 4; j++) b[j] = a[j] + a[j + 4];
    for (int j = 0; j < 2; j++) c[j] = b[j] + b[j + 2];
    return c[0] + c[1];
}

/* All n scale codes in the fast decode's range [2, 209]? */
static inline int ks_scales_fast(const uint8_t *s, size_t n)
{
    unsigned bad = 0;
    for (size_t i = 0; i < n; i++) bad |= (uint8_t)(s[i] - 2) > 207;
    return !bad;
}

/* Prefetch of the next pass's weights (nq bytes at q) and scales (ns at s),
 * `step` cache lines of weights per loop step, so that they arrive in time. */
typedef struct ks_next {
    const uint8_t *q, *s;
    size_t nq, ns;
    uint32_t step;
} ks_next;

static inline void ks_next_step(const ks_next *nx, uint32_t i)
{
    if (!nx) return;
    for (uint32_t j = 0; j < nx->step; j++) {
        size_t off = ((size_t)i * nx->step + j) * 64;
        if (off < nx->nq) KS_PREFETCH(nx->q, off);
    }
    if ((size_t)i * 64 < nx->ns) KS_PREFETCH(nx->s, (size_t)i * 64);
}

/* The tree of kern.h on one row's lanes as they sit in the slot halves of the
 * matrix-matrix kernel: e holds canonical lanes ks_lane_e (slots 0-7), o lanes
 * ks_lane_o (slots 8-15). One unpack each puts them back in lane order (lanes
 * 0-7 and 8-15), then each level of the tree is one vector addition of the
 * same pairs. Plain AVX2 in every path. */
static inline float ks_reduce_eo(__m256 e, __m256 o)
{
    __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);  /* lanes 0-7, 8-15 */
    __m256 a = _mm256_add_ps(lo, hi);                   /* a[j] = acc[j] + acc[j + 8] */
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));  /* a[j] + a[j + 4] */
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));      /* c[j] = b[j] + b[j + 2] */
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));  /* c[0] + c[1] */
}

/* ng 16-groups of one token's x into dst (16 floats per group: slots 0-7 the
 * elements of ks_lane_e, slots 8-15 those of ks_lane_o; the order every
 * matrix-matrix panel decodes to). Plain AVX2 in every path. */
static inline void ks_pack_x(float *dst, const float *src, uint32_t ng)
{
    for (uint32_t g = 0; g < ng; g++) {
        __m256 a = _mm256_loadu_ps(src + 16 * g), b = _mm256_loadu_ps(src + 16 * g + 8);
        _mm256_storeu_ps(dst + 16 * g, _mm256_shuffle_ps(a, b, 0x88));
        _mm256_storeu_ps(dst + 16 * g + 8, _mm256_shuffle_ps(a, b, 0xDD));
    }
}

/* Elements [i0, cols) of a BF16 row, lane by lane (the tail of a row whose
 * length is not a multiple of 16); fmaf is a fused multiply-add here. */
static inline void ks_tail_bf16(const uint16_t *w, const float *x, uint32_t i0, uint32_t cols,
                                float lanes[16])
{
    for (uint32_t i = i0; i < cols; i++)
        lanes[i % 16] = fmaf(k3_bf16_to_f32(w[i]), x[i], lanes[i % 16]);
}
#endif /* KS_TABLES */

/* ---- decoding: 16 BF16 weights of each row -> lanes 0-7 (lo) and 8-15 (hi) */
KS_INLINE void KS_FN(dec_bf16)(const uint16_t *p0, const uint16_t *p1, ks_vf *lo, ks_vf *hi)
{
    ks_vi raw = ks_permq_d8(ks_ld256(p0, p1)); /* per half: bf16 0-3, 8-11 | 4-7, 12-15 */
    ks_vi z = ks_set1i(0);
    *lo = ks_if(ks_unplo16(z, raw));           /* bf16 << 16: elements 0-7 */
    *hi = ks_if(ks_unphi16(z, raw));           /* elements 8-15 */
}

/* ---- decoding: 32 MXFP4 weights (one block) of each row, in E/O slot order:
 * w[0] even elements 0-14, w[1] odd 1-15, w[2] even 16-30, w[3] odd 17-31. */
KS_INLINE void KS_FN(dec_mx)(const uint8_t *q0, const uint8_t *q1, int s0, int s1, int exact,
                             ks_vf w[4])
{
    const ks_vi place = ks_c32(ks_place), m15 = ks_set1i(15);
    ks_vi pa = ks_pshufb(ks_bq(q0, q1), place);          /* byte j in byte 0 of its lane */
    ks_vi pb = ks_pshufb(ks_bq(q0 + 8, q1 + 8), place);
    ks_vi code[4] = { ks_and(pa, m15), ks_srli32(pa, 4), ks_and(pb, m15), ks_srli32(pb, 4) };
    if (!exact) {
        ks_vi lut = ks_b128(ks_lut[s0], ks_lut[s1]);
        ks_vf c = ks_bf(&ks_c[s0].f, &ks_c[s1].f);
        for (int j = 0; j < 4; j++) w[j] = ks_sub(ks_if(ks_pshufb(lut, code[j])), c);
    } else {
        ks_vi lut = ks_b128(ks_lut[127], ks_lut[127]), m8 = ks_set1i(8);
        ks_vf c = ks_bf(&ks_c[127].f, &ks_c[127].f);
        ks_vf scale = ks_bf(&ks_e8m0[s0].f, &ks_e8m0[s1].f);
        for (int j = 0; j < 4; j++) {
            ks_vf e2m1 = ks_sub(ks_if(ks_pshufb(lut, code[j])), c);       /* +0 for code 8 */
            e2m1 = ks_orf(e2m1, ks_slli32(ks_and(code[j], m8), 28));      /* -0 for code 8 */
            w[j] = ks_mul(e2m1, scale);                                   /* the canonical product */
        }
    }
}

/* ---- decoding: 16 Q8 weights of each row -> lanes 0-7 (lo) and 8-15 (hi):
 * q * 2^(s-127), one multiply of two fp32 numbers whose product is exact (or
 * NaN for scale code 255), as kern_scalar.c computes it. */
KS_INLINE void KS_FN(dec_q8)(const int8_t *p0, const int8_t *p1, ks_vf scale, ks_vf *lo, ks_vf *hi)
{
    *lo = ks_mul(ks_cvt(ks_q8(p0, p1)), scale);
    *hi = ks_mul(ks_cvt(ks_q8(p0 + 8, p1 + 8)), scale);
}

/* ---- matrix-vector, Q8: R row vectors (R * KS_NR rows: row[k][h]), natural lanes ---- */
KS_INLINE void KS_FN(q8_mv)(const k3_mat *W, const float *x, float *y, const uint32_t row[][2],
                            int R, const ks_next *nx)
{
    const uint32_t cols = W->cols, nb = cols / 32;
    const int8_t *p[KS_RMV][2];                                 /* row starts, [cols] codes each */
    const uint8_t *s[KS_RMV][2];                                /* [cols/32] scale codes each */
    ks_vf lo[KS_RMV], hi[KS_RMV];                               /* lanes 0-7 and 8-15 */
    for (int k = 0; k < R; k++) {
        for (int h = 0; h < 2; h++) {
            p[k][h] = (const int8_t *)W->data + (size_t)row[k][h] * cols;
            s[k][h] = W->scales + (size_t)row[k][h] * nb;
        }
        lo[k] = hi[k] = ks_zero();
    }
    for (uint32_t b = 0; b < nb; b++) {
        const float *xb = x + 32 * b;
        ks_vf x0 = ks_ldx8(xb), x1 = ks_ldx8(xb + 8), x2 = ks_ldx8(xb + 16), x3 = ks_ldx8(xb + 24);
        ks_next_step(nx, b);
        for (int k = 0; k < R; k++) {
            ks_vf sc = ks_bf(&ks_e8m0[s[k][0][b]].f, &ks_e8m0[s[k][1][b]].f), w0, w1, w2, w3;
            KS_FN(dec_q8)(p[k][0] + 32 * b, p[k][1] + 32 * b, sc, &w0, &w1);
            KS_FN(dec_q8)(p[k][0] + 32 * b + 16, p[k][1] + 32 * b + 16, sc, &w2, &w3);
            lo[k] = ks_fma(w0, x0, lo[k]);                      /* elements 32b + 0..7 */
            hi[k] = ks_fma(w1, x1, hi[k]);                      /* 32b + 8..15 */
            lo[k] = ks_fma(w2, x2, lo[k]);                      /* 32b + 16..23 */
            hi[k] = ks_fma(w3, x3, hi[k]);                      /* 32b + 24..31 */
        }
    }
    for (int k = 0; k < R; k++) {
        float lanes[2][16];
        ks_halves(lo[k], lanes[0], lanes[1]);
        ks_halves(hi[k], lanes[0] + 8, lanes[1] + 8);
        for (int h = 0; h < KS_NR; h++) y[row[k][h]] = ks_reduce16(lanes[h]);
    }
}

/* ---- matrix-vector, BF16: R row vectors (R * KS_NR rows: row[k][h]) ---- */
KS_INLINE void KS_FN(bf16_mv)(const k3_mat *W, const float *x, float *y, const uint32_t row[][2],
                              int R, const ks_next *nx)
{
    const uint32_t cols = W->cols, ng = cols / 16;
    const uint16_t *p[KS_RMV][2];                               /* row starts, [cols] bf16 each */
    ks_vf lo[KS_RMV], hi[KS_RMV];                               /* lanes 0-7 and 8-15 */
    for (int k = 0; k < R; k++) {
        for (int h = 0; h < 2; h++) p[k][h] = (const uint16_t *)W->data + (size_t)row[k][h] * cols;
        lo[k] = hi[k] = ks_zero();
    }
    for (uint32_t g = 0; g < ng; g++) {
        ks_vf xl = ks_ldx8(x + 16 * g), xh = ks_ldx8(x + 16 * g + 8);
        ks_next_step(nx, g);
        for (int k = 0; k < R; k++) {
            ks_vf wl, wh;
            KS_FN(dec_bf16)(p[k][0] + 16 * g, p[k][1] + 16 * g, &wl, &wh);
            lo[k] = ks_fma(wl, xl, lo[k]);
            hi[k] = ks_fma(wh, xh, hi[k]);
        }
    }
    for (int k = 0; k < R; k++) {
        float lanes[2][16];
        ks_halves(lo[k], lanes[0], lanes[1]);
        ks_halves(hi[k], lanes[0] + 8, lanes[1] + 8);
        for (int h = 0; h < KS_NR; h++) {
            ks_tail_bf16(p[k][h], x, ng * 16, cols, lanes[h]);
            y[row[k][h]] = ks_reduce16(lanes[h]);     /* a duplicated row writes the same value */
        }
    }
}

/* ---- matrix-vector, MXFP4 ---- */
KS_INLINE void KS_FN(mx_mv)(const k3_mat *W, const float *x, float *y, const uint32_t row[][2],
                            int R, int exact, const ks_next *nx)
{
    const uint32_t nb = W->cols / 32;
    const uint8_t *q[KS_RMV][KS_NR], *s[KS_RMV][KS_NR]; /* [cols/2] codes, [cols/32] scales per row */
    ks_vf ae[KS_RMV], ao[KS_RMV];                       /* E and O slots (ks_lane_e, ks_lane_o) */
    for (int k = 0; k < R; k++) {
        for (int h = 0; h < KS_NR; h++) {
            q[k][h] = (const uint8_t *)W->data + (size_t)row[k][h] * (W->cols / 2);
            s[k][h] = W->scales + (size_t)row[k][h] * nb;
        }
        ae[k] = ao[k] = ks_zero();
    }
    for (uint32_t b = 0; b < nb; b++) {
        const float *xb = x + 32 * b;
        ks_vf x0 = ks_ldx8(xb), x1 = ks_ldx8(xb + 8), x2 = ks_ldx8(xb + 16), x3 = ks_ldx8(xb + 24);
        ks_vf xe0 = ks_shuf_even(x0, x1), xo0 = ks_shuf_odd(x0, x1);
        ks_vf xe1 = ks_shuf_even(x2, x3), xo1 = ks_shuf_odd(x2, x3);
        ks_next_step(nx, b);
        for (int k = 0; k < R; k++) {
            ks_vf w[4];
            KS_FN(dec_mx)(q[k][0] + 16 * b, q[k][KS_NR - 1] + 16 * b, s[k][0][b], s[k][KS_NR - 1][b],
                          exact, w);
            ae[k] = ks_fma(w[0], xe0, ae[k]);
            ao[k] = ks_fma(w[1], xo0, ao[k]);
            ae[k] = ks_fma(w[2], xe1, ae[k]);
            ao[k] = ks_fma(w[3], xo1, ao[k]);
        }
    }
    for (int k = 0; k < R; k++) {
        float e[2][8], o[2][8], lanes[16];
        ks_halves(ae[k], e[0], e[1]);
        ks_halves(ao[k], o[0], o[1]);
        for (int h = 0; h < KS_NR; h++) {
            for (int j = 0; j < 8; j++) {
                lanes[ks_lane_e[j]] = e[h][j];
                lanes[ks_lane_o[j]] = o[h][j];
            }
            y[row[k][h]] = ks_reduce16(lanes);
        }
    }
}

/* The rows of a pass of n rows from r, row vector by row vector (KS_NR rows each); past the end
   the last row repeats (its result is written twice, the same value). The row vectors used. */
KS_INLINE int KS_FN(pass_rows)(uint32_t r, uint32_t n, uint32_t row[][2])
{
    int R = (int)((n + KS_NR - 1) / KS_NR);
    for (int k = 0; k < R; k++)
        for (int h = 0; h < 2; h++) {
            uint32_t i = (uint32_t)k * KS_NR + (uint32_t)(h < KS_NR ? h : 0);
            row[k][h] = r + (i < n ? i : n - 1);
        }
    return R;
}

/* Rows [r0, r1), one token, in passes of R row vectors. */
static void KS_FN(mv)(const k3_mat *W, const float *x, float *y, uint32_t r0, uint32_t r1)
{
    uint32_t r = r0;
    while (r < r1) {
        uint32_t row[KS_RMV][2];
        uint32_t n = r1 - r < KS_RMV * KS_NR ? r1 - r : KS_RMV * KS_NR;
        int R = KS_FN(pass_rows)(r, n, row);
        /* the next pass's rows are contiguous: prefetch them a line or two per step */
        ks_next nx;
        uint32_t nn = r1 - (r + n) < KS_RMV * KS_NR ? r1 - (r + n) : KS_RMV * KS_NR;
        const int enc = W->enc;
        size_t rb = enc == K3_ENC_BF16 ? (size_t)W->cols * 2 : enc == K3_ENC_Q8 ? W->cols
                                                                                : W->cols / 2;  /* row bytes */
        nx.q = (const uint8_t *)W->data + (size_t)(r + n) * rb;
        nx.nq = nn * rb;
        nx.s = W->scales ? W->scales + (size_t)(r + n) * (W->cols / 32) : NULL;
        nx.ns = W->scales ? nn * (W->cols / 32) : 0;
        nx.step = (uint32_t)(n * (enc == K3_ENC_MXFP4 ? 16 : 32) + 63) / 64;  /* lines per step */
        if (enc == K3_ENC_Q8) {
            switch (R) {
            case 4: KS_FN(q8_mv)(W, x, y, row, 4, &nx); break;
            case 3: KS_FN(q8_mv)(W, x, y, row, 3, &nx); break;
            case 2: KS_FN(q8_mv)(W, x, y, row, 2, &nx); break;
            default: KS_FN(q8_mv)(W, x, y, row, 1, &nx); break;
            }
        } else if (enc == K3_ENC_BF16) {
            switch (R) {
            case 4: KS_FN(bf16_mv)(W, x, y, row, 4, &nx); break;
            case 3: KS_FN(bf16_mv)(W, x, y, row, 3, &nx); break;
            case 2: KS_FN(bf16_mv)(W, x, y, row, 2, &nx); break;
            default: KS_FN(bf16_mv)(W, x, y, row, 1, &nx); break;
            }
        } else {
            /* the fast decode takes scale codes 2..209 only */
            const uint8_t *sc = W->scales + (size_t)r * (W->cols / 32);
            if (!ks_scales_fast(sc, n * (W->cols / 32))) {
                switch (R) {
                case 4: KS_FN(mx_mv)(W, x, y, row, 4, 1, &nx); break;
                case 3: KS_FN(mx_mv)(W, x, y, row, 3, 1, &nx); break;
                case 2: KS_FN(mx_mv)(W, x, y, row, 2, 1, &nx); break;
                default: KS_FN(mx_mv)(W, x, y, row, 1, 1, &nx); break;
                }
            } else {
                switch (R) {
                case 4: KS_FN(mx_mv)(W, x, y, row, 4, 0, &nx); break;
                case 3: KS_FN(mx_mv)(W, x, y, row, 3, 0, &nx); break;
                case 2: KS_FN(mx_mv)(W, x, y, row, 2, 0, &nx); break;
                default: KS_FN(mx_mv)(W, x, y, row, 1, 0, &nx); break;
                }
                /* The fast decode gives +0 where the canonical weight is -0 (code 8).
                 * That changes no sum but the sign of an exact zero (docs/KERNELS.md),
                 * so a zero result is recomputed exactly. */
                for (uint32_t i = 0; i < n; i++) {
                    if (y[r + i] != 0.0f) continue;
                    uint32_t one[1][2] = { { r + i, r + i } };
                    KS_FN(mx_mv)(W, x, y, one, 1, 1, NULL);
                }
            }
        }
        r += n;
    }
}

/* ---- matrix-matrix, blocked like a GEMM (docs/KERNELS.md, "Matrix-matrix"):
 * for a block of KS_SB rows and KS_TC tokens, the columns go by in chunks of
 * KS_KC. x comes packed (ks_pack_x: each 16-group's elements in the slot
 * order below), either once for the whole product by the caller (k3_xpack) or
 * here, one chunk at a time. The chunk's weights are decoded, KS_RP row vectors
 * at a time, into a panel that every token of the chunk then reuses; register
 * tiles of KS_MR row vectors x KS_TT tokens run over one half of the panel at a
 * time (the lanes of the two halves never meet before the final tree, so one
 * half can go after the other). Each lane still takes its elements in
 * increasing i: the 16-groups of a chunk go by in order, and the chunks in
 * order. The lane sums wait in acc between chunks.
 * Slots: every encoding decodes a 16-group into the order of MXFP4's
 * nibbles: slots 0-7 hold canonical lanes ks_lane_e, slots 8-15 ks_lane_o. */
#define KS_SV (KS_SB / KS_NR)           /* row vectors per block */
typedef struct KS_FN(mm) {
    ks_vf pan[2][KS_KC / 16][KS_RP];    /* [slot half][16-group][row vector] decoded weights */
    ks_vf acc[KS_SV][KS_TC][2];         /* [row vector][token][slot half] lane sums */
    float xp[KS_TC][KS_KC];             /* [token][16-group: 16 slots] this chunk of x, when
                                           the caller did not pack it */
    uint32_t row[KS_SV][2];             /* [row vector][half] row index */
} KS_FN(mm);

/* Prefetch 16-groups [g0, g0+ng) of row vectors [v0, v0+KS_RP). */
static void KS_FN(mm_prefetch)(const KS_FN(mm) *m, const k3_mat *W, int v0, uint32_t g0, uint32_t ng)
{
    for (int k = 0; k < KS_RP; k++)
        for (int h = 0; h < KS_NR; h++) {
            size_t r = m->row[v0 + k][h];
            if (W->enc == K3_ENC_BF16) {
                const uint16_t *p = (const uint16_t *)W->data + r * W->cols;
                for (uint32_t g = g0; g < g0 + ng; g += 2) __builtin_prefetch(p + 16 * g);
            } else if (W->enc == K3_ENC_Q8) {
                const int8_t *q = (const int8_t *)W->data + r * W->cols;
                for (uint32_t g = g0; g < g0 + ng; g += 4) __builtin_prefetch(q + 16 * g);
                __builtin_prefetch(W->scales + r * (W->cols / 32) + g0 / 2);
            } else {
                const uint8_t *q = (const uint8_t *)W->data + r * (W->cols / 2);
                for (uint32_t g = g0; g < g0 + ng; g += 8) __builtin_prefetch(q + 8 * g);
                __builtin_prefetch(W->scales + r * (W->cols / 32) + g0 / 2);
            }
        }
}

/* Decode 16-groups [g0, g0+ng) of row vectors [v0, v0+KS_RP) into the panel. */
static void KS_FN(mm_decode)(KS_FN(mm) *m, const k3_mat *W, int v0, uint32_t g0, uint32_t ng)
{
    for (int k = 0; k < KS_RP; k++) {
        const uint32_t *row = m->row[v0 + k];
        if (W->enc == K3_ENC_BF16) {
            const uint16_t *p0 = (const uint16_t *)W->data + (size_t)row[0] * W->cols;
            const uint16_t *p1 = (const uint16_t *)W->data + (size_t)row[1] * W->cols;
            for (uint32_t g = 0; g < ng; g++) {
                /* pairs of bf16 in 32-bit lanes, qwords 0,2,1,3: elements 0,1,8,9 | 4,5,12,13 (pairs) */
                ks_vi raw = ks_permq_d8(ks_ld256(p0 + 16 * (g0 + g), p1 + 16 * (g0 + g)));
                m->pan[0][g][k] = ks_if(ks_slli32(raw, 16));                    /* 0,2,8,10,4,6,12,14 */
                m->pan[1][g][k] = ks_if(ks_slli32(ks_srli32(raw, 16), 16));     /* 1,3,9,11,5,7,13,15 */
            }
            continue;
        }
        if (W->enc == K3_ENC_Q8) {
            const int8_t *p0 = (const int8_t *)W->data + (size_t)row[0] * W->cols;
            const int8_t *p1 = (const int8_t *)W->data + (size_t)row[1] * W->cols;
            const uint8_t *s0 = W->scales + (size_t)row[0] * (W->cols / 32);
            const uint8_t *s1 = W->scales + (size_t)row[1] * (W->cols / 32);
            for (uint32_t g = 0; g < ng; g++) {
                uint32_t b = (g0 + g) / 2;
                ks_vf sc = ks_bf(&ks_e8m0[s0[b]].f, &ks_e8m0[s1[b]].f), lo, hi;
                KS_FN(dec_q8)(p0 + 16 * (g0 + g), p1 + 16 * (g0 + g), sc, &lo, &hi);  /* 0-7, 8-15 */
                m->pan[0][g][k] = ks_shuf_even(lo, hi);                         /* 0,2,8,10,4,6,12,14 */
                m->pan[1][g][k] = ks_shuf_odd(lo, hi);                          /* 1,3,9,11,5,7,13,15 */
            }
            continue;
        }
        const uint8_t *q0 = (const uint8_t *)W->data + (size_t)row[0] * (W->cols / 2);
        const uint8_t *q1 = (const uint8_t *)W->data + (size_t)row[1] * (W->cols / 2);
        const uint8_t *s0 = W->scales + (size_t)row[0] * (W->cols / 32);
        const uint8_t *s1 = W->scales + (size_t)row[1] * (W->cols / 32);
        /* the fast decode where all scales allow it (zero results are redone exactly) */
        int exact = !ks_scales_fast(s0 + g0 / 2, ng / 2) || !ks_scales_fast(s1 + g0 / 2, ng / 2);
        for (uint32_t g = 0; g < ng; g += 2) {                  /* g0, ng even: whole blocks */
            uint32_t b = (g0 + g) / 2;
            ks_vf w[4];                                         /* E g, O g, E g+1, O g+1 */
            if (exact) KS_FN(dec_mx)(q0 + 16 * b, q1 + 16 * b, s0[b], s1[b], 1, w);
            else KS_FN(dec_mx)(q0 + 16 * b, q1 + 16 * b, s0[b], s1[b], 0, w);
            m->pan[0][g][k] = w[0];
            m->pan[1][g][k] = w[1];
            m->pan[0][g + 1][k] = w[2];
            m->pan[1][g + 1][k] = w[3];
        }
    }
}

/* The register tile: panel row vectors [k0, k0+KS_MR) (block row vectors
 * v0 + k) x TT tokens from t0, slot halves [h0, h0+H), over the panel's
 * 16-groups [0, ng); xb is the packed x of token t0 at the panel's first
 * group, xs floats from one token to the next; first: the sums start from
 * zero. TT * H is at most KS_TT: one pass over both halves only where a single
 * token is left, so that there are always 8 or more independent FMA chains. */
KS_INLINE void KS_FN(mm_tile)(KS_FN(mm) *m, int k0, int v0, uint32_t t0, const float *xb, size_t xs,
                              int TT, int H, int h0, uint32_t ng, int first)
{
    ks_vf a[KS_MR][KS_TT];                                      /* [row vector][token x half] */
    for (int i = 0; i < KS_MR; i++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < TT; t++)
                a[i][h * TT + t] = first ? ks_zero() : m->acc[v0 + k0 + i][t0 + t][h0 + h];
    for (uint32_t g = 0; g < ng; g++) {
        for (int h = 0; h < H; h++) {
            ks_vf xv[KS_TT];
            for (int t = 0; t < TT; t++) {
                xv[t] = ks_ldx8(xb + (size_t)t * xs + 16 * g + 8 * (h0 + h));
                ks_reg(xv[t]);              /* one load per token, not one per FMA */
            }
            for (int i = 0; i < KS_MR; i++) {
                ks_vf w = m->pan[h0 + h][g][k0 + i];
                ks_reg(w);                  /* and one per row vector */
                for (int t = 0; t < TT; t++) a[i][h * TT + t] = ks_fma(w, xv[t], a[i][h * TT + t]);
            }
        }
    }
    for (int i = 0; i < KS_MR; i++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < TT; t++) m->acc[v0 + k0 + i][t0 + t][h0 + h] = a[i][h * TT + t];
}

/* The tile shapes, each its own function so that nothing else competes for
 * the registers: TT tokens x H halves. */
#define KS_TILE_FN(NAME, TT, H) \
    static __attribute__((noinline)) void KS_FN(NAME)(KS_FN(mm) *m, int k0, int v0, uint32_t t0, \
                                                      const float *xb, size_t xs, int h0, uint32_t ng, \
                                                      int first) \
    { KS_FN(mm_tile)(m, k0, v0, t0, xb, xs, TT, H, h0, ng, first); }
KS_TILE_FN(mm_tile_full, KS_TT, 1)
#if KS_TT > 4
KS_TILE_FN(mm_tile_5, 5, 1)
KS_TILE_FN(mm_tile_4, 4, 1)
#endif
KS_TILE_FN(mm_tile_2, 2, 1)
KS_TILE_FN(mm_tile_1, 1, 2)
#undef KS_TILE_FN

#if KS_TT > 4 && !defined(KS_FIVES_SIXES)
#define KS_FIVES_SIXES
/* Whether n tokens go by in tiles of 5 and 6 alone (24 or 20 sums a tile: no small tile). */
static inline int ks_fives_sixes(uint32_t n)
{
    return n == 0 || n == 5 || n == 6 || (n >= 10 && n <= 12) || (n >= 15 && n <= 18) || n >= 20;
}
#endif

/* The tokens of the next tile when rem are left: the largest tile, except that with 32
 * registers rem goes by in tiles of 6 and 5 wherever it can (32 = 6 + 6 + 5 + 5 + 5 + 5, not
 * 6 x 5 + 2), then 4, 2, 1. */
static inline uint32_t KS_FN(mm_tile_tokens)(uint32_t rem)
{
#if KS_TT > 4
    if (rem >= 6 && ks_fives_sixes(rem - 6)) return 6;
    if (rem >= 5 && ks_fives_sixes(rem - 5)) return 5;
    return rem >= 4 ? 4 : rem >= 2 ? 2 : 1;
#else
    return rem >= KS_TT ? KS_TT : rem >= 2 ? 2 : 1;
#endif
}

/* All tiles of the panel (row vectors [v0, v0+KS_RP)) and the tc tokens of the
 * chunk (x as in mm_tile, for token 0): each token tile's x stays in L1 while
 * it meets every row tile of the panel. */
static void KS_FN(mm_tiles)(KS_FN(mm) *m, int v0, const float *xb, size_t xs, uint32_t tc, uint32_t ng,
                            int first)
{
    for (uint32_t t = 0, tt; t < tc; t += tt) {
        const float *xt = xb + (size_t)t * xs;
        tt = KS_FN(mm_tile_tokens)(tc - t);
        for (int k0 = 0; k0 < KS_RP; k0 += KS_MR) {
            if (tt == KS_TT)
                for (int h = 0; h < 2; h++) KS_FN(mm_tile_full)(m, k0, v0, t, xt, xs, h, ng, first);
#if KS_TT > 4
            else if (tt == 5)
                for (int h = 0; h < 2; h++) KS_FN(mm_tile_5)(m, k0, v0, t, xt, xs, h, ng, first);
            else if (tt == 4)
                for (int h = 0; h < 2; h++) KS_FN(mm_tile_4)(m, k0, v0, t, xt, xs, h, ng, first);
#endif
            else if (tt == 2)
                for (int h = 0; h < 2; h++) KS_FN(mm_tile_2)(m, k0, v0, t, xt, xs, h, ng, first);
            else KS_FN(mm_tile_1)(m, k0, v0, t, xt, xs, 0, ng, first);
        }
    }
}

/* Rows [r0, r1), tokens [0, T), T >= 2; xp: x packed by the caller ([T][cols/16*16],
 * ks_pack_x), or NULL. */
static void KS_FN(mmul)(const k3_mat *W, const float *x, size_t ldx, const float *xp, uint32_t T,
                        float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    KS_FN(mm) m;
    const uint32_t cols = W->cols, ng = cols / 16;
    const int mx = W->enc == K3_ENC_MXFP4;
    for (uint32_t r = r0; r < r1; r += KS_SB) {
        uint32_t n = r1 - r < KS_SB ? r1 - r : KS_SB;
        int nv = (int)((n + KS_RP * KS_NR - 1) / (KS_RP * KS_NR)) * KS_RP;  /* row vectors */
        for (int v = 0; v < nv; v++)
            for (int h = 0; h < 2; h++) {
                uint32_t i = (uint32_t)v * KS_NR + (uint32_t)(h < KS_NR ? h : 0);
                m.row[v][h] = r + (i < n ? i : n - 1);  /* past the end: repeat the last row */
            }
        for (uint32_t tc0 = 0; tc0 < T; tc0 += KS_TC) {
            uint32_t tc = T - tc0 < KS_TC ? T - tc0 : KS_TC;
            const float *xt[KS_TC];                             /* token rows, [cols] each */
            for (uint32_t t = 0; t < tc; t++) xt[t] = x + (size_t)(tc0 + t) * ldx;
            uint32_t g0 = 0;
            do {                                                /* at least once: zeroes acc */
                uint32_t gn = ng - g0 < KS_KC / 16 ? ng - g0 : KS_KC / 16;
                uint32_t gnext = g0 + gn, nnext = ng - gnext < KS_KC / 16 ? ng - gnext : KS_KC / 16;
                int first = g0 == 0;
                const float *xb = xp ? xp + (size_t)tc0 * k3_xpack_cols(cols) + 16 * g0 : &m.xp[0][0];
                size_t xs = xp ? k3_xpack_cols(cols) : KS_KC;
                if (!xp)
                    for (uint32_t t = 0; t < tc; t++) ks_pack_x(m.xp[t], xt[t] + 16 * g0, gn);
                for (int v0 = 0; v0 < nv; v0 += KS_RP) {
                    if (v0 + KS_RP < nv) KS_FN(mm_prefetch)(&m, W, v0 + KS_RP, g0, gn);  /* the next panel */
                    else if (nnext) KS_FN(mm_prefetch)(&m, W, 0, gnext, nnext);      /* the next chunk's */
                    KS_FN(mm_decode)(&m, W, v0, g0, gn);
                    KS_FN(mm_tiles)(&m, v0, xb, xs, tc, gn, first);
                }
                g0 += KS_KC / 16;
            } while (g0 < ng);
            for (int v = 0; v < nv; v++) {
                for (uint32_t t = 0; t < tc; t++) {
                    float e[2][8], o[2][8], lanes[16];
                    ks_halves(m.acc[v][t][0], e[0], e[1]);
                    ks_halves(m.acc[v][t][1], o[0], o[1]);
                    for (int h = 0; h < KS_NR; h++) {
                        float *yo = &y[(size_t)(tc0 + t) * ldy + m.row[v][h]];
                        if (cols % 16 == 0) {
                            *yo = ks_reduce_eo(_mm256_loadu_ps(e[h]), _mm256_loadu_ps(o[h]));
                            continue;
                        }
                        for (int j = 0; j < 8; j++) {                   /* a BF16 row's tail */
                            lanes[ks_lane_e[j]] = e[h][j];
                            lanes[ks_lane_o[j]] = o[h][j];
                        }
                        ks_tail_bf16((const uint16_t *)W->data + (size_t)m.row[v][h] * cols, xt[t],
                                     ng * 16, cols, lanes);
                        *yo = ks_reduce16(lanes);
                    }
                }
            }
            if (mx)                              /* as in mv: a zero result may be a -0 */
                for (uint32_t t = 0; t < tc; t++) {
                    float *yt = y + (size_t)(tc0 + t) * ldy;
                    for (uint32_t i = 0; i < n; i++) {
                        if (yt[r + i] != 0.0f) continue;
                        uint32_t one[1][2] = { { r + i, r + i } };
                        KS_FN(mx_mv)(W, xt[t], yt, one, 1, 1, NULL);
                    }
                }
        }
    }
}

/* ---- BF16 for a few tokens, in registers (T = 2..KS_FT): the matrix-vector kernels' way,
 * for T tokens at once. R row vectors x T tokens x 2 slot halves of sums stay in registers
 * over the whole row; each 16-group of weights is decoded in registers (the panel's slot order:
 * one vpermq and two shifts) and met by the T tokens' packed x at once: no panel, no sums
 * stored between chunks. Each lane still takes its elements in increasing i and the sums end
 * in the same tree, so the bits are mmul's (and mv's). MXFP4 and Q8 stay with mmul, whose
 * panel amortises their costlier decode better at every T (docs/KERNELS.md). */
#define KS_FT 6                         /* tokens of the register kernel at most */
#define KS_FT_MAX 16                      /* BF16 products of up to this many tokens go by in parts of KS_FT */
KS_INLINE void KS_FN(ft_body)(const k3_mat *W, const float *xp, int T, int R, float *y, size_t ldy,
                              const uint32_t row[][2])
{
    const uint32_t cols = W->cols, ng = cols / 16;
    const size_t xs = k3_xpack_cols(cols);                      /* packed x: floats per token */
    ks_vf a[3][KS_FT][2];                                       /* [row vector][token][slot half] */
    for (int k = 0; k < R; k++)
        for (int t = 0; t < T; t++) a[k][t][0] = a[k][t][1] = ks_zero();
    for (uint32_t g = 0; g < ng; g++) {
        for (int k = 0; k < R; k++) {
            const uint16_t *p0 = (const uint16_t *)W->data + (size_t)row[k][0] * cols + 16 * g;
            const uint16_t *p1 = (const uint16_t *)W->data + (size_t)row[k][KS_NR - 1] * cols + 16 * g;
            if (g % 2 == 0) {                                   /* the row 1 KiB ahead */
                KS_PREFETCH(p0, 1024);
                if (KS_NR > 1) KS_PREFETCH(p1, 1024);
            }
            ks_vi raw = ks_permq_d8(ks_ld256(p0, p1));          /* as mm_decode */
            ks_vf w0 = ks_if(ks_slli32(raw, 16)), w1 = ks_if(ks_slli32(ks_srli32(raw, 16), 16));
            for (int t = 0; t < T; t++) {
                const float *xg = xp + (size_t)t * xs + 16 * g;
                a[k][t][0] = ks_fma(w0, ks_ldx8(xg), a[k][t][0]);
                a[k][t][1] = ks_fma(w1, ks_ldx8(xg + 8), a[k][t][1]);
            }
        }
    }
    for (int k = 0; k < R; k++)
        for (int t = 0; t < T; t++) {
            float e[2][8], o[2][8];
            ks_halves(a[k][t][0], e[0], e[1]);
            ks_halves(a[k][t][1], o[0], o[1]);
            for (int h = 0; h < KS_NR; h++)
                y[(size_t)t * ldy + row[k][h]] = ks_reduce_eo(_mm256_loadu_ps(e[h]), _mm256_loadu_ps(o[h]));
        }
}

/* Each shape its own function, so that its sums own the registers: T tokens x R row vectors. */
#define KS_FT_FN(T, R) \
    static __attribute__((noinline)) void KS_FN(ft_##T##_##R)(const k3_mat *W, const float *xp, float *y, \
                                                              size_t ldy, const uint32_t row[][2]) \
    { KS_FN(ft_body)(W, xp, T, R, y, ldy, row); }
KS_FT_FN(2, 3)
KS_FT_FN(2, 1)
KS_FT_FN(3, 2)
KS_FT_FN(3, 1)
KS_FT_FN(4, 1)
KS_FT_FN(5, 1)
KS_FT_FN(6, 1)
#undef KS_FT_R
#if KS_TT > 4           /* 32 registers (AVX-512): up to 24 sums, so each x load meets 2-3 row vectors */
KS_FT_FN(3, 3)
KS_FT_FN(4, 3)
KS_FT_FN(5, 2)
KS_FT_FN(6, 2)
#define KS_FT_R(T) ((T) <= 4 ? 3 : 2)
#else                   /* 16: 12 sums or fewer */
#define KS_FT_R(T) ((T) == 2 ? 3 : (T) == 3 ? 2 : 1)
#endif
#undef KS_FT_FN

/* One row vector of T tokens (the last rows of a part). */
static void KS_FN(ft_1)(const k3_mat *W, const float *xp, uint32_t T, float *y, size_t ldy, const uint32_t row[][2])
{
    switch (T) {
    case 2: KS_FN(ft_2_1)(W, xp, y, ldy, row); break;
    case 3: KS_FN(ft_3_1)(W, xp, y, ldy, row); break;
    case 4: KS_FN(ft_4_1)(W, xp, y, ldy, row); break;
    case 5: KS_FN(ft_5_1)(W, xp, y, ldy, row); break;
    default: KS_FN(ft_6_1)(W, xp, y, ldy, row); break;
    }
}

/* Rows [r0, r1) of a BF16 W with cols % 16 == 0, tokens [0, T), 2 <= T <= KS_FT, x packed (xp)
   as for mmul. */
static void KS_FN(ft)(const k3_mat *W, const float *xp, uint32_t T, float *y, size_t ldy, uint32_t r0,
                      uint32_t r1)
{
    const int R = KS_FT_R(T);                                    /* row vectors per pass */
    for (uint32_t r = r0; r < r1;) {
        uint32_t n = r1 - r < (uint32_t)R * KS_NR ? r1 - r : (uint32_t)R * KS_NR;
        uint32_t row[3][2];
        int Rn = KS_FN(pass_rows)(r, n, row);
        switch (T * 8 + (uint32_t)Rn) {
        case 2 * 8 + 3: KS_FN(ft_2_3)(W, xp, y, ldy, row); break;
        case 3 * 8 + 2: KS_FN(ft_3_2)(W, xp, y, ldy, row); break;
#if KS_TT > 4
        case 3 * 8 + 3: KS_FN(ft_3_3)(W, xp, y, ldy, row); break;
        case 4 * 8 + 3: KS_FN(ft_4_3)(W, xp, y, ldy, row); break;
        case 5 * 8 + 2: KS_FN(ft_5_2)(W, xp, y, ldy, row); break;
        case 6 * 8 + 2: KS_FN(ft_6_2)(W, xp, y, ldy, row); break;
#endif
        default:                                                /* the last rows: one row vector at a time */
            for (int k = 0; k < Rn; k++) KS_FN(ft_1)(W, xp, T, y, ldy, row + k);
        }
        r += n;
    }
}

/* The entry point: rows [r0, r1) of y = W x for T tokens. */
static void KS_FN(rows)(const k3_mat *W, const float *x, size_t ldx, const float *xp, uint32_t T,
                        float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    if (r0 >= r1 || T == 0) return;
    if (T == 1) KS_FN(mv)(W, x, y, r0, r1);
    else if (T <= KS_FT_MAX && xp && W->enc == K3_ENC_BF16 && W->cols % 16 == 0) {
        /* in parts of at most KS_FT tokens, as even as they come (8: 4 + 4) */
        uint32_t parts = (T + KS_FT - 1) / KS_FT, t0 = 0;
        const size_t xs = k3_xpack_cols(W->cols);
        for (uint32_t i = 0; i < parts; i++) {
            uint32_t tn = (T - t0) / (parts - i);
            KS_FN(ft)(W, xp + t0 * xs, tn, y + (size_t)t0 * ldy, ldy, r0, r1);
            t0 += tn;
        }
    }
    else KS_FN(mmul)(W, x, ldx, xp, T, y, ldy, r0, r1);
}

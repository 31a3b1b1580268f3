/*
 * attn_avx2.c - attn.h's AVX2 forms. Compiled with -mavx2 and WITHOUT -mfma (k3run/CMakeLists.txt),
 * so the compiler cannot contract a multiply and an add into one rounding: every _mm256_mul_ps and
 * _mm256_add_ps here is one rounded fp32 operation per lane, the same as the scalar form's `*` and
 * `+` on that element (attn.c). Vectors only ever hold independent elements (8 columns of S,
 * 8 positions' lanes, 8 values of r), each computed in the scalar form's order; the operands of
 * every multiply and add are in the scalar form's order too (which matters only for which NaN
 * comes out). Tails are done element by element, never with masked arithmetic on padding.
 */
#include <immintrin.h>
#include <string.h>

#include "attn.h"

#define INLINE static inline __attribute__((always_inline))

/* ---- KDA ---------------------------------------------------------------------------------- */

/*
 * One token on the columns [b0, b0 + 8 NB) of S: attn.c's kda_token restricted to these columns
 * (pass 1, u, pass 2), the block's ks, u and o held in registers. has_o is a constant at each
 * call, so the commit's form (no output) has no test in its loop.
 */
INLINE void kda_block(float *S, uint32_t K, uint32_t b0, int NB, const float *e, const float *k, const float *v,
                      const float *q, float *o, float beta, int has_o)
{
    __m256 ks[4], u[4], ov[4];                                        /* [NB] x 8 columns */
    for (int j = 0; j < NB; j++) ks[j] = _mm256_setzero_ps();
    for (uint32_t a = 0; a < K; a++) {
        float *Sa = S + (size_t)a * K + b0;                           /* [8 NB] of row a */
        __m256 ea = _mm256_set1_ps(e[a]), ka = _mm256_set1_ps(k[a]);
        for (int j = 0; j < NB; j++) {
            __m256 s = _mm256_mul_ps(_mm256_loadu_ps(Sa + 8 * j), ea);                /* S * e[a] */
            _mm256_storeu_ps(Sa + 8 * j, s);
            ks[j] = _mm256_add_ps(ks[j], _mm256_mul_ps(ka, s));                       /* ks + k[a] * S */
        }
    }
    __m256 bv = _mm256_set1_ps(beta);
    for (int j = 0; j < NB; j++) u[j] = _mm256_mul_ps(bv, _mm256_sub_ps(_mm256_loadu_ps(v + b0 + 8 * j), ks[j]));
    for (int j = 0; j < NB; j++) ov[j] = _mm256_setzero_ps();
    for (uint32_t a = 0; a < K; a++) {
        float *Sa = S + (size_t)a * K + b0;
        __m256 ka = _mm256_set1_ps(k[a]);
        __m256 qa = has_o ? _mm256_set1_ps(q[a]) : ka;
        for (int j = 0; j < NB; j++) {
            __m256 s = _mm256_add_ps(_mm256_loadu_ps(Sa + 8 * j), _mm256_mul_ps(ka, u[j]));   /* S + k[a] * u */
            _mm256_storeu_ps(Sa + 8 * j, s);
            if (has_o) ov[j] = _mm256_add_ps(ov[j], _mm256_mul_ps(qa, s));                /* o + q[a] * S */
        }
    }
    if (has_o)
        for (int j = 0; j < NB; j++) _mm256_storeu_ps(o + b0 + 8 * j, ov[j]);
}

/* One token on column b alone (the last K % 8 columns): kda_token's operations on that column. */
static void kda_col(float *S, uint32_t K, uint32_t b, const float *e, const float *k, const float *v, const float *q,
                    float *o, float beta)
{
    float ks = 0.0f;
    for (uint32_t a = 0; a < K; a++) {
        float *s = S + (size_t)a * K + b;
        *s = *s * e[a];
        ks = ks + k[a] * *s;
    }
    float u = beta * (v[b] - ks), ob = 0.0f;
    for (uint32_t a = 0; a < K; a++) {
        float *s = S + (size_t)a * K + b;
        *s = *s + k[a] * u;
        if (o) ob = ob + q[a] * *s;
    }
    if (o) o[b] = ob;
}

/*
 * The columns are independent (attn.c), so each block of columns runs all T tokens in a row
 * while its part of S (K x 32 floats, 16 KiB at K = 128) stays in the L1 cache; token t of a
 * column still sees exactly the values that token t - 1 left in it.
 */
#define KDA_COLS(NB, HAS_O)                                                                          \
    for (uint32_t t = 0; t < T; t++) {                                                               \
        size_t x = (size_t)t * ld;                                                                   \
        kda_block(S, K, b0, NB, e + x, k + x, v + x, HAS_O ? q + x : NULL, HAS_O ? o + x : NULL,     \
                  beta[(size_t)t * ldb], HAS_O);                                                     \
    }

void k3_kda_tokens_avx2(float *S, uint32_t K, uint32_t T, const float *e, const float *k, const float *v,
                        const float *q, float *o, size_t ld, const float *beta, size_t ldb, float *ks)
{
    (void)ks;
    uint32_t b0 = 0;
    for (; b0 + 32 <= K; b0 += 32) {
        if (o) { KDA_COLS(4, 1) } else { KDA_COLS(4, 0) }
    }
    for (; b0 + 8 <= K; b0 += 8) {
        if (o) { KDA_COLS(1, 1) } else { KDA_COLS(1, 0) }
    }
    for (; b0 < K; b0++)
        for (uint32_t t = 0; t < T; t++) {
            size_t x = (size_t)t * ld;
            kda_col(S, K, b0, e + x, k + x, v + x, o ? q + x : NULL, o ? o + x : NULL, beta[(size_t)t * ldb]);
        }
}

/* ---- MLA ---------------------------------------------------------------------------------- */

/* 8 BF16 values widened exactly to fp32 (the bits are the top half) */
INLINE __m256 bf16x8(const uint16_t *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

static inline float bf16f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ql[r0 .. r0 + 8 NB) over every d, the block in registers */
INLINE void qhat_block(float *ql, const float *qn, const uint16_t *w, size_t ldw, uint32_t dn, uint32_t r0, int NB)
{
    __m256 acc[8];                                                    /* [NB] x 8 values of r */
    for (int j = 0; j < NB; j++) acc[j] = _mm256_setzero_ps();
    for (uint32_t d = 0; d < dn; d++) {
        const uint16_t *row = w + (size_t)d * ldw + r0;
        __m256 qv = _mm256_set1_ps(qn[d]);
        for (int j = 0; j < NB; j++) acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(qv, bf16x8(row + 8 * j)));
    }
    for (int j = 0; j < NB; j++) _mm256_storeu_ps(ql + r0 + 8 * j, acc[j]);
}

void k3_mla_qhat_avx2(float *ql, const float *qn, const uint16_t *w, size_t ldw, uint32_t dn, uint32_t R)
{
    uint32_t r0 = 0;
    for (; r0 + 64 <= R; r0 += 64) qhat_block(ql, qn, w, ldw, dn, r0, 8);
    for (; r0 + 8 <= R; r0 += 8) qhat_block(ql, qn, w, ldw, dn, r0, 1);
    for (uint32_t r = r0; r < R; r++) {
        float acc = 0.0f;
        for (uint32_t d = 0; d < dn; d++) acc = acc + qn[d] * bf16f(w[(size_t)d * ldw + r]);
        ql[r] = acc;
    }
}

/*
 * The 8 lanes of the dot products of GH heads' vectors (head h at a + h * lda) with P positions'
 * (position p at b + p * ldb): acc[h * P + p] lane l is k3v_dot's acc[l] for that pair. The last
 * n % 8 elements go to lanes 0 .. n % 8 - 1 with a blend, so the other lanes keep their bits (no
 * 0 * 0 added to a lane).
 */
INLINE void dot_tile(__m256 *acc, int GH, const float *a, size_t lda, int P, const float *b, size_t ldb, uint32_t n)
{
    for (int x = 0; x < GH * P; x++) acc[x] = _mm256_setzero_ps();
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 vb[4];                                                 /* [P] positions' 8 elements */
        for (int p = 0; p < P; p++) vb[p] = _mm256_loadu_ps(b + p * ldb + i);
        for (int h = 0; h < GH; h++) {
            __m256 va = _mm256_loadu_ps(a + h * lda + i);
            for (int p = 0; p < P; p++) acc[h * P + p] = _mm256_add_ps(acc[h * P + p], _mm256_mul_ps(va, vb[p]));
        }
    }
    if (i < n) {
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int h = 0; h < GH; h++) {
            __m256 va = _mm256_maskload_ps(a + h * lda + i, mask);
            for (int p = 0; p < P; p++) {
                __m256 sum = _mm256_add_ps(acc[h * P + p], _mm256_mul_ps(va, _mm256_maskload_ps(b + p * ldb + i, mask)));
                acc[h * P + p] = _mm256_blendv_ps(acc[h * P + p], sum, _mm256_castsi256_ps(mask));
            }
        }
    }
}

/* k3v_dot's tree on one pair's lanes: (l + l+4), then (0+2, 1+3), then 0+1 */
INLINE float tree1(__m256 acc)
{
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/* The same tree on 4 pairs at once: lane p of the result is tree1(acc[p]). Every add below is
   one of the tree's adds, with its operands in the tree's order. */
INLINE __m128 tree4(const __m256 *acc)
{
    __m128 x[4];                                                      /* s4 of each pair */
    for (int p = 0; p < 4; p++) x[p] = _mm_add_ps(_mm256_castps256_ps128(acc[p]), _mm256_extractf128_ps(acc[p], 1));
    /* [s4_0 + s4_2, s4_1 + s4_3] of two pairs */
    __m128 y01 = _mm_add_ps(_mm_shuffle_ps(x[0], x[1], _MM_SHUFFLE(1, 0, 1, 0)), _mm_shuffle_ps(x[0], x[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m128 y23 = _mm_add_ps(_mm_shuffle_ps(x[2], x[3], _MM_SHUFFLE(1, 0, 1, 0)), _mm_shuffle_ps(x[2], x[3], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm_add_ps(_mm_shuffle_ps(y01, y23, _MM_SHUFFLE(2, 0, 2, 0)), _mm_shuffle_ps(y01, y23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Scores of GH heads at positions [ta, tb): 4 positions at a time (GH x 4 independent chains),
   then one at a time. */
INLINE void score_rows(float *s, size_t lds, const float *ql, size_t ldq, const float *qr, size_t ldqr, int GH,
                       const float *cc, const float *ckr, uint32_t ta, uint32_t tb, uint32_t R, uint32_t dr, float scale)
{
    __m128 sc = _mm_set1_ps(scale);
    uint32_t tau = ta;
    for (; tau + 4 <= tb; tau += 4) {
        __m256 acc[8];                                                /* [GH][4 positions] lanes */
        __m128 dc[2];                                                 /* [GH] dot_c of the 4 positions */
        dot_tile(acc, GH, ql, ldq, 4, cc + (size_t)tau * R, R, R);
        for (int h = 0; h < GH; h++) dc[h] = tree4(acc + 4 * h);
        dot_tile(acc, GH, qr, ldqr, 4, ckr + (size_t)tau * dr, dr, dr);
        for (int h = 0; h < GH; h++)                                  /* (dot_c + dot_r) * scale */
            _mm_storeu_ps(s + h * lds + tau, _mm_mul_ps(_mm_add_ps(dc[h], tree4(acc + 4 * h)), sc));
    }
    for (; tau < tb; tau++) {
        __m256 ac[2], ar[2];                                          /* [GH] lanes */
        dot_tile(ac, GH, ql, ldq, 1, cc + (size_t)tau * R, R, R);
        dot_tile(ar, GH, qr, ldqr, 1, ckr + (size_t)tau * dr, dr, dr);
        for (int h = 0; h < GH; h++) s[h * lds + tau] = (tree1(ac[h]) + tree1(ar[h])) * scale;
    }
}

/* Positions in chunks of 64 (64 rows of the cache stay in L1/L2 while every head pair reads them) */
#define MLA_CHUNK 64u

void k3_mla_scores_avx2(float *s, size_t lds, const float *ql, size_t ldq, const float *qr, size_t ldqr,
                        uint32_t nh, const float *cc, const float *ckr, uint32_t t0, uint32_t t1, uint32_t R,
                        uint32_t dr, float scale)
{
    for (uint32_t ta = t0; ta < t1; ta += MLA_CHUNK) {
        uint32_t tb = t1 - ta < MLA_CHUNK ? t1 : ta + MLA_CHUNK, h = 0;
        for (; h + 2 <= nh; h += 2)
            score_rows(s + h * lds, lds, ql + h * ldq, ldq, qr + h * ldqr, ldqr, 2, cc, ckr, ta, tb, R, dr, scale);
        if (h < nh) score_rows(s + h * lds, lds, ql + h * ldq, ldq, qr + h * ldqr, ldqr, 1, cc, ckr, ta, tb, R, dr, scale);
    }
}

void k3_mla_probs_avx2(float *s, uint32_t n, double sum)
{
    uint32_t tau = 0;
    __m256d sv = _mm256_set1_pd(sum);
    for (; tau + 4 <= n; tau += 4)                                    /* (float)(s / sum), in double */
        _mm_storeu_ps(s + tau, _mm256_cvtpd_ps(_mm256_div_pd(_mm256_cvtps_pd(_mm_loadu_ps(s + tau)), sv)));
    for (; tau < n; tau++) s[tau] = (float)(s[tau] / sum);
}

/* ol of GH heads, columns [r, r + 8 NB), over positions [ta, tb): from +0 if first, else going on
   from what the previous chunk stored (a store and a load change no bits) */
INLINE void values_tile(float *ol, size_t ldo, const float *p, size_t ldp, int GH, const float *cc, uint32_t ta,
                        uint32_t tb, uint32_t R, uint32_t r, int NB, int first)
{
    __m256 acc[8];                                                    /* [GH][NB] x 8 columns */
    for (int h = 0; h < GH; h++)
        for (int j = 0; j < NB; j++)
            acc[h * NB + j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(ol + h * ldo + r + 8 * j);
    for (uint32_t tau = ta; tau < tb; tau++) {
        const float *cr = cc + (size_t)tau * R + r;
        __m256 c[2];                                                  /* [NB] */
        for (int j = 0; j < NB; j++) c[j] = _mm256_loadu_ps(cr + 8 * j);
        for (int h = 0; h < GH; h++) {
            __m256 pv = _mm256_set1_ps(p[h * ldp + tau]);
            for (int j = 0; j < NB; j++) acc[h * NB + j] = _mm256_add_ps(acc[h * NB + j], _mm256_mul_ps(pv, c[j]));
        }
    }
    for (int h = 0; h < GH; h++)
        for (int j = 0; j < NB; j++) _mm256_storeu_ps(ol + h * ldo + r + 8 * j, acc[h * NB + j]);
}

INLINE void values_heads(float *ol, size_t ldo, const float *p, size_t ldp, int GH, const float *cc, uint32_t ta,
                         uint32_t tb, uint32_t R, uint32_t r0, uint32_t rv, int first)
{
    uint32_t r = r0;
    for (; r + 16 <= rv; r += 16) values_tile(ol, ldo, p, ldp, GH, cc, ta, tb, R, r, 2, first);
    if (r < rv) values_tile(ol, ldo, p, ldp, GH, cc, ta, tb, R, r, 1, first);
}

void k3_mla_values_avx2(float *ol, size_t ldo, const float *p, size_t ldp, uint32_t nh, const float *cc,
                        uint32_t n, uint32_t R, uint32_t r0, uint32_t r1)
{
    uint32_t rv = r0 + (r1 - r0) / 8 * 8;                              /* columns [r0, rv) by vectors */
    for (uint32_t ta = 0; ta < n; ta += MLA_CHUNK) {
        uint32_t tb = n - ta < MLA_CHUNK ? n : ta + MLA_CHUNK;
        for (uint32_t h = 0; h < nh; h += 4) {
            const float *ph = p + h * ldp;
            float *oh = ol + h * ldo;
            switch (nh - h) {
            case 1: values_heads(oh, ldo, ph, ldp, 1, cc, ta, tb, R, r0, rv, ta == 0); break;
            case 2: values_heads(oh, ldo, ph, ldp, 2, cc, ta, tb, R, r0, rv, ta == 0); break;
            case 3: values_heads(oh, ldo, ph, ldp, 3, cc, ta, tb, R, r0, rv, ta == 0); break;
            default: values_heads(oh, ldo, ph, ldp, 4, cc, ta, tb, R, r0, rv, ta == 0); break;
            }
        }
    }
    for (uint32_t h = 0; h < nh; h++)                                 /* the last (r1 - r0) % 8 columns */
        for (uint32_t r = rv; r < r1; r++) {
            float acc = 0.0f;
            for (uint32_t tau = 0; tau < n; tau++) acc = acc + p[h * ldp + tau] * cc[(size_t)tau * R + r];
            ol[h * ldo + r] = acc;
        }
    if (n == 0)
        for (uint32_t h = 0; h < nh; h++)
            for (uint32_t r = r0; r < rv; r++) ol[h * ldo + r] = 0.0f;
}

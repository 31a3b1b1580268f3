/*
 * kern_mm512.c - the AVX-512 matrix-matrix products (T >= 2 tokens, x packed by
 * k3_xpack_avx512), compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -O3.
 *
 * One __m512 holds one row's 16 lanes (kern_simd.h's AVX-512 form holds two
 * half-rows of 8), so a register tile is R rows x TT tokens of whole
 * accumulators, each x vector a plain 64-byte load and each decoded weight
 * vector one load. Slot order: slot k < 8 of a 16-group holds element 2k
 * (canonical lane 2k), slot 8 + k element 2k + 1, the order in which the
 * MXFP4 nibbles and the BF16 halves of a 32-bit word come apart; x is packed
 * in it once per product. Each accumulator takes its row's 16-groups in
 * increasing order, one FMA per group, and the lanes meet only in the fixed
 * tree after the last column (docs/KERNELS.md, "AVX-512 matrix-matrix"): the
 * canonical order, so the bits equal the scalar path's at every T.
 *
 * Two kernels. k3_mm512, the panel kernel: the caller's rows [r0, r1) in
 * blocks of MB rows; per block, tokens in chunks of TC, columns in chunks of up
 * to KC; per column chunk the block's rows are decoded in panels of RP rows
 * (64 KiB at most: L2) and met by every token tile of the chunk; the lane sums
 * wait in acc between column chunks; the first PFT token tiles of a panel prefetch
 * the next panel into L2. k3_ft512, the register kernel for a few tokens (the
 * end of the file): sums in registers over the whole row, weights decoded in
 * registers, nothing stored. kern_avx512.c picks between them.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "k3_shard.h"
#include "kern.h"

#define MB 32             /* rows per block (= K3_KERN_BLOCK) */
#ifndef PFL
#define PFL 2             /* the next panel is prefetched into L2 (prefetcht1): into L1 it
                             pushed out the lines the tiles use (BF16 at 16 tokens 0.62 -> 0.69) */
#endif
#ifndef PFD
#define PFD 1             /* panels ahead that the prefetch reads (2 and 3 measured the same) */
#endif
#ifndef RP
#define RP 4              /* rows per panel (one register tile's) */
#endif
#ifndef PFT
#define PFT 3             /* token tiles of a panel that prefetch the next (each the whole of it: a
                             prefetch the memory system dropped is asked again; BF16 from memory at
                             16 / 32 / 64 tokens 0.67 / 0.77 / 0.80 -> 0.71 / 0.81 / 0.85 of the peak) */
#endif
#ifndef KC
#define KC 4096           /* columns per chunk at most (a multiple of 32) */
#endif
#define KG (KC / 16)      /* 16-groups per chunk at most */
#define TC 64             /* tokens per chunk */
#define AS (TC + 1)       /* vectors from one row of acc to the next: not 4 KiB apart */

/* slot k of a packed 16-group takes element mm_eo[k] */
static const int32_t mm_eo[16] __attribute__((aligned(64))) = {
    0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15 };
/* canonical lane l is slot mm_ls[l] */
static const int32_t mm_ls[16] __attribute__((aligned(64))) = {
    0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15 };

/* x [T][ldx] into xp [T][k3_xpack_cols(cols)], each 16-group in slot order */
void k3_xpack_avx512(const float *x, size_t ldx, uint32_t T, uint32_t cols, float *xp)
{
    const __m512i eo = _mm512_load_si512(mm_eo);
    const uint32_t ng = cols / 16;
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t g = 0; g < ng; g++)
            _mm512_storeu_ps(xp + (size_t)t * k3_xpack_cols(cols) + 16 * g,
                             _mm512_permutexvar_ps(eo, _mm512_loadu_ps(x + (size_t)t * ldx + 16 * g)));
}

typedef struct mm_work {
    __m512 pan[KG][RP];               /* [16-group][row] one panel's weights, slot order: 64 KiB */
    __m512 acc[MB][AS];               /* [row][token (+1)] lane sums, slot order: 130 KiB */
    uint32_t row[MB];                 /* [row of the block] matrix row (the last repeated) */
} mm_work;

/* ---- decoding: a row's 16-groups into the slot order ---- */

/* Row r's codes at 16-group g: BF16 32 bytes a group, Q8 16, MXFP4 8 (and its scales apart). */
static inline __attribute__((always_inline)) const char *grp_ptr(int enc, const k3_mat *W, size_t r, uint32_t g)
{
    if (enc == K3_ENC_BF16) return (const char *)W->data + (r * W->cols + 16 * (size_t)g) * 2;
    if (enc == K3_ENC_Q8) return (const char *)W->data + r * W->cols + 16 * (size_t)g;
    return (const char *)W->data + r * (W->cols / 2) + 8 * (size_t)g;
}

/* Row r's 16-groups g, g + 1 (g even; BF16: g + 1 < ng) into w0, w1. BF16: a 32-bit word holds
   elements 2d, 2d + 1; the evens and odds of both groups come apart with a shift and an and.
   MXFP4: k3_mx_table[s] holds a block's 16 canonical weights (-0 for code 8, NaN for scale
   255), so one vpermps decodes 16 of them exactly; byte k holds elements 2k, 2k + 1 (the low 4
   bits of an index are all vpermps reads). Q8: fp32(q) * e8m0(s), one exact multiply
   (k3_mx_table[s][2] = 1.0 * e8m0(s)). */
static inline __attribute__((always_inline)) void dec2(int enc, const k3_mat *W, size_t r, uint32_t g,
                                                       __m512 *w0, __m512 *w1)
{
    const char *p = grp_ptr(enc, W, r, g);
    __m512 e, o;                                                     /* evens, odds of g | of g + 1 */
    if (enc == K3_ENC_BF16) {
        __m512i v = _mm512_loadu_si512(p);
        e = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        o = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u)));
    } else if (enc == K3_ENC_MXFP4) {
        __m512 tab = _mm512_load_ps(k3_mx_table[W->scales[r * (W->cols / 32) + g / 2]]);
        __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
        e = _mm512_permutexvar_ps(c, tab);
        o = _mm512_permutexvar_ps(_mm512_srli_epi32(c, 4), tab);
    } else {
        const __m512 sc = _mm512_set1_ps(k3_mx_table[W->scales[r * (W->cols / 32) + g / 2]][2]);
        const __m512i eo = _mm512_load_si512(mm_eo);
        __m512i c0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
        __m512i c1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + 16)));
        *w0 = _mm512_permutexvar_ps(eo, _mm512_mul_ps(_mm512_cvtepi32_ps(c0), sc));
        *w1 = _mm512_permutexvar_ps(eo, _mm512_mul_ps(_mm512_cvtepi32_ps(c1), sc));
        return;
    }
    *w0 = _mm512_shuffle_f32x4(e, o, 0x44);
    *w1 = _mm512_shuffle_f32x4(e, o, 0xEE);
}

/* A BF16 row's odd last 16-group g, alone. */
static inline __m512 dec1_bf16(const k3_mat *W, size_t r, uint32_t g)
{
    __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)grp_ptr(K3_ENC_BF16, W, r, g));
    __m256 e = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    __m256 o = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xFFFF0000u)));
    return _mm512_insertf32x8(_mm512_castps256_ps512(e), o, 1);
}

/* A panel: rows row[0..RP), groups [g0, g0+gn) into pan[0..gn) (MXFP4, Q8: g0, gn even). */
static inline __attribute__((always_inline)) void dec_panel(int enc, mm_work *w, const k3_mat *W,
                                                            const uint32_t *row, uint32_t g0, uint32_t gn)
{
    for (int r = 0; r < RP; r++) {
        uint32_t g = 0;
        for (; g + 2 <= gn; g += 2) dec2(enc, W, row[r], g0 + g, &w->pan[g][r], &w->pan[g + 1][r]);
        if (g < gn) w->pan[g][r] = dec1_bf16(W, row[r], g0 + g);
    }
}

static void dec_bf16(mm_work *w, const k3_mat *W, const uint32_t *row, uint32_t g0, uint32_t gn)
{ dec_panel(K3_ENC_BF16, w, W, row, g0, gn); }
static void dec_mx(mm_work *w, const k3_mat *W, const uint32_t *row, uint32_t g0, uint32_t gn)
{ dec_panel(K3_ENC_MXFP4, w, W, row, g0, gn); }
static void dec_q8(mm_work *w, const k3_mat *W, const uint32_t *row, uint32_t g0, uint32_t gn)
{ dec_panel(K3_ENC_Q8, w, W, row, g0, gn); }

/* nx[r]: the codes of row[r] at group g0 (and its scales prefetched: a line holds 64 blocks') */
static void panel_rows(const k3_mat *W, const uint32_t *row, uint32_t g0, const char **nx)
{
    for (int r = 0; r < RP; r++) {
        nx[r] = grp_ptr(W->enc, W, row[r], g0);
        if (W->enc == K3_ENC_BF16) continue;
        const uint8_t *s = W->scales + (size_t)row[r] * (W->cols / 32) + g0 / 2;
        for (uint32_t b = 0; b < W->cols / 2048 + 1; b++) __builtin_prefetch(s + 64 * b);
    }
}

/* ---- the register tile: panel rows [k0, k0+R) x TT tokens over groups [0, gn) ----
 * xb: packed x of the tile's first token at the chunk's first group, xs floats
 * from one token to the next; a: acc of (row k0, the tile's first token), AS
 * vectors from one row to the next; first: the sums start from zero. nx (or NULL): the
 * next panel's rows, prefetched a line of each row every 2^sh groups (the next panel
 * streams from memory while this one's FMAs run). */
static inline __attribute__((always_inline)) void tile(const mm_work *w, int k0, int R, int TT,
                                                       const float *xb, size_t xs, __m512 *a, uint32_t gn,
                                                       int first, const char *const *nx, int sh)
{
    __m512 s[8][6];                   /* [row][token] */
    for (int i = 0; i < R; i++)
        for (int t = 0; t < TT; t++) s[i][t] = first ? _mm512_setzero_ps() : a[(size_t)i * AS + t];
    for (uint32_t g = 0; g < gn; g++) {
        __m512 xv[6];
        if (nx && (g & ((1u << sh) - 1)) == 0)
            for (int i = 0; i < RP; i++) __builtin_prefetch(nx[i] + 64 * (g >> sh), 0, PFL);
        for (int t = 0; t < TT; t++) xv[t] = _mm512_loadu_ps(xb + (size_t)t * xs + 16 * g);
        for (int i = 0; i < R; i++) {
            __m512 wv = w->pan[g][k0 + i];
            for (int t = 0; t < TT; t++) s[i][t] = _mm512_fmadd_ps(wv, xv[t], s[i][t]);
        }
    }
    for (int i = 0; i < R; i++)
        for (int t = 0; t < TT; t++) a[(size_t)i * AS + t] = s[i][t];
}

#define TILE_FN(R, TT) \
    static __attribute__((noinline)) void tile_##R##_##TT(const mm_work *w, int k0, const float *xb, size_t xs, \
                                                          __m512 *a, uint32_t gn, int first, \
                                                          const char *const *nx, int sh) \
    { tile(w, k0, R, TT, xb, xs, a, gn, first, nx, sh); }
TILE_FN(4, 6)
TILE_FN(4, 5)
TILE_FN(4, 4)
TILE_FN(4, 3)
TILE_FN(4, 2)
TILE_FN(4, 1)
#undef TILE_FN

/* Tokens of the next tile when rem are left: 6s and 5s wherever they cover rem
   (no small tile), then 4, 3, 2, 1. */
static uint32_t tile_tokens(uint32_t rem)
{
#define FS(n) ((n) == 0 || (n) == 5 || (n) == 6 || ((n) >= 10 && (n) <= 12) || ((n) >= 15 && (n) <= 18) || (n) >= 20)
    if (rem >= 6 && FS(rem - 6)) return 6;
    if (rem >= 5 && FS(rem - 5)) return 5;
#undef FS
    return rem >= 4 ? 4 : rem;
}

/* Every tile of panel p (block rows [RP p, RP p + RP)) and the chunk's tc tokens; the first
   PFT token tiles prefetch the next panel (pnx, sh as in tile's nx, sh). */
static void tiles(mm_work *w, int p, const float *xb, size_t xs, uint32_t tc, uint32_t gn, int first,
                  const char *const *pnx, int sh)
{
    int nt = 0;                                         /* token tiles so far */
    for (uint32_t t = 0, tt; t < tc; t += tt, nt++) {
        tt = tile_tokens(tc - t);
        const float *xt = xb + (size_t)t * xs;
        __m512 *a = &w->acc[RP * p][t];
        const char *const *nx = nt < PFT ? pnx : NULL;
        switch (tt) {
        case 6: for (int k = 0; k < RP; k += 4) tile_4_6(w, k, xt, xs, a + k * AS, gn, first, nx, sh); break;
        case 5: for (int k = 0; k < RP; k += 4) tile_4_5(w, k, xt, xs, a + k * AS, gn, first, nx, sh); break;
        case 4: for (int k = 0; k < RP; k += 4) tile_4_4(w, k, xt, xs, a + k * AS, gn, first, nx, sh); break;
        case 3: for (int k = 0; k < RP; k += 4) tile_4_3(w, k, xt, xs, a + k * AS, gn, first, nx, sh); break;
        case 2: for (int k = 0; k < RP; k += 4) tile_4_2(w, k, xt, xs, a + k * AS, gn, first, nx, sh); break;
        default: for (int k = 0; k < RP; k += 4) tile_4_1(w, k, xt, xs, a + k * AS, gn, first, nx, sh); break;
        }
    }
}

/* The fixed tree of kern.h over a slot-order sum; a BF16 row's tail (elements
   16 ng .. cols-1 of wr and xr, lane i % 16 each) is added first, in order. */
static float reduce(__m512 v, const uint16_t *wr, const float *xr, uint32_t i0, uint32_t cols)
{
    __m512 n = _mm512_permutexvar_ps(_mm512_load_si512(mm_ls), v);   /* canonical lanes */
    if (i0 < cols) {
        float l[16];
        _mm512_storeu_ps(l, n);
        for (uint32_t i = i0; i < cols; i++) {
            uint32_t b = (uint32_t)wr[i] << 16;
            float wf;
            memcpy(&wf, &b, 4);
            l[i % 16] = fmaf(wf, xr[i], l[i % 16]);
        }
        n = _mm512_loadu_ps(l);
    }
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(n), _mm512_extractf32x8_ps(n, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

/* The tree of 16 slot-order sums at once (v[k * vs], k < 16) into out[0..16): each level's
   additions are the tree's, pairs of sums side by side in one vector. After level 1 a
   128-bit lane holds a sum's a[0,2,4,6] or a[1,3,5,7]; after level 2 two sums' b[0,2] or
   b[1,3]; after level 3 four sums' c[0] or c[1]. */
static const int32_t mm_out[16] __attribute__((aligned(64))) = {   /* out[k] is f[mm_out[k]] */
    0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15 };
static void reduce16(const __m512 *v, size_t vs, float *out)
{
    __m512 a[8], b[4], c[2];
    for (int p = 0; p < 8; p++) {               /* a[j] = l[j] + l[j + 8]: slots s, s + 4 */
        __m512 u = v[2 * p * vs], w = v[(2 * p + 1) * vs];
        a[p] = _mm512_add_ps(_mm512_shuffle_f32x4(u, w, 0x88), _mm512_shuffle_f32x4(u, w, 0xDD));
    }
    for (int p = 0; p < 4; p++)                 /* b[j] = a[j] + a[j + 4] */
        b[p] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * p], a[2 * p + 1], 0x44),
                             _mm512_shuffle_ps(a[2 * p], a[2 * p + 1], 0xEE));
    for (int p = 0; p < 2; p++)                 /* c[j] = b[j] + b[j + 2] */
        c[p] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * p], b[2 * p + 1], 0x88),
                             _mm512_shuffle_ps(b[2 * p], b[2 * p + 1], 0xDD));
    __m512 f = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88),   /* y = c[0] + c[1] */
                             _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(_mm512_load_si512(mm_out), f));
}

void k3_mm512(const k3_mat *W, const float *x, size_t ldx, const float *xp, uint32_t T, float *y,
              size_t ldy, uint32_t r0, uint32_t r1)
{
    mm_work w_;                       /* 192 KiB of stack */
    mm_work *w = &w_;
    const uint32_t cols = W->cols, ng = cols / 16, xs = k3_xpack_cols(cols);
    const uint32_t nk = (ng + KG - 1) / KG;                      /* column chunks, as even as they come */
    const uint32_t kg = nk ? (ng / nk + 1) / 2 * 2 : 0;          /* groups per chunk (even: whole blocks) */
    void (*dec)(mm_work *, const k3_mat *, const uint32_t *, uint32_t, uint32_t) =
        W->enc == K3_ENC_BF16 ? dec_bf16 : W->enc == K3_ENC_Q8 ? dec_q8 : dec_mx;
    const int sh = W->enc == K3_ENC_BF16 ? 1 : W->enc == K3_ENC_Q8 ? 2 : 3;   /* 2^sh groups a line */
    for (uint32_t rb = r0; rb < r1; rb += MB) {
        uint32_t n = r1 - rb < MB ? r1 - rb : MB;
        int np = (int)((n + RP - 1) / RP);
        for (uint32_t i = 0; i < MB; i++) w->row[i] = rb + (i < n ? i : n - 1);
        for (uint32_t tc0 = 0; tc0 < T; tc0 += TC) {
            uint32_t tc = T - tc0 < TC ? T - tc0 : TC;
            for (uint32_t g0 = 0; g0 < ng; g0 += kg) {           /* ng >= 1: xp was packed */
                uint32_t gn = ng - g0 < kg ? ng - g0 : kg;
                const float *xb = xp + (size_t)tc0 * xs + 16 * g0;
                for (int p = 0; p < np; p++) {
                    const char *nx[RP];                         /* a panel PFD ahead: prefetched */
                    if (p + PFD < np) panel_rows(W, w->row + RP * (p + PFD), g0, nx);
                    else panel_rows(W, w->row + RP * (p + PFD - np), g0 + kg < ng ? g0 + kg : 0, nx);
                    dec(w, W, w->row + RP * p, g0, gn);
                    tiles(w, p, xb, xs, tc, gn, g0 == 0, nx, sh);
                }
            }
            uint32_t i16 = cols % 16 ? 0 : n / 16 * 16;       /* rows reduced 16 at a time */
            for (uint32_t t = 0; t < tc; t++)
                for (uint32_t i = 0; i < i16; i += 16)
                    reduce16(&w->acc[i][t], AS, y + (size_t)(tc0 + t) * ldy + rb + i);
            for (uint32_t i = i16; i < n; i++) {
                const uint16_t *wr = W->enc == K3_ENC_BF16 ? (const uint16_t *)W->data + (size_t)(rb + i) * cols : NULL;
                for (uint32_t t = 0; t < tc; t++) {
                    const float *xr = x + (size_t)(tc0 + t) * ldx;
                    y[(size_t)(tc0 + t) * ldy + rb + i] = reduce(w->acc[i][t], wr, xr, wr ? ng * 16 : cols, cols);
                }
            }
        }
    }
}

/* ---- a few tokens (T = 2..FT), in registers: no panel ----
 * R rows x T tokens of sums stay in registers over the whole row; each block of 32 columns
 * of a row is decoded in registers into the slot order (the panel's decode, two 16-groups at
 * once) and met at once by the T tokens' packed x, group g then g + 1: each sum still takes
 * its row's 16-groups in increasing order, so the bits are the panel kernel's. The weights
 * stream from memory once; nothing is stored between groups. */
#define FT 8              /* tokens at most */
#ifndef FT_PF
#define FT_PF 2048        /* bytes of a BF16 row prefetched ahead (half for MXFP4, Q8) */
#endif
#ifndef FT_PFL
#define FT_PFL 2          /* into L2 (prefetcht1): BF16 from memory at 3-4 tokens 0.42-0.47 of the
                             peak with 512 bytes into L1, 0.50-0.61 with 2 KiB into L2 */
#endif

/* Rows row[0..R) x tokens [0, T) into s[r * T + t] (slot-order sums). Two loop orders of the
   same additions: xo (x outer: the T tokens' x in 2 T registers, each row decoded and met by
   them) where T is small, and the tokens outer (the R rows' two decoded groups in 2 R
   registers, each token's x loaded and met by every row) where 2 T registers of x would leave
   room for too few rows. */
static inline __attribute__((always_inline)) void ft_body(int enc, const k3_mat *W, const float *xp, size_t xs,
                                                          int T, int R, int xo, const uint32_t *row, __m512 *s)
{
    const uint32_t ng = W->cols / 16;
    const size_t pf = enc == K3_ENC_BF16 ? FT_PF : FT_PF / 2;      /* bytes ahead */
    __m512 a[8][FT];                  /* [row][token] */
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) a[r][t] = _mm512_setzero_ps();
    uint32_t g = 0;
    for (; g + 2 <= ng; g += 2) {
        if (xo) {
            __m512 x0[FT], x1[FT];
            for (int t = 0; t < T; t++) {
                x0[t] = _mm512_loadu_ps(xp + (size_t)t * xs + 16 * g);
                x1[t] = _mm512_loadu_ps(xp + (size_t)t * xs + 16 * g + 16);
            }
            for (int r = 0; r < R; r++) {
                __m512 w0, w1;
                __builtin_prefetch(grp_ptr(enc, W, row[r], g) + pf, 0, FT_PFL);
                dec2(enc, W, row[r], g, &w0, &w1);
                for (int t = 0; t < T; t++) a[r][t] = _mm512_fmadd_ps(w0, x0[t], a[r][t]);
                for (int t = 0; t < T; t++) a[r][t] = _mm512_fmadd_ps(w1, x1[t], a[r][t]);
            }
        } else {
            __m512 w0[8], w1[8];
            for (int r = 0; r < R; r++) {
                __builtin_prefetch(grp_ptr(enc, W, row[r], g) + pf, 0, FT_PFL);
                dec2(enc, W, row[r], g, &w0[r], &w1[r]);
            }
            for (int t = 0; t < T; t++) {
                __m512 x0 = _mm512_loadu_ps(xp + (size_t)t * xs + 16 * g);
                __m512 x1 = _mm512_loadu_ps(xp + (size_t)t * xs + 16 * g + 16);
                for (int r = 0; r < R; r++) a[r][t] = _mm512_fmadd_ps(w0[r], x0, a[r][t]);
                for (int r = 0; r < R; r++) a[r][t] = _mm512_fmadd_ps(w1[r], x1, a[r][t]);
            }
        }
    }
    if (g < ng) {                     /* BF16: an odd last 16-group */
        for (int r = 0; r < R; r++) {
            __m512 w0 = dec1_bf16(W, row[r], g);
            for (int t = 0; t < T; t++)
                a[r][t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xp + (size_t)t * xs + 16 * g), a[r][t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) s[r * T + t] = a[r][t];
}

/* Rows per pass for T tokens, and the loop order: R x T sums and 2 T of x (x outer) or 2 R
   decoded weights and 2 of x (tokens outer) in the 32 registers. */
#ifndef FT_R
#define FT_R(T) ((T) == 2 ? 8 : (T) == 3 ? 6 : (T) == 4 ? 4 : (T) == 5 ? 4 : 3)
#endif
#ifndef FT_XO
#define FT_XO(T) ((T) <= 4)
#endif

#define FT_FN(ENC, T) \
    static __attribute__((noinline)) void ft_##ENC##_##T(const k3_mat *W, const float *xp, size_t xs, \
                                                         int R, const uint32_t *row, __m512 *s) \
    { if (R == FT_R(T)) ft_body(ENC, W, xp, xs, T, FT_R(T), FT_XO(T), row, s); \
      else for (int r = 0; r < R; r++) ft_body(ENC, W, xp, xs, T, 1, FT_XO(T), row + r, s + r * T); }
#define FT_FNS(ENC) FT_FN(ENC, 2) FT_FN(ENC, 3) FT_FN(ENC, 4) FT_FN(ENC, 5) FT_FN(ENC, 6) \
                    FT_FN(ENC, 7) FT_FN(ENC, 8)
FT_FNS(K3_ENC_BF16)
FT_FNS(K3_ENC_MXFP4)
FT_FNS(K3_ENC_Q8)

typedef void (*ft_fn)(const k3_mat *, const float *, size_t, int, const uint32_t *, __m512 *);
#define FT_ROW(ENC) { ft_##ENC##_2, ft_##ENC##_3, ft_##ENC##_4, ft_##ENC##_5, ft_##ENC##_6, ft_##ENC##_7, \
                     ft_##ENC##_8 }
static const ft_fn ft_fns[3][FT - 1] = { FT_ROW(K3_ENC_BF16), FT_ROW(K3_ENC_MXFP4), FT_ROW(K3_ENC_Q8) };

/* Tokens [0, T) (2..FT) of rows [r0, r1) of y; cols % 16 == 0. */
static void ft_part(const k3_mat *W, const float *xp, uint32_t T, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    const int e = W->enc == K3_ENC_BF16 ? 0 : W->enc == K3_ENC_MXFP4 ? 1 : 2;
    const ft_fn fn = ft_fns[e][T - 2];
    const int R = FT_R(T);
    const size_t xs = k3_xpack_cols(W->cols);
    __m512 s[(16 + 8) * FT];          /* [row][token] sums of the passes that make 16 rows or more */
    float out[16];
    for (uint32_t r = r0; r < r1;) {
        uint32_t row[16 + 8], n = 0;  /* their rows (a pass has 8 at most) */
        while (n < 16 && r < r1) {
            int k = r1 - r < (uint32_t)R ? (int)(r1 - r) : R;
            for (int i = 0; i < k; i++) row[n + i] = r + (uint32_t)i;
            fn(W, xp, xs, k, row + n, s + n * T);
            n += (uint32_t)k;
            r += (uint32_t)k;
        }
        for (uint32_t t = 0; t < T; t++) {
            uint32_t i = 0;
            for (; i + 16 <= n; i += 16) {
                reduce16(s + i * T + t, T, out);
                for (int k = 0; k < 16; k++) y[(size_t)t * ldy + row[i + k]] = out[k];
            }
            for (; i < n; i++) y[(size_t)t * ldy + row[i]] = reduce(s[i * T + t], NULL, NULL, W->cols, W->cols);
        }
    }
}

void k3_ft512(const k3_mat *W, const float *xp, uint32_t T, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    const size_t xs = k3_xpack_cols(W->cols);
    uint32_t parts = (T + FT - 1) / FT, t0 = 0;
    for (uint32_t i = 0; i < parts; i++) {              /* as even as they come (10: 5 + 5) */
        uint32_t tn = (T - t0) / (parts - i);
        ft_part(W, xp + t0 * xs, tn, y + (size_t)t0 * ldy, ldy, r0, r1);
        t0 += tn;
    }
}

/*
 * test_kernels.c - the matrix products of k3run/kern.h.
 *
 * 1. The scalar path against an independent implementation of the canonical
 *    order written here (and a double-precision dot as a sanity check).
 * 2. Every vector path the CPU has, bit for bit against the scalar path, for
 *    BF16, MXFP4 and Q8 (the compact trunk) weights, on random shapes (odd row counts, BF16 tails, panels and token chunks
 *    crossed), T = 1..9 and larger, random and extreme values. The AVX-512
 *    structure also runs on AVX2 (k3_kern_rows_avx2x2).
 * 3. Thread counts 1 and 2, a batch against T single-token calls, row ranges.
 * 4. k3_isa_choose and friends.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_shard.h"
#include "k3_test.h"
#include "kern.h"

/* ---- deterministic random numbers ---- */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint32_t rndn(uint32_t n) { return (uint32_t)(rnd() % n); }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* value kinds: 0 ordinary, 1 extreme (zeros, -0, subnormals, huge, inf, NaN mixed in),
 * 2 tiny (products underflow), 3 all -0 or tiny negative */
static float rnd_x(int kind)
{
    uint32_t c = rndn(100);
    if (kind == 2) return ldexpf((float)(rnd() % 1000 + 1) * (rnd() & 1 ? -1.0f : 1.0f), -140);
    if (kind == 3) return c < 50 ? -0.0f : -ldexpf((float)(rnd() % 100 + 1), -149 + 6);
    if (kind == 1) {
        if (c < 10) return 0.0f;
        if (c < 20) return -0.0f;
        if (c < 30) return u2f((uint32_t)(rnd() & 0x807fffffu));            /* subnormal */
        if (c < 35) return (rnd() & 1) ? 3.0e38f : -3.0e38f;
        if (c < 37) return (rnd() & 1) ? INFINITY : -INFINITY;
        if (c < 38) return NAN;
    }
    float v = (float)((int64_t)(rnd() % 2000001) - 1000000) / 1000000.0f;
    return ldexpf(v, (int)rndn(17) - 8);
}

static uint16_t rnd_bf16(int kind)
{
    uint32_t c = rndn(100);
    if (kind == 1) {
        if (c < 10) return 0x0000;
        if (c < 20) return 0x8000;                                            /* -0 */
        if (c < 30) return (uint16_t)(rnd() & 0x807f);                        /* subnormal */
        if (c < 38) return (rnd() & 1) ? 0x7f7f : 0xff7f;                     /* largest finite */
        if (c < 40) return (rnd() & 1) ? 0x7f80 : 0xff80;                     /* inf */
        if (c < 41) return 0x7fc0;                                            /* NaN */
    }
    if (kind == 2 || kind == 3) return (uint16_t)(0x0080 | (rnd() & 0x807f)); /* tiny normals */
    uint32_t u = f2u(rnd_x(0));
    return (uint16_t)(u >> 16);
}

static uint8_t rnd_scale(int kind)
{
    static const uint8_t special[] = { 0, 1, 2, 3, 209, 210, 211, 232, 233, 254, 255, 127 };
    if (kind == 1 && rndn(4) == 0) return special[rndn(sizeof special)];
    if (kind == 2 || kind == 3) return (uint8_t)rndn(4);                      /* 2^-127 .. 2^-124 */
    return (uint8_t)(112 + rndn(24));
}

/* A test matrix with its storage. */
typedef struct tmat {
    k3_mat m;
    void *data;         /* bf16 [rows][cols], MXFP4 uint8 [rows][cols/2] or Q8 int8 [rows][cols] */
    uint8_t *scales;    /* [rows][cols/32] or NULL */
} tmat;

static tmat make_mat(int enc, uint32_t rows, uint32_t cols, int kind)
{
    tmat t;
    memset(&t, 0, sizeof t);
    t.m.enc = enc;
    t.m.rows = rows;
    t.m.cols = cols;
    if (enc == K3_ENC_BF16) {
        uint16_t *d = malloc(((size_t)rows * cols + 1) * 2);
        REQUIRE(d);
        for (size_t i = 0; i < (size_t)rows * cols; i++) d[i] = rnd_bf16(kind);
        t.data = d;
    } else if (enc == K3_ENC_Q8) {
        int8_t *d = malloc((size_t)rows * cols + 1);
        uint8_t *s = malloc((size_t)rows * cols / 32 + 1);
        REQUIRE(d && s);
        for (size_t i = 0; i < (size_t)rows * cols; i++)     /* extreme: also -128, 0 and +-127 */
            d[i] = kind == 1 && rndn(3) == 0 ? (int8_t)(rndn(3) * 127 - 128 + (rndn(2) ? 0 : 1))
                                             : (int8_t)(uint8_t)rnd();
        for (size_t i = 0; i < (size_t)rows * cols / 32; i++) s[i] = rnd_scale(kind);
        t.data = d;
        t.scales = s;
    } else {
        uint8_t *d = malloc((size_t)rows * cols / 2 + 1), *s = malloc((size_t)rows * cols / 32 + 1);
        REQUIRE(d && s);
        for (size_t i = 0; i < (size_t)rows * cols / 2; i++) d[i] = (uint8_t)rnd();
        for (size_t i = 0; i < (size_t)rows * cols / 32; i++) s[i] = rnd_scale(kind);
        t.data = d;
        t.scales = s;
    }
    t.m.data = t.data;
    t.m.scales = t.scales;
    return t;
}

static void free_mat(tmat *t) { free(t->data); free(t->scales); }

/* ---- the independent reference: decode a whole row, then 16 lane sums and the tree ---- */
static const float e2m1_table[16] = { 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f };

static void ref_row(const k3_mat *W, uint32_t r, float *w)   /* w: [cols] */
{
    for (uint32_t i = 0; i < W->cols; i++) {
        if (W->enc == K3_ENC_BF16) {
            w[i] = u2f((uint32_t)((const uint16_t *)W->data)[(size_t)r * W->cols + i] << 16);
        } else if (W->enc == K3_ENC_Q8) {
            int8_t q = ((const int8_t *)W->data)[(size_t)r * W->cols + i];
            uint8_t s = W->scales[(size_t)r * W->cols / 32 + i / 32];
            volatile float v = (float)q;
            w[i] = v * (s == 255 ? NAN : ldexpf(1.0f, (int)s - 127));
        } else {
            uint8_t b = ((const uint8_t *)W->data)[(size_t)r * W->cols / 2 + i / 2];
            uint8_t s = W->scales[(size_t)r * W->cols / 32 + i / 32];
            float scale = s == 255 ? NAN : ldexpf(1.0f, (int)s - 127);
            volatile float v = e2m1_table[i & 1 ? b >> 4 : b & 15];
            w[i] = v * scale;
        }
    }
}

static float ref_dot(const float *w, const float *x, uint32_t n)
{
    float acc[16];
    for (int l = 0; l < 16; l++) {
        acc[l] = 0.0f;
        for (uint32_t i = (uint32_t)l; i < n; i += 16) acc[l] = fmaf(w[i], x[i], acc[l]);
    }
    float c0 = ((acc[0] + acc[8]) + (acc[4] + acc[12])) + ((acc[2] + acc[10]) + (acc[6] + acc[14]));
    float c1 = ((acc[1] + acc[9]) + (acc[5] + acc[13])) + ((acc[3] + acc[11]) + (acc[7] + acc[15]));
    return c0 + c1;
}

static int same_bits(float a, float b) { return f2u(a) == f2u(b) || (isnan(a) && isnan(b)); }

/* ---- one case: W [rows, cols], T tokens ---- */
typedef void (*rows_fn)(const k3_mat *, const float *, size_t, const float *, uint32_t, float *,
                        size_t, uint32_t, uint32_t);

static const char *kind_name[4] = { "random", "extreme", "tiny", "negative zero" };

static const char *enc_name(int enc)
{
    return enc == K3_ENC_BF16 ? "bf16" : enc == K3_ENC_Q8 ? "q8" : "mxfp4";
}

/* Compare got against want for all T x rows; one CHECK per call. */
static void compare(const char *what, const tmat *t, uint32_t T, int kind, const float *got,
                    const float *want, size_t ldy)
{
    size_t bad = 0;
    for (uint32_t tt = 0; tt < T; tt++)
        for (uint32_t r = 0; r < t->m.rows; r++) {
            float g = got[tt * ldy + r], w = want[tt * ldy + r];
            if (same_bits(g, w)) continue;
            if (bad++ < 3)
                fprintf(stderr, "%s: %s %ux%u T=%u (%s): y[%u][%u] = %a (0x%08x), expected %a (0x%08x)\n",
                        what, enc_name(t->m.enc), t->m.rows, t->m.cols, T,
                        kind_name[kind], tt, r, g, f2u(g), w, f2u(w));
        }
    CHECK_MSG(bad == 0, "%s: %zu of %zu outputs differ", what, bad, (size_t)T * t->m.rows);
}

static int isa_checked[K3_ISA__COUNT + 1];

static void run_case(int enc, uint32_t rows, uint32_t cols, uint32_t T, int kind)
{
    tmat t = make_mat(enc, rows, cols, kind);
    size_t ldx = cols + 3, ldy = rows + 2;
    float *x = malloc(T * ldx * 4 + 4), *want = malloc(T * ldy * 4 + 4), *got = malloc(T * ldy * 4 + 4);
    REQUIRE(x && want && got);
    for (size_t i = 0; i < T * ldx; i++) x[i] = (i % ldx >= cols) ? NAN : rnd_x(kind);  /* NaN padding */
    if (kind == 1 && T > 2) for (uint32_t i = 0; i < cols; i++) x[ldx + i] = 0.0f;         /* a zero token */
    for (size_t i = 0; i < T * ldy; i++) want[i] = got[i] = 1234.5f;                     /* padding */

    k3_kern_rows_scalar(&t.m, x, ldx, NULL, T, want, ldy, 0, rows);

    /* scalar against the independent reference and a double-precision dot */
    float *w = malloc((size_t)cols * 4 + 4);
    REQUIRE(w);
    size_t bad = 0, far = 0;
    for (uint32_t r = 0; r < rows; r++) {
        ref_row(&t.m, r, w);
        for (uint32_t tt = 0; tt < T; tt++) {
            const float *xt = x + tt * ldx;
            float ref = ref_dot(w, xt, cols), y = want[tt * ldy + r];
            if (!same_bits(ref, y) && bad++ < 3)
                fprintf(stderr, "scalar: %ux%u row %u token %u: %a, independent reference %a\n",
                        rows, cols, r, tt, y, ref);
            double s = 0, mag = 0;
            for (uint32_t i = 0; i < cols; i++) {
                s += (double)w[i] * xt[i];
                mag += fabs((double)w[i] * xt[i]);
            }
            double tol = ((double)cols / 16 + 6) * ldexp(1, -24) * mag + ldexp(1, -140);
            if (isfinite(mag) && isfinite(y) && fabs(y - s) > tol && far++ < 3)
                fprintf(stderr, "scalar: %ux%u row %u token %u: %a, double dot %a (tol %g)\n",
                        rows, cols, r, tt, y, s, tol);
        }
    }
    CHECK_MSG(bad == 0, "scalar vs independent reference: %zu differ", bad);
    CHECK_MSG(far == 0, "scalar vs double dot: %zu out of tolerance", far);
    for (uint32_t tt = 0; tt < T; tt++)
        for (size_t i = rows; i < ldy; i++) CHECK(want[tt * ldy + i] == 1234.5f);
    free(w);

    /* every vector path, and the AVX-512 structure on AVX2 */
    struct { const char *name; rows_fn fn; int ok; } paths[] = {
        { "avx2", k3_kern_rows_avx2, k3_isa_supported(K3_ISA_AVX2) },
        { "avx512", k3_kern_rows_avx512, k3_isa_supported(K3_ISA_AVX512) },
        { "avx2x2 (avx512 structure)", k3_kern_rows_avx2x2, k3_isa_supported(K3_ISA_AVX2) },
    };
    for (int p = 0; p < 3; p++) {
        if (!paths[p].ok) continue;
        isa_checked[p] = 1;
        for (size_t i = 0; i < T * ldy; i++) got[i] = 1234.5f;
        paths[p].fn(&t.m, x, ldx, NULL, T, got, ldy, 0, rows);
        compare(paths[p].name, &t, T, kind, got, want, ldy);
        for (uint32_t tt = 0; tt < T; tt++)
            for (size_t i = rows; i < ldy; i++) CHECK(got[tt * ldy + i] == 1234.5f);
        /* x packed once by the caller (k3_xpack), as the engine does for a batch */
        if (T >= 2 && cols >= 16) {
            float *xp = malloc((size_t)T * k3_xpack_cols(cols) * 4 + 4);    /* [T][cols/16*16] */
            REQUIRE(xp);
            CHECK(k3_xpack(p == 1 ? K3_ISA_AVX512 : K3_ISA_AVX2, x, ldx, T, cols, xp) == 1);
            for (size_t i = 0; i < T * ldy; i++) got[i] = 1234.5f;
            paths[p].fn(&t.m, x, ldx, xp, T, got, ldy, 0, rows);
            compare(paths[p].name, &t, T, kind, got, want, ldy);
            free(xp);
        }
        /* a sub-range of rows writes only those rows */
        if (rows > 2) {
            uint32_t r0 = 1, r1 = rows - 1;
            for (size_t i = 0; i < T * ldy; i++) got[i] = 1234.5f;
            paths[p].fn(&t.m, x, ldx, NULL, T, got, ldy, r0, r1);
            size_t wrong = 0;
            for (uint32_t tt = 0; tt < T; tt++)
                for (uint32_t r = 0; r < ldy; r++) {
                    float g = got[tt * ldy + r];
                    if (r >= r0 && r < r1 ? !same_bits(g, want[tt * ldy + r]) : g != 1234.5f) wrong++;
                }
            CHECK_MSG(wrong == 0, "%s rows [%u, %u) of %u: %zu wrong", paths[p].name, r0, r1, rows, wrong);
        }
    }
    free(x); free(want); free(got);
    free_mat(&t);
}

/* Every scale code with every element code (E2M1, or all 256 int8 codes for
 * Q8), against scalar, on every path. */
static void run_exhaustive(int enc)
{
    uint32_t rows = 256 + 3, cols = enc == K3_ENC_Q8 ? 256 : 64;
    tmat t = make_mat(enc, rows, cols, 0);
    uint8_t *d = t.data;
    for (uint32_t r = 0; r < rows; r++) {
        if (enc == K3_ENC_Q8)
            for (uint32_t j = 0; j < cols; j++) d[r * cols + j] = (uint8_t)(j * 37 + r);
        else
            for (uint32_t j = 0; j < cols / 2; j++)
                d[r * cols / 2 + j] = (uint8_t)((j + r) % 16 | (((j * 7 + r) % 16) << 4));
        for (uint32_t b = 0; b < cols / 32; b++) t.scales[r * cols / 32 + b] = (uint8_t)(r < 256 ? r : r * 31);
    }
    rows_fn fns[3] = { k3_kern_rows_avx2, k3_kern_rows_avx512, k3_kern_rows_avx2x2 };
    const char *names[3] = { "avx2", "avx512", "avx2x2 (avx512 structure)" };
    int ok[3] = { k3_isa_supported(K3_ISA_AVX2), k3_isa_supported(K3_ISA_AVX512),
                  k3_isa_supported(K3_ISA_AVX2) };
    /* mode 0-3: random x of that kind, T = 1 and 4; mode 4: the unit vectors as one
     * batch; mode 5: the same one token at a time (each output is then one weight) */
    for (int mode = 0; mode < 6; mode++)
        for (uint32_t T = mode < 4 ? 1 : cols; T <= (mode < 4 ? 4u : cols); T += 3) {
            size_t ldx = cols, ldy = rows;
            float *x = malloc(T * ldx * 4), *want = malloc(T * ldy * 4), *got = malloc(T * ldy * 4);
            REQUIRE(x && want && got);
            for (size_t i = 0; i < T * ldx; i++) x[i] = mode < 4 ? rnd_x(mode) : (i % ldx == i / ldx);
            k3_kern_rows_scalar(&t.m, x, ldx, NULL, T, want, ldy, 0, rows);
            for (int p = 0; p < 3; p++) {
                if (!ok[p]) continue;
                if (mode == 5)
                    for (uint32_t tt = 0; tt < T; tt++)
                        fns[p](&t.m, x + tt * ldx, ldx, NULL, 1, got + tt * ldy, ldy, 0, rows);
                else
                    fns[p](&t.m, x, ldx, NULL, T, got, ldy, 0, rows);
                compare(names[p], &t, T, mode < 4 ? mode : 0, got, want, ldy);
            }
            free(x); free(want); free(got);
        }
    free_mat(&t);
}

/* Lanes that end as -0 (products that underflow to -0) must stay -0 through a tail. */
static void run_negative_zero(void)
{
    for (uint32_t cols = 1; cols <= 40; cols++) {
        tmat t = make_mat(K3_ENC_BF16, 3, cols, 0);
        uint16_t *d = t.data;
        float x[48];
        for (uint32_t i = 0; i < 3 * cols; i++) d[i] = 0x0080;      /* 2^-126 */
        for (uint32_t i = 0; i < cols; i++) x[i] = -0x1p-30f;       /* products -2^-156 -> -0 */
        float want[3], got[3];
        k3_kern_rows_scalar(&t.m, x, cols, NULL, 1, want, 3, 0, 3);
        /* with fewer than 16 columns some lanes stay +0, and +0 + -0 = +0 */
        CHECK_MSG(f2u(want[0]) == (cols >= 16 ? 0x80000000u : 0), "cols %u: scalar gives %a", cols, want[0]);
        if (k3_isa_supported(K3_ISA_AVX2)) {
            k3_kern_rows_avx2(&t.m, x, cols, NULL, 1, got, 3, 0, 3);
            CHECK_F32_BITS(got[0], want[0]);
            k3_kern_rows_avx2x2(&t.m, x, cols, NULL, 1, got, 3, 0, 3);
            CHECK_F32_BITS(got[2], want[2]);
        }
        if (k3_isa_supported(K3_ISA_AVX512)) {
            k3_kern_rows_avx512(&t.m, x, cols, NULL, 1, got, 3, 0, 3);
            CHECK_F32_BITS(got[1], want[1]);
        }
        free_mat(&t);
    }
    /* MXFP4: -0 weights (code 8) on lanes that are -0: -0 + -0 = -0, but the fast
     * decode's +0 would give +0 + -0 = +0 (the zero-output check must catch it) */
    tmat t = make_mat(K3_ENC_MXFP4, 5, 64, 0);
    uint8_t *d = t.data;
    for (int i = 0; i < 5 * 32; i++) d[i] = i % 32 < 8 ? 0x99 : 0x88;  /* -0.5 x16, then -0 */
    for (int i = 0; i < 10; i++) t.scales[i] = 2;
    float x[3 * 64], want[3 * 5], got[3 * 5];
    for (int i = 0; i < 3 * 64; i++) x[i] = 0x1p-40f;             /* -0.5*2^-125*2^-40 -> -0 */
    for (uint32_t T = 1; T <= 3; T += 2) {                        /* matrix-vector and -matrix */
        k3_kern_rows_scalar(&t.m, x, 64, NULL, T, want, 5, 0, 5);
        CHECK_MSG(f2u(want[0]) == 0x80000000u, "mxfp4 -0 case: scalar gives %a", want[0]);
        rows_fn fns[3] = { k3_kern_rows_avx2, k3_kern_rows_avx2x2, k3_kern_rows_avx512 };
        int ok[3] = { k3_isa_supported(K3_ISA_AVX2), k3_isa_supported(K3_ISA_AVX2),
                      k3_isa_supported(K3_ISA_AVX512) };
        for (int p = 0; p < 3; p++) {
            if (!ok[p]) continue;
            fns[p](&t.m, x, 64, NULL, T, got, 5, 0, 5);
            for (uint32_t r = 0; r < 5 * T; r++) CHECK_F32_BITS(got[r], want[r]);
        }
    }
    free_mat(&t);
}

/* k3_matmul: thread counts, batches against single tokens, every ISA. */
static void run_threads(int enc, uint32_t rows, uint32_t cols, uint32_t T)
{
    tmat t = make_mat(enc, rows, cols, 0);
    size_t ldx = cols + 1, ldy = rows + 1;
    size_t ny = T * ldy;
    float *x = malloc(T * ldx * 4), *y1 = malloc(ny * 4), *y2 = malloc(ny * 4), *ys = malloc(ny * 4);
    REQUIRE(x && y1 && y2 && ys);
    for (size_t i = 0; i < T * ldx; i++) x[i] = rnd_x(0);
    for (int isa = 0; isa < K3_ISA__COUNT; isa++) {
        if (!k3_isa_supported((k3_isa)isa)) continue;
        omp_set_num_threads(1);
        k3_matmul((k3_isa)isa, &t.m, x, ldx, T, y1, ldy);
        omp_set_num_threads(2);
        k3_matmul((k3_isa)isa, &t.m, x, ldx, T, y2, ldy);
        for (uint32_t tt = 0; tt < T; tt++)                      /* T separate single-token calls */
            k3_matmul((k3_isa)isa, &t.m, x + tt * ldx, ldx, 1, ys + tt * ldy, ldy);
        float *xp = malloc((size_t)T * k3_xpack_cols(cols) * 4 + 4), *yp = malloc(ny * 4);  /* [T][cols/16*16] */
        REQUIRE(xp && yp);
        int packed = k3_xpack((k3_isa)isa, x, ldx, T, cols, xp);  /* packed once, as the engine does */
        CHECK(packed == k3_xpack_used((k3_isa)isa, cols));
        k3_matmul_xp((k3_isa)isa, &t.m, x, ldx, packed ? xp : NULL, T, yp, ldy);
        size_t dp = 0;
        for (uint32_t tt = 0; tt < T; tt++)
            for (uint32_t r = 0; r < rows; r++) dp += !same_bits(y1[tt * ldy + r], yp[tt * ldy + r]);
        CHECK_MSG(dp == 0, "%s %ux%u T=%u: x packed once and not differ in %zu outputs", k3_isa_name((k3_isa)isa),
                  rows, cols, T, dp);
        free(xp);
        free(yp);
        size_t d12 = 0, d1s = 0;
        for (uint32_t tt = 0; tt < T; tt++)
            for (uint32_t r = 0; r < rows; r++) {
                d12 += !same_bits(y1[tt * ldy + r], y2[tt * ldy + r]);
                d1s += !same_bits(y1[tt * ldy + r], ys[tt * ldy + r]);
            }
        CHECK_MSG(d12 == 0, "%s %ux%u T=%u: 1 and 2 threads differ in %zu outputs", k3_isa_name((k3_isa)isa),
                  rows, cols, T, d12);
        CHECK_MSG(d1s == 0, "%s %ux%u T=%u: batch and single tokens differ in %zu outputs",
                  k3_isa_name((k3_isa)isa), rows, cols, T, d1s);
        if (isa == K3_ISA_SCALAR) memcpy(ys, y1, ny * 4);
        else {
            float *yr = malloc(ny * 4);
            REQUIRE(yr);
            k3_matmul(K3_ISA_SCALAR, &t.m, x, ldx, T, yr, ldy);
            size_t dr = 0;
            for (uint32_t tt = 0; tt < T; tt++)
                for (uint32_t r = 0; r < rows; r++) dr += !same_bits(y1[tt * ldy + r], yr[tt * ldy + r]);
            CHECK_MSG(dr == 0, "%s k3_matmul vs scalar: %zu differ", k3_isa_name((k3_isa)isa), dr);
            free(yr);
        }
    }
    free(x); free(y1); free(y2); free(ys);
    free_mat(&t);
}

static void test_isa(void)
{
    k3_isa isa;
    k3_diag d;
    CHECK_STR(k3_isa_name(K3_ISA_SCALAR), "scalar");
    CHECK_STR(k3_isa_name(K3_ISA_AVX2), "avx2");
    CHECK_STR(k3_isa_name(K3_ISA_AVX512), "avx512");
    CHECK(k3_isa_supported(K3_ISA_SCALAR));
    CHECK(k3_isa_supported(k3_isa_best()));
    CHECK(k3_isa_choose(NULL, &isa, &d) == K3_OK && isa == k3_isa_best());
    CHECK(k3_isa_choose("", &isa, &d) == K3_OK && isa == k3_isa_best());
    CHECK(k3_isa_choose("scalar", &isa, &d) == K3_OK && isa == K3_ISA_SCALAR);
    memset(&d, 0, sizeof d);
    CHECK(k3_isa_choose("sse9", &isa, &d) == K3_ERR_USAGE);
    CHECK(strstr(d.msg, "sse9") && strstr(d.msg, "unknown") && strstr(d.msg, "scalar"));
    printf("unknown: %s\n", d.msg);
    for (int i = 1; i < K3_ISA__COUNT; i++) {
        const char *name = k3_isa_name((k3_isa)i);
        memset(&d, 0, sizeof d);
        k3_err e = k3_isa_choose(name, &isa, &d);
        if (k3_isa_supported((k3_isa)i)) {
            CHECK(e == K3_OK && isa == (k3_isa)i);
        } else {
            CHECK(e == K3_ERR_USAGE);
            CHECK(strstr(d.msg, name) && strstr(d.msg, "lacks") && strstr(d.msg, "scalar"));
            if (k3_isa_supported(K3_ISA_AVX2)) CHECK(strstr(d.msg, "avx2") != NULL);
            printf("forcing %s: %s\n", name, d.msg);
        }
    }
}

int main(void)
{
    test_isa();
    static const uint32_t bf_cols[] = { 1, 2, 15, 16, 17, 31, 33, 48, 100, 513, 1000, 1100 };
    static const uint32_t mx_cols[] = { 32, 64, 96, 160, 512, 544, 1056 };
    static const uint32_t row_counts[] = { 1, 2, 3, 5, 7, 8, 9, 13, 17, 33 };
    static const uint32_t tokens[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 64, 65, 70 };
    int n = 0;
    for (int kind = 0; kind < 4; kind++) {
        for (size_t c = 0; c < sizeof bf_cols / sizeof *bf_cols; c++, n++)
            run_case(K3_ENC_BF16, row_counts[n % 10], bf_cols[c], tokens[n % 14], kind);
        for (size_t c = 0; c < sizeof mx_cols / sizeof *mx_cols; c++, n++)
            run_case(K3_ENC_MXFP4, row_counts[n % 10], mx_cols[c], tokens[n % 14], kind);
    }
    /* every token count 1-20, 31, 33, 64 and 129 (the register tiles of 3 or 6 tokens and their
       remainders of 1, 2 and 4, chunks of 32 tokens crossed), odd rows, all three encodings,
       columns within one panel and across two (1024 columns each, with a BF16 tail) */
    static const uint32_t sweep[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                                      31, 33, 64, 129 };
    for (size_t i = 0; i < sizeof sweep / sizeof *sweep; i++) {
        uint32_t T = sweep[i];
        run_case(K3_ENC_BF16, 11, 37, T, 1);
        run_case(K3_ENC_MXFP4, 11, 96, T, 1);
        run_case(K3_ENC_Q8, 11, 96, T, 1);
        run_case(K3_ENC_BF16, 37, 1041, T, (int)(i % 4));
        run_case(K3_ENC_MXFP4, 37, 1088, T, (int)(i % 4));
        run_case(K3_ENC_Q8, 37, 1088, T, (int)(i % 4));
    }
    /* the BF16 register kernel of 2-16 tokens (kern_simd.h ft): BF16, x packed by the caller and
       columns a multiple of 16 (the widths above have a tail and never reach it): every T it
       takes, rows that fill its passes of 1-3 row vectors and leave each remainder, within one
       panel's width and across several */
    for (uint32_t T = 2; T <= 17; T++) {
        run_case(K3_ENC_BF16, 13, 48, T, (int)(T % 4));
        run_case(K3_ENC_BF16, 37, 1024, T, 1);
        run_case(K3_ENC_BF16, 6 + T % 7, 2064, T, 0);
    }
    for (int i = 0; i < 150; i++) {               /* random shapes */
        int enc = i % 2 ? K3_ENC_MXFP4 : K3_ENC_BF16;
        uint32_t cols = enc == K3_ENC_BF16 ? 1 + rndn(700) : 32 * (1 + rndn(24));
        run_case(enc, 1 + rndn(45), cols, 1 + rndn(i % 5 ? 12 : 40), (int)rndn(4));
    }
    run_case(K3_ENC_BF16, 9, 1100, 131, 0);      /* 3 panels, 3 token chunks, a tail */
    run_case(K3_ENC_MXFP4, 9, 1056, 131, 1);
    /* K3's expert widths (down: 3072, gate/up: 7168) one token at a time, and a row
     * wider than the AVX-512 MXFP4 kernel's packed x (16384), which takes kern_simd.h */
    for (int kind = 0; kind < 4; kind++) {
        run_case(K3_ENC_MXFP4, 13, 3072, 1, kind);
        run_case(K3_ENC_MXFP4, 6, 7168, 1, kind);
    }
    run_case(K3_ENC_MXFP4, 5, 16416, 1, 0);
    /* Q8 (the compact trunk): every kind and token count, K3's trunk widths */
    static const uint32_t q8_cols[] = { 32, 64, 96, 512, 544, 1056, 7168 };
    for (int kind = 0; kind < 4; kind++)
        for (size_t c = 0; c < sizeof q8_cols / sizeof *q8_cols; c++, n++)
            run_case(K3_ENC_Q8, row_counts[n % 10], q8_cols[c], q8_cols[c] > 2000 ? 1 + (uint32_t)n % 3 : tokens[n % 14],
                     kind);
    for (int i = 0; i < 60; i++) run_case(K3_ENC_Q8, 1 + rndn(45), 32 * (1 + rndn(24)), 1 + rndn(i % 5 ? 12 : 40),
                                          (int)rndn(4));
    run_case(K3_ENC_Q8, 9, 1056, 131, 1);
    /* the AVX-512 panel kernel (kern_mm512.c) across its column chunks of up to 4096 (7168: two of
       3584; BF16 4112: 128 + 128 + 1 groups, the last odd; 8224: three) and its token chunks of
       64, rows below 16 and across 16 (its tree of 16 sums); its register kernel at K3's widths */
    static const uint32_t wide_T[] = { 2, 5, 9, 10, 16, 65 };
    for (size_t i = 0; i < sizeof wide_T / sizeof *wide_T; i++) {
        uint32_t T = wide_T[i];
        run_case(K3_ENC_BF16, 7, 4112, T, (int)(i % 4));
        run_case(K3_ENC_BF16, 5, 7168, T, 1);
        run_case(K3_ENC_MXFP4, 7, 8224, T, (int)(i % 4));
        run_case(K3_ENC_MXFP4, 5, 7168, T, 1);
        run_case(K3_ENC_Q8, 7, 8224, T, (int)((i + 1) % 4));
    }
    run_case(K3_ENC_MXFP4, 37, 7168, 16, 0);
    run_case(K3_ENC_BF16, 37, 4112, 12, 1);
    run_exhaustive(K3_ENC_MXFP4);
    run_exhaustive(K3_ENC_Q8);
    run_negative_zero();
    /* large enough for k3_matmul to use the threads (rows * cols * T >= 65536) */
    run_threads(K3_ENC_BF16, 300, 250, 1);
    run_threads(K3_ENC_BF16, 133, 77, 9);
    run_threads(K3_ENC_BF16, 133, 1041, 20);
    run_threads(K3_ENC_BF16, 133, 1024, 6);       /* the BF16 register kernel, rows split over threads */
    run_threads(K3_ENC_BF16, 101, 512, 16);
    run_threads(K3_ENC_MXFP4, 75, 1088, 31);
    run_threads(K3_ENC_Q8, 75, 1088, 129);
    run_threads(K3_ENC_MXFP4, 300, 256, 1);
    run_threads(K3_ENC_MXFP4, 133, 128, 7);
    run_threads(K3_ENC_Q8, 300, 256, 1);
    run_threads(K3_ENC_Q8, 133, 128, 7);
    if (!isa_checked[0]) printf("skip: avx2 (this CPU lacks it)\n");
    if (!isa_checked[1]) printf("skip: avx512 (this CPU lacks it)\n");
    if (isa_checked[2]) printf("checked: the avx512 kernel structure on avx2 (k3_kern_rows_avx2x2)\n");
    return k3_test_done();
}

/*
 * test_math.c - the array forms of k3_math.h (math_avx2.c, math_avx512.c where the
 * CPU has AVX-512) give every element
 * the bits of the scalar functions, on random bit patterns of the whole fp32
 * range and on both sides of every branch of exp, tanh and SiTU (the
 * thresholds 710 / -746 of exp, 0.5 / 1e-4 / 20 of tanh, the 2^+-1000 scaling
 * of exp), with NaN, infinities, zeros and subnormals. Skipped (as passed,
 * with a note) where the CPU lacks AVX2.
 */
#include "k3_test.h"

#include <float.h>
#include <stdint.h>

#include "k3_math.h"
#include "kern.h"

static uint64_t state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    state ^= state << 13; state ^= state >> 7; state ^= state << 17;
    return (uint32_t)(state >> 16);
}
static float bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

#define N (1u << 20)
static float g[N], u[N], a[N], b[N];

static int same(float x, float y) { return !memcmp(&x, &y, 4) || (isnan(x) && isnan(y)); }

/* Compare the forms of path isa against the scalar loops on g[0..n), u[0..n). */
static void compare_isa(int isa, size_t n, const char *what)
{
    int bad = 0;
    /* situ, K3's betas and others */
    const float betas[3][2] = { { 4.0f, 25.0f }, { 1.0f, 1.0f }, { 0.37f, 1000.0f } };
    for (int k = 0; k < 3; k++) {
        memcpy(a, g, n * 4); memcpy(b, g, n * 4);
        k3_situ_n(isa, a, u, n, betas[k][0], betas[k][1]);
        k3_situ_n(K3_ISA_SCALAR, b, u, n, betas[k][0], betas[k][1]);
        for (size_t i = 0; i < n; i++)
            if (!same(a[i], b[i]) && bad++ < 5)
                fprintf(stderr, "%s: situ(%a, %a; %g, %g) = %a, scalar %a\n", what, g[i], u[i], betas[k][0],
                        betas[k][1], a[i], b[i]);
    }
    memcpy(a, g, n * 4); memcpy(b, g, n * 4);
    k3_silu_mul_n(isa, a, u, n);
    k3_silu_mul_n(K3_ISA_SCALAR, b, u, n);
    for (size_t i = 0; i < n; i++)
        if (!same(a[i], b[i]) && bad++ < 10) fprintf(stderr, "%s: silu(%a) * %a = %a, scalar %a\n", what, g[i], u[i], a[i], b[i]);
    memcpy(a, g, n * 4); memcpy(b, g, n * 4);
    k3_sigmoid_n(isa, a, n);
    k3_sigmoid_n(K3_ISA_SCALAR, b, n);
    for (size_t i = 0; i < n; i++)
        if (!same(a[i], b[i]) && bad++ < 15) fprintf(stderr, "%s: sigmoid(%a) = %a, scalar %a\n", what, g[i], a[i], b[i]);
    memcpy(a, g, n * 4); memcpy(b, g, n * 4);
    k3_exp_n(isa, a, n);
    k3_exp_n(K3_ISA_SCALAR, b, n);
    for (size_t i = 0; i < n; i++)
        if (!same(a[i], b[i]) && bad++ < 20) fprintf(stderr, "%s: exp(%a) = %a, scalar %a\n", what, g[i], a[i], b[i]);
    CHECK_MSG(bad == 0, "%s: %d elements differ", what, bad);
}

/* Every vector path the CPU has (avx512: math_avx512.c, eight doubles at a time). */
static void compare(size_t n, const char *what)
{
    compare_isa(K3_ISA_AVX2, n, what);
    if (k3_isa_supported(K3_ISA_AVX512)) compare_isa(K3_ISA_AVX512, n, what);
}

int main(void)
{
    if (!k3_isa_supported(K3_ISA_AVX2)) {
        printf("skipped: this CPU lacks AVX2 (the array forms run the scalar loops)\n");
        return 0;
    }
    /* 1. random bit patterns: every exponent, NaNs and infinities included */
    for (size_t i = 0; i < N; i++) { g[i] = bits(rnd() << 16 ^ rnd()); u[i] = bits(rnd() << 16 ^ rnd()); }
    compare(N, "random bits");
    /* 2. the values activations see: |x| < 64, dense */
    for (size_t i = 0; i < N; i++) {
        g[i] = ((float)(rnd() % 2000001) - 1000000.0f) * 6.4e-5f;
        u[i] = ((float)(rnd() % 2000001) - 1000000.0f) * 6.4e-4f;
    }
    compare(N, "activations");
    /* 3. both sides of every threshold, in ulps: tanh's 0.5, 1e-4, 20 (scaled by the betas
       4, 25, 1, 0.37 and 1000), exp's 710 and -746, the 2^+-1000 scaling (x = +-1000 ln 2), zero */
    static const float edges[] = { 0.5f, 1e-4f, 20.0f, 2.0f, 4e-4f, 80.0f, 12.5f, 2.5e-3f, 500.0f, 0.185f,
                                   3.7e-5f, 7.4f, 0.0185f, 0.1f, 500.0f, 710.0f, 746.0f, 693.147f, 694.0f, 0.0f,
                                   FLT_MIN, 1e-38f, 1.4e-45f, 88.7f, 103.9f, 1.0f };
    size_t n = 0;
    for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++)
        for (int sgn = 0; sgn < 2; sgn++) {
            float x = sgn ? -edges[e] : edges[e];
            for (int k = 0; k < 2000 && n + 2 < N; k++) {
                g[n] = x; u[n] = -x; n++;
                x = nextafterf(x, sgn ? -INFINITY : INFINITY);
            }
            x = sgn ? -edges[e] : edges[e];
            for (int k = 0; k < 2000 && n + 2 < N; k++) {
                x = nextafterf(x, 0.0f);
                g[n] = x; u[n] = x; n++;
            }
        }
    const float special[] = { NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, FLT_MAX, -FLT_MAX, FLT_MIN, -FLT_MIN };
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        for (size_t j = 0; j < sizeof special / sizeof special[0]; j++) { g[n] = special[i]; u[n] = special[j]; n++; }
    compare(n, "edges");
    /* 4. lengths that leave a tail of 1, 2, 3 elements after the vectors */
    for (size_t len = 1; len < 20; len++) compare(len, "short");
    return k3_test_done();
}

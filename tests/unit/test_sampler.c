/*
 * test_sampler.c - the sampler (PCG32 against the published reference
 * values, greedy ties, NaN, top-k/top-p/min-p, repetition penalty, the
 * distribution of draws), the engine's math functions against libm in
 * double, and the UTF-8 streaming writer of generate.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generate.h"
#include "k3_math.h"
#include "k3_test.h"
#include "sampler.h"

static k3_sampler mk(float temp, uint32_t top_k, float top_p, float min_p, float rep, uint64_t seed, uint32_t n)
{
    k3_sampler s;
    k3_sampler_opts o = {temp, top_k, top_p, min_p, rep, seed};
    k3_diag d;
    REQUIRE(k3_sampler_init(&s, &o, n, &d) == K3_OK);
    return s;
}

static void test_pcg32(void)
{
    /* pcg32_srandom_r(42, 54): the first outputs printed by pcg-c-basic's pcg32-demo */
    static const uint32_t want[6] = {0xa15c02b7u, 0x7b47f409u, 0xba1d3330u, 0x83d2f293u, 0xbfa4784bu, 0xcbed606eu};
    k3_sampler s = mk(1, 0, 1, 0, 1, 0, 4);
    k3_sampler_seed(&s, 42, 54);
    for (int i = 0; i < 6; i++) CHECK_EQ_U64(k3_sampler_u32(&s), want[i]);
    for (int i = 0; i < 1000; i++) {
        double u = k3_sampler_uniform(&s);
        CHECK(u >= 0.0 && u < 1.0);
    }
    k3_sampler_free(&s);
}

static void test_greedy(void)
{
    float l[6] = {1, 3, -2, 3, NAN, 2.5f};
    k3_sampler s = mk(0, 0, 1, 0, 1, 0, 6);
    CHECK(k3_sampler_next(&s, l) == 1);                  /* lowest id among equal maxima */
    float nan_only[6] = {NAN, NAN, -INFINITY, NAN, -INFINITY, NAN};
    CHECK(k3_sampler_next(&s, nan_only) == 0);           /* all -inf: id 0, never out of range */
    k3_sampler_free(&s);
    /* repetition penalty: 3 divided by 2 falls below 2.5 */
    s = mk(0, 0, 1, 0, 2.0f, 0, 6);
    k3_sampler_accept(&s, 1);
    k3_sampler_accept(&s, 3);
    CHECK(k3_sampler_next(&s, l) == 5);
    k3_sampler_free(&s);
    float neg[3] = {-1, -1.5f, -3};
    s = mk(0, 0, 1, 0, 2.0f, 0, 3);
    k3_sampler_accept(&s, 0);
    CHECK(k3_sampler_next(&s, neg) == 1);                /* -1 * 2 = -2 < -1.5 */
    k3_sampler_free(&s);
}

static void test_filters(void)
{
    float l[5] = {2.0f, 1.0f, 0.0f, -1.0f, 5.0f};
    /* top-k 1 and tiny top-p are greedy whatever the seed */
    for (uint64_t seed = 0; seed < 50; seed++) {
        k3_sampler a = mk(1.5f, 1, 1, 0, 1, seed, 5), b = mk(1.5f, 0, 0.01f, 0, 1, seed, 5);
        CHECK(k3_sampler_next(&a, l) == 4);
        CHECK(k3_sampler_next(&b, l) == 4);
        k3_sampler_free(&a);
        k3_sampler_free(&b);
    }
    /* min-p 0.2 at temp 1: p(2)/p(4) = e^-3 = 0.05 < 0.2, so only id 4 survives */
    k3_sampler c = mk(1, 0, 1, 0.2f, 1, 3, 5);
    for (int i = 0; i < 100; i++) CHECK(k3_sampler_next(&c, l) == 4);
    k3_sampler_free(&c);
    /* top-k 2 draws only ids 4 and 0 */
    k3_sampler t = mk(3, 2, 1, 0, 1, 5, 5);
    int seen[5] = {0};
    for (int i = 0; i < 2000; i++) seen[k3_sampler_next(&t, l)]++;
    CHECK(seen[1] == 0 && seen[2] == 0 && seen[3] == 0 && seen[0] > 0 && seen[4] > 0);
    k3_sampler_free(&t);
}

static void test_distribution(void)
{
    /* three tokens with probabilities 0.5, 0.3, 0.2 at temp 1: frequencies over 100k draws
       within 5 standard deviations */
    float l[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    double p[3] = {0.5, 0.3, 0.2};
    k3_sampler s = mk(1, 0, 1, 0, 1, 1234, 3);
    int n = 100000, cnt[3] = {0};
    for (int i = 0; i < n; i++) cnt[k3_sampler_next(&s, l)]++;
    for (int j = 0; j < 3; j++) {
        double sd = sqrt(n * p[j] * (1 - p[j]));
        CHECK_MSG(fabs(cnt[j] - n * p[j]) < 5 * sd, "token %d drawn %d times, expected %.0f", j, cnt[j], n * p[j]);
    }
    k3_sampler_free(&s);
    /* same seed, same draws; different seeds differ */
    k3_sampler a = mk(1, 0, 1, 0, 1, 9, 3), b = mk(1, 0, 1, 0, 1, 9, 3), c = mk(1, 0, 1, 0, 1, 10, 3);
    int same = 1, diff = 0;
    for (int i = 0; i < 200; i++) {
        int x = k3_sampler_next(&a, l), y = k3_sampler_next(&b, l), z = k3_sampler_next(&c, l);
        same &= x == y;
        diff |= x != z;
    }
    CHECK(same && diff);
    k3_sampler_free(&a);
    k3_sampler_free(&b);
    k3_sampler_free(&c);
}

static void test_option_checks(void)
{
    k3_diag d;
    k3_sampler_opts ok = {0.7f, 40, 0.9f, 0.05f, 1.1f, 1};
    CHECK(k3_sampler_check(&ok, &d) == K3_OK);
    k3_sampler_opts bad[] = {{-0.1f, 0, 1, 0, 1, 0}, {NAN, 0, 1, 0, 1, 0}, {1, 0, 0, 0, 1, 0},
                             {1, 0, 1.01f, 0, 1, 0}, {1, 0, 1, 1, 1, 0}, {1, 0, 1, -0.1f, 1, 0},
                             {1, 0, 1, 0, 0, 0}, {1, 0, 1, 0, INFINITY, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(k3_sampler_check(&bad[i], &d) == K3_ERR_USAGE);
        CHECK(strstr(d.msg, "--") != NULL);
    }
}

/* k3_math against libm in double: within 2 fp32 ulps (they are evaluated in double) */
static int close_f(float got, double want)
{
    if (isnan(want)) return isnan(got);
    if (isinf((float)want)) return got == (float)want;       /* beyond fp32: +-inf is the right answer */
    double ulp = fabs(want) < 1.17549435e-38 ? 1.4e-45 : fabs(want) * 1.2e-7;
    return fabs(got - want) <= 2 * ulp;
}

static void test_math(void)
{
    for (int i = 0; i <= 20000; i++) {
        float x = -100.0f + i * 0.01f;
        CHECK_MSG(close_f(k3_expf(x), exp((double)x)), "exp(%g) = %g", x, k3_expf(x));
        CHECK_MSG(close_f(k3_sigmoidf(x), 1.0 / (1.0 + exp(-(double)x))), "sigmoid(%g)", x);
        CHECK_MSG(close_f(k3_tanhf(x), tanh((double)x)), "tanh(%g) = %.9g", x, k3_tanhf(x));
        CHECK_MSG(close_f(k3_siluf(x), x / (1.0 + exp(-(double)x))), "silu(%g)", x);
        if (x > 0) CHECK_MSG(close_f(k3_logf(x), log((double)x)), "log(%g)", x);
        double sp = x > 20 ? x : log1p(exp((double)x));
        CHECK_MSG(close_f(k3_softplusf(x), sp), "softplus(%g)", x);
        double g = x, u = x * 0.7;
        double situ = (4.0 * tanh(g / 4.0) / (1.0 + exp(-g))) * (25.0 * tanh(u / 25.0));
        CHECK_MSG(close_f(k3_situf(x, (float)(x * 0.7), 4, 25), situ), "situ(%g)", x);
    }
    float tiny[] = {1e-30f, -1e-30f, 1e-7f, 1e-4f, 0.0f, -0.0f, 1e-40f};
    for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++) {
        CHECK(close_f(k3_tanhf(tiny[i]), tanh((double)tiny[i])));
        CHECK(close_f(k3_expf(tiny[i]), exp((double)tiny[i])));
    }
    CHECK(k3_expf(-200.0f) == 0.0f && isinf(k3_expf(200.0f)) && isnan(k3_expf(NAN)));
    CHECK(k3_sigmoidf(-INFINITY) == 0.0f && k3_sigmoidf(INFINITY) == 1.0f);
    CHECK(k3_tanhf(INFINITY) == 1.0f && k3_tanhf(-INFINITY) == -1.0f);
    CHECK(close_f(k3_expf(88.7f), exp((double)88.7f)) && close_f(k3_expf(-103.0f), exp(-103.0)));   /* near overflow, subnormal */
}

static void test_utf8_writer(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    k3_utf8_out o = {.f = f};
    /* "é" (C3 A9) split across two tokens: nothing written until it is complete */
    k3_utf8_out_put(&o, (const uint8_t *)"a\xC3", 2);
    CHECK(o.written == 1);
    k3_utf8_out_put(&o, (const uint8_t *)"\xA9", 1);
    CHECK(o.written == 3);
    /* a lead byte followed by a non-continuation: written as it is, at once */
    k3_utf8_out_put(&o, (const uint8_t *)"\xE2", 1);
    CHECK(o.written == 3);
    k3_utf8_out_put(&o, (const uint8_t *)"x", 1);
    CHECK(o.written == 5);
    /* surrogate range (ED A0) can never be valid */
    k3_utf8_out_put(&o, (const uint8_t *)"\xED\xA0\x80", 3);
    CHECK(o.written == 8);
    k3_utf8_out_put(&o, (const uint8_t *)"\xF0\x9F", 2);       /* incomplete at the end: flushed raw */
    k3_utf8_out_flush(&o);
    fclose(f);
    CHECK(len == 10 && !memcmp(buf, "a\xC3\xA9\xE2x\xED\xA0\x80\xF0\x9F", 10));
    free(buf);
    /* random byte strings cut at random points: the output is always the concatenation */
    srand(7);
    for (int iter = 0; iter < 2000; iter++) {
        uint8_t in[64];
        int n = rand() % 64;
        for (int i = 0; i < n; i++) in[i] = (uint8_t)(rand() % 4 ? 0x80 + rand() % 0x78 : rand() % 256);
        buf = NULL;
        len = 0;
        f = open_memstream(&buf, &len);
        k3_utf8_out w = {.f = f};
        for (int i = 0; i < n;) {
            int k = 1 + rand() % 5;
            if (i + k > n) k = n - i;
            k3_utf8_out_put(&w, in + i, (size_t)k);
            i += k;
        }
        k3_utf8_out_flush(&w);
        fclose(f);
        CHECK(len == (size_t)n && (n == 0 || !memcmp(buf, in, (size_t)n)));
        free(buf);
    }
}

int main(void)
{
    test_pcg32();
    test_greedy();
    test_filters();
    test_distribution();
    test_option_checks();
    test_math();
    test_utf8_writer();
    return k3_test_done();
}

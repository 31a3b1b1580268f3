/* k3_math.c - see k3_math.h. */
#include "k3_math.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/*
 * e^x for double x: x = n*ln2 + r with |r| <= ln2/2 (ln2 split in two parts,
 * so r is exact to ~2^-60), e^r by its Taylor series to r^10 (truncation
 * < 3e-13 relative, far below fp32's 6e-8), then multiplied by 2^n built
 * from its bits (two factors when 2^n alone is outside the normal range).
 * Only IEEE double +, * and exact power-of-two scaling: the same bits on
 * every x86-64 machine and libm.
 */
static double pow2i(int n)                      /* 2^n for -1022 <= n <= 1023 */
{
    uint64_t b = (uint64_t)(n + 1023) << 52;
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static double exp_d(double x)
{
    if (x != x) return x;
    if (x > 710.0) return INFINITY;
    if (x < -746.0) return 0.0;
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    double n = nearbyint(x * 1.44269504088896338700e+00);
    double r = (x - n * ln2_hi) - n * ln2_lo;
    static const double inv_fact[10] = {
        1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0};
    double p = 1.0 / 3628800.0;                     /* 1/10! */
    for (int i = 0; i < 10; i++) p = p * r + inv_fact[i];
    int k = (int)n;
    if (k > 1000) return p * pow2i(1000) * pow2i(k - 1000);
    if (k < -1000) return p * pow2i(-1000) * pow2i(k + 1000);
    return p * pow2i(k);
}

float k3_expf(float x) { return (float)exp_d(x); }

/* log for double x > 0: x = m * 2^k with m in [sqrt(1/2), sqrt(2)), atanh series. */
static double log_d(double x)
{
    if (x != x || x < 0) return NAN;
    if (x == 0) return -INFINITY;
    if (isinf(x)) return x;
    int k;
    double m = frexp(x, &k);                        /* m in [0.5, 1) */
    if (m < 0.70710678118654752440) { m *= 2.0; k--; }
    double s = (m - 1.0) / (m + 1.0), s2 = s * s, t = 0.0;
    for (int i = 41; i >= 1; i -= 2) t = t * s2 + 1.0 / i;
    return 2.0 * s * t + k * 6.93147180559945309417e-01;
}

float k3_logf(float x) { return (float)log_d(x); }

float k3_sigmoidf(float x) { return (float)(1.0 / (1.0 + exp_d(-(double)x))); }

float k3_siluf(float x) { return (float)((double)x / (1.0 + exp_d(-(double)x))); }

static double tanh_d(double x)
{
    if (x != x) return x;
    double a = fabs(x);
    if (a > 20.0) return x > 0 ? 1.0 : -1.0;
    double r;
    if (a < 0.5) {                                   /* series: no cancellation near 0 */
        double x2 = a * a, t = 0.0;
        /* tanh a = a - a^3/3 + 2a^5/15 - 17a^7/315 + ... via e^{2a} would cancel; use expm1 form */
        double e = exp_d(2.0 * a);
        double em1 = e - 1.0;
        if (a < 1e-4) return x * (1.0 - x2 / 3.0);
        t = em1 / (e + 1.0);
        r = t;
    } else {
        double e = exp_d(-2.0 * a);
        r = (1.0 - e) / (1.0 + e);
    }
    return x < 0 ? -r : r;
}

float k3_tanhf(float x) { return (float)tanh_d(x); }

/* log(1 + y) for y >= 0 without losing small y (Goldberg: log(u) * y / (u - 1), u = 1 + y). */
static double log1p_d(double y)
{
    double u = 1.0 + y;
    if (u == 1.0) return y;
    return log_d(u) * y / (u - 1.0);
}

float k3_softplusf(float x)
{
    if (x > 20.0f) return x;
    return (float)log1p_d(exp_d(x));
}

float k3_situf(float g, float u, float b, float bl)
{
    double gd = g, ud = u;
    double left = (double)b * tanh_d(gd / b) / (1.0 + exp_d(-gd));
    double right = (double)bl * tanh_d(ud / bl);
    return (float)(left * right);
}

float k3_rsqrtf(float x) { return (float)(1.0 / sqrt((double)x)); }

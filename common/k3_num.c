/* k3_num.c - bf16, f16, e8m0, e2m1 conversions. */
#include "k3_num.h"

#include <math.h>
#include <string.h>

const float k3_e2m1_values[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float k3_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t k3_f32_to_bf16(float f)
{
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float k3_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0) {                                   /* zero or subnormal */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) return u2f(sign | 0x7f800000u | (man << 13));
    return u2f(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t k3_f32_to_f16(float f)
{
    uint32_t u = f2u(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00;         /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00;        /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {                             /* below f16 normal: subnormal */
        /* value in units of 2^-24, rounded to nearest even */
        float v = u2f(a) * 0x1p24f;
        float r = nearbyintf(v);                       /* default mode: ties to even */
        return sign | (uint16_t)r;
    }
    uint32_t t = a + 0xfffu + ((a >> 13) & 1);         /* round mantissa to 10 bits */
    return sign | (uint16_t)((t - 0x38000000u) >> 13);
}

float k3_e8m0_to_f32(uint8_t e)
{
    if (e == 255) return NAN;
    if (e == 0) return u2f(0x00400000u);               /* 2^-127, an f32 subnormal */
    return u2f((uint32_t)e << 23);
}

float k3_e2m1_to_f32(uint8_t code) { return k3_e2m1_values[code & 15]; }

uint8_t k3_f32_to_e2m1(float x)
{
    uint8_t sign = signbit(x) ? 8 : 0;
    float a = fabsf(x);
    /* midpoints between consecutive magnitudes; at an exact midpoint take the even index */
    static const float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    uint8_t i = 0;
    while (i < 7 && (a > mid[i] || (a == mid[i] && (i & 1)))) i++;
    if (isnan(x)) i = 0;
    return sign | i;
}

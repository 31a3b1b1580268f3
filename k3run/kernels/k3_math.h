/*
 * k3_math.h - the engine's non-matmul math: one implementation of exp,
 * sigmoid, SiLU, tanh, softplus and SiTU used by every path, so results
 * cannot drift between ISAs, machines or libm versions. Written in plain C,
 * evaluated in double and rounded once to fp32; compiled without FMA
 * contraction (-ffp-contract=off), so the same bits everywhere.
 */
#ifndef K3_MATH_H
#define K3_MATH_H

float k3_expf(float x);        /* e^x: correctly rounded in practice (double evaluation) */
float k3_logf(float x);        /* natural log, x > 0 */
float k3_sigmoidf(float x);    /* 1 / (1 + e^-x) */
float k3_siluf(float x);       /* x * sigmoid(x) */
float k3_tanhf(float x);
float k3_softplusf(float x);   /* log(1 + e^x), = x above 20 (as the reference) */
/* SiTU-GLU: [b*tanh(g/b)*sigmoid(g)] * [bl*tanh(u/bl)] */
float k3_situf(float g, float u, float b, float bl);
/* 1 / sqrt(x) as fp32: (float)(1.0 / sqrt(x)) */
float k3_rsqrtf(float x);

#endif

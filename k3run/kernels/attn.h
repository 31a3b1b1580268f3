/*
 * attn.h - the arithmetic inside K3's two attention kinds (engine/model_attn.c), in a scalar form
 * (attn.c, plain C, the definition) and an AVX2 form (attn_avx2.c) that gives the same bits.
 *
 * Every function below fixes the order of its fp32 operations (every `+` and `*` one rounded
 * operation, no fused multiply-add); the AVX2 form does exactly those operations on up to 8
 * independent elements at once (_mm256_mul_ps, then _mm256_add_ps), so both forms agree bit for
 * bit on every input, NaN payloads aside (tests/unit/test_attn.c). isa is kern.h's k3_isa as an
 * int: 0 (scalar) runs the plain C; 1 and 2 run the AVX2 form where the CPU has AVX2.
 * docs/PERFORMANCE.md "Attention for long prompts" has the measurements.
 */
#ifndef K3_ATTN_H
#define K3_ATTN_H

#include <stddef.h>
#include <stdint.h>

/*
 * KDA: T tokens of one head's recurrence, in token order. For token t:
 *
 *     S[a][b] = S[a][b] * e[a]                        (decay; e = exp(g), computed by the caller)
 *     ks[b]   = sum over a increasing of k[a] * S[a][b]    (ks[b] starts at +0: ks = +0 + k0 S0 + ...)
 *     u[b]    = beta * (v[b] - ks[b])
 *     S[a][b] = S[a][b] + k[a] * u[b]
 *     o[b]    = sum over a increasing of q[a] * S[a][b]    (the updated S; starts at +0)
 *
 * S: [K][K] (row a, column b), updated in place. Token t's vectors e, k, v, q, o: [K] at
 * (pointer) + t * ld floats; its beta at beta[t * ldb]. q and o may both be NULL (a verify
 * pass's commit replays the update without the output). ks: [K] scratch.
 */
void k3_kda_tokens(int isa, float *S, uint32_t K, uint32_t T, const float *e, const float *k, const float *v,
                   const float *q, float *o, size_t ld, const float *beta, size_t ldb, float *ks);

/*
 * MLA, one token: its heads, each against the positions of the latent cache.
 *
 * k3_mla_qhat: ql[r] = sum over d increasing (from +0) of qn[d] * w[d][r], the BF16 rows of W_UK
 * widened exactly. One head: ql: [R]; qn: [dn]; w: dn rows of R BF16 values, row d at w + d * ldw.
 */
void k3_mla_qhat(int isa, float *ql, const float *qn, const uint16_t *w, size_t ldw, uint32_t dn, uint32_t R);

/*
 * k3v_dot: sum of a[i] * b[i], i < n, in one fixed order: 8 lanes from +0, element i into lane
 * i % 8 in increasing i (acc = acc + a*b, no fused multiply-add), then (l0+l4, l1+l5, l2+l6,
 * l3+l7), then (0+2, 1+3), then 0+1. a, b: [n]. The engine's attention scores use it too.
 */
float k3v_dot(const float *a, const float *b, uint32_t n);

/*
 * k3_mla_scores: for heads h < nh and positions t0 <= tau < t1,
 *     s[h][tau] = (dot(ql[h], cc[tau], R) + dot(qr[h], ckr[tau], dr)) * scale
 * where dot is k3v_dot (above).
 * s: head h at s + h * lds; ql: [nh] x [R] at ldq; qr: [nh] x [dr] at ldqr; cc: [t1][R];
 * ckr: [t1][dr]. Every score is one independent computation: any split of heads or positions
 * (between threads) gives the same bits.
 */
void k3_mla_scores(int isa, float *s, size_t lds, const float *ql, size_t ldq, const float *qr, size_t ldqr,
                   uint32_t nh, const float *cc, const float *ckr, uint32_t t0, uint32_t t1, uint32_t R, uint32_t dr,
                   float scale);

/*
 * k3_mla_softmax: one head's scores s: [n] become its weights, in place:
 *     mx = the first of the largest s (s > mx, in increasing tau, from -inf); s = s - mx;
 *     s = k3_expf(s) (k3_exp_n: the same bits); sum = the double sum of s in increasing tau;
 *     s = (float)(s / sum)   (a double division)
 */
void k3_mla_softmax(int isa, float *s, uint32_t n);

/*
 * k3_mla_values: for heads h < nh and columns r0 <= r < r1,
 *     ol[h][r] = sum over tau < n increasing (from +0) of p[h][tau] * cc[tau][r]
 * ol: head h at ol + h * ldo; p: head h at p + h * ldp; cc: [n][R]. Every ol[h][r] is one
 * independent chain: any split of heads or columns gives the same bits (never of tau).
 */
void k3_mla_values(int isa, float *ol, size_t ldo, const float *p, size_t ldp, uint32_t nh, const float *cc,
                   uint32_t n, uint32_t R, uint32_t r0, uint32_t r1);

/* attn_avx2.c: the AVX2 forms (call only where the CPU has AVX2; the functions above choose) */
void k3_kda_tokens_avx2(float *S, uint32_t K, uint32_t T, const float *e, const float *k, const float *v,
                        const float *q, float *o, size_t ld, const float *beta, size_t ldb, float *ks);
void k3_mla_qhat_avx2(float *ql, const float *qn, const uint16_t *w, size_t ldw, uint32_t dn, uint32_t R);
void k3_mla_scores_avx2(float *s, size_t lds, const float *ql, size_t ldq, const float *qr, size_t ldqr,
                        uint32_t nh, const float *cc, const float *ckr, uint32_t t0, uint32_t t1, uint32_t R,
                        uint32_t dr, float scale);
void k3_mla_probs_avx2(float *s, uint32_t n, double sum);
void k3_mla_values_avx2(float *ol, size_t ldo, const float *p, size_t ldp, uint32_t nh, const float *cc,
                        uint32_t n, uint32_t R, uint32_t r0, uint32_t r1);

#endif

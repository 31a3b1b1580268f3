/*
 * attn.c - attn.h's scalar forms (the definition of the attention arithmetic) and the choice of
 * the AVX2 form. Compiled for baseline x86-64 with -ffp-contract=off like the rest of the room.
 */
#include "attn.h"

#include <math.h>
#include <string.h>

#include "k3_math.h"
#include "kern.h"

static int use_avx2(int isa) { return isa >= K3_ISA_AVX2 && k3_isa_supported(K3_ISA_AVX2); }

/*
 * One token of one KDA head. It was five loops over S (decay; ks = S^T k; u; S += k u^T; o = S^T q);
 * it is two, each with the same operations on every element in the same order:
 *
 * - Pass 1 (a outer, b inner) first decays S[a][b], then adds k[a] * S[a][b] to ks[b]. The old
 *   form decayed all of S, then ran the same (a, b) loop nest for ks. ks[b] still receives its
 *   terms in increasing a, and each term reads S[a][b] after its decay and before anything else
 *   writes it (only the decay wrote S before, and nothing writes it between), so every ks[b] is
 *   the same chain of the same rounded operations.
 * - Pass 2 adds k[a] * u[b] to S[a][b], then adds q[a] * S[a][b] to o[b]. The old form updated
 *   all of S, then summed o in the same (a, b) nest: o[b]'s terms come in increasing a and each
 *   reads S[a][b] after its update, which was the element's last write either way.
 *
 * Column b of S meets only column b of ks, u and o, so the columns are independent: any order of
 * columns (and the AVX2 form's 8 at a time, all tokens of a column block in a row) is the same.
 */
static void kda_token(float *S, uint32_t K, const float *e, const float *k, const float *v, const float *q,
                      float *o, float beta, float *ks)
{
    for (uint32_t b = 0; b < K; b++) ks[b] = 0.0f;
    for (uint32_t a = 0; a < K; a++) {
        float *Sa = S + (size_t)a * K;                              /* [K] row a */
        for (uint32_t b = 0; b < K; b++) {
            Sa[b] = Sa[b] * e[a];
            ks[b] = ks[b] + k[a] * Sa[b];
        }
    }
    for (uint32_t b = 0; b < K; b++) ks[b] = beta * (v[b] - ks[b]);  /* u */
    if (o)
        for (uint32_t b = 0; b < K; b++) o[b] = 0.0f;
    for (uint32_t a = 0; a < K; a++) {
        float *Sa = S + (size_t)a * K;
        for (uint32_t b = 0; b < K; b++) {
            Sa[b] = Sa[b] + k[a] * ks[b];
            if (o) o[b] = o[b] + q[a] * Sa[b];
        }
    }
}

void k3_kda_tokens(int isa, float *S, uint32_t K, uint32_t T, const float *e, const float *k, const float *v,
                   const float *q, float *o, size_t ld, const float *beta, size_t ldb, float *ks)
{
    if (use_avx2(isa)) { k3_kda_tokens_avx2(S, K, T, e, k, v, q, o, ld, beta, ldb, ks); return; }
    for (uint32_t t = 0; t < T; t++) {
        size_t x = (size_t)t * ld;
        kda_token(S, K, e + x, k + x, v + x, q ? q + x : NULL, o ? o + x : NULL, beta[(size_t)t * ldb], ks);
    }
}

/* BF16 -> fp32, exact (the bits are the top half) */
static inline float bf16f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

void k3_mla_qhat(int isa, float *ql, const float *qn, const uint16_t *w, size_t ldw, uint32_t dn, uint32_t R)
{
    if (use_avx2(isa)) { k3_mla_qhat_avx2(ql, qn, w, ldw, dn, R); return; }
    for (uint32_t r = 0; r < R; r++) ql[r] = 0.0f;
    for (uint32_t d = 0; d < dn; d++) {
        const uint16_t *row = w + (size_t)d * ldw;                  /* [R] */
        float qv = qn[d];
        for (uint32_t r = 0; r < R; r++) ql[r] = ql[r] + qv * bf16f(row[r]);
    }
}

float k3v_dot(const float *a, const float *b, uint32_t n)
{
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    float s4[4], s2[2];
    for (int l = 0; l < 4; l++) s4[l] = acc[l] + acc[l + 4];
    for (int l = 0; l < 2; l++) s2[l] = s4[l] + s4[l + 2];
    return s2[0] + s2[1];
}

void k3_mla_scores(int isa, float *s, size_t lds, const float *ql, size_t ldq, const float *qr, size_t ldqr,
                   uint32_t nh, const float *cc, const float *ckr, uint32_t t0, uint32_t t1, uint32_t R, uint32_t dr,
                   float scale)
{
    if (use_avx2(isa)) { k3_mla_scores_avx2(s, lds, ql, ldq, qr, ldqr, nh, cc, ckr, t0, t1, R, dr, scale); return; }
    for (uint32_t h = 0; h < nh; h++)
        for (uint32_t tau = t0; tau < t1; tau++)
            s[h * lds + tau] = (k3v_dot(ql + h * ldq, cc + (size_t)tau * R, R) + k3v_dot(qr + h * ldqr, ckr + (size_t)tau * dr, dr)) * scale;
}

void k3_mla_softmax(int isa, float *s, uint32_t n)
{
    float mx = -INFINITY;
    for (uint32_t tau = 0; tau < n; tau++)
        if (s[tau] > mx) mx = s[tau];
    for (uint32_t tau = 0; tau < n; tau++) s[tau] = s[tau] - mx;
    k3_exp_n(isa, s, n);
    double sum = 0;
    for (uint32_t tau = 0; tau < n; tau++) sum += s[tau];
    if (use_avx2(isa)) { k3_mla_probs_avx2(s, n, sum); return; }
    for (uint32_t tau = 0; tau < n; tau++) s[tau] = (float)(s[tau] / sum);
}

void k3_mla_values(int isa, float *ol, size_t ldo, const float *p, size_t ldp, uint32_t nh, const float *cc,
                   uint32_t n, uint32_t R, uint32_t r0, uint32_t r1)
{
    if (use_avx2(isa)) { k3_mla_values_avx2(ol, ldo, p, ldp, nh, cc, n, R, r0, r1); return; }
    for (uint32_t h = 0; h < nh; h++) {
        float *o = ol + h * ldo;                                    /* [R] of head h, columns r0 .. r1 */
        for (uint32_t r = r0; r < r1; r++) o[r] = 0.0f;
        for (uint32_t tau = 0; tau < n; tau++) {
            float ph = p[h * ldp + tau];
            const float *cr = cc + (size_t)tau * R;                 /* [R] */
            for (uint32_t r = r0; r < r1; r++) o[r] = o[r] + ph * cr[r];
        }
    }
}

/*
 * test_attn.c - the attention arithmetic of kernels/attn.h gives, on the scalar path and on the
 * AVX2 path, exactly the bits of the code it replaced in engine/model_attn.c, transcribed here
 * literally (kda_step with its separate passes and the o loop; q_hat; scores with ref_dot, the
 * order attn.h specifies for k3v_dot, written out here; the
 * values loop). Random inputs of ordinary size, inputs whose products underflow into subnormals
 * and -0, and inputs sprinkled with NaN, +-inf, +-0, subnormals and huge values; sizes 1..40 and
 * the model's (not multiples of 8 included), several tokens with a stride, every column block
 * and tail. Any NaN equals any NaN (docs/KERNELS.md). AVX2 parts are skipped without AVX2.
 */
#include "k3_test.h"

#include <float.h>
#include <stdint.h>

#include "attn.h"
#include "k3_math.h"
#include "kern.h"

/* attn.h's dot order, from its words: lane i % 8 of 8 from +0 in increasing i, then the fixed tree */
static float ref_dot(const float *a, const float *b, uint32_t n)
{
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (uint32_t i = 0; i < n; i++) {
        float p = a[i] * b[i];
        l[i % 8] = l[i % 8] + p;
    }
    float m0 = l[0] + l[4], m1 = l[1] + l[5], m2 = l[2] + l[6], m3 = l[3] + l[7];
    return (m0 + m2) + (m1 + m3);
}

static uint64_t state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    state ^= state << 13; state ^= state >> 7; state ^= state << 17;
    return (uint32_t)(state >> 16);
}
static float uni(void) { return (float)(rnd() & 0xFFFFFF) / 16777216.0f; }            /* [0, 1) */
static float bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* kinds of input: 0 ordinary (|x| ~ 1), 1 tiny (products underflow to subnormals and -0),
   2 extreme (specials sprinkled among values of every exponent) */
static float val(int kind)
{
    float x = 2.0f * uni() - 1.0f;
    if (kind == 1) return x * 1e-21f;
    if (kind == 2) {
        static const uint32_t sp[] = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00001u,
                                      0x00000001u, 0x80000001u, 0x007FFFFFu, 0x807FFFFFu, 0x00800000u, 0x7F7FFFFFu,
                                      0xFF7FFFFFu, 0x3F800000u, 0xBF800000u};
        uint32_t r = rnd() % 512;                                     /* rare enough that not all is NaN */
        if (r < sizeof sp / sizeof sp[0]) return bits(sp[r]);
        if (r < 24) return bits(rnd() ^ (rnd() << 16));                                   /* any pattern */
        return ldexpf(x, (int)(rnd() % 61) - 30);                                        /* 2^-30 .. 2^30 */
    }
    return x;
}
static int same(float x, float y) { return !memcmp(&x, &y, 4) || (isnan(x) && isnan(y)); }
static int bad;
static void cmp(const float *a, const float *b, size_t n, const char *what, unsigned p1, unsigned p2)
{
    for (size_t i = 0; i < n; i++)
        if (!same(a[i], b[i]) && bad++ < 10) fprintf(stderr, "%s (%u, %u) [%zu]: %a, expected %a\n", what, p1, p2, i, a[i], b[i]);
}

/* ---- the code that was in engine/model_attn.c, literally ---- */
static void ref_kda_step(float *S, const float *g, const float *k, const float *v, float beta, uint32_t K, float *ks)
{
    for (uint32_t a = 0; a < K; a++) {
        float e = k3_expf(g[a]);
        for (uint32_t b = 0; b < K; b++) S[a * K + b] = S[a * K + b] * e;
    }
    for (uint32_t b = 0; b < K; b++) ks[b] = 0.0f;
    for (uint32_t a = 0; a < K; a++)
        for (uint32_t b = 0; b < K; b++) ks[b] = ks[b] + k[a] * S[a * K + b];
    for (uint32_t b = 0; b < K; b++) ks[b] = beta * (v[b] - ks[b]);       /* u */
    for (uint32_t a = 0; a < K; a++)
        for (uint32_t b = 0; b < K; b++) S[a * K + b] = S[a * K + b] + k[a] * ks[b];
}
static void ref_kda_o(float *ot, const float *qt, const float *S, uint32_t K)
{
    for (uint32_t b = 0; b < K; b++) ot[b] = 0.0f;
    for (uint32_t a = 0; a < K; a++)
        for (uint32_t b = 0; b < K; b++) ot[b] = ot[b] + qt[a] * S[a * K + b];
}
static float ref_bf16(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }

#define KMAX 136
#define TMAX 5
#define LD (KMAX + 3)                                     /* token stride of the test's [T][LD] arrays */
static float S0[KMAX * KMAX], Sr[KMAX * KMAX], Sx[KMAX * KMAX];   /* [K][K] */
static float G[TMAX * LD], E[TMAX * LD], Kv[TMAX * LD], V[TMAX * LD], Q[TMAX * LD];   /* [T][LD] */
static float O_ref[TMAX * LD], O_x[TMAX * LD], B[TMAX * 2], ks[KMAX];

/* T tokens of one head: reference (token by token), then the path isa, with output and without */
static void kda_case(int isa, uint32_t K, uint32_t T, int kind)
{
    for (uint32_t i = 0; i < K * K; i++) S0[i] = val(kind == 1 ? 0 : kind);
    for (uint32_t i = 0; i < T * LD; i++) {
        G[i] = kind == 2 ? val(2) : -3.0f * uni();                   /* decay exp(g) in (0.05, 1] */
        Kv[i] = val(kind); V[i] = val(kind); Q[i] = val(kind);
    }
    for (uint32_t t = 0; t < T; t++) B[2 * t] = kind == 2 ? val(2) : uni();
    memcpy(Sr, S0, sizeof(float) * K * K);
    for (uint32_t t = 0; t < T; t++) {
        ref_kda_step(Sr, G + t * LD, Kv + t * LD, V + t * LD, B[2 * t], K, ks);
        ref_kda_o(O_ref + t * LD, Q + t * LD, Sr, K);
    }
    memcpy(E, G, sizeof E);
    k3_exp_n(isa, E, T * LD);
    memcpy(Sx, S0, sizeof(float) * K * K);
    k3_kda_tokens(isa, Sx, K, T, E, Kv, V, Q, O_x, LD, B, 2, ks);
    cmp(Sx, Sr, (size_t)K * K, isa ? "kda S avx2" : "kda S scalar", K, T);
    for (uint32_t t = 0; t < T; t++) cmp(O_x + t * LD, O_ref + t * LD, K, isa ? "kda o avx2" : "kda o scalar", K, t);
    memcpy(Sx, S0, sizeof(float) * K * K);                            /* the commit's form: no output */
    for (uint32_t t = 0; t < T; t++) k3_kda_tokens(isa, Sx, K, 1, E + t * LD, Kv + t * LD, V + t * LD, NULL, NULL, 0, B + 2 * t, 0, ks);
    cmp(Sx, Sr, (size_t)K * K, isa ? "kda commit avx2" : "kda commit scalar", K, T);
}

#define RMAX 272
#define NMAX 140                                          /* past two chunks of 64 positions */
#define DNMAX 66
#define HMAX 5
#define LDS (NMAX + 2)                                    /* the test's per-head strides */
#define LDQ (RMAX + 1)
static float QL_ref[HMAX * LDQ], QL_x[HMAX * LDQ], QN[HMAX * DNMAX], QR[HMAX * LDQ];   /* [H][LDQ], [H][dn] */
static float CC[NMAX * RMAX], CKR[NMAX * RMAX];                                         /* [n][R], [n][dr] */
static float S_ref[HMAX * LDS], S_x[HMAX * LDS], OL_ref[HMAX * LDQ], OL_x[HMAX * LDQ];  /* [H][LDS], [H][LDQ] */
static uint16_t WUK[HMAX * DNMAX * (RMAX + 5)];                                          /* [H][dn][R + 5] */

/* nh heads of one token against n positions, the positions and columns cut in two at a and c */
static void mla_case(int isa, uint32_t R, uint32_t dr, uint32_t n, uint32_t dn, uint32_t nh, int kind)
{
    size_t ldw = R + 5;
    for (uint32_t i = 0; i < nh * dn * ldw; i++) {
        float f = val(kind);
        uint32_t u; memcpy(&u, &f, 4);
        WUK[i] = (uint16_t)(u >> 16);
    }
    for (uint32_t i = 0; i < nh * DNMAX; i++) QN[i] = val(kind);
    for (uint32_t i = 0; i < nh * LDQ; i++) QR[i] = val(kind);
    for (uint32_t i = 0; i < n * R; i++) CC[i] = val(kind);
    for (uint32_t i = 0; i < n * dr; i++) CKR[i] = val(kind);
    float scale = 0.0883883476f;
    for (uint32_t h = 0; h < nh; h++) {                               /* the old code, head by head */
        float *ql = QL_ref + h * LDQ;
        const uint16_t *w = WUK + h * dn * ldw;
        for (uint32_t r = 0; r < R; r++) ql[r] = 0.0f;
        for (uint32_t d = 0; d < dn; d++)
            for (uint32_t r = 0; r < R; r++) ql[r] = ql[r] + QN[h * DNMAX + d] * ref_bf16(w[d * ldw + r]);
        k3_mla_qhat(isa, QL_x + h * LDQ, QN + h * DNMAX, w, ldw, dn, R);
        for (uint32_t tau = 0; tau < n; tau++)
            S_ref[h * LDS + tau] = (ref_dot(ql, CC + (size_t)tau * R, R) + ref_dot(QR + h * LDQ, CKR + (size_t)tau * dr, dr)) * scale;
    }
    for (uint32_t h = 0; h < nh; h++) cmp(QL_x + h * LDQ, QL_ref + h * LDQ, R, isa ? "qhat avx2" : "qhat scalar", R, dn);
    uint32_t a = rnd() % (n + 1), c = rnd() % 3 ? rnd() % (R + 1) : R / 16 * 8;
    k3_mla_scores(isa, S_x, LDS, QL_ref, LDQ, QR, LDQ, nh, CC, CKR, 0, a, R, dr, scale);
    k3_mla_scores(isa, S_x, LDS, QL_ref, LDQ, QR, LDQ, nh, CC, CKR, a, n, R, dr, scale);
    for (uint32_t h = 0; h < nh; h++) cmp(S_x + h * LDS, S_ref + h * LDS, n, isa ? "scores avx2" : "scores scalar", R, n);
    /* softmax, on the scores or on anything */
    for (uint32_t h = 0; h < nh; h++) {
        float *sr = S_ref + h * LDS;
        if (kind == 2)
            for (uint32_t tau = 0; tau < n; tau++) sr[tau] = val(2);
        memcpy(S_x + h * LDS, sr, n * 4);
        float mx = -INFINITY;
        for (uint32_t tau = 0; tau < n; tau++)
            if (sr[tau] > mx) mx = sr[tau];
        double sum = 0;
        for (uint32_t tau = 0; tau < n; tau++) { sr[tau] = k3_expf(sr[tau] - mx); sum += sr[tau]; }
        for (uint32_t tau = 0; tau < n; tau++) sr[tau] = (float)(sr[tau] / sum);
        k3_mla_softmax(isa, S_x + h * LDS, n);
        cmp(S_x + h * LDS, sr, n, isa ? "softmax avx2" : "softmax scalar", R, n);
    }
    /* values: on the softmax's weights (ordinary), or on anything (extreme) */
    for (uint32_t h = 0; h < nh; h++) {
        if (kind == 2)
            for (uint32_t tau = 0; tau < n; tau++) S_ref[h * LDS + tau] = val(2);
        float *o = OL_ref + h * LDQ;
        for (uint32_t r = 0; r < R; r++) o[r] = 0.0f;
        for (uint32_t tau = 0; tau < n; tau++) {
            float p = S_ref[h * LDS + tau];
            for (uint32_t r = 0; r < R; r++) o[r] = o[r] + p * CC[(size_t)tau * R + r];
        }
    }
    k3_mla_values(isa, OL_x, LDQ, S_ref, LDS, nh, CC, n, R, 0, c);
    k3_mla_values(isa, OL_x, LDQ, S_ref, LDS, nh, CC, n, R, c, R);
    for (uint32_t h = 0; h < nh; h++) cmp(OL_x + h * LDQ, OL_ref + h * LDQ, R, isa ? "values avx2" : "values scalar", R, n);
}

int main(void)
{
    int n_isa = k3_isa_supported(K3_ISA_AVX2) ? 2 : 1;
    if (n_isa == 1) printf("note: no AVX2 on this CPU: the scalar form only\n");
    for (int isa = 0; isa < n_isa; isa++)
        for (int kind = 0; kind < 3; kind++) {
            bad = 0;
            for (uint32_t K = 1; K <= 41; K++) kda_case(isa, K, 1 + K % TMAX, kind);
            static const uint32_t Ks[] = {64, 72, 96, 127, 128, 136};
            for (size_t i = 0; i < sizeof Ks / sizeof Ks[0]; i++) kda_case(isa, Ks[i], TMAX, kind);
            CHECK_MSG(bad == 0, "kda, isa %d, inputs %d: %d values differ", isa, kind, bad);
            bad = 0;
            for (uint32_t R = 1; R <= 40; R++)
                for (uint32_t n = 1; n <= 19; n += 3) mla_case(isa, R, 1 + (R * 7 + n) % 40, n, 1 + R % 9, 1 + (R + n) % HMAX, kind);
            static const uint32_t Rs[][3] = {{64, 16, 32}, {256, 32, 64}, {272, 64, 66}, {200, 24, 8}, {129, 7, 3}};
            for (size_t i = 0; i < sizeof Rs / sizeof Rs[0]; i++)
                for (uint32_t n = 1; n <= NMAX; n += n < 60 ? 4 : 11) mla_case(isa, Rs[i][0], Rs[i][1], n, Rs[i][2], 1 + n % HMAX, kind);
            CHECK_MSG(bad == 0, "mla, isa %d, inputs %d: %d values differ", isa, kind, bad);
        }
    return k3_test_done();
}

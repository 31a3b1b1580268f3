/*
 * bench_attn.c - attention for long prompts: the time of KDA's recurrence and of MLA's attention
 * (q_hat, scores, softmax, values, W_UV) over an N-token prompt on a preset's shapes, with their
 * flops and the fraction of this machine's fp32 peak, measured in the same run:
 *
 *   before   the code engine/model_attn.c had before kernels/attn.h, transcribed (k3v_dot, k3_expf)
 *   scalar   attn.h on the scalar path (K3_ISA=scalar): the fused plain C
 *   avx2     attn.h on the AVX2 path (mul then add, no FMA)
 *
 * All three give the same bits (checked here on the bench's data, and by tests/unit/test_attn.c).
 * KDA costs the same for every token: B-token passes are timed and scaled to N tokens. MLA's
 * token at position p costs in proportion to p + 1: S tokens at evenly spread positions are timed
 * and scaled by N / S (an unbiased estimate of the whole prompt). Every time is the best of
 * --reps runs (default 3: the machines this runs on are shared), the peaks the best of 3.
 * Peaks per thread: 12 independent chains of 256-bit FMAs; and 7 chains of acc = acc + x * y,
 * a multiply then an add, the most the canonical order's arithmetic can do (half the FMA peak
 * where the FMA ports also do every multiply and add, as on Intel cores; up to all of it where
 * adds have pipes of their own, as on AMD Zen). --preset k3: K3's heads and dimensions.
 * "cache read GB/s": MLA's bytes of latent cache read (each visible position's c and k_rope for
 * the scores, its c again for the values) per second, to hold against the memory bandwidth
 * (bench_membw) where the cache outgrows the last-level cache.
 * Prints a Markdown table (docs/PERFORMANCE.md, "Attention for long prompts"). Not a test.
 *
 *   build/bench/bench_attn [--preset small|k3] [-n N] [-t THREADS] [--samples S] [--batch B] [--reps N]
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn.h"
#include "k3_math.h"
#include "k3_shard.h"
#include "kern.h"

float k3v_dot(const float *a, const float *b, uint32_t n);   /* kernels/attn.c */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
static uint64_t rng = 88172645463325252ull;
static float unif(void)                                               /* [-1, 1) */
{
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}
static void *allocs[64];                      /* every xalloc, freed by xfree_all */
static int n_allocs;
static void *xalloc(size_t n)
{
    void *p = malloc(n);
    if (!p || n_allocs == 64) { fprintf(stderr, "bench_attn: out of memory\n"); exit(3); }
    return allocs[n_allocs++] = p;
}
static void xfree_all(void)
{
    while (n_allocs) free(allocs[--n_allocs]);
}

/* ---- peaks: independent chains per thread, in registers ---- */
#define CHAINS(OP) do { \
    __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f); \
    __m256 a0 = _mm256_set1_ps(1), a1 = _mm256_set1_ps(2), a2 = _mm256_set1_ps(3), a3 = _mm256_set1_ps(4); \
    __m256 a4 = _mm256_set1_ps(5), a5 = _mm256_set1_ps(6), a6 = _mm256_set1_ps(7), a7 = _mm256_set1_ps(8); \
    __m256 a8 = _mm256_set1_ps(9), a9 = _mm256_set1_ps(10), a10 = _mm256_set1_ps(11), a11 = _mm256_set1_ps(12); \
    for (long i = 0; i < iters; i++) { \
        a0 = OP(a0); a1 = OP(a1); a2 = OP(a2); a3 = OP(a3); a4 = OP(a4); a5 = OP(a5); \
        a6 = OP(a6); a7 = OP(a7); a8 = OP(a8); a9 = OP(a9); a10 = OP(a10); a11 = OP(a11); \
    } \
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)), \
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7))); \
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11))); \
    float out[8]; memcpy(out, &s, sizeof out); return out[0]; \
} while (0)
#define OP_FMA(x) _mm256_fmadd_ps(x, m, c)
__attribute__((target("avx2,fma"))) static float chains_fma(long iters) { CHAINS(OP_FMA); }
/* The attention's own pattern: acc = acc + x * y, x * y independent of acc (7 chains of adds, 7
   multiplies per step; the empty asm makes m new each step, so no multiply leaves the loop) */
__attribute__((target("avx2"))) static float chains_muladd(long iters)
{
    __m256 m = _mm256_set1_ps(0.999999f), a[7], b[7];
    for (int j = 0; j < 7; j++) { a[j] = _mm256_set1_ps((float)j); b[j] = _mm256_set1_ps(1e-7f * (float)(j + 1)); }
    __m256 a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], a4 = a[4], a5 = a[5], a6 = a[6];
    __m256 b0 = b[0], b1 = b[1], b2 = b[2], b3 = b[3], b4 = b[4], b5 = b[5], b6 = b[6];
    for (long i = 0; i < iters; i++) {
        __asm__("" : "+x"(m));
        a0 = _mm256_add_ps(a0, _mm256_mul_ps(b0, m)); a1 = _mm256_add_ps(a1, _mm256_mul_ps(b1, m));
        a2 = _mm256_add_ps(a2, _mm256_mul_ps(b2, m)); a3 = _mm256_add_ps(a3, _mm256_mul_ps(b3, m));
        a4 = _mm256_add_ps(a4, _mm256_mul_ps(b4, m)); a5 = _mm256_add_ps(a5, _mm256_mul_ps(b5, m));
        a6 = _mm256_add_ps(a6, _mm256_mul_ps(b6, m));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), a6));
    float out[8];
    memcpy(out, &s, sizeof out);
    return out[0];
}
static double peak(int fma, int threads)                              /* GFLOPS, 2 flops per pair */
{
    long iters = 20000000;
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        float sink = 0;
        double t0 = now();
        #pragma omp parallel num_threads(threads) reduction(+ : sink)
        sink += fma ? chains_fma(iters) : chains_muladd(iters);
        double t = now() - t0;
        if (t < best) best = t;
        if (sink == 42) fprintf(stderr, " ");
    }
    return (double)iters * (fma ? 12 : 7) * 8 * 2 * threads / best / 1e9;
}

typedef struct shape {
    const char *name;
    uint32_t H, K, n_kda;                     /* KDA heads, head dim, layers */
    uint32_t Hm, R, dr, dn, dv, n_mla;        /* MLA heads, latent, rope, nope, v dims, layers */
} shape;
static const shape shapes[] = {
    {"small", 8, 128, 6, 8, 256, 32, 64, 64, 3},
    {"k3", 96, 128, 69, 96, 512, 64, 128, 128, 24},
};

/* ---- KDA: the old per-token code (model_attn.c's kda_step and o loop), transcribed ---- */
static void old_kda_step(float *S, const float *g, const float *k, const float *v, float beta, uint32_t K, float *ks)
{
    for (uint32_t a = 0; a < K; a++) {
        float e = k3_expf(g[a]);
        for (uint32_t b = 0; b < K; b++) S[a * K + b] = S[a * K + b] * e;
    }
    for (uint32_t b = 0; b < K; b++) ks[b] = 0.0f;
    for (uint32_t a = 0; a < K; a++)
        for (uint32_t b = 0; b < K; b++) ks[b] = ks[b] + k[a] * S[a * K + b];
    for (uint32_t b = 0; b < K; b++) ks[b] = beta * (v[b] - ks[b]);
    for (uint32_t a = 0; a < K; a++)
        for (uint32_t b = 0; b < K; b++) S[a * K + b] = S[a * K + b] + k[a] * ks[b];
}

/* seconds per token of one layer's recurrence (all heads), B-token passes; o: [B][C] out */
static double kda_time(int variant, const shape *z, uint32_t B, uint32_t passes, float *S, const float *g,
                       const float *k, const float *v, const float *q, const float *beta, float *e, float *o, float *ks)
{
    uint32_t H = z->H, K = z->K, C = H * K;
    double t0 = now();
    for (uint32_t pass = 0; pass < passes; pass++) {
        if (variant == 0) {
            #pragma omp parallel for schedule(static)
            for (uint32_t hh = 0; hh < H; hh++)
                for (uint32_t t = 0; t < B; t++) {
                    size_t x = (size_t)t * C + hh * K;
                    float *Sh = S + (size_t)hh * K * K, *ot = o + x;
                    old_kda_step(Sh, g + x, k + x, v + x, beta[(size_t)t * H + hh], K, ks + (size_t)hh * K);
                    for (uint32_t b = 0; b < K; b++) ot[b] = 0.0f;
                    for (uint32_t a = 0; a < K; a++)
                        for (uint32_t b = 0; b < K; b++) ot[b] = ot[b] + q[x + a] * Sh[a * K + b];
                }
        } else {
            int isa = variant == 1 ? K3_ISA_SCALAR : K3_ISA_AVX2;
            memcpy(e, g, (size_t)B * C * sizeof(float));
            k3_exp_n(isa, e, (size_t)B * C);
            #pragma omp parallel for schedule(static)
            for (uint32_t hh = 0; hh < H; hh++) {
                size_t h0 = (size_t)hh * K;
                k3_kda_tokens(isa, S + (size_t)hh * K * K, K, B, e + h0, k + h0, v + h0, q + h0, o + h0, C, beta + hh, H,
                              ks + (size_t)hh * K);
            }
        }
    }
    return (now() - t0) / ((double)passes * B);
}

/* ---- MLA: one token at position p, all heads ---- */
typedef struct mla_data {
    const float *cc, *ckr;                    /* [N][R], [N][dr] the cache */
    const float *qall;                        /* [Hm][dn + dr] one token's queries */
    const uint16_t *kvb;                      /* [Hm * (dn + dv)][R] BF16 */
    float *ql, *s, *ol, *o;                   /* [Hm][R], [Hm][N], [Hm][R], [Hm][dv] */
} mla_data;

static float bf16f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }

/* [a, b): thread tid's share of n items cut at multiples of unit (as engine/model_attn.c) */
static void share(uint32_t n, uint32_t unit, int tid, int nth, uint32_t *a, uint32_t *b)
{
    uint64_t units = (n + unit - 1) / unit;
    uint64_t ua = units * (uint64_t)tid / (uint64_t)nth * unit, ub = units * (uint64_t)(tid + 1) / (uint64_t)nth * unit;
    *a = (uint32_t)(ua < n ? ua : n);
    *b = (uint32_t)(ub < n ? ub : n);
}

static void mla_token(int variant, const shape *z, uint32_t N, const mla_data *md, uint32_t p)
{
    uint32_t Hm = z->Hm, dn = z->dn, dr = z->dr, dv = z->dv, R = z->R, np = p + 1, qd = dn + dr;
    float scale = (float)(1.0 / sqrt((double)(dn + dr)));
    int isa = variant == 2 ? K3_ISA_AVX2 : K3_ISA_SCALAR;
    if (variant == 0) {                                               /* the old code: one head per iteration */
        #pragma omp parallel for schedule(static)
        for (uint32_t hh = 0; hh < Hm; hh++) {
            const float *qn = md->qall + (size_t)hh * qd, *qr = qn + dn;
            float *ql = md->ql + (size_t)hh * R, *s = md->s + (size_t)hh * N, *ol = md->ol + (size_t)hh * R;
            const uint16_t *wuk = md->kvb + (size_t)hh * (dn + dv) * R;
            for (uint32_t r = 0; r < R; r++) ql[r] = 0.0f;
            for (uint32_t dd = 0; dd < dn; dd++) {
                const uint16_t *row = wuk + (size_t)dd * R;
                float qv = qn[dd];
                for (uint32_t r = 0; r < R; r++) ql[r] = ql[r] + qv * bf16f(row[r]);
            }
            float mx = -INFINITY;
            for (uint32_t tau = 0; tau < np; tau++) {
                s[tau] = (k3v_dot(ql, md->cc + (size_t)tau * R, R) + k3v_dot(qr, md->ckr + (size_t)tau * dr, dr)) * scale;
                if (s[tau] > mx) mx = s[tau];
            }
            double sum = 0;
            for (uint32_t tau = 0; tau < np; tau++) { s[tau] = k3_expf(s[tau] - mx); sum += s[tau]; }
            for (uint32_t r = 0; r < R; r++) ol[r] = 0.0f;
            for (uint32_t tau = 0; tau < np; tau++) {
                float pr = (float)(s[tau] / sum);
                const float *cr = md->cc + (size_t)tau * R;
                for (uint32_t r = 0; r < R; r++) ol[r] = ol[r] + pr * cr[r];
            }
            k3_mat uv = {.enc = K3_ENC_BF16, .rows = dv, .cols = R, .data = wuk + (size_t)dn * R};
            k3_matmul_rows(K3_ISA_SCALAR, &uv, ol, R, 1, md->o + (size_t)hh * dv, dv, 0, dv);
        }
        return;
    }
    #pragma omp parallel                                              /* model_attn.c's mla_attend, one token */
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        uint32_t ha, hb, a, b;
        share(Hm, 1, tid, nth, &ha, &hb);
        for (uint32_t hh = ha; hh < hb; hh++)
            k3_mla_qhat(isa, md->ql + (size_t)hh * R, md->qall + (size_t)hh * qd, md->kvb + (size_t)hh * (dn + dv) * R, R, dn, R);
        #pragma omp barrier
        share(np, 4, tid, nth, &a, &b);
        k3_mla_scores(isa, md->s, N, md->ql, R, md->qall + dn, qd, Hm, md->cc, md->ckr, a, b, R, dr, scale);
        #pragma omp barrier
        for (uint32_t hh = ha; hh < hb; hh++) k3_mla_softmax(isa, md->s + (size_t)hh * N, np);
        #pragma omp barrier
        share(R, 8, tid, nth, &a, &b);
        k3_mla_values(isa, md->ol, R, md->s, N, Hm, md->cc, np, R, a, b);
        #pragma omp barrier
        for (uint32_t hh = ha; hh < hb; hh++) {
            k3_mat uv = {.enc = K3_ENC_BF16, .rows = dv, .cols = R, .data = md->kvb + ((size_t)hh * (dn + dv) + dn) * R};
            k3_matmul_rows(isa, &uv, md->ol + (size_t)hh * R, R, 1, md->o + (size_t)hh * dv, dv, 0, dv);
        }
    }
}

static void report(const char *part, const char *path, int threads, uint32_t N, double sec, double flop,
                   double bytes, double pk_fma, double pk_ma)
{
    double gf = flop / sec / 1e9;
    char gbs[32] = "-";
    if (bytes > 0) snprintf(gbs, sizeof gbs, "%.1f", bytes / sec / 1e9);
    printf("| %s | %s | %d | %u | %.2f s | %.1f | %.2f | %.3f | %.3f | %s |\n", part, path, threads, N, sec, flop / 1e9, gf,
           gf / pk_fma, gf / pk_ma, gbs);
}

int main(int argc, char **argv)
{
    const shape *z = &shapes[0];
    uint32_t N = 8192, samples = 0, B = 64;
    int threads = omp_get_num_procs(), reps = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--preset") && i + 1 < argc) {
            i++;
            z = !strcmp(argv[i], "k3") ? &shapes[1] : &shapes[0];
        } else if (!strcmp(argv[i], "-n") && i + 1 < argc) N = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--samples") && i + 1 < argc) samples = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_attn [--preset small|k3] [-n N] [-t THREADS] [--samples S] [--batch B] [--reps N]\n");
            return 2;
        }
    }
    if (!samples) samples = z->Hm > 16 ? 8 : 32;
    if (N < samples || B < 1 || reps < 1) { fprintf(stderr, "bench_attn: -n must be >= --samples, --batch >= 1\n"); return 2; }
    int have_avx2 = k3_isa_supported(K3_ISA_AVX2);
    omp_set_num_threads(threads);
    double pk_fma = have_avx2 ? peak(1, threads) : NAN, pk_ma = have_avx2 ? peak(0, threads) : NAN;
    printf("%s shapes: KDA %u heads x %u, %u layers; MLA %u heads, R %u, dr %u, dn %u, dv %u, %u layers; "
           "prompt %u tokens, %d threads\n", z->name, z->H, z->K, z->n_kda, z->Hm, z->R, z->dr, z->dn, z->dv,
           z->n_mla, N, threads);
    printf("fp32 peak, %d threads: FMA %.1f GFLOPS, multiply then add %.1f GFLOPS\n\n", threads, pk_fma, pk_ma);
    printf("| part (all layers) | path | threads | prompt tokens | time | GFLOP | GFLOPS | of FMA peak | of mul+add peak | cache read GB/s |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    static const char *names[3] = {"before", "scalar", "avx2"};
    int nv = have_avx2 ? 3 : 2;

    /* KDA: B-token passes on fresh copies of one state; flops 7 K^2 per token and head (decay
       K^2 multiplies; S^T k, k u^T and S^T q K^2 multiply-adds each) */
    {
        uint32_t H = z->H, K = z->K, C = H * K, passes = z->H > 16 ? 1 : 4;
        float *S0 = xalloc((size_t)H * K * K * 4), *S = xalloc((size_t)H * K * K * 4);          /* [H][K][K] */
        float *g = xalloc((size_t)B * C * 4), *k = xalloc((size_t)B * C * 4), *v = xalloc((size_t)B * C * 4);  /* [B][C] */
        float *q = xalloc((size_t)B * C * 4), *e = xalloc((size_t)B * C * 4), *beta = xalloc((size_t)B * H * 4); /* [B][H] */
        float *o[3], *Sv[3], *ks = xalloc((size_t)H * K * 4);                                    /* [H][K] */
        for (size_t i = 0; i < (size_t)H * K * K; i++) S0[i] = 0.1f * unif();
        for (size_t i = 0; i < (size_t)B * C; i++) {
            g[i] = -0.5f * (1.0f + unif()); v[i] = unif();
            k[i] = unif() / sqrtf((float)K); q[i] = unif() / sqrtf((float)K);
        }
        for (size_t i = 0; i < (size_t)B * H; i++) beta[i] = 0.5f + 0.5f * unif();
        for (int vi = 0; vi < nv; vi++) {
            o[vi] = xalloc((size_t)B * C * 4); Sv[vi] = xalloc((size_t)H * K * K * 4);         /* [B][C], [H][K][K] */
            double tok = 1e30;
            for (int r = 0; r < reps; r++) {                          /* the best of reps (shared machines) */
                memcpy(S, S0, (size_t)H * K * K * 4);
                double tr = kda_time(vi, z, B, passes, S, g, k, v, q, beta, e, o[vi], ks);
                if (tr < tok) tok = tr;
            }
            memcpy(Sv[vi], S, (size_t)H * K * K * 4);
            double sec = tok * N * z->n_kda, flop = 7.0 * K * K * H * (double)N * z->n_kda;
            char path[32];
            snprintf(path, sizeof path, "%s, batch %u", names[vi], B);
            report("KDA recurrence", path, threads, N, sec, flop, 0, pk_fma, pk_ma);
        }
        for (int vi = 1; vi < nv; vi++)
            if (memcmp(o[vi], o[0], (size_t)B * C * 4) || memcmp(Sv[vi], Sv[0], (size_t)H * K * K * 4))
                printf("KDA: %s differs from before\n", names[vi]);
    }

    /* MLA: flops per head: 2 (R + dr) + 2 R per position pair (scores, values), 2 (dn + dv) R per
       token (q_hat, W_UV) */
    {
        uint32_t Hm = z->Hm, R = z->R, dr = z->dr, dn = z->dn, dv = z->dv;
        mla_data md;
        float *cc = xalloc((size_t)N * R * 4), *ckr = xalloc((size_t)N * dr * 4);             /* [N][R], [N][dr] */
        float *qall = xalloc((size_t)Hm * (dn + dr) * 4);                                      /* [Hm][dn + dr] */
        uint16_t *kvb = xalloc((size_t)Hm * (dn + dv) * R * 2);                                /* [Hm(dn+dv)][R] */
        for (size_t i = 0; i < (size_t)N * R; i++) cc[i] = unif();
        for (size_t i = 0; i < (size_t)N * dr; i++) ckr[i] = unif();
        for (size_t i = 0; i < (size_t)Hm * (dn + dr); i++) qall[i] = unif();
        for (size_t i = 0; i < (size_t)Hm * (dn + dv) * R; i++) {
            float f = 0.05f * unif();
            uint32_t u;
            memcpy(&u, &f, 4);
            kvb[i] = (uint16_t)(u >> 16);
        }
        md.cc = cc; md.ckr = ckr; md.qall = qall; md.kvb = kvb;
        md.ql = xalloc((size_t)Hm * R * 4); md.s = xalloc((size_t)Hm * N * 4); md.ol = xalloc((size_t)Hm * R * 4);
        float *ov[3];
        double pairs = (double)N * (N + 1) / 2;
        double flop = Hm * (pairs * (4.0 * R + 2.0 * dr) + (double)N * 2.0 * (dn + dv) * R) * z->n_mla;
        double bytes = pairs * (2.0 * R + dr) * 4 * z->n_mla;         /* the cache, read for the scores and the values */
        for (int vi = 0; vi < nv; vi++) {
            ov[vi] = xalloc((size_t)Hm * dv * 4);                                              /* [Hm][dv] */
            md.o = ov[vi];
            double best = 1e30;
            for (int r = 0; r < reps; r++) {
                double t0 = now();
                for (uint32_t j = 0; j < samples; j++) mla_token(vi, z, N, &md, (uint32_t)(((double)j + 0.5) * N / samples));
                if (now() - t0 < best) best = now() - t0;
            }
            double sec = best * N / samples * z->n_mla;
            report("MLA attention", names[vi], threads, N, sec, flop, bytes, pk_fma, pk_ma);
        }
        for (int vi = 1; vi < nv; vi++)
            if (memcmp(ov[vi], ov[0], (size_t)Hm * dv * 4)) printf("MLA: %s differs from before\n", names[vi]);
    }
    xfree_all();
    return 0;
}

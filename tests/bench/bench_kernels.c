/*
 * bench_kernels.c - speed of the matrix products (k3run/kern.h) against this
 * machine's limits, all measured in the same run:
 *   (a) memory read bandwidth: a STREAM-like read (AVX2 loads) of a 1 GiB
 *       buffer, 1 and 2 threads;
 *   (b) the fp32 FMA peak: independent register-only FMA chains;
 *   (c) matrix-vector on weights that stream from memory: BF16 12288x7168
 *       (K3's q_proj), the same as Q8 (the compact trunk, k3pack --trunk q8)
 *       and MXFP4 16 experts x (3072x3584 gate, up; 3584x3072 down),
 *       distinct matrices, GB/s of weight bytes and ratio to (a);
 *   (d) the same kernel on a cache-resident 256 KiB matrix, repeated: its
 *       instruction-throughput bound; (c) as a ratio to min((a), (d));
 *   (e) matrix-matrix for batches 1, 2, 4, 8, 16, 32, 64 (--quick: 1, 4, 16, 64; K3_BENCH_BATCHES=2,3,5:
 *       exactly those) in GFLOPS, ratio
 *       to (b) and to the bound min((b), (a) x flops per weight byte), x packed as the engine does;
 *   (f) for every path the CPU has (scalar on smaller matrices).
 * Prints one Markdown table (docs/PERFORMANCE.md, "Kernels").
 *
 *   build/bench/bench_kernels [--isa NAME] [--quick]
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "k3_shard.h"
#include "kern.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static void *xalloc(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0) {
        fprintf(stderr, "bench_kernels: out of memory (%zu bytes)\n", n);
        exit(3);
    }
    return p;
}

static int quick;

/* ---- (a) memory read bandwidth ---- */
__attribute__((target("avx2"))) static uint64_t read_avx2(const char *p, size_t n)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    return (uint64_t)_mm256_extract_epi64(a0, 0) ^ (uint64_t)_mm256_extract_epi64(a0, 3);
}

static double bandwidth(int threads)
{
    size_t n = (size_t)1 << 30;
    char *buf = xalloc(n);
    memset(buf, 1, n);
    double best = 1e30;
    uint64_t sink = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        #pragma omp parallel num_threads(threads) reduction(^ : sink)
        {
            size_t per = n / (size_t)threads;
            sink ^= read_avx2(buf + per * (size_t)omp_get_thread_num(), per);
        }
        double t = now() - t0;
        if (t < best) best = t;
    }
    free(buf);
    if (sink == 42) fprintf(stderr, " ");
    return (double)n / best / 1e9;
}

/* ---- (b) FMA peak: 10 independent chains per thread ---- */
#define FMA_CHAINS(V, FMA, SET1, W) do { \
    V m = SET1(0.999999f), c = SET1(1e-7f); \
    V a0 = SET1(1), a1 = SET1(2), a2 = SET1(3), a3 = SET1(4), a4 = SET1(5); \
    V a5 = SET1(6), a6 = SET1(7), a7 = SET1(8), a8 = SET1(9), a9 = SET1(10); \
    for (long i = 0; i < iters; i++) { \
        a0 = FMA(a0, m, c); a1 = FMA(a1, m, c); a2 = FMA(a2, m, c); a3 = FMA(a3, m, c); \
        a4 = FMA(a4, m, c); a5 = FMA(a5, m, c); a6 = FMA(a6, m, c); a7 = FMA(a7, m, c); \
        a8 = FMA(a8, m, c); a9 = FMA(a9, m, c); \
    } \
    float out[W]; \
    V s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9; \
    memcpy(out, &s, sizeof out); \
    return out[0] + out[W - 1]; \
} while (0)

__attribute__((target("avx2,fma"))) static float fma_avx2(long iters)
{
    FMA_CHAINS(__m256, _mm256_fmadd_ps, _mm256_set1_ps, 8);
}

__attribute__((target("avx512f"))) static float fma_avx512(long iters)
{
    FMA_CHAINS(__m512, _mm512_fmadd_ps, _mm512_set1_ps, 16);
}

static double fma_peak(int width, int threads)   /* GFLOPS */
{
    long iters = quick ? 20000000 : 50000000;
    double t0 = now();
    float sink = 0;
    #pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += width == 16 ? fma_avx512(iters) : fma_avx2(iters);
    double t = now() - t0;
    if (sink == 42) fprintf(stderr, " ");
    return (double)iters * 10 * width * 2 * threads / t / 1e9;
}

/* ---- matrices ---- */
typedef struct bmat {
    k3_mat m;
    size_t bytes;    /* weight bytes including scales */
} bmat;

static bmat make(int enc, uint32_t rows, uint32_t cols)
{
    bmat b;
    memset(&b, 0, sizeof b);
    b.m.enc = enc;
    b.m.rows = rows;
    b.m.cols = cols;
    if (enc == K3_ENC_BF16) {
        uint16_t *d = xalloc((size_t)rows * cols * 2);     /* [rows][cols] */
        for (size_t i = 0; i < (size_t)rows * cols; i++)
            d[i] = (uint16_t)(0x3c00 + (rnd32() & 0x3ff) + ((rnd32() & 1) << 15));
        b.m.data = d;
        b.bytes = (size_t)rows * cols * 2;
    } else if (enc == K3_ENC_Q8) {
        int8_t *d = xalloc((size_t)rows * cols);           /* [rows][cols] codes */
        uint8_t *s = xalloc((size_t)rows * cols / 32);     /* [rows][cols/32] scales */
        for (size_t i = 0; i < (size_t)rows * cols; i++) d[i] = (int8_t)(rnd32() % 255 - 127);
        for (size_t i = 0; i < (size_t)rows * cols / 32; i++) s[i] = (uint8_t)(118 + rnd32() % 8);
        b.m.data = d;
        b.m.scales = s;
        b.bytes = (size_t)rows * cols + (size_t)rows * cols / 32;
    } else {
        uint8_t *d = xalloc((size_t)rows * cols / 2);      /* [rows][cols/2] */
        uint8_t *s = xalloc((size_t)rows * cols / 32);     /* [rows][cols/32] */
        for (size_t i = 0; i < (size_t)rows * cols / 2; i++) d[i] = (uint8_t)rnd32();
        for (size_t i = 0; i < (size_t)rows * cols / 32; i++) s[i] = (uint8_t)(118 + rnd32() % 8);
        b.m.data = d;
        b.m.scales = s;
        b.bytes = (size_t)rows * cols / 2 + (size_t)rows * cols / 32;
    }
    return b;
}

static void drop(bmat *b)
{
    free((void *)b->m.data);
    free((void *)b->m.scales);
}

/* y = W x over a set of matrices, best of reps: seconds */
static double time_mv(k3_isa isa, bmat *ms, int nm, const float *x, float *y, int threads, int reps)
{
    double best = 1e30;
    omp_set_num_threads(threads);
    for (int rep = 0; rep < reps; rep++) {
        double t0 = now();
        for (int i = 0; i < nm; i++) k3_matmul(isa, &ms[i].m, x, ms[i].m.cols, 1, y, ms[i].m.rows);
        double t = now() - t0;
        if (t < best) best = t;
    }
    return best;
}

/* the cache-resident bound: each thread repeats its own half of a small matrix */
static double bound_mv(k3_isa isa, bmat *b, const float *x, float *y, int threads)
{
    int reps = isa == K3_ISA_SCALAR ? 3 : (quick ? 200 : 1000);
    double best = 1e30;
    for (int trial = 0; trial < 3; trial++) {
        double t0 = now();
        #pragma omp parallel num_threads(threads)
        {
            uint32_t per = b->m.rows / (uint32_t)threads, r0 = per * (uint32_t)omp_get_thread_num();
            for (int rep = 0; rep < reps; rep++)
                k3_matmul_rows(isa, &b->m, x, b->m.cols, 1, y, b->m.rows, r0, r0 + per);
        }
        double t = (now() - t0) / reps;
        if (t < best) best = t;
    }
    return (double)b->bytes / best / 1e9;
}

static void row(const char *what, const char *isa, int threads, const char *result, const char *ratio)
{
    printf("| %s | %s | %d | %s | %s |\n", what, isa, threads, result, ratio);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--peak")) {        /* for scripts: the 256-bit FMA peaks only */
            printf("%.1f %.1f\n", fma_peak(8, 1), fma_peak(8, 2));
            return 0;
        }
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) only = argv[++i];
        else {
            fprintf(stderr, "usage: bench_kernels [--isa scalar|avx2|avx512] [--quick] [--peak]\n");
            return 2;
        }
    }
    char res[96], rat[160];
    double bw[3], peak256[3] = { 0 }, peak512[3] = { 0 };
    printf("| measurement | path | threads | result | ratio |\n|---|---|---|---|---|\n");
    for (int th = 1; th <= 2; th++) {
        bw[th] = bandwidth(th);
        snprintf(res, sizeof res, "%.1f GB/s", bw[th]);
        row("(a) memory read bandwidth, 1 GiB, AVX2 loads", "-", th, res, "1.00");
    }
    for (int th = 1; th <= 2; th++) {
        peak256[th] = fma_peak(8, th);
        snprintf(res, sizeof res, "%.1f GFLOPS", peak256[th]);
        row("(b) fp32 FMA peak, 256-bit", "-", th, res, "1.00");
        if (k3_isa_supported(K3_ISA_AVX512)) {
            peak512[th] = fma_peak(16, th);
            snprintf(res, sizeof res, "%.1f GFLOPS", peak512[th]);
            row("(b) fp32 FMA peak, 512-bit", "-", th, res, "1.00");
        }
    }

    /* the matrices: big ones stream from memory, small ones stay in cache */
    int nexp = quick ? 4 : 16;
    bmat q = make(K3_ENC_BF16, 12288, 7168), q8 = make(K3_ENC_Q8, 12288, 7168);
    bmat *ex = malloc(sizeof(bmat) * 3 * (size_t)nexp);
    size_t exbytes = 0;
    for (int e = 0; e < nexp; e++) {
        ex[3 * e] = make(K3_ENC_MXFP4, 3072, 3584);       /* gate */
        ex[3 * e + 1] = make(K3_ENC_MXFP4, 3072, 3584);   /* up */
        ex[3 * e + 2] = make(K3_ENC_MXFP4, 3584, 3072);   /* down */
        exbytes += ex[3 * e].bytes + ex[3 * e + 1].bytes + ex[3 * e + 2].bytes;
    }
    bmat qs = make(K3_ENC_BF16, 64, 2048);                /* 256 KiB */
    bmat es = make(K3_ENC_MXFP4, 64, 7168);               /* 243 KiB */
    bmat q8s = make(K3_ENC_Q8, 64, 4096);                 /* 264 KiB */
    float *x = xalloc((size_t)64 * 12288 * 4), *y = xalloc((size_t)64 * 12288 * 4);
    float *xp = xalloc((size_t)64 * 12288 * 4);          /* [64][cols] x packed (k3_xpack) */
    for (size_t i = 0; i < (size_t)64 * 12288; i++) x[i] = (float)((int)(rnd32() % 2001) - 1000) / 1000.0f;

    for (int isa = 0; isa < K3_ISA__COUNT; isa++) {
        if (!k3_isa_supported((k3_isa)isa)) {
            printf("| %s | %s | - | skipped: this CPU lacks it | - |\n", "all kernels", k3_isa_name((k3_isa)isa));
            continue;
        }
        if (only && strcmp(only, k3_isa_name((k3_isa)isa)) != 0) continue;
        const char *name = k3_isa_name((k3_isa)isa);
        int sc = isa == K3_ISA_SCALAR;
        for (int kind = 0; kind < 3; kind++) {            /* BF16, MXFP4, Q8 */
            static const char *const kname[3] = { "BF16", "MXFP4", "Q8" };
            /* (c), (d): matrix-vector; scalar runs on 1/32 of the rows (1 expert) */
            bmat *ms = kind == 0 ? &q : kind == 2 ? &q8 : ex;
            int nm = kind != 1 ? 1 : (sc ? 1 : 3 * nexp);
            size_t bytes = kind != 1 ? ms->bytes : (sc ? ex[0].bytes : exbytes);
            bmat part = *ms;
            if (sc) {
                part.m.rows = ms->m.rows / 32;
                part.bytes = ms->bytes / 32;
                bytes = part.bytes;
                ms = &part;
                nm = 1;
            }
            const char *label = kind == 0 ? "BF16 matvec 12288x7168" : kind == 2 ? "Q8 matvec 12288x7168"
                                                                                 : "MXFP4 matvec 16 experts gate+up+down";
            if (sc) label = kind == 0 ? "BF16 matvec 384x7168 (scalar: 1/32 of the rows)"
                          : kind == 2 ? "Q8 matvec 384x7168 (scalar: 1/32 of the rows)"
                                      : "MXFP4 matvec 96x3584 (scalar: 1/32 of one matrix)";
            else if (kind == 1 && nexp != 16) label = "MXFP4 matvec 4 experts gate+up+down (--quick)";
            char lab[160];
            for (int th = 1; th <= 2; th++) {
                double t = time_mv((k3_isa)isa, ms, nm, x, y, th, sc ? 2 : 5);
                double gbs = (double)bytes / t / 1e9;
                double bound = bound_mv((k3_isa)isa, kind == 0 ? &qs : kind == 2 ? &q8s : &es, x, y, th);
                double lim = bound < bw[th] ? bound : bw[th];
                snprintf(lab, sizeof lab, "(d) %s bound: same kernel, cache-resident 256 KiB", kname[kind]);
                snprintf(res, sizeof res, "%.1f GB/s", bound);
                snprintf(rat, sizeof rat, "%.2f of bandwidth", bound / bw[th]);
                row(lab, name, th, res, rat);
                snprintf(lab, sizeof lab, sc ? "(c) %s" : "(c) %s, from memory", label);
                snprintf(res, sizeof res, "%.1f GB/s (%.2f ms)", gbs, t * 1e3);
                snprintf(rat, sizeof rat, "%.2f of bandwidth, **%.2f of min(bandwidth, bound)**", gbs / bw[th], gbs / lim);
                row(lab, name, th, res, rat);
            }
            /* (e): matrix-matrix */
            static uint32_t batches[16] = { 1, 2, 4, 8, 16, 32, 64 };
            static int nb = 7, from_env = 0;
            const char *bt = getenv("K3_BENCH_BATCHES");     /* e.g. 2,3,4,5,6: exactly these */
            if (bt && !from_env) {
                nb = 0;
                for (const char *c = bt; *c && nb < 16;) {
                    uint32_t v = (uint32_t)strtoul(c, (char **)&c, 10);
                    if (v >= 1 && v <= 4096) batches[nb++] = v;
                    while (*c == ',') c++;
                    if (*c && (*c < '0' || *c > '9')) break;
                }
                from_env = 1;
            }
            bmat mm = kind == 0 ? q : kind == 2 ? q8 : ex[0];
            if (sc) mm.m.rows /= 32;
            for (int th = 1; th <= 2; th++) {
                double pk = isa == K3_ISA_AVX512 ? peak512[th] : peak256[th];
                for (int bi = 0; bi < nb; bi++) {
                    uint32_t T = batches[bi];
                    if (sc && T > 4) continue;
                    if (quick && !from_env && (T == 2 || T == 8 || T == 32)) continue;
                    double best = 1e30;
                    omp_set_num_threads(th);
                    for (int rep = 0; rep < (sc ? 1 : 3); rep++) {
                        double t0 = now();
                        /* as the engine multiplies a batch: x packed once per product */
                        int packed = k3_xpack((k3_isa)isa, x, mm.m.cols, T, mm.m.cols, xp);
                        k3_matmul_xp((k3_isa)isa, &mm.m, x, mm.m.cols, packed ? xp : NULL, T, y, mm.m.rows);
                        double t = now() - t0;
                        if (t < best) best = t;
                    }
                    double gf = 2.0 * mm.m.rows * mm.m.cols * T / best / 1e9;
                    /* the bound: the FMA peak, or reading the weights once at the bandwidth */
                    double bwb = bw[th] * 2.0 * mm.m.rows * mm.m.cols * T / (double)mm.bytes;
                    double lim = bwb < pk ? bwb : pk;
                    snprintf(lab, sizeof lab, "(e) %s matmul %ux%u, batch %u", kname[kind],
                             mm.m.rows, mm.m.cols, T);
                    snprintf(res, sizeof res, "%.1f GFLOPS", gf);
                    snprintf(rat, sizeof rat, "%.2f of FMA peak, **%.2f of min(peak, bandwidth)**", gf / pk,
                             gf / lim);
                    row(lab, name, th, res, rat);
                }
            }
        }
    }
    /* the limits again: on a shared machine they drift during the run */
    double bw_end[3], pk_end[3];
    for (int th = 1; th <= 2; th++) {
        bw_end[th] = bandwidth(th);
        pk_end[th] = fma_peak(8, th);
    }
    printf("\nLimits measured again at the end: bandwidth %.1f / %.1f GB/s, 256-bit FMA peak "
           "%.1f / %.1f GFLOPS (1 / 2 threads).\n", bw_end[1], bw_end[2], pk_end[1], pk_end[2]);
    for (int i = 0; i < 2; i++) {
        const double *b = i ? bw_end : bw, *p = i ? pk_end : peak256;
        if (p[2] < 1.6 * p[1] || b[2] < 1.1 * b[1])
            printf("Warning: at the %s, 2 threads reached only %.2fx the 1-thread FMA peak and %.2fx "
                   "the bandwidth: another process was using a core; 2-thread numbers are unreliable.\n",
                   i ? "end" : "start", p[2] / p[1], b[2] / b[1]);
    }
    drop(&q);
    drop(&q8);
    drop(&q8s);
    for (int e = 0; e < 3 * nexp; e++) drop(&ex[e]);
    free(ex);
    drop(&qs);
    drop(&es);
    free(x);
    free(y);
    free(xp);
    return 0;
}

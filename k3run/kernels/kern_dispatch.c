/*
 * kern_dispatch.c - which kernel path runs (k3_isa_*), and the matrix products
 * over OpenMP threads (k3_matmul) or on the calling thread (k3_matmul_rows).
 *
 * Every path computes every row in the canonical order (docs/KERNELS.md), so
 * how rows are split between threads cannot change a single bit: rows are cut
 * into fixed blocks of K3_KERN_BLOCK and the blocks shared statically.
 */
#include "kern.h"
#include "k3_shard.h"
#include "k3_par.h"

#include <stdio.h>
#include <string.h>

#define K3_KERN_PARALLEL_MIN 65536    /* multiply-adds below which one thread is used */

static const char *const k3_isa_names[K3_ISA__COUNT] = { "scalar", "avx2", "avx512" };

const char *k3_isa_name(k3_isa isa)
{
    if ((unsigned)isa >= K3_ISA__COUNT) return "unknown";
    return k3_isa_names[isa];
}

int k3_isa_supported(k3_isa isa)
{
    __builtin_cpu_init();                /* idempotent; the cpu model is libgcc's, read-only here */
    switch (isa) {
    case K3_ISA_SCALAR: return 1;
    case K3_ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case K3_ISA_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    default: return 0;
    }
}

k3_isa k3_isa_best(void)
{
    if (k3_isa_supported(K3_ISA_AVX512)) return K3_ISA_AVX512;
    if (k3_isa_supported(K3_ISA_AVX2)) return K3_ISA_AVX2;
    return K3_ISA_SCALAR;
}

/* "scalar, avx2" : the paths this CPU can run, for messages */
static void supported_list(char *buf, size_t n)
{
    buf[0] = 0;
    for (int i = 0; i < K3_ISA__COUNT; i++) {
        if (!k3_isa_supported((k3_isa)i)) continue;
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, "%s%s", len ? ", " : "", k3_isa_names[i]);
    }
}

k3_err k3_isa_choose(const char *value, k3_isa *out, k3_diag *d)
{
    char have[64];
    if (!value || !*value) {
        *out = k3_isa_best();
        return K3_OK;
    }
    for (int i = 0; i < K3_ISA__COUNT; i++) {
        if (strcmp(value, k3_isa_names[i]) != 0) continue;
        if (!k3_isa_supported((k3_isa)i)) {
            supported_list(have, sizeof have);
            return k3_fail(d, K3_ERR_USAGE, "K3_ISA=%s: this CPU lacks %s; it can run: %s", value,
                           i == K3_ISA_AVX512 ? "AVX-512 (F, BW, VL and DQ)" : "AVX2 and FMA", have);
        }
        *out = (k3_isa)i;
        return K3_OK;
    }
    supported_list(have, sizeof have);
    return k3_fail(d, K3_ERR_USAGE, "K3_ISA='%s': unknown path (expected scalar, avx2 or avx512; "
                   "this CPU can run: %s)", value, have);
}

void k3_matmul_rows_xp(k3_isa isa, const k3_mat *W, const float *x, size_t ldx, const float *xp,
                       uint32_t T, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    if (!k3_isa_supported(isa)) isa = K3_ISA_SCALAR;    /* same bits, only slower */
    switch (isa) {
    case K3_ISA_AVX512: k3_kern_rows_avx512(W, x, ldx, xp, T, y, ldy, r0, r1); break;
    case K3_ISA_AVX2: k3_kern_rows_avx2(W, x, ldx, xp, T, y, ldy, r0, r1); break;
    default: k3_kern_rows_scalar(W, x, ldx, NULL, T, y, ldy, r0, r1); break;
    }
}

void k3_matmul_rows(k3_isa isa, const k3_mat *W, const float *x, size_t ldx, uint32_t T,
                    float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    k3_matmul_rows_xp(isa, W, x, ldx, NULL, T, y, ldy, r0, r1);
}

int k3_xpack_used(k3_isa isa, uint32_t cols)
{
    return k3_isa_supported(isa) && isa != K3_ISA_SCALAR && cols >= 16;
}

int k3_xpack(k3_isa isa, const float *x, size_t ldx, uint32_t T, uint32_t cols, float *xp)
{
    if (!k3_xpack_used(isa, cols)) return 0;
    if (isa == K3_ISA_AVX512) k3_xpack_avx512(x, ldx, T, cols, xp);   /* kern_mm512.c's slot order */
    else k3_xpack_avx2(x, ldx, T, cols, xp);
    return 1;
}

void k3_matmul(k3_isa isa, const k3_mat *W, const float *x, size_t ldx, uint32_t T,
               float *y, size_t ldy)
{
    k3_matmul_xp(isa, W, x, ldx, NULL, T, y, ldy);
}

void k3_matmul_xp(k3_isa isa, const k3_mat *W, const float *x, size_t ldx, const float *xp,
                  uint32_t T, float *y, size_t ldy)
{
    const uint32_t rows = W->rows;
    const long nblocks = (long)((rows + K3_KERN_BLOCK - 1) / K3_KERN_BLOCK);
    const int big = (double)rows * W->cols * T >= K3_KERN_PARALLEL_MIN;
    K3_PFOR(big, for (long b = 0; b < nblocks; b++) {
        uint32_t r0 = (uint32_t)b * K3_KERN_BLOCK;
        uint32_t r1 = rows - r0 < K3_KERN_BLOCK ? rows : r0 + K3_KERN_BLOCK;
        k3_matmul_rows_xp(isa, W, x, ldx, xp, T, y, ldy, r0, r1);
    });
}

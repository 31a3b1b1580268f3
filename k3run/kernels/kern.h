/*
 * kern.h - the kernels room (k3run/kernels/): arithmetic with one answer on
 * every CPU. The matrix products here, the scalar math functions (k3_math.h)
 * and the parallel loop (k3_par.h) give the same bits on every ISA, thread
 * count and batch size. Nothing here includes a room above it.
 *
 * The matrix products: y = W x for BF16 and MXFP4 weights, one token
 * (matrix-vector) or a batch of tokens (matrix-matrix).
 *
 * THE CANONICAL SUMMATION ORDER (docs/KERNELS.md; every path follows it, so
 * results are bit-identical across ISAs, thread counts and batch sizes):
 *
 *   For every output element y[t][r] = sum_i W[r][i] * x[t][i], i < cols:
 *   - weight values are fp32: BF16 widened exactly; MXFP4 element
 *     w = fp32(E2M1(code)) * fp32(2^(scale-127)), one IEEE fp32 multiply (exact,
 *     or +-inf when it overflows, NaN for scale code 255);
 *   - 16 lanes: element i goes to lane i % 16; lane l starts at +0.0f and takes
 *     its elements in increasing i with a fused multiply-add,
 *         acc[l] = fmaf(w[i], x[i], acc[l]);
 *   - the 16 lanes are reduced by a fixed tree:
 *         a[j] = acc[j] + acc[j+8]  (j < 8)
 *         b[j] = a[j] + a[j+4]      (j < 4)
 *         c[j] = b[j] + b[j+2]      (j < 2)
 *         y    = c[0] + c[1]
 *   Nothing else (no pairwise blocking, no split-k) is allowed: a path that
 *   wants more independent chains processes several rows or tokens at once.
 */
#ifndef K3_KERN_H
#define K3_KERN_H

#include <stddef.h>
#include <stdint.h>

#include "k3_error.h"

typedef enum k3_isa { K3_ISA_SCALAR = 0, K3_ISA_AVX2 = 1, K3_ISA_AVX512 = 2, K3_ISA__COUNT } k3_isa;

const char *k3_isa_name(k3_isa isa);          /* "scalar", "avx2", "avx512" */
int k3_isa_supported(k3_isa isa);              /* this CPU (and OS) can run it */
k3_isa k3_isa_best(void);                      /* the fastest supported path */
/*
 * The path to use: value NULL or "" means k3_isa_best(); otherwise "scalar",
 * "avx2" or "avx512" (the K3_ISA environment variable). An unknown name, or a
 * path this CPU lacks, is K3_ERR_USAGE with a message saying what the CPU has.
 */
k3_err k3_isa_choose(const char *value, k3_isa *out, k3_diag *d);

/* A weight matrix [rows, cols], row-major, as stored in the pack. */
typedef struct k3_mat {
    int enc;                 /* K3_ENC_BF16, K3_ENC_MXFP4 or K3_ENC_Q8 (formats/k3_shard.h) */
    uint32_t rows, cols;     /* MXFP4: cols % 32 == 0 */
    const void *data;        /* BF16: uint16_t [rows][cols]; MXFP4: uint8_t [rows][cols/2],
                                element 2j in the low nibble of byte j */
    const uint8_t *scales;   /* MXFP4, Q8: E8M0 [rows][cols/32]; BF16: NULL. Q8: data is int8_t
                                [rows][cols], element = q * 2^(scale - 127) */
} k3_mat;

/*
 * y[t*ldy + r] = sum_i W[r][i] * x[t*ldx + i] for t < T, r < W->rows, in the
 * canonical order. x: [T][ldx] fp32, ldx >= cols; y: [T][ldy] fp32,
 * ldy >= rows; x and y do not overlap. Uses the OpenMP threads of the caller's
 * setting (rows are split between threads; the result does not depend on it).
 * Each weight byte is read from memory once per call, whatever T.
 */
void k3_matmul(k3_isa isa, const k3_mat *W, const float *x, size_t ldx, uint32_t T,
               float *y, size_t ldy);

/* Rows per unit of work between threads: k3_matmul cuts its rows into blocks of this many;
   callers that split several products themselves (engine/model_ops.c, model_ffn.c) cut the same. */
#define K3_KERN_BLOCK 32

/* The same for the rows [r0, r1) only, on the calling thread (no OpenMP). */
void k3_matmul_rows(k3_isa isa, const k3_mat *W, const float *x, size_t ldx, uint32_t T,
                    float *y, size_t ldy, uint32_t r0, uint32_t r1);

/*
 * A batch (T >= 2) multiplied by several matrices, or by one matrix in several row blocks:
 * the vector paths rearrange x within each 16-group before they multiply it (docs/KERNELS.md,
 * "Matrix-matrix"). k3_xpack does that once, into xp [T][k3_xpack_cols(cols)], for every product
 * of x with a matrix of `cols` columns (any encoding); it returns 0 and writes nothing where the
 * path does not use it (scalar, or cols < 16). The products then take xp beside x, which they
 * still read: for the tail of a row whose cols is not a multiple of 16, and for a single token
 * (the matrix-vector kernels do not read xp).
 */
/* floats per packed token: the 16-groups and one more, so that the tokens of a tile do not
   fall into the same L1 sets when cols is a multiple of 1024 (4 KiB apart) */
#define k3_xpack_cols(cols) ((cols) / 16u * 16u + 16u)
int k3_xpack(k3_isa isa, const float *x, size_t ldx, uint32_t T, uint32_t cols, float *xp);
int k3_xpack_used(k3_isa isa, uint32_t cols);   /* k3_xpack would pack (and the path read xp) */
void k3_matmul_xp(k3_isa isa, const k3_mat *W, const float *x, size_t ldx, const float *xp,
                  uint32_t T, float *y, size_t ldy);
void k3_matmul_rows_xp(k3_isa isa, const k3_mat *W, const float *x, size_t ldx, const float *xp,
                       uint32_t T, float *y, size_t ldy, uint32_t r0, uint32_t r1);

/* Per-ISA entry points (kern_scalar.c, kern_avx2.c, kern_avx512.c): rows [r0, r1); xp as
   k3_xpack wrote it, or NULL. */
void k3_kern_rows_scalar(const k3_mat *W, const float *x, size_t ldx, const float *xp, uint32_t T,
                         float *y, size_t ldy, uint32_t r0, uint32_t r1);
void k3_kern_rows_avx2(const k3_mat *W, const float *x, size_t ldx, const float *xp, uint32_t T,
                       float *y, size_t ldy, uint32_t r0, uint32_t r1);
void k3_kern_rows_avx512(const k3_mat *W, const float *x, size_t ldx, const float *xp, uint32_t T,
                         float *y, size_t ldy, uint32_t r0, uint32_t r1);
void k3_xpack_avx2(const float *x, size_t ldx, uint32_t T, uint32_t cols, float *xp);
/* kern_mm512.c: the AVX-512 matrix-matrix product (T >= 2; xp from k3_xpack_avx512, required) */
void k3_mm512(const k3_mat *W, const float *x, size_t ldx, const float *xp, uint32_t T, float *y,
              size_t ldy, uint32_t r0, uint32_t r1);
void k3_xpack_avx512(const float *x, size_t ldx, uint32_t T, uint32_t cols, float *xp);
/* the same for a few tokens (T >= 2, in parts of at most 6), weights decoded in registers; cols % 16 == 0 */
void k3_ft512(const k3_mat *W, const float *xp, uint32_t T, float *y, size_t ldy, uint32_t r0, uint32_t r1);
/* k3_mx_table[s][c]: the canonical fp32 weight of MXFP4 element code c (0-15) in a
   block of scale code s, e2m1(c) * 2^(s-127) as kern_scalar.c defines it (-0 for
   code 8, NaN for s = 255); filled before main() runs. [256 scale codes][16 codes] */
extern float k3_mx_table[256][16];

/*
 * For the tests only (kern_avx2.c): the AVX-512 path's structure (two rows per
 * vector, kern_simd.h with KS_NR 2) run on pairs of AVX2 registers, so that it
 * is checked bit for bit on CPUs without AVX-512. Needs AVX2 + FMA.
 */
void k3_kern_rows_avx2x2(const k3_mat *W, const float *x, size_t ldx, const float *xp, uint32_t T,
                         float *y, size_t ldy, uint32_t r0, uint32_t r1);

#endif

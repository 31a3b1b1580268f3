/*
 * k3_ckpt_check.h - does a safetensors checkpoint hold exactly the tensors
 * its config.json describes? Used by k3pack before anything is written and by
 * `k3verify --checkpoint`.
 *
 * Every expected tensor (k3_expected_tensors) must be present under
 * prefix + name with the expected dtype and shape (or numel, for the tensors
 * flagged K3_XT_ANY_SHAPE). Vision tensors (vision_tower.*, mm_projector.*,
 * with or without a prefix) are skipped. Anything else is unexpected.
 */
#ifndef K3_CKPT_CHECK_H
#define K3_CKPT_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "k3_config.h"
#include "k3_error.h"
#include "safetensors.h"

/* What became of each expected tensor, and of each checkpoint tensor. */
enum { K3_CK_OK = 0, K3_CK_MISSING, K3_CK_MISMATCH };       /* x_status */
enum { K3_CK_UNEXPECTED = 0, K3_CK_EXPECTED, K3_CK_SKIPPED };  /* src_status */

typedef struct k3_ckpt_match {
    const k3_st_tensor **src;   /* [xlist.n] source tensor of each expected tensor (NULL unless OK) */
    uint8_t *x_status;          /* [xlist.n] K3_CK_OK / MISSING / MISMATCH */
    const k3_st_tensor **found; /* [xlist.n] the checkpoint tensor of that name, even if mismatched */
    uint8_t *src_status;        /* [ckpt->n_tensors] K3_CK_EXPECTED / SKIPPED / UNEXPECTED */
    size_t *skipped;            /* [n_skipped] indices into ckpt->tensors (vision) */
    size_t n_skipped;
    size_t n_missing, n_mismatch, n_unexpected;
} k3_ckpt_match;

/* One line per problem, e.g. "tensor 'x' is missing"; ctx is passed through. */
typedef void (*k3_problem_fn)(void *ctx, const char *msg);

/* The pack encoding that stores a checkpoint dtype bit for bit (K3_ENC_*), or 0. */
int k3_enc_from_dtype(int dtype);
/* The safetensors dtype that names a pack encoding (MXFP4 -> F4, E8M0 -> F8_E8M0). */
int k3_dtype_from_enc(int enc);

/* One entry a checkpoint tensor becomes in a pack (docs/FORMAT.md 2.3, 3, 4). */
typedef struct k3_pack_part {
    char name[256];              /* entry name: the tensor name, or the record part name; a manifest
                                    name is at most 255 bytes (K3's longest is 64) */
    int enc;                     /* K3_ENC_* */
    int ndim;
    uint64_t shape[4];
} k3_pack_part;

/*
 * How checkpoint tensor x is stored in a pack; name is the entry name (for an
 * expert: the part after "experts.E."). An MXFP4 expert's U8 weight_packed
 * [r, c/2] becomes MXFP4 [r, c] and its weight_scale E8M0; with quantize, a
 * BF16 expert "wX.weight" [r, c] becomes two parts, "wX.weight_packed" MXFP4
 * [r, c] and "wX.weight_scale" E8M0 [r, c/32]; anything else is a copy in its
 * own encoding. Returns the number of parts (1 or 2), 0 if the dtype cannot
 * be stored, -1 if a quantized weight is not 2-D with columns a multiple of 32, -2 if
 * the name (with a part suffix) would not fit k3_pack_part.name.
 */
int k3_pack_parts(const k3_xtensor *x, const char *name, int expert, int quantize, k3_pack_part out[2]);

/*
 * 1 if a compact trunk (k3pack --trunk q8, FORMAT.md 3) stores this checkpoint tensor as Q8: a
 * 2-D BF16 matrix of more than one row and a multiple of 32 columns that a token multiplies,
 * i.e. not the embedding, a norm, a bias, the router (gate.weight), the KDA decay and beta gates
 * (f_a_proj, f_b_proj, b_proj), A_log, a convolution, kv_b_proj (absorbed per head), the
 * Attention-Residual projections, a routed expert. tests/reference/trunk_quant.py has the same
 * list (its quantizable()).
 */
int k3_trunk_q8_eligible(const char *name, int dtype, int rank, const uint64_t *shape);

/* 1 if name (full checkpoint name) belongs to the vision tower. */
int k3_is_vision_tensor(const char *name);

/*
 * Match ck against xl. Reports each problem through fn (may be NULL). Returns
 * K3_ERR_MODEL if anything is missing, mismatched or unexpected (the message
 * in d summarises the counts and names the first problem), K3_OK otherwise.
 */
k3_err k3_ckpt_match_config(const k3_st_ckpt *ck, const k3_config *cfg, const k3_xlist *xl,
                            k3_problem_fn fn, void *ctx, k3_ckpt_match *out, k3_diag *d);
void k3_ckpt_match_free(k3_ckpt_match *m);

#endif

/*
 * model.h - the Kimi K3 text model (spec K3-ARCHITECTURE.md §4) in fp32 over
 * the pack's exact weights: KDA and MLA attention, block Attention Residuals,
 * dense SiTU FFN, latent MoE, final norm and lm_head. Everything comes from
 * the config; nothing about K3's sizes is written here.
 *
 * A forward call processes T <= max_batch new tokens after the current
 * position. A prompt fed in one call and fed token by token give the same
 * bits: every per-token computation is the same code in the same order, and
 * the matrix kernels (kern.h) follow one canonical order whatever T is.
 * All buffers are allocated by k3_model_new; forward never allocates.
 */
#ifndef K3_MODEL_H
#define K3_MODEL_H

#include <stdint.h>

#include "k3_error.h"
#include "kern.h"
#include "weights.h"

typedef struct k3_model_opts {
    uint32_t max_batch;      /* tokens per forward call (prompt batches) */
    uint32_t context;        /* positions the MLA latent cache holds */
    k3_isa isa;              /* kernel path */
    int all_logits;          /* compute logits for every token of a batch (dumps), not only the last */
    /* optional hook: every intermediate the reference dumps (attn_out, ffn_out, out per layer,
       final_hidden, logits as [T][width] fp32; experts / expert_weights as [T][k]) */
    void (*dump)(void *ctx, const char *name, int layer, uint32_t T, uint32_t width,
                 const float *f, const int32_t *ids);
    void *dump_ctx;
} k3_model_opts;

typedef struct k3_model k3_model;

k3_err k3_model_new(k3_weights *w, const k3_model_opts *o, k3_model **out, k3_diag *d);
void k3_model_free(k3_model *m);

/* Forget the sequence: position 0, KDA states and MLA cache cleared. */
void k3_model_reset(k3_model *m);

/* Process ids[0..T) at the current position; then k3_model_logits is the last token's. */
k3_err k3_model_forward(k3_model *m, const int32_t *ids, uint32_t T, k3_diag *d);

const float *k3_model_logits(const k3_model *m);   /* [vocab] fp32, the last processed token */
/* With all_logits: row i (token i of the last forward call) of its [T][vocab] logits. */
const float *k3_model_logits_row(const k3_model *m, uint32_t i);
uint32_t k3_model_n_logits(const k3_model *m);      /* rows the last forward call computed */
uint32_t k3_model_vocab(const k3_model *m);
uint32_t k3_model_pos(const k3_model *m);
uint32_t k3_model_context(const k3_model *m);
uint32_t k3_model_max_batch(const k3_model *m);
uint64_t k3_model_scratch_bytes(const k3_model *m); /* buffers + states + cache */

/* What k3_model_new allocates for a config, batch and context, without a model: model_shape.h. */

#endif

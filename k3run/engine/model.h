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
    uint32_t max_verify;     /* tokens of a verify pass (k3_model_verify), <= max_batch; 0: none */
    uint32_t n_seq;          /* sequences held (model.h "Sequences"); 0 or 1: one */
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
uint32_t k3_model_max_verify(const k3_model *m);
uint64_t k3_model_scratch_bytes(const k3_model *m); /* buffers + states + cache */

/*
 * Verify (speculative decoding). k3_model_verify processes ids[0..T)
 * (T <= max_verify) as forward would, with logits for every token, but
 * leaves the position and the KDA states as they were and records what
 * their update needs (per token and KDA layer: the conv inputs, k, v, the
 * forget gate and beta). k3_model_commit(m, n) then keeps the first n
 * tokens (1..T): the KDA updates of those n are replayed from the record in
 * the order forward runs them, so the state is bit for bit what forward of
 * ids[0..n) leaves, and no weight is read; the MLA cache needs nothing (rows
 * past pos + n are simply not visible). Between the two, only
 * k3_model_logits_row may be called. After the commit, k3_model_logits is
 * row n - 1's.
 */
/* Experts across MPI ranks (dist.h, model_dist.c). On a rank other than 0: serve rank 0's MoE
   work with this rank's experts until rank 0 stops (K3_OK) or an exchange fails. On rank 0: tell
   the other ranks to stop (before the model is freed; nothing on one rank). */
k3_err k3_model_serve_experts(k3_model *m, k3_diag *d);
void k3_model_dist_stop(k3_model *m);

k3_err k3_model_verify(k3_model *m, const int32_t *ids, uint32_t T, k3_diag *d);
k3_err k3_model_commit(k3_model *m, uint32_t n, k3_diag *d);

/*
 * State (model_state.c). A position's state is the KDA conv windows and
 * recurrent matrices, the MLA latent cache rows [0, pos) and the last token's
 * logits. The cache is append-only, so returning to an earlier position needs
 * only the KDA state of then: a snapshot (k3_model_snap_bytes: the KDA state
 * and one logits row; for real K3 about 443 MiB) restores it, and truncates
 * the cache by moving pos back. A snapshot taken at p stays valid while no
 * position below p is overwritten, that is until a restore to a position < p
 * is followed by a forward pass.
 */
typedef struct k3_model_snap k3_model_snap;
uint64_t k3_model_snap_bytes(const k3_model *m);
k3_err k3_model_snap_new(const k3_model *m, k3_model_snap **out, k3_diag *d);
void k3_model_snap_free(k3_model_snap *s);
void k3_model_snap_take(const k3_model *m, k3_model_snap *s);            /* at the current position */
uint32_t k3_model_snap_pos(const k3_model_snap *s);                       /* UINT32_MAX: empty */
k3_err k3_model_snap_restore(k3_model *m, const k3_model_snap *s, k3_diag *d);  /* s's pos <= the current */
void k3_model_snap_copy(k3_model_snap *dst, const k3_model_snap *src);    /* of one model */

/* The state as named parts, for session files: for each layer in order "kda.L.win" [3][C][W-1]
   and "kda.L.S" [H][K][K], or "mla.L.c" [pos][R] and "mla.L.kr" [pos][dr]; then "logits" [V]
   (the last token's). data points into the model's own buffers: read them to save; to load,
   k3_model_state_set_pos first, then fill every part. */
typedef struct k3_state_part {
    char name[32];
    void *data;
    uint64_t bytes;
} k3_state_part;
uint32_t k3_model_state_nparts(const k3_model *m);
k3_err k3_model_state_part(k3_model *m, uint32_t i, uint32_t pos, k3_state_part *p, k3_diag *d);
k3_err k3_model_state_set_pos(k3_model *m, uint32_t pos, k3_diag *d);

/*
 * Sequences. A model made with n_seq > 1 holds that many sequences, each with
 * its own position, KDA states, MLA cache, verify record and last logits: the
 * state of one conversation. k3_model_seq(m, s) is sequence s's handle (s = 0
 * is m itself); every call above made on a handle acts on its sequence alone,
 * and the buffers and weights are the model's. One pass can carry rows of
 * several sequences (k3_model_pass): the trunk's products and the MoE run once
 * over all of them (each weight read once per pass), the attention per
 * sequence. Every value of a row is computed by the same code in the same
 * order whatever else shares the pass, so each sequence's bits are the ones it
 * gets alone.
 */
k3_model *k3_model_seq(k3_model *m, uint32_t s);      /* NULL: s >= n_seq */
uint32_t k3_model_n_seq(const k3_model *m);
uint32_t k3_model_seq_index(const k3_model *m);        /* a handle's s */
/* A fork: dst's sequence becomes src's (position, KDA states, MLA cache rows, last logits), so
   what follows on either is what would follow on src. Handles of one model; neither in a pass,
   src with no verify pass open. */
k3_err k3_model_seq_copy(k3_model *dst, k3_model *src, k3_diag *d);
/* A fork at an earlier position: dst's sequence becomes src's as it was at snapshot at's position p
   (at taken on src, still valid: model_state.c), its MLA cache rows [0, p) from src and the rest from
   at. Only src's rows below p are read, so src may be in a pass that appends beyond them; dst in none. */
k3_err k3_model_seq_copy_at(k3_model *dst, k3_model *src, const k3_model_snap *at, k3_diag *d);

typedef struct k3_model_rows {
    k3_model *seq;           /* the sequence's handle (of this model) */
    const int32_t *ids;      /* [T] */
    uint32_t T;
    int verify;              /* 0: as k3_model_forward, 1: as k3_model_verify */
} k3_model_rows;
/* One pass over n groups of rows, each of a different sequence, sum of T <= max_batch: for each
   group exactly what k3_model_forward (or k3_model_verify) on its handle does. On failure no
   sequence moved. */
k3_err k3_model_pass(k3_model *m, const k3_model_rows *r, uint32_t n, k3_diag *d);

/* What k3_model_new allocates for a config, batch and context, without a model: model_shape.h. */

#endif

/*
 * model_impl.h - private to model*.c: the model's states and scratch buffers
 * (their sizes: model_shape.h), and the small fixed-order vector helpers
 * (model_ops.c) that the layers share.
 */
#ifndef K3_MODEL_IMPL_H
#define K3_MODEL_IMPL_H

#include "k3_config.h"
#include "k3_par.h"
#include "model.h"
#include "dist.h"
#include "model_shape.h"
#include "attn.h"          /* k3v_dot */

typedef struct kda_state {
    float *win;                   /* [3][C][W-1] last pre-conv q, k, v inputs, oldest first */
    float *S;                     /* [H][K][V=K] recurrent state */
    float *rec;                   /* [max_verify][KDA_REC(C, H)] a verify pass's update inputs (or NULL):
                                     pre-conv q, k, v [3][C], then k, v, g [3][C], beta [H] */
} kda_state;

/* Floats per token of a KDA layer's verify record, and where each part starts in it. */
#define KDA_REC(C, H) (6u * (C) + (H))
enum { KDA_REC_PRE = 0, KDA_REC_K = 3, KDA_REC_V = 4, KDA_REC_G = 5, KDA_REC_BETA = 6 };   /* x C */

/* One sequence's state (model.h "Sequences"): everything a conversation owns. */
typedef struct k3_seq {
    uint32_t pos;                 /* tokens processed */
    uint32_t open;                /* tokens of a verify pass not yet committed (0: none) */
    uint32_t n_logits, lrow;      /* logits rows of its last pass: m->logits rows [lrow, lrow + n_logits) */
    float *last;                  /* [V] the last processed token's logits (kept while other sequences pass) */
    kda_state *kda;               /* [L] (NULL buffers for MLA layers) */
    float *mla_c;                 /* [n_mla][context][R] normed latents */
    float *mla_kr;                /* [n_mla][context][dr] raw k_rope */
} k3_seq;

/* A pass's rows of one sequence: rows [row0, row0 + T) of the pass are ids[0 .. T). */
typedef struct k3_group {
    k3_seq *sq;
    const int32_t *ids;           /* [T] */
    uint32_t row0, T;
    int verify;                   /* a verify pass (model.h "Verify"): KDA layers record, their states stay */
} k3_group;

/* A model is its owner (owner NULL: the buffers, the weights, sequence 0) or a handle of one of
   its other sequences (k3_model_seq: only owner and sq are set). */
struct k3_model {
    struct k3_model *owner;       /* a handle's model, NULL in the model itself */
    k3_seq *sq;                   /* this handle's sequence */
    k3_seq *seqs;                 /* [n_seq] (the owner's) */
    struct k3_model *handles;     /* [n_seq] sequence s's handle (handles[0] unused: the owner is sequence 0) */
    const k3_group *grp;          /* [n_grp] the pass being computed */
    uint32_t n_grp;
    /* passes shared between threads (batch.h): a handle's forward, verify and commit go to
       hook(hook_ctx, ...) instead (op 0 forward, 1 verify, 2 commit of T tokens); NULL: each call
       runs its own pass. A pointer, so the model does not call the batcher that calls it. */
    k3_err (*hook)(void *ctx, k3_model *h, const int32_t *ids, uint32_t T, int op, k3_diag *d);
    void *hook_ctx;

    k3_weights *w;
    const k3_config *cfg;
    k3_model_opts o;
    k3_dims d;
    float *kda_work;              /* [H][K][K] a verify pass's working copy of one layer's S (or NULL) */
    int32_t *mla_slot;            /* [L] index of a layer's MLA cache, -1 for KDA layers */

    /* residual stream, [B][D] each (B = max_batch) */
    float *h, *a_in, *x, *att, *m_in, *f;
    float *blocks;                /* [n_blocks][B][D] frozen AttnRes blocks */
    float *vec;                   /* [vmax = max(D, C, Q, R, Dl)] a norm / query vector as fp32 */
    float *vec2;                  /* [vmax] */

    /* attention scratch */
    float *t0, *t1, *t2, *t3, *t4;/* [B][tw = max(D, C, Hm*(dn+dr), Hm*dv, R+dr)] */
    float *small;                 /* [B][max(fa_rank, ga_rank, Q, H)] */
    float *conv_w;                /* [3][C][W] conv taps of the current layer */
    float *convtmp;               /* [W-1+B] one channel's inputs */
    float *headtmp;               /* [H][2K] per-head S^T k and u */
    float *headvec;               /* [vmax] dt_bias, o_norm, q_a / kv_a norms */
    float *alog;                  /* [H] */
    float *mla_q;                 /* [Hm][R] absorbed queries (one token) */
    float *mla_s;                 /* [Hm][context] scores */
    float *mla_ol;                /* [Hm][R] latent outputs */

    /* FFN / MoE scratch */
    float *g, *u;                 /* [max(B * max(I, Ish, Ie), k * Ie)]: [B][fw], or [k][Ie] */
    float *logits_e;              /* [B][E] router scores (sigmoid) */
    float *bias;                  /* [E] */
    float *sel;                   /* [E] biased scores of one token */
    int32_t *idx;                 /* [B][k] chosen experts */
    float *wts;                   /* [B][k] their weights */
    float *xl, *yl;               /* [B][Dl] */
    float *Y;                     /* [B][k][Dl] per-slot expert outputs */
    float *xe, *ye;               /* [B][Dl] one expert's gathered tokens */
    int32_t *uniq;                /* [min(B*k, E)] experts used by the batch */
    int32_t *tok_of, *slot_of;    /* [B*k] token / slot of each gathered row */
    k3_expert *ex;                /* [min(B*k, E)] */
    uint32_t *seen;               /* [E] tokens of the batch that chose each expert */

    float *xpk;                   /* [B][widest input] a batch's x packed for its products (k3_xpack) */
    uint64_t xpk_cap;             /* floats of xpk */
    float *logits;                /* [rows][V] a pass's logits rows (model_shape.c: 1, B with all_logits,
                                     a verify pass's, one per sequence) */
    uint32_t logits_rows;         /* rows of logits */
    uint64_t bytes;               /* everything above (= k3_model_shape total for its dims) */
    float *dist_rows;             /* [B*k][Dl] expert outputs to or from another rank (model_dist.c; NULL in one
                                     process; not in the plan: docs/PERFORMANCE.md "Experts across ranks") */
    struct dist_lin *lin;         /* the trunk split by rows (model_split.c; NULL in one process) */
};

/* The trunk split by rows across ranks (model_split.c): buffers grown to the largest exchange (not
   in the plan, as dist_rows), and rank 0's first failure. */
typedef struct dist_lin {
    float *x;                     /* [T][cols] a split matrix's input (a rank other than 0) */
    size_t x_cap;                 /* floats */
    float *y;                     /* [T][slice rows] one rank's outputs of it, to or from rank 0 */
    size_t y_cap;
    k3_err err;                   /* rank 0: the first failed exchange (every later one is skipped) */
    k3_diag d;
} dist_lin;

/* The model a handle belongs to (the model itself for sequence 0). */
static inline k3_model *k3_owner(k3_model *m) { return m->owner ? m->owner : m; }
static inline const k3_model *k3_cowner(const k3_model *m) { return m->owner ? m->owner : m; }

/* Groups in one pass at most (a pass's sequences). */
#define K3_PASS_GROUPS_MAX 256
/* k3_model_commit itself (the batcher runs it between passes). */
k3_err k3_model_commit_now(k3_model *h, uint32_t n, k3_diag *d);

/* Fixed-order helpers (model_ops.c). The same code runs on every ISA. */
double k3v_sumsq(const float *a, uint32_t n);                   /* in order, double */
/* y[i] = w[i] * (x[i] * r), r = 1/sqrt(mean(x^2) + eps); w may be NULL (no weight) */
void k3v_rmsnorm(float *y, const float *x, const float *w, uint32_t n, float eps);
void k3_glu(const k3_model *m, float *g, const float *u, uint32_t n);   /* g <- act(g) * u */
/* the same on the calling thread only (inside a parallel region) */
void k3_glu_part(const k3_model *m, float *g, const float *u, size_t n);

/* Layers (model_attn.c, model_ffn.c): x [T][D] normed input -> out [T][D]. */
k3_err k3_kda(k3_model *m, int layer, uint32_t T, const float *x, float *out, k3_diag *d);
/* Keep the first n tokens of the verify pass recorded in KDA layer `layer` (model.h "Verify"). */
void k3_kda_commit(k3_model *m, k3_seq *sq, int layer, uint32_t n);
k3_err k3_mla(k3_model *m, int layer, uint32_t T, const float *x, float *out, k3_diag *d);
k3_err k3_dense(k3_model *m, int layer, uint32_t T, const float *x, float *out, k3_diag *d);
k3_err k3_moe(k3_model *m, int layer, uint32_t T, const float *x, float *out, k3_diag *d);
/* the routed experts of this rank only (model_ffn.c): Y's slots whose expert it owns */
k3_err k3_moe_experts(k3_model *m, int layer, uint32_t T, const float *xl, k3_diag *d);
/* experts across ranks (model_dist.c, rank 0's side): send a MoE layer's work (m->idx [T][k], xl
   [T][Dl]) to the other ranks; collect their slots of Y after this rank computed its own */
k3_err k3_dist_moe_send(k3_model *m, int layer, uint32_t T, const float *xl, k3_diag *d);
k3_err k3_dist_moe_collect(k3_model *m, uint32_t T, k3_diag *d);
/* The messages between ranks (model_dist.c, model_split.c): a header of three words from rank 0,
   whose first word's low byte is the op; answers tagged with their kind. */
enum { OP_STOP = 0, OP_MOE = 1, OP_LIN = 2 };   /* the low 4 bits; OP_LIN: its group above (model_split.c) */
enum { TAG_STATUS = 1, TAG_ROWS = 2 };
typedef struct dist_status {
    int32_t code;                 /* k3_err of the rank's part, K3_OK when rows follow */
    char msg[256];
} dist_status;
/* a rank other than 0: answer rank 0's OP_LIN header hdr [3] (model_split.c) */
k3_err k3_dist_serve_lin(k3_model *m, const uint32_t *hdr, k3_diag *d);
/* the trunk split by rows (model_split.c, rank 0's side): y [T][rows] = t x for a split tensor
   (k3_tensor.split), each rank computing its own rows; a failure is kept for k3_dist_lin_check */
void k3_dist_lin(const k3_model *m, const k3_tensor *t, const float *x, uint32_t T, float *y);
/* the same for n tensors that multiply one x (k3_lin_fused's): the split ones in one exchange, the
   others whole on rank 0 meanwhile */
void k3_dist_lin_n(const k3_model *m, int n, const k3_tensor *const *t, const float *x, uint32_t T,
                   float *const *y);
/* the first failure of k3_dist_lin in this model (the pass that met it fails), K3_OK if none */
k3_err k3_dist_lin_check(const k3_model *m, k3_diag *d);

/* x [T][cols] packed into m->xpk for the row blocks of a batch's products (kern.h k3_xpack);
   NULL where there is nothing to pack (one token, the scalar path) or no room. */
const float *k3_xpack_batch(const k3_model *m, const float *x, uint32_t cols, uint32_t T);
/* y [T][rows] = W x [T][cols] with the model's ISA */
void k3_lin(const k3_model *m, const k3_tensor *t, const float *x, uint32_t T, float *y);
/* y[j] = t[j] x for j < n (n <= K3_LIN_MAX), the same x, in one parallel region */
#define K3_LIN_MAX 8
void k3_lin_n(const k3_model *m, int n, const k3_tensor *const *t, const float *x, uint32_t T, float *const *y);
/* the same only when all of t[] are whole in memory: 1 done, 0 nothing done (model_ops.c) */
int k3_lin_fused(const k3_model *m, int n, const k3_tensor *const *t, const float *x, uint32_t T, float *const *y);

#endif

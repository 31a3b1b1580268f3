/*
 * model_shape.h - the model's dimensions and the size of every buffer it
 * allocates, from the config alone. One list, read by both sides: the model
 * (model.c) allocates exactly these buffers, and the memory planner (plan.c)
 * budgets for them before any weight is read, without calling the model.
 */
#ifndef K3_MODEL_SHAPE_H
#define K3_MODEL_SHAPE_H

#include <stdint.h>

#include "k3_config.h"
#include "k3_error.h"

typedef struct k3_dims {
    uint32_t D, L, V;             /* hidden, layers, vocab */
    uint32_t H, K, C, W;          /* KDA heads, head dim, H*K, conv width */
    uint32_t fa_rank, ga_rank;    /* KDA gate low ranks (f_a rows, g_a rows; 0 = full-rank gate) */
    uint32_t Hm, dn, dr, dv, R, Q;/* MLA heads, nope/rope/v dims, kv_lora, q_lora (0 = plain q) */
    uint32_t I;                   /* dense FFN width */
    uint32_t E, k, Ie, Dl, Ish;   /* experts, top-k, expert width, latent width (D if none), shared width */
    uint32_t block;               /* AttnRes block size, 0 = plain residual */
    uint32_t n_blocks;            /* AttnRes blocks at most: ceil(L / block) */
    uint32_t n_mla;               /* MLA layers */
} k3_dims;

/* The model's buffers, in allocation order (the k3_model fields of model_impl.h). */
typedef enum k3_buf {
    K3B_MLA_SLOT, K3B_KDA_WIN, K3B_KDA_S, K3B_MLA_C, K3B_MLA_KR,
    K3B_H, K3B_A_IN, K3B_X, K3B_ATT, K3B_M_IN, K3B_F, K3B_BLOCKS, K3B_VEC, K3B_VEC2,
    K3B_T0, K3B_T1, K3B_T2, K3B_T3, K3B_T4, K3B_SMALL, K3B_CONV_W, K3B_HEADVEC, K3B_CONVTMP,
    K3B_HEADTMP, K3B_ALOG, K3B_MLA_Q, K3B_MLA_S, K3B_MLA_OL,
    K3B_G, K3B_U, K3B_LOGITS_E, K3B_BIAS, K3B_SEL, K3B_IDX, K3B_WTS, K3B_XL, K3B_YL, K3B_Y,
    K3B_XE, K3B_YE, K3B_UNIQ, K3B_TOK_OF, K3B_SLOT_OF, K3B_EX, K3B_SEEN, K3B_LOGITS,
    K3B_KDA_REC, K3B_KDA_WORK, K3B_XPK, K3B_SEQ_LAST,
    K3B__COUNT
} k3_buf;

typedef struct k3_model_shape {
    k3_dims d;
    uint64_t bytes[K3B__COUNT];   /* bytes of one instance (64 for an empty one) */
    uint32_t count[K3B__COUNT];   /* instances: 1; KDA layers x sequences for K3B_KDA_WIN/S/REC, sequences
                                     for K3B_MLA_C/KR and K3B_SEQ_LAST; 0 when not allocated (MoE scratch
                                     of a model without experts) */
    uint64_t total;               /* sum of bytes x count: what k3_model_new allocates */
    uint64_t kda_bytes;           /* of it, one sequence's KDA states (for the plan's report) */
    uint64_t mla_bytes;           /* of it, one sequence's MLA latent cache for the context */
    uint64_t seq_bytes;           /* of it, one sequence's whole state: KDA states, MLA cache, its
                                     verify record, its last logits row */
    uint32_t n_seq;
    uint64_t verify_bytes;        /* of it, what a verify pass of drafted tokens adds (0 without) */
} k3_model_shape;

/* The dimensions from the config alone, KDA gate ranks as K3's (head_dim; the model reads the
   pack's own). A config the model cannot run is refused naming the field. */
k3_err k3_model_dims(const k3_config *c, k3_dims *z, k3_diag *d);

/* Every buffer for dims z, passes of `batch` rows and `context` positions per sequence
   (all_logits: logits for every token of a batch, as --dump needs, not only the last;
   verify: tokens of a speculative verify pass, <= batch, 0 = none: model.h "Verify";
   n_seq: sequences held, >= 1: model.h "Sequences"). */
void k3_model_sizes(const k3_dims *z, uint32_t batch, uint32_t context, int all_logits, uint32_t verify,
                    uint32_t n_seq, k3_model_shape *s);

/* k3_model_dims then k3_model_sizes: what k3_model_new would allocate (the planner's input). */
k3_err k3_model_shape_from_config(const k3_config *c, uint32_t batch, uint32_t context, int all_logits,
                                  uint32_t verify, uint32_t n_seq, k3_model_shape *s, k3_diag *d);

#endif

/*
 * weights.h - the one way the model reaches its weights: "which layer's
 * tensor" and "which experts of a layer". The model never sees files, shards
 * or hashes, so a later memory plan (trunk streaming, an expert cache) can
 * change where the bytes live without touching the model code.
 *
 * This implementation reads every tensor and expert record once at open into
 * owned, 64-byte-aligned memory with pread (never mmap), after checking the
 * manifest and every shard header, and checks each tensor's and record's
 * XXH3-64 against the manifest as it is read (unless verify_reads is off).
 */
#ifndef K3_WEIGHTS_H
#define K3_WEIGHTS_H

#include <stdint.h>

#include "k3_config.h"
#include "k3_error.h"
#include "k3_manifest.h"
#include "kern.h"

/* Tensors of one layer (or of the model, layer -1). */
typedef enum k3_wid {
    /* per layer: norms and Attention Residuals */
    K3W_IN_NORM, K3W_POST_NORM, K3W_ARES_NORM, K3W_ARES_PROJ, K3W_MRES_NORM, K3W_MRES_PROJ,
    /* KDA */
    K3W_KDA_Q, K3W_KDA_K, K3W_KDA_V, K3W_KDA_QCONV, K3W_KDA_KCONV, K3W_KDA_VCONV,
    K3W_KDA_ALOG, K3W_KDA_DTBIAS, K3W_KDA_FA, K3W_KDA_FB, K3W_KDA_B, K3W_KDA_G,
    K3W_KDA_GA, K3W_KDA_GB, K3W_KDA_ONORM, K3W_KDA_O,
    /* MLA */
    K3W_MLA_Q, K3W_MLA_QA, K3W_MLA_QANORM, K3W_MLA_QB, K3W_MLA_KVA, K3W_MLA_KVANORM,
    K3W_MLA_KVB, K3W_MLA_G, K3W_MLA_O,
    /* dense FFN */
    K3W_FFN_GATE, K3W_FFN_UP, K3W_FFN_DOWN,
    /* MoE (non-routed parts) */
    K3W_MOE_ROUTER, K3W_MOE_BIAS, K3W_MOE_SH_GATE, K3W_MOE_SH_UP, K3W_MOE_SH_DOWN,
    K3W_MOE_LAT_DOWN, K3W_MOE_LAT_UP, K3W_MOE_LAT_NORM,
    /* model level (layer -1) */
    K3W_EMBED, K3W_FINAL_NORM, K3W_OUT_RES_NORM, K3W_OUT_RES_PROJ, K3W_LM_HEAD,
    K3W__COUNT
} k3_wid;

typedef struct k3_tensor {
    const char *name;        /* pack name, e.g. "model.layers.3.self_attn.q_proj.weight" */
    int enc;                 /* K3_ENC_BF16 / K3_ENC_F32 */
    uint64_t numel;
    k3_mat mat;              /* 2-D view [rows, cols] (rows = shape[0], cols = the rest) */
} k3_tensor;

/* The three matrices of one routed expert. */
typedef struct k3_expert {
    k3_mat w1, w3, w2;       /* w1, w3: [I, Dl]; w2: [Dl, I] */
} k3_expert;

typedef struct k3_weights k3_weights;

typedef struct k3_weights_opts {
    int verify_reads;        /* check XXH3-64 of every tensor and record as read */
    int progress;            /* show a progress line while loading (TTY only) */
    uint64_t expert_slots;   /* 0: every expert read at open and resident; else a cache of this
                                many slots, filled on demand (pread, O_DIRECT where possible) */
} k3_weights_opts;

/* Counters of the expert cache (all zero when every expert is resident). */
typedef struct k3_weights_stats {
    uint64_t expert_hits, expert_misses;
    uint64_t bytes_read;     /* from disk, since open */
    double io_seconds;       /* wall time spent reading experts */
} k3_weights_stats;

/* Open a pack directory: its manifest and model config (nothing else is read yet, so a
   memory plan can be made from k3w_manifest / k3w_config first). */
k3_err k3_weights_open(const char *dir, k3_weights **out, k3_diag *d);
/* Check every shard header against the manifest and read the weights (once). On failure
   the weights stay unusable; free them with k3_weights_free. */
k3_err k3_weights_load(k3_weights *w, const k3_weights_opts *o, k3_diag *d);
void k3_weights_free(k3_weights *w);

const k3_config *k3w_config(const k3_weights *w);
const k3_manifest *k3w_manifest(const k3_weights *w);
uint64_t k3w_bytes_read(const k3_weights *w);      /* bytes read from disk so far */
void k3w_stats(const k3_weights *w, k3_weights_stats *st);
/* How many experts of one layer can be acquired at once (the cache's slots, or all). */
uint32_t k3w_expert_capacity(const k3_weights *w);

/* A layer's tensor (layer -1: model level), or NULL when the model has none. */
const k3_tensor *k3w_get(k3_weights *w, int layer, k3_wid id);
/* Copy a vector tensor (BF16 or F32, numel n) as fp32 into dst [n]. */
void k3w_vec(const k3_tensor *t, float *dst);
/* One embedding row as fp32: dst [D]. */
k3_err k3w_embed_row(k3_weights *w, int32_t token, float *dst, k3_diag *d);

/*
 * Make experts ids[0..n) of `layer` available (n <= k3w_expert_capacity):
 * out[j] are their matrices, valid until k3w_experts_release. Missing ones
 * are read together (in parallel) and hash-checked before use.
 */
k3_err k3w_experts_acquire(k3_weights *w, int layer, const int32_t *ids, int n, k3_expert *out,
                           k3_diag *d);
void k3w_experts_release(k3_weights *w, int layer);

#endif

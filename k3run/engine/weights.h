/*
 * weights.h - the one way the model reaches its weights: "which layer's
 * tensor" and "which experts of a layer". The model never sees files, shards
 * or hashes, so a later memory plan (trunk streaming, an expert cache) can
 * change where the bytes live without touching the model code.
 *
 * Where the bytes live is the memory plan's choice (plan.h): trunk units
 * (a layer's tensors, or the head's) are resident, or streamed through two
 * buffers (the next streamed unit is read while the model computes this one);
 * experts are all resident, or go through a fixed-slot cache. Everything is
 * read with pread (never mmap) by reader threads, after the manifest and every
 * shard header are checked, and each tensor's and record's XXH3-64 is checked
 * against the manifest before the model sees it (unless verify_reads is off).
 * The embedding table is hashed once at load and then read one row per token.
 *
 * The model brackets each layer with k3w_layer_begin (the head: layer -1);
 * a tensor's data pointer is valid from its unit's begin until the next
 * streamed unit's begin. Metadata (name, shape, encoding) is always valid.
 * In a unit larger than a chunk (plan.h), the large matrices have no data
 * pointer: the model takes them by rows with k3w_rows, each once per pass, in
 * k3_wid order, and the rows are valid until the next k3w_rows; its other
 * tensors (the small part) are valid for the whole unit.
 */
#ifndef K3_WEIGHTS_H
#define K3_WEIGHTS_H

#include <stdint.h>

#include "k3_config.h"
#include "k3_error.h"
#include "k3_manifest.h"
#include "kern.h"

/* Tensors of one layer (or of the model, layer -1), in the order the model uses them: a unit
   read in row pieces streams its large matrices in this order (k3w_rows). */
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
    K3W_MOE_ROUTER, K3W_MOE_BIAS, K3W_MOE_LAT_DOWN, K3W_MOE_LAT_NORM, K3W_MOE_LAT_UP,
    K3W_MOE_SH_GATE, K3W_MOE_SH_UP, K3W_MOE_SH_DOWN,
    /* model level (layer -1) */
    K3W_EMBED, K3W_FINAL_NORM, K3W_OUT_RES_NORM, K3W_OUT_RES_PROJ, K3W_LM_HEAD,
    K3W__COUNT
} k3_wid;

typedef struct k3_tensor {
    const char *name;        /* pack name, e.g. "model.layers.3.self_attn.q_proj.weight" */
    int enc;                 /* K3_ENC_BF16 / K3_ENC_F32 */
    uint64_t numel;
    k3_mat mat;              /* 2-D view [rows, cols] (rows = shape[0], cols = the rest) */
    int layer, wid;          /* where k3w_get finds it (layer -1: model level; wid -1: not the model's) */
    int split;               /* the trunk split by rows (k3_weights_opts.split): only rows [lo, hi) of it
                                (and of its scales) are in memory on this rank, the others are not */
    uint32_t lo, hi;         /* split: this rank's slice (k3_split_rows) */
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
    const uint8_t *unit_streamed;  /* [n_layers + 1] (plan.h units: layers, then the head), 1: streamed
                                      through two buffers, read every forward pass; NULL: all resident */
    uint64_t chunk;          /* units larger than this are streamed in row pieces (the plan's chunk); 0: k3_chunk_bytes() */
    int rank, ranks, first;  /* experts across ranks (dist.h): only experts e with k3_expert_owner(e, ranks,
                                first) == rank are read, kept and acquired (resident: those only); ranks 0 or
                                1: every expert */
    int no_trunk;            /* a rank that only multiplies experts: no trunk unit is read or kept */
    int split;               /* the trunk split by rows across `ranks` (plan.h, K3_TRUNK=split): every
                                unit resident; each splittable matrix of at least split_min bytes keeps
                                only this rank's rows (the others are read, hash-checked and dropped);
                                rank 0 keeps the rest of the trunk, the other ranks nothing else */
    uint64_t split_min;
} k3_weights_opts;

/* Counters since open (expert counters stay zero when every expert is resident). */
typedef struct k3_weights_stats {
    uint64_t expert_hits, expert_misses;
    uint64_t bytes_read;         /* from disk: everything */
    uint64_t trunk_bytes_read;   /* of it: trunk units (at load, and streamed ones every pass) */
    uint64_t expert_bytes_read;  /* of it: expert records */
    uint64_t units_streamed;     /* streamed trunk units read (a unit in row pieces: its small part) */
    uint64_t pieces_streamed;    /* row pieces read (units larger than a chunk) */
    double wait_seconds;         /* the compute thread blocked on reads (trunk units and experts) */
    double read_seconds;         /* time of the reads themselves (with their hash checks), summed
                                    over reader threads */
    double hash_seconds;         /* of it, the XXH3-64 checks */
    /* lookahead reads (k3w_experts_prefetch; all zero when it is off) */
    uint64_t prefetch_issued;    /* expert records read ahead of their layer's acquire */
    uint64_t prefetch_used;      /* of them, asked for by a later acquire (counted in expert_hits) */
    uint64_t prefetch_wasted;    /* evicted before any acquire asked for them, or their read failed */
    uint64_t prefetch_pending;   /* in the cache now, not asked for yet: issued = used + wasted + pending */
    double expert_wait_seconds;  /* of wait_seconds, waiting for expert reads (misses and read-ahead ones) */
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
uint32_t k3w_in_place_layers(const k3_weights *w); /* MoE layers whose records are read in the checkpoint */
int k3w_trunk_q8(const k3_weights *w);             /* 1: a compact (Q8, inexact) trunk, FORMAT.md 3 */
void k3w_stats(const k3_weights *w, k3_weights_stats *st);
/* How many experts of one layer can be acquired at once (the cache's slots, or all). */
uint32_t k3w_expert_capacity(const k3_weights *w);

/* The model is about to compute layer `layer` (-1: the head). Makes its trunk unit's tensors
   available (waiting for a streamed unit's read, or reading it now) and starts reading the next
   streamed unit. Fails naming the tensor, shard and offset when a read or its hash fails. */
k3_err k3w_layer_begin(k3_weights *w, int layer, k3_diag *d);
/* The forward pass ended (after the head): closes the head's time. */
void k3w_pass_end(k3_weights *w);
/* Wall seconds spent in each unit so far, from its k3w_layer_begin to the next begin or
   k3w_pass_end (reads waited for included): out [n_layers + 1], the head last. */
void k3w_unit_seconds(const k3_weights *w, double *out);

/* Rows [r0, *r1) of tensor t in memory as *view (rows = *r1 - r0, data at row r0), r0 < rows: all
   the rest for a tensor in memory, else the row piece starting at r0 (waiting for its read, and
   starting the next piece's). Returns 0; nonzero when the read or its hash failed (a piece's hash
   is the whole tensor's, checked at its last piece: nothing computed from it is used before), and
   the next k3w_check or k3w_layer_begin reports the error. */
int k3w_rows(k3_weights *w, const k3_tensor *t, uint32_t r0, k3_mat *view, uint32_t *r1);
/* The error a failed k3w_rows left (and clears it); K3_OK if none. */
k3_err k3w_check(k3_weights *w, k3_diag *d);

/* A layer's tensor (layer -1: model level), or NULL when the model has none. */
const k3_tensor *k3w_get(k3_weights *w, int layer, k3_wid id);
/* Copy a vector tensor (BF16 or F32, numel n) as fp32 into dst [n]. */
void k3w_vec(const k3_tensor *t, float *dst);
/* One embedding row as fp32: dst [D]. */
k3_err k3w_embed_row(k3_weights *w, int32_t token, float *dst, k3_diag *d);

/* The shapes and encoding of `layer`'s experts (data pointers NULL), without reading any. */
k3_err k3w_expert_shape(k3_weights *w, int layer, k3_expert *out, k3_diag *d);

/*
 * Ask for experts ids[0..n) of `layer` (distinct, n <= k3w_expert_capacity).
 * out[j] are their matrices, usable once k3w_experts_next has handed out j,
 * until k3w_experts_release. Missing ones are read together, in parallel, by
 * the reader threads and hash-checked; k3w_experts_next hands out the cached
 * ones first, so compute starts while the others are read. tokens (NULL: 1
 * each) is indexed by expert id: how many tokens of the batch chose each one;
 * the cache's eviction counts them.
 */
k3_err k3w_experts_acquire(k3_weights *w, int layer, const int32_t *ids, const uint32_t *tokens, int n,
                           k3_expert *out, k3_diag *d);
/* The next expert of the acquire that is ready (*j its index in ids), waiting for its read if
   needed; *j = -1 when all were handed out. The order never changes what is computed. */
k3_err k3w_experts_next(k3_weights *w, int *j, k3_diag *d);
/* How many of the acquire's experts k3w_experts_next hands out next without waiting for a
   read (the cached ones, or all when resident). */
int k3w_experts_ready(const k3_weights *w);
/* Done with the acquire's experts (waits for reads still in flight). */
void k3w_experts_release(k3_weights *w, int layer);

/*
 * Lookahead reads (docs/PERFORMANCE.md, "Lookahead expert reads"): the model
 * predicts the experts a layer will ask for (the next layer's router on the
 * hidden state of the layer before) and has them read into the cache while
 * it still computes. Only where reads land changes, never what is computed.
 * In cache mode only. Returns how many of each token's predicted experts (its
 * likeliest first) to read ahead: K3_LOOKAHEAD=N, 0 (or off, or no cache) for
 * none, -1 when the environment does not say (the model's default: half its
 * top-k, docs/PERFORMANCE.md says why).
 */
int k3w_lookahead(const k3_weights *w);
/* Layer `layer`'s tensor with its data, if it is in memory or its read is already queued (a
   streamed unit read ahead into the other buffer: waits for that tensor's read only); NULL when it
   is not (or its read failed: k3w_layer_begin reports that). *tmp holds a streamed unit's view. */
const k3_tensor *k3w_get_ahead(k3_weights *w, int layer, k3_wid id, k3_tensor *tmp);
/* Start reading experts ids[0..n) of `layer` (distinct, most likely first) that are not cached,
   each into a slot of its own, evicting as a miss would but never a slot of another of ids. Stops
   at half the cache. Called between acquires; returns how many reads it queued. */
int k3w_experts_prefetch(k3_weights *w, int layer, const int32_t *ids, int n);

#endif

/*
 * k3inspect.h - what the views of k3inspect share: the opened checkpoint, its
 * config (if any), per-layer attention/FFN types, and the row filter.
 */
#ifndef K3INSPECT_H
#define K3INSPECT_H

#include <stdint.h>
#include <stdio.h>

#include "k3_config.h"
#include "k3_manifest.h"
#include "k3_shard.h"
#include "k3_tensor_kind.h"
#include "safetensors.h"

enum { K3I_FFN_UNKNOWN = 0, K3I_FFN_DENSE = 1, K3I_FFN_MOE = 2 };

/* A checkpoint file of an in-place pack (version 3): is it the one k3pack read? */
enum { K3I_SRC_OK = 0, K3I_SRC_MISSING, K3I_SRC_SIZE, K3I_SRC_HEADER, K3I_SRC_UNREADABLE };

typedef struct k3i_ctx {
    k3_st_ckpt ck;
    k3_config cfg;
    int has_cfg;
    const char *cfg_source;      /* where the config came from, for messages and JSON */
    size_t n_layers;             /* max(config layers, highest layer index + 1) */
    uint8_t *layer_attn;         /* [n_layers] K3_ATTN_* */
    uint8_t *layer_ffn;          /* [n_layers] K3I_FFN_* */
    uint8_t *kind;               /* [ck.n_tensors] k3_kind of each tensor */
    const char *filter;          /* fnmatch glob on full names, NULL = all */
    /* a k3 pack (k3inspect_pack.c): ck is built from its manifest */
    int is_pack;
    k3_manifest pack;
    k3_shard_header *shard_hdr;  /* [pack.n_shards] headers read from the shards */
    uint8_t *shard_ok;           /* [pack.n_shards] 1 = header read and valid */
    /* version 3 (k3inspect_in_place.c): expert records in place in the checkpoint */
    char *link_target;           /* where PACK/checkpoint points, or NULL */
    uint8_t *src_state;          /* [pack.n_sources] K3I_SRC_* */
    size_t *src_records;         /* [pack.n_sources] in-place records in each file */
} k3i_ctx;

/* Packs: detection, loading into x (ck, cfg text, headers), the pack-only views. */
int k3i_is_pack(const char *path);
k3_err k3i_open_pack(k3i_ctx *x, const char *dir, k3_diag *d);
void k3i_close_pack(k3i_ctx *x);
int k3i_pack_text(const k3i_ctx *x, FILE *f);      /* shard table and record layout */
void k3i_pack_json(const k3i_ctx *x, FILE *f);     /* ,"pack":{...} inside a JSON view */
/* A row of a pack's view (k3inspect_pack.c): name a+b+c from *pool (advanced). */
void k3i_fill_tensor(k3_st_tensor *t, char **pool, const char *a, const char *b, const char *c, int enc,
                     int ndim, const uint64_t *shape, uint64_t offset, uint64_t size, uint32_t file);
void k3i_warn(k3_st_ckpt *c, const char *msg);       /* a warning, shown on stderr and in JSON */

/* Version 3 (k3inspect_in_place.c): the checkpoint files after the shards as files of ck, with
   their in-place records' parts as rows; their table and the expert layers, text and JSON
   (fields inside "pack"). */
k3_err k3i_add_sources(k3i_ctx *x, const char *dir, char **pool, k3_diag *d);
void k3i_close_sources(k3i_ctx *x);
void k3i_sources_text(const k3i_ctx *x, FILE *f);
void k3i_sources_json(const k3i_ctx *x, FILE *f);

/* Fill layer types and tensor kinds (after ck and cfg are set). 0 or -1 on ENOMEM. */
int k3i_classify(k3i_ctx *x);

/* Does tensor i pass the filter? */
int k3i_selected(const k3i_ctx *x, size_t i);

/*
 * Parameters a tensor holds: its element count, except for quantized storage:
 * "*.weight_packed" U8/I8 = 2 weights per byte (MXFP4/INT4 nibbles), I32/U32 =
 * 8 per element; scales, zero points and weight_shape tensors hold 0.
 */
uint64_t k3i_params(const k3_st_tensor *t);

/* "KDA+MoE", "MLA+dense", "?+MoE", ... (static strings). */
const char *k3i_layer_kind(const k3i_ctx *x, size_t layer);

/* Decimal unit form: "2.78 T" (params) / "1.56 TB" (bytes when unit is "B"). */
char *k3i_si(double v, const char *unit, char *buf, size_t cap);

/* Views. Each writes to f and returns 0, or -1 on a write error. */
int k3i_list_text(const k3i_ctx *x, FILE *f);
int k3i_list_json(const k3i_ctx *x, FILE *f);
int k3i_summary_text(const k3i_ctx *x, FILE *f);
int k3i_summary_json(const k3i_ctx *x, FILE *f);

/* JSON pieces shared by both JSON views: opening fields and the warnings array. */
/* --plan --ranks R (k3inspect_ranks.c; first 1: rank 0 holds no experts, --rank0-experts no; split:
   the trunk split by rows, --trunk split, matrices of at least min bytes): k3run's plans of rank 0
   and rank 1 (gr, p: [2] each), network bytes per decoded token, and the fewest ranks holding every
   expert in memory at this budget */
struct k3_geometry;
struct k3_plan;
k3_err k3i_rank_plans(const k3_config *c, const struct k3_geometry *g, uint64_t budget, uint32_t context,
                      uint32_t batch, uint32_t generate, uint32_t verify, int R, int first, int split, uint64_t min,
                      struct k3_geometry *gr, struct k3_plan *p, k3_diag *d);
void k3i_rank_network(const k3_config *c, const struct k3_geometry *g, int R, int first, int split, uint64_t min,
                      double *sent, double *received, uint32_t *trips);
int k3i_ranks_all_resident(const k3_config *c, const struct k3_geometry *g, uint64_t budget, uint32_t context,
                           uint32_t batch, uint32_t generate, uint32_t verify, int first, int mode, uint64_t min);
int k3i_split_fits(const k3_config *c, const struct k3_geometry *g, uint64_t budget, uint32_t context,
                   uint32_t batch, uint32_t generate, uint32_t verify, int R, int first, uint64_t min);

void k3i_json_head(const k3i_ctx *x, FILE *f, const char *view);
void k3i_json_warnings(const k3i_ctx *x, FILE *f);

#endif

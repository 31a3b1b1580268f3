/*
 * k3_manifest.h - the pack's manifest.json (docs/FORMAT.md section 5):
 * in-memory form, writer and strict reader.
 */
#ifndef K3_MANIFEST_H
#define K3_MANIFEST_H

#include <jansson.h>
#include <stdint.h>

#include "k3_config.h"
#include "k3_error.h"
#include "k3_hash.h"
#include "k3_shard.h"

#define K3_MANIFEST_NAME "manifest.json"
/* The checkpoint's sampling defaults (Hugging Face's generation_config.json), carried into the
   pack byte for byte and hashed like the tokenizer files; optional. */
#define K3_GENCONFIG_NAME "generation_config.json"
#define K3_MAX_RECORD_PARTS 8

/*
 * What one manifest may cost (FORMAT.md 5.2), checked before jansson allocates
 * anything: at most K3_MANIFEST_MAX bytes and K3_MANIFEST_MAX_ITEMS JSON values
 * and keys, counted as 1 + the '{', '[', ',' and ':' outside strings. Kimi K3's
 * manifest is 2.7 MB with 135,147 items.
 */
#define K3_MANIFEST_MAX (64u << 20)
#define K3_MANIFEST_MAX_ITEMS (1u << 21)

/*
 * The self-checksum (FORMAT.md 5.1): manifest.json ends with
 *     "manifest_xxh3_64": "<16 lowercase hex digits>"\n}\n
 * and the digits are the XXH3-64 of every byte before them, [0, size - 20).
 */
#define K3_MANIFEST_SUM_KEY "manifest_xxh3_64"
#define K3_MANIFEST_SUM_TAIL 20u        /* 16 hex digits + '"' '\n' '}' '\n' */

typedef struct k3_mf_file {
    char *name;
    uint64_t size;
    k3_h128 hash;
} k3_mf_file;

typedef struct k3_mf_shard {
    char *name;
    uint32_t kind;          /* K3_SHARD_TRUNK / K3_SHARD_EXPERTS */
    int64_t layer;          /* -1 = none (embed, head) */
    uint64_t size;
    uint64_t header_hash;
    k3_h128 hash;
} k3_mf_shard;

typedef struct k3_mf_tensor {
    char *name;
    int encoding;
    int ndim;
    uint64_t shape[K3_SHARD_MAX_DIMS];
    uint32_t shard;         /* index into shards */
    uint64_t offset, size;
    uint64_t hash;          /* XXH3-64 */
} k3_mf_tensor;

typedef struct k3_mf_part {
    char *name;             /* e.g. "w1.weight_packed" */
    int encoding;
    int ndim;
    uint64_t shape[K3_SHARD_MAX_DIMS];
    uint64_t offset, size;  /* inside the record */
} k3_mf_part;

typedef struct k3_mf_experts {
    uint32_t layer;
    uint32_t shard;         /* index into shards; UINT32_MAX for records in place */
    uint64_t count, offset, stride, record_size;  /* in place: offset 0, stride k3_in_place_stride() */
    uint32_t n_parts;
    k3_mf_part parts[K3_MAX_RECORD_PARTS];
    uint64_t *hashes;       /* [count] XXH3-64 per record */
    int in_place;           /* version 3: the records are read from the checkpoint's files */
    uint32_t *rec_file;     /* in place: [count] index into k3_manifest.sources */
    uint64_t *rec_off;      /* in place: [count] the record's first byte in that file */
} k3_mf_experts;

/* A checkpoint file an in-place pack reads expert records from (FORMAT.md 10): a plain
   name inside the pack's `checkpoint` directory link. */
typedef struct k3_mf_source {
    char *name;
    uint64_t size;          /* bytes of the whole file */
    uint64_t header_size;   /* 8 + N: its safetensors header */
    k3_h128 header_hash;    /* XXH3-128 of those bytes */
    int in_pack;            /* 1: a file of the pack itself (records k3pack copied), not of the checkpoint */
} k3_mf_source;

#define K3_CHECKPOINT_LINK "checkpoint"
#define K3_Q8_RULE "pow2-rne-127"             /* the compact trunk's rule (FORMAT.md 3) */   /* in an in-place pack: the link to the checkpoint directory */

/* Memory one in-place record takes in a slot or the resident table: it is read with aligned
   reads that cover it, so it may start anywhere in its first 4 KiB. */
static inline uint64_t k3_in_place_stride(uint64_t record_size)
{
    return (record_size + 4095 + 4095) / 4096 * 4096;
}

typedef struct k3_mf_skipped {
    char *name;
    char *reason;
} k3_mf_skipped;

/* A file of the checkpoint the pack was made from, with its SHA-256 as k3pack read it (FORMAT.md 5:
   "download"): which download a pack came from. */
typedef struct k3_mf_srcfile {
    char *name;
    uint64_t size;
    uint8_t sha256[32];
} k3_mf_srcfile;

typedef struct k3_manifest {
    int format_version;
    char *generator;
    char *name_prefix;
    json_t *config;                 /* owned reference: config.json verbatim */
    int experts_encoding;           /* K3_ENC_MXFP4 or K3_ENC_BF16; 0 = no experts */
    int experts_quantized;          /* 1 = quantized from BF16 by k3pack */
    char *quant_rule;               /* NULL or "ocp-floor-rne-sat" */
    int trunk_q8;                   /* version 3: a compact trunk (FORMAT.md 3, Q8): "trunk" in the JSON */
    uint32_t n_files, n_shards, n_tensors, n_expert_layers, n_skipped, n_sources;
    k3_mf_file *files;
    k3_mf_source *sources;          /* [n_sources] version 3: checkpoint files read in place */
    k3_mf_shard *shards;
    k3_mf_tensor *tensors;
    k3_mf_experts *expert_layers;
    k3_mf_skipped *skipped;
    /* optional ("download"): the checkpoint's files and their SHA-256, and what they were checked
       against (NULL: nothing, the download was not checked) */
    k3_mf_srcfile *src_files;       /* [n_src_files] */
    uint32_t n_src_files;
    int have_download;              /* the manifest has the "download" object */
    char *download_checked;
} k3_manifest;

/*
 * Writers: describe shard s (already in m->shards[s]) from its header, appending
 * its trunk tensors (with entry_hashes[i], XXH3-64 of entry i) or its expert
 * layer (taking the pointer record_hashes[n_records]; k3_manifest_free frees it).
 */
k3_err k3_manifest_describe_shard(k3_manifest *m, uint32_t s, const k3_shard_header *h,
                                  const uint64_t *entry_hashes, uint64_t *record_hashes, k3_diag *d);

/* Serialise to JSON text (malloc'd, NUL-terminated, ends with a newline),
   sealed with its self-checksum. */
k3_err k3_manifest_dump(const k3_manifest *m, char **text, size_t *len, k3_diag *d);

/*
 * Recompute the self-checksum of a manifest text that already ends with the
 * checksum member (as k3_manifest_dump writes it) in place; for tools and
 * tests that edit a manifest. Returns -1 (text unchanged) if the text does not
 * end with "manifest_xxh3_64": "<16 hex digits>"\n}\n.
 */
int k3_manifest_seal(char *text, size_t len);

/* Check the self-checksum alone: K3_OK, K3_ERR_CORRUPT (mismatch) or
   K3_ERR_FORMAT / K3_ERR_UNSUPPORTED (no checksum at the end). */
k3_err k3_manifest_check_sum(const char *text, size_t len, const char *path, k3_diag *d);

/* Parse and validate manifest text (its cost, its self-checksum, then every
   rule of FORMAT.md section 8); path is used in messages. */
k3_err k3_manifest_parse(const char *text, size_t len, const char *path, k3_manifest *m, k3_diag *d);

/* Read <dir>/manifest.json. A missing file says the pack is unfinished. */
k3_err k3_manifest_load(const char *dir, k3_manifest *m, k3_diag *d);

void k3_manifest_free(k3_manifest *m);

/* Parse the model config the manifest carries (m->config). display_name
   prefixes messages; a missing config is K3_ERR_FORMAT ("'NAME': absent or
   cannot be serialised"). */
k3_err k3_manifest_config(const k3_manifest *m, const char *display_name, k3_config *out, k3_diag *d);

/* Index of a shard by name, or -1. */
int k3_manifest_shard_index(const k3_manifest *m, const char *name);

#endif

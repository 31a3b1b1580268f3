/*
 * pack.h - k3pack's internal model: the plan (which checkpoint tensor goes to
 * which shard, entry and record, and how), the shard writer, the sources.
 *
 * The plan depends only on config.json and the expert mode, never on the
 * source's file layout, so the same checkpoint gives the same pack from a
 * directory, a single file or an archive.
 */
#ifndef K3PACK_PACK_H
#define K3PACK_PACK_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "k3_config.h"
#include "k3_download.h"
#include "k3_error.h"
#include "k3_file.h"
#include "k3_hash.h"
#include "k3_manifest.h"
#include "k3_pack_hash.h"
#include "k3_progress.h"
#include "k3_shard.h"
#include "quant_mxfp4.h"
#include "safetensors.h"

/* ------------------------------------------------------------------- plan */

typedef enum { PK_EXPERTS_AUTO, PK_EXPERTS_MXFP4, PK_EXPERTS_BF16 } pk_expert_mode;
typedef enum { PK_COPY, PK_QUANT, PK_QUANT8 } pk_op;   /* PK_QUANT8: a BF16 trunk matrix to Q8 + scales */

/* One checkpoint tensor and where it goes. */
typedef struct pk_item {
    char *src_name;           /* full checkpoint name (with prefix) */
    uint32_t shard;           /* index into plan.shards */
    uint32_t entry;           /* entry (trunk) or part (experts) index; PK_QUANT: the packed
                                 part, the scale part is entry + 1 */
    uint64_t record;          /* expert id for expert shards, else 0 */
    pk_op op;
    uint64_t src_bytes;       /* bytes the checkpoint holds */
    uint64_t rows, cols;      /* PK_QUANT: the BF16 matrix shape */
    uint64_t dst_off;         /* absolute offset of its (first) output part in the shard */
    uint8_t src_dtype;        /* k3_dtype expected in the checkpoint */
    uint8_t src_rank;
    uint8_t any_shape;        /* K3_XT_ANY_SHAPE: any shape with the same numel */
    uint64_t src_shape[4];    /* expected checkpoint shape */
} pk_item;

typedef struct pk_shard {
    char name[64];
    int64_t layer;            /* -1 for embed and head */
    k3_shard_header h;        /* laid out, ready to encode */
    size_t first_item, n_items;  /* items[first .. first+n) in output offset order */
} pk_shard;

/* An expert layer read in place in the checkpoint (pack_in_place.c, FORMAT.md 10). */
typedef struct pk_in_place {
    uint64_t record_size;     /* bytes one expert's tensors cover in its file */
    uint64_t part_off[K3_MAX_RECORD_PARTS];  /* [n_entries] offset of the shard entry's tensor in that range */
    uint32_t *file;           /* [n_records] index into the checkpoint's files, or PK_COPIED: the record is
                                 copied into the pack's PK_COPIED_NAME (its tensors were not laid out
                                 as the layer's others) */
    uint64_t *off;            /* [n_records] where each record starts in that file */
} pk_in_place;

#define PK_COPIED UINT32_MAX
#define PK_COPIED_NAME "experts-copied.safetensors"

/* A record copied into PK_COPIED_NAME. */
typedef struct pk_copied {
    uint32_t shard;
    uint64_t record;
} pk_copied;

typedef struct pk_plan {
    k3_config cfg;
    char *config_text;        /* config.json bytes, verbatim */
    size_t config_len;
    pk_expert_mode experts;   /* resolved: MXFP4 or BF16 */
    int quantize;             /* BF16 checkpoint experts quantized to MXFP4 */
    int trunk_q8;             /* --trunk q8: the eligible trunk matrices as Q8 (k3_trunk_q8_eligible) */
    pk_shard *shards;         /* [n_shards] in forward order */
    uint32_t n_shards;
    pk_item *items;           /* [n_items] shard by shard, in output order */
    size_t n_items;
    size_t *by_name;          /* [n_items] item indices sorted by src_name */
    uint64_t total_bytes;     /* sum of the sizes of the shards written */
    uint64_t src_bytes;       /* sum of checkpoint bytes read */
    /* --experts-in-place (pk_plan_in_place) */
    pk_in_place **in_place;   /* [n_shards] NULL: written as a shard; else the layer is read in place */
    uint32_t n_in_place;      /* layers read in place */
    uint64_t in_place_bytes;  /* their records' bytes, left in the checkpoint */
    char *ckpt_dir;           /* the checkpoint directory, resolved: the pack's `checkpoint` link */
    pk_copied *copied;        /* [n_copied] records copied into PK_COPIED_NAME, in its order */
    uint64_t n_copied;
    char *copied_header;      /* its safetensors header: 8-byte length + JSON, [copied_header_size] */
    uint64_t copied_header_size, copied_size;   /* 8 + N (a multiple of 4096), the whole file */
    uint64_t *src_header_size;   /* [checkpoint files] 8 + N of each */
} pk_plan;

/* Build the plan from config.json text. MXFP4 checkpoint experts are always
   kept bit-exact; BF16 ones are kept, or quantized with PK_EXPERTS_MXFP4. */
k3_err pk_plan_build(pk_plan *p, const char *config_text, size_t config_len, pk_expert_mode mode,
                     int trunk_q8, k3_diag *d);
void pk_plan_free(pk_plan *p);
/* Find the item of a checkpoint tensor (binary search); NULL if not planned. */
pk_item *pk_plan_find(const pk_plan *p, const char *src_name);
/* Check a checkpoint tensor (dtype, shape, size) against its plan item. */
k3_err pk_item_check(const pk_item *it, const k3_st_tensor *t, const char *file, k3_diag *d);
/* --experts-in-place: decide, layer by layer, which experts can stay in the checkpoint (its
   layout, FORMAT.md 10); the others are copied as usual. Says on stderr which and why. */
k3_err pk_plan_in_place(pk_plan *p, const k3_st_ckpt *ck, k3_diag *d);
void pk_in_place_free(pk_in_place *ip);
/* Print the plan (--dry-run) as text or JSON Lines. */
void pk_plan_print(const pk_plan *p, FILE *f, int json);

/* ----------------------------------------------------------------- writer */

typedef struct pk_writer {
    const pk_plan *p;
    const char *out_dir;
    int json;                   /* JSON Lines status records on stdout */
    k3_atomic_file *af;         /* [n_shards] open temporary files (fd -1 when closed) */
    uint8_t *done;              /* [n_shards] 1 = final file in place and hashed */
    uint8_t *placed;            /* [n_shards] 1 = an in-place layer's records hashed (not journaled) */
    uint8_t *resumed;           /* [n_shards] 1 = taken over from an earlier run */
    size_t *remaining;          /* [n_shards] items still to write */
    k3_shard_hashes *hashes;    /* [n_shards] what the manifest records */
    k3_quant_stats qstats;      /* experts quantized to MXFP4 */
    k3_quant_stats q8stats;     /* trunk matrices quantized to Q8 (--trunk q8) */
    uint64_t bytes_done;        /* checkpoint bytes consumed, for progress */
    uint32_t shards_done;       /* finished or resumed shards, for progress */
    k3_progress prog;
    pthread_mutex_t lock;       /* journal, stats, progress */
    char fingerprint[33];       /* pk_writer_init: config + options; pk_set_inputs: + the input files */
    char config_fp[33];         /* the config + options part alone (to say what changed) */
    const struct pk_input *inputs;  /* [n_inputs] owned by the caller; NULL from stdin */
    size_t n_inputs;
    /* the checkpoint's files as read, for the manifest's "download" (under lock) */
    k3_mf_srcfile *src_files;   /* [n_src_files] names owned */
    uint32_t n_src_files;
    int streamed;               /* the source was read front to back: every file's SHA-256 is known */
    /* --experts-in-place, while the files stream (pack_in_place.c) */
    uint64_t *ip_left;          /* [n_shards] an in-place layer's records (left in place) not yet hashed */
    k3_atomic_file copied;      /* PK_COPIED_NAME being written (fd -1: none) */
    const char *download_checked;   /* what they were checked against (NULL: nothing) */
} pk_writer;

/* Per-item state while its bytes arrive (in order, in chunks of any size). */
typedef struct pk_feed {
    const pk_item *it;
    uint64_t got;               /* bytes received */
    uint8_t *row;               /* PK_QUANT: [cols * 2] one BF16 row being assembled */
    size_t row_fill;
    uint8_t *packed;            /* PK_QUANT: [cols / 2]; PK_QUANT8: [cols] int8 codes */
    uint8_t *scales;            /* PK_QUANT: [rows * cols / 32] kept until the end */
    uint64_t r;                 /* PK_QUANT: rows done */
} pk_feed;

k3_err pk_writer_init(pk_writer *w, const pk_plan *p, const char *out_dir, int json, k3_diag *d);
void pk_writer_free(pk_writer *w);
/* Create the temporary file of shard s, sized, with its header written. */
k3_err pk_shard_begin(pk_writer *w, uint32_t s, k3_diag *d);
/* Feed the bytes of one item: begin, data (any chunking), end. */
k3_err pk_feed_begin(pk_feed *f, const pk_item *it, k3_diag *d);
k3_err pk_feed_data(pk_writer *w, pk_feed *f, const uint8_t *buf, size_t n, k3_diag *d);
/* *last (may be NULL): 1 when this was the shard's last item (its caller finishes the shard). */
k3_err pk_feed_end(pk_writer *w, pk_feed *f, int *last, k3_diag *d);
void pk_feed_free(pk_feed *f);
/* Hash the finished temporary file, commit it under its name, journal it. */
k3_err pk_shard_finish(pk_writer *w, uint32_t s, k3_diag *d);
/* --experts-in-place as the files stream (pack_in_place.c): begin (the layers' record hashes,
   PK_COPIED_NAME opened with its header), then for each tensor of an in-place layer's shard,
   tensor / data / tensor_end instead of pk_feed_* (a record left in place is hashed as its parts
   pass, in their offset order; a copied one is written at its place), then finish (every record
   hashed, the copies hashed from the file written, PK_COPIED_NAME committed). */
k3_err pk_in_place_begin(pk_writer *w, k3_diag *d);
struct pk_entry;
k3_err pk_in_place_tensor(pk_writer *w, struct pk_entry *es, const pk_item *it, k3_diag *d);
k3_err pk_in_place_data(pk_writer *w, struct pk_entry *es, const uint8_t *p, size_t n, k3_diag *d);
k3_err pk_in_place_tensor_end(pk_writer *w, struct pk_entry *es, k3_diag *d);
k3_err pk_in_place_finish(pk_writer *w, k3_diag *d);
/* The manifest of an in-place pack: its checkpoint_files (src_of: [n_inputs] -> index or
   UINT32_MAX), and shard s's layer described in place. */
k3_err pk_manifest_sources(const pk_writer *w, k3_manifest *m, uint32_t *src_of, k3_diag *d);
k3_err pk_manifest_in_place(const pk_writer *w, k3_manifest *m, uint32_t s, const uint32_t *src_of, k3_diag *d);
/* Remove every open temporary file (on failure). */
void pk_writer_abort(pk_writer *w);

/* ------------------------------------------------- what the input is */

/* One input file as the resume fingerprint sees it: a checkpoint's
   .safetensors file (header = XXH3-128 of its 8 + N header bytes), or an
   archive file (header zero: its size and mtime stand for its content). */
typedef struct pk_input {
    char name[256];             /* file name (no directory) */
    uint64_t size;
    int64_t mtime_ns;
    k3_h128 header;
} pk_input;

/* The checkpoint's .safetensors files, in name order (pack_source_dir.c). */
k3_err pk_inputs_from_ckpt(const k3_st_ckpt *ck, pk_input **out, size_t *n, k3_diag *d);
/* Extend w->fingerprint with the inputs (none: stdin, nothing to identify it). */
void pk_set_inputs(pk_writer *w, const pk_input *in, size_t n);

/* ------------------------------------------- output directory and journal */

#define PK_JOURNAL ".k3pack.journal"

/* Create (if needed) and lock (flock on the directory) the output directory; refuse a finished pack
   (unless force) or a directory with foreign files; clean stale temporaries. A finished pack that
   still has its journal (a run killed between writing manifest.json and removing the journal) is
   not refused here: *finished_journal is set and the caller decides with pk_finished_journal. */
k3_err pk_prepare_output(const char *out_dir, int force, int *lock_fd, int *finished_journal, k3_diag *d);
k3_err pk_journal_write(pk_writer *w, k3_diag *d);           /* caller holds w->lock */
/* Take over shards an earlier run finished (journal + header + re-hash). A journal of another
   input or other options is refused, or with force discarded (the pack starts over). */
k3_err pk_resume(pk_writer *w, int force, k3_diag *d);
/* The finished pack's leftover journal: same fingerprint -> remove it (K3_OK, the pack is this
   run's result); otherwise the refusal a finished pack gets. */
k3_err pk_finished_journal(pk_writer *w, k3_diag *d);
/* Write tokenizer copies and manifest.json (last), then drop the journal. */
k3_err pk_finish_pack(pk_writer *w, const char *const *tok_names, char *const *tok_data,
                      const size_t *tok_len, int n_tok, char *const *skipped, size_t n_skipped,
                      k3_diag *d);

/* ---------------------------------------------------------------- sources */

/* Streaming a safetensors file front to back (pack_stream.c): the archive's entries and, file by
   file (several at once with --threads), a checkpoint directory. */
typedef struct pk_stream {
    pk_writer *w;
    const char *src;            /* for messages: the archive, or the checkpoint */
    uint32_t *seen_entry;       /* [n_items] the entry (1..) each item came from; NULL: not tracked */
    char ***skipped;            /* vision tensors met (archive); NULL: not collected */
    size_t *n_skipped;
} pk_stream;

typedef struct pk_entry {
    const char *name;           /* the file's name, for messages */
    uint64_t size, pos;         /* its size, bytes consumed */
    uint32_t entry_no;          /* 1.. (pk_stream.seen_entry) */
    uint8_t *hdr;               /* [8 + N] header bytes */
    size_t hdr_fill, hdr_need;
    k3_st_header h;             /* parsed header, tensors sorted by begin */
    int parsed;
    size_t ti;                  /* current tensor */
    pk_item *cur;               /* its item, NULL = skip its bytes */
    pk_feed feed;
    int feeding;
    k3_dl_hash sha;             /* SHA-256 of every byte so far */
    int hash_outside;           /* the caller feeds sha itself (pack_source_dir.c: on a thread of its own) */
    const k3_dl_want *want;     /* what it should hash to (NULL: nothing known) */
    /* the current tensor in an in-place layer (pk_in_place_*): 0 none, 1 of a record left in
       place, 2 of a copied one */
    int ip;
    uint32_t ip_shard, ip_part;
    uint64_t ip_rec, ip_got;    /* its record; its bytes so far */
    k3_hasher64 *ip_h;          /* [record] XXH3-64 of a record left in place, its parts in offset order */
} pk_entry;

void pk_entry_begin(pk_entry *es, const char *name, uint64_t size, uint32_t entry_no, const k3_dl_want *want);
k3_err pk_entry_data(pk_stream *st, pk_entry *es, const uint8_t *p, size_t n, k3_diag *d);
/* The file ended: complete, and its SHA-256 (into sha256) is what want says (K3_ERR_CORRUPT naming path). */
k3_err pk_entry_end(pk_stream *st, pk_entry *es, const char *path, uint8_t sha256[32], k3_diag *d);
void pk_entry_free(pk_entry *es);
/* A file's name, size and SHA-256 for the manifest's "download" (takes w->lock). */
k3_err pk_add_src_file(pk_writer *w, const char *name, uint64_t size, const uint8_t sha256[32], k3_diag *d);
/* The download failed its check: every shard this run finished and the journal go (pack_journal.c),
   so nothing made from the damaged file remains; a rerun after the download is fixed starts over. */
void pk_writer_discard(pk_writer *w);

/* Stream every file of a checkpoint directory into the pack (pack_source_dir.c), threads files at
   once, each checked against dl's hash for it as it is read (dl may be NULL); *bad_download set when
   one was not as published. An --experts-in-place pack streams the same way: the one read that
   writes its trunk also hashes its in-place records and every file's SHA-256. */
k3_err pk_pack_stream_ckpt(pk_writer *w, const k3_st_ckpt *ck, const k3_dl *dl, int threads, int *bad_download,
                           k3_diag *d);

/* SIGINT / SIGTERM: set by main's signal handler, polled between chunks by the sources
   (pack_journal.c). */
extern volatile sig_atomic_t pk_interrupted;   /* the signal number, 0 = none */
/* K3_ERR_IO "interrupted" if a signal came; else K3_OK. */
k3_err pk_check_interrupt(k3_diag *d);

/* Archive input (pack_source_archive.c): one sequential pass over a tar,
   tar.gz or tar.zst (libarchive), from a file or stdin ("-"). */
#define PK_MAX_TOK 3           /* side files: tiktoken.model, tokenizer_config.json, generation_config.json */
typedef struct pk_archive {
    struct archive *a;
    const char *src;            /* for messages */
    char *config;               /* config.json text */
    size_t config_len;
    char *index;                /* model.safetensors.index.json text, or NULL */
    size_t index_len;
    const char *tok_names[PK_MAX_TOK];
    char *tok_data[PK_MAX_TOK]; /* tokenizer files, or NULL */
    size_t tok_len[PK_MAX_TOK];
    char **skipped;             /* [n_skipped] vision tensors met */
    size_t n_skipped;
    int two_pass;               /* config.json was found by a first pass: skip it once */
    pk_input input;             /* the archive file (size, mtime); unused for stdin */
    int download_bad;           /* an entry's SHA-256 was not the one given for it */
    k3_mf_srcfile side[1 + 1 + PK_MAX_TOK];   /* [n_side] config, index and tokenizer files as read */
    int n_side;
} pk_archive;

/* Open and read entries up to config.json. From stdin it must precede the weights; an archive
   file where it does not is read twice: a first pass finds config.json, the packing pass starts
   again from the beginning. ar->input is the archive file's identity for the fingerprint. */
k3_err pk_archive_open(pk_archive *ar, const char *src, k3_diag *d);
/* Stream the remaining entries into the pack, each .safetensors checked against dl's hash for its
   name as it is read (dl may be NULL); checks completeness at the end. */
k3_err pk_archive_pack(pk_archive *ar, pk_writer *w, const k3_dl *dl, k3_diag *d);
void pk_archive_close(pk_archive *ar);

#endif

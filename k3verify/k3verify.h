/*
 * k3verify.h - k3verify's internal interface: a check produces items (one per
 * shard, file, manifest, extra file or checkpoint tensor), each with a list
 * of problems; the report prints an item as one coreutils-style line
 *     trunk-layer-003.k3s: OK
 *     experts-layer-001.k3s: FAILED (expert 17 of layer 1, bytes [..): hash mismatch)
 * or as one JSON Lines record, and keeps the counts for the summary.
 * Output grammar and JSON schema: docs/k3verify.md.
 */
#ifndef K3VERIFY_H
#define K3VERIFY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "k3_progress.h"

/* Problem kinds; the JSON "kind" strings are k3v_kind_name(). Never renumber
   silently: docs/k3verify.md lists the strings. */
enum k3v_kind {
    K3V_HASH,        /* bytes do not match their recorded hash */
    K3V_MISSING,     /* a listed file or tensor is absent */
    K3V_SIZE,        /* file size differs from the manifest (truncated/extended) */
    K3V_HEADER,      /* the shard header is invalid (k3_shard_read_header) */
    K3V_MISMATCH,    /* manifest and shard header (or checkpoint and config) disagree */
    K3V_PADDING,     /* a padding byte is not zero */
    K3V_UNLISTED,    /* a file in the pack directory the manifest does not list */
    K3V_UNFINISHED,  /* a leftover of an interrupted k3pack run */
    K3V_MANIFEST,    /* manifest.json is missing or invalid */
    K3V_IO,          /* cannot open or read (exit 3 unless damage is also found) */
    K3V_TYPE,        /* not a regular file */
    K3V_FORMAT,      /* checkpoint: invalid safetensors/index/config */
    K3V_UNEXPECTED,  /* checkpoint: a tensor the config does not describe */
    K3V_VALUE,       /* a value the format forbids: an E8M0 scale of 255 (NaN) */
    K3V__COUNT
};

const char *k3v_kind_name(int kind);

#define K3V_NONE (-1)

typedef struct k3v_problem {
    int kind;
    char *msg;          /* text shown inside FAILED (...); names already escaped */
    char *tensor;       /* raw tensor name or NULL */
    int64_t expert;     /* K3V_NONE if not about an expert record */
    int64_t layer;      /* K3V_NONE if not about a layer */
    int has_range;
    uint64_t begin, end;
} k3v_problem;

typedef struct k3v_item {
    const char *type;   /* "manifest", "shard", "file", "link", "checkpoint_file", "extra"; with
                           --checkpoint "checkpoint", "file", "config", "tensor" */
    char *name;         /* raw name (escaped when printed) */
    char *target;       /* "link": where it points (raw), or NULL */
    const char *status; /* NULL = derived: "ok" without problems, else "failed"; or "skipped" */
    const char *note;   /* reason shown for a skipped item */
    const char *file_hash;  /* "ok", "mismatch" or NULL (not checked) */
    uint64_t bytes;     /* bytes read and hashed */
    k3v_problem *pr;    /* [n_pr] */
    size_t n_pr, cap_pr;
    int io;             /* an I/O error, not damage */
} k3v_item;

void k3v_item_init(k3v_item *it, const char *type, const char *name);
void k3v_item_free(k3v_item *it);
/* Add a problem; the returned pointer stays valid until the next add. */
k3v_problem *k3v_add(k3v_item *it, int kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void k3v_set_tensor(k3v_problem *p, const char *name, size_t len);
int k3v_failed(const k3v_item *it);
/* Count problems of one kind. */
size_t k3v_count(const k3v_item *it, int kind);

/* malloc'd escaped copy of a name (k3_escape, never truncated). */
char *k3v_esc(const char *s, size_t len);
/* malloc'd printf; exits with K3_EXIT_INTERNAL on out of memory. */
char *k3v_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void *k3v_xalloc(size_t n);   /* calloc or exit */

typedef struct k3v_tally {
    uint32_t total, checked, failed;
} k3v_tally;

typedef struct k3v_report {
    FILE *out;              /* stdout */
    int json;               /* JSON Lines instead of text */
    int quiet;              /* -q: no OK lines */
    int all_problems;       /* -v: no cap on problems per line */
    k3v_tally shards, files, tensors;
    k3v_tally sources;      /* version 3: checkpoint files read in place */
    int manifest_failed;
    int link_failed;        /* version 3: the checkpoint link is missing or broken */
    uint32_t unlisted, unfinished;
    uint32_t damaged;       /* items failed with at least one non-I/O problem */
    uint32_t io_failed;     /* items failed with I/O problems only */
    uint64_t bytes;         /* bytes read and hashed */
    char manifest_hash[33]; /* XXH3-128 of manifest.json as read, "" if unread: the pack's
                               identity, to compare with a published value */
    double t_start;
    k3_progress progress;
} k3v_report;

void k3v_report_init(k3v_report *r, FILE *out, int json, int quiet, int all_problems);
/* Print one item (text line or JSON record) and count it. */
void k3v_report_item(k3v_report *r, const k3v_item *it);
/* Write a raw JSON summary prefix `{"schema":1,"type":"summary",` ... the caller adds fields
   with k3v_json_* and ends with k3v_json_end. */
void k3v_json_begin(k3v_report *r, const char *type);
void k3v_json_field_str(k3v_report *r, const char *key, const char *val);
void k3v_json_field_u64(k3v_report *r, const char *key, uint64_t v);
void k3v_json_field_raw(k3v_report *r, const char *key, const char *json);
void k3v_json_end(k3v_report *r);
/* Exit code from the counts: 1 if anything failed, else 3 on I/O errors, else 0. */
int k3v_exit_code(const k3v_report *r);

/* ------------------------------------------------------------------ checks */

typedef struct k3v_pack_opts {
    int quick;              /* sizes, headers, consistency only */
    uint32_t subset_n;      /* 1-based; 0 = no subset */
    uint32_t subset_t;
    int threads;            /* shards in parallel */
    size_t buf_size;        /* read buffer per shard */
} k3v_pack_opts;

/* The pack summary: JSON record (--json) and the line on stderr. n_sources, n_src_sel: the
   checkpoint files of an in-place pack (version 3) and those hashed in the --subset. */
void k3v_pack_summary(k3v_report *r, const k3v_pack_opts *o, uint32_t n_sel, uint32_t n_shards, uint32_t n_files,
                      uint32_t n_sources, uint32_t n_src_sel, int have_m);

/* Verify the pack in dir; prints items and the summary; returns the exit code. */
int k3v_verify_pack(const char *dir, const k3v_pack_opts *o, k3v_report *r);

/* Validate a safetensors checkpoint against its config.json; returns the exit code. */
/* sums: a SUMS file of SHA-256s (NULL: none; a Hugging Face cache snapshot's own hashes are used anyway);
   threads: files hashed at once. */
int k3v_verify_checkpoint(const char *path, const char *sums, int threads, k3v_report *r);

#endif

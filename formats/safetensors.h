/*
 * safetensors.h - a strict reader for safetensors files and sharded checkpoints.
 *
 * File layout (FORMATS.md §1.1):
 *   bytes 0..7     N, little-endian u64: length of the JSON header
 *   bytes 8..8+N   UTF-8 JSON object: {"__metadata__": {str: str}, "NAME": {"dtype": D,
 *                  "shape": [..], "data_offsets": [BEGIN, END]}, ...}, may be padded
 *                  with whitespace
 *   rest           the data region; BEGIN/END are relative to byte 8+N
 *
 * Rules enforced (each has its own error message, all K3_ERR_FORMAT):
 *   - the file holds at least the 8 length bytes; N <= K3_ST_MAX_HEADER and
 *     8 + N <= file size; N > 0
 *   - the header is valid UTF-8 (no overlong forms, surrogates, code points
 *     above U+10FFFF, truncated sequences) and holds no raw NUL byte
 *   - it is JSON (jansson, duplicate keys rejected, \u0000 rejected), and a JSON object
 *   - "__metadata__", if present, is an object of string values; it is never a tensor
 *   - a tensor name is non-empty (NUL and invalid UTF-8 are excluded above)
 *   - a tensor entry is an object with exactly "dtype", "shape", "data_offsets"
 *   - dtype is one of the known strings (FORMATS.md §1.2)
 *   - shape is an array of at most K3_ST_MAX_RANK integers, each in [0, 2^48-1]
 *   - data_offsets is an array of two integers in [0, 2^48-1] with BEGIN <= END
 *   - numel x bits does not overflow, is a whole number of bytes, and equals END-BEGIN
 *   - sorted by (BEGIN, END), the extents start at 0, have no gap, do not
 *     overlap, no two non-empty tensors share one range
 *   - 8 + N + last END == file size (no trailing bytes, no truncation)
 * Nothing is ever mapped: headers are read with pread after N is checked.
 * Data may be unaligned: read it with memcpy / k3_ld*, never a typed pointer.
 *
 * A checkpoint (k3_st_open) is one .safetensors file, or a directory with
 * model.safetensors.index.json (every weight_map entry must exist in its shard,
 * every shard tensor must be listed, shard names are plain file names of at
 * most 255 bytes), or a
 * directory with exactly one *.safetensors file or with model.safetensors.
 */
#ifndef K3_SAFETENSORS_H
#define K3_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "k3_error.h"

/* ------------------------------------------------------------------------- */
/* dtypes                                                                     */

typedef enum k3_dtype {
    K3_DT_BOOL, K3_DT_U8, K3_DT_I8, K3_DT_F4, K3_DT_F6_E2M3, K3_DT_F6_E3M2,
    K3_DT_F8_E5M2, K3_DT_F8_E4M3, K3_DT_F8_E8M0, K3_DT_F8_E4M3FNUZ, K3_DT_F8_E5M2FNUZ,
    K3_DT_I16, K3_DT_U16, K3_DT_F16, K3_DT_BF16, K3_DT_I32, K3_DT_U32, K3_DT_F32,
    K3_DT_I64, K3_DT_U64, K3_DT_F64, K3_DT_C64,
    K3_DT__COUNT
} k3_dtype;

const char *k3_dtype_name(k3_dtype dt);            /* "BF16"; "?" if out of range */
unsigned k3_dtype_bits(k3_dtype dt);               /* 4, 6, 8, 16, 32, 64 */
/* Parse a dtype string of len bytes; 0 on success, -1 if unknown. */
int k3_dtype_parse(const char *s, size_t len, k3_dtype *out);

/* "[3072, 1792]" ("[]" for a scalar) into out (cap >= K3_ST_SHAPE_STR bytes for any rank). */
#define K3_ST_SHAPE_STR (K3_ST_MAX_RANK * 22 + 4)
void k3_st_fmt_shape(const uint64_t *shape, unsigned rank, char *out, size_t cap);

/* ------------------------------------------------------------------------- */
/* limits                                                                     */

#define K3_ST_MAX_HEADER 100000000u            /* same cap as the Rust reader */
#define K3_ST_MAX_RANK 8                       /* our limit; real tensors use <= 4 */
#define K3_ST_MAX_INT ((UINT64_C(1) << 48) - 1) /* schema cap for dims and offsets */

/* ------------------------------------------------------------------------- */
/* one parsed header                                                          */

typedef struct k3_st_tensor {
    const char *name;            /* NUL-terminated, valid UTF-8, no NUL inside */
    uint64_t shape[K3_ST_MAX_RANK];
    uint64_t numel;              /* product of shape (1 for a scalar) */
    uint64_t nbytes;             /* END - BEGIN */
    uint64_t begin;              /* relative to the data region */
    uint64_t offset;             /* absolute offset in its file: 8 + N + BEGIN */
    uint32_t name_len;           /* bytes, without the NUL */
    uint32_t file;               /* index into k3_st_ckpt.files (0 for a lone header) */
    uint8_t dtype;               /* k3_dtype */
    uint8_t rank;
} k3_st_tensor;

typedef struct k3_st_meta {
    const char *key, *value;     /* NUL-terminated, from __metadata__ */
} k3_st_meta;

typedef struct k3_st_header {
    uint64_t file_size;          /* bytes of the whole file / archive entry */
    uint64_t header_len;         /* N */
    uint64_t data_start;         /* 8 + N */
    k3_st_tensor *tensors;       /* sorted by (begin, end, name) */
    size_t n_tensors;
    k3_st_meta *meta;            /* __metadata__ entries in file order */
    size_t n_meta;
    char *pool;                  /* owns every string above */
} k3_st_header;

/*
 * Validate the 8-byte length prefix (buf holds at least len bytes of the file
 * start; file_size is the size of the whole file or archive entry). On success
 * *header_len = N. Fails if the file is shorter than 8 bytes, N is over the
 * limit or runs past file_size.
 */
k3_err k3_st_check_prefix(const uint8_t *buf, size_t len, uint64_t file_size,
                          const char *display_name, uint64_t *header_len, k3_diag *d);

/*
 * Parse and validate a whole header. buf holds the first len bytes of the
 * file (at least 8 + N of them); file_size is the size of the file or archive
 * entry. Pure: no I/O. On success *out owns its memory (k3_st_header_free);
 * on failure *out is empty. Messages start with "'display_name': ".
 */
k3_err k3_st_parse_header(const uint8_t *buf, size_t len, uint64_t file_size,
                          const char *display_name, k3_st_header *out, k3_diag *d);

void k3_st_header_free(k3_st_header *h);

/* Read and validate the header of an open file (pread only, never mmap). */
k3_err k3_st_read_header(int fd, const char *path, const char *display_name,
                         k3_st_header *out, k3_diag *d);

/* ------------------------------------------------------------------------- */
/* a checkpoint: one file or a (sharded) directory                            */

typedef struct k3_st_file {
    char *path;                  /* path as opened (dir + name) */
    char *name;                  /* file name for display */
    uint64_t size;
    uint64_t header_len;         /* N */
    size_t first_tensor;         /* its tensors are tensors[first .. first+n) */
    size_t n_tensors;
    k3_st_meta *meta;            /* its __metadata__ */
    size_t n_meta;
} k3_st_file;

typedef struct k3_st_ckpt {
    char *source;                /* the path given to k3_st_open */
    char *dir;                   /* directory holding the files */
    int has_index;               /* opened through model.safetensors.index.json */
    k3_st_file *files;           /* sorted by name */
    size_t n_files;
    k3_st_tensor *tensors;       /* by file, then by offset */
    size_t n_tensors;
    uint64_t total_bytes;        /* sum of tensor bytes */
    char *config_json;           /* config.json text beside the files, or NULL */
    size_t config_len;
    char **warnings;             /* non-fatal findings (e.g. total_size mismatch) */
    size_t n_warnings;
    /* private */
    size_t tensors_cap;
    char **pools;
    size_t n_pools;
    uint32_t *hash;              /* open addressing: tensor index + 1, 0 = empty */
    size_t hash_cap;             /* power of two */
} k3_st_ckpt;

#define K3_ST_INDEX_NAME "model.safetensors.index.json"
#define K3_ST_MAX_INDEX (1024u * 1024u * 1024u)  /* index.json size limit */
#define K3_ST_MAX_CONFIG (64u * 1024u * 1024u)   /* config.json size limit */

/*
 * Open path: a .safetensors file, or a directory (see the top of this file).
 * Reads headers only. Errors: K3_ERR_FORMAT (invalid data), K3_ERR_NOT_FOUND
 * (path or a shard named by the index is missing), K3_ERR_IO, K3_ERR_NOMEM.
 */
k3_err k3_st_open(const char *path, k3_st_ckpt *out, k3_diag *d);
void k3_st_close(k3_st_ckpt *c);

/*
 * For collections built by hand (k3inspect shows a k3 pack through this same
 * structure): after files, tensors and pools are filled (all malloc'd, owned
 * by c, freed by k3_st_close), build the name index. Duplicate names fail.
 */
k3_err k3_st_index(k3_st_ckpt *c, k3_diag *d);

/* Find a tensor by full name (hash lookup); NULL if absent. */
const k3_st_tensor *k3_st_find(const k3_st_ckpt *c, const char *name);

#endif

/*
 * k3_shard.h - the k3 shard file (.k3s): header codec and layout rules.
 * The specification is docs/FORMAT.md; section numbers below refer to it.
 *
 *   +----------------+ 0
 *   | fixed header   | 128 B (2.1): magic "K3SHARD\0", version, byte-order
 *   |                |  marker, kind, alignment, layer, counts, offsets,
 *   |                |  record geometry, reserved (zero), header_hash
 *   +----------------+ 128
 *   | entry table    | n_entries x 64 B (2.2)
 *   | name blob      | names_size B
 *   | zero padding   |
 *   +----------------+ data_offset (multiple of alignment)
 *   | data           | trunk: aligned tensors; experts: records at a fixed stride
 *   +----------------+ file_size
 */
#ifndef K3_SHARD_H
#define K3_SHARD_H

#include <stdint.h>
#include <stddef.h>

#include "k3_error.h"

#define K3_PACK_VERSION 2           /* 2: manifest.json carries its own checksum (FORMAT.md 6); shards stay 2 */
#define K3_PACK_VERSION_MAX 3       /* 3: a manifest may read expert records in place in the checkpoint */
#define K3_SHARD_FIXED_SIZE 128
#define K3_SHARD_ENTRY_SIZE 64
#define K3_SHARD_MAX_ENTRIES 65536u
#define K3_SHARD_MAX_NAMES (16u << 20)
#define K3_SHARD_MAX_NAME 4096u
#define K3_SHARD_MAX_DIMS 4
#define K3_SHARD_ALIGN 4096u        /* what k3pack writes */
#define K3_RECORD_PART_ALIGN 64u
#define K3_BYTE_ORDER_MARK 0x01020304u
#define K3_LAYER_NONE 0xFFFFFFFFu

enum k3_shard_kind { K3_SHARD_TRUNK = 1, K3_SHARD_EXPERTS = 2 };

/* Encodings (section 3). Codes are part of the format: never renumber. */
enum k3_enc {
    K3_ENC_BF16 = 1, K3_ENC_F16, K3_ENC_F32, K3_ENC_F64, K3_ENC_U8, K3_ENC_I8,
    K3_ENC_I16, K3_ENC_I32, K3_ENC_I64, K3_ENC_MXFP4, K3_ENC_E8M0,
    K3_ENC_Q8,          /* version 3: int8 codes of a compact trunk matrix, scaled by its sibling
                           NAME_scale (E8M0 [rows, cols/32]): value = q * 2^(s - 127) */
    K3_ENC__END
};

const char *k3_enc_name(int enc);          /* NULL for unknown codes */
int k3_enc_from_name(const char *name);    /* 0 if unknown */
int k3_enc_bits(int enc);                  /* 0 if unknown */
/* bytes of a tensor: product(shape) * bits / 8, exact and overflow-checked */
k3_err k3_enc_size(int enc, int ndim, const uint64_t *shape, uint64_t *bytes, k3_diag *d);

typedef struct k3_shard_entry {
    uint64_t offset;      /* trunk: absolute file offset; experts: offset in the record */
    uint64_t size;        /* bytes */
    const char *name;     /* points into the header's name blob (not NUL-terminated) */
    uint32_t name_len;
    uint8_t encoding;     /* enum k3_enc */
    uint8_t ndim;         /* 0..4 */
    uint64_t shape[K3_SHARD_MAX_DIMS];
} k3_shard_entry;

typedef struct k3_shard_header {
    uint32_t version, kind, alignment, layer, n_entries;
    uint64_t names_size, data_offset, file_size;
    uint64_t n_records, record_size, record_stride;   /* experts only */
    uint64_t header_hash;
    k3_shard_entry *entries;  /* [n_entries], owned */
    char *names;              /* [names_size], owned */
} k3_shard_header;

/*
 * Writer: given kind, alignment, layer, n_records and the entries' names,
 * encodings and shapes (offset/size ignored), compute sizes, offsets,
 * data_offset, file_size and record geometry. Entries keep their order.
 * The names are copied into h->names. h must come from k3_shard_init().
 */
void k3_shard_init(k3_shard_header *h, uint32_t kind, uint32_t layer, uint64_t n_records);
k3_err k3_shard_add(k3_shard_header *h, const char *name, int encoding, int ndim,
                    const uint64_t *shape, k3_diag *d);
k3_err k3_shard_layout(k3_shard_header *h, k3_diag *d);

/* Serialise bytes [0, data_offset) including header_hash. *buf is malloc'd. */
k3_err k3_shard_encode(k3_shard_header *h, uint8_t **buf, size_t *len, k3_diag *d);

/*
 * Reader: parse and check every rule of section 2 for a header image of
 * len >= data_offset bytes; actual_size is the file's size on disk.
 */
k3_err k3_shard_decode(const uint8_t *buf, size_t len, uint64_t actual_size, const char *path,
                       k3_shard_header *out, k3_diag *d);
/* pread the header of an open shard file and decode it. */
k3_err k3_shard_read_header(int fd, const char *path, k3_shard_header *out, k3_diag *d);

void k3_shard_header_free(k3_shard_header *h);

/* Find an entry by name (linear; shards have few entries). NULL if absent. */
const k3_shard_entry *k3_shard_find(const k3_shard_header *h, const char *name);

#endif

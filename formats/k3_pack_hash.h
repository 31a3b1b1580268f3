/*
 * k3_pack_hash.h - one sequential pass over a shard file that computes every
 * hash the manifest holds: XXH3-128 of the whole file, XXH3-64 of each trunk
 * tensor, XXH3-64 of each expert record, and finds non-zero padding.
 * Used by k3pack (archive input, resume re-check) and k3verify.
 */
#ifndef K3_PACK_HASH_H
#define K3_PACK_HASH_H

#include <stdint.h>

#include "k3_error.h"
#include "k3_hash.h"
#include "k3_shard.h"

typedef struct k3_shard_hashes {
    k3_h128 file;           /* whole file */
    uint64_t *entry;        /* trunk: [n_entries] per tensor; experts: NULL */
    uint64_t *record;       /* experts: [n_records] per record; trunk: NULL */
    uint64_t bad_padding;   /* offset of the first non-zero padding byte (between tensors, between
                               records, or between the parts of a record when h has its parts),
                               or UINT64_MAX */
    uint64_t nan_scale;     /* offset of the first E8M0 byte 255 (NaN, FORMAT.md 3) in a tensor or
                               record part of encoding E8M0 (when h has its entries), or UINT64_MAX */
} k3_shard_hashes;

/* Called after each chunk with bytes done so far (may be NULL). */
typedef void (*k3_hash_progress_fn)(void *ctx, uint64_t done);

/*
 * Read the whole file at fd (pread, buffer of buf_size bytes) and fill out.
 * h must be the shard's validated header (or a geometry with the same
 * rules: spans sorted, disjoint, inside the file). drop_cache: posix_fadvise DONTNEED
 * behind the reader so hashing a terabyte does not fill the page cache.
 */
k3_err k3_shard_hash(int fd, const char *path, const k3_shard_header *h, size_t buf_size, int drop_cache,
                     k3_hash_progress_fn progress, void *ctx, k3_shard_hashes *out, k3_diag *d);
void k3_shard_hashes_free(k3_shard_hashes *s);

#endif

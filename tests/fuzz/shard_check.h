/*
 * shard_check.h - shared by fuzz_shard_header.c and fuzz_expert_layout.c:
 * the header-hash fix-up that lets mutations get past the hash check, and the
 * invariants every decoded shard header must satisfy (docs/FORMAT.md section 2).
 */
#ifndef K3_FUZZ_SHARD_CHECK_H
#define K3_FUZZ_SHARD_CHECK_H

#include "fuzz_util.h"

#include <fcntl.h>

#include "k3_checked.h"
#include "k3_hash.h"
#include "k3_shard.h"

/* Store the right header_hash in a header image whose data_offset lies inside it. */
static inline void fz_fix_shard_hash(uint8_t *b, size_t size)
{
    if (size < K3_SHARD_FIXED_SIZE) return;
    uint64_t data_offset = k3_ld64(b + 40);
    if (data_offset < K3_SHARD_FIXED_SIZE || data_offset > size) return;
    k3_st64(b + 120, 0);
    k3_st64(b + 120, k3_xxh3_64(b, (size_t)data_offset));
}

static inline void fz_check_shard(const k3_shard_header *h, uint64_t file_size)
{
    FZ_EXPECT(h->version == K3_PACK_VERSION && h->file_size == file_size);
    FZ_EXPECT(h->kind == K3_SHARD_TRUNK || h->kind == K3_SHARD_EXPERTS);
    FZ_EXPECT(h->alignment >= 64 && !(h->alignment & (h->alignment - 1)));
    FZ_EXPECT(h->data_offset % h->alignment == 0 && h->data_offset <= file_size);
    FZ_EXPECT(h->n_entries <= K3_SHARD_MAX_ENTRIES && h->names_size <= K3_SHARD_MAX_NAMES);
    uint64_t pos = h->kind == K3_SHARD_TRUNK ? h->data_offset : 0;
    for (uint32_t i = 0; i < h->n_entries; i++) {
        const k3_shard_entry *e = &h->entries[i];
        FZ_EXPECT(e->name >= h->names && e->name_len > 0 &&
                  (uint64_t)(e->name - h->names) + e->name_len <= h->names_size);
        FZ_EXPECT(e->ndim <= K3_SHARD_MAX_DIMS && k3_enc_name(e->encoding));
        uint64_t sz;
        k3_diag d2;
        FZ_EXPECT(k3_enc_size(e->encoding, e->ndim, e->shape, &sz, &d2) == K3_OK && sz == e->size);
        FZ_EXPECT(e->offset >= pos);                       /* in order, no overlap */
        FZ_EXPECT(e->offset % (h->kind == K3_SHARD_TRUNK ? h->alignment : K3_RECORD_PART_ALIGN) == 0);
        FZ_EXPECT(e->offset + e->size >= e->offset);       /* no wrap */
        pos = e->offset + e->size;
        if (h->kind == K3_SHARD_TRUNK) FZ_EXPECT(pos <= file_size);
        if (i) FZ_EXPECT(e->name_len != h->entries[0].name_len || memcmp(e->name, h->entries[0].name, e->name_len));
    }
    if (h->kind == K3_SHARD_EXPERTS) {
        FZ_EXPECT(h->n_entries == 0 || h->entries[0].offset == 0);
        FZ_EXPECT(pos == h->record_size && h->record_stride >= h->record_size);
        FZ_EXPECT(h->record_stride % h->alignment == 0 && h->record_stride - h->record_size < h->alignment);
        /* every record lies inside the file: the last one ends exactly at its end */
        FZ_EXPECT(h->n_records == 0 || h->record_stride == 0 ||
                  h->n_records <= (file_size - h->data_offset) / h->record_stride);
        FZ_EXPECT(h->data_offset + h->record_stride * h->n_records == file_size);
    } else {
        FZ_EXPECT(h->n_records == 0 && h->record_size == 0 && h->record_stride == 0);
    }
}

#endif

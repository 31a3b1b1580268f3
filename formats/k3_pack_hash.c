/* k3_pack_hash.c - hash a shard in one sequential pass (see k3_pack_hash.h). */
#define _GNU_SOURCE
#include "k3_pack_hash.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "k3_file.h"

/*
 * The file is a sequence of spans: [0, data_offset) header, then for trunk
 * shards tensors and zero padding, for expert shards records (hashed over
 * record_size) separated by zero padding. A span table keeps the loop simple.
 */
typedef struct span {
    uint64_t begin, end;
    int64_t index;      /* entry or record index; -1 = padding (must be zero); -2 = header */
} span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Build spans covering [0, file_size). Inside a record, part gaps are padding
   but they are hashed with the record, so a record is one span (its gaps are
   checked for zero separately, record_gaps). */
static span *build_spans(const k3_shard_header *h, size_t *n_out)
{
    size_t cap = 2 * (size_t)(h->kind == K3_SHARD_TRUNK ? h->n_entries : h->n_records) + 3;
    span *s = malloc(cap * sizeof *s);          /* [cap] spans, header/data/padding */
    if (!s) return NULL;
    size_t n = 0;
    s[n++] = (span){0, h->data_offset, -2};
    if (h->kind == K3_SHARD_TRUNK) {
        span *t = s + n;
        for (uint32_t i = 0; i < h->n_entries; i++)
            t[i] = (span){h->entries[i].offset, h->entries[i].offset + h->entries[i].size, i};
        qsort(t, h->n_entries, sizeof *t, cmp_span);
        n += h->n_entries;
    } else {
        for (uint64_t r = 0; r < h->n_records; r++) {
            uint64_t b = h->data_offset + r * h->record_stride;
            s[n++] = (span){b, b + h->record_size, (int64_t)r};
        }
    }
    /* insert padding spans for the gaps (spans are sorted and disjoint) */
    size_t m = n;
    uint64_t pos = 0;
    for (size_t i = 0; i < m; i++) {
        if (s[i].begin > pos) s[n++] = (span){pos, s[i].begin, -1};
        if (s[i].end > pos) pos = s[i].end;
    }
    if (h->file_size > pos) s[n++] = (span){pos, h->file_size, -1};
    qsort(s, n, sizeof *s, cmp_span);
    *n_out = n;
    return s;
}

/* Gaps between the parts of an expert record, relative to the record's start
   (FORMAT.md 2.2: zero). Needs the parts (entries) in offset order; a header
   without parts (k3verify's geometry from the manifest) has none. */
static span *record_gaps(const k3_shard_header *h, size_t *n_out)
{
    *n_out = 0;
    span *g = malloc(((size_t)h->n_entries + 1) * sizeof *g);    /* [n_entries + 1] */
    if (!g) return NULL;
    uint64_t pos = 0;
    for (uint32_t i = 0; h->kind == K3_SHARD_EXPERTS && h->entries && i <= h->n_entries; i++) {
        uint64_t b = i < h->n_entries ? h->entries[i].offset : h->record_size;
        if (b > pos && b <= h->record_size) g[(*n_out)++] = (span){pos, b, -1};
        if (i < h->n_entries && h->entries[i].offset + h->entries[i].size > pos)
            pos = h->entries[i].offset + h->entries[i].size;
    }
    return g;
}

/* The E8M0 parts of an expert record, relative to the record's start: their
   bytes must not be 255 (NaN). None without parts. */
static span *record_scales(const k3_shard_header *h, size_t *n_out)
{
    *n_out = 0;
    span *g = malloc(((size_t)h->n_entries + 1) * sizeof *g);    /* [n_entries + 1] */
    if (!g) return NULL;
    for (uint32_t i = 0; h->kind == K3_SHARD_EXPERTS && h->entries && i < h->n_entries; i++)
        if (h->entries[i].encoding == K3_ENC_E8M0 && h->entries[i].size)
            g[(*n_out)++] = (span){h->entries[i].offset, h->entries[i].offset + h->entries[i].size, -1};
    return g;
}

/* First byte of p[0, len) (at record offset rel) inside one of the ranges g[0, n)
   that is non-zero (nan = 0) or 255 (nan = 1); UINT64_MAX if none. */
static uint64_t find_in_ranges(const uint8_t *p, uint64_t len, uint64_t rel, const span *g, size_t n, int nan)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t b = g[i].begin > rel ? g[i].begin : rel, e = g[i].end < rel + len ? g[i].end : rel + len;
        if (nan && b < e) {
            const uint8_t *ff = memchr(p + (b - rel), 0xFF, (size_t)(e - b));
            if (ff) return (uint64_t)(ff - p);
            continue;
        }
        for (uint64_t k = b; k < e; k++)
            if (p[k - rel]) return k - rel;
    }
    return UINT64_MAX;
}

k3_err k3_shard_hash(int fd, const char *path, const k3_shard_header *h, size_t buf_size, int drop_cache,
                     k3_hash_progress_fn progress, void *ctx, k3_shard_hashes *out, k3_diag *d)
{
    memset(out, 0, sizeof *out);
    out->bad_padding = UINT64_MAX;
    out->nan_scale = UINT64_MAX;
    /* a valid expert header may claim any number of empty records (stride 0):
       2 * n + 3 spans must fit in size_t bytes before anything is allocated */
    uint64_t n_main = h->kind == K3_SHARD_TRUNK ? h->n_entries : h->n_records;
    if (n_main > ((SIZE_MAX / sizeof(span)) - 3) / 2)
        return k3_fail(d, K3_ERR_NOMEM, "'%s': %llu records are too many to hash", path,
                       (unsigned long long)n_main);
    size_t n_spans = 0, n_gaps = 0, n_scales = 0;
    span *spans = build_spans(h, &n_spans);
    span *gaps = record_gaps(h, &n_gaps);
    span *scales = record_scales(h, &n_scales);
    uint8_t *buf = malloc(buf_size);             /* [buf_size] read buffer */
    k3_hasher *file = k3_hasher_new();
    k3_hasher64 *part = k3_hasher64_new();
    if (h->kind == K3_SHARD_TRUNK) out->entry = calloc(h->n_entries + 1, sizeof *out->entry);
    else out->record = calloc(h->n_records + 1, sizeof *out->record);
    k3_err e = K3_OK;
    if (!spans || !gaps || !scales || !buf || !file || !part || (!out->entry && !out->record)) {
        e = k3_fail(d, K3_ERR_NOMEM, "out of memory hashing '%s'", path);
        goto done;
    }
    if (drop_cache) posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    uint64_t pos = 0;
    size_t si = 0;
    int in_span = 0;
    while (pos < h->file_size) {
        size_t len = (size_t)(h->file_size - pos < buf_size ? h->file_size - pos : buf_size);
        if ((e = k3_pread_full(fd, buf, len, pos, path, d))) goto done;
        k3_hasher_update(file, buf, len);
        size_t off = 0;
        while (off < len) {
            span *sp = &spans[si];
            uint64_t abs = pos + off;
            uint64_t take = sp->end - abs;
            if (take > len - off) take = len - off;
            if (sp->index >= 0) {
                if (!in_span) { k3_hasher64_reset(part); in_span = 1; }
                k3_hasher64_update(part, buf + off, (size_t)take);
                if (n_gaps && out->bad_padding == UINT64_MAX) {
                    uint64_t at = find_in_ranges(buf + off, take, abs - sp->begin, gaps, n_gaps, 0);
                    if (at != UINT64_MAX) out->bad_padding = abs + at;
                }
                if (out->nan_scale == UINT64_MAX) {
                    uint64_t at = UINT64_MAX;
                    if (h->kind != K3_SHARD_TRUNK) {
                        if (n_scales) at = find_in_ranges(buf + off, take, abs - sp->begin, scales, n_scales, 1);
                    } else if (h->entries[sp->index].encoding == K3_ENC_E8M0) {
                        const uint8_t *ff = memchr(buf + off, 0xFF, (size_t)take);
                        if (ff) at = (uint64_t)(ff - (buf + off));
                    }
                    if (at != UINT64_MAX) out->nan_scale = abs + at;
                }
            } else if (sp->index == -1 && out->bad_padding == UINT64_MAX) {
                for (uint64_t k = 0; k < take; k++)
                    if (buf[off + k]) { out->bad_padding = abs + k; break; }
            }
            off += (size_t)take;
            if (abs + take == sp->end) {
                if (sp->index >= 0) {
                    uint64_t hv = k3_hasher64_digest(part);
                    if (h->kind == K3_SHARD_TRUNK) out->entry[sp->index] = hv;
                    else out->record[sp->index] = hv;
                }
                in_span = 0;
                si++;
                /* empty spans (zero-size tensors) complete immediately */
                while (si < n_spans && spans[si].begin == spans[si].end) {
                    if (spans[si].index >= 0) {
                        k3_hasher64_reset(part);
                        uint64_t hv = k3_hasher64_digest(part);
                        if (h->kind == K3_SHARD_TRUNK) out->entry[spans[si].index] = hv;
                        else out->record[spans[si].index] = hv;
                    }
                    si++;
                }
            }
        }
        if (drop_cache) posix_fadvise(fd, (off_t)pos, (off_t)len, POSIX_FADV_DONTNEED);
        pos += len;
        if (progress) progress(ctx, pos);
    }
    out->file = k3_hasher_digest(file);
done:
    free(spans);
    free(gaps);
    free(scales);
    free(buf);
    k3_hasher_free(file);
    k3_hasher64_free(part);
    if (e) k3_shard_hashes_free(out);
    return e;
}

void k3_shard_hashes_free(k3_shard_hashes *s)
{
    free(s->entry);
    free(s->record);
    s->entry = s->record = NULL;
}

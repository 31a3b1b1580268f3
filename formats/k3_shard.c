/* k3_shard.c - shard header codec and layout (docs/FORMAT.md section 2). */
#include "k3_shard.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "k3_checked.h"
#include "k3_file.h"
#include "k3_hash.h"
#include "k3_log.h"
#include "k3_utf8.h"

static const struct { const char *name; int bits; } enc_table[K3_ENC__END] = {
    [K3_ENC_BF16] = {"BF16", 16}, [K3_ENC_F16] = {"F16", 16}, [K3_ENC_F32] = {"F32", 32},
    [K3_ENC_F64] = {"F64", 64},   [K3_ENC_U8] = {"U8", 8},    [K3_ENC_I8] = {"I8", 8},
    [K3_ENC_I16] = {"I16", 16},   [K3_ENC_I32] = {"I32", 32}, [K3_ENC_I64] = {"I64", 64},
    [K3_ENC_MXFP4] = {"MXFP4", 4}, [K3_ENC_E8M0] = {"E8M0", 8}, [K3_ENC_Q8] = {"Q8", 8},
};

const char *k3_enc_name(int enc)
{
    return (enc > 0 && enc < K3_ENC__END) ? enc_table[enc].name : NULL;
}

int k3_enc_from_name(const char *name)
{
    for (int e = 1; e < K3_ENC__END; e++)
        if (name && strcmp(name, enc_table[e].name) == 0) return e;
    return 0;
}

int k3_enc_bits(int enc) { return (enc > 0 && enc < K3_ENC__END) ? enc_table[enc].bits : 0; }

k3_err k3_enc_size(int enc, int ndim, const uint64_t *shape, uint64_t *bytes, k3_diag *d)
{
    int bits = k3_enc_bits(enc);
    if (!bits) return k3_fail(d, K3_ERR_FORMAT, "unknown encoding code %d", enc);
    if (ndim < 0 || ndim > K3_SHARD_MAX_DIMS)
        return k3_fail(d, K3_ERR_FORMAT, "%d dimensions, more than the limit of %d", ndim, K3_SHARD_MAX_DIMS);
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++)
        if (k3_mul_u64(n, shape[i], &n)) return k3_fail(d, K3_ERR_FORMAT, "shape overflows 64 bits");
    if (k3_mul_u64(n, (uint64_t)bits, &n)) return k3_fail(d, K3_ERR_FORMAT, "shape overflows 64 bits");
    if (n % 8) return k3_fail(d, K3_ERR_FORMAT, "%s tensor with an odd number of 4-bit elements", k3_enc_name(enc));
    *bytes = n / 8;
    return K3_OK;
}

/* ------------------------------------------------------------------ writer */

void k3_shard_init(k3_shard_header *h, uint32_t kind, uint32_t layer, uint64_t n_records)
{
    memset(h, 0, sizeof *h);
    h->version = K3_PACK_VERSION;
    h->kind = kind;
    h->alignment = K3_SHARD_ALIGN;
    h->layer = layer;
    h->n_records = n_records;
}

k3_err k3_shard_add(k3_shard_header *h, const char *name, int encoding, int ndim,
                    const uint64_t *shape, k3_diag *d)
{
    size_t nl = strlen(name);
    if (nl == 0 || nl > K3_SHARD_MAX_NAME) return k3_fail(d, K3_ERR_INTERNAL, "bad entry name length %zu", nl);
    if (h->n_entries >= K3_SHARD_MAX_ENTRIES) return k3_fail(d, K3_ERR_INTERNAL, "too many entries in a shard");
    if (h->names_size + nl > K3_SHARD_MAX_NAMES) return k3_fail(d, K3_ERR_INTERNAL, "shard names too large");
    k3_shard_entry *ne = realloc(h->entries, (h->n_entries + 1) * sizeof *ne);
    if (!ne) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    h->entries = ne;
    char *nn = realloc(h->names, h->names_size + nl);
    if (!nn) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    h->names = nn;
    memcpy(h->names + h->names_size, name, nl);
    k3_shard_entry *e = &h->entries[h->n_entries];
    memset(e, 0, sizeof *e);
    e->name = NULL;                      /* fixed up in layout (names may move) */
    e->offset = h->names_size;           /* temporarily: offset of the name */
    e->name_len = (uint32_t)nl;
    e->encoding = (uint8_t)encoding;
    e->ndim = (uint8_t)ndim;
    for (int i = 0; i < ndim && i < K3_SHARD_MAX_DIMS; i++) e->shape[i] = shape[i];
    k3_err err = k3_enc_size(encoding, ndim, shape, &e->size, d);
    if (err) return err;
    h->names_size += nl;
    h->n_entries++;
    return K3_OK;
}

k3_err k3_shard_layout(k3_shard_header *h, k3_diag *d)
{
    uint64_t a = h->alignment, pos;
    /* entries' name offsets were stashed in ->offset by k3_shard_add */
    uint64_t name_off = 0;
    for (uint32_t i = 0; i < h->n_entries; i++) {
        h->entries[i].name = h->names + name_off;
        name_off += h->entries[i].name_len;
    }
    uint64_t hdr = K3_SHARD_FIXED_SIZE + (uint64_t)K3_SHARD_ENTRY_SIZE * h->n_entries + h->names_size;
    if (k3_align_up_u64(hdr, a, &h->data_offset)) return k3_fail(d, K3_ERR_INTERNAL, "overflow");
    if (h->kind == K3_SHARD_TRUNK) {
        pos = h->data_offset;
        for (uint32_t i = 0; i < h->n_entries; i++) {
            h->entries[i].offset = pos;
            if (k3_add_u64(pos, h->entries[i].size, &pos) || k3_align_up_u64(pos, a, &pos))
                return k3_fail(d, K3_ERR_INTERNAL, "shard size overflows");
        }
        h->file_size = pos;
        h->record_size = h->record_stride = h->n_records = 0;
    } else {
        pos = 0;
        for (uint32_t i = 0; i < h->n_entries; i++) {
            if (k3_align_up_u64(pos, K3_RECORD_PART_ALIGN, &pos))
                return k3_fail(d, K3_ERR_INTERNAL, "record size overflows");
            h->entries[i].offset = pos;
            if (k3_add_u64(pos, h->entries[i].size, &pos))
                return k3_fail(d, K3_ERR_INTERNAL, "record size overflows");
        }
        h->record_size = pos;
        uint64_t body;
        if (k3_align_up_u64(pos, a, &h->record_stride) ||
            k3_mul_u64(h->record_stride, h->n_records, &body) ||
            k3_add_u64(h->data_offset, body, &h->file_size))
            return k3_fail(d, K3_ERR_INTERNAL, "shard size overflows");
    }
    return K3_OK;
}

k3_err k3_shard_encode(k3_shard_header *h, uint8_t **out, size_t *len, k3_diag *d)
{
    size_t n = (size_t)h->data_offset;
    uint8_t *b = calloc(1, n);                   /* [data_offset] header image, zero padded */
    if (!b) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    memcpy(b, "K3SHARD\0", 8);
    k3_st32(b + 8, h->version);
    k3_st32(b + 12, K3_BYTE_ORDER_MARK);
    k3_st32(b + 16, h->kind);
    k3_st32(b + 20, h->alignment);
    k3_st32(b + 24, h->layer);
    k3_st32(b + 28, h->n_entries);
    k3_st64(b + 32, h->names_size);
    k3_st64(b + 40, h->data_offset);
    k3_st64(b + 48, h->file_size);
    k3_st64(b + 56, h->n_records);
    k3_st64(b + 64, h->record_size);
    k3_st64(b + 72, h->record_stride);
    uint8_t *names = b + K3_SHARD_FIXED_SIZE + (size_t)K3_SHARD_ENTRY_SIZE * h->n_entries;
    uint32_t name_off = 0;
    for (uint32_t i = 0; i < h->n_entries; i++) {
        const k3_shard_entry *e = &h->entries[i];
        uint8_t *r = b + K3_SHARD_FIXED_SIZE + (size_t)K3_SHARD_ENTRY_SIZE * i;
        k3_st64(r, e->offset);
        k3_st64(r + 8, e->size);
        k3_st32(r + 16, name_off);
        k3_st32(r + 20, e->name_len);
        r[24] = e->encoding;
        r[25] = e->ndim;
        for (int k = 0; k < K3_SHARD_MAX_DIMS; k++) k3_st64(r + 32 + 8 * k, e->shape[k]);
        memcpy(names + name_off, e->name, e->name_len);
        name_off += e->name_len;
    }
    h->header_hash = k3_xxh3_64(b, n);           /* field at 120 is still zero */
    k3_st64(b + 120, h->header_hash);
    *out = b;
    *len = n;
    return K3_OK;
}

/* ------------------------------------------------------------------ reader */

static int cmp_entry_name(const void *a, const void *b)
{
    const k3_shard_entry *x = *(const k3_shard_entry *const *)a, *y = *(const k3_shard_entry *const *)b;
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(x->name, y->name, n);
    return c ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

#define BAD(...) do { err = k3_fail(d, K3_ERR_FORMAT, __VA_ARGS__); goto fail; } while (0)

k3_err k3_shard_decode(const uint8_t *b, size_t len, uint64_t actual_size, const char *path,
                       k3_shard_header *h, k3_diag *d)
{
    k3_err err;
    const k3_shard_entry **sorted = NULL;
    memset(h, 0, sizeof *h);
    if (len < K3_SHARD_FIXED_SIZE) return k3_fail(d, K3_ERR_FORMAT, "'%s': shorter than a shard header (%zu bytes)", path, len);
    if (memcmp(b, "K3SHARD\0", 8) != 0) return k3_fail(d, K3_ERR_FORMAT, "'%s': not a k3 shard (bad magic)", path);
    h->version = k3_ld32(b + 8);
    if (k3_ld32(b + 12) != K3_BYTE_ORDER_MARK)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': byte-order marker is 0x%08x, expected 0x%08x", path,
                       k3_ld32(b + 12), K3_BYTE_ORDER_MARK);
    if (h->version > K3_PACK_VERSION)          /* FORMAT.md section 6 wording */
        return k3_fail(d, K3_ERR_UNSUPPORTED, "'%s': shard format version %u is newer than this k3 (%d); upgrade k3",
                       path, h->version, K3_PACK_VERSION);
    if (h->version >= 1 && h->version < K3_PACK_VERSION)
        return k3_fail(d, K3_ERR_UNSUPPORTED, "'%s': shard format version %u is older than this k3 (%d); re-run "
                       "k3pack to make the pack again", path, h->version, K3_PACK_VERSION);
    if (h->version != K3_PACK_VERSION)
        return k3_fail(d, K3_ERR_UNSUPPORTED, "'%s': shard format version %u is not supported by this k3 (%d)",
                       path, h->version, K3_PACK_VERSION);
    h->kind = k3_ld32(b + 16);
    h->alignment = k3_ld32(b + 20);
    h->layer = k3_ld32(b + 24);
    h->n_entries = k3_ld32(b + 28);
    h->names_size = k3_ld64(b + 32);
    h->data_offset = k3_ld64(b + 40);
    h->file_size = k3_ld64(b + 48);
    h->n_records = k3_ld64(b + 56);
    h->record_size = k3_ld64(b + 64);
    h->record_stride = k3_ld64(b + 72);
    h->header_hash = k3_ld64(b + 120);
    if (h->kind != K3_SHARD_TRUNK && h->kind != K3_SHARD_EXPERTS)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': unknown shard kind %u", path, h->kind);
    if (h->alignment < 64 || (h->alignment & (h->alignment - 1)) || h->alignment > (1u << 24))
        return k3_fail(d, K3_ERR_FORMAT, "'%s': alignment %u is not a power of two in [64, 16 MiB]", path, h->alignment);
    if (!all_zero(b + 80, 40)) return k3_fail(d, K3_ERR_FORMAT, "'%s': reserved header bytes 80..119 are not zero", path);
    if (h->n_entries > K3_SHARD_MAX_ENTRIES)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': %u entries, more than the limit of %u", path, h->n_entries, K3_SHARD_MAX_ENTRIES);
    if (h->names_size > K3_SHARD_MAX_NAMES)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': name blob of %llu bytes exceeds the limit", path, (unsigned long long)h->names_size);
    uint64_t hdr = K3_SHARD_FIXED_SIZE + (uint64_t)K3_SHARD_ENTRY_SIZE * h->n_entries + h->names_size, want = 0;
    k3_align_up_u64(hdr, h->alignment, &want);
    if (h->data_offset != want)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': data_offset is %llu, expected %llu", path,
                       (unsigned long long)h->data_offset, (unsigned long long)want);
    if (h->file_size != actual_size)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': file is %llu bytes but its header says %llu (truncated or extended)",
                       path, (unsigned long long)actual_size, (unsigned long long)h->file_size);
    if (h->data_offset > h->file_size)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': data_offset %llu is past the end of the file", path,
                       (unsigned long long)h->data_offset);
    if (len < h->data_offset) return k3_fail(d, K3_ERR_INTERNAL, "'%s': header image too short", path);
    {   /* header hash over [0, data_offset) with the hash field read as zero
           (streamed in three pieces: the caller's buffer is never written) */
        static const uint8_t zero8[8];
        k3_hasher64 *hs = k3_hasher64_new();
        if (!hs) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
        k3_hasher64_update(hs, b, 120);
        k3_hasher64_update(hs, zero8, 8);
        k3_hasher64_update(hs, b + 128, (size_t)h->data_offset - 128);
        uint64_t hh = k3_hasher64_digest(hs);
        k3_hasher64_free(hs);
        if (hh != h->header_hash)
            return k3_fail(d, K3_ERR_CORRUPT, "'%s': header hash mismatch (header damaged)", path);
    }
    h->names = malloc(h->names_size ? h->names_size : 1);       /* [names_size] */
    h->entries = calloc(h->n_entries ? h->n_entries : 1, sizeof *h->entries);
    sorted = calloc(h->n_entries ? h->n_entries : 1, sizeof *sorted);
    if (!h->names || !h->entries || !sorted) { err = k3_fail(d, K3_ERR_NOMEM, "out of memory"); goto fail; }
    const uint8_t *names = b + K3_SHARD_FIXED_SIZE + (size_t)K3_SHARD_ENTRY_SIZE * h->n_entries;
    memcpy(h->names, names, h->names_size);
    if (!all_zero(names + h->names_size, (size_t)(h->data_offset - hdr)))
        BAD("'%s': padding before the data region is not zero", path);
    for (uint32_t i = 0; i < h->n_entries; i++) {
        const uint8_t *r = b + K3_SHARD_FIXED_SIZE + (size_t)K3_SHARD_ENTRY_SIZE * i;
        k3_shard_entry *e = &h->entries[i];
        e->offset = k3_ld64(r);
        e->size = k3_ld64(r + 8);
        uint32_t no = k3_ld32(r + 16);
        e->name_len = k3_ld32(r + 20);
        e->encoding = r[24];
        e->ndim = r[25];
        for (int k = 0; k < K3_SHARD_MAX_DIMS; k++) e->shape[k] = k3_ld64(r + 32 + 8 * k);
        if (e->name_len == 0 || e->name_len > K3_SHARD_MAX_NAME || (uint64_t)no + e->name_len > h->names_size)
            BAD("'%s': entry %u: name (offset %u, length %u) lies outside the name blob", path, i, no, e->name_len);
        e->name = h->names + no;
        char esc[256];
        k3_escape(e->name, e->name_len, esc, sizeof esc);
        size_t bad_at;
        if (k3_utf8_problem((const unsigned char *)e->name, e->name_len, &bad_at))
            BAD("'%s': entry %u: name '%s' is not valid UTF-8", path, i, esc);
        if (!all_zero(r + 26, 6)) BAD("'%s': entry '%s': reserved bytes are not zero", path, esc);
        if (e->ndim > K3_SHARD_MAX_DIMS) BAD("'%s': entry '%s': %u dimensions (limit %d)", path, esc, e->ndim, K3_SHARD_MAX_DIMS);
        for (int k = e->ndim; k < K3_SHARD_MAX_DIMS; k++)
            if (e->shape[k]) BAD("'%s': entry '%s': unused shape slot %d is not zero", path, esc, k);
        if (!k3_enc_name(e->encoding)) BAD("'%s': entry '%s': unknown encoding code %u", path, esc, e->encoding);
        uint64_t sz;
        k3_diag d2;
        if (k3_enc_size(e->encoding, e->ndim, e->shape, &sz, &d2))
            BAD("'%s': entry '%s': %s", path, esc, d2.msg);
        if (sz != e->size)
            BAD("'%s': entry '%s': size %llu does not match its shape and encoding (%llu bytes)", path, esc,
                (unsigned long long)e->size, (unsigned long long)sz);
        sorted[i] = e;
    }
    /* names unique: sort pointers by name, compare neighbours */
    qsort(sorted, h->n_entries, sizeof *sorted, cmp_entry_name);
    for (uint32_t i = 1; i < h->n_entries; i++)
        if (sorted[i]->name_len == sorted[i - 1]->name_len &&
            !memcmp(sorted[i]->name, sorted[i - 1]->name, sorted[i]->name_len)) {
            char esc[256];
            BAD("'%s': two entries are named '%s'", path,
                k3_escape(sorted[i]->name, sorted[i]->name_len, esc, sizeof esc));
        }
    /* section 2.2: the table lists entries in offset order (checked as listed,
       not after a sort, so the verdict never depends on how ties sort) */
    if (h->kind == K3_SHARD_TRUNK) {
        if (h->n_records || h->record_size || h->record_stride)
            BAD("'%s': trunk shard with non-zero record fields", path);
        uint64_t pos = h->data_offset;
        for (uint32_t i = 0; i < h->n_entries; i++) {
            const k3_shard_entry *e = &h->entries[i];
            char esc[256];
            k3_escape(e->name, e->name_len, esc, sizeof esc);
            if (e->offset % h->alignment) BAD("'%s': tensor '%s' at offset %llu is not aligned to %u", path, esc,
                                             (unsigned long long)e->offset, h->alignment);
            if (i && e->offset < h->entries[i - 1].offset)
                BAD("'%s': tensor '%s' at offset %llu is listed after one at offset %llu: entries must be in "
                    "offset order", path, esc, (unsigned long long)e->offset,
                    (unsigned long long)h->entries[i - 1].offset);
            if (e->offset < pos) BAD("'%s': tensor '%s' at offset %llu overlaps the header or another tensor", path, esc,
                                     (unsigned long long)e->offset);
            if (k3_add_u64(e->offset, e->size, &pos) || pos > h->file_size)
                BAD("'%s': tensor '%s' [%llu, +%llu) extends past the end of the file", path, esc,
                    (unsigned long long)e->offset, (unsigned long long)e->size);
        }
        uint64_t end = 0;
        k3_align_up_u64(pos, h->alignment, &end);
        if (end != h->file_size) BAD("'%s': file ends at %llu, expected %llu after the last tensor", path,
                                     (unsigned long long)h->file_size, (unsigned long long)end);
    } else {
        uint64_t pos = 0, stride = 0, body = 0, total = 0;
        for (uint32_t i = 0; i < h->n_entries; i++) {
            const k3_shard_entry *e = &h->entries[i];
            char esc[256];
            k3_escape(e->name, e->name_len, esc, sizeof esc);
            if (i == 0 && e->offset != 0)
                BAD("'%s': record part '%s' is at offset %llu: the parts of a record start at 0", path, esc,
                    (unsigned long long)e->offset);
            if (i && e->offset < h->entries[i - 1].offset)
                BAD("'%s': record part '%s' at offset %llu is listed after one at offset %llu: parts must be in "
                    "offset order", path, esc, (unsigned long long)e->offset,
                    (unsigned long long)h->entries[i - 1].offset);
            if (e->offset % K3_RECORD_PART_ALIGN || e->offset < pos)
                BAD("'%s': record part '%s' at offset %llu is misaligned or overlaps", path, esc, (unsigned long long)e->offset);
            if (k3_add_u64(e->offset, e->size, &pos)) BAD("'%s': record part '%s' overflows", path, esc);
        }
        if (pos != h->record_size)
            BAD("'%s': record_size is %llu, but its parts end at %llu", path, (unsigned long long)h->record_size,
                (unsigned long long)pos);
        if (k3_align_up_u64(pos, h->alignment, &stride) || stride != h->record_stride)
            BAD("'%s': record_stride is %llu, expected %llu", path, (unsigned long long)h->record_stride,
                (unsigned long long)stride);
        if (k3_mul_u64(stride, h->n_records, &body) || k3_add_u64(h->data_offset, body, &total) ||
            total != h->file_size)
            BAD("'%s': %llu records of %llu bytes do not fill the file", path, (unsigned long long)h->n_records,
                (unsigned long long)stride);
    }
    free(sorted);
    return K3_OK;
fail:
    free(sorted);
    k3_shard_header_free(h);
    return err;
}

k3_err k3_shard_read_header(int fd, const char *path, k3_shard_header *out, k3_diag *d)
{
    struct stat st;
    if (fstat(fd, &st) != 0) return k3_fail(d, K3_ERR_IO, "cannot stat '%s'", path);
    uint64_t size = (uint64_t)st.st_size;
    uint8_t fixed[K3_SHARD_FIXED_SIZE];
    if (size < K3_SHARD_FIXED_SIZE)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': %llu bytes, shorter than a shard header", path,
                       (unsigned long long)size);
    k3_err e = k3_pread_full(fd, fixed, sizeof fixed, 0, path, d);
    if (e) return e;
    uint64_t data_offset = k3_ld64(fixed + 40);
    /* Nothing is allocated from a field before the fixed part alone is decoded: it names
       the first broken field (counts over their limits, a data_offset that does not follow
       from them, a file_size other than the file's); K3_ERR_INTERNAL only says the rest
       of the header image is missing. Then the largest legal header bounds the buffer. */
    k3_err e2 = k3_shard_decode(fixed, sizeof fixed, size, path, out, d);
    if (e2 == K3_OK) k3_shard_header_free(out);
    else if (e2 != K3_ERR_INTERNAL) return e2;
    uint64_t max_hdr = K3_SHARD_FIXED_SIZE + (uint64_t)K3_SHARD_ENTRY_SIZE * K3_SHARD_MAX_ENTRIES +
                       K3_SHARD_MAX_NAMES + (1u << 24);
    if (data_offset < K3_SHARD_FIXED_SIZE || data_offset > max_hdr || data_offset > size)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': data_offset %llu is out of range", path,
                       (unsigned long long)data_offset);
    uint8_t *buf = malloc((size_t)data_offset);   /* [data_offset] header image */
    if (!buf) return k3_fail(d, K3_ERR_NOMEM, "out of memory reading '%s'", path);
    e = k3_pread_full(fd, buf, (size_t)data_offset, 0, path, d);
    if (!e) e = k3_shard_decode(buf, (size_t)data_offset, size, path, out, d);
    free(buf);
    return e;
}

void k3_shard_header_free(k3_shard_header *h)
{
    free(h->entries);
    free(h->names);
    h->entries = NULL;
    h->names = NULL;
    h->n_entries = 0;
}

const k3_shard_entry *k3_shard_find(const k3_shard_header *h, const char *name)
{
    size_t nl = strlen(name);
    for (uint32_t i = 0; i < h->n_entries; i++)
        if (h->entries[i].name_len == nl && !memcmp(h->entries[i].name, name, nl)) return &h->entries[i];
    return NULL;
}

/*
 * safetensors.c - dtypes and the strict parser of one safetensors header.
 *
 * Order of the checks (each failure has its own message, see safetensors.h):
 *   prefix (8 bytes, N) -> UTF-8 and raw NUL scan -> JSON (k3_json) -> object
 *   -> per entry (metadata or tensor fields) -> extents sorted and contiguous
 *   -> extents end exactly at the end of the file.
 */
#include "safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "k3_checked.h"
#include "k3_file.h"
#include "k3_json.h"
#include "k3_log.h"
#include "k3_utf8.h"

/* ------------------------------------------------------------------------- */
/* dtypes (FORMATS.md §1.2)                                                   */

static const struct { const char *name; unsigned bits; } k3_dtypes[K3_DT__COUNT] = {
    [K3_DT_BOOL] = {"BOOL", 8},         [K3_DT_U8] = {"U8", 8},
    [K3_DT_I8] = {"I8", 8},             [K3_DT_F4] = {"F4", 4},
    [K3_DT_F6_E2M3] = {"F6_E2M3", 6},   [K3_DT_F6_E3M2] = {"F6_E3M2", 6},
    [K3_DT_F8_E5M2] = {"F8_E5M2", 8},   [K3_DT_F8_E4M3] = {"F8_E4M3", 8},
    [K3_DT_F8_E8M0] = {"F8_E8M0", 8},   [K3_DT_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [K3_DT_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [K3_DT_I16] = {"I16", 16},          [K3_DT_U16] = {"U16", 16},
    [K3_DT_F16] = {"F16", 16},          [K3_DT_BF16] = {"BF16", 16},
    [K3_DT_I32] = {"I32", 32},          [K3_DT_U32] = {"U32", 32},
    [K3_DT_F32] = {"F32", 32},          [K3_DT_I64] = {"I64", 64},
    [K3_DT_U64] = {"U64", 64},          [K3_DT_F64] = {"F64", 64},
    [K3_DT_C64] = {"C64", 64},
};

const char *k3_dtype_name(k3_dtype dt)
{
    return (unsigned)dt < K3_DT__COUNT ? k3_dtypes[dt].name : "?";
}

unsigned k3_dtype_bits(k3_dtype dt)
{
    return (unsigned)dt < K3_DT__COUNT ? k3_dtypes[dt].bits : 0;
}

int k3_dtype_parse(const char *s, size_t len, k3_dtype *out)
{
    for (int i = 0; i < K3_DT__COUNT; i++) {
        if (strlen(k3_dtypes[i].name) == len && memcmp(k3_dtypes[i].name, s, len) == 0) {
            *out = (k3_dtype)i;
            return 0;
        }
    }
    return -1;
}

/* ------------------------------------------------------------------------- */
/* helpers                                                                    */

/* An escaped, quoted-safe copy of an untrusted name for messages. */
typedef struct { char s[200]; } esc_buf;
static const char *esc(esc_buf *b, const char *s, size_t len)
{
    return k3_escape(s, len, b->s, sizeof b->s);
}
static const char *esc0(esc_buf *b, const char *s) { return esc(b, s, strlen(s)); }

void k3_st_fmt_shape(const uint64_t *shape, unsigned rank, char *out, size_t cap)
{
    size_t o = 0;
    o += (size_t)snprintf(out + o, cap - o, "[");
    for (unsigned i = 0; i < rank && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "%s%" PRIu64, i ? ", " : "", shape[i]);
    if (o < cap) snprintf(out + o, cap - o, "]");
}

/* ------------------------------------------------------------------------- */
/* the 8-byte prefix                                                          */

k3_err k3_st_check_prefix(const uint8_t *buf, size_t len, uint64_t file_size,
                          const char *dn, uint64_t *header_len, k3_diag *d)
{
    if (file_size < 8)
        return k3_fail(d, K3_ERR_FORMAT,
                       "'%s': file is %" PRIu64 " bytes, too short for the 8-byte header length",
                       dn, file_size);
    if (len < 8)
        return k3_fail(d, K3_ERR_INTERNAL, "'%s': header buffer holds only %zu bytes", dn, len);
    uint64_t n = k3_ld64(buf);
    if (n > K3_ST_MAX_HEADER)
        return k3_fail(d, K3_ERR_FORMAT,
                       "'%s': header length %" PRIu64 " exceeds the limit of %u bytes",
                       dn, n, K3_ST_MAX_HEADER);
    if (n > file_size - 8)
        return k3_fail(d, K3_ERR_FORMAT,
                       "'%s': header length %" PRIu64 " runs past the end of the file (%" PRIu64
                       " bytes)", dn, n, file_size);
    if (n == 0)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': header length is 0: no JSON header", dn);
    *header_len = n;
    return K3_OK;
}

/* ------------------------------------------------------------------------- */
/* one tensor entry                                                           */

static const char *type_name(const k3j_tok *v)
{
    switch ((k3j_type)v->type) {
    case K3J_OBJ: return "an object";
    case K3J_ARR: return "an array";
    case K3J_STR: return "a string";
    case K3J_INT: return "an integer";
    case K3J_REAL: return "a real number";
    case K3J_TRUE: case K3J_FALSE: return "a boolean";
    default: return "null";
    }
}

/*
 * Messages of get_uint and parse_tensor lack the "'file': tensor 'name': "
 * prefix: the caller adds it on failure, so names are escaped only then.
 */

/* An integer field in [0, K3_ST_MAX_INT]; what names it in messages. */
static k3_err get_uint(const k3j_tok *v, const char *what,
                       unsigned idx, uint64_t *out, k3_diag *d)
{
    if (v->type != K3J_INT)
        return k3_fail(d, K3_ERR_FORMAT, "%s[%u] is not an integer",
                       what, idx);
    int64_t x = v->v.i;
    if (x < 0)
        return k3_fail(d, K3_ERR_FORMAT, "%s[%u] is negative (%lld)",
                       what, idx, (long long)x);
    if ((uint64_t)x > K3_ST_MAX_INT)
        return k3_fail(d, K3_ERR_FORMAT,
                       "%s[%u] = %lld is larger than 2^48-1", what,
                       idx, (long long)x);
    *out = (uint64_t)x;
    return K3_OK;
}

static k3_err parse_tensor(const k3j_doc *doc, uint32_t vi, uint64_t data_start, k3_st_tensor *t,
                           k3_diag *d)
{
    const k3j_tok *tok = doc->t;
    if (tok[vi].type != K3J_OBJ)
        return k3_fail(d, K3_ERR_FORMAT, "entry is not a JSON object");
    uint32_t jd = 0, js = 0, jo = 0;
    for (uint32_t k = k3j_first(doc, vi); k; k = k3j_next(doc, vi, k)) {
        if (k3j_streq(&tok[k], "dtype")) jd = k + 1;
        else if (k3j_streq(&tok[k], "shape")) js = k + 1;
        else if (k3j_streq(&tok[k], "data_offsets")) jo = k + 1;
        else {
            esc_buf b;
            return k3_fail(d, K3_ERR_FORMAT, "unexpected field '%s'", esc(&b, tok[k].v.s, tok[k].size));
        }
    }
    if (!jd) return k3_fail(d, K3_ERR_FORMAT, "missing field 'dtype'");
    if (!js) return k3_fail(d, K3_ERR_FORMAT, "missing field 'shape'");
    if (!jo) return k3_fail(d, K3_ERR_FORMAT, "missing field 'data_offsets'");

    /* dtype */
    if (tok[jd].type != K3J_STR)
        return k3_fail(d, K3_ERR_FORMAT, "dtype is not a string");
    k3_dtype dt;
    if (k3_dtype_parse(tok[jd].v.s, tok[jd].size, &dt)) {
        esc_buf b;
        return k3_fail(d, K3_ERR_FORMAT, "unknown dtype '%s'", esc(&b, tok[jd].v.s, tok[jd].size));
    }
    t->dtype = (uint8_t)dt;

    /* shape */
    if (tok[js].type != K3J_ARR)
        return k3_fail(d, K3_ERR_FORMAT, "shape is not an array");
    size_t rank = tok[js].size;
    if (rank > K3_ST_MAX_RANK)
        return k3_fail(d, K3_ERR_FORMAT, "rank %zu exceeds the limit of %d",
                       rank, K3_ST_MAX_RANK);
    t->rank = (uint8_t)rank;
    uint64_t numel = 1;
    int numel_overflow = 0, has_zero = 0;
    unsigned i = 0;
    for (uint32_t e = k3j_first(doc, js); e; e = k3j_next(doc, js, e), i++) {
        k3_err err = get_uint(&tok[e], "shape", i, &t->shape[i], d);
        if (err) return err;
        has_zero |= t->shape[i] == 0;
        if (!numel_overflow && k3_mul_u64(numel, t->shape[i], &numel)) numel_overflow = 1;
    }
    char sh[K3_ST_SHAPE_STR];
    k3_st_fmt_shape(t->shape, t->rank, sh, sizeof sh);
    if (has_zero) { numel = 0; numel_overflow = 0; }   /* a zero dimension wins over an overflow */
    if (numel_overflow)
        return k3_fail(d, K3_ERR_FORMAT,
                       "element count of shape %s overflows 64 bits", sh);
    t->numel = numel;

    /* data_offsets */
    if (tok[jo].type != K3J_ARR || tok[jo].size != 2)
        return k3_fail(d, K3_ERR_FORMAT,
                       "data_offsets is not an array of 2 integers");
    uint64_t begin, end;
    uint32_t e0 = jo + 1, e1 = tok[e0].next;
    k3_err err = get_uint(&tok[e0], "data_offsets", 0, &begin, d);
    if (!err) err = get_uint(&tok[e1], "data_offsets", 1, &end, d);
    if (err) return err;
    if (end < begin)
        return k3_fail(d, K3_ERR_FORMAT,
                       "data_offsets [%" PRIu64 ", %" PRIu64 ") end before they begin",
                       begin, end);

    /* size */
    uint64_t bits;
    if (k3_mul_u64(numel, k3_dtype_bits(dt), &bits))
        return k3_fail(d, K3_ERR_FORMAT, "size of shape %s x %s overflows 64 bits",
                       sh, k3_dtype_name(dt));
    if (bits % 8)
        return k3_fail(d, K3_ERR_FORMAT,
                       "shape %s x %s is %" PRIu64 " bits, not a whole number of bytes",
                       sh, k3_dtype_name(dt), bits);
    if (bits / 8 != end - begin)
        return k3_fail(d, K3_ERR_FORMAT,
                       "data_offsets [%" PRIu64 ", %" PRIu64 ") hold %" PRIu64
                       " bytes but shape %s x %s needs %" PRIu64 " bytes",
                       begin, end, end - begin, sh, k3_dtype_name(dt), bits / 8);
    t->begin = begin;
    t->nbytes = end - begin;
    t->offset = data_start + begin;           /* <= 100e6 + 8 + 2^48: no overflow */
    return K3_OK;
}

/* ------------------------------------------------------------------------- */
/* the header                                                                 */

static int cmp_extent(const void *pa, const void *pb)
{
    const k3_st_tensor *a = pa, *b = pb;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    if (a->nbytes != b->nbytes) return a->nbytes < b->nbytes ? -1 : 1;
    return strcmp(a->name, b->name);
}

void k3_st_header_free(k3_st_header *h)
{
    if (!h) return;
    free(h->tensors);
    free(h->meta);
    free(h->pool);
    memset(h, 0, sizeof *h);
}

static k3_err check_metadata(const k3j_doc *doc, uint32_t m, const char *dn, size_t *pool_need, k3_diag *d)
{
    const k3j_tok *tok = doc->t;
    if (tok[m].type != K3J_OBJ)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': __metadata__ is %s, not an object of strings",
                       dn, type_name(&tok[m]));
    uint32_t off = k3j_get(doc, m, "data_offsets", 12);
    if (off && tok[off].type != K3J_STR)
        return k3_fail(d, K3_ERR_FORMAT,
                       "'%s': '__metadata__' is a reserved name and cannot be a tensor", dn);
    for (uint32_t k = k3j_first(doc, m); k; k = k3j_next(doc, m, k)) {
        if (tok[k + 1].type != K3J_STR) {
            esc_buf b;
            return k3_fail(d, K3_ERR_FORMAT, "'%s': __metadata__ value of key '%s' is %s, not a string",
                           dn, esc(&b, tok[k].v.s, tok[k].size), type_name(&tok[k + 1]));
        }
        *pool_need += (size_t)tok[k].size + 1 + tok[k + 1].size + 1;
    }
    return K3_OK;
}

k3_err k3_st_parse_header(const uint8_t *buf, size_t len, uint64_t file_size,
                          const char *dn, k3_st_header *out, k3_diag *d)
{
    memset(out, 0, sizeof *out);
    uint64_t n;
    k3_err e = k3_st_check_prefix(buf, len, file_size, dn, &n, d);
    if (e) return e;
    if (len - 8 < n)
        return k3_fail(d, K3_ERR_INTERNAL, "'%s': header buffer holds %zu of %" PRIu64 " bytes",
                       dn, len, n + 8);
    const uint8_t *hdr = buf + 8;

    size_t at;
    const char *bad = k3_utf8_problem(hdr, (size_t)n, &at);
    if (bad)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': header contains %s (0x%02x) at byte offset %zu",
                       dn, bad, hdr[at], at + 8);

    k3j_doc doc;
    k3j_error je;
    if (k3j_parse((const char *)hdr, (size_t)n, &doc, &je)) return k3j_fail(&je, dn, "header", 8, d);
    const k3j_tok *tok = doc.t;
    if (tok[0].type != K3J_OBJ) {
        e = k3_fail(d, K3_ERR_FORMAT, "'%s': header is %s, not a JSON object", dn, type_name(&tok[0]));
        k3j_free(&doc);
        return e;
    }

    /* pass 1: validate metadata and names, size the pool */
    size_t n_t = 0, pool_need = 0;
    uint32_t meta = 0;
    for (uint32_t k = k3j_first(&doc, 0); k; k = k3j_next(&doc, 0, k)) {
        if (k3j_streq(&tok[k], "__metadata__")) {
            meta = k + 1;
            if ((e = check_metadata(&doc, meta, dn, &pool_need, d))) goto fail;
            continue;
        }
        if (tok[k].size == 0) { e = k3_fail(d, K3_ERR_FORMAT, "'%s': empty tensor name", dn); goto fail; }
        n_t++;
        pool_need += (size_t)tok[k].size + 1;
    }

    out->file_size = file_size;
    out->header_len = n;
    out->data_start = n + 8;
    out->tensors = calloc(n_t ? n_t : 1, sizeof *out->tensors);
    out->pool = malloc(pool_need ? pool_need : 1);
    out->meta = meta ? calloc(tok[meta].size + 1, sizeof *out->meta) : NULL;
    if (!out->tensors || !out->pool || (meta && !out->meta)) {
        e = k3_fail(d, K3_ERR_NOMEM, "'%s': out of memory for %zu tensors", dn, n_t);
        goto fail;
    }

    /* pass 2: tensors, then metadata strings */
    char *p = out->pool;
    for (uint32_t k = k3j_first(&doc, 0); k; k = k3j_next(&doc, 0, k)) {
        if (k + 1 == meta) continue;
        k3_st_tensor *t = &out->tensors[out->n_tensors];
        memcpy(p, tok[k].v.s, tok[k].size);
        p[tok[k].size] = '\0';
        t->name = p;
        t->name_len = tok[k].size;
        p += tok[k].size + 1;
        if ((e = parse_tensor(&doc, k + 1, out->data_start, t, d))) {
            esc_buf b;
            k3_diag_wrap(d, "'%s': tensor '%s'", dn, esc(&b, t->name, t->name_len));
            goto fail;
        }
        out->n_tensors++;
    }
    for (uint32_t k = meta ? k3j_first(&doc, meta) : 0; k; k = k3j_next(&doc, meta, k)) {
        k3_st_meta *m = &out->meta[out->n_meta++];
        for (int kv = 0; kv < 2; kv++) {
            const k3j_tok *s = &tok[k + (uint32_t)kv];
            memcpy(p, s->v.s, s->size);
            p[s->size] = '\0';
            if (kv) m->value = p;
            else m->key = p;
            p += s->size + 1;
        }
    }
    k3j_free(&doc);

    /* extents: sorted, from 0, contiguous, no sharing, end at EOF */
    qsort(out->tensors, out->n_tensors, sizeof *out->tensors, cmp_extent);
    uint64_t pos = 0;
    const k3_st_tensor *owner = NULL;            /* last non-empty tensor, ends at pos */
    for (size_t i = 0; i < out->n_tensors; i++) {
        const k3_st_tensor *t = &out->tensors[i];
        uint64_t end = t->begin + t->nbytes;
        esc_buf b1, b2;
        if (t->begin > pos) {
            if (!owner)
                e = k3_fail(d, K3_ERR_FORMAT,
                            "'%s': tensor '%s': data begins at offset %" PRIu64 ", not 0 (the first "
                            "tensor must start the data region at file offset %" PRIu64 ")",
                            dn, esc0(&b1, t->name), t->begin, out->data_start);
            else
                e = k3_fail(d, K3_ERR_FORMAT,
                            "'%s': gap of %" PRIu64 " bytes between tensor '%s' (ends at data offset %"
                            PRIu64 ") and tensor '%s' (begins at %" PRIu64 ", file offset %" PRIu64 ")",
                            dn, t->begin - pos, esc0(&b1, owner->name), pos, esc0(&b2, t->name),
                            t->begin, t->offset);
            goto fail;
        }
        if (t->begin < pos) {
            if (owner && t->begin == owner->begin && t->nbytes == owner->nbytes)
                e = k3_fail(d, K3_ERR_FORMAT,
                            "'%s': tensors '%s' and '%s' share the byte range [%" PRIu64 ", %" PRIu64 ")",
                            dn, esc0(&b1, owner->name), esc0(&b2, t->name), t->begin, end);
            else
                e = k3_fail(d, K3_ERR_FORMAT,
                            "'%s': tensor '%s' [%" PRIu64 ", %" PRIu64 ") overlaps tensor '%s' "
                            "(ends at data offset %" PRIu64 ", file offset %" PRIu64 ")",
                            dn, esc0(&b1, t->name), t->begin, end,
                            owner ? esc0(&b2, owner->name) : "?", pos, out->data_start + pos);
            goto fail;
        }
        if (t->nbytes) { pos = end; owner = t; }
    }
    uint64_t data_end = out->data_start + pos;
    if (data_end < file_size) {
        e = k3_fail(d, K3_ERR_FORMAT,
                    "'%s': %" PRIu64 " trailing bytes after the last tensor: data ends at file offset %"
                    PRIu64 " but the file is %" PRIu64 " bytes", dn, file_size - data_end, data_end,
                    file_size);
        goto fail;
    }
    if (data_end > file_size) {
        esc_buf b;
        e = k3_fail(d, K3_ERR_FORMAT,
                    "'%s': data is truncated: tensor '%s' ends at file offset %" PRIu64
                    " but the file is %" PRIu64 " bytes (%" PRIu64 " missing)",
                    dn, owner ? esc0(&b, owner->name) : "?", data_end, file_size, data_end - file_size);
        goto fail;
    }
    return K3_OK;

fail:
    k3j_free(&doc);
    k3_st_header_free(out);
    return e;
}

/* ------------------------------------------------------------------------- */
/* from a file descriptor                                                     */

k3_err k3_st_read_header(int fd, const char *path, const char *dn, k3_st_header *out, k3_diag *d)
{
    memset(out, 0, sizeof *out);
    struct stat st;
    if (fstat(fd, &st) != 0)
        return k3_fail(d, K3_ERR_IO, "cannot stat '%s': %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return k3_fail(d, K3_ERR_FORMAT, "'%s' is not a regular file", path);
    uint64_t size = (uint64_t)st.st_size;
    uint8_t pre[8];
    uint64_t n;
    k3_err e;
    if (size >= 8 && (e = k3_pread_full(fd, pre, 8, 0, path, d))) return e;
    if ((e = k3_st_check_prefix(pre, 8, size, dn, &n, d))) return e;
    uint8_t *buf = malloc((size_t)n + 8);       /* n <= K3_ST_MAX_HEADER, checked above */
    if (!buf) return k3_fail(d, K3_ERR_NOMEM, "'%s': out of memory for a %" PRIu64 "-byte header", dn, n);
    memcpy(buf, pre, 8);
    e = k3_pread_full(fd, buf + 8, (size_t)n, 8, path, d);
    if (!e) e = k3_st_parse_header(buf, (size_t)n + 8, size, dn, out, d);
    free(buf);
    return e;
}

/* k3_manifest.c - manifest.json writer and strict reader. */
#include "k3_manifest.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "k3_checked.h"
#include "k3_download.h"
#include "k3_file.h"
#include "k3_log.h"

/* ------------------------------------------------------------------ writer */

static json_t *shape_json(int ndim, const uint64_t *shape)
{
    json_t *a = json_array();
    for (int i = 0; i < ndim; i++) json_array_append_new(a, json_integer((json_int_t)shape[i]));
    return a;
}

static json_t *hex64_json(uint64_t h)
{
    char hex[17];
    k3_hex64(h, hex);
    return json_string(hex);
}

static json_t *hex128_json(k3_h128 h)
{
    char hex[33];
    k3_hex128(h, hex);
    return json_string(hex);
}

k3_err k3_manifest_dump(const k3_manifest *m, char **text, size_t *len, k3_diag *d)
{
    json_t *root = json_object();
    json_object_set_new(root, "format", json_string("k3-pack"));
    json_object_set_new(root, "format_version", json_integer(m->format_version));
    json_object_set_new(root, "byte_order", json_string("little"));
    json_object_set_new(root, "generator", json_string(m->generator ? m->generator : "k3"));
    json_object_set_new(root, "name_prefix", json_string(m->name_prefix ? m->name_prefix : ""));
    json_t *hashes = json_object();
    json_object_set_new(hashes, "shard", json_string("XXH3-128"));
    json_object_set_new(hashes, "tensor", json_string("XXH3-64"));
    json_object_set_new(hashes, "record", json_string("XXH3-64"));
    json_object_set_new(hashes, "file", json_string("XXH3-128"));
    json_object_set_new(root, "hashes", hashes);
    json_object_set(root, "config", m->config ? m->config : json_null());

    json_t *ex = json_object();
    json_object_set_new(ex, "encoding", m->experts_encoding ? json_string(k3_enc_name(m->experts_encoding)) : json_null());
    json_object_set_new(ex, "source", json_string(m->experts_quantized ? "quantized" : "checkpoint"));
    json_object_set_new(ex, "layout", json_string("w1,w3,w2;packed,scale"));
    json_object_set_new(ex, "quantization", m->quant_rule ? json_string(m->quant_rule) : json_null());
    json_object_set_new(root, "experts", ex);
    if (m->trunk_q8) {                            /* version 3: the compact trunk (FORMAT.md 3) */
        json_t *tr = json_object();
        json_object_set_new(tr, "encoding", json_string("Q8"));
        json_object_set_new(tr, "block", json_integer(32));
        json_object_set_new(tr, "rule", json_string(K3_Q8_RULE));
        json_object_set_new(root, "trunk", tr);
    }

    json_t *files = json_array();
    for (uint32_t i = 0; i < m->n_files; i++) {
        json_t *f = json_object();
        json_object_set_new(f, "name", json_string(m->files[i].name));
        json_object_set_new(f, "size", json_integer((json_int_t)m->files[i].size));
        json_object_set_new(f, "xxh3_128", hex128_json(m->files[i].hash));
        json_array_append_new(files, f);
    }
    json_object_set_new(root, "files", files);
    if (m->n_sources) {                           /* version 3 (FORMAT.md 10) */
        json_t *src = json_array();
        for (uint32_t i = 0; i < m->n_sources; i++) {
            json_t *f = json_object();
            json_object_set_new(f, "name", json_string(m->sources[i].name));
            json_object_set_new(f, "size", json_integer((json_int_t)m->sources[i].size));
            json_object_set_new(f, "header_size", json_integer((json_int_t)m->sources[i].header_size));
            json_object_set_new(f, "header_xxh3_128", hex128_json(m->sources[i].header_hash));
            if (m->sources[i].in_pack) json_object_set_new(f, "in_pack", json_true());
            json_array_append_new(src, f);
        }
        json_object_set_new(root, "checkpoint_files", src);
    }

    json_t *shards = json_array();
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const k3_mf_shard *s = &m->shards[i];
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(s->name));
        json_object_set_new(o, "kind", json_string(s->kind == K3_SHARD_TRUNK ? "trunk" : "experts"));
        json_object_set_new(o, "layer", s->layer < 0 ? json_null() : json_integer(s->layer));
        json_object_set_new(o, "size", json_integer((json_int_t)s->size));
        json_object_set_new(o, "header_hash", hex64_json(s->header_hash));
        json_object_set_new(o, "xxh3_128", hex128_json(s->hash));
        json_array_append_new(shards, o);
    }
    json_object_set_new(root, "shards", shards);

    json_t *tensors = json_array();
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        const k3_mf_tensor *t = &m->tensors[i];
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(t->name));
        json_object_set_new(o, "encoding", json_string(k3_enc_name(t->encoding)));
        json_object_set_new(o, "shape", shape_json(t->ndim, t->shape));
        json_object_set_new(o, "shard", json_string(m->shards[t->shard].name));
        json_object_set_new(o, "offset", json_integer((json_int_t)t->offset));
        json_object_set_new(o, "size", json_integer((json_int_t)t->size));
        json_object_set_new(o, "xxh3_64", hex64_json(t->hash));
        json_array_append_new(tensors, o);
    }
    json_object_set_new(root, "tensors", tensors);

    json_t *layers = json_array();
    for (uint32_t i = 0; i < m->n_expert_layers; i++) {
        const k3_mf_experts *x = &m->expert_layers[i];
        json_t *o = json_object();
        json_object_set_new(o, "layer", json_integer(x->layer));
        if (x->in_place) {
            json_object_set_new(o, "source", json_string("checkpoint"));
            json_object_set_new(o, "count", json_integer((json_int_t)x->count));
        } else {
            json_object_set_new(o, "shard", json_string(m->shards[x->shard].name));
            json_object_set_new(o, "count", json_integer((json_int_t)x->count));
            json_object_set_new(o, "offset", json_integer((json_int_t)x->offset));
            json_object_set_new(o, "stride", json_integer((json_int_t)x->stride));
        }
        json_object_set_new(o, "record_size", json_integer((json_int_t)x->record_size));
        json_t *parts = json_array();
        for (uint32_t p = 0; p < x->n_parts; p++) {
            const k3_mf_part *pt = &x->parts[p];
            json_t *po = json_object();
            json_object_set_new(po, "name", json_string(pt->name));
            json_object_set_new(po, "encoding", json_string(k3_enc_name(pt->encoding)));
            json_object_set_new(po, "shape", shape_json(pt->ndim, pt->shape));
            json_object_set_new(po, "offset", json_integer((json_int_t)pt->offset));
            json_object_set_new(po, "size", json_integer((json_int_t)pt->size));
            json_array_append_new(parts, po);
        }
        json_object_set_new(o, "parts", parts);
        if (x->in_place) {
            json_t *rs = json_array();              /* [count] [file index, offset] */
            for (uint64_t e = 0; e < x->count; e++) {
                json_t *r = json_array();
                json_array_append_new(r, json_integer((json_int_t)x->rec_file[e]));
                json_array_append_new(r, json_integer((json_int_t)x->rec_off[e]));
                json_array_append_new(rs, r);
            }
            json_object_set_new(o, "records", rs);
        }
        json_t *hs = json_array();
        for (uint64_t e = 0; e < x->count; e++) json_array_append_new(hs, hex64_json(x->hashes[e]));
        json_object_set_new(o, "xxh3_64", hs);
        json_array_append_new(layers, o);
    }
    json_object_set_new(root, "expert_layers", layers);

    json_t *skipped = json_array();
    for (uint32_t i = 0; i < m->n_skipped; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(m->skipped[i].name));
        json_object_set_new(o, "reason", json_string(m->skipped[i].reason));
        json_array_append_new(skipped, o);
    }
    json_object_set_new(root, "skipped", skipped);
    if (m->have_download) {                      /* optional: which download the pack came from */
        json_t *dl = json_object(), *dfiles = json_array();
        json_object_set_new(dl, "checked_against", m->download_checked ? json_string(m->download_checked)
                                                                        : json_null());
        for (uint32_t i = 0; i < m->n_src_files; i++) {
            char hex[65];
            k3_dl_hex(m->src_files[i].sha256, 32, hex);
            json_t *o = json_object();
            json_object_set_new(o, "name", json_string(m->src_files[i].name));
            json_object_set_new(o, "size", json_integer((json_int_t)m->src_files[i].size));
            json_object_set_new(o, "sha256", json_string(hex));
            json_array_append_new(dfiles, o);
        }
        json_object_set_new(dl, "files", dfiles);
        json_object_set_new(root, "download", dl);
    }
    /* last: the self-checksum, its digits filled in by k3_manifest_seal */
    json_object_set_new(root, K3_MANIFEST_SUM_KEY, json_string("0000000000000000"));

    char *s = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!s) return k3_fail(d, K3_ERR_NOMEM, "cannot serialise the manifest (invalid UTF-8 in a name?)");
    size_t n = strlen(s);
    char *out = malloc(n + 2);                   /* text + '\n' + NUL */
    if (!out) { free(s); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
    memcpy(out, s, n);
    out[n] = '\n';
    out[n + 1] = '\0';
    free(s);
    if (k3_manifest_seal(out, n + 1)) {
        free(out);
        return k3_fail(d, K3_ERR_INTERNAL, "the serialised manifest does not end with its checksum member");
    }
    *text = out;
    *len = n + 1;
    return K3_OK;
}

/* ------------------------------------------------------------------ self-checksum */

static const char sum_member[] = "\"" K3_MANIFEST_SUM_KEY "\": \"";   /* precedes the 16 digits */
static const char sum_end[] = "\"\n}\n";                              /* follows them */

/* Offset of the 16 digits if text ends with the checksum member, else -1. */
static long sum_digits_at(const char *text, size_t len)
{
    size_t mlen = sizeof sum_member - 1;
    if (len < mlen + K3_MANIFEST_SUM_TAIL) return -1;
    size_t at = len - K3_MANIFEST_SUM_TAIL;
    if (memcmp(text + at + 16, sum_end, 4) || memcmp(text + at - mlen, sum_member, mlen)) return -1;
    for (size_t i = 0; i < 16; i++) {
        char c = text[at + i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return -1;
    }
    return (long)at;
}

int k3_manifest_seal(char *text, size_t len)
{
    long at = sum_digits_at(text, len);
    if (at < 0) return -1;
    char hex[17];
    k3_hex64(k3_xxh3_64(text, (size_t)at), hex);
    memcpy(text + at, hex, 16);
    return 0;
}

/* The manifest's format_version if text is JSON with an integer one, else -1. */
static long long peek_version(const char *text, size_t len)
{
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    json_t *v = json_object_get(root, "format_version");
    long long r = json_is_integer(v) ? (long long)json_integer_value(v) : -1;
    json_decref(root);
    return r;
}

static k3_err check_cost(const char *text, size_t len, const char *path, k3_diag *d);

k3_err k3_manifest_check_sum(const char *text, size_t len, const char *path, k3_diag *d)
{
    long at = sum_digits_at(text, len);
    if (at < 0) {
        k3_err e = check_cost(text, len, path, d);      /* before jansson sees it */
        if (e) return e;
        long long v = peek_version(text, len);
        if (v >= 1 && v < K3_PACK_VERSION)
            return k3_fail(d, K3_ERR_UNSUPPORTED, "'%s': pack format version %lld is older than this k3 (%d) and "
                           "its manifest carries no checksum of itself; re-run k3pack to make the pack again",
                           path, v, K3_PACK_VERSION);
        return k3_fail(d, K3_ERR_FORMAT, "'%s': does not end with its checksum (\"%s\": \"<16 hex digits>\", "
                       "then \"}\" and a newline): damaged, or not written by k3pack", path, K3_MANIFEST_SUM_KEY);
    }
    uint64_t want, got = k3_xxh3_64(text, (size_t)at);
    char digits[17], hex[17];
    memcpy(digits, text + at, 16);
    digits[16] = '\0';
    if (k3_parse_hex64(digits, &want))
        return k3_fail(d, K3_ERR_INTERNAL, "'%s': checksum digits not parsed", path);
    if (want != got) {
        k3_hex64(got, hex);
        return k3_fail(d, K3_ERR_CORRUPT, "'%s': checksum mismatch: its %s is %s, its content hashes to %s; "
                       "manifest.json is damaged", path, K3_MANIFEST_SUM_KEY, digits, hex);
    }
    return K3_OK;
}

/* What parsing may cost (FORMAT.md 5.2), counted before anything is allocated. */
static k3_err check_cost(const char *text, size_t len, const char *path, k3_diag *d)
{
    if (len > K3_MANIFEST_MAX)
        return k3_fail(d, K3_ERR_FORMAT, "'%s' is %zu bytes, more than the limit of %u", path, len, K3_MANIFEST_MAX);
    uint64_t items = 1;
    int in_str = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '{' || c == '[' || c == ',' || c == ':') {
            items++;
        }
    }
    if (items > K3_MANIFEST_MAX_ITEMS)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': %llu JSON values and keys, more than the limit of %u", path,
                       (unsigned long long)items, K3_MANIFEST_MAX_ITEMS);
    return K3_OK;
}

k3_err k3_manifest_describe_shard(k3_manifest *m, uint32_t s, const k3_shard_header *h,
                                  const uint64_t *entry_hashes, uint64_t *record_hashes, k3_diag *d)
{
    if (h->kind == K3_SHARD_TRUNK) {
        k3_mf_tensor *nt = realloc(m->tensors, (m->n_tensors + h->n_entries + 1) * sizeof *nt);
        if (!nt) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
        m->tensors = nt;
        for (uint32_t i = 0; i < h->n_entries; i++) {
            const k3_shard_entry *en = &h->entries[i];
            k3_mf_tensor *t = &m->tensors[m->n_tensors];
            memset(t, 0, sizeof *t);
            if (!(t->name = strndup(en->name, en->name_len))) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
            m->n_tensors++;
            t->encoding = en->encoding;
            t->ndim = en->ndim;
            memcpy(t->shape, en->shape, sizeof t->shape);
            t->shard = s;
            t->offset = en->offset;
            t->size = en->size;
            t->hash = entry_hashes[i];
        }
        return K3_OK;
    }
    if (h->n_entries > K3_MAX_RECORD_PARTS)          /* the manifest's part table is fixed */
        return k3_fail(d, K3_ERR_INTERNAL, "shard %u: %u record parts, more than %d", s, h->n_entries,
                       K3_MAX_RECORD_PARTS);
    k3_mf_experts *nx = realloc(m->expert_layers, (m->n_expert_layers + 1) * sizeof *nx);
    if (!nx) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    m->expert_layers = nx;
    k3_mf_experts *x = &m->expert_layers[m->n_expert_layers++];
    memset(x, 0, sizeof *x);
    x->layer = h->layer;
    x->shard = s;
    x->count = h->n_records;
    x->offset = h->data_offset;
    x->stride = h->record_stride;
    x->record_size = h->record_size;
    x->n_parts = h->n_entries;
    x->hashes = record_hashes;
    for (uint32_t i = 0; i < h->n_entries; i++) {
        const k3_shard_entry *en = &h->entries[i];
        k3_mf_part *pt = &x->parts[i];
        if (!(pt->name = strndup(en->name, en->name_len))) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
        pt->encoding = en->encoding;
        pt->ndim = en->ndim;
        memcpy(pt->shape, en->shape, sizeof pt->shape);
        pt->offset = en->offset;
        pt->size = en->size;
    }
    return K3_OK;
}

/* ------------------------------------------------------------------ reader */

typedef struct jctx {
    const char *path;
    k3_diag *d;
} jctx;

#define JBAD(c, ...) (k3_fail((c)->d, K3_ERR_FORMAT, __VA_ARGS__), k3_diag_wrap((c)->d, "'%s'", (c)->path))

static k3_err get_u64(jctx *c, json_t *o, const char *key, const char *where, uint64_t *out)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return JBAD(c, "%s.%s: expected a non-negative integer", where, key);
    *out = (uint64_t)json_integer_value(v);
    return K3_OK;
}

static k3_err get_str(jctx *c, json_t *o, const char *key, const char *where, char **out)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) return JBAD(c, "%s.%s: expected a string", where, key);
    *out = strdup(json_string_value(v));
    if (!*out) return k3_fail(c->d, K3_ERR_NOMEM, "out of memory");
    return K3_OK;
}

static k3_err get_hex64(jctx *c, json_t *v, const char *where, uint64_t *out)
{
    if (!json_is_string(v) || k3_parse_hex64(json_string_value(v), out))
        return JBAD(c, "%s: expected 16 lowercase hex digits", where);
    return K3_OK;
}

static k3_err get_shape(jctx *c, json_t *o, const char *where, int *ndim, uint64_t *shape)
{
    json_t *a = json_object_get(o, "shape");
    if (!json_is_array(a) || json_array_size(a) > K3_SHARD_MAX_DIMS)
        return JBAD(c, "%s.shape: expected an array of at most %d integers", where, K3_SHARD_MAX_DIMS);
    *ndim = (int)json_array_size(a);
    for (int i = 0; i < *ndim; i++) {
        json_t *v = json_array_get(a, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return JBAD(c, "%s.shape[%d]: expected a non-negative integer", where, i);
        shape[i] = (uint64_t)json_integer_value(v);
    }
    return K3_OK;
}

static k3_err get_enc(jctx *c, json_t *o, const char *where, int *enc)
{
    json_t *v = json_object_get(o, "encoding");
    *enc = json_is_string(v) ? k3_enc_from_name(json_string_value(v)) : 0;
    if (!*enc) return JBAD(c, "%s.encoding: unknown encoding", where);
    return K3_OK;
}

static k3_err get_array(jctx *c, json_t *root, const char *key, json_t **out, uint32_t *n)
{
    *out = json_object_get(root, key);
    if (!json_is_array(*out)) return JBAD(c, "'%s': expected an array", key);
    *n = (uint32_t)json_array_size(*out);
    return K3_OK;
}

/* size must be what shape x encoding takes (docs/FORMAT.md 2.2) */
static k3_err check_size(jctx *c, const char *where, int enc, int ndim, const uint64_t *shape, uint64_t size)
{
    uint64_t want;
    k3_diag d2;
    if (k3_enc_size(enc, ndim, shape, &want, &d2) || want != size)
        return JBAD(c, "%s.size: %llu bytes do not match its shape and encoding", where, (unsigned long long)size);
    return K3_OK;
}

static int shard_ref(const k3_manifest *m, json_t *o, uint32_t *out)
{
    json_t *v = json_object_get(o, "shard");
    if (!json_is_string(v)) return -1;
    int i = k3_manifest_shard_index(m, json_string_value(v));
    if (i < 0) return -1;
    *out = (uint32_t)i;
    return 0;
}

k3_err k3_manifest_config(const k3_manifest *m, const char *display_name, k3_config *out, k3_diag *d)
{
    char *text = m->config ? json_dumps(m->config, JSON_COMPACT) : NULL;
    if (!text) return k3_fail(d, K3_ERR_FORMAT, "'%s': absent or cannot be serialised", display_name);
    k3_err e = k3_config_parse(text, strlen(text), display_name, out, d);
    free(text);
    return e;
}

int k3_manifest_shard_index(const k3_manifest *m, const char *name)
{
    for (uint32_t i = 0; i < m->n_shards; i++)
        if (strcmp(m->shards[i].name, name) == 0) return (int)i;
    return -1;
}

/* shard and file names are plain names: no '/', not "." or "..", no leading '.' */
static int plain_name(const char *s)
{
    size_t n = strlen(s);                       /* control bytes are legal; every printer escapes them */
    return n > 0 && n <= 255 && s[0] != '.' && !strchr(s, '/');
}

/* A trunk tensor lies inside its shard, after the fixed header and after the
   tensor listed before it in the same shard (*end: that one's end). */
static k3_err check_tensor_range(jctx *c, const k3_manifest *m, const k3_mf_tensor *t, const char *where,
                                 uint64_t *end)
{
    const k3_mf_shard *s = &m->shards[t->shard];
    if (t->size > s->size || t->offset > s->size - t->size)
        return JBAD(c, "%s.offset: bytes [%llu, +%llu) end past the end of shard '%s' (%llu bytes)", where,
                    (unsigned long long)t->offset, (unsigned long long)t->size, s->name, (unsigned long long)s->size);
    if (t->offset < K3_SHARD_FIXED_SIZE || t->offset < *end)
        return JBAD(c, "%s.offset: bytes [%llu, +%llu) overlap the shard header or the tensor listed before it "
                    "in shard '%s' (tensors are listed in offset order)", where, (unsigned long long)t->offset,
                    (unsigned long long)t->size, s->name);
    *end = t->offset + t->size;
    return K3_OK;
}

/* An expert layer's records lie inside its shard, after the fixed header, and do
   not overlap each other. Checked before the record hashes are allocated. */
static k3_err check_records(jctx *c, const k3_manifest *m, const k3_mf_experts *x, const char *where)
{
    const k3_mf_shard *s = &m->shards[x->shard];
    uint64_t body = 0, end = 0;
    if (x->count > 1 && x->record_size > x->stride)
        return JBAD(c, "%s.record_size: %llu bytes, more than the stride of %llu: records overlap", where,
                    (unsigned long long)x->record_size, (unsigned long long)x->stride);
    if (x->offset < K3_SHARD_FIXED_SIZE)
        return JBAD(c, "%s.offset: %llu overlaps the shard header", where, (unsigned long long)x->offset);
    if (x->count && (k3_mul_u64(x->count - 1, x->stride, &body) || k3_add_u64(body, x->record_size, &body) ||
                     k3_add_u64(body, x->offset, &end) || end > s->size))
        return JBAD(c, "%s: %llu records of %llu bytes at stride %llu from offset %llu end past the end of shard "
                    "'%s' (%llu bytes)", where, (unsigned long long)x->count, (unsigned long long)x->record_size,
                    (unsigned long long)x->stride, (unsigned long long)x->offset, s->name,
                    (unsigned long long)s->size);
    return K3_OK;
}

/* Version 3: the checkpoint files an in-place pack reads (FORMAT.md 10). */
static k3_err read_sources(jctx *c, json_t *root, k3_manifest *m)
{
    json_t *arr;
    k3_err e;
    char where[64];
    if ((e = get_array(c, root, "checkpoint_files", &arr, &m->n_sources))) return e;
    if (m->n_sources > 65536) return JBAD(c, "'checkpoint_files': too many files");
    m->sources = calloc(m->n_sources + 1, sizeof *m->sources);
    if (!m->sources) return k3_fail(c->d, K3_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; i < m->n_sources; i++) {
        json_t *o = json_array_get(arr, i), *v;
        k3_mf_source *f = &m->sources[i];
        snprintf(where, sizeof where, "checkpoint_files[%u]", i);
        if (!json_is_object(o)) return JBAD(c, "%s: expected an object", where);
        if ((e = get_str(c, o, "name", where, &f->name)) || (e = get_u64(c, o, "size", where, &f->size)) ||
            (e = get_u64(c, o, "header_size", where, &f->header_size))) return e;
        if (!plain_name(f->name)) return JBAD(c, "%s.name: not a plain file name", where);
        for (uint32_t j = 0; j < i; j++)
            if (!strcmp(m->sources[j].name, f->name)) return JBAD(c, "%s: '%s' listed twice", where, f->name);
        if (f->header_size < 8 || f->header_size > f->size || f->header_size > (100u << 20) + 8)
            return JBAD(c, "%s.header_size: %llu is not a safetensors header inside the file", where,
                        (unsigned long long)f->header_size);
        v = json_object_get(o, "header_xxh3_128");
        if (!json_is_string(v) || k3_parse_hex128(json_string_value(v), &f->header_hash))
            return JBAD(c, "%s.header_xxh3_128: expected 32 lowercase hex digits", where);
        v = json_object_get(o, "in_pack");
        if (v && !json_is_true(v)) return JBAD(c, "%s.in_pack: expected true, or no such key", where);
        f->in_pack = v != NULL;
        if (f->in_pack && i + 1 != m->n_sources)            /* FORMAT.md 10: one, after the checkpoint's */
            return JBAD(c, "%s.in_pack: only the last file may be the pack's own", where);
    }
    return K3_OK;
}

/* Version 3: an in-place layer's records, [file index, offset] each, inside the file's data
   (after its safetensors header). Records are read whole, so they need not be aligned. */
static k3_err read_records(jctx *c, const k3_manifest *m, json_t *o, k3_mf_experts *x, const char *where)
{
    json_t *rs = json_object_get(o, "records");
    if (!json_is_array(rs) || json_array_size(rs) != x->count)
        return JBAD(c, "%s.records: expected %llu [file, offset] pairs", where, (unsigned long long)x->count);
    x->rec_file = malloc((x->count + 1) * sizeof *x->rec_file);     /* [count] */
    x->rec_off = malloc((x->count + 1) * sizeof *x->rec_off);       /* [count] */
    if (!x->rec_file || !x->rec_off) return k3_fail(c->d, K3_ERR_NOMEM, "out of memory");
    for (uint64_t r = 0; r < x->count; r++) {
        json_t *p = json_array_get(rs, r), *f = json_array_get(p, 0), *off = json_array_get(p, 1);
        if (!json_is_array(p) || json_array_size(p) != 2 || !json_is_integer(f) || !json_is_integer(off) ||
            json_integer_value(f) < 0 || json_integer_value(f) >= (json_int_t)m->n_sources || json_integer_value(off) < 0)
            return JBAD(c, "%s.records[%llu]: expected [file index, offset]", where, (unsigned long long)r);
        const k3_mf_source *src = &m->sources[json_integer_value(f)];
        uint64_t at = (uint64_t)json_integer_value(off);
        if (at < src->header_size || x->record_size > src->size || at > src->size - x->record_size)
            return JBAD(c, "%s.records[%llu]: bytes [%llu, +%llu) are not inside the data of '%s' (%llu bytes)", where,
                        (unsigned long long)r, (unsigned long long)at, (unsigned long long)x->record_size, src->name,
                        (unsigned long long)src->size);
        x->rec_file[r] = (uint32_t)json_integer_value(f);
        x->rec_off[r] = at;
    }
    return K3_OK;
}

k3_err k3_manifest_parse(const char *text, size_t len, const char *path, k3_manifest *m, k3_diag *d)
{
    memset(m, 0, sizeof *m);
    jctx c = {path, d};
    k3_err e;
    if ((e = check_cost(text, len, path, d)) || (e = k3_manifest_check_sum(text, len, path, d))) return e;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': invalid JSON at line %d, column %d: %s", path, je.line, je.column, je.text);
    uint64_t *tend = NULL;       /* [n_shards] end of the last tensor listed in each shard */
    int32_t *xof = NULL;         /* [n_shards] expert_layers index using each shard, -1 none */
    char where[96];
    json_t *arr, *v;
    if (!json_is_object(root)) { e = JBAD(&c, "not a JSON object"); goto out; }
    v = json_object_get(root, "format");
    if (!json_is_string(v) || strcmp(json_string_value(v), "k3-pack")) {
        e = JBAD(&c, "'format' is not \"k3-pack\": not a k3 pack manifest");
        goto out;
    }
    v = json_object_get(root, "format_version");
    if (!json_is_integer(v)) { e = JBAD(&c, "'format_version' is missing or not an integer"); goto out; }
    if (json_integer_value(v) < K3_PACK_VERSION || json_integer_value(v) > K3_PACK_VERSION_MAX) {
        json_int_t fv = json_integer_value(v);          /* FORMAT.md section 6 wording */
        e = k3_fail(d, K3_ERR_UNSUPPORTED, fv > K3_PACK_VERSION_MAX
                        ? "'%s': pack format version %lld is newer than this k3 (%d); upgrade k3"
                        : fv >= 1 ? "'%s': pack format version %lld is older than this k3 (%d); re-run k3pack to make "
                                    "the pack again"
                                  : "'%s': pack format version %lld is not supported by this k3 (%d)",
                    path, (long long)fv, K3_PACK_VERSION_MAX);
        goto out;
    }
    m->format_version = (int)json_integer_value(v);
    v = json_object_get(root, K3_MANIFEST_SUM_KEY);    /* checked above, byte for byte */
    if (!json_is_string(v) || strlen(json_string_value(v)) != 16) {
        e = JBAD(&c, "'%s': expected 16 lowercase hex digits", K3_MANIFEST_SUM_KEY);
        goto out;
    }
    v = json_object_get(root, "byte_order");
    if (!json_is_string(v) || strcmp(json_string_value(v), "little")) {
        e = JBAD(&c, "'byte_order' is not \"little\"");
        goto out;
    }
    if ((e = get_str(&c, root, "generator", "manifest", &m->generator))) goto out;
    if ((e = get_str(&c, root, "name_prefix", "manifest", &m->name_prefix))) goto out;
    m->config = json_object_get(root, "config");
    if (!json_is_object(m->config)) { m->config = NULL; e = JBAD(&c, "'config' is not an object"); goto out; }
    json_incref(m->config);

    json_t *ex = json_object_get(root, "experts");
    if (!json_is_object(ex)) { e = JBAD(&c, "'experts' is not an object"); goto out; }
    v = json_object_get(ex, "encoding");
    if (!json_is_null(v)) {
        m->experts_encoding = json_is_string(v) ? k3_enc_from_name(json_string_value(v)) : 0;
        if (m->experts_encoding != K3_ENC_MXFP4 && m->experts_encoding != K3_ENC_BF16) {
            e = JBAD(&c, "experts.encoding: expected \"MXFP4\", \"BF16\" or null");
            goto out;
        }
    }
    v = json_object_get(ex, "source");
    if (!json_is_string(v) || (strcmp(json_string_value(v), "checkpoint") && strcmp(json_string_value(v), "quantized"))) {
        e = JBAD(&c, "experts.source: expected \"checkpoint\" or \"quantized\"");
        goto out;
    }
    m->experts_quantized = !strcmp(json_string_value(v), "quantized");
    v = json_object_get(ex, "layout");
    if (!json_is_string(v) || strcmp(json_string_value(v), "w1,w3,w2;packed,scale")) {
        e = JBAD(&c, "experts.layout: unknown record layout");
        goto out;
    }
    json_t *tr = json_object_get(root, "trunk");
    if (tr) {
        json_t *te = json_object_get(tr, "encoding"), *tb = json_object_get(tr, "block"), *tu = json_object_get(tr, "rule");
        if (m->format_version < 3 || !json_is_string(te) || strcmp(json_string_value(te), "Q8") || !json_is_integer(tb) ||
            json_integer_value(tb) != 32 || !json_is_string(tu) || strcmp(json_string_value(tu), K3_Q8_RULE)) {
            e = JBAD(&c, "'trunk': expected {\"encoding\": \"Q8\", \"block\": 32, \"rule\": \"%s\"} in format version 3",
                     K3_Q8_RULE);
            goto out;
        }
        m->trunk_q8 = 1;
    }
    v = json_object_get(ex, "quantization");
    if (json_is_string(v) && !(m->quant_rule = strdup(json_string_value(v)))) {
        e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
        goto out;
    }

    if ((e = get_array(&c, root, "files", &arr, &m->n_files))) goto out;
    m->files = calloc(m->n_files + 1, sizeof *m->files);
    if (!m->files) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); goto out; }
    for (uint32_t i = 0; i < m->n_files; i++) {
        json_t *o = json_array_get(arr, i);
        snprintf(where, sizeof where, "files[%u]", i);
        if (!json_is_object(o)) { e = JBAD(&c, "%s: expected an object", where); goto out; }
        if ((e = get_str(&c, o, "name", where, &m->files[i].name)) ||
            (e = get_u64(&c, o, "size", where, &m->files[i].size))) goto out;
        if (!plain_name(m->files[i].name)) { e = JBAD(&c, "%s.name: not a plain file name", where); goto out; }
        v = json_object_get(o, "xxh3_128");
        if (!json_is_string(v) || k3_parse_hex128(json_string_value(v), &m->files[i].hash)) {
            e = JBAD(&c, "%s.xxh3_128: expected 32 lowercase hex digits", where);
            goto out;
        }
    }

    v = json_object_get(root, "checkpoint_files");
    if (v && m->format_version < 3) { e = JBAD(&c, "'checkpoint_files' needs format version 3"); goto out; }
    if (v && (e = read_sources(&c, root, m))) goto out;

    if ((e = get_array(&c, root, "shards", &arr, &m->n_shards))) goto out;
    m->shards = calloc(m->n_shards + 1, sizeof *m->shards);
    if (!m->shards) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); goto out; }
    for (uint32_t i = 0; i < m->n_shards; i++) {
        json_t *o = json_array_get(arr, i);
        k3_mf_shard *s = &m->shards[i];
        snprintf(where, sizeof where, "shards[%u]", i);
        if (!json_is_object(o)) { e = JBAD(&c, "%s: expected an object", where); goto out; }
        if ((e = get_str(&c, o, "name", where, &s->name)) || (e = get_u64(&c, o, "size", where, &s->size)) ||
            (e = get_hex64(&c, json_object_get(o, "header_hash"), where, &s->header_hash))) goto out;
        if (!plain_name(s->name)) { e = JBAD(&c, "%s.name: not a plain file name", where); goto out; }
        if (k3_manifest_shard_index(m, s->name) != (int)i) { e = JBAD(&c, "%s: shard '%s' listed twice", where, s->name); goto out; }
        v = json_object_get(o, "kind");
        s->kind = !json_is_string(v) ? 0 : !strcmp(json_string_value(v), "trunk") ? K3_SHARD_TRUNK
                : !strcmp(json_string_value(v), "experts") ? K3_SHARD_EXPERTS : 0;
        if (!s->kind) { e = JBAD(&c, "%s.kind: expected \"trunk\" or \"experts\"", where); goto out; }
        v = json_object_get(o, "layer");
        if (json_is_null(v)) s->layer = -1;
        else if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < (1 << 20)) s->layer = json_integer_value(v);
        else { e = JBAD(&c, "%s.layer: expected a layer number or null", where); goto out; }
        v = json_object_get(o, "xxh3_128");
        if (!json_is_string(v) || k3_parse_hex128(json_string_value(v), &s->hash)) {
            e = JBAD(&c, "%s.xxh3_128: expected 32 lowercase hex digits", where);
            goto out;
        }
    }

    tend = calloc(m->n_shards + 1, sizeof *tend);
    xof = malloc((m->n_shards + 1) * sizeof *xof);
    if (!tend || !xof) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); goto out; }
    for (uint32_t i = 0; i < m->n_shards; i++) xof[i] = -1;

    if ((e = get_array(&c, root, "tensors", &arr, &m->n_tensors))) goto out;
    m->tensors = calloc(m->n_tensors + 1, sizeof *m->tensors);
    if (!m->tensors) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); goto out; }
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        json_t *o = json_array_get(arr, i);
        k3_mf_tensor *t = &m->tensors[i];
        snprintf(where, sizeof where, "tensors[%u]", i);
        if (!json_is_object(o)) { e = JBAD(&c, "%s: expected an object", where); goto out; }
        if ((e = get_str(&c, o, "name", where, &t->name)) || (e = get_enc(&c, o, where, &t->encoding)) ||
            (e = get_shape(&c, o, where, &t->ndim, t->shape)) || (e = get_u64(&c, o, "offset", where, &t->offset)) ||
            (e = get_u64(&c, o, "size", where, &t->size)) ||
            (e = get_hex64(&c, json_object_get(o, "xxh3_64"), where, &t->hash)) ||
            (e = check_size(&c, where, t->encoding, t->ndim, t->shape, t->size))) goto out;
        if (shard_ref(m, o, &t->shard) || m->shards[t->shard].kind != K3_SHARD_TRUNK) {
            e = JBAD(&c, "%s.shard: not a trunk shard listed in 'shards'", where);
            goto out;
        }
        if ((e = check_tensor_range(&c, m, t, where, &tend[t->shard]))) goto out;
    }

    if ((e = get_array(&c, root, "expert_layers", &arr, &m->n_expert_layers))) goto out;
    m->expert_layers = calloc(m->n_expert_layers + 1, sizeof *m->expert_layers);
    if (!m->expert_layers) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); goto out; }
    for (uint32_t i = 0; i < m->n_expert_layers; i++) {
        json_t *o = json_array_get(arr, i);
        k3_mf_experts *x = &m->expert_layers[i];
        uint64_t layer;
        snprintf(where, sizeof where, "expert_layers[%u]", i);
        if (!json_is_object(o)) { e = JBAD(&c, "%s: expected an object", where); goto out; }
        v = json_object_get(o, "source");
        x->in_place = v != NULL;
        if (x->in_place && (!json_is_string(v) || strcmp(json_string_value(v), "checkpoint") || !m->n_sources)) {
            e = JBAD(&c, "%s.source: expected \"checkpoint\", in a manifest with 'checkpoint_files'", where);
            goto out;
        }
        if ((e = get_u64(&c, o, "layer", where, &layer)) || (e = get_u64(&c, o, "count", where, &x->count)) ||
            (e = get_u64(&c, o, "record_size", where, &x->record_size))) goto out;
        if (!x->in_place && ((e = get_u64(&c, o, "offset", where, &x->offset)) ||
                             (e = get_u64(&c, o, "stride", where, &x->stride)))) goto out;
        if (layer >= (1u << 20)) { e = JBAD(&c, "%s.layer: expected a layer number", where); goto out; }
        x->layer = (uint32_t)layer;
        if (x->count > (1u << 24)) { e = JBAD(&c, "%s.count: too many records", where); goto out; }
        if (x->in_place) {
            x->shard = UINT32_MAX;
            if (x->record_size > (1ull << 40)) { e = JBAD(&c, "%s.record_size: too large", where); goto out; }
            x->stride = k3_in_place_stride(x->record_size);
            if ((e = read_records(&c, m, o, x, where))) goto out;
        } else {
            if (shard_ref(m, o, &x->shard) || m->shards[x->shard].kind != K3_SHARD_EXPERTS) {
                e = JBAD(&c, "%s.shard: not an expert shard listed in 'shards'", where);
                goto out;
            }
            if (xof[x->shard] >= 0) {
                e = JBAD(&c, "%s.shard: '%s' already holds expert_layers[%d]", where, m->shards[x->shard].name,
                         xof[x->shard]);
                goto out;
            }
            xof[x->shard] = (int32_t)i;
            if ((e = check_records(&c, m, x, where))) goto out;
        }
        json_t *parts = json_object_get(o, "parts");
        if (!json_is_array(parts) || json_array_size(parts) == 0 || json_array_size(parts) > K3_MAX_RECORD_PARTS) {
            e = JBAD(&c, "%s.parts: expected 1 to %d parts", where, K3_MAX_RECORD_PARTS);
            goto out;
        }
        x->n_parts = (uint32_t)json_array_size(parts);
        for (uint32_t p = 0; p < x->n_parts; p++) {
            json_t *po = json_array_get(parts, p);
            k3_mf_part *pt = &x->parts[p];
            char pw[128];
            snprintf(pw, sizeof pw, "%s.parts[%u]", where, p);
            if (!json_is_object(po)) { e = JBAD(&c, "%s: expected an object", pw); goto out; }
            if ((e = get_str(&c, po, "name", pw, &pt->name)) || (e = get_enc(&c, po, pw, &pt->encoding)) ||
                (e = get_shape(&c, po, pw, &pt->ndim, pt->shape)) || (e = get_u64(&c, po, "offset", pw, &pt->offset)) ||
                (e = get_u64(&c, po, "size", pw, &pt->size)) ||
                (e = check_size(&c, pw, pt->encoding, pt->ndim, pt->shape, pt->size))) goto out;
            /* FORMAT.md 2.2: parts in offset order, not overlapping, inside the record */
            uint64_t prev_end = p ? x->parts[p - 1].offset + x->parts[p - 1].size : 0;
            if (pt->offset < prev_end || pt->size > x->record_size || pt->offset > x->record_size - pt->size) {
                e = JBAD(&c, "%s: bytes [%llu, +%llu) of the record overlap the part before or end past its "
                         "record_size %llu", pw, (unsigned long long)pt->offset, (unsigned long long)pt->size,
                         (unsigned long long)x->record_size);
                goto out;
            }
        }
        json_t *hs = json_object_get(o, "xxh3_64");
        if (!json_is_array(hs) || json_array_size(hs) != x->count) {
            e = JBAD(&c, "%s.xxh3_64: expected %llu record hashes", where, (unsigned long long)x->count);
            goto out;
        }
        x->hashes = malloc((x->count + 1) * sizeof *x->hashes);      /* [count] */
        if (!x->hashes) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); goto out; }
        for (uint64_t r = 0; r < x->count; r++) {
            char hw[128];
            snprintf(hw, sizeof hw, "%s.xxh3_64[%llu]", where, (unsigned long long)r);
            if ((e = get_hex64(&c, json_array_get(hs, r), hw, &x->hashes[r]))) goto out;
        }
    }

    if ((e = get_array(&c, root, "skipped", &arr, &m->n_skipped))) goto out;
    m->skipped = calloc(m->n_skipped + 1, sizeof *m->skipped);
    if (!m->skipped) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); goto out; }
    for (uint32_t i = 0; i < m->n_skipped; i++) {
        json_t *o = json_array_get(arr, i);
        snprintf(where, sizeof where, "skipped[%u]", i);
        if (!json_is_object(o)) { e = JBAD(&c, "%s: expected an object", where); goto out; }
        if ((e = get_str(&c, o, "name", where, &m->skipped[i].name)) ||
            (e = get_str(&c, o, "reason", where, &m->skipped[i].reason))) goto out;
    }
    if ((v = json_object_get(root, "download"))) {     /* optional (FORMAT.md 5) */
        if (!json_is_object(v)) { e = JBAD(&c, "download: expected an object"); goto out; }
        json_t *ca = json_object_get(v, "checked_against");
        if (ca && !json_is_null(ca) && (e = get_str(&c, v, "checked_against", "download", &m->download_checked)))
            goto out;
        m->have_download = 1;
        if ((e = get_array(&c, v, "files", &arr, &m->n_src_files))) goto out;
        m->src_files = calloc(m->n_src_files + 1, sizeof *m->src_files);
        if (!m->src_files) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); goto out; }
        for (uint32_t i = 0; i < m->n_src_files; i++) {
            json_t *o = json_array_get(arr, i);
            snprintf(where, sizeof where, "download.files[%u]", i);
            if (!json_is_object(o)) { e = JBAD(&c, "%s: expected an object", where); goto out; }
            char *hex = NULL;
            if ((e = get_str(&c, o, "name", where, &m->src_files[i].name)) ||
                (e = get_u64(&c, o, "size", where, &m->src_files[i].size)) ||
                (e = get_str(&c, o, "sha256", where, &hex))) goto out;
            int ok = strlen(hex) == 64 && strspn(hex, "0123456789abcdef") == 64 &&   /* lowercase only */
                     k3_dl_unhex(hex, 64, m->src_files[i].sha256);
            free(hex);
            if (!ok) { e = JBAD(&c, "%s.sha256: expected 64 lowercase hex digits", where); goto out; }
        }
    }
out:
    free(tend);
    free(xof);
    json_decref(root);
    if (e) k3_manifest_free(m);
    return e;
}

k3_err k3_manifest_load(const char *dir, k3_manifest *m, k3_diag *d)
{
    char path[4096];
    k3_err e = k3_path_join(path, sizeof path, dir, K3_MANIFEST_NAME, d);
    if (e) return e;
    char *text;
    size_t len;
    e = k3_read_file(path, K3_MANIFEST_MAX, &text, &len, d);
    if (e == K3_ERR_NOT_FOUND)
        return k3_fail(d, K3_ERR_FORMAT, "'%s' has no manifest.json: not a pack, or an unfinished one "
                       "(rerun k3pack to finish it)", dir);
    if (e) return e;
    e = k3_manifest_parse(text, len, path, m, d);
    free(text);
    return e;
}

void k3_manifest_free(k3_manifest *m)
{
    free(m->generator);
    free(m->name_prefix);
    free(m->quant_rule);
    if (m->config) json_decref(m->config);
    for (uint32_t i = 0; m->files && i < m->n_files; i++) free(m->files[i].name);
    for (uint32_t i = 0; m->shards && i < m->n_shards; i++) free(m->shards[i].name);
    for (uint32_t i = 0; m->tensors && i < m->n_tensors; i++) free(m->tensors[i].name);
    for (uint32_t i = 0; m->expert_layers && i < m->n_expert_layers; i++) {
        for (uint32_t p = 0; p < K3_MAX_RECORD_PARTS; p++) free(m->expert_layers[i].parts[p].name);
        free(m->expert_layers[i].hashes);
        free(m->expert_layers[i].rec_file);
        free(m->expert_layers[i].rec_off);
    }
    for (uint32_t i = 0; m->sources && i < m->n_sources; i++) free(m->sources[i].name);
    free(m->sources);
    for (uint32_t i = 0; m->skipped && i < m->n_skipped; i++) {
        free(m->skipped[i].name);
        free(m->skipped[i].reason);
    }
    free(m->files);
    free(m->shards);
    free(m->tensors);
    free(m->expert_layers);
    free(m->skipped);
    for (uint32_t i = 0; m->src_files && i < m->n_src_files; i++) free(m->src_files[i].name);
    free(m->src_files);
    free(m->download_checked);
    memset(m, 0, sizeof *m);
}

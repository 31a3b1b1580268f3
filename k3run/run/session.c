/*
 * session.c - session files (session.h; the layout is docs/FORMAT.md
 * "Session files"). All integers little-endian.
 *
 *   header  64 bytes: magic "K3SESSN\n", u32 version, u32 n_parts, u64 pack
 *           identity, u64 config identity, u32 context, u32 pos, u32 n_tokens,
 *           u32 0, u64 table bytes, u64 XXH3-64 of header bytes [0, 56) and the table
 *   table   n_parts x 64 bytes: name (32, NUL-padded), u64 raw bytes, u64 stored
 *           bytes, u64 XXH3-64 of the raw bytes, u64 file offset of the stored bytes
 *   parts   one zstd frame each, in table order: "tokens" [n_tokens] i32,
 *           "rng" [2] u64, the model's parts (model.h), then "extra.NAME" parts
 */
#define _GNU_SOURCE
#include "session.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <zstd.h>

#include "k3_hash.h"
#include "k3_manifest.h"

#define HDR 64u
#define ROW 64u

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t get32(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = v << 8 | p[i]; return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

k3_err k3_pack_identity(const char *pack, uint64_t *id, k3_diag *d)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", pack, K3_MANIFEST_NAME);
    FILE *f = fopen(path, "rb");
    if (!f) return k3_fail(d, K3_ERR_IO, "'%s': cannot open: %s", path, strerror(errno));
    char tail[128] = {0};
    long n = 0;
    if (fseek(f, -(long)(sizeof tail - 1), SEEK_END) != 0) rewind(f);
    n = (long)fread(tail, 1, sizeof tail - 1, f);
    fclose(f);
    char *k = n > 0 ? strstr(tail, "\"" K3_MANIFEST_SUM_KEY "\": \"") : NULL, hex[17] = {0};
    if (k && strlen(k += strlen("\"" K3_MANIFEST_SUM_KEY "\": \"")) >= 16) memcpy(hex, k, 16);
    if (!k || k3_parse_hex64(hex, id))
        return k3_fail(d, K3_ERR_FORMAT, "'%s': no %s at its end", path, K3_MANIFEST_SUM_KEY);
    return K3_OK;
}

uint64_t k3_config_identity(const k3_weights *w)
{
    char *s = json_dumps(k3w_manifest(w)->config, JSON_COMPACT | JSON_SORT_KEYS);
    uint64_t h = s ? k3_xxh3_64(s, strlen(s)) : 0;
    free(s);
    return h;
}

/* Every part of the file in order: the history, the PRNG, the model's, the extras. */
typedef struct plist {
    k3_session_part *p;            /* [n] */
    uint32_t n;
    uint64_t rng[2];
} plist;

static k3_err parts_of(k3_model *m, uint32_t pos, const k3_session *s, plist *l, k3_diag *d)
{
    uint32_t nm = k3_model_state_nparts(m);
    l->n = 2 + nm + (uint32_t)s->n_extra;
    if (!(l->p = calloc(l->n, sizeof *l->p))) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    snprintf(l->p[0].name, sizeof l->p[0].name, "tokens");
    l->p[0].data = s->tokens;
    l->p[0].bytes = (uint64_t)s->n_tokens * sizeof(int32_t);
    snprintf(l->p[1].name, sizeof l->p[1].name, "rng");
    l->p[1].data = l->rng;
    l->p[1].bytes = sizeof l->rng;
    for (uint32_t i = 0; i < nm; i++) {
        k3_state_part sp;
        k3_err e = k3_model_state_part(m, i, pos, &sp, d);
        if (e) { free(l->p); return e; }
        memcpy(l->p[2 + i].name, sp.name, sizeof sp.name);
        l->p[2 + i].data = sp.data;
        l->p[2 + i].bytes = sp.bytes;
    }
    for (int i = 0; i < s->n_extra; i++) {
        k3_session_part *p = &l->p[2 + nm + (uint32_t)i];
        snprintf(p->name, sizeof p->name, "extra.%.25s", s->extra[i].name);
        p->data = s->extra[i].data;
        p->bytes = s->extra[i].bytes;
    }
    return K3_OK;
}

static k3_err write_all(int fd, const void *b, size_t n, uint64_t off, const char *path, k3_diag *d)
{
    const uint8_t *p = b;
    while (n) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return k3_fail(d, errno == ENOSPC ? K3_ERR_NOSPACE : K3_ERR_IO, "'%s': cannot write: %s", path,
                                   strerror(errno));
        p += w; n -= (size_t)w; off += (uint64_t)w;
    }
    return K3_OK;
}

k3_err k3_session_save(const char *path, k3_model *m, const k3_weights *w, const char *pack, const k3_session *s,
                       uint64_t *file_bytes, k3_diag *d)
{
    uint64_t pack_id;
    k3_err e = k3_pack_identity(pack, &pack_id, d);
    if (e) return e;
    uint32_t pos = k3_model_pos(m);
    if (s->n_tokens < pos) return k3_fail(d, K3_ERR_INTERNAL, "session history shorter than the position");
    plist l = {0};
    l.rng[0] = s->rng_state;
    l.rng[1] = s->rng_inc;
    if ((e = parts_of(m, pos, s, &l, d))) return e;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { free(l.p); return k3_fail(d, K3_ERR_IO, "'%s': cannot create: %s", tmp, strerror(errno)); }
    uint64_t table = (uint64_t)l.n * ROW, off = HDR + table;
    uint8_t *head = calloc(1, HDR + table);            /* [HDR + n x ROW] header and table */
    void *z = NULL;
    size_t zcap = 0;
    if (!head) e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; !e && i < l.n; i++) {
        const k3_session_part *p = &l.p[i];
        size_t need = ZSTD_compressBound((size_t)p->bytes);
        if (need > zcap) {
            free(z);
            if (!(z = malloc(zcap = need))) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); break; }
        }
        size_t zn = ZSTD_compress(z, zcap, p->data, (size_t)p->bytes, 3);
        if (ZSTD_isError(zn)) { e = k3_fail(d, K3_ERR_INTERNAL, "zstd: %s", ZSTD_getErrorName(zn)); break; }
        uint8_t *r = head + HDR + (uint64_t)i * ROW;
        memcpy(r, p->name, strlen(p->name));
        put64(r + 32, p->bytes);
        put64(r + 40, zn);
        put64(r + 48, k3_xxh3_64(p->data, (size_t)p->bytes));
        put64(r + 56, off);
        e = write_all(fd, z, zn, off, tmp, d);
        off += zn;
    }
    if (!e) {
        memcpy(head, K3_SESSION_MAGIC, 8);
        put32(head + 8, K3_SESSION_VERSION);
        put32(head + 12, l.n);
        put64(head + 16, pack_id);
        put64(head + 24, k3_config_identity(w));
        put32(head + 32, k3_model_context(m));
        put32(head + 36, pos);
        put32(head + 40, s->n_tokens);
        put64(head + 48, table);
        k3_hasher64 *h = k3_hasher64_new();
        if (!h) e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
        else {
            k3_hasher64_update(h, head, 56);
            k3_hasher64_update(h, head + HDR, (size_t)table);
            put64(head + 56, k3_hasher64_digest(h));
            k3_hasher64_free(h);
            e = write_all(fd, head, HDR + table, 0, tmp, d);
        }
    }
    if (!e && fsync(fd) != 0) e = k3_fail(d, K3_ERR_IO, "'%s': fsync: %s", tmp, strerror(errno));
    if (close(fd) != 0 && !e) e = k3_fail(d, K3_ERR_IO, "'%s': close: %s", tmp, strerror(errno));
    if (!e && rename(tmp, path) != 0) e = k3_fail(d, K3_ERR_IO, "'%s': cannot rename to '%s': %s", tmp, path,
                                                  strerror(errno));
    if (e) unlink(tmp);
    else if (file_bytes) *file_bytes = off;
    free(z);
    free(head);
    free(l.p);
    return e;
}

void k3_session_free(k3_session *s)
{
    free(s->tokens);
    for (int i = 0; i < s->n_extra; i++) free(s->extra[i].data);
    memset(s, 0, sizeof *s);
}

const k3_session_part *k3_session_extra(const k3_session *s, const char *name)
{
    for (int i = 0; i < s->n_extra; i++)
        if (!strcmp(s->extra[i].name, name)) return &s->extra[i];
    return NULL;
}

static k3_err read_at(int fd, void *b, size_t n, uint64_t off, const char *path, k3_diag *d)
{
    uint8_t *p = b;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return k3_fail(d, K3_ERR_IO, "'%s': cannot read: %s", path, strerror(errno));
        if (r == 0) return k3_fail(d, K3_ERR_CORRUPT, "'%s': truncated at byte %llu", path, (unsigned long long)off);
        p += r; n -= (size_t)r; off += (uint64_t)r;
    }
    return K3_OK;
}

/* Header and table: read and checked against this model and pack before anything is loaded. */
static k3_err read_head(int fd, const char *path, k3_model *m, const k3_weights *w, const char *pack,
                        uint8_t **head, uint32_t *n_parts, k3_diag *d)
{
    struct stat st;
    if (fstat(fd, &st) != 0) return k3_fail(d, K3_ERR_IO, "'%s': %s", path, strerror(errno));
    uint8_t h[HDR];
    if ((uint64_t)st.st_size < HDR) return k3_fail(d, K3_ERR_CORRUPT, "'%s': not a k3 session file (%lld bytes, "
                                                   "too short for its header)", path, (long long)st.st_size);
    k3_err e = read_at(fd, h, HDR, 0, path, d);
    if (e) return e;
    if (memcmp(h, K3_SESSION_MAGIC, 8))
        return k3_fail(d, K3_ERR_FORMAT, "'%s': not a k3 session file (bad magic)", path);
    if (get32(h + 8) != K3_SESSION_VERSION)
        return k3_fail(d, K3_ERR_UNSUPPORTED, "'%s': session format version %u; this k3run reads version %u", path,
                       get32(h + 8), K3_SESSION_VERSION);
    uint32_t n = get32(h + 12);
    uint64_t table = get64(h + 48);
    if (n > (1u << 16) || table != (uint64_t)n * ROW)
        return k3_fail(d, K3_ERR_CORRUPT, "'%s': damaged header (%u parts, table of %llu bytes)", path, n,
                       (unsigned long long)table);
    if (HDR + table > (uint64_t)st.st_size)
        return k3_fail(d, K3_ERR_CORRUPT, "'%s': truncated: its part table ends at byte %llu, the file has %lld",
                       path, (unsigned long long)(HDR + table), (long long)st.st_size);
    uint8_t *b = malloc(HDR + table);                  /* [HDR + n x ROW] */
    if (!b) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    memcpy(b, h, HDR);
    if ((e = read_at(fd, b + HDR, (size_t)table, HDR, path, d))) { free(b); return e; }
    k3_hasher64 *x = k3_hasher64_new();
    if (!x) { free(b); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
    k3_hasher64_update(x, b, 56);
    k3_hasher64_update(x, b + HDR, (size_t)table);
    uint64_t sum = k3_hasher64_digest(x);
    k3_hasher64_free(x);
    if (sum != get64(b + 56)) e = k3_fail(d, K3_ERR_CORRUPT, "'%s': damaged: its header or part table does not "
                                         "match its XXH3-64", path);
    uint64_t pack_id = 0;
    if (!e && get64(b + 24) != k3_config_identity(w))
        e = k3_fail(d, K3_ERR_MODEL, "'%s' was saved with another model config than this pack's", path);
    if (!e && !(e = k3_pack_identity(pack, &pack_id, d)) && get64(b + 16) != pack_id)
        e = k3_fail(d, K3_ERR_MODEL, "'%s' was saved with another pack (identity %016llx, this pack is %016llx)",
                    path, (unsigned long long)get64(b + 16), (unsigned long long)pack_id);
    uint32_t pos = get32(b + 36);
    if (!e && pos > k3_model_context(m))
        e = k3_fail(d, K3_ERR_USAGE, "'%s' holds %u positions, more than the context of %u (--context)", path, pos,
                    k3_model_context(m));
    if (!e && (get32(b + 40) < pos || n < 2 + k3_model_state_nparts(m) ||
               n > 2 + k3_model_state_nparts(m) + K3_SESSION_MAX_EXTRA))
        e = k3_fail(d, K3_ERR_CORRUPT, "'%s': damaged header (%u parts, position %u, %u tokens)", path, n, pos,
                    get32(b + 40));
    for (uint32_t i = 0; !e && i < n; i++) {
        const uint8_t *r = b + HDR + (uint64_t)i * ROW;
        uint64_t end = get64(r + 56) + get64(r + 40);
        if (r[31] != 0 || end < get64(r + 56))
            e = k3_fail(d, K3_ERR_CORRUPT, "'%s': damaged part table (row %u)", path, i);
        else if (end > (uint64_t)st.st_size)
            e = k3_fail(d, K3_ERR_CORRUPT, "'%s': truncated: part '%s' ends at byte %llu, the file has %lld", path,
                        (const char *)r, (unsigned long long)end, (long long)st.st_size);
    }
    if (e) { free(b); return e; }
    *head = b;
    *n_parts = n;
    return K3_OK;
}

/* Decompress part row r into dst (exactly want bytes), checking its hash. */
static k3_err load_part(int fd, const char *path, const uint8_t *r, void *dst, uint64_t want, void **zbuf,
                        size_t *zcap, k3_diag *d)
{
    if (get64(r + 32) != want)
        return k3_fail(d, K3_ERR_MODEL, "'%s': part '%s' holds %llu bytes, this model's has %llu (another model "
                       "or context?)", path, (const char *)r, (unsigned long long)get64(r + 32),
                       (unsigned long long)want);
    size_t zn = (size_t)get64(r + 40);
    if (zn > *zcap) {
        free(*zbuf);
        if (!(*zbuf = malloc(*zcap = zn))) { *zcap = 0; return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
    }
    k3_err e = read_at(fd, *zbuf, zn, get64(r + 56), path, d);
    if (e) return e;
    size_t got = ZSTD_decompress(dst, (size_t)want, *zbuf, zn);
    if (ZSTD_isError(got) || got != want || k3_xxh3_64(dst, (size_t)want) != get64(r + 48))
        return k3_fail(d, K3_ERR_CORRUPT, "'%s': part '%s' is damaged (%s)", path, (const char *)r,
                       ZSTD_isError(got) ? ZSTD_getErrorName(got) : got != want ? "wrong size" : "XXH3-64 mismatch");
    return K3_OK;
}

k3_err k3_session_load(const char *path, k3_model *m, const k3_weights *w, const char *pack, k3_session *s,
                       k3_diag *d)
{
    memset(s, 0, sizeof *s);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return k3_fail(d, errno == ENOENT ? K3_ERR_NOT_FOUND : K3_ERR_IO, "'%s': cannot open: %s", path,
                               strerror(errno));
    uint8_t *head = NULL;
    uint32_t n = 0;
    k3_err e = read_head(fd, path, m, w, pack, &head, &n, d);
    if (e) { close(fd); return e; }
    uint32_t pos = get32(head + 36), nm = k3_model_state_nparts(m);
    void *z = NULL;
    size_t zcap = 0;
    uint64_t rng[2];
    s->n_tokens = get32(head + 40);
    if (!(s->tokens = malloc(((size_t)s->n_tokens + 1) * sizeof *s->tokens))) e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
    if (!e) e = load_part(fd, path, head + HDR, s->tokens, (uint64_t)s->n_tokens * 4, &z, &zcap, d);
    if (!e) e = load_part(fd, path, head + HDR + ROW, rng, sizeof rng, &z, &zcap, d);
    if (!e) e = k3_model_state_set_pos(m, pos, d);
    for (uint32_t i = 0; !e && i < nm; i++) {
        const uint8_t *r = head + HDR + (uint64_t)(2 + i) * ROW;
        k3_state_part sp;
        if ((e = k3_model_state_part(m, i, pos, &sp, d))) break;
        if (strncmp((const char *)r, sp.name, 32))
            e = k3_fail(d, K3_ERR_MODEL, "'%s': part %u is '%s', this model's is '%s' (another model?)", path, 2 + i,
                        (const char *)r, sp.name);
        else e = load_part(fd, path, r, sp.data, sp.bytes, &z, &zcap, d);
    }
    for (uint32_t i = 2 + nm; !e && i < n; i++) {
        const uint8_t *r = head + HDR + (uint64_t)i * ROW;
        k3_session_part *p = &s->extra[s->n_extra];
        if (strncmp((const char *)r, "extra.", 6) || get64(r + 32) > (1ull << 32)) {
            e = k3_fail(d, K3_ERR_CORRUPT, "'%s': damaged part table (part '%s')", path, (const char *)r);
            break;
        }
        snprintf(p->name, sizeof p->name, "%s", (const char *)r + 6);
        p->bytes = get64(r + 32);
        if (!(p->data = malloc((size_t)p->bytes + 1))) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); break; }
        s->n_extra++;
        e = load_part(fd, path, r, p->data, p->bytes, &z, &zcap, d);
        if (!e) ((char *)p->data)[p->bytes] = 0;      /* text extras read as C strings */
    }
    free(z);
    free(head);
    close(fd);
    if (e) {
        k3_model_reset(m);                             /* never half-loaded */
        k3_session_free(s);
        return e;
    }
    s->rng_state = rng[0];
    s->rng_inc = rng[1];
    return K3_OK;
}

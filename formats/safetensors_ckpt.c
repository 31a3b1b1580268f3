/*
 * safetensors_ckpt.c - a checkpoint: one safetensors file, or a directory of
 * shards with model.safetensors.index.json, plus config.json if present.
 * Only headers are read (pread); tensors are found by name through a hash table.
 */
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "k3_checked.h"
#include "k3_file.h"
#include "k3_hash.h"
#include "k3_json.h"
#include "k3_log.h"

typedef struct { char s[200]; } esc_buf;
static const char *esc(esc_buf *b, const char *s, size_t n) { return k3_escape(s, n, b->s, sizeof b->s); }
static const char *esc0(esc_buf *b, const char *s) { return esc(b, s, strlen(s)); }

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

static void add_warning(k3_st_ckpt *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_warning(k3_st_ckpt *c, const char *fmt, ...)
{
    char buf[K3_DIAG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char **w = realloc(c->warnings, (c->n_warnings + 1) * sizeof *w);
    if (!w) return;                      /* a lost warning is not worth failing for */
    c->warnings = w;
    if ((w[c->n_warnings] = xstrdup(buf))) c->n_warnings++;
}

/* ------------------------------------------------------------------------- */
/* files and tensors                                                          */

/* Open path (file name fname), read and validate its header, append its
 * tensors. Messages about its content name it dn. */
static k3_err append_path(k3_st_ckpt *c, const char *path, const char *fname, const char *dn, k3_diag *d)
{
    k3_err e;
    int fd = k3_open_read(path);
    if (fd < 0)
        return k3_fail(d, errno == ENOENT ? K3_ERR_NOT_FOUND : K3_ERR_IO, "cannot open '%s': %s",
                       path, strerror(errno));
    k3_st_header h;
    e = k3_st_read_header(fd, path, dn, &h, d);
    close(fd);
    if (e) return e;

    uint64_t bytes = c->total_bytes;
    int overflow = c->n_files >= UINT32_MAX - 1 || h.n_tensors >= UINT32_MAX - 1 - c->n_tensors;
    for (size_t i = 0; i < h.n_tensors && !overflow; i++)
        overflow = k3_add_u64(bytes, h.tensors[i].nbytes, &bytes);
    if (overflow) {
        k3_st_header_free(&h);
        return k3_fail(d, K3_ERR_FORMAT, "'%s': too many tensors or bytes in the checkpoint", dn);
    }
    e = K3_ERR_NOMEM;
    k3_st_file *nf = realloc(c->files, (c->n_files + 1) * sizeof *nf);
    if (nf) c->files = nf;
    char **np = nf ? realloc(c->pools, (c->n_pools + 1) * sizeof *np) : NULL;
    if (np) c->pools = np;
    if (np && c->n_tensors + h.n_tensors > c->tensors_cap) {
        size_t cap = c->tensors_cap ? c->tensors_cap : 1024;
        while (cap < c->n_tensors + h.n_tensors) cap *= 2;
        k3_st_tensor *nt = realloc(c->tensors, cap * sizeof *nt);
        if (nt) { c->tensors = nt; c->tensors_cap = cap; }
    }
    k3_st_file f = {0};
    if (np && c->n_tensors + h.n_tensors <= c->tensors_cap && (f.path = xstrdup(path)) &&
        (f.name = xstrdup(fname)))
        e = K3_OK;
    if (e) {
        free(f.path);
        k3_st_header_free(&h);
        return k3_fail(d, K3_ERR_NOMEM, "out of memory reading '%s'", path);
    }
    f.size = h.file_size;
    f.header_len = h.header_len;
    f.first_tensor = c->n_tensors;
    f.n_tensors = h.n_tensors;
    f.meta = h.meta;                     /* its strings live in h.pool, now owned by c */
    f.n_meta = h.n_meta;
    c->files[c->n_files] = f;
    for (size_t i = 0; i < h.n_tensors; i++) {
        k3_st_tensor *t = &c->tensors[c->n_tensors + i];
        *t = h.tensors[i];
        t->file = (uint32_t)c->n_files;
    }
    c->total_bytes = bytes;
    c->n_tensors += h.n_tensors;
    c->pools[c->n_pools++] = h.pool;
    c->n_files++;
    free(h.tensors);
    return K3_OK;
}

/* append_path for dir/fname. */
static k3_err append_file(k3_st_ckpt *c, const char *fname, const char *dn, k3_diag *d)
{
    char path[4096];
    k3_err e = k3_path_join(path, sizeof path, c->dir, fname, d);
    return e ? e : append_path(c, path, fname, dn, d);
}

static size_t hash_slot(const k3_st_ckpt *c, const char *name, size_t len)
{
    return (size_t)k3_xxh3_64(name, len) & (c->hash_cap - 1);
}

/* Index every tensor by name; a name in two files is an error. */
static k3_err build_hash(k3_st_ckpt *c, k3_diag *d)
{
    size_t cap = 16;
    while (cap < c->n_tensors * 2) cap *= 2;
    c->hash = calloc(cap, sizeof *c->hash);
    if (!c->hash) return k3_fail(d, K3_ERR_NOMEM, "out of memory indexing %zu tensors", c->n_tensors);
    c->hash_cap = cap;
    for (size_t i = 0; i < c->n_tensors; i++) {
        const k3_st_tensor *t = &c->tensors[i];
        size_t s = hash_slot(c, t->name, t->name_len);
        for (;;) {
            uint32_t v = c->hash[s];
            if (!v) { c->hash[s] = (uint32_t)i + 1; break; }
            const k3_st_tensor *o = &c->tensors[v - 1];
            if (o->name_len == t->name_len && memcmp(o->name, t->name, t->name_len) == 0) {
                esc_buf b;
                return k3_fail(d, K3_ERR_FORMAT, "tensor '%s' is in both '%s' and '%s'",
                               esc0(&b, t->name), c->files[o->file].name, c->files[t->file].name);
            }
            s = (s + 1) & (cap - 1);
        }
    }
    return K3_OK;
}

static const k3_st_tensor *find_n(const k3_st_ckpt *c, const char *name, size_t len)
{
    if (!c->hash_cap) return NULL;
    for (size_t s = hash_slot(c, name, len);; s = (s + 1) & (c->hash_cap - 1)) {
        uint32_t v = c->hash[s];
        if (!v) return NULL;
        const k3_st_tensor *t = &c->tensors[v - 1];
        if (t->name_len == len && memcmp(t->name, name, len) == 0) return t;
    }
}

const k3_st_tensor *k3_st_find(const k3_st_ckpt *c, const char *name)
{
    return find_n(c, name, strlen(name));
}

/* ------------------------------------------------------------------------- */
/* model.safetensors.index.json                                               */

/* Shard names of the index: a small growable string -> index table. */
typedef struct shard_set {
    char **names;                /* owned copies */
    uint32_t *example;           /* token of a tensor name mapped to each shard, for messages */
    size_t n, cap;
    uint32_t *slots;             /* index + 1 */
    size_t n_slots;
} shard_set;

static size_t shard_hash(const char *s, size_t len) { return (size_t)k3_xxh3_64(s, len); }

static long shard_find(const shard_set *s, const char *name, size_t len)
{
    if (!s->n_slots) return -1;
    for (size_t i = shard_hash(name, len) & (s->n_slots - 1);; i = (i + 1) & (s->n_slots - 1)) {
        if (!s->slots[i]) return -1;
        const char *o = s->names[s->slots[i] - 1];
        if (strlen(o) == len && memcmp(o, name, len) == 0) return (long)s->slots[i] - 1;
    }
}

/* Index of shard (name, len), added if new; -1 when out of memory. */
static long shard_add(shard_set *s, const char *name, size_t len, uint32_t example)
{
    long k = shard_find(s, name, len);
    if (k >= 0) return k;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        char **a = realloc(s->names, cap * sizeof *a);
        if (!a) return -1;
        s->names = a;
        uint32_t *b = realloc(s->example, cap * sizeof *b);
        if (!b) return -1;
        s->example = b;
        s->cap = cap;
    }
    if (!(s->names[s->n] = strndup(name, len))) return -1;
    s->example[s->n] = example;
    s->n++;
    if (s->n * 2 > s->n_slots) {         /* rebuild at 50% load */
        size_t ns = s->n_slots ? s->n_slots * 2 : 128;
        uint32_t *sl = calloc(ns, sizeof *sl);
        if (!sl) return -1;
        free(s->slots);
        s->slots = sl;
        s->n_slots = ns;
        for (size_t j = 0; j < s->n; j++) {
            size_t i = shard_hash(s->names[j], strlen(s->names[j])) & (ns - 1);
            while (sl[i]) i = (i + 1) & (ns - 1);
            sl[i] = (uint32_t)j + 1;
        }
    } else {
        size_t i = shard_hash(name, len) & (s->n_slots - 1);
        while (s->slots[i]) i = (i + 1) & (s->n_slots - 1);
        s->slots[i] = (uint32_t)s->n;
    }
    return (long)s->n - 1;
}

static void shard_set_free(shard_set *s)
{
    for (size_t i = 0; i < s->n; i++) free(s->names[i]);
    free(s->names);
    free(s->example);
    free(s->slots);
}

/* A shard name must be a plain file name: no directory part, no "..", and no
   longer than a file name can be (NAME_MAX, 255 bytes on Linux). */
static int plain_name(const char *s, size_t n)
{
    if (n == 0 || n > 255 || (n == 1 && s[0] == '.') || memchr(s, '/', n)) return 0;
    for (size_t i = 0; i + 1 < n; i++)
        if (s[i] == '.' && s[i + 1] == '.') return 0;
    return 1;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static k3_err open_index(k3_st_ckpt *c, const char *index_path, k3_diag *d)
{
    const char *in = K3_ST_INDEX_NAME;
    char *text = NULL;
    size_t len = 0;
    k3_err e = k3_read_file(index_path, K3_ST_MAX_INDEX, &text, &len, d);
    if (e) return e;
    k3j_doc doc = {0};
    k3j_error je;
    shard_set ss = {0};
    uint8_t *listed = NULL;
    uint32_t *entry_shard = NULL;
    char **sorted = NULL;
    if (k3j_parse(text, len, &doc, &je)) { e = k3j_fail(&je, in, "index", 0, d); goto out; }
    const k3j_tok *tok = doc.t;
    if (tok[0].type != K3J_OBJ) { e = k3_fail(d, K3_ERR_FORMAT, "'%s': not a JSON object", in); goto out; }
    uint32_t wm = k3j_get(&doc, 0, "weight_map", 10);
    if (!wm) { e = k3_fail(d, K3_ERR_FORMAT, "'%s': missing 'weight_map'", in); goto out; }
    if (tok[wm].type != K3J_OBJ) { e = k3_fail(d, K3_ERR_FORMAT, "'%s': 'weight_map' is not an object", in); goto out; }
    if (tok[wm].size == 0) { e = k3_fail(d, K3_ERR_FORMAT, "'%s': 'weight_map' is empty", in); goto out; }

    entry_shard = malloc(tok[wm].size * sizeof *entry_shard);
    if (!entry_shard) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory reading '%s'", in); goto out; }
    size_t ei = 0;
    long last = -1;
    for (uint32_t k = k3j_first(&doc, wm); k; k = k3j_next(&doc, wm, k), ei++) {
        const k3j_tok *tn = &tok[k], *v = &tok[k + 1];
        esc_buf b1, b2;
        if (v->type != K3J_STR) {
            e = k3_fail(d, K3_ERR_FORMAT, "'%s': weight_map entry for tensor '%s' is not a string", in,
                        esc(&b1, tn->v.s, tn->size));
            goto out;
        }
        if (last >= 0 && strlen(ss.names[last]) == v->size && memcmp(ss.names[last], v->v.s, v->size) == 0) {
            entry_shard[ei] = (uint32_t)last;      /* consecutive entries usually share a shard */
            continue;
        }
        if (!plain_name(v->v.s, v->size)) {
            e = k3_fail(d, K3_ERR_FORMAT, "'%s': weight_map puts tensor '%s' in '%s', which is not a plain file name",
                        in, esc(&b1, tn->v.s, tn->size), esc(&b2, v->v.s, v->size));
            goto out;
        }
        if ((last = shard_add(&ss, v->v.s, v->size, k)) < 0) {
            e = k3_fail(d, K3_ERR_NOMEM, "out of memory reading '%s'", in);
            goto out;
        }
        entry_shard[ei] = (uint32_t)last;
    }

    /* open the shards in name order */
    sorted = malloc(ss.n * sizeof *sorted);
    if (!sorted) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory reading '%s'", in); goto out; }
    memcpy(sorted, ss.names, ss.n * sizeof *sorted);
    qsort(sorted, ss.n, sizeof *sorted, cmp_str);
    for (size_t i = 0; i < ss.n; i++) {
        e = append_file(c, sorted[i], sorted[i], d);
        if (e == K3_ERR_NOT_FOUND) {
            esc_buf b1, b2;
            const k3j_tok *ex = &tok[ss.example[shard_find(&ss, sorted[i], strlen(sorted[i]))]];
            e = k3_fail(d, K3_ERR_NOT_FOUND, "'%s' names shard '%s' (for tensor '%s'), but '%s/%s' does not exist",
                        in, esc0(&b1, sorted[i]), esc(&b2, ex->v.s, ex->size), c->dir, sorted[i]);
        }
        if (e) goto out;
    }
    if ((e = build_hash(c, d))) goto out;

    /* every index entry is in its shard; every shard tensor is in the index */
    listed = calloc(c->n_tensors ? c->n_tensors : 1, 1);
    if (!listed) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory checking '%s'", in); goto out; }
    ei = 0;
    for (uint32_t k = k3j_first(&doc, wm); k; k = k3j_next(&doc, wm, k), ei++) {
        const k3j_tok *tn = &tok[k];
        const char *sn = ss.names[entry_shard[ei]];
        const k3_st_tensor *t = find_n(c, tn->v.s, tn->size);
        esc_buf b1, b2;
        if (!t) {
            e = k3_fail(d, K3_ERR_FORMAT, "'%s' lists tensor '%s' in '%s', but that shard has no such tensor",
                        in, esc(&b1, tn->v.s, tn->size), esc0(&b2, sn));
            goto out;
        }
        if (strcmp(c->files[t->file].name, sn) != 0) {
            e = k3_fail(d, K3_ERR_FORMAT, "'%s' lists tensor '%s' in '%s', but it is in '%s'",
                        in, esc(&b1, tn->v.s, tn->size), esc0(&b2, sn), c->files[t->file].name);
            goto out;
        }
        listed[t - c->tensors] = 1;
    }
    for (size_t i = 0; i < c->n_tensors; i++) {
        if (!listed[i]) {
            esc_buf b;
            e = k3_fail(d, K3_ERR_FORMAT, "tensor '%s' in '%s' is not listed in '%s'",
                        esc0(&b, c->tensors[i].name), c->files[c->tensors[i].file].name, in);
            goto out;
        }
    }

    /* total_size is advisory (FORMATS.md §1.6): data bytes, or file bytes for some writers */
    uint32_t md = k3j_get(&doc, 0, "metadata", 8);
    uint32_t ts = md ? k3j_get(&doc, md, "total_size", 10) : 0;
    if (ts) {
        uint64_t file_bytes = 0;
        for (size_t i = 0; i < c->n_files; i++) file_bytes += c->files[i].size;
        if (tok[ts].type != K3J_INT || tok[ts].v.i < 0)
            add_warning(c, "'%s': metadata.total_size is not a non-negative integer; ignored", in);
        else if ((uint64_t)tok[ts].v.i != c->total_bytes && (uint64_t)tok[ts].v.i != file_bytes)
            add_warning(c, "'%s': metadata.total_size %lld matches neither the tensor bytes %" PRIu64
                        " nor the file bytes %" PRIu64, in, (long long)tok[ts].v.i, c->total_bytes, file_bytes);
    }
    e = K3_OK;
out:
    free(sorted);
    free(entry_shard);
    free(listed);
    shard_set_free(&ss);
    k3j_free(&doc);
    free(text);
    return e;
}

/* ------------------------------------------------------------------------- */
/* directories without an index, and the entry point                         */

static k3_err open_plain_dir(k3_st_ckpt *c, k3_diag *d)
{
    DIR *dh = opendir(c->dir);
    if (!dh) return k3_fail(d, K3_ERR_IO, "cannot read directory '%s': %s", c->dir, strerror(errno));
    size_t n = 0;
    int has_model = 0;
    char first[1024] = "";
    struct dirent *de;
    while ((de = readdir(dh))) {
        if (de->d_name[0] == '.' || !ends_with(de->d_name, ".safetensors")) continue;
        if (!n) snprintf(first, sizeof first, "%s", de->d_name);
        if (strcmp(de->d_name, "model.safetensors") == 0) has_model = 1;
        n++;
    }
    closedir(dh);
    if (n == 0)
        return k3_fail(d, K3_ERR_NOT_FOUND, "'%s' holds no %s and no .safetensors file", c->dir, K3_ST_INDEX_NAME);
    if (has_model) {
        if (n > 1)
            add_warning(c, "'%s' has no %s: reading model.safetensors and ignoring %zu other .safetensors files",
                        c->dir, K3_ST_INDEX_NAME, n - 1);
        return append_file(c, "model.safetensors", "model.safetensors", d);
    }
    if (n > 1)
        return k3_fail(d, K3_ERR_FORMAT,
                       "'%s' holds %zu .safetensors files but no %s and no model.safetensors: "
                       "cannot tell which belong to the model", c->dir, n, K3_ST_INDEX_NAME);
    return append_file(c, first, first, d);
}

k3_err k3_st_index(k3_st_ckpt *c, k3_diag *d) { return build_hash(c, d); }

void k3_st_close(k3_st_ckpt *c)
{
    if (!c) return;
    for (size_t i = 0; i < c->n_files; i++) {
        free(c->files[i].path);
        free(c->files[i].name);
        free(c->files[i].meta);
    }
    for (size_t i = 0; i < c->n_pools; i++) free(c->pools[i]);
    for (size_t i = 0; i < c->n_warnings; i++) free(c->warnings[i]);
    free(c->files);
    free(c->pools);
    free(c->warnings);
    free(c->tensors);
    free(c->hash);
    free(c->config_json);
    free(c->source);
    free(c->dir);
    memset(c, 0, sizeof *c);
}

k3_err k3_st_open(const char *path, k3_st_ckpt *c, k3_diag *d)
{
    memset(c, 0, sizeof *c);
    struct stat st;
    if (stat(path, &st) != 0)
        return k3_fail(d, errno == ENOENT ? K3_ERR_NOT_FOUND : K3_ERR_IO, "cannot open '%s': %s",
                       path, strerror(errno));
    k3_err e;
    if (!(c->source = xstrdup(path))) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    if (S_ISREG(st.st_mode)) {
        /* a single file: the directory part is its dir, the name its display name */
        const char *slash = strrchr(path, '/');
        c->dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : xstrdup(".");
        if (!c->dir) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); goto fail; }
        if ((e = append_path(c, path, slash ? slash + 1 : path, path, d))) goto fail;
        if ((e = build_hash(c, d))) goto fail;
        return K3_OK;
    }
    if (!S_ISDIR(st.st_mode)) {
        e = k3_fail(d, K3_ERR_FORMAT, "'%s' is neither a regular file nor a directory", path);
        goto fail;
    }
    if (!(c->dir = xstrdup(path))) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); goto fail; }
    char p[4096];
    if ((e = k3_path_join(p, sizeof p, c->dir, K3_ST_INDEX_NAME, d))) goto fail;
    if (access(p, F_OK) == 0) {
        c->has_index = 1;
        if ((e = open_index(c, p, d))) goto fail;
    } else {
        if ((e = open_plain_dir(c, d))) goto fail;
        if ((e = build_hash(c, d))) goto fail;
    }
    if ((e = k3_path_join(p, sizeof p, c->dir, "config.json", d))) goto fail;
    e = k3_read_file(p, K3_ST_MAX_CONFIG, &c->config_json, &c->config_len, d);
    if (e == K3_ERR_NOT_FOUND) e = K3_OK;
    if (e) goto fail;
    return K3_OK;
fail:
    k3_st_close(c);
    return e;
}

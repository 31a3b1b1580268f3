/*
 * pack_source_archive.c - k3pack straight from a tar / tar.gz / tar.zst (or
 * stdin), in one sequential pass with bounded memory when config.json comes
 * before the weights (a tar made from a sorted listing has it first). When it
 * comes later (`tar -cf - .` lists files in directory order), an archive file
 * is read twice: a first pass stops at config.json (an uncompressed tar skips
 * the data with lseek; a compressed one is decompressed up to config.json),
 * then the archive is opened again and packed from its start. From stdin that
 * is impossible, and the error gives the tar command that puts config.json
 * first. In the packing pass each
 * safetensors entry's header is read and validated, then its tensors stream
 * into their planned places in the shards (pwrite), whatever the order of the
 * entries. A shard is finished (hashed, renamed, journalled) as soon as its
 * last tensor has arrived. Missing tensors are reported at the end, and no
 * manifest is written then, so the output never looks complete when it is not.
 */
#include "pack.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "k3_checked.h"
#include "k3_ckpt_check.h"
#include "k3_log.h"

#define PK_SMALL_MAX (64u << 20)     /* config, index and tokenizer files */
#define PK_BLOCK (1u << 20)

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static int ends_with(const char *s, const char *x)
{
    size_t n = strlen(s), m = strlen(x);
    return n >= m && !memcmp(s + n - m, x, m);
}

static k3_err arc_fail(pk_archive *ar, k3_diag *d, const char *what)
{
    const char *msg = archive_error_string(ar->a);
    return k3_fail(d, K3_ERR_FORMAT, "'%s': %s: %s", ar->src, what, msg ? msg : "unknown archive error");
}

/*
 * The next entry header. Only ARCHIVE_OK and ARCHIVE_WARN give an entry:
 * ARCHIVE_RETRY (a damaged header, e.g. a bad checksum) leaves none, and
 * neither do ARCHIVE_FAILED and ARCHIVE_FATAL. Returns 1 at the end of the
 * archive, 0 with *name set, or 0 with *e set.
 */
static int next_entry(pk_archive *ar, struct archive_entry **en, const char **name, k3_err *e, k3_diag *d)
{
    int r = archive_read_next_header(ar->a, en);
    if (r == ARCHIVE_EOF) return 1;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
        *e = arc_fail(ar, d, "cannot read the next entry");
        return 0;
    }
    if (r == ARCHIVE_WARN) {
        const char *msg = archive_error_string(ar->a);
        k3_warn("'%s': %s", ar->src, msg ? msg : "libarchive warning");
    }
    const char *path = archive_entry_pathname(*en);
    if (!path) {
        *e = k3_fail(d, K3_ERR_FORMAT, "'%s': an entry has no usable name", ar->src);
        return 0;
    }
    *name = base_name(path);
    return 0;
}

/* Entry checks shared by every file we use: regular, sized, not sparse. */
static k3_err usable_entry(pk_archive *ar, struct archive_entry *en, const char *name, k3_diag *d)
{
    if (archive_entry_hardlink(en))
        return k3_fail(d, K3_ERR_FORMAT, "'%s': '%s' is a hard link to '%s', stored without its data; make the "
                       "archive with tar --hard-dereference", ar->src, name, archive_entry_hardlink(en));
    if (archive_entry_filetype(en) != AE_IFREG)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': '%s' is not a regular file (a link?); make the archive with "
                       "tar --dereference", ar->src, name);
    if (!archive_entry_size_is_set(en))
        return k3_fail(d, K3_ERR_FORMAT, "'%s': '%s' has no size in the archive", ar->src, name);
    if (archive_entry_sparse_count(en) > 0)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': '%s' is a sparse entry; k3pack refuses those", ar->src, name);
    return K3_OK;
}

static k3_err read_small(pk_archive *ar, struct archive_entry *en, const char *name, char **out, size_t *len,
                         k3_diag *d)
{
    k3_err e = usable_entry(ar, en, name, d);
    if (e) return e;
    int64_t size = archive_entry_size(en);
    if (size < 0 || (uint64_t)size > PK_SMALL_MAX)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': '%s' is %lld bytes, over the limit for this file", ar->src, name,
                       (long long)size);
    char *buf = malloc((size_t)size + 1);                       /* [size] + NUL */
    if (!buf) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    size_t got = 0;
    while (got < (size_t)size) {
        la_ssize_t r = archive_read_data(ar->a, buf + got, (size_t)size - got);
        if (r < 0) { free(buf); return arc_fail(ar, d, name); }
        if (r == 0) break;
        got += (size_t)r;
    }
    if (got != (size_t)size) {
        free(buf);
        return k3_fail(d, K3_ERR_FORMAT, "'%s': '%s' is truncated: %zu of %lld bytes", ar->src, name, got, (long long)size);
    }
    buf[got] = '\0';
    *out = buf;
    *len = got;
    return K3_OK;
}

/* Small side files: index and tokenizer. Returns 1 if name was one of them. */
static int side_file(pk_archive *ar, struct archive_entry *en, const char *name, k3_err *e, k3_diag *d)
{
    if (!strcmp(name, K3_ST_INDEX_NAME)) {
        if (ar->index) { *e = k3_fail(d, K3_ERR_FORMAT, "'%s': '%s' appears twice", ar->src, name); return 1; }
        *e = read_small(ar, en, name, &ar->index, &ar->index_len, d);
        return 1;
    }
    for (int i = 0; i < PK_MAX_TOK; i++)
        if (!strcmp(name, ar->tok_names[i])) {
            if (ar->tok_data[i]) { *e = k3_fail(d, K3_ERR_FORMAT, "'%s': '%s' appears twice", ar->src, name); return 1; }
            *e = read_small(ar, en, name, &ar->tok_data[i], &ar->tok_len[i], d);
            return 1;
        }
    return 0;
}

static k3_err open_archive(pk_archive *ar, k3_diag *d)
{
    if (ar->a) archive_read_free(ar->a);
    ar->a = archive_read_new();
    if (!ar->a) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    archive_read_support_filter_all(ar->a);
    archive_read_support_format_tar(ar->a);
    int r = !strcmp(ar->src, "-") ? archive_read_open_fd(ar->a, 0, PK_BLOCK)
                                   : archive_read_open_filename(ar->a, ar->src, PK_BLOCK);
    if (r != ARCHIVE_OK) {
        const char *msg = archive_error_string(ar->a);
        return k3_fail(d, msg && strstr(msg, "No such file") ? K3_ERR_NOT_FOUND : K3_ERR_FORMAT,
                       "cannot read '%s' as an archive: %s", ar->src, msg ? msg : "unknown error");
    }
    return K3_OK;
}

/* The first pass of an archive file whose config.json comes after weights:
   on to config.json, skipping every entry's data (side files are read in the
   packing pass). */
static k3_err find_config(pk_archive *ar, const char *first_weights, k3_diag *d)
{
    char esc[300];
    k3_info("'%s': config.json is not before the weights (first '%s'); reading the archive once to find it, "
            "then packing from its start", ar->src, k3_escape(first_weights, strlen(first_weights), esc, sizeof esc));
    struct archive_entry *en;
    for (;;) {
        const char *name = NULL;
        k3_err e = pk_check_interrupt(d);
        if (e) return e;
        if (next_entry(ar, &en, &name, &e, d))
            return k3_fail(d, K3_ERR_MODEL, "'%s': the archive holds no config.json", ar->src);
        if (e) return e;
        if (archive_entry_filetype(en) != AE_IFDIR && !strcmp(name, "config.json")) {
            if ((e = read_small(ar, en, name, &ar->config, &ar->config_len, d))) return e;
            break;
        }
    }
    ar->two_pass = 1;
    for (int i = 0; i < PK_MAX_TOK; i++) { free(ar->tok_data[i]); ar->tok_data[i] = NULL; }
    free(ar->index);
    ar->index = NULL;
    return open_archive(ar, d);
}

k3_err pk_archive_open(pk_archive *ar, const char *src, k3_diag *d)
{
    memset(ar, 0, sizeof *ar);
    ar->src = src;
    ar->tok_names[0] = "tiktoken.model";
    ar->tok_names[1] = "tokenizer_config.json";
    ar->tok_names[2] = K3_GENCONFIG_NAME;
    k3_err e = open_archive(ar, d);
    if (e) return e;
    if (strcmp(src, "-")) {
        /* the resume fingerprint's input: the archive file's size and mtime stand for its content */
        struct stat st;
        if (stat(src, &st) != 0) return k3_fail(d, K3_ERR_IO, "cannot stat '%s': %s", src, strerror(errno));
        snprintf(ar->input.name, sizeof ar->input.name, "%s", base_name(src));
        ar->input.size = (uint64_t)st.st_size;
        ar->input.mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    }
    struct archive_entry *en;
    for (;;) {
        const char *name = NULL;
        e = K3_OK;
        if (next_entry(ar, &en, &name, &e, d))
            return k3_fail(d, K3_ERR_MODEL, "'%s': the archive holds no config.json", src);
        if (e) return e;
        if (archive_entry_filetype(en) == AE_IFDIR) continue;
        if (!strcmp(name, "config.json")) return read_small(ar, en, name, &ar->config, &ar->config_len, d);
        if (side_file(ar, en, name, &e, d)) {
            if (e) return e;
            continue;
        }
        if (ends_with(name, ".safetensors")) {
            char esc[300];
            k3_escape(name, strlen(name), esc, sizeof esc);
            if (strcmp(src, "-")) {
                char *first = strdup(esc);
                if (!first) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
                e = find_config(ar, first, d);
                free(first);
                return e;
            }
            return k3_fail(d, K3_ERR_USAGE, "'%s': '%s' comes before config.json in the archive on stdin; k3pack "
                           "reads stdin once, so config.json must come first. Make the archive with "
                           "'tar -cf - --sort=name -C CHECKPOINT_DIR .' (GNU tar: config.json sorts before "
                           "the model-*.safetensors files), or give k3pack the archive as a file, which it can "
                           "read twice", src, esc);
        }
    }
}

void pk_archive_close(pk_archive *ar)
{
    if (ar->a) archive_read_free(ar->a);
    free(ar->config);
    free(ar->index);
    for (int i = 0; i < PK_MAX_TOK; i++) free(ar->tok_data[i]);
    for (size_t i = 0; i < ar->n_skipped; i++) free(ar->skipped[i]);
    free(ar->skipped);
    memset(ar, 0, sizeof *ar);
}

/* State of one safetensors entry being streamed. */
typedef struct entry_stream {
    const char *name;            /* entry base name */
    uint64_t size;               /* entry size */
    uint64_t pos;                /* bytes consumed */
    uint8_t *hdr;                /* [8 + N] header bytes */
    size_t hdr_fill, hdr_need;
    k3_st_header h;              /* parsed header, tensors sorted by begin */
    int parsed;
    size_t ti;                   /* current tensor */
    pk_item *cur;                /* its item, NULL = skip its bytes */
    pk_feed feed;
    int feeding;
} entry_stream;

static k3_err start_tensor(pk_archive *ar, pk_writer *w, uint32_t *seen_entry, uint32_t entry_no,
                           entry_stream *es, k3_diag *d)
{
    const k3_st_tensor *t = &es->h.tensors[es->ti];
    es->cur = pk_plan_find(w->p, t->name);
    if (!es->cur) {
        char esc[300];
        if (k3_is_vision_tensor(t->name)) {
            char **sk = realloc(ar->skipped, (ar->n_skipped + 1) * sizeof *sk);
            if (!sk || !(sk[ar->n_skipped] = strdup(t->name))) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
            ar->skipped = sk;
            ar->n_skipped++;
            return K3_OK;
        }
        return k3_fail(d, K3_ERR_MODEL, "'%s': tensor '%s' in '%s' is not part of the model config.json describes",
                       ar->src, k3_escape(t->name, t->name_len, esc, sizeof esc), es->name);
    }
    k3_err e = pk_item_check(es->cur, t, es->name, d);
    if (e) return e;
    size_t idx = (size_t)(es->cur - w->p->items);
    if (seen_entry[idx]) {
        char esc[300];
        return k3_fail(d, K3_ERR_FORMAT, "'%s': tensor '%s' appears twice (again in '%s')", ar->src,
                       k3_escape(t->name, t->name_len, esc, sizeof esc), es->name);
    }
    seen_entry[idx] = entry_no;
    uint32_t s = es->cur->shard;
    if (w->done[s]) { es->cur = NULL; return K3_OK; }       /* finished by an earlier run */
    if (w->af[s].fd < 0 && (e = pk_shard_begin(w, s, d))) return e;
    if ((e = pk_feed_begin(&es->feed, es->cur, d))) return e;
    es->feeding = 1;
    return K3_OK;
}

static k3_err end_tensor(pk_writer *w, entry_stream *es, k3_diag *d)
{
    k3_err e = K3_OK;
    if (es->feeding) {
        e = pk_feed_end(w, &es->feed, d);
        pk_feed_free(&es->feed);
        es->feeding = 0;
        if (!e && w->remaining[es->cur->shard] == 0) e = pk_shard_finish(w, es->cur->shard, d);
    }
    es->cur = NULL;
    es->ti++;
    return e;
}

/* Consume one block of entry data. */
static k3_err consume(pk_archive *ar, pk_writer *w, uint32_t *seen_entry, uint32_t entry_no, entry_stream *es,
                      const uint8_t *p, size_t n, k3_diag *d)
{
    k3_err e = K3_OK;
    while (n && !e) {
        if (!es->parsed) {                            /* header bytes */
            size_t take = es->hdr_need - es->hdr_fill < n ? es->hdr_need - es->hdr_fill : n;
            memcpy(es->hdr + es->hdr_fill, p, take);
            es->hdr_fill += take;
            p += take;
            n -= take;
            es->pos += take;
            if (es->hdr_fill < es->hdr_need) continue;
            if (es->hdr_need == 8) {                  /* got the length prefix: grow to 8 + N */
                uint64_t N;
                if ((e = k3_st_check_prefix(es->hdr, 8, es->size, es->name, &N, d))) return e;
                uint8_t *nb = realloc(es->hdr, (size_t)(8 + N));
                if (!nb) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
                es->hdr = nb;
                es->hdr_need = (size_t)(8 + N);
                continue;
            }
            if ((e = k3_st_parse_header(es->hdr, es->hdr_fill, es->size, es->name, &es->h, d))) return e;
            es->parsed = 1;
            while (es->ti < es->h.n_tensors && es->h.tensors[es->ti].nbytes == 0 && !e) {
                e = start_tensor(ar, w, seen_entry, entry_no, es, d);
                if (!e) e = end_tensor(w, es, d);
            }
            if (!e && es->ti < es->h.n_tensors) e = start_tensor(ar, w, seen_entry, entry_no, es, d);
            continue;
        }
        if (es->ti >= es->h.n_tensors)
            return k3_fail(d, K3_ERR_FORMAT, "'%s': '%s' has bytes after its last tensor", ar->src, es->name);
        const k3_st_tensor *t = &es->h.tensors[es->ti];
        uint64_t end = t->offset + t->nbytes;
        size_t take = (size_t)(end - es->pos < n ? end - es->pos : n);
        if (es->feeding) e = pk_feed_data(w, &es->feed, p, take, d);
        p += take;
        n -= take;
        es->pos += take;
        if (!e && es->pos == end) {
            e = end_tensor(w, es, d);
            while (!e && es->ti < es->h.n_tensors && es->h.tensors[es->ti].nbytes == 0) {
                e = start_tensor(ar, w, seen_entry, entry_no, es, d);
                if (!e) e = end_tensor(w, es, d);
            }
            if (!e && es->ti < es->h.n_tensors) e = start_tensor(ar, w, seen_entry, entry_no, es, d);
        }
    }
    return e;
}

static k3_err stream_entry(pk_archive *ar, pk_writer *w, struct archive_entry *en, const char *name,
                           uint32_t *seen_entry, uint32_t entry_no, k3_diag *d)
{
    k3_err e = usable_entry(ar, en, name, d);
    if (e) return e;
    entry_stream es;
    memset(&es, 0, sizeof es);
    es.name = name;
    es.size = (uint64_t)archive_entry_size(en);
    es.hdr_need = 8;
    es.hdr = malloc(8);
    if (!es.hdr) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (;;) {
        const void *buf;
        size_t n;
        la_int64_t off;
        int r = archive_read_data_block(ar->a, &buf, &n, &off);
        if ((e = pk_check_interrupt(d))) break;
        if (r == ARCHIVE_EOF) break;
        if (r != ARCHIVE_OK && r != ARCHIVE_WARN) { e = arc_fail(ar, d, name); break; }
        if ((uint64_t)off != es.pos) {
            e = k3_fail(d, K3_ERR_FORMAT, "'%s': '%s' has a hole at offset %llu", ar->src, name,
                        (unsigned long long)es.pos);
            break;
        }
        if ((e = consume(ar, w, seen_entry, entry_no, &es, buf, n, d))) break;
    }
    if (!e && (es.pos != es.size || !es.parsed || es.ti != es.h.n_tensors))
        e = k3_fail(d, K3_ERR_FORMAT, "'%s': '%s' is truncated: %llu of %llu bytes", ar->src, name,
                    (unsigned long long)es.pos, (unsigned long long)es.size);
    if (es.feeding) pk_feed_free(&es.feed);
    free(es.hdr);
    if (es.parsed) k3_st_header_free(&es.h);
    return e;
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A vision tensor met twice (in two entries) is a duplicate, as any tensor is. */
static k3_err check_skipped(pk_archive *ar, k3_diag *d)
{
    qsort(ar->skipped, ar->n_skipped, sizeof *ar->skipped, cmp_name);
    for (size_t i = 1; i < ar->n_skipped; i++)
        if (!strcmp(ar->skipped[i], ar->skipped[i - 1])) {
            char esc[300];
            return k3_fail(d, K3_ERR_FORMAT, "'%s': tensor '%s' appears twice", ar->src,
                           k3_escape(ar->skipped[i], strlen(ar->skipped[i]), esc, sizeof esc));
        }
    return K3_OK;
}

/* Every tensor the index names must have come from the entry it names. */
static k3_err check_index(pk_archive *ar, pk_writer *w, const uint32_t *seen_entry, char **entry_names, k3_diag *d)
{
    json_error_t je;
    json_t *root = json_loadb(ar->index, ar->index_len, JSON_REJECT_DUPLICATES, &je);
    json_t *map = json_object_get(root, "weight_map");
    k3_err e = K3_OK;
    if (!json_is_object(map)) {
        e = k3_fail(d, K3_ERR_FORMAT, "'%s': %s has no weight_map object", ar->src, K3_ST_INDEX_NAME);
    } else {
        const char *key;
        json_t *v;
        json_object_foreach(map, key, v) {
            const pk_item *it = pk_plan_find(w->p, key);
            if (!it) continue;                        /* vision or unexpected: judged by the shards */
            uint32_t en = seen_entry[it - w->p->items];
            if (!json_is_string(v) || !en || strcmp(entry_names[en - 1], json_string_value(v))) {
                char esc[300];
                e = k3_fail(d, K3_ERR_FORMAT, "'%s': %s places '%s' in '%s', but it %s", ar->src, K3_ST_INDEX_NAME,
                            k3_escape(key, strlen(key), esc, sizeof esc), json_is_string(v) ? json_string_value(v) : "?",
                            en ? "came from another entry" : "is in no entry");
                break;
            }
        }
    }
    json_decref(root);
    return e;
}

k3_err pk_archive_pack(pk_archive *ar, pk_writer *w, k3_diag *d)
{
    uint32_t *seen_entry = calloc(w->p->n_items + 1, sizeof *seen_entry);  /* [n_items] entry no. + 1 */
    char **entry_names = NULL;                                              /* [n_entries] */
    uint32_t n_entries = 0;
    k3_err e = seen_entry ? K3_OK : k3_fail(d, K3_ERR_NOMEM, "out of memory");
    int config_skip = ar->two_pass;       /* the one the first pass read comes again */
    struct archive_entry *en;
    while (!e) {
        const char *name = NULL;
        if (next_entry(ar, &en, &name, &e, d) || e) break;
        if (archive_entry_filetype(en) == AE_IFDIR) continue;
        if (!strcmp(name, "config.json") && config_skip) { config_skip = 0; continue; }
        if (!strcmp(name, "config.json")) { e = k3_fail(d, K3_ERR_FORMAT, "'%s': config.json appears twice", ar->src); break; }
        if (side_file(ar, en, name, &e, d)) continue;
        if (!ends_with(name, ".safetensors")) continue;
        char **nn = realloc(entry_names, (n_entries + 1) * sizeof *nn);
        if (!nn || !(nn[n_entries] = strdup(name))) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); break; }
        entry_names = nn;
        n_entries++;
        for (uint32_t k = 0; k + 1 < n_entries; k++)
            if (!strcmp(entry_names[k], name)) e = k3_fail(d, K3_ERR_FORMAT, "'%s': '%s' appears twice", ar->src, name);
        if (!e) e = stream_entry(ar, w, en, entry_names[n_entries - 1], seen_entry, n_entries, d);
    }
    if (!e) {
        size_t missing = 0, first = 0;
        for (size_t i = 0; i < w->p->n_items; i++)
            if (!seen_entry[i] && !missing++) first = i;
        if (missing)
            e = k3_fail(d, K3_ERR_MODEL, "'%s': %zu tensor%s the config needs %s missing, first '%s'", ar->src, missing,
                        missing == 1 ? "" : "s", missing == 1 ? "is" : "are", w->p->items[first].src_name);
    }
    if (!e) e = check_skipped(ar, d);
    if (!e && ar->index) e = check_index(ar, w, seen_entry, entry_names, d);
    for (uint32_t k = 0; k < n_entries; k++) free(entry_names[k]);
    free(entry_names);
    free(seen_entry);
    return e;
}

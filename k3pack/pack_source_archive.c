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
    /* its SHA-256 for the manifest's "download" (config.json read again by a two-pass archive: once) */
    for (int i = 0; i < ar->n_side; i++)
        if (!strcmp(ar->side[i].name, name)) return K3_OK;
    if (ar->n_side < (int)(sizeof ar->side / sizeof ar->side[0])) {
        k3_mf_srcfile *f = &ar->side[ar->n_side];
        k3_dl_hash h;
        k3_dl_hash_begin(&h, NULL, got);
        k3_dl_hash_update(&h, buf, got);
        k3_dl_hash_end(&h, NULL, name, f->sha256, d);
        if (!(f->name = strdup(name))) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
        f->size = got;
        ar->n_side++;
    }
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
    for (int i = 0; i < ar->n_side; i++) free(ar->side[i].name);
    for (int i = 0; i < PK_MAX_TOK; i++) free(ar->tok_data[i]);
    for (size_t i = 0; i < ar->n_skipped; i++) free(ar->skipped[i]);
    free(ar->skipped);
    memset(ar, 0, sizeof *ar);
}

static k3_err stream_entry(pk_archive *ar, pk_stream *st, struct archive_entry *en, const char *name,
                           uint32_t entry_no, const k3_dl *dl, k3_diag *d)
{
    k3_err e = usable_entry(ar, en, name, d);
    if (e) return e;
    if (dl && dl->sums && !k3_dl_find(dl, name))
        return k3_fail(d, K3_ERR_USAGE, "'%s' has no line for '%s': its download cannot be checked", dl->sums, name);
    pk_entry es;
    pk_entry_begin(&es, name, (uint64_t)archive_entry_size(en), entry_no, k3_dl_find(dl, name));
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
        if ((e = pk_entry_data(st, &es, buf, n, d))) break;
    }
    uint8_t sha[32];
    char path[600];
    snprintf(path, sizeof path, "%s: %s", ar->src, name);
    if (!e && (e = pk_entry_end(st, &es, path, sha, d)) == K3_ERR_CORRUPT) ar->download_bad = 1;
    if (!e) e = pk_add_src_file(st->w, name, es.size, sha, d);
    pk_entry_free(&es);
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

k3_err pk_archive_pack(pk_archive *ar, pk_writer *w, const k3_dl *dl, k3_diag *d)
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
        pk_stream st = {.w = w, .src = ar->src, .seen_entry = seen_entry, .skipped = &ar->skipped,
                        .n_skipped = &ar->n_skipped};
        if (!e) e = stream_entry(ar, &st, en, entry_names[n_entries - 1], n_entries, dl, d);
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
    for (int i = 0; !e && i < ar->n_side; i++) {       /* the side files: checked when SUMS has them */
        const k3_dl_want *want = k3_dl_find(dl, ar->side[i].name);
        if (want && memcmp(want->digest, ar->side[i].sha256, want->kind == K3_DL_SHA256 ? 32 : 20)) {
            char got[65], exp[65];
            k3_dl_hex(ar->side[i].sha256, 32, got);
            k3_dl_hex(want->digest, 32, exp);
            ar->download_bad = 1;
            e = k3_fail(d, K3_ERR_CORRUPT, "'%s: %s': its SHA-256 is %s, but %s says %s: the download is damaged",
                        ar->src, ar->side[i].name, got, want->from, exp);
        }
        if (!e) e = pk_add_src_file(w, ar->side[i].name, ar->side[i].size, ar->side[i].sha256, d);
    }
    if (!e && ar->index) e = check_index(ar, w, seen_entry, entry_names, d);
    for (uint32_t k = 0; k < n_entries; k++) free(entry_names[k]);
    free(entry_names);
    free(seen_entry);
    return e;
}

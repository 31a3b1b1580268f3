/*
 * verify_pack.c - check a k3 pack directory (docs/FORMAT.md) against its
 * manifest: listing, sizes, shard headers and their agreement with the
 * manifest (verify_compare.c), then one sequential pread pass per shard
 * (k3_shard_hash) giving the file hash, every tensor and record hash and the
 * padding check. The checkpoint files of an in-place pack (version 3): verify_sources.c.
 * Output and exit codes: docs/k3verify.md.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "k3_error.h"
#include "k3_file.h"
#include "k3_hash.h"
#include "k3_log.h"
#include "k3_manifest.h"
#include "k3_pack_hash.h"
#include "k3_shard.h"
#include "k3_sys.h"
#include "k3verify.h"
#include "verify_pack.h"

/* ------------------------------------------------------------------ helpers */

/* Drop a leading "'<subject>': " from a library message (the line names it already). */
static const char *strip_subject(const char *msg, const char *subject)
{
    size_t n = strlen(subject);
    if (msg[0] == '\'' && !strncmp(msg + 1, subject, n) && !strncmp(msg + 1 + n, "': ", 3)) return msg + n + 4;
    return msg;
}

static int is_k3pack_leftover(const char *name)
{
    return !strcmp(name, ".k3pack.lock") || !strcmp(name, ".k3pack.journal") || k3_is_tmp_name(name);
}

/* ------------------------------------------------------------------ data pass */

typedef struct prog_ctx {
    pack_ctx *c;
    uint64_t last;
    const char *name;
} prog_ctx;

static void on_progress(void *ctx, uint64_t done)
{
    prog_ctx *pc = ctx;
    uint64_t delta = done - pc->last;
    pc->last = done;
#pragma omp critical(k3v_out)
    {
        pc->c->done += delta;
        char esc[96];
        k3_progress_update(&pc->c->r->progress, pc->c->done, k3_escape(pc->name, strlen(pc->name), esc, sizeof esc));
    }
}

/*
 * The geometry to hash comes from the manifest, which holds the hashes: a
 * header-like struct k3_shard_hash can walk. If the manifest's ranges are not
 * sane (overlap, outside the file) only the whole file is hashed.
 */
static int manifest_geometry(pack_ctx *c, uint32_t si, const k3_shard_header *h, uint64_t size,
                             k3_shard_header *g, k3v_item *it)
{
    const k3_mf_shard *s = &c->m.shards[si];
    memset(g, 0, sizeof *g);
    g->kind = s->kind;
    g->file_size = size;
    g->data_offset = size;                          /* whole file, no ranges */
    if (s->kind == K3_SHARD_TRUNK) {
        uint32_t n = c->n_st[si];
        const uint32_t *idx = c->st[si];
        uint64_t start = h ? h->data_offset : n ? c->m.tensors[idx[0]].offset : size, pos = start;
        for (uint32_t j = 0; j < n; j++) {
            const k3_mf_tensor *t = &c->m.tensors[idx[j]];
            if (t->offset < pos || t->size > size || t->offset > size - t->size) {
                char *esc = k3v_esc(t->name, strlen(t->name));
                k3v_problem *p = k3v_add(it, K3V_MISMATCH, "the manifest puts tensor '%s' at bytes [%llu, +%llu), "
                                         "overlapping the header or another tensor, or past the end of the file", esc,
                                         (unsigned long long)t->offset, (unsigned long long)t->size);
                k3v_set_tensor(p, t->name, strlen(t->name));
                free(esc);
                return 0;
            }
            pos = t->offset + t->size;
        }
        g->entries = k3v_xalloc((size_t)n * sizeof *g->entries + 1);   /* [n] ranges to hash */
        for (uint32_t j = 0; j < n; j++) {
            g->entries[j].offset = c->m.tensors[idx[j]].offset;
            g->entries[j].size = c->m.tensors[idx[j]].size;
            g->entries[j].encoding = (uint8_t)c->m.tensors[idx[j]].encoding;
        }
        g->n_entries = n;
        g->data_offset = start;
        return 1;
    }
    if (c->sx[si] < 0) return 0;
    const k3_mf_experts *x = &c->m.expert_layers[c->sx[si]];
    uint64_t body;
    int sane = x->offset <= size && (x->count <= 1 || x->record_size <= x->stride) &&
               !__builtin_mul_overflow(x->count ? x->count - 1 : 0, x->stride, &body) &&
               !__builtin_add_overflow(body, x->count ? x->record_size : 0, &body) && body <= size - x->offset;
    if (!sane) {
        k3v_add(it, K3V_MISMATCH, "the manifest's %llu records of %llu bytes at stride %llu from offset %llu do not "
                "fit in the file", (unsigned long long)x->count, (unsigned long long)x->record_size,
                (unsigned long long)x->stride, (unsigned long long)x->offset);
        return 0;
    }
    g->data_offset = x->offset;
    g->n_records = x->count;
    g->record_size = x->record_size;
    g->record_stride = x->stride;
    /* the parts (in offset order inside the record: k3_manifest_parse), for the zero
       gaps between them and the E8M0 scales */
    g->entries = k3v_xalloc((size_t)x->n_parts * sizeof *g->entries + 1);   /* [n_parts] */
    for (uint32_t p = 0; p < x->n_parts; p++) {
        g->entries[p].offset = x->parts[p].offset;
        g->entries[p].size = x->parts[p].size;
        g->entries[p].encoding = (uint8_t)x->parts[p].encoding;
    }
    g->n_entries = x->n_parts;
    return 1;
}

static void padding_problem(pack_ctx *c, uint32_t si, const k3_shard_header *g, uint64_t at, k3v_item *it)
{
    char where[512] = "";
    if (g->kind == K3_SHARD_TRUNK) {
        const k3_mf_tensor *prev = NULL;
        for (uint32_t j = 0; j < c->n_st[si]; j++)
            if (c->m.tensors[c->st[si][j]].offset <= at) prev = &c->m.tensors[c->st[si][j]];
        if (prev) {
            char *esc = k3v_esc(prev->name, strlen(prev->name));
            snprintf(where, sizeof where, " (after tensor '%s')", esc);
            free(esc);
        } else {
            snprintf(where, sizeof where, " (before the first tensor)");
        }
    } else if (at >= g->data_offset && g->record_stride) {
        uint64_t rel = (at - g->data_offset) % g->record_stride;
        snprintf(where, sizeof where, " (%s the record of expert %llu of layer %u)",
                 rel < g->record_size ? "between the parts of" : "after",
                 (unsigned long long)((at - g->data_offset) / g->record_stride),
                 c->m.expert_layers[c->sx[si]].layer);
    }
    k3v_problem *p = k3v_add(it, K3V_PADDING, "padding byte at offset %llu is not zero%s", (unsigned long long)at, where);
    p->has_range = 1;
    p->begin = at;
    p->end = at + 1;
}

/* An E8M0 scale byte of 255 (NaN) at file offset at: name the tensor, or the expert and part. */
static void nan_problem(pack_ctx *c, uint32_t si, const k3_shard_header *g, uint64_t at, k3v_item *it)
{
    k3v_problem *p;
    if (g->kind == K3_SHARD_TRUNK) {
        const k3_mf_tensor *t = NULL;
        for (uint32_t j = 0; j < c->n_st[si]; j++)
            if (c->m.tensors[c->st[si][j]].offset <= at) t = &c->m.tensors[c->st[si][j]];
        char *esc = k3v_esc(t ? t->name : "?", t ? strlen(t->name) : 1);
        p = k3v_add(it, K3V_VALUE, "tensor '%s': scale byte at offset %llu is 255, NaN in E8M0", esc,
                    (unsigned long long)at);
        free(esc);
        if (t) k3v_set_tensor(p, t->name, strlen(t->name));
    } else {
        const k3_mf_experts *x = &c->m.expert_layers[c->sx[si]];
        uint64_t e = (at - g->data_offset) / g->record_stride, rel = (at - g->data_offset) % g->record_stride;
        const char *part = "?";
        for (uint32_t k = 0; k < x->n_parts; k++)
            if (rel >= x->parts[k].offset && rel - x->parts[k].offset < x->parts[k].size) part = x->parts[k].name;
        char *esc = k3v_esc(part, strlen(part));
        p = k3v_add(it, K3V_VALUE, "expert %llu of layer %u, part '%s': scale byte at offset %llu is 255, NaN in "
                    "E8M0", (unsigned long long)e, x->layer, esc, (unsigned long long)at);
        free(esc);
        p->expert = (int64_t)e;
        p->layer = x->layer;
    }
    p->has_range = 1;
    p->begin = at;
    p->end = at + 1;
}

static void hash_shard(pack_ctx *c, uint32_t si, int fd, const k3_shard_header *h, uint64_t size, k3v_item *it)
{
    const k3_mf_shard *s = &c->m.shards[si];
    k3_shard_header g;
    int ranges = manifest_geometry(c, si, h, size, &g, it);
    k3_shard_hashes hs;
    k3_diag d;
    size_t bad = 0;
    prog_ctx pc = {c, 0, s->name};
    k3_err e = k3_shard_hash(fd, s->name, &g, c->o->buf_size, 1, on_progress, &pc, &hs, &d);
    if (e == K3_ERR_IO) {                            /* retry once: transient or real? */
        char first[K3_DIAG_MAX];
        memcpy(first, d.msg, sizeof first);
        on_progress(&pc, 0);                         /* (wraps: undo this shard's progress) */
        pc.last = 0;
        e = k3_shard_hash(fd, s->name, &g, c->o->buf_size, 1, on_progress, &pc, &hs, &d);
        if (!e) k3_warn("'%s': read error, but a second attempt succeeded: %s", s->name, first);
    }
    it->bytes = e ? 0 : size;
    if (e) {
        free(g.entries);
        k3v_add(it, K3V_IO, "%s", strip_subject(d.msg, s->name));
        return;
    }
    if (ranges && hs.nan_scale != UINT64_MAX) nan_problem(c, si, &g, hs.nan_scale, it);   /* data, not a hash */
    if (ranges && s->kind == K3_SHARD_TRUNK) {
        for (uint32_t j = 0; j < c->n_st[si]; j++) {
            const k3_mf_tensor *t = &c->m.tensors[c->st[si][j]];
            if (hs.entry[j] == t->hash) continue;
            char *esc = k3v_esc(t->name, strlen(t->name));
            k3v_problem *p = k3v_add(it, K3V_HASH, "tensor '%s' bytes [%llu, %llu): hash mismatch", esc,
                                     (unsigned long long)t->offset, (unsigned long long)(t->offset + t->size));
            free(esc);
            k3v_set_tensor(p, t->name, strlen(t->name));
            p->has_range = 1;
            p->begin = t->offset;
            p->end = t->offset + t->size;
            bad++;
        }
    } else if (ranges) {
        const k3_mf_experts *x = &c->m.expert_layers[c->sx[si]];
        for (uint64_t r = 0; r < x->count; r++) {
            if (hs.record[r] == x->hashes[r]) continue;
            uint64_t b = x->offset + r * x->stride;
            k3v_problem *p = k3v_add(it, K3V_HASH, "expert %llu of layer %u, bytes [%llu, %llu): hash mismatch",
                                     (unsigned long long)r, x->layer, (unsigned long long)b,
                                     (unsigned long long)(b + x->record_size));
            p->expert = (int64_t)r;
            p->layer = x->layer;
            p->has_range = 1;
            p->begin = b;
            p->end = b + x->record_size;
            bad++;
        }
    }
    if (ranges && hs.bad_padding != UINT64_MAX) {
        padding_problem(c, si, &g, hs.bad_padding, it);
        bad++;
    }
    int file_ok = hs.file.lo == s->hash.lo && hs.file.hi == s->hash.hi;
    it->file_hash = file_ok ? "ok" : "mismatch";
    if (!file_ok && !bad) {
        if (k3v_count(it, K3V_HEADER))
            k3v_add(it, K3V_HASH, "file hash mismatch; every %s matches, so the damage is in the header",
                    s->kind == K3_SHARD_TRUNK ? "tensor" : "expert record");
        else if (!ranges)
            k3v_add(it, K3V_HASH, "file hash mismatch");
        else
            k3v_add(it, K3V_HASH, "file hash mismatch, although the header, every %s and the padding match: "
                    "the manifest's xxh3_128 of this shard may be wrong", s->kind == K3_SHARD_TRUNK ? "tensor" : "record");
    } else if (file_ok && bad) {
        k3v_add(it, K3V_MISMATCH, "the file hash matches, so the manifest's %s hashes are wrong, not the data",
                s->kind == K3_SHARD_TRUNK ? "tensor" : "record");
    }
    free(g.entries);
    k3_shard_hashes_free(&hs);
}

/* ------------------------------------------------------------------ one shard, one file */

/* Open NAME in the pack and check it is a regular file of the manifest's size
   (*st: what fstat said); on any problem, report it in it and return -1. */
static int open_sized(pack_ctx *c, const char *name, uint64_t want, k3v_item *it, struct stat *st_out)
{
    char path[4096];
    k3_diag d;
    if (k3_path_join(path, sizeof path, c->dir, name, &d)) {
        k3v_add(it, K3V_IO, "%s", d.msg);
        return -1;
    }
    int fd = k3_open_read(path);
    if (fd < 0) {
        if (errno == ENOENT) k3v_add(it, K3V_MISSING, "missing");
        else k3v_add(it, K3V_IO, "cannot open: %s", strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        k3v_add(it, K3V_TYPE, "not a regular file");
    } else if ((uint64_t)st.st_size != want) {
        k3v_add(it, K3V_SIZE, "size %llu, expected %llu: %s", (unsigned long long)st.st_size, (unsigned long long)want,
                (uint64_t)st.st_size < want ? "truncated" : "extended");
    } else {
        *st_out = st;
        return fd;
    }
    close(fd);
    return -1;
}

/*
 * After NAME was read through fd (fstat st0 when opened): did it change under
 * k3verify? Its path must still name the same file, of the same size and times.
 * If not, what the read found says nothing about the file now: one I/O problem
 * replaces every other (exit 3: verify again), naming what happened.
 */
void k3v_check_unchanged(pack_ctx *c, const char *name, int fd, const struct stat *st0, k3v_item *it)
{
    struct stat now, cur;
    char path[4096];
    const char *why = NULL;
    int have_path = k3_path_join(path, sizeof path, c->dir, name, NULL) == K3_OK;
    if (have_path && stat(path, &cur) != 0)
        why = errno == ENOENT ? "it was deleted" : "it can no longer be opened";
    else if (have_path && (cur.st_dev != st0->st_dev || cur.st_ino != st0->st_ino))
        why = "it was replaced by another file";
    else if (fstat(fd, &now) != 0 || now.st_size != st0->st_size)
        why = "it was truncated or extended";
    else if (now.st_mtim.tv_sec != st0->st_mtim.tv_sec || now.st_mtim.tv_nsec != st0->st_mtim.tv_nsec ||
             now.st_ctim.tv_sec != st0->st_ctim.tv_sec || now.st_ctim.tv_nsec != st0->st_ctim.tv_nsec)
        why = "it was modified";
    if (!why) return;
    const char *type = it->type;
    k3v_item_free(it);
    k3v_item_init(it, type, name);
    k3v_add(it, K3V_IO, "changed while k3verify was reading it: %s; verify again", why);
}

/* Check shard si; listing_only: exists, is a regular file of the manifest's size (a
   shard outside the --subset), nothing is read. */
static void check_shard(pack_ctx *c, uint32_t si, int listing_only, k3v_item *it)
{
    const k3_mf_shard *s = &c->m.shards[si];
    k3v_item_init(it, "shard", s->name);
    struct stat st0;
    int fd = open_sized(c, s->name, s->size, it, &st0);
    if (fd < 0) return;
    if (listing_only) {
        close(fd);
        return;
    }
    k3_diag d;
    k3_shard_header h;
    k3_err e = k3_shard_read_header(fd, s->name, &h, &d);
    if (e == K3_ERR_IO || e == K3_ERR_NOMEM) k3v_add(it, K3V_IO, "cannot read the header: %s", d.msg);
    else if (e) k3v_add(it, K3V_HEADER, "header: %s", strip_subject(d.msg, s->name));
    else k3v_compare_header(c, si, &h, it);
    if (!c->o->quick && e != K3_ERR_IO) hash_shard(c, si, fd, e ? NULL : &h, s->size, it);
    if (!e) k3_shard_header_free(&h);
    k3v_check_unchanged(c, s->name, fd, &st0, it);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

static void check_file(pack_ctx *c, const k3_mf_file *f, k3v_item *it)
{
    k3v_item_init(it, "file", f->name);
    struct stat st0;
    int fd = open_sized(c, f->name, f->size, it, &st0);
    if (fd < 0) return;
    if (!c->o->quick) {
        k3_diag d;
        size_t cap = 1u << 20;
        uint8_t *buf = k3v_xalloc(cap);             /* [cap] read buffer */
        k3_hasher *hs = k3_hasher_new();
        k3_err e = hs ? K3_OK : k3_fail(&d, K3_ERR_NOMEM, "out of memory");
        for (uint64_t pos = 0; !e && pos < f->size;) {
            size_t n = f->size - pos < cap ? (size_t)(f->size - pos) : cap;
            if (!(e = k3_pread_full(fd, buf, n, pos, f->name, &d))) k3_hasher_update(hs, buf, n);
            pos += n;
        }
        if (e) {
            k3v_add(it, K3V_IO, "%s", d.msg);
        } else {
            k3_h128 got = k3_hasher_digest(hs);
            it->bytes = f->size;
            it->file_hash = got.lo == f->hash.lo && got.hi == f->hash.hi ? "ok" : "mismatch";
            if (strcmp(it->file_hash, "ok")) {
                char x[33], y[33];
                k3_hex128(got, x);
                k3_hex128(f->hash, y);
                k3v_add(it, K3V_HASH, "hash mismatch (xxh3_128 %s, the manifest says %s)", x, y);
            }
        }
        k3_hasher_free(hs);
        free(buf);
    }
    k3v_check_unchanged(c, f->name, fd, &st0, it);
    close(fd);
}

/* ------------------------------------------------------------------ the pack */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static const k3_manifest *g_sort_m;   /* qsort context (single-threaded setup) */
static int cmp_tensor_offset(const void *a, const void *b)
{
    uint64_t x = g_sort_m->tensors[*(const uint32_t *)a].offset, y = g_sort_m->tensors[*(const uint32_t *)b].offset;
    return x < y ? -1 : x > y;
}

static void index_manifest(pack_ctx *c)
{
    const k3_manifest *m = &c->m;
    c->st = k3v_xalloc((m->n_shards + 1) * sizeof *c->st);       /* [n_shards] */
    c->n_st = k3v_xalloc((m->n_shards + 1) * sizeof *c->n_st);   /* [n_shards] */
    c->sx = k3v_xalloc((m->n_shards + 1) * sizeof *c->sx);       /* [n_shards] */
    for (uint32_t i = 0; i < m->n_tensors; i++) c->n_st[m->tensors[i].shard]++;
    for (uint32_t s = 0; s < m->n_shards; s++) {
        c->st[s] = k3v_xalloc((c->n_st[s] + 1) * sizeof **c->st);
        c->n_st[s] = 0;
        c->sx[s] = -1;
    }
    for (uint32_t i = 0; i < m->n_tensors; i++) c->st[m->tensors[i].shard][c->n_st[m->tensors[i].shard]++] = i;
    g_sort_m = m;
    for (uint32_t s = 0; s < m->n_shards; s++) qsort(c->st[s], c->n_st[s], sizeof **c->st, cmp_tensor_offset);
    for (uint32_t i = 0; i < m->n_expert_layers; i++) {
        uint32_t s = m->expert_layers[i].shard;
        if (m->expert_layers[i].in_place || s >= m->n_shards) continue;   /* in the checkpoint (version 3) */
        c->sx[s] = c->sx[s] == -1 ? (int32_t)i : -2;
    }
}

static int listed(const k3_manifest *m, const char *name)
{
    if (!strcmp(name, K3_MANIFEST_NAME)) return 1;
    if (m && m->n_sources && !strcmp(name, K3_CHECKPOINT_LINK)) return 1;   /* version 3 (FORMAT.md 10) */
    if (m && k3_manifest_shard_index(m, name) >= 0) return 1;
    for (uint32_t i = 0; m && i < m->n_files; i++)
        if (!strcmp(m->files[i].name, name)) return 1;
    for (uint32_t i = 0; m && i < m->n_sources; i++)   /* the pack's experts-copied.safetensors */
        if (m->sources[i].in_pack && !strcmp(m->sources[i].name, name)) return 1;
    return 0;
}

/* Files the manifest does not list; without a manifest only k3pack's leftovers. */
static void check_extras(const k3_manifest *m, char **names, size_t n, k3v_report *r)
{
    for (size_t i = 0; i < n; i++) {
        if (listed(m, names[i])) continue;
        k3v_item it;
        k3v_item_init(&it, "extra", names[i]);
        if (!strcmp(names[i], ".k3pack.lock"))
            k3v_add(&it, K3V_UNFINISHED, "unfinished k3pack run: k3pack's lock file (a k3pack is running, or was interrupted)");
        else if (is_k3pack_leftover(names[i]))
            k3v_add(&it, K3V_UNFINISHED, "unfinished k3pack run: leftover of an interrupted k3pack (rerun k3pack to finish)");
        else if (m)
            k3v_add(&it, K3V_UNLISTED, "not listed in the manifest");
        if (k3v_failed(&it)) k3v_report_item(r, &it);
        k3v_item_free(&it);
    }
}

int k3v_verify_pack(const char *dir, const k3v_pack_opts *o, k3v_report *r)
{
    pack_ctx c;
    memset(&c, 0, sizeof c);
    c.dir = dir;
    c.o = o;
    c.r = r;
    char *edir = k3v_esc(dir, strlen(dir));
    DIR *dh = opendir(dir);
    if (!dh) {
        k3_error("cannot open pack directory '%s': %s", edir, strerror(errno));
        free(edir);
        return K3_EXIT_IO;
    }
    size_t n_names = 0, cap = 64;
    char **names = k3v_xalloc(cap * sizeof *names);   /* [cap] directory entries */
    struct dirent *de;
    errno = 0;
    while ((de = readdir(dh))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        if (n_names == cap) {
            char **nn = realloc(names, 2 * cap * sizeof *names);
            if (!nn) { k3_error("out of memory"); exit(K3_EXIT_INTERNAL); }
            names = nn;
            cap *= 2;
        }
        names[n_names++] = k3v_fmt("%s", de->d_name);
    }
    int rd_err = errno;
    closedir(dh);
    if (rd_err) {
        k3_error("cannot list pack directory '%s': %s", edir, strerror(rd_err));
        free(edir);
        return K3_EXIT_IO;
    }
    qsort(names, n_names, sizeof *names, cmp_str);

    k3v_item mi;
    k3v_item_init(&mi, "manifest", K3_MANIFEST_NAME);
    char mpath[4096];
    k3_diag d;
    int have_m = 0;
    struct stat st;
    if (k3_path_join(mpath, sizeof mpath, dir, K3_MANIFEST_NAME, &d)) {
        k3v_add(&mi, K3V_IO, "%s", d.msg);
    } else if (stat(mpath, &st) != 0 && errno == ENOENT) {
        k3v_add(&mi, K3V_MISSING, "missing: an unfinished pack or not a pack (k3pack writes manifest.json last; "
                "rerun k3pack to finish)");
    } else {
        k3_err e = k3_manifest_load(dir, &c.m, &d);
        if (e == K3_ERR_IO || e == K3_ERR_NOMEM || e == K3_ERR_NOT_FOUND) k3v_add(&mi, K3V_IO, "%s", d.msg);
        else if (e) k3v_add(&mi, K3V_MANIFEST, "%s", strip_subject(d.msg, mpath));
        else have_m = 1;
        if (have_m) k3v_check_complete(&c.m, &mi);
        char *text;
        size_t len;
        if (have_m && k3_read_file(mpath, K3_MANIFEST_MAX, &text, &len, NULL) == K3_OK) {
            k3_hex128(k3_xxh3_128(text, len), r->manifest_hash);
            free(text);
        }
    }
    k3v_report_item(r, &mi);
    k3v_item_free(&mi);

    uint32_t n_sel = 0, n_src_sel = 0;
    if (have_m) {
        index_manifest(&c);
        uint8_t *sel = k3v_xalloc(c.m.n_shards + 1);   /* [n_shards] 1 = in the --subset: read it */
        for (uint32_t i = 0; i < c.m.n_shards; i++)
            if (!o->subset_t || i % o->subset_t == o->subset_n - 1) {
                sel[i] = 1;
                n_sel++;
                c.total += c.m.shards[i].size;
            }
        for (uint32_t i = 0; i < c.m.n_files; i++) c.total += c.m.files[i].size;
        for (uint32_t j = 0; j < c.m.n_sources; j++) c.total += k3v_source_bytes(&c, j);
        r->shards.total = c.m.n_shards;
        r->files.total = c.m.n_files;
        r->sources.total = c.m.n_sources;
        if (!o->quick) k3_progress_start(&r->progress, "verifying", c.total);

        /* every shard in manifest order; outside the subset only the listing (the
           file is there with its size), shown only when that fails */
        uint32_t n_sh = c.m.n_shards, next = 0;
        k3v_item *items = k3v_xalloc((n_sh + 1) * sizeof *items);   /* [n_shards] results, printed in order */
        uint8_t *ready = k3v_xalloc(n_sh + 1);
        int threads = o->threads > 0 ? o->threads : 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
        for (long k = 0; k < (long)n_sh; k++) {
            check_shard(&c, (uint32_t)k, !sel[k], &items[k]);
#pragma omp critical(k3v_out)
            {
                ready[k] = 1;
                while (next < n_sh && ready[next]) {
                    if (sel[next] || k3v_failed(&items[next])) k3v_report_item(r, &items[next]);
                    k3v_item_free(&items[next]);
                    next++;
                }
            }
        }
        free(items);
        free(ready);
        free(sel);
        for (uint32_t i = 0; i < c.m.n_files; i++) {
            k3v_item it;
            check_file(&c, &c.m.files[i], &it);
            c.done += it.bytes;
            k3_progress_update(&r->progress, c.done, c.m.files[i].name);
            k3v_report_item(r, &it);
            k3v_item_free(&it);
        }
        if (c.m.n_sources) n_src_sel = k3v_check_sources(&c);   /* version 3: records in place */
        k3_progress_end(&r->progress);
    }
    check_extras(have_m ? &c.m : NULL, names, n_names, r);
    k3v_pack_summary(r, o, n_sel, have_m ? c.m.n_shards : 0, have_m ? c.m.n_files : 0, have_m ? c.m.n_sources : 0,
                     n_src_sel, have_m);

    for (size_t i = 0; i < n_names; i++) free(names[i]);
    free(names);
    if (have_m) {
        for (uint32_t s = 0; s < c.m.n_shards; s++) free(c.st[s]);
        free(c.st);
        free(c.n_st);
        free(c.sx);
        k3_manifest_free(&c.m);
    }
    free(edir);
    return k3v_exit_code(r);
}

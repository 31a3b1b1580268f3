/*
 * verify_sources.c - the checkpoint files of an in-place pack (FORMAT.md 10, version 3): the
 * `checkpoint` link (one item: it leads to a directory), then one item per file of the
 * manifest's checkpoint_files, in manifest order, as the shards: checkpoint/NAME, or NAME for the
 * pack's own experts-copied.safetensors ("in_pack"); it is there, a regular file of the size
 * k3pack saw, its safetensors header (8 + N bytes) hashes to the manifest's XXH3-128, and unless
 * --quick (and in the --subset) every in-place record it holds is read once in offset order, its
 * XXH3-64 compared and its E8M0 scale bytes checked (255 is NaN).
 *
 * Exit codes as for the shards, except that a link or checkpoint file that cannot be found is
 * I/O (exit 3): the pack itself is whole, the link points at the wrong place, and the message
 * says how to fix it (ln -sfn). A file of another size or header, or a record that no longer
 * matches, is damage (exit 1): the checkpoint changed after packing. The pack's own copy file is
 * a file of the pack: missing is damage, as for a shard.
 */
#define _GNU_SOURCE
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
#include "k3verify.h"
#include "verify_pack.h"

/* One in-place record of a checkpoint file. */
typedef struct src_rec {
    uint64_t off;           /* its first byte in the file */
    uint32_t xl;            /* expert_layers index */
    uint32_t e;             /* expert */
} src_rec;

static int cmp_rec(const void *a, const void *b)
{
    const src_rec *x = a, *y = b;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    if (x->xl != y->xl) return x->xl < y->xl ? -1 : 1;
    return x->e < y->e ? -1 : x->e > y->e;
}

/* The in-place records of checkpoint file j in offset order; *n their count. */
static src_rec *file_records(const k3_manifest *m, uint32_t j, size_t *n)
{
    size_t k = 0;
    for (uint32_t i = 0; i < m->n_expert_layers; i++) {
        const k3_mf_experts *x = &m->expert_layers[i];
        for (uint64_t e = 0; x->in_place && e < x->count; e++) k += x->rec_file[e] == j;
    }
    src_rec *rs = k3v_xalloc((k + 1) * sizeof *rs);             /* [k] */
    k = 0;
    for (uint32_t i = 0; i < m->n_expert_layers; i++) {
        const k3_mf_experts *x = &m->expert_layers[i];
        for (uint64_t e = 0; x->in_place && e < x->count; e++)
            if (x->rec_file[e] == j) rs[k++] = (src_rec){x->rec_off[e], i, (uint32_t)e};
    }
    qsort(rs, k, sizeof *rs, cmp_rec);
    *n = k;
    return rs;
}

int k3v_source_selected(const pack_ctx *c, uint32_t j)
{
    return !c->o->subset_t || j % c->o->subset_t == c->o->subset_n - 1;
}

uint64_t k3v_source_bytes(const pack_ctx *c, uint32_t j)
{
    const k3_manifest *m = &c->m;
    if (c->o->quick || !k3v_source_selected(c, j)) return 0;
    uint64_t n = m->sources[j].header_size;
    for (uint32_t i = 0; i < m->n_expert_layers; i++) {
        const k3_mf_experts *x = &m->expert_layers[i];
        for (uint64_t e = 0; x->in_place && e < x->count; e++)
            if (x->rec_file[e] == j) n += x->record_size;
    }
    return n;
}

static void progress(pack_ctx *c, uint64_t delta, const char *name)
{
#pragma omp critical(k3v_out)
    {
        c->done += delta;
        char esc[96];
        k3_progress_update(&c->r->progress, c->done, k3_escape(name, strlen(name), esc, sizeof esc));
    }
}

/* ------------------------------------------------------------------ the link */

/* PACK/checkpoint: 1 when it leads to a directory; else the problem, with the fix, in it. */
static int check_link(pack_ctx *c, k3v_item *it)
{
    k3v_item_init(it, "link", K3_CHECKPOINT_LINK);
    char path[4096], target[4096];
    k3_diag d;
    if (k3_path_join(path, sizeof path, c->dir, K3_CHECKPOINT_LINK, &d)) {
        k3v_add(it, K3V_IO, "%s", d.msg);
        return 0;
    }
    char *epath = k3v_esc(path, strlen(path));
    struct stat st;
    int ok = 0;
    if (lstat(path, &st) != 0) {
        int err = errno;
        if (err == ENOENT)
            k3v_add(it, K3V_IO, "missing: this pack reads expert records in place from the checkpoint k3pack read, "
                    "through this link to its directory; make it: ln -sfn DIR '%s'", epath);
        else
            k3v_add(it, K3V_IO, "cannot read the link: %s", strerror(err));
        free(epath);
        return 0;
    }
    int is_link = S_ISLNK(st.st_mode);
    if (is_link) {
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n >= 0) {
            target[n] = '\0';
            it->target = k3v_fmt("%s", target);
        }
    }
    int st_ok = stat(path, &st) == 0, err = errno;
    char *etarget = k3v_esc(it->target ? it->target : "?", strlen(it->target ? it->target : "?"));
    if (!st_ok) {
        if (err == ENOENT || err == ENOTDIR || err == ELOOP)
            k3v_add(it, K3V_IO, "dangling: it points to '%s', which %s; if the checkpoint moved, point the link at "
                    "it: ln -sfn DIR '%s'", etarget, err == ELOOP ? "is a loop of links" : "does not exist", epath);
        else
            k3v_add(it, K3V_IO, "cannot open: %s; the link points to '%s'", strerror(err), etarget);
    } else if (!S_ISDIR(st.st_mode)) {
        if (is_link)
            k3v_add(it, K3V_IO, "it points to '%s', which is not a directory; point the link at the checkpoint's "
                    "directory: ln -sfn DIR '%s'", etarget, epath);
        else
            k3v_add(it, K3V_IO, "not a link to the checkpoint's directory; make it one: ln -sfn DIR '%s'", epath);
    } else {
        ok = 1;                       /* a link to a directory, or a directory in its place */
    }
    free(etarget);
    free(epath);
    return ok;
}

/* ------------------------------------------------------------------ one file */

/* The first E8M0 scale byte of 255 in buf = bytes [pos, pos + len) of a record of layer x, or NULL. */
static const uint8_t *nan_scale(const k3_mf_experts *x, uint64_t pos, const uint8_t *buf, size_t len,
                                const char **part)
{
    for (uint32_t p = 0; p < x->n_parts; p++) {
        const k3_mf_part *pt = &x->parts[p];
        if (pt->encoding != K3_ENC_E8M0) continue;
        uint64_t lo = pt->offset > pos ? pt->offset : pos, hi = pt->offset + pt->size;
        if (hi > pos + len) hi = pos + len;
        if (lo >= hi) continue;
        const uint8_t *hit = memchr(buf + (lo - pos), 0xFF, (size_t)(hi - lo));
        if (hit) {
            *part = pt->name;
            return hit;
        }
    }
    return NULL;
}

/* Read every in-place record of file j once, in offset order: its XXH3-64, its E8M0 scales. */
static void hash_records(pack_ctx *c, uint32_t j, int fd, const char *rel, k3v_item *it)
{
    const char *changed = c->m.sources[j].in_pack ? "" : " (the checkpoint file changed after packing)";
    size_t n;
    src_rec *rs = file_records(&c->m, j, &n);
    size_t cap = c->o->buf_size;
    uint8_t *buf = k3v_xalloc(cap);                             /* [cap] read buffer */
    k3_hasher64 *h = k3_hasher64_new();
    if (!h) {
        k3_error("out of memory");
        exit(K3_EXIT_INTERNAL);
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    int nan_found = 0;
    k3_diag d;
    for (size_t k = 0; k < n; k++) {
        const k3_mf_experts *x = &c->m.expert_layers[rs[k].xl];
        uint64_t off = rs[k].off, e = rs[k].e;
        k3_hasher64_reset(h);
        for (uint64_t pos = 0; pos < x->record_size;) {
            size_t len = x->record_size - pos < cap ? (size_t)(x->record_size - pos) : cap;
            k3_err err = k3_pread_full(fd, buf, len, off + pos, rel, &d);
            if (err == K3_ERR_IO) {                              /* retry once: transient or real? */
                char first[K3_DIAG_MAX];
                memcpy(first, d.msg, sizeof first);
                if (!(err = k3_pread_full(fd, buf, len, off + pos, rel, &d)))
                    k3_warn("'%s': read error, but a second attempt succeeded: %s", rel, first);
            }
            if (err) {
                k3v_add(it, K3V_IO, "expert %llu of layer %u at offset %llu: %s", (unsigned long long)e, x->layer,
                        (unsigned long long)off, d.msg);
                goto out;
            }
            k3_hasher64_update(h, buf, len);
            const char *part = NULL;
            const uint8_t *hit = nan_found ? NULL : nan_scale(x, pos, buf, len, &part);
            if (hit) {
                uint64_t at = off + pos + (uint64_t)(hit - buf);
                char *esc = k3v_esc(part, strlen(part));
                k3v_problem *p = k3v_add(it, K3V_VALUE, "expert %llu of layer %u, part '%s': scale byte at offset %llu "
                                         "is 255, NaN in E8M0", (unsigned long long)e, x->layer, esc,
                                         (unsigned long long)at);
                free(esc);
                p->expert = (int64_t)e;
                p->layer = x->layer;
                p->has_range = 1;
                p->begin = at;
                p->end = at + 1;
                nan_found = 1;
            }
            pos += len;
            it->bytes += len;
            progress(c, len, rel);
        }
        if (k3_hasher64_digest(h) != x->hashes[e]) {
            k3v_problem *p = k3v_add(it, K3V_HASH, "expert %llu of layer %u, bytes [%llu, %llu): hash mismatch%s",
                                     (unsigned long long)e, x->layer, (unsigned long long)off,
                                     (unsigned long long)(off + x->record_size), changed);
            p->expert = (int64_t)e;
            p->layer = x->layer;
            p->has_range = 1;
            p->begin = off;
            p->end = off + x->record_size;
        }
    }
out:
    k3_hasher64_free(h);
    free(buf);
    free(rs);
}

/* Check checkpoint file j; hash: read its records too (not --quick, in the --subset). */
static void check_source(pack_ctx *c, uint32_t j, int hash, k3v_item *it)
{
    const k3_mf_source *f = &c->m.sources[j];
    char rel[4096], path[4096];
    if (f->in_pack) snprintf(rel, sizeof rel, "%s", f->name);   /* the pack's experts-copied.safetensors */
    else snprintf(rel, sizeof rel, "%s/%s", K3_CHECKPOINT_LINK, f->name);
    const char *changed = f->in_pack ? "" : "; it is another file, or it changed after packing";
    k3v_item_init(it, "checkpoint_file", rel);
    k3_diag d;
    if (k3_path_join(path, sizeof path, c->dir, rel, &d)) {
        k3v_add(it, K3V_IO, "%s", d.msg);
        return;
    }
    int fd = k3_open_read(path), err = errno;
    if (fd < 0 && f->in_pack) {                                 /* a file of the pack, as a shard */
        if (err == ENOENT) k3v_add(it, K3V_MISSING, "missing");
        else k3v_add(it, K3V_IO, "cannot open: %s", strerror(err));
        return;
    }
    if (fd < 0) {
        char *elink = k3v_fmt("%s/%s", c->dir, K3_CHECKPOINT_LINK), *esc = k3v_esc(elink, strlen(elink));
        if (err == ENOENT)
            k3v_add(it, K3V_IO, "missing: not in the directory the link points to; if the checkpoint moved, point the "
                    "link at it: ln -sfn DIR '%s'", esc);
        else
            k3v_add(it, K3V_IO, "cannot open: %s", strerror(err));
        free(esc);
        free(elink);
        return;
    }
    struct stat st0;
    if (fstat(fd, &st0) != 0 || !S_ISREG(st0.st_mode)) {
        k3v_add(it, K3V_TYPE, "not a regular file");
        close(fd);
        return;
    }
    if ((uint64_t)st0.st_size != f->size) {
        k3v_add(it, K3V_SIZE, "size %llu, expected %llu: %s%s", (unsigned long long)st0.st_size,
                (unsigned long long)f->size, (uint64_t)st0.st_size < f->size ? "truncated" : "extended", changed);
        close(fd);
        return;
    }
    int data = hash && !c->o->quick;                           /* the data pass reads its records */
    uint8_t *hdr = k3v_xalloc((size_t)f->header_size);        /* [header_size] its safetensors header */
    k3_err e = k3_pread_full(fd, hdr, (size_t)f->header_size, 0, rel, &d);
    if (e) {
        k3v_add(it, K3V_IO, "cannot read the safetensors header: %s", d.msg);
    } else {
        k3_h128 got = k3_xxh3_128(hdr, (size_t)f->header_size);
        if (got.lo != f->header_hash.lo || got.hi != f->header_hash.hi) {
            char x[33], y[33];
            k3_hex128(got, x);
            k3_hex128(f->header_hash, y);
            k3v_add(it, K3V_HASH, "safetensors header, bytes [0, %llu): hash mismatch (xxh3_128 %s, the manifest says "
                    "%s)%s", (unsigned long long)f->header_size, x, y, changed);
        }
        if (data) {
            it->bytes += f->header_size;
            progress(c, f->header_size, rel);
        }
    }
    free(hdr);
    if (!e && data) hash_records(c, j, fd, rel, it);
    k3v_check_unchanged(c, rel, fd, &st0, it);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* ------------------------------------------------------------------ all of them */

uint32_t k3v_check_sources(pack_ctx *c)
{
    const k3_manifest *m = &c->m;
    uint32_t n = m->n_sources, next = 0, n_sel = 0, n_ck = 0;
    for (uint32_t j = 0; j < n; j++) n_ck += !m->sources[j].in_pack;
    int link_ok = 1;
    if (n_ck) {
        k3v_item link;
        link_ok = check_link(c, &link);
        k3v_report_item(c->r, &link);
        k3v_item_free(&link);
    }
    /* without the link every checkpoint file would fail the same way (the link's line says it):
       only the pack's own copy file is checked then */
    k3v_item *items = k3v_xalloc((n + 1) * sizeof *items);     /* [n_sources] results, printed in order */
    uint8_t *ready = k3v_xalloc(n + 1);                         /* [n_sources] */
    uint8_t *sel = k3v_xalloc(n + 1);                           /* [n_sources] 1 = in the --subset */
    uint8_t *skip = k3v_xalloc(n + 1);                          /* [n_sources] 1 = not checked (no link) */
    for (uint32_t j = 0; j < n; j++) {
        skip[j] = !link_ok && !m->sources[j].in_pack;
        sel[j] = (uint8_t)k3v_source_selected(c, j);
        n_sel += sel[j] && !skip[j];
    }
    int threads = c->o->threads > 0 ? c->o->threads : 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
    for (long k = 0; k < (long)n; k++) {
        if (!skip[k]) check_source(c, (uint32_t)k, sel[k], &items[k]);
#pragma omp critical(k3v_out)
        {
            ready[k] = 1;
            while (next < n && ready[next]) {   /* outside the subset: a line only when it fails */
                if (!skip[next] && (sel[next] || k3v_failed(&items[next]))) k3v_report_item(c->r, &items[next]);
                if (!skip[next]) k3v_item_free(&items[next]);
                next++;
            }
        }
    }
    free(skip);
    free(items);
    free(ready);
    free(sel);
    return n_sel;
}

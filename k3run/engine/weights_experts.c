/*
 * weights_experts.c - the routed experts (weights.h): every record resident,
 * or a fixed-slot cache keyed by (layer, expert).
 *
 * The cache: slots of the largest record stride, 4 KiB-aligned, so a miss is
 * one O_DIRECT pread of a whole record (buffered + POSIX_FADV_DONTNEED where
 * the file system refuses O_DIRECT). A layer's misses are queued together on
 * the reader threads; k3w_experts_next hands out the hits first, then each
 * miss as its read and hash check complete. Eviction: least frequently used
 * (victim() below; docs/PERFORMANCE.md has the policies measured on medium's
 * routing).
 *
 * Lookahead: k3w_experts_prefetch queues the reads of experts a layer is
 * predicted to ask for, before its acquire. Such a slot is flying until its
 * read is waited for (never a victim meanwhile), and K3_PF_AHEAD until an
 * acquire asks for it (used) or it is evicted first (wasted). An acquire that
 * asks for a flying slot hands it out after the cached ones and before its
 * own misses, waiting for it then; the reads ahead for other layers land at
 * its start (land_older), so the cache never depends on the disk's timing.
 */
#define _GNU_SOURCE
#include "weights_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist.h"
#include "k3_file.h"
#include "k3_hash.h"
#include "k3_sys.h"

/* Where record r's bytes start in the memory it is read into: a record read in place starts
   where it starts in its 4 KiB page of the checkpoint (the read covers whole pages). */
static uint64_t rec_lead(const expert_layer *el, uint64_t r) { return el->rec_off ? el->rec_off[r] & 4095 : 0; }

/* The read of record r of el into dst (the resident load, or a cache miss): the whole stride
   with O_DIRECT where it can (in place: the pages that cover the record), its XXH3-64 checked
   (verify), and its MXFP4 scale parts scanned for 0xFF (NaN in E8M0). */
static void record_job(const expert_layer *el, uint64_t r, uint8_t *dst, int verify, k3io_job *j)
{
    j->fd = el->fd;
    j->fd_direct = el->fd_direct;
    j->off = el->offset + r * el->stride;
    j->size = el->record_size;
    j->span = el->stride;
    j->lead = 0;
    j->bad_why = NULL;
    if (el->rec_off) {
        uint32_t f = el->rec_file[r];
        j->fd = el->src_fd[f];
        j->fd_direct = el->src_fd_direct[f];
        j->off = el->rec_off[r];
        j->lead = rec_lead(el, r);
        j->span = (j->lead + j->size + 4095) / 4096 * 4096;
        j->bad_why = "XXH3-64 does not match the manifest: the checkpoint file changed since k3pack read it "
                     "(k3verify checks every record)";
    }
    j->dst = dst;
    j->verify = verify;
    j->hash = el->hashes[r];
    j->n_scan = 0;
    for (int mi = 0; el->enc == K3_ENC_MXFP4 && mi < 3; mi++) {
        j->scan_off[j->n_scan] = el->off[mi][1];
        j->scan_len[j->n_scan++] = (uint64_t)el->rows[mi] * el->cols[mi] / 32;
    }
}

/* The one message for a record that cannot be used: shard (or checkpoint file), layer, expert,
   offset, why. */
static k3_err record_fail(const expert_layer *el, uint32_t layer, uint64_t e, int bad_hash, const char *why,
                          k3_diag *d)
{
    return k3_fail(d, bad_hash ? K3_ERR_CORRUPT : K3_ERR_IO,
                   "'%s': layer %u expert %" PRIu64 " (record at offset %" PRIu64 "): %s",
                   el->rec_off ? el->src_path[el->rec_file[e]] : el->path, layer, e,
                   el->rec_off ? el->rec_off[e] : el->offset + e * el->stride, why);
}

static void close_sources(k3_weights *w)
{
    for (uint32_t i = 0; i < w->n_src; i++) {
        if (w->src_fd[i] >= 0) close(w->src_fd[i]);
        if (w->src_fd_direct[i] >= 0) close(w->src_fd_direct[i]);
        w->src_fd[i] = w->src_fd_direct[i] = -1;
    }
}

/*
 * An in-place pack (FORMAT.md 10): open PACK/checkpoint/NAME for every checkpoint file the
 * manifest names, and check that it is the file k3pack read: its size, and the XXH3-128 of its
 * safetensors header. A file that is missing is an I/O error (exit 3); one that is another
 * file, or changed, is damage (exit 1). Its records are hash-checked as they are read.
 */
static k3_err open_sources(k3_weights *w, k3_diag *d)
{
    const k3_manifest *m = &w->mf;
    w->n_src = m->n_sources;
    w->src_fd = malloc((m->n_sources + 1) * sizeof *w->src_fd);
    w->src_fd_direct = malloc((m->n_sources + 1) * sizeof *w->src_fd_direct);
    w->src_path = calloc(m->n_sources + 1, sizeof *w->src_path);
    if (!w->src_fd || !w->src_fd_direct || !w->src_path) { w->n_src = 0; return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
    for (uint32_t i = 0; i < m->n_sources; i++) w->src_fd[i] = w->src_fd_direct[i] = -1;
    uint8_t *hdr = NULL;                               /* [header_size] one file's safetensors header */
    k3_err e = K3_OK;
    for (uint32_t i = 0; i < m->n_sources && !e; i++) {
        const k3_mf_source *f = &m->sources[i];
        char link[4096], path[4096];
        if ((e = k3_path_join(link, sizeof link, w->dir, K3_CHECKPOINT_LINK, d)) ||
            (e = k3_path_join(path, sizeof path, f->in_pack ? w->dir : link, f->name, d)))
            break;
        if (!(w->src_path[i] = strdup(path))) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); break; }
        struct stat st;
        w->src_fd[i] = open(path, O_RDONLY | O_CLOEXEC);
        if (w->src_fd[i] < 0 && f->in_pack) {
            e = k3_fail(d, K3_ERR_IO, "cannot open '%s': %s (a file of the pack: the expert records k3pack "
                        "copied; make the pack again)", path, strerror(errno));
            break;
        }
        if (w->src_fd[i] < 0) {
            e = k3_fail(d, K3_ERR_IO, "cannot open '%s': %s (the pack reads its experts in place from the "
                        "checkpoint k3pack read; if it moved, point the link at it: ln -sfn DIR '%s')", path,
                        strerror(errno), link);
            break;
        }
        if (fstat(w->src_fd[i], &st) != 0) { e = k3_fail(d, K3_ERR_IO, "cannot stat '%s': %s", path, strerror(errno)); break; }
        if ((uint64_t)st.st_size != f->size) {
            e = k3_fail(d, K3_ERR_CORRUPT, "'%s' is %llu bytes; the pack was made from a file of %llu bytes: it is "
                        "another file, or it changed (truncated?) since k3pack read it", path,
                        (unsigned long long)st.st_size, (unsigned long long)f->size);
            break;
        }
        uint8_t *nb = realloc(hdr, (size_t)f->header_size);
        if (!nb) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); break; }
        hdr = nb;
        if ((e = k3_pread_full(w->src_fd[i], hdr, (size_t)f->header_size, 0, path, d))) break;
        k3_h128 h = k3_xxh3_128(hdr, (size_t)f->header_size);
        if (memcmp(&h, &f->header_hash, sizeof h)) {
            e = k3_fail(d, K3_ERR_CORRUPT, "'%s': its safetensors header differs from the one k3pack read: it is "
                        "another file, or it changed", path);
            break;
        }
        w->src_fd_direct[i] = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    }
    free(hdr);
    return e;
}

/* Experts across ranks (dist.h's rule): the records r of this rank are those with r % R == me, R
   the ranks holding experts and me this rank's place among them (UINT64_MAX: it holds none); a
   resident layer keeps them packed, record r at index r / R. */
static uint64_t own_ranks(const k3_weights *w) { return (uint64_t)k3_expert_holders(w->o.ranks, w->o.first); }
static uint64_t own_me(const k3_weights *w)
{
    int p = k3_expert_place(w->o.rank, w->o.ranks, w->o.first);
    return p >= 0 ? (uint64_t)p : UINT64_MAX;
}

/*
 * Resident: every record of every layer read by the reader threads (O_DIRECT where the shard
 * allows, in parallel, a deep queue for the disk) and hash-checked there, as the cache reads a
 * miss. The shards are closed once all is in memory.
 */
static k3_err load_resident(k3_weights *w, uint64_t n_records, k3_progress *pg, k3_diag *d)
{
    k3io_job *jobs = calloc(n_records ? n_records : 1, sizeof *jobs);     /* [n_records] */
    k3io_job **q = malloc(4096 * sizeof *q);                              /* [4096] a batch to submit */
    if (!jobs || !q) { free(jobs); free(q); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
    uint64_t n = 0;
    int nq = 0;
    const uint64_t R = own_ranks(w), me = own_me(w);
    for (uint32_t l = 0; l < w->n_layers; l++) {
        expert_layer *el = &w->experts[l];
        for (uint64_t r = me; el->data && r < el->count; r += R, n++) {       /* this rank's records */
            record_job(el, r, el->data + r / R * el->stride, w->o.verify_reads, &jobs[n]);   /* [stride] each */
            q[nq++] = &jobs[n];
            if (nq == 4096) { k3io_submit(w->io, q, nq); nq = 0; }
        }
    }
    if (nq) k3io_submit(w->io, q, nq);
    free(q);
    k3_err e = K3_OK;
    n = 0;
    for (uint32_t l = 0; l < w->n_layers; l++) {       /* wait for every job, even after a failure */
        expert_layer *el = &w->experts[l];
        for (uint64_t r = me; el->data && r < el->count; r += R, n++) {
            k3io_job *j = &jobs[n];
            if (k3io_wait(w->io, j)) {
                if (!e) e = record_fail(el, l, r, j->bad_hash, j->why, d);
                continue;
            }
            w->bytes_read += j->size;
            w->st.expert_bytes_read += j->size;
            w->st.read_seconds += j->seconds;
            w->st.hash_seconds += j->hash_seconds;
            if (pg) k3_progress_update(pg, w->bytes_read, NULL);
        }
        if (el->data) {
            if (el->fd >= 0) close(el->fd);
            if (el->fd_direct >= 0) close(el->fd_direct);
            el->fd = el->fd_direct = -1;
        }
    }
    free(jobs);
    close_sources(w);                                  /* everything is in memory */
    return e;
}

k3_err k3w_load_experts(k3_weights *w, k3_progress *pg, k3_diag *d)
{
    k3_manifest *m = &w->mf;
    uint64_t n_records = 0;
    w->experts = calloc(w->n_layers, sizeof *w->experts);
    if (!w->experts) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < w->n_layers; l++) w->experts[l].fd = w->experts[l].fd_direct = -1;
    for (uint32_t li = 0; li < m->n_expert_layers; li++) {
        const k3_mf_experts *me = &m->expert_layers[li];
        if (me->layer >= w->n_layers)
            return k3_fail(d, K3_ERR_MODEL, "manifest: expert layer %u is outside the model's %u layers",
                           me->layer, w->n_layers);
        expert_layer *el = &w->experts[me->layer];
        char path[4096];
        int fd = -1;
        k3_shard_header h;
        k3_err e = K3_OK;
        memset(&h, 0, sizeof h);
        if (me->in_place) {                     /* records in the checkpoint's files (FORMAT.md 10) */
            if (!w->src_fd && (e = open_sources(w, d))) return e;
            snprintf(path, sizeof path, "%s", K3_CHECKPOINT_LINK);
        } else {
            if ((e = k3w_open_shard(w, me->shard, &fd, path, sizeof path, &h, d))) return e;
            if (h.n_records != me->count || h.record_stride != me->stride || h.record_size != me->record_size ||
                h.data_offset != me->offset || h.n_entries != me->n_parts)
                e = k3_fail(d, K3_ERR_MODEL, "'%s': record geometry differs from the manifest", path);
        }
        for (uint32_t p = 0; p < me->n_parts && !e; p++) {
            const k3_mf_part *pt = &me->parts[p];
            const k3_shard_entry *en = me->in_place ? NULL : k3_shard_find(&h, pt->name);
            if (!me->in_place &&
                (e = k3w_check_entry(en, path, pt->name, pt->encoding, pt->ndim, pt->shape, pt->offset, pt->size, d)))
                break;
            int mi = pt->name[0] == 'w' ? pt->name[1] == '1' ? 0 : pt->name[1] == '3' ? 1 : pt->name[1] == '2' ? 2 : -1 : -1;
            const char *suf = pt->name + 2;
            int which = !strcmp(suf, ".weight_packed") || !strcmp(suf, ".weight") ? 0 :
                        !strcmp(suf, ".weight_scale") ? 1 : -1;
            if (mi < 0 || which < 0 || pt->ndim != 2) {
                e = k3_fail(d, K3_ERR_MODEL, "'%s': unknown expert record part '%s'", path, pt->name);
                break;
            }
            el->off[mi][which] = pt->offset;
            if (which == 0) {
                el->enc = pt->encoding;
                el->rows[mi] = (uint32_t)pt->shape[0];
                el->cols[mi] = (uint32_t)pt->shape[1];
            }
        }
        if (!e) {
            el->count = me->count;
            el->stride = me->stride;
            el->offset = me->offset;
            el->record_size = me->record_size;
            el->hashes = me->hashes;
            if (me->in_place) {
                el->rec_file = me->rec_file;
                el->rec_off = me->rec_off;
                el->src_fd = w->src_fd;
                el->src_fd_direct = w->src_fd_direct;
                el->src_path = w->src_path;
            }
            el->path = strdup(path);
            if (!el->path) e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
        }
        if (!e && !me->in_place) {              /* keep the shard open: cache misses, or the load below */
            el->fd = fd;
            fd = -1;
            if (me->offset % 4096 == 0 && me->stride % 4096 == 0)
                el->fd_direct = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        }
        if (!e && w->o.expert_slots) {          /* cache mode: read on demand */
            el->slot = malloc(me->count * sizeof *el->slot);
            el->uses = calloc(me->count, sizeof *el->uses);
            if (!el->slot || !el->uses) e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
            for (uint64_t r = 0; !e && r < me->count; r++) el->slot[r] = -1;
            if (me->stride > w->slot_bytes) w->slot_bytes = me->stride;
        } else if (!e) {                        /* resident: every record this rank owns, read below */
            uint64_t own = k3_expert_share(me->count, w->o.rank, w->o.ranks, w->o.first);
            if (own > (SIZE_MAX - 4096) / me->stride ||
                posix_memalign((void **)&el->data, 4096, (size_t)((own ? own : 1) * me->stride)))
                e = k3_fail(d, K3_ERR_NOMEM, "out of memory for the experts of layer %u", me->layer);
            n_records += own;
        }
        k3_shard_header_free(&h);
        if (fd >= 0) close(fd);
        if (e) return e;
    }
    return w->o.expert_slots ? K3_OK : load_resident(w, n_records, pg, d);
}

k3_err k3w_cache_init(k3_weights *w, k3_diag *d)
{
    w->n_slots = w->o.expert_slots;
    if (!w->slot_bytes) { w->n_slots = 0; return K3_OK; }             /* no experts at all */
    if (w->n_slots > SIZE_MAX / w->slot_bytes) return k3_fail(d, K3_ERR_NOMEM, "expert cache too large");
    void *p = NULL;
    if (posix_memalign(&p, 4096, (size_t)(w->n_slots * w->slot_bytes)))
        return k3_fail(d, K3_ERR_NOMEM, "out of memory for the expert cache (%llu slots of %llu bytes)",
                       (unsigned long long)w->n_slots, (unsigned long long)w->slot_bytes);
    w->slots = p;
    w->slot_layer = malloc(w->n_slots * sizeof(int32_t));
    w->slot_expert = malloc(w->n_slots * sizeof(int32_t));
    w->slot_used = calloc(w->n_slots, sizeof(uint64_t));
    w->slot_pin = calloc(w->n_slots, sizeof(int32_t));
    w->slot_job = calloc(w->n_slots, sizeof(k3io_job));
    w->acq_order = malloc(w->n_slots * sizeof(int32_t));
    w->acq_slot = malloc(w->n_slots * sizeof(int32_t));
    w->slot_pf = calloc(w->n_slots, 1);
    w->slot_fly = calloc(w->n_slots, 1);
    w->fly = malloc(w->n_slots * sizeof(int32_t));
    w->acq_pf = calloc(w->n_slots, 1);
    if (!w->slot_layer || !w->slot_expert || !w->slot_used || !w->slot_pin || !w->slot_job || !w->acq_order ||
        !w->acq_slot || !w->slot_pf || !w->slot_fly || !w->fly || !w->acq_pf)
        return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < w->n_slots; i++) w->slot_layer[i] = w->slot_expert[i] = -1;
    const char *ev = getenv("K3_EVICT");              /* for the benchmarks: lru | lfu */
    w->evict = ev && !strcmp(ev, "lru") ? K3_EVICT_LRU : ev && !strcmp(ev, "lfu") ? K3_EVICT_LFU : K3_EVICT_DEFAULT;
    const char *la = getenv("K3_LOOKAHEAD");          /* 0 | off | N (docs/PERFORMANCE.md) */
    w->lookahead = -1;
    if (la && !strcmp(la, "off")) w->lookahead = 0;
    else if (la && *la >= '0' && *la <= '9') w->lookahead = (int)strtol(la, NULL, 10);
    return K3_OK;
}

void k3w_experts_free(k3_weights *w)
{
    if (w->experts)
        for (uint32_t l = 0; l < w->n_layers; l++) {
            expert_layer *el = &w->experts[l];
            free(el->data);
            free(el->slot);
            free(el->uses);
            free(el->path);
            if (el->fd >= 0) close(el->fd);
            if (el->fd_direct >= 0) close(el->fd_direct);
        }
    free(w->experts);
    if (w->src_fd) close_sources(w);
    for (uint32_t i = 0; w->src_path && i < w->n_src; i++) free(w->src_path[i]);
    free(w->src_fd);
    free(w->src_fd_direct);
    free(w->src_path);
    free(w->slots);
    free(w->slot_layer);
    free(w->slot_expert);
    free(w->slot_used);
    free(w->slot_pin);
    free(w->slot_job);
    free(w->acq_order);
    free(w->acq_slot);
    free(w->slot_pf);
    free(w->slot_fly);
    free(w->fly);
    free(w->acq_pf);
}

static void fill_expert(const expert_layer *el, const uint8_t *rec, k3_expert *out)
{
    k3_mat *mats[3] = {&out->w1, &out->w3, &out->w2};
    for (int mi = 0; mi < 3; mi++) {
        mats[mi]->enc = el->enc;
        mats[mi]->rows = el->rows[mi];
        mats[mi]->cols = el->cols[mi];
        mats[mi]->data = rec ? rec + el->off[mi][0] : NULL;
        mats[mi]->scales = rec && el->enc == K3_ENC_MXFP4 ? rec + el->off[mi][1] : NULL;
    }
}

k3_err k3w_expert_shape(k3_weights *w, int layer, k3_expert *out, k3_diag *d)
{
    if (layer < 0 || layer >= (int)w->n_layers || !w->experts[layer].count)
        return k3_fail(d, K3_ERR_MODEL, "layer %d has no routed experts in the pack", layer);
    fill_expert(&w->experts[layer], NULL, out);
    return K3_OK;
}

/* Slot s no longer holds a record (its read failed, or it was never valid). */
static void drop_slot(k3_weights *w, int32_t s)
{
    if (w->slot_layer[s] >= 0) w->experts[w->slot_layer[s]].slot[w->slot_expert[s]] = -1;
    w->slot_layer[s] = w->slot_expert[s] = -1;
    w->slot_used[s] = 0;
}

/* Slot s's record leaves it (evicted, or dropped): a read ahead nobody asked for was wasted. */
static void forget_ahead(k3_weights *w, int32_t s)
{
    if (w->slot_pf[s] != K3_PF_AHEAD) return;
    w->slot_pf[s] = K3_PF_NONE;
    w->st.prefetch_wasted++;
    w->st.prefetch_pending--;
}

/* The read ahead into slot s landed: wait for it (the compute thread's time, counted as waiting
   when `timed`), take its figures, and drop the slot if it failed. Returns the job's failure. */
static int land(k3_weights *w, int32_t s, int timed)
{
    k3io_job *jb = &w->slot_job[s];
    double t0 = k3_now();
    int bad = k3io_wait(w->io, jb);
    if (timed) {
        double dt = k3_now() - t0;
        w->st.wait_seconds += dt;
        w->st.expert_wait_seconds += dt;
    }
    w->st.read_seconds += jb->seconds;
    w->st.hash_seconds += jb->hash_seconds;
    w->slot_fly[s] = 0;
    for (int i = 0; i < w->n_fly; i++)
        if (w->fly[i] == s) {
            memmove(w->fly + i, w->fly + i + 1, (size_t)(w->n_fly - i - 1) * sizeof *w->fly);
            w->n_fly--;
            break;
        }
    if (bad) {                                                  /* never leave a damaged record cached */
        forget_ahead(w, s);
        drop_slot(w, s);
    } else {
        w->bytes_read += jb->size;
        w->st.expert_bytes_read += jb->size;
    }
    return bad;
}

/* An acquire of `layer` begins: the reads ahead for other layers land (waiting if needed; they
   were queued before the last acquire's misses, which have all been waited for, so they have
   almost always landed). What stays flying is this layer's, so which slots can be victims
   depends on the routing only, never on the disk's timing: the cache's contents, and the
   counters, are the same in every run. */
static void land_older(k3_weights *w, int layer)
{
    for (int i = w->n_fly - 1; i >= 0; i--)
        if (w->slot_layer[w->fly[i]] != layer) land(w, w->fly[i], 1);
}

/* Wait for the reads of the current acquire that are still in flight (an error path, or a
   release before every expert was handed out). */
static void drain(k3_weights *w)
{
    for (int i = w->acq_hits; i < w->acq_n; i++) {
        int32_t s = w->acq_slot[i];
        if (s < 0) continue;
        w->acq_slot[i] = -1;
        if (w->acq_pf[i]) {                                     /* a hit read ahead */
            w->acq_pf[i] = 0;
            land(w, s, 0);
            continue;
        }
        w->st.expert_misses++;
        int bad = k3io_wait(w->io, &w->slot_job[s]);
        w->st.read_seconds += w->slot_job[s].seconds;
        w->st.hash_seconds += w->slot_job[s].hash_seconds;
        if (bad) drop_slot(w, s);                              /* never leave a damaged record cached */
        else {
            w->bytes_read += w->slot_job[s].size;
            w->st.expert_bytes_read += w->slot_job[s].size;
        }
    }
}

/*
 * The slot to evict for a miss: a free one, else among the slots this acquire does not hold,
 *   K3_EVICT_LFU   the expert that served the fewest tokens since the start (counts kept for
 *                  every (layer, expert), also after eviction), the least recently used among equals;
 *   K3_EVICT_LRU   the least recently used.
 * Measured on medium's routing (tests/bench/sim_cache.py, docs/PERFORMANCE.md): at a quarter of
 * the pack LFU hits 36 % of decode requests against LRU's 21 % (Belady's optimum 56 %), and
 * unlike LRU it keeps hitting when the cache is smaller than one token's experts, where LRU
 * evicts, layer after layer, exactly what the next token will ask for.
 */
static int32_t victim(k3_weights *w)
{
    uint64_t best_u = UINT64_MAX, best_t = UINT64_MAX;
    int32_t v = -1;
    for (uint64_t s = 0; s < w->n_slots; s++) {
        if (w->slot_pin[s] || w->slot_fly[s]) continue;        /* held, or a read ahead still landing */
        if (w->slot_layer[s] < 0) return (int32_t)s;
        uint64_t u = w->evict == K3_EVICT_LFU ? w->experts[w->slot_layer[s]].uses[w->slot_expert[s]] : 0;
        if (u < best_u || (u == best_u && w->slot_used[s] < best_t)) {
            best_u = u;
            best_t = w->slot_used[s];
            v = (int32_t)s;
        }
    }
    return v;
}

/* victim(), waiting for the oldest read ahead outside this acquire when every other slot is held. */
static int32_t victim_wait(k3_weights *w)
{
    int32_t v = victim(w);
    while (v < 0) {
        int i = 0;
        while (i < w->n_fly && w->slot_pin[w->fly[i]]) i++;
        if (i == w->n_fly) return -1;
        land(w, w->fly[i], 1);
        v = victim(w);
    }
    return v;
}

/* Slot v gets expert e of layer (evicting what it held): pinned, its read job set up. */
static uint8_t *take_slot(k3_weights *w, int32_t v, int layer, int32_t e)
{
    expert_layer *el = &w->experts[layer];
    forget_ahead(w, v);
    if (w->slot_layer[v] >= 0) w->experts[w->slot_layer[v]].slot[w->slot_expert[v]] = -1;
    w->slot_layer[v] = layer;
    w->slot_expert[v] = e;
    w->slot_pin[v] = 1;
    w->slot_used[v] = ++w->tick;
    el->slot[e] = v;
    uint8_t *dst = w->slots + (uint64_t)v * w->slot_bytes;
    record_job(el, (uint64_t)e, dst, w->o.verify_reads, &w->slot_job[v]);
    return dst + rec_lead(el, (uint64_t)e);
}

k3_err k3w_experts_acquire(k3_weights *w, int layer, const int32_t *ids, const uint32_t *tokens, int n,
                           k3_expert *out, k3_diag *d)
{
    if (layer < 0 || layer >= (int)w->n_layers || !w->experts[layer].count)
        return k3_fail(d, K3_ERR_MODEL, "layer %d has no routed experts in the pack", layer);
    expert_layer *el = &w->experts[layer];
    for (int j = 0; j < n; j++)
        if (ids[j] < 0 || (uint64_t)ids[j] >= el->count)
            return k3_fail(d, K3_ERR_MODEL, "layer %d: expert %d is outside 0..%" PRIu64, layer, (int)ids[j],
                           el->count - 1);
    w->acq_layer = layer;
    w->acq_ids = ids;
    w->acq_next = 0;
    const uint64_t R = own_ranks(w), me = own_me(w);
    for (int j = 0; j < n; j++)
        if ((uint64_t)ids[j] % R != me)
            return k3_fail(d, K3_ERR_INTERNAL, "layer %d: expert %d is not this rank's (%d)", layer, (int)ids[j],
                           w->o.rank);
    if (!w->o.expert_slots) {
        for (int j = 0; j < n; j++)
            fill_expert(el, el->data + (uint64_t)ids[j] / R * el->stride + rec_lead(el, (uint64_t)ids[j]), &out[j]);
        w->acq_n = w->acq_hits = n;
        return K3_OK;
    }
    if ((uint64_t)n > w->n_slots)
        return k3_fail(d, K3_ERR_INTERNAL, "%d experts asked at once, the cache has %" PRIu64 " slots", n, w->n_slots);
    drain(w);
    land_older(w, layer);
    memset(w->slot_pin, 0, w->n_slots * sizeof *w->slot_pin);
    for (int j = 0; j < n; j++) el->uses[ids[j]] += tokens ? tokens[ids[j]] : 1;   /* LFU: tokens served */
    int nh = 0;
    for (int pass = 0; pass < 2; pass++)               /* hits first, those still landing after them; */
        for (int j = 0; j < n; j++) {                  /* pinned, so no miss evicts them */
            int32_t s = el->slot[ids[j]];
            if (s < 0 || w->slot_fly[s] != pass) continue;
            w->slot_pin[s] = 1;
            w->slot_used[s] = ++w->tick;
            w->st.expert_hits++;
            if (w->slot_pf[s] == K3_PF_AHEAD) {        /* read ahead, asked for now */
                w->slot_pf[s] = K3_PF_NONE;
                w->st.prefetch_used++;
                w->st.prefetch_pending--;
            }
            fill_expert(el, w->slots + (uint64_t)s * w->slot_bytes + rec_lead(el, (uint64_t)ids[j]), &out[j]);
            w->acq_slot[nh] = pass ? s : -1;
            w->acq_pf[nh] = (uint8_t)pass;
            w->acq_order[nh++] = j;
        }
    w->acq_hits = 0;
    while (w->acq_hits < nh && !w->acq_pf[w->acq_hits]) w->acq_hits++;
    w->acq_n = nh;
    k3io_job *jobs[64];
    int nj = 0;
    for (int j = 0; j < n; j++) {                      /* a victim each (victim()) */
        if (el->slot[ids[j]] >= 0) continue;
        int32_t v = victim_wait(w);
        if (v < 0) return k3_fail(d, K3_ERR_INTERNAL, "expert cache: no free slot");
        fill_expert(el, take_slot(w, v, layer, ids[j]), &out[j]);
        w->acq_slot[w->acq_n] = v;
        w->acq_pf[w->acq_n] = 0;
        w->acq_order[w->acq_n++] = j;
        jobs[nj++] = &w->slot_job[v];
        if (nj == 64) { k3io_submit(w->io, jobs, nj); nj = 0; }
    }
    if (nj) k3io_submit(w->io, jobs, nj);
    return K3_OK;
}

k3_err k3w_experts_next(k3_weights *w, int *j, k3_diag *d)
{
    *j = -1;
    if (w->acq_next >= w->acq_n) return K3_OK;
    int i = w->acq_next++;
    int32_t s = w->o.expert_slots ? w->acq_slot[i] : -1;
    if (s >= 0 && w->acq_pf[i]) {                      /* a hit read ahead: wait for it to land */
        w->acq_slot[i] = -1;
        w->acq_pf[i] = 0;
        k3io_job *jb = &w->slot_job[s];
        if (land(w, s, 1)) {
            int32_t e = w->acq_ids[w->acq_order[i]];
            w->acq_next = w->acq_n;
            drain(w);
            return record_fail(&w->experts[w->acq_layer], (uint32_t)w->acq_layer, (uint64_t)e, jb->bad_hash,
                               jb->why, d);
        }
    } else if (s >= 0) {                               /* a miss: wait for its read */
        k3io_job *jb = &w->slot_job[s];
        double t0 = k3_now();
        int bad = k3io_wait(w->io, jb);
        double dt = k3_now() - t0;
        w->st.wait_seconds += dt;
        w->st.expert_wait_seconds += dt;
        w->st.read_seconds += jb->seconds;
        w->st.hash_seconds += jb->hash_seconds;
        w->st.expert_misses++;
        w->acq_slot[i] = -1;
        expert_layer *el = &w->experts[w->acq_layer];
        int32_t e = w->acq_ids[w->acq_order[i]];
        if (bad) {
            drop_slot(w, s);                           /* never leave a damaged record cached */
            w->acq_next = w->acq_n;
            drain(w);
            return record_fail(el, (uint32_t)w->acq_layer, (uint64_t)e, jb->bad_hash, jb->why, d);
        }
        w->bytes_read += el->record_size;
        w->st.expert_bytes_read += el->record_size;
    }
    *j = w->o.expert_slots ? w->acq_order[i] : i;
    return K3_OK;
}

int k3w_experts_ready(const k3_weights *w)
{
    int n = 0;
    for (int i = w->acq_next; i < w->acq_n; i++, n++)
        if (w->o.expert_slots && w->acq_slot[i] >= 0) break;      /* a read still to wait for */
    return n;
}

void k3w_experts_release(k3_weights *w, int layer)
{
    (void)layer;
    if (!w->o.expert_slots) return;
    drain(w);
    w->acq_n = w->acq_next = w->acq_hits = 0;
    memset(w->slot_pin, 0, w->n_slots * sizeof *w->slot_pin);
}

/* ------------------------------------------------------------------------ */
/* lookahead                                                                 */

int k3w_lookahead(const k3_weights *w) { return w->n_slots > 0 ? w->lookahead : 0; }

int k3w_experts_prefetch(k3_weights *w, int layer, const int32_t *ids, int n)
{
    if (!k3w_lookahead(w) || w->acq_n || layer < 0 || layer >= (int)w->n_layers || !w->experts[layer].count)
        return 0;
    expert_layer *el = &w->experts[layer];
    if ((uint64_t)n > w->n_slots / 2) n = (int)(w->n_slots / 2);
    for (int j = 0; j < n; j++)                        /* the predicted ones cached stay */
        if (ids[j] >= 0 && (uint64_t)ids[j] < el->count && el->slot[ids[j]] >= 0) w->slot_pin[el->slot[ids[j]]] = 1;
    k3io_job *jobs[64];
    int nj = 0, issued = 0;
    for (int j = 0; j < n; j++) {
        if (ids[j] < 0 || (uint64_t)ids[j] >= el->count || el->slot[ids[j]] >= 0) continue;
        int32_t v = victim(w);                         /* never waits: no slot, no read ahead */
        if (v < 0) break;
        take_slot(w, v, layer, ids[j]);
        w->slot_pf[v] = K3_PF_AHEAD;
        w->slot_fly[v] = 1;
        w->fly[w->n_fly++] = v;
        jobs[nj++] = &w->slot_job[v];
        issued++;
        if (nj == 64) { k3io_submit(w->io, jobs, nj); nj = 0; }
    }
    if (nj) k3io_submit(w->io, jobs, nj);
    memset(w->slot_pin, 0, w->n_slots * sizeof *w->slot_pin);
    w->st.prefetch_issued += (uint64_t)issued;
    w->st.prefetch_pending += (uint64_t)issued;
    return issued;
}

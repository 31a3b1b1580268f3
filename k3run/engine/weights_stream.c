/*
 * weights_stream.c - the trunk's units: resident ones read once, streamed ones
 * read every pass in pieces through two buffers (weights.h, plan.h).
 *
 * The stream is one cycle of pieces over every streamed unit, in unit order.
 * A unit of at most a chunk is one piece (all its tensors). A larger unit is
 * "split": its large matrices (k3_tensor_in_pieces) are pieces of rows, in
 * k3_wid order (the order the model multiplies them), each at most a chunk;
 * the rest of it, its small part, is read into one of two small buffers when
 * the previous split unit begins and stays while the model is in the unit.
 * While the model computes on one piece, the next is read into the other
 * buffer; a request for any other piece reads it now (correct, only slower).
 *
 * Hashes: a whole tensor's XXH3-64 is in the manifest, so a tensor read in row
 * pieces is hashed in order across its pieces (io.h, hs) and checked at its
 * last piece. The model's product over the tensor is not used before that
 * piece has been handed out, so a damaged byte anywhere in it fails the pass
 * (k3w_rows, then k3w_check) before anything computed from it is used.
 */
#define _GNU_SOURCE
#include "weights_impl.h"

#include <inttypes.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>

#include "k3_sys.h"

static void *page_alloc(uint64_t n)
{
    void *p = NULL;
    if (n > SIZE_MAX - 4096) return NULL;
    if (posix_memalign(&p, 4096, (size_t)(n ? n : 4096))) return NULL;
    return p;
}

/* Tensor k of split unit u as row pieces at the end of w->pieces. */
static void add_row_pieces(k3_weights *w, uint32_t u, uint32_t k)
{
    uint32_t ti = w->units[u].ti[k];
    const k3_mf_tensor *mt = &w->mf.tensors[ti];
    uint64_t rows = mt->shape[0], rb = mt->size / rows, pr = k3_piece_rows(rows, rb, w->chunk);
    w->tpiece[ti] = w->n_pieces;
    w->trows[ti] = (uint32_t)pr;
    for (uint64_t r = 0; r < rows; r += pr) {
        uint64_t r1 = r + pr < rows ? r + pr : rows;
        w->pieces[w->n_pieces++] = (stream_piece){u, ti, (uint32_t)r, (uint32_t)r1, k3_unit_span((r1 - r) * rb)};
    }
}

/* Add unit u's pieces to w->pieces (allocated to hold them): a whole unit is one; a split unit's
   large matrices in k3_wid order (the model's), then any the model has no name for, in file order. */
static void list_pieces(k3_weights *w, uint32_t u, int layer)
{
    trunk_unit *un = &w->units[u];
    un->piece0 = w->n_pieces;
    if (!un->split) {
        w->pieces[w->n_pieces++] = (stream_piece){u, UINT32_MAX, 0, 0, un->bytes};
        un->n_pieces = 1;
        return;
    }
    int kda = layer >= 0 && k3_layer_is_kda(&w->cfg, (uint32_t)layer);
    for (int id = 0; id < K3W__COUNT; id++) {
        /* the other attention's ids: KDA and MLA share the names of g_proj and o_proj, and an
           MLA layer's would otherwise be listed at the KDA ids, before its q_a_proj */
        if (layer >= 0 && (kda ? id >= K3W_MLA_Q && id <= K3W_MLA_O : id >= K3W_KDA_Q && id <= K3W_KDA_O)) continue;
        const k3_tensor *t = w->idx[layer + 1][id];
        for (uint32_t k = 0; t && k < un->n; k++)
            if (un->pos[k] == UINT64_MAX && &w->tensors[un->ti[k]] == t && !w->trows[un->ti[k]])
                add_row_pieces(w, u, k);
    }
    for (uint32_t k = 0; k < un->n; k++)
        if (un->pos[k] == UINT64_MAX && !w->trows[un->ti[k]]) add_row_pieces(w, u, k);
    un->n_pieces = w->n_pieces - un->piece0;
}

/* Group the tensors into units and lay each unit out: tensor i of a unit at pos[i]; a split
   unit's small tensors in its small part, its large matrices in row pieces. */
k3_err k3w_build_units(k3_weights *w, k3_diag *d)
{
    k3_manifest *m = &w->mf;
    uint32_t nu = w->n_layers + 1, nt = m->n_tensors ? m->n_tensors : 1;
    w->chunk = w->o.chunk ? w->o.chunk : k3_chunk_bytes();
    w->units = calloc(nu, sizeof *w->units);
    w->cur_unit = -1;
    w->cur_buf = -1;
    w->sb[0].piece = w->sb[1].piece = -1;
    w->ssb[0].unit = w->ssb[1].unit = -1;
    int *unit_of = malloc(nt * sizeof *unit_of);
    w->tpiece = calloc(nt, sizeof *w->tpiece);
    w->trows = calloc(nt, sizeof *w->trows);
    w->thash = calloc(nt, sizeof *w->thash);
    w->thashed = calloc(nt, sizeof *w->thashed);
    if (!w->units || !unit_of || !w->tpiece || !w->trows || !w->thash || !w->thashed) {
        free(unit_of);
        return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        unit_of[i] = m->shards[m->tensors[i].shard].kind == K3_SHARD_TRUNK ?
                     k3_trunk_unit(m->tensors[i].name, w->n_layers) : -1;
        if (unit_of[i] >= 0) w->units[unit_of[i]].n++;
    }
    for (uint32_t u = 0; u < nu; u++) {
        trunk_unit *un = &w->units[u];
        un->ti = malloc((un->n ? un->n : 1) * sizeof *un->ti);
        un->pos = malloc((un->n ? un->n : 1) * sizeof *un->pos);
        if (!un->ti || !un->pos) { free(unit_of); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
        un->n = 0;
        un->streamed = w->o.unit_streamed ? w->o.unit_streamed[u] : 0;
    }
    for (uint32_t i = 0; i < m->n_tensors; i++) {          /* manifest order: shard, then offset */
        if (unit_of[i] < 0) continue;
        trunk_unit *un = &w->units[unit_of[i]];
        un->ti[un->n] = i;
        un->pos[un->n++] = un->bytes;
        un->bytes += k3_unit_span(m->tensors[i].size);
    }
    free(unit_of);
    uint64_t n_pieces = 0;
    for (uint32_t u = 0; u < nu; u++) {                    /* split units: small part, pieces */
        trunk_unit *un = &w->units[u];
        un->split = un->streamed && un->bytes > w->chunk;
        if (!un->streamed) continue;
        n_pieces++;
        if (!un->split) continue;
        for (uint32_t k = 0; k < un->n; k++) {
            const k3_mf_tensor *mt = &m->tensors[un->ti[k]];
            if (!k3_tensor_in_pieces(mt->name, mt->ndim, mt->shape, mt->size, w->chunk)) {
                un->pos[k] = un->small;
                un->small += k3_unit_span(mt->size);
                continue;
            }
            un->pos[k] = UINT64_MAX;
            uint64_t rb = mt->size / mt->shape[0], pr = k3_piece_rows(mt->shape[0], rb, w->chunk);
            n_pieces += (mt->shape[0] + pr - 1) / pr;
            if (!(w->thash[un->ti[k]] = k3_hasher64_new())) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
        }
    }
    if (!(w->pieces = calloc(n_pieces ? n_pieces : 1, sizeof *w->pieces)))
        return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (uint32_t u = 0; u < nu; u++)
        if (w->units[u].streamed) list_pieces(w, u, u < w->n_layers ? (int)u : -1);
    return K3_OK;
}

/* Point unit u's tensors at mem (NULL: not in memory); small_only: a split unit's small part. */
static void place(k3_weights *w, int u, uint8_t *mem)
{
    trunk_unit *un = &w->units[u];
    if (!un->split) un->mem = mem;
    for (uint32_t k = 0; k < un->n; k++)
        if (un->pos[k] != UINT64_MAX) w->tensors[un->ti[k]].mat.data = mem ? mem + un->pos[k] : NULL;
    for (uint32_t k = 0; k < un->n; k++) {             /* Q8: the scales (whole, also for row pieces) */
        uint32_t s = w->tscale ? w->tscale[un->ti[k]] : UINT32_MAX;
        if (s != UINT32_MAX) w->tensors[un->ti[k]].mat.scales = w->tensors[s].mat.data;
    }
}

/* Queue the reads of unit u's tensors (a split unit: its small part) into mem. */
static void submit_tensors(k3_weights *w, int u, uint8_t *mem)
{
    trunk_unit *un = &w->units[u];
    k3io_job *jobs[64];
    int nj = 0;
    for (uint32_t k = 0; k < un->n; k++) {
        if (un->pos[k] != UINT64_MAX) {
            const k3_mf_tensor *mt = &w->mf.tensors[un->ti[k]];
            k3io_job *j = &w->tjob[un->ti[k]];
            j->fd = w->shard_fd[mt->shard];
            j->fd_direct = mt->offset % 4096 == 0 ? w->shard_fd_direct[mt->shard] : -1;
            j->off = mt->offset;
            j->size = mt->size;
            j->span = k3_unit_span(mt->size);
            j->dst = mem + un->pos[k];
            j->verify = w->o.verify_reads;
            j->hash = mt->hash;
            j->hs = NULL;
            jobs[nj++] = j;
        }
        if (nj && (nj == 64 || k + 1 == un->n)) { k3io_submit(w->io, jobs, nj); nj = 0; }
    }
}

/* Wait for unit u's tensor reads (a split unit: its small part); the first failure is the error. */
static k3_err wait_tensors(k3_weights *w, int u, k3_progress *pg, k3_diag *d)
{
    trunk_unit *un = &w->units[u];
    k3_err e = K3_OK;
    for (uint32_t k = 0; k < un->n; k++) {
        if (un->pos[k] == UINT64_MAX) continue;
        k3io_job *j = &w->tjob[un->ti[k]];
        const k3_mf_tensor *mt = &w->mf.tensors[un->ti[k]];
        if (k3io_wait(w->io, j) && !e)
            e = k3_fail(d, j->bad_hash ? K3_ERR_CORRUPT : K3_ERR_IO,
                        "'%s': tensor '%s' at offset %" PRIu64 " (%" PRIu64 " bytes): %s",
                        w->shard_path[mt->shard], mt->name, mt->offset, mt->size, j->why);
        w->st.read_seconds += j->seconds;
        w->st.hash_seconds += j->hash_seconds;
        if (!j->failed) {
            w->bytes_read += mt->size;
            w->st.trunk_bytes_read += mt->size;
        }
        if (pg) k3_progress_update(pg, w->bytes_read, NULL);
    }
    return e;
}

/* ------------------------------------------------------------ piece buffers */

static void forget_piece(k3_weights *w, int b)
{
    int p = w->sb[b].piece;
    if (p >= 0 && w->pieces[p].ti == UINT32_MAX) place(w, (int)w->pieces[p].unit, NULL);
    w->sb[b].piece = -1;
}

/* Queue piece p's reads into buffer b (whatever it held is gone). */
static void submit_piece(k3_weights *w, int b, int p)
{
    stream_buf *s = &w->sb[b];
    forget_piece(w, b);
    s->piece = p;
    s->pending = 1;
    const stream_piece *pc = &w->pieces[p];
    if (pc->ti == UINT32_MAX) { submit_tensors(w, (int)pc->unit, s->mem); return; }
    const k3_mf_tensor *mt = &w->mf.tensors[pc->ti];
    uint64_t rb = mt->size / mt->shape[0];
    k3io_job *j = &s->job, *jp = j;
    memset(j, 0, sizeof *j);
    j->fd = w->shard_fd[mt->shard];
    j->off = mt->offset + pc->r0 * rb;
    j->size = (uint64_t)(pc->r1 - pc->r0) * rb;
    j->span = k3_unit_span(j->size);
    j->fd_direct = j->off % 4096 == 0 ? w->shard_fd_direct[mt->shard] : -1;
    j->dst = s->mem;
    j->verify = w->o.verify_reads;
    j->hash = mt->hash;
    j->hs = w->thash[pc->ti];
    j->hs_reset = pc->r0 == 0;
    j->hs_final = pc->r1 == mt->shape[0];
    if (!j->hs_reset && w->thashed[pc->ti] != pc->r0) w->thashed[pc->ti] = UINT32_MAX;   /* out of order */
    else if (j->hs_reset) w->thashed[pc->ti] = 0;
    k3io_submit(w->io, &jp, 1);
}

/* Wait for buffer b's reads if any are in flight; their failure is reported only if asked
   (an unreported failure forgets the piece, so a later request reads it again). */
static k3_err settle_piece(k3_weights *w, int b, int report, k3_diag *d)
{
    stream_buf *s = &w->sb[b];
    if (!s->pending) return K3_OK;
    s->pending = 0;
    const stream_piece *pc = &w->pieces[s->piece];
    k3_diag scratch;
    k3_diag *dd = report ? d : &scratch;
    k3_err e = K3_OK;
    if (pc->ti == UINT32_MAX) {
        e = wait_tensors(w, (int)pc->unit, NULL, dd);
        w->st.units_streamed++;
    } else {
        k3io_job *j = &s->job;
        const k3_mf_tensor *mt = &w->mf.tensors[pc->ti];
        int bad = k3io_wait(w->io, j);
        w->st.read_seconds += j->seconds;
        w->st.hash_seconds += j->hash_seconds;
        w->st.pieces_streamed++;
        uint32_t *h = &w->thashed[pc->ti];
        if (!bad) {
            w->bytes_read += j->size;
            w->st.trunk_bytes_read += j->size;
        }
        uint32_t np = (uint32_t)((mt->shape[0] + w->trows[pc->ti] - 1) / w->trows[pc->ti]);
        if (bad && j->bad_hash)                        /* the hash is the whole tensor's: name it */
            e = k3_fail(dd, K3_ERR_CORRUPT, "'%s': tensor '%s' at offset %" PRIu64 " (%" PRIu64 " bytes, read in %u "
                        "row pieces of %u rows): its XXH3-64 does not match the manifest: the pack is damaged, "
                        "run k3verify", w->shard_path[mt->shard], mt->name, mt->offset, mt->size, np,
                        w->trows[pc->ti]);
        else if (bad)
            e = k3_fail(dd, K3_ERR_IO, "'%s': tensor '%s', rows %u-%u at offset %" PRIu64 " (%" PRIu64 " bytes): %s",
                        w->shard_path[mt->shard], mt->name, pc->r0, pc->r1 - 1, j->off, j->size, j->why);
        else if (w->o.verify_reads && *h == UINT32_MAX)
            e = k3_fail(dd, K3_ERR_INTERNAL, "'%s': rows %u-%u of tensor '%s' were asked for out of order: "
                        "their hash cannot be checked", w->shard_path[mt->shard], pc->r0, pc->r1 - 1, mt->name);
        *h = e ? UINT32_MAX : pc->r1;
    }
    if (e) forget_piece(w, b);
    return report ? e : K3_OK;
}

static int piece_buf(const k3_weights *w, int p)
{
    return w->sb[0].piece == p ? 0 : w->sb[1].piece == p ? 1 : -1;
}

/* Piece p in a buffer, read (its failure reported), and the piece after it in the cycle queued
   into the other buffer. Returns the buffer, or -1 with the error in d. */
static int take_piece(k3_weights *w, int p, k3_err *err, k3_diag *d)
{
    int b = piece_buf(w, p);
    if (b < 0) {                                       /* not read ahead (first pass, or out of order) */
        b = w->cur_buf == 0 ? 1 : 0;
        settle_piece(w, b, 0, d);
        submit_piece(w, b, p);
    }
    if ((*err = settle_piece(w, b, 1, d))) { forget_piece(w, b); return -1; }
    w->cur_buf = b;
    int next = (int)((uint32_t)(p + 1) % w->n_pieces), o = 1 - b;
    if (next != p && w->sb[o].piece != next) {
        settle_piece(w, o, 0, d);
        submit_piece(w, o, next);
    }
    return b;
}

/* ------------------------------------------------------ small-part buffers */

static int small_buf_of(const k3_weights *w, int u)
{
    return w->ssb[0].unit == u ? 0 : w->ssb[1].unit == u ? 1 : -1;
}

static void submit_small(k3_weights *w, int s, int u)
{
    small_buf *sb = &w->ssb[s];
    if (sb->unit >= 0) place(w, sb->unit, NULL);
    sb->unit = u;
    sb->pending = 1;
    submit_tensors(w, u, sb->mem);
}

static k3_err settle_small(k3_weights *w, int s, int report, k3_diag *d)
{
    small_buf *sb = &w->ssb[s];
    if (!sb->pending) return K3_OK;
    sb->pending = 0;
    k3_diag scratch;
    k3_err e = wait_tensors(w, sb->unit, NULL, report ? d : &scratch);
    w->st.units_streamed++;
    if (e) { place(w, sb->unit, NULL); sb->unit = -1; }
    return report ? e : K3_OK;
}

/* Split unit u's small part in memory; the next split unit's queued into the other buffer. */
static k3_err begin_split(k3_weights *w, int u, k3_diag *d)
{
    int s = small_buf_of(w, u), nu = (int)w->n_layers + 1;
    if (s < 0) {
        int other = -1;                                /* keep the buffer of a unit still ahead */
        for (int i = 1; i < nu && other < 0; i++) {
            int v = (u + i) % nu;
            if (w->units[v].split) other = small_buf_of(w, v);
        }
        s = other == 0 ? 1 : 0;
        settle_small(w, s, 0, d);
        submit_small(w, s, u);
    }
    k3_err e = settle_small(w, s, 1, d);
    if (e) return e;
    place(w, u, w->ssb[s].mem);
    for (int i = 1; i < nu; i++) {                     /* the next split unit, cyclically */
        int v = (u + i) % nu;
        if (!w->units[v].split) continue;
        if (v != u && small_buf_of(w, v) < 0) {
            settle_small(w, 1 - s, 0, d);
            submit_small(w, 1 - s, v);
        }
        break;
    }
    int p0 = (int)w->units[u].piece0;                  /* its first piece: read ahead, or now */
    if (w->units[u].n_pieces && piece_buf(w, p0) < 0) {
        int b = w->cur_buf == 0 ? 1 : 0;
        settle_piece(w, b, 0, d);
        submit_piece(w, b, p0);
    }
    return K3_OK;
}

/* ------------------------------------------------------------------ public */

/* Give back the pages of [p, p + n) that lie wholly inside it (they read as zeros afterwards). */
static void drop_pages(const uint8_t *p, uint64_t n)
{
    uintptr_t a = ((uintptr_t)p + 4095) & ~(uintptr_t)4095, b = ((uintptr_t)p + n) & ~(uintptr_t)4095;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

/* The trunk split by rows (k3_weights_opts.split), unit u just read and hash-checked: keep rows
   [lo, hi) of each split matrix and of its scales, and on a rank other than 0 nothing else. */
static void keep_slices(k3_weights *w, int u)
{
    const trunk_unit *un = &w->units[u];
    uint8_t *keep = calloc(un->n, 1);                  /* [n] 0: all the tensor's pages go back */
    for (uint32_t k = 0; k < un->n && keep; k++) keep[k] = w->o.rank == 0 || w->tensors[un->ti[k]].split;
    for (uint32_t k = 0; k < un->n; k++) {
        const k3_tensor *t = &w->tensors[un->ti[k]];
        uint32_t s = w->tscale ? w->tscale[un->ti[k]] : UINT32_MAX;
        if (!t->split) continue;
        const k3_mf_tensor *mt = &w->mf.tensors[un->ti[k]];
        uint64_t rb = mt->size / t->mat.rows;
        drop_pages(t->mat.data, t->lo * rb);
        drop_pages((const uint8_t *)t->mat.data + t->hi * rb, mt->size - t->hi * rb);
        if (s != UINT32_MAX) {                         /* its scales: [rows][cols / 32] */
            uint64_t sb = t->mat.cols / 32;
            drop_pages(t->mat.scales, t->lo * sb);
            drop_pages(t->mat.scales + t->hi * sb, (t->mat.rows - t->hi) * sb);
            for (uint32_t j = 0; j < un->n && keep; j++)
                if (un->ti[j] == s) keep[j] = 2;       /* sliced above, not dropped whole */
        }
    }
    for (uint32_t k = 0; k < un->n && keep; k++)
        if (!keep[k] && un->pos[k] != UINT64_MAX)
            drop_pages(w->tensors[un->ti[k]].mat.data, w->mf.tensors[un->ti[k]].size);
    free(keep);
}

/* Read every resident unit now (all queued at once, the readers work in parallel; with the trunk
   split, one unit at a time, each cut to this rank's slices before the next is read, so memory
   never holds more than one whole unit); set up the stream buffers and start reading the first
   piece. */
k3_err k3w_load_units(k3_weights *w, k3_progress *pg, k3_diag *d)
{
    uint32_t nu = w->n_layers + 1;
    uint64_t big = 0, small = 0;
    const int slices = w->o.split && w->o.ranks > 1;
    for (uint32_t u = 0; u < nu; u++) {
        trunk_unit *un = &w->units[u];
        if (un->streamed) {
            if (un->small > small) small = un->small;
            continue;
        }
        if (!(un->mem = page_alloc(un->bytes)))
            return k3_fail(d, K3_ERR_NOMEM, "out of memory for the trunk of %s %u (%" PRIu64 " bytes)",
                           u < w->n_layers ? "layer" : "the head", u, un->bytes);
        submit_tensors(w, (int)u, un->mem);
        if (!slices) continue;
        k3_err e = wait_tensors(w, (int)u, pg, d);
        place(w, (int)u, un->mem);
        if (e) return e;
        keep_slices(w, (int)u);
    }
    for (uint32_t p = 0; p < w->n_pieces; p++)
        if (w->pieces[p].bytes > big) big = w->pieces[p].bytes;
    k3_err e = K3_OK;
    for (uint32_t u = 0; u < nu && !slices; u++) {
        if (w->units[u].streamed) continue;
        k3_err eu = wait_tensors(w, (int)u, pg, d);    /* wait for all, even after a failure */
        if (!e) e = eu;
        place(w, (int)u, w->units[u].mem);
    }
    if (e) return e;
    for (int b = 0; b < 2; b++) {
        if (big && !(w->sb[b].mem = page_alloc(big)))
            return k3_fail(d, K3_ERR_NOMEM, "out of memory for the trunk stream buffers (2 x %" PRIu64 " bytes)", big);
        if (small && !(w->ssb[b].mem = page_alloc(small)))
            return k3_fail(d, K3_ERR_NOMEM, "out of memory for the trunk's small-part buffers (2 x %" PRIu64
                           " bytes)", small);
    }
    if (w->n_pieces) {
        const stream_piece *p0 = &w->pieces[0];
        if (w->units[p0->unit].split) submit_small(w, 0, (int)p0->unit);
        submit_piece(w, 0, 0);
    }
    return K3_OK;
}

void k3w_units_free(k3_weights *w)
{
    if (w->units)
        for (uint32_t u = 0; u <= w->n_layers; u++) {
            if (!w->units[u].streamed) free(w->units[u].mem);
            free(w->units[u].ti);
            free(w->units[u].pos);
        }
    free(w->units);
    for (int b = 0; b < 2; b++) {
        free(w->sb[b].mem);
        free(w->ssb[b].mem);
    }
    if (w->thash)
        for (uint32_t i = 0; i < w->mf.n_tensors; i++) k3_hasher64_free(w->thash[i]);
    free(w->thash);
    free(w->thashed);
    free(w->tpiece);
    free(w->trows);
    free(w->pieces);
}

void k3w_pass_end(k3_weights *w)
{
    if (w->cur_unit >= 0) w->units[w->cur_unit].seconds += k3_now() - w->unit_t0;
    w->cur_unit = -1;
}

void k3w_unit_seconds(const k3_weights *w, double *out)
{
    for (uint32_t u = 0; u <= w->n_layers; u++) out[u] = w->units[u].seconds;
}

k3_err k3w_check(k3_weights *w, k3_diag *d)
{
    k3_err e = w->err;
    if (!e) return K3_OK;
    w->err = K3_OK;
    if (d) *d = w->err_d;
    return e;
}

k3_err k3w_layer_begin(k3_weights *w, int layer, k3_diag *d)
{
    k3_err e = k3w_check(w, d);
    if (e) return e;
    if (layer < -1 || layer >= (int)w->n_layers) return k3_fail(d, K3_ERR_INTERNAL, "no layer %d", layer);
    int u = layer < 0 ? (int)w->n_layers : layer;
    double t0 = k3_now();
    k3w_pass_end(w);
    w->cur_unit = u;
    w->unit_t0 = t0;
    trunk_unit *un = &w->units[u];
    if (!un->streamed) return K3_OK;
    if (un->split) e = begin_split(w, u, d);
    else {
        int b = take_piece(w, (int)un->piece0, &e, d);
        if (b >= 0) place(w, u, w->sb[b].mem);
    }
    w->st.wait_seconds += k3_now() - t0;
    return e;
}

int k3w_rows(k3_weights *w, const k3_tensor *t, uint32_t r0, k3_mat *view, uint32_t *r1)
{
    *view = t->mat;
    if (t->enc == K3_ENC_Q8 && t->mat.scales) view->scales = t->mat.scales + (size_t)r0 * (t->mat.cols / 32);
    if (t->mat.data) {                                 /* in memory: all of the rest */
        size_t rb = t->enc == K3_ENC_F32 ? 4 : t->enc == K3_ENC_Q8 ? 1 : 2;
        view->data = (const uint8_t *)t->mat.data + (size_t)r0 * t->mat.cols * rb;
        view->rows = t->mat.rows - r0;
        *r1 = t->mat.rows;
        return 0;
    }
    if (w->err) return 1;                              /* the pass already failed */
    uint32_t ti = (uint32_t)(t - w->tensors);
    int cu = w->cur_unit;
    const stream_piece *pc = NULL;
    if (w->trows && w->trows[ti] && r0 % w->trows[ti] == 0) {
        pc = &w->pieces[w->tpiece[ti] + r0 / w->trows[ti]];
        if ((int)pc->unit != cu || pc->ti != ti) pc = NULL;
    }
    if (!pc) {
        w->err = k3_fail(&w->err_d, K3_ERR_INTERNAL, "tensor '%s' (rows from %u) is not in memory in unit %d",
                         t->name, r0, cu);
        return 1;
    }
    double t0 = k3_now();
    int p = (int)(pc - w->pieces), b = take_piece(w, p, &w->err, &w->err_d);
    w->st.wait_seconds += k3_now() - t0;
    if (b < 0) return 1;
    view->data = w->sb[b].mem;
    view->rows = pc->r1 - pc->r0;
    *r1 = pc->r1;
    return 0;
}

/* A tensor of the next unit for the lookahead (weights.h): a whole streamed unit read ahead
   into the other piece buffer, or a split unit's small part read ahead. */
const k3_tensor *k3w_get_ahead(k3_weights *w, int layer, k3_wid id, k3_tensor *tmp)
{
    if (layer < -1 || layer >= (int)w->n_layers) return NULL;
    const k3_tensor *t = w->idx[layer + 1][id];
    if (!t || t->mat.data) return t;                   /* absent, or in memory (resident, or current) */
    int u = layer < 0 ? (int)w->n_layers : layer;
    trunk_unit *un = &w->units[u];
    if (!un->streamed) return NULL;
    uint32_t ti = (uint32_t)(t - w->tensors), k = 0;
    while (k < un->n && un->ti[k] != ti) k++;
    if (k == un->n || un->pos[k] == UINT64_MAX) return NULL;   /* read in row pieces: not ahead */
    uint8_t *mem;
    int pending;
    if (un->split) {
        int s = small_buf_of(w, u);
        if (s < 0) return NULL;
        mem = w->ssb[s].mem;
        pending = w->ssb[s].pending;
    } else {
        int b = piece_buf(w, (int)un->piece0);
        if (b < 0) return NULL;                        /* not read yet: k3w_layer_begin will */
        mem = w->sb[b].mem;
        pending = w->sb[b].pending;
    }
    if (pending) {                                     /* the one tensor's read; layer_begin takes the rest */
        double t0 = k3_now();
        int bad = k3io_wait(w->io, &w->tjob[ti]);
        w->st.wait_seconds += k3_now() - t0;
        if (bad) return NULL;
    }
    *tmp = *t;
    tmp->mat.data = mem + un->pos[k];
    return tmp;
}

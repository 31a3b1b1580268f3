/*
 * pack_write.c - writing shards: a temporary file per shard, sized up front
 * (padding is zero by construction), header first, then each checkpoint
 * tensor's bytes at its planned offset (copied, or quantized row by row).
 * When a shard is complete it is read back once to compute every hash the
 * manifest records (so the manifest describes what is on disk), fsynced,
 * renamed into place, and journalled.
 */
#include "pack.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3_log.h"
#include "quant_q8.h"

#define PK_HASH_BUF (8u << 20)

k3_err pk_writer_init(pk_writer *w, const pk_plan *p, const char *out_dir, int json, k3_diag *d)
{
    memset(w, 0, sizeof *w);
    w->p = p;
    w->out_dir = out_dir;
    w->json = json;
    w->af = calloc(p->n_shards, sizeof *w->af);
    w->done = calloc(p->n_shards, 1);
    w->placed = calloc(p->n_shards + 1, 1);
    w->resumed = calloc(p->n_shards, 1);
    w->remaining = calloc(p->n_shards, sizeof *w->remaining);
    w->hashes = calloc(p->n_shards, sizeof *w->hashes);
    if (!w->af || !w->done || !w->placed || !w->resumed || !w->remaining || !w->hashes) {
        pk_writer_free(w);
        return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    }
    w->copied.fd = -1;
    for (uint32_t s = 0; s < p->n_shards; s++) {
        w->af[s].fd = -1;
        w->remaining[s] = p->shards[s].n_items;
    }
    pthread_mutex_init(&w->lock, NULL);
    /* fingerprint: format version, expert handling and config.json decide the bytes of every shard */
    k3_hasher *h = k3_hasher_new();
    if (!h) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    uint8_t tag[16] = "k3pack-1";
    tag[12] = (uint8_t)p->experts;
    tag[13] = (uint8_t)p->quantize;
    tag[14] = p->in_place != NULL;            /* --experts-in-place: other shards, another manifest */
    tag[15] = (uint8_t)p->trunk_q8;            /* --trunk q8 */
    k3_hasher_update(h, tag, sizeof tag);
    k3_hasher_update(h, p->config_text, p->config_len);
    k3_hex128(k3_hasher_digest(h), w->fingerprint);
    k3_hasher_free(h);
    return K3_OK;
}

void pk_writer_free(pk_writer *w)
{
    if (w->hashes)
        for (uint32_t s = 0; s < w->p->n_shards; s++) k3_shard_hashes_free(&w->hashes[s]);
    free(w->af);
    free(w->done);
    free(w->resumed);
    free(w->remaining);
    free(w->placed);
    free(w->ip_left);
    free(w->hashes);
    for (uint32_t i = 0; i < w->n_src_files; i++) free(w->src_files[i].name);
    free(w->src_files);
    if (w->p) pthread_mutex_destroy(&w->lock);
    memset(w, 0, sizeof *w);
}

void pk_writer_abort(pk_writer *w)
{
    for (uint32_t s = 0; w->af && s < w->p->n_shards; s++)
        if (w->af[s].fd >= 0) k3_atomic_abort(&w->af[s]);
    if (w->copied.fd >= 0) k3_atomic_abort(&w->copied);
}

k3_err pk_shard_begin(pk_writer *w, uint32_t s, k3_diag *d)
{
    pk_shard *sh = (pk_shard *)&w->p->shards[s];
    k3_err e = k3_atomic_open(&w->af[s], w->out_dir, sh->name, d);
    if (e) return e;
    int fd = w->af[s].fd;
    uint8_t *img;
    size_t len;
    if ((e = k3_shard_encode(&sh->h, &img, &len, d))) goto fail;
    if (ftruncate(fd, (off_t)sh->h.file_size) != 0) {
        free(img);
        e = k3_fail(d, errno == ENOSPC || errno == EFBIG ? K3_ERR_NOSPACE : K3_ERR_IO, "cannot size '%s' to %llu bytes: %s",
                    w->af[s].tmp_path, (unsigned long long)sh->h.file_size, strerror(errno));
        goto fail;
    }
    e = k3_pwrite_full(fd, img, len, 0, w->af[s].tmp_path, d);
    free(img);
    if (e) goto fail;
    return K3_OK;
fail:
    k3_atomic_abort(&w->af[s]);
    return e;
}

k3_err pk_feed_begin(pk_feed *f, const pk_item *it, k3_diag *d)
{
    memset(f, 0, sizeof *f);
    f->it = it;
    if (it->op != PK_COPY) {
        if (it->cols % 32) return k3_fail(d, K3_ERR_MODEL, "tensor '%s': %llu columns is not a multiple of 32",
                                          it->src_name, (unsigned long long)it->cols);
        f->row = malloc(it->cols * 2);
        f->packed = malloc(it->op == PK_QUANT8 ? it->cols : it->cols / 2);
        f->scales = malloc(it->rows * (it->cols / 32) + 1);
        if (!f->row || !f->packed || !f->scales) {
            pk_feed_free(f);
            return k3_fail(d, K3_ERR_NOMEM, "out of memory");
        }
    }
    return K3_OK;
}

void pk_feed_free(pk_feed *f)
{
    free(f->row);
    free(f->packed);
    free(f->scales);
    f->row = f->packed = f->scales = NULL;
}

static k3_err quant_row(pk_writer *w, pk_feed *f, k3_diag *d)
{
    const pk_item *it = f->it;
    k3_quant_stats st = {0};
    uint8_t *sc = f->scales + f->r * (it->cols / 32);
    size_t out = it->op == PK_QUANT8 ? (size_t)it->cols : (size_t)(it->cols / 2);     /* bytes of a row */
    long bad = it->op == PK_QUANT8 ? k3_quant_q8_row(f->row, (size_t)it->cols, (int8_t *)f->packed, sc, &st)
                                   : k3_quant_mxfp4_row(f->row, (size_t)it->cols, f->packed, sc, &st);
    if (bad >= 0)
        return k3_fail(d, K3_ERR_FORMAT, "tensor '%s': element [%llu, %ld] is NaN or infinite; cannot quantize it",
                       it->src_name, (unsigned long long)f->r, bad);
    pthread_mutex_lock(&w->lock);
    k3_quant_stats *qs = it->op == PK_QUANT8 ? &w->q8stats : &w->qstats;
    qs->err2 += st.err2;
    qs->ref2 += st.ref2;
    qs->n += st.n;
    qs->saturated += st.saturated;
    pthread_mutex_unlock(&w->lock);
    k3_atomic_file *af = &w->af[it->shard];
    k3_err e = k3_pwrite_full(af->fd, f->packed, out, it->dst_off + f->r * out, af->tmp_path, d);
    f->r++;
    f->row_fill = 0;
    return e;
}

k3_err pk_feed_data(pk_writer *w, pk_feed *f, const uint8_t *buf, size_t n, k3_diag *d)
{
    const pk_item *it = f->it;
    if (f->got + n > it->src_bytes)
        return k3_fail(d, K3_ERR_FORMAT, "tensor '%s': more than its %llu bytes", it->src_name,
                       (unsigned long long)it->src_bytes);
    k3_atomic_file *af = &w->af[it->shard];
    k3_err e = K3_OK;
    if (it->op == PK_COPY) {
        /* FORMAT.md 3: an E8M0 scale of 255 is NaN and has no place in a pack */
        const uint8_t *ff = w->p->shards[it->shard].h.entries[it->entry].encoding == K3_ENC_E8M0
                                ? memchr(buf, 0xFF, n) : NULL;
        if (ff)
            return k3_fail(d, K3_ERR_FORMAT, "tensor '%s': scale byte %llu is 255, NaN in E8M0; the checkpoint is "
                           "damaged", it->src_name, (unsigned long long)(f->got + (uint64_t)(ff - buf)));
        e = k3_pwrite_full(af->fd, buf, n, it->dst_off + f->got, af->tmp_path, d);
    } else {
        size_t row_bytes = (size_t)it->cols * 2, i = 0;
        while (i < n && !e) {
            size_t take = row_bytes - f->row_fill;
            if (take > n - i) take = n - i;
            memcpy(f->row + f->row_fill, buf + i, take);
            f->row_fill += take;
            i += take;
            if (f->row_fill == row_bytes) e = quant_row(w, f, d);
        }
    }
    f->got += n;
    return e;
}

k3_err pk_feed_end(pk_writer *w, pk_feed *f, int *last, k3_diag *d)
{
    const pk_item *it = f->it;
    if (f->got != it->src_bytes)
        return k3_fail(d, K3_ERR_FORMAT, "tensor '%s': got %llu bytes, expected %llu", it->src_name,
                       (unsigned long long)f->got, (unsigned long long)it->src_bytes);
    k3_err e = K3_OK;
    if (it->op != PK_COPY) {
        const pk_shard *sh = &w->p->shards[it->shard];
        k3_atomic_file *af = &w->af[it->shard];
        uint64_t off = it->op == PK_QUANT8 ? sh->h.entries[it->entry + 1].offset         /* trunk: absolute */
                     : sh->h.data_offset + it->record * sh->h.record_stride + sh->h.entries[it->entry + 1].offset;
        e = k3_pwrite_full(af->fd, f->scales, (size_t)(it->rows * (it->cols / 32)), off, af->tmp_path, d);
    }
    pthread_mutex_lock(&w->lock);
    w->remaining[it->shard]--;
    if (last) *last = w->remaining[it->shard] == 0;
    w->bytes_done += it->src_bytes;
    char detail[96];
    snprintf(detail, sizeof detail, "shard %u/%u %s", w->shards_done + 1, w->p->n_shards, w->p->shards[it->shard].name);
    k3_progress_update(&w->prog, w->bytes_done, detail);
    pthread_mutex_unlock(&w->lock);
    return e;
}

k3_err pk_shard_finish(pk_writer *w, uint32_t s, k3_diag *d)
{
    const pk_shard *sh = &w->p->shards[s];
    k3_atomic_file *af = &w->af[s];
    k3_err e = k3_shard_hash(af->fd, af->tmp_path, &sh->h, PK_HASH_BUF, 1, NULL, NULL, &w->hashes[s], d);
    if (e) { k3_atomic_abort(af); return e; }
    if (w->hashes[s].bad_padding != UINT64_MAX) {
        k3_atomic_abort(af);
        return k3_fail(d, K3_ERR_INTERNAL, "'%s': padding at offset %llu is not zero after writing", sh->name,
                       (unsigned long long)w->hashes[s].bad_padding);
    }
    if ((e = k3_atomic_commit(af, d))) return e;
    af->fd = -1;
    pthread_mutex_lock(&w->lock);
    w->done[s] = 1;
    w->shards_done++;
    e = pk_journal_write(w, d);
    if (w->json) {
        char hex[33];
        k3_hex128(w->hashes[s].file, hex);
        k3_progress_end(&w->prog);
        printf("{\"schema\":1,\"type\":\"shard\",\"name\":\"%s\",\"status\":\"written\",\"size\":%llu,\"xxh3_128\":\"%s\"}\n",
               sh->name, (unsigned long long)sh->h.file_size, hex);
        fflush(stdout);
    } else {
        k3_info("wrote '%s' (%llu bytes)", sh->name, (unsigned long long)sh->h.file_size);
    }
    pthread_mutex_unlock(&w->lock);
    return e;
}

k3_err pk_add_src_file(pk_writer *w, const char *name, uint64_t size, const uint8_t sha256[32], k3_diag *d)
{
    pthread_mutex_lock(&w->lock);
    k3_mf_srcfile *n = realloc(w->src_files, (w->n_src_files + 1) * sizeof *n);
    char *nm = n ? strdup(name) : NULL;
    if (n) w->src_files = n;
    if (nm) {
        k3_mf_srcfile *f = &w->src_files[w->n_src_files++];
        f->name = nm;
        f->size = size;
        memcpy(f->sha256, sha256, 32);
    }
    pthread_mutex_unlock(&w->lock);
    return nm ? K3_OK : k3_fail(d, K3_ERR_NOMEM, "out of memory");
}

/*
 * pack_stream.c - one .safetensors file streamed into the pack, front to back
 * (pack.h "Streaming a safetensors file"): its header parsed as it arrives,
 * then each tensor's bytes fed to its planned place in its shard (pwrite, in
 * whatever order the file holds them), a shard finished (hashed, renamed,
 * journalled) when its last tensor has arrived (an --experts-in-place layer's
 * tensors go to pack_in_place.c instead), and every byte - header,
 * tensors, skipped vision tensors - hashed with SHA-256 on the way, so the
 * download is checked against its publisher's hash in the one read that packs
 * it. The archive source (an entry of a tar) and the checkpoint directory
 * source (a file, several at once with --threads) both stream through here.
 */
#include "pack.h"

#include <stdlib.h>
#include <string.h>

#include "k3_ckpt_check.h"
#include "k3_log.h"

void pk_entry_begin(pk_entry *es, const char *name, uint64_t size, uint32_t entry_no, const k3_dl_want *want)
{
    memset(es, 0, sizeof *es);
    es->name = name;
    es->size = size;
    es->entry_no = entry_no;
    es->want = want;
    es->hdr_need = 8;
    k3_dl_hash_begin(&es->sha, want, size);
}

void pk_entry_free(pk_entry *es)
{
    if (es->feeding) pk_feed_free(&es->feed);
    free(es->hdr);
    k3_hasher64_free(es->ip_h);
    es->ip_h = NULL;
    if (es->parsed) k3_st_header_free(&es->h);
    es->hdr = NULL;
    es->parsed = es->feeding = 0;
}

static k3_err start_tensor(pk_stream *st, pk_entry *es, k3_diag *d)
{
    pk_writer *w = st->w;
    const k3_st_tensor *t = &es->h.tensors[es->ti];
    es->cur = pk_plan_find(w->p, t->name);
    if (!es->cur) {
        char esc[300];
        if (k3_is_vision_tensor(t->name)) {              /* hashed, not packed */
            if (!st->skipped) return K3_OK;
            char **sk = realloc(*st->skipped, (*st->n_skipped + 1) * sizeof *sk);
            if (!sk || !(sk[*st->n_skipped] = strdup(t->name))) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
            *st->skipped = sk;
            (*st->n_skipped)++;
            return K3_OK;
        }
        return k3_fail(d, K3_ERR_MODEL, "'%s': tensor '%s' in '%s' is not part of the model config.json describes",
                       st->src, k3_escape(t->name, t->name_len, esc, sizeof esc), es->name);
    }
    k3_err e = pk_item_check(es->cur, t, es->name, d);
    if (e) return e;
    if (st->seen_entry) {
        size_t idx = (size_t)(es->cur - w->p->items);
        if (st->seen_entry[idx]) {
            char esc[300];
            return k3_fail(d, K3_ERR_FORMAT, "'%s': tensor '%s' appears twice (again in '%s')", st->src,
                           k3_escape(t->name, t->name_len, esc, sizeof esc), es->name);
        }
        st->seen_entry[idx] = es->entry_no;
    }
    uint32_t s = es->cur->shard;
    if (w->p->in_place && w->p->in_place[s]) return pk_in_place_tensor(w, es, es->cur, d);   /* no shard file */
    pthread_mutex_lock(&w->lock);                        /* files stream side by side: one begins the shard */
    int done = w->done[s];
    if (!done && w->af[s].fd < 0) e = pk_shard_begin(w, s, d);
    pthread_mutex_unlock(&w->lock);
    if (e) return e;
    if (done) { es->cur = NULL; return K3_OK; }           /* finished by an earlier run */
    if ((e = pk_feed_begin(&es->feed, es->cur, d))) return e;
    es->feeding = 1;
    return K3_OK;
}

static k3_err end_tensor(pk_stream *st, pk_entry *es, k3_diag *d)
{
    k3_err e = K3_OK;
    if (es->ip) e = pk_in_place_tensor_end(st->w, es, d);
    if (es->feeding) {
        int last = 0;
        e = pk_feed_end(st->w, &es->feed, &last, d);
        pk_feed_free(&es->feed);
        es->feeding = 0;
        if (!e && last) e = pk_shard_finish(st->w, es->cur->shard, d);
    }
    es->cur = NULL;
    es->ti++;
    return e;
}

/* From the current tensor on: the empty ones ended, the next one started. */
static k3_err next_tensors(pk_stream *st, pk_entry *es, k3_diag *d)
{
    k3_err e = K3_OK;
    while (!e && es->ti < es->h.n_tensors && es->h.tensors[es->ti].nbytes == 0) {
        e = start_tensor(st, es, d);
        if (!e) e = end_tensor(st, es, d);
    }
    if (!e && es->ti < es->h.n_tensors) e = start_tensor(st, es, d);
    return e;
}

k3_err pk_entry_data(pk_stream *st, pk_entry *es, const uint8_t *p, size_t n, k3_diag *d)
{
    k3_err e = K3_OK;
    if (!es->hash_outside) k3_dl_hash_update(&es->sha, p, n);
    while (n && !e) {
        if (!es->parsed) {                            /* header bytes */
            size_t take = es->hdr_need - es->hdr_fill < n ? es->hdr_need - es->hdr_fill : n;
            if (!es->hdr && !(es->hdr = malloc(8))) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
            memcpy(es->hdr + es->hdr_fill, p, take);
            es->hdr_fill += take;
            p += take;
            n -= take;
            es->pos += take;
            if (es->hdr_fill < es->hdr_need) continue;
            if (es->hdr_need == 8) {                  /* got the length prefix: grow to 8 + N */
                uint64_t N;
                if ((e = k3_st_check_prefix(es->hdr, 8, es->size, es->name, &N, d))) return e;
                uint8_t *nb = realloc(es->hdr, (size_t)(8 + N));   /* [8 + N] the header */
                if (!nb) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
                es->hdr = nb;
                es->hdr_need = (size_t)(8 + N);
                continue;
            }
            if ((e = k3_st_parse_header(es->hdr, es->hdr_fill, es->size, es->name, &es->h, d))) return e;
            es->parsed = 1;
            e = next_tensors(st, es, d);
            continue;
        }
        if (es->ti >= es->h.n_tensors)
            return k3_fail(d, K3_ERR_FORMAT, "'%s': '%s' has bytes after its last tensor", st->src, es->name);
        const k3_st_tensor *t = &es->h.tensors[es->ti];
        uint64_t end = t->offset + t->nbytes;
        size_t take = (size_t)(end - es->pos < n ? end - es->pos : n);
        if (es->feeding) e = pk_feed_data(st->w, &es->feed, p, take, d);
        else if (es->ip) e = pk_in_place_data(st->w, es, p, take, d);
        p += take;
        n -= take;
        es->pos += take;
        if (!e && es->pos == end) {
            e = end_tensor(st, es, d);
            if (!e) e = next_tensors(st, es, d);
        }
    }
    return e;
}

k3_err pk_entry_end(pk_stream *st, pk_entry *es, const char *path, uint8_t sha256[32], k3_diag *d)
{
    if (es->pos != es->size || !es->parsed || es->ti != es->h.n_tensors)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': '%s' is truncated: %llu of %llu bytes", st->src, es->name,
                       (unsigned long long)es->pos, (unsigned long long)es->size);
    return k3_dl_hash_end(&es->sha, es->want, path, sha256, d);
}

/*
 * pack_in_place.c - k3pack --experts-in-place (docs/FORMAT.md section 10): the
 * routed experts stay in the checkpoint's .safetensors files and the manifest
 * locates each record there, so packing needs the trunk's disk space, not the
 * whole model's a second time.
 *
 * pk_plan_in_place decides, layer by layer, from the checkpoint's own layout
 * (the only place the plan looks at it): a layer is read in place when every
 * expert's tensors are adjacent in one file, cover one range exactly, sit at
 * the same offsets in it as expert 0's, start at a multiple of their element
 * size, and need no conversion. Any other layer is copied into its shard as
 * usual. The files then stream front to back as for any pack (pack_stream.c):
 * a record left in place is hashed (XXH3-64, for the manifest) as its parts
 * pass, a record no layer could leave in place is written into
 * PK_COPIED_NAME, and every byte is SHA-256'd in that same read.
 */
#include "pack.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3_hash.h"
#include "k3_log.h"

#define PK_CHUNK (8u << 20)

static unsigned elem_bytes(uint8_t dtype)
{
    switch (dtype) {
    case K3_DT_BF16: case K3_DT_F16: case K3_DT_I16: case K3_DT_U16: return 2;
    case K3_DT_F32: case K3_DT_I32: case K3_DT_U32: return 4;
    case K3_DT_F64: case K3_DT_I64: case K3_DT_U64: return 8;
    default: return 1;
    }
}

/* Record r of shard s as it lies in the checkpoint: its tensors t[], the range [*lo, *lo + *sum)
   they cover. Returns NULL if that range can be read in place (one file, nothing else between
   the tensors, each at a multiple of its element size), else why not (in why). */
static const char *record_range(const pk_plan *p, const pk_shard *sh, uint64_t r, const k3_st_ckpt *ck,
                                const k3_st_tensor **t, uint64_t *lo, uint64_t *sum, char *why, size_t cap)
{
    const uint32_t np = sh->h.n_entries;
    const pk_item *it = &p->items[sh->first_item + r * np];
    uint64_t hi = 0;
    *lo = UINT64_MAX;
    *sum = 0;
    for (uint32_t k = 0; k < np; k++) {
        t[k] = k3_st_find(ck, it[k].src_name);
        if (!t[k] || it[k].record != r || it[k].entry != k || it[k].op != PK_COPY) {
            snprintf(why, cap, "expert %llu's tensors are not as planned", (unsigned long long)r);
            return why;
        }
        if (t[k]->offset < *lo) *lo = t[k]->offset;
        if (t[k]->offset + t[k]->nbytes > hi) hi = t[k]->offset + t[k]->nbytes;
        *sum += t[k]->nbytes;
    }
    for (uint32_t k = 0; k < np; k++) {
        if (t[k]->file != t[0]->file) {
            snprintf(why, cap, "expert %llu's tensors are in two files", (unsigned long long)r);
            return why;
        }
        if (t[k]->offset % elem_bytes(t[k]->dtype)) {
            snprintf(why, cap, "'%s' starts at byte %llu, not a multiple of its element size", t[k]->name,
                     (unsigned long long)t[k]->offset);
            return why;
        }
    }
    if (hi - *lo != *sum) {
        snprintf(why, cap, "expert %llu's tensors are not adjacent in '%s'", (unsigned long long)r,
                 ck->files[t[0]->file].name);
        return why;
    }
    return NULL;
}

/* Can shard s's layer be read in place? The layout of its first record that can be is the
   layer's; a record laid out otherwise (its tensors in two files, say) is marked PK_COPIED, to
   be copied into the pack in that layout. *out stays NULL (the layer is copied into its shard)
   when no record can be read in place, with why. */
static k3_err layer_in_place(const pk_plan *p, uint32_t s, const k3_st_ckpt *ck, pk_in_place **out, char *why,
                             size_t cap, k3_diag *d)
{
    const pk_shard *sh = &p->shards[s];
    const uint32_t np = sh->h.n_entries;
    const uint64_t n = sh->h.n_records;
    *out = NULL;
    if (p->quantize) { snprintf(why, cap, "its experts are quantized to MXFP4"); return K3_OK; }
    if (!n || sh->n_items != n * np || np > K3_MAX_RECORD_PARTS) {
        snprintf(why, cap, "its records are not %u tensors each", np);
        return K3_OK;
    }
    pk_in_place *ip = calloc(1, sizeof *ip);
    if (!ip) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    ip->file = malloc(n * sizeof *ip->file);      /* [n_records] */
    ip->off = malloc(n * sizeof *ip->off);        /* [n_records] */
    if (!ip->file || !ip->off) { pk_in_place_free(ip); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
    int have_layout = 0;
    why[0] = 0;
    uint64_t n_good = 0;
    for (uint64_t r = 0; r < n; r++) {
        const k3_st_tensor *t[K3_MAX_RECORD_PARTS];
        uint64_t lo, sum;
        char rwhy[512];
        const char *bad = record_range(p, sh, r, ck, t, &lo, &sum, rwhy, sizeof rwhy);
        if (!bad && !have_layout) {
            ip->record_size = sum;
            for (uint32_t k = 0; k < np; k++) ip->part_off[k] = t[k]->offset - lo;
            have_layout = 1;
        }
        for (uint32_t k = 0; !bad && k < np; k++)
            if (t[k]->offset - lo != ip->part_off[k] || sum != ip->record_size) {
                snprintf(rwhy, sizeof rwhy, "expert %llu's tensors are laid out unlike the others", (unsigned long long)r);
                bad = rwhy;
            }
        ip->file[r] = bad ? PK_COPIED : t[0]->file;
        ip->off[r] = bad ? 0 : lo;
        n_good += !bad;
        if (bad && !why[0]) snprintf(why, cap, "%s", bad);  /* the first, as an example */
    }
    if (!n_good) { pk_in_place_free(ip); return K3_OK; }
    if (n_good < n)
        k3_info("layer %lld: %llu of %llu expert records are copied into the pack (%s, for example)",
                (long long)sh->layer, (unsigned long long)(n - n_good), (unsigned long long)n, why);
    *out = ip;
    return K3_OK;
}

/* Lay out PK_COPIED_NAME: a safetensors file holding the copied records' tensors under their
   checkpoint names, each record in its layer's layout, at a multiple of 64 bytes (a U8 tensor
   "k3pack.pad.N" fills a gap), after a header padded with spaces to a multiple of 4 KiB. */
static k3_err plan_copied(pk_plan *p, const k3_st_ckpt *ck, k3_diag *d)
{
    uint64_t n = 0;
    for (uint32_t s = 0; s < p->n_shards; s++)
        for (uint64_t r = 0; p->in_place[s] && r < p->shards[s].h.n_records; r++) n += p->in_place[s]->file[r] == PK_COPIED;
    if (!n) return K3_OK;
    p->copied = malloc(n * sizeof *p->copied);                       /* [n_copied] */
    json_t *root = json_object(), *meta = json_object();
    if (!p->copied || !root || !meta) { json_decref(root); json_decref(meta); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(meta, "k3pack", json_string("expert records copied for --experts-in-place (docs/FORMAT.md 10)"));
    json_object_set_new(root, "__metadata__", meta);
    uint64_t at = 0, n_pad = 0;                                      /* offsets in the data region */
    for (uint32_t s = 0; s < p->n_shards; s++) {
        const pk_shard *sh = &p->shards[s];
        pk_in_place *ip = p->in_place[s];
        for (uint64_t r = 0; ip && r < sh->h.n_records; r++) {
            if (ip->file[r] != PK_COPIED) continue;
            p->copied[p->n_copied++] = (pk_copied){s, r};
            ip->off[r] = at;                                         /* made absolute below */
            for (uint32_t k = 0; k < sh->h.n_entries; k++) {
                const pk_item *it = &p->items[sh->first_item + r * sh->h.n_entries + k];
                const k3_st_tensor *t = k3_st_find(ck, it->src_name);
                json_t *o = json_object(), *shape = json_array(), *offs = json_array();
                for (unsigned q = 0; q < t->rank; q++) json_array_append_new(shape, json_integer((json_int_t)t->shape[q]));
                json_array_append_new(offs, json_integer((json_int_t)(at + ip->part_off[k])));
                json_array_append_new(offs, json_integer((json_int_t)(at + ip->part_off[k] + t->nbytes)));
                json_object_set_new(o, "dtype", json_string(k3_dtype_name((k3_dtype)t->dtype)));
                json_object_set_new(o, "shape", shape);
                json_object_set_new(o, "data_offsets", offs);
                json_object_set_new(root, it->src_name, o);
            }
            at += ip->record_size;
            if (at % 64) {
                char name[48];
                uint64_t pad = 64 - at % 64;
                snprintf(name, sizeof name, "k3pack.pad.%llu", (unsigned long long)n_pad++);
                json_t *o = json_object(), *shape = json_array(), *offs = json_array();
                json_array_append_new(shape, json_integer((json_int_t)pad));
                json_array_append_new(offs, json_integer((json_int_t)at));
                json_array_append_new(offs, json_integer((json_int_t)(at + pad)));
                json_object_set_new(o, "dtype", json_string("U8"));
                json_object_set_new(o, "shape", shape);
                json_object_set_new(o, "data_offsets", offs);
                json_object_set_new(root, name, o);
                at += pad;
            }
        }
    }
    char *js = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!js) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    uint64_t jl = strlen(js), hs = (8 + jl + 4095) / 4096 * 4096;
    p->copied_header = malloc(hs);                                   /* [copied_header_size] */
    if (!p->copied_header) { free(js); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
    memset(p->copied_header, ' ', hs);
    for (int i = 0; i < 8; i++) p->copied_header[i] = (char)(uint8_t)((hs - 8) >> (8 * i));
    memcpy(p->copied_header + 8, js, jl);
    free(js);
    p->copied_header_size = hs;
    p->copied_size = hs + at;
    for (uint64_t i = 0; i < p->n_copied; i++) p->in_place[p->copied[i].shard]->off[p->copied[i].record] += hs;
    p->total_bytes += p->copied_size;
    return K3_OK;
}

k3_err pk_plan_in_place(pk_plan *p, const k3_st_ckpt *ck, k3_diag *d)
{
    p->in_place = calloc(p->n_shards + 1, sizeof *p->in_place);      /* [n_shards] */
    if (!p->in_place) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    char real[PATH_MAX];
    if (!realpath(ck->dir, real))
        return k3_fail(d, K3_ERR_IO, "cannot resolve the checkpoint directory '%s': %s", ck->dir, strerror(errno));
    if (!(p->ckpt_dir = strdup(real))) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    p->src_header_size = malloc((ck->n_files + 1) * sizeof *p->src_header_size);   /* [n_files] */
    if (!p->src_header_size) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < ck->n_files; i++) p->src_header_size[i] = 8 + ck->files[i].header_len;
    for (uint32_t s = 0; s < p->n_shards; s++) {
        if (p->shards[s].h.kind != K3_SHARD_EXPERTS) continue;
        char why[512] = "";
        k3_err e = layer_in_place(p, s, ck, &p->in_place[s], why, sizeof why, d);
        if (e) return e;
        if (!p->in_place[s]) {
            k3_info("layer %lld's experts are copied into '%s': %s", (long long)p->shards[s].layer,
                    p->shards[s].name, why);
            continue;
        }
        p->n_in_place++;
        p->total_bytes -= p->shards[s].h.file_size;
        for (uint64_t r = 0; r < p->shards[s].h.n_records; r++)
            if (p->in_place[s]->file[r] != PK_COPIED) p->in_place_bytes += p->in_place[s]->record_size;
    }
    return plan_copied(p, ck, d);
}

/* order[0..n): the shard entries of an in-place layer by their offset in its record. */
static void part_order(const pk_in_place *ip, uint32_t n, uint32_t *order)
{
    for (uint32_t k = 0; k < n; k++) {
        uint32_t j = k;
        while (j > 0 && ip->part_off[order[j - 1]] > ip->part_off[k]) { order[j] = order[j - 1]; j--; }
        order[j] = k;
    }
}

k3_err pk_in_place_begin(pk_writer *w, k3_diag *d)
{
    const pk_plan *p = w->p;
    if (!(w->ip_left = calloc(p->n_shards + 1, sizeof *w->ip_left)))
        return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (uint32_t s = 0; s < p->n_shards; s++) {
        const pk_in_place *ip = p->in_place[s];
        if (!ip) continue;
        uint64_t n = p->shards[s].h.n_records;
        free(w->hashes[s].record);
        if (!(w->hashes[s].record = calloc(n + 1, sizeof *w->hashes[s].record)))   /* [n_records] */
            return k3_fail(d, K3_ERR_NOMEM, "out of memory");
        for (uint64_t r = 0; r < n; r++) w->ip_left[s] += ip->file[r] != PK_COPIED;
        if (!w->ip_left[s]) {                     /* every record copied: nothing to wait for */
            w->placed[s] = 1;
            w->shards_done++;
        }
    }
    if (!p->n_copied) return K3_OK;
    k3_err e = k3_atomic_open(&w->copied, w->out_dir, PK_COPIED_NAME, d);
    if (!e) e = k3_pwrite_full(w->copied.fd, p->copied_header, (size_t)p->copied_header_size, 0, w->copied.tmp_path, d);
    if (!e && ftruncate(w->copied.fd, (off_t)p->copied_size) != 0)
        e = k3_fail(d, K3_ERR_IO, "cannot size '%s': %s", w->copied.tmp_path, strerror(errno));
    if (e && w->copied.fd >= 0) k3_atomic_abort(&w->copied);
    return e;
}

k3_err pk_in_place_tensor(pk_writer *w, pk_entry *es, const pk_item *it, k3_diag *d)
{
    const pk_shard *sh = &w->p->shards[it->shard];
    const pk_in_place *ip = w->p->in_place[it->shard];
    uint64_t i = (uint64_t)(it - w->p->items) - sh->first_item, np = sh->h.n_entries;
    es->ip_shard = it->shard;
    es->ip_rec = i / np;
    es->ip_part = (uint32_t)(i % np);
    es->ip_got = 0;
    es->ip = ip->file[es->ip_rec] == PK_COPIED ? 2 : 1;
    if (es->ip == 1 && ip->part_off[es->ip_part] == 0) {   /* a record's first part: its hash begins */
        if (!es->ip_h && !(es->ip_h = k3_hasher64_new())) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
        k3_hasher64_reset(es->ip_h);
    }
    return K3_OK;
}

k3_err pk_in_place_data(pk_writer *w, pk_entry *es, const uint8_t *p, size_t n, k3_diag *d)
{
    const pk_shard *sh = &w->p->shards[es->ip_shard];
    const pk_in_place *ip = w->p->in_place[es->ip_shard];
    const k3_shard_entry *en = &sh->h.entries[es->ip_part];
    const uint8_t *bad = en->encoding == K3_ENC_E8M0 ? memchr(p, 0xFF, n) : NULL;   /* FORMAT.md 3 */
    if (bad)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': expert %llu of layer %lld: scale byte %llu of '%.*s' is 255, NaN in "
                       "E8M0; the checkpoint is invalid", es->name, (unsigned long long)es->ip_rec,
                       (long long)sh->layer, (unsigned long long)(es->ip_got + (uint64_t)(bad - p)),
                       (int)en->name_len, en->name);
    k3_err e = K3_OK;
    if (es->ip == 1) {
        if (!es->ip_h) return k3_fail(d, K3_ERR_INTERNAL, "'%s': a record of layer %lld began mid-way", es->name,
                                      (long long)sh->layer);
        k3_hasher64_update(es->ip_h, p, n);
    } else {
        e = k3_pwrite_full(w->copied.fd, p, n, ip->off[es->ip_rec] + ip->part_off[es->ip_part] + es->ip_got,
                           w->copied.tmp_path, d);
    }
    es->ip_got += n;
    return e;
}

k3_err pk_in_place_tensor_end(pk_writer *w, pk_entry *es, k3_diag *d)
{
    const pk_shard *sh = &w->p->shards[es->ip_shard];
    const pk_in_place *ip = w->p->in_place[es->ip_shard];
    const k3_shard_entry *en = &sh->h.entries[es->ip_part];
    uint32_t s = es->ip_shard;
    int last = es->ip == 1 && ip->part_off[es->ip_part] + en->size == ip->record_size;
    pthread_mutex_lock(&w->lock);
    if (last) {                                   /* the record's last part: its hash is complete */
        w->hashes[s].record[es->ip_rec] = k3_hasher64_digest(es->ip_h);
        if (--w->ip_left[s] == 0) {
            w->placed[s] = 1;
            w->shards_done++;
        }
    }
    w->bytes_done += es->ip_got;
    char detail[128];
    snprintf(detail, sizeof detail, "layer %lld's experts, in place", (long long)sh->layer);
    k3_progress_update(&w->prog, w->bytes_done, detail);
    pthread_mutex_unlock(&w->lock);
    es->ip = 0;
    (void)d;
    return K3_OK;
}

/* PK_COPIED_NAME complete: each copied record hashed as it will be read (its bytes in offset order:
   the layout has no gaps), from the file just written (the pack's own bytes, not the download's). */
static k3_err hash_copies(pk_writer *w, k3_diag *d)
{
    const pk_plan *p = w->p;
    uint8_t *buf = malloc(PK_CHUNK);                                 /* [PK_CHUNK] */
    k3_hasher64 *h = k3_hasher64_new();
    k3_err e = buf && h ? K3_OK : k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < p->n_copied && !e; i++) {
        const pk_in_place *ip = p->in_place[p->copied[i].shard];
        uint64_t r = p->copied[i].record;
        k3_hasher64_reset(h);
        for (uint64_t pos = 0; pos < ip->record_size && !e; pos += PK_CHUNK) {
            size_t n = (size_t)(ip->record_size - pos < PK_CHUNK ? ip->record_size - pos : PK_CHUNK);
            if (!(e = k3_pread_full(w->copied.fd, buf, n, ip->off[r] + pos, w->copied.tmp_path, d)))
                k3_hasher64_update(h, buf, n);
        }
        if (!e) w->hashes[p->copied[i].shard].record[r] = k3_hasher64_digest(h);
    }
    k3_hasher64_free(h);
    free(buf);
    return e;
}

k3_err pk_in_place_finish(pk_writer *w, k3_diag *d)
{
    const pk_plan *p = w->p;
    for (uint32_t s = 0; s < p->n_shards; s++)
        if (p->in_place[s] && !w->placed[s])
            return k3_fail(d, K3_ERR_INTERNAL, "layer %lld: %llu records left in place never arrived",
                           (long long)p->shards[s].layer, (unsigned long long)w->ip_left[s]);
    if (!p->n_copied) return K3_OK;
    k3_err e = hash_copies(w, d);
    if (e) return e;
    return k3_atomic_commit(&w->copied, d);
}

/*
 * The manifest's part of an in-place pack: checkpoint_files (the files holding a record, in the
 * checkpoint's name order, with their header hashes from the resume fingerprint's inputs) and
 * expert layer x of shard s described in place.
 */
k3_err pk_manifest_sources(const pk_writer *w, k3_manifest *m, uint32_t *src_of, k3_diag *d)
{
    const pk_plan *p = w->p;
    uint32_t nf = (uint32_t)w->n_inputs;
    uint8_t *used = calloc(nf + 1, 1);                               /* [n_inputs] */
    if (!used) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (uint32_t s = 0; s < p->n_shards; s++)
        for (uint64_t r = 0; p->in_place[s] && r < p->shards[s].h.n_records; r++)
            if (p->in_place[s]->file[r] < nf) used[p->in_place[s]->file[r]] = 1;
    m->sources = calloc(nf + 2, sizeof *m->sources);               /* [files used + the copies] */
    if (!m->sources) { free(used); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
    for (uint32_t i = 0; i < nf; i++) {
        src_of[i] = UINT32_MAX;
        if (!used[i]) continue;
        k3_mf_source *f = &m->sources[m->n_sources];
        f->name = (char *)w->inputs[i].name;
        f->size = w->inputs[i].size;
        f->header_size = p->src_header_size[i];
        f->header_hash = w->inputs[i].header;
        src_of[i] = m->n_sources++;
    }
    free(used);
    if (p->n_copied) {                                              /* last: the pack's own file */
        k3_mf_source *f = &m->sources[m->n_sources];
        f->name = PK_COPIED_NAME;
        f->size = p->copied_size;
        f->header_size = p->copied_header_size;
        f->header_hash = k3_xxh3_128(p->copied_header, (size_t)p->copied_header_size);
        f->in_pack = 1;
        src_of[nf] = m->n_sources++;
    }
    return K3_OK;
}

k3_err pk_manifest_in_place(const pk_writer *w, k3_manifest *m, uint32_t s, const uint32_t *src_of, k3_diag *d)
{
    const pk_shard *sh = &w->p->shards[s];
    const pk_in_place *ip = w->p->in_place[s];
    k3_mf_experts *nx = realloc(m->expert_layers, (m->n_expert_layers + 1) * sizeof *nx);
    if (!nx) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    m->expert_layers = nx;
    k3_mf_experts *x = &m->expert_layers[m->n_expert_layers++];
    memset(x, 0, sizeof *x);
    x->layer = (uint32_t)sh->layer;
    x->shard = UINT32_MAX;
    x->count = sh->h.n_records;
    x->record_size = ip->record_size;
    x->stride = k3_in_place_stride(ip->record_size);
    x->in_place = 1;
    x->hashes = w->hashes[s].record;
    x->rec_file = malloc((x->count + 1) * sizeof *x->rec_file);      /* [count] */
    x->rec_off = ip->off;
    if (!x->rec_file) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (uint64_t r = 0; r < x->count; r++)
        x->rec_file[r] = src_of[ip->file[r] == PK_COPIED ? w->n_inputs : ip->file[r]];
    /* parts in their offset order in the record (FORMAT.md 10) */
    uint32_t order[K3_MAX_RECORD_PARTS];
    part_order(ip, sh->h.n_entries, order);
    x->n_parts = sh->h.n_entries;
    for (uint32_t i = 0; i < x->n_parts; i++) {
        const k3_shard_entry *en = &sh->h.entries[order[i]];
        k3_mf_part *pt = &x->parts[i];
        if (!(pt->name = strndup(en->name, en->name_len))) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
        pt->encoding = en->encoding;
        pt->ndim = en->ndim;
        memcpy(pt->shape, en->shape, sizeof pt->shape);
        pt->offset = ip->part_off[order[i]];
        pt->size = en->size;
    }
    return K3_OK;
}

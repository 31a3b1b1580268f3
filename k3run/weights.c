/*
 * weights.c - open a pack and hold every weight in owned memory (weights.h).
 *
 * Order of trust: manifest.json is parsed strictly (k3_manifest_load); each
 * shard's header is decoded and checked against its own header hash, its
 * file size and the manifest; each tensor the model uses is found in its
 * shard header with the manifest's offset, size, encoding and shape; then the
 * bytes are read with pread and (verify_reads) hashed against the manifest.
 */
#define _GNU_SOURCE
#include "weights.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3_file.h"
#include "k3_hash.h"
#include "k3_log.h"
#include "k3_num.h"
#include "k3_progress.h"
#include "k3_shard.h"
#include "k3_sys.h"

static const char *const wid_suffix[K3W__COUNT] = {
    [K3W_IN_NORM] = "input_layernorm.weight",
    [K3W_POST_NORM] = "post_attention_layernorm.weight",
    [K3W_ARES_NORM] = "self_attention_res_norm.weight",
    [K3W_ARES_PROJ] = "self_attention_res_proj.weight",
    [K3W_MRES_NORM] = "mlp_res_norm.weight",
    [K3W_MRES_PROJ] = "mlp_res_proj.weight",
    [K3W_KDA_Q] = "self_attn.q_proj.weight",
    [K3W_KDA_K] = "self_attn.k_proj.weight",
    [K3W_KDA_V] = "self_attn.v_proj.weight",
    [K3W_KDA_QCONV] = "self_attn.q_conv1d.weight",
    [K3W_KDA_KCONV] = "self_attn.k_conv1d.weight",
    [K3W_KDA_VCONV] = "self_attn.v_conv1d.weight",
    [K3W_KDA_ALOG] = "self_attn.A_log",
    [K3W_KDA_DTBIAS] = "self_attn.dt_bias",
    [K3W_KDA_FA] = "self_attn.f_a_proj.weight",
    [K3W_KDA_FB] = "self_attn.f_b_proj.weight",
    [K3W_KDA_B] = "self_attn.b_proj.weight",
    [K3W_KDA_G] = "self_attn.g_proj.weight",
    [K3W_KDA_GA] = "self_attn.g_a_proj.weight",
    [K3W_KDA_GB] = "self_attn.g_b_proj.weight",
    [K3W_KDA_ONORM] = "self_attn.o_norm.weight",
    [K3W_KDA_O] = "self_attn.o_proj.weight",
    [K3W_MLA_Q] = "self_attn.q_proj.weight",
    [K3W_MLA_QA] = "self_attn.q_a_proj.weight",
    [K3W_MLA_QANORM] = "self_attn.q_a_layernorm.weight",
    [K3W_MLA_QB] = "self_attn.q_b_proj.weight",
    [K3W_MLA_KVA] = "self_attn.kv_a_proj_with_mqa.weight",
    [K3W_MLA_KVANORM] = "self_attn.kv_a_layernorm.weight",
    [K3W_MLA_KVB] = "self_attn.kv_b_proj.weight",
    [K3W_MLA_G] = "self_attn.g_proj.weight",
    [K3W_MLA_O] = "self_attn.o_proj.weight",
    [K3W_FFN_GATE] = "mlp.gate_proj.weight",
    [K3W_FFN_UP] = "mlp.up_proj.weight",
    [K3W_FFN_DOWN] = "mlp.down_proj.weight",
    [K3W_MOE_ROUTER] = "block_sparse_moe.gate.weight",
    [K3W_MOE_BIAS] = "block_sparse_moe.gate.e_score_correction_bias",
    [K3W_MOE_SH_GATE] = "block_sparse_moe.shared_experts.gate_proj.weight",
    [K3W_MOE_SH_UP] = "block_sparse_moe.shared_experts.up_proj.weight",
    [K3W_MOE_SH_DOWN] = "block_sparse_moe.shared_experts.down_proj.weight",
    [K3W_MOE_LAT_DOWN] = "block_sparse_moe.routed_expert_down_proj.weight",
    [K3W_MOE_LAT_UP] = "block_sparse_moe.routed_expert_up_proj.weight",
    [K3W_MOE_LAT_NORM] = "block_sparse_moe.routed_expert_norm.weight",
    [K3W_EMBED] = "model.embed_tokens.weight",
    [K3W_FINAL_NORM] = "model.norm.weight",
    [K3W_OUT_RES_NORM] = "model.output_attn_res_norm.weight",
    [K3W_OUT_RES_PROJ] = "model.output_attn_res_proj.weight",
    [K3W_LM_HEAD] = "lm_head.weight",
};

typedef struct expert_layer {
    uint8_t *data;            /* resident mode: [count][stride] records as in the shard, 64-byte aligned */
    int32_t *slot;            /* cache mode: [count] slot holding expert e, -1 if none */
    int fd, fd_direct;        /* cache mode: the shard (fd_direct: O_DIRECT, or -1) */
    char *path;
    uint64_t offset, record_size;
    const uint64_t *hashes;   /* [count] from the manifest */
    uint64_t count, stride;
    int enc;                  /* K3_ENC_MXFP4 or K3_ENC_BF16 */
    uint64_t off[3][2];       /* w1, w3, w2: [packed or weight, scale] offsets in a record */
    uint32_t rows[3], cols[3];
} expert_layer;

struct k3_weights {
    char *dir;
    k3_manifest mf;
    k3_config cfg;
    k3_weights_opts o;
    uint32_t n_layers;
    k3_tensor *tensors;       /* [mf.n_tensors], parallel to mf.tensors */
    void **blocks;            /* [mf.n_tensors] owned aligned data */
    const k3_tensor *(*idx)[K3W__COUNT];   /* [n_layers + 1]: row 0 = model level */
    expert_layer *experts;    /* [n_layers] (count 0 for layers without experts) */
    uint64_t bytes_read;
    /* the expert cache (o.expert_slots > 0) */
    uint64_t n_slots, slot_bytes;
    uint8_t *slots;           /* [n_slots][slot_bytes], 4096-aligned */
    int32_t *slot_layer, *slot_expert;   /* [n_slots] owner, -1 = free */
    uint64_t *slot_used;      /* [n_slots] tick of the last use (LRU) */
    int32_t *slot_pin;        /* [n_slots] pinned by the current acquire */
    uint64_t tick;
    int32_t *miss_slot;       /* [n_slots] reads of one acquire */
    int32_t *miss_j;          /* [n_slots] */
    k3_weights_stats st;
};

const k3_config *k3w_config(const k3_weights *w) { return &w->cfg; }
const k3_manifest *k3w_manifest(const k3_weights *w) { return &w->mf; }
uint64_t k3w_bytes_read(const k3_weights *w) { return w->bytes_read; }
void k3w_stats(const k3_weights *w, k3_weights_stats *st) { *st = w->st; st->bytes_read = w->bytes_read; }
uint32_t k3w_expert_capacity(const k3_weights *w)
{
    return w->o.expert_slots ? (uint32_t)(w->n_slots < UINT32_MAX ? w->n_slots : UINT32_MAX) : UINT32_MAX;
}

static void *aligned_zalloc(uint64_t n)
{
    if (n > SIZE_MAX - 64) return NULL;
    void *p = NULL;
    size_t sz = (size_t)((n + 63) & ~(uint64_t)63);
    if (sz == 0) sz = 64;
    if (posix_memalign(&p, 64, sz)) return NULL;
    memset(p, 0, sz);
    return p;
}

static int name_cmp(const void *a, const void *b)
{
    const k3_tensor *x = *(const k3_tensor *const *)a, *y = *(const k3_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* Read size bytes at off of a shard into buf, in chunks, with a progress line. */
static k3_err read_span(k3_weights *w, int fd, const char *path, void *buf, uint64_t size, uint64_t off,
                        k3_progress *pg, k3_diag *d)
{
    const uint64_t chunk = 64u << 20;
    for (uint64_t done = 0; done < size;) {
        uint64_t n = size - done < chunk ? size - done : chunk;
        k3_err e = k3_pread_full(fd, (uint8_t *)buf + done, (size_t)n, off + done, path, d);
        if (e) return e;
        done += n;
        w->bytes_read += n;
        if (pg) k3_progress_update(pg, w->bytes_read, NULL);
    }
    return K3_OK;
}

static k3_err check_entry(const k3_shard_entry *en, const char *shard, const char *name, int enc, int ndim,
                          const uint64_t *shape, uint64_t offset, uint64_t size, k3_diag *d)
{
    if (!en)
        return k3_fail(d, K3_ERR_MODEL, "'%s': tensor '%s' is in the manifest but not in the shard header",
                       shard, name);
    int same = en->encoding == enc && en->ndim == ndim && en->offset == offset && en->size == size;
    for (int i = 0; same && i < ndim; i++) same = en->shape[i] == shape[i];
    if (!same)
        return k3_fail(d, K3_ERR_MODEL, "'%s': tensor '%s': the shard header and the manifest disagree "
                       "(offset %" PRIu64 " vs %" PRIu64 ", size %" PRIu64 " vs %" PRIu64 ")",
                       shard, name, en->offset, offset, en->size, size);
    return K3_OK;
}

/* Open shard s, decode its header and check it against the manifest. */
static k3_err open_shard(k3_weights *w, uint32_t s, int *fd, char *path, size_t cap, k3_shard_header *h,
                         k3_diag *d)
{
    const k3_mf_shard *ms = &w->mf.shards[s];
    k3_err e = k3_path_join(path, cap, w->dir, ms->name, d);
    if (e) return e;
    *fd = k3_open_read(path);
    if (*fd < 0) return k3_fail(d, K3_ERR_IO, "'%s': cannot open: %s", path, strerror(errno));
    if ((e = k3_shard_read_header(*fd, path, h, d))) { close(*fd); return e; }
    if (h->header_hash != ms->header_hash || h->file_size != ms->size || h->kind != ms->kind) {
        k3_shard_header_free(h);
        close(*fd);
        return k3_fail(d, K3_ERR_CORRUPT, "'%s': shard header does not match the manifest "
                       "(header hash, size or kind differ): run k3verify", path);
    }
    return K3_OK;
}

static k3_err load_trunk(k3_weights *w, k3_progress *pg, k3_diag *d)
{
    k3_manifest *m = &w->mf;
    w->tensors = calloc(m->n_tensors ? m->n_tensors : 1, sizeof *w->tensors);
    w->blocks = calloc(m->n_tensors ? m->n_tensors : 1, sizeof *w->blocks);
    if (!w->tensors || !w->blocks) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (uint32_t s = 0; s < m->n_shards; s++) {
        if (m->shards[s].kind != K3_SHARD_TRUNK) continue;
        char path[4096];
        int fd;
        k3_shard_header h;
        k3_err e = open_shard(w, s, &fd, path, sizeof path, &h, d);
        if (e) return e;
        for (uint32_t i = 0; i < m->n_tensors && !e; i++) {
            const k3_mf_tensor *mt = &m->tensors[i];
            if (mt->shard != s) continue;
            e = check_entry(k3_shard_find(&h, mt->name), path, mt->name, mt->encoding, mt->ndim, mt->shape,
                            mt->offset, mt->size, d);
            if (e) break;
            void *buf = aligned_zalloc(mt->size);
            if (!buf) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory reading '%s'", mt->name); break; }
            w->blocks[i] = buf;
            if ((e = read_span(w, fd, path, buf, mt->size, mt->offset, pg, d))) break;
            if (w->o.verify_reads && k3_xxh3_64(buf, (size_t)mt->size) != mt->hash) {
                char hex[17];
                k3_hex64(mt->hash, hex);
                e = k3_fail(d, K3_ERR_CORRUPT, "'%s': tensor '%s' at offset %" PRIu64 " (%" PRIu64
                            " bytes): XXH3-64 does not match the manifest (%s): the pack is damaged, run k3verify",
                            path, mt->name, mt->offset, mt->size, hex);
                break;
            }
            k3_tensor *t = &w->tensors[i];
            t->name = mt->name;
            t->enc = mt->encoding;
            t->numel = 1;
            for (int k = 0; k < mt->ndim; k++) t->numel *= mt->shape[k];
            t->mat.enc = mt->encoding;
            t->mat.rows = mt->ndim ? (uint32_t)mt->shape[0] : 1;
            t->mat.cols = (uint32_t)(mt->ndim ? t->numel / (mt->shape[0] ? mt->shape[0] : 1) : 1);
            t->mat.data = buf;
            t->mat.scales = NULL;
        }
        k3_shard_header_free(&h);
        close(fd);
        if (e) return e;
    }
    return K3_OK;
}

#define RECORD_HASH_MISMATCH "XXH3-64 does not match the manifest: the pack is damaged, run k3verify"

/* Record e of el (record_size bytes at rec) matches its manifest hash. */
static int record_ok(const expert_layer *el, uint64_t e, const uint8_t *rec)
{
    return k3_xxh3_64(rec, (size_t)el->record_size) == el->hashes[e];
}

/* The one message for a record that cannot be used: shard, layer, expert, offset, why. */
static k3_err record_fail(const expert_layer *el, uint32_t layer, uint64_t e, const char *why, k3_diag *d)
{
    return k3_fail(d, K3_ERR_CORRUPT, "'%s': layer %u expert %" PRIu64 " (record at offset %" PRIu64 "): %s",
                   el->path, layer, e, el->offset + e * el->stride, why);
}

static k3_err load_experts(k3_weights *w, k3_progress *pg, k3_diag *d)
{
    k3_manifest *m = &w->mf;
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
        int fd;
        k3_shard_header h;
        k3_err e = open_shard(w, me->shard, &fd, path, sizeof path, &h, d);
        if (e) return e;
        if (h.n_records != me->count || h.record_stride != me->stride || h.record_size != me->record_size ||
            h.data_offset != me->offset || h.n_entries != me->n_parts) {
            e = k3_fail(d, K3_ERR_MODEL, "'%s': record geometry differs from the manifest", path);
        }
        for (uint32_t p = 0; p < me->n_parts && !e; p++) {
            const k3_mf_part *pt = &me->parts[p];
            const k3_shard_entry *en = k3_shard_find(&h, pt->name);
            if ((e = check_entry(en, path, pt->name, pt->encoding, pt->ndim, pt->shape, pt->offset, pt->size, d)))
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
            el->path = strdup(path);
            if (!el->path) e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
        }
        if (!e && w->o.expert_slots) {          /* cache mode: keep the shard open, read on demand */
            el->fd = fd;
            fd = -1;
            if (me->offset % 4096 == 0 && me->stride % 4096 == 0) el->fd_direct = open(path, O_RDONLY | O_DIRECT);
            el->slot = malloc(me->count * sizeof *el->slot);
            if (!el->slot) e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
            for (uint64_t r = 0; !e && r < me->count; r++) el->slot[r] = -1;
            if (me->stride > w->slot_bytes) w->slot_bytes = me->stride;
        } else if (!e) {                        /* resident: every record now, checked as read */
            el->data = aligned_zalloc(me->count * me->stride);
            if (!el->data) e = k3_fail(d, K3_ERR_NOMEM, "out of memory for the experts of layer %u", me->layer);
            if (!e) e = read_span(w, fd, path, el->data, me->count * me->stride, me->offset, pg, d);
            for (uint64_t r = 0; !e && w->o.verify_reads && r < me->count; r++)
                if (!record_ok(el, r, el->data + r * me->stride))
                    e = record_fail(el, me->layer, r, RECORD_HASH_MISMATCH, d);
        }
        k3_shard_header_free(&h);
        if (fd >= 0) close(fd);
        if (e) return e;
    }
    return K3_OK;
}

/* Find a tensor by full name in the sorted index (bsearch). */
static const k3_tensor *find(const k3_tensor **sorted, uint32_t n, const char *name)
{
    k3_tensor key = {.name = name};
    const k3_tensor *kp = &key;
    const k3_tensor **r = bsearch(&kp, sorted, n, sizeof *sorted, name_cmp);
    return r ? *r : NULL;
}

static k3_err build_index(k3_weights *w, k3_diag *d)
{
    uint32_t n = w->mf.n_tensors;
    const k3_tensor **sorted = malloc((n ? n : 1) * sizeof *sorted);
    w->idx = calloc(w->n_layers + 1, sizeof *w->idx);
    if (!sorted || !w->idx) { free(sorted); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
    for (uint32_t i = 0; i < n; i++) sorted[i] = &w->tensors[i];
    qsort(sorted, n, sizeof *sorted, name_cmp);
    char name[512];
    for (int id = 0; id < K3W__COUNT; id++) {
        if (id >= K3W_EMBED) {
            w->idx[0][id] = find(sorted, n, wid_suffix[id]);
            continue;
        }
        for (uint32_t l = 0; l < w->n_layers; l++) {
            snprintf(name, sizeof name, "model.layers.%u.%s", l, wid_suffix[id]);
            w->idx[l + 1][id] = find(sorted, n, name);
        }
    }
    free(sorted);
    return K3_OK;
}

static k3_err cache_init(k3_weights *w, k3_diag *d)
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
    w->miss_slot = malloc(w->n_slots * sizeof(int32_t));
    w->miss_j = malloc(w->n_slots * sizeof(int32_t));
    if (!w->slot_layer || !w->slot_expert || !w->slot_used || !w->slot_pin || !w->miss_slot || !w->miss_j)
        return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < w->n_slots; i++) w->slot_layer[i] = w->slot_expert[i] = -1;
    return K3_OK;
}

k3_err k3_weights_open(const char *dir, k3_weights **out, k3_diag *d)
{
    *out = NULL;
    k3_weights *w = calloc(1, sizeof *w);
    if (!w || !(w->dir = strdup(dir))) { free(w); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
    k3_err e = k3_manifest_load(dir, &w->mf, d);
    if (e) { free(w->dir); free(w); return e; }
    char name[4200];
    snprintf(name, sizeof name, "%s/manifest.json: config", dir);
    if ((e = k3_manifest_config(&w->mf, name, &w->cfg, d))) { k3_weights_free(w); return e; }
    w->n_layers = w->cfg.num_hidden_layers;
    *out = w;
    return K3_OK;
}

k3_err k3_weights_load(k3_weights *w, const k3_weights_opts *o, k3_diag *d)
{
    if (w->tensors) return k3_fail(d, K3_ERR_INTERNAL, "the weights are already loaded");
    w->o = *o;
    uint64_t total = 0;
    for (uint32_t s = 0; s < w->mf.n_shards; s++) total += w->mf.shards[s].size;
    k3_progress pg;
    k3_progress *pp = o->progress ? &pg : NULL;
    if (pp) k3_progress_start(pp, "loading", total);
    k3_err e = load_trunk(w, pp, d);
    if (!e) e = load_experts(w, pp, d);
    if (pp) k3_progress_end(pp);
    if (!e && o->expert_slots) e = cache_init(w, d);
    if (!e) e = build_index(w, d);
    return e;
}

void k3_weights_free(k3_weights *w)
{
    if (!w) return;
    if (w->blocks)
        for (uint32_t i = 0; i < w->mf.n_tensors; i++) free(w->blocks[i]);
    free(w->blocks);
    free(w->tensors);
    free(w->idx);
    if (w->experts)
        for (uint32_t l = 0; l < w->n_layers; l++) {
            expert_layer *el = &w->experts[l];
            free(el->data);
            free(el->slot);
            free(el->path);
            if (el->fd >= 0) close(el->fd);
            if (el->fd_direct >= 0) close(el->fd_direct);
        }
    free(w->experts);
    free(w->slots);
    free(w->slot_layer);
    free(w->slot_expert);
    free(w->slot_used);
    free(w->slot_pin);
    free(w->miss_slot);
    free(w->miss_j);
    k3_manifest_free(&w->mf);
    free(w->dir);
    free(w);
}

const k3_tensor *k3w_get(k3_weights *w, int layer, k3_wid id)
{
    if (layer < -1 || layer >= (int)w->n_layers) return NULL;
    return w->idx[layer + 1][id];
}

void k3w_vec(const k3_tensor *t, float *dst)
{
    if (t->enc == K3_ENC_F32) {
        memcpy(dst, t->mat.data, (size_t)t->numel * sizeof(float));
    } else {
        const uint16_t *s = t->mat.data;
        for (uint64_t i = 0; i < t->numel; i++) dst[i] = k3_bf16_to_f32(s[i]);
    }
}

k3_err k3w_embed_row(k3_weights *w, int32_t token, float *dst, k3_diag *d)
{
    const k3_tensor *t = w->idx[0][K3W_EMBED];
    if (!t || token < 0 || (uint32_t)token >= t->mat.rows)
        return k3_fail(d, K3_ERR_USAGE, "token id %d is outside the vocabulary (0..%u)", (int)token,
                       t ? t->mat.rows - 1 : 0);
    const uint16_t *row = (const uint16_t *)t->mat.data + (size_t)token * t->mat.cols;
    for (uint32_t i = 0; i < t->mat.cols; i++) dst[i] = k3_bf16_to_f32(row[i]);
    return K3_OK;
}

static void fill_expert(const expert_layer *el, const uint8_t *rec, k3_expert *out)
{
    k3_mat *mats[3] = {&out->w1, &out->w3, &out->w2};
    for (int mi = 0; mi < 3; mi++) {
        mats[mi]->enc = el->enc;
        mats[mi]->rows = el->rows[mi];
        mats[mi]->cols = el->cols[mi];
        mats[mi]->data = rec + el->off[mi][0];
        mats[mi]->scales = el->enc == K3_ENC_MXFP4 ? rec + el->off[mi][1] : NULL;
    }
}

/* Read record e of el into buf [stride], check its hash. 0 or an errno-style failure in *what. */
static int read_record(const expert_layer *el, uint64_t e, uint8_t *buf, int verify, const char **what)
{
    uint64_t off = el->offset + e * el->stride;
    int fd = el->fd_direct >= 0 ? el->fd_direct : el->fd;
    size_t len = (size_t)(el->fd_direct >= 0 ? el->stride : el->record_size);
    for (size_t done = 0; done < len;) {
        ssize_t r = pread(fd, buf + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && fd == el->fd_direct && done == 0) { fd = el->fd; len = (size_t)el->record_size; continue; }
        if (r <= 0) { *what = r < 0 ? strerror(errno) : "the file ended early (truncated?)"; return -1; }
        done += (size_t)r;
    }
    if (fd == el->fd) posix_fadvise(el->fd, (off_t)off, (off_t)el->record_size, POSIX_FADV_DONTNEED);
    if (verify && !record_ok(el, e, buf)) {
        *what = RECORD_HASH_MISMATCH;
        return -1;
    }
    return 0;
}

k3_err k3w_experts_acquire(k3_weights *w, int layer, const int32_t *ids, int n, k3_expert *out, k3_diag *d)
{
    if (layer < 0 || layer >= (int)w->n_layers || !w->experts[layer].count)
        return k3_fail(d, K3_ERR_MODEL, "layer %d has no routed experts in the pack", layer);
    expert_layer *el = &w->experts[layer];
    for (int j = 0; j < n; j++)
        if (ids[j] < 0 || (uint64_t)ids[j] >= el->count)
            return k3_fail(d, K3_ERR_MODEL, "layer %d: expert %d is outside 0..%" PRIu64, layer, (int)ids[j],
                           el->count - 1);
    if (!w->o.expert_slots) {
        for (int j = 0; j < n; j++) fill_expert(el, el->data + (uint64_t)ids[j] * el->stride, &out[j]);
        return K3_OK;
    }
    if ((uint64_t)n > w->n_slots)
        return k3_fail(d, K3_ERR_INTERNAL, "%d experts asked at once, the cache has %" PRIu64 " slots", n, w->n_slots);
    int nm = 0;
    for (int j = 0; j < n; j++) {                      /* hits first: pin them so no miss evicts them */
        int32_t s = el->slot[ids[j]];
        if (s >= 0) {
            w->slot_pin[s] = 1;
            w->slot_used[s] = ++w->tick;
            w->st.expert_hits++;
            fill_expert(el, w->slots + (uint64_t)s * w->slot_bytes, &out[j]);
        } else {
            w->miss_j[nm++] = j;
        }
    }
    for (int q = 0; q < nm; q++) {                     /* a victim each: the least recently used unpinned slot */
        uint64_t best = UINT64_MAX;
        int32_t v = -1;
        for (uint64_t s = 0; s < w->n_slots; s++)
            if (!w->slot_pin[s] && w->slot_used[s] < best) { best = w->slot_used[s]; v = (int32_t)s; }
        if (v < 0) return k3_fail(d, K3_ERR_INTERNAL, "expert cache: no free slot");
        if (w->slot_layer[v] >= 0) w->experts[w->slot_layer[v]].slot[w->slot_expert[v]] = -1;
        w->slot_layer[v] = layer;
        w->slot_expert[v] = ids[w->miss_j[q]];
        w->slot_pin[v] = 1;
        w->slot_used[v] = ++w->tick;
        el->slot[ids[w->miss_j[q]]] = v;
        w->miss_slot[q] = v;
    }
    double t0 = k3_now();
    int bad = -1;
    const char *why = NULL;
#pragma omp parallel for schedule(dynamic, 1) if (nm > 1)
    for (int q = 0; q < nm; q++) {
        const char *what = NULL;
        int32_t v = w->miss_slot[q];
        if (read_record(el, (uint64_t)ids[w->miss_j[q]], w->slots + (uint64_t)v * w->slot_bytes, w->o.verify_reads,
                        &what)) {
#pragma omp critical(k3w_read_error)
            if (bad < 0 || q < bad) { bad = q; why = what; }
        }
    }
    w->st.io_seconds += k3_now() - t0;
    w->st.expert_misses += (uint64_t)nm;
    w->bytes_read += (uint64_t)nm * el->record_size;
    if (bad >= 0) {
        int32_t v = w->miss_slot[bad];
        int32_t e = ids[w->miss_j[bad]];
        el->slot[e] = -1;                               /* never leave a damaged record cached */
        w->slot_layer[v] = w->slot_expert[v] = -1;
        w->slot_used[v] = 0;
        return record_fail(el, (uint32_t)layer, (uint64_t)e, why, d);
    }
    for (int q = 0; q < nm; q++)
        fill_expert(el, w->slots + (uint64_t)w->miss_slot[q] * w->slot_bytes, &out[w->miss_j[q]]);
    return K3_OK;
}

void k3w_experts_release(k3_weights *w, int layer)
{
    (void)layer;
    if (w->slot_pin) memset(w->slot_pin, 0, w->n_slots * sizeof *w->slot_pin);
}

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
    uint8_t *data;            /* [count][stride] records as in the shard, 64-byte aligned */
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
};

const k3_config *k3w_config(const k3_weights *w) { return &w->cfg; }
const k3_manifest *k3w_manifest(const k3_weights *w) { return &w->mf; }
uint64_t k3w_bytes_read(const k3_weights *w) { return w->bytes_read; }

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

static k3_err load_experts(k3_weights *w, k3_progress *pg, k3_diag *d)
{
    k3_manifest *m = &w->mf;
    w->experts = calloc(w->n_layers, sizeof *w->experts);
    if (!w->experts) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
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
            uint64_t total = me->count * me->stride;
            el->data = aligned_zalloc(total);
            if (!el->data) e = k3_fail(d, K3_ERR_NOMEM, "out of memory for the experts of layer %u", me->layer);
        }
        if (!e) e = read_span(w, fd, path, el->data, me->count * me->stride, me->offset, pg, d);
        for (uint64_t r = 0; !e && w->o.verify_reads && r < me->count; r++) {
            if (k3_xxh3_64(el->data + r * me->stride, (size_t)me->record_size) != me->hashes[r])
                e = k3_fail(d, K3_ERR_CORRUPT, "'%s': layer %u expert %" PRIu64 " (record at offset %" PRIu64
                            "): XXH3-64 does not match the manifest: the pack is damaged, run k3verify",
                            path, me->layer, r, me->offset + r * me->stride);
        }
        k3_shard_header_free(&h);
        close(fd);
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

k3_err k3_weights_open(const char *dir, const k3_weights_opts *o, k3_weights **out, k3_diag *d)
{
    *out = NULL;
    k3_weights *w = calloc(1, sizeof *w);
    if (!w || !(w->dir = strdup(dir))) { free(w); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
    w->o = *o;
    k3_err e = k3_manifest_load(dir, &w->mf, d);
    if (e) { free(w->dir); free(w); return e; }
    char *text = w->mf.config ? json_dumps(w->mf.config, JSON_COMPACT) : NULL;
    if (!text) e = k3_fail(d, K3_ERR_FORMAT, "'%s/manifest.json': no model config", dir);
    else e = k3_config_parse(text, strlen(text), "manifest config", &w->cfg, d);
    free(text);
    if (e) { k3_weights_free(w); return e; }
    w->n_layers = w->cfg.num_hidden_layers;
    uint64_t total = 0;
    for (uint32_t s = 0; s < w->mf.n_shards; s++) total += w->mf.shards[s].size;
    k3_progress pg;
    k3_progress *pp = o->progress ? &pg : NULL;
    if (pp) k3_progress_start(pp, "loading", total);
    e = load_trunk(w, pp, d);
    if (!e) e = load_experts(w, pp, d);
    if (pp) k3_progress_end(pp);
    if (!e) e = build_index(w, d);
    if (e) { k3_weights_free(w); return e; }
    *out = w;
    return K3_OK;
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
        for (uint32_t l = 0; l < w->n_layers; l++) free(w->experts[l].data);
    free(w->experts);
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

k3_err k3w_experts_acquire(k3_weights *w, int layer, const int32_t *ids, int n, k3_expert *out, k3_diag *d)
{
    if (layer < 0 || layer >= (int)w->n_layers || !w->experts[layer].count)
        return k3_fail(d, K3_ERR_MODEL, "layer %d has no routed experts in the pack", layer);
    const expert_layer *el = &w->experts[layer];
    for (int j = 0; j < n; j++) {
        if (ids[j] < 0 || (uint64_t)ids[j] >= el->count)
            return k3_fail(d, K3_ERR_MODEL, "layer %d: expert %d is outside 0..%" PRIu64, layer, (int)ids[j],
                           el->count - 1);
        const uint8_t *rec = el->data + (uint64_t)ids[j] * el->stride;
        k3_mat *mats[3] = {&out[j].w1, &out[j].w3, &out[j].w2};
        for (int mi = 0; mi < 3; mi++) {
            mats[mi]->enc = el->enc;
            mats[mi]->rows = el->rows[mi];
            mats[mi]->cols = el->cols[mi];
            mats[mi]->data = rec + el->off[mi][0];
            mats[mi]->scales = el->enc == K3_ENC_MXFP4 ? rec + el->off[mi][1] : NULL;
        }
    }
    return K3_OK;
}

void k3w_experts_release(k3_weights *w, int layer)
{
    (void)w;
    (void)layer;
}

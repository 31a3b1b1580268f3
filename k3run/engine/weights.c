/*
 * weights.c - open a pack, check it, and hold or stream its trunk (weights.h).
 *
 * Order of trust: manifest.json is parsed strictly (k3_manifest_load); each
 * shard's header is decoded and checked against its own header hash, its
 * file size and the manifest; each tensor the model uses is found in its
 * shard header with the manifest's offset, size, encoding and shape; then the
 * bytes are read with pread and (verify_reads) hashed against the manifest
 * before the model sees them. The experts are in weights_experts.c, the
 * shard and entry checks both use in weights_shard.c.
 */
#define _GNU_SOURCE
#include "weights_impl.h"

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
#include "k3_sys.h"

#define K3_READERS 4          /* reader threads: enough queue depth for an NVMe disk */

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

const k3_config *k3w_config(const k3_weights *w) { return &w->cfg; }
const k3_manifest *k3w_manifest(const k3_weights *w) { return &w->mf; }
uint64_t k3w_bytes_read(const k3_weights *w) { return w->bytes_read; }

uint32_t k3w_in_place_layers(const k3_weights *w)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < w->mf.n_expert_layers; i++) n += w->mf.expert_layers[i].in_place;
    return n;
}
void k3w_stats(const k3_weights *w, k3_weights_stats *st) { *st = w->st; st->bytes_read = w->bytes_read; }
uint32_t k3w_expert_capacity(const k3_weights *w)
{
    return w->o.expert_slots ? (uint32_t)(w->n_slots < UINT32_MAX ? w->n_slots : UINT32_MAX) : UINT32_MAX;
}

static int name_cmp(const void *a, const void *b)
{
    const k3_tensor *x = *(const k3_tensor *const *)a, *y = *(const k3_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* Open every trunk shard (kept open: streamed units are read from them every pass), check its
   header and every tensor entry against the manifest, and describe each tensor. */
static k3_err open_trunk(k3_weights *w, k3_diag *d)
{
    k3_manifest *m = &w->mf;
    uint32_t nt = m->n_tensors ? m->n_tensors : 1, ns = m->n_shards ? m->n_shards : 1;
    w->tensors = calloc(nt, sizeof *w->tensors);
    w->tjob = calloc(nt, sizeof *w->tjob);
    w->shard_fd = malloc(ns * sizeof *w->shard_fd);
    w->shard_fd_direct = malloc(ns * sizeof *w->shard_fd_direct);
    w->shard_path = calloc(ns, sizeof *w->shard_path);
    if (!w->tensors || !w->tjob || !w->shard_fd || !w->shard_fd_direct || !w->shard_path)
        return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (uint32_t s = 0; s < ns; s++) w->shard_fd[s] = w->shard_fd_direct[s] = -1;
    for (uint32_t s = 0; s < m->n_shards; s++) {
        if (m->shards[s].kind != K3_SHARD_TRUNK) continue;
        char path[4096];
        k3_shard_header h;
        k3_err e = k3w_open_shard(w, s, &w->shard_fd[s], path, sizeof path, &h, d);
        if (e) return e;
        if (!(w->shard_path[s] = strdup(path))) e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
        for (uint32_t i = 0; i < m->n_tensors && !e; i++) {
            const k3_mf_tensor *mt = &m->tensors[i];
            if (mt->shard != s) continue;
            e = k3w_check_entry(k3_shard_find(&h, mt->name), path, mt->name, mt->encoding, mt->ndim, mt->shape,
                                mt->offset, mt->size, d);
            k3_tensor *t = &w->tensors[i];
            t->name = mt->name;
            t->enc = mt->encoding;
            t->numel = 1;
            for (int k = 0; k < mt->ndim; k++) t->numel *= mt->shape[k];
            t->mat.enc = mt->encoding;
            t->mat.rows = mt->ndim ? (uint32_t)mt->shape[0] : 1;
            t->mat.cols = (uint32_t)(mt->ndim ? t->numel / (mt->shape[0] ? mt->shape[0] : 1) : 1);
            t->mat.data = NULL;
            t->mat.scales = NULL;
        }
        k3_shard_header_free(&h);
        if (e) return e;
        w->shard_fd_direct[s] = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    }
    return K3_OK;
}

/* The embedding table: hashed once here (a row cannot be checked alone), then read a row at a
   time by k3w_embed_row. */
static k3_err open_embed(k3_weights *w, k3_progress *pg, k3_diag *d)
{
    const k3_mf_tensor *mt = NULL;
    for (uint32_t i = 0; i < w->mf.n_tensors && !mt; i++)
        if (!strcmp(w->mf.tensors[i].name, "model.embed_tokens.weight")) mt = &w->mf.tensors[i];
    if (!mt || w->shard_fd[mt->shard] < 0) return K3_OK;   /* the model's check names what is missing */
    w->embed_fd = w->shard_fd[mt->shard];
    w->embed_off = mt->offset;
    w->embed_path = w->shard_path[mt->shard];
    if (mt->ndim != 2 || !(w->embed_row = malloc((size_t)mt->shape[1] * 2 + 2)))
        return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    if (!w->o.verify_reads) return K3_OK;
    const uint64_t chunk = 8u << 20;
    uint8_t *buf = malloc(chunk);                         /* [chunk] bytes of the table at a time */
    k3_hasher64 *h = k3_hasher64_new();
    k3_err e = !buf || !h ? k3_fail(d, K3_ERR_NOMEM, "out of memory") : K3_OK;
    for (uint64_t done = 0; !e && done < mt->size;) {
        uint64_t n = mt->size - done < chunk ? mt->size - done : chunk;
        e = k3_pread_full(w->embed_fd, buf, (size_t)n, mt->offset + done, w->shard_path[mt->shard], d);
        if (e) break;
        posix_fadvise(w->embed_fd, (off_t)(mt->offset + done), (off_t)n, POSIX_FADV_DONTNEED);
        k3_hasher64_update(h, buf, (size_t)n);
        done += n;
        w->bytes_read += n;
        w->st.trunk_bytes_read += n;
        if (pg) k3_progress_update(pg, w->bytes_read, NULL);
    }
    if (!e && k3_hasher64_digest(h) != mt->hash) {
        char hex[17];
        k3_hex64(mt->hash, hex);
        e = k3_fail(d, K3_ERR_CORRUPT, "'%s': tensor '%s' at offset %" PRIu64 " (%" PRIu64
                    " bytes): XXH3-64 does not match the manifest (%s): the pack is damaged, run k3verify",
                    w->shard_path[mt->shard], mt->name, mt->offset, mt->size, hex);
    }
    free(buf);
    k3_hasher64_free(h);
    return e;
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
    uint32_t n = 0;
    const k3_tensor **sorted = malloc((w->mf.n_tensors ? w->mf.n_tensors : 1) * sizeof *sorted);
    w->idx = calloc(w->n_layers + 1, sizeof *w->idx);
    if (!sorted || !w->idx) { free(sorted); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
    for (uint32_t i = 0; i < w->mf.n_tensors; i++)
        if (w->tensors[i].name) sorted[n++] = &w->tensors[i];
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
    for (uint32_t i = 0; i < w->mf.n_tensors; i++) w->tensors[i].layer = w->tensors[i].wid = -1;
    for (uint32_t l = 0; l <= w->n_layers; l++)         /* each tensor knows where it is found */
        for (int id = 0; id < K3W__COUNT; id++)
            if (w->idx[l][id]) {
                k3_tensor *t = &w->tensors[w->idx[l][id] - w->tensors];
                t->layer = (int)l - 1;
                t->wid = id;
            }
    return K3_OK;
}

/* The trunk split by rows (k3_weights_opts.split): mark each matrix the model multiplies split
   and give it this rank's slice (plan_split.c's rule, as the planner and the other ranks apply it). */
static void mark_split(k3_weights *w)
{
    if (!w->o.split || w->o.ranks <= 1) return;
    for (uint32_t i = 0; i < w->mf.n_tensors; i++) {
        const k3_mf_tensor *mt = &w->mf.tensors[i];
        k3_tensor *t = &w->tensors[i];
        if (!t->name || t->wid < 0 || k3_trunk_unit(mt->name, w->n_layers) < 0) continue;
        if (!k3_tensor_splittable(mt->name, mt->ndim, mt->shape) ||
            !k3_split_on(mt->shape[0], mt->size, w->o.ranks, w->o.split_min))
            continue;
        t->split = 1;
        k3_split_rows(t->mat.rows, w->o.rank, w->o.ranks, &t->lo, &t->hi);
    }
}

k3_err k3_weights_open(const char *dir, k3_weights **out, k3_diag *d)
{
    *out = NULL;
    k3_weights *w = calloc(1, sizeof *w);
    if (!w || !(w->dir = strdup(dir))) { free(w); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
    w->embed_fd = -1;
    k3_err e = k3_manifest_load(dir, &w->mf, d);
    if (e) { free(w->dir); free(w); return e; }
    char name[4200];
    snprintf(name, sizeof name, "%s/manifest.json: config", dir);
    if ((e = k3_manifest_config(&w->mf, name, &w->cfg, d))) { k3_weights_free(w); return e; }
    w->n_layers = w->cfg.num_hidden_layers;
    *out = w;
    return K3_OK;
}

/* A compact trunk (FORMAT.md 3): each Q8 tensor's codes are scaled by its sibling NAME_scale,
   E8M0 [rows, cols/32], of the same unit. */
static k3_err link_scales(k3_weights *w, k3_diag *d)
{
    const k3_manifest *m = &w->mf;
    if (!(w->tscale = malloc((m->n_tensors + 1) * sizeof *w->tscale))) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        w->tscale[i] = UINT32_MAX;
        const k3_mf_tensor *mt = &m->tensors[i];
        if (mt->encoding != K3_ENC_Q8) continue;
        size_t n = strlen(mt->name);
        for (uint32_t j = 0; j < m->n_tensors && w->tscale[i] == UINT32_MAX; j++) {
            const k3_mf_tensor *st = &m->tensors[j];
            if (!strncmp(st->name, mt->name, n) && !strcmp(st->name + n, "_scale") && st->encoding == K3_ENC_E8M0 &&
                st->ndim == 2 && mt->ndim == 2 && st->shape[0] == mt->shape[0] && st->shape[1] * 32 == mt->shape[1])
                w->tscale[i] = j;
        }
        if (w->tscale[i] == UINT32_MAX)
            return k3_fail(d, K3_ERR_MODEL, "manifest: Q8 tensor '%s' has no scale tensor '%s_scale' (E8M0 [%llu, %llu])",
                           mt->name, mt->name, (unsigned long long)mt->shape[0],
                           (unsigned long long)(mt->ndim == 2 ? mt->shape[1] / 32 : 0));
    }
    return K3_OK;
}

int k3w_trunk_q8(const k3_weights *w) { return w->mf.trunk_q8; }

k3_err k3_weights_load(k3_weights *w, const k3_weights_opts *o, k3_diag *d)
{
    if (w->tensors) return k3_fail(d, K3_ERR_INTERNAL, "the weights are already loaded");
    w->o = *o;
    if (!(w->io = k3io_new(K3_READERS))) return k3_fail(d, K3_ERR_NOMEM, "cannot start the reader threads");
    uint64_t total = 0;
    for (uint32_t s = 0; s < w->mf.n_shards; s++) total += w->mf.shards[s].size;
    k3_progress pg;
    k3_progress *pp = o->progress ? &pg : NULL;
    if (pp) k3_progress_start(pp, "loading", total);
    k3_err e = open_trunk(w, d);
    if (!e) e = link_scales(w, d);
    if (!e) e = build_index(w, d);
    if (!e) mark_split(w);
    if (!e) e = k3w_build_units(w, d);
    if (!e && !o->no_trunk && !(o->split && o->rank > 0)) e = open_embed(w, pp, d);   /* rank 0's alone */
    if (!e && !o->no_trunk) e = k3w_load_units(w, pp, d);
    if (!e) e = k3w_load_experts(w, pp, d);
    if (pp) k3_progress_end(pp);
    if (!e && o->expert_slots) e = k3w_cache_init(w, d);
    return e;
}

void k3_weights_free(k3_weights *w)
{
    if (!w) return;
    k3io_free(w->io);                                 /* waits for reads still in flight */
    k3w_units_free(w);
    if (w->shard_fd)
        for (uint32_t s = 0; s < w->mf.n_shards; s++) {
            if (w->shard_fd[s] >= 0) close(w->shard_fd[s]);
            if (w->shard_fd_direct[s] >= 0) close(w->shard_fd_direct[s]);
            free(w->shard_path[s]);
        }
    free(w->shard_fd);
    free(w->shard_fd_direct);
    free(w->shard_path);
    free(w->tensors);
    free(w->tjob);
    free(w->tscale);
    free(w->embed_row);
    free(w->idx);
    k3w_experts_free(w);
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
    uint16_t *row = w->embed_row;                        /* [cols] BF16 */
    uint32_t cols = t->mat.cols;
    if (!row || t->enc != K3_ENC_BF16)
        return k3_fail(d, K3_ERR_INTERNAL, "'%s': the embedding table is not open", t->name);
    uint64_t off = w->embed_off + (uint64_t)token * cols * 2;
    k3_err e = k3_pread_full(w->embed_fd, row, (size_t)cols * 2, off, w->embed_path, d);
    if (e) return e;
    w->bytes_read += (uint64_t)cols * 2;
    w->st.trunk_bytes_read += (uint64_t)cols * 2;
    for (uint32_t i = 0; i < cols; i++) dst[i] = k3_bf16_to_f32(row[i]);
    return K3_OK;
}

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
void k3w_stats(const k3_weights *w, k3_weights_stats *st) { *st = w->st; st->bytes_read = w->bytes_read; }
uint32_t k3w_expert_capacity(const k3_weights *w)
{
    return w->o.expert_slots ? (uint32_t)(w->n_slots < UINT32_MAX ? w->n_slots : UINT32_MAX) : UINT32_MAX;
}

static void *page_alloc(uint64_t n)
{
    void *p = NULL;
    if (n > SIZE_MAX - 4096) return NULL;
    if (posix_memalign(&p, 4096, (size_t)(n ? n : 4096))) return NULL;
    return p;
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

/* Group the tensors into units and lay each unit out: tensor i of a unit at pos[i]. */
static k3_err build_units(k3_weights *w, k3_diag *d)
{
    k3_manifest *m = &w->mf;
    uint32_t nu = w->n_layers + 1;
    w->units = calloc(nu, sizeof *w->units);
    w->cur_unit = -1;
    int *unit_of = malloc((m->n_tensors ? m->n_tensors : 1) * sizeof *unit_of);
    if (!w->units || !unit_of) { free(unit_of); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
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
    return K3_OK;
}

/* Point unit u's tensors at mem (NULL: the unit is not in memory). */
static void place_unit(k3_weights *w, int u, uint8_t *mem)
{
    trunk_unit *un = &w->units[u];
    un->mem = mem;
    for (uint32_t k = 0; k < un->n; k++)
        w->tensors[un->ti[k]].mat.data = mem ? mem + un->pos[k] : NULL;
}

/* Queue the reads of unit u into mem. */
static void submit_unit(k3_weights *w, int u, uint8_t *mem)
{
    trunk_unit *un = &w->units[u];
    k3io_job *jobs[64];
    int nj = 0;
    for (uint32_t k = 0; k < un->n; k++) {
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
        jobs[nj++] = j;
        if (nj == 64 || k + 1 == un->n) { k3io_submit(w->io, jobs, nj); nj = 0; }
    }
}

/* Wait for unit u's reads; the first failure is the error. */
static k3_err wait_unit(k3_weights *w, int u, k3_progress *pg, k3_diag *d)
{
    trunk_unit *un = &w->units[u];
    k3_err e = K3_OK;
    for (uint32_t k = 0; k < un->n; k++) {
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

/* Read every resident unit now (all queued at once, the readers work in parallel); set up the
   two stream buffers and start reading the first streamed unit. */
static k3_err load_units(k3_weights *w, k3_progress *pg, k3_diag *d)
{
    uint32_t nu = w->n_layers + 1;
    uint64_t big = 0;
    for (uint32_t u = 0; u < nu; u++) {
        trunk_unit *un = &w->units[u];
        if (un->streamed) { if (un->bytes > big) big = un->bytes; continue; }
        if (!(un->mem = page_alloc(un->bytes)))
            return k3_fail(d, K3_ERR_NOMEM, "out of memory for the trunk of %s %u (%" PRIu64 " bytes)",
                           u < w->n_layers ? "layer" : "the head", u, un->bytes);
        submit_unit(w, (int)u, un->mem);
    }
    k3_err e = K3_OK;
    for (uint32_t u = 0; u < nu; u++) {
        if (w->units[u].streamed) continue;
        k3_err eu = wait_unit(w, (int)u, pg, d);       /* wait for all, even after a failure */
        if (!e) e = eu;
        place_unit(w, (int)u, w->units[u].mem);
    }
    if (e) return e;
    w->cur_buf = -1;
    for (int b = 0; b < 2; b++) {
        w->sb[b].unit = -1;
        if (big && !(w->sb[b].mem = page_alloc(big)))
            return k3_fail(d, K3_ERR_NOMEM, "out of memory for the trunk stream buffers (2 x %" PRIu64 " bytes)", big);
    }
    for (uint32_t u = 0; u < nu; u++)
        if (w->units[u].streamed) {
            w->sb[0].unit = (int)u;
            w->sb[0].pending = 1;
            submit_unit(w, (int)u, w->sb[0].mem);
            break;
        }
    return K3_OK;
}

/* Wait for buffer b's reads if any are in flight; their failure is reported only if asked. */
static k3_err settle(k3_weights *w, int b, int report, k3_diag *d)
{
    stream_buf *s = &w->sb[b];
    if (!s->pending) return K3_OK;
    s->pending = 0;
    k3_diag scratch;
    k3_err e = wait_unit(w, s->unit, NULL, report ? d : &scratch);
    w->st.units_streamed++;
    if (e && !report) s->unit = -1;                   /* a failed prefetch nobody asked for: forget it */
    return report ? e : K3_OK;
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

k3_err k3w_layer_begin(k3_weights *w, int layer, k3_diag *d)
{
    if (layer < -1 || layer >= (int)w->n_layers) return k3_fail(d, K3_ERR_INTERNAL, "no layer %d", layer);
    int u = layer < 0 ? (int)w->n_layers : layer, nu = (int)w->n_layers + 1;
    double t0 = k3_now();
    k3w_pass_end(w);
    w->cur_unit = u;
    w->unit_t0 = t0;
    if (!w->units[u].streamed) return K3_OK;
    int b = w->sb[0].unit == u ? 0 : w->sb[1].unit == u ? 1 : -1;
    if (b < 0) {                                       /* not prefetched (first pass, or out of order) */
        b = w->cur_buf == 0 ? 1 : 0;
        settle(w, b, 0, d);
        if (w->sb[b].unit >= 0) place_unit(w, w->sb[b].unit, NULL);
        w->sb[b].unit = u;
        w->sb[b].pending = 1;
        submit_unit(w, u, w->sb[b].mem);
    }
    k3_err e = settle(w, b, 1, d);
    if (e) {
        w->sb[b].unit = -1;
        place_unit(w, u, NULL);
        return e;
    }
    place_unit(w, u, w->sb[b].mem);
    w->cur_buf = b;
    int next = u;                                      /* the next streamed unit, cyclically */
    for (int i = 1; i < nu; i++) {
        int v = (u + i) % nu;
        if (w->units[v].streamed) { next = v; break; }
    }
    int o = 1 - b;
    if (next != u && w->sb[o].unit != next) {
        settle(w, o, 0, d);
        if (w->sb[o].unit >= 0) place_unit(w, w->sb[o].unit, NULL);
        w->sb[o].unit = next;
        w->sb[o].pending = 1;
        submit_unit(w, next, w->sb[o].mem);
    }
    w->st.wait_seconds += k3_now() - t0;
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
    return K3_OK;
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
    if (!e) e = build_units(w, d);
    if (!e) e = open_embed(w, pp, d);
    if (!e) e = load_units(w, pp, d);
    if (!e) e = k3w_load_experts(w, pp, d);
    if (pp) k3_progress_end(pp);
    if (!e && o->expert_slots) e = k3w_cache_init(w, d);
    if (!e) e = build_index(w, d);
    return e;
}

void k3_weights_free(k3_weights *w)
{
    if (!w) return;
    k3io_free(w->io);                                 /* waits for reads still in flight */
    if (w->units)
        for (uint32_t u = 0; u <= w->n_layers; u++) {
            if (!w->units[u].streamed) free(w->units[u].mem);
            free(w->units[u].ti);
            free(w->units[u].pos);
        }
    free(w->units);
    free(w->sb[0].mem);
    free(w->sb[1].mem);
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

/* A tensor of the next unit for the lookahead (weights.h): it reads the trunk's stream buffers,
   so it lives with them, not with the experts. */
const k3_tensor *k3w_get_ahead(k3_weights *w, int layer, k3_wid id, k3_tensor *tmp)
{
    const k3_tensor *t = k3w_get(w, layer, id);
    if (!t || t->mat.data) return t;                   /* absent, or in memory (resident, or current) */
    int u = layer < 0 ? (int)w->n_layers : layer;
    trunk_unit *un = &w->units[u];
    int b = w->sb[0].unit == u ? 0 : w->sb[1].unit == u ? 1 : -1;
    if (!un->streamed || b < 0) return NULL;           /* not read yet: k3w_layer_begin will */
    uint32_t ti = (uint32_t)(t - w->tensors), k = 0;
    while (k < un->n && un->ti[k] != ti) k++;
    if (k == un->n) return NULL;
    if (w->sb[b].pending) {                            /* the one tensor's read; layer_begin takes the rest */
        double t0 = k3_now();
        int bad = k3io_wait(w->io, &w->tjob[ti]);
        w->st.wait_seconds += k3_now() - t0;
        if (bad) return NULL;
    }
    *tmp = *t;
    tmp->mat.data = w->sb[b].mem + un->pos[k];
    return tmp;
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

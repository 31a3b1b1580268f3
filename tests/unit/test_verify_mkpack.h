/*
 * test_verify_mkpack.h - write a small but complete synthetic k3 pack
 * (docs/FORMAT.md) with the library's own writers: k3_shard_init/add/layout/
 * encode for the shards, k3_manifest_dump for manifest.json. Data are
 * deterministic pseudo-random bytes (E8M0 scales below 255, the NaN code),
 * hashes are real, padding is zero, so
 * k3verify must say OK; tests then damage one thing at a time.
 *
 * The pack is complete for the real config it carries (k3tp_config: K3-style,
 * MLA with a plain q_proj, no KDA, layer 0 dense, BF16 experts that the pack
 * holds quantized, experts.source "quantized"), as k3verify checks: the trunk is
 * laid out from k3_expected_tensors. Layout (k3tp_opts): trunk-embed,
 * trunk-layer-000 .. L-1, trunk-head, and experts-layer-NNN for every layer >=
 * first_moe; tiktoken.model and tokenizer_config.json. Most trunk tensors
 * are smaller than the 4096-byte alignment, so there is padding between them;
 * expert records (MXFP4 w1/w3/w2 + E8M0 scales) are smaller than their
 * 4096-byte stride, so there is record tail padding.
 *
 * Header-only (static functions) so any test can include it:
 *     k3tp_opts o = k3tp_small();
 *     k3_manifest m;
 *     REQUIRE(k3tp_write(dir, &o, &m, &d) == K3_OK);   // m describes what was written
 *     ... k3_manifest_free(&m);
 */
#ifndef TEST_VERIFY_MKPACK_H
#define TEST_VERIFY_MKPACK_H

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "k3_config.h"
#include "k3_error.h"
#include "k3_file.h"
#include "k3_hash.h"
#include "k3_manifest.h"
#include "k3_shard.h"
#include "safetensors.h"

typedef struct k3tp_opts {
    uint32_t layers;      /* trunk layers */
    uint32_t first_moe;   /* layers >= first_moe have an expert shard */
    uint32_t experts;     /* records per expert shard */
    uint64_t hidden;      /* H: multiple of 32 */
    uint64_t inter;       /* I: expert width, multiple of 32 */
    uint64_t vocab;
    uint64_t seed;
} k3tp_opts;

/* A pack of about 360 KiB: 4 layers, experts in layers 1..3, 8 experts each. */
static inline k3tp_opts k3tp_small(void)
{
    k3tp_opts o = {4, 1, 8, 64, 32, 48, 1};
    return o;
}

static inline uint64_t k3tp_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static inline void k3tp_fill(uint8_t *p, uint64_t n, uint64_t *s)
{
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = k3tp_rand(s);
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++) p[i] = (uint8_t)k3tp_rand(s);
}

static inline char *k3tp_strdup(const char *s)
{
    char *r = malloc(strlen(s) + 1);
    if (r) strcpy(r, s);
    return r;
}

/* Write buf[0, n) to dir/name (plain write; tests need no crash safety). */
static inline k3_err k3tp_write_file(const char *dir, const char *name, const void *buf, size_t n, k3_diag *d)
{
    char path[4096];
    k3_err e = k3_path_join(path, sizeof path, dir, name, d);
    if (e) return e;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return k3_fail(d, K3_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
    e = k3_write_full(fd, buf, n, path, d);
    close(fd);
    return e;
}

/*
 * A real K3-style config (nested text_config, MLA attention with a plain q_proj,
 * no KDA) for o: layer 0 dense, MoE from layer first_moe with BF16 experts of
 * width inter at hidden (the pack quantizes them: experts.source "quantized").
 */
static inline json_t *k3tp_config(const k3tp_opts *o)
{
    json_t *tc = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:i, s:I, s:i, s:i, s:i, s:n, s:i, s:i, s:i, "
                           "s:i, s:b, s:f, s:s, s:b}",
                           "model_type", "kimi_linear", "vocab_size", (json_int_t)o->vocab, "hidden_size",
                           (json_int_t)o->hidden, "num_hidden_layers", (json_int_t)o->layers, "intermediate_size",
                           (json_int_t)(2 * o->hidden), "moe_intermediate_size", (json_int_t)o->inter, "num_experts",
                           (json_int_t)o->experts, "num_experts_per_token", 2, "num_shared_experts", 0,
                           "first_k_dense_replace", (json_int_t)o->first_moe, "moe_layer_freq", 1,
                           "num_attention_heads", 2, "num_key_value_heads", 2, "q_lora_rank", "kv_lora_rank", 16,
                           "qk_nope_head_dim", 8, "qk_rope_head_dim", 4, "v_head_dim", 8, "mla_use_nope", 1,
                           "rms_norm_eps", 1e-5, "hidden_act", "silu", "tie_word_embeddings", 0);
    return json_pack("{s:[s], s:s, s:o}", "architectures", "KimiK3ForConditionalGeneration", "model_type", "kimi_k3",
                     "text_config", tc);
}

/* Append a shard entry to the manifest's shard list (arrays grown one by one). */
static inline uint32_t k3tp_add_shard(k3_manifest *m, const char *name, uint32_t kind, int64_t layer)
{
    m->shards = realloc(m->shards, (m->n_shards + 1) * sizeof *m->shards);
    k3_mf_shard *s = &m->shards[m->n_shards];
    memset(s, 0, sizeof *s);
    s->name = k3tp_strdup(name);
    s->kind = kind;
    s->layer = layer;
    return m->n_shards++;
}

/* Lay out, fill, hash and write one shard described by h; fills the manifest's
   tensors (trunk) or expert layer (experts). */
static inline k3_err k3tp_emit_shard(const char *dir, k3_manifest *m, uint32_t si, k3_shard_header *h,
                                     uint64_t *seed, k3_diag *d)
{
    k3_err e = k3_shard_layout(h, d);
    uint8_t *img = NULL;
    size_t hlen = 0;
    if (!e) e = k3_shard_encode(h, &img, &hlen, d);
    if (e) return e;
    uint8_t *buf = calloc(1, (size_t)h->file_size);       /* [file_size] the whole shard */
    if (!buf) { free(img); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
    memcpy(buf, img, hlen);
    free(img);
    k3_mf_shard *s = &m->shards[si];
    if (h->kind == K3_SHARD_TRUNK) {
        uint64_t *eh = calloc(h->n_entries + 1, sizeof *eh);      /* [n_entries] tensor hashes */
        for (uint32_t i = 0; i < h->n_entries; i++) {
            const k3_shard_entry *en = &h->entries[i];
            k3tp_fill(buf + en->offset, en->size, seed);
            eh[i] = k3_xxh3_64(buf + en->offset, (size_t)en->size);
        }
        e = k3_manifest_describe_shard(m, si, h, eh, NULL, d);
        free(eh);
    } else {
        uint64_t *rh = malloc((h->n_records + 1) * sizeof *rh);  /* [n_records], owned by m */
        for (uint64_t r = 0; r < h->n_records; r++) {
            uint8_t *rec = buf + h->data_offset + r * h->record_stride;
            for (uint32_t p = 0; p < h->n_entries; p++) {       /* parts only; gaps stay zero */
                uint8_t *part = rec + h->entries[p].offset;
                k3tp_fill(part, h->entries[p].size, seed);
                for (uint64_t k = 0; h->entries[p].encoding == K3_ENC_E8M0 && k < h->entries[p].size; k++)
                    part[k] = (uint8_t)(part[k] % 255);          /* scale codes 0..254: 255 is NaN */
            }
            rh[r] = k3_xxh3_64(rec, (size_t)h->record_size);
        }
        e = k3_manifest_describe_shard(m, si, h, NULL, rh, d);
    }
    if (e) { free(buf); return e; }
    s->size = h->file_size;
    s->header_hash = h->header_hash;
    s->hash = k3_xxh3_128(buf, (size_t)h->file_size);
    e = k3tp_write_file(dir, s->name, buf, (size_t)h->file_size, d);
    free(buf);
    k3_shard_header_free(h);
    return e;
}

/* Write manifest.json for m into dir. */
static inline k3_err k3tp_write_manifest(const char *dir, const k3_manifest *m, k3_diag *d)
{
    char *text;
    size_t len;
    k3_err e = k3_manifest_dump(m, &text, &len, d);
    if (e) return e;
    e = k3tp_write_file(dir, K3_MANIFEST_NAME, text, len, d);
    free(text);
    return e;
}

/*
 * Create dir (if needed) and write a pack into it. On success *out (if not
 * NULL) holds the manifest that was written; free it with k3_manifest_free.
 */
static inline k3_err k3tp_write(const char *dir, const k3tp_opts *o, k3_manifest *out, k3_diag *d)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return k3_fail(d, K3_ERR_IO, "cannot create '%s': %s", dir, strerror(errno));
    k3_manifest m;
    memset(&m, 0, sizeof m);
    m.format_version = K3_PACK_VERSION;
    m.generator = k3tp_strdup("test_verify_mkpack");
    m.name_prefix = k3tp_strdup("language_model.");
    m.config = k3tp_config(o);
    m.experts_encoding = K3_ENC_MXFP4;
    m.experts_quantized = 1;                    /* the config's experts are BF16 */
    m.quant_rule = k3tp_strdup("ocp-floor-rne-sat");
    uint64_t seed = o->seed ? o->seed : 1;
    uint64_t H = o->hidden, I = o->inter;
    k3_err e = K3_OK;
    k3_shard_header h;
    char name[256];

    /* the trunk: every non-expert tensor the config's model has (k3_expected_tensors) */
    k3_config cfg;
    k3_xlist xl;
    memset(&xl, 0, sizeof xl);
    char *ctext = json_dumps(m.config, JSON_COMPACT);
    e = ctext ? k3_config_parse(ctext, strlen(ctext), "k3tp config", &cfg, d) : k3_fail(d, K3_ERR_NOMEM, "json_dumps");
    free(ctext);
    if (!e) e = k3_expected_tensors(&cfg, &xl, d);
    /* slot 0 embed, 1 + L layer L, 1 + layers head */
    for (uint32_t slot = 0; !e && slot < o->layers + 2; slot++) {
        int64_t layer = slot == 0 || slot == o->layers + 1 ? -1 : (int64_t)slot - 1;
        if (slot == 0) snprintf(name, sizeof name, "trunk-embed.k3s");
        else if (layer < 0) snprintf(name, sizeof name, "trunk-head.k3s");
        else snprintf(name, sizeof name, "trunk-layer-%03u.k3s", (unsigned)layer);
        uint32_t si = k3tp_add_shard(&m, name, K3_SHARD_TRUNK, layer);
        k3_shard_init(&h, K3_SHARD_TRUNK, layer < 0 ? K3_LAYER_NONE : (uint32_t)layer, 0);
        for (size_t k = 0; !e && k < xl.n; k++) {
            const k3_xtensor *x = &xl.t[k];
            int embed = !strncmp(x->name, "model.embed_tokens.", 19);
            if (strstr(x->name, ".block_sparse_moe.experts.") || x->layer != layer ||
                (layer < 0 && embed != (slot == 0)))
                continue;
            e = k3_shard_add(&h, x->name, x->dtype == K3_DT_F32 ? K3_ENC_F32 : K3_ENC_BF16, x->rank, x->shape, d);
        }
        if (!e) e = k3tp_emit_shard(dir, &m, si, &h, &seed, d);
        else k3_shard_header_free(&h);
    }
    k3_xlist_free(&xl);
    for (uint32_t L = o->first_moe; !e && L < o->layers; L++) {
        snprintf(name, sizeof name, "experts-layer-%03u.k3s", L);
        uint32_t si = k3tp_add_shard(&m, name, K3_SHARD_EXPERTS, L);
        k3_shard_init(&h, K3_SHARD_EXPERTS, L, o->experts);
        uint64_t w13[2] = {I, H}, s13[2] = {I, H / 32}, w2[2] = {H, I}, s2[2] = {H, I / 32};
        e = k3_shard_add(&h, "w1.weight_packed", K3_ENC_MXFP4, 2, w13, d);
        if (!e) e = k3_shard_add(&h, "w1.weight_scale", K3_ENC_E8M0, 2, s13, d);
        if (!e) e = k3_shard_add(&h, "w3.weight_packed", K3_ENC_MXFP4, 2, w13, d);
        if (!e) e = k3_shard_add(&h, "w3.weight_scale", K3_ENC_E8M0, 2, s13, d);
        if (!e) e = k3_shard_add(&h, "w2.weight_packed", K3_ENC_MXFP4, 2, w2, d);
        if (!e) e = k3_shard_add(&h, "w2.weight_scale", K3_ENC_E8M0, 2, s2, d);
        if (!e) e = k3tp_emit_shard(dir, &m, si, &h, &seed, d);
    }
    static const char *const tok_names[2] = {"tiktoken.model", "tokenizer_config.json"};
    static const char tok_config[] = "{\"tokenizer_class\": \"TikTokenTokenizer\"}\n";
    m.files = calloc(2, sizeof *m.files);
    for (int i = 0; !e && i < 2; i++) {
        uint8_t tok[777];
        const void *p = tok;
        size_t n = sizeof tok;
        if (i == 0) {
            for (size_t k = 0; k < n; k++) tok[k] = (uint8_t)('A' + k3tp_rand(&seed) % 26);
        } else {
            p = tok_config;
            n = sizeof tok_config - 1;
        }
        m.files[i].name = k3tp_strdup(tok_names[i]);
        m.files[i].size = n;
        m.files[i].hash = k3_xxh3_128(p, n);
        m.n_files++;
        e = k3tp_write_file(dir, tok_names[i], p, n, d);
    }
    if (!e) e = k3tp_write_manifest(dir, &m, d);
    if (e || !out) k3_manifest_free(&m);
    else *out = m;
    return e;
}

#endif

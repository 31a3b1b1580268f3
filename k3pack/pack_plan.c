/*
 * pack_plan.c - from config.json to the list of shards and, for each
 * checkpoint tensor, its shard, entry and record (docs/FORMAT.md sections 1-2).
 * Shards in forward order: trunk-embed, then per layer trunk-layer-NNN and
 * (MoE layers) experts-layer-NNN, then trunk-head.
 */
#include "pack.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "k3_ckpt_check.h"
#include "k3_log.h"
#include "safetensors.h"

/* "model.layers.L.block_sparse_moe.experts.E.SUFFIX" -> L, E, SUFFIX */
static int parse_expert(const char *name, uint32_t *layer, uint64_t *expert, const char **suffix)
{
    unsigned l;
    unsigned long long e;
    int n = 0;
    if (sscanf(name, "model.layers.%u.block_sparse_moe.experts.%llu.%n", &l, &e, &n) != 2 || n == 0) return 0;
    *layer = l;
    *expert = e;
    *suffix = name + n;
    return 1;
}

/* canonical position of a record part: w1, w3, w2; packed (or weight) before scale */
static int part_rank(const char *suffix)
{
    static const char *const order[] = {"w1.weight_packed", "w1.weight", "w1.weight_scale",
                                        "w3.weight_packed", "w3.weight", "w3.weight_scale",
                                        "w2.weight_packed", "w2.weight", "w2.weight_scale"};
    for (int i = 0; i < 9; i++)
        if (!strcmp(suffix, order[i])) return i;
    return -1;
}

typedef struct xref {
    const k3_xtensor *x;
    int shard_slot;     /* 0 embed, 1 + 2*layer trunk, 2 + 2*layer experts, 1 + 2L head */
    uint64_t expert;
    int part;
} xref;

static int cmp_xref(const void *a, const void *b)
{
    const xref *x = a, *y = b;
    if (x->shard_slot != y->shard_slot) return x->shard_slot < y->shard_slot ? -1 : 1;
    if (x->expert != y->expert) return x->expert < y->expert ? -1 : 1;
    if (x->part != y->part) return x->part < y->part ? -1 : 1;
    return x->x < y->x ? -1 : x->x > y->x;     /* forward (list) order */
}

static const pk_plan *g_sort_plan;
static int cmp_by_name(const void *a, const void *b)
{
    return strcmp(g_sort_plan->items[*(const size_t *)a].src_name, g_sort_plan->items[*(const size_t *)b].src_name);
}

k3_err pk_plan_build(pk_plan *p, const char *config_text, size_t config_len, pk_expert_mode mode, int trunk_q8,
                     k3_diag *d)
{
    memset(p, 0, sizeof *p);
    p->trunk_q8 = trunk_q8;
    k3_err e = k3_config_parse(config_text, config_len, "config.json", &p->cfg, d);
    if (e) return e;
    p->config_text = malloc(config_len + 1);
    if (!p->config_text) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    memcpy(p->config_text, config_text, config_len);
    p->config_text[config_len] = '\0';
    p->config_len = config_len;
    const k3_config *c = &p->cfg;
    if (c->experts_mxfp4 && mode == PK_EXPERTS_BF16) {
        pk_plan_free(p);
        return k3_fail(d, K3_ERR_USAGE, "the checkpoint's experts are MXFP4; '--experts bf16' would need "
                       "dequantizing them, which k3pack does not do (they are kept bit-exact)");
    }
    p->experts = c->experts_mxfp4 ? PK_EXPERTS_MXFP4 : mode == PK_EXPERTS_MXFP4 ? PK_EXPERTS_MXFP4 : PK_EXPERTS_BF16;
    p->quantize = !c->experts_mxfp4 && mode == PK_EXPERTS_MXFP4;

    k3_xlist xl;
    if ((e = k3_expected_tensors(c, &xl, d))) {
        pk_plan_free(p);
        return e;
    }
    uint32_t L = c->num_hidden_layers;
    const char *prefix = k3_config_prefix(c);
    xref *refs = calloc(xl.n + 1, sizeof *refs);                 /* [xl.n] */
    p->items = calloc(xl.n + 1, sizeof *p->items);              /* [xl.n] */
    p->n_shards = 2 + 2 * L;                                     /* slots; unused ones dropped below */
    p->shards = calloc(p->n_shards, sizeof *p->shards);
    int *slot_to_shard = malloc((size_t)p->n_shards * sizeof *slot_to_shard);  /* [2 + 2L] */
    if (!refs || !p->items || !p->shards || !slot_to_shard) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); goto out; }

    for (size_t i = 0; i < xl.n; i++) {
        const k3_xtensor *x = &xl.t[i];
        xref *r = &refs[i];
        uint32_t layer;
        const char *suffix;
        r->x = x;
        if (parse_expert(x->name, &layer, &r->expert, &suffix)) {
            r->part = part_rank(suffix);
            if (r->part < 0 || layer >= L) {
                e = k3_fail(d, K3_ERR_UNSUPPORTED, "expert tensor '%s' has an unknown part", x->name);
                goto out;
            }
            r->shard_slot = 2 + 2 * (int)layer;
        } else if (x->layer >= 0) {
            r->shard_slot = 1 + 2 * x->layer;
        } else {
            r->shard_slot = !strcmp(x->name, "model.embed_tokens.weight") ? 0 : 1 + 2 * (int)L;
        }
    }
    qsort(refs, xl.n, sizeof *refs, cmp_xref);

    /* shards in slot order, each with its entries */
    uint32_t ns = 0;
    for (int s = 0; s < 2 + 2 * (int)L; s++) slot_to_shard[s] = -1;
    for (size_t i = 0; i < xl.n;) {
        int slot = refs[i].shard_slot;
        size_t j = i;
        while (j < xl.n && refs[j].shard_slot == slot) j++;
        pk_shard *sh = &p->shards[ns];
        int experts = slot >= 2 && slot % 2 == 0 && slot < 1 + 2 * (int)L;
        sh->layer = slot == 0 || slot == 1 + 2 * (int)L ? -1 : (slot - 1) / 2;
        if (slot == 0) snprintf(sh->name, sizeof sh->name, "trunk-embed.k3s");
        else if (slot == 1 + 2 * (int)L) snprintf(sh->name, sizeof sh->name, "trunk-head.k3s");
        else snprintf(sh->name, sizeof sh->name, "%s-layer-%03" PRId64 ".k3s", experts ? "experts" : "trunk", sh->layer);
        uint64_t n_records = experts ? refs[j - 1].expert + 1 : 0;
        k3_shard_init(&sh->h, experts ? K3_SHARD_EXPERTS : K3_SHARD_TRUNK,
                      sh->layer < 0 ? K3_LAYER_NONE : (uint32_t)sh->layer, n_records);
        sh->first_item = p->n_items;
        for (size_t k = i; k < j; k++) {
            const k3_xtensor *x = refs[k].x;
            if (experts && refs[k].expert != 0) break;           /* record parts come from expert 0 */
            uint64_t shape[4] = {0};
            memcpy(shape, x->shape, sizeof shape);
            if (x->rank > K3_SHARD_MAX_DIMS) {
                e = k3_fail(d, K3_ERR_UNSUPPORTED, "tensor '%s' has %u dimensions (a pack holds at most %d)",
                            x->name, x->rank, K3_SHARD_MAX_DIMS);
                goto out;
            }
            const char *sfx = experts ? strstr(x->name, ".experts.0.") + strlen(".experts.0.") : x->name;
            k3_pack_part parts[2];
            int np = k3_pack_parts(x, sfx, experts, p->quantize, parts);
            if (np == 1 && !experts && p->trunk_q8 && k3_trunk_q8_eligible(x->name, x->dtype, x->rank, x->shape)) {
                parts[0].enc = K3_ENC_Q8;                        /* FORMAT.md 3: codes, then NAME_scale */
                parts[1] = parts[0];
                snprintf(parts[1].name, sizeof parts[1].name, "%.*s_scale", (int)(sizeof parts[1].name - 8),
                         parts[0].name);       /* k3_pack_parts left room for a part suffix (-2) */
                parts[1].enc = K3_ENC_E8M0;
                parts[1].shape[1] = x->shape[1] / 32;
                np = 2;
            }
            if (np == -2) {
                e = k3_fail(d, K3_ERR_UNSUPPORTED, "tensor '%s': the name is too long for a pack (at most %zu bytes)",
                            x->name, sizeof parts[0].name - sizeof ".weight_packed");
                goto out;
            }
            if (np < 0) {
                /* checked here, not when the bytes arrive: --dry-run and the
                   validation before writing must refuse what cannot be written */
                e = k3_fail(d, K3_ERR_MODEL, "tensor '%s': %llu columns is not a multiple of 32, so it cannot "
                            "be quantized to MXFP4 (blocks of 32)", x->name,
                            (unsigned long long)(x->rank == 2 ? shape[1] : 0));
                goto out;
            }
            if (np == 0) {
                e = k3_fail(d, K3_ERR_UNSUPPORTED, "tensor '%s': dtype %s cannot be stored in a pack", x->name,
                            k3_dtype_name((k3_dtype)x->dtype));
                goto out;
            }
            for (int q = 0; q < np && !e; q++)
                e = k3_shard_add(&sh->h, parts[q].name, parts[q].enc, parts[q].ndim, parts[q].shape, d);
            if (e) goto out;
        }
        if ((e = k3_shard_layout(&sh->h, d))) goto out;
        /* items: every checkpoint tensor of this shard, in output order */
        uint32_t entry = 0;
        uint64_t cur_rec = 0;
        for (size_t k = i; k < j; k++) {
            const k3_xtensor *x = refs[k].x;
            pk_item *it = &p->items[p->n_items++];
            if (experts && refs[k].expert != cur_rec) { cur_rec = refs[k].expert; entry = 0; }
            size_t nl = strlen(prefix) + strlen(x->name) + 1;
            it->src_name = malloc(nl);
            if (!it->src_name) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); goto out; }
            snprintf(it->src_name, nl, "%s%s", prefix, x->name);
            it->shard = ns;
            it->entry = entry;
            it->record = experts ? refs[k].expert : 0;
            it->src_bytes = x->nbytes;
            it->src_dtype = x->dtype;
            it->src_rank = x->rank;
            it->any_shape = (x->flags & K3_XT_ANY_SHAPE) != 0;
            memcpy(it->src_shape, x->shape, sizeof it->src_shape);
            it->op = experts && p->quantize ? PK_QUANT
                   : !experts && p->trunk_q8 && k3_trunk_q8_eligible(x->name, x->dtype, x->rank, x->shape) ? PK_QUANT8
                                                                                                     : PK_COPY;
            it->rows = x->shape[0];
            it->cols = x->rank > 1 ? x->shape[1] : 1;
            if (entry >= sh->h.n_entries) {
                e = k3_fail(d, K3_ERR_INTERNAL, "expert %llu of '%s' has more parts than expert 0",
                            (unsigned long long)it->record, sh->name);
                goto out;
            }
            it->dst_off = sh->h.entries[entry].offset +
                          (experts ? sh->h.data_offset + it->record * sh->h.record_stride : 0);
            entry += it->op == PK_COPY ? 1 : 2;
        }
        sh->n_items = p->n_items - sh->first_item;
        if (p->total_bytes + sh->h.file_size < p->total_bytes) { e = k3_fail(d, K3_ERR_INTERNAL, "overflow"); goto out; }
        p->total_bytes += sh->h.file_size;
        slot_to_shard[slot] = (int)ns;
        ns++;
        i = j;
    }
    p->n_shards = ns;
    for (size_t i = 0; i < p->n_items; i++) p->src_bytes += p->items[i].src_bytes;
    p->by_name = malloc((p->n_items + 1) * sizeof *p->by_name);  /* [n_items] */
    if (!p->by_name) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); goto out; }
    for (size_t i = 0; i < p->n_items; i++) p->by_name[i] = i;
    g_sort_plan = p;
    qsort(p->by_name, p->n_items, sizeof *p->by_name, cmp_by_name);
out:
    free(refs);
    free(slot_to_shard);
    k3_xlist_free(&xl);
    if (e) pk_plan_free(p);
    return e;
}

pk_item *pk_plan_find(const pk_plan *p, const char *name)
{
    size_t lo = 0, hi = p->n_items;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(p->items[p->by_name[mid]].src_name, name);
        if (c == 0) return &p->items[p->by_name[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

k3_err pk_item_check(const pk_item *it, const k3_st_tensor *t, const char *file, k3_diag *d)
{
    uint64_t numel = 1;
    for (int i = 0; i < it->src_rank; i++) numel *= it->src_shape[i];
    int shape_ok = it->any_shape ? t->numel == numel
                                 : t->rank == it->src_rank && !memcmp(t->shape, it->src_shape, it->src_rank * sizeof t->shape[0]);
    if (t->dtype != it->src_dtype || !shape_ok || t->nbytes != it->src_bytes) {
        char esc[300];
        return k3_fail(d, K3_ERR_MODEL, "tensor '%s' in '%s' is %s with %llu bytes; the config needs %s with %llu bytes",
                       k3_escape(t->name, t->name_len, esc, sizeof esc), file, k3_dtype_name((k3_dtype)t->dtype),
                       (unsigned long long)t->nbytes, k3_dtype_name((k3_dtype)it->src_dtype),
                       (unsigned long long)it->src_bytes);
    }
    return K3_OK;
}

void pk_in_place_free(pk_in_place *ip)
{
    if (!ip) return;
    free(ip->file);
    free(ip->off);
    free(ip);
}

void pk_plan_free(pk_plan *p)
{
    for (size_t i = 0; p->items && i < p->n_items; i++) free(p->items[i].src_name);
    for (uint32_t s = 0; p->shards && s < p->n_shards; s++) k3_shard_header_free(&p->shards[s].h);
    free(p->items);
    free(p->shards);
    free(p->by_name);
    free(p->config_text);
    for (uint32_t s = 0; p->in_place && s < p->n_shards; s++) pk_in_place_free(p->in_place[s]);
    free(p->in_place);
    free(p->ckpt_dir);
    free(p->copied);
    free(p->copied_header);
    free(p->src_header_size);
    memset(p, 0, sizeof *p);
}

void pk_plan_print(const pk_plan *p, FILE *f, int json)
{
    for (uint32_t s = 0; s < p->n_shards; s++) {
        const pk_shard *sh = &p->shards[s];
        const char *kind = sh->h.kind == K3_SHARD_TRUNK ? "trunk" : p->in_place && p->in_place[s] ? "inplace" : "experts";
        if (json)
        {
            char layer[24] = "null";
            if (sh->layer >= 0) snprintf(layer, sizeof layer, "%" PRId64, sh->layer);
            fprintf(f, "{\"schema\":1,\"type\":\"plan_shard\",\"name\":\"%s\",\"kind\":\"%s\",\"layer\":%s,"
                       "\"tensors\":%zu,\"records\":%llu,\"size\":%llu}\n",
                    sh->name, kind, layer, sh->n_items, (unsigned long long)sh->h.n_records,
                    (unsigned long long)sh->h.file_size);
        }
        else
            fprintf(f, "%-24s %-7s %6zu tensors %8llu records %16llu bytes\n", sh->name, kind, sh->n_items,
                    (unsigned long long)sh->h.n_records, (unsigned long long)sh->h.file_size);
    }
    if (json)
        fprintf(f, "{\"schema\":1,\"type\":\"plan\",\"shards\":%u,\"tensors\":%zu,\"pack_bytes\":%llu,"
                   "\"checkpoint_bytes\":%llu,\"experts\":\"%s\",\"quantize\":%s,\"experts_in_place\":%u,"
                   "\"in_place_bytes\":%llu}\n",
                p->n_shards, p->n_items, (unsigned long long)p->total_bytes, (unsigned long long)p->src_bytes,
                p->experts == PK_EXPERTS_MXFP4 ? "MXFP4" : "BF16", p->quantize ? "true" : "false", p->n_in_place,
                (unsigned long long)p->in_place_bytes);
    else
        fprintf(f, "total: %u shards, %zu tensors, %llu bytes (checkpoint tensors: %llu bytes), experts %s%s\n",
                p->n_shards, p->n_items, (unsigned long long)p->total_bytes, (unsigned long long)p->src_bytes,
                p->experts == PK_EXPERTS_MXFP4 ? "MXFP4" : "BF16", p->quantize ? " (quantized from BF16)" : "");
    if (!json && p->n_in_place)
        fprintf(f, "in place: the experts of %u layers (%llu bytes) stay in the checkpoint; the pack's shards are "
                   "the others\n", p->n_in_place, (unsigned long long)p->in_place_bytes);
}

/*
 * verify_compare.c - does a shard's header agree with the manifest? Kind,
 * layer and header hash; for a trunk shard every tensor (offset, size,
 * encoding, shape) both ways; for an expert shard the one expert_layers
 * entry naming it and its record parts. FORMAT.md section 8, last rule.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_hash.h"
#include "verify_pack.h"

static void enc_shape(int enc, int ndim, const uint64_t *shape, char *out, size_t cap)
{
    const char *en = k3_enc_name(enc);
    size_t o = (size_t)snprintf(out, cap, "%s [", en ? en : "?");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "%s%llu", i ? ", " : "", (unsigned long long)shape[i]);
    if (o < cap) snprintf(out + o, cap - o, "]");
}

static const char *layer_str(int64_t layer, char *buf, size_t cap)
{
    if (layer < 0 || layer == (int64_t)K3_LAYER_NONE) return "none";
    snprintf(buf, cap, "%lld", (long long)layer);
    return buf;
}

static void compare_entry(k3v_item *it, const char *what, const char *esc, const k3_shard_entry *e,
                          uint64_t off, uint64_t size, int enc, int ndim, const uint64_t *shape)
{
    if (e->offset != off || e->size != size) {
        k3v_problem *p = k3v_add(it, K3V_MISMATCH, "%s '%s': the manifest says offset %llu size %llu, the header "
                                 "offset %llu size %llu", what, esc, (unsigned long long)off, (unsigned long long)size,
                                 (unsigned long long)e->offset, (unsigned long long)e->size);
        k3v_set_tensor(p, e->name, e->name_len);
    }
    int same = e->encoding == enc && e->ndim == ndim;
    for (int k = 0; same && k < ndim; k++) same = e->shape[k] == shape[k];
    if (!same) {
        char a[160], b[160];
        enc_shape(enc, ndim, shape, a, sizeof a);
        enc_shape(e->encoding, e->ndim, e->shape, b, sizeof b);
        k3v_problem *p = k3v_add(it, K3V_MISMATCH, "%s '%s': the manifest says %s, the header %s", what, esc, a, b);
        k3v_set_tensor(p, e->name, e->name_len);
    }
}

static void compare_trunk(pack_ctx *c, uint32_t si, const k3_shard_header *h, k3v_item *it)
{
    uint8_t *seen = k3v_xalloc(h->n_entries);      /* [n_entries] */
    for (uint32_t k = 0; k < c->n_st[si]; k++) {
        const k3_mf_tensor *t = &c->m.tensors[c->st[si][k]];
        char *esc = k3v_esc(t->name, strlen(t->name));
        const k3_shard_entry *e = k3_shard_find(h, t->name);
        if (!e) {
            k3v_problem *p = k3v_add(it, K3V_MISMATCH, "tensor '%s' is in the manifest but not in the shard header", esc);
            k3v_set_tensor(p, t->name, strlen(t->name));
        } else if (seen[e - h->entries]++) {
            k3v_add(it, K3V_MISMATCH, "tensor '%s' is listed twice in the manifest", esc);
        } else {
            compare_entry(it, "tensor", esc, e, t->offset, t->size, t->encoding, t->ndim, t->shape);
        }
        free(esc);
    }
    for (uint32_t j = 0; j < h->n_entries; j++) {
        if (seen[j]) continue;
        char *esc = k3v_esc(h->entries[j].name, h->entries[j].name_len);
        k3v_problem *p = k3v_add(it, K3V_MISMATCH, "tensor '%s' is in the shard header but not in the manifest", esc);
        k3v_set_tensor(p, h->entries[j].name, h->entries[j].name_len);
        free(esc);
    }
    free(seen);
}

static void compare_experts(pack_ctx *c, uint32_t si, const k3_shard_header *h, k3v_item *it)
{
    if (c->sx[si] == -1) {
        k3v_add(it, K3V_MISMATCH, "no expert_layers entry of the manifest names this shard");
        return;
    }
    if (c->sx[si] == -2) {
        k3v_add(it, K3V_MISMATCH, "several expert_layers entries of the manifest name this shard");
        return;
    }
    const k3_mf_experts *x = &c->m.expert_layers[c->sx[si]];
#define FIELD(mv, hv, what) \
    if ((uint64_t)(mv) != (uint64_t)(hv)) \
        k3v_add(it, K3V_MISMATCH, "expert_layers %s is %llu, the header says %llu", what, \
                (unsigned long long)(mv), (unsigned long long)(hv))
    FIELD(x->layer, h->layer, "layer");
    FIELD(x->count, h->n_records, "count");
    FIELD(x->offset, h->data_offset, "offset");
    FIELD(x->stride, h->record_stride, "stride");
    FIELD(x->record_size, h->record_size, "record_size");
    FIELD(x->n_parts, h->n_entries, "number of parts");
#undef FIELD
    uint8_t *seen = k3v_xalloc(h->n_entries);      /* [n_entries] */
    for (uint32_t p = 0; p < x->n_parts; p++) {
        const k3_mf_part *pt = &x->parts[p];
        char *esc = k3v_esc(pt->name, strlen(pt->name));
        const k3_shard_entry *e = k3_shard_find(h, pt->name);
        if (!e) k3v_add(it, K3V_MISMATCH, "record part '%s' is in the manifest but not in the shard header", esc);
        else if (seen[e - h->entries]++) k3v_add(it, K3V_MISMATCH, "record part '%s' is listed twice in the manifest", esc);
        else compare_entry(it, "record part", esc, e, pt->offset, pt->size, pt->encoding, pt->ndim, pt->shape);
        free(esc);
    }
    for (uint32_t j = 0; j < h->n_entries; j++) {     /* a part the manifest's layout leaves out */
        if (seen[j]) continue;
        char *esc = k3v_esc(h->entries[j].name, h->entries[j].name_len);
        k3v_add(it, K3V_MISMATCH, "record part '%s' is in the shard header but not in the manifest", esc);
        free(esc);
    }
    free(seen);
}

void k3v_compare_header(pack_ctx *c, uint32_t si, const k3_shard_header *h, k3v_item *it)
{
    const k3_mf_shard *s = &c->m.shards[si];
    char a[24], b[24];
    if (h->kind != s->kind)
        k3v_add(it, K3V_MISMATCH, "the header says kind %s, the manifest %s",
                h->kind == K3_SHARD_TRUNK ? "trunk" : "experts", s->kind == K3_SHARD_TRUNK ? "trunk" : "experts");
    if ((int64_t)h->layer != (s->layer < 0 ? (int64_t)K3_LAYER_NONE : s->layer))
        k3v_add(it, K3V_MISMATCH, "the header says layer %s, the manifest %s", layer_str(h->layer, a, sizeof a),
                layer_str(s->layer, b, sizeof b));
    if (h->header_hash != s->header_hash) {
        char x[17], y[17];
        k3_hex64(h->header_hash, x);
        k3_hex64(s->header_hash, y);
        k3v_add(it, K3V_MISMATCH, "header hash %s, the manifest says %s", x, y);
    }
    if (h->kind == K3_SHARD_TRUNK && s->kind == K3_SHARD_TRUNK) compare_trunk(c, si, h, it);
    if (h->kind == K3_SHARD_EXPERTS && s->kind == K3_SHARD_EXPERTS) compare_experts(c, si, h, it);
}


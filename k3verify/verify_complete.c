/*
 * verify_complete.c - is the pack complete for the model its manifest's
 * config describes? The config's expected tensor list (k3_expected_tensors)
 * against the manifest: every trunk tensor with its encoding and shape, no
 * tensor the model does not have, an expert layer for every MoE layer with
 * num_experts records of the expected parts. Problems go on the manifest.json
 * item. Only the manifest is read, so this runs in every mode.
 */
#include <stdlib.h>
#include <string.h>

#include "k3_ckpt_check.h"
#include "k3_config.h"
#include "k3_error.h"
#include "safetensors.h"
#include "verify_pack.h"

#define XPARTS 16   /* expected parts of one expert record (K3 has 6) */

static const char *enc_str(int enc)
{
    const char *s = k3_enc_name(enc);
    return s ? s : "?";
}

/* "[a, b]" into buf */
static const char *shape_str(const uint64_t *shape, int rank, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < rank && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%llu", i ? ", " : "", (unsigned long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

static int same_shape(const uint64_t *a, int ra, const uint64_t *b, int rb)
{
    if (ra != rb) return 0;
    for (int i = 0; i < ra; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

static uint64_t numel(const uint64_t *s, int rank)
{
    uint64_t n = 1;
    for (int i = 0; i < rank; i++)
        if (__builtin_mul_overflow(n, s[i], &n)) return UINT64_MAX;
    return n;
}

/* A problem naming a tensor: fmt has one %s, the escaped name, first. */
static void tensor_problem(k3v_item *it, int kind, const char *name, const char *fmt, const char *a, const char *b)
{
    char *esc = k3v_esc(name, strlen(name));
    char *msg = k3v_fmt(fmt, esc, a, b);
    k3v_problem *p = k3v_add(it, kind, "%s", msg);
    k3v_set_tensor(p, name, strlen(name));
    free(msg);
    free(esc);
}

/* ------------------------------------------------------------------ trunk */

static const k3_manifest *g_m;   /* qsort/bsearch context (single-threaded) */
static int cmp_name(const void *a, const void *b)
{
    return strcmp(g_m->tensors[*(const uint32_t *)a].name, g_m->tensors[*(const uint32_t *)b].name);
}
static int cmp_key(const void *key, const void *b)
{
    return strcmp(key, g_m->tensors[*(const uint32_t *)b].name);
}

static int is_expert(const char *name) { return strstr(name, ".block_sparse_moe.experts.") != NULL; }

static void check_trunk(const k3_manifest *m, const k3_xlist *xl, k3v_item *it)
{
    uint32_t *byname = k3v_xalloc(((size_t)m->n_tensors + 1) * sizeof *byname);   /* [n_tensors] sorted */
    uint8_t *seen = k3v_xalloc((size_t)m->n_tensors + 1);                          /* [n_tensors] */
    for (uint32_t i = 0; i < m->n_tensors; i++) byname[i] = i;
    g_m = m;
    qsort(byname, m->n_tensors, sizeof *byname, cmp_name);
    char s1[128], s2[128];
    for (size_t k = 0; k < xl->n; k++) {
        const k3_xtensor *x = &xl->t[k];
        if (is_expert(x->name)) continue;
        const uint32_t *hit = bsearch(x->name, byname, m->n_tensors, sizeof *byname, cmp_key);
        if (!hit) {
            tensor_problem(it, K3V_MISSING, x->name, "tensor '%s' the config needs is not in the pack%s%s", "", "");
            continue;
        }
        const k3_mf_tensor *t = &m->tensors[*hit];
        seen[*hit] = 1;
        int want = k3_enc_from_dtype(x->dtype);
        if (m->trunk_q8 && k3_trunk_q8_eligible(x->name, x->dtype, x->rank, x->shape)) {
            want = K3_ENC_Q8;                        /* FORMAT.md 3: codes, and NAME_scale beside them */
            char sn[300];
            snprintf(sn, sizeof sn, "%s_scale", x->name);
            const uint32_t *sh = bsearch(sn, byname, m->n_tensors, sizeof *byname, cmp_key);
            const k3_mf_tensor *st = sh ? &m->tensors[*sh] : NULL;
            if (sh) seen[*sh] = 1;
            if (!st || st->encoding != K3_ENC_E8M0 || st->ndim != 2 || st->shape[0] != x->shape[0] ||
                st->shape[1] * 32 != x->shape[1])
                tensor_problem(it, st ? K3V_MISMATCH : K3V_MISSING, x->name,
                               "tensor '%s' is Q8 in a compact trunk, but its scales (E8M0 [rows, cols/32]) are "
                               "missing or of another shape%s%s", "", "");
        }
        if (t->encoding != want) {
            tensor_problem(it, K3V_MISMATCH, x->name, "tensor '%s' is %s in the pack, the config needs %s",
                           enc_str(t->encoding), want ? enc_str(want) : k3_dtype_name((k3_dtype)x->dtype));
        } else if (!same_shape(t->shape, t->ndim, x->shape, x->rank) &&
                   !((x->flags & K3_XT_ANY_SHAPE) && numel(t->shape, t->ndim) == x->numel)) {
            tensor_problem(it, K3V_MISMATCH, x->name, "tensor '%s' has shape %s in the pack, the config needs %s",
                           shape_str(t->shape, t->ndim, s1, sizeof s1), shape_str(x->shape, x->rank, s2, sizeof s2));
        }
    }
    for (uint32_t i = 0; i < m->n_tensors; i++)
        if (!seen[i])
            tensor_problem(it, K3V_UNEXPECTED, m->tensors[i].name,
                           "tensor '%s' is in the pack, but the config's model has no such tensor%s%s", "", "");
    free(seen);
    free(byname);
}

/* ------------------------------------------------------------------ experts */

typedef k3_pack_part xpart;

/* The record parts expert tensor x of expert 0 becomes in a pack with m's experts. */
static int map_part(const k3_manifest *m, const k3_xtensor *x, const char *sfx, xpart *out)
{
    int n = k3_pack_parts(x, sfx, 1, m->experts_quantized, out);
    if (n <= 0) {                      /* not storable as the config says: expect it as-is */
        memset(out, 0, sizeof *out);
        snprintf(out[0].name, sizeof out[0].name, "%s", sfx);
        out[0].ndim = x->rank > 4 ? 4 : x->rank;
        memcpy(out[0].shape, x->shape, sizeof out[0].shape);
        out[0].enc = k3_enc_from_dtype(x->dtype);
        n = 1;
    }
    return n;
}

static void layer_problem(k3v_item *it, int kind, uint32_t layer, const char *msg)
{
    k3v_problem *p = k3v_add(it, kind, "%s", msg);
    p->layer = layer;
}

static void check_experts(const k3_manifest *m, const k3_config *cfg, const k3_xlist *xl, k3v_item *it)
{
    uint32_t nl = cfg->num_hidden_layers;
    xpart *want = k3v_xalloc(((size_t)nl + 1) * XPARTS * sizeof *want);   /* [nl][XPARTS] */
    uint32_t *n_want = k3v_xalloc(((size_t)nl + 1) * sizeof *n_want);    /* [nl] */
    for (size_t k = 0; k < xl->n; k++) {
        const k3_xtensor *x = &xl->t[k];
        const char *e = strstr(x->name, ".block_sparse_moe.experts.0.");
        if (!e || x->layer < 0 || (uint32_t)x->layer >= nl) continue;
        uint32_t L = (uint32_t)x->layer;
        if (n_want[L] + 2 > XPARTS) continue;
        n_want[L] += (uint32_t)map_part(m, x, e + strlen(".block_sparse_moe.experts.0."), &want[L * XPARTS + n_want[L]]);
    }
    char s1[128], s2[128];
    uint8_t *have = k3v_xalloc((size_t)nl + 1);   /* [nl] an expert layer was found */
    for (uint32_t i = 0; i < m->n_expert_layers; i++) {
        const k3_mf_experts *x = &m->expert_layers[i];
        uint32_t L = x->layer;
        if (L >= nl || !k3_layer_is_moe(cfg, L)) {
            char *msg = k3v_fmt("expert layer %u is in the pack, but the config's layer %u is not an MoE layer", L, L);
            layer_problem(it, K3V_UNEXPECTED, L, msg);
            free(msg);
            continue;
        }
        have[L] = 1;
        if (x->count != cfg->num_experts) {
            char *msg = k3v_fmt("layer %u has %llu experts in the pack, the config needs %u", L,
                          (unsigned long long)x->count, cfg->num_experts);
            layer_problem(it, K3V_MISMATCH, L, msg);
            free(msg);
        }
        const xpart *w = &want[L * XPARTS];
        uint8_t used[K3_MAX_RECORD_PARTS] = {0};
        for (uint32_t j = 0; j < n_want[L]; j++) {
            char *msg = NULL;
            uint32_t q = 0;
            while (q < x->n_parts && strcmp(x->parts[q].name, w[j].name)) q++;
            if (q == x->n_parts) {
                msg = k3v_fmt("layer %u: expert part '%s' the config needs is not in the pack's records", L, w[j].name);
            } else {
                const k3_mf_part *p = &x->parts[q];
                used[q] = 1;
                if (p->encoding != w[j].enc || !same_shape(p->shape, p->ndim, w[j].shape, w[j].ndim))
                    msg = k3v_fmt("layer %u: expert part '%s' is %s %s in the pack, the config needs %s %s", L,
                                  w[j].name, enc_str(p->encoding), shape_str(p->shape, p->ndim, s1, sizeof s1),
                                  enc_str(w[j].enc), shape_str(w[j].shape, w[j].ndim, s2, sizeof s2));
            }
            if (msg) layer_problem(it, K3V_MISMATCH, L, msg);
            free(msg);
        }
        for (uint32_t q = 0; q < x->n_parts; q++) {
            if (used[q]) continue;
            char *esc = k3v_esc(x->parts[q].name, strlen(x->parts[q].name));
            char *msg = k3v_fmt("layer %u: expert part '%s' is in the pack, but the config's experts have no such part", L, esc);
            layer_problem(it, K3V_UNEXPECTED, L, msg);
            free(msg);
            free(esc);
        }
    }
    for (uint32_t L = 0; L < nl; L++) {
        if (!k3_layer_is_moe(cfg, L) || have[L]) continue;
        char *msg = k3v_fmt("the experts of layer %u the config needs are not in the pack", L);
        layer_problem(it, K3V_MISSING, L, msg);
        free(msg);
    }
    free(have);
    free(n_want);
    free(want);
}

/* ------------------------------------------------------------------ entry */

void k3v_check_complete(const k3_manifest *m, k3v_item *it)
{
    k3_diag d;
    k3_config *cfg = k3v_xalloc(sizeof *cfg);
    k3_xlist xl;
    memset(&xl, 0, sizeof xl);
    k3_err e = k3_manifest_config(m, "config", cfg, &d);
    if (!e) e = k3_expected_tensors(cfg, &xl, &d);
    if (e == K3_ERR_NOMEM) {
        k3v_add(it, K3V_IO, "config: %s", d.msg);
    } else if (e) {
        const char *msg = !strncmp(d.msg, "'config': ", 10) ? d.msg + 10 : d.msg;
        k3v_add(it, K3V_MANIFEST, "config: %s", msg);
    } else {
        check_trunk(m, &xl, it);
        check_experts(m, cfg, &xl, it);
    }
    k3_xlist_free(&xl);
    free(cfg);
}

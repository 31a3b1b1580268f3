/* k3_ckpt_check.c - match a checkpoint's tensors against its config. */
#include "k3_ckpt_check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_log.h"
#include "k3_shard.h"

#define K3_NAME_MAX 4096   /* longest expected tensor name we build */

static const struct { int dt, enc; } dt_enc[] = {
    {K3_DT_BF16, K3_ENC_BF16}, {K3_DT_F16, K3_ENC_F16}, {K3_DT_F32, K3_ENC_F32}, {K3_DT_F64, K3_ENC_F64},
    {K3_DT_U8, K3_ENC_U8},     {K3_DT_I8, K3_ENC_I8},   {K3_DT_I16, K3_ENC_I16}, {K3_DT_I32, K3_ENC_I32},
    {K3_DT_I64, K3_ENC_I64},   {K3_DT_F4, K3_ENC_MXFP4}, {K3_DT_F8_E8M0, K3_ENC_E8M0}, {K3_DT_I8, K3_ENC_Q8},
};

int k3_enc_from_dtype(int dtype)
{
    /* F4 / F8_E8M0 checkpoint tensors are not stored as MXFP4 records: copies only */
    for (size_t i = 0; i < sizeof dt_enc / sizeof dt_enc[0] - 3; i++)
        if (dt_enc[i].dt == dtype) return dt_enc[i].enc;
    return 0;
}

int k3_dtype_from_enc(int enc)
{
    for (size_t i = 0; i < sizeof dt_enc / sizeof dt_enc[0]; i++)
        if (dt_enc[i].enc == enc) return dt_enc[i].dt;
    return K3_DT_F8_E8M0;
}

int k3_pack_parts(const k3_xtensor *x, const char *name, int expert, int quantize, k3_pack_part out[2])
{
    memset(out, 0, 2 * sizeof *out);
    if (strlen(name) + sizeof ".weight_packed" > sizeof out[0].name) return -2;   /* never truncate a name */
    snprintf(out[0].name, sizeof out[0].name, "%s", name);
    out[0].ndim = x->rank > 4 ? 4 : x->rank;
    memcpy(out[0].shape, x->shape, sizeof out[0].shape);
    int two_d = x->rank == 2;
    if (expert && two_d && x->dtype == K3_DT_U8 && strstr(name, "weight_packed")) {
        out[0].enc = K3_ENC_MXFP4;
        out[0].shape[1] *= 2;                          /* logical columns */
        return 1;
    }
    if (expert && two_d && x->dtype == K3_DT_U8 && strstr(name, "weight_scale")) {
        out[0].enc = K3_ENC_E8M0;
        return 1;
    }
    if (expert && quantize) {
        if (!two_d || x->shape[1] % 32) return -1;
        size_t n = strlen(name);
        int base = n > 7 && !strcmp(name + n - 7, ".weight") ? (int)(n - 7) : (int)n;
        snprintf(out[0].name, sizeof out[0].name, "%.*s.weight_packed", base, name);
        out[0].enc = K3_ENC_MXFP4;
        out[1] = out[0];
        snprintf(out[1].name, sizeof out[1].name, "%.*s.weight_scale", base, name);
        out[1].enc = K3_ENC_E8M0;
        out[1].shape[1] = x->shape[1] / 32;
        return 2;
    }
    out[0].enc = k3_enc_from_dtype(x->dtype);
    return out[0].enc ? 1 : 0;
}

int k3_trunk_q8_eligible(const char *name, int dtype, int rank, const uint64_t *shape)
{
    static const char *const exact[] = {"embed_tokens", "norm", "bias", "A_log", "conv1d", "f_a_proj", "f_b_proj",
                                        ".b_proj.", "kv_b_proj", "_res_proj", ".experts."};
    if (dtype != K3_DT_BF16 || rank != 2 || shape[0] < 2 || shape[1] % 32 || k3_is_vision_tensor(name)) return 0;
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        if (strstr(name, exact[i])) return 0;
    size_t n = strlen(name), k = strlen("gate.weight");
    return !(n >= k && !strcmp(name + n - k, "gate.weight"));    /* the router */
}

int k3_is_vision_tensor(const char *name)
{
    static const char *const pfx[] = {"vision_tower.", "mm_projector.", "language_model.vision_tower.",
                                      "multi_modal_projector.", "model.vision_tower.", "model.mm_projector."};
    for (size_t i = 0; i < sizeof pfx / sizeof pfx[0]; i++)
        if (strncmp(name, pfx[i], strlen(pfx[i])) == 0) return 1;
    return 0;
}

static void shape_str(const uint64_t *shape, int rank, char *out, size_t cap)
{
    size_t o = 0;
    o += (size_t)snprintf(out + o, cap - o, "[");
    for (int i = 0; i < rank && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "%s%llu", i ? ", " : "", (unsigned long long)shape[i]);
    if (o < cap) snprintf(out + o, cap - o, "]");
}

typedef struct report {
    k3_problem_fn fn;
    void *ctx;
    char first[K3_DIAG_MAX];
    size_t count;
} report;

static void problem(report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(report *r, const char *fmt, ...)
{
    char msg[K3_DIAG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!r->count++) memcpy(r->first, msg, sizeof msg);
    if (r->fn) r->fn(r->ctx, msg);
}

k3_err k3_ckpt_match_config(const k3_st_ckpt *ck, const k3_config *cfg, const k3_xlist *xl,
                            k3_problem_fn fn, void *ctx, k3_ckpt_match *out, k3_diag *d)
{
    memset(out, 0, sizeof *out);
    report r = {fn, ctx, "", 0};
    const char *prefix = k3_config_prefix(cfg);
    out->src = calloc(xl->n + 1, sizeof *out->src);            /* [xl->n] */
    out->x_status = calloc(xl->n + 1, 1);                       /* [xl->n] */
    out->found = calloc(xl->n + 1, sizeof *out->found);         /* [xl->n] */
    out->src_status = calloc(ck->n_tensors + 1, 1);             /* [ck->n_tensors] */
    uint8_t *used = out->src_status;
    out->skipped = calloc(ck->n_tensors + 1, sizeof *out->skipped);
    char *name = malloc(strlen(prefix) + K3_NAME_MAX + 1);
    if (!out->src || !out->x_status || !out->found || !used || !out->skipped || !name) {
        free(name);
        k3_ckpt_match_free(out);
        return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < xl->n; i++) {
        const k3_xtensor *x = &xl->t[i];
        char esc[300];
        snprintf(name, strlen(prefix) + K3_NAME_MAX + 1, "%s%s", prefix, x->name);
        k3_escape(name, strlen(name), esc, sizeof esc);
        const k3_st_tensor *t = k3_st_find(ck, name);
        if (!t) {
            out->x_status[i] = K3_CK_MISSING;
            out->n_missing++;
            problem(&r, "tensor '%s' is missing", esc);
            continue;
        }
        used[t - ck->tensors] = K3_CK_EXPECTED;
        out->found[i] = t;
        int shape_ok = t->rank == x->rank && !memcmp(t->shape, x->shape, x->rank * sizeof x->shape[0]);
        if (x->flags & K3_XT_ANY_SHAPE) shape_ok = t->numel == x->numel;
        if (t->dtype != x->dtype || !shape_ok) {
            char ws[96], gs[96];
            shape_str(x->shape, x->rank, ws, sizeof ws);
            shape_str(t->shape, t->rank, gs, sizeof gs);
            out->x_status[i] = K3_CK_MISMATCH;
            out->n_mismatch++;
            problem(&r, "tensor '%s' in '%s' is %s %s, the config needs %s %s", esc, ck->files[t->file].name,
                    k3_dtype_name((k3_dtype)t->dtype), gs, k3_dtype_name((k3_dtype)x->dtype), ws);
            continue;
        }
        out->src[i] = t;
    }
    for (size_t j = 0; j < ck->n_tensors; j++) {
        if (used[j]) continue;
        const k3_st_tensor *t = &ck->tensors[j];
        if (k3_is_vision_tensor(t->name)) {
            used[j] = K3_CK_SKIPPED;
            out->skipped[out->n_skipped++] = j;
            continue;
        }
        char esc[300];
        out->n_unexpected++;
        problem(&r, "tensor '%s' in '%s' is not part of the model config.json describes",
                k3_escape(t->name, t->name_len, esc, sizeof esc), ck->files[t->file].name);
    }
    free(name);
    if (r.count)
        return k3_fail(d, K3_ERR_MODEL, "checkpoint does not match its config: %zu missing, %zu wrong dtype or "
                       "shape, %zu unexpected; first: %s", out->n_missing, out->n_mismatch, out->n_unexpected,
                       r.first);
    return K3_OK;
}

void k3_ckpt_match_free(k3_ckpt_match *m)
{
    free(m->src);
    free(m->skipped);
    free(m->x_status);
    free(m->found);
    free(m->src_status);
    memset(m, 0, sizeof *m);
}

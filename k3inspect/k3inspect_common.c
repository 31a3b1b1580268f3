/* k3inspect_common.c - classification, params, units and JSON pieces shared by the views. */
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

#include "k3_log.h"
#include "k3inspect.h"

int k3i_classify(k3i_ctx *x)
{
    const k3_st_ckpt *c = &x->ck;
    size_t n = x->has_cfg ? x->cfg.num_hidden_layers : 0;
    for (size_t i = 0; i < c->n_tensors; i++) {
        int l = k3_tensor_layer(c->tensors[i].name, NULL);
        if (l >= 0 && (size_t)l + 1 > n) n = (size_t)l + 1;
    }
    x->n_layers = n;
    x->layer_attn = calloc(n ? n : 1, 1);
    x->layer_ffn = calloc(n ? n : 1, 1);
    x->kind = malloc(c->n_tensors ? c->n_tensors : 1);
    if (!x->layer_attn || !x->layer_ffn || !x->kind) return -1;

    /* attention type: config first, then names (KDA-only / MLA-only names) */
    for (size_t i = 0; i < c->n_tensors; i++) {
        const char *name = c->tensors[i].name;
        int l = k3_tensor_layer(name, NULL);
        if (l < 0 || (x->has_cfg && (size_t)l < x->cfg.num_hidden_layers)) continue;
        int h = k3_attn_hint(name);
        if (h && !x->layer_attn[l]) x->layer_attn[l] = (uint8_t)h;
    }
    if (x->has_cfg)
        for (uint32_t l = 0; l < x->cfg.num_hidden_layers; l++) {
            x->layer_attn[l] = k3_layer_is_kda(&x->cfg, l) ? K3_ATTN_KDA : K3_ATTN_MLA;
            x->layer_ffn[l] = k3_layer_is_moe(&x->cfg, l) ? K3I_FFN_MOE : K3I_FFN_DENSE;
        }
    for (size_t i = 0; i < c->n_tensors; i++) {
        const char *name = c->tensors[i].name;
        k3_kind k = k3_classify(name, x->layer_attn, x->n_layers);
        x->kind[i] = (uint8_t)k;
        int l = k3_tensor_layer(name, NULL);
        if (l < 0 || (x->has_cfg && (size_t)l < x->cfg.num_hidden_layers)) continue;
        if (k == K3_KIND_ROUTED || k == K3_KIND_ROUTER || k == K3_KIND_SHARED || k == K3_KIND_LATENT)
            x->layer_ffn[l] = K3I_FFN_MOE;
        else if (k == K3_KIND_DENSE && !x->layer_ffn[l])
            x->layer_ffn[l] = K3I_FFN_DENSE;
    }
    return 0;
}

int k3i_selected(const k3i_ctx *x, size_t i)
{
    return !x->filter || fnmatch(x->filter, x->ck.tensors[i].name, 0) == 0;
}

static int ends_with(const char *s, size_t n, const char *suffix)
{
    size_t m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

uint64_t k3i_params(const k3_st_tensor *t)
{
    const char *n = t->name;
    size_t len = t->name_len;
    if (ends_with(n, len, ".weight_packed")) {
        switch (t->dtype) {
        case K3_DT_U8: case K3_DT_I8: return t->numel * 2;
        case K3_DT_I32: case K3_DT_U32: return t->numel * 8;
        default: return t->numel;
        }
    }
    static const char *const aux[] = {".weight_scale", ".weight_scale_inv", ".weight_scale_2",
                                      ".weight_global_scale", ".input_scale", ".weight_zero_point",
                                      ".weight_shape"};
    for (size_t i = 0; i < sizeof aux / sizeof aux[0]; i++)
        if (ends_with(n, len, aux[i])) return 0;
    return t->numel;
}

const char *k3i_layer_kind(const k3i_ctx *x, size_t l)
{
    static const char *const kinds[3][3] = {
        {"?", "?+dense", "?+MoE"}, {"KDA", "KDA+dense", "KDA+MoE"}, {"MLA", "MLA+dense", "MLA+MoE"}};
    if (l >= x->n_layers) return "?";
    return kinds[x->layer_attn[l] % 3][x->layer_ffn[l] % 3];
}

char *k3i_si(double v, const char *unit, char *buf, size_t cap)
{
    static const char *const pre[] = {"", "K", "M", "G", "T", "P", "E"};
    int k = 0;
    while (v >= 1000 && k < 6) { v /= 1000; k++; }
    if (k == 0) snprintf(buf, cap, "%.0f%s%s", v, *unit ? " " : "", unit);
    else snprintf(buf, cap, "%.2f %s%s", v, pre[k], unit);
    return buf;
}

void k3i_json_head(const k3i_ctx *x, FILE *f, const char *view)
{
    fprintf(f, "{\"schema\":1,\"tool\":\"k3inspect\",\"version\":\"%s\",\"view\":\"%s\",\"source\":",
            K3_VERSION, view);
    k3_json_str(f, x->ck.source, strlen(x->ck.source));
    fputs(",\"config\":", f);
    if (x->has_cfg) k3_json_str(f, x->cfg_source, strlen(x->cfg_source));
    else fputs("null", f);
    fputs(",\"filter\":", f);
    if (x->filter) k3_json_str(f, x->filter, strlen(x->filter));
    else fputs("null", f);
    fputs(",\"files\":[", f);
    for (size_t i = 0; i < x->ck.n_files; i++) {
        const k3_st_file *fl = &x->ck.files[i];
        fprintf(f, "%s{\"index\":%zu,\"name\":", i ? "," : "", i);
        k3_json_str(f, fl->name, strlen(fl->name));
        fputs(",\"path\":", f);
        k3_json_str(f, fl->path, strlen(fl->path));
        fprintf(f, ",\"size\":%llu,\"header_len\":%llu,\"data_offset\":%llu,\"tensors\":%zu}",
                (unsigned long long)fl->size, (unsigned long long)fl->header_len,
                (unsigned long long)fl->header_len + 8, fl->n_tensors);
    }
    fputs("]", f);
}

void k3i_json_warnings(const k3i_ctx *x, FILE *f)
{
    fputs(",\"warnings\":[", f);
    for (size_t i = 0; i < x->ck.n_warnings; i++) {
        if (i) fputc(',', f);
        k3_json_str(f, x->ck.warnings[i], strlen(x->ck.warnings[i]));
    }
    fputs("]", f);
}

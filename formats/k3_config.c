/*
 * k3_config.c - config.json -> k3_config, with validation, and layer helpers.
 * The expected tensor list lives in k3_config_tensors.c.
 */
#include "k3_config.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_file.h"
#include "k3_log.h"

/* ------------------------------------------------------------------------- */
/* typed field access                                                         */

typedef struct cfgctx {
    const json_t *obj;      /* object the fields are read from */
    const char *scope;      /* "text_config." or "" (for messages) */
    const char *dn;         /* display name of the file */
    k3_diag *d;
} cfgctx;

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* Field value, NULL if absent or JSON null. */
static const json_t *field(const cfgctx *x, const char *key)
{
    const json_t *v = json_object_get(x->obj, key);
    return json_is_null(v) ? NULL : v;
}

static k3_err missing(const cfgctx *x, const char *key)
{
    return k3_fail(x->d, K3_ERR_FORMAT, "'%s': missing field '%s%s'", x->dn, x->scope, key);
}

static k3_err wrong_type(const cfgctx *x, const char *key, const json_t *v, const char *want)
{
    return k3_fail(x->d, K3_ERR_FORMAT, "'%s': field '%s%s' is %s, not %s", x->dn, x->scope, key,
                   type_name(v), want);
}

enum { OPT = 0, REQ = 1 };

/* A size field: an integer in [0, K3_CFG_MAX_DIM], positive unless allow_zero. */
static k3_err get_u32(const cfgctx *x, const char *key, int req, uint32_t def, int allow_zero,
                      uint32_t *out)
{
    const json_t *v = field(x, key);
    *out = def;
    if (!v) return req ? missing(x, key) : K3_OK;
    if (!json_is_integer(v)) return wrong_type(x, key, v, "an integer");
    json_int_t i = json_integer_value(v);
    if (i < 0 || i > (json_int_t)K3_CFG_MAX_DIM)
        return k3_fail(x->d, K3_ERR_FORMAT, "'%s': field '%s%s' = %lld is out of range [0, %u]",
                       x->dn, x->scope, key, (long long)i, K3_CFG_MAX_DIM);
    if (i == 0 && !allow_zero)
        return k3_fail(x->d, K3_ERR_FORMAT, "'%s': field '%s%s' must be positive, not 0",
                       x->dn, x->scope, key);
    *out = (uint32_t)i;
    return K3_OK;
}

static k3_err get_bool(const cfgctx *x, const char *key, int def, int *out)
{
    const json_t *v = field(x, key);
    *out = def;
    if (!v) return K3_OK;
    if (!json_is_boolean(v)) return wrong_type(x, key, v, "a boolean");
    *out = json_is_true(v);
    return K3_OK;
}

static k3_err get_num(const cfgctx *x, const char *key, int req, double def, double *out)
{
    const json_t *v = field(x, key);
    *out = def;
    if (!v) return req ? missing(x, key) : K3_OK;
    if (!json_is_number(v)) return wrong_type(x, key, v, "a number");
    *out = json_number_value(v);
    return K3_OK;
}

/* A string field copied into out (cap bytes); "" if absent and optional. */
static k3_err get_str(const cfgctx *x, const char *key, int req, char *out, size_t cap)
{
    const json_t *v = field(x, key);
    out[0] = '\0';
    if (!v) return req ? missing(x, key) : K3_OK;
    if (!json_is_string(v)) return wrong_type(x, key, v, "a string");
    if (json_string_length(v) >= cap) {
        char e[64];
        return k3_fail(x->d, K3_ERR_FORMAT, "'%s': field '%s%s' is too long ('%s')", x->dn, x->scope,
                       key, k3_escape(json_string_value(v), json_string_length(v), e, sizeof e));
    }
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return K3_OK;
}

/* A token id: integer, or a list of integers (the first is kept); -1 if absent. */
static k3_err get_token(const cfgctx *x, const char *key, int64_t *out)
{
    const json_t *v = field(x, key);
    *out = -1;
    if (!v) return K3_OK;
    if (json_is_array(v) && json_array_size(v) > 0) v = json_array_get(v, 0);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return wrong_type(x, key, v, "a non-negative integer");
    *out = json_integer_value(v);
    return K3_OK;
}

/* ------------------------------------------------------------------------- */
/* sections                                                                   */

/* linear_attn_config: the 1-based layer lists and the KDA sizes. */
static k3_err parse_linear_attn(const cfgctx *top, k3_config *c)
{
    const json_t *la = field(top, "linear_attn_config");
    uint32_t L = c->num_hidden_layers;
    if (!la) return K3_OK;                       /* every layer is MLA */
    if (!json_is_object(la)) return wrong_type(top, "linear_attn_config", la, "an object");
    char scope[64];
    snprintf(scope, sizeof scope, "%slinear_attn_config.", top->scope);
    cfgctx x = {la, scope, top->dn, top->d};
    c->has_linear_attn = 1;
    k3_err e;
    if ((e = get_bool(&x, "use_full_rank_gate", 0, &c->kda_full_rank_gate))) return e;
    const json_t *lb = field(&x, "gate_lower_bound");
    if (lb) {
        if (!json_is_number(lb)) return wrong_type(&x, "gate_lower_bound", lb, "a number");
        c->kda_has_lower_bound = 1;
        c->kda_gate_lower_bound = json_number_value(lb);
    }

    uint8_t in_full[K3_MAX_LAYERS] = {0};
    static const char *const lists[2] = {"kda_layers", "full_attn_layers"};
    for (int li = 0; li < 2; li++) {
        const json_t *a = field(&x, lists[li]);
        if (!a) {
            if (li == 0) return missing(&x, lists[li]);
            continue;                            /* full_attn_layers: the complement */
        }
        if (!json_is_array(a)) return wrong_type(&x, lists[li], a, "an array");
        uint8_t *mark = li == 0 ? c->layer_kda : in_full;
        for (size_t k = 0; k < json_array_size(a); k++) {
            const json_t *v = json_array_get(a, k);
            if (!json_is_integer(v))
                return k3_fail(x.d, K3_ERR_FORMAT, "'%s': %s%s[%zu] is %s, not a layer number",
                               x.dn, scope, lists[li], k, type_name(v));
            json_int_t n = json_integer_value(v);
            if (n < 1 || n > (json_int_t)L)
                return k3_fail(x.d, K3_ERR_FORMAT,
                               "'%s': %s%s[%zu] = %lld is out of range: layer numbers here are 1-based, 1..%u",
                               x.dn, scope, lists[li], k, (long long)n, L);
            if (mark[n - 1])
                return k3_fail(x.d, K3_ERR_FORMAT, "'%s': layer %lld is listed twice in %s%s",
                               x.dn, (long long)n, scope, lists[li]);
            mark[n - 1] = 1;
        }
        if (li == 1) {
            for (uint32_t i = 0; i < L; i++) {
                if (c->layer_kda[i] && in_full[i])
                    return k3_fail(x.d, K3_ERR_FORMAT,
                                   "'%s': layer %u (1-based) is in both %skda_layers and %sfull_attn_layers",
                                   x.dn, i + 1, scope, scope);
                if (!c->layer_kda[i] && !in_full[i])
                    return k3_fail(x.d, K3_ERR_FORMAT,
                                   "'%s': layer %u (1-based) is in neither %skda_layers nor %sfull_attn_layers",
                                   x.dn, i + 1, scope, scope);
            }
        }
    }
    for (uint32_t i = 0; i < L; i++) c->n_kda_layers += c->layer_kda[i];
    int req = c->n_kda_layers ? REQ : OPT;
    if ((e = get_u32(&x, "num_heads", req, 0, !req, &c->kda_num_heads))) return e;
    if ((e = get_u32(&x, "head_dim", req, 0, !req, &c->kda_head_dim))) return e;
    if ((e = get_u32(&x, "short_conv_kernel_size", req, 0, !req, &c->kda_conv_kernel))) return e;
    return K3_OK;
}

/* quantization_config: only the routed-expert encoding matters to the layout. */
static k3_err parse_quant(const cfgctx *text, const cfgctx *top, k3_config *c)
{
    const cfgctx *where = field(text, "quantization_config") ? text : top;
    const json_t *q = field(where, "quantization_config");
    if (!q) return K3_OK;
    if (!json_is_object(q)) return wrong_type(where, "quantization_config", q, "an object");
    char scope[64];
    snprintf(scope, sizeof scope, "%squantization_config.", where->scope);
    cfgctx x = {q, scope, top->dn, top->d};
    k3_err e;
    c->quantized = 1;
    if ((e = get_str(&x, "quant_method", REQ, c->quant_method, sizeof c->quant_method))) return e;
    if ((e = get_str(&x, "format", OPT, c->quant_format, sizeof c->quant_format))) return e;
    const json_t *groups = field(&x, "config_groups");
    if (groups) {
        if (!json_is_object(groups)) return wrong_type(&x, "config_groups", groups, "an object");
        const char *gk;
        json_t *g;
        json_object_foreach((json_t *)groups, gk, g) {   /* the first group describes the experts */
            if (!json_is_object(g)) continue;
            cfgctx gx = {g, scope, top->dn, top->d};
            if (!c->quant_format[0] &&
                (e = get_str(&gx, "format", OPT, c->quant_format, sizeof c->quant_format)))
                return e;
            const json_t *w = json_object_get(g, "weights");
            if (json_is_object(w)) {
                cfgctx wx = {w, scope, top->dn, top->d};
                if ((e = get_u32(&wx, "group_size", OPT, 0, 0, &c->quant_group_size))) return e;
            }
            break;
        }
    }
    c->experts_mxfp4 = strstr(c->quant_format, "mxfp4") != NULL;
    if (c->experts_mxfp4) {
        if (!c->quant_group_size) c->quant_group_size = 32;
        if (c->quant_group_size != 32)
            return k3_fail(top->d, K3_ERR_FORMAT, "'%s': %s group_size is %u, but MXFP4 blocks are 32",
                           top->dn, scope, c->quant_group_size);
    }
    return K3_OK;
}

static k3_err parse_moe(const cfgctx *x, k3_config *c)
{
    k3_err e;
    if ((e = get_u32(x, "num_experts", OPT, 0, 1, &c->num_experts))) return e;
    int req = c->num_experts ? REQ : OPT;
    if ((e = get_u32(x, "num_experts_per_token", req, 0, !req, &c->num_experts_per_token))) return e;
    if ((e = get_u32(x, "moe_intermediate_size", req, 0, !req, &c->moe_intermediate_size))) return e;
    if ((e = get_u32(x, "num_shared_experts", OPT, 0, 1, &c->num_shared_experts))) return e;
    if ((e = get_u32(x, "routed_expert_hidden_size", OPT, 0, 1, &c->routed_expert_hidden_size))) return e;
    if ((e = get_bool(x, "latent_moe_use_norm", 0, &c->latent_moe_use_norm))) return e;
    if ((e = get_u32(x, "first_k_dense_replace", OPT, 0, 1, &c->first_k_dense_replace))) return e;
    if ((e = get_u32(x, "moe_layer_freq", OPT, 1, 0, &c->moe_layer_freq))) return e;
    if ((e = get_bool(x, "moe_renormalize", 1, &c->moe_renormalize))) return e;
    if ((e = get_num(x, "routed_scaling_factor", OPT, 1.0, &c->routed_scaling_factor))) return e;
    if ((e = get_u32(x, "num_expert_group", OPT, 1, 0, &c->num_expert_group))) return e;
    if ((e = get_u32(x, "topk_group", OPT, 1, 0, &c->topk_group))) return e;
    char act[32];
    if ((e = get_str(x, "moe_router_activation_func", OPT, act, sizeof act))) return e;
    if (!act[0] || strcmp(act, "sigmoid") == 0) c->router_act = K3_ROUTER_SIGMOID;
    else if (strcmp(act, "softmax") == 0) c->router_act = K3_ROUTER_SOFTMAX;
    else {
        char b[64];
        return k3_fail(x->d, K3_ERR_FORMAT,
                       "'%s': field '%smoe_router_activation_func' is '%s', not 'sigmoid' or 'softmax'",
                       x->dn, x->scope, k3_escape(act, strlen(act), b, sizeof b));
    }
    if (c->num_experts) {
        if (c->num_experts_per_token > c->num_experts)
            return k3_fail(x->d, K3_ERR_FORMAT, "'%s': num_experts_per_token %u exceeds num_experts %u",
                           x->dn, c->num_experts_per_token, c->num_experts);
        if (c->num_experts % c->num_expert_group || c->topk_group > c->num_expert_group)
            return k3_fail(x->d, K3_ERR_FORMAT,
                           "'%s': %u experts cannot be split into %u groups with topk_group %u",
                           x->dn, c->num_experts, c->num_expert_group, c->topk_group);
    }
    return K3_OK;
}

/* ------------------------------------------------------------------------- */
/* the whole config                                                           */

static k3_err parse_root(const json_t *root, const char *dn, k3_config *c, k3_diag *d)
{
    if (!json_is_object(root))
        return k3_fail(d, K3_ERR_FORMAT, "'%s': config is %s, not a JSON object", dn, type_name(root));
    cfgctx top = {root, "", dn, d};
    k3_err e;
    if ((e = get_str(&top, "model_type", OPT, c->model_type, sizeof c->model_type))) return e;
    const json_t *tc = field(&top, "text_config");
    if (tc && !json_is_object(tc)) return wrong_type(&top, "text_config", tc, "an object");
    c->nested = tc != NULL;
    cfgctx x = {tc ? tc : root, tc ? "text_config." : "", dn, d};

    if ((e = get_u32(&x, "hidden_size", REQ, 0, 0, &c->hidden_size))) return e;
    if ((e = get_u32(&x, "num_hidden_layers", REQ, 0, 0, &c->num_hidden_layers))) return e;
    if (c->num_hidden_layers > K3_MAX_LAYERS)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': %snum_hidden_layers = %u exceeds the limit of %d",
                       dn, x.scope, c->num_hidden_layers, K3_MAX_LAYERS);
    if ((e = get_u32(&x, "vocab_size", REQ, 0, 0, &c->vocab_size))) return e;
    if ((e = get_num(&x, "rms_norm_eps", REQ, 0, &c->rms_norm_eps))) return e;
    if (!(c->rms_norm_eps > 0) || !isfinite(c->rms_norm_eps))
        return k3_fail(d, K3_ERR_FORMAT, "'%s': %srms_norm_eps must be positive", dn, x.scope);
    char act[32];
    if ((e = get_str(&x, "hidden_act", REQ, act, sizeof act))) return e;
    if (strcmp(act, "silu") == 0) c->hidden_act = K3_ACT_SILU;
    else if (strcmp(act, "situ") == 0) c->hidden_act = K3_ACT_SITU;
    else {
        char b[64];
        return k3_fail(d, K3_ERR_FORMAT, "'%s': %shidden_act is '%s', not 'silu' or 'situ'", dn,
                       x.scope, k3_escape(act, strlen(act), b, sizeof b));
    }
    if ((e = get_num(&x, "activation_situ_beta", OPT, 4.0, &c->activation_situ_beta))) return e;
    if ((e = get_num(&x, "activation_situ_linear_beta", OPT, 25.0, &c->activation_situ_linear_beta))) return e;
    const cfgctx *tie = field(&x, "tie_word_embeddings") ? &x : &top;
    if ((e = get_bool(tie, "tie_word_embeddings", 0, &c->tie_word_embeddings))) return e;
    static const char *const tok[3] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    int64_t *tokv[3] = {&c->bos_token_id, &c->eos_token_id, &c->pad_token_id};
    for (int i = 0; i < 3; i++)
        if ((e = get_token(field(&x, tok[i]) ? &x : &top, tok[i], tokv[i]))) return e;
    if ((e = get_u32(&x, "attn_res_block_size", OPT, 0, 1, &c->attn_res_block_size))) return e;

    /* attention */
    if ((e = get_u32(&x, "num_attention_heads", REQ, 0, 0, &c->num_attention_heads))) return e;
    if ((e = get_u32(&x, "num_key_value_heads", OPT, c->num_attention_heads, 0, &c->num_key_value_heads))) return e;
    if ((e = get_u32(&x, "q_lora_rank", OPT, 0, 1, &c->q_lora_rank))) return e;
    if ((e = get_u32(&x, "kv_lora_rank", REQ, 0, 0, &c->kv_lora_rank))) return e;
    if ((e = get_u32(&x, "qk_nope_head_dim", REQ, 0, 0, &c->qk_nope_head_dim))) return e;
    if ((e = get_u32(&x, "qk_rope_head_dim", REQ, 0, 1, &c->qk_rope_head_dim))) return e;
    if ((e = get_u32(&x, "v_head_dim", REQ, 0, 0, &c->v_head_dim))) return e;
    if ((e = get_bool(&x, "mla_use_nope", 0, &c->mla_use_nope))) return e;
    if ((e = get_bool(&x, "mla_use_output_gate", 0, &c->mla_use_output_gate))) return e;
    if ((e = parse_linear_attn(&x, c))) return e;

    /* FFN */
    if ((e = parse_moe(&x, c))) return e;
    int any_dense = 0;
    for (uint32_t i = 0; i < c->num_hidden_layers; i++) any_dense |= !k3_layer_is_moe(c, i);
    if ((e = get_u32(&x, "intermediate_size", any_dense ? REQ : OPT, 0, !any_dense, &c->intermediate_size)))
        return e;
    if ((e = parse_quant(&x, &top, c))) return e;
    if (c->experts_mxfp4 && c->num_experts) {
        uint32_t din = c->routed_expert_hidden_size ? c->routed_expert_hidden_size : c->hidden_size;
        uint32_t g = c->quant_group_size;
        if (din % g || c->moe_intermediate_size % g)
            return k3_fail(d, K3_ERR_FORMAT,
                           "'%s': MXFP4 experts need sizes divisible by %u, but the expert input is %u "
                           "and moe_intermediate_size is %u", dn, g, din, c->moe_intermediate_size);
    }
    return K3_OK;
}

k3_err k3_config_parse(const char *text, size_t len, const char *dn, k3_config *out, k3_diag *d)
{
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!root) {
        char b[200];
        return k3_fail(d, K3_ERR_FORMAT, "'%s': not valid JSON: %s (line %d, column %d)", dn,
                       k3_escape(je.text, strlen(je.text), b, sizeof b), je.line, je.column);
    }
    k3_err e = parse_root(root, dn, out, d);
    json_decref(root);
    if (e) memset(out, 0, sizeof *out);
    return e;
}

k3_err k3_config_load(const char *path, k3_config *out, k3_diag *d)
{
    char *text;
    size_t len;
    k3_err e = k3_read_file(path, 64u << 20, &text, &len, d);
    if (e) return e;
    e = k3_config_parse(text, len, path, out, d);
    free(text);
    return e;
}

int k3_layer_is_kda(const k3_config *c, uint32_t i)
{
    return i < c->num_hidden_layers && c->layer_kda[i];
}

int k3_layer_is_moe(const k3_config *c, uint32_t i)
{
    return i < c->num_hidden_layers && c->num_experts > 0 && i >= c->first_k_dense_replace &&
           c->moe_layer_freq && i % c->moe_layer_freq == 0;
}

const char *k3_config_prefix(const k3_config *c) { return c->nested ? "language_model." : ""; }

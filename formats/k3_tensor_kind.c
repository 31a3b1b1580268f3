/* k3_tensor_kind.c - classify checkpoint tensors by name (and layer attention type). */
#include "k3_tensor_kind.h"

#include <string.h>

static const char *const kind_names[K3_KIND__COUNT][2] = {
    [K3_KIND_EMBED] = {"embedding", "embed"},
    [K3_KIND_KDA] = {"KDA attention", "kda"},
    [K3_KIND_MLA] = {"MLA attention", "mla"},
    [K3_KIND_DENSE] = {"dense FFN", "dense_ffn"},
    [K3_KIND_ROUTER] = {"router", "router"},
    [K3_KIND_SHARED] = {"shared experts", "shared_experts"},
    [K3_KIND_ROUTED] = {"routed experts", "routed_experts"},
    [K3_KIND_LATENT] = {"latent projections", "latent"},
    [K3_KIND_NORM] = {"norms", "norm"},
    [K3_KIND_ATTNRES] = {"AttnRes", "attn_res"},
    [K3_KIND_LM_HEAD] = {"lm_head", "lm_head"},
    [K3_KIND_VISION] = {"vision", "vision"},
    [K3_KIND_OTHER] = {"other", "other"},
};

const char *k3_kind_name(k3_kind k) { return (unsigned)k < K3_KIND__COUNT ? kind_names[k][0] : "?"; }
const char *k3_kind_id(k3_kind k) { return (unsigned)k < K3_KIND__COUNT ? kind_names[k][1] : "?"; }

static int skip(const char **s, const char *prefix)
{
    size_t n = strlen(prefix);
    if (strncmp(*s, prefix, n) != 0) return 0;
    *s += n;
    return 1;
}

/* Strip the optional "language_model." and "model." prefixes. */
static const char *lm_rel(const char *name)
{
    skip(&name, "language_model.");
    skip(&name, "model.");
    return name;
}

int k3_tensor_layer(const char *name, const char **rest)
{
    const char *s = lm_rel(name);
    if (!skip(&s, "layers.")) return -1;
    int n = 0, digits = 0;
    while (*s >= '0' && *s <= '9') {
        if (++digits > 9) return -1;
        n = n * 10 + (*s++ - '0');
    }
    if (!digits || *s != '.') return -1;
    if (rest) *rest = s + 1;
    return n;
}

/* The first component of s equals word. */
static int comp_is(const char *s, const char *word)
{
    size_t n = strlen(word);
    return strncmp(s, word, n) == 0 && (s[n] == '.' || s[n] == '\0');
}

int k3_attn_hint(const char *name)
{
    static const char *const kda[] = {"q_conv1d", "k_conv1d", "v_conv1d", "A_log", "dt_bias",
                                      "f_a_proj", "f_b_proj", "b_proj", "k_proj", "v_proj",
                                      "g_a_proj", "g_b_proj", "o_norm"};
    static const char *const mla[] = {"q_a_proj", "q_b_proj", "q_a_layernorm",
                                      "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj"};
    const char *rest;
    if (k3_tensor_layer(name, &rest) < 0 || !skip(&rest, "self_attn.")) return K3_ATTN_UNKNOWN;
    for (size_t i = 0; i < sizeof kda / sizeof kda[0]; i++)
        if (comp_is(rest, kda[i])) return K3_ATTN_KDA;
    for (size_t i = 0; i < sizeof mla / sizeof mla[0]; i++)
        if (comp_is(rest, mla[i])) return K3_ATTN_MLA;
    return K3_ATTN_UNKNOWN;
}

k3_kind k3_classify(const char *name, const uint8_t *layer_attn, size_t n_layers)
{
    const char *s = name;
    skip(&s, "language_model.");
    if (skip(&s, "vision_tower.") || skip(&s, "mm_projector.")) return K3_KIND_VISION;
    if (skip(&s, "lm_head.")) return K3_KIND_LM_HEAD;
    skip(&s, "model.");
    if (skip(&s, "embed_tokens.")) return K3_KIND_EMBED;
    if (skip(&s, "norm.")) return K3_KIND_NORM;
    if (skip(&s, "output_attn_res_")) return K3_KIND_ATTNRES;

    const char *r;
    int layer = k3_tensor_layer(name, &r);
    if (layer < 0) return K3_KIND_OTHER;
    if (skip(&r, "input_layernorm.") || skip(&r, "post_attention_layernorm.")) return K3_KIND_NORM;
    if (skip(&r, "self_attention_res_") || skip(&r, "mlp_res_")) return K3_KIND_ATTNRES;
    if (skip(&r, "self_attn.")) {
        int attn = layer_attn && (size_t)layer < n_layers ? layer_attn[layer] : K3_ATTN_UNKNOWN;
        if (attn == K3_ATTN_UNKNOWN) attn = k3_attn_hint(name);
        return attn == K3_ATTN_KDA ? K3_KIND_KDA : K3_KIND_MLA;
    }
    if (skip(&r, "block_sparse_moe.") || skip(&r, "mlp.")) {
        if (skip(&r, "gate.")) return K3_KIND_ROUTER;
        if (skip(&r, "experts.")) return K3_KIND_ROUTED;
        if (skip(&r, "shared_experts.")) return K3_KIND_SHARED;
        if (skip(&r, "routed_expert_")) return K3_KIND_LATENT;
        if (comp_is(r, "gate_proj") || comp_is(r, "up_proj") || comp_is(r, "down_proj"))
            return K3_KIND_DENSE;
    }
    return K3_KIND_OTHER;
}

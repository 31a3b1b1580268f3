/*
 * k3_config_tensors.c - the tensor list a config implies (K3-ARCHITECTURE.md §3).
 *
 * Shapes are [out, in] as stored. Names are relative to the language model
 * root: "model.embed_tokens.weight", "model.layers.N....", "lm_head.weight";
 * the checkpoint prefixes them with k3_config_prefix().
 */
#include "k3_config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_checked.h"
#include "safetensors.h"

typedef struct builder {
    k3_xlist *l;
    size_t cap;
    size_t pool_len, pool_cap;
    k3_diag *d;
    k3_err err;
} builder;

/* Append tensor pre+suf with rank dims from shape. Errors stick in b->err. */
static void add(builder *b, int layer, k3_dtype dt, uint8_t flags, unsigned rank,
                const uint64_t *shape, const char *pre, const char *suf)
{
    if (b->err) return;
    size_t pl = strlen(pre), sl = strlen(suf), nl = pl + sl;
    uint64_t numel = 1, bits;
    for (unsigned i = 0; i < rank; i++)
        if (k3_mul_u64(numel, shape[i], &numel)) goto overflow;
    if (k3_mul_u64(numel, k3_dtype_bits(dt), &bits)) goto overflow;

    if (b->l->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        k3_xtensor *t = realloc(b->l->t, cap * sizeof *t);
        if (!t) goto nomem;
        b->l->t = t;
        b->cap = cap;
    }
    if (b->pool_len + nl + 1 > b->pool_cap) {
        size_t cap = b->pool_cap ? b->pool_cap * 2 : 65536;
        while (cap < b->pool_len + nl + 1) cap *= 2;
        char *p = realloc(b->l->pool, cap);
        if (!p) goto nomem;
        b->l->pool = p;
        b->pool_cap = cap;
    }
    memcpy(b->l->pool + b->pool_len, pre, pl);
    memcpy(b->l->pool + b->pool_len + pl, suf, sl + 1);
    k3_xtensor *t = &b->l->t[b->l->n++];
    memset(t, 0, sizeof *t);
    t->name = (const char *)(uintptr_t)b->pool_len;     /* an offset until the pool stops moving */
    b->pool_len += nl + 1;
    memcpy(t->shape, shape, rank * sizeof *shape);
    t->numel = numel;
    t->nbytes = bits / 8;
    t->layer = layer;
    t->dtype = (uint8_t)dt;
    t->rank = (uint8_t)rank;
    t->flags = flags;
    return;
overflow:
    b->err = k3_fail(b->d, K3_ERR_FORMAT, "config: size of tensor '%s%s' overflows 64 bits", pre, suf);
    return;
nomem:
    b->err = k3_fail(b->d, K3_ERR_NOMEM, "out of memory building the tensor list");
}

/* Shapes as compound literals: A1(n), A2(out, in), A3(a, b, c). */
#define A1(a) 1, (const uint64_t[]){(a)}
#define A2(a, b) 2, (const uint64_t[]){(a), (b)}
#define A3(a, b, c) 3, (const uint64_t[]){(a), (b), (c)}

#define U(x) ((uint64_t)(x))

static void add_kda(builder *b, const k3_config *c, int i, const char *p)
{
    uint64_t H = c->kda_num_heads, K = c->kda_head_dim, D = c->hidden_size, HK = H * K;
    uint64_t W = c->kda_conv_kernel;
    add(b, i, K3_DT_BF16, 0, A2(HK, D), p, "q_proj.weight");
    add(b, i, K3_DT_BF16, 0, A2(HK, D), p, "k_proj.weight");
    add(b, i, K3_DT_BF16, 0, A2(HK, D), p, "v_proj.weight");
    add(b, i, K3_DT_F32, 0, A3(HK, 1, W), p, "q_conv1d.weight");
    add(b, i, K3_DT_F32, 0, A3(HK, 1, W), p, "k_conv1d.weight");
    add(b, i, K3_DT_F32, 0, A3(HK, 1, W), p, "v_conv1d.weight");
    add(b, i, K3_DT_F32, K3_XT_ANY_SHAPE, A1(H), p, "A_log");
    add(b, i, K3_DT_F32, 0, A1(HK), p, "dt_bias");
    add(b, i, K3_DT_BF16, 0, A2(K, D), p, "f_a_proj.weight");
    add(b, i, K3_DT_BF16, 0, A2(HK, K), p, "f_b_proj.weight");
    add(b, i, K3_DT_BF16, 0, A2(H, D), p, "b_proj.weight");
    if (c->kda_full_rank_gate) {
        add(b, i, K3_DT_BF16, 0, A2(HK, D), p, "g_proj.weight");
    } else {
        add(b, i, K3_DT_BF16, 0, A2(K, D), p, "g_a_proj.weight");
        add(b, i, K3_DT_BF16, 0, A2(HK, K), p, "g_b_proj.weight");
    }
    add(b, i, K3_DT_F32, 0, A1(K), p, "o_norm.weight");
    add(b, i, K3_DT_BF16, 0, A2(D, HK), p, "o_proj.weight");
}

static void add_mla(builder *b, const k3_config *c, int i, const char *p)
{
    uint64_t H = c->num_attention_heads, D = c->hidden_size, R = c->kv_lora_rank;
    uint64_t Q = c->q_lora_rank, rope = c->qk_rope_head_dim;
    uint64_t qk = U(c->qk_nope_head_dim) + rope, kv = U(c->qk_nope_head_dim) + c->v_head_dim;
    uint64_t Vo = H * c->v_head_dim;
    if (Q) {
        add(b, i, K3_DT_BF16, 0, A2(Q, D), p, "q_a_proj.weight");
        add(b, i, K3_DT_BF16, 0, A1(Q), p, "q_a_layernorm.weight");
        add(b, i, K3_DT_BF16, 0, A2(H * qk, Q), p, "q_b_proj.weight");
    } else {
        add(b, i, K3_DT_BF16, 0, A2(H * qk, D), p, "q_proj.weight");
    }
    add(b, i, K3_DT_BF16, 0, A2(R + rope, D), p, "kv_a_proj_with_mqa.weight");
    add(b, i, K3_DT_BF16, 0, A1(R), p, "kv_a_layernorm.weight");
    add(b, i, K3_DT_BF16, 0, A2(H * kv, R), p, "kv_b_proj.weight");
    if (c->mla_use_output_gate) add(b, i, K3_DT_BF16, 0, A2(Vo, D), p, "g_proj.weight");
    add(b, i, K3_DT_BF16, 0, A2(D, Vo), p, "o_proj.weight");
}

/* One routed-expert matrix [out, in] under prefix p: MXFP4 pair or a BF16 weight. */
static void add_expert_matrix(builder *b, const k3_config *c, int i, const char *p,
                              uint64_t out, uint64_t in)
{
    if (c->experts_mxfp4) {
        add(b, i, K3_DT_U8, 0, A2(out, in / 2), p, "weight_packed");
        add(b, i, K3_DT_U8, 0, A2(out, in / c->quant_group_size), p, "weight_scale");
    } else {
        add(b, i, K3_DT_BF16, 0, A2(out, in), p, "weight");
    }
}

static void add_moe(builder *b, const k3_config *c, int i, const char *p)
{
    uint64_t D = c->hidden_size, E = c->num_experts, I = c->moe_intermediate_size;
    uint64_t Dl = c->routed_expert_hidden_size ? c->routed_expert_hidden_size : D;
    add(b, i, K3_DT_BF16, 0, A2(E, D), p, "gate.weight");
    add(b, i, K3_DT_F32, 0, A1(E), p, "gate.e_score_correction_bias");
    if (c->routed_expert_hidden_size) {
        add(b, i, K3_DT_BF16, 0, A2(Dl, D), p, "routed_expert_down_proj.weight");
        add(b, i, K3_DT_BF16, 0, A2(D, Dl), p, "routed_expert_up_proj.weight");
        if (c->latent_moe_use_norm) add(b, i, K3_DT_BF16, 0, A1(Dl), p, "routed_expert_norm.weight");
    }
    if (c->num_shared_experts) {
        uint64_t S = I * c->num_shared_experts;
        add(b, i, K3_DT_BF16, 0, A2(S, D), p, "shared_experts.gate_proj.weight");
        add(b, i, K3_DT_BF16, 0, A2(S, D), p, "shared_experts.up_proj.weight");
        add(b, i, K3_DT_BF16, 0, A2(D, S), p, "shared_experts.down_proj.weight");
    }
    char ep[160];
    for (uint32_t e = 0; e < c->num_experts && !b->err; e++) {
        snprintf(ep, sizeof ep, "%sexperts.%u.w1.", p, e);
        add_expert_matrix(b, c, i, ep, I, Dl);
        snprintf(ep, sizeof ep, "%sexperts.%u.w2.", p, e);
        add_expert_matrix(b, c, i, ep, Dl, I);
        snprintf(ep, sizeof ep, "%sexperts.%u.w3.", p, e);
        add_expert_matrix(b, c, i, ep, I, Dl);
    }
}

k3_err k3_expected_tensors(const k3_config *c, k3_xlist *out, k3_diag *d)
{
    memset(out, 0, sizeof *out);
    if (c->quantized && !c->experts_mxfp4 && c->num_experts)
        return k3_fail(d, K3_ERR_UNSUPPORTED,
                       "config: quantization '%s' format '%s' is not supported (only MXFP4 experts)",
                       c->quant_method, c->quant_format);
    uint64_t n_moe = 0;
    for (uint32_t li = 0; li < c->num_hidden_layers; li++) n_moe += (uint64_t)k3_layer_is_moe(c, li);
    uint64_t n_expert = n_moe * c->num_experts * (c->experts_mxfp4 ? 6u : 3u);   /* < 2^10 * 2^31 * 6 */
    if (n_expert > K3_XT_MAX_EXPERT_TENSORS)
        return k3_fail(d, K3_ERR_FORMAT,
                       "config: %llu MoE layers of %u experts make %llu expert tensors, more than the limit of %u",
                       (unsigned long long)n_moe, c->num_experts, (unsigned long long)n_expert,
                       K3_XT_MAX_EXPERT_TENSORS);
    builder b = {out, 0, 0, 0, d, K3_OK};
    uint64_t D = c->hidden_size, V = c->vocab_size;
    add(&b, -1, K3_DT_BF16, 0, A2(V, D), "model.", "embed_tokens.weight");
    for (uint32_t li = 0; li < c->num_hidden_layers && !b.err; li++) {
        int i = (int)li;
        char lp[64], ap[96], mp[96];
        snprintf(lp, sizeof lp, "model.layers.%d.", i);
        snprintf(ap, sizeof ap, "%sself_attn.", lp);
        snprintf(mp, sizeof mp, "%sblock_sparse_moe.", lp);
        add(&b, i, K3_DT_BF16, 0, A1(D), lp, "input_layernorm.weight");
        if (c->attn_res_block_size) {
            add(&b, i, K3_DT_BF16, 0, A1(D), lp, "self_attention_res_norm.weight");
            add(&b, i, K3_DT_BF16, 0, A2(1, D), lp, "self_attention_res_proj.weight");
        }
        if (k3_layer_is_kda(c, li)) add_kda(&b, c, i, ap);
        else add_mla(&b, c, i, ap);
        add(&b, i, K3_DT_BF16, 0, A1(D), lp, "post_attention_layernorm.weight");
        if (c->attn_res_block_size) {
            add(&b, i, K3_DT_BF16, 0, A1(D), lp, "mlp_res_norm.weight");
            add(&b, i, K3_DT_BF16, 0, A2(1, D), lp, "mlp_res_proj.weight");
        }
        if (k3_layer_is_moe(c, li)) {
            add_moe(&b, c, i, mp);
        } else {
            uint64_t I = c->intermediate_size;
            add(&b, i, K3_DT_BF16, 0, A2(I, D), lp, "mlp.gate_proj.weight");
            add(&b, i, K3_DT_BF16, 0, A2(I, D), lp, "mlp.up_proj.weight");
            add(&b, i, K3_DT_BF16, 0, A2(D, I), lp, "mlp.down_proj.weight");
        }
    }
    add(&b, -1, K3_DT_BF16, 0, A1(D), "model.", "norm.weight");
    if (c->attn_res_block_size) {
        add(&b, -1, K3_DT_BF16, 0, A1(D), "model.", "output_attn_res_norm.weight");
        add(&b, -1, K3_DT_BF16, 0, A2(1, D), "model.", "output_attn_res_proj.weight");
    }
    if (!c->tie_word_embeddings) add(&b, -1, K3_DT_BF16, 0, A2(V, D), "", "lm_head.weight");
    if (b.err) {
        k3_xlist_free(out);
        return b.err;
    }
    for (size_t k = 0; k < out->n; k++)
        out->t[k].name = out->pool + (uintptr_t)out->t[k].name;
    return K3_OK;
}

void k3_xlist_free(k3_xlist *l)
{
    if (!l) return;
    free(l->t);
    free(l->pool);
    memset(l, 0, sizeof *l);
}

/*
 * k3_tensor_kind.h - what a checkpoint tensor is for, from its name (and the
 * config when there is one), for summaries and for the packer's grouping.
 *
 * Names may carry the K3 prefix "language_model." and/or "model."; DeepSeek-style
 * "mlp.gate/experts/shared_experts" names are understood as well as Kimi's
 * "block_sparse_moe.*".
 */
#ifndef K3_TENSOR_KIND_H
#define K3_TENSOR_KIND_H

#include <stddef.h>
#include <stdint.h>

typedef enum k3_kind {
    K3_KIND_EMBED,        /* embed_tokens */
    K3_KIND_KDA,          /* KDA attention (self_attn.* of a KDA layer) */
    K3_KIND_MLA,          /* MLA attention (self_attn.* of an MLA layer) */
    K3_KIND_DENSE,        /* dense FFN: mlp.{gate,up,down}_proj */
    K3_KIND_ROUTER,       /* gate.weight, gate.e_score_correction_bias */
    K3_KIND_SHARED,       /* shared experts */
    K3_KIND_ROUTED,       /* routed experts */
    K3_KIND_LATENT,       /* routed_expert_{down,up}_proj, routed_expert_norm */
    K3_KIND_NORM,         /* input/post_attention layernorm, final norm */
    K3_KIND_ATTNRES,      /* self_attention_res_*, mlp_res_*, output_attn_res_* */
    K3_KIND_LM_HEAD,
    K3_KIND_VISION,       /* vision_tower.*, mm_projector.* */
    K3_KIND_OTHER,
    K3_KIND__COUNT
} k3_kind;

/* Attention type of a layer, as known from the config or guessed from names. */
enum { K3_ATTN_UNKNOWN = 0, K3_ATTN_KDA = 1, K3_ATTN_MLA = 2 };

const char *k3_kind_name(k3_kind k);   /* "embedding", "KDA attention", ... */
const char *k3_kind_id(k3_kind k);     /* "embed", "kda", ... (for JSON) */

/*
 * Layer number of a decoder-layer tensor ("...layers.N.rest"), -1 otherwise
 * (vision tensors and everything outside the language model's layers).
 * *rest (if not NULL) points past "layers.N.".
 */
int k3_tensor_layer(const char *name, const char **rest);

/*
 * Attention type implied by a name alone: K3_ATTN_KDA for KDA-only names
 * (conv1d, A_log, dt_bias, f_a/f_b/b_proj, k_proj, v_proj, g_a/g_b_proj, o_norm),
 * K3_ATTN_MLA for MLA-only names (q_a/q_b_proj, q_a_layernorm, kv_*),
 * K3_ATTN_UNKNOWN for names both have (q_proj, g_proj, o_proj) and non-attention names.
 */
int k3_attn_hint(const char *name);

/*
 * Classify a tensor. layer_attn[i] (i < n_layers) gives the attention type of
 * layer i (from the config, or from k3_attn_hint over the layer's tensors); it
 * may be NULL. An attention tensor of a layer of unknown type is classified by
 * its own name, and as MLA when the name is shared by both.
 */
k3_kind k3_classify(const char *name, const uint8_t *layer_attn, size_t n_layers);

#endif

/*
 * k3_config.h - the model's config.json as a struct, and the tensor list it implies.
 *
 * Accepts Kimi K3 (the text model nested under "text_config", tensor names
 * prefixed "language_model.") and flat Kimi-Linear configs (prefix "").
 * Field meanings: spec/K3-ARCHITECTURE.md §1. Layer numbers in the struct and
 * in every helper are 0-based; linear_attn_config.kda_layers and
 * full_attn_layers in the file are 1-based.
 *
 * Required fields: hidden_size, num_hidden_layers, vocab_size,
 * num_attention_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
 * v_head_dim, rms_norm_eps, hidden_act; intermediate_size when a layer is
 * dense; moe_intermediate_size and num_experts_per_token when num_experts > 0;
 * linear_attn_config.{kda_layers, num_heads, head_dim, short_conv_kernel_size}
 * when linear_attn_config is present (absent or null: every layer is MLA).
 * Everything else has the KimiLinearConfig default documented next to its field.
 */
#ifndef K3_CONFIG_H
#define K3_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "k3_error.h"

#define K3_MAX_LAYERS 1024
#define K3_CFG_MAX_DIM 0x7fffffffu      /* every size field must fit in 31 bits */

typedef enum { K3_ACT_SILU, K3_ACT_SITU } k3_act;
typedef enum { K3_ROUTER_SIGMOID, K3_ROUTER_SOFTMAX } k3_router_act;

typedef struct k3_config {
    int nested;                        /* read from "text_config" (K3) */
    char model_type[32];               /* top-level model_type, "" if absent */

    /* trunk */
    uint32_t hidden_size;              /* D */
    uint32_t num_hidden_layers;        /* L <= K3_MAX_LAYERS */
    uint32_t vocab_size;
    uint32_t intermediate_size;        /* dense FFN width; 0 if no dense layer needs it */
    k3_act hidden_act;                 /* "silu" or "situ" */
    double activation_situ_beta;       /* default 4.0 */
    double activation_situ_linear_beta;/* default 25.0 */
    double rms_norm_eps;
    int tie_word_embeddings;           /* default false; text_config, else top level */
    int64_t bos_token_id, eos_token_id, pad_token_id;   /* -1 if absent (first of a list) */
    uint32_t attn_res_block_size;      /* 0 = no Attention Residuals */

    /* MoE */
    uint32_t num_experts;              /* 0 / null = no MoE */
    uint32_t num_experts_per_token;
    uint32_t num_shared_experts;       /* default 0 */
    uint32_t moe_intermediate_size;    /* expert FFN width (also the shared unit width) */
    uint32_t routed_expert_hidden_size;/* latent MoE width; 0 = experts run at D */
    int latent_moe_use_norm;           /* default false */
    uint32_t first_k_dense_replace;    /* default 0 */
    uint32_t moe_layer_freq;           /* default 1 */
    int moe_renormalize;               /* default true */
    double routed_scaling_factor;      /* default 1.0 */
    k3_router_act router_act;          /* default sigmoid */
    uint32_t num_expert_group;         /* default 1 */
    uint32_t topk_group;               /* default 1 */

    /* MLA */
    uint32_t num_attention_heads;
    uint32_t num_key_value_heads;      /* default num_attention_heads */
    uint32_t q_lora_rank;              /* null / absent = 0: plain q_proj */
    uint32_t kv_lora_rank;
    uint32_t qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    int mla_use_nope;                  /* default false */
    int mla_use_output_gate;           /* default false */

    /* KDA (linear_attn_config) */
    int has_linear_attn;
    uint32_t kda_num_heads, kda_head_dim, kda_conv_kernel;
    int kda_full_rank_gate;            /* use_full_rank_gate, default false */
    int kda_has_lower_bound;           /* gate_lower_bound present and not null */
    double kda_gate_lower_bound;
    uint32_t n_kda_layers;
    uint8_t layer_kda[K3_MAX_LAYERS];  /* 1 if 0-based layer i is KDA */

    /* quantization_config (text_config, else top level) */
    int quantized;                     /* a quantization_config is present */
    char quant_method[48];             /* e.g. "compressed-tensors" */
    char quant_format[48];             /* e.g. "mxfp4-pack-quantized" */
    uint32_t quant_group_size;         /* weights.group_size of the config group; 0 if absent */
    int experts_mxfp4;                 /* routed experts stored as weight_packed/weight_scale U8 */
} k3_config;

/* Parse config.json text (len bytes). display_name prefixes messages. */
k3_err k3_config_parse(const char *text, size_t len, const char *display_name,
                       k3_config *out, k3_diag *d);
/* Read and parse a config.json file. */
k3_err k3_config_load(const char *path, k3_config *out, k3_diag *d);

int k3_layer_is_kda(const k3_config *c, uint32_t layer);   /* 0-based */
int k3_layer_is_moe(const k3_config *c, uint32_t layer);   /* 0-based */

/* Tensor-name prefix of the language model: "language_model." (K3) or "". */
const char *k3_config_prefix(const k3_config *c);

/* ------------------------------------------------------------------------- */
/* the expected tensor list (K3-ARCHITECTURE.md §3)                            */

enum { K3_XT_ANY_SHAPE = 1 };          /* flag: any shape with the same numel is fine */
#define K3_XT_MAX_EXPERT_TENSORS (1u << 24)   /* K3 has 494,592; a config implying more is refused */

typedef struct k3_xtensor {
    const char *name;                  /* without k3_config_prefix: "model.layers.3.self_attn.q_a_proj.weight" */
    uint64_t shape[4];
    uint64_t numel;
    uint64_t nbytes;
    int32_t layer;                     /* 0-based, -1 outside the layers */
    uint8_t dtype;                     /* k3_dtype */
    uint8_t rank;
    uint8_t flags;
} k3_xtensor;

typedef struct k3_xlist {
    k3_xtensor *t;
    size_t n;
    char *pool;                        /* owns the names */
} k3_xlist;

/*
 * Every tensor the text model's checkpoint must hold, in forward order:
 * embed, then per layer (norms, AttnRes, attention, FFN / MoE with its experts),
 * then the final norm, output AttnRes and lm_head. dtypes are K3's: BF16,
 * except F32 for KDA conv/A_log/dt_bias/o_norm and e_score_correction_bias,
 * and U8 weight_packed [out, in/2] / weight_scale [out, in/group] for MXFP4
 * experts. Vision tensors are not listed. Fails on arithmetic overflow, and
 * (before allocating anything) when the routed experts of all MoE layers come
 * to more than K3_XT_MAX_EXPERT_TENSORS tensors.
 */
k3_err k3_expected_tensors(const k3_config *c, k3_xlist *out, k3_diag *d);
void k3_xlist_free(k3_xlist *l);

#endif

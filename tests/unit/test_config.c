/*
 * test_config.c - config.json parsing: the real K3 config (tests/data), a flat
 * Kimi-Linear-style config, one bad variant per validation rule, the layer
 * helpers, tensor kinds, and the expected tensor list against hand-computed K3
 * numbers (K3-ARCHITECTURE.md §3).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_config.h"
#include "k3_tensor_kind.h"
#include "k3_test.h"
#include "safetensors.h"

static const k3_xtensor *find(const k3_xlist *l, const char *name)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->t[i].name, name) == 0) return &l->t[i];
    return NULL;
}

static void check_shape(int line, const k3_xlist *l, const char *name, k3_dtype dt, unsigned rank,
                        uint64_t a, uint64_t b, uint64_t c)
{
    const k3_xtensor *t = find(l, name);
    CHECK_MSG(t != NULL, "line %d: '%s' not in the expected list", line, name);
    if (!t) return;
    CHECK_MSG(t->dtype == dt, "line %d: '%s' dtype %s", line, name, k3_dtype_name((k3_dtype)t->dtype));
    CHECK_MSG(t->rank == rank, "line %d: '%s' rank %u", line, name, t->rank);
    uint64_t want[3] = {a, b, c};
    for (unsigned i = 0; i < rank && i < 3; i++)
        CHECK_MSG(t->shape[i] == want[i], "line %d: '%s' shape[%u] = %llu, expected %llu", line, name,
                  i, (unsigned long long)t->shape[i], (unsigned long long)want[i]);
}
#define SHAPE(name, dt, rank, a, b, c) check_shape(__LINE__, &xl, name, dt, rank, a, b, c)

static void test_k3(void)
{
    char path[4096];
    const char *data = getenv("K3_TEST_DATA");
    snprintf(path, sizeof path, "%s/kimi-k3-config.json", data ? data : "tests/data");
    k3_config c;
    k3_diag d = {0};
    k3_err e = k3_config_load(path, &c, &d);
    if (e) fprintf(stderr, "%s\n", d.msg);
    REQUIRE(e == K3_OK);
    CHECK(c.nested);
    CHECK_STR(c.model_type, "kimi_k3");
    CHECK_STR(k3_config_prefix(&c), "language_model.");
    CHECK_EQ_U64(c.hidden_size, 7168);
    CHECK_EQ_U64(c.num_hidden_layers, 93);
    CHECK_EQ_U64(c.vocab_size, 163840);
    CHECK_EQ_U64(c.intermediate_size, 33792);
    CHECK_EQ_U64(c.moe_intermediate_size, 3072);
    CHECK_EQ_U64(c.routed_expert_hidden_size, 3584);
    CHECK_EQ_U64(c.num_experts, 896);
    CHECK_EQ_U64(c.num_experts_per_token, 16);
    CHECK_EQ_U64(c.num_shared_experts, 2);
    CHECK_EQ_U64(c.first_k_dense_replace, 1);
    CHECK_EQ_U64(c.moe_layer_freq, 1);
    CHECK(c.moe_renormalize);
    CHECK(c.routed_scaling_factor == 1.0);
    CHECK(c.router_act == K3_ROUTER_SIGMOID);
    CHECK_EQ_U64(c.num_expert_group, 1);
    CHECK_EQ_U64(c.topk_group, 1);
    CHECK(c.latent_moe_use_norm);
    CHECK_EQ_U64(c.num_attention_heads, 96);
    CHECK_EQ_U64(c.num_key_value_heads, 96);
    CHECK_EQ_U64(c.q_lora_rank, 1536);
    CHECK_EQ_U64(c.kv_lora_rank, 512);
    CHECK_EQ_U64(c.qk_nope_head_dim, 128);
    CHECK_EQ_U64(c.qk_rope_head_dim, 64);
    CHECK_EQ_U64(c.v_head_dim, 128);
    CHECK(c.mla_use_nope);
    CHECK(c.mla_use_output_gate);
    CHECK(c.has_linear_attn);
    CHECK_EQ_U64(c.kda_num_heads, 96);
    CHECK_EQ_U64(c.kda_head_dim, 128);
    CHECK_EQ_U64(c.kda_conv_kernel, 4);
    CHECK(c.kda_full_rank_gate);
    CHECK(c.kda_has_lower_bound && c.kda_gate_lower_bound == -5.0);
    CHECK_EQ_U64(c.attn_res_block_size, 12);
    CHECK(c.hidden_act == K3_ACT_SITU);
    CHECK(c.activation_situ_beta == 4.0 && c.activation_situ_linear_beta == 25.0);
    CHECK(c.rms_norm_eps == 1e-5);
    CHECK(!c.tie_word_embeddings);
    CHECK(c.bos_token_id == 163584 && c.eos_token_id == 163586 && c.pad_token_id == 163839);
    CHECK(c.quantized);
    CHECK_STR(c.quant_method, "compressed-tensors");
    CHECK_STR(c.quant_format, "mxfp4-pack-quantized");
    CHECK_EQ_U64(c.quant_group_size, 32);
    CHECK(c.experts_mxfp4);

    /* layer schedule: 0-based MLA layers {3, 7, ..., 87, 91, 92}, 69 KDA; MoE 1..92 */
    CHECK_EQ_U64(c.n_kda_layers, 69);
    unsigned n_mla = 0, n_moe = 0;
    for (uint32_t i = 0; i < 93; i++) {
        int mla = i % 4 == 3 || i == 92;
        CHECK_MSG(k3_layer_is_kda(&c, i) == !mla, "layer %u", i);
        n_mla += mla;
        CHECK_MSG(k3_layer_is_moe(&c, i) == (i >= 1), "layer %u moe", i);
        n_moe += (unsigned)k3_layer_is_moe(&c, i);
    }
    CHECK_EQ_U64(n_mla, 24);
    CHECK_EQ_U64(n_moe, 92);
    CHECK(!k3_layer_is_kda(&c, 93) && !k3_layer_is_moe(&c, 93));

    /* the expected tensor list */
    k3_xlist xl;
    e = k3_expected_tensors(&c, &xl, &d);
    if (e) fprintf(stderr, "%s\n", d.msg);
    REQUIRE(e == K3_OK);
    /* outside layers: embed, norm, output AttnRes norm+proj, lm_head = 5;
     * per layer: 2 norms + 4 AttnRes; KDA 14, MLA 8; dense 3;
     * MoE: gate, bias, latent down/up/norm, 3 shared, 896 x 6 experts = 5384 */
    uint64_t want_n = 5 + (6 + 14 + 3) + 68 * (6 + 14 + 5384) + 24 * (6 + 8 + 5384);
    CHECK_EQ_U64(xl.n, want_n);
    CHECK_STR(xl.t[0].name, "model.embed_tokens.weight");
    CHECK_STR(xl.t[xl.n - 1].name, "lm_head.weight");
    SHAPE("model.embed_tokens.weight", K3_DT_BF16, 2, 163840, 7168, 0);
    SHAPE("lm_head.weight", K3_DT_BF16, 2, 163840, 7168, 0);
    SHAPE("model.norm.weight", K3_DT_BF16, 1, 7168, 0, 0);
    SHAPE("model.output_attn_res_norm.weight", K3_DT_BF16, 1, 7168, 0, 0);
    SHAPE("model.output_attn_res_proj.weight", K3_DT_BF16, 2, 1, 7168, 0);
    SHAPE("model.layers.0.input_layernorm.weight", K3_DT_BF16, 1, 7168, 0, 0);
    SHAPE("model.layers.0.self_attention_res_proj.weight", K3_DT_BF16, 2, 1, 7168, 0);
    SHAPE("model.layers.5.mlp_res_norm.weight", K3_DT_BF16, 1, 7168, 0, 0);
    /* KDA */
    SHAPE("model.layers.0.self_attn.q_proj.weight", K3_DT_BF16, 2, 12288, 7168, 0);
    SHAPE("model.layers.0.self_attn.q_conv1d.weight", K3_DT_F32, 3, 12288, 1, 4);
    SHAPE("model.layers.0.self_attn.v_conv1d.weight", K3_DT_F32, 3, 12288, 1, 4);
    SHAPE("model.layers.0.self_attn.dt_bias", K3_DT_F32, 1, 12288, 0, 0);
    SHAPE("model.layers.0.self_attn.f_a_proj.weight", K3_DT_BF16, 2, 128, 7168, 0);
    SHAPE("model.layers.0.self_attn.f_b_proj.weight", K3_DT_BF16, 2, 12288, 128, 0);
    SHAPE("model.layers.0.self_attn.b_proj.weight", K3_DT_BF16, 2, 96, 7168, 0);
    SHAPE("model.layers.0.self_attn.g_proj.weight", K3_DT_BF16, 2, 12288, 7168, 0);
    SHAPE("model.layers.0.self_attn.o_norm.weight", K3_DT_F32, 1, 128, 0, 0);
    SHAPE("model.layers.0.self_attn.o_proj.weight", K3_DT_BF16, 2, 7168, 12288, 0);
    const k3_xtensor *alog = find(&xl, "model.layers.0.self_attn.A_log");
    REQUIRE(alog);
    CHECK_EQ_U64(alog->numel, 96);
    CHECK_EQ_U64(alog->dtype, K3_DT_F32);
    CHECK(alog->flags & K3_XT_ANY_SHAPE);
    CHECK(find(&xl, "model.layers.0.self_attn.g_a_proj.weight") == NULL);
    CHECK(find(&xl, "model.layers.3.self_attn.A_log") == NULL);
    /* MLA with q-LoRA and output gate */
    SHAPE("model.layers.3.self_attn.q_a_proj.weight", K3_DT_BF16, 2, 1536, 7168, 0);
    SHAPE("model.layers.3.self_attn.q_a_layernorm.weight", K3_DT_BF16, 1, 1536, 0, 0);
    SHAPE("model.layers.3.self_attn.q_b_proj.weight", K3_DT_BF16, 2, 18432, 1536, 0);
    SHAPE("model.layers.3.self_attn.kv_a_proj_with_mqa.weight", K3_DT_BF16, 2, 576, 7168, 0);
    SHAPE("model.layers.3.self_attn.kv_a_layernorm.weight", K3_DT_BF16, 1, 512, 0, 0);
    SHAPE("model.layers.92.self_attn.kv_b_proj.weight", K3_DT_BF16, 2, 24576, 512, 0);
    SHAPE("model.layers.91.self_attn.g_proj.weight", K3_DT_BF16, 2, 12288, 7168, 0);
    SHAPE("model.layers.91.self_attn.o_proj.weight", K3_DT_BF16, 2, 7168, 12288, 0);
    CHECK(find(&xl, "model.layers.3.self_attn.q_proj.weight") == NULL);
    /* dense layer 0, MoE from layer 1 */
    SHAPE("model.layers.0.mlp.gate_proj.weight", K3_DT_BF16, 2, 33792, 7168, 0);
    SHAPE("model.layers.0.mlp.down_proj.weight", K3_DT_BF16, 2, 7168, 33792, 0);
    CHECK(find(&xl, "model.layers.1.mlp.gate_proj.weight") == NULL);
    SHAPE("model.layers.1.block_sparse_moe.gate.weight", K3_DT_BF16, 2, 896, 7168, 0);
    SHAPE("model.layers.1.block_sparse_moe.gate.e_score_correction_bias", K3_DT_F32, 1, 896, 0, 0);
    SHAPE("model.layers.1.block_sparse_moe.routed_expert_down_proj.weight", K3_DT_BF16, 2, 3584, 7168, 0);
    SHAPE("model.layers.1.block_sparse_moe.routed_expert_up_proj.weight", K3_DT_BF16, 2, 7168, 3584, 0);
    SHAPE("model.layers.1.block_sparse_moe.routed_expert_norm.weight", K3_DT_BF16, 1, 3584, 0, 0);
    SHAPE("model.layers.1.block_sparse_moe.shared_experts.gate_proj.weight", K3_DT_BF16, 2, 6144, 7168, 0);
    SHAPE("model.layers.1.block_sparse_moe.shared_experts.down_proj.weight", K3_DT_BF16, 2, 7168, 6144, 0);
    SHAPE("model.layers.1.block_sparse_moe.experts.0.w1.weight_packed", K3_DT_U8, 2, 3072, 1792, 0);
    SHAPE("model.layers.1.block_sparse_moe.experts.0.w1.weight_scale", K3_DT_U8, 2, 3072, 112, 0);
    SHAPE("model.layers.1.block_sparse_moe.experts.0.w3.weight_packed", K3_DT_U8, 2, 3072, 1792, 0);
    SHAPE("model.layers.92.block_sparse_moe.experts.895.w2.weight_packed", K3_DT_U8, 2, 3584, 1536, 0);
    SHAPE("model.layers.92.block_sparse_moe.experts.895.w2.weight_scale", K3_DT_U8, 2, 3584, 96, 0);
    CHECK(find(&xl, "model.layers.1.block_sparse_moe.experts.896.w1.weight_packed") == NULL);

    /* routed experts: 896 x 92 x 3 x 3072 x 3584 weights = 2.72 T; per expert 3 x (packed
     * 3072 x 3584 / 2 + scales 3072 x 3584 / 32) = 17,547,264 bytes -> 1.446 TB */
    uint64_t routed_bytes = 0, routed_w = 0, all_bytes = 0;
    for (size_t i = 0; i < xl.n; i++) {
        all_bytes += xl.t[i].nbytes;
        if (!strstr(xl.t[i].name, ".experts.")) continue;
        routed_bytes += xl.t[i].nbytes;
        if (strstr(xl.t[i].name, "weight_packed")) routed_w += 2 * xl.t[i].numel;
        CHECK(xl.t[i].layer >= 1 && xl.t[i].layer <= 92);
        CHECK(k3_classify(xl.t[i].name, NULL, 0) == K3_KIND_ROUTED);
    }
    CHECK_EQ_U64(routed_w, 2722740830208ULL);
    CHECK_EQ_U64(routed_bytes, 1446456066048ULL);    /* 92 x 896 x 17,547,264 */
    CHECK(all_bytes > routed_bytes);
    k3_xlist_free(&xl);
}

/* ------------------------------------------------------------------------- */

static const char FLAT[] =
    "{\"model_type\":\"kimi_linear\",\"hidden_size\":64,\"num_hidden_layers\":4,\"vocab_size\":100,"
    "\"intermediate_size\":96,\"moe_intermediate_size\":32,\"num_experts\":4,\"num_experts_per_token\":2,"
    "\"num_shared_experts\":1,\"first_k_dense_replace\":1,\"moe_layer_freq\":1,\"num_attention_heads\":2,"
    "\"num_key_value_heads\":2,\"q_lora_rank\":null,\"kv_lora_rank\":16,\"qk_nope_head_dim\":8,"
    "\"qk_rope_head_dim\":4,\"v_head_dim\":8,\"mla_use_nope\":true,\"rms_norm_eps\":1e-5,"
    "\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,\"eos_token_id\":[7,8],"
    "\"linear_attn_config\":{\"kda_layers\":[1,2,3],\"full_attn_layers\":[4],\"num_heads\":2,"
    "\"head_dim\":8,\"short_conv_kernel_size\":4}}";

#define LA "\"linear_attn_config\":{\"kda_layers\":[1,2,3],\"full_attn_layers\":[4],\"num_heads\":2," \
           "\"head_dim\":8,\"short_conv_kernel_size\":4}"

/* base with `from` replaced by `to` (must occur); malloc'd. */
static char *replace(const char *base, const char *from, const char *to)
{
    const char *p = strstr(base, from);
    REQUIRE(p);
    size_t n = strlen(base) - strlen(from) + strlen(to) + 1;
    char *s = malloc(n);
    REQUIRE(s);
    snprintf(s, n, "%.*s%s%s", (int)(p - base), base, to, p + strlen(from));
    return s;
}

static char *variant(const char *from, const char *to) { return replace(FLAT, from, to); }

static void bad(int line, const char *from, const char *to, const char *want)
{
    char *s = variant(from, to);
    k3_config c;
    k3_diag d = {0};
    k3_err e = k3_config_parse(s, strlen(s), "cfg.json", &c, &d);
    CHECK_MSG(e == K3_ERR_FORMAT, "line %d: returned %d (%s)", line, e, d.msg);
    CHECK_MSG(e && strstr(d.msg, want), "line %d: message '%s' lacks '%s'", line, d.msg, want);
    CHECK_MSG(e && strncmp(d.msg, "'cfg.json': ", 12) == 0, "line %d: '%s'", line, d.msg);
    free(s);
}
#define BAD(from, to, want) bad(__LINE__, from, to, want)

static void test_flat(void)
{
    k3_config c;
    k3_diag d = {0};
    k3_err e = k3_config_parse(FLAT, strlen(FLAT), "cfg.json", &c, &d);
    if (e) fprintf(stderr, "%s\n", d.msg);
    REQUIRE(e == K3_OK);
    CHECK(!c.nested);
    CHECK_STR(k3_config_prefix(&c), "");
    CHECK_EQ_U64(c.q_lora_rank, 0);
    CHECK(c.eos_token_id == 7 && c.bos_token_id == -1);
    CHECK(!c.quantized && !c.experts_mxfp4);
    CHECK(k3_layer_is_kda(&c, 0) && k3_layer_is_kda(&c, 2) && !k3_layer_is_kda(&c, 3));
    CHECK(!k3_layer_is_moe(&c, 0) && k3_layer_is_moe(&c, 1) && k3_layer_is_moe(&c, 3));
    k3_xlist xl;
    REQUIRE(k3_expected_tensors(&c, &xl, &d) == K3_OK);
    SHAPE("model.layers.3.self_attn.q_proj.weight", K3_DT_BF16, 2, 2 * 12, 64, 0);
    SHAPE("model.layers.0.self_attn.g_a_proj.weight", K3_DT_BF16, 2, 8, 64, 0);
    SHAPE("model.layers.0.self_attn.g_b_proj.weight", K3_DT_BF16, 2, 16, 8, 0);
    SHAPE("model.layers.1.block_sparse_moe.experts.3.w1.weight", K3_DT_BF16, 2, 32, 64, 0);
    SHAPE("model.layers.1.block_sparse_moe.experts.3.w2.weight", K3_DT_BF16, 2, 64, 32, 0);
    SHAPE("model.layers.1.block_sparse_moe.shared_experts.up_proj.weight", K3_DT_BF16, 2, 32, 64, 0);
    SHAPE("lm_head.weight", K3_DT_BF16, 2, 100, 64, 0);
    CHECK(find(&xl, "model.layers.3.self_attn.g_proj.weight") == NULL);          /* no output gate */
    CHECK(find(&xl, "model.layers.1.block_sparse_moe.routed_expert_norm.weight") == NULL);
    CHECK(find(&xl, "model.layers.0.self_attention_res_norm.weight") == NULL);   /* no AttnRes */
    k3_xlist_free(&xl);

    /* full_attn_layers may be absent: every other layer is MLA */
    char *s = variant(",\"full_attn_layers\":[4]", "");
    REQUIRE(k3_config_parse(s, strlen(s), "cfg.json", &c, &d) == K3_OK);
    CHECK(!k3_layer_is_kda(&c, 3));
    free(s);
    /* no linear_attn_config: all MLA; tied embeddings drop lm_head */
    s = variant(LA, "\"linear_attn_config\":null");
    char *s2 = replace(s, "\"tie_word_embeddings\":false", "\"tie_word_embeddings\":true");
    e = k3_config_parse(s2, strlen(s2), "cfg.json", &c, &d);
    if (e) fprintf(stderr, "%s\n", d.msg);
    REQUIRE(e == K3_OK);
    CHECK_EQ_U64(c.n_kda_layers, 0);
    CHECK(!k3_layer_is_kda(&c, 0));
    REQUIRE(k3_expected_tensors(&c, &xl, &d) == K3_OK);
    CHECK(find(&xl, "lm_head.weight") == NULL);
    CHECK(find(&xl, "model.layers.0.self_attn.q_proj.weight") != NULL);
    k3_xlist_free(&xl);
    free(s);
    free(s2);
    /* an unsupported expert quantization cannot give a tensor list */
    s = variant("\"hidden_act\"", "\"quantization_config\":{\"quant_method\":\"fp8\"},\"hidden_act\"");
    REQUIRE(k3_config_parse(s, strlen(s), "cfg.json", &c, &d) == K3_OK);
    CHECK(k3_expected_tensors(&c, &xl, &d) == K3_ERR_UNSUPPORTED);
    free(s);
    /* overflow in the list: a (2^31-1) x (2^31-1) BF16 embedding is 2^66 bits */
    s = variant("\"vocab_size\":100", "\"vocab_size\":2147483647");
    s2 = replace(s, "\"hidden_size\":64", "\"hidden_size\":2147483647");
    REQUIRE(k3_config_parse(s2, strlen(s2), "cfg.json", &c, &d) == K3_OK);
    CHECK(k3_expected_tensors(&c, &xl, &d) == K3_ERR_FORMAT);
    CHECK(strstr(d.msg, "overflows 64 bits") != NULL);
    free(s);
    free(s2);
    /* a config implying tens of millions of tensors is refused before the list is built
       (a hostile num_experts must not make k3verify --checkpoint allocate until the OOM killer) */
    s = variant("\"num_experts\":4", "\"num_experts\":2000000");
    REQUIRE(k3_config_parse(s, strlen(s), "cfg.json", &c, &d) == K3_OK);
    e = k3_expected_tensors(&c, &xl, &d);
    CHECK_MSG(e == K3_ERR_FORMAT && strstr(d.msg, "more than the limit"), "returned %d: %s", e, d.msg);
    if (!e) k3_xlist_free(&xl);
    free(s);
}

static void test_bad(void)
{
    BAD("\"hidden_size\":64,", "", "missing field 'hidden_size'");
    BAD("\"hidden_size\":64", "\"hidden_size\":\"64\"", "field 'hidden_size' is a string, not an integer");
    BAD("\"hidden_size\":64", "\"hidden_size\":64.5", "field 'hidden_size' is a real number, not an integer");
    BAD("\"hidden_size\":64", "\"hidden_size\":0", "field 'hidden_size' must be positive, not 0");
    BAD("\"hidden_size\":64", "\"hidden_size\":-64", "field 'hidden_size' = -64 is out of range");
    BAD("\"hidden_size\":64", "\"hidden_size\":4294967296", "is out of range [0, 2147483647]");
    /* hostile sizes (issue 9): each refused by its field's name, before anything is sized from it */
    BAD("\"hidden_size\":64", "\"hidden_size\":1099511627776",
        "field 'hidden_size' = 1099511627776 is out of range [0, 2147483647]");
    BAD("\"num_attention_heads\":2", "\"num_attention_heads\":0", "field 'num_attention_heads' must be positive, not 0");
    BAD("\"num_key_value_heads\":2", "\"num_key_value_heads\":0", "field 'num_key_value_heads' must be positive, not 0");
    BAD("\"num_heads\":2", "\"num_heads\":0", "field 'linear_attn_config.num_heads' must be positive, not 0");
    BAD("\"kv_lora_rank\":16", "\"kv_lora_rank\":-16", "field 'kv_lora_rank' = -16 is out of range");
    BAD("\"q_lora_rank\":null", "\"q_lora_rank\":-1", "field 'q_lora_rank' = -1 is out of range");
    BAD("\"qk_rope_head_dim\":4", "\"qk_rope_head_dim\":-4", "field 'qk_rope_head_dim' = -4 is out of range");
    BAD("\"num_experts\":4", "\"num_experts\":-4", "field 'num_experts' = -4 is out of range");
    BAD("\"full_attn_layers\":[4]", "\"full_attn_layers\":[5]",
        "linear_attn_config.full_attn_layers[0] = 5 is out of range: layer numbers here are 1-based, 1..4");
    BAD("\"kda_layers\":[1,2,3]", "\"kda_layers\":[-1,2,3]", "kda_layers[0] = -1 is out of range");
    BAD("\"kda_layers\":[1,2,3]", "\"kda_layers\":[1,2,3,4294967300]", "kda_layers[3] = 4294967300 is out of range");
    BAD("\"vocab_size\":100,", "", "missing field 'vocab_size'");
    BAD("\"num_hidden_layers\":4", "\"num_hidden_layers\":2000", "num_hidden_layers = 2000 exceeds the limit of 1024");
    BAD("\"rms_norm_eps\":1e-5", "\"rms_norm_eps\":0", "rms_norm_eps must be positive");
    BAD("\"rms_norm_eps\":1e-5", "\"rms_norm_eps\":\"1e-5\"", "field 'rms_norm_eps' is a string, not a number");
    BAD("\"hidden_act\":\"silu\"", "\"hidden_act\":\"gelu\"", "hidden_act is 'gelu', not 'silu' or 'situ'");
    BAD("\"mla_use_nope\":true", "\"mla_use_nope\":1", "field 'mla_use_nope' is an integer, not a boolean");
    BAD("\"kv_lora_rank\":16,", "", "missing field 'kv_lora_rank'");
    BAD("\"num_experts_per_token\":2", "\"num_experts_per_token\":5", "num_experts_per_token 5 exceeds num_experts 4");
    BAD("\"num_experts_per_token\":2,", "", "missing field 'num_experts_per_token'");
    BAD("\"intermediate_size\":96,", "", "missing field 'intermediate_size'");
    BAD("\"eos_token_id\":[7,8]", "\"eos_token_id\":\"x\"", "field 'eos_token_id' is a string");
    BAD("\"moe_layer_freq\":1", "\"moe_layer_freq\":0", "field 'moe_layer_freq' must be positive");
    BAD("\"first_k_dense_replace\":1", "\"first_k_dense_replace\":1,\"moe_router_activation_func\":\"relu\"",
        "moe_router_activation_func' is 'relu'");
    /* the layer lists (1-based) */
    BAD("\"kda_layers\":[1,2,3]", "\"kda_layers\":[0,1,2]",
        "linear_attn_config.kda_layers[0] = 0 is out of range: layer numbers here are 1-based, 1..4");
    BAD("\"kda_layers\":[1,2,3]", "\"kda_layers\":[1,2,5]", "kda_layers[2] = 5 is out of range");
    BAD("\"full_attn_layers\":[4]", "\"full_attn_layers\":[3,4]", "layer 3 (1-based) is in both");
    BAD("\"full_attn_layers\":[4]", "\"full_attn_layers\":[]", "layer 4 (1-based) is in neither");
    BAD("\"kda_layers\":[1,2,3]", "\"kda_layers\":[1,2,2]", "layer 2 is listed twice in linear_attn_config.kda_layers");
    BAD("\"kda_layers\":[1,2,3]", "\"kda_layers\":[1,2,\"3\"]", "kda_layers[2] is a string, not a layer number");
    BAD("\"kda_layers\":[1,2,3],", "", "missing field 'linear_attn_config.kda_layers'");
    BAD("\"kda_layers\":[1,2,3]", "\"kda_layers\":{}", "field 'linear_attn_config.kda_layers' is an object, not an array");
    BAD("\"head_dim\":8,", "", "missing field 'linear_attn_config.head_dim'");
    BAD(LA, "\"linear_attn_config\":[]", "field 'linear_attn_config' is an array, not an object");
    /* quantization */
    BAD("\"hidden_act\"", "\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":"
        "\"mxfp4-pack-quantized\",\"config_groups\":{\"g\":{\"weights\":{\"group_size\":64}}}},\"hidden_act\"",
        "group_size is 64, but MXFP4 blocks are 32");
    /* whole-document shape */
    BAD("{\"model_type\"", "[{\"model_type\"", "not valid JSON");
    BAD("\"model_type\":\"kimi_linear\"", "\"model_type\":\"kimi_linear\",\"text_config\":5",
        "field 'text_config' is an integer, not an object");
    BAD("\"model_type\":\"kimi_linear\"", "\"model_type\":\"kimi_linear\",\"model_type\":\"x\"", "duplicate object key");
    /* jansson without JSON_ALLOW_NUL rejects \u0000 (a NUL would cut the string short) */
    BAD("\"model_type\":\"kimi_linear\"", "\"model_type\":\"kimi\\u0000linear\"", "\\u0000 is not allowed");

    k3_config c;
    k3_diag d = {0};
    CHECK(k3_config_parse("[1]", 3, "cfg.json", &c, &d) == K3_ERR_FORMAT);
    CHECK(strstr(d.msg, "config is an array, not a JSON object") != NULL);
    /* MXFP4 needs group-divisible expert sizes */
    char *s = variant("\"moe_intermediate_size\":32", "\"moe_intermediate_size\":48,\"quantization_config\":"
                      "{\"quant_method\":\"compressed-tensors\",\"format\":\"mxfp4-pack-quantized\"}");
    CHECK(k3_config_parse(s, strlen(s), "cfg.json", &c, &d) == K3_ERR_FORMAT);
    CHECK(strstr(d.msg, "MXFP4 experts need sizes divisible by 32") != NULL);
    free(s);
    /* nested: messages name text_config */
    const char *nested = "{\"text_config\":{\"num_hidden_layers\":2}}";
    CHECK(k3_config_parse(nested, strlen(nested), "cfg.json", &c, &d) == K3_ERR_FORMAT);
    CHECK(strstr(d.msg, "missing field 'text_config.hidden_size'") != NULL);
}

static void test_kinds(void)
{
    static const struct { const char *name; k3_kind kind; int layer; } cases[] = {
        {"language_model.model.embed_tokens.weight", K3_KIND_EMBED, -1},
        {"model.embed_tokens.weight", K3_KIND_EMBED, -1},
        {"language_model.lm_head.weight", K3_KIND_LM_HEAD, -1},
        {"lm_head.weight", K3_KIND_LM_HEAD, -1},
        {"language_model.model.norm.weight", K3_KIND_NORM, -1},
        {"language_model.model.output_attn_res_proj.weight", K3_KIND_ATTNRES, -1},
        {"language_model.model.layers.7.input_layernorm.weight", K3_KIND_NORM, 7},
        {"model.layers.7.post_attention_layernorm.weight", K3_KIND_NORM, 7},
        {"language_model.model.layers.12.self_attention_res_norm.weight", K3_KIND_ATTNRES, 12},
        {"language_model.model.layers.12.mlp_res_proj.weight", K3_KIND_ATTNRES, 12},
        {"language_model.model.layers.0.self_attn.q_conv1d.weight", K3_KIND_KDA, 0},
        {"language_model.model.layers.0.self_attn.A_log", K3_KIND_KDA, 0},
        {"language_model.model.layers.3.self_attn.kv_b_proj.weight", K3_KIND_MLA, 3},
        {"language_model.model.layers.0.mlp.gate_proj.weight", K3_KIND_DENSE, 0},
        {"language_model.model.layers.1.block_sparse_moe.gate.weight", K3_KIND_ROUTER, 1},
        {"language_model.model.layers.1.block_sparse_moe.gate.e_score_correction_bias", K3_KIND_ROUTER, 1},
        {"language_model.model.layers.1.block_sparse_moe.shared_experts.up_proj.weight", K3_KIND_SHARED, 1},
        {"language_model.model.layers.1.block_sparse_moe.experts.5.w2.weight_scale", K3_KIND_ROUTED, 1},
        {"language_model.model.layers.1.block_sparse_moe.routed_expert_norm.weight", K3_KIND_LATENT, 1},
        {"language_model.model.layers.1.block_sparse_moe.routed_expert_up_proj.weight", K3_KIND_LATENT, 1},
        {"model.layers.4.mlp.experts.1.down_proj.weight", K3_KIND_ROUTED, 4},
        {"model.layers.4.mlp.gate.weight", K3_KIND_ROUTER, 4},
        {"model.layers.4.mlp.shared_experts.down_proj.weight", K3_KIND_SHARED, 4},
        {"vision_tower.encoder.blocks.3.attn.qkv.weight", K3_KIND_VISION, -1},
        {"mm_projector.proj.0.weight", K3_KIND_VISION, -1},
        {"language_model.model.layers.x.foo", K3_KIND_OTHER, -1},
        {"something.else", K3_KIND_OTHER, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_MSG(k3_classify(cases[i].name, NULL, 0) == cases[i].kind, "%s -> %s", cases[i].name,
                  k3_kind_name(k3_classify(cases[i].name, NULL, 0)));
        CHECK_MSG(k3_tensor_layer(cases[i].name, NULL) == cases[i].layer, "%s layer", cases[i].name);
    }
    /* names both attention kinds have follow the layer type, then default to MLA */
    uint8_t attn[2] = {K3_ATTN_KDA, K3_ATTN_UNKNOWN};
    CHECK(k3_classify("model.layers.0.self_attn.o_proj.weight", attn, 2) == K3_KIND_KDA);
    CHECK(k3_classify("model.layers.1.self_attn.o_proj.weight", attn, 2) == K3_KIND_MLA);
    CHECK(k3_classify("model.layers.1.self_attn.k_proj.weight", attn, 2) == K3_KIND_KDA);
    CHECK(k3_attn_hint("model.layers.1.self_attn.g_proj.weight") == K3_ATTN_UNKNOWN);
    CHECK(k3_attn_hint("model.layers.1.self_attn.q_b_proj.weight") == K3_ATTN_MLA);
    CHECK(k3_attn_hint("model.layers.1.self_attn.dt_bias") == K3_ATTN_KDA);
    CHECK(k3_attn_hint("model.layers.1.mlp.up_proj.weight") == K3_ATTN_UNKNOWN);
}

int main(void)
{
    test_k3();
    test_flat();
    test_bad();
    test_kinds();
    return k3_test_done();
}

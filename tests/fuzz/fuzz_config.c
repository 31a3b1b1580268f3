/*
 * fuzz_config.c - libFuzzer target: the input is a config.json, given to
 * k3_config_parse. An accepted config must satisfy the promises the tools rely
 * on (sizes in range, layer lists inside the model, top-k within the experts),
 * and its expected tensor list must build or be refused cleanly, never abort
 * or allocate without bound. A rejection must be a clean K3_ERR_FORMAT naming the file.
 */
#include "fuzz_util.h"

#include "k3_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    k3_config c;
    k3_diag d = {0};
    k3_err e = k3_config_parse((const char *)data, size, "config.json", &c, &d);
    if (e) {
        fz_check_err(e, &d);
        FZ_EXPECT(e == K3_ERR_FORMAT && strncmp(d.msg, "'config.json': ", 15) == 0);
        return 0;
    }
    FZ_EXPECT(c.hidden_size > 0 && c.hidden_size <= K3_CFG_MAX_DIM);
    FZ_EXPECT(c.num_hidden_layers > 0 && c.num_hidden_layers <= K3_MAX_LAYERS);
    FZ_EXPECT(c.vocab_size > 0 && c.num_attention_heads > 0 && c.num_key_value_heads > 0);
    FZ_EXPECT(c.kv_lora_rank > 0 && c.qk_nope_head_dim > 0 && c.v_head_dim > 0);
    FZ_EXPECT(c.rms_norm_eps > 0);
    if (c.num_experts) FZ_EXPECT(c.num_experts_per_token > 0 && c.num_experts_per_token <= c.num_experts);
    uint32_t n_kda = 0;
    for (uint32_t i = 0; i < K3_MAX_LAYERS; i++) {
        if (i >= c.num_hidden_layers) FZ_EXPECT(!c.layer_kda[i]);
        n_kda += c.layer_kda[i];
    }
    FZ_EXPECT(n_kda == c.n_kda_layers);
    if (n_kda) FZ_EXPECT(c.kda_num_heads > 0 && c.kda_head_dim > 0 && c.kda_conv_kernel > 0);

    k3_xlist xl;
    e = k3_expected_tensors(&c, &xl, &d);
    if (e) {
        fz_check_err(e, &d);
        FZ_EXPECT(e == K3_ERR_FORMAT || e == K3_ERR_UNSUPPORTED || e == K3_ERR_NOMEM);
        return 0;
    }
    FZ_EXPECT(xl.n > 0);
    for (size_t i = 0; i < xl.n; i++) {
        const k3_xtensor *t = &xl.t[i];
        FZ_EXPECT(t->name && t->name[0] && t->rank <= 4);
        FZ_EXPECT(t->layer >= -1 && t->layer < (int32_t)c.num_hidden_layers);
    }
    fz_accepted("config and its tensor list");
    k3_xlist_free(&xl);
    return 0;
}

/* model_shape.c - the model's dimensions and buffer sizes from the config (model_shape.h). */
#include "model_shape.h"

#include <string.h>

#include "kern.h"                     /* k3_xpack_cols */
#include "weights.h"                  /* sizeof(k3_expert): the MoE layer's expert handles */

static uint32_t umax(uint32_t a, uint32_t b) { return a > b ? a : b; }

k3_err k3_model_dims(const k3_config *c, k3_dims *z, k3_diag *d)
{
    memset(z, 0, sizeof *z);
    if (!c->mla_use_nope)
        return k3_fail(d, K3_ERR_UNSUPPORTED, "config: MLA with rotary embeddings (mla_use_nope false) is not supported");
    if (c->num_expert_group > 1)
        return k3_fail(d, K3_ERR_UNSUPPORTED, "config: grouped top-k routing (num_expert_group %u) is not supported",
                       c->num_expert_group);
    if (c->num_key_value_heads != c->num_attention_heads)
        return k3_fail(d, K3_ERR_UNSUPPORTED, "config: num_key_value_heads %u != num_attention_heads %u",
                       c->num_key_value_heads, c->num_attention_heads);
    z->D = c->hidden_size; z->L = c->num_hidden_layers; z->V = c->vocab_size;
    z->H = c->kda_num_heads; z->K = c->kda_head_dim; z->C = z->H * z->K; z->W = c->kda_conv_kernel;
    z->Hm = c->num_attention_heads; z->dn = c->qk_nope_head_dim; z->dr = c->qk_rope_head_dim;
    z->dv = c->v_head_dim; z->R = c->kv_lora_rank; z->Q = c->q_lora_rank;
    z->I = c->intermediate_size;
    z->E = c->num_experts; z->k = c->num_experts_per_token; z->Ie = c->moe_intermediate_size;
    z->Dl = c->routed_expert_hidden_size ? c->routed_expert_hidden_size : z->D;
    z->Ish = c->moe_intermediate_size * c->num_shared_experts;
    z->block = c->attn_res_block_size;
    z->n_blocks = z->block ? (z->L + z->block - 1) / z->block : 0;
    if (z->E && (z->k == 0 || z->k > z->E))
        return k3_fail(d, K3_ERR_MODEL, "config: num_experts_per_token %u must be in 1..num_experts (%u)", z->k, z->E);
    if (c->has_linear_attn && c->n_kda_layers && (z->W < 1 || z->W > 64))
        return k3_fail(d, K3_ERR_MODEL, "config: short_conv_kernel_size %u is not in 1..64", z->W);
    for (uint32_t i = 0; i < z->L; i++) {
        if (!k3_layer_is_kda(c, i)) { z->n_mla++; continue; }
        z->fa_rank = z->K;
        z->ga_rank = c->kda_full_rank_gate ? 0 : z->K;
    }
    return K3_OK;
}

/* Buffer b: count instances of elems x esz bytes each (an empty one still takes 64). */
static void buf(k3_model_shape *s, k3_buf b, uint64_t elems, uint64_t esz, uint32_t count)
{
    uint64_t n = elems * esz;
    if (n == 0) n = 64;
    s->bytes[b] = n;
    s->count[b] = count;
    s->total += n * count;
}

void k3_model_sizes(const k3_dims *z, uint32_t batch, uint32_t context, int all_logits, uint32_t verify,
                    uint32_t n_seq, k3_model_shape *s)
{
    memset(s, 0, sizeof *s);
    s->d = *z;
    uint64_t B = batch, ctx = context, S = n_seq ? n_seq : 1;
    s->n_seq = (uint32_t)S;
    uint32_t n_kda = z->L - z->n_mla;
    buf(s, K3B_MLA_SLOT, z->L, sizeof(int32_t), 1);
    buf(s, K3B_KDA_WIN, 3ull * z->C * (z->W - 1 ? z->W - 1 : 1), sizeof(float), n_kda * (uint32_t)S);
    buf(s, K3B_KDA_S, (uint64_t)z->H * z->K * z->K, sizeof(float), n_kda * (uint32_t)S);
    buf(s, K3B_MLA_C, (uint64_t)z->n_mla * ctx * z->R, sizeof(float), (uint32_t)S);
    buf(s, K3B_MLA_KR, (uint64_t)z->n_mla * ctx * z->dr, sizeof(float), (uint32_t)S);

    uint64_t BD = B * z->D;
    for (k3_buf b = K3B_H; b <= K3B_F; b++) buf(s, b, BD, 4, 1);
    buf(s, K3B_BLOCKS, (uint64_t)(z->n_blocks ? z->n_blocks : 1) * BD, 4, 1);
    uint32_t vmax = umax(umax(z->D, z->C), umax(umax(z->Q, z->R), z->Dl));
    buf(s, K3B_VEC, vmax, 4, 1);
    buf(s, K3B_VEC2, vmax, 4, 1);

    uint32_t tw = umax(umax(umax(z->C, z->D), z->Hm * (z->dn + z->dr)), umax(z->Hm * z->dv, z->R + z->dr));
    for (k3_buf b = K3B_T0; b <= K3B_T4; b++) buf(s, b, B * tw, 4, 1);
    uint32_t sw = umax(umax(z->fa_rank, z->ga_rank), umax(z->Q, z->H));
    buf(s, K3B_SMALL, B * umax(sw, 1), 4, 1);
    buf(s, K3B_CONV_W, 3ull * z->C * z->W, 4, 1);
    buf(s, K3B_HEADVEC, vmax, 4, 1);
    buf(s, K3B_CONVTMP, (uint64_t)z->W + B, 4, 1);
    buf(s, K3B_HEADTMP, 2ull * z->H * z->K, 4, 1);
    buf(s, K3B_ALOG, umax(z->H, 1), 4, 1);
    buf(s, K3B_MLA_Q, (uint64_t)z->Hm * z->R, 4, 1);
    buf(s, K3B_MLA_S, (uint64_t)z->Hm * ctx, 4, 1);
    buf(s, K3B_MLA_OL, (uint64_t)z->Hm * z->R, 4, 1);

    /* [B][fw], and at least [k][Ie]: a decode step's experts side by side (model_ffn.c) */
    uint32_t fw = umax(umax(z->I, z->Ish), z->Ie);
    uint64_t gw = B * fw > (uint64_t)z->k * z->Ie ? B * fw : (uint64_t)z->k * z->Ie;
    buf(s, K3B_G, gw, 4, 1);
    buf(s, K3B_U, gw, 4, 1);
    uint32_t moe = z->E ? 1 : 0;                       /* the MoE scratch exists only with experts */
    uint64_t nk = B * z->k, nu = nk < z->E ? nk : z->E;
    buf(s, K3B_LOGITS_E, B * z->E, 4, moe);
    buf(s, K3B_BIAS, z->E, 4, moe);
    buf(s, K3B_SEL, z->E, 4, moe);
    buf(s, K3B_IDX, nk, 4, moe);
    buf(s, K3B_WTS, nk, 4, moe);
    buf(s, K3B_XL, B * z->Dl, 4, moe);
    buf(s, K3B_YL, B * z->Dl, 4, moe);
    buf(s, K3B_Y, nk * z->Dl, 4, moe);
    buf(s, K3B_XE, B * z->Dl, 4, moe);
    buf(s, K3B_YE, B * z->Dl, 4, moe);
    buf(s, K3B_UNIQ, nu, 4, moe);
    buf(s, K3B_TOK_OF, nk, 4, moe);
    buf(s, K3B_SLOT_OF, nk, 4, moe);
    buf(s, K3B_EX, nu, sizeof(k3_expert), moe);
    buf(s, K3B_SEEN, z->E, 4, moe);
    /* the logits rows of a pass: its last token's (one per sequence), every token's with
       all_logits, a verify pass's tokens (of each sequence) */
    uint64_t rows = all_logits ? B : 1, vrows = S * (verify ? verify : 1);
    if (vrows > B) vrows = B;
    if (vrows > rows) rows = vrows;
    buf(s, K3B_LOGITS, rows * (uint64_t)z->V, 4, 1);
    /* a verify pass leaves the KDA states as they were and records what their update needs
       (model_attn.c): per KDA layer [verify][6C + H], and one layer's working copy [H][K][K] */
    uint32_t vk = verify && n_kda ? 1 : 0;
    buf(s, K3B_KDA_REC, (uint64_t)verify * (6ull * z->C + z->H), 4, vk ? n_kda * (uint32_t)S : 0);
    buf(s, K3B_KDA_WORK, (uint64_t)z->H * z->K * z->K, 4, vk);
    s->verify_bytes = vk ? s->bytes[K3B_KDA_REC] * n_kda * S + s->bytes[K3B_KDA_WORK] : 0;
    /* a batch's input packed once for all the row blocks of its products (kern.h k3_xpack):
       [B][the widest input of any product]; a model of one token per pass needs none */
    uint32_t xw = umax(umax(umax(z->D, z->C), umax(z->fa_rank, z->ga_rank)),
                       umax(umax(z->Q, z->Hm * z->dv), umax(umax(z->I, z->Ish), umax(z->Ie, z->Dl))));
    buf(s, K3B_XPK, B >= 2 ? B * k3_xpack_cols(xw) : 0, 4, 1);
    uint64_t rows0 = all_logits ? B : (S < B ? S : B);               /* the rows without verify passes */
    if (verify > 1 && rows > rows0) s->verify_bytes += (rows - rows0) * (uint64_t)z->V * 4;
    buf(s, K3B_SEQ_LAST, z->V, 4, (uint32_t)S);

    s->kda_bytes = n_kda * (3ull * z->C * (z->W - 1 ? z->W - 1 : 1) + (uint64_t)z->H * z->K * z->K) * sizeof(float);
    s->mla_bytes = (uint64_t)z->n_mla * context * (z->R + z->dr) * sizeof(float);
    s->seq_bytes = s->bytes[K3B_KDA_WIN] * n_kda + s->bytes[K3B_KDA_S] * n_kda + s->bytes[K3B_MLA_C] +
                   s->bytes[K3B_MLA_KR] + (vk ? s->bytes[K3B_KDA_REC] * n_kda : 0) + s->bytes[K3B_SEQ_LAST];
}

k3_err k3_model_shape_from_config(const k3_config *c, uint32_t batch, uint32_t context, int all_logits,
                                  uint32_t verify, uint32_t n_seq, k3_model_shape *s, k3_diag *d)
{
    k3_dims z;
    k3_err e = k3_model_dims(c, &z, d);
    if (e) return e;
    k3_model_sizes(&z, batch, context, all_logits, verify, n_seq, s);
    return K3_OK;
}

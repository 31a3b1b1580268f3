/*
 * fuzz_index.c - libFuzzer target: the input is model.safetensors.index.json
 * in a scratch checkpoint directory that holds two small real shards
 * (model-00001-of-00002.safetensors: model.embed_tokens.weight, model.norm.weight;
 * model-00002-of-00002.safetensors: lm_head.weight), opened with k3_st_open.
 * An accepted index must describe exactly the tensors of the shards it names;
 * a rejection must be a clean error (format, or a named shard that is missing).
 */
#include "fuzz_util.h"

#include "safetensors.h"

static const char *const SHARD_HDR[2] = {
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[4,2],\"data_offsets\":[0,16]},"
    "\"model.norm.weight\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[16,20]}}",
    "{\"lm_head.weight\":{\"dtype\":\"BF16\",\"shape\":[4,2],\"data_offsets\":[0,16]}}",
};
static const size_t SHARD_DATA[2] = {20, 16};

static char g_index[512];

static void setup(void)
{
    const char *dir = fz_scratch_dir();
    for (int s = 0; s < 2; s++) {
        uint8_t buf[512] = {0};
        size_t n = strlen(SHARD_HDR[s]);
        for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
        memcpy(buf + 8, SHARD_HDR[s], n);
        char p[400];
        snprintf(p, sizeof p, "%s/model-%05d-of-00002.safetensors", dir, s + 1);
        fz_write(p, buf, 8 + n + SHARD_DATA[s]);
    }
    snprintf(g_index, sizeof g_index, "%s/%s", dir, K3_ST_INDEX_NAME);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_index[0]) setup();
    fz_write(g_index, data, size);
    k3_st_ckpt c;
    k3_diag d = {0};
    k3_err e = k3_st_open(fz_scratch_dir(), &c, &d);
    if (e) {
        fz_check_err(e, &d);
        FZ_EXPECT(e == K3_ERR_FORMAT || e == K3_ERR_NOT_FOUND || e == K3_ERR_NOMEM);
        return 0;
    }
    FZ_EXPECT(c.has_index && c.n_files >= 1 && c.n_files <= 2);
    FZ_EXPECT(c.n_tensors >= 1 && c.n_tensors <= 3);
    for (size_t i = 0; i < c.n_tensors; i++) {
        const k3_st_tensor *t = &c.tensors[i];
        FZ_EXPECT(k3_st_find(&c, t->name) == t);
        FZ_EXPECT(t->file < c.n_files && t->offset + t->nbytes <= c.files[t->file].size);
    }
    FZ_EXPECT(c.config_json == NULL);
    fz_accepted("index");
    k3_st_close(&c);
    return 0;
}

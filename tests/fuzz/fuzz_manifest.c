/*
 * fuzz_manifest.c - libFuzzer target: the input is a pack's manifest.json,
 * given to k3_manifest_parse (the strict reader k3verify, k3inspect and k3run
 * use). The manifest ends with a checksum of its own content (FORMAT.md 5.1),
 * so most mutated inputs are refused by it: the input is parsed as it is, and
 * then, when it ends the way a sealed manifest does, once more with the
 * checksum recomputed here from the format's definition (as fuzz_shard_header.c
 * fixes up header_hash), so mutations also reach the rules behind it. The
 * library is given no way around its check. An accepted manifest must
 * reference only shards it lists; its config must parse or be refused cleanly,
 * and its dump must parse back to the same tables.
 */
#include "fuzz_util.h"

#include "k3_hash.h"
#include "k3_manifest.h"

/* FORMAT.md 5.1: the text ends with "manifest_xxh3_64": "<16 hex digits>"\n}\n and the
   digits are the XXH3-64 of every byte before them. 0 if text does not end that way. */
static int reseal(char *t, size_t n)
{
    static const char key[] = "\"manifest_xxh3_64\": \"";
    size_t kl = sizeof key - 1;
    if (n < 20 + kl || memcmp(t + n - 4, "\"\n}\n", 4) || memcmp(t + n - 20 - kl, key, kl)) return 0;
    static const char hex[] = "0123456789abcdef";
    uint64_t h = k3_xxh3_64(t, n - 20);
    for (int i = 0; i < 16; i++) t[n - 20 + i] = hex[(h >> (60 - 4 * i)) & 15];
    return 1;
}

static void check_tables(const k3_manifest *m)
{
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        const k3_mf_tensor *t = &m->tensors[i];
        FZ_EXPECT(t->name && t->shard < m->n_shards && m->shards[t->shard].kind == K3_SHARD_TRUNK);
        FZ_EXPECT(t->ndim >= 0 && t->ndim <= K3_SHARD_MAX_DIMS && k3_enc_name(t->encoding));
    }
    for (uint32_t i = 0; i < m->n_expert_layers; i++) {
        const k3_mf_experts *x = &m->expert_layers[i];
        FZ_EXPECT(x->shard < m->n_shards && m->shards[x->shard].kind == K3_SHARD_EXPERTS);
        FZ_EXPECT(x->n_parts >= 1 && x->n_parts <= K3_MAX_RECORD_PARTS);
        FZ_EXPECT(x->count == 0 || x->hashes);
        for (uint32_t p = 0; p < x->n_parts; p++) FZ_EXPECT(x->parts[p].name && k3_enc_name(x->parts[p].encoding));
    }
    for (uint32_t i = 0; i < m->n_shards; i++)
        FZ_EXPECT(m->shards[i].name && k3_manifest_shard_index(m, m->shards[i].name) == (int)i);
}

static void one(const char *in, size_t size)
{
    k3_manifest m;
    k3_diag d = {0};
    k3_err e = k3_manifest_parse(in, size, "manifest.json", &m, &d);
    if (e) {
        fz_check_err(e, &d);
        FZ_EXPECT(e == K3_ERR_FORMAT || e == K3_ERR_UNSUPPORTED || e == K3_ERR_CORRUPT || e == K3_ERR_NOMEM);
        return;
    }
    check_tables(&m);
    fz_accepted("manifest");
    k3_config c;
    e = k3_manifest_config(&m, "manifest.json: config", &c, &d);
    if (e) fz_check_err(e, &d);

    /* the writer's view of the same manifest reads back identically */
    char *text = NULL;
    size_t len = 0;
    e = k3_manifest_dump(&m, &text, &len, &d);
    if (e) {
        fz_check_err(e, &d);          /* e.g. a name jansson cannot serialise */
    } else {
        k3_manifest m2;
        e = k3_manifest_parse(text, len, "dump", &m2, &d);
        if (e) {
            fprintf(stderr, "a manifest k3 accepted does not read back after k3_manifest_dump: %s\n", d.msg);
            abort();
        } else {
            FZ_EXPECT(m2.n_files == m.n_files && m2.n_shards == m.n_shards && m2.n_tensors == m.n_tensors);
            FZ_EXPECT(m2.n_expert_layers == m.n_expert_layers && m2.n_skipped == m.n_skipped);
            for (uint32_t i = 0; i < m.n_tensors; i++) {
                FZ_EXPECT(!strcmp(m2.tensors[i].name, m.tensors[i].name));
                FZ_EXPECT(m2.tensors[i].offset == m.tensors[i].offset && m2.tensors[i].hash == m.tensors[i].hash);
            }
            for (uint32_t i = 0; i < m.n_expert_layers; i++) {
                FZ_EXPECT(m2.expert_layers[i].count == m.expert_layers[i].count);
                FZ_EXPECT(m2.expert_layers[i].stride == m.expert_layers[i].stride);
                FZ_EXPECT(m2.expert_layers[i].n_parts == m.expert_layers[i].n_parts);
            }
            k3_manifest_free(&m2);
        }
        free(text);
    }
    k3_manifest_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *t = malloc(size ? size : 1);
    FZ_EXPECT(t);
    memcpy(t, data, size);
    one(t, size);
    if (reseal(t, size) && memcmp(t, data, size)) one(t, size);
    free(t);
    return 0;
}

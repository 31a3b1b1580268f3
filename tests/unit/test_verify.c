/*
 * test_verify.c - k3verify on a synthetic pack (test_verify_mkpack.h): OK on
 * the clean pack, then one damage at a time, each must give exit 1 and name
 * the shard and the tensor or expert; --quick, --subset, --json, -q,
 * --threads, usage errors and exit codes. Runs the real binary
 * (<build>/bin/k3verify, or $K3_VERIFY_BIN).
 *
 * Also a pack generator for benchmarks and manual tests:
 *     test_verify --make-pack DIR [LAYERS EXPERTS HIDDEN INTER]
 */
#define _GNU_SOURCE                /* memmem */
#include "test_verify_run.h"

/* ------------------------------------------------------------------ tests */

static void test_clean(void)
{
    k3_manifest m;
    const char *dir = fresh("clean", &m);
    CHECK_EXIT(run_dir("", dir), 0);
    CHECK_OUT("manifest.json: OK\n");
    CHECK_OUT("trunk-embed.k3s: OK\n");
    CHECK_OUT("trunk-layer-003.k3s: OK\n");
    CHECK_OUT("experts-layer-001.k3s: OK\n");
    CHECK_OUT("tiktoken.model: OK\n");
    CHECK_OUT("tokenizer_config.json: OK\n");
    CHECK_EQ_U64(count_lines(g_out, ": OK\n"), 1 + m.n_shards + m.n_files);
    CHECK_ERR("9 shards and 2 files OK");
    /* -q: nothing on stdout for a clean pack */
    CHECK_EXIT(run_dir("-q", dir), 0);
    CHECK_STR(g_out, "");
    /* manifest order; same output with threads */
    char *one = NULL;
    CHECK_EXIT(run_dir("--threads 1", dir), 0);
    one = k3tp_strdup(g_out);
    CHECK_EXIT(run_dir("--threads 3", dir), 0);
    CHECK_STR(g_out, one);
    free(one);
    CHECK(strstr(g_out, "trunk-embed.k3s") < strstr(g_out, "trunk-layer-000.k3s"));
    CHECK(strstr(g_out, "trunk-head.k3s") < strstr(g_out, "experts-layer-001.k3s"));
    k3_manifest_free(&m);
}

static void test_expert_bit(void)
{
    k3_manifest m;
    const char *dir = fresh("expert-bit", &m);
    const k3_mf_experts *x = &m.expert_layers[0];            /* layer 1 */
    REQUIRE(x->layer == 1);
    uint64_t off = x->offset + 5 * x->stride + x->parts[4].offset + 17;   /* expert 5, inside w2 */
    flip(dir, "experts-layer-001.k3s", off, 3);
    CHECK_EXIT(run_dir("", dir), 1);
    char want[256];
    snprintf(want, sizeof want, "experts-layer-001.k3s: FAILED (expert 5 of layer 1, bytes [%llu, %llu): hash mismatch)\n",
             (unsigned long long)(x->offset + 5 * x->stride), (unsigned long long)(x->offset + 5 * x->stride + x->record_size));
    CHECK_OUT(want);
    CHECK_OUT("experts-layer-002.k3s: OK\n");
    CHECK_ERR("1 of 9 shards FAILED");
    /* JSON: every line parses, the problem is structured */
    CHECK_EXIT(run_dir("--json", dir), 1);
    CHECK_OUT("\"kind\":\"hash\"");
    CHECK_OUT("\"expert\":5,\"layer\":1");
    CHECK_OUT("\"type\":\"summary\"");
    if (access("/usr/bin/python3", X_OK) == 0) {
        char cmd[8400];
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 -c 'import json,sys; [json.loads(l) for l in sys.stdin]' <'%s/out.txt'",
                 g_root);
        CHECK_MSG(system(cmd) == 0, "--json output does not parse:\n%s", g_out);
    }
    /* --quick does not read data: misses the flip */
    CHECK_EXIT(run_dir("--quick", dir), 0);
    k3_manifest_free(&m);
}

static void test_trunk_bit(void)
{
    k3_manifest m;
    const char *dir = fresh("trunk-bit", &m);
    const k3_mf_tensor *t = tensor(&m, "model.layers.2.self_attn.q_proj.weight");
    flip(dir, "trunk-layer-002.k3s", t->offset + t->size - 1, 7);
    CHECK_EXIT(run_dir("-q", dir), 1);
    char want[256];
    snprintf(want, sizeof want, "trunk-layer-002.k3s: FAILED (tensor 'model.layers.2.self_attn.q_proj.weight' "
             "bytes [%llu, %llu): hash mismatch)\n", (unsigned long long)t->offset,
             (unsigned long long)(t->offset + t->size));
    CHECK_OUT(want);
    CHECK_EQ_U64(count_lines(g_out, "\n"), 1);             /* -q: only the failure */
    k3_manifest_free(&m);
}

static void test_header_bit(void)
{
    k3_manifest m;
    const char *dir = fresh("header-bit", &m);
    flip(dir, "trunk-layer-001.k3s", 128 + 64 + 10, 0);      /* second entry's name_offset */
    CHECK_EXIT(run_dir("", dir), 1);
    CHECK_OUT("trunk-layer-001.k3s: FAILED (header: header hash mismatch (header damaged); file hash mismatch; "
              "every tensor matches, so the damage is in the header)\n");
    CHECK_EXIT(run_dir("--quick", dir), 1);                   /* headers are checked by --quick */
    CHECK_OUT("trunk-layer-001.k3s: FAILED (header: header hash mismatch");
    k3_manifest_free(&m);
}

static void test_padding(void)
{
    k3_manifest m;
    const char *dir = fresh("padding", &m);
    const k3_mf_experts *x = &m.expert_layers[1];            /* layer 2 */
    REQUIRE(x->stride > x->record_size);
    uint64_t off = x->offset + 2 * x->stride + x->record_size + 5;
    flip(dir, "experts-layer-002.k3s", off, 1);
    const k3_mf_tensor *t = tensor(&m, "model.layers.0.post_attention_layernorm.weight");   /* BF16 [64]: 128 B of 4096 */
    uint64_t toff = t->offset + t->size + 100;
    flip(dir, "trunk-layer-000.k3s", toff, 0);
    CHECK_EXIT(run_dir("", dir), 1);
    char want[256];
    snprintf(want, sizeof want, "experts-layer-002.k3s: FAILED (padding byte at offset %llu is not zero (after the "
             "record of expert 2 of layer 2))\n", (unsigned long long)off);
    CHECK_OUT(want);
    snprintf(want, sizeof want, "trunk-layer-000.k3s: FAILED (padding byte at offset %llu is not zero (after tensor "
             "'model.layers.0.post_attention_layernorm.weight'))\n", (unsigned long long)toff);
    CHECK_OUT(want);
    CHECK_EXIT(run_dir("--json", dir), 1);
    CHECK_OUT("\"kind\":\"padding\"");
    k3_manifest_free(&m);
}

static void test_files(void)
{
    k3_manifest m;
    const char *dir = fresh("files", &m);
    char p[8200];
    snprintf(p, sizeof p, "%s/experts-layer-002.k3s", dir);
    REQUIRE(truncate(p, (off_t)(m.shards[m.n_shards - 2].size - 100)) == 0);
    snprintf(p, sizeof p, "%s/trunk-head.k3s", dir);
    REQUIRE(unlink(p) == 0);
    put_file(dir, "notes.txt", "hello\n");
    put_file(dir, "bad\nname", "x");
    put_file(dir, ".trunk-head.k3s.k3tmp-4242", "x");
    flip(dir, "tiktoken.model", 100, 2);                     /* same size, other bytes */
    CHECK_EXIT(run_dir("", dir), 1);
    char want[256];
    uint64_t sz = m.shards[m.n_shards - 2].size;
    snprintf(want, sizeof want, "experts-layer-002.k3s: FAILED (size %llu, expected %llu: truncated)\n",
             (unsigned long long)(sz - 100), (unsigned long long)sz);
    CHECK_OUT(want);
    CHECK_OUT("trunk-head.k3s: FAILED (missing)\n");
    CHECK_OUT("notes.txt: FAILED (not listed in the manifest)\n");
    CHECK_OUT("bad\\x0aname: FAILED (not listed in the manifest)\n");
    CHECK_OUT(".trunk-head.k3s.k3tmp-4242: FAILED (unfinished k3pack run");
    CHECK_OUT("tiktoken.model: FAILED (hash mismatch");
    CHECK_OUT("tokenizer_config.json: OK\n");
    CHECK_ERR("2 of 9 shards FAILED, 1 of 2 files FAILED, 2 unlisted files, 1 leftover of an unfinished k3pack run");
    /* --quick: truncation and missing files are still found, the tokenizer change is not */
    CHECK_EXIT(run_dir("--quick", dir), 1);
    CHECK_OUT(want);
    CHECK_OUT("trunk-head.k3s: FAILED (missing)\n");
    CHECK_OUT("tiktoken.model: OK\n");
    k3_manifest_free(&m);
}

static void test_manifest(void)
{
    k3_manifest m;
    const char *dir = fresh("manifest", &m);
    char p[8200], *text;
    size_t len;
    k3_diag d;
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    flip(dir, "manifest.json", 0, 0);                        /* '{' -> 'z' */
    CHECK_EXIT(run_dir("", dir), 1);
    CHECK_OUT("manifest.json: FAILED (checksum mismatch: its manifest_xxh3_64 is ");
    CHECK_ERR("manifest.json FAILED");
    /* the same text sealed again: the checksum holds, the JSON does not */
    REQUIRE(k3_read_file(p, 1u << 26, &text, &len, &d) == K3_OK);
    REQUIRE(k3_manifest_seal(text, len) == 0);
    REQUIRE(k3tp_write_file(dir, "manifest.json", text, len, &d) == K3_OK);
    free(text);
    CHECK_EXIT(run_dir("", dir), 1);
    CHECK_OUT("manifest.json: FAILED (invalid JSON");
    k3_manifest_free(&m);

    /* one hex digit of a tensor hash: damage to the manifest itself, its checksum names it;
       the same wrong hash written by a k3pack (sealed): still valid, the tensor is named */
    dir = fresh("manifest-digit", &m);
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    REQUIRE(k3_read_file(p, 1u << 26, &text, &len, &d) == K3_OK);
    const k3_mf_tensor *t = tensor(&m, "model.layers.3.self_attn.o_proj.weight");
    char hex[17];
    k3_hex64(t->hash, hex);
    char *at = strstr(text, hex);
    REQUIRE(at);
    int k = 0;
    while (at[k] < '0' || at[k] > '9') k++;                  /* a decimal digit: bit 0 keeps it hex */
    flip(dir, "manifest.json", (uint64_t)(at - text) + (uint64_t)k, 0);
    free(text);
    CHECK_EXIT(run_dir("--quick", dir), 1);
    CHECK_OUT("manifest.json: FAILED (checksum mismatch");
    CHECK_NOT_OUT("trunk-layer-003.k3s");
    REQUIRE(k3_read_file(p, 1u << 26, &text, &len, &d) == K3_OK);
    REQUIRE(k3_manifest_seal(text, len) == 0);
    REQUIRE(k3tp_write_file(dir, "manifest.json", text, len, &d) == K3_OK);
    free(text);
    CHECK_EXIT(run_dir("", dir), 1);
    CHECK_OUT("trunk-layer-003.k3s: FAILED (tensor 'model.layers.3.self_attn.o_proj.weight' bytes [");
    CHECK_OUT("the file hash matches, so the manifest's tensor hashes are wrong, not the data)");

    /* missing manifest: an unfinished pack; k3pack's lock is named */
    REQUIRE(unlink(p) == 0);
    put_file(dir, ".k3pack.lock", "");
    CHECK_EXIT(run_dir("", dir), 1);
    CHECK_OUT("manifest.json: FAILED (missing: an unfinished pack");
    CHECK_OUT(".k3pack.lock: FAILED (unfinished k3pack run");
    CHECK_NOT_OUT("trunk-embed.k3s");
    k3_manifest_free(&m);
}

/* Rewrite manifest.json with text_config.KEY = v (NULL: removed); hashes stay valid. */
static void set_config(const char *dir, k3_manifest *m, const char *key, json_t *v)
{
    json_t *tc = json_object_get(m->config, "text_config");
    REQUIRE(tc);
    if (v) json_object_set_new(tc, key, v);
    else json_object_del(tc, key);
    k3_diag d;
    REQUIRE(k3tp_write_manifest(dir, m, &d) == K3_OK);
}

/* the pack must be complete for the model its config describes */
static void test_complete(void)
{
    k3_manifest m;
    const char *dir = fresh("cfg-bad", &m);
    set_config(dir, &m, "hidden_size", NULL);
    CHECK_EXIT(run_dir("", dir), 1);
    CHECK_OUT("manifest.json: FAILED (config: missing field 'text_config.hidden_size')\n");
    CHECK_OUT("trunk-layer-001.k3s: OK\n");                 /* the bytes are fine */
    CHECK_EXIT(run_dir("--quick", dir), 1);                  /* cheap: always checked */
    CHECK_OUT("manifest.json: FAILED (config: missing field 'text_config.hidden_size')\n");
    set_config(dir, &m, "hidden_size", json_string("64"));
    CHECK_EXIT(run_dir("", dir), 1);
    CHECK_OUT("manifest.json: FAILED (config: field 'text_config.hidden_size' is a string");
    k3_manifest_free(&m);

    /* one layer more than the pack has: its tensors and experts are missing */
    dir = fresh("cfg-layers", &m);
    set_config(dir, &m, "num_hidden_layers", json_integer(5));
    CHECK_EXIT(run_dir("-v", dir), 1);
    CHECK_OUT("manifest.json: FAILED (tensor 'model.layers.4.input_layernorm.weight' the config needs is not in "
              "the pack; ");
    CHECK_OUT("the experts of layer 4 the config needs are not in the pack)\n");
    CHECK_NOT_OUT("model.layers.3.");
    CHECK_OUT("trunk-layer-003.k3s: OK\n");
    CHECK_EXIT(run_dir("--json", dir), 1);
    CHECK_OUT("\"tensor\":\"model.layers.4.self_attn.q_proj.weight\"");
    k3_manifest_free(&m);

    /* fewer layers: the pack's layer 3 is not in the model */
    dir = fresh("cfg-fewer", &m);
    set_config(dir, &m, "num_hidden_layers", json_integer(3));
    CHECK_EXIT(run_dir("-v", dir), 1);
    CHECK_OUT("tensor 'model.layers.3.self_attn.o_proj.weight' is in the pack, but the config's model has no such "
              "tensor");
    CHECK_OUT("expert layer 3 is in the pack, but the config's layer 3 is not an MoE layer");
    k3_manifest_free(&m);

    /* expert count and width */
    dir = fresh("cfg-experts", &m);
    set_config(dir, &m, "num_experts", json_integer(16));
    set_config(dir, &m, "moe_intermediate_size", json_integer(64));
    CHECK_EXIT(run_dir("-v", dir), 1);
    CHECK_OUT("layer 1 has 8 experts in the pack, the config needs 16");
    CHECK_OUT("layer 3: expert part 'w2.weight_scale' is E8M0 [64, 1] in the pack, the config needs E8M0 [64, 2]");
    CHECK_OUT("tensor 'model.layers.2.block_sparse_moe.gate.weight' has shape [8, 64] in the pack, the config "
              "needs [16, 64]");
    k3_manifest_free(&m);

    /* experts not quantized by k3pack: the config's BF16 experts are not MXFP4 parts */
    dir = fresh("cfg-source", &m);
    m.experts_quantized = 0;
    free(m.quant_rule);
    m.quant_rule = NULL;
    set_config(dir, &m, "num_experts", json_integer(8));
    CHECK_EXIT(run_dir("-v", dir), 1);
    CHECK_OUT("layer 1: expert part 'w1.weight' the config needs is not in the pack's records");
    CHECK_OUT("layer 1: expert part 'w1.weight_packed' is in the pack, but the config's experts have no such part");
    k3_manifest_free(&m);
}

static void test_disagreement(void)
{
    k3_manifest m;
    const char *dir = fresh("disagree", &m);
    k3_diag d;
    /* the manifest's header hash, whole-file hash and a record geometry disagree with the files */
    m.shards[1].header_hash ^= 1;
    m.shards[2].hash.lo ^= 1;
    m.expert_layers[2].stride *= 2;                  /* half the records at twice the stride: still inside */
    m.expert_layers[2].count /= 2;
    REQUIRE(k3tp_write_manifest(dir, &m, &d) == K3_OK);
    CHECK_EXIT(run_dir("", dir), 1);
    CHECK_OUT("trunk-layer-000.k3s: FAILED (header hash ");
    CHECK_OUT("trunk-layer-001.k3s: FAILED (file hash mismatch, although the header, every tensor and the padding "
              "match: the manifest's xxh3_128 of this shard may be wrong)\n");
    CHECK_OUT("experts-layer-003.k3s: FAILED (expert_layers count is 4, the header says 8; expert_layers stride is "
              "8192, the header says 4096; expert 1 of layer 3, bytes [12288, 15552): hash mismatch; ");
    CHECK_EXIT(run_dir("--quick", dir), 1);
    CHECK_OUT("experts-layer-003.k3s: FAILED (expert_layers count is 4, the header says 8; expert_layers stride is "
              "8192, the header says 4096)\n");
    CHECK_OUT("trunk-layer-001.k3s: OK\n");                   /* --quick does not hash */
    k3_manifest_free(&m);
}

static void test_subset(void)
{
    k3_manifest m;
    const char *dir = fresh("subset", &m);
    char *a, *b;
    CHECK_EXIT(run_dir("--subset 1/2", dir), 0);
    a = k3tp_strdup(g_out);
    CHECK_ERR("subset 1/2: 5 of 9 shards checked");
    CHECK_EXIT(run_dir("--subset 2/2", dir), 0);
    b = k3tp_strdup(g_out);
    for (uint32_t i = 0; i < m.n_shards; i++) {
        char line[128];
        snprintf(line, sizeof line, "%s: OK\n", m.shards[i].name);
        int in_a = strstr(a, line) != NULL, in_b = strstr(b, line) != NULL;
        CHECK_MSG(in_a + in_b == 1, "shard %s: in 1/2 %d, in 2/2 %d", m.shards[i].name, in_a, in_b);
        CHECK_MSG(in_a == (i % 2 == 0), "shard %u in the wrong subset", i);
    }
    CHECK(strstr(a, "tiktoken.model: OK") && strstr(b, "tiktoken.model: OK"));   /* files always */
    free(a);
    free(b);
    /* the listing is checked in every subset: a shard of another subset that is missing or
       has the wrong size fails here too (without being read); an intact one prints nothing */
    char p[8200];
    snprintf(p, sizeof p, "%s/%s", dir, m.shards[1].name);          /* subset 2/2 */
    REQUIRE(unlink(p) == 0);
    snprintf(p, sizeof p, "%s/%s", dir, m.shards[3].name);          /* subset 2/2 */
    REQUIRE(truncate(p, (off_t)m.shards[3].size - 1) == 0);
    CHECK_EXIT(run_dir("--subset 1/2", dir), 1);
    char want[256];
    snprintf(want, sizeof want, "%s: FAILED (missing)\n", m.shards[1].name);
    CHECK_OUT(want);
    snprintf(want, sizeof want, "%s: FAILED (size %llu, expected %llu: truncated)\n", m.shards[3].name,
             (unsigned long long)m.shards[3].size - 1, (unsigned long long)m.shards[3].size);
    CHECK_OUT(want);
    CHECK_NOT_OUT(m.shards[5].name);                                   /* 2/2, intact: not shown */
    CHECK_OUT("trunk-embed.k3s: OK\n");
    CHECK(strstr(g_out, "trunk-embed.k3s") < strstr(g_out, m.shards[1].name));   /* manifest order */
    CHECK(strstr(g_out, m.shards[1].name) < strstr(g_out, m.shards[2].name));
    CHECK_ERR("subset 1/2: 5 of 9 shards checked");
    k3_manifest_free(&m);
}

static void test_usage(void)
{
    CHECK_EXIT(run(""), 2);
    CHECK_ERR("missing PACK directory");
    CHECK_EXIT(run("--subset 3/2 x"), 2);
    CHECK_EXIT(run("--subset 0/2 x"), 2);
    CHECK_EXIT(run("--subset 1/ x"), 2);
    CHECK_EXIT(run("--threads 0 x"), 2);
    CHECK_EXIT(run("--frobnicate x"), 2);
    CHECK_EXIT(run("a b"), 2);
    CHECK_EXIT(run("--checkpoint a b"), 2);
    CHECK_EXIT(run("--help"), 0);
    CHECK_OUT("Usage: k3verify");
    CHECK_OUT("--subset N/T");
    CHECK_OUT("Exit status");
    CHECK_EXIT(run("--version"), 0);
    CHECK_OUT("k3verify ");
    char args[8300];
    snprintf(args, sizeof args, "'%s/does-not-exist'", g_root);
    CHECK_EXIT(run(args), 3);
    CHECK_ERR("cannot open pack directory");
}

/* ------------------------------------------------------------------ --checkpoint */

/* Replace the first `from` after `anchor` in dir/file by `to` (same length). */
static void patch(const char *dir, const char *file, const char *anchor, const char *from, const char *to)
{
    char p[8200], *text;
    size_t len;
    k3_diag d;
    REQUIRE(strlen(from) == strlen(to));
    snprintf(p, sizeof p, "%s/%s", dir, file);
    REQUIRE(k3_read_file(p, 1u << 26, &text, &len, &d) == K3_OK);
    char *a = memmem(text, len, anchor, strlen(anchor));    /* binary file: the length prefix has NULs */
    REQUIRE(a);
    char *f = memmem(a, len - (size_t)(a - text), from, strlen(from));
    REQUIRE(f);
    memcpy(f, to, strlen(to));
    REQUIRE(k3tp_write_file(dir, file, text, len, &d) == K3_OK);
    free(text);
}

/* The checkpoint file holding a tensor, from the index (file names are fixed-width). */
static void shard_of(const char *dir, const char *tensor_name, char *out, size_t cap)
{
    char p[8200], *text, key[512];
    k3_diag d;
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    REQUIRE(k3_read_file(p, 1u << 26, &text, NULL, &d) == K3_OK);
    snprintf(key, sizeof key, "\"%s\": \"", tensor_name);
    char *a = strstr(text, key);
    REQUIRE(a);
    a += strlen(key);
    char *e = strchr(a, '"');
    REQUIRE(e && (size_t)(e - a) < cap);
    memcpy(out, a, (size_t)(e - a));
    out[e - a] = '\0';
    free(text);
}

static void test_checkpoint(void)
{
    if (system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) {
        printf("test_checkpoint: skipped (no /usr/bin/python3 with numpy; run scripts/setup.sh)\n");
        return;
    }
    char script[4200], base[4200], dir[4200], cmd[16384];
    const char *data = getenv("K3_TEST_DATA");
    if (data && *data) snprintf(script, sizeof script, "%s/../reference/make_checkpoint.py", data);
    else snprintf(script, sizeof script, "%s/../reference/make_checkpoint.py", dirname(k3tp_strdup(__FILE__)));
    snprintf(base, sizeof base, "%s/ckpt-tiny", g_root);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && /usr/bin/python3 '%s' --preset tiny --seed 1 --out '%s' -q", base, script, base);
    REQUIRE(system(cmd) == 0);
    char args[8400];
    snprintf(args, sizeof args, "--checkpoint '%s'", base);
    CHECK_EXIT(run(args), 0);
    CHECK_OUT("model-00001-of-00004.safetensors: OK\n");
    CHECK_OUT("config.json: OK\n");
    CHECK_ERR("matches its config");
    CHECK_ERR("8 vision tensors skipped");
    snprintf(args, sizeof args, "--checkpoint '%s' -v", base);
    CHECK_EXIT(run(args), 0);
    CHECK_OUT("vision_tower.patch_embed.proj.weight: SKIPPED (vision tensor, not packed)\n");

    /* a wrong dtype, and a renamed tensor (missing + unexpected) */
    snprintf(dir, sizeof dir, "%s/ckpt-bad", g_root);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dir, base, dir);
    REQUIRE(system(cmd) == 0);
    const char *t1 = "language_model.model.layers.0.input_layernorm.weight";
    const char *t2 = "language_model.model.layers.1.post_attention_layernorm.weight";
    char f1[256], f2[256], anchor[512];
    shard_of(dir, t1, f1, sizeof f1);
    shard_of(dir, t2, f2, sizeof f2);
    snprintf(anchor, sizeof anchor, "\"%s\":{", t1);
    patch(dir, f1, anchor, "\"BF16\"", "\"F16\" ");
    snprintf(anchor, sizeof anchor, "\"%s\"", t2);
    patch(dir, f2, anchor, "weight\"", "weighz\"");
    patch(dir, "model.safetensors.index.json", anchor, "weight\"", "weighz\"");
    snprintf(args, sizeof args, "--checkpoint '%s'", dir);
    CHECK_EXIT(run(args), 1);
    char want[1024];
    snprintf(want, sizeof want, "%s: FAILED (F16 [128] in '%s', the config needs BF16 [128])\n", t1, f1);
    CHECK_OUT(want);
    snprintf(want, sizeof want, "%s: FAILED (missing)\n", t2);
    CHECK_OUT(want);
    snprintf(want, sizeof want, "language_model.model.layers.1.post_attention_layernorm.weighz: FAILED (unexpected: "
             "in '%s', not a tensor of the model config.json describes)\n", f2);
    CHECK_OUT(want);
    CHECK_ERR("FAILED: 1 missing, 1 wrong dtype or shape, 1 unexpected");
    snprintf(args, sizeof args, "--checkpoint '%s' --json", dir);
    CHECK_EXIT(run(args), 1);
    CHECK_OUT("\"kind\":\"missing\"");
    CHECK_OUT("\"kind\":\"unexpected\"");
    CHECK_OUT("\"type\":\"summary\"");
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 -c 'import json,sys; [json.loads(l) for l in sys.stdin]' <'%s/out.txt'",
             g_root);
    CHECK_MSG(system(cmd) == 0, "--checkpoint --json output does not parse:\n%s", g_out);

    /* no config.json; then a truncated shard (the strict reader refuses it) */
    snprintf(cmd, sizeof cmd, "rm '%s/config.json'", dir);
    REQUIRE(system(cmd) == 0);
    snprintf(args, sizeof args, "--checkpoint '%s'", dir);
    CHECK_EXIT(run(args), 1);
    CHECK_OUT("config.json: FAILED (missing");
    snprintf(cmd, sizeof cmd, "truncate -s -1 '%s/%s'", dir, f2);
    REQUIRE(system(cmd) == 0);
    CHECK_EXIT(run(args), 1);
    CHECK_OUT(": FAILED (");
    snprintf(args, sizeof args, "--checkpoint '%s/nope'", g_root);
    CHECK_EXIT(run(args), 3);
}

/* ------------------------------------------------------------------ main */

static int make_pack(int argc, char **argv)
{
    k3tp_opts o = k3tp_small();
    if (argc >= 7) {
        o.layers = (uint32_t)atoi(argv[3]);
        o.experts = (uint32_t)atoi(argv[4]);
        o.hidden = (uint64_t)atoll(argv[5]);
        o.inter = (uint64_t)atoll(argv[6]);
        o.vocab = 4 * o.hidden;
    }
    k3_diag d;
    if (k3tp_write(argv[2], &o, NULL, &d)) {
        fprintf(stderr, "test_verify: %s\n", d.msg);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "--make-pack")) return make_pack(argc, argv);
    find_binary();
    snprintf(g_root, sizeof g_root, "%s/verify", k3_test_tmpdir());
    mkdir(g_root, 0755);
    test_clean();
    test_expert_bit();
    test_trunk_bit();
    test_header_bit();
    test_padding();
    test_files();
    test_manifest();
    test_complete();
    test_disagreement();
    test_subset();
    test_usage();
    test_checkpoint();
    free(g_out);
    free(g_err);
    return k3_test_done();
}

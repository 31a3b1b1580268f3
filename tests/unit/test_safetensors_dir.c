/*
 * test_safetensors_dir.c - checkpoints as directories: model.safetensors.index.json
 * with its shards (every rule of the index), directories without an index, and
 * config.json pick-up.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_checked.h"
#include "k3_test.h"
#include "safetensors.h"

static char g_root[2048];
static char g_dir[2600];
static int g_case;

/* A fresh directory per case. */
static const char *new_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "%s/case%03d", g_root, ++g_case);
    char cmd[5300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", g_dir, g_dir);
    REQUIRE(system(cmd) == 0);
    return g_dir;
}

static void put(const char *name, const void *b, size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    REQUIRE(fwrite(b, 1, len, f) == len);
    REQUIRE(fclose(f) == 0);
}

static void put_text(const char *name, const char *text) { put(name, text, strlen(text)); }

/* A shard holding U8 tensors of the given sizes, named from a comma-free list. */
static uint64_t put_shard(const char *file, int n, const char *const *names, const unsigned *sizes)
{
    char hdr[4096];
    size_t o = 0;
    unsigned off = 0;
    o += (size_t)snprintf(hdr + o, sizeof hdr - o, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        o += (size_t)snprintf(hdr + o, sizeof hdr - o,
                              ",\"%s\":{\"dtype\":\"U8\",\"shape\":[%u],\"data_offsets\":[%u,%u]}",
                              names[i], sizes[i], off, off + sizes[i]);
        off += sizes[i];
    }
    o += (size_t)snprintf(hdr + o, sizeof hdr - o, "}");
    size_t len = 8 + o + off;
    uint8_t *b = calloc(1, len);
    REQUIRE(b);
    k3_st64(b, o);
    memcpy(b + 8, hdr, o);
    put(file, b, len);
    free(b);
    return len;
}

static const char *const A_NAMES[2] = {"a.weight", "b.weight"};
static const unsigned A_SIZES[2] = {3, 5};
static const char *const B_NAMES[1] = {"c.weight"};
static const unsigned B_SIZES[1] = {7};

/* Two shards: model-00001-of-00002 (a, b) and model-00002-of-00002 (c). */
static void put_two_shards(void)
{
    put_shard("model-00001-of-00002.safetensors", 2, A_NAMES, A_SIZES);
    put_shard("model-00002-of-00002.safetensors", 1, B_NAMES, B_SIZES);
}

#define INDEX(meta, map) "{\"metadata\":" meta ",\"weight_map\":{" map "}}"
#define GOOD_MAP "\"c.weight\":\"model-00002-of-00002.safetensors\"," \
                 "\"a.weight\":\"model-00001-of-00002.safetensors\"," \
                 "\"b.weight\":\"model-00001-of-00002.safetensors\""

static void expect_fail(int line, k3_err code, const char *want)
{
    k3_st_ckpt c;
    k3_diag d = {0};
    k3_err e = k3_st_open(g_dir, &c, &d);
    CHECK_MSG(e == code, "line %d: k3_st_open returned %d (%s), expected %d", line, e, d.msg, code);
    CHECK_MSG(e && strstr(d.msg, want), "line %d: message '%s' lacks '%s'", line, d.msg, want);
    if (!e) k3_st_close(&c);
}
#define FAIL(code, want) expect_fail(__LINE__, code, want)

static void open_ok(int line, k3_st_ckpt *c)
{
    k3_diag d = {0};
    k3_err e = k3_st_open(g_dir, c, &d);
    if (e) fprintf(stderr, "line %d: %s\n", line, d.msg);
    REQUIRE(e == K3_OK);
}
#define OPEN_OK(c) open_ok(__LINE__, c)

static void test_index_good(void)
{
    new_dir();
    put_two_shards();
    put_text(K3_ST_INDEX_NAME, INDEX("{\"total_size\":15}", GOOD_MAP));
    put_text("config.json", "{\"model_type\":\"x\"}");
    put_text("other.safetensors", "junk that is not listed in the index");
    k3_st_ckpt c;
    OPEN_OK(&c);
    CHECK(c.has_index);
    CHECK_EQ_U64(c.n_files, 2);
    CHECK_EQ_U64(c.n_tensors, 3);
    CHECK_EQ_U64(c.total_bytes, 15);
    CHECK_EQ_U64(c.n_warnings, 0);
    CHECK_STR(c.files[0].name, "model-00001-of-00002.safetensors");
    CHECK_STR(c.files[1].name, "model-00002-of-00002.safetensors");
    const k3_st_tensor *t = k3_st_find(&c, "c.weight");
    REQUIRE(t);
    CHECK_EQ_U64(t->file, 1);
    CHECK_EQ_U64(t->offset, 8 + c.files[1].header_len);
    t = k3_st_find(&c, "b.weight");
    REQUIRE(t);
    CHECK_EQ_U64(t->file, 0);
    CHECK_EQ_U64(t->offset, 8 + c.files[0].header_len + 3);
    CHECK(k3_st_find(&c, "d.weight") == NULL);
    REQUIRE(c.config_json);
    CHECK_STR(c.config_json, "{\"model_type\":\"x\"}");
    k3_st_close(&c);

    /* total_size as the sum of file sizes (a third-party habit) is accepted quietly */
    new_dir();
    put_two_shards();
    char idx[1024];
    uint64_t fsum = 0;
    {
        k3_st_ckpt c0;
        put_text(K3_ST_INDEX_NAME, INDEX("{}", GOOD_MAP));
        OPEN_OK(&c0);
        CHECK(c0.config_json == NULL);
        CHECK_EQ_U64(c0.n_warnings, 0);
        for (size_t i = 0; i < c0.n_files; i++) fsum += c0.files[i].size;
        k3_st_close(&c0);
    }
    snprintf(idx, sizeof idx, "{\"metadata\":{\"total_size\":%llu},\"weight_map\":{" GOOD_MAP "}}",
             (unsigned long long)fsum);
    put_text(K3_ST_INDEX_NAME, idx);
    OPEN_OK(&c);
    CHECK_EQ_U64(c.n_warnings, 0);
    k3_st_close(&c);

    /* total_size that matches nothing: a warning, not an error */
    put_text(K3_ST_INDEX_NAME, INDEX("{\"total_size\":16}", GOOD_MAP));
    OPEN_OK(&c);
    CHECK_EQ_U64(c.n_warnings, 1);
    CHECK(c.n_warnings && strstr(c.warnings[0], "total_size 16 matches neither the tensor bytes 15"));
    k3_st_close(&c);
    put_text(K3_ST_INDEX_NAME, INDEX("{\"total_size\":\"15\"}", GOOD_MAP));
    OPEN_OK(&c);
    CHECK_EQ_U64(c.n_warnings, 1);
    k3_st_close(&c);
}

static void test_index_bad(void)
{
    new_dir();
    put_two_shards();
    /* index lists a tensor its shard does not have */
    put_text(K3_ST_INDEX_NAME, INDEX("{}", GOOD_MAP ",\"d.weight\":\"model-00002-of-00002.safetensors\""));
    FAIL(K3_ERR_FORMAT, "lists tensor 'd.weight' in 'model-00002-of-00002.safetensors', but that shard has no such tensor");
    /* index puts a tensor in the wrong shard */
    put_text(K3_ST_INDEX_NAME, INDEX("{}", "\"c.weight\":\"model-00001-of-00002.safetensors\","
                                           "\"a.weight\":\"model-00001-of-00002.safetensors\","
                                           "\"b.weight\":\"model-00002-of-00002.safetensors\""));
    FAIL(K3_ERR_FORMAT, "but it is in");
    /* a shard tensor the index does not list */
    put_text(K3_ST_INDEX_NAME, INDEX("{}", "\"c.weight\":\"model-00002-of-00002.safetensors\","
                                           "\"a.weight\":\"model-00001-of-00002.safetensors\""));
    FAIL(K3_ERR_FORMAT, "tensor 'b.weight' in 'model-00001-of-00002.safetensors' is not listed in 'model.safetensors.index.json'");
    /* a shard file that does not exist */
    put_text(K3_ST_INDEX_NAME, INDEX("{}", GOOD_MAP ",\"e.weight\":\"model-00003-of-00003.safetensors\""));
    FAIL(K3_ERR_NOT_FOUND, "names shard 'model-00003-of-00003.safetensors' (for tensor 'e.weight'), but");
    /* shard names must be plain file names */
    put_text(K3_ST_INDEX_NAME, INDEX("{}", "\"a.weight\":\"../model-00001-of-00002.safetensors\""));
    FAIL(K3_ERR_FORMAT, "puts tensor 'a.weight' in '../model-00001-of-00002.safetensors', which is not a plain file name");
    put_text(K3_ST_INDEX_NAME, INDEX("{}", "\"a.weight\":\"sub/x.safetensors\""));
    FAIL(K3_ERR_FORMAT, "which is not a plain file name");
    put_text(K3_ST_INDEX_NAME, INDEX("{}", "\"a.weight\":\"/etc/passwd\""));
    FAIL(K3_ERR_FORMAT, "which is not a plain file name");
    put_text(K3_ST_INDEX_NAME, INDEX("{}", "\"a.weight\":\"..\""));
    FAIL(K3_ERR_FORMAT, "which is not a plain file name");
    put_text(K3_ST_INDEX_NAME, INDEX("{}", "\"a.weight\":\"\""));
    FAIL(K3_ERR_FORMAT, "which is not a plain file name");
    /* longer than a file name can be (NAME_MAX): bad data, not a usage or i/o error */
    static const size_t long_len[2] = {300, 5000};
    for (int k = 0; k < 2; k++) {
        char *nm = malloc(long_len[k] + 1), *idx = malloc(long_len[k] + 200);
        REQUIRE(nm && idx);
        memset(nm, 'x', long_len[k]);
        nm[long_len[k]] = '\0';
        snprintf(idx, long_len[k] + 200, "{\"weight_map\":{\"a.weight\":\"%s\"}}", nm);
        put_text(K3_ST_INDEX_NAME, idx);
        FAIL(K3_ERR_FORMAT, "which is not a plain file name");
        free(nm);
        free(idx);
    }
    /* index structure */
    put_text(K3_ST_INDEX_NAME, "{\"weight_map\":");
    FAIL(K3_ERR_FORMAT, "'model.safetensors.index.json': index is not valid JSON: unexpected end of input");
    put_text(K3_ST_INDEX_NAME, "[]");
    FAIL(K3_ERR_FORMAT, "'model.safetensors.index.json': not a JSON object");
    put_text(K3_ST_INDEX_NAME, "{\"metadata\":{}}");
    FAIL(K3_ERR_FORMAT, "missing 'weight_map'");
    put_text(K3_ST_INDEX_NAME, "{\"weight_map\":[]}");
    FAIL(K3_ERR_FORMAT, "'weight_map' is not an object");
    put_text(K3_ST_INDEX_NAME, "{\"weight_map\":{}}");
    FAIL(K3_ERR_FORMAT, "'weight_map' is empty");
    put_text(K3_ST_INDEX_NAME, "{\"weight_map\":{\"a.weight\":1}}");
    FAIL(K3_ERR_FORMAT, "weight_map entry for tensor 'a.weight' is not a string");
    put_text(K3_ST_INDEX_NAME, "{\"weight_map\":{\"a.weight\":\"x\",\"a.weight\":\"y\"}}");
    FAIL(K3_ERR_FORMAT, "duplicate key in index: duplicate key 'a.weight'");
    /* a bad shard: its own message, naming the shard */
    put("model-00002-of-00002.safetensors", "\x05\0\0\0\0\0\0\0{}", 10);
    put_text(K3_ST_INDEX_NAME, INDEX("{}", GOOD_MAP));
    FAIL(K3_ERR_FORMAT, "'model-00002-of-00002.safetensors': header length 5 runs past the end of the file");

    /* the same tensor in two shards */
    new_dir();
    put_shard("s1.safetensors", 2, A_NAMES, A_SIZES);
    put_shard("s2.safetensors", 1, A_NAMES, A_SIZES);
    put_text(K3_ST_INDEX_NAME, INDEX("{}", "\"a.weight\":\"s1.safetensors\",\"b.weight\":\"s2.safetensors\""));
    FAIL(K3_ERR_FORMAT, "tensor 'a.weight' is in both 's1.safetensors' and 's2.safetensors'");
}

static void test_no_index(void)
{
    k3_st_ckpt c;
    /* exactly one .safetensors file, any name */
    new_dir();
    put_shard("weights.safetensors", 2, A_NAMES, A_SIZES);
    OPEN_OK(&c);
    CHECK(!c.has_index);
    CHECK_EQ_U64(c.n_tensors, 2);
    CHECK_STR(c.files[0].name, "weights.safetensors");
    k3_st_close(&c);
    /* several files, one of them model.safetensors: that one, with a warning */
    put_shard("model.safetensors", 1, B_NAMES, B_SIZES);
    OPEN_OK(&c);
    CHECK_EQ_U64(c.n_tensors, 1);
    CHECK_STR(c.files[0].name, "model.safetensors");
    CHECK_EQ_U64(c.n_warnings, 1);
    k3_st_close(&c);
    /* several files and no model.safetensors: ambiguous */
    new_dir();
    put_shard("x.safetensors", 2, A_NAMES, A_SIZES);
    put_shard("y.safetensors", 1, B_NAMES, B_SIZES);
    FAIL(K3_ERR_FORMAT, "holds 2 .safetensors files but no model.safetensors.index.json and no model.safetensors");
    /* nothing at all */
    new_dir();
    put_text("config.json", "{}");
    FAIL(K3_ERR_NOT_FOUND, "holds no model.safetensors.index.json and no .safetensors file");
    /* a path that does not exist, and a direct path to a shard */
    k3_diag d = {0};
    char p[4096];
    snprintf(p, sizeof p, "%s/missing.safetensors", g_dir);
    CHECK(k3_st_open(p, &c, &d) == K3_ERR_NOT_FOUND);
    CHECK(strstr(d.msg, "cannot open") != NULL);
    new_dir();
    put_two_shards();
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", g_dir);
    REQUIRE(k3_st_open(p, &c, &d) == K3_OK);
    CHECK_EQ_U64(c.n_tensors, 1);
    CHECK(c.config_json == NULL);
    CHECK(k3_st_find(&c, "c.weight") != NULL);
    k3_st_close(&c);
}

int main(void)
{
    snprintf(g_root, sizeof g_root, "%s/test_safetensors_dir", k3_test_tmpdir());
    test_index_good();
    test_index_bad();
    test_no_index();
    return k3_test_done();
}

/*
 * test_pack_format.c - the shard header codec and the manifest reader:
 * layout arithmetic worked out by hand, a round trip, and one damaged
 * header per rule of docs/FORMAT.md section 8.
 */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>

#include "k3_checked.h"
#include "k3_hash.h"
#include "k3_manifest.h"
#include "k3_pack_hash.h"
#include "k3_shard.h"
#include "k3_test.h"

static void build_trunk(k3_shard_header *h)
{
    k3_diag d;
    uint64_t s1[2] = {3, 5}, s2[1] = {7}, s3[3] = {12, 1, 4};
    k3_shard_init(h, K3_SHARD_TRUNK, 2, 0);
    REQUIRE(k3_shard_add(h, "model.layers.2.a.weight", K3_ENC_BF16, 2, s1, &d) == K3_OK);
    REQUIRE(k3_shard_add(h, "model.layers.2.b", K3_ENC_F32, 1, s2, &d) == K3_OK);
    REQUIRE(k3_shard_add(h, "model.layers.2.conv", K3_ENC_F32, 3, s3, &d) == K3_OK);
    REQUIRE(k3_shard_layout(h, &d) == K3_OK);
}

/* re-encode after a patch so the header hash is right, to reach later rules */
static void rehash(uint8_t *b, size_t n)
{
    k3_st64(b + 120, 0);
    k3_st64(b + 120, k3_xxh3_64(b, n));
}

static void expect_bad(const uint8_t *img, size_t n, uint64_t fsize, k3_err want, const char *substr)
{
    k3_shard_header h;
    k3_diag d = {0};
    k3_err e = k3_shard_decode(img, n, fsize, "x.k3s", &h, &d);
    CHECK_MSG(e == want, "expected error %d (%s), got %d: %s", want, substr, e, d.msg);
    CHECK_MSG(e == K3_OK || strstr(d.msg, substr) != NULL, "message '%s' lacks '%s'", d.msg, substr);
    if (e == K3_OK) k3_shard_header_free(&h);
}

static void test_trunk(void)
{
    k3_shard_header h;
    build_trunk(&h);
    /* by hand: header 128 + 3*64 + names (23+16+19=58) = 378 -> data at 4096;
       a: 3*5*2 = 30 B at 4096; b: 28 B at 8192; conv: 48*4 = 192 B at 12288; end 12480 -> 16384 */
    CHECK_EQ_U64(h.names_size, 58);
    CHECK_EQ_U64(h.data_offset, 4096);
    CHECK_EQ_U64(h.entries[0].offset, 4096);
    CHECK_EQ_U64(h.entries[0].size, 30);
    CHECK_EQ_U64(h.entries[1].offset, 8192);
    CHECK_EQ_U64(h.entries[2].offset, 12288);
    CHECK_EQ_U64(h.entries[2].size, 192);
    CHECK_EQ_U64(h.file_size, 16384);
    uint8_t *img;
    size_t n;
    k3_diag d;
    REQUIRE(k3_shard_encode(&h, &img, &n, &d) == K3_OK);
    CHECK_EQ_U64(n, 4096);
    CHECK(!memcmp(img, "K3SHARD\0", 8) && img[12] == 4 && img[15] == 1);

    k3_shard_header r;
    REQUIRE(k3_shard_decode(img, n, 16384, "x.k3s", &r, &d) == K3_OK);
    k3_shard_header_free(&r);
    /* the decoder only reads its input: it works on read-only memory */
    uint8_t *ro = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(ro != MAP_FAILED);
    memcpy(ro, img, n);
    REQUIRE(mprotect(ro, n, PROT_READ) == 0);
    REQUIRE(k3_shard_decode(ro, n, 16384, "x.k3s", &r, &d) == K3_OK);
    munmap(ro, n);
    CHECK_EQ_U64(r.n_entries, 3);
    const k3_shard_entry *e = k3_shard_find(&r, "model.layers.2.conv");
    REQUIRE(e);
    CHECK(e->ndim == 3 && e->shape[0] == 12 && e->shape[2] == 4 && e->encoding == K3_ENC_F32 && e->offset == 12288);
    CHECK(k3_shard_find(&r, "model.layers.2") == NULL);
    CHECK_EQ_U64(r.layer, 2);
    k3_shard_header_free(&r);

    uint8_t *bad = malloc(n);
    REQUIRE(bad);
#define MUTATE(stmt, fix_hash, fsize, want, substr) do { \
        memcpy(bad, img, n); \
        stmt; \
        if (fix_hash) rehash(bad, n); \
        expect_bad(bad, n, fsize, want, substr); \
    } while (0)
    MUTATE(bad[0] = 'X', 0, 16384, K3_ERR_FORMAT, "bad magic");
    MUTATE(k3_st32(bad + 8, 3), 0, 16384, K3_ERR_UNSUPPORTED, "version 3 is newer than this k3 (2); upgrade k3");
    MUTATE(k3_st32(bad + 8, 1), 0, 16384, K3_ERR_UNSUPPORTED,
           "version 1 is older than this k3 (2); re-run k3pack to make the pack again");
    MUTATE(k3_st32(bad + 8, 0), 0, 16384, K3_ERR_UNSUPPORTED, "version 0");
    MUTATE(k3_st32(bad + 12, 0x04030201), 0, 16384, K3_ERR_FORMAT, "byte-order");
    MUTATE(k3_st32(bad + 16, 3), 1, 16384, K3_ERR_FORMAT, "unknown shard kind");
    MUTATE(k3_st32(bad + 20, 100), 1, 16384, K3_ERR_FORMAT, "alignment");
    MUTATE(bad[100] = 1, 1, 16384, K3_ERR_FORMAT, "reserved header bytes");
    MUTATE((void)0, 0, 16000, K3_ERR_FORMAT, "truncated or extended");
    MUTATE(bad[300] ^= 1, 0, 16384, K3_ERR_CORRUPT, "header hash mismatch");
    MUTATE(bad[128 + 24] = 99, 1, 16384, K3_ERR_FORMAT, "unknown encoding");
    MUTATE(bad[128 + 26] = 1, 1, 16384, K3_ERR_FORMAT, "reserved bytes are not zero");
    MUTATE(bad[128 + 25] = 5, 1, 16384, K3_ERR_FORMAT, "dimensions");
    MUTATE(k3_st64(bad + 128 + 32 + 16, 9), 1, 16384, K3_ERR_FORMAT, "unused shape slot");
    MUTATE(k3_st64(bad + 128 + 8, 31), 1, 16384, K3_ERR_FORMAT, "does not match its shape");
    MUTATE(k3_st64(bad + 128 + 64, 4100), 1, 16384, K3_ERR_FORMAT, "not aligned");
    MUTATE(k3_st64(bad + 128 + 64, 4096), 1, 16384, K3_ERR_FORMAT, "overlaps");
    MUTATE(k3_st64(bad + 128 + 128, 16384), 1, 16384, K3_ERR_FORMAT, "past the end");
    MUTATE(k3_st32(bad + 128 + 20, 5000), 1, 16384, K3_ERR_FORMAT, "outside the name blob");
    MUTATE(bad[128 + 3 * 64] = 0xff, 1, 16384, K3_ERR_FORMAT, "not valid UTF-8");
    /* two entries with the same name: point b's name at a's (same length needed) */
    MUTATE((k3_st32(bad + 128 + 64 + 16, 0), k3_st32(bad + 128 + 64 + 20, 23)), 1, 16384, K3_ERR_FORMAT, "two entries are named");
    MUTATE(bad[n - 1] = 7, 1, 16384, K3_ERR_FORMAT, "padding before the data region");
    MUTATE(k3_st64(bad + 40, 8192), 1, 16384, K3_ERR_FORMAT, "data_offset is 8192");
    /* section 2.2: entries are listed in offset order (rows 0 and 1 swapped: same
       tensors, same offsets, but the table is out of order) */
    MUTATE((memcpy(bad + 128, img + 128 + 64, 64), memcpy(bad + 128 + 64, img + 128, 64)), 1, 16384,
           K3_ERR_FORMAT, "offset order");
    free(bad);
    free(img);
    k3_shard_header_free(&h);
}

static void test_experts(void)
{
    /* a K3-sized record: w1/w3 [3072, 3584] MXFP4 + [3072, 112] E8M0, w2 [3584, 3072] + [3584, 96] */
    k3_shard_header h;
    k3_diag d;
    k3_shard_init(&h, K3_SHARD_EXPERTS, 1, 896);
    uint64_t w13[2] = {3072, 3584}, s13[2] = {3072, 112}, w2[2] = {3584, 3072}, s2[2] = {3584, 96};
    REQUIRE(!k3_shard_add(&h, "w1.weight_packed", K3_ENC_MXFP4, 2, w13, &d));
    REQUIRE(!k3_shard_add(&h, "w1.weight_scale", K3_ENC_E8M0, 2, s13, &d));
    REQUIRE(!k3_shard_add(&h, "w3.weight_packed", K3_ENC_MXFP4, 2, w13, &d));
    REQUIRE(!k3_shard_add(&h, "w3.weight_scale", K3_ENC_E8M0, 2, s13, &d));
    REQUIRE(!k3_shard_add(&h, "w2.weight_packed", K3_ENC_MXFP4, 2, w2, &d));
    REQUIRE(!k3_shard_add(&h, "w2.weight_scale", K3_ENC_E8M0, 2, s2, &d));
    REQUIRE(!k3_shard_layout(&h, &d));
    /* DESIGN/FORMAT numbers: 5,505,024 + 344,064 per matrix, record 17,547,264 = 4284 pages */
    CHECK_EQ_U64(h.entries[0].size, 5505024);
    CHECK_EQ_U64(h.entries[1].size, 344064);
    CHECK_EQ_U64(h.entries[4].offset, 2 * (5505024 + 344064));
    CHECK_EQ_U64(h.record_size, 17547264);
    CHECK_EQ_U64(h.record_stride, 17547264);
    CHECK_EQ_U64(h.file_size, 4096 + 896ull * 17547264);
    uint8_t *img;
    size_t n;
    REQUIRE(!k3_shard_encode(&h, &img, &n, &d));
    k3_shard_header r;
    REQUIRE(k3_shard_decode(img, n, h.file_size, "e.k3s", &r, &d) == K3_OK);
    CHECK_EQ_U64(r.n_records, 896);
    k3_shard_header_free(&r);
    uint8_t *bad = malloc(n);
    REQUIRE(bad);
    MUTATE(k3_st64(bad + 64, 17547265), 1, h.file_size, K3_ERR_FORMAT, "record_size");
    MUTATE(k3_st64(bad + 72, 17551360), 1, h.file_size, K3_ERR_FORMAT, "record_stride");
    MUTATE(k3_st64(bad + 56, 895), 1, h.file_size, K3_ERR_FORMAT, "do not fill the file");
    MUTATE(k3_st64(bad + 128 + 64, 8), 1, h.file_size, K3_ERR_FORMAT, "misaligned or overlaps");
    /* parts are listed in offset order: w3 packed listed before w1 scales */
    MUTATE((memcpy(bad + 128 + 64, img + 128 + 128, 64), memcpy(bad + 128 + 128, img + 128 + 64, 64)), 1,
           h.file_size, K3_ERR_FORMAT, "offset order");
    free(bad);
    free(img);
    k3_shard_header_free(&h);

    /* section 2.2: the parts of a record start at 0 (one U8 part moved from 0 to 64,
       record_size following it; the stride is still one page) */
    uint64_t s64[1] = {64};
    k3_shard_init(&h, K3_SHARD_EXPERTS, 1, 2);
    REQUIRE(!k3_shard_add(&h, "w1.weight", K3_ENC_U8, 1, s64, &d));
    REQUIRE(!k3_shard_layout(&h, &d));
    REQUIRE(!k3_shard_encode(&h, &img, &n, &d));
    REQUIRE(k3_shard_decode(img, n, h.file_size, "e.k3s", &r, &d) == K3_OK);
    k3_shard_header_free(&r);
    bad = malloc(n);
    REQUIRE(bad);
    MUTATE((k3_st64(bad + 128, 64), k3_st64(bad + 64, 128)), 1, h.file_size, K3_ERR_FORMAT, "start at 0");
    free(bad);
    free(img);
    k3_shard_header_free(&h);
    /* odd number of 4-bit elements cannot be stored */
    uint64_t odd[1] = {3};
    uint64_t bytes;
    CHECK(k3_enc_size(K3_ENC_MXFP4, 1, odd, &bytes, &d) == K3_ERR_FORMAT);
    uint64_t huge[2] = {1ull << 40, 1ull << 40};
    CHECK(k3_enc_size(K3_ENC_F32, 2, huge, &bytes, &d) == K3_ERR_FORMAT);
}

static const char *good_manifest =
    "{\"format\":\"k3-pack\",\"format_version\":2,\"byte_order\":\"little\",\"generator\":\"t\","
    "\"name_prefix\":\"language_model.\",\"hashes\":{},\"config\":{\"a\":1},"
    "\"experts\":{\"encoding\":\"MXFP4\",\"source\":\"checkpoint\",\"layout\":\"w1,w3,w2;packed,scale\",\"quantization\":null},"
    "\"files\":[{\"name\":\"tiktoken.model\",\"size\":3,\"xxh3_128\":\"0123456789abcdef0123456789abcdef\"}],"
    "\"shards\":[{\"name\":\"trunk-embed.k3s\",\"kind\":\"trunk\",\"layer\":null,\"size\":8192,"
    "\"header_hash\":\"0123456789abcdef\",\"xxh3_128\":\"0123456789abcdef0123456789abcdef\"},"
    "{\"name\":\"experts-layer-001.k3s\",\"kind\":\"experts\",\"layer\":1,\"size\":12288,"
    "\"header_hash\":\"0123456789abcdef\",\"xxh3_128\":\"0123456789abcdef0123456789abcdef\"}],"
    "\"tensors\":[{\"name\":\"model.embed_tokens.weight\",\"encoding\":\"BF16\",\"shape\":[4,8],"
    "\"shard\":\"trunk-embed.k3s\",\"offset\":4096,\"size\":64,\"xxh3_64\":\"0000000000000001\"}],"
    "\"expert_layers\":[{\"layer\":1,\"shard\":\"experts-layer-001.k3s\",\"count\":2,\"offset\":4096,"
    "\"stride\":4096,\"record_size\":80,\"parts\":[{\"name\":\"w1.weight_packed\",\"encoding\":\"MXFP4\","
    "\"shape\":[2,64],\"offset\":0,\"size\":64},{\"name\":\"w1.weight_scale\",\"encoding\":\"E8M0\","
    "\"shape\":[2,2],\"offset\":64,\"size\":4}],\"xxh3_64\":[\"0000000000000002\",\"0000000000000003\"]}],"
    "\"skipped\":[{\"name\":\"vision_tower.x\",\"reason\":\"vision\"}]}";

static char *replace(const char *s, const char *from, const char *to)
{
    const char *p = strstr(s, from);
    REQUIRE(p);
    size_t a = (size_t)(p - s), fl = strlen(from), tl = strlen(to), n = strlen(s);
    char *r = malloc(n - fl + tl + 1);
    REQUIRE(r);
    memcpy(r, s, a);
    memcpy(r + a, to, tl);
    memcpy(r + a + tl, p + fl, n - a - fl + 1);
    return r;
}

/* JSON text ending in '}' as k3pack writes a manifest (FORMAT.md 5.1): the checksum
   member last, sealed. malloc'd. */
static char *seal_json(const char *json)
{
    static const char tail[] = ",\n \"manifest_xxh3_64\": \"0000000000000000\"\n}\n";
    size_t n = strlen(json);
    REQUIRE(n > 1 && json[n - 1] == '}');
    char *t = malloc(n - 1 + sizeof tail);          /* json without '}' + tail + NUL */
    REQUIRE(t);
    memcpy(t, json, n - 1);
    memcpy(t + n - 1, tail, sizeof tail);
    REQUIRE(k3_manifest_seal(t, strlen(t)) == 0);
    return t;
}

static void parse_bad(const char *t, size_t len, k3_err want, const char *substr)
{
    k3_manifest m;
    k3_diag d = {0};
    k3_err e = k3_manifest_parse(t, len, "p/manifest.json", &m, &d);
    CHECK_MSG(e == want, "expected %d (%s), got %d (%s)", want, substr, e, d.msg);
    CHECK_MSG(e == K3_OK || strstr(d.msg, substr), "message '%s' lacks '%s'", d.msg, substr);
    if (e == K3_OK) k3_manifest_free(&m);
}

/* good_manifest with from replaced by to, sealed: it reaches every rule after the checksum */
/* Version 3 (FORMAT.md 10): good_manifest's expert layer read in place from the checkpoint files
   `files` (JSON array text) at `records` ([[file, offset], [file, offset]]). */
static void in_place_case(const char *files, const char *records, k3_err want, const char *substr)
{
    char cf[1024], lay[512];
    snprintf(cf, sizeof cf, "\"checkpoint_files\":%s,\"shards\":[", files);
    snprintf(lay, sizeof lay, "{\"layer\":1,\"source\":\"checkpoint\",\"records\":%s,\"count\":2,", records);
    char *a = replace(good_manifest, "\"format_version\":2", "\"format_version\":3");
    char *b = replace(a, "\"shards\":[", cf);
    char *u = replace(b, "{\"layer\":1,\"shard\":\"experts-layer-001.k3s\",\"count\":2,\"offset\":4096,\"stride\":4096,", lay);
    char *t = seal_json(u);
    free(a);
    free(b);
    free(u);
    k3_manifest m;
    k3_diag d = {0};
    k3_err e = k3_manifest_parse(t, strlen(t), "p/manifest.json", &m, &d);
    CHECK_MSG(e == want, "in place %s %s: expected %d, got %d (%s)", files, records, want, e, d.msg);
    CHECK_MSG(e == K3_OK || strstr(d.msg, substr), "message '%s' lacks '%s'", d.msg, substr);
    if (e == K3_OK) {
        const k3_mf_experts *x = &m.expert_layers[0];
        CHECK(x->in_place && x->shard == UINT32_MAX && x->rec_off[1] == 200 && x->rec_file[0] == 0);
        CHECK(x->stride == k3_in_place_stride(80) && x->stride == 8192 && m.n_sources >= 1);
        k3_manifest_free(&m);
    }
    free(t);
}

static void in_place_cases(void)
{
    static const char one[] = "[{\"name\":\"model-1.safetensors\",\"size\":1000,\"header_size\":64,"
                              "\"header_xxh3_128\":\"0123456789abcdef0123456789abcdef\"}]";
    in_place_case(one, "[[0,100],[0,200]]", K3_OK, "");
    in_place_case(one, "[[0,100],[0,950]]", K3_ERR_FORMAT, "not inside the data of 'model-1.safetensors'");
    in_place_case(one, "[[0,10],[0,200]]", K3_ERR_FORMAT, "not inside the data");
    in_place_case(one, "[[1,100],[0,200]]", K3_ERR_FORMAT, "expected [file index, offset]");
    in_place_case(one, "[[0,100]]", K3_ERR_FORMAT, "expected 2 [file, offset] pairs");
    in_place_case("[{\"name\":\"../x.safetensors\",\"size\":1000,\"header_size\":64,"
                  "\"header_xxh3_128\":\"0123456789abcdef0123456789abcdef\"}]",
                  "[[0,100],[0,200]]", K3_ERR_FORMAT, "not a plain file name");
    in_place_case("[{\"name\":\"a.safetensors\",\"size\":1000,\"header_size\":64,\"in_pack\":true,"
                  "\"header_xxh3_128\":\"0123456789abcdef0123456789abcdef\"},"
                  "{\"name\":\"b.safetensors\",\"size\":1000,\"header_size\":64,"
                  "\"header_xxh3_128\":\"0123456789abcdef0123456789abcdef\"}]",
                  "[[0,100],[1,200]]", K3_ERR_FORMAT, "only the last file may be the pack's own");
    in_place_case("[{\"name\":\"m.safetensors\",\"size\":1000,\"header_size\":2000,"
                  "\"header_xxh3_128\":\"0123456789abcdef0123456789abcdef\"}]",
                  "[[0,100],[0,200]]", K3_ERR_FORMAT, "not a safetensors header inside the file");
}

static void manifest_bad(const char *from, const char *to, k3_err want, const char *substr)
{
    char *u = replace(good_manifest, from, to);
    char *t = seal_json(u);
    free(u);
    k3_manifest m;
    k3_diag d = {0};
    k3_err e = k3_manifest_parse(t, strlen(t), "p/manifest.json", &m, &d);
    CHECK_MSG(e == want, "'%s' -> '%s': expected %d, got %d (%s)", from, to, want, e, d.msg);
    CHECK_MSG(e == K3_OK || strstr(d.msg, substr), "message '%s' lacks '%s'", d.msg, substr);
    if (e == K3_OK) k3_manifest_free(&m);
    free(t);
}

#define LONG_NAME "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" \
                  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" \
                  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.model"   /* 262 bytes: over NAME_MAX */

static void test_manifest(void)
{
    k3_manifest m;
    k3_diag d;
    char *good = seal_json(good_manifest);
    REQUIRE(k3_manifest_parse(good, strlen(good), "p/manifest.json", &m, &d) == K3_OK);
    free(good);
    CHECK(m.n_shards == 2 && m.n_tensors == 1 && m.n_expert_layers == 1 && m.n_files == 1 && m.n_skipped == 1);
    CHECK(m.shards[0].layer == -1 && m.shards[1].layer == 1 && m.shards[1].kind == K3_SHARD_EXPERTS);
    CHECK(m.expert_layers[0].hashes[1] == 3 && m.expert_layers[0].parts[1].encoding == K3_ENC_E8M0);
    CHECK(m.tensors[0].shape[1] == 8 && m.tensors[0].shard == 0 && m.tensors[0].hash == 1);
    CHECK(m.experts_encoding == K3_ENC_MXFP4 && !m.experts_quantized);
    /* dump and parse again: same content */
    char *text;
    size_t len;
    REQUIRE(k3_manifest_dump(&m, &text, &len, &d) == K3_OK);
    k3_manifest m2;
    REQUIRE(k3_manifest_parse(text, len, "again", &m2, &d) == K3_OK);
    CHECK(m2.n_shards == 2 && m2.expert_layers[0].hashes[0] == 2 && !strcmp(m2.name_prefix, "language_model."));
    char *text2;
    size_t len2;
    REQUIRE(k3_manifest_dump(&m2, &text2, &len2, &d) == K3_OK);
    CHECK(len == len2 && !memcmp(text, text2, len));
    free(text);
    free(text2);
    k3_manifest_free(&m2);
    k3_manifest_free(&m);

    manifest_bad("\"format_version\":2", "\"format_version\":3", K3_OK, "");   /* 3 reads 2's manifests */
    manifest_bad("\"format_version\":2", "\"format_version\":4", K3_ERR_UNSUPPORTED,
                 "pack format version 4 is newer than this k3 (3); upgrade k3");
    manifest_bad("\"format_version\":2", "\"format_version\":1", K3_ERR_UNSUPPORTED,
                 "pack format version 1 is older than this k3 (3); re-run k3pack");
    manifest_bad("\"shards\":[", "\"checkpoint_files\":[],\"shards\":[", K3_ERR_FORMAT,
                 "'checkpoint_files' needs format version 3");
    in_place_cases();
    manifest_bad("\"format_version\":2", "\"format_version\":0", K3_ERR_UNSUPPORTED, "version 0");
    manifest_bad("\"format\":\"k3-pack\"", "\"format\":\"other\"", K3_ERR_FORMAT, "not a k3 pack");
    manifest_bad("\"byte_order\":\"little\"", "\"byte_order\":\"big\"", K3_ERR_FORMAT, "byte_order");
    manifest_bad("\"generator\":\"t\"", "\"generator\":\"t\",\"generator\":\"u\"", K3_ERR_FORMAT, "duplicate");
    manifest_bad("\"size\":8192", "\"size\":-1", K3_ERR_FORMAT, "shards[0].size");
    manifest_bad("\"name\":\"trunk-embed.k3s\",\"kind\"", "\"name\":\"../x.k3s\",\"kind\"", K3_ERR_FORMAT, "plain file name");
    manifest_bad("\"shard\":\"trunk-embed.k3s\"", "\"shard\":\"nope.k3s\"", K3_ERR_FORMAT, "tensors[0].shard");
    manifest_bad("\"encoding\":\"BF16\"", "\"encoding\":\"Q4\"", K3_ERR_FORMAT, "unknown encoding");
    manifest_bad("\"xxh3_64\":\"0000000000000001\"", "\"xxh3_64\":\"zz\"", K3_ERR_FORMAT, "hex digits");
    manifest_bad(",\"0000000000000003\"]", "]", K3_ERR_FORMAT, "expected 2 record hashes");
    manifest_bad("\"shape\":[4,8]", "\"shape\":[1,1,1,1,1]", K3_ERR_FORMAT, "at most 4");
    manifest_bad("\"shape\":[4,8]", "\"shape\":[4,9]", K3_ERR_FORMAT, "tensors[0].size: 64 bytes do not match");
    manifest_bad("\"shape\":[2,2]", "\"shape\":[2,3]", K3_ERR_FORMAT, "parts[1].size: 4 bytes do not match");
    manifest_bad("\"name\":\"tiktoken.model\"", "\"name\":\"" LONG_NAME "\"", K3_ERR_FORMAT, "plain file name");
    manifest_bad("\"layout\":\"w1,w3,w2;packed,scale\"", "\"layout\":\"interleaved\"", K3_ERR_FORMAT, "record layout");
    manifest_bad("{\"format\"", "[{\"format\"", K3_ERR_FORMAT, "invalid JSON");
    /* 2^32 + 1 was read as layer 1 (truncated to 32 bits) */
    manifest_bad("\"expert_layers\":[{\"layer\":1,", "\"expert_layers\":[{\"layer\":4294967297,", K3_ERR_FORMAT,
                 "expert_layers[0].layer");
}

/* FORMAT.md 5.1: the manifest's checksum of itself. Every byte of a real
   manifest flipped in turn (two different bits) is refused, naming the file. */
static void test_manifest_sum(void)
{
    char *good = seal_json(good_manifest);
    size_t n = strlen(good);
    k3_manifest m;
    k3_diag d;
    REQUIRE(k3_manifest_parse(good, n, "p/manifest.json", &m, &d) == K3_OK);
    char *text;
    size_t len;
    REQUIRE(k3_manifest_dump(&m, &text, &len, &d) == K3_OK);
    k3_manifest_free(&m);
    CHECK(len > 40 && !memcmp(text + len - 41, "\"manifest_xxh3_64\": \"", 21) && !memcmp(text + len - 4, "\"\n}\n", 4));
    char hex[17];
    k3_hex64(k3_xxh3_64(text, len - 20), hex);
    CHECK(!memcmp(text + len - 20, hex, 16));
    size_t refused = 0, named = 0;
    for (size_t i = 0; i < len; i++) {
        for (int b = 0; b < 2; b++) {
            text[i] ^= (char)(b ? 0x20 : 0x01);
            k3_diag dd = {0};
            k3_err e = k3_manifest_parse(text, len, "p/manifest.json", &m, &dd);
            if (e == K3_OK) {
                k3_manifest_free(&m);
                CHECK_MSG(0, "byte %zu ^ 0x%02x accepted", i, b ? 0x20 : 0x01);
            }
            refused += e != K3_OK;
            named += e != K3_OK && strstr(dd.msg, "p/manifest.json") != NULL;
            text[i] ^= (char)(b ? 0x20 : 0x01);
        }
    }
    CHECK_EQ_U64(refused, 2 * len);
    CHECK_EQ_U64(named, 2 * len);
    /* a damaged content byte: the checksum says so */
    text[10] ^= 1;
    parse_bad(text, len, K3_ERR_CORRUPT, "checksum mismatch");
    text[10] ^= 1;
    /* a version 1 manifest (no checksum): re-run k3pack; a version 2 one without it: damaged */
    char *v1 = replace(good_manifest, "\"format_version\":2", "\"format_version\":1");
    parse_bad(v1, strlen(v1), K3_ERR_UNSUPPORTED, "version 1 is older than this k3 (2) and its manifest carries "
              "no checksum of itself; re-run k3pack");
    free(v1);
    parse_bad(good_manifest, strlen(good_manifest), K3_ERR_FORMAT, "p/manifest.json': does not end with its checksum");
    parse_bad(text, len - 1, K3_ERR_FORMAT, "does not end with its checksum");
    free(text);
    free(good);
}

/* FORMAT.md 5.2: what one manifest may cost, refused before jansson allocates */
static void test_manifest_cost(void)
{
    size_t items = K3_MANIFEST_MAX_ITEMS + 1, n = 2 * items + 1;
    char *t = malloc(n + 1);                        /* "[0,0,...,0]" of items values */
    REQUIRE(t);
    t[0] = '[';
    for (size_t i = 0; i < items; i++) {
        t[1 + 2 * i] = '0';
        t[2 + 2 * i] = ',';
    }
    t[n - 1] = ']';
    t[n] = '\0';
    parse_bad(t, n, K3_ERR_FORMAT, "2097154 JSON values and keys, more than the limit of 2097152");
    /* ',' ':' '{' '[' inside strings are not counted */
    memset(t, ',', n);
    t[0] = '"';
    t[n - 1] = '"';
    parse_bad(t, n, K3_ERR_FORMAT, "does not end with its checksum");
    free(t);
    size_t big = K3_MANIFEST_MAX + 1;
    t = malloc(big);
    REQUIRE(t);
    memset(t, ' ', big);
    parse_bad(t, big, K3_ERR_FORMAT, "p/manifest.json' is 67108865 bytes, more than the limit of 67108864");
    free(t);
}

/* FORMAT.md 8: offsets that overlap or point past the end of their shard, named by field */
static void test_manifest_ranges(void)
{
    manifest_bad("\"offset\":4096,\"size\":64", "\"offset\":8192,\"size\":64", K3_ERR_FORMAT,
                 "tensors[0].offset: bytes [8192, +64) end past the end of shard 'trunk-embed.k3s' (8192 bytes)");
    manifest_bad("\"offset\":4096,\"size\":64", "\"offset\":9223372036854775800,\"size\":64", K3_ERR_FORMAT,
                 "tensors[0].offset: bytes [9223372036854775800, +64) end past the end");
    manifest_bad("\"offset\":4096,\"size\":64", "\"offset\":64,\"size\":64", K3_ERR_FORMAT,
                 "tensors[0].offset: bytes [64, +64) overlap the shard header");
    /* a second tensor overlapping the first */
    char *two = replace(good_manifest, "\"xxh3_64\":\"0000000000000001\"}",
                        "\"xxh3_64\":\"0000000000000001\"},{\"name\":\"model.norm.weight\",\"encoding\":\"BF16\","
                        "\"shape\":[8],\"shard\":\"trunk-embed.k3s\",\"offset\":4150,\"size\":16,"
                        "\"xxh3_64\":\"0000000000000004\"}");
    char *t = seal_json(two);
    k3_manifest m;
    k3_diag d;
    REQUIRE(k3_manifest_parse(t, strlen(t), "p/manifest.json", &m, &d) != K3_OK);
    CHECK_MSG(strstr(d.msg, "tensors[1].offset: bytes [4150, +16) overlap the shard header or the tensor listed "
                     "before it in shard 'trunk-embed.k3s'"), "%s", d.msg);
    free(t);
    char *ok = replace(two, "\"offset\":4150", "\"offset\":4160");
    t = seal_json(ok);
    REQUIRE(k3_manifest_parse(t, strlen(t), "p/manifest.json", &m, &d) == K3_OK);
    k3_manifest_free(&m);
    free(t);
    free(ok);
    free(two);
    /* expert records: past the end, overlapping each other, over the header; parts */
    manifest_bad("\"stride\":4096", "\"stride\":8192", K3_ERR_FORMAT,
                 "expert_layers[0]: 2 records of 80 bytes at stride 8192 from offset 4096 end past the end of shard "
                 "'experts-layer-001.k3s' (12288 bytes)");
    manifest_bad("\"stride\":4096", "\"stride\":4611686018427387904", K3_ERR_FORMAT, "end past the end of shard");
    manifest_bad("\"stride\":4096", "\"stride\":64", K3_ERR_FORMAT,
                 "expert_layers[0].record_size: 80 bytes, more than the stride of 64: records overlap");
    manifest_bad("\"count\":2,\"offset\":4096", "\"count\":2,\"offset\":0", K3_ERR_FORMAT,
                 "expert_layers[0].offset: 0 overlaps the shard header");
    manifest_bad("\"offset\":64,\"size\":4}", "\"offset\":32,\"size\":4}", K3_ERR_FORMAT,
                 "expert_layers[0].parts[1]: bytes [32, +4) of the record overlap the part before");
    manifest_bad("\"record_size\":80", "\"record_size\":66", K3_ERR_FORMAT,
                 "expert_layers[0].parts[1]: bytes [64, +4) of the record overlap the part before or end past its "
                 "record_size 66");
}

/* A shard header that lies about sizes is refused from its fixed part, naming
   the field, before a buffer is sized from it (k3_shard_read_header). */
static void test_header_lies(void)
{
    k3_shard_header h, r;
    k3_diag d;
    build_trunk(&h);
    uint8_t *img;
    size_t n;
    REQUIRE(k3_shard_encode(&h, &img, &n, &d) == K3_OK);
    char path[4200];
    snprintf(path, sizeof path, "%s/test_pack_format_lies.k3s", k3_test_tmpdir());
    struct { uint64_t off; int w64; uint64_t v; const char *msg; } lie[] = {
        {28, 0, 65535, "data_offset is 4096, expected 4198400"},          /* n_entries: 65535 rows */
        {32, 1, 16u << 20, "data_offset is 4096, expected 16781312"},     /* names_size: 16 MiB */
        {28, 0, 70000, "70000 entries, more than the limit"},
        {32, 1, 1ull << 40, "exceeds the limit"},
        {48, 1, 1ull << 40, "file is 16384 bytes but its header says 1099511627776"},   /* file_size */
        {40, 1, 1ull << 40, "data_offset is 1099511627776, expected 4096"},
    };
    for (size_t i = 0; i < sizeof lie / sizeof lie[0]; i++) {
        uint8_t *b = calloc(1, (size_t)h.file_size);
        REQUIRE(b);
        memcpy(b, img, n);
        if (lie[i].w64) k3_st64(b + lie[i].off, lie[i].v);
        else k3_st32(b + lie[i].off, (uint32_t)lie[i].v);
        rehash(b, n);
        FILE *f = fopen(path, "wb");
        REQUIRE(f && fwrite(b, 1, (size_t)h.file_size, f) == h.file_size && fclose(f) == 0);
        free(b);
        int fd = open(path, O_RDONLY);
        REQUIRE(fd >= 0);
        k3_diag dd = {0};
        k3_err e = k3_shard_read_header(fd, path, &r, &dd);
        close(fd);
        CHECK_MSG(e == K3_ERR_FORMAT && strstr(dd.msg, lie[i].msg), "lie %zu: %d %s", i, e, dd.msg);
        if (!e) k3_shard_header_free(&r);
    }
    unlink(path);
    free(img);
    k3_shard_header_free(&h);
}

/* A valid header whose records are empty (one zero-size part, stride 0) may
   claim any number of them: hashing it must fail cleanly, not overflow the
   span table (2^62 records: 2 * n + 3 spans of 24 bytes wrapped to 72 bytes). */
static void test_hash_many_empty_records(void)
{
    k3_shard_header h, r;
    k3_diag d;
    uint64_t zero[1] = {0};
    k3_shard_init(&h, K3_SHARD_EXPERTS, 1, 1ull << 62);
    REQUIRE(!k3_shard_add(&h, "w1.weight", K3_ENC_U8, 1, zero, &d));
    REQUIRE(!k3_shard_layout(&h, &d));
    uint8_t *img;
    size_t n;
    REQUIRE(!k3_shard_encode(&h, &img, &n, &d));
    REQUIRE(h.file_size == n);
    REQUIRE(k3_shard_decode(img, n, n, "z.k3s", &r, &d) == K3_OK);
    char path[4200];
    snprintf(path, sizeof path, "%s/test_pack_format_zero.k3s", k3_test_tmpdir());
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(img, 1, n, f) == n && fclose(f) == 0);
    int fd = open(path, O_RDONLY);
    REQUIRE(fd >= 0);
    k3_shard_hashes hs;
    k3_diag dh = {0};
    k3_err e = k3_shard_hash(fd, path, &r, 1u << 16, 0, NULL, NULL, &hs, &dh);
    CHECK_MSG(e != K3_OK, "hashing 2^62 empty records succeeded");
    CHECK_MSG(strstr(dh.msg, "records") != NULL, "message '%s' lacks 'records'", dh.msg);
    if (!e) k3_shard_hashes_free(&hs);
    close(fd);
    unlink(path);
    k3_shard_header_free(&r);
    k3_shard_header_free(&h);
    free(img);
}

/* FORMAT.md 2.2: bytes between the parts of a record are zero. They are hashed
   with the record, and must also be reported like any other padding. */
static void test_hash_record_gaps(void)
{
    k3_shard_header h;
    k3_diag d;
    uint64_t s8[1] = {8};
    k3_shard_init(&h, K3_SHARD_EXPERTS, 1, 2);
    REQUIRE(!k3_shard_add(&h, "w1.weight", K3_ENC_U8, 1, s8, &d));       /* [0, 8) */
    REQUIRE(!k3_shard_add(&h, "w3.weight", K3_ENC_U8, 1, s8, &d));       /* [64, 72): gap [8, 64) */
    REQUIRE(!k3_shard_layout(&h, &d));
    REQUIRE(h.record_size == 72 && h.record_stride == 4096 && h.file_size == h.data_offset + 8192);
    uint8_t *img;
    size_t n;
    REQUIRE(!k3_shard_encode(&h, &img, &n, &d));
    uint8_t *file = calloc(1, (size_t)h.file_size);
    REQUIRE(file);
    memcpy(file, img, n);
    file[h.data_offset + 3] = 5;                          /* inside part w1 of record 0: data */
    file[h.data_offset + 4096 + 20] = 1;                  /* between the parts of record 1 */
    char path[4200];
    snprintf(path, sizeof path, "%s/test_pack_format_gap.k3s", k3_test_tmpdir());
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(file, 1, (size_t)h.file_size, f) == h.file_size && fclose(f) == 0);
    int fd = open(path, O_RDONLY);
    REQUIRE(fd >= 0);
    k3_shard_hashes hs;
    REQUIRE(k3_shard_hash(fd, path, &h, 1000, 0, NULL, NULL, &hs, &d) == K3_OK);  /* odd chunks */
    CHECK_EQ_U64(hs.bad_padding, h.data_offset + 4096 + 20);
    CHECK(hs.record[0] == k3_xxh3_64(file + h.data_offset, 72));
    CHECK(hs.record[1] == k3_xxh3_64(file + h.data_offset + 4096, 72));
    k3_shard_hashes_free(&hs);
    /* the data byte alone is not padding */
    file[h.data_offset + 4096 + 20] = 0;
    close(fd);
    f = fopen(path, "wb");
    REQUIRE(f && fwrite(file, 1, (size_t)h.file_size, f) == h.file_size && fclose(f) == 0);
    fd = open(path, O_RDONLY);
    REQUIRE(fd >= 0);
    REQUIRE(k3_shard_hash(fd, path, &h, 1000, 0, NULL, NULL, &hs, &d) == K3_OK);
    CHECK_EQ_U64(hs.bad_padding, UINT64_MAX);
    k3_shard_hashes_free(&hs);
    close(fd);
    unlink(path);
    free(file);
    free(img);
    k3_shard_header_free(&h);
}

int main(void)
{
    test_trunk();
    test_experts();
    test_manifest();
    test_manifest_sum();
    test_manifest_cost();
    test_manifest_ranges();
    test_header_lies();
    test_hash_many_empty_records();
    test_hash_record_gaps();
    return k3_test_done();
}

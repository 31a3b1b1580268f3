/*
 * test_safetensors.c - one hand-made file per safetensors rule (FORMATS.md §1):
 * every bad file must fail with K3_ERR_FORMAT and its own message, both through
 * the file reader (k3_st_open) and the pure parser (k3_st_parse_header); good
 * edge cases must load with the right tensors and absolute offsets.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_checked.h"
#include "k3_test.h"
#include "safetensors.h"

static char g_dir[2048];

/* File image: 8-byte N (= hlen unless n_override != UINT64_MAX), header, data_len zero bytes. */
static uint8_t *image(const char *hdr, size_t hlen, uint64_t n_override, size_t data_len, size_t *len)
{
    *len = 8 + hlen + data_len;
    uint8_t *b = calloc(1, *len);
    REQUIRE(b);
    k3_st64(b, n_override == UINT64_MAX ? hlen : n_override);
    memcpy(b + 8, hdr, hlen);
    return b;
}

static const char *write_file(const char *name, const uint8_t *b, size_t len)
{
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    REQUIRE(fwrite(b, 1, len, f) == len);
    REQUIRE(fclose(f) == 0);
    return path;
}

/* Both readers must fail with code and a message containing want. */
static void expect_fail_img(int line, const uint8_t *b, size_t len, k3_err code, const char *want)
{
    const char *path = write_file("bad.safetensors", b, len);
    k3_st_ckpt c;
    k3_diag d = {0};
    k3_err e = k3_st_open(path, &c, &d);
    CHECK_MSG(e == code, "line %d: k3_st_open returned %d (%s), expected %d", line, e, d.msg, code);
    CHECK_MSG(e && strstr(d.msg, want), "line %d: message '%s' lacks '%s'", line, d.msg, want);
    if (!e) k3_st_close(&c);

    k3_st_header h;
    k3_diag d2 = {0};
    e = k3_st_parse_header(b, len, len, "mem", &h, &d2);
    CHECK_MSG(e == code, "line %d: parse returned %d (%s), expected %d", line, e, d2.msg, code);
    CHECK_MSG(e && strstr(d2.msg, want), "line %d: parse message '%s' lacks '%s'", line, d2.msg, want);
    CHECK_MSG(e && strncmp(d2.msg, "'mem': ", 7) == 0, "line %d: message '%s' does not name the file", line, d2.msg);
    if (!e) k3_st_header_free(&h);
}

static void expect_fail_n(int line, const char *hdr, size_t hlen, size_t data_len, const char *want)
{
    size_t len;
    uint8_t *b = image(hdr, hlen, UINT64_MAX, data_len, &len);
    expect_fail_img(line, b, len, K3_ERR_FORMAT, want);
    free(b);
}

#define BAD(hdr, data_len, want) expect_fail_n(__LINE__, hdr, sizeof(hdr) - 1, data_len, want)
#define T(name, dt, shape, b, e) "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

/* A good file: open it, return the checkpoint (caller closes). */
static void open_good(int line, const char *hdr, size_t hlen, size_t data_len, k3_st_ckpt *c)
{
    size_t len;
    uint8_t *b = image(hdr, hlen, UINT64_MAX, data_len, &len);
    const char *path = write_file("good.safetensors", b, len);
    k3_diag d = {0};
    k3_err e = k3_st_open(path, c, &d);
    if (e) fprintf(stderr, "line %d: %s\n", line, d.msg);
    REQUIRE(e == K3_OK);
    free(b);
}
#define GOOD(hdr, data_len, c) open_good(__LINE__, hdr, sizeof(hdr) - 1, data_len, c)

static void test_prefix(void)
{
    uint8_t five[5] = {1, 2, 3, 4, 5};
    expect_fail_img(__LINE__, five, sizeof five, K3_ERR_FORMAT, "too short for the 8-byte header length");
    uint8_t empty[1];
    expect_fail_img(__LINE__, empty, 0, K3_ERR_FORMAT, "file is 0 bytes");

    size_t len;
    uint8_t *b = image("{}", 2, 100000001, 0, &len);
    expect_fail_img(__LINE__, b, len, K3_ERR_FORMAT, "header length 100000001 exceeds the limit of 100000000");
    free(b);
    b = image("{}", 2, UINT64_MAX - 3, 0, &len);       /* 8 + N would wrap */
    expect_fail_img(__LINE__, b, len, K3_ERR_FORMAT, "exceeds the limit");
    free(b);
    b = image("{}", 2, 1000, 40, &len);
    expect_fail_img(__LINE__, b, len, K3_ERR_FORMAT, "header length 1000 runs past the end of the file (50 bytes)");
    free(b);
    b = image("", 0, UINT64_MAX, 0, &len);
    expect_fail_img(__LINE__, b, len, K3_ERR_FORMAT, "header length is 0");
    free(b);
}

static void test_json(void)
{
    BAD("{abc", 0, "header is not valid JSON");
    BAD("{\"a\":", 0, "header is not valid JSON");
    BAD("[1,2]", 0, "header is an array, not a JSON object");
    BAD("\"x\"", 0, "header is a string, not a JSON object");
    BAD("{" T("a", "U8", "[1]", 0, 1) "," T("a", "U8", "[1]", 1, 2) "}", 2, "duplicate key in header");
    BAD("{" T("a\\u0000b", "U8", "[1]", 0, 1) "}", 1, "NUL character (\\u0000)");
    BAD("{\"__metadata__\":{\"k\":\"v\\u0000\"}}", 0, "NUL character (\\u0000)");
    BAD("{}\0\0\0", 0, "a raw NUL byte (0x00) at byte offset 10");
    BAD("{\"\xff\":1}", 0, "an invalid UTF-8 lead byte (0xff)");
    BAD("{\"\x80\":1}", 0, "a stray UTF-8 continuation byte (0x80)");
    BAD("{\"\xc0\x80\":1}", 0, "an overlong UTF-8 sequence (0xc0) at byte offset 10");
    BAD("{\"\xe0\x80\xaf\":1}", 0, "an overlong UTF-8 sequence (0xe0)");
    BAD("{\"\xed\xa0\x80\":1}", 0, "a UTF-16 surrogate encoded in UTF-8");
    BAD("{\"\xf4\x90\x80\x80\":1}", 0, "a code point above U+10FFFF");
    BAD("{\"\xe2\x82\":1}", 0, "a truncated UTF-8 sequence");
    BAD("{\"ab\xe2\x82", 0, "a truncated UTF-8 sequence");
    BAD("{\"\\ud800\":1}", 0, "header is not valid JSON: invalid \\u escape: high surrogate \\uD800 without a low one");
    BAD("{\"\\udc00x\":1}", 0, "header is not valid JSON: invalid \\u escape: lone low surrogate \\uDC00");
    BAD("{\"\\u12\":1}", 0, "header is not valid JSON: invalid \\u escape");
    BAD("{\"\\x\":1}", 0, "header is not valid JSON: invalid escape '\\x'");
    BAD("{\"a\tb\":1}", 0, "header is not valid JSON: control character 0x09 in a string");
    BAD("{\"a\":01}", 0, "header is not valid JSON: expected ',' or '}', found '1'");
    BAD("{\"a\":1,}", 0, "header is not valid JSON: expected a string key, found '}'");
    BAD("{\"a\" 1}", 0, "header is not valid JSON: expected ':', found '1'");
    BAD("{\"a\":[1 2]}", 0, "header is not valid JSON: expected ',' or ']', found '2'");
    BAD("{\"a\":tru}", 0, "header is not valid JSON: unexpected 't'");
    BAD("{} {}", 0, "header is not valid JSON: unexpected '{' after the JSON value");
    BAD("{\"a\":-}", 0, "header is not valid JSON: invalid number");
    BAD("{\"a\":1e999}", 0, "number out of range in header: real number overflow");
    BAD("{\"a\":\"x", 0, "header is not valid JSON: unterminated string");
    BAD("{\"a\\u0061\":1,\"aa\":2}", 0, "duplicate key in header: duplicate key 'aa'");
    BAD("{" T("a", "U8", "[99999999999999999999]", 0, 1) "}", 1, "number out of range in header");
}

static void test_entries(void)
{
    BAD("{\"__metadata__\":{\"n\":1}}", 0, "__metadata__ value of key 'n' is an integer, not a string");
    BAD("{\"__metadata__\":[\"a\"]}", 0, "__metadata__ is an array, not an object of strings");
    BAD("{\"__metadata__\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
        "'__metadata__' is a reserved name and cannot be a tensor");
    BAD("{" T("", "U8", "[1]", 0, 1) "}", 1, "empty tensor name");
    BAD("{\"a\":5}", 0, "tensor 'a': entry is not a JSON object");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, "tensor 'a': missing field 'data_offsets'");
    BAD("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "tensor 'a': missing field 'dtype'");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"foo\":1}}", 1,
        "tensor 'a': unexpected field 'foo'");
    BAD("{" T("a", "F7", "[1]", 0, 1) "}", 1, "tensor 'a': unknown dtype 'F7'");
    BAD("{" T("a", "bf16", "[1]", 0, 2) "}", 2, "unknown dtype 'bf16'");
    BAD("{\"a\":{\"dtype\":16,\"shape\":[1],\"data_offsets\":[0,2]}}", 2, "tensor 'a': dtype is not a string");
    BAD("{" T("a", "U8", "{}", 0, 1) "}", 1, "tensor 'a': shape is not an array");
    BAD("{" T("a", "U8", "[-1]", 0, 1) "}", 1, "tensor 'a': shape[0] is negative (-1)");
    BAD("{" T("a", "U8", "[1, 2.0]", 0, 2) "}", 2, "tensor 'a': shape[1] is not an integer");
    BAD("{" T("a", "U8", "[\"1\"]", 0, 1) "}", 1, "tensor 'a': shape[0] is not an integer");
    BAD("{" T("a", "U8", "[281474976710656]", 0, 1) "}", 1, "shape[0] = 281474976710656 is larger than 2^48-1");
    BAD("{" T("a", "U8", "[1,1,1,1,1,1,1,1,1]", 0, 1) "}", 1, "tensor 'a': rank 9 exceeds the limit of 8");
    BAD("{" T("a", "U8", "[140737488355328,140737488355328]", 0, 1) "}", 1,
        "element count of shape [140737488355328, 140737488355328] overflows 64 bits");
    BAD("{" T("a", "F64", "[1099511627776,2097152]", 0, 1) "}", 1, "size of shape [1099511627776, 2097152] x F64 overflows");
    BAD("{" T("a", "F4", "[3]", 0, 1) "}", 1, "shape [3] x F4 is 12 bits, not a whole number of bytes");
    BAD("{" T("a", "F6_E2M3", "[5]", 0, 4) "}", 4, "shape [5] x F6_E2M3 is 30 bits");
    BAD("{" T("a", "BF16", "[3]", 0, 4) "}", 4, "data_offsets [0, 4) hold 4 bytes but shape [3] x BF16 needs 6 bytes");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, "data_offsets is not an array of 2 integers");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":\"0,1\"}}", 1, "data_offsets is not an array of 2 integers");
    BAD("{" T("a", "U8", "[1]", -1, 0) "}", 1, "tensor 'a': data_offsets[0] is negative (-1)");
    BAD("{" T("a", "U8", "[1]", 0, 1.5) "}", 1, "tensor 'a': data_offsets[1] is not an integer");
    BAD("{" T("a", "U8", "[0]", 281474976710656, 281474976710656) "}", 0, "data_offsets[0] = 281474976710656 is larger than 2^48-1");
    BAD("{" T("a", "U8", "[1]", 4, 0) "}", 4, "data_offsets [4, 0) end before they begin");
    /* a name with control bytes is escaped in the message */
    BAD("{" T("x\\u001b[31m", "U8", "[1]", 0, 2) "}", 2, "tensor 'x\\x1b[31m'");
}

static void test_extents(void)
{
    BAD("{" T("a", "U8", "[4]", 4, 8) "}", 8, "tensor 'a': data begins at offset 4, not 0");
    BAD("{" T("a", "U8", "[4]", 0, 4) "," T("b", "U8", "[4]", 8, 12) "}", 12,
        "gap of 4 bytes between tensor 'a' (ends at data offset 4) and tensor 'b' (begins at 8");
    BAD("{" T("a", "U8", "[4]", 0, 4) "," T("b", "U8", "[4]", 2, 6) "}", 6, "tensor 'b' [2, 6) overlaps tensor 'a'");
    BAD("{" T("a", "U8", "[8]", 0, 8) "," T("b", "U8", "[0]", 4, 4) "}", 8, "tensor 'b' [4, 4) overlaps tensor 'a'");
    BAD("{" T("a", "U8", "[4]", 0, 4) "," T("b", "U8", "[4]", 0, 4) "}", 4,
        "tensors 'a' and 'b' share the byte range [0, 4)");
    BAD("{" T("a", "U8", "[4]", 0, 4) "}", 5, "1 trailing bytes after the last tensor: data ends at file offset");
    BAD("{" T("a", "U8", "[4]", 0, 4) "}", 3, "data is truncated: tensor 'a' ends at file offset");
    BAD("{}", 1, "1 trailing bytes after the last tensor");
    /* duplicate tensor names never reach the extent check */
    BAD("{" T("a", "U8", "[4]", 0, 4) "," T("a", "U8", "[4]", 0, 4) "}", 4, "duplicate key");
}

static void test_good(void)
{
    k3_st_ckpt c;
    GOOD("{}", 0, &c);
    CHECK_EQ_U64(c.n_tensors, 0);
    CHECK_EQ_U64(c.n_files, 1);
    CHECK(k3_st_find(&c, "a") == NULL);
    k3_st_close(&c);

    GOOD("{\"__metadata__\":{}}", 0, &c);
    CHECK_EQ_U64(c.n_tensors, 0);
    CHECK_EQ_U64(c.files[0].n_meta, 0);
    k3_st_close(&c);

    /* leading and trailing whitespace (page-padded writers) */
    GOOD("  \n{\"__metadata__\":{\"format\":\"pt\"}," T("s", "F32", "[]", 0, 4) "}        \t\n", 4, &c);
    CHECK_EQ_U64(c.n_tensors, 1);
    CHECK_EQ_U64(c.tensors[0].rank, 0);
    CHECK_EQ_U64(c.tensors[0].numel, 1);
    CHECK_EQ_U64(c.tensors[0].nbytes, 4);
    CHECK_EQ_U64(c.files[0].n_meta, 1);
    CHECK_STR(c.files[0].meta[0].key, "format");
    CHECK_STR(c.files[0].meta[0].value, "pt");
    k3_st_close(&c);

    /* zero-size tensors (several at one offset), unaligned offsets, F4 pairs */
    static const char h[] = "{" T("z2", "F32", "[0,5]", 3, 3) "," T("b", "BF16", "[2]", 3, 7) ","
                            T("u", "U8", "[3]", 0, 3) "," T("z1", "F32", "[5,0]", 3, 3) ","
                            T("f4", "F4", "[4]", 7, 9) "," T("e", "F64", "[0]", 9, 9) "}";
    GOOD(h, 9, &c);
    REQUIRE(c.n_tensors == 6);
    static const char *const order[6] = {"u", "z1", "z2", "b", "f4", "e"};
    uint64_t data = 8 + (sizeof h - 1);
    static const uint64_t begin[6] = {0, 3, 3, 3, 7, 9};
    for (int i = 0; i < 6; i++) {
        CHECK_STR(c.tensors[i].name, order[i]);
        CHECK_EQ_U64(c.tensors[i].offset, data + begin[i]);
    }
    const k3_st_tensor *b = k3_st_find(&c, "b");
    REQUIRE(b);
    CHECK_EQ_U64(b->dtype, K3_DT_BF16);
    CHECK_EQ_U64(b->offset % 2, (data + 3) % 2);
    CHECK_EQ_U64(k3_st_find(&c, "f4")->numel, 4);
    CHECK_EQ_U64(k3_st_find(&c, "f4")->nbytes, 2);
    CHECK_EQ_U64(c.total_bytes, 9);
    CHECK(k3_st_find(&c, "zz") == NULL);
    k3_st_close(&c);

    /* escaped and non-ASCII names round-trip */
    GOOD("{" T("caf\xc3\xa9.\\u00e9\\ud83d\\ude00", "U8", "[1]", 0, 1) "}", 1, &c);
    CHECK(k3_st_find(&c, "caf\xc3\xa9.\xc3\xa9\xf0\x9f\x98\x80") != NULL);
    k3_st_close(&c);
}

static void test_dtypes(void)
{
    static const struct { const char *s; unsigned bits; } all[] = {
        {"BOOL", 8}, {"U8", 8}, {"I8", 8}, {"F4", 4}, {"F6_E2M3", 6}, {"F6_E3M2", 6},
        {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8},
        {"I16", 16}, {"U16", 16}, {"F16", 16}, {"BF16", 16}, {"I32", 32}, {"U32", 32},
        {"F32", 32}, {"I64", 64}, {"U64", 64}, {"F64", 64}, {"C64", 64}};
    CHECK_EQ_U64(sizeof all / sizeof all[0], K3_DT__COUNT);
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        k3_dtype dt;
        REQUIRE(k3_dtype_parse(all[i].s, strlen(all[i].s), &dt) == 0);
        CHECK_EQ_U64(k3_dtype_bits(dt), all[i].bits);
        CHECK_STR(k3_dtype_name(dt), all[i].s);
    }
    k3_dtype dt;
    CHECK(k3_dtype_parse("F8", 2, &dt) != 0);
    CHECK(k3_dtype_parse("BF16 ", 5, &dt) != 0);
    /* each dtype in a real file: 8 elements */
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        char hdr[256];
        unsigned nb = all[i].bits;          /* 8 elements x bits / 8 */
        int n = snprintf(hdr, sizeof hdr, "{\"t\":{\"dtype\":\"%s\",\"shape\":[2,4],\"data_offsets\":[0,%u]}}",
                         all[i].s, nb);
        k3_st_ckpt c;
        open_good(__LINE__, hdr, (size_t)n, nb, &c);
        CHECK_EQ_U64(c.tensors[0].nbytes, nb);
        k3_st_close(&c);
    }
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "%s/test_safetensors", k3_test_tmpdir());
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", g_dir, g_dir);
    REQUIRE(system(cmd) == 0);
    test_prefix();
    test_json();
    test_entries();
    test_extents();
    test_good();
    test_dtypes();
    return k3_test_done();
}

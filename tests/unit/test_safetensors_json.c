/*
 * test_safetensors_json.c - k3_json, the parser under the safetensors reader:
 * tokens and iteration, decoding, limits, error kinds and offsets, and a
 * differential run against jansson over hand-made documents and thousands of
 * deterministic mutations of them.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../fuzz/json_diff.h"
#include "k3_json.h"
#include "k3_test.h"

static void test_tokens(void)
{
    static const char s[] = " {\"a\": [1, -2, 3.5e1, true, false, null], \"b\\n\\u00e9\\ud83d\\ude00\": \"x\\\"y\","
                            " \"c\": {}, \"d\": [], \"e\": {\"f\": \"\"}} ";
    k3j_doc d;
    k3j_error e;
    REQUIRE(k3j_parse(s, sizeof s - 1, &d, &e) == 0);
    CHECK_EQ_U64(d.t[0].type, K3J_OBJ);
    CHECK_EQ_U64(d.t[0].size, 5);
    CHECK_EQ_U64(d.t[0].off, 1);
    CHECK_EQ_U64(d.t[0].next, d.n);
    uint32_t a = k3j_get(&d, 0, "a", 1);
    REQUIRE(a && d.t[a].type == K3J_ARR && d.t[a].size == 6);
    int64_t want_i[2] = {1, -2};
    uint32_t el = k3j_first(&d, a);
    for (int k = 0; k < 2; k++, el = k3j_next(&d, a, el)) {
        CHECK_EQ_U64(d.t[el].type, K3J_INT);
        CHECK(d.t[el].v.i == want_i[k]);
    }
    CHECK(d.t[el].type == K3J_REAL && d.t[el].v.d == 35.0);
    el = k3j_next(&d, a, el);
    CHECK(d.t[el].type == K3J_TRUE);
    el = k3j_next(&d, a, el);
    CHECK(d.t[el].type == K3J_FALSE);
    el = k3j_next(&d, a, el);
    CHECK(d.t[el].type == K3J_NULL);
    CHECK(k3j_next(&d, a, el) == 0);
    uint32_t b = k3j_get(&d, 0, "b\n\xc3\xa9\xf0\x9f\x98\x80", 8);
    REQUIRE(b);
    CHECK(d.t[b].size == 3 && memcmp(d.t[b].v.s, "x\"y", 3) == 0);
    uint32_t c = k3j_get(&d, 0, "c", 1);
    CHECK(c && d.t[c].type == K3J_OBJ && d.t[c].size == 0 && k3j_first(&d, c) == 0);
    uint32_t ee = k3j_get(&d, 0, "e", 1);
    REQUIRE(ee);
    uint32_t f = k3j_get(&d, ee, "f", 1);
    CHECK(f && d.t[f].type == K3J_STR && d.t[f].size == 0);
    CHECK(k3j_get(&d, 0, "z", 1) == 0);
    CHECK(k3j_get(&d, a, "a", 1) == 0);           /* not an object */
    unsigned members = 0;
    for (uint32_t k = k3j_first(&d, 0); k; k = k3j_next(&d, 0, k)) members++;
    CHECK_EQ_U64(members, 5);
    k3j_free(&d);

    /* scalars at the top level, integer limits */
    REQUIRE(k3j_parse("-9223372036854775808", 20, &d, &e) == 0);
    CHECK(d.t[0].type == K3J_INT && d.t[0].v.i == INT64_MIN);
    k3j_free(&d);
    REQUIRE(k3j_parse("9223372036854775807", 19, &d, &e) == 0);
    CHECK(d.t[0].v.i == INT64_MAX);
    k3j_free(&d);
    CHECK(k3j_parse("9223372036854775808", 19, &d, &e) == -1 && e.kind == K3J_E_RANGE);
    CHECK(k3j_parse("-9223372036854775809", 20, &d, &e) == -1 && e.kind == K3J_E_RANGE);
}

static void expect_error(int line, const char *s, size_t n, int kind, uint64_t off, const char *text)
{
    k3j_doc d;
    k3j_error e;
    int r = k3j_parse(s, n, &d, &e);
    CHECK_MSG(r == -1, "line %d: accepted", line);
    if (r) {
        CHECK_MSG(e.kind == kind, "line %d: kind %d, expected %d (%s)", line, e.kind, kind, e.text);
        CHECK_MSG(e.off == off, "line %d: offset %llu, expected %llu (%s)", line, (unsigned long long)e.off,
                  (unsigned long long)off, e.text);
        CHECK_MSG(strstr(e.text, text) != NULL, "line %d: '%s' lacks '%s'", line, e.text, text);
    } else {
        k3j_free(&d);
    }
}
#define ERR(s, kind, off, text) expect_error(__LINE__, s, sizeof(s) - 1, kind, off, text)

static void test_errors(void)
{
    ERR("", K3J_E_SYNTAX, 0, "unexpected end of input");
    ERR("   ", K3J_E_SYNTAX, 3, "unexpected end of input");
    ERR("{\"a\":1,\"a\":2}", K3J_E_DUPLICATE, 7, "duplicate key 'a'");
    ERR("{\"a\":{\"x\":1,\"x\":1}}", K3J_E_DUPLICATE, 12, "duplicate key 'x'");
    ERR("{\"\\u0061\":1,\"a\":2}", K3J_E_DUPLICATE, 12, "duplicate key 'a'");
    ERR("[\"a\\u0000\"]", K3J_E_NUL, 3, "NUL character");
    ERR("[\"a\0\"]", K3J_E_NUL, 3, "control character 0x00");
    ERR("[\"\xc0\xaf\"]", K3J_E_UTF8, 2, "invalid UTF-8 byte 0xc0");
    ERR("[\xc3\xa9]", K3J_E_SYNTAX, 1, "unexpected '\\xc3'");
    ERR("[1]]", K3J_E_SYNTAX, 3, "unexpected ']' after the JSON value");
    ERR("[1,]", K3J_E_SYNTAX, 3, "unexpected ']'");
    ERR("{\"a\"}", K3J_E_SYNTAX, 4, "expected ':', found '}'");
    ERR("{1:2}", K3J_E_SYNTAX, 1, "expected a string key, found '1'");
    ERR("[01]", K3J_E_SYNTAX, 2, "expected ',' or ']', found '1'");
    ERR("[1.]", K3J_E_SYNTAX, 1, "invalid number");
    ERR("[1e]", K3J_E_SYNTAX, 1, "invalid number");
    ERR("[.5]", K3J_E_SYNTAX, 1, "unexpected '.'");
    ERR("[+1]", K3J_E_SYNTAX, 1, "unexpected '+'");
    ERR("[1e400]", K3J_E_RANGE, 1, "real number overflow");
    ERR("[nul]", K3J_E_SYNTAX, 1, "unexpected 'n'");
    ERR("[\"\\ud800\\u0041\"]", K3J_E_SYNTAX, 2, "high surrogate");
    ERR("[\"\\udfff\"]", K3J_E_SYNTAX, 2, "lone low surrogate");
    ERR("[\"\\u00G0\"]", K3J_E_SYNTAX, 2, "invalid \\u escape");
    ERR("[\"abc", K3J_E_SYNTAX, 1, "unterminated string");
    ERR("[\"abc\\", K3J_E_SYNTAX, 1, "unterminated string");

    /* nesting: 2048 levels are fine, 2049 are not (as in jansson) */
    char deep[2 * 2049];
    memset(deep, '[', 2049);
    memset(deep + 2049, ']', 2049);
    k3j_doc d;
    k3j_error e;
    CHECK(k3j_parse(deep + 1, 2 * 2048, &d, &e) == 0);
    k3j_free(&d);
    CHECK(k3j_parse(deep, sizeof deep, &d, &e) == -1 && e.kind == K3J_E_DEPTH && e.off == 2048);

    /* a large object takes the hash path of the duplicate check */
    size_t cap = 40 * 1000 + 64, n = 0;
    char *big = malloc(cap);
    REQUIRE(big);
    n += (size_t)snprintf(big + n, cap - n, "{");
    for (int i = 0; i < 1000; i++) n += (size_t)snprintf(big + n, cap - n, "%s\"k%d\":%d", i ? "," : "", i, i);
    n += (size_t)snprintf(big + n, cap - n, "}");
    REQUIRE(k3j_parse(big, n, &d, &e) == 0);
    CHECK_EQ_U64(d.t[0].size, 1000);
    uint32_t v = k3j_get(&d, 0, "k777", 4);
    CHECK(v && d.t[v].v.i == 777);
    k3j_free(&d);
    n -= 1;
    n += (size_t)snprintf(big + n, cap - n, ",\"k500\":1}");
    CHECK(k3j_parse(big, n, &d, &e) == -1 && e.kind == K3J_E_DUPLICATE && strstr(e.text, "'k500'"));
    free(big);
}

/* ------------------------------------------------------------------------- */
/* differential: k3_json against jansson                                       */

static const char *const seeds[] = {
    "{\"__metadata__\":{\"format\":\"pt\"},\"a.weight\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}}",
    "{\"metadata\":{\"total_size\":15},\"weight_map\":{\"a\":\"m-1.safetensors\",\"b\":\"m-2.safetensors\"}}",
    "[1, -0, 0.5, 1e3, -1.25E-2, 123456789012345678, true, false, null, \"\\\"\\\\\\/\\b\\f\\n\\r\\t\"]",
    "{\"\\u00e9\\ud834\\udd1e\": {\"\": [[], {}, [[[]]]]}, \"caf\xc3\xa9\": \"\xe2\x82\xac\xf0\x9f\x98\x80\"}",
    "  \"just a string\"  ",
    "-12345",
    "{\"a\":{\"a\":{\"a\":{\"b\":1,\"c\":[1,2,{\"d\":null}]}}}}",
};

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void test_differential(void)
{
    static const char *const pieces[] = {"\"", "\\", "\\u0000", "\\ud800", "\\udc00", ",", ":", "{", "}",
                                         "[", "]", "\xff", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                                         "\t", "\x01", "\x7f", "1e999", "-", "0", "00", "9223372036854775808",
                                         " ", "\"a\":1,", "true", "nul", "\0"};
    char why[512];
    unsigned diffs = 0, runs = 0;
    for (size_t s = 0; s < sizeof seeds / sizeof seeds[0]; s++) {
        size_t sl = strlen(seeds[s]);
        if (k3_json_diff((const uint8_t *)seeds[s], sl, why, sizeof why)) {
            fprintf(stderr, "seed %zu: %s\n", s, why);
            diffs++;
        }
        for (int it = 0; it < 3000; it++) {
            uint8_t buf[512];
            size_t n = sl;
            memcpy(buf, seeds[s], sl);
            int edits = 1 + (int)(next_rand() % 3);
            for (int k = 0; k < edits && n > 0; k++) {
                size_t at = (size_t)(next_rand() % n);
                switch (next_rand() % 4) {
                case 0: buf[at] = (uint8_t)next_rand(); break;                    /* flip a byte */
                case 1: memmove(buf + at, buf + at + 1, n - at - 1); n--; break;  /* delete */
                default: {                                                        /* insert a piece */
                    const char *pc = pieces[next_rand() % (sizeof pieces / sizeof pieces[0])];
                    size_t pl = pc[0] ? strlen(pc) : 1;
                    if (n + pl > sizeof buf) break;
                    memmove(buf + at + pl, buf + at, n - at);
                    memcpy(buf + at, pc, pl);
                    n += pl;
                }
                }
            }
            runs++;
            if (k3_json_diff(buf, n, why, sizeof why)) {
                if (diffs++ < 10) fprintf(stderr, "mutation of seed %zu: %s: '%.*s'\n", s, why, (int)n, buf);
            }
        }
    }
    CHECK_MSG(diffs == 0, "%u of %u documents parsed differently", diffs, runs);
}

/* The cap on values: a document of exactly K3J_MAX_VALUES parses, one more is refused (the
   hostile-header case: "0," costs a 24-byte token per 2 bytes of input). */
static void test_value_cap(void)
{
    for (uint32_t extra = 0; extra < 2; extra++) {
        size_t nv = K3J_MAX_VALUES + extra, len = 2 * (nv - 1) + 1;   /* "[" + (nv - 1) x "0," - "," + "]" */
        char *buf = malloc(len);
        CHECK(buf != NULL);
        if (!buf) return;
        buf[0] = '[';
        for (size_t i = 1; i + 1 < len; i += 2) { buf[i] = '0'; buf[i + 1] = ','; }
        buf[len - 1] = ']';
        k3j_doc doc;
        k3j_error err;
        int rc = k3j_parse(buf, len, &doc, &err);
        if (!extra) {
            CHECK_MSG(rc == 0 && doc.n == K3J_MAX_VALUES, "%zu values: rc %d (%s)", nv, rc, err.text);
            if (rc == 0) k3j_free(&doc);
        } else {
            CHECK_MSG(rc != 0 && err.kind == K3J_E_RANGE && strstr(err.text, "JSON values (the cap"),
                      "%zu values: rc %d kind %d (%s)", nv, rc, rc ? err.kind : 0, rc ? err.text : "");
        }
        free(buf);
    }
}

int main(void)
{
    test_value_cap();
    test_tokens();
    test_errors();
    test_differential();
    return k3_test_done();
}

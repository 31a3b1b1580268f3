/*
 * test_tokenizer.c - unit test of k3run's tokenizer loader and encoder:
 *   - bad tiktoken.model files: each refused with K3_ERR_FORMAT and a message
 *     naming the file and the line
 *   - bad tokenizer_config.json files (ids colliding with ranks, out of range,
 *     bad entries, duplicate names, bad JSON)
 *   - K3's released tokenizer_config.json ($K3_TOK_DATA) with a synthetic
 *     163 584-rank vocabulary: 163 840 ids, the named and reserved specials
 *   - known answers on the test vocabulary ($K3_TOK_VOCAB), decode(encode(x))
 *     == x on random bytes, long pieces, concurrent encodes from 4 threads
 * Runs under ASan with leak detection in the sanitizer build.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../unit/k3_test.h"
#include "tokenizer.h"

static char g_dir[4096];      /* scratch directory of this test */

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

static void b64(const uint8_t *s, size_t n, char *out)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) |
                     (i + 2 < n ? s[i + 2] : 0);
        out[o++] = a[v >> 18 & 63];
        out[o++] = a[v >> 12 & 63];
        out[o++] = i + 1 < n ? a[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? a[v & 63] : '=';
    }
    out[o] = '\0';
}

static const char *write_file(const char *name, const char *text)
{
    static char path[8192];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    fputs(text, f);
    REQUIRE(fclose(f) == 0);
    return path;
}

/* The 256 bytes, then "ab" 256 and "abc" 257, then extra (lines of text). */
static char *small_vocab(const char *extra)
{
    size_t cap = 256 * 16 + 64 + strlen(extra);
    char *s = malloc(cap), line[64];
    REQUIRE(s);
    s[0] = '\0';
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        b64(&c, 1, line);
        sprintf(s + strlen(s), "%s %d\n", line, b);
    }
    strcat(s, "YWI= 256\n");
    if (*extra != '+') strcat(s, "YWJj 257\n");
    strcat(s, extra + (*extra == '+'));
    return s;
}

/* Load a vocabulary text (and a config text, or none); check the error. */
static void expect_load(const char *vocab, const char *config, k3_err want, const char *needle)
{
    const char *vp = write_file("tiktoken.model", vocab);
    char vpath[8192];
    snprintf(vpath, sizeof vpath, "%s", vp);
    const char *cp = config ? write_file("tokenizer_config.json", config) : NULL;
    k3_diag d = {0};
    k3_tok *t = NULL;
    k3_err e = k3_tok_load(vpath, cp, &t, &d);
    CHECK_MSG(e == want, "got %d (%s), want %d for '%s'", (int)e, d.msg, (int)want, needle);
    if (needle) CHECK_MSG(strstr(d.msg, needle) != NULL, "'%s' not in '%s'", needle, d.msg);
    if (want) {
        CHECK(t == NULL);
        CHECK_MSG(strstr(d.msg, g_dir) != NULL, "message does not name the file: %s", d.msg);
    }
    k3_tok_free(t);
}

static void test_bad_vocab(void)
{
    struct { const char *extra; const char *needle; } bad[] = {
        {"+Y*Jj 257\n", "line 258: bad base64: a character outside"},
        {"+YWJ 257\n", "line 258: bad base64: length is not a multiple of 4"},
        {"+YWI=YWI= 257\n", "line 258: bad base64: '=' before the end"},
        {"+YR== 257\n", "line 258: bad base64: nonzero padding bits"},
        {"+YWJj 256\n", "line 258: duplicate rank 256 (first on line 257)"},
        {"+YWJj 258\n", "line 258: rank 258 is not below the number of tokens 258"},
        {"YWI= 258\n", "line 259: duplicate token (the same bytes as line 257)"},
        {"+YWJj x1\n", "line 258: bad rank 'x1'"},
        {"+YWJj -1\n", "line 258: bad rank '-1'"},
        {"+YWJj 257 1\n", "line 258: expected 'base64 rank'"},
        {"+YWJj  257\n", "line 258: expected 'base64 rank'"},
        {"+YWJj\n", "line 258: expected 'base64 rank'"},
        {"+ 257\n", "line 258: empty token"},
        {"+YWJj 12345678901\n", "line 258: bad rank"},
        {"+\n\nYWJj 257\nYWJj 258\n", "line 261: duplicate token (the same bytes as line 260)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *v = small_vocab(bad[i].extra);
        expect_load(v, NULL, K3_ERR_FORMAT, bad[i].needle);
        free(v);
    }
    /* a missing single byte (0x41 replaced by a multi-byte token) */
    char *v = small_vocab("");
    char *p = strstr(v, "QQ== 65\n");
    REQUIRE(p);
    memcpy(p, "eHl6", 4);
    expect_load(v, NULL, K3_ERR_FORMAT, "single byte 0x41 is not a token");
    free(v);
    expect_load("", NULL, K3_ERR_FORMAT, "0 tokens");
    expect_load("\n\r\n", NULL, K3_ERR_FORMAT, "0 tokens");
    k3_diag d = {0};
    k3_tok *t;
    CHECK(k3_tok_load("/nonexistent/tiktoken.model", NULL, &t, &d) == K3_ERR_NOT_FOUND);
    CHECK(strstr(d.msg, "/nonexistent/tiktoken.model") != NULL);
    CHECK(k3_tok_load_dir("/nonexistent", &t, &d) == K3_ERR_NOT_FOUND);
    /* CRLF and CR line ends and blank lines are fine (as bytes.splitlines()) */
    v = small_vocab("\n\n");
    char *crlf = malloc(2 * strlen(v) + 1);     /* [2 * len + 1] v with \r\n or \r line ends */
    REQUIRE(crlf);
    size_t o = 0, lines = 0;
    for (const char *q = v; *q; q++) {
        if (*q == '\n' && lines++ % 2) crlf[o++] = '\r';
        else if (*q == '\n') { crlf[o++] = '\r'; crlf[o++] = '\n'; }
        else crlf[o++] = *q;
    }
    crlf[o] = '\0';
    expect_load(crlf, NULL, K3_OK, NULL);
    free(crlf);
    free(v);
}

static void test_bad_config(void)
{
    char *v = small_vocab("");
    static const char *const ok_entry = "{\"content\": \"<x>\", \"special\": false}";
    char cfg[1024];
    struct { const char *json; const char *needle; } bad[] = {
        {"{", "tokenizer_config.json': line 1: "},
        {"[]", "not a JSON object"},
        {"{\"a\": 1, \"a\": 2}", "duplicate"},
        {"{\"added_tokens_decoder\": []}", "added_tokens_decoder is not an object"},
        {"{\"added_tokens_decoder\": {\"abc\": %s}}", "key 'abc' is not a decimal id"},
        {"{\"added_tokens_decoder\": {\"0258\": %s}}", "key '0258' is not a decimal id"},
        {"{\"added_tokens_decoder\": {\"100\": %s}}", "id 100 collides with a BPE rank"},
        {"{\"added_tokens_decoder\": {\"514\": %s}}", "id 514 is outside the special range 258..513"},
        {"{\"added_tokens_decoder\": {\"300\": {\"special\": true}}}", "'content' is not"},
        {"{\"added_tokens_decoder\": {\"300\": {\"content\": 7}}}", "'content' is not"},
        {"{\"added_tokens_decoder\": {\"300\": {\"content\": \"\"}}}", "'content' is not"},
        {"{\"added_tokens_decoder\": {\"300\": {\"content\": \"<x>\", \"special\": 1}}}",
         "'special' is not a boolean"},
        {"{\"added_tokens_decoder\": {\"300\": %s, \"301\": %s}}", "'<x>' names ids 300 and 301"},
        {"{\"added_tokens_decoder\": {\"259\": {\"content\": \"<|reserved_token_300|>\"}}}",
         "'<|reserved_token_300|>' names ids 259 and 300"},
        {"{\"added_tokens_decoder\": {\"300\": {\"content\": \"a\\u0000b\"}}}", "line 1"},
        {"{\"x\": 1e999}", "line 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cfg, sizeof cfg, bad[i].json, ok_entry, ok_entry);
        expect_load(v, cfg, K3_ERR_FORMAT, bad[i].needle);
    }
    /* accepted: no added_tokens_decoder; an integer beyond 64 bits; "special": false */
    expect_load(v, "{}", K3_OK, NULL);
    snprintf(cfg, sizeof cfg, "{\"model_max_length\": 1000000000000000019884624838656, "
             "\"added_tokens_decoder\": {\"300\": %s}}", ok_entry);
    expect_load(v, cfg, K3_OK, NULL);
    const char *vp = write_file("tiktoken.model", v);
    char vpath[8192];
    snprintf(vpath, sizeof vpath, "%s", vp);
    const char *cp = write_file("tokenizer_config.json", cfg);
    k3_diag d = {0};
    k3_tok *t;
    REQUIRE(k3_tok_load(vpath, cp, &t, &d) == K3_OK);
    CHECK(k3_tok_special_id(t, "<x>") == 300);
    CHECK(k3_tok_special_id(t, "<|reserved_token_301|>") == 301);
    CHECK(k3_tok_special_id(t, "<|reserved_token_300|>") == -1);
    k3_tok_free(t);
    free(v);
}

/* K3's vocabulary size: 256 bytes, all 65 536 byte pairs, then byte triples. */
static void write_big_vocab(const char *path)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    char line[32];
    uint32_t r = 0;
    for (int b = 0; b < 256; b++, r++) {
        uint8_t c = (uint8_t)b;
        b64(&c, 1, line);
        fprintf(f, "%s %u\n", line, r);
    }
    for (int p = 0; p < 65536; p++, r++) {
        uint8_t c[2] = {(uint8_t)(p >> 8), (uint8_t)p};
        b64(c, 2, line);
        fprintf(f, "%s %u\n", line, r);
    }
    for (uint32_t q = 0; r < 163584; q++, r++) {
        uint8_t c[3] = {(uint8_t)(q >> 16), (uint8_t)(q >> 8), (uint8_t)q};
        b64(c, 3, line);
        fprintf(f, "%s %u\n", line, r);
    }
    REQUIRE(fclose(f) == 0);
}

static int has_id_at_least(const int32_t *ids, size_t n, int32_t lo)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= lo) return 1;
    return 0;
}

static void round_trip(const k3_tok *t, const uint8_t *s, size_t n, int special)
{
    int32_t *ids = NULL;
    size_t m = 0, cap = 0, bl;
    k3_diag d = {0};
    REQUIRE(k3_tok_encode(t, (const char *)s, n, special, &ids, &m, &cap, &d) == K3_OK);
    uint8_t *back = malloc(n + 1);     /* [n + 1] decoded bytes */
    size_t o = 0;
    int ok = 1;
    for (size_t i = 0; i < m && ok; i++) {
        const uint8_t *b = k3_tok_bytes(t, ids[i], &bl);
        ok = b && o + bl <= n;
        if (ok) memcpy(back + o, b, bl);
        o += bl;
    }
    CHECK_MSG(ok && o == n && !memcmp(back, s, n), "round trip of %zu bytes", n);
    free(back);
    free(ids);
}

static void test_released_config(void)
{
    char vpath[8192], cpath[8192];
    snprintf(vpath, sizeof vpath, "%s/big.model", g_dir);
    snprintf(cpath, sizeof cpath, "%s/kimi-k3-tokenizer_config.json",
             env_or("K3_TOK_DATA", "tests/tokenizer/data"));
    write_big_vocab(vpath);
    k3_diag d = {0};
    k3_tok *t;
    k3_err e = k3_tok_load(vpath, cpath, &t, &d);
    if (e) fprintf(stderr, "%s\n", d.msg);
    REQUIRE(e == K3_OK);
    CHECK_EQ_U64(k3_tok_n_ranks(t), 163584);
    CHECK_EQ_U64(k3_tok_n_ids(t), 163840);
    static const struct { int32_t id; const char *name; } named[] = {
        {163584, "[BOS]"}, {163585, "[EOS]"}, {163586, "<|end_of_msg|>"}, {163587, "<|open|>"},
        {163588, "<|close|>"}, {163589, "<|sep|>"}, {163590, "[start_header_id]"},
        {163591, "[end_header_id]"}, {163592, "<|reserved_token_163592|>"}, {163593, "[EOT]"},
        {163602, "<|media_begin|>"}, {163605, "<|media_pad|>"}, {163649, "<osagent_mode>"},
        {163838, "[UNK]"}, {163839, "[PAD]"}, {163650, "<|reserved_token_163650|>"},
    };
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        size_t n;
        const uint8_t *b = k3_tok_bytes(t, named[i].id, &n);
        CHECK(b && n == strlen(named[i].name) && !memcmp(b, named[i].name, n));
        CHECK(k3_tok_special_id(t, named[i].name) == named[i].id);
        CHECK(k3_tok_is_special(t, named[i].id));
    }
    CHECK(!k3_tok_is_special(t, 163583));
    CHECK(!k3_tok_is_special(t, 163840));
    CHECK(k3_tok_bytes(t, 163840, NULL) == NULL);
    CHECK(k3_tok_bytes(t, -1, NULL) == NULL);
    const char *chat = "<|open|>message role=\"user\"<|sep|>hi<|close|><|end_of_msg|>";
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    REQUIRE(k3_tok_encode(t, chat, strlen(chat), 1, &ids, &n, &cap, &d) == K3_OK);
    REQUIRE(n >= 4);
    CHECK(ids[0] == 163587 && ids[n - 2] == 163588 && ids[n - 1] == 163586);
    n = 0;
    REQUIRE(k3_tok_encode(t, chat, strlen(chat), 0, &ids, &n, &cap, &d) == K3_OK);
    CHECK(!has_id_at_least(ids, n, 163584));
    free(ids);
    uint64_t x = 88172645463325252ull;
    uint8_t buf[300];
    for (int k = 0; k < 300; k++) {
        size_t len = (size_t)(k % 300);
        for (size_t i = 0; i < len; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            buf[i] = k & 1 ? (uint8_t)x : (uint8_t)"ab <|\xe4\xb8\xad\n\xff'"[x % 12];
        }
        round_trip(t, buf, len, k & 2);
    }
    k3_tok_free(t);
}

typedef struct job {
    const k3_tok *t;
    const char *text;
    size_t len;
    int32_t *ids;
    size_t n;
    int ok;
} job;

static void *encode_job(void *p)
{
    job *j = p;
    size_t cap = 0;
    k3_diag d = {0};
    j->ok = 1;
    for (int rep = 0; rep < 3; rep++) {
        j->n = 0;
        j->ok &= k3_tok_encode(j->t, j->text, j->len, 1, &j->ids, &j->n, &cap, &d) == K3_OK;
    }
    return NULL;
}

static void test_encode(void)
{
    k3_diag d = {0};
    k3_tok *t;
    const char *vocab = env_or("K3_TOK_VOCAB", "tests/reference/data/tiktoken.model");
    k3_err e = k3_tok_load(vocab, NULL, &t, &d);
    if (e) fprintf(stderr, "%s\n", d.msg);
    REQUIRE(e == K3_OK);
    CHECK_EQ_U64(k3_tok_n_ranks(t), 3840);
    /* known answer from tests/reference/kimi_tokenizer.py */
    static const int32_t want[] = {3610, 111, 2165, 620, 32, 2162, 3593, 32, 33, 33, 300, 32,
                                   1697, 32, 2837, 382, 99};
    const char *s = "Hello world's 12345 !!\n\n  x \xe4\xb8\xad\xe6\x96\x87" "abc";
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    REQUIRE(k3_tok_encode(t, s, strlen(s), 0, &ids, &n, &cap, &d) == K3_OK);
    CHECK_EQ_U64(n, 17);
    CHECK(n == 17 && !memcmp(ids, want, sizeof want));
    REQUIRE(k3_tok_encode(t, s, strlen(s), 0, &ids, &n, &cap, &d) == K3_OK);   /* appends */
    CHECK(n == 34 && !memcmp(ids + 17, want, sizeof want));
    REQUIRE(k3_tok_encode(t, "", 0, 1, &ids, &n, &cap, &d) == K3_OK);
    CHECK_EQ_U64(n, 34);
    n = 0;
    REQUIRE(k3_tok_encode(t, "<|reserved_token_3850|>\xff", 24, 1, &ids, &n, &cap, &d) == K3_OK);
    CHECK(n == 2 && ids[0] == 3850 && ids[1] == 0xff);
    CHECK(k3_tok_special_id(t, "<|reserved_token_4095|>") == 4095);
    CHECK(k3_tok_special_id(t, "[EOS]") == -1);
    free(ids);
    ids = NULL;
    cap = 0;
    /* long pieces (one 25 000-char run each) and invalid bytes round-trip */
    size_t big = 300000;
    char *text = malloc(big);     /* [big] a long mixed text */
    REQUIRE(text);
    uint64_t x = 2463534242ull;
    for (size_t i = 0; i < big; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        text[i] = i < 100000 ? 'a' : i < 150000 ? " \n"[i & 1] : "the cat's 12 \x80\xe4"[x % 16];
    }
    round_trip(t, (const uint8_t *)text, big, 0);
    /* concurrent encodes agree with a single-threaded one */
    job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){.t = t, .text = text, .len = big};
        REQUIRE(pthread_create(&th[i], NULL, encode_job, &jobs[i]) == 0);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        CHECK(jobs[i].ok);
        CHECK(jobs[i].n == jobs[0].n && !memcmp(jobs[i].ids, jobs[0].ids, jobs[0].n * 4));
    }
    n = 0;
    REQUIRE(k3_tok_encode(t, text, big, 1, &ids, &n, &cap, &d) == K3_OK);
    CHECK(n == jobs[0].n && !memcmp(ids, jobs[0].ids, n * 4));
    for (int i = 0; i < 4; i++) free(jobs[i].ids);
    free(ids);
    free(text);
    k3_tok_free(t);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "%s/tokenizer-%d", k3_test_tmpdir(), (int)getpid());
    char cmd[8300];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", g_dir);
    REQUIRE(system(cmd) == 0);
    test_bad_vocab();
    test_bad_config();
    test_released_config();
    test_encode();
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", g_dir);
    return k3_test_done();
}

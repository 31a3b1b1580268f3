/*
 * test_stopstr.c - stop strings (k3run/text/stopstr.h). Every expected output
 * below is worked out by hand from the rule "output the text up to the first
 * stop string that completes, hold back a suffix that may still start one":
 * a matcher that output the stop, lost or reordered a byte, held too little
 * or released too late fails one of them.
 */
#include "k3_test.h"

#include "stopstr.h"

typedef struct sink {
    char buf[4096];           /* everything emitted, in order */
    size_t n;
    int calls;
} sink;

static void emit(void *ctx, const uint8_t *b, size_t n)
{
    sink *s = ctx;
    CHECK(n > 0);
    REQUIRE(s->n + n < sizeof s->buf);
    memcpy(s->buf + s->n, b, n);
    s->n += n;
    s->buf[s->n] = 0;
    s->calls++;
}

/* Feed text in pieces of `step` bytes (0: all at once); the stop index or -1; out holds the output. */
static int run(const char *const *stops, size_t n_stops, const char *text, size_t step, sink *out)
{
    k3_stopstr s;
    k3_diag d;
    memset(out, 0, sizeof *out);
    REQUIRE(k3_stopstr_init(&s, stops, n_stops, &d) == K3_OK);
    size_t len = strlen(text);
    if (!step) step = len ? len : 1;
    int stopped = 0;
    for (size_t i = 0; i < len && !stopped; i += step) {
        size_t m = len - i < step ? len - i : step;
        stopped = k3_stopstr_feed(&s, (const uint8_t *)text + i, m, emit, out);
    }
    if (!stopped) k3_stopstr_finish(&s, emit, out);
    CHECK_EQ_U64(k3_stopstr_held(&s), 0);
    int which = k3_stopstr_which(&s);
    k3_stopstr_free(&s);
    return which;
}

static void test_split_across_feeds(void)
{
    const char *stops[] = { "STOP" };
    sink o;
    for (size_t step = 0; step <= 5; step++) {          /* every way to cut it */
        CHECK_EQ_U64(run(stops, 1, "abc STOP def", step, &o), 0);
        CHECK_STR(o.buf, "abc ");
    }
    /* held back exactly while it may still be the stop: "ST" then "x" releases it */
    k3_stopstr s;
    k3_diag d;
    memset(&o, 0, sizeof o);
    REQUIRE(k3_stopstr_init(&s, stops, 1, &d) == K3_OK);
    CHECK(!k3_stopstr_feed(&s, (const uint8_t *)"abST", 4, emit, &o));
    CHECK_STR(o.buf, "ab");
    CHECK_EQ_U64(k3_stopstr_held(&s), 2);
    CHECK(!k3_stopstr_feed(&s, (const uint8_t *)"O", 1, emit, &o));
    CHECK_EQ_U64(k3_stopstr_held(&s), 3);
    CHECK(!k3_stopstr_feed(&s, (const uint8_t *)"x", 1, emit, &o));
    CHECK_STR(o.buf, "abSTOx");
    CHECK_EQ_U64(k3_stopstr_held(&s), 0);
    CHECK(k3_stopstr_feed(&s, (const uint8_t *)"STOPzz", 6, emit, &o) == 1);
    CHECK_STR(o.buf, "abSTOx");
    CHECK(k3_stopstr_feed(&s, (const uint8_t *)"more", 4, emit, &o) == 1);   /* stopped for good */
    k3_stopstr_finish(&s, emit, &o);
    CHECK_STR(o.buf, "abSTOx");
    k3_stopstr_free(&s);
}

static void test_overlapping(void)
{
    const char *stops[] = { "aab" };
    sink o;
    /* "aaab": the stop starts at the second a; the first a is output */
    for (size_t step = 0; step <= 4; step++) {
        CHECK_EQ_U64(run(stops, 1, "aaab", step, &o), 0);
        CHECK_STR(o.buf, "a");
    }
    /* "aaaa" then end: nothing matched, all four a come out, in order */
    CHECK(run(stops, 1, "aaaa", 1, &o) == -1);
    CHECK_STR(o.buf, "aaaa");
    const char *abab[] = { "abac" };
    CHECK_EQ_U64(run(abab, 1, "ababac!", 1, &o), 0);  /* the second "ab" starts it */
    CHECK_STR(o.buf, "ab");
}

static void test_several(void)
{
    const char *stops[] = { "\n\n", "User:", "###" };
    sink o;
    CHECK_EQ_U64(run(stops, 3, "Hi.\nUser: x\n\n", 1, &o), 1);   /* User: comes first */
    CHECK_STR(o.buf, "Hi.\n");
    CHECK_EQ_U64(run(stops, 3, "a##b###c\n\n", 2, &o), 2);
    CHECK_STR(o.buf, "a##b");
    /* a short stop completes inside a longer one's partial match: it wins, as it completes first,
       whether the text comes byte by byte or at once */
    const char *nest[] = { "abcd", "bc" };
    for (size_t step = 0; step <= 2; step++) {
        CHECK_EQ_U64(run(nest, 2, "xabcd", step, &o), 1);
        CHECK_STR(o.buf, "xa");
    }
    /* two completing at the same byte: the one starting first ("xbc" before "bc") */
    const char *same_end[] = { "bc", "xbc" };
    CHECK_EQ_U64(run(same_end, 2, "axbcd", 0, &o), 1);
    CHECK_STR(o.buf, "a");
    const char *same[] = { "abc", "ab" };               /* "ab" completes before "abc" can */
    CHECK_EQ_U64(run(same, 2, "zabc", 0, &o), 1);
    CHECK_STR(o.buf, "z");
}

static void test_at_start_and_end(void)
{
    const char *stops[] = { "<end>" };
    sink o;
    CHECK_EQ_U64(run(stops, 1, "<end>rest", 1, &o), 0);
    CHECK_STR(o.buf, "");
    CHECK_EQ_U64(o.calls, 0);
    /* a partial stop at the very end is released by finish */
    CHECK(run(stops, 1, "text <en", 3, &o) == -1);
    CHECK_STR(o.buf, "text <en");
    /* no stops: everything passes at once */
    CHECK(run(NULL, 0, "plain", 2, &o) == -1);
    CHECK_STR(o.buf, "plain");
}

static void test_bytes_and_order(void)
{
    /* UTF-8: the stop "é!" (c3 a9 21) against "café" + "é?" + "é!" fed one byte at a time */
    const char *stops[] = { "\xc3\xa9!" };
    sink o;
    CHECK_EQ_U64(run(stops, 1, "caf\xc3\xa9\xc3\xa9?\xc3\xa9!tail", 1, &o), 0);
    CHECK_STR(o.buf, "caf\xc3\xa9\xc3\xa9?");
    /* a long text through a long stop: the windows slide without losing a byte */
    char text[2100];
    for (size_t i = 0; i < 2000; i++) text[i] = (char)('a' + i % 7);
    memcpy(text + 2000, "0123456789", 11);
    const char *longstop[] = { "abcdefgabcdefgX", "789" };
    CHECK_EQ_U64(run(longstop, 2, text, 13, &o), 1);
    CHECK_EQ_U64(o.n, 2007);
    CHECK(!memcmp(o.buf, text, 2007));
}

static void test_usage(void)
{
    k3_stopstr s;
    k3_diag d;
    const char *bad[] = { "ok", "" };
    CHECK(k3_stopstr_init(&s, bad, 2, &d) == K3_ERR_USAGE);
    CHECK_STR(d.msg, "stop string 2 is empty");
    k3_stopstr_free(&s);
}

int main(void)
{
    test_split_across_feeds();
    test_overlapping();
    test_several();
    test_at_start_and_end();
    test_bytes_and_order();
    test_usage();
    return k3_test_done();
}

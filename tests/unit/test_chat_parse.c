/*
 * test_chat_parse.c - the output parser of CHAT-FORMAT.md §9 on token ids
 * (k3run/text/chat_parse.h), over the demo model's real tokenizer
 * (tests/models/k3-kjv, found as $K3_TEST_DATA/../models/k3-kjv, or
 * $K3_TEST_MODEL_DIR): its markers are special ids 3842-3845, its text is
 * BPE over 3840 ranks, so tag names and values are several ids each.
 *
 * A sequence is written as text with the special ids in guillemets
 * («O» «C» «S» «E» «EOS» «BOS»); each run of text between them (and between
 * `¦`, to cut pieces where the renderer does) is encoded on its own with
 * special-token recognition off, as §3.2 says text segments are. Every
 * expected reasoning, content, name and arguments text below was derived by
 * hand from §9.2-§9.4 (the input's bytes, the channel the state machine puts
 * them in, the JSON of §9.3), not taken from the parser's output: a parser
 * that misplaced, dropped, re-escaped or reordered a byte fails.
 */
#include "k3_test.h"

#include <jansson.h>

#include "chat_parse.h"

static k3_tok *tok;
static int32_t ID_O, ID_C, ID_S, ID_E, ID_EOS, ID_BOS;

/* ------------------------------------------------------------------------- */
/* building id sequences                                                      */

typedef struct seq {
    int32_t *ids;             /* [cap], n used */
    size_t n, cap;
} seq;

static void seq_id(seq *s, int32_t id)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->ids = realloc(s->ids, s->cap * sizeof *s->ids);
        REQUIRE(s->ids);
    }
    s->ids[s->n++] = id;
}

static void seq_text(seq *s, const char *t, size_t len)
{
    if (!len) return;
    k3_diag d;
    REQUIRE(k3_tok_encode(tok, t, len, 0, &s->ids, &s->n, &s->cap, &d) == K3_OK);
}

/* Append the ids of spec (see the file comment). */
static void seq_add(seq *s, const char *spec)
{
    static const struct { const char *name; int32_t *id; } marks[] = {
        { "«O»", &ID_O }, { "«C»", &ID_C }, { "«S»", &ID_S }, { "«E»", &ID_E },
        { "«EOS»", &ID_EOS }, { "«BOS»", &ID_BOS },
    };
    const char *run = spec, *p = spec;
    while (*p) {
        if (!strncmp(p, "\xc2\xa6", 2)) {                    /* ¦: a piece boundary */
            seq_text(s, run, (size_t)(p - run));
            p += 2;
            run = p;
            continue;
        }
        size_t k = 0, nm = sizeof marks / sizeof marks[0];
        for (; k < nm; k++)
            if (!strncmp(p, marks[k].name, strlen(marks[k].name))) break;
        if (k == nm) {
            p++;
            continue;
        }
        seq_text(s, run, (size_t)(p - run));
        seq_id(s, *marks[k].id);
        p += strlen(marks[k].name);
        run = p;
    }
    seq_text(s, run, (size_t)(p - run));
}

/* ------------------------------------------------------------------------- */
/* running the parser, recording what it streams                             */

typedef struct rec {
    k3_chat_parser p;
    char stream[2][16384];    /* [channel] the streamed bytes, concatenated */
    size_t ns[2];
    char order[256];          /* one letter per event: R reasoning, C content, T call */
    size_t n_order;
    int n_text_events;
    char call_name[8][128];   /* [call] what the call callback got */
    char call_args[8][1024];
    size_t n_cb_calls;
    long stop_at;             /* index of the id feed returned 1 for, or -1 */
} rec;

static void on_text(void *ctx, k3_chat_channel ch, const uint8_t *b, size_t n)
{
    rec *r = ctx;
    CHECK(n > 0);
    REQUIRE(r->ns[ch] + n < sizeof r->stream[ch]);
    memcpy(r->stream[ch] + r->ns[ch], b, n);
    r->ns[ch] += n;
    r->n_text_events++;
    if (r->n_order < sizeof r->order - 1) r->order[r->n_order++] = ch == K3_CHAT_REASONING ? 'R' : 'C';
}

static void on_call(void *ctx, const k3_chat_call *c, size_t index)
{
    rec *r = ctx;
    CHECK_EQ_U64(index, r->n_cb_calls);
    REQUIRE(r->n_cb_calls < 8);
    snprintf(r->call_name[r->n_cb_calls], sizeof r->call_name[0], "%s", c->name);
    snprintf(r->call_args[r->n_cb_calls], sizeof r->call_args[0], "%s", c->arguments);
    r->n_cb_calls++;
    if (r->n_order < sizeof r->order - 1) r->order[r->n_order++] = 'T';
}

#define KEEP_UNDECLARED 2    /* tools argument: not declared, calls kept */

/* Parse spec from the start state `thinking`; finish after the last id (a stop or the length limit). */
static void parse(rec *r, const char *spec, int thinking, int tools)
{
    memset(r, 0, sizeof *r);
    r->stop_at = -1;
    seq s = { 0 };
    seq_add(&s, spec);
    k3_diag d;
    REQUIRE(k3_chat_parser_init(&r->p, tok, thinking, tools == 1, &d) == K3_OK);
    if (tools == KEEP_UNDECLARED) k3_chat_parser_keep_undeclared(&r->p, 1);
    k3_chat_parse_cb cb = { on_text, on_call, r };
    for (size_t i = 0; i < s.n; i++) {
        int e = k3_chat_parser_feed(&r->p, s.ids[i], &cb);
        CHECK(e >= 0);
        if (e == 1 && r->stop_at < 0) r->stop_at = (long)i;
    }
    k3_chat_parser_finish(&r->p, &cb);
    free(s.ids);
    /* the stream is the final buffers, byte for byte, and every call was streamed once */
    size_t n;
    const uint8_t *b = k3_chat_parser_reasoning(&r->p, &n);
    CHECK(n == r->ns[0] && !memcmp(b, r->stream[0], n));
    b = k3_chat_parser_content(&r->p, &n);
    CHECK(n == r->ns[1] && !memcmp(b, r->stream[1], n));
    CHECK_EQ_U64(r->n_cb_calls, k3_chat_parser_n_calls(&r->p));
    for (size_t i = 0; i < r->n_cb_calls && i < 8; i++) {
        CHECK_STR(r->call_name[i], k3_chat_parser_call(&r->p, i)->name);
        CHECK_STR(r->call_args[i], k3_chat_parser_call(&r->p, i)->arguments);
    }
}

static const char *reasoning(const rec *r)
{
    size_t n;
    return (const char *)k3_chat_parser_reasoning(&r->p, &n);
}

static const char *content(const rec *r)
{
    size_t n;
    return (const char *)k3_chat_parser_content(&r->p, &n);
}

static const char *call_name(const rec *r, size_t i)
{
    const k3_chat_call *c = k3_chat_parser_call(&r->p, i);
    return c ? c->name : NULL;
}

static const char *call_args(const rec *r, size_t i)
{
    const k3_chat_call *c = k3_chat_parser_call(&r->p, i);
    return c ? c->arguments : NULL;
}

static void check_message(const rec *r, const char *want)
{
    char *m = NULL;
    size_t len = 0;
    k3_diag d;
    REQUIRE(k3_chat_message_json(&r->p, NULL, &m, &len, &d) == K3_OK);
    CHECK_STR(m, want);
    CHECK_EQ_U64(len, strlen(want));
    json_error_t je;
    json_t *j = json_loadb(m, len, 0, &je);                  /* and it is JSON */
    CHECK_MSG(j != NULL, "%s: %s", m, je.text);
    json_decref(j);
    free(m);
}

/* ------------------------------------------------------------------------- */
/* well-formed answers                                                        */

static void test_thinking_on(void)
{
    rec r;
    parse(&r, "\nLet me think.\n«C»think«S»«O»response«S»\n\nHello!  «C»response«S»«C»message«S»«E»", 1, 0);
    CHECK_STR(reasoning(&r), "\nLet me think.\n");          /* never stripped (§9.3) */
    CHECK_STR(content(&r), "\n\nHello!  ");
    CHECK_EQ_U64(k3_chat_parser_n_calls(&r.p), 0);
    CHECK(r.stop_at >= 0 && !k3_chat_parser_in_think(&r.p) && k3_chat_parser_done(&r.p));
    CHECK(r.n_order > 1 && r.order[0] == 'R' && r.order[r.n_order - 1] == 'C');
    CHECK(!strchr(strchr(r.order, 'C'), 'R'));             /* no reasoning after content began */
    check_message(&r, "{\"role\":\"assistant\",\"content\":\"\\n\\nHello!  \","
                      "\"reasoning_content\":\"\\nLet me think.\\n\"}");
    k3_chat_parser_free(&r.p);
}

static void test_thinking_off(void)
{
    rec r;
    parse(&r, "Hi \"there\"\x01\n«C»response«S»«C»message«S»«E»", 0, 0);
    CHECK_STR(reasoning(&r), "");
    CHECK_STR(content(&r), "Hi \"there\"\x01\n");
    check_message(&r, "{\"role\":\"assistant\",\"content\":\"Hi \\\"there\\\"\\u0001\\n\","
                      "\"reasoning_content\":null}");
    k3_chat_parser_free(&r.p);
}

/* The ids after the stop are not parsed; the stop id is not text; [EOS] stops too (§9.1). */
static void test_stops(void)
{
    rec r;
    parse(&r, "answer«EOS»more text«O»response«S»x", 0, 0);
    CHECK_STR(content(&r), "answer");
    seq s = { 0 };
    seq_add(&s, "answer");
    CHECK_EQ_U64(r.stop_at, s.n);
    k3_chat_parser_free(&r.p);
    parse(&r, "a«C»response«S»«C»message«S»«E»after", 0, 0);
    CHECK_STR(content(&r), "a");
    k3_chat_parser_free(&r.p);
    free(s.ids);
}

static int32_t byte_id(uint8_t byte)
{
    for (uint32_t i = 0; i < k3_tok_n_ranks(tok); i++) {
        size_t n;
        const uint8_t *b = k3_tok_bytes(tok, (int32_t)i, &n);
        if (n == 1 && b[0] == byte) return (int32_t)i;
    }
    return -1;
}

/* A token ending inside a UTF-8 character: streamed raw, joined in the buffer. */
static void test_utf8_split(void)
{
    int32_t c3 = byte_id(0xc3), a9 = byte_id(0xa9);
    REQUIRE(c3 >= 0 && a9 >= 0);
    k3_chat_parser p;
    k3_diag d;
    rec r;
    memset(&r, 0, sizeof r);
    REQUIRE(k3_chat_parser_init(&p, tok, 0, 0, &d) == K3_OK);
    k3_chat_parse_cb cb = { on_text, on_call, &r };
    seq s = { 0 };
    seq_add(&s, "caf");
    seq_id(&s, c3);
    seq_id(&s, a9);
    for (size_t i = 0; i < s.n; i++) CHECK(k3_chat_parser_feed(&p, s.ids[i], &cb) == 0);
    CHECK_EQ_U64(r.ns[1], 5);
    CHECK(!memcmp(r.stream[1], "caf\xc3\xa9", 5));
    CHECK_EQ_U64(r.n_text_events, s.n);                      /* one event per text id: 0xc3 alone */
    k3_chat_parser_finish(&p, &cb);
    CHECK_STR(content(&(rec){ .p = p }), "caf\xc3\xa9");
    k3_chat_parser_free(&p);
    free(s.ids);
}

/* ------------------------------------------------------------------------- */
/* tool calls                                                                 */

#define CALL_TYPED \
    "«C»think«S»«O»tools«S»" \
    "«O»call¦ tool¦=\"¦get_weather¦\"¦ index¦=\"¦1¦\"«S»" \
    "«O»argument key=\"city\" type=\"string\"«S»Paris \"Ville\"\n\tlumi\xc3\xa8re\\«C»argument«S»" \
    "«O»argument key=\"temp\" type=\"number\"«S»2.50«C»argument«S»" \
    "«O»argument key=\"metric\" type=\"boolean\"«S»true«C»argument«S»" \
    "«O»argument key=\"note\" type=\"null\"«S»null«C»argument«S»" \
    "«O»argument key=\"opts\" type=\"object\"«S»{\"b\": 2,\n \"a\": [1, {\"c\": null}]}«C»argument«S»" \
    "«O»argument key=\"list\" type=\"array\"«S»[1, 2,  {\"deep\": [true]}]«C»argument«S»" \
    "«O»argument key=\"bad\" type=\"number\"«S»12abc«C»argument«S»" \
    "«O»argument key=\"nan\" type=\"number\"«S»NaN«C»argument«S»" \
    "«O»argument key=\"flag\" type=\"boolean\"«S»yes«C»argument«S»" \
    "«O»argument key=\"a&quot;b&amp;c\" type=\"string\"«S»x<|close|>argument<|sep|>y«C»argument«S»" \
    "«C»call«S»"

static void test_typed_arguments(void)
{
    rec r;
    parse(&r, "plan" CALL_TYPED
              "«O»call tool=\"a&amp;quot;b&quot;c&amp;amp;\" index=\"2\"«S»«C»call«S»"
              "«O»call tool=\"raw\" index=\"3\"«S»«O»json type=\"object\"«S»[1, 2]«C»json«S»«C»call«S»"
              "«O»call tool=\"bad_raw\" index=\"4\"«S»«O»json type=\"object\"«S»{\"a\": «C»json«S»«C»call«S»"
              "«C»tools«S»«C»message«S»«E»", 1, 1);
    CHECK_STR(reasoning(&r), "plan");
    CHECK_STR(content(&r), "");
    REQUIRE(k3_chat_parser_n_calls(&r.p) == 4);
    CHECK_STR(call_name(&r, 0), "get_weather");
    /* string: JSON-encoded raw bytes; 2.50 kept; literals kept; invalid number/boolean -> strings;
       the key unescaped then JSON-encoded; literal marker text stays text */
    CHECK_STR(call_args(&r, 0),
              "{\"city\":\"Paris \\\"Ville\\\"\\n\\tlumi\xc3\xa8re\\\\\",\"temp\":2.50,\"metric\":true,"
              "\"note\":null,\"opts\":{\"b\": 2,\n \"a\": [1, {\"c\": null}]},"
              "\"list\":[1, 2,  {\"deep\": [true]}],\"bad\":\"12abc\",\"nan\":\"NaN\",\"flag\":\"yes\","
              "\"a\\\"b&c\":\"x<|close|>argument<|sep|>y\"}");
    /* one left-to-right pass: &amp;quot; is the text &quot;, not a quote */
    CHECK_STR(call_name(&r, 1), "a&quot;b\"c&amp;");
    CHECK_STR(call_args(&r, 1), "{}");
    CHECK_STR(call_name(&r, 2), "raw");
    CHECK_STR(call_args(&r, 2), "[1, 2]");                  /* a json block is the arguments */
    CHECK_STR(call_args(&r, 3), "{\"a\": ");                /* byte for byte, even broken */
    CHECK(r.n_order > 4 && !strcmp(r.order + r.n_order - 4, "TTTT") && !strchr(r.order, 'C'));
    k3_chat_parser_free(&r.p);

    /* the literal checker: RFC 8259 numbers, no trailing comma, no raw control character, the type */
    parse(&r, "«O»tools«S»«O»call tool=\"g\" index=\"1\"«S»"
              "«O»argument key=\"n1\" type=\"number\"«S»-0.0«C»argument«S»"
              "«O»argument key=\"n2\" type=\"number\"«S»1e2«C»argument«S»"
              "«O»argument key=\"n3\" type=\"number\"«S»012«C»argument«S»"
              "«O»argument key=\"n4\" type=\"number\"«S»1.«C»argument«S»"
              "«O»argument key=\"o1\" type=\"object\"«S»{\"a\":1,}«C»argument«S»"
              "«O»argument key=\"a1\" type=\"array\"«S»[1 2]«C»argument«S»"
              "«O»argument key=\"o2\" type=\"object\"«S»{\"k\":\"raw\nnewline\"}«C»argument«S»"
              "«O»argument key=\"o3\" type=\"object\"«S»[1]«C»argument«S»"
              "«O»argument key=\"s1\" type=\"integer\"«S»7«C»argument«S»"
              "«C»call«S»«C»tools«S»«C»message«S»«E»", 0, 1);
    CHECK_STR(call_args(&r, 0), "{\"n1\":-0.0,\"n2\":1e2,\"n3\":\"012\",\"n4\":\"1.\",\"o1\":\"{\\\"a\\\":1,}\","
                                "\"a1\":\"[1 2]\",\"o2\":\"{\\\"k\\\":\\\"raw\\nnewline\\\"}\",\"o3\":\"[1]\","
                                "\"s1\":\"7\"}");
    k3_chat_parser_free(&r.p);

    parse(&r, "«O»tools«S»«O»call tool=\"f\" index=\"1\"«S»«O»argument key=\"x\" type=\"number\"«S»1"
              "«C»argument«S»«C»call«S»«C»tools«S»«C»message«S»«E»", 0, 1);
    check_message(&r, "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":null,\"tool_calls\":"
                      "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                      "\"arguments\":\"{\\\"x\\\":1}\"}}]}");
    k3_chat_parser_free(&r.p);
}

/* Text that spells markers is text everywhere (§9.2, §9.4 e). */
static void test_literal_markers(void)
{
    const char *lit = "a<|close|>think<|sep|><|open|>response<|sep|>b<|end_of_msg|>";
    seq s = { 0 };
    seq_add(&s, lit);
    for (size_t i = 0; i < s.n; i++) REQUIRE(!k3_tok_is_special(tok, s.ids[i]));
    free(s.ids);
    rec r;
    parse(&r, "a<|close|>think<|sep|><|open|>response<|sep|>b<|end_of_msg|>«C»think«S»«O»response«S»"
              "<|close|>response<|sep|>«C»response«S»«C»message«S»«E»", 1, 0);
    CHECK_STR(reasoning(&r), lit);
    CHECK_STR(content(&r), "<|close|>response<|sep|>");
    CHECK_EQ_U64(r.stop_at >= 0, 1);
    k3_chat_parser_free(&r.p);
}

/* ------------------------------------------------------------------------- */
/* §9.4: the deviations of the real model                                     */

static void test_deviations(void)
{
    rec r;
    /* a: the think close without its <|sep|>, directly followed by <|open|> */
    parse(&r, "r«C»think«O»response«S»ans«C»response«S»«C»message«S»«E»", 1, 0);
    CHECK_STR(reasoning(&r), "r");
    CHECK_STR(content(&r), "ans");
    k3_chat_parser_free(&r.p);

    /* a, for every header: `C call` cut short by the next call's <|open|> still completes it */
    parse(&r, "«O»tools«S»«O»call tool=\"f\" index=\"1\"«S»«C»call«O»call tool=\"g\" index=\"2\"«S»«C»call«S»"
              "«C»tools«S»«C»message«S»«E»", 0, 1);
    CHECK_EQ_U64(k3_chat_parser_n_calls(&r.p), 2);
    CHECK_STR(call_name(&r, 1), "g");
    k3_chat_parser_free(&r.p);

    /* b: the think channel never closed: O response S, O tools S, C message S, C response S */
    parse(&r, "r1«O»response«S»ans«C»response«S»«C»message«S»«E»", 1, 0);
    CHECK_STR(reasoning(&r), "r1");
    CHECK_STR(content(&r), "ans");
    k3_chat_parser_free(&r.p);
    parse(&r, "r2«O»tools«S»«O»call tool=\"f\" index=\"1\"«S»«C»call«S»«C»tools«S»«C»message«S»«E»", 1, 1);
    CHECK_STR(reasoning(&r), "r2");
    CHECK_STR(content(&r), "");
    CHECK_EQ_U64(k3_chat_parser_n_calls(&r.p), 1);
    CHECK_STR(call_name(&r, 0), "f");
    k3_chat_parser_free(&r.p);
    parse(&r, "r3«C»message«S»«E»", 1, 0);
    CHECK_STR(reasoning(&r), "r3");
    CHECK_STR(content(&r), "");
    CHECK(r.stop_at >= 0);
    k3_chat_parser_free(&r.p);
    parse(&r, "r4«C»response«S»between«O»response«S»late«C»response«S»«C»message«S»«E»", 1, 0);
    CHECK_STR(reasoning(&r), "r4");                         /* "between" is in BETWEEN: no channel's */
    CHECK_STR(content(&r), "late");
    k3_chat_parser_free(&r.p);

    /* c: truncated inside think, no marker at all: all of it is reasoning; also mid-header */
    parse(&r, "the length limit came while I was still", 1, 0);
    CHECK_STR(reasoning(&r), "the length limit came while I was still");
    CHECK_STR(content(&r), "");
    CHECK(r.stop_at < 0);
    check_message(&r, "{\"role\":\"assistant\",\"content\":\"\","
                      "\"reasoning_content\":\"the length limit came while I was still\"}");
    k3_chat_parser_free(&r.p);
    parse(&r, "almost«C»thi", 1, 0);
    CHECK_STR(reasoning(&r), "almost");
    CHECK_STR(content(&r), "");
    k3_chat_parser_free(&r.p);

    /* d: the answer ends with C message S, no C response S; from thinking on and off */
    parse(&r, "r«C»think«S»«O»response«S»done.«C»message«S»«E»", 1, 0);
    CHECK_STR(content(&r), "done.");
    CHECK(r.stop_at >= 0);
    k3_chat_parser_free(&r.p);
    parse(&r, "done.«C»message«S»after«E»", 0, 0);
    CHECK_STR(content(&r), "done.");                        /* "after" is in CLOSED: no channel's */
    k3_chat_parser_free(&r.p);

    /* e: a marker spelled as BPE text (`<|sep` + `|>`) is text (also test_literal_markers) */
    parse(&r, "r«C»think<|sep|>more«S»«O»response«S»x«C»response«S»«C»message«S»«E»", 1, 0);
    CHECK_STR(reasoning(&r), "r");                          /* header "think<|sep|>more": ignored, */
    CHECK_STR(content(&r), "x");                            /* THINK stays; O response S ends it (b) */
    k3_chat_parser_free(&r.p);
    parse(&r, "ans<|sep|>«C»response«S»«C»message«S»«E»", 0, 0);
    CHECK_STR(content(&r), "ans<|sep|>");
    k3_chat_parser_free(&r.p);

    /* f: a tools channel with no tools declared: calls dropped, the response kept (like sglang);
       the calls' text never reaches the content; or kept by policy */
#define UNDECLARED "Sure.«C»response«S»«O»tools«S»«O»call tool=\"f\" index=\"1\"«S»" \
    "«O»argument key=\"x\" type=\"string\"«S»secret«C»argument«S»«C»call«S»«C»tools«S»«C»message«S»«E»"
    parse(&r, UNDECLARED, 0, 0);
    CHECK_STR(content(&r), "Sure.");
    CHECK_EQ_U64(k3_chat_parser_n_calls(&r.p), 0);
    CHECK_EQ_U64(k3_chat_parser_n_dropped(&r.p), 1);
    CHECK_EQ_U64(r.n_cb_calls, 0);
    check_message(&r, "{\"role\":\"assistant\",\"content\":\"Sure.\",\"reasoning_content\":null}");
    k3_chat_parser_free(&r.p);
    parse(&r, UNDECLARED, 0, KEEP_UNDECLARED);
    CHECK_STR(content(&r), "Sure.");
    CHECK_EQ_U64(k3_chat_parser_n_calls(&r.p), 1);
    CHECK_STR(call_args(&r, 0), "{\"x\":\"secret\"}");
    check_message(&r, "{\"role\":\"assistant\",\"content\":\"Sure.\",\"reasoning_content\":null,\"tool_calls\":"
                      "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                      "\"arguments\":\"{\\\"x\\\":\\\"secret\\\"}\"}}]}");
    k3_chat_parser_free(&r.p);

    /* g: the length limit inside the second call: the first kept, the second dropped */
    parse(&r, "«O»tools«S»«O»call tool=\"a\" index=\"1\"«S»«O»argument key=\"x\" type=\"number\"«S»1"
              "«C»argument«S»«C»call«S»«O»call tool=\"b\" index=\"2\"«S»«O»argument key=\"y\" "
              "type=\"string\"«S»partial val", 0, 1);
    CHECK_EQ_U64(k3_chat_parser_n_calls(&r.p), 1);
    CHECK_STR(call_name(&r, 0), "a");
    CHECK_STR(call_args(&r, 0), "{\"x\":1}");
    CHECK_EQ_U64(k3_chat_parser_n_dropped(&r.p), 1);
    CHECK_STR(content(&r), "");
    k3_chat_parser_free(&r.p);
}

/* Headers that do not fit, stray ids, a header that never ends. */
static void test_oddities(void)
{
    rec r;
    /* an unlisted header is ignored and the state kept; a stray sep and other specials are dropped */
    parse(&r, "A«O»think«S»B«S»C«BOS»D«C»response«S»«C»message«S»«E»", 0, 0);
    CHECK_STR(content(&r), "ABCD");
    k3_chat_parser_free(&r.p);
    /* text between channels and inside tools is no channel's */
    parse(&r, "r«C»think«S»\n«O»response«S»x«C»response«S»\n«O»tools«S»junk«C»tools«S»\n«C»message«S»«E»",
          1, 1);
    CHECK_STR(reasoning(&r), "r");
    CHECK_STR(content(&r), "x");
    k3_chat_parser_free(&r.p);
    /* the response not closed before the tools; the tools not closed before the message */
    parse(&r, "x«O»tools«S»«O»call tool=\"f\" index=\"1\"«S»«C»call«S»«C»message«S»«E»", 0, 1);
    CHECK_STR(content(&r), "x");
    CHECK_EQ_U64(k3_chat_parser_n_calls(&r.p), 1);
    k3_chat_parser_free(&r.p);
    /* a stray <|close|> followed by more than K3_CHAT_HEADER_MAX bytes: not a header, text */
    static char spec[8192];
    char *w = spec;
    w += sprintf(w, "start«C»");
    for (int i = 0; i < 1000; i++) w += sprintf(w, "word ");
    sprintf(w, "«C»think«S»«O»response«S»ok«C»response«S»«C»message«S»«E»");
    parse(&r, spec, 1, 0);
    size_t n;
    const uint8_t *b = k3_chat_parser_reasoning(&r.p, &n);
    CHECK_EQ_U64(n, 5 + 5000);
    CHECK(!memcmp(b, "startword word ", 15) && !memcmp(b + n - 5, "word ", 5));
    CHECK_STR(content(&r), "ok");
    k3_chat_parser_free(&r.p);
    /* invalid UTF-8 in the content becomes U+FFFD in the message only */
    k3_chat_parser p;
    k3_diag d;
    REQUIRE(k3_chat_parser_init(&p, tok, 0, 0, &d) == K3_OK);
    int32_t ff = byte_id(0xff);
    REQUIRE(ff >= 0);
    CHECK(k3_chat_parser_feed(&p, ff, NULL) == 0);
    k3_chat_parser_finish(&p, NULL);
    CHECK_EQ_U64(p.content.n, 1);
    char *m;
    REQUIRE(k3_chat_message_json(&p, "id", &m, NULL, &d) == K3_OK);
    CHECK_STR(m, "{\"role\":\"assistant\",\"content\":\"\xef\xbf\xbd\",\"reasoning_content\":null}");
    free(m);
    k3_chat_parser_free(&p);
}

/* §9.5: nothing is streamed while a header is open; text is streamed as soon as its channel is known. */
static void test_streaming_steps(void)
{
    k3_chat_parser p;
    k3_diag d;
    rec r;
    memset(&r, 0, sizeof r);
    REQUIRE(k3_chat_parser_init(&p, tok, 1, 0, &d) == K3_OK);
    k3_chat_parse_cb cb = { on_text, on_call, &r };
    seq s = { 0 };
    seq_add(&s, "think");
    size_t n_think = s.n;
    for (size_t i = 0; i < s.n; i++) k3_chat_parser_feed(&p, s.ids[i], &cb);
    CHECK_EQ_U64(r.ns[0], 5);                               /* streamed at once */
    CHECK(k3_chat_parser_in_think(&p) && !k3_chat_parser_in_header(&p));
    s.n = 0;
    seq_add(&s, "«C»think");
    for (size_t i = 0; i < s.n; i++) k3_chat_parser_feed(&p, s.ids[i], &cb);
    CHECK(k3_chat_parser_in_header(&p) && k3_chat_parser_in_think(&p));
    CHECK_EQ_U64(r.ns[0], 5);                               /* the header's "think" is held */
    CHECK_EQ_U64(r.n_text_events, n_think);
    k3_chat_parser_feed(&p, ID_O, &cb);                     /* a: `C think` ended by <|open|> */
    CHECK(k3_chat_parser_in_header(&p) && !k3_chat_parser_in_think(&p));
    s.n = 0;
    seq_add(&s, "response«S»");
    for (size_t i = 0; i < s.n; i++) k3_chat_parser_feed(&p, s.ids[i], &cb);
    CHECK(k3_chat_parser_in_response(&p));
    s.n = 0;
    seq_add(&s, "«C»response«S»");
    for (size_t i = 0; i < s.n; i++) k3_chat_parser_feed(&p, s.ids[i], &cb);
    CHECK(!k3_chat_parser_in_think(&p) && !k3_chat_parser_in_response(&p) && !k3_chat_parser_in_header(&p));
    s.n = 0;
    seq_add(&s, "«O»response«S»");
    for (size_t i = 0; i < s.n; i++) k3_chat_parser_feed(&p, s.ids[i], &cb);
    CHECK(k3_chat_parser_in_response(&p));
    CHECK_EQ_U64(r.ns[1], 0);
    s.n = 0;
    seq_add(&s, "Yes");
    for (size_t i = 0; i < s.n; i++) k3_chat_parser_feed(&p, s.ids[i], &cb);
    CHECK_EQ_U64(r.ns[1], 3);
    CHECK(!memcmp(r.stream[1], "Yes", 3));
    CHECK(k3_chat_parser_feed(&p, ID_E, &cb) == 1);
    CHECK(!k3_chat_parser_in_response(&p) && k3_chat_parser_done(&p));
    CHECK(k3_chat_parser_feed(&p, s.ids[0], &cb) == 1);    /* after the stop: ignored */
    CHECK_EQ_U64(r.ns[1], 3);
    k3_chat_parser_finish(&p, &cb);
    k3_chat_parser_free(&p);
    free(s.ids);
}

int main(void)
{
    const char *dir = getenv("K3_TEST_MODEL_DIR");
    char buf[4096];
    if (!dir || !*dir) {
        const char *data = getenv("K3_TEST_DATA");
        snprintf(buf, sizeof buf, "%s/../models/k3-kjv", data && *data ? data : "tests/data");
        dir = buf;
    }
    k3_diag d;
    REQUIRE(k3_tok_load_dir(dir, &tok, &d) == K3_OK);
    ID_O = k3_tok_special_id(tok, "<|open|>");
    ID_C = k3_tok_special_id(tok, "<|close|>");
    ID_S = k3_tok_special_id(tok, "<|sep|>");
    ID_E = k3_tok_special_id(tok, "<|end_of_msg|>");
    ID_EOS = k3_tok_special_id(tok, "[EOS]");
    ID_BOS = k3_tok_special_id(tok, "[BOS]");
    CHECK(ID_O == 3843 && ID_C == 3844 && ID_S == 3845 && ID_E == 3842 && ID_EOS == 3841 && ID_BOS == 3840);

    test_thinking_on();
    test_thinking_off();
    test_stops();
    test_utf8_split();
    test_typed_arguments();
    test_literal_markers();
    test_deviations();
    test_oddities();
    test_streaming_steps();
    k3_tok_free(tok);
    return k3_test_done();
}

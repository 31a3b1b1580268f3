/*
 * chat_parse.c - the output parser of CHAT-FORMAT.md §9 on token ids: the
 * state machine of §9.2 with the tolerances of §9.4 (chat_parse.h lists
 * them), tag headers and their attributes, and the tool calls' arguments
 * built into JSON (§9.3). The JSON bits live in chat_parse_json.c, the
 * OpenAI message in chat_parse_message.c.
 */
#include "chat_parse_impl.h"

#include <stdlib.h>
#include <string.h>

enum { PS_THINK, PS_RESPONSE, PS_BETWEEN, PS_TOOLS, PS_CALL, PS_ARG, PS_JSON, PS_CLOSED };

/* ------------------------------------------------------------------------- */
/* tag headers: NAME( KEY="VALUE")*                                          */

static int is_space(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* The header without surrounding ASCII whitespace, and the length of its name. */
static const uint8_t *header_trim(const k3_chat_buf *h, size_t *n, size_t *name_len)
{
    const uint8_t *s = h->b;
    size_t len = h->n;
    if (!s) {
        *n = *name_len = 0;
        return (const uint8_t *)"";
    }
    while (len && is_space(*s)) s++, len--;
    while (len && is_space(s[len - 1])) len--;
    size_t k = 0;
    while (k < len && !is_space(s[k])) k++;
    *n = len;
    *name_len = k;
    return s;
}

static int name_is(const uint8_t *s, size_t name_len, const char *want)
{
    return name_len == strlen(want) && !memcmp(s, want, name_len);
}

/* Unescape an attribute value into out, one left-to-right pass: &quot; -> ", &amp; -> &. */
static int attr_unescape(k3_chat_buf *out, const uint8_t *v, size_t n)
{
    size_t run = 0;                          /* v[run..i) is copied as it is */
    for (size_t i = 0; i < n;) {
        const char *rep = NULL;
        size_t skip = 0;
        if (v[i] == '&' && n - i >= 6 && !memcmp(v + i, "&quot;", 6)) rep = "\"", skip = 6;
        else if (v[i] == '&' && n - i >= 5 && !memcmp(v + i, "&amp;", 5)) rep = "&", skip = 5;
        if (!rep) {
            i++;
            continue;
        }
        if (k3_chat_buf_put(out, v + run, i - run) || k3_chat_buf_put(out, rep, 1)) return -1;
        i += skip;
        run = i;
    }
    return k3_chat_buf_put(out, v + run, n - run);
}

/*
 * Find attribute key in the header s[0..n) (after its name of name_len bytes)
 * and append its unescaped value to out. Attributes are ` KEY="VALUE"`, split
 * at the quotes (a raw `"` is only ever a delimiter); an unterminated value
 * runs to the end. Returns 1 found, 0 not, -1 out of memory.
 */
static int attr_get(const uint8_t *s, size_t n, size_t name_len, const char *key, k3_chat_buf *out)
{
    size_t klen = strlen(key), i = name_len;
    while (i < n) {
        while (i < n && is_space(s[i])) i++;
        size_t k0 = i;
        while (i < n && s[i] != '=' && !is_space(s[i])) i++;
        size_t k1 = i;
        if (i >= n || s[i] != '=') continue;            /* a bare word: skip it */
        i++;
        if (i >= n || s[i] != '"') continue;
        size_t v0 = ++i;
        while (i < n && s[i] != '"') i++;
        size_t v1 = i;
        if (i < n) i++;
        if (k1 - k0 == klen && !memcmp(s + k0, key, klen)) {
            out->n = 0;
            if (out->b) out->b[0] = 0;
            return attr_unescape(out, s + v0, v1 - v0) ? -1 : 1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* calls and arguments                                                        */

static int oom(k3_chat_parser *p)
{
    p->status = K3_ERR_NOMEM;
    p->done = 1;
    return -1;
}

static void reset(k3_chat_buf *b)
{
    b->n = 0;
    if (b->b) b->b[0] = 0;
}

static void call_clear(k3_chat_parser *p)
{
    free(p->call_name);
    p->call_name = NULL;
    p->in_call = p->call_has_json = 0;
    reset(&p->call_args);
    reset(&p->call_json);
    reset(&p->arg_key);
    reset(&p->arg_type);
    reset(&p->arg_value);
}

static int call_start(k3_chat_parser *p, const uint8_t *h, size_t n, size_t name_len)
{
    call_clear(p);
    k3_chat_buf name = { 0 };
    if (attr_get(h, n, name_len, "tool", &name) < 0) {
        k3_chat_buf_free(&name);
        return oom(p);
    }
    p->call_name = k3_chat_buf_dup(&name);   /* "" without a tool attribute */
    k3_chat_buf_free(&name);
    if (!p->call_name) return oom(p);
    p->in_call = 1;
    p->call_reported = p->tools_declared || p->keep_undeclared;
    return 0;
}

static int type_code(const k3_chat_buf *t)
{
    static const struct { const char *name; int code; } types[] = {
        { "number", K3_CHAT_JSON_NUMBER }, { "boolean", K3_CHAT_JSON_BOOLEAN },
        { "null", K3_CHAT_JSON_NULL }, { "object", K3_CHAT_JSON_OBJECT },
        { "array", K3_CHAT_JSON_ARRAY },
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (t->n == strlen(types[i].name) && !memcmp(t->b, types[i].name, t->n)) return types[i].code;
    return K3_CHAT_JSON_STRING;              /* "string", and any other or no type */
}

/* `C argument S`: append "KEY":VALUE to the call's arguments object. */
static int arg_end(k3_chat_parser *p)
{
    k3_chat_buf *a = &p->call_args;
    const uint8_t *v = p->arg_value.b ? p->arg_value.b : (const uint8_t *)"";
    const uint8_t *k = p->arg_key.b ? p->arg_key.b : (const uint8_t *)"";
    int type = type_code(&p->arg_type);
    int e = k3_chat_buf_put(a, a->n ? "," : "{", 1) || k3_chat_json_string(a, k, p->arg_key.n) ||
            k3_chat_buf_put(a, ":", 1);
    if (!e) {
        if (type != K3_CHAT_JSON_STRING && k3_chat_json_check(v, p->arg_value.n, type))
            e = k3_chat_buf_put(a, v, p->arg_value.n);
        else
            e = k3_chat_json_string(a, v, p->arg_value.n);
    }
    reset(&p->arg_key);
    reset(&p->arg_type);
    reset(&p->arg_value);
    return e ? oom(p) : 0;
}

static int arg_start(k3_chat_parser *p, const uint8_t *h, size_t n, size_t name_len)
{
    reset(&p->arg_value);
    reset(&p->arg_key);
    reset(&p->arg_type);
    if (attr_get(h, n, name_len, "key", &p->arg_key) < 0) return oom(p);
    if (attr_get(h, n, name_len, "type", &p->arg_type) < 0) return oom(p);
    return 0;
}

/* `C call S`: the call is complete; keep and report it, or drop it (§9.4 f). */
static int call_end(k3_chat_parser *p, const k3_chat_parse_cb *cb)
{
    if (!p->call_reported) {
        p->n_dropped++;
        call_clear(p);
        return 0;
    }
    if (p->n_calls == p->cap_calls) {
        size_t cap = p->cap_calls ? 2 * p->cap_calls : 4;
        k3_chat_call *nc = realloc(p->calls, cap * sizeof *nc);
        if (!nc) return oom(p);
        p->calls = nc;
        p->cap_calls = cap;
    }
    char *args;
    if (p->call_has_json) {
        args = k3_chat_buf_dup(&p->call_json);
    } else if (!p->call_args.n) {
        args = malloc(3);
        if (args) memcpy(args, "{}", 3);
    } else {
        args = k3_chat_buf_put(&p->call_args, "}", 1) ? NULL : k3_chat_buf_dup(&p->call_args);
    }
    if (!args) return oom(p);
    k3_chat_call *c = &p->calls[p->n_calls];
    c->name = p->call_name;
    c->arguments = args;
    p->call_name = NULL;
    call_clear(p);
    size_t idx = p->n_calls++;
    if (cb && cb->call) cb->call(cb->ctx, c, idx);
    return 0;
}

/* ------------------------------------------------------------------------- */
/* the state machine                                                          */

/* A complete header (its `<|sep|>` came, or a marker cut it short: §9.4 a). */
static int header_end(k3_chat_parser *p, const k3_chat_parse_cb *cb)
{
    int open = p->hdr == p->id_open;
    size_t n, nl;
    const uint8_t *h = header_trim(&p->header, &n, &nl);
    p->hdr = 0;
#define IS(kind, nm) ((kind) == open && name_is(h, nl, nm))
    int e = 0;
    switch (p->state) {
    case PS_THINK:                           /* §9.4 b: four headers close the think channel */
        if (IS(0, "think") || IS(0, "response")) p->state = PS_BETWEEN;
        else if (IS(1, "response")) p->state = PS_RESPONSE;
        else if (IS(1, "tools")) p->state = PS_TOOLS;
        else if (IS(0, "message")) p->state = PS_CLOSED;
        break;
    case PS_RESPONSE:
        if (IS(0, "response")) p->state = PS_BETWEEN;
        else if (IS(0, "message")) p->state = PS_CLOSED;      /* §9.4 d */
        else if (IS(1, "tools")) p->state = PS_TOOLS;         /* the response not closed */
        break;
    case PS_BETWEEN:
        if (IS(1, "response")) p->state = PS_RESPONSE;
        else if (IS(1, "tools")) p->state = PS_TOOLS;
        else if (IS(0, "message")) p->state = PS_CLOSED;
        break;
    case PS_TOOLS:
        if (IS(1, "call")) {
            e = call_start(p, h, n, nl);
            p->state = PS_CALL;
        } else if (IS(0, "tools")) {
            p->state = PS_BETWEEN;
        } else if (IS(0, "message")) {
            p->state = PS_CLOSED;            /* the tools channel not closed */
        }
        break;
    case PS_CALL:
        if (IS(1, "argument")) {
            e = arg_start(p, h, n, nl);
            p->state = PS_ARG;
        } else if (IS(1, "json")) {
            reset(&p->call_json);            /* a second block replaces the first */
            p->call_has_json = 1;
            p->state = PS_JSON;
        } else if (IS(0, "call")) {
            e = call_end(p, cb);
            p->state = PS_TOOLS;
        }
        break;
    case PS_ARG:
        if (IS(0, "argument")) {
            e = arg_end(p);
            p->state = PS_CALL;
        }
        break;
    case PS_JSON:
        if (IS(0, "json")) p->state = PS_CALL;
        break;
    default:
        break;
    }
#undef IS
    reset(&p->header);
    return e;
}

/* Text bytes in the current state. */
static int text(k3_chat_parser *p, const uint8_t *b, size_t n, const k3_chat_parse_cb *cb)
{
    k3_chat_buf *to;
    int ch = -1;
    switch (p->state) {
    case PS_THINK: to = &p->reasoning; ch = K3_CHAT_REASONING; break;
    case PS_RESPONSE: to = &p->content; ch = K3_CHAT_CONTENT; break;
    case PS_ARG: to = &p->arg_value; break;
    case PS_JSON: to = &p->call_json; break;
    default: return 0;                       /* between channels, tools, calls: ignored */
    }
    if (!n) return 0;
    if (k3_chat_buf_put(to, b, n)) return oom(p);
    if (ch >= 0 && cb && cb->text) cb->text(cb->ctx, (k3_chat_channel)ch, b, n);
    return 0;
}

/* A stop or the end: an unfinished header and call are dropped (§9.4 c, g). */
static void end(k3_chat_parser *p)
{
    p->hdr = 0;
    reset(&p->header);
    if (p->in_call) p->n_dropped++;
    call_clear(p);
    p->done = 1;
}

int k3_chat_parser_feed(k3_chat_parser *p, int32_t id, const k3_chat_parse_cb *cb)
{
    if (p->done) return p->status ? -1 : 1;
    if (id >= 0 && (id == p->id_eom || id == p->id_eos)) {
        end(p);
        return 1;
    }
    if (id == p->id_open || id == p->id_close) {
        if (p->hdr && header_end(p, cb)) return -1;
        p->hdr = id;
        reset(&p->header);
        return 0;
    }
    if (id == p->id_sep) {
        if (p->hdr && header_end(p, cb)) return -1;   /* a stray <|sep|> is dropped */
        return 0;
    }
    if (k3_tok_is_special(p->tok, id)) return 0;   /* no other special id is text */
    size_t n;
    const uint8_t *b = k3_tok_bytes(p->tok, id, &n);
    if (!b) return 0;
    if (!p->hdr) return text(p, b, n, cb);
    if (p->header.n + n <= K3_CHAT_HEADER_MAX)
        return k3_chat_buf_put(&p->header, b, n) ? oom(p) : 0;
    /* too long to be a header: its bytes, and these, are text (the marker is dropped) */
    p->hdr = 0;
    if (p->header.n && text(p, p->header.b, p->header.n, cb)) return -1;
    reset(&p->header);
    return text(p, b, n, cb);
}

void k3_chat_parser_finish(k3_chat_parser *p, const k3_chat_parse_cb *cb)
{
    (void)cb;                                /* nothing is held back from the channels */
    if (!p->done) end(p);
}

/* ------------------------------------------------------------------------- */
/* life and accessors                                                         */

k3_err k3_chat_parser_init(k3_chat_parser *p, const k3_tok *tok, int thinking, int tools_declared,
                           k3_diag *d)
{
    memset(p, 0, sizeof *p);
    p->tok = tok;
    p->id_open = k3_tok_special_id(tok, "<|open|>");
    p->id_close = k3_tok_special_id(tok, "<|close|>");
    p->id_sep = k3_tok_special_id(tok, "<|sep|>");
    p->id_eom = k3_tok_special_id(tok, "<|end_of_msg|>");
    p->id_eos = k3_tok_special_id(tok, "[EOS]");
    const char *missing = p->id_open < 0 ? "<|open|>" : p->id_close < 0 ? "<|close|>"
                        : p->id_sep < 0 ? "<|sep|>" : NULL;
    if (missing)
        return k3_fail(d, K3_ERR_FORMAT, "the tokenizer has no '%s': it cannot read K3's chat format",
                       missing);
    p->state = thinking ? PS_THINK : PS_RESPONSE;
    p->started_think = thinking != 0;
    p->tools_declared = tools_declared != 0;
    p->status = K3_OK;
    return K3_OK;
}

void k3_chat_parser_keep_undeclared(k3_chat_parser *p, int keep)
{
    p->keep_undeclared = keep != 0;
}

void k3_chat_parser_free(k3_chat_parser *p)
{
    call_clear(p);
    k3_chat_buf_free(&p->header);
    k3_chat_buf_free(&p->reasoning);
    k3_chat_buf_free(&p->content);
    k3_chat_buf_free(&p->call_args);
    k3_chat_buf_free(&p->call_json);
    k3_chat_buf_free(&p->arg_key);
    k3_chat_buf_free(&p->arg_type);
    k3_chat_buf_free(&p->arg_value);
    for (size_t i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        free(p->calls[i].arguments);
    }
    free(p->calls);
    p->calls = NULL;
    p->n_calls = p->cap_calls = 0;
}

int k3_chat_parser_in_think(const k3_chat_parser *p)
{
    return !p->done && p->state == PS_THINK;
}

int k3_chat_parser_in_response(const k3_chat_parser *p)
{
    return !p->done && p->state == PS_RESPONSE;
}

int k3_chat_parser_in_header(const k3_chat_parser *p)
{
    return !p->done && p->hdr != 0;
}

int k3_chat_parser_done(const k3_chat_parser *p)
{
    return p->done;
}

k3_err k3_chat_parser_status(const k3_chat_parser *p)
{
    return p->status;
}

const uint8_t *k3_chat_parser_reasoning(const k3_chat_parser *p, size_t *n)
{
    *n = p->reasoning.n;
    return p->reasoning.b ? p->reasoning.b : (const uint8_t *)"";
}

const uint8_t *k3_chat_parser_content(const k3_chat_parser *p, size_t *n)
{
    *n = p->content.n;
    return p->content.b ? p->content.b : (const uint8_t *)"";
}

size_t k3_chat_parser_n_calls(const k3_chat_parser *p)
{
    return p->n_calls;
}

const k3_chat_call *k3_chat_parser_call(const k3_chat_parser *p, size_t i)
{
    return i < p->n_calls ? &p->calls[i] : NULL;
}

size_t k3_chat_parser_n_dropped(const k3_chat_parser *p)
{
    return p->n_dropped;
}

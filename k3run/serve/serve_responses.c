/*
 * serve_responses.c - POST /v1/responses, the OpenAI Responses API of `k3run serve`
 * (docs/k3run-serve.md "POST /v1/responses"; the seam is serve_impl.h's srv_api_ops).
 *
 * A request's items become the chat-completions request K3's renderer reads (to_chat): one
 * renderer and one parser underneath, so a Responses request is the prompt of the equivalent
 * chat request, id for id, and its answer the same bytes. The generation's events become a
 * Response object, or its server-sent events (response.created ... response.completed, each with
 * its sequence_number). Finished responses are kept in a bounded store (below) so that a request
 * with previous_response_id continues one.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "chat_render.h"
#include "k3_sys.h"
#include "serve_impl.h"

/* ---- the store ------------------------------------------------------------------ */

/*
 * Finished responses (store: true, the default, as OpenAI's) are kept so that a request with
 * previous_response_id continues one. Each entry holds its whole conversation in chat form (the
 * messages without the instructions, which OpenAI does not carry over, then the answer as an
 * assistant message), so a continuation is one lookup, never a walk along a chain that an
 * eviction could have cut. Bounded twice, the oldest going first: 256 responses (the recent
 * turns of a few clients: an agent continues the response it just got, not one from long ago)
 * and 64 MiB (each entry repeats its conversation, so a long chat's entries grow with every
 * turn). An evicted or unknown id is a 404, never another conversation; ids carry 64 random
 * bits, so an id from before a restart does not name a new response.
 */
#define RESP_STORE_N 256
#define RESP_STORE_BYTES ((size_t)64 << 20)

/* The byte bound: RESP_STORE_BYTES, or K3_TEST_STORE_BYTES for the tests (which cannot send 64 MiB). */
static size_t store_cap(void)
{
    static size_t cap;
    if (!cap) {
        const char *t = getenv("K3_TEST_STORE_BYTES");
        cap = t && atoll(t) > 0 ? (size_t)atoll(t) : RESP_STORE_BYTES;
    }
    return cap;
}

typedef struct stored {
    char id[48];                   /* "resp_...", "" when deleted */
    char *conv;                    /* the conversation: a JSON array of chat messages */
    char *resp;                    /* the Response object as answered (GET /v1/responses/{id}) */
    size_t bytes;
} stored;

static struct {
    pthread_mutex_t mu;
    stored e[RESP_STORE_N];        /* a ring: the i-th oldest is e[(head + i) % RESP_STORE_N], i < n */
    unsigned head, n;
    size_t bytes;
} store = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void store_drop_oldest(void)
{
    stored *e = &store.e[store.head];
    store.bytes -= e->bytes;
    free(e->conv);
    free(e->resp);
    memset(e, 0, sizeof *e);
    store.head = (store.head + 1) % RESP_STORE_N;
    store.n--;
}

/* Keep a response (conv and resp are taken over). One larger than the byte bound is not kept. */
static void store_put(const char *id, char *conv, char *resp)
{
    size_t bytes = strlen(conv) + strlen(resp);
    pthread_mutex_lock(&store.mu);
    size_t cap = store_cap();
    if (bytes > cap) { pthread_mutex_unlock(&store.mu); free(conv); free(resp); return; }
    while (store.n && (store.n == RESP_STORE_N || store.bytes + bytes > cap)) store_drop_oldest();
    stored *e = &store.e[(store.head + store.n++) % RESP_STORE_N];
    snprintf(e->id, sizeof e->id, "%s", id);
    e->conv = conv;
    e->resp = resp;
    e->bytes = bytes;
    store.bytes += bytes;
    pthread_mutex_unlock(&store.mu);
}

/* A copy of a stored response's conversation (what = 0) or Response (what = 1), or NULL. */
static char *store_get(const char *id, int what)
{
    char *out = NULL;
    pthread_mutex_lock(&store.mu);
    for (unsigned i = 0; i < store.n; i++) {
        stored *e = &store.e[(store.head + i) % RESP_STORE_N];
        if (e->id[0] && !strcmp(e->id, id)) { out = strdup(what ? e->resp : e->conv); break; }
    }
    pthread_mutex_unlock(&store.mu);
    return out;
}

static int store_delete(const char *id)
{
    int found = 0;
    pthread_mutex_lock(&store.mu);
    for (unsigned i = 0; i < store.n && !found; i++) {
        stored *e = &store.e[(store.head + i) % RESP_STORE_N];
        if (!e->id[0] || strcmp(e->id, id)) continue;
        store.bytes -= e->bytes;           /* the slot stays in the ring, empty, until it is the oldest */
        free(e->conv);
        free(e->resp);
        memset(e, 0, sizeof *e);
        found = 1;
    }
    pthread_mutex_unlock(&store.mu);
    return found;
}

#define NOT_STORED "is not stored here: unknown, stored with 'store': false, deleted, from before a restart, or " \
                   "evicted (the server keeps its last 256 responses, at most 64 MiB)"

char *srv_responses_get(const char *id, int del, int *status, char *msg, size_t cap)
{
    char *out = NULL;
    if (del && store_delete(id)) {
        json_t *d = json_pack("{s:s,s:s,s:b}", "id", id, "object", "response", "deleted", 1);
        out = d ? json_dumps(d, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(d);
    } else if (!del) {
        out = store_get(id, 1);
    }
    if (!out) {
        *status = 404;
        snprintf(msg, cap, "the response '%.60s' %s", id, NOT_STORED);
    }
    return out;
}

/* ---- the request ------------------------------------------------------------------ */

/* A request's own, from to_chat to the job's end. */
typedef struct resp_state {
    char sfx[32];                  /* the ids' common part: resp_SFX, rs_SFX, msg_SFX, fc_SFX_I, call_SFX_I */
    char id[48];                   /* "resp_SFX" */
    json_t *echo;                  /* the request's settings the Response repeats (instructions, tools, ...) */
    json_t *conv;                  /* the conversation in chat form, without the instructions (what is stored) */
    int store;
    /* the answer (slot thread) */
    json_t *message;               /* the assistant message (chat form), once generated */
    const char *finish;            /* k3_chat_stats.finish */
    long long seq;                 /* stream: the next event's sequence_number */
    json_t *items;                 /* stream: the output items as sent (the one open: its placeholder) */
    int open;                      /* stream: the item being streamed: -1 none, 0 reasoning, 1 message */
    srv_buf text;                  /* stream: that item's text so far */
    int had_message;               /* stream: a message item was sent */
} resp_state;

static void state_free(void *p)
{
    resp_state *st = p;
    if (!st) return;
    json_decref(st->echo);
    json_decref(st->conv);
    json_decref(st->message);
    json_decref(st->items);
    free(st->text.p);
    free(st);
}

typedef struct rq {
    srv *s;
    json_t *r;                     /* the Responses request */
    json_t *c;                     /* the chat request being made */
    resp_state *st;
    char *msg;
    size_t cap;
} rq;

static int bad(rq *q, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(rq *q, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q->msg, q->cap, fmt, ap);
    va_end(ap);
    return status;
}



/* A non-empty string obj[key] (where names obj in a refusal), or NULL with a 400 in *rc. */
static const char *need_str(rq *q, json_t *obj, const char *key, const char *where, int *rc)
{
    json_t *v = srv_json_member(obj, key);
    if (!v || !json_is_string(v) || !json_string_length(v)) {
        *rc = bad(q, 400, "%s.%s is %s: give a non-empty string", where, key, v ? srv_json_type(v) : "missing");
        return NULL;
    }
    return json_string_value(v);
}

/* The parts K3 reads as text, and those it cannot (k3 is text-only). */
static int text_part(const char *t)
{
    return !strcmp(t, "input_text") || !strcmp(t, "output_text") || !strcmp(t, "text") ||
           !strcmp(t, "summary_text") || !strcmp(t, "reasoning_text") || !strcmp(t, "refusal");
}

static int media_part(const char *t)
{
    return !strcmp(t, "input_image") || !strcmp(t, "input_file") || !strcmp(t, "input_audio") ||
           !strcmp(t, "image_url") || !strcmp(t, "image") || !strcmp(t, "file");
}

/* Content (a string, or a list of text parts) into chat content (*out, new): a string stays a
   string, parts become {"type": "text", "text"} parts (a list of one part renders as its string
   does, and several stay several pieces, as in the equivalent chat request). */
static int content_of(rq *q, json_t *v, const char *where, json_t **out)
{
    *out = NULL;
    if (!v) { *out = json_null(); return 0; }
    if (json_is_string(v)) { *out = json_incref(v); return 0; }
    if (!json_is_array(v)) return bad(q, 400, "%s is %s: give a string or a list of parts", where, srv_json_type(v));
    json_t *parts = json_array();
    size_t i;
    json_t *p;
    json_array_foreach(v, i, p) {
        json_t *t = json_is_object(p) ? json_object_get(p, "type") : NULL;
        const char *type = json_is_string(t) ? json_string_value(t) : NULL;
        const char *key = type && !strcmp(type, "refusal") ? "refusal" : "text";
        json_t *text = json_object_get(p, key);
        int rc = !type ? bad(q, 400, "%s[%zu] is %s: a part is an object with a 'type' ('input_text')", where, i,
                             json_is_object(p) ? "an object without 'type'" : srv_json_type(p))
               : media_part(type) ? bad(q, 400, "%s[%zu] is an '%s' part: k3 serves a text-only model; send text "
                                        "('input_text')", where, i, type)
               : !text_part(type) ? bad(q, 400, "%s[%zu] is an '%s' part: give 'input_text' (or 'output_text')",
                                        where, i, type)
               : !json_is_string(text) ? bad(q, 400, "%s[%zu].%s is %s: give a string", where, i, key,
                                             text ? srv_json_type(text) : "missing") : 0;
        if (rc) { json_decref(parts); return rc; }
        json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", text));
    }
    *out = parts;
    return 0;
}

/* The input items into chat messages (appended to conv). */
typedef struct items_ctx {
    json_t *conv;
    json_t *reasoning;             /* a reasoning item's text waiting for its assistant turn, or NULL */
    int open;                      /* conv's last message is this input's assistant turn: calls join it */
} items_ctx;

/* An assistant turn begins (its reasoning, if one waits). */
static json_t *assistant_turn(items_ctx *x, json_t *content)
{
    json_t *m = json_pack("{s:s,s:o}", "role", "assistant", "content", content);
    if (x->reasoning) json_object_set_new(m, "reasoning_content", x->reasoning);
    x->reasoning = NULL;
    json_array_append_new(x->conv, m);
    x->open = 1;
    return m;
}

/* A reasoning item not followed by its turn's message or call (an answer cut short): a turn of its own. */
static void lone_reasoning(items_ctx *x)
{
    if (x->reasoning) assistant_turn(x, json_string(""));
    x->open = 0;
}

/* The conversation has a call with this id (a function_call_output answers one, as OpenAI requires). */
static int has_call(json_t *conv, const char *id)
{
    size_t i, k;
    json_t *m, *c;
    json_array_foreach(conv, i, m)
        json_array_foreach(json_object_get(m, "tool_calls"), k, c) {
            const char *cid = json_string_value(json_object_get(c, "id"));
            if (cid && !strcmp(cid, id)) return 1;
        }
    return 0;
}

static int one_item(rq *q, items_ctx *x, json_t *it, size_t i)
{
    char where[64];
    int rc = 0;
    snprintf(where, sizeof where, "input[%zu]", i);
    if (!json_is_object(it)) return bad(q, 400, "%s is %s: give an item (an object)", where, srv_json_type(it));
    json_t *tv = srv_json_member(it, "type");
    if (tv && !json_is_string(tv)) return bad(q, 400, "%s.type is %s: give a string", where, srv_json_type(tv));
    const char *type = tv ? json_string_value(tv) : srv_json_member(it, "role") ? "message" : NULL;
    if (!type) return bad(q, 400, "%s has no 'type' and no 'role': give a message, function_call, "
                          "function_call_output or reasoning item", where);
    if (!strcmp(type, "message")) {
        const char *role = need_str(q, it, "role", where, &rc);
        if (!role) return rc;
        int assistant = !strcmp(role, "assistant");
        if (!assistant && strcmp(role, "user") && strcmp(role, "system") && strcmp(role, "developer"))
            return bad(q, 400, "%s.role is '%s': give user, assistant, system or developer", where, role);
        char w[80];
        snprintf(w, sizeof w, "%s.content", where);
        json_t *content;
        if ((rc = content_of(q, srv_json_member(it, "content"), w, &content))) return rc;
        if (assistant) {
            assistant_turn(x, content);
        } else {
            lone_reasoning(x);
            /* developer is OpenAI's newer name for system; K3 knows system */
            json_array_append_new(x->conv, json_pack("{s:s,s:o}", "role", !strcmp(role, "user") ? "user" : "system",
                                                     "content", content));
        }
    } else if (!strcmp(type, "function_call")) {
        const char *call_id = need_str(q, it, "call_id", where, &rc);
        if (!call_id) return rc;
        const char *name = need_str(q, it, "name", where, &rc);
        if (!name) return rc;
        json_t *args = srv_json_member(it, "arguments");
        if (args && !json_is_string(args) && !json_is_object(args))
            return bad(q, 400, "%s.arguments is %s: give the arguments as a JSON string", where, srv_json_type(args));
        /* the calls after an assistant message (or its reasoning) are that turn's, as in a chat message */
        if (x->reasoning || !x->open) assistant_turn(x, json_null());
        json_t *m = json_array_get(x->conv, json_array_size(x->conv) - 1), *calls = json_object_get(m, "tool_calls");
        if (!calls) json_object_set_new(m, "tool_calls", calls = json_array());
        json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:o}}", "id", call_id, "type", "function", "function",
                                               "name", name, "arguments", args ? json_incref(args) : json_string("")));
    } else if (!strcmp(type, "function_call_output")) {
        const char *call_id = need_str(q, it, "call_id", where, &rc);
        if (!call_id) return rc;
        if (!has_call(x->conv, call_id))
            return bad(q, 400, "%s.call_id '%.80s' answers no function_call of the conversation: send the call "
                       "first (a function_call item, or the response that made it as 'previous_response_id')",
                       where, call_id);
        lone_reasoning(x);
        json_t *out = srv_json_member(it, "output"), *content;
        char w[80];
        snprintf(w, sizeof w, "%s.output", where);
        if (!out) return bad(q, 400, "%s.output is missing: give the tool's result as a string", where);
        if ((rc = content_of(q, out, w, &content))) return rc;
        json_array_append_new(x->conv, json_pack("{s:s,s:s,s:o}", "role", "tool", "tool_call_id", call_id, "content",
                                                 content));
    } else if (!strcmp(type, "reasoning")) {
        lone_reasoning(x);
        /* the text (reasoning_text parts, as this server answers), else the summary's */
        srv_buf b = {0};
        const char *keys[2] = {"content", "summary"};
        for (int k = 0; k < 2 && !b.n; k++) {
            json_t *parts = srv_json_member(it, keys[k]), *p;
            size_t j;
            if (parts && !json_is_array(parts)) {
                free(b.p);
                return bad(q, 400, "%s.%s is %s: give a list of parts", where, keys[k], srv_json_type(parts));
            }
            json_array_foreach(parts, j, p) {
                json_t *t = json_is_object(p) ? json_object_get(p, "text") : NULL;
                if (!json_is_string(t)) {
                    free(b.p);
                    return bad(q, 400, "%s.%s[%zu] has no 'text' string", where, keys[k], j);
                }
                if (k && b.n) srv_buf_add(&b, "\n\n", 2);
                srv_buf_add(&b, json_string_value(t), json_string_length(t));
            }
        }
        if (b.n) x->reasoning = json_stringn(b.p, b.n);
        free(b.p);
    } else if (!strcmp(type, "item_reference")) {
        return bad(q, 400, "%s is an item_reference: not supported; send the item itself, or continue a stored "
                   "response with 'previous_response_id'", where);
    } else {
        return bad(q, 400, "%s is a '%s' item: k3 takes message, function_call, function_call_output and reasoning "
                   "items", where, type);
    }
    return 0;
}

static int input_items(rq *q, json_t *input)
{
    items_ctx x = {.conv = q->st->conv};
    if (json_is_string(input)) {
        json_array_append_new(x.conv, json_pack("{s:s,s:O}", "role", "user", "content", input));
        return 0;
    }
    if (!json_is_array(input)) return bad(q, 400, "'input' is %s: give a string or a list of items", srv_json_type(input));
    size_t i;
    json_t *it;
    json_array_foreach(input, i, it) {
        int rc = one_item(q, &x, it, i);
        if (rc) { json_decref(x.reasoning); return rc; }
    }
    lone_reasoning(&x);
    return 0;
}

/* tools: the flat function tools into the chat-completions wrapper; built-in tools refused. */
static int tools_of(rq *q, json_t *tools)
{
    if (!json_is_array(tools)) return bad(q, 400, "'tools' is %s: give a list of function tools", srv_json_type(tools));
    json_t *out = json_array(), *t;
    size_t i;
    json_array_foreach(tools, i, t) {
        json_t *tv = json_is_object(t) ? json_object_get(t, "type") : NULL;
        const char *type = json_is_string(tv) ? json_string_value(tv) : NULL;
        if (!type) { json_decref(out); return bad(q, 400, "'tools'[%zu] has no 'type': give {\"type\": \"function\", "
                                                  "\"name\", \"parameters\"}", i); }
        if (strcmp(type, "function")) {
            json_decref(out);
            return bad(q, 400, "'tools'[%zu] is a built-in tool ('%s'): k3 serves function tools only (the client "
                       "runs them); give {\"type\": \"function\", \"name\", \"parameters\"}", i, type);
        }
        json_t *fn = json_object(), *w = srv_json_member(t, "function");
        json_t *src = w && json_is_object(w) && !srv_json_member(t, "name") ? w : t;   /* the chat wrapper, taken too */
        const char *keys[4] = {"name", "description", "parameters", "strict"};
        for (int k = 0; k < 4; k++)
            if (json_object_get(src, keys[k])) json_object_set(fn, keys[k], json_object_get(src, keys[k]));
        json_t *name = srv_json_member(fn, "name");
        if (!name || !json_is_string(name) || !json_string_length(name)) {
            json_decref(fn);
            json_decref(out);
            return bad(q, 400, "'tools'[%zu].name is %s: give the function's name", i,
                       name ? srv_json_type(name) : "missing");
        }
        json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn));
    }
    json_object_set_new(q->c, "tools", out);
    return 0;
}

static int tool_choice_of(rq *q, json_t *v)
{
    if (json_is_string(v)) {
        const char *c = json_string_value(v);
        if (strcmp(c, "auto") && strcmp(c, "none") && strcmp(c, "required"))
            return bad(q, 400, "'tool_choice' is '%s': give auto, none, required or {\"type\": \"function\", "
                       "\"name\"}", c);
        json_object_set(q->c, "tool_choice", v);
        return 0;
    }
    json_t *t = json_is_object(v) ? srv_json_member(v, "type") : NULL, *name = json_is_object(v) ? srv_json_member(v, "name") : NULL;
    if (!t || !json_is_string(t) || strcmp(json_string_value(t), "function") || !json_is_string(name))
        return bad(q, 400, "'tool_choice' is not supported as given: give auto, none, required or "
                   "{\"type\": \"function\", \"name\"} (k3 has function tools only)");
    json_object_set_new(q->c, "tool_choice", json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", name));
    return 0;
}

/*
 * reasoning.effort: K3 has three efforts (low, high, max) and an off switch; OpenAI's five are
 * spread over them in order, its top (high) on K3's top (max). Absent or null leaves K3's default
 * (max), as a chat request without reasoning_effort does.
 */
static int reasoning_of(rq *q, json_t *v)
{
    static const char *const map[][2] = {
        {"none", "none"}, {"minimal", "low"}, {"low", "low"}, {"medium", "high"}, {"high", "max"}, {"xhigh", "max"},
        {"max", "max"},
    };
    if (!json_is_object(v)) return bad(q, 400, "'reasoning' is %s: give {\"effort\": ...}", srv_json_type(v));
    json_t *e = srv_json_member(v, "effort");
    if (!e) return 0;
    for (size_t i = 0; json_is_string(e) && i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(json_string_value(e), map[i][0])) {
            json_object_set_new(q->c, "reasoning_effort", json_string(map[i][1]));
            return 0;
        }
    return bad(q, 400, "'reasoning.effort' is %s%s%s: give none (thinking off), minimal, low, medium or high",
               json_is_string(e) ? "'" : srv_json_type(e), json_is_string(e) ? json_string_value(e) : "",
               json_is_string(e) ? "'" : "");
}

/* text.format: text, or json_object / json_schema as the chat request's response_format (K3's renderer
   adds its message for them). */
static int text_of(rq *q, json_t *v)
{
    if (!json_is_object(v)) return bad(q, 400, "'text' is %s: give {\"format\": ...}", srv_json_type(v));
    json_t *f = srv_json_member(v, "format"), *t = f && json_is_object(f) ? srv_json_member(f, "type") : NULL;
    if (!f) return 0;
    const char *type = t && json_is_string(t) ? json_string_value(t) : "";
    if (!strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_object")) {
        json_object_set_new(q->c, "response_format", json_pack("{s:s}", "type", "json_object"));
        return 0;
    }
    if (!strcmp(type, "json_schema")) {
        json_t *schema = srv_json_member(f, "schema");
        if (!schema || !json_is_object(schema))
            return bad(q, 400, "'text.format.schema' is %s: give the JSON schema (an object)",
                       schema ? srv_json_type(schema) : "missing");
        json_t *js = json_object();
        const char *keys[4] = {"name", "description", "schema", "strict"};
        for (int k = 0; k < 4; k++)
            if (json_object_get(f, keys[k])) json_object_set(js, keys[k], json_object_get(f, keys[k]));
        json_object_set_new(q->c, "response_format", json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js));
        return 0;
    }
    return bad(q, 400, "'text.format' is not supported as given: give {\"type\": \"text\"}, \"json_object\" or "
               "\"json_schema\"");
}

/*
 * truncation "auto": when the conversation does not fit the context, the oldest messages after
 * the leading system ones go, never leaving a tool result without its call: the fewest that make
 * it fit (rendered with K3's renderer; a binary search, as fewer messages never render longer).
 */
static int renders_within(rq *q, json_t *msgs, size_t keep, size_t from, uint32_t ctx, int *fits)
{
    json_t *c = json_copy(q->c), *m = json_array();
    for (size_t i = 0; i < json_array_size(msgs); i++)
        if (i < keep || i >= from) json_array_append(m, json_array_get(msgs, i));
    json_object_set_new(c, "messages", m);
    char *t = json_dumps(c, JSON_COMPACT);
    json_decref(c);
    if (!t) return bad(q, 500, "out of memory");
    k3_chat_prompt pr = {0};
    k3_diag d;
    k3_err e = k3_chat_render(q->s->tok, t, strlen(t), "the request", &pr, &d);
    free(t);
    *fits = !e && pr.n_ids < ctx;
    k3_chat_prompt_free(&pr);
    return 0;
}

static const char *role_of(const json_t *m)
{
    const char *r = json_string_value(json_object_get(m, "role"));
    return r ? r : "";
}

static int truncate_auto(rq *q)
{
    json_t *msgs = json_object_get(q->c, "messages");
    size_t n = json_array_size(msgs), keep = 0;
    uint32_t ctx = q->s->context;
    int fits, rc;
    while (keep < n && !strcmp(role_of(json_array_get(msgs, keep)), "system")) keep++;
    if ((rc = renders_within(q, msgs, keep, keep, ctx, &fits)) || fits) return rc;
    /* cuts: the first message kept after the system ones; never a tool result, never the last turn away */
    size_t *cut = malloc((n + 1) * sizeof *cut), nc = 0;    /* [nc] candidate first-kept indices, ascending */
    if (!cut) return bad(q, 500, "out of memory");
    for (size_t i = keep + 1; i < n; i++)
        if (strcmp(role_of(json_array_get(msgs, i)), "tool")) cut[nc++] = i;
    size_t lo = 0, hi = nc;                                  /* the answer is in [lo, hi]; hi = none fits */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((rc = renders_within(q, msgs, keep, cut[mid], ctx, &fits))) { free(cut); return rc; }
        if (fits) hi = mid; else lo = mid + 1;
    }
    if (lo < nc) {                                           /* else the request is refused as it is */
        json_t *m = json_array();
        for (size_t i = 0; i < n; i++)
            if (i < keep || i >= cut[lo]) json_array_append(m, json_array_get(msgs, i));
        json_object_set_new(q->c, "messages", m);
    }
    free(cut);
    return 0;
}

/* A field copied to the chat request as it is (srv_api_parse checks it under the same name). */
static void pass(rq *q, const char *key)
{
    json_t *v = srv_json_member(q->r, key);
    if (v) json_object_set(q->c, key, v);
}

static void new_suffix(char *out, size_t cap)
{
    static unsigned long long seq;
    unsigned long long rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd)
        rnd = (unsigned long long)(k3_now() * 1e9) ^ ((unsigned long long)time(NULL) << 32);
    snprintf(out, cap, "%016llx%06llx", rnd, __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED) & 0xffffff);
}

/* A float setting as the shortest decimal that is that float (0.95, not 0.949999988079071). */
static json_t *float_json(float f)
{
    char b[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(b, sizeof b, "%.*g", p, (double)f);
        if ((float)strtod(b, NULL) == f) break;
    }
    return json_real(strtod(b, NULL));
}

static int request(rq *q)
{
    json_t *r = q->r, *v, *echo = q->st->echo;
    int rc;
    static const char *const refused[][2] = {
        {"background", "'background' is not supported: k3 answers while the connection waits (or streams)"},
        {"conversation", "'conversation' (the Conversations API) is not supported: continue a response with "
                         "'previous_response_id', or send the whole conversation in 'input'"},
        {"prompt", "'prompt' (a stored prompt template) is not supported: send 'instructions' and 'input'"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if ((v = srv_json_member(r, refused[i][0])) && !json_is_false(v)) return bad(q, 400, "%s", refused[i][1]);
    if ((v = srv_json_member(r, "top_logprobs")) && !(json_is_integer(v) && json_integer_value(v) == 0))
        return bad(q, 400, "'top_logprobs' is not supported");
    pass(q, "model");
    /* the conversation: a stored one continued, then the input */
    json_t *input = srv_json_member(r, "input"), *prev = srv_json_member(r, "previous_response_id");
    if (prev && !json_is_string(prev))
        return bad(q, 400, "'previous_response_id' is %s: give a response's id", srv_json_type(prev));
    if (!input) return bad(q, 400, "no 'input': give the user's text, or a list of items");
    if (json_is_array(input) && !json_array_size(input) && !prev)
        return bad(q, 400, "'input' is empty: give at least one item");
    if (prev) {
        char *conv = store_get(json_string_value(prev), 0);
        if (!conv) return bad(q, 404, "previous_response_id '%.60s' %s", json_string_value(prev), NOT_STORED);
        json_decref(q->st->conv);
        q->st->conv = json_loads(conv, JSON_ALLOW_NUL, NULL);
        free(conv);
        if (!q->st->conv) return bad(q, 500, "out of memory");
    }
    if ((rc = input_items(q, input))) return rc;
    json_t *ins = srv_json_member(r, "instructions"), *msgs;
    if (ins && !json_is_string(ins)) return bad(q, 400, "'instructions' is %s: give a string", srv_json_type(ins));
    msgs = json_array();
    if (ins) json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", ins));
    json_array_extend(msgs, q->st->conv);
    json_object_set_new(q->c, "messages", msgs);
    /* tools, output and sampling */
    if ((v = srv_json_member(r, "tools")) && (rc = tools_of(q, v))) return rc;
    if ((v = srv_json_member(r, "tool_choice")) && (rc = tool_choice_of(q, v))) return rc;
    if ((v = srv_json_member(r, "reasoning")) && (rc = reasoning_of(q, v))) return rc;
    if ((v = srv_json_member(r, "text")) && (rc = text_of(q, v))) return rc;
    if ((v = srv_json_member(r, "max_output_tokens"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > (1 << 30))
            return bad(q, 400, "'max_output_tokens' is %s: give an integer from 1 to %d",
                       json_is_integer(v) ? "out of range" : srv_json_type(v), 1 << 30);
        json_object_set(q->c, "max_tokens", v);
    }
    static const char *const passed[] = {"temperature", "top_p", "stream", "seed", "top_k", "min_p", "repeat_penalty",
                                         "stop"};
    for (size_t i = 0; i < sizeof passed / sizeof passed[0]; i++) pass(q, passed[i]);
    /* the Response's own settings */
    q->st->store = 1;
    if ((v = srv_json_member(r, "store"))) {
        if (!json_is_boolean(v)) return bad(q, 400, "'store' is %s: give true or false", srv_json_type(v));
        q->st->store = json_is_true(v);
    }
    json_t *meta = srv_json_member(r, "metadata"), *ptc = srv_json_member(r, "parallel_tool_calls"), *tr = srv_json_member(r, "truncation");
    json_t *user = srv_json_member(r, "user");
    if (meta && !json_is_object(meta)) return bad(q, 400, "'metadata' is %s: give an object", srv_json_type(meta));
    if (ptc && !json_is_boolean(ptc))
        return bad(q, 400, "'parallel_tool_calls' is %s: give true or false", srv_json_type(ptc));
    const char *trs = json_string_value(tr);
    if (tr && (!trs || (strcmp(trs, "auto") && strcmp(trs, "disabled"))))
        return bad(q, 400, "'truncation' is not 'auto' or 'disabled'");
    if (trs && !strcmp(trs, "auto") && (rc = truncate_auto(q))) return rc;
    /* the settings the Response repeats: as given, else what the answer ran with */
    json_t *reas = srv_json_member(r, "reasoning"), *text = srv_json_member(r, "text"), *fmt = text ? srv_json_member(text, "format") : NULL;
    struct { const char *key; json_t *given, *dflt; } echoes[] = {
        {"instructions", ins, json_null()},
        {"max_output_tokens", srv_json_member(r, "max_output_tokens"), json_null()},
        {"parallel_tool_calls", ptc, json_true()},
        {"previous_response_id", prev, json_null()},
        {"reasoning", NULL, json_pack("{s:O,s:O}", "effort", reas && srv_json_member(reas, "effort") ? srv_json_member(reas, "effort")
                                      : json_null(), "summary", reas && srv_json_member(reas, "summary") ? srv_json_member(reas, "summary")
                                      : json_null())},
        {"store", NULL, json_boolean(q->st->store)},
        {"temperature", srv_json_member(r, "temperature"), float_json(q->s->so.temp)},
        {"text", NULL, json_pack("{s:o}", "format", fmt ? json_incref(fmt) : json_pack("{s:s}", "type", "text"))},
        {"tool_choice", srv_json_member(r, "tool_choice"), json_string("auto")},
        {"tools", srv_json_member(r, "tools"), json_array()},
        {"top_p", srv_json_member(r, "top_p"), float_json(q->s->so.top_p)},
        {"truncation", tr, json_string("disabled")},
        {"user", user, json_null()},
        {"metadata", meta, json_object()},
    };
    for (size_t i = 0; i < sizeof echoes / sizeof echoes[0]; i++) {
        json_object_set(echo, echoes[i].key, echoes[i].given ? echoes[i].given : echoes[i].dflt);
        json_decref(echoes[i].dflt);
    }
    return 0;
}

static int to_chat(srv *s, const char *body, size_t len, char **chat, size_t *chat_len, void **state, char *msg,
                   size_t cap)
{
    rq q = {.s = s, .msg = msg, .cap = cap};
    if (len == 0) return bad(&q, 400, "the request body is empty: send a JSON object");
    json_error_t je;
    q.r = json_loadb(body, len, JSON_ALLOW_NUL, &je);
    if (!q.r) return bad(&q, 400, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    int rc = 0;
    resp_state *st = calloc(1, sizeof *st);
    q.st = st;
    q.c = json_object();
    if (!st || !q.c || !(st->echo = json_object()) || !(st->conv = json_array())) {
        rc = bad(&q, 500, "out of memory");
        goto out;
    }
    if (!json_is_object(q.r)) { rc = bad(&q, 400, "the body is %s, not a JSON object", srv_json_type(q.r)); goto out; }
    if ((rc = request(&q))) goto out;
    new_suffix(st->sfx, sizeof st->sfx);
    snprintf(st->id, sizeof st->id, "resp_%s", st->sfx);
    st->open = -1;
    if (!(*chat = json_dumps(q.c, JSON_COMPACT | JSON_PRESERVE_ORDER))) {   /* reals exact: 17 digits */
        rc = bad(&q, 500, "out of memory");
        goto out;
    }
    *chat_len = strlen(*chat);
    *state = st;
    st = NULL;
out:
    state_free(st);
    json_decref(q.c);
    json_decref(q.r);
    return rc;
}

static void adjust(srv_job *j)
{
    resp_state *st = j->api_state;
    snprintf(j->id, sizeof j->id, "%s", st->id);
}

/* ---- the answer ------------------------------------------------------------------------ */

static json_t *usage_json(const k3_chat_stats *a)
{
    return json_pack("{s:i,s:{s:i},s:i,s:{s:i},s:i}", "input_tokens", (json_int_t)a->prompt_tokens,
                     "input_tokens_details", "cached_tokens", (json_int_t)a->cached_tokens, "output_tokens",
                     (json_int_t)a->completion_tokens, "output_tokens_details", "reasoning_tokens",
                     (json_int_t)a->reasoning_tokens, "total_tokens",
                     (json_int_t)(a->prompt_tokens + a->completion_tokens));
}

/* The Response object (output and usage stolen; usage NULL: null). */
static json_t *response_json(run_ctx *r, const char *status, json_t *output, json_t *usage)
{
    srv_job *j = r->j;
    resp_state *st = j->api_state;
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:n,s:n,s:s,s:o}", "id", j->id, "object", "response", "created_at",
                          (json_int_t)j->created, "status", status, "error", "incomplete_details", "model", j->model,
                          "output", output);
    if (!o) { json_decref(usage); return NULL; }
    if (strcmp(status, "in_progress")) {
        /* the message items' text, as the SDKs' output_text has it (openai-node 4.x's stream helper
           takes it from the final event's Response; OpenAI's own answers leave it to the SDKs) */
        srv_buf t = {0};
        json_t *it, *part;
        size_t i, k;
        json_array_foreach(output, i, it)
            if (!strcmp(json_string_value(json_object_get(it, "type")), "message"))
                json_array_foreach(json_object_get(it, "content"), k, part)
                    srv_buf_add(&t, json_string_value(json_object_get(part, "text")),
                                json_string_length(json_object_get(part, "text")));
        json_object_set_new(o, "output_text", json_stringn(t.p ? t.p : "", t.n));
        free(t.p);
    }
    json_object_set_new(o, "usage", usage ? usage : json_null());
    json_object_update(o, st->echo);
    return o;
}

static void call_ids(const resp_state *st, int i, char *fc, char *call, size_t cap)
{
    snprintf(fc, cap, "fc_%s_%d", st->sfx, i + 1);
    snprintf(call, cap, "call_%s_%d", st->sfx, i + 1);
}

static json_t *reasoning_item(const resp_state *st, const char *text)   /* text NULL: being streamed */
{
    char id[48];
    snprintf(id, sizeof id, "rs_%s", st->sfx);
    json_t *c = text ? json_pack("[{s:s,s:s}]", "type", "reasoning_text", "text", text) : json_array();
    return json_pack("{s:s,s:s,s:[],s:o}", "id", id, "type", "reasoning", "summary", "content", c);
}

static json_t *text_part_json(const char *text)
{
    return json_pack("{s:s,s:s,s:[]}", "type", "output_text", "text", text, "annotations");
}

static json_t *message_item(const resp_state *st, const char *status, const char *text)   /* text NULL: streamed */
{
    char id[48];
    snprintf(id, sizeof id, "msg_%s", st->sfx);
    return json_pack("{s:s,s:s,s:s,s:s,s:o}", "id", id, "type", "message", "status", status, "role", "assistant",
                     "content", text ? json_pack("[o]", text_part_json(text)) : json_array());
}

static json_t *call_item(const resp_state *st, int i, const char *status, const char *name, const char *args)
{
    char fc[80], call[80];
    call_ids(st, i, fc, call, sizeof fc);
    return json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "id", fc, "type", "function_call", "status", status, "arguments",
                     args, "call_id", call, "name", name);
}

static const char *item_status(const resp_state *st)
{
    return st->finish && (!strcmp(st->finish, "length") || !strcmp(st->finish, "interrupted")) ? "incomplete"
                                                                                                 : "completed";
}

/* The output items of a finished message: reasoning (when there is), the message (when it has
   text, or no calls), the calls. */
static json_t *output_of(const resp_state *st)
{
    json_t *out = json_array(), *m = st->message;
    json_t *rc = json_object_get(m, "reasoning_content"), *c = json_object_get(m, "content");
    json_t *calls = json_object_get(m, "tool_calls"), *call;
    if (json_is_string(rc) && json_string_length(rc))
        json_array_append_new(out, reasoning_item(st, json_string_value(rc)));
    if (json_is_string(c)) json_array_append_new(out, message_item(st, item_status(st), json_string_value(c)));
    size_t i;
    json_array_foreach(calls, i, call) {
        json_t *f = json_object_get(call, "function");
        json_array_append_new(out, call_item(st, (int)i, "completed", json_string_value(json_object_get(f, "name")),
                                             json_string_value(json_object_get(f, "arguments"))));
    }
    return out;
}

/* The answer's JSON: reals with 15 significant digits (DBL_DIG: a value the client wrote with at most
   15 digits, a temperature of 0.8, comes back as written, not as 0.80000000000000004). */
static char *dump(const json_t *doc)
{
    return json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
}

/* A stream event: its data gets "type" first and its sequence_number (ev stolen). */
static void emit(run_ctx *r, const char *type, json_t *ev)
{
    resp_state *st = r->j->api_state;
    json_t *e = json_pack("{s:s}", "type", type);
    if (!e) { json_decref(ev); return; }
    json_object_update(e, ev);
    json_decref(ev);
    json_object_set_new(e, "sequence_number", json_integer(st->seq++));
    char *d = dump(e), *t = NULL;
    if (d && asprintf(&t, "event: %s\ndata: %s\n\n", type, d) > 0) srv_put(r->s, r->j, t, 0);
    free(d);
    free(t);
    json_decref(e);
}

static void rs_begin(run_ctx *r)
{
    resp_state *st = r->j->api_state;
    st->items = json_array();
    st->open = -1;
    if (!r->j->stream) return;
    json_t *resp = response_json(r, "in_progress", json_array(), NULL);
    emit(r, "response.created", json_pack("{s:O}", "response", resp));
    emit(r, "response.in_progress", json_pack("{s:o}", "response", resp));
}

static void rs_start(run_ctx *r)
{
    (void)r;
}

static json_t *item_ref(const resp_state *st, size_t index)
{
    json_t *it = json_array_get(st->items, index);
    return json_pack("{s:O,s:i}", "item_id", json_object_get(it, "id"), "output_index", (json_int_t)index);
}

/* Stream: the reasoning (0) or message (1) item opens: it and its one part are announced. */
static void open_item(run_ctx *r, int channel)
{
    resp_state *st = r->j->api_state;
    size_t index = json_array_size(st->items);
    json_t *it = channel ? message_item(st, "in_progress", NULL) : reasoning_item(st, NULL);
    json_array_append(st->items, it);
    emit(r, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", (json_int_t)index, "item", it));
    json_t *ev = item_ref(st, index);
    json_object_set_new(ev, "content_index", json_integer(0));
    json_object_set_new(ev, "part", channel ? text_part_json("") : json_pack("{s:s,s:s}", "type", "reasoning_text",
                                                                              "text", ""));
    emit(r, "response.content_part.added", ev);
    st->open = channel;
    st->text.n = 0;
    if (st->text.p) st->text.p[0] = 0;
    if (channel) st->had_message = 1;
}

/* Stream: the open item is complete: its text, its part and itself, whole. */
static void close_item(run_ctx *r)
{
    resp_state *st = r->j->api_state;
    if (st->open < 0) return;
    size_t index = json_array_size(st->items) - 1;
    const char *text = st->text.p ? st->text.p : "";
    json_t *ev = item_ref(st, index);
    json_object_set_new(ev, "content_index", json_integer(0));
    json_object_set_new(ev, "text", json_string(text));
    if (st->open) json_object_set_new(ev, "logprobs", json_array());
    emit(r, st->open ? "response.output_text.done" : "response.reasoning_text.done", ev);
    ev = item_ref(st, index);
    json_object_set_new(ev, "content_index", json_integer(0));
    json_object_set_new(ev, "part", st->open ? text_part_json(text) : json_pack("{s:s,s:s}", "type", "reasoning_text",
                                                                                "text", text));
    emit(r, "response.content_part.done", ev);
    json_t *it = st->open ? message_item(st, item_status(st), text) : reasoning_item(st, text);
    json_array_set(st->items, index, it);
    emit(r, "response.output_item.done", json_pack("{s:i,s:o}", "output_index", (json_int_t)index, "item", it));
    st->open = -1;
    st->text.n = 0;
    if (st->text.p) st->text.p[0] = 0;
}

static void rs_text(run_ctx *r, int channel, const char *t)
{
    resp_state *st = r->j->api_state;
    if (st->open != channel) {
        close_item(r);
        open_item(r, channel);
    }
    srv_buf_add(&st->text, t, strlen(t));
    json_t *ev = item_ref(st, json_array_size(st->items) - 1);
    json_object_set_new(ev, "content_index", json_integer(0));
    json_object_set_new(ev, "delta", json_string(t));
    if (channel) json_object_set_new(ev, "logprobs", json_array());
    emit(r, channel ? "response.output_text.delta" : "response.reasoning_text.delta", ev);
}

/* Stream: a call comes whole (K3's parser gives it complete): its arguments in one delta. */
static void rs_call(run_ctx *r, int i, const char *name, const char *arguments)
{
    resp_state *st = r->j->api_state;
    close_item(r);
    size_t index = json_array_size(st->items);
    json_t *it = call_item(st, i, "in_progress", name, "");
    json_array_append(st->items, it);
    emit(r, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", (json_int_t)index, "item", it));
    json_t *ev = item_ref(st, index);
    json_object_set_new(ev, "delta", json_string(arguments));
    emit(r, "response.function_call_arguments.delta", ev);
    ev = item_ref(st, index);
    json_object_set_new(ev, "arguments", json_string(arguments));
    emit(r, "response.function_call_arguments.done", ev);
    it = call_item(st, i, "completed", name, arguments);
    json_array_set(st->items, index, it);
    emit(r, "response.output_item.done", json_pack("{s:i,s:o}", "output_index", (json_int_t)index, "item", it));
}

static void rs_choice(run_ctx *r, const k3_chat_stats *stats, const char *message, const char *text, size_t text_len)
{
    resp_state *st = r->j->api_state;
    (void)text;
    (void)text_len;
    st->finish = stats->finish;
    json_decref(st->message);
    st->message = json_loads(message, JSON_ALLOW_NUL, NULL);
    if (!r->j->stream) return;
    close_item(r);
    /* an answer with no text and no call is an empty message, streamed as the body gives it */
    if (!st->had_message && json_is_string(json_object_get(st->message, "content"))) {
        open_item(r, 1);
        close_item(r);
    }
}

/* The conversation to store: the input's, then the answer with its calls under the ids the client
   was given (a function_call_output names them). */
static char *stored_conv(const resp_state *st)
{
    json_t *m = json_deep_copy(st->message), *calls = json_object_get(m, "tool_calls"), *call;
    json_t *rc = json_object_get(m, "reasoning_content");
    if (json_is_string(rc) && !json_string_length(rc)) json_object_del(m, "reasoning_content");
    size_t i;
    json_array_foreach(calls, i, call) {
        char fc[80], id[80];
        call_ids(st, (int)i, fc, id, sizeof fc);
        json_object_set_new(call, "id", json_string(id));
    }
    json_t *conv = json_copy(st->conv);
    json_array_append_new(conv, m);
    char *t = json_dumps(conv, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(conv);
    return t;
}

static void rs_end(run_ctx *r, const k3_chat_stats *all, json_t *k3)
{
    srv_job *j = r->j;
    resp_state *st = j->api_state;
    const char *status = item_status(st);
    json_t *out = j->stream ? json_incref(st->items) : output_of(st);
    json_t *resp = response_json(r, status, out, usage_json(all));
    if (strcmp(status, "completed"))
        json_object_set_new(resp, "incomplete_details", json_pack("{s:s}", "reason", !strcmp(st->finish, "length")
                                                                   ? "max_output_tokens" : "interrupted"));
    json_object_set_new(resp, "k3", k3);
    /* stored before the answer goes out: a client that continues it at once finds it */
    if (st->store && st->message) {
        char *conv = stored_conv(st), *body = dump(resp);
        if (conv && body) store_put(st->id, conv, body);
        else { free(conv); free(body); }
    }
    if (j->stream) {
        emit(r, strcmp(status, "completed") ? "response.incomplete" : "response.completed",
             json_pack("{s:o}", "response", resp));
    } else {
        char *body = dump(resp);
        j->status = body ? 200 : 500;
        srv_put(r->s, j, body ? body : "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                "\"param\":null,\"code\":500}}", 0);
        free(body);
        json_decref(resp);
    }
}

/* A failure after the request was accepted. Streamed: OpenAI's `error` event (the SDKs raise it),
   then response.failed with what was sent. */
static void rs_fail(run_ctx *r, int status, const char *msg)
{
    srv_job *j = r->j;
    resp_state *st = j->api_state;
    if (!j->stream) {
        char *e = srv_api_error_json(status, msg);
        if (e) srv_put(r->s, j, e, 0);
        free(e);
        return;
    }
    const char *code = status >= 500 ? "server_error" : "invalid_prompt";
    emit(r, "error", json_pack("{s:s,s:s,s:n}", "code", code, "message", msg, "param"));
    json_t *resp = response_json(r, "failed", st->items ? json_incref(st->items) : json_array(), NULL);
    json_object_set_new(resp, "error", json_pack("{s:s,s:s}", "code", code, "message", msg));
    emit(r, "response.failed", json_pack("{s:o}", "response", resp));
}

const srv_api_ops srv_api_responses = {
    .name = "responses", .to_chat = to_chat, .adjust = adjust, .begin = rs_begin, .start = rs_start,
    .text = rs_text, .call = rs_call, .choice = rs_choice, .end = rs_end, .fail = rs_fail,
    .error_json = srv_api_error_json, .free_state = state_free, .keepalive = ": keep-alive\n\n",
};

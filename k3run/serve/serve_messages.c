/*
 * serve_messages.c - POST /v1/messages and /v1/messages/count_tokens of `k3run serve`: the
 * Anthropic Messages API (docs/k3run-serve.md) over the renderer, parser and generation of
 * /v1/chat/completions (serve_impl.h "srv_api_ops").
 *
 * A Messages request becomes the chat-completions request that says the same conversation
 * (to_chat): the system prompt a system message, content blocks OpenAI parts one for one (each
 * part is its own piece of the prompt, as each block is its own text), tool_result blocks tool
 * messages, thinking blocks reasoning_content, tool_use blocks tool_calls. So a Messages request
 * renders to exactly the prompt of its chat-completions twin, and nothing here knows K3's format.
 * The generation's events become the Messages answer: content blocks (thinking, text, tool_use),
 * a stop_reason, Anthropic's usage; streamed, the events message_start, ping, content_block_*,
 * message_delta and message_stop.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_json.h"
#include "chat_render.h"
#include "k3_log.h"
#include "k3_utf8.h"
#include "serve_impl.h"

#define MSG_MAX_STOPS 16                    /* as the chat endpoint's 'stop' */
/* A call whose arguments are not a JSON object (the model wrote a raw json block that does not
   parse) has input {RAW_KEY: its text}; sent back, that input is the same arguments again. */
#define RAW_KEY "k3_raw_arguments"

enum { BLK_NONE, BLK_THINKING, BLK_TEXT, BLK_TOOL };

/* A Messages request's own (the job's api_state): what the chat request cannot say, then its
   answer's progress on the slot's thread. */
typedef struct msg_state {
    uint32_t think_budget;                  /* thinking.budget_tokens; 0: the server's --think-budget */
    int block;                              /* stream: index of the open (or next) content block */
    int open;                               /* stream: the open block's kind, BLK_NONE */
    const char *stop_reason;                /* the answer's, once its choice ended */
    const char *stop_sequence;              /* the stop string that ended it (the job's), or NULL */
} msg_state;

/* ---- errors ------------------------------------------------------------------ */

static const char *error_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    case 504: return "timeout_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

static json_t *error_doc(int status, const char *msg)
{
    return json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type", error_type(status), "message", msg);
}

/* {"type": "error", "error": {"type", "message"}}, as Anthropic shapes errors */
static char *msg_error_json(int status, const char *msg)
{
    json_t *e = error_doc(status, msg);
    char *s = e ? json_dumps(e, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(e);
    return s;
}

/* ---- the request into a chat-completions request ------------------------------- */

typedef struct mchk {
    char *msg;
    size_t cap;
} mchk;

static int bad(mchk *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(mchk *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, c->cap, fmt, ap);
    va_end(ap);
    return 400;
}

static int nomem(mchk *c)
{
    snprintf(c->msg, c->cap, "out of memory");
    return 500;
}



/* Python's json.dumps(v, separators=(",", ":"), ensure_ascii=False) of v into b: the form of k3's
   own arguments (compact, reals as repr), so a call sent back as a tool_use renders as the same
   call sent back through chat completions (jansson would write 0.1 as 0.10000000000000001). */
static void dump_compact(k3cj_buf *b, json_t *v)
{
    char t[40];
    const char *k;
    json_t *x;
    size_t i;
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        k3cj_buf_puts(b, "{");
        i = 0;
        json_object_foreach(v, k, x) {
            if (i++) k3cj_buf_puts(b, ",");
            k3cj_dump_str(b, k, strlen(k));
            k3cj_buf_puts(b, ":");
            dump_compact(b, x);
        }
        k3cj_buf_puts(b, "}");
        break;
    case JSON_ARRAY:
        k3cj_buf_puts(b, "[");
        json_array_foreach(v, i, x) {
            if (i) k3cj_buf_puts(b, ",");
            dump_compact(b, x);
        }
        k3cj_buf_puts(b, "]");
        break;
    case JSON_STRING: k3cj_dump_str(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER:
        snprintf(t, sizeof t, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        k3cj_buf_puts(b, t);
        break;
    case JSON_REAL: k3cj_repr_double(json_real_value(v), t); k3cj_buf_puts(b, t); break;
    case JSON_TRUE: k3cj_buf_puts(b, "true"); break;
    case JSON_FALSE: k3cj_buf_puts(b, "false"); break;
    default: k3cj_buf_puts(b, "null"); break;
    }
}

/* A block's type (it must be an object with a string 'type'), else NULL with the 400 in *rc. */
static const char *block_type(mchk *c, json_t *b, const char *where, size_t j, int *rc)
{
    json_t *t = json_is_object(b) ? json_object_get(b, "type") : NULL;
    if (!json_is_object(b)) *rc = bad(c, "%s[%zu] is %s: a content block is an object with 'type'", where, j,
                                     srv_json_type(b));
    else if (!json_is_string(t)) *rc = bad(c, "%s[%zu] has %s 'type': give the block's type", where, j,
                                           t ? srv_json_type(t) : "no");
    return *rc ? NULL : json_string_value(t);
}

/* A block k3 cannot take: media (text only), or one of another kind of turn. */
static int refuse_block(mchk *c, const char *type, const char *where, size_t j, const char *turn)
{
    if (!strcmp(type, "image") || !strcmp(type, "document"))
        return bad(c, "%s[%zu] is an %s block: k3 is a text-only model (send the text)", where, j,
                   !strcmp(type, "image") ? "image" : "document");
    return bad(c, "%s[%zu] is a '%.60s' block, which %s does not take here", where, j, type, turn);
}

/* A text block as an OpenAI text part, appended to parts. */
static int text_part(mchk *c, json_t *b, const char *where, size_t j, json_t *parts)
{
    json_t *t = json_object_get(b, "text");
    if (!json_is_string(t))
        return bad(c, "%s[%zu].text is %s: a text block's text is a string", where, j, t ? srv_json_type(t) : "missing");
    if (json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", t))) return nomem(c);
    return 0;
}

/* A string, or a list of text blocks (as parts): the content of a system prompt or a tool result. */
static int text_content(mchk *c, json_t *v, const char *where, const char *turn, json_t **out)
{
    int rc = 0;
    if (json_is_string(v)) { *out = json_incref(v); return 0; }
    if (!json_is_array(v))
        return bad(c, "%s is %s: give a string or a list of text blocks", where, v ? srv_json_type(v) : "missing");
    json_t *parts = *out = json_array();
    if (!parts) return nomem(c);
    size_t j;
    json_t *b;
    json_array_foreach(v, j, b) {
        const char *type = block_type(c, b, where, j, &rc);
        if (rc) return rc;
        if (strcmp(type, "text")) return refuse_block(c, type, where, j, turn);
        if ((rc = text_part(c, b, where, j, parts))) return rc;
    }
    return 0;
}

/* A user turn: its tool_result blocks as tool messages (in order), then a user message with its
   text blocks, if any (Anthropic puts the results first in the turn). */
static int user_turn(mchk *c, json_t *m, size_t i, json_t *out)
{
    json_t *ct = json_object_get(m, "content");
    char where[64], w2[96];
    snprintf(where, sizeof where, "messages[%zu].content", i);
    if (json_is_string(ct))
        return json_array_append_new(out, json_pack("{s:s,s:O}", "role", "user", "content", ct)) ? nomem(c) : 0;
    if (!json_is_array(ct))
        return bad(c, "%s is %s: give a string or a list of content blocks", where, ct ? srv_json_type(ct) : "missing");
    json_t *parts = json_array();
    if (!parts) return nomem(c);
    int rc = 0, texts = 0;
    size_t j;
    json_t *b;
    json_array_foreach(ct, j, b) {
        const char *type = block_type(c, b, where, j, &rc);
        if (rc) break;
        if (!strcmp(type, "text")) {
            if ((rc = text_part(c, b, where, j, parts))) break;
            texts++;
        } else if (!strcmp(type, "tool_result")) {
            json_t *id = json_object_get(b, "tool_use_id"), *rct = srv_json_member(b, "content"), *body = NULL;
            if (!json_is_string(id)) {
                rc = bad(c, "%s[%zu].tool_use_id is %s: give the id of the tool_use it answers", where, j,
                         id ? srv_json_type(id) : "missing");
                break;
            }
            snprintf(w2, sizeof w2, "%s[%zu].content", where, j);
            /* is_error has no place in K3's format: the result's text says what went wrong */
            if (rct && (rc = text_content(c, rct, w2, "a tool_result", &body))) { json_decref(body); break; }
            if (json_array_append_new(out, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", id, "content",
                                                     body ? body : json_string("")))) { rc = nomem(c); break; }
        } else {
            rc = refuse_block(c, type, where, j, "a user turn");
            break;
        }
    }
    if (!rc && (texts || !json_array_size(ct)) &&
        json_array_append_new(out, json_pack("{s:s,s:O}", "role", "user", "content", parts)))
        rc = nomem(c);
    json_decref(parts);
    return rc;
}

/* An assistant turn: thinking blocks as reasoning_content, text blocks as content parts, tool_use
   blocks as tool_calls whose arguments are the compact JSON of their input. */
static int assistant_turn(mchk *c, json_t *m, size_t i, json_t *out)
{
    json_t *ct = json_object_get(m, "content");
    char where[64];
    snprintf(where, sizeof where, "messages[%zu].content", i);
    if (json_is_string(ct))
        return json_array_append_new(out, json_pack("{s:s,s:O}", "role", "assistant", "content", ct)) ? nomem(c) : 0;
    if (!json_is_array(ct))
        return bad(c, "%s is %s: give a string or a list of content blocks", where, ct ? srv_json_type(ct) : "missing");
    json_t *parts = json_array(), *calls = json_array();
    k3cj_buf think = {0};                   /* the thinking blocks' text, joined */
    int rc = 0, thought = 0;
    size_t j;
    json_t *b;
    if (!parts || !calls) rc = nomem(c);
    json_array_foreach(ct, j, b) {
        if (rc) break;
        const char *type = block_type(c, b, where, j, &rc);
        if (rc) break;
        if (!strcmp(type, "text")) {
            rc = text_part(c, b, where, j, parts);
        } else if (!strcmp(type, "thinking")) {
            json_t *t = json_object_get(b, "thinking");
            if (!json_is_string(t))
                rc = bad(c, "%s[%zu].thinking is %s: give the reasoning's text", where, j, t ? srv_json_type(t) : "missing");
            else k3cj_buf_put(&think, json_string_value(t), json_string_length(t));
            thought = 1;
        } else if (!strcmp(type, "redacted_thinking")) {
            continue;                       /* Anthropic's sealed reasoning: nothing k3 can read */
        } else if (!strcmp(type, "tool_use")) {
            json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"), *in = json_object_get(b, "input");
            json_t *raw = json_object_size(in) == 1 ? json_object_get(in, RAW_KEY) : NULL;
            if (!json_is_string(id) || !json_is_string(name)) {
                rc = bad(c, "%s[%zu]: a tool_use block needs its 'id' and 'name' (strings)", where, j);
                break;
            }
            if (!json_is_object(in)) {
                rc = bad(c, "%s[%zu].input is %s: give the call's input object", where, j, in ? srv_json_type(in) : "missing");
                break;
            }
            k3cj_buf a = {0};               /* the arguments' text */
            if (json_is_string(raw)) k3cj_buf_put(&a, json_string_value(raw), json_string_length(raw));
            else dump_compact(&a, in);
            json_t *args = a.oom ? NULL : json_stringn_nocheck(a.p ? a.p : "", a.n);
            free(a.p);
            if (!args || json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:o}}", "id", id, "type", "function",
                                                                "function", "name", name, "arguments", args)))
                rc = nomem(c);
        } else {
            rc = refuse_block(c, type, where, j, "an assistant turn");
        }
    }
    json_t *msg = rc ? NULL : json_pack("{s:s,s:o}", "role", "assistant", "content",
                                        json_array_size(parts) ? json_incref(parts) : json_null());
    if (!rc && !msg) rc = nomem(c);
    if (!rc && thought && json_object_set_new(msg, "reasoning_content", json_stringn_nocheck(think.p ? think.p : "",
                                                                                             think.n)))
        rc = nomem(c);
    if (!rc && json_array_size(calls) && json_object_set(msg, "tool_calls", calls)) rc = nomem(c);
    if (!rc && (think.oom || json_array_append(out, msg))) rc = nomem(c);
    json_decref(msg);
    json_decref(parts);
    json_decref(calls);
    free(think.p);
    return rc;
}

/* tools: {name, description, input_schema} into OpenAI's function tools. */
static int tools_field(mchk *c, json_t *tools, json_t *req)
{
    if (!json_is_array(tools)) return bad(c, "'tools' is %s: give a list of tools", srv_json_type(tools));
    json_t *out = json_array();
    if (!out) return nomem(c);
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *type = json_is_object(t) ? srv_json_member(t, "type") : NULL, *name = json_object_get(t, "name");
        json_t *desc = json_object_get(t, "description"), *schema = json_object_get(t, "input_schema");
        int rc = 0;
        if (!json_is_object(t)) rc = bad(c, "tools[%zu] is %s: a tool is an object", i, srv_json_type(t));
        else if (type && (!json_is_string(type) || strcmp(json_string_value(type), "custom")))
            rc = bad(c, "tools[%zu] has type %s: k3 runs no server tools; declare a tool with name, description and "
                     "input_schema, and run it yourself", i, json_is_string(type) ? json_string_value(type) : "?");
        else if (!json_is_string(name)) rc = bad(c, "tools[%zu].name is %s: give the tool's name", i,
                                                 name ? srv_json_type(name) : "missing");
        else if (desc && !json_is_null(desc) && !json_is_string(desc))
            rc = bad(c, "tools[%zu].description is %s: give a string", i, srv_json_type(desc));
        else if (!json_is_object(schema)) rc = bad(c, "tools[%zu].input_schema is %s: give the input's JSON schema", i,
                                                   schema ? srv_json_type(schema) : "missing");
        json_t *fn = rc ? NULL : json_pack("{s:O}", "name", name);
        if (!rc && !fn) rc = nomem(c);
        if (!rc && desc && json_is_string(desc) && json_object_set(fn, "description", desc)) rc = nomem(c);
        if (!rc && (json_object_set(fn, "parameters", schema) ||
                    json_array_append_new(out, json_pack("{s:s,s:O}", "type", "function", "function", fn))))
            rc = nomem(c);
        json_decref(fn);
        if (rc) { json_decref(out); return rc; }
    }
    if (json_array_size(out)) return json_object_set_new(req, "tools", out) ? nomem(c) : 0;
    json_decref(out);
    return 0;
}

/* tool_choice {type: auto | any | tool | none} into auto / "required" / the named function / "none"
   (disable_parallel_tool_use is accepted: k3 does not limit the calls of an answer). */
static int tool_choice_field(mchk *c, json_t *tc, json_t *req)
{
    json_t *type = json_is_object(tc) ? json_object_get(tc, "type") : NULL, *v;
    if (!json_is_string(type))
        return bad(c, "'tool_choice' is %s: give {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}",
                   json_is_object(tc) ? "an object without a string 'type'" : srv_json_type(tc));
    const char *t = json_string_value(type);
    if (!strcmp(t, "auto")) v = json_string("auto");
    else if (!strcmp(t, "any")) v = json_string("required");
    else if (!strcmp(t, "none")) v = json_string("none");
    else if (!strcmp(t, "tool")) {
        json_t *name = json_object_get(tc, "name");
        if (!json_is_string(name)) return bad(c, "'tool_choice' of type \"tool\" needs the tool's 'name'");
        v = json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", name);
    } else {
        return bad(c, "'tool_choice' has type \"%.40s\": give \"auto\", \"any\", \"tool\" or \"none\"", t);
    }
    return json_object_set_new(req, "tool_choice", v) ? nomem(c) : 0;
}

/* thinking: enabled (with budget_tokens: the think budget), adaptive or between_tools -> on (K3 thinks
   before each answer; its budget is then the server's); disabled -> off. display is accepted: the
   reasoning is always shown. */
static int thinking_field(mchk *c, json_t *th, json_t *req, msg_state *st)
{
    json_t *type = json_is_object(th) ? json_object_get(th, "type") : NULL;
    if (!json_is_string(type))
        return bad(c, "'thinking' is %s: give {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}",
                   json_is_object(th) ? "an object without a string 'type'" : srv_json_type(th));
    const char *t = json_string_value(type);
    if (!strcmp(t, "disabled")) return json_object_set_new(req, "reasoning_effort", json_string("none")) ? nomem(c) : 0;
    if (strcmp(t, "enabled") && strcmp(t, "adaptive") && strcmp(t, "between_tools"))
        return bad(c, "'thinking' has type \"%.40s\": give \"enabled\", \"adaptive\", \"between_tools\" or "
                   "\"disabled\"", t);
    json_t *b = srv_json_member(th, "budget_tokens");
    if (!strcmp(t, "enabled") && !b) return bad(c, "'thinking' of type \"enabled\" needs 'budget_tokens'");
    if (b && !json_is_integer(b))
        return bad(c, "'thinking.budget_tokens' is %s: give an integer from 1 to %d", srv_json_type(b), 1 << 30);
    if (b && (json_integer_value(b) < 1 || json_integer_value(b) > (1 << 30)))
        return bad(c, "'thinking.budget_tokens' is %" JSON_INTEGER_FORMAT ": give an integer from 1 to %d",
                   json_integer_value(b), 1 << 30);
    if (b) st->think_budget = (uint32_t)json_integer_value(b);
    return json_object_set_new(req, "thinking", json_true()) ? nomem(c) : 0;
}

static int stops_field(mchk *c, json_t *v, json_t *req)
{
    if (!json_is_array(v)) return bad(c, "'stop_sequences' is %s: give a list of strings", srv_json_type(v));
    if (json_array_size(v) > MSG_MAX_STOPS)
        return bad(c, "'stop_sequences' has %zu strings: at most %d", json_array_size(v), MSG_MAX_STOPS);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s)) return bad(c, "'stop_sequences'[%zu] is %s: give a string", i, srv_json_type(s));
        if (!json_string_length(s)) return bad(c, "'stop_sequences'[%zu] is empty: a stop sequence needs a character", i);
    }
    return json_array_size(v) && json_object_set(req, "stop", v) ? nomem(c) : 0;
}

/* The Messages request r as a chat-completions request (*out); /v1/messages needs max_tokens,
   count_tokens does not (need_max). 0, or an HTTP status with c->msg. */
static int translate(mchk *c, json_t *r, int need_max, json_t **out, msg_state *st)
{
    json_t *req = *out = json_object(), *msgs = json_array(), *v;
    int rc = 0;
    if (!req || !msgs) { json_decref(msgs); return nomem(c); }
    if (json_object_set_new(req, "messages", msgs)) return nomem(c);
    if ((v = srv_json_member(r, "model")) && !json_is_string(v))
        return bad(c, "'model' is %s: give the model's name (GET /v1/models)", srv_json_type(v));
    if (need_max && !srv_json_member(r, "max_tokens"))
        return bad(c, "no 'max_tokens': a Messages request gives the answer's tokens at most");
    /* the sampling fields, and k3's own (as chat completions takes them): checked there, by these names */
    static const char *const same[] = { "model", "max_tokens", "temperature", "top_p", "top_k", "stream", "seed",
                                        "min_p", "repeat_penalty", "repetition_penalty" };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        if ((v = srv_json_member(r, same[i])) && json_object_set(req, same[i], v)) return nomem(c);
    if ((v = srv_json_member(r, "system"))) {
        json_t *content = NULL;
        if ((rc = text_content(c, v, "'system'", "the system prompt", &content))) { json_decref(content); return rc; }
        if (json_is_string(content) ? json_string_length(content) > 0 : json_array_size(content) > 0) {
            if (json_array_append_new(msgs, json_pack("{s:s,s:o}", "role", "system", "content", content)))
                return nomem(c);
        } else {
            json_decref(content);           /* an empty system prompt is none */
        }
    }
    json_t *m = json_object_get(r, "messages");
    if (!m) return bad(c, "no 'messages': a Messages request needs the conversation");
    if (!json_is_array(m)) return bad(c, "'messages' is %s: give a list of messages", srv_json_type(m));
    if (!json_array_size(m)) return bad(c, "'messages' is empty: give at least one message");
    size_t i;
    json_t *x;
    json_array_foreach(m, i, x) {
        json_t *role = json_is_object(x) ? json_object_get(x, "role") : NULL;
        if (!json_is_object(x)) return bad(c, "messages[%zu] is %s: a message is an object", i, srv_json_type(x));
        if (json_is_string(role) && !strcmp(json_string_value(role), "user")) rc = user_turn(c, x, i, msgs);
        else if (json_is_string(role) && !strcmp(json_string_value(role), "system")) {
            char where[64];
            snprintf(where, sizeof where, "messages[%zu].content", i);
            json_t *content = NULL;
            if (!(rc = text_content(c, json_object_get(x, "content"), where, "a system message", &content)) &&
                json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", content)))
                rc = nomem(c);
            json_decref(content);
        } else if (json_is_string(role) && !strcmp(json_string_value(role), "assistant")) {
            if (i + 1 == json_array_size(m))
                return bad(c, "messages[%zu] is the assistant's, last: k3 does not continue a prefilled answer "
                           "(end the conversation with the user's turn)", i);
            rc = assistant_turn(c, x, i, msgs);
        } else if (json_is_string(role))
            return bad(c, "messages[%zu] has role \"%.40s\": the roles are user, assistant and system", i,
                       json_string_value(role));
        else return bad(c, "messages[%zu] has %s 'role': user, assistant or system", i, role ? srv_json_type(role) : "no");
        if (rc) return rc;
    }
    if ((v = srv_json_member(r, "tools")) && (rc = tools_field(c, v, req))) return rc;
    if ((v = srv_json_member(r, "tool_choice")) && (rc = tool_choice_field(c, v, req))) return rc;
    if ((v = srv_json_member(r, "thinking")) && (rc = thinking_field(c, v, req, st))) return rc;
    if ((v = srv_json_member(r, "stop_sequences")) && (rc = stops_field(c, v, req))) return rc;
    if ((v = srv_json_member(r, "metadata")) && !json_is_object(v))
        return bad(c, "'metadata' is %s: give an object", srv_json_type(v));
    return 0;                               /* other fields are ignored, as chat completions does */
}

/* The body into its chat-completions request. */
static int load(const char *body, size_t len, int need_max, json_t **chat, msg_state *st, char *msg, size_t cap)
{
    mchk c = {.msg = msg, .cap = cap};
    *chat = NULL;
    if (len == 0) return bad(&c, "the request body is empty: send a JSON object");
    json_error_t je;
    json_t *r = json_loadb(body, len, JSON_ALLOW_NUL, &je);
    if (!r) return bad(&c, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    int rc = json_is_object(r) ? translate(&c, r, need_max, chat, st)
                               : bad(&c, "the body is %s, not a JSON object", srv_json_type(r));
    json_decref(r);
    if (rc) { json_decref(*chat); *chat = NULL; }
    return rc;
}

static int to_chat(srv *s, const char *body, size_t len, char **chat, size_t *chat_len, void **state, char *msg,
                   size_t cap)
{
    (void)s;
    msg_state *st = calloc(1, sizeof *st);
    json_t *req = NULL;
    int rc = st ? load(body, len, 1, &req, st, msg, cap) : 500;
    if (!rc && !(*chat = json_dumps(req, JSON_COMPACT | JSON_PRESERVE_ORDER))) rc = 500;
    json_decref(req);
    if (rc) {
        if (rc == 500 && !msg[0]) snprintf(msg, cap, "out of memory");
        free(st);
        return rc;
    }
    *chat_len = strlen(*chat);
    *state = st;
    return 0;
}

/* What the chat request cannot carry; the job's id in Anthropic's form. */
static void adjust(srv_job *j)
{
    msg_state *st = j->api_state;
    if (st->think_budget) j->co.think_budget = st->think_budget;
    j->n_choices = 1;
    const char *hex = strchr(j->id, '-');
    char id[sizeof j->id];
    snprintf(id, sizeof id, "msg_%.40s", hex ? hex + 1 : j->id);
    memcpy(j->id, id, sizeof id);
}

char *srv_messages_count_tokens(srv *s, const char *body, size_t len, int *status, char *msg, size_t cap)
{
    msg_state st = {0};
    json_t *req = NULL;
    *status = load(body, len, 0, &req, &st, msg, cap);
    if (*status) { k3_escape_ctl_in_place(msg, cap); return NULL; }
    char *text = json_dumps(req, JSON_COMPACT | JSON_PRESERVE_ORDER), *out = NULL;
    json_decref(req);
    if (!text) { *status = 500; snprintf(msg, cap, "out of memory"); return NULL; }
    k3_chat_prompt pr = {0};
    k3_diag d;
    k3_err e = k3_chat_render(s->tok, text, strlen(text), "the request", &pr, &d);
    free(text);
    if (e) {
        *status = e == K3_ERR_USAGE ? 400 : 500;
        snprintf(msg, cap, "%s", d.msg);
        k3_escape_ctl_in_place(msg, cap);
        return NULL;
    }
    json_t *doc = json_pack("{s:I}", "input_tokens", (json_int_t)pr.n_ids);
    k3_chat_prompt_free(&pr);
    if (doc) out = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    if (!out) { *status = 500; snprintf(msg, cap, "out of memory"); }
    return out;
}

/* ---- the answer --------------------------------------------------------------- */

/* Anthropic counts input_tokens without the cache reads: input + cache_read = the prompt. */
static json_t *usage_json(const k3_chat_stats *st)
{
    return json_pack("{s:I,s:i,s:I,s:I}", "input_tokens", (json_int_t)(st->prompt_tokens - st->cached_tokens),
                     "cache_creation_input_tokens", 0, "cache_read_input_tokens", (json_int_t)st->cached_tokens,
                     "output_tokens", (json_int_t)st->completion_tokens);
}

static void tool_id(const srv_job *j, int i, char *id, size_t cap)
{
    snprintf(id, cap, "toolu_%s_%d", j->id + 4, i + 1);     /* after "msg_": unique per answer and call */
}

/* A call's input: its arguments parsed when they are a JSON object (*verbatim: the arguments are
   its JSON text), else {RAW_KEY: the text}. */
static json_t *call_input(const char *arguments, int *verbatim)
{
    json_t *v = json_loads(arguments, JSON_ALLOW_NUL, NULL);
    *verbatim = json_is_object(v);
    if (*verbatim) return v;
    json_decref(v);
    return json_pack("{s:s}", RAW_KEY, arguments);
}

static void ev(run_ctx *r, const char *name, json_t *doc)
{
    srv_put_event(r->s, r->j, name, doc);
}

/* Stream: close the open content block. A thinking block ends with its signature, as Anthropic's
   do (empty: k3 signs nothing, and reads the reasoning back as it is). */
static void block_stop(run_ctx *r)
{
    msg_state *st = r->j->api_state;
    if (st->open == BLK_NONE) return;
    if (st->open == BLK_THINKING)
        ev(r, "content_block_delta", json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index",
                                               st->block, "delta", "type", "signature_delta", "signature", ""));
    ev(r, "content_block_stop", json_pack("{s:s,s:i}", "type", "content_block_stop", "index", st->block));
    st->block++;
    st->open = BLK_NONE;
}

static void block_start(run_ctx *r, int kind, json_t *block)
{
    msg_state *st = r->j->api_state;
    block_stop(r);
    ev(r, "content_block_start", json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", st->block,
                                           "content_block", block));
    st->open = kind;
}

static void msg_begin(run_ctx *r)
{
    srv_job *j = r->j;
    msg_state *st = j->api_state;
    st->block = 0;
    st->open = BLK_NONE;
    st->stop_reason = NULL;
    st->stop_sequence = NULL;
    if (!j->stream) {
        r->acc = json_array();
        return;
    }
    /* the cache's share of the prompt is known once it is processed: message_delta has the final usage */
    ev(r, "message_start", json_pack("{s:s,s:{s:s,s:s,s:s,s:s,s:[],s:n,s:n,s:{s:I,s:i,s:i,s:i}}}", "type",
                                     "message_start", "message", "id", j->id, "type", "message", "role", "assistant",
                                     "model", j->model, "content", "stop_reason", "stop_sequence", "usage",
                                     "input_tokens", (json_int_t)j->prompt_tokens, "cache_creation_input_tokens", 0,
                                     "cache_read_input_tokens", 0, "output_tokens", 0));
    ev(r, "ping", json_pack("{s:s}", "type", "ping"));
}

static void msg_start(run_ctx *r)
{
    (void)r;                                /* one choice: message_start opened it */
}

static void msg_text(run_ctx *r, int channel, const char *t)
{
    msg_state *st = r->j->api_state;
    int kind = channel ? BLK_TEXT : BLK_THINKING;
    if (st->open != kind)
        block_start(r, kind, channel ? json_pack("{s:s,s:s}", "type", "text", "text", "")
                                     : json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", ""));
    ev(r, "content_block_delta", json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index", st->block,
                                           "delta", "type", channel ? "text_delta" : "thinking_delta",
                                           channel ? "text" : "thinking", t));
}

/* A call comes whole: its block opens, its input is one input_json_delta, it closes. */
static void msg_call(run_ctx *r, int i, const char *name, const char *arguments)
{
    char id[80];
    int verbatim;
    char *a = k3_utf8_sanitize(arguments, strlen(arguments), NULL), *n = k3_utf8_sanitize(name, strlen(name), NULL);
    json_t *in = a ? call_input(a, &verbatim) : NULL;
    char *text = in && !verbatim ? json_dumps(in, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    tool_id(r->j, i, id, sizeof id);
    block_start(r, BLK_TOOL, json_pack("{s:s,s:s,s:s,s:{}}", "type", "tool_use", "id", id, "name", n ? n : "", "input"));
    if (in)
        ev(r, "content_block_delta", json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index",
                                               ((msg_state *)r->j->api_state)->block, "delta", "type", "input_json_delta",
                                               "partial_json", verbatim ? a : text ? text : "{}"));
    block_stop(r);
    json_decref(in);
    free(text);
    free(a);
    free(n);
}

static void stop_reason(msg_state *st, const srv_job *j, const k3_chat_stats *cs)
{
    const char *f = cs->finish ? cs->finish : "stop";
    st->stop_sequence = NULL;
    if (!strcmp(f, "tool_calls")) st->stop_reason = "tool_use";
    else if (!strcmp(f, "length")) st->stop_reason = "max_tokens";
    else if (!strcmp(f, "stop") && cs->stop_index >= 0 && cs->stop_index < j->co.n_stops) {
        st->stop_reason = "stop_sequence";
        st->stop_sequence = j->co.stops[cs->stop_index];
    } else st->stop_reason = "end_turn";    /* the model ended its message, or the server stops (k3.interrupted) */
}

/* The choice's message as content blocks: thinking, text, tool_use (empty ones left out). */
static void msg_choice(run_ctx *r, const k3_chat_stats *cs, const char *message, const char *text, size_t text_len)
{
    srv_job *j = r->j;
    (void)text;
    (void)text_len;
    stop_reason(j->api_state, j, cs);
    if (j->stream) {
        block_stop(r);
        return;
    }
    json_t *m = json_loads(message, JSON_ALLOW_NUL, NULL), *v, *calls, *c;
    if (!m) return;
    if (json_is_string(v = json_object_get(m, "reasoning_content")) && json_string_length(v))
        json_array_append_new(r->acc, json_pack("{s:s,s:O,s:s}", "type", "thinking", "thinking", v, "signature", ""));
    if (json_is_string(v = json_object_get(m, "content")) && json_string_length(v))
        json_array_append_new(r->acc, json_pack("{s:s,s:O}", "type", "text", "text", v));
    size_t i;
    if (json_is_array(calls = json_object_get(m, "tool_calls"))) json_array_foreach(calls, i, c) {
        json_t *fn = json_object_get(c, "function"), *args = json_object_get(fn, "arguments");
        char id[80];
        int verbatim;
        tool_id(j, (int)i, id, sizeof id);
        json_t *in = call_input(json_is_string(args) ? json_string_value(args) : "{}", &verbatim);
        json_array_append_new(r->acc, json_pack("{s:s,s:s,s:O,s:o}", "type", "tool_use", "id", id, "name",
                                                json_object_get(fn, "name"), "input", in ? in : json_object()));
    }
    json_decref(m);
}

static void msg_end(run_ctx *r, const k3_chat_stats *all, json_t *k3)
{
    srv_job *j = r->j;
    msg_state *st = j->api_state;
    const char *reason = st->stop_reason ? st->stop_reason : "end_turn";
    if (j->stream) {
        ev(r, "message_delta", json_pack("{s:s,s:{s:s,s:s?},s:o,s:o}", "type", "message_delta", "delta", "stop_reason",
                                         reason, "stop_sequence", st->stop_sequence, "usage", usage_json(all), "k3", k3));
        ev(r, "message_stop", json_pack("{s:s}", "type", "message_stop"));
    } else {
        json_t *doc = json_pack("{s:s,s:s,s:s,s:s,s:O,s:s,s:s?,s:o,s:o}", "id", j->id, "type", "message", "role",
                                "assistant", "model", j->model, "content", r->acc, "stop_reason", reason,
                                "stop_sequence", st->stop_sequence, "usage", usage_json(all), "k3", k3);
        j->status = 200;
        srv_put_json(r->s, j, doc);
    }
    json_decref(r->acc);
    r->acc = NULL;
}

/* After the answer was accepted: an error body, or in a stream an `error` event (the stream ends). */
static void msg_fail(run_ctx *r, int status, const char *msg)
{
    if (r->j->stream) {
        ev(r, "error", error_doc(status, msg));
    } else {
        char *e = msg_error_json(status, msg);
        if (e) srv_put(r->s, r->j, e, 0);
        free(e);
    }
    json_decref(r->acc);
    r->acc = NULL;
}

const srv_api_ops srv_api_messages = {
    .name = "messages", .to_chat = to_chat, .adjust = adjust, .begin = msg_begin, .start = msg_start,
    .text = msg_text, .call = msg_call, .choice = msg_choice, .end = msg_end, .fail = msg_fail,
    .error_json = msg_error_json, .free_state = free, .keepalive = "event: ping\ndata: {\"type\": \"ping\"}\n\n",
};

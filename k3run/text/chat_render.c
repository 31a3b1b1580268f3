/*
 * chat_render.c - a chat request into Kimi K3's prompt (chat_render.h): the
 * request's options, the order of blocks (CHAT-FORMAT.md §5), the messages
 * (§6), the internal system messages (§6.6) and the generation prompt (§8).
 * Tools live in chat_tools.c, segments and their encoding in chat_segs.c.
 *
 * Where the official renderer takes any Python value (a name, a reasoning
 * text, a content part's text), the value goes through Python's str() for
 * scalars (None, True, 3, 2.5); lists and objects there are refused instead
 * of being printed as Python reprs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_impl.h"

typedef struct chat_opts {
    int thinking;            /* Python truthiness of the effective value */
    int add_gen;
    uint32_t effort;         /* thinking_effort's value; 0 = absent (the official default "max") */
    const char *effort_from; /* which field gave it, for messages */
    uint32_t tool_choice;    /* 0 = absent */
    uint32_t response_format;
    int schema_given;        /* response_schema present (even null) */
    uint32_t schema;
} chat_opts;

static const char effort_body[] =
    "`thinking_effort` guides on how much to think in your thinking channel (not including the response channel), "
    "supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with "
    "`thinking_effort=";
static const char rf_body[] =
    "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting.";

/* ------------------------------------------------------------------------ */
/* Options                                                                  */

static k3_err read_options(chat_ctx *c, chat_opts *o)
{
    const k3cj_doc *d = &c->doc;
    *o = (chat_opts){.thinking = 1, .add_gen = 1};
    /* the OpenAI request's fields */
    uint32_t t = k3cj_get(d, 0, "thinking"), re = k3cj_get(d, 0, "reasoning_effort");
    if (t && d->v[t].type != K3CJ_NULL) {
        if (d->v[t].type != K3CJ_TRUE && d->v[t].type != K3CJ_FALSE)
            return chat_refuse(c, "'thinking' is %s: give true or false", chat_type_name(c, t));
        o->thinking = d->v[t].type == K3CJ_TRUE;
    }
    if (re && d->v[re].type != K3CJ_NULL) {
        if (d->v[re].type != K3CJ_STR)
            return chat_refuse(c, "'reasoning_effort' is %s: give \"low\", \"high\", \"max\" or \"none\"",
                               chat_type_name(c, re));
        if (k3cj_streq(d, re, "none")) {
            if (t && d->v[t].type == K3CJ_TRUE)
                return chat_refuse(c, "'reasoning_effort' \"none\" turns thinking off, but 'thinking' is true");
            o->thinking = 0;
        } else {
            o->effort = re;
            o->effort_from = "'reasoning_effort'";
        }
    }
    o->tool_choice = k3cj_get(d, 0, "tool_choice");
    o->response_format = k3cj_get(d, 0, "response_format");
    if (k3cj_get(d, 0, "image_prompts"))
        return chat_refuse(c, "'image_prompts' is not supported: k3run is a text-only engine");
    /* the official renderer's options: they win over the fields above */
    uint32_t op = k3cj_get(d, 0, "options");
    if (!op || d->v[op].type == K3CJ_NULL) return K3_OK;
    if (d->v[op].type != K3CJ_OBJ) return chat_refuse(c, "'options' is %s, not an object", chat_type_name(c, op));
    for (uint32_t k = k3cj_first(d, op); k; k = k3cj_next(d, op, k)) {
        uint32_t v = k + 1;                          /* in order: the last of duplicate keys wins */
        if (k3cj_streq(d, k, "thinking")) o->thinking = k3cj_truthy(d, v);
        else if (k3cj_streq(d, k, "add_generation_prompt")) o->add_gen = k3cj_truthy(d, v);
        else if (k3cj_streq(d, k, "thinking_effort")) { o->effort = v; o->effort_from = "options.thinking_effort"; }
        else if (k3cj_streq(d, k, "tool_choice")) o->tool_choice = v;
        else if (k3cj_streq(d, k, "response_format")) o->response_format = v;
        else if (k3cj_streq(d, k, "response_schema")) { o->schema_given = 1; o->schema = v; }
        else if (k3cj_streq(d, k, "image_prompts"))
            return chat_refuse(c, "options.image_prompts is not supported: k3run is a text-only engine");
        else {
            char q[600];
            return chat_refuse(c, "unknown option %s (options are thinking, thinking_effort, "
                               "add_generation_prompt, tool_choice, response_format, response_schema)",
                               chat_quote(c, k, q, sizeof q));
        }
    }
    return K3_OK;
}

/* extract_response_schema: json_schema.schema, else .json_schema, else json_schema itself; 0 = None. */
static uint32_t response_schema(const chat_ctx *c, uint32_t rf)
{
    const k3cj_doc *d = &c->doc;
    if (!chat_is(c, rf, K3CJ_OBJ)) return 0;
    uint32_t js = k3cj_get(d, rf, "json_schema");
    if (!js || d->v[js].type == K3CJ_NULL) return 0;
    if (d->v[js].type != K3CJ_OBJ) return js;
    uint32_t s = k3cj_get(d, js, "schema");
    if (s) return s;
    s = k3cj_get(d, js, "json_schema");
    return s ? s : js;
}

/* ------------------------------------------------------------------------ */
/* Blocks                                                                   */

static k3_err effort_message(chat_ctx *c, const chat_opts *o)
{
    const k3cj_doc *d = &c->doc;
    const char *e = "max";
    size_t en = 3;
    if (o->effort) {
        uint32_t v = o->effort;
        if (d->v[v].type == K3CJ_NULL) return K3_OK;       /* explicit null: no effort message */
        if (!(k3cj_streq(d, v, "low") || k3cj_streq(d, v, "high") || k3cj_streq(d, v, "max"))) {
            char q[600];
            if (d->v[v].type == K3CJ_STR)
                return chat_refuse(c, "%s %s is not supported: low, high or max (or null for no effort "
                                   "message; the official renderer refuses any other value)", o->effort_from,
                                   chat_quote(c, v, q, sizeof q));
            return chat_refuse(c, "%s is %s: give \"low\", \"high\", \"max\" or null", o->effort_from,
                               chat_type_name(c, v));
        }
        e = k3cj_str(d, v);                                /* not NUL-terminated */
        en = d->v[v].n;
    }
    char body[sizeof effort_body + 8];                     /* the body: effort_body, E, "`." */
    size_t n = sizeof effort_body - 1;
    memcpy(body, effort_body, n);
    memcpy(body + n, e, en);
    memcpy(body + n + en, "`.", 2);
    chat_internal(c, "thinking-effort", body, n + en + 2);
    return chat_check(c);
}

static k3_err tail_messages(chat_ctx *c, const chat_opts *o)
{
    const k3cj_doc *d = &c->doc;
    uint32_t tc = o->tool_choice;
    if (tc && k3cj_streq(d, tc, "required")) {
        static const char b[] = "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next "
                                "message.";
        chat_internal(c, "tool-choice", b, sizeof b - 1);
    } else if (tc && k3cj_streq(d, tc, "none")) {
        static const char b[] = "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the "
                                "next message.";
        chat_internal(c, "tool-choice", b, sizeof b - 1);
    }
    uint32_t rf = o->response_format, type = rf;
    if (chat_is(c, rf, K3CJ_OBJ) && k3cj_get(d, rf, "type")) type = k3cj_get(d, rf, "type");
    if (type && k3cj_streq(d, type, "json_object")) {
        k3cj_buf b = {0};                            /* the body */
        k3cj_buf_puts(&b, "The system is invoked with `response_format=json_object`.\n");
        k3cj_buf_puts(&b, rf_body);
        if (b.oom) c->oom = 1;
        else chat_internal(c, "response-format", b.p, b.n);
        free(b.p);
    } else if (type && k3cj_streq(d, type, "json_schema")) {
        uint32_t s = o->schema_given ? o->schema : response_schema(c, rf);
        k3cj_buf b = {0};                            /* the body */
        k3cj_buf_puts(&b, "The system is invoked with `response_format=json_schema`.\n");
        k3cj_buf_puts(&b, rf_body);
        k3cj_buf_puts(&b, "\nThe JSON data must match the following schema:\n```json\n");
        k3_err e = K3_OK;
        if (s) e = k3cj_dump(d, s, K3CJ_COMPACT_SORTED, &b, c->d);
        else k3cj_buf_puts(&b, "null");
        k3cj_buf_puts(&b, "\n```");
        if (!e && b.oom) c->oom = 1;
        if (!e && !b.oom) chat_internal(c, "response-format", b.p, b.n);
        free(b.p);
        if (e) return e;
    }
    if (o->add_gen) {
        chat_open(c, "message");
        chat_attr(c, "role", "assistant", 9);
        chat_sep(c);
        chat_open_tag(c, o->thinking ? "think" : "response");
    }
    return chat_check(c);
}

/* ------------------------------------------------------------------------ */
/* Messages                                                                 */

/* str(v) as one text segment (nothing when it is empty). */
static k3_err text_of(chat_ctx *c, uint32_t v, const char *what)
{
    k3cj_buf b = {0};                                /* str(v) */
    k3_err e = chat_py_str(c, v, &b, what);
    if (!e) chat_text(c, b.p, b.n);
    free(b.p);
    return e ? e : chat_check(c);
}

/* The attribute KEY="str(value)" (Python's str of the value; `what` names it in a refusal). */
static k3_err attr_py_str(chat_ctx *c, const char *key, uint32_t value, const char *what)
{
    k3cj_buf b = {0};                                /* str(value) */
    k3_err e = chat_py_str(c, value, &b, what);
    if (!e) chat_attr(c, key, b.p, b.n);
    free(b.p);
    return e;
}

/* A message's role attribute, then its name if truthy, then <|sep|>. */
static k3_err open_message(chat_ctx *c, size_t mi, uint32_t m, const char *role)
{
    chat_open(c, "message");
    chat_attr(c, "role", role, strlen(role));
    uint32_t name = k3cj_get(&c->doc, m, "name");
    if (name && k3cj_truthy(&c->doc, name)) {
        char what[48];
        snprintf(what, sizeof what, "messages[%zu].name", mi);
        k3_err e = attr_py_str(c, "name", name, what);
        if (e) return e;
    }
    chat_sep(c);
    return chat_check(c);
}

static k3_err close_message(chat_ctx *c)
{
    chat_close(c, "message");
    chat_end_of_msg(c);
    return chat_check(c);
}

/* Content (§6.7): a string, null, or a list of parts. */
static k3_err content(chat_ctx *c, size_t mi, uint32_t m)
{
    const k3cj_doc *d = &c->doc;
    uint32_t ct = k3cj_get(d, m, "content");
    if (!ct || d->v[ct].type == K3CJ_NULL) return K3_OK;
    if (d->v[ct].type == K3CJ_STR) {
        chat_text(c, k3cj_str(d, ct), d->v[ct].n);
        return chat_check(c);
    }
    if (d->v[ct].type != K3CJ_ARR)
        return chat_refuse(c, "messages[%zu].content is %s: give a string, a list of parts or null", mi,
                           chat_type_name(c, ct));
    size_t j = 0;
    for (uint32_t p = k3cj_first(d, ct); p; p = k3cj_next(d, ct, p), j++) {
        if (!chat_is(c, p, K3CJ_OBJ))
            return chat_refuse(c, "messages[%zu].content[%zu] is %s: a part is an object with 'type'", mi, j,
                               chat_type_name(c, p));
        uint32_t type = k3cj_get(d, p, "type");
        if (!type) return chat_refuse(c, "messages[%zu].content[%zu] has no 'type'", mi, j);
        if (k3cj_streq(d, type, "image") || k3cj_streq(d, type, "image_url")) {
            chat_control_text(c, CHAT_IMAGE_PLACEHOLDER);        /* text-only: no image prompts */
            continue;
        }
        uint32_t text = k3cj_get(d, p, "text");
        if (!text) return chat_refuse(c, "messages[%zu].content[%zu] has no 'text' (a part that is not an image "
                                      "needs one)", mi, j);
        char what[64];
        snprintf(what, sizeof what, "messages[%zu].content[%zu].text", mi, j);
        k3_err e = text_of(c, text, what);
        if (e) return e;
    }
    return chat_check(c);
}

static k3_err assistant(chat_ctx *c, const chat_opts *o, size_t mi, uint32_t m)
{
    const k3cj_doc *d = &c->doc;
    k3_err e = open_message(c, mi, m, "assistant");
    if (e) return e;
    if (o->thinking) {
        uint32_t r = k3cj_get(d, m, "reasoning_content");
        if (!r || !k3cj_truthy(d, r)) r = k3cj_get(d, m, "reasoning");
        chat_open_tag(c, "think");
        if (r && d->v[r].type != K3CJ_NULL) {        /* whitespace-only reasoning is kept */
            char what[64];
            snprintf(what, sizeof what, "messages[%zu] reasoning", mi);
            if ((e = text_of(c, r, what))) return e;
        }
        chat_close(c, "think");
    }
    chat_open_tag(c, "response");
    if ((e = content(c, mi, m))) return e;
    chat_close(c, "response");
    uint32_t calls = k3cj_get(d, m, "tool_calls");
    if (calls && k3cj_truthy(d, calls) && (e = chat_tool_calls(c, mi, calls))) return e;
    return close_message(c);
}

/* The tool message's name (§6.4): its tool, else its name, else the last assistant's call by position. */
static k3_err tool_message(chat_ctx *c, size_t mi, uint32_t m, uint32_t resorted, uint32_t calls, size_t index,
                           size_t ai)
{
    const k3cj_doc *d = &c->doc;
    uint32_t name = resorted;
    if (!name) name = k3cj_get(d, m, "tool");
    if (!name) name = k3cj_get(d, m, "name");     /* only when there is no 'tool' key at all */
    if (!name || d->v[name].type == K3CJ_NULL) {
        name = 0;
        if (chat_is(c, calls, K3CJ_ARR) && index <= d->v[calls].n) {
            uint32_t call = k3cj_first(d, calls), fn;
            for (size_t k = 1; k < index; k++) call = k3cj_next(d, calls, call);
            k3_err e = chat_call_name(c, ai, index - 1, call, &fn, &name);
            if (e) return e;
            if (d->v[name].type == K3CJ_NULL) name = 0;
        }
        if (!name)
            return chat_refuse(c, "messages[%zu] (a tool result) has no resolvable tool name: give 'tool' or "
                               "'name', or answer a call of the preceding assistant message (this is tool result "
                               "%zu since it)", mi, index);
    }
    chat_open(c, "message");
    chat_attr(c, "role", "tool", 4);
    char what[48];
    snprintf(what, sizeof what, "messages[%zu] tool name", mi);
    k3_err e = attr_py_str(c, "tool", name, what);
    if (e) return e;
    chat_attr_u(c, "index", index);
    chat_sep(c);
    if ((e = content(c, mi, m))) return e;
    return close_message(c);
}

static k3_err messages(chat_ctx *c, const chat_opts *o, uint32_t msgs)
{
    const k3cj_doc *d = &c->doc;
    size_t n = d->v[msgs].n, k = 0;
    uint32_t *m = malloc((n ? n : 1) * sizeof *m);       /* [n] the messages' value indices */
    uint32_t *order = malloc((n ? n : 1) * sizeof *order), *tool = malloc((n ? n : 1) * sizeof *tool);
    k3_err e = K3_OK;
    if (!m || !order || !tool) { e = k3_fail(c->d, K3_ERR_NOMEM, "'%s': out of memory", c->name); goto out; }
    for (uint32_t v = k3cj_first(d, msgs); v; v = k3cj_next(d, msgs, v)) m[k++] = v;
    if (n && d->v[m[0]].type == K3CJ_ARR) {
        e = chat_refuse(c, "'messages' is a batch of conversations (a list of lists): render one at a time");
        goto out;
    }
    if ((e = chat_tool_order(c, m, n, order, tool))) goto out;
    uint32_t calls = 0;                              /* the last assistant message's tool_calls */
    size_t index = 0, ai = 0;                        /* tool results since it */
    for (k = 0; k < n && !e; k++) {
        size_t i = order[k];
        uint32_t msg = m[i];
        if (!chat_is(c, msg, K3CJ_OBJ)) {
            e = chat_refuse(c, "messages[%zu] is %s, not an object", i, chat_type_name(c, msg));
            break;
        }
        uint32_t role = k3cj_get(d, msg, "role");
        if (!c->sys_marked && !(chat_is(c, role, K3CJ_STR) && k3cj_streq(d, role, "system"))) {
            c->sys_segs = c->n_segs;             /* the part conversations share ends here */
            c->sys_marked = 1;
        }
        if (chat_is(c, role, K3CJ_STR) && k3cj_streq(d, role, "user")) {
            if (!(e = open_message(c, i, msg, "user")) && !(e = content(c, i, msg))) e = close_message(c);
        } else if (chat_is(c, role, K3CJ_STR) && k3cj_streq(d, role, "system")) {
            uint32_t tools = k3cj_get(d, msg, "tools");
            if (tools && k3cj_truthy(d, tools)) e = chat_tool_declare(c, tools, 1);   /* content, name ignored */
            else if (!(e = open_message(c, i, msg, "system")) && !(e = content(c, i, msg))) e = close_message(c);
        } else if (chat_is(c, role, K3CJ_STR) && k3cj_streq(d, role, "tool")) {
            e = tool_message(c, i, msg, tool[i], calls, ++index, ai);
        } else if (chat_is(c, role, K3CJ_STR) && k3cj_streq(d, role, "assistant")) {
            calls = k3cj_get(d, msg, "tool_calls");
            index = 0;
            ai = i;
            e = assistant(c, o, i, msg);
        } else if (chat_is(c, role, K3CJ_STR)) {
            char q[600];
            e = chat_refuse(c, "messages[%zu] has role %s: the roles are system, user, assistant and tool "
                            "(the official renderer refuses others; send developer as system)", i,
                            chat_quote(c, role, q, sizeof q));
        } else {
            e = chat_refuse(c, "messages[%zu] has %s 'role': system, user, assistant or tool", i,
                            role ? chat_type_name(c, role) : "no");
        }
    }
out:
    free(m);
    free(order);
    free(tool);
    return e;
}

/* ------------------------------------------------------------------------ */
/* Entry                                                                    */

static k3_err render(chat_ctx *c, chat_opts *op)
{
    const k3cj_doc *d = &c->doc;
    if (d->v[0].type != K3CJ_OBJ)
        return chat_refuse(c, "the request is %s: give a JSON object with 'messages'", chat_kind(d->v[0].type));
    k3_err e = read_options(c, op);
    if (e) return e;
    chat_opts o = *op;
    uint32_t msgs = k3cj_get(d, 0, "messages");
    if (!chat_is(c, msgs, K3CJ_ARR))
        return chat_refuse(c, "'messages' is %s: give a list of messages", msgs ? chat_type_name(c, msgs) : "missing");
    uint32_t tools = k3cj_get(d, 0, "tools");
    if (tools && k3cj_truthy(d, tools) && (e = chat_tool_declare(c, tools, 0))) return e;
    if (o.thinking && (e = effort_message(c, &o))) return e;
    if ((e = messages(c, &o, msgs))) return e;
    return tail_messages(c, &o);
}

k3_err k3_chat_render(const k3_tok *tok, const char *json, size_t len, const char *name, k3_chat_prompt *out,
                      k3_diag *d)
{
    memset(out, 0, sizeof *out);
    chat_ctx c = {.tok = tok, .name = name ? name : "request", .d = d};
    static const char *const marks[4] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"};
    int32_t *ids[4] = {&c.open, &c.close, &c.sep, &c.eom};
    for (int i = 0; i < 4; i++)
        if ((*ids[i] = k3_tok_special_id(tok, marks[i])) < 0)
            return k3_fail(d, K3_ERR_UNSUPPORTED, "the tokenizer has no '%s' special token: it is not Kimi K3's "
                           "chat vocabulary (tokenizer_config.json names them)", marks[i]);
    k3cj_error je;
    if (k3cj_parse(json, len, K3CJ_STRICT, &c.doc, &je))
        return k3_fail(d, je.kind == K3CJ_E_NOMEM ? K3_ERR_NOMEM : K3_ERR_FORMAT, "'%s': invalid JSON at byte %zu: %s",
                       c.name, je.off, je.text);
    chat_opts o;
    k3_err e = render(&c, &o);
    if (!e) e = chat_encode(&c, out);
    if (!e) {
        out->thinking = o.thinking != 0;
        out->add_generation_prompt = o.add_gen != 0;
        out->tools_declared = c.tools_declared;
    }
    if (e) k3_chat_prompt_free(out);
    free(c.segs);
    free(c.text.p);
    k3cj_free(&c.doc);
    return e;
}

void k3_chat_prompt_free(k3_chat_prompt *p)
{
    if (!p) return;
    free(p->ids);
    free(p->pieces);
    free(p->arena);
    memset(p, 0, sizeof *p);
}

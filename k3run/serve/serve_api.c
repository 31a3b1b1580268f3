/*
 * serve_api.c - the OpenAI API of `k3run serve` (serve_impl.h): a request's fields
 * checked into a job, a job run on the generation thread into a response body
 * or server-sent events, errors, the model list and the metrics.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat_render.h"
#include "k3_sys.h"
#include "k3_utf8.h"
#include "k3_log.h"
#include "serve_impl.h"

#define SRV_MAX_STOPS 16

int srv_buf_add(srv_buf *b, const void *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

const char *const srv_endpoint_names[SRV_N_ENDPOINTS] = {
    "chat_completions", "completions", "models", "health", "metrics", "page", "messages", "count_tokens", "responses"
};

static void job_free(srv_job *j)
{
    if (j->api && j->api->free_state) j->api->free_state(j->api_state);
    free(j->body);
    free(j->ids);
    free(j->route);
    for (int i = 0; i < j->co.n_stops; i++) free(j->stops[i]);
    free(j->stops);
    free(j->model);
    free(j->out.p);
    free(j);
}

void srv_job_unref(srv *s, srv_job *j)
{
    (void)s;
    if (--j->refs == 0) job_free(j);
}

/* ---- errors ---------------------------------------------------------------- */

static const char *error_type(int status)
{
    switch (status) {
    case 400: case 404: case 405: case 408: case 413: return "invalid_request_error";
    case 401: return "authentication_error";
    case 429: case 503: return "server_busy";
    default: return "server_error";
    }
}

char *srv_api_error_json(int status, const char *msg)
{
    json_t *e = json_pack("{s:{s:s,s:s,s:n,s:i}}", "error", "message", msg, "type", error_type(status), "param",
                          "code", status);
    char *s = e ? json_dumps(e, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(e);
    return s;
}

/* ---- request fields ---------------------------------------------------------- */

typedef struct chk {
    json_t *r;
    char *msg;
    size_t cap;
} chk;

static int bad(chk *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(chk *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, c->cap, fmt, ap);
    va_end(ap);
    return 400;
}

const char *srv_json_type(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

json_t *srv_json_member(const json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* The field, or NULL when absent or null. */
static json_t *field(chk *c, const char *key)
{
    json_t *v = json_object_get(c->r, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int get_bool(chk *c, json_t *obj, const char *key, int *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return bad(c, "'%s' is %s: give true or false", key, srv_json_type(v));
    *out = json_is_true(v);
    return 0;
}

/* A number in [lo, hi] (lo excluded when open). */
static int get_num(chk *c, const char *key, double lo, double hi, int open, float *out)
{
    json_t *v = field(c, key);
    if (!v) return 0;
    if (!json_is_number(v)) return bad(c, "'%s' is %s: give a number", key, srv_json_type(v));
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi || (open && x == lo))
        return bad(c, "'%s' is %g: give a number in %s%g, %g]", key, x, open ? "(" : "[", lo, hi);
    *out = (float)x;
    return 0;
}

static int get_int(chk *c, const char *key, long long lo, long long hi, long long *out, int *given)
{
    json_t *v = field(c, key);
    if (!v) return 0;
    if (!json_is_integer(v)) return bad(c, "'%s' is %s: give an integer", key, srv_json_type(v));
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return bad(c, "'%s' is %lld: give an integer from %lld to %lld", key, x, lo, hi);
    *out = x;
    if (given) *given = 1;
    return 0;
}

static int get_stops(chk *c, srv_job *j)
{
    json_t *v = field(c, "stop");
    if (!v) return 0;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_string(v) && !json_is_array(v))
        return bad(c, "'stop' is %s: give a string or an array of strings", srv_json_type(v));
    if (n > SRV_MAX_STOPS) return bad(c, "'stop' has %zu strings: at most %d", n, SRV_MAX_STOPS);
    j->stops = calloc(n + 1, sizeof *j->stops);
    if (!j->stops) return 500;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(e)) return bad(c, "'stop'[%zu] is %s: give a string", i, srv_json_type(e));
        if (!json_string_length(e)) return bad(c, "'stop'[%zu] is empty: a stop string needs a character", i);
        if (!(j->stops[j->co.n_stops++] = strdup(json_string_value(e)))) return 500;
    }
    j->co.stops = (const char *const *)j->stops;
    return 0;
}

/* The fields both endpoints share. */
static int common_fields(srv *s, chk *c, srv_job *j)
{
    int rc;
    json_t *v;
    if ((v = field(c, "model")) && !json_is_string(v))
        return bad(c, "'model' is %s: give the model's name (GET /v1/models)", srv_json_type(v));
    if ((rc = get_bool(c, c->r, "stream", &j->stream))) return rc;
    if ((v = field(c, "stream_options"))) {
        if (!json_is_object(v)) return bad(c, "'stream_options' is %s: give an object", srv_json_type(v));
        if ((rc = get_bool(c, v, "include_usage", &j->include_usage))) return rc;
    }
    long long n = 1, mt = 0, seed = 0, top_k = 0;
    int given = 0, seeded = 0, k_given = 0;
    if ((rc = get_int(c, "n", 1, 1000000, &n, NULL))) return rc;
    if (n > SRV_N_MAX) return bad(c, "'n' is %lld: at most %d choices per request", n, SRV_N_MAX);
    j->n_choices = (int)n;
    if ((rc = get_int(c, "max_tokens", 1, 1 << 30, &mt, &given))) return rc;
    if ((rc = get_int(c, "max_completion_tokens", 1, 1 << 30, &mt, &given))) return rc;
    if (given) j->co.n_predict = (uint32_t)mt;
    if ((rc = get_num(c, "temperature", 0, 100, 0, &j->so.temp)) || (rc = get_num(c, "top_p", 0, 1, 1, &j->so.top_p)) ||
        (rc = get_num(c, "min_p", 0, 1, 0, &j->so.min_p)) ||
        (rc = get_num(c, "repeat_penalty", 0, 100, 1, &j->so.repeat_penalty)) ||
        (rc = get_num(c, "repetition_penalty", 0, 100, 1, &j->so.repeat_penalty)))
        return rc;
    if (j->so.min_p >= 1) return bad(c, "'min_p' is %g: give a number in [0, 1)", j->so.min_p);
    if ((rc = get_int(c, "top_k", 0, 1 << 30, &top_k, &k_given))) return rc;
    if (k_given) j->so.top_k = (uint32_t)top_k;   /* (not `given`: max_tokens sets that one) */
    if ((rc = get_int(c, "seed", INT64_MIN, INT64_MAX, &seed, &seeded))) return rc;
    if (seeded) j->so.seed = (uint64_t)seed;
    static const char *const penalties[] = { "frequency_penalty", "presence_penalty" };
    for (int i = 0; i < 2; i++) {
        float p = 0;
        if ((rc = get_num(c, penalties[i], -2, 2, 0, &p))) return rc;
        if (p != 0) return bad(c, "'%s' is not supported (k3 samples with 'repeat_penalty'); give 0 or leave it out",
                               penalties[i]);
    }
    int lp = 0;
    if ((rc = get_bool(c, c->r, "logprobs", &lp))) return rc;
    if (lp || field(c, "top_logprobs") || field(c, "logit_bias"))
        return bad(c, "'logprobs', 'top_logprobs' and 'logit_bias' are not supported");
    if ((rc = get_stops(c, j))) return rc;
    k3_diag d;
    if (k3_sampler_check(&j->so, &d)) return bad(c, "%s", d.msg);
    (void)s;
    return 0;
}

static int parse_chat(srv *s, srv_kind kind, const char *body, size_t len, srv_job **out, char *msg, size_t cap);

int srv_api_parse(srv *s, srv_kind kind, const char *body, size_t len, srv_job **out, char *msg, size_t cap)
{
    int rc = parse_chat(s, kind, body, len, out, msg, cap);
    if (rc) k3_escape_ctl_in_place(msg, cap);     /* it repeats what the client sent: one safe line */
    return rc;
}

static int parse_chat(srv *s, srv_kind kind, const char *body, size_t len, srv_job **out, char *msg, size_t cap)
{
    *out = NULL;
    chk c = {.msg = msg, .cap = cap};
    if (len == 0) return bad(&c, "the request body is empty: send a JSON object");
    json_error_t je;
    c.r = json_loadb(body, len, JSON_ALLOW_NUL, &je);
    if (!c.r) return bad(&c, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    int rc = 0;
    srv_job *j = calloc(1, sizeof *j);
    if (!j) { json_decref(c.r); return 500; }
    j->kind = kind;
    j->co = s->co;
    j->co.stops = NULL;
    j->co.n_stops = 0;
    j->so = s->so;
    j->refs = 1;
    j->api = &srv_api_openai;
    if (!json_is_object(c.r)) { rc = bad(&c, "the body is %s, not a JSON object", srv_json_type(c.r)); goto out; }
    if ((rc = common_fields(s, &c, j))) goto out;
    k3_diag d;
    uint32_t ctx = s->context;
    if (kind == SRV_CHAT) {
        json_t *m = json_object_get(c.r, "messages");
        if (!m) { rc = bad(&c, "no 'messages': a chat request needs the conversation"); goto out; }
        if (!json_is_array(m)) { rc = bad(&c, "'messages' is %s: give an array of messages", srv_json_type(m)); goto out; }
        if (!json_array_size(m)) { rc = bad(&c, "'messages' is empty: give at least one message"); goto out; }
        k3_chat_prompt pr = {0};
        k3_err e = k3_chat_render(s->tok, body, len, "the request", &pr, &d);
        if (!e && !pr.add_generation_prompt)
            e = k3_fail(&d, K3_ERR_USAGE, "add_generation_prompt is false: there is no answer to generate");
        if (!e && pr.n_ids >= ctx)
            e = k3_fail(&d, K3_ERR_USAGE, "the conversation renders to %zu tokens: it does not fit the context of "
                        "%u positions with room for an answer (k3run serve --context)", pr.n_ids, ctx);
        j->prompt_tokens = (uint32_t)pr.n_ids;
        if (!e && s->n_slots > 1 && (j->route = malloc(pr.n_ids * sizeof *j->route))) {   /* to choose a slot */
            memcpy(j->route, pr.ids, pr.n_ids * sizeof *j->route);
            j->n_route = (uint32_t)pr.n_ids;
        }
        k3_chat_prompt_free(&pr);
        if (e) { rc = e == K3_ERR_USAGE ? bad(&c, "%s", d.msg) : 500; if (rc == 500) snprintf(msg, cap, "%s", d.msg); goto out; }
        if (!(j->body = malloc(len + 1))) { rc = 500; goto out; }
        memcpy(j->body, body, len);
        j->body[len] = 0;
        j->body_len = len;
    } else {
        json_t *p = json_object_get(c.r, "prompt");
        if (p && json_is_array(p) && json_array_size(p) == 1) p = json_array_get(p, 0);
        if (!p) { rc = bad(&c, "no 'prompt': a completion request needs the text to continue"); goto out; }
        if (!json_is_string(p)) {
            rc = bad(&c, "'prompt' is %s: give a string (or an array of one string)", srv_json_type(p));
            goto out;
        }
        size_t n = 0, cp = 0;
        k3_err e = k3_tok_encode(s->tok, json_string_value(p), json_string_length(p), 0, &j->ids, &n, &cp, &d);
        if (e) { rc = 500; snprintf(msg, cap, "%s", d.msg); goto out; }
        if (n == 0) { rc = bad(&c, "'prompt' is empty: give the text to continue"); goto out; }
        if (n >= ctx) {
            rc = bad(&c, "the prompt is %zu tokens: it does not fit the context of %u positions with room for an "
                     "answer (k3run serve --context)", n, ctx);
            goto out;
        }
        j->n_ids = j->prompt_tokens = (uint32_t)n;
    }
    if (!(j->model = strdup(s->model_name))) { rc = 500; goto out; }
    static unsigned long long seq;
    j->created = (long long)time(NULL);
    snprintf(j->id, sizeof j->id, "%s-%llx%04llx", kind == SRV_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)j->created, __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED) & 0xffff);
out:
    json_decref(c.r);
    if (rc) {
        if (rc == 500 && !msg[0]) snprintf(msg, cap, "out of memory");
        job_free(j);
        return rc;
    }
    *out = j;
    return 0;
}

int srv_api_parse_as(srv *s, const srv_api_ops *api, const char *body, size_t len, srv_job **out, char *msg,
                     size_t cap)
{
    if (!api->to_chat) return srv_api_parse(s, SRV_CHAT, body, len, out, msg, cap);
    char *chat = NULL;
    size_t chat_len = 0;
    void *state = NULL;
    int rc = api->to_chat(s, body, len, &chat, &chat_len, &state, msg, cap);
    if (!rc) rc = srv_api_parse(s, SRV_CHAT, chat, chat_len, out, msg, cap);
    free(chat);
    if (rc) {
        k3_escape_ctl_in_place(msg, cap);
        if (api->free_state) api->free_state(state);
        return rc;
    }
    (*out)->api = api;
    (*out)->api_state = state;
    if (api->adjust) api->adjust(*out);
    return 0;
}

/* ---- output ----------------------------------------------------------------- */

/* Append an event (data: JSON) or a body to the job's output, for the connection to send. */
/* Waking the connection's thread for every token would cost a context switch per token on a CPU
   the compute threads share (8 % of the demo model's 0.55 ms tokens): events go out at most every
   SRV_FLUSH_MS (the stream's reader also looks that often), the end at once (its state change). */
static void put_raw(srv *s, srv_job *j, const char *name, const char *text, int event)
{
    double now = k3_now();
    pthread_mutex_lock(&s->mu);
    if (name) {
        srv_buf_add(&j->out, "event: ", 7);
        srv_buf_add(&j->out, name, strlen(name));
        srv_buf_add(&j->out, "\n", 1);
    }
    if (event) srv_buf_add(&j->out, "data: ", 6);
    srv_buf_add(&j->out, text, strlen(text));
    if (event) srv_buf_add(&j->out, "\n\n", 2);
    j->t_out = now;
    if (now - j->last_wake >= SRV_FLUSH_MS * 1e-3) {
        j->last_wake = now;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

void srv_put(srv *s, srv_job *j, const char *text, int event)
{
    put_raw(s, j, NULL, text, event);
}

void srv_put_json(srv *s, srv_job *j, json_t *doc)
{
    char *t = doc ? json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (t) put_raw(s, j, NULL, t, j->stream);
    free(t);
    json_decref(doc);
}

void srv_put_event(srv *s, srv_job *j, const char *name, json_t *doc)
{
    char *t = doc ? json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (t) put_raw(s, j, name, t, 1);
    free(t);
    json_decref(doc);
}

/* Bytes of one channel into whole UTF-8 characters (as k3_utf8_out does on a terminal): the
   complete part as a JSON-safe string, or NULL when nothing is complete yet. */
char *srv_utf8_take(srv_utf8 *u, const uint8_t *b, size_t n, int flush)
{
    srv_buf o = {0};
    for (size_t i = 0; i < n; i++) {
        uint8_t c = b[i];
        if (u->np) {
            u->pend[u->np++] = c;
            const char *why = NULL;
            size_t k = k3_utf8_seq(u->pend, (size_t)u->np, &why);
            if (k) { srv_buf_add(&o, u->pend, k); u->np = 0; continue; }
            if (why && strstr(why, "truncated") && u->np < 4) continue;
            u->np--;                                      /* can never complete: send it as it is */
            srv_buf_add(&o, u->pend, (size_t)u->np);
            u->np = 0;
        }
        if (c >= 0xC2 && c <= 0xF4) { u->pend[0] = c; u->np = 1; }
        else srv_buf_add(&o, &c, 1);
    }
    if (flush && u->np) { srv_buf_add(&o, u->pend, (size_t)u->np); u->np = 0; }
    if (!o.n) { free(o.p); return NULL; }
    char *t = k3_utf8_sanitize(o.p, o.n, NULL);
    free(o.p);
    return t;
}

json_t *srv_usage_json(const k3_chat_stats *st)
{
    return json_pack("{s:i,s:i,s:i,s:{s:i},s:{s:i}}", "prompt_tokens", (json_int_t)st->prompt_tokens,
                     "completion_tokens", (json_int_t)st->completion_tokens, "total_tokens",
                     (json_int_t)(st->prompt_tokens + st->completion_tokens), "prompt_tokens_details", "cached_tokens",
                     (json_int_t)st->cached_tokens, "completion_tokens_details", "reasoning_tokens",
                     (json_int_t)st->reasoning_tokens);
}

/* ---- the OpenAI API's answers ------------------------------------------------ */

/* A stream chunk: {"id", "object", "created", "model", "choices": [choice]} (choice stolen). */
static json_t *chunk(const srv_job *j, json_t *choice)
{
    json_t *c = json_pack("{s:s,s:s,s:I,s:s,s:[]}", "id", j->id, "object",
                          j->kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)j->created, "model", j->model, "choices");
    if (choice) json_array_append_new(json_object_get(c, "choices"), choice);
    return c;
}

static void put_delta(run_ctx *r, json_t *delta, const char *finish)
{
    srv_job *j = r->j;
    json_t *fin = finish ? json_string(finish) : json_null(), *ch;
    if (j->kind == SRV_CHAT) {
        ch = json_pack("{s:i,s:o,s:n,s:o}", "index", r->index, "delta", delta, "logprobs", "finish_reason", fin);
    } else {                                       /* a completion's chunk carries the text itself */
        json_t *t = json_object_get(delta, "content");
        ch = json_pack("{s:o,s:i,s:n,s:o}", "text", t ? json_incref(t) : json_string(""), "index", r->index,
                       "logprobs", "finish_reason", fin);
        json_decref(delta);
    }
    srv_put_json(r->s, j, chunk(j, ch));
}

static const char *openai_finish(const k3_chat_stats *st)
{
    return !strcmp(st->finish, "interrupted") ? "stop" : st->finish;
}

static void oa_begin(run_ctx *r)
{
    r->acc = json_array();
}

static void oa_start(run_ctx *r)
{
    if (r->j->stream && r->j->kind == SRV_CHAT)
        put_delta(r, json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL);
}

static void oa_text(run_ctx *r, int channel, const char *t)
{
    put_delta(r, json_pack("{s:s}", channel ? "content" : "reasoning_content", t), NULL);
}

static void oa_call(run_ctx *r, int i, const char *name, const char *arguments)
{
    char id[32];
    snprintf(id, sizeof id, "call_%d", i + 1);
    json_t *call = json_pack("{s:i,s:s,s:s,s:{s:s,s:s}}", "index", i, "id", id, "type", "function", "function", "name",
                             name, "arguments", arguments);
    put_delta(r, json_pack("{s:[o]}", "tool_calls", call), NULL);
}

static void oa_choice(run_ctx *r, const k3_chat_stats *st, const char *message, const char *text, size_t text_len)
{
    srv_job *j = r->j;
    const char *finish = openai_finish(st);
    if (j->stream) {
        put_delta(r, j->kind == SRV_CHAT ? json_object() : json_pack("{s:s}", "content", ""), finish);
    } else if (j->kind == SRV_CHAT) {
        json_t *msg = json_loads(message, JSON_ALLOW_NUL, NULL);
        json_array_append_new(r->acc, json_pack("{s:i,s:o,s:n,s:s}", "index", r->index, "message",
                                                msg ? msg : json_object(), "logprobs", "finish_reason", finish));
    } else {
        char *t = k3_utf8_sanitize(text, text_len, NULL);
        json_array_append_new(r->acc, json_pack("{s:i,s:s,s:n,s:s}", "index", r->index, "text", t ? t : "",
                                                "logprobs", "finish_reason", finish));
        free(t);
    }
}

static void oa_end(run_ctx *r, const k3_chat_stats *all, json_t *k3)
{
    srv *s = r->s;
    srv_job *j = r->j;
    if (j->stream) {
        if (j->include_usage) {
            json_t *c = chunk(j, NULL);
            json_object_set_new(c, "usage", srv_usage_json(all));
            json_object_set_new(c, "k3", k3);
            srv_put_json(s, j, c);
        } else {
            json_decref(k3);
        }
        srv_put(s, j, "[DONE]", 1);
    } else {
        json_t *doc = json_pack("{s:s,s:s,s:I,s:s,s:O,s:o,s:o}", "id", j->id, "object",
                                j->kind == SRV_CHAT ? "chat.completion" : "text_completion", "created",
                                (json_int_t)j->created, "model", j->model, "choices", r->acc, "usage",
                                srv_usage_json(all), "k3", k3);
        j->status = 200;
        srv_put_json(s, j, doc);
    }
    json_decref(r->acc);
    r->acc = NULL;
}

static void oa_fail(run_ctx *r, int status, const char *msg)
{
    char *err = srv_api_error_json(status, msg);
    if (err) srv_put(r->s, r->j, err, r->j->stream);
    if (r->j->stream) srv_put(r->s, r->j, "[DONE]", 1);
    free(err);
    json_decref(r->acc);
    r->acc = NULL;
}

const srv_api_ops srv_api_openai = {
    .name = "openai", .begin = oa_begin, .start = oa_start, .text = oa_text, .call = oa_call, .choice = oa_choice, .end = oa_end,
    .fail = oa_fail, .error_json = srv_api_error_json, .keepalive = ": keep-alive\n\n",
};

/* ---- running a job ----------------------------------------------------------- */

static void on_text(void *ctx, int channel, const uint8_t *b, size_t n)
{
    run_ctx *r = ctx;
    if (!r->j->stream) return;
    char *t = srv_utf8_take(&r->u8[channel], b, n, 0);
    if (t && *t) r->j->api->text(r, channel, t);
    free(t);
}

static void flush_text(run_ctx *r)
{
    for (int ch = 0; ch < 2; ch++) {
        char *t = srv_utf8_take(&r->u8[ch], NULL, 0, 1);
        if (t && *t) r->j->api->text(r, ch, t);
        free(t);
    }
}

static void on_call(void *ctx, const char *name, const char *arguments)
{
    run_ctx *r = ctx;
    srv_job *j = r->j;
    int i = r->n_calls++;
    if (!j->stream) return;
    flush_text(r);
    j->api->call(r, i, name, arguments);
}

static json_t *k3_json(const srv *s, const k3_chat_stats *st, const k3_weights_stats *w0, const k3_weights_stats *w1)
{
    double spt = st->completion_tokens > 1 ? (st->t_gen - (st->t_first - st->t_prompt)) / (st->completion_tokens - 1)
                                           : 0.0;
    json_t *k = json_object();
    json_object_set_new(k, "processed_tokens", json_integer(st->prompt_tokens - st->cached_tokens));
    json_object_set_new(k, "seconds_to_first_token", json_real(st->t_first));
    json_object_set_new(k, "prompt_seconds", json_real(st->t_prompt));
    json_object_set_new(k, "generate_seconds", json_real(st->t_gen));
    json_object_set_new(k, "seconds_per_token", json_real(spt > 0 ? spt : 0.0));
    json_object_set_new(k, "interrupted", json_boolean(!strcmp(st->finish ? st->finish : "", "interrupted")));
    json_object_set_new(k, "passes", json_integer((json_int_t)st->dec.passes));
    json_object_set_new(k, "drafted", json_integer((json_int_t)st->dec.drafted));
    json_object_set_new(k, "accepted", json_integer((json_int_t)st->dec.accepted));
    json_object_set_new(k, "tokens_per_pass",
                        json_real(st->dec.passes ? (double)st->dec.tokens / (double)st->dec.passes : 0.0));
    json_object_set_new(k, "bytes_read", json_integer((json_int_t)(w1->bytes_read - w0->bytes_read)));
    json_object_set_new(k, "expert_hits", json_integer((json_int_t)(w1->expert_hits - w0->expert_hits)));
    json_object_set_new(k, "expert_misses", json_integer((json_int_t)(w1->expert_misses - w0->expert_misses)));
    json_object_set_new(k, "isa", json_string(k3_isa_name(s->lo.isa)));
    json_object_set_new(k, "threads", json_integer(s->threads));
    return k;
}

/* Sum a choice's figures into the request's (the prompt is the first choice's: the others find it
   in the cache). */
static void add_stats(k3_chat_stats *all, const k3_chat_stats *st, int first)
{
    if (first) { *all = *st; return; }
    all->completion_tokens += st->completion_tokens;
    all->reasoning_tokens += st->reasoning_tokens;
    all->t_gen += st->t_gen;
    all->dec.passes += st->dec.passes;
    all->dec.drafted += st->dec.drafted;
    all->dec.accepted += st->dec.accepted;
    all->dec.tokens += st->dec.tokens;
}

/* ---- n choices, side by side ------------------------------------------------ */

/*
 * n choices (n > 1) come from one processed prompt. Choice i samples with the request's seed + i:
 * it is the answer the same request with that seed gets alone. The slot that took the request
 * (the leader) runs choice 0; once its prompt is processed (k3_chat_opts.on_prompt), it takes
 * every idle slot it can for the next choices and forks its state into each (k3_chat_fork: their
 * turns on the same request then process nothing), so they generate side by side, sharing each
 * pass. The choices no slot was free for go to the leader and the helpers as each finishes one,
 * each finding the prompt whole in its cache. Each choice is computed by exactly the code it runs
 * alone, on a state equal to the one it would have alone, so its bytes are the same whichever
 * slot runs it and whatever shares its passes.
 */

/* What a choice run by a helper slot gave (srv_job.fork[choice]). */
typedef struct srv_fork {
    k3_chat_stats st;
    json_t *acc;                   /* the API's gathering of that choice (OpenAI: its entry) */
    k3_err e;
    char msg[K3_DIAG_MAX];
} srv_fork;

typedef struct lead_ctx {
    srv *s;
    srv_slot *sl;
    srv_job *j;
} lead_ctx;

/* The leader's prompt is processed (its thread, between model calls: no pass runs meanwhile). */
static void fork_helpers(void *ctx, k3_chat *c)
{
    lead_ctx *L = ctx;
    srv *s = L->s;
    srv_job *j = L->j;
    srv_slot *got[K3_SERVE_SLOTS_MAX];
    int n = 0;
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < s->n_slots && j->next_choice < j->n_choices && !j->cancel && !s->stopping; i++) {
        srv_slot *o = &s->slots[i];
        if (o == L->sl || !o->idle || o->help) continue;
        o->idle = 0;                               /* no other job chooses it now (mine) */
        o->help = 1;
        o->help_choice = j->next_choice++;
        o->job = j;
        j->helpers++;
        j->refs++;
        got[n++] = o;
    }
    pthread_mutex_unlock(&s->mu);
    for (int k = 0; k < n; k++) {                  /* a fork refused leaves it empty: it processes the prompt */
        k3_diag d;
        if (k3_chat_fork(got[k]->chat, c, &d)) k3_warn("slot %u: %s", got[k]->idx, d.msg);
    }
    pthread_mutex_lock(&s->mu);
    for (int k = 0; k < n; k++) got[k]->help = 2;  /* go */
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* One choice of j in slot sl: its text streams and its result goes to r->acc (the API's choice). */
static k3_err run_choice(srv_slot *sl, run_ctx *r, int i, lead_ctx *lead, k3_chat_stats *st, k3_diag *d)
{
    srv_job *j = r->j;
    k3_chat_sink sink = {.text = on_text, .call = on_call, .ctx = r};
    char *message = NULL, *text = NULL;
    size_t text_len = 0;
    r->index = i;
    r->n_calls = 0;
    memset(r->u8, 0, sizeof r->u8);
    j->api->start(r);
    k3_sampler_opts so = j->so;
    so.seed += (uint64_t)i;
    k3_chat_opts co = j->co;
    if (lead) {
        co.on_prompt = fork_helpers;
        co.on_prompt_ctx = lead;
    }
    k3_err e = k3_chat_set_sampler(sl->chat, &so, d);
    if (!e && j->kind == SRV_CHAT)
        e = k3_chat_turn(sl->chat, j->body, j->body_len, &co, &sink, &j->cancel, &message, st, d);
    else if (!e)
        e = k3_chat_complete(sl->chat, j->ids, j->n_ids, r->s->eos, &co, &sink, &j->cancel, &text, &text_len, st, d);
    if (!e) {
        if (j->stream) flush_text(r);
        j->api->choice(r, st, message, text, text_len);
    }
    free(message);
    free(text);
    return e;
}

/* Choice i of j in helper slot sl, then the job's next choices while there are any: like the
   leader, a helper that is done takes the next (its cache holds the processed prompt), so the
   choices no slot was free for go side by side too. */
void srv_api_help(srv *s, srv_slot *sl, srv_job *j, int i)
{
    while (i >= 0) {
        srv_fork *f = &j->fork[i];
        run_ctx r = {.s = s, .j = j, .acc = json_array()};
        k3_diag d = {0};
        f->e = run_choice(sl, &r, i, NULL, &f->st, &d);
        if (f->e) {
            k3_chat_reset(sl->chat);              /* its state is unknown: start afresh */
            snprintf(f->msg, sizeof f->msg, "%s", d.msg);
        }
        f->acc = r.acc;
        pthread_mutex_lock(&s->mu);
        i = !f->e && !j->cancel && !s->stopping && j->next_choice < j->n_choices ? j->next_choice++ : -1;
        pthread_mutex_unlock(&s->mu);
    }
}

/* The leader's gathering and the helpers' in the order of the choices (OpenAI's: entries with "index"). */
static json_t *merge_choices(srv_job *j, json_t *lead)
{
    json_t *all = json_array();
    for (int i = 0; i < j->n_choices; i++) {
        json_t *from = j->fork[i].acc ? j->fork[i].acc : lead;
        size_t k;
        json_t *v;
        json_array_foreach(from, k, v) {
            if (json_integer_value(json_object_get(v, "index")) == i) {
                json_array_append(all, v);
                break;
            }
        }
    }
    json_decref(lead);
    return all;
}

void srv_api_run(srv *s, srv_slot *sl, srv_job *j)
{
    run_ctx r = {.s = s, .j = j};
    k3_chat_stats st, all;
    k3_weights_stats w0, w1;
    k3_diag d;
    k3_err e = K3_OK;
    lead_ctx lead = {.s = s, .sl = sl, .j = j};
    /* side by side only where there are other slots, in the API that has n (OpenAI's) */
    int side = j->n_choices > 1 && s->n_slots > 1 && j->api == &srv_api_openai &&
               (j->fork = calloc((size_t)j->n_choices, sizeof *j->fork)) != NULL;
    k3w_stats(s->ld.w, &w0);
    memset(&all, 0, sizeof all);
    j->api->begin(&r);
    j->next_choice = 1;
    for (int i = 0; i >= 0 && !e; ) {
        e = run_choice(sl, &r, i, i == 0 && side ? &lead : NULL, &st, &d);
        if (!e) add_stats(&all, &st, i == 0);
        if (j->cancel) break;                          /* the client left or the server stops */
        pthread_mutex_lock(&s->mu);
        i = j->next_choice < j->n_choices ? j->next_choice++ : -1;
        pthread_mutex_unlock(&s->mu);
    }
    if (side) {                                        /* the helpers' choices */
        /* no pass runs while an attached sequence is not in a model call: the leader steps out of
           the passes while it waits for the helpers' choices, and back in for its next job */
        if (s->bat) k3_batcher_detach(s->bat, sl->h);
        pthread_mutex_lock(&s->mu);
        if (e) j->cancel = 1;                          /* the answer failed: theirs are not needed */
        while (j->helpers) pthread_cond_wait(&s->cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
        if (s->bat) k3_batcher_attach(s->bat, sl->h);
        for (int i = 0; i < j->n_choices; i++) {
            srv_fork *f = &j->fork[i];
            if (!f->acc) continue;
            if (f->e && !e) {
                e = f->e;
                snprintf(d.msg, sizeof d.msg, "%s", f->msg);
            } else if (!f->e) {
                add_stats(&all, &f->st, 0);
            }
        }
        if (!e && r.acc && !j->stream) r.acc = merge_choices(j, r.acc);
        for (int i = 0; i < j->n_choices; i++) json_decref(j->fork[i].acc);
        free(j->fork);
        j->fork = NULL;
    }
    k3w_stats(s->ld.w, &w1);
    if (e) {
        /* a failure after the request was accepted: the model's state is unknown, start afresh */
        k3_chat_reset(sl->chat);
        int status = e == K3_ERR_USAGE ? 400 : 500;
        pthread_mutex_lock(&s->mu);
        s->mt.errors[status]++;
        if (e == K3_ERR_CORRUPT || e == K3_ERR_IO) {   /* the pack failed a read: /health says so */
            s->mt.damage_errors++;
            snprintf(s->damage, sizeof s->damage, "%s", d.msg);
        }
        pthread_mutex_unlock(&s->mu);
        j->api->fail(&r, status, d.msg);
        j->status = status;
        return;
    }
    j->api->end(&r, &all, k3_json(s, &all, &w0, &w1));
    pthread_mutex_lock(&s->mu);
    s->mt.prompt_tokens += all.prompt_tokens;
    s->mt.cached_tokens += all.cached_tokens;
    s->mt.completion_tokens += all.completion_tokens;
    s->mt.gen_seconds += all.t_gen;
    sl->tokens += all.completion_tokens;
    if (s->n_slots == 1) {              /* with several slots the reads are shared: counted from the weights */
        s->mt.bytes_read += w1.bytes_read - w0.bytes_read;
        s->mt.expert_hits += w1.expert_hits - w0.expert_hits;
        s->mt.expert_misses += w1.expert_misses - w0.expert_misses;
    }
    pthread_mutex_unlock(&s->mu);
}

/* ---- models and metrics ---------------------------------------------------- */

char *srv_api_models_json(const srv *s)
{
    json_t *doc = json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id", s->model_name, "object",
                            "model", "created", (json_int_t)time(NULL), "owned_by", "k3");
    char *t = doc ? json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(doc);
    return t;
}

char *srv_api_metrics_text(srv *s)
{
    srv_buf b = {0};
    char line[256];
    pthread_mutex_lock(&s->mu);
    srv_metrics m = s->mt;
    unsigned queued = s->q_n, busy = s->running, conns = s->n_socks;
    uint64_t slot_tokens[K3_SERVE_SLOTS_MAX];
    double slot_busy[K3_SERVE_SLOTS_MAX];
    int slot_job[K3_SERVE_SLOTS_MAX];
    for (uint32_t i = 0; i < s->n_slots; i++) {
        slot_tokens[i] = s->slots[i].tokens;
        slot_busy[i] = s->slots[i].busy_s;
        slot_job[i] = s->slots[i].job != NULL;
    }
    pthread_mutex_unlock(&s->mu);
    if (s->n_slots > 1) {
        k3_weights_stats w;
        k3w_stats(s->ld.w, &w);
        m.bytes_read = w.bytes_read - s->w_base.bytes_read;
        m.expert_hits = w.expert_hits - s->w_base.expert_hits;
        m.expert_misses = w.expert_misses - s->w_base.expert_misses;
    }
#define LINE(...) do { snprintf(line, sizeof line, __VA_ARGS__); srv_buf_add(&b, line, strlen(line)); } while (0)
    LINE("# HELP k3_requests_total HTTP requests answered, by endpoint.\n# TYPE k3_requests_total counter\n");
    for (int i = 0; i < SRV_N_ENDPOINTS; i++)
        LINE("k3_requests_total{endpoint=\"%s\"} %llu\n", srv_endpoint_names[i], (unsigned long long)m.requests[i]);
    LINE("# HELP k3_errors_total Requests answered with an error, by HTTP status.\n# TYPE k3_errors_total counter\n");
    for (int i = 400; i < 600; i++)
        if (m.errors[i]) LINE("k3_errors_total{status=\"%d\"} %llu\n", i, (unsigned long long)m.errors[i]);
    LINE("# HELP k3_prompt_tokens_total Prompt tokens of answered requests.\n# TYPE k3_prompt_tokens_total counter\n"
         "k3_prompt_tokens_total %llu\n", (unsigned long long)m.prompt_tokens);
    LINE("# HELP k3_prompt_cached_tokens_total Of them, served from the prompt cache.\n"
         "# TYPE k3_prompt_cached_tokens_total counter\nk3_prompt_cached_tokens_total %llu\n",
         (unsigned long long)m.cached_tokens);
    LINE("# HELP k3_completion_tokens_total Generated tokens.\n# TYPE k3_completion_tokens_total counter\n"
         "k3_completion_tokens_total %llu\n", (unsigned long long)m.completion_tokens);
    LINE("# HELP k3_generate_seconds_total Seconds spent generating.\n# TYPE k3_generate_seconds_total counter\n"
         "k3_generate_seconds_total %.6f\n", m.gen_seconds);
    LINE("# HELP k3_tokens_per_second Generated tokens per second of generating, since the start.\n"
         "# TYPE k3_tokens_per_second gauge\nk3_tokens_per_second %.4f\n",
         m.gen_seconds > 0 ? (double)m.completion_tokens / m.gen_seconds : 0.0);
    LINE("# HELP k3_prompt_cache_hit_ratio Cached prompt tokens over prompt tokens.\n"
         "# TYPE k3_prompt_cache_hit_ratio gauge\nk3_prompt_cache_hit_ratio %.6f\n",
         m.prompt_tokens ? (double)m.cached_tokens / (double)m.prompt_tokens : 0.0);
    LINE("# HELP k3_expert_cache_hit_ratio Expert records found in memory over those asked for.\n"
         "# TYPE k3_expert_cache_hit_ratio gauge\nk3_expert_cache_hit_ratio %.6f\n",
         m.expert_hits + m.expert_misses ? (double)m.expert_hits / (double)(m.expert_hits + m.expert_misses) : 0.0);
    LINE("# HELP k3_bytes_read_total Bytes read from the pack while answering.\n# TYPE k3_bytes_read_total counter\n"
         "k3_bytes_read_total %llu\n", (unsigned long long)m.bytes_read);
    LINE("# HELP k3_queue_length Requests waiting for the generation thread.\n# TYPE k3_queue_length gauge\n"
         "k3_queue_length %u\n", queued);
    LINE("# HELP k3_busy Slots generating an answer.\n# TYPE k3_busy gauge\nk3_busy %u\n", busy);
    LINE("# HELP k3_slots Slots: conversations generated together (--parallel).\n# TYPE k3_slots gauge\n"
         "k3_slots %u\n", s->n_slots);
    LINE("# HELP k3_slot_busy 1 while the slot generates an answer.\n# TYPE k3_slot_busy gauge\n");
    for (uint32_t i = 0; i < s->n_slots; i++) LINE("k3_slot_busy{slot=\"%u\"} %d\n", i, slot_job[i]);
    LINE("# HELP k3_slot_tokens_per_second A slot's generated tokens per second of its jobs.\n"
         "# TYPE k3_slot_tokens_per_second gauge\n");
    for (uint32_t i = 0; i < s->n_slots; i++)
        LINE("k3_slot_tokens_per_second{slot=\"%u\"} %.4f\n", i, slot_busy[i] > 0 ? (double)slot_tokens[i] / slot_busy[i] : 0.0);
    if (s->bat) {
        k3_batch_stats bs;
        k3_batcher_stats(s->bat, &bs);
        LINE("# HELP k3_passes_total Forward passes run.\n# TYPE k3_passes_total counter\nk3_passes_total %llu\n",
             (unsigned long long)bs.passes);
        LINE("# HELP k3_pass_sequences_total Conversations in them, summed over passes.\n"
             "# TYPE k3_pass_sequences_total counter\nk3_pass_sequences_total %llu\n", (unsigned long long)bs.groups);
        LINE("# HELP k3_pass_splits_total Prompt chunks carried over to the next pass (its rows were full).\n"
             "# TYPE k3_pass_splits_total counter\nk3_pass_splits_total %llu\n", (unsigned long long)bs.splits);
        LINE("# HELP k3_pass_shared_verify_total Passes that verified one conversation's drafts beside another.\n"
             "# TYPE k3_pass_shared_verify_total counter\nk3_pass_shared_verify_total %llu\n",
             (unsigned long long)bs.shared_verify);
    }
    LINE("# HELP k3_rejected_busy_total Requests refused because the queue was full.\n"
         "# TYPE k3_rejected_busy_total counter\nk3_rejected_busy_total %llu\n", (unsigned long long)m.rejected_busy);
    LINE("# HELP k3_pack_damage_errors_total Requests failed by a weight that failed its hash or its read.\n"
         "# TYPE k3_pack_damage_errors_total counter\nk3_pack_damage_errors_total %llu\n",
         (unsigned long long)m.damage_errors);
    LINE("# HELP k3_connections Open client connections.\n# TYPE k3_connections gauge\nk3_connections %u\n", conns);
    LINE("# HELP k3_refused_connections_total Connections over --max-conns or --max-conns-per-ip (answered 503).\n"
         "# TYPE k3_refused_connections_total counter\nk3_refused_connections_total %llu\n",
         (unsigned long long)m.refused_conns);
    LINE("# HELP k3_timed_out_connections_total Connections closed because their request had not arrived in time.\n"
         "# TYPE k3_timed_out_connections_total counter\nk3_timed_out_connections_total %llu\n",
         (unsigned long long)m.timed_out_conns);
#undef LINE
    return b.p;
}

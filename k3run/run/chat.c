/*
 * chat.c - chat turns with the prompt cache (chat.h).
 */
#include "chat.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "chat_parse.h"
#include "decode.h"
#include "chat_render.h"
#include "k3_sys.h"
#include "k3_utf8.h"
#include "stopstr.h"

#define MAX_SNAPS 64

struct k3_chat {
    k3_model *m;
    const k3_tok *tok;
    k3_sampler s;
    int32_t *held;                 /* [cap] ids the model processed: held[0 .. pos) */
    uint32_t cap;
    k3_model_snap *snap[MAX_SNAPS];/* [n_snaps] oldest first */
    uint32_t n_snaps, max_snaps;
    int32_t open_id, close_id, sep_id;
    uint32_t max_draft;            /* speculative decoding (decode.h), 0: off */
    k3_dec_learn learn;            /* the draft-length rule's state, across turns */
    /* the shared prefix (k3_chat_keep_prefix): the state at the end of the last prompt's tools and
       system messages, for this chat's next conversations and other chats' (k3_chat_take_prefix) */
    k3_model_snap *prefix;         /* NULL: not kept */
    int prefix_ok;                 /* it holds held[0 .. its pos), still in the model's cache (under mu) */
    pthread_mutex_t mu;            /* prefix_ok, and the prefix and cache rows below it while read */
};

void k3_chat_set_draft(k3_chat *c, uint32_t max_draft, double rho)
{
    c->max_draft = max_draft;
    c->learn = (k3_dec_learn){.rho_plan = rho};
}

k3_err k3_chat_new(k3_model *m, const k3_tok *tok, const k3_sampler_opts *so, uint32_t snapshots, k3_chat **out,
                   k3_diag *d)
{
    *out = NULL;
    k3_chat *c = calloc(1, sizeof *c);
    if (!c) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    c->m = m;
    c->tok = tok;
    c->max_snaps = snapshots < MAX_SNAPS ? snapshots : MAX_SNAPS;
    c->cap = k3_model_context(m) + 1;               /* the context and an answer's last, unfed token */
    c->open_id = k3_tok_special_id(tok, "<|open|>");
    c->close_id = k3_tok_special_id(tok, "<|close|>");
    c->sep_id = k3_tok_special_id(tok, "<|sep|>");
    k3_err e = k3_sampler_init(&c->s, so, k3_model_vocab(m), d);
    if (e) { free(c); return e; }
    if (!(c->held = malloc((size_t)c->cap * sizeof *c->held))) {
        k3_chat_free(c);
        return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&c->mu, NULL);
    for (uint32_t i = 0; i < c->max_snaps; i++)
        if ((e = k3_model_snap_new(m, &c->snap[i], d))) { k3_chat_free(c); return e; }
    if (c->open_id < 0 || c->close_id < 0 || c->sep_id < 0) {
        k3_chat_free(c);
        return k3_fail(d, K3_ERR_USAGE, "the tokenizer has no <|open|>, <|close|> and <|sep|>: not a K3 chat model");
    }
    *out = c;
    return K3_OK;
}

k3_err k3_chat_set_sampler(k3_chat *c, const k3_sampler_opts *so, k3_diag *d)
{
    return k3_sampler_reset(&c->s, so, d);
}

void k3_chat_free(k3_chat *c)
{
    if (!c) return;
    for (uint32_t i = 0; i < c->max_snaps; i++) k3_model_snap_free(c->snap[i]);
    k3_model_snap_free(c->prefix);
    k3_sampler_free(&c->s);
    free(c->held);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* The prefix no longer holds (the model goes below it, or holds other ids): before the cache rows
   under it are written again. */
static void drop_prefix(k3_chat *c)
{
    if (!c->prefix) return;
    pthread_mutex_lock(&c->mu);
    c->prefix_ok = 0;
    pthread_mutex_unlock(&c->mu);
}

k3_err k3_chat_keep_prefix(k3_chat *c, k3_diag *d)
{
    return c->prefix ? K3_OK : k3_model_snap_new(c->m, &c->prefix, d);
}

void k3_chat_reset(k3_chat *c)
{
    drop_prefix(c);
    k3_model_reset(c->m);
    k3_sampler_forget(&c->s);
    c->n_snaps = 0;
}

const int32_t *k3_chat_held(const k3_chat *c, uint32_t *n)
{
    *n = k3_model_pos(c->m);
    return c->held;
}

k3_sampler *k3_chat_sampler(k3_chat *c) { return &c->s; }

k3_err k3_chat_adopt(k3_chat *c, const int32_t *ids, uint32_t n, k3_diag *d)
{
    uint32_t pos = k3_model_pos(c->m);
    if (n < pos) return k3_fail(d, K3_ERR_INTERNAL, "adopt: %u ids for position %u", n, pos);
    drop_prefix(c);
    k3_sampler_forget(&c->s);
    for (uint32_t i = 0; i < pos; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= k3_model_vocab(c->m)) {
            k3_chat_reset(c);
            return k3_fail(d, K3_ERR_CORRUPT, "the session's token %u (id %d) is outside the vocabulary", i, ids[i]);
        }
        c->held[i] = ids[i];
        k3_sampler_accept(&c->s, ids[i]);
    }
    c->n_snaps = 0;
    return K3_OK;
}

static void take_snapshot(k3_chat *c);

k3_err k3_chat_fork(k3_chat *dst, const k3_chat *src, k3_diag *d)
{
    drop_prefix(dst);
    k3_err e = k3_model_seq_copy(dst->m, src->m, d);
    if (!e) e = k3_chat_adopt(dst, src->held, k3_model_pos(src->m), d);  /* the ids, the sampler's history */
    if (!e) take_snapshot(dst);
    else k3_chat_reset(dst);                        /* a fork that failed leaves it empty, never half made */
    return e;
}

/* Process ids[0 .. n) (a prompt's rest, a generated or forced id): hold them, move the model past them. */
static k3_err feed(k3_chat *c, const int32_t *ids, uint32_t n, k3_diag *d)
{
    uint32_t B = k3_model_max_batch(c->m), pos = k3_model_pos(c->m);
    if ((uint64_t)pos + n > k3_model_context(c->m))
        return k3_fail(d, K3_ERR_USAGE, "the context is full (%u positions): use a larger --context",
                       k3_model_context(c->m));
    for (uint32_t i = 0; i < n; i += B) {
        uint32_t t = n - i < B ? n - i : B;
        k3_err e = k3_model_forward(c->m, ids + i, t, d);
        if (e) return e;
        memcpy(c->held + pos + i, ids + i, t * sizeof *ids);
    }
    return K3_OK;
}

/* Where prompt[0 .. n) can start from: *restore 0 when the model's own state serves (it holds a
   prefix of the prompt), else 1 and the kept state to restore (NULL: none, from 0). */
static const k3_model_snap *start_state(const k3_chat *c, const int32_t *p, uint32_t n, int *restore)
{
    uint32_t pos = k3_model_pos(c->m), lcp = 0;
    while (lcp < pos && lcp < n && c->held[lcp] == p[lcp]) lcp++;
    /* the whole prompt held: the last token's logits are needed, which the model has at n, and a
       snapshot taken at n keeps (an identical prompt resent); else process the last token again */
    int whole = lcp == n && pos > n;
    if (lcp == n && pos > n) lcp = n - 1;
    *restore = lcp < pos;
    if (!*restore) return NULL;
    const k3_model_snap *best = NULL;
    for (uint32_t i = 0; i < c->n_snaps; i++)
        if ((k3_model_snap_pos(c->snap[i]) <= lcp || (whole && k3_model_snap_pos(c->snap[i]) == n)) &&
            (!best || k3_model_snap_pos(c->snap[i]) > k3_model_snap_pos(best)))
            best = c->snap[i];
    if (c->prefix && c->prefix_ok && k3_model_snap_pos(c->prefix) <= lcp &&    /* only c's thread sets it */
        (!best || k3_model_snap_pos(c->prefix) > k3_model_snap_pos(best)))
        best = c->prefix;
    return best;
}

uint32_t k3_chat_cached_for(const k3_chat *c, const int32_t *p, uint32_t n)
{
    int restore;
    const k3_model_snap *best = start_state(c, p, n, &restore);
    return !restore ? k3_model_pos(c->m) : best ? k3_model_snap_pos(best) : 0;
}

/* Bring the model to prompt[0 .. n): keep the longest held prefix reachable, process the rest;
   with a prefix kept, the state at n_system (the end of the tools and system messages; 0: none) is
   its new prefix. */
static k3_err sync_prompt(k3_chat *c, const int32_t *p, uint32_t n, uint32_t n_system, uint32_t *cached,
                          k3_diag *d)
{
    uint32_t pos = k3_model_pos(c->m);
    int restore;
    const k3_model_snap *best = start_state(c, p, n, &restore);
    k3_err e;
    if (restore) {
        /* below the prefix, the cache rows under it are about to be written again */
        if (c->prefix_ok && (!best || k3_model_snap_pos(best) < k3_model_snap_pos(c->prefix))) drop_prefix(c);
        if (best) {
            if ((e = k3_model_snap_restore(c->m, best, d))) return e;
        } else {
            k3_model_reset(c->m);
        }
        pos = k3_model_pos(c->m);
        /* snapshots past the new position hold a history that is about to be overwritten */
        uint32_t k = 0;
        for (uint32_t i = 0; i < c->n_snaps; i++) {
            if (k3_model_snap_pos(c->snap[i]) <= pos) {
                k3_model_snap *t = c->snap[k];
                c->snap[k++] = c->snap[i];
                c->snap[i] = t;
            }
        }
        c->n_snaps = k;
        k3_sampler_forget(&c->s);
        for (uint32_t i = 0; i < pos; i++) k3_sampler_accept(&c->s, c->held[i]);
    }
    *cached = pos;
    if (c->prefix && n_system > pos && n_system < n) {     /* a new shared part: its state kept */
        drop_prefix(c);
        if ((e = feed(c, p + pos, n_system - pos, d))) return e;
        k3_model_snap_take(c->m, c->prefix);
        pthread_mutex_lock(&c->mu);
        c->prefix_ok = 1;
        pthread_mutex_unlock(&c->mu);
        pos = n_system;
    }
    if ((e = feed(c, p + pos, n - pos, d))) return e;
    for (uint32_t i = *cached; i < n; i++) k3_sampler_accept(&c->s, p[i]);
    return K3_OK;
}

/* How many of p[0..n) src's prefix covers, 0: none (src->mu held). */
static uint32_t prefix_covers(const k3_chat *src, const int32_t *p, uint32_t n)
{
    uint32_t at = k3_model_snap_pos(src->prefix);
    return src->prefix_ok && at <= n && !memcmp(src->held, p, (size_t)at * sizeof *p) ? at : 0;
}

uint32_t k3_chat_prefix_for(k3_chat *src, const int32_t *p, uint32_t n)
{
    if (!src->prefix) return 0;
    pthread_mutex_lock(&src->mu);
    uint32_t got = prefix_covers(src, p, n);
    pthread_mutex_unlock(&src->mu);
    return got;
}

k3_err k3_chat_take_prefix(k3_chat *dst, k3_chat *src, const int32_t *p, uint32_t n, uint32_t *taken, k3_diag *d)
{
    *taken = 0;
    if (src == dst || !src->prefix || !dst->prefix) return K3_OK;
    drop_prefix(dst);                                 /* dst's is overwritten below: nobody reads it */
    k3_err e = K3_OK;
    pthread_mutex_lock(&src->mu);                     /* src's prefix and the cache rows below it stay */
    uint32_t at = prefix_covers(src, p, n);
    if (at) {
        e = k3_model_seq_copy_at(dst->m, src->m, src->prefix, d);
        if (!e) {
            memcpy(dst->held, src->held, (size_t)at * sizeof *p);
            k3_model_snap_copy(dst->prefix, src->prefix);
        }
    }
    pthread_mutex_unlock(&src->mu);
    if (at && !e) e = k3_chat_adopt(dst, dst->held, at, d);   /* the sampler's history, as a fork */
    if (e) {
        k3_chat_reset(dst);
        return e;
    }
    if ((*taken = at)) {
        pthread_mutex_lock(&dst->mu);
        dst->prefix_ok = 1;
        pthread_mutex_unlock(&dst->mu);
    }
    return K3_OK;
}

static void take_snapshot(k3_chat *c)
{
    if (!c->max_snaps) return;
    uint32_t pos = k3_model_pos(c->m);
    for (uint32_t i = 0; i < c->n_snaps; i++)
        if (k3_model_snap_pos(c->snap[i]) == pos) return;
    if (c->n_snaps == c->max_snaps) {                 /* drop the oldest */
        k3_model_snap *t = c->snap[0];
        memmove(c->snap, c->snap + 1, (c->n_snaps - 1) * sizeof *c->snap);
        c->snap[--c->n_snaps] = t;
    }
    k3_model_snap_take(c->m, c->snap[c->n_snaps++]);
}

/* The turn's plumbing between the parser, the stop strings and the sink. */
typedef struct turn {
    const k3_chat_sink *sink;
    k3_stopstr stop;
    int stopped;                   /* a stop string ended the answer */
    char *content;                 /* [cn] the answer as shown (stop strings cut) */
    size_t cn, ccap;
} turn;

static void emit_content(void *ctx, const uint8_t *b, size_t n)
{
    turn *t = ctx;
    if (t->cn + n + 1 > t->ccap) {
        size_t nc = (t->cn + n + 1) * 2;
        char *p = realloc(t->content, nc);
        if (!p) return;
        t->content = p;
        t->ccap = nc;
    }
    memcpy(t->content + t->cn, b, n);
    t->cn += n;
    t->content[t->cn] = 0;
    if (t->sink && t->sink->text) t->sink->text(t->sink->ctx, 1, b, n);
}

static void on_text(void *ctx, k3_chat_channel ch, const uint8_t *b, size_t n)
{
    turn *t = ctx;
    if (ch == K3_CHAT_REASONING) {
        if (t->sink && t->sink->text) t->sink->text(t->sink->ctx, 0, b, n);
    } else if (!t->stopped && k3_stopstr_feed(&t->stop, b, n, emit_content, t)) {
        t->stopped = 1;
    }
}

static void on_call(void *ctx, const k3_chat_call *call, size_t index)
{
    turn *t = ctx;
    (void)index;
    if (!t->stopped && t->sink && t->sink->call) t->sink->call(t->sink->ctx, call->name, call->arguments);
}

/* A JSON string of bytes that may not be valid UTF-8 (U+FFFD for the bad ones). */
static json_t *jstr(const void *b, size_t n)
{
    size_t k;
    char *s = k3_utf8_sanitize(b ? b : "", b ? n : 0, &k);
    json_t *j = s ? json_stringn(s, k) : NULL;
    free(s);
    return j ? j : json_string("");
}

/* The assistant message of a finished turn, as JSON text: the content as shown (stop strings
   cut), the reasoning, the complete calls (none after a stop string). */
static char *assistant_message(const k3_chat_parser *p, const turn *t)
{
    json_t *msg = json_object();
    size_t nr = 0;
    const uint8_t *r = k3_chat_parser_reasoning(p, &nr);
    size_t n_calls = t->stopped ? 0 : k3_chat_parser_n_calls(p);
    json_object_set_new(msg, "role", json_string("assistant"));
    json_object_set_new(msg, "content", n_calls && !t->cn ? json_null() : jstr(t->content, t->cn));
    json_object_set_new(msg, "reasoning_content", jstr(r, nr));
    if (n_calls) {
        json_t *calls = json_array();
        for (size_t i = 0; i < n_calls; i++) {
            const k3_chat_call *k = k3_chat_parser_call(p, i);
            char id[32];
            snprintf(id, sizeof id, "call_%zu", i + 1);
            json_t *fn = json_object();
            json_object_set_new(fn, "name", jstr(k->name, strlen(k->name)));
            json_object_set_new(fn, "arguments", jstr(k->arguments, strlen(k->arguments)));
            json_array_append_new(calls, json_pack("{s:s,s:s,s:o}", "id", id, "type", "function", "function", fn));
        }
        json_object_set_new(msg, "tool_calls", calls);
    }
    char *s = json_dumps(msg, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(msg);
    return s;
}

k3_err k3_chat_turn(k3_chat *c, const char *request, size_t len, const k3_chat_opts *o, const k3_chat_sink *sink,
                    volatile sig_atomic_t *stop, char **message, k3_chat_stats *st, k3_diag *d)
{
    memset(st, 0, sizeof *st);
    *message = NULL;
    double t0 = k3_now();
    k3_chat_prompt pr = {0};
    k3_err e = k3_chat_render(c->tok, request, len, "the request", &pr, d);
    if (e) return e;
    uint32_t ctx = k3_model_context(c->m);
    if (!pr.add_generation_prompt) {
        k3_chat_prompt_free(&pr);
        return k3_fail(d, K3_ERR_USAGE, "the request has add_generation_prompt false: there is no answer to generate");
    }
    if (pr.n_ids == 0 || pr.n_ids >= ctx) {
        k3_chat_prompt_free(&pr);
        return k3_fail(d, K3_ERR_USAGE, "the conversation renders to %zu tokens: it does not fit the context of %u "
                       "positions with room for an answer (--context)", pr.n_ids, ctx);
    }
    st->prompt_tokens = (uint32_t)pr.n_ids;
    if ((e = sync_prompt(c, pr.ids, (uint32_t)pr.n_ids, (uint32_t)pr.n_system, &st->cached_tokens, d))) goto out;
    take_snapshot(c);
    if (o->on_prompt) o->on_prompt(o->on_prompt_ctx, c);
    st->t_prompt = k3_now() - t0;

    turn t = {.sink = sink};
    k3_chat_parser p;
    if ((e = k3_stopstr_init(&t.stop, o->stops, (size_t)o->n_stops, d))) goto out;
    if ((e = k3_chat_parser_init(&p, c->tok, pr.thinking, pr.tools_declared, d))) {
        k3_stopstr_free(&t.stop);
        goto out;
    }
    k3_chat_parse_cb cb = {.text = on_text, .call = on_call, .ctx = &t};
    /* <|close|>think<|sep|><|open|>response<|sep|>: the think channel closed as the format writes it */
    int32_t forced[64];
    uint32_t n_forced = 0;
    {
        int32_t *ids = NULL;
        size_t n = 0, cap = 0;
        forced[n_forced++] = c->close_id;
        if (!k3_tok_encode(c->tok, "think", 5, 0, &ids, &n, &cap, d)) {
            for (size_t i = 0; i < n && n_forced < 30; i++) forced[n_forced++] = ids[i];
        }
        forced[n_forced++] = c->sep_id;
        forced[n_forced++] = c->open_id;
        n = 0;
        if (!k3_tok_encode(c->tok, "response", 8, 0, &ids, &n, &cap, d)) {
            for (size_t i = 0; i < n && n_forced < 62; i++) forced[n_forced++] = ids[i];
        }
        forced[n_forced++] = c->sep_id;
        free(ids);
    }
    double tg = k3_now();
    int ended = 0, interrupted = 0;
    k3_decoder dc;
    k3_dec_init(&dc, c->m, &c->s, c->held, k3_model_pos(c->m), c->cap, c->max_draft, &c->learn);
    const char *script = getenv("K3_TEST_ANSWER");
    if (script && *script) {
        /* tests only: the answer's text (special-token markup included) stands for the model's
           tokens, fed through the parser and the model like forced ids; how a front end shows an
           answer the model could give (tool calls from a model not trained to make them) */
        int32_t *ids = NULL;
        size_t n = 0, cap = 0;
        if (!(e = k3_tok_encode(c->tok, script, strlen(script), 1, &ids, &n, &cap, d))) {
            if (n > o->n_predict) n = o->n_predict;
            if (k3_model_pos(c->m) + n >= ctx) n = ctx - 1 - k3_model_pos(c->m);
            for (size_t i = 0; i < n && !ended; i++) {
                if (k3_chat_parser_in_think(&p)) st->reasoning_tokens++;
                st->completion_tokens++;
                ended = k3_chat_parser_feed(&p, ids[i], &cb) > 0;
            }
            if (st->completion_tokens && !(e = feed(c, ids, st->completion_tokens - 1, d)))
                k3_dec_fed(&dc, k3_model_pos(c->m));
            st->t_first = k3_now() - t0;
        }
        free(ids);
    }
    while (!(script && *script) && !e && st->completion_tokens < o->n_predict) {
        if (stop && *stop) { interrupted = 1; break; }
        if (o->think_budget && k3_chat_parser_in_think(&p) && st->reasoning_tokens >= o->think_budget &&
            !st->think_closed) {
            if (st->completion_tokens + n_forced > o->n_predict) break;
            for (uint32_t i = 0; i < n_forced; i++) k3_chat_parser_feed(&p, forced[i], &cb);
            st->completion_tokens += n_forced;
            st->think_closed = 1;
            if ((e = k3_dec_settle(&dc, d))) break;               /* the answer so far, then the forced ids */
            if ((e = feed(c, forced, n_forced, d))) break;
            k3_dec_fed(&dc, k3_model_pos(c->m));
            continue;
        }
        int32_t id;
        if ((e = k3_dec_next(&dc, o->n_predict - st->completion_tokens, &id, d))) break;
        if (st->completion_tokens == 0) st->t_first = k3_now() - t0;
        if (k3_chat_parser_in_think(&p)) st->reasoning_tokens++;
        st->completion_tokens++;
        int r = k3_chat_parser_feed(&p, id, &cb);
        if (r < 0) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory parsing the answer"); break; }
        if (r) { ended = 1; break; }
        if (t.stopped) break;
        if (st->completion_tokens == o->n_predict) break;   /* no pass for a token nothing follows */
        if (k3_dec_pos(&dc) + 1 >= ctx) break;              /* the context is full: the answer ends here */
    }
    if (!e) e = k3_dec_finish(&dc, d);                      /* the model holds the answer but its last id */
    st->dec = dc.stats;
    k3_chat_parser_finish(&p, &cb);
    if (!t.stopped) k3_stopstr_finish(&t.stop, emit_content, &t);
    st->t_gen = k3_now() - tg;
    if (!e) {
        size_t n_calls = t.stopped ? 0 : k3_chat_parser_n_calls(&p);
        st->finish = interrupted ? "interrupted" : n_calls ? "tool_calls" : (ended || t.stopped) ? "stop" : "length";
        st->stop_index = t.stopped ? k3_stopstr_which(&t.stop) : -1;
        if (!(*message = assistant_message(&p, &t)))
            e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
    }
    k3_chat_parser_free(&p);
    k3_stopstr_free(&t.stop);
    free(t.content);
out:
    k3_chat_prompt_free(&pr);
    return e;
}

k3_err k3_chat_complete(k3_chat *c, const int32_t *ids, uint32_t n, int64_t eos, const k3_chat_opts *o,
                        const k3_chat_sink *sink, volatile sig_atomic_t *stop, char **text, size_t *text_len,
                        k3_chat_stats *st, k3_diag *d)
{
    memset(st, 0, sizeof *st);
    *text = NULL;
    *text_len = 0;
    double t0 = k3_now();
    uint32_t ctx = k3_model_context(c->m);
    if (n == 0) return k3_fail(d, K3_ERR_USAGE, "the prompt is empty");
    if (n >= ctx)
        return k3_fail(d, K3_ERR_USAGE, "the prompt is %u tokens: it does not fit the context of %u positions with "
                       "room for an answer (--context)", n, ctx);
    st->prompt_tokens = n;
    k3_err e = sync_prompt(c, ids, n, 0, &st->cached_tokens, d);
    if (e) return e;
    take_snapshot(c);
    if (o->on_prompt) o->on_prompt(o->on_prompt_ctx, c);
    st->t_prompt = k3_now() - t0;
    turn t = {.sink = sink};
    if ((e = k3_stopstr_init(&t.stop, o->stops, (size_t)o->n_stops, d))) return e;
    double tg = k3_now();
    int ended = 0, interrupted = 0;
    k3_decoder dc;
    k3_dec_init(&dc, c->m, &c->s, c->held, k3_model_pos(c->m), c->cap, c->max_draft, &c->learn);
    while (st->completion_tokens < o->n_predict) {
        if (stop && *stop) { interrupted = 1; break; }
        int32_t id;
        if ((e = k3_dec_next(&dc, o->n_predict - st->completion_tokens, &id, d))) break;
        if (st->completion_tokens == 0) st->t_first = k3_now() - t0;
        st->completion_tokens++;
        if (id == eos) { ended = 1; break; }
        size_t len = 0;
        const uint8_t *b = k3_tok_bytes(c->tok, id, &len);
        if (b && len && k3_stopstr_feed(&t.stop, b, len, emit_content, &t)) { t.stopped = 1; break; }
        if (st->completion_tokens == o->n_predict) break;   /* no pass for a token nothing follows */
        if (k3_dec_pos(&dc) + 1 >= ctx) break;              /* the context is full */
    }
    if (!e) e = k3_dec_finish(&dc, d);
    st->dec = dc.stats;
    if (!t.stopped) k3_stopstr_finish(&t.stop, emit_content, &t);
    st->t_gen = k3_now() - tg;
    st->finish = interrupted ? "interrupted" : (ended || t.stopped) ? "stop" : "length";
    st->stop_index = t.stopped ? k3_stopstr_which(&t.stop) : -1;
    k3_stopstr_free(&t.stop);
    if (e) { free(t.content); return e; }
    *text = t.content ? t.content : calloc(1, 1);
    *text_len = t.cn;
    if (!*text) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    return K3_OK;
}

/*
 * chat_app.c - one `k3run chat` (chat_impl.h): bringing the pack up, the
 * conversation as an OpenAI chat request, a turn and its display, the
 * --json document, sessions.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat_app.h"
#include "chat_render.h"
#include "k3_log.h"
#include "k3_opts.h"
#include "k3_sys.h"
#include "session.h"

volatile sig_atomic_t k3_chat_stop;
static void on_sigint(int sig) { (void)sig; k3_chat_stop = 1; }

int k3_chat_effort_ok(const char *s)
{
    return !strcmp(s, "low") || !strcmp(s, "high") || !strcmp(s, "max") || !strcmp(s, "none");
}

static int fail(k3_err e, const k3_diag *d)
{
    k3_error("%s", d->msg);
    return k3_exit_code(e);
}

void k3_chat_add(chat_app *app, const char *role, const char *content)
{
    json_array_append_new(json_object_get(app->conv, "messages"),
                          json_pack("{s:s,s:s}", "role", role, "content", content));
}

void k3_chat_set_system(chat_app *app, const char *text)
{
    json_t *msgs = json_object_get(app->conv, "messages"), *first = json_array_get(msgs, 0);
    int has = first && !strcmp(json_string_value(json_object_get(first, "role")) ?
                               json_string_value(json_object_get(first, "role")) : "", "system");
    if (!text) { if (has) json_array_remove(msgs, 0); return; }
    if (has) json_object_set_new(first, "content", json_string(text));
    else json_array_insert_new(msgs, 0, json_pack("{s:s,s:s}", "role", "system", "content", text));
}

/* The request of a turn: the conversation with the session's settings (a request file keeps its
   own unless --think or --effort was given). */
static char *turn_request(const chat_app *app, size_t *len)
{
    json_t *r = json_deep_copy(app->conv), *op = json_object_get(r, "options");
    int file = app->messages_file != NULL;
    if (!op) json_object_set_new(r, "options", op = json_object());
    if (!file || app->think_given) {
        json_object_set_new(op, "thinking", json_boolean(app->thinking));
        json_object_del(r, "thinking");
        if (!app->thinking) json_object_del(r, "reasoning_effort");
    }
    if (!file || app->effort_given) {
        json_object_set_new(op, "thinking_effort", strcmp(app->effort, "none") ? json_string(app->effort) : json_null());
        json_object_del(r, "reasoning_effort");
    }
    if (!json_object_size(op)) json_object_del(r, "options");
    char *s = json_dumps(r, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(r);
    *len = s ? strlen(s) : 0;
    return s;
}

/* --- the answer's display ------------------------------------------------- */

static void show_text(void *ctx, int channel, const uint8_t *b, size_t n)
{
    chat_app *app = ctx;
    if (app->json || (channel == 0 && app->hide_thinking)) return;
    if (channel != app->channel_shown) {
        if (app->channel_shown == 0) {
            k3_utf8_out_flush(&app->out_reason);
            if (app->dim) fputs("\033[0m", stdout);
            fputs(app->out_reason.f == stdout ? "\n\n" : "\n", app->out_reason.f);
            fflush(app->out_reason.f);
        }
        if (channel == 0 && app->dim) fputs("\033[2m", stdout);
        app->channel_shown = channel;
    }
    k3_utf8_out *o = channel ? &app->out_content : &app->out_reason;
    k3_utf8_out_put(o, b, n);
    fflush(o->f);
}

static void show_call(void *ctx, const char *name, const char *arguments)
{
    chat_app *app = ctx;
    if (app->json) return;
    show_text(app, 1, (const uint8_t *)"", 0);
    k3_utf8_out_flush(&app->out_content);
    json_t *c = json_pack("{s:s,s:s}", "name", name, "arguments", arguments);
    char *s = json_dumps(c, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
    printf("%stool call: %s\n", app->out_content.written ? "\n" : "", s ? s : "");
    free(s);
    json_decref(c);
    fflush(stdout);
}

static void print_json(const chat_app *app, json_t *msg)
{
    const k3_chat_stats *st = &app->last;
    k3_weights_stats ws;
    k3w_stats(app->ld.w, &ws);
    json_t *doc = json_pack("{s:O,s:s,s:{s:i,s:i,s:i,s:{s:i},s:{s:i}}}", "message", msg, "finish_reason", st->finish,
                            "usage", "prompt_tokens", (json_int_t)st->prompt_tokens, "completion_tokens",
                            (json_int_t)st->completion_tokens, "total_tokens",
                            (json_int_t)(st->prompt_tokens + st->completion_tokens), "prompt_tokens_details",
                            "cached_tokens", (json_int_t)st->cached_tokens, "completion_tokens_details",
                            "reasoning_tokens", (json_int_t)st->reasoning_tokens);
    json_t *k3 = json_object();
    json_object_set_new(k3, "processed_tokens", json_integer(st->prompt_tokens - st->cached_tokens));
    json_object_set_new(k3, "seconds_to_first_token", json_real(st->t_first));
    json_object_set_new(k3, "prompt_seconds", json_real(st->t_prompt));
    json_object_set_new(k3, "generate_seconds", json_real(st->t_gen));
    json_object_set_new(k3, "think_budget_closed", json_boolean(st->think_closed));
    json_object_set_new(k3, "passes", json_integer((json_int_t)st->dec.passes));
    json_object_set_new(k3, "drafted", json_integer((json_int_t)st->dec.drafted));
    json_object_set_new(k3, "accepted", json_integer((json_int_t)st->dec.accepted));
    json_object_set_new(k3, "tokens_per_pass",
                        json_real(st->dec.passes ? (double)st->dec.tokens / (double)st->dec.passes : 0.0));
    json_object_set_new(k3, "load_seconds", json_real(app->t_load));
    json_object_set_new(k3, "bytes_read", json_integer((json_int_t)ws.bytes_read));
    json_object_set_new(k3, "expert_hits", json_integer((json_int_t)ws.expert_hits));
    json_object_set_new(k3, "expert_misses", json_integer((json_int_t)ws.expert_misses));
    json_object_set_new(k3, "budget_bytes", json_integer((json_int_t)app->ld.plan.budget));
    json_object_set_new(k3, "isa", json_string(k3_isa_name(app->lo.isa)));
    json_object_set_new(k3, "threads", json_integer(app->threads));
    json_object_set_new(doc, "k3", k3);
    json_dumpf(doc, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER);
    fputc('\n', stdout);
    fflush(stdout);
    json_decref(doc);
}

void k3_chat_print_stats(const chat_app *app, FILE *f)
{
    const k3_chat_stats *s = &app->last;
    if (!app->turns) { fprintf(f, "no turn yet\n"); return; }
    fprintf(f, "turn %llu: prompt %u tokens (%u cached, %u processed in %.3f s); first token after %.3f s; "
            "%u tokens generated (%u reasoning) in %.3f s (%.2f tok/s); finish: %s%s\n",
            (unsigned long long)app->turns, s->prompt_tokens, s->cached_tokens, s->prompt_tokens - s->cached_tokens,
            s->t_prompt, s->t_first, s->completion_tokens, s->reasoning_tokens, s->t_gen,
            s->t_gen > 0 ? s->completion_tokens / s->t_gen : 0.0, s->finish,
            s->think_closed ? " (think budget closed the reasoning)" : "");
    if (s->dec.verify_passes || app->ld.plan.verify_tokens)
        fprintf(f, "speculative decoding: %llu passes (%.2f tokens per pass); %llu drafted, %llu accepted\n",
                (unsigned long long)s->dec.passes, s->dec.passes ? (double)s->dec.tokens / (double)s->dec.passes : 0.0,
                (unsigned long long)s->dec.drafted, (unsigned long long)s->dec.accepted);
    uint32_t held;
    k3_chat_held(app->chat, &held);
    fprintf(f, "conversation: %llu turns, %llu prompt tokens of which %llu cached, %llu generated; the model "
            "holds %u of %u positions\n", (unsigned long long)app->turns, (unsigned long long)app->total_prompt,
            (unsigned long long)app->total_cached, (unsigned long long)app->total_gen, held,
            k3_model_context(app->ld.m));
}

int k3_chat_answer(chat_app *app)
{
    size_t len;
    char *req = turn_request(app, &len), *message = NULL;
    if (!req) { k3_error("out of memory"); return K3_EXIT_IO; }
    app->out_reason = (k3_utf8_out){.f = isatty(1) || app->hide_thinking ? stdout : stderr};
    app->out_content = (k3_utf8_out){.f = stdout};
    app->dim = isatty(1);
    app->channel_shown = -1;
    k3_chat_sink sink = {.text = show_text, .call = show_call, .ctx = app};
    k3_diag d;
    k3_chat_stop = 0;
    k3_err e = k3_chat_turn(app->chat, req, len, &app->co, &sink, &k3_chat_stop, &message, &app->last, &d);
    free(req);
    if (!app->json) {
        k3_utf8_out_flush(&app->out_reason);
        k3_utf8_out_flush(&app->out_content);
        if (app->channel_shown == 0 && app->dim) fputs("\033[0m", stdout);
        if (app->channel_shown >= 0) fputc('\n', app->channel_shown == 0 ? app->out_reason.f : stdout);
        fflush(NULL);
    }
    if (e) { free(message); return fail(e, &d); }
    json_t *msg = json_loads(message, JSON_ALLOW_NUL, NULL);
    free(message);
    if (!msg) { k3_error("out of memory"); return K3_EXIT_IO; }
    json_array_append(json_object_get(app->conv, "messages"), msg);
    app->turns++;
    app->total_prompt += app->last.prompt_tokens;
    app->total_cached += app->last.cached_tokens;
    app->total_gen += app->last.completion_tokens;
    if (app->json) print_json(app, msg);
    json_decref(msg);
    if (app->stats) k3_chat_print_stats(app, stderr);
    return 0;
}

/* --- sessions ------------------------------------------------------------- */

int k3_chat_save(chat_app *app, const char *path)
{
    json_t *x = json_pack("{s:O,s:b,s:s}", "conversation", app->conv, "thinking", app->thinking, "effort",
                          app->effort);
    char *text = json_dumps(x, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(x);
    if (!text) { k3_error("out of memory"); return K3_EXIT_IO; }
    uint32_t n;
    const int32_t *held = k3_chat_held(app->chat, &n);
    k3_sampler *s = k3_chat_sampler(app->chat);
    k3_session ss = {.tokens = (int32_t *)held, .n_tokens = n, .rng_state = s->state, .rng_inc = s->inc, .n_extra = 1};
    snprintf(ss.extra[0].name, sizeof ss.extra[0].name, "chat");
    ss.extra[0].data = text;
    ss.extra[0].bytes = strlen(text);
    k3_diag d;
    uint64_t bytes = 0;
    double t = k3_now();
    k3_err e = k3_session_save(path, app->ld.m, app->ld.w, app->pack, &ss, &bytes, &d);
    free(text);
    if (e) return fail(e, &d);
    k3_info("saved the session to '%s' (%u positions, %.1f KiB, %.3f s)", path, n, bytes / 1024.0, k3_now() - t);
    return 0;
}

int k3_chat_load(chat_app *app, const char *path)
{
    k3_session ss;
    k3_diag d;
    double t = k3_now();
    uint32_t before = k3_model_pos(app->ld.m);
    k3_err e = k3_session_load(path, app->ld.m, app->ld.w, app->pack, &ss, &d);
    if (e) {
        /* refused before the model was touched: it still holds the conversation; else it was reset
           (never half-loaded) and so are the chat's snapshots */
        if (k3_model_pos(app->ld.m) != before) k3_chat_reset(app->chat);
        return fail(e, &d);
    }
    const k3_session_part *x = k3_session_extra(&ss, "chat");
    json_t *doc = x ? json_loadb(x->data, (size_t)x->bytes, JSON_ALLOW_NUL, NULL) : NULL;
    json_t *conv = doc ? json_object_get(doc, "conversation") : NULL;
    if (!json_is_array(json_object_get(conv, "messages"))) {
        json_decref(doc);
        k3_session_free(&ss);
        k3_chat_reset(app->chat);
        k3_error("'%s' holds no chat conversation (it was not saved by k3run chat)", path);
        return K3_EXIT_DATA;
    }
    if ((e = k3_chat_adopt(app->chat, ss.tokens, ss.n_tokens, &d))) {
        json_decref(doc);
        k3_session_free(&ss);
        return fail(e, &d);
    }
    k3_sampler *s = k3_chat_sampler(app->chat);
    s->state = ss.rng_state;
    s->inc = ss.rng_inc;
    json_decref(app->conv);
    app->conv = json_incref(conv);
    if (!app->think_given && json_is_boolean(json_object_get(doc, "thinking")))
        app->thinking = json_is_true(json_object_get(doc, "thinking"));
    const char *ef = json_string_value(json_object_get(doc, "effort"));
    if (!app->effort_given && ef && k3_chat_effort_ok(ef)) snprintf(app->effort, sizeof app->effort, "%s", ef);
    k3_info("loaded the session '%s' (%u positions, %zu messages, %.3f s)", path, k3_model_pos(app->ld.m),
            json_array_size(json_object_get(conv, "messages")), k3_now() - t);
    json_decref(doc);
    k3_session_free(&ss);
    return 0;
}

/* --- the run ---------------------------------------------------------------- */

/* --messages FILE: one chat request, or several one after another (JSON Lines, or just
   concatenated): each is answered in turn, the model keeping what the requests share. */
static int read_requests(chat_app *app)
{
    const char *fn = app->messages_file;
    FILE *f = strcmp(fn, "-") ? fopen(fn, "rb") : stdin;
    if (!f) { k3_error("'%s': cannot open: %s", fn, strerror(errno)); return K3_EXIT_IO; }
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 65536 > cap && !(text = realloc(text, cap = (len + 65536) * 2))) {
            if (f != stdin) fclose(f);
            k3_error("out of memory");
            return K3_EXIT_IO;
        }
        size_t r = fread(text + len, 1, cap - len, f);
        len += r;
        if (!r) break;
    }
    int bad = ferror(f);
    if (f != stdin) fclose(f);
    if (bad) { free(text); k3_error("'%s': cannot read", fn); return K3_EXIT_IO; }
    app->requests = json_array();
    size_t off = 0;
    for (;;) {
        while (off < len && (text[off] == ' ' || text[off] == '\n' || text[off] == '\r' || text[off] == '\t')) off++;
        if (off == len) break;
        json_error_t je;
        json_t *r = json_loadb(text + off, len - off, JSON_DISABLE_EOF_CHECK | JSON_ALLOW_NUL, &je);
        if (!r) {
            k3_error("'%s': not a JSON chat request: %s (byte %zu)", fn, je.text, off + (size_t)je.position);
            free(text);
            return K3_EXIT_DATA;
        }
        off += (size_t)je.position;
        if (!json_is_object(r) || !json_is_array(json_object_get(r, "messages"))) {
            json_decref(r);
            free(text);
            return k3_usage_error("'%s': request %zu is not an object with a \"messages\" array", fn,
                                  json_array_size(app->requests) + 1);
        }
        json_array_append_new(app->requests, r);
    }
    free(text);
    if (!json_array_size(app->requests)) return k3_usage_error("'%s' holds no chat request", fn);
    return 0;
}

int k3_chat_start(chat_app *app)
{
    k3_diag d;
    k3_err e;
    int rc = 0;
    double t0 = k3_now();
    if ((e = k3_tok_load_dir(app->pack, &app->tok, &d))) return fail(e, &d);
    if (app->messages_file) {
        if ((rc = read_requests(app))) return rc;
        for (size_t i = 0; i < json_array_size(app->requests); i++) {     /* refused before any weight is read */
            json_decref(app->conv);
            app->conv = json_incref(json_array_get(app->requests, i));
            size_t len;
            char *req = turn_request(app, &len);
            k3_chat_prompt pr = {0};
            char name[4200];
            snprintf(name, sizeof name, json_array_size(app->requests) > 1 ? "'%s' (request %zu)" : "'%s'",
                     app->messages_file, i + 1);
            e = req ? k3_chat_render(app->tok, req, len, name, &pr, &d) : K3_ERR_NOMEM;
            free(req);
            k3_chat_prompt_free(&pr);
            if (e == K3_ERR_USAGE) return k3_usage_error("%s", d.msg);
            if (e) return fail(e, &d);
        }
    } else {
        app->conv = json_pack("{s:[]}", "messages");
        if (app->system) k3_chat_set_system(app, app->system);
    }
    int usage = 0;
    if ((e = k3_load_plan(&app->lo, &app->ld, &usage, &d))) return usage ? k3_usage_error("%s", d.msg) : fail(e, &d);
    if ((e = k3_load_model(&app->lo, &app->ld, &d))) return fail(e, &d);
    if ((e = k3_chat_new(app->ld.m, app->tok, &app->so, app->lo.snapshots, &app->chat, &d))) return fail(e, &d);
    k3_chat_set_draft(app->chat, app->ld.plan.verify_tokens ? app->ld.plan.verify_tokens - 1 : 0,
                      k3_dec_rho(&app->ld.plan, app->ld.geo));
    app->t_load = k3_now() - t0 - app->ld.t_verify;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    if (app->load_path) {
        json_t *keep = app->messages_file ? json_incref(app->conv) : NULL;
        rc = k3_chat_load(app, app->load_path);
        if (keep) { json_decref(app->conv); app->conv = keep; }    /* the request file is the conversation */
        if (rc) return rc;
        if (app->system && !app->messages_file) k3_chat_set_system(app, app->system);
    }
    return 0;
}

int k3_chat_once(chat_app *app)
{
    int rc = 0;
    if (app->prompt) {
        k3_chat_add(app, "user", app->prompt);
        rc = k3_chat_answer(app);
    }
    for (size_t i = 0; !app->prompt && !rc && i < json_array_size(app->requests); i++) {
        json_decref(app->conv);
        app->conv = json_deep_copy(json_array_get(app->requests, i));
        if (i && !app->json) fputc('\n', stdout);
        rc = k3_chat_answer(app);
        if (!rc && !strcmp(app->last.finish, "interrupted")) break;
    }
    if (!rc && !strcmp(app->last.finish, "interrupted")) rc = 130;
    return rc;
}

void k3_chat_app_free(chat_app *app)
{
    k3_chat_free(app->chat);
    k3_loaded_free(&app->ld);
    k3_tok_free(app->tok);
    json_decref(app->conv);
    json_decref(app->requests);
    free(app->stops);
}

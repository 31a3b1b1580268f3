/*
 * chat_cli.c - `k3run chat` (chat_cli.h): options, the conversation as an
 * OpenAI chat request, the answer's display, one-shot and scripted modes,
 * sessions. The interactive loop is chat_repl.c.
 */
#define _GNU_SOURCE
#include "chat_cli.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "chat_app.h"
#include "cli_args.h"
#include "k3_log.h"

enum {
    OPT_MODEL = K3_OPT_USER, OPT_SYSTEM, OPT_THINK, OPT_EFFORT, OPT_HIDE, OPT_PROMPT, OPT_MESSAGES, OPT_JSON,
    OPT_STOP, OPT_THINK_BUDGET, OPT_N, OPT_CONTEXT, OPT_BATCH, OPT_BUDGET, OPT_PRESET, OPT_THREADS, OPT_TEMP,
    OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_REPEAT, OPT_SEED, OPT_SAVE, OPT_LOAD, OPT_SNAPSHOTS, OPT_DRAFT, OPT_STATS,
    OPT_NO_VERIFY_READS, OPT_VERIFY
};

static const k3_opt opts[] = {
    {OPT_MODEL, 'm', "model", "PACK", NULL, "K3_MODEL", "the pack directory (made by k3pack)"},
    {OPT_SYSTEM, 0, "system", "TEXT", NULL, NULL, "a system prompt (the conversation's first message)"},
    {OPT_THINK, 0, "think", "on|off", "on", NULL, "the think channel: the model reasons before it answers"},
    {OPT_EFFORT, 0, "effort", "E", "max", NULL, "reasoning effort: low, high, max, or none (no effort message)"},
    {OPT_HIDE, 0, "hide-thinking", NULL, NULL, NULL, "do not show the reasoning (it is still generated)"},
    {OPT_PROMPT, 'p', "prompt", "TEXT", NULL, NULL, "ask TEXT once, print the answer and exit"},
    {OPT_MESSAGES, 0, "messages", "FILE", NULL, NULL,
     "chat requests (JSON: messages, tools, ...; several in a row: each in turn; - for stdin): answer and exit"},
    {OPT_JSON, 'j', "json", NULL, NULL, NULL, "print each answer as one JSON document (message, usage, k3's figures)"},
    {OPT_STOP, 0, "stop", "STR", NULL, NULL, "end the answer at STR, not printed (repeatable)"},
    {OPT_THINK_BUDGET, 0, "think-budget", "N", "0 (none)", NULL,
     "after N reasoning tokens close the think channel and let the model answer"},
    {OPT_N, 'n', "n-predict", "N", "1024", NULL, "tokens per answer at most"},
    {OPT_CONTEXT, 'c', "context", "N", "4096", NULL, "positions the model holds (the whole conversation)"},
    {OPT_BATCH, 'b', "batch", "auto|N", "auto", NULL,
     "prompt tokens per forward pass (auto: the planner chooses for the budget and -n)"},
    {OPT_BUDGET, 'B', "budget", "SIZE", "what the machine allows", "K3_BUDGET", "memory to use (8G, 512M, ...)"},
    {OPT_PRESET, 0, "preset", "NAME", NULL, NULL, "a named budget: laptop (8G), workstation (128G), server (224G)"},
    {OPT_THREADS, 't', "threads", "N", "all CPUs", "K3_THREADS", "compute threads"},
    {OPT_TEMP, 0, "temp", "T", "the pack's generation_config.json, else 1.0", NULL,
     "sampling temperature; 0 picks the most likely token (greedy)"},
    {OPT_TOPK, 0, "top-k", "K", "generation_config.json, else 0 (off)", NULL, "sample among the K most likely tokens"},
    {OPT_TOPP, 0, "top-p", "P", "generation_config.json, else 0.95", NULL,
     "sample among the smallest set with mass >= P (1: off)"},
    {OPT_MINP, 0, "min-p", "P", "generation_config.json, else 0 (off)", NULL,
     "drop tokens less likely than P times the most likely"},
    {OPT_REPEAT, 0, "repeat-penalty", "R", "generation_config.json, else 1 (off)", NULL,
     "penalise tokens already in the context"},
    {OPT_SEED, 's', "seed", "S", "0", NULL, "seed of the sampler's PRNG: same seed, same text"},
    {OPT_SAVE, 0, "save-session", "FILE", NULL, NULL, "after the answer(s), save the conversation and the state"},
    {OPT_LOAD, 0, "load-session", "FILE", NULL, NULL, "start from a saved session (its conversation and state)"},
    {OPT_SNAPSHOTS, 0, "snapshots", "N", "2", NULL,
     "state snapshots kept to go back to an earlier turn (each: the KDA state)"},
    {OPT_DRAFT, 0, "draft", "N", K3_DRAFT_DEFAULT_STR, NULL,
     "speculative decoding: verify up to N tokens drafted from the conversation per pass (0: off); same answers"},
    {OPT_STATS, 0, "stats", NULL, NULL, NULL, "each turn's tokens (cached, new, generated) and timings on stderr"},
    {OPT_NO_VERIFY_READS, 0, "no-verify-reads", NULL, NULL, NULL, "do not check each tensor's XXH3-64 as it is read"},
    {OPT_VERIFY, 0, "verify", NULL, NULL, NULL, "run k3verify's full check of the pack before loading it"},
    K3_OPTS_COMMON,
};
#define N_OPTS ((int)(sizeof opts / sizeof opts[0]))

static const char purpose[] =
    "Talk with a K3 chat model from a k3 pack, in K3's own chat format. Without -p\n"
    "or --messages: an interactive conversation (line editing, history; commands\n"
    "below). The answer is streamed as it is generated; the reasoning is shown apart\n"
    "(dimmed on a terminal; on stderr when stdout is not one). A turn processes only\n"
    "the tokens the model does not hold yet: the history is never read again.\n"
    "\n"
    "Commands: /reset, /system TEXT, /think on|off, /effort low|high|max|none,\n"
    "/save FILE, /load FILE, /stats, /quit. Ctrl-C stops the answer; Ctrl-D leaves.";

static const char footer[] =
    "Examples:\n"
    "  k3run chat -m ~/packs/k3\n"
    "  k3run chat -m ~/packs/k3 --think off -p 'Capital of Peru?'\n"
    "  k3run chat -m ~/packs/k3 --messages request.json --json\n"
    "  k3run chat -m ~/packs/k3 -p 'Hello' --save-session s.k3session && k3run chat -m ~/packs/k3 --load-session s.k3session\n";


/* --stop may repeat: take every one out of argv before the table parser (which keeps the last). */
static int take_stops(int *argc, char **argv, const char ***stops, int *n)
{
    *stops = calloc((size_t)*argc + 1, sizeof **stops);
    *n = 0;
    if (!*stops) return k3_usage_error("out of memory");
    int k = 0;
    for (int i = 0; i < *argc; i++) {
        if (!strcmp(argv[i], "--")) { while (i < *argc) argv[k++] = argv[i++]; break; }
        const char *v = NULL;
        if (!strcmp(argv[i], "--stop")) {
            if (i + 1 >= *argc) return k3_usage_error("--stop needs a value (STR)");
            v = argv[++i];
        } else if (!strncmp(argv[i], "--stop=", 7)) {
            v = argv[i] + 7;
        }
        if (!v) { argv[k++] = argv[i]; continue; }
        if (!*v) return k3_usage_error("--stop: a stop string cannot be empty");
        (*stops)[(*n)++] = v;
    }
    *argc = k;
    return 0;
}

static int parse_think(const char *s, int *out)
{
    if (!strcmp(s, "on")) *out = 1;
    else if (!strcmp(s, "off")) *out = 0;
    else return -1;
    return 0;
}

/* Options into app (before anything is loaded). */
static int k3_chat_configure(chat_app *app, const k3_args *a);

int k3_chat_main(int argc, char **argv)
{
    k3_args a;
    k3_diag d;
    chat_app app = {0};
    int rc;
    if ((rc = take_stops(&argc, argv, &app.stops, &app.n_stops))) { free(app.stops); return rc; }
    if (k3_opts_parse(opts, N_OPTS, argc, argv, &a, &d)) { free(app.stops); return k3_usage_error("%s", d.msg); }
    if (k3_opt_count(&a, K3_OPT_HELP)) {
        k3_opts_help(stdout, "k3run chat -m PACK [-p TEXT | --messages FILE] [OPTIONS]", purpose, opts, N_OPTS,
                     footer);
        free(app.stops);
        return K3_EXIT_OK;
    }
    if (k3_opt_count(&a, K3_OPT_VERSION)) { k3_cli_version(NULL); free(app.stops); return 0; }
    rc = k3_chat_configure(&app, &a);
    if (!rc) rc = k3_chat_start(&app);
    if (!rc) rc = app.prompt || app.messages_file ? k3_chat_once(&app) : k3_chat_repl(&app);
    if (!rc && app.save_path) rc = k3_chat_save(&app, app.save_path);
    k3_chat_app_free(&app);
    return rc;
}

static int k3_chat_configure(chat_app *app, const k3_args *a)
{
    int rc;
    if (a->n_pos) return k3_usage_error("unexpected argument '%s' (the pack is given with -m)", a->pos[0]);
    app->pack = k3_opt_str(a, OPT_MODEL);
    if (!app->pack) return k3_usage_error("no model: give the pack with -m PACK");
    app->prompt = k3_opt_str(a, OPT_PROMPT);
    app->messages_file = k3_opt_str(a, OPT_MESSAGES);
    if (app->prompt && app->messages_file) return k3_usage_error("give -p or --messages, not both");
    app->json = k3_opt_count(a, OPT_JSON) > 0;
    app->stats = k3_opt_count(a, OPT_STATS) > 0;
    app->hide_thinking = k3_opt_count(a, OPT_HIDE) > 0;
    app->save_path = k3_opt_str(a, OPT_SAVE);
    app->load_path = k3_opt_str(a, OPT_LOAD);
    app->system = k3_opt_str(a, OPT_SYSTEM);
    app->thinking = 1;
    app->think_given = k3_opt_str(a, OPT_THINK) != NULL;
    if (app->think_given && parse_think(k3_opt_str(a, OPT_THINK), &app->thinking))
        return k3_usage_error("--think: '%s' (on or off)", k3_opt_str(a, OPT_THINK));
    snprintf(app->effort, sizeof app->effort, "max");
    app->effort_given = k3_opt_str(a, OPT_EFFORT) != NULL;
    if (app->effort_given) {
        const char *e = k3_opt_str(a, OPT_EFFORT);
        if (!k3_chat_effort_ok(e))
            return k3_usage_error("--effort: '%s' (low, high, max or none; K3 refuses medium)", e);
        snprintf(app->effort, sizeof app->effort, "%s", e);
    }
    static const k3_cli_gen_ids ids = {OPT_N, OPT_THINK_BUDGET, OPT_THREADS, OPT_CONTEXT, OPT_BATCH, OPT_SNAPSHOTS,
                                       OPT_DRAFT, OPT_TOPK, OPT_TEMP, OPT_TOPP, OPT_MINP, OPT_REPEAT, OPT_SEED,
                                       OPT_BUDGET, OPT_PRESET, OPT_VERIFY, OPT_NO_VERIFY_READS};
    k3_cli_gen g = {.so = &app->so};
    if ((rc = k3_cli_gen_parse(a, &ids, app->pack, "chat", &g, &app->lo))) return rc;
    app->co.n_predict = g.n_predict;
    app->co.think_budget = g.think_budget;
    app->co.stops = app->stops;
    app->co.n_stops = app->n_stops;
    app->threads = g.threads;
    app->lo.report = app->stats;
    return 0;
}

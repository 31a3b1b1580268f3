/*
 * chat_app.h - private to chat_cli.c, chat_app.c and chat_repl.c: the state
 * of one `k3run chat` and the pieces its modes share.
 */
#ifndef K3_CHAT_APP_H
#define K3_CHAT_APP_H

#include <signal.h>
#include <stdio.h>

#include <jansson.h>

#include "chat.h"
#include "generate.h"
#include "load.h"

typedef struct chat_app {
    /* options */
    const char *pack, *prompt, *messages_file, *save_path, *load_path, *system;
    int json, stats, hide_thinking;
    int thinking, think_given;     /* --think on|off (given: it overrides a request file's) */
    char effort[8];                /* low, high, max or none */
    int effort_given;
    const char **stops;            /* [n_stops] */
    int n_stops;
    uint32_t threads;
    k3_chat_opts co;
    k3_sampler_opts so;
    k3_load_opts lo;
    /* state */
    k3_tok *tok;
    k3_loaded ld;
    k3_chat *chat;
    json_t *conv;                  /* the conversation: an OpenAI chat request {"messages": [...], ...} */
    json_t *requests;              /* --messages: the file's requests, answered in turn */
    double t_load;
    /* the answer's display */
    k3_utf8_out out_reason, out_content;
    int channel_shown;             /* -1 none yet, 0 reasoning, 1 content */
    int dim;                       /* reasoning dimmed (stdout is a terminal) */
    k3_chat_stats last;
    uint64_t turns, total_prompt, total_cached, total_gen;
} chat_app;

extern volatile sig_atomic_t k3_chat_stop;   /* Ctrl-C: stop the answer */

/* The tokenizer, the request file (rendered once: a refused one reads no weight), the plan, the
   weights, the chat, --load-session; Ctrl-C stops an answer from here on. */
int k3_chat_start(chat_app *app);
/* -p or --messages: one answer (130 when Ctrl-C stopped it). */
int k3_chat_once(chat_app *app);
void k3_chat_app_free(chat_app *app);
int k3_chat_effort_ok(const char *s);

/* One turn of the conversation app->conv (with the session's settings), displayed; the answer
   is appended to app->conv. Returns an exit status (0 ok); usage errors leave app->conv as it was. */
int k3_chat_answer(chat_app *app);
/* Append a message {"role", "content"} to the conversation. */
void k3_chat_add(chat_app *app, const char *role, const char *content);
/* Set the system prompt (NULL: none): the first message. */
void k3_chat_set_system(chat_app *app, const char *text);
/* Sessions: the model's state and the conversation (with its settings). */
int k3_chat_save(chat_app *app, const char *path);
int k3_chat_load(chat_app *app, const char *path);
void k3_chat_print_stats(const chat_app *app, FILE *f);

/* The interactive loop (chat_repl.c). */
int k3_chat_repl(chat_app *app);

#endif

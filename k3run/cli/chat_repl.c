/*
 * chat_repl.c - the interactive loop of `k3run chat` (chat_impl.h): lines
 * from libedit's readline on a terminal (editing, history kept in
 * ~/.k3run_history or $K3_HISTORY; K3_HISTORY= turns the file off), plain
 * lines otherwise (scripts); a line ending in a backslash continues on the
 * next; commands start with a slash.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <editline/readline.h>

#include "chat_app.h"
#include "k3_log.h"

static const char help_text[] =
    "commands:\n"
    "  /reset            forget the conversation (the system prompt stays)\n"
    "  /system TEXT      set the system prompt (/system alone removes it)\n"
    "  /think on|off     the think channel\n"
    "  /effort E         reasoning effort: low, high, max, none\n"
    "  /save FILE        save the conversation and the model's state\n"
    "  /load FILE        continue a saved conversation\n"
    "  /stats            the last turn's tokens and timings\n"
    "  /quit             leave (so does Ctrl-D); Ctrl-C stops an answer\n"
    "A line ending in \\ continues on the next.\n";

static char *history_path(void)
{
    const char *h = getenv("K3_HISTORY");
    if (h) return *h ? strdup(h) : NULL;
    const char *home = getenv("HOME");
    if (!home || !*home) return NULL;
    char *p = NULL;
    if (asprintf(&p, "%s/.k3run_history", home) < 0) return NULL;
    return p;
}

/* One line without its newline (malloc'd), or NULL at the end of input. *interrupted: Ctrl-C. */
static char *get_line(int tty, const char *prompt, int *interrupted)
{
    *interrupted = 0;
    if (tty) {
        k3_chat_stop = 0;
        char *l = readline(prompt);
        if (!l && k3_chat_stop) { *interrupted = 1; k3_chat_stop = 0; }
        return l;
    }
    char *l = NULL;
    size_t cap = 0;
    ssize_t n = getline(&l, &cap, stdin);
    if (n < 0) { free(l); return NULL; }
    if (n && l[n - 1] == '\n') l[--n] = 0;
    if (n && l[n - 1] == '\r') l[--n] = 0;
    return l;
}

/* A whole input: lines joined while they end in a backslash. */
static char *get_input(int tty, int *interrupted)
{
    char *all = NULL;
    size_t n = 0;
    for (;;) {
        char *l = get_line(tty, all ? "... " : "> ", interrupted);
        if (!l) { free(all); return NULL; }
        size_t k = strlen(l);
        int more = k && l[k - 1] == '\\';
        if (more) l[--k] = 0;
        char *p = realloc(all, n + k + 2);
        if (!p) { free(l); free(all); return NULL; }
        all = p;
        memcpy(all + n, l, k);
        n += k;
        if (more) all[n++] = '\n';
        all[n] = 0;
        free(l);
        if (!more) return all;
    }
}

static void command(chat_app *app, char *line, int *quit)
{
    char *arg = strchr(line, ' ');
    if (arg) { *arg++ = 0; while (*arg == ' ') arg++; }
    if (arg && !*arg) arg = NULL;
    if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) { *quit = 1; return; }
    if (!strcmp(line, "/help")) { fputs(help_text, stdout); return; }
    if (!strcmp(line, "/reset")) {
        json_t *msgs = json_object_get(app->conv, "messages"), *first = json_array_get(msgs, 0);
        const char *r = first ? json_string_value(json_object_get(first, "role")) : NULL;
        json_t *keep = r && !strcmp(r, "system") ? json_incref(first) : NULL;
        json_array_clear(msgs);
        if (keep) json_array_append_new(msgs, keep);
        printf("(a new conversation)\n");
        return;
    }
    if (!strcmp(line, "/system")) {
        k3_chat_set_system(app, arg);
        printf(arg ? "(system prompt set)\n" : "(system prompt removed)\n");
        return;
    }
    if (!strcmp(line, "/think")) {
        if (!arg || (strcmp(arg, "on") && strcmp(arg, "off"))) { printf("usage: /think on|off\n"); return; }
        app->thinking = !strcmp(arg, "on");
        printf("(thinking %s)\n", arg);
        return;
    }
    if (!strcmp(line, "/effort")) {
        if (!arg || !k3_chat_effort_ok(arg)) { printf("usage: /effort low|high|max|none\n"); return; }
        snprintf(app->effort, sizeof app->effort, "%s", arg);
        printf("(effort %s)\n", arg);
        return;
    }
    if (!strcmp(line, "/save") || !strcmp(line, "/load")) {
        if (!arg) { printf("usage: %s FILE\n", line); return; }
        int rc = line[1] == 's' ? k3_chat_save(app, arg) : k3_chat_load(app, arg);
        if (!rc) printf(line[1] == 's' ? "(saved to %s)\n" : "(loaded %s)\n", arg);
        return;
    }
    if (!strcmp(line, "/stats")) { k3_chat_print_stats(app, stdout); return; }
    printf("unknown command %s (/help lists them)\n", line);
}

int k3_chat_repl(chat_app *app)
{
    int tty = isatty(0) && isatty(1);
    char *hist = tty ? history_path() : NULL;
    if (tty) {
        using_history();
        if (hist) read_history(hist);
        printf("k3run chat: %s, thinking %s%s. /help for commands, Ctrl-D to leave.\n", app->pack,
               app->thinking ? "on, effort " : "off", app->thinking ? app->effort : "");
    }
    int quit = 0, rc = 0;
    while (!quit) {
        int interrupted;
        char *line = get_input(tty, &interrupted);
        if (!line) {
            if (interrupted) { printf("\n"); continue; }      /* Ctrl-C at the prompt: a new line */
            if (tty) printf("\n");
            break;                                           /* Ctrl-D, or the end of the script */
        }
        if (!*line) { free(line); continue; }
        if (tty) add_history(line);
        if (line[0] == '/') {
            command(app, line, &quit);
            free(line);
            fflush(stdout);
            continue;
        }
        k3_chat_add(app, "user", line);
        free(line);
        int r = k3_chat_answer(app);
        if (r == K3_EXIT_USAGE || r == K3_EXIT_DATA) {     /* refused: the message is taken back */
            json_t *msgs = json_object_get(app->conv, "messages");
            json_array_remove(msgs, json_array_size(msgs) - 1);
            if (!tty) { rc = r; break; }
            continue;
        }
        if (r) { rc = r; break; }
        if (!strcmp(app->last.finish, "interrupted") && tty) printf("(stopped)\n");
    }
    if (hist) { write_history(hist); free(hist); }
    return rc;
}

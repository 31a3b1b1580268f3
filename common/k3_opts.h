/*
 * k3_opts.h - one option table per tool: short and long names, value
 * placeholder, default shown in --help, a K3_* environment fallback (lower
 * precedence than the command line), and the help text.
 *
 * Accepted syntax: -x VALUE, -xVALUE, --long VALUE, --long=VALUE, bundled
 * short flags (-vv), "--" ends options, "-" alone is a positional argument.
 */
#ifndef K3_OPTS_H
#define K3_OPTS_H

#include <stdint.h>
#include <stdio.h>

#include "k3_error.h"

/* Ids every tool shares; tool-specific ids start at K3_OPT_USER. */
enum { K3_OPT_HELP = 1, K3_OPT_VERSION, K3_OPT_QUIET, K3_OPT_VERBOSE, K3_OPT_USER = 16 };

typedef struct k3_opt {
    int id;                 /* nonzero, unique in the table */
    char short_name;        /* 0 = none */
    const char *long_name;  /* without "--" */
    const char *arg;        /* value placeholder ("N", "PATH"); NULL = flag */
    const char *def;        /* default shown in --help; NULL = none */
    const char *env;        /* environment fallback, NULL = none */
    const char *help;
} k3_opt;

/* The four common entries; put them at the end of each tool's table. */
#define K3_OPTS_COMMON                                                              \
    {K3_OPT_QUIET, 'q', "quiet", NULL, NULL, NULL, "only print errors"},            \
    {K3_OPT_VERBOSE, 'v', "verbose", NULL, NULL, NULL, "say more (repeat for debug output)"}, \
    {K3_OPT_HELP, 'h', "help", NULL, NULL, NULL, "show this help on stdout and exit"},      \
    {K3_OPT_VERSION, 'V', "version", NULL, NULL, NULL, "show the version and exit"}

typedef struct k3_optval {
    const char *value;  /* last value given (or from env); NULL if none */
    int count;          /* times given on the command line (flags may repeat) */
    int from_env;       /* value came from the environment */
} k3_optval;

#define K3_MAX_OPTS 48
#define K3_MAX_POS 64

typedef struct k3_args {
    const k3_opt *opts;
    int n_opts;
    k3_optval vals[K3_MAX_OPTS];   /* vals[i] belongs to opts[i] */
    char *pos[K3_MAX_POS];         /* positional arguments in order */
    int n_pos;
} k3_args;

/* Parse argv. Applies -q/-v to the log level. Usage errors -> K3_ERR_USAGE. */
k3_err k3_opts_parse(const k3_opt *opts, int n_opts, int argc, char **argv,
                     k3_args *out, k3_diag *d);

/* Value of option id (NULL if not given and no env), and whether it was set. */
const char *k3_opt_str(const k3_args *a, int id);
int k3_opt_count(const k3_args *a, int id);
/* 1 if option id's value came from its environment variable, not argv. */
int k3_opt_from_env(const k3_args *a, int id);

/*
 * Unsigned integer value of option id, or def when absent. Accepts size
 * suffixes K, M, G, T (binary) when allow_suffix. A bad command-line value
 * is a usage error; a bad environment value is warned about and ignored.
 */
k3_err k3_opt_u64(const k3_args *a, int id, uint64_t def, int allow_suffix,
                  uint64_t *out, k3_diag *d);

/* Print "Usage: ...", purpose, the option table (aligned), then footer. */
void k3_opts_help(FILE *f, const char *usage, const char *purpose,
                  const k3_opt *opts, int n_opts, const char *footer);

/* A usage error: "<prog>: error: <msg>" and "Try '<prog> --help' ..." on
   stderr; returns K3_EXIT_USAGE for main() to return. */
int k3_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A subcommand's own name for that hint ("k3run serve"); NULL: the program's. */
void k3_opts_help_cmd(const char *cmd);

/* The exit-code table every --help ends with. */
extern const char k3_exit_codes_help[];

/* Parse a size like "8G", "512M", "4096" (binary suffixes). 0 on success. */
int k3_parse_size(const char *s, int allow_suffix, uint64_t *out);

#endif

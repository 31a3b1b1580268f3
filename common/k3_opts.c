/* k3_opts.c - table-driven option parsing and --help output. */
#include "k3_opts.h"
#include "k3_log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

const char k3_exit_codes_help[] =
    "Exit status:\n"
    "  0  success\n"
    "  1  data damaged or invalid (the input exists but is wrong)\n"
    "  2  usage error\n"
    "  3  i/o or environment error (cannot open, no space, locked)\n"
    "  4  internal error (a bug in k3; please report it)\n";

static int find_long(const k3_opt *o, int n, const char *name, size_t len)
{
    for (int i = 0; i < n; i++)
        if (strlen(o[i].long_name) == len && strncmp(o[i].long_name, name, len) == 0) return i;
    return -1;
}

static int find_short(const k3_opt *o, int n, char c)
{
    for (int i = 0; i < n; i++)
        if (c && o[i].short_name == c) return i;
    return -1;
}

static int index_of(const k3_args *a, int id)
{
    for (int i = 0; i < a->n_opts; i++)
        if (a->opts[i].id == id) return i;
    return -1;
}

k3_err k3_opts_parse(const k3_opt *opts, int n_opts, int argc, char **argv,
                     k3_args *out, k3_diag *d)
{
    memset(out, 0, sizeof *out);
    if (n_opts > K3_MAX_OPTS) return k3_fail(d, K3_ERR_INTERNAL, "option table too large");
    out->opts = opts;
    out->n_opts = n_opts;
    int only_pos = 0;
    for (int i = 1; i < argc; i++) {
        char *arg = argv[i];
        if (only_pos || arg[0] != '-' || arg[1] == '\0') {
            if (out->n_pos >= K3_MAX_POS)
                return k3_fail(d, K3_ERR_USAGE, "too many arguments");
            out->pos[out->n_pos++] = arg;
            continue;
        }
        if (strcmp(arg, "--") == 0) { only_pos = 1; continue; }
        if (arg[1] == '-') {                       /* --long[=value] */
            const char *name = arg + 2;
            const char *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            int k = find_long(opts, n_opts, name, len);
            if (k < 0) return k3_fail(d, K3_ERR_USAGE, "unknown option '--%.*s'", (int)len, name);
            if (opts[k].arg) {
                const char *v = eq ? eq + 1 : NULL;
                if (!v) {
                    if (i + 1 >= argc)
                        return k3_fail(d, K3_ERR_USAGE, "option '--%s' needs a value (%s)",
                                       opts[k].long_name, opts[k].arg);
                    v = argv[++i];
                }
                out->vals[k].value = v;
            } else if (eq) {
                return k3_fail(d, K3_ERR_USAGE, "option '--%s' takes no value", opts[k].long_name);
            }
            out->vals[k].count++;
            out->vals[k].from_env = 0;
            continue;
        }
        for (const char *c = arg + 1; *c; c++) {   /* -x, -xVALUE, -abc */
            int k = find_short(opts, n_opts, *c);
            if (k < 0) return k3_fail(d, K3_ERR_USAGE, "unknown option '-%c'", *c);
            out->vals[k].count++;
            out->vals[k].from_env = 0;
            if (opts[k].arg) {
                if (c[1]) out->vals[k].value = c + 1;
                else if (i + 1 < argc) out->vals[k].value = argv[++i];
                else return k3_fail(d, K3_ERR_USAGE, "option '-%c' needs a value (%s)",
                                    *c, opts[k].arg);
                break;
            }
        }
    }
    /* environment fallback for options not given on the command line */
    for (int k = 0; k < n_opts; k++) {
        if (out->vals[k].count || !opts[k].env) continue;
        const char *v = getenv(opts[k].env);
        if (!v || !*v) continue;
        if (!opts[k].arg) {                         /* flag: 0/no/false = off */
            if (strcmp(v, "0") && strcmp(v, "no") && strcmp(v, "false")) {
                out->vals[k].count = 1;
                out->vals[k].from_env = 1;
            }
        } else {
            out->vals[k].value = v;
            out->vals[k].from_env = 1;
        }
    }
    int q = k3_opt_count(out, K3_OPT_QUIET), v = k3_opt_count(out, K3_OPT_VERBOSE);
    if (q || v) k3_log_set_level(q ? K3_LOG_QUIET + v : K3_LOG_NORMAL + v);
    return K3_OK;
}

const char *k3_opt_str(const k3_args *a, int id)
{
    int k = index_of(a, id);
    return k < 0 ? NULL : a->vals[k].value;
}

int k3_opt_count(const k3_args *a, int id)
{
    int k = index_of(a, id);
    return k < 0 ? 0 : a->vals[k].count;
}

int k3_opt_from_env(const k3_args *a, int id)
{
    int k = index_of(a, id);
    return k >= 0 && a->vals[k].from_env;
}

int k3_parse_size(const char *s, int allow_suffix, uint64_t *out)
{
    if (!s || *s < '0' || *s > '9') return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno) return -1;
    unsigned shift = 0;
    if (*end && allow_suffix) {
        switch (*end) {
        case 'K': case 'k': shift = 10; break;
        case 'M': case 'm': shift = 20; break;
        case 'G': case 'g': shift = 30; break;
        case 'T': case 't': shift = 40; break;
        default: return -1;
        }
        end++;
        if (*end == 'i') end++;
        if (*end == 'B' || *end == 'b') end++;
    }
    if (*end) return -1;
    if (shift && v > (UINT64_MAX >> shift)) return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

k3_err k3_opt_u64(const k3_args *a, int id, uint64_t def, int allow_suffix,
                  uint64_t *out, k3_diag *d)
{
    int k = index_of(a, id);
    *out = def;
    if (k < 0 || !a->vals[k].value) return K3_OK;
    if (k3_parse_size(a->vals[k].value, allow_suffix, out) == 0) return K3_OK;
    *out = def;
    if (a->vals[k].from_env) {
        k3_warn("ignoring environment variable %s='%s': not a valid number",
                a->opts[k].env, a->vals[k].value);
        return K3_OK;
    }
    return k3_fail(d, K3_ERR_USAGE, "option '--%s': '%s' is not a valid %s",
                   a->opts[k].long_name, a->vals[k].value, allow_suffix ? "size" : "number");
}

void k3_opts_help(FILE *f, const char *usage, const char *purpose,
                  const k3_opt *opts, int n_opts, const char *footer)
{
    fprintf(f, "Usage: %s\n\n%s\n\nOptions:\n", usage, purpose);
    for (int i = 0; i < n_opts; i++) {
        char left[64];
        const k3_opt *o = &opts[i];
        if (o->short_name)
            snprintf(left, sizeof left, "-%c, --%s%s%s", o->short_name, o->long_name,
                     o->arg ? " " : "", o->arg ? o->arg : "");
        else
            snprintf(left, sizeof left, "    --%s%s%s", o->long_name, o->arg ? " " : "",
                     o->arg ? o->arg : "");
        fprintf(f, "  %-26s %s", left, o->help);
        if (o->def) fprintf(f, " [default: %s]", o->def);
        if (o->env) fprintf(f, " (env: %s)", o->env);
        fputc('\n', f);
    }
    if (footer && *footer) fprintf(f, "\n%s", footer);
    fprintf(f, "\n%s", k3_exit_codes_help);
}

static const char *help_cmd;         /* the command whose --help a usage error points to */

void k3_opts_help_cmd(const char *cmd) { help_cmd = cmd; }

int k3_usage_error(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    k3_error("%s", msg);
    fprintf(stderr, "Try '%s --help' for more information.\n", help_cmd ? help_cmd : k3_log_prog());
    return K3_EXIT_USAGE;
}

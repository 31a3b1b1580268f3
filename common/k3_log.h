/*
 * k3_log.h - messages on stderr with a verbosity level, and safe printing of
 * untrusted names (tensor names come from files and may hold control bytes).
 *
 * Levels: 0 quiet (errors only), 1 normal (warnings, summaries), 2 verbose
 * (info), 3 debug. -q lowers, -v raises. Primary output goes to stdout and is
 * not affected by the level.
 */
#ifndef K3_LOG_H
#define K3_LOG_H

#include <stddef.h>
#include <stdio.h>

enum { K3_LOG_QUIET = 0, K3_LOG_NORMAL = 1, K3_LOG_VERBOSE = 2, K3_LOG_DEBUG = 3 };

void k3_log_init(const char *prog);      /* program name used as prefix */
const char *k3_log_prog(void);
void k3_log_set_level(int level);
int  k3_log_level(void);

/* "<prog>: error: <msg>" - always shown. */
void k3_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "<prog>: warning: <msg>" - level >= normal. */
void k3_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "<prog>: <msg>" - level >= verbose. */
void k3_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "<prog>: debug: <msg>" - level >= debug. */
void k3_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * Escape an untrusted byte string for display: printable ASCII kept, '\\' and
 * '\'' escaped, other bytes as \xNN (valid UTF-8 sequences kept as is, except
 * the C1 controls U+0080..U+009F, which terminals act on: U+009B is CSI).
 * Always NUL-terminates; truncates with "..." if out is too small.
 * Returns out, so it can be used inline in printf arguments.
 */
char *k3_escape(const char *in, size_t len, char *out, size_t cap);

/*
 * The same, but '\\' and '\'' are kept: for whole messages that may hold
 * names escaped already, so that no raw control byte reaches a terminal.
 * Every message of k3_error/k3_warn/k3_info/k3_debug goes through it.
 */
char *k3_escape_ctl(const char *in, size_t len, char *out, size_t cap);
/* The same in place, in s[cap] (cap at most 4096): a message that repeats what an input said becomes
   one line safe to print anywhere. Plain printable ASCII is left as it is, at no cost. */
void k3_escape_ctl_in_place(char *s, size_t cap);

/* Write s as a JSON string literal (with quotes) to f. */
void k3_json_str(FILE *f, const char *s, size_t len);

#endif

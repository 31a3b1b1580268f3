/* k3_error.c - error strings, exit codes and diagnostics. */
#include "k3_error.h"
#include "k3_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const k3_err_names[K3_ERR__COUNT] = {
    [K3_OK] = "ok",
    [K3_ERR_FORMAT] = "invalid format",
    [K3_ERR_CORRUPT] = "data corrupted",
    [K3_ERR_MODEL] = "model does not match its config",
    [K3_ERR_UNSUPPORTED] = "unsupported",
    [K3_ERR_USAGE] = "usage error",
    [K3_ERR_IO] = "i/o error",
    [K3_ERR_NOT_FOUND] = "not found",
    [K3_ERR_NOMEM] = "out of memory",
    [K3_ERR_NOSPACE] = "not enough disk space",
    [K3_ERR_LOCKED] = "locked by another process",
    [K3_ERR_INTERNAL] = "internal error",
};

const char *k3_strerror(k3_err err)
{
    if ((unsigned)err >= K3_ERR__COUNT) return "unknown error";
    return k3_err_names[err];
}

int k3_exit_code(k3_err err)
{
    switch (err) {
    case K3_OK: return K3_EXIT_OK;
    case K3_ERR_FORMAT: case K3_ERR_CORRUPT: case K3_ERR_MODEL: case K3_ERR_UNSUPPORTED:
        return K3_EXIT_DATA;
    case K3_ERR_USAGE: return K3_EXIT_USAGE;
    case K3_ERR_IO: case K3_ERR_NOT_FOUND: case K3_ERR_NOMEM: case K3_ERR_NOSPACE:
    case K3_ERR_LOCKED:
        return K3_EXIT_IO;
    default: return K3_EXIT_INTERNAL;
    }
}

/* A message repeats names and values taken from the input: a control byte in one (a newline, a
   terminal escape, a C1 control) is written escaped (\x0a, ...), so a message is one line of text
   that is safe to print wherever it goes (k3_escape_ctl_in_place). */
k3_err k3_fail(k3_diag *d, k3_err code, const char *fmt, ...)
{
    if (d) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(d->msg, sizeof d->msg, fmt, ap);
        va_end(ap);
        k3_escape_ctl_in_place(d->msg, sizeof d->msg);
        d->code = code;
    }
    return code;
}

k3_err k3_diag_wrap(k3_diag *d, const char *fmt, ...)
{
    if (!d) return K3_ERR_INTERNAL;
    char old[K3_DIAG_MAX];
    memcpy(old, d->msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(d->msg, sizeof d->msg, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    size_t used = (size_t)n < sizeof d->msg ? (size_t)n : sizeof d->msg - 1;
    size_t room = sizeof d->msg - used;            /* includes the NUL */
    if (room > 2) {
        memcpy(d->msg + used, ": ", 2);
        used += 2;
        room -= 2;
        size_t ol = strnlen(old, sizeof old - 1);
        if (ol >= room) ol = room - 1;
        memcpy(d->msg + used, old, ol);
        used += ol;
    }
    d->msg[used] = '\0';
    k3_escape_ctl_in_place(d->msg, sizeof d->msg);
    return d->code;
}

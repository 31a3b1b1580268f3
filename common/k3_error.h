/*
 * k3_error.h - error codes, diagnostics and exit codes shared by every k3 tool.
 *
 * Library functions return a k3_err and, on failure, fill a k3_diag with one
 * human-readable message in the manner of git: lowercase, no final period,
 * the subject in single quotes, naming file, tensor and byte offset:
 *     'model-00001-of-00002.safetensors': tensor 'x.weight': data_offsets [0, 12)
 *     do not match shape [2, 4] x BF16 = 16 bytes
 * Tools print it prefixed with their name and exit with k3_exit_code(err).
 */
#ifndef K3_ERROR_H
#define K3_ERROR_H

#include <stddef.h>

typedef enum k3_err {
    K3_OK = 0,
    /* data damaged or invalid: exit 1 */
    K3_ERR_FORMAT,       /* input violates its format (bad header, bad JSON, bad shape) */
    K3_ERR_CORRUPT,      /* bytes do not match their recorded hash or size */
    K3_ERR_MODEL,        /* tensors do not match the model config */
    K3_ERR_UNSUPPORTED,  /* valid but not supported (future format version, dtype) */
    /* usage: exit 2 */
    K3_ERR_USAGE,
    /* I/O or environment: exit 3 */
    K3_ERR_IO,           /* open/read/write/fsync failed */
    K3_ERR_NOT_FOUND,    /* a file that must exist does not */
    K3_ERR_NOMEM,
    K3_ERR_NOSPACE,      /* not enough free disk space */
    K3_ERR_LOCKED,       /* another process holds the lock */
    /* internal error: exit 4 */
    K3_ERR_INTERNAL,
    K3_ERR__COUNT
} k3_err;

/* Process exit codes (documented in README and every --help). */
enum {
    K3_EXIT_OK = 0,
    K3_EXIT_DATA = 1,
    K3_EXIT_USAGE = 2,
    K3_EXIT_IO = 3,
    K3_EXIT_INTERNAL = 4
};

#define K3_DIAG_MAX 1024

typedef struct k3_diag {
    k3_err code;
    char msg[K3_DIAG_MAX];   /* one line, no trailing newline */
} k3_diag;

/* Short fixed description of a code ("invalid format", "i/o error", ...). */
const char *k3_strerror(k3_err err);

/* Exit code for an error class (see the table above). */
int k3_exit_code(k3_err err);

/* Record a failure in d (if not NULL) and return code. printf-style message. */
k3_err k3_fail(k3_diag *d, k3_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefix the existing message with more context: "<context>: <old msg>". */
k3_err k3_diag_wrap(k3_diag *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif

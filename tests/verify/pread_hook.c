/*
 * pread_hook.c - LD_PRELOAD library for tests/verify/test_file_changes.py:
 * changes a file on disk at an exact moment of a tool's reading, as another
 * process could (truncate, delete, replace by rename, overwrite in place), so
 * the test is deterministic. It changes nothing the tool sees but the file
 * system: the read itself is then done by the real pread64.
 *
 * Environment:
 *   K3_HOOK_FILE  base name of the file to watch (e.g. experts-layer-001.k3s)
 *   K3_HOOK_AT    act on the first pread of that file at an offset >= AT
 *   K3_HOOK_DO    truncate:SIZE | unlink | replace:PATH (renamed over the file)
 *                 | scribble:OFFSET (one byte overwritten in place)
 * The action runs once; "k3_hook: <action> <path>" goes to stderr.
 */
#undef _FILE_OFFSET_BITS        /* pread and pread64 are two symbols, both interposed */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);

static int g_done;

static void act(int fd, off_t off)
{
    const char *file = getenv("K3_HOOK_FILE"), *at = getenv("K3_HOOK_AT"), *what = getenv("K3_HOOK_DO");
    if (g_done || !file || !at || !what || off < (off_t)strtoull(at, NULL, 10)) return;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = '\0';
    const char *base = strrchr(path, '/');
    if (!base || strcmp(base + 1, file)) return;
    if (__atomic_exchange_n(&g_done, 1, __ATOMIC_SEQ_CST)) return;    /* once, whatever the thread */
    int r = -1;
    if (!strncmp(what, "truncate:", 9)) {
        r = truncate(path, (off_t)strtoull(what + 9, NULL, 10));
    } else if (!strcmp(what, "unlink")) {
        r = unlink(path);
    } else if (!strncmp(what, "replace:", 8)) {
        r = rename(what + 8, path);
    } else if (!strncmp(what, "scribble:", 9)) {
        int w = open(path, O_WRONLY | O_CLOEXEC);
        unsigned char b = 0x5a;
        r = w >= 0 && pwrite(w, &b, 1, (off_t)strtoull(what + 9, NULL, 10)) == 1 ? 0 : -1;
        if (w >= 0) close(w);
    }
    fprintf(stderr, "k3_hook: %s %s at offset %lld: %s\n", what, path, (long long)off, r == 0 ? "done" : "FAILED");
}

static ssize_t real_pread(int fd, void *buf, size_t len, off_t off)
{
    static pread_fn next;
    if (!next) next = (pread_fn)dlsym(RTLD_NEXT, "pread64");
    return next(fd, buf, len, off);
}

ssize_t pread64(int fd, void *buf, size_t len, off_t off)
{
    act(fd, off);
    return real_pread(fd, buf, len, off);
}

ssize_t pread(int fd, void *buf, size_t len, off_t off)
{
    act(fd, off);
    return real_pread(fd, buf, len, off);
}

/*
 * fuzz_util.h - helpers shared by the fuzz targets (header-only, static):
 *  - FZ_EXPECT: abort with the failed invariant (libFuzzer then saves the input);
 *  - fz_check_err: what every rejection must look like (a data or I/O class
 *    code, never K3_ERR_INTERNAL, and a one-line message that fits);
 *  - fz_file: the input as a file path for loaders that only take paths
 *    (one memfd per process, rewritten for every input: no disk traffic);
 *  - fz_scratch_dir: a private temporary directory, removed at exit.
 */
#ifndef K3_FUZZ_UTIL_H
#define K3_FUZZ_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE      /* memfd_create; include this header first */
#endif
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "k3_error.h"

#define FZ_EXPECT(c) do { if (!(c)) { fprintf(stderr, "invariant failed: %s (%s:%d)\n", #c, __FILE__, __LINE__); \
                                      abort(); } } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* K3_FUZZ_VERBOSE=1 (replay): say what became of each input, to check seeds reach their paths. */
static inline int fz_verbose(void)
{
    static int v = -1;
    if (v < 0) v = getenv("K3_FUZZ_VERBOSE") != NULL;
    return v;
}

static inline void fz_accepted(const char *what)
{
    if (fz_verbose()) fprintf(stderr, "  accepted: %s\n", what);
}

/* A rejection: e is a data or environment error with a message (never internal). */
static inline void fz_check_err(k3_err e, const k3_diag *d)
{
    if (fz_verbose()) fprintf(stderr, "  rejected (%d): %s\n", (int)e, d->msg);
    if (e == K3_ERR_INTERNAL || e >= K3_ERR__COUNT) {
        fprintf(stderr, "internal error on input: %s\n", d->msg);
        abort();
    }
    FZ_EXPECT(d->code == e);
    FZ_EXPECT(d->msg[0] != '\0' && strlen(d->msg) < sizeof d->msg);
    FZ_EXPECT(strchr(d->msg, '\n') == NULL);
}

/* data[0..size) as the content of a file; returns its path ("/proc/self/fd/N"). */
static inline const char *fz_file(int slot, const uint8_t *data, size_t size)
{
    static int fds[4] = {-1, -1, -1, -1};
    static char paths[4][64];
    if (fds[slot] < 0) {
        fds[slot] = memfd_create("k3fuzz", 0);
        if (fds[slot] < 0) { perror("memfd_create"); abort(); }
        snprintf(paths[slot], sizeof paths[slot], "/proc/self/fd/%d", fds[slot]);
    }
    int fd = fds[slot];
    if (ftruncate(fd, 0) != 0) { perror("ftruncate"); abort(); }
    for (size_t done = 0; done < size;) {
        ssize_t w = pwrite(fd, data + done, size - done, (off_t)done);
        if (w <= 0) { perror("pwrite"); abort(); }
        done += (size_t)w;
    }
    return paths[slot];
}

/* Write a whole file (abort on failure: the harness, not the input, is broken). */
static inline void fz_write(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) { perror(path); abort(); }
}

static char fz_dir_path[256];

static int fz_rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st; (void)flag; (void)ftw;
    return remove(p);
}

static void fz_rm_dir(void)
{
    if (fz_dir_path[0]) nftw(fz_dir_path, fz_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A private scratch directory (in TMPDIR, else /tmp), removed at exit. */
static inline const char *fz_scratch_dir(void)
{
    if (!fz_dir_path[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(fz_dir_path, sizeof fz_dir_path, "%s/k3fuzz.XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(fz_dir_path)) { perror(fz_dir_path); abort(); }
        atexit(fz_rm_dir);
    }
    return fz_dir_path;
}

#endif

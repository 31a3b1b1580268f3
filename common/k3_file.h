/*
 * k3_file.h - whole reads and writes, crash-safe file replacement, locks.
 *
 * Crash-safe write (restic / PostgreSQL durable_rename sequence):
 *   k3_atomic_open()   creates "<dir>/.<name>.k3tmp-<pid>" (O_EXCL)
 *   ... write ...
 *   k3_atomic_commit() fsyncs the file, closes it, renames it to <name>,
 *                      fsyncs the directory
 *   k3_atomic_abort()  closes and removes the temporary file
 * A crash leaves at most a ".*.k3tmp-*" file, which the next run removes.
 */
#ifndef K3_FILE_H
#define K3_FILE_H

#include <stdint.h>
#include <stddef.h>

#include "k3_error.h"

/*
 * open(path, O_RDONLY | O_CLOEXEC) that never blocks: a FIFO (or a device)
 * where a file should be opens at once (O_NONBLOCK, cleared again after the
 * open), so the caller's fstat can refuse it instead of waiting for a writer.
 * Returns the fd, or -1 with errno set.
 */
int k3_open_read(const char *path);

/*
 * Read exactly len bytes at off. Callers check the file's size first (fstat,
 * a header checked against it), so a file that ends early changed under the
 * reader (truncated or replaced while open): K3_ERR_IO, exit 3, naming path.
 * A file that is short at open time is the caller's K3_ERR_FORMAT.
 */
k3_err k3_pread_full(int fd, void *buf, size_t len, uint64_t off, const char *path, k3_diag *d);
k3_err k3_pwrite_full(int fd, const void *buf, size_t len, uint64_t off, const char *path, k3_diag *d);
k3_err k3_write_full(int fd, const void *buf, size_t len, const char *path, k3_diag *d);

/* Read a whole (small) file into a NUL-terminated malloc'd buffer, at most max bytes. */
k3_err k3_read_file(const char *path, size_t max, char **out, size_t *len, k3_diag *d);

/* fsync a directory (ignores EINVAL/ENOTSUP from filesystems that cannot). */
k3_err k3_fsync_dir(const char *dir, k3_diag *d);

/* Join dir and name into out (PATH_MAX); fails on overflow. */
k3_err k3_path_join(char *out, size_t cap, const char *dir, const char *name, k3_diag *d);

typedef struct k3_atomic_file {
    int fd;
    char dir[4096];
    char final_path[4096];
    char tmp_path[4096];
} k3_atomic_file;

k3_err k3_atomic_open(k3_atomic_file *af, const char *dir, const char *name, k3_diag *d);
k3_err k3_atomic_commit(k3_atomic_file *af, k3_diag *d);
void k3_atomic_abort(k3_atomic_file *af);

/* Write a whole small file crash-safely. */
k3_err k3_atomic_write_file(const char *dir, const char *name, const void *buf, size_t len, k3_diag *d);

/* Is name a temporary of k3_atomic_open: ".NAME.k3tmp-PID" (NAME not empty, PID digits)? */
int k3_is_tmp_name(const char *name);

/* Remove leftover ".NAME.k3tmp-PID" files in dir (nothing else: a user's file that
   merely contains ".k3tmp-" stays); returns how many were removed. */
int k3_remove_stale_tmp(const char *dir);

/* Take an exclusive, non-blocking flock on the directory itself (no lock
   file). Held until *fd_out is closed or the process ends. */
k3_err k3_lock_dir(const char *dir, int *fd_out, k3_diag *d);

/* Bytes free for an unprivileged user on the filesystem holding path. */
k3_err k3_free_space(const char *path, uint64_t *out, k3_diag *d);

#endif

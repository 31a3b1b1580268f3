/* k3_file.c - whole reads/writes, crash-safe replacement, locks, free space. */
#include "k3_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

int k3_open_read(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return -1;
    int fl = fcntl(fd, F_GETFL);
    if (fl != -1) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

k3_err k3_pread_full(int fd, void *buf, size_t len, uint64_t off, const char *path, k3_diag *d)
{
    uint8_t *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread(fd, p + done, len - done, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            return k3_fail(d, K3_ERR_IO, "cannot read '%s' at offset %llu: %s", path,
                           (unsigned long long)(off + done), strerror(errno));
        }
        if (r == 0)      /* the caller checked the size first: the file shrank since */
            return k3_fail(d, K3_ERR_IO, "'%s' ended early while being read (needed %zu bytes at offset %llu, "
                           "got %zu): truncated or replaced since it was opened", path, len,
                           (unsigned long long)off, done);
        done += (size_t)r;
    }
    return K3_OK;
}

k3_err k3_pwrite_full(int fd, const void *buf, size_t len, uint64_t off, const char *path, k3_diag *d)
{
    const uint8_t *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t r = pwrite(fd, p + done, len - done, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            return k3_fail(d, errno == ENOSPC ? K3_ERR_NOSPACE : K3_ERR_IO,
                           "cannot write '%s' at offset %llu: %s", path,
                           (unsigned long long)(off + done), strerror(errno));
        }
        done += (size_t)r;
    }
    return K3_OK;
}

k3_err k3_write_full(int fd, const void *buf, size_t len, const char *path, k3_diag *d)
{
    const uint8_t *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t r = write(fd, p + done, len - done);
        if (r < 0) {
            if (errno == EINTR) continue;
            return k3_fail(d, errno == ENOSPC ? K3_ERR_NOSPACE : K3_ERR_IO,
                           "cannot write '%s': %s", path, strerror(errno));
        }
        done += (size_t)r;
    }
    return K3_OK;
}

k3_err k3_read_file(const char *path, size_t max, char **out, size_t *len, k3_diag *d)
{
    *out = NULL;
    int fd = k3_open_read(path);
    if (fd < 0)
        return k3_fail(d, errno == ENOENT ? K3_ERR_NOT_FOUND : K3_ERR_IO,
                       "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return k3_fail(d, K3_ERR_IO, "cannot stat '%s': %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return k3_fail(d, K3_ERR_FORMAT, "'%s' is not a regular file", path);
    }
    if ((uint64_t)st.st_size > max) {
        close(fd);
        return k3_fail(d, K3_ERR_FORMAT, "'%s' is %llu bytes, more than the limit of %zu",
                       path, (unsigned long long)st.st_size, max);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);          /* n bytes of file + NUL */
    if (!buf) {
        close(fd);
        return k3_fail(d, K3_ERR_NOMEM, "out of memory reading '%s'", path);
    }
    k3_err e = k3_pread_full(fd, buf, n, 0, path, d);
    close(fd);
    if (e) { free(buf); return e; }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return K3_OK;
}

k3_err k3_fsync_dir(const char *dir, k3_diag *d)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return k3_fail(d, K3_ERR_IO, "cannot open directory '%s': %s", dir, strerror(errno));
    int r = fsync(fd);
    int err = errno;
    close(fd);
    if (r != 0 && err != EINVAL && err != ENOTSUP)
        return k3_fail(d, K3_ERR_IO, "cannot fsync directory '%s': %s", dir, strerror(err));
    return K3_OK;
}

k3_err k3_path_join(char *out, size_t cap, const char *dir, const char *name, k3_diag *d)
{
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) return k3_fail(d, K3_ERR_USAGE, "path too long: '%s/%s'", dir, name);
    return K3_OK;
}

k3_err k3_atomic_open(k3_atomic_file *af, const char *dir, const char *name, k3_diag *d)
{
    af->fd = -1;
    char tmpname[512];
    snprintf(tmpname, sizeof tmpname, ".%s.k3tmp-%ld", name, (long)getpid());
    k3_err e;
    if ((e = k3_path_join(af->final_path, sizeof af->final_path, dir, name, d))) return e;
    if ((e = k3_path_join(af->tmp_path, sizeof af->tmp_path, dir, tmpname, d))) return e;
    snprintf(af->dir, sizeof af->dir, "%s", dir);
    unlink(af->tmp_path);                       /* a stale one of ours (same pid reuse) */
    af->fd = open(af->tmp_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (af->fd < 0)
        return k3_fail(d, errno == ENOSPC ? K3_ERR_NOSPACE : K3_ERR_IO, "cannot create '%s': %s",
                       af->tmp_path, strerror(errno));
    return K3_OK;
}

k3_err k3_atomic_commit(k3_atomic_file *af, k3_diag *d)
{
    if (fsync(af->fd) != 0 && errno != EINVAL && errno != ENOTSUP) {
        k3_fail(d, K3_ERR_IO, "cannot fsync '%s': %s", af->tmp_path, strerror(errno));
        k3_atomic_abort(af);
        return K3_ERR_IO;
    }
    if (close(af->fd) != 0) {
        af->fd = -1;
        k3_fail(d, K3_ERR_IO, "cannot close '%s': %s", af->tmp_path, strerror(errno));
        unlink(af->tmp_path);
        return K3_ERR_IO;
    }
    af->fd = -1;
    if (rename(af->tmp_path, af->final_path) != 0) {
        k3_fail(d, K3_ERR_IO, "cannot rename '%s' to '%s': %s", af->tmp_path, af->final_path,
                strerror(errno));
        unlink(af->tmp_path);
        return K3_ERR_IO;
    }
    return k3_fsync_dir(af->dir, d);
}

void k3_atomic_abort(k3_atomic_file *af)
{
    if (af->fd >= 0) close(af->fd);
    af->fd = -1;
    unlink(af->tmp_path);
}

k3_err k3_atomic_write_file(const char *dir, const char *name, const void *buf, size_t len, k3_diag *d)
{
    k3_atomic_file af;
    k3_err e = k3_atomic_open(&af, dir, name, d);
    if (e) return e;
    if ((e = k3_write_full(af.fd, buf, len, af.tmp_path, d))) {
        k3_atomic_abort(&af);
        return e;
    }
    return k3_atomic_commit(&af, d);
}

int k3_is_tmp_name(const char *name)
{
    const char *t = NULL;
    if (name[0] != '.') return 0;
    for (const char *p = name + 1; (p = strstr(p, ".k3tmp-")); p++) t = p;
    if (!t || t == name + 1) return 0;               /* no ".k3tmp-", or an empty NAME */
    t += strlen(".k3tmp-");
    if (!*t) return 0;
    for (; *t; t++)
        if (*t < '0' || *t > '9') return 0;
    return 1;
}

int k3_remove_stale_tmp(const char *dir)
{
    DIR *dh = opendir(dir);
    if (!dh) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(dh))) {
        if (!k3_is_tmp_name(de->d_name)) continue;
        char p[4096];
        if (snprintf(p, sizeof p, "%s/%s", dir, de->d_name) >= (int)sizeof p) continue;
        if (unlink(p) == 0) n++;
    }
    closedir(dh);
    return n;
}

k3_err k3_lock_dir(const char *dir, int *fd_out, k3_diag *d)
{
    /* The lock is on the directory itself: no lock file, so nothing to leave
       behind or to unlink while another process may be opening it. */
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return k3_fail(d, K3_ERR_IO, "cannot open directory '%s' to lock it: %s", dir, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        close(fd);
        if (err == EWOULDBLOCK)
            return k3_fail(d, K3_ERR_LOCKED, "'%s' is locked: another process is writing this output", dir);
        return k3_fail(d, K3_ERR_IO, "cannot lock '%s': %s", dir, strerror(err));
    }
    *fd_out = fd;
    return K3_OK;
}

k3_err k3_free_space(const char *path, uint64_t *out, k3_diag *d)
{
    struct statvfs sv;
    if (statvfs(path, &sv) != 0)
        return k3_fail(d, K3_ERR_IO, "cannot query free space of '%s': %s", path, strerror(errno));
    *out = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
    return K3_OK;
}

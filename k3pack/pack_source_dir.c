/*
 * pack_source_dir.c - k3pack from a checkpoint directory or a single
 * .safetensors file: each file streamed front to back (pack_stream.c; several
 * at once with --threads) in chunks of PK_CHUNK bytes, so memory stays bounded
 * whatever the checkpoint's size. Each file is checked
 * against what was validated (size, mtime) when it is opened, and a short read
 * says the file changed under k3pack; SIGINT / SIGTERM are noticed per chunk.
 */
#include "pack.h"

#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "k3_log.h"

#define PK_CHUNK (8u << 20)

static int64_t mtime_ns(const struct stat *st)
{
    return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

k3_err pk_inputs_from_ckpt(const k3_st_ckpt *ck, pk_input **out, size_t *n, k3_diag *d)
{
    pk_input *in = calloc(ck->n_files + 1, sizeof *in);          /* [n_files] */
    uint8_t *hdr = NULL;                                         /* [8 + N] one file's header */
    k3_err e = in ? K3_OK : k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < ck->n_files && !e; i++) {
        const k3_st_file *f = &ck->files[i];
        struct stat st;
        int fd = k3_open_read(f->path);
        if (fd < 0) { e = k3_fail(d, K3_ERR_IO, "cannot open '%s': %s", f->path, strerror(errno)); break; }
        uint8_t *nb = realloc(hdr, (size_t)(8 + f->header_len));  /* validated by k3_st_open */
        if (!nb) e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
        else if (fstat(fd, &st) != 0) e = k3_fail(d, K3_ERR_IO, "cannot stat '%s': %s", f->path, strerror(errno));
        else if ((uint64_t)st.st_size != f->size)
            e = k3_fail(d, K3_ERR_IO, "'%s' changed while k3pack was reading it: it was %llu bytes and is %llu now",
                        f->path, (unsigned long long)f->size, (unsigned long long)st.st_size);
        if (nb) hdr = nb;
        if (!e) e = k3_pread_full(fd, hdr, (size_t)(8 + f->header_len), 0, f->path, d);
        close(fd);
        if (e) break;
        snprintf(in[i].name, sizeof in[i].name, "%s", f->name);
        in[i].size = f->size;
        in[i].mtime_ns = mtime_ns(&st);
        in[i].header = k3_xxh3_128(hdr, (size_t)(8 + f->header_len));
    }
    free(hdr);
    if (e) { free(in); return e; }
    *out = in;
    *n = ck->n_files;
    return K3_OK;
}

/* The checkpoint's files opened for packing, each still what k3pack validated (size and mtime of in);
   *fds is NULL only when out of memory (else close_inputs closes what opened). */
static k3_err open_inputs(const k3_st_ckpt *ck, const pk_input *in, int **fds_out, k3_diag *d)
{
    int *fds = *fds_out = malloc((ck->n_files + 1) * sizeof *fds);   /* [n_files] */
    if (!fds) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    k3_err e = K3_OK;
    for (size_t i = 0; i < ck->n_files; i++) fds[i] = -1;
    for (size_t i = 0; i < ck->n_files && !e; i++) {
        struct stat st;
        fds[i] = k3_open_read(ck->files[i].path);
        if (fds[i] < 0) e = k3_fail(d, K3_ERR_IO, "cannot open '%s': %s", ck->files[i].path, strerror(errno));
        else if (fstat(fds[i], &st) != 0 || (uint64_t)st.st_size != in[i].size || mtime_ns(&st) != in[i].mtime_ns)
            e = k3_fail(d, K3_ERR_IO, "'%s' changed after k3pack validated it (size or modification time); "
                        "rerun k3pack when the checkpoint is stable", ck->files[i].path);
    }
    return e;
}

static void close_inputs(const k3_st_ckpt *ck, int *fds)
{
    for (size_t i = 0; i < ck->n_files; i++)
        if (fds[i] >= 0) close(fds[i]);
    free(fds);
}

/* SHA-256 on a thread of its own, a chunk behind the reads: hashing (1.5 GB/s a core with the SHA
   extensions) then costs no time beside the reading, copying and writing of the same bytes. */
typedef struct hasher {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    k3_dl_hash *h;
    const uint8_t *p;           /* the chunk to hash, NULL: none */
    size_t n;
    int stop;
} hasher;

static void *hash_main(void *arg)
{
    hasher *x = arg;
    pthread_mutex_lock(&x->mu);
    for (;;) {
        while (!x->p && !x->stop) pthread_cond_wait(&x->cv, &x->mu);
        if (!x->p) break;
        pthread_mutex_unlock(&x->mu);
        k3_dl_hash_update(x->h, x->p, x->n);
        pthread_mutex_lock(&x->mu);
        x->p = NULL;
        pthread_cond_broadcast(&x->cv);
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

static void hasher_wait(hasher *x)            /* until it is idle */
{
    pthread_mutex_lock(&x->mu);
    while (x->p) pthread_cond_wait(&x->cv, &x->mu);
    pthread_mutex_unlock(&x->mu);
}

static void hasher_give(hasher *x, const uint8_t *p, size_t n)
{
    pthread_mutex_lock(&x->mu);
    x->p = p;
    x->n = n;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

/* One file front to back: every byte hashed (SHA-256), the planned tensors written. buf holds two
   chunks: one being hashed while the next is read and packed. */
static k3_err stream_file(pk_stream *st, const k3_st_file *f, int fd, uint32_t no, const k3_dl *dl,
                          const volatile int *stop, uint8_t *buf, int *bad_download, int *stopped, k3_diag *d)
{
    pk_entry es;
    pk_entry_begin(&es, f->name, f->size, no, k3_dl_find(dl, f->name));
    es.hash_outside = 1;
    hasher hx = {.h = &es.sha};
    pthread_mutex_init(&hx.mu, NULL);
    pthread_cond_init(&hx.cv, NULL);
    int threaded = pthread_create(&hx.th, NULL, hash_main, &hx) == 0;
    k3_err e = K3_OK;
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    int cur = 0;
    for (uint64_t pos = 0; pos < f->size && !e; cur ^= 1) {
        size_t n = (size_t)(f->size - pos < PK_CHUNK ? f->size - pos : PK_CHUNK);
        uint8_t *b = buf + (size_t)cur * PK_CHUNK;      /* the hasher may still be on the other chunk */
        if (*stop) {                                  /* another file failed: its error is the one */
            *stopped = 1;
            e = k3_fail(d, K3_ERR_IO, "stopped");
            break;
        }
        e = pk_check_interrupt(d);
        if (!e && (e = k3_pread_full(fd, b, n, pos, f->path, d))) {
            struct stat st2;
            if (fstat(fd, &st2) == 0 && (uint64_t)st2.st_size != f->size)
                e = k3_fail(d, K3_ERR_IO, "'%s' changed while k3pack was reading it: it was %llu bytes and is "
                            "%llu now", f->path, (unsigned long long)f->size, (unsigned long long)st2.st_size);
        }
        if (e) break;
        if (threaded) {
            hasher_wait(&hx);
            hasher_give(&hx, b, n);
        } else {
            k3_dl_hash_update(&es.sha, b, n);
        }
        e = pk_entry_data(st, &es, b, n, d);
        posix_fadvise(fd, (off_t)pos, (off_t)n, POSIX_FADV_DONTNEED);   /* read once: keep it out of the cache */
        pos += n;
    }
    if (threaded) {
        hasher_wait(&hx);
        pthread_mutex_lock(&hx.mu);
        hx.stop = 1;
        pthread_cond_broadcast(&hx.cv);
        pthread_mutex_unlock(&hx.mu);
        pthread_join(hx.th, NULL);
    }
    pthread_mutex_destroy(&hx.mu);
    pthread_cond_destroy(&hx.cv);
    uint8_t sha[32];
    if (!e && (e = pk_entry_end(st, &es, f->path, sha, d)) == K3_ERR_CORRUPT) *bad_download = 1;
    if (!e) e = pk_add_src_file(st->w, f->name, f->size, sha, d);
    pk_entry_free(&es);
    return e;
}

k3_err pk_pack_stream_ckpt(pk_writer *w, const k3_st_ckpt *ck, const k3_dl *dl, int threads, int *bad_download,
                           k3_diag *d)
{
    int *fds;
    k3_err e = open_inputs(ck, w->inputs, &fds, d);
    if (!fds) return e;
    if (threads < 1) threads = 1;
    k3_diag first = {0};
    volatile int failed = 0;
    int have_first = 0;
    if (!e && w->p->in_place) e = pk_in_place_begin(w, d);
    if (!e) {
        pk_stream stm = {.w = w, .src = ck->source};
#pragma omp parallel num_threads(threads)
        {
            uint8_t *buf = malloc(2 * (size_t)PK_CHUNK);        /* [2][PK_CHUNK] read buffers, per thread */
#pragma omp for schedule(dynamic, 1)
            for (size_t i = 0; i < ck->n_files; i++) {
                k3_diag dd;
                int stopped = 0;
                if (failed) continue;
                k3_err es = !buf ? k3_fail(&dd, K3_ERR_NOMEM, "out of memory")
                          : stream_file(&stm, &ck->files[i], fds[i], (uint32_t)i + 1, dl, &failed, buf,
                                        bad_download, &stopped, &dd);
                if (es) {
#pragma omp critical(pk_first_error)
                    {
                        if (!have_first && !stopped) {                /* the cause, not another's stop */
                            first = dd;
                            have_first = 1;
                        }
                        failed = 1;
                    }
                }
            }
            free(buf);
        }
        if (failed) e = k3_fail(d, first.code, "%s", first.msg);
    }
    if (!e && w->p->in_place) e = pk_in_place_finish(w, d);
    close_inputs(ck, fds);
    return e;
}

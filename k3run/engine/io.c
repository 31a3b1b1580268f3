/* io.c - the reader threads (io.h). */
#define _GNU_SOURCE
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3_hash.h"
#include "k3_sys.h"

struct k3io {
    pthread_mutex_t mu;
    pthread_cond_t work, fin;   /* work: a job was queued or stop; fin: a job finished */
    k3io_job *head, *tail;      /* FIFO of queued jobs */
    int stop, n;
    pthread_t th[16];
};

void k3io_run(k3io_job *j)
{
    double t0 = k3_now();
    int fd = j->fd_direct >= 0 && j->span ? j->fd_direct : j->fd;
    uint8_t *data = j->dst + j->lead;        /* [size] what was asked for */
    uint8_t *at = fd == j->fd ? data : j->dst;
    uint64_t from = fd == j->fd ? j->off : j->off - j->lead, len = fd == j->fd ? j->size : j->span;
    j->failed = j->bad_hash = 0;
    j->why = NULL;
    for (uint64_t done = 0; done < len;) {
        ssize_t r = pread(fd, at + done, (size_t)(len - done), (off_t)(from + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && fd != j->fd && done == 0) {                  /* no O_DIRECT here */
            fd = j->fd;
            at = data;
            from = j->off;
            len = j->size;
            continue;
        }
        if (r == 0 && fd != j->fd && done >= j->lead + j->size) break;  /* the file ends inside the last granule */
        if (r <= 0) {
            j->failed = 1;
            j->why = r < 0 ? strerror(errno) : "the file ended early (truncated?)";
            break;
        }
        done += (uint64_t)r;
        if (fd != j->fd && done >= j->lead + j->size) break;   /* short at the end of the file: enough */
    }
    if (!j->failed && fd == j->fd)           /* keep the page cache from growing past the budget */
        posix_fadvise(j->fd, (off_t)j->off, (off_t)j->size, POSIX_FADV_DONTNEED);
    double th = k3_now();
    j->hash_seconds = 0;
    if (!j->failed && j->verify && j->hs) {
        if (j->hs_reset) k3_hasher64_reset(j->hs);
        k3_hasher64_update(j->hs, data, (size_t)j->size);
        if (j->hs_final && k3_hasher64_digest(j->hs) != j->hash) {
            j->failed = j->bad_hash = 1;
            j->why = j->bad_why ? j->bad_why : "XXH3-64 does not match the manifest: the pack is damaged, run k3verify";
        }
    } else if (!j->failed && j->verify && k3_xxh3_64(data, (size_t)j->size) != j->hash) {
        j->failed = j->bad_hash = 1;
        j->why = j->bad_why ? j->bad_why : "XXH3-64 does not match the manifest: the pack is damaged, run k3verify";
    }
    j->hash_seconds = j->verify ? k3_now() - th : 0;
    for (int i = 0; !j->failed && i < j->n_scan; i++)
        if (memchr(data + j->scan_off[i], 0xFF, (size_t)j->scan_len[i])) {
            j->failed = j->bad_hash = 1;
            j->why = "an MXFP4 scale is 0xFF (NaN in E8M0): the pack is invalid, run k3verify";
        }
    j->seconds = k3_now() - t0;
}

static void *reader(void *arg)
{
    k3io *io = arg;
    pthread_mutex_lock(&io->mu);
    for (;;) {
        while (!io->head && !io->stop) pthread_cond_wait(&io->work, &io->mu);
        if (!io->head) break;                 /* stop, and nothing left */
        k3io_job *j = io->head;
        io->head = j->next;
        if (!io->head) io->tail = NULL;
        pthread_mutex_unlock(&io->mu);
        k3io_run(j);
        pthread_mutex_lock(&io->mu);
        j->done = 1;
        pthread_cond_broadcast(&io->fin);
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

k3io *k3io_new(int n)
{
    if (n < 1) n = 1;
    if (n > 16) n = 16;
    k3io *io = calloc(1, sizeof *io);
    if (!io) return NULL;
    pthread_mutex_init(&io->mu, NULL);
    pthread_cond_init(&io->work, NULL);
    pthread_cond_init(&io->fin, NULL);
    for (int i = 0; i < n; i++) {
        if (pthread_create(&io->th[i], NULL, reader, io)) break;
        io->n++;
    }
    if (!io->n) { k3io_free(io); return NULL; }
    return io;
}

void k3io_free(k3io *io)
{
    if (!io) return;
    pthread_mutex_lock(&io->mu);
    io->stop = 1;
    pthread_cond_broadcast(&io->work);
    pthread_mutex_unlock(&io->mu);
    for (int i = 0; i < io->n; i++) pthread_join(io->th[i], NULL);
    pthread_cond_destroy(&io->work);
    pthread_cond_destroy(&io->fin);
    pthread_mutex_destroy(&io->mu);
    free(io);
}

void k3io_submit(k3io *io, k3io_job *const *jobs, int n)
{
    pthread_mutex_lock(&io->mu);
    for (int i = 0; i < n; i++) {
        k3io_job *j = jobs[i];
        j->done = 0;
        j->next = NULL;
        if (io->tail) io->tail->next = j;
        else io->head = j;
        io->tail = j;
    }
    pthread_cond_broadcast(&io->work);
    pthread_mutex_unlock(&io->mu);
}

int k3io_wait(k3io *io, k3io_job *j)
{
    pthread_mutex_lock(&io->mu);
    while (!j->done) pthread_cond_wait(&io->fin, &io->mu);
    pthread_mutex_unlock(&io->mu);
    return j->failed;
}

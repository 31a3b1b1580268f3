/*
 * io.h - a small pool of reader threads for the weights: pread a span of a
 * shard into memory and check its XXH3-64, off the compute threads.
 *
 * A job is owned by its submitter and must stay alive until k3io_wait has
 * returned for it. Jobs run in submission order (several at once, one per
 * reader thread), so a disk sees a deep queue of large reads while the
 * compute threads multiply what is already in memory.
 */
#ifndef K3_IO_H
#define K3_IO_H

#include <stdint.h>

typedef struct k3io_job {
    /* in */
    int fd;                  /* buffered descriptor of the shard */
    int fd_direct;           /* O_DIRECT descriptor, or -1 */
    uint64_t off;            /* file offset */
    uint64_t size;           /* bytes wanted (and hashed) */
    uint64_t span;           /* bytes an O_DIRECT read may take (lead + size rounded to 4 KiB; 0: no O_DIRECT) */
    uint64_t lead;           /* off - lead is where an O_DIRECT read starts (4 KiB-aligned; 0 for a pack's
                                aligned records, off % 4096 for records read in place in a checkpoint) */
    uint8_t *dst;            /* [span or lead + size], 4 KiB-aligned for O_DIRECT; the bytes land at dst + lead */
    int verify;              /* check XXH3-64 of the size bytes at dst + lead against hash */
    uint64_t hash;
    struct k3_hasher64 *hs;  /* NULL: the size bytes are the whole hashed span. Else one piece of it, in
                                order: hs_reset first (reset hs), every piece updates hs, the last
                                (hs_final) compares hs's digest with hash */
    int hs_reset, hs_final;
    const char *bad_why;     /* what a hash mismatch means, or NULL: "the pack is damaged" */
    int n_scan;              /* MXFP4 scale ranges of dst to refuse 0xFF in (NaN in E8M0), <= 3 */
    uint64_t scan_off[3], scan_len[3];
    /* out (valid after k3io_wait) */
    int failed;              /* 0, or the read or the hash failed */
    int bad_hash;            /* it was the bytes (hash, or a NaN scale), not the read */
    const char *why;         /* static text or strerror's; NULL when ok */
    double seconds;          /* time the read and hash took */
    double hash_seconds;     /* of it, the hash */
    /* private */
    volatile int done;
    struct k3io_job *next;
} k3io_job;

typedef struct k3io k3io;

/* A pool of n reader threads (n >= 1); NULL when threads cannot be made. */
k3io *k3io_new(int n);
/* Wait for every job, then stop the threads. */
void k3io_free(k3io *io);
/* Queue jobs (the pool reads them in this order). */
void k3io_submit(k3io *io, k3io_job *const *jobs, int n);
/* Block until the job is done; returns job->failed. */
int k3io_wait(k3io *io, k3io_job *job);
/* Run a job on the calling thread (no pool). */
void k3io_run(k3io_job *job);

#endif

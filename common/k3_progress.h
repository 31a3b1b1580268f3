/*
 * k3_progress.h - a throttled one-line progress display on stderr.
 *
 * Shown only when stderr is a terminal, the log level is at least normal and
 * K3_NO_PROGRESS is not set. Redrawn at most 5 times a second:
 *     packing: shard 3/12  1.21 GiB / 4.80 GiB  25%  812 MiB/s  ETA 0:04 'layers.3.q_proj'
 * and cleared by k3_progress_end().
 */
#ifndef K3_PROGRESS_H
#define K3_PROGRESS_H

#include <stdint.h>

typedef struct k3_progress {
    int enabled;
    const char *label;     /* e.g. "packing" */
    uint64_t total;        /* bytes (or units) expected; 0 = unknown */
    double t_start;        /* seconds, monotonic */
    double t_last;         /* last redraw */
    int drawn;             /* a line is on screen */
} k3_progress;

void k3_progress_start(k3_progress *p, const char *label, uint64_t total);
/* done: units so far; detail: short text shown at the end (may be NULL; control
   bytes in it are shown as \xNN, it is cut at about 250 bytes). */
void k3_progress_update(k3_progress *p, uint64_t done, const char *detail);
void k3_progress_end(k3_progress *p);

/* Human-readable size: "1.50 GiB" (binary units). buf >= 16 bytes. */
char *k3_human_bytes(double bytes, char *buf, int cap);

#endif

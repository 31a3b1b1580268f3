/*
 * runstats.h - per-token statistics of a k3run run: time, bytes read from
 * disk, expert cache hits and misses, time the compute thread waited for
 * reads, and resident memory (VmRSS, VmHWM). Taking a sample allocates
 * nothing (the token loop allocates nothing), so it can run every token.
 */
#ifndef K3_RUNSTATS_H
#define K3_RUNSTATS_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "engine.h"

typedef struct k3_step_stat {
    double seconds;           /* wall time of the step */
    uint64_t bytes_read;      /* from disk during the step */
    uint64_t trunk_bytes;     /* of it: streamed trunk units (and the embedding row) */
    uint64_t hits, misses;    /* expert cache */
    double wait_seconds;      /* the compute thread waited for reads */
    uint64_t rss, hwm;        /* VmRSS and VmHWM at its end, bytes */
} k3_step_stat;

typedef struct k3_runstats {
    k3_weights *w;
    uint32_t cap, n;          /* tokens recorded */
    k3_step_stat prefill;     /* the prompt's forward passes */
    k3_step_stat *tok;        /* [cap] one per generated token */
    double t_last;
    k3_weights_stats last;
    uint32_t n_units;         /* layers + the head */
    double *unit_prefill;     /* [n_units] k3w_unit_seconds at the end of the prefill */
} k3_runstats;

/* cap: most tokens recorded (the -n). NULL tok buffer -> K3 error by the caller. */
int k3_runstats_init(k3_runstats *r, k3_weights *w, uint32_t cap);
void k3_runstats_free(k3_runstats *r);
/* A step ended: index -1 the prefill, else generated token `index`. */
void k3_runstats_step(void *r, int64_t index);
/* VmRSS and VmHWM of this process (bytes, 0 if unknown); no allocation. */
void k3_mem_now(uint64_t *rss, uint64_t *hwm);

/* The per-token table and a summary, as text (stderr) or JSON ("prefill", "tokens", and
   "decode_unit_seconds": each layer's and the head's seconds per generated token). */
void k3_runstats_print(const k3_runstats *r, FILE *f);
json_t *k3_runstats_json(const k3_runstats *r);

#endif

/*
 * plan_report.h - the memory plan (plan.h) for people and for scripts: the
 * same report in k3inspect --plan and wherever k3run shows its plan.
 *
 * Units: amounts of bytes in binary units, KiB, MiB or GiB (2^10, 2^20, 2^30
 * bytes; the main lines also give exact bytes); disk bandwidth in GB/s (10^9
 * bytes per second), as disks are sold. The JSON form gives every amount of
 * bytes as an exact integer.
 *
 * Per-token figures are for one decoded token: the streamed trunk units, the
 * expected expert records missed by the cache, and one embedding row. Expert
 * reads assume uniform routing (every expert of a layer equally likely, so the
 * cache hit rate is slots / experts); real routing is skewed, which usually
 * lets a cache hit more often. The s/token figures are I/O time alone (bytes /
 * bandwidth): no compute, no overlap, no page cache.
 *
 * A prompt's figures (k3_prompt_cost, plan.h) are for passes of the plan's batch from an empty
 * context: what a pass reads, per prompt token, and (k3_ttft_*) the time to its first token, the
 * larger of its reads at a bandwidth and its compute at an FMA peak (the readers run on their own
 * threads beside the compute); the compute at the peak is a floor that no kernel reaches.
 */
#ifndef K3_PLAN_REPORT_H
#define K3_PLAN_REPORT_H

#include <stdio.h>

#include <jansson.h>

#include "plan.h"

/* The disk bandwidths the report prices a token at, in GB/s. */
#define K3_PLAN_N_BANDWIDTHS 3
extern const double k3_plan_bandwidths_gbs[K3_PLAN_N_BANDWIDTHS];   /* 2, 7, 14 */

/*
 * The FMA peak k3inspect --plan prices a prompt's compute at, in GFLOP/s (10^9 flops per second),
 * when --fma-peak is not given: the fp32 FMA peak of the 2-vCPU AVX-512 machine k3 is measured on
 * (207-226 GFLOP/s on 2 threads by tests/bench/bench_kernels, issue 32), rounded down. A stated
 * figure, not a measurement at each run, so the plan is the same on every machine; bench_kernels
 * measures a machine's own.
 */
#define K3_FMA_PEAK_DEFAULT 200.0
/* The prompts the time to first token is given for, in tokens. */
#define K3_TTFT_N_PROMPTS 3
extern const uint32_t k3_ttft_prompts[K3_TTFT_N_PROMPTS];       /* 1000, 8000, 32000 */
#define K3_TTFT_N_BANDWIDTHS 2
extern const double k3_ttft_bandwidths_gbs[K3_TTFT_N_BANDWIDTHS];  /* 2, 7 */

/* One prompt of the time-to-first-token table: planned at the batch asked for (-b auto: for this
   prompt) and at -b 64, each at a context of at least the prompt. */
typedef struct k3_ttft_row {
    uint32_t tokens, context;
    int fits[2];                 /* [2]: [0] the batch asked for, [1] -b 64; 0 when the budget is below
                                    the plan's minimum at this context */
    k3_plan plan[2];             /* [2] the plans, as fits */
    k3_prompt_cost cost[2];      /* [2] the prompt under each */
} k3_ttft_row;
/* The table as text (after k3_plan_print) and as JSON ("time_to_first_token"). */
void k3_ttft_print(FILE *f, const k3_ttft_row *rows, int n, double fma_gflops);
/* Bytes in binary units sized to the amount ("1.41 TiB", "16.7 MiB"); buf [24]. */
const char *k3_plan_human(uint64_t b, char *buf);

/*
 * Parallel (plan_parallel.c): S conversations sharing each pass (k3run serve --parallel S). A
 * decode pass carries one token of each, at position pos: it reads the streamed trunk once, the
 * experts its S x k picks use that the cache lacks (uniform routing), S embedding rows; it
 * touches in memory the resident trunk, the cached experts it uses and the sequences' states
 * (their KDA states and the MLA cache up to pos); its compute is S tokens' (weights, attention,
 * KDA state, lm_head). The pass takes the largest of reads / disk bandwidth, compute / FMA peak
 * and memory traffic / memory bandwidth (they overlap): S tokens, one per conversation.
 */
typedef struct k3_decode_cost {
    uint32_t rows, pos;
    double experts_used;         /* expert records the pass uses */
    double expert_reads;         /* of them, read (not in the cache) */
    double read_bytes;           /* from the pack: the streamed trunk, the experts read, embedding rows */
    double touched_bytes;        /* from memory: the resident trunk, cached experts used, the states */
    double flops;
} k3_decode_cost;
void k3_decode_cost_of(const k3_config *c, const k3_geometry *g, const k3_plan *p, uint32_t S, uint32_t pos,
                       k3_decode_cost *out);
double k3_decode_seconds(const k3_decode_cost *dc, double disk_gbs, double fma_gflops, double mem_gbs);

#define K3_PAR_N_SLOTS 6
extern const uint32_t k3_par_slots[K3_PAR_N_SLOTS];            /* 1, 2, 4, 8, 16, 32 */
#define K3_MEM_GBS_DEFAULT 40.0        /* the memory bandwidth --plan assumes (bench_membw measures yours) */
typedef struct k3_par_row {
    uint32_t slots;
    int fits;                    /* the budget holds the plan for `slots` sequences */
    k3_plan plan;
    k3_decode_cost cost;
} k3_par_row;
void k3_par_print(FILE *f, const k3_par_row *rows, int n, double fma_gflops, double mem_gbs);
json_t *k3_par_json(const k3_par_row *rows, int n, double fma_gflops, double mem_gbs);
json_t *k3_ttft_json(const k3_ttft_row *rows, int n, double fma_gflops);

/* Expected expert bytes read per decoded token (expert_reads_per_token x record size), rounded. */
uint64_t k3_plan_expert_bytes_per_token(const k3_plan *p, const k3_geometry *g);
/* Expected bytes read per decoded token: streamed trunk + expert bytes (rounded as above) + one
   embedding row; within 1 byte of p->disk_per_token. */
uint64_t k3_plan_disk_bytes_per_token(const k3_plan *p, const k3_geometry *g);

/* "0-3, 5, 7-92, head": the streamed units, layers as ranges, the last unit as "head";
   "none" when nothing is streamed. Truncated (ending "...") if cap is too small. */
char *k3_plan_streamed_list(const k3_plan *p, char *buf, size_t cap);

/* A short multi-line report (budget, minimum, resident bytes by part, streamed units, expected
   reads per token and the I/O time they imply at 2, 7 and 14 GB/s). */
void k3_plan_print(FILE *f, const k3_plan *p, const k3_geometry *g);

/*
 * The plan as a new JSON object (NULL when out of memory): every amount of bytes an integer
 * (keys end in "_bytes"), per-unit bytes, the streamed units as layer indices and "head", and
 * the I/O seconds per token at each bandwidth. Keys in docs/k3inspect.md.
 */
json_t *k3_plan_json(const k3_plan *p, const k3_geometry *g);

#endif

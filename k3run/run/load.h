/*
 * load.h - bringing a pack up for a run, shared by every front end (a
 * generation, a perplexity run, a chat): optionally k3verify the whole pack,
 * plan the memory from the manifest alone, then read the weights and make the
 * model. Two steps, so a front end can refuse its input between the plan and
 * the reading of the first weight.
 */
#ifndef K3_LOAD_H
#define K3_LOAD_H

#include <stdint.h>

#include "engine.h"

typedef struct k3_load_opts {
    const char *pack;              /* the pack directory */
    uint64_t budget;               /* bytes; 0: what the machine allows, less a margin */
    uint32_t context, batch;       /* batch: K3_BATCH_AUTO (-b auto) or tokens per pass */
    uint32_t prompt_tokens;        /* -b auto: the prompt's tokens (0: not known, the context) */
    uint32_t generate_tokens;      /* -b auto: the tokens generated after it (-n) */
    int all_logits;                /* logits for every token of a batch (--dump, --perplexity) */
    uint32_t snapshots;            /* state snapshots the plan makes room for (chat) */
    uint32_t spec_tokens;          /* tokens of a speculative verify pass (1 + --draft, clamped to the batch),
                                      0: none; dropped
                                      (plan.verify_tokens 0) where the budget has no room for it */
    uint32_t n_seq;                /* sequences sharing the passes (--parallel; 0 or 1: one) */
    int verify;                    /* run k3verify on the pack first */
    int verify_reads;              /* check every tensor's and record's XXH3-64 as it is read */
    int report;                    /* print the plan on stderr (--stats) */
    k3_isa isa;
    /* optional dump hook for the model (dump.h) */
    void (*dump)(void *ctx, const char *name, int layer, uint32_t T, uint32_t width, const float *f,
                 const int32_t *ids);
    void *dump_ctx;
} k3_load_opts;

typedef struct k3_loaded {
    k3_weights *w;
    k3_model *m;
    k3_plan plan;
    const k3_geometry *geo;        /* the plan's input (the pack's geometry) */
    k3_weights_opts wo;
    double t_verify;               /* seconds k3verify took (not part of the load time) */
    int trunk_split;               /* the trunk split by rows across the ranks (K3_TRUNK=split, more than one) */
    uint64_t split_min;            /* then: the smallest matrix split (K3_SPLIT_MIN) */
} k3_loaded;

/* Step 1: verify (o->verify), open the manifest and config, plan. usage: the error is the
   command line's (a budget below the minimum). */
k3_err k3_load_plan(const k3_load_opts *o, k3_loaded *l, int *usage, k3_diag *d);
/* Step 2: read the weights, make the model. */
k3_err k3_load_model(const k3_load_opts *o, k3_loaded *l, k3_diag *d);
void k3_loaded_free(k3_loaded *l);

#endif

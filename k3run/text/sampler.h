/*
 * sampler.h - choosing the next token from the logits: greedy at temperature
 * 0, otherwise repetition penalty, temperature, top-k, top-p, min-p and a
 * draw from a seeded PRNG. Deterministic on every machine: the PRNG is
 * specified here (PCG32 XSH-RR), probabilities use k3_expf and double sums in
 * a fixed order, and ties are broken by the lower id.
 */
#ifndef K3_SAMPLER_H
#define K3_SAMPLER_H

#include <stdint.h>

#include "k3_error.h"

typedef struct k3_sampler_opts {
    float temp;              /* 0 = greedy */
    uint32_t top_k;          /* 0 = off */
    float top_p;             /* 1 = off; in (0, 1] */
    float min_p;             /* 0 = off; in [0, 1) */
    float repeat_penalty;    /* 1 = off; > 0 */
    uint64_t seed;
} k3_sampler_opts;

typedef struct k3_sampler {
    k3_sampler_opts o;
    uint64_t state, inc;     /* PCG32 */
    uint32_t n;              /* vocabulary */
    float *val;              /* [n] working logits */
    int32_t *order;          /* [n] candidate ids */
    uint8_t *seen;           /* [n] ids already in the context (repetition penalty) */
} k3_sampler;

/* Check option ranges (usage errors name the option). */
k3_err k3_sampler_check(const k3_sampler_opts *o, k3_diag *d);
k3_err k3_sampler_init(k3_sampler *s, const k3_sampler_opts *o, uint32_t vocab, k3_diag *d);
void k3_sampler_free(k3_sampler *s);
/* New options and the PRNG seeded afresh from o->seed, as k3_sampler_init would; the context
   (the repetition penalty's ids) is kept. */
k3_err k3_sampler_reset(k3_sampler *s, const k3_sampler_opts *o, k3_diag *d);
/* Record a token of the context (prompt or generated) for the repetition penalty. */
void k3_sampler_accept(k3_sampler *s, int32_t id);
/* Forget the context (the repetition penalty's ids), keeping the PRNG: a rewound sequence
   accepts its tokens again. */
void k3_sampler_forget(k3_sampler *s);
/* Choose the next token from logits [vocab]. */
int32_t k3_sampler_next(k3_sampler *s, const float *logits);
/* The PRNG, PCG32 XSH-RR with pcg32_srandom_r's seeding (k3_sampler_init uses
   initstate = 0x853c49e6748fea9b ^ seed, initseq = seed). Exposed for tests. */
void k3_sampler_seed(k3_sampler *s, uint64_t initstate, uint64_t initseq);
uint32_t k3_sampler_u32(k3_sampler *s);
/* Uniform double in [0, 1) from 53 random bits (two draws). */
double k3_sampler_uniform(k3_sampler *s);

#endif

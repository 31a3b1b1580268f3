/*
 * perplexity.h - the quality meter: perplexity of a token sequence with
 * llama.cpp's llama-perplexity rules. The ids are cut into floor(n / C)
 * chunks of C = context tokens (at most max_chunks); each chunk runs from an
 * empty state, and only its second half is scored: the logits at positions
 * C/2 .. C-2 predict the tokens at C/2+1 .. C-1 (C - 1 - C/2 per chunk).
 * Per token: log-softmax with the max over the fp32 logits and the sum of
 * exp in double; nll and nll^2 summed in double in position order. PPL =
 * exp(mean nll), its standard error PPL * sqrt(var(nll) / (n - 1)).
 *
 * The model must compute every token's logits (k3_model_opts.all_logits)
 * and hold C positions. Its logits are the same bits at every budget, thread
 * count, ISA and batch size, so the result is too.
 */
#ifndef K3_PERPLEXITY_H
#define K3_PERPLEXITY_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine.h"

typedef struct k3_ppl_result {
    double ppl, ppl_stderr, nll;  /* exp(mean nll), its standard error, mean nll (nats) */
    uint32_t context, chunks;     /* chunk length; chunks scored */
    uint64_t tokens_scored;
    double *running;              /* [chunks]: PPL over chunks 0..i (caller's buffer, >= max chunks) */
    double seconds;
    int interrupted;              /* *stop became nonzero: chunks are the ones finished */
} k3_ppl_result;

/* Chunks a run over n ids would score (0: fewer than 2 x context ids). */
uint32_t k3_ppl_chunks(size_t n, uint32_t context, uint32_t max_chunks);

/*
 * KL divergence against a base model (llama-perplexity's --kl-divergence-base / --kl-divergence):
 * a run with `save` writes every scored row's fp32 logits to a base file; a run with `base` reads
 * them back row by row and measures, per scored token, KL(base || this) of the two next-token
 * distributions (softmax in double) and whether their top tokens agree. A base file:
 *   "K3LOGIT1", u32 vocab, u32 context, u32 chunks, u32 0, u64 XXH3-64 of the chunks' ids
 *   (chunks x context i32), then chunks x (context - 1 - context / 2) rows of vocab f32;
 * one of another text, vocabulary, context or chunk count is refused.
 */
typedef struct k3_ppl_kl {
    FILE *save, *base;            /* either, both or neither */
    const char *save_name, *base_name;
    double kl_mean, kl_stderr, kl_p99, kl_max;   /* nats, over the rows compared */
    double top1;                  /* the share of rows whose top tokens agree */
    uint64_t rows;
} k3_ppl_kl;

/* progress: the running value after each chunk ("[i]PPL,"), or NULL. kl: NULL, or what to save
   and compare (above). */
k3_err k3_perplexity(k3_model *m, const int32_t *ids, size_t n, uint32_t context, uint32_t max_chunks,
                     FILE *progress, volatile sig_atomic_t *stop, k3_ppl_kl *kl, k3_ppl_result *r, k3_diag *d);

/* What the report says besides the result. */
typedef struct k3_ppl_info {
    uint64_t tokens;              /* the file's tokens */
    double load_seconds;
    uint64_t bytes_read, budget;
    const char *isa;
    uint32_t threads;
    const char *trunk;            /* "exact" or "q8 (inexact)" */
} k3_ppl_info;

/* "Final estimate: PPL = X +/- Y" (llama-perplexity's line), or with json one document:
   ppl, ppl_stderr, nll, context, chunks, tokens, tokens_scored, running, seconds, ... */
void k3_ppl_print(const k3_ppl_result *r, const k3_ppl_info *info, const k3_ppl_kl *kl, int json, FILE *out);

#endif

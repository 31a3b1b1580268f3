/*
 * batch.h - passes shared between threads: continuous batching over the
 * model's sequences (model.h "Sequences").
 *
 * Each conversation runs in a thread of its own with its own sequence handle
 * and the code it would run alone (the decoder, the chat, drafts and all).
 * Once a batcher is made, the handles' forward, verify and commit calls do
 * not run a pass: they wait in the batcher. The engine thread (the one that
 * calls k3_batcher_run) runs a pass when every attached handle is waiting in
 * one: each sequence's rows become one group of the pass, so the trunk and
 * each expert are read once for all of them. A commit is a memory operation,
 * run between passes. A thread attaches its handle while it works on a
 * conversation and detaches when it is done (or idle), so nobody waits for a
 * conversation that is not moving.
 *
 * Rows per pass are capped (the rows given to k3_batcher_new, at most the
 * model's batch): verify passes go whole, then the forward calls fewest
 * tokens first, so every decode row rides in the next pass; a long prompt
 * takes what is left and goes on in the next passes (a prompt fed in pieces
 * gives the same bits, model.h). So a conversation waits at most one pass of
 * `rows` tokens for its next token whatever arrives.
 *
 * The bits: a row's values do not depend on the other rows of its pass
 * (model.h), so every sequence gets what it would get alone.
 */
#ifndef K3_BATCH_H
#define K3_BATCH_H

#include <stdint.h>

#include "k3_error.h"
#include "model.h"

typedef struct k3_batcher k3_batcher;

typedef struct k3_batch_stats {
    uint64_t passes;              /* passes run */
    uint64_t rows;                /* rows (tokens) in them */
    uint64_t groups;              /* sequences in them, summed over passes */
    uint64_t commits;
    uint64_t splits;              /* forward calls carried over to a later pass (the rows were full) */
    uint64_t shared_verify;       /* passes that carried a verify call (drafts) beside another sequence */
} k3_batch_stats;

/* A batcher over every sequence of m (each handle's calls go through it from now on), at most
   `rows` rows per pass (0: the model's batch). m must not have been made with all_logits. */
k3_err k3_batcher_new(k3_model *m, uint32_t rows, k3_batcher **out, k3_diag *d);
/* Handles call directly again. No thread may be in a call. */
void k3_batcher_free(k3_batcher *b);

/* A thread starts (attach) or stops (detach) moving its sequence: a pass waits for every attached
   handle to be in a call. */
void k3_batcher_attach(k3_batcher *b, k3_model *h);
void k3_batcher_detach(k3_batcher *b, k3_model *h);

/* The engine thread: run passes until k3_batcher_stop (then return once no call is waiting). */
void k3_batcher_run(k3_batcher *b);
void k3_batcher_stop(k3_batcher *b);

void k3_batcher_stats(k3_batcher *b, k3_batch_stats *s);

#endif

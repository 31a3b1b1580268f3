/*
 * decode.h - the decoding loop's one step, with exact speculative decoding.
 *
 * k3_dec_next returns the next token of the sequence: exactly the token
 * plain decoding (sample from the last logits, accept it, feed it) would
 * return, with the sampler's random numbers drawn in the same order. The
 * difference is only in how the model gets there. Plain decoding feeds each
 * token alone. With drafting on, the token to feed goes into one verify pass
 * together with up to K tokens drafted from the sequence itself (draft.h:
 * the longest recent n-gram that occurred before proposes what followed it);
 * the next tokens are then sampled from that pass's logits rows one by one,
 * lazily, as the caller asks for them, for as long as each equals the draft
 * that was fed after it. The first mismatch (or the row after the last
 * draft) is the model's own token; the pass is committed to the tokens that
 * matched (model.h "Verify": a memory operation, no weight read again).
 *
 * The caller feeds nothing itself: it asks for tokens and says when it is
 * done. The model's state between calls is always that of plain decoding,
 * up to the lazily sampled rows: k3_dec_settle brings it to "every returned
 * token processed" (before feeding forced tokens), k3_dec_finish to "every
 * returned token but the last processed" (the end of an answer, as plain
 * decoding leaves it).
 *
 * How many tokens to draft: where the sequence offers a continuation, the
 * draft length K maximises the expected tokens per pass over the pass's
 * cost, E(K) / cost(1 + K). E(K) = 1 + a + a^2 + ... + a^K with a the
 * acceptance rate measured so far for drafts from matches of the same
 * length (Laplace's rule: (accepted + 1) / (tested + 2)), learnt from every
 * lookup: each drafted token the pass reached, and the proposal's first
 * token that was not drafted (at K = 0 its first), compared with the token
 * the pass gave in its place, at no cost. So the rule learns where it does
 * not draft: from a = 1/2 with rho > 1/2 it would never start. cost(T) / cost(1)
 * = 1 + (T - 1) rho, rho what a token adds to a pass over what a one-token
 * pass costs, from the plan's figures (k3_dec_rho: the bytes and compute a
 * token adds, its experts and its share of the arithmetic, over a pass's
 * trunk and experts; disk bytes weighted against memory bytes). It depends
 * on the tokens and the plan only, never on the clock: the same run drafts
 * the same, so its passes, reads and cache counters are reproducible too.
 */
#ifndef K3_DECODE_H
#define K3_DECODE_H

#include <stdint.h>

#include "engine.h"
#include "text.h"

#define K3_DRAFT_MAX 16            /* --draft at most */
#define K3_DRAFT_NGRAM_MAX 4       /* longest n-gram looked up */
#define K3_DRAFT_CLASSES K3_DRAFT_NGRAM_MAX   /* acceptance kept per match length 1..4+ */

typedef struct k3_dec_stats {
    uint64_t passes;               /* forward passes whose logits gave the returned tokens (the prompt's
                                      last included): tokens / passes is 1 for plain decoding */
    uint64_t verify_passes;        /* of them, passes with drafted tokens */
    uint64_t drafted;              /* drafted tokens fed to the model */
    uint64_t accepted;             /* of them, equal to the model's own token */
    uint64_t tokens;               /* tokens returned */
    uint64_t kept[K3_DRAFT_MAX + 1];   /* verify passes that kept j drafted tokens (j < K: rolled back
                                          at offset j) */
} k3_dec_stats;

/* What the draft-length rule has learnt; it outlives a decoder (a chat keeps it across turns). */
typedef struct k3_dec_learn {
    double rho_plan;               /* rho from the plan (k3_dec_rho) */
    uint64_t tested[K3_DRAFT_CLASSES], acc[K3_DRAFT_CLASSES];   /* proposed tokens tested / right: the
                                      drafts verified, and the proposal's first token not drafted */
} k3_dec_learn;

typedef struct k3_decoder {
    k3_model *m;
    k3_sampler *s;
    int32_t *hist;                 /* [cap] the sequence: processed tokens, then any returned unfed one */
    uint32_t n, cap;
    uint32_t max_draft;            /* 0: plain decoding */
    k3_dec_learn *learn;
    enum { K3_DEC_READY, K3_DEC_PENDING, K3_DEC_OPEN } st;
    /* an open verify pass: batch[0] the fed token, batch[1..T) the drafts; `cur` rows sampled */
    int32_t batch[K3_DRAFT_MAX + 1];
    uint32_t T, cur, cls;          /* cls: the match class of the pass's lookup */
    int32_t next;                  /* the proposal's token after the drafts (not fed), if has_next: */
    int has_next;                  /* compared with the token the pass gives after them (decode.c) */
    int test;                      /* K3_DRAFT_TEST (decode.c): 1 full drafts, 2 spoiled ones */
    const int32_t *oracle;         /* [n_oracle] a test's drafts: the ids after the prompt */
    uint32_t n_oracle;
    k3_dec_stats stats;
} k3_decoder;

/*
 * A decoder over hist[0 .. n) (the sequence so far, every token processed: the model's
 * position is n and its logits are the last token's; hist has room for cap tokens, at least
 * the model's context + 1). max_draft: 0 = plain decoding, else at most that many drafted
 * tokens per pass (<= the model's max_verify - 1; clamped to it). learn: the rule's state,
 * {.rho_plan = k3_dec_rho(...)} at first.
 */
void k3_dec_init(k3_decoder *dc, k3_model *m, k3_sampler *s, int32_t *hist, uint32_t n, uint32_t cap,
                 uint32_t max_draft, k3_dec_learn *learn);
/* The next token into *id. want: tokens the caller may still ask for, this one included (a
   pass drafts no further). K3_ERR_USAGE when the context is full. */
k3_err k3_dec_next(k3_decoder *dc, uint32_t want, int32_t *id, k3_diag *d);
/* Process every returned token (the model then holds hist[0 .. n), logits of the last). */
k3_err k3_dec_settle(k3_decoder *dc, k3_diag *d);
/* Process every returned token but the last (plain decoding's state at the end of an answer). */
k3_err k3_dec_finish(k3_decoder *dc, k3_diag *d);
/* The caller processed tokens itself (forced ids): the sequence is hist[0 .. n), all processed. */
void k3_dec_fed(k3_decoder *dc, uint32_t n);
/* Tokens processed in plain decoding's state: n - 1 with a returned token unfed, else n. */
uint32_t k3_dec_pos(const k3_decoder *dc);
/* rho from the plan: the bytes one more token adds to a pass (its experts not in the cache,
   its share of compute) over the bytes of a one-token pass (the trunk, its experts). */
double k3_dec_rho(const k3_plan *p, const k3_geometry *g);

#endif

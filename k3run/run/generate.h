/*
 * generate.h - the generation loop: prefill the prompt in batches, then
 * sample, stream and feed back one token at a time (or verify drafts: the
 * same tokens, decode.h); stop at N tokens, at the
 * config's end-of-message token, or when *stop becomes nonzero (Ctrl-C).
 */
#ifndef K3_GENERATE_H
#define K3_GENERATE_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "decode.h"
#include "engine.h"
#include "text.h"

/* Streams token bytes: a multi-byte UTF-8 character split across tokens is
   written once complete; bytes that can never become valid UTF-8 are written
   as they are. The concatenation of everything written equals the tokens' bytes. */
typedef struct k3_utf8_out {
    FILE *f;
    uint8_t pend[4];          /* an incomplete, still-valid UTF-8 sequence */
    int np;
    uint64_t written;
} k3_utf8_out;
void k3_utf8_out_put(k3_utf8_out *o, const uint8_t *b, size_t n);
void k3_utf8_out_flush(k3_utf8_out *o);

typedef struct k3_gen_opts {
    uint32_t n_predict;       /* tokens to generate at most */
    int print_ids;            /* write generated ids (one line) instead of text */
    int64_t eos;              /* stop token (not printed as text), -1 = none */
    k3_sampler_opts sampler;
    uint32_t max_draft;       /* speculative decoding: drafted tokens per pass at most (0: off; decode.h) */
    double rho;               /* the draft-length rule's first rho (k3_dec_rho) */
    void (*on_step)(void *ctx, int64_t index);   /* after the prompt (-1) and each token (or NULL) */
    void *step_ctx;
} k3_gen_opts;

typedef struct k3_gen_stats {
    uint32_t n_prompt, n_gen;
    double t_prompt, t_gen;   /* seconds: prefill (to the first token's logits), the rest */
    double *t_tok;            /* [n_predict] seconds of each generated token (caller's buffer or NULL) */
    int stopped_eos, interrupted;
    k3_dec_stats dec;         /* passes, drafted and accepted tokens */
} k3_gen_stats;

/* out: text or ids; gen: [n_predict] generated ids (caller's buffer). */
k3_err k3_generate(k3_model *m, const k3_tok *tok, const int32_t *prompt, uint32_t n_prompt,
                   const k3_gen_opts *o, FILE *out, volatile sig_atomic_t *stop, int32_t *gen,
                   k3_gen_stats *st, k3_diag *d);

#endif

/*
 * run_pack.h - one run of k3run over a pack, from the prompt to the report:
 * read and tokenize the prompt and check it against the context (before any
 * weight is read), optionally k3verify the pack, plan the memory, load the
 * weights, generate (text or ids on stdout, Ctrl-C stops with the text so
 * far) or score the text's perplexity (--perplexity), write the --dump, and
 * print the statistics or the --json document.
 * The options come checked from the command line (main.c).
 */
#ifndef K3_RUN_PACK_H
#define K3_RUN_PACK_H

#include <stdint.h>

#include "engine.h"
#include "text.h"

typedef struct k3_run_opts {
    const char *pack;              /* the pack directory (it exists) */
    int have_tokenizer;            /* 0: the pack has none; the prompt is ids and the output ids */
    /* the prompt: ids (--prompt-ids), else the text of -p, else of -f FILE, else stdin */
    const int32_t *prompt_ids;     /* [n_prompt_ids], or NULL */
    uint32_t n_prompt_ids;
    const char *prompt_text;       /* -p, or NULL */
    const char *prompt_file;       /* -f, or NULL */
    const char *prompt_source;     /* for messages: "--prompt-ids", "-p", "-f 'FILE'" or "stdin" */
    int perplexity;                /* score prompt_file (perplexity.h) instead of generating */
    uint32_t ppl_chunks;           /* at most this many chunks (0: all) */
    const char *save_logits;       /* --save-logits FILE: the scored rows' logits, a KL base (or NULL) */
    const char *kl_base;           /* --kl-divergence FILE: compare with that base (or NULL) */
    int special;                   /* special-token text in the prompt becomes its id */
    uint32_t n_predict, threads, context, batch;   /* batch: K3_BATCH_AUTO (-b auto) or tokens per pass */
    uint32_t draft;                /* speculative decoding: drafted tokens per pass at most (0: off) */
    k3_sampler_opts sampler;
    k3_isa isa;
    uint64_t budget;               /* bytes; 0: what the machine allows, less a margin */
    int verify;                    /* run k3verify on the pack first */
    int verify_reads;              /* check every tensor's and record's XXH3-64 as it is read */
    int json, stats, print_ids;
    const char *dump_path;         /* --dump FILE, or NULL */
} k3_run_opts;

typedef struct k3_run_result {
    int usage;                     /* the error is the command line's (a prompt or budget refused before
                                      loading): the CLI adds its "Try --help" line */
    int interrupted;               /* Ctrl-C stopped the generation (the text so far was written) */
} k3_run_result;

k3_err k3_run_pack(const k3_run_opts *o, k3_run_result *r, k3_diag *d);

#endif

/*
 * cli_args.h - the command-line pieces k3run's front ends share (main.c's
 * generation, `k3run chat`): checked numeric options, the budget, the pack
 * directory and its tokenizer. Each returns 0, or an exit status after
 * printing the usage error.
 */
#ifndef K3_CLI_ARGS_H
#define K3_CLI_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include "k3_error.h"
#include "k3_opts.h"

/* --version of k3run and its subcommands: the version and commit, the kernels' paths (and this CPU's),
   MPI, and extra (a line, or NULL). */
void k3_cli_version(const char *extra);

int k3_cli_u32(const k3_args *a, int id, uint64_t def, uint64_t lo, uint64_t hi, const char *name, uint32_t *out);
/* -b, --batch auto|N: *out K3_BATCH_AUTO (the default: plan.h chooses) or N in 1..K3_BATCH_MAX. */
int k3_cli_batch(const k3_args *a, int id, uint32_t *out);
int k3_cli_float(const k3_args *a, int id, float def, const char *name, float *out);
/* --budget SIZE / --preset NAME (0: what the machine allows). */
int k3_cli_budget(const k3_args *a, int budget_id, int preset_id, uint64_t *out);
/* -m names a directory that exists (else: the pack does not exist, exit 3). */
k3_err k3_cli_check_pack(const char *pack, k3_diag *d);
/*
 * The sampling defaults of `k3run chat` and `k3run serve` (a request's or an option's own values
 * win): the pack's generation_config.json (Hugging Face's convention) when it has one, else
 * K3_CHAT_TEMP / K3_CHAT_TOP_P, what Moonshot runs its recent thinking models at. Of the file,
 * temperature, top_p, top_k, min_p and repetition_penalty are read, the values it gives and nothing
 * else (as vLLM reads it: transformers' own defaults such as top_k 50 are not added);
 * "do_sample": false means greedy, as in transformers. *from: where they came from, for --help and
 * the log ("generation_config.json", or "k3" when the pack has none or it gives no sampling field).
 * A file that is not JSON, or a field of the wrong type or out of range, is an error naming the
 * file and the field: the exit status (1), else 0.
 */
#define K3_CHAT_TEMP 1.0f
#define K3_CHAT_TOP_P 0.95f
struct k3_sampler_opts;
int k3_cli_gen_defaults(const char *pack, struct k3_sampler_opts *so, const char **from);   /* pack NULL: k3's */
/* Whether the pack has a tokenizer (its tiktoken.model exists); *path: where it would be. */
int k3_cli_has_tokenizer(const char *pack, char *path, size_t cap);

/*
 * The generation options `k3run chat` and `k3run serve` share, each front end with its own option
 * ids (ids): -n, --think-budget, -t, -c, -b,
 * --snapshots, --draft, the sampling defaults (--top-k, --temp, --top-p, --min-p, --repeat-penalty,
 * --seed; unset ones from the pack's generation_config.json, k3_cli_gen_defaults), --budget /
 * --preset, --verify, --no-verify-reads. Into g and lo (context, batch, snapshots, budget, isa from
 * K3_ISA, pack, verify, verify_reads, spec_tokens, generate_tokens); the OpenMP threads are set; then
 * the pack must exist and have a tokenizer ("chat needs one": needs names the front end). Returns
 * 0 or the exit status after printing the error.
 */
typedef struct k3_cli_gen_ids {
    int n, think_budget, threads, context, batch, snapshots, draft;
    int topk, temp, topp, minp, repeat, seed, budget, preset, verify, no_verify_reads;
} k3_cli_gen_ids;
struct k3_load_opts;
typedef struct k3_cli_gen {
    uint32_t n_predict, think_budget, threads;
    struct k3_sampler_opts *so;      /* filled (the caller's) */
    const char *so_from;             /* where the sampling defaults came from (k3_cli_gen_defaults) */
} k3_cli_gen;
int k3_cli_gen_parse(const k3_args *a, const k3_cli_gen_ids *ids, const char *pack, const char *needs, k3_cli_gen *g,
                     struct k3_load_opts *lo);

#endif

/*
 * k3run - generate text from a k3 pack: the command line over the rooms
 * (run.h: the generation loop; text.h: tokenizer and sampler; engine.h:
 * pack, plan, weights and model; README "Layout").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "decode.h"
#include "dist.h"
#include "engine.h"
#include "k3_error.h"
#include "k3_file.h"
#include "k3_log.h"
#include "k3_opts.h"
#include "k3_sys.h"
#include "chat_json.h"
#include "chat_render.h"
#include "serve_cli.h"
#include "cli.h"
#include "cli_args.h"
#include "run.h"
#include "text.h"

enum {
    OPT_MODEL = K3_OPT_USER, OPT_PROMPT, OPT_FILE, OPT_N, OPT_TEMP, OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_REPEAT,
    OPT_SEED, OPT_THREADS, OPT_SPECIAL, OPT_STATS, OPT_JSON, OPT_TOKENIZE, OPT_DETOKENIZE, OPT_TOKENIZER,
    OPT_PROMPT_IDS, OPT_PRINT_IDS, OPT_NO_VERIFY_READS, OPT_VERIFY, OPT_CONTEXT, OPT_BATCH, OPT_DUMP, OPT_BUDGET,
    OPT_PRESET, OPT_PERPLEXITY, OPT_CHUNKS, OPT_RENDER_CHAT, OPT_DRAFT, OPT_SAVE_LOGITS, OPT_KL
};

static const k3_opt opts[] = {
    {OPT_MODEL, 'm', "model", "PACK", NULL, "K3_MODEL", "the pack directory (made by k3pack)"},
    {OPT_PROMPT, 'p', "prompt", "TEXT", NULL, NULL, "the prompt (else -f, --prompt-ids, or stdin)"},
    {OPT_FILE, 'f', "file", "FILE", NULL, NULL, "read the prompt from FILE (bytes as they are)"},
    {OPT_PROMPT_IDS, 0, "prompt-ids", "IDS", NULL, NULL, "the prompt as token ids: 1,2,3"},
    {OPT_N, 'n', "n-predict", "N", "128", NULL, "generate at most N tokens (stops earlier at end-of-message)"},
    {OPT_TEMP, 0, "temp", "T", "0 (greedy)", NULL, "sampling temperature; 0 picks the most likely token"},
    {OPT_TOPK, 0, "top-k", "K", "0 (off)", NULL, "sample among the K most likely tokens"},
    {OPT_TOPP, 0, "top-p", "P", "1 (off)", NULL, "sample among the smallest set of tokens with mass >= P, in (0, 1]"},
    {OPT_MINP, 0, "min-p", "P", "0 (off)", NULL, "drop tokens less likely than P times the most likely, in [0, 1)"},
    {OPT_REPEAT, 0, "repeat-penalty", "R", "1 (off)", NULL,
     "divide positive (multiply negative) logits of tokens already in the context by R"},
    {OPT_SEED, 's', "seed", "S", "0", NULL, "seed of the sampler's PRNG (PCG32): same seed, same text"},
    {OPT_THREADS, 't', "threads", "N", "all CPUs", "K3_THREADS", "compute threads"},
    {OPT_CONTEXT, 'c', "context", "N", "4096", NULL, "positions the attention cache holds (prompt + generated)"},
    {OPT_BATCH, 'b', "batch", "auto|N", "auto", NULL,
     "prompt tokens per forward pass (each weight read once per batch); auto: the planner chooses the batch that "
     "reads the least for this prompt and -n within the budget"},
    {OPT_BUDGET, 'B', "budget", "SIZE", "what the machine allows", "K3_BUDGET",
     "memory to use (8G, 512M, ...): the trunk, buffers and an expert cache of the rest"},
    {OPT_DRAFT, 0, "draft", "N", K3_DRAFT_DEFAULT_STR, NULL,
     "speculative decoding: verify up to N tokens drafted from the text itself per pass (0: off); "
     "the output is the same"},
    {OPT_PRESET, 0, "preset", "NAME", NULL, NULL, "a named budget: laptop (8G), workstation (128G), server (224G)"},
    {OPT_SPECIAL, 0, "special", NULL, NULL, NULL, "recognise special-token text (<|open|> ...) in the prompt"},
    {OPT_PRINT_IDS, 0, "print-ids", NULL, NULL, NULL, "print the generated ids (one line) instead of text"},
    {OPT_STATS, 0, "stats", NULL, NULL, NULL, "timings, memory and bytes per token on stderr"},
    {OPT_JSON, 'j', "json", NULL, NULL, NULL, "one JSON document on stdout (text, ids, stats) instead of text"},
    {OPT_TOKENIZE, 0, "tokenize", "TEXT", NULL, NULL, "print TEXT's token ids (space-separated) and exit"},
    {OPT_DETOKENIZE, 0, "detokenize", "IDS", NULL, NULL, "print the bytes of token ids (1,2,3 or '1 2 3') and exit"},
    {OPT_RENDER_CHAT, 0, "render-chat", "FILE", NULL, NULL,
     "render a chat request (OpenAI JSON; - for stdin) into K3's prompt ids, print them and exit (--json: pieces)"},
    {OPT_TOKENIZER, 0, "tokenizer", "DIR", NULL, NULL,
     "tokenizer files (tiktoken.model, tokenizer_config.json) for --tokenize/--detokenize/--render-chat "
     "without a model"},
    {OPT_NO_VERIFY_READS, 0, "no-verify-reads", NULL, NULL, NULL, "do not check each tensor's XXH3-64 as it is read"},
    {OPT_VERIFY, 0, "verify", NULL, NULL, NULL, "run k3verify's full check of the pack before loading it"},
    {OPT_DUMP, 0, "dump", "FILE", NULL, NULL, "write every processed position's intermediates (safetensors; tests)"},
    {OPT_PERPLEXITY, 0, "perplexity", "FILE", NULL, NULL,
     "score FILE instead of generating: PPL over chunks of --context tokens, second halves (llama-perplexity)"},
    {OPT_CHUNKS, 0, "chunks", "N", "all", NULL, "with --perplexity: score at most N chunks"},
    {OPT_SAVE_LOGITS, 0, "save-logits", "FILE", NULL, NULL,
     "with --perplexity: write the scored tokens' logits to FILE, the base of a later --kl-divergence"},
    {OPT_KL, 0, "kl-divergence", "FILE", NULL, NULL,
     "with --perplexity: KL divergence from the base FILE's distributions and top-token agreement "
     "(llama-perplexity --kl-divergence)"},
    K3_OPTS_COMMON,
};
#define N_OPTS ((int)(sizeof opts / sizeof opts[0]))

static const char purpose[] =
    "Generate text from a k3 pack with Kimi K3 (or a model of its family), on the CPU.\n"
    "The generated text is written to stdout as it is produced (the prompt is not\n"
    "echoed); statistics and messages go to stderr. Generation stops after N tokens\n"
    "or at the model's end-of-message token. Ctrl-C stops with the text so far.\n"
    "\n"
    "k3run computes in fp32 on the pack's exact weights; greedy output and seeded\n"
    "sampling give the same bytes on every machine, thread count, ISA and batch size.\n"
    "K3_ISA=scalar|avx2|avx512 forces the matrix kernels' path (default: the best\n"
    "this CPU has).";

static const char footer[] =
    "Examples:\n"
    "  k3run -m ~/packs/k3 -p 'The quick brown fox' -n 64\n"
    "  k3run -m ~/packs/k3 --temp 0.7 --top-p 0.9 --seed 7 -f prompt.txt\n"
    "  k3run --tokenizer ~/models/Kimi-K3 --tokenize 'Hello world'\n"
    "  k3run --tokenizer ~/models/Kimi-K3 --render-chat request.json --json   # docs/k3run-chat-format.md\n"
    "  k3run -m ~/packs/k3 --perplexity heldout.txt --context 512      # PPL = X +/- Y\n"
    "  k3run -m ~/packs/k3 --perplexity heldout.txt --save-logits base.logits\n"
    "  k3run -m ~/packs/k3-q8 --perplexity heldout.txt --kl-divergence base.logits   # KL, same top token\n"
    "\n"
    "Subcommands (each with its own --help):\n"
    "  k3run chat -m PACK                          a conversation in the terminal\n"
    "  k3run serve -m PACK [--parallel S]          the OpenAI API over HTTP, S answers sharing each pass\n"
    "  k3run batch -m PACK IN.jsonl -o OUT.jsonl   a file of Batch API requests (--parallel S)\n"
    "\n"
    "Interrupted by Ctrl-C, k3run prints the text so far and exits with 130.\n";

static int fail(k3_err e, const k3_diag *d)
{
    k3_error("%s", d->msg);
    return k3_exit_code(e);
}

/* `need` (an option or the prompt's source) cannot work without the tokenizer at `path`. */
static int no_tokenizer(const char *need, const char *path, const char *instead)
{
    return k3_usage_error("the pack has no tokenizer ('%s' does not exist) and %s needs one: %s, or copy the "
                          "checkpoint's tiktoken.model and tokenizer_config.json into the pack", path, need, instead);
}

/* "1,2,3" or "1 2 3" -> ids (malloc'd). */
static k3_err parse_ids(const char *s, int32_t **out, uint32_t *n, k3_diag *d)
{
    size_t cap = strlen(s) / 2 + 1;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    uint32_t k = 0;
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) {
            free(v);
            return k3_fail(d, K3_ERR_USAGE, "bad token id list at '%.20s': ids are integers >= 0", p);
        }
        v[k++] = (int32_t)x;
        p = end;
    }
    *out = v;
    *n = k;
    return K3_OK;
}

static int tokenize_cmd(const k3_tok *tok, const char *text, int special)
{
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    k3_diag d;
    k3_err e = k3_tok_encode(tok, text, strlen(text), special, &ids, &n, &cap, &d);
    if (e) { free(ids); return fail(e, &d); }
    for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", (int)ids[i]);
    printf("\n");
    free(ids);
    return K3_EXIT_OK;
}

static int detokenize_cmd(const k3_tok *tok, const char *list)
{
    int32_t *ids;
    uint32_t n;
    k3_diag d;
    k3_err e = parse_ids(list, &ids, &n, &d);
    if (e) return e == K3_ERR_USAGE ? k3_usage_error("%s", d.msg) : fail(e, &d);
    for (uint32_t i = 0; i < n; i++) {
        size_t len;
        const uint8_t *b = k3_tok_bytes(tok, ids[i], &len);
        if (!b) {
            int bad = (int)ids[i];
            free(ids);
            return k3_usage_error("token id %d is outside the vocabulary (0..%u)", bad, k3_tok_n_ids(tok) - 1);
        }
        fwrite(b, 1, len, stdout);
    }
    fflush(stdout);
    free(ids);
    return K3_EXIT_OK;
}

/* The whole of path (or stdin for "-") into a malloc'd buffer. */
static k3_err read_all(const char *path, char **out, size_t *len, k3_diag *d)
{
    int in = !strcmp(path, "-");
    FILE *f = in ? stdin : fopen(path, "rb");
    if (!f) return k3_fail(d, K3_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);                          /* [cap] the bytes read so far */
    for (size_t r; b && (r = fread(b + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) {
            char *nb = cap < ((size_t)1 << 31) ? realloc(b, cap *= 2) : NULL;
            if (!nb) { free(b); b = NULL; }
            b = nb;
        }
    }
    int bad = ferror(f);
    if (!in) fclose(f);
    if (!b) return k3_fail(d, K3_ERR_NOMEM, "'%s': out of memory (or larger than 2 GiB)", path);
    if (bad) { free(b); return k3_fail(d, K3_ERR_IO, "cannot read '%s'", in ? "stdin" : path); }
    *out = b;
    *len = n;
    return K3_OK;
}

/* --render-chat FILE: the prompt's ids on one line, or (--json) its pieces. */
static int render_chat_cmd(const k3_tok *tok, const char *path, int json)
{
    char *text = NULL;
    size_t len = 0;
    k3_diag d;
    k3_err e = read_all(path, &text, &len, &d);
    if (e) return fail(e, &d);
    k3_chat_prompt p;
    e = k3_chat_render(tok, text, len, strcmp(path, "-") ? path : "stdin", &p, &d);
    free(text);
    if (e) return fail(e, &d);
    if (!json) {
        for (size_t i = 0; i < p.n_ids; i++) printf(i ? " %d" : "%d", (int)p.ids[i]);
        printf("\n");
    } else {
        k3cj_buf b = {0};                            /* the document */
        char num[32];
        k3cj_buf_puts(&b, "{\"schema\": 1, \"ids\": [");
        for (size_t i = 0; i < p.n_ids; i++) {
            snprintf(num, sizeof num, i ? ", %d" : "%d", (int)p.ids[i]);
            k3cj_buf_puts(&b, num);
        }
        k3cj_buf_puts(&b, "], \"pieces\": [");
        for (size_t i = 0; i < p.n_pieces; i++) {
            const k3_chat_piece *pc = &p.pieces[i];
            if (i) k3cj_buf_puts(&b, ", ");
            if (pc->special >= 0) {
                size_t nl;
                const uint8_t *nm = k3_tok_bytes(tok, pc->special, &nl);
                k3cj_buf_puts(&b, "{\"special\": ");
                k3cj_dump_str(&b, (const char *)nm, nl);
                snprintf(num, sizeof num, ", \"id\": %d}", (int)pc->special);
                k3cj_buf_puts(&b, num);
                continue;
            }
            k3cj_buf_puts(&b, "{\"text\": ");
            k3cj_dump_str(&b, p.arena + pc->off, pc->len);
            k3cj_buf_puts(&b, ", \"ids\": [");
            for (uint32_t k = pc->id0; k < pc->id1; k++) {
                snprintf(num, sizeof num, k > pc->id0 ? ", %d" : "%d", (int)p.ids[k]);
                k3cj_buf_puts(&b, num);
            }
            k3cj_buf_puts(&b, "]}");
        }
        snprintf(num, sizeof num, "%zu", p.n_ids);
        k3cj_buf_puts(&b, "], \"thinking\": ");
        k3cj_buf_puts(&b, p.thinking ? "true" : "false");
        k3cj_buf_puts(&b, ", \"add_generation_prompt\": ");
        k3cj_buf_puts(&b, p.add_generation_prompt ? "true" : "false");
        k3cj_buf_puts(&b, ", \"n_ids\": ");
        k3cj_buf_puts(&b, num);
        k3cj_buf_puts(&b, "}\n");
        if (b.oom) { free(b.p); k3_chat_prompt_free(&p); return fail(k3_fail(&d, K3_ERR_NOMEM, "out of memory"), &d); }
        fwrite(b.p, 1, b.n, stdout);
        free(b.p);
    }
    k3_chat_prompt_free(&p);
    if (fflush(stdout) != 0) return fail(k3_fail(&d, K3_ERR_IO, "cannot write to stdout"), &d);
    return K3_EXIT_OK;
}


int main(int argc, char **argv)
{
    k3_log_init(argv[0]);
    {   /* under mpirun: one process per rank (dist.h); only rank 0 writes the output */
        k3_diag dd = {0};
        if (k3_dist_init(&argc, &argv, &dd)) {
            fprintf(stderr, "%s: %s\n", k3_log_prog(), dd.msg);
            return k3_exit_code(K3_ERR_USAGE);
        }
        atexit(k3_dist_finalize);
        if (k3_dist_rank() > 0 && k3_dist_quiet()) return K3_EXIT_IO;   /* rank 0 speaks for all */
    }
    /* subcommands; a usage error points to the subcommand's own --help */
    if (argc > 1 && !strcmp(argv[1], "chat")) {
        k3_opts_help_cmd("k3run chat");
        return k3_chat_main(argc - 1, argv + 1);
    }
    if (argc > 1 && !strcmp(argv[1], "serve")) {
        k3_opts_help_cmd("k3run serve");
        return k3_serve_main(argc - 1, argv + 1);
    }
    if (argc > 1 && !strcmp(argv[1], "batch")) {
        k3_opts_help_cmd("k3run batch");
        return k3_batch_main(argc - 1, argv + 1);
    }
    k3_args a;
    k3_diag d;
    if (k3_opts_parse(opts, N_OPTS, argc, argv, &a, &d)) return k3_usage_error("%s", d.msg);
    if (k3_opt_count(&a, K3_OPT_HELP)) {
        k3_opts_help(stdout, "k3run -m PACK (-p TEXT | -f FILE | --prompt-ids IDS | < FILE) [OPTIONS]", purpose,
                     opts, N_OPTS, footer);            /* it ends with the exit status table */
        return K3_EXIT_OK;
    }
    if (k3_opt_count(&a, K3_OPT_VERSION)) {
        k3_cli_version(k3_serve_tls_line());
        return K3_EXIT_OK;
    }
    if (a.n_pos) return k3_usage_error("unexpected argument '%s' (the pack is given with -m)", a.pos[0]);
    const char *pack = k3_opt_str(&a, OPT_MODEL), *tokdir = k3_opt_str(&a, OPT_TOKENIZER);
    int special = k3_opt_count(&a, OPT_SPECIAL) > 0;

    /* tokenizer-only modes */
    char tik[4096];                                   /* the pack's tiktoken.model */
    const char *chat = k3_opt_str(&a, OPT_RENDER_CHAT);
    if (k3_opt_str(&a, OPT_TOKENIZE) || k3_opt_str(&a, OPT_DETOKENIZE) || chat) {
        if (!!k3_opt_str(&a, OPT_TOKENIZE) + !!k3_opt_str(&a, OPT_DETOKENIZE) + !!chat > 1)
            return k3_usage_error("give one of --tokenize, --detokenize and --render-chat");
        if (!pack && !tokdir)
            return k3_usage_error("--tokenize/--detokenize/--render-chat need -m PACK or --tokenizer DIR");
        const char *mode = chat ? "--render-chat" : k3_opt_str(&a, OPT_TOKENIZE) ? "--tokenize" : "--detokenize";
        if (chat && special) return k3_usage_error("--render-chat takes no --special (its markers are ids already)");
        if (!tokdir) {
            if (k3_cli_check_pack(pack, &d)) return fail(K3_ERR_IO, &d);
            if (!k3_cli_has_tokenizer(pack, tik, sizeof tik))
                return no_tokenizer(mode, tik, "give --tokenizer DIR (a checkpoint's directory)");
        }
        k3_tok *tok;
        k3_err e = k3_tok_load_dir(tokdir ? tokdir : pack, &tok, &d);
        if (e) return fail(e, &d);
        int rc = chat ? render_chat_cmd(tok, chat, k3_opt_count(&a, OPT_JSON) > 0)
                 : k3_opt_str(&a, OPT_TOKENIZE) ? tokenize_cmd(tok, k3_opt_str(&a, OPT_TOKENIZE), special)
                                                : detokenize_cmd(tok, k3_opt_str(&a, OPT_DETOKENIZE));
        k3_tok_free(tok);
        return rc;
    }
    if (!pack) return k3_usage_error("no model: give the pack with -m PACK");
    int n_src = !!k3_opt_str(&a, OPT_PROMPT) + !!k3_opt_str(&a, OPT_FILE) + !!k3_opt_str(&a, OPT_PROMPT_IDS);
    if (n_src > 1) return k3_usage_error("give the prompt once: -p, -f or --prompt-ids");
    const char *ppl = k3_opt_str(&a, OPT_PERPLEXITY);
    if (ppl && n_src) return k3_usage_error("--perplexity scores its FILE: give no prompt (-p, -f, --prompt-ids)");
    if (!ppl && k3_opt_str(&a, OPT_CHUNKS)) return k3_usage_error("--chunks needs --perplexity FILE");
    if (!ppl && (k3_opt_str(&a, OPT_SAVE_LOGITS) || k3_opt_str(&a, OPT_KL)))
        return k3_usage_error("--save-logits and --kl-divergence need --perplexity FILE");
    int json = k3_opt_count(&a, OPT_JSON) > 0, stats = k3_opt_count(&a, OPT_STATS) > 0;
    int print_ids = k3_opt_count(&a, OPT_PRINT_IDS) > 0;

    uint32_t n_predict, threads, context, batch;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int rc;
    if ((rc = k3_cli_u32(&a, OPT_N, 128, 0, 1u << 30, "n-predict", &n_predict)) ||
        (rc = k3_cli_u32(&a, OPT_THREADS, ncpu > 0 ? (uint64_t)ncpu : 1, 1, 1024, "threads", &threads)) ||
        (rc = k3_cli_u32(&a, OPT_CONTEXT, 4096, 1, 1u << 24, "context", &context)) ||
        (rc = k3_cli_batch(&a, OPT_BATCH, &batch)))
        return rc;
    uint32_t draft;
    if ((rc = k3_cli_u32(&a, OPT_DRAFT, K3_DRAFT_DEFAULT, 0, K3_DRAFT_MAX, "draft", &draft))) return rc;
    uint32_t chunks;
    if ((rc = k3_cli_u32(&a, OPT_CHUNKS, 0, 0, UINT32_MAX, "chunks", &chunks))) return rc;
    if (k3_opt_str(&a, OPT_CHUNKS) && !chunks) return k3_usage_error("--chunks must be at least 1 (got 0)");
    if (ppl && !k3_opt_str(&a, OPT_CONTEXT)) context = 512;        /* llama-perplexity's default */
    k3_sampler_opts so = {0};
    uint32_t topk;
    uint64_t seed;
    if ((rc = k3_cli_float(&a, OPT_TEMP, 0.0f, "temp", &so.temp)) || (rc = k3_cli_float(&a, OPT_TOPP, 1.0f, "top-p", &so.top_p)) ||
        (rc = k3_cli_float(&a, OPT_MINP, 0.0f, "min-p", &so.min_p)) ||
        (rc = k3_cli_float(&a, OPT_REPEAT, 1.0f, "repeat-penalty", &so.repeat_penalty)) ||
        (rc = k3_cli_u32(&a, OPT_TOPK, 0, 0, UINT32_MAX, "top-k", &topk)))
        return rc;
    if (k3_opt_u64(&a, OPT_SEED, 0, 0, &seed, &d)) return k3_usage_error("%s", d.msg);
    so.top_k = topk;
    so.seed = seed;
    if (k3_sampler_check(&so, &d)) return k3_usage_error("%s", d.msg);
    k3_isa isa;
    if (k3_isa_choose(getenv("K3_ISA"), &isa, &d)) return k3_usage_error("K3_ISA: %s", d.msg);
    omp_set_num_threads((int)threads);

    /* the budget: a size, a preset, or (0) what the machine allows */
    uint64_t budget;
    if ((rc = k3_cli_budget(&a, OPT_BUDGET, OPT_PRESET, &budget))) return rc;

    /* the pack, and its tokenizer if the run needs text: before the prompt is read */
    if (k3_cli_check_pack(pack, &d)) return fail(K3_ERR_IO, &d);
    int have_tok = k3_cli_has_tokenizer(pack, tik, sizeof tik);
    if (!have_tok && ppl) return no_tokenizer("--perplexity", tik, "perplexity scores text");
    if (!have_tok && !k3_opt_str(&a, OPT_PROMPT_IDS))
        return no_tokenizer(k3_opt_str(&a, OPT_PROMPT) ? "the prompt from -p" : k3_opt_str(&a, OPT_FILE) ?
                            "the prompt from -f" : "the prompt from stdin", tik,
                            "give the prompt as token ids with --prompt-ids and print ids with --print-ids");
    if (!have_tok && json) return no_tokenizer("--json (its \"text\")", tik, "use --print-ids instead");
    if (!have_tok && !print_ids)
        return no_tokenizer("text output", tik, "add --print-ids to print the generated ids");

    /* the prompt's source; ids are parsed here, text is read and tokenized by the run */
    char psrc[4200];                                  /* where the prompt came from, for messages */
    if (k3_opt_str(&a, OPT_PROMPT_IDS)) snprintf(psrc, sizeof psrc, "--prompt-ids");
    else if (k3_opt_str(&a, OPT_PROMPT)) snprintf(psrc, sizeof psrc, "-p");
    else if (k3_opt_str(&a, OPT_FILE)) snprintf(psrc, sizeof psrc, "-f '%s'", k3_opt_str(&a, OPT_FILE));
    else if (ppl) snprintf(psrc, sizeof psrc, "--perplexity '%s'", ppl);
    else snprintf(psrc, sizeof psrc, "stdin");
    int32_t *ids = NULL;
    uint32_t n_ids = 0;
    k3_err e;
    if (k3_opt_str(&a, OPT_PROMPT_IDS) && (e = parse_ids(k3_opt_str(&a, OPT_PROMPT_IDS), &ids, &n_ids, &d)))
        return e == K3_ERR_USAGE ? k3_usage_error("--prompt-ids: %s", d.msg) : fail(e, &d);

    k3_run_opts ro = {.pack = pack, .have_tokenizer = have_tok, .prompt_ids = ids, .n_prompt_ids = n_ids,
                      .prompt_text = k3_opt_str(&a, OPT_PROMPT),
                      .prompt_file = ppl ? ppl : k3_opt_str(&a, OPT_FILE), .perplexity = ppl != NULL,
                      .ppl_chunks = chunks, .save_logits = k3_opt_str(&a, OPT_SAVE_LOGITS),
                      .kl_base = k3_opt_str(&a, OPT_KL),
                      .prompt_source = psrc, .special = special, .n_predict = n_predict, .threads = threads,
                      .context = context, .batch = batch, .draft = draft, .sampler = so, .isa = isa, .budget = budget,
                      .verify = k3_opt_count(&a, OPT_VERIFY) > 0,
                      .verify_reads = !k3_opt_count(&a, OPT_NO_VERIFY_READS), .json = json, .stats = stats,
                      .print_ids = print_ids, .dump_path = k3_opt_str(&a, OPT_DUMP)};
    k3_run_result rr;
    e = k3_run_pack(&ro, &rr, &d);
    free(ids);
    if (e) return rr.usage ? k3_usage_error("%s", d.msg) : fail(e, &d);
    return rr.interrupted ? 130 : K3_EXIT_OK;
}

/*
 * k3run - generate text from a k3 pack: the command line over the rooms
 * (run.h: the generation loop; text.h: tokenizer and sampler; engine.h:
 * pack, plan, weights and model; README "Layout").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "engine.h"
#include "k3_error.h"
#include "k3_file.h"
#include "k3_log.h"
#include "k3_opts.h"
#include "k3_progress.h"
#include "k3_sys.h"
#include "run.h"
#include "text.h"

enum {
    OPT_MODEL = K3_OPT_USER, OPT_PROMPT, OPT_FILE, OPT_N, OPT_TEMP, OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_REPEAT,
    OPT_SEED, OPT_THREADS, OPT_SPECIAL, OPT_STATS, OPT_JSON, OPT_TOKENIZE, OPT_DETOKENIZE, OPT_TOKENIZER,
    OPT_PROMPT_IDS, OPT_PRINT_IDS, OPT_NO_VERIFY_READS, OPT_VERIFY, OPT_CONTEXT, OPT_BATCH, OPT_DUMP, OPT_BUDGET,
    OPT_PRESET
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
    {OPT_BATCH, 'b', "batch", "N", "64", NULL, "prompt tokens per forward pass (each weight read once per batch)"},
    {OPT_BUDGET, 'B', "budget", "SIZE", "what the machine allows", "K3_BUDGET",
     "memory to use (8G, 512M, ...): the trunk, buffers and an expert cache of the rest"},
    {OPT_PRESET, 0, "preset", "NAME", NULL, NULL, "a named budget: laptop (8G), workstation (128G), server (224G)"},
    {OPT_SPECIAL, 0, "special", NULL, NULL, NULL, "recognise special-token text (<|open|> ...) in the prompt"},
    {OPT_PRINT_IDS, 0, "print-ids", NULL, NULL, NULL, "print the generated ids (one line) instead of text"},
    {OPT_STATS, 0, "stats", NULL, NULL, NULL, "timings, memory and bytes per token on stderr"},
    {OPT_JSON, 'j', "json", NULL, NULL, NULL, "one JSON document on stdout (text, ids, stats) instead of text"},
    {OPT_TOKENIZE, 0, "tokenize", "TEXT", NULL, NULL, "print TEXT's token ids (space-separated) and exit"},
    {OPT_DETOKENIZE, 0, "detokenize", "IDS", NULL, NULL, "print the bytes of token ids (1,2,3 or '1 2 3') and exit"},
    {OPT_TOKENIZER, 0, "tokenizer", "DIR", NULL, NULL,
     "tokenizer files (tiktoken.model, tokenizer_config.json) for --tokenize/--detokenize without a model"},
    {OPT_NO_VERIFY_READS, 0, "no-verify-reads", NULL, NULL, NULL, "do not check each tensor's XXH3-64 as it is read"},
    {OPT_VERIFY, 0, "verify", NULL, NULL, NULL, "run k3verify's full check of the pack before loading it"},
    {OPT_DUMP, 0, "dump", "FILE", NULL, NULL, "write every processed position's intermediates (safetensors; tests)"},
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
    "\n"
    "Interrupted by Ctrl-C, k3run prints the text so far and exits with 130.\n";

static volatile sig_atomic_t g_stop;
static void on_sigint(int sig) { (void)sig; g_stop = 1; }

static int fail(k3_err e, const k3_diag *d)
{
    k3_error("%s", d->msg);
    return k3_exit_code(e);
}

/* -m names a directory that exists (else: say the pack does not exist, not that a file in it
   cannot be opened). */
static k3_err check_pack(const char *pack, k3_diag *d)
{
    struct stat st;
    if (stat(pack, &st) != 0) {
        int err = errno;
        if (err == ENOENT || err == ENOTDIR)
            return k3_fail(d, K3_ERR_IO, "'%s': the pack does not exist (-m takes the directory k3pack wrote)", pack);
        return k3_fail(d, K3_ERR_IO, "'%s': cannot open the pack: %s", pack, strerror(err));
    }
    if (!S_ISDIR(st.st_mode))
        return k3_fail(d, K3_ERR_IO, "'%s' is not a pack: -m takes the directory k3pack wrote", pack);
    return K3_OK;
}

/* Whether the pack has a tokenizer: its tiktoken.model exists (k3pack makes a pack without one,
   with a warning, from a checkpoint that has none). *path: where it would be. */
static int pack_has_tokenizer(const char *pack, char *path, size_t cap)
{
    k3_diag d;
    if (k3_path_join(path, cap, pack, "tiktoken.model", &d)) return 1;   /* the load names the problem */
    return access(path, F_OK) == 0 || errno != ENOENT;
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

static k3_err read_stream(FILE *f, const char *name, char **out, size_t *len, k3_diag *d)
{
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    if (!b) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    errno = 0;
    for (;;) {
        if (n == cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) { free(b); return k3_fail(d, K3_ERR_NOMEM, "out of memory reading %s", name); }
            b = nb;
        }
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    if (ferror(f)) {
        int err = errno;
        free(b);
        return k3_fail(d, K3_ERR_IO, "'%s': cannot read: %s", name, err ? strerror(err) : "read failed");
    }
    *out = b;
    *len = n;
    return K3_OK;
}

/* Run `k3verify -q PACK` from k3run's own directory. */
static k3_err run_verify(const char *pack, k3_diag *d)
{
    char self[4096], tool[4200];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return k3_fail(d, K3_ERR_IO, "cannot find k3run's own path to run k3verify");
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    snprintf(tool, sizeof tool, "%s/k3verify", self);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return k3_fail(d, K3_ERR_IO, "fork: %s", strerror(errno));
    if (pid == 0) {
        execl(tool, "k3verify", "-q", pack, (char *)NULL);
        fprintf(stderr, "k3run: cannot run '%s': %s\n", tool, strerror(errno));
        _exit(K3_EXIT_IO);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return k3_fail(d, K3_ERR_IO, "waitpid: %s", strerror(errno));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : K3_EXIT_INTERNAL;
        return k3_fail(d, code == K3_EXIT_DATA ? K3_ERR_CORRUPT : code == K3_EXIT_IO ? K3_ERR_IO : K3_ERR_INTERNAL,
                       "'%s': k3verify found the pack unusable (exit %d); nothing was run", pack, code);
    }
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

static int get_u32(const k3_args *a, int id, uint64_t def, uint64_t lo, uint64_t hi, const char *name, uint32_t *out)
{
    uint64_t v;
    k3_diag d;
    if (k3_opt_u64(a, id, def, 0, &v, &d)) return k3_usage_error("%s", d.msg);
    if (v < lo || v > hi) return k3_usage_error("--%s must be in %llu..%llu (got %llu)", name, (unsigned long long)lo,
                                                (unsigned long long)hi, (unsigned long long)v);
    *out = (uint32_t)v;
    return 0;
}

static int get_float(const k3_args *a, int id, float def, const char *name, float *out)
{
    const char *s = k3_opt_str(a, id);
    if (!s) { *out = def; return 0; }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || isnan(v)) return k3_usage_error("--%s: '%s' is not a number", name, s);
    float f = (float)v;                 /* 1e39 would become inf, 1e-50 zero: say what was given */
    if (errno == ERANGE || (isinf(f) && !isinf(v)) || (f == 0.0f && v != 0.0))
        return k3_usage_error("--%s: '%s' is out of range (a 32-bit float)", name, s);
    *out = f;
    return 0;
}

/* Replace bytes that are not valid UTF-8 by U+FFFD (JSON strings must be Unicode). */
static char *to_valid_utf8(const char *s, size_t n)
{
    char *o = malloc(n * 3 + 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        int len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        int ok = len > 0 && i + (size_t)len <= n;
        for (int j = 1; ok && j < len; j++) {
            unsigned char x = (unsigned char)s[i + j];
            ok = x >= 0x80 && x <= 0xBF;
            if (j == 1 && c == 0xE0) ok = x >= 0xA0 && x <= 0xBF;
            if (j == 1 && c == 0xED) ok = x >= 0x80 && x <= 0x9F;
            if (j == 1 && c == 0xF0) ok = x >= 0x90 && x <= 0xBF;
            if (j == 1 && c == 0xF4) ok = x >= 0x80 && x <= 0x8F;
        }
        if (ok && c) { memcpy(o + k, s + i, (size_t)len); k += (size_t)len; i += (size_t)len; }
        else if (c == 0 && len == 1) { o[k++] = 0; i++; }
        else { memcpy(o + k, "\xEF\xBF\xBD", 3); k += 3; i++; }
    }
    o[k] = 0;
    return o;
}

int main(int argc, char **argv)
{
    k3_log_init(argv[0]);
    k3_args a;
    k3_diag d;
    if (k3_opts_parse(opts, N_OPTS, argc, argv, &a, &d)) return k3_usage_error("%s", d.msg);
    if (k3_opt_count(&a, K3_OPT_HELP)) {
        k3_opts_help(stdout, "k3run -m PACK (-p TEXT | -f FILE | --prompt-ids IDS | < FILE) [OPTIONS]", purpose,
                     opts, N_OPTS, footer);            /* it ends with the exit status table */
        return K3_EXIT_OK;
    }
    if (k3_opt_count(&a, K3_OPT_VERSION)) {
        printf("%s %s\n", k3_log_prog(), K3_VERSION);
        return K3_EXIT_OK;
    }
    if (a.n_pos) return k3_usage_error("unexpected argument '%s' (the pack is given with -m)", a.pos[0]);
    const char *pack = k3_opt_str(&a, OPT_MODEL), *tokdir = k3_opt_str(&a, OPT_TOKENIZER);
    int special = k3_opt_count(&a, OPT_SPECIAL) > 0;

    /* tokenizer-only modes */
    char tik[4096];                                   /* the pack's tiktoken.model */
    if (k3_opt_str(&a, OPT_TOKENIZE) || k3_opt_str(&a, OPT_DETOKENIZE)) {
        if (!pack && !tokdir) return k3_usage_error("--tokenize/--detokenize need -m PACK or --tokenizer DIR");
        if (!tokdir) {
            if (check_pack(pack, &d)) return fail(K3_ERR_IO, &d);
            if (!pack_has_tokenizer(pack, tik, sizeof tik))
                return no_tokenizer(k3_opt_str(&a, OPT_TOKENIZE) ? "--tokenize" : "--detokenize", tik,
                                    "give --tokenizer DIR (a checkpoint's directory)");
        }
        k3_tok *tok;
        k3_err e = k3_tok_load_dir(tokdir ? tokdir : pack, &tok, &d);
        if (e) return fail(e, &d);
        int rc = k3_opt_str(&a, OPT_TOKENIZE) ? tokenize_cmd(tok, k3_opt_str(&a, OPT_TOKENIZE), special)
                                              : detokenize_cmd(tok, k3_opt_str(&a, OPT_DETOKENIZE));
        k3_tok_free(tok);
        return rc;
    }
    if (!pack) return k3_usage_error("no model: give the pack with -m PACK");
    int n_src = !!k3_opt_str(&a, OPT_PROMPT) + !!k3_opt_str(&a, OPT_FILE) + !!k3_opt_str(&a, OPT_PROMPT_IDS);
    if (n_src > 1) return k3_usage_error("give the prompt once: -p, -f or --prompt-ids");
    int json = k3_opt_count(&a, OPT_JSON) > 0, stats = k3_opt_count(&a, OPT_STATS) > 0;
    int print_ids = k3_opt_count(&a, OPT_PRINT_IDS) > 0;

    uint32_t n_predict, threads, context, batch;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int rc;
    if ((rc = get_u32(&a, OPT_N, 128, 0, 1u << 30, "n-predict", &n_predict)) ||
        (rc = get_u32(&a, OPT_THREADS, ncpu > 0 ? (uint64_t)ncpu : 1, 1, 1024, "threads", &threads)) ||
        (rc = get_u32(&a, OPT_CONTEXT, 4096, 1, 1u << 24, "context", &context)) ||
        (rc = get_u32(&a, OPT_BATCH, 64, 1, 4096, "batch", &batch)))
        return rc;
    k3_sampler_opts so = {0};
    uint32_t topk;
    uint64_t seed;
    if ((rc = get_float(&a, OPT_TEMP, 0.0f, "temp", &so.temp)) || (rc = get_float(&a, OPT_TOPP, 1.0f, "top-p", &so.top_p)) ||
        (rc = get_float(&a, OPT_MINP, 0.0f, "min-p", &so.min_p)) ||
        (rc = get_float(&a, OPT_REPEAT, 1.0f, "repeat-penalty", &so.repeat_penalty)) ||
        (rc = get_u32(&a, OPT_TOPK, 0, 0, UINT32_MAX, "top-k", &topk)))
        return rc;
    if (k3_opt_u64(&a, OPT_SEED, 0, 0, &seed, &d)) return k3_usage_error("%s", d.msg);
    so.top_k = topk;
    so.seed = seed;
    if (k3_sampler_check(&so, &d)) return k3_usage_error("%s", d.msg);
    k3_isa isa;
    if (k3_isa_choose(getenv("K3_ISA"), &isa, &d)) return k3_usage_error("K3_ISA: %s", d.msg);
    omp_set_num_threads((int)threads);

    /* the pack, and its tokenizer if the run needs text: before the prompt is read */
    if (check_pack(pack, &d)) return fail(K3_ERR_IO, &d);
    int have_tok = pack_has_tokenizer(pack, tik, sizeof tik);
    if (!have_tok && !k3_opt_str(&a, OPT_PROMPT_IDS))
        return no_tokenizer(k3_opt_str(&a, OPT_PROMPT) ? "the prompt from -p" : k3_opt_str(&a, OPT_FILE) ?
                            "the prompt from -f" : "the prompt from stdin", tik,
                            "give the prompt as token ids with --prompt-ids and print ids with --print-ids");
    if (!have_tok && json) return no_tokenizer("--json (its \"text\")", tik, "use --print-ids instead");
    if (!have_tok && !print_ids)
        return no_tokenizer("text output", tik, "add --print-ids to print the generated ids");

    /* the prompt's text (or ids) first: a bad prompt costs no loading */
    const char *dump_path = k3_opt_str(&a, OPT_DUMP);
    char *text = NULL;
    size_t text_len = 0;
    int32_t *prompt = NULL;
    uint32_t n_prompt = 0;
    k3_err e = K3_OK;
    char psrc[4200];                                  /* where the prompt came from, for messages */
    if (k3_opt_str(&a, OPT_PROMPT_IDS)) snprintf(psrc, sizeof psrc, "--prompt-ids");
    else if (k3_opt_str(&a, OPT_PROMPT)) snprintf(psrc, sizeof psrc, "-p");
    else if (k3_opt_str(&a, OPT_FILE)) snprintf(psrc, sizeof psrc, "-f '%s'", k3_opt_str(&a, OPT_FILE));
    else snprintf(psrc, sizeof psrc, "stdin");
    if (k3_opt_str(&a, OPT_PROMPT_IDS)) {
        if ((e = parse_ids(k3_opt_str(&a, OPT_PROMPT_IDS), &prompt, &n_prompt, &d)))
            return e == K3_ERR_USAGE ? k3_usage_error("--prompt-ids: %s", d.msg) : fail(e, &d);
    } else if (k3_opt_str(&a, OPT_PROMPT)) {
        text = strdup(k3_opt_str(&a, OPT_PROMPT));
        text_len = text ? strlen(text) : 0;
    } else {
        const char *fn = k3_opt_str(&a, OPT_FILE);
        FILE *f = fn ? fopen(fn, "rb") : stdin;
        if (!f) return fail(k3_fail(&d, K3_ERR_IO, "'%s': cannot open: %s", fn, strerror(errno)), &d);
        if (!fn && isatty(0)) k3_info("reading the prompt from stdin (end with Ctrl-D)");
        e = read_stream(f, fn ? fn : "stdin", &text, &text_len, &d);
        if (fn) fclose(f);
        if (e) return fail(e, &d);
    }

    double t_load = k3_now();
    k3_tok *tok = NULL;
    if (have_tok && (e = k3_tok_load_dir(pack, &tok, &d))) { free(text); free(prompt); return fail(e, &d); }
    if (text) {
        size_t cap = 0, n = 0;
        e = k3_tok_encode(tok, text, text_len, special, &prompt, &n, &cap, &d);
        free(text);
        if (e) { k3_tok_free(tok); free(prompt); return fail(e, &d); }
        if (n > UINT32_MAX) n = UINT32_MAX;
        n_prompt = (uint32_t)n;
    }
    for (uint32_t i = 0; tok && i < n_prompt; i++)
        if ((uint32_t)prompt[i] >= k3_tok_n_ids(tok)) {
            int bad = (int)prompt[i];
            uint32_t n_ids = k3_tok_n_ids(tok);
            k3_tok_free(tok);
            free(prompt);
            return k3_usage_error("prompt token id %d is outside the vocabulary (0..%u)", bad, n_ids - 1);
        }
    if (n_prompt == 0) {
        k3_tok_free(tok);
        free(prompt);
        return k3_usage_error("the prompt (%s) is empty: there is nothing to continue", psrc);
    }
    if (n_prompt > context) {
        k3_tok_free(tok);
        free(prompt);
        return k3_usage_error("the prompt (%s) has %u tokens, more than the context of %u (--context)", psrc,
                              n_prompt, context);
    }
    if ((uint64_t)n_prompt + (n_predict ? n_predict - 1 : 0) > context) {   /* k3_generate's check, before loading */
        k3_tok_free(tok);
        free(prompt);
        return k3_usage_error("the prompt (%s, %u tokens) and %u generated tokens (-n) do not fit the context of %u "
                              "positions (--context): use a larger --context or a smaller -n", psrc, n_prompt,
                              n_predict, context);
    }

    /* the prompt is good: only now the whole pack's check (--verify) */
    if (k3_opt_count(&a, OPT_VERIFY)) {
        double tv = k3_now();
        if ((e = run_verify(pack, &d))) { k3_tok_free(tok); free(prompt); return fail(e, &d); }
        t_load += k3_now() - tv;                     /* the load time does not count the check */
    }

    /* the memory plan, from the manifest alone */
    k3_plan plan;
    k3_weights *w = NULL;
    {
        uint64_t budget = 0;
        const char *bs = k3_opt_str(&a, OPT_BUDGET), *ps = k3_opt_str(&a, OPT_PRESET), *src = NULL;
        if (bs && ps && !k3_opt_from_env(&a, OPT_BUDGET)) {
            k3_tok_free(tok); free(prompt);
            return k3_usage_error("give --budget or --preset, not both");
        }
        if (ps) {
            if (!(budget = k3_preset_budget(ps))) {
                k3_tok_free(tok); free(prompt);
                return k3_usage_error("--preset: unknown preset '%s' (laptop, workstation, server)", ps);
            }
        } else if (bs) {
            if (k3_parse_size(bs, 1, &budget) || budget == 0) {
                k3_tok_free(tok); free(prompt);
                return k3_usage_error("--budget: '%s' is not a size (8G, 512M, 4096)", bs);
            }
        } else {
            budget = k3_machine_memory(&src);
            uint64_t keep = budget / 10 > (512ull << 20) ? budget / 10 : (512ull << 20);
            budget = budget > keep ? budget - keep : 0;
            if (k3_log_level() >= 1)
                fprintf(stderr, "%s: no --budget: using %.2f GiB (%s, less a margin)\n", k3_log_prog(),
                        budget / 1073741824.0, src);
        }
        static k3_geometry geo;                          /* ~8 KiB: not on the stack */
        e = k3_weights_open(pack, &w, &d);                /* the manifest and config only */
        for (uint32_t i = 0; !e && !tok && i < n_prompt; i++)    /* no tokenizer: the model's vocabulary */
            if ((uint32_t)prompt[i] >= k3w_config(w)->vocab_size)
                e = k3_fail(&d, K3_ERR_USAGE, "prompt token id %d is outside the vocabulary (0..%u)",
                            (int)prompt[i], k3w_config(w)->vocab_size - 1);
        if (!e) e = k3_geometry_from_manifest(k3w_manifest(w), k3w_config(w), &geo, &d);
        if (!e) e = k3_plan_for(k3w_config(w), &geo, budget, context, batch, dump_path != NULL, &plan, &d);
        if (e) {
            k3_weights_free(w);
            k3_tok_free(tok);
            free(prompt);
            return e == K3_ERR_USAGE ? k3_usage_error("%s", d.msg) : fail(e, &d);
        }
        if (stats || k3_log_level() >= 2)
            fprintf(stderr, "%s: plan for %.2f GiB: %.2f GiB resident (trunk %.2f, %u units streamed through "
                    "%.2f GiB of buffers, model buffers %.2f, experts %s%.2f in %llu slots); expected %.1f MiB read "
                    "per token\n", k3_log_prog(), plan.budget / 1073741824.0, plan.resident / 1073741824.0,
                    plan.trunk_resident / 1073741824.0, plan.n_streamed, plan.stream_buffers / 1073741824.0,
                    plan.buffers / 1073741824.0, plan.experts_all_resident ? "all resident, " : "cache ",
                    plan.expert_cache / 1073741824.0, (unsigned long long)plan.expert_slots,
                    plan.disk_per_token / 1048576.0);
    }
    k3_weights_opts wo = {.verify_reads = !k3_opt_count(&a, OPT_NO_VERIFY_READS), .progress = 1,
                          .expert_slots = plan.experts_all_resident ? 0 : plan.expert_slots,
                          .unit_streamed = plan.n_streamed ? plan.unit_streamed : NULL};
    k3_model *m = NULL;
    k3_dump *dp = NULL;
    if (dump_path && !(dp = k3_dump_new())) e = k3_fail(&d, K3_ERR_NOMEM, "out of memory");
    if (!e) e = k3_weights_load(w, &wo, &d);
    if (!e) {
        k3_model_opts mo = {.max_batch = batch, .context = context, .isa = isa, .all_logits = dp != NULL,
                            .dump = dp ? k3_dump_hook : NULL, .dump_ctx = dp};
        e = k3_model_new(w, &mo, &m, &d);
    }
    if (!e && tok && k3_model_vocab(m) < k3_tok_n_ids(tok) && k3_model_vocab(m) != k3_tok_n_ids(tok))
        k3_warn("the tokenizer has %u ids, the model's vocabulary %u", k3_tok_n_ids(tok), k3_model_vocab(m));
    t_load = k3_now() - t_load;
    int32_t *gen = NULL;
    double *t_tok = NULL;
    char *mem = NULL;
    size_t mem_len = 0;
    k3_gen_stats st = {0};
    k3_runstats rs = {0};
    if (!e && (stats || json) && k3_runstats_init(&rs, w, n_predict)) e = k3_fail(&d, K3_ERR_NOMEM, "out of memory");
    if (!e) {
        gen = calloc(n_predict ? n_predict : 1, sizeof *gen);
        t_tok = calloc(n_predict ? n_predict : 1, sizeof *t_tok);
        if (!gen || !t_tok) e = k3_fail(&d, K3_ERR_NOMEM, "out of memory");
    }
    if (!e) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sigint;
        sigaction(SIGINT, &sa, NULL);
        static char outbuf[1 << 16];                 /* stdout's buffer, made before the token loop */
        if (!json) setvbuf(stdout, outbuf, isatty(1) ? _IOLBF : _IOFBF, sizeof outbuf);
        FILE *out = json ? open_memstream(&mem, &mem_len) : stdout;
        k3_gen_opts go = {.n_predict = n_predict, .print_ids = print_ids && !json,
                          .eos = k3w_config(w)->eos_token_id, .sampler = so,
                          .on_step = rs.tok ? k3_runstats_step : NULL, .step_ctx = &rs};
        st.t_tok = t_tok;
        if (!out) e = k3_fail(&d, K3_ERR_NOMEM, "out of memory");
        else e = k3_generate(m, tok, prompt, n_prompt, &go, out, &g_stop, gen, &st, &d);
        if (json && out) fclose(out);
    }
    if (!e && dp) e = k3_dump_write(dp, dump_path, &d);
    if (!e && (stats || json)) {
        uint64_t rss = k3_peak_rss_bytes();
        k3_weights_stats ws;
        k3w_stats(w, &ws);
        double pt = st.t_prompt > 0 ? st.n_prompt / st.t_prompt : 0, gt = st.t_gen > 0 ? st.n_gen / st.t_gen : 0;
        struct stat so1, so2;
        int same = isatty(1) || (!fstat(1, &so1) && !fstat(2, &so2) && so1.st_dev == so2.st_dev &&
                                 so1.st_ino == so2.st_ino);
        if (stats && same && !json && st.n_gen) fputc('\n', stderr);   /* the text ends without one */
        if (stats)
            fprintf(stderr,
                    "k3run: loaded in %.2f s (%.1f MiB read, hashes %s); ISA %s, %u threads\n"
                    "k3run: prompt %u tokens in %.3f s (%.1f tok/s); generated %u tokens in %.3f s (%.2f tok/s)%s\n"
                    "k3run: peak RSS %.1f MiB; model buffers %.1f MiB; experts: %llu hits, %llu misses; "
                    "%.1f MiB read in all (trunk %.1f, experts %.1f); waited %.3f s for reads\n",
                    t_load, k3w_bytes_read(w) / 1048576.0, wo.verify_reads ? "checked" : "not checked",
                    k3_isa_name(isa), threads, st.n_prompt, st.t_prompt, pt, st.n_gen, st.t_gen, gt,
                    st.stopped_eos ? " (end of message)" : st.interrupted ? " (interrupted)" : "",
                    rss / 1048576.0, k3_model_scratch_bytes(m) / 1048576.0, (unsigned long long)ws.expert_hits,
                    (unsigned long long)ws.expert_misses, ws.bytes_read / 1048576.0,
                    ws.trunk_bytes_read / 1048576.0, ws.expert_bytes_read / 1048576.0, ws.wait_seconds);
        if (stats) k3_runstats_print(&rs, stderr);
        if (json) {
            json_t *o = json_object(), *ids = json_array(), *tt = json_array();
            for (uint32_t i = 0; i < st.n_gen; i++) {
                json_array_append_new(ids, json_integer(gen[i]));
                json_array_append_new(tt, json_real(t_tok[i]));
            }
            char *txt = to_valid_utf8(mem ? mem : "", mem_len);
            json_object_set_new(o, "schema", json_integer(1));
            json_object_set_new(o, "text", json_stringn(txt ? txt : "", txt ? strlen(txt) : 0));
            json_object_set_new(o, "generated_ids", ids);
            json_object_set_new(o, "prompt_tokens", json_integer(st.n_prompt));
            json_object_set_new(o, "generated_tokens", json_integer(st.n_gen));
            json_object_set_new(o, "stop", json_string(st.stopped_eos ? "eos" : st.interrupted ? "interrupted" : "length"));
            json_object_set_new(o, "load_seconds", json_real(t_load));
            json_object_set_new(o, "prompt_seconds", json_real(st.t_prompt));
            json_object_set_new(o, "generate_seconds", json_real(st.t_gen));
            json_object_set_new(o, "token_seconds", tt);
            json_object_set_new(o, "bytes_read", json_integer((json_int_t)k3w_bytes_read(w)));
            json_object_set_new(o, "peak_rss_bytes", json_integer((json_int_t)rss));
            json_object_set_new(o, "budget_bytes", json_integer((json_int_t)plan.budget));
            json_object_set_new(o, "resident_bytes", json_integer((json_int_t)plan.resident));
            json_object_set_new(o, "expert_slots", json_integer((json_int_t)plan.expert_slots));
            json_object_set_new(o, "expert_hits", json_integer((json_int_t)ws.expert_hits));
            json_object_set_new(o, "expert_misses", json_integer((json_int_t)ws.expert_misses));
            json_object_set_new(o, "io_wait_seconds", json_real(ws.wait_seconds));
            json_object_set_new(o, "read_seconds", json_real(ws.read_seconds));
            json_object_set_new(o, "hash_seconds", json_real(ws.hash_seconds));
            json_object_set_new(o, "trunk_bytes_read", json_integer((json_int_t)ws.trunk_bytes_read));
            json_object_set_new(o, "expert_bytes_read", json_integer((json_int_t)ws.expert_bytes_read));
            json_object_set_new(o, "trunk_units_streamed", json_integer((json_int_t)plan.n_streamed));
            json_object_set_new(o, "trunk_resident_bytes", json_integer((json_int_t)plan.trunk_resident));
            json_object_set_new(o, "stream_buffer_bytes", json_integer((json_int_t)plan.stream_buffers));
            json_object_set_new(o, "expected_disk_bytes_per_token", json_real(plan.disk_per_token));
            json_t *per = k3_runstats_json(&rs);
            json_object_update(o, per);
            json_decref(per);
            json_object_set_new(o, "isa", json_string(k3_isa_name(isa)));
            json_object_set_new(o, "threads", json_integer(threads));
            json_dumpf(o, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
            printf("\n");
            json_decref(o);
            free(txt);
        }
    }
    free(mem);
    free(gen);
    free(t_tok);
    k3_runstats_free(&rs);
    free(prompt);
    k3_dump_free(dp);
    k3_model_free(m);
    k3_weights_free(w);
    k3_tok_free(tok);
    if (e) return fail(e, &d);
    return st.interrupted ? 130 : K3_EXIT_OK;
}

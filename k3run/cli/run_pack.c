/*
 * run_pack.c - one run of k3run over a pack (run_pack.h), in the order
 * docs/k3run.md ("Prompts and edge cases") states, so a bad prompt reads no
 * weight.
 */
#define _GNU_SOURCE
#include "run_pack.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "dist.h"
#include "dump.h"
#include "load.h"
#include "generate.h"
#include "perplexity.h"
#include "k3_log.h"
#include "k3_sys.h"
#include "k3_utf8.h"
#include "runstats.h"

/* A usage error of the command line's (r->usage: the CLI adds "Try --help"). */
#define USAGE(...) (r->usage = 1, k3_fail(d, K3_ERR_USAGE, __VA_ARGS__))

static volatile sig_atomic_t g_stop;
static void on_sigint(int sig) { (void)sig; g_stop = 1; }

/* Ctrl-C sets g_stop: the work in progress stops at its next check and reports what it has. */
static void catch_sigint(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
}

/* --perplexity: score the prompt's ids (perplexity.h) and print the result. */
static k3_err score_perplexity(const k3_run_opts *o, k3_model *m, const k3_weights *w, const k3_plan *plan,
                               double t_load, const int32_t *ids, uint32_t n, k3_run_result *r, k3_diag *d)
{
    k3_ppl_result pr = {.running = calloc(k3_ppl_chunks(n, o->context, o->ppl_chunks), sizeof(double))};
    if (!pr.running) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    k3_ppl_kl kl = {.save_name = o->save_logits, .base_name = o->kl_base};
    k3_err e = K3_OK;
    if (o->save_logits && !(kl.save = fopen(o->save_logits, "wb")))
        e = k3_fail(d, K3_ERR_IO, "cannot create '%s': %s", o->save_logits, strerror(errno));
    if (!e && o->kl_base && !(kl.base = fopen(o->kl_base, "rb")))
        e = k3_fail(d, errno == ENOENT ? K3_ERR_USAGE : K3_ERR_IO, "cannot open '%s': %s", o->kl_base, strerror(errno));
    catch_sigint();
    if (!e)
        e = k3_perplexity(m, ids, n, o->context, o->ppl_chunks, isatty(2) && !o->json ? stderr : NULL, &g_stop,
                          o->save_logits || o->kl_base ? &kl : NULL, &pr, d);
    if (kl.save && fclose(kl.save) != 0 && !e) e = k3_fail(d, K3_ERR_IO, "cannot write '%s'", o->save_logits);
    if (kl.base) fclose(kl.base);
    if (!e) {
        k3_ppl_info info = {.tokens = n, .load_seconds = t_load, .bytes_read = k3w_bytes_read(w),
                            .budget = plan->budget, .isa = k3_isa_name(o->isa), .threads = o->threads,
                            .trunk = k3w_trunk_q8(w) ? "q8 (inexact)" : "exact"};
        k3_ppl_print(&pr, &info, &kl, o->json, stdout);
        r->interrupted = pr.interrupted;
    }
    free(pr.running);
    return e;
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

k3_err k3_run_pack(const k3_run_opts *o, k3_run_result *r, k3_diag *d)
{
    memset(r, 0, sizeof *r);
    /* the prompt's text (or ids) first: a bad prompt costs no loading */
    char *text = NULL;
    size_t text_len = 0;
    int32_t *prompt = NULL;
    uint32_t n_prompt = 0;
    k3_err e = K3_OK;
    if (o->prompt_ids) {
        if (!(prompt = malloc((o->n_prompt_ids ? o->n_prompt_ids : 1) * sizeof *prompt)))
            return k3_fail(d, K3_ERR_NOMEM, "out of memory");
        if (o->n_prompt_ids) memcpy(prompt, o->prompt_ids, o->n_prompt_ids * sizeof *prompt);
        n_prompt = o->n_prompt_ids;
    } else if (o->prompt_text) {
        text = strdup(o->prompt_text);
        text_len = text ? strlen(text) : 0;
    } else {
        const char *fn = o->prompt_file;
        FILE *f = fn ? fopen(fn, "rb") : stdin;
        if (!f) return k3_fail(d, K3_ERR_IO, "'%s': cannot open: %s", fn, strerror(errno));
        if (!fn && isatty(0)) k3_info("reading the prompt from stdin (end with Ctrl-D)");
        e = read_stream(f, fn ? fn : "stdin", &text, &text_len, d);
        if (fn) fclose(f);
        if (e) return e;
    }

    double t_load = k3_now();
    k3_tok *tok = NULL;
    if (o->have_tokenizer && (e = k3_tok_load_dir(o->pack, &tok, d))) { free(text); free(prompt); return e; }
    if (text) {
        size_t cap = 0, n = 0;
        e = k3_tok_encode(tok, text, text_len, o->special, &prompt, &n, &cap, d);
        free(text);
        if (e) { k3_tok_free(tok); free(prompt); return e; }
        if (n > UINT32_MAX) n = UINT32_MAX;
        n_prompt = (uint32_t)n;
    }
    for (uint32_t i = 0; tok && i < n_prompt; i++)
        if ((uint32_t)prompt[i] >= k3_tok_n_ids(tok)) {
            int bad = (int)prompt[i];
            uint32_t n_ids = k3_tok_n_ids(tok);
            k3_tok_free(tok);
            free(prompt);
            return USAGE("prompt token id %d is outside the vocabulary (0..%u)", bad, n_ids - 1);
        }
    if (o->perplexity && !k3_ppl_chunks(n_prompt, o->context, o->ppl_chunks)) {
        k3_tok_free(tok);
        free(prompt);
        return USAGE("%s has %u tokens: --perplexity needs at least 2 x --context = %llu (a smaller --context?)",
                     o->prompt_source, n_prompt, 2ull * o->context);
    }
    if (o->perplexity) goto checked;                  /* its chunks are --context long: no prompt limits */
    if (n_prompt == 0) {
        k3_tok_free(tok);
        free(prompt);
        return USAGE("the prompt (%s) is empty: there is nothing to continue", o->prompt_source);
    }
    if (n_prompt > o->context) {
        k3_tok_free(tok);
        free(prompt);
        return USAGE("the prompt (%s) has %u tokens, more than the context of %u (--context)", o->prompt_source,
                     n_prompt, o->context);
    }
    if ((uint64_t)n_prompt + (o->n_predict ? o->n_predict - 1 : 0) > o->context) {   /* k3_generate's check, before loading */
        k3_tok_free(tok);
        free(prompt);
        return USAGE("the prompt (%s, %u tokens) and %u generated tokens (-n) do not fit the context of %u "
                     "positions (--context): use a larger --context or a smaller -n", o->prompt_source, n_prompt,
                     o->n_predict, o->context);
    }

checked:;
    /* the prompt is good: only now the pack's check (--verify), the plan and the weights */

    /* the memory plan, from the manifest alone; then the weights */
    k3_load_opts lo = {.pack = o->pack, .budget = o->budget, .context = o->context, .batch = o->batch,
                       .prompt_tokens = o->perplexity ? o->context : n_prompt,   /* perplexity: chunks of context */
                       .generate_tokens = o->perplexity ? 0 : o->n_predict,
                       .all_logits = o->dump_path != NULL || o->perplexity, .verify = o->verify,
                       .verify_reads = o->verify_reads, .report = o->stats, .isa = o->isa};
    if (o->draft && !lo.all_logits) lo.spec_tokens = o->draft + 1;
    k3_loaded ld = {0};
    int usage = 0;
    e = k3_load_plan(&lo, &ld, &usage, d);
    for (uint32_t i = 0; !e && !tok && i < n_prompt; i++)    /* no tokenizer: the model's vocabulary */
        if ((uint32_t)prompt[i] >= k3w_config(ld.w)->vocab_size)
            e = k3_fail(d, K3_ERR_USAGE, "prompt token id %d is outside the vocabulary (0..%u)",
                        (int)prompt[i], k3w_config(ld.w)->vocab_size - 1), usage = 1;
    if (e) {
        k3_loaded_free(&ld);
        k3_tok_free(tok);
        free(prompt);
        r->usage = usage;
        return e;
    }
    t_load += ld.t_verify;
    k3_dump *dp = NULL;
    if (o->dump_path && !(dp = k3_dump_new())) e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
    lo.dump = dp ? k3_dump_hook : NULL;
    lo.dump_ctx = dp;
    if (!e) e = k3_load_model(&lo, &ld, d);
    k3_weights *w = ld.w;
    k3_model *m = ld.m;
    const k3_plan plan = ld.plan;
    const k3_weights_opts wo = ld.wo;
    if (!e && tok && k3_model_vocab(m) < k3_tok_n_ids(tok) && k3_model_vocab(m) != k3_tok_n_ids(tok))
        k3_warn("the tokenizer has %u ids, the model's vocabulary %u", k3_tok_n_ids(tok), k3_model_vocab(m));
    t_load = k3_now() - t_load;
    int32_t *gen = NULL;
    double *t_tok = NULL;
    char *mem = NULL;
    size_t mem_len = 0;
    k3_gen_stats st = {0};
    double go_rho = 0;                               /* the draft-length rule's rho (decode.h) */
    k3_runstats rs = {0};
    if (!e && o->perplexity) {                       /* score the text instead of generating */
        e = score_perplexity(o, m, w, &plan, t_load, prompt, n_prompt, r, d);
        goto out;
    }
    if (!e && (o->stats || o->json) && k3_runstats_init(&rs, w, o->n_predict)) e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
    if (!e) {
        gen = calloc(o->n_predict ? o->n_predict : 1, sizeof *gen);
        t_tok = calloc(o->n_predict ? o->n_predict : 1, sizeof *t_tok);
        if (!gen || !t_tok) e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
    }
    if (!e) {
        catch_sigint();
        static char outbuf[1 << 16];                 /* stdout's buffer, made before the token loop */
        if (!o->json) setvbuf(stdout, outbuf, isatty(1) ? _IOLBF : _IOFBF, sizeof outbuf);
        FILE *out = o->json ? open_memstream(&mem, &mem_len) : stdout;
        k3_gen_opts go = {.n_predict = o->n_predict, .print_ids = o->print_ids && !o->json,
                          .eos = k3w_config(w)->eos_token_id, .sampler = o->sampler,
                          .max_draft = plan.verify_tokens ? plan.verify_tokens - 1 : 0,
                          .rho = go_rho = k3_dec_rho(&plan, ld.geo),
                          .on_step = rs.tok ? k3_runstats_step : NULL, .step_ctx = &rs};
        st.t_tok = t_tok;
        if (!out) e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
        else e = k3_generate(m, tok, prompt, n_prompt, &go, out, &g_stop, gen, &st, d);
        if (o->json && out) fclose(out);
    }
    if (!e && dp) e = k3_dump_write(dp, o->dump_path, d);
    if (!e && (o->stats || o->json)) {
        uint64_t rss = k3_peak_rss_bytes();
        k3_weights_stats ws;
        k3w_stats(w, &ws);
        double pt = st.t_prompt > 0 ? st.n_prompt / st.t_prompt : 0, gt = st.t_gen > 0 ? st.n_gen / st.t_gen : 0;
        struct stat so1, so2;
        int same = isatty(1) || (!fstat(1, &so1) && !fstat(2, &so2) && so1.st_dev == so2.st_dev &&
                                 so1.st_ino == so2.st_ino);
        if (o->stats && same && !o->json && st.n_gen) fputc('\n', stderr);   /* the text ends without one */
        if (o->stats)
            fprintf(stderr,
                    "k3run: loaded in %.2f s (%.1f MiB read, hashes %s); ISA %s, %u threads\n"
                    "k3run: prompt %u tokens in %.3f s (%.1f tok/s); generated %u tokens in %.3f s (%.2f tok/s)%s\n"
                    "k3run: peak RSS %.1f MiB; model buffers %.1f MiB; experts: %llu hits, %llu misses; "
                    "%.1f MiB read in all (trunk %.1f, experts %.1f); waited %.3f s for reads\n",
                    t_load, k3w_bytes_read(w) / 1048576.0, wo.verify_reads ? "checked" : "not checked",
                    k3_isa_name(o->isa), o->threads, st.n_prompt, st.t_prompt, pt, st.n_gen, st.t_gen, gt,
                    st.stopped_eos ? " (end of message)" : st.interrupted ? " (interrupted)" : "",
                    rss / 1048576.0, k3_model_scratch_bytes(m) / 1048576.0, (unsigned long long)ws.expert_hits,
                    (unsigned long long)ws.expert_misses, ws.bytes_read / 1048576.0,
                    ws.trunk_bytes_read / 1048576.0, ws.expert_bytes_read / 1048576.0, ws.wait_seconds);
        const k3_dec_stats *ds = &st.dec;
        double tpp = ds->passes ? (double)ds->tokens / (double)ds->passes : 0;
        if (o->stats && plan.verify_tokens)
            fprintf(stderr, "k3run: speculative decoding: %u tokens in %llu passes (%.2f tokens per pass); "
                    "%llu drafted in %llu passes, %llu accepted (%.0f %%)\n", st.n_gen,
                    (unsigned long long)ds->passes, tpp, (unsigned long long)ds->drafted,
                    (unsigned long long)ds->verify_passes, (unsigned long long)ds->accepted,
                    ds->drafted ? 100.0 * ds->accepted / ds->drafted : 0.0);
        if (o->stats) k3_runstats_print(&rs, stderr);
        if (o->json) {
            json_t *doc = json_object(), *ids = json_array(), *tt = json_array();
            for (uint32_t i = 0; i < st.n_gen; i++) {
                json_array_append_new(ids, json_integer(gen[i]));
                json_array_append_new(tt, json_real(t_tok[i]));
            }
            char *txt = k3_utf8_sanitize(mem ? mem : "", mem_len, NULL);
            json_object_set_new(doc, "schema", json_integer(1));
            json_object_set_new(doc, "text", json_stringn(txt ? txt : "", txt ? strlen(txt) : 0));
            json_object_set_new(doc, "generated_ids", ids);
            json_object_set_new(doc, "prompt_tokens", json_integer(st.n_prompt));
            json_object_set_new(doc, "generated_tokens", json_integer(st.n_gen));
            json_object_set_new(doc, "stop", json_string(st.stopped_eos ? "eos" : st.interrupted ? "interrupted" : "length"));
            json_object_set_new(doc, "load_seconds", json_real(t_load));
            json_object_set_new(doc, "prompt_seconds", json_real(st.t_prompt));
            json_object_set_new(doc, "generate_seconds", json_real(st.t_gen));
            json_object_set_new(doc, "token_seconds", tt);
            json_object_set_new(doc, "bytes_read", json_integer((json_int_t)k3w_bytes_read(w)));
            json_object_set_new(doc, "peak_rss_bytes", json_integer((json_int_t)rss));
            json_object_set_new(doc, "budget_bytes", json_integer((json_int_t)plan.budget));
            json_object_set_new(doc, "resident_bytes", json_integer((json_int_t)plan.resident));
            json_object_set_new(doc, "expert_slots", json_integer((json_int_t)plan.expert_slots));
            json_object_set_new(doc, "batch", json_integer((json_int_t)plan.batch));       /* tokens per pass */
            json_object_set_new(doc, "batch_auto", json_boolean(plan.batch_auto));
            json_object_set_new(doc, "buffers_bytes", json_integer((json_int_t)plan.buffers));
            json_object_set_new(doc, "trunk_streamed_bytes", json_integer((json_int_t)plan.trunk_streamed));
            json_object_set_new(doc, "experts_in_place_layers", json_integer((json_int_t)k3w_in_place_layers(w)));
            json_object_set_new(doc, "trunk", json_string(k3w_trunk_q8(w) ? "q8 (inexact)" : "exact"));
            json_object_set_new(doc, "ranks", json_integer(k3_dist_size()));   /* MPI ranks (dist.h) */
            json_object_set_new(doc, "trunk_placement", json_string(wo.split ? "split" : "rank0"));
            json_object_set_new(doc, "trunk_resident_bytes", json_integer((json_int_t)plan.trunk_resident));
            json_object_set_new(doc, "network_bytes_sent", json_integer((json_int_t)k3_dist_bytes_sent()));
            json_object_set_new(doc, "network_bytes_received", json_integer((json_int_t)k3_dist_bytes_received()));
            json_object_set_new(doc, "expert_hits", json_integer((json_int_t)ws.expert_hits));
            json_object_set_new(doc, "expert_misses", json_integer((json_int_t)ws.expert_misses));
            json_object_set_new(doc, "io_wait_seconds", json_real(ws.wait_seconds));
            json_object_set_new(doc, "read_seconds", json_real(ws.read_seconds));
            json_object_set_new(doc, "hash_seconds", json_real(ws.hash_seconds));
            json_object_set_new(doc, "trunk_bytes_read", json_integer((json_int_t)ws.trunk_bytes_read));
            json_object_set_new(doc, "expert_bytes_read", json_integer((json_int_t)ws.expert_bytes_read));
            json_object_set_new(doc, "trunk_units_streamed", json_integer((json_int_t)plan.n_streamed));
            json_object_set_new(doc, "trunk_resident_bytes", json_integer((json_int_t)plan.trunk_resident));
            json_object_set_new(doc, "stream_buffer_bytes", json_integer((json_int_t)plan.stream_buffers));
            json_object_set_new(doc, "trunk_units_in_pieces", json_integer((json_int_t)plan.n_chunked));
            json_object_set_new(doc, "trunk_pieces_read", json_integer((json_int_t)ws.pieces_streamed));
            json_object_set_new(doc, "expected_disk_bytes_per_token", json_real(plan.disk_per_token));
            json_t *per = k3_runstats_json(&rs);
            json_object_update(doc, per);
            json_decref(per);
            json_object_set_new(doc, "draft_max", json_integer(plan.verify_tokens ? plan.verify_tokens - 1 : 0));
            json_object_set_new(doc, "draft_rho", json_real(go_rho));
            json_object_set_new(doc, "passes", json_integer((json_int_t)ds->passes));
            json_object_set_new(doc, "drafted", json_integer((json_int_t)ds->drafted));
            json_object_set_new(doc, "accepted", json_integer((json_int_t)ds->accepted));
            json_object_set_new(doc, "tokens_per_pass", json_real(tpp));
            json_t *kept = json_array();          /* [j]: verify passes that kept j drafted tokens */
            for (uint32_t j = 0; plan.verify_tokens && j < plan.verify_tokens; j++)
                json_array_append_new(kept, json_integer((json_int_t)ds->kept[j]));
            json_object_set_new(doc, "drafts_kept", kept);
            json_object_set_new(doc, "isa", json_string(k3_isa_name(o->isa)));
            json_object_set_new(doc, "threads", json_integer(o->threads));
            json_dumpf(doc, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
            printf("\n");
            json_decref(doc);
            free(txt);
        }
    }
out:
    free(mem);
    free(gen);
    free(t_tok);
    k3_runstats_free(&rs);
    free(prompt);
    k3_dump_free(dp);
    k3_loaded_free(&ld);
    k3_tok_free(tok);
    r->interrupted |= st.interrupted;             /* or the perplexity run's, set above */
    return e;
}

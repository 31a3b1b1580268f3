/* perplexity.c - see perplexity.h. */
#include "perplexity.h"

#include <math.h>

#include <jansson.h>

#include "k3_log.h"
#include "k3_sys.h"

uint32_t k3_ppl_chunks(size_t n, uint32_t context, uint32_t max_chunks)
{
    if (context < 2 || n < 2 * (size_t)context) return 0;
    size_t c = n / context;
    if (max_chunks && c > max_chunks) c = max_chunks;
    return c > UINT32_MAX ? UINT32_MAX : (uint32_t)c;
}

/* -log softmax(row)[tok]: the max over the fp32 logits, the sum of exp in double */
static double nll_of(const float *row, uint32_t V, int32_t tok)
{
    float mx = row[0];
    for (uint32_t i = 1; i < V; i++)
        if (row[i] > mx) mx = row[i];
    double s = 0.0;
    for (uint32_t i = 0; i < V; i++) s += (double)expf(row[i] - mx);
    return -((double)(row[tok] - mx) - log(s));
}

k3_err k3_perplexity(k3_model *m, const int32_t *ids, size_t n, uint32_t context, uint32_t max_chunks,
                     FILE *progress, volatile sig_atomic_t *stop, k3_ppl_result *r, k3_diag *d)
{
    double *running = r->running;
    *r = (k3_ppl_result){.running = running, .context = context};
    uint32_t chunks = k3_ppl_chunks(n, context, max_chunks);
    if (!chunks)
        return k3_fail(d, K3_ERR_USAGE, "%zu tokens: --perplexity needs at least 2 x --context = %llu tokens",
                       n, 2ull * context);
    if (context > k3_model_context(m))
        return k3_fail(d, K3_ERR_INTERNAL, "perplexity: context %u beyond the model's %u", context,
                       k3_model_context(m));
    uint32_t V = k3_model_vocab(m), B = k3_model_max_batch(m), first = context / 2;
    double t0 = k3_now(), nll = 0.0, nll2 = 0.0;
    uint64_t count = 0;
    for (uint32_t c = 0; c < chunks; c++) {
        const int32_t *chunk = ids + (size_t)c * context;
        k3_model_reset(m);
        for (uint32_t b0 = 0; b0 < context; b0 += B) {
            if (stop && *stop) {
                r->interrupted = 1;
                goto done;
            }
            uint32_t T = context - b0 < B ? context - b0 : B;
            k3_err e = k3_model_forward(m, chunk + b0, T, d);
            if (e) return k3_diag_wrap(d, "perplexity, chunk %u", c + 1);
            for (uint32_t i = 0; i < T; i++) {
                uint32_t p = b0 + i;                       /* position in the chunk */
                if (p < first || p + 1 >= context) continue;
                double v = nll_of(k3_model_logits_row(m, i), V, chunk[p + 1]);
                nll += v;
                nll2 += v * v;
                count++;
            }
        }
        r->running[c] = exp(nll / (double)count);
        r->chunks = c + 1;
        if (progress) {
            fprintf(progress, "[%u]%.4f,", c + 1, r->running[c]);
            fflush(progress);
        }
    }
done:
    r->tokens_scored = count;
    r->seconds = k3_now() - t0;
    if (count) {
        double mean = nll / (double)count, var = nll2 / (double)count - mean * mean;
        r->nll = mean;
        r->ppl = exp(mean);
        r->ppl_stderr = var > 0 && count > 1 ? r->ppl * sqrt(var / (double)(count - 1)) : 0.0;
    }
    if (progress) fputc('\n', progress);
    return K3_OK;
}

void k3_ppl_print(const k3_ppl_result *r, const k3_ppl_info *info, int json, FILE *out)
{
    if (!json) {
        fprintf(out, "Final estimate: PPL = %.4f +/- %.5f\n", r->ppl, r->ppl_stderr);
        k3_info("%u chunks of %u tokens, %llu tokens scored in %.2f s (%.1f tok/s)%s", r->chunks, r->context,
                (unsigned long long)r->tokens_scored, r->seconds,
                r->seconds > 0 ? r->chunks * (double)r->context / r->seconds : 0.0,
                r->interrupted ? " (interrupted)" : "");
        return;
    }
    json_t *doc = json_object(), *run = json_array();
    for (uint32_t i = 0; i < r->chunks; i++) json_array_append_new(run, json_real(r->running[i]));
    json_object_set_new(doc, "schema", json_integer(1));
    json_object_set_new(doc, "ppl", json_real(r->ppl));
    json_object_set_new(doc, "ppl_stderr", json_real(r->ppl_stderr));
    json_object_set_new(doc, "nll", json_real(r->nll));
    json_object_set_new(doc, "context", json_integer(r->context));
    json_object_set_new(doc, "chunks", json_integer(r->chunks));
    json_object_set_new(doc, "tokens", json_integer((json_int_t)info->tokens));
    json_object_set_new(doc, "tokens_scored", json_integer((json_int_t)r->tokens_scored));
    json_object_set_new(doc, "running", run);
    json_object_set_new(doc, "interrupted", json_boolean(r->interrupted));
    json_object_set_new(doc, "seconds", json_real(r->seconds));
    json_object_set_new(doc, "load_seconds", json_real(info->load_seconds));
    json_object_set_new(doc, "bytes_read", json_integer((json_int_t)info->bytes_read));
    json_object_set_new(doc, "budget_bytes", json_integer((json_int_t)info->budget));
    json_object_set_new(doc, "isa", json_string(info->isa));
    json_object_set_new(doc, "threads", json_integer(info->threads));
    json_dumpf(doc, out, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    fputc('\n', out);
    json_decref(doc);
}

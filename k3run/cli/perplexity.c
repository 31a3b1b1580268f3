/* perplexity.c - see perplexity.h. */
#include "perplexity.h"

#include <math.h>

#include <jansson.h>

#include <stdlib.h>
#include <string.h>

#include "k3_hash.h"
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

/* The base file's 32-byte header for this text (k3_ppl_kl). */
static void kl_header(uint8_t h[32], uint32_t V, uint32_t context, uint32_t chunks, const int32_t *ids)
{
    uint32_t f[4] = {V, context, chunks, 0};
    uint64_t id = k3_xxh3_64(ids, (size_t)chunks * context * sizeof *ids);
    memcpy(h, "K3LOGIT1", 8);
    memcpy(h + 8, f, 16);           /* little-endian on x86-64, as the format says */
    memcpy(h + 24, &id, 8);
}

/* KL(base || row) in nats (softmax in double), and whether the top tokens agree. */
static double kl_row(const float *b, const float *q, uint32_t V, int *same)
{
    uint32_t ib = 0, iq = 0;
    for (uint32_t i = 1; i < V; i++) {
        if (b[i] > b[ib]) ib = i;
        if (q[i] > q[iq]) iq = i;
    }
    double sb = 0.0, sq = 0.0;
    for (uint32_t i = 0; i < V; i++) {
        sb += exp((double)b[i] - b[ib]);
        sq += exp((double)q[i] - q[iq]);
    }
    double lsb = log(sb), lsq = log(sq), kl = 0.0;
    for (uint32_t i = 0; i < V; i++) {
        double lb = (double)b[i] - b[ib] - lsb, lq = (double)q[i] - q[iq] - lsq;
        kl += exp(lb) * (lb - lq);
    }
    *same = ib == iq;
    return kl > 0 ? kl : 0.0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

k3_err k3_perplexity(k3_model *m, const int32_t *ids, size_t n, uint32_t context, uint32_t max_chunks,
                     FILE *progress, volatile sig_atomic_t *stop, k3_ppl_kl *kl, k3_ppl_result *r, k3_diag *d)
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
    uint8_t hdr[32], bh[32];
    float *brow = NULL;                                    /* [V] the base's logits of one row */
    double *kls = NULL;                                    /* [rows] KL of every row compared */
    uint64_t n_kl = 0, same = 0;
    k3_err e = K3_OK;
    if (kl) {
        kl_header(hdr, V, context, chunks, ids);
        if (kl->save && fwrite(hdr, 1, 32, kl->save) != 32)
            return k3_fail(d, K3_ERR_IO, "cannot write '%s'", kl->save_name);
        if (kl->base) {
            if (fread(bh, 1, 32, kl->base) != 32 || memcmp(bh, "K3LOGIT1", 8))
                return k3_fail(d, K3_ERR_FORMAT, "'%s' is not a k3run --save-logits file", kl->base_name);
            if (memcmp(bh, hdr, 32))
                return k3_fail(d, K3_ERR_USAGE, "'%s' holds the logits of another text, vocabulary, --context or "
                               "--chunks: run both with the same FILE, --context and --chunks", kl->base_name);
            brow = malloc((size_t)V * sizeof *brow);
            kls = malloc(((size_t)chunks * (context - 1 - first) + 1) * sizeof *kls);
            if (!brow || !kls) { free(brow); free(kls); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
        }
    }
    for (uint32_t c = 0; c < chunks; c++) {
        const int32_t *chunk = ids + (size_t)c * context;
        k3_model_reset(m);
        for (uint32_t b0 = 0; b0 < context; b0 += B) {
            if (stop && *stop) {
                r->interrupted = 1;
                goto done;
            }
            uint32_t T = context - b0 < B ? context - b0 : B;
            if ((e = k3_model_forward(m, chunk + b0, T, d))) {
                k3_diag_wrap(d, "perplexity, chunk %u", c + 1);
                goto done;
            }
            for (uint32_t i = 0; i < T; i++) {
                uint32_t p = b0 + i;                       /* position in the chunk */
                if (p < first || p + 1 >= context) continue;
                const float *row = k3_model_logits_row(m, i);
                if (kl && kl->save && fwrite(row, sizeof *row, V, kl->save) != V) {
                    e = k3_fail(d, K3_ERR_IO, "cannot write '%s'", kl->save_name);
                    goto done;
                }
                if (kl && kl->base) {
                    if (fread(brow, sizeof *brow, V, kl->base) != V) {
                        e = k3_fail(d, K3_ERR_FORMAT, "'%s' ends early: not a whole base file", kl->base_name);
                        goto done;
                    }
                    int s;
                    kls[n_kl++] = kl_row(brow, row, V, &s);
                    same += (uint64_t)s;
                }
                double v = nll_of(row, V, chunk[p + 1]);
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
    if (kl && n_kl) {
        double s = 0.0, s2 = 0.0;
        for (uint64_t i = 0; i < n_kl; i++) {
            s += kls[i];
            s2 += kls[i] * kls[i];
        }
        qsort(kls, n_kl, sizeof *kls, cmp_double);
        double mean = s / (double)n_kl, var = s2 / (double)n_kl - mean * mean;
        kl->rows = n_kl;
        kl->kl_mean = mean;
        kl->kl_stderr = var > 0 && n_kl > 1 ? sqrt(var / (double)(n_kl - 1)) : 0.0;
        kl->kl_p99 = kls[(uint64_t)ceil(0.99 * (double)n_kl) - 1];
        kl->kl_max = kls[n_kl - 1];
        kl->top1 = (double)same / (double)n_kl;
    }
    free(brow);
    free(kls);
    return e;
}

void k3_ppl_print(const k3_ppl_result *r, const k3_ppl_info *info, const k3_ppl_kl *kl, int json, FILE *out)
{
    int have_kl = kl && kl->base && kl->rows;
    if (!json) {
        fprintf(out, "Final estimate: PPL = %.4f +/- %.5f\n", r->ppl, r->ppl_stderr);
        if (have_kl)
            fprintf(out, "KL divergence from '%s': mean %.6f +/- %.6f, 99%% %.6f, max %.6f nats; same top token "
                    "%.3f %% (%llu tokens)\n", kl->base_name, kl->kl_mean, kl->kl_stderr, kl->kl_p99, kl->kl_max,
                    100.0 * kl->top1, (unsigned long long)kl->rows);
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
    if (have_kl) {
        json_object_set_new(doc, "kl_mean", json_real(kl->kl_mean));
        json_object_set_new(doc, "kl_stderr", json_real(kl->kl_stderr));
        json_object_set_new(doc, "kl_p99", json_real(kl->kl_p99));
        json_object_set_new(doc, "kl_max", json_real(kl->kl_max));
        json_object_set_new(doc, "top1_agreement", json_real(kl->top1));
        json_object_set_new(doc, "kl_tokens", json_integer((json_int_t)kl->rows));
    }
    json_object_set_new(doc, "interrupted", json_boolean(r->interrupted));
    json_object_set_new(doc, "seconds", json_real(r->seconds));
    json_object_set_new(doc, "load_seconds", json_real(info->load_seconds));
    json_object_set_new(doc, "bytes_read", json_integer((json_int_t)info->bytes_read));
    json_object_set_new(doc, "budget_bytes", json_integer((json_int_t)info->budget));
    json_object_set_new(doc, "isa", json_string(info->isa));
    if (info->trunk) json_object_set_new(doc, "trunk", json_string(info->trunk));
    json_object_set_new(doc, "threads", json_integer(info->threads));
    json_dumpf(doc, out, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    fputc('\n', out);
    json_decref(doc);
}

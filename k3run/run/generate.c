/* generate.c - see generate.h. */
#include "generate.h"

#include <stdlib.h>
#include <string.h>

#include "k3_sys.h"

/* Length of the sequence a lead byte starts (0: not a valid lead byte). */
static int utf8_len(uint8_t b)
{
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
}

/* Can c be byte `pos` (1..) of a sequence starting with lead? (RFC 3629 ranges) */
static int utf8_cont_ok(uint8_t lead, int pos, uint8_t c)
{
    if (pos == 1) {
        if (lead == 0xE0) return c >= 0xA0 && c <= 0xBF;
        if (lead == 0xED) return c >= 0x80 && c <= 0x9F;
        if (lead == 0xF0) return c >= 0x90 && c <= 0xBF;
        if (lead == 0xF4) return c >= 0x80 && c <= 0x8F;
    }
    return c >= 0x80 && c <= 0xBF;
}

void k3_utf8_out_put(k3_utf8_out *o, const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t c = b[i];
        if (o->np) {
            if (utf8_cont_ok(o->pend[0], o->np, c)) {
                o->pend[o->np++] = c;
                if (o->np == utf8_len(o->pend[0])) {
                    fwrite(o->pend, 1, (size_t)o->np, o->f);
                    o->written += (uint64_t)o->np;
                    o->np = 0;
                }
                continue;
            }
            fwrite(o->pend, 1, (size_t)o->np, o->f);      /* can never become valid: as it is */
            o->written += (uint64_t)o->np;
            o->np = 0;
        }
        int len = utf8_len(c);
        if (len > 1) {
            o->pend[0] = c;
            o->np = 1;
        } else {
            fputc(c, o->f);
            o->written++;
        }
    }
    fflush(o->f);
}

void k3_utf8_out_flush(k3_utf8_out *o)
{
    if (o->np) fwrite(o->pend, 1, (size_t)o->np, o->f);
    o->written += (uint64_t)o->np;
    o->np = 0;
    fflush(o->f);
}

k3_err k3_generate(k3_model *m, const k3_tok *tok, const int32_t *prompt, uint32_t n_prompt,
                   const k3_gen_opts *o, FILE *out, volatile sig_atomic_t *stop, int32_t *gen,
                   k3_gen_stats *st, k3_diag *d)
{
    double *t_tok = st->t_tok;
    memset(st, 0, sizeof *st);
    st->t_tok = t_tok;
    st->n_prompt = n_prompt;
    if (n_prompt == 0) return k3_fail(d, K3_ERR_USAGE, "the prompt is empty");
    if ((uint64_t)n_prompt + (o->n_predict ? o->n_predict - 1 : 0) > k3_model_context(m))
        return k3_fail(d, K3_ERR_USAGE, "the prompt (%u tokens) and %u generated tokens do not fit the context "
                       "of %u positions: use a larger --context or a smaller -n", n_prompt, o->n_predict,
                       k3_model_context(m));
    k3_sampler smp;
    k3_err e = k3_sampler_init(&smp, &o->sampler, k3_model_vocab(m), d);
    if (e) return e;
    int32_t *hist = malloc(((size_t)k3_model_context(m) + 1) * sizeof *hist);   /* [context + 1] */
    if (!hist) {
        k3_sampler_free(&smp);
        return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    }
    k3_model_reset(m);
    k3_utf8_out w = {.f = out};
    double t0 = k3_now();
    uint32_t B = 0;
    for (uint32_t i = 0; i < n_prompt && !e; i += B) {
        B = n_prompt - i;
        if (B > k3_model_max_batch(m)) B = k3_model_max_batch(m);
        e = k3_model_forward(m, prompt + i, B, d);
        if (stop && *stop) break;
    }
    for (uint32_t i = 0; i < n_prompt; i++) k3_sampler_accept(&smp, prompt[i]);
    memcpy(hist, prompt, n_prompt * sizeof *hist);
    k3_decoder dc;
    k3_dec_learn learn = {.rho_plan = o->rho};
    k3_dec_init(&dc, m, &smp, hist, n_prompt, k3_model_context(m) + 1, o->max_draft, &learn);
    double t1 = k3_now();
    st->t_prompt = t1 - t0;
    if (o->on_step && !e) o->on_step(o->step_ctx, -1);
    while (!e && st->n_gen < o->n_predict && !(stop && *stop)) {
        double ts = k3_now();
        int32_t id;
        if ((e = k3_dec_next(&dc, o->n_predict - st->n_gen, &id, d))) break;
        gen[st->n_gen++] = id;
        if (st->t_tok) st->t_tok[st->n_gen - 1] = k3_now() - ts;
        if (id == o->eos) {
            st->stopped_eos = 1;
            if (o->on_step) o->on_step(o->step_ctx, st->n_gen - 1);
            break;
        }
        if (!o->print_ids) {
            size_t len = 0;
            const uint8_t *b = k3_tok_bytes(tok, id, &len);
            if (b) k3_utf8_out_put(&w, b, len);
        }
        if (o->on_step) o->on_step(o->step_ctx, st->n_gen - 1);
    }
    if (!e) e = k3_dec_finish(&dc, d);
    st->dec = dc.stats;
    free(hist);
    st->t_gen = k3_now() - t1;
    if (stop && *stop) st->interrupted = 1;
    if (o->print_ids) {
        for (uint32_t i = 0; i < st->n_gen; i++) fprintf(out, i ? " %d" : "%d", (int)gen[i]);
        fputc('\n', out);
        fflush(out);
    } else {
        k3_utf8_out_flush(&w);
    }
    k3_sampler_free(&smp);
    return e;
}

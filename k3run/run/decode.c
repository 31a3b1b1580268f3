/* decode.c - see decode.h. */
#include "decode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "draft.h"

/* The two constants of rho: how much a byte read from disk costs beside one read from memory
   (NVMe at ~7 GB/s, DRAM at ~45 GB/s), and the compute a token adds to a pass over reading the
   weights it uses once from memory (3: measured on the demo model in memory, where a verify pass
   of 1 + K tokens costs about 1 + 0.77 K one-token passes; docs/PERFORMANCE.md). */
#define DISK_WEIGHT 8.0
#define COMPUTE_PER_BYTE 3.0

double k3_dec_rho(const k3_plan *p, const k3_geometry *g)
{
    double stride = (double)g->expert_stride, ek = (double)g->n_moe_layers * g->top_k;   /* experts/token */
    double miss = p->experts_all_resident ? 0.0 : p->expert_reads_per_token;          /* of ek */
    double experts = (ek - miss) * stride + DISK_WEIGHT * miss * stride;
    double trunk = (double)p->trunk_resident + DISK_WEIGHT * (double)p->trunk_streamed;
    double used = (double)g->trunk_bytes + ek * stride;                               /* weights a token uses */
    double one = trunk + experts + COMPUTE_PER_BYTE * used;
    double more = experts + COMPUTE_PER_BYTE * used;
    return one > 0 ? more / one : 1.0;
}

void k3_dec_init(k3_decoder *dc, k3_model *m, k3_sampler *s, int32_t *hist, uint32_t n, uint32_t cap,
                 uint32_t max_draft, k3_dec_learn *learn)
{
    *dc = (k3_decoder){.m = m, .s = s, .hist = hist, .n = n, .cap = cap, .learn = learn, .st = K3_DEC_READY};
    uint32_t mv = k3_model_max_verify(m);
    if (max_draft > K3_DRAFT_MAX) max_draft = K3_DRAFT_MAX;
    if (mv < 2) max_draft = 0;
    else if (max_draft > mv - 1) max_draft = mv - 1;
    dc->max_draft = max_draft;
    /* tests only (K3_DRAFT_TEST): "full" drafts as long as the sequence offers (no length rule);
       "oracle:ID,ID,..." drafts the given continuation of the prompt instead (the ids plain
       decoding wrote: every draft right); "spoil" (alone or as "oracle-spoil:...") then
       changes one drafted token per pass, at offset 0, 1, ... in turn, so a verify pass is
       rolled back at every offset of a draft */
    static int32_t oracle[4096];
    const char *t = getenv("K3_DRAFT_TEST");
    dc->test = 0;
    if (t && *t) {
        dc->test = strstr(t, "spoil") ? 2 : 1;
        const char *c = strchr(t, ':');
        dc->n_oracle = 0;
        dc->oracle = c ? oracle : NULL;
        while (c && *c && dc->n_oracle < 4096) {
            char *end;
            long v = strtol(c + 1, &end, 10);
            if (end == c + 1) break;
            oracle[dc->n_oracle++] = (int32_t)v;
            c = end;
        }
    }
}

/* A test's oracle draft (K3_DRAFT_TEST=oracle:...): what follows the returned tokens. */
static uint32_t oracle_draft(const k3_decoder *dc, uint32_t kmax, int32_t *out)
{
    uint32_t at = (uint32_t)dc->stats.tokens, k = 0;      /* returned so far: the next is oracle[at] */
    while (k < kmax && at + k < dc->n_oracle) { out[k] = dc->oracle[at + k]; k++; }
    return k;
}

void k3_dec_fed(k3_decoder *dc, uint32_t n)
{
    dc->n = n;
    dc->st = K3_DEC_READY;
    dc->has_next = 0;
}

uint32_t k3_dec_pos(const k3_decoder *dc) { return dc->st == K3_DEC_READY ? dc->n : dc->n - 1; }

/* The draft length for drafts from a match of class c, at most kmax: argmax E(K)/cost(1+K). */
static uint32_t draft_len(const k3_decoder *dc, uint32_t c, uint32_t kmax)
{
    const k3_dec_learn *l = dc->learn;
    double a = (l->acc[c] + 1.0) / (l->tested[c] + 2.0), e = 1.0, ak = 1.0, best = 1.0, r = l->rho_plan;
    uint32_t bk = 0;
    for (uint32_t k = 1; k <= kmax; k++) {
        ak *= a;
        e += ak;
        double v = e / (1.0 + k * r);
        if (v > best * (1.0 + 1e-9)) { best = v; bk = k; }
    }
    return bk;
}

/* Feed the pending token hist[n - 1]: alone, or with drafts in a verify pass. */
static k3_err start_pass(k3_decoder *dc, uint32_t want, k3_diag *d)
{
    k3_model *m = dc->m;
    uint32_t room = k3_model_context(m) - k3_model_pos(m);      /* positions left */
    if (room == 0)
        return k3_fail(d, K3_ERR_USAGE, "the context is full (%u positions): use a larger --context",
                       k3_model_context(m));
    uint32_t kmax = dc->max_draft;
    if (kmax > room - 1) kmax = room - 1;
    if (kmax > (want ? want - 1 : 0)) kmax = want ? want - 1 : 0;
    uint32_t K = 0, match = 0;
    dc->has_next = 0;
    if (dc->max_draft) {                             /* looked up even where nothing can be drafted (kmax 0) */
        int32_t prop[K3_DRAFT_MAX + 1];              /* [kmax + 1] the proposal: the drafts, then the token after */
        uint32_t L;
        if (dc->oracle) L = oracle_draft(dc, kmax + 1, prop), match = 1;
        else L = k3_draft_lookup(dc->hist, dc->n, 1, K3_DRAFT_NGRAM_MAX, kmax + 1, prop, &match);
        if (L) {
            dc->cls = match - 1;
            K = L < kmax ? L : kmax;
            if (!dc->test) K = draft_len(dc, dc->cls, K);
            if (L > K) {                             /* not drafted: compared with the token after the drafts */
                dc->next = prop[K];
                dc->has_next = 1;
            }
            memcpy(dc->batch + 1, prop, K * sizeof *prop);
            if (K && dc->test == 2 && dc->stats.verify_passes % (K + 1) < K) {
                int32_t *b = dc->batch + 1 + dc->stats.verify_passes % (K + 1);
                *b = (int32_t)(((uint32_t)*b + 1) % k3_model_vocab(m));
            }
        }
    }
    dc->batch[0] = dc->hist[dc->n - 1];
    if (K == 0) {
        dc->st = K3_DEC_READY;
        return k3_model_forward(m, dc->batch, 1, d);
    }
    dc->T = 1 + K;
    dc->cur = 0;
    dc->stats.passes++;
    dc->stats.verify_passes++;
    dc->stats.drafted += K;
    dc->st = K3_DEC_OPEN;
    return k3_model_verify(m, dc->batch, dc->T, d);
}

k3_err k3_dec_next(k3_decoder *dc, uint32_t want, int32_t *id, k3_diag *d)
{
    k3_err e;
    if (dc->n >= dc->cap) return k3_fail(d, K3_ERR_INTERNAL, "decoder: the sequence holds %u tokens", dc->cap);
    if (dc->st == K3_DEC_PENDING && (e = start_pass(dc, want, d))) return e;
    if (dc->st == K3_DEC_READY) dc->stats.passes++;  /* the pass (prompt, forced ids, one token) behind them */
    const float *logits = dc->st == K3_DEC_OPEN ? k3_model_logits_row(dc->m, dc->cur) : k3_model_logits(dc->m);
    int32_t y = k3_sampler_next(dc->s, logits);
    k3_sampler_accept(dc->s, y);
    dc->hist[dc->n++] = y;
    dc->stats.tokens++;
    *id = y;
    if (dc->has_next && (dc->st != K3_DEC_OPEN || dc->cur + 1 == dc->T)) {
        dc->has_next = 0;                            /* the row after the drafts: y against the proposal's */
        dc->learn->tested[dc->cls]++;                /* next token, a test that cost no pass */
        if (y == dc->next) dc->learn->acc[dc->cls]++;
    }
    if (dc->st == K3_DEC_OPEN) {
        uint32_t c = dc->cur;                        /* rows sampled before this one */
        int more = c + 1 < dc->T && y == dc->batch[c + 1];
        if (c + 1 < dc->T) dc->learn->tested[dc->cls]++;
        if (more) {
            dc->learn->acc[dc->cls]++;
            dc->stats.accepted++;
            dc->cur = c + 1;
            return K3_OK;                            /* y was fed after row c: the pass goes on */
        }
        dc->stats.kept[c]++;
        if ((e = k3_model_commit(dc->m, c + 1, d))) return e;   /* keep batch[0 .. c] */
    }
    dc->st = K3_DEC_PENDING;
    return K3_OK;
}

k3_err k3_dec_settle(k3_decoder *dc, k3_diag *d)
{
    k3_err e = K3_OK;
    if (dc->st == K3_DEC_OPEN) {
        dc->stats.kept[dc->cur]++;
        e = k3_model_commit(dc->m, dc->cur + 1, d);
    }
    else if (dc->st == K3_DEC_PENDING) e = k3_model_forward(dc->m, dc->hist + dc->n - 1, 1, d);
    dc->st = K3_DEC_READY;
    dc->has_next = 0;
    return e;
}

k3_err k3_dec_finish(k3_decoder *dc, k3_diag *d)
{
    dc->has_next = 0;
    if (dc->st != K3_DEC_OPEN) return K3_OK;
    dc->st = K3_DEC_PENDING;                         /* the last returned token, batch[cur], unfed */
    dc->stats.kept[dc->cur - 1]++;
    return k3_model_commit(dc->m, dc->cur, d);
}

/*
 * seq_exact.c - many sequences in one pass, at the engine (issue 33): every
 * sequence's logits, bit for bit, are the ones it gets alone.
 *
 *   seq_exact PACK BUDGET THREADS S [STEPS]
 *
 * BUDGET in bytes, or "min": the least budget from the planner's minimum up, in
 * steps of 256 KiB, whose plan has room for the verify pass (at the minimum
 * the planner leaves it out), which streams the trunk wherever the pack's
 * trunk is larger than its stream buffers.
 * The model holds S sequences (k3_load_opts.n_seq). First each sequence runs
 * alone on sequence 0, with plain forward calls: its prompt (its own ids and
 * length) in chunks, then STEPS greedy tokens one at a time; the XXH3-64 of
 * every logits row and the greedy ids are kept. Then all of them share passes
 * (k3_model_pass): sequence i joins at pass 2i; each pass takes, for every
 * sequence in turn while the plan's batch has room, a chunk of its prompt
 * (sizes varying by pass and sequence), its next token, or, where the plan
 * has a verify pass, a verify of its next token and drafted ones (the greedy
 * ids it gets alone, one of them sometimes wrong), committed up to the first
 * wrong one. Every logits row a pass computes must hash as the same row
 * alone. Then sequence 1's session, saved part way through the shared run
 * (k3_session_save on its handle), is loaded into sequence 0, which goes on
 * alone to the end: again the same rows.
 *
 * Exit 0 when every row matched, 1 at the first that did not (named), 2 on
 * a usage or load error.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3_hash.h"
#include "load.h"
#include "session.h"

#define MAX_S 8
#define MAX_STEPS 64
#define MAX_PROMPT 48

typedef struct seqref {
    int32_t prompt[MAX_PROMPT];  /* [n_prompt] its prompt's ids */
    uint32_t n_prompt;
    int32_t id[MAX_STEPS + 1];    /* [steps + 1] the greedy ids alone: id[j] from logits row j */
    uint64_t h[MAX_STEPS + 1];    /* [steps + 1] XXH3-64 of logits row j (row 0: the prompt's end) */
} seqref;

static int32_t argmax(const float *x, uint32_t n)
{
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

static int fail(const char *what, const k3_diag *d)
{
    fprintf(stderr, "seq_exact: %s: %s\n", what, d ? d->msg : "");
    return 2;
}

/* Sequence i alone on handle m (reset first): prompt in chunks of c, then steps tokens. */
static int run_alone(k3_model *m, seqref *r, uint32_t steps, uint32_t c)
{
    k3_diag d;
    uint32_t V = k3_model_vocab(m);
    k3_model_reset(m);
    for (uint32_t i = 0; i < r->n_prompt; i += c) {
        uint32_t t = r->n_prompt - i < c ? r->n_prompt - i : c;
        if (k3_model_forward(m, r->prompt + i, t, &d)) return fail("forward alone", &d);
    }
    for (uint32_t j = 0; j <= steps; j++) {
        const float *lg = k3_model_logits(m);
        r->h[j] = k3_xxh3_64(lg, V * sizeof *lg);
        r->id[j] = argmax(lg, V);
        if (j < steps && k3_model_forward(m, &r->id[j], 1, &d)) return fail("forward alone", &d);
    }
    return 0;
}

/* The shared run's state of one sequence. */
typedef struct seqrun {
    k3_model *h;
    uint32_t fed;                 /* prompt ids processed */
    uint32_t g;                   /* logits rows matched so far (0..steps + 1) */
    int32_t rows[MAX_STEPS + 2];  /* this pass's ids */
    uint32_t T, verify;
} seqrun;

static int check_row(const seqref *r, uint32_t s, uint32_t j, const float *lg, uint32_t V, unsigned pass)
{
    if (k3_xxh3_64(lg, V * sizeof *lg) == r->h[j]) return 0;
    fprintf(stderr, "seq_exact: sequence %u, logits row %u (pass %u): not the row it gets alone\n", s, j, pass);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: seq_exact PACK BUDGET THREADS S [STEPS]\n");
        return 2;
    }
    const uint32_t S = (uint32_t)atoi(argv[4]), steps = argc > 5 ? (uint32_t)atoi(argv[5]) : 24;
    if (S < 1 || S > MAX_S || steps < 4 || steps > MAX_STEPS) return fail("S in 1..8, STEPS in 4..64", NULL);
    omp_set_num_threads(atoi(argv[3]));
    const int at_min = !strcmp(argv[2], "min");
    k3_load_opts o = {.pack = argv[1], .budget = at_min ? 1ull << 40 : strtoull(argv[2], NULL, 10), .context = 256,
                      .batch = 16, .n_seq = S, .spec_tokens = 6, .verify_reads = 1};
    k3_loaded ld;
    memset(&ld, 0, sizeof ld);
    k3_diag d;
    int usage = 0;
    if (k3_isa_choose(getenv("K3_ISA"), &o.isa, &d)) return fail("K3_ISA", &d);
    for (int i = 0; at_min; i++) {                    /* the least budget with a verify pass */
        if (k3_load_plan(&o, &ld, &usage, &d)) return fail(argv[1], &d);
        int done = i > 0 && ld.plan.verify_tokens;
        uint64_t next = i == 0 ? ld.plan.minimum : o.budget + (256u << 10);
        if (done) break;
        k3_loaded_free(&ld);
        memset(&ld, 0, sizeof ld);
        if (i > 64) return fail("no room for a verify pass within 16 MiB of the minimum", NULL);
        o.budget = next;
    }
    if ((!at_min && k3_load_plan(&o, &ld, &usage, &d)) || k3_load_model(&o, &ld, &d)) return fail(argv[1], &d);
    printf("seq_exact: budget %llu bytes (minimum %llu): %u of %u trunk units streamed\n",
           (unsigned long long)o.budget, (unsigned long long)ld.plan.minimum, ld.plan.n_streamed, ld.plan.n_units);
    k3_model *m = ld.m;
    const uint32_t V = k3_model_vocab(m), B = k3_model_max_batch(m), MV = k3_model_max_verify(m);
    static seqref ref[MAX_S];
    for (uint32_t s = 0; s < S; s++) {                /* prompts of their own ids and lengths */
        ref[s].n_prompt = 5 + 7 * s % MAX_PROMPT;
        for (uint32_t i = 0; i < ref[s].n_prompt; i++)
            ref[s].prompt[i] = (int32_t)((s * 7919u + i * 104729u + 13u) % V);
        if (run_alone(m, &ref[s], steps, 1 + s % 5)) return 2;
    }
    printf("seq_exact: %u sequences alone; batch %u, verify %u, %s\n", S, B, MV, k3_isa_name(o.isa));
    /* all together */
    seqrun run[MAX_S];
    for (uint32_t s = 0; s < S; s++) {
        run[s] = (seqrun){.h = k3_model_seq(m, s)};
        k3_model_reset(run[s].h);
    }
    k3_session saved = {0};
    const char *tmp = getenv("TMPDIR");
    char spath[4096];
    snprintf(spath, sizeof spath, "%s/seq_exact.%d.k3session", tmp && *tmp ? tmp : "/tmp", (int)getpid());
    int32_t hist[MAX_PROMPT + MAX_STEPS + 2];         /* [pos] sequence 1's ids, for its session */
    uint32_t passes = 0, shared = 0, verified = 0, session_at = 0;
    for (unsigned pass = 0;; pass++) {
        k3_model_rows rw[MAX_S];
        uint32_t who[MAX_S], n = 0, rows = 0, live = 0;
        for (uint32_t k = 0; k < S; k++) {
            uint32_t s = (k + pass) % S;              /* a different sequence first each pass */
            seqrun *q = &run[s];
            const seqref *r = &ref[s];
            if (pass < 2 * s || q->g > steps) continue;
            live++;
            uint32_t room = B - rows;
            if (!room) continue;
            q->verify = 0;
            if (q->fed < r->n_prompt) {               /* a chunk of the prompt */
                uint32_t c = 1 + (pass * 3 + s) % 11, left = r->n_prompt - q->fed;
                q->T = c < left ? c : left;
                if (q->T > room) q->T = room;
                memcpy(q->rows, r->prompt + q->fed, q->T * sizeof *q->rows);
            } else if (MV >= 2 && (pass + s) % 3 == 0 && q->g + 2 <= steps) {
                /* a verify pass: the next token and drafts; one drafted id wrong every other time */
                uint32_t K = MV - 1, left = steps - q->g;
                if (K > left) K = left;
                if (K + 1 > room) continue;
                q->T = K + 1;
                q->verify = 1;
                q->rows[0] = r->id[q->g - 1];
                for (uint32_t k2 = 1; k2 <= K; k2++) q->rows[k2] = r->id[q->g - 1 + k2];
                if (pass % 2) q->rows[1 + pass % K] = (q->rows[1 + pass % K] + 1) % (int32_t)V;
            } else {                                  /* the next token */
                q->T = 1;
                q->rows[0] = r->id[q->g - 1];
            }
            rw[n] = (k3_model_rows){q->h, q->rows, q->T, (int)q->verify};
            who[n++] = s;
            rows += q->T;
        }
        if (!live) break;
        if (!n) return fail("a pass with nothing to run", NULL);
        if (k3_model_pass(m, rw, n, &d)) return fail("k3_model_pass", &d);
        passes++;
        shared += n > 1;
        for (uint32_t j = 0; j < n; j++) {
            uint32_t s = who[j];
            seqrun *q = &run[s];
            const seqref *r = &ref[s];
            if (q->fed < r->n_prompt) {
                q->fed += q->T;
                if (q->fed < r->n_prompt) continue;
                if (check_row(r, s, 0, k3_model_logits(q->h), V, pass)) return 1;
                q->g = 1;
            } else if (!q->verify) {
                if (check_row(r, s, q->g, k3_model_logits(q->h), V, pass)) return 1;
                q->g++;
            } else {
                uint32_t keep = 1;                    /* the fed token, then each right draft */
                while (keep < q->T && q->rows[keep] == r->id[q->g - 1 + keep]) keep++;
                for (uint32_t k2 = 0; k2 < keep; k2++)   /* rows past a wrong draft are not compared */
                    if (check_row(r, s, q->g + k2, k3_model_logits_row(q->h, k2), V, pass)) return 1;
                if (k3_model_commit(q->h, keep, &d)) return fail("k3_model_commit", &d);
                if (check_row(r, s, q->g + keep - 1, k3_model_logits(q->h), V, pass)) return 1;
                q->g += keep;
                verified += n > 1;
            }
            if (s == 1 && !session_at && q->g >= steps / 2 && q->g <= steps) {
                /* sequence 1's session, part way */
                uint32_t pos = k3_model_pos(q->h);
                memcpy(hist, r->prompt, r->n_prompt * sizeof *hist);
                for (uint32_t i = r->n_prompt; i < pos; i++) hist[i] = r->id[i - r->n_prompt];
                k3_session ss = {.tokens = hist, .n_tokens = pos};
                if (k3_session_save(spath, q->h, ld.w, argv[1], &ss, NULL, &d)) return fail("k3_session_save", &d);
                session_at = q->g;
            }
        }
    }
    printf("seq_exact: %u passes, %u of them shared, %u verify passes beside others: every row as alone\n",
           passes, shared, verified);
    if (S > 1 && !shared) return fail("no pass carried two sequences", NULL);
    if (S > 1 && session_at) {                        /* sequence 1's session, loaded into sequence 0 */
        k3_model *h0 = k3_model_seq(m, 0);
        k3_model_reset(h0);
        if (k3_session_load(spath, h0, ld.w, argv[1], &saved, &d)) return fail("k3_session_load", &d);
        remove(spath);
        k3_session_free(&saved);
        if (check_row(&ref[1], 1, session_at - 1, k3_model_logits(h0), V, 0)) return 1;
        for (uint32_t j = session_at; j <= steps; j++) {
            if (k3_model_forward(h0, &ref[1].id[j - 1], 1, &d)) return fail("forward", &d);
            if (check_row(&ref[1], 1, j, k3_model_logits(h0), V, 0)) return 1;
        }
        printf("seq_exact: sequence 1's session at row %u, loaded into sequence 0: the same rows to the end\n",
               session_at - 1);
    }
    k3_loaded_free(&ld);
    return 0;
}

/* batch.c - passes shared between threads (batch.h). */
#include "batch.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "model_impl.h"

enum { OP_FORWARD = 0, OP_VERIFY = 1, OP_COMMIT = 2 };

/* One handle's waiting call. */
typedef struct sub {
    int waiting;                  /* a call is in the batcher */
    int attached;
    int op;
    const int32_t *ids;           /* [T] */
    uint32_t T, done;             /* tokens, of them processed (a forward call may take several passes) */
    uint32_t skipped;             /* passes run without it while it waited: first in the next */
    int picked;                   /* in the pass being built, or tried and not fitting */
    k3_err err;
    k3_diag d;
} sub;

struct k3_batcher {
    k3_model *m;
    uint32_t rows, n_seq;
    pthread_mutex_t mu;
    pthread_cond_t work;          /* the engine: a call arrived, or stop */
    pthread_cond_t done;          /* the callers: a pass finished */
    sub *subs;                    /* [n_seq] by sequence */
    uint32_t attached, waiting;
    int stop;
    k3_batch_stats st;
    k3_model_rows *r;             /* [n_seq] a pass's groups */
    uint32_t *who;                /* [n_seq] their sequences */
};

static k3_err submit(void *ctx, k3_model *h, const int32_t *ids, uint32_t T, int op, k3_diag *d);

k3_err k3_batcher_new(k3_model *m, uint32_t rows, k3_batcher **out, k3_diag *d)
{
    *out = NULL;
    m = k3_owner(m);
    if (m->o.all_logits) return k3_fail(d, K3_ERR_USAGE, "passes are not shared with every token's logits (--dump)");
    k3_batcher *b = calloc(1, sizeof *b);
    uint32_t S = k3_model_n_seq(m);
    if (!b || !(b->subs = calloc(S, sizeof *b->subs)) || !(b->r = calloc(S, sizeof *b->r)) ||
        !(b->who = calloc(S, sizeof *b->who))) {
        if (b) { free(b->subs); free(b->r); }
        free(b);
        return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    }
    b->m = m;
    b->n_seq = S;
    b->rows = rows && rows < m->o.max_batch ? rows : m->o.max_batch;
    if (b->rows < m->o.max_verify) b->rows = m->o.max_verify;           /* a verify pass goes whole */
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->work, NULL);
    pthread_cond_init(&b->done, NULL);
    for (uint32_t s = 0; s < S; s++) {
        k3_model *h = k3_model_seq(m, s);
        h->hook = submit;
        h->hook_ctx = b;
    }
    *out = b;
    return K3_OK;
}

void k3_batcher_free(k3_batcher *b)
{
    if (!b) return;
    for (uint32_t s = 0; s < b->n_seq; s++) {
        k3_model *h = k3_model_seq(b->m, s);
        h->hook = NULL;
        h->hook_ctx = NULL;
    }
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->work);
    pthread_cond_destroy(&b->done);
    free(b->subs);
    free(b->r);
    free(b->who);
    free(b);
}

static uint32_t seq_of(const k3_batcher *b, const k3_model *h) { return k3_model_seq_index(h) % b->n_seq; }

void k3_batcher_attach(k3_batcher *b, k3_model *h)
{
    pthread_mutex_lock(&b->mu);
    sub *s = &b->subs[seq_of(b, h)];
    if (!s->attached) { s->attached = 1; b->attached++; }
    pthread_mutex_unlock(&b->mu);
}

void k3_batcher_detach(k3_batcher *b, k3_model *h)
{
    pthread_mutex_lock(&b->mu);
    sub *s = &b->subs[seq_of(b, h)];
    if (s->attached) { s->attached = 0; b->attached--; }
    pthread_cond_signal(&b->work);                /* the others may be all that is left */
    pthread_mutex_unlock(&b->mu);
}

/* A handle's call (its hook: model_impl.h): wait in the batcher until a pass or a commit did it. */
static k3_err submit(void *ctx, k3_model *h, const int32_t *ids, uint32_t T, int op, k3_diag *d)
{
    k3_batcher *b = ctx;
    pthread_mutex_lock(&b->mu);
    sub *s = &b->subs[seq_of(b, h)];
    if (b->stop || !s->attached) {
        pthread_mutex_unlock(&b->mu);
        return k3_fail(d, K3_ERR_INTERNAL, b->stop ? "the batcher has stopped" : "a pass from a sequence not attached");
    }
    s->op = op;
    s->ids = ids;
    s->T = T;
    s->done = 0;
    s->err = K3_OK;
    s->waiting = 1;
    b->waiting++;
    pthread_cond_signal(&b->work);
    while (s->waiting) pthread_cond_wait(&b->done, &b->mu);
    k3_err e = s->err;
    if (e && d) *d = s->d;
    pthread_mutex_unlock(&b->mu);
    return e;
}

/* Finish a call (under the lock). */
static void finish(k3_batcher *b, sub *s, k3_err e, const k3_diag *d)
{
    s->err = e;
    if (e && d) s->d = *d;
    s->waiting = 0;
    b->waiting--;
}

/* With the lock held and every attached handle waiting (or stopping with calls left): run the
   commits, then one pass of the waiting verify and forward calls. The lock is released during
   the pass; the callers in it wait for it. */
static void step(k3_batcher *b)
{
    k3_diag d;
    for (uint32_t q = 0; q < b->n_seq; q++) {                      /* commits: memory, no pass */
        sub *s = &b->subs[q];
        if (!s->waiting || s->op != OP_COMMIT) continue;
        memset(&d, 0, sizeof d);
        k3_err e = k3_model_commit_now(k3_model_seq(b->m, q), s->T, &d);
        b->st.commits++;
        finish(b, s, e, &d);
    }
    /* waiting longest first, then verify calls (whole), then forward calls with fewest tokens left,
       up to the rows of a pass */
    uint32_t n = 0, rows = 0;
    for (uint32_t q = 0; q < b->n_seq; q++) b->subs[q].picked = 0;
    while (rows < b->rows) {
        sub *best = NULL;
        uint32_t bq = 0;
        for (uint32_t q = 0; q < b->n_seq; q++) {
            sub *s = &b->subs[q];
            if (!s->waiting || s->op == OP_COMMIT || s->picked) continue;
            if (!best || s->skipped > best->skipped ||
                (s->skipped == best->skipped && (s->op > best->op ||
                 (s->op == best->op && s->T - s->done < best->T - best->done)))) { best = s; bq = q; }
        }
        if (!best) break;
        best->picked = 1;
        uint32_t left = best->T - best->done;
        if (best->op == OP_VERIFY && rows + left > b->rows) continue;       /* a verify pass goes whole */
        uint32_t take = left < b->rows - rows ? left : b->rows - rows;
        b->r[n] = (k3_model_rows){k3_model_seq(b->m, bq), best->ids + best->done, take, best->op == OP_VERIFY};
        b->who[n++] = bq;
        rows += take;
    }
    for (uint32_t q = 0; q < b->n_seq; q++) {
        sub *s = &b->subs[q];
        int in = 0;
        for (uint32_t j = 0; j < n; j++) in |= b->who[j] == q;
        if (s->waiting && s->op != OP_COMMIT) s->skipped = in ? 0 : s->skipped + 1;
    }
    if (n == 0) {
        pthread_cond_broadcast(&b->done);                          /* the commits */
        return;
    }
    pthread_mutex_unlock(&b->mu);
    memset(&d, 0, sizeof d);
    k3_err e = k3_model_pass(b->m, b->r, n, &d);
    pthread_mutex_lock(&b->mu);
    b->st.passes++;
    b->st.rows += rows;
    b->st.groups += n;
    for (uint32_t j = 0; j < n && n > 1; j++)
        if (b->r[j].verify) { b->st.shared_verify++; break; }
    for (uint32_t j = 0; j < n; j++) {
        sub *s = &b->subs[b->who[j]];
        if (s->op == OP_FORWARD && !e) {
            s->done += b->r[j].T;
            if (s->done < s->T) {                                   /* the rest in the next pass */
                b->st.splits++;
                continue;
            }
        }
        finish(b, s, e, &d);
    }
    pthread_cond_broadcast(&b->done);
}

void k3_batcher_run(k3_batcher *b)
{
    pthread_mutex_lock(&b->mu);
    for (;;) {
        if (b->waiting && (b->waiting >= b->attached || b->stop)) {
            step(b);
            continue;
        }
        if (b->stop && !b->waiting) break;
        pthread_cond_wait(&b->work, &b->mu);
    }
    pthread_mutex_unlock(&b->mu);
}

void k3_batcher_stop(k3_batcher *b)
{
    pthread_mutex_lock(&b->mu);
    b->stop = 1;
    pthread_cond_signal(&b->work);
    pthread_mutex_unlock(&b->mu);
}

void k3_batcher_stats(k3_batcher *b, k3_batch_stats *s)
{
    pthread_mutex_lock(&b->mu);
    *s = b->st;
    pthread_mutex_unlock(&b->mu);
}

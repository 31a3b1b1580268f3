/* sampler.c - see sampler.h. */
#define _GNU_SOURCE
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "k3_math.h"

k3_err k3_sampler_check(const k3_sampler_opts *o, k3_diag *d)
{
    if (!(o->temp >= 0.0f) || isinf(o->temp))
        return k3_fail(d, K3_ERR_USAGE, "--temp must be a finite number >= 0 (got %g)", o->temp);
    if (!(o->top_p > 0.0f && o->top_p <= 1.0f))
        return k3_fail(d, K3_ERR_USAGE, "--top-p must be in (0, 1] (got %g)", o->top_p);
    if (!(o->min_p >= 0.0f && o->min_p < 1.0f))
        return k3_fail(d, K3_ERR_USAGE, "--min-p must be in [0, 1) (got %g)", o->min_p);
    if (!(o->repeat_penalty > 0.0f) || isinf(o->repeat_penalty))
        return k3_fail(d, K3_ERR_USAGE, "--repeat-penalty must be a finite number > 0 (got %g)", o->repeat_penalty);
    return K3_OK;
}

uint32_t k3_sampler_u32(k3_sampler *s)
{
    uint64_t old = s->state;
    s->state = old * 6364136223846793005ULL + s->inc;
    uint32_t xs = (uint32_t)(((old >> 18u) ^ old) >> 27u), rot = (uint32_t)(old >> 59u);
    return (xs >> rot) | (xs << ((-rot) & 31));
}

void k3_sampler_seed(k3_sampler *s, uint64_t initstate, uint64_t initseq)
{
    s->inc = (initseq << 1u) | 1u;                                /* pcg32_srandom_r */
    s->state = 0;
    k3_sampler_u32(s);
    s->state += initstate;
    k3_sampler_u32(s);
}

double k3_sampler_uniform(k3_sampler *s)
{
    uint64_t hi = k3_sampler_u32(s) >> 5, lo = k3_sampler_u32(s) >> 6;          /* 27 + 26 bits */
    return (double)(hi * 67108864.0 + lo) / 9007199254740992.0;
}

k3_err k3_sampler_init(k3_sampler *s, const k3_sampler_opts *o, uint32_t vocab, k3_diag *d)
{
    memset(s, 0, sizeof *s);
    k3_err e = k3_sampler_check(o, d);
    if (e) return e;
    s->o = *o;
    s->n = vocab;
    s->val = malloc((size_t)vocab * sizeof *s->val);
    s->order = malloc((size_t)vocab * sizeof *s->order);
    s->seen = calloc(vocab, 1);
    if (!s->val || !s->order || !s->seen) { k3_sampler_free(s); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
    k3_sampler_seed(s, 0x853c49e6748fea9bULL ^ o->seed, o->seed);
    return K3_OK;
}

k3_err k3_sampler_reset(k3_sampler *s, const k3_sampler_opts *o, k3_diag *d)
{
    k3_err e = k3_sampler_check(o, d);
    if (e) return e;
    s->o = *o;
    k3_sampler_seed(s, 0x853c49e6748fea9bULL ^ o->seed, o->seed);
    return K3_OK;
}

void k3_sampler_free(k3_sampler *s)
{
    free(s->val);
    free(s->order);
    free(s->seen);
    s->val = NULL;
    s->order = NULL;
    s->seen = NULL;
}

void k3_sampler_forget(k3_sampler *s)
{
    memset(s->seen, 0, s->n);
}

void k3_sampler_accept(k3_sampler *s, int32_t id)
{
    if (id >= 0 && (uint32_t)id < s->n) s->seen[id] = 1;
}

/* descending value, then ascending id: a total order, so qsort is deterministic */
static int by_value(const void *a, const void *b, void *ctx)
{
    const float *vals = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float vx = vals[x], vy = vals[y];
    if (vx > vy) return -1;
    if (vx < vy) return 1;
    return (x > y) - (x < y);
}

int32_t k3_sampler_next(k3_sampler *s, const float *logits)
{
    uint32_t n = s->n;
    float *v = s->val;
    for (uint32_t i = 0; i < n; i++) {
        float x = logits[i];
        if (x != x) x = -INFINITY;                               /* NaN is never chosen */
        if (s->o.repeat_penalty != 1.0f && s->seen[i]) x = x > 0 ? x / s->o.repeat_penalty : x * s->o.repeat_penalty;
        v[i] = x;
    }
    if (s->o.temp == 0.0f) {                                     /* greedy: lowest id among equal maxima */
        uint32_t best = 0;
        for (uint32_t i = 1; i < n; i++) if (v[i] > v[best]) best = i;
        return (int32_t)best;
    }
    /* candidates sorted by logit; top-k cut */
    for (uint32_t i = 0; i < n; i++) s->order[i] = (int32_t)i;
    qsort_r(s->order, n, sizeof *s->order, by_value, v);
    uint32_t m = s->o.top_k && s->o.top_k < n ? s->o.top_k : n;
    /* softmax at temperature over the candidates, in sorted order */
    float mx = v[s->order[0]];
    if (mx == -INFINITY) return s->order[0];
    double sum = 0;
    for (uint32_t j = 0; j < m; j++) {
        float z = (v[s->order[j]] - mx) / s->o.temp;
        float p = k3_expf(z);
        v[s->order[j]] = p;                                      /* v now holds unnormalised probabilities */
        sum += p;
    }
    /* min-p: drop candidates below min_p * p_max (p_max = 1 before normalising) */
    if (s->o.min_p > 0.0f) {
        uint32_t keep = 1;
        while (keep < m && v[s->order[keep]] >= s->o.min_p) keep++;
        m = keep;
        sum = 0;
        for (uint32_t j = 0; j < m; j++) sum += v[s->order[j]];
    }
    /* top-p: smallest prefix whose mass reaches top_p */
    if (s->o.top_p < 1.0f) {
        double acc = 0;
        uint32_t keep = 0;
        while (keep < m) {
            acc += v[s->order[keep]];
            keep++;
            if (acc >= s->o.top_p * sum) break;
        }
        m = keep;
        sum = acc;
    }
    double r = k3_sampler_uniform(s) * sum, acc = 0;
    for (uint32_t j = 0; j < m; j++) {
        acc += v[s->order[j]];
        if (r < acc) return s->order[j];
    }
    return s->order[m - 1];
}

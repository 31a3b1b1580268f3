/* runstats.c - per-token statistics (runstats.h). */
#include "runstats.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3_sys.h"

static uint64_t status_kb(const char *buf, const char *key)
{
    const char *p = strstr(buf, key);
    if (!p) return 0;
    p += strlen(key);
    while (*p == ' ' || *p == '\t') p++;
    uint64_t v = 0;
    while (*p >= '0' && *p <= '9') v = v * 10 + (uint64_t)(*p++ - '0');
    return v * 1024;
}

void k3_mem_now(uint64_t *rss, uint64_t *hwm)
{
    char buf[4096];                                   /* /proc/self/status, read without stdio */
    *rss = *hwm = 0;
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return;
    buf[n] = 0;
    *rss = status_kb(buf, "VmRSS:");
    *hwm = status_kb(buf, "VmHWM:");
}

int k3_runstats_init(k3_runstats *r, k3_weights *w, uint32_t cap)
{
    memset(r, 0, sizeof *r);
    r->w = w;
    r->cap = cap;
    r->tok = calloc(cap ? cap : 1, sizeof *r->tok);
    r->n_units = k3w_config(w)->num_hidden_layers + 1;
    r->unit_prefill = calloc(r->n_units, sizeof *r->unit_prefill);
    k3w_stats(w, &r->last);
    r->t_last = k3_now();
    return r->tok && r->unit_prefill ? 0 : -1;
}

void k3_runstats_free(k3_runstats *r)
{
    free(r->tok);
    free(r->unit_prefill);
    r->tok = NULL;
    r->unit_prefill = NULL;
}

/* Seconds per generated token in each unit since the prefill: out [n_units]; 0 if no token. */
static int decode_units(const k3_runstats *r, double *out)
{
    if (!r->n) return 0;
    k3w_unit_seconds(r->w, out);
    for (uint32_t u = 0; u < r->n_units; u++) out[u] = (out[u] - r->unit_prefill[u]) / r->n;
    return 1;
}

void k3_runstats_step(void *ctx, int64_t index)
{
    k3_runstats *r = ctx;
    k3_step_stat *s = index < 0 ? &r->prefill : (uint64_t)index < r->cap ? &r->tok[index] : NULL;
    if (!s) return;
    if (index < 0) k3w_unit_seconds(r->w, r->unit_prefill);
    k3_weights_stats now;
    k3w_stats(r->w, &now);
    double t = k3_now();
    s->seconds = t - r->t_last;
    s->bytes_read = now.bytes_read - r->last.bytes_read;
    s->trunk_bytes = now.trunk_bytes_read - r->last.trunk_bytes_read;
    s->hits = now.expert_hits - r->last.expert_hits;
    s->misses = now.expert_misses - r->last.expert_misses;
    s->wait_seconds = now.wait_seconds - r->last.wait_seconds;
    k3_mem_now(&s->rss, &s->hwm);
    if (index >= 0 && (uint32_t)index + 1 > r->n) r->n = (uint32_t)index + 1;
    r->last = now;
    r->t_last = k3_now();                              /* the sample's own cost is not the next step's */
}

static double mib(uint64_t b) { return b / 1048576.0; }

void k3_runstats_print(const k3_runstats *r, FILE *f)
{
    fprintf(f, "k3run: %-8s %9s %11s %8s %8s %10s %9s %9s\n", "step", "ms", "read MiB", "hits", "misses",
            "io wait ms", "RSS MiB", "HWM MiB");
    const k3_step_stat *p = &r->prefill;
    fprintf(f, "k3run: %-8s %9.1f %11.1f %8llu %8llu %10.1f %9.1f %9.1f\n", "prompt", p->seconds * 1e3,
            mib(p->bytes_read), (unsigned long long)p->hits, (unsigned long long)p->misses, p->wait_seconds * 1e3,
            mib(p->rss), mib(p->hwm));
    k3_step_stat sum = {0};
    for (uint32_t i = 0; i < r->n; i++) {
        const k3_step_stat *s = &r->tok[i];
        fprintf(f, "k3run: %-8u %9.1f %11.1f %8llu %8llu %10.1f %9.1f %9.1f\n", i, s->seconds * 1e3,
                mib(s->bytes_read), (unsigned long long)s->hits, (unsigned long long)s->misses,
                s->wait_seconds * 1e3, mib(s->rss), mib(s->hwm));
        sum.seconds += s->seconds;
        sum.bytes_read += s->bytes_read;
        sum.hits += s->hits;
        sum.misses += s->misses;
        sum.wait_seconds += s->wait_seconds;
    }
    if (r->n) {
        double n = r->n;
        fprintf(f, "k3run: per generated token: %.3f s, %.1f MiB read, %.1f hits, %.1f misses, "
                "waiting for reads %.3f s (%.0f%%), computing %.3f s\n", sum.seconds / n, mib(sum.bytes_read) / n,
                sum.hits / n, sum.misses / n, sum.wait_seconds / n,
                sum.seconds > 0 ? 100.0 * sum.wait_seconds / sum.seconds : 0.0,
                (sum.seconds - sum.wait_seconds) / n);
    }
    double *us = malloc(r->n_units * sizeof *us);     /* [n_units] */
    if (us && r->n_units > 1 && decode_units(r, us)) {
        uint32_t lo = 0, hi = 0, L = r->n_units - 1;
        double mean = 0;
        for (uint32_t u = 0; u < L; u++) {
            mean += us[u] / L;
            if (us[u] < us[lo]) lo = u;
            if (us[u] > us[hi]) hi = u;
        }
        fprintf(f, "k3run: per generated token by layer: mean %.1f ms, fastest layer %u %.1f ms, slowest "
                "layer %u %.1f ms; the head %.1f ms\n", mean * 1e3, lo, us[lo] * 1e3, hi, us[hi] * 1e3,
                us[L] * 1e3);
    }
    free(us);
    k3_weights_stats ws;                              /* lookahead reads (weights.h), the whole run */
    k3w_stats(r->w, &ws);
    if (ws.prefetch_issued)
        fprintf(f, "k3run: lookahead reads: %llu issued, %llu used, %llu wasted, %llu not asked for yet; "
                "waited %.3f s for expert reads\n", (unsigned long long)ws.prefetch_issued,
                (unsigned long long)ws.prefetch_used, (unsigned long long)ws.prefetch_wasted,
                (unsigned long long)ws.prefetch_pending, ws.expert_wait_seconds);
}

static json_t *step_json(const k3_step_stat *s)
{
    json_t *o = json_object();
    json_object_set_new(o, "seconds", json_real(s->seconds));
    json_object_set_new(o, "bytes_read", json_integer((json_int_t)s->bytes_read));
    json_object_set_new(o, "trunk_bytes_read", json_integer((json_int_t)s->trunk_bytes));
    json_object_set_new(o, "expert_hits", json_integer((json_int_t)s->hits));
    json_object_set_new(o, "expert_misses", json_integer((json_int_t)s->misses));
    json_object_set_new(o, "io_wait_seconds", json_real(s->wait_seconds));
    json_object_set_new(o, "compute_seconds", json_real(s->seconds - s->wait_seconds));
    json_object_set_new(o, "rss_bytes", json_integer((json_int_t)s->rss));
    json_object_set_new(o, "hwm_bytes", json_integer((json_int_t)s->hwm));
    return o;
}

json_t *k3_runstats_json(const k3_runstats *r)
{
    json_t *o = json_object(), *a = json_array();
    json_object_set_new(o, "prefill", step_json(&r->prefill));
    for (uint32_t i = 0; i < r->n; i++) json_array_append_new(a, step_json(&r->tok[i]));
    json_object_set_new(o, "tokens", a);
    k3_weights_stats ws;                              /* lookahead reads (weights.h), the whole run */
    k3w_stats(r->w, &ws);
    json_object_set_new(o, "prefetch_issued", json_integer((json_int_t)ws.prefetch_issued));
    json_object_set_new(o, "prefetch_used", json_integer((json_int_t)ws.prefetch_used));
    json_object_set_new(o, "prefetch_wasted", json_integer((json_int_t)ws.prefetch_wasted));
    json_object_set_new(o, "prefetch_pending", json_integer((json_int_t)ws.prefetch_pending));
    json_object_set_new(o, "expert_wait_seconds", json_real(ws.expert_wait_seconds));
    double *us = malloc(r->n_units * sizeof *us);     /* [n_units] */
    if (us && decode_units(r, us)) {
        json_t *ua = json_array();
        for (uint32_t u = 0; u < r->n_units; u++) json_array_append_new(ua, json_real(us[u]));
        json_object_set_new(o, "decode_unit_seconds", ua);
    }
    free(us);
    return o;
}

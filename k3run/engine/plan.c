/* plan.c - the memory plan (plan.h). */
#include "plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "model_shape.h"
#include "safetensors.h"

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

int k3_trunk_unit(const char *name, uint32_t n_layers)
{
    if (!strcmp(name, "model.embed_tokens.weight")) return -1;
    if (strncmp(name, "model.layers.", 13)) return (int)n_layers;              /* the head */
    const char *p = name + 13;
    uint64_t l = 0;
    if (*p < '0' || *p > '9') return (int)n_layers;
    while (*p >= '0' && *p <= '9' && l <= n_layers) l = l * 10 + (uint64_t)(*p++ - '0');
    return *p == '.' && l < n_layers ? (int)l : -1;
}

uint64_t k3_unit_span(uint64_t size) { return align_up(size ? size : 1, K3_UNIT_ALIGN); }

static void geometry_common(const k3_config *c, k3_geometry *g)
{
    g->n_units = c->num_hidden_layers + 1;
    for (uint32_t u = 0; u < g->n_units; u++) g->trunk_bytes += g->unit_bytes[u];
    g->embed_row_bytes = (uint64_t)c->hidden_size * 2;
    g->top_k = c->num_experts ? c->num_experts_per_token : 0;
}

k3_err k3_geometry_from_manifest(const k3_manifest *m, const k3_config *c, k3_geometry *g, k3_diag *d)
{
    (void)d;
    memset(g, 0, sizeof *g);
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        int u = k3_trunk_unit(m->tensors[i].name, c->num_hidden_layers);
        if (u >= 0) g->unit_bytes[u] += k3_unit_span(m->tensors[i].size);
    }
    geometry_common(c, g);
    for (uint32_t i = 0; i < m->n_expert_layers; i++) {
        const k3_mf_experts *e = &m->expert_layers[i];
        if (e->stride > g->expert_stride) g->expert_stride = e->stride;
        if (e->record_size > g->expert_record) g->expert_record = e->record_size;
        g->n_moe_layers++;
        g->n_experts_total += e->count;
        g->experts_bytes += e->count * e->stride;
    }
    return K3_OK;
}

k3_err k3_geometry_from_config(const k3_config *c, k3_geometry *g, k3_diag *d)
{
    memset(g, 0, sizeof *g);
    k3_xlist xl;
    k3_err e = k3_expected_tensors(c, &xl, d);
    if (e) return e;
    int first_moe = -1;
    uint64_t rec = 0;
    for (size_t i = 0; i < xl.n; i++) {
        const k3_xtensor *t = &xl.t[i];
        const char *ex = strstr(t->name, ".experts.");
        if (!ex) {
            int u = k3_trunk_unit(t->name, c->num_hidden_layers);
            if (u >= 0) g->unit_bytes[u] += k3_unit_span(t->nbytes);
            continue;
        }
        if (first_moe < 0) first_moe = t->layer;
        if (t->layer == first_moe && !strncmp(ex, ".experts.0.", 11))
            rec = align_up(rec, 64) + t->nbytes;                     /* parts in record order, 64-aligned */
    }
    k3_xlist_free(&xl);
    geometry_common(c, g);
    for (uint32_t i = 0; i < c->num_hidden_layers; i++) g->n_moe_layers += k3_layer_is_moe(c, i) ? 1 : 0;
    g->expert_record = rec;
    g->expert_stride = align_up(rec, 4096);
    g->n_experts_total = (uint64_t)g->n_moe_layers * c->num_experts;
    g->experts_bytes = g->n_experts_total * g->expert_stride;
    return K3_OK;
}

/* One trunk arrangement: units larger than `cap` resident, the others streamed through two
   buffers of 2 x cap unless `room` bytes let them be resident too (largest first). */
typedef struct arrangement {
    uint64_t need;               /* memory before any optional unit is made resident */
    uint64_t resident, buffers, streamed;
    uint32_t n_streamed;
    uint8_t streamed_flag[K3_MAX_LAYERS + 1];
} arrangement;

static void arrange(const k3_geometry *g, const uint32_t *by_size, uint64_t cap, uint64_t room, arrangement *a)
{
    memset(a, 0, sizeof *a);
    for (uint32_t i = 0; i < g->n_units; i++) {
        uint64_t b = g->unit_bytes[by_size[i]];
        if (b > cap || cap == 0) a->resident += b;
        else { a->streamed_flag[by_size[i]] = 1; a->n_streamed++; a->streamed += b; }
    }
    if (!a->n_streamed) { a->need = a->resident; return; }
    a->buffers = 2 * cap;
    a->need = a->resident + a->buffers;
    uint64_t left = room > a->need ? room - a->need : 0;
    for (uint32_t i = 0; i < g->n_units; i++) {            /* largest first: fewest bytes read per token */
        uint32_t u = by_size[i];
        if (!a->streamed_flag[u] || g->unit_bytes[u] > left) continue;
        a->streamed_flag[u] = 0;
        left -= g->unit_bytes[u];
        a->resident += g->unit_bytes[u];
        a->streamed -= g->unit_bytes[u];
        a->n_streamed--;
    }
    uint64_t big = 0;                                      /* the buffers shrink to the largest left */
    for (uint32_t u = 0; u < g->n_units; u++)
        if (a->streamed_flag[u] && g->unit_bytes[u] > big) big = g->unit_bytes[u];
    a->buffers = 2 * big;
    if (a->n_streamed <= 2) {                              /* they would sit in the buffers for good */
        a->resident += a->streamed;
        a->streamed = a->buffers = 0;
        a->n_streamed = 0;
        memset(a->streamed_flag, 0, sizeof a->streamed_flag);
    }
}

static const k3_geometry *sort_geo;
static int by_size_desc(const void *x, const void *y)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    uint64_t sa = sort_geo->unit_bytes[a], sb = sort_geo->unit_bytes[b];
    return sa != sb ? (sa < sb ? 1 : -1) : (a > b) - (a < b);
}

/* What a plan costs and saves, for comparing arrangements. */
typedef struct plan_ctx {
    const k3_geometry *g;
    uint64_t budget, fixed, room;    /* room: what the trunk may take (budget - fixed - minimal expert cache) */
} plan_ctx;

static uint64_t slots_for(const plan_ctx *x, uint64_t trunk_mem)
{
    const k3_geometry *g = x->g;
    uint64_t slots = g->expert_stride ? (x->budget - x->fixed - trunk_mem) / g->expert_stride : 0;
    return slots > g->n_experts_total ? g->n_experts_total : slots;
}

/* Expected bytes read per decoded token (without the embedding row) for `streamed` bytes of trunk
   and `slots` cache slots: uniform routing, a token's expert is cached with probability
   slots / all experts. */
static double disk_for(const k3_geometry *g, uint64_t streamed, uint64_t slots)
{
    if (!g->n_experts_total || slots >= g->n_experts_total) return (double)streamed;
    double miss = 1.0 - (double)slots / (double)g->n_experts_total;
    return (double)streamed + (double)g->n_moe_layers * g->top_k * miss * (double)g->expert_record;
}

/*
 * The exact search. Units of equal size are interchangeable, so a choice of streamed units is
 * a count per size class; every count vector with 0 or at least 3 streamed units whose memory
 * (resident units + 2 x the largest streamed unit) fits in `room` is tried, and the one with the
 * fewest expected bytes read per token wins (ties: more trunk resident, then less memory). Real
 * models have a handful of unit sizes (K3: 4, so 6,900 vectors); returns 0 without trying when
 * there are more than K3_PLAN_EXACT_MAX vectors (the caller then uses arrange()'s heuristic).
 */
#define K3_PLAN_EXACT_MAX (1u << 20)
static int plan_exact(const plan_ctx *x, const uint32_t *by_size, arrangement *best, int *have)
{
    const k3_geometry *g = x->g;
    uint64_t size[K3_MAX_LAYERS + 1];
    uint32_t cnt[K3_MAX_LAYERS + 1], first[K3_MAX_LAYERS + 1], s[K3_MAX_LAYERS + 1], m = 0;
    uint64_t vectors = 1;
    for (uint32_t i = 0; i < g->n_units; i++) {
        uint64_t b = g->unit_bytes[by_size[i]];
        if (m && size[m - 1] == b) { cnt[m - 1]++; continue; }
        size[m] = b;
        cnt[m] = 1;
        first[m++] = i;
    }
    for (uint32_t c = 0; c < m; c++) {
        vectors *= cnt[c] + 1;
        if (vectors > K3_PLAN_EXACT_MAX) return 0;
    }
    memset(s, 0, sizeof s);
    uint64_t best_sum = 0, best_mem = 0;
    double best_disk = 0;
    *have = 0;
    for (;;) {
        uint32_t n = 0;
        uint64_t sum = 0, big = 0;
        for (uint32_t c = 0; c < m; c++) {
            n += s[c];
            sum += s[c] * size[c];
            if (s[c] && !big) big = size[c];             /* classes are largest first */
        }
        if (n == 0 || n >= 3) {
            uint64_t mem = g->trunk_bytes - sum + 2 * big;
            if (mem <= x->room) {
                double dk = disk_for(g, sum, slots_for(x, mem));
                if (!*have || dk < best_disk || (dk == best_disk && (sum < best_sum || (sum == best_sum && mem < best_mem)))) {
                    *have = 1;
                    best_disk = dk;
                    best_sum = sum;
                    best_mem = mem;
                    memset(best, 0, sizeof *best);
                    for (uint32_t c = 0; c < m; c++)
                        for (uint32_t j = 0; j < s[c]; j++) best->streamed_flag[by_size[first[c] + j]] = 1;
                    best->n_streamed = n;
                    best->streamed = sum;
                    best->resident = g->trunk_bytes - sum;
                    best->buffers = 2 * big;
                    best->need = mem;
                }
            }
        }
        uint32_t c = 0;                                  /* next count vector */
        while (c < m && s[c] == cnt[c]) s[c++] = 0;
        if (c == m) break;
        s[c]++;
    }
    return 1;
}

k3_err k3_plan_make(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context, uint32_t batch,
                    uint64_t buffers, uint64_t kda_state, uint64_t mla_cache, k3_plan *p, k3_diag *d)
{
    (void)c;
    memset(p, 0, sizeof *p);
    p->budget = budget;
    p->context = context;
    p->batch = batch;
    p->buffers = buffers;
    p->kda_state = kda_state;
    p->mla_cache = mla_cache;
    p->margin = K3_PLAN_MARGIN;
    p->n_units = g->n_units;
    uint64_t k = g->top_k;
    uint64_t min_slots = g->n_experts_total ? 2 * k : 0;
    if (min_slots > g->n_experts_total) min_slots = g->n_experts_total;
    uint64_t fixed = p->buffers + p->margin;
    uint64_t base = fixed + min_slots * g->expert_stride;

    /* The minimum: every arrangement "stream the units of at most `cap` bytes" (cap = each
       distinct unit size, or 0: nothing streamed) at its least memory. */
    uint32_t by_size[K3_MAX_LAYERS + 1];
    for (uint32_t u = 0; u < g->n_units; u++) by_size[u] = u;
    sort_geo = g;
    qsort(by_size, g->n_units, sizeof *by_size, by_size_desc);
    uint64_t room = budget > base ? budget - base : 0;
    plan_ctx x = {g, budget, fixed, room};
    arrangement best = {0}, a;
    int have = 0;
    uint64_t min_trunk = UINT64_MAX;
    for (uint32_t i = 0; i <= g->n_units; i++) {
        uint64_t cap = i < g->n_units ? g->unit_bytes[by_size[i]] : 0;
        if (i > 0 && i < g->n_units && cap == g->unit_bytes[by_size[i - 1]]) continue;
        arrange(g, by_size, cap, room, &a);
        if (a.need < min_trunk) min_trunk = a.need;
        if (a.need > room) continue;
        if (!have || a.resident > best.resident || (a.resident == best.resident && a.buffers < best.buffers)) {
            best = a;
            have = 1;
        }
    }
    p->minimum = base + (g->n_units ? min_trunk : 0);
    if (!have || budget < p->minimum) {
        char need[32], got[32];
        snprintf(need, sizeof need, "%.2f GiB", p->minimum / 1073741824.0);
        snprintf(got, sizeof got, "%.2f GiB", budget / 1073741824.0);
        return k3_fail(d, K3_ERR_USAGE, "a budget of %s (%llu bytes) is below this model's minimum of %s (%llu bytes: "
                       "buffers for context %u %.2f GiB, trunk (resident and stream buffers) %.2f GiB, "
                       "%llu expert slots %.2f GiB, margin %.2f GiB)",
                       got, (unsigned long long)budget, need, (unsigned long long)p->minimum, context,
                       p->buffers / 1073741824.0, min_trunk / 1073741824.0,
                       (unsigned long long)min_slots, min_slots * g->expert_stride / 1073741824.0,
                       p->margin / 1073741824.0);
    }
    /* The plan: the exact search where the unit sizes allow it, else the best heuristic
       arrangement found above (the most trunk resident). */
    int exact_have = 0;
    if (plan_exact(&x, by_size, &a, &exact_have) && exact_have) best = a;
    memcpy(p->unit_streamed, best.streamed_flag, sizeof p->unit_streamed);
    p->n_streamed = best.n_streamed;
    p->trunk_resident = best.resident;
    p->stream_buffers = best.buffers;
    p->trunk_streamed = best.streamed;
    fixed += p->trunk_resident + p->stream_buffers;
    uint64_t slots = g->expert_stride ? (budget - fixed) / g->expert_stride : 0;
    if (slots > g->n_experts_total) slots = g->n_experts_total;
    p->expert_slots = slots;
    p->expert_cache = slots * g->expert_stride;
    p->experts_all_resident = slots == g->n_experts_total;
    p->resident = fixed + p->expert_cache;
    p->expert_reads_per_token = p->experts_all_resident ? 0.0
        : (double)g->n_moe_layers * k * (1.0 - (double)slots / (double)g->n_experts_total);
    p->disk_per_token = disk_for(g, p->trunk_streamed, slots) + g->embed_row_bytes;
    return K3_OK;
}

k3_err k3_plan_for(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context, uint32_t batch,
                   int all_logits, k3_plan *p, k3_diag *d)
{
    return k3_plan_with_snapshots(c, g, budget, context, batch, all_logits, 0, 0, p, d);
}

k3_err k3_plan_with_snapshots(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context,
                              uint32_t batch, int all_logits, uint32_t snapshots, uint32_t verify, k3_plan *p,
                              k3_diag *d)
{
    if (verify > batch) verify = batch;
    if (verify < 2) verify = 0;
    k3_model_shape s;
    k3_err e = k3_model_shape_from_config(c, batch, context, all_logits, verify, &s, d);
    if (e) return e;
    uint64_t one = s.kda_bytes + (uint64_t)s.d.V * sizeof(float);   /* = k3_model_snap_bytes */
    e = k3_plan_make(c, g, budget, context, batch, s.total + snapshots * one, s.kda_bytes, s.mla_bytes, p, d);
    p->n_snapshots = snapshots;
    p->snapshot_bytes = one;
    p->verify_tokens = verify;
    p->verify_bytes = s.verify_bytes;
    p->minimum -= s.verify_bytes;                     /* the floor: without them, k3run runs undrafted */
    if (e == K3_ERR_USAGE && verify)                  /* speculation only changes the speed: never refuse for it */
        return k3_plan_with_snapshots(c, g, budget, context, batch, all_logits, snapshots, 0, p, d);
    return e;
}

static uint64_t read_u64_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    unsigned long long v = 0;
    int ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    return ok ? v : 0;
}

uint64_t k3_machine_memory(const char **source)
{
    uint64_t avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            unsigned long long kb;
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) { avail = kb * 1024; break; }
        }
        fclose(f);
    }
    *source = "MemAvailable";
    /* cgroup v1 memory controller, else cgroup v2 */
    uint64_t lim = read_u64_file("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    if (lim && lim < (1ull << 60)) {
        uint64_t used = read_u64_file("/sys/fs/cgroup/memory/memory.usage_in_bytes");
        uint64_t left = lim > used ? lim - used : 0;
        if (!avail || left < avail) { avail = left; *source = "the cgroup (v1) memory limit"; }
    } else {
        lim = read_u64_file("/sys/fs/cgroup/memory.max");
        if (lim) {
            uint64_t used = read_u64_file("/sys/fs/cgroup/memory.current");
            uint64_t left = lim > used ? lim - used : 0;
            if (!avail || left < avail) { avail = left; *source = "the cgroup (v2) memory limit"; }
        }
    }
    return avail;
}

uint64_t k3_preset_budget(const char *name)
{
    if (!strcasecmp(name, "laptop")) return 8ull << 30;
    if (!strcasecmp(name, "workstation")) return 128ull << 30;
    if (!strcasecmp(name, "server")) return 224ull << 30;
    return 0;
}

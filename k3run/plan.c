/* plan.c - the memory plan (plan.h). */
#include "plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "safetensors.h"

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

k3_err k3_geometry_from_manifest(const k3_manifest *m, const k3_config *c, k3_geometry *g, k3_diag *d)
{
    (void)d;
    memset(g, 0, sizeof *g);
    for (uint32_t i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, "model.embed_tokens.weight")) g->trunk_bytes += m->tensors[i].size;
    g->embed_row_bytes = (uint64_t)c->hidden_size * 2;
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
            if (strcmp(t->name, "model.embed_tokens.weight")) g->trunk_bytes += t->nbytes;
            continue;
        }
        if (first_moe < 0) first_moe = t->layer;
        if (t->layer == first_moe && !strncmp(ex, ".experts.0.", 11))
            rec = align_up(rec, 64) + t->nbytes;                     /* parts in record order, 64-aligned */
    }
    k3_xlist_free(&xl);
    g->embed_row_bytes = (uint64_t)c->hidden_size * 2;
    for (uint32_t i = 0; i < c->num_hidden_layers; i++) g->n_moe_layers += k3_layer_is_moe(c, i) ? 1 : 0;
    g->expert_record = rec;
    g->expert_stride = align_up(rec, 4096);
    g->n_experts_total = (uint64_t)g->n_moe_layers * c->num_experts;
    g->experts_bytes = g->n_experts_total * g->expert_stride;
    return K3_OK;
}

k3_err k3_plan_make(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context, uint32_t batch,
                    uint64_t buffers, uint64_t kda_state, uint64_t mla_cache, k3_plan *p, k3_diag *d)
{
    memset(p, 0, sizeof *p);
    p->budget = budget;
    p->context = context;
    p->batch = batch;
    p->buffers = buffers;
    p->kda_state = kda_state;
    p->mla_cache = mla_cache;
    p->margin = K3_PLAN_MARGIN;
    p->trunk_resident = g->trunk_bytes;
    uint64_t k = c->num_experts ? c->num_experts_per_token : 0;
    uint64_t min_slots = g->n_experts_total ? 2 * k : 0;
    if (min_slots > g->n_experts_total) min_slots = g->n_experts_total;
    uint64_t fixed = p->buffers + p->margin + p->trunk_resident;
    p->minimum = fixed + min_slots * g->expert_stride;
    if (budget < p->minimum) {
        char need[32], have[32];
        snprintf(need, sizeof need, "%.2f GiB", p->minimum / 1073741824.0);
        snprintf(have, sizeof have, "%.2f GiB", budget / 1073741824.0);
        return k3_fail(d, K3_ERR_USAGE, "a budget of %s (%llu bytes) is below this model's minimum of %s (%llu bytes: "
                       "buffers for context %u %.2f GiB, trunk %.2f GiB, %llu expert slots %.2f GiB, margin %.2f GiB)",
                       have, (unsigned long long)budget, need, (unsigned long long)p->minimum, context,
                       p->buffers / 1073741824.0, p->trunk_resident / 1073741824.0,
                       (unsigned long long)min_slots, min_slots * g->expert_stride / 1073741824.0,
                       p->margin / 1073741824.0);
    }
    uint64_t slots = g->expert_stride ? (budget - fixed) / g->expert_stride : 0;
    if (slots > g->n_experts_total) slots = g->n_experts_total;
    p->expert_slots = slots;
    p->expert_cache = slots * g->expert_stride;
    p->experts_all_resident = slots == g->n_experts_total;
    p->resident = fixed + p->expert_cache;
    /* uniform routing: a token's expert is cached with probability slots / all experts */
    double hit = g->n_experts_total ? (double)slots / (double)g->n_experts_total : 1.0;
    p->expert_reads_per_token = p->experts_all_resident ? 0.0 : (double)g->n_moe_layers * k * (1.0 - hit);
    p->disk_per_token = p->expert_reads_per_token * g->expert_stride + g->embed_row_bytes;
    return K3_OK;
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

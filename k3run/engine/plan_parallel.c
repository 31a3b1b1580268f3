/*
 * plan_parallel.c - conversations sharing passes, on paper (plan_report.h
 * "Parallel"): what a decode pass carrying one token of each of S
 * conversations reads, computes and touches under a plan for S sequences,
 * and the tokens per second that follow at a disk bandwidth, an FMA peak and
 * a memory bandwidth.
 */
#include <math.h>
#include <string.h>

#include "model_shape.h"
#include "plan_report.h"

const uint32_t k3_par_slots[K3_PAR_N_SLOTS] = {1, 2, 4, 8, 16, 32};

void k3_decode_cost_of(const k3_config *c, const k3_geometry *g, const k3_plan *p, uint32_t S, uint32_t pos,
                       k3_decode_cost *out)
{
    memset(out, 0, sizeof *out);
    out->rows = S;
    out->pos = pos;
    if (!S) return;
    double per_layer = g->n_moe_layers ? (double)g->n_experts_total / g->n_moe_layers : 0;
    double pick = per_layer > 0 ? (double)g->top_k / (g->ranks > 1 ? g->ranks : 1) / per_layer : 0;
    if (pick > 1) pick = 1;
    double miss = p->experts_all_resident || !g->n_experts_total ? 0.0
                : 1.0 - (double)p->expert_slots / (double)g->n_experts_total;
    double used = (double)g->n_moe_layers * per_layer * (1.0 - pow(1.0 - pick, S));   /* experts the pass uses */
    out->experts_used = used;
    out->expert_reads = used * miss;
    out->read_bytes = (double)p->trunk_streamed + out->expert_reads * (double)g->expert_record +
                      (double)S * (double)g->embed_row_bytes;
    /* from memory: the resident trunk, the experts found in the cache, each sequence's state */
    out->touched_bytes = (double)p->trunk_resident + (used - out->expert_reads) * (double)g->expert_record +
                         (double)S * (double)p->seq_bytes * ((double)pos / (p->context ? p->context : 1));
    k3_dims z;
    k3_diag d;
    if (!c || k3_model_dims(c, &z, &d)) return;
    double experts = (double)g->n_moe_layers * z.k * 3.0 * z.Ie * z.Dl;
    double mla = (double)z.n_mla * z.Hm * (4.0 * z.R + 2.0 * z.dr) * (pos + 1.0);
    double kda = (double)(z.L - z.n_mla) * 7.0 * z.H * z.K * z.K;
    out->flops = (2.0 * ((double)g->trunk_weights + experts) + mla + kda) * S;   /* lm_head: a row each */
}

double k3_decode_seconds(const k3_decode_cost *dc, double disk_gbs, double fma_gflops, double mem_gbs)
{
    double io = dc->read_bytes / (disk_gbs * 1e9), comp = dc->flops / (fma_gflops * 1e9),
           mem = dc->touched_bytes / (mem_gbs * 1e9);
    double t = io > comp ? io : comp;
    return t > mem ? t : mem;
}

/* The conversations' states and their snapshots (serve: --snapshots for each slot). */
static uint64_t states_bytes(const k3_plan *p)
{
    return (uint64_t)p->n_seq * p->seq_bytes + (uint64_t)p->n_snapshots * p->snapshot_bytes;
}

void k3_par_print(FILE *f, const k3_par_row *rows, int n, double fma_gflops, double mem_gbs)
{
    char a[24], b[24], c[24];
    fprintf(f, "Conversations sharing each pass (--parallel S; a decode pass carries a token of each, at half the "
            "context;\nexpected reads under uniform routing; the pass takes the largest of its reads at the disk's "
            "bandwidth,\nits compute at an FMA peak of %g GFLOP/s and its memory traffic at %g GB/s; states: each "
            "conversation's\nKDA state and MLA cache, and its state snapshots)\n",
            fma_gflops, mem_gbs);
    fprintf(f, "  %4s %10s %10s %10s %10s %11s %11s %11s %11s\n", "S", "states", "experts", "read/pass", "compute",
            "tok/s 2GB/s", "tok/s 7GB/s", "each 2GB/s", "each 7GB/s");
    for (int r = 0; r < n; r++) {
        const k3_par_row *w = &rows[r];
        if (!w->fits) {
            fprintf(f, "  %4u (does not fit the budget: %u sequences' states and buffers leave no room)\n", w->slots,
                    w->slots);
            continue;
        }
        double t2 = k3_decode_seconds(&w->cost, k3_ttft_bandwidths_gbs[0], fma_gflops, mem_gbs);
        double t7 = k3_decode_seconds(&w->cost, k3_ttft_bandwidths_gbs[1], fma_gflops, mem_gbs);
        fprintf(f, "  %4u %10s %10s %10s %9.2fs %11.2f %11.2f %11.3f %11.3f\n", w->slots,
                k3_plan_human(states_bytes(&w->plan), a), k3_plan_human(w->plan.expert_cache, b),
                k3_plan_human((uint64_t)llround(w->cost.read_bytes), c), w->cost.flops / (fma_gflops * 1e9),
                w->slots / t2, w->slots / t7, 1 / t2, 1 / t7);
    }
}

json_t *k3_par_json(const k3_par_row *rows, int n, double fma_gflops, double mem_gbs)
{
    json_t *arr = json_array();
    for (int r = 0; arr && r < n; r++) {
        const k3_par_row *w = &rows[r];
        json_t *o = json_object();
        if (!o) break;
        json_object_set_new(o, "slots", json_integer(w->slots));
        json_object_set_new(o, "fits", json_boolean(w->fits));
        if (w->fits) {
            json_object_set_new(o, "states_bytes", json_integer((json_int_t)states_bytes(&w->plan)));
            json_object_set_new(o, "snapshots", json_integer(w->plan.n_snapshots));
            json_object_set_new(o, "expert_cache_bytes", json_integer((json_int_t)w->plan.expert_cache));
            json_object_set_new(o, "expert_slots", json_integer((json_int_t)w->plan.expert_slots));
            json_object_set_new(o, "experts_all_resident", json_boolean(w->plan.experts_all_resident));
            json_object_set_new(o, "trunk_streamed_bytes", json_integer((json_int_t)w->plan.trunk_streamed));
            json_object_set_new(o, "batch", json_integer(w->plan.batch));
            json_object_set_new(o, "read_bytes_per_pass", json_real(w->cost.read_bytes));
            json_object_set_new(o, "memory_bytes_per_pass", json_real(w->cost.touched_bytes));
            json_object_set_new(o, "flops_per_pass", json_real(w->cost.flops));
            json_t *agg = json_object(), *each = json_object();
            for (int j = 0; j < K3_TTFT_N_BANDWIDTHS; j++) {
                char k[16];
                snprintf(k, sizeof k, "%g", k3_ttft_bandwidths_gbs[j]);
                double t = k3_decode_seconds(&w->cost, k3_ttft_bandwidths_gbs[j], fma_gflops, mem_gbs);
                json_object_set_new(agg, k, json_real(w->slots / t));
                json_object_set_new(each, k, json_real(1 / t));
            }
            json_object_set_new(o, "tokens_per_second_by_disk_gbs", agg);
            json_object_set_new(o, "per_conversation_tokens_per_second_by_disk_gbs", each);
        }
        json_array_append_new(arr, o);
    }
    json_t *o = json_object();
    json_object_set_new(o, "fma_peak_gflops", json_real(fma_gflops));
    json_object_set_new(o, "memory_gbs", json_real(mem_gbs));
    json_object_set_new(o, "rows", arr);
    return o;
}

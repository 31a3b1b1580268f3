/* plan_report.c - the memory plan as text and as JSON (plan_report.h). */
#include "plan_report.h"

#include <math.h>
#include <string.h>

const double k3_plan_bandwidths_gbs[K3_PLAN_N_BANDWIDTHS] = {2.0, 7.0, 14.0};
const uint32_t k3_ttft_prompts[K3_TTFT_N_PROMPTS] = {1000, 8000, 32000};
const double k3_ttft_bandwidths_gbs[K3_TTFT_N_BANDWIDTHS] = {2.0, 7.0};


uint64_t k3_plan_expert_bytes_per_token(const k3_plan *p, const k3_geometry *g)
{
    return (uint64_t)llround(p->expert_reads_per_token * (double)g->expert_record);
}

uint64_t k3_plan_disk_bytes_per_token(const k3_plan *p, const k3_geometry *g)
{
    return p->trunk_streamed + k3_plan_expert_bytes_per_token(p, g) + g->embed_row_bytes;
}

char *k3_plan_streamed_list(const k3_plan *p, char *buf, size_t cap)
{
    size_t n = 0;
    int full = 0;
#define PUT(...) do { if (!full) { int w_ = snprintf(buf + n, cap - n, __VA_ARGS__); \
    if (w_ < 0 || (size_t)w_ >= cap - n) full = 1; else n += (size_t)w_; } } while (0)
    if (!cap) return buf;
    buf[0] = 0;
    uint32_t layers = p->n_units ? p->n_units - 1 : 0;
    for (uint32_t u = 0; u < layers; u++) {
        if (!p->unit_streamed[u]) continue;
        uint32_t v = u;
        while (v + 1 < layers && p->unit_streamed[v + 1]) v++;
        if (v == u) PUT("%s%u", n ? ", " : "", u);
        else PUT("%s%u-%u", n ? ", " : "", u, v);
        u = v;
    }
    if (p->n_units && p->unit_streamed[p->n_units - 1]) PUT("%shead", n ? ", " : "");
    if (!n && !full) PUT("none");
#undef PUT
    if (full && cap >= 4) strcpy(buf + cap - 4, "...");
    return buf;
}

/* Binary units, sized to the amount: "1.41 TiB", "7.99 GiB", "16.7 MiB", "14.0 KiB", "256 B". */
static const char *hs(uint64_t b, char *buf);
const char *k3_plan_human(uint64_t b, char *buf) { return hs(b, buf); }
static const char *hs(uint64_t b, char *buf)
{
    if (b >= (1ull << 40)) snprintf(buf, 24, "%.2f TiB", (double)b / 1099511627776.0);
    else if (b >= (1ull << 30)) snprintf(buf, 24, "%.2f GiB", (double)b / 1073741824.0);
    else if (b >= (1ull << 20)) snprintf(buf, 24, "%.1f MiB", (double)b / 1048576.0);
    else if (b >= (1ull << 10)) snprintf(buf, 24, "%.1f KiB", (double)b / 1024.0);
    else snprintf(buf, 24, "%llu B", (unsigned long long)b);
    return buf;
}

void k3_plan_print(FILE *f, const k3_plan *p, const k3_geometry *g)
{
    char a[24], b[24], c[24], d[24];
    uint32_t n_res = p->n_units - p->n_streamed;
    if (p->batch_auto)
        fprintf(f, "Memory plan for a budget of %s (%llu bytes), context %u, batch %u (-b auto, at most %u: the fewest "
                "bytes read\nfor a prompt of %u tokens and %u generated)\n", hs(p->budget, a),
                (unsigned long long)p->budget, p->context, p->batch, p->batch_cap, p->batch_prompt, p->batch_generate);
    else
        fprintf(f, "Memory plan for a budget of %s (%llu bytes), context %u, batch %u\n", hs(p->budget, a),
                (unsigned long long)p->budget, p->context, p->batch);
    fprintf(f, "(KiB, MiB, GiB = 2^10, 2^20, 2^30 bytes; disk bandwidth in GB/s = 10^9 bytes/s)\n");
    fprintf(f, "  minimum budget    %10s (%llu bytes)\n", hs(p->minimum, a), (unsigned long long)p->minimum);
    fprintf(f, "  resident          %10s (%llu bytes)\n", hs(p->resident, a), (unsigned long long)p->resident);
    fprintf(f, "    model buffers   %10s (KDA states %s, MLA cache for %u positions %s, a pass of %u tokens %s "
            "a token)\n", hs(p->buffers, a), hs(p->kda_state, b), p->context, hs(p->mla_cache, c), p->batch,
            hs(p->batch_token_bytes, d));
    if (p->n_snapshots)
        fprintf(f, "      of them       %10s (%u state snapshots of %s: KDA states and a logits row)\n",
                hs((uint64_t)p->n_snapshots * p->snapshot_bytes, a), p->n_snapshots, hs(p->snapshot_bytes, b));
    else
        fprintf(f, "    (a state snapshot, k3run chat's prompt cache, is %s each: KDA states and a logits row)\n",
                hs(p->snapshot_bytes, a));
    if (p->verify_tokens)
        fprintf(f, "      of them       %10s (speculative decoding: verify passes of %u tokens)\n",
                hs(p->verify_bytes, a), p->verify_tokens);
    fprintf(f, "    margin          %10s\n", hs(p->margin, a));
    fprintf(f, "    trunk, resident %10s (%u of %u units: %u layers and the head; the embedding table is "
            "not resident)\n", hs(p->trunk_resident, a), n_res, p->n_units, p->n_units ? p->n_units - 1 : 0);
    if (p->n_streamed && p->n_chunked)
        fprintf(f, "    stream buffers  %10s (2 x %s pieces, 2 x %s small parts: %u units in row pieces of at "
                "most %s)\n", hs(p->stream_buffers, a), hs(p->piece_buffer, b), hs(p->small_buffer, c),
                p->n_chunked, hs(p->chunk, d));
    else if (p->n_streamed)
        fprintf(f, "    stream buffers  %10s (2 x %s, the largest streamed unit)\n", hs(p->stream_buffers, a),
                hs(p->piece_buffer, b));
    else
        fprintf(f, "    stream buffers  %10s (nothing is streamed)\n", hs(0, a));
    if (!g->n_experts_total)
        fprintf(f, "    expert cache    %10s (the model has no routed experts)\n", hs(0, a));
    else if (p->experts_all_resident)
        fprintf(f, "    expert cache    %10s (all %llu experts resident, %s each)\n", hs(p->expert_cache, a),
                (unsigned long long)g->n_experts_total, hs(g->expert_stride, b));
    else
        fprintf(f, "    expert cache    %10s (%llu slots of %s: %.2f %% of %llu experts)\n", hs(p->expert_cache, a),
                (unsigned long long)p->expert_slots, hs(g->expert_stride, b),
                100.0 * (double)p->expert_slots / (double)g->n_experts_total,
                (unsigned long long)g->n_experts_total);

    char list[512];
    uint64_t xb = k3_plan_expert_bytes_per_token(p, g), disk = k3_plan_disk_bytes_per_token(p, g);
    fprintf(f, "Read from disk per decoded token (experts: expected, uniform routing)\n");
    fprintf(f, "  streamed trunk    %10s (%u units: %s)\n", hs(p->trunk_streamed, a), p->n_streamed,
            k3_plan_streamed_list(p, list, sizeof list));
    if (g->ranks > 1)                    /* one rank's share (k3_geometry_for_rank) */
        fprintf(f, "  expert records    %10s (%.1f of the %.1f a token uses on this rank, %s each)\n", hs(xb, a),
                p->expert_reads_per_token, (double)g->n_moe_layers * g->top_k / g->ranks, hs(g->expert_record, b));
    else
        fprintf(f, "  expert records    %10s (%.1f of the %u a token uses, %s each)\n", hs(xb, a),
                p->expert_reads_per_token, g->n_moe_layers * g->top_k, hs(g->expert_record, b));
    fprintf(f, "  embedding row     %10s\n", hs(g->embed_row_bytes, a));
    fprintf(f, "  total             %10s (%llu bytes)\n", hs(disk, a), (unsigned long long)disk);
    fprintf(f, "  I/O time alone:  ");
    for (int i = 0; i < K3_PLAN_N_BANDWIDTHS; i++)
        fprintf(f, "%s %.3g s/token at %g GB/s", i ? "," : "", (double)disk / (k3_plan_bandwidths_gbs[i] * 1e9),
                k3_plan_bandwidths_gbs[i]);
    fprintf(f, "\n");
    k3_prompt_cost pc;
    k3_prompt_cost_of(NULL, g, p, p->batch, &pc);
    fprintf(f, "Read from disk per pass of %u prompt tokens (experts: expected, uniform routing)\n", p->batch);
    fprintf(f, "  streamed trunk    %10s\n", hs(p->trunk_streamed, a));
    fprintf(f, "  expert records    %10s (%.1f of the %llu, %s each)\n", hs((uint64_t)llround(pc.expert_bytes), a),
            pc.expert_reads, (unsigned long long)g->n_experts_total, hs(g->expert_record, b));
    fprintf(f, "  embedding rows    %10s\n", hs((uint64_t)llround(pc.embed_bytes), a));
    fprintf(f, "  total             %10s, %s per prompt token\n", hs((uint64_t)llround(pc.read_bytes), a),
            hs((uint64_t)llround(pc.read_bytes / p->batch), b));
}

/* "12.5 s", "7.3 min", "2.4 h": a duration sized to the amount. */
static const char *dur(double s, char *buf)
{
    if (s < 60) snprintf(buf, 24, "%.1f s", s);
    else if (s < 3600) snprintf(buf, 24, "%.1f min", s / 60);
    else snprintf(buf, 24, "%.1f h", s / 3600);
    return buf;
}

void k3_ttft_print(FILE *f, const k3_ttft_row *rows, int n, double fma_gflops)
{
    char a[24], b[24], c[24], e[24], t[2][24], io[2][24], dc[24];
    fprintf(f, "Time to first token from an empty context (reads expected, uniform routing; compute at an FMA peak "
            "of %g GFLOP/s,\na floor; the first token comes after the larger of reads and compute, which overlap; "
            "decode reads: what a\ngenerated token then reads under that plan)\n", fma_gflops);
    fprintf(f, "  %-7s %-11s %6s %10s %10s %10s %10s %10s %10s %10s %12s\n", "prompt", "batch", "passes", "read",
            "per token", "compute", "I/O 2 GB/s", "I/O 7 GB/s", "at 2 GB/s", "at 7 GB/s", "decode reads");
    for (int r = 0; r < n; r++) {
        const k3_ttft_row *w = &rows[r];
        for (int i = 0; i < 2; i++) {
            char bt[24];
            snprintf(a, sizeof a, "%u", w->tokens);
            if (!w->fits[i]) {
                fprintf(f, "  %-7s %-11s (the budget is below this plan's minimum at context %u)\n", i ? "" : a,
                        i ? "64" : "as asked", w->context);
                continue;
            }
            const k3_plan *p = &w->plan[i];
            const k3_prompt_cost *pc = &w->cost[i];
            snprintf(bt, sizeof bt, "%u%s", p->batch, p->batch_auto ? " auto" : "");
            double comp = pc->flops / (fma_gflops * 1e9);
            for (int j = 0; j < K3_TTFT_N_BANDWIDTHS; j++) {
                double s = pc->read_bytes / (k3_ttft_bandwidths_gbs[j] * 1e9);
                dur(s, io[j]);
                dur(s > comp ? s : comp, t[j]);
            }
            fprintf(f, "  %-7s %-11s %6u %10s %10s %10s %10s %10s %10s %10s %12s\n", i ? "" : a, bt, pc->passes,
                    hs((uint64_t)llround(pc->read_bytes), b), hs((uint64_t)llround(pc->read_bytes / w->tokens), c),
                    dur(comp, e), io[0], io[1], t[0], t[1], hs((uint64_t)llround(p->disk_per_token), dc));
        }
    }
    int ctx = 0;
    for (int r = 0; r < n; r++) ctx |= rows[r].context != rows[0].context;
    if (ctx) {
        fprintf(f, "  (each prompt planned at a context of at least its length:");
        for (int r = 0; r < n; r++) fprintf(f, "%s %u", r ? "," : "", rows[r].context);
        fprintf(f, ")\n");
    }
}

static void set_u64(json_t *o, const char *k, uint64_t v) { json_object_set_new(o, k, json_integer((json_int_t)v)); }

json_t *k3_plan_json(const k3_plan *p, const k3_geometry *g)
{
    json_t *o = json_object(), *tr = json_object(), *ub = json_array(), *st = json_array(), *ex = json_object(),
           *io = json_object(), *pb = json_array(), *sb = json_array();
    if (!o || !tr || !ub || !st || !ex || !io || !pb || !sb) {
        json_decref(o); json_decref(tr); json_decref(ub); json_decref(st); json_decref(ex); json_decref(io);
        json_decref(pb); json_decref(sb);
        return NULL;
    }
    uint64_t disk = k3_plan_disk_bytes_per_token(p, g);
    set_u64(o, "budget_bytes", p->budget);
    set_u64(o, "minimum_bytes", p->minimum);
    set_u64(o, "resident_bytes", p->resident);
    set_u64(o, "context", p->context);
    set_u64(o, "batch", p->batch);
    json_object_set_new(o, "batch_auto", json_boolean(p->batch_auto));
    json_object_set_new(o, "batch_cap", p->batch_auto ? json_integer((json_int_t)p->batch_cap) : json_null());
    json_object_set_new(o, "batch_priced_prompt",
                        p->batch_auto ? json_integer((json_int_t)p->batch_prompt) : json_null());
    json_object_set_new(o, "batch_priced_generate",
                        p->batch_auto ? json_integer((json_int_t)p->batch_generate) : json_null());
    set_u64(o, "batch_token_bytes", p->batch_token_bytes);
    set_u64(o, "buffers_bytes", p->buffers);
    set_u64(o, "kda_state_bytes", p->kda_state);
    set_u64(o, "mla_cache_bytes", p->mla_cache);
    set_u64(o, "snapshots", p->n_snapshots);
    set_u64(o, "snapshot_bytes", p->snapshot_bytes);
    set_u64(o, "verify_tokens", p->verify_tokens);
    set_u64(o, "verify_bytes", p->verify_bytes);
    set_u64(o, "margin_bytes", p->margin);

    set_u64(tr, "units", p->n_units);
    json_object_set_new(tr, "split", json_boolean(g->split));   /* this rank's slices (K3_TRUNK=split) */
    set_u64(tr, "bytes", g->trunk_bytes);
    set_u64(tr, "weights", g->trunk_weights);
    for (uint32_t u = 0; u < p->n_units; u++) {
        json_array_append_new(ub, json_integer((json_int_t)g->unit_bytes[u]));
        json_array_append_new(pb, json_integer((json_int_t)g->piece_bytes[u]));
        json_array_append_new(sb, json_integer((json_int_t)g->small_bytes[u]));
        if (p->unit_streamed[u])
            json_array_append_new(st, u + 1 == p->n_units ? json_string("head") : json_integer(u));
    }
    json_object_set_new(tr, "unit_bytes", ub);
    json_object_set_new(tr, "unit_piece_bytes", pb);
    json_object_set_new(tr, "unit_small_bytes", sb);
    set_u64(tr, "resident_units", p->n_units - p->n_streamed);
    set_u64(tr, "resident_bytes", p->trunk_resident);
    json_object_set_new(tr, "streamed", st);
    set_u64(tr, "streamed_bytes", p->trunk_streamed);
    set_u64(tr, "stream_buffer_bytes", p->stream_buffers);
    set_u64(tr, "piece_buffer_bytes", p->piece_buffer);
    set_u64(tr, "small_buffer_bytes", p->small_buffer);
    set_u64(tr, "chunked_units", p->n_chunked);
    set_u64(tr, "chunk_bytes", p->chunk == UINT64_MAX ? 0 : p->chunk);
    json_object_set_new(o, "trunk", tr);

    set_u64(ex, "moe_layers", g->n_moe_layers);
    set_u64(ex, "top_k", g->top_k);
    set_u64(ex, "total", g->n_experts_total);
    set_u64(ex, "bytes", g->experts_bytes);
    set_u64(ex, "slot_bytes", g->expert_stride);
    set_u64(ex, "record_bytes", g->expert_record);
    set_u64(ex, "slots", p->expert_slots);
    set_u64(ex, "cache_bytes", p->expert_cache);
    json_object_set_new(ex, "all_resident", json_boolean(p->experts_all_resident));
    json_object_set_new(ex, "routing", json_string("uniform"));
    json_object_set_new(ex, "reads_per_token", json_real(p->expert_reads_per_token));
    set_u64(ex, "read_bytes_per_token", k3_plan_expert_bytes_per_token(p, g));
    json_object_set_new(o, "experts", ex);

    set_u64(o, "embed_row_bytes", g->embed_row_bytes);
    set_u64(o, "disk_bytes_per_token", disk);
    for (int i = 0; i < K3_PLAN_N_BANDWIDTHS; i++) {
        char k[16];
        snprintf(k, sizeof k, "%g", k3_plan_bandwidths_gbs[i]);
        json_object_set_new(io, k, json_real((double)disk / (k3_plan_bandwidths_gbs[i] * 1e9)));
    }
    json_object_set_new(o, "io_seconds_per_token_at_gb_per_s", io);
    k3_prompt_cost pc;                               /* one full pass of the batch */
    k3_prompt_cost_of(NULL, g, p, p->batch, &pc);
    json_t *pp = json_object();
    if (!pp) { json_decref(o); return NULL; }
    set_u64(pp, "tokens", p->batch);
    set_u64(pp, "trunk_bytes", p->trunk_streamed);
    json_object_set_new(pp, "expert_reads", json_real(pc.expert_reads));
    set_u64(pp, "expert_bytes", (uint64_t)llround(pc.expert_bytes));
    set_u64(pp, "embed_bytes", (uint64_t)llround(pc.embed_bytes));
    set_u64(pp, "read_bytes", (uint64_t)llround(pc.read_bytes));
    json_object_set_new(pp, "read_bytes_per_token", json_real(pc.read_bytes / p->batch));
    json_object_set_new(o, "prompt_pass", pp);
    return o;
}

/* One plan's prompt cost: the figures of k3_ttft_print's row. */
static json_t *ttft_cost_json(const k3_plan *p, const k3_prompt_cost *pc, double fma_gflops)
{
    json_t *o = json_object(), *io = json_object(), *ft = json_object();
    if (!o || !io || !ft) { json_decref(o); json_decref(io); json_decref(ft); return NULL; }
    set_u64(o, "batch", p->batch);
    json_object_set_new(o, "batch_auto", json_boolean(p->batch_auto));
    set_u64(o, "context", p->context);
    set_u64(o, "passes", pc->passes);
    set_u64(o, "buffers_bytes", p->buffers);
    set_u64(o, "trunk_bytes", (uint64_t)llround(pc->trunk_bytes));
    json_object_set_new(o, "expert_reads", json_real(pc->expert_reads));
    set_u64(o, "expert_bytes", (uint64_t)llround(pc->expert_bytes));
    set_u64(o, "embed_bytes", (uint64_t)llround(pc->embed_bytes));
    set_u64(o, "read_bytes", (uint64_t)llround(pc->read_bytes));
    json_object_set_new(o, "read_bytes_per_token", json_real(pc->read_bytes / pc->tokens));
    json_object_set_new(o, "flops", json_real(pc->flops));
    json_object_set_new(o, "attention_flops", json_real(pc->attention_flops));
    double comp = pc->flops / (fma_gflops * 1e9);
    json_object_set_new(o, "compute_seconds", json_real(comp));
    for (int j = 0; j < K3_TTFT_N_BANDWIDTHS; j++) {
        char k[16];
        double s = pc->read_bytes / (k3_ttft_bandwidths_gbs[j] * 1e9);
        snprintf(k, sizeof k, "%g", k3_ttft_bandwidths_gbs[j]);
        json_object_set_new(io, k, json_real(s));
        json_object_set_new(ft, k, json_real(s > comp ? s : comp));
    }
    json_object_set_new(o, "io_seconds_at_gb_per_s", io);
    json_object_set_new(o, "seconds_at_gb_per_s", ft);
    json_object_set_new(o, "disk_bytes_per_decoded_token", json_real(p->disk_per_token));
    return o;
}

json_t *k3_ttft_json(const k3_ttft_row *rows, int n, double fma_gflops)
{
    json_t *o = json_object(), *a = json_array();
    if (!o || !a) { json_decref(o); json_decref(a); return NULL; }
    json_object_set_new(o, "fma_peak_gflops", json_real(fma_gflops));
    json_object_set_new(o, "routing", json_string("uniform"));
    for (int r = 0; r < n; r++) {
        json_t *x = json_object();
        if (!x) { json_decref(o); json_decref(a); return NULL; }
        set_u64(x, "tokens", rows[r].tokens);
        set_u64(x, "context", rows[r].context);
        for (int i = 0; i < 2; i++) {
            json_t *c = rows[r].fits[i] ? ttft_cost_json(&rows[r].plan[i], &rows[r].cost[i], fma_gflops) : json_null();
            json_object_set_new(x, i ? "batch_64" : "chosen", c ? c : json_null());
        }
        json_array_append_new(a, x);
    }
    json_object_set_new(o, "prompts", a);
    return o;
}

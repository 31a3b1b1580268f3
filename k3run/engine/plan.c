/* plan.c - the memory plan (plan.h). */
#include "plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dist.h"
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

uint64_t k3_chunk_bytes(void)
{
    const char *v = getenv("K3_CHUNK");
    if (!v || !*v) return K3_CHUNK_DEFAULT;
    if (!strcasecmp(v, "off") || !strcmp(v, "0")) return UINT64_MAX;
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1ull << 10;
    else if (*end == 'M' || *end == 'm') mul = 1ull << 20;
    else if (*end == 'G' || *end == 'g') mul = 1ull << 30;
    if (mul > 1) end++;
    if (end == v || *end || n > (UINT64_MAX >> 30)) return K3_CHUNK_DEFAULT;   /* not a size: the default */
    uint64_t b = (uint64_t)n * mul;
    return b < K3_UNIT_ALIGN ? K3_UNIT_ALIGN : b;
}

int k3_tensor_by_rows(const char *name, int ndim, const uint64_t *shape)
{
    size_t n = strlen(name), k = strlen("kv_b_proj.weight");
    if (n >= k && !strcmp(name + n - k, "kv_b_proj.weight")) return 0;
    if (!strcmp(name, "model.embed_tokens.weight")) return 0;
    k = strlen("_scale");                              /* a Q8 tensor's scales stay whole (its pieces use them) */
    if (n >= k && !strcmp(name + n - k, "_scale")) return 0;
    return ndim == 2 && shape[0] > 1;
}

int k3_tensor_splittable(const char *name, int ndim, const uint64_t *shape)
{
    const char *router = "block_sparse_moe.gate.weight";
    size_t n = strlen(name), k = strlen(router);
    if (n >= k && !strcmp(name + n - k, router)) return 0;
    return k3_tensor_by_rows(name, ndim, shape);
}

/* The exchange group of a split matrix (k3_split_mat.group): the products model_attn.c and
   model_ffn.c make of one input in one k3_lin_fused. */
static uint32_t split_group(const k3_config *c, int unit, const char *name)
{
    static const struct { const char *suffix; int kda; uint32_t group; } g[] = {   /* kda -1: either */
        {"self_attn.q_proj.weight", -1, 1}, {"self_attn.k_proj.weight", 1, 1}, {"self_attn.v_proj.weight", 1, 1},
        {"self_attn.q_a_proj.weight", 0, 1}, {"self_attn.kv_a_proj_with_mqa.weight", 0, 1},
        {"self_attn.g_proj.weight", 0, 1},
        {"mlp.gate_proj.weight", -1, 2}, {"mlp.up_proj.weight", -1, 2},
        {"block_sparse_moe.routed_expert_down_proj.weight", -1, 3},
        {"block_sparse_moe.shared_experts.gate_proj.weight", -1, 3},
        {"block_sparse_moe.shared_experts.up_proj.weight", -1, 3},
    };
    if (unit < 0 || (uint32_t)unit >= c->num_hidden_layers) return 0;
    int kda = k3_layer_is_kda(c, (uint32_t)unit);
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        size_t k = strlen(g[i].suffix);
        if (n >= k && !strcmp(name + n - k, g[i].suffix) && (g[i].kda < 0 || g[i].kda == kda)) return g[i].group;
    }
    return 0;
}

void k3_geometry_add_mat(k3_geometry *g, const k3_config *c, int unit, const char *name, int ndim,
                         const uint64_t *shape, uint64_t size)
{
    if (unit < 0 || g->n_mats == UINT32_MAX || !k3_tensor_splittable(name, ndim, shape)) return;
    if (g->n_mats == K3_MAX_SPLIT_MATS || shape[0] > UINT32_MAX || size / shape[0] > UINT32_MAX) {
        g->n_mats = UINT32_MAX;
        return;
    }
    k3_split_mat *m = &g->mats[g->n_mats++];
    m->unit = (uint32_t)unit;
    m->rows = (uint32_t)shape[0];
    m->row_bytes = (uint32_t)(size / shape[0]);
    m->cols = (uint32_t)(ndim == 2 ? shape[1] : 0);
    m->scale_row_bytes = m->row_bytes == m->cols ? m->cols / 32 : 0;
    m->group = split_group(c, unit, name);
}

int k3_tensor_in_pieces(const char *name, int ndim, const uint64_t *shape, uint64_t size, uint64_t chunk)
{
    return k3_tensor_by_rows(name, ndim, shape) && size > chunk / 4;
}

static uint64_t gcd64(uint64_t a, uint64_t b)
{
    while (b) { uint64_t t = a % b; a = b; b = t; }
    return a;
}

uint64_t k3_piece_rows(uint64_t rows, uint64_t row_bytes, uint64_t chunk)
{
    uint64_t r = row_bytes ? chunk / row_bytes : rows;
    if (r < 1) r = 1;
    uint64_t g = row_bytes ? K3_UNIT_ALIGN / gcd64(row_bytes, K3_UNIT_ALIGN) : 1;   /* rows per aligned step */
    if (r >= g) r -= r % g;
    return r < rows ? r : rows;
}

void k3_unit_add(k3_unit_acc *a, const char *name, int ndim, const uint64_t *shape, uint64_t size, uint64_t chunk)
{
    a->bytes += k3_unit_span(size);
    if (!k3_tensor_in_pieces(name, ndim, shape, size, chunk)) { a->small += k3_unit_span(size); return; }
    uint64_t rb = size / shape[0], pr = k3_piece_rows(shape[0], rb, chunk);
    if (k3_unit_span(pr * rb) > a->piece) a->piece = k3_unit_span(pr * rb);
}

/* The weights a trunk tensor holds (its elements; a Q8 matrix's NAME_scale holds none). */
static uint64_t tensor_weights(const char *name, int ndim, const uint64_t *shape)
{
    size_t n = strlen(name), k = strlen("_scale");
    if (n >= k && !strcmp(name + n - k, "_scale")) return 0;
    uint64_t w = 1;
    for (int i = 0; i < ndim; i++) w *= shape[i];
    return w;
}

/* A unit's stream figures from its sums: read whole (at most a chunk), or in row pieces. */
static void unit_finish(k3_geometry *g, uint32_t u, const k3_unit_acc *a)
{
    g->unit_bytes[u] = a->bytes;
    int split = a->bytes > g->chunk;
    g->piece_bytes[u] = split ? a->piece : a->bytes;
    g->small_bytes[u] = split ? a->small : 0;
}

static void geometry_common(const k3_config *c, k3_geometry *g)
{
    g->n_units = c->num_hidden_layers + 1;
    for (uint32_t u = 0; u < g->n_units; u++) g->trunk_bytes += g->unit_bytes[u];
    g->embed_row_bytes = (uint64_t)c->hidden_size * 2;
    g->top_k = c->num_experts ? c->num_experts_per_token : 0;
}

k3_err k3_geometry_from_manifest(const k3_manifest *m, const k3_config *c, k3_geometry *g, k3_diag *d)
{
    memset(g, 0, sizeof *g);
    g->chunk = k3_chunk_bytes();
    k3_unit_acc *acc = calloc(c->num_hidden_layers + 1, sizeof *acc);   /* [n_units] */
    if (!acc) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        const k3_mf_tensor *t = &m->tensors[i];
        int u = k3_trunk_unit(t->name, c->num_hidden_layers);
        if (u >= 0) {
            k3_unit_add(&acc[u], t->name, t->ndim, t->shape, t->size, g->chunk);
            g->trunk_weights += tensor_weights(t->name, t->ndim, t->shape);
        }
        k3_geometry_add_mat(g, c, u, t->name, t->ndim, t->shape, t->size);
    }
    for (uint32_t u = 0; u <= c->num_hidden_layers; u++) unit_finish(g, u, &acc[u]);
    free(acc);
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
    g->chunk = k3_chunk_bytes();
    k3_xlist xl;
    k3_err e = k3_expected_tensors(c, &xl, d);
    if (e) return e;
    k3_unit_acc *acc = calloc(c->num_hidden_layers + 1, sizeof *acc);   /* [n_units] */
    if (!acc) { k3_xlist_free(&xl); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
    int first_moe = -1;
    uint64_t rec = 0;
    for (size_t i = 0; i < xl.n; i++) {
        const k3_xtensor *t = &xl.t[i];
        const char *ex = strstr(t->name, ".experts.");
        if (!ex) {
            int u = k3_trunk_unit(t->name, c->num_hidden_layers);
            if (u >= 0) {
                k3_unit_add(&acc[u], t->name, t->rank, t->shape, t->nbytes, g->chunk);
                g->trunk_weights += tensor_weights(t->name, t->rank, t->shape);
            }
            k3_geometry_add_mat(g, c, u, t->name, t->rank, t->shape, t->nbytes);
            continue;
        }
        if (first_moe < 0) first_moe = t->layer;
        if (t->layer == first_moe && !strncmp(ex, ".experts.0.", 11))
            rec = align_up(rec, 64) + t->nbytes;                     /* parts in record order, 64-aligned */
    }
    k3_xlist_free(&xl);
    for (uint32_t u = 0; u <= c->num_hidden_layers; u++) unit_finish(g, u, &acc[u]);
    free(acc);
    geometry_common(c, g);
    for (uint32_t i = 0; i < c->num_hidden_layers; i++) g->n_moe_layers += k3_layer_is_moe(c, i) ? 1 : 0;
    g->expert_record = rec;
    g->expert_stride = align_up(rec, 4096);
    g->n_experts_total = (uint64_t)g->n_moe_layers * c->num_experts;
    g->experts_bytes = g->n_experts_total * g->expert_stride;
    return K3_OK;
}

void k3_geometry_for_rank(const k3_geometry *g, int rank, int ranks, int first, k3_geometry *out)
{
    *out = *g;
    if (ranks <= 1) return;
    out->ranks = (uint32_t)k3_expert_holders(ranks, first);  /* ranks holding experts */
    uint64_t per = g->n_moe_layers ? g->n_experts_total / g->n_moe_layers : 0;
    out->n_experts_total = k3_expert_share(per, rank, ranks, first) * g->n_moe_layers;
    out->experts_bytes = out->n_experts_total * g->expert_stride;
    if (rank == 0) return;
    for (uint32_t u = 0; u < g->n_units; u++) out->unit_bytes[u] = out->piece_bytes[u] = out->small_bytes[u] = 0;
    out->trunk_bytes = 0;
    out->trunk_weights = 0;
    out->embed_row_bytes = 0;
}

/* One trunk arrangement: units larger than `cap` resident, the others streamed unless `room`
   bytes let them be resident too (largest first). */
typedef struct arrangement {
    uint64_t need;               /* memory before any optional unit is made resident */
    uint64_t resident, buffers, streamed;
    uint64_t piece, small;       /* the stream buffers' sizes (each x 2) */
    uint32_t n_streamed, n_split;
    uint8_t streamed_flag[K3_MAX_LAYERS + 1];
} arrangement;

static int unit_split(const k3_geometry *g, uint32_t u) { return g->unit_bytes[u] > g->chunk; }

/* The stream buffers for a's streamed units: two of the largest piece, two of the largest small
   part. Two or fewer whole units would sit in the buffers for good: they are made resident. */
static void stream_buffers(const k3_geometry *g, arrangement *a)
{
    a->piece = a->small = 0;
    a->n_split = 0;
    for (uint32_t u = 0; u < g->n_units; u++) {
        if (!a->streamed_flag[u]) continue;
        if (g->piece_bytes[u] > a->piece) a->piece = g->piece_bytes[u];
        if (g->small_bytes[u] > a->small) a->small = g->small_bytes[u];
        a->n_split += (uint32_t)unit_split(g, u);
    }
    a->buffers = a->n_streamed ? 2 * (a->piece + a->small) : 0;
    if (a->n_streamed && a->n_streamed <= 2 && !a->n_split) {
        a->resident += a->streamed;
        a->streamed = a->buffers = a->piece = a->small = 0;
        a->n_streamed = 0;
        memset(a->streamed_flag, 0, sizeof a->streamed_flag);
    }
}

static void arrange(const k3_geometry *g, const uint32_t *by_size, uint64_t cap, uint64_t room, arrangement *a)
{
    memset(a, 0, sizeof *a);
    for (uint32_t i = 0; i < g->n_units; i++) {
        uint64_t b = g->unit_bytes[by_size[i]];
        if (b > cap || cap == 0) a->resident += b;
        else { a->streamed_flag[by_size[i]] = 1; a->n_streamed++; a->streamed += b; }
    }
    if (!a->n_streamed) { a->need = a->resident; return; }
    stream_buffers(g, a);
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
    stream_buffers(g, a);                                  /* they shrink to what is left */
}

static const k3_geometry *sort_geo;
static int by_size_desc(const void *x, const void *y)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    const k3_geometry *g = sort_geo;
    if (g->unit_bytes[a] != g->unit_bytes[b]) return g->unit_bytes[a] < g->unit_bytes[b] ? 1 : -1;
    if (g->piece_bytes[a] != g->piece_bytes[b]) return g->piece_bytes[a] < g->piece_bytes[b] ? 1 : -1;
    if (g->small_bytes[a] != g->small_bytes[b]) return g->small_bytes[a] < g->small_bytes[b] ? 1 : -1;
    return (a > b) - (a < b);
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
    return (double)streamed + (double)g->n_moe_layers * g->top_k / (g->ranks > 1 ? g->ranks : 1) * miss *
                                  (double)g->expert_record;
}

/*
 * The exact search. Units of equal size (and equal pieces) are interchangeable, so a choice of
 * streamed units is a count per class; every count vector whose memory (resident units + the
 * stream buffers) fits in `room` is tried, and the one with the fewest expected bytes read per
 * token wins (ties: more trunk resident, then less memory). One or two streamed units count only
 * where one of them is read in row pieces (whole ones would stay in the buffers). Real models have
 * a handful of classes (K3: 4, so 6,900 vectors); returns 0 without trying when there are more
 * than K3_PLAN_EXACT_MAX vectors (the caller then uses arrange()'s heuristic).
 */
#define K3_PLAN_EXACT_MAX (1u << 20)
static int plan_exact(const plan_ctx *x, const uint32_t *by_size, arrangement *best, int *have)
{
    const k3_geometry *g = x->g;
    uint64_t size[K3_MAX_LAYERS + 1], piece[K3_MAX_LAYERS + 1], small[K3_MAX_LAYERS + 1];
    uint32_t cnt[K3_MAX_LAYERS + 1], first[K3_MAX_LAYERS + 1], s[K3_MAX_LAYERS + 1], m = 0;
    uint8_t split[K3_MAX_LAYERS + 1];
    uint64_t vectors = 1;
    for (uint32_t i = 0; i < g->n_units; i++) {
        uint32_t u = by_size[i];
        if (m && size[m - 1] == g->unit_bytes[u] && piece[m - 1] == g->piece_bytes[u] &&
            small[m - 1] == g->small_bytes[u]) { cnt[m - 1]++; continue; }
        size[m] = g->unit_bytes[u];
        piece[m] = g->piece_bytes[u];
        small[m] = g->small_bytes[u];
        split[m] = (uint8_t)unit_split(g, u);
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
        uint32_t n = 0, ns = 0;
        uint64_t sum = 0, mp = 0, ms = 0;
        for (uint32_t c = 0; c < m; c++) {
            if (!s[c]) continue;
            n += s[c];
            ns += split[c] ? s[c] : 0;
            sum += s[c] * size[c];
            if (piece[c] > mp) mp = piece[c];
            if (small[c] > ms) ms = small[c];
        }
        if (n == 0 || n >= 3 || ns) {
            uint64_t mem = g->trunk_bytes - sum + (n ? 2 * (mp + ms) : 0);
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
                    best->n_split = ns;
                    best->streamed = sum;
                    best->resident = g->trunk_bytes - sum;
                    best->piece = n ? mp : 0;
                    best->small = n ? ms : 0;
                    best->buffers = n ? 2 * (mp + ms) : 0;
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
    p->piece_buffer = best.piece;
    p->small_buffer = best.small;
    p->n_chunked = best.n_split;
    p->chunk = g->chunk;
    p->trunk_streamed = best.streamed;
    fixed += p->trunk_resident + p->stream_buffers;
    uint64_t slots = g->expert_stride ? (budget - fixed) / g->expert_stride : 0;
    if (slots > g->n_experts_total) slots = g->n_experts_total;
    p->expert_slots = slots;
    p->expert_cache = slots * g->expert_stride;
    p->experts_all_resident = slots == g->n_experts_total;
    p->resident = fixed + p->expert_cache;
    p->expert_reads_per_token = p->experts_all_resident ? 0.0
        : (double)g->n_moe_layers * k / (g->ranks > 1 ? g->ranks : 1) * (1.0 - (double)slots / (double)g->n_experts_total);
    p->disk_per_token = disk_for(g, p->trunk_streamed, slots) + g->embed_row_bytes;
    return K3_OK;
}

k3_err k3_plan_for(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context, uint32_t batch,
                   int all_logits, k3_plan *p, k3_diag *d)
{
    return k3_plan_with_snapshots(c, g, budget, context, batch, all_logits, 0, 0, p, d);
}

k3_err k3_plan_seq(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context, uint32_t batch,
                   int all_logits, uint32_t snapshots, uint32_t verify, uint32_t n_seq, k3_plan *p, k3_diag *d)
{
    if (verify > batch) verify = batch;
    if (verify < 2) verify = 0;
    if (n_seq < 1) n_seq = 1;
    k3_model_shape s;
    k3_err e = k3_model_shape_from_config(c, batch, context, all_logits, verify, n_seq, &s, d);
    if (e) return e;
    uint64_t one = s.kda_bytes + (uint64_t)s.d.V * sizeof(float);   /* = k3_model_snap_bytes */
    /* each sequence's chat keeps its own snapshots (k3run serve: one chat per slot) */
    e = k3_plan_make(c, g, budget, context, batch, s.total + (uint64_t)snapshots * n_seq * one,
                     s.kda_bytes * n_seq, s.mla_bytes * n_seq, p, d);
    p->n_snapshots = snapshots * n_seq;
    p->snapshot_bytes = one;
    p->verify_tokens = verify;
    p->verify_bytes = s.verify_bytes;
    p->n_seq = n_seq;
    p->seq_bytes = s.seq_bytes;
    p->minimum -= s.verify_bytes;                     /* the floor: without them, k3run runs undrafted */
    if (e == K3_ERR_USAGE && verify)                  /* speculation only changes the speed: never refuse for it */
        return k3_plan_seq(c, g, budget, context, batch, all_logits, snapshots, 0, n_seq, p, d);
    return e;
}

k3_err k3_plan_with_snapshots(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context,
                              uint32_t batch, int all_logits, uint32_t snapshots, uint32_t verify, k3_plan *p,
                              k3_diag *d)
{
    return k3_plan_seq(c, g, budget, context, batch, all_logits, snapshots, verify, 1, p, d);
}

int k3_batch_parse(const char *s, uint32_t *out)
{
    if (!strcmp(s, "auto")) { *out = K3_BATCH_AUTO; return 0; }
    uint64_t v = 0;
    const char *q = s;
    while (*q >= '0' && *q <= '9' && v <= K3_BATCH_MAX) v = v * 10 + (uint64_t)(*q++ - '0');
    if (q == s || *q || v < 1 || v > K3_BATCH_MAX) return -1;
    *out = (uint32_t)v;
    return 0;
}

/* What one more token of batch adds to the model's buffers at `batch` (model_shape.c: the [B]-sized
   activations and scratch; nearly linear, but some scratch is the larger of a batch's and a decode
   step's). */
static uint64_t batch_token_bytes(const k3_config *c, uint32_t batch, uint32_t context, int all_logits,
                                  uint32_t verify, uint32_t n_seq)
{
    k3_model_shape a, b;
    k3_diag d;
    if (k3_model_shape_from_config(c, batch, context, all_logits, verify, n_seq, &a, &d) ||
        k3_model_shape_from_config(c, batch + 1, context, all_logits, verify, n_seq, &b, &d))
        return 0;
    return b.total - a.total;
}

/* Bytes a run reads under plan p: the prompt's passes, then `generate` tokens, each but the
   first (the prompt's last pass gives its logits) a pass of its own. */
static double run_bytes(const k3_geometry *g, const k3_plan *p, uint32_t prompt, uint32_t generate)
{
    k3_prompt_cost pc;
    k3_prompt_cost_of(NULL, g, p, prompt, &pc);
    return pc.read_bytes + (generate ? generate - 1 : 0) * p->disk_per_token;
}

k3_err k3_plan_choose_seq(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context,
                          uint32_t batch, uint32_t prompt, uint32_t generate, int all_logits, uint32_t snapshots,
                          uint32_t verify, uint32_t n_seq, k3_plan *p, k3_diag *d)
{
    k3_err e;
    if (n_seq < 1) n_seq = 1;
    if (batch != K3_BATCH_AUTO && batch < n_seq) batch = n_seq;     /* a pass carries a row of each */
    if (batch != K3_BATCH_AUTO) {
        e = k3_plan_seq(c, g, budget, context, batch, all_logits, snapshots, verify, n_seq, p, d);
        if (!e) p->batch_token_bytes = batch_token_bytes(c, batch, context, all_logits, p->verify_tokens, n_seq);
        return e;
    }
    /* the floor: one token per pass (of each sequence), no speculation (a refusal states this
       minimum) */
    k3_plan one, base, best, trial;
    uint32_t lo1 = n_seq;
    if ((e = k3_plan_seq(c, g, budget, context, lo1, all_logits, snapshots, 0, n_seq, &one, d))) return e;
    uint32_t lo = verify > lo1 ? verify : lo1;       /* a verify pass is at most a batch */
    base = one;
    if (verify > 1) {
        k3_diag vd;
        e = k3_plan_seq(c, g, budget, context, lo, all_logits, snapshots, verify, n_seq, &base, &vd);
        if (e == K3_ERR_USAGE) { base = one; lo = lo1; }   /* no room for its batch: without speculation */
        else if (e) return k3_fail(d, e, "%s", vd.msg);
    }
    uint32_t P = prompt && prompt < context ? prompt : context;   /* the prompt priced */
    uint32_t cap = P < K3_BATCH_AUTO_MAX ? P : K3_BATCH_AUTO_MAX;
    if (cap < lo) cap = lo;
    /* the candidates, largest first: the batch of each number of passes n (ceil(P / n)) from the
       fewest up to 16, then every 1.5 times more, down to the least batch, which ends the list.
       The first of the fewest bytes wins: ties go to the larger batch (fewer passes, and the
       kernels' better efficiency where nothing is read at all). */
    uint32_t v = verify > 1 && base.verify_tokens ? verify : 0, prev = 0, chosen = 0;
    double best_bytes = 0;
    for (uint64_t n = (P + cap - 1) / cap;; n = n < 16 ? n + 1 : n + n / 2) {
        uint32_t B = (uint32_t)((P + n - 1) / n);
        if (B <= lo) B = lo;
        if (B == prev) continue;                     /* a batch of several pass counts: tried */
        prev = B;
        if (B == lo) trial = base;
        else {
            k3_diag td;
            e = k3_plan_seq(c, g, budget, context, B, all_logits, snapshots, v, n_seq, &trial, &td);
            if (e == K3_ERR_USAGE) continue;         /* above the budget */
            if (e) return k3_fail(d, e, "%s", td.msg);
            if (trial.verify_tokens != base.verify_tokens) continue;   /* keeps the verify pass */
            if (g->split && trial.n_streamed && !base.n_streamed) continue;   /* a split trunk stays resident */
        }
        double bytes = run_bytes(g, &trial, P, generate);
        if (!chosen || bytes < best_bytes * (1 - 1e-12)) {
            best = trial;
            best_bytes = bytes;
            chosen = B;
        }
        if (B == lo) break;
    }
    *p = best;
    p->minimum = one.minimum;
    p->batch_auto = 1;
    p->batch_cap = cap;
    p->batch_prompt = P;
    p->batch_generate = generate;
    p->batch_token_bytes = batch_token_bytes(c, chosen, context, all_logits, p->verify_tokens, n_seq);
    return K3_OK;
}

k3_err k3_plan_choose(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context, uint32_t batch,
                      uint32_t prompt, uint32_t generate, int all_logits, uint32_t snapshots, uint32_t verify,
                      k3_plan *p, k3_diag *d)
{
    return k3_plan_choose_seq(c, g, budget, context, batch, prompt, generate, all_logits, snapshots, verify, 1, p, d);
}

static double powi(double x, uint32_t n)
{
    double r = 1.0;
    for (; n; n >>= 1, x *= x)
        if (n & 1) r *= x;
    return r;
}

void k3_prompt_cost_of(const k3_config *c, const k3_geometry *g, const k3_plan *p, uint32_t tokens,
                       k3_prompt_cost *out)
{
    memset(out, 0, sizeof *out);
    uint32_t B = p->batch ? p->batch : 1;
    out->tokens = tokens;
    out->batch = B;
    out->passes = (tokens + B - 1) / B;
    if (!tokens) return;
    double per_layer = g->n_moe_layers ? (double)g->n_experts_total / g->n_moe_layers : 0;   /* E on this rank */
    double pick = per_layer > 0 ? (double)g->top_k / (g->ranks > 1 ? g->ranks : 1) / per_layer : 0;
    double miss = p->experts_all_resident || !g->n_experts_total ? 0.0
                : 1.0 - (double)p->expert_slots / (double)g->n_experts_total;
    if (pick > 1) pick = 1;
    for (uint32_t i = 0; i < 2; i++) {               /* the full passes, then the last one */
        uint32_t t = i == 0 ? B : tokens - (out->passes - 1) * B, n = i == 0 ? out->passes - 1 : 1;
        double used = per_layer * (1.0 - powi(1.0 - pick, t));   /* experts a layer's t tokens use */
        out->expert_reads += (double)n * g->n_moe_layers * used * miss;
    }
    out->trunk_bytes = (double)out->passes * (double)p->trunk_streamed;
    out->expert_bytes = out->expert_reads * (double)g->expert_record;
    out->embed_bytes = (double)tokens * (double)g->embed_row_bytes;
    out->read_bytes = out->trunk_bytes + out->expert_bytes + out->embed_bytes;

    k3_dims z;
    k3_diag d;
    if (!c || k3_model_dims(c, &z, &d)) return;     /* no config: the reads only */
    double head = (double)z.V * z.D, P = tokens;
    double body = (double)g->trunk_weights - head;  /* lm_head: one row per pass */
    if (body < 0) body = 0;
    double experts = (double)g->n_moe_layers * z.k * 3.0 * z.Ie * z.Dl;
    double mla = (double)z.n_mla * z.Hm * (4.0 * z.R + 2.0 * z.dr) * P * (P + 1) / 2;   /* position i sees i + 1 */
    double kda = (double)(z.L - z.n_mla) * 7.0 * z.H * z.K * z.K * P;
    out->attention_flops = mla + kda;
    out->flops = 2.0 * (body + experts) * P + 2.0 * head * out->passes + out->attention_flops;
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

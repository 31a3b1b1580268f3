/*
 * test_plan.c - the memory planner (k3run/plan.c) on synthetic geometries and
 * on the real Kimi K3 config (tests/data), checked against an independent
 * brute force over every choice of streamed units:
 *   - everything resident when the budget allows it;
 *   - streaming uses two buffers of the largest streamed piece (a whole unit,
 *     or a row piece of a unit larger than a chunk) and two of the largest
 *     small part, and never streams 1 or 2 whole units (they would sit in the
 *     buffers for good); a unit in row pieces may stream alone;
 *   - the minimum is exactly the smallest budget accepted (minimum succeeds,
 *     minimum - 1 is refused with a message naming the minimum) and equals the
 *     brute-force minimum;
 *   - resident never exceeds the budget, and its parts add up;
 *   - expected disk bytes per token never grow with the budget, and are never
 *     worse than the brute-force best by more than a small slack;
 *   - the report (plan_report.h) agrees with the plan.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_test.h"
#include "model_shape.h"
#include "plan.h"
#include "plan_report.h"

#define MIB (1ull << 20)
#define GIB (1ull << 30)

static k3_config cfg0;                   /* k3_plan_make does not read it */
static k3_geometry geo;                  /* ~8 KiB: static */

/* A geometry with the given unit sizes (the last one is the head) and experts. */
static void make_geo(k3_geometry *g, const uint64_t *units, uint32_t n_units, uint32_t n_moe, uint32_t experts,
                     uint32_t top_k, uint64_t record)
{
    memset(g, 0, sizeof *g);
    g->n_units = n_units;
    g->chunk = UINT64_MAX;                           /* whole units (make_split sets pieces) */
    for (uint32_t u = 0; u < n_units; u++) {
        g->unit_bytes[u] = g->piece_bytes[u] = units[u];
        g->trunk_bytes += units[u];
    }
    g->embed_row_bytes = 2048;
    g->expert_record = record;
    g->expert_stride = (record + 4095) / 4096 * 4096;
    g->n_moe_layers = n_moe;
    g->top_k = experts ? top_k : 0;
    g->n_experts_total = (uint64_t)n_moe * experts;
    g->experts_bytes = g->n_experts_total * g->expert_stride;
}

/* Units larger than `chunk` streamed in row pieces: their largest piece and small part. */
static void make_split(k3_geometry *g, uint64_t chunk, const uint64_t *piece, const uint64_t *small)
{
    g->chunk = chunk;
    for (uint32_t u = 0; u < g->n_units; u++)
        if (g->unit_bytes[u] > chunk) { g->piece_bytes[u] = piece[u]; g->small_bytes[u] = small[u]; }
}

static int split_unit(const k3_geometry *g, uint32_t u) { return g->unit_bytes[u] > g->chunk; }

/* The stream buffers for the streamed set `on` (a bit mask, or the plan's flags) */
static uint64_t buffers_of(const k3_geometry *g, const uint8_t *on, uint32_t *n, uint32_t *n_split, uint64_t *sum)
{
    uint64_t mp = 0, ms = 0;
    *n = *n_split = 0;
    *sum = 0;
    for (uint32_t u = 0; u < g->n_units; u++) {
        if (!on[u]) continue;
        (*n)++;
        *n_split += (uint32_t)split_unit(g, u);
        *sum += g->unit_bytes[u];
        if (g->piece_bytes[u] > mp) mp = g->piece_bytes[u];
        if (g->small_bytes[u] > ms) ms = g->small_bytes[u];
    }
    return *n ? 2 * (mp + ms) : 0;
}

static uint64_t min_slots(const k3_geometry *g)
{
    uint64_t s = 2ull * g->top_k;
    return s < g->n_experts_total ? s : g->n_experts_total;
}

/* Expected disk bytes per token, from the definition (not from plan.c). */
static double disk_of(const k3_geometry *g, uint64_t streamed, uint64_t slots)
{
    double miss = g->n_experts_total ? 1.0 - (double)slots / (double)g->n_experts_total : 0.0;
    return (double)streamed + (double)g->n_moe_layers * g->top_k * miss * (double)g->expert_record +
           (double)g->embed_row_bytes;
}

/* Brute force over every streamed set S (empty, at least 3 units, or any holding a unit in row
   pieces): the least trunk memory (resident units + the stream buffers), and the least disk per
   token at `budget` (expert cache of the rest). Only for small n_units. */
static void brute(const k3_geometry *g, uint64_t fixed, uint64_t budget, uint64_t *min_trunk, double *best_disk)
{
    *min_trunk = UINT64_MAX;
    *best_disk = -1;
    uint64_t base = fixed + min_slots(g) * g->expert_stride;
    for (uint32_t s = 0; s < (1u << g->n_units); s++) {
        uint8_t on[K3_MAX_LAYERS + 1];
        for (uint32_t u = 0; u < g->n_units; u++) on[u] = (uint8_t)(s >> u & 1);
        uint32_t n, ns;
        uint64_t sum, buf = buffers_of(g, on, &n, &ns, &sum);
        if ((n == 1 || n == 2) && !ns) continue;
        uint64_t mem = g->trunk_bytes - sum + buf;
        if (mem < *min_trunk) *min_trunk = mem;
        if (budget < base || mem > budget - base) continue;
        uint64_t slots = g->expert_stride ? (budget - fixed - mem) / g->expert_stride : 0;
        if (slots > g->n_experts_total) slots = g->n_experts_total;
        double dk = disk_of(g, sum, slots);
        if (*best_disk < 0 || dk < *best_disk) *best_disk = dk;
    }
}

/* Every invariant of one successful plan; returns 0 if all hold. */
static int check_plan(const k3_geometry *g, const k3_plan *p, uint64_t budget, uint64_t fixed, const char *what)
{
    int f0 = k3_test_failures;
    CHECK_MSG(p->resident <= budget, "%s: resident %" PRIu64 " > budget %" PRIu64, what, p->resident, budget);
    CHECK_MSG(p->resident == fixed + p->trunk_resident + p->stream_buffers + p->expert_cache, "%s: parts", what);
    CHECK_MSG(p->trunk_resident + p->trunk_streamed == g->trunk_bytes, "%s: trunk split", what);
    uint32_t n, ns;
    uint64_t sum, buf = buffers_of(g, p->unit_streamed, &n, &ns, &sum);
    CHECK_MSG(n == p->n_streamed && sum == p->trunk_streamed && ns == p->n_chunked, "%s: streamed flags vs counts",
              what);
    CHECK_MSG(n == 0 || n >= 3 || ns, "%s: %u whole units streamed", what, n);
    CHECK_MSG(p->stream_buffers == buf && buf == 2 * (p->piece_buffer + p->small_buffer),
              "%s: stream buffers %" PRIu64 ", expected %" PRIu64, what, p->stream_buffers, buf);
    CHECK_MSG(p->expert_cache == p->expert_slots * g->expert_stride, "%s: cache bytes", what);
    CHECK_MSG(p->expert_slots >= min_slots(g) && p->expert_slots <= g->n_experts_total, "%s: slots %" PRIu64,
              what, p->expert_slots);
    CHECK_MSG(p->experts_all_resident == (p->expert_slots == g->n_experts_total), "%s: all resident flag", what);
    /* the rest of the budget went to the cache: not one more slot fits */
    CHECK_MSG(p->experts_all_resident || budget - p->resident < g->expert_stride, "%s: %" PRIu64
              " bytes left unused", what, budget - p->resident);
    double want = disk_of(g, p->trunk_streamed, p->expert_slots);
    CHECK_MSG(p->disk_per_token > want - 1 && p->disk_per_token < want + 1, "%s: disk/token %.0f, expected %.0f",
              what, p->disk_per_token, want);
    uint64_t rep = k3_plan_disk_bytes_per_token(p, g);
    CHECK_MSG((double)rep > p->disk_per_token - 1 && (double)rep < p->disk_per_token + 1, "%s: report disk", what);
    return k3_test_failures != f0;
}

static k3_err plan(const k3_geometry *g, uint64_t budget, uint64_t fixed, k3_plan *p, k3_diag *d)
{
    return k3_plan_make(&cfg0, g, budget, 4096, 64, fixed - K3_PLAN_MARGIN, 1000, 2000, p, d);
}

/* The minimum is the smallest budget accepted, and the brute-force minimum. */
static void check_minimum(const k3_geometry *g, uint64_t fixed, const char *what)
{
    k3_plan p;
    k3_diag d = {0};
    k3_err e = plan(g, 1, fixed, &p, &d);
    CHECK_MSG(e == K3_ERR_USAGE, "%s: a 1-byte budget accepted", what);
    uint64_t minimum = p.minimum, bt;
    double bd;
    REQUIRE(minimum > 0);
    char num[32];
    snprintf(num, sizeof num, "%" PRIu64 " bytes", minimum);
    CHECK_MSG(strstr(d.msg, num) != NULL, "%s: the refusal does not name the minimum: %s", what, d.msg);
    if (g->n_units <= 16) {
        brute(g, fixed, minimum, &bt, &bd);
        CHECK_MSG(minimum == fixed + min_slots(g) * g->expert_stride + bt, "%s: minimum %" PRIu64
                  ", brute force %" PRIu64, what, minimum, fixed + min_slots(g) * g->expert_stride + bt);
    }
    e = plan(g, minimum, fixed, &p, &d);
    CHECK_MSG(e == K3_OK, "%s: the minimum %" PRIu64 " is refused: %s", what, minimum, d.msg);
    if (!e) check_plan(g, &p, minimum, fixed, what);
    e = plan(g, minimum - 1, fixed, &p, &d);
    CHECK_MSG(e == K3_ERR_USAGE, "%s: minimum - 1 accepted", what);
}

/* Budgets from the minimum up to everything resident (+ 1 GiB), `steps` of them: invariants,
   monotonic disk per token, and (small geometries) the brute-force best within `slack`. */
static void sweep(const k3_geometry *g, uint64_t fixed, int steps, double slack, const char *what)
{
    k3_plan p;
    k3_diag d = {0};
    plan(g, 1, fixed, &p, &d);
    uint64_t lo = p.minimum, hi = fixed + g->trunk_bytes + g->experts_bytes + GIB;
    double prev = -1, worst = 0;
    for (int i = 0; i <= steps; i++) {
        uint64_t b = lo + (uint64_t)((double)(hi - lo) * i / steps);
        char w[96];
        snprintf(w, sizeof w, "%s at %" PRIu64, what, b);
        k3_err e = plan(g, b, fixed, &p, &d);
        CHECK_MSG(e == K3_OK, "%s: %s", w, d.msg);
        if (e || check_plan(g, &p, b, fixed, w)) return;
        CHECK_MSG(prev < 0 || p.disk_per_token <= prev + 0.5, "%s: disk/token %.0f, more than %.0f at a smaller budget",
                  w, p.disk_per_token, prev);
        prev = p.disk_per_token;
        if (g->n_units <= 16) {
            uint64_t bt;
            double bd;
            brute(g, fixed, b, &bt, &bd);
            double over = p.disk_per_token / bd - 1;
            if (over > worst) worst = over;
            CHECK_MSG(p.disk_per_token <= bd * (1 + slack) + 1, "%s: disk/token %.0f, brute-force best %.0f", w,
                      p.disk_per_token, bd);
        }
    }
    if (g->n_units <= 16) printf("%s: worst disk/token over the brute-force best: %.3f %%\n", what, 100 * worst);
    /* everything resident from fixed + trunk + every expert on */
    uint64_t all = fixed + g->trunk_bytes + g->experts_bytes;
    REQUIRE(plan(g, all, fixed, &p, &d) == K3_OK);
    CHECK_MSG(p.n_streamed == 0 && p.experts_all_resident && p.resident == all && p.stream_buffers == 0,
              "%s: not all resident at %" PRIu64, what, all);
    CHECK_MSG(p.expert_reads_per_token == 0 && p.disk_per_token == (double)g->embed_row_bytes, "%s: reads", what);
}

static void test_synthetic(void)
{
    /* layers of three sizes and a big head, 4 MoE layers of 64 experts, top 4 */
    uint64_t u1[] = {300 * MIB, 120 * MIB, 120 * MIB, 80 * MIB, 120 * MIB, 80 * MIB, 120 * MIB, 400 * MIB};
    make_geo(&geo, u1, 8, 4, 64, 4, 3 * MIB + 100);
    uint64_t fixed = 50 * MIB + K3_PLAN_MARGIN;
    check_minimum(&geo, fixed, "synthetic 1");
    sweep(&geo, fixed, 400, 0.05, "synthetic 1");

    /* everything resident when the budget allows it */
    k3_plan p;
    k3_diag d = {0};
    REQUIRE(plan(&geo, fixed + geo.trunk_bytes + geo.experts_bytes, fixed, &p, &d) == K3_OK);
    CHECK(p.n_streamed == 0 && p.experts_all_resident && p.stream_buffers == 0 && p.expert_reads_per_token == 0);
    CHECK_EQ_U64(p.trunk_resident, geo.trunk_bytes);
    /* one byte less: every expert no longer fits, the trunk stays resident */
    REQUIRE(plan(&geo, fixed + geo.trunk_bytes + geo.experts_bytes - 1, fixed, &p, &d) == K3_OK);
    CHECK(p.n_streamed == 0 && !p.experts_all_resident && p.expert_slots == geo.n_experts_total - 1);

    /* streaming: two buffers of the largest streamed unit (the trunk cannot be resident) */
    uint64_t budget = fixed + min_slots(&geo) * geo.expert_stride + 900 * MIB;
    REQUIRE(plan(&geo, budget, fixed, &p, &d) == K3_OK);
    check_plan(&geo, &p, budget, fixed, "synthetic 1, 900 MiB of trunk");
    CHECK(p.n_streamed >= 3);

    /* all units the same size: the minimum streams all of them through 2 buffers */
    uint64_t u2[] = {100 * MIB, 100 * MIB, 100 * MIB, 100 * MIB, 100 * MIB, 100 * MIB};
    make_geo(&geo, u2, 6, 5, 32, 8, MIB);
    check_minimum(&geo, fixed, "synthetic 2");
    REQUIRE(plan(&geo, 1, fixed, &p, &d) == K3_ERR_USAGE);
    CHECK_EQ_U64(p.minimum, fixed + 16 * MIB + 200 * MIB);
    sweep(&geo, fixed, 300, 0.05, "synthetic 2");

    /* three units: streaming all three is the only streaming arrangement */
    uint64_t u3[] = {10 * MIB, 50 * MIB, 20 * MIB};
    make_geo(&geo, u3, 3, 2, 16, 2, MIB);
    check_minimum(&geo, fixed, "synthetic 3");
    REQUIRE(plan(&geo, 1, fixed, &p, &d) == K3_ERR_USAGE);
    CHECK_EQ_U64(p.minimum, fixed + 4 * MIB + 80 * MIB);        /* streaming needs 2 x 50 MiB > 80 resident */
    sweep(&geo, fixed, 200, 0.05, "synthetic 3");

    /* two units: never streamed (they would sit in the two buffers) */
    uint64_t u4[] = {70 * MIB, 30 * MIB};
    make_geo(&geo, u4, 2, 1, 8, 2, MIB);
    REQUIRE(plan(&geo, 1, fixed, &p, &d) == K3_ERR_USAGE);
    CHECK_EQ_U64(p.minimum, fixed + 4 * MIB + 100 * MIB);
    check_minimum(&geo, fixed, "synthetic 4");
    sweep(&geo, fixed, 100, 0.0, "synthetic 4");

    /* no routed experts (a dense model) */
    uint64_t u5[] = {40 * MIB, 40 * MIB, 40 * MIB, 40 * MIB, 60 * MIB};
    make_geo(&geo, u5, 5, 0, 0, 0, 0);
    check_minimum(&geo, fixed, "dense");
    sweep(&geo, fixed, 100, 0.0, "dense");

    /* 24 units of 24 sizes: 2^24 choices, more than the exact search tries; the heuristic plans
       (no brute force here: the invariants, the minimum and monotonic reads) */
    uint64_t u6[24];
    for (int i = 0; i < 24; i++) u6[i] = (uint64_t)(40 + 7 * i) * MIB + 4096ull * (uint64_t)i;
    make_geo(&geo, u6, 24, 8, 64, 4, 2 * MIB);
    check_minimum(&geo, fixed, "24 sizes");
    sweep(&geo, fixed, 2000, 0, "24 sizes");

    /* random geometries of up to 12 units */
    srand(7);
    for (int t = 0; t < 40; t++) {
        uint64_t u[12];
        uint32_t n = 3 + (uint32_t)(rand() % 10);
        uint32_t kinds = 1 + (uint32_t)(rand() % 4);
        uint64_t sizes[4];
        for (uint32_t k = 0; k < kinds; k++) sizes[k] = (uint64_t)(1 + rand() % 400) * MIB + (uint64_t)(rand() % 4096);
        for (uint32_t i = 0; i < n; i++) u[i] = sizes[rand() % kinds];
        make_geo(&geo, u, n, 1 + (uint32_t)(rand() % 8), 16 + (uint32_t)(rand() % 64), 1 + (uint32_t)(rand() % 8),
                 (uint64_t)(1 + rand() % 8) * MIB);
        char w[32];
        snprintf(w, sizeof w, "random %d", t);
        check_minimum(&geo, fixed, w);
        sweep(&geo, fixed, 150, 0.10, w);
    }

    /* units larger than a chunk in row pieces: the head and the big layers */
    uint64_t u7[] = {300 * MIB, 120 * MIB, 120 * MIB, 80 * MIB, 120 * MIB, 80 * MIB, 120 * MIB, 400 * MIB};
    uint64_t p7[] = {60 * MIB, 30 * MIB, 30 * MIB, 0, 30 * MIB, 0, 30 * MIB, 64 * MIB};
    uint64_t s7[] = {5 * MIB, 2 * MIB, 2 * MIB, 0, 2 * MIB, 0, 2 * MIB, MIB};
    make_geo(&geo, u7, 8, 4, 64, 4, 3 * MIB + 100);
    make_split(&geo, 100 * MIB, p7, s7);
    check_minimum(&geo, fixed, "pieces 1");
    REQUIRE(plan(&geo, 1, fixed, &p, &d) == K3_ERR_USAGE);
    /* everything streamed: 2 x (the largest piece: a whole 80 MiB unit; the largest small part) */
    CHECK_EQ_U64(p.minimum, fixed + min_slots(&geo) * geo.expert_stride + 2 * (80 * MIB + 5 * MIB));
    sweep(&geo, fixed, 400, 0.05, "pieces 1");
    /* only the head in pieces: it may stream alone */
    uint64_t u8[] = {20 * MIB, 20 * MIB, 500 * MIB};
    uint64_t p8[] = {0, 0, 50 * MIB}, s8[] = {0, 0, 3 * MIB};
    make_geo(&geo, u8, 3, 2, 16, 2, MIB);
    make_split(&geo, 64 * MIB, p8, s8);
    check_minimum(&geo, fixed, "pieces 2");
    REQUIRE(plan(&geo, fixed + min_slots(&geo) * geo.expert_stride + 40 * MIB + 106 * MIB, fixed, &p, &d) == K3_OK);
    CHECK(p.n_streamed == 1 && p.unit_streamed[2] && p.n_chunked == 1);
    sweep(&geo, fixed, 200, 0.05, "pieces 2");
    for (int t = 0; t < 30; t++) {
        uint64_t u[12], pc[12], sm[12], chunk = (uint64_t)(8 + rand() % 64) * MIB;
        uint32_t n = 1 + (uint32_t)(rand() % 12);
        for (uint32_t i = 0; i < n; i++) {
            u[i] = (uint64_t)(1 + rand() % 300) * MIB + (uint64_t)(rand() % 4096);
            pc[i] = chunk / (uint64_t)(1 + rand() % 3);
            sm[i] = (uint64_t)(rand() % 8) * MIB;
        }
        make_geo(&geo, u, n, 1 + (uint32_t)(rand() % 8), 16 + (uint32_t)(rand() % 64), 1 + (uint32_t)(rand() % 8),
                 (uint64_t)(1 + rand() % 8) * MIB);
        make_split(&geo, chunk, pc, sm);
        char w[32];
        snprintf(w, sizeof w, "random pieces %d", t);
        check_minimum(&geo, fixed, w);
        sweep(&geo, fixed, 150, 0.10, w);
    }
}

/* The real Kimi K3 config: the geometry from the config (k3pack's layout), then the planner
   across budgets, and the numbers docs/FORMAT.md states. */
static void test_k3(void)
{
    char path[4096];
    const char *data = getenv("K3_TEST_DATA");
    snprintf(path, sizeof path, "%s/kimi-k3-config.json", data ? data : "tests/data");
    k3_config c;
    k3_diag d = {0};
    REQUIRE(k3_config_load(path, &c, &d) == K3_OK);
    REQUIRE(k3_geometry_from_config(&c, &geo, &d) == K3_OK);
    CHECK_EQ_U64(geo.n_units, 94);
    CHECK_EQ_U64(geo.n_moe_layers, 92);
    CHECK_EQ_U64(geo.top_k, 16);
    CHECK_EQ_U64(geo.n_experts_total, 92 * 896);
    CHECK_EQ_U64(geo.expert_record, 17547264);                  /* FORMAT.md 2.3 */
    CHECK_EQ_U64(geo.expert_stride, 17547264);
    CHECK_EQ_U64(geo.embed_row_bytes, 7168 * 2);
    /* lm_head [163840, 7168] BF16 alone is 2.19 GiB: the head is at least that */
    CHECK(geo.unit_bytes[93] >= 163840ull * 7168 * 2);
    uint64_t sum = 0;
    for (uint32_t u = 0; u < geo.n_units; u++) sum += geo.unit_bytes[u];
    CHECK_EQ_U64(sum, geo.trunk_bytes);

    k3_plan p;
    REQUIRE(k3_plan_for(&c, &geo, 1, 4096, 64, 0, &p, &d) == K3_ERR_USAGE);
    uint64_t minimum = p.minimum, fixed = p.buffers + p.margin;
    CHECK_MSG(minimum < 8 * GIB, "K3's minimum %.2f GiB is above the laptop preset", minimum / (double)GIB);
    REQUIRE(k3_plan_for(&c, &geo, minimum, 4096, 64, 0, &p, &d) == K3_OK);
    check_plan(&geo, &p, minimum, fixed, "K3 at the minimum");
    CHECK(k3_plan_for(&c, &geo, minimum - 1, 4096, 64, 0, &p, &d) == K3_ERR_USAGE);
    /* every K3 unit is larger than the 64 MiB chunk, so the minimum streams them all: 2 pieces
       and 2 small parts (MLA layers': kv_a, kv_b, the router, the norms). lm_head's pieces are 4680
       rows of 7168 BF16 (14 KiB rows: an even count keeps pieces 4 KiB-aligned); the largest are the
       shared experts' down_proj's, 5461 rows of 6144 BF16 (12 KiB rows, aligned at every count) */
    if (geo.chunk == K3_CHUNK_DEFAULT) {
        uint64_t mp = 0, ms = 0;
        for (uint32_t u = 0; u < geo.n_units; u++) {
            CHECK(geo.unit_bytes[u] > geo.chunk);
            if (geo.piece_bytes[u] > mp) mp = geo.piece_bytes[u];
            if (geo.small_bytes[u] > ms) ms = geo.small_bytes[u];
        }
        CHECK_EQ_U64(geo.piece_bytes[93], 4680ull * 7168 * 2);
        CHECK_EQ_U64(mp, 5461ull * 6144 * 2);
        /* MLA layer 3: kv_a_proj [576, 7168], kv_b_proj [24576, 512], router [896, 7168] BF16; in
           4 KiB spans: six [7168] BF16 vectors (2 norms, 2 AttnRes norms and projections), the q_a
           and kv_a norms, the router bias [896] F32, the routed experts' norm [3584] BF16 */
        uint64_t mla_small = 576ull * 7168 * 2 + 24576ull * 512 * 2 + 896ull * 7168 * 2 + 6 * 16384 + 3 * 4096 + 8192;
        CHECK_EQ_U64(geo.small_bytes[3], mla_small);
        CHECK_EQ_U64(minimum, fixed + 32 * geo.expert_stride + 2 * (mp + ms));
        CHECK_MSG(minimum <= 2 * GIB, "K3's minimum %.2f GiB is above 2 GiB", minimum / (double)GIB);
    }

    /* the presets, and a sweep to 300 GiB in 4 MiB steps near the minimum, then 64 MiB */
    double prev = -1;
    uint64_t b = minimum;
    int n = 0;
    while (b < 300 * GIB) {
        char w[64];
        snprintf(w, sizeof w, "K3 at %" PRIu64, b);
        REQUIRE(k3_plan_for(&c, &geo, b, 4096, 64, 0, &p, &d) == K3_OK);
        if (check_plan(&geo, &p, b, fixed, w)) break;
        CHECK_MSG(prev < 0 || p.disk_per_token <= prev + 0.5, "%s: disk/token %.0f > %.0f at a smaller budget", w,
                  p.disk_per_token, prev);
        prev = p.disk_per_token;
        b += b < 20 * GIB ? 4 * MIB : 64 * MIB;
        n++;
    }
    printf("K3: %d budgets from %.2f GiB to 300 GiB\n", n, minimum / (double)GIB);
    const char *presets[] = {"laptop", "workstation", "server"};
    double last = -1;
    for (int i = 0; i < 3; i++) {
        uint64_t pb = k3_preset_budget(presets[i]);
        REQUIRE(k3_plan_for(&c, &geo, pb, 4096, 64, 0, &p, &d) == K3_OK);
        check_plan(&geo, &p, pb, fixed, presets[i]);
        CHECK(last < 0 || p.disk_per_token <= last);
        last = p.disk_per_token;
        printf("K3 %s: resident %.2f GiB, %u units streamed, %" PRIu64 " expert slots, %.2f GiB per token\n",
               presets[i], p.resident / (double)GIB, p.n_streamed, p.expert_slots, p.disk_per_token / (double)GIB);
    }
}

/* Bytes a run of a prompt of P tokens and N generated reads under plan p, from the definition
   (plan.h "The prompt batch"), written apart from plan.c: ceil(P / B) passes, each the streamed
   units once and per MoE layer the experts its t tokens use, E (1 - (1 - k/E)^t), that the cache
   misses (1 - slots / experts); a row of the embedding per prompt token; N - 1 decoded tokens. */
static double run_bytes_of(const k3_geometry *g, const k3_plan *p, uint32_t P, uint32_t N)
{
    double E = (double)g->n_experts_total / g->n_moe_layers, miss = p->experts_all_resident ? 0.0
                                                                    : 1 - (double)p->expert_slots / g->n_experts_total;
    double bytes = (double)P * g->embed_row_bytes;
    for (uint32_t done = 0; done < P; done += p->batch) {
        uint32_t t = P - done < p->batch ? P - done : p->batch;
        bytes += (double)p->trunk_streamed +
                 g->n_moe_layers * E * (1 - pow(1 - g->top_k / E, t)) * miss * g->expert_record;
    }
    return bytes + (N ? N - 1 : 0) * disk_of(g, p->trunk_streamed, p->expert_slots);
}

/* -b auto on the real K3 config (plan.h "The prompt batch"): the value's parser; the floor is
   batch 1's minimum; every auto plan fits, keeps its batch in [least, cap] and the verify buffers,
   and is the plain plan at its batch; against every batch tried, its run reads at most a little
   more than the best (it tries only some: each pass count to 16, then every 1.5 times more), and
   no more than at -b 1 or -b 64; the figures. */
static void test_auto_batch(void)
{
    uint32_t v = 99;
    CHECK(k3_batch_parse("auto", &v) == 0 && v == K3_BATCH_AUTO);
    CHECK(k3_batch_parse("1", &v) == 0 && v == 1);
    CHECK(k3_batch_parse("4096", &v) == 0 && v == 4096);
    const char *bad[] = {"0", "4097", "", "12x", "-1", "Auto", " 7", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) CHECK_MSG(k3_batch_parse(bad[i], &v) == -1, "'%s'", bad[i]);

    char path[4096];
    const char *data = getenv("K3_TEST_DATA");
    snprintf(path, sizeof path, "%s/kimi-k3-config.json", data ? data : "tests/data");
    k3_config c;
    k3_diag d = {0};
    REQUIRE(k3_config_load(path, &c, &d) == K3_OK);
    REQUIRE(k3_geometry_from_config(&c, &geo, &d) == K3_OK);
    k3_plan p, one;

    /* the floor: batch 1's minimum, accepted (at batch 1), one byte below refused naming it */
    REQUIRE(k3_plan_for(&c, &geo, 1, 4096, 1, 0, &one, &d) == K3_ERR_USAGE);
    uint64_t floor = one.minimum;
    REQUIRE(k3_plan_choose(&c, &geo, floor, 4096, K3_BATCH_AUTO, 0, 128, 0, 0, 0, &p, &d) == K3_OK);
    CHECK_EQ_U64(p.minimum, floor);
    CHECK_EQ_U64(p.batch, 1);
    CHECK(p.batch_auto && p.resident <= floor);
    CHECK(k3_plan_choose(&c, &geo, floor - 1, 4096, K3_BATCH_AUTO, 0, 128, 0, 0, 0, &p, &d) == K3_ERR_USAGE);
    char num[32];
    snprintf(num, sizeof num, "%" PRIu64 " bytes", floor);
    CHECK_MSG(strstr(d.msg, num) != NULL, "auto's refusal does not name batch 1's minimum: %s", d.msg);

    const uint64_t budgets[] = {floor, floor + 256 * MIB, 2 * GIB, 4 * GIB, 8 * GIB, 16 * GIB, 64 * GIB, 128 * GIB,
                                224 * GIB, 2048 * GIB};
    const uint32_t prompts[] = {0, 1, 7, 1000, 3000};
    const uint32_t gens[] = {0, 128, 100000};
    int n = 0;
    for (size_t bi = 0; bi < sizeof budgets / sizeof budgets[0]; bi++)
        for (size_t pi = 0; pi < sizeof prompts / sizeof prompts[0]; pi++)
            for (size_t gi = 0; gi < 3; gi++)
                for (uint32_t ver = 0; ver <= 9; ver += 9) {
                    uint64_t b = budgets[bi];
                    uint32_t P = prompts[pi], N = gens[gi];
                    char w[128];
                    snprintf(w, sizeof w, "K3 auto at %" PRIu64 ", prompt %u, %u generated, verify %u", b, P, N, ver);
                    REQUIRE(k3_plan_choose(&c, &geo, b, 4096, K3_BATCH_AUTO, P, N, 0, 0, ver, &p, &d) == K3_OK);
                    n++;
                    check_plan(&geo, &p, b, p.buffers + p.margin, w);
                    CHECK_MSG(p.batch_auto && p.minimum == floor, "%s: flag or floor", w);
                    /* the least batch: the verify pass's where its plan fits, else 1 */
                    uint32_t lo = ver && k3_plan_with_snapshots(&c, &geo, b, 4096, ver, 0, 0, ver, &one, &d) == K3_OK
                                  ? ver : 1;
                    uint32_t priced = P ? P : 4096, cap = priced < 2048 ? priced : 2048;
                    if (cap < lo) cap = lo;
                    CHECK_MSG(p.batch_cap == cap && p.batch >= lo && p.batch <= cap && p.batch_prompt == priced &&
                              p.batch_generate == N, "%s: batch %u, cap %u (want %u), least %u", w, p.batch,
                              p.batch_cap, cap, lo);
                    REQUIRE(k3_plan_with_snapshots(&c, &geo, b, 4096, p.batch, 0, 0, lo > 1 ? ver : 0, &one, &d) ==
                            K3_OK);
                    CHECK_MSG(one.resident == p.resident && one.disk_per_token == p.disk_per_token &&
                              one.verify_tokens == p.verify_tokens, "%s: not batch %u's plan", w, p.batch);
                    CHECK_MSG(!ver || lo == 1 || p.verify_tokens == ver ||
                              (k3_plan_with_snapshots(&c, &geo, b, 4096, ver, 0, 0, ver, &one, &d) == K3_OK &&
                               !one.verify_tokens), "%s: the verify buffers dropped", w);
                }
    printf("K3 -b auto: %d plans checked\n", n);

    /* every batch tried: auto's run within 1 % of the best, and never above -b 1's or -b 64's */
    const uint64_t tight[] = {floor + 512 * MIB, 8 * GIB};
    const uint32_t runs[][2] = {{2048, 128}, {1000, 4000}};
    for (int t = 0; t < 2; t++)
        for (int r = 0; r < 2; r++) {
            uint32_t P = runs[r][0], N = runs[r][1], best_b = 0;
            double best = 0, at1 = 0, at64 = 0;
            for (uint32_t B = 1; B <= P && B <= 2048; B++) {
                if (k3_plan_with_snapshots(&c, &geo, tight[t], 4096, B, 0, 0, 0, &one, &d) != K3_OK) continue;
                double x = run_bytes_of(&geo, &one, P, N);
                if (!best_b || x < best) { best = x; best_b = B; }
                if (B == 1) at1 = x;
                if (B == 64) at64 = x;
            }
            REQUIRE(k3_plan_choose(&c, &geo, tight[t], 4096, K3_BATCH_AUTO, P, N, 0, 0, 0, &p, &d) == K3_OK);
            double x = run_bytes_of(&geo, &p, P, N);
            printf("K3 at %.2f GiB, %u + %u tokens: the best batch %u reads %.4g TB; auto's %u %.4g TB (+%.3f %%); "
                   "-b 64 %.4g TB, -b 1 %.4g TB\n", tight[t] / (double)GIB, P, N, best_b, best / 1e12, p.batch,
                   x / 1e12, 100 * (x / best - 1), at64 / 1e12, at1 / 1e12);
            CHECK_MSG(x <= best * 1.01 && x <= at1 * (1 + 1e-12) && (!at64 || x <= at64 * (1 + 1e-12)),
                      "%.2f GiB, %u + %u: auto's batch %u reads %.6g, the best (%u) %.6g", tight[t] / (double)GIB, P,
                      N, p.batch, x, best_b, best);
        }

    /* issue 32: at 8 GiB a 1,000-token prompt reads ~16 TB at -b 64 and ~1.4 TB at auto; its compute
       is about 208 GFLOP a token (206: lm_head once a pass); at 32k, MLA's attention adds a tenth
       to two fifths */
    k3_prompt_cost at64, at_auto, long_p;
    REQUIRE(k3_plan_choose(&c, &geo, 8 * GIB, 4096, 64, 1000, 128, 0, 0, 0, &one, &d) == K3_OK);
    REQUIRE(k3_plan_choose(&c, &geo, 8 * GIB, 4096, K3_BATCH_AUTO, 1000, 128, 0, 0, 0, &p, &d) == K3_OK);
    k3_prompt_cost_of(&c, &geo, &one, 1000, &at64);
    k3_prompt_cost_of(&c, &geo, &p, 1000, &at_auto);
    CHECK_EQ_U64(p.batch, 1000);
    CHECK_EQ_U64(at_auto.passes, 1);
    CHECK_EQ_U64(at64.passes, 16);
    const double TIB = 1099511627776.0;
    CHECK_MSG(at64.read_bytes > 15 * TIB && at64.read_bytes < 17 * TIB, "batch 64: %.2f TiB", at64.read_bytes / TIB);
    CHECK_MSG(at_auto.read_bytes > 1.3 * TIB && at_auto.read_bytes < 1.5 * TIB, "auto: %.2f TiB",
              at_auto.read_bytes / TIB);
    CHECK_MSG(fabs(at_auto.read_bytes - run_bytes_of(&geo, &p, 1000, 0)) < 1e-9 * at_auto.read_bytes, "auto's reads");
    CHECK_MSG(fabs(at64.read_bytes - run_bytes_of(&geo, &one, 1000, 0)) < 1e-9 * at64.read_bytes, "-b 64's reads");
    double per = (at_auto.flops - at_auto.attention_flops) / 1000;
    CHECK_MSG(per > 200e9 && per < 215e9, "K3's weights: %.1f GFLOP a token", per / 1e9);
    CHECK_MSG(at64.flops > at_auto.flops && at64.flops - at_auto.flops < 15 * 2.0 * 163840 * 7168 + 1,
              "the compute differs by more than lm_head's extra rows");
    REQUIRE(k3_plan_choose(&c, &geo, 128 * GIB, 32000, K3_BATCH_AUTO, 32000, 128, 0, 0, 0, &p, &d) == K3_OK);
    k3_prompt_cost_of(&c, &geo, &p, 32000, &long_p);
    double share = long_p.attention_flops / (long_p.flops - long_p.attention_flops);
    CHECK_MSG(share > 0.1 && share < 0.4, "attention at 32k: %.2f of the weights' flops", share);
    printf("K3 at 8 GiB, 1,000 tokens: %.2f TiB at -b 64, %.2f TiB at -b auto; %.1f GFLOP a token; at 32k "
           "attention %.2f of the weights' flops\n", at64.read_bytes / TIB, at_auto.read_bytes / TIB, per / 1e9, share);
}

/* The report: the streamed list, and the JSON numbers against the plan. */
static void test_report(void)
{
    uint64_t u[] = {100 * MIB, 100 * MIB, 100 * MIB, 100 * MIB, 100 * MIB, 100 * MIB, 100 * MIB};
    make_geo(&geo, u, 7, 6, 32, 4, MIB);
    k3_plan p;
    memset(&p, 0, sizeof p);
    p.n_units = 7;
    char buf[64];
    CHECK_STR(k3_plan_streamed_list(&p, buf, sizeof buf), "none");
    p.unit_streamed[0] = p.unit_streamed[1] = p.unit_streamed[2] = p.unit_streamed[4] = p.unit_streamed[6] = 1;
    CHECK_STR(k3_plan_streamed_list(&p, buf, sizeof buf), "0-2, 4, head");
    char small[8];
    CHECK_STR(k3_plan_streamed_list(&p, small, sizeof small), "0-2,...");

    uint64_t fixed = 10 * MIB + K3_PLAN_MARGIN;
    k3_diag d = {0};
    REQUIRE(plan(&geo, fixed + 8 * MIB + 350 * MIB, fixed, &p, &d) == K3_OK);
    json_t *j = k3_plan_json(&p, &geo);
    REQUIRE(j != NULL);
    CHECK_EQ_U64(json_integer_value(json_object_get(j, "resident_bytes")), p.resident);
    CHECK_EQ_U64(json_integer_value(json_object_get(j, "minimum_bytes")), p.minimum);
    json_t *tr = json_object_get(j, "trunk"), *st = json_object_get(tr, "streamed");
    CHECK_EQ_U64(json_array_size(st), p.n_streamed);
    CHECK_EQ_U64(json_integer_value(json_object_get(tr, "stream_buffer_bytes")), 200 * MIB);
    size_t i;
    json_t *v;
    uint64_t sum = 0;
    json_array_foreach(st, i, v) {
        uint32_t unit = json_is_string(v) ? 6 : (uint32_t)json_integer_value(v);
        CHECK(!json_is_string(v) || !strcmp(json_string_value(v), "head"));
        CHECK(p.unit_streamed[unit]);
        sum += geo.unit_bytes[unit];
    }
    CHECK_EQ_U64(sum, p.trunk_streamed);
    uint64_t disk = (uint64_t)json_integer_value(json_object_get(j, "disk_bytes_per_token"));
    CHECK(disk == k3_plan_disk_bytes_per_token(&p, &geo));
    json_t *io = json_object_get(j, "io_seconds_per_token_at_gb_per_s");
    double s7 = json_real_value(json_object_get(io, "7"));
    CHECK(s7 > disk / 7e9 * 0.999999 && s7 < disk / 7e9 * 1.000001);
    json_decref(j);

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    REQUIRE(f != NULL);
    k3_plan_print(f, &p, &geo);
    fclose(f);
    char want[64];
    snprintf(want, sizeof want, "(%" PRIu64 " bytes)", p.resident);
    CHECK_MSG(strstr(text, want) != NULL, "the text report lacks the resident bytes: %s", text);
    CHECK(strstr(text, "GB/s") != NULL && strstr(text, "uniform routing") != NULL);
    free(text);
}

/* Sequences (issue 33): each one's state counted once per sequence, from the same list of buffers
   the model allocates; the paper figures of K3 (its KDA state, 443 MiB; with the MLA cache at
   context 4096, about 0.66 GiB); a pass of S tokens reads the streamed trunk once. */
static void test_sequences(void)
{
    char path[4096];
    const char *data = getenv("K3_TEST_DATA");
    snprintf(path, sizeof path, "%s/kimi-k3-config.json", data ? data : "tests/data");
    k3_config c;
    k3_diag d = {0};
    REQUIRE(k3_config_load(path, &c, &d) == K3_OK);
    REQUIRE(k3_geometry_from_config(&c, &geo, &d) == K3_OK);
    k3_model_shape one, four;
    REQUIRE(k3_model_shape_from_config(&c, 64, 4096, 0, 0, 1, &one, &d) == K3_OK);
    REQUIRE(k3_model_shape_from_config(&c, 64, 4096, 0, 0, 4, &four, &d) == K3_OK);
    /* the KDA states and MLA cache four times, one last-logits row each, and logits rows for four */
    CHECK_EQ_U64(four.total - one.total, 3 * one.seq_bytes + 3ull * 163840 * 4);
    CHECK_EQ_U64(one.seq_bytes, one.kda_bytes + one.mla_bytes + 163840ull * 4);
    CHECK(one.kda_bytes > 440ull << 20 && one.kda_bytes < 446ull << 20);          /* 443 MiB */
    CHECK(one.seq_bytes > (uint64_t)(0.62 * 1073741824.0) && one.seq_bytes < (uint64_t)(0.70 * 1073741824.0));
    /* the plan: S sequences' states in the buffers; a batch below S raised to S */
    k3_plan p1, p4;
    REQUIRE(k3_plan_choose_seq(&c, &geo, 8ull << 30, 4096, 4, 0, 128, 0, 0, 0, 1, &p1, &d) == K3_OK);
    REQUIRE(k3_plan_choose_seq(&c, &geo, 8ull << 30, 4096, 2, 0, 128, 0, 0, 0, 4, &p4, &d) == K3_OK);
    CHECK_EQ_U64(p4.batch, 4);
    CHECK_EQ_U64(p4.n_seq, 4);
    CHECK(p4.buffers >= p1.buffers + 3 * p1.seq_bytes);
    /* snapshots are each sequence's (k3run serve: a chat per slot keeps --snapshots of its own): 2 for
       each of 4 sequences are 8 snapshots in the buffers (before: 2 counted for all four) */
    k3_plan s0, s2;
    REQUIRE(k3_plan_seq(&c, &geo, 16ull << 30, 4096, 4, 0, 0, 0, 4, &s0, &d) == K3_OK);
    REQUIRE(k3_plan_seq(&c, &geo, 16ull << 30, 4096, 4, 0, 2, 0, 4, &s2, &d) == K3_OK);
    CHECK_EQ_U64(s2.n_snapshots, 8);
    CHECK_EQ_U64(s2.buffers - s0.buffers, 8 * s2.snapshot_bytes);
    CHECK_EQ_U64(s2.snapshot_bytes, one.kda_bytes + 163840ull * 4);
    /* a decode pass of S tokens: the streamed trunk once, S embedding rows, experts the S x k picks use */
    k3_decode_cost a, b;
    k3_decode_cost_of(&c, &geo, &p4, 1, 2048, &a);
    k3_decode_cost_of(&c, &geo, &p4, 4, 2048, &b);
    double per_layer = 896, pick = 16.0 / 896, miss = 1.0 - (double)p4.expert_slots / (92.0 * 896);
    double used4 = 92 * per_layer * (1 - pow(1 - pick, 4));
    CHECK(fabs(b.expert_reads - used4 * miss) < 1e-6 * used4);
    CHECK(fabs(b.read_bytes - ((double)p4.trunk_streamed + used4 * miss * 17547264.0 + 4 * 7168 * 2)) < 1.0);
    CHECK(fabs(b.flops - 4 * a.flops) < 1e-9 * b.flops);
    /* above the budget: refused */
    CHECK(k3_plan_choose_seq(&c, &geo, 2ull << 30, 4096, K3_BATCH_AUTO, 0, 128, 0, 0, 0, 4, &p4, &d) == K3_ERR_USAGE);
}

int main(void)
{
    test_synthetic();
    test_sequences();
    test_k3();
    test_auto_batch();
    test_report();
    return k3_test_done();
}

/*
 * plan_split.c - the trunk split by rows across MPI ranks (plan.h, K3_TRUNK=
 * split): which matrices are split, each rank's slice of their rows, what a
 * rank then keeps in memory, and what crosses the network per token. The
 * weights (which rows a rank keeps), the engine (which rows it multiplies)
 * and the planner all take their answers from here.
 */
#include "plan.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dist.h"

int k3_split_on(uint64_t rows, uint64_t size, int ranks, uint64_t min)
{
    return ranks > 1 && rows >= 2 * K3_SPLIT_BLOCK && size >= min;
}

void k3_split_rows(uint32_t rows, int rank, int ranks, uint32_t *lo, uint32_t *hi)
{
    uint64_t nb = (rows + K3_SPLIT_BLOCK - 1) / K3_SPLIT_BLOCK;
    uint64_t b0 = nb * (uint64_t)rank / (uint64_t)ranks, b1 = nb * (uint64_t)(rank + 1) / (uint64_t)ranks;
    uint64_t l = b0 * K3_SPLIT_BLOCK, h = b1 * K3_SPLIT_BLOCK;
    *lo = (uint32_t)(l < rows ? l : rows);
    *hi = (uint32_t)(h < rows ? h : rows);
}

int k3_trunk_mode(const char *v)
{
    if (!v || !*v || !strcasecmp(v, "auto")) return K3_TRUNK_AUTO;
    if (!strcasecmp(v, "rank0")) return K3_TRUNK_RANK0;
    return !strcasecmp(v, "split") ? K3_TRUNK_SPLIT : -1;
}

int k3_trunk_env(void) { return k3_trunk_mode(getenv("K3_TRUNK")); }

uint64_t k3_split_min_env(void)
{
    const char *v = getenv("K3_SPLIT_MIN");
    if (!v || !*v) return K3_SPLIT_MIN_DEFAULT;
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1ull << 10;
    else if (*end == 'M' || *end == 'm') mul = 1ull << 20;
    else if (*end == 'G' || *end == 'g') mul = 1ull << 30;
    if (mul > 1) end++;
    if (end == v || *end || *v == '-' || n > (UINT64_MAX >> 30)) return UINT64_MAX;
    return (uint64_t)n * mul;
}

/* What a split matrix takes in its unit: rows [lo, hi) (all of it: 0, rows) and their scales. */
static uint64_t mat_span(const k3_split_mat *m, uint32_t lo, uint32_t hi)
{
    if (hi <= lo) return 0;
    uint64_t n = hi - lo;
    return k3_unit_span(n * m->row_bytes) + (m->scale_row_bytes ? k3_unit_span(n * m->scale_row_bytes) : 0);
}

k3_err k3_geometry_for_rank_split(const k3_geometry *g, int rank, int ranks, int first, uint64_t min,
                                  k3_geometry *out, k3_diag *d)
{
    k3_geometry_for_rank(g, rank, ranks, first, out);   /* its experts */
    if (ranks <= 1) return K3_OK;
    if (g->n_mats == UINT32_MAX)
        return k3_fail(d, K3_ERR_USAGE, "K3_TRUNK=split: the model has more than %d trunk matrices to split",
                       K3_MAX_SPLIT_MATS);
    out->split = 1;
    for (uint32_t u = 0; u < g->n_units; u++) out->unit_bytes[u] = rank == 0 ? g->unit_bytes[u] : 0;
    for (uint32_t i = 0; i < g->n_mats; i++) {
        const k3_split_mat *m = &g->mats[i];
        uint64_t size = (uint64_t)m->rows * m->row_bytes;
        if (!k3_split_on(m->rows, size, ranks, min)) continue;
        uint32_t lo, hi;
        k3_split_rows(m->rows, rank, ranks, &lo, &hi);
        if (rank == 0) out->unit_bytes[m->unit] -= mat_span(m, 0, m->rows);
        out->unit_bytes[m->unit] += mat_span(m, lo, hi);
    }
    out->trunk_bytes = 0;
    for (uint32_t u = 0; u < g->n_units; u++) {       /* resident whole: one piece each */
        out->piece_bytes[u] = out->unit_bytes[u];
        out->small_bytes[u] = 0;
        out->trunk_bytes += out->unit_bytes[u];
    }
    return K3_OK;
}

void k3_split_traffic(const k3_geometry *g, int ranks, uint64_t min, double *sent, double *received,
                      uint32_t *exchanges)
{
    *sent = *received = 0;
    *exchanges = 0;
    if (ranks <= 1 || g->n_mats == UINT32_MAX) return;
    uint8_t *seen = calloc((size_t)g->n_units * 4, 1);   /* [unit][group]: its exchange counted */
    for (uint32_t i = 0; i < g->n_mats; i++) {
        const k3_split_mat *m = &g->mats[i];
        if (!k3_split_on(m->rows, (uint64_t)m->rows * m->row_bytes, ranks, min)) continue;
        uint32_t lo, hi;
        k3_split_rows(m->rows, 0, ranks, &lo, &hi);
        int own = !m->group || m->group > 3 || !seen || m->unit >= g->n_units;
        if (own || !seen[m->unit * 4 + m->group]) {     /* a new exchange: its header, x and statuses */
            if (!own) seen[m->unit * 4 + m->group] = 1;
            *sent += (12.0 + 4.0 * m->cols) * (ranks - 1);
            *received += 260.0 * (ranks - 1);
            ++*exchanges;
        }
        *received += 4.0 * (m->rows - (hi - lo));
    }
    free(seen);
}

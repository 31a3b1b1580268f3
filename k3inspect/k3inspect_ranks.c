/*
 * k3inspect_ranks.c - `k3inspect --plan --ranks R`: k3run's plan for each MPI
 * rank when its experts are divided among R ranks (k3run/dist/dist.h: expert
 * e on rank e % R; rank 0 also the trunk, or with --trunk split every rank a
 * slice of its rows), and what crosses the network per decoded token
 * (engine/model_dist.c's messages).
 */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "engine.h"
#include "k3inspect.h"

/* Network bytes per decoded token between rank 0 and the others (model_dist.c): per MoE layer a
   broadcast of 12 + 4 k + 4 Dl to each other rank, and back 260 of status per rank plus 4 Dl for
   each of the k slots another rank owns (uniform routing: (R-1)/R of them); with the trunk split
   (split), each exchange of split matrices too (k3_split_traffic); *trips: the exchanges. */
void k3i_rank_network(const k3_config *c, const k3_geometry *g, int R, int first, int split, uint64_t min,
                      double *sent, double *received, uint32_t *trips)
{
    double Dl = c->routed_expert_hidden_size ? (double)c->routed_expert_hidden_size : (double)c->hidden_size;
    double k = g->top_k, L = g->n_moe_layers;
    double remote = first ? 1.0 : (double)(R - 1) / R;       /* slots another rank owns */
    *sent = L * (12 + 4 * k + 4 * Dl) * (R - 1);
    *received = L * (4 * Dl * k * remote + 260.0 * (R - 1));
    *trips = g->n_moe_layers;
    double ts = 0, tr = 0;
    uint32_t tn = 0;
    if (split) k3_split_traffic(g, R, min, &ts, &tr, &tn);
    *sent += ts;
    *received += tr;
    *trips += tn;
}

/* Plans of rank 0 and of rank 1 (the others differ from rank 1 by at most one expert per layer
   and, split, one block of rows per matrix). -b auto: each rank's choice, then, as k3run's ranks
   agree on the smallest (load.c), both at the smaller of the two. */
k3_err k3i_rank_plans(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context, uint32_t batch,
                      uint32_t generate, uint32_t verify, int R, int first, int split, uint64_t min, k3_geometry *gr, k3_plan *p,
                      k3_diag *d)
{
    for (int r = 0; r < 2 && r < R; r++) {
        k3_err e = K3_OK;
        if (split) e = k3_geometry_for_rank_split(g, r, R, first, min, &gr[r], d);
        else k3_geometry_for_rank(g, r, R, first, &gr[r]);
        if (!e) e = k3_plan_choose(c, &gr[r], budget, context, batch, 0, generate, 0, 0, verify, &p[r], d);
        if (e) return e;
    }
    if (batch == K3_BATCH_AUTO && R > 1 && p[0].batch != p[1].batch) {
        int r = p[0].batch > p[1].batch ? 0 : 1;
        uint32_t b = p[1 - r].batch, cap = p[r].batch_cap;
        uint64_t floor = p[r].minimum;
        k3_err e = k3_plan_choose(c, &gr[r], budget, context, b, 0, generate, 0, 0, verify, &p[r], d);
        if (e) return e;
        p[r].batch_auto = 1;
        p[r].batch_cap = cap;
        p[r].minimum = floor;
    }
    return K3_OK;
}

/* 1 if every rank of R keeps its slices of the split trunk resident at this budget (k3run's
   K3_TRUNK=auto, when every rank has this budget). */
int k3i_split_fits(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context, uint32_t batch,
                   uint32_t generate, uint32_t verify, int R, int first, uint64_t min)
{
    static k3_geometry gr;
    static k3_plan p;
    for (int r = 0; r < R; r++) {
        k3_diag d;
        if (k3_geometry_for_rank_split(g, r, R, first, min, &gr, &d) ||
            k3_plan_choose(c, &gr, budget, context, batch, 0, generate, 0, 0, verify, &p, &d) || p.n_streamed)
            return 0;
    }
    return 1;
}

/* The fewest ranks at this budget per rank that hold every expert in memory, with the trunk where
   `mode` (K3_TRUNK_*) puts it (split: their share of the trunk too, never streamed; auto: split
   where ranks 0 and 1 keep their slices resident, the others differing by a block of rows); 0 if
   none up to 4096. */
int k3i_ranks_all_resident(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context,
                           uint32_t batch, uint32_t generate, uint32_t verify, int first, int mode, uint64_t min)
{
    static k3_geometry gr[2];
    static k3_plan p[2];
    for (int R = 1; R <= 4096; R = R < 64 ? R + 1 : R + R / 16) {
        k3_diag d;
        if (R <= first) continue;
        int split = 0;
        if (R > 1 && mode != K3_TRUNK_RANK0) {
            split = !k3i_rank_plans(c, g, budget, context, batch, generate, verify, R, first, 1, min, gr, p, &d) &&
                    !p[0].n_streamed && !p[1].n_streamed;
            if (!split && mode == K3_TRUNK_SPLIT) continue;           /* k3run would refuse */
        }
        if (!split && k3i_rank_plans(c, g, budget, context, batch, generate, verify, R, first, 0, min, gr, p, &d))
            continue;
        if (p[0].experts_all_resident && (R == 1 || p[1].experts_all_resident)) return R;
    }
    return 0;
}

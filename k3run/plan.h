/*
 * plan.h - the memory plan: from a budget, the context length, the prompt
 * batch and the model's geometry (a pack's manifest, or a bare config.json),
 * decide once what is resident and what is read per token.
 *
 *   fixed     the model's buffers (activations for a batch, KDA states, the MLA
 *             latent cache for the context, MoE scratch) + a margin for code,
 *             stacks and the allocator
 *   trunk     every non-expert tensor except the embedding table (one row of
 *             it is read per token); resident today (streaming is not built yet)
 *   experts   a fixed-slot cache keyed by (layer, expert), at least 2 x top-k
 *             slots (one layer's experts plus room to read the next); the rest
 *             of the budget, up to every expert of the model
 *
 * The minimum is fixed + trunk + the minimal expert cache; a smaller budget is
 * refused with a message that states the minimum.
 */
#ifndef K3_PLAN_H
#define K3_PLAN_H

#include <stdint.h>

#include "k3_config.h"
#include "k3_error.h"
#include "k3_manifest.h"

#define K3_PLAN_MARGIN (96ull << 20)        /* code, stacks, allocator, tokenizer */

typedef struct k3_geometry {
    uint64_t trunk_bytes;        /* every non-expert tensor but the embedding table */
    uint64_t embed_row_bytes;    /* one embedding row */
    uint64_t expert_stride;      /* bytes of one expert slot (the largest record stride) */
    uint64_t expert_record;      /* bytes hashed per expert (the largest record size) */
    uint32_t n_moe_layers;       /* layers with routed experts */
    uint64_t n_experts_total;    /* routed experts of the whole model */
    uint64_t experts_bytes;      /* n_experts_total x their strides */
} k3_geometry;

k3_err k3_geometry_from_manifest(const k3_manifest *m, const k3_config *c, k3_geometry *g, k3_diag *d);
/* From the config alone, with k3pack's record layout (docs/FORMAT.md 2.3). */
k3_err k3_geometry_from_config(const k3_config *c, k3_geometry *g, k3_diag *d);

typedef struct k3_plan {
    uint64_t budget;
    uint32_t context, batch;
    uint64_t buffers;            /* the model's buffers (k3_model_buffer_bytes) */
    uint64_t kda_state, mla_cache;   /* parts of buffers, for the report */
    uint64_t margin;
    uint64_t trunk_resident;     /* = geometry trunk_bytes */
    uint64_t expert_slots;       /* slots of the expert cache */
    uint64_t expert_cache;       /* expert_slots x stride */
    int experts_all_resident;    /* the cache holds every expert: read once, never evicted */
    uint64_t resident;           /* everything above */
    uint64_t minimum;            /* the smallest budget this model can run in */
    double disk_per_token;       /* expected bytes read per decoded token (uniform routing estimate) */
    double expert_reads_per_token;
} k3_plan;

/*
 * Make the plan. buffers/kda_state/mla_cache come from the model's own sizing
 * (k3_model_buffer_bytes). K3_ERR_USAGE when the budget is below the minimum.
 */
k3_err k3_plan_make(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context, uint32_t batch,
                    uint64_t buffers, uint64_t kda_state, uint64_t mla_cache, k3_plan *p, k3_diag *d);

/* The memory this process may use: MemAvailable and the cgroup limit (v1 or v2), whichever is
   smaller; 0 if unknown. *source names where it came from. */
uint64_t k3_machine_memory(const char **source);

/* Preset budgets: laptop 8G, workstation 128G, server 224G; 0 if unknown. */
uint64_t k3_preset_budget(const char *name);

#endif

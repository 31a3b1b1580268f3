/*
 * plan.h - the memory plan: from a budget, the context length, the prompt
 * batch and the model's geometry (a pack's manifest, or a bare config.json),
 * decide once what is resident and what is read per token.
 *
 *   fixed     the model's buffers (activations for a batch, KDA states, the MLA
 *             latent cache for the context, MoE scratch) + a margin for code,
 *             stacks and the allocator
 *   trunk     the non-expert tensors in units: one unit per layer and the head
 *             (final norms, lm_head). A unit is resident, or streamed: read from
 *             disk every token in pieces through two buffers (the next piece is
 *             read while this one computes). A unit of at most one chunk
 *             (K3_CHUNK, 64 MiB) is one piece; a larger one is read in row
 *             pieces: its large matrices (k3_tensor_by_rows) in row ranges of at
 *             most a chunk, the rest of it (norms, vectors, small matrices: its
 *             "small part") into two more buffers, held while the layer computes.
 *             A matrix-vector product is separable by rows, so the bits are the
 *             same; real K3's floor drops from two 2.19 GiB units to two chunks.
 *             The embedding table is never resident: one row of it per token.
 *   experts   a fixed-slot cache keyed by (layer, expert), at least 2 x top-k
 *             slots (one layer's experts plus room to read the next); the rest
 *             of the budget, up to every expert of the model
 *
 * A resident trunk byte saves one byte of reading per token; an expert-cache
 * byte saves about top-k / num_experts of one. So the plan keeps as much trunk
 * resident as fits first, and gives the rest to the expert cache. Precisely:
 * units of equal size are interchangeable, so every choice of streamed units
 * (a count per unit size; K3 has 4 sizes) is tried, and the one with the
 * fewest expected bytes read per token wins (uniform routing for the experts);
 * past 2^20 choices, a heuristic (largest units resident first). The minimum
 * is fixed + the smallest trunk arrangement + the minimal expert cache; a
 * smaller budget is refused with a message that states the minimum.
 */
#ifndef K3_PLAN_H
#define K3_PLAN_H

#include <stdint.h>

#include "k3_config.h"
#include "k3_error.h"
#include "k3_manifest.h"

#define K3_PLAN_MARGIN (96ull << 20)        /* code, stacks, allocator, tokenizer */
#define K3_UNIT_ALIGN 4096ull               /* trunk tensors sit 4 KiB-aligned in a unit's memory */
#define K3_DRAFT_DEFAULT 0                  /* k3run --draft when not given (off: docs/PERFORMANCE.md) */
#define K3_DRAFT_DEFAULT_STR "0 (off)"

/* The trunk unit of a tensor name: layer i (< n_layers) -> i, the head (other model-level
   tensors) -> n_layers; -1 for the embedding table and for layers the model does not have. */
int k3_trunk_unit(const char *name, uint32_t n_layers);
/* Bytes a tensor of `size` bytes takes in a unit's memory (O_DIRECT-readable: 4 KiB granules). */
uint64_t k3_unit_span(uint64_t size);

/* Row pieces (docs/PERFORMANCE.md, "Row pieces"). */
#define K3_CHUNK_DEFAULT (64ull << 20)
/* The chunk: K3_CHUNK=SIZE from the environment (at least 4 KiB; "off" or 0: never split a
   unit), else K3_CHUNK_DEFAULT. UINT64_MAX for off. */
uint64_t k3_chunk_bytes(void);
/* 1 if a tensor of this name and shape is a matrix the model multiplies by rows, once per pass
   (k3_lin): two dimensions, more than one row, not the MLA kv_b_proj (read per head, twice). */
int k3_tensor_by_rows(const char *name, int ndim, const uint64_t *shape);
/* 1 if such a tensor of `size` bytes is read in row pieces when its unit is larger than a chunk
   (larger than a quarter chunk); 0: it goes into the unit's small part. */
int k3_tensor_in_pieces(const char *name, int ndim, const uint64_t *shape, uint64_t size, uint64_t chunk);
/* Rows of one piece of a [rows][row_bytes] matrix: as many as fit in `chunk` (at least 1),
   rounded down to keep every piece's offset 4 KiB-aligned where that leaves at least one. */
uint64_t k3_piece_rows(uint64_t rows, uint64_t row_bytes, uint64_t chunk);

/* What one unit takes in the stream: sum over its tensors with k3_unit_add. */
typedef struct k3_unit_acc {
    uint64_t bytes;              /* every tensor (k3_unit_span each) */
    uint64_t small;              /* the tensors not read in pieces */
    uint64_t piece;              /* the largest row piece (span) */
} k3_unit_acc;
void k3_unit_add(k3_unit_acc *a, const char *name, int ndim, const uint64_t *shape, uint64_t size, uint64_t chunk);

/*
 * The trunk split by rows across MPI ranks (K3_TRUNK=split, docs/PERFORMANCE.md "The trunk
 * across ranks"): each large trunk matrix the model multiplies once per pass is cut into R
 * slices of whole 32-row blocks (the blocks the kernels cut anyway), rank r keeps and multiplies
 * slice r, and rank 0 gathers the outputs. Every output element is still one row's dot product
 * in the canonical order, so the bits are those of one process.
 */
#define K3_SPLIT_BLOCK 32u                   /* rows: = kern.h's K3_KERN_BLOCK */
#define K3_SPLIT_MIN_DEFAULT (1ull << 20)    /* a smaller matrix stays whole on rank 0 (K3_SPLIT_MIN) */
#define K3_MAX_SPLIT_MATS 4096               /* matrices a geometry lists (real K3: 1,021) */
#define K3_SPLIT_GROUP_MAX 4                 /* split matrices of one input exchanged at once */
/* 1 if a trunk tensor may be split: k3_tensor_by_rows, and not a MoE router (rank 0's
   lookahead multiplies it too, so rank 0 keeps it whole). */
int k3_tensor_splittable(const char *name, int ndim, const uint64_t *shape);
/* 1 if such a matrix of `rows` rows and `size` bytes is split among `ranks`: more than one rank,
   at least two blocks of rows, at least `min` bytes. */
int k3_split_on(uint64_t rows, uint64_t size, int ranks, uint64_t min);
/* Rank `rank`'s slice [*lo, *hi) of `rows` rows: blocks b with b * ranks / nblocks == rank,
   contiguous (it may be empty). */
void k3_split_rows(uint32_t rows, int rank, int ranks, uint32_t *lo, uint32_t *hi);
/* Where the trunk runs across ranks (K3_TRUNK): on rank 0; split by rows; or split where every
   rank's slices fit its budget whole, else on rank 0 (auto, the default). */
enum { K3_TRUNK_RANK0 = 0, K3_TRUNK_SPLIT = 1, K3_TRUNK_AUTO = 2 };
/* K3_TRUNK from the environment: "rank0", "split", or "auto" (also unset or empty); -1 anything else. */
int k3_trunk_env(void);
/* The same for a value given (NULL: auto). */
int k3_trunk_mode(const char *v);
/* K3_SPLIT_MIN=SIZE from the environment (bytes, K/M/G suffixes), else K3_SPLIT_MIN_DEFAULT;
   UINT64_MAX when it is not a size. */
uint64_t k3_split_min_env(void);

/* A splittable matrix of the trunk, as the geometry lists it. */
typedef struct k3_split_mat {
    uint32_t unit;               /* its trunk unit */
    uint32_t rows, cols;
    uint32_t row_bytes;          /* bytes of one row (size = rows x row_bytes) */
    uint32_t scale_row_bytes;    /* a Q8 matrix (one byte per weight): its NAME_scale's bytes per row
                                    (cols / 32), sliced with it; else 0 */
    uint32_t group;              /* 0: exchanged alone; else the matrices of its unit with this group
                                    multiply one input in one k3_lin_fused and share one exchange:
                                    1 the attention's input (KDA q, k, v; MLA q or q_a, kv_a, g),
                                    2 the dense FFN's gate and up, 3 the MoE's latent down and shared
                                    gate and up */
} k3_split_mat;

typedef struct k3_geometry {
    uint64_t trunk_bytes;        /* every unit (all non-expert tensors but the embedding table) */
    uint32_t n_units;            /* n_layers + 1: the layers, then the head */
    uint64_t unit_bytes[K3_MAX_LAYERS + 1];   /* [n_units] memory of one unit (k3_unit_span of its tensors) */
    uint64_t chunk;              /* k3_chunk_bytes() when the geometry was made */
    uint64_t piece_bytes[K3_MAX_LAYERS + 1];  /* [n_units] its largest piece when streamed: the whole unit
                                                 (at most a chunk), else its largest row piece */
    uint64_t small_bytes[K3_MAX_LAYERS + 1];  /* [n_units] its small part when read in row pieces, else 0 */
    uint64_t embed_row_bytes;    /* one embedding row */
    uint64_t trunk_weights;      /* weights of the units' tensors (elements; a Q8 matrix's scales not counted):
                                    what a token multiplies, the prompt's compute (k3_prompt_cost) */
    uint64_t expert_stride;      /* bytes of one expert slot (the largest record stride) */
    uint64_t expert_record;      /* bytes hashed per expert (the largest record size) */
    uint32_t n_moe_layers;       /* layers with routed experts */
    uint32_t top_k;              /* experts per token per MoE layer */
    uint64_t n_experts_total;    /* routed experts of the whole model */
    uint64_t experts_bytes;      /* n_experts_total x their strides */
    uint32_t ranks;              /* 0 or 1: one process; else this geometry is one MPI rank's share
                                    (k3_geometry_for_rank): a token asks it for top_k / ranks experts
                                    per MoE layer on average */
    int split;                   /* this rank's share of a trunk split by rows (k3_geometry_for_rank_split):
                                    unit_bytes are its slices (and on rank 0 the unsplit tensors) */
    uint32_t n_mats;             /* splittable matrices listed (UINT32_MAX: more than K3_MAX_SPLIT_MATS) */
    k3_split_mat mats[K3_MAX_SPLIT_MATS];
} k3_geometry;

/* List tensor `name` in g->mats if it is splittable (the geometry makers call it for every
   trunk tensor of unit `unit`, c the model's config). */
void k3_geometry_add_mat(k3_geometry *g, const k3_config *c, int unit, const char *name, int ndim,
                         const uint64_t *shape, uint64_t size);

k3_err k3_geometry_from_manifest(const k3_manifest *m, const k3_config *c, k3_geometry *g, k3_diag *d);
/* From the config alone, with k3pack's layout (docs/FORMAT.md 2.3). */
k3_err k3_geometry_from_config(const k3_config *c, k3_geometry *g, k3_diag *d);

typedef struct k3_plan {
    uint64_t budget;
    uint32_t context, batch;     /* batch: tokens per forward pass, as given or as chosen (-b auto) */
    int batch_auto;              /* the planner chose the batch (K3_BATCH_AUTO) */
    uint32_t batch_cap;          /* then the most it could choose: the prompt, the context, K3_BATCH_AUTO_MAX */
    uint32_t batch_prompt, batch_generate;   /* and the run it priced: prompt tokens, tokens generated */
    uint64_t batch_token_bytes;  /* what one more token of batch adds to the buffers (activations and the
                                    scratch sized by the batch: model_shape.c), at this batch */
    uint64_t buffers;            /* the model's buffers (k3_model_shape_from_config) */
    uint64_t kda_state, mla_cache;   /* parts of buffers, for the report */
    uint64_t margin;
    uint32_t n_snapshots;        /* state snapshots kept (chat's prompt cache) by all sequences together,
                                    counted in buffers */
    uint64_t snapshot_bytes;     /* one of them: the KDA state and a logits row (k3_model_snap_bytes) */
    uint32_t verify_tokens;      /* tokens of a speculative verify pass (1 + drafted), 0: no speculation */
    uint64_t verify_bytes;       /* what its buffers add, counted in buffers (model_shape.h) */
    uint32_t n_seq;              /* sequences held (conversations sharing the passes: model.h "Sequences") */
    uint64_t seq_bytes;          /* one sequence's state, counted n_seq times in buffers */
    uint32_t n_units;            /* = geometry n_units */
    uint8_t unit_streamed[K3_MAX_LAYERS + 1];  /* [n_units] 1: read every token through the stream buffers */
    uint32_t n_streamed;
    uint64_t trunk_resident;     /* bytes of the resident units */
    uint64_t stream_buffers;     /* 2 x piece_buffer + 2 x small_buffer (0: nothing streamed) */
    uint64_t piece_buffer;       /* the largest piece of a streamed unit (k3_geometry piece_bytes) */
    uint64_t small_buffer;       /* the largest small part of a streamed unit read in row pieces */
    uint64_t chunk;              /* = geometry chunk */
    uint32_t n_chunked;          /* streamed units read in row pieces */
    uint64_t trunk_streamed;     /* bytes of the streamed units: read once per forward pass */
    uint64_t expert_slots;       /* slots of the expert cache */
    uint64_t expert_cache;       /* expert_slots x stride */
    int experts_all_resident;    /* the cache holds every expert: read once, never evicted */
    uint64_t resident;           /* buffers + margin + trunk_resident + stream_buffers + expert_cache */
    uint64_t minimum;            /* the smallest budget this model can run in (without the verify buffers,
                                    which k3run drops where they do not fit) */
    double expert_reads_per_token;   /* expected expert records read per decoded token (uniform routing) */
    double disk_per_token;       /* expected bytes read per decoded token: streamed trunk + expert reads
                                    + one embedding row */
} k3_plan;

/*
 * The geometry of one rank of `ranks` (experts across MPI ranks, dist.h): its experts only (those
 * of each MoE layer with k3_expert_owner(e, ranks, first) == rank: first 1 leaves rank 0 none),
 * and on a rank other than 0 no trunk and no embedding (rank 0 computes them). Planned with
 * k3_plan_*, as one process is.
 */
void k3_geometry_for_rank(const k3_geometry *g, int rank, int ranks, int first, k3_geometry *out);
/* The same with the trunk split by rows (K3_TRUNK=split; matrices of at least `min` bytes): every
   rank's units hold its slices, rank 0's also the tensors not split (and the embedding rows).
   Every unit is to be resident (k3run refuses a split plan that streams one). K3_ERR_USAGE when
   the geometry lists too many matrices. */
k3_err k3_geometry_for_rank_split(const k3_geometry *g, int rank, int ranks, int first, uint64_t min,
                                  k3_geometry *out, k3_diag *d);
/* Network bytes per forward pass of one token that splitting the trunk adds (model_split.c): per
   exchange (a split matrix alone, or a group's split matrices) of C columns, rank 0 broadcasts
   12 + 4 C to each other rank and receives 260 of status from each, and per split matrix of N rows
   4 (N - its slice) of outputs. *exchanges: how many (the round trips it adds). */
void k3_split_traffic(const k3_geometry *g, int ranks, uint64_t min, double *sent, double *received,
                      uint32_t *exchanges);

/*
 * Make the plan. buffers/kda_state/mla_cache come from the model's own sizing
 * (k3_model_shape_from_config, model_shape.h). K3_ERR_USAGE when the budget
 * is below the minimum.
 */
k3_err k3_plan_make(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context, uint32_t batch,
                    uint64_t buffers, uint64_t kda_state, uint64_t mla_cache, k3_plan *p, k3_diag *d);

/* k3_plan_make with the model's buffers sized by k3_model_shape_from_config (all_logits: --dump). */
k3_err k3_plan_for(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context, uint32_t batch,
                   int all_logits, k3_plan *p, k3_diag *d);

/* k3_plan_for with room for `snapshots` state snapshots (model.h) and for verify passes of
   `verify` tokens (speculative decoding: 1 + drafted, at most `batch`; below 2 none) in the
   buffers. Where the budget has no room for the verify buffers, the plan is made without them
   (verify_tokens 0): a refusal is only ever for the true minimum. */
k3_err k3_plan_with_snapshots(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context,
                              uint32_t batch, int all_logits, uint32_t snapshots, uint32_t verify, k3_plan *p,
                              k3_diag *d);

/* The same for a model holding n_seq sequences (model.h "Sequences"): each one's state counted, and
   `snapshots` for each of them (each slot's chat keeps its own). */
/* The snapshots a k3run serve slot keeps for --snapshots n: n for its prompt cache and, with any,
   one for its shared prefix (chat.h); what k3_plan_seq counts for each sequence. */
static inline uint32_t k3_plan_slot_snapshots(uint32_t n) { return n ? n + 1 : 0; }
k3_err k3_plan_seq(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context, uint32_t batch,
                   int all_logits, uint32_t snapshots, uint32_t verify, uint32_t n_seq, k3_plan *p, k3_diag *d);

/*
 * The prompt batch (docs/k3run.md "Prompt batch"). A pass of B prompt tokens reads every streamed
 * unit once and each expert its tokens use once, so a prompt of P tokens reads the trunk
 * ceil(P / B) times; the buffers of a pass grow with B (real K3: 1.3 MiB per token, seven 7168-float
 * rows of the residual stream and the AttnRes blocks among them), and what they take is not
 * there for the trunk and the expert cache while tokens are generated.
 *
 * -b auto (K3_BATCH_AUTO, the default of k3run, chat and serve): the B that reads the fewest bytes
 * for a run of a prompt of P tokens (the prompt given; not known, as in chat and serve: the
 * context) and N generated tokens (-n): ceil(P / B) passes of the prompt (k3_prompt_cost) and
 * N - 1 decoded tokens at the plan's bytes per token, which grow as the batch's buffers take
 * memory from the trunk and the expert cache. B runs from the least batch, max(1, verify), to the
 * cap, min(P, K3_BATCH_AUTO_MAX); tried: the batch of each number of passes, ceil(P / n), for n up
 * to 16 then every 1.5 times more; a plan must fit the budget and keep the least batch's verify
 * buffers (and, a trunk split across ranks, its slices resident); ties go to the larger batch.
 * The minimum is batch 1's: auto never refuses a budget a smaller batch fits.
 */
#define K3_BATCH_AUTO 0u              /* the batch argument of k3_plan_choose: the planner chooses */
#define K3_BATCH_MAX 4096u            /* -b N at most */
#define K3_BATCH_AUTO_MAX 2048u       /* -b auto at most (docs/k3run.md says why) */

/* -b's value: "auto" (*out = K3_BATCH_AUTO) or a count in 1..K3_BATCH_MAX; -1 for anything else. */
int k3_batch_parse(const char *s, uint32_t *out);

/* k3_plan_with_snapshots at `batch` tokens per pass, or (K3_BATCH_AUTO) at the batch chosen as
   above for a prompt of `prompt` tokens (0: not known, as in chat and serve) and `generate` tokens
   after it. */
k3_err k3_plan_choose(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context, uint32_t batch,
                      uint32_t prompt, uint32_t generate, int all_logits, uint32_t snapshots, uint32_t verify,
                      k3_plan *p, k3_diag *d);
/* The same for n_seq sequences sharing the passes: the least batch is n_seq (a row of each; a
   smaller batch asked for is raised to it), and each sequence's state is counted (k3_plan_seq). */
k3_err k3_plan_choose_seq(const k3_config *c, const k3_geometry *g, uint64_t budget, uint32_t context,
                          uint32_t batch, uint32_t prompt, uint32_t generate, int all_logits, uint32_t snapshots,
                          uint32_t verify, uint32_t n_seq, k3_plan *p, k3_diag *d);

/*
 * What a prompt of `tokens` costs under plan p (its batch), from an empty context, expected under
 * uniform routing: ceil(tokens / batch) passes; each reads the streamed units once, one embedding
 * row per token, and, per MoE layer, each of the E experts its t tokens use (1 - (1 - k/E)^t of
 * them) that the cache does not hold (1 - slots / experts, as for a decoded token). Its compute,
 * approximately: 2 flops per weight a token multiplies (the trunk's and k experts' per MoE layer;
 * lm_head for one row per pass), MLA's absorbed attention, Hm (4 R + 2 dr) per earlier position
 * and layer, and KDA's state, 7 H K^2 per token and layer.
 */
typedef struct k3_prompt_cost {
    uint32_t tokens, batch;
    uint32_t passes;             /* ceil(tokens / batch) */
    double trunk_bytes;          /* streamed units, read once per pass */
    double expert_reads;         /* expert records read */
    double expert_bytes, embed_bytes;
    double read_bytes;           /* trunk + experts + embedding rows */
    double flops;                /* weights, attention and KDA state */
    double attention_flops;      /* of flops, MLA's attention and KDA's state */
} k3_prompt_cost;
/* c NULL: the reads only (flops 0). */
void k3_prompt_cost_of(const k3_config *c, const k3_geometry *g, const k3_plan *p, uint32_t tokens,
                       k3_prompt_cost *out);

/* The memory this process may use: MemAvailable and the cgroup limit (v1 or v2), whichever is
   smaller; 0 if unknown. *source names where it came from. */
uint64_t k3_machine_memory(const char **source);

/* Preset budgets: laptop 8G, workstation 128G, server 224G; 0 if unknown. */
uint64_t k3_preset_budget(const char *name);

#endif

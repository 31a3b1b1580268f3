/*
 * weights_impl.h - the inside of k3_weights, shared by weights.c (manifest,
 * shards, trunk units, embedding rows), weights_stream.c (the streamed trunk:
 * pieces, row pieces, the stream buffers), weights_experts.c (the expert
 * records: all resident, or the fixed-slot cache) and weights_shard.c (shard
 * headers checked against the manifest). Calls go one way: weights.c ->
 * weights_stream.c, weights.c -> weights_experts.c -> weights_shard.c.
 */
#ifndef K3_WEIGHTS_IMPL_H
#define K3_WEIGHTS_IMPL_H

#include "io.h"
#include "k3_hash.h"
#include "k3_progress.h"
#include "k3_shard.h"
#include "plan.h"
#include "weights.h"

enum { K3_EVICT_LRU, K3_EVICT_LFU };
#define K3_EVICT_DEFAULT K3_EVICT_LFU
/* How a cached record came (k3_weights.slot_pf): asked for by an acquire, or read ahead
   (k3w_experts_prefetch) and not asked for yet. */
enum { K3_PF_NONE, K3_PF_AHEAD };


typedef struct expert_layer {
    uint8_t *data;            /* resident mode: [count][stride] records as in the shard, 64-byte aligned */
    int32_t *slot;            /* cache mode: [count] slot holding expert e, -1 if none */
    uint64_t *uses;           /* cache mode: [count] tokens that used expert e (LFU) */
    int fd, fd_direct;        /* cache mode: the shard (fd_direct: O_DIRECT, or -1) */
    char *path;
    uint64_t offset, record_size;
    const uint64_t *hashes;   /* [count] from the manifest */
    uint64_t count, stride;
    int enc;                  /* K3_ENC_MXFP4 or K3_ENC_BF16 */
    uint64_t off[3][2];       /* w1, w3, w2: [packed or weight, scale] offsets in a record */
    const uint32_t *rec_file; /* in place (FORMAT.md 10): [count] the checkpoint file of each record
                                 (index into k3_weights.src_*); NULL: the records are in the layer's shard */
    const uint64_t *rec_off;  /* in place: [count] each record's offset in that file */
    const int *src_fd, *src_fd_direct;   /* in place: k3_weights.src_fd, .src_fd_direct */
    char *const *src_path;    /* in place: k3_weights.src_path */
    uint32_t rows[3], cols[3];
} expert_layer;

/* A trunk unit (plan.h): the tensors of one layer, or of the head. */
typedef struct trunk_unit {
    uint32_t n;               /* tensors */
    uint32_t *ti;             /* [n] manifest tensor indices, in file order */
    uint64_t *pos;            /* [n] where each tensor starts in the unit's memory, or (split) in its small
                                 part; UINT64_MAX for a tensor read in row pieces (4 KiB-aligned) */
    uint64_t bytes;           /* the unit's memory: sum of k3_unit_span */
    uint64_t small;           /* split: bytes of the small part */
    int streamed;
    int split;                /* streamed in row pieces (larger than a chunk) */
    uint32_t piece0, n_pieces;/* streamed: its pieces, w->pieces[piece0 ..) (a whole unit: one) */
    double seconds;           /* wall time the model spent in this unit (k3w_layer_begin to the next) */
    uint8_t *mem;             /* resident: owned [bytes], 4 KiB-aligned; streamed: the buffer it is in, or NULL */
} trunk_unit;

/* A piece of the stream: a whole unit (ti = UINT32_MAX), or rows [r0, r1) of one tensor of a split unit. */
typedef struct stream_piece {
    uint32_t unit, ti, r0, r1;
    uint64_t bytes;           /* its memory (k3_unit_span) */
} stream_piece;

/* One of the two piece buffers. */
typedef struct stream_buf {
    uint8_t *mem;             /* [piece buffer bytes] 4 KiB-aligned */
    int piece;                /* the piece in it (being read or read), -1 none */
    int pending;              /* its reads were submitted and not yet waited for */
    k3io_job job;             /* the read of a row piece (a whole unit uses its tensors' tjob) */
} stream_buf;

/* One of the two small-part buffers (split units). */
typedef struct small_buf {
    uint8_t *mem;             /* [small buffer bytes] 4 KiB-aligned */
    int unit;                 /* the unit whose small part is in it, -1 none */
    int pending;
} small_buf;

struct k3_weights {
    char *dir;
    k3_manifest mf;
    k3_config cfg;
    k3_weights_opts o;
    uint32_t n_layers;
    k3io *io;                 /* reader threads */
    /* trunk */
    k3_tensor *tensors;       /* [mf.n_tensors], parallel to mf.tensors; data NULL while not in memory */
    k3io_job *tjob;           /* [mf.n_tensors] the read of each trunk tensor */
    uint32_t *tscale;         /* [mf.n_tensors] a Q8 tensor's scale tensor (NAME_scale), else UINT32_MAX */
    int *shard_fd, *shard_fd_direct;   /* [mf.n_shards] trunk shards, -1 if not open */
    char **shard_path;        /* [mf.n_shards] */
    trunk_unit *units;        /* [n_layers + 1] */
    uint64_t chunk;           /* k3_chunk_bytes() at load */
    stream_piece *pieces;     /* [n_pieces] every streamed unit's pieces, in unit order: the stream's cycle */
    uint32_t n_pieces;
    uint32_t *tpiece, *trows; /* [mf.n_tensors] a tensor read in row pieces: its first piece, rows per piece */
    k3_hasher64 **thash;      /* [mf.n_tensors] its XXH3-64 state across its pieces (NULL for others) */
    uint32_t *thashed;        /* [mf.n_tensors] rows hashed so far in this read of it (UINT32_MAX: broken) */
    stream_buf sb[2];
    small_buf ssb[2];
    int cur_buf;              /* the piece buffer the model is using, -1 none */
    k3_err err;               /* a failed row piece (k3w_rows), reported by the next k3w_check */
    k3_diag err_d;
    int cur_unit;             /* the unit the model is in (timing), -1 between passes */
    double unit_t0;           /* when it entered it */
    const k3_tensor *(*idx)[K3W__COUNT];   /* [n_layers + 1]: row 0 = model level */
    /* the embedding table, read one row at a time */
    int embed_fd;             /* a trunk shard's (owned by shard_fd) */
    uint64_t embed_off;
    const char *embed_path;
    uint16_t *embed_row;      /* [hidden] one row, BF16 */
    /* experts */
    expert_layer *experts;    /* [n_layers] (count 0 for layers without experts) */
    uint32_t n_src;           /* in place: the checkpoint files the records are read from (mf.sources) */
    int *src_fd, *src_fd_direct;   /* [n_src] buffered and O_DIRECT descriptors, -1 when closed */
    char **src_path;          /* [n_src] PACK/checkpoint/NAME */
    uint64_t bytes_read;
    /* the expert cache (o.expert_slots > 0) */
    uint64_t n_slots, slot_bytes;
    uint8_t *slots;           /* [n_slots][slot_bytes], 4096-aligned */
    int32_t *slot_layer, *slot_expert;   /* [n_slots] owner, -1 = free */
    uint64_t *slot_used;      /* [n_slots] tick of the last use (LRU) */
    int32_t *slot_pin;        /* [n_slots] pinned by the current acquire */
    uint64_t tick;
    int evict;                /* K3_EVICT_* */
    k3io_job *slot_job;       /* [n_slots] the read into each slot */
    /* the current acquire: its experts handed out in order, hits first */
    int acq_layer, acq_n, acq_next;
    int32_t *acq_order;       /* [max(n_slots, 1)] index into the acquire's ids, hits then misses */
    int32_t *acq_slot;        /* [max(n_slots, 1)] slot of order[i] (misses only), -1 for hits */
    int acq_hits;
    const int32_t *acq_ids;
    k3_weights_stats st;
    /* lookahead reads (k3w_experts_prefetch) */
    int lookahead;            /* experts per token read ahead (K3_LOOKAHEAD), 0: off, -1: the model's default */
    uint8_t *slot_pf;         /* [n_slots] K3_PF_* of the record in each slot */
    uint8_t *slot_fly;        /* [n_slots] 1: a read ahead into the slot is in flight, not waited for */
    int32_t *fly;             /* [n_slots] those slots, in the order their reads were queued */
    int n_fly;
    uint8_t *acq_pf;          /* [max(n_slots, 1)] order[i] is a hit whose read ahead is still in flight */
};

/* The streamed trunk (weights_stream.c): units laid out and their pieces listed; resident units
   read and the stream started; freed. */
k3_err k3w_build_units(k3_weights *w, k3_diag *d);
k3_err k3w_load_units(k3_weights *w, k3_progress *pg, k3_diag *d);
void k3w_units_free(k3_weights *w);

/* The experts (weights_experts.c): read them all (no cache), or set up the cache's slots. */
k3_err k3w_load_experts(k3_weights *w, k3_progress *pg, k3_diag *d);
k3_err k3w_cache_init(k3_weights *w, k3_diag *d);
void k3w_experts_free(k3_weights *w);
/* Shard s of the manifest opened (*fd, its path), its header read and checked against the manifest;
   a header entry checked against the manifest's offset, size, encoding and shape (weights_shard.c). */
k3_err k3w_open_shard(k3_weights *w, uint32_t s, int *fd, char *path, size_t cap, k3_shard_header *h, k3_diag *d);
k3_err k3w_check_entry(const k3_shard_entry *en, const char *shard, const char *name, int enc, int ndim,
                       const uint64_t *shape, uint64_t offset, uint64_t size, k3_diag *d);

#endif

/*
 * verify_pack.h - what verify_pack.c and verify_compare.c share: the state
 * of one pack check.
 */
#ifndef K3VERIFY_PACK_H
#define K3VERIFY_PACK_H

#include <stdint.h>

#include "k3_manifest.h"
#include "k3_shard.h"
#include "k3verify.h"

typedef struct pack_ctx {
    const char *dir;
    const k3v_pack_opts *o;
    k3v_report *r;
    k3_manifest m;
    uint32_t **st;          /* [n_shards] manifest tensor indices of each shard, sorted by offset */
    uint32_t *n_st;         /* [n_shards] */
    int32_t *sx;            /* [n_shards] expert_layers index; -1 none, -2 several (in-place
                               layers name no shard) */
    uint64_t done, total;   /* progress, bytes */
} pack_ctx;

/* After NAME (a path inside the pack: a shard, a file, checkpoint/FILE) was read through fd
   (fstat st0 when opened): if it changed under k3verify, one I/O problem replaces every other. */
struct stat;
void k3v_check_unchanged(pack_ctx *c, const char *name, int fd, const struct stat *st0, k3v_item *it);

/* Version 3 (FORMAT.md 10, verify_sources.c): is checkpoint file j in the --subset (its records
   are hashed)? The bytes the data pass reads of it (0 with --quick or outside the subset). */
int k3v_source_selected(const pack_ctx *c, uint32_t j);
uint64_t k3v_source_bytes(const pack_ctx *c, uint32_t j);

/* Version 3: the `checkpoint` link and every checkpoint file the manifest lists (size, header
   hash, and unless --quick every in-place record's hash); reports the items in order.
   Returns the number of checkpoint files whose records were selected. */
uint32_t k3v_check_sources(pack_ctx *c);

/* Does shard si's header agree with the manifest (kind, layer, header hash,
   every tensor or record part)? Adds a K3V_MISMATCH problem per difference. */
void k3v_compare_header(pack_ctx *c, uint32_t si, const k3_shard_header *h, k3v_item *it);

/* Is the pack complete for the model m's config describes (verify_complete.c)? Adds the
   problems to it, the manifest.json item. Reads only the manifest. */
void k3v_check_complete(const k3_manifest *m, k3v_item *it);

#endif

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
    int32_t *sx;            /* [n_shards] expert_layers index; -1 none, -2 several */
    uint64_t done, total;   /* progress, bytes */
} pack_ctx;

/* Does shard si's header agree with the manifest (kind, layer, header hash,
   every tensor or record part)? Adds a K3V_MISMATCH problem per difference. */
void k3v_compare_header(pack_ctx *c, uint32_t si, const k3_shard_header *h, k3v_item *it);

/* Is the pack complete for the model m's config describes (verify_complete.c)? Adds the
   problems to it, the manifest.json item. Reads only the manifest. */
void k3v_check_complete(const k3_manifest *m, k3v_item *it);

#endif

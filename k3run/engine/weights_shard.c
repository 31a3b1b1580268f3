/*
 * weights_shard.c - opening a pack shard for the weights: its header decoded
 * and checked against the manifest, and a header entry checked against the
 * manifest's tensor or record part (weights_impl.h). Shared by the trunk
 * (weights.c) and the experts (weights_experts.c), below both.
 */
#include "weights_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "k3_file.h"

k3_err k3w_check_entry(const k3_shard_entry *en, const char *shard, const char *name, int enc, int ndim,
                       const uint64_t *shape, uint64_t offset, uint64_t size, k3_diag *d)
{
    if (!en)
        return k3_fail(d, K3_ERR_MODEL, "'%s': tensor '%s' is in the manifest but not in the shard header",
                       shard, name);
    int same = en->encoding == enc && en->ndim == ndim && en->offset == offset && en->size == size;
    for (int i = 0; same && i < ndim; i++) same = en->shape[i] == shape[i];
    if (!same)
        return k3_fail(d, K3_ERR_MODEL, "'%s': tensor '%s': the shard header and the manifest disagree "
                       "(offset %" PRIu64 " vs %" PRIu64 ", size %" PRIu64 " vs %" PRIu64 ")",
                       shard, name, en->offset, offset, en->size, size);
    return K3_OK;
}

k3_err k3w_open_shard(k3_weights *w, uint32_t s, int *fd, char *path, size_t cap, k3_shard_header *h, k3_diag *d)
{
    const k3_mf_shard *ms = &w->mf.shards[s];
    k3_err e = k3_path_join(path, cap, w->dir, ms->name, d);
    if (e) return e;
    *fd = k3_open_read(path);
    if (*fd < 0) return k3_fail(d, K3_ERR_IO, "'%s': cannot open: %s", path, strerror(errno));
    if ((e = k3_shard_read_header(*fd, path, h, d))) { close(*fd); return e; }
    if (h->header_hash != ms->header_hash || h->file_size != ms->size || h->kind != ms->kind) {
        k3_shard_header_free(h);
        close(*fd);
        return k3_fail(d, K3_ERR_CORRUPT, "'%s': shard header does not match the manifest "
                       "(header hash, size or kind differ): run k3verify", path);
    }
    return K3_OK;
}

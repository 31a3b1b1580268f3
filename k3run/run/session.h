/*
 * session.h - a sequence's state in one file (docs/FORMAT.md "Session
 * files"): the model's state after a position (model.h "State"), the token
 * history, the sampler's PRNG, and named extra parts the front end keeps
 * (the chat's conversation). Each part is zstd-compressed and checked with
 * XXH3-64; the header names the pack (its manifest's checksum) and the model
 * config (XXH3-64 of its sorted compact JSON) it belongs to.
 *
 * Loading checks the header and the whole part table before it touches the
 * model, and every part's hash as it decompresses; on any failure the model
 * is reset to an empty sequence, so nothing half-loaded is ever used.
 */
#ifndef K3_SESSION_H
#define K3_SESSION_H

#include <stdint.h>

#include "engine.h"
#include "text.h"

#define K3_SESSION_MAGIC "K3SESSN\n"
#define K3_SESSION_VERSION 1u
#define K3_SESSION_MAX_EXTRA 4

typedef struct k3_session_part {
    char name[32];
    void *data;                    /* [bytes]; malloc'd when loaded */
    uint64_t bytes;
} k3_session_part;

typedef struct k3_session {
    int32_t *tokens;               /* [n_tokens] the history: the first `pos` were processed */
    uint32_t n_tokens;
    uint64_t rng_state, rng_inc;   /* the sampler's PCG32 */
    k3_session_part extra[K3_SESSION_MAX_EXTRA];
    int n_extra;
} k3_session;

/* The pack's identity: the manifest_xxh3_64 its manifest.json ends with. */
k3_err k3_pack_identity(const char *pack, uint64_t *id, k3_diag *d);
/* XXH3-64 of the config as sorted compact JSON. */
uint64_t k3_config_identity(const k3_weights *w);

/* Write the model's state at its position with s's history, PRNG and extras to path
   (via path.tmp and rename: an existing file is replaced only by a complete one). */
k3_err k3_session_save(const char *path, k3_model *m, const k3_weights *w, const char *pack, const k3_session *s,
                       uint64_t *file_bytes, k3_diag *d);
/* Load path into m (K3_ERR_CORRUPT for a damaged file, K3_ERR_MODEL for another pack or config,
   naming the file); s receives the history, PRNG and extras (free with k3_session_free). */
k3_err k3_session_load(const char *path, k3_model *m, const k3_weights *w, const char *pack, k3_session *s,
                       k3_diag *d);
void k3_session_free(k3_session *s);
/* An extra part by name, or NULL. */
const k3_session_part *k3_session_extra(const k3_session *s, const char *name);

#endif

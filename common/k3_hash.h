/*
 * k3_hash.h - XXH3 hashing with canonical (big-endian) hex output, as stored
 * in manifests: XXH3-64 = 16 lowercase hex digits, XXH3-128 = 32 (high64
 * then low64), equal to `xxhsum -H3` / `-H2` output.
 */
#ifndef K3_HASH_H
#define K3_HASH_H

#include <stddef.h>
#include <stdint.h>

typedef struct { uint64_t lo, hi; } k3_h128;

uint64_t k3_xxh3_64(const void *p, size_t n);
k3_h128 k3_xxh3_128(const void *p, size_t n);

/* Streaming XXH3-128 (for whole shards). */
typedef struct k3_hasher k3_hasher;
k3_hasher *k3_hasher_new(void);
void k3_hasher_reset(k3_hasher *h);
void k3_hasher_update(k3_hasher *h, const void *p, size_t n);
k3_h128 k3_hasher_digest(const k3_hasher *h);
void k3_hasher_free(k3_hasher *h);

/* Streaming XXH3-64 (per tensor / per record while writing). */
typedef struct k3_hasher64 k3_hasher64;
k3_hasher64 *k3_hasher64_new(void);
void k3_hasher64_reset(k3_hasher64 *h);
void k3_hasher64_update(k3_hasher64 *h, const void *p, size_t n);
uint64_t k3_hasher64_digest(const k3_hasher64 *h);
void k3_hasher64_free(k3_hasher64 *h);

/* Hex forms: out must hold 17 / 33 bytes. */
void k3_hex64(uint64_t h, char out[17]);
void k3_hex128(k3_h128 h, char out[33]);
/* Parse hex back; 0 on success. */
int k3_parse_hex64(const char *s, uint64_t *out);
int k3_parse_hex128(const char *s, k3_h128 *out);

#endif

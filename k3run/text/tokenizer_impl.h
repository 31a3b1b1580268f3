/*
 * tokenizer_impl.h - the private layout of a loaded k3_tok, shared by
 * tokenizer.c (loading: tiktoken.model, tokenizer_config.json, the rank hash
 * table), tokenizer_pattern.c (the split pattern, compiled at load) and
 * tokenizer_encode.c (splitting, BPE merges, encode). Calls go one way:
 * tokenizer_encode.c -> tokenizer.c -> tokenizer_pattern.c.
 *
 * A k3_tok is immutable once k3_tok_load returns: every encode call keeps its
 * own scratch (match data, JIT stack, merge buffers), so calls may run
 * concurrently on one k3_tok.
 */
#ifndef K3_TOKENIZER_IMPL_H
#define K3_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

#define K3_TOK_N_SPECIAL 256           /* reserved special ids after the last rank */
#define K3_TOK_MAX_RANKS (1u << 28)    /* far above K3's 163 584; ids stay int32 */
#define K3_TOK_MAX_CHARS 400000        /* Kimi's TIKTOKEN_MAX_ENCODE_CHARS */
#define K3_TOK_MAX_RUN 25000           /* Kimi's MAX_NO_WHITESPACES_CHARS */
#define K3_TOK_NONE UINT32_MAX         /* "no rank" in lookups and merge buffers */

/* One slot of the rank hash table (open addressing, linear probing). */
typedef struct k3_tok_slot {
    uint32_t id1;                       /* rank + 1; 0 = empty slot */
    uint32_t tag;                       /* high 32 bits of the key's XXH3-64 */
} k3_tok_slot;

struct k3_tok {
    uint32_t n_ranks;                   /* ids 0 .. n_ranks-1 are BPE ranks */
    uint32_t n_ids;                     /* n_ranks + K3_TOK_N_SPECIAL */
    uint8_t *bytes;                     /* [off[n_ids]] every id's bytes in id order
                                           (specials: their name's UTF-8) */
    uint32_t *off;                      /* [n_ids + 1] id i is bytes[off[i] .. off[i+1]) */
    k3_tok_slot *slots;                 /* [mask + 1] rank lookup by bytes, load <= 1/2 */
    uint32_t mask;                      /* table size - 1 (a power of two - 1) */
    uint32_t byte_rank[256];            /* [256] rank of each single byte */
    uint8_t named[K3_TOK_N_SPECIAL];    /* [256] 1 if the name came from added_tokens_decoder */
    uint16_t sp_order[K3_TOK_N_SPECIAL];/* [256] special indexes (id - n_ranks) sorted by
                                           first byte, then longest name first */
    uint16_t sp_first[257];             /* [257] sp_order[sp_first[b] .. sp_first[b+1])
                                           are the specials whose name starts with byte b */
    pcre2_code *re;                     /* Kimi's split pattern (tokenizer_pattern.c) */
    int jit;                            /* 1 if re was JIT-compiled */
};

/* Rank of the byte string s[0..n), or K3_TOK_NONE (tokenizer.c). */
uint32_t k3_tok_rank(const k3_tok *t, const uint8_t *s, size_t n);

/* Compile the split pattern into t->re (and JIT it when PCRE2 can; tokenizer_pattern.c). */
k3_err k3_tok_compile_pattern(k3_tok *t, k3_diag *d);

/* The split pattern as handed to pcre2_compile (for docs and tests). */
extern const char k3_tok_pattern[];

#endif

/*
 * k3_json.h - a strict, fast JSON parser for large machine-written documents
 * (safetensors headers, model.safetensors.index.json). It produces a flat
 * token array instead of a tree of allocations: a K3 checkpoint's headers and
 * index (~135 MB of JSON, ~2.5 M values) parse in a fraction of a second,
 * where jansson needs about 4 s.
 *
 * Accepts exactly RFC 8259 JSON with the same strictness as jansson with
 * JSON_REJECT_DUPLICATES | JSON_DECODE_ANY and without JSON_ALLOW_NUL (the
 * differential fuzz target fuzz_json.c checks this against jansson):
 *   - UTF-8 only (no overlong forms, surrogates, code points > U+10FFFF)
 *   - no raw control characters in strings; \u escapes must pair surrogates
 *   - \u0000 is rejected (a NUL would hide the rest of a C string)
 *   - duplicate object keys (compared after unescaping) are rejected
 *   - integers must fit int64_t; reals must not overflow a double
 *   - nesting depth <= K3J_MAX_DEPTH; one value, then only whitespace
 *
 * Token layout: a value at index i spans tokens [i, tok[i].next). An object's
 * members follow it as key (K3J_STR), value pairs; an array's elements follow it.
 */
#ifndef K3_JSON_H
#define K3_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "k3_error.h"
#include "k3_utf8.h"

#define K3J_MAX_DEPTH 2048
#define K3J_MAX_LEN 0x7fffffffu         /* documents up to 2 GiB - 1 */
/* Values (tokens) one document may hold: what a parse may cost is capped at this times
   sizeof(k3j_tok) (24 B: 96 MiB) plus the decoded strings (at most the document's length).
   K3's largest document, the index.json of 0.5 M tensors, holds about 1 M. */
#define K3J_MAX_VALUES (1u << 22)

typedef enum k3j_type {
    K3J_NULL, K3J_FALSE, K3J_TRUE, K3J_INT, K3J_REAL, K3J_STR, K3J_ARR, K3J_OBJ
} k3j_type;

typedef struct k3j_tok {
    uint8_t type;            /* k3j_type */
    uint32_t next;           /* index of the first token after this value */
    uint32_t size;           /* OBJ: members, ARR: elements, STR: decoded bytes */
    uint32_t off;            /* byte offset of the value in the document */
    union {
        int64_t i;           /* K3J_INT */
        double d;            /* K3J_REAL */
        const char *s;       /* K3J_STR: decoded UTF-8, not NUL-terminated, no NUL inside */
    } v;
} k3j_tok;

typedef struct k3j_doc {
    k3j_tok *t;
    size_t n;
    char *arena;             /* decoded strings that had escapes */
} k3j_doc;

typedef struct k3j_error {
    char text[160];          /* "duplicate key 'a'", "unterminated string", ... */
    uint64_t off;            /* byte offset of the problem in the document */
    int kind;                /* K3J_E_* */
} k3j_error;

enum { K3J_E_SYNTAX = 1, K3J_E_UTF8, K3J_E_NUL, K3J_E_DUPLICATE, K3J_E_RANGE, K3J_E_DEPTH, K3J_E_NOMEM };


/* Parse len bytes. 0 on success (free with k3j_free), -1 with *err filled. */
int k3j_parse(const char *buf, size_t len, k3j_doc *doc, k3j_error *err);
void k3j_free(k3j_doc *doc);

/*
 * A parse failure as a k3_diag message (K3_ERR_FORMAT, or K3_ERR_NOMEM):
 * "'<dn>': duplicate key in <what>: duplicate key 'a' (byte offset N)", where
 * N = base + the offset in the document (e.g. 8 for a safetensors header).
 */
k3_err k3j_fail(const k3j_error *je, const char *dn, const char *what, uint64_t base, k3_diag *d);

/* Member of object token `obj` whose key equals (key, klen): value index, or 0 if absent. */
uint32_t k3j_get(const k3j_doc *doc, uint32_t obj, const char *key, size_t klen);
/* String token equals a C string. */
int k3j_streq(const k3j_tok *t, const char *s);

/*
 * Iterate a container c: for (m = k3j_first(d, c); m; m = k3j_next(d, c, m)).
 * In an object m is a key and m + 1 its value; in an array m is an element.
 */
static inline uint32_t k3j_first(const k3j_doc *d, uint32_t c)
{
    return d->t[c].size ? c + 1 : 0;
}
static inline uint32_t k3j_next(const k3j_doc *d, uint32_t c, uint32_t m)
{
    uint32_t n = d->t[d->t[c].type == K3J_OBJ ? m + 1 : m].next;
    return n < d->t[c].next ? n : 0;
}

#endif

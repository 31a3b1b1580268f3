/*
 * chat_json.h - JSON with Python's json semantics, for the chat renderer
 * (shared/spec/CHAT-FORMAT.md §7.2-§7.3). formats/k3_json.h is the strict
 * parser for machine-written files; this one reads what a chat client sends
 * the way Python's json.loads does, and writes what json.dumps writes:
 *
 *   - a value tree in insertion order, each value with its exact source slice;
 *   - duplicate object keys are all kept; k3cj_get returns the LAST one, and
 *     k3cj_dict walks an object as a Python dict built from it would (each key
 *     at its first position, with its last value);
 *   - integers of any size are kept as their text (Python refuses more than
 *     4300 digits, and so does this parser); reals are doubles (1e400 is inf);
 *   - NaN, Infinity and -Infinity are accepted (json.loads accepts them too);
 *   - strict mode (json.loads) refuses raw control characters in strings and
 *     invalid UTF-8; lax mode (JSONDecoder(strict=False)) allows the former;
 *   - \u escapes: surrogate pairs are joined; a lone surrogate is kept as its
 *     generalized UTF-8 form (ED A0..BF xx, "WTF-8"), so that keys compare and
 *     sort by code point exactly as Python's do. k3cj_wtf8_fix turns such text
 *     into UTF-8 as tiktoken does (pairs joined, lone ones to U+FFFD, §3.3).
 *
 * Layout (as formats/k3_json.h): the value at index i spans v[i, v[i].next);
 * an object's members follow it as (key K3CJ_STR, value) pairs, an array's
 * elements follow it. The root is v[0].
 */
#ifndef K3_CHAT_JSON_H
#define K3_CHAT_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "k3_error.h"

#define K3CJ_MAX_DEPTH 512            /* Python's own limit is its recursion limit (~1000) */
#define K3CJ_MAX_LEN 0x7fffffffu      /* documents up to 2 GiB - 1 */
#define K3CJ_MAX_INT_DIGITS 4300      /* sys.get_int_max_str_digits() of Python >= 3.11 */

typedef enum k3cj_type {
    K3CJ_NULL, K3CJ_FALSE, K3CJ_TRUE, K3CJ_INT, K3CJ_REAL, K3CJ_STR, K3CJ_ARR, K3CJ_OBJ
} k3cj_type;

typedef struct k3cj_val {
    uint8_t type;            /* k3cj_type */
    uint32_t next;           /* index of the first value after this one (and its children) */
    uint32_t n;              /* ARR: elements; OBJ: members, duplicates included; STR: decoded bytes */
    uint32_t off, len;       /* the value's source slice: src[off, off + len) */
    uint32_t s;              /* STR: offset of its decoded WTF-8 bytes in the arena (may hold NUL) */
    double d;                /* REAL: the value (+-inf on overflow, NaN for NaN) */
} k3cj_val;

typedef struct k3cj_doc {
    const char *src;         /* the parsed text (not owned: it must outlive the doc) */
    size_t src_len;
    k3cj_val *v;             /* [n] values, cap allocated */
    size_t n, cap;
    char *arena;             /* decoded strings; never longer than the source */
    size_t arena_cap;
} k3cj_doc;

typedef struct k3cj_error {
    char text[160];          /* "expecting ',' delimiter", "invalid \\uXXXX escape", ... */
    size_t off;              /* byte offset of the problem in the text */
    int kind;                /* K3CJ_E_* */
} k3cj_error;

enum { K3CJ_E_SYNTAX = 1, K3CJ_E_UTF8, K3CJ_E_RANGE, K3CJ_E_DEPTH, K3CJ_E_NOMEM };
enum { K3CJ_STRICT = 0, K3CJ_LAX = 1 };   /* parse flags: LAX = raw control characters allowed */

/* Parse a whole document (whitespace, one value, whitespace). 0, or -1 with *err. */
int k3cj_parse(const char *src, size_t len, int flags, k3cj_doc *doc, k3cj_error *err);
/*
 * Python's JSONDecoder.raw_decode(src, at): one value starting exactly at byte
 * `at` (no whitespace skipped), the rest not looked at; *end is the byte after
 * it. In LAX mode the text is trusted to be WTF-8 (it came from this parser).
 * doc is zeroed or holds an earlier result, whose buffers are reused; free it
 * with k3cj_free after the last call, whether or not that call succeeded.
 * (k3cj_parse starts from a zeroed doc and frees it itself on failure.)
 */
int k3cj_parse_prefix(const char *src, size_t len, size_t at, int flags, k3cj_doc *doc, size_t *end,
                      k3cj_error *err);
void k3cj_free(k3cj_doc *doc);

static inline const char *k3cj_str(const k3cj_doc *doc, uint32_t i) { return doc->arena + doc->v[i].s; }
/* String value i equals the C string s. */
int k3cj_streq(const k3cj_doc *doc, uint32_t i, const char *s);
/* Member value of object obj whose key is key: the LAST such member (a Python dict), or 0. */
uint32_t k3cj_get(const k3cj_doc *doc, uint32_t obj, const char *key);
/* Python truthiness: null, false, 0, 0.0, "", [] and {} are false. */
int k3cj_truthy(const k3cj_doc *doc, uint32_t i);

/* Container iteration: for (m = k3cj_first(d, c); m; m = k3cj_next(d, c, m)); in an object m is a key. */
static inline uint32_t k3cj_first(const k3cj_doc *d, uint32_t c) { return d->v[c].n ? c + 1 : 0; }
static inline uint32_t k3cj_next(const k3cj_doc *d, uint32_t c, uint32_t m)
{
    uint32_t n = d->v[d->v[c].type == K3CJ_OBJ ? m + 1 : m].next;
    return n < d->v[c].next ? n : 0;
}

/*
 * The members of object obj as the Python dict built from it: (key, value)
 * index pairs, *out[2k] the key and *out[2k+1] the value; duplicates merged
 * (first key's position, last value). sorted != 0: by key code point instead
 * (json.dumps(sort_keys=True)). *out is malloc'd (NULL when *n == 0).
 */
k3_err k3cj_dict(const k3cj_doc *doc, uint32_t obj, int sorted, uint32_t **out, size_t *n, k3_diag *d);

/* A growable byte buffer; oom is set (and appends stop) when an allocation fails. */
typedef struct k3cj_buf {
    char *p;                 /* [n] bytes, cap allocated, not NUL-terminated */
    size_t n, cap;
    int oom;
} k3cj_buf;
void k3cj_buf_put(k3cj_buf *b, const void *s, size_t n);
static inline void k3cj_buf_puts(k3cj_buf *b, const char *s) { k3cj_buf_put(b, s, __builtin_strlen(s)); }

/*
 * json.dumps of value i, ensure_ascii=False. K3CJ_COMPACT_SORTED: separators
 * (",", ":") and keys sorted by code point (the tool declaration, the
 * response schema); K3CJ_PY_DEFAULT: (", ", ": "), dict order (dict-argument
 * values). Integers as their text (-0 as 0), reals as Python's repr,
 * Infinity / -Infinity / NaN. Appends to out; K3_ERR_NOMEM on failure.
 */
enum { K3CJ_COMPACT_SORTED = 0, K3CJ_PY_DEFAULT = 1 };
k3_err k3cj_dump(const k3cj_doc *doc, uint32_t i, int style, k3cj_buf *out, k3_diag *d);
/* A string's JSON form (quotes and §7.3 escapes). */
void k3cj_dump_str(k3cj_buf *out, const char *s, size_t n);

/* Python's repr(float): shortest round-trip digits; "inf", "-inf", "nan". buf >= 32 bytes. */
void k3cj_repr_double(double x, char *buf);
/* An integer's text as Python prints int(text): "-0" -> "0". */
void k3cj_int_text(const k3cj_doc *doc, uint32_t i, const char **s, size_t *n);

/*
 * WTF-8 -> UTF-8 as tiktoken does it for a str with lone surrogates
 * (text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")): an
 * encoded high surrogate directly followed by an encoded low one becomes their
 * code point, any other surrogate U+FFFD. Appends to out.
 */
void k3cj_wtf8_fix(k3cj_buf *out, const char *s, size_t n);
/* Decode one code point of WTF-8 at s (n >= 1 bytes); *cp; returns its length (an invalid byte: 1). */
size_t k3cj_wtf8_next(const char *s, size_t n, uint32_t *cp);
/* Python's str.isspace() for one code point (§3.3: 29 code points). */
int k3cj_py_isspace(uint32_t cp);

#endif

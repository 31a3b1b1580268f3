/*
 * k3_json.c - strict JSON into a flat token array (see k3_json.h).
 *
 * One iterative pass with an explicit stack of open containers; strings
 * without escapes point into the document, the others are decoded into one
 * arena no larger than the document; duplicate keys are checked when an
 * object closes (pairwise for small objects, a hash set for large ones).
 */
#include "k3_json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <inttypes.h>

#include "k3_hash.h"
#include "k3_log.h"

typedef struct parser {
    const unsigned char *b;
    size_t len, pos;
    k3j_doc *doc;
    size_t cap;                  /* tokens allocated */
    size_t arena_used;
    uint32_t *set;               /* duplicate-key scratch: key index + 1 */
    size_t set_cap;
    k3j_error *err;
} parser;

static int fail(parser *p, int kind, size_t off, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(parser *p, int kind, size_t off, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err->text, sizeof p->err->text, fmt, ap);
    va_end(ap);
    p->err->off = off;
    p->err->kind = kind;
    return -1;
}

/* A printable description of the byte at off (for "unexpected ..." messages). */
static const char *what_at(const parser *p, size_t off, char *buf, size_t cap)
{
    if (off >= p->len) return "end of input";
    char c = (char)p->b[off];
    char e[16];
    snprintf(buf, cap, "'%s'", k3_escape(&c, 1, e, sizeof e));
    return buf;
}

static int new_tok(parser *p, k3j_type type, size_t off, uint32_t *idx)
{
    k3j_doc *d = p->doc;
    if (d->n == K3J_MAX_VALUES)
        return fail(p, K3J_E_RANGE, off, "more than %u JSON values (the cap on what one document may cost)",
                    K3J_MAX_VALUES);
    if (d->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64 + p->len / 16;
        if (cap > K3J_MAX_VALUES) cap = K3J_MAX_VALUES;
        k3j_tok *t = realloc(d->t, cap * sizeof *t);
        if (!t) return fail(p, K3J_E_NOMEM, off, "out of memory for %zu JSON values", cap);
        d->t = t;
        p->cap = cap;
    }
    k3j_tok *t = &d->t[d->n];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    t->off = (uint32_t)off;
    t->next = (uint32_t)d->n + 1;
    *idx = (uint32_t)d->n++;
    return 0;
}

static void skip_ws(parser *p)
{
    while (p->pos < p->len) {
        unsigned char c = p->b[p->pos];
        if (c != ' ' && c != '\n' && c != '\r' && c != '\t') break;
        p->pos++;
    }
}

static int hex4(const unsigned char *s, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = s[i], x;
        if (c >= '0' && c <= '9') x = c - '0';
        else if (c >= 'a' && c <= 'f') x = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') x = c - 'A' + 10;
        else return -1;
        v = v << 4 | x;
    }
    *out = v;
    return 0;
}

/* Decode the escaped string body [s, e) into the arena; sets t->v.s and t->size. */
static int decode(parser *p, size_t s, size_t e, k3j_tok *t)
{
    if (!p->doc->arena && !(p->doc->arena = malloc(p->len ? p->len : 1)))
        return fail(p, K3J_E_NOMEM, s, "out of memory decoding strings");
    char *o = p->doc->arena + p->arena_used, *start = o;
    for (size_t i = s; i < e;) {
        unsigned char c = p->b[i];
        if (c != '\\') { *o++ = (char)c; i++; continue; }
        unsigned char x = p->b[i + 1];
        i += 2;
        switch (x) {
        case '"': *o++ = '"'; continue;
        case '\\': *o++ = '\\'; continue;
        case '/': *o++ = '/'; continue;
        case 'b': *o++ = '\b'; continue;
        case 'f': *o++ = '\f'; continue;
        case 'n': *o++ = '\n'; continue;
        case 'r': *o++ = '\r'; continue;
        case 't': *o++ = '\t'; continue;
        default: break;                          /* 'u', checked by the scanner */
        }
        unsigned cp, lo;
        hex4(p->b + i, &cp);
        i += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF) {       /* the scanner checked the pair */
            hex4(p->b + i + 2, &lo);
            i += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (cp < 0x80) *o++ = (char)cp;
        else if (cp < 0x800) { *o++ = (char)(0xC0 | cp >> 6); *o++ = (char)(0x80 | (cp & 0x3F)); }
        else if (cp < 0x10000) {
            *o++ = (char)(0xE0 | cp >> 12); *o++ = (char)(0x80 | (cp >> 6 & 0x3F)); *o++ = (char)(0x80 | (cp & 0x3F));
        } else {
            *o++ = (char)(0xF0 | cp >> 18); *o++ = (char)(0x80 | (cp >> 12 & 0x3F));
            *o++ = (char)(0x80 | (cp >> 6 & 0x3F)); *o++ = (char)(0x80 | (cp & 0x3F));
        }
    }
    t->v.s = start;
    t->size = (uint32_t)(o - start);
    p->arena_used += (size_t)(o - start);
    return 0;
}

/* A string at p->pos (on the opening quote). */
static int parse_string(parser *p, uint32_t *idx)
{
    size_t q = p->pos, i = q + 1;
    int escaped = 0;
    for (;;) {
        /* fast path over plain ASCII */
        while (i < p->len && p->b[i] >= 0x20 && p->b[i] < 0x80 && p->b[i] != '"' && p->b[i] != '\\') i++;
        if (i >= p->len) return fail(p, K3J_E_SYNTAX, q, "unterminated string");
        unsigned char c = p->b[i];
        if (c == '"') break;
        if (c < 0x20)
            return fail(p, c ? K3J_E_SYNTAX : K3J_E_NUL, i, "control character 0x%02x in a string", c);
        if (c >= 0x80) {
            const char *why;
            size_t n = k3_utf8_seq(p->b + i, p->len - i, &why);
            if (!n) return fail(p, K3J_E_UTF8, i, "invalid UTF-8 byte 0x%02x in a string (%s)", c, why);
            i += n;
            continue;
        }
        /* backslash */
        escaped = 1;
        if (i + 1 >= p->len) return fail(p, K3J_E_SYNTAX, q, "unterminated string");
        unsigned char x = p->b[i + 1];
        if (strchr("\"\\/bfnrt", x) && x) { i += 2; continue; }
        if (x != 'u') return fail(p, K3J_E_SYNTAX, i, "invalid escape '\\%c' in a string", x >= 0x20 && x < 0x7f ? x : '?');
        unsigned cp, lo;
        if (i + 6 > p->len || hex4(p->b + i + 2, &cp))
            return fail(p, K3J_E_SYNTAX, i, "invalid \\u escape in a string");
        if (cp == 0) return fail(p, K3J_E_NUL, i, "NUL character (\\u0000) in a string");
        if (cp >= 0xDC00 && cp <= 0xDFFF)
            return fail(p, K3J_E_SYNTAX, i, "invalid \\u escape: lone low surrogate \\u%04X", cp);
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (i + 12 > p->len || p->b[i + 6] != '\\' || p->b[i + 7] != 'u' || hex4(p->b + i + 8, &lo) ||
                lo < 0xDC00 || lo > 0xDFFF)
                return fail(p, K3J_E_SYNTAX, i, "invalid \\u escape: high surrogate \\u%04X without a low one", cp);
            i += 12;
        } else {
            i += 6;
        }
    }
    if (i - q - 1 > K3J_MAX_LEN) return fail(p, K3J_E_RANGE, q, "string too long");
    if (new_tok(p, K3J_STR, q, idx)) return -1;
    k3j_tok *t = &p->doc->t[*idx];
    if (escaped) {
        if (decode(p, q + 1, i, t)) return -1;
    } else {
        t->v.s = (const char *)p->b + q + 1;
        t->size = (uint32_t)(i - q - 1);
    }
    p->pos = i + 1;
    return 0;
}

static int parse_number(parser *p, uint32_t *idx)
{
    size_t s = p->pos, i = s;
    int neg = 0, real = 0;
    if (i < p->len && p->b[i] == '-') { neg = 1; i++; }
    if (i < p->len && p->b[i] == '0') i++;
    else if (i < p->len && p->b[i] >= '1' && p->b[i] <= '9') { while (i < p->len && p->b[i] >= '0' && p->b[i] <= '9') i++; }
    else return fail(p, K3J_E_SYNTAX, s, "invalid number");
    size_t int_end = i;
    if (i < p->len && p->b[i] == '.') {
        i++;
        if (i >= p->len || p->b[i] < '0' || p->b[i] > '9') return fail(p, K3J_E_SYNTAX, s, "invalid number");
        while (i < p->len && p->b[i] >= '0' && p->b[i] <= '9') i++;
        real = 1;
    }
    if (i < p->len && (p->b[i] == 'e' || p->b[i] == 'E')) {
        i++;
        if (i < p->len && (p->b[i] == '+' || p->b[i] == '-')) i++;
        if (i >= p->len || p->b[i] < '0' || p->b[i] > '9') return fail(p, K3J_E_SYNTAX, s, "invalid number");
        while (i < p->len && p->b[i] >= '0' && p->b[i] <= '9') i++;
        real = 1;
    }
    if (new_tok(p, real ? K3J_REAL : K3J_INT, s, idx)) return -1;
    k3j_tok *t = &p->doc->t[*idx];
    if (!real) {
        uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        for (size_t k = s + (size_t)neg; k < int_end; k++) {
            unsigned dgt = p->b[k] - '0';
            if (v > (lim - dgt) / 10) return fail(p, K3J_E_RANGE, s, "integer out of the int64 range");
            v = v * 10 + dgt;
        }
        t->v.i = neg ? (int64_t)(0 - v) : (int64_t)v;
    } else {
        char small[64], *tmp = small;
        size_t n = i - s;
        if (n >= sizeof small && !(tmp = malloc(n + 1))) return fail(p, K3J_E_NOMEM, s, "out of memory");
        memcpy(tmp, p->b + s, n);
        tmp[n] = '\0';
        errno = 0;
        t->v.d = strtod(tmp, NULL);
        int over = errno == ERANGE && isinf(t->v.d);
        if (tmp != small) free(tmp);
        if (over) return fail(p, K3J_E_RANGE, s, "real number overflow");
    }
    p->pos = i;
    return 0;
}

static int parse_literal(parser *p, uint32_t *idx)
{
    static const struct { const char *s; k3j_type t; } lit[3] = {
        {"true", K3J_TRUE}, {"false", K3J_FALSE}, {"null", K3J_NULL}};
    for (int k = 0; k < 3; k++) {
        size_t n = strlen(lit[k].s);
        if (p->len - p->pos >= n && memcmp(p->b + p->pos, lit[k].s, n) == 0) {
            if (new_tok(p, lit[k].t, p->pos, idx)) return -1;
            p->pos += n;
            return 0;
        }
    }
    char w[16];
    return fail(p, K3J_E_SYNTAX, p->pos, "unexpected %s", what_at(p, p->pos, w, sizeof w));
}

static int key_eq(const k3j_tok *a, const k3j_tok *b)
{
    return a->size == b->size && memcmp(a->v.s, b->v.s, a->size) == 0;
}

/* After object o closed: reject duplicate keys. */
static int check_duplicates(parser *p, uint32_t o)
{
    const k3j_doc *d = p->doc;
    const k3j_tok *t = d->t;
    uint32_t n = t[o].size;
    if (n < 2) return 0;
    const k3j_tok *dup = NULL;
    if (n <= 12) {
        for (uint32_t a = o + 1; a && !dup; a = k3j_next(d, o, a))
            for (uint32_t b = k3j_next(d, o, a); b; b = k3j_next(d, o, b))
                if (key_eq(&t[a], &t[b])) { dup = &t[b]; break; }
    } else {
        size_t cap = 32;
        while (cap < (size_t)n * 2) cap *= 2;
        if (cap > p->set_cap) {
            free(p->set);
            if (!(p->set = malloc(cap * sizeof *p->set))) {
                p->set_cap = 0;
                return fail(p, K3J_E_NOMEM, t[o].off, "out of memory checking keys");
            }
            p->set_cap = cap;
        }
        memset(p->set, 0, cap * sizeof *p->set);
        for (uint32_t a = o + 1; a && !dup; a = k3j_next(d, o, a)) {
            size_t h = (size_t)k3_xxh3_64(t[a].v.s, t[a].size) & (cap - 1);
            for (;; h = (h + 1) & (cap - 1)) {
                uint32_t v = p->set[h];
                if (!v) { p->set[h] = a + 1; break; }
                if (key_eq(&t[v - 1], &t[a])) { dup = &t[a]; break; }
            }
        }
    }
    if (!dup) return 0;
    char e[100];
    return fail(p, K3J_E_DUPLICATE, dup->off, "duplicate key '%s'", k3_escape(dup->v.s, dup->size, e, sizeof e));
}

int k3j_parse(const char *buf, size_t len, k3j_doc *doc, k3j_error *err)
{
    memset(doc, 0, sizeof *doc);
    memset(err, 0, sizeof *err);
    parser p = {(const unsigned char *)buf, len, 0, doc, 0, 0, NULL, 0, err};
    if (len > K3J_MAX_LEN) return fail(&p, K3J_E_RANGE, 0, "document of %zu bytes is too large", len);
    uint32_t stack[K3J_MAX_DEPTH];
    int depth = 0;
    uint32_t idx;
    char w[16];

value:
    skip_ws(&p);
    if (p.pos >= len) { fail(&p, K3J_E_SYNTAX, p.pos, "unexpected end of input"); goto error; }
    switch (p.b[p.pos]) {
    case '{': case '[': {
        int obj = p.b[p.pos] == '{';
        if (depth == K3J_MAX_DEPTH) { fail(&p, K3J_E_DEPTH, p.pos, "nesting deeper than %d", K3J_MAX_DEPTH); goto error; }
        if (new_tok(&p, obj ? K3J_OBJ : K3J_ARR, p.pos, &idx)) goto error;
        stack[depth++] = idx;
        p.pos++;
        skip_ws(&p);
        if (p.pos < len && p.b[p.pos] == (obj ? '}' : ']')) { p.pos++; goto close; }
        if (obj) goto key;
        goto value;
    }
    case '"':
        if (parse_string(&p, &idx)) goto error;
        break;
    case '-': case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': case '8': case '9':
        if (parse_number(&p, &idx)) goto error;
        break;
    default:
        if (parse_literal(&p, &idx)) goto error;
        break;
    }
    goto after;

key:
    skip_ws(&p);
    if (p.pos >= len || p.b[p.pos] != '"') {
        fail(&p, K3J_E_SYNTAX, p.pos, "expected a string key, found %s", what_at(&p, p.pos, w, sizeof w));
        goto error;
    }
    if (parse_string(&p, &idx)) goto error;
    skip_ws(&p);
    if (p.pos >= len || p.b[p.pos] != ':') {
        fail(&p, K3J_E_SYNTAX, p.pos, "expected ':', found %s", what_at(&p, p.pos, w, sizeof w));
        goto error;
    }
    p.pos++;
    goto value;

close: {
    uint32_t c = stack[--depth];
    doc->t[c].next = (uint32_t)doc->n;
    if (doc->t[c].type == K3J_OBJ && check_duplicates(&p, c)) goto error;
}
after:
    if (depth == 0) {
        skip_ws(&p);
        if (p.pos != len) {
            fail(&p, K3J_E_SYNTAX, p.pos, "unexpected %s after the JSON value", what_at(&p, p.pos, w, sizeof w));
            goto error;
        }
        free(p.set);
        return 0;
    }
    {
        uint32_t c = stack[depth - 1];
        int obj = doc->t[c].type == K3J_OBJ;
        doc->t[c].size++;
        skip_ws(&p);
        if (p.pos < len && p.b[p.pos] == ',') {
            p.pos++;
            if (obj) goto key;
            goto value;
        }
        if (p.pos < len && p.b[p.pos] == (obj ? '}' : ']')) { p.pos++; goto close; }
        fail(&p, K3J_E_SYNTAX, p.pos, "expected ',' or '%c', found %s", obj ? '}' : ']', what_at(&p, p.pos, w, sizeof w));
        goto error;
    }

error:
    free(p.set);
    k3j_free(doc);
    return -1;
}

void k3j_free(k3j_doc *doc)
{
    if (!doc) return;
    free(doc->t);
    free(doc->arena);
    memset(doc, 0, sizeof *doc);
}

int k3j_streq(const k3j_tok *t, const char *s)
{
    size_t n = strlen(s);
    return t->type == K3J_STR && t->size == n && memcmp(t->v.s, s, n) == 0;
}

uint32_t k3j_get(const k3j_doc *d, uint32_t obj, const char *key, size_t klen)
{
    if (d->t[obj].type != K3J_OBJ) return 0;
    for (uint32_t k = k3j_first(d, obj); k; k = k3j_next(d, obj, k))
        if (d->t[k].size == klen && memcmp(d->t[k].v.s, key, klen) == 0) return k + 1;
    return 0;
}

k3_err k3j_fail(const k3j_error *je, const char *dn, const char *what, uint64_t base, k3_diag *d)
{
    uint64_t at = base + je->off;
    switch (je->kind) {
    case K3J_E_DUPLICATE:
        return k3_fail(d, K3_ERR_FORMAT, "'%s': duplicate key in %s: %s (byte offset %" PRIu64 ")",
                       dn, what, je->text, at);
    case K3J_E_NUL:
        return k3_fail(d, K3_ERR_FORMAT, "'%s': NUL character (\\u0000) in a string of %s (byte offset %" PRIu64 ")",
                       dn, what, at);
    case K3J_E_RANGE:
        return k3_fail(d, K3_ERR_FORMAT, "'%s': number out of range in %s: %s (byte offset %" PRIu64 ")",
                       dn, what, je->text, at);
    case K3J_E_UTF8:
        return k3_fail(d, K3_ERR_FORMAT, "'%s': %s is not valid UTF-8: %s (byte offset %" PRIu64 ")",
                       dn, what, je->text, at);
    case K3J_E_NOMEM:
        return k3_fail(d, K3_ERR_NOMEM, "'%s': %s", dn, je->text);
    default:
        return k3_fail(d, K3_ERR_FORMAT, "'%s': %s is not valid JSON: %s (byte offset %" PRIu64 ")",
                       dn, what, je->text, at);
    }
}


/*
 * chat_json.c - JSON with Python's json semantics (chat_json.h): the parser
 * (json.loads / JSONDecoder(strict=False).raw_decode), the dict view of an
 * object, the writer (json.dumps, ensure_ascii=False), Python's float repr,
 * and the WTF-8 helpers the tokenizer path needs.
 */
#include "chat_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_utf8.h"

/* ------------------------------------------------------------------------ */
/* Buffers                                                                  */

void k3cj_buf_put(k3cj_buf *b, const void *s, size_t n)
{
    if (b->oom || !n) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) {
            if (cap > SIZE_MAX / 2) { b->oom = 1; return; }
            cap *= 2;
        }
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

/* ------------------------------------------------------------------------ */
/* Parser                                                                   */

typedef struct cj_parser {
    const char *s;           /* [len] the text */
    size_t len, i;
    int flags, depth;
    k3cj_doc *doc;
    size_t an;               /* bytes used in doc->arena */
    k3cj_error *err;
} cj_parser;

static int cj_fail(cj_parser *p, int kind, size_t off, const char *fmt, const char *arg)
{
    snprintf(p->err->text, sizeof p->err->text, fmt, arg ? arg : "");
    p->err->off = off;
    p->err->kind = kind;
    return -1;
}

static int cj_is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void cj_skip_ws(cj_parser *p)
{
    while (p->i < p->len && cj_is_ws(p->s[p->i])) p->i++;
}

/* Append a value; its index in *at. */
static int cj_push(cj_parser *p, int type, size_t off, uint32_t *at)
{
    k3cj_doc *d = p->doc;
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 64;
        if (cap > UINT32_MAX) return cj_fail(p, K3CJ_E_NOMEM, off, "too many values%s", NULL);
        k3cj_val *v = realloc(d->v, cap * sizeof *v);
        if (!v) return cj_fail(p, K3CJ_E_NOMEM, off, "out of memory%s", NULL);
        d->v = v;
        d->cap = cap;
    }
    k3cj_val *v = &d->v[d->n];
    memset(v, 0, sizeof *v);
    v->type = (uint8_t)type;
    v->off = (uint32_t)off;
    *at = (uint32_t)d->n++;
    return 0;
}

static void cj_end(cj_parser *p, uint32_t at)
{
    k3cj_val *v = &p->doc->v[at];
    v->len = (uint32_t)(p->i - v->off);
    v->next = (uint32_t)p->doc->n;
}

static int cj_hex4(const char *s, uint32_t *out)
{
    uint32_t x = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        x <<= 4;
        if (c >= '0' && c <= '9') x |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') x |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') x |= (uint32_t)(c - 'A' + 10);
        else return -1;
    }
    *out = x;
    return 0;
}

/* cp as UTF-8 (surrogates as their 3-byte generalized form); returns the length. */
static size_t cj_put_cp(char *o, uint32_t cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string at p->i (on its '"'): decoded into the arena. */
static int cj_string(cj_parser *p, uint32_t *at)
{
    size_t start = p->i;
    if (cj_push(p, K3CJ_STR, start, at)) return -1;
    char *o = p->doc->arena + p->an;
    size_t on = 0;
    p->i++;
    for (;;) {
        if (p->i >= p->len) return cj_fail(p, K3CJ_E_SYNTAX, start, "unterminated string%s", NULL);
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') break;
        if (c != '\\') {
            if (c < 0x20 && !(p->flags & K3CJ_LAX))
                return cj_fail(p, K3CJ_E_SYNTAX, p->i, "invalid control character in a string%s", NULL);
            o[on++] = (char)c;
            p->i++;
            continue;
        }
        if (p->i + 1 >= p->len) return cj_fail(p, K3CJ_E_SYNTAX, start, "unterminated string%s", NULL);
        char e = p->s[p->i + 1];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char to[] = "\"\\/\b\f\n\r\t";
            o[on++] = to[simple - "\"\\/bfnrt"];
            p->i += 2;
            continue;
        }
        if (e != 'u') return cj_fail(p, K3CJ_E_SYNTAX, p->i, "invalid \\escape%s", NULL);
        uint32_t cp, lo;
        if (p->i + 6 > p->len || cj_hex4(p->s + p->i + 2, &cp))     /* at the 'u', as Python says */
            return cj_fail(p, K3CJ_E_SYNTAX, p->i + 1, "invalid \\uXXXX escape%s", NULL);
        p->i += 6;
        if (cp >= 0xD800 && cp <= 0xDBFF && p->i + 6 < p->len && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
            if (cj_hex4(p->s + p->i + 2, &lo))
                return cj_fail(p, K3CJ_E_SYNTAX, p->i + 1, "invalid \\uXXXX escape%s", NULL);
            if (lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p->i += 6;
            }
        }
        on += cj_put_cp(o + on, cp);     /* never longer than its escape */
    }
    p->i++;
    k3cj_val *v = &p->doc->v[*at];
    v->s = (uint32_t)p->an;
    v->n = (uint32_t)on;
    p->an += on;
    cj_end(p, *at);
    return 0;
}

static int cj_digit(char c) { return c >= '0' && c <= '9'; }

static int cj_number(cj_parser *p, uint32_t *at)
{
    size_t start = p->i, i = p->i;
    if (i < p->len && p->s[i] == '-') i++;
    size_t d0 = i;
    if (i < p->len && p->s[i] == '0') i++;
    else if (i < p->len && p->s[i] >= '1' && p->s[i] <= '9') while (i < p->len && cj_digit(p->s[i])) i++;
    else return cj_fail(p, K3CJ_E_SYNTAX, start, "expecting value%s", NULL);
    size_t nd = i - d0;
    int real = 0;
    if (i + 1 < p->len && p->s[i] == '.' && cj_digit(p->s[i + 1])) {
        real = 1;
        i += 2;
        while (i < p->len && cj_digit(p->s[i])) i++;
    }
    if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
        size_t e = i + 1;
        if (e < p->len && (p->s[e] == '+' || p->s[e] == '-')) e++;
        size_t e0 = e;
        while (e < p->len && cj_digit(p->s[e])) e++;
        if (e > e0) { real = 1; i = e; }   /* else the 'e' is not part of the number */
    }
    if (cj_push(p, real ? K3CJ_REAL : K3CJ_INT, start, at)) return -1;
    p->i = i;
    if (!real && nd > K3CJ_MAX_INT_DIGITS)
        return cj_fail(p, K3CJ_E_RANGE, start, "an integer of more than 4300 digits%s", NULL);
    if (real) {
        char tmp[64], *b = tmp;
        size_t n = i - start;
        if (n >= sizeof tmp && !(b = malloc(n + 1))) return cj_fail(p, K3CJ_E_NOMEM, start, "out of memory%s", NULL);
        memcpy(b, p->s + start, n);
        b[n] = '\0';
        p->doc->v[*at].d = strtod(b, NULL);   /* correctly rounded; overflow gives +-inf as float() does */
        if (b != tmp) free(b);
    }
    cj_end(p, *at);
    return 0;
}

static int cj_word(cj_parser *p, const char *w, int type, double d, uint32_t *at)
{
    size_t n = strlen(w);
    if (p->len - p->i < n || memcmp(p->s + p->i, w, n))
        return cj_fail(p, K3CJ_E_SYNTAX, p->i, "expecting value%s", NULL);
    if (cj_push(p, type, p->i, at)) return -1;
    p->doc->v[*at].d = d;
    p->i += n;
    cj_end(p, *at);
    return 0;
}

static int cj_value(cj_parser *p, uint32_t *at);

static int cj_container(cj_parser *p, int obj, uint32_t *at)
{
    size_t start = p->i;
    if (++p->depth > K3CJ_MAX_DEPTH)
        return cj_fail(p, K3CJ_E_DEPTH, start, "nested deeper than 512 levels%s", NULL);
    if (cj_push(p, obj ? K3CJ_OBJ : K3CJ_ARR, start, at)) return -1;
    uint32_t n = 0, child;
    p->i++;
    cj_skip_ws(p);
    char close = obj ? '}' : ']';
    if (p->i < p->len && p->s[p->i] == close) {
        p->i++;
    } else {
        for (;;) {
            if (obj) {
                if (p->i >= p->len || p->s[p->i] != '"')
                    return cj_fail(p, K3CJ_E_SYNTAX, p->i, "expecting property name enclosed in double quotes%s",
                                   NULL);
                if (cj_string(p, &child)) return -1;
                cj_skip_ws(p);
                if (p->i >= p->len || p->s[p->i] != ':')
                    return cj_fail(p, K3CJ_E_SYNTAX, p->i, "expecting ':' delimiter%s", NULL);
                p->i++;
                cj_skip_ws(p);
            }
            if (cj_value(p, &child)) return -1;
            if (n == UINT32_MAX) return cj_fail(p, K3CJ_E_RANGE, start, "too many members%s", NULL);
            n++;
            cj_skip_ws(p);
            if (p->i < p->len && p->s[p->i] == close) { p->i++; break; }
            if (p->i >= p->len || p->s[p->i] != ',')
                return cj_fail(p, K3CJ_E_SYNTAX, p->i, "expecting ',' delimiter%s", NULL);
            p->i++;
            cj_skip_ws(p);
        }
    }
    p->depth--;
    p->doc->v[*at].n = n;
    cj_end(p, *at);
    return 0;
}

static int cj_value(cj_parser *p, uint32_t *at)
{
    if (p->i >= p->len) return cj_fail(p, K3CJ_E_SYNTAX, p->i, "expecting value%s", NULL);
    switch (p->s[p->i]) {
    case '"': return cj_string(p, at);
    case '{': return cj_container(p, 1, at);
    case '[': return cj_container(p, 0, at);
    case 'n': return cj_word(p, "null", K3CJ_NULL, 0, at);
    case 't': return cj_word(p, "true", K3CJ_TRUE, 0, at);
    case 'f': return cj_word(p, "false", K3CJ_FALSE, 0, at);
    case 'N': return cj_word(p, "NaN", K3CJ_REAL, NAN, at);
    case 'I': return cj_word(p, "Infinity", K3CJ_REAL, INFINITY, at);
    case '-':
        if (p->i + 1 < p->len && p->s[p->i + 1] == 'I') return cj_word(p, "-Infinity", K3CJ_REAL, -INFINITY, at);
        return cj_number(p, at);
    default: return cj_number(p, at);
    }
}

static int cj_begin(const char *src, size_t len, size_t at, int flags, k3cj_doc *doc, cj_parser *p,
                    k3cj_error *err)
{
    memset(err, 0, sizeof *err);
    *p = (cj_parser){.s = src, .len = len, .i = at, .flags = flags, .doc = doc, .err = err};
    doc->n = 0;
    doc->src = src;
    doc->src_len = len;
    if (len > K3CJ_MAX_LEN) return cj_fail(p, K3CJ_E_RANGE, 0, "the text is larger than 2 GiB%s", NULL);
    size_t need = len - (at < len ? at : len) + 1;   /* decoded strings never outgrow their source */
    if (doc->arena_cap < need) {
        free(doc->arena);
        doc->arena_cap = 0;
        if (!(doc->arena = malloc(need))) return cj_fail(p, K3CJ_E_NOMEM, 0, "out of memory%s", NULL);
        doc->arena_cap = need;
    }
    return 0;
}

int k3cj_parse(const char *src, size_t len, int flags, k3cj_doc *doc, k3cj_error *err)
{
    cj_parser p;
    uint32_t root;
    memset(doc, 0, sizeof *doc);
    if (cj_begin(src, len, 0, flags, doc, &p, err)) goto fail;
    if (!(flags & K3CJ_LAX)) {
        if (len >= 3 && !memcmp(src, "\xEF\xBB\xBF", 3)) {
            cj_fail(&p, K3CJ_E_UTF8, 0, "unexpected UTF-8 BOM%s", NULL);
            goto fail;
        }
        for (size_t i = 0; i < len;) {
            const char *why = NULL;
            size_t k = (unsigned char)src[i] < 0x80 ? 1 : k3_utf8_seq((const unsigned char *)src + i, len - i, &why);
            if (!k) { cj_fail(&p, K3CJ_E_UTF8, i, "%s", why ? why : "invalid UTF-8"); goto fail; }
            i += k;
        }
    }
    cj_skip_ws(&p);
    if (cj_value(&p, &root)) goto fail;
    cj_skip_ws(&p);
    if (p.i != len) { cj_fail(&p, K3CJ_E_SYNTAX, p.i, "extra data after the value%s", NULL); goto fail; }
    return 0;
fail:
    k3cj_free(doc);
    return -1;
}

int k3cj_parse_prefix(const char *src, size_t len, size_t at, int flags, k3cj_doc *doc, size_t *end,
                      k3cj_error *err)
{
    cj_parser p;
    uint32_t root;
    if (cj_begin(src, len, at, flags, doc, &p, err)) return -1;
    if (cj_value(&p, &root)) return -1;
    *end = p.i;
    return 0;
}

void k3cj_free(k3cj_doc *doc)
{
    free(doc->v);
    free(doc->arena);
    memset(doc, 0, sizeof *doc);
}

/* ------------------------------------------------------------------------ */
/* Access                                                                   */

int k3cj_streq(const k3cj_doc *doc, uint32_t i, const char *s)
{
    const k3cj_val *v = &doc->v[i];
    size_t n = strlen(s);
    return v->type == K3CJ_STR && v->n == n && !memcmp(doc->arena + v->s, s, n);
}

uint32_t k3cj_get(const k3cj_doc *doc, uint32_t obj, const char *key)
{
    uint32_t found = 0;
    if (doc->v[obj].type != K3CJ_OBJ) return 0;
    for (uint32_t m = k3cj_first(doc, obj); m; m = k3cj_next(doc, obj, m))
        if (k3cj_streq(doc, m, key)) found = m + 1;
    return found;
}

int k3cj_truthy(const k3cj_doc *doc, uint32_t i)
{
    const k3cj_val *v = &doc->v[i];
    switch (v->type) {
    case K3CJ_NULL: case K3CJ_FALSE: return 0;
    case K3CJ_TRUE: return 1;
    case K3CJ_INT: {
        const char *s;
        size_t n;
        k3cj_int_text(doc, i, &s, &n);
        return !(n == 1 && s[0] == '0');
    }
    case K3CJ_REAL: return v->d != 0.0 || isnan(v->d);
    default: return v->n != 0;     /* STR bytes, ARR elements, OBJ members */
    }
}

void k3cj_int_text(const k3cj_doc *doc, uint32_t i, const char **s, size_t *n)
{
    const k3cj_val *v = &doc->v[i];
    *s = doc->src + v->off;
    *n = v->len;
    if (*n == 2 && !memcmp(*s, "-0", 2)) { (*s)++; *n = 1; }
}

/* Stable merge sort of idx[0..n) by cmp(doc, a, b); tmp holds n entries. */
typedef int (*cj_cmp)(const k3cj_doc *doc, uint32_t a, uint32_t b);

static void cj_sort(const k3cj_doc *doc, uint32_t *idx, uint32_t *tmp, size_t n, cj_cmp cmp)
{
    if (n < 2) return;
    size_t h = n / 2;
    cj_sort(doc, idx, tmp, h, cmp);
    cj_sort(doc, idx + h, tmp, n - h, cmp);
    size_t a = 0, b = h, o = 0;
    while (a < h && b < n) tmp[o++] = cmp(doc, idx[b], idx[a]) < 0 ? idx[b++] : idx[a++];
    while (a < h) tmp[o++] = idx[a++];
    while (b < n) tmp[o++] = idx[b++];
    memcpy(idx, tmp, n * sizeof *idx);
}

/* Keys by their bytes: WTF-8 byte order is code point order. */
static int cj_key_cmp(const k3cj_doc *doc, uint32_t a, uint32_t b)
{
    const k3cj_val *x = &doc->v[a], *y = &doc->v[b];
    size_t n = x->n < y->n ? x->n : y->n;
    int c = n ? memcmp(doc->arena + x->s, doc->arena + y->s, n) : 0;
    if (c) return c;
    return x->n < y->n ? -1 : x->n > y->n;
}

static int cj_pos_cmp(const k3cj_doc *doc, uint32_t a, uint32_t b)
{
    (void)doc;
    return a < b ? -1 : a > b;
}

k3_err k3cj_dict(const k3cj_doc *doc, uint32_t obj, int sorted, uint32_t **out, size_t *n, k3_diag *d)
{
    *out = NULL;
    *n = 0;
    size_t m = doc->v[obj].n;
    if (doc->v[obj].type != K3CJ_OBJ || !m) return K3_OK;
    uint32_t *keys = malloc(m * sizeof *keys), *tmp = malloc(m * sizeof *tmp), *pairs = malloc(2 * m * sizeof *pairs);
    if (!keys || !tmp || !pairs) {
        free(keys); free(tmp); free(pairs);
        return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    }
    size_t k = 0;
    for (uint32_t i = k3cj_first(doc, obj); i; i = k3cj_next(doc, obj, i)) keys[k++] = i;
    cj_sort(doc, keys, tmp, m, cj_key_cmp);          /* stable: equal keys stay in position order */
    size_t g = 0;                                    /* groups of equal keys */
    for (size_t i = 0; i < m;) {
        size_t j = i + 1;
        while (j < m && !cj_key_cmp(doc, keys[i], keys[j])) j++;
        keys[g] = keys[i];                           /* the first position's key */
        tmp[g] = keys[j - 1] + 1;                    /* the last one's value */
        g++;
        i = j;
    }
    for (size_t i = 0; i < g; i++) { pairs[2 * i] = keys[i]; pairs[2 * i + 1] = tmp[i]; }
    if (!sorted) {
        /* back to the first positions' order: sort the group keys, carrying values along */
        for (size_t i = 0; i < g; i++) keys[i] = pairs[2 * i];
        cj_sort(doc, keys, tmp, g, cj_pos_cmp);
        for (size_t i = 0; i < g; i++) {
            size_t lo = 0, hi = g;                   /* find keys[i]'s pair: pairs are sorted by key */
            while (hi - lo > 1) {
                size_t mid = (lo + hi) / 2;
                if (cj_key_cmp(doc, pairs[2 * mid], keys[i]) <= 0) lo = mid; else hi = mid;
            }
            tmp[i] = pairs[2 * lo + 1];
        }
        for (size_t i = 0; i < g; i++) { pairs[2 * i] = keys[i]; pairs[2 * i + 1] = tmp[i]; }
    }
    free(keys);
    free(tmp);
    *out = pairs;
    *n = g;
    return K3_OK;
}

/* ------------------------------------------------------------------------ */
/* Writer                                                                   */

void k3cj_dump_str(k3cj_buf *out, const char *s, size_t n)
{
    k3cj_buf_put(out, "\"", 1);
    size_t run = 0;                                  /* bytes copied as they are */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = NULL;
        char u[8];
        switch (c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        default:
            if (c < 0x20) { snprintf(u, sizeof u, "\\u%04x", c); e = u; }
        }
        if (!e) continue;
        k3cj_buf_put(out, s + run, i - run);
        k3cj_buf_puts(out, e);
        run = i + 1;
    }
    k3cj_buf_put(out, s + run, n - run);
    k3cj_buf_put(out, "\"", 1);
}

static void cj_dump_real(k3cj_buf *out, double x)
{
    char b[32];
    if (isnan(x)) k3cj_buf_puts(out, "NaN");
    else if (isinf(x)) k3cj_buf_puts(out, x > 0 ? "Infinity" : "-Infinity");
    else { k3cj_repr_double(x, b); k3cj_buf_puts(out, b); }
}

static k3_err cj_dump(const k3cj_doc *doc, uint32_t i, int style, k3cj_buf *out, k3_diag *d)
{
    const k3cj_val *v = &doc->v[i];
    const char *item = style == K3CJ_COMPACT_SORTED ? "," : ", ", *kv = style == K3CJ_COMPACT_SORTED ? ":" : ": ";
    switch (v->type) {
    case K3CJ_NULL: k3cj_buf_puts(out, "null"); break;
    case K3CJ_TRUE: k3cj_buf_puts(out, "true"); break;
    case K3CJ_FALSE: k3cj_buf_puts(out, "false"); break;
    case K3CJ_INT: {
        const char *s;
        size_t n;
        k3cj_int_text(doc, i, &s, &n);
        k3cj_buf_put(out, s, n);
        break;
    }
    case K3CJ_REAL: cj_dump_real(out, v->d); break;
    case K3CJ_STR: k3cj_dump_str(out, k3cj_str(doc, i), v->n); break;
    case K3CJ_ARR:
        k3cj_buf_puts(out, "[");
        for (uint32_t m = k3cj_first(doc, i); m; m = k3cj_next(doc, i, m)) {
            if (m != i + 1) k3cj_buf_puts(out, item);
            k3_err e = cj_dump(doc, m, style, out, d);
            if (e) return e;
        }
        k3cj_buf_puts(out, "]");
        break;
    case K3CJ_OBJ: {
        uint32_t *pairs;
        size_t n;
        k3_err e = k3cj_dict(doc, i, style == K3CJ_COMPACT_SORTED, &pairs, &n, d);
        if (e) return e;
        k3cj_buf_puts(out, "{");
        for (size_t k = 0; k < n && !e; k++) {
            if (k) k3cj_buf_puts(out, item);
            k3cj_dump_str(out, k3cj_str(doc, pairs[2 * k]), doc->v[pairs[2 * k]].n);
            k3cj_buf_puts(out, kv);
            e = cj_dump(doc, pairs[2 * k + 1], style, out, d);
        }
        free(pairs);
        if (e) return e;
        k3cj_buf_puts(out, "}");
        break;
    }
    }
    return out->oom ? k3_fail(d, K3_ERR_NOMEM, "out of memory") : K3_OK;
}

k3_err k3cj_dump(const k3cj_doc *doc, uint32_t i, int style, k3cj_buf *out, k3_diag *d)
{
    return cj_dump(doc, i, style, out, d);
}

/* ------------------------------------------------------------------------ */
/* Python's float repr                                                      */

/* The decimal digits of x to p significant digits, correctly rounded: digits, exponent. */
static void cj_digits(double x, int p, char *dig, int *nd, int *exp10)
{
    char b[48];
    snprintf(b, sizeof b, "%.*e", p - 1, x);
    char *e = strchr(b, 'e');
    int n = 0;
    for (char *c = b; c < e; c++) if (*c >= '0' && *c <= '9') dig[n++] = *c;
    *nd = n;
    *exp10 = atoi(e + 1);
}

static double cj_value_of(const char *dig, int nd, int exp10, int neg)
{
    char b[48];
    int k = 0;
    if (neg) b[k++] = '-';
    b[k++] = dig[0];
    b[k++] = '.';
    for (int i = 1; i < nd; i++) b[k++] = dig[i];
    snprintf(b + k, sizeof b - (size_t)k, "e%d", exp10);
    return strtod(b, NULL);
}

/* dig +- one unit in the last place (carry and borrow kept in nd digits, exponent moved). */
static void cj_step(char *dig, int nd, int *exp10, int up)
{
    int i = nd - 1;
    if (up) {
        while (i >= 0 && dig[i] == '9') dig[i--] = '0';
        if (i >= 0) dig[i]++;
        else { memmove(dig + 1, dig, (size_t)nd - 1); dig[0] = '1'; ++*exp10; }
    } else {
        while (i >= 0 && dig[i] == '0') dig[i--] = '9';
        dig[i]--;
        if (dig[0] == '0') { memmove(dig, dig + 1, (size_t)nd - 1); dig[nd - 1] = '9'; --*exp10; }
    }
}

void k3cj_repr_double(double x, char *buf)
{
    if (isnan(x)) { strcpy(buf, "nan"); return; }
    if (isinf(x)) { strcpy(buf, x > 0 ? "inf" : "-inf"); return; }
    if (x == 0) { strcpy(buf, signbit(x) ? "-0.0" : "0.0"); return; }
    int neg = x < 0, nd = 0, e = 0;
    char dig[24];
    for (int p = 1; p <= 17; p++) {
        cj_digits(x, p, dig, &nd, &e);
        double y = cj_value_of(dig, nd, e, neg);
        if (y == x) break;
        /* the nearest p-digit decimal missed; at a power of two the interval is lopsided and
           the neighbour on the other side may still round-trip (shortest, as dtoa mode 0) */
        char alt[24];
        int ae = e;
        memcpy(alt, dig, (size_t)nd);
        cj_step(alt, nd, &ae, (y < x) != neg);
        if (alt[0] != '0' && cj_value_of(alt, nd, ae, neg) == x) { memcpy(dig, alt, (size_t)nd); e = ae; break; }
    }
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    char *o = buf;
    if (neg) *o++ = '-';
    if (e >= -4 && e < 16) {
        if (e >= 0) {
            for (int i = 0; i <= e; i++) *o++ = i < nd ? dig[i] : '0';
            *o++ = '.';
            if (nd > e + 1) for (int i = e + 1; i < nd; i++) *o++ = dig[i];
            else *o++ = '0';
        } else {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -e - 1; i++) *o++ = '0';
            for (int i = 0; i < nd; i++) *o++ = dig[i];
        }
        *o = '\0';
    } else {
        *o++ = dig[0];
        if (nd > 1) {
            *o++ = '.';
            for (int i = 1; i < nd; i++) *o++ = dig[i];
        }
        sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
}

/* ------------------------------------------------------------------------ */
/* WTF-8 and Python's isspace                                               */

size_t k3cj_wtf8_next(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t k = u[0] < 0x80 ? 1 : u[0] >= 0xF0 ? 4 : u[0] >= 0xE0 ? 3 : u[0] >= 0xC0 ? 2 : 0;
    if (!k || k > n) { *cp = 0xFFFD; return 1; }
    uint32_t c = k == 1 ? u[0] : (uint32_t)(u[0] & (0x7F >> k));
    for (size_t i = 1; i < k; i++) {
        if ((u[i] & 0xC0) != 0x80) { *cp = 0xFFFD; return 1; }
        c = c << 6 | (u[i] & 0x3F);
    }
    *cp = c;
    return k;
}

void k3cj_wtf8_fix(k3cj_buf *out, const char *s, size_t n)
{
    size_t run = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp, lo;
        size_t k = k3cj_wtf8_next(s + i, n - i, &cp);
        if (cp < 0xD800 || cp > 0xDFFF) { i += k; continue; }
        k3cj_buf_put(out, s + run, i - run);
        char o[4];
        size_t k2;
        if (cp <= 0xDBFF && i + k < n && (k2 = k3cj_wtf8_next(s + i + k, n - i - k, &lo)) == 3 && lo >= 0xDC00 &&
            lo <= 0xDFFF) {
            k3cj_buf_put(out, o, cj_put_cp(o, 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)));
            k += k2;
        } else {
            k3cj_buf_put(out, "\xEF\xBF\xBD", 3);
        }
        i += k;
        run = i;
    }
    k3cj_buf_put(out, s + run, n - run);
}

int k3cj_py_isspace(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

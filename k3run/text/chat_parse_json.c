/*
 * chat_parse_json.c - the JSON the chat parser writes and checks: a growable
 * byte string, a JSON string writer (K3's own escaping, §7.3: only `"`, `\`
 * and control characters escaped, UTF-8 raw), and a strict RFC 8259 checker
 * for the typed argument values of §9.3.
 */
#include "chat_parse_impl.h"

#include <stdlib.h>
#include <string.h>

#include "k3_utf8.h"

#define JSON_MAX_DEPTH 256

/* ------------------------------------------------------------------------- */
/* byte strings                                                               */

int k3_chat_buf_put(k3_chat_buf *b, const void *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) {
            if (cap > SIZE_MAX / 2) return -1;
            cap *= 2;
        }
        uint8_t *nb = realloc(b->b, cap);
        if (!nb) return -1;
        b->b = nb;
        b->cap = cap;
    }
    if (n) memcpy(b->b + b->n, s, n);
    b->n += n;
    b->b[b->n] = 0;
    return 0;
}

int k3_chat_buf_puts(k3_chat_buf *b, const char *s)
{
    return k3_chat_buf_put(b, s, strlen(s));
}

void k3_chat_buf_free(k3_chat_buf *b)
{
    free(b->b);
    b->b = NULL;
    b->n = b->cap = 0;
}

char *k3_chat_buf_dup(const k3_chat_buf *b)
{
    char *s = malloc(b->n + 1);
    if (!s) return NULL;
    if (b->n) memcpy(s, b->b, b->n);
    s[b->n] = 0;
    return s;
}

/* ------------------------------------------------------------------------- */
/* writing a JSON string                                                      */

int k3_chat_json_string(k3_chat_buf *b, const uint8_t *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    if (k3_chat_buf_put(b, "\"", 1)) return -1;
    size_t run = 0;                          /* s[run..i) is copied as it is */
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        char esc[8];                         /* the escape for s[i], if any */
        size_t elen = 0, skip = 1;
        if (c == '"' || c == '\\') {
            esc[0] = '\\'; esc[1] = (char)c; elen = 2;
        } else if (c < 0x20) {
            const char *short_esc = c == '\b' ? "\\b" : c == '\f' ? "\\f" : c == '\n' ? "\\n"
                                  : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
            if (short_esc) {
                memcpy(esc, short_esc, 2); elen = 2;
            } else {
                memcpy(esc, "\\u00", 4); esc[4] = hex[c >> 4]; esc[5] = hex[c & 15]; elen = 6;
            }
        } else if (c >= 0x80) {
            size_t len = k3_utf8_seq(s + i, n - i, NULL);
            if (len) {
                i += len;
                continue;
            }
            memcpy(esc, "\xEF\xBF\xBD", 3); elen = 3;   /* U+FFFD */
        } else {
            i++;
            continue;
        }
        if (k3_chat_buf_put(b, s + run, i - run) || k3_chat_buf_put(b, esc, elen)) return -1;
        i += skip;
        run = i;
    }
    if (k3_chat_buf_put(b, s + run, n - run)) return -1;
    return k3_chat_buf_put(b, "\"", 1);
}

/* ------------------------------------------------------------------------- */
/* checking a JSON value                                                      */

typedef struct jcheck {
    const uint8_t *s;
    size_t n, i;
} jcheck;

static void skip_ws(jcheck *j)
{
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' ||
                           j->s[j->i] == '\r'))
        j->i++;
}

static int is_digit(const jcheck *j)
{
    return j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9';
}

static int is_hex(uint8_t c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int check_literal(jcheck *j, const char *lit)
{
    size_t len = strlen(lit);
    if (j->n - j->i < len || memcmp(j->s + j->i, lit, len)) return 0;
    j->i += len;
    return 1;
}

/* -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)? */
static int check_number(jcheck *j)
{
    if (j->i < j->n && j->s[j->i] == '-') j->i++;
    if (!is_digit(j)) return 0;
    if (j->s[j->i] == '0') {
        j->i++;
    } else {
        while (is_digit(j)) j->i++;
    }
    if (j->i < j->n && j->s[j->i] == '.') {
        j->i++;
        if (!is_digit(j)) return 0;
        while (is_digit(j)) j->i++;
    }
    if (j->i < j->n && (j->s[j->i] == 'e' || j->s[j->i] == 'E')) {
        j->i++;
        if (j->i < j->n && (j->s[j->i] == '+' || j->s[j->i] == '-')) j->i++;
        if (!is_digit(j)) return 0;
        while (is_digit(j)) j->i++;
    }
    return 1;
}

static int check_string(jcheck *j)
{
    j->i++;                                  /* the opening quote */
    while (j->i < j->n) {
        uint8_t c = j->s[j->i];
        if (c == '"') {
            j->i++;
            return 1;
        }
        if (c < 0x20) return 0;
        if (c == '\\') {
            if (j->i + 1 >= j->n) return 0;
            uint8_t e = j->s[j->i + 1];
            if (e == 'u') {
                if (j->n - j->i < 6) return 0;
                for (size_t k = 2; k < 6; k++)
                    if (!is_hex(j->s[j->i + k])) return 0;
                j->i += 6;
            } else if (strchr("\"\\/bfnrt", e) && e) {
                j->i += 2;
            } else {
                return 0;
            }
        } else if (c >= 0x80) {
            size_t len = k3_utf8_seq(j->s + j->i, j->n - j->i, NULL);
            if (!len) return 0;
            j->i += len;
        } else {
            j->i++;
        }
    }
    return 0;                                /* unterminated */
}

static int check_value(jcheck *j, int depth);

/* An object or an array: open/close are its brackets; keyed: members are "KEY": VALUE. */
static int check_container(jcheck *j, int depth, uint8_t close, int keyed)
{
    if (depth >= JSON_MAX_DEPTH) return 0;
    j->i++;
    skip_ws(j);
    if (j->i < j->n && j->s[j->i] == close) {
        j->i++;
        return 1;
    }
    for (;;) {
        if (keyed) {
            if (j->i >= j->n || j->s[j->i] != '"' || !check_string(j)) return 0;
            skip_ws(j);
            if (j->i >= j->n || j->s[j->i] != ':') return 0;
            j->i++;
            skip_ws(j);
        }
        if (!check_value(j, depth + 1)) return 0;
        skip_ws(j);
        if (j->i >= j->n) return 0;
        if (j->s[j->i] == close) {
            j->i++;
            return 1;
        }
        if (j->s[j->i] != ',') return 0;
        j->i++;
        skip_ws(j);
    }
}

static int check_value(jcheck *j, int depth)
{
    if (j->i >= j->n) return 0;
    switch (j->s[j->i]) {
    case '{': return check_container(j, depth, '}', 1);
    case '[': return check_container(j, depth, ']', 0);
    case '"': return check_string(j);
    case 't': return check_literal(j, "true");
    case 'f': return check_literal(j, "false");
    case 'n': return check_literal(j, "null");
    default: return check_number(j);
    }
}

static int type_of(uint8_t c)
{
    switch (c) {
    case '{': return K3_CHAT_JSON_OBJECT;
    case '[': return K3_CHAT_JSON_ARRAY;
    case '"': return K3_CHAT_JSON_STRING;
    case 't': case 'f': return K3_CHAT_JSON_BOOLEAN;
    case 'n': return K3_CHAT_JSON_NULL;
    default: return K3_CHAT_JSON_NUMBER;
    }
}

int k3_chat_json_check(const uint8_t *s, size_t n, int type)
{
    jcheck j = { s, n, 0 };
    skip_ws(&j);
    if (j.i >= n) return 0;
    if (type != K3_CHAT_JSON_ANY && type_of(s[j.i]) != type) return 0;
    if (!check_value(&j, 0)) return 0;
    skip_ws(&j);
    return j.i == n;
}

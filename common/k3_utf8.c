/* k3_utf8.c - strict UTF-8 validation. */
#include "k3_utf8.h"

#include <stdlib.h>
#include <string.h>

size_t k3_utf8_seq(const unsigned char *s, size_t n, const char **why)
{
    const char *ignored;
    if (!why) why = &ignored;
    unsigned c = s[0], cp, min;
    size_t len;
    if (c < 0x80) return 1;
    if (c >= 0xC0 && c <= 0xDF) { len = 2; min = 0x80; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; min = 0x800; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF7) { len = 4; min = 0x10000; cp = c & 0x07; }
    else {
        *why = c < 0xC0 ? "a stray UTF-8 continuation byte" : "an invalid UTF-8 lead byte";
        return 0;
    }
    if (n < len) { *why = "a truncated UTF-8 sequence"; return 0; }
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) { *why = "a truncated UTF-8 sequence"; return 0; }
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min) { *why = "an overlong UTF-8 sequence"; return 0; }
    if (cp >= 0xD800 && cp <= 0xDFFF) { *why = "a UTF-16 surrogate encoded in UTF-8"; return 0; }
    if (cp > 0x10FFFF) { *why = "a code point above U+10FFFF"; return 0; }
    return len;
}

const char *k3_utf8_problem(const unsigned char *s, size_t n, size_t *at)
{
    for (size_t i = 0; i < n;) {
        if (s[i] == 0) { *at = i; return "a raw NUL byte"; }
        if (s[i] < 0x80) { i++; continue; }
        const char *why;
        size_t len = k3_utf8_seq(s + i, n - i, &why);
        if (!len) { *at = i; return why; }
        i += len;
    }
    return NULL;
}

char *k3_utf8_sanitize(const char *s, size_t n, size_t *out_n)
{
    char *o = malloc(n * 3 + 1);             /* [3n + 1]: each byte becomes at most U+FFFD */
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t len = k3_utf8_seq((const unsigned char *)s + i, n - i, NULL);
        if (len) { memcpy(o + k, s + i, len); k += len; i += len; }
        else { memcpy(o + k, "\xEF\xBF\xBD", 3); k += 3; i++; }
    }
    o[k] = 0;
    if (out_n) *out_n = k;
    return o;
}

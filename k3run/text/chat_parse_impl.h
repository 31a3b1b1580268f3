/*
 * chat_parse_impl.h - private to the chat parser's files: the growable byte
 * string k3_chat_buf and the bits of JSON it needs (chat_parse_json.c): a
 * string writer and a checker that says whether bytes are one JSON value of
 * a given type.
 */
#ifndef K3_CHAT_PARSE_IMPL_H
#define K3_CHAT_PARSE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "chat_parse.h"

/* Append n bytes (keeps b->b NUL-terminated). 0, or -1 when out of memory. */
int k3_chat_buf_put(k3_chat_buf *b, const void *s, size_t n);
int k3_chat_buf_puts(k3_chat_buf *b, const char *s);
void k3_chat_buf_free(k3_chat_buf *b);
/* A malloc'd NUL-terminated copy of b's bytes ("" when empty), or NULL when out of memory. */
char *k3_chat_buf_dup(const k3_chat_buf *b);

/*
 * Append s[0..n) as a JSON string, quotes included: `"` and `\` escaped,
 * U+0000-001F as \b \f \n \r \t or \u00XX (lowercase hex), everything else
 * raw; a byte that does not start a valid UTF-8 sequence becomes U+FFFD.
 * 0, or -1 when out of memory.
 */
int k3_chat_json_string(k3_chat_buf *b, const uint8_t *s, size_t n);

enum {
    K3_CHAT_JSON_ANY = 0, K3_CHAT_JSON_STRING, K3_CHAT_JSON_NUMBER, K3_CHAT_JSON_BOOLEAN,
    K3_CHAT_JSON_NULL, K3_CHAT_JSON_OBJECT, K3_CHAT_JSON_ARRAY
};
/*
 * 1 if s[0..n) is exactly one RFC 8259 JSON value of the given type
 * (whitespace around it allowed, strings valid UTF-8, nesting at most 256
 * deep), else 0.
 */
int k3_chat_json_check(const uint8_t *s, size_t n, int type);

#endif

/*
 * k3_utf8.h - strict UTF-8 validation (RFC 3629): no overlong forms, no
 * surrogates, nothing above U+10FFFF, no truncated sequences. Used for every
 * name that comes from a file, and when escaping names for display.
 */
#ifndef K3_UTF8_H
#define K3_UTF8_H

#include <stddef.h>

/*
 * Length (1..4) of the valid UTF-8 sequence starting at s[0] (n >= 1 bytes
 * available), or 0 if it is invalid, with *why (if why is not NULL) saying
 * why: "an overlong UTF-8 sequence", "a truncated UTF-8 sequence", ...
 */
size_t k3_utf8_seq(const unsigned char *s, size_t n, const char **why);

/*
 * NULL if s[0..n) is valid UTF-8 holding no NUL byte; otherwise what is wrong
 * ("a raw NUL byte", or k3_utf8_seq's reason), with *at the offending offset.
 */
const char *k3_utf8_problem(const unsigned char *s, size_t n, size_t *at);

/*
 * s[0..n) with every byte that does not start a valid UTF-8 sequence replaced
 * by U+FFFD (NUL bytes kept): text fit for a JSON string. malloc'd, NUL-
 * terminated, *out_n its length (out_n may be NULL); NULL when out of memory.
 */
char *k3_utf8_sanitize(const char *s, size_t n, size_t *out_n);

#endif

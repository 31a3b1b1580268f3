/*
 * json_diff.h - differential check of k3_json against jansson (flags
 * JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, no JSON_ALLOW_NUL): both must accept or
 * reject the same documents, and accepted documents must decode to the same
 * values (types, integers, reals, strings, member order). One known jansson
 * quirk is excused (see below). Header-only: used by
 * the unit test and by the fuzz target fuzz_json.c.
 */
#ifndef K3_JSON_DIFF_H
#define K3_JSON_DIFF_H

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "k3_json.h"

static int k3_json_same(const k3j_doc *d, uint32_t i, const json_t *j, char *why, size_t cap)
{
    const k3j_tok *t = &d->t[i];
    switch ((k3j_type)t->type) {
    case K3J_NULL: if (json_is_null(j)) return 1; break;
    case K3J_TRUE: if (json_is_true(j)) return 1; break;
    case K3J_FALSE: if (json_is_false(j)) return 1; break;
    case K3J_INT: if (json_is_integer(j) && json_integer_value(j) == t->v.i) return 1; break;
    case K3J_REAL:
        if (json_is_real(j) && memcmp(&(double){json_real_value(j)}, &t->v.d, sizeof(double)) == 0) return 1;
        break;
    case K3J_STR:
        if (json_is_string(j) && json_string_length(j) == t->size &&
            memcmp(json_string_value(j), t->v.s, t->size) == 0)
            return 1;
        break;
    case K3J_ARR: {
        if (!json_is_array(j) || json_array_size(j) != t->size) break;
        size_t k = 0;
        for (uint32_t e = k3j_first(d, i); e; e = k3j_next(d, i, e), k++)
            if (!k3_json_same(d, e, json_array_get(j, k), why, cap)) return 0;
        return 1;
    }
    case K3J_OBJ: {
        if (!json_is_object(j) || json_object_size(j) != t->size) break;
        void *it = json_object_iter((json_t *)j);
        for (uint32_t k = k3j_first(d, i); k; k = k3j_next(d, i, k), it = json_object_iter_next((json_t *)j, it)) {
            if (!it || json_object_iter_key_len(it) != d->t[k].size ||
                memcmp(json_object_iter_key(it), d->t[k].v.s, d->t[k].size) != 0) {
                snprintf(why, cap, "object key differs at token %u", k);
                return 0;
            }
            if (!k3_json_same(d, k + 1, json_object_iter_value(it), why, cap)) return 0;
        }
        return 1;
    }
    }
    snprintf(why, cap, "value differs at token %u (offset %u, type %d vs jansson type %d)", i, t->off,
             t->type, (int)json_typeof(j));
    return 0;
}

/* 0 when k3_json and jansson agree on data[0..size), else 1 with why filled. */
static int k3_json_diff(const uint8_t *data, size_t size, char *why, size_t cap)
{
    k3j_doc doc;
    k3j_error ke;
    json_error_t je;
    int mine = k3j_parse((const char *)data, size, &doc, &ke) == 0;
    json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    int diff = 0;
    /* jansson drops a raw NUL byte that follows a number or literal ("[1\0]" loads
     * as [1]); k3_json rejects every raw NUL, as RFC 8259 does. Not a difference. */
    int jansson_nul_quirk = j && !mine && memchr(data, 0, size) != NULL;
    if (mine != (j != NULL) && !jansson_nul_quirk) {
        snprintf(why, cap, "k3_json %s (%.100s), jansson %s (%.100s)", mine ? "accepts" : "rejects",
                 mine ? "-" : ke.text, j ? "accepts" : "rejects", j ? "-" : je.text);
        diff = 1;
    } else if (mine && !k3_json_same(&doc, 0, j, why, cap)) {
        diff = 1;
    }
    if (mine) k3j_free(&doc);
    json_decref(j);
    return diff;
}

#endif

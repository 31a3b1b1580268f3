/*
 * chat_segs.c - the chat renderer's segment list (chat_impl.h): tags and
 * attributes as the official renderer builds them (CHAT-FORMAT.md §3.1), and
 * the encoding of the segments into pieces and ids (§3.3).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_impl.h"

/* ------------------------------------------------------------------------ */
/* Segments                                                                 */

static chat_seg *seg_new(chat_ctx *c)
{
    if (c->oom) return NULL;
    if (c->n_segs == c->cap_segs) {
        size_t cap = c->cap_segs ? c->cap_segs * 2 : 256;
        chat_seg *s = realloc(c->segs, cap * sizeof *s);
        if (!s) { c->oom = 1; return NULL; }
        c->segs = s;
        c->cap_segs = cap;
    }
    return &c->segs[c->n_segs++];
}

void chat_special(chat_ctx *c, int32_t id)
{
    chat_seg *s = seg_new(c);
    if (s) *s = (chat_seg){.special = id};
}

static void chat_string(chat_ctx *c, const char *p, size_t n, int control)
{
    if (!n) return;
    size_t off = c->text.n;
    k3cj_buf_put(&c->text, p, n);
    if (c->text.oom) { c->oom = 1; return; }
    chat_seg *s = seg_new(c);
    if (s) *s = (chat_seg){.special = -1, .control = control, .off = off, .len = n};
}

void chat_text(chat_ctx *c, const char *s, size_t n) { chat_string(c, s, n, 0); }
void chat_control_text(chat_ctx *c, const char *s) { chat_string(c, s, strlen(s), 1); }

void chat_open(chat_ctx *c, const char *tag)
{
    chat_special(c, c->open);
    chat_text(c, tag, strlen(tag));
}

void chat_sep(chat_ctx *c) { chat_special(c, c->sep); }

void chat_open_tag(chat_ctx *c, const char *tag)
{
    chat_open(c, tag);
    chat_sep(c);
}

void chat_close(chat_ctx *c, const char *tag)
{
    chat_special(c, c->close);
    chat_text(c, tag, strlen(tag));
    chat_special(c, c->sep);
}

void chat_end_of_msg(chat_ctx *c) { chat_special(c, c->eom); }

void chat_attr(chat_ctx *c, const char *key, const char *val, size_t n)
{
    char k[64];
    snprintf(k, sizeof k, " %s", key);
    chat_text(c, k, strlen(k));
    chat_text(c, "=\"", 2);
    /* & -> &amp; then " -> &quot;: together, one pass */
    k3cj_buf e = {0};                                /* [~n] the escaped value */
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        if (val[i] != '&' && val[i] != '"') continue;
        k3cj_buf_put(&e, val + run, i - run);
        k3cj_buf_puts(&e, val[i] == '&' ? "&amp;" : "&quot;");
        run = i + 1;
    }
    if (run == 0) {
        chat_text(c, val, n);
    } else {
        k3cj_buf_put(&e, val + run, n - run);
        if (e.oom) c->oom = 1;
        else chat_text(c, e.p, e.n);
    }
    free(e.p);
    chat_text(c, "\"", 1);
}

void chat_attr_u(chat_ctx *c, const char *key, size_t val)
{
    char b[32];
    snprintf(b, sizeof b, "%zu", val);
    chat_attr(c, key, b, strlen(b));
}

void chat_internal(chat_ctx *c, const char *type, const char *body, size_t n)
{
    chat_open(c, "message");
    chat_attr(c, "role", "system", 6);
    chat_attr(c, "type", type, strlen(type));
    chat_sep(c);
    chat_text(c, body, n);          /* the bodies have no surrounding whitespace to strip */
    chat_close(c, "message");
    chat_end_of_msg(c);
}

k3_err chat_check(chat_ctx *c)
{
    return c->oom ? k3_fail(c->d, K3_ERR_NOMEM, "'%s': out of memory rendering the chat", c->name) : K3_OK;
}

/* ------------------------------------------------------------------------ */
/* Values                                                                   */

k3_err chat_refuse(chat_ctx *c, const char *fmt, ...)
{
    char m[K3_DIAG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return k3_fail(c->d, K3_ERR_USAGE, "'%s': %s", c->name, m);
}

const char *chat_quote(const chat_ctx *c, uint32_t v, char *buf, size_t cap)
{
    k3cj_buf b = {0};                                /* the JSON string, escapes keep it one line */
    const k3cj_val *x = &c->doc.v[v];
    k3cj_dump_str(&b, k3cj_str(&c->doc, v), x->n > 64 ? 64 : x->n);
    snprintf(buf, cap, "%.*s%s", b.oom ? 0 : (int)b.n, b.p ? b.p : "", x->n > 64 ? "..." : "");
    free(b.p);
    return buf;
}

int chat_is(const chat_ctx *c, uint32_t v, int type) { return v && c->doc.v[v].type == type; }

const char *chat_type_name(const chat_ctx *c, uint32_t v)
{
    if (!v) return "absent";                         /* index 0 is the request itself, never a field */
    return chat_kind(c->doc.v[v].type);
}

const char *chat_kind(int type)
{
    switch (type) {
    case K3CJ_NULL: return "null";
    case K3CJ_TRUE: case K3CJ_FALSE: return "a boolean";
    case K3CJ_INT: case K3CJ_REAL: return "a number";
    case K3CJ_STR: return "a string";
    case K3CJ_ARR: return "a list";
    default: return "an object";
    }
}

k3_err chat_py_str(chat_ctx *c, uint32_t v, k3cj_buf *out, const char *what)
{
    const k3cj_doc *d = &c->doc;
    char b[32];
    switch (d->v[v].type) {
    case K3CJ_STR: k3cj_buf_put(out, k3cj_str(d, v), d->v[v].n); break;
    case K3CJ_NULL: k3cj_buf_puts(out, "None"); break;
    case K3CJ_TRUE: k3cj_buf_puts(out, "True"); break;
    case K3CJ_FALSE: k3cj_buf_puts(out, "False"); break;
    case K3CJ_INT: {
        const char *s;
        size_t n;
        k3cj_int_text(d, v, &s, &n);
        k3cj_buf_put(out, s, n);
        break;
    }
    case K3CJ_REAL: k3cj_repr_double(d->v[v].d, b); k3cj_buf_puts(out, b); break;
    default:
        return chat_refuse(c, "%s is %s: give a string (the official renderer would write Python's repr of it)",
                           what, chat_type_name(c, v));
    }
    if (out->oom) c->oom = 1;
    return chat_check(c);
}

/* ------------------------------------------------------------------------ */
/* Encoding (§3.3)                                                          */

#define CHAT_CHUNK_CPS 400000     /* tiktoken's limit per call */
#define CHAT_RUN_CPS 25000        /* longest run of (non-)whitespace per call */

typedef struct chat_out {
    k3_chat_prompt *p;
    size_t cap_ids, cap_pieces;
    k3cj_buf arena;              /* text pieces' UTF-8 */
} chat_out;

static k3_err out_piece(chat_ctx *c, chat_out *o, k3_chat_piece pc)
{
    k3_chat_prompt *p = o->p;
    if (p->n_pieces == o->cap_pieces) {
        size_t cap = o->cap_pieces ? o->cap_pieces * 2 : 256;
        k3_chat_piece *np = realloc(p->pieces, cap * sizeof *np);
        if (!np) return k3_fail(c->d, K3_ERR_NOMEM, "'%s': out of memory", c->name);
        p->pieces = np;
        o->cap_pieces = cap;
    }
    p->pieces[p->n_pieces++] = pc;
    return K3_OK;
}

/* One slice of a segment: fixed to UTF-8, encoded on its own. */
static k3_err out_slice(chat_ctx *c, chat_out *o, const char *s, size_t n, int control)
{
    size_t off = o->arena.n;
    k3cj_wtf8_fix(&o->arena, s, n);
    if (o->arena.oom) return k3_fail(c->d, K3_ERR_NOMEM, "'%s': out of memory", c->name);
    if (o->arena.n > UINT32_MAX || o->p->n_ids > UINT32_MAX - n)
        return chat_refuse(c, "the rendered prompt is larger than 4 GiB");
    size_t id0 = o->p->n_ids;
    k3_err e = k3_tok_encode(c->tok, o->arena.p + off, o->arena.n - off, control, &o->p->ids, &o->p->n_ids,
                             &o->cap_ids, c->d);
    if (e) return e;
    return out_piece(c, o, (k3_chat_piece){.special = -1, .off = (uint32_t)off, .len = (uint32_t)(o->arena.n - off),
                                           .id0 = (uint32_t)id0, .id1 = (uint32_t)o->p->n_ids});
}

/* A segment cut as tokenization_kimi.py cuts it: 400,000 code point chunks, then runs. */
static k3_err out_segment(chat_ctx *c, chat_out *o, const char *s, size_t n, int control)
{
    size_t i = 0;
    while (i < n) {
        size_t start = i, run = 0, cps = 0;      /* one chunk */
        int cls = -1;
        while (i < n && cps < CHAT_CHUNK_CPS) {
            uint32_t cp;
            size_t k = k3cj_wtf8_next(s + i, n - i, &cp);
            int sp = k3cj_py_isspace(cp);
            if (cls < 0) cls = sp;
            if (sp != cls) {
                cls = sp;
                run = 1;
            } else if (++run > CHAT_RUN_CPS) {
                k3_err e = out_slice(c, o, s + start, i - start, control);
                if (e) return e;
                start = i;
                run = 1;
            }
            i += k;
            cps++;
        }
        k3_err e = out_slice(c, o, s + start, i - start, control);
        if (e) return e;
    }
    return K3_OK;
}

k3_err chat_encode(chat_ctx *c, k3_chat_prompt *p)
{
    chat_out o = {.p = p};
    k3_err e = K3_OK;
    for (size_t i = 0; i < c->n_segs && !e; i++) {
        const chat_seg *s = &c->segs[i];
        if (c->sys_marked && i == c->sys_segs) p->n_system = p->n_ids;
        if (s->special < 0) {
            e = out_segment(c, &o, c->text.p + s->off, s->len, s->control);
            continue;
        }
        if (p->n_ids == o.cap_ids) {
            size_t cap = o.cap_ids ? o.cap_ids * 2 : 1024;
            int32_t *ids = realloc(p->ids, cap * sizeof *ids);
            if (!ids) { e = k3_fail(c->d, K3_ERR_NOMEM, "'%s': out of memory", c->name); break; }
            p->ids = ids;
            o.cap_ids = cap;
        }
        p->ids[p->n_ids] = s->special;
        e = out_piece(c, &o, (k3_chat_piece){.special = s->special, .id0 = (uint32_t)p->n_ids,
                                             .id1 = (uint32_t)p->n_ids + 1});
        p->n_ids++;
    }
    if (!e && !o.arena.p) {
        k3cj_buf_put(&o.arena, "", 1);              /* an arena even for a prompt of markers only */
        if (o.arena.oom) e = k3_fail(c->d, K3_ERR_NOMEM, "'%s': out of memory", c->name);
    }
    p->arena = o.arena.p;
    return e;
}

/*
 * chat_tools.c - tools in the chat renderer (CHAT-FORMAT.md §6.4-§6.5, §7):
 * the tool declaration, assistant tool calls with their arguments (the
 * one-level parse of an argument string, dict arguments re-serialised as
 * Python does), and the re-sorting of tool results by call id.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_impl.h"

/* ------------------------------------------------------------------------ */
/* Declaration (§7.1)                                                       */

k3_err chat_tool_declare(chat_ctx *c, uint32_t tools, int dynamic)
{
    static const char head[] = "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n";
    static const char head_dyn[] =
        "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
        "You have access to all existing and extended tools.\nHere are the specs for the extended tools.\n\n```json\n";
    c->tools_declared = 1;
    k3cj_buf b = {0};                                /* the body */
    k3cj_buf_puts(&b, dynamic ? head_dyn : head);
    k3_err e = k3cj_dump(&c->doc, tools, K3CJ_COMPACT_SORTED, &b, c->d);
    k3cj_buf_puts(&b, "\n```");
    if (!e && b.oom) e = k3_fail(c->d, K3_ERR_NOMEM, "'%s': out of memory", c->name);
    if (!e) {
        chat_open(c, "message");
        chat_attr(c, "role", "system", 6);
        chat_attr(c, "type", "tool-declare", 12);
        chat_sep(c);
        chat_text(c, b.p, b.n);
        chat_close(c, "message");
        chat_end_of_msg(c);
        e = chat_check(c);
    }
    free(b.p);
    return e;
}

/* ------------------------------------------------------------------------ */
/* Arguments (§7.2)                                                         */

/* XTML type of a value, as _xtml_type: booleans before numbers. */
static const char *xtml_type(const k3cj_doc *d, uint32_t v)
{
    switch (d->v[v].type) {
    case K3CJ_TRUE: case K3CJ_FALSE: return "boolean";
    case K3CJ_NULL: return "null";
    case K3CJ_INT: case K3CJ_REAL: return "number";
    case K3CJ_STR: return "string";
    case K3CJ_OBJ: return "object";
    default: return "array";
    }
}

static void emit_argument(chat_ctx *c, const char *key, size_t kn, const char *type, const char *val, size_t vn)
{
    chat_open(c, "argument");
    chat_attr(c, "key", key, kn);
    chat_attr(c, "type", type, strlen(type));
    chat_sep(c);
    chat_text(c, val, vn);
    chat_close(c, "argument");
}

/* Already-parsed arguments: dict order, strings as they are, the rest json.dumps'd. */
static k3_err dict_arguments(chat_ctx *c, uint32_t args)
{
    uint32_t *pairs;
    size_t n;
    k3_err e = k3cj_dict(&c->doc, args, 0, &pairs, &n, c->d);
    for (size_t k = 0; k < n && !e; k++) {
        uint32_t key = pairs[2 * k], v = pairs[2 * k + 1];
        const k3cj_val *kv = &c->doc.v[key];
        if (c->doc.v[v].type == K3CJ_STR) {
            emit_argument(c, k3cj_str(&c->doc, key), kv->n, "string", k3cj_str(&c->doc, v), c->doc.v[v].n);
            continue;
        }
        k3cj_buf b = {0};                            /* the value's json.dumps */
        e = k3cj_dump(&c->doc, v, K3CJ_PY_DEFAULT, &b, c->d);
        if (!e) emit_argument(c, k3cj_str(&c->doc, key), kv->n, xtml_type(&c->doc, v), b.p, b.n);
        free(b.p);
    }
    free(pairs);
    return e ? e : chat_check(c);
}

/* One parsed argument of a string: (key, type, text) as offsets into a scratch buffer. */
typedef struct arg_one {
    size_t key, kn, val, vn;
    const char *type;
} arg_one;

static size_t skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

enum { ONE_OK = 0, ONE_RAW = 1 };

/*
 * _parse_arguments_object: ONE_OK with the arguments, ONE_RAW when the string
 * is not a well-formed object (a raw json block), or an error (nesting beyond
 * the decoder's depth: Python's RecursionError is not caught there either).
 */
static int one_level(chat_ctx *c, const char *s, size_t n, k3cj_buf *sb, arg_one **out, size_t *n_out, k3_err *err)
{
    size_t i = skip_ws(s, n, 0), cap = 0;
    k3cj_doc v = {0};                                /* one key or value, buffers reused */
    k3cj_error je;
    arg_one *a = NULL;
    int r = ONE_RAW;
    *err = K3_OK;
    *out = NULL;
    *n_out = 0;
    if (i >= n || s[i] != '{') goto done;
    i = skip_ws(s, n, i + 1);
    if (i >= n) goto done;
    if (s[i] == '}') { r = ONE_OK; goto done; }
    for (;;) {
        size_t end;
        if (*n_out == cap) {
            cap = cap ? cap * 2 : 8;
            arg_one *na = realloc(a, cap * sizeof *na);
            if (!na) { *err = k3_fail(c->d, K3_ERR_NOMEM, "'%s': out of memory", c->name); goto done; }
            a = na;
        }
        arg_one *o = &a[*n_out];
        if (k3cj_parse_prefix(s, n, i, K3CJ_LAX, &v, &end, &je)) goto bad;
        if (v.v[0].type != K3CJ_STR) goto done;
        o->key = sb->n;
        o->kn = v.v[0].n;
        k3cj_buf_put(sb, k3cj_str(&v, 0), v.v[0].n);
        i = skip_ws(s, n, end);
        if (i >= n || s[i] != ':') goto done;
        i = skip_ws(s, n, i + 1);
        if (k3cj_parse_prefix(s, n, i, K3CJ_LAX, &v, &end, &je)) goto bad;
        o->type = xtml_type(&v, 0);
        o->val = sb->n;
        if (v.v[0].type == K3CJ_STR) {
            o->vn = v.v[0].n;
            k3cj_buf_put(sb, k3cj_str(&v, 0), v.v[0].n);
        } else {
            o->vn = end - i;                         /* the exact source slice */
            k3cj_buf_put(sb, s + i, end - i);
        }
        ++*n_out;
        i = skip_ws(s, n, end);
        if (i >= n) goto done;                       /* no '}' or ',' */
        char ch = s[i++];
        i = skip_ws(s, n, i);
        if (ch == '}') { r = ONE_OK; break; }        /* anything after it is ignored */
        if (ch != ',') goto done;
    }
    goto done;
bad:
    if (je.kind == K3CJ_E_DEPTH)
        *err = chat_refuse(c, "tool call arguments nested deeper than %d levels", K3CJ_MAX_DEPTH);
    else if (je.kind == K3CJ_E_NOMEM)
        *err = k3_fail(c->d, K3_ERR_NOMEM, "'%s': out of memory", c->name);
done:
    k3cj_free(&v);
    if (sb->oom && !*err) *err = k3_fail(c->d, K3_ERR_NOMEM, "'%s': out of memory", c->name);
    if (*err || r == ONE_RAW) { free(a); a = NULL; *n_out = 0; }
    *out = a;
    return r;
}

static k3_err string_arguments(chat_ctx *c, uint32_t args)
{
    const char *s = k3cj_str(&c->doc, args);
    size_t n = c->doc.v[args].n, na;
    if (!n) return K3_OK;                            /* "" renders no argument */
    k3cj_buf sb = {0};                               /* the arguments' keys and texts */
    arg_one *a;
    k3_err e;
    if (one_level(c, s, n, &sb, &a, &na, &e) == ONE_RAW) {
        if (!e) {
            chat_open(c, "json");
            chat_attr(c, "type", "object", 6);
            chat_sep(c);
            chat_text(c, s, n);                      /* the original string, byte for byte */
            chat_close(c, "json");
        }
    } else {
        for (size_t k = 0; k < na; k++)
            emit_argument(c, sb.p + a[k].key, a[k].kn, a[k].type, sb.p + a[k].val, a[k].vn);
    }
    free(a);
    free(sb.p);
    return e ? e : chat_check(c);
}

/* ------------------------------------------------------------------------ */
/* Calls (§7.2)                                                             */

k3_err chat_call_name(chat_ctx *c, size_t mi, size_t j, uint32_t call, uint32_t *fn, uint32_t *name)
{
    if (!chat_is(c, call, K3CJ_OBJ))
        return chat_refuse(c, "messages[%zu].tool_calls[%zu] is %s, not an object", mi, j, chat_type_name(c, call));
    uint32_t f = k3cj_get(&c->doc, call, "function");
    if (f && !chat_is(c, f, K3CJ_OBJ))
        return chat_refuse(c, "messages[%zu].tool_calls[%zu].function is %s, not an object", mi, j,
                           chat_type_name(c, f));
    *fn = f ? f : call;
    if (!(*name = k3cj_get(&c->doc, *fn, "name")))
        return chat_refuse(c, "messages[%zu].tool_calls[%zu]%s has no 'name'", mi, j, f ? ".function" : "");
    return K3_OK;
}

k3_err chat_tool_calls(chat_ctx *c, size_t mi, uint32_t calls)
{
    if (!chat_is(c, calls, K3CJ_ARR))
        return chat_refuse(c, "messages[%zu].tool_calls is %s: give a list of calls", mi, chat_type_name(c, calls));
    chat_open_tag(c, "tools");
    size_t j = 0;
    for (uint32_t call = k3cj_first(&c->doc, calls); call; call = k3cj_next(&c->doc, calls, call), j++) {
        uint32_t fn, name;
        k3_err e = chat_call_name(c, mi, j, call, &fn, &name);
        if (e) return e;
        char what[64];
        snprintf(what, sizeof what, "messages[%zu].tool_calls[%zu] name", mi, j);
        k3cj_buf nb = {0};                           /* str(name) */
        if ((e = chat_py_str(c, name, &nb, what))) { free(nb.p); return e; }
        chat_open(c, "call");
        chat_attr(c, "tool", nb.p, nb.n);
        chat_attr_u(c, "index", j + 1);
        chat_sep(c);
        free(nb.p);
        uint32_t args = k3cj_get(&c->doc, fn, "arguments");
        int t = args ? c->doc.v[args].type : K3CJ_NULL;
        if (t == K3CJ_OBJ) e = dict_arguments(c, args);
        else if (t == K3CJ_STR) e = string_arguments(c, args);
        else if (t != K3CJ_NULL)
            e = chat_refuse(c, "messages[%zu].tool_calls[%zu] arguments are %s: give a JSON object string or an "
                            "object", mi, j, chat_type_name(c, args));
        if (e) return e;
        chat_close(c, "call");
    }
    chat_close(c, "tools");
    return chat_check(c);
}

/* ------------------------------------------------------------------------ */
/* Re-sorting tool results (§6.5)                                           */

/* str(v) of an id into b (reset first). */
static k3_err id_text(chat_ctx *c, uint32_t v, k3cj_buf *b, const char *what)
{
    b->n = 0;
    return chat_py_str(c, v, b, what);
}

static int is_role(chat_ctx *c, uint32_t m, const char *role)
{
    uint32_t r = chat_is(c, m, K3CJ_OBJ) ? k3cj_get(&c->doc, m, "role") : 0;
    return r && k3cj_streq(&c->doc, r, role);
}

/* The 1-based position and name of the first call in `calls` whose str(id) is `id`, or 0. */
static k3_err match_call(chat_ctx *c, size_t ai, uint32_t calls, const k3cj_buf *id, size_t *pos, uint32_t *name)
{
    k3cj_buf b = {0};                                /* one call's str(id) */
    size_t j = 0;
    *pos = 0;
    for (uint32_t call = k3cj_first(&c->doc, calls); call; call = k3cj_next(&c->doc, calls, call)) {
        j++;
        if (!chat_is(c, call, K3CJ_OBJ)) continue;
        uint32_t cid = k3cj_get(&c->doc, call, "id");
        if (!cid || c->doc.v[cid].type == K3CJ_NULL) continue;
        char what[64];
        snprintf(what, sizeof what, "messages[%zu].tool_calls[%zu].id", ai, j - 1);
        k3_err e = id_text(c, cid, &b, what);
        if (e) { free(b.p); return e; }
        if (b.n == id->n && (!b.n || !memcmp(b.p, id->p, b.n))) {
            uint32_t f = k3cj_get(&c->doc, call, "function");
            uint32_t nm = chat_is(c, f, K3CJ_OBJ) ? k3cj_get(&c->doc, f, "name") : k3cj_get(&c->doc, call, "name");
            *pos = j;
            *name = nm && c->doc.v[nm].type != K3CJ_NULL ? nm : 0;
            break;
        }
    }
    free(b.p);
    return K3_OK;
}

k3_err chat_tool_order(chat_ctx *c, const uint32_t *msgs, size_t n, uint32_t *order, uint32_t *tool)
{
    uint32_t calls = 0;                              /* the last assistant's tool_calls, if a list */
    size_t ai = 0, o = 0;
    size_t *pos = malloc((n ? n : 1) * sizeof *pos); /* [n] matched call positions of a run */
    uint32_t *nm = malloc((n ? n : 1) * sizeof *nm); /* [n] their names */
    k3cj_buf id = {0};                               /* a tool message's str(tool_call_id) */
    k3_err e = K3_OK;
    if (!pos || !nm) { e = k3_fail(c->d, K3_ERR_NOMEM, "'%s': out of memory", c->name); goto out; }
    memset(tool, 0, n * sizeof *tool);
    for (size_t i = 0; i < n;) {
        uint32_t m = msgs[i];
        if (is_role(c, m, "assistant")) {
            uint32_t tc = k3cj_get(&c->doc, m, "tool_calls");
            calls = tc && k3cj_truthy(&c->doc, tc) && chat_is(c, tc, K3CJ_ARR) ? tc : 0;
            ai = i;
            order[o++] = (uint32_t)i++;
            continue;
        }
        if (!is_role(c, m, "tool")) { order[o++] = (uint32_t)i++; continue; }
        size_t j = i;
        int resolved = 1;
        for (; j < n && is_role(c, msgs[j], "tool"); j++) {
            uint32_t tid = k3cj_get(&c->doc, msgs[j], "tool_call_id");
            if (!tid) tid = k3cj_get(&c->doc, msgs[j], "id");   /* .get("tool_call_id", .get("id")) */
            pos[j] = 0;
            if (!tid || c->doc.v[tid].type == K3CJ_NULL || !calls) { resolved = 0; continue; }
            char what[64];
            snprintf(what, sizeof what, "messages[%zu].tool_call_id", j);
            if ((e = id_text(c, tid, &id, what))) goto out;
            if ((e = match_call(c, ai, calls, &id, &pos[j], &nm[j]))) goto out;
            if (!pos[j]) resolved = 0;
        }
        size_t start = o;
        for (size_t k = i; k < j; k++) order[o++] = (uint32_t)k;
        if (resolved) {
            /* stable insertion sort of the run by call position */
            for (size_t a = start + 1; a < o; a++) {
                uint32_t x = order[a];
                size_t b = a;
                while (b > start && pos[order[b - 1]] > pos[x]) { order[b] = order[b - 1]; b--; }
                order[b] = x;
            }
            for (size_t k = i; k < j; k++) tool[k] = nm[k];
        }
        i = j;
    }
out:
    free(pos);
    free(nm);
    free(id.p);
    return e;
}

/*
 * chat_impl.h - private to the chat renderer (chat_render.c, chat_tools.c,
 * chat_segs.c): the segment list being built and its helpers.
 *
 *   chat_render.c -> chat_tools.c -> chat_segs.c -> chat_json.c, tokenizer
 *
 * A segment is what the official renderer's EncodeSegment is: a control id
 * (the four markers), or a string encoded on its own, with special-token
 * recognition off (text) or on (control text: the image placeholder).
 * Empty strings make no segment. Text is kept as WTF-8 (chat_json.h) until
 * it is encoded.
 */
#ifndef K3_CHAT_IMPL_H
#define K3_CHAT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "chat_json.h"
#include "chat_render.h"

typedef struct chat_seg {
    int32_t special;         /* a marker's id, or -1 for a string */
    int control;             /* string encoded with special tokens recognised */
    size_t off, len;         /* the string: text.p[off, off + len) */
} chat_seg;

typedef struct chat_ctx {
    const k3_tok *tok;
    const char *name;        /* the request's file name, for messages */
    k3cj_doc doc;            /* the request */
    int32_t open, close, sep, eom;   /* the markers' ids */
    chat_seg *segs;          /* [n_segs] in order, cap_segs allocated */
    size_t n_segs, cap_segs;
    k3cj_buf text;           /* the strings' bytes */
    int oom;                 /* an append failed */
    int tools_declared;      /* a tool declaration was rendered (top level or dynamic) */
    size_t sys_segs;         /* segs [0, sys_segs): the tools and system messages before the first other
                                message (k3_chat_prompt.n_system), once sys_marked */
    int sys_marked;
    k3_diag *d;
} chat_ctx;

#define CHAT_IMAGE_PLACEHOLDER "<|kimi_image_placeholder|>"

/* Building blocks (§3.1). Failures set c->oom; chat_check reports them. */
void chat_special(chat_ctx *c, int32_t id);
void chat_text(chat_ctx *c, const char *s, size_t n);         /* nothing if n == 0 */
void chat_control_text(chat_ctx *c, const char *s);
void chat_open(chat_ctx *c, const char *tag);                  /* [<|open|>] "tag"; then attributes, chat_sep */
void chat_attr(chat_ctx *c, const char *key, const char *val, size_t n);   /* " key" "=\"" ESC "\"" */
void chat_attr_u(chat_ctx *c, const char *key, size_t val);
void chat_sep(chat_ctx *c);
void chat_open_tag(chat_ctx *c, const char *tag);              /* a tag without attributes */
void chat_close(chat_ctx *c, const char *tag);                 /* [<|close|>] "tag" [<|sep|>] */
void chat_end_of_msg(chat_ctx *c);
/* An internal system message: role="system" type="TYPE", one body piece (§6.6). */
void chat_internal(chat_ctx *c, const char *type, const char *body, size_t n);
k3_err chat_check(chat_ctx *c);

/* A K3_ERR_USAGE naming the request: "'NAME': <message>". */
k3_err chat_refuse(chat_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "a list", "an object", "a number", ... for messages. */
const char *chat_type_name(const chat_ctx *c, uint32_t v);
const char *chat_kind(int type);                 /* the same for a k3cj_type */
int chat_is(const chat_ctx *c, uint32_t v, int type);
/* String value v as a quoted JSON string for messages (at most 64 bytes of it). */
const char *chat_quote(const chat_ctx *c, uint32_t v, char *buf, size_t cap);
/* Python's str() of a scalar value into out (lists and objects refused, naming `what`). */
k3_err chat_py_str(chat_ctx *c, uint32_t v, k3cj_buf *out, const char *what);

/* The segments as the prompt's pieces and ids (§3.3 cuts, lone surrogates fixed). */
k3_err chat_encode(chat_ctx *c, k3_chat_prompt *out);

/* chat_tools.c */
/* The tool declaration (§7.1); dynamic: the "New Tools Available" form of a system message. */
k3_err chat_tool_declare(chat_ctx *c, uint32_t tools, int dynamic);
/* The tools channel of messages[mi] (§7.2), calls its truthy tool_calls. */
k3_err chat_tool_calls(chat_ctx *c, size_t mi, uint32_t calls);
/* A call's function object (the call itself when flat) and its name, checked; for messages[mi]. */
k3_err chat_call_name(chat_ctx *c, size_t mi, size_t j, uint32_t call, uint32_t *fn, uint32_t *name);
/*
 * §6.5: the messages' render order (order[k] = index into msgs) and, for
 * re-sorted tool results, the call name that replaces their tool (tool[i],
 * by message index; 0 = none). msgs[n] are the messages' value indices.
 */
k3_err chat_tool_order(chat_ctx *c, const uint32_t *msgs, size_t n, uint32_t *order, uint32_t *tool);

#endif

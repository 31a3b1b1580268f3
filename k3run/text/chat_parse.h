/*
 * chat_parse.h - the model's answer, parsed on token ids (CHAT-FORMAT.md §9):
 * reasoning, content and tool calls out of the ids generated after K3's
 * generation prompt, by a tolerant state machine over the four marker ids.
 *
 * Ids are fed one at a time as they are generated. `<|open|>`, `<|close|>`,
 * `<|sep|>` are the markers; `<|end_of_msg|>` and `[EOS]` end the message
 * (both looked up by name, either may be missing). Any other special id is
 * dropped; every ordinary id is text. Text between a marker and its `<|sep|>`
 * is a tag header (`NAME( KEY="VALUE")*`, values unescaped `&quot;` / `&amp;`
 * in one left-to-right pass); text in a channel is appended to it. Markers
 * spelled as ordinary BPE text are text (§9.4 e).
 *
 *   THINK    --C think S-->  BETWEEN --O response S--> RESPONSE --C response S--> BETWEEN
 *   BETWEEN  --O tools S-->  TOOLS   --O call S--> CALL --O argument S--> ARG --C argument S--> CALL
 *   CALL     --O json S-->   JSON    --C json S--> CALL --C call S--> TOOLS (the call is reported)
 *   TOOLS    --C tools S-->  BETWEEN --C message S--> CLOSED
 *
 * The tolerances of §9.4, and the few beyond it (marked +):
 *   a  a marker arriving while a header is open ends that header as if its
 *      `<|sep|>` had come (`C think O response S`); + for every header, not
 *      only `think`
 *   b  in THINK, `O response S`, `O tools S`, `C message S`, `C response S`
 *      close the think channel and act as in BETWEEN
 *   c  truncated inside think: everything is reasoning, content is empty
 *   d  in RESPONSE, `C message S` ends the response and the message
 *   +  in RESPONSE, `O tools S` ends the response and opens the tools
 *      channel; in TOOLS, `C message S` ends the tools channel and the message
 *   e  a marker spelled as text stays text (the parser sees only ids)
 *   f  a tools channel when no tools were declared: parsed (its text never
 *      reaches the content) and its calls dropped, like sglang; or kept, by
 *      k3_chat_parser_keep_undeclared()
 *   g  at the length limit (k3_chat_parser_finish) the complete calls are
 *      kept and an incomplete one is dropped
 *   +  a header of more than K3_CHAT_HEADER_MAX bytes is not a header: its
 *      bytes are text of the current state (a stray marker cannot swallow a
 *      channel); at the end an unfinished header is dropped
 * Any other header that does not fit the state is ignored, the state kept.
 *
 * Streaming: cb->text gets the bytes of each text id as soon as they are
 * known to be reasoning or content (a header is never text, so nothing waits
 * but a header's own bytes). The bytes are raw: a token may end inside a
 * UTF-8 character, and completing it is the caller's job (k3_utf8_out).
 * cb->call gets a call when its `C call S` arrives. The parser also keeps all
 * of it, for k3_chat_message_json at the end.
 *
 * Arguments (§9.3) become one JSON object text: a `type="string"` value is
 * JSON-encoded as a string of its raw bytes; number, boolean, null, object
 * and array values are inserted as they are when they are valid (RFC 8259)
 * JSON of that type, else as strings; another or no type is a string. A json
 * block is the arguments byte for byte. A call without arguments gets "{}".
 */
#ifndef K3_CHAT_PARSE_H
#define K3_CHAT_PARSE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "k3_error.h"
#include "tokenizer.h"

#define K3_CHAT_HEADER_MAX 4096   /* bytes of one tag header at most */

typedef enum { K3_CHAT_REASONING = 0, K3_CHAT_CONTENT = 1 } k3_chat_channel;

typedef struct k3_chat_call {
    char *name;                   /* the unescaped `tool` attribute; NUL-terminated, malloc'd */
    char *arguments;              /* a JSON text (an object unless a json block said otherwise); ditto */
} k3_chat_call;

typedef struct k3_chat_parse_cb {
    void (*text)(void *ctx, k3_chat_channel ch, const uint8_t *b, size_t n);   /* or NULL */
    void (*call)(void *ctx, const k3_chat_call *c, size_t index);              /* index from 0; or NULL */
    void *ctx;
} k3_chat_parse_cb;

/* A growable byte string: b[0..n) used, b[n] == 0 whenever b != NULL, cap bytes allocated. */
typedef struct k3_chat_buf {
    uint8_t *b;                   /* [cap] */
    size_t n, cap;
} k3_chat_buf;

/* The parser. Its fields are private: use the functions below. */
typedef struct k3_chat_parser {
    const k3_tok *tok;
    int32_t id_open, id_close, id_sep, id_eom, id_eos;   /* the markers; eom/eos -1 when missing */
    int state;                    /* PS_* of chat_parse.c */
    int started_think;            /* the start state was THINK */
    int tools_declared, keep_undeclared;
    int hdr;                      /* 0: no header open; else the marker id that opened it */
    int done;                     /* a stop id came, or k3_chat_parser_finish ran */
    k3_err status;                /* K3_OK, or K3_ERR_NOMEM once an allocation failed */
    k3_chat_buf header;           /* the open header's bytes */
    k3_chat_buf reasoning, content;
    /* the call being read */
    int in_call, call_reported;   /* a call is open; it will be reported (tools declared or kept) */
    char *call_name;              /* NUL-terminated, malloc'd */
    k3_chat_buf call_args;        /* the arguments object so far: "{" "KEY":VALUE ("," ...)* */
    k3_chat_buf call_json;        /* the raw json block(s) */
    int call_has_json;
    k3_chat_buf arg_key, arg_type, arg_value;   /* the argument being read */
    /* the complete calls */
    k3_chat_call *calls;          /* [cap_calls], n_calls used */
    size_t n_calls, cap_calls;
    size_t n_dropped;             /* calls dropped: undeclared (f) or incomplete (g) */
} k3_chat_parser;

/*
 * Start a parser for the ids after the generation prompt: thinking != 0
 * starts in THINK, else in RESPONSE. A tokenizer without `<|open|>`,
 * `<|close|>` or `<|sep|>` is K3_ERR_FORMAT. tok must outlive the parser.
 */
k3_err k3_chat_parser_init(k3_chat_parser *p, const k3_tok *tok, int thinking, int tools_declared,
                           k3_diag *d);
/* §9.4 f: keep (1) or drop (0, the default) the calls of undeclared tools. */
void k3_chat_parser_keep_undeclared(k3_chat_parser *p, int keep);
/*
 * Feed one generated id. Returns 1 when the message has ended (this id is
 * `<|end_of_msg|>` or `[EOS]`, which is not text; later ids are ignored),
 * 0 to go on, -1 when out of memory (the parser stops; status K3_ERR_NOMEM).
 * cb may be NULL.
 */
int k3_chat_parser_feed(k3_chat_parser *p, int32_t id, const k3_chat_parse_cb *cb);
/* The end (a stop, the length limit, an interruption): drops an unfinished header and call. */
void k3_chat_parser_finish(k3_chat_parser *p, const k3_chat_parse_cb *cb);
void k3_chat_parser_free(k3_chat_parser *p);

int k3_chat_parser_in_think(const k3_chat_parser *p);      /* text now would be reasoning */
int k3_chat_parser_in_response(const k3_chat_parser *p);   /* text now would be content */
int k3_chat_parser_in_header(const k3_chat_parser *p);     /* a marker came, its `<|sep|>` not yet */
int k3_chat_parser_done(const k3_chat_parser *p);
k3_err k3_chat_parser_status(const k3_chat_parser *p);

/* All of it so far (NUL-terminated; *n bytes, which may hold NULs and invalid UTF-8). */
const uint8_t *k3_chat_parser_reasoning(const k3_chat_parser *p, size_t *n);
const uint8_t *k3_chat_parser_content(const k3_chat_parser *p, size_t *n);
size_t k3_chat_parser_n_calls(const k3_chat_parser *p);
const k3_chat_call *k3_chat_parser_call(const k3_chat_parser *p, size_t i);
size_t k3_chat_parser_n_dropped(const k3_chat_parser *p);

/*
 * The OpenAI assistant message (chat_parse_message.c):
 *   {"role":"assistant","content":C,"reasoning_content":R,"tool_calls":[...]}
 * C is the content string, or null when it is empty and there are calls.
 * R is the reasoning string; null when the parser started in RESPONSE and no
 * reasoning came. tool_calls is left out without calls; each entry is
 * {"id":"<id_prefix>N","type":"function","function":{"name":..,"arguments":..}}
 * with N = 1, 2, ... and id_prefix "call_" when NULL. Strings are JSON-escaped
 * (`"` `\` and U+0000-001F; raw UTF-8 otherwise), an invalid UTF-8 byte
 * becomes U+FFFD. *out is malloc'd and NUL-terminated, *len its length (len
 * may be NULL).
 */
k3_err k3_chat_message_json(const k3_chat_parser *p, const char *id_prefix, char **out, size_t *len,
                            k3_diag *d);
k3_err k3_chat_message_write(const k3_chat_parser *p, const char *id_prefix, FILE *f, k3_diag *d);

#endif

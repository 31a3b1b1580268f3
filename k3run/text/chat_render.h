/*
 * chat_render.h - render an OpenAI-style chat request into Kimi K3's prompt
 * ids, exactly as the official renderer (encoding_k3.py + tokenization_kimi.py)
 * does: shared/spec/CHAT-FORMAT.md §3-§8, docs/k3run-chat-format.md.
 *
 * The prompt is a list of pieces, each encoded on its own: a control id
 * (<|open|>, <|close|>, <|sep|>, <|end_of_msg|>), or a text piece BPE'd with
 * special-token recognition off (client text that spells <|open|> stays
 * text), cut at 400,000 code points and at 25,000-long runs (§3.3).
 */
#ifndef K3_CHAT_RENDER_H
#define K3_CHAT_RENDER_H

#include <stddef.h>
#include <stdint.h>

#include "k3_error.h"
#include "tokenizer.h"

typedef struct k3_chat_piece {
    int32_t special;         /* control id, or -1 for a text piece */
    uint32_t off, len;       /* text bytes in the prompt's arena (0, 0 for a control id) */
    uint32_t id0, id1;       /* its ids are ids[id0..id1) */
} k3_chat_piece;

typedef struct k3_chat_prompt {
    int32_t *ids;            /* [n_ids] the prompt */
    size_t n_ids;
    k3_chat_piece *pieces;   /* [n_pieces] in order; their ids concatenate to ids */
    size_t n_pieces;
    char *arena;             /* text pieces' bytes, UTF-8 (lone surrogates already U+FFFD) */
    int thinking;            /* effective: 1 if thinking on (generation prompt opens think), 0 off */
    int add_generation_prompt;
    int tools_declared;      /* the prompt declares tools (the answer's parser keeps their calls) */
    size_t n_system;         /* ids [0, n_system): the tools and system messages before the first other
                                message, the part many conversations share (0: none) */
} k3_chat_prompt;

/*
 * Render the request json[0..len) (a JSON object: messages, tools,
 * tool_choice, response_format, reasoning_effort, thinking, options; see
 * docs/k3run-chat-format.md). name is the request's file name for messages.
 * Errors: K3_ERR_FORMAT for text that is not JSON (byte offset named),
 * K3_ERR_USAGE for a request the official renderer refuses (message index and
 * field named), K3_ERR_UNSUPPORTED for a tokenizer without K3's control
 * tokens, K3_ERR_NOMEM. On failure *out is empty (free is still safe).
 */
k3_err k3_chat_render(const k3_tok *tok, const char *json, size_t len, const char *name, k3_chat_prompt *out,
                      k3_diag *d);
void k3_chat_prompt_free(k3_chat_prompt *p);

#endif

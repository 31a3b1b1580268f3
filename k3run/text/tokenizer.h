/*
 * tokenizer.h - Kimi's tiktoken tokenizer (spec K3-ARCHITECTURE.md §6):
 * byte-level BPE over `tiktoken.model` ranks, Kimi's split pattern through
 * PCRE2, special tokens from `tokenizer_config.json`. No BOS is added.
 *
 * Ids 0 .. n_ranks-1 are BPE ranks; n_ranks .. n_ranks+255 are the reserved
 * special ids (named from added_tokens_decoder, else "<|reserved_token_ID|>").
 */
#ifndef K3_TOKENIZER_H
#define K3_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "k3_error.h"

typedef struct k3_tok k3_tok;

/*
 * Load from two files (tiktoken.model, tokenizer_config.json). config_path
 * may be NULL: then no special id is named (all are <|reserved_token_ID|>).
 * Every added_tokens_decoder entry names a special id, whatever its "special"
 * flag says (as Kimi's tokenizer and the Python reference do). Errors name the
 * file and, for tiktoken.model, the line.
 */
k3_err k3_tok_load(const char *tiktoken_path, const char *config_path, k3_tok **out, k3_diag *d);
/* Load DIR/tiktoken.model and DIR/tokenizer_config.json (a checkpoint or a pack). */
k3_err k3_tok_load_dir(const char *dir, k3_tok **out, k3_diag *d);
void k3_tok_free(k3_tok *t);

uint32_t k3_tok_n_ranks(const k3_tok *t);
uint32_t k3_tok_n_ids(const k3_tok *t);          /* n_ranks + 256 */

/*
 * Encode len bytes of text (any bytes: invalid UTF-8 and NUL included) and
 * append the ids to *ids (a malloc'd array the function grows; *n is its
 * length, *cap its capacity; all three may start at NULL/0/0). special != 0:
 * special-token strings in the text become their ids; 0: they are ordinary text.
 */
k3_err k3_tok_encode(const k3_tok *t, const char *text, size_t len, int special,
                     int32_t **ids, size_t *n, size_t *cap, k3_diag *d);

/* The bytes of one id (a special id gives its name's UTF-8); NULL if out of range. */
const uint8_t *k3_tok_bytes(const k3_tok *t, int32_t id, size_t *len);
int k3_tok_is_special(const k3_tok *t, int32_t id);
/* The id of a special token by name ("<|end_of_msg|>"), or -1. */
int32_t k3_tok_special_id(const k3_tok *t, const char *name);

/*
 * The pieces k3_tok_encode works on, in order (for tests and debugging):
 * fn gets every pre-token of the split pattern (K3_TOK_PIECE_TEXT, id -1),
 * every special recognised in the text (K3_TOK_PIECE_SPECIAL, its id), and
 * every byte that is not part of valid UTF-8 (K3_TOK_PIECE_BYTE, id -1,
 * len 1). The pieces concatenate to the text. A nonzero return from fn stops
 * the walk and is returned (fn fills d).
 */
enum { K3_TOK_PIECE_TEXT = 0, K3_TOK_PIECE_SPECIAL = 1, K3_TOK_PIECE_BYTE = 2 };
typedef k3_err (*k3_tok_piece_fn)(void *ctx, int kind, const char *s, size_t len, int32_t id,
                                  k3_diag *d);
k3_err k3_tok_split(const k3_tok *t, const char *text, size_t len, int special,
                    k3_tok_piece_fn fn, void *ctx, k3_diag *d);

/* The split pattern as compiled with PCRE2 (UTF, UCP; see docs/k3run-tokenizer.md). */
const char *k3_tok_split_pattern(void);

#endif

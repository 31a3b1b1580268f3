/*
 * chat.h - chat turns over one model: a conversation (an OpenAI chat request,
 * JSON) is rendered in K3's format (text/chat_render.h), only the tokens the
 * model does not already hold are processed (the prompt cache), the answer
 * is generated and parsed on ids (text/chat_parse.h) into reasoning, content
 * and tool calls, streamed through callbacks as it comes.
 *
 * The prompt cache: the chat keeps the ids the model has processed. A turn's
 * rendered prompt shares a prefix with them; the model goes back to the
 * longest shared prefix it can reach (its own position when the history is
 * unchanged, else the latest snapshot at or before the divergence, else the
 * start) and processes the rest. Snapshots are taken at the end of each
 * turn's prompt, the last `snapshots` kept. Processing in any split gives the
 * same bits (model.h), so a cached turn computes exactly what rendering the
 * whole conversation from nothing computes.
 */
#ifndef K3_CHAT_H
#define K3_CHAT_H

#include <signal.h>
#include <stdint.h>

#include "decode.h"
#include "engine.h"
#include "text.h"

typedef struct k3_chat k3_chat;

typedef struct k3_chat_opts {
    uint32_t n_predict;            /* answer tokens at most (forced markup included) */
    uint32_t think_budget;         /* after this many reasoning tokens close the think channel; 0: no limit */
    const char *const *stops;      /* [n_stops] stop strings for the answer */
    int n_stops;
    /* called once the prompt is processed, before the first answer token: the state a fork
       (k3_chat_fork) copies to answer the same prompt again elsewhere; NULL: none */
    void (*on_prompt)(void *ctx, k3_chat *c);
    void *on_prompt_ctx;
} k3_chat_opts;

typedef struct k3_chat_stats {
    uint32_t prompt_tokens;        /* the rendered prompt */
    uint32_t cached_tokens;        /* of it, already held by the model */
    uint32_t completion_tokens;    /* generated (and forced) tokens */
    uint32_t reasoning_tokens;     /* of them, in the think channel */
    double t_first;                /* seconds from the turn's start to its first answer token */
    double t_prompt, t_gen;        /* processing the prompt; generating */
    const char *finish;            /* "stop", "length", "tool_calls", "interrupted" */
    int stop_index;                /* the stop string (k3_chat_opts.stops) that ended the answer, or -1 */
    int think_closed;              /* the think budget closed the think channel */
    k3_dec_stats dec;              /* the answer's passes, drafted and accepted tokens (decode.h) */
} k3_chat_stats;

/* What a turn streams. text: new answer bytes of a channel (reasoning 0, content 1), raw
   (the caller completes UTF-8); call: one complete tool call as JSON ({"name", "arguments"}). */
typedef struct k3_chat_sink {
    void (*text)(void *ctx, int channel, const uint8_t *b, size_t n);
    void (*call)(void *ctx, const char *name, const char *arguments);
    void *ctx;
} k3_chat_sink;


k3_err k3_chat_new(k3_model *m, const k3_tok *tok, const k3_sampler_opts *so, uint32_t snapshots, k3_chat **out,
                   k3_diag *d);
void k3_chat_free(k3_chat *c);
/* Speculative decoding for the answers (decode.h): at most max_draft drafted tokens per pass
   (0: off, the default), the draft-length rule's rho (k3_dec_rho). */
void k3_chat_set_draft(k3_chat *c, uint32_t max_draft, double rho);
/* The sampler's options for the next turns, its PRNG seeded afresh from so->seed (a request of
   the server: the same request and seed give the same answer as a fresh `k3run chat`). */
k3_err k3_chat_set_sampler(k3_chat *c, const k3_sampler_opts *so, k3_diag *d);
/* Forget everything the model holds (a new conversation). */
void k3_chat_reset(k3_chat *c);

/*
 * One turn: render request (JSON text), bring the model to it, generate the assistant's
 * message. *message receives it as a JSON object text ({"role":"assistant","content",
 * "reasoning_content","tool_calls"}; malloc'd), ready to append to the conversation.
 * A refused request is K3_ERR_USAGE before anything is processed.
 * Tests only: with K3_TEST_ANSWER set, its text (special tokens recognised) is the answer instead
 * of the model's tokens, parsed and processed as they would be (tests/serve: tool calls).
 */
k3_err k3_chat_turn(k3_chat *c, const char *request, size_t len, const k3_chat_opts *o, const k3_chat_sink *sink,
                    volatile sig_atomic_t *stop, char **message, k3_chat_stats *st, k3_diag *d);

/*
 * A raw completion over the same model and prompt cache: prompt ids[0..n) as they are (no chat
 * format), then up to o->n_predict tokens, ending at eos (>= 0; not shown) or a stop string.
 * The text streams through sink->text on channel 1; *text receives all of it (malloc'd, raw
 * bytes, *text_len long). st->finish is "stop", "length" or "interrupted".
 */
k3_err k3_chat_complete(k3_chat *c, const int32_t *ids, uint32_t n, int64_t eos, const k3_chat_opts *o,
                        const k3_chat_sink *sink, volatile sig_atomic_t *stop, char **text, size_t *text_len,
                        k3_chat_stats *st, k3_diag *d);

/* The ids the model holds (its position), and the sampler (for session files). */
const int32_t *k3_chat_held(const k3_chat *c, uint32_t *n);
k3_sampler *k3_chat_sampler(k3_chat *c);
/* A fork: dst (a chat over another sequence of the same model) holds what src holds, state and
   ids, with a snapshot there, so a turn of dst on src's last prompt processes nothing and answers
   what src would; on failure dst holds nothing. Neither may be in a model call (src's on_prompt is
   such a moment). */
k3_err k3_chat_fork(k3_chat *dst, const k3_chat *src, k3_diag *d);
/* After a session was loaded into the model: hold these ids (the first k3_model_pos of them). */
k3_err k3_chat_adopt(k3_chat *c, const int32_t *ids, uint32_t n, k3_diag *d);

/*
 * The shared prefix (k3run serve, k3run batch). A chat that keeps one (one more snapshot) takes a
 * snapshot where a turn's tools and system messages end (k3_chat_prompt.n_system), and goes back
 * to it when a later conversation begins with the same ones. Another chat over another sequence of
 * the same model can take it (many conversations with one system prompt process it once):
 * k3_chat_prefix_for says how many of prompt p[0..n)'s ids src's prefix covers (0: none);
 * k3_chat_take_prefix makes dst hold them, state and ids (*taken of them; 0: src no longer had
 * it), from any thread while src's own thread goes on (its prefix and the cache rows below it are
 * kept under a lock until its model goes below them). dst in no model call; on failure dst holds
 * nothing. The state taken is the one src computed, so dst's next bits are those it would compute.
 */
k3_err k3_chat_keep_prefix(k3_chat *c, k3_diag *d);
uint32_t k3_chat_prefix_for(k3_chat *src, const int32_t *p, uint32_t n);
/* How many of p[0..n)'s ids c would start from (its held ids, or a kept state) rather than
   process: the cached_tokens a turn on it would report. Only while no thread moves c. */
uint32_t k3_chat_cached_for(const k3_chat *c, const int32_t *p, uint32_t n);
k3_err k3_chat_take_prefix(k3_chat *dst, k3_chat *src, const int32_t *p, uint32_t n, uint32_t *taken, k3_diag *d);

#endif

/*
 * serve_impl.h - `k3run serve`, the OpenAI-compatible HTTP server
 * (docs/k3run-serve.md): private to serve_*.c (main.c sees serve_cli.h).
 *
 * Threads: libmicrohttpd runs one thread per connection (serve_http.c): it
 * reads the request, checks it (serve_api.c: fields, then K3's renderer, so a
 * refused request is a 400 before it waits for anything) and queues a job.
 * Generation runs in slots (serve_cli.c), each a thread with its own chat
 * (chat.h: its own prompt cache) over its own sequence of the model: a slot
 * takes a job and runs it to its end. With one slot (the default) the main
 * thread is that slot. With --parallel S, S slot threads run their jobs
 * together: their model calls wait in a batcher (engine batch.h) and the main
 * thread runs each pass for all of them, so each answer is the bytes it gets
 * alone. A queued job goes to the free slot that holds its conversation, else
 * an empty one, else the one sharing the longest prefix with its prompt
 * (serve_cli.c "mine": the prompt cache across conversations). A job's output (the response body, or the
 * server-sent events of a stream) goes through the job's buffer under the
 * server's lock, from which the connection's thread sends it. A signal thread
 * turns SIGTERM and SIGINT into a shutdown: the listener closes, the answer
 * being generated is stopped within a token and finished properly, queued
 * requests get 503, and the process exits 0 once every response went out.
 */
#ifndef K3_SERVE_IMPL_H
#define K3_SERVE_IMPL_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>

#include <jansson.h>
#include <microhttpd.h>

#include "chat.h"
#include "cli_args.h"
#include "decode.h"
#include "k3_opts.h"
#include "load.h"

#include "serve_cli.h"

#define SRV_FLUSH_MS 20
/* A stream that sends nothing for this long (waiting in the queue, or a long prompt being processed:
   minutes on real K3) gets its API's keep-alive, so that clients and proxies that time out a silent connection
   keep it (K3_TEST_KEEPALIVE_MS shortens it for the tests). */
#define SRV_KEEPALIVE_S 15
#define K3_SERVE_SLOTS_MAX 64      /* --parallel at most */
#define SRV_N_MAX 16               /* a request's n (choices) at most */            /* a stream's events wait at most this long to go out */

/* A growing byte buffer. */
typedef struct srv_buf {
    char *p;                       /* [cap] bytes, p[0 .. n) used */
    size_t n, cap;
} srv_buf;
int srv_buf_add(srv_buf *b, const void *s, size_t n);   /* 0, or -1 when out of memory */

typedef enum { SRV_CHAT, SRV_COMPLETION } srv_kind;
struct srv_api_ops;
typedef enum { SRV_QUEUED, SRV_RUNNING, SRV_DONE } srv_state;

/* UTF-8 completion of one channel's stream of bytes (a character split across tokens is sent whole). */
typedef struct srv_utf8 {
    uint8_t pend[4];
    int np;
} srv_utf8;

typedef struct srv_job {
    /* the request, fixed once queued */
    srv_kind kind;
    char *body;                    /* chat: the request JSON as the client sent it (the renderer's input) */
    size_t body_len;
    int32_t *ids;                  /* completion: [n_ids] the prompt's ids */
    uint32_t n_ids;
    int32_t *route;                /* chat: [n_route] the rendered prompt's ids (to choose a slot; NULL: none) */
    uint32_t n_route;
    uint32_t prompt_tokens;        /* the rendered prompt's length (checked against the context) */
    k3_chat_opts co;
    char **stops;                  /* [n_stops] owned */
    k3_sampler_opts so;
    int stream, include_usage;
    int n_choices;                 /* n: choices generated from one processed prompt (side by side in idle slots) */
    char id[48];                   /* "chatcmpl-..." / "cmpl-..." */
    long long created;
    char *model;                   /* the name the response carries */
    void *tag;                     /* the caller's (k3run batch: the request's line) */
    const struct srv_api_ops *api; /* the API whose shape the answer takes (never NULL) */
    void *api_state;               /* that API's own (api->free_state frees it) */
    /* shared, under srv.mu */
    srv_state state;
    int refs;                      /* the connection's thread and (once queued) the generation thread */
    volatile sig_atomic_t cancel;  /* the client went away, or the server stops */
    srv_buf out;                   /* stream: events not yet sent (from `sent`); else the whole body */
    double last_wake;              /* when the connection's thread was last woken for new output */
    double t_out;                  /* stream: when its output last grew, or it was queued (0: neither) */
    size_t sent;
    int status;                    /* HTTP status of the body (non-stream) */
    /* n > 1: choices in other slots, forked from the first's processed prompt (serve_api.c) */
    int next_choice;               /* the next choice not yet taken */
    int helpers;                   /* slots running a choice of it */
    struct srv_fork *fork;         /* [n_choices] what each choice run by a helper gave */
} srv_job;

#define SRV_N_ENDPOINTS 9
extern const char *const srv_endpoint_names[SRV_N_ENDPOINTS];   /* chat_completions, completions, models, health,
                                                                   metrics, page, messages, count_tokens, responses */
typedef struct srv_metrics {
    uint64_t requests[SRV_N_ENDPOINTS];   /* by endpoint: srv_endpoint_names */
    uint64_t errors[600];          /* by HTTP status */
    uint64_t prompt_tokens, cached_tokens, completion_tokens;
    double gen_seconds;            /* generating (to compute tokens per second) */
    uint64_t expert_hits, expert_misses, bytes_read;
    uint64_t rejected_busy;
    uint64_t refused_conns;        /* connections over --max-conns or --max-conns-per-ip (answered 503) */
    uint64_t timed_out_conns;      /* connections closed because their request had not arrived in time */
    uint64_t damage_errors;        /* requests failed by a weight that failed its hash or its read */
} srv_metrics;

typedef struct srv_sock srv_sock;  /* a client connection (serve_door.c) */

struct srv;

/* A slot: one conversation generated at a time over its own sequence of the model. */
typedef struct srv_slot {
    struct srv *s;
    uint32_t idx;
    k3_model *h;                   /* its sequence (k3_model_seq) */
    k3_chat *chat;                 /* its prompt cache */
    pthread_t th;                  /* --parallel: its thread */
    /* under srv.mu */
    srv_job *job;                  /* running, or NULL */
    int idle;                      /* waiting for a job */
    int help;                      /* taken to run choice help_choice of job (n > 1), 2: its state is forked */
    int help_choice;
    uint32_t used;                 /* when it last took a job (srv.uses) */
    uint64_t tokens;               /* completion tokens generated */
    double busy_s;                 /* seconds spent on jobs */
} srv_slot;

typedef struct srv {
    /* settings */
    const char *pack, *host, *api_key, *model_name;
    char *api_key_owned;           /* --api-key-file's key (api_key points at it) */
    uint16_t port;
    unsigned queue_max;            /* waiting jobs at most (the running one not counted) */
    unsigned timeout_s;            /* a request's whole body must arrive within this */
    size_t max_body;
    k3_chat_opts co;               /* defaults of a request */
    k3_sampler_opts so;
    const char *so_from;           /* where so's defaults came from: "generation_config.json" or "k3" */
    uint32_t threads;
    k3_load_opts lo;
    /* the model */
    k3_tok *tok;
    k3_loaded ld;
    uint32_t n_slots;              /* --parallel */
    uint32_t snapshots;            /* --snapshots: each slot's chat keeps them (and a shared prefix when > 0) */
    srv_slot *slots;               /* [n_slots] */
    k3_batcher *bat;               /* n_slots > 1: the passes they share */
    k3_weights_stats w_base;       /* the weights' counters once loaded (/metrics with several slots) */
    int64_t eos;
    uint32_t context;              /* positions a conversation may use (the model's) */
    double t_load;
    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_job **queue;               /* [ring] the jobs not yet taken, from q_head */
    unsigned ring;                 /* queue_max + 1 */
    unsigned q_head, q_n;
    unsigned running;              /* slots with a job */
    uint32_t uses;                 /* jobs taken by slots */
    unsigned slots_alive;          /* --parallel: slot threads not yet ended */
    int stopping;
    int drain;                     /* k3run batch: a slot ends when the queue is empty */
    void (*on_done)(struct srv *s, srv_job *j);   /* k3run batch: a job ran (in its slot's thread, mu not held) */
    void *user;
    unsigned active;               /* connections with a response not yet finished */
    srv_metrics mt;
    char damage[K3_DIAG_MAX];      /* the last read of the pack that failed ("": none) */
    struct MHD_Daemon *mhd;
    /* the connections (serve_door.c), under mu */
    unsigned max_conns, max_conns_per_ip;   /* --max-conns, --max-conns-per-ip */
    unsigned header_timeout_s;     /* a request's headers must arrive within this */
    double keepalive_s;            /* a stream silent this long gets its API's keep-alive (SRV_KEEPALIVE_S) */
    char *tls_cert, *tls_key;      /* --tls-cert, --tls-key: the PEM files' contents (NULL: plain HTTP) */
    srv_sock *socks;               /* every open connection */
    unsigned n_socks;
    pthread_t door_th;             /* the waker */
    int door_on, door_stop;
} srv;

/* The options of the generation, the same in k3run serve and k3run batch (serve_slots.c parses
   them); each tool's own options follow SRV_OPT__END. */
enum {
    SRV_OPT_MODEL = K3_OPT_USER, SRV_OPT_PARALLEL, SRV_OPT_N, SRV_OPT_THINK_BUDGET, SRV_OPT_CONTEXT, SRV_OPT_BATCH,
    SRV_OPT_BUDGET, SRV_OPT_PRESET, SRV_OPT_THREADS, SRV_OPT_TEMP, SRV_OPT_TOPK, SRV_OPT_TOPP, SRV_OPT_MINP,
    SRV_OPT_REPEAT, SRV_OPT_SEED, SRV_OPT_SNAPSHOTS, SRV_OPT_DRAFT, SRV_OPT_NO_VERIFY_READS, SRV_OPT_VERIFY,
    SRV_OPT_NAME, SRV_OPT__END
};
#define SRV_GEN_OPTS \
    {SRV_OPT_MODEL, 'm', "model", "PACK", NULL, "K3_MODEL", "the pack directory (made by k3pack)"}, \
    {SRV_OPT_PARALLEL, 0, "parallel", "S", "1", NULL, \
    "answers generated together, sharing each forward pass (each one's bytes are what it gets alone)"}, \
    {SRV_OPT_N, 'n', "n-predict", "N", "1024", NULL, "tokens per answer when a request gives no max_tokens"}, \
    {SRV_OPT_THINK_BUDGET, 0, "think-budget", "N", "0 (none)", NULL, \
    "after N reasoning tokens close the think channel and let the model answer"}, \
    {SRV_OPT_CONTEXT, 'c', "context", "N", "4096", NULL, "positions the model holds (a whole conversation)"}, \
    {SRV_OPT_BATCH, 'b', "batch", "auto|N", "auto", NULL, \
    "prompt tokens per forward pass (auto: the planner chooses for the budget and -n)"}, \
    {SRV_OPT_BUDGET, 'B', "budget", "SIZE", "what the machine allows", "K3_BUDGET", "memory to use (8G, 512M, ...)"}, \
    {SRV_OPT_PRESET, 0, "preset", "NAME", NULL, NULL, "a named budget: laptop (8G), workstation (128G), server (224G)"}, \
    {SRV_OPT_THREADS, 't', "threads", "N", "all CPUs", "K3_THREADS", "compute threads"}, \
    {SRV_OPT_TEMP, 0, "temp", "T", "the pack's generation_config.json, else 1.0", NULL, \
    "temperature when a request gives none (0: greedy)"}, \
    {SRV_OPT_TOPK, 0, "top-k", "K", "generation_config.json, else 0 (off)", NULL, "top_k when a request gives none"}, \
    {SRV_OPT_TOPP, 0, "top-p", "P", "generation_config.json, else 0.95", NULL, "top_p when a request gives none"}, \
    {SRV_OPT_MINP, 0, "min-p", "P", "generation_config.json, else 0 (off)", NULL, "min_p when a request gives none"}, \
    {SRV_OPT_REPEAT, 0, "repeat-penalty", "R", "generation_config.json, else 1 (off)", NULL, \
    "repeat_penalty when a request gives none"}, \
    {SRV_OPT_SEED, 's', "seed", "S", "0", NULL, "seed when a request gives none: same request, same answer"}, \
    {SRV_OPT_SNAPSHOTS, 0, "snapshots", "N", "2", NULL, \
    "state snapshots each slot keeps, to serve a conversation that went back from the prompt cache; with N > 0 " \
    "one more holds the state after the last prompt's tools and system messages, which later conversations " \
    "(in any slot) that begin with them take instead of processing them again (0: none at all)"}, \
    {SRV_OPT_DRAFT, 0, "draft", "N", K3_DRAFT_DEFAULT_STR, NULL, \
    "speculative decoding: verify up to N tokens drafted from the conversation per pass (0: off); same answers"}, \
    {SRV_OPT_NO_VERIFY_READS, 0, "no-verify-reads", NULL, NULL, NULL, "do not check each tensor's XXH3-64 as it is read"}, \
    {SRV_OPT_VERIFY, 0, "verify", NULL, NULL, NULL, "run k3verify's full check of the pack before loading it"}, \
    {SRV_OPT_NAME, 0, "name", "NAME", "the pack's directory name", NULL, "the model's name in the answers"}

/* A job being run: the choice being generated (serve_api.c). */
typedef struct run_ctx {
    srv *s;
    srv_job *j;
    int index;                     /* the choice being generated */
    json_t *acc;                   /* the API's own: what the answer gathers (OpenAI: the choices) */
    srv_utf8 u8[2];                /* the choice's stream: reasoning, content */
    int n_calls;                   /* the choice's tool calls so far */
} run_ctx;

/*
 * One API's shape of requests and answers. The OpenAI API is serve_api.c's (srv_api_openai);
 * /v1/messages (Anthropic) is serve_messages.c's, /v1/responses (OpenAI Responses)
 * serve_responses.c's. Each of those turns its request into the chat-completions request K3's
 * renderer reads (to_chat), so there is one renderer and one parser underneath, and the
 * generation's events into its own answer. Output goes through srv_put / srv_put_json /
 * srv_put_event; everything runs on the slot's thread, in order: begin, then per choice (one
 * unless n > 1) start, text and call events (streams only) and choice, then end; or fail
 * instead of what is left.
 */
typedef struct srv_api_ops {
    const char *name;              /* "openai", "messages", "responses" */
    /* The request body into a chat-completions body (*chat malloc'd, *chat_len bytes) and the API's
       state (*state, may stay NULL); else an HTTP status and msg[cap]. NULL: the body is one already. */
    int (*to_chat)(srv *s, const char *body, size_t len, char **chat, size_t *chat_len, void **state, char *msg,
                   size_t cap);
    void (*adjust)(srv_job *j);                                /* may be NULL: set what the chat request cannot say
                                                                  (j->co.think_budget, ...) from j->api_state */
    void (*begin)(run_ctx *r);                                 /* before the first choice (streams' opening events) */
    void (*start)(run_ctx *r);                                 /* a choice begins (r->index) */
    void (*text)(run_ctx *r, int channel, const char *t);      /* stream: whole UTF-8 text of reasoning (0) or content (1) */
    void (*call)(run_ctx *r, int i, const char *name, const char *arguments);   /* stream: tool call i, complete */
    /* a choice ended: its stats (finish, stop_index) and, for chat, the assistant message as JSON text */
    void (*choice)(run_ctx *r, const k3_chat_stats *st, const char *message, const char *text, size_t text_len);
    /* the answer is complete: the body (j->status set), or the stream's last events; all: the request's figures,
       k3: k3's own figures (stolen) */
    void (*end)(run_ctx *r, const k3_chat_stats *all, json_t *k3);
    void (*fail)(run_ctx *r, int status, const char *msg);    /* the answer failed after it was accepted */
    char *(*error_json)(int status, const char *msg);          /* an error body in this API's shape (malloc'd) */
    const char *keepalive;                                     /* a stream's keep-alive: an SSE comment, or the
                                                                  API's own ping event */
    void (*free_state)(void *state);
} srv_api_ops;

extern const srv_api_ops srv_api_openai;
extern const srv_api_ops srv_api_messages;    /* serve_messages.c */
extern const srv_api_ops srv_api_responses;   /* serve_responses.c */

/* POST /v1/messages/count_tokens (serve_messages.c): {"input_tokens": N} (malloc'd), or NULL with
   *status and msg[cap] (a status of 0: out of memory). */
char *srv_messages_count_tokens(srv *s, const char *body, size_t len, int *status, char *msg, size_t cap);

/* GET /v1/responses/{id} (del 0: the stored Response) and DELETE (del 1) (serve_responses.c): the body
   (malloc'd), or NULL with *status and msg[cap]. */
char *srv_responses_get(const char *id, int del, int *status, char *msg, size_t cap);

/* Output of a job, for its connection to send (serve_api.c). */
void srv_put(srv *s, srv_job *j, const char *text, int event);        /* event: as "data: TEXT" */
void srv_put_json(srv *s, srv_job *j, json_t *doc);                   /* stolen; an event if j->stream */
void srv_put_event(srv *s, srv_job *j, const char *name, json_t *doc);   /* "event: NAME" + data (stolen) */
/* Whole UTF-8 characters of a channel's bytes (NULL: none complete yet); flush sends what is held. */
char *srv_utf8_take(srv_utf8 *u, const uint8_t *b, size_t n, int flush);
json_t *srv_usage_json(const k3_chat_stats *st);                      /* OpenAI's usage object */
const char *srv_json_type(const json_t *v);          /* "an object", "a string", ... for error messages */
json_t *srv_json_member(const json_t *obj, const char *key);   /* obj[key], or NULL when absent or null */

/* serve_slots.c */
/* The SRV_GEN_OPTS of a: the pack, slots, load options, the requests' defaults; then the pack and its
   tokenizer checked. An exit code, 0 on success. */
int srv_configure_gen(srv *s, const k3_args *a);
int srv_fail(k3_err e, const k3_diag *d);      /* print d, the exit code of e */
/* Bring the pack up: tokenizer, plan (s->lo, with n_seq = n_slots), model, a chat per slot, the
   batcher (n_slots > 1). An exit code, 0 on success. */
int srv_load(srv *s);
void srv_unload(srv *s);
/* The shutdown begins: the slots stop taking jobs, each answer in progress stops within a token. */
void srv_stop(srv *s);                       /* everything srv_load made, and the queue */
/* Run the slots: the jobs of the queue, each in a slot, until s->stopping (or, with s->drain, until
   the queue is empty); with one slot on this thread, else on their own threads, this one running
   the passes they share. */
void srv_slots_run(srv *s);

/* serve_door.c: the connections' records, caps and deadlines, and the waker that resumes a
   connection waiting for its job (serve_http.c suspends it). */
void srv_door_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                     enum MHD_ConnectionNotificationCode toe);   /* MHD_OPTION_NOTIFY_CONNECTION */
srv_sock *srv_door_sock(struct MHD_Connection *c);
/* The connection is over a cap: 1 with the refusal's message in msg[cap]. */
int srv_door_refused(srv *s, struct MHD_Connection *c, char *msg, size_t cap);
/* from now (0: none); body: the deadline of a body under way, answered 408 when it passes; takes mu */
void srv_door_deadline(srv *s, struct MHD_Connection *c, double seconds, int body);
void srv_raw_error(int fd, int tls, int status, const char *reason, const char *msg);  /* no lock */
/* With mu held: suspend c until j has output (a stream) or is done; the waker resumes it. */
void srv_door_wait(srv *s, struct MHD_Connection *c, srv_job *j);
int srv_peer_gone(int fd);          /* the client closed its side */
int srv_door_start(srv *s);         /* the waker thread: 0, or -1 */
void srv_door_stop(srv *s);         /* resume every waiting connection and end the waker */

/* serve_http.c: start and stop the listener. */
int srv_http_start(srv *s);
void srv_http_quiesce(srv *s);     /* stop accepting connections */
void srv_http_stop(srv *s);

/* serve_api.c */
/* Check a chat (kind SRV_CHAT) or completion request body; *job on success, else an error
   status and message (msg[cap]). */
int srv_api_parse(srv *s, srv_kind kind, const char *body, size_t len, srv_job **job, char *msg, size_t cap);
/* The same for a request of another API (api->to_chat turns it into a chat request first). */
int srv_api_parse_as(srv *s, const srv_api_ops *api, const char *body, size_t len, srv_job **job, char *msg,
                     size_t cap);
/* Run a job to its end in a slot (the output lands in job->out), its choices side by side in idle
   slots where there are (n > 1). */
void srv_api_run(srv *s, srv_slot *sl, srv_job *j);
/* Run choice i of j in slot sl, a helper the job's leader took (n > 1; its result into j->fork[i]). */
void srv_api_help(srv *s, srv_slot *sl, srv_job *j, int i);
/* An OpenAI-shaped error body: {"error": {"message", "type", "code"}} (malloc'd). */
char *srv_api_error_json(int status, const char *msg);
char *srv_api_models_json(const srv *s);
char *srv_api_metrics_text(srv *s);            /* takes mu itself */
void srv_job_unref(srv *s, srv_job *j);       /* with mu held */

/* batch_cli.c: one line of `k3run batch`'s input (len bytes, no newline): its custom_id (malloc'd; NULL:
   none), kind and body (malloc'd JSON text), or err[cap] saying what is wrong with it (body NULL). 0, or
   -1 when out of memory. */
int srv_batch_line(const char *line, size_t len, uint32_t no, char **custom_id, srv_kind *kind, char **body,
                   char *err, size_t cap);

/* serve_page.c (generated from serve_page.html): the chat page. */
extern const char k3_serve_page[];
extern const unsigned long k3_serve_page_len;

#endif

/*
 * fuzz_request.h - the body of the request-decoder targets (fuzz_req_*.c): one
 * HTTP request body (or one `k3run batch` line) through the server's own
 * checks, as `k3run serve` runs them before anything waits: the API's decoder
 * (to_chat for /v1/messages and /v1/responses), the chat-completions checks, and
 * K3's renderer with the fuzz tokenizer (tests/fuzz/data), against a context of
 * FZ_CONTEXT positions so the "does not fit" paths are reached too.
 *
 * Invariants: a refusal is an HTTP status of 400..599 with a one-line message
 * (a 500 only "out of memory"); an accepted request is a job whose prompt fits
 * the context with room for an answer, with its body (chat) or ids
 * (completion), its API, and sampling the sampler accepts; every job is freed
 * (the leak check sees the rest).
 *
 * The including file defines FZ_API: 0 chat completions, 1 completions,
 * 2 messages (and count_tokens), 3 responses, 4 a batch line.
 */
#include "fuzz_util.h"

#include <pthread.h>

#include "sampler.h"
#include "serve_impl.h"
#include "tokenizer.h"

#define FZ_CONTEXT 512

static srv g_srv;

static srv *server(void)
{
    if (!g_srv.tok) {
        k3_diag d = {0};
        if (k3_tok_load(K3_FUZZ_VOCAB, K3_FUZZ_TOKCONFIG, &g_srv.tok, &d)) {
            fprintf(stderr, "cannot load the fuzz tokenizer: %s\n", d.msg);
            abort();
        }
        pthread_mutex_init(&g_srv.mu, NULL);
        pthread_cond_init(&g_srv.cv, NULL);
        g_srv.context = FZ_CONTEXT;
        g_srv.n_slots = 2;                        /* the slot-routing copy of the prompt too */
        g_srv.model_name = "fuzz";
        g_srv.co.n_predict = 16;
        g_srv.so.temp = 1.0f;
        g_srv.so.top_p = 0.95f;
        g_srv.so.repeat_penalty = 1.0f;
    }
    return &g_srv;
}

static void check_refusal(int st, const char *msg)
{
    if (fz_verbose()) fprintf(stderr, "  refused (%d): %s\n", st, msg);
    FZ_EXPECT(st >= 400 && st < 600);
    FZ_EXPECT(msg[0] != 0 && strchr(msg, '\n') == NULL);
    FZ_EXPECT(st != 500 || !strcmp(msg, "out of memory"));
}

static void check_job(srv *s, srv_job *j, const srv_api_ops *api)
{
    fz_accepted(j->id);
    FZ_EXPECT(j->api == api && j->refs == 1);
    FZ_EXPECT(j->prompt_tokens > 0 && j->prompt_tokens < s->context);
    FZ_EXPECT(j->kind == SRV_CHAT ? j->body && j->body_len && !j->ids : j->ids && j->n_ids == j->prompt_tokens);
    FZ_EXPECT(j->n_choices >= 1 && j->n_choices <= SRV_N_MAX);
    FZ_EXPECT(j->co.n_stops == 0 || j->co.stops);
    k3_diag d;
    FZ_EXPECT(k3_sampler_check(&j->so, &d) == K3_OK);
    pthread_mutex_lock(&s->mu);
    srv_job_unref(s, j);
    pthread_mutex_unlock(&s->mu);
}

static void one(srv *s, const srv_api_ops *api, srv_kind kind, const char *body, size_t len)
{
    char msg[1200] = "";
    srv_job *j = NULL;
    int st = api == &srv_api_openai ? srv_api_parse(s, kind, body, len, &j, msg, sizeof msg)
                                    : srv_api_parse_as(s, api, body, len, &j, msg, sizeof msg);
    if (st) {
        FZ_EXPECT(!j);
        check_refusal(st, msg);
        return;
    }
    check_job(s, j, api);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    srv *s = server();
    const char *body = (const char *)data;
#if FZ_API == 0
    one(s, &srv_api_openai, SRV_CHAT, body, size);
#elif FZ_API == 1
    one(s, &srv_api_openai, SRV_COMPLETION, body, size);
#elif FZ_API == 2
    one(s, &srv_api_messages, SRV_CHAT, body, size);
    char msg[1200] = "";
    int st = 0;
    char *doc = srv_messages_count_tokens(s, body, size, &st, msg, sizeof msg);
    if (doc) {
        FZ_EXPECT(!strncmp(doc, "{\"input_tokens\":", 16));
        free(doc);
    } else {
        check_refusal(st ? st : 500, msg[0] ? msg : "out of memory");
    }
#elif FZ_API == 3
    one(s, &srv_api_responses, SRV_CHAT, body, size);
#elif FZ_API == 4
    if (memchr(data, '\n', size)) return 0;      /* the reader splits lines first */
    char *id = NULL, *req = NULL, err[512];
    srv_kind kind = SRV_CHAT;
    int rc = srv_batch_line(body, size, 7, &id, &kind, &req, err, sizeof err);
    FZ_EXPECT(rc == 0);
    if (req) {
        FZ_EXPECT(id && !err[0]);
        one(s, &srv_api_openai, kind, req, strlen(req));
    } else {
        FZ_EXPECT(err[0] && !strchr(err, '\n'));
        if (fz_verbose()) fprintf(stderr, "  bad line: %s\n", err);
    }
    free(id);
    free(req);
#endif
    return 0;
}

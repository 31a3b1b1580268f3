/*
 * serve_cli.c - `k3run serve` (serve_impl.h): options, bringing the pack up, the
 * generation thread's loop, and the shutdown on SIGTERM / SIGINT.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_args.h"
#include "k3_log.h"
#include "k3_sys.h"
#include "serve_impl.h"

#define SRV_DRAIN_SECONDS 10      /* at shutdown, how long responses may take to go out */

enum {
    OPT_MODEL = K3_OPT_USER, OPT_HOST, OPT_PORT, OPT_KEY, OPT_QUEUE, OPT_TIMEOUT, OPT_MAX_BODY, OPT_NAME, OPT_N,
    OPT_THINK_BUDGET, OPT_CONTEXT, OPT_BATCH, OPT_BUDGET, OPT_PRESET, OPT_THREADS, OPT_TEMP, OPT_TOPK, OPT_TOPP,
    OPT_MINP, OPT_REPEAT, OPT_SEED, OPT_SNAPSHOTS, OPT_DRAFT, OPT_NO_VERIFY_READS, OPT_VERIFY, OPT_PARALLEL
};

static const k3_opt opts[] = {
    {OPT_MODEL, 'm', "model", "PACK", NULL, "K3_MODEL", "the pack directory (made by k3pack)"},
    {OPT_HOST, 0, "host", "ADDR", "127.0.0.1", NULL, "the address to listen on (another than loopback only when asked)"},
    {OPT_PORT, 0, "port", "N", "8080", NULL, "the TCP port (0: any free one, printed at start)"},
    {OPT_KEY, 0, "api-key", "KEY", NULL, "K3_API_KEY", "require 'Authorization: Bearer KEY' on /v1/* and /metrics"},
    {OPT_PARALLEL, 0, "parallel", "S", "1", NULL,
     "answers generated together, sharing each forward pass (each one's bytes are what it gets alone)"},
    {OPT_QUEUE, 0, "queue", "N", "4", NULL, "requests that may wait while every slot answers one (more: 503)"},
    {OPT_TIMEOUT, 0, "timeout", "S", "30", NULL, "seconds a request's body may take to arrive, and of inactivity"},
    {OPT_MAX_BODY, 0, "max-body", "SIZE", "16M", NULL, "the largest request body (larger: 413)"},
    {OPT_NAME, 0, "name", "NAME", "the pack's directory name", NULL, "the model's name in the API"},
    {OPT_N, 'n', "n-predict", "N", "1024", NULL, "tokens per answer when a request gives no max_tokens"},
    {OPT_THINK_BUDGET, 0, "think-budget", "N", "0 (none)", NULL,
     "after N reasoning tokens close the think channel and let the model answer"},
    {OPT_CONTEXT, 'c', "context", "N", "4096", NULL, "positions the model holds (a whole conversation)"},
    {OPT_BATCH, 'b', "batch", "auto|N", "auto", NULL,
     "prompt tokens per forward pass (auto: the planner chooses for the budget and -n)"},
    {OPT_BUDGET, 'B', "budget", "SIZE", "what the machine allows", "K3_BUDGET", "memory to use (8G, 512M, ...)"},
    {OPT_PRESET, 0, "preset", "NAME", NULL, NULL, "a named budget: laptop (8G), workstation (128G), server (224G)"},
    {OPT_THREADS, 't', "threads", "N", "all CPUs", "K3_THREADS", "compute threads"},
    {OPT_TEMP, 0, "temp", "T", "0 (greedy)", NULL, "temperature when a request gives none"},
    {OPT_TOPK, 0, "top-k", "K", "0 (off)", NULL, "top_k when a request gives none"},
    {OPT_TOPP, 0, "top-p", "P", "1 (off)", NULL, "top_p when a request gives none"},
    {OPT_MINP, 0, "min-p", "P", "0 (off)", NULL, "min_p when a request gives none"},
    {OPT_REPEAT, 0, "repeat-penalty", "R", "1 (off)", NULL, "repeat_penalty when a request gives none"},
    {OPT_SEED, 's', "seed", "S", "0", NULL, "seed when a request gives none: same request, same answer"},
    {OPT_SNAPSHOTS, 0, "snapshots", "N", "2", NULL,
     "state snapshots kept, to serve a conversation that went back from the prompt cache"},
    {OPT_DRAFT, 0, "draft", "N", K3_DRAFT_DEFAULT_STR, NULL,
     "speculative decoding: verify up to N tokens drafted from the conversation per pass (0: off); same answers"},
    {OPT_NO_VERIFY_READS, 0, "no-verify-reads", NULL, NULL, NULL, "do not check each tensor's XXH3-64 as it is read"},
    {OPT_VERIFY, 0, "verify", NULL, NULL, NULL, "run k3verify's full check of the pack before loading it"},
    K3_OPTS_COMMON,
};
#define N_OPTS ((int)(sizeof opts / sizeof opts[0]))

static const char purpose[] =
    "Serve a K3 chat model from a k3 pack over HTTP with the OpenAI API:\n"
    "POST /v1/chat/completions (streamed or not, tools, reasoning in\n"
    "reasoning_content), POST /v1/completions, GET /v1/models, GET /health,\n"
    "GET /metrics (Prometheus) and a chat page at /. --parallel S answers S\n"
    "requests together, each forward pass carrying a token of every one (the\n"
    "trunk read once for all); others wait in a bounded queue. A conversation\n"
    "resent with one more turn goes to the slot holding it and is served from its\n"
    "prompt cache: only its new tokens are processed. The answers are the bytes\n"
    "`k3run chat` gives for the same request and seed, whoever shares the passes.\n"
    "SIGTERM or Ctrl-C: the answer in progress stops and is finished, the queue is\n"
    "refused (503), and k3run exits 0. docs/k3run-serve.md has every field.";

static const char footer[] =
    "Examples:\n"
    "  k3run serve -m ~/packs/k3 --port 8080\n"
    "  curl -s localhost:8080/v1/chat/completions -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}'\n"
    "  K3_API_KEY=secret k3run serve -m ~/packs/k3 --host 0.0.0.0\n";

static int configure(srv *s, const k3_args *a)
{
    k3_diag d;
    int rc;
    if (a->n_pos) return k3_usage_error("unexpected argument '%s' (the pack is given with -m)", a->pos[0]);
    if (!(s->pack = k3_opt_str(a, OPT_MODEL))) return k3_usage_error("no model: give the pack with -m PACK");
    s->host = k3_opt_str(a, OPT_HOST) ? k3_opt_str(a, OPT_HOST) : "127.0.0.1";
    s->api_key = k3_opt_str(a, OPT_KEY);
    if (s->api_key && !*s->api_key) return k3_usage_error("--api-key: the key is empty");
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t port, queue, timeout, topk, draft, parallel;
    uint64_t max_body;
    if ((rc = k3_cli_u32(a, OPT_PORT, 8080, 0, 65535, "port", &port)) ||
        (rc = k3_cli_u32(a, OPT_QUEUE, 4, 0, 1024, "queue", &queue)) ||
        (rc = k3_cli_u32(a, OPT_PARALLEL, 1, 1, K3_SERVE_SLOTS_MAX, "parallel", &parallel)) ||
        (rc = k3_cli_u32(a, OPT_TIMEOUT, 30, 1, 86400, "timeout", &timeout)) ||
        (rc = k3_cli_u32(a, OPT_N, 1024, 1, 1u << 30, "n-predict", &s->co.n_predict)) ||
        (rc = k3_cli_u32(a, OPT_THINK_BUDGET, 0, 0, 1u << 30, "think-budget", &s->co.think_budget)) ||
        (rc = k3_cli_u32(a, OPT_THREADS, ncpu > 0 ? (uint64_t)ncpu : 1, 1, 1024, "threads", &s->threads)) ||
        (rc = k3_cli_u32(a, OPT_CONTEXT, 4096, 16, 1u << 24, "context", &s->lo.context)) ||
        (rc = k3_cli_batch(a, OPT_BATCH, &s->lo.batch)) ||
        (rc = k3_cli_u32(a, OPT_SNAPSHOTS, 2, 0, 64, "snapshots", &s->lo.snapshots)) ||
        (rc = k3_cli_u32(a, OPT_DRAFT, K3_DRAFT_DEFAULT, 0, K3_DRAFT_MAX, "draft", &draft)) ||
        (rc = k3_cli_u32(a, OPT_TOPK, 0, 0, UINT32_MAX, "top-k", &topk)) ||
        (rc = k3_cli_float(a, OPT_TEMP, 0.0f, "temp", &s->so.temp)) ||
        (rc = k3_cli_float(a, OPT_TOPP, 1.0f, "top-p", &s->so.top_p)) ||
        (rc = k3_cli_float(a, OPT_MINP, 0.0f, "min-p", &s->so.min_p)) ||
        (rc = k3_cli_float(a, OPT_REPEAT, 1.0f, "repeat-penalty", &s->so.repeat_penalty)) ||
        (rc = k3_cli_budget(a, OPT_BUDGET, OPT_PRESET, &s->lo.budget)))
        return rc;
    if (k3_opt_u64(a, OPT_MAX_BODY, 16u << 20, 1, &max_body, &d)) return k3_usage_error("%s", d.msg);
    if (max_body < 1024) return k3_usage_error("--max-body: %llu bytes is too small (1K at least)",
                                               (unsigned long long)max_body);
    s->port = (uint16_t)port;
    s->queue_max = queue;
    s->n_slots = parallel;
    s->lo.n_seq = parallel;
    s->timeout_s = timeout;
    s->max_body = (size_t)max_body;
    s->so.top_k = topk;
    if (k3_opt_u64(a, OPT_SEED, 0, 0, &s->so.seed, &d)) return k3_usage_error("%s", d.msg);
    if (k3_sampler_check(&s->so, &d)) return k3_usage_error("%s", d.msg);
    omp_set_num_threads((int)s->threads);
    if (k3_isa_choose(getenv("K3_ISA"), &s->lo.isa, &d)) return k3_usage_error("K3_ISA: %s", d.msg);
    s->lo.pack = s->pack;
    s->lo.verify = k3_opt_count(a, OPT_VERIFY) > 0;
    s->lo.verify_reads = !k3_opt_count(a, OPT_NO_VERIFY_READS);
    s->lo.spec_tokens = draft ? draft + 1 : 0;
    s->lo.generate_tokens = s->co.n_predict;         /* -b auto prices an answer of -n tokens */
    s->model_name = k3_opt_str(a, OPT_NAME);
    if (!s->model_name) {                        /* the pack directory's last name */
        static char name[256];
        size_t n = strlen(s->pack);
        while (n > 1 && s->pack[n - 1] == '/') n--;
        size_t b = n;
        while (b > 0 && s->pack[b - 1] != '/') b--;
        snprintf(name, sizeof name, "%.*s", (int)(n - b), s->pack + b);
        s->model_name = name;
    }
    if (k3_cli_check_pack(s->pack, &d)) { k3_error("%s", d.msg); return K3_EXIT_IO; }
    char tik[4200];
    if (!k3_cli_has_tokenizer(s->pack, tik, sizeof tik))
        return k3_usage_error("the pack has no tokenizer ('%s' does not exist): serving needs one; copy the "
                              "checkpoint's tiktoken.model and tokenizer_config.json into the pack", tik);
    return 0;
}

static int fail(k3_err e, const k3_diag *d)
{
    k3_error("%s", d->msg);
    return k3_exit_code(e);
}

static int load(srv *s)
{
    k3_diag d;
    k3_err e;
    int usage = 0;
    double t0 = k3_now();
    if ((e = k3_tok_load_dir(s->pack, &s->tok, &d))) return fail(e, &d);
    if ((e = k3_load_plan(&s->lo, &s->ld, &usage, &d))) return usage ? k3_usage_error("%s", d.msg) : fail(e, &d);
    if ((e = k3_load_model(&s->lo, &s->ld, &d))) return fail(e, &d);
    if (!(s->slots = calloc(s->n_slots, sizeof *s->slots))) return fail(k3_fail(&d, K3_ERR_NOMEM, "out of memory"), &d);
    for (uint32_t i = 0; i < s->n_slots; i++) {
        srv_slot *sl = &s->slots[i];
        sl->s = s;
        sl->idx = i;
        sl->h = k3_model_seq(s->ld.m, i);
        if ((e = k3_chat_new(sl->h, s->tok, &s->so, s->lo.snapshots, &sl->chat, &d))) return fail(e, &d);
        k3_chat_set_draft(sl->chat, s->ld.plan.verify_tokens ? s->ld.plan.verify_tokens - 1 : 0,
                          k3_dec_rho(&s->ld.plan, s->ld.geo));
    }
    if (s->n_slots > 1 && (e = k3_batcher_new(s->ld.m, 0, &s->bat, &d))) return fail(e, &d);
    s->eos = k3w_config(s->ld.w)->eos_token_id;
    k3w_stats(s->ld.w, &s->w_base);
    s->t_load = k3_now() - t0 - s->ld.t_verify;
    return 0;
}

/* SIGTERM / SIGINT: the shutdown begins (the answer in progress stops within a token). */
static void *signals(void *arg)
{
    srv *s = arg;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    int sig = 0;
    sigwait(&set, &sig);
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    for (uint32_t i = 0; i < s->n_slots; i++)
        if (s->slots[i].job) s->slots[i].job->cancel = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* A queued job refused at shutdown (mu held). */
static void refuse(srv *s, srv_job *j)
{
    char *e = srv_api_error_json(503, "the server is shutting down");
    if (e) {
        if (j->stream) srv_buf_add(&j->out, "data: ", 6);
        srv_buf_add(&j->out, e, strlen(e));
        if (j->stream) srv_buf_add(&j->out, "\n\ndata: [DONE]\n\n", 16);
    }
    free(e);
    s->mt.errors[503]++;
    j->status = 503;
    j->state = SRV_DONE;
}

/* Tokens at the start of a and b alike. */
static uint32_t common_prefix(const int32_t *a, uint32_t na, const int32_t *b, uint32_t nb)
{
    uint32_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

/*
 * Whether slot sl takes the job at the head of the queue (mu held). Among the idle slots: one whose
 * held tokens all begin the job's prompt, or that holds the whole prompt (a conversation going on,
 * or a prompt resent);
 * else an empty one (the caches of the others stay); else the one sharing the longest prefix with
 * the prompt, the least recently used among equals.
 */
static int mine(srv *s, srv_slot *sl)
{
    if (!s->q_n) return 0;
    if (s->n_slots == 1) return 1;
    const srv_job *j = s->queue[s->q_head];
    const int32_t *p = j->kind == SRV_CHAT ? j->route : j->ids;
    uint32_t np = j->kind == SRV_CHAT ? j->n_route : j->n_ids;
    int best = -1;
    uint64_t best_key = 0;
    for (uint32_t i = 0; i < s->n_slots; i++) {
        srv_slot *o = &s->slots[i];
        if (!o->idle && o != sl) continue;
        uint32_t nh = 0;
        const int32_t *h = k3_chat_held(o->chat, &nh);
        uint32_t len = p ? common_prefix(h, nh, p, np) : 0;
        /* rank: 2 holds the conversation, 1 empty, 0 else; then the prefix; then the oldest use */
        uint64_t rank = nh && (len == nh || len == np) ? 2 : nh == 0 ? 1 : 0;
        uint64_t key = rank << 62 | (uint64_t)len << 30 | (uint64_t)((1u << 30) - 1 - (o->used & ((1u << 30) - 1)));
        if (best < 0 || key > best_key) { best = (int)i; best_key = key; }
    }
    return best == (int)sl->idx;
}

/* A slot: one job at a time, from the queue, until the shutdown. */
static void slot_loop(srv_slot *sl)
{
    srv *s = sl->s;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        sl->idle = 1;
        while (!s->stopping && !mine(s, sl)) pthread_cond_wait(&s->cv, &s->mu);
        sl->idle = 0;
        if (s->stopping) break;
        srv_job *j = s->queue[s->q_head];
        s->q_head = (s->q_head + 1) % s->ring;
        s->q_n--;
        pthread_cond_broadcast(&s->cv);          /* the next job may be another slot's */
        if (j->cancel) {                         /* its client left while it waited */
            j->status = 499;
            j->state = SRV_DONE;
        } else {
            j->state = SRV_RUNNING;
            sl->job = j;
            sl->used = ++s->uses;
            s->running++;
            pthread_mutex_unlock(&s->mu);
            double t0 = k3_now();
            if (s->bat) k3_batcher_attach(s->bat, sl->h);
            srv_api_run(s, sl, j);
            if (s->bat) k3_batcher_detach(s->bat, sl->h);
            pthread_mutex_lock(&s->mu);
            sl->busy_s += k3_now() - t0;
            s->running--;
            sl->job = NULL;
            j->state = SRV_DONE;
        }
        pthread_cond_broadcast(&s->cv);
        srv_job_unref(s, j);
    }
    pthread_mutex_unlock(&s->mu);
}

static void *slot_thread(void *arg)
{
    srv_slot *sl = arg;
    slot_loop(sl);
    pthread_mutex_lock(&sl->s->mu);
    if (--sl->s->slots_alive == 0) k3_batcher_stop(sl->s->bat);   /* the last one: no more passes */
    pthread_mutex_unlock(&sl->s->mu);
    return NULL;
}

/* Generation until the shutdown: one slot on this thread, or the slots' threads with this one
   running their passes; then the queue refused and the responses drained. */
static void serve(srv *s)
{
    if (s->n_slots == 1) {
        slot_loop(&s->slots[0]);
    } else {
        uint32_t started = 0;
        s->slots_alive = s->n_slots;
        for (uint32_t i = 0; i < s->n_slots; i++) {
            if (pthread_create(&s->slots[i].th, NULL, slot_thread, &s->slots[i])) break;
            started++;
        }
        if (started < s->n_slots) {
            k3_warn("could start only %u of %u slot threads", started, s->n_slots);
            pthread_mutex_lock(&s->mu);
            s->slots_alive -= s->n_slots - started;
            if (!s->slots_alive) k3_batcher_stop(s->bat);
            pthread_mutex_unlock(&s->mu);
        }
        k3_batcher_run(s->bat);                  /* until the last slot thread ends */
        for (uint32_t i = 0; i < started; i++) pthread_join(s->slots[i].th, NULL);
    }
    pthread_mutex_lock(&s->mu);
    while (s->q_n) {
        srv_job *j = s->queue[s->q_head];
        s->q_head = (s->q_head + 1) % s->ring;
        s->q_n--;
        refuse(s, j);
        srv_job_unref(s, j);
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    srv_http_quiesce(s);
    double t0 = k3_now();
    pthread_mutex_lock(&s->mu);
    while (s->active && k3_now() - t0 < SRV_DRAIN_SECONDS) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    unsigned left = s->active;
    pthread_mutex_unlock(&s->mu);
    if (left) k3_warn("%u response(s) still going out after %d s: closing them", left, SRV_DRAIN_SECONDS);
    srv_http_stop(s);
}

int k3_serve_main(int argc, char **argv)
{
    k3_args a;
    k3_diag d;
    srv s = {0};
    int rc;
    if (k3_opts_parse(opts, N_OPTS, argc, argv, &a, &d)) return k3_usage_error("%s", d.msg);
    if (k3_opt_count(&a, K3_OPT_HELP)) {
        k3_opts_help(stdout, "k3run serve -m PACK [--host ADDR] [--port N] [--api-key KEY] [OPTIONS]", purpose, opts,
                     N_OPTS, footer);
        return K3_EXIT_OK;
    }
    if (k3_opt_count(&a, K3_OPT_VERSION)) { printf("%s %s\n", k3_log_prog(), K3_VERSION); return 0; }
    if ((rc = configure(&s, &a))) return rc;
    /* every thread made from here on (HTTP, OpenMP, readers) leaves SIGTERM and SIGINT to `signals` */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    rc = load(&s);
    s.ring = s.queue_max + s.n_slots;            /* the waiting ones, and those taken but not yet running */
    if (!rc && !(s.queue = calloc(s.ring, sizeof *s.queue))) rc = fail(k3_fail(&d, K3_ERR_NOMEM, "out of memory"), &d);
    if (!rc) rc = srv_http_start(&s);
    pthread_t sig;
    int have_sig = 0;
    if (!rc) {
        have_sig = pthread_create(&sig, NULL, signals, &s) == 0;
        fprintf(stderr, "k3run serve: %s on http://%s%s%s:%u/ (loaded in %.1f s; %u answered together, %u waiting "
                "at most; SIGTERM or Ctrl-C stops)\n", s.model_name, strchr(s.host, ':') ? "[" : "", s.host,
                strchr(s.host, ':') ? "]" : "", s.port, s.t_load, s.n_slots, s.queue_max);
        fflush(stderr);
        serve(&s);
        if (have_sig) pthread_join(sig, NULL);
    }
    k3_batcher_free(s.bat);
    for (uint32_t i = 0; s.slots && i < s.n_slots; i++) k3_chat_free(s.slots[i].chat);
    free(s.slots);
    k3_loaded_free(&s.ld);
    k3_tok_free(s.tok);
    free(s.queue);
    return rc;
}

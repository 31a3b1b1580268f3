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
#include <sys/stat.h>
#include <unistd.h>

#include "cli_args.h"
#include "k3_file.h"
#include "k3_log.h"
#include "k3_sys.h"
#include "serve_impl.h"

#define SRV_DRAIN_SECONDS 10      /* at shutdown, how long responses may take to go out */

enum { OPT_HOST = SRV_OPT__END, OPT_PORT, OPT_KEY, OPT_KEY_FILE, OPT_QUEUE, OPT_TIMEOUT, OPT_HEADER_TIMEOUT,
       OPT_MAX_BODY, OPT_MAX_CONNS, OPT_MAX_CONNS_IP, OPT_TLS_CERT, OPT_TLS_KEY };

static const k3_opt opts[] = {
    SRV_GEN_OPTS,
    {OPT_HOST, 0, "host", "ADDR", "127.0.0.1", NULL, "the address to listen on (another than loopback only when asked)"},
    {OPT_PORT, 0, "port", "N", "8080", NULL, "the TCP port (0: any free one, printed at start)"},
    {OPT_KEY, 0, "api-key", "KEY", NULL, "K3_API_KEY",
     "require 'Authorization: Bearer KEY' on /v1/* and /metrics (visible in ps: prefer --api-key-file)"},
    {OPT_KEY_FILE, 0, "api-key-file", "FILE", NULL, "K3_API_KEY_FILE",
     "the same, the key read from FILE (its first line; not readable by others)"},
    {OPT_QUEUE, 0, "queue", "N", "4", NULL, "requests that may wait while every slot answers one (more: 503)"},
    {OPT_HEADER_TIMEOUT, 0, "header-timeout", "S", "10", NULL,
     "seconds a request's headers may take to arrive (then the connection closes, however slowly bytes come)"},
    {OPT_TIMEOUT, 0, "timeout", "S", "30", NULL, "seconds a request's body may take to arrive, and of inactivity"},
    {OPT_MAX_BODY, 0, "max-body", "SIZE", "16M", NULL, "the largest request body (larger: 413)"},
    {OPT_MAX_CONNS, 0, "max-conns", "N", "256", NULL, "open connections at most (more: 503 and closed)"},
    {OPT_MAX_CONNS_IP, 0, "max-conns-per-ip", "N", "32", NULL,
     "open connections from one client address at most (more: 503 and closed)"},
    {OPT_TLS_CERT, 0, "tls-cert", "FILE", NULL, NULL, "serve HTTPS with this PEM certificate (chain), with --tls-key"},
    {OPT_TLS_KEY, 0, "tls-key", "FILE", NULL, NULL, "the certificate's PEM private key (not readable by others)"},
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

/* A secret's file (a key): refused when others may read it, as ssh refuses a private key. */
static int read_secret(const char *opt, const char *path, size_t max, char **out)
{
    k3_diag d;
    struct stat st;
    if (stat(path, &st)) {
        k3_error("--%s %s: %s", opt, path, strerror(errno));
        return K3_EXIT_USAGE;
    }
    if (st.st_mode & 077) {
        k3_error("--%s %s: the file is readable by others (mode %04o): a secret must be the owner's alone "
                 "(chmod 600 %s)", opt, path, (unsigned)(st.st_mode & 07777), path);
        return K3_EXIT_USAGE;
    }
    size_t n;
    if (k3_read_file(path, max, out, &n, &d)) {
        k3_error("--%s: %s", opt, d.msg);
        return K3_EXIT_USAGE;
    }
    return 0;
}

/* The API key: --api-key-file's first line (whitespace around it dropped), else --api-key. */
static int api_key(srv *s, const k3_args *a)
{
    const char *path = k3_opt_str(a, OPT_KEY_FILE);
    if (path && k3_opt_str(a, OPT_KEY)) return k3_usage_error("--api-key and --api-key-file: give one");
    if (!path) {
        s->api_key = k3_opt_str(a, OPT_KEY);
        if (s->api_key && !*s->api_key) return k3_usage_error("--api-key: the key is empty");
        return 0;
    }
    char *t;
    int rc = read_secret("api-key-file", path, 4096, &t);
    if (rc) return rc;
    char *b = t + strspn(t, " \t\r\n"), *e = b + strcspn(b, "\r\n");
    while (e > b && (e[-1] == ' ' || e[-1] == '\t')) e--;
    *e = 0;
    if (!*b) {
        free(t);
        return k3_usage_error("--api-key-file %s: the file holds no key (its first line is empty)", path);
    }
    memmove(t, b, (size_t)(e - b) + 1);
    s->api_key = s->api_key_owned = t;
    return 0;
}

static int tls(srv *s, const k3_args *a)
{
    const char *cert = k3_opt_str(a, OPT_TLS_CERT), *key = k3_opt_str(a, OPT_TLS_KEY);
    if (!cert && !key) return 0;
    if (!cert || !key) return k3_usage_error("--tls-cert and --tls-key go together");
    if (!MHD_is_feature_supported(MHD_FEATURE_TLS))
        return k3_usage_error("--tls-cert: this libmicrohttpd was built without TLS");
    k3_diag d;
    size_t n;
    if (k3_read_file(cert, 1u << 20, &s->tls_cert, &n, &d)) return k3_usage_error("--tls-cert: %s", d.msg);
    return read_secret("tls-key", key, 1u << 20, &s->tls_key);
}

static int configure(srv *s, const k3_args *a)
{
    k3_diag d;
    int rc;
    if (a->n_pos) return k3_usage_error("unexpected argument '%s' (the pack is given with -m)", a->pos[0]);
    s->host = k3_opt_str(a, OPT_HOST) ? k3_opt_str(a, OPT_HOST) : "127.0.0.1";
    if ((rc = api_key(s, a)) || (rc = tls(s, a))) return rc;
    uint32_t port, queue, timeout, htimeout, max_conns, max_ip;
    uint64_t max_body;
    if ((rc = k3_cli_u32(a, OPT_PORT, 8080, 0, 65535, "port", &port)) ||
        (rc = k3_cli_u32(a, OPT_QUEUE, 4, 0, 1024, "queue", &queue)) ||
        (rc = k3_cli_u32(a, OPT_TIMEOUT, 30, 1, 86400, "timeout", &timeout)) ||
        (rc = k3_cli_u32(a, OPT_HEADER_TIMEOUT, 10, 1, 86400, "header-timeout", &htimeout)) ||
        (rc = k3_cli_u32(a, OPT_MAX_CONNS, 256, 1, 65536, "max-conns", &max_conns)) ||
        (rc = k3_cli_u32(a, OPT_MAX_CONNS_IP, 32, 1, 65536, "max-conns-per-ip", &max_ip)))
        return rc;
    if (k3_opt_u64(a, OPT_MAX_BODY, 16u << 20, 1, &max_body, &d)) return k3_usage_error("%s", d.msg);
    if (max_body < 1024) return k3_usage_error("--max-body: %llu bytes is too small (1K at least)",
                                               (unsigned long long)max_body);
    s->port = (uint16_t)port;
    s->queue_max = queue;
    s->timeout_s = timeout;
    s->header_timeout_s = htimeout;
    s->max_conns = max_conns;
    s->max_conns_per_ip = max_ip;
    s->max_body = (size_t)max_body;
    if ((rc = srv_configure_gen(s, a))) return rc;
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
    srv_stop(s);
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

/* Generation until the shutdown (serve_slots.c); then the queue refused and the responses drained. */
static void serve(srv *s)
{
    srv_slots_run(s);
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
    if (k3_opt_count(&a, K3_OPT_VERSION)) { k3_cli_version(k3_serve_tls_line()); return 0; }
    if ((rc = configure(&s, &a))) {
        free(s.api_key_owned);
        free(s.tls_key);
        free(s.tls_cert);
        return rc;
    }
    /* every thread made from here on (HTTP, OpenMP, readers) leaves SIGTERM and SIGINT to `signals` */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    rc = srv_load(&s);
    s.ring = s.queue_max + s.n_slots;            /* the waiting ones, and those taken but not yet running */
    if (!rc && !(s.queue = calloc(s.ring, sizeof *s.queue))) rc = srv_fail(k3_fail(&d, K3_ERR_NOMEM, "out of memory"), &d);
    if (!rc) rc = srv_http_start(&s);
    pthread_t sig;
    int have_sig = 0;
    if (!rc) {
        have_sig = pthread_create(&sig, NULL, signals, &s) == 0;
        fprintf(stderr, "k3run serve: %s on http%s://%s%s%s:%u/ (loaded in %.1f s; %u answered together, %u waiting "
                "at most; SIGTERM or Ctrl-C stops)\n", s.model_name, s.tls_cert ? "s" : "", strchr(s.host, ':') ? "[" : "", s.host,
                strchr(s.host, ':') ? "]" : "", s.port, s.t_load, s.n_slots, s.queue_max);
        if (k3_log_level() >= K3_LOG_NORMAL)
            fprintf(stderr, "k3run serve: a request without its own sampling gets temperature %g, top-p %g, top-k %u "
                    "(%s)\n", (double)s.so.temp, (double)s.so.top_p, s.so.top_k,
                    strcmp(s.so_from, "k3") ? "the pack's generation_config.json or the options" :
                    "k3's defaults or the options: the pack has no generation_config.json");
        fflush(stderr);
        serve(&s);
        if (have_sig) pthread_join(sig, NULL);
    }
    srv_unload(&s);
    if (s.api_key_owned) explicit_bzero(s.api_key_owned, strlen(s.api_key_owned));
    if (s.tls_key) explicit_bzero(s.tls_key, strlen(s.tls_key));
    free(s.api_key_owned);
    free(s.tls_key);
    free(s.tls_cert);
    return rc;
}

const char *k3_serve_tls_line(void)
{
    static char line[160];
    snprintf(line, sizeof line, "HTTPS: %s (k3run serve --tls-cert; libmicrohttpd %s)",
             MHD_is_feature_supported(MHD_FEATURE_TLS) == MHD_YES ? "yes" : "no", MHD_get_version());
    return line;
}

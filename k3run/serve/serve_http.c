/*
 * serve_http.c - the HTTP side of `k3run serve` (serve_impl.h), on libmicrohttpd:
 * routing, the API key, the body read under a size cap and a deadline, error
 * responses, and the two ways a job's output goes out (a whole body, or
 * server-sent events as they are made).
 *
 * libmicrohttpd (Debian's libmicrohttpd-dev) because it is the small, well-kept
 * C HTTP/1.1 server library: chunked responses from a callback (the event
 * stream), suspending a connection while its answer is made, per-address
 * connection limits, TLS through GnuTLS, and a clean quiesce and stop for
 * SIGTERM. It runs in its epoll mode with a small pool of threads: a connection
 * holds no thread while its client is slow or while it waits for its answer (it
 * is suspended; serve_door.c resumes it), so clients that trickle bytes cannot
 * take the workers that others need.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "k3_log.h"
#include "k3_sys.h"
#include "serve_impl.h"

#define SRV_POOL_THREADS 4        /* libmicrohttpd's event-loop threads (they never wait for a job) */
#define SRV_CONN_SPARE 64         /* connections beyond --max-conns that still get their 503 */

/* in the order of srv_endpoint_names (the metrics count requests by it) */
typedef enum { R_CHAT, R_COMPLETION, R_MODELS, R_HEALTH, R_METRICS, R_PAGE, R_MESSAGES, R_COUNT_TOKENS, R_RESPONSES,
               R_NONE } route;

/* One request on a connection. */
typedef struct conn {
    srv *s;
    route r;
    srv_buf body;                 /* [body.n] the request body so far */
    int failed;                   /* an error response is queued, or (fail_status) waits for the body's end */
    int fail_status;              /* a refusal sent once the body is read (closing on unread data could
                                     reset the connection before the client reads the answer) */
    char fail_msg[200];
    size_t dropped;               /* body bytes read and dropped after the refusal */
    int fd;                       /* the client's socket */
    srv_job *job;                 /* a whole answer being made (the connection waits, suspended) */
    int counted;                  /* holds one of srv.active until the request is done */
    char resp_id[80];             /* GET or DELETE /v1/responses/{id}: the id ("" for the POST) */
    int resp_del;
} conn;

static const struct { const char *path, *method; route r; } routes[] = {
    {"/v1/chat/completions", "POST", R_CHAT},
    {"/v1/completions", "POST", R_COMPLETION},
    {"/v1/models", "GET", R_MODELS},
    {"/v1/messages", "POST", R_MESSAGES},
    {"/v1/messages/count_tokens", "POST", R_COUNT_TOKENS},
    {"/v1/responses", "POST", R_RESPONSES},
    {"/health", "GET", R_HEALTH},
    {"/metrics", "GET", R_METRICS},
    {"/", "GET", R_PAGE},
    {"/index.html", "GET", R_PAGE},
};
#define N_ROUTES ((int)(sizeof routes / sizeof routes[0]))

/* ---- responses ---------------------------------------------------------------- */

static enum MHD_Result send_body(struct MHD_Connection *c, int status, const char *type, char *body, size_t n,
                                 int free_it, const char *extra_name, const char *extra_value)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(n, body, free_it ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) { if (free_it) free(body); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    if (extra_name) MHD_add_response_header(r, extra_name, extra_value);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int status, char *json)
{
    if (!json) return MHD_NO;
    return send_body(c, status, "application/json", json, strlen(json), 1, NULL, NULL);
}

/* The API whose shape a route's answers and errors take. */
static const srv_api_ops *api_of(route r)
{
    return r == R_MESSAGES || r == R_COUNT_TOKENS ? &srv_api_messages : r == R_RESPONSES ? &srv_api_responses
                                                                                           : &srv_api_openai;
}

static enum MHD_Result send_error_api(srv *s, struct MHD_Connection *c, const srv_api_ops *api, int status,
                                      const char *msg, const char *hname, const char *hvalue)
{
    pthread_mutex_lock(&s->mu);
    if (status >= 400 && status < 600) s->mt.errors[status]++;
    pthread_mutex_unlock(&s->mu);
    char *e = api->error_json(status, msg);
    if (!e) return MHD_NO;
    return send_body(c, status, "application/json", e, strlen(e), 1, hname, hvalue);
}

static enum MHD_Result send_error_h(srv *s, struct MHD_Connection *c, int status, const char *msg,
                                    const char *hname, const char *hvalue)
{
    pthread_mutex_lock(&s->mu);
    if (status >= 400 && status < 600) s->mt.errors[status]++;
    pthread_mutex_unlock(&s->mu);
    char *e = srv_api_error_json(status, msg);
    if (!e) return MHD_NO;
    return send_body(c, status, "application/json", e, strlen(e), 1, hname, hvalue);
}

static enum MHD_Result send_error(srv *s, struct MHD_Connection *c, int status, const char *msg)
{
    return send_error_h(s, c, status, msg, NULL, NULL);
}

/* An error written straight to the socket (srv_raw_error), counted; returns MHD_NO, which closes
   the connection. */
static enum MHD_Result raw_error(srv *s, int fd, int status, const char *reason, const char *msg)
{
    pthread_mutex_lock(&s->mu);
    s->mt.errors[status]++;
    pthread_mutex_unlock(&s->mu);
    srv_raw_error(fd, s->tls_cert != NULL, status, reason, msg);
    return MHD_NO;
}

/* ---- the key ---------------------------------------------------------------------- */

/* Constant time in the length of the longer string. */
static int key_ok(const char *want, const char *got)
{
    size_t a = strlen(want), b = got ? strlen(got) : 0, n = a > b ? a : b;
    unsigned char diff = (unsigned char)(a != b);
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)((i < a ? want[i] : 0) ^ (i < b ? got[i] : 0));
    return got && diff == 0;
}

/* ---- streams ---------------------------------------------------------------------- */

/* A stream's own state: it lives as long as its response, which may outlive the request's conn. */
typedef struct sse {
    srv *s;
    srv_job *j;
    struct MHD_Connection *c;
} sse;

/* The stream's next bytes; with none yet, the connection waits (suspended) until the job has some. */
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    sse *k = cls;
    srv *s = k->s;
    srv_job *j = k->j;
    (void)pos;
    pthread_mutex_lock(&s->mu);
    if (j->sent < j->out.n) {
        size_t n = j->out.n - j->sent < max ? j->out.n - j->sent : max;
        memcpy(buf, j->out.p + j->sent, n);
        j->sent += n;
        if (j->sent == j->out.n) j->sent = j->out.n = 0;
        pthread_mutex_unlock(&s->mu);
        return (ssize_t)n;
    }
    if (j->state == SRV_DONE) {
        pthread_mutex_unlock(&s->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    if (s->door_stop) {                              /* the listener stops under it */
        j->cancel = 1;
        pthread_mutex_unlock(&s->mu);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    srv_door_wait(s, k->c, j);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* The stream's response is gone (sent, or the client left): the job is the worker's alone. */
static void sse_done(void *cls)
{
    sse *k = cls;
    srv *s = k->s;
    pthread_mutex_lock(&s->mu);
    if (k->j->state != SRV_DONE) k->j->cancel = 1;
    srv_job_unref(s, k->j);
    s->active--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    free(k);
}

/* ---- the API's POSTs ---------------------------------------------------------------- */

/* A whole answer: send it when done, else wait (suspended) until it is. */
static enum MHD_Result api_finish(srv *s, conn *k, struct MHD_Connection *c)
{
    srv_job *j = k->job;
    pthread_mutex_lock(&s->mu);
    if (j->state != SRV_DONE && !s->door_stop) {     /* woken early: wait on */
        srv_door_wait(s, c, j);
        pthread_mutex_unlock(&s->mu);
        return MHD_YES;
    }
    if (j->state != SRV_DONE) j->cancel = 1;         /* the listener stops under it */
    char *out = j->state == SRV_DONE ? j->out.p : NULL;
    size_t n = j->out.n;
    int status = j->status ? j->status : 500;
    if (out) j->out = (srv_buf){0};
    srv_job_unref(s, j);
    k->job = NULL;
    k->counted = 1;                                  /* `active` drops once the answer went out (on_done) */
    pthread_mutex_unlock(&s->mu);
    if (!out) return send_error_api(s, c, api_of(k->r), 503, "the server is shutting down", NULL, NULL);
    return send_body(c, status, "application/json", out, n, 1, NULL, NULL);
}

static enum MHD_Result api_post(srv *s, conn *k, struct MHD_Connection *c)
{
    char msg[1200] = "";
    srv_job *j;
    const char *body = k->body.p ? k->body.p : "";
    const srv_api_ops *api = api_of(k->r);
    int st = k->r == R_CHAT || k->r == R_COMPLETION
                 ? srv_api_parse(s, k->r == R_CHAT ? SRV_CHAT : SRV_COMPLETION, body, k->body.n, &j, msg, sizeof msg)
                 : srv_api_parse_as(s, api, body, k->body.n, &j, msg, sizeof msg);
    if (st) return send_error_api(s, c, api, st, msg, NULL, NULL);
    pthread_mutex_lock(&s->mu);
    if (s->stopping || s->q_n + s->running > s->queue_max + s->n_slots - 1) {   /* queue_max wait, every slot runs */
        int stopping = s->stopping;
        if (!stopping) s->mt.rejected_busy++;
        srv_job_unref(s, j);
        pthread_mutex_unlock(&s->mu);
        return send_error_api(s, c, api, 503, stopping ? "the server is shutting down" :
                              "the server is busy: the queue of requests is full; retry later", "Retry-After", "1");
    }
    j->refs = 2;
    j->state = SRV_QUEUED;
    if (j->stream) j->t_out = k3_now();     /* its headers go now: a queued stream is kept alive too */
    s->queue[(s->q_head + s->q_n++) % s->ring] = j;
    s->active++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (j->stream) {
        sse *x = malloc(sizeof *x);
        struct MHD_Response *r = NULL;
        if (x) {
            *x = (sse){.s = s, .j = j, .c = c};
            r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_read, x, sse_done);
        }
        if (!r) {                                   /* the job runs for nobody: let it go */
            pthread_mutex_lock(&s->mu);
            j->cancel = 1;
            srv_job_unref(s, j);
            s->active--;
            pthread_mutex_unlock(&s->mu);
            free(x);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        return ok;
    }
    /* the whole answer: the connection waits for it, suspended (api_finish sends it) */
    k->job = j;
    return api_finish(s, k, c);
}

/* ---- the request ------------------------------------------------------------------- */

static void count(srv *s, route r)
{
    pthread_mutex_lock(&s->mu);
    s->mt.requests[r]++;
    pthread_mutex_unlock(&s->mu);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    srv *s = cls;
    conn *k = *con_cls;
    (void)version;
    if (!k) {                                        /* the headers are in */
        if (!(k = calloc(1, sizeof *k))) return MHD_NO;
        *con_cls = k;
        k->s = s;
        char m[600];
        if (srv_door_refused(s, c, m, sizeof m)) {  /* over a cap: refused, and closed once answered */
            k->failed = 1;
            k->r = R_NONE;
            return send_error_h(s, c, 503, m, "Connection", "close");
        }
        srv_door_deadline(s, c, s->timeout_s, 1);    /* the body has --timeout to arrive */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        k->fd = ci ? ci->connect_fd : -1;
        k->r = R_NONE;
        int path_known = 0;
        char allow[32] = "";
        for (int i = 0; i < N_ROUTES; i++) {
            if (strcmp(url, routes[i].path)) continue;
            path_known = 1;
            snprintf(allow, sizeof allow, "%s", routes[i].method);
            if (!strcmp(method, routes[i].method) || (!strcmp(method, "HEAD") && !strcmp(routes[i].method, "GET")))
                k->r = routes[i].r;
        }
        /* a stored response (serve_responses.c), counted as a request of /v1/responses */
        if (k->r == R_NONE && !strncmp(url, "/v1/responses/", 14) && url[14] && !strchr(url + 14, '/') &&
            strlen(url + 14) < sizeof k->resp_id) {
            path_known = 1;
            snprintf(allow, sizeof allow, "GET, DELETE");
            if (!strcmp(method, "GET") || !strcmp(method, "HEAD") || !strcmp(method, "DELETE")) {
                k->r = R_RESPONSES;
                snprintf(k->resp_id, sizeof k->resp_id, "%s", url + 14);
                k->resp_del = !strcmp(method, "DELETE");
            }
        }
        if (k->r == R_NONE) {
            k->failed = 1;
            if (path_known) {
                snprintf(m, sizeof m, "%s is not allowed on %s (use %s)", method, url, allow);
                return send_error_h(s, c, 405, m, "Allow", allow);
            }
            snprintf(m, sizeof m, "no such endpoint: %.300s (the API is /v1/chat/completions, /v1/completions, "
                     "/v1/messages, /v1/messages/count_tokens, /v1/responses, /v1/models, /health, /metrics and "
                     "the page /)", url);
            return send_error(s, c, 404, m);
        }
        if (s->api_key && k->r != R_HEALTH && k->r != R_PAGE) {
            /* the key as OpenAI's clients send it, or as Anthropic's do (x-api-key) */
            const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
            const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
            const char *tok = h && !strncasecmp(h, "Bearer ", 7) ? h + 7 : NULL;
            if (!key_ok(s->api_key, tok) && !key_ok(s->api_key, x)) {
                k->failed = 1;
                return send_error_api(s, c, api_of(k->r), 401, h || x ? "the API key is wrong" :
                                      "an API key is needed: send the header 'Authorization: Bearer KEY' "
                                      "(or 'x-api-key: KEY')", "WWW-Authenticate", "Bearer");
            }
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->max_body) {
            snprintf(k->fail_msg, sizeof k->fail_msg, "the body is %.40s bytes: at most %zu are accepted", cl,
                     s->max_body);
            k->fail_status = 413;
            if (MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Expect")) {   /* it waits for a go-ahead */
                k->failed = 1;
                return send_error_api(s, c, api_of(k->r), 413, k->fail_msg, NULL, NULL);
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {                              /* a piece of the body */
        size_t n = *upload_size;
        *upload_size = 0;
        if (k->failed) return MHD_YES;
        if (!k->fail_status && k->body.n + n > s->max_body) {
            k->fail_status = 413;
            snprintf(k->fail_msg, sizeof k->fail_msg, "the body is larger than %zu bytes", s->max_body);
        }
        if (k->fail_status) {                        /* read to its end, up to a limit */
            k->dropped += n;
            if (k->dropped > 4 * s->max_body) {
                k->failed = 1;
                return raw_error(s, k->fd, k->fail_status, k->fail_status == 413 ? "Content Too Large" :
                                 "Internal Server Error", k->fail_msg);
            }
            return MHD_YES;
        }
        if (srv_buf_add(&k->body, upload, n)) { k->fail_status = 500; snprintf(k->fail_msg, sizeof k->fail_msg, "out of memory"); }
        return MHD_YES;
    }
    if (k->job) return api_finish(s, k, c);         /* resumed: its answer is made */
    if (k->failed) return MHD_YES;                   /* its error is queued already */
    srv_door_deadline(s, c, 0, 0);                   /* the request is in */
    if (k->fail_status) {
        k->failed = 1;
        return send_error_api(s, c, api_of(k->r), k->fail_status, k->fail_msg, NULL, NULL);
    }
    count(s, k->r);
    switch (k->r) {
    case R_CHAT:
    case R_COMPLETION:
    case R_MESSAGES:
        return api_post(s, k, c);
    case R_RESPONSES: {
        if (!k->resp_id[0]) return api_post(s, k, c);
        char msg[300] = "";
        int st = 0;
        char *doc = srv_responses_get(k->resp_id, k->resp_del, &st, msg, sizeof msg);
        if (!doc) return send_error_api(s, c, &srv_api_responses, st ? st : 500, msg[0] ? msg : "out of memory",
                                        NULL, NULL);
        return send_json(c, 200, doc);
    }
    case R_COUNT_TOKENS: {
        char msg[1200] = "";
        int st = 0;
        char *doc = srv_messages_count_tokens(s, k->body.p ? k->body.p : "", k->body.n, &st, msg, sizeof msg);
        if (!doc) return send_error_api(s, c, &srv_api_messages, st ? st : 500, msg[0] ? msg : "out of memory",
                                        NULL, NULL);
        return send_json(c, 200, doc);
    }
    case R_MODELS:
        return send_json(c, 200, srv_api_models_json(s));
    case R_HEALTH: {
        /* "degraded": a weight failed its hash or its read during a request; the server answers every
           request that does not need it (the last such failure is named) */
        pthread_mutex_lock(&s->mu);
        char *h = NULL;
        json_t *doc = json_pack("{s:s,s:b,s:i,s:i,s:i}", "status", s->stopping ? "stopping" :
                                s->damage[0] ? "degraded" : "ok", "busy", s->running > 0, "queue", (int)s->q_n,
                                "slots", (int)s->n_slots, "slots_busy", (int)s->running);
        if (doc && s->n_slots > 1) {             /* [slot] generated tokens per second of its jobs */
            json_t *tps = json_array();
            for (uint32_t i = 0; i < s->n_slots; i++)
                json_array_append_new(tps, json_real(s->slots[i].busy_s > 0 ? (double)s->slots[i].tokens /
                                                     s->slots[i].busy_s : 0.0));
            json_object_set_new(doc, "slot_tokens_per_second", tps);
        }
        if (doc && s->damage[0]) {
            json_object_set_new(doc, "damage", json_string(s->damage));
            json_object_set_new(doc, "damage_errors", json_integer((json_int_t)s->mt.damage_errors));
        }
        pthread_mutex_unlock(&s->mu);
        if (doc) h = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(doc);
        return send_json(c, 200, h);
    }
    case R_METRICS: {
        char *t = srv_api_metrics_text(s);
        if (!t) return send_error(s, c, 500, "out of memory");
        return send_body(c, 200, "text/plain; version=0.0.4", t, strlen(t), 1, NULL, NULL);
    }
    case R_PAGE:
        return send_body(c, 200, "text/html; charset=utf-8", (char *)k3_serve_page, k3_serve_page_len, 0,
                         "Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; "
                         "style-src 'unsafe-inline'; connect-src 'self'");
    default:
        return send_error(s, c, 404, "no such endpoint");
    }
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    srv *s = cls;
    (void)toe;
    conn *k = *con_cls;
    if (!k) return;
    srv_door_deadline(s, c, s->header_timeout_s, 0); /* a kept-alive connection's next request */
    if (k->job) {                                    /* closed while its answer was made */
        pthread_mutex_lock(&s->mu);
        k->job->cancel = 1;
        srv_job_unref(s, k->job);
        s->active--;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    if (k->counted) {
        pthread_mutex_lock(&s->mu);
        s->active--;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    free(k->body.p);
    free(k);
    *con_cls = NULL;
}

int srv_http_start(srv *s)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV},
                    *ai = NULL;
    char port[8];
    snprintf(port, sizeof port, "%u", s->port);
    int g = getaddrinfo(s->host, port, &hints, &ai);
    if (g || !ai) {
        k3_error("--host %s: %s", s->host, g ? gai_strerror(g) : "no address");
        return K3_EXIT_USAGE;
    }
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    if (s->tls_cert) flags |= MHD_USE_TLS;
    struct MHD_OptionItem tls[] = {
        {s->tls_cert ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, 0, s->tls_cert},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, s->tls_key},
        {MHD_OPTION_END, 0, NULL},
    };
    if (srv_door_start(s)) {
        freeaddrinfo(ai);
        k3_error("cannot start a thread: %s", strerror(errno));
        return K3_EXIT_IO;
    }
    s->mhd = MHD_start_daemon(flags, s->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                              MHD_OPTION_THREAD_POOL_SIZE, (unsigned)SRV_POOL_THREADS,
                              MHD_OPTION_CONNECTION_LIMIT, s->max_conns + SRV_CONN_SPARE,
                              /* idle past --timeout: a second later than the waker's deadlines, which answer */
                              MHD_OPTION_CONNECTION_TIMEOUT, s->timeout_s + 1,
                              MHD_OPTION_NOTIFY_CONNECTION, srv_door_notify, s,
                              MHD_OPTION_NOTIFY_COMPLETED, on_done, s,
                              MHD_OPTION_ARRAY, tls, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->mhd) {
        srv_door_stop(s);
        if (s->tls_cert) {
            k3_error("cannot listen with TLS on %s port %u: the certificate and key do not load (PEM files of one "
                     "pair?) or the address is in use", s->host, s->port);
            return K3_EXIT_IO;
        }
        k3_error("cannot listen on %s port %u: %s", s->host, s->port,
                 errno ? strerror(errno) : "the address is in use or not this machine's");
        return K3_EXIT_IO;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    if (di) s->port = di->port;
    return 0;
}

void srv_http_quiesce(srv *s)
{
    if (s->mhd) {
        MHD_socket fd = MHD_quiesce_daemon(s->mhd);
        if (fd != MHD_INVALID_SOCKET) close(fd);
    }
}

void srv_http_stop(srv *s)
{
    srv_door_stop(s);
    if (s->mhd) MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
}

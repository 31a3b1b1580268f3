/*
 * serve_door.c - the connections of `k3run serve` (serve_impl.h): one record per
 * client connection from accept to close, the caps on connections (per client
 * address and in all), the deadline of a request's arrival, and the connections
 * that wait for a job's output.
 *
 * libmicrohttpd runs a small pool of threads over epoll (serve_http.c); no
 * connection owns a thread. A connection waiting for its answer is suspended
 * (out of the event loop, holding nothing but its socket), and the waker thread
 * here resumes it when its job has output or is done: the generation already
 * wakes the server's condition variable for both. The waker also watches the
 * clients of waiting connections (one that left cancels its job) and closes a
 * connection whose request has not arrived by its deadline, however many bytes
 * it trickles: a slow client costs a socket and a record, never a worker.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "k3_sys.h"
#include "serve_impl.h"

#define DOOR_TICK_MS 100          /* how often the waker looks at deadlines and waiting clients */

/* One client connection. */
struct srv_sock {
    struct srv_sock *prev, *next;
    struct MHD_Connection *c;
    int fd;
    struct sockaddr_storage addr; /* the client's address (the per-address cap) */
    socklen_t addr_len;
    double deadline;              /* the request must have arrived by then (0: none) */
    int body;                     /* the deadline is its body's (--timeout): a 408 says so */
    int refused;                  /* over a cap: its request gets a 503 */
    srv_job *wait;                /* suspended until this job has output or is done (NULL: not waiting) */
};

/* ---- addresses ------------------------------------------------------------------- */

static socklen_t addr_len(const struct sockaddr *a)
{
    return a->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

/* The same client address (the port aside). */
static int same_addr(const struct sockaddr_storage *x, const struct sockaddr_storage *y)
{
    if (x->ss_family != y->ss_family) return 0;
    if (x->ss_family == AF_INET)
        return ((const struct sockaddr_in *)x)->sin_addr.s_addr == ((const struct sockaddr_in *)y)->sin_addr.s_addr;
    if (x->ss_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)x)->sin6_addr, &((const struct sockaddr_in6 *)y)->sin6_addr,
                       sizeof(struct in6_addr));
    return 0;
}

/* ---- the records ------------------------------------------------------------------ */

void srv_door_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                     enum MHD_ConnectionNotificationCode toe)
{
    srv *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        srv_sock *k = calloc(1, sizeof *k);
        *socket_context = k;
        if (!k) return;
        k->c = c;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        k->fd = ci ? ci->connect_fd : -1;
        ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (ci && ci->client_addr) {
            k->addr_len = addr_len(ci->client_addr);
            memcpy(&k->addr, ci->client_addr, k->addr_len);
        }
        pthread_mutex_lock(&s->mu);
        unsigned same = 0;
        for (srv_sock *o = s->socks; o; o = o->next) same += !o->refused && same_addr(&o->addr, &k->addr);
        if (s->n_socks >= s->max_conns) {
            k->refused = 1;
            s->mt.refused_conns++;
        } else if (same >= s->max_conns_per_ip) {
            k->refused = 2;
            s->mt.refused_conns++;
        }
        /* a refused connection that does not send its request at once is not waited for */
        k->deadline = k3_now() + (k->refused ? 1.0 : s->header_timeout_s);
        k->next = s->socks;
        if (s->socks) s->socks->prev = k;
        s->socks = k;
        s->n_socks++;
        pthread_mutex_unlock(&s->mu);
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        srv_sock *k = *socket_context;
        if (!k) return;
        pthread_mutex_lock(&s->mu);
        if (k->prev) k->prev->next = k->next;
        else s->socks = k->next;
        if (k->next) k->next->prev = k->prev;
        s->n_socks--;
        pthread_mutex_unlock(&s->mu);
        free(k);
        *socket_context = NULL;
    }
}

srv_sock *srv_door_sock(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

int srv_door_refused(srv *s, struct MHD_Connection *c, char *msg, size_t cap)
{
    srv_sock *k = srv_door_sock(c);
    if (!k || !k->refused) return 0;
    if (k->refused == 1)
        snprintf(msg, cap, "the server holds %u connections, its most (k3run serve --max-conns); retry later",
                 s->max_conns);
    else
        snprintf(msg, cap, "this address holds %u connections, the most one client may (k3run serve "
                 "--max-conns-per-ip); retry later", s->max_conns_per_ip);
    return 1;
}

void srv_door_deadline(srv *s, struct MHD_Connection *c, double seconds, int body)
{
    srv_sock *k = srv_door_sock(c);
    if (!k) return;
    pthread_mutex_lock(&s->mu);
    k->deadline = seconds > 0 ? k3_now() + seconds : 0;
    k->body = body;
    pthread_mutex_unlock(&s->mu);
}

void srv_door_wait(srv *s, struct MHD_Connection *c, srv_job *j)
{
    (void)s;                                      /* its lock is held */
    srv_sock *k = srv_door_sock(c);
    if (!k) return;                               /* cannot happen: every connection has its record */
    k->wait = j;
    k->deadline = 0;
    MHD_suspend_connection(c);
}

/* An error written straight to the socket, for a request given up while its body still comes in:
   libmicrohttpd sends no response queued before the body's end, it only closes. Takes no lock
   (the waker calls it holding mu); the caller closes the connection. */
void srv_raw_error(int fd, int tls, int status, const char *reason, const char *msg)
{
    char *e = srv_api_error_json(status, msg), *r = NULL;
    int n = e ? asprintf(&r, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                         "Connection: close\r\n\r\n%s", status, reason, strlen(e), e) : -1;
    if (n > 0 && fd >= 0 && !tls) {             /* under TLS the socket carries records: just close */
        ssize_t w = send(fd, r, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)w;
        shutdown(fd, SHUT_WR);
    }
    free(r);
    free(e);
}

/* ---- the waker ------------------------------------------------------------------------ */

/* The client closed its side (or the connection broke). */
int srv_peer_gone(int fd)
{
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static void *waker(void *arg)
{
    srv *s = arg;
    double last_look = 0;
    pthread_mutex_lock(&s->mu);
    while (!s->door_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += DOOR_TICK_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        double now = k3_now();
        int look = now - last_look >= DOOR_TICK_MS * 1e-3;
        if (look) last_look = now;
        for (srv_sock *k = s->socks; k; k = k->next) {
            srv_job *j = k->wait;
            if (j) {
                if (look && j->state != SRV_DONE && !j->cancel && srv_peer_gone(k->fd)) j->cancel = 1;
                if (j->stream && j->t_out > 0 && j->state != SRV_DONE && !j->cancel && j->out.n == j->sent &&
                    j->api->keepalive && now - j->t_out >= s->keepalive_s) {
                    srv_buf_add(&j->out, j->api->keepalive, strlen(j->api->keepalive));   /* resumed below */
                    j->t_out = now;
                }
                if (j->state == SRV_DONE || (j->stream && j->out.n > j->sent)) {
                    k->wait = NULL;                   /* MHD keeps a suspended connection until it is resumed */
                    MHD_resume_connection(k->c);
                }
            } else if (look && k->deadline && now > k->deadline) {
                /* its request did not arrive in time: the event loop sees the end of the stream and closes
                   it. A body under way is told why (the event loop writes nothing while a body comes in);
                   a header is not (an idle kept-alive connection would read the 408 as its next answer). */
                k->deadline = 0;
                if (k->body) {
                    char m[200];
                    snprintf(m, sizeof m, "the body did not arrive within %u s (k3run serve --timeout)", s->timeout_s);
                    srv_raw_error(k->fd, s->tls_cert != NULL, 408, "Request Timeout", m);
                    s->mt.errors[408]++;
                }
                shutdown(k->fd, SHUT_RDWR);
                s->mt.timed_out_conns++;
            }
        }
    }
    /* the listener stops: every waiting connection goes back to it (MHD refuses to stop with one suspended) */
    for (srv_sock *k = s->socks; k; k = k->next)
        if (k->wait) {
            k->wait = NULL;
            MHD_resume_connection(k->c);
        }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int srv_door_start(srv *s)
{
    const char *ka = getenv("K3_TEST_KEEPALIVE_MS");
    s->keepalive_s = ka && *ka ? atof(ka) * 1e-3 : SRV_KEEPALIVE_S;
    s->door_stop = 0;
    if (pthread_create(&s->door_th, NULL, waker, s)) return -1;
    s->door_on = 1;
    return 0;
}

void srv_door_stop(srv *s)
{
    if (!s->door_on) return;
    pthread_mutex_lock(&s->mu);
    s->door_stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->door_th, NULL);
    s->door_on = 0;
}

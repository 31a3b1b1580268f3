/*
 * batch_cli.c - `k3run batch`: a file of requests in the OpenAI Batch API's
 * input format answered through the server's slots (serve_slots.c), the
 * answers in the Batch API's output format (docs/k3run-batch.md).
 *
 * Each request goes through the server's own checks (srv_api_parse) and run
 * (srv_api_run), so its body is the one `k3run serve` answers. Lines are
 * written whole, each with one write(2) on a file opened for appending, then
 * synced: a kill at any moment loses at most the requests in flight, and a
 * torn last line (a kill inside the write) is cut off by the next run, which
 * skips every custom_id already answered.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "k3_log.h"
#include "k3_sys.h"
#include "serve_impl.h"

enum { OPT_OUT = SRV_OPT__END };

static const k3_opt opts[] = {
    SRV_GEN_OPTS,
    {OPT_OUT, 'o', "output", "OUT.jsonl", NULL, NULL,
     "the answers, one JSON line per request (appended; a rerun skips the custom_ids already there)"},
    K3_OPTS_COMMON,
};
#define N_OPTS ((int)(sizeof opts / sizeof opts[0]))

static const char purpose[] =
    "Answer a file of requests in the OpenAI Batch API's input format: one JSON\n"
    "object per line with custom_id, method (POST), url (/v1/chat/completions or\n"
    "/v1/completions) and body. Each answer is a line of OUT in the Batch API's\n"
    "output format (custom_id, response with status_code and body, or error),\n"
    "its body the one `k3run serve` gives for the same request. --parallel S\n"
    "answers S requests together, sharing each forward pass. A rerun with the same\n"
    "OUT goes on where the last one stopped; a bad line gets its error line and\n"
    "the others go on; a custom_id given twice is refused before anything runs.\n"
    "Exit status: 0 every request has its line (errors included), 1 interrupted,\n"
    "2 usage or a bad input file, 3 a file could not be read or written.";

static const char footer[] =
    "Examples:\n"
    "  k3run batch -m ~/packs/k3 requests.jsonl -o answers.jsonl --parallel 4\n"
    "  printf '%s\\n' '{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"Hi\"}}' "
    "> in.jsonl\n";

/* One request line. */
typedef struct req {
    uint32_t line;                 /* 1-based */
    char *custom_id;               /* NULL: the line has none */
    srv_kind kind;
    char *body;                    /* the body as JSON text (NULL: the line is bad, see err) */
    char err[512];
    int done;                      /* answered in OUT already (or now) */
} req;

typedef struct batch {
    srv s;
    const char *in_path, *out_path;
    int out_fd;
    req *r;                        /* [n] */
    uint32_t n, todo, written, errors;
    double t0;
    int tty, io_failed;
    pthread_mutex_t wmu;           /* the output file and the counters above */
} batch;

static volatile sig_atomic_t interrupted;

static void free_requests(batch *b)
{
    for (uint32_t i = 0; i < b->n; i++) { free(b->r[i].custom_id); free(b->r[i].body); }
    free(b->r);
    b->r = NULL;
    b->n = 0;
}

/* One line of the input (len bytes, no newline): its custom_id (NULL: none), kind and body (JSON
   text), or err[cap] saying what is wrong with it. -1 only when out of memory. */
int srv_batch_line(const char *line, size_t len, uint32_t no, char **custom_id, srv_kind *kind, char **body_out,
                   char *err, size_t cap)
{
    int rc = 0;
    *custom_id = *body_out = NULL;
    err[0] = 0;
    json_error_t je;
    json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
    json_t *id = o ? json_object_get(o, "custom_id") : NULL;
    if (json_is_string(id) && !(*custom_id = strdup(json_string_value(id)))) rc = -1;
    const char *url = o ? json_string_value(json_object_get(o, "url")) : NULL;
    const char *method = o ? json_string_value(json_object_get(o, "method")) : NULL;
    json_t *body = o ? json_object_get(o, "body") : NULL;
    if (!o) snprintf(err, cap, "line %u is not JSON: %s (column %d)", no, je.text, je.column);
    else if (!json_is_object(o)) snprintf(err, cap, "line %u is not a JSON object", no);
    else if (!*custom_id) snprintf(err, cap, "line %u has no custom_id string", no);
    else if (!method || strcmp(method, "POST"))
        snprintf(err, cap, "line %u: method must be \"POST\"", no);
    else if (!url || (strcmp(url, "/v1/chat/completions") && strcmp(url, "/v1/completions")))
        snprintf(err, cap, "line %u: url must be \"/v1/chat/completions\" or \"/v1/completions\"", no);
    else if (!json_is_object(body)) snprintf(err, cap, "line %u: body must be a JSON object", no);
    else {
        *kind = strcmp(url, "/v1/completions") ? SRV_CHAT : SRV_COMPLETION;
        if (!(*body_out = json_dumps(body, JSON_COMPACT))) rc = -1;
    }
    json_decref(o);
    k3_escape_ctl_in_place(err, cap);
    return rc;
}

/* The input: every non-empty line checked; K3_OK, or a refusal naming the file and line. */
static k3_err read_input(batch *b, k3_diag *d)
{
    FILE *f = fopen(b->in_path, "rb");
    if (!f) return k3_fail(d, K3_ERR_IO, "%s: %s", b->in_path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    uint32_t no = 0;
    k3_err e = K3_OK;
    while (!e && (len = getline(&line, &cap, f)) >= 0) {
        no++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        req *r = realloc(b->r, (b->n + 1) * sizeof *b->r);
        if (!r) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); break; }
        b->r = r;
        r = &b->r[b->n++];
        memset(r, 0, sizeof *r);
        if (srv_batch_line(line, (size_t)len, no, &r->custom_id, &r->kind, &r->body, r->err, sizeof r->err))
            e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
        r->line = no;
    }
    free(line);
    if (!e && ferror(f)) e = k3_fail(d, K3_ERR_IO, "%s: %s", b->in_path, strerror(errno));
    fclose(f);
    /* a custom_id twice: refused before anything runs */
    for (uint32_t i = 0; !e && i < b->n; i++)
        for (uint32_t j = i + 1; !e && j < b->n && b->r[i].custom_id; j++)
            if (b->r[j].custom_id && !strcmp(b->r[i].custom_id, b->r[j].custom_id))
                e = k3_fail(d, K3_ERR_USAGE, "%s: the custom_id \"%s\" is on lines %u and %u (each must be unique)",
                            b->in_path, b->r[i].custom_id, b->r[i].line, b->r[j].line);
    return e;
}

/* The answers already in OUT: their custom_ids are done; a torn last line is cut off. */
static k3_err read_output(batch *b, k3_diag *d)
{
    int fd = open(b->out_path, O_RDWR);
    if (fd < 0) return errno == ENOENT ? K3_OK : k3_fail(d, K3_ERR_IO, "%s: %s", b->out_path, strerror(errno));
    FILE *f = fdopen(fd, "rb");
    if (!f) { close(fd); return k3_fail(d, K3_ERR_IO, "%s: %s", b->out_path, strerror(errno)); }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    off_t good = 0;
    uint32_t no = 0;
    k3_err e = K3_OK;
    while (!e && (len = getline(&line, &cap, f)) >= 0) {
        no++;
        if (line[len - 1] != '\n') break;                 /* torn: written by a run that was killed */
        json_t *o = json_loadb(line, (size_t)len - 1, 0, NULL);
        const char *id = o ? json_string_value(json_object_get(o, "custom_id")) : NULL;
        if (!o || !json_object_get(o, "custom_id")) {
            e = k3_fail(d, K3_ERR_USAGE, "%s: line %u is not an answer of k3run batch; give another -o (nothing "
                        "was changed)", b->out_path, no);
        } else {
            json_t *ln = json_object_get(o, "input_line");     /* the error line of a line without an id */
            for (uint32_t i = 0; i < b->n; i++)
                if (id ? b->r[i].custom_id && !strcmp(b->r[i].custom_id, id)
                       : !b->r[i].custom_id && json_is_integer(ln) && json_integer_value(ln) == b->r[i].line)
                    b->r[i].done = 1;
            good += len;
        }
        json_decref(o);
    }
    free(line);
    struct stat st;
    if (!e && fstat(fd, &st) == 0 && st.st_size > good) {
        k3_warn("%s: its last line was torn (a run was stopped while writing it): cut off", b->out_path);
        if (ftruncate(fd, good)) e = k3_fail(d, K3_ERR_IO, "%s: %s", b->out_path, strerror(errno));
    }
    fclose(f);
    return e;
}

/* n bytes to fd, however many write(2) calls it takes: 0, or -1 with errno. */
static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Write one line whole and sync it (wmu held). */
static void put_line(batch *b, json_t *o)
{
    char *t = json_dumps(o, JSON_COMPACT);
    size_t n = t ? strlen(t) : 0;
    if (t) t[n++] = '\n';                              /* json_dumps leaves room for its NUL */
    if (!t || write_all(b->out_fd, t, n) || fdatasync(b->out_fd)) {
        if (!b->io_failed) k3_error("%s: %s", b->out_path, t ? strerror(errno) : "out of memory");
        b->io_failed = 1;
        interrupted = 1;
    }
    free(t);
}

static void progress(batch *b)
{
    if (!b->tty) return;
    double dt = k3_now() - b->t0;
    double rate = dt > 0 ? b->written / dt : 0;
    double eta = rate > 0 ? (b->todo - b->written) / rate : 0;
    fprintf(stderr, "\r%s: %u/%u answered, %.1f tokens/s, ETA %d:%02d   ", k3_log_prog(), b->written, b->todo,
            dt > 0 ? b->s.mt.completion_tokens / dt : 0.0, (int)eta / 60, (int)eta % 60);
}

/* A line for request r: the answer (status, body) or the error of the line itself. */
static void write_answer(batch *b, const req *r, int status, const char *body, size_t len, const char *job_id)
{
    static uint32_t seq;
    char id[40];
    pthread_mutex_lock(&b->wmu);
    snprintf(id, sizeof id, "batch_req_%u_%u", r->line, ++seq);
    json_t *o;
    if (status) {
        json_t *bj = json_loadb(body, len, 0, NULL);
        o = json_pack("{s:s,s:s?,s:{s:i,s:s,s:o},s:n}", "id", id, "custom_id", r->custom_id, "response", "status_code",
                      status, "request_id", job_id ? job_id : id, "body", bj ? bj : json_object(), "error");
        if (status != 200) b->errors++;
    } else {
        o = json_pack("{s:s,s:s?,s:n,s:{s:s,s:s},s:i}", "id", id, "custom_id", r->custom_id, "response", "error",
                      "code", "invalid_request", "message", r->err, "input_line", r->line);
        b->errors++;
    }
    if (o) put_line(b, o);
    json_decref(o);
    b->written++;
    progress(b);
    pthread_mutex_unlock(&b->wmu);
}

/* A job ran (its slot's thread): its line, unless it was stopped before its end. */
static void on_done(srv *s, srv_job *j)
{
    batch *b = s->user;
    const req *r = j->tag;
    if (j->cancel) return;                             /* interrupted: the next run does it again */
    pthread_mutex_lock(&s->mu);
    size_t n = j->out.n;
    char *body = n ? malloc(n) : NULL;
    if (body) memcpy(body, j->out.p, n);
    int status = j->status ? j->status : 500;
    pthread_mutex_unlock(&s->mu);
    write_answer(b, r, status, body ? body : "{}", body ? n : 2, j->id);
    free(body);
}

/* SIGINT / SIGTERM: the answers in progress stop (not written), the queue is left for a rerun. */
static void *signals(void *arg)
{
    srv *s = arg;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGUSR1);                          /* the end of the run: this thread's own way out */
    int sig = 0;
    sigwait(&set, &sig);
    if (sig == SIGUSR1) return NULL;
    interrupted = 1;
    srv_stop(s);
    return NULL;
}

static int run(batch *b)
{
    srv *s = &b->s;
    k3_diag d;
    /* every request not yet answered: checked by the server's own rules, queued */
    s->ring = b->n + s->n_slots + 1;
    if (!(s->queue = calloc(s->ring, sizeof *s->queue))) return srv_fail(k3_fail(&d, K3_ERR_NOMEM, "out of memory"), &d);
    for (uint32_t i = 0; i < b->n; i++) {
        req *r = &b->r[i];
        if (r->done) continue;
        b->todo++;
        if (!r->body) { write_answer(b, r, 0, NULL, 0, NULL); continue; }
        char msg[1200] = "";
        srv_job *j = NULL;
        int st = srv_api_parse(s, r->kind, r->body, strlen(r->body), &j, msg, sizeof msg);
        if (!st && j->stream) {
            st = 400;
            snprintf(msg, sizeof msg, "'stream' is not available in a batch: the answer is one line");
            srv_job_unref(s, j);
        }
        if (st) {
            char *e = srv_api_error_json(st, msg);
            write_answer(b, r, st, e ? e : "{}", e ? strlen(e) : 2, NULL);
            free(e);
            continue;
        }
        j->tag = r;
        j->refs = 2;                                   /* the slot's and this loop's */
        j->state = SRV_QUEUED;
        s->queue[(s->q_head + s->q_n++) % s->ring] = j;
    }
    srv_job **all = calloc(s->q_n + 1, sizeof *all);   /* to free them at the end */
    uint32_t n_all = s->q_n;
    for (uint32_t i = 0; all && i < n_all; i++) all[i] = s->queue[(s->q_head + i) % s->ring];
    s->drain = 1;
    s->on_done = on_done;
    s->user = b;
    srv_slots_run(s);
    pthread_mutex_lock(&s->mu);
    while (s->q_n) {                                   /* left by an interruption */
        srv_job *j = s->queue[s->q_head];
        s->q_head = (s->q_head + 1) % s->ring;
        s->q_n--;
        srv_job_unref(s, j);
    }
    for (uint32_t i = 0; all && i < n_all; i++) srv_job_unref(s, all[i]);
    pthread_mutex_unlock(&s->mu);
    free(all);
    return 0;
}

int k3_batch_main(int argc, char **argv)
{
    k3_args a;
    k3_diag d;
    batch b;
    memset(&b, 0, sizeof b);
    srv *s = &b.s;
    int rc;
    if (k3_opts_parse(opts, N_OPTS, argc, argv, &a, &d)) return k3_usage_error("%s", d.msg);
    if (k3_opt_count(&a, K3_OPT_HELP)) {
        k3_opts_help(stdout, "k3run batch -m PACK IN.jsonl -o OUT.jsonl [--parallel S] [OPTIONS]", purpose, opts,
                     N_OPTS, footer);
        return K3_EXIT_OK;
    }
    if (k3_opt_count(&a, K3_OPT_VERSION)) { k3_cli_version(NULL); return 0; }
    if (a.n_pos != 1) return k3_usage_error(a.n_pos ? "one input file, not %d" : "no input: give IN.jsonl", a.n_pos);
    b.in_path = a.pos[0];
    if (!(b.out_path = k3_opt_str(&a, OPT_OUT))) return k3_usage_error("no output: give -o OUT.jsonl");
    if ((rc = srv_configure_gen(s, &a))) return rc;
    k3_err e = read_input(&b, &d);
    if (!e) e = read_output(&b, &d);
    if (e) {
        k3_error("%s", d.msg);
        free_requests(&b);
        return e == K3_ERR_USAGE ? K3_EXIT_USAGE : k3_exit_code(e);
    }
    uint32_t left = 0;
    for (uint32_t i = 0; i < b.n; i++) left += !b.r[i].done;
    if (left < b.n && k3_log_level() >= 1)
        fprintf(stderr, "%s: %u of %u request(s) already answered in %s\n", k3_log_prog(), b.n - left, b.n, b.out_path);
    b.out_fd = open(b.out_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (b.out_fd < 0) {
        k3_error("%s: %s", b.out_path, strerror(errno));
        free_requests(&b);
        return K3_EXIT_IO;
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_init(&b.wmu, NULL);
    b.tty = isatty(2) && k3_log_level() >= 1;
    rc = left ? srv_load(s) : 0;
    pthread_t sig;
    int have_sig = !rc && left && pthread_create(&sig, NULL, signals, s) == 0;
    b.t0 = k3_now();
    if (!rc && left) rc = run(&b);
    if (have_sig) {
        pthread_kill(sig, SIGUSR1);
        pthread_join(sig, NULL);
    }
    if (b.tty) fprintf(stderr, "\n");
    double dt = k3_now() - b.t0;
    uint64_t tokens = s->mt.completion_tokens;
    if (!rc && k3_log_level() >= 1)
        fprintf(stderr, "%s: %u request(s) answered (%u with an error) in %.1f s, %llu tokens generated (%.1f/s)%s\n",
                k3_log_prog(), b.written, b.errors, dt, (unsigned long long)tokens, dt > 0 ? tokens / dt : 0.0,
                interrupted ? "; interrupted: rerun the same command to answer the rest" : "");
    close(b.out_fd);
    srv_unload(s);
    free_requests(&b);
    if (rc) return rc;
    if (b.io_failed) return K3_EXIT_IO;
    return interrupted ? 1 : 0;
}

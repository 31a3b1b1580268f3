/*
 * serve_slots.c - the slots (serve_impl.h): bringing the model up with one
 * chat per slot, choosing the slot of a queued job, and running the slots
 * until the shutdown (k3run serve) or until the queue is empty (k3run batch).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_args.h"
#include "k3_log.h"
#include "k3_sys.h"
#include "serve_impl.h"

int srv_fail(k3_err e, const k3_diag *d)
{
    k3_error("%s", d->msg);
    return k3_exit_code(e);
}

int srv_configure_gen(srv *s, const k3_args *a)
{
    int rc;
    if (!(s->pack = k3_opt_str(a, SRV_OPT_MODEL))) return k3_usage_error("no model: give the pack with -m PACK");
    static const k3_cli_gen_ids ids = {SRV_OPT_N, SRV_OPT_THINK_BUDGET, SRV_OPT_THREADS, SRV_OPT_CONTEXT,
                                       SRV_OPT_BATCH, SRV_OPT_SNAPSHOTS, SRV_OPT_DRAFT, SRV_OPT_TOPK, SRV_OPT_TEMP,
                                       SRV_OPT_TOPP, SRV_OPT_MINP, SRV_OPT_REPEAT, SRV_OPT_SEED, SRV_OPT_BUDGET,
                                       SRV_OPT_PRESET, SRV_OPT_VERIFY, SRV_OPT_NO_VERIFY_READS};
    k3_cli_gen g = {.so = &s->so};
    if ((rc = k3_cli_u32(a, SRV_OPT_PARALLEL, 1, 1, K3_SERVE_SLOTS_MAX, "parallel", &s->n_slots)) ||
        (rc = k3_cli_gen_parse(a, &ids, s->pack, "generating text", &g, &s->lo)))
        return rc;
    s->so_from = g.so_from;
    s->co.n_predict = g.n_predict;
    s->co.think_budget = g.think_budget;
    s->threads = g.threads;
    s->lo.n_seq = s->n_slots;
    s->snapshots = s->lo.snapshots;              /* each slot's, and one for its shared prefix (counted) */
    s->lo.snapshots = k3_plan_slot_snapshots(s->snapshots);
    s->model_name = k3_opt_str(a, SRV_OPT_NAME);
    if (!s->model_name) {                        /* the pack directory's last name */
        static char name[256];
        size_t n = strlen(s->pack);
        while (n > 1 && s->pack[n - 1] == '/') n--;
        size_t b = n;
        while (b > 0 && s->pack[b - 1] != '/') b--;
        snprintf(name, sizeof name, "%.*s", (int)(n - b), s->pack + b);
        s->model_name = name;
    }
    return 0;
}

int srv_load(srv *s)
{
    k3_diag d;
    k3_err e;
    int usage = 0;
    double t0 = k3_now();
    if ((e = k3_tok_load_dir(s->pack, &s->tok, &d))) return srv_fail(e, &d);
    if ((e = k3_load_plan(&s->lo, &s->ld, &usage, &d))) return usage ? k3_usage_error("%s", d.msg) : srv_fail(e, &d);
    if ((e = k3_load_model(&s->lo, &s->ld, &d))) return srv_fail(e, &d);
    if (!(s->slots = calloc(s->n_slots, sizeof *s->slots))) return srv_fail(k3_fail(&d, K3_ERR_NOMEM, "out of memory"), &d);
    for (uint32_t i = 0; i < s->n_slots; i++) {
        srv_slot *sl = &s->slots[i];
        sl->s = s;
        sl->idx = i;
        sl->h = k3_model_seq(s->ld.m, i);
        if ((e = k3_chat_new(sl->h, s->tok, &s->so, s->snapshots, &sl->chat, &d))) return srv_fail(e, &d);
        if (s->snapshots && (e = k3_chat_keep_prefix(sl->chat, &d))) return srv_fail(e, &d);
        k3_chat_set_draft(sl->chat, s->ld.plan.verify_tokens ? s->ld.plan.verify_tokens - 1 : 0,
                          k3_dec_rho(&s->ld.plan, s->ld.geo));
    }
    if (s->n_slots > 1 && (e = k3_batcher_new(s->ld.m, 0, &s->bat, &d))) return srv_fail(e, &d);
    s->eos = k3w_config(s->ld.w)->eos_token_id;
    s->context = k3_model_context(s->ld.m);
    k3w_stats(s->ld.w, &s->w_base);
    s->t_load = k3_now() - t0 - s->ld.t_verify;
    return 0;
}

void srv_stop(srv *s)
{
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    for (uint32_t i = 0; i < s->n_slots; i++)
        if (s->slots[i].job) s->slots[i].job->cancel = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void srv_unload(srv *s)
{
    k3_batcher_free(s->bat);
    for (uint32_t i = 0; s->slots && i < s->n_slots; i++) k3_chat_free(s->slots[i].chat);
    free(s->slots);
    k3_loaded_free(&s->ld);
    k3_tok_free(s->tok);
    free(s->queue);
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
    if (!s->q_n || sl->help) return 0;
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
        /* rank: 3 holds the conversation; 2 shares more than half of what it holds and serves more
           of it from a kept state than its shared prefix (which an empty slot could take too:
           take_prefix): a conversation edited or branched, the slot losing less than it keeps; 1
           empty (the others keep their caches); 0 else; then the prefix; then the oldest use */
        uint64_t rank = nh && (len == nh || len == np) ? 3
                        : nh && 2 * (uint64_t)len > nh &&
                          k3_chat_cached_for(o->chat, p, np) > k3_chat_prefix_for(o->chat, p, np) ? 2
                        : nh == 0 ? 1 : 0;
        uint64_t key = rank << 62 | (uint64_t)len << 30 | (uint64_t)((1u << 30) - 1 - (o->used & ((1u << 30) - 1)));
        if (best < 0 || key > best_key) { best = (int)i; best_key = key; }
    }
    return best == (int)sl->idx;
}

/* Before sl runs chat job j (its thread; mu not held, sl not yet in the passes): where another slot's
   shared prefix (the tools and system messages its last conversation began with) covers more of
   j's prompt than sl holds, sl takes that state instead of processing those tokens again. */
static void take_prefix(srv *s, srv_slot *sl, const srv_job *j)
{
    if (s->n_slots < 2 || !s->snapshots || j->kind != SRV_CHAT || !j->route) return;
    uint32_t nh = 0;
    const int32_t *h = k3_chat_held(sl->chat, &nh);
    uint32_t have = common_prefix(h, nh, j->route, j->n_route), best = 0;
    srv_slot *from = NULL;
    for (uint32_t i = 0; i < s->n_slots; i++) {
        uint32_t at = &s->slots[i] == sl ? 0 : k3_chat_prefix_for(s->slots[i].chat, j->route, j->n_route);
        if (at > have && at > best) { best = at; from = &s->slots[i]; }
    }
    uint32_t taken = 0;
    k3_diag d;
    if (from && k3_chat_take_prefix(sl->chat, from->chat, j->route, j->n_route, &taken, &d))
        k3_warn("slot %u: the shared prefix of slot %u not taken: %s", sl->idx, from->idx, d.msg);
    if (taken) k3_debug("slot %u: took %u tokens of tools and system messages from slot %u", sl->idx, taken,
                        from->idx);
}

/* Slot sl works on j (mu held, and held again on return): the whole job (choice < 0), or one
   choice of another slot's job (n > 1) once that slot has forked its state here. */
static void work(srv *s, srv_slot *sl, srv_job *j, int choice)
{
    sl->job = j;
    sl->used = ++s->uses;
    s->running++;
    pthread_mutex_unlock(&s->mu);
    double t0 = k3_now();
    if (choice < 0) take_prefix(s, sl, j);
    if (s->bat) k3_batcher_attach(s->bat, sl->h);
    if (choice < 0) srv_api_run(s, sl, j);
    else srv_api_help(s, sl, j, choice);
    if (s->bat) k3_batcher_detach(s->bat, sl->h);
    if (choice < 0 && s->on_done) s->on_done(s, j);
    pthread_mutex_lock(&s->mu);
    sl->busy_s += k3_now() - t0;
    s->running--;
    sl->job = NULL;
}

/* A slot: one job at a time, from the queue, or a choice of another's, until the shutdown. */
static void slot_loop(srv_slot *sl)
{
    srv *s = sl->s;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        sl->idle = 1;
        /* taken as a helper (help 1), it waits for its state whatever else happens */
        while (sl->help == 1 || (!sl->help && !s->stopping && !(s->drain && !s->q_n) && !mine(s, sl)))
            pthread_cond_wait(&s->cv, &s->mu);
        sl->idle = 0;
        if (sl->help) {
            srv_job *j = sl->job;
            work(s, sl, j, sl->help_choice);
            sl->help = 0;
            j->helpers--;
            pthread_cond_broadcast(&s->cv);
            srv_job_unref(s, j);
            continue;
        }
        if (s->stopping || (s->drain && !s->q_n)) break;
        srv_job *j = s->queue[s->q_head];
        s->q_head = (s->q_head + 1) % s->ring;
        s->q_n--;
        pthread_cond_broadcast(&s->cv);          /* the next job may be another slot's */
        if (j->cancel) {                         /* its client left while it waited */
            j->status = 499;
            j->state = SRV_DONE;
        } else {
            j->state = SRV_RUNNING;
            work(s, sl, j, -1);
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

void srv_slots_run(srv *s)
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
}

/*
 * load.c - bringing a pack up for a run (load.h): k3verify, the plan, the
 * weights, the model.
 */
#define _GNU_SOURCE
#include "load.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dist.h"
#include "k3_log.h"
#include "k3_sys.h"
#include "session.h"

/* Run `k3verify -q PACK` from k3run's own directory. */
static k3_err run_verify(const char *pack, k3_diag *d)
{
    char self[4096], tool[4200];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return k3_fail(d, K3_ERR_IO, "cannot find k3run's own path to run k3verify");
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    snprintf(tool, sizeof tool, "%s/k3verify", self);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return k3_fail(d, K3_ERR_IO, "fork: %s", strerror(errno));
    if (pid == 0) {
        execl(tool, "k3verify", "-q", pack, (char *)NULL);
        fprintf(stderr, "k3run: cannot run '%s': %s\n", tool, strerror(errno));
        _exit(K3_EXIT_IO);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return k3_fail(d, K3_ERR_IO, "waitpid: %s", strerror(errno));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : K3_EXIT_INTERNAL;
        return k3_fail(d, code == K3_EXIT_DATA ? K3_ERR_CORRUPT : code == K3_EXIT_IO ? K3_ERR_IO : K3_ERR_INTERNAL,
                       "'%s': k3verify found the pack unusable (exit %d); nothing was run", pack, code);
    }
    return K3_OK;
}

/*
 * Experts across MPI ranks (dist.h): every rank loads the same pack, rank 0 the trunk and its
 * share of the experts, the others their share only. A rank's failure is rank 0's to report:
 * agree() gathers every rank's status (mine, with d's message) at rank 0 and hands the first
 * failure to all in d, so rank 0 names it (with the rank) and the others exit quietly
 * (worker_exit).
 */
static k3_err agree(k3_err mine, k3_diag *d)
{
    const int R = k3_dist_size(), me = k3_dist_rank();
    if (R <= 1) return mine;
    struct { int32_t rank, code; char msg[480]; } st = {me, mine, {0}}, first = {-1, 0, {0}};
    if (mine) snprintf(st.msg, sizeof st.msg, "%.479s", d->msg);
    k3_diag td;
    if (me == 0) {
        if (mine) first = st;
        for (int r = 1; r < R; r++) {
            if (k3_dist_recv(r, 9, &st, sizeof st, &td)) k3_dist_abort(K3_EXIT_IO);
            if (st.code && first.rank < 0) first = st;
        }
    } else if (k3_dist_send(0, 9, &st, sizeof st, &td)) {
        k3_dist_abort(K3_EXIT_IO);
    }
    if (k3_dist_bcast(&first, sizeof first, &td)) k3_dist_abort(K3_EXIT_IO);
    if (first.rank < 0) return K3_OK;
    first.msg[sizeof first.msg - 1] = 0;
    if (first.rank == me && me == 0) return mine;   /* d already says it */
    return k3_fail(d, (k3_err)first.code, "rank %d of %d: %s", first.rank, R, first.msg);
}

/* A rank other than 0 after a failure rank 0 reports, or after serving: leave without a word. */
static void worker_exit(k3_loaded *l, k3_err e)
{
    k3_loaded_free(l);
    k3_dist_finalize();
    exit(e ? k3_exit_code(e) : K3_EXIT_OK);
}

/* Every rank has the same pack: the manifests' own XXH3-64 (session.h's pack identity). */
static k3_err same_pack(const char *pack, k3_diag *d)
{
    const int R = k3_dist_size();
    uint64_t id = 0, all[256];
    if (R > 256) return k3_fail(d, K3_ERR_USAGE, "%d ranks: k3run takes at most 256", R);
    k3_err e = k3_pack_identity(pack, &id, d);
    if ((e = agree(e, d))) return e;
    if ((e = k3_dist_allgather64(id, all, d))) return e;
    for (int r = 1; r < R; r++)
        if (all[r] != all[0])
            return k3_fail(d, K3_ERR_USAGE, "rank %d has another pack than rank 0 ('%s': manifest %016llx, "
                           "rank 0's %016llx): every rank must run the same pack", r, pack,
                           (unsigned long long)all[r], (unsigned long long)all[0]);
    return K3_OK;
}

/* Where the trunk runs (K3_TRUNK, K3_SPLIT_MIN; plan.h): rank 0's environment decides for all. */
static k3_err trunk_mode(k3_loaded *l, int *mode, k3_diag *d)
{
    struct { int32_t mode, pad; uint64_t min; } m = {0, 0, 0};
    k3_err e = K3_OK;
    if (k3_dist_rank() == 0) {
        m.mode = k3_trunk_env();
        m.min = k3_split_min_env();
        if (m.mode < 0)
            e = k3_fail(d, K3_ERR_USAGE, "K3_TRUNK='%s': expected auto (the default: split where every rank's "
                        "slices fit its budget, else on rank 0), split (its matrices split by rows across the "
                        "ranks) or rank0", getenv("K3_TRUNK"));
        else if (m.min == UINT64_MAX)
            e = k3_fail(d, K3_ERR_USAGE, "K3_SPLIT_MIN='%s' is not a size (0, 64K, 1M)", getenv("K3_SPLIT_MIN"));
    }
    if ((e = agree(e, d))) return e;
    if ((e = k3_dist_bcast(&m, sizeof m, d))) return e;
    *mode = m.mode;
    l->split_min = m.min;
    return K3_OK;
}

/* The plan of this rank with the trunk split (geo: its geometry): K3_OK when its slices are
   resident; a refusal that says why when they are not. Every rank calls it with the same mode. */
static k3_err plan_split(const k3_load_opts *o, k3_loaded *l, const k3_geometry *whole, k3_geometry *geo,
                         uint64_t budget, uint32_t batch, k3_diag *d)
{
    k3_err e = k3_geometry_for_rank_split(whole, k3_dist_rank(), k3_dist_size(), k3_dist_first(), l->split_min,
                                          geo, d);
    if (!e) e = k3_plan_choose_seq(k3w_config(l->w), geo, budget, o->context, batch, o->prompt_tokens, o->generate_tokens,
                               o->all_logits, o->snapshots, o->spec_tokens, o->n_seq, &l->plan, d);
    if (!e && l->plan.n_streamed)      /* each rank's slices must stay in memory */
        e = k3_fail(d, K3_ERR_USAGE, "K3_TRUNK=split: this rank's share of the trunk (%.2f GiB) does not fit its "
                    "budget (%.2f GiB) with its buffers and the smallest expert cache, and a split trunk is never "
                    "streamed: give each rank more --budget, use more ranks, or K3_TRUNK=rank0 (the trunk on "
                    "rank 0, streamed within its budget)", geo->trunk_bytes / 1073741824.0, budget / 1073741824.0);
    return e;
}

k3_err k3_load_plan(const k3_load_opts *o, k3_loaded *l, int *usage, k3_diag *d)
{
    memset(l, 0, sizeof *l);
    *usage = 0;
    k3_err e;
    if (o->verify) {
        double tv = k3_now();
        if ((e = run_verify(o->pack, d))) return e;
        l->t_verify = k3_now() - tv;
    }
    uint64_t budget = o->budget;
    const char *src = NULL;
    if (!budget) {
        budget = k3_machine_memory(&src);
        uint64_t keep = budget / 10 > (512ull << 20) ? budget / 10 : (512ull << 20);
        budget = budget > keep ? budget - keep : 0;
        if (k3_log_level() >= 1 && k3_dist_rank() == 0)
            fprintf(stderr, "%s: no --budget: using %.2f GiB (%s, less a margin)\n", k3_log_prog(),
                    budget / 1073741824.0, src);
    }
    static k3_geometry geo, whole;                   /* ~90 KiB each: not on the stack */
    int mode = K3_TRUNK_RANK0;
    if (k3_dist_size() > 1 && ((e = same_pack(o->pack, d)) || (e = trunk_mode(l, &mode, d)))) {   /* before any read */
        if (k3_dist_rank() > 0) worker_exit(l, e);
        return e;
    }
    const int me = k3_dist_rank(), R = k3_dist_size();
    e = k3_weights_open(o->pack, &l->w, d);         /* the manifest and config only */
    if (!e) e = k3_geometry_from_manifest(k3w_manifest(l->w), k3w_config(l->w), &whole, d);
    if (mode == K3_TRUNK_SPLIT) {
        if (!e) e = plan_split(o, l, &whole, &geo, budget, o->batch, d);
        l->trunk_split = 1;
    } else if (mode == K3_TRUNK_AUTO) {              /* split if every rank's slices fit its own budget */
        k3_diag sd;
        int fits = !e && !plan_split(o, l, &whole, &geo, budget, o->batch, &sd);
        uint64_t all[256];
        k3_err ge = k3_dist_allgather64((uint64_t)fits, all, d);   /* every rank calls it, even after e */
        if (!e) e = ge;
        l->trunk_split = !e;
        for (int r = 0; r < R && !e; r++) l->trunk_split &= all[r] == 1;
        if (!e && !l->trunk_split && (o->report || k3_log_level() >= 2) && me == 0)
            fprintf(stderr, "%s: the trunk on rank 0: %s\n", k3_log_prog(),
                    fits ? "another rank's slices of it do not fit that rank's budget whole"
                         : "rank 0's slices of it and its buffers do not fit its budget whole");
    }
    if (!e && !l->trunk_split) {
        k3_geometry_for_rank(&whole, me, R, k3_dist_first(), &geo);   /* its share of the experts */
        e = k3_plan_choose_seq(k3w_config(l->w), &geo, budget, o->context, o->batch, o->prompt_tokens, o->generate_tokens,
                           o->all_logits, o->snapshots, o->spec_tokens, o->n_seq, &l->plan, d);
    }
    if (R > 1 && o->batch == K3_BATCH_AUTO) {        /* -b auto: every rank passes the same tokens */
        uint64_t all[256];
        k3_err ge = k3_dist_allgather64(e ? UINT32_MAX : l->plan.batch, all, d);   /* every rank calls it */
        if (!e) e = ge;
        uint32_t b = UINT32_MAX;
        for (int r = 0; r < R && !e; r++) b = all[r] < b ? (uint32_t)all[r] : b;
        if (!e && b != l->plan.batch) {              /* fewer tokens than it chose: it fits as well */
            uint32_t cap = l->plan.batch_cap;
            uint64_t floor = l->plan.minimum;
            if (l->trunk_split) e = plan_split(o, l, &whole, &geo, budget, b, d);
            else e = k3_plan_choose_seq(k3w_config(l->w), &geo, budget, o->context, b, o->prompt_tokens,
                                    o->generate_tokens, o->all_logits, o->snapshots, o->spec_tokens, o->n_seq, &l->plan, d);
            l->plan.batch_auto = 1;
            l->plan.batch_cap = cap;
            l->plan.minimum = floor;
        }
    }
    if (!e && o->spec_tokens && !l->plan.verify_tokens && k3_log_level() >= 1 && k3_dist_rank() == 0)
        fprintf(stderr, "%s: no speculative decoding: the budget has no room for its buffers\n", k3_log_prog());
    if (k3_dist_size() > 1 && (e = agree(e, d)) && k3_dist_rank() > 0) worker_exit(l, e);
    if (e) {
        *usage = e == K3_ERR_USAGE;
        return e;
    }
    l->geo = &geo;
    const k3_plan *p = &l->plan;
    if ((o->report || k3_log_level() >= 2) && k3_dist_rank() == 0)
        fprintf(stderr, "%s: plan for %.2f GiB: %.2f GiB resident (trunk %.2f%s, %u units streamed through "
                "%.2f GiB of buffers, model buffers %.2f for passes of %u prompt tokens%s, experts %s%.2f in %llu "
                "slots); expected %.1f MiB read per token\n", k3_log_prog(), p->budget / 1073741824.0,
                p->resident / 1073741824.0, p->trunk_resident / 1073741824.0,
                l->trunk_split ? " of its split rows" : "", p->n_streamed, p->stream_buffers / 1073741824.0,
                p->buffers / 1073741824.0, p->batch, p->batch_auto ? " (-b auto)" : "",
                p->experts_all_resident ? "all resident, " : "cache ", p->expert_cache / 1073741824.0,
                (unsigned long long)p->expert_slots, p->disk_per_token / 1048576.0);
    return K3_OK;
}

k3_err k3_load_model(const k3_load_opts *o, k3_loaded *l, k3_diag *d)
{
    const k3_plan *p = &l->plan;
    const int me = k3_dist_rank();
    l->wo = (k3_weights_opts){.verify_reads = o->verify_reads, .progress = me == 0,
                              .expert_slots = p->experts_all_resident ? 0 : p->expert_slots,
                              .unit_streamed = p->n_streamed ? p->unit_streamed : NULL,
                              .chunk = p->chunk, .rank = me, .ranks = k3_dist_size(), .first = k3_dist_first(),
                              .split = l->trunk_split, .split_min = l->split_min};
    if (me > 0) {                       /* its plan has no trunk (k3_geometry_for_rank), or its slices */
        l->wo.unit_streamed = NULL;
        l->wo.no_trunk = !l->trunk_split;
    }
    k3_err e = k3_weights_load(l->w, &l->wo, d);
    k3_model_opts mo = {.max_batch = p->batch, .context = o->context, .isa = o->isa, .all_logits = o->all_logits,
                        .max_verify = p->verify_tokens, .n_seq = p->n_seq, .dump = o->dump,
                        .dump_ctx = o->dump_ctx};
    if (k3_dist_size() > 1) {
        if (!e && me > 0) e = k3_model_new(l->w, &mo, &l->m, d);   /* the buffers its experts use */
        e = agree(e, d);
        if (me > 0) {                   /* serve rank 0 until it stops: this process ends here */
            if (!e && (e = k3_model_serve_experts(l->m, d)))
                fprintf(k3_dist_err(), "%s: rank %d: %s\n", k3_log_prog(), me, d->msg);
            worker_exit(l, e);
        }
    }
    if (e) return e;
    if (k3w_trunk_q8(l->w))               /* every run, -q or not: the text is not the exact model's */
        fprintf(stderr, "%s: note: this pack's trunk is compact (Q8, k3pack --trunk q8): INEXACT, its text differs "
                "from the exact model's (the measured cost: docs/PERFORMANCE.md); the same at every budget and "
                "thread count for this pack\n", k3_log_prog());
    return k3_model_new(l->w, &mo, &l->m, d);
}

void k3_loaded_free(k3_loaded *l)
{
    if (l->m && k3_dist_rank() == 0) k3_model_dist_stop(l->m);  /* the other ranks stop serving */
    k3_model_free(l->m);
    k3_weights_free(l->w);
    memset(l, 0, sizeof *l);
}

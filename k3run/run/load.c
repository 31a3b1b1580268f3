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

#include "k3_log.h"
#include "k3_sys.h"

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
        if (k3_log_level() >= 1)
            fprintf(stderr, "%s: no --budget: using %.2f GiB (%s, less a margin)\n", k3_log_prog(),
                    budget / 1073741824.0, src);
    }
    static k3_geometry geo;                          /* ~8 KiB: not on the stack */
    e = k3_weights_open(o->pack, &l->w, d);         /* the manifest and config only */
    if (!e) e = k3_geometry_from_manifest(k3w_manifest(l->w), k3w_config(l->w), &geo, d);
    if (!e) e = k3_plan_with_snapshots(k3w_config(l->w), &geo, budget, o->context, o->batch, o->all_logits,
                                       o->snapshots, o->spec_tokens, &l->plan, d);
    if (!e && o->spec_tokens && !l->plan.verify_tokens && k3_log_level() >= 1)
        fprintf(stderr, "%s: no speculative decoding: the budget has no room for its buffers\n", k3_log_prog());
    if (e) {
        *usage = e == K3_ERR_USAGE;
        return e;
    }
    l->geo = &geo;
    const k3_plan *p = &l->plan;
    if (o->report || k3_log_level() >= 2)
        fprintf(stderr, "%s: plan for %.2f GiB: %.2f GiB resident (trunk %.2f, %u units streamed through "
                "%.2f GiB of buffers, model buffers %.2f, experts %s%.2f in %llu slots); expected %.1f MiB read "
                "per token\n", k3_log_prog(), p->budget / 1073741824.0, p->resident / 1073741824.0,
                p->trunk_resident / 1073741824.0, p->n_streamed, p->stream_buffers / 1073741824.0,
                p->buffers / 1073741824.0, p->experts_all_resident ? "all resident, " : "cache ",
                p->expert_cache / 1073741824.0, (unsigned long long)p->expert_slots, p->disk_per_token / 1048576.0);
    return K3_OK;
}

k3_err k3_load_model(const k3_load_opts *o, k3_loaded *l, k3_diag *d)
{
    const k3_plan *p = &l->plan;
    l->wo = (k3_weights_opts){.verify_reads = o->verify_reads, .progress = 1,
                              .expert_slots = p->experts_all_resident ? 0 : p->expert_slots,
                              .unit_streamed = p->n_streamed ? p->unit_streamed : NULL,
                              .chunk = p->chunk};
    k3_err e = k3_weights_load(l->w, &l->wo, d);
    if (e) return e;
    if (k3w_trunk_q8(l->w))               /* every run, -q or not: the text is not the exact model's */
        fprintf(stderr, "%s: note: this pack's trunk is compact (Q8, k3pack --trunk q8): INEXACT, its text differs "
                "from the exact model's (the measured cost: docs/PERFORMANCE.md); the same at every budget and "
                "thread count for this pack\n", k3_log_prog());
    k3_model_opts mo = {.max_batch = o->batch, .context = o->context, .isa = o->isa, .all_logits = o->all_logits,
                        .max_verify = p->verify_tokens, .dump = o->dump, .dump_ctx = o->dump_ctx};
    return k3_model_new(l->w, &mo, &l->m, d);
}

void k3_loaded_free(k3_loaded *l)
{
    k3_model_free(l->m);
    k3_weights_free(l->w);
    memset(l, 0, sizeof *l);
}

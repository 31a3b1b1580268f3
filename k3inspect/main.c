/*
 * k3inspect - show the tensors, shapes, dtypes and bytes of a safetensors
 * checkpoint: one row per tensor, or a summary by layer and by kind; or, with
 * --plan, k3run's memory plan for a budget (plan.h, plan_report.h).
 * Only headers are read; the views live in k3inspect_list.c / k3inspect_summary.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "engine.h"                   /* --plan: the engine's planner */
#include "k3_version.h"
#include "k3_error.h"
#include "k3_log.h"
#include "k3_opts.h"
#include "k3_sys.h"
#include "k3inspect.h"

enum {
    OPT_SUMMARY = K3_OPT_USER, OPT_JSON, OPT_FILTER, OPT_CONFIG, OPT_NO_CONFIG, OPT_SHARDS, OPT_PLAN, OPT_BUDGET,
    OPT_PRESET, OPT_CONTEXT, OPT_BATCH, OPT_DRAFT, OPT_RANKS, OPT_RANK0_EXPERTS,
    OPT_TRUNK, OPT_SPLIT_MIN, OPT_FMA_PEAK, OPT_N, OPT_PARALLEL, OPT_MEM_BW, OPT_SNAPSHOTS
};

static const k3_opt opts[] = {
    {OPT_SUMMARY, 's', "summary", NULL, NULL, NULL,
     "params and bytes by layer (with its kind) and by tensor kind, with totals"},
    {OPT_SHARDS, 0, "shards", NULL, NULL, NULL,
     "packs: the per-shard table and the expert record layout (also shown after --summary)"},
    {OPT_JSON, 'j', "json", NULL, NULL, NULL, "one JSON document (\"schema\": 1) instead of text"},
    {OPT_FILTER, 'f', "filter", "GLOB", "all tensors", NULL,
     "only tensors whose full name matches GLOB (fnmatch; '*' also matches '.')"},
    {OPT_CONFIG, 'c', "config", "PATH", "SRC/config.json", NULL,
     "config.json giving layer kinds (K3: text_config, 1-based kda_layers)"},
    {OPT_NO_CONFIG, 0, "no-config", NULL, NULL, NULL, "ignore config.json; guess layer kinds from names"},
    {OPT_PLAN, 0, "plan", NULL, NULL, NULL,
     "k3run's memory plan for SRC (a pack, or a config.json) at --budget or --preset, without running"},
    {OPT_BUDGET, 'B', "budget", "SIZE", NULL, NULL, "--plan: the memory budget (8G, 512M, bytes)"},
    {OPT_PRESET, 0, "preset", "NAME", NULL, NULL, "--plan: a named budget: laptop (8G), workstation (128G), server (224G)"},
    {OPT_CONTEXT, 0, "context", "N", "4096", NULL, "--plan: positions the attention cache holds (as k3run -c)"},
    {OPT_BATCH, 0, "batch", "auto|N", "auto", NULL,
     "--plan: prompt tokens per forward pass (as k3run -b; auto: the planner chooses, at most the context)"},
    {OPT_N, 'n', "n-predict", "N", "128", NULL,
     "--plan: tokens generated after the prompt, which -b auto prices (as k3run -n; chat and serve: 1024)"},
    {OPT_FMA_PEAK, 0, "fma-peak", "GFLOPS", "200", NULL,
     "--plan: the fp32 FMA peak a prompt's compute is priced at (tests/bench/bench_kernels measures yours)"},
    {OPT_DRAFT, 0, "draft", "N", K3_DRAFT_DEFAULT_STR, NULL,
     "--plan: drafted tokens per verify pass (as k3run --draft; 0: no speculative decoding)"},
    {OPT_PARALLEL, 0, "parallel", "S", NULL, NULL,
     "--plan: the plan for S conversations sharing each pass (as k3run serve --parallel S; refused where it does "
     "not fit), and tokens/s per conversation and in all for 1 to 32 of them"},
    {OPT_SNAPSHOTS, 0, "snapshots", "N", "2", NULL,
     "--plan --parallel: state snapshots each conversation keeps (as k3run serve --snapshots: with N > 0 one "
     "more, for its shared prefix), counted for each"},
    {OPT_MEM_BW, 0, "mem-bw", "GB/S", "40", NULL,
     "--plan --parallel: the memory bandwidth a pass's resident weights and states are read at "
     "(tests/bench/bench_membw measures yours)"},
    {OPT_RANKS, 0, "ranks", "R", "1", NULL,
     "--plan: the experts across R MPI ranks (mpirun -n R k3run), each with this budget: the plan of rank 0 "
     "and of the others, the network bytes per token"},
    {OPT_RANK0_EXPERTS, 0, "rank0-experts", "yes|no", "yes", "K3_RANK0_EXPERTS",
     "--plan --ranks: no: rank 0 holds no experts, only the trunk (k3run: K3_RANK0_EXPERTS=0)"},
    {OPT_TRUNK, 0, "trunk", "auto|split|rank0", "auto", "K3_TRUNK",
     "--plan --ranks: split: the trunk's large matrices split by rows across the ranks, each keeping its "
     "slice in memory; rank0: the trunk on rank 0; auto: split where every rank's slices fit (as k3run)"},
    {OPT_SPLIT_MIN, 0, "split-min", "SIZE", "1M", "K3_SPLIT_MIN",
     "--trunk split: smaller matrices stay whole on rank 0 (k3run: K3_SPLIT_MIN)"},
    K3_OPTS_COMMON,
};
#define N_OPTS ((int)(sizeof opts / sizeof opts[0]))

static const char purpose[] =
    "Show the tensors of a safetensors checkpoint or a k3 pack: SRC is a\n"
    "checkpoint directory (model.safetensors.index.json with its shards, or a\n"
    "single *.safetensors / model.safetensors), a .safetensors file, or a pack\n"
    "directory (made by k3pack; recognised by its manifest.json). Every header\n"
    "is validated strictly; tensor data is never read.\n"
    "\n"
    "A pack is shown with the checkpoint's names (prefix put back), every part of\n"
    "every expert record as a row, MXFP4 as F4 and its scales as F8_E8M0; the\n"
    "pack's shards are the files. --summary and --shards add the per-shard table\n"
    "and the expert record layout; --json adds them as \"pack\".\n"
    "\n"
    "Views:\n"
    "  default    one row per tensor: name, dtype, shape, bytes, file, offset\n"
    "             (offset = absolute byte offset in its file; names escaped)\n"
    "  --summary  params and bytes per layer with its kind (\"KDA+dense\",\n"
    "             \"MLA+MoE\", ...), per tensor kind, and totals\n"
    "\n"
    "Params count logical weights: an MXFP4/INT4 '*.weight_packed' tensor holds\n"
    "2 weights per U8 byte (8 per I32); its '*.weight_scale' bytes are counted in\n"
    "bytes but not in params.\n"
    "\n"
    "--plan prints the memory plan k3run would make: what is resident, what is\n"
    "read from disk per token, and the I/O time that implies at 2, 7 and 14 GB/s;\n"
    "what a pass of prompt tokens reads, and the time to the first token of a\n"
    "1,000-, 8,000- and 32,000-token prompt (reads at 2 and 7 GB/s, compute at\n"
    "--fma-peak) at the batch asked for and at -b 64.\n"
    "SRC is a pack (its manifest) or a model's config.json (or a checkpoint\n"
    "directory holding one: k3pack's layout is assumed). A budget below the\n"
    "model's minimum exits 2 and states the minimum, as k3run does.";

static const char footer[] =
    "Example:\n"
    "  k3inspect --summary /models/Kimi-K3\n"
    "  k3inspect --shards /packs/kimi-k3\n"
    "  k3inspect --plan --preset laptop /models/Kimi-K3/config.json\n"
    "  k3inspect --plan --budget 64G --context 8192 --json /packs/kimi-k3\n";

static int fail(k3_err e, const k3_diag *d)
{
    k3_error("%s", d->msg);
    return k3_exit_code(e);
}

/* --plan: the geometry from a pack's manifest (as k3run), or from a config.json with k3pack's
   layout; then k3run's plan for the budget, context and batch. */
static int plan_cmd(const k3_args *a, const char *src)
{
    static const int other[] = {OPT_SUMMARY, OPT_SHARDS, OPT_FILTER, OPT_CONFIG, OPT_NO_CONFIG};
    static const char *const other_name[] = {"--summary", "--shards", "--filter", "--config", "--no-config"};
    for (int i = 0; i < 5; i++)
        if (k3_opt_count(a, other[i])) return k3_usage_error("--plan cannot be used with %s", other_name[i]);
    const char *bs = k3_opt_str(a, OPT_BUDGET), *ps = k3_opt_str(a, OPT_PRESET);
    uint64_t budget = 0, context, draft, ranks, gen;
    uint32_t batch = K3_BATCH_AUTO;
    double fma = K3_FMA_PEAK_DEFAULT;
    k3_diag d = {0};
    if (!bs == !ps) return k3_usage_error("--plan needs a budget: --budget SIZE or --preset NAME (one of them)");
    if (ps && !(budget = k3_preset_budget(ps)))
        return k3_usage_error("--preset: unknown preset '%s' (laptop, workstation, server)", ps);
    if (bs && (k3_parse_size(bs, 1, &budget) || budget == 0))
        return k3_usage_error("--budget: '%s' is not a size (8G, 512M, 4096)", bs);
    if (k3_opt_u64(a, OPT_CONTEXT, 4096, 0, &context, &d) || k3_opt_u64(a, OPT_N, 128, 0, &gen, &d) ||
        k3_opt_u64(a, OPT_DRAFT, K3_DRAFT_DEFAULT, 0, &draft, &d) || k3_opt_u64(a, OPT_RANKS, 1, 0, &ranks, &d))
        return k3_usage_error("%s", d.msg);
    if (context < 1 || context > (1u << 24)) return k3_usage_error("--context must be in 1..%u", 1u << 24);
    const char *bts = k3_opt_str(a, OPT_BATCH), *fs = k3_opt_str(a, OPT_FMA_PEAK);
    if (bts && k3_batch_parse(bts, &batch))
        return k3_usage_error("--batch must be auto or in 1..%u (got '%s')", K3_BATCH_MAX, bts);
    if (fs) {
        char *end;
        fma = strtod(fs, &end);
        if (end == fs || *end || !(fma > 0) || fma > 1e9)
            return k3_usage_error("--fma-peak: '%s' is not a rate in GFLOP/s (a number above 0, e.g. 200)", fs);
    }
    if (draft > 16) return k3_usage_error("--draft must be in 0..16");
    if (gen > (1u << 30)) return k3_usage_error("--n-predict must be in 0..%u", 1u << 30);
    if (ranks < 1 || ranks > 256) return k3_usage_error("--ranks must be in 1..256");
    uint64_t par = 0;
    double mem_bw = K3_MEM_GBS_DEFAULT;
    const char *mbs = k3_opt_str(a, OPT_MEM_BW);
    if (k3_opt_u64(a, OPT_PARALLEL, 0, 0, &par, &d)) return k3_usage_error("%s", d.msg);
    if (k3_opt_count(a, OPT_PARALLEL) && (par < 1 || par > 64)) return k3_usage_error("--parallel must be in 1..64");
    if (par && ranks > 1) return k3_usage_error("--parallel is planned for one process (not with --ranks)");
    uint64_t snaps;                                  /* k3run serve's default, for each slot */
    if (k3_opt_u64(a, OPT_SNAPSHOTS, 2, 0, &snaps, &d)) return k3_usage_error("%s", d.msg);
    if (snaps > 64) return k3_usage_error("--snapshots must be in 0..64");
    if (k3_opt_count(a, OPT_SNAPSHOTS) && !par) return k3_usage_error("--snapshots is planned with --parallel");
    snaps = k3_plan_slot_snapshots((uint32_t)snaps);  /* as serve counts them */
    if (mbs) {
        char *end;
        mem_bw = strtod(mbs, &end);
        if (end == mbs || *end || !(mem_bw > 0) || mem_bw > 1e6)
            return k3_usage_error("--mem-bw: '%s' is not a bandwidth in GB/s (a number above 0, e.g. 40)", mbs);
    }
    const char *r0 = k3_opt_str(a, OPT_RANK0_EXPERTS);
    int first = 0;
    if (r0 && !strcmp(r0, "no")) first = 1;
    else if (r0 && !strcmp(r0, "0")) first = 1;                  /* K3_RANK0_EXPERTS=0, as k3run reads it */
    else if (r0 && strcmp(r0, "yes") && strcmp(r0, "1")) return k3_usage_error("--rank0-experts takes yes or no");
    if (ranks < 2) first = 0;
    const char *ts = k3_opt_str(a, OPT_TRUNK), *ms = k3_opt_str(a, OPT_SPLIT_MIN);
    int mode = k3_trunk_mode(ts), split = 0;
    uint64_t split_min = K3_SPLIT_MIN_DEFAULT;
    if (mode < 0) return k3_usage_error("--trunk takes auto, split or rank0");
    if (ms && k3_parse_size(ms, 1, &split_min)) return k3_usage_error("--split-min: '%s' is not a size (0, 64K, 1M)", ms);

    static k3_geometry geo;                          /* ~8 KiB: not on the stack */
    k3_config cfg;
    k3_manifest mf;
    memset(&mf, 0, sizeof mf);
    char path[4200];
    const char *from;
    k3_err e;
    struct stat st;
    int is_pack = k3i_is_pack(src);
    if (is_pack) {
        from = "pack manifest";
        snprintf(path, sizeof path, "%s/manifest.json: config", src);
        e = k3_manifest_load(src, &mf, &d);
        if (!e) e = k3_manifest_config(&mf, path, &cfg, &d);
        if (!e) e = k3_geometry_from_manifest(&mf, &cfg, &geo, &d);
        snprintf(path, sizeof path, "%s/manifest.json", src);
    } else {
        from = "config.json, with k3pack's layout";
        if (stat(src, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(path, sizeof path, "%s/config.json", src);
        else snprintf(path, sizeof path, "%s", src);
        e = k3_config_load(path, &cfg, &d);
        if (!e) e = k3_geometry_from_config(&cfg, &geo, &d);
    }
    k3_manifest_free(&mf);
    if (e) return fail(e, &d);
    static k3_geometry rgeo[2];
    static k3_plan rplan[2];
    const uint32_t verify = draft ? (uint32_t)draft + 1 : 0;
    /* as k3run plans: with the verify buffers where the budget has room for them; with --ranks,
       each rank's share (rank 0: the trunk and its experts; the others: their experts only) */
    if (ranks > 1 && mode == K3_TRUNK_SPLIT) split = 1;
    if (ranks > 1 && mode == K3_TRUNK_AUTO)         /* as k3run decides: every rank's slices resident */
        split = k3i_split_fits(&cfg, &geo, budget, (uint32_t)context, batch, (uint32_t)gen, verify, (int)ranks, first,
                               split_min);
    e = k3i_rank_plans(&cfg, &geo, budget, (uint32_t)context, batch, (uint32_t)gen, verify, (int)ranks, first, split,
                       split_min, rgeo, rplan, &d);
    if (e) return e == K3_ERR_USAGE ? k3_usage_error("%s", d.msg) : fail(e, &d);
    /* --parallel S: the plan is S sequences' (refused where it does not fit), and the table of 1..32 */
    static k3_par_row prow[K3_PAR_N_SLOTS + 1];
    int n_prow = 0;
    if (par) {
        k3_diag pd;
        e = k3_plan_choose_seq(&cfg, &geo, budget, (uint32_t)context, batch, 0, (uint32_t)gen, 0, (uint32_t)snaps,
                               verify, (uint32_t)par, &rplan[0], &pd);
        if (e == K3_ERR_USAGE)
            return k3_usage_error("--parallel %llu: %s", (unsigned long long)par, pd.msg);
        if (e) return fail(e, &pd);
        int have = 0;
        for (int i = 0; i <= K3_PAR_N_SLOTS; i++) {
            uint32_t S = i < K3_PAR_N_SLOTS ? k3_par_slots[i] : (uint32_t)par;
            if (i == K3_PAR_N_SLOTS && have) break;
            have |= S == par;
            k3_par_row *w = &prow[n_prow++];
            w->slots = S;
            k3_diag td;
            e = k3_plan_choose_seq(&cfg, &geo, budget, (uint32_t)context, batch, 0, (uint32_t)gen, 0,
                                   (uint32_t)snaps, verify, S, &w->plan, &td);
            if (e && e != K3_ERR_USAGE) return fail(e, &td);
            w->fits = !e;
            if (!e) k3_decode_cost_of(&cfg, &geo, &w->plan, S, (uint32_t)context / 2, &w->cost);
        }
    }
    const k3_plan *pl = &rplan[0];
    const k3_geometry *pg = &rgeo[0];
    double sent = 0, recv = 0;
    int all_at = ranks > 1 ? k3i_ranks_all_resident(&cfg, &geo, budget, (uint32_t)context, batch, (uint32_t)gen, verify,
                                                    first, mode, split_min) : 0;
    uint32_t trips = 0;                              /* exchanges per decoded token */
    if (ranks > 1) k3i_rank_network(&cfg, &geo, (int)ranks, first, split, split_min, &sent, &recv, &trips);
    /* the time to first token of three prompts (one process): each planned as k3run plans for it, at
       a context that holds it, at the batch asked for and at -b 64 */
    static k3_ttft_row rows[K3_TTFT_N_PROMPTS];     /* [3] one per prompt of k3_ttft_prompts: static (~5 KiB) */
    for (int r = 0; r < K3_TTFT_N_PROMPTS && ranks == 1; r++) {
        uint32_t P = k3_ttft_prompts[r], ctx = context > P ? (uint32_t)context : P;
        rows[r].tokens = P;
        rows[r].context = ctx;
        for (int i = 0; i < 2; i++) {
            k3_diag td;
            e = k3_plan_choose(&cfg, &geo, budget, ctx, i ? 64 : batch, P, (uint32_t)gen, 0, 0, verify,
                               &rows[r].plan[i], &td);
            if (e && e != K3_ERR_USAGE) return fail(e, &td);
            rows[r].fits[i] = !e;
            if (!e) k3_prompt_cost_of(&cfg, &geo, &rows[r].plan[i], P, &rows[r].cost[i]);
        }
    }

    if (k3_opt_count(a, OPT_JSON)) {
        json_t *o = json_object(), *p = k3_plan_json(pl, pg);
        if (!o || !p) {
            json_decref(o);
            json_decref(p);
            return fail(k3_fail(&d, K3_ERR_NOMEM, "out of memory"), &d);
        }
        json_object_set_new(o, "schema", json_integer(1));
        json_object_set_new(o, "tool", json_string("k3inspect"));
        json_object_set_new(o, "version", json_string(K3_VERSION));
        json_object_set_new(o, "view", json_string("plan"));
        char esc[8192];                              /* paths that are not UTF-8: escaped */
        json_t *js = json_string(src), *jc = json_string(path);
        json_object_set_new(o, "source", js ? js : json_string(k3_escape(src, strlen(src), esc, sizeof esc)));
        json_object_set_new(o, "config", jc ? jc : json_string(k3_escape(path, strlen(path), esc, sizeof esc)));
        json_object_set_new(o, "geometry_from", json_string(is_pack ? "manifest" : "config"));
        json_object_update(o, p);
        json_decref(p);
        json_object_set_new(o, "ranks", json_integer((json_int_t)ranks));
        json_object_set_new(o, "rank0_experts", json_boolean(!first));
        json_object_set_new(o, "trunk_placement", json_string(split ? "split" : "rank0"));
        if (split) json_object_set_new(o, "split_min_bytes", json_integer((json_int_t)split_min));
        if (ranks > 1) {               /* the plan above is rank 0's */
            json_object_set_new(o, "other_ranks", k3_plan_json(&rplan[1], &rgeo[1]));
            json_object_set_new(o, "network_sent_bytes_per_token", json_real(sent));
            json_object_set_new(o, "network_received_bytes_per_token", json_real(recv));
            json_object_set_new(o, "network_round_trips_per_token", json_integer(trips));
            json_object_set_new(o, "ranks_holding_every_expert", all_at ? json_integer(all_at) : json_null());
        }
        json_t *tt = ranks == 1 ? k3_ttft_json(rows, K3_TTFT_N_PROMPTS, fma) : json_null();
        json_object_set_new(o, "time_to_first_token", tt ? tt : json_null());
        if (par) {
            json_object_set_new(o, "parallel", json_integer((json_int_t)par));
            json_t *pj = k3_par_json(prow, n_prow, fma, mem_bw);
            json_object_set_new(o, "conversations", pj ? pj : json_null());
        }
        json_dumpf(o, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
        printf("\n");
        json_decref(o);
    } else {
        char b[512];
        printf("Model: '%s' (geometry from the %s)\n", k3_escape(src, strlen(src), b, sizeof b), from);
        if (ranks > 1)
            printf("\nRank 0 of %llu (mpirun -n %llu k3run: the front end, %s, %s), at this budget:\n",
                   (unsigned long long)ranks, (unsigned long long)ranks,
                   split ? "its slice of the trunk's split matrices and the rest of the trunk" : "the trunk",
                   first ? "no experts" : "its share of the experts");
        k3_plan_print(stdout, pl, pg);
        if (ranks == 1) {
            printf("\n");
            k3_ttft_print(stdout, rows, K3_TTFT_N_PROMPTS, fma);
        }
        if (par) {
            printf("\n");
            k3_par_print(stdout, prow, n_prow, fma, mem_bw);
        }
        if (ranks > 1) {
            printf("\nEach other rank (rank 1 shown; its share of the experts, %s), at this budget:\n",
                   split ? "its slice of the trunk's split matrices" : "no trunk");
            k3_plan_print(stdout, &rplan[1], &rgeo[1]);
            printf("\nNetwork per decoded token: rank 0 sends %.2f MB (%.2f MB to each other rank) and receives "
                   "%.2f MB, in %u round trips (%s)\n", sent / 1e6, sent / 1e6 / (double)(ranks - 1),
                   recv / 1e6, trips, split ? "one per MoE layer and per exchange of split matrices" : "one per MoE layer");
            if (all_at)
                printf("Every expert in memory at this budget per rank: %s; the fewest ranks that hold them all: %d\n",
                       rplan[0].experts_all_resident && rplan[1].experts_all_resident ? "yes" : "no", all_at);
            else
                printf("Every expert in memory at this budget per rank: no, at no rank count up to 4096\n");
        }
    }
    if (fflush(stdout) || ferror(stdout)) return fail(k3_fail(&d, K3_ERR_IO, "cannot write to standard output"), &d);
    return K3_EXIT_OK;
}

int main(int argc, char **argv)
{
    k3_log_init(argv[0]);
    k3_args a;
    k3_diag d = {0};
    if (k3_opts_parse(opts, N_OPTS, argc, argv, &a, &d)) return k3_usage_error("%s", d.msg);
    if (k3_opt_count(&a, K3_OPT_HELP)) {
        k3_opts_help(stdout,
                     "k3inspect [OPTIONS] SRC\n"
                     "       k3inspect --plan (--budget SIZE | --preset NAME) [--context N] [--batch auto|N] [--draft N]\n"
                     "                 [-n N] [--fma-peak GFLOPS] [--ranks R] [--parallel S [--mem-bw GB/S]] [--json]"
                     " PACK|config.json",
                     purpose, opts, N_OPTS, footer);
        return K3_EXIT_OK;
    }
    if (k3_opt_count(&a, K3_OPT_VERSION)) {
        k3_version_print(stdout, k3_log_prog());
        return K3_EXIT_OK;
    }
    if (a.n_pos != 1)
        return a.n_pos ? k3_usage_error("expected one SRC, got %d arguments", a.n_pos)
                       : k3_usage_error("missing SRC (a checkpoint directory, a .safetensors file or a pack)");
    if (k3_opt_count(&a, OPT_PLAN)) return plan_cmd(&a, a.pos[0]);
    {
        static const int need_plan[] = {OPT_BUDGET, OPT_PRESET, OPT_CONTEXT, OPT_BATCH, OPT_DRAFT, OPT_RANKS,
                                        OPT_FMA_PEAK, OPT_N, OPT_PARALLEL, OPT_MEM_BW, OPT_SNAPSHOTS};
        /* --rank0-experts may come from K3_RANK0_EXPERTS, which k3run reads too: not refused alone */
        static const char *const need_plan_name[] = {"--budget", "--preset", "--context", "--batch", "--draft",
                                                     "--ranks", "--fma-peak", "--n-predict", "--parallel",
                                                     "--mem-bw", "--snapshots"};
        for (int i = 0; i < 11; i++)
            if (k3_opt_count(&a, need_plan[i])) return k3_usage_error("%s is for --plan", need_plan_name[i]);
    }
    if (k3_opt_count(&a, OPT_CONFIG) && k3_opt_count(&a, OPT_NO_CONFIG)) {
        k3_error("--config and --no-config cannot be used together");
        return K3_EXIT_USAGE;
    }

    k3i_ctx x;
    memset(&x, 0, sizeof x);
    x.filter = k3_opt_str(&a, OPT_FILTER);
    double t0 = k3_now();
    k3_err e = k3i_is_pack(a.pos[0]) ? k3i_open_pack(&x, a.pos[0], &d) : k3_st_open(a.pos[0], &x.ck, &d);
    if (e) {
        k3i_close_pack(&x);
        k3_st_close(&x.ck);
        return fail(e, &d);
    }
    k3_info("opened '%s': %zu tensors in %zu files in %.3f s", a.pos[0], x.ck.n_tensors,
            x.ck.n_files, k3_now() - t0);
    for (size_t i = 0; i < x.ck.n_warnings; i++) k3_warn("%s", x.ck.warnings[i]);

    char cfg_path[4096];
    if (k3_opt_str(&a, OPT_CONFIG)) {
        x.cfg_source = k3_opt_str(&a, OPT_CONFIG);
        if ((e = k3_config_load(x.cfg_source, &x.cfg, &d))) goto out_fail;
        x.has_cfg = 1;
    } else if (!k3_opt_count(&a, OPT_NO_CONFIG) && x.ck.config_json) {
        snprintf(cfg_path, sizeof cfg_path, x.is_pack ? "%s/manifest.json (config)" : "%s/config.json", x.ck.dir);
        x.cfg_source = cfg_path;
        if ((e = k3_config_parse(x.ck.config_json, x.ck.config_len, cfg_path, &x.cfg, &d))) {
            k3_error("%s", d.msg);
            fprintf(stderr, "%s: hint: --no-config ignores config.json\n", k3_log_prog());
            k3i_close_pack(&x);
            k3_st_close(&x.ck);
            return k3_exit_code(e);
        }
        x.has_cfg = 1;
    }
    if (k3i_classify(&x)) {
        e = k3_fail(&d, K3_ERR_NOMEM, "out of memory classifying %zu tensors", x.ck.n_tensors);
        goto out_fail;
    }
    if (x.filter) {
        size_t n = 0;
        for (size_t i = 0; i < x.ck.n_tensors && !n; i++) n += (size_t)k3i_selected(&x, i);
        if (!n) {
            char b[256];
            k3_warn("no tensor name matches '%s'", k3_escape(x.filter, strlen(x.filter), b, sizeof b));
        }
    }

    int json = k3_opt_count(&a, OPT_JSON) > 0, summary = k3_opt_count(&a, OPT_SUMMARY) > 0;
    int shards = k3_opt_count(&a, OPT_SHARDS) > 0;
    if (shards && !x.is_pack) {
        e = k3_fail(&d, K3_ERR_USAGE, "--shards needs a k3 pack ('%s' is a checkpoint)", a.pos[0]);
        goto out_fail;
    }
    int r = summary ? (json ? k3i_summary_json(&x, stdout) : k3i_summary_text(&x, stdout))
            : shards && !json ? 0
                    : (json ? k3i_list_json(&x, stdout) : k3i_list_text(&x, stdout));
    if (!r && x.is_pack && !json && (summary || shards)) r = k3i_pack_text(&x, stdout);
    if (r || fflush(stdout) || ferror(stdout)) {
        e = k3_fail(&d, K3_ERR_IO, "cannot write to standard output");
        goto out_fail;
    }
    k3_info("done in %.3f s", k3_now() - t0);
    free(x.layer_attn);
    free(x.layer_ffn);
    free(x.kind);
    k3i_close_pack(&x);
    k3_st_close(&x.ck);
    return K3_EXIT_OK;

out_fail:
    free(x.layer_attn);
    free(x.layer_ffn);
    free(x.kind);
    k3i_close_pack(&x);
    k3_st_close(&x.ck);
    return fail(e, &d);
}

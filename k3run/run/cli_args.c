/*
 * cli_args.c - command-line pieces k3run's front ends share (cli_args.h).
 */
#include "cli_args.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "decode.h"
#include "dist.h"
#include "engine.h"
#include "k3_file.h"
#include "k3_hash.h"
#include "k3_log.h"
#include "k3_manifest.h"
#include "k3_version.h"
#include "kern.h"
#include "load.h"
#include "sampler.h"

int k3_cli_u32(const k3_args *a, int id, uint64_t def, uint64_t lo, uint64_t hi, const char *name, uint32_t *out)
{
    uint64_t v;
    k3_diag d;
    if (k3_opt_u64(a, id, def, 0, &v, &d)) return k3_usage_error("%s", d.msg);
    if (v < lo || v > hi) return k3_usage_error("--%s must be in %llu..%llu (got %llu)", name, (unsigned long long)lo,
                                                (unsigned long long)hi, (unsigned long long)v);
    *out = (uint32_t)v;
    return 0;
}

int k3_cli_batch(const k3_args *a, int id, uint32_t *out)
{
    const char *s = k3_opt_str(a, id);
    *out = K3_BATCH_AUTO;
    if (s && k3_batch_parse(s, out))
        return k3_usage_error("--batch must be auto or in 1..%u (got %s)", K3_BATCH_MAX, *s ? s : "''");
    return 0;
}

int k3_cli_float(const k3_args *a, int id, float def, const char *name, float *out)
{
    const char *s = k3_opt_str(a, id);
    if (!s) { *out = def; return 0; }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || isnan(v)) return k3_usage_error("--%s: '%s' is not a number", name, s);
    float f = (float)v;                 /* 1e39 would become inf, 1e-50 zero: say what was given */
    if (errno == ERANGE || (isinf(f) && !isinf(v)) || (f == 0.0f && v != 0.0))
        return k3_usage_error("--%s: '%s' is out of range (a 32-bit float)", name, s);
    *out = f;
    return 0;
}

int k3_cli_budget(const k3_args *a, int budget_id, int preset_id, uint64_t *out)
{
    *out = 0;
    const char *bs = k3_opt_str(a, budget_id), *ps = k3_opt_str(a, preset_id);
    if (bs && ps && !k3_opt_from_env(a, budget_id)) return k3_usage_error("give --budget or --preset, not both");
    if (ps) {
        if (!(*out = k3_preset_budget(ps)))
            return k3_usage_error("--preset: unknown preset '%s' (laptop, workstation, server)", ps);
    } else if (bs) {
        if (k3_parse_size(bs, 1, out) || *out == 0)
            return k3_usage_error("--budget: '%s' is not a size (8G, 512M, 4096)", bs);
    }
    return 0;
}

k3_err k3_cli_check_pack(const char *pack, k3_diag *d)
{
    struct stat st;
    if (stat(pack, &st) != 0) {
        int err = errno;
        if (err == ENOENT || err == ENOTDIR)
            return k3_fail(d, K3_ERR_IO, "'%s': the pack does not exist (-m takes the directory k3pack wrote)", pack);
        return k3_fail(d, K3_ERR_IO, "'%s': cannot open the pack: %s", pack, strerror(err));
    }
    if (!S_ISDIR(st.st_mode))
        return k3_fail(d, K3_ERR_IO, "'%s' is not a pack: -m takes the directory k3pack wrote", pack);
    return K3_OK;
}

int k3_cli_has_tokenizer(const char *pack, char *path, size_t cap)
{
    k3_diag d;
    if (k3_path_join(path, cap, pack, "tiktoken.model", &d)) return 1;   /* the load names the problem */
    return access(path, F_OK) == 0 || errno != ENOENT;
}

/* One number of generation_config.json into *out: absent leaves it; else in [lo, hi] or an error. */
static int gen_number(json_t *doc, const char *path, const char *key, double lo, double hi, double *out)
{
    json_t *v = json_object_get(doc, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) {
        k3_error("'%s': \"%s\" is not a number", path, key);
        return K3_EXIT_DATA;
    }
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        k3_error("'%s': \"%s\" is %g: give a number in [%g, %g]", path, key, x, lo, hi);
        return K3_EXIT_DATA;
    }
    *out = x;
    return 0;
}

/* The pack's generation_config.json, checked against its size and XXH3-128 in the manifest (as
   k3verify checks it): *text NULL when the pack has none. An exit status, else 0. */
static int read_gen_config(const char *pack, char *path, size_t cap, char **text, size_t *len)
{
    k3_diag d;
    k3_manifest m;
    *text = NULL;
    if (k3_path_join(path, cap, pack, K3_GENCONFIG_NAME, &d)) return 0;   /* the load names the pack */
    k3_err e = k3_read_file(path, 1u << 20, text, len, &d);
    if (e && e != K3_ERR_NOT_FOUND) { k3_error("%s", d.msg); return k3_exit_code(e); }
    if (k3_manifest_load(pack, &m, &d)) return 0;          /* no pack here: the load says why */
    const k3_mf_file *f = NULL;
    for (uint32_t i = 0; i < m.n_files; i++)
        if (!strcmp(m.files[i].name, K3_GENCONFIG_NAME)) f = &m.files[i];
    int rc = 0;
    if (f && !*text) {
        k3_error("'%s' is missing: the pack's manifest lists it (k3verify '%s' names what else is damaged)", path, pack);
        rc = K3_EXIT_DATA;
    } else if (!f && *text) {
        k3_error("'%s' is not part of the pack: its manifest does not list it (k3pack carries the checkpoint's "
                 "generation_config.json; remove this one or pack again)", path);
        rc = K3_EXIT_DATA;
    } else if (f) {
        k3_h128 h = k3_xxh3_128(*text, *len);
        if (*len != f->size || h.lo != f->hash.lo || h.hi != f->hash.hi) {
            k3_error("'%s' does not match its size and XXH3-128 in the pack's manifest: it is damaged", path);
            rc = K3_EXIT_DATA;
        }
    }
    k3_manifest_free(&m);
    if (rc) { free(*text); *text = NULL; }
    return rc;
}

int k3_cli_gen_defaults(const char *pack, k3_sampler_opts *so, const char **from)
{
    char path[4200];
    char *text = NULL;
    size_t len = 0;
    memset(so, 0, sizeof *so);
    so->temp = K3_CHAT_TEMP;
    so->top_p = K3_CHAT_TOP_P;
    so->repeat_penalty = 1.0f;
    *from = "k3";
    if (!pack) return 0;
    int rc0 = read_gen_config(pack, path, sizeof path, &text, &len);
    if (rc0 || !text) return rc0;
    json_error_t je;
    json_t *doc = json_loadb(text, len, 0, &je);
    free(text);
    if (!doc || !json_is_object(doc)) {
        if (doc) k3_error("'%s' is not a JSON object", path);
        else k3_error("'%s' is not valid JSON: %s (line %d, column %d)", path, je.text, je.line, je.column);
        json_decref(doc);
        return K3_EXIT_DATA;
    }
    json_t *ds = json_object_get(doc, "do_sample");
    double temp = so->temp, top_p = so->top_p, top_k = 0, min_p = 0, rep = 1;
    int rc = 0;
    if (ds && !json_is_boolean(ds) && !json_is_null(ds)) {
        k3_error("'%s': \"do_sample\" is not true or false", path);
        rc = K3_EXIT_DATA;
    }
    if (!rc && json_object_get(doc, "temperature")) top_p = 1.0;   /* the file's own values, nothing of ours */
    if (!rc && !json_object_get(doc, "temperature") && json_object_get(doc, "top_p")) temp = 1.0;
    if (!rc && !(rc = gen_number(doc, path, "temperature", 0, 100, &temp)) &&
        !(rc = gen_number(doc, path, "top_p", 1e-9, 1, &top_p)) &&
        !(rc = gen_number(doc, path, "top_k", 0, 4294967295.0, &top_k)) &&
        !(rc = gen_number(doc, path, "min_p", 0, 0.999999, &min_p)))
        rc = gen_number(doc, path, "repetition_penalty", 1e-6, 100, &rep);
    if (!rc && top_k != floor(top_k)) {
        k3_error("'%s': \"top_k\" is %g: give a whole number", path, top_k);
        rc = K3_EXIT_DATA;
    }
    if (!rc) {
        so->temp = ds && json_is_false(ds) ? 0.0f : (float)temp;
        so->top_p = (float)top_p;
        so->top_k = (uint32_t)top_k;
        so->min_p = (float)min_p;
        so->repeat_penalty = (float)rep;
        static const char *const keys[] = { "do_sample", "temperature", "top_p", "top_k", "min_p",
                                            "repetition_penalty" };
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (json_object_get(doc, keys[i])) *from = K3_GENCONFIG_NAME;   /* else it says nothing of sampling */
    }
    json_decref(doc);
    return rc;
}

void k3_cli_version(const char *extra)
{
    k3_version_print(stdout, k3_log_prog());
    printf("kernels: scalar, avx2, avx512 (this CPU:");
    for (int i = 0; i < K3_ISA__COUNT; i++)
        if (k3_isa_supported((k3_isa)i)) printf(" %s", k3_isa_name((k3_isa)i));
    printf("; used: %s unless K3_ISA says otherwise)\n", k3_isa_name(k3_isa_best()));
    printf("MPI: %s\n", k3_dist_built() ? "yes (mpirun -n R k3run ...: experts spread over the ranks)"
                                         : "no (this build refuses to run under mpirun)");
    if (extra) printf("%s\n", extra);
}

int k3_cli_gen_parse(const k3_args *a, const k3_cli_gen_ids *ids, const char *pack, const char *needs, k3_cli_gen *g,
                     k3_load_opts *lo)
{
    k3_diag d;
    int rc;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t topk, draft;
    k3_sampler_opts gd;                              /* the defaults: the pack's, else Moonshot's */
    k3_sampler_opts *so = g->so;
    if ((rc = k3_cli_gen_defaults(pack, &gd, &g->so_from))) return rc;
    if ((rc = k3_cli_u32(a, ids->n, 1024, 1, 1u << 30, "n-predict", &g->n_predict)) ||
        (rc = k3_cli_u32(a, ids->think_budget, 0, 0, 1u << 30, "think-budget", &g->think_budget)) ||
        (rc = k3_cli_u32(a, ids->threads, ncpu > 0 ? (uint64_t)ncpu : 1, 1, 1024, "threads", &g->threads)) ||
        (rc = k3_cli_u32(a, ids->context, 4096, 16, 1u << 24, "context", &lo->context)) ||
        (rc = k3_cli_batch(a, ids->batch, &lo->batch)) ||
        (rc = k3_cli_u32(a, ids->snapshots, 2, 0, 64, "snapshots", &lo->snapshots)) ||
        (rc = k3_cli_u32(a, ids->draft, K3_DRAFT_DEFAULT, 0, K3_DRAFT_MAX, "draft", &draft)) ||
        (rc = k3_cli_u32(a, ids->topk, gd.top_k, 0, UINT32_MAX, "top-k", &topk)) ||
        (rc = k3_cli_float(a, ids->temp, gd.temp, "temp", &so->temp)) ||
        (rc = k3_cli_float(a, ids->topp, gd.top_p, "top-p", &so->top_p)) ||
        (rc = k3_cli_float(a, ids->minp, gd.min_p, "min-p", &so->min_p)) ||
        (rc = k3_cli_float(a, ids->repeat, gd.repeat_penalty, "repeat-penalty", &so->repeat_penalty)) ||
        (rc = k3_cli_budget(a, ids->budget, ids->preset, &lo->budget)))
        return rc;
    so->top_k = topk;
    if (k3_opt_u64(a, ids->seed, 0, 0, &so->seed, &d)) return k3_usage_error("%s", d.msg);
    if (k3_sampler_check(so, &d)) return k3_usage_error("%s", d.msg);
    omp_set_num_threads((int)g->threads);
    if (k3_isa_choose(getenv("K3_ISA"), &lo->isa, &d)) return k3_usage_error("K3_ISA: %s", d.msg);
    lo->pack = pack;
    lo->verify = k3_opt_count(a, ids->verify) > 0;
    lo->verify_reads = !k3_opt_count(a, ids->no_verify_reads);
    lo->spec_tokens = draft ? draft + 1 : 0;
    lo->generate_tokens = g->n_predict;              /* -b auto prices an answer of -n tokens */
    if (k3_cli_check_pack(pack, &d)) { k3_error("%s", d.msg); return K3_EXIT_IO; }
    char tik[4200];
    if (!k3_cli_has_tokenizer(pack, tik, sizeof tik))
        return k3_usage_error("the pack has no tokenizer ('%s' does not exist): %s needs one; copy the "
                              "checkpoint's tiktoken.model and tokenizer_config.json into the pack", tik, needs);
    return 0;
}

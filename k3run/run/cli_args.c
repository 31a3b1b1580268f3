/*
 * cli_args.c - command-line pieces k3run's front ends share (cli_args.h).
 */
#include "cli_args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"
#include "k3_file.h"

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

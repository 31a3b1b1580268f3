/*
 * k3verify - check a k3 pack before a run and name what is damaged, or check
 * a downloaded safetensors checkpoint against its config before packing.
 * The checks live in verify_pack.c and verify_checkpoint.c, the output in
 * verify_report.c; usage and output grammar: docs/k3verify.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_download.h"
#include "k3_version.h"
#include "k3_error.h"
#include "k3_log.h"
#include "k3_opts.h"
#include "k3verify.h"

enum { OPT_QUICK = K3_OPT_USER, OPT_SUBSET, OPT_JSON, OPT_THREADS, OPT_CHECKPOINT, OPT_SHA256 };

static const k3_opt opts[] = {
    {OPT_QUICK, 0, "quick", NULL, NULL, NULL,
     "check the listing, sizes, shard headers and the manifest only; do not hash the data"},
    {OPT_SUBSET, 0, "subset", "N/T", NULL, NULL,
     "hash only the shards whose manifest index i has i % T == N-1 (1 <= N <= T), and the checkpoint files "
     "(in-place packs) whose index j in checkpoint_files has j % T == N-1; the manifest, the listing, the "
     "tokenizer files and the checkpoint files' sizes and headers are always checked"},
    {OPT_JSON, 0, "json", NULL, NULL, NULL, "write JSON Lines on stdout instead of check lines"},
    {OPT_THREADS, 't', "threads", "N", "1", "K3_THREADS", "verify N shards (or hash N checkpoint files) in parallel; the output keeps its order"},
    {OPT_CHECKPOINT, 0, "checkpoint", "DIR", NULL, NULL,
     "check a safetensors checkpoint (directory or file) against its config.json instead of a pack"},
    {OPT_SHA256, 0, "sha256", "SUMS", NULL, NULL,
     "with --checkpoint: check every file against the SHA-256 in SUMS (as sha256sum writes it); a Hugging Face "
     "cache snapshot is checked against its blobs' names without it"},
    K3_OPTS_COMMON,
};
#define N_OPTS ((int)(sizeof opts / sizeof opts[0]))

static const char purpose[] =
    "Check a k3 pack before a run and name what is damaged: the manifest, every shard's size, header and\n"
    "agreement with the manifest, then every shard read once (XXH3-128 of the file, XXH3-64 of every\n"
    "tensor and expert record, zero padding), the tokenizer files, and files the manifest does not list.\n"
    "A pack whose expert records stay in the checkpoint (format 3, k3pack --experts-in-place) has its\n"
    "'checkpoint' link and each checkpoint file it reads checked too: size, safetensors header, and\n"
    "the XXH3-64 of every record read in place.\n"
    "With --checkpoint, check a downloaded safetensors checkpoint against its config.json instead.\n"
    "\n"
    "Output: one line per file on stdout, 'NAME: OK' or 'NAME: FAILED (reason; ...)', and a summary on\n"
    "stderr; -q leaves out the OK lines. A progress line is shown on stderr when it is a terminal.";

static const char footer[] =
    "Examples:\n"
    "  k3verify /data/k3-pack                    full check (reads every byte once)\n"
    "  k3verify --quick /data/k3-pack            sizes, headers and manifest in seconds\n"
    "  k3verify --subset 3/7 -q /data/k3-pack    one seventh of the shards (e.g. day 3 of a week)\n"
    "  k3verify --json /data/k3-pack | jq -c 'select(.status==\"failed\")'\n"
    "  k3verify --checkpoint /data/Kimi-K3       before k3pack: tensors, dtypes, shapes vs config.json\n"
    "\n"
    "Exit status 1 means something FAILED (damage found; it wins over 3); 3 means a file could not be\n"
    "read and nothing was found damaged (also a missing checkpoint file or a broken 'checkpoint' link of an\n"
    "in-place pack: fix it with ln -sfn DIR PACK/checkpoint).\n";

static int parse_subset(const char *s, uint32_t *n, uint32_t *t)
{
    char *end;
    unsigned long a = strtoul(s, &end, 10);
    if (end == s || *end != '/' || s[0] < '0' || s[0] > '9') return -1;
    const char *s2 = end + 1;
    if (*s2 < '0' || *s2 > '9') return -1;
    unsigned long b = strtoul(s2, &end, 10);
    if (*end || a < 1 || b < 1 || a > b || b > (1ul << 30)) return -1;
    *n = (uint32_t)a;
    *t = (uint32_t)b;
    return 0;
}

int main(int argc, char **argv)
{
    k3_log_init(argv[0]);
    setvbuf(stdout, NULL, _IOLBF, 0);    /* whole lines, even into a pipe */
    k3_args a;
    k3_diag d;
    if (k3_opts_parse(opts, N_OPTS, argc, argv, &a, &d)) return k3_usage_error("%s", d.msg);
    if (k3_opt_count(&a, K3_OPT_HELP)) {
        k3_opts_help(stdout, "k3verify [OPTIONS] PACK\n       k3verify --checkpoint DIR [OPTIONS]", purpose, opts,
                     N_OPTS, footer);
        return K3_EXIT_OK;
    }
    if (k3_opt_count(&a, K3_OPT_VERSION)) {
        k3_version_print(stdout, k3_log_prog());
        char sha[128];
        k3_dl_describe(sha, sizeof sha);
        printf("%s (--checkpoint)\n", sha);
        return K3_EXIT_OK;
    }
    k3v_pack_opts po = {0};
    po.quick = k3_opt_count(&a, OPT_QUICK) > 0;
    po.buf_size = 16u << 20;
    uint64_t threads;
    if (k3_opt_u64(&a, OPT_THREADS, 1, 0, &threads, &d)) return k3_usage_error("%s", d.msg);
    if ((threads < 1 || threads > 1024) && k3_opt_from_env(&a, OPT_THREADS)) {
        k3_warn("ignoring environment variable K3_THREADS=%llu: not between 1 and 1024", (unsigned long long)threads);
        threads = 1;
    }
    if (threads < 1 || threads > 1024) return k3_usage_error("option '--threads': N must be between 1 and 1024");
    po.threads = (int)threads;
    const char *subset = k3_opt_str(&a, OPT_SUBSET);
    if (subset && parse_subset(subset, &po.subset_n, &po.subset_t)) {
        char msg[256];
        snprintf(msg, sizeof msg, "option '--subset': '%.100s' is not N/T with 1 <= N <= T", subset);
        return k3_usage_error("%s", msg);
    }
    k3v_report r;
    k3v_report_init(&r, stdout, k3_opt_count(&a, OPT_JSON) > 0, k3_opt_count(&a, K3_OPT_QUIET) > 0,
                    k3_opt_count(&a, K3_OPT_VERBOSE) > 0);
    const char *ckpt = k3_opt_str(&a, OPT_CHECKPOINT);
    if (ckpt) {
        if (a.n_pos) return k3_usage_error("--checkpoint DIR takes no other argument");
        if (po.quick || subset)
            return k3_usage_error("--quick and --subset apply to packs, not to --checkpoint");
        return k3v_verify_checkpoint(ckpt, k3_opt_str(&a, OPT_SHA256), po.threads, &r);
    }
    if (k3_opt_str(&a, OPT_SHA256)) return k3_usage_error("--sha256 SUMS goes with --checkpoint DIR");
    if (a.n_pos != 1) return k3_usage_error("%s", a.n_pos ? "expected one PACK directory" : "missing PACK directory");
    return k3v_verify_pack(a.pos[0], &po, &r);
}

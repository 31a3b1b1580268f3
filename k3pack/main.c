/*
 * k3pack - convert a Kimi K3 safetensors checkpoint (a directory, one
 * .safetensors file, or a tar / tar.gz / tar.zst archive, also on stdin) into
 * a k3 pack (docs/FORMAT.md). Streaming, bounded memory, resumable after any
 * interruption, deterministic.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "k3_version.h"
#include "k3_ckpt_check.h"
#include "k3_log.h"
#include "k3_opts.h"
#include "k3_sys.h"
#include "pack.h"

enum { O_OUT = K3_OPT_USER, O_EXPERTS, O_TRUNK, O_IN_PLACE, O_DRY, O_JSON, O_THREADS, O_FORCE, O_SHA256 };

static const k3_opt opts[] = {
    {O_OUT, 'o', "output", "PACK", NULL, NULL, "output directory (created if missing)"},
    {O_EXPERTS, 0, "experts", "MODE", "auto", NULL,
     "auto: keep the checkpoint's experts; mxfp4: quantize BF16 experts to MXFP4 (OCP rule); bf16: keep BF16 experts"},
    {O_TRUNK, 0, "trunk", "MODE", "exact", NULL,
     "exact: the trunk as the checkpoint has it (BF16); q8: its large matrices as 8-bit codes with a "
     "power-of-two scale per 32 (format 3; INEXACT: half the trunk's bytes, the measured cost is in "
     "docs/PERFORMANCE.md)"},
    {O_IN_PLACE, 0, "experts-in-place", NULL, NULL, NULL,
     "leave the routed experts in the checkpoint's files: the pack holds the trunk and locates each expert "
     "record there (format 3; a directory source only; the checkpoint must stay)"},
    {O_DRY, 'n', "dry-run", NULL, NULL, NULL, "validate the input and print the plan; write nothing"},
    {O_JSON, 0, "json", NULL, NULL, NULL, "JSON Lines records on stdout (plan, shards, summary)"},
    {O_THREADS, 't', "threads", "N", "1", "K3_THREADS", "checkpoint files read in parallel (directory input)"},
    {O_SHA256, 0, "sha256", "SUMS", NULL, NULL,
     "check each checkpoint file against its SHA-256 in SUMS (as sha256sum writes it) as it is read for "
     "packing; a Hugging Face cache snapshot is checked against its blobs' names without it"},
    {O_FORCE, 'f', "force", NULL, NULL, NULL, "replace a finished pack in PACK"},
    K3_OPTS_COMMON,
};
#define N_OPTS ((int)(sizeof opts / sizeof opts[0]))

static const char usage_footer[] =
    "SRC is a checkpoint directory (config.json, model-*.safetensors, model.safetensors.index.json,\n"
    "tiktoken.model, tokenizer_config.json), a single .safetensors file with config.json beside it,\n"
    "or a .tar / .tar.gz / .tar.zst of such a directory ('-' reads the archive from stdin, where config.json\n"
    "must come before the weights: tar -cf - --sort=name -C DIR . makes such an archive; an archive file\n"
    "in any order is read twice when config.json comes late). The input is validated against config.json\n"
    "before anything is written. An interrupted run (Ctrl-C, kill -9, a full disk) resumes when rerun with\n"
    "the same arguments and gives the same bytes; a resume from input files that changed is refused\n"
    "(--force starts over). The same checkpoint gives the same pack whatever --threads and the input kind.\n"
    "With --experts-in-place the pack needs only the trunk's disk space (Kimi K3: 108 GB beside the 1.56 TB\n"
    "checkpoint) and links to the checkpoint as PACK/checkpoint; nothing in the checkpoint is changed, and\n"
    "every record is hash-checked when it is read. If the checkpoint moves: ln -sfn NEWDIR PACK/checkpoint.\n"
    "Every checkpoint file is read once, front to back, and its SHA-256 is computed on those bytes and\n"
    "recorded in the manifest (which download the pack came from); with --sha256 SUMS, or from a Hugging\n"
    "Face cache snapshot (.../snapshots/REV/, files linked to blobs named by their hashes), a file that is\n"
    "not as published stops k3pack (exit 1, naming it) and nothing made from it is kept.\n"
    "\nExample:\n  k3pack ~/models/Kimi-K3 -o ~/packs/k3 && k3verify ~/packs/k3\n";

/* The small files k3pack reads whole: each checked against its published hash when one is known, and
   recorded with its SHA-256. The config and the tokenizer files are hashed as read (the bytes the pack
   holds); the index, which k3_st_open read and let go, is read again. */
static k3_err side_files(pk_writer *w, const k3_st_ckpt *ck, const k3_dl *dl, const char *const *tok_names,
                         char *const *tok_data, const size_t *tok_len, int *bad, k3_diag *d)
{
    const char *names[2 + PK_MAX_TOK] = {"config.json", K3_ST_INDEX_NAME};
    const char *data[2 + PK_MAX_TOK] = {ck->config_json, NULL};
    size_t len[2 + PK_MAX_TOK] = {ck->config_len, 0};
    for (int i = 0; i < PK_MAX_TOK; i++) {
        names[2 + i] = tok_names[i];
        data[2 + i] = tok_data[i];
        len[2 + i] = tok_len[i];
    }
    for (int i = 0; i < 2 + PK_MAX_TOK; i++) {
        char path[4096];
        struct stat st;
        if (!ck->dir || k3_path_join(path, sizeof path, ck->dir, names[i], NULL)) continue;
        const k3_dl_want *want = k3_dl_find(dl, names[i]);
        uint8_t sha[32];
        uint64_t n = len[i];
        k3_err e;
        if (data[i]) {
            k3_dl_hash h;
            k3_dl_hash_begin(&h, want, n);
            k3_dl_hash_update(&h, data[i], n);
            e = k3_dl_hash_end(&h, want, path, sha, d);
        } else if (i == 1 && stat(path, &st) == 0) {
            e = k3_dl_hash_file(path, want, sha, &n, d);
        } else {
            continue;                                /* the checkpoint has no such file */
        }
        if (e == K3_ERR_CORRUPT) *bad = 1;
        if (e || (e = pk_add_src_file(w, names[i], n, sha, d))) return e;
    }
    return K3_OK;
}

static void on_signal(int sig)
{
    pk_interrupted = sig;
    signal(sig, SIG_DFL);         /* a second Ctrl-C stops at once */
}

static int is_archive(const char *src)
{
    struct stat st;
    if (!strcmp(src, "-")) return 1;
    if (stat(src, &st) != 0 || S_ISDIR(st.st_mode)) return 0;
    size_t n = strlen(src);
    return !(n > 12 && !strcmp(src + n - 12, ".safetensors"));
}

static void print_problem(void *ctx, const char *msg)
{
    (void)ctx;
    k3_error("%s", msg);
}

static int fail(k3_err e, const k3_diag *d, int json)
{
    k3_error("%s", d->msg);
    if (json)
        printf("{\"schema\":1,\"type\":\"exit_error\",\"code\":%d,\"message\":\"see stderr\"}\n", k3_exit_code(e));
    return k3_exit_code(e);
}

/* Read a small optional file beside the checkpoint: absent is fine (*data
   stays NULL), unreadable or too large is an error, as from an archive. */
static k3_err read_side(const char *dir, const char *name, char **data, size_t *len, k3_diag *d)
{
    char p[4096];
    *data = NULL;
    *len = 0;
    k3_err e = k3_path_join(p, sizeof p, dir, name, d);
    if (!e) e = k3_read_file(p, 64u << 20, data, len, d);
    return e == K3_ERR_NOT_FOUND ? K3_OK : e;
}

int main(int argc, char **argv)
{
    k3_log_init(argv[0]);
    k3_args a;
    k3_diag d = {0};
    if (k3_opts_parse(opts, N_OPTS, argc, argv, &a, &d)) return k3_usage_error("%s", d.msg);
    if (k3_opt_count(&a, K3_OPT_HELP)) {
        k3_opts_help(stdout, "k3pack [OPTIONS] SRC -o PACK", "Convert a safetensors checkpoint into a k3 pack.",
                     opts, N_OPTS, usage_footer);
        return K3_EXIT_OK;
    }
    if (k3_opt_count(&a, K3_OPT_VERSION)) {
        k3_version_print(stdout, "k3pack");
        printf("pack format %d; %d with --experts-in-place\n", K3_PACK_VERSION, K3_PACK_VERSION_MAX);
        char sha[128];
        k3_dl_describe(sha, sizeof sha);
        printf("%s\n", sha);
        return K3_EXIT_OK;
    }
    int json = k3_opt_count(&a, O_JSON) > 0, dry = k3_opt_count(&a, O_DRY) > 0;
    int in_place = k3_opt_count(&a, O_IN_PLACE) > 0;
    const char *trunk_s = k3_opt_str(&a, O_TRUNK);
    int trunk_q8 = trunk_s && !strcmp(trunk_s, "q8");
    if (trunk_s && !trunk_q8 && strcmp(trunk_s, "exact")) return k3_usage_error("'--trunk' takes exact or q8");
    const char *out = k3_opt_str(&a, O_OUT), *mode_s = k3_opt_str(&a, O_EXPERTS);
    if (a.n_pos != 1) return k3_usage_error("%s", a.n_pos ? "exactly one SRC expected" : "missing SRC");
    if (!out && !dry) return k3_usage_error("missing '-o PACK'");
    pk_expert_mode mode = PK_EXPERTS_AUTO;
    if (mode_s && !strcmp(mode_s, "mxfp4")) mode = PK_EXPERTS_MXFP4;
    else if (mode_s && !strcmp(mode_s, "bf16")) mode = PK_EXPERTS_BF16;
    else if (mode_s && strcmp(mode_s, "auto")) return k3_usage_error("'--experts' takes auto, mxfp4 or bf16");
    uint64_t threads;
    if (k3_opt_u64(&a, O_THREADS, 1, 0, &threads, &d)) return k3_usage_error("%s", d.msg);
    if ((threads < 1 || threads > 256) && k3_opt_from_env(&a, O_THREADS)) {
        k3_warn("ignoring environment variable K3_THREADS=%llu: not between 1 and 256", (unsigned long long)threads);
        threads = 1;
    }
    if (threads < 1 || threads > 256) return k3_usage_error("'--threads' must be between 1 and 256");
    const char *src = a.pos[0];
    double t0 = k3_now();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;    /* no SA_RESTART: a read from stdin returns, the source polls the flag */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    /* 1. open the input and read config.json */
    int archive = is_archive(src);
    if (archive && in_place)
        return k3_usage_error("'--experts-in-place' needs a checkpoint directory (or a .safetensors file): the "
                              "records of an archive cannot be read in place");
    k3_st_ckpt ck;
    pk_archive ar;
    memset(&ck, 0, sizeof ck);
    memset(&ar, 0, sizeof ar);
    const char *config;
    size_t config_len;
    k3_err e;
    if (archive) {
        if ((e = pk_archive_open(&ar, src, &d))) { pk_archive_close(&ar); return fail(e, &d, json); }
        config = ar.config;
        config_len = ar.config_len;
    } else {
        if ((e = k3_st_open(src, &ck, &d))) return fail(e, &d, json);
        for (size_t i = 0; i < ck.n_warnings; i++) k3_warn("%s", ck.warnings[i]);
        if (!ck.config_json && ck.dir) {     /* a lone .safetensors file: config.json beside it */
            char *cj;
            size_t cl;
            if ((e = read_side(ck.dir, "config.json", &cj, &cl, &d))) {
                k3_st_close(&ck);
                return fail(e, &d, json);
            }
            ck.config_json = cj;
            ck.config_len = cl;
        }
        if (!ck.config_json) {
            k3_st_close(&ck);
            k3_fail(&d, K3_ERR_MODEL, "no config.json beside '%s': k3pack needs the model's config", src);
            return fail(K3_ERR_MODEL, &d, json);
        }
        config = ck.config_json;
        config_len = ck.config_len;
    }

    /* 1b. what the download should hash to: the Hub cache's blob names, --sha256 SUMS */
    k3_dl dl;
    memset(&dl, 0, sizeof dl);
    const char *sums = k3_opt_str(&a, O_SHA256);
    char dl_what[4400];
    const char *checked = NULL;
    if ((e = k3_dl_load(&dl, archive ? NULL : ck.dir, sums, &d))) {
        if (archive) pk_archive_close(&ar);
        else k3_st_close(&ck);
        return fail(e, &d, json);
    }
    checked = k3_dl_what(&dl, dl_what, sizeof dl_what);
    if (!archive && sums)                        /* every weights file must be covered */
        for (size_t i = 0; i < ck.n_files && !e; i++)
            if (!k3_dl_find(&dl, ck.files[i].name))
                e = k3_fail(&d, K3_ERR_USAGE, "'%s' has no line for '%s': its download cannot be checked", sums,
                            ck.files[i].name);
    if (e) {
        k3_dl_free(&dl);
        k3_st_close(&ck);
        return fail(e, &d, json);
    }

    /* 2. the plan, and (directory input) the full check before any output */
    pk_plan plan;
    int rc = K3_EXIT_OK;
    char *tok_data[PK_MAX_TOK] = {0};
    size_t tok_len[PK_MAX_TOK] = {0};
    const char *tok_names[PK_MAX_TOK] = {"tiktoken.model", "tokenizer_config.json", K3_GENCONFIG_NAME};
    char **skipped = NULL;
    size_t n_skipped = 0;
    k3_ckpt_match match;
    memset(&match, 0, sizeof match);
    pk_input *inputs = NULL;      /* [n_inputs] what the resume fingerprint covers */
    size_t n_inputs = 0;
    if ((e = pk_plan_build(&plan, config, config_len, mode, trunk_q8, &d))) {
        rc = fail(e, &d, json);
        goto out_src;
    }
    if (!archive) {
        k3_xlist xl;
        if ((e = k3_expected_tensors(&plan.cfg, &xl, &d))) { rc = fail(e, &d, json); goto out_plan; }
        e = k3_ckpt_match_config(&ck, &plan.cfg, &xl, print_problem, NULL, &match, &d);
        k3_xlist_free(&xl);
        if (e) { rc = fail(e, &d, json); goto out_plan; }
        if ((e = pk_inputs_from_ckpt(&ck, &inputs, &n_inputs, &d))) { rc = fail(e, &d, json); goto out_plan; }
        skipped = calloc(match.n_skipped + 1, sizeof *skipped);
        if (!skipped) { rc = fail(k3_fail(&d, K3_ERR_NOMEM, "out of memory"), &d, json); goto out_plan; }
        for (size_t i = 0; i < match.n_skipped; i++) skipped[i] = (char *)ck.tensors[match.skipped[i]].name;
        n_skipped = match.n_skipped;
        for (int i = 0; i < PK_MAX_TOK; i++)
            if ((e = read_side(ck.dir, tok_names[i], &tok_data[i], &tok_len[i], &d))) {
                rc = fail(e, &d, json);
                goto out_plan;
            }
    }
    if (in_place && (e = pk_plan_in_place(&plan, &ck, &d))) {
        rc = fail(e, &d, json);
        goto out_plan;
    }
    if (dry) {
        pk_plan_print(&plan, stdout, json);
        if (!archive && !json) printf("skipped: %zu vision tensors\n", n_skipped);
        goto out_plan;
    }

    /* 3. the output directory: lock, resume, space */
    int lock_fd = -1, finished_journal = 0, force = k3_opt_count(&a, O_FORCE) > 0;
    if ((e = pk_prepare_output(out, force, &lock_fd, &finished_journal, &d))) {
        rc = fail(e, &d, json);
        goto out_plan;
    }
    pk_writer w;
    if ((e = pk_writer_init(&w, &plan, out, json, &d))) {
        rc = fail(e, &d, json);
        goto out_lock;
    }
    if (archive) pk_set_inputs(&w, ar.input.name[0] ? &ar.input : NULL, ar.input.name[0] ? 1 : 0);
    else pk_set_inputs(&w, inputs, n_inputs);
    w.download_checked = checked;
    if (finished_journal) {
        /* killed after manifest.json, before the journal went: this is our pack, finished */
        if ((e = pk_finished_journal(&w, &d))) rc = fail(e, &d, json);
        else k3_info("'%s' holds this pack, finished; removed the journal an interrupted run left", out);
        goto out_writer;
    }
    if ((e = pk_resume(&w, force, &d))) {
        rc = fail(e, &d, json);
        goto out_writer;
    }
    uint64_t need = 0, avail;
    for (uint32_t s = 0; s < plan.n_shards; s++)
        if (!w.done[s] && !(plan.in_place && plan.in_place[s])) need += plan.shards[s].h.file_size;
    if ((e = k3_free_space(out, &avail, &d))) { rc = fail(e, &d, json); goto out_writer; }
    uint64_t want = need + (need >> 6);          /* 1/64 more for the file system's own blocks */
    if (avail < want) {
        char hn[24], ha[24];
        /* say what is asked for, margin included: "has 8.54 MiB, needs 8.47 MiB" was a refusal */
        k3_fail(&d, K3_ERR_NOSPACE, "'%s' has %s free; the pack needs %s more (its shards plus 1/64 for the "
                "file system)", out, k3_human_bytes((double)avail, ha, sizeof ha),
                k3_human_bytes((double)want, hn, sizeof hn));
        rc = fail(K3_ERR_NOSPACE, &d, json);
        goto out_writer;
    }

    /* 4. write: the side files checked (small, read again), then every weights file streamed, each
       byte hashed on the way (an in-place pack too: its records are hashed where they lie as they
       pass) */
    int bad_download = 0;
    if (!archive) e = side_files(&w, &ck, &dl, tok_names, tok_data, tok_len, &bad_download, &d);
    k3_progress_start(&w.prog, "k3pack", plan.src_bytes);
    if (e) {
    } else if (archive) {
        w.streamed = 1;
        e = pk_archive_pack(&ar, &w, &dl, &d);
        bad_download = ar.download_bad;
    } else {                                          /* a copy or --experts-in-place: the same one read */
        w.streamed = 1;
        e = pk_pack_stream_ckpt(&w, &ck, &dl, (int)threads, &bad_download, &d);
    }
    if (archive && !e) {
        for (int i = 0; i < PK_MAX_TOK; i++) {
            tok_data[i] = ar.tok_data[i];
            tok_len[i] = ar.tok_len[i];
            ar.tok_data[i] = NULL;
        }
        skipped = ar.skipped;
        n_skipped = ar.n_skipped;
    }
    k3_progress_end(&w.prog);
    if (e) {
        pk_writer_abort(&w);
        if (bad_download) pk_writer_discard(&w);   /* nothing made from a damaged download stays */
        rc = fail(e, &d, json);
        if (e == K3_ERR_NOSPACE || pk_interrupted)
            k3_error("%u of %u shards are finished and kept in '%s' (its journal lists them); %srerun the same "
                     "command to resume", w.shards_done, plan.n_shards, out,
                     e == K3_ERR_NOSPACE ? "free space on its file system, then " : "");
        goto out_writer;
    }

    /* 5. tokenizer files and the manifest, last */
    const char *names[PK_MAX_TOK];
    char *datas[PK_MAX_TOK];
    size_t lens[PK_MAX_TOK];
    int n_tok = 0;
    for (int i = 0; i < PK_MAX_TOK; i++)
        if (tok_data[i]) {
            names[n_tok] = tok_names[i];
            datas[n_tok] = tok_data[i];
            lens[n_tok++] = tok_len[i];
        } else if (strcmp(tok_names[i], K3_GENCONFIG_NAME)) {     /* the sampling defaults are optional */
            k3_warn("no '%s' in the checkpoint: the pack will have no tokenizer", tok_names[i]);
        }
    if ((e = pk_finish_pack(&w, names, datas, lens, n_tok, skipped, n_skipped, &d))) {
        rc = fail(e, &d, json);
        goto out_writer;
    }
    {
        double el = k3_now() - t0;
        int resumed = 0;
        for (uint32_t s = 0; s < plan.n_shards; s++) resumed += w.resumed[s];
        double rel = w.qstats.ref2 > 0 ? sqrt(w.qstats.err2 / w.qstats.ref2) : 0;
        if (json) {
            printf("{\"schema\":1,\"type\":\"summary\",\"shards\":%u,\"resumed\":%d,\"pack_bytes\":%" PRIu64
                   ",\"checkpoint_bytes\":%" PRIu64 ",\"skipped\":%zu,\"seconds\":%.3f,\"peak_rss\":%" PRIu64
                   ",\"experts_in_place\":%u,\"in_place_bytes\":%" PRIu64,
                   plan.n_shards - plan.n_in_place, resumed, plan.total_bytes, plan.src_bytes, n_skipped, el,
                   k3_peak_rss_bytes(), plan.n_in_place, plan.in_place_bytes);
            if (plan.quantize)
                printf(",\"quantization\":{\"rule\":\"ocp-floor-rne-sat\",\"elements\":%" PRIu64
                       ",\"relative_rmse\":%.6g,\"saturated\":%" PRIu64 "}", w.qstats.n, rel, w.qstats.saturated);
            if (plan.trunk_q8)
                printf(",\"trunk\":{\"encoding\":\"Q8\",\"rule\":\"%s\",\"elements\":%" PRIu64 ",\"relative_rmse\":%.6g}",
                       K3_Q8_RULE, w.q8stats.n, w.q8stats.ref2 > 0 ? sqrt(w.q8stats.err2 / w.q8stats.ref2) : 0.0);
            printf("}\n");
        } else if (k3_log_level() >= K3_LOG_NORMAL) {
            char hb[24], hr[24];
            fprintf(stderr, "k3pack: wrote '%s': %u shards (%d resumed), %s in %.1f s (%s/s), %zu vision tensors skipped\n",
                    out, plan.n_shards - plan.n_in_place, resumed,
                    k3_human_bytes((double)plan.total_bytes, hb, sizeof hb), el,
                    k3_human_bytes(el > 0 ? (double)plan.src_bytes / el : 0, hr, sizeof hr), n_skipped);
            if (checked)
                fprintf(stderr, "k3pack: the download was checked: every file's SHA-256 against %s\n", checked);
            else
                fprintf(stderr, "k3pack: the download itself was not checked (no --sha256 SUMS, not a Hugging Face "
                        "cache snapshot); the pack records each file's SHA-256 as read, compare them with the "
                        "publisher's: k3inspect --shards %s\n", out);
            if (plan.n_in_place) {
                char hi[24];
                fprintf(stderr, "k3pack: the experts of %u layers (%s) are read in place from '%s' (the link "
                        "'%s/checkpoint')\n", plan.n_in_place, k3_human_bytes((double)plan.in_place_bytes, hi, sizeof hi),
                        plan.ckpt_dir, out);
            }
            if (plan.quantize)
                fprintf(stderr, "k3pack: quantized %" PRIu64 " expert weights to MXFP4: relative RMS error %.4f, "
                        "%" PRIu64 " saturated\n", w.qstats.n, rel, w.qstats.saturated);
            if (plan.trunk_q8)
                fprintf(stderr, "k3pack: the trunk is compact (INEXACT): %" PRIu64 " weights as Q8, relative RMS error "
                        "%.4f; its cost in quality is measured in docs/PERFORMANCE.md\n", w.q8stats.n,
                        w.q8stats.ref2 > 0 ? sqrt(w.q8stats.err2 / w.q8stats.ref2) : 0.0);
        }
    }
out_writer:
    pk_writer_free(&w);
out_lock:
    if (lock_fd >= 0) close(lock_fd);
out_plan:
    pk_plan_free(&plan);
out_src:
    for (int i = 0; i < PK_MAX_TOK; i++) free(tok_data[i]);
    if (!archive) free(skipped);
    k3_ckpt_match_free(&match);
    if (archive) pk_archive_close(&ar);
    else k3_st_close(&ck);
    k3_dl_free(&dl);
    free(inputs);
    if (pk_interrupted && rc != K3_EXIT_OK) {   /* die of the signal, as the shell expects (exit status 128 + n) */
        signal(pk_interrupted, SIG_DFL);
        raise(pk_interrupted);
    }
    return rc;
}

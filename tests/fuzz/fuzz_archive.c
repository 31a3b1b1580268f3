/*
 * fuzz_archive.c - libFuzzer target: k3pack's archive input (tar, tar.gz,
 * tar.zst through libarchive; k3pack/pack_source_archive.c). The input is the
 * archive file. It goes through k3pack's steps (main.c) that read the input:
 * open and read up to config.json, plan, stream the entries into shards in a
 * fresh output directory, finish with the tokenizer files and manifest.json
 * (locking, resume and the journal are left out: they do not read the archive). A failure must
 * be a clean error (never internal) and leave no finished manifest; a success
 * must leave a pack whose manifest loads and whose shards are on disk with
 * the sizes it lists. Plans over 16 MiB are not written (a fuzzed config can
 * describe a terabyte model).
 */
#include "fuzz_util.h"

#include <sys/stat.h>

#include "k3_log.h"
#include "k3_manifest.h"
#include "pack.h"

#define MAX_PACK_BYTES (16u << 20)

static char g_out[512];

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st; (void)flag;
    return ftw->level ? remove(p) : 0;      /* empty the directory, keep it */
}

static void check_pack(const char *out)
{
    k3_manifest m;
    k3_diag d = {0};
    k3_err e = k3_manifest_load(out, &m, &d);
    if (e) {
        fprintf(stderr, "k3pack finished but its manifest does not load: %s\n", d.msg);
        abort();
    }
    for (uint32_t i = 0; i < m.n_shards; i++) {
        char p[1024];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", out, m.shards[i].name);
        FZ_EXPECT(stat(p, &st) == 0 && (uint64_t)st.st_size == m.shards[i].size);
    }
    k3_manifest_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_out[0]) {
        setenv("K3_NO_PROGRESS", "1", 1);
        k3_log_set_level(K3_LOG_QUIET);       /* no warning for every fuzzed input */
        snprintf(g_out, sizeof g_out, "%s/out", fz_scratch_dir());
        FZ_EXPECT(mkdir(g_out, 0700) == 0);
    }
    nftw(g_out, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    const char *src = fz_file(0, data, size);
    pk_archive ar;
    pk_writer w;
    k3_diag d = {0};
    memset(&w, 0, sizeof w);
    k3_err e = pk_archive_open(&ar, src, &d);
    if (e) {
        fz_check_err(e, &d);
        pk_archive_close(&ar);
        return 0;
    }
    pk_plan plan;
    e = pk_plan_build(&plan, ar.config, ar.config_len, PK_EXPERTS_AUTO, 0, &d);
    if (e) {
        fz_check_err(e, &d);
        pk_archive_close(&ar);
        return 0;
    }
    if (plan.total_bytes > MAX_PACK_BYTES) goto out_plan;
    if ((e = pk_writer_init(&w, &plan, g_out, 0, &d))) {
        fz_check_err(e, &d);
        goto out_writer;
    }
    e = pk_archive_pack(&ar, &w, NULL, &d);
    if (e) {
        fz_check_err(e, &d);
        pk_writer_abort(&w);
    } else {
        const char *names[PK_MAX_TOK];
        char *datas[PK_MAX_TOK];
        size_t lens[PK_MAX_TOK];
        int n_tok = 0;
        for (int i = 0; i < PK_MAX_TOK; i++)
            if (ar.tok_data[i]) {
                names[n_tok] = ar.tok_names[i];
                datas[n_tok] = ar.tok_data[i];
                lens[n_tok++] = ar.tok_len[i];
            }
        e = pk_finish_pack(&w, names, datas, lens, n_tok, ar.skipped, ar.n_skipped, &d);
        if (e) fz_check_err(e, &d);
        else check_pack(g_out), fz_accepted("archive packed");
    }
    if (e) {   /* nothing that looks finished */
        char p[600];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", g_out, K3_MANIFEST_NAME);
        FZ_EXPECT(stat(p, &st) != 0);
    }
out_writer:
    pk_writer_free(&w);
out_plan:
    pk_plan_free(&plan);
    pk_archive_close(&ar);
    return 0;
}

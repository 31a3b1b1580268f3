/*
 * test_verify_hostile.c - k3verify (and k3inspect on packs) against packs
 * made to mislead: FIFOs where files should be. Each must end in a FAILED
 * line and the right exit code, never a hang, a crash or a forged "OK".
 */
#define _GNU_SOURCE
#include "test_verify_run.h"

static char g_inspect[4096];

/* Run k3verify with a timeout: 124 means it hung. */
static int run_timed(const char *opts, const char *dir)
{
    char args[12000];
    snprintf(args, sizeof args, "20 '%s' %s '%s'", g_bin, opts, dir);
    return run_tool("timeout", args);
}

static void make_fifo(const char *dir, const char *name)
{
    char p[8200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    unlink(p);
    REQUIRE(mkfifo(p, 0644) == 0);
}

/* FIFOs named like pack files: "not a regular file", never a blocked open(). */
static void test_fifos(void)
{
    k3_manifest m;
    const char *dir = fresh("fifos", &m);
    make_fifo(dir, "tiktoken.model");
    make_fifo(dir, "trunk-head.k3s");
    CHECK_EXIT(run_timed("", dir), 1);
    CHECK_OUT("tiktoken.model: FAILED (not a regular file)\n");
    CHECK_OUT("trunk-head.k3s: FAILED (not a regular file)\n");
    CHECK_EXIT(run_timed("--quick", dir), 1);
    CHECK_OUT("trunk-head.k3s: FAILED (not a regular file)\n");
    make_fifo(dir, "manifest.json");
    CHECK_EXIT(run_timed("", dir), 1);
    CHECK_OUT("manifest.json: FAILED (");
    CHECK_OUT("not a regular file");
    k3_manifest_free(&m);
}

int main(void)
{
    find_binary();
    find_tool("k3inspect", "K3_INSPECT_BIN", g_inspect);
    snprintf(g_root, sizeof g_root, "%s/verify_hostile", k3_test_tmpdir());
    mkdir(g_root, 0755);
    test_fifos();
    free(g_out);
    free(g_err);
    return k3_test_done();
}

/*
 * test_verify_run.h - what the k3verify tests share: run the real binary
 * (<build>/bin/k3verify, or $K3_VERIFY_BIN) and look at its output, write a
 * fresh synthetic pack (test_verify_mkpack.h), damage files. Header-only.
 */
#ifndef TEST_VERIFY_RUN_H
#define TEST_VERIFY_RUN_H

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "k3_file.h"
#include "k3_hash.h"
#include "k3_manifest.h"
#include "k3_test.h"
#include "test_verify_mkpack.h"

static char g_bin[4096];
static char g_root[4096];
static char *g_out, *g_err;    /* stdout and stderr of the last run */

/* The built tool (<build>/bin/TOOL, or $ENV) into out[4096]; exits if absent. */
static inline void find_tool(const char *tool, const char *env_name, char *out)
{
    const char *env = getenv(env_name);
    if (env && *env) {
        snprintf(out, 4096, "%s", env);
    } else {
        char exe[4096];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        REQUIRE(n > 0);
        exe[n] = '\0';
        snprintf(out, 4096, "%s/../bin/%s", dirname(exe), tool);
    }
    if (access(out, X_OK) != 0) {
        fprintf(stderr, "%s binary not found at '%s' (build it, or set %s)\n", tool, out, env_name);
        exit(1);
    }
}

static inline void find_binary(void) { find_tool("k3verify", "K3_VERIFY_BIN", g_bin); }

/* Run BIN ARGS; returns the exit code, output in g_out / g_err. */
static inline int run_tool(const char *bin, const char *args)
{
    char cmd[16384];
    int n = snprintf(cmd, sizeof cmd, "K3_NO_PROGRESS=1 '%s' %s >'%s/out.txt' 2>'%s/err.txt'", bin, args, g_root, g_root);
    REQUIRE(n > 0 && (size_t)n < sizeof cmd);
    int st = system(cmd);
    free(g_out);
    free(g_err);
    char p[4200];
    k3_diag d;
    snprintf(p, sizeof p, "%s/out.txt", g_root);
    REQUIRE(k3_read_file(p, 1u << 26, &g_out, NULL, &d) == K3_OK);
    snprintf(p, sizeof p, "%s/err.txt", g_root);
    REQUIRE(k3_read_file(p, 1u << 26, &g_err, NULL, &d) == K3_OK);
    /* under K3_SANITIZE a finding in k3verify must not hide behind an expected exit 1 */
    CHECK_MSG(!strstr(g_err, "Sanitizer") && !strstr(g_err, "runtime error"), "%s %s:\n%s", bin, args, g_err);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Run k3verify ARGS. */
static inline int run(const char *args) { return run_tool(g_bin, args); }

static inline int run_dir(const char *opts, const char *dir)
{
    char args[8192];
    snprintf(args, sizeof args, "%s '%s'", opts, dir);
    return run(args);
}

#define CHECK_OUT(s) CHECK_MSG(strstr(g_out, (s)) != NULL, "stdout lacks \"%s\":\n%s", (s), g_out)
#define CHECK_NOT_OUT(s) CHECK_MSG(strstr(g_out, (s)) == NULL, "stdout has \"%s\":\n%s", (s), g_out)
#define CHECK_ERR(s) CHECK_MSG(strstr(g_err, (s)) != NULL, "stderr lacks \"%s\":\n%s", (s), g_err)
#define CHECK_EXIT(got, want) CHECK_MSG((got) == (want), "exit %d, expected %d; stdout:\n%s\nstderr:\n%s", \
                                        (got), (want), g_out, g_err)

/* A fresh pack in <root>/<name>; m describes it. */
static inline const char *fresh(const char *name, k3_manifest *m)
{
    static char dir[4200];
    char cmd[8500];
    snprintf(dir, sizeof dir, "%s/%s", g_root, name);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    REQUIRE(system(cmd) == 0);
    k3tp_opts o = k3tp_small();
    k3_diag d;
    k3_err e = k3tp_write(dir, &o, m, &d);
    CHECK_MSG(e == K3_OK, "writing the pack: %s", d.msg);
    REQUIRE(e == K3_OK);
    return dir;
}

static inline void flip(const char *dir, const char *file, uint64_t off, int bit)
{
    char p[8200];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    int fd = open(p, O_RDWR);
    REQUIRE(fd >= 0);
    uint8_t b;
    REQUIRE(pread(fd, &b, 1, (off_t)off) == 1);
    b ^= (uint8_t)(1u << bit);
    REQUIRE(pwrite(fd, &b, 1, (off_t)off) == 1);
    close(fd);
}

static inline void put_file(const char *dir, const char *file, const char *text)
{
    k3_diag d;
    REQUIRE(k3tp_write_file(dir, file, text, strlen(text), &d) == K3_OK);
}

static inline const k3_mf_tensor *tensor(const k3_manifest *m, const char *name)
{
    for (uint32_t i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    REQUIRE(0);
    return NULL;
}

static inline int count_lines(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p++) n++;
    return n;
}

#endif

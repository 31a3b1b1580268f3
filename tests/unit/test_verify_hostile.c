/*
 * test_verify_hostile.c - k3verify (and k3inspect on packs) against packs
 * made to mislead: names that try to forge output lines, FIFOs where files
 * should be, a manifest whose record layout repeats a part, an E8M0 scale of
 * 255 behind matching hashes, manifest ranges past or over each other. Each must end
 * in a FAILED line and the right exit code, never a hang, a crash or a
 * forged "OK".
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

/* A shard name with a newline, listed twice: the manifest reader quotes it. */
static void test_forged_line(void)
{
    k3_manifest m;
    const char *dir = fresh("forged-line", &m);
    k3_diag d;
    free(m.shards[1].name);
    free(m.shards[2].name);
    m.shards[1].name = k3tp_strdup("x\ntrunk-head.k3s: OK\x1b[2J");
    m.shards[2].name = k3tp_strdup("x\ntrunk-head.k3s: OK\x1b[2J");
    REQUIRE(k3tp_write_manifest(dir, &m, &d) == K3_OK);
    CHECK_EXIT(run_dir("", dir), 1);
    CHECK_OUT("manifest.json: FAILED (");
    CHECK_NOT_OUT("\ntrunk-head.k3s: OK");
    CHECK_NOT_OUT("\x1b");
    CHECK_OUT("x\\x0atrunk-head.k3s: OK\\x1b[2J");
    CHECK_EQ_U64(count_lines(g_out, "\n"), count_lines(g_out, ": FAILED (") + count_lines(g_out, ": OK\n"));
    k3_manifest_free(&m);
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

/* The manifest names w1.weight_packed twice and leaves out w3.weight_packed:
   the part count still equals the header's, but the layout is wrong. Where the
   repeated part also repeats w1's bytes, the record layout overlaps itself and
   the manifest reader refuses it, naming the field. */
static void test_repeated_part(void)
{
    k3_manifest m;
    const char *dir = fresh("repeated-part", &m);
    k3_diag d;
    k3_mf_experts *x = &m.expert_layers[0];
    REQUIRE(!strcmp(x->parts[0].name, "w1.weight_packed") && !strcmp(x->parts[2].name, "w3.weight_packed"));
    char *keep = x->parts[2].name;
    uint64_t off2 = x->parts[2].offset;
    x->parts[2] = x->parts[0];
    x->parts[2].name = k3tp_strdup(x->parts[0].name);
    free(keep);
    REQUIRE(k3tp_write_manifest(dir, &m, &d) == K3_OK);
    CHECK_EXIT(run_dir("--quick", dir), 1);
    CHECK_OUT("manifest.json: FAILED (expert_layers[0].parts[2]: bytes [0, +");
    CHECK_OUT("overlap the part before");
    x->parts[2].offset = off2;                          /* w1's name and shape, w3's place */
    REQUIRE(k3tp_write_manifest(dir, &m, &d) == K3_OK);
    CHECK_EXIT(run_dir("--quick", dir), 1);
    CHECK_OUT("experts-layer-001.k3s: FAILED (");
    CHECK_OUT("record part 'w1.weight_packed' is listed twice in the manifest");
    CHECK_OUT("record part 'w3.weight_packed' is in the shard header but not in the manifest");
    CHECK_OUT("experts-layer-002.k3s: OK\n");
    k3_manifest_free(&m);
}

/* A user's file that merely contains ".k3tmp-" is not k3pack's: unlisted, not "rerun k3pack"
   (k3pack would not remove it: k3_is_tmp_name). */
static void test_tmp_lookalike(void)
{
    k3_manifest m;
    const char *dir = fresh("tmp-lookalike", &m);
    put_file(dir, ".notes.k3tmp-backup", "x");
    put_file(dir, ".trunk-head.k3s.k3tmp-77", "x");
    CHECK_EXIT(run_dir("--quick", dir), 1);
    CHECK_OUT(".notes.k3tmp-backup: FAILED (not listed in the manifest)\n");
    CHECK_OUT(".trunk-head.k3s.k3tmp-77: FAILED (unfinished k3pack run");
    k3_manifest_free(&m);
}

/* An E8M0 scale of 255 (NaN) with every hash matching it: named by expert, layer and part. */
static void test_nan_scale(void)
{
    k3_manifest m;
    const char *dir = fresh("nan-scale", &m);
    k3_diag d;
    k3_mf_experts *x = &m.expert_layers[1];                  /* layer 2 */
    REQUIRE(x->layer == 2 && !strcmp(x->parts[3].name, "w3.weight_scale"));
    uint64_t rec = x->offset + 6 * x->stride, at = rec + x->parts[3].offset + 5;
    char p[8200], *buf;
    size_t len;
    snprintf(p, sizeof p, "%s/experts-layer-002.k3s", dir);
    REQUIRE(k3_read_file(p, 1u << 26, &buf, &len, &d) == K3_OK);
    buf[at] = (char)0xFF;
    REQUIRE(k3tp_write_file(dir, "experts-layer-002.k3s", buf, len, &d) == K3_OK);
    x->hashes[6] = k3_xxh3_64(buf + rec, (size_t)x->record_size);
    m.shards[x->shard].hash = k3_xxh3_128(buf, len);
    free(buf);
    REQUIRE(k3tp_write_manifest(dir, &m, &d) == K3_OK);
    CHECK_EXIT(run_dir("--quick", dir), 0);
    CHECK_EXIT(run_dir("", dir), 1);
    char want[256];
    snprintf(want, sizeof want, "experts-layer-002.k3s: FAILED (expert 6 of layer 2, part 'w3.weight_scale': scale "
             "byte at offset %llu is 255, NaN in E8M0)\n", (unsigned long long)at);
    CHECK_OUT(want);
    CHECK_ERR("1 of 9 shards FAILED");
    CHECK_EXIT(run_dir("--json", dir), 1);
    CHECK_OUT("\"kind\":\"value\"");
    k3_manifest_free(&m);
}

/* Manifest ranges past the end of their shard or overlapping: refused by the reader, the field named. */
static void test_manifest_ranges(void)
{
    k3_manifest m;
    const char *dir = fresh("ranges", &m);
    k3_diag d;
    k3_mf_tensor *t = &m.tensors[2];
    uint64_t keep = t->offset;
    t->offset = m.shards[t->shard].size - t->size + 1;
    REQUIRE(k3tp_write_manifest(dir, &m, &d) == K3_OK);
    CHECK_EXIT(run_dir("--quick", dir), 1);
    CHECK_OUT("manifest.json: FAILED (tensors[2].offset: bytes [");
    CHECK_OUT("end past the end of shard");
    t->offset = m.tensors[1].offset;                         /* on the tensor before it */
    REQUIRE(t->shard == m.tensors[1].shard);
    REQUIRE(k3tp_write_manifest(dir, &m, &d) == K3_OK);
    CHECK_EXIT(run_dir("--quick", dir), 1);
    CHECK_OUT("manifest.json: FAILED (tensors[2].offset: bytes [");
    CHECK_OUT("overlap the shard header or the tensor listed before it");
    t->offset = keep;
    free(m.expert_layers[0].hashes);
    m.expert_layers[0].hashes = calloc(1000, sizeof *m.expert_layers[0].hashes);   /* [count] */
    REQUIRE(m.expert_layers[0].hashes);
    m.expert_layers[0].count = 1000;
    REQUIRE(k3tp_write_manifest(dir, &m, &d) == K3_OK);
    CHECK_EXIT(run_dir("--quick", dir), 1);
    CHECK_OUT("manifest.json: FAILED (expert_layers[0]: 1000 records of ");
    k3_manifest_free(&m);
}

int main(void)
{
    find_binary();
    find_tool("k3inspect", "K3_INSPECT_BIN", g_inspect);
    snprintf(g_root, sizeof g_root, "%s/verify_hostile", k3_test_tmpdir());
    mkdir(g_root, 0755);
    test_forged_line();
    test_fifos();
    test_repeated_part();
    test_tmp_lookalike();
    test_nan_scale();
    test_manifest_ranges();
    free(g_out);
    free(g_err);
    return k3_test_done();
}

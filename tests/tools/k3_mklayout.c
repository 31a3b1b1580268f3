/*
 * k3_mklayout - write a synthetic checkpoint directory with a model's real
 * tensor list: config.json, shards model-NNNNN-of-MMMMM.safetensors of at most
 * --shard-size bytes of data (a larger tensor gets a shard of its own), and
 * model.safetensors.index.json. Data regions are left sparse (ftruncate), so a
 * full-size Kimi K3 layout (1.56 TB) costs a few hundred MB of headers.
 *
 *   k3_mklayout CONFIG OUTDIR [--shard-size BYTES] [--no-vision]
 *
 * Tensors: k3_expected_tensors(config) with k3_config_prefix(), plus a few
 * vision_tower.* / mm_projector.* tensors (as the real release has) unless
 * --no-vision. Headers are padded with spaces to a multiple of 8, as the
 * reference writer does.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "k3_checked.h"
#include "k3_config.h"
#include "k3_file.h"
#include "safetensors.h"

typedef struct item {
    const char *name;       /* without prefix for model tensors, full for vision */
    int full;               /* name is already complete */
    k3_dtype dt;
    unsigned rank;
    uint64_t shape[4];
    uint64_t nbytes;
} item;

static const item vision[] = {
    {"vision_tower.patch_embed.proj.weight", 1, K3_DT_BF16, 4, {1024, 3, 14, 14}, 1024 * 3 * 14 * 14 * 2},
    {"vision_tower.encoder.blocks.0.attn.qkv.weight", 1, K3_DT_BF16, 2, {3072, 1024}, 3072 * 1024 * 2},
    {"vision_tower.encoder.blocks.0.mlp.fc1.weight", 1, K3_DT_BF16, 2, {4096, 1024}, 4096 * 1024 * 2},
    {"mm_projector.proj.0.weight", 1, K3_DT_BF16, 2, {7168, 4096}, 7168 * 4096 * 2},
};

typedef struct buf { char *p; size_t n, cap; } buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < b->cap - b->n) { b->n += (size_t)n; return; }
        b->cap = b->cap ? b->cap * 2 : 1 << 20;
        b->p = realloc(b->p, b->cap);
        if (!b->p) { fprintf(stderr, "k3_mklayout: out of memory\n"); exit(3); }
    }
}

static void die(const char *what, const char *path)
{
    fprintf(stderr, "k3_mklayout: %s '%s': %s\n", what, path, strerror(errno));
    exit(3);
}

int main(int argc, char **argv)
{
    const char *cfg_path = NULL, *out = NULL;
    uint64_t shard_size = 5000000000ULL;
    int with_vision = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shard-size") && i + 1 < argc) shard_size = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--no-vision")) with_vision = 0;
        else if (!cfg_path) cfg_path = argv[i];
        else if (!out) out = argv[i];
        else { fprintf(stderr, "usage: k3_mklayout CONFIG OUTDIR [--shard-size BYTES] [--no-vision]\n"); return 2; }
    }
    if (!cfg_path || !out || !shard_size) {
        fprintf(stderr, "usage: k3_mklayout CONFIG OUTDIR [--shard-size BYTES] [--no-vision]\n");
        return 2;
    }
    k3_config cfg;
    k3_diag d = {0};
    k3_xlist xl;
    if (k3_config_load(cfg_path, &cfg, &d) || k3_expected_tensors(&cfg, &xl, &d)) {
        fprintf(stderr, "k3_mklayout: %s\n", d.msg);
        return 1;
    }
    const char *prefix = k3_config_prefix(&cfg);
    size_t nv = with_vision ? sizeof vision / sizeof vision[0] : 0, n = xl.n + nv;
    item *it = calloc(n, sizeof *it);
    uint32_t *shard = calloc(n, sizeof *shard);
    if (!it || !shard) return 3;
    for (size_t i = 0; i < xl.n; i++) {
        const k3_xtensor *t = &xl.t[i];
        it[i] = (item){t->name, 0, (k3_dtype)t->dtype, t->rank, {0}, t->nbytes};
        memcpy(it[i].shape, t->shape, sizeof t->shape);
    }
    for (size_t i = 0; i < nv; i++) it[xl.n + i] = vision[i];

    /* plan: greedy, in order */
    uint32_t ns = 0;
    uint64_t used = 0, total = 0;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || (used && used + it[i].nbytes > shard_size)) { ns++; used = 0; }
        shard[i] = ns - 1;
        used += it[i].nbytes;
        total += it[i].nbytes;
    }

    if (mkdir(out, 0755) != 0 && errno != EEXIST) die("cannot create", out);
    char path[4096];
    /* config.json */
    char *text;
    size_t tl;
    if (k3_read_file(cfg_path, 64u << 20, &text, &tl, &d)) { fprintf(stderr, "%s\n", d.msg); return 3; }
    snprintf(path, sizeof path, "%s/config.json", out);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(text, 1, tl, f) != tl || fclose(f)) die("cannot write", path);
    free(text);

    buf idx = {0}, hdr = {0};
    put(&idx, "{\n  \"metadata\": {\"total_size\": %" PRIu64 "},\n  \"weight_map\": {", total);
    size_t i = 0;
    for (uint32_t s = 0; s < ns; s++) {
        char fname[64];
        snprintf(fname, sizeof fname, "model-%05u-of-%05u.safetensors", s + 1, ns);
        hdr.n = 0;
        put(&hdr, "{\"__metadata__\":{\"format\":\"pt\"}");
        uint64_t off = 0;
        for (; i < n && shard[i] == s; i++) {
            const char *p = it[i].full ? "" : prefix;
            put(&hdr, ",\"%s%s\":{\"dtype\":\"%s\",\"shape\":[", p, it[i].name, k3_dtype_name(it[i].dt));
            for (unsigned k = 0; k < it[i].rank; k++) put(&hdr, "%s%" PRIu64, k ? "," : "", it[i].shape[k]);
            put(&hdr, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + it[i].nbytes);
            off += it[i].nbytes;
            put(&idx, "%s\n    \"%s%s\": \"%s\"", idx.p[idx.n - 1] == '{' ? "" : ",", p, it[i].name, fname);
        }
        put(&hdr, "}");
        while ((hdr.n + 8) % 8) put(&hdr, " ");
        snprintf(path, sizeof path, "%s/%s", out, fname);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) die("cannot create", path);
        uint8_t len[8];
        k3_st64(len, hdr.n);
        if (write(fd, len, 8) != 8 || write(fd, hdr.p, hdr.n) != (ssize_t)hdr.n ||
            ftruncate(fd, (off_t)(8 + hdr.n + off)) != 0 || close(fd) != 0)
            die("cannot write", path);
    }
    put(&idx, "\n  }\n}\n");
    snprintf(path, sizeof path, "%s/%s", out, K3_ST_INDEX_NAME);
    f = fopen(path, "wb");
    if (!f || fwrite(idx.p, 1, idx.n, f) != idx.n || fclose(f)) die("cannot write", path);
    printf("%zu tensors, %u shards, %" PRIu64 " data bytes\n", n, ns, total);
    free(idx.p);
    free(hdr.p);
    free(it);
    free(shard);
    k3_xlist_free(&xl);
    return 0;
}

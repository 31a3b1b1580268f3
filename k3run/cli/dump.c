/* dump.c - see dump.h. */
#include "dump.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct darr {
    char name[96];
    int is_int;
    uint32_t width, rows, cap;
    void *data;               /* [rows][width] F32 or I32 */
} darr;

struct k3_dump {
    darr *a;
    size_t n, cap;
    int failed;
};

k3_dump *k3_dump_new(void) { return calloc(1, sizeof(k3_dump)); }

static darr *find(k3_dump *dp, const char *name, uint32_t width, int is_int)
{
    for (size_t i = 0; i < dp->n; i++)
        if (!strcmp(dp->a[i].name, name)) return dp->a[i].width == width ? &dp->a[i] : NULL;
    if (dp->n == dp->cap) {
        size_t nc = dp->cap ? dp->cap * 2 : 64;
        darr *na = realloc(dp->a, nc * sizeof *na);
        if (!na) return NULL;
        dp->a = na;
        dp->cap = nc;
    }
    darr *r = &dp->a[dp->n++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->width = width;
    r->is_int = is_int;
    return r;
}

static void append(k3_dump *dp, const char *name, uint32_t T, uint32_t width, const void *src, int is_int)
{
    darr *r = find(dp, name, width, is_int);
    if (!r) { dp->failed = 1; return; }
    if (r->rows + T > r->cap) {
        uint32_t nc = r->cap ? r->cap * 2 : 64;
        while (nc < r->rows + T) nc *= 2;
        void *nd = realloc(r->data, (size_t)nc * width * 4);
        if (!nd) { dp->failed = 1; return; }
        r->data = nd;
        r->cap = nc;
    }
    memcpy((char *)r->data + (size_t)r->rows * width * 4, src, (size_t)T * width * 4);
    r->rows += T;
}

void k3_dump_hook(void *ctx, const char *name, int layer, uint32_t T, uint32_t width, const float *f,
                  const int32_t *ids)
{
    k3_dump *dp = ctx;
    char full[96];
    if (layer >= 0) snprintf(full, sizeof full, "layers.%d.%s", layer, name);
    else snprintf(full, sizeof full, "%s", name);
    append(dp, full, T, width, f ? (const void *)f : (const void *)ids, f == NULL);
}

void k3_dump_ids(k3_dump *dp, const int32_t *ids, uint32_t n) { append(dp, "ids", n, 1, ids, 1); }

k3_err k3_dump_write(k3_dump *dp, const char *path, k3_diag *d)
{
    if (dp->failed) return k3_fail(d, K3_ERR_NOMEM, "'%s': out of memory while recording the dump", path);
    size_t cap = 256 + dp->n * 256, len = 0;
    char *hdr = malloc(cap);
    if (!hdr) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    uint64_t off = 0;
    len += (size_t)snprintf(hdr + len, cap - len, "{\"__metadata__\":{\"format\":\"k3run-dump\"}");
    for (size_t i = 0; i < dp->n; i++) {
        const darr *r = &dp->a[i];
        uint64_t sz = (uint64_t)r->rows * r->width * 4;
        if (!strcmp(r->name, "ids"))
            len += (size_t)snprintf(hdr + len, cap - len, ",\"%s\":{\"dtype\":\"I32\",\"shape\":[%u],"
                                    "\"data_offsets\":[%llu,%llu]}", r->name, r->rows,
                                    (unsigned long long)off, (unsigned long long)(off + sz));
        else
            len += (size_t)snprintf(hdr + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%u,%u],"
                                    "\"data_offsets\":[%llu,%llu]}", r->name, r->is_int ? "I32" : "F32",
                                    r->rows, r->width, (unsigned long long)off, (unsigned long long)(off + sz));
        off += sz;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) { free(hdr); return k3_fail(d, K3_ERR_IO, "'%s': cannot create: %s", path, strerror(errno)); }
    uint64_t hl = len;
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(hl >> (8 * i));
    int ok = fwrite(le, 1, 8, f) == 8 && fwrite(hdr, 1, len, f) == len;
    for (size_t i = 0; ok && i < dp->n; i++) {
        size_t sz = (size_t)dp->a[i].rows * dp->a[i].width * 4;
        ok = fwrite(dp->a[i].data, 1, sz, f) == sz;
    }
    free(hdr);
    if (fclose(f) != 0 || !ok) return k3_fail(d, K3_ERR_IO, "'%s': write failed: %s", path, strerror(errno));
    return K3_OK;
}

void k3_dump_free(k3_dump *dp)
{
    if (!dp) return;
    for (size_t i = 0; i < dp->n; i++) free(dp->a[i].data);
    free(dp->a);
    free(dp);
}

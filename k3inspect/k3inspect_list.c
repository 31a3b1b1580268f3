/*
 * k3inspect_list.c - the default view: one row per tensor (name, dtype, shape,
 * bytes, file, offset), as an aligned text table or as JSON.
 */
#include <inttypes.h>
#include <string.h>

#include "k3_log.h"
#include "k3inspect.h"

#define NAME_CAP 1024                    /* longer names are shown truncated ("...") */

/* Display width of an escaped (valid UTF-8) string: one column per code point. */
static size_t width(const char *s)
{
    size_t w = 0;
    for (; *s; s++) w += ((unsigned char)*s & 0xC0) != 0x80;
    return w;
}

static void pad(FILE *f, size_t n)
{
    while (n--) fputc(' ', f);
}

int k3i_list_text(const k3i_ctx *x, FILE *f)
{
    const k3_st_ckpt *c = &x->ck;
    char name[NAME_CAP], shape[K3_ST_SHAPE_STR], num[32];
    size_t wn = 4, ws = 5, wb = 5, wf = 4;
    for (size_t i = 0; i < c->n_tensors; i++) {
        if (!k3i_selected(x, i)) continue;
        const k3_st_tensor *t = &c->tensors[i];
        size_t w = width(k3_escape(t->name, t->name_len, name, sizeof name));
        if (w > wn) wn = w;
        k3_st_fmt_shape(t->shape, t->rank, shape, sizeof shape);
        if (strlen(shape) > ws) ws = strlen(shape);
        size_t nb = (size_t)snprintf(num, sizeof num, "%" PRIu64, t->nbytes);
        if (nb > wb) wb = nb;
    }
    for (size_t i = 0; i < c->n_files; i++) {
        size_t w = width(k3_escape(c->files[i].name, strlen(c->files[i].name), name, sizeof name));
        if (w > wf) wf = w;
    }
    fprintf(f, "%s", "name");
    pad(f, wn - 4 + 2);
    fprintf(f, "%-11s  %-*s  %*s  %-*s  %s\n", "dtype", (int)ws, "shape", (int)wb, "bytes", (int)wf,
            "file", "offset");
    for (size_t i = 0; i < c->n_tensors; i++) {
        if (!k3i_selected(x, i)) continue;
        const k3_st_tensor *t = &c->tensors[i];
        k3_escape(t->name, t->name_len, name, sizeof name);
        fputs(name, f);
        pad(f, wn - width(name) + 2);
        k3_st_fmt_shape(t->shape, t->rank, shape, sizeof shape);
        fprintf(f, "%-11s  %-*s  %*" PRIu64 "  ", k3_dtype_name((k3_dtype)t->dtype), (int)ws, shape,
                (int)wb, t->nbytes);
        const char *fn = c->files[t->file].name;
        k3_escape(fn, strlen(fn), name, sizeof name);
        fputs(name, f);
        pad(f, wf - width(name) + 2);
        if (fprintf(f, "%" PRIu64 "\n", t->offset) < 0) return -1;
    }
    return ferror(f) ? -1 : 0;
}

int k3i_list_json(const k3i_ctx *x, FILE *f)
{
    const k3_st_ckpt *c = &x->ck;
    k3i_json_head(x, f, "tensors");
    fputs(",\"tensors\":[", f);
    uint64_t n = 0, params = 0, bytes = 0;
    for (size_t i = 0; i < c->n_tensors; i++) {
        if (!k3i_selected(x, i)) continue;
        const k3_st_tensor *t = &c->tensors[i];
        uint64_t p = k3i_params(t);
        fputs(n ? ",\n{\"name\":" : "\n{\"name\":", f);
        k3_json_str(f, t->name, t->name_len);
        fprintf(f, ",\"dtype\":\"%s\",\"shape\":[", k3_dtype_name((k3_dtype)t->dtype));
        for (unsigned k = 0; k < t->rank; k++) fprintf(f, "%s%" PRIu64, k ? "," : "", t->shape[k]);
        fprintf(f, "],\"bytes\":%" PRIu64 ",\"params\":%" PRIu64 ",\"file\":%" PRIu32
                   ",\"offset\":%" PRIu64 ",\"kind\":\"%s\",\"layer\":%d}",
                t->nbytes, p, t->file, t->offset, k3_kind_id((k3_kind)x->kind[i]),
                k3_tensor_layer(t->name, NULL));
        n++;
        params += p;
        bytes += t->nbytes;
    }
    fprintf(f, "],\"totals\":{\"tensors\":%" PRIu64 ",\"params\":%" PRIu64 ",\"bytes\":%" PRIu64 "}",
            n, params, bytes);
    k3i_pack_json(x, f);
    k3i_json_warnings(x, f);
    fputs("}\n", f);
    return ferror(f) ? -1 : 0;
}

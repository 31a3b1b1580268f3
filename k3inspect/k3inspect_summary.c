/*
 * k3inspect_summary.c - params and bytes by layer (with the layer's kind), by
 * tensor kind, and in total; as text or JSON.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "k3_log.h"
#include "k3inspect.h"

typedef struct acc { uint64_t tensors, params, bytes; } acc;

typedef struct sums {
    acc *layer;                  /* [n_layers] */
    acc outside;                 /* tensors not in a decoder layer */
    acc kind[K3_KIND__COUNT];
    acc total;
} sums;

static void add(acc *a, uint64_t p, uint64_t b)
{
    a->tensors++;
    a->params += p;
    a->bytes += b;
}

static int sum_up(const k3i_ctx *x, sums *s)
{
    memset(s, 0, sizeof *s);
    s->layer = calloc(x->n_layers ? x->n_layers : 1, sizeof *s->layer);
    if (!s->layer) return -1;
    for (size_t i = 0; i < x->ck.n_tensors; i++) {
        if (!k3i_selected(x, i)) continue;
        const k3_st_tensor *t = &x->ck.tensors[i];
        uint64_t p = k3i_params(t);
        int l = k3_tensor_layer(t->name, NULL);
        add(l >= 0 ? &s->layer[l] : &s->outside, p, t->nbytes);
        add(&s->kind[x->kind[i]], p, t->nbytes);
        add(&s->total, p, t->nbytes);
    }
    return 0;
}

static void row(FILE *f, const char *a, const char *b, const acc *v, uint64_t total_bytes)
{
    char hp[32], hb[32];
    fprintf(f, "%-20s %-10s %10" PRIu64 " %16" PRIu64 " %10s %16" PRIu64 " %10s", a, b, v->tensors,
            v->params, k3i_si((double)v->params, "", hp, sizeof hp), v->bytes,
            k3i_si((double)v->bytes, "B", hb, sizeof hb));
    if (total_bytes) fprintf(f, " %6.2f%%", 100.0 * (double)v->bytes / (double)total_bytes);
    fputc('\n', f);
}

static void header(FILE *f, const char *a, const char *b)
{
    fprintf(f, "%-20s %-10s %10s %16s %10s %16s %10s %7s\n", a, b, "tensors", "params", "", "bytes", "",
            "share");
}

int k3i_summary_text(const k3i_ctx *x, FILE *f)
{
    sums s;
    if (sum_up(x, &s)) return -1;
    char buf[64];
    fprintf(f, "Layers (kinds from %s):\n", x->has_cfg ? "config" : "tensor names");
    header(f, "layer", "kind");
    for (size_t l = 0; l < x->n_layers; l++) {
        if (!s.layer[l].tensors) continue;
        snprintf(buf, sizeof buf, "%zu", l);
        row(f, buf, k3i_layer_kind(x, l), &s.layer[l], s.total.bytes);
    }
    if (s.outside.tensors) row(f, "not in a layer", "", &s.outside, s.total.bytes);
    row(f, "total", "", &s.total, s.total.bytes);

    fprintf(f, "\nBy kind:\n");
    header(f, "kind", "");
    for (int k = 0; k < K3_KIND__COUNT; k++)
        if (s.kind[k].tensors) row(f, k3_kind_name((k3_kind)k), "", &s.kind[k], s.total.bytes);
    row(f, "total", "", &s.total, s.total.bytes);

    char hp[32], hb[32];
    fprintf(f, "\nTotal: %" PRIu64 " tensors, %" PRIu64 " params (%s), %" PRIu64 " bytes (%s) in %zu file%s\n",
            s.total.tensors, s.total.params, k3i_si((double)s.total.params, "", hp, sizeof hp),
            s.total.bytes, k3i_si((double)s.total.bytes, "B", hb, sizeof hb), x->ck.n_files,
            x->ck.n_files == 1 ? "" : "s");
    free(s.layer);
    return ferror(f) ? -1 : 0;
}

static void json_acc(FILE *f, const acc *a)
{
    fprintf(f, "\"tensors\":%" PRIu64 ",\"params\":%" PRIu64 ",\"bytes\":%" PRIu64, a->tensors,
            a->params, a->bytes);
}

int k3i_summary_json(const k3i_ctx *x, FILE *f)
{
    static const char *const attn[3] = {"unknown", "kda", "mla"};
    static const char *const ffn[3] = {"unknown", "dense", "moe"};
    sums s;
    if (sum_up(x, &s)) return -1;
    k3i_json_head(x, f, "summary");
    fputs(",\"layers\":[", f);
    int first = 1;
    for (size_t l = 0; l < x->n_layers; l++) {
        if (!s.layer[l].tensors) continue;
        fprintf(f, "%s\n{\"layer\":%zu,\"kind\":\"%s\",\"attention\":\"%s\",\"ffn\":\"%s\",",
                first ? "" : ",", l, k3i_layer_kind(x, l), attn[x->layer_attn[l] % 3],
                ffn[x->layer_ffn[l] % 3]);
        json_acc(f, &s.layer[l]);
        fputc('}', f);
        first = 0;
    }
    fputs("],\n\"outside_layers\":{", f);
    json_acc(f, &s.outside);
    fputs("},\n\"kinds\":[", f);
    first = 1;
    for (int k = 0; k < K3_KIND__COUNT; k++) {
        if (!s.kind[k].tensors) continue;
        fprintf(f, "%s\n{\"kind\":\"%s\",\"name\":\"%s\",", first ? "" : ",", k3_kind_id((k3_kind)k),
                k3_kind_name((k3_kind)k));
        json_acc(f, &s.kind[k]);
        fputc('}', f);
        first = 0;
    }
    fputs("],\n\"totals\":{", f);
    json_acc(f, &s.total);
    fprintf(f, ",\"files\":%zu}", x->ck.n_files);
    k3i_pack_json(x, f);
    k3i_json_warnings(x, f);
    fputs("}\n", f);
    free(s.layer);
    return ferror(f) ? -1 : 0;
}

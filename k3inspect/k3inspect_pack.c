/*
 * k3inspect_pack.c - a k3 pack seen through the same views as a checkpoint:
 * the manifest's trunk tensors and every part of every expert record become
 * rows of a k3_st_ckpt (shards as its files, names with the checkpoint prefix
 * put back, MXFP4 shown as F4 and E8M0 as F8_E8M0, their safetensors names).
 * Plus what only a pack has: the per-shard table and the expert record layout.
 * Shard headers are read (pread, small) and checked; a damaged or missing
 * shard is a warning here (k3verify is the judge).
 */
#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include "k3_ckpt_check.h"
#include "k3_file.h"
#include "k3_log.h"
#include "k3_download.h"
#include "k3inspect.h"

/* A pack, or an unfinished one: manifest.json, or any .k3s shard. */
int k3i_is_pack(const char *path)
{
    char p[4096];
    if (k3_path_join(p, sizeof p, path, K3_MANIFEST_NAME, NULL) == K3_OK && access(p, F_OK) == 0) return 1;
    DIR *dh = opendir(path);
    if (!dh) return 0;
    int found = 0;
    struct dirent *de;
    while (!found && (de = readdir(dh))) {
        size_t n = strlen(de->d_name);
        found = n > 4 && !strcmp(de->d_name + n - 4, ".k3s");
    }
    closedir(dh);
    return found;
}

void k3i_warn(k3_st_ckpt *c, const char *msg)
{
    char **w = realloc(c->warnings, (c->n_warnings + 1) * sizeof *w);
    if (!w) return;
    c->warnings = w;
    if ((w[c->n_warnings] = strdup(msg))) c->n_warnings++;
}

void k3i_fill_tensor(k3_st_tensor *t, char **pool, const char *a, const char *b, const char *c, int enc,
                     int ndim, const uint64_t *shape, uint64_t offset, uint64_t size, uint32_t file)
{
    int n = sprintf(*pool, "%s%s%s", a, b, c);
    memset(t, 0, sizeof *t);
    t->name = *pool;
    t->name_len = (uint32_t)n;
    *pool += n + 1;
    t->dtype = (uint8_t)k3_dtype_from_enc(enc);
    t->rank = (uint8_t)ndim;
    t->numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->numel *= shape[i];
    }
    t->nbytes = size;
    t->offset = offset;
    t->file = file;
}

k3_err k3i_open_pack(k3i_ctx *x, const char *dir, k3_diag *d)
{
    k3_st_ckpt *c = &x->ck;
    memset(c, 0, sizeof *c);
    k3_manifest *m = &x->pack;
    k3_err e = k3_manifest_load(dir, m, d);
    if (e) return e;
    x->is_pack = 1;
    x->shard_hdr = calloc(m->n_shards + 1, sizeof *x->shard_hdr);
    x->shard_ok = calloc(m->n_shards + 1, 1);
    c->source = strdup(dir);
    c->dir = strdup(dir);
    c->files = calloc(m->n_shards + m->n_sources + 1, sizeof *c->files);   /* [shards, checkpoint files] */
    size_t n = m->n_tensors, pool_len = 0, plen = strlen(m->name_prefix);
    for (uint32_t i = 0; i < m->n_tensors; i++) pool_len += plen + strlen(m->tensors[i].name) + 1;
    for (uint32_t l = 0; l < m->n_expert_layers; l++) {
        const k3_mf_experts *xl = &m->expert_layers[l];
        n += xl->count * xl->n_parts;
        for (uint32_t p = 0; p < xl->n_parts; p++)
            pool_len += xl->count * (plen + 64 + strlen(xl->parts[p].name) + 1);
    }
    c->tensors = calloc(n + 1, sizeof *c->tensors);              /* [n] trunk tensors + expert parts */
    c->pools = calloc(1, sizeof *c->pools);
    char *pool = c->pools ? (c->pools[0] = malloc(pool_len + 1)) : NULL;   /* [pool_len] names */
    if (!x->shard_hdr || !x->shard_ok || !c->source || !c->dir || !c->files || !c->tensors || !pool)
        return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    c->n_pools = 1;
    char *cfg = json_dumps(m->config, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    if (cfg) {
        c->config_json = cfg;
        c->config_len = strlen(cfg);
    }
    for (uint32_t s = 0; s < m->n_shards; s++) {
        k3_st_file *f = &c->files[s];
        char path[4096];
        if ((e = k3_path_join(path, sizeof path, dir, m->shards[s].name, d))) return e;
        f->path = strdup(path);
        f->name = strdup(m->shards[s].name);
        if (!f->path || !f->name) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
        f->size = m->shards[s].size;
        c->n_files++;
        int fd = k3_open_read(path);
        k3_diag hd;
        if (fd < 0) {
            k3_fail(&hd, K3_ERR_NOT_FOUND, "shard '%s' is missing", m->shards[s].name);
        } else if (k3_shard_read_header(fd, path, &x->shard_hdr[s], &hd) == K3_OK) {
            x->shard_ok[s] = 1;
            f->header_len = x->shard_hdr[s].data_offset - 8;    /* so that data_offset = header_len + 8 */
        }
        if (fd >= 0) close(fd);
        if (!x->shard_ok[s]) k3i_warn(c, hd.msg);
        f->first_tensor = c->n_tensors;
        for (uint32_t i = 0; i < m->n_tensors; i++) {
            const k3_mf_tensor *t = &m->tensors[i];
            if (t->shard != s) continue;
            k3i_fill_tensor(&c->tensors[c->n_tensors++], &pool, m->name_prefix, t->name, "", t->encoding, t->ndim,
                            t->shape, t->offset, t->size, s);
        }
        for (uint32_t l = 0; l < m->n_expert_layers; l++) {
            const k3_mf_experts *xl = &m->expert_layers[l];
            if (xl->shard != s) continue;
            for (uint64_t r = 0; r < xl->count; r++) {
                char stem[96];
                snprintf(stem, sizeof stem, "model.layers.%u.block_sparse_moe.experts.%llu.", xl->layer,
                         (unsigned long long)r);
                for (uint32_t p = 0; p < xl->n_parts; p++) {
                    const k3_mf_part *pt = &xl->parts[p];
                    k3i_fill_tensor(&c->tensors[c->n_tensors++], &pool, m->name_prefix, stem, pt->name,
                                    pt->encoding, pt->ndim, pt->shape, xl->offset + r * xl->stride + pt->offset,
                                    pt->size, s);
                }
            }
        }
        f->n_tensors = c->n_tensors - f->first_tensor;
    }
    if ((e = k3i_add_sources(x, dir, &pool, d))) return e;     /* version 3: records in place */
    for (size_t i = 0; i < c->n_tensors; i++) c->total_bytes += c->tensors[i].nbytes;
    return k3_st_index(c, d);
}

void k3i_close_pack(k3i_ctx *x)
{
    if (!x->is_pack) return;
    for (uint32_t s = 0; x->shard_hdr && s < x->pack.n_shards; s++) k3_shard_header_free(&x->shard_hdr[s]);
    free(x->shard_hdr);
    free(x->shard_ok);
    k3i_close_sources(x);
    k3_manifest_free(&x->pack);
}

/* ----------------------------------------------------------------- views */

static void parts_text(const k3_mf_experts *xl, FILE *f)
{
    char name[256];
    fprintf(f, "%-20s %-6s %-16s %12s %12s\n", "part", "enc", "shape", "offset", "bytes");
    for (uint32_t p = 0; p < xl->n_parts; p++) {
        const k3_mf_part *pt = &xl->parts[p];
        char shape[K3_ST_SHAPE_STR];
        k3_st_fmt_shape(pt->shape, (unsigned)pt->ndim, shape, sizeof shape);
        fprintf(f, "%-20s %-6s %-16s %12llu %12llu\n", k3_escape(pt->name, strlen(pt->name), name, sizeof name),
                k3_enc_name(pt->encoding), shape, (unsigned long long)pt->offset, (unsigned long long)pt->size);
    }
}

/* Version 3: the record layout of the first layer in a shard and of the first in place, each
   with the layers of its kind ("1, 4, 7" or "2-92"). */
static void records_text_v3(const k3_manifest *m, FILE *f)
{
    for (int in_place = 0; in_place < 2; in_place++) {
        const k3_mf_experts *first = NULL;
        char layers[2048] = "";
        size_t n = 0;
        for (uint32_t i = 0; i < m->n_expert_layers; i++) {
            const k3_mf_experts *xl = &m->expert_layers[i];
            if (!xl->in_place != !in_place) continue;
            int run = first && i && !m->expert_layers[i - 1].in_place == !in_place &&
                      m->expert_layers[i - 1].layer + 1 == xl->layer;
            int more = i + 1 < m->n_expert_layers && !m->expert_layers[i + 1].in_place == !in_place &&
                       m->expert_layers[i + 1].layer == xl->layer + 1;
            if (!first) first = xl;
            if (n >= sizeof layers - 24) continue;
            if (!run) n += (size_t)snprintf(layers + n, sizeof layers - n, "%s%u", n ? ", " : "", xl->layer);
            else if (!more) n += (size_t)snprintf(layers + n, sizeof layers - n, "-%u", xl->layer);
        }
        if (!first) continue;
        if (in_place)
            fprintf(f, "\nExpert record in place in the checkpoint (layers %s): %llu bytes, stride in memory %llu, "
                    "%llu records per layer\n", layers, (unsigned long long)first->record_size,
                    (unsigned long long)first->stride, (unsigned long long)first->count);
        else
            fprintf(f, "\nExpert record in a shard (layers %s): %llu bytes, stride %llu, %llu records per layer\n",
                    layers, (unsigned long long)first->record_size, (unsigned long long)first->stride,
                    (unsigned long long)first->count);
        parts_text(first, f);
    }
}

/* The checkpoint files the pack was made from, as sha256sum prints them (so `sha256sum -c` of the
   publisher's list, or a look, says whether it is the download you think). */
static void download_text(const k3_manifest *m, FILE *f)
{
    if (!m->have_download) {
        fprintf(f, "\nDownload: not recorded (a pack of an older k3pack, or an in-place pack whose download was "
                "not checked)\n");
        return;
    }
    char esc[600];
    if (m->download_checked)
        fprintf(f, "\nDownload: every file checked by k3pack against %s; SHA-256 as read:\n",
                k3_escape_ctl(m->download_checked, strlen(m->download_checked), esc, sizeof esc));
    else
        fprintf(f, "\nDownload: NOT checked by k3pack (no publisher's hashes were given); SHA-256 as read, to "
                "compare with the publisher's:\n");
    for (uint32_t i = 0; i < m->n_src_files; i++) {
        char hex[65];
        k3_dl_hex(m->src_files[i].sha256, 32, hex);
        fprintf(f, "%s  %s  (%llu bytes)\n", hex, k3_escape(m->src_files[i].name, strlen(m->src_files[i].name), esc,
                sizeof esc), (unsigned long long)m->src_files[i].size);
    }
}

int k3i_pack_text(const k3i_ctx *x, FILE *f)
{
    const k3_manifest *m = &x->pack;
    char name[256], srcs[64] = "";               /* names come from the manifest: escaped */
    if (m->n_sources) snprintf(srcs, sizeof srcs, ", %u checkpoint files read in place", m->n_sources);
    fprintf(f, "\nPack: format %d, %u shards%s, experts %s (%s), names without the prefix '%s'\n",
            m->format_version, m->n_shards, srcs, m->experts_encoding ? k3_enc_name(m->experts_encoding) : "none",
            m->experts_quantized ? "quantized by k3pack" : "as in the checkpoint",
            k3_escape(m->name_prefix, strlen(m->name_prefix), name, sizeof name));
    fprintf(f, "%-24s %-7s %5s %8s %8s %14s %16s  %-32s %s\n", "shard", "kind", "layer", "tensors", "records",
            "data_offset", "bytes", "xxh3_128", "header");
    for (uint32_t s = 0; s < m->n_shards; s++) {
        const k3_mf_shard *sh = &m->shards[s];
        const k3_shard_header *h = &x->shard_hdr[s];
        char layer[24] = "-", hex[33];
        if (sh->layer >= 0) snprintf(layer, sizeof layer, "%lld", (long long)sh->layer);
        k3_hex128(sh->hash, hex);
        fprintf(f, "%-24s %-7s %5s %8u %8llu %14llu %16llu  %s %s\n", k3_escape(sh->name, strlen(sh->name), name, sizeof name),
                sh->kind == K3_SHARD_TRUNK ? "trunk" : "experts", layer, x->shard_ok[s] ? h->n_entries : 0,
                x->shard_ok[s] ? (unsigned long long)h->n_records : 0ull,
                x->shard_ok[s] ? (unsigned long long)h->data_offset : 0ull, (unsigned long long)sh->size, hex,
                x->shard_ok[s] ? "ok" : "DAMAGED");
    }
    if (m->n_sources) {                          /* version 3: records in place */
        k3i_sources_text(x, f);
        records_text_v3(m, f);
    } else if (m->n_expert_layers) {
        const k3_mf_experts *xl = &m->expert_layers[0];
        fprintf(f, "\nExpert record (every MoE layer): %llu bytes, stride %llu, %llu records per layer\n",
                (unsigned long long)xl->record_size, (unsigned long long)xl->stride, (unsigned long long)xl->count);
        parts_text(xl, f);
    }
    download_text(m, f);
    return ferror(f) ? -1 : 0;
}

void k3i_pack_json(const k3i_ctx *x, FILE *f)
{
    if (!x->is_pack) return;
    const k3_manifest *m = &x->pack;
    fprintf(f, ",\n\"pack\":{\"format_version\":%d,\"name_prefix\":", m->format_version);
    k3_json_str(f, m->name_prefix, strlen(m->name_prefix));
    fprintf(f, ",\"experts\":{\"encoding\":%s%s%s,\"source\":\"%s\"},\"shards\":[",
            m->experts_encoding ? "\"" : "", m->experts_encoding ? k3_enc_name(m->experts_encoding) : "null",
            m->experts_encoding ? "\"" : "", m->experts_quantized ? "quantized" : "checkpoint");
    for (uint32_t s = 0; s < m->n_shards; s++) {
        const k3_mf_shard *sh = &m->shards[s];
        const k3_shard_header *h = &x->shard_hdr[s];
        char hex[33], layer[24] = "null";
        k3_hex128(sh->hash, hex);
        if (sh->layer >= 0) snprintf(layer, sizeof layer, "%lld", (long long)sh->layer);
        fprintf(f, "%s\n{\"name\":", s ? "," : "");
        k3_json_str(f, sh->name, strlen(sh->name));
        fprintf(f, ",\"kind\":\"%s\",\"layer\":%s,\"size\":%llu,\"xxh3_128\":\"%s\",\"header_ok\":%s",
                sh->kind == K3_SHARD_TRUNK ? "trunk" : "experts", layer, (unsigned long long)sh->size, hex,
                x->shard_ok[s] ? "true" : "false");
        if (x->shard_ok[s])
            fprintf(f, ",\"entries\":%u,\"records\":%llu,\"data_offset\":%llu,\"record_size\":%llu,\"record_stride\":%llu",
                    h->n_entries, (unsigned long long)h->n_records, (unsigned long long)h->data_offset,
                    (unsigned long long)h->record_size, (unsigned long long)h->record_stride);
        fputc('}', f);
    }
    fputs("],\n\"expert_record\":", f);
    if (!m->n_expert_layers) {
        fputs("null}", f);
        return;
    }
    const k3_mf_experts *xl = &m->expert_layers[0];
    fprintf(f, "{\"record_size\":%llu,\"stride\":%llu,\"count\":%llu,", (unsigned long long)xl->record_size,
            (unsigned long long)xl->stride, (unsigned long long)xl->count);
    if (m->n_sources) fprintf(f, "\"layer\":%u,\"in_place\":%s,", xl->layer, xl->in_place ? "true" : "false");
    fputs("\"parts\":[", f);
    for (uint32_t p = 0; p < xl->n_parts; p++) {
        const k3_mf_part *pt = &xl->parts[p];
        fprintf(f, "%s{\"name\":", p ? "," : "");
        k3_json_str(f, pt->name, strlen(pt->name));
        fprintf(f, ",\"encoding\":\"%s\",\"shape\":[", k3_enc_name(pt->encoding));
        for (int i = 0; i < pt->ndim; i++) fprintf(f, "%s%llu", i ? "," : "", (unsigned long long)pt->shape[i]);
        fprintf(f, "],\"offset\":%llu,\"size\":%llu}", (unsigned long long)pt->offset, (unsigned long long)pt->size);
    }
    fputs("]}", f);
    k3i_sources_json(x, f);                      /* version 3: checkpoint files, expert layers */
    if (m->have_download) {
        fputs(",\n\"download\":{\"checked_against\":", f);
        if (m->download_checked) k3_json_str(f, m->download_checked, strlen(m->download_checked));
        else fputs("null", f);
        fputs(",\"files\":[", f);
        for (uint32_t i = 0; i < m->n_src_files; i++) {
            char hex[65];
            k3_dl_hex(m->src_files[i].sha256, 32, hex);
            fprintf(f, "%s{\"name\":", i ? "," : "");
            k3_json_str(f, m->src_files[i].name, strlen(m->src_files[i].name));
            fprintf(f, ",\"size\":%llu,\"sha256\":\"%s\"}", (unsigned long long)m->src_files[i].size, hex);
        }
        fputs("]}", f);
    }
    fputc('}', f);
}

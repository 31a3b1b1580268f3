/*
 * k3inspect_in_place.c - what a version-3 pack adds (FORMAT.md 10): expert records that stay
 * in the checkpoint's safetensors files. Each checkpoint file the manifest lists becomes a file
 * of the view, "checkpoint/NAME" (or NAME for the pack's own experts-copied.safetensors, the
 * records k3pack copied), holding the parts of its in-place records as rows at their offsets in
 * that file (the checkpoint's own offsets, so the two views compare line by line);
 * the `checkpoint` link, the files (size, header, records, state) and the expert layers (in a
 * shard or in place, record size, stride) are shown after the shard table, and in JSON.
 * Only each file's size and safetensors header are read (to say whether it is the file k3pack
 * read); a missing or changed file is a warning here (k3verify is the judge).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "k3_file.h"
#include "k3_hash.h"
#include "k3_log.h"
#include "k3inspect.h"

static const char *const state_name[] = {
    [K3I_SRC_OK] = "ok", [K3I_SRC_MISSING] = "missing", [K3I_SRC_SIZE] = "other size",
    [K3I_SRC_HEADER] = "other header", [K3I_SRC_UNREADABLE] = "unreadable",
};

/* One in-place record, for sorting a file's records by offset. */
typedef struct ip_rec {
    uint64_t off;
    uint32_t xl;            /* expert_layers index */
    uint64_t e;             /* expert */
} ip_rec;

static int cmp_rec(const void *a, const void *b)
{
    const ip_rec *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off ? 1 : x->xl < y->xl ? -1 : x->xl > y->xl;
}

/* Is checkpoint file j the one k3pack read? Its size, and the XXH3-128 of its header. */
static int source_state(const char *path, const k3_mf_source *f)
{
    int fd = k3_open_read(path);
    if (fd < 0) return errno == ENOENT || errno == ENOTDIR ? K3I_SRC_MISSING : K3I_SRC_UNREADABLE;
    struct stat st;
    int s = K3I_SRC_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) s = K3I_SRC_UNREADABLE;
    else if ((uint64_t)st.st_size != f->size) s = K3I_SRC_SIZE;
    if (s == K3I_SRC_OK) {
        uint8_t *hdr = malloc((size_t)f->header_size);         /* [header_size] its safetensors header */
        if (!hdr || k3_pread_full(fd, hdr, (size_t)f->header_size, 0, path, NULL)) {
            s = K3I_SRC_UNREADABLE;
        } else {
            k3_h128 h = k3_xxh3_128(hdr, (size_t)f->header_size);
            if (h.lo != f->header_hash.lo || h.hi != f->header_hash.hi) s = K3I_SRC_HEADER;
        }
        free(hdr);
    }
    close(fd);
    return s;
}

k3_err k3i_add_sources(k3i_ctx *x, const char *dir, char **pool, k3_diag *d)
{
    k3_st_ckpt *c = &x->ck;
    const k3_manifest *m = &x->pack;
    if (!m->n_sources) return K3_OK;
    char link[4096], target[4096];
    k3_err e;
    if ((e = k3_path_join(link, sizeof link, dir, K3_CHECKPOINT_LINK, d))) return e;
    ssize_t tn = readlink(link, target, sizeof target - 1);
    if (tn >= 0) {
        target[tn] = '\0';
        if (!(x->link_target = strdup(target))) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    }
    struct stat st;
    int link_ok = stat(link, &st) == 0 && S_ISDIR(st.st_mode), n_ck = 0;
    for (uint32_t j = 0; j < m->n_sources; j++) n_ck += !m->sources[j].in_pack;
    if (!link_ok && n_ck) {
        char msg[8400];
        snprintf(msg, sizeof msg, "the pack reads expert records in place, but its link '%s' %s; point it at the "
                 "checkpoint's directory: ln -sfn DIR '%s'", link,
                 x->link_target ? "does not lead to a directory" : "is missing", link);
        k3i_warn(c, msg);
    }
    x->src_state = calloc(m->n_sources + 1, 1);
    x->src_records = calloc(m->n_sources + 1, sizeof *x->src_records);
    if (!x->src_state || !x->src_records) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    uint64_t n_rec = 0;
    for (uint32_t i = 0; i < m->n_expert_layers; i++)
        if (m->expert_layers[i].in_place) n_rec += m->expert_layers[i].count;
    ip_rec *rs = malloc((n_rec + 1) * sizeof *rs);             /* [n_rec] one file's records */
    if (!rs) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (uint32_t j = 0; j < m->n_sources && !e; j++) {
        const k3_mf_source *src = &m->sources[j];
        k3_st_file *f = &c->files[c->n_files];
        char name[4200], path[8400];
        if (src->in_pack) snprintf(name, sizeof name, "%s", src->name);   /* a file of the pack */
        else snprintf(name, sizeof name, "%s/%s", K3_CHECKPOINT_LINK, src->name);
        if ((e = k3_path_join(path, sizeof path, dir, name, d))) break;
        f->path = strdup(path);
        f->name = strdup(name);
        if (!f->path || !f->name) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); break; }
        f->size = src->size;
        f->header_len = src->header_size - 8;                   /* so that data_offset = header_len + 8 */
        uint32_t fi = (uint32_t)c->n_files++;
        int reach = link_ok || src->in_pack;
        x->src_state[j] = (uint8_t)(reach ? source_state(path, src) : K3I_SRC_MISSING);
        if (reach && x->src_state[j] != K3I_SRC_OK) {
            char msg[8600];
            snprintf(msg, sizeof msg, "%s '%s' %s", src->in_pack ? "the pack's file" : "checkpoint file", name,
                     x->src_state[j] == K3I_SRC_MISSING ? "is missing"
                     : x->src_state[j] == K3I_SRC_SIZE ? "has another size than the file k3pack read"
                     : x->src_state[j] == K3I_SRC_HEADER ? "has another safetensors header than the file k3pack read"
                                                         : "cannot be read");
            k3i_warn(c, msg);
        }
        size_t k = 0;
        for (uint32_t i = 0; i < m->n_expert_layers; i++) {
            const k3_mf_experts *xl = &m->expert_layers[i];
            for (uint64_t r = 0; xl->in_place && r < xl->count; r++)
                if (xl->rec_file[r] == j) rs[k++] = (ip_rec){xl->rec_off[r], i, r};
        }
        qsort(rs, k, sizeof *rs, cmp_rec);
        x->src_records[j] = k;
        f->first_tensor = c->n_tensors;
        for (size_t q = 0; q < k; q++) {
            const k3_mf_experts *xl = &m->expert_layers[rs[q].xl];
            char stem[96];
            snprintf(stem, sizeof stem, "model.layers.%u.block_sparse_moe.experts.%llu.", xl->layer,
                     (unsigned long long)rs[q].e);
            for (uint32_t p = 0; p < xl->n_parts; p++) {
                const k3_mf_part *pt = &xl->parts[p];
                k3i_fill_tensor(&c->tensors[c->n_tensors++], pool, m->name_prefix, stem, pt->name, pt->encoding,
                                pt->ndim, pt->shape, rs[q].off + pt->offset, pt->size, fi);
            }
        }
        f->n_tensors = c->n_tensors - f->first_tensor;
    }
    free(rs);
    return e;
}

void k3i_close_sources(k3i_ctx *x)
{
    free(x->src_state);
    free(x->src_records);
    free(x->link_target);
    x->src_state = NULL;
    x->src_records = NULL;
    x->link_target = NULL;
}

/* ----------------------------------------------------------------- views */

/* The distinct checkpoint files of in-place layer xl, ", "-separated, escaped, into buf. */
static const char *layer_files(const k3_manifest *m, const k3_mf_experts *xl, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (uint32_t j = 0; j < m->n_sources; j++) {
        uint64_t r = 0;
        while (r < xl->count && xl->rec_file[r] != j) r++;
        if (r == xl->count) continue;
        char esc[1100], copied[48] = "";
        k3_escape(m->sources[j].name, strlen(m->sources[j].name), esc, sizeof esc);
        if (m->sources[j].in_pack) {                 /* the records k3pack copied into the pack */
            uint64_t k = 0;
            for (; r < xl->count; r++) k += xl->rec_file[r] == j;
            snprintf(copied, sizeof copied, " (%llu copied)", (unsigned long long)k);
        }
        n += (size_t)snprintf(buf + (n < cap ? n : cap - 1), n < cap ? cap - n : 1, "%s%s%s", n ? ", " : "", esc,
                              copied);
    }
    return buf;
}

void k3i_sources_text(const k3i_ctx *x, FILE *f)
{
    const k3_manifest *m = &x->pack;
    char name[1100], files[4096];
    if (!m->n_sources) return;
    fprintf(f, "\nCheckpoint (expert records read in place): '%s' -> %s%s%s, %u files\n", K3_CHECKPOINT_LINK,
            x->link_target ? "'" : "", x->link_target ? k3_escape(x->link_target, strlen(x->link_target), files,
                                                                  sizeof files) : "(no link)",
            x->link_target ? "'" : "", m->n_sources);
    fprintf(f, "%-40s %16s %12s  %-32s %8s  %s\n", "file", "bytes", "header", "header_xxh3_128", "records", "state");
    for (uint32_t j = 0; j < m->n_sources; j++) {
        const k3_mf_source *s = &m->sources[j];
        char hex[33];
        k3_hex128(s->header_hash, hex);
        fprintf(f, "%-40s %16llu %12llu  %s %8zu  %s%s\n", k3_escape(s->name, strlen(s->name), name, sizeof name),
                (unsigned long long)s->size, (unsigned long long)s->header_size, hex, x->src_records[j],
                x->src_state[j] == K3I_SRC_OK ? "ok" : x->src_state[j] == K3I_SRC_MISSING ? "MISSING" : "CHANGED",
                s->in_pack ? " (in the pack: records k3pack copied)" : "");
    }
    fprintf(f, "\nExpert layers (in memory, a record read in place takes its stride: the 4 KiB pages that cover it):\n");
    fprintf(f, "%5s %8s %12s %12s  %s\n", "layer", "records", "record_size", "stride", "where");
    for (uint32_t i = 0; i < m->n_expert_layers; i++) {
        const k3_mf_experts *xl = &m->expert_layers[i];
        fprintf(f, "%5u %8llu %12llu %12llu  ", xl->layer, (unsigned long long)xl->count,
                (unsigned long long)xl->record_size, (unsigned long long)xl->stride);
        if (xl->in_place)
            fprintf(f, "in place in the checkpoint: %s\n", layer_files(m, xl, files, sizeof files));
        else
            fprintf(f, "%s\n", k3_escape(m->shards[xl->shard].name, strlen(m->shards[xl->shard].name), name,
                                         sizeof name));
    }
}

void k3i_sources_json(const k3i_ctx *x, FILE *f)
{
    const k3_manifest *m = &x->pack;
    if (!m->n_sources) return;
    fputs(",\"checkpoint_link\":", f);
    if (x->link_target) k3_json_str(f, x->link_target, strlen(x->link_target));
    else fputs("null", f);
    fputs(",\"checkpoint_files\":[", f);
    for (uint32_t j = 0; j < m->n_sources; j++) {
        const k3_mf_source *s = &m->sources[j];
        char hex[33];
        k3_hex128(s->header_hash, hex);
        fprintf(f, "%s\n{\"name\":", j ? "," : "");
        k3_json_str(f, s->name, strlen(s->name));
        fprintf(f, ",\"size\":%llu,\"header_size\":%llu,\"header_xxh3_128\":\"%s\",\"records\":%zu,\"state\":\"%s\","
                "\"in_pack\":%s}", (unsigned long long)s->size, (unsigned long long)s->header_size, hex,
                x->src_records[j], state_name[x->src_state[j]], s->in_pack ? "true" : "false");
    }
    fputs("],\n\"expert_layers\":[", f);
    for (uint32_t i = 0; i < m->n_expert_layers; i++) {
        const k3_mf_experts *xl = &m->expert_layers[i];
        fprintf(f, "%s\n{\"layer\":%u,\"count\":%llu,\"record_size\":%llu,\"stride\":%llu,\"in_place\":%s,\"shard\":",
                i ? "," : "", xl->layer, (unsigned long long)xl->count, (unsigned long long)xl->record_size,
                (unsigned long long)xl->stride, xl->in_place ? "true" : "false");
        if (xl->in_place) fputs("null", f);
        else k3_json_str(f, m->shards[xl->shard].name, strlen(m->shards[xl->shard].name));
        fputs(",\"files\":[", f);
        int first = 1;
        for (uint32_t j = 0; xl->in_place && j < m->n_sources; j++) {
            uint64_t r = 0;
            while (r < xl->count && xl->rec_file[r] != j) r++;
            if (r == xl->count) continue;
            fprintf(f, "%s%u", first ? "" : ",", j);
            first = 0;
        }
        fputs("]}", f);
    }
    fputs("]", f);
}

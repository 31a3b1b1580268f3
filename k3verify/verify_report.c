/*
 * verify_report.c - k3verify's output: items and problems, the coreutils-style
 * check lines, JSON Lines records, exit codes. Grammar: docs/k3verify.md.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "k3_error.h"
#include "k3_log.h"
#include "k3_progress.h"
#include "k3_sys.h"
#include "k3verify.h"

#define K3V_TEXT_PROBLEMS 8     /* problems per text line unless -v */

static const char *const kind_names[K3V__COUNT] = {
    [K3V_HASH] = "hash",         [K3V_MISSING] = "missing",       [K3V_SIZE] = "size",
    [K3V_HEADER] = "header",     [K3V_MISMATCH] = "mismatch",     [K3V_PADDING] = "padding",
    [K3V_UNLISTED] = "unlisted", [K3V_UNFINISHED] = "unfinished", [K3V_MANIFEST] = "manifest",
    [K3V_IO] = "io",             [K3V_TYPE] = "type",             [K3V_FORMAT] = "format",
    [K3V_UNEXPECTED] = "unexpected", [K3V_VALUE] = "value",
};

const char *k3v_kind_name(int kind)
{
    return kind >= 0 && kind < K3V__COUNT ? kind_names[kind] : "other";
}

/* ------------------------------------------------------------------ memory */

void *k3v_xalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        k3_error("out of memory");
        exit(K3_EXIT_INTERNAL);
    }
    return p;
}

static char *vfmt(const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) n = 0;
    char *s = k3v_xalloc((size_t)n + 1);     /* [n + 1] text + NUL */
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

char *k3v_fmt(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = vfmt(fmt, ap);
    va_end(ap);
    return s;
}

char *k3v_esc(const char *s, size_t len)
{
    size_t cap = 4 * len + 8;                 /* worst case \xNN per byte, + NUL */
    char *out = k3v_xalloc(cap);
    return k3_escape(s, len, out, cap);
}

/* ------------------------------------------------------------------ items */

void k3v_item_init(k3v_item *it, const char *type, const char *name)
{
    memset(it, 0, sizeof *it);
    it->type = type;
    it->name = k3v_fmt("%s", name);
}

void k3v_item_free(k3v_item *it)
{
    for (size_t i = 0; i < it->n_pr; i++) {
        free(it->pr[i].msg);
        free(it->pr[i].tensor);
    }
    free(it->pr);
    free(it->name);
    free(it->target);
    memset(it, 0, sizeof *it);
}

k3v_problem *k3v_add(k3v_item *it, int kind, const char *fmt, ...)
{
    if (it->n_pr == it->cap_pr) {
        size_t cap = it->cap_pr ? 2 * it->cap_pr : 4;
        k3v_problem *np = realloc(it->pr, cap * sizeof *np);
        if (!np) {
            k3_error("out of memory");
            exit(K3_EXIT_INTERNAL);
        }
        it->pr = np;
        it->cap_pr = cap;
    }
    k3v_problem *p = &it->pr[it->n_pr++];
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->expert = p->layer = K3V_NONE;
    va_list ap;
    va_start(ap, fmt);
    p->msg = vfmt(fmt, ap);
    va_end(ap);
    if (kind == K3V_IO) it->io = 1;
    return p;
}

void k3v_set_tensor(k3v_problem *p, const char *name, size_t len)
{
    free(p->tensor);
    p->tensor = k3v_xalloc(len + 1);
    memcpy(p->tensor, name, len);
}

int k3v_failed(const k3v_item *it) { return it->n_pr > 0; }

size_t k3v_count(const k3v_item *it, int kind)
{
    size_t n = 0;
    for (size_t i = 0; i < it->n_pr; i++) n += it->pr[i].kind == kind;
    return n;
}

/* ------------------------------------------------------------------ output */

void k3v_report_init(k3v_report *r, FILE *out, int json, int quiet, int all_problems)
{
    memset(r, 0, sizeof *r);
    r->out = out;
    r->json = json;
    r->quiet = quiet;
    r->all_problems = all_problems;
    r->t_start = k3_now();
}

static void json_u64(FILE *f, const char *key, uint64_t v) { fprintf(f, ",\"%s\":%llu", key, (unsigned long long)v); }

static void json_str(FILE *f, const char *key, const char *s)
{
    fprintf(f, ",\"%s\":", key);
    k3_json_str(f, s, strlen(s));
}

static void print_json(k3v_report *r, const k3v_item *it, const char *status)
{
    FILE *f = r->out;
    fprintf(f, "{\"schema\":1,\"type\":\"%s\"", it->type);
    json_str(f, "name", it->name);
    json_str(f, "status", status);
    if (it->target) json_str(f, "target", it->target);
    if (it->note) json_str(f, "note", it->note);
    if (it->file_hash) json_str(f, "file_hash", it->file_hash);
    if (it->bytes) json_u64(f, "bytes", it->bytes);
    fputs(",\"problems\":[", f);
    for (size_t i = 0; i < it->n_pr; i++) {
        const k3v_problem *p = &it->pr[i];
        fprintf(f, "%s{\"kind\":\"%s\"", i ? "," : "", k3v_kind_name(p->kind));
        json_str(f, "message", p->msg);
        if (p->tensor) json_str(f, "tensor", p->tensor);
        if (p->expert != K3V_NONE) json_u64(f, "expert", (uint64_t)p->expert);
        if (p->layer != K3V_NONE) json_u64(f, "layer", (uint64_t)p->layer);
        if (p->has_range) {
            json_u64(f, "begin", p->begin);
            json_u64(f, "end", p->end);
        }
        fputc('}', f);
    }
    fputs("]}\n", f);
}

/* A message as text: its names are escaped already, but it may quote a
   library message that holds raw bytes; no control byte may end the line. */
static void put_msg(FILE *f, const char *msg)
{
    size_t n = strlen(msg), cap = 4 * n + 8;
    char *safe = k3v_xalloc(cap);             /* [cap] worst case \xNN per byte */
    fputs(k3_escape_ctl(msg, n, safe, cap), f);
    free(safe);
}

static void print_text(k3v_report *r, const k3v_item *it, const char *status)
{
    FILE *f = r->out;
    char *name = k3v_esc(it->name, strlen(it->name));
    if (!strcmp(status, "ok")) {
        fprintf(f, "%s: OK\n", name);
    } else if (!strcmp(status, "skipped")) {
        fprintf(f, "%s: SKIPPED%s%s%s\n", name, it->note ? " (" : "", it->note ? it->note : "", it->note ? ")" : "");
    } else {
        size_t shown = it->n_pr;
        if (!r->all_problems && shown > K3V_TEXT_PROBLEMS) shown = K3V_TEXT_PROBLEMS;
        fprintf(f, "%s: FAILED (", name);
        for (size_t i = 0; i < shown; i++) {
            if (i) fputs("; ", f);
            put_msg(f, it->pr[i].msg);
        }
        if (shown < it->n_pr)
            fprintf(f, "; and %zu more problems (-v or --json lists all)", it->n_pr - shown);
        fputs(")\n", f);
    }
    free(name);
}

void k3v_report_item(k3v_report *r, const k3v_item *it)
{
    const char *status = it->status ? it->status : k3v_failed(it) ? "failed" : "ok";
    k3v_tally *t = !strcmp(it->type, "shard") ? &r->shards : !strcmp(it->type, "file") ? &r->files
                 : !strcmp(it->type, "tensor") ? &r->tensors : !strcmp(it->type, "checkpoint_file") ? &r->sources
                 : NULL;
    r->bytes += it->bytes;
    if (strcmp(status, "skipped")) {
        if (t) t->checked++;
        if (k3v_failed(it)) {
            if (t) t->failed++;
            size_t io = k3v_count(it, K3V_IO);
            if (io == it->n_pr) r->io_failed++;
            else r->damaged++;
            if (!strcmp(it->type, "manifest")) r->manifest_failed = 1;
            if (!strcmp(it->type, "link")) r->link_failed = 1;
            if (!strcmp(it->type, "extra")) {
                if (k3v_count(it, K3V_UNFINISHED)) r->unfinished++;
                else r->unlisted++;
            }
        }
    }
    if (r->quiet && (!strcmp(status, "ok") || !strcmp(status, "skipped"))) return;
    k3_progress_end(&r->progress);        /* the line goes above the progress display */
    if (r->json) print_json(r, it, status);
    else print_text(r, it, status);
    fflush(r->out);
}

/* ------------------------------------------------------------------ JSON summary helpers */

void k3v_json_begin(k3v_report *r, const char *type)
{
    fprintf(r->out, "{\"schema\":1,\"type\":\"%s\"", type);
}

void k3v_json_field_str(k3v_report *r, const char *key, const char *val)
{
    if (val) json_str(r->out, key, val);
    else fprintf(r->out, ",\"%s\":null", key);
}

void k3v_json_field_u64(k3v_report *r, const char *key, uint64_t v) { json_u64(r->out, key, v); }

void k3v_json_field_raw(k3v_report *r, const char *key, const char *json)
{
    fprintf(r->out, ",\"%s\":%s", key, json);
}

void k3v_json_end(k3v_report *r)
{
    fputs("}\n", r->out);
    fflush(r->out);
}

void k3v_pack_summary(k3v_report *r, const k3v_pack_opts *o, uint32_t n_sel, uint32_t n_shards, uint32_t n_files,
                      uint32_t n_sources, uint32_t n_src_sel, int have_m)
{
    double secs = k3_now() - r->t_start;
    int code = k3v_exit_code(r);
    char subset[48] = "";
    if (o->subset_t) snprintf(subset, sizeof subset, "%u/%u", o->subset_n, o->subset_t);
    if (r->json) {
        char buf[160];
        k3v_json_begin(r, "summary");
        k3v_json_field_str(r, "status", code == 0 ? "ok" : code == K3_EXIT_DATA ? "failed" : "error");
        k3v_json_field_u64(r, "exit", (uint64_t)code);
        k3v_json_field_str(r, "mode", o->quick ? "quick" : "full");
        k3v_json_field_str(r, "subset", o->subset_t ? subset : NULL);
        k3v_json_field_str(r, "manifest", r->manifest_failed ? "failed" : "ok");
        k3v_json_field_str(r, "manifest_xxh3_128", r->manifest_hash[0] ? r->manifest_hash : NULL);
        snprintf(buf, sizeof buf, "{\"total\":%u,\"checked\":%u,\"failed\":%u}", n_shards,
                 r->shards.checked, r->shards.failed);
        k3v_json_field_raw(r, "shards", buf);
        snprintf(buf, sizeof buf, "{\"total\":%u,\"checked\":%u,\"failed\":%u}", n_files,
                 r->files.checked, r->files.failed);
        k3v_json_field_raw(r, "files", buf);
        if (n_sources) {                        /* version 3: the checkpoint files read in place */
            snprintf(buf, sizeof buf, "{\"total\":%u,\"checked\":%u,\"failed\":%u}", n_sources,
                     r->sources.checked, r->sources.failed);
            k3v_json_field_raw(r, "checkpoint_files", buf);
            k3v_json_field_str(r, "checkpoint_link", r->link_failed ? "failed" : "ok");
        }
        k3v_json_field_u64(r, "unlisted", r->unlisted);
        k3v_json_field_u64(r, "unfinished", r->unfinished);
        k3v_json_field_u64(r, "bytes", r->bytes);
        snprintf(buf, sizeof buf, "%.3f", secs);
        k3v_json_field_raw(r, "seconds", buf);
        k3v_json_end(r);
    }
    char notes[200] = "", srcs[64] = "";
    if (n_sources) snprintf(srcs, sizeof srcs, " and %u of %u checkpoint files", n_src_sel, n_sources);
    if (o->subset_t)
        snprintf(notes, sizeof notes, " (subset %s: %u of %u shards%s checked)", subset, n_sel, n_shards, srcs);
    if (o->quick)
        snprintf(notes + strlen(notes), sizeof notes - strlen(notes), " (quick: sizes, headers and manifest only)");
    if (code == 0) {
        if (k3_log_level() < K3_LOG_NORMAL) return;
        char b[24], rate[24];
        k3_human_bytes((double)r->bytes, b, sizeof b);
        k3_human_bytes(secs > 0 ? (double)r->bytes / secs : 0, rate, sizeof rate);
        if (n_sources)
            fprintf(stderr, "%s: %u shards, %u files and %u checkpoint files OK, %s read in %.1f s (%s/s)%s\n",
                    k3_log_prog(), r->shards.checked, r->files.checked, r->sources.checked, b, secs, rate, notes);
        else
            fprintf(stderr, "%s: %u shards and %u files OK, %s read in %.1f s (%s/s)%s\n", k3_log_prog(),
                    r->shards.checked, r->files.checked, b, secs, rate, notes);
        if (r->manifest_hash[0])
            fprintf(stderr, "%s: the pack's identity: manifest.json XXH3-128 %s (compare with the published value)\n",
                    k3_log_prog(), r->manifest_hash);
        return;
    }
    char line[512];
    size_t len = 0;
#define ADD(...) len += (size_t)snprintf(line + (len < sizeof line ? len : sizeof line - 1), \
                                         len < sizeof line ? sizeof line - len : 1, __VA_ARGS__)
    if (r->manifest_failed) ADD("%smanifest.json FAILED", len ? ", " : "");
    if (have_m) ADD("%s%u of %u shards FAILED", len ? ", " : "", r->shards.failed, r->shards.checked);
    if (r->files.failed) ADD("%s%u of %u files FAILED", len ? ", " : "", r->files.failed, r->files.checked);
    if (r->link_failed) ADD("%sthe checkpoint link FAILED", len ? ", " : "");
    if (r->sources.failed)
        ADD("%s%u of %u checkpoint files FAILED", len ? ", " : "", r->sources.failed, r->sources.checked);
    if (r->unlisted) ADD("%s%u unlisted file%s", len ? ", " : "", r->unlisted, r->unlisted == 1 ? "" : "s");
    if (r->unfinished) ADD("%s%u leftover%s of an unfinished k3pack run", len ? ", " : "", r->unfinished,
                           r->unfinished == 1 ? "" : "s");
#undef ADD
    fprintf(stderr, "%s: %s%s\n", k3_log_prog(), line, notes);
}

int k3v_exit_code(const k3v_report *r)
{
    if (r->damaged) return K3_EXIT_DATA;
    if (r->io_failed) return K3_EXIT_IO;
    return K3_EXIT_OK;
}

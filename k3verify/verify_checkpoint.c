/*
 * verify_checkpoint.c - `k3verify --checkpoint DIR`: is a downloaded
 * safetensors checkpoint complete and does it hold what its config.json
 * describes? The strict reader (k3_st_open: headers, index, file sizes), the
 * config parser, the expected tensor list and the matching rules are the
 * formats library's (safetensors.h, k3_config.h, k3_ckpt_check.h); this file
 * only turns their findings into check lines. No tensor data is read.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "k3_ckpt_check.h"
#include "k3_download.h"
#include "k3_config.h"
#include "k3_error.h"
#include "k3_log.h"
#include "safetensors.h"
#include "k3verify.h"

static const char *strip_subject(const char *msg, const char *subject)
{
    size_t n = strlen(subject);
    if (msg[0] == '\'' && !strncmp(msg + 1, subject, n) && !strncmp(msg + 1 + n, "': ", 3)) return msg + n + 4;
    return msg;
}

static void dtype_shape(int dtype, int rank, const uint64_t *shape, char *out, size_t cap)
{
    size_t o = (size_t)snprintf(out, cap, "%s [", k3_dtype_name((k3_dtype)dtype));
    for (int i = 0; i < rank && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "%s%llu", i ? ", " : "", (unsigned long long)shape[i]);
    if (o < cap) snprintf(out + o, cap - o, "]");
}

typedef struct ck_counts {
    size_t missing, mismatch, unexpected, skipped, expected;
    size_t download_checked, download_bad;   /* files checked against the publisher's hashes, and failed */
    const char *download_what;               /* against what (NULL: not checked) */
} ck_counts;

/* One line per problem, in the expected (forward) order, then the unexpected tensors. */
static void report_tensors(const k3_st_ckpt *ck, const k3_config *cfg, const k3_xlist *xl, const k3_ckpt_match *m,
                           k3v_report *r, ck_counts *n)
{
    const char *prefix = k3_config_prefix(cfg);
    for (size_t i = 0; i < xl->n; i++) {
        const k3_xtensor *x = &xl->t[i];
        if (m->x_status[i] == K3_CK_OK) continue;
        char *full = k3v_fmt("%s%s", prefix, x->name);
        const k3_st_tensor *t = m->found[i];
        k3v_item it;
        k3v_item_init(&it, "tensor", full);
        k3v_problem *p;
        if (m->x_status[i] == K3_CK_MISSING) {
            p = k3v_add(&it, K3V_MISSING, "missing");
            n->missing++;
        } else {
            char got[160], want[160], *file = k3v_esc(ck->files[t->file].name, strlen(ck->files[t->file].name));
            dtype_shape(t->dtype, t->rank, t->shape, got, sizeof got);
            dtype_shape(x->dtype, x->rank, x->shape, want, sizeof want);
            p = k3v_add(&it, K3V_MISMATCH, "%s in '%s', the config needs %s%s", got, file, want,
                        (x->flags & K3_XT_ANY_SHAPE) ? " (or any shape of as many elements)" : "");
            free(file);
            n->mismatch++;
        }
        k3v_set_tensor(p, full, strlen(full));
        if (x->layer >= 0) p->layer = x->layer;
        k3v_report_item(r, &it);
        k3v_item_free(&it);
        free(full);
    }
    for (size_t j = 0; j < ck->n_tensors; j++) {
        const k3_st_tensor *t = &ck->tensors[j];
        if (m->src_status[j] == K3_CK_EXPECTED) continue;
        k3v_item it;
        k3v_item_init(&it, "tensor", t->name);
        if (m->src_status[j] == K3_CK_SKIPPED) {
            n->skipped++;
            it.status = "skipped";
            it.note = "vision tensor, not packed";
            if (r->all_problems) k3v_report_item(r, &it);
        } else {
            char *file = k3v_esc(ck->files[t->file].name, strlen(ck->files[t->file].name));
            k3v_problem *p = k3v_add(&it, K3V_UNEXPECTED, "unexpected: in '%s', not a tensor of the model "
                                     "config.json describes", file);
            k3v_set_tensor(p, t->name, t->name_len);
            free(file);
            n->unexpected++;
            k3v_report_item(r, &it);
        }
        k3v_item_free(&it);
    }
}

/* The files k3pack reads besides the .safetensors: checked too when a hash of them is known. */
static const char *const side_files[] = {"config.json", "model.safetensors.index.json", "tiktoken.model",
                                         "tokenizer_config.json", "generation_config.json"};
#define N_SIDE ((int)(sizeof side_files / sizeof side_files[0]))

/* Each file read once against the publisher's hash (threads files at once; lines in name order). Files
   with no known hash: every .safetensors must have one when a SUMS file is given. Returns the files
   checked. */
static size_t check_download(const k3_st_ckpt *ck, const k3_dl *dl, int threads, k3v_report *r, ck_counts *n)
{
    size_t nf = ck->n_files + N_SIDE;
    const char **path = calloc(nf + 1, sizeof *path);     /* [nf] */
    const char **name = calloc(nf + 1, sizeof *name);     /* [nf] */
    k3_diag *res = calloc(nf + 1, sizeof *res);          /* [nf] code K3_OK, or what went wrong */
    int *kind = calloc(nf + 1, sizeof *kind);            /* [nf] 0 nothing to check, 1 checked, 2 not covered */
    char (*side)[4096] = calloc(N_SIDE, sizeof *side);   /* [N_SIDE] side files' paths */
    size_t checked = 0;
    if (!path || !name || !res || !kind || !side) {
        k3_error("out of memory");
        goto out;
    }
    for (size_t i = 0; i < ck->n_files; i++) {
        path[i] = ck->files[i].path;
        name[i] = ck->files[i].name;
    }
    for (int j = 0; j < N_SIDE; j++) {
        struct stat st;
        snprintf(side[j], sizeof side[j], "%s/%s", ck->dir ? ck->dir : ".", side_files[j]);
        if (stat(side[j], &st) == 0) {
            path[ck->n_files + (size_t)j] = side[j];
            name[ck->n_files + (size_t)j] = side_files[j];
        }
    }
    for (size_t i = 0; i < nf; i++) {
        if (!path[i]) continue;
        if (k3_dl_find(dl, name[i])) kind[i] = 1;
        else if (dl->sums && i < ck->n_files) kind[i] = 2;
    }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (size_t i = 0; i < nf; i++)
        if (kind[i] == 1) k3_dl_hash_file(path[i], k3_dl_find(dl, name[i]), NULL, NULL, &res[i]);
    for (size_t i = 0; i < nf; i++) {
        if (!kind[i]) continue;
        k3v_item it;
        char label[300];
        snprintf(label, sizeof label, r->json ? "%s" : "%s (download)", name[i]);
        k3v_item_init(&it, "download", label);
        if (kind[i] == 2) {
            k3v_add(&it, K3V_MISSING, "no line for it in '%s': its download cannot be checked", dl->sums);
            n->download_bad++;
        } else if (res[i].code) {
            k3v_add(&it, res[i].code == K3_ERR_CORRUPT ? K3V_HASH : K3V_IO, "%s", res[i].msg);
            n->download_bad++;
            checked++;
        } else {
            const k3_dl_want *w = k3_dl_find(dl, name[i]);
            it.note = w->kind == K3_DL_SHA256 ? "SHA-256 as published" : "git blob SHA-1 as published";
            checked++;
        }
        k3v_report_item(r, &it);
        k3v_item_free(&it);
    }
out:
    free(path);
    free(name);
    free(res);
    free(kind);
    free(side);
    return checked;
}

static void summary(const char *path, const k3_st_ckpt *ck, const ck_counts *n, int config_ok, k3v_report *r)
{
    int code = k3v_exit_code(r);
    char *esc = k3v_esc(path, strlen(path));
    if (r->json) {
        k3v_json_begin(r, "summary");
        k3v_json_field_str(r, "status", code == 0 ? "ok" : code == K3_EXIT_DATA ? "failed" : "error");
        k3v_json_field_u64(r, "exit", (uint64_t)code);
        k3v_json_field_str(r, "mode", "checkpoint");
        k3v_json_field_str(r, "config", config_ok ? "ok" : "failed");
        k3v_json_field_u64(r, "files", ck ? ck->n_files : 0);
        k3v_json_field_u64(r, "tensors", ck ? ck->n_tensors : 0);
        k3v_json_field_u64(r, "expected", n->expected);
        k3v_json_field_u64(r, "missing", n->missing);
        k3v_json_field_u64(r, "mismatch", n->mismatch);
        k3v_json_field_u64(r, "unexpected", n->unexpected);
        k3v_json_field_u64(r, "skipped", n->skipped);
        k3v_json_field_u64(r, "download_checked", n->download_checked);
        k3v_json_field_u64(r, "download_failed", n->download_bad);
        k3v_json_end(r);
    }
    if (ck && !n->download_what && k3_log_level() >= K3_LOG_NORMAL)
        fprintf(stderr, "%s: the download itself was not checked: no --sha256 SUMS, and '%s' is not a Hugging Face "
                "cache snapshot (its files are not links to blobs named by their hashes)\n", k3_log_prog(), esc);
    else if (ck && k3_log_level() >= K3_LOG_NORMAL)
        fprintf(stderr, "%s: download: %zu files checked against %s, %zu failed\n", k3_log_prog(),
                n->download_checked, n->download_what, n->download_bad);
    if (code == 0) {
        if (k3_log_level() >= K3_LOG_NORMAL)
            fprintf(stderr, "%s: checkpoint '%s' matches its config: %zu tensors in %zu files (%zu vision tensors "
                    "skipped)\n", k3_log_prog(), esc, ck->n_tensors, ck->n_files, n->skipped);
    } else if (ck && config_ok) {
        fprintf(stderr, "%s: checkpoint '%s' FAILED: %zu missing, %zu wrong dtype or shape, %zu unexpected (of %zu "
                "expected tensors; %zu vision tensors skipped); %zu files not as published\n", k3_log_prog(), esc,
                n->missing, n->mismatch, n->unexpected, n->expected, n->skipped, n->download_bad);
    } else {
        fprintf(stderr, "%s: checkpoint '%s' FAILED\n", k3_log_prog(), esc);
    }
    free(esc);
}

int k3v_verify_checkpoint(const char *path, const char *sums, int threads, k3v_report *r)
{
    struct stat st;
    ck_counts n = {0};
    if (stat(path, &st) != 0) {
        char *esc = k3v_esc(path, strlen(path));
        k3_error("cannot open checkpoint '%s': %s", esc, strerror(errno));
        free(esc);
        return K3_EXIT_IO;
    }
    k3_st_ckpt ck;
    k3_diag d;
    k3_err e = k3_st_open(path, &ck, &d);
    if (e) {
        k3v_item it;
        k3v_item_init(&it, "checkpoint", path);
        if (e == K3_ERR_IO || e == K3_ERR_NOMEM) k3v_add(&it, K3V_IO, "%s", d.msg);
        else if (e == K3_ERR_NOT_FOUND) k3v_add(&it, K3V_MISSING, "%s", d.msg);
        else k3v_add(&it, K3V_FORMAT, "%s", d.msg);
        k3v_report_item(r, &it);
        k3v_item_free(&it);
        summary(path, NULL, &n, 0, r);
        return k3v_exit_code(r);
    }
    for (size_t i = 0; i < ck.n_warnings; i++) k3_warn("%s", ck.warnings[i]);
    k3_dl dl;
    char what[4400];
    if ((e = k3_dl_load(&dl, ck.dir, sums, &d))) {
        k3_error("%s", d.msg);
        k3_st_close(&ck);
        return e == K3_ERR_NOMEM || e == K3_ERR_IO ? K3_EXIT_IO : e == K3_ERR_NOT_FOUND ? K3_EXIT_USAGE : K3_EXIT_DATA;
    }
    n.download_what = k3_dl_what(&dl, what, sizeof what);
    for (size_t i = 0; i < ck.n_files; i++) {      /* each passed the strict reader */
        k3v_item it;
        k3v_item_init(&it, "file", ck.files[i].name);
        k3v_report_item(r, &it);
        k3v_item_free(&it);
    }
    k3_config cfg;
    k3_xlist xl = {0};
    k3v_item ci;
    k3v_item_init(&ci, "config", "config.json");
    int config_ok = 0;
    if (!ck.config_json) {
        k3v_add(&ci, K3V_MISSING, "missing: no config.json beside the checkpoint");
    } else if ((e = k3_config_parse(ck.config_json, ck.config_len, "config.json", &cfg, &d))) {
        k3v_add(&ci, e == K3_ERR_NOMEM ? K3V_IO : K3V_FORMAT, "%s", strip_subject(d.msg, "config.json"));
    } else if ((e = k3_expected_tensors(&cfg, &xl, &d))) {
        k3v_add(&ci, e == K3_ERR_NOMEM ? K3V_IO : K3V_FORMAT, "%s", strip_subject(d.msg, "config.json"));
    } else {
        config_ok = 1;
    }
    k3v_report_item(r, &ci);
    k3v_item_free(&ci);
    if (config_ok) {
        k3_ckpt_match m;
        n.expected = xl.n;
        e = k3_ckpt_match_config(&ck, &cfg, &xl, NULL, NULL, &m, &d);
        if (e == K3_ERR_NOMEM || e == K3_ERR_IO || e == K3_ERR_INTERNAL) {
            k3_error("%s", d.msg);
            k3_xlist_free(&xl);
            k3_st_close(&ck);
            return K3_EXIT_IO;
        }
        report_tensors(&ck, &cfg, &xl, &m, r, &n);
        k3_ckpt_match_free(&m);
        k3_xlist_free(&xl);
    }
    if (n.download_what) n.download_checked = check_download(&ck, &dl, threads, r, &n);
    k3_dl_free(&dl);
    summary(path, &ck, &n, config_ok, r);
    k3_st_close(&ck);
    return k3v_exit_code(r);
}

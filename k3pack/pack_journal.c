/*
 * pack_journal.c - the output directory's life cycle: preparing and locking
 * it, the journal of finished shards (resume after any interruption, even
 * SIGKILL), and finishing the pack (tokenizer copies, manifest.json last).
 *
 * Journal (.k3pack.journal, rewritten crash-safely after every shard):
 *   {"k3pack_journal": 1, "fingerprint": HEX, "config_fingerprint": HEX,
 *    "inputs": [{"name", "size", "mtime_ns", "header_xxh3_128"}],
 *    "done": [{"name", "size", "xxh3_128"}]}
 * config_fingerprint covers config.json, the expert handling and the format
 * version (pk_writer_init); fingerprint adds every input file (pk_set_inputs):
 * XXH3-128 of config_fingerprint's 32 hex digits, then per file in name order
 * its name, a NUL, size and mtime_ns as 8 bytes little-endian each, and the
 * 32 hex digits of the XXH3-128 of its safetensors header (8 + N bytes; all
 * zero for an archive file, whose size and mtime stand for it). A journal with
 * another fingerprint is refused, naming what changed, or discarded with
 * --force. From stdin nothing identifies the input: only config_fingerprint.
 */
#include "pack.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "k3_log.h"

static int is_pack_file(const char *n)
{
    size_t l = strlen(n);
    return (l > 4 && !strcmp(n + l - 4, ".k3s") && (!strncmp(n, "trunk-", 6) || !strncmp(n, "experts-", 8))) ||
           !strcmp(n, K3_MANIFEST_NAME) || !strcmp(n, "tiktoken.model") || !strcmp(n, "tokenizer_config.json") ||
           !strcmp(n, K3_GENCONFIG_NAME) ||
           !strcmp(n, PK_JOURNAL) || !strcmp(n, K3_CHECKPOINT_LINK) || !strcmp(n, PK_COPIED_NAME) ||
           k3_is_tmp_name(n);
}

/* Refuse a directory holding foreign files, or a finished pack without force.
   *finished tells whether manifest.json is there. */
static k3_err check_output(const char *out, int force, int *finished, k3_diag *d)
{
    DIR *dh = opendir(out);
    if (!dh) return k3_fail(d, K3_ERR_IO, "cannot list '%s': %s", out, strerror(errno));
    int foreign = 0;
    char first_foreign[256] = "";
    struct dirent *de;
    *finished = 0;
    while ((de = readdir(dh))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        if (!strcmp(de->d_name, K3_MANIFEST_NAME)) *finished = 1;
        if (!is_pack_file(de->d_name) && !foreign++)
            k3_escape(de->d_name, strlen(de->d_name), first_foreign, sizeof first_foreign);
    }
    closedir(dh);
    if (foreign)
        return k3_fail(d, K3_ERR_USAGE, "'%s' is not empty and not a k3pack output (it holds '%s'); "
                       "choose a new or empty directory", out, first_foreign);
    if (*finished && !force)
        return k3_fail(d, K3_ERR_USAGE, "'%s' already holds a finished pack; use --force to replace it", out);
    return K3_OK;
}

static int has_journal(const char *out)
{
    char p[4096];
    struct stat st;
    return k3_path_join(p, sizeof p, out, PK_JOURNAL, NULL) == K3_OK && lstat(p, &st) == 0;
}

volatile sig_atomic_t pk_interrupted;

k3_err pk_check_interrupt(k3_diag *d)
{
    int sig = pk_interrupted;
    return sig ? k3_fail(d, K3_ERR_IO, "interrupted by %s", sig == SIGINT ? "SIGINT" : "SIGTERM") : K3_OK;
}

k3_err pk_prepare_output(const char *out, int force, int *lock_fd, int *finished_journal, k3_diag *d)
{
    struct stat st;
    int finished = 0;
    k3_err e;
    *finished_journal = 0;
    /* a finished pack with its journal still there is judged by the caller (pk_finished_journal) */
    int fj = !force && has_journal(out);
    if (stat(out, &st) != 0) {
        if (errno != ENOENT) return k3_fail(d, K3_ERR_IO, "cannot access '%s': %s", out, strerror(errno));
        if (mkdir(out, 0755) != 0)
            return k3_fail(d, errno == ENOSPC ? K3_ERR_NOSPACE : K3_ERR_IO, "cannot create '%s': %s", out,
                           strerror(errno));
    } else if (!S_ISDIR(st.st_mode)) {
        return k3_fail(d, K3_ERR_USAGE, "'%s' exists and is not a directory", out);
    } else if ((e = check_output(out, force || fj, &finished, d))) {
        return e;
    }
    if ((e = k3_lock_dir(out, lock_fd, d))) return e;
    /* again under the lock: the authoritative check */
    fj = !force && has_journal(out);
    if ((e = check_output(out, force || fj, &finished, d))) {
        close(*lock_fd);
        *lock_fd = -1;
        return e;
    }
    if (finished && fj) {
        *finished_journal = 1;
        return K3_OK;
    }
    if (finished) {
        /* --force: the pack becomes unfinished first, then every file of it goes */
        char p[4096];
        DIR *dh;
        struct dirent *de;
        if ((e = k3_path_join(p, sizeof p, out, K3_MANIFEST_NAME, d))) return e;
        if (unlink(p) != 0) return k3_fail(d, K3_ERR_IO, "cannot remove '%s': %s", p, strerror(errno));
        if ((e = k3_fsync_dir(out, d))) return e;
        dh = opendir(out);
        while (dh && (de = readdir(dh)))
            if (is_pack_file(de->d_name) && de->d_name[0] != '.' &&
                k3_path_join(p, sizeof p, out, de->d_name, NULL) == K3_OK)
                unlink(p);
        if (dh) closedir(dh);
        if ((e = k3_path_join(p, sizeof p, out, PK_JOURNAL, d))) return e;
        unlink(p);
    }
    int n = k3_remove_stale_tmp(out);
    if (n) k3_info("removed %d temporary file%s left by an interrupted run", n, n == 1 ? "" : "s");
    return K3_OK;
}

k3_err pk_journal_write(pk_writer *w, k3_diag *d)
{
    json_t *root = json_object(), *done = json_array();
    json_object_set_new(root, "k3pack_journal", json_integer(1));
    json_object_set_new(root, "fingerprint", json_string(w->fingerprint));
    json_object_set_new(root, "config_fingerprint", json_string(w->config_fp));
    json_t *inputs = json_array();
    for (size_t i = 0; i < w->n_inputs; i++) {
        char hex[33];
        k3_hex128(w->inputs[i].header, hex);
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(w->inputs[i].name));
        json_object_set_new(o, "size", json_integer((json_int_t)w->inputs[i].size));
        json_object_set_new(o, "mtime_ns", json_integer((json_int_t)w->inputs[i].mtime_ns));
        json_object_set_new(o, "header_xxh3_128", json_string(hex));
        json_array_append_new(inputs, o);
    }
    json_object_set_new(root, "inputs", inputs);
    for (uint32_t s = 0; s < w->p->n_shards; s++) {
        if (!w->done[s]) continue;
        char hex[33];
        k3_hex128(w->hashes[s].file, hex);
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(w->p->shards[s].name));
        json_object_set_new(o, "size", json_integer((json_int_t)w->p->shards[s].h.file_size));
        json_object_set_new(o, "xxh3_128", json_string(hex));
        json_array_append_new(done, o);
    }
    json_object_set_new(root, "done", done);
    char *text = json_dumps(root, JSON_INDENT(1));
    json_decref(root);
    if (!text) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    k3_err e = k3_atomic_write_file(w->out_dir, PK_JOURNAL, text, strlen(text), d);
    free(text);
    return e;
}

/* Does the shard file on disk hold exactly the planned header, and the hash
   the journal recorded? On success its hashes are in w->hashes[s]. */
static int take_over(pk_writer *w, uint32_t s, const k3_h128 *want)
{
    const pk_shard *sh = &w->p->shards[s];
    char path[4096];
    if (k3_path_join(path, sizeof path, w->out_dir, sh->name, NULL)) return 0;
    int fd = k3_open_read(path);            /* never blocks on a FIFO planted under a shard's name */
    if (fd < 0) return 0;
    int ok = 0;
    uint8_t *img = NULL, *disk = NULL;
    size_t len;
    k3_diag d;
    struct stat st;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size == sh->h.file_size &&
        k3_shard_encode((k3_shard_header *)&sh->h, &img, &len, &d) == K3_OK && (disk = malloc(len)) &&
        k3_pread_full(fd, disk, len, 0, path, &d) == K3_OK && !memcmp(img, disk, len) &&
        k3_shard_hash(fd, path, &sh->h, 8u << 20, 1, NULL, NULL, &w->hashes[s], &d) == K3_OK) {
        ok = w->hashes[s].file.lo == want->lo && w->hashes[s].file.hi == want->hi &&
             w->hashes[s].bad_padding == UINT64_MAX;
        if (!ok) k3_shard_hashes_free(&w->hashes[s]);
    }
    free(img);
    free(disk);
    close(fd);
    return ok;
}

void pk_set_inputs(pk_writer *w, const pk_input *in, size_t n)
{
    memcpy(w->config_fp, w->fingerprint, sizeof w->config_fp);
    w->inputs = in;
    w->n_inputs = n;
    if (!n) return;
    k3_hasher *h = k3_hasher_new();
    if (!h) return;            /* out of memory: the config fingerprint alone (the journal check stays) */
    k3_hasher_update(h, w->config_fp, 32);
    for (size_t i = 0; i < n; i++) {
        uint8_t num[16];
        char hex[33];
        for (int b = 0; b < 8; b++) {
            num[b] = (uint8_t)(in[i].size >> (8 * b));
            num[8 + b] = (uint8_t)((uint64_t)in[i].mtime_ns >> (8 * b));
        }
        k3_hasher_update(h, in[i].name, strlen(in[i].name) + 1);
        k3_hasher_update(h, num, sizeof num);
        k3_hex128(in[i].header, hex);
        k3_hasher_update(h, hex, 32);
    }
    k3_hex128(k3_hasher_digest(h), w->fingerprint);
    k3_hasher_free(h);
}

/* What differs between the journal's inputs and ours, for the refusal. */
static void describe_change(const pk_writer *w, json_t *root, char *out, size_t cap)
{
    const char *cfp = json_string_value(json_object_get(root, "config_fingerprint"));
    json_t *inputs = json_object_get(root, "inputs");
    char esc[300];
    if (!cfp || !json_is_array(inputs)) {
        snprintf(out, cap, "it was started by an older k3pack that did not record its input files");
        return;
    }
    if (strcmp(cfp, w->config_fp)) {
        snprintf(out, cap, "it was made from another config.json or with other --experts");
        return;
    }
    if (!w->inputs) {
        snprintf(out, cap, "it was made from input files, and stdin cannot be compared with them");
        return;
    }
    size_t i;
    json_t *o;
    json_array_foreach(inputs, i, o) {
        const char *name = json_string_value(json_object_get(o, "name"));
        if (!name) break;
        const pk_input *now = NULL;
        for (size_t k = 0; k < w->n_inputs && !now; k++)
            if (!strcmp(w->inputs[k].name, name)) now = &w->inputs[k];
        k3_escape(name, strlen(name), esc, sizeof esc);
        if (!now) {
            snprintf(out, cap, "'%s' was part of its input and is not now", esc);
            return;
        }
        char hex[33];
        k3_hex128(now->header, hex);
        const char *hh = json_string_value(json_object_get(o, "header_xxh3_128"));
        if ((uint64_t)json_integer_value(json_object_get(o, "size")) != now->size) {
            snprintf(out, cap, "'%s' was %lld bytes then and is %llu now", esc,
                     (long long)json_integer_value(json_object_get(o, "size")), (unsigned long long)now->size);
            return;
        }
        if (!hh || strcmp(hh, hex)) {
            snprintf(out, cap, "the safetensors header of '%s' has changed", esc);
            return;
        }
        if (json_integer_value(json_object_get(o, "mtime_ns")) != now->mtime_ns) {
            snprintf(out, cap, "'%s' has been modified since (its modification time changed)", esc);
            return;
        }
    }
    for (size_t k = 0; k < w->n_inputs; k++) {
        int found = 0;
        json_array_foreach(inputs, i, o) {
            const char *name = json_string_value(json_object_get(o, "name"));
            if (name && !strcmp(name, w->inputs[k].name)) found = 1;
        }
        if (!found) {
            snprintf(out, cap, "'%s' was not part of its input",
                     k3_escape(w->inputs[k].name, strlen(w->inputs[k].name), esc, sizeof esc));
            return;
        }
    }
    snprintf(out, cap, "its input files differ");
}

/* Drop the journal of another input (--force): its shards are rewritten,
   and pack-named files this plan does not hold are removed at the end. */
static k3_err discard_journal(pk_writer *w, const char *path, const char *why, k3_diag *d)
{
    k3_warn("discarding the unfinished pack in '%s' (%s); starting over", w->out_dir, why);
    if (unlink(path) != 0 && errno != ENOENT)
        return k3_fail(d, K3_ERR_IO, "cannot remove '%s': %s", path, strerror(errno));
    return k3_fsync_dir(w->out_dir, d);
}

k3_err pk_finished_journal(pk_writer *w, k3_diag *d)
{
    char path[4096], *text;
    size_t len;
    k3_err e = k3_path_join(path, sizeof path, w->out_dir, PK_JOURNAL, d);
    if (!e) e = k3_read_file(path, 64u << 20, &text, &len, d);
    if (e) return e;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    const char *fp = json_string_value(json_object_get(root, "fingerprint"));
    int same = fp && !strcmp(fp, w->fingerprint);
    json_decref(root);
    if (!same)
        return k3_fail(d, K3_ERR_USAGE, "'%s' already holds a finished pack; use --force to replace it", w->out_dir);
    if (unlink(path) != 0) return k3_fail(d, K3_ERR_IO, "cannot remove '%s': %s", path, strerror(errno));
    return k3_fsync_dir(w->out_dir, d);
}

k3_err pk_resume(pk_writer *w, int force, k3_diag *d)
{
    char path[4096], *text;
    size_t len;
    k3_err e = k3_path_join(path, sizeof path, w->out_dir, PK_JOURNAL, d);
    if (e) return e;
    e = k3_read_file(path, 64u << 20, &text, &len, d);
    if (e == K3_ERR_NOT_FOUND) return K3_OK;
    if (e) return e;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    json_t *fp = json_object_get(root, "fingerprint"), *done = json_object_get(root, "done");
    if (!root || !json_is_string(fp) || !json_is_array(done)) {
        json_decref(root);
        k3_warn("ignoring the damaged journal '%s'; starting over", path);
        return K3_OK;
    }
    if (strcmp(json_string_value(fp), w->fingerprint)) {
        char why[600];
        describe_change(w, root, why, sizeof why);
        json_decref(root);
        if (force) return discard_journal(w, path, why, d);
        return k3_fail(d, K3_ERR_USAGE, "'%s' holds an unfinished pack of another input: %s. Rerun with --force "
                       "to discard it and start over, or choose another output directory", w->out_dir, why);
    }
    size_t i;
    json_t *o;
    int n = 0;
    json_array_foreach(done, i, o) {
        const char *name = json_string_value(json_object_get(o, "name"));
        k3_h128 h;
        if (!name || k3_parse_hex128(json_string_value(json_object_get(o, "xxh3_128")), &h)) continue;
        for (uint32_t s = 0; s < w->p->n_shards; s++) {
            if (strcmp(name, w->p->shards[s].name)) continue;
            /* listed twice: taking it over again would replace (or free) its hashes */
            if (w->done[s]) break;
            if (take_over(w, s, &h)) {
                w->done[s] = w->resumed[s] = 1;
                w->remaining[s] = 0;
                w->shards_done++;
                for (size_t k = 0; k < w->p->shards[s].n_items; k++)
                    w->bytes_done += w->p->items[w->p->shards[s].first_item + k].src_bytes;
                n++;
            } else {
                k3_warn("shard '%s' from the interrupted run does not match its journal entry; writing it again", name);
            }
        }
    }
    json_decref(root);
    if (n) k3_info("resuming: %d of %u shards already done", n, w->p->n_shards);
    return K3_OK;
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Remove pack-named files this pack does not hold (shards of an earlier run of
   another plan, a tokenizer this checkpoint lacks): nothing else belongs to a
   pack (FORMAT.md section 1). Called before manifest.json is written. */
static k3_err remove_unlisted(pk_writer *w, const char *const *tok_names, int n_tok, k3_diag *d)
{
    DIR *dh = opendir(w->out_dir);
    if (!dh) return k3_fail(d, K3_ERR_IO, "cannot list '%s': %s", w->out_dir, strerror(errno));
    struct dirent *de;
    k3_err e = K3_OK;
    while (!e && (de = readdir(dh))) {
        const char *n = de->d_name;
        if (n[0] == '.' || !is_pack_file(n) || !strcmp(n, K3_MANIFEST_NAME)) continue;
        int ours = (!strcmp(n, K3_CHECKPOINT_LINK) && w->p->n_in_place) ||   /* made after this */
                   (!strcmp(n, PK_COPIED_NAME) && w->p->n_copied);
        for (uint32_t s = 0; !ours && s < w->p->n_shards; s++)
            ours = !strcmp(n, w->p->shards[s].name) && !(w->p->in_place && w->p->in_place[s]);
        for (int i = 0; !ours && i < n_tok; i++) ours = !strcmp(n, tok_names[i]);
        if (ours) continue;
        char p[4096];
        if ((e = k3_path_join(p, sizeof p, w->out_dir, n, d))) break;
        if (unlink(p) != 0 && errno != ENOENT) e = k3_fail(d, K3_ERR_IO, "cannot remove '%s': %s", p, strerror(errno));
        else k3_info("removed '%s', left by an earlier run: it is not part of this pack", n);
    }
    closedir(dh);
    return e;
}

/* An in-place pack's link to the checkpoint (FORMAT.md 10): made under a temporary name and
   renamed over whatever `checkpoint` an earlier run left. */
static k3_err make_link(pk_writer *w, k3_diag *d)
{
    char tmp[4096], dst[4096], name[64];
    snprintf(name, sizeof name, "." K3_CHECKPOINT_LINK ".k3tmp-%ld", (long)getpid());
    k3_err e = k3_path_join(tmp, sizeof tmp, w->out_dir, name, d);
    if (!e) e = k3_path_join(dst, sizeof dst, w->out_dir, K3_CHECKPOINT_LINK, d);
    if (e) return e;
    unlink(tmp);
    if (symlink(w->p->ckpt_dir, tmp) != 0)
        return k3_fail(d, K3_ERR_IO, "cannot make the link '%s' -> '%s': %s", dst, w->p->ckpt_dir, strerror(errno));
    if (rename(tmp, dst) != 0) {
        e = k3_fail(d, K3_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, dst, strerror(errno));
        unlink(tmp);
        return e;
    }
    return k3_fsync_dir(w->out_dir, d);
}

static int cmp_src(const void *a, const void *b)
{
    return strcmp(((const k3_mf_srcfile *)a)->name, ((const k3_mf_srcfile *)b)->name);
}

k3_err pk_finish_pack(pk_writer *w, const char *const *tok_names, char *const *tok_data,
                      const size_t *tok_len, int n_tok, char *const *skipped, size_t n_skipped,
                      k3_diag *d)
{
    const pk_plan *p = w->p;
    k3_manifest m;
    memset(&m, 0, sizeof m);
    k3_err e = K3_OK;
    json_error_t je;
    m.format_version = p->n_in_place || p->trunk_q8 ? 3 : K3_PACK_VERSION;   /* FORMAT.md 6: 3 only when needed */
    m.trunk_q8 = p->trunk_q8;
    m.generator = "k3pack " K3_VERSION;
    m.name_prefix = (char *)k3_config_prefix(&p->cfg);
    m.config = json_loadb(p->config_text, p->config_len, JSON_REJECT_DUPLICATES, &je);
    if (!m.config) return k3_fail(d, K3_ERR_FORMAT, "config.json: %s", je.text);
    m.experts_encoding = p->cfg.num_experts ? (p->experts == PK_EXPERTS_MXFP4 ? K3_ENC_MXFP4 : K3_ENC_BF16) : 0;
    m.experts_quantized = p->quantize;
    m.quant_rule = p->quantize ? "ocp-floor-rne-sat" : NULL;
    m.n_files = (uint32_t)n_tok;
    m.files = calloc((size_t)n_tok + 1, sizeof *m.files);
    m.shards = calloc(p->n_shards, sizeof *m.shards);           /* [shards written] */
    uint32_t *src_of = calloc(w->n_inputs + 1, sizeof *src_of); /* [n_inputs] checkpoint file -> source */
    /* m.tensors and m.expert_layers grow in k3_manifest_describe_shard */
    m.skipped = calloc(n_skipped + 1, sizeof *m.skipped);
    /* skipped names sorted: the order the source met them in depends on its file
       layout (and an archive's entry order), the manifest must not */
    char **sk_sorted = malloc((n_skipped + 1) * sizeof *sk_sorted);   /* [n_skipped] */
    if (sk_sorted) {
        memcpy(sk_sorted, skipped, n_skipped * sizeof *sk_sorted);
        qsort(sk_sorted, n_skipped, sizeof *sk_sorted, cmp_name);
    }
    if (!m.files || !m.shards || !m.skipped || !sk_sorted || !src_of) {
        e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n_tok; i++) {
        if ((e = k3_atomic_write_file(w->out_dir, tok_names[i], tok_data[i], tok_len[i], d))) goto out;
        m.files[i].name = (char *)tok_names[i];
        m.files[i].size = tok_len[i];
        m.files[i].hash = k3_xxh3_128(tok_data[i], tok_len[i]);
    }
    if (p->n_in_place && (e = pk_manifest_sources(w, &m, src_of, d))) goto out;
    for (uint32_t s = 0; s < p->n_shards; s++) {
        const pk_shard *sh = &p->shards[s];
        const k3_shard_header *h = &sh->h;
        if (p->in_place && p->in_place[s]) {                    /* FORMAT.md 10: no shard file */
            if ((e = pk_manifest_in_place(w, &m, s, src_of, d))) goto out;
            continue;
        }
        uint32_t ms = m.n_shards++;
        m.shards[ms] = (k3_mf_shard){(char *)sh->name, h->kind, sh->layer, h->file_size, 0, w->hashes[s].file};
        uint8_t *img;
        size_t len;
        if ((e = k3_shard_encode((k3_shard_header *)h, &img, &len, d))) goto out;
        free(img);
        m.shards[ms].header_hash = h->header_hash;
        if ((e = k3_manifest_describe_shard(&m, ms, h, w->hashes[s].entry, w->hashes[s].record, d))) goto out;
    }
    for (size_t i = 0; i < n_skipped; i++) {
        m.skipped[i].name = sk_sorted[i];
        m.skipped[i].reason = "vision";
    }
    m.n_skipped = (uint32_t)n_skipped;
    if (w->streamed) {                           /* every file's SHA-256, in name order */
        qsort(w->src_files, w->n_src_files, sizeof *w->src_files, cmp_src);
        m.have_download = 1;
        m.src_files = w->src_files;
        m.n_src_files = w->n_src_files;
        m.download_checked = (char *)w->download_checked;
    }
    char *text;
    size_t len;
    if ((e = remove_unlisted(w, tok_names, n_tok, d))) goto out;
    if (p->n_in_place && (e = make_link(w, d))) goto out;
    if ((e = k3_manifest_dump(&m, &text, &len, d))) goto out;
    e = k3_atomic_write_file(w->out_dir, K3_MANIFEST_NAME, text, len, d);
    free(text);
    if (!e) {
        char jp[4096];
        if (k3_path_join(jp, sizeof jp, w->out_dir, PK_JOURNAL, NULL) == K3_OK && unlink(jp) == 0)
            e = k3_fsync_dir(w->out_dir, d);     /* a finished pack must not come back with its journal */
    }
out:
    for (uint32_t i = 0; i < m.n_tensors; i++) free(m.tensors[i].name);
    for (uint32_t i = 0; i < m.n_expert_layers; i++) {
        for (uint32_t k = 0; k < m.expert_layers[i].n_parts; k++) free(m.expert_layers[i].parts[k].name);
        free(m.expert_layers[i].rec_file);         /* rec_off and hashes are the plan's and the writer's */
    }
    free(m.sources);                               /* its names are the inputs' */
    free(src_of);
    json_decref(m.config);
    free(m.files);
    free(m.shards);
    free(m.tensors);
    free(m.expert_layers);
    free(m.skipped);
    free(sk_sorted);
    return e;
}

void pk_writer_discard(pk_writer *w)
{
    char path[4096];
    for (uint32_t s = 0; s < w->p->n_shards; s++) {
        if (!w->done[s] || (w->p->in_place && w->p->in_place[s])) continue;
        if (k3_path_join(path, sizeof path, w->out_dir, w->p->shards[s].name, NULL) == K3_OK) unlink(path);
        w->done[s] = 0;
    }
    if (k3_path_join(path, sizeof path, w->out_dir, PK_JOURNAL, NULL) == K3_OK) unlink(path);
    k3_diag d;
    k3_fsync_dir(w->out_dir, &d);
}

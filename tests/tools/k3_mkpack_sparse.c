/*
 * k3_mkpack_sparse - write the k3 pack (docs/FORMAT.md) that k3pack would make
 * from a checkpoint with a config's tensors, with every tensor and expert
 * record made of zero bytes, as sparse files: a full-size Kimi K3 pack
 * (1.56 TB apparent) costs a few MB of disk and about ten seconds.
 *
 *   k3_mkpack_sparse CONFIG.json TOKENIZER_DIR OUT_DIR
 *
 * The plan is k3pack's own: pk_plan_build() from k3pack/pack_plan.c is compiled
 * into this tool, so shard names, kinds, headers, entry order, alignment and
 * the expert record layout are k3pack's by construction. The manifest is built
 * as pk_finish_pack() builds it (k3_manifest_describe_shard, k3_manifest_dump;
 * config verbatim, no skipped tensors); only `generator` differs.
 *
 * Each shard: header (k3_shard_encode) written at 0, then ftruncate to
 * file_size, so the data are holes that read as zeros. Hashes are the true
 * ones, so a full k3verify accepts the pack:
 *   - tensor / record XXH3-64: of size zero bytes, streamed from a zero buffer,
 *     once per distinct size;
 *   - shard XXH3-128 of header + zeros without touching the zeros: XXH3 (inputs
 *     > 240 B) runs 8 accumulator lanes over 1024-byte blocks; on a block of
 *     zeros each lane gets a constant added (its secret words' 32x32 products)
 *     and is scrambled, with no data and no mixing between lanes, so a block
 *     of zeros costs 8 add/xorshift/xor/mul steps instead of reading 1 KiB.
 *     Blocks holding header bytes, the last partial block and the last stripe
 *     go through libxxhash's own accumulate (xxhash.h, XXH_INLINE_ALL). The
 *     shortcut is checked against XXH3_128bits() on real buffers at startup.
 *
 * --experts-in-place CKPT_DIR: the version-3 pack k3pack --experts-in-place makes
 * (FORMAT.md 10), with the checkpoint it would read: CKPT_DIR gets one sparse
 * .safetensors file per MoE layer holding its routed experts' tensors under their
 * checkpoint names, sorted by name as the safetensors library writes them (so an
 * expert's six tensors are adjacent: w1, w2, w3), and the pack links to it.
 *
 * --trunk q8: the compact trunk's layout (FORMAT.md 3.1, as k3pack --trunk q8): its
 * quantized matrices as Q8 codes with their NAME_scale tensors (zero codes and
 * scale code 0, i.e. zero weights), for the plan and the bytes of a q8 K3.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "k3_error.h"
#include "k3_file.h"
#include "k3_hash.h"
#include "k3_log.h"
#include "k3_manifest.h"
#include "k3_opts.h"
#include "k3_sys.h"
#include "pack.h"

#define GENERATOR "k3_mkpack_sparse " K3_VERSION " (sparse test pack: every tensor and record is zero bytes)"
#define ZBUF (1u << 20)
#define XB 1024u                    /* XXH3 block: 16 stripes of 64 B with the default 192 B secret */

static const uint8_t g_zero[ZBUF];  /* [ZBUF] zeros */

/* ------------------------------------------------- XXH3-128 of head + zeros */

/* dst[0..n) = bytes [pos, pos + n) of the stream head[0..hlen) followed by zeros */
static void fill(uint8_t *dst, const uint8_t *head, uint64_t hlen, uint64_t pos, size_t n)
{
    size_t h = pos >= hlen ? 0 : (size_t)(hlen - pos < n ? hlen - pos : n);
    if (h) memcpy(dst, head + pos, h);
    memset(dst + h, 0, n - h);
}

/*
 * n blocks of zeros: accumulate() adds zadd[i] to lane i (the data are zero, so
 * nothing crosses lanes), then XXH3_scrambleAcc_scalar(). Scalar on purpose:
 * 8 independent imul chains beat gcc's SSE2 form (multiply by shifts and adds).
 */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-vectorize")))       /* clang's loop vectorizer keeps the chains apart */
#endif
static void zero_blocks(xxh_u64 *acc, const xxh_u64 *zadd, const uint8_t *key, uint64_t n)
{
    uint64_t a[XXH_ACC_NB], k[XXH_ACC_NB];              /* [8] lanes, scramble keys */
    for (size_t i = 0; i < XXH_ACC_NB; i++) {
        a[i] = acc[i];
        k[i] = XXH_readLE64(key + 8 * i);
    }
    for (; n; n--)
#pragma GCC unroll 8
        for (size_t i = 0; i < XXH_ACC_NB; i++) {       /* unrolled: the 8 lanes stay in registers */
            uint64_t x = a[i] + zadd[i];
            a[i] = (x ^ (x >> 47) ^ k[i]) * XXH_PRIME32_1;
        }
    for (size_t i = 0; i < XXH_ACC_NB; i++) acc[i] = a[i];
}

/* XXH3_128bits() of head[0..hlen) followed by (total - hlen) zero bytes; total >= hlen */
static k3_h128 h128_head_zeros(const uint8_t *head, uint64_t hlen, uint64_t total)
{
    const uint8_t *sec = XXH3_kSecret;
    const size_t ssz = sizeof XXH3_kSecret, nstripes = (ssz - XXH_STRIPE_LEN) / XXH_SECRET_CONSUME_RATE;
    XXH_ALIGN(64) uint8_t blk[XB];  /* [XB] one block of the stream */
    if (total <= XXH3_MIDSIZE_MAX) {
        fill(blk, head, hlen, 0, (size_t)total);
        XXH128_hash_t r = XXH3_128bits(blk, (size_t)total);
        return (k3_h128){r.low64, r.high64};
    }
    XXH_ALIGN(64) xxh_u64 acc[XXH_ACC_NB] = XXH3_INIT_ACC, zadd[XXH_ACC_NB] = {0};
    for (size_t s = 0; s < nstripes; s++)               /* what a block of zeros adds to each lane */
        XXH3_accumulate_512_scalar(zadd, g_zero, sec + s * XXH_SECRET_CONSUME_RATE);
    uint64_t nb = (total - 1) / XB, n = 0;
    for (; n < nb && n * XB < hlen; n++) {             /* blocks holding header bytes */
        fill(blk, head, hlen, n * XB, XB);
        for (size_t s = 0; s < nstripes; s++)
            XXH3_accumulate_512_scalar(acc, blk + s * XXH_STRIPE_LEN, sec + s * XXH_SECRET_CONSUME_RATE);
        XXH3_scrambleAcc_scalar(acc, sec + ssz - XXH_STRIPE_LEN);
    }
    if (n < nb) zero_blocks(acc, zadd, sec + ssz - XXH_STRIPE_LEN, nb - n);
    size_t last = (size_t)((total - 1 - nb * XB) / XXH_STRIPE_LEN);
    fill(blk, head, hlen, nb * XB, last * XXH_STRIPE_LEN);
    for (size_t s = 0; s < last; s++)
        XXH3_accumulate_512_scalar(acc, blk + s * XXH_STRIPE_LEN, sec + s * XXH_SECRET_CONSUME_RATE);
    fill(blk, head, hlen, total - XXH_STRIPE_LEN, XXH_STRIPE_LEN);
    XXH3_accumulate_512_scalar(acc, blk, sec + ssz - XXH_STRIPE_LEN - XXH_SECRET_LASTACC_START);
    k3_h128 r;
    r.lo = XXH3_mergeAccs(acc, sec + XXH_SECRET_MERGEACCS_START, total * XXH_PRIME64_1);
    r.hi = XXH3_mergeAccs(acc, sec + ssz - sizeof acc - XXH_SECRET_MERGEACCS_START, ~(total * XXH_PRIME64_2));
    return r;
}

/* The shortcut against the library (k3_xxh3_128, k3common) on materialised buffers. */
static k3_err self_check(k3_diag *d)
{
    static const uint32_t hl[] = {0, 7, 240, 1000, 1024, 4096, 9000};
    static const uint32_t zl[] = {0, 1, 63, 64, 65, 1023, 1024, 1025, 3000, 4096, 70000};
    enum { CAP = 9000 + 70000 };
    uint8_t *buf = malloc(CAP);                         /* [CAP] header + zeros */
    if (!buf) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (size_t a = 0; a < sizeof hl / sizeof hl[0]; a++)
        for (size_t b = 0; b < sizeof zl / sizeof zl[0]; b++) {
            uint64_t n = (uint64_t)hl[a] + zl[b];
            for (uint32_t i = 0; i < hl[a]; i++) buf[i] = (uint8_t)(i * 131u + 7u + (i >> 8));
            memset(buf + hl[a], 0, zl[b]);
            k3_h128 want = k3_xxh3_128(buf, (size_t)n), got = h128_head_zeros(buf, hl[a], n);
            if (want.lo != got.lo || want.hi != got.hi) {
                free(buf);
                return k3_fail(d, K3_ERR_INTERNAL, "XXH3-128 shortcut differs from libxxhash for %u header "
                               "bytes + %u zeros", hl[a], zl[b]);
            }
        }
    free(buf);
    return K3_OK;
}

/* ------------------------------------------------ XXH3-64 of zeros, by size */

typedef struct zcache {
    uint64_t *size, *hash;          /* [n] distinct sizes met and their XXH3-64 */
    size_t n, cap;
    k3_hasher64 *h;
} zcache;

static k3_err zero_hash64(zcache *c, uint64_t size, uint64_t *out, k3_diag *d)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->size[i] == size) { *out = c->hash[i]; return K3_OK; }
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 64;
        uint64_t *s = realloc(c->size, cap * sizeof *s), *h = s ? realloc(c->hash, cap * sizeof *h) : NULL;
        if (s) c->size = s;
        if (!s || !h) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
        c->hash = h;
        c->cap = cap;
    }
    k3_hasher64_reset(c->h);
    for (uint64_t done = 0; done < size;) {
        size_t n = size - done < ZBUF ? (size_t)(size - done) : ZBUF;
        k3_hasher64_update(c->h, g_zero, n);
        done += n;
    }
    c->size[c->n] = size;
    *out = c->hash[c->n++] = k3_hasher64_digest(c->h);
    return K3_OK;
}

/* ----------------------------------------------------------------- output */

/* A new directory, or an empty one: nothing of anybody's is overwritten. */
static k3_err prepare_dir(const char *dir, k3_diag *d)
{
    if (mkdir(dir, 0755) == 0) return K3_OK;
    if (errno != EEXIST) return k3_fail(d, K3_ERR_IO, "cannot create '%s': %s", dir, strerror(errno));
    DIR *dh = opendir(dir);
    if (!dh) return k3_fail(d, K3_ERR_USAGE, "'%s' exists and cannot be listed as a directory: %s", dir, strerror(errno));
    struct dirent *de;
    int n = 0;
    while ((de = readdir(dh)))
        n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(dh);
    return n ? k3_fail(d, K3_ERR_USAGE, "'%s' is not empty; give a new or empty directory", dir) : K3_OK;
}

/* Header at offset 0, then sized to file_size: the data region is a hole. */
static k3_err write_shard(const char *dir, pk_shard *sh, const uint8_t *img, size_t len, k3_diag *d)
{
    char path[4096];
    k3_err e = k3_path_join(path, sizeof path, dir, sh->name, d);
    if (e) return e;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return k3_fail(d, K3_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
    if (ftruncate(fd, (off_t)sh->h.file_size) != 0)
        e = k3_fail(d, errno == EFBIG || errno == ENOSPC ? K3_ERR_NOSPACE : K3_ERR_IO,
                    "cannot size '%s' to %" PRIu64 " bytes: %s", path, sh->h.file_size, strerror(errno));
    if (!e) e = k3_pwrite_full(fd, img, len, 0, path, d);
    if (close(fd) != 0 && !e) e = k3_fail(d, K3_ERR_IO, "cannot close '%s': %s", path, strerror(errno));
    return e;
}

/* ------------------------------------------------- --experts-in-place */

enum { O_IN_PLACE = K3_OPT_USER, O_TRUNK };
static const k3_opt opts[] = {
    {O_TRUNK, 0, "trunk", "exact|q8", NULL, NULL,
     "q8: the compact trunk's tensors (Q8 codes and their E8M0 scales, format 3, as k3pack --trunk q8)"},
    {O_IN_PLACE, 0, "experts-in-place", "CKPT_DIR", NULL, NULL,
     "also write a sparse checkpoint of the routed experts into CKPT_DIR (new or empty) and make the pack read "
     "them there (format 3, as k3pack --experts-in-place)"},
    K3_OPTS_COMMON,
};

typedef struct ip_tensor {
    char name[160];
    uint32_t part;                  /* shard entry index */
    uint64_t expert;
} ip_tensor;

static int cmp_ip(const void *a, const void *b) { return strcmp(((const ip_tensor *)a)->name, ((const ip_tensor *)b)->name); }

/* Layer sh's routed experts as one sparse safetensors file in ckpt (file `fname`), sorted by
   name; x (the manifest's layer) gets the records' offsets, parts in their offset order and
   zero hashes; src gets the file's size and header. */
static k3_err in_place_layer(const char *ckpt, const char *fname, const char *prefix, const pk_shard *sh,
                             uint32_t file_index, zcache *zc, k3_mf_experts *x, k3_mf_source *src, k3_diag *d)
{
    const k3_shard_header *h = &sh->h;
    uint64_t n = h->n_records * h->n_entries;
    ip_tensor *t = calloc(n + 1, sizeof *t);                        /* [n_records * n_entries] */
    uint64_t *rel = calloc(h->n_entries + 1, sizeof *rel);           /* [n_entries] offset in the record */
    if (!t || !rel) { free(t); free(rel); return k3_fail(d, K3_ERR_NOMEM, "out of memory"); }
    for (uint64_t e = 0, i = 0; e < h->n_records; e++)
        for (uint32_t p = 0; p < h->n_entries; p++, i++) {
            snprintf(t[i].name, sizeof t[i].name, "%smodel.layers.%" PRId64 ".block_sparse_moe.experts.%" PRIu64 ".%.*s",
                     prefix, sh->layer, e, (int)h->entries[p].name_len, h->entries[p].name);
            t[i].part = p;
            t[i].expert = e;
        }
    qsort(t, n, sizeof *t, cmp_ip);
    json_t *root = json_object(), *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(root, "__metadata__", meta);
    uint64_t at = 0, rec_size = 0;
    x->rec_file = malloc((h->n_records + 1) * sizeof *x->rec_file);  /* [n_records] */
    x->rec_off = malloc((h->n_records + 1) * sizeof *x->rec_off);    /* [n_records] */
    x->hashes = malloc((h->n_records + 1) * sizeof *x->hashes);      /* [n_records] */
    k3_err e = x->rec_file && x->rec_off && x->hashes ? K3_OK : k3_fail(d, K3_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < n && !e; i++) {
        const k3_shard_entry *en = &h->entries[t[i].part];
        uint64_t shape[2] = {en->shape[0], en->shape[1]};
        if (en->encoding == K3_ENC_MXFP4) shape[1] /= 2;            /* the checkpoint's weight_packed, U8 */
        json_t *o = json_object(), *sa = json_array(), *oa = json_array();
        for (int q = 0; q < en->ndim; q++) json_array_append_new(sa, json_integer((json_int_t)shape[q]));
        json_array_append_new(oa, json_integer((json_int_t)at));
        json_array_append_new(oa, json_integer((json_int_t)(at + en->size)));
        json_object_set_new(o, "dtype", json_string(en->encoding == K3_ENC_BF16 ? "BF16" : "U8"));
        json_object_set_new(o, "shape", sa);
        json_object_set_new(o, "data_offsets", oa);
        json_object_set_new(root, t[i].name, o);
        if (i % h->n_entries == 0) x->rec_off[t[i].expert] = at;    /* an expert's tensors are adjacent */
        if (t[i].expert == t[0].expert) rel[t[i].part] = at - x->rec_off[t[i].expert], rec_size += en->size;
        at += en->size;
    }
    char *js = e ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!e && !js) e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
    uint64_t jl = js ? strlen(js) : 0, hn = (jl + 7) / 8 * 8, hs = 8 + hn;   /* header padded with spaces */
    uint8_t *hdr = e ? NULL : malloc(hs);                           /* [8 + N] */
    if (!e && !hdr) e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
    if (!e) {
        for (int i = 0; i < 8; i++) hdr[i] = (uint8_t)(hn >> (8 * i));
        memset(hdr + 8, ' ', hn);
        memcpy(hdr + 8, js, jl);
        char path[4096];
        if (!(e = k3_path_join(path, sizeof path, ckpt, fname, d))) {
            int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
            if (fd < 0) e = k3_fail(d, K3_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
            else {
                if (ftruncate(fd, (off_t)(hs + at)) != 0)
                    e = k3_fail(d, K3_ERR_IO, "cannot size '%s': %s", path, strerror(errno));
                if (!e) e = k3_pwrite_full(fd, hdr, (size_t)hs, 0, path, d);
                close(fd);
            }
        }
    }
    uint64_t zh = 0;
    if (!e) e = zero_hash64(zc, rec_size, &zh, d);
    for (uint64_t r = 0; !e && r < h->n_records; r++) {
        x->rec_file[r] = file_index;
        x->rec_off[r] += hs;
        x->hashes[r] = zh;
    }
    if (!e) {
        x->layer = (uint32_t)sh->layer;
        x->shard = UINT32_MAX;
        x->count = h->n_records;
        x->record_size = rec_size;
        x->stride = k3_in_place_stride(rec_size);
        x->in_place = 1;
        x->n_parts = h->n_entries;
        for (uint32_t i = 0; i < h->n_entries && !e; i++) {     /* parts in offset order */
            uint32_t best = 0;
            for (uint32_t p = 0, k = 0; p < h->n_entries; p++) {
                uint32_t rank = 0;
                for (uint32_t q = 0; q < h->n_entries; q++) rank += rel[q] < rel[p];
                if (rank == i) best = p, k++;
            }
            const k3_shard_entry *en = &h->entries[best];
            k3_mf_part *pt = &x->parts[i];
            if (!(pt->name = strndup(en->name, en->name_len))) { e = k3_fail(d, K3_ERR_NOMEM, "out of memory"); break; }
            pt->encoding = en->encoding;
            pt->ndim = en->ndim;
            memcpy(pt->shape, en->shape, sizeof pt->shape);
            pt->offset = rel[best];
            pt->size = en->size;
        }
        src->size = hs + at;
        src->header_size = hs;
        src->header_hash = k3_xxh3_128(hdr, (size_t)hs);
        if (!(src->name = strdup(fname))) e = k3_fail(d, K3_ERR_NOMEM, "out of memory");
    }
    free(hdr);
    free(js);
    free(t);
    free(rel);
    return e;
}
#define N_OPTS ((int)(sizeof opts / sizeof opts[0]))

static const char usage_footer[] =
    "Writes into OUT_DIR (created; must be new or empty) the pack k3pack would write for a checkpoint\n"
    "holding exactly the tensors CONFIG.json implies (no vision tensors), with every tensor and expert\n"
    "record zero: shard files are sparse (header, then a hole up to their size), so the full Kimi K3\n"
    "pack (1.56 TB apparent) uses a few MB of disk. tiktoken.model and tokenizer_config.json are\n"
    "copied from TOKENIZER_DIR (a missing one is left out with a warning, as k3pack does).\n"
    "\nEvery hash in manifest.json is the true one: tensors and records are hashed as zeros, and each\n"
    "shard's XXH3-128 of header + zeros is computed exactly without reading the zeros, so both\n"
    "'k3verify --quick' and a full 'k3verify' (which reads every byte) accept the pack. Only the\n"
    "manifest's 'generator' differs from k3pack's. For tests of the runtime at real geometry: the\n"
    "model's output from zero weights is meaningless.\n"
    "\nExample:\n  k3_mkpack_sparse tests/data/kimi-k3-config.json TOKDIR /tmp/k3-sparse && k3verify --quick /tmp/k3-sparse\n";

int main(int argc, char **argv)
{
    k3_log_init(argv[0]);
    k3_args a;
    k3_diag d = {0};
    if (k3_opts_parse(opts, N_OPTS, argc, argv, &a, &d)) return k3_usage_error("%s", d.msg);
    if (k3_opt_count(&a, K3_OPT_HELP)) {
        k3_opts_help(stdout, "k3_mkpack_sparse [OPTIONS] CONFIG.json TOKENIZER_DIR OUT_DIR",
                     "Write a full-size k3 pack of zero weights as sparse files (a test fixture).", opts, N_OPTS,
                     usage_footer);
        return K3_EXIT_OK;
    }
    if (k3_opt_count(&a, K3_OPT_VERSION)) {
        printf("k3_mkpack_sparse %s (pack format %d)\n", K3_VERSION, K3_PACK_VERSION);
        return K3_EXIT_OK;
    }
    if (a.n_pos != 3) return k3_usage_error("expected CONFIG.json TOKENIZER_DIR OUT_DIR");
    const char *cfg_path = a.pos[0], *tok_dir = a.pos[1], *out = a.pos[2];
    const char *ckpt = k3_opt_str(&a, O_IN_PLACE), *trunk = k3_opt_str(&a, O_TRUNK);
    int q8 = trunk && !strcmp(trunk, "q8");
    if (trunk && !q8 && strcmp(trunk, "exact")) return k3_usage_error("'--trunk' takes exact or q8");
    double t0 = k3_now();

    static const char *const tok_names[2] = {"tiktoken.model", "tokenizer_config.json"};
    char *cfg_text = NULL, *tok_data[2] = {NULL, NULL};
    size_t cfg_len = 0, tok_len[2] = {0, 0};
    pk_plan plan;
    k3_manifest m;
    zcache zc = {0};
    memset(&plan, 0, sizeof plan);
    memset(&m, 0, sizeof m);
    k3_config cfg;                                      /* parsed once more to name the file in errors */
    struct stat st;
    k3_err e = k3_read_file(cfg_path, 64u << 20, &cfg_text, &cfg_len, &d);
    if (!e) e = k3_config_parse(cfg_text, cfg_len, cfg_path, &cfg, &d);
    if (!e) e = pk_plan_build(&plan, cfg_text, cfg_len, PK_EXPERTS_AUTO, q8, &d);
    if (!e && (stat(tok_dir, &st) != 0 || !S_ISDIR(st.st_mode)))
        e = k3_fail(&d, K3_ERR_NOT_FOUND, "'%s' is not a directory", tok_dir);
    if (!e) e = self_check(&d);
    for (int i = 0; i < 2 && !e; i++) {
        char p[4096];
        if (!(e = k3_path_join(p, sizeof p, tok_dir, tok_names[i], &d)) &&
            (e = k3_read_file(p, 64u << 20, &tok_data[i], &tok_len[i], &d)) == K3_ERR_NOT_FOUND) {
            k3_warn("no '%s' in '%s': the pack will have no tokenizer", tok_names[i], tok_dir);
            e = K3_OK;
        }
    }
    if (!e) e = prepare_dir(out, &d);
    if (!e && ckpt) e = prepare_dir(ckpt, &d);
    if (e) goto out;

    /* the manifest, as pk_finish_pack builds it */
    json_error_t je;
    m.format_version = ckpt || q8 ? K3_PACK_VERSION_MAX : K3_PACK_VERSION;
    m.trunk_q8 = q8;
    m.generator = strdup(GENERATOR);
    m.name_prefix = strdup(k3_config_prefix(&plan.cfg));
    m.config = json_loadb(plan.config_text, plan.config_len, JSON_REJECT_DUPLICATES, &je);
    if (!m.config) { e = k3_fail(&d, K3_ERR_FORMAT, "'%s': line %d: %s", cfg_path, je.line, je.text); goto out; }
    m.experts_encoding = plan.cfg.num_experts ? (plan.experts == PK_EXPERTS_MXFP4 ? K3_ENC_MXFP4 : K3_ENC_BF16) : 0;
    m.files = calloc(3, sizeof *m.files);
    m.shards = calloc(plan.n_shards + 1, sizeof *m.shards);
    zc.h = k3_hasher64_new();
    if (!m.generator || !m.name_prefix || !m.files || !m.shards || !zc.h) {
        e = k3_fail(&d, K3_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < 2 && !e; i++) {
        if (!tok_data[i]) continue;
        if ((e = k3_atomic_write_file(out, tok_names[i], tok_data[i], tok_len[i], &d))) goto out;
        k3_mf_file *f = &m.files[m.n_files++];
        if (!(f->name = strdup(tok_names[i]))) { e = k3_fail(&d, K3_ERR_NOMEM, "out of memory"); goto out; }
        f->size = tok_len[i];
        f->hash = k3_xxh3_128(tok_data[i], tok_len[i]);
    }

    uint64_t apparent = 0, max_hdr = 0, n_moe = 0, ck_bytes = 0;
    for (uint32_t s = 0; ckpt && s < plan.n_shards; s++) n_moe += plan.shards[s].h.kind == K3_SHARD_EXPERTS;
    if (ckpt && !(m.sources = calloc(n_moe + 1, sizeof *m.sources))) { e = k3_fail(&d, K3_ERR_NOMEM, "out of memory"); goto out; }
    for (uint32_t s = 0; s < plan.n_shards; s++) {
        pk_shard *sh = &plan.shards[s];
        k3_shard_header *h = &sh->h;
        if (ckpt && h->kind == K3_SHARD_EXPERTS) {       /* FORMAT.md 10: the records in the checkpoint */
            char fname[64];
            snprintf(fname, sizeof fname, "model-%05u-of-%05u.safetensors", m.n_sources + 1, (unsigned)n_moe);
            k3_mf_experts *nx = realloc(m.expert_layers, (m.n_expert_layers + 1) * sizeof *nx);
            if (!nx) { e = k3_fail(&d, K3_ERR_NOMEM, "out of memory"); goto out; }
            m.expert_layers = nx;
            memset(&nx[m.n_expert_layers], 0, sizeof *nx);
            e = in_place_layer(ckpt, fname, m.name_prefix, sh, m.n_sources, &zc, &nx[m.n_expert_layers++],
                               &m.sources[m.n_sources], &d);
            ck_bytes += m.sources[m.n_sources++].size;
            if (e) goto out;
            continue;
        }
        uint8_t *img = NULL;
        size_t len = 0;
        uint64_t *ent = NULL, *rec = NULL, zh = 0;
        if ((e = k3_shard_encode(h, &img, &len, &d)) || (e = write_shard(out, sh, img, len, &d))) {
            free(img);
            goto out;
        }
        k3_mf_shard *ms = &m.shards[m.n_shards++];
        ms->name = strdup(sh->name);
        ms->kind = h->kind;
        ms->layer = sh->layer;
        ms->size = h->file_size;
        ms->header_hash = h->header_hash;
        ms->hash = h128_head_zeros(img, len, h->file_size);
        free(img);
        apparent += h->file_size;
        if (len > max_hdr) max_hdr = len;
        if (h->kind == K3_SHARD_TRUNK) {                 /* [n_entries] XXH3-64 per tensor */
            ent = calloc((size_t)h->n_entries + 1, sizeof *ent);
            for (uint32_t i = 0; ent && i < h->n_entries && !e; i++) e = zero_hash64(&zc, h->entries[i].size, &ent[i], &d);
        } else {                                         /* [n_records] XXH3-64 per record */
            rec = malloc((size_t)h->n_records * sizeof *rec + 1);
            if (rec) e = zero_hash64(&zc, h->record_size, &zh, &d);
            for (uint64_t r = 0; rec && r < h->n_records; r++) rec[r] = zh;
        }
        if (!e && (!ms->name || (!ent && !rec))) e = k3_fail(&d, K3_ERR_NOMEM, "out of memory");
        if (!e) e = k3_manifest_describe_shard(&m, m.n_shards - 1, h, ent, rec, &d);
        free(ent);
        if (e) {
            if (h->kind != K3_SHARD_TRUNK && (m.n_expert_layers == 0 || m.expert_layers[m.n_expert_layers - 1].hashes != rec))
                free(rec);                               /* not taken over by the manifest */
            goto out;
        }
    }
    if (ckpt) {                                          /* the pack's link to its checkpoint */
        char real[4096], link[4096];
        if (!realpath(ckpt, real)) { e = k3_fail(&d, K3_ERR_IO, "cannot resolve '%s': %s", ckpt, strerror(errno)); goto out; }
        if ((e = k3_path_join(link, sizeof link, out, K3_CHECKPOINT_LINK, &d))) goto out;
        if (symlink(real, link) != 0) { e = k3_fail(&d, K3_ERR_IO, "cannot make '%s': %s", link, strerror(errno)); goto out; }
    }
    char *text;
    size_t tlen;
    if ((e = k3_manifest_dump(&m, &text, &tlen, &d))) goto out;
    e = k3_atomic_write_file(out, K3_MANIFEST_NAME, text, tlen, &d);   /* last: the pack is finished */
    free(text);
    if (!e && k3_log_level() >= K3_LOG_NORMAL) {
        char hb[24];
        fprintf(stderr, "k3_mkpack_sparse: wrote '%s': %u shards, %s apparent (largest header %" PRIu64
                " bytes), %zu distinct zero sizes hashed, %.1f s, peak RSS %" PRIu64 " MiB\n", out, m.n_shards,
                k3_human_bytes((double)apparent, hb, sizeof hb), max_hdr, zc.n, k3_now() - t0,
                k3_peak_rss_bytes() >> 20);
        if (ckpt)
            fprintf(stderr, "k3_mkpack_sparse: the routed experts are read in place from '%s': %u files, %s apparent\n",
                    ckpt, m.n_sources, k3_human_bytes((double)ck_bytes, hb, sizeof hb));
    }
out:
    if (e) k3_error("%s", d.msg);
    k3_manifest_free(&m);
    k3_hasher64_free(zc.h);
    free(zc.size);
    free(zc.hash);
    pk_plan_free(&plan);
    free(cfg_text);
    free(tok_data[0]);
    free(tok_data[1]);
    return e ? k3_exit_code(e) : K3_EXIT_OK;
}

/*
 * tokenizer.c - loading Kimi's tokenizer: tiktoken.model (base64 token, rank
 * per line) into an id-ordered byte table and a rank hash table, the 256
 * special ids named from tokenizer_config.json's added_tokens_decoder, and
 * the accessors. Splitting and BPE merging live in tokenizer_encode.c, the
 * split pattern in tokenizer_pattern.c.
 *
 * tokenizer_config.json is read with jansson (JSON_REJECT_DUPLICATES, as every
 * other k3 config) plus JSON_DECODE_INT_AS_REAL: K3's released file holds
 * "model_max_length": 1000000000000000019884624838656, beyond 64 bits, which
 * jansson's integers and formats/k3_json.c both refuse. As a real it parses;
 * no number of the file is used. Everything else keeps jansson's strictness
 * (UTF-8, no \u0000, no duplicate keys, one value).
 */
#include "tokenizer_impl.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_file.h"
#include "k3_hash.h"

#define TIKTOKEN_MAX_BYTES ((size_t)1 << 30)   /* K3's tiktoken.model is ~2.4 MB */
#define CONFIG_MAX_BYTES ((size_t)64 << 20)

/* ------------------------------------------------------------------------- */
/* rank hash table                                                            */

static uint64_t key_hash(const uint8_t *s, size_t n)
{
    return k3_xxh3_64(s, n);
}

uint32_t k3_tok_rank(const k3_tok *t, const uint8_t *s, size_t n)
{
    uint64_t h = key_hash(s, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint32_t i = (uint32_t)h & t->mask;; i = (i + 1) & t->mask) {
        const k3_tok_slot *sl = &t->slots[i];
        if (!sl->id1) return K3_TOK_NONE;
        if (sl->tag != tag) continue;
        uint32_t r = sl->id1 - 1;
        if (t->off[r + 1] - t->off[r] == n && !memcmp(t->bytes + t->off[r], s, n)) return r;
    }
}

/* Insert rank r; returns the rank already holding the same bytes, or K3_TOK_NONE. */
static uint32_t rank_insert(k3_tok *t, uint32_t r)
{
    const uint8_t *s = t->bytes + t->off[r];
    size_t n = t->off[r + 1] - t->off[r];
    uint64_t h = key_hash(s, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint32_t i = (uint32_t)h & t->mask;; i = (i + 1) & t->mask) {
        k3_tok_slot *sl = &t->slots[i];
        if (!sl->id1) {
            sl->id1 = r + 1;
            sl->tag = tag;
            return K3_TOK_NONE;
        }
        uint32_t o = sl->id1 - 1;
        if (sl->tag == tag && t->off[o + 1] - t->off[o] == n && !memcmp(t->bytes + t->off[o], s, n))
            return o;
    }
}

/* ------------------------------------------------------------------------- */
/* tiktoken.model                                                             */

static int b64_val(uint8_t c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/*
 * Strict standard base64 (RFC 4648 §4): length a multiple of 4, '=' only as
 * the last one or two characters, unused bits zero. out holds >= n/4*3 bytes.
 * Returns the decoded length, or -1 with *why set.
 */
static long b64_decode(const uint8_t *s, size_t n, uint8_t *out, const char **why)
{
    if (n % 4) { *why = "bad base64: length is not a multiple of 4"; return -1; }
    size_t pad = 0;
    while (pad < 2 && pad < n && s[n - 1 - pad] == '=') pad++;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        uint32_t v = 0;
        for (size_t k = 0; k < 4; k++) {
            int x = (i + k >= n - pad) ? 0 : b64_val(s[i + k]);
            if (x < 0) {
                *why = s[i + k] == '=' ? "bad base64: '=' before the end"
                                       : "bad base64: a character outside A-Z a-z 0-9 + / =";
                return -1;
            }
            v = v << 6 | (uint32_t)x;
        }
        out[o++] = (uint8_t)(v >> 16);
        out[o++] = (uint8_t)(v >> 8);
        out[o++] = (uint8_t)v;
    }
    if ((pad == 1 && (b64_val(s[n - 2]) & 3)) || (pad == 2 && (b64_val(s[n - 3]) & 15))) {
        *why = "bad base64: nonzero padding bits";
        return -1;
    }
    return (long)(o - pad);
}

/* Next line of buf[*pos..len) as Python's bytes.splitlines() cuts (\n, \r\n, \r). */
static int next_line(const char *buf, size_t len, size_t *pos, const char **ln, size_t *n)
{
    if (*pos >= len) return 0;
    size_t s = *pos, e = s;
    while (e < len && buf[e] != '\n' && buf[e] != '\r') e++;
    *ln = buf + s;
    *n = e - s;
    if (e < len && buf[e] == '\r' && e + 1 < len && buf[e + 1] == '\n') e++;
    *pos = e < len ? e + 1 : e;
    return 1;
}

typedef struct vocab_tmp {
    uint8_t *raw;          /* [~file size] decoded tokens in file order */
    uint32_t *raw_off;     /* [n_ranks] rank r starts at raw[raw_off[r]] */
    uint32_t *raw_len;     /* [n_ranks] its length; 0 = rank not seen yet */
    uint32_t *line;        /* [n_ranks] line number of rank r (for messages) */
} vocab_tmp;

static void vocab_tmp_free(vocab_tmp *v)
{
    free(v->raw);
    free(v->raw_off);
    free(v->raw_len);
    free(v->line);
}

/* Parse one "base64 rank" line into v; the error names path and line lno. */
static k3_err parse_line(const char *path, size_t lno, const char *ln, size_t n, uint32_t n_ranks,
                         vocab_tmp *v, size_t *raw_used, k3_diag *d)
{
    const char *sp = memchr(ln, ' ', n);
    if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - ln)))
        return k3_fail(d, K3_ERR_FORMAT, "'%s': line %zu: expected 'base64 rank' (two fields "
                       "separated by one space)", path, lno);
    size_t blen = (size_t)(sp - ln), rlen = n - blen - 1;
    if (!rlen || rlen > 10)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': line %zu: bad rank '%.*s'", path, lno,
                       (int)(rlen > 20 ? 20 : rlen), sp + 1);
    uint64_t rank = 0;
    for (size_t i = 0; i < rlen; i++) {
        char c = sp[1 + i];
        if (c < '0' || c > '9')
            return k3_fail(d, K3_ERR_FORMAT, "'%s': line %zu: bad rank '%.*s'", path, lno,
                           (int)rlen, sp + 1);
        rank = rank * 10 + (uint64_t)(c - '0');
    }
    const char *why = NULL;
    long tl = b64_decode((const uint8_t *)ln, blen, v->raw + *raw_used, &why);
    if (tl < 0) return k3_fail(d, K3_ERR_FORMAT, "'%s': line %zu: %s", path, lno, why);
    if (tl == 0) return k3_fail(d, K3_ERR_FORMAT, "'%s': line %zu: empty token", path, lno);
    if (rank >= n_ranks)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': line %zu: rank %llu is not below the number of "
                       "tokens %u (ranks must be 0..n-1)", path, lno, (unsigned long long)rank,
                       n_ranks);
    uint32_t r = (uint32_t)rank;
    if (v->raw_len[r])
        return k3_fail(d, K3_ERR_FORMAT, "'%s': line %zu: duplicate rank %u (first on line %u)",
                       path, lno, r, v->line[r]);
    v->raw_off[r] = (uint32_t)*raw_used;
    v->raw_len[r] = (uint32_t)tl;
    v->line[r] = (uint32_t)lno;
    *raw_used += (size_t)tl;
    return K3_OK;
}

/* Read tiktoken.model into t->n_ranks, v (token bytes by rank, line numbers). */
static k3_err read_tiktoken(const char *path, k3_tok *t, vocab_tmp *v, k3_diag *d)
{
    char *buf;
    size_t len, pos = 0, n, lines = 0;
    const char *ln;
    k3_err e = k3_read_file(path, TIKTOKEN_MAX_BYTES, &buf, &len, d);
    if (e) return e;
    while (next_line(buf, len, &pos, &ln, &n)) lines += n > 0;
    if (!lines || lines > K3_TOK_MAX_RANKS) {
        free(buf);
        return k3_fail(d, K3_ERR_FORMAT, "'%s': %zu tokens (expected 1..%u)", path, lines,
                       K3_TOK_MAX_RANKS);
    }
    t->n_ranks = (uint32_t)lines;
    v->raw = malloc(len / 4 * 3 + 3);
    v->raw_off = malloc(lines * sizeof *v->raw_off);
    v->raw_len = calloc(lines, sizeof *v->raw_len);
    v->line = malloc(lines * sizeof *v->line);
    if (!v->raw || !v->raw_off || !v->raw_len || !v->line) {
        free(buf);
        return k3_fail(d, K3_ERR_NOMEM, "out of memory loading '%s'", path);
    }
    size_t used = 0, lno = 0;
    pos = 0;
    while (!e && next_line(buf, len, &pos, &ln, &n)) {
        lno++;
        if (n) e = parse_line(path, lno, ln, n, t->n_ranks, v, &used, d);
    }
    free(buf);
    return e;   /* n_ranks lines with distinct ranks below n_ranks: every rank is present */
}

/* ------------------------------------------------------------------------- */
/* tokenizer_config.json                                                      */

/* Parse a decimal id key ("163586": digits, no sign, no leading zero). */
static int parse_id_key(const char *k, uint64_t *out)
{
    size_t n = strlen(k);
    if (!n || n > 12 || (n > 1 && k[0] == '0')) return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (k[i] < '0' || k[i] > '9') return -1;
        v = v * 10 + (uint64_t)(k[i] - '0');
    }
    *out = v;
    return 0;
}

/* Named specials from added_tokens_decoder: names[i] for id n_ranks + i (borrowed from root). */
static k3_err read_config(const char *path, const k3_tok *t, json_t **root_out,
                          const char *names[K3_TOK_N_SPECIAL], k3_diag *d)
{
    char *text;
    size_t len;
    k3_err e = k3_read_file(path, CONFIG_MAX_BYTES, &text, &len, d);
    if (e) return e;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &je);
    free(text);
    if (!root)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': line %d: %s", path, je.line, je.text);
    *root_out = root;
    if (!json_is_object(root))
        return k3_fail(d, K3_ERR_FORMAT, "'%s': not a JSON object", path);
    json_t *atd = json_object_get(root, "added_tokens_decoder");
    if (!atd) return K3_OK;   /* as the reference: no entry, no named special */
    if (!json_is_object(atd))
        return k3_fail(d, K3_ERR_FORMAT, "'%s': added_tokens_decoder is not an object", path);
    const char *key;
    json_t *ent;
    json_object_foreach(atd, key, ent) {
        uint64_t id;
        if (parse_id_key(key, &id))
            return k3_fail(d, K3_ERR_FORMAT, "'%s': added_tokens_decoder: key '%.40s' is not a "
                           "decimal id", path, key);
        if (id < t->n_ranks)
            return k3_fail(d, K3_ERR_FORMAT, "'%s': added_tokens_decoder: id %llu collides with "
                           "a BPE rank (the vocabulary has %u ranks; special ids are %u..%u)",
                           path, (unsigned long long)id, t->n_ranks, t->n_ranks, t->n_ids - 1);
        if (id >= t->n_ids)
            return k3_fail(d, K3_ERR_FORMAT, "'%s': added_tokens_decoder: id %llu is outside the "
                           "special range %u..%u", path, (unsigned long long)id, t->n_ranks,
                           t->n_ids - 1);
        json_t *c = json_is_object(ent) ? json_object_get(ent, "content") : NULL;
        if (!json_is_string(c) || !json_string_length(c))
            return k3_fail(d, K3_ERR_FORMAT, "'%s': added_tokens_decoder: id %llu: 'content' is "
                           "not a non-empty string", path, (unsigned long long)id);
        json_t *sp = json_object_get(ent, "special");
        if (sp && !json_is_boolean(sp))   /* read and checked, then ignored (see header) */
            return k3_fail(d, K3_ERR_FORMAT, "'%s': added_tokens_decoder: id %llu: 'special' is "
                           "not a boolean", path, (unsigned long long)id);
        names[id - t->n_ranks] = json_string_value(c);
    }
    return K3_OK;
}

/* ------------------------------------------------------------------------- */
/* assembling the tables                                                      */

/* Insertion sort of special indexes by (first byte, longer first, bytes): 256 items. */
static void sort_specials(k3_tok *t)
{
    for (int i = 0; i < K3_TOK_N_SPECIAL; i++) t->sp_order[i] = (uint16_t)i;
    for (int i = 1; i < K3_TOK_N_SPECIAL; i++) {
        uint16_t x = t->sp_order[i];
        const uint8_t *xs = t->bytes + t->off[t->n_ranks + x];
        uint32_t xl = t->off[t->n_ranks + x + 1] - t->off[t->n_ranks + x];
        int j = i - 1;
        for (; j >= 0; j--) {
            uint16_t y = t->sp_order[j];
            const uint8_t *ys = t->bytes + t->off[t->n_ranks + y];
            uint32_t yl = t->off[t->n_ranks + y + 1] - t->off[t->n_ranks + y];
            int before = xs[0] != ys[0] ? xs[0] < ys[0]
                       : xl != yl ? xl > yl : memcmp(xs, ys, xl) < 0;
            if (!before) break;
            t->sp_order[j + 1] = y;
        }
        t->sp_order[j + 1] = x;
    }
    memset(t->sp_first, 0, sizeof t->sp_first);
    for (int i = 0; i < K3_TOK_N_SPECIAL; i++)
        t->sp_first[t->bytes[t->off[t->n_ranks + i]] + 1]++;
    for (int b = 0; b < 256; b++) t->sp_first[b + 1] += t->sp_first[b];
}

/* Build bytes/off in id order (ranks, then special names) and the hash table. */
static k3_err build_tables(const char *tik_path, const char *cfg_path, k3_tok *t,
                           const vocab_tmp *v, const char *names[K3_TOK_N_SPECIAL], k3_diag *d)
{
    char reserved[K3_TOK_N_SPECIAL][32];          /* [256] "<|reserved_token_ID|>" */
    size_t total = 0;
    for (uint32_t r = 0; r < t->n_ranks; r++) total += v->raw_len[r];
    for (int i = 0; i < K3_TOK_N_SPECIAL; i++) {
        if (!names[i]) {
            snprintf(reserved[i], sizeof reserved[i], "<|reserved_token_%u|>", t->n_ranks + i);
            names[i] = reserved[i];
        }
        total += strlen(names[i]);
    }
    if (total > UINT32_MAX)
        return k3_fail(d, K3_ERR_FORMAT, "'%s': %zu bytes of tokens, more than 4 GiB", tik_path,
                       total);
    uint32_t cap = 1;
    while (cap < 2 * t->n_ranks) cap <<= 1;
    t->bytes = malloc(total ? total : 1);
    t->off = malloc((t->n_ids + 1) * sizeof *t->off);
    t->slots = calloc(cap, sizeof *t->slots);
    if (!t->bytes || !t->off || !t->slots)
        return k3_fail(d, K3_ERR_NOMEM, "out of memory loading '%s'", tik_path);
    t->mask = cap - 1;
    uint32_t o = 0;
    for (uint32_t r = 0; r < t->n_ranks; r++) {
        t->off[r] = o;
        memcpy(t->bytes + o, v->raw + v->raw_off[r], v->raw_len[r]);
        o += v->raw_len[r];
    }
    for (int i = 0; i < K3_TOK_N_SPECIAL; i++) {
        size_t l = strlen(names[i]);
        t->off[t->n_ranks + (uint32_t)i] = o;
        memcpy(t->bytes + o, names[i], l);
        o += (uint32_t)l;
    }
    t->off[t->n_ids] = o;
    for (uint32_t r = 0; r < t->n_ranks; r++) {
        uint32_t dup = rank_insert(t, r);
        if (dup != K3_TOK_NONE) {
            uint32_t a = v->line[dup] < v->line[r] ? dup : r, b = a == r ? dup : r;
            return k3_fail(d, K3_ERR_FORMAT, "'%s': line %u: duplicate token (the same bytes as "
                           "line %u)", tik_path, v->line[b], v->line[a]);
        }
    }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        if ((t->byte_rank[b] = k3_tok_rank(t, &c, 1)) == K3_TOK_NONE)
            return k3_fail(d, K3_ERR_FORMAT, "'%s': single byte 0x%02x is not a token (byte-level "
                           "BPE needs all 256)", tik_path, b);
    }
    /* Special names must be unique (a name is matched in text and looked up by name). */
    for (int i = 0; i < K3_TOK_N_SPECIAL; i++)
        for (int j = i + 1; j < K3_TOK_N_SPECIAL; j++)
            if (!strcmp(names[i], names[j]))
                return k3_fail(d, K3_ERR_FORMAT, "'%s': special token '%.80s' names ids %u and %u",
                               cfg_path ? cfg_path : tik_path, names[i], t->n_ranks + i,
                               t->n_ranks + j);
    sort_specials(t);
    return K3_OK;
}

k3_err k3_tok_load(const char *tiktoken_path, const char *config_path, k3_tok **out, k3_diag *d)
{
    *out = NULL;
    k3_tok *t = calloc(1, sizeof *t);
    if (!t) return k3_fail(d, K3_ERR_NOMEM, "out of memory loading '%s'", tiktoken_path);
    vocab_tmp v = {0};
    json_t *root = NULL;
    const char *names[K3_TOK_N_SPECIAL] = {0};    /* [256] borrowed from root, NULL = reserved */
    k3_err e = read_tiktoken(tiktoken_path, t, &v, d);
    if (!e) {
        t->n_ids = t->n_ranks + K3_TOK_N_SPECIAL;
        if (config_path) e = read_config(config_path, t, &root, names, d);
    }
    if (!e) {
        for (int i = 0; i < K3_TOK_N_SPECIAL; i++) t->named[i] = names[i] != NULL;
        e = build_tables(tiktoken_path, config_path, t, &v, names, d);
    }
    if (!e) e = k3_tok_compile_pattern(t, d);
    vocab_tmp_free(&v);
    json_decref(root);
    if (e) {
        k3_tok_free(t);
        return e;
    }
    *out = t;
    return K3_OK;
}

k3_err k3_tok_load_dir(const char *dir, k3_tok **out, k3_diag *d)
{
    char tik[4096], cfg[4096];
    k3_err e = k3_path_join(tik, sizeof tik, dir, "tiktoken.model", d);
    if (!e) e = k3_path_join(cfg, sizeof cfg, dir, "tokenizer_config.json", d);
    if (e) {
        *out = NULL;
        return e;
    }
    return k3_tok_load(tik, cfg, out, d);
}

void k3_tok_free(k3_tok *t)
{
    if (!t) return;
    pcre2_code_free(t->re);
    free(t->bytes);
    free(t->off);
    free(t->slots);
    free(t);
}

/* ------------------------------------------------------------------------- */
/* accessors                                                                  */

uint32_t k3_tok_n_ranks(const k3_tok *t) { return t->n_ranks; }
uint32_t k3_tok_n_ids(const k3_tok *t) { return t->n_ids; }

const uint8_t *k3_tok_bytes(const k3_tok *t, int32_t id, size_t *len)
{
    if (id < 0 || (uint32_t)id >= t->n_ids) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->off[id + 1] - t->off[id];
    return t->bytes + t->off[id];
}

int k3_tok_is_special(const k3_tok *t, int32_t id)
{
    return id >= 0 && (uint32_t)id >= t->n_ranks && (uint32_t)id < t->n_ids;
}

int32_t k3_tok_special_id(const k3_tok *t, const char *name)
{
    size_t n = strlen(name);
    for (uint32_t i = t->n_ranks; i < t->n_ids; i++)
        if (t->off[i + 1] - t->off[i] == n && !memcmp(t->bytes + t->off[i], name, n))
            return (int32_t)i;
    return -1;
}

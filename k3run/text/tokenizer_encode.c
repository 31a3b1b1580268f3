/*
 * tokenizer_encode.c - text -> ids, exactly as Kimi's tokenization_kimi.py
 * (and tests/reference/kimi_tokenizer.py, the oracle):
 *
 *   bytes --(maximal valid UTF-8 runs; every other byte is its own piece)-->
 *   run --(<= 400 000-char blocks, then cuts inside whitespace / non-whitespace
 *   runs longer than 25 000 chars, Python str.isspace)--> chunk
 *   --(special names, longest first, when allowed)--> text between specials
 *   --(Kimi's split pattern through PCRE2)--> pre-token --(byte-level BPE by
 *   rank, tiktoken's _byte_pair_merge as heap + linked list)--> ids
 *
 * The split pattern itself, compiled once at load, is in tokenizer_pattern.c.
 */
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------- */
/* per-call state                                                             */

#define JIT_STACK_MAX ((size_t)16 << 20)   /* reserved, touched as needed: ~8 bytes a char
                                              of a letter run (runs are <= 25 000 chars) */

typedef struct walk {
    const k3_tok *t;
    int special;
    k3_tok_piece_fn fn;                  /* piece consumer (encode's or the caller's) */
    void *ctx;
    k3_diag *d;
    pcre2_match_data *md;                /* created on first use */
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
} walk;

static void walk_free(walk *w)
{
    pcre2_match_data_free(w->md);
    pcre2_match_context_free(w->mc);
    pcre2_jit_stack_free(w->js);
}

static k3_err walk_init_match(walk *w)
{
    w->md = pcre2_match_data_create(1, NULL);
    w->mc = pcre2_match_context_create(NULL);
    if (w->md && w->mc && w->t->jit) {
        w->js = pcre2_jit_stack_create(32 * 1024, JIT_STACK_MAX, NULL);
        if (w->js) pcre2_jit_stack_assign(w->mc, NULL, w->js);
    }
    if (!w->md || !w->mc || (w->t->jit && !w->js))
        return k3_fail(w->d, K3_ERR_NOMEM, "out of memory for the split pattern's match data");
    pcre2_set_heap_limit(w->mc, 1u << 20);   /* KiB, for the interpreter fallback: 1 GiB */
    return K3_OK;
}

/* Pre-tokens of s[0..n) (valid UTF-8, no special inside): pcre2 findall. */
static k3_err split_ordinary(walk *w, const char *s, size_t n)
{
    if (!n) return K3_OK;
    if (!w->md) {
        k3_err e = walk_init_match(w);
        if (e) return e;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
    size_t off = 0;
    while (off < n) {
        int rc = w->t->jit
            ? pcre2_jit_match(w->t->re, (PCRE2_SPTR)s, n, off, 0, w->md, w->mc)
            : pcre2_match(w->t->re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK, w->md, w->mc);
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return k3_fail(w->d, K3_ERR_INTERNAL, "split pattern failed at byte %zu of a %zu-byte "
                           "chunk: %s", off, n, (const char *)msg);
        }
        /* Every character matches some alternative, so findall never skips one. */
        if (ov[0] != off || ov[1] <= ov[0])
            return k3_fail(w->d, K3_ERR_INTERNAL, "split pattern matched [%zu, %zu) at offset %zu",
                           (size_t)ov[0], (size_t)ov[1], off);
        k3_err e = w->fn(w->ctx, K3_TOK_PIECE_TEXT, s + ov[0], ov[1] - ov[0], -1, w->d);
        if (e) return e;
        off = ov[1];
    }
    return K3_OK;
}

/* One chunk: split on special names (longest first) if allowed, else all text. */
static k3_err split_chunk(walk *w, const char *s, size_t n)
{
    const k3_tok *t = w->t;
    if (!w->special) return split_ordinary(w, s, n);
    size_t seg = 0, pos = 0;
    while (pos < n) {
        uint8_t b = (uint8_t)s[pos];
        uint32_t hit = K3_TOK_NONE, hit_len = 0;
        for (unsigned k = t->sp_first[b]; k < t->sp_first[b + 1]; k++) {
            uint32_t id = t->n_ranks + t->sp_order[k];
            uint32_t l = t->off[id + 1] - t->off[id];
            if (l <= n - pos && !memcmp(s + pos, t->bytes + t->off[id], l)) {
                hit = id;
                hit_len = l;
                break;   /* sorted longest first */
            }
        }
        if (hit == K3_TOK_NONE) {
            pos++;
            continue;
        }
        k3_err e = split_ordinary(w, s + seg, pos - seg);
        if (!e) e = w->fn(w->ctx, K3_TOK_PIECE_SPECIAL, s + pos, hit_len, (int32_t)hit, w->d);
        if (e) return e;
        pos += hit_len;
        seg = pos;
    }
    return split_ordinary(w, s + seg, n - seg);
}

/* Python's str.isspace (bidi WS/B/S or Zs): unlike \s it has U+001C..U+001F. */
static int py_isspace(uint32_t c)
{
    if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Length (1..4) of the valid UTF-8 character at s (n >= 1 bytes left), its code
   point in *cp; 0 if invalid (overlong, surrogate, > U+10FFFF, truncated). */
static size_t utf8_char(const uint8_t *s, size_t n, uint32_t *cp)
{
    uint32_t c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    size_t len;
    uint32_t min;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; min = 0x80; c &= 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; min = 0x800; c &= 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; min = 0x10000; c &= 0x07; }
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        c = c << 6 | (s[i] & 0x3Fu);
    }
    if (c < min || (c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF) return 0;
    *cp = c;
    return len;
}

/*
 * A valid UTF-8 run s[0..n): Kimi's encode() chunking. Blocks of at most
 * K3_TOK_MAX_CHARS chars; inside a block, _split_whitespaces_or_nonwhitespaces
 * cuts before a char that would make a whitespace or non-whitespace run
 * longer than K3_TOK_MAX_RUN.
 */
static k3_err split_run(walk *w, const uint8_t *s, size_t n)
{
    size_t p = 0;
    while (p < n) {
        size_t slice = p, run = 0, chars = 0;
        int run_space = 0;
        while (p < n && chars < K3_TOK_MAX_CHARS) {
            uint32_t cp = 0;
            size_t l = utf8_char(s + p, n - p, &cp);
            int sp = py_isspace(cp);
            if (!chars) run_space = sp;
            if (run_space != sp) {
                run = 1;
                run_space = sp;
            } else if (++run > K3_TOK_MAX_RUN) {
                k3_err e = split_chunk(w, (const char *)s + slice, p - slice);
                if (e) return e;
                slice = p;
                run = 1;
            }
            p += l;
            chars++;
        }
        k3_err e = split_chunk(w, (const char *)s + slice, p - slice);
        if (e) return e;
    }
    return K3_OK;
}

static k3_err walk_text(walk *w, const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        uint32_t cp;
        for (size_t l; j < n; j += l) {
            if (s[j] < 0x80) { l = 1; continue; }
            if (!(l = utf8_char(s + j, n - j, &cp))) break;
        }
        if (j > i) {
            k3_err e = split_run(w, s + i, j - i);
            if (e) return e;
        }
        if (j < n) {   /* an invalid byte: a piece of its own */
            k3_err e = w->fn(w->ctx, K3_TOK_PIECE_BYTE, (const char *)s + j, 1, -1, w->d);
            if (e) return e;
            j++;
        }
        i = j;
    }
    return K3_OK;
}

k3_err k3_tok_split(const k3_tok *t, const char *text, size_t len, int special,
                    k3_tok_piece_fn fn, void *ctx, k3_diag *d)
{
    walk w = {.t = t, .special = special, .fn = fn, .ctx = ctx, .d = d};
    k3_err e = walk_text(&w, (const uint8_t *)text, len);
    walk_free(&w);
    return e;
}

/* ------------------------------------------------------------------------- */
/* BPE                                                                        */

typedef struct encoder {
    const k3_tok *t;
    int32_t **ids;                       /* [*cap] the caller's output, *n used */
    size_t *n, *cap;
    size_t scap;                         /* capacity of the buffers below, in piece bytes */
    uint32_t *nxt;                       /* [scap] end of the part starting at i */
    uint32_t *prv;                       /* [scap] start of the part before part i, or NONE */
    uint32_t *pair;                      /* [scap] rank of part i + the next part, or NONE;
                                            NONE for dead parts */
    uint32_t *part;                      /* [scap] rank of part i itself */
    uint64_t *heap;                      /* [3 * scap] min-heap of pair rank << 32 | start */
} encoder;

static k3_err reserve_ids(encoder *en, size_t want, k3_diag *d)
{
    if (want <= *en->cap) return K3_OK;
    int32_t *p = realloc(*en->ids, want * sizeof *p);
    if (!p) return k3_fail(d, K3_ERR_NOMEM, "out of memory for %zu token ids", want);
    *en->ids = p;
    *en->cap = want;
    return K3_OK;
}

static k3_err push_id(encoder *en, uint32_t id, k3_diag *d)
{
    if (*en->n == *en->cap) {
        k3_err e = reserve_ids(en, *en->cap * 2 + 64, d);
        if (e) return e;
    }
    (*en->ids)[(*en->n)++] = (int32_t)id;
    return K3_OK;
}

static k3_err grow_scratch(encoder *en, size_t n, k3_diag *d)
{
    size_t c = en->scap ? en->scap : 1024;   /* most pieces are far shorter: one allocation */
    while (c < n) c *= 2;
    free(en->nxt); free(en->prv); free(en->pair); free(en->part); free(en->heap);
    en->nxt = malloc(c * sizeof *en->nxt);
    en->prv = malloc(c * sizeof *en->prv);
    en->pair = malloc(c * sizeof *en->pair);
    en->part = malloc(c * sizeof *en->part);
    en->heap = malloc(3 * c * sizeof *en->heap);
    en->scap = c;
    if (!en->nxt || !en->prv || !en->pair || !en->part || !en->heap) {
        en->scap = 0;
        return k3_fail(d, K3_ERR_NOMEM, "out of memory for a %zu-byte piece", n);
    }
    return K3_OK;
}

static void heap_push(uint64_t *h, size_t *hn, uint64_t v)
{
    size_t i = (*hn)++;
    while (i && h[(i - 1) / 2] > v) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *hn)
{
    uint64_t top = h[0], v = h[--*hn];
    size_t i = 0, n = *hn;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = v;
    return top;
}

/* Rank of the pair starting at part i (ending where the part after it ends). */
static uint32_t pair_rank(const encoder *en, const uint8_t *s, size_t n, uint32_t i)
{
    uint32_t j = en->nxt[i];
    if (j >= n) return K3_TOK_NONE;
    return k3_tok_rank(en->t, s + i, en->nxt[j] - i);
}

/*
 * tiktoken's _byte_pair_merge: from single bytes, merge the adjacent pair
 * whose concatenation has the lowest rank (leftmost on ties) until none is a
 * token. Heap entries are (rank, start); an entry is stale when pair[start]
 * no longer equals its rank (a part's pair only grows, so ranks never repeat).
 */
static k3_err bpe(encoder *en, const uint8_t *s, size_t n, k3_diag *d)
{
    uint32_t whole = k3_tok_rank(en->t, s, n);
    if (whole != K3_TOK_NONE) return push_id(en, whole, d);   /* tiktoken's shortcut */
    if (n > UINT32_MAX / 4)
        return k3_fail(d, K3_ERR_INTERNAL, "a %zu-byte piece is too long to merge", n);
    if (n > en->scap) {
        k3_err e = grow_scratch(en, n, d);
        if (e) return e;
    }
    size_t hn = 0;
    for (uint32_t i = 0; i < n; i++) {
        en->nxt[i] = i + 1;
        en->prv[i] = i ? i - 1 : K3_TOK_NONE;
        en->part[i] = en->t->byte_rank[s[i]];
    }
    for (uint32_t i = 0; i < n; i++) {
        en->pair[i] = pair_rank(en, s, n, i);
        if (en->pair[i] != K3_TOK_NONE) heap_push(en->heap, &hn, (uint64_t)en->pair[i] << 32 | i);
    }
    while (hn) {
        uint64_t top = heap_pop(en->heap, &hn);
        uint32_t r = (uint32_t)(top >> 32), i = (uint32_t)top;
        if (en->pair[i] != r) continue;   /* stale */
        uint32_t j = en->nxt[i], k = en->nxt[j];
        en->pair[j] = K3_TOK_NONE;        /* part j is gone */
        en->nxt[i] = k;
        en->part[i] = r;
        if (k < n) en->prv[k] = i;
        en->pair[i] = pair_rank(en, s, n, i);
        if (en->pair[i] != K3_TOK_NONE) heap_push(en->heap, &hn, (uint64_t)en->pair[i] << 32 | i);
        uint32_t p = en->prv[i];
        if (p != K3_TOK_NONE) {
            en->pair[p] = pair_rank(en, s, n, p);
            if (en->pair[p] != K3_TOK_NONE)
                heap_push(en->heap, &hn, (uint64_t)en->pair[p] << 32 | p);
        }
    }
    for (uint32_t i = 0; i < n; i = en->nxt[i]) {
        k3_err e = push_id(en, en->part[i], d);
        if (e) return e;
    }
    return K3_OK;
}

static k3_err encode_piece(void *ctx, int kind, const char *s, size_t len, int32_t id, k3_diag *d)
{
    encoder *en = ctx;
    if (kind == K3_TOK_PIECE_SPECIAL) return push_id(en, (uint32_t)id, d);
    return bpe(en, (const uint8_t *)s, len, d);   /* a lone byte is a rank: one id */
}

k3_err k3_tok_encode(const k3_tok *t, const char *text, size_t len, int special,
                     int32_t **ids, size_t *n, size_t *cap, k3_diag *d)
{
    encoder en = {.t = t, .ids = ids, .n = n, .cap = cap};
    /* Typical text is 0.2-0.5 ids a byte (never more than 1): reserve once, double if short. */
    k3_err e = reserve_ids(&en, *n + len / 2 + 64, d);
    if (!e) e = k3_tok_split(t, text, len, special, encode_piece, &en, d);
    free(en.nxt); free(en.prv); free(en.pair); free(en.part); free(en.heap);
    return e;
}

/*
 * bench_tokenizer - speed of k3run's tokenizer (k3_tok_encode): a 100k- and a
 * 1M-character mixed prompt (English prose and code, CJK, digits, emoji,
 * whitespace runs, a few invalid bytes; deterministic), then worst cases
 * for the merges: 1M characters of one letter ("aaaa...": 25 000-char pieces)
 * and of random lowercase letters without spaces, and "!\x1c" repeated (U+001C
 * is a space to str.isspace, not to \s: nothing cuts it, so each 400 000-char
 * block is one pre-token for the merge heap). Best of 3 runs each; prints
 * one line per text: chars, bytes, tokens, seconds, chars/s.
 *
 *   bench_tokenizer [TIKTOKEN.MODEL [TOKENIZER_CONFIG.JSON]]
 *
 * Default: tests/reference/data/tiktoken.model (3840 ranks; run from the repo
 * root) with no config.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_sys.h"
#include "tokenizer.h"

static const char *const frags[] = {
    "The quick brown fox jumps over the lazy dog. ", "It's what they'll do; we've seen it. ",
    "int main(void) {\n    return k3_tok_encode(t, s, n, 0, &ids, &n, &cap, &d);\n}\n",
    "    if (x < 0x10FFFF && y >= 42) z += 3.14159;\n", "中文分词测试，模型推理。", "東京はabc漢字です。",
    "Привет, мир! ", "한국어 텍스트 ", "1234567890 ", "2024-06-01T12:00:00Z ", "😀👍🏽 ",
    "\n\n", "\r\n", "\t\t", "        ", "\xc2\xa0", "naïve café résumé ", "HTTPServer XMLHttpRequest ",
    "<|end_of_msg|> ", "\xff", "العربية ",
};

/* Append fragments until the text holds `chars` characters (UTF-8 lead bytes counted). */
static char *make_prompt(size_t chars, size_t *len)
{
    size_t cap = chars * 4 + 256, n = 0, c = 0;
    char *s = malloc(cap);             /* [cap] the prompt */
    uint64_t x = 88172645463325252ull;
    if (!s) return NULL;
    while (c < chars) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        const char *f = frags[x % (sizeof frags / sizeof frags[0])];
        for (; *f && c < chars; f++) {
            s[n++] = *f;
            if (((unsigned char)f[1] & 0xC0) != 0x80) c++;   /* a char ends here */
        }
    }
    *len = n;
    return s;
}

static void bench(const k3_tok *t, const char *name, const char *s, size_t len, size_t chars)
{
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    k3_diag d = {0};
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        n = 0;
        double t0 = k3_now();
        if (k3_tok_encode(t, s, len, 0, &ids, &n, &cap, &d)) {
            fprintf(stderr, "bench_tokenizer: %s\n", d.msg);
            exit(1);
        }
        double dt = k3_now() - t0;
        if (dt < best) best = dt;
    }
    printf("%-22s %9zu chars %9zu bytes %8zu tokens %8.4f s %12.0f chars/s\n", name, chars, len, n,
           best, (double)chars / best);
    free(ids);
}

int main(int argc, char **argv)
{
    const char *vocab = argc > 1 ? argv[1] : "tests/reference/data/tiktoken.model";
    const char *config = argc > 2 ? argv[2] : NULL;
    k3_diag d = {0};
    k3_tok *t;
    double t0 = k3_now();
    if (k3_tok_load(vocab, config, &t, &d)) {
        fprintf(stderr, "bench_tokenizer: %s\n", d.msg);
        return 1;
    }
    printf("load %s: %u ranks, %.3f s\n", vocab, k3_tok_n_ranks(t), k3_now() - t0);
    size_t len;
    for (size_t chars = 100000; chars <= 1000000; chars *= 10) {
        char *s = make_prompt(chars, &len);
        if (!s) return 1;
        char name[32];
        snprintf(name, sizeof name, "mixed %zuk", chars / 1000);
        bench(t, name, s, len, chars);
        free(s);
    }
    size_t n = 1000000;
    char *s = malloc(n);               /* [n] one-letter and random-letter texts */
    if (!s) return 1;
    memset(s, 'a', n);
    bench(t, "one letter 1000k", s, n, n);
    uint64_t x = 2463534242ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        s[i] = (char)('a' + x % 26);
    }
    bench(t, "random letters 1000k", s, n, n);
    for (size_t i = 0; i < n; i++) s[i] = i & 1 ? '\x1c' : '!';   /* 400 000-char pieces */
    bench(t, "'!\\x1c' 1000k", s, n, n);
    free(s);
    k3_tok_free(t);
    return 0;
}

/*
 * k3_tokdump.c - test driver of k3run's tokenizer (tokenizer.h), for
 * test_tokenizer_c.py to compare with tests/reference/kimi_tokenizer.py.
 *
 *   k3_tokdump (--dir DIR | --vocab TIKTOKEN.MODEL [--config TOKENIZER_CONFIG.JSON])
 *              [--special] [--encode | --split | --decode | --info] [FILE]
 *
 * FILE (default stdin) holds one test string per line, hex-encoded (so any
 * bytes, NUL and invalid UTF-8 included, fit on a line; an empty line is the
 * empty string). Output, one line per input line:
 *   --encode (default)  the ids, space-separated
 *   --split             the pieces: "<len>" a pre-token of len bytes, "s<id>" a
 *                       special, "x" an invalid UTF-8 byte
 *   --decode            input lines are space-separated ids; output the hex of
 *                       the concatenated k3_tok_bytes
 *   --info              (no input) "n_ranks N", "n_ids N", then "special ID HEX" per id
 * Exit 0, or 1 with the k3 message on stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

static int die(const k3_diag *d)
{
    fprintf(stderr, "k3_tokdump: %s\n", d->msg);
    return 1;
}

static void put_hex(FILE *f, const uint8_t *p, size_t n)
{
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        fputc(hx[p[i] >> 4], f);
        fputc(hx[p[i] & 15], f);
    }
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static k3_err print_piece(void *ctx, int kind, const char *s, size_t len, int32_t id, k3_diag *d)
{
    int *first = ctx;
    (void)s;
    (void)d;
    if (!*first) putchar(' ');
    *first = 0;
    if (kind == K3_TOK_PIECE_SPECIAL) printf("s%d", (int)id);
    else if (kind == K3_TOK_PIECE_BYTE) putchar('x');
    else printf("%zu", len);
    return K3_OK;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *vocab = NULL, *config = NULL, *in_path = NULL, *mode = "--encode";
    int special = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab = argv[++i];
        else if (!strcmp(argv[i], "--config") && i + 1 < argc) config = argv[++i];
        else if (!strcmp(argv[i], "--special")) special = 1;
        else if (!strcmp(argv[i], "--encode") || !strcmp(argv[i], "--split") ||
                 !strcmp(argv[i], "--decode") || !strcmp(argv[i], "--info")) mode = argv[i];
        else if (argv[i][0] != '-' && !in_path) in_path = argv[i];
        else {
            fprintf(stderr, "usage: k3_tokdump (--dir DIR | --vocab F [--config F]) [--special] "
                    "[--encode | --split | --decode | --info] [FILE]\n");
            return 2;
        }
    }
    if (!dir == !vocab) {
        fprintf(stderr, "k3_tokdump: give --dir or --vocab\n");
        return 2;
    }
    k3_diag d = {0};
    k3_tok *t;
    if (dir ? k3_tok_load_dir(dir, &t, &d) : k3_tok_load(vocab, config, &t, &d)) return die(&d);
    if (!strcmp(mode, "--info")) {
        printf("n_ranks %u\nn_ids %u\n", k3_tok_n_ranks(t), k3_tok_n_ids(t));
        for (uint32_t i = k3_tok_n_ranks(t); i < k3_tok_n_ids(t); i++) {
            size_t n;
            const uint8_t *b = k3_tok_bytes(t, (int32_t)i, &n);
            printf("special %u ", i);
            put_hex(stdout, b, n);
            putchar('\n');
        }
        k3_tok_free(t);
        return 0;
    }
    FILE *in = in_path ? fopen(in_path, "rb") : stdin;
    if (!in) {
        perror(in_path);
        k3_tok_free(t);
        return 1;
    }
    char *line = NULL;            /* [lcap] one input line */
    size_t lcap = 0;
    uint8_t *buf = NULL;          /* [bcap] the decoded test string */
    size_t bcap = 0;
    int32_t *ids = NULL;          /* [cap] encode output */
    size_t n = 0, cap = 0;
    ssize_t got;
    int rc = 0;
    while (!rc && (got = getline(&line, &lcap, in)) >= 0) {
        size_t l = (size_t)got;
        while (l && (line[l - 1] == '\n' || line[l - 1] == '\r')) l--;
        if (!strcmp(mode, "--decode")) {
            char *p = line, *end;
            line[l] = '\0';
            for (;;) {
                long id = strtol(p, &end, 10);
                if (end == p) break;
                size_t bn;
                const uint8_t *b = k3_tok_bytes(t, (int32_t)id, &bn);
                if (!b) {
                    fprintf(stderr, "k3_tokdump: id %ld is out of range\n", id);
                    rc = 1;
                    break;
                }
                put_hex(stdout, b, bn);
                p = end;
            }
            putchar('\n');
            continue;
        }
        if (l % 2 || l / 2 > bcap) {
            if (l % 2) {
                fprintf(stderr, "k3_tokdump: odd-length hex line\n");
                rc = 1;
                break;
            }
            free(buf);
            bcap = l / 2;
            buf = malloc(bcap ? bcap : 1);
            if (!buf) { rc = 1; break; }
        }
        for (size_t i = 0; i < l / 2; i++) {
            int hi = hexval(line[2 * i]), lo = hexval(line[2 * i + 1]);
            if (hi < 0 || lo < 0) {
                fprintf(stderr, "k3_tokdump: bad hex\n");
                rc = 1;
                break;
            }
            buf[i] = (uint8_t)(hi << 4 | lo);
        }
        if (rc) break;
        if (!strcmp(mode, "--split")) {
            int first = 1;
            if (k3_tok_split(t, (const char *)buf, l / 2, special, print_piece, &first, &d)) {
                rc = die(&d);
                break;
            }
        } else {
            n = 0;
            if (k3_tok_encode(t, (const char *)buf, l / 2, special, &ids, &n, &cap, &d)) {
                rc = die(&d);
                break;
            }
            for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", (int)ids[i]);
        }
        putchar('\n');
    }
    if (in != stdin) fclose(in);
    free(line);
    free(buf);
    free(ids);
    k3_tok_free(t);
    if (fflush(stdout)) rc = 1;
    return rc;
}

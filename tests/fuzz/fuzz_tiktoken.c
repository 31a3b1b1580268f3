/*
 * fuzz_tiktoken.c - libFuzzer target: the input is a tiktoken.model
 * ("base64 rank" lines), loaded by k3_tok_load without a tokenizer_config.json.
 * A rejection must be a clean K3_ERR_FORMAT naming the file; an accepted
 * vocabulary must have every rank 0..n-1 exactly once with distinct bytes
 * (looked up back to its rank), all 256 single bytes, and must encode a fixed
 * text and the input itself losslessly.
 */
#include "tok_check.h"

#include "tokenizer_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    k3_tok *t;
    k3_diag d = {0};
    const char *path = fz_file(0, data, size);
    k3_err e = k3_tok_load(path, NULL, &t, &d);
    if (e) {
        fz_check_err(e, &d);
        FZ_EXPECT(e == K3_ERR_FORMAT || e == K3_ERR_NOMEM);
        FZ_EXPECT(strstr(d.msg, path) != NULL || e == K3_ERR_NOMEM);
        return 0;
    }
    uint32_t n = k3_tok_n_ranks(t);
    FZ_EXPECT(n >= 256 && k3_tok_n_ids(t) == n + 256);
    for (uint32_t r = 0; r < n; r++) {
        size_t bl;
        const uint8_t *b = k3_tok_bytes(t, (int32_t)r, &bl);
        FZ_EXPECT(b && bl > 0 && k3_tok_rank(t, b, bl) == r);
    }
    static const char text[] = "Hello, world! 你好 \xff\x00 <|end_of_msg|> 12345   x";
    fz_tok_round_trip(t, (const uint8_t *)text, sizeof text - 1, 0);
    fz_tok_round_trip(t, data, size, 1);
    fz_accepted("vocabulary");
    k3_tok_free(t);
    return 0;
}

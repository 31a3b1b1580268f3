/*
 * fuzz_tokenizer_config.c - libFuzzer target: the input is a
 * tokenizer_config.json, loaded by k3_tok_load beside the test vocabulary
 * (tests/reference/data/tiktoken.model: 3840 ranks, special ids 3840..4095).
 * A rejection must be a clean K3_ERR_FORMAT; an accepted config must name
 * distinct special ids inside the special range only (never a BPE rank), each
 * found back by its name, and special-token text must encode losslessly.
 */
#include "tok_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    k3_tok *t;
    k3_diag d = {0};
    const char *path = fz_file(0, data, size);
    k3_err e = k3_tok_load(K3_FUZZ_VOCAB, path, &t, &d);
    if (e) {
        fz_check_err(e, &d);
        FZ_EXPECT(e == K3_ERR_FORMAT || e == K3_ERR_NOMEM);
        return 0;
    }
    uint32_t n = k3_tok_n_ranks(t);
    FZ_EXPECT(n == 3840 && k3_tok_n_ids(t) == n + 256);
    /* every special's name, back to back: the text special-token matching sees */
    uint8_t *all = NULL;
    size_t len = 0;
    for (uint32_t id = n; id < n + 256; id++) {
        size_t bl;
        const uint8_t *b = k3_tok_bytes(t, (int32_t)id, &bl);
        FZ_EXPECT(b && bl > 0 && k3_tok_is_special(t, (int32_t)id));
        char name[4096];
        if (bl < sizeof name && !memchr(b, 0, bl)) {
            memcpy(name, b, bl);
            name[bl] = '\0';
            FZ_EXPECT(k3_tok_special_id(t, name) == (int32_t)id);
        }
        uint8_t *a = realloc(all, len + bl);
        FZ_EXPECT(a);
        all = a;
        memcpy(all + len, b, bl);
        len += bl;
    }
    FZ_EXPECT(!k3_tok_is_special(t, (int32_t)n - 1));
    fz_tok_round_trip(t, all, len, 1);
    fz_tok_round_trip(t, all, len, 0);
    free(all);
    fz_accepted("tokenizer config");
    k3_tok_free(t);
    return 0;
}

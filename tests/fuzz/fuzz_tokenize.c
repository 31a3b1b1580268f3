/*
 * fuzz_tokenize.c - libFuzzer target: k3run's tokenizer on arbitrary bytes
 * (invalid UTF-8, NUL, special-token text, long runs), encoded both without
 * and with special tokens (k3run --special). The tokenizer is the test
 * vocabulary (tests/reference/data/tiktoken.model, 3840 ranks) with K3's
 * released added tokens moved to its special range
 * (tests/fuzz/data/tokenizer_config.json). Every id must be in range and the
 * ids' bytes must give the input back (tok_check.h).
 */
#include "tok_check.h"

static k3_tok *g_tok;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_tok) {
        k3_diag d = {0};
        if (k3_tok_load(K3_FUZZ_VOCAB, K3_FUZZ_TOKCONFIG, &g_tok, &d)) {
            fprintf(stderr, "cannot load the fuzz tokenizer: %s\n", d.msg);
            abort();
        }
    }
    fz_tok_round_trip(g_tok, data, size, 0);
    fz_tok_round_trip(g_tok, data, size, 1);
    return 0;
}

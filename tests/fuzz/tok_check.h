/*
 * tok_check.h - shared by the tokenizer fuzz targets: encode bytes and check
 * that every id is in range, that without special tokens no special id comes
 * out, and that the ids' bytes concatenate back to the input exactly
 * (byte-level BPE loses nothing, whatever the bytes).
 */
#ifndef K3_FUZZ_TOK_CHECK_H
#define K3_FUZZ_TOK_CHECK_H

#include "fuzz_util.h"

#include "tokenizer.h"

static inline void fz_tok_round_trip(const k3_tok *t, const uint8_t *s, size_t n, int special)
{
    int32_t *ids = NULL;
    size_t m = 0, cap = 0, bl;
    k3_diag d = {0};
    k3_err e = k3_tok_encode(t, (const char *)s, n, special, &ids, &m, &cap, &d);
    if (e) {
        fz_check_err(e, &d);
        FZ_EXPECT(e == K3_ERR_NOMEM);       /* encode takes any bytes */
        free(ids);
        return;
    }
    FZ_EXPECT(m <= n && (m == 0) == (n == 0));
    size_t o = 0;
    for (size_t i = 0; i < m; i++) {
        FZ_EXPECT(ids[i] >= 0 && (uint32_t)ids[i] < k3_tok_n_ids(t));
        if (!special) FZ_EXPECT(!k3_tok_is_special(t, ids[i]));
        const uint8_t *b = k3_tok_bytes(t, ids[i], &bl);
        FZ_EXPECT(b && bl > 0 && o + bl <= n && !memcmp(s + o, b, bl));
        o += bl;
    }
    FZ_EXPECT(o == n);
    free(ids);
}

#endif

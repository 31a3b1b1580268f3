/*
 * fuzz_chat_render.c - libFuzzer target: k3run's chat renderer
 * (text/chat_render.c, chat_json.c) on arbitrary request bytes, with the fuzz
 * tokenizer (K3's added tokens at 3840.., tests/fuzz/data). A refusal must be
 * a clean K3_ERR_FORMAT / USAGE / NOMEM with a one-line message; a rendered
 * prompt must tile its ids with its pieces, control pieces one marker id each,
 * text pieces valid UTF-8 whose ids hold no special id and give their bytes back,
 * and the shared part (n_system) ending where a message opens.
 */
#include "fuzz_util.h"

#include "chat_render.h"
#include "k3_utf8.h"
#include "tokenizer.h"

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
    k3_chat_prompt p;
    k3_diag d = {0};
    k3_err e = k3_chat_render(g_tok, (const char *)data, size, "fuzz.json", &p, &d);
    if (e) {
        fz_check_err(e, &d);
        FZ_EXPECT(e == K3_ERR_FORMAT || e == K3_ERR_USAGE || e == K3_ERR_NOMEM);
        FZ_EXPECT(!p.ids && !p.pieces && !p.arena);
        return 0;
    }
    fz_accepted("rendered");
    size_t next = 0;
    for (size_t i = 0; i < p.n_pieces; i++) {
        const k3_chat_piece *pc = &p.pieces[i];
        FZ_EXPECT(pc->id0 == next && pc->id1 >= pc->id0 && pc->id1 <= p.n_ids);
        next = pc->id1;
        if (pc->special >= 0) {
            FZ_EXPECT(pc->id1 == pc->id0 + 1 && p.ids[pc->id0] == pc->special && k3_tok_is_special(g_tok, pc->special));
            continue;
        }
        FZ_EXPECT(pc->len > 0 && pc->id1 > pc->id0);
        const unsigned char *s = (const unsigned char *)p.arena + pc->off;
        for (size_t k = 0; k < pc->len;) {
            size_t l = s[k] < 0x80 ? 1 : k3_utf8_seq(s + k, pc->len - k, NULL);
            FZ_EXPECT(l > 0);
            k += l;
        }
        size_t o = 0, bl;
        for (uint32_t k = pc->id0; k < pc->id1; k++) {
            FZ_EXPECT(!k3_tok_is_special(g_tok, p.ids[k]));
            const uint8_t *b = k3_tok_bytes(g_tok, p.ids[k], &bl);
            FZ_EXPECT(b && o + bl <= pc->len && !memcmp(s + o, b, bl));
            o += bl;
        }
        FZ_EXPECT(o == pc->len);
    }
    FZ_EXPECT(next == p.n_ids);
    /* the part conversations share (the tools and system messages) ends where a message opens */
    FZ_EXPECT(p.n_system == 0 || (p.n_system < p.n_ids && p.ids[p.n_system] == k3_tok_special_id(g_tok, "<|open|>")));
    k3_chat_prompt_free(&p);
    return 0;
}

/*
 * draft.h - drafts from the sequence itself (prompt-lookup decoding): the
 * longest suffix of the sequence, up to nmax tokens, that also occurred
 * earlier proposes the tokens that followed its most recent earlier
 * occurrence. Nothing else is consulted: the same sequence always gives the
 * same draft.
 */
#ifndef K3_DRAFT_H
#define K3_DRAFT_H

#include <stdint.h>

/*
 * Look up a draft for hist[0 .. n): for m = nmax down to nmin, the latest j < n - 1 with
 * hist[j - m + 1 .. j] == hist[n - m .. n - 1]; the draft is hist[j + 1 ..], at most kmax
 * tokens and never past hist[n - 1] (a continuation may run into the suffix itself). Writes
 * the draft to out[0 .. return) and the match length to *match (0 with no draft).
 */
uint32_t k3_draft_lookup(const int32_t *hist, uint32_t n, uint32_t nmin, uint32_t nmax, uint32_t kmax,
                         int32_t *out, uint32_t *match);

#endif

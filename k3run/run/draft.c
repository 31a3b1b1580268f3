/* draft.c - see draft.h. A backward scan per length: O(n * nmax) compares per lookup, a few
   microseconds at a context of 4096, nothing beside a forward pass. */
#include "draft.h"

uint32_t k3_draft_lookup(const int32_t *hist, uint32_t n, uint32_t nmin, uint32_t nmax, uint32_t kmax,
                         int32_t *out, uint32_t *match)
{
    *match = 0;
    if (nmin < 1) nmin = 1;
    for (uint32_t m = nmax; m >= nmin && kmax; m--) {
        if (m >= n) continue;                          /* the suffix needs an earlier place to be */
        const int32_t *suf = hist + n - m;
        for (uint32_t j = n - 1; j-- > m - 1;) {       /* j: last index of a candidate, latest first */
            uint32_t i = 0;
            while (i < m && hist[j - i] == suf[m - 1 - i]) i++;
            if (i < m) continue;
            uint32_t k = 0;
            while (k < kmax && j + 1 + k < n) { out[k] = hist[j + 1 + k]; k++; }
            *match = m;
            return k;
        }
    }
    return 0;
}

/*
 * stopstr.c - stop strings over a stream of bytes (stopstr.h). The matcher
 * keeps one window: the held bytes, then up to max_len new ones. Each round
 * looks, byte by new byte, for the first stop string to end (stop), or else
 * the earliest position where one matches up to the window's end (hold from
 * there), outputs what comes before, and slides. A stop never lies wholly
 * inside the held part (it would have ended at one of its bytes when they
 * were new), and the held part is always shorter than max_len, so nothing is
 * allocated after init.
 */
#include "stopstr.h"

#include <stdlib.h>
#include <string.h>

k3_err k3_stopstr_init(k3_stopstr *s, const char *const *stops, size_t n_stops, k3_diag *d)
{
    memset(s, 0, sizeof *s);
    s->stopped = -1;
    for (size_t i = 0; i < n_stops; i++)
        if (!stops[i] || !stops[i][0])
            return k3_fail(d, K3_ERR_USAGE, "stop string %zu is empty", i + 1);
    if (!n_stops) return K3_OK;
    s->stop = calloc(n_stops, sizeof *s->stop);
    s->stop_len = calloc(n_stops, sizeof *s->stop_len);
    if (!s->stop || !s->stop_len) goto nomem;
    s->n_stops = n_stops;
    for (size_t i = 0; i < n_stops; i++) {
        size_t len = strlen(stops[i]);
        s->stop[i] = malloc(len);
        if (!s->stop[i]) goto nomem;
        memcpy(s->stop[i], stops[i], len);
        s->stop_len[i] = len;
        if (len > s->max_len) s->max_len = len;
    }
    if (s->max_len > SIZE_MAX / 2) goto nomem;
    s->win = malloc(2 * s->max_len);
    if (!s->win) goto nomem;
    return K3_OK;
nomem:
    k3_stopstr_free(s);
    return k3_fail(d, K3_ERR_NOMEM, "out of memory for %zu stop strings", n_stops);
}

void k3_stopstr_free(k3_stopstr *s)
{
    for (size_t i = 0; s->stop && i < s->n_stops; i++) free(s->stop[i]);
    free(s->stop);
    free(s->stop_len);
    free(s->win);
    memset(s, 0, sizeof *s);
    s->stopped = -1;
}

static void out(k3_stopstr_emit emit, void *ctx, const uint8_t *b, size_t n)
{
    if (emit && n) emit(ctx, b, n);
}

/*
 * The first stop string that ends in win[from..wn), in the order the bytes
 * came: its index, with *stop_at where it starts (of several ending at the
 * same byte, the one starting first); -1 if none ends there. Checking each
 * new byte as an end makes the result the same however the text is cut.
 */
static int find_stop(const k3_stopstr *s, size_t from, size_t wn, size_t *stop_at)
{
    for (size_t end = from + 1; end <= wn; end++) {
        int best = -1;
        for (size_t k = 0; k < s->n_stops; k++) {
            size_t len = s->stop_len[k];
            if (len > end || memcmp(s->win + end - len, s->stop[k], len)) continue;
            if (best < 0 || end - len < *stop_at) {
                best = (int)k;
                *stop_at = end - len;
            }
        }
        if (best >= 0) return best;
    }
    return -1;
}

/* The earliest position whose rest of win[0..wn) is a proper prefix of a stop string, or wn. */
static size_t hold_from(const k3_stopstr *s, size_t wn)
{
    for (size_t i = 0; i < wn; i++)
        for (size_t k = 0; k < s->n_stops; k++)
            if (s->stop_len[k] > wn - i && !memcmp(s->win + i, s->stop[k], wn - i)) return i;
    return wn;
}

int k3_stopstr_feed(k3_stopstr *s, const uint8_t *b, size_t n, k3_stopstr_emit emit, void *ctx)
{
    if (s->stopped >= 0) return 1;
    if (!s->n_stops) {
        out(emit, ctx, b, n);
        return 0;
    }
    while (n) {
        size_t take = 2 * s->max_len - s->held;      /* > max_len: held < max_len */
        if (take > n) take = n;
        memcpy(s->win + s->held, b, take);
        b += take;
        n -= take;
        size_t wn = s->held + take, stop_at = 0;
        int k = find_stop(s, s->held, wn, &stop_at);
        if (k >= 0) {
            out(emit, ctx, s->win, stop_at);
            s->stopped = k;
            s->held = 0;
            return 1;
        }
        size_t hold_at = hold_from(s, wn);
        out(emit, ctx, s->win, hold_at);
        s->held = wn - hold_at;
        memmove(s->win, s->win + hold_at, s->held);
    }
    return 0;
}

void k3_stopstr_finish(k3_stopstr *s, k3_stopstr_emit emit, void *ctx)
{
    if (s->stopped < 0) out(emit, ctx, s->win, s->held);
    s->held = 0;
}

int k3_stopstr_which(const k3_stopstr *s)
{
    return s->stopped;
}

size_t k3_stopstr_held(const k3_stopstr *s)
{
    return s->held;
}

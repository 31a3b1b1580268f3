/* k3_progress.c - progress line on a terminal. */
#include "k3_progress.h"
#include "k3_log.h"
#include "k3_sys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define K3_PROGRESS_PERIOD 0.2   /* seconds between redraws */

char *k3_human_bytes(double b, char *buf, int cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    while (b >= 1024.0 && u < 5) { b /= 1024.0; u++; }
    if (u == 0) snprintf(buf, (size_t)cap, "%.0f B", b);
    else snprintf(buf, (size_t)cap, "%.2f %s", b, units[u]);
    return buf;
}

void k3_progress_start(k3_progress *p, const char *label, uint64_t total)
{
    const char *off = getenv("K3_NO_PROGRESS");
    p->enabled = isatty(2) && k3_log_level() >= K3_LOG_NORMAL && !(off && *off && *off != '0');
    p->label = label;
    p->total = total;
    p->t_start = k3_now();
    p->t_last = 0;
    p->drawn = 0;
}

void k3_progress_update(k3_progress *p, uint64_t done, const char *detail)
{
    if (!p->enabled) return;
    double now = k3_now();
    if (p->drawn && now - p->t_last < K3_PROGRESS_PERIOD) return;
    p->t_last = now;
    double el = now - p->t_start;
    double rate = el > 0 ? (double)done / el : 0;
    char a[24], b[24], r[24], eta[32] = "", safe[256];
    if (detail) detail = k3_escape_ctl(detail, strlen(detail), safe, sizeof safe);   /* names from files */
    k3_human_bytes((double)done, a, sizeof a);
    k3_human_bytes(rate, r, sizeof r);
    if (p->total && rate > 0 && done <= p->total) {
        long s = (long)(((double)p->total - (double)done) / rate);
        snprintf(eta, sizeof eta, "  ETA %ld:%02ld", s / 60, s % 60);
    }
    if (p->total) {
        k3_human_bytes((double)p->total, b, sizeof b);
        fprintf(stderr, "\r\033[K%s: %s / %s  %3d%%  %s/s%s%s%s", p->label, a, b,
                (int)(100.0 * (double)done / (double)p->total), r, eta,
                detail ? "  " : "", detail ? detail : "");
    } else {
        fprintf(stderr, "\r\033[K%s: %s  %s/s%s%s", p->label, a, r,
                detail ? "  " : "", detail ? detail : "");
    }
    fflush(stderr);
    p->drawn = 1;
}

void k3_progress_end(k3_progress *p)
{
    if (p->enabled && p->drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
    p->drawn = 0;
}

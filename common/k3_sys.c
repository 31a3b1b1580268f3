/* k3_sys.c - clocks and process facts. */
#include "k3_sys.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

double k3_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t k3_peak_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmHWM:", 6) == 0) {
            unsigned long long v;
            if (sscanf(line + 6, "%llu", &v) == 1) kb = v;
            break;
        }
    }
    fclose(f);
    return kb * 1024;
}

/*
 * bench_membw - this machine's memory read bandwidth, for ratios in the
 * benchmarks: sums a 1 GiB buffer (already touched) with N OpenMP threads,
 * best of 5 passes. Prints GB/s (10^9 bytes/s) on stdout.
 *   bench_membw [THREADS] [MiB]
 */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_sys.h"

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : omp_get_num_procs();
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024;
    size_t n = mib << 17;                                /* uint64 words */
    uint64_t *buf = NULL;                               /* [n] */
    if (threads < 1 || posix_memalign((void **)&buf, 4096, n * 8)) return 1;
    memset(buf, 1, n * 8);
    omp_set_num_threads(threads);
    double best = 0;
    uint64_t sink = 0;
    for (int pass = 0; pass < 5; pass++) {
        double t0 = k3_now();
        uint64_t s = 0;
#pragma omp parallel for reduction(^ : s) schedule(static)
        for (size_t i = 0; i < n; i += 8) s ^= buf[i] + buf[i + 1] + buf[i + 2] + buf[i + 3] + buf[i + 4] +
                                               buf[i + 5] + buf[i + 6] + buf[i + 7];
        double gbs = n * 8 / (k3_now() - t0) / 1e9;
        if (gbs > best) best = gbs;
        sink ^= s;
    }
    printf("%.2f\n", best);
    free(buf);
    return sink == 42 ? 2 : 0;
}

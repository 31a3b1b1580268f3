/*
 * k3_par.h - a loop that runs on the OpenMP threads only when it is worth it.
 *
 * K3_PFOR(cond, for (...) body) runs the loop as "omp parallel for
 * schedule(static)" when cond holds and more than one thread may run, else as
 * a plain loop. Not `#pragma omp parallel if (cond)`: libgomp allocates and
 * frees a team for every region that runs with one thread, and the token loop
 * allocates nothing (tests/run/test_k3run_alloc.py). Each iteration's result
 * does not depend on the thread that computes it, so both forms give the same
 * bits.
 */
#ifndef K3_PAR_H
#define K3_PAR_H

#include <omp.h>

#define K3_PFOR(cond, ...)                                              \
    do {                                                                \
        if ((cond) && omp_get_max_threads() > 1) {                      \
            _Pragma("omp parallel for schedule(static)")                \
            __VA_ARGS__                                                 \
        } else {                                                        \
            __VA_ARGS__                                                 \
        }                                                               \
    } while (0)

#endif

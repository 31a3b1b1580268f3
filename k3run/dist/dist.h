/*
 * dist.h - the distribution room (k3run/dist/): k3run as several processes
 * launched by `mpirun -n R k3run ...` (Open MPI), each a "rank". Rank 0 is
 * the front end (CLI, chat, server, tokenizer, sampler, the trunk); the routed
 * experts of every MoE layer are divided among the ranks, expert e to rank
 * e % R (k3_dist_owner), and every rank reads, caches and multiplies only its
 * own. The engine sends each MoE layer's work out and gets the experts'
 * outputs back (engine/model_dist.c); what is combined, and in which order,
 * is rank 0's as in one process, so the text is the same at every rank count.
 *
 * This room is only the transport, a thin layer over MPI: a broadcast from
 * rank 0, point-to-point messages to and from rank 0, and a way to stop every
 * rank. Built without MPI (no Open MPI on the machine, or -DK3_MPI=OFF), it
 * is one rank and every call is a no-op or an error that says so.
 */
#ifndef K3_DIST_H
#define K3_DIST_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "k3_error.h"

/* Start: MPI_Init when this process was launched by mpirun (its environment says so), else one
   rank. Returns K3_OK, or an error when mpirun launched it but MPI cannot start (or this k3run
   was built without MPI: then every rank would run alone, so it refuses). */
k3_err k3_dist_init(int *argc, char ***argv, k3_diag *d);
void k3_dist_finalize(void);
int k3_dist_rank(void);                 /* 0 .. size-1; 0 without mpirun */
int k3_dist_size(void);                 /* 1 without mpirun */
int k3_dist_built(void);                /* 1 if this k3run has MPI support */

/* On a rank other than 0: stdout and stderr to /dev/null (every rank runs the same command line,
   so its messages would be rank 0's again), keeping the old stderr as k3_dist_err() for what only
   this rank can say. Returns nonzero if /dev/null cannot be opened. */
int k3_dist_quiet(void);
FILE *k3_dist_err(void);                /* this rank's own stderr (stderr on rank 0) */

/* The rule of who owns which expert (of any MoE layer), among n ranks whose experts are on ranks
   first..n-1 (first 0: every rank; 1: all but rank 0; one rank holds them all): the holders are
   those ranks, a rank's place is its index among them (-1: it holds none), and expert e belongs
   to the holder at place e % holders. The weights (which records a rank reads) and the planner
   (how many it plans for) use these, the engine k3_dist_owner. */
static inline int k3_expert_holders(int n, int first) { return n > 1 && n - first > 1 ? n - first : 1; }
static inline int k3_expert_place(int rank, int n, int first) { return n > 1 ? rank - first : 0; }
static inline int k3_expert_owner(uint32_t e, int n, int first)
{
    return (n > 1 ? first : 0) + (int)(e % (uint32_t)k3_expert_holders(n, first));
}
/* How many of experts 0..count-1 rank `rank` owns. */
static inline uint64_t k3_expert_share(uint64_t count, int rank, int n, int first)
{
    int p = k3_expert_place(rank, n, first);
    uint64_t h = (uint64_t)k3_expert_holders(n, first);
    return p >= 0 && count > (uint64_t)p ? (count - (uint64_t)p + h - 1) / h : 0;
}
/* The owner of expert e in this job: k3_expert_owner(e, k3_dist_size(), k3_dist_first()). */
int k3_dist_owner(uint32_t e);
/* 1 when rank 0 holds no experts (K3_RANK0_EXPERTS=0 and more than one rank), else 0. */
int k3_dist_first(void);

/* Collective: every rank calls it; n bytes of buf from rank 0 to all. */
k3_err k3_dist_bcast(void *buf, size_t n, k3_diag *d);
/* Point to point (tag: the message kind, the same on both sides). */
k3_err k3_dist_send(int to, int tag, const void *buf, size_t n, k3_diag *d);
k3_err k3_dist_recv(int from, int tag, void *buf, size_t n, k3_diag *d);
/* Every rank's 8 bytes into all[size] (an identity check at start). Collective. */
k3_err k3_dist_allgather64(uint64_t mine, uint64_t *all, k3_diag *d);
/* Bytes this rank has sent and received so far (broadcasts counted once per receiving rank on
   rank 0, as the network carries them from a root that sends to each). */
uint64_t k3_dist_bytes_sent(void);
uint64_t k3_dist_bytes_received(void);
/* Stop every rank now (after an error this rank cannot report to the others). */
void k3_dist_abort(int code);

#endif

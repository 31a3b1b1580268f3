/*
 * dist.c - the transport of dist.h over MPI (Open MPI: Debian's libopenmpi-dev,
 * `mpirun`), or one rank when built without it (K3_HAVE_MPI undefined).
 *
 * Why MPI and not sockets of our own: it is what clusters already run (their
 * launchers, their networks, InfiniBand included), it starts R processes with
 * their ranks and addresses, and it stops the whole job when one process dies
 * (mpirun kills the others), so a dead rank cannot leave rank 0 waiting
 * forever. k3 uses only blocking point-to-point messages, one broadcast and one
 * all-gather, on MPI_COMM_WORLD, from one thread per process (MPI_THREAD_FUNNELED).
 */
#include "dist.h"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef K3_HAVE_MPI
#include <mpi.h>
#endif

static int d_rank = 0, d_size = 1, d_first = 0;

int k3_dist_first(void) { return d_first; }
int k3_dist_owner(uint32_t e) { return k3_expert_owner(e, d_size, d_first); }


static FILE *d_err;
static uint64_t d_sent, d_recv;

uint64_t k3_dist_bytes_sent(void) { return d_sent; }
uint64_t k3_dist_bytes_received(void) { return d_recv; }

int k3_dist_rank(void) { return d_rank; }
FILE *k3_dist_err(void) { return d_err ? d_err : stderr; }

int k3_dist_quiet(void)
{
    int fd = open("/dev/null", O_WRONLY | O_CLOEXEC), keep = dup(2);
    if (fd < 0 || keep < 0) return 1;
    d_err = fdopen(keep, "w");
    fflush(NULL);
    int bad = dup2(fd, 1) < 0 || dup2(fd, 2) < 0;
    close(fd);
    return bad || !d_err;
}
int k3_dist_size(void) { return d_size; }

/* Launched by mpirun (Open MPI, or any PMI launcher)? */
static int launched(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

#ifdef K3_HAVE_MPI
static int d_mpi = 0;

/* K3_RANK0_EXPERTS=0: rank 0 keeps its memory for the trunk (README "Across machines"). */
static void read_first(void)
{
    const char *v = getenv("K3_RANK0_EXPERTS");
    d_first = d_size > 1 && v && !strcmp(v, "0");
}

int k3_dist_built(void) { return 1; }

static k3_err mpi_fail(k3_diag *d, int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    return k3_fail(d, K3_ERR_IO, "MPI (rank %d of %d): %s: %s", d_rank, d_size, what, msg);
}

k3_err k3_dist_init(int *argc, char ***argv, k3_diag *d)
{
    if (!launched()) return K3_OK;
    int provided = 0, rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return k3_fail(d, K3_ERR_IO, "mpirun launched k3run but MPI_Init failed (%d)", rc);
    d_mpi = 1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &d_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d_size);
    read_first();
    return K3_OK;
}

void k3_dist_finalize(void)
{
    if (d_mpi) MPI_Finalize();
    d_mpi = 0;
}

/* MPI counts are ints: large messages go in pieces of at most 1 GiB. */
#define PIECE ((size_t)1 << 30)

k3_err k3_dist_bcast(void *buf, size_t n, k3_diag *d)
{
    if (d_rank == 0) d_sent += (uint64_t)n * (uint64_t)(d_size - 1);
    else d_recv += n;
    for (size_t o = 0; d_size > 1 && o < n; o += PIECE) {
        int rc = MPI_Bcast((char *)buf + o, (int)(n - o < PIECE ? n - o : PIECE), MPI_BYTE, 0, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return mpi_fail(d, rc, "broadcast");
    }
    return K3_OK;
}

k3_err k3_dist_send(int to, int tag, const void *buf, size_t n, k3_diag *d)
{
    d_sent += n;
    for (size_t o = 0; o < n || o == 0; o += PIECE) {
        int rc = MPI_Send((const char *)buf + o, (int)(n - o < PIECE ? n - o : PIECE), MPI_BYTE, to, tag,
                          MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return mpi_fail(d, rc, "send");
        if (n == 0) break;
    }
    return K3_OK;
}

k3_err k3_dist_recv(int from, int tag, void *buf, size_t n, k3_diag *d)
{
    d_recv += n;
    for (size_t o = 0; o < n || o == 0; o += PIECE) {
        int rc = MPI_Recv((char *)buf + o, (int)(n - o < PIECE ? n - o : PIECE), MPI_BYTE, from, tag,
                          MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(d, rc, "receive");
        if (n == 0) break;
    }
    return K3_OK;
}

k3_err k3_dist_allgather64(uint64_t mine, uint64_t *all, k3_diag *d)
{
    if (d_size == 1) { all[0] = mine; return K3_OK; }
    int rc = MPI_Allgather(&mine, 8, MPI_BYTE, all, 8, MPI_BYTE, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? K3_OK : mpi_fail(d, rc, "all-gather");
}

void k3_dist_abort(int code)
{
    if (d_mpi) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

#else /* one rank: built without MPI */
int k3_dist_built(void) { return 0; }

k3_err k3_dist_init(int *argc, char ***argv, k3_diag *d)
{
    (void)argc;
    (void)argv;
    if (launched())
        return k3_fail(d, K3_ERR_USAGE, "mpirun launched k3run, but this k3run was built without MPI "
                       "(install libopenmpi-dev and rebuild: scripts/build.sh -DK3_MPI=ON)");
    return K3_OK;
}

void k3_dist_finalize(void) {}

static k3_err one_rank(k3_diag *d) { return k3_fail(d, K3_ERR_INTERNAL, "no other rank (built without MPI)"); }
k3_err k3_dist_bcast(void *buf, size_t n, k3_diag *d) { (void)buf; (void)n; (void)d; return K3_OK; }
k3_err k3_dist_send(int to, int tag, const void *buf, size_t n, k3_diag *d)
{
    (void)to; (void)tag; (void)buf; (void)n;
    return one_rank(d);
}
k3_err k3_dist_recv(int from, int tag, void *buf, size_t n, k3_diag *d)
{
    (void)from; (void)tag; (void)buf; (void)n;
    return one_rank(d);
}
k3_err k3_dist_allgather64(uint64_t mine, uint64_t *all, k3_diag *d)
{
    (void)d;
    all[0] = mine;
    return K3_OK;
}
void k3_dist_abort(int code) { exit(code); }
#endif

/* allreduce_mpi.c: Open MPI's collectives, float32 (sum where they reduce), for bench/allreduce:
 * MPI_Allreduce (MPI_IN_PLACE), MPI_Allgather, MPI_Reduce_scatter_block.
 *
 *   mpirun -np N --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo \
 *       allreduce_mpi --sizes 1024,4096 [--budget 0.3] [--collective allreduce]
 *
 * Timed by allreduce_timing.h. The orchestrator forces the ob1 PML with only the TCP BTL (the
 * UCX PML or the vader BTL would move the data through shared memory); as a check, rank 0 also
 * reports how many loopback TCP connections it opened after MPI_Init:
 *   I mpi tcp_connections_opened <k>
 * which is 0 if the data did not go over TCP (ob1/tcp connects lazily, on first use). */
#define _GNU_SOURCE
#include <dirent.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "allreduce_timing.h"

/* One call of d->coll: count as ar_count() gives it. */
static int mpi_run(void *ctx, size_t count)
{
    const ar_driver *d = ctx;
    int k = (int)count, rc;
    const char *what;
    if (d->coll == AR_ALLGATHER) {
        what = "MPI_Allgather";
        rc = MPI_Allgather(d->send, k, MPI_FLOAT, d->recv, k, MPI_FLOAT, MPI_COMM_WORLD);
    } else if (d->coll == AR_REDUCE_SCATTER) {
        what = "MPI_Reduce_scatter_block";
        rc = MPI_Reduce_scatter_block(d->send, d->recv, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else {
        what = "MPI_Allreduce";
        rc = MPI_Allreduce(MPI_IN_PLACE, d->recv, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    if (rc != MPI_SUCCESS)
        fprintf(stderr, "allreduce_mpi: %s of %zu floats failed (%d)\n", what, count, rc);
    return rc == MPI_SUCCESS ? 0 : -1;
}

static int mpi_max(void *ctx, int64_t *v, int n)
{
    (void)ctx;
    return MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD) ==
                   MPI_SUCCESS ? 0 : -1;
}

static int mpi_barrier(void *ctx)
{
    (void)ctx;
    return MPI_Barrier(MPI_COMM_WORLD) == MPI_SUCCESS ? 0 : -1;
}

/* Established TCP connections held by this process: the socket inodes among our descriptors
 * that /proc/net/tcp lists in state 01 (ESTABLISHED). */
static int tcp_connections(void)
{
    unsigned long inodes[256];
    int n = 0, found = 0;
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    while (d && (e = readdir(d)) && n < 256) {
        char path[300], link[64];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(path, link, sizeof link - 1);
        if (len > 0) {
            link[len] = 0;
            if (sscanf(link, "socket:[%lu]", &inodes[n]) == 1)
                n++;
        }
    }
    if (d)
        closedir(d);
    FILE *f = fopen("/proc/self/net/tcp", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        unsigned st;
        unsigned long ino;
        if (sscanf(line, "%*d: %*s %*s %x %*s %*s %*s %*s %*s %lu", &st, &ino) == 2 && st == 1)
            for (int i = 0; i < n; i++)
                found += inodes[i] == ino;
    }
    if (f)
        fclose(f);
    return found;
}

int main(int argc, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* die with mpirun, which dies with the orchestrator */
    size_t sizes[AR_MAX_SIZES];
    int n_sizes = -1;
    double budget = 0.3;
    int coll = AR_ALLREDUCE;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--sizes"))
            n_sizes = ar_parse_sizes(argv[i + 1], sizes, AR_MAX_SIZES);
        else if (!strcmp(argv[i], "--budget"))
            budget = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--collective"))
            coll = ar_coll_parse(argv[i + 1]);
    }
    if (n_sizes <= 0 || budget <= 0 || coll < 0) {
        fprintf(stderr, "usage: allreduce_mpi --sizes BYTES,BYTES... [--budget SECONDS] "
                        "[--collective allreduce|allgather|reduce_scatter]\n");
        return 2;
    }
    MPI_Init(&argc, &argv);
    int before = tcp_connections();
    ar_driver d = {.coll = coll};
    MPI_Comm_rank(MPI_COMM_WORLD, &d.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d.size);
    size_t max = 0;
    for (int i = 0; i < n_sizes; i++)
        max = sizes[i] > max ? sizes[i] : max;
    if (ar_alloc_bufs(&d, max)) {
        fprintf(stderr, "allreduce_mpi: cannot allocate the buffers for %zu bytes\n", max);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    d.ctx = &d;
    d.verify = 1;
    d.run = mpi_run;
    d.max_i64 = mpi_max;
    d.barrier = mpi_barrier;
    int rc = 0;
    for (int i = 0; i < n_sizes && !rc; i++)
        rc = ar_measure(&d, "mpi", "-", sizes[i], budget);
    if (d.rank == 0)
        printf("I mpi tcp_connections_opened %d\n", tcp_connections() - before);
    ar_free_bufs(&d);
    if (rc)
        MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
    return 0;
}

/* allreduce_timing.h: the one measurement loop behind every figure of bench/allreduce.
 *
 * Each driver (edl and the loopback ceiling in allreduce.c, Open MPI in allreduce_mpi.c, Gloo in
 * allreduce_gloo.cc) fills an ar_driver with its collective, its buffers and three operations
 * and calls ar_measure() per size, so every implementation is timed by the same rule
 * (docs/bench-allreduce.md):
 *
 *   1. rank r fills its input with small integers that depend on r (ar_fill), runs one call and
 *      checks every element of its output against the exact result (ar_wrong; exact in
 *      float32);
 *   2. warm-up: a fixed number of calls, whose mean time (the slowest rank's) sets how many calls
 *      fit the time budget (at least AR_MIN_CALLS);
 *   3. those calls run in up to AR_MAX_BATCHES batches, a barrier before each; a batch's time is
 *      its mean per call, the slowest rank's counts, and the figure is the median batch.
 *
 * A size is the bytes of the full buffer per rank, as nccl-tests count it: allreduce's buffer,
 * allgather's output, reduce_scatter's input. allgather and reduce_scatter cut it into n equal
 * parts of whole floats, rounded down (ar_count), and their figures count the bytes kept
 * (ar_bytes).
 *
 * Rank 0 prints one line per figure on stdout for the orchestrator:
 *   R <impl> <algorithm> <bytes asked> <median ns per call> <calls timed> ok|wrong
 * Usable from C and C++ (header-only: the drivers are separate programs). */
#ifndef EDL_BENCH_ALLREDUCE_TIMING_H
#define EDL_BENCH_ALLREDUCE_TIMING_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define AR_MIN_CALLS 3
#define AR_MAX_BATCHES 11
#define AR_MAX_SIZES 32

/* The collectives, by the name --collective takes. */
enum { AR_ALLREDUCE, AR_ALLGATHER, AR_REDUCE_SCATTER, AR_N_COLL };

static inline const char *ar_coll_name(int coll)
{
    static const char *const names[AR_N_COLL] = {"allreduce", "allgather", "reduce_scatter"};
    return coll >= 0 && coll < AR_N_COLL ? names[coll] : "?";
}

static inline int ar_coll_parse(const char *name)
{
    for (int i = 0; i < AR_N_COLL; i++)
        if (!strcmp(name, ar_coll_name(i)))
            return i;
    return -1;
}

/* Gloo's algorithms for each collective (allreduce_gloo.cc), all run by default. */
static inline const char *ar_gloo_algos(int coll)
{
    static const char *const algos[AR_N_COLL] = {
        "ring,ring_chunked,halving_doubling,bcube,new_ring,new_bcube", "ring,new_ring",
        "halving_doubling"};
    return coll >= 0 && coll < AR_N_COLL ? algos[coll] : "";
}

/* The parts the full buffer is cut into: 1 for allreduce, n (one per rank) for the others. */
static inline size_t ar_parts(int coll, int n)
{
    return coll == AR_ALLREDUCE ? 1 : (size_t)n;
}

/* The count a call of `coll` on a full buffer of `bytes` per rank passes: the elements of one
 * part, rounded down to whole floats (allreduce: all of them). */
static inline size_t ar_count(int coll, size_t bytes, int n)
{
    return bytes / sizeof(float) / ar_parts(coll, n);
}

/* The bytes of the full buffer that such a call really moves (bytes, or n rounded parts). */
static inline size_t ar_bytes(int coll, size_t bytes, int n)
{
    return ar_count(coll, bytes, n) * ar_parts(coll, n) * sizeof(float);
}

typedef struct ar_driver {
    void *ctx;
    int rank, size;
    int coll;     /* AR_ALLREDUCE, ... */
    /* touched before any timing, for the largest size (ar_alloc_bufs): allreduce in place
     * (send == recv, the full buffer); allgather: send one part, recv the full buffer;
     * reduce_scatter: send the full buffer, recv one part (may point into send where a
     * library leaves the result there) */
    float *send, *recv;
    int verify;   /* 0 for the ceiling, which moves bytes but reduces nothing */
    /* One float32 call of the collective (sum where it reduces) from send to recv, with the
     * count of ar_count(). 0, or -1 after printing why. */
    int (*run)(void *ctx, size_t count);
    /* Element-wise maximum of v[0..n) over all ranks, on every rank. 0 or -1. */
    int (*max_i64)(void *ctx, int64_t *v, int n);
    int (*barrier)(void *ctx);
} ar_driver;

static inline int64_t ar_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Allocate the largest buffer once and write every page of it: first touch of fresh memory is
 * slow on these VMs, and must not be charged to the first size that reaches it. */
static inline void *ar_alloc_touched(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? bytes : 1) != 0)
        return NULL;
    memset(p, 1, bytes);
    return p;
}

/* send and recv for the largest size, `max` bytes (see ar_driver). 0, or -1: out of memory. */
static inline int ar_alloc_bufs(ar_driver *d, size_t max)
{
    size_t part = ar_count(d->coll, max, d->size) * sizeof(float);
    d->send = (float *)ar_alloc_touched(d->coll == AR_ALLGATHER ? part : max);
    d->recv = d->coll == AR_ALLREDUCE ? d->send
              : (float *)ar_alloc_touched(d->coll == AR_REDUCE_SCATTER ? part : max);
    return d->send && d->recv ? 0 : -1;
}

static inline void ar_free_bufs(ar_driver *d)
{
    if (d->recv != d->send)
        free(d->recv);
    free(d->send);
    d->send = d->recv = NULL;
}

/* Element i of part b on rank r: (r + 1)(i mod 7 + 1) + 8b. allreduce has the one part 0;
 * allgather sends part 0 and receives rank j's as part j; reduce_scatter sends parts 0..n-1. */
static inline float ar_value(int r, int b, size_t i)
{
    return (float)((r + 1) * (int)(i % 7 + 1) + 8 * b);
}

static inline void ar_fill(const ar_driver *d, size_t count)
{
    int parts = d->coll == AR_REDUCE_SCATTER ? d->size : 1;
    for (int b = 0; b < parts; b++)
        for (size_t i = 0; i < count; i++)
            d->send[(size_t)b * count + i] = ar_value(d->rank, b, i);
}

/* Elements of recv that differ from the exact result. */
static inline int64_t ar_wrong(const ar_driver *d, size_t count)
{
    int64_t wrong = 0;
    int n = d->size;
    float ranks = (float)(n * (n + 1) / 2);
    if (d->coll == AR_ALLGATHER) {
        for (int j = 0; j < n; j++)
            for (size_t i = 0; i < count; i++)
                wrong += d->recv[(size_t)j * count + i] != ar_value(j, 0, i);
        return wrong;
    }
    int b = d->coll == AR_REDUCE_SCATTER ? d->rank : 0; /* the sum of every rank's part b */
    for (size_t i = 0; i < count; i++)
        wrong += d->recv[i] != (float)(i % 7 + 1) * ranks + (float)(8 * b * n);
    return wrong;
}

/* Parse "1024,4096,..." (bytes). Returns the number of sizes, or -1. */
static inline int ar_parse_sizes(const char *s, size_t *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        unsigned long long v = strtoull(s, &end, 10);
        if (end == s || v < 4 || v % 4)
            return -1;
        out[n++] = (size_t)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return *s ? -1 : n;
}

static inline int ar_cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Measure one size with the rule above; prints rank 0's line. 0, or -1 when an operation
 * failed (the driver should then exit non-zero). */
static inline int ar_measure(const ar_driver *d, const char *impl, const char *algo,
                             size_t bytes, double budget_s)
{
    size_t count = ar_count(d->coll, bytes, d->size);
    int64_t wrong = 0;
    if (!count) {
        fprintf(stderr, "%s: %zu bytes have no whole float per rank\n", impl, bytes);
        return -1;
    }
    if (d->verify)
        ar_fill(d, count);
    if (d->barrier(d->ctx) || d->run(d->ctx, count))
        return -1;
    if (d->verify)
        wrong = ar_wrong(d, count);

    int warm = bytes <= 65536 ? 50 : bytes <= (4u << 20) ? 5 : 1;
    if (d->barrier(d->ctx))
        return -1;
    int64_t t0 = ar_now_ns();
    for (int i = 0; i < warm; i++)
        if (d->run(d->ctx, count))
            return -1;
    int64_t v[2] = {(ar_now_ns() - t0) / warm, wrong};
    if (v[0] < 1)
        v[0] = 1;
    if (d->max_i64(d->ctx, v, 2))
        return -1;

    /* Same inputs on every rank, so every rank computes the same plan. */
    int64_t calls = (int64_t)(budget_s * 1e9) / v[0];
    if (calls < AR_MIN_CALLS)
        calls = AR_MIN_CALLS;
    if (calls > 1000000)
        calls = 1000000;
    int batches = calls < AR_MAX_BATCHES ? (int)calls : AR_MAX_BATCHES;
    int64_t per = (calls + batches - 1) / batches;
    int64_t t[AR_MAX_BATCHES];
    for (int b = 0; b < batches; b++) {
        if (d->barrier(d->ctx))
            return -1;
        int64_t s = ar_now_ns();
        for (int64_t i = 0; i < per; i++)
            if (d->run(d->ctx, count))
                return -1;
        t[b] = (ar_now_ns() - s) / per;
    }
    if (d->max_i64(d->ctx, t, batches))
        return -1;
    qsort(t, (size_t)batches, sizeof t[0], ar_cmp_i64);
    if (d->rank == 0) {
        printf("R %s %s %zu %lld %lld %s\n", impl, algo, bytes, (long long)t[batches / 2],
               (long long)(per * batches), v[1] ? "wrong" : "ok");
        fflush(stdout);
    }
    return 0;
}

#endif

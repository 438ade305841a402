/* allreduce_timing.h: the one measurement loop behind every figure of bench/allreduce.
 *
 * Each driver (edl and the loopback ceiling in allreduce.c, Open MPI in allreduce_mpi.c, Gloo in
 * allreduce_gloo.cc) fills an ar_driver with three operations and calls ar_measure() per size,
 * so every implementation is timed by the same rule (docs/bench-allreduce.md):
 *
 *   1. rank r fills element i with (r + 1) * (i % 7 + 1), runs one call and checks every element
 *      against the exact sum (i % 7 + 1) * n(n+1)/2 (small integers: exact in float32);
 *   2. warm-up: a fixed number of calls, whose mean time (the slowest rank's) sets how many calls
 *      fit the time budget (at least AR_MIN_CALLS);
 *   3. those calls run in up to AR_MAX_BATCHES batches, a barrier before each; a batch's time is
 *      its mean per call, the slowest rank's counts, and the figure is the median batch.
 *
 * Rank 0 prints one line per figure on stdout for the orchestrator:
 *   R <impl> <algorithm> <bytes> <median ns per call> <calls timed> ok|wrong
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

typedef struct ar_driver {
    void *ctx;
    int rank, size;
    float *buf;   /* at least the largest size, touched before any timing */
    int verify;   /* 0 for the ceiling, which moves bytes but reduces nothing */
    /* One float32 sum allreduce, in place, of buf[0..count). 0, or -1 after printing why. */
    int (*allreduce)(void *ctx, size_t count);
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

static inline void ar_fill(const ar_driver *d, size_t count)
{
    for (size_t i = 0; i < count; i++)
        d->buf[i] = (float)((d->rank + 1) * (int)(i % 7 + 1));
}

static inline int64_t ar_wrong(const ar_driver *d, size_t count)
{
    int64_t wrong = 0;
    float ranks = (float)(d->size * (d->size + 1) / 2);
    for (size_t i = 0; i < count; i++)
        wrong += d->buf[i] != (float)(i % 7 + 1) * ranks;
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
    size_t count = bytes / sizeof(float);
    int64_t wrong = 0;
    if (d->verify)
        ar_fill(d, count);
    if (d->barrier(d->ctx) || d->allreduce(d->ctx, count))
        return -1;
    if (d->verify)
        wrong = ar_wrong(d, count);

    int warm = bytes <= 65536 ? 50 : bytes <= (4u << 20) ? 5 : 1;
    if (d->barrier(d->ctx))
        return -1;
    int64_t t0 = ar_now_ns();
    for (int i = 0; i < warm; i++)
        if (d->allreduce(d->ctx, count))
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
            if (d->allreduce(d->ctx, count))
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

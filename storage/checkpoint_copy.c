/* checkpoint_copy.c: the snapshot of a save, the copy of the caller's shards into staging.
 *
 * The copy is the whole of the training stall when the caller waits for it, so it runs at
 * memory speed: the host shards are treated as one run of bytes split evenly over up to
 * `threads` threads (one memcpy stream per core: a single core reaches about 60 % of what two
 * do here), and device shards are queued first as asynchronous CUDA copies into pinned
 * staging, so that the GPU's copy engine runs beside the host threads. In the foreground the
 * calling thread is one of the copying threads and returns when everything is copied; in the
 * background every slice has its own thread and ckpt_snapshot_wait() waits for them. */
#define _GNU_SOURCE
#include "checkpoint_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIN_SLICE (16u << 20) /* a thread is worth starting for this much memory to copy */
#define MAX_THREADS 64

typedef struct slice {
    ckpt_snapshot *snap;
    size_t from, to; /* byte range over the host copies taken as one run */
} slice;

struct ckpt_snapshot {
    ckpt_copy *copies;
    size_t n;
    void *stream;          /* the CUDA stream of the device copies (NULL: none) */
    pthread_t threads[MAX_THREADS];
    slice slices[MAX_THREADS];
    int n_threads;         /* started threads, joined by ckpt_snapshot_free */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int running;           /* slices (and the device sync) not finished yet */
    int rc;
    char err[512];
};

/* Copy the bytes [from, to) of the host copies taken end to end. */
static void copy_range(const ckpt_copy *c, size_t n, size_t from, size_t to)
{
    size_t base = 0;
    for (size_t i = 0; i < n && base < to; i++) {
        if (c[i].device)
            continue;
        size_t lo = from > base ? from - base : 0;
        size_t hi = to - base < c[i].len ? to - base : c[i].len;
        if (lo < hi)
            memcpy(c[i].dst + lo, (const char *)c[i].src + lo, hi - lo);
        base += c[i].len;
    }
}

static void finish(ckpt_snapshot *s, int rc, const char *err)
{
    pthread_mutex_lock(&s->mu);
    if (rc != 0 && s->rc == 0) {
        s->rc = rc;
        snprintf(s->err, sizeof s->err, "%s", err);
    }
    if (--s->running == 0)
        pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* The device copies are done once their stream is: slice 0's thread waits for it. */
static void run_slice(slice *sl, bool syncs_device)
{
    ckpt_snapshot *s = sl->snap;
    copy_range(s->copies, s->n, sl->from, sl->to);
    char err[512] = "";
    int rc = syncs_device && s->stream ? ckpt_cuda_sync(s->stream, err, sizeof err) : 0;
    finish(s, rc, err);
}

static void *slice_main(void *arg)
{
    slice *sl = arg;
    run_slice(sl, sl == &sl->snap->slices[0]);
    return NULL;
}

/* Queue the device copies on a stream of their own (pinned staging: truly asynchronous). */
static int queue_device(ckpt_snapshot *s, char *err, size_t errlen)
{
    for (size_t i = 0; i < s->n; i++) {
        if (!s->copies[i].device)
            continue;
        int rc = ckpt_cuda_copy_async(&s->stream, s->copies[i].dst, s->copies[i].src,
                                      s->copies[i].len, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* How many threads for host_bytes: at most `threads`, none below MIN_SLICE each (one at least). */
static int slices_for(size_t host_bytes, int threads)
{
    size_t by_size = host_bytes / MIN_SLICE + 1;
    int k = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    return by_size < (size_t)k ? (int)by_size : k;
}

static void split(ckpt_snapshot *s, size_t host_bytes, int k)
{
    for (int t = 0; t < k; t++)
        s->slices[t] = (slice){.snap = s, .from = host_bytes / (size_t)k * (size_t)t,
                               .to = t == k - 1 ? host_bytes : host_bytes / (size_t)k * (size_t)(t + 1)};
}

int ckpt_snapshot_start(ckpt_copy *copies, size_t n, int threads, bool background,
                        ckpt_snapshot **out, char *err, size_t errlen)
{
    ckpt_snapshot *s = calloc(1, sizeof *s);
    if (!s) {
        free(copies);
        return edl_errf(err, errlen, EDL_ENOMEM, "no memory for the checkpoint's copy");
    }
    s->copies = copies;
    s->n = n;
    pthread_mutex_init(&s->mu, NULL);
    edl_cond_init(&s->cv);
    *out = s;
    int rc = queue_device(s, err, errlen);
    if (rc != 0) {
        if (s->stream)
            ckpt_cuda_sync(s->stream, NULL, 0); /* what was queued lands before staging is reused */
        return rc;
    }
    size_t host = 0;
    for (size_t i = 0; i < n; i++)
        host += copies[i].device ? 0 : copies[i].len;
    /* As many threads in the background as in the foreground, though the caller goes on
     * training beside them: a memory-bound step shares the memory's bandwidth with the copy
     * either way, and the faster copy frees it sooner (on 2 cores, one background thread
     * instead of two blocked the caller 6 % of the save instead of 4.5 %, and slowed the
     * step twice as much). */
    int k = slices_for(host, threads);
    split(s, host, k);
    s->running = k;
    int first_own = background ? 0 : 1; /* the caller copies slice 0 itself in the foreground */
    for (int t = first_own; t < k; t++) {
        if (pthread_create(&s->threads[s->n_threads], NULL, slice_main, &s->slices[t]) == 0)
            s->n_threads++;
        else
            run_slice(&s->slices[t], t == 0); /* no thread: copy it here, still correct */
    }
    if (!background) {
        run_slice(&s->slices[0], true);
        rc = ckpt_snapshot_wait(s, -1);
        if (rc != 0)
            snprintf(err, errlen, "%s", s->err);
    }
    return rc;
}

int ckpt_snapshot_wait(ckpt_snapshot *s, int64_t timeout_ms)
{
    if (!s)
        return 0;
    int64_t deadline = edl_deadline_ms(timeout_ms);
    pthread_mutex_lock(&s->mu);
    while (s->running > 0 && edl_cond_wait_until(&s->cv, &s->mu, deadline)) {
    }
    int rc = s->running > 0 ? EDL_ETIMEDOUT : s->rc;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

const char *ckpt_snapshot_errmsg(const ckpt_snapshot *s)
{
    return s ? s->err : "";
}

void ckpt_snapshot_free(ckpt_snapshot *s)
{
    if (!s)
        return;
    for (int t = 0; t < s->n_threads; t++)
        pthread_join(s->threads[t], NULL);
    if (s->stream)
        ckpt_cuda_stream_free(s->stream);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->copies);
    free(s);
}

/* nccl.c: the NCCL back end of libedlcoll (see nccl_backend.h and docs/collective-nccl.md).
 *
 * One coll_nccl is one process's NCCL communicator for one generation, with its own CUDA
 * stream and completion event. Nothing here ever blocks without a bound: communicator creation
 * is non-blocking (config.blocking = 0) and polled against the deadline, and every collective
 * is waited for by polling its event and the communicator's asynchronous error. A communicator
 * that failed or timed out is only ever aborted (ncclCommAbort), never destroyed or finalized.
 *
 * Rank translation: the generation's ranks are what callers use. A fresh init gives every
 * member NCCL rank = generation rank. ncclCommShrink numbers the survivors in the order of
 * their parent ranks, so the shrink fast path is taken only when the generation kept that
 * order (prev_rank[] increasing); otherwise a fresh init is used, so allgather and
 * reduce-scatter blocks are always in generation order. The table to_nccl[] still maps every
 * root. */
#define _GNU_SOURCE
#include "nccl_backend.h"
#include "edl/job.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
/* nccl.h declares a few functions as f() (not f(void)): keep -Wstrict-prototypes for ours. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#ifndef NCCL_MAJOR
#error "<nccl.h> is not NCCL's: its include directory must come before collective/"
#endif

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "the NCCL back end needs NCCL >= 2.14 (non-blocking communicators that can be aborted)"
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
#define EDL_NCCL_HAVE_SHRINK 1
#else
#define EDL_NCCL_HAVE_SHRINK 0
#endif

#define ID_KEY EDL_GEN_NCCL_ID

struct coll_nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t done;
    int device;
    int rank, size;     /* in the generation */
    int *to_nccl;       /* generation rank -> NCCL rank */
    int broken;         /* a collective failed: only coll_nccl_abort() is left */
    void (*on_wait)(void *arg); /* ctx's: told while a collective waits */
    void *arg;
};

/* ---- messages and time --------------------------------------------------------------------- */

/* The message of a failure, in the caller's buffer. */
#define say(msg, len, ...) ((void)edl_errf(msg, len, 0, __VA_ARGS__))

static int cuda_fail(char *msg, size_t len, const char *call, cudaError_t e)
{
    say(msg, len, "%s: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
    return EDL_EIO;
}

/* A failed NCCL call: remote and system errors mean a peer or the network went away. */
static int nccl_fail(char *msg, size_t len, const char *call, ncclResult_t r, ncclComm_t comm)
{
    const char *last = ncclGetLastError(comm);
    say(msg, len, "%s: %s%s%s", call, ncclGetErrorString(r), last && *last ? ": " : "",
        last ? last : "");
    if (r == ncclRemoteError || r == ncclSystemError)
        return EDL_EPEER;
    return EDL_EIO;
}

static int64_t deadline_after(int timeout_ms)
{
    return edl_monotonic_ms() + (timeout_ms > 0 ? timeout_ms : 0);
}

static int remaining_ms(int64_t deadline)
{
    int64_t left = deadline - edl_monotonic_ms();
    return left <= 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left;
}

/* Back off from 20 us to 1 ms: small collectives finish within microseconds, stuck ones
 * should not burn a core. */
static void nap(long *ns)
{
    struct timespec ts = {0, *ns};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    if (*ns < 1000000)
        *ns = *ns * 2 > 1000000 ? 1000000 : *ns * 2;
}

/* ---- device and communicator state --------------------------------------------------------- */

int coll_nccl_usable(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky "no driver" so later calls start clean */
        return 0;
    }
    return n > 0;
}

/* Poll a communicator that an init, split or shrink left ncclInProgress until it settles or
 * the deadline passes. 0: ready. On a failure or timeout the caller aborts comm. */
static int wait_comm_ready(ncclComm_t comm, const char *call, int64_t deadline, char *msg,
                           size_t len)
{
    long ns = 20000;
    for (;;) {
        ncclResult_t st = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(comm, &st);
        if (r != ncclSuccess)
            return nccl_fail(msg, len, "ncclCommGetAsyncError", r, comm);
        if (st == ncclSuccess)
            return 0;
        if (st != ncclInProgress)
            return nccl_fail(msg, len, call, st, comm);
        if (edl_monotonic_ms() >= deadline) {
            say(msg, len, "%s: not complete within the deadline (a member did not join)", call);
            return EDL_ETIMEDOUT;
        }
        nap(&ns);
    }
}

static void abort_comm(ncclComm_t comm)
{
    if (comm)
        (void)ncclCommAbort(comm); /* the handle is gone either way; nothing to do on failure */
}

void coll_nccl_abort(coll_nccl *n)
{
    if (!n)
        return;
    (void)cudaSetDevice(n->device); /* abort and the frees below act on the current device */
    abort_comm(n->comm);
    if (n->done)
        (void)cudaEventDestroy(n->done);
    if (n->stream)
        (void)cudaStreamDestroy(n->stream);
    free(n->to_nccl);
    free(n);
}

/* Allocate the handle with its stream and event on ctx->device; comm is filled in later. */
static int new_handle(const coll_nccl_ctx *ctx, coll_nccl **out, char *msg, size_t len)
{
    coll_nccl *n = calloc(1, sizeof *n);
    int *map = calloc((size_t)ctx->size, sizeof *map);
    if (!n || !map) {
        free(n);
        free(map);
        say(msg, len, "out of memory for the NCCL communicator of %d ranks", ctx->size);
        return EDL_ENOMEM;
    }
    n->device = ctx->device;
    n->rank = ctx->rank;
    n->size = ctx->size;
    n->to_nccl = map;
    n->on_wait = ctx->on_wait;
    n->arg = ctx->arg;
    for (int r = 0; r < ctx->size; r++)
        map[r] = r;
    cudaError_t e = cudaSetDevice(ctx->device);
    if (e != cudaSuccess) {
        coll_nccl_abort(n);
        return cuda_fail(msg, len, "cudaSetDevice", e);
    }
    /* A blocking stream (default flags) orders our work after what the caller queued on the
     * legacy default stream, so buffers filled by cudaMemcpy or default-stream kernels are
     * ready when the collective starts. */
    e = cudaStreamCreateWithFlags(&n->stream, cudaStreamDefault);
    if (e != cudaSuccess) {
        n->stream = NULL;
        coll_nccl_abort(n);
        return cuda_fail(msg, len, "cudaStreamCreateWithFlags", e);
    }
    e = cudaEventCreateWithFlags(&n->done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        n->done = NULL;
        coll_nccl_abort(n);
        return cuda_fail(msg, len, "cudaEventCreateWithFlags", e);
    }
    *out = n;
    return 0;
}

static ncclConfig_t nonblocking_config(void)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    return cfg;
}

/* ---- opening a generation ------------------------------------------------------------------ */

/* Rank 0 makes the id and publishes it under the generation's key; the others wait for it. */
static int exchange_id(const coll_nccl_ctx *ctx, ncclUniqueId *id, int64_t deadline, char *msg,
                       size_t len)
{
    if (ctx->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(id);
        if (r != ncclSuccess)
            return nccl_fail(msg, len, "ncclGetUniqueId", r, NULL);
        int rc = ctx->kv_put(ctx->arg, ID_KEY, id, sizeof *id);
        if (rc != 0)
            say(msg, len, "publishing the NCCL unique id of generation %lld: %s",
                (long long)ctx->generation, edl_strerror(rc));
        return rc;
    }
    char *val = NULL;
    size_t vlen = 0;
    int rc = ctx->kv_wait(ctx->arg, ID_KEY, &val, &vlen, remaining_ms(deadline));
    if (rc != 0) {
        say(msg, len, "waiting for rank 0's NCCL unique id of generation %lld: %s",
            (long long)ctx->generation, edl_strerror(rc));
        free(val);
        return rc;
    }
    if (!val || vlen != sizeof *id) {
        say(msg, len, "the NCCL unique id of generation %lld has %zu bytes, expected %zu",
            (long long)ctx->generation, vlen, sizeof *id);
        free(val);
        return EDL_EPROTO;
    }
    memcpy(id, val, sizeof *id);
    free(val);
    return 0;
}

static int open_fresh(const coll_nccl_ctx *ctx, coll_nccl *n, int64_t deadline, char *msg,
                      size_t len)
{
    ncclUniqueId id;
    int rc = exchange_id(ctx, &id, deadline, msg, len);
    if (rc != 0)
        return rc;
    ncclConfig_t cfg = nonblocking_config();
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, ctx->size, id, ctx->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = nccl_fail(msg, len, "ncclCommInitRankConfig", r, comm);
        abort_comm(comm);
        return rc;
    }
    if (!comm) {
        say(msg, len, "ncclCommInitRankConfig: %s but no communicator", ncclGetErrorString(r));
        return EDL_EIO;
    }
    rc = wait_comm_ready(comm, "ncclCommInitRankConfig", deadline, msg, len);
    if (rc != 0) {
        abort_comm(comm);
        return rc;
    }
    n->comm = comm;
    return 0;
}

#if EDL_NCCL_HAVE_SHRINK
/* The shrink fast path applies when every member was in prev, prev is on this device, this
 * process held prev_rank[rank] in it, and the generation kept the survivors' order (see the
 * file comment). Every member computes the same answer from the same prev_rank[]. */
static int shrink_applies(const coll_nccl_ctx *ctx, const coll_nccl *prev)
{
    if (!prev || !prev->comm || !ctx->prev_rank || ctx->size > prev->size)
        return 0;
    if (prev->device != ctx->device || ctx->prev_rank[ctx->rank] != prev->rank)
        return 0;
    for (int i = 0; i < ctx->size; i++) {
        int p = ctx->prev_rank[i];
        if (p < 0 || p >= prev->size || (i > 0 && p <= ctx->prev_rank[i - 1]))
            return 0;
    }
    return 1;
}

/* The parent's ranks that are not in the generation, in increasing order. */
static int *excluded_ranks(const coll_nccl_ctx *ctx, int prev_size, int *count)
{
    int *ex = malloc((size_t)prev_size * sizeof *ex + sizeof *ex);
    if (!ex)
        return NULL;
    int k = 0, i = 0;
    for (int p = 0; p < prev_size; p++) {
        if (i < ctx->size && ctx->prev_rank[i] == p)
            i++;
        else
            ex[k++] = p;
    }
    *count = k;
    return ex;
}

static int open_shrink(const coll_nccl_ctx *ctx, coll_nccl *prev, coll_nccl *n,
                       int64_t deadline, char *msg, size_t len)
{
    int nex = 0;
    int *ex = excluded_ranks(ctx, prev->size, &nex);
    if (!ex) {
        say(msg, len, "out of memory for the excluded ranks");
        return EDL_ENOMEM;
    }
    ncclConfig_t cfg = nonblocking_config();
    ncclComm_t child = NULL;
    ncclResult_t r = ncclCommShrink(prev->comm, ex, nex, &child, &cfg, NCCL_SHRINK_ABORT);
    free(ex);
    int rc;
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = nccl_fail(msg, len, "ncclCommShrink", r, prev->comm);
        abort_comm(child);
        return rc;
    }
    if (!child) {
        say(msg, len, "ncclCommShrink: %s but no communicator", ncclGetErrorString(r));
        return EDL_EIO;
    }
    rc = wait_comm_ready(child, "ncclCommShrink", deadline, msg, len);
    if (rc != 0) {
        abort_comm(child);
        return rc;
    }
    /* NCCL numbers the survivors in parent order; the generation kept it (shrink_applies),
     * so the table stays the identity. Check what NCCL says anyway. */
    int urank = -1, ucount = -1;
    if (ncclCommUserRank(child, &urank) != ncclSuccess || ncclCommCount(child, &ucount) !=
        ncclSuccess || urank != ctx->rank || ucount != ctx->size) {
        say(msg, len, "ncclCommShrink: child has rank %d of %d, expected %d of %d", urank,
            ucount, ctx->rank, ctx->size);
        abort_comm(child);
        return EDL_EIO;
    }
    n->comm = child;
    return 0;
}
#endif

/* The generation has prev's members at prev's ranks: there is nothing to rebuild (and NCCL
 * refuses a shrink that excludes nobody: ncclInvalidArgument). Every member decides alike from
 * the same prev_rank[]; the core passes none when any member's communicator is broken. */
static int unchanged(const coll_nccl_ctx *ctx, const coll_nccl *prev)
{
    if (!prev || !prev->comm || prev->broken || !ctx->prev_rank || ctx->size != prev->size ||
        prev->device != ctx->device || prev->rank != ctx->rank)
        return 0;
    for (int i = 0; i < ctx->size; i++)
        if (ctx->prev_rank[i] != i)
            return 0;
    return 1;
}

int coll_nccl_size(const coll_nccl *n)
{
    return n ? n->size : 0;
}

int coll_nccl_is_broken(const coll_nccl *n)
{
    return n && n->broken;
}

static int check_ctx(const coll_nccl_ctx *ctx, char *msg, size_t len)
{
    if (!ctx || ctx->size < 1 || ctx->rank < 0 || ctx->rank >= ctx->size || ctx->device < 0 ||
        !ctx->kv_put || !ctx->kv_wait) {
        say(msg, len, "coll_nccl_open: invalid context (rank %d of %d, device %d)",
            ctx ? ctx->rank : -1, ctx ? ctx->size : -1, ctx ? ctx->device : -1);
        return EDL_EINVAL;
    }
    return 0;
}

int coll_nccl_open(const coll_nccl_ctx *ctx, coll_nccl *prev, coll_nccl **out, char *msg,
                   size_t msg_len)
{
    if (out)
        *out = NULL;
    int rc = check_ctx(ctx, msg, msg_len);
    if (rc != 0 || !out) {
        coll_nccl_abort(prev);
        return rc != 0 ? rc : EDL_EINVAL;
    }
    if (unchanged(ctx, prev)) {
        prev->on_wait = ctx->on_wait;
        prev->arg = ctx->arg;
        *out = prev; /* the same communicator serves the new generation */
        return 0;
    }
    int64_t deadline = deadline_after(ctx->timeout_ms);
    coll_nccl *n = NULL;
    rc = new_handle(ctx, &n, msg, msg_len);
    if (rc != 0) {
        coll_nccl_abort(prev);
        return rc;
    }
    int shrunk = 0;
    char why[512] = "";
#if EDL_NCCL_HAVE_SHRINK
    /* A failed shrink falls back to a fresh init. Should only some members fail, the others
     * wait in vain for their peers and time out: the generation is then declared dead. */
    if (shrink_applies(ctx, prev))
        shrunk = open_shrink(ctx, prev, n, deadline, why, sizeof why) == 0;
#endif
    coll_nccl_abort(prev); /* consumed in every case; after a shrink the child is independent */
    if (!shrunk) {
        (void)cudaSetDevice(ctx->device);
        rc = open_fresh(ctx, n, deadline, msg, msg_len);
        if (rc != 0) {
            if (why[0] && msg && msg_len) {
                size_t used = strlen(msg);
                say(msg + used, msg_len - used, " (after the shrink fast path failed: %s)", why);
            }
            coll_nccl_abort(n);
            return rc;
        }
    }
    *out = n;
    return 0;
}

/* ---- collectives ------------------------------------------------------------------------- */

/* The NCCL type and its size in bytes (this back end links without the core's tables). */
static int map_dtype(edl_dtype dt, ncclDataType_t *out, size_t *size)
{
    switch (dt) {
    case EDL_FLOAT32: *out = ncclFloat32; *size = 4; return 0;
    case EDL_FLOAT16: *out = ncclFloat16; *size = 2; return 0;
    case EDL_BFLOAT16: *out = ncclBfloat16; *size = 2; return 0;
    case EDL_INT32: *out = ncclInt32; *size = 4; return 0;
    case EDL_INT64: *out = ncclInt64; *size = 8; return 0;
    case EDL_UINT8: *out = ncclUint8; *size = 1; return 0;
    }
    return EDL_EINVAL;
}

/* AVG on integers is NCCL's own ncclAvg: it sums, then divides by the rank count with C
 * integer division (truncated toward zero), which is what collective.h promises. */
static int map_op(edl_redop op, edl_dtype dt, ncclRedOp_t *out)
{
    if (dt == EDL_UINT8)
        return EDL_EINVAL; /* raw bytes are not reduced */
    switch (op) {
    case EDL_SUM: *out = ncclSum; return 0;
    case EDL_AVG: *out = ncclAvg; return 0;
    case EDL_MAX: *out = ncclMax; return 0;
    }
    return EDL_EINVAL;
}

/* The enqueue call returned r. On a non-blocking communicator ncclInProgress means the
 * operation is still being enqueued: nothing else may be issued until the state settles. */
static int settle_enqueue(coll_nccl *n, const char *call, ncclResult_t r, int64_t deadline,
                          char *msg, size_t len)
{
    if (r == ncclSuccess)
        return 0;
    if (r != ncclInProgress)
        return nccl_fail(msg, len, call, r, n->comm);
    int rc = wait_comm_ready(n->comm, call, deadline, msg, len);
    if (rc == EDL_ETIMEDOUT)
        say(msg, len, "%s: still being enqueued after the timeout", call);
    return rc;
}

/* Wait for everything queued on the stream, polling the event and the communicator's async
 * error; never an unbounded stream synchronize. */
static int wait_done(coll_nccl *n, const char *call, int64_t deadline, int timeout_ms,
                     char *msg, size_t len)
{
    cudaError_t e = cudaEventRecord(n->done, n->stream);
    if (e != cudaSuccess)
        return cuda_fail(msg, len, "cudaEventRecord", e);
    long ns = 20000;
    for (int spins = 0;; spins++) {
        e = cudaEventQuery(n->done);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady)
            return cuda_fail(msg, len, "cudaEventQuery", e);
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(n->comm, &st);
        if (r != ncclSuccess)
            return nccl_fail(msg, len, "ncclCommGetAsyncError", r, n->comm);
        if (st != ncclSuccess && st != ncclInProgress) {
            const char *last = ncclGetLastError(n->comm);
            say(msg, len, "%s: asynchronous NCCL error: %s%s%s", call, ncclGetErrorString(st),
                last && *last ? ": " : "", last ? last : "");
            return EDL_EPEER;
        }
        if (edl_monotonic_ms() >= deadline) {
            say(msg, len, "%s: not complete after %d ms (a peer is stuck or gone)", call,
                timeout_ms);
            return EDL_ETIMEDOUT;
        }
        if (spins >= 64) { /* the first polls spin: a small collective ends in microseconds */
            if (n->on_wait)
                n->on_wait(n->arg);
            nap(&ns);
        }
    }
}

/* Common tail of every collective: settle the enqueue, wait, mark the communicator broken on
 * any failure (the caller must then abort it). */
static int finish(coll_nccl *n, const char *call, ncclResult_t r, int64_t deadline,
                  int timeout_ms, char *msg, size_t len)
{
    int rc = settle_enqueue(n, call, r, deadline, msg, len);
    if (rc == 0)
        rc = wait_done(n, call, deadline, timeout_ms, msg, len);
    if (rc != 0)
        n->broken = 1;
    return rc;
}

static int set_device(coll_nccl *n, char *msg, size_t len)
{
    cudaError_t e = cudaSetDevice(n->device);
    if (e != cudaSuccess) {
        n->broken = 1;
        return cuda_fail(msg, len, "cudaSetDevice", e);
    }
    return 0;
}

/* Queue a device-to-device copy on the back end's stream (in-place layouts). */
static int queue_copy(coll_nccl *n, void *dst, const void *src, size_t bytes, char *msg,
                      size_t len)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, n->stream);
    if (e != cudaSuccess) {
        n->broken = 1;
        return cuda_fail(msg, len, "cudaMemcpyAsync", e);
    }
    return 0;
}

/* One collective as the caller asked for it, and what the prologue derives from it. */
typedef struct nccl_call {
    const char *what;
    const void *send;
    void *recv;
    size_t count;
    edl_dtype dt;
    bool reduces;          /* allreduce, reduce_scatter: op applies */
    edl_redop op;
    bool is_broadcast;     /* root applies (send is needed on the root only) */
    int root;
    ncclDataType_t ndt;    /* derived */
    ncclRedOp_t nop;
    size_t esize;
    int64_t deadline;
} nccl_call;

/* The prologue every collective shares: check the arguments, map the type and operation, set
 * the device, start the deadline. 0: go on; 1: nothing to do (count 0); <0: an error. */
static int begin_call(coll_nccl *n, nccl_call *c, int timeout_ms, char *msg, size_t len)
{
    if (!n || !c->recv) {
        say(msg, len, "%s: %s is NULL", c->what, n ? "recv" : "communicator");
        return EDL_EINVAL;
    }
    if (map_dtype(c->dt, &c->ndt, &c->esize) != 0) {
        say(msg, len, "%s: unknown data type %d", c->what, (int)c->dt);
        return EDL_EINVAL;
    }
    if (c->count > SIZE_MAX / (size_t)n->size / 8) {
        say(msg, len, "%s: count %zu is too large", c->what, c->count);
        return EDL_EINVAL;
    }
    if (n->broken) {
        say(msg, len, "%s: the NCCL communicator failed earlier and must be re-formed", c->what);
        return EDL_EPEER;
    }
    if (c->is_broadcast && (c->root < 0 || c->root >= n->size)) {
        say(msg, len, "%s: root is not a rank of the generation", c->what);
        return EDL_EINVAL;
    }
    if (!c->send && (!c->is_broadcast || n->rank == c->root)) {
        say(msg, len, "%s: send is NULL%s", c->what, c->is_broadcast ? " on the root" : "");
        return EDL_EINVAL;
    }
    if (c->reduces && map_op(c->op, c->dt, &c->nop) != 0) {
        say(msg, len, "%s: invalid reduction for this data type (uint8 is not reduced)", c->what);
        return EDL_EINVAL;
    }
    if (c->count == 0)
        return 1;
    int rc = set_device(n, msg, len);
    c->deadline = deadline_after(timeout_ms);
    return rc;
}

int coll_nccl_allreduce(coll_nccl *n, const void *send, void *recv, size_t count, edl_dtype dt,
                        edl_redop op, int timeout_ms, char *msg, size_t msg_len)
{
    nccl_call c = {.what = "allreduce", .send = send, .recv = recv, .count = count, .dt = dt,
                   .reduces = true, .op = op};
    int rc = begin_call(n, &c, timeout_ms, msg, msg_len);
    if (rc)
        return rc < 0 ? rc : 0;
    ncclResult_t r = ncclAllReduce(send, recv, count, c.ndt, c.nop, n->comm, n->stream);
    return finish(n, "ncclAllReduce", r, c.deadline, timeout_ms, msg, msg_len);
}

int coll_nccl_broadcast(coll_nccl *n, const void *send, void *recv, size_t count, edl_dtype dt,
                        int root, int timeout_ms, char *msg, size_t msg_len)
{
    nccl_call c = {.what = "broadcast", .send = send, .recv = recv, .count = count, .dt = dt,
                   .is_broadcast = true, .root = root};
    int rc = begin_call(n, &c, timeout_ms, msg, msg_len);
    if (rc)
        return rc < 0 ? rc : 0;
    /* NCCL reads sendbuff only on the root; elsewhere pass recv so NULL is never seen. */
    const void *src = n->rank == root ? send : recv;
    ncclResult_t r = ncclBroadcast(src, recv, count, c.ndt, n->to_nccl[root], n->comm, n->stream);
    return finish(n, "ncclBroadcast", r, c.deadline, timeout_ms, msg, msg_len);
}

int coll_nccl_allgather(coll_nccl *n, const void *send, void *recv, size_t count, edl_dtype dt,
                        int timeout_ms, char *msg, size_t msg_len)
{
    nccl_call c = {.what = "allgather", .send = send, .recv = recv, .count = count, .dt = dt};
    int rc = begin_call(n, &c, timeout_ms, msg, msg_len);
    if (rc)
        return rc < 0 ? rc : 0;
    size_t bytes = count * c.esize;
    char *mine = (char *)recv + (size_t)n->rank * bytes;
    /* In place (send == recv: this rank's count elements at the start of recv): move them to
     * this rank's block first, which is NCCL's in-place layout. Blocks 0 and r > 0 do not
     * overlap. */
    if (send == recv && n->rank != 0 && (rc = queue_copy(n, mine, send, bytes, msg, msg_len)))
        return rc;
    const void *src = send == recv ? mine : send;
    ncclResult_t r = ncclAllGather(src, recv, count, c.ndt, n->comm, n->stream);
    return finish(n, "ncclAllGather", r, c.deadline, timeout_ms, msg, msg_len);
}

int coll_nccl_reduce_scatter(coll_nccl *n, const void *send, void *recv, size_t count,
                             edl_dtype dt, edl_redop op, int timeout_ms, char *msg,
                             size_t msg_len)
{
    nccl_call c = {.what = "reduce_scatter", .send = send, .recv = recv, .count = count,
                   .dt = dt, .reduces = true, .op = op};
    int rc = begin_call(n, &c, timeout_ms, msg, msg_len);
    if (rc)
        return rc < 0 ? rc : 0;
    size_t bytes = count * c.esize;
    /* In place (send == recv): NCCL writes this rank's result over its own block of send,
     * which nobody reads after this rank's reduction; then it moves to the start of recv. */
    char *dst = send == recv ? (char *)recv + (size_t)n->rank * bytes : recv;
    ncclResult_t r = ncclReduceScatter(send, dst, count, c.ndt, c.nop, n->comm, n->stream);
    rc = settle_enqueue(n, "ncclReduceScatter", r, c.deadline, msg, msg_len);
    if (rc != 0) {
        n->broken = 1;
        return rc;
    }
    if (dst != recv && (rc = queue_copy(n, recv, dst, bytes, msg, msg_len)) != 0)
        return rc;
    return finish(n, "ncclReduceScatter", ncclSuccess, c.deadline, timeout_ms, msg, msg_len);
}

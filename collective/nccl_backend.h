/* nccl_backend.h (internal): the NCCL back end of libedlcoll, built only when CMake finds CUDA and
 * NCCL (EDL_HAVE_NCCL). The communicator core (comm.c) owns generations, the etcd rendezvous
 * and the CPU group; this back end only needs a way to publish and await per-generation keys,
 * which the core passes in as callbacks. Every call comes from the thread that owns the
 * communicator (NCCL's abort rules, see ../shared notes nccl-elastic). */
#ifndef EDL_COLL_NCCL_H
#define EDL_COLL_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "edl/collective.h"

typedef struct coll_nccl coll_nccl;

typedef struct coll_nccl_ctx {
    int rank, size;        /* in the new generation */
    int64_t generation;
    int device;            /* CUDA device to use */
    int timeout_ms;        /* init deadline and per-operation timeout */
    /* Publish name=value under the generation's keys (gen/<n>/<name>); 0 or EDL_E*. */
    int (*kv_put)(void *arg, const char *name, const void *value, size_t len);
    /* Wait until gen/<n>/<name> exists (value malloc'ed, caller frees) or timeout_ms passes
     * (EDL_ETIMEDOUT) or the generation is superseded/dead (EDL_EPEER). */
    int (*kv_wait)(void *arg, const char *name, char **value, size_t *len, int timeout_ms);
    void *arg;
    /* Called (with arg) while a collective waits for its result, between polls: the core
     * reports long waits to the agent. May be NULL. */
    void (*on_wait)(void *arg);
    /* Fast path: prev_rank[i] = the rank that member i had in the previous communicator `prev`
     * (every member a survivor of it, order kept or not), or NULL when someone is new. */
    const int *prev_rank;
} coll_nccl_ctx;

/* 1 when a CUDA device can be used, else 0 (no driver, no device). */
int coll_nccl_usable(void);
/* Build the communicator of a generation. With prev and ctx->prev_rank: when the members and
 * their ranks are unchanged, prev itself is returned (nothing to rebuild); else prev may be
 * shrunk (ncclCommShrink + NCCL_SHRINK_ABORT where NCCL >= 2.27). prev is consumed in every
 * case (returned, or aborted): the caller must not use it again. Otherwise a fresh unique id from rank 0
 * (kv "nccl-id") and a non-blocking ncclCommInitRankConfig polled against the deadline; a
 * stuck init is aborted. EDL_ETIMEDOUT, EDL_EPEER, EDL_EIO (CUDA/NCCL error; see *msg). */
int coll_nccl_open(const coll_nccl_ctx *ctx, coll_nccl *prev, coll_nccl **out, char *msg,
                   size_t msg_len);
/* The generation's size, and whether a collective failed on it (it must then be rebuilt). */
int coll_nccl_size(const coll_nccl *n);
int coll_nccl_is_broken(const coll_nccl *n);
/* Abort (never destroy a possibly broken communicator) and free; NULL is fine. */
void coll_nccl_abort(coll_nccl *n);

/* Collectives on device buffers, enqueued on the back end's own stream and waited for with
 * a bound: past timeout_ms, or on an asynchronous NCCL error, EDL_ETIMEDOUT / EDL_EPEER and the
 * communicator must be aborted. Ranks are the generation's ranks. */
int coll_nccl_allreduce(coll_nccl *n, const void *send, void *recv, size_t count, edl_dtype dt,
                        edl_redop op, int timeout_ms, char *msg, size_t msg_len);
int coll_nccl_broadcast(coll_nccl *n, const void *send, void *recv, size_t count, edl_dtype dt,
                        int root, int timeout_ms, char *msg, size_t msg_len);
int coll_nccl_allgather(coll_nccl *n, const void *send, void *recv, size_t count, edl_dtype dt,
                        int timeout_ms, char *msg, size_t msg_len);
int coll_nccl_reduce_scatter(coll_nccl *n, const void *send, void *recv, size_t count,
                             edl_dtype dt, edl_redop op, int timeout_ms, char *msg,
                             size_t msg_len);

#endif

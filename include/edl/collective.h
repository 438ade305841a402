/* edl/collective.h: libedlcoll, elastic collective communication (see docs/collective.md).
 *
 * A communicator is one process's membership in the job's current generation. It is built
 * from what the agent gives the trainer (EDL_* environment, the control pipe): rank and world
 * size come from the generation, and the rendezvous data of generation n (endpoints, the NCCL
 * unique id, "generation dead") lives under jobs/<job>/gen/<n>/ in etcd, where the job server
 * deletes it when the generation is retired.
 *
 * Elastic loop, in the style of Horovod's hvd.elastic.run:
 *
 *     edl_comm *c; edl_coll_state *st;
 *     edl_coll_open(NULL, &c);  edl_coll_state_new(&st);  edl_coll_state_add(st, "w", w, bytes);
 *     for (;;) {
 *         int rc = edl_coll_check(c);                 // cheap unless the group must re-form
 *         if (rc == EDL_COLL_REFORMED)
 *             edl_coll_state_sync(st, c, &step);      // restore the last commit, then broadcast
 *         else if (rc < 0)                            //   from a rank that has the newest one
 *             break;                                  // the agent is gone / the job is over
 *         ... compute; if (edl_allreduce(c, ...) < 0) continue;  // a peer died: re-form
 *         if (++step % k == 0) edl_coll_state_commit(st, step);
 *     }
 *
 * A collective never hangs on a dead peer: it fails within its timeout (sooner, when the
 * peer's sockets close or another rank declares the generation dead) with EDL_EPEER, the
 * communicator is then broken, and the next edl_coll_check() re-forms it for the next
 * generation. Without the agent's environment (a trainer started by hand) the communicator
 * is a group of one and every call works.
 *
 * Buffers are host memory for the "cpu" back end and device memory for "nccl". Calls on one
 * communicator come from one thread (the one that created it). */
#ifndef EDL_COLLECTIVE_H
#define EDL_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>

#include "edl/common.h"
#include "edl/agent_link.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum edl_dtype {
    EDL_FLOAT32 = 0,
    EDL_FLOAT16,  /* IEEE binary16; reduced in float32, rounded to nearest even */
    EDL_BFLOAT16, /* reduced in float32, rounded to nearest even */
    EDL_INT32,
    EDL_INT64,
    EDL_UINT8,    /* raw bytes: broadcast and allgather only */
} edl_dtype;

typedef enum edl_redop {
    EDL_SUM = 0,
    EDL_AVG, /* the sum divided by the world size (integers: truncated) */
    EDL_MAX,
} edl_redop;

/* Returned by edl_coll_check() when the group was rebuilt for a new generation. */
#define EDL_COLL_REFORMED 1

size_t edl_dtype_size(edl_dtype dt); /* 0 for an unknown type */
const char *edl_dtype_name(edl_dtype dt);

typedef struct edl_coll_options {
    const char *backend;       /* "cpu", "nccl"; NULL: $EDL_COLL_BACKEND, else "cpu" */
    int timeout_ms;            /* every collective (0: $EDL_COLL_TIMEOUT_MS, else 30000) */
    int rendezvous_timeout_ms; /* joining one generation (0: $EDL_COLL_RENDEZVOUS_TIMEOUT_MS,
                                * else 60000); past it the generation is declared dead */
    int device;                /* CUDA device for "nccl" (-1: $LOCAL_RANK, else 0) */
    edl_agent_link *link;      /* the link to the agent to use (NULL: the communicator opens
                                * and owns one; see edl_coll_agent_link()) */
} edl_coll_options;

typedef struct edl_comm edl_comm;

/* Join the current generation: rendezvous through etcd and connect to every peer. opts may be
 * NULL. Environment read: EDL_ETCD_ENDPOINTS, EDL_ETCD_PREFIX, EDL_JOB_ID, EDL_RANK,
 * EDL_WORLD_SIZE, EDL_GENERATION, EDL_CONTROL_FD, EDL_PROGRESS_FD, PADDLE_CURRENT_ENDPOINT
 * (the address to listen on), EDL_COLL_*, and etcd's TLS and auth settings EDL_ETCD_CACERT,
 * EDL_ETCD_CERT, EDL_ETCD_KEY, EDL_ETCD_USER, EDL_ETCD_PASSWORD_FILE (edl/etcd.h). Without
 * EDL_ETCD_ENDPOINTS: a group of one. EDL_ECONFIG for a bad variable or back end,
 * EDL_ETIMEDOUT when the rendezvous did not complete in time, EDL_EAUTH when etcd refused
 * the certificate or credentials (the log names the endpoint). */
int edl_coll_open(const edl_coll_options *opts, edl_comm **out);
/* Leave: close every connection (abort an NCCL communicator) and free. */
void edl_coll_close(edl_comm *c);

int edl_coll_rank(const edl_comm *c);
int edl_coll_size(const edl_comm *c);
int64_t edl_coll_generation(const edl_comm *c);
const char *edl_coll_backend(const edl_comm *c);
/* The agent protocol handle (report steps through it; do not poll it yourself). */
edl_agent_link *edl_coll_agent_link(edl_comm *c);
/* What the last failed call said (never NULL). */
const char *edl_coll_errmsg(const edl_comm *c);

/* ---- collectives ------------------------------------------------------------------------ */
/* Every rank of the generation calls the same collectives in the same order with the same
 * count, type and operation; a mismatch is detected and fails with EDL_EPROTO on the ranks
 * that see it. send == recv is in place. Errors: EDL_EINVAL (bad argument, nothing sent),
 * EDL_EPEER (a peer failed, the generation is dead or superseded: re-form), EDL_ETIMEDOUT
 * (no progress within the timeout; the generation is declared dead), EDL_EPROTO. After any
 * error except EDL_EINVAL the communicator is broken until edl_coll_check() re-forms it. */

int edl_allreduce(edl_comm *c, const void *send, void *recv, size_t count, edl_dtype dt,
                  edl_redop op);
/* root's send (ignored elsewhere; may be NULL there) arrives in recv on every rank. */
int edl_broadcast(edl_comm *c, const void *send, void *recv, size_t count, edl_dtype dt,
                  int root);
/* recv holds count * size elements: rank r's send at offset r * count. */
int edl_allgather(edl_comm *c, const void *send, void *recv, size_t count, edl_dtype dt);
/* send holds count * size elements; rank r receives the reduction of block r. */
int edl_reduce_scatter(edl_comm *c, const void *send, void *recv, size_t count, edl_dtype dt,
                       edl_redop op);
int edl_barrier(edl_comm *c);

/* ---- elastic ------------------------------------------------------------------------------ */

/* Call at step boundaries. 0: carry on with the current group. EDL_COLL_REFORMED: a new
 * generation exists, or the group broke; the communicator has been rebuilt for the newest
 * generation (rank and size may have changed) and the caller must restore and re-sync its
 * state (edl_coll_state_sync). Blocks only while re-forming: until the next generation is
 * published and every member has joined. <0: EDL_EIO when the agent closed the control pipe
 * (the job is over or this pod left), other codes from the rendezvous. The first call after
 * edl_coll_open() returns EDL_COLL_REFORMED as well, so that every rank syncs once at the start
 * (a process that joins a running job gets the state of the others that way). */
int edl_coll_check(edl_comm *c);

/* Declare the current generation dead (published under gen/<n>/dead so every member learns
 * it at once) and break the communicator. reason: free text for the logs. */
int edl_coll_abort(edl_comm *c, const char *reason);

/* ---- commit / restore / sync of plain host buffers ----------------------------------------- */

typedef struct edl_coll_state edl_coll_state;

int edl_coll_state_new(edl_coll_state **out);
void edl_coll_state_free(edl_coll_state *s);
/* Register a buffer (host memory, owned by the caller, registered in the same order with the
 * same sizes on every rank). */
int edl_coll_state_add(edl_coll_state *s, const char *name, void *buf, size_t bytes);
/* Copy every buffer aside as the state after `step` (no communication). */
int edl_coll_state_commit(edl_coll_state *s, int64_t step);
/* Copy the last commit back into the buffers; *step (may be NULL) = its step (-1: none). */
int edl_coll_state_restore(edl_coll_state *s, int64_t *step);
/* After a re-form: every rank restores its last commit, the rank with the newest commit
 * (the lowest such rank) broadcasts it, and all commit the result. *step = the step of the
 * synchronised state (-1 when no rank had committed: the buffers are then rank 0's). EDL_EPROTO
 * when the ranks registered different buffers. Uses the CPU group even under NCCL. */
int edl_coll_state_sync(edl_coll_state *s, edl_comm *c, int64_t *step);

#ifdef __cplusplus
}
#endif
#endif

/* edl/work.h: calls that may block (a request to etcd) run off an event loop, as libuv's
 * uv_queue_work: one worker thread runs the submitted works in order; each finished work goes
 * back to the loop through an edl_queue, whose fd the loop polls next to its others, and its
 * done function runs there, on the loop's thread, when the loop calls edl_worker_complete
 * (edl_loop_worker does that when the fd wakes an edl/loop.h loop).
 * What a work reads and writes on the worker is its own: a copy of what it needs and a place
 * for its result, or a part of the loop's state handed over for the work's time: the loop
 * changes that part only in done, and reads of it meanwhile only what the declaration says
 * stays readable. The hand-overs are stated where the state is declared: the job server's
 * work owns the publisher, the lease and its keeper (jobserver.c: the loop still polls the
 * keeper of a lease a pass does not replace); the operator's round owns the jobs, the
 * counters, both clients, etcd's lease and watch and the informers' caches, whose fds the
 * loop then leaves out (operator/internal.h). Anything else of the loop's state is touched
 * only by done. */
#ifndef EDL_WORK_H
#define EDL_WORK_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct edl_worker edl_worker;

/* Embed as the first member of a request; run and done receive it back. */
typedef struct edl_work {
    void (*run)(struct edl_work *w);  /* on the worker thread */
    void (*done)(struct edl_work *w); /* on the loop's thread; frees the work */
} edl_work;

/* A worker thread. EDL_ENOMEM, EDL_EIO. */
int edl_worker_open(edl_worker **out);
/* Readable while finished works wait for edl_worker_complete. */
int edl_worker_fd(const edl_worker *wk);
/* Queue w (never waits). EDL_ECLOSED once the worker is closing: w was not taken. */
int edl_worker_submit(edl_worker *wk, edl_work *w);
/* Run done of every finished work, in the order they were submitted. */
void edl_worker_complete(edl_worker *wk);
/* How many works are submitted and not yet done. */
int edl_worker_pending(const edl_worker *wk);
/* Let the worker finish every work queued (each bounded by its own calls' deadlines), run
 * their done functions on the caller's thread, and free the worker. */
void edl_worker_close(edl_worker *wk);

#ifdef __cplusplus
}
#endif
#endif

/* work.c: the worker of edl/work.h: a thread that pops works from an input queue and runs
 * them, pushing each finished one onto the output queue the loop polls. Both are edl_queues;
 * a sentinel pushed last tells the thread to end. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "edl/common.h"
#include "edl/queue.h"
#include "edl/work.h"

struct edl_worker {
    edl_queue *in, *out;
    pthread_t thread;
    pthread_mutex_t mu; /* closing, pending */
    bool closing;
    int pending;
};

static edl_work stop_sentinel;

static void *worker_main(void *arg)
{
    edl_worker *wk = arg;
    for (;;) {
        void *item;
        if (edl_queue_pop(wk->in, &item, -1) != 0)
            continue;
        if (item == &stop_sentinel)
            return NULL;
        edl_work *w = item;
        w->run(w);
        edl_queue_push(wk->out, w); /* unbounded in practice: the loop completes as it polls */
    }
}

int edl_worker_open(edl_worker **out)
{
    *out = NULL;
    edl_worker *wk = calloc(1, sizeof *wk);
    if (!wk)
        return EDL_ENOMEM;
    int rc = edl_queue_open(SIZE_MAX / 2, &wk->in);
    if (!rc)
        rc = edl_queue_open(SIZE_MAX / 2, &wk->out);
    if (!rc && pthread_create(&wk->thread, NULL, worker_main, wk) != 0)
        rc = EDL_ENOMEM;
    if (rc) {
        edl_queue_close(wk->in, NULL);
        edl_queue_close(wk->out, NULL);
        free(wk);
        return rc;
    }
    pthread_mutex_init(&wk->mu, NULL);
    *out = wk;
    return 0;
}

int edl_worker_fd(const edl_worker *wk)
{
    return edl_queue_fd(wk->out);
}

int edl_worker_submit(edl_worker *wk, edl_work *w)
{
    pthread_mutex_lock(&wk->mu);
    int rc = wk->closing ? EDL_ECLOSED : 0;
    if (!rc && !edl_queue_push(wk->in, w))
        rc = EDL_ENOMEM;
    if (!rc)
        wk->pending++;
    pthread_mutex_unlock(&wk->mu);
    return rc;
}

void edl_worker_complete(edl_worker *wk)
{
    void *item;
    while (edl_queue_pop(wk->out, &item, 0) == 0) {
        pthread_mutex_lock(&wk->mu);
        wk->pending--;
        pthread_mutex_unlock(&wk->mu);
        edl_work *w = item;
        w->done(w); /* may submit more (not once closing) */
    }
}

int edl_worker_pending(const edl_worker *wk)
{
    edl_worker *m = (edl_worker *)wk;
    pthread_mutex_lock(&m->mu);
    int n = m->pending;
    pthread_mutex_unlock(&m->mu);
    return n;
}

void edl_worker_close(edl_worker *wk)
{
    if (!wk)
        return;
    pthread_mutex_lock(&wk->mu);
    wk->closing = true;
    bool pushed = edl_queue_push(wk->in, &stop_sentinel);
    pthread_mutex_unlock(&wk->mu);
    if (!pushed) /* out of memory: the thread is left running and the worker leaked */
        return;
    pthread_join(wk->thread, NULL);
    edl_worker_complete(wk);
    edl_queue_close(wk->in, NULL);
    edl_queue_close(wk->out, NULL);
    pthread_mutex_destroy(&wk->mu);
    free(wk);
}

/* edl/queue.h: a bounded queue that hands items from a thread to an event loop: the consumer's
 * loop polls its fd (readable while the queue holds anything) next to its other fds and pops
 * without blocking; a producer that finds it full waits (back-pressure) until there is room or
 * the queue is stopped. The one such queue of edl: the etcd watch's stream thread and the
 * Kubernetes informer's both hand their events over through it. */
#ifndef EDL_QUEUE_H
#define EDL_QUEUE_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct edl_queue edl_queue;

/* A queue of at most max items (0: 4096). EDL_ENOMEM, EDL_EIO (no eventfd). */
int edl_queue_open(size_t max, edl_queue **out);
/* Free the queue and, through free_item (may be NULL), the items still in it. Stop it and join
 * its producers first. */
void edl_queue_close(edl_queue *q, void (*free_item)(void *item));
/* Readable while the queue holds an item. */
int edl_queue_fd(const edl_queue *q);
/* Append an item, waiting while the queue is full. false once the queue is stopped: the item
 * was not taken (the caller still owns it). */
bool edl_queue_push(edl_queue *q, void *item);
/* Take the oldest item, waiting up to timeout_ms (0: not at all; -1: for ever): 0 and *item,
 * or EDL_ETIMEDOUT. */
int edl_queue_pop(edl_queue *q, void **item, int timeout_ms);
/* The consumer's: put an item back in front (the next pop returns it), never waiting, even
 * when that makes the queue hold one more than its bound. */
bool edl_queue_unpop(edl_queue *q, void *item);
/* From now on pushes fail at once, and the ones waiting return false. */
void edl_queue_stop(edl_queue *q);
size_t edl_queue_len(edl_queue *q);

#ifdef __cplusplus
}
#endif
#endif

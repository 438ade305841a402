/* queue.c: the thread-to-loop queue of edl/queue.h: a FIFO of items under a mutex, a condition
 * variable for producers waiting for room and consumers waiting for an item, and an eventfd
 * that is readable exactly while the FIFO is not empty. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "edl/common.h"
#include "edl/queue.h"

typedef struct node {
    void *item;
    struct node *next;
} node;

struct edl_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* room for producers, an item for consumers */
    node *head, *tail;
    size_t len, max;
    bool stopped;
    int efd;
};

int edl_queue_open(size_t max, edl_queue **out)
{
    *out = NULL;
    edl_queue *q = calloc(1, sizeof *q);
    if (!q)
        return EDL_ENOMEM;
    q->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (q->efd < 0) {
        free(q);
        return EDL_EIO;
    }
    pthread_mutex_init(&q->mu, NULL);
    edl_cond_init(&q->cv);
    q->max = max ? max : 4096;
    *out = q;
    return 0;
}

void edl_queue_close(edl_queue *q, void (*free_item)(void *item))
{
    if (!q)
        return;
    for (node *n = q->head, *next; n; n = next) {
        next = n->next;
        if (free_item)
            free_item(n->item);
        free(n);
    }
    close(q->efd);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

int edl_queue_fd(const edl_queue *q)
{
    return q ? q->efd : -1;
}

/* Under q->mu: count one more item; the fd becomes readable with the first. */
static void grew(edl_queue *q)
{
    if (q->len++ == 0) {
        uint64_t one = 1;
        ssize_t w = write(q->efd, &one, sizeof one);
        (void)w; /* an eventfd counter cannot overflow with one write per emptiness */
    }
    pthread_cond_broadcast(&q->cv);
}

bool edl_queue_push(edl_queue *q, void *item)
{
    node *n = malloc(sizeof *n);
    if (!n)
        return false;
    *n = (node){item, NULL};
    pthread_mutex_lock(&q->mu);
    while (q->len >= q->max && !q->stopped)
        pthread_cond_wait(&q->cv, &q->mu);
    if (q->stopped) {
        pthread_mutex_unlock(&q->mu);
        free(n);
        return false;
    }
    if (q->tail)
        q->tail->next = n;
    else
        q->head = n;
    q->tail = n;
    grew(q);
    pthread_mutex_unlock(&q->mu);
    return true;
}

bool edl_queue_unpop(edl_queue *q, void *item)
{
    node *n = malloc(sizeof *n);
    if (!n)
        return false;
    pthread_mutex_lock(&q->mu);
    *n = (node){item, q->head};
    q->head = n;
    if (!q->tail)
        q->tail = n;
    grew(q);
    pthread_mutex_unlock(&q->mu);
    return true;
}

int edl_queue_pop(edl_queue *q, void **item, int timeout_ms)
{
    *item = NULL;
    int64_t deadline = edl_deadline_ms(timeout_ms);
    pthread_mutex_lock(&q->mu);
    while (!q->head) {
        if (timeout_ms == 0 || !edl_cond_wait_until(&q->cv, &q->mu, deadline)) {
            pthread_mutex_unlock(&q->mu);
            return EDL_ETIMEDOUT;
        }
    }
    node *n = q->head;
    q->head = n->next;
    if (!q->head)
        q->tail = NULL;
    if (--q->len == 0) {
        uint64_t v;
        ssize_t r = read(q->efd, &v, sizeof v); /* empty now: the fd stops being readable */
        (void)r;
    }
    pthread_cond_broadcast(&q->cv); /* room again for a waiting producer */
    pthread_mutex_unlock(&q->mu);
    *item = n->item;
    free(n);
    return 0;
}

void edl_queue_stop(edl_queue *q)
{
    pthread_mutex_lock(&q->mu);
    q->stopped = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

size_t edl_queue_len(edl_queue *q)
{
    pthread_mutex_lock(&q->mu);
    size_t n = q->len;
    pthread_mutex_unlock(&q->mu);
    return n;
}

/* stderr_relay.c: what the agent writes to its stderr (the trainer's stderr lines and its own
 * log lines) on its way there. The writes block, so they run on a worker thread of their own
 * (edl/work.h), one batch at a time and in order: a reader of the agent's stderr that stops
 * reading (a paused terminal, `edl run` piped into a pager, a full pipe) stalls only that
 * thread, never the loop, so /healthz, signals, generations and the trainer's control pipe go
 * on. At most STDERR_RELAY_MAX bytes wait; past that the loop stops reading the trainer's pipe
 * (stderr_relay_full), and the trainer blocks on its own writes, as it would on a full
 * terminal. The agent's own lines may take as much again, then are counted and dropped; a
 * line says how many once there is room. Puts come from any thread (log lines do). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"

typedef struct relay_write {
    edl_work w; /* first: the worker hands it back */
    stderr_relay *r;
    edl_bytebuf bytes;
} relay_write;

/* The whole batch, or up to the first error (the reader is gone: the rest would go nowhere
 * either). */
static void write_all(int fd, const char *p, size_t len)
{
    for (size_t off = 0; off < len;) {
        ssize_t n = write(fd, p + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        off += (size_t)n;
    }
}

static void write_batch(edl_work *w)
{
    relay_write *b = (relay_write *)w;
    write_all(b->r->fd, b->bytes.data, b->bytes.len);
}

static void batch_done(edl_work *w);

/* Under r->mu: what waits, as a batch for the worker (NULL: nothing waits, a batch is on its
 * way, or no memory: it stays waiting and the next put tries again). */
static relay_write *take_batch(stderr_relay *r)
{
    if (r->writing || !r->waiting.len || !r->wk)
        return NULL;
    relay_write *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->w.run = write_batch;
    b->w.done = batch_done;
    b->r = r;
    b->bytes = r->waiting;
    memset(&r->waiting, 0, sizeof r->waiting);
    r->writing = true;
    return b;
}

/* Outside r->mu: hand b to the worker; when it is closing, its bytes wait again (for close). */
static void submit(stderr_relay *r, relay_write *b)
{
    if (!b || edl_worker_submit(r->wk, &b->w) == 0)
        return;
    pthread_mutex_lock(&r->mu);
    edl_bytebuf_append(&b->bytes, r->waiting.data, r->waiting.len);
    edl_bytebuf_clear(&r->waiting);
    r->waiting = b->bytes;
    r->writing = false;
    pthread_mutex_unlock(&r->mu);
    free(b);
}

/* On the loop: the batch is written; the next one (what waited meanwhile) goes. */
static void batch_done(edl_work *w)
{
    relay_write *b = (relay_write *)w;
    stderr_relay *r = b->r;
    edl_bytebuf_clear(&b->bytes);
    free(b);
    pthread_mutex_lock(&r->mu);
    r->writing = false;
    if (r->dropped && r->waiting.len < STDERR_RELAY_MAX) {
        char note[96];
        int n = snprintf(note, sizeof note, "edl-agent: %lu log lines dropped while nobody read "
                         "its stderr\n", r->dropped);
        r->dropped = 0;
        edl_bytebuf_append(&r->waiting, note, (size_t)n);
    }
    relay_write *next = take_batch(r);
    pthread_mutex_unlock(&r->mu);
    submit(r, next);
}

int stderr_relay_open(stderr_relay *r, edl_loop *l, int fd)
{
    r->fd = fd;
    int rc = edl_worker_open(&r->wk);
    if (rc == 0 && (rc = edl_loop_worker(l, r->wk)) != 0) {
        edl_worker_close(r->wk);
        r->wk = NULL;
    }
    if (rc == 0)
        pthread_mutex_init(&r->mu, NULL);
    return rc;
}

static void put(stderr_relay *r, const char *data, size_t len, size_t max)
{
    if (!r->wk) { /* not open: straight to fd, as a program without a loop does */
        write_all(r->fd, data, len);
        return;
    }
    pthread_mutex_lock(&r->mu);
    if (r->waiting.len >= max)
        r->dropped++;
    else
        edl_bytebuf_append(&r->waiting, data, len);
    relay_write *b = take_batch(r);
    pthread_mutex_unlock(&r->mu);
    submit(r, b);
}

void stderr_relay_put(stderr_relay *r, const char *data, size_t len)
{
    if (!r)
        write_all(STDERR_FILENO, data, len);
    else
        put(r, data, len, SIZE_MAX); /* bounded by the loop, which stops reading when full */
}

void stderr_relay_log(const char *line, size_t len, void *arg)
{
    put(arg, line, len, 2 * (size_t)STDERR_RELAY_MAX);
}

bool stderr_relay_full(stderr_relay *r)
{
    if (!r->wk)
        return false;
    pthread_mutex_lock(&r->mu);
    bool full = r->waiting.len >= STDERR_RELAY_MAX;
    pthread_mutex_unlock(&r->mu);
    return full;
}

void stderr_relay_close(stderr_relay *r)
{
    if (!r->wk)
        return;
    edl_worker_close(r->wk); /* the batch on its way is written, its done runs here */
    pthread_mutex_lock(&r->mu);
    r->wk = NULL; /* puts from other threads now write straight to fd */
    edl_bytebuf w = r->waiting;
    memset(&r->waiting, 0, sizeof r->waiting);
    pthread_mutex_unlock(&r->mu);
    write_all(r->fd, w.data, w.len);
    edl_bytebuf_clear(&w);
    pthread_mutex_destroy(&r->mu);
}

/* prefetch.c: pulls of sparse rows ahead of need, for the async trainer (ps_prefetch, see
 * internal.h). A trainer names the keys of its next batch; a thread of its own pulls them on a
 * client of its own (ps_client_clone) while the trainer computes, and the trainer's next pull of
 * the same keys takes the rows from here. One pull ahead per table. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum { PF_EMPTY, PF_QUEUED, PF_RUNNING, PF_DONE };

typedef struct pf_slot {
    int state;
    uint64_t *keys;
    size_t n, keys_cap;
    float *rows;
    size_t rows_cap;
    int rc;
} pf_slot;

struct ps_prefetch {
    edl_ps_client *c;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    pf_slot *slots[EDL_PS_MAX_TABLES];
};

/* A queued slot's table, or -1 (under mu). */
static int queued(const ps_prefetch *p)
{
    for (int i = 0; i < EDL_PS_MAX_TABLES; i++)
        if (p->slots[i] && p->slots[i]->state == PF_QUEUED)
            return i;
    return -1;
}

static void *prefetch_main(void *arg)
{
    ps_prefetch *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        int i = queued(p);
        if (i < 0 && p->stop)
            break;
        if (i < 0) {
            pthread_cond_wait(&p->cv, &p->mu);
            continue;
        }
        pf_slot *s = p->slots[i];
        s->state = PF_RUNNING; /* its keys and rows stay put until it is done */
        pthread_mutex_unlock(&p->mu);
        int rc = edl_ps_pull_sparse(p->c, (uint32_t)i, s->keys, s->n, s->rows);
        pthread_mutex_lock(&p->mu);
        s->rc = rc;
        s->state = PF_DONE;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int ps_prefetch_open(const edl_ps_client *c, ps_prefetch **out, char *why, size_t whylen)
{
    ps_prefetch *p = calloc(1, sizeof *p);
    if (!p)
        return edl_errf(why, whylen, EDL_ENOMEM, "out of memory");
    int rc = ps_client_clone(c, &p->c, why, whylen);
    if (rc) {
        free(p);
        return rc;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->th, NULL, prefetch_main, p) != 0) {
        edl_ps_client_close(p->c);
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return edl_errf(why, whylen, EDL_EIO, "cannot start the prefetch thread");
    }
    *out = p;
    return 0;
}

void ps_prefetch_close(ps_prefetch *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    for (int i = 0; i < EDL_PS_MAX_TABLES; i++) /* what is queued and not begun is dropped */
        if (p->slots[i] && p->slots[i]->state == PF_QUEUED)
            p->slots[i]->state = PF_EMPTY;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->th, NULL);
    for (int i = 0; i < EDL_PS_MAX_TABLES; i++)
        if (p->slots[i]) {
            free(p->slots[i]->keys);
            free(p->slots[i]->rows);
            free(p->slots[i]);
        }
    edl_ps_client_close(p->c);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

void ps_prefetch_traffic(ps_prefetch *p, uint64_t *sent, uint64_t *received)
{
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < EDL_PS_MAX_TABLES; i++) /* the client is the thread's while it pulls */
        while (p->slots[i] && p->slots[i]->state == PF_RUNNING)
            pthread_cond_wait(&p->cv, &p->mu);
    edl_ps_client_traffic(p->c, sent, received);
    pthread_mutex_unlock(&p->mu);
}

/* Room in s for n keys of dim floats (under mu, s not running). */
static int slot_room(pf_slot *s, size_t n, uint32_t dim)
{
    if (n > s->keys_cap) {
        uint64_t *k = realloc(s->keys, n * sizeof *k);
        if (!k)
            return EDL_ENOMEM;
        s->keys = k;
        s->keys_cap = n;
    }
    if (n * dim > s->rows_cap) {
        float *r = realloc(s->rows, n * dim * sizeof *r);
        if (!r)
            return EDL_ENOMEM;
        s->rows = r;
        s->rows_cap = n * dim;
    }
    return 0;
}

int ps_prefetch_start(ps_prefetch *p, uint32_t table, const edl_ps_table_config *cfg,
                      const uint64_t *keys, size_t n)
{
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    pf_slot *s = p->slots[table];
    if (!s && !(s = p->slots[table] = calloc(1, sizeof *s)))
        rc = EDL_ENOMEM;
    while (rc == 0 && s->state == PF_RUNNING) /* the one before it is still on the wire */
        pthread_cond_wait(&p->cv, &p->mu);
    if (rc == 0 && (rc = ps_client_know_table(p->c, table, cfg)) == 0 &&
        (rc = slot_room(s, n, cfg->dim)) == 0) {
        memcpy(s->keys, keys, n * sizeof *keys);
        s->n = n;
        s->state = PF_QUEUED;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

bool ps_prefetch_take(ps_prefetch *p, uint32_t table, const uint64_t *keys, size_t n,
                     float *out, uint32_t dim)
{
    pthread_mutex_lock(&p->mu);
    pf_slot *s = p->slots[table];
    bool same = s && s->state != PF_EMPTY && s->n == n && !memcmp(s->keys, keys, n * 8);
    while (same && s->state != PF_DONE)
        pthread_cond_wait(&p->cv, &p->mu);
    bool took = same && s->rc == 0; /* a failed one: the caller pulls, and reports */
    if (took)
        memcpy(out, s->rows, n * dim * sizeof *out);
    if (same)
        s->state = PF_EMPTY;
    pthread_mutex_unlock(&p->mu);
    return took;
}

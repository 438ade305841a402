/* sync.c: sync mode on one server. Every step, each trainer pushes its gradients (flag
 * PS_F_SYNC, with its token and step) and then arrives at the step's barrier. The pushes are
 * summed per table in tables of their own (SGD with lr -1 and zero rows: a push adds); when as
 * many distinct trainers as the latest barrier names have arrived, the sums are applied to
 * the tables once, as one gradient per row, and the step is done. Pushes hold a read lock
 * while they add and the step's completion takes the write lock, so no push lands in a sum
 * that is being applied: it either counts for its step or is refused as stale.
 * The number of trainers comes with every barrier, so it follows the generation: when a
 * trainer leaves, the survivors' next barrier (a waiting barrier is answered "not yet" within
 * PS_SYNC_POLL_MS and sent again) names fewer and completes the step.
 * Barriers also carry the workers' generation (under the agent; 0: none). The agent restarts
 * every worker for a new one, so the step an earlier generation left half done is of trainers
 * that are gone: the first barrier of a later generation drops its arrivals (else they would
 * count towards the new trainers' step) and its sums (the restarted trainers train the step
 * again: kept, it would be applied twice), and a barrier of an earlier generation is refused. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "edl/wire.h"
#include "internal.h"

struct ps_sync {
    pthread_rwlock_t lock;
    pthread_mutex_t sums_mu;   /* creating a sum table (under the read lock) */
    uint64_t collect, done;    /* the step whose pushes are summed; steps below done applied */
    uint64_t *arrived;         /* tokens at collect's barrier */
    uint32_t members_gen;      /* the latest workers' generation a barrier named */
    size_t narrived, cap;
    ps_table *sums[EDL_PS_MAX_TABLES];
};

int ps_sync_new(ps_sync **out)
{
    ps_sync *y = calloc(1, sizeof *y);
    if (!y)
        return EDL_ENOMEM;
    pthread_rwlock_init(&y->lock, NULL);
    pthread_mutex_init(&y->sums_mu, NULL);
    *out = y;
    return 0;
}

/* The step being collected starts again: no arrivals, no sums. Under the write lock. */
static void drop_step(ps_sync *y)
{
    y->narrived = 0;
    for (int i = 0; i < EDL_PS_MAX_TABLES; i++) {
        ps_table_free(y->sums[i]);
        y->sums[i] = NULL;
    }
}

void ps_sync_free(ps_sync *y)
{
    if (!y)
        return;
    drop_step(y);
    free(y->arrived);
    pthread_rwlock_destroy(&y->lock);
    pthread_mutex_destroy(&y->sums_mu);
    free(y);
}

static ps_table *sum_table(ps_sync *y, uint16_t id, const ps_table *target)
{
    pthread_mutex_lock(&y->sums_mu);
    if (!y->sums[id]) {
        edl_ps_table_config c;
        ps_sum_config(ps_table_config(target), &c); /* rows as wide as a push */
        if (ps_table_new(&c, &y->sums[id]) != 0)
            y->sums[id] = NULL;
    }
    ps_table *t = y->sums[id];
    pthread_mutex_unlock(&y->sums_mu);
    return t;
}

static int add_push(ps_table *sum, const ps_request *r)
{
    if (r->h.type == PS_PUSH_SPARSE)
        return ps_table_push_sparse(sum, r->keys, r->n, r->values, &r->id);
    uint64_t done = 0;
    int rc = 0;
    for (uint32_t i = 0; i < r->nseg && rc == 0; i++) {
        uint64_t off, cnt;
        ps_segment_get(r->segs, i, &off, &cnt);
        rc = ps_table_push_dense(sum, off, cnt, r->values + 4 * done, &r->id);
        done += cnt;
    }
    return rc;
}

/* A server with nothing of a step pending (it joined, or lost its state) takes the trainers'
 * step as its own. Under the write lock. */
static void adopt(ps_sync *y, uint64_t step)
{
    bool sums = false;
    for (int i = 0; i < EDL_PS_MAX_TABLES; i++)
        sums |= y->sums[i] != NULL;
    if (step != UINT64_MAX && step > y->collect && !y->narrived && !sums)
        y->collect = y->done = step;
}

int ps_sync_push(ps_sync *y, const ps_table *target, const ps_request *r, char *why,
                 size_t whylen)
{
    pthread_rwlock_rdlock(&y->lock);
    if (r->step > y->collect) {
        pthread_rwlock_unlock(&y->lock);
        pthread_rwlock_wrlock(&y->lock);
        adopt(y, r->step);
        pthread_rwlock_unlock(&y->lock);
        pthread_rwlock_rdlock(&y->lock);
    }
    int rc = 0;
    ps_table *sum = NULL;
    if (r->step != y->collect)
        rc = edl_errf(why, whylen, EDL_ECONFLICT, "a sync push for step %llu; this server "
                      "collects step %llu (the trainer is out of step: rejoin)",
                      (unsigned long long)r->step, (unsigned long long)y->collect);
    else if (!(sum = sum_table(y, r->h.table, target)))
        rc = edl_errf(why, whylen, EDL_ENOMEM, "no memory to sum table %u", r->h.table);
    else
        rc = add_push(sum, r);
    pthread_rwlock_unlock(&y->lock);
    return rc;
}

bool ps_sync_applied(ps_sync *y, uint64_t step, uint64_t *done)
{
    pthread_rwlock_rdlock(&y->lock);
    bool applied = step < y->done;
    *done = y->done;
    pthread_rwlock_unlock(&y->lock);
    return applied;
}

static int arrive(ps_sync *y, uint64_t token)
{
    for (size_t i = 0; i < y->narrived; i++)
        if (y->arrived[i] == token)
            return 0;
    if (y->narrived == y->cap) {
        size_t cap = y->cap ? 2 * y->cap : 16;
        uint64_t *a = realloc(y->arrived, cap * sizeof *a);
        if (!a)
            return EDL_ENOMEM;
        y->arrived = a;
        y->cap = cap;
    }
    y->arrived[y->narrived++] = token;
    return 0;
}

int ps_sync_arrive(ps_sync *y, ps_table *_Atomic *tables, const ps_request *r, uint64_t *done,
                   char *why, size_t whylen)
{
    pthread_rwlock_wrlock(&y->lock);
    int rc = 0;
    if (r->members_gen && r->members_gen < y->members_gen) {
        pthread_rwlock_unlock(&y->lock);
        return edl_errf(why, whylen, EDL_ECONFLICT, "a barrier of the workers' generation %u; "
                        "the workers are at generation %u now (this trainer's is over)",
                        r->members_gen, y->members_gen);
    }
    if (r->members_gen > y->members_gen) { /* the earlier generation's trainers are gone */
        y->members_gen = r->members_gen;
        drop_step(y);
    }
    adopt(y, r->step);
    if (r->step == UINT64_MAX || r->step < y->done) { /* where are we / already applied */
        *done = y->done;
        pthread_rwlock_unlock(&y->lock);
        return 1;
    }
    if (r->step > y->collect) {
        rc = edl_errf(why, whylen, EDL_ECONFLICT, "a barrier for step %llu; this server "
                      "collects step %llu", (unsigned long long)r->step,
                      (unsigned long long)y->collect);
    } else if ((rc = arrive(y, r->token)) == 0 && y->narrived >= r->trainers) {
        for (int i = 0; i < EDL_PS_MAX_TABLES && rc == 0; i++) { /* the step is complete */
            ps_table *t = tables ? atomic_load(&tables[i]) : NULL;
            if (y->sums[i] && t)
                rc = ps_table_apply_to(y->sums[i], t);
            ps_table_free(y->sums[i]);
            y->sums[i] = NULL;
        }
        y->narrived = 0;
        y->done = ++y->collect;
        if (rc)
            edl_errf(why, whylen, rc, "applying step %llu: out of memory",
                     (unsigned long long)r->step);
        rc = rc ? rc : 2;
    }
    *done = y->done;
    pthread_rwlock_unlock(&y->lock);
    return rc;
}

void ps_sync_flush_shard(ps_sync *y, uint16_t id, ps_table *target, uint32_t sh)
{
    pthread_rwlock_wrlock(&y->lock);
    ps_table *sum = y->sums[id];
    uint8_t *p = NULL;
    size_t len;
    if (sum && ps_table_shard_export(sum, sh, true, &p, &len) == 0) {
        const edl_ps_table_config *c = ps_table_config(sum);
        uint32_t n = edl_get32(p);
        if (c->kind == EDL_PS_SPARSE && n) /* SGD without state: rows are gradients */
            ps_table_push_sparse(target, p + 16, n, p + 16 + 8 * (size_t)n, NULL);
        else if (n)
            ps_table_push_dense(target, edl_ps_dense_shard_start(c->size, c->shards, sh), n,
                                p + 16, NULL);
    }
    free(p);
    pthread_rwlock_unlock(&y->lock);
}

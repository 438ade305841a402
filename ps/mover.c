/* mover.c: the thread that moves shards between servers, every MOVER_TICK_MS and at every
 * map (elastic.c decides the states, this sends):
 *   - a shard held here but not in the newest map's holders (PS_SH_HELD) goes to every server
 *     that holds it now, then is forgotten here (a hand-over);
 *   - a shard whose set of holders changed is copied to the others (the ps_copy tasks that
 *     elastic.c queues; replicas > 1);
 *   - a shard that came to be this server's and that nobody handed over in time, or a new
 *     table's shard, comes from the newest PS checkpoint or starts anew.
 * A holder that lacks a shard takes the first copy (PUT_SHARD); one that has it ignores the
 * others. One link per peer and round; a peer that does not answer is tried next round. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "edl/log.h"
#include "edl/proc.h"
#include "internal.h"
#include "server.h"

#define MOVER_TICK_MS 50

/* ---- links to the other servers, for one round ---------------------------------------------- */

typedef struct peer {
    char name[256];
    edl_ps_client *c; /* NULL: it did not answer this round */
    size_t sent;      /* shards it took */
} peer;

typedef struct peers {
    peer *p;
    size_t n, cap;
} peers;

static edl_ps_client *dial(edl_ps_server *s, const char *name)
{
    char ep[512] = "";
    pthread_rwlock_rdlock(&s->el.route);
    for (int i = 0; i < s->el.nserv; i++)
        if (strcmp(s->el.names[i], name) == 0)
            snprintf(ep, sizeof ep, "%s", s->el.eps[i]);
    pthread_rwlock_unlock(&s->el.route);
    const char *eps[] = {ep}, *names[] = {name};
    edl_ps_client_options o = {.endpoints = eps, .names = names, .n_servers = 1, .job = s->job,
                               .secret = &s->secret, .timeout_ms = 10000,
                               .max_message = s->o.max_message, .lanes = 1};
    edl_ps_client *c = NULL;
    char why[256];
    if (!*ep || edl_ps_client_open(&o, &c, why, sizeof why) != 0)
        EDL_WARN("ps", "cannot reach %s to send it shards: %s (trying again)", name,
                 *ep ? why : "not in the map");
    return c;
}

/* The round's link to a peer (dialled once a round). */
static peer *peer_of(edl_ps_server *s, peers *ps, const char *name)
{
    for (size_t i = 0; i < ps->n; i++)
        if (strcmp(ps->p[i].name, name) == 0)
            return &ps->p[i];
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? 2 * ps->cap : 8;
        peer *p = realloc(ps->p, cap * sizeof *p);
        if (!p)
            return NULL;
        ps->p = p, ps->cap = cap;
    }
    peer *p = &ps->p[ps->n++];
    *p = (peer){.c = dial(s, name)};
    snprintf(p->name, sizeof p->name, "%s", name);
    return p;
}

static void close_peers(peers *ps, int64_t gen)
{
    for (size_t i = 0; i < ps->n; i++) {
        if (ps->p[i].sent)
            EDL_INFO("ps", "sent %zu shards to %s (map %lld)", ps->p[i].sent, ps->p[i].name,
                     (long long)gen);
        edl_ps_client_close(ps->p[i].c);
    }
    free(ps->p);
}

/* Shard sh of table id to the peer named, under map gen. 0 once it has it. */
static int send_shard(edl_ps_server *s, peers *ps, const char *to, uint16_t id, uint32_t sh,
                      int64_t gen)
{
    peer *p = peer_of(s, ps, to);
    if (!p || !p->c)
        return EDL_EUNAVAIL;
    ps_table *t = atomic_load(&s->tables[id]);
    uint8_t *blob;
    size_t len;
    int rc = ps_table_shard_export(t, sh, false, &blob, &len);
    if (rc == 0)
        rc = ps_client_put_shard(p->c, id, ps_table_config(t), sh, gen, blob, len);
    free(blob);
    if (rc == 0) {
        p->sent++;
        atomic_fetch_add(&s->shards_out, 1);
    } else if (rc != EDL_EBUSY && rc != EDL_EMOVED) {
        EDL_WARN("ps", "sending shard %u of table %u to %s: %s", sh, id, to,
                 edl_ps_client_errmsg(p->c));
    }
    if (rc == EDL_EPEER || rc == EDL_ETIMEDOUT) { /* not again this round */
        edl_ps_client_close(p->c);
        p->c = NULL;
    }
    return rc;
}

/* ---- what is due -------------------------------------------------------------------------- */

typedef struct held {
    uint16_t table;
    uint32_t shard;
} held;

static bool add_due(ps_due **due, size_t *n, size_t *cap, uint16_t id, uint32_t sh,
                    bool timed_out)
{
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        ps_due *d = realloc(*due, c * sizeof *d);
        if (!d)
            return false;
        *due = d, *cap = c;
    }
    (*due)[(*n)++] = (ps_due){id, sh, timed_out, false};
    return true;
}

static bool add_held(held **h, size_t *n, size_t *cap, uint16_t id, uint32_t sh)
{
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        held *x = realloc(*h, c * sizeof *x);
        if (!x)
            return false;
        *h = x, *cap = c;
    }
    (*h)[(*n)++] = (held){id, sh};
    return true;
}

/* The shards held here and not in the newest map (*out), and the shards to load from the
 * checkpoint or start anew: those whose hand-over is overdue, and new tables' (*due). */
static size_t plan(edl_ps_server *s, held **out, int64_t *gen, ps_due **due, size_t *ndue)
{
    size_t n = 0, cap = 0, dcap = 0;
    *out = NULL, *due = NULL, *ndue = 0;
    int64_t now = edl_monotonic_ms();
    pthread_rwlock_wrlock(&s->el.route);
    *gen = s->el.gen;
    for (uint16_t id = 0; id < EDL_PS_MAX_TABLES; id++) {
        ps_table *t = atomic_load(&s->tables[id]);
        for (uint32_t sh = 0; t && s->el.own[id] && sh < ps_table_config(t)->shards; sh++) {
            uint8_t *st = &s->el.own[id][sh];
            bool late = *st == PS_SH_PENDING && now >= s->el.pending_until[id];
            if ((late || *st == PS_SH_RESTORE) && add_due(due, ndue, &dcap, id, sh, late))
                *st = PS_SH_RESTORE;
            if (*st == PS_SH_HELD && !add_held(out, &n, &cap, id, sh))
                break; /* out of memory: the rest next round */
        }
    }
    pthread_rwlock_unlock(&s->el.route);
    return n;
}

/* The due shards the checkpoint did not have start anew (those overdue counted as lost). */
static void start_anew(edl_ps_server *s, ps_due *due, size_t n)
{
    pthread_rwlock_wrlock(&s->el.route);
    for (size_t i = 0; i < n; i++) {
        uint8_t *st = &s->el.own[due[i].table][due[i].shard];
        if (due[i].done || *st != PS_SH_RESTORE)
            continue;
        *st = PS_SH_OWN;
        if (due[i].timed_out)
            atomic_fetch_add(&s->shards_lost, 1);
    }
    pthread_rwlock_unlock(&s->el.route);
}

/* One line a table for the shards whose hand-over never came (their server died): how many,
 * how many came back from which checkpoint, how many start again from initial values. A lost
 * server costs a line a table, not one a shard (1,024 a table by default). due is in table
 * order (plan). */
static void report_overdue(edl_ps_server *s, const ps_due *due, size_t n, const char *from)
{
    for (size_t i = 0, j; i < n; i = j) {
        unsigned long long late = 0, restored = 0;
        for (j = i; j < n && due[j].table == due[i].table; j++)
            if (due[j].timed_out)
                late++, restored += due[j].done;
        if (!late)
            continue;
        edl_log(restored < late ? EDL_LOG_WARN : EDL_LOG_INFO, "ps", "table %u: %llu shards "
                "were not handed over within %d ms (their server died?); %s: %llu restored, "
                "%llu start again from initial values", due[i].table, late,
                s->o.handover_timeout_ms, *from ? from : "no PS checkpoint holds them",
                restored, late - restored);
    }
}

/* ---- hand-overs and copies ------------------------------------------------------------------ */

/* A shard held here goes to every server that holds it now; once all have it, it is
 * forgotten here. */
static void hand_over(edl_ps_server *s, peers *ps, const held *h, int64_t gen)
{
    char to[EDL_PS_MAX_REPLICAS][256];
    ps_table *t = atomic_load(&s->tables[h->table]);
    pthread_rwlock_rdlock(&s->el.route);
    int k = s->el.own[h->table][h->shard] == PS_SH_HELD ? ps_elastic_holders(s, t, h->shard, to)
                                                          : 0;
    pthread_rwlock_unlock(&s->el.route);
    int sent = 0;
    for (int i = 0; i < k; i++)
        sent += send_shard(s, ps, to[i], h->table, h->shard, gen) == 0;
    if (k == 0 || sent < k)
        return;
    pthread_rwlock_wrlock(&s->el.route);
    if (s->el.own[h->table][h->shard] == PS_SH_HELD) {
        ps_table_shard_drop(t, h->shard);
        s->el.own[h->table][h->shard] = PS_SH_AWAY;
    }
    pthread_rwlock_unlock(&s->el.route);
}

/* Whether copy c is still to be made: 1 yes, 0 no (the shard left, or its target no longer
 * holds it), -1 not yet (the shard is still on its way here). Under the route lock. */
static int copy_due(edl_ps_server *s, const ps_copy *c)
{
    ps_table *t = atomic_load(&s->tables[c->table]);
    uint8_t st = t && s->el.own[c->table] ? s->el.own[c->table][c->shard] : PS_SH_AWAY;
    if (st == PS_SH_PENDING || st == PS_SH_RESTORE)
        return -1;
    return st == PS_SH_OWN && ps_elastic_holds(s, t, c->shard, c->to);
}

/* The queued copies; those not taken this round go back in the queue. */
static void copy_round(edl_ps_server *s, peers *ps, int64_t gen)
{
    pthread_rwlock_wrlock(&s->el.route);
    ps_copy *todo = s->el.copies;
    size_t n = s->el.ncopies, kept = 0;
    s->el.copies = NULL, s->el.ncopies = s->el.capcopies = 0;
    pthread_rwlock_unlock(&s->el.route);
    for (size_t i = 0; i < n; i++) {
        pthread_rwlock_rdlock(&s->el.route);
        int due = copy_due(s, &todo[i]);
        pthread_rwlock_unlock(&s->el.route);
        if (due < 0 ||
            (due == 1 && send_shard(s, ps, todo[i].to, todo[i].table, todo[i].shard, gen) != 0))
            todo[kept++] = todo[i];
    }
    pthread_rwlock_wrlock(&s->el.route); /* those kept go first, before any queued since */
    ps_copy *all = kept ? realloc(todo, (kept + s->el.ncopies) * sizeof *all) : NULL;
    if (all) {
        if (s->el.ncopies)
            memcpy(all + kept, s->el.copies, s->el.ncopies * sizeof *all);
        free(s->el.copies);
        s->el.copies = all, s->el.ncopies += kept, s->el.capcopies = s->el.ncopies;
        todo = NULL;
    }
    pthread_rwlock_unlock(&s->el.route);
    free(todo);
}

static void move_round(edl_ps_server *s)
{
    held *h;
    ps_due *due;
    int64_t gen;
    size_t ndue, n = plan(s, &h, &gen, &due, &ndue);
    if (ndue) {
        char from[512];
        ps_ckpt_restore(s, due, ndue, from, sizeof from);
        start_anew(s, due, ndue);
        report_overdue(s, due, ndue, from);
    }
    free(due);
    peers ps = {0};
    for (size_t i = 0; i < n; i++)
        hand_over(s, &ps, &h[i], gen);
    free(h);
    copy_round(s, &ps, gen);
    close_peers(&ps, gen);
    ps_ckpt_reap(s);
}

void *ps_mover_main(void *arg)
{
    edl_ps_server *s = arg;
    pthread_mutex_lock(&s->el.mover_mu);
    while (!s->el.mover_stop) {
        pthread_mutex_unlock(&s->el.mover_mu);
        move_round(s);
        pthread_mutex_lock(&s->el.mover_mu);
        if (s->el.mover_stop)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += MOVER_TICK_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&s->el.mover_cv, &s->el.mover_mu, &ts);
    }
    pthread_mutex_unlock(&s->el.mover_mu);
    return NULL;
}

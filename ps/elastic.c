/* elastic.c: a server's place in a changing set of servers. The map (edl_ps_servers) says who
 * owns each shard (edl_ps_shard_owner over the names); this server keeps, per table and shard,
 * whether it owns it and whether the shard's data is here (PS_SH_*), refuses requests for
 * shards it does not serve (server.c asks ps_route_check under the read side of s->route),
 * and a mover thread hands the shards it holds but no longer owns to their owners
 * (PUT_SHARD), then forgets them. A shard it comes to own waits for its old owner's hand-over
 * up to handover_timeout_ms, then starts from initial values (its old owner died).
 * Map changes and hand-overs take s->route for writing: a request is served whole under one
 * map, never half. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "edl/log.h"
#include "edl/proc.h"
#include "edl/wire.h"
#include "internal.h"
#include "server.h"

#define MOVER_TICK_MS 50

void ps_elastic_init(edl_ps_server *s)
{
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
    /* map changes must not starve behind a stream of requests */
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&s->route, &a);
    pthread_rwlockattr_destroy(&a);
    pthread_mutex_init(&s->mover_mu, NULL);
    pthread_cond_init(&s->mover_cv, NULL);
    s->self = -1;
}

static void free_map(edl_ps_server *s)
{
    for (int i = 0; i < s->nserv; i++)
        free(s->names[i]), free(s->eps[i]);
    free(s->names), free(s->eps);
    s->names = s->eps = NULL;
    s->nserv = 0;
}

void ps_elastic_close(edl_ps_server *s)
{
    if (s->mover_started) {
        pthread_mutex_lock(&s->mover_mu);
        s->mover_stop = true;
        pthread_cond_signal(&s->mover_cv);
        pthread_mutex_unlock(&s->mover_mu);
        pthread_join(s->mover, NULL);
    }
    free_map(s);
    free(s->copies);
    for (int i = 0; i < EDL_PS_MAX_TABLES; i++)
        free(s->own[i]);
    pthread_rwlock_destroy(&s->route);
    pthread_mutex_destroy(&s->mover_mu);
    pthread_cond_destroy(&s->mover_cv);
}

bool ps_elastic_mapped(edl_ps_server *s)
{
    pthread_rwlock_rdlock(&s->route);
    bool mapped = s->mapped;
    pthread_rwlock_unlock(&s->route);
    return mapped;
}

/* The servers (indexes into names) that hold shard sh of t: its owner first. */
static int holders(char *const *names, int n, const ps_table *t, uint32_t sh, int *at)
{
    return edl_ps_shard_replicas((const char *const *)names, n, sh,
                                 (int)ps_table_config(t)->replicas, at);
}

static bool holds(char *const *names, int n, const ps_table *t, uint32_t sh, const char *who)
{
    int at[EDL_PS_MAX_REPLICAS], k = who && n ? holders(names, n, t, sh, at) : 0;
    for (int i = 0; i < k; i++)
        if (strcmp(names[at[i]], who) == 0)
            return true;
    return false;
}

/* This server holds shard sh of t in the newest map (its owner or a backup). */
static bool mine(const edl_ps_server *s, const ps_table *t, uint32_t sh)
{
    return s->self >= 0 && holds(s->names, s->nserv, t, sh, s->names[s->self]);
}

bool ps_elastic_owner(edl_ps_server *s, uint32_t sh)
{
    return !s->mapped ||
           edl_ps_shard_owner((const char *const *)s->names, s->nserv, sh) == s->self;
}

/* ---- the states --------------------------------------------------------------------------- */

static void set_pending(edl_ps_server *s, uint16_t id, uint8_t *st)
{
    *st = PS_SH_PENDING;
    s->pending_until[id] = edl_monotonic_ms() + s->o.handover_timeout_ms;
}

int ps_elastic_table_new(edl_ps_server *s, uint16_t id, const ps_table *t)
{
    uint32_t n = ps_table_config(t)->shards;
    pthread_rwlock_wrlock(&s->route);
    int rc = 0;
    if (s->mapped && !s->own[id]) {
        uint8_t *own = malloc(n);
        for (uint32_t sh = 0; own && sh < n; sh++) {
            own[sh] = PS_SH_AWAY;
            if (mine(s, t, sh) && s->joining)
                set_pending(s, id, &own[sh]); /* from the servers that hold it */
            else if (mine(s, t, sh))
                own[sh] = s->ck_on ? PS_SH_RESTORE : PS_SH_OWN; /* the job's checkpoint */
        }
        s->own[id] = own;
        rc = own ? 0 : EDL_ENOMEM;
    }
    pthread_rwlock_unlock(&s->route);
    return rc;
}

/* Copies of shard sh of table id go to the servers that hold it in the new map and did not in
 * the old one (old: NULL on a first map). Every server that held it queues them: the first
 * copy to arrive is taken, the others are no-ops. */
static void queue_copies(edl_ps_server *s, uint16_t id, const ps_table *t, uint32_t sh,
                         char *const *old, int nold)
{
    int at[EDL_PS_MAX_REPLICAS], k = holders(s->names, s->nserv, t, sh, at);
    if (!old || !holds(old, nold, t, sh, s->names[s->self]))
        return; /* it is new here: it receives, it does not send */
    for (int i = 0; i < k; i++) {
        if (at[i] == s->self || holds(old, nold, t, sh, s->names[at[i]]))
            continue;
        if (s->ncopies == s->capcopies) {
            size_t cap = s->capcopies ? 2 * s->capcopies : 64;
            ps_copy *c = realloc(s->copies, cap * sizeof *c);
            if (!c)
                return; /* the new backup times out and loads the checkpoint */
            s->copies = c, s->capcopies = cap;
        }
        ps_copy *c = &s->copies[s->ncopies++];
        *c = (ps_copy){.table = id, .shard = sh};
        snprintf(c->to, sizeof c->to, "%s", s->names[at[i]]);
    }
}

/* One shard under a new map. A shard that stops being served here has its sync step's sums
 * so far applied first (they go with it, as part of its rows). */
static void follow(edl_ps_server *s, uint16_t id, ps_table *t, uint32_t sh, char *const *old,
                   int nold)
{
    uint8_t *st = &s->own[id][sh];
    bool owned = mine(s, t, sh);
    if (owned && ps_table_config(t)->replicas > 1)
        queue_copies(s, id, t, sh, old, nold);
    if (owned && *st == PS_SH_AWAY)
        set_pending(s, id, st);
    else if (owned && *st == PS_SH_HELD)
        *st = PS_SH_OWN;
    else if (!owned && *st == PS_SH_OWN) {
        ps_sync_flush_shard(s->sync[PS_SPACE_STEPS], id, t, sh);
        *st = PS_SH_HELD;
    } else if (!owned && (*st == PS_SH_PENDING || *st == PS_SH_RESTORE)) {
        *st = PS_SH_AWAY; /* whoever holds it hands it to its owner now */
    }
}

/* The new map in s; the old names go to *old (the caller frees them with free_names). */
static int copy_map(edl_ps_server *s, const edl_ps_servers *m, const char *self, char ***old,
                    int *nold)
{
    char **names = calloc((size_t)m->n, sizeof *names), **eps = calloc((size_t)m->n, sizeof *eps);
    bool ok = names && eps;
    for (int i = 0; ok && i < m->n; i++)
        ok = (names[i] = strdup(m->names[i])) && (eps[i] = strdup(m->endpoints[i]));
    if (!ok) {
        for (int i = 0; names && eps && i < m->n; i++)
            free(names[i]), free(eps[i]);
        free(names), free(eps);
        return EDL_ENOMEM;
    }
    for (int i = 0; i < s->nserv; i++)
        free(s->eps[i]);
    free(s->eps);
    *old = s->names, *nold = s->nserv;
    s->names = names, s->eps = eps, s->nserv = m->n, s->self = -1;
    for (int i = 0; self && i < m->n; i++)
        if (strcmp(names[i], self) == 0)
            s->self = i;
    return 0;
}

static int check_map(const edl_ps_servers *m)
{
    if (!m || m->n < 1 || m->n > EDL_PS_MAX_SERVERS || !m->names || !m->endpoints)
        return EDL_EINVAL;
    for (int i = 0; i < m->n; i++) {
        if (!m->names[i] || !*m->names[i] || !m->endpoints[i] || !*m->endpoints[i])
            return EDL_EINVAL;
        for (int j = 0; j < i; j++)
            if (strcmp(m->names[i], m->names[j]) == 0)
                return EDL_EINVAL;
    }
    return 0;
}

static void *mover_main(void *arg);

int edl_ps_server_set_map(edl_ps_server *s, const edl_ps_servers *m, const char *self,
                          bool joining)
{
    if (check_map(m) != 0)
        return EDL_EINVAL;
    pthread_rwlock_wrlock(&s->route);
    int rc = 0;
    if (s->mapped && m->generation <= s->gen)
        goto out;
    bool first = !s->mapped;
    char **old = NULL;
    int nold = 0;
    if ((rc = copy_map(s, m, self, &old, &nold)) != 0)
        goto out;
    s->gen = m->generation;
    s->joining = first ? joining : s->joining;
    for (uint16_t id = 0; id < EDL_PS_MAX_TABLES; id++) {
        ps_table *t = atomic_load(&s->tables[id]);
        uint32_t n = t ? ps_table_config(t)->shards : 0;
        if (t && first && !(s->own[id] = calloc(n, 1))) /* a fixed set's tables: all here */
            rc = EDL_ENOMEM;
        for (uint32_t sh = 0; s->own[id] && sh < n; sh++)
            follow(s, id, t, sh, old, nold);
    }
    for (int i = 0; i < nold; i++)
        free(old[i]);
    free(old);
    s->mapped = true;
    EDL_INFO("ps", "map %lld: %d servers, %s", (long long)m->generation, m->n,
             s->self >= 0 ? "this one among them" : "this one leaving");
out:
    pthread_rwlock_unlock(&s->route);
    pthread_mutex_lock(&s->mover_mu);
    if (!s->mover_started && rc == 0)
        s->mover_started = pthread_create(&s->mover, NULL, mover_main, s) == 0;
    pthread_cond_signal(&s->mover_cv);
    pthread_mutex_unlock(&s->mover_mu);
    return rc;
}

bool edl_ps_server_drained(edl_ps_server *s)
{
    bool held = false;
    pthread_rwlock_rdlock(&s->route);
    for (int id = 0; id < EDL_PS_MAX_TABLES && !held; id++) {
        ps_table *t = atomic_load(&s->tables[id]);
        for (uint32_t sh = 0; t && s->own[id] && sh < ps_table_config(t)->shards; sh++)
            held |= s->own[id][sh] == PS_SH_HELD;
    }
    pthread_rwlock_unlock(&s->route);
    return !held;
}

/* ---- requests ----------------------------------------------------------------------------- */

static int refuse(const edl_ps_server *s, uint8_t st, uint16_t id, uint32_t sh, char *why,
                  size_t whylen)
{
    if (st == PS_SH_PENDING || st == PS_SH_RESTORE)
        return edl_errf(why, whylen, EDL_EBUSY, "shard %u of table %u is on its way to this "
                        "server (map %lld): ask again", sh, id, (long long)s->gen);
    return edl_errf(why, whylen, EDL_EMOVED, "shard %u of table %u is not served here in map "
                    "%lld", sh, id, (long long)s->gen);
}

int ps_route_check(edl_ps_server *s, const ps_request *r, const ps_table *t, char *why,
                   size_t whylen)
{
    const uint8_t *own = s->own[r->h.table];
    bool push = r->h.type == PS_PUSH_SPARSE || r->h.type == PS_PUSH_DENSE;
    if (push && s->mapped && (int64_t)r->gen != s->gen) /* its replicas are another map's */
        return edl_errf(why, whylen, (int64_t)r->gen < s->gen ? EDL_EMOVED : EDL_EBUSY,
                        "a push from a client on map %llu; this server is on map %lld",
                        (unsigned long long)r->gen, (long long)s->gen);
    if (!s->mapped || !own)
        return 0;
    const edl_ps_table_config *c = ps_table_config(t);
    if (c->kind == EDL_PS_SPARSE) {
        for (uint32_t i = 0; i < r->n; i++) {
            uint32_t sh = edl_ps_key_shard(edl_get64(r->keys + 8 * (size_t)i), c->shards);
            if (own[sh] != PS_SH_OWN)
                return refuse(s, own[sh], r->h.table, sh, why, whylen);
        }
        return 0;
    }
    for (uint32_t i = 0; i < r->nseg; i++) {
        uint64_t off, cnt;
        ps_segment_get(r->segs, i, &off, &cnt);
        uint32_t a = edl_ps_dense_shard(off, c->size, c->shards);
        uint32_t b = edl_ps_dense_shard(off + cnt - 1, c->size, c->shards);
        for (uint32_t sh = a; sh <= b; sh++)
            if (own[sh] != PS_SH_OWN)
                return refuse(s, own[sh], r->h.table, sh, why, whylen);
    }
    return 0;
}

/* A shard that is here already came again: another replica's copy (replicas > 1), or a
 * hand-over later than handover_timeout_ms, after the shard started anew here. */
static void late_copy(edl_ps_server *s, const ps_table *t, uint16_t id, uint32_t sh)
{
    if (ps_table_config(t)->replicas == 1)
        EDL_WARN("ps", "shard %u of table %u came after %d ms, when it had started anew here: "
                 "the late copy is dropped", sh, id, s->o.handover_timeout_ms);
}

int ps_serve_put_shard(edl_ps_server *s, const ps_request *r, char *why, size_t whylen)
{
    uint16_t id = r->h.table;
    int rc = ps_server_create_table(s, id, &r->cfg, why, whylen);
    if (rc)
        return rc;
    ps_table *t = atomic_load(&s->tables[id]);
    pthread_rwlock_wrlock(&s->route);
    uint8_t *st = s->own[id] ? &s->own[id][r->shard] : NULL;
    if (!s->mapped || (int64_t)r->gen > s->gen)
        rc = edl_errf(why, whylen, EDL_EBUSY, "this server has not seen map %llu yet",
                      (unsigned long long)r->gen);
    else if (!st || !mine(s, t, r->shard))
        rc = refuse(s, PS_SH_AWAY, id, r->shard, why, whylen);
    else if ((*st == PS_SH_OWN || *st == PS_SH_HELD) && !ps_table_shard_empty(t, r->shard))
        late_copy(s, t, id, r->shard); /* it has it: taken as done */
    else if ((rc = ps_table_shard_import(t, r->shard, r->values, r->total, why, whylen)) == 0) {
        *st = PS_SH_OWN;
        atomic_fetch_add(&s->shards_in, 1);
    }
    pthread_rwlock_unlock(&s->route);
    return rc;
}

/* ---- the mover ----------------------------------------------------------------------------- */

typedef struct move {
    uint16_t table;
    uint32_t shard;
    int to;      /* the owner's index in the map */
} move;

static int by_owner(const void *a, const void *b)
{
    return ((const move *)a)->to - ((const move *)b)->to;
}

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

/* The shards held here and not owned, and the owners they go to (*out); the shards to load
 * from the checkpoint or start anew: those whose hand-over is overdue, and new ones (*due). */
static size_t plan_moves(edl_ps_server *s, move **out, int64_t *gen, ps_due **due,
                         size_t *ndue)
{
    size_t n = 0, cap = 0, dcap = 0;
    *out = NULL, *due = NULL, *ndue = 0;
    int64_t now = edl_monotonic_ms();
    pthread_rwlock_wrlock(&s->route);
    *gen = s->gen;
    for (uint16_t id = 0; id < EDL_PS_MAX_TABLES; id++) {
        ps_table *t = atomic_load(&s->tables[id]);
        for (uint32_t sh = 0; t && s->own[id] && sh < ps_table_config(t)->shards; sh++) {
            uint8_t *st = &s->own[id][sh];
            bool late = *st == PS_SH_PENDING && now >= s->pending_until[id];
            if ((late || *st == PS_SH_RESTORE) && add_due(due, ndue, &dcap, id, sh, late))
                *st = PS_SH_RESTORE;
            if (*st != PS_SH_HELD)
                continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                move *m = realloc(*out, cap * sizeof *m);
                if (!m)
                    break;
                *out = m;
            }
            (*out)[n++] = (move){id, sh, edl_ps_shard_owner((const char *const *)s->names,
                                                             s->nserv, sh)};
        }
    }
    pthread_rwlock_unlock(&s->route);
    if (n)
        qsort(*out, n, sizeof **out, by_owner);
    return n;
}

/* Shard m's bytes to the server of c (one that holds it from map gen on). 0 once it has them. */
static int copy_shard(edl_ps_server *s, edl_ps_client *c, const move *m, int64_t gen)
{
    ps_table *t = atomic_load(&s->tables[m->table]);
    uint8_t *blob;
    size_t len;
    int rc = ps_table_shard_export(t, m->shard, false, &blob, &len);
    if (rc == 0)
        rc = ps_client_put_shard(c, m->table, ps_table_config(t), m->shard, gen, blob, len);
    free(blob);
    if (rc == 0)
        atomic_fetch_add(&s->shards_out, 1);
    return rc;
}

/* Hand one shard over on c (a client of its owner), then forget it. 0 once the owner has it. */
static int hand_over(edl_ps_server *s, edl_ps_client *c, const move *m, int64_t gen)
{
    int rc = copy_shard(s, c, m, gen);
    if (rc)
        return rc;
    pthread_rwlock_wrlock(&s->route);
    if (s->own[m->table][m->shard] == PS_SH_HELD) {
        ps_table_shard_drop(atomic_load(&s->tables[m->table]), m->shard);
        s->own[m->table][m->shard] = PS_SH_AWAY;
    }
    pthread_rwlock_unlock(&s->route);
    return 0;
}

static edl_ps_client *dial_owner(edl_ps_server *s, int to, char *name, size_t namelen)
{
    pthread_rwlock_rdlock(&s->route);
    char ep[512];
    snprintf(ep, sizeof ep, "%s", to < s->nserv ? s->eps[to] : "");
    snprintf(name, namelen, "%s", to < s->nserv ? s->names[to] : "");
    pthread_rwlock_unlock(&s->route);
    const char *eps[] = {ep}, *names[] = {name};
    edl_ps_client_options o = {.endpoints = eps, .names = names, .n_servers = 1, .job = s->job,
                               .secret = &s->secret, .timeout_ms = 10000,
                               .max_message = s->o.max_message};
    edl_ps_client *c = NULL;
    char why[256];
    if (edl_ps_client_open(&o, &c, why, sizeof why) != 0)
        EDL_WARN("ps", "cannot reach %s to hand shards over: %s (trying again)", name, why);
    return c;
}

/* The due shards the checkpoint did not have start anew. */
static void start_anew(edl_ps_server *s, ps_due *due, size_t n)
{
    pthread_rwlock_wrlock(&s->route);
    for (size_t i = 0; i < n; i++) {
        uint8_t *st = &s->own[due[i].table][due[i].shard];
        if (due[i].done || *st != PS_SH_RESTORE)
            continue;
        *st = PS_SH_OWN;
        if (!due[i].timed_out)
            continue;
        atomic_fetch_add(&s->shards_lost, 1);
        EDL_WARN("ps", "shard %u of table %u: no server handed it over within %d ms (its "
                 "owner died?) and no checkpoint holds it: it starts again from initial values",
                 due[i].shard, due[i].table, s->o.handover_timeout_ms);
    }
    pthread_rwlock_unlock(&s->route);
}

static void move_round(edl_ps_server *s)
{
    move *mv;
    ps_due *due;
    int64_t gen;
    size_t ndue, n = plan_moves(s, &mv, &gen, &due, &ndue);
    if (ndue) {
        ps_ckpt_restore(s, due, ndue);
        start_anew(s, due, ndue);
    }
    free(due);
    ps_ckpt_reap(s);
    for (size_t i = 0; i < n;) { /* the moves to one owner over one link */
        size_t j = i;
        while (j < n && mv[j].to == mv[i].to)
            j++;
        char name[512];
        edl_ps_client *c = dial_owner(s, mv[i].to, name, sizeof name);
        size_t handed = 0;
        for (size_t k = i; c && k < j; k++) {
            int rc = hand_over(s, c, &mv[k], gen);
            handed += rc == 0;
            if (rc && rc != EDL_EBUSY && rc != EDL_EMOVED)
                EDL_WARN("ps", "handing shard %u of table %u over: %s", mv[k].shard,
                         mv[k].table, edl_ps_client_errmsg(c));
            if (rc == EDL_EPEER || rc == EDL_ETIMEDOUT)
                break;
        }
        if (handed)
            EDL_INFO("ps", "handed %zu shards over to %s (map %lld)", handed, name,
                     (long long)gen);
        edl_ps_client_close(c);
        i = j;
    }
    free(mv);
}

/* ---- copies for new backups ---------------------------------------------------------------- */

static int by_target(const void *a, const void *b)
{
    return strcmp(((const ps_copy *)a)->to, ((const ps_copy *)b)->to);
}

/* Whether copy c is still to be made: 1 yes (*to: its target's index), 0 no (the shard left,
 * or its target no longer holds it), -1 not yet (the shard is still on its way here). */
static int copy_due(edl_ps_server *s, const ps_copy *c, int *to)
{
    ps_table *t = atomic_load(&s->tables[c->table]);
    uint8_t st = t && s->own[c->table] ? s->own[c->table][c->shard] : PS_SH_AWAY;
    *to = -1;
    for (int i = 0; i < s->nserv; i++)
        if (strcmp(s->names[i], c->to) == 0)
            *to = i;
    if (st == PS_SH_PENDING || st == PS_SH_RESTORE)
        return -1;
    return st == PS_SH_OWN && *to >= 0 && holds(s->names, s->nserv, t, c->shard, c->to);
}

/* Send the copies of one target (todo[0..n), under gen); those not taken stay in todo, their
 * number returned. */
static size_t copy_to(edl_ps_server *s, ps_copy *todo, size_t n, int64_t gen)
{
    size_t kept = 0;
    edl_ps_client *c = NULL;
    char name[512];
    for (size_t i = 0; i < n; i++) {
        int to;
        pthread_rwlock_rdlock(&s->route);
        int due = copy_due(s, &todo[i], &to);
        pthread_rwlock_unlock(&s->route);
        if (due == 1 && !c)
            c = dial_owner(s, to, name, sizeof name);
        move m = {todo[i].table, todo[i].shard, to};
        if (due < 0 || (due == 1 && (!c || copy_shard(s, c, &m, gen) != 0)))
            todo[kept++] = todo[i];
    }
    edl_ps_client_close(c);
    return kept;
}

static void copy_round(edl_ps_server *s)
{
    pthread_rwlock_wrlock(&s->route);
    ps_copy *todo = s->copies;
    size_t n = s->ncopies, kept = 0;
    int64_t gen = s->gen;
    s->copies = NULL, s->ncopies = s->capcopies = 0;
    pthread_rwlock_unlock(&s->route);
    if (n)
        qsort(todo, n, sizeof *todo, by_target);
    for (size_t i = 0, j; i < n; i = j) {
        for (j = i; j < n && strcmp(todo[j].to, todo[i].to) == 0;)
            j++;
        size_t k = copy_to(s, todo + i, j - i, gen);
        memmove(todo + kept, todo + i, k * sizeof *todo);
        kept += k;
    }
    pthread_rwlock_wrlock(&s->route); /* what is left goes back, before those queued since */
    ps_copy *all = kept ? realloc(todo, (kept + s->ncopies) * sizeof *all) : NULL;
    if (all) {
        memcpy(all + kept, s->copies, s->ncopies * sizeof *all);
        free(s->copies);
        s->copies = all, s->ncopies += kept, s->capcopies = s->ncopies;
        todo = NULL;
    }
    pthread_rwlock_unlock(&s->route);
    free(todo);
}

static void *mover_main(void *arg)
{
    edl_ps_server *s = arg;
    pthread_mutex_lock(&s->mover_mu);
    while (!s->mover_stop) {
        pthread_mutex_unlock(&s->mover_mu);
        move_round(s);
        copy_round(s);
        pthread_mutex_lock(&s->mover_mu);
        if (s->mover_stop)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += MOVER_TICK_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&s->mover_cv, &s->mover_mu, &ts);
    }
    pthread_mutex_unlock(&s->mover_mu);
    return NULL;
}

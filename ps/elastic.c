/* elastic.c: a server's place in a changing set of servers. The map (edl_ps_servers) says who
 * holds each shard (edl_ps_shard_replicas over the names: its owner and its backups); this
 * server keeps, per table and shard, whether it holds it and whether the shard's data is here
 * (PS_SH_*), refuses requests for shards it does not serve (server.c asks ps_route_check under
 * the read side of s->el.route), takes the shards other servers send (PUT_SHARD), and queues
 * the copies its shards owe to servers that hold them from a new map on; the mover thread
 * (mover.c) sends them. Map changes and hand-overs take s->el.route for writing: a request is
 * served whole under one map, never half. */
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


void ps_elastic_init(edl_ps_server *s)
{
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
    /* map changes must not starve behind a stream of requests */
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&s->el.route, &a);
    pthread_rwlockattr_destroy(&a);
    pthread_mutex_init(&s->el.mover_mu, NULL);
    pthread_cond_init(&s->el.mover_cv, NULL);
    s->el.self = -1;
}

static void free_map(edl_ps_server *s)
{
    for (int i = 0; i < s->el.nserv; i++)
        free(s->el.names[i]), free(s->el.eps[i]);
    free(s->el.names), free(s->el.eps);
    s->el.names = s->el.eps = NULL;
    s->el.nserv = 0;
}

void ps_elastic_close(edl_ps_server *s)
{
    if (s->el.mover_started) {
        pthread_mutex_lock(&s->el.mover_mu);
        s->el.mover_stop = true;
        pthread_cond_signal(&s->el.mover_cv);
        pthread_mutex_unlock(&s->el.mover_mu);
        pthread_join(s->el.mover, NULL);
    }
    free_map(s);
    free(s->el.copies);
    for (int i = 0; i < EDL_PS_MAX_TABLES; i++)
        free(s->el.own[i]);
    pthread_rwlock_destroy(&s->el.route);
    pthread_mutex_destroy(&s->el.mover_mu);
    pthread_cond_destroy(&s->el.mover_cv);
}

bool ps_elastic_mapped(edl_ps_server *s)
{
    pthread_rwlock_rdlock(&s->el.route);
    bool mapped = s->el.mapped;
    pthread_rwlock_unlock(&s->el.route);
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

int ps_elastic_holders(edl_ps_server *s, const ps_table *t, uint32_t sh,
                       char names[EDL_PS_MAX_REPLICAS][256])
{
    int at[EDL_PS_MAX_REPLICAS], k = s->el.nserv ? holders(s->el.names, s->el.nserv, t, sh, at) : 0;
    for (int i = 0; i < k; i++)
        snprintf(names[i], 256, "%s", s->el.names[at[i]]);
    return k;
}

bool ps_elastic_holds(edl_ps_server *s, const ps_table *t, uint32_t sh, const char *who)
{
    return holds(s->el.names, s->el.nserv, t, sh, who);
}

/* This server holds shard sh of t in the newest map (its owner or a backup). */
static bool mine(const edl_ps_server *s, const ps_table *t, uint32_t sh)
{
    return s->el.self >= 0 && holds(s->el.names, s->el.nserv, t, sh, s->el.names[s->el.self]);
}

/* This server owns shard sh (no map: every shard), under the route lock. */
static bool owner(edl_ps_server *s, uint32_t sh)
{
    return !s->el.mapped ||
           edl_ps_shard_owner((const char *const *)s->el.names, s->el.nserv, sh) == s->el.self;
}

void ps_elastic_read_lock(edl_ps_server *s)
{
    pthread_rwlock_rdlock(&s->el.route);
}

void ps_elastic_read_unlock(edl_ps_server *s)
{
    pthread_rwlock_unlock(&s->el.route);
}

const uint8_t *ps_elastic_states(edl_ps_server *s, uint16_t id)
{
    return s->el.mapped ? s->el.own[id] : NULL;
}

bool ps_elastic_saves(edl_ps_server *s, uint16_t id, uint32_t sh)
{
    return (!s->el.own[id] || s->el.own[id][sh] == PS_SH_OWN) && owner(s, sh);
}

int ps_elastic_restore_shard(edl_ps_server *s, ps_table *t, uint16_t id, uint32_t sh,
                             const uint8_t *blob, size_t len, char *why, size_t whylen)
{
    pthread_rwlock_wrlock(&s->el.route);
    uint8_t *st = &s->el.own[id][sh];
    int rc = *st != PS_SH_RESTORE ? EDL_ECONFLICT
                                  : ps_table_shard_import(t, sh, blob, len, why, whylen);
    if (rc == 0)
        *st = PS_SH_OWN;
    pthread_rwlock_unlock(&s->el.route);
    return rc;
}

/* ---- the states --------------------------------------------------------------------------- */

static void set_pending(edl_ps_server *s, uint16_t id, uint8_t *st)
{
    *st = PS_SH_PENDING;
    s->el.pending_until[id] = edl_monotonic_ms() + s->o.handover_timeout_ms;
}

/* The states of table id, new to this server's map (under the route lock): a joining server's
 * shards come from the servers that hold them (any rows written here before the map are
 * dropped: they are no one's); others start here, from the job's checkpoint when it has one. */
static int states_of_new_table(edl_ps_server *s, uint16_t id, ps_table *t)
{
    uint32_t n = ps_table_config(t)->shards;
    uint8_t *own = malloc(n);
    for (uint32_t sh = 0; own && sh < n; sh++) {
        own[sh] = PS_SH_AWAY;
        if (mine(s, t, sh) && s->el.joining)
            set_pending(s, id, &own[sh]);
        else if (mine(s, t, sh))
            own[sh] = ps_ckpt_enabled(s) ? PS_SH_RESTORE : PS_SH_OWN;
        if (s->el.joining && !ps_table_shard_empty(t, sh))
            ps_table_shard_drop(t, sh);
    }
    s->el.own[id] = own;
    return own ? 0 : EDL_ENOMEM;
}

int ps_elastic_table_new(edl_ps_server *s, uint16_t id, ps_table *t)
{
    pthread_rwlock_wrlock(&s->el.route);
    int rc = s->el.mapped && !s->el.own[id] ? states_of_new_table(s, id, t) : 0;
    pthread_rwlock_unlock(&s->el.route);
    return rc;
}

/* The set of servers that hold shard sh changed (old: NULL on a first map): a copy goes to
 * every other server that holds it now. The copy waits until the shard is here; a server that
 * has it already ignores it, one that lacks it takes the first to come. */
static void queue_copies(edl_ps_server *s, uint16_t id, const ps_table *t, uint32_t sh,
                         char *const *old, int nold)
{
    int at[EDL_PS_MAX_REPLICAS], k = holders(s->el.names, s->el.nserv, t, sh, at), same = 0;
    for (int i = 0; old && i < k; i++)
        same += holds(old, nold, t, sh, s->el.names[at[i]]);
    int was[EDL_PS_MAX_REPLICAS], kold = old ? holders(old, nold, t, sh, was) : 0;
    if (!old || (same == k && kold == k))
        return;
    for (int i = 0; i < k; i++) {
        if (at[i] == s->el.self)
            continue;
        if (s->el.ncopies == s->el.capcopies) {
            size_t cap = s->el.capcopies ? 2 * s->el.capcopies : 64;
            ps_copy *c = realloc(s->el.copies, cap * sizeof *c);
            if (!c)
                return; /* the new holder times out and loads the checkpoint */
            s->el.copies = c, s->el.capcopies = cap;
        }
        ps_copy *c = &s->el.copies[s->el.ncopies++];
        *c = (ps_copy){.table = id, .shard = sh};
        snprintf(c->to, sizeof c->to, "%s", s->el.names[at[i]]);
    }
}

/* One shard under a new map. A shard that stops being served here has its sync step's sums
 * so far applied first (they go with it, as part of its rows). */
static void follow(edl_ps_server *s, uint16_t id, ps_table *t, uint32_t sh, char *const *old,
                   int nold)
{
    uint8_t *st = &s->el.own[id][sh];
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
    for (int i = 0; i < s->el.nserv; i++)
        free(s->el.eps[i]);
    free(s->el.eps);
    *old = s->el.names, *nold = s->el.nserv;
    s->el.names = names, s->el.eps = eps, s->el.nserv = m->n, s->el.self = -1;
    for (int i = 0; self && i < m->n; i++)
        if (strcmp(names[i], self) == 0)
            s->el.self = i;
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

int edl_ps_server_set_map(edl_ps_server *s, const edl_ps_servers *m, const char *self,
                          bool joining)
{
    if (check_map(m) != 0)
        return EDL_EINVAL;
    pthread_rwlock_wrlock(&s->el.route);
    int rc = 0;
    if (s->el.mapped && m->generation <= s->el.gen)
        goto out;
    bool first = !s->el.mapped;
    char **old = NULL;
    int nold = 0;
    if ((rc = copy_map(s, m, self, &old, &nold)) != 0)
        goto out;
    s->el.gen = m->generation;
    s->el.joining = first ? joining : s->el.joining;
    for (uint16_t id = 0; id < EDL_PS_MAX_TABLES; id++) {
        ps_table *t = atomic_load(&s->tables[id]);
        uint32_t n = t ? ps_table_config(t)->shards : 0;
        if (t && first && s->el.joining) /* tables made before the map (a hand-over's, a
                                          * client's) */
            rc = states_of_new_table(s, id, t) ? EDL_ENOMEM : rc;
        else if (t && first && !(s->el.own[id] = calloc(n, 1))) /* a fixed set's: all here */
            rc = EDL_ENOMEM;
        for (uint32_t sh = 0; s->el.own[id] && sh < n; sh++)
            follow(s, id, t, sh, old, nold);
    }
    for (int i = 0; i < nold; i++)
        free(old[i]);
    free(old);
    s->el.mapped = true;
    EDL_INFO("ps", "map %lld: %d servers, %s", (long long)m->generation, m->n,
             s->el.self >= 0 ? "this one among them" : "this one leaving");
out:
    pthread_rwlock_unlock(&s->el.route);
    pthread_mutex_lock(&s->el.mover_mu);
    if (!s->el.mover_started && rc == 0)
        s->el.mover_started = pthread_create(&s->el.mover, NULL, ps_mover_main, s) == 0;
    pthread_cond_signal(&s->el.mover_cv);
    pthread_mutex_unlock(&s->el.mover_mu);
    return rc;
}

bool edl_ps_server_drained(edl_ps_server *s)
{
    bool held = false;
    pthread_rwlock_rdlock(&s->el.route);
    for (int id = 0; id < EDL_PS_MAX_TABLES && !held; id++) {
        ps_table *t = atomic_load(&s->tables[id]);
        for (uint32_t sh = 0; t && s->el.own[id] && sh < ps_table_config(t)->shards; sh++)
            held |= s->el.own[id][sh] == PS_SH_HELD;
    }
    pthread_rwlock_unlock(&s->el.route);
    return !held;
}

/* ---- requests ----------------------------------------------------------------------------- */

static int refuse(const edl_ps_server *s, uint8_t st, uint16_t id, uint32_t sh, char *why,
                  size_t whylen)
{
    if (st == PS_SH_PENDING || st == PS_SH_RESTORE)
        return edl_errf(why, whylen, EDL_EBUSY, "shard %u of table %u is on its way to this "
                        "server (map %lld): ask again", sh, id, (long long)s->el.gen);
    return edl_errf(why, whylen, EDL_EMOVED, "shard %u of table %u is not served here in map "
                    "%lld", sh, id, (long long)s->el.gen);
}

int ps_route_check(edl_ps_server *s, const ps_request *r, const ps_table *t, char *why,
                   size_t whylen)
{
    const uint8_t *own = s->el.own[r->h.table];
    bool push = r->h.type == PS_PUSH_SPARSE || r->h.type == PS_PUSH_DENSE;
    if (push && s->el.mapped && (int64_t)r->gen != s->el.gen) /* its replicas are another map's */
        return edl_errf(why, whylen, (int64_t)r->gen < s->el.gen ? EDL_EMOVED : EDL_EBUSY,
                        "a push from a client on map %llu; this server is on map %lld",
                        (unsigned long long)r->gen, (long long)s->el.gen);
    if (!s->el.mapped || !own)
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
    pthread_rwlock_rdlock(&s->el.route); /* no table made before this server has the map */
    int rc = !s->el.mapped || (int64_t)r->gen > s->el.gen
                 ? edl_errf(why, whylen, EDL_EBUSY, "this server has not seen map %llu yet",
                            (unsigned long long)r->gen)
                 : 0;
    pthread_rwlock_unlock(&s->el.route);
    if (rc || (rc = ps_server_create_table(s, id, &r->cfg, why, whylen)) != 0)
        return rc;
    ps_table *t = atomic_load(&s->tables[id]);
    pthread_rwlock_wrlock(&s->el.route);
    uint8_t *st = s->el.own[id] ? &s->el.own[id][r->shard] : NULL;
    if (!s->el.mapped || (int64_t)r->gen > s->el.gen)
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
    pthread_rwlock_unlock(&s->el.route);
    return rc;
}

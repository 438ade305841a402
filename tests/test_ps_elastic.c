/* test_ps_elastic.c: parameter servers that join, leave and die while clients push. The map
 * of servers is given to the servers (edl_ps_server_set_map) and to the clients (their
 * `servers` source) as the job server would publish it; the servers hand shards to each other
 * over real TCP. Every gradient is 1 and the tables are SGD with lr 1 from zero, so each value
 * counts exactly how many times its gradient was applied: none lost, none applied twice. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "edl/etcd.h"
#include "edl/log.h"
#include "edl/ps.h"
#include "edl/wire.h"
#include "harness.h"
#include "internal.h"

#define KEYS 6000 /* a push of 9,000 keys: cut into lanes (ps/client.c, LANE_MIN_KEYS) */
#define DIM 4
#define DENSE 300000 /* cut into lanes too (LANE_MIN_FLOATS) */
#define SHARDS 64
#define PUSHERS 2

/* The maps of a test, each fixed once made; `now` is the newest published. */
typedef struct maps {
    harness_ps *k;
    const char *names[8][HARNESS_PS_MAX], *eps[8][HARNESS_PS_MAX];
    int n[8];
    atomic_int now;
    uint32_t replicas; /* of the tables (0: 1) */
} maps;

static const char *const server_names[] = {"ps-0", "ps-1", "ps-2", "ps-3"};

/* Map gen: the servers listed in members (indexes into k). */
static void make_map(maps *m, int gen, const int *members, int n)
{
    for (int i = 0; i < n; i++) {
        m->names[gen][i] = server_names[members[i]];
        m->eps[gen][i] = m->k->ep[members[i]];
    }
    m->n[gen] = n;
}

static edl_ps_servers map_of(maps *m, int gen)
{
    return (edl_ps_servers){.generation = gen, .n = m->n[gen], .names = m->names[gen],
                            .endpoints = m->eps[gen]};
}

static int source(void *arg, int64_t newer_than, edl_ps_servers *out)
{
    maps *m = arg;
    int gen = atomic_load(&m->now);
    if (gen <= newer_than)
        return 0;
    *out = map_of(m, gen);
    return 1;
}

/* Publish map gen to the servers in `to` (indexes; the job server's watchers), then to the
 * clients. joiner: the index of a server that joins with it (-1: none). */
static void publish(maps *m, int gen, const int *to, int nto, int joiner)
{
    edl_ps_servers map = map_of(m, gen);
    for (int i = 0; i < nto; i++)
        assert_int_equal(edl_ps_server_set_map(m->k->srv[to[i]], &map, server_names[to[i]],
                                               to[i] == joiner), 0);
    atomic_store(&m->now, gen);
}

/* Servers 0..2 of m->k on free loopback ports (o: their options); map 1 holds `first` and is
 * published, map 2 holds `second` and waits. */
static void start_maps(maps *m, const edl_ps_server_options *o, const int *first, int nfirst,
                       const int *second, int nsecond)
{
    harness_ps_open(m->k, 3, o);
    make_map(m, 1, first, nfirst);
    make_map(m, 2, second, nsecond);
    publish(m, 1, first, nfirst, -1);
}

static edl_ps_client *client_of(maps *m, int gen)
{
    edl_ps_client_options o = {.endpoints = m->eps[gen], .names = m->names[gen],
                               .n_servers = m->n[gen], .job = "job-a", .secret = &m->k->secret,
                               .timeout_ms = 30000, .servers = source, .servers_arg = m,
                               .generation = gen};
    edl_ps_client *c = NULL;
    char why[512];
    if (edl_ps_client_open(&o, &c, why, sizeof why) != 0)
        fail_msg("client: %s", why);
    return c;
}

static void create_tables(edl_ps_client *c, const maps *m)
{
    edl_ps_table_config sp, dn;
    edl_ps_table_config_init(&sp);
    sp.dim = DIM, sp.shards = SHARDS, sp.lr = 1, sp.init = EDL_PS_INIT_ZERO;
    sp.replicas = m->replicas ? m->replicas : 1;
    dn = sp;
    dn.kind = EDL_PS_DENSE, dn.dim = 1, dn.size = DENSE;
    harness_ps_ok(c, edl_ps_create_table(c, 0, &sp));
    harness_ps_ok(c, edl_ps_create_table(c, 1, &dn));
}

typedef struct pusher {
    maps *m;
    int rounds;
    atomic_int *done; /* rounds finished, over all pushers */
    int rc;
    char err[1024];
} pusher;

/* One round: a gradient of 1 for every key (half of them twice in the call: summed) and for
 * every dense element. */
static int push_round(edl_ps_client *c)
{
    uint64_t keys[KEYS + KEYS / 2];
    float g[(KEYS + KEYS / 2) * DIM], dg[DENSE];
    for (int i = 0; i < KEYS + KEYS / 2; i++)
        keys[i] = i < KEYS ? (uint64_t)i * 7919 : (uint64_t)(i - KEYS) * 2 * 7919;
    for (int i = 0; i < (KEYS + KEYS / 2) * DIM; i++) /* the even keys come twice */
        g[i] = i / DIM >= KEYS || (i / DIM) % 2 == 0 ? 0.5f : 1.0f;
    for (int i = 0; i < DENSE; i++)
        dg[i] = 1;
    int rc = edl_ps_push_sparse(c, 0, keys, KEYS + KEYS / 2, g);
    return rc ? rc : edl_ps_push_dense(c, 1, 0, DENSE, dg);
}

static void *pusher_main(void *arg)
{
    pusher *p = arg;
    edl_ps_client *c = client_of(p->m, atomic_load(&p->m->now));
    create_tables(c, p->m);
    for (int r = 0; r < p->rounds && p->rc == 0; r++) {
        if ((p->rc = push_round(c)) != 0)
            snprintf(p->err, sizeof p->err, "%s", edl_ps_client_errmsg(c));
        atomic_fetch_add(p->done, 1);
    }
    edl_ps_client_close(c);
    return NULL;
}

/* Every key and element must have been applied `want` times (want_lost for the keys and
 * elements of the shards in lost[], when given). */
/* check_counts with the lost shards of the sparse table at want_sparse and of the dense one at
 * want_dense (restored from different checkpoints). */
static void check_counts_of(maps *m, int want, const bool *lost, int want_sparse, int want_dense)
{
    edl_ps_client *c = client_of(m, atomic_load(&m->now));
    create_tables(c, m);
    uint64_t keys[KEYS];
    static float rows[KEYS * DIM], dense[DENSE];
    for (int i = 0; i < KEYS; i++)
        keys[i] = (uint64_t)i * 7919;
    harness_ps_ok(c, edl_ps_pull_sparse(c, 0, keys, KEYS, rows));
    harness_ps_ok(c, edl_ps_pull_dense(c, 1, 0, DENSE, dense));
    for (int i = 0; i < KEYS * DIM; i++) {
        bool l = lost && lost[edl_ps_key_shard(keys[i / DIM], SHARDS)];
        if (rows[i] != -(float)(l ? want_sparse : want))
            fail_msg("key %llu column %d: applied %g times, not %d", (unsigned long long)
                     keys[i / DIM], i % DIM, -(double)rows[i], l ? want_sparse : want);
    }
    for (int i = 0; i < DENSE; i++) {
        bool l = lost && lost[SHARDS + edl_ps_dense_shard(i, DENSE, SHARDS)];
        if (dense[i] != -(float)(l ? want_dense : want))
            fail_msg("dense %d: applied %g times, not %d", i, -(double)dense[i],
                     l ? want_dense : want);
    }
    edl_ps_client_close(c);
}

static void check_counts(maps *m, int want, const bool *lost, int want_lost)
{
    check_counts_of(m, want, lost, want_lost, want_lost);
}

static void start_pushers(pusher *p, pthread_t *th, maps *m, int rounds, atomic_int *done)
{
    for (int i = 0; i < PUSHERS; i++) {
        p[i] = (pusher){.m = m, .rounds = rounds, .done = done};
        assert_int_equal(pthread_create(&th[i], NULL, pusher_main, &p[i]), 0);
    }
}

static void join_pushers(pusher *p, pthread_t *th)
{
    for (int i = 0; i < PUSHERS; i++) {
        pthread_join(th[i], NULL);
        if (p[i].rc)
            fail_msg("pusher %d: %s (%s)", i, p[i].err, edl_err_name(p[i].rc));
    }
}

static void wait_rounds(atomic_int *done, int n)
{
    for (int i = 0; i < 30000 && atomic_load(done) < n; i++)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    assert_true(atomic_load(done) >= n);
}

static void stats_of(edl_ps_server *s, edl_ps_server_stats *st)
{
    edl_ps_server_get_stats(s, st);
}

static void test_a_server_joins_while_clients_push_and_every_update_is_applied_once(void **state)
{
    (void)state;
    harness_ps k;
    maps m = {.k = &k};
    start_maps(&m, NULL, (int[]){0, 1}, 2, (int[]){0, 1, 2}, 3);
    pusher p[PUSHERS];
    pthread_t th[PUSHERS];
    atomic_int done = 0;
    start_pushers(p, th, &m, 40, &done);
    wait_rounds(&done, 10);
    publish(&m, 2, (int[]){0, 1, 2}, 3, 2); /* ps-2 joins; 0 and 1 hand it its shards */
    join_pushers(p, th);
    check_counts(&m, PUSHERS * 40, NULL, 0);

    edl_ps_server_stats s0, s1, s2;
    stats_of(k.srv[0], &s0), stats_of(k.srv[1], &s1), stats_of(k.srv[2], &s2);
    int moved = 0;
    for (uint32_t sh = 0; sh < SHARDS; sh++)
        moved += edl_ps_shard_owner(m.names[2], 3, sh) == 2;
    assert_int_equal(s2.shards_in, 2 * moved); /* the sparse and the dense table's */
    assert_int_equal(s0.shards_out + s1.shards_out, s2.shards_in);
    assert_int_equal(s0.shards_lost + s1.shards_lost + s2.shards_lost, 0);
    assert_true(moved > SHARDS / 6 && moved < SHARDS / 2); /* about 1/3, not half */
    assert_true(edl_ps_server_drained(k.srv[0]) && edl_ps_server_drained(k.srv[1]));
    harness_ps_close(&k);
}

/* A trainer at the workers' barrier: step UINT64_MAX asks where the servers are, then the
 * barrier of that step until every server of its map has seen `trainers` arrive (10 s at most). */
typedef struct at_barrier {
    edl_ps_client *c;
    ps_arrival who;
    int rc;
    bool applied;
} at_barrier;

static void *meet(void *arg)
{
    at_barrier *b = arg;
    uint64_t step = 0, done;
    b->rc = ps_client_barrier(b->c, PS_SPACE_WORKERS, &b->who, UINT64_MAX, 2, &b->applied,
                              &step);
    b->applied = false;
    for (int64_t end = harness_now_ms() + 10000; b->rc == 0 && !b->applied &&
         harness_now_ms() < end;)
        b->rc = ps_client_barrier(b->c, PS_SPACE_WORKERS, &b->who, step, 2, &b->applied, &done);
    return NULL;
}

/* Two trainers meet at the workers' barrier after ps-2 joined: one pushed since and was moved
 * to the new map, the other has sent nothing (a server checks the map of pushes only, so
 * nothing told it). A barrier asks for the newest map first: both ask the same three servers
 * and both pass. Before, the one on the old map passed on ps-0 and ps-1, and the other waited
 * on ps-2 for the second trainer forever (seen with examples/ctr under edl run). */
static void test_trainers_on_different_maps_meet_at_the_barrier(void **state)
{
    (void)state;
    harness_ps k;
    maps m = {.k = &k};
    start_maps(&m, NULL, (int[]){0, 1}, 2, (int[]){0, 1, 2}, 3);
    at_barrier a = {.c = client_of(&m, 1), .who.token = 1};
    at_barrier b = {.c = client_of(&m, 1), .who.token = 2};
    create_tables(a.c, &m);
    create_tables(b.c, &m);
    publish(&m, 2, (int[]){0, 1, 2}, 3, 2);
    harness_ps_ok(b.c, push_round(b.c)); /* refused on map 1: b follows map 2 */
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, meet, &a), 0);
    meet(&b);
    pthread_join(th, NULL);
    harness_ps_ok(a.c, a.rc);
    harness_ps_ok(b.c, b.rc);
    assert_true(a.applied && b.applied);
    edl_ps_client_close(a.c);
    edl_ps_client_close(b.c);
    harness_ps_close(&k);
}

/* One ask at the workers' barrier of step for 2 trainers (a waiting one is answered "not yet"
 * within PS_SYNC_POLL_MS): 1 applied, 0 not yet, or the client's error. */
static int ask_barrier(edl_ps_client *c, uint64_t token, uint32_t gen, uint64_t step)
{
    ps_arrival who = {token, gen};
    bool applied = false;
    uint64_t done;
    int rc = ps_client_barrier(c, PS_SPACE_WORKERS, &who, step, 2, &applied, &done);
    return rc ? rc : applied;
}

/* The agent restarts every worker for a new generation, so a barrier's arrivals from an earlier
 * generation are of trainers that are gone: the first barrier of a later generation clears
 * them, and a late barrier of the earlier one is refused with both generations named. Before,
 * the arrivals of two gone trainers completed the barrier for the first new one, and the others
 * then waited for it at the next step forever (examples/ctr under edl run, a worker killed
 * while the others waited at the end). Without a generation (0), nothing is checked. */
static void test_a_later_generation_leaves_the_barrier_arrivals_of_gone_trainers(void **state)
{
    (void)state;
    harness_ps k;
    harness_ps_open(&k, 2, NULL);
    edl_ps_client *c = harness_ps_client(&k, 10000);
    assert_int_equal(ask_barrier(c, 1, 2, 0), 0); /* generation 2: one of two arrived */
    assert_int_equal(ask_barrier(c, 2, 3, UINT64_MAX), 1); /* generation 3 asks where we are */
    assert_int_equal(ask_barrier(c, 2, 3, 0), 0); /* ... and does not count token 1 */
    assert_int_equal(ask_barrier(c, 1, 2, 0), EDL_ECONFLICT);
    assert_non_null(strstr(edl_ps_client_errmsg(c), "generation 2; the workers are at "
                                                    "generation 3"));
    assert_int_equal(ask_barrier(c, 3, 3, 0), 1); /* the second of generation 3 */
    assert_int_equal(ask_barrier(c, 2, 3, 0), 1); /* done for the first one too */
    assert_int_equal(ask_barrier(c, 4, 0, 1), 0); /* no generation: counted as before */
    assert_int_equal(ask_barrier(c, 5, 0, 1), 1);
    edl_ps_client_close(c);
    harness_ps_close(&k);
}

/* A joining server that has tables before its first map (under etcd, a client can see the new
 * generation before the server does and create its tables there): its first map makes its
 * shards wait for their holders, not start anew as its own, and the stray row it held is
 * dropped. Every update is applied once (before the fix: the joiner served fresh rows and
 * dropped the hand-overs as late copies). */
static void test_a_joiner_with_tables_before_its_map_waits_for_its_shards(void **state)
{
    (void)state;
    harness_ps k;
    maps m = {.k = &k};
    start_maps(&m, NULL, (int[]){0, 1}, 2, (int[]){0, 1, 2}, 3);
    const char *eps[] = {k.ep[2]}, *names[] = {server_names[2]};
    edl_ps_client_options o = {.endpoints = eps, .names = names, .n_servers = 1,
                               .job = "job-a", .secret = &k.secret, .timeout_ms = 10000};
    edl_ps_client *early = NULL;
    char why[512];
    if (edl_ps_client_open(&o, &early, why, sizeof why) != 0)
        fail_msg("client: %s", why);
    create_tables(early, &m); /* ps-2 has the tables, and no map yet */
    uint64_t stray = 42;
    float ones[DIM];
    for (int i = 0; i < DIM; i++)
        ones[i] = 1;
    harness_ps_ok(early, edl_ps_push_sparse(early, 0, &stray, 1, ones));
    edl_ps_client_close(early);
    pusher p[PUSHERS];
    pthread_t th[PUSHERS];
    atomic_int done = 0;
    start_pushers(p, th, &m, 40, &done);
    wait_rounds(&done, 10);
    /* the joiner and the clients have map 2 before its old holders do: the clients come to
     * the joiner while its shards are still with the others */
    edl_ps_servers map2 = map_of(&m, 2);
    assert_int_equal(edl_ps_server_set_map(k.srv[2], &map2, server_names[2], true), 0);
    atomic_store(&m.now, 2);
    nanosleep(&(struct timespec){0, 300 * 1000000L}, NULL);
    publish(&m, 2, (int[]){0, 1}, 2, -1);
    join_pushers(p, th);
    check_counts(&m, PUSHERS * 40, NULL, 0);
    edl_ps_server_stats s2;
    stats_of(k.srv[2], &s2);
    assert_true(s2.shards_in > 0); /* its shards came from the others */
    harness_ps_close(&k);
}

static void test_a_leaving_server_hands_its_shards_over_before_it_exits(void **state)
{
    (void)state;
    harness_ps k;
    maps m = {.k = &k};
    start_maps(&m, NULL, (int[]){0, 1, 2}, 3, (int[]){0, 1}, 2);
    pusher p[PUSHERS];
    pthread_t th[PUSHERS];
    atomic_int done = 0;
    start_pushers(p, th, &m, 40, &done);
    wait_rounds(&done, 10);
    publish(&m, 2, (int[]){0, 1, 2}, 3, -1); /* ps-2 is told it leaves */
    for (int i = 0; i < 10000 && !edl_ps_server_drained(k.srv[2]); i++)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    assert_true(edl_ps_server_drained(k.srv[2]));
    edl_ps_server_stats s2;
    stats_of(k.srv[2], &s2);
    edl_ps_server_close(k.srv[2]); /* it exits */
    k.srv[2] = NULL;
    join_pushers(p, th);
    check_counts(&m, PUSHERS * 40, NULL, 0);
    int owned = 0;
    for (uint32_t sh = 0; sh < SHARDS; sh++)
        owned += edl_ps_shard_owner(m.names[1], 3, sh) == 2;
    assert_int_equal(s2.shards_out, 2 * owned);
    assert_int_equal(s2.rows, 0); /* it forgot what it handed over */
    harness_ps_close(&k);
}

/* ---- what a server's loss prints ------------------------------------------------------------ */

/* The library's log goes to a file while a test looks at it. */
static FILE *log_capture(void)
{
    FILE *f = tmpfile();
    assert_non_null(f);
    edl_log_setup(EDL_LOG_INFO, EDL_LOG_PLAIN, f);
    return f;
}

typedef struct loss_lines {
    int lines, per_shard;         /* summary lines; lines about one shard (none wanted) */
    int tables[EDL_PS_MAX_TABLES]; /* summary lines of each table */
    unsigned total, restored, anew; /* their sums */
    char first[1024];
} loss_lines;

/* Stop capturing and read what the servers said about shards nobody handed over. */
static loss_lines log_losses(FILE *f)
{
    loss_lines r = {0};
    char line[1024];
    edl_log_setup(EDL_LOG_INFO, EDL_LOG_PLAIN, NULL);
    rewind(f);
    while (fgets(line, sizeof line, f)) {
        const char *t = strstr(line, "ps: table "), *c = strrchr(line, ':');
        unsigned id, n, restored, anew;
        r.per_shard += strstr(line, "shard ") && strstr(line, " of table ") ? 1 : 0;
        if (!t || !strstr(line, "were not handed over") ||
            sscanf(t, "ps: table %u: %u shards", &id, &n) != 2 ||
            sscanf(c, ": %u restored, %u start again from initial values", &restored,
                   &anew) != 2 || id >= EDL_PS_MAX_TABLES)
            continue;
        if (!r.lines++)
            snprintf(r.first, sizeof r.first, "%s", line);
        r.tables[id]++;
        r.total += n, r.restored += restored, r.anew += anew;
    }
    fclose(f);
    return r;
}

/* The dead server's shards: each survivor says in one line a table how many it took and
 * where they came from (here: none restored, every one from initial values). */
static void check_loss_lines(const loss_lines *l, int survivors, unsigned restored,
                             unsigned anew)
{
    print_message("%d lines about lost shards (%d about single shards): %s", l->lines,
                  l->per_shard, l->first);
    assert_int_equal(l->per_shard, 0);
    for (int id = 0; id < 2; id++) /* each table: at most one line from each survivor */
        assert_true(l->tables[id] >= 1 && l->tables[id] <= survivors);
    assert_int_equal(l->total, restored + anew);
    assert_int_equal(l->restored, restored);
    assert_int_equal(l->anew, anew);
}

static void test_a_dead_servers_shards_start_again_and_the_clients_do_not_hang(void **state)
{
    (void)state;
    harness_ps k;
    edl_ps_server_options o = {.handover_timeout_ms = 300};
    harness_ps_open(&k, 3, &o);
    maps m = {.k = &k};
    make_map(&m, 1, (int[]){0, 1, 2}, 3);
    make_map(&m, 2, (int[]){0, 1}, 2);
    publish(&m, 1, (int[]){0, 1, 2}, 3, -1);
    pusher p[PUSHERS];
    pthread_t th[PUSHERS];
    atomic_int done = 0;
    start_pushers(p, th, &m, 10, &done);
    join_pushers(p, th);
    FILE *log = log_capture();
    edl_ps_server_close(k.srv[2]); /* dies: nothing handed over */
    k.srv[2] = NULL;
    publish(&m, 2, (int[]){0, 1}, 2, -1); /* its lease expired: the job server drops it */
    atomic_store(&done, 0);
    start_pushers(p, th, &m, 10, &done);
    join_pushers(p, th);
    bool lost[2 * SHARDS] = {0};
    int nlost = 0;
    for (uint32_t sh = 0; sh < SHARDS; sh++)
        if (edl_ps_shard_owner(m.names[1], 3, sh) == 2)
            lost[sh] = lost[SHARDS + sh] = true, nlost += 2;
    check_counts(&m, PUSHERS * 20, lost, PUSHERS * 10);
    edl_ps_server_stats s0, s1;
    stats_of(k.srv[0], &s0), stats_of(k.srv[1], &s1);
    assert_int_equal(s0.shards_lost + s1.shards_lost, nlost);
    harness_ps_close(&k);
    loss_lines l = log_losses(log);
    check_loss_lines(&l, 2, 0, (unsigned)nlost);
}

/* With two replicas a shard's updates are applied by its owner and a backup before they are
 * acknowledged: a server closed without a hand-over (as SIGKILL would) while the clients push
 * loses none of them; the survivors copy the shards to their new backups. */
static void test_with_replicas_a_killed_server_loses_no_acknowledged_update(void **state)
{
    (void)state;
    harness_ps k;
    maps m = {.k = &k, .replicas = 2};
    start_maps(&m, NULL, (int[]){0, 1, 2}, 3, (int[]){0, 1}, 2);
    pusher p[PUSHERS];
    pthread_t th[PUSHERS];
    atomic_int done = 0;
    start_pushers(p, th, &m, 40, &done);
    wait_rounds(&done, 10);
    edl_ps_server_close(k.srv[2]); /* dies with its shards, pushes in flight */
    k.srv[2] = NULL;
    publish(&m, 2, (int[]){0, 1}, 2, -1);
    join_pushers(p, th);
    check_counts(&m, PUSHERS * 40, NULL, 0);
    edl_ps_server_stats s0, s1;
    stats_of(k.srv[0], &s0), stats_of(k.srv[1], &s1);
    assert_int_equal(s0.shards_lost + s1.shards_lost, 0);
    for (int i = 0; i < 2000 && (s0.rows != KEYS || s1.rows != KEYS); i++) {
        nanosleep(&(struct timespec){0, 5000000}, NULL); /* the copies to the new backups */
        stats_of(k.srv[0], &s0), stats_of(k.srv[1], &s1);
    }
    assert_int_equal(s0.rows, KEYS); /* two servers, two replicas: each holds every row */
    assert_int_equal(s1.rows, KEYS);
    int copied = 0;
    for (uint32_t sh = 0; sh < SHARDS; sh++) {
        int at[2];
        edl_ps_shard_replicas(m.names[1], 3, sh, 2, at);
        copied += at[0] == 2 || at[1] == 2; /* the dead one held it: one survivor copies it */
    }
    assert_true(s0.shards_in + s1.shards_in >= (uint64_t)(2 * copied));
    harness_ps_close(&k);
}

/* A hand-over that does not fit the table, and one from a map the server has not seen. */
static void test_a_bad_hand_over_is_refused_and_the_server_keeps_serving(void **state)
{
    (void)state;
    harness_ps k;
    harness_ps_open(&k, 2, NULL);
    maps m = {.k = &k};
    make_map(&m, 1, (int[]){0, 1}, 2);
    publish(&m, 1, (int[]){0, 1}, 2, -1);
    edl_ps_client *c = client_of(&m, 1);
    create_tables(c, &m);
    edl_ps_client *one = harness_ps_client(&(harness_ps){.n = 1, .srv = {k.srv[0]},
                                                          .ep = {k.ep[0]}, .secret = k.secret},
                                           5000);
    edl_ps_table_config cfg = *ps_client_table(c, 0);
    uint32_t sh = 0;
    while (edl_ps_shard_owner(m.names[1], 2, sh) != 0)
        sh++;
    uint8_t blob[24 + 8 + 4 * DIM] = {0};
    blob[0] = 1, blob[4] = DIM;               /* one row ... */
    uint64_t key = 1;
    while (edl_ps_key_shard(key, SHARDS) == sh)
        key++;
    memcpy(blob + 24, &key, 8);               /* ... of a key of another shard */
    assert_int_equal(ps_client_put_shard(one, 0, &cfg, sh, 1, blob, sizeof blob), EDL_EPROTO);
    assert_non_null(strstr(edl_ps_client_errmsg(one), "is not of shard"));
    assert_int_equal(ps_client_put_shard(one, 0, &cfg, sh, 9, blob, sizeof blob), EDL_EBUSY);
    uint32_t away = 0;
    while (edl_ps_shard_owner(m.names[1], 2, away) != 1)
        away++;
    assert_int_equal(ps_client_put_shard(one, 0, &cfg, away, 1, blob, 24), EDL_EMOVED);
    assert_int_equal(push_round(c), 0); /* still serving */
    check_counts(&m, 1, NULL, 0);
    edl_ps_client_close(one);
    edl_ps_client_close(c);
    harness_ps_close(&k);
}

/* ---- the CTR accessor's rows move whole ---------------------------------------------------- */

static void ctr_cfg(edl_ps_table_config *cfg)
{
    edl_ps_table_config_init(cfg);
    cfg->dim = 5, cfg->shards = 8, cfg->optimizer = EDL_PS_ADAM, cfg->lr = 0.05f;
    cfg->accessor = EDL_PS_ACCESSOR_CTR;
    cfg->ctr = (edl_ps_ctr_config){.nonclk_coeff = 1, .click_coeff = 1, .embedx_threshold = 3,
                                   .show_click_decay_rate = 0.5f, .delete_threshold = 0.9f,
                                   .delete_after_unseen_days = 5};
}

/* n keys 1..n pushed: key i with show i % 5 (embedx from 3) and a gradient of its own. */
static void ctr_push_all(ps_table *t, int n, float g)
{
    static uint8_t keys[200 * 8];
    static float v[200 * 7];
    for (int i = 0; i < n; i++) {
        edl_put64(keys + 8 * i, (uint64_t)i + 1);
        v[7 * i] = (float)(i % 5), v[7 * i + 1] = i % 5 == 4;
        for (int j = 0; j < 5; j++)
            v[7 * i + 2 + j] = g * (float)(j + 1 + i % 3);
    }
    assert_int_equal(ps_table_push_sparse(t, keys, (uint32_t)n, (const uint8_t *)v, NULL), 0);
}

static void ctr_pull_all(ps_table *t, int n, float *rows)
{
    static uint8_t keys[200 * 8];
    for (int i = 0; i < n; i++)
        edl_put64(keys + 8 * i, (uint64_t)i + 1);
    assert_int_equal(ps_table_pull_sparse(t, keys, (uint32_t)n, rows), 0);
}

/* Every shard of a and b exports the same bytes (move: imported from a into b first). */
static void ctr_same(ps_table *a, ps_table *b, bool move)
{
    char why[256];
    for (uint32_t sh = 0; sh < 8; sh++) {
        uint8_t *p, *q;
        size_t len, len2;
        assert_int_equal(ps_table_shard_export(a, sh, false, &p, &len), 0);
        if (move && ps_table_shard_import(b, sh, p, len, why, sizeof why) != 0)
            fail_msg("shard %u: %s", sh, why);
        assert_int_equal(ps_table_shard_export(b, sh, false, &q, &len2), 0);
        assert_int_equal(len, len2);
        assert_memory_equal(p, q, len);
        free(p), free(q);
    }
}

/* A CTR shard's bytes carry show, click, unseen, embed_w, whether embedx exists and its
 * values, and every optimizer state (Adam's powers): after a move the two tables answer, grow
 * embedx and shrink alike. Bytes that lie are refused and leave the shard empty. */
static void test_ctr_shards_move_with_their_statistics_and_embedx(void **state)
{
    (void)state;
    edl_ps_table_config cfg, plain;
    ctr_cfg(&cfg);
    ps_table *a, *b, *p;
    assert_int_equal(ps_table_new(&cfg, &a), 0);
    assert_int_equal(ps_table_new(&cfg, &b), 0);
    static float ra[200 * 5], rb[200 * 5];
    ctr_push_all(a, 200, 0.1f);
    ctr_push_all(a, 200, -0.3f); /* shows 0..8: embedx on the keys of show >= 3 */
    uint64_t ev, left, ev2, left2;
    assert_int_equal(ps_table_shrink(a, 1, NULL, NULL, &ev, &left), 0); /* unseen 1, halved */
    assert_int_equal(ev, 40); /* show 0 */
    ctr_same(a, b, true);
    ctr_pull_all(a, 200, ra), ctr_pull_all(b, 200, rb);
    assert_memory_equal(ra, rb, sizeof ra);
    ctr_push_all(a, 200, 0.2f), ctr_push_all(b, 200, 0.2f); /* shows 0 (new), 2, 4, 6, 8 */
    ctr_pull_all(a, 200, ra), ctr_pull_all(b, 200, rb);
    assert_memory_equal(ra, rb, sizeof ra);
    assert_int_equal(ps_table_shrink(a, 2, NULL, NULL, &ev, &left), 0);
    assert_int_equal(ps_table_shrink(b, 2, NULL, NULL, &ev2, &left2), 0);
    assert_true(ev == 40 && ev2 == 40 && left == 160 && left2 == 160);
    assert_int_equal(ps_table_shrink(b, 2, NULL, NULL, &ev2, &left2), 0); /* again: the same */
    assert_true(ev2 == 40 && left2 == 160);
    ctr_same(a, b, false); /* and the repeat did not decay b again */

    char why[256];
    uint8_t *blob;
    size_t len;
    uint32_t sh = edl_ps_key_shard(4, 8); /* key 4: show 3 + 3 + 3, embedx */
    assert_int_equal(ps_table_shard_export(a, sh, false, &blob, &len), 0);
    uint32_t n = edl_get32(blob), stride = edl_get32(blob + 4);
    assert_int_equal(ps_table_shard_import(b, sh, blob, len - 4, why, sizeof why), EDL_EPROTO);
    uint8_t *flag = NULL;
    for (uint32_t i = 0; i < n && !flag; i++) /* a row with embedx: its flag says 2 */
        if (edl_get32(blob + 24 + 8 * n + 4 * (i * stride + 3)) == 1)
            flag = blob + 24 + 8 * n + 4 * (i * stride + 3);
    assert_non_null(flag);
    edl_put32(flag, 2);
    assert_int_equal(ps_table_shard_import(b, sh, blob, len, why, sizeof why), EDL_EPROTO);
    assert_non_null(strstr(why, "neither 0 nor 1"));
    edl_put32(flag, 0); /* no embedx said, but its bytes are there */
    assert_int_equal(ps_table_shard_import(b, sh, blob, len, why, sizeof why), EDL_EPROTO);
    free(blob);
    uint64_t rows_a, rows_b, bytes;
    ps_table_shard_drop(a, sh);
    ps_table_stats(a, &rows_a, &bytes);
    ps_table_stats(b, &rows_b, &bytes);
    assert_int_equal(rows_b, rows_a); /* b's shard emptied by the refusals, a's by the drop */
    plain = cfg, plain.accessor = EDL_PS_ACCESSOR_PLAIN; /* its shard into a CTR table */
    assert_int_equal(ps_table_new(&plain, &p), 0);
    uint8_t key4[8];
    edl_put64(key4, 4);
    assert_int_equal(ps_table_push_sparse(p, key4, 1, (const uint8_t *)ra, NULL), 0);
    assert_int_equal(ps_table_shard_export(p, sh, false, &blob, &len), 0);
    assert_int_equal(ps_table_shard_import(b, sh, blob, len, why, sizeof why), EDL_EPROTO);
    assert_non_null(strstr(why, "embedx parts of 0"));
    free(blob);
    ps_table_free(a), ps_table_free(b), ps_table_free(p);
}

/* A server joins a job with a CTR table: the shards handed to it carry the rows whole (pulls
 * answer the same, embedx included), and a shrink then evicts what the statistics say. */
static void test_a_ctr_table_moves_to_a_joining_server(void **state)
{
    (void)state;
    enum { N = 400 };
    harness_ps k;
    harness_ps_open(&k, 2, NULL);
    maps m = {.k = &k};
    make_map(&m, 1, (int[]){0}, 1);
    make_map(&m, 2, (int[]){0, 1}, 2);
    publish(&m, 1, (int[]){0}, 1, -1);
    edl_ps_client *c = client_of(&m, 1);
    edl_ps_table_config cfg;
    ctr_cfg(&cfg);
    cfg.shards = SHARDS;
    harness_ps_ok(c, edl_ps_create_table(c, 3, &cfg));
    static uint64_t keys[N];
    static float v[N * 7], before[N * 5], after[N * 5];
    for (int i = 0; i < N; i++) {
        keys[i] = (uint64_t)i * 7919 + 1;
        v[7 * i] = i % 2 ? 4 : 1; /* show 4: embedx; show 1: 0.5 after a shrink, evicted */
        for (int j = 1; j < 7; j++)
            v[7 * i + j] = 0.01f * (float)j;
    }
    harness_ps_ok(c, edl_ps_push_sparse(c, 3, keys, N, v));
    harness_ps_ok(c, edl_ps_push_sparse(c, 3, keys, N, v));
    harness_ps_ok(c, edl_ps_pull_sparse(c, 3, keys, N, before));
    publish(&m, 2, (int[]){0, 1}, 2, 1); /* ps-1 joins; ps-0 hands it its shards */
    harness_ps_ok(c, edl_ps_pull_sparse(c, 3, keys, N, after));
    for (int i = 0; i < 10000 && !edl_ps_server_drained(k.srv[0]); i++)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    assert_true(edl_ps_server_drained(k.srv[0]));
    assert_memory_equal(before, after, sizeof before);
    assert_true(after[5 + 1] != 0 && after[1] == 0); /* key 1 has embedx, key 0 none */
    edl_ps_server_stats s1;
    stats_of(k.srv[1], &s1);
    assert_true(s1.shards_in > 0 && s1.rows > 0);
    uint64_t ev;
    harness_ps_ok(c, edl_ps_shrink(c, 3, &ev)); /* show 2: 1, kept; show 8: 4 */
    assert_int_equal(ev, 0);
    harness_ps_ok(c, edl_ps_shrink(c, 3, &ev)); /* 0.5: evicted; 2 */
    assert_int_equal(ev, N / 2);
    edl_ps_client_close(c);
    harness_ps_close(&k);
}

/* A PS job that checkpoints: etcd, a file:// store in a new directory, servers 0..2 on map 1
 * (map 2: servers 0 and 1), a client with both tables. */
typedef struct psck {
    edl_etcd_server *etcd;
    struct edl_etcd *cl;
    char dir[32], uri[64];
    edl_ckpt_config cfg;
    edl_ps_server_options o;
    harness_ps k;
    maps m;
    edl_ps_client *c;
    bool lost[2 * SHARDS]; /* after lose_server_2: the shards that were server 2's */
    int nlost;
} psck;

static void psck_open(psck *p, const char *job)
{
    memset(p, 0, sizeof *p);
    p->etcd = harness_etcd_open(1, NULL);
    p->cl = harness_client(edl_etcd_server_endpoints(p->etcd), 5000);
    snprintf(p->dir, sizeof p->dir, "/tmp/edl-psck-XXXXXX");
    assert_non_null(mkdtemp(p->dir));
    snprintf(p->uri, sizeof p->uri, "file://%s", p->dir);
    edl_ckpt_config_init(&p->cfg);
    p->cfg.uri = p->uri, p->cfg.etcd = p->cl, p->cfg.job = job, p->cfg.commit_timeout_ms = 20000;
    p->o = (edl_ps_server_options){.handover_timeout_ms = 300, .checkpoint = &p->cfg};
    p->m.k = &p->k;
    start_maps(&p->m, &p->o, (int[]){0, 1, 2}, 3, (int[]){0, 1}, 2);
    p->c = client_of(&p->m, 1);
    create_tables(p->c, &p->m);
}

/* Server 2 dies and map 2 goes out; one more round is pushed. The log from then on: returned. */
static FILE *lose_server_2(psck *p)
{
    FILE *log = log_capture();
    edl_ps_server_close(p->k.srv[2]);
    p->k.srv[2] = NULL;
    publish(&p->m, 2, (int[]){0, 1}, 2, -1);
    harness_ps_ok(p->c, push_round(p->c));
    for (uint32_t sh = 0; sh < SHARDS; sh++)
        if (edl_ps_shard_owner(p->m.names[1], 3, sh) == 2)
            p->lost[sh] = p->lost[SHARDS + sh] = true, p->nlost += 2;
    return log;
}

/* The survivors restored every lost shard (none started anew); the client and servers close;
 * the loss lines are checked and returned. */
static loss_lines restored_all(psck *p, FILE *log)
{
    edl_ps_server_stats s0, s1;
    stats_of(p->k.srv[0], &s0), stats_of(p->k.srv[1], &s1);
    assert_int_equal(s0.shards_restored + s1.shards_restored, p->nlost);
    assert_int_equal(s0.shards_lost + s1.shards_lost, 0);
    edl_ps_client_close(p->c);
    harness_ps_close(&p->k);
    loss_lines l = log_losses(log);
    check_loss_lines(&l, 2, (unsigned)p->nlost, 0);
    return l;
}

static void psck_close(psck *p)
{
    edl_etcd_close(p->cl);
    edl_etcd_server_close(p->etcd);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", p->dir);
    assert_int_equal(system(cmd), 0);
}

/* Wait for the checkpoint of step to be committed (the pointer in etcd names it). */
static void wait_checkpoint(const edl_ckpt_config *cfg, int64_t step)
{
    edl_ckpt_config c = *cfg;
    c.rank = 0, c.world_size = 1;
    edl_ckpt *ck;
    char why[512];
    if (edl_ckpt_open(&c, &ck, why, sizeof why) != 0)
        fail_msg("checkpoint: %s", why);
    edl_ckpt_manifest *m = NULL;
    for (int i = 0; i < 200; i++) {
        if (edl_ckpt_load_latest(ck, &m) == 0 && m->step == step)
            break;
        edl_ckpt_manifest_free(m);
        m = NULL;
        nanosleep(&(struct timespec){0, 50000000}, NULL);
    }
    assert_non_null(m);
    assert_int_equal(m->world_size, 3);
    edl_ckpt_manifest_free(m);
    edl_ckpt_close(ck);
}

static void test_a_checkpoint_restores_a_dead_servers_shards_and_loads_on_fewer_servers(
    void **state)
{
    (void)state;
    psck p;
    psck_open(&p, "psck");
    for (int r = 0; r < 5; r++)
        harness_ps_ok(p.c, push_round(p.c));
    harness_ps_ok(p.c, edl_ps_save(p.c, 5));
    wait_checkpoint(&p.cfg, 5);
    for (int r = 0; r < 3; r++) /* after the checkpoint: lost with the server that dies */
        harness_ps_ok(p.c, push_round(p.c));
    FILE *log = lose_server_2(&p);
    check_counts(&p.m, 9, p.lost, 6); /* its shards as of step 5, then one more round */
    loss_lines l = restored_all(&p, log);
    assert_non_null(strstr(l.first, "PS checkpoint")); /* which one */
    assert_non_null(strstr(l.first, "(step 5)"));

    harness_ps_open(&p.k, 2, &p.o); /* the job again, on two servers: all from step 5 */
    maps m2 = {.k = &p.k};
    make_map(&m2, 1, (int[]){0, 1}, 2);
    publish(&m2, 1, (int[]){0, 1}, 2, -1);
    check_counts(&m2, 5, NULL, 0);
    harness_ps_close(&p.k);
    psck_close(&p);
}

/* The newest checkpoint's file of the sparse table saved by the server that dies is corrupt:
 * those shards come from the checkpoint before (each file's digest is checked on its one read),
 * not from the corrupt bytes nor from initial values, while its intact dense file still gives
 * the newest state (a whole-checkpoint fallback lost three rounds of it); the log says where
 * the shards came from. */
static void test_a_corrupt_checkpoint_file_falls_back_to_the_older_checkpoint(void **state)
{
    (void)state;
    psck p;
    char cmd[512], out[4096];
    psck_open(&p, "psbad");
    for (int r = 0; r < 8; r++) {
        harness_ps_ok(p.c, push_round(p.c));
        if (r == 4 || r == 7) { /* steps 5 and 8 */
            harness_ps_ok(p.c, edl_ps_save(p.c, r + 1));
            wait_checkpoint(&p.cfg, r + 1);
        }
    }
    /* flip a byte in the middle of the sparse table's file server 2 (rank 2) saved at step 8 */
    snprintf(cmd, sizeof cmd, "n=0; for f in $(find %s -path '*ckpt-0000000000000008*' -path "
             "'*rank-2/shard-0' -type f); do s=$(stat -c %%s $f); printf '\\377' | "
             "dd of=$f bs=1 seek=$((s / 2)) conv=notrunc status=none; n=$((n+1)); done; echo $n",
             p.dir);
    assert_int_equal(harness_shell(cmd, out, sizeof out), 0);
    assert_int_equal(atoi(out), 1); /* its sparse table's (table 0, its first shard) */
    FILE *log = lose_server_2(&p);
    check_counts_of(&p.m, 9, p.lost, 6, 9); /* sparse as of step 5, dense of 8; one more round */
    loss_lines l = restored_all(&p, log);
    assert_non_null(strstr(l.first, "(step 8), then PS checkpoint")); /* where they came from */
    assert_non_null(strstr(l.first, "(step 5)"));
    psck_close(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_server_joins_while_clients_push_and_every_update_is_applied_once),
        cmocka_unit_test(test_trainers_on_different_maps_meet_at_the_barrier),
        cmocka_unit_test(test_a_later_generation_leaves_the_barrier_arrivals_of_gone_trainers),
        cmocka_unit_test(test_a_joiner_with_tables_before_its_map_waits_for_its_shards),
        cmocka_unit_test(test_a_leaving_server_hands_its_shards_over_before_it_exits),
        cmocka_unit_test(test_a_dead_servers_shards_start_again_and_the_clients_do_not_hang),
        cmocka_unit_test(test_a_bad_hand_over_is_refused_and_the_server_keeps_serving),
        cmocka_unit_test(test_with_replicas_a_killed_server_loses_no_acknowledged_update),
        cmocka_unit_test(test_ctr_shards_move_with_their_statistics_and_embedx),
        cmocka_unit_test(test_a_ctr_table_moves_to_a_joining_server),
        cmocka_unit_test(
            test_a_checkpoint_restores_a_dead_servers_shards_and_loads_on_fewer_servers),
        cmocka_unit_test(test_a_corrupt_checkpoint_file_falls_back_to_the_older_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_etcd_election.c: leader election on a real etcd: one leader, campaign waits for a
 * vacancy, a leader whose lease expires is replaced, and the old leader's writes are fenced. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/etcd.h"
#include "harness.h"

static edl_etcd_server *srv;
static edl_etcd *cl;

static int setup(void **state)
{
    (void)state;
    harness_open_etcd(1, NULL, &srv, &cl);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    harness_close_etcd(&srv, &cl);
    return 0;
}

static int64_t grant(int64_t ttl)
{
    int64_t id;
    assert_int_equal(edl_etcd_lease_grant(cl, ttl, 0, &id, NULL), 0);
    return id;
}

static void test_first_candidate_wins_second_sees_leader(void **state)
{
    (void)state;
    int64_t l1 = grant(30), l2 = grant(30);
    bool won;
    edl_leader a = {0}, b = {0};
    assert_int_equal(edl_election_try(cl, edl_str("el1/leader"), edl_str("A"), l1, &won, &a), 0);
    assert_true(won);
    assert_string_equal(a.kv->value, "A");
    assert_int_equal(a.kv->lease, l1);
    assert_int_equal(edl_election_try(cl, edl_str("el1/leader"), edl_str("B"), l2, &won, &b), 0);
    assert_false(won);
    assert_string_equal(b.kv->value, "A");
    assert_int_equal(b.kv->create_revision, a.kv->create_revision);
    edl_leader seen = {0};
    assert_int_equal(edl_election_leader(cl, edl_str("el1/leader"), &seen), 0);
    assert_string_equal(seen.kv->value, "A");
    edl_leader_clear(&seen);
    /* B cannot resign or proclaim on A's behalf with a stale view of a different term */
    edl_leader_clear(&b);
    assert_int_equal(edl_election_resign(cl, &a), 0);
    assert_int_equal(edl_election_leader(cl, edl_str("el1/leader"), &seen), EDL_ENOTFOUND);
    assert_int_equal(edl_election_resign(cl, &a), EDL_ECONFLICT);
    edl_leader_clear(&a);
    edl_etcd_lease_revoke(cl, l1);
    edl_etcd_lease_revoke(cl, l2);
}

typedef struct campaigner {
    const char *endpoints;
    int64_t lease;
    int rc;
    int64_t won_at;
    edl_leader leader;
} campaigner;

static void *campaign(void *arg)
{
    campaigner *c = arg;
    edl_etcd *e = harness_client(c->endpoints, 0);
    c->rc = edl_election_campaign(e, edl_str("el2/leader"), edl_str("second"), c->lease, 10000, &c->leader);
    c->won_at = harness_now_ms();
    edl_etcd_close(e);
    return NULL;
}

static void test_campaign_takes_over_at_once_after_resign(void **state)
{
    (void)state;
    int64_t l1 = grant(30), l2 = grant(30);
    edl_leader first = {0};
    assert_int_equal(edl_election_campaign(cl, edl_str("el2/leader"), edl_str("first"), l1, 1000, &first), 0);
    campaigner c = {.endpoints = edl_etcd_server_endpoints(srv), .lease = l2};
    double watchers = harness_etcd_metric(srv, "etcd_debugging_mvcc_watcher_total");
    assert_true(watchers >= 0);
    pthread_t th;
    pthread_create(&th, NULL, campaign, &c);
    /* the campaign lost its attempt and watches for a vacancy: etcd holds one more watcher */
    assert_true(HARNESS_WAIT_UNTIL(
        harness_etcd_metric(srv, "etcd_debugging_mvcc_watcher_total") > watchers, 5000));
    assert_int_equal(c.won_at, 0); /* still waiting */
    int64_t t0 = harness_now_ms();
    assert_int_equal(edl_election_resign(cl, &first), 0);
    pthread_join(th, NULL);
    assert_int_equal(c.rc, 0);
    assert_true(c.won_at - t0 < 1000);
    assert_string_equal(c.leader.kv->value, "second");
    assert_true(c.leader.kv->create_revision > first.kv->create_revision);
    edl_leader_clear(&c.leader);
    edl_leader_clear(&first);
    edl_etcd_lease_revoke(cl, l1);
    edl_etcd_lease_revoke(cl, l2);
}

static void test_dead_leader_is_replaced_and_fenced(void **state)
{
    (void)state;
    int64_t l1 = grant(2), l2 = grant(30);
    edl_leader old = {0}, fresh = {0};
    assert_int_equal(edl_election_campaign(cl, edl_str("el3/leader"), edl_str("old"), l1, 1000, &old), 0);
    assert_int_equal(edl_election_proclaim(cl, &old, edl_str("old-gen-1")), 0);
    /* the old leader stops renewing (it hangs, or dies): its lease runs out */
    int64_t t0 = harness_now_ms();
    assert_int_equal(edl_election_campaign(cl, edl_str("el3/leader"), edl_str("new"), l2, 8000, &fresh), 0);
    assert_true(harness_now_ms() - t0 < 4000);
    /* the old leader wakes up and tries to write: fenced */
    assert_int_equal(edl_election_proclaim(cl, &old, edl_str("old-gen-2")), EDL_ECONFLICT);
    assert_non_null(strstr(edl_etcd_errmsg(cl), "no longer the leader"));
    edl_txn *t = edl_txn_new();
    edl_txn_cmp_leader(t, &old);
    edl_txn_put(t, EDL_TXN_SUCCESS, edl_str("el3/cluster"), edl_str("from old"), NULL);
    edl_txn_result r;
    assert_int_equal(edl_etcd_txn(cl, t, &r), 0);
    assert_false(r.succeeded);
    edl_txn_result_clear(&r);
    edl_txn_free(t);
    char v[32];
    assert_null(harness_get(cl, "el3/cluster", v, sizeof v));
    assert_string_equal(harness_get(cl, "el3/leader", v, sizeof v), "new");
    assert_int_equal(edl_election_proclaim(cl, &fresh, edl_str("new-gen-1")), 0);
    edl_leader_clear(&old);
    edl_leader_clear(&fresh);
    edl_etcd_lease_revoke(cl, l2);
}

static void test_campaign_times_out_and_never_hands_out_another_term(void **state)
{
    (void)state;
    int64_t l1 = grant(30), l2 = grant(30);
    edl_leader a = {0}, b = {0};
    assert_int_equal(edl_election_campaign(cl, edl_str("el4/leader"), edl_str("A"), l1, 1000, &a), 0);
    int64_t t0 = harness_now_ms();
    assert_int_equal(edl_election_campaign(cl, edl_str("el4/leader"), edl_str("B"), l2, 500, &b), EDL_ETIMEDOUT);
    int64_t took = harness_now_ms() - t0;
    assert_true(took >= 450 && took < 2000);
    assert_null(b.kv); /* A's term is not B's to resign: a loser holds nothing */
    edl_leader seen = {0};
    assert_int_equal(edl_election_leader(cl, edl_str("el4/leader"), &seen), 0);
    assert_string_equal(seen.kv->value, "A");
    edl_leader_clear(&seen);
    edl_leader_clear(&a);
    edl_leader_clear(&b);
    edl_etcd_lease_revoke(cl, l1);
    edl_etcd_lease_revoke(cl, l2);
}

/* Our campaign txn was applied but its reply lost (a time-out): the key is there under our own
 * lease. The next attempt must see that we lead, not wait for our own key to go away. */
static void test_own_key_from_a_lost_reply_is_our_leadership(void **state)
{
    (void)state;
    int64_t l = grant(30);
    edl_put_opts po = {.lease = l};
    assert_int_equal(edl_etcd_put(cl, edl_str("el6/leader"), edl_str("me"), &po, NULL), 0);
    edl_leader me = {0};
    int64_t t0 = harness_now_ms();
    assert_int_equal(edl_election_campaign(cl, edl_str("el6/leader"), edl_str("me"), l, 2000, &me), 0);
    assert_true(harness_now_ms() - t0 < 1000);
    assert_int_equal(me.kv->lease, l);
    assert_int_equal(edl_election_proclaim(cl, &me, edl_str("me, leading")), 0); /* fenced: ours */
    assert_int_equal(edl_election_resign(cl, &me), 0);
    edl_leader_clear(&me);
    edl_etcd_lease_revoke(cl, l);
}

static void test_campaign_without_live_lease_fails(void **state)
{
    (void)state;
    int64_t l = grant(30);
    edl_etcd_lease_revoke(cl, l);
    edl_leader a = {0};
    assert_int_equal(edl_election_campaign(cl, edl_str("el5/leader"), edl_str("A"), l, 1000, &a), EDL_ELEASE);
    assert_null(a.kv);
    bool won;
    assert_int_equal(edl_election_try(cl, edl_str("el5/leader"), edl_str("A"), 0, &won, NULL), EDL_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_candidate_wins_second_sees_leader),
        cmocka_unit_test(test_campaign_takes_over_at_once_after_resign),
        cmocka_unit_test(test_dead_leader_is_replaced_and_fenced),
        cmocka_unit_test(test_campaign_times_out_and_never_hands_out_another_term),
        cmocka_unit_test(test_own_key_from_a_lost_reply_is_our_leadership),
        cmocka_unit_test(test_campaign_without_live_lease_fails),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

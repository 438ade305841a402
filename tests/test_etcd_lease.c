/* test_etcd_lease.c: leases and the lease keeper against a real etcd, including a keeper cut
 * off from etcd by a frozen proxy (the lease expires while the keeper is blocked). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <poll.h>
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

static bool key_exists(edl_etcd *c, const char *key)
{
    char v[64];
    return harness_get(c, key, v, sizeof v) != NULL;
}

static void test_grant_ttl_keepalive_revoke(void **state)
{
    (void)state;
    int64_t id, ttl, granted;
    assert_int_equal(edl_etcd_lease_grant(cl, 20, 0, &id, &ttl), 0);
    assert_true(id > 0);
    assert_int_equal(ttl, 20);
    assert_int_equal(edl_etcd_lease_ttl(cl, id, &ttl, &granted), 0);
    assert_int_equal(granted, 20);
    assert_true(ttl > 15 && ttl <= 20);
    assert_int_equal(edl_etcd_lease_keepalive(cl, id, &ttl), 0);
    assert_int_equal(ttl, 20);
    edl_put_opts po = {.lease = id};
    assert_int_equal(edl_etcd_put(cl, edl_str("lease/a"), edl_str("1"), &po, NULL), 0);
    assert_int_equal(edl_etcd_put(cl, edl_str("lease/b"), edl_str("2"), &po, NULL), 0);
    edl_kv *kv;
    assert_int_equal(edl_etcd_get(cl, edl_str("lease/a"), &kv, NULL), 0);
    assert_int_equal(kv->lease, id); /* lease IDs exceed 2^53: must survive exactly */
    edl_kv_free(kv);
    assert_int_equal(edl_etcd_lease_revoke(cl, id), 0);
    assert_false(key_exists(cl, "lease/a"));
    assert_false(key_exists(cl, "lease/b"));
    assert_int_equal(edl_etcd_lease_keepalive(cl, id, &ttl), EDL_ELEASE);
    assert_int_equal(edl_etcd_lease_ttl(cl, id, &ttl, NULL), EDL_ENOTFOUND);
    assert_int_equal(edl_etcd_lease_revoke(cl, id), EDL_ENOTFOUND);
}

/* Whoever saw a key's holder die revokes the lease that holds it: every key under that lease
 * goes with it. A key without a lease, or no key, is EDL_ENOTFOUND and revokes nothing. */
static void test_revoke_holder_revokes_the_lease_of_a_key(void **state)
{
    (void)state;
    int64_t id, ttl, revoked = -1;
    assert_int_equal(edl_etcd_lease_grant(cl, 30, 0, &id, NULL), 0);
    edl_put_opts po = {.lease = id};
    assert_int_equal(edl_etcd_put(cl, edl_str("holder/pod"), edl_str("1"), &po, NULL), 0);
    assert_int_equal(edl_etcd_put(cl, edl_str("holder/status"), edl_str("2"), &po, NULL), 0);
    assert_int_equal(edl_etcd_put(cl, edl_str("holder/plain"), edl_str("3"), NULL, NULL), 0);
    assert_int_equal(edl_etcd_lease_revoke_holder(cl, edl_str("holder/pod"), &revoked), 0);
    assert_true(revoked == id);
    assert_false(key_exists(cl, "holder/pod"));
    assert_false(key_exists(cl, "holder/status"));
    assert_int_equal(edl_etcd_lease_ttl(cl, id, &ttl, NULL), EDL_ENOTFOUND);
    assert_int_equal(edl_etcd_lease_revoke_holder(cl, edl_str("holder/pod"), &revoked),
                     EDL_ENOTFOUND);
    assert_true(revoked == 0);
    assert_int_equal(edl_etcd_lease_revoke_holder(cl, edl_str("holder/plain"), NULL),
                     EDL_ENOTFOUND);
    assert_true(key_exists(cl, "holder/plain"));
}

static void test_grant_rejects_bad_ttl_and_put_rejects_unknown_lease(void **state)
{
    (void)state;
    int64_t id;
    assert_int_equal(edl_etcd_lease_grant(cl, 0, 0, &id, NULL), EDL_EINVAL);
    assert_int_equal(edl_etcd_lease_grant(cl, -5, 0, &id, NULL), EDL_EINVAL);
    edl_put_opts po = {.lease = 0x1234567};
    assert_int_equal(edl_etcd_put(cl, edl_str("lease/none"), edl_str("x"), &po, NULL), EDL_ELEASE);
    assert_false(key_exists(cl, "lease/none"));
}

typedef struct lost_box {
    pthread_mutex_t mu;
    int calls;
    int reason;
    int64_t lease;
} lost_box;

static void on_lost(void *arg, int64_t lease, int reason)
{
    lost_box *b = arg;
    pthread_mutex_lock(&b->mu);
    b->calls++;
    b->reason = reason;
    b->lease = lease;
    pthread_mutex_unlock(&b->mu);
}

static bool fd_readable(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

static void test_keeper_keeps_lease_alive_past_ttl(void **state)
{
    (void)state;
    int64_t id;
    assert_int_equal(edl_etcd_lease_grant(cl, 2, 0, &id, NULL), 0);
    edl_put_opts po = {.lease = id};
    assert_int_equal(edl_etcd_put(cl, edl_str("keep/alive"), edl_str("1"), &po, NULL), 0);
    lost_box box = {.mu = PTHREAD_MUTEX_INITIALIZER};
    edl_lease_keeper *k;
    assert_int_equal(edl_lease_keeper_open(cl, id, 2, on_lost, &box, &k), 0);
    /* past the TTL in etcd's own terms: a lease granted after ours, that nobody renews, expired */
    assert_true(harness_etcd_outlive_lease(cl, 2, 8000));
    assert_true(key_exists(cl, "keep/alive"));
    assert_int_equal(edl_lease_keeper_status(k), 0);
    assert_false(fd_readable(edl_lease_keeper_fd(k), 0));
    assert_int_equal(box.calls, 0);
    edl_lease_keeper_close(k, true); /* graceful leave: revoked at once, no TTL wait */
    assert_false(key_exists(cl, "keep/alive"));
}

static void test_keeper_reports_revoked_lease_at_once(void **state)
{
    (void)state;
    int64_t id;
    assert_int_equal(edl_etcd_lease_grant(cl, 3, 0, &id, NULL), 0);
    lost_box box = {.mu = PTHREAD_MUTEX_INITIALIZER};
    edl_lease_keeper *k;
    assert_int_equal(edl_lease_keeper_open(cl, id, 3, on_lost, &box, &k), 0);
    assert_int_equal(edl_etcd_lease_revoke(cl, id), 0);
    /* noticed at the next renewal (TTL/3 = 1 s) */
    assert_true(fd_readable(edl_lease_keeper_fd(k), 2500));
    assert_int_equal(edl_lease_keeper_status(k), EDL_ELEASE);
    pthread_mutex_lock(&box.mu);
    assert_int_equal(box.calls, 1);
    assert_int_equal(box.reason, EDL_ELEASE);
    assert_int_equal(box.lease, id);
    pthread_mutex_unlock(&box.mu);
    edl_lease_keeper_close(k, false);
}

static void test_keeper_blocked_by_partition_reports_loss_within_ttl(void **state)
{
    (void)state;
    harness_proxy *px;
    edl_etcd *via = harness_client_via_proxy(srv, &px);
    int64_t id;
    assert_int_equal(edl_etcd_lease_grant(via, 2, 0, &id, NULL), 0);
    edl_put_opts po = {.lease = id};
    assert_int_equal(edl_etcd_put(via, edl_str("keep/partitioned"), edl_str("1"), &po, NULL), 0);
    lost_box box = {.mu = PTHREAD_MUTEX_INITIALIZER};
    edl_lease_keeper *k;
    assert_int_equal(edl_lease_keeper_open(via, id, 2, on_lost, &box, &k), 0);
    /* the keeper in its rhythm before the partition: etcd has seen two of its renewals */
    double renewed = harness_etcd_metric(srv, "etcd_debugging_lease_renewed_total");
    assert_true(renewed >= 0);
    assert_true(HARNESS_WAIT_UNTIL(
        harness_etcd_metric(srv, "etcd_debugging_lease_renewed_total") >= renewed + 2, 5000));
    int64_t t0 = harness_now_ms();
    harness_proxy_freeze(px, true); /* renewals now hang: no reply, no error */
    assert_true(fd_readable(edl_lease_keeper_fd(k), 4000));
    int64_t took = harness_now_ms() - t0;
    assert_true(took <= 2500); /* at most one TTL after the last renewal */
    assert_int_equal(edl_lease_keeper_status(k), EDL_ETIMEDOUT);
    /* etcd agrees: the lease is gone soon after, and so is the key */
    assert_true(HARNESS_WAIT_UNTIL(!key_exists(cl, "keep/partitioned"), 5000));
    harness_proxy_freeze(px, false);
    edl_lease_keeper_close(k, false);
    harness_close_proxied(via, px);
}

static void test_keeper_rides_out_short_outage(void **state)
{
    (void)state;
    harness_proxy *px;
    edl_etcd *via = harness_client_via_proxy(srv, &px);
    int64_t id;
    assert_int_equal(edl_etcd_lease_grant(via, 6, 0, &id, NULL), 0);
    edl_lease_keeper *k;
    assert_int_equal(edl_lease_keeper_open(via, id, 6, NULL, NULL, &k), 0);
    harness_proxy_freeze(px, true);
    /* misses at least one renewal (one every 2 s), well inside the TTL: etcd counts 3 s or less
     * left of the 6 */
    int64_t left = 6;
    assert_true(HARNESS_WAIT_UNTIL(edl_etcd_lease_ttl(cl, id, &left, NULL) == 0 && left <= 3, 6000));
    harness_proxy_drop(px);
    harness_proxy_freeze(px, false);
    /* a renewal through a new connection brings the TTL back up (about 3 s were left) */
    int64_t ttl = 0;
    assert_true(HARNESS_WAIT_UNTIL(edl_etcd_lease_ttl(cl, id, &ttl, NULL) == 0 && ttl >= 5, 6000));
    assert_int_equal(edl_lease_keeper_status(k), 0);
    edl_lease_keeper_close(k, true);
    harness_close_proxied(via, px);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grant_ttl_keepalive_revoke),
        cmocka_unit_test(test_revoke_holder_revokes_the_lease_of_a_key),
        cmocka_unit_test(test_grant_rejects_bad_ttl_and_put_rejects_unknown_lease),
        cmocka_unit_test(test_keeper_keeps_lease_alive_past_ttl),
        cmocka_unit_test(test_keeper_reports_revoked_lease_at_once),
        cmocka_unit_test(test_keeper_blocked_by_partition_reports_loss_within_ttl),
        cmocka_unit_test(test_keeper_rides_out_short_outage),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

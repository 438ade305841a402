/* test_etcd_cluster.c: fail-over across the members of a real three-member etcd cluster on
 * loopback: calls, lease keepers and watches go on when the member in use dies. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/etcd.h"
#include "harness.h"

static edl_etcd_server *srv;

static int setup(void **state)
{
    (void)state;
    srv = harness_etcd_open(3, NULL);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    edl_etcd_server_close(srv);
    return 0;
}

static int member_of(const char *endpoint)
{
    for (int i = 0; i < edl_etcd_server_members(srv); i++)
        if (strcmp(edl_etcd_server_endpoint(srv, i), endpoint) == 0)
            return i;
    fail_msg("endpoint %s is not a member", endpoint);
    return -1;
}

static void test_calls_fail_over_when_member_in_use_dies(void **state)
{
    (void)state;
    edl_etcd *c = harness_client(edl_etcd_server_endpoints(srv), 8000);
    harness_put(c, "fo/a", "1");
    int used = member_of(edl_etcd_endpoint(c));
    assert_int_equal(edl_etcd_server_stop_member(srv, used, true), 0);
    harness_put(c, "fo/b", "2"); /* reconnects to another member */
    assert_int_not_equal(member_of(edl_etcd_endpoint(c)), used);
    char v[8];
    assert_string_equal(harness_get(c, "fo/a", v, sizeof v), "1");
    assert_string_equal(harness_get(c, "fo/b", v, sizeof v), "2");
    assert_int_equal(edl_etcd_server_restart_member(srv, used), 0);
    edl_etcd_close(c);
}

static void test_txn_and_lease_keeper_survive_member_loss(void **state)
{
    (void)state;
    edl_etcd *c = harness_client(edl_etcd_server_endpoints(srv), 8000);
    int64_t id;
    assert_int_equal(edl_etcd_lease_grant(c, 3, 0, &id, NULL), 0);
    edl_lease_keeper *k;
    assert_int_equal(edl_lease_keeper_open(c, id, 3, NULL, NULL, &k), 0);
    edl_put_opts po = {.lease = id};
    assert_int_equal(edl_etcd_put(c, edl_str("fo/member"), edl_str("me"), &po, NULL), 0);
    int used = member_of(edl_etcd_endpoint(c));
    assert_int_equal(edl_etcd_server_stop_member(srv, used, true), 0);
    /* longer than the TTL in etcd's own terms (a 3 s lease granted now, unrenewed, expires):
     * only renewals through the other members keep the key */
    assert_true(harness_etcd_outlive_lease(c, 3, 10000));
    assert_int_equal(edl_lease_keeper_status(k), 0);
    char v[8];
    assert_string_equal(harness_get(c, "fo/member", v, sizeof v), "me");
    edl_txn *t = edl_txn_new();
    edl_txn_cmp_value(t, edl_str("fo/member"), EDL_CMP_EQUAL, edl_str("me"));
    edl_txn_put(t, EDL_TXN_SUCCESS, edl_str("fo/member"), edl_str("me2"), &po);
    edl_txn_result r;
    assert_int_equal(edl_etcd_txn(c, t, &r), 0);
    assert_true(r.succeeded);
    edl_txn_result_clear(&r);
    edl_txn_free(t);
    edl_lease_keeper_close(k, true);
    assert_null(harness_get(c, "fo/member", v, sizeof v));
    assert_int_equal(edl_etcd_server_restart_member(srv, used), 0);
    edl_etcd_close(c);
}

static void test_watch_moves_to_another_member_without_loss(void **state)
{
    (void)state;
    /* the watcher starts on member 0; writes go through member 2 */
    char eps[256];
    snprintf(eps, sizeof eps, "%s,%s,%s", edl_etcd_server_endpoint(srv, 0), edl_etcd_server_endpoint(srv, 1),
             edl_etcd_server_endpoint(srv, 2));
    edl_etcd *wc = harness_client(eps, 8000);
    edl_etcd *writer = harness_client(edl_etcd_server_endpoint(srv, 2), 8000);
    edl_watch *w;
    edl_watch_opts o = {.prefix = true};
    assert_int_equal(edl_watch_open(wc, edl_str("fw/"), &o, &w), 0);
    enum { N = 40 };
    for (int i = 0; i < N; i++) {
        char k[16], val[8];
        snprintf(k, sizeof k, "fw/%02d", i);
        snprintf(val, sizeof val, "%d", i);
        harness_put(writer, k, val);
        if (i == N / 2)
            assert_int_equal(edl_etcd_server_stop_member(srv, 0, true), 0);
    }
    for (int i = 0; i < N; i++) {
        edl_watch_event *ev = harness_next_event(w, 8000);
        char val[8];
        snprintf(val, sizeof val, "%d", i);
        assert_int_equal(ev->type, EDL_WATCH_PUT);
        assert_string_equal(ev->kv.value, val);
        edl_watch_event_free(ev);
    }
    edl_watch_close(w);
    edl_etcd_close(wc);
    edl_etcd_close(writer);
    assert_int_equal(edl_etcd_server_restart_member(srv, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calls_fail_over_when_member_in_use_dies),
        cmocka_unit_test(test_txn_and_lease_keeper_survive_member_loss),
        cmocka_unit_test(test_watch_moves_to_another_member_without_loss),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

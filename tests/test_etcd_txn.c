/* test_etcd_txn.c: transactions against a real etcd: every compare target, both branches,
 * the ops' results, builder errors, and a create-if-absent race that exactly one client wins. */
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

/* Run a txn with one compare built by cmp(), a put in success and a range in failure. */
static bool txn_holds(void (*cmp)(edl_txn *), const char *key)
{
    edl_txn *t = edl_txn_new();
    cmp(t);
    edl_txn_put(t, EDL_TXN_SUCCESS, edl_str("txn/marker"), edl_str(key), NULL);
    edl_txn_range(t, EDL_TXN_FAILURE, edl_str(key), NULL);
    edl_txn_result r;
    int rc = edl_etcd_txn(cl, t, &r);
    edl_txn_free(t);
    if (rc != 0)
        fail_msg("txn: %s: %s", edl_strerror(rc), edl_etcd_errmsg(cl));
    assert_int_equal(r.n_results, 1);
    assert_int_equal(r.results[0].type, r.succeeded ? EDL_OP_PUT : EDL_OP_RANGE);
    assert_true(r.revision > 0);
    bool ok = r.succeeded;
    edl_txn_result_clear(&r);
    return ok;
}

static edl_kv *cur;
static void cmp_value_eq(edl_txn *t) { edl_txn_cmp_value(t, edl_str("txn/k"), EDL_CMP_EQUAL, edl_str("v1")); }
static void cmp_value_ne(edl_txn *t) { edl_txn_cmp_value(t, edl_str("txn/k"), EDL_CMP_NOT_EQUAL, edl_str("v1")); }
static void cmp_version_eq(edl_txn *t) { edl_txn_cmp_version(t, edl_str("txn/k"), EDL_CMP_EQUAL, cur->version); }
static void cmp_version_gt(edl_txn *t) { edl_txn_cmp_version(t, edl_str("txn/k"), EDL_CMP_GREATER, cur->version); }
static void cmp_create_eq(edl_txn *t) { edl_txn_cmp_create(t, edl_str("txn/k"), EDL_CMP_EQUAL, cur->create_revision); }
static void cmp_mod_lt(edl_txn *t) { edl_txn_cmp_mod(t, edl_str("txn/k"), EDL_CMP_LESS, cur->mod_revision + 1); }
static void cmp_mod_eq_old(edl_txn *t) { edl_txn_cmp_mod(t, edl_str("txn/k"), EDL_CMP_EQUAL, cur->mod_revision - 1); }
static void cmp_lease_eq(edl_txn *t) { edl_txn_cmp_lease(t, edl_str("txn/k"), EDL_CMP_EQUAL, cur->lease); }
static void cmp_lease_zero(edl_txn *t) { edl_txn_cmp_lease(t, edl_str("txn/k"), EDL_CMP_EQUAL, 0); }
static void cmp_absent(edl_txn *t) { edl_txn_cmp_create(t, edl_str("txn/none"), EDL_CMP_EQUAL, 0); }

static void test_every_compare_target_and_result(void **state)
{
    (void)state;
    int64_t lease;
    assert_int_equal(edl_etcd_lease_grant(cl, 30, 0, &lease, NULL), 0);
    edl_put_opts po = {.lease = lease};
    assert_int_equal(edl_etcd_put(cl, edl_str("txn/k"), edl_str("v1"), &po, NULL), 0);
    assert_int_equal(edl_etcd_get(cl, edl_str("txn/k"), &cur, NULL), 0);
    assert_true(txn_holds(cmp_value_eq, "txn/k"));
    assert_false(txn_holds(cmp_value_ne, "txn/k"));
    assert_true(txn_holds(cmp_version_eq, "txn/k"));
    assert_false(txn_holds(cmp_version_gt, "txn/k"));
    assert_true(txn_holds(cmp_create_eq, "txn/k"));
    assert_true(txn_holds(cmp_mod_lt, "txn/k"));
    assert_false(txn_holds(cmp_mod_eq_old, "txn/k"));
    assert_true(txn_holds(cmp_lease_eq, "txn/k"));
    assert_false(txn_holds(cmp_lease_zero, "txn/k"));
    assert_true(txn_holds(cmp_absent, "txn/none"));
    edl_kv_free(cur);
    assert_int_equal(edl_etcd_lease_revoke(cl, lease), 0);
}

static void test_failure_branch_returns_its_reads(void **state)
{
    (void)state;
    harness_put(cl, "txn/f/a", "A");
    harness_put(cl, "txn/f/b", "B");
    edl_txn *t = edl_txn_new();
    edl_txn_cmp_value(t, edl_str("txn/f/a"), EDL_CMP_EQUAL, edl_str("not A"));
    edl_txn_put(t, EDL_TXN_SUCCESS, edl_str("txn/f/a"), edl_str("changed"), NULL);
    edl_range_opts ro = {.prefix = true};
    edl_txn_range(t, EDL_TXN_FAILURE, edl_str("txn/f/"), &ro);
    edl_delete_opts d = {.prev_kv = true};
    edl_txn_delete(t, EDL_TXN_FAILURE, edl_str("txn/f/b"), &d);
    edl_put_opts po = {.prev_kv = true};
    edl_txn_put(t, EDL_TXN_FAILURE, edl_str("txn/f/c"), edl_str("C"), &po);
    edl_txn_result r;
    assert_int_equal(edl_etcd_txn(cl, t, &r), 0);
    edl_txn_free(t);
    assert_false(r.succeeded);
    assert_int_equal(r.n_results, 3);
    assert_int_equal(r.results[0].type, EDL_OP_RANGE);
    assert_int_equal(r.results[0].range.n_kvs, 2);
    assert_string_equal(r.results[0].range.kvs[1].value, "B");
    assert_int_equal(r.results[1].type, EDL_OP_DELETE);
    assert_int_equal(r.results[1].del.deleted, 1);
    assert_string_equal(r.results[1].del.prev_kvs[0].value, "B");
    assert_int_equal(r.results[2].type, EDL_OP_PUT);
    assert_null(r.results[2].put.prev_kv);
    edl_txn_result_clear(&r);
    char v[16];
    assert_string_equal(harness_get(cl, "txn/f/a", v, sizeof v), "A"); /* success branch not run */
    assert_null(harness_get(cl, "txn/f/b", v, sizeof v));
}

static void test_same_key_twice_is_a_clear_server_error(void **state)
{
    (void)state;
    edl_txn *t = edl_txn_new();
    edl_txn_put(t, EDL_TXN_SUCCESS, edl_str("txn/dup"), edl_str("1"), NULL);
    edl_txn_put(t, EDL_TXN_SUCCESS, edl_str("txn/dup"), edl_str("2"), NULL);
    edl_txn_result r;
    int rc = edl_etcd_txn(cl, t, &r);
    edl_txn_free(t);
    assert_int_equal(rc, EDL_ESERVER);
    assert_non_null(strstr(edl_etcd_errmsg(cl), "HTTP 400"));
    char v[8];
    assert_null(harness_get(cl, "txn/dup", v, sizeof v));
}

static void test_builder_error_is_reported_not_sent(void **state)
{
    (void)state;
    edl_txn *t = edl_txn_new();
    edl_txn_cmp_value(t, edl_str("txn/x"), (edl_cmp_op)42, edl_str("v"));
    edl_txn_put(t, EDL_TXN_SUCCESS, edl_str("txn/x"), edl_str("v"), NULL);
    edl_txn_result r;
    assert_int_equal(edl_etcd_txn(cl, t, &r), EDL_EINVAL);
    edl_txn_free(t);
    char v[8];
    assert_null(harness_get(cl, "txn/x", v, sizeof v));
}

/* ---- create-if-absent race -------------------------------------------------------------- */

typedef struct racer {
    const char *endpoints;
    char key[64];
    int id;
    bool won;
    int rc;
    pthread_barrier_t *go;
} racer;

static void *race(void *arg)
{
    racer *r = arg;
    edl_etcd *c = harness_client(r->endpoints, 0);
    char me[16];
    snprintf(me, sizeof me, "%d", r->id);
    edl_txn *t = edl_txn_new();
    edl_txn_cmp_create(t, edl_str(r->key), EDL_CMP_EQUAL, 0);
    edl_txn_put(t, EDL_TXN_SUCCESS, edl_str(r->key), edl_str(me), NULL);
    edl_txn_result res;
    pthread_barrier_wait(r->go);
    r->rc = edl_etcd_txn(c, t, &res);
    r->won = r->rc == 0 && res.succeeded;
    if (r->rc == 0)
        edl_txn_result_clear(&res);
    edl_txn_free(t);
    edl_etcd_close(c);
    return NULL;
}

static void test_create_if_absent_race_has_one_winner(void **state)
{
    (void)state;
    enum { ROUNDS = 20, RACERS = 4 };
    for (int round = 0; round < ROUNDS; round++) {
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, RACERS);
        racer rs[RACERS];
        pthread_t th[RACERS];
        for (int i = 0; i < RACERS; i++) {
            rs[i] = (racer){.endpoints = edl_etcd_server_endpoints(srv), .id = i, .go = &go};
            snprintf(rs[i].key, sizeof rs[i].key, "race/%d", round);
            pthread_create(&th[i], NULL, race, &rs[i]);
        }
        int winners = 0, winner = -1;
        for (int i = 0; i < RACERS; i++) {
            pthread_join(th[i], NULL);
            assert_int_equal(rs[i].rc, 0);
            if (rs[i].won) {
                winners++;
                winner = i;
            }
        }
        pthread_barrier_destroy(&go);
        assert_int_equal(winners, 1);
        char v[16], want[16];
        snprintf(want, sizeof want, "%d", winner);
        assert_string_equal(harness_get(cl, rs[0].key, v, sizeof v), want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_compare_target_and_result),
        cmocka_unit_test(test_failure_branch_returns_its_reads),
        cmocka_unit_test(test_same_key_twice_is_a_clear_server_error),
        cmocka_unit_test(test_builder_error_is_reported_not_sent),
        cmocka_unit_test(test_create_if_absent_race_has_one_winner),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* test_etcd_watch.c: streaming watches against a real etcd: order, revisions, prev_kv,
 * history, progress notifications, back-pressure, and the cases where events are most easily
 * lost: the connection dropped, etcd restarted, the resume revision compacted. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <poll.h>
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
    static const char *const args[] = {"--experimental-watch-progress-notify-interval=1s", NULL};
    harness_open_etcd(1, args, &srv, &cl);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    harness_close_etcd(&srv, &cl);
    return 0;
}

static void expect_put(edl_watch *w, const char *key, const char *value, int64_t rev)
{
    edl_watch_event *ev = harness_next_event(w, 5000);
    assert_int_equal(ev->type, EDL_WATCH_PUT);
    assert_string_equal(ev->kv.key, key);
    assert_string_equal(ev->kv.value, value);
    if (rev)
        assert_int_equal(ev->revision, rev);
    assert_int_equal(ev->kv.mod_revision, ev->revision);
    edl_watch_event_free(ev);
}

static int64_t put_rev(edl_etcd *c, const char *key, const char *value)
{
    edl_put_result r;
    int rc = edl_etcd_put(c, edl_str(key), edl_str(value), NULL, &r);
    if (rc)
        fail_msg("put %s: %s", key, edl_etcd_errmsg(c));
    return r.revision;
}

static void test_events_arrive_in_order_with_prev_kv(void **state)
{
    (void)state;
    edl_watch *w;
    edl_watch_opts o = {.prefix = true, .prev_kv = true};
    assert_int_equal(edl_watch_open(cl, edl_str("w1/"), &o, &w), 0);
    int64_t r1 = put_rev(cl, "w1/a", "1");
    int64_t r2 = put_rev(cl, "w1/a", "2");
    put_rev(cl, "w1-outside", "x");
    edl_delete_result d;
    assert_int_equal(edl_etcd_delete(cl, edl_str("w1/a"), NULL, &d), 0);
    expect_put(w, "w1/a", "1", r1);
    edl_watch_event *ev = harness_next_event(w, 5000);
    assert_int_equal(ev->type, EDL_WATCH_PUT);
    assert_int_equal(ev->revision, r2);
    assert_non_null(ev->prev_kv);
    assert_string_equal(ev->prev_kv->value, "1");
    edl_watch_event_free(ev);
    ev = harness_next_event(w, 5000);
    assert_int_equal(ev->type, EDL_WATCH_DELETE);
    assert_string_equal(ev->kv.key, "w1/a");
    assert_int_equal(ev->revision, d.revision);
    assert_non_null(ev->prev_kv);
    assert_string_equal(ev->prev_kv->value, "2");
    edl_watch_event_free(ev);
    edl_watch_close(w);
}

static void test_txn_events_share_one_revision(void **state)
{
    (void)state;
    edl_watch *w;
    edl_watch_opts o = {.prefix = true};
    assert_int_equal(edl_watch_open(cl, edl_str("w2/"), &o, &w), 0);
    edl_txn *t = edl_txn_new();
    edl_txn_put(t, EDL_TXN_SUCCESS, edl_str("w2/a"), edl_str("A"), NULL);
    edl_txn_put(t, EDL_TXN_SUCCESS, edl_str("w2/b"), edl_str("B"), NULL);
    edl_txn_result r;
    assert_int_equal(edl_etcd_txn(cl, t, &r), 0);
    edl_txn_free(t);
    expect_put(w, "w2/a", "A", r.revision);
    expect_put(w, "w2/b", "B", r.revision);
    edl_txn_result_clear(&r);
    edl_watch_close(w);
}

static void test_start_revision_replays_history(void **state)
{
    (void)state;
    int64_t r1 = put_rev(cl, "w3/k", "old1");
    put_rev(cl, "w3/k", "old2");
    edl_watch *w;
    edl_watch_opts o = {.start_revision = r1};
    assert_int_equal(edl_watch_open(cl, edl_str("w3/k"), &o, &w), 0);
    expect_put(w, "w3/k", "old1", r1);
    expect_put(w, "w3/k", "old2", r1 + 1);
    put_rev(cl, "w3/k", "new");
    expect_put(w, "w3/k", "new", 0);
    edl_watch_close(w);
}

static void test_progress_notifications_arrive_when_idle(void **state)
{
    (void)state;
    edl_watch *w;
    edl_watch_opts o = {.progress_notify = true};
    assert_int_equal(edl_watch_open(cl, edl_str("w4/quiet"), &o, &w), 0);
    int64_t now = put_rev(cl, "w4/other", "x");
    edl_watch_event *ev;
    int progress = 0;
    int64_t t0 = harness_now_ms();
    while (progress < 2 && harness_now_ms() - t0 < 6000) {
        if (edl_watch_next(w, &ev, 1000) != 0)
            continue;
        assert_int_equal(ev->type, EDL_WATCH_PROGRESS);
        assert_true(ev->revision >= now - 1);
        progress++;
        edl_watch_event_free(ev);
    }
    assert_int_equal(progress, 2);
    edl_watch_close(w);
}

static void test_fd_is_readable_exactly_while_events_wait(void **state)
{
    (void)state;
    edl_watch *w;
    assert_int_equal(edl_watch_open(cl, edl_str("w5/k"), NULL, &w), 0);
    struct pollfd p = {.fd = edl_watch_fd(w), .events = POLLIN};
    assert_int_equal(poll(&p, 1, 0), 0);
    put_rev(cl, "w5/k", "1");
    assert_int_equal(poll(&p, 1, 5000), 1);
    edl_watch_event *ev;
    assert_int_equal(edl_watch_next(w, &ev, 0), 0);
    edl_watch_event_free(ev);
    assert_int_equal(poll(&p, 1, 0), 0);
    assert_int_equal(edl_watch_next(w, &ev, 50), EDL_ETIMEDOUT);
    edl_watch_close(w);
}

static void test_slow_reader_gets_every_event_through_backpressure(void **state)
{
    (void)state;
    edl_watch *w;
    edl_watch_opts o = {.prefix = true, .max_queued = 4};
    assert_int_equal(edl_watch_open(cl, edl_str("w6/"), &o, &w), 0);
    enum { N = 200 };
    for (int i = 0; i < N; i++) {
        char k[32], v[16];
        snprintf(k, sizeof k, "w6/%03d", i);
        snprintf(v, sizeof v, "%d", i);
        put_rev(cl, k, v);
    }
    int64_t last = 0;
    for (int i = 0; i < N; i++) {
        edl_watch_event *ev = harness_next_event(w, 5000);
        char v[16];
        snprintf(v, sizeof v, "%d", i);
        assert_string_equal(ev->kv.value, v);
        assert_true(ev->revision > last);
        last = ev->revision;
        edl_watch_event_free(ev);
    }
    edl_watch_close(w);
}

/* Writes land while the watch's connection is cut; after it comes back every one of them is
 * delivered once, in order. */
static void test_dropped_connection_resumes_without_loss(void **state)
{
    (void)state;
    harness_proxy *px;
    edl_etcd *via = harness_client_via_proxy(srv, &px);
    edl_watch *w;
    edl_watch_opts o = {.prefix = true};
    assert_int_equal(edl_watch_open(via, edl_str("w7/"), &o, &w), 0);
    put_rev(cl, "w7/000", "0");
    expect_put(w, "w7/000", "0", 0);
    harness_proxy_freeze(px, true);
    enum { N = 100 };
    for (int i = 1; i <= N; i++) {
        char k[32], v[16];
        snprintf(k, sizeof k, "w7/%03d", i);
        snprintf(v, sizeof v, "%d", i);
        put_rev(cl, k, v);
    }
    harness_proxy_drop(px);
    harness_proxy_freeze(px, false);
    for (int i = 1; i <= N; i++) {
        edl_watch_event *ev = harness_next_event(w, 5000);
        char v[16];
        snprintf(v, sizeof v, "%d", i);
        assert_string_equal(ev->kv.value, v);
        edl_watch_event_free(ev);
    }
    edl_watch_event *ev;
    while (edl_watch_next(w, &ev, 300) == 0) { /* nothing twice */
        assert_int_equal(ev->type, EDL_WATCH_PROGRESS);
        edl_watch_event_free(ev);
    }
    edl_watch_close(w);
    harness_close_proxied(via, px);
}

static void test_etcd_restart_during_watch_loses_nothing(void **state)
{
    (void)state;
    edl_watch *w;
    edl_watch_opts o = {.prefix = true};
    edl_etcd *wc = harness_client(edl_etcd_server_endpoints(srv), 0);
    assert_int_equal(edl_watch_open(wc, edl_str("w8/"), &o, &w), 0);
    put_rev(cl, "w8/a", "before");
    assert_int_equal(edl_etcd_server_stop_member(srv, 0, false), 0);
    harness_sleep_ms(500); /* an outage the watch notices: the length is the test */
    assert_int_equal(edl_etcd_server_restart_member(srv, 0), 0);
    put_rev(cl, "w8/b", "after");
    put_rev(cl, "w8/c", "after2");
    expect_put(w, "w8/a", "before", 0);
    expect_put(w, "w8/b", "after", 0);
    expect_put(w, "w8/c", "after2", 0);
    edl_watch_event *ev;
    while (edl_watch_next(w, &ev, 300) == 0) {
        assert_int_equal(ev->type, EDL_WATCH_PROGRESS);
        edl_watch_event_free(ev);
    }
    edl_watch_close(w);
    edl_etcd_close(wc);
}

static void compact(int64_t rev)
{
    assert_int_equal(harness_etcdctl(edl_etcd_server_endpoints(srv), NULL, "compact %lld", (long long)rev), 0);
}

static void test_compacted_start_revision_is_reported(void **state)
{
    (void)state;
    int64_t r1 = put_rev(cl, "w9/k", "1");
    int64_t r2 = put_rev(cl, "w9/k", "2");
    compact(r2);
    edl_watch *w;
    edl_watch_opts o = {.start_revision = r1};
    assert_int_equal(edl_watch_open(cl, edl_str("w9/k"), &o, &w), 0);
    edl_watch_event *ev = harness_next_event(w, 5000);
    assert_int_equal(ev->type, EDL_WATCH_COMPACTED);
    assert_int_equal(ev->compact_revision, r2);
    edl_watch_event_free(ev);
    /* the caller re-reads, then the watch goes on */
    char v[8];
    assert_string_equal(harness_get(cl, "w9/k", v, sizeof v), "2");
    int64_t r3 = put_rev(cl, "w9/k", "3");
    for (;;) { /* from the compact revision on: r2 may be replayed, then r3 */
        ev = harness_next_event(w, 5000);
        assert_int_equal(ev->type, EDL_WATCH_PUT);
        int64_t rev = ev->revision;
        edl_watch_event_free(ev);
        if (rev == r3)
            break;
        assert_int_equal(rev, r2);
    }
    edl_watch_close(w);
}

static void test_compaction_while_disconnected_is_reported(void **state)
{
    (void)state;
    harness_proxy *px;
    edl_etcd *via = harness_client_via_proxy(srv, &px);
    edl_watch *w;
    assert_int_equal(edl_watch_open(via, edl_str("w10/k"), NULL, &w), 0);
    harness_proxy_freeze(px, true);
    put_rev(cl, "w10/k", "missed1");
    int64_t r = put_rev(cl, "w10/k", "missed2");
    compact(r);
    harness_proxy_drop(px);
    harness_proxy_freeze(px, false);
    edl_watch_event *ev = harness_next_event(w, 5000);
    assert_int_equal(ev->type, EDL_WATCH_COMPACTED); /* never a silent skip */
    assert_int_equal(ev->compact_revision, r);
    edl_watch_event_free(ev);
    edl_watch_close(w);
    harness_close_proxied(via, px);
}

static void test_watch_on_unreachable_etcd_fails_start(void **state)
{
    (void)state;
    edl_etcd *c = harness_client("http://127.0.0.1:1", 800);
    edl_watch *w = NULL;
    int64_t t0 = harness_now_ms();
    assert_int_equal(edl_watch_open(c, edl_str("k"), NULL, &w), EDL_EUNAVAIL);
    assert_true(harness_now_ms() - t0 < 3000);
    assert_null(w);
    assert_non_null(strstr(edl_etcd_errmsg(c), "127.0.0.1:1"));
    edl_etcd_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events_arrive_in_order_with_prev_kv),
        cmocka_unit_test(test_txn_events_share_one_revision),
        cmocka_unit_test(test_start_revision_replays_history),
        cmocka_unit_test(test_progress_notifications_arrive_when_idle),
        cmocka_unit_test(test_fd_is_readable_exactly_while_events_wait),
        cmocka_unit_test(test_slow_reader_gets_every_event_through_backpressure),
        cmocka_unit_test(test_dropped_connection_resumes_without_loss),
        cmocka_unit_test(test_etcd_restart_during_watch_loses_nothing),
        cmocka_unit_test(test_compacted_start_revision_is_reported),
        cmocka_unit_test(test_compaction_while_disconnected_is_reported),
        cmocka_unit_test(test_watch_on_unreachable_etcd_fails_start),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* test_etcd_badinput.c: the client against hostile replies from a stand-in HTTP server
 * (harness_http, a fake etcd gateway that answers badly on purpose): malformed, truncated and
 * mistyped JSON, invalid base64, oversized and endless replies, servers that hang or hang up.
 * Each must give a clear error and never a crash (this file also runs under ASan/UBSan). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/etcd.h"
#include "harness.h"

typedef struct fixture {
    harness_http *http;
    edl_etcd *c;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    f->http = harness_http_open();
    assert_non_null(f->http);
    edl_etcd_config cfg;
    edl_etcd_config_init(&cfg);
    assert_int_equal(edl_etcd_config_set_endpoints(&cfg, harness_http_url(f->http)), 0);
    cfg.timeout_ms = 1500;
    cfg.max_response_bytes = 1 << 20;
    assert_int_equal(edl_etcd_open(&cfg, &f->c), 0);
    edl_etcd_config_clear(&cfg);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    edl_etcd_close(f->c);
    harness_http_close(f->http);
    free(f);
    return 0;
}

static void reply(fixture *f, int status, const char *body, enum harness_http_mode mode)
{
    harness_http_reply(f->http, status, body, strlen(body), mode);
}

static int get(fixture *f)
{
    edl_kv *kv = NULL;
    int rc = edl_etcd_get(f->c, edl_str("bad/key"), &kv, NULL);
    if (rc == 0)
        edl_kv_free(kv);
    return rc;
}

static void test_request_is_well_formed_json_with_base64(void **state)
{
    fixture *f = *state;
    reply(f, 200, "{\"header\":{\"revision\":\"7\"},\"kvs\":[{\"key\":\"YmFkL2tleQ==\",\"value\":\"dg==\","
                  "\"create_revision\":\"5\",\"mod_revision\":\"7\",\"version\":\"2\",\"lease\":\"7587862311215489539\"}],\"count\":\"1\"}",
          HTTP_NORMAL);
    edl_kv *kv;
    int64_t rev;
    assert_int_equal(edl_etcd_get(f->c, edl_str("bad/key"), &kv, &rev), 0);
    assert_int_equal(rev, 7);
    assert_string_equal(kv->value, "v");
    assert_int_equal(kv->lease, 7587862311215489539LL); /* > 2^53, exact */
    edl_kv_free(kv);
    char path[64], body[256];
    harness_http_last_request(f->http, path, sizeof path, body, sizeof body);
    assert_string_equal(path, "/v3/kv/range");
    assert_string_equal(body, "{\"key\":\"YmFkL2tleQ==\"}");
}

static void test_malformed_json_is_eproto(void **state)
{
    fixture *f = *state;
    reply(f, 200, "{\"header\":{\"revision\":\"7\"},\"kvs\":[{\"key\":", HTTP_NORMAL);
    assert_int_equal(get(f), EDL_EPROTO);
    assert_non_null(strstr(edl_etcd_errmsg(f->c), "malformed JSON"));
    assert_non_null(strstr(edl_etcd_errmsg(f->c), "bad/key"));
    assert_non_null(strstr(edl_etcd_errmsg(f->c), harness_http_url(f->http)));
    reply(f, 200, "[1,2,3]", HTTP_NORMAL);
    assert_int_equal(get(f), EDL_EPROTO);
    reply(f, 200, "", HTTP_NORMAL);
    assert_int_equal(get(f), EDL_EPROTO);
    reply(f, 200, "{} trailing", HTTP_NORMAL);
    assert_int_equal(get(f), EDL_EPROTO);
}

static void test_truncated_reply_is_an_error(void **state)
{
    fixture *f = *state;
    reply(f, 200, "{\"header\":{\"revision\":\"7\"}}", HTTP_TRUNCATED);
    int rc = get(f);
    assert_true(rc == EDL_EUNAVAIL || rc == EDL_EPROTO || rc == EDL_ETIMEDOUT);
    assert_non_null(strstr(edl_etcd_errmsg(f->c), "/v3/kv/range"));
}

static void test_wrong_types_are_eproto(void **state)
{
    fixture *f = *state;
    static const char *bodies[] = {
        "{\"header\":{\"revision\":{}}}",
        "{\"header\":\"x\"}",
        "{\"header\":{\"revision\":\"12abc\"}}",
        "{\"header\":{\"revision\":1.5}}",
        "{\"kvs\":{\"key\":\"YQ==\"}}",
        "{\"kvs\":[{\"key\":5}],\"count\":\"1\"}",
        "{\"kvs\":[\"YQ==\"],\"count\":\"1\"}",
        "{\"more\":\"yes\"}",
        "{\"count\":\"-3\"}",
        "{\"kvs\":[{\"key\":\"YQ==\"},{\"key\":\"Yg==\"}],\"count\":\"1\"}",
        "{\"header\":{\"revision\":\"99999999999999999999999\"}}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
        reply(f, 200, bodies[i], HTTP_NORMAL);
        edl_range_result r;
        int rc = edl_etcd_range(f->c, edl_str("bad/key"), NULL, &r);
        if (rc != EDL_EPROTO)
            fail_msg("body %s: got %d (%s), want EDL_EPROTO", bodies[i], rc, edl_strerror(rc));
        assert_null(r.kvs);
    }
}

static void test_invalid_base64_is_eproto(void **state)
{
    fixture *f = *state;
    static const char *keys[] = {"YQ=", "Y!==", "YQ==YQ==", "=YQ=", "YQ\\u0000=", "Y Q="};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"kvs\":[{\"key\":\"%s\",\"value\":\"dg==\"}],\"count\":\"1\"}", keys[i]);
        reply(f, 200, body, HTTP_NORMAL);
        if (get(f) != EDL_EPROTO)
            fail_msg("key base64 '%s' was accepted", keys[i]);
        assert_non_null(strstr(edl_etcd_errmsg(f->c), "invalid base64"));
    }
}

static void test_server_errors_map_to_codes_with_message(void **state)
{
    fixture *f = *state;
    reply(f, 400, "{\"error\":\"etcdserver: request is too large\",\"message\":\"etcdserver: request is too large\",\"code\":3}", HTTP_NORMAL);
    assert_int_equal(edl_etcd_put(f->c, edl_str("bad/key"), edl_str("v"), NULL, NULL), EDL_ETOOBIG);
    assert_non_null(strstr(edl_etcd_errmsg(f->c), "request is too large"));
    reply(f, 400, "{\"message\":\"mvcc: required revision has been compacted\",\"code\":11}", HTTP_NORMAL);
    assert_int_equal(get(f), EDL_ECOMPACTED);
    reply(f, 403, "{\"message\":\"etcdserver: permission denied\",\"code\":7}", HTTP_NORMAL);
    assert_int_equal(get(f), EDL_EAUTH);
    reply(f, 500, "<html>oops</html>", HTTP_NORMAL);
    assert_int_equal(get(f), EDL_ESERVER);
    assert_non_null(strstr(edl_etcd_errmsg(f->c), "HTTP 500"));
    assert_non_null(strstr(edl_etcd_errmsg(f->c), "oops"));
    /* 503 (no leader) is retried until the deadline, then reported */
    reply(f, 503, "{\"message\":\"etcdserver: no leader\"}", HTTP_NORMAL);
    int64_t t0 = harness_now_ms();
    assert_int_equal(get(f), EDL_EUNAVAIL);
    assert_true(harness_now_ms() - t0 >= 1000);
    assert_non_null(strstr(edl_etcd_errmsg(f->c), "no leader"));
    assert_true(harness_http_requests(f->http) > 3);
}

static void test_hanging_server_times_out(void **state)
{
    fixture *f = *state;
    reply(f, 200, "", HTTP_HANG);
    int64_t t0 = harness_now_ms();
    int rc = get(f);
    int64_t took = harness_now_ms() - t0;
    assert_true(rc == EDL_ETIMEDOUT || rc == EDL_EUNAVAIL);
    assert_true(took >= 1400 && took < 3000);
}

static void test_hang_up_without_reply_is_an_error(void **state)
{
    fixture *f = *state;
    reply(f, 200, "", HTTP_CLOSE_NO_REPLY);
    assert_int_equal(get(f), EDL_EUNAVAIL);
    /* a txn is not re-sent after a failure that may have applied it */
    edl_txn *t = edl_txn_new();
    edl_txn_put(t, EDL_TXN_SUCCESS, edl_str("bad/key"), edl_str("v"), NULL);
    edl_txn_result r;
    int before = harness_http_requests(f->http);
    assert_int_equal(edl_etcd_txn(f->c, t, &r), EDL_EUNAVAIL);
    assert_int_equal(harness_http_requests(f->http) - before, 1);
    assert_non_null(strstr(edl_etcd_errmsg(f->c), "may have been applied"));
    edl_txn_free(t);
}

static void test_endless_reply_is_capped(void **state)
{
    fixture *f = *state;
    harness_http_huge_limit(f->http, 0);
    reply(f, 200, "", HTTP_HUGE);
    assert_int_equal(get(f), EDL_ETOOBIG);
    assert_non_null(strstr(edl_etcd_errmsg(f->c), "exceeds"));
}

static void test_txn_reply_not_matching_request_is_eproto(void **state)
{
    fixture *f = *state;
    reply(f, 200, "{\"header\":{\"revision\":\"3\"},\"succeeded\":true,\"responses\":[]}", HTTP_NORMAL);
    edl_txn *t = edl_txn_new();
    edl_txn_put(t, EDL_TXN_SUCCESS, edl_str("bad/key"), edl_str("v"), NULL);
    edl_txn_result r;
    assert_int_equal(edl_etcd_txn(f->c, t, &r), EDL_EPROTO);
    reply(f, 200, "{\"succeeded\":true,\"responses\":[{\"response_bogus\":{}}]}", HTTP_NORMAL);
    assert_int_equal(edl_etcd_txn(f->c, t, &r), EDL_EPROTO);
    reply(f, 200, "{\"succeeded\":\"true\",\"responses\":[{\"response_put\":{}}]}", HTTP_NORMAL);
    assert_int_equal(edl_etcd_txn(f->c, t, &r), EDL_EPROTO);
    edl_txn_free(t);
}

static void test_lease_replies_without_ttl_mean_lost(void **state)
{
    fixture *f = *state;
    reply(f, 200, "{\"result\":{\"ID\":\"5\"}}", HTTP_NORMAL);
    int64_t ttl;
    assert_int_equal(edl_etcd_lease_keepalive(f->c, 5, &ttl), EDL_ELEASE);
    reply(f, 200, "{\"result\":\"x\"}", HTTP_NORMAL);
    assert_int_equal(edl_etcd_lease_keepalive(f->c, 5, &ttl), EDL_EPROTO);
    reply(f, 200, "{\"ID\":\"5\"}", HTTP_NORMAL);
    int64_t id;
    assert_int_equal(edl_etcd_lease_grant(f->c, 10, 0, &id, &ttl), EDL_EPROTO);
}

static void test_malformed_watch_stream_is_reported(void **state)
{
    fixture *f = *state;
    const char *stream = "{\"result\":{\"header\":{\"revision\":\"4\"},\"created\":true}}\n"
                         "{\"result\":{\"header\":{\"revision\":\"5\"},\"events\":[{\"kv\":{\"key\":\"@@@@\",\"mod_revision\":\"5\"}}]}}\n";
    harness_http_reply_path(f->http, "/v3/watch", 200, stream, strlen(stream), HTTP_CHUNKED_HANG);
    edl_watch *w;
    assert_int_equal(edl_watch_open(f->c, edl_str("bad/key"), NULL, &w), 0);
    edl_watch_event *ev;
    assert_int_equal(edl_watch_next(w, &ev, 3000), 0);
    assert_int_equal(ev->type, EDL_WATCH_ERROR);
    assert_int_equal(ev->error, EDL_EPROTO);
    edl_watch_event_free(ev);
    edl_watch_close(w);
}

static void test_watch_stream_put_and_delete_are_decoded(void **state)
{
    fixture *f = *state;
    /* a PUT event carries no "type" (zero values are omitted); a DELETE says so */
    const char *stream = "{\"result\":{\"header\":{\"revision\":\"4\"},\"created\":true}}\n"
                         "{\"result\":{\"header\":{\"revision\":\"5\"},\"events\":[{\"kv\":{\"key\":\"YQ==\",\"value\":\"Yg==\",\"mod_revision\":\"5\"}}]}}\n"
                         "{\"result\":{\"header\":{\"revision\":\"6\"},\"events\":[{\"type\":\"DELETE\",\"kv\":{\"key\":\"YQ==\",\"mod_revision\":\"6\"}}]}}\n";
    harness_http_reply_path(f->http, "/v3/watch", 200, stream, strlen(stream), HTTP_CHUNKED_HANG);
    edl_watch *w;
    assert_int_equal(edl_watch_open(f->c, edl_str("a"), NULL, &w), 0);
    edl_watch_event *ev;
    assert_int_equal(edl_watch_next(w, &ev, 3000), 0);
    assert_int_equal(ev->type, EDL_WATCH_PUT);
    assert_string_equal(ev->kv.value, "b");
    assert_int_equal(ev->revision, 5);
    edl_watch_event_free(ev);
    assert_int_equal(edl_watch_next(w, &ev, 3000), 0);
    assert_int_equal(ev->type, EDL_WATCH_DELETE);
    assert_int_equal(ev->revision, 6);
    edl_watch_event_free(ev);
    edl_watch_close(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_request_is_well_formed_json_with_base64, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_json_is_eproto, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_reply_is_an_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_types_are_eproto, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_base64_is_eproto, setup, teardown),
        cmocka_unit_test_setup_teardown(test_server_errors_map_to_codes_with_message, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hanging_server_times_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hang_up_without_reply_is_an_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_endless_reply_is_capped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_txn_reply_not_matching_request_is_eproto, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease_replies_without_ttl_mean_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_watch_stream_is_reported, setup, teardown),
        cmocka_unit_test_setup_teardown(test_watch_stream_put_and_delete_are_decoded, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

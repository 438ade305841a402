/* test_etcd_auth.c: username/password authentication against a real etcd with auth enabled:
 * the right password works (calls and watches), a wrong one or none fails clearly, and an
 * expired token is renewed without the caller noticing. */
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
    /* tokens that expire after 2 s, so renewal is exercised within the test */
    static const char *const args[] = {"--auth-token-ttl=2", NULL};
    srv = harness_etcd_open_auth(args);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    edl_etcd_server_close(srv);
    return 0;
}

static int client_as(const char *user, const char *pass, edl_etcd **out)
{
    edl_etcd_config cfg;
    edl_etcd_config_init(&cfg);
    assert_int_equal(edl_etcd_config_set_endpoints(&cfg, edl_etcd_server_endpoints(srv)), 0);
    if (user) {
        cfg.username = strdup(user);
        cfg.password = strdup(pass);
    }
    int rc = edl_etcd_open(&cfg, out);
    edl_etcd_config_clear(&cfg);
    return rc;
}

static void test_right_password_can_read_and_write(void **state)
{
    (void)state;
    edl_etcd *c;
    assert_int_equal(client_as("trainer", "s3cret", &c), 0);
    harness_put(c, "/edl/auth/a", "1");
    char v[8];
    assert_string_equal(harness_get(c, "/edl/auth/a", v, sizeof v), "1");
    edl_etcd_close(c);
}

static void test_wrong_password_is_a_clear_auth_error(void **state)
{
    (void)state;
    edl_etcd *c;
    assert_int_equal(client_as("trainer", "wrong", &c), 0);
    edl_kv *kv;
    assert_int_equal(edl_etcd_get(c, edl_str("/edl/auth/a"), &kv, NULL), EDL_EAUTH);
    const char *m = edl_etcd_errmsg(c);
    assert_non_null(strstr(m, "trainer"));
    assert_non_null(strstr(m, "authenticate"));
    edl_etcd_close(c);
}

static void test_no_credentials_and_no_permission_are_refused(void **state)
{
    (void)state;
    edl_etcd *anon, *c;
    assert_int_equal(client_as(NULL, NULL, &anon), 0);
    assert_int_equal(edl_etcd_put(anon, edl_str("/edl/auth/x"), edl_str("1"), NULL, NULL), EDL_EAUTH);
    edl_etcd_close(anon);
    assert_int_equal(client_as("trainer", "s3cret", &c), 0);
    assert_int_equal(edl_etcd_put(c, edl_str("/other/x"), edl_str("1"), NULL, NULL), EDL_EAUTH);
    assert_non_null(strstr(edl_etcd_errmsg(c), "/other/x"));
    edl_etcd_close(c);
}

static void test_expired_token_is_renewed(void **state)
{
    (void)state;
    edl_etcd *c;
    assert_int_equal(client_as("trainer", "s3cret", &c), 0);
    harness_put(c, "/edl/auth/t", "1");
    const char *auths = "grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Authenticate\"";
    double before = harness_etcd_metric(srv, auths);
    assert_true(before >= 1);
    /* The time is the test: the 2 s token expires on etcd's side (checked once a second) with
     * nothing to show for it until it is used, and any use renews it. */
    harness_sleep_ms(3500);
    harness_put(c, "/edl/auth/t", "2");
    assert_true(harness_etcd_metric(srv, auths) > before); /* it did expire: a new token */
    char v[8];
    assert_string_equal(harness_get(c, "/edl/auth/t", v, sizeof v), "2");
    edl_etcd_close(c);
}

static void test_watch_with_auth_delivers_events(void **state)
{
    (void)state;
    edl_etcd *c;
    assert_int_equal(client_as("trainer", "s3cret", &c), 0);
    edl_watch *w;
    edl_watch_opts o = {.prefix = true};
    assert_int_equal(edl_watch_open(c, edl_str("/edl/auth/w/"), &o, &w), 0);
    harness_put(c, "/edl/auth/w/a", "A");
    edl_watch_event *ev;
    assert_int_equal(edl_watch_next(w, &ev, 5000), 0);
    assert_int_equal(ev->type, EDL_WATCH_PUT);
    assert_string_equal(ev->kv.value, "A");
    edl_watch_event_free(ev);
    edl_watch_close(w);
    edl_etcd_close(c);
}

static void test_half_configured_credentials_are_rejected(void **state)
{
    (void)state;
    edl_etcd_config cfg;
    edl_etcd_config_init(&cfg);
    assert_int_equal(edl_etcd_config_set_endpoints(&cfg, edl_etcd_server_endpoints(srv)), 0);
    cfg.username = strdup("trainer");
    edl_etcd *c = NULL;
    assert_int_equal(edl_etcd_open(&cfg, &c), EDL_EINVAL);
    assert_null(c);
    edl_etcd_config_clear(&cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_right_password_can_read_and_write),
        cmocka_unit_test(test_wrong_password_is_a_clear_auth_error),
        cmocka_unit_test(test_no_credentials_and_no_permission_are_refused),
        cmocka_unit_test(test_expired_token_is_renewed),
        cmocka_unit_test(test_watch_with_auth_delivers_events),
        cmocka_unit_test(test_half_configured_credentials_are_rejected),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

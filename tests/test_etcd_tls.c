/* test_etcd_tls.c: the client over TLS against a real etcd that requires client certificates.
 * A throw-away CA, server and client certificates are made with the openssl command. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "edl/etcd.h"
#include "harness.h"

static char dir[] = "/tmp/edl-tls-XXXXXX";
static edl_etcd_server *srv;

static char *path(const char *name)
{
    static char buf[8][128]; /* enough for every path in one options struct */
    static int i;
    i = (i + 1) % 8;
    snprintf(buf[i], sizeof buf[i], "%s/%s", dir, name);
    return buf[i];
}

static void make_certs(void)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "set -e; cd %s; exec >openssl.log 2>&1\n"
             "k='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes'\n"
             "openssl req -x509 $k -keyout ca.key -out ca.crt -days 2 -subj /CN=edl-test-ca\n"
             "openssl req $k -keyout server.key -out server.csr -subj /CN=127.0.0.1\n"
             "printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n' >server.ext\n"
             "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext -out server.crt\n"
             "openssl req $k -keyout client.key -out client.csr -subj /CN=edl-client\n"
             "printf 'extendedKeyUsage=clientAuth\\n' >client.ext\n"
             "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile client.ext -out client.crt\n"
             "openssl req -x509 $k -keyout other.key -out other.crt -days 2 -subj /CN=stranger\n",
             dir);
    if (system(cmd) != 0)
        fail_msg("openssl could not make test certificates (see %s/openssl.log)", dir);
}

static int setup(void **state)
{
    (void)state;
    if (!mkdtemp(dir))
        fail_msg("mkdtemp failed");
    make_certs();
    edl_etcd_server_opts o = {
        .quiet = true,
        .tls_cert_file = path("server.crt"),
        .tls_key_file = path("server.key"),
        .tls_ca_file = path("ca.crt"),
        .tls_client_cert_auth = true,
        .tls_client_cert_file = path("client.crt"),
        .tls_client_key_file = path("client.key"),
    };
    if (edl_etcd_server_open(&o, &srv) != 0)
        fail_msg("etcd with TLS did not start");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    edl_etcd_server_close(srv);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd);
}

static edl_etcd *tls_client(const char *ca, const char *cert, const char *key)
{
    return harness_tls_client(edl_etcd_server_endpoints(srv), 1500, ca ? path(ca) : NULL,
                              cert ? path(cert) : NULL, key ? path(key) : NULL);
}

static void test_endpoints_are_https(void **state)
{
    (void)state;
    assert_int_equal(strncmp(edl_etcd_server_endpoint(srv, 0), "https://", 8), 0);
}

static void test_trusted_client_with_certificate_works(void **state)
{
    (void)state;
    edl_etcd *c = tls_client("ca.crt", "client.crt", "client.key");
    edl_watch *w;
    assert_int_equal(edl_watch_open(c, edl_str("tls/k"), NULL, &w), 0);
    harness_put(c, "tls/k", "secret");
    char v[16];
    assert_string_equal(harness_get(c, "tls/k", v, sizeof v), "secret");
    edl_watch_event *ev;
    assert_int_equal(edl_watch_next(w, &ev, 5000), 0);
    assert_string_equal(ev->kv.value, "secret");
    edl_watch_event_free(ev);
    edl_watch_close(w);
    int64_t id;
    assert_int_equal(edl_etcd_lease_grant(c, 5, 0, &id, NULL), 0);
    edl_lease_keeper *k;
    assert_int_equal(edl_lease_keeper_open(c, id, 5, NULL, NULL, &k), 0);
    edl_lease_keeper_close(k, true);
    edl_etcd_close(c);
}

static void test_untrusted_server_is_refused(void **state)
{
    (void)state;
    /* wrong CA: refused at once, not retried until the deadline (which once ended in a
     * "timed out" that hid the cause) */
    edl_etcd *c = harness_tls_client(edl_etcd_server_endpoints(srv), 30000, path("other.crt"),
                                     path("client.crt"), path("client.key"));
    edl_kv *kv;
    int64_t t0 = edl_monotonic_ms();
    assert_int_equal(edl_etcd_get(c, edl_str("tls/k"), &kv, NULL), EDL_EAUTH);
    assert_true(edl_monotonic_ms() - t0 < 15000);
    assert_non_null(strstr(edl_etcd_errmsg(c), edl_etcd_server_endpoint(srv, 0)));
    edl_etcd_close(c);
}

static void test_missing_or_foreign_client_certificate_is_refused(void **state)
{
    (void)state;
    edl_etcd *c = tls_client("ca.crt", NULL, NULL);
    edl_kv *kv;
    int rc = edl_etcd_get(c, edl_str("tls/k"), &kv, NULL);
    assert_true(rc == EDL_EAUTH || rc == EDL_EUNAVAIL);
    assert_int_not_equal(rc, 0);
    edl_etcd_close(c);
    c = tls_client("ca.crt", "other.crt", "other.key");
    rc = edl_etcd_put(c, edl_str("tls/k"), edl_str("overwritten"), NULL, NULL);
    assert_true(rc == EDL_EAUTH || rc == EDL_EUNAVAIL);
    edl_etcd_close(c);
    c = tls_client("ca.crt", "client.crt", "client.key");
    char v[16];
    assert_string_equal(harness_get(c, "tls/k", v, sizeof v), "secret");
    edl_etcd_close(c);
}

/* An etcd that requires client certificates, asked without one: the refusal says so (not
 * libcurl's "getpeername() failed with errno 107"), at once, naming the flags to give. */
static void test_no_client_certificate_is_named(void **state)
{
    (void)state;
    edl_etcd *c = tls_client("ca.crt", NULL, NULL);
    edl_kv *kv;
    int64_t t0 = harness_now_ms();
    assert_int_equal(edl_etcd_get(c, edl_str("tls/k"), &kv, NULL), EDL_EAUTH);
    const char *msg = edl_etcd_errmsg(c);
    if (!strstr(msg, "requires a client certificate") || !strstr(msg, "--cert"))
        fail_msg("the message does not say a client certificate is missing: %s", msg);
    assert_true(harness_now_ms() - t0 < 1000); /* not retried until the deadline */
    edl_etcd_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_endpoints_are_https),
        cmocka_unit_test(test_trusted_client_with_certificate_works),
        cmocka_unit_test(test_untrusted_server_is_refused),
        cmocka_unit_test(test_missing_or_foreign_client_certificate_is_refused),
        cmocka_unit_test(test_no_client_certificate_is_named),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* test_etcd_kv.c: put, get, range, delete against a real etcd; binary safety, options,
 * size limits and endpoint configuration errors. */
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
    edl_etcd_server *srv;
    edl_etcd *c;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    harness_open_etcd(1, NULL, &f->srv, &f->c);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    harness_close_etcd(&f->srv, &f->c);
    free(f);
    return 0;
}

static void test_put_get_roundtrip_reports_revisions(void **state)
{
    fixture *f = *state;
    edl_put_result pr;
    assert_int_equal(edl_etcd_put(f->c, edl_str("kv/a"), edl_str("one"), NULL, &pr), 0);
    assert_true(pr.revision > 1);
    assert_null(pr.prev_kv);
    edl_kv *kv;
    int64_t rev;
    assert_int_equal(edl_etcd_get(f->c, edl_str("kv/a"), &kv, &rev), 0);
    assert_string_equal(kv->value, "one");
    assert_int_equal(kv->value_len, 3);
    assert_int_equal(kv->mod_revision, pr.revision);
    assert_int_equal(kv->create_revision, pr.revision);
    assert_int_equal(kv->version, 1);
    assert_int_equal(rev, pr.revision);
    edl_kv_free(kv);

    edl_put_opts po = {.prev_kv = true};
    assert_int_equal(edl_etcd_put(f->c, edl_str("kv/a"), edl_str("two"), &po, &pr), 0);
    assert_non_null(pr.prev_kv);
    assert_string_equal(pr.prev_kv->value, "one");
    edl_put_result_clear(&pr);
    assert_int_equal(edl_etcd_get(f->c, edl_str("kv/a"), &kv, NULL), 0);
    assert_int_equal(kv->version, 2);
    edl_kv_free(kv);
}

static void test_get_missing_key_is_not_found_and_names_key(void **state)
{
    fixture *f = *state;
    edl_kv *kv = (edl_kv *)0x1;
    assert_int_equal(edl_etcd_get(f->c, edl_str("kv/absent"), &kv, NULL), EDL_ENOTFOUND);
    assert_null(kv);
    assert_non_null(strstr(edl_etcd_errmsg(f->c), "kv/absent"));
}

static void test_error_message_escapes_and_truncates_binary_keys(void **state)
{
    fixture *f = *state;
    char key[300];
    memset(key, 0, sizeof key);
    memcpy(key, "missing/", 8);
    edl_kv *kv;
    assert_int_equal(edl_etcd_get(f->c, edl_bytes(key, sizeof key), &kv, NULL), EDL_ENOTFOUND);
    const char *m = edl_etcd_errmsg(f->c);
    assert_non_null(strstr(m, "missing/\\x00\\x00"));
    assert_non_null(strstr(m, "..."));
    assert_true(strlen(m) < 200);
}

static void test_binary_keys_and_values_survive(void **state)
{
    fixture *f = *state;
    const char key[] = {'b', 'i', 'n', '/', 0, (char)0xff, '\n', 'z'};
    char value[300];
    for (size_t i = 0; i < sizeof value; i++)
        value[i] = (char)(i * 7);
    assert_int_equal(edl_etcd_put(f->c, edl_bytes(key, sizeof key), edl_bytes(value, sizeof value), NULL, NULL), 0);
    edl_kv *kv;
    assert_int_equal(edl_etcd_get(f->c, edl_bytes(key, sizeof key), &kv, NULL), 0);
    assert_int_equal(kv->key_len, sizeof key);
    assert_memory_equal(kv->key, key, sizeof key);
    assert_int_equal(kv->value_len, sizeof value);
    assert_memory_equal(kv->value, value, sizeof value);
    edl_kv_free(kv);
    /* empty value is a value, not an absent key */
    assert_int_equal(edl_etcd_put(f->c, edl_str("bin/empty"), edl_bytes("", 0), NULL, NULL), 0);
    assert_int_equal(edl_etcd_get(f->c, edl_str("bin/empty"), &kv, NULL), 0);
    assert_int_equal(kv->value_len, 0);
    assert_string_equal(kv->value, "");
    edl_kv_free(kv);
}

static void put_n(edl_etcd *c, const char *prefix, int n)
{
    for (int i = 0; i < n; i++) {
        char k[64], v[32];
        snprintf(k, sizeof k, "%s%02d", prefix, i);
        snprintf(v, sizeof v, "v%d", i);
        harness_put(c, k, v);
    }
}

static void test_range_prefix_limit_count_keys_only(void **state)
{
    fixture *f = *state;
    put_n(f->c, "rng/", 10);
    harness_put(f->c, "rng0", "outside"); /* the prefix's end itself is outside */
    edl_range_result r;
    edl_range_opts o = {.prefix = true};
    assert_int_equal(edl_etcd_range(f->c, edl_str("rng/"), &o, &r), 0);
    assert_int_equal(r.n_kvs, 10);
    assert_int_equal(r.count, 10);
    assert_false(r.more);
    for (size_t i = 0; i < r.n_kvs; i++) {
        char k[32];
        snprintf(k, sizeof k, "rng/%02zu", i);
        assert_string_equal(r.kvs[i].key, k);
    }
    edl_range_result_clear(&r);

    o.limit = 3;
    assert_int_equal(edl_etcd_range(f->c, edl_str("rng/"), &o, &r), 0);
    assert_int_equal(r.n_kvs, 3);
    assert_int_equal(r.count, 10);
    assert_true(r.more);
    edl_range_result_clear(&r);

    o = (edl_range_opts){.prefix = true, .keys_only = true};
    assert_int_equal(edl_etcd_range(f->c, edl_str("rng/"), &o, &r), 0);
    assert_int_equal(r.n_kvs, 10);
    assert_int_equal(r.kvs[0].value_len, 0);
    edl_range_result_clear(&r);

    o = (edl_range_opts){.prefix = true, .count_only = true};
    assert_int_equal(edl_etcd_range(f->c, edl_str("rng/"), &o, &r), 0);
    assert_int_equal(r.n_kvs, 0);
    assert_int_equal(r.count, 10);
    edl_range_result_clear(&r);

    o = (edl_range_opts){.prefix = true, .sort_order = EDL_SORT_DESCEND, .sort_target = EDL_SORT_KEY, .limit = 1};
    assert_int_equal(edl_etcd_range(f->c, edl_str("rng/"), &o, &r), 0);
    assert_string_equal(r.kvs[0].key, "rng/09");
    edl_range_result_clear(&r);

    o = (edl_range_opts){.range_end = edl_str("rng/05")};
    assert_int_equal(edl_etcd_range(f->c, edl_str("rng/02"), &o, &r), 0);
    assert_int_equal(r.n_kvs, 3);
    edl_range_result_clear(&r);
}

static void test_range_at_old_revision_sees_old_value(void **state)
{
    fixture *f = *state;
    edl_put_result p1, p2;
    assert_int_equal(edl_etcd_put(f->c, edl_str("hist/k"), edl_str("old"), NULL, &p1), 0);
    assert_int_equal(edl_etcd_put(f->c, edl_str("hist/k"), edl_str("new"), NULL, &p2), 0);
    edl_range_result r;
    edl_range_opts o = {.revision = p1.revision};
    assert_int_equal(edl_etcd_range(f->c, edl_str("hist/k"), &o, &r), 0);
    assert_int_equal(r.n_kvs, 1);
    assert_string_equal(r.kvs[0].value, "old");
    edl_range_result_clear(&r);
    o.revision = p2.revision + 1000; /* the future */
    assert_int_not_equal(edl_etcd_range(f->c, edl_str("hist/k"), &o, &r), 0);
}

static void test_delete_key_and_prefix_with_prev_kvs(void **state)
{
    fixture *f = *state;
    put_n(f->c, "del/", 5);
    edl_delete_result d;
    edl_delete_opts o = {.prev_kv = true};
    assert_int_equal(edl_etcd_delete(f->c, edl_str("del/00"), &o, &d), 0);
    assert_int_equal(d.deleted, 1);
    assert_int_equal(d.n_prev_kvs, 1);
    assert_string_equal(d.prev_kvs[0].value, "v0");
    edl_delete_result_clear(&d);
    assert_int_equal(edl_etcd_delete(f->c, edl_str("del/00"), NULL, &d), 0);
    assert_int_equal(d.deleted, 0);
    edl_delete_result_clear(&d);
    o = (edl_delete_opts){.prefix = true};
    assert_int_equal(edl_etcd_delete(f->c, edl_str("del/"), &o, &d), 0);
    assert_int_equal(d.deleted, 4);
    edl_delete_result_clear(&d);
    edl_range_result r;
    edl_range_opts ro = {.prefix = true, .count_only = true};
    assert_int_equal(edl_etcd_range(f->c, edl_str("del/"), &ro, &r), 0);
    assert_int_equal(r.count, 0);
    edl_range_result_clear(&r);
}

static void test_oversized_value_is_refused_and_state_kept(void **state)
{
    fixture *f = *state;
    harness_put(f->c, "big/k", "small");
    size_t n = 2u << 20; /* over etcd's 1.5 MiB request limit */
    char *big = malloc(n);
    memset(big, 'x', n);
    int rc = edl_etcd_put(f->c, edl_str("big/k"), edl_bytes(big, n), NULL, NULL);
    free(big);
    assert_int_equal(rc, EDL_ETOOBIG);
    assert_non_null(strstr(edl_etcd_errmsg(f->c), "big/k"));
    char v[32];
    assert_string_equal(harness_get(f->c, "big/k", v, sizeof v), "small");
}

static void test_reply_over_client_cap_is_refused(void **state)
{
    fixture *f = *state;
    put_n(f->c, "cap/", 50);
    edl_etcd_config cfg;
    edl_etcd_config_init(&cfg);
    assert_int_equal(edl_etcd_config_set_endpoints(&cfg, edl_etcd_server_endpoints(f->srv)), 0);
    cfg.max_response_bytes = 512;
    edl_etcd *small;
    assert_int_equal(edl_etcd_open(&cfg, &small), 0);
    edl_etcd_config_clear(&cfg);
    edl_range_result r;
    edl_range_opts o = {.prefix = true};
    assert_int_equal(edl_etcd_range(small, edl_str("cap/"), &o, &r), EDL_ETOOBIG);
    assert_non_null(strstr(edl_etcd_errmsg(small), "512"));
    /* the same client still works for a small reply */
    o.limit = 1;
    assert_int_equal(edl_etcd_range(small, edl_str("cap/"), &o, &r), 0);
    assert_int_equal(r.n_kvs, 1);
    edl_range_result_clear(&r);
    edl_etcd_close(small);
}

static void test_prefix_end_edge_cases(void **state)
{
    (void)state;
    char *e;
    size_t n;
    assert_int_equal(edl_etcd_prefix_end(edl_str("foo/"), &e, &n), 0);
    assert_int_equal(n, 4);
    assert_memory_equal(e, "foo0", 4);
    free(e);
    const char ff[] = {'a', (char)0xff, (char)0xff};
    assert_int_equal(edl_etcd_prefix_end(edl_bytes(ff, 3), &e, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(e[0], 'b');
    free(e);
    assert_int_equal(edl_etcd_prefix_end(edl_bytes("", 0), &e, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(e[0], 0);
    free(e);
}

static void test_endpoint_config_rejects_garbage(void **state)
{
    (void)state;
    edl_etcd_config cfg;
    edl_etcd_config_init(&cfg);
    assert_int_equal(edl_etcd_config_set_endpoints(&cfg, "http://a:1, https://b:2/"), 0);
    assert_int_equal(cfg.n_endpoints, 2);
    assert_string_equal(cfg.endpoints[1], "https://b:2");
    assert_int_equal(edl_etcd_config_set_endpoints(&cfg, "ftp://x"), EDL_EINVAL);
    assert_int_equal(edl_etcd_config_set_endpoints(&cfg, "http://a:1/v3/kv"), EDL_EINVAL);
    assert_int_equal(edl_etcd_config_set_endpoints(&cfg, " , "), EDL_EINVAL);
    assert_int_equal(cfg.n_endpoints, 2); /* unchanged after each error */
    cfg.cert_file = strdup("/x.pem"); /* a client certificate without its key */
    edl_etcd *half = NULL;
    assert_int_equal(edl_etcd_open(&cfg, &half), EDL_EINVAL);
    assert_null(half);
    edl_etcd_config_clear(&cfg);
    edl_etcd *c;
    assert_int_equal(edl_etcd_open_endpoints("localhost:2379", &c), EDL_EINVAL);
}

static void test_unreachable_endpoint_fails_within_timeout(void **state)
{
    (void)state;
    edl_etcd *c = harness_client("http://127.0.0.1:1", 700);
    int64_t t0 = harness_now_ms();
    edl_kv *kv;
    assert_int_equal(edl_etcd_get(c, edl_str("k"), &kv, NULL), EDL_EUNAVAIL);
    int64_t took = harness_now_ms() - t0;
    assert_true(took >= 600 && took < 3000);
    assert_non_null(strstr(edl_etcd_errmsg(c), "127.0.0.1:1"));
    edl_etcd_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_roundtrip_reports_revisions),
        cmocka_unit_test(test_get_missing_key_is_not_found_and_names_key),
        cmocka_unit_test(test_error_message_escapes_and_truncates_binary_keys),
        cmocka_unit_test(test_binary_keys_and_values_survive),
        cmocka_unit_test(test_range_prefix_limit_count_keys_only),
        cmocka_unit_test(test_range_at_old_revision_sees_old_value),
        cmocka_unit_test(test_delete_key_and_prefix_with_prev_kvs),
        cmocka_unit_test(test_oversized_value_is_refused_and_state_kept),
        cmocka_unit_test(test_reply_over_client_cap_is_refused),
        cmocka_unit_test(test_prefix_end_edge_cases),
        cmocka_unit_test(test_endpoint_config_rejects_garbage),
        cmocka_unit_test(test_unreachable_endpoint_fails_within_timeout),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

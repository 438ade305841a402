/* test_etcd_config.c: the etcd client configured from YAML (edl_etcd_config_schema embedded
 * in a bigger program's schema), then used against a real etcd; bad files leave it intact. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/config.h"
#include "edl/etcd.h"
#include "harness.h"

typedef struct program_cfg {
    char *name;
    edl_etcd_config etcd;
} program_cfg;

static const edl_cfg_field program_schema[] = {
    {"name", EDL_CFG_STRING, offsetof(program_cfg, name)},
    {"etcd", EDL_CFG_OBJECT, offsetof(program_cfg, etcd), .fields = edl_etcd_config_schema, .required = true},
    EDL_CFG_END,
};

static int load(program_cfg *pc, const char *yaml, char *err, size_t errlen)
{
    return edl_config_load_string(yaml, strlen(yaml), "agent.yaml", program_schema, pc, err, errlen);
}

static void test_yaml_fills_the_client_config_and_connects(void **state)
{
    (void)state;
    edl_etcd_server *srv = harness_start_etcd(1, NULL);
    char yaml[512], err[256];
    snprintf(yaml, sizeof yaml,
             "name: trainer-a\n"
             "etcd:\n"
             "  endpoints: [\"http://127.0.0.1:1\", \"%s\"]\n"
             "  timeout: 3s\n"
             "  connect_timeout: 250ms\n"
             "  max_response_bytes: 1048576\n",
             edl_etcd_server_endpoint(srv, 0));
    program_cfg pc = {0};
    edl_etcd_config_init(&pc.etcd);
    assert_int_equal(load(&pc, yaml, err, sizeof err), 0);
    assert_int_equal(pc.etcd.n_endpoints, 2);
    assert_string_equal(pc.etcd.endpoints[0], "http://127.0.0.1:1");
    assert_int_equal(pc.etcd.timeout_ms, 3000);
    assert_int_equal(pc.etcd.connect_timeout_ms, 250);
    assert_int_equal(pc.etcd.max_response_bytes, 1048576);
    assert_null(pc.etcd.ca_file);
    edl_etcd *c;
    assert_int_equal(edl_etcd_new(&pc.etcd, &c), 0);
    harness_put(c, "cfg/k", "v"); /* the dead first endpoint is skipped */
    edl_etcd_free(c);
    edl_config_free(program_schema, &pc);
    edl_etcd_server_free(srv);
}

static void test_defaults_stay_when_keys_are_absent(void **state)
{
    (void)state;
    program_cfg pc = {0};
    edl_etcd_config_init(&pc.etcd);
    char err[256];
    assert_int_equal(load(&pc, "etcd:\n  endpoints: http://10.0.0.1:2379\n", err, sizeof err), 0);
    assert_int_equal(pc.etcd.n_endpoints, 1);
    assert_int_equal(pc.etcd.timeout_ms, 5000);
    assert_int_equal(pc.etcd.connect_timeout_ms, 1000);
    assert_int_equal(pc.etcd.max_response_bytes, 64 << 20);
    edl_config_free(program_schema, &pc);
}

static void test_bad_files_name_the_field_and_leave_config_intact(void **state)
{
    (void)state;
    program_cfg pc = {0};
    edl_etcd_config_init(&pc.etcd);
    char err[256];
    assert_int_equal(load(&pc, "etcd:\n  endpoints: [http://a:1]\n", err, sizeof err), 0);
    static const struct {
        const char *yaml, *want;
    } bad[] = {
        {"etcd:\n  endpoints: [http://b:1]\n  timeout: soon\n", "agent.yaml:3"},
        {"etcd:\n  endpoints: [http://b:1]\n  endpionts: [x]\n", "endpionts"},
        {"etcd:\n  timeout: 1s\n", "etcd.endpoints"},
        {"etcd:\n  endpoints: [http://b:1]\n  max_response_bytes: 12\n", "max_response_bytes"},
        {"etcd:\n  endpoints: {a: 1}\n", "etcd.endpoints"},
        {"etcd: [1, 2]\n", "etcd"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = '\0';
        assert_int_equal(load(&pc, bad[i].yaml, err, sizeof err), EDL_ECONFIG);
        if (!strstr(err, bad[i].want))
            fail_msg("error for case %zu does not name '%s': %s", i, bad[i].want, err);
        assert_int_equal(pc.etcd.n_endpoints, 1);
        assert_string_equal(pc.etcd.endpoints[0], "http://a:1");
        assert_int_equal(pc.etcd.timeout_ms, 5000);
    }
    edl_config_free(program_schema, &pc);
}

static void test_invalid_values_are_refused_by_the_client(void **state)
{
    (void)state;
    program_cfg pc = {0};
    edl_etcd_config_init(&pc.etcd);
    char err[256];
    assert_int_equal(load(&pc, "etcd:\n  endpoints: [localhost:2379]\n", err, sizeof err), 0);
    edl_etcd *c = NULL;
    assert_int_equal(edl_etcd_new(&pc.etcd, &c), EDL_EINVAL);
    assert_null(c);
    assert_int_equal(load(&pc, "etcd:\n  endpoints: [http://a:1]\n  cert_file: /x.pem\n", err, sizeof err), 0);
    assert_int_equal(edl_etcd_new(&pc.etcd, &c), EDL_EINVAL);
    edl_config_free(program_schema, &pc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_yaml_fills_the_client_config_and_connects),
        cmocka_unit_test(test_defaults_stay_when_keys_are_absent),
        cmocka_unit_test(test_bad_files_name_the_field_and_leave_config_intact),
        cmocka_unit_test(test_invalid_values_are_refused_by_the_client),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

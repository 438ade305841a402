/* test_etcd_options.c: the etcd settings every program takes (edl/etcd.h, etcd/options.c):
 * flags override the environment, certificate with key, files readable and made absolute, the
 * password read from its file (one line, bounded, clear errors), the environment for a child,
 * and the throwaway certificates of edl run. No server. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "edl/etcd.h"
#include "edl/etcd_server.h"
#include "edl/proc.h"
#include "harness.h"

static char g_dir[] = "/tmp/edl-options-XXXXXX";

static const char *path(const char *name)
{
    static char buf[4][300];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof buf[i], "%s/%s", g_dir, name);
    return buf[i];
}

static void write_file(const char *name, const char *text, size_t len)
{
    FILE *f = fopen(path(name), "w");
    assert_non_null(f);
    fwrite(text, 1, len, f);
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    if (!mkdtemp(g_dir))
        fail_msg("mkdtemp failed");
    write_file("pw", "s3cret\n", 7);
    write_file("pw-crlf", "s3cret\r\n", 8);
    write_file("pw-empty", "\n", 1);
    write_file("pw-two", "a\nb\n", 4);
    write_file("ca.crt", "x", 1);
    write_file("c.crt", "x", 1);
    write_file("c.key", "x", 1);
    char big[2000];
    memset(big, 'x', sizeof big);
    write_file("pw-big", big, sizeof big);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    harness_rmtree(g_dir);
    return 0;
}

static void clear_env(void)
{
    static const char *const names[] = {EDL_ETCD_ENV_NAMES};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        unsetenv(names[i]);
}

static void test_flags_override_the_environment(void **state)
{
    (void)state;
    char err[600];
    setenv("EDL_ETCD_ENDPOINTS", "http://env:2379", 1);
    setenv("EDL_ETCD_USER", "envuser", 1);
    setenv("EDL_ETCD_CACERT", path("ca.crt"), 1);
    edl_etcd_config cfg;
    edl_etcd_config_init(&cfg);
    assert_int_equal(edl_etcd_config_set_option(&cfg, "--etcd", "https://a:1,https://b:2", err,
                                                sizeof err), 0);
    assert_int_equal(edl_etcd_config_set_option(&cfg, "user", "flaguser", err, sizeof err), 0);
    assert_int_equal(edl_etcd_config_set_option(&cfg, "password-file", path("pw"), err,
                                                sizeof err), 0);
    assert_int_equal(edl_etcd_config_set_option(&cfg, "verbose", "x", err, sizeof err),
                     EDL_EINVAL);
    assert_int_equal(edl_etcd_config_from_env(&cfg, err, sizeof err), 0);
    assert_int_equal(edl_etcd_config_check(&cfg, err, sizeof err), 0);
    assert_int_equal(cfg.n_endpoints, 2);
    assert_string_equal(cfg.endpoints[0], "https://a:1");
    assert_string_equal(cfg.username, "flaguser");
    assert_string_equal(cfg.password, "s3cret");
    assert_string_equal(cfg.ca_file, path("ca.crt")); /* the environment fills the rest */
    char **env;
    assert_int_equal(edl_etcd_config_env(&cfg, &env), 0);
    int n = 0;
    for (char **e = env; *e; e++, n++)
        assert_null(strstr(*e, "s3cret")); /* the password's file, never the password */
    assert_int_equal(n, 4);
    assert_string_equal(env[0], "EDL_ETCD_ENDPOINTS=https://a:1,https://b:2");
    edl_env_free(env);
    edl_etcd_config_clear(&cfg);
    clear_env();
}

/* Check one configuration made from flag/value pairs: its code, and a word of its message. */
static void check(const char *const *kv, int want, const char *word)
{
    char err[600] = "";
    edl_etcd_config cfg;
    edl_etcd_config_init(&cfg);
    for (size_t i = 0; kv[i]; i += 2)
        assert_int_equal(edl_etcd_config_set_option(&cfg, kv[i], kv[i + 1], err, sizeof err), 0);
    int rc = edl_etcd_config_check(&cfg, err, sizeof err);
    if (rc != want || (word && !strstr(err, word)))
        fail_msg("%s %s...: %d '%s', expected %d and '%s'", kv[0], kv[1], rc, err, want,
                 word ? word : "");
    edl_etcd_config_clear(&cfg);
}

static void test_check_refuses_incomplete_or_unreadable_settings(void **state)
{
    (void)state;
    check((const char *[]){"cert", path("c.crt"), NULL}, EDL_EINVAL, "--key");
    check((const char *[]){"key", path("c.key"), NULL}, EDL_EINVAL, "--cert");
    check((const char *[]){"user", "u", NULL}, EDL_EINVAL, "--password-file");
    check((const char *[]){"password-file", path("pw"), NULL}, EDL_EINVAL, "--user");
    check((const char *[]){"cacert", path("missing.crt"), NULL}, EDL_EINVAL, "missing.crt");
    check((const char *[]){"user", "u", "password-file", path("none"), NULL}, EDL_EINVAL,
          "No such file");
    check((const char *[]){"user", "u", "password-file", path("pw-empty"), NULL}, EDL_EINVAL,
          "empty");
    check((const char *[]){"user", "u", "password-file", path("pw-two"), NULL}, EDL_EINVAL,
          "only line");
    check((const char *[]){"user", "u", "password-file", path("pw-big"), NULL}, EDL_EINVAL,
          "1 KiB");
    check((const char *[]){"user", "u", "password-file", path("pw-crlf"), NULL}, 0, NULL);
    check((const char *[]){"cert", path("c.crt"), "key", path("c.key"), NULL}, 0, NULL);
}

static void test_relative_paths_are_made_absolute(void **state)
{
    (void)state;
    char cwd[4096], err[600];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(g_dir), 0);
    edl_etcd_config cfg;
    edl_etcd_config_init(&cfg);
    assert_int_equal(edl_etcd_config_set_option(&cfg, "cacert", "ca.crt", err, sizeof err), 0);
    assert_int_equal(edl_etcd_config_check(&cfg, err, sizeof err), 0);
    assert_int_equal(chdir(cwd), 0);
    char want[PATH_MAX];
    assert_non_null(realpath(path("ca.crt"), want));
    assert_string_equal(cfg.ca_file, want);
    edl_etcd_config_clear(&cfg);
}

static void test_throwaway_certificates_are_private(void **state)
{
    (void)state;
    char err[256], cmd[1024];
    const char *d = path("tls");
    assert_int_equal(mkdir(d, 0700), 0);
    assert_int_equal(edl_etcd_tls_make(d, 1, err, sizeof err), 0);
    static const char *const files[] = {EDL_ETCD_TLS_CA, EDL_ETCD_TLS_SERVER_CERT,
                                        EDL_ETCD_TLS_SERVER_KEY, EDL_ETCD_TLS_CLIENT_CERT,
                                        EDL_ETCD_TLS_CLIENT_KEY};
    for (size_t i = 0; i < 5; i++) {
        struct stat st;
        snprintf(cmd, sizeof cmd, "%s/%s", d, files[i]);
        assert_int_equal(stat(cmd, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
    }
    /* both leaves verify against the CA, the server for 127.0.0.1 */
    snprintf(cmd, sizeof cmd, "cd %s && openssl verify -CAfile ca.crt -verify_ip 127.0.0.1 "
             "server.crt >/dev/null && openssl verify -CAfile ca.crt -purpose sslclient "
             "client.crt >/dev/null", d);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(edl_etcd_tls_make(d, 1, err, sizeof err), EDL_EIO); /* never replaces */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flags_override_the_environment),
        cmocka_unit_test(test_check_refuses_incomplete_or_unreadable_settings),
        cmocka_unit_test(test_relative_paths_are_made_absolute),
        cmocka_unit_test(test_throwaway_certificates_are_private),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

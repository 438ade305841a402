/* test_etcd_tls_programs.c: every program against an etcd that requires client certificates
 * and against one with auth on: the settings of edl/etcd.h's options (flags and EDL_ETCD_*),
 * passed on by the agent to its trainer (libedlcoll, checkpoints); a missing certificate or a
 * wrong password is exit code 3 with a message that names the endpoint (libedlcoll: its open
 * fails, naming it); and `edl run`, whose
 * own etcd is https with client certificates unless --insecure. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "edl/etcd.h"
#include "edl/job.h"
#include "harness.h"

static char g_dir[] = "/tmp/edl-tls-programs-XXXXXX";
static edl_etcd_server *g_tls, *g_auth;

static const char *path(const char *name)
{
    static char buf[8][300];
    static int i;
    i = (i + 1) % 8;
    snprintf(buf[i], sizeof buf[i], "%s/%s", g_dir, name);
    return buf[i];
}

static void write_file(const char *name, const char *text)
{
    FILE *f = fopen(path(name), "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void start_tls_etcd(void)
{
    char err[256];
    if (mkdir(path("ok"), 0700) || mkdir(path("other"), 0700) ||
        edl_etcd_tls_make(path("ok"), 1, err, sizeof err) ||
        edl_etcd_tls_make(path("other"), 1, err, sizeof err))
        fail_msg("certificates: %s", err);
    edl_etcd_server_opts o = {.quiet = true, .tls_cert_file = path("ok/server.crt"),
                              .tls_key_file = path("ok/server.key"),
                              .tls_ca_file = path("ok/ca.crt"), .tls_client_cert_auth = true,
                              .tls_client_cert_file = path("ok/client.crt"),
                              .tls_client_key_file = path("ok/client.key")};
    if (edl_etcd_server_open(&o, &g_tls) != 0)
        fail_msg("etcd with client certificates did not start");
}

static void start_auth_etcd(void)
{
    g_auth = harness_etcd_open_auth(NULL);
}

static int setup(void **state)
{
    (void)state;
    if (!mkdtemp(g_dir))
        fail_msg("mkdtemp failed");
    start_tls_etcd();
    start_auth_etcd();
    write_file("right.pw", "s3cret\n");
    write_file("wrong.pw", "wrong\n");
    setenv("EDL_STATE_DIR", path("state"), 1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    edl_etcd_server_close(g_tls);
    edl_etcd_server_close(g_auth);
    harness_rmtree(g_dir);
    return 0;
}

static const char *tls_ep(void)
{
    return edl_etcd_server_endpoint(g_tls, 0);
}

static const char *auth_ep(void)
{
    return edl_etcd_server_endpoint(g_auth, 0);
}

/* Run argv to its end (at most timeout_ms) with its output in out: the exit status. */
static int run(const char *const *argv, char *out, size_t outlen, int timeout_ms)
{
    return harness_run(argv, path("cmd.out"), timeout_ms, out, outlen);
}

/* The client settings of the certificate-requiring etcd, in the environment (children inherit
 * them); NULL cert: none. */
static void tls_env(const char *cert_dir)
{
    setenv("EDL_ETCD_ENDPOINTS", tls_ep(), 1);
    setenv("EDL_ETCD_CACERT", path("ok/ca.crt"), 1);
    if (cert_dir) {
        char p[64];
        snprintf(p, sizeof p, "%s/client.crt", cert_dir);
        setenv("EDL_ETCD_CERT", path(p), 1);
        snprintf(p, sizeof p, "%s/client.key", cert_dir);
        setenv("EDL_ETCD_KEY", path(p), 1);
    }
}

static void clear_env(void)
{
    static const char *const names[] = {EDL_ETCD_ENV_NAMES};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        unsetenv(names[i]);
}

/* Each test starts with no etcd settings in the environment, whatever a failed one left. */
static int clean_env(void **state)
{
    (void)state;
    clear_env();
    return 0;
}

static edl_etcd *tls_client(void)
{
    edl_etcd *c;
    char err[256];
    tls_env("ok");
    assert_int_equal(edl_etcd_open_env(&c, err, sizeof err), 0);
    clear_env();
    return c;
}

static void put_spec(edl_etcd *c, const char *job, int n)
{
    edl_job_spec s;
    edl_spec_init(&s);
    s.min = s.max = n;
    s.settle_ms = 300;
    s.mode = EDL_MODE_INPROCESS;
    char *json = edl_spec_to_json(&s), key[256];
    harness_put(c, harness_job_key(key, sizeof key, job, EDL_KEY_SPEC, NULL, 0), json);
    free(json);
    edl_spec_clear(&s);
}

/* A job served by edl-jobserver (flags) and two edl-agents (environment) over client
 * certificates, whose trainers rendezvous through libedlcoll with the settings the agents
 * passed on; then edl status, scale and stop with flags and with the environment. */
static void test_programs_work_over_client_certificates(void **state)
{
    (void)state;
    edl_etcd *c = tls_client();
    put_spec(c, "tj", 2);
    const char *js[] = {EDL_JOBSERVER_BIN, "--etcd", tls_ep(), "--cacert", path("ok/ca.crt"),
                        "--cert", path("ok/client.crt"), "--key", path("ok/client.key"),
                        "--job", "tj", "--ttl", "5", "--exit-when-done", NULL};
    pid_t jsp = harness_spawn(js, path("tj-js.log"));
    tls_env("ok");
    setenv("EDL_TEST_STEP_MS", "20", 1);
    pid_t ag[2];
    for (int i = 0; i < 2; i++) {
        const char *a[] = {EDL_AGENT_BIN, "--job", "tj", "--pod", i ? "tj-1" : "tj-0", "--",
                           EDL_COLL_WORKER, "elastic", "30", NULL};
        ag[i] = harness_spawn(a, path(i ? "tj-1.log" : "tj-0.log"));
    }
    char out[8192];
    const char *st_env[] = {EDL_CLI_BIN, "status", "tj", NULL};
    HARNESS_WAIT_UNTIL(run(st_env, out, sizeof out, 20000) != 0 || strstr(out, "succeeded"),
                       20000);
    assert_non_null(strstr(out, "job tj:"));
    unsetenv("EDL_TEST_STEP_MS");
    clear_env();
    for (int i = 0; i < 2; i++)
        assert_int_equal(harness_wait_exit(ag[i], 30000), 0); /* the job succeeded */
    assert_int_equal(harness_wait_exit(jsp, 10000), 0);
    const char *st[] = {EDL_CLI_BIN, "status", "tj", "--etcd", tls_ep(), "--cacert",
                        path("ok/ca.crt"), "--cert", path("ok/client.crt"), "--key",
                        path("ok/client.key"), NULL};
    assert_int_equal(run(st, out, sizeof out, 20000), 0);
    assert_non_null(strstr(out, "succeeded"));
    const char *scale[] = {EDL_CLI_BIN, "scale", "tj", "1", "--etcd", tls_ep(), "--cacert",
                           path("ok/ca.crt"), "--cert", path("ok/client.crt"), "--key",
                           path("ok/client.key"), NULL};
    assert_int_equal(run(scale, out, sizeof out, 20000), 0);
    const char *stop[] = {EDL_CLI_BIN, "stop", "tj", "--no-wait", "--etcd", tls_ep(),
                          "--cacert", path("ok/ca.crt"), "--cert", path("ok/client.crt"),
                          "--key", path("ok/client.key"), NULL};
    assert_int_equal(run(stop, out, sizeof out, 20000), 0);
    edl_etcd_close(c);
}

/* Exit code 3 and a message naming the endpoint, from every program. Under TLS 1.3 the server
 * checks a client certificate after the handshake: its alert can be lost to a reset when our
 * request is already on the way, and the refusal then looks like an unreachable etcd. The job
 * server retries an unreachable etcd for ever (by design: etcd may come later), so for it a
 * run still retrying after 10 s, whose log names the endpoint and the TLS flags, passes too. */
static void assert_refused(const char *const *argv, const char *endpoint, const char *what)
{
    char out[16384];
    bool retries = strcmp(argv[0], EDL_JOBSERVER_BIN) == 0;
    int rc = run(argv, out, sizeof out, retries ? 10000 : 30000);
    if (retries && rc == -1 && strstr(out, endpoint) && strstr(out, "--cacert")) {
        print_message("%s %s: still retrying, naming %s and the TLS flags\n",
                      strrchr(argv[0], '/') + 1, what, endpoint);
        return;
    }
    if (rc != EDL_EXIT_UNREACHABLE || !strstr(out, endpoint))
        fail_msg("%s %s: exit %d, expected 3 and a message naming %s:\n%s", argv[0], what, rc,
                 endpoint, out);
    char *line = strstr(out, endpoint);
    while (line > out && line[-1] != '\n')
        line--;
    print_message("%s %s: exit 3: %.*s\n", strrchr(argv[0], '/') + 1, what,
                  (int)strcspn(line, "\n"), line);
}

/* libedlcoll in a trainer with no agent (a fixed generation, as bench/allreduce runs it) as
 * rank 0 of 2: it publishes its rendezvous entry first, so etcd's refusal ends edl_coll_open
 * at once. coll_worker's exit status and output. */
static int coll_alone(char *out, size_t outlen)
{
    static const char *const vars[][2] = {
        {"EDL_JOB_ID", "cj"}, {"EDL_RANK", "0"}, {"EDL_WORLD_SIZE", "2"},
        {"EDL_GENERATION", "1"}, {"PADDLE_CURRENT_ENDPOINT", "127.0.0.1:0"}};
    for (size_t i = 0; i < 5; i++)
        setenv(vars[i][0], vars[i][1], 1);
    const char *argv[] = {EDL_COLL_WORKER, "verify", NULL};
    int rc = run(argv, out, outlen, 60000);
    for (size_t i = 0; i < 5; i++)
        unsetenv(vars[i][0]);
    return rc;
}

static void assert_all_refused(const char *endpoint, const char *what)
{
    const char *agent[] = {EDL_AGENT_BIN, "--job", "rj", "--startup-timeout", "3", "--",
                           "/bin/true", NULL};
    const char *js[] = {EDL_JOBSERVER_BIN, "--job", "rj", NULL};
    const char *status[] = {EDL_CLI_BIN, "status", "rj", NULL};
    const char *scale[] = {EDL_CLI_BIN, "scale", "rj", "2", NULL};
    const char *stop[] = {EDL_CLI_BIN, "stop", "rj", NULL};
    assert_refused(agent, endpoint, what);
    assert_refused(js, endpoint, what);
    assert_refused(status, endpoint, what);
    assert_refused(scale, endpoint, what);
    assert_refused(stop, endpoint, what);
    char out[16384];
    int rc = coll_alone(out, sizeof out); /* libedlcoll: edl_coll_open fails, naming etcd */
    if (rc != 4 || !strstr(out, endpoint) || !strstr(out, "init failed"))
        fail_msg("libedlcoll %s: exit %d, expected 4 naming %s:\n%s", what, rc, endpoint, out);
    print_message("libedlcoll %s: %s", what, strstr(out, "init failed"));
}

static void test_missing_or_foreign_client_certificate_is_exit_3(void **state)
{
    (void)state;
    tls_env(NULL);
    assert_all_refused(tls_ep(), "without a client certificate");
    tls_env("other");
    assert_all_refused(tls_ep(), "with a certificate of another CA");
    clear_env();
}

static void test_wrong_password_is_exit_3(void **state)
{
    (void)state;
    setenv("EDL_ETCD_ENDPOINTS", auth_ep(), 1);
    setenv("EDL_ETCD_USER", "trainer", 1);
    setenv("EDL_ETCD_PASSWORD_FILE", path("wrong.pw"), 1);
    assert_all_refused(auth_ep(), "with a wrong password");
    char msg[16384];
    assert_int_equal(coll_alone(msg, sizeof msg), 4); /* a refusal no retry can change */
    assert_non_null(strstr(msg, edl_strerror(EDL_EAUTH)));
    /* the right password (a flag overrides the environment) works */
    char out[8192];
    const char *st[] = {EDL_CLI_BIN, "status", "rj", "--password-file", path("right.pw"), NULL};
    assert_int_equal(run(st, out, sizeof out, 20000), EDL_EXIT_FAILED); /* no such job */
    assert_non_null(strstr(out, "no job"));
    clear_env();
}

/* A state file's line of a setting ("" when absent). */
static void state_setting(const char *job, const char *name, char *out, size_t len)
{
    char file[400], line[1024];
    snprintf(file, sizeof file, "%s/%s.endpoints", path("state"), job);
    out[0] = '\0';
    FILE *f = fopen(file, "r");
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, name, strlen(name)) == 0 && line[strlen(name)] == '=')
            snprintf(out, len, "%.*s", (int)strcspn(line + strlen(name) + 1, "\n"),
                     line + strlen(name) + 1);
    if (f)
        fclose(f);
}

/* Wait until `edl run` of job has written its state file with endpoints. */
static void wait_state(const char *job, char *eps, size_t len)
{
    if (HARNESS_WAIT_UNTIL((state_setting(job, "EDL_ETCD_ENDPOINTS", eps, len), eps[0]), 30000))
        return;
    fail_msg("edl run wrote no state file for %s", job);
}

/* While the job runs: its etcd speaks https only to clients with its certificate. */
static void check_own_etcd(const char *eps, const char *ca, const char *cert, const char *key)
{
    struct stat st;
    char dir[400];
    snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(ca, '/') - ca), ca);
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(stat(key, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(strncmp(eps, "https://", 8), 0);
    edl_etcd_config cfg;
    edl_etcd_config_init(&cfg);
    cfg.timeout_ms = 1500;
    assert_int_equal(edl_etcd_config_set_endpoints(&cfg, eps), 0);
    cfg.ca_file = strdup(ca);
    edl_etcd *c;
    edl_kv *kv;
    assert_int_equal(edl_etcd_open(&cfg, &c), 0);
    int rc = edl_etcd_get(c, edl_str("/edl/v1/x"), &kv, NULL); /* refused: no certificate */
    edl_etcd_close(c);
    if (rc != EDL_EAUTH && rc != EDL_EUNAVAIL) /* a TLS alert, or a reset before it is read */
        fail_msg("a client without a certificate got %s", edl_err_name(rc));
    char http[300];
    snprintf(http, sizeof http, "http://%s", eps + 8);
    assert_int_equal(edl_etcd_config_set_endpoints(&cfg, http), 0);
    cfg.cert_file = strdup(cert);
    cfg.key_file = strdup(key);
    assert_int_equal(edl_etcd_open(&cfg, &c), 0);
    assert_int_not_equal(edl_etcd_get(c, edl_str("/edl/v1/x"), &kv, NULL), 0);
    edl_etcd_close(c);
    edl_etcd_config_clear(&cfg);
}

/* `edl run` by default: https with client certificates in a private directory, given to the
 * trainers (libedlcoll's in-process trainer here), found by `edl status` through the state
 * file, all deleted at the end. */
static void test_edl_run_own_etcd_requires_client_certificates(void **state)
{
    (void)state;
    char out[400], log[300];
    snprintf(out, sizeof out, "%s/mlp", g_dir);
    mkdir(out, 0755);
    const char *argv[] = {EDL_CLI_BIN, "run", "--job", "sec", "--np", "2", "--settle-ms", "300",
                          "--elastic-mode", "inprocess", "--", EDL_EXAMPLE_MLP, "--steps",
                          "400", "--step-ms", "10", "--out", out, NULL};
    snprintf(log, sizeof log, "%s/sec.log", g_dir);
    pid_t pid = harness_spawn(argv, log);
    char eps[300], ca[400], cert[400], key[400], buf[8192];
    wait_state("sec", eps, sizeof eps);
    state_setting("sec", "EDL_ETCD_CACERT", ca, sizeof ca);
    state_setting("sec", "EDL_ETCD_CERT", cert, sizeof cert);
    state_setting("sec", "EDL_ETCD_KEY", key, sizeof key);
    check_own_etcd(eps, ca, cert, key);
    const char *st[] = {EDL_CLI_BIN, "status", "sec", NULL}; /* no flags: the state file */
    assert_int_equal(run(st, buf, sizeof buf, 20000), 0);
    assert_non_null(strstr(buf, "job sec:"));
    assert_int_equal(harness_wait_exit(pid, 120000), 0);
    char result[500];
    snprintf(result, sizeof result, "%s/result.txt", out);
    assert_int_equal(access(result, R_OK), 0); /* the trainers trained over TLS */
    assert_int_not_equal(access(ca, F_OK), 0); /* certificates deleted */
    char dir[400];
    snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(ca, '/') - ca), ca);
    assert_int_not_equal(access(dir, F_OK), 0);
}

/* The checkpoint code of a trainer connects as its agent does; --insecure is plain http. */
static void test_edl_run_checkpoints_over_tls_and_insecure_http(void **state)
{
    (void)state;
    char uri[400], out[16384];
    snprintf(uri, sizeof uri, "file://%s/ck", g_dir);
    const char *tls[] = {EDL_CLI_BIN, "run", "--job", "ck", "--np", "1", "--checkpoint-uri",
                         uri, "--", EDL_EXAMPLE_TRAINER, "--steps", "40", "--step-ms", "10",
                         NULL};
    assert_int_equal(run(tls, out, sizeof out, 120000), 0);
    assert_non_null(strstr(out, "client certificates required"));
    char ptr[400];
    snprintf(ptr, sizeof ptr, "%s/ck/shared/result.txt", g_dir);
    assert_int_equal(access(ptr, R_OK), 0);
    const char *plain[] = {EDL_CLI_BIN, "run", "--job", "plain", "--np", "1", "--insecure",
                           "--", "/bin/sh", "-c", "echo endpoints=$EDL_ETCD_ENDPOINTS "
                           "cert=${EDL_ETCD_CERT:-none}", NULL};
    assert_int_equal(run(plain, out, sizeof out, 60000), 0);
    assert_non_null(strstr(out, "endpoints=http://127.0.0.1:"));
    assert_non_null(strstr(out, "cert=none"));
}

int main(void)
{
    /* the trainers (coll_worker) form groups of two: they need the job's secret */
    setenv("EDL_JOB_SECRET", "a test secret of test_etcd_tls_programs, 32+ bytes", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_programs_work_over_client_certificates, clean_env),
        cmocka_unit_test_setup(test_missing_or_foreign_client_certificate_is_exit_3, clean_env),
        cmocka_unit_test_setup(test_wrong_password_is_exit_3, clean_env),
        cmocka_unit_test_setup(test_edl_run_own_etcd_requires_client_certificates, clean_env),
        cmocka_unit_test_setup(test_edl_run_checkpoints_over_tls_and_insecure_http, clean_env),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

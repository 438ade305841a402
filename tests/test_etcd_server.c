/* test_etcd_server.c: the etcd launcher starts, stops, restarts and cleans up real etcd. */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "harness.h"

/* ---- helpers --------------------------------------------------------------------------- */

typedef struct body {
    char data[512];
    size_t len;
} body;

static size_t body_write(char *p, size_t size, size_t n, void *ud)
{
    body *b = ud;
    size_t take = size * n < sizeof b->data - 1 - b->len ? size * n : sizeof b->data - 1 - b->len;
    memcpy(b->data + b->len, p, take);
    b->len += take;
    b->data[b->len] = '\0';
    return size * n;
}

/* GET <endpoint>/health; true when etcd says it is healthy within timeout_ms. */
static bool healthy(const char *endpoint, long timeout_ms)
{
    char url[128];
    body b = {.len = 0};
    long code = 0;
    CURL *c = curl_easy_init();
    assert_non_null(c);
    snprintf(url, sizeof url, "%s/health", endpoint);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, body_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(c);
    return rc == CURLE_OK && code == 200 && strstr(b.data, "\"health\":\"true\"");
}

static void assert_get(const char *endpoints, const char *key, const char *want)
{
    char out[256], expect[256];
    assert_int_equal(harness_etcdctl_out(out, sizeof out, endpoints, NULL,
                                         "get --print-value-only %s", key), 0);
    snprintf(expect, sizeof expect, "%s\n", want);
    assert_string_equal(out, expect);
}

/* Run start with stderr sent to a file, to check the message a person would read. */
static int start_capturing_stderr(const edl_etcd_server_opts *o, edl_etcd_server **s,
                                  char *msg, size_t msglen)
{
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(tmp), STDERR_FILENO) >= 0);
    int rc = edl_etcd_server_open(o, s);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    rewind(tmp);
    size_t n = fread(msg, 1, msglen - 1, tmp);
    msg[n] = '\0';
    fclose(tmp);
    fprintf(stderr, "%s", msg); /* still show it in the test's output */
    return rc;
}

/* ---- tests ----------------------------------------------------------------------------- */

static void test_single_member_is_healthy_and_serves_put_get(void **state)
{
    edl_etcd_server *s = *state = harness_etcd_open(1, NULL);
    const char *ep = edl_etcd_server_endpoint(s, 0);
    assert_int_equal(edl_etcd_server_members(s), 1);
    assert_string_equal(edl_etcd_server_endpoints(s), ep);
    assert_true(strncmp(ep, "http://127.0.0.1:", 17) == 0);
    assert_int_equal(atoi(ep + 17), edl_etcd_server_client_port(s, 0));
    assert_true(edl_etcd_server_pid(s, 0) > 0);
    assert_null(edl_etcd_server_endpoint(s, 1));
    assert_true(healthy(ep, 2000));
    assert_int_equal(harness_etcdctl(ep, NULL, "put greeting 'hello world'"), 0);
    assert_get(ep, "greeting", "hello world");
}

static void test_etcdctl_passes_user_and_shell_words(void **state)
{
    edl_etcd_server *s = *state = harness_etcd_open(1, NULL);
    const char *ep = edl_etcd_server_endpoint(s, 0);
    char out[256];
    assert_int_equal(harness_etcdctl(ep, NULL, "user add root:secret"), 0);
    assert_int_equal(harness_etcdctl(ep, NULL, "auth enable"), 0);
    assert_int_not_equal(harness_etcdctl(ep, NULL, "put k anonymous"), 0);
    assert_int_equal(harness_etcdctl(ep, "root:secret", "put k \"%s\"", "it's"), 0);
    assert_int_equal(harness_etcdctl_out(out, sizeof out, ep, "root:secret",
                                         "get --print-value-only k"), 0);
    assert_string_equal(out, "it's\n");
    /* Output longer than the buffer is cut, NUL-terminated, and etcdctl still ends well. */
    assert_int_equal(harness_etcdctl_out(out, 3, ep, "root:secret", "get k"), 0);
    assert_string_equal(out, "k\n");
}

static void test_restart_keeps_data_and_ports(void **state)
{
    edl_etcd_server *s = *state = harness_etcd_open(1, NULL);
    char ep[64];
    snprintf(ep, sizeof ep, "%s", edl_etcd_server_endpoint(s, 0));
    pid_t before = edl_etcd_server_pid(s, 0);
    assert_int_equal(harness_etcdctl(ep, NULL, "put kept v1"), 0);
    assert_int_equal(edl_etcd_server_stop_member(s, 0, false), 0);
    assert_int_equal(edl_etcd_server_pid(s, 0), 0);
    assert_false(healthy(ep, 300));
    assert_int_equal(edl_etcd_server_restart_member(s, 0), 0);
    assert_true(edl_etcd_server_pid(s, 0) > 0);
    assert_int_not_equal(edl_etcd_server_pid(s, 0), before);
    assert_string_equal(edl_etcd_server_endpoint(s, 0), ep);
    assert_get(ep, "kept", "v1");
    /* Restarting a running member is a caller error, not a second etcd. */
    assert_int_equal(edl_etcd_server_restart_member(s, 0), EDL_EINVAL);
}

static void test_kill_now_stops_at_once_and_restarts(void **state)
{
    edl_etcd_server *s = *state = harness_etcd_open(1, NULL);
    const char *ep = edl_etcd_server_endpoint(s, 0);
    assert_int_equal(harness_etcdctl(ep, NULL, "put survivor yes"), 0);
    int64_t t0 = harness_now_ms();
    assert_int_equal(edl_etcd_server_stop_member(s, 0, true), 0);
    assert_true(harness_now_ms() - t0 < 1000);
    assert_int_equal(edl_etcd_server_pid(s, 0), 0);
    assert_false(healthy(ep, 300));
    assert_int_equal(edl_etcd_server_stop_member(s, 0, true), 0); /* stopping twice is fine */
    assert_int_equal(edl_etcd_server_restart_member(s, 0), 0);
    assert_get(ep, "survivor", "yes");
}

static void test_pause_freezes_member_until_resumed(void **state)
{
    edl_etcd_server *s = *state = harness_etcd_open(1, NULL);
    const char *ep = edl_etcd_server_endpoint(s, 0);
    assert_int_equal(edl_etcd_server_pause_member(s, 0, true), 0);
    assert_false(healthy(ep, 300));
    assert_int_equal(edl_etcd_server_pause_member(s, 0, false), 0);
    assert_true(healthy(ep, 2000));
    /* Freeing a paused member must not wait for the SIGKILL grace period. */
    assert_int_equal(edl_etcd_server_pause_member(s, 0, true), 0);
    int64_t t0 = harness_now_ms();
    edl_etcd_server_close(s);
    *state = NULL;
    assert_true(harness_now_ms() - t0 < 4000);
}

static void test_cluster_survives_losing_one_member(void **state)
{
    edl_etcd_server *s = *state = harness_etcd_open(3, NULL);
    char rest[160];
    assert_int_equal(edl_etcd_server_members(s), 3);
    for (int i = 0; i < 3; i++)
        assert_true(healthy(edl_etcd_server_endpoint(s, i), 2000));
    assert_int_equal(harness_etcdctl(edl_etcd_server_endpoints(s), NULL, "put before kill"), 0);
    assert_int_equal(edl_etcd_server_stop_member(s, 0, true), 0);
    snprintf(rest, sizeof rest, "%s,%s", edl_etcd_server_endpoint(s, 1),
             edl_etcd_server_endpoint(s, 2));
    /* If m0 led, the others need an election first, and a put proposed meanwhile may end with
     * "request timed out, possibly due to previous leader failure": retry as a client would. */
    int rc = -1;
    for (int64_t end = harness_now_ms() + 20000; rc != 0 && harness_now_ms() < end;)
        rc = harness_etcdctl(rest, NULL, "put after kill");
    assert_int_equal(rc, 0);
    assert_get(edl_etcd_server_endpoint(s, 2), "before", "kill");
    assert_get(edl_etcd_server_endpoint(s, 1), "after", "kill");
    assert_int_equal(edl_etcd_server_restart_member(s, 0), 0);
    assert_get(edl_etcd_server_endpoint(s, 0), "after", "kill");
}

static void test_missing_binary_fails_fast_and_names_it(void **state)
{
    (void)state;
    edl_etcd_server_opts o = {.etcd_bin = "/nonexistent/bin/etcd", .quiet = true};
    edl_etcd_server *s = NULL;
    char msg[2048];
    int64_t t0 = harness_now_ms();
    assert_int_equal(start_capturing_stderr(&o, &s, msg, sizeof msg), EDL_EIO);
    assert_true(harness_now_ms() - t0 < 2000);
    assert_null(s);
    assert_non_null(strstr(msg, "/nonexistent/bin/etcd"));
    assert_non_null(strstr(msg, "No such file or directory"));
}

static void test_bad_flag_reports_exit_status_and_log(void **state)
{
    (void)state;
    const char *extra[] = {"--no-such-flag-for-edl", NULL};
    edl_etcd_server_opts o = {.etcd_bin = EDL_ETCD_BIN, .extra_args = extra, .quiet = true};
    edl_etcd_server *s = NULL;
    char msg[4096];
    int64_t t0 = harness_now_ms();
    assert_int_equal(start_capturing_stderr(&o, &s, msg, sizeof msg), EDL_EIO);
    assert_true(harness_now_ms() - t0 < 5000);
    assert_null(s);
    assert_non_null(strstr(msg, "exited with status"));
    assert_non_null(strstr(msg, "no-such-flag-for-edl")); /* from etcd's log tail */
    assert_null(strstr(msg, "retrying")); /* a bad flag is not a port clash */
}

/* A listening socket that holds a loopback port for the length of a test. */
static int hold_port(int *port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 1), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &alen), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

static void test_taken_port_is_retried_with_new_ports(void **state)
{
    (void)state;
    int port, fd = hold_port(&port);
    char flag[64], msg[8192];
    /* A later flag wins in etcd, so every attempt collides on the held port: this drives the
     * detect-and-retry path three times, then gives up. */
    snprintf(flag, sizeof flag, "--listen-peer-urls=http://127.0.0.1:%d", port);
    const char *extra[] = {flag, NULL};
    edl_etcd_server_opts o = {.etcd_bin = EDL_ETCD_BIN, .extra_args = extra, .quiet = true};
    edl_etcd_server *s = NULL;
    assert_int_equal(start_capturing_stderr(&o, &s, msg, sizeof msg), EDL_EIO);
    assert_null(s);
    assert_non_null(strstr(msg, "retrying with new ports (attempt 2 of 3)"));
    assert_non_null(strstr(msg, "retrying with new ports (attempt 3 of 3)"));
    assert_non_null(strstr(msg, "address already in use"));
    close(fd);
}

static void test_invalid_member_counts_are_rejected(void **state)
{
    (void)state;
    edl_etcd_server_opts o = {.members = EDL_ETCD_SERVER_MAX_MEMBERS + 1};
    edl_etcd_server *s = NULL;
    char msg[512];
    assert_int_equal(start_capturing_stderr(&o, &s, msg, sizeof msg), EDL_EINVAL);
    assert_null(s);
    assert_int_equal(edl_etcd_server_open(NULL, NULL), EDL_EINVAL);
    assert_int_equal(edl_etcd_server_stop_member(NULL, 0, false), EDL_EINVAL);
}

static void test_free_removes_data_dir(void **state)
{
    struct stat st;
    edl_etcd_server *s = *state = harness_etcd_open(1, NULL);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", edl_etcd_server_data_dir(s));
    const char *log = edl_etcd_server_log_path(s, 0);
    assert_non_null(log);
    assert_true(strncmp(log, dir, strlen(dir)) == 0);
    assert_non_null(strstr(dir, "/edl-etcd-"));
    assert_int_equal(stat(dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(stat(log, &st), 0);
    edl_etcd_server_close(s);
    *state = NULL;
    assert_int_equal(stat(dir, &st), -1);
    assert_int_equal(errno, ENOENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_single_member_is_healthy_and_serves_put_get, harness_teardown_etcd),
        cmocka_unit_test_teardown(test_etcdctl_passes_user_and_shell_words,
                                  harness_teardown_etcd),
        cmocka_unit_test_teardown(test_restart_keeps_data_and_ports, harness_teardown_etcd),
        cmocka_unit_test_teardown(test_kill_now_stops_at_once_and_restarts, harness_teardown_etcd),
        cmocka_unit_test_teardown(test_pause_freezes_member_until_resumed, harness_teardown_etcd),
        cmocka_unit_test_teardown(test_cluster_survives_losing_one_member, harness_teardown_etcd),
        cmocka_unit_test_teardown(test_missing_binary_fails_fast_and_names_it, harness_teardown_etcd),
        cmocka_unit_test_teardown(test_bad_flag_reports_exit_status_and_log, harness_teardown_etcd),
        cmocka_unit_test_teardown(test_taken_port_is_retried_with_new_ports, harness_teardown_etcd),
        cmocka_unit_test_teardown(test_invalid_member_counts_are_rejected, harness_teardown_etcd),
        cmocka_unit_test_teardown(test_free_removes_data_dir, harness_teardown_etcd),
    };
    curl_global_init(CURL_GLOBAL_DEFAULT);
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return failed;
}

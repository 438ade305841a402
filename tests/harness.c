/* harness.c: small helpers shared by the tests: monotonic time, starting a real etcd, and
 * running etcdctl against it. The proxy and the fake HTTP server live in harness_proxy.c and
 * harness_http.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "edl/etcd.h"

extern char **environ;

#define ETCD_START_TIMEOUT_MS 20000 /* two shared cores: leave room for a slow election */

int64_t harness_now_ms(void)
{
    return edl_monotonic_ms();
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

void harness_rmtree(const char *dir)
{
    if (dir && *dir)
        nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void harness_scratch_open(char *dir, size_t len, const char *template, bool own_state)
{
    snprintf(dir, len, "%s", template);
    assert_non_null(mkdtemp(dir));
    if (own_state) {
        char st[PATH_MAX];
        snprintf(st, sizeof st, "%s/state", dir);
        setenv("EDL_STATE_DIR", st, 1);
    }
}

void harness_scratch_close(const char *dir)
{
    if (getenv("EDL_TEST_KEEP")) /* keep the logs to look at */
        fprintf(stderr, "kept %s\n", dir);
    else
        harness_rmtree(dir);
}

int harness_edl(const char *dir, int timeout_ms, char *out, size_t outlen,
                const char *const *args)
{
    const char *argv[32] = {EDL_CLI_BIN};
    size_t n = 1;
    for (; args[n - 1] && n < 31; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    char log[PATH_MAX];
    snprintf(log, sizeof log, "%s/cmd.out", dir);
    return harness_run(argv, log, timeout_ms, out, outlen);
}

void harness_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

bool harness_wait_until(bool (*cond)(void *arg), void *arg, int timeout_ms)
{
    return HARNESS_WAIT_UNTIL(cond(arg), timeout_ms);
}

edl_etcd_server *harness_etcd_open(int members, const char *const *extra_args)
{
    edl_etcd_server_opts o = {
        .etcd_bin = EDL_ETCD_BIN,
        .members = members,
        .extra_args = extra_args,
        .start_timeout_ms = ETCD_START_TIMEOUT_MS,
        .quiet = true,
    };
    edl_etcd_server *s = NULL;
    int rc = edl_etcd_server_open(&o, &s);
    if (rc != 0)
        fail_msg("could not start %d etcd member(s) from %s: %s (the reason is on stderr)",
                 members, EDL_ETCD_BIN, edl_strerror(rc));
    return s;
}

int harness_teardown_etcd(void **state)
{
    edl_etcd_server_close(*state);
    *state = NULL;
    return 0;
}

/* ---- etcdctl --------------------------------------------------------------------------- */

/* `s` as one single-quoted shell word (a ' inside becomes '\''). */
static char *sh_quote(const char *s)
{
    char *q = malloc(4 * strlen(s) + 3), *w = q;
    assert_non_null(q);
    *w++ = '\'';
    for (; *s; s++) {
        if (*s == '\'') {
            memcpy(w, "'\\''", 4);
            w += 4;
        } else {
            *w++ = *s;
        }
    }
    *w++ = '\'';
    *w = '\0';
    return q;
}

static char *etcdctl_command(const char *endpoints, const char *user_pass, const char *args)
{
    char *ep = NULL, *user = NULL, *cmd = NULL;
    assert_true(asprintf(&ep, "--endpoints=%s", endpoints) >= 0);
    assert_true(asprintf(&user, "--user=%s", user_pass ? user_pass : "") >= 0);
    char *qbin = sh_quote(EDL_ETCDCTL_BIN), *qep = sh_quote(ep), *quser = sh_quote(user);
    assert_true(asprintf(&cmd, "ETCDCTL_API=3 exec %s %s %s %s", qbin, qep,
                         user_pass ? quser : "", args) >= 0);
    free(qbin), free(qep), free(quser), free(ep), free(user);
    return cmd;
}

/* Run `sh -c cmd`; with out != NULL capture its stdout there. Returns the exit status. */
int harness_shell(const char *cmd, char *out, size_t outlen)
{
    int pfd[2] = {-1, -1}, status = 0;
    size_t used = 0;
    pid_t pid;
    posix_spawn_file_actions_t fa;
    char *argv[] = {"sh", "-c", (char *)cmd, NULL};
    posix_spawn_file_actions_init(&fa);
    if (out) {
        if (pipe2(pfd, O_CLOEXEC) != 0)
            return -1;
        posix_spawn_file_actions_adddup2(&fa, pfd[1], STDOUT_FILENO);
    }
    int err = posix_spawn(&pid, "/bin/sh", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (out)
        close(pfd[1]);
    if (err != 0) {
        fprintf(stderr, "harness: cannot run /bin/sh: %s\n", strerror(err));
        if (out)
            close(pfd[0]);
        return -1;
    }
    if (out) {
        char chunk[4096];
        ssize_t n;
        while ((n = read(pfd[0], chunk, sizeof chunk)) != 0) {
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                break;
            size_t take = (size_t)n < outlen - 1 - used ? (size_t)n : outlen - 1 - used;
            memcpy(out + used, chunk, take); /* the rest is drained so etcdctl never blocks */
            used += take;
        }
        out[used] = '\0';
        close(pfd[0]);
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

static int etcdctl_v(char *out, size_t outlen, const char *endpoints, const char *user_pass,
                     const char *fmt, va_list ap)
{
    char *args = NULL;
    if (vasprintf(&args, fmt, ap) < 0)
        return -1;
    char *cmd = etcdctl_command(endpoints, user_pass, args);
    int rc = harness_shell(cmd, out, outlen);
    free(cmd);
    free(args);
    return rc;
}

edl_etcd_server *harness_etcd_open_auth(const char *const *extra_args)
{
    edl_etcd_server *srv = harness_etcd_open(1, extra_args);
    const char *eps = edl_etcd_server_endpoints(srv);
    if (harness_etcdctl(eps, NULL, "user add root:rootpw") != 0 ||
        harness_etcdctl(eps, NULL, "user grant-role root root") != 0 ||
        harness_etcdctl(eps, NULL, "user add trainer:s3cret") != 0 ||
        harness_etcdctl(eps, NULL, "role add edl") != 0 ||
        harness_etcdctl(eps, NULL, "role grant-permission edl --prefix=true readwrite /edl/") != 0 ||
        harness_etcdctl(eps, NULL, "user grant-role trainer edl") != 0 ||
        harness_etcdctl(eps, NULL, "auth enable") != 0 ||
        harness_etcdctl(eps, NULL, "get /edl/probe") == 0) /* refused without a user now */
        fail_msg("could not turn on auth with etcdctl");
    return srv;
}

int harness_etcdctl(const char *endpoints, const char *user_pass, const char *args_fmt, ...)
{
    va_list ap;
    va_start(ap, args_fmt);
    int rc = etcdctl_v(NULL, 0, endpoints, user_pass, args_fmt, ap);
    va_end(ap);
    return rc;
}

int harness_etcdctl_out(char *out, size_t outlen, const char *endpoints, const char *user_pass,
                        const char *args_fmt, ...)
{
    va_list ap;
    if (!out || outlen == 0)
        return -1;
    out[0] = '\0';
    va_start(ap, args_fmt);
    int rc = etcdctl_v(out, outlen, endpoints, user_pass, args_fmt, ap);
    va_end(ap);
    return rc;
}

void harness_stored_equal(const edl_storage_config *sc, const char *uri, const char *key,
                          const void *want, size_t len)
{
    edl_storage_config c;
    if (sc)
        c = *sc;
    else
        edl_storage_config_init(&c);
    c.uri = uri;
    edl_storage *s;
    assert_int_equal(edl_storage_open(&c, &s, NULL, 0), 0);
    void *got;
    size_t n;
    assert_int_equal(edl_storage_get(s, key, len + 1, &got, &n), 0);
    assert_int_equal(n, len);
    assert_memory_equal(got, want, len);
    free(got);
    edl_storage_close(s);
}

/* The value of one /metrics line: what follows its last space before the line's end. */
static double metric_value(const char *line)
{
    const char *end = strchr(line, '\n'), *sp = NULL;
    for (const char *p = line; *p && p != end; p++)
        if (*p == ' ')
            sp = p;
    return sp ? strtod(sp + 1, NULL) : 0;
}

double harness_etcd_metric(const edl_etcd_server *s, const char *sample)
{
    size_t cap = 1 << 20, len = strlen(sample);
    bool labelled = strchr(sample, '{') != NULL;
    char *body = malloc(cap);
    if (!body)
        return -1;
    double sum = 0;
    for (int i = 0; i < edl_etcd_server_members(s) && sum >= 0; i++) {
        if (edl_etcd_server_pid(s, i) == 0)
            continue; /* stopped: its counters went with it */
        /* HTTP/1.0: etcd closes the connection after the reply and sends it unchunked */
        static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
        body[0] = '\0'; /* left as it is when the connection fails */
        harness_http_request(edl_etcd_server_client_port(s, i), req, sizeof req - 1, body, cap);
        if (strncmp(body, "HTTP/1.0 200 ", 13) != 0) {
            sum = -1;
            break;
        }
        for (const char *l = strchr(body, '\n'); l; l = strchr(l + 1, '\n')) {
            const char *at = l + 1;
            if (strncmp(at, sample, len) == 0 && (labelled || at[len] == ' ' || at[len] == '{'))
                sum += metric_value(at);
        }
    }
    free(body);
    return sum;
}

bool harness_etcd_outlive_lease(struct edl_etcd *c, int64_t ttl_s, int timeout_ms)
{
    int64_t id, ttl;
    if (edl_etcd_lease_grant(c, ttl_s, 0, &id, NULL) != 0)
        fail_msg("granting a %llds witness lease: %s", (long long)ttl_s, edl_etcd_errmsg(c));
    return HARNESS_WAIT_UNTIL(edl_etcd_lease_ttl(c, id, &ttl, NULL) == EDL_ENOTFOUND, timeout_ms);
}

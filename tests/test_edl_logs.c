/* test_edl_logs.c: what `edl run` does with its children beyond starting them: a dead agent's
 * lease revoked even when a scale-down had picked it to stop (its loss found at once, not when
 * the lease expires), and its children's output by rank: the interleaved output prefixed with
 * each pod's rank of the moment, a file per pod and rank, and `edl logs` reading them (a rank,
 * a pod, --follow, and its errors). Real etcd, job server, agents and sh trainers. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "edl/job.h"
#include "edl/etcd.h"
#include "harness.h"

static edl_etcd_server *g_srv;
static edl_etcd *g_c;
static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    harness_open_etcd(1, NULL, &g_srv, &g_c);
    harness_scratch_open(g_dir, sizeof g_dir, "/tmp/edl-test-logs.XXXXXX", true);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    harness_close_etcd(&g_srv, &g_c);
    harness_scratch_close(g_dir);
    return 0;
}

/* Run `edl ARGS` to completion: its exit status, its output (stdout and stderr) in out. */
static int edl_cmd(char *out, size_t outlen, const char *const *args)
{
    return harness_edl(g_dir, 60000, out, outlen, args);
}

/* `edl run --job JOB OPTS --etcd ... -- sh -c SCRIPT` in the background, output in
 * <dir>/<job>.log. */
static pid_t edl_run(const char *job, const char *const *opts, const char *script)
{
    const char *argv[48] = {EDL_CLI_BIN, "run", "--job", job, "--etcd",
                            edl_etcd_server_endpoints(g_srv)};
    size_t n = 6;
    for (size_t i = 0; opts[i]; i++)
        argv[n++] = opts[i];
    argv[n++] = "--";
    argv[n++] = "/bin/sh";
    argv[n++] = "-c";
    argv[n++] = script;
    argv[n] = NULL;
    char log[300];
    snprintf(log, sizeof log, "%s/%s.log", g_dir, job);
    pid_t pid = harness_spawn(argv, log);
    assert_true(pid > 0);
    return pid;
}

static char *run_log(const char *job, char *buf, size_t len)
{
    char path[300];
    snprintf(path, sizeof path, "%s/%s.log", g_dir, job);
    return harness_read_file(path, buf, len);
}

/* Wait until the job's edl run output has a line that starts with `start` (NULL: any) and
 * holds `has`. */
static void wait_log_line(const char *job, const char *start, const char *has, int timeout_ms)
{
    static char buf[1 << 20];
    int64_t end = harness_now_ms() + timeout_ms;
    while (harness_now_ms() < end) {
        run_log(job, buf, sizeof buf);
        for (char *line = buf; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1
                                                                          : NULL) {
            size_t len = strcspn(line, "\n");
            char one[4096];
            snprintf(one, sizeof one, "%.*s", (int)len, line);
            if ((!start || strncmp(one, start, strlen(start)) == 0) && strstr(one, has))
                return;
        }
        harness_sleep_ms(50);
    }
    fail_msg("job %s: no line \"%s...%s\" within %d ms; its output:\n%s", job, start ? start : "",
             has, timeout_ms, buf);
}

static bool read_generation(const char *job, edl_generation *out)
{
    char buf[65536], err[256], k[256];
    edl_generation_clear(out);
    return harness_get(g_c, harness_job_key(k, sizeof k, job, EDL_KEY_GENERATION, NULL, 0), buf,
                       sizeof buf) &&
           edl_generation_parse(buf, strlen(buf), out, err, sizeof err) == 0;
}

static void wait_members(const char *job, size_t n, int timeout_ms, edl_generation *c)
{
    int64_t end = harness_now_ms() + timeout_ms;
    while (harness_now_ms() < end) {
        if (read_generation(job, c) && c->state == EDL_JOB_RUNNING && c->n_members == n)
            return;
        harness_sleep_ms(20);
    }
    fail_msg("job %s: no running generation of %zu members within %d ms", job, n, timeout_ms);
}

/* The pid of a pod's agent, from its registration. */
static pid_t agent_pid(const char *job, const char *pod)
{
    char buf[2048], err[256], k[256];
    edl_pod p = {0};
    assert_non_null(harness_get(g_c, harness_job_key(k, sizeof k, job, EDL_KEY_POD, pod, 0), buf,
                                sizeof buf));
    assert_int_equal(edl_pod_parse(buf, strlen(buf), &p, err, sizeof err), 0);
    pid_t pid = (pid_t)p.pid;
    edl_pod_clear(&p);
    assert_true(pid > 1);
    return pid;
}

/* A scale-down that picks an agent which is dead but not yet reaped by the launcher (the race
 * of a SIGKILL and an `edl scale` arriving together): the launcher marks it stopping, and its
 * lease must still be revoked when it is reaped, so the job server publishes the loss at once
 * rather than when the lease expires (10 s here). The race is made certain by freezing the
 * agent (SIGSTOP: to the launcher it lives, to the job it is silent) until the launcher has
 * chosen it, then killing it. */
static void test_scale_down_of_a_dead_agent_finds_its_loss_at_once(void **state)
{
    (void)state;
    const char *job = "race";
    const char *opts[] = {"--np", "1:3", "--ttl", "10", "--settle-ms", "300", "--grace-ms",
                          "1000", NULL};
    pid_t run = edl_run(job, opts, "exec sleep 120");
    edl_generation c = {0};
    wait_members(job, 3, 30000, &c);
    int64_t g = c.generation;
    const char *victim = "race-2"; /* the newest: a scale-down stops it first */
    assert_non_null(edl_generation_member_named(&c, victim));
    pid_t agent = agent_pid(job, victim);
    assert_int_equal(kill(agent, SIGSTOP), 0);
    const char *scale[] = {"scale", job, "2", "--etcd", edl_etcd_server_endpoints(g_srv), NULL};
    char out[4096];
    assert_int_equal(edl_cmd(out, sizeof out, scale), 0);
    wait_log_line(job, "edl | ", "scaling down: stopping race-2", 10000);
    int64_t t0 = harness_now_ms();
    assert_int_equal(kill(agent, SIGKILL), 0);
    while (harness_now_ms() < t0 + 13000 &&
           !(read_generation(job, &c) && c.generation > g &&
             !edl_generation_member_named(&c, victim)))
        harness_sleep_ms(10);
    int64_t took = harness_now_ms() - t0;
    print_message("a dead agent picked by a scale-down: a generation without it %lld ms after "
                  "its death (lease TTL 10 s)\n", (long long)took);
    assert_null(edl_generation_member_named(&c, victim));
    assert_true(took <= 3000);
    assert_int_equal(c.n_members, 2);
    kill(run, SIGTERM);
    assert_int_equal(harness_wait_exit(run, 30000), 143);
    edl_generation_clear(&c);
}

/* The contents of a job's log file (pod and label as edl run names them). */
static char *log_file(const char *job, const char *file, char *buf, size_t len)
{
    char path[600];
    snprintf(path, sizeof path, "%s/state/%s.logs/%s", g_dir, job, file);
    return harness_read_file(path, buf, len);
}

/* Every trainer line goes out behind its pod's rank of the moment ("[rank 0 logs-0] ..."), and
 * into a file of that pod and rank that `edl logs --rank N` prints. A rank that moves to
 * another pod (its holder killed) is followed there: the interleaved prefix changes, and
 * `edl logs --rank 0` prints the files of both pods. */
static void test_logs_by_rank_follow_the_rank_across_generations(void **state)
{
    (void)state;
    const char *job = "logs";
    const char *opts[] = {"--np", "1:2", "--ttl", "10", "--settle-ms", "300", "--grace-ms",
                          "1000", NULL};
    pid_t run = edl_run(job, opts, "echo \"err of rank $RANK\" >&2; "
                                   "while :; do echo \"tick of rank $RANK\"; sleep 0.1; done");
    edl_generation c = {0};
    wait_members(job, 2, 30000, &c);
    char pod0[64], pod1[64];
    snprintf(pod0, sizeof pod0, "%s", c.members[0].pod);
    snprintf(pod1, sizeof pod1, "%s", c.members[1].pod);
    char start0[96], start1[96];
    snprintf(start0, sizeof start0, "[rank 0 %s] ", pod0);
    snprintf(start1, sizeof start1, "[rank 1 %s] ", pod1);
    wait_log_line(job, start0, "tick of rank 0", 20000);
    wait_log_line(job, start1, "tick of rank 1", 20000);

    /* rank 0's pod dies: rank 1's pod takes rank 0 in the next generation */
    int64_t g = c.generation;
    assert_int_equal(kill(agent_pid(job, pod0), SIGKILL), 0);
    snprintf(start1, sizeof start1, "[rank 0 %s] ", pod1);
    wait_log_line(job, start1, "tick of rank 0", 30000);
    assert_true(read_generation(job, &c) && c.generation > g);

    /* the files: one per pod and rank */
    static char buf[1 << 18], out[1 << 18];
    char name[128];
    snprintf(name, sizeof name, "%s.rank0.log", pod0);
    assert_non_null(strstr(log_file(job, name, buf, sizeof buf), "tick of rank 0"));
    assert_non_null(strstr(buf, "err of rank 0"));
    assert_null(strstr(buf, "of rank 1"));
    snprintf(name, sizeof name, "%s.rank1.log", pod1);
    assert_non_null(strstr(log_file(job, name, buf, sizeof buf), "tick of rank 1"));
    snprintf(name, sizeof name, "%s.rank0.log", pod1);
    assert_non_null(strstr(log_file(job, name, buf, sizeof buf), "tick of rank 0"));

    /* edl logs --rank 0: both holders, each under its header, the first holder first */
    const char *rank0[] = {"logs", job, "--rank", "0", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, rank0), 0);
    char h0[128], h1[128];
    snprintf(h0, sizeof h0, "==> pod %s, rank 0 <==", pod0);
    snprintf(h1, sizeof h1, "==> pod %s, rank 0 <==", pod1);
    assert_non_null(strstr(out, h0));
    assert_non_null(strstr(out, h1));
    assert_true(strstr(out, h0) < strstr(out, h1));
    assert_non_null(strstr(out, "err of rank 0"));

    /* --pod: every rank of one pod */
    const char *by_pod[] = {"logs", job, "--pod", pod1, NULL};
    assert_int_equal(edl_cmd(out, sizeof out, by_pod), 0);
    assert_non_null(strstr(out, "tick of rank 1"));
    assert_non_null(strstr(out, "tick of rank 0"));
    assert_null(strstr(out, h0)); /* not the other pod's */
    kill(run, SIGTERM);
    assert_int_equal(harness_wait_exit(run, 30000), 143);
    edl_generation_clear(&c);
}

/* edl logs --follow prints what is added until the job's edl run exits, then ends by itself;
 * the logs stay readable after the run. */
static void test_logs_follow_ends_with_the_job(void **state)
{
    (void)state;
    const char *job = "follow";
    const char *opts[] = {"--np", "1:1", "--settle-ms", "100", NULL};
    pid_t run = edl_run(job, opts, "for i in 1 2 3 4 5 6 7 8 9 10; do echo \"line $i\"; "
                                   "sleep 0.2; done; echo \"done of rank $RANK\"");
    wait_log_line(job, "[rank 0 follow-0] ", "line 1", 30000);
    char flog[300];
    snprintf(flog, sizeof flog, "%s/follow.out", g_dir);
    const char *argv[] = {EDL_CLI_BIN, "logs", job, "--rank", "0", "--follow", NULL};
    pid_t f = harness_spawn(argv, flog);
    assert_true(f > 0);
    assert_int_equal(harness_wait_exit(run, 60000), 0);
    assert_int_equal(harness_wait_exit(f, 10000), 0); /* ends with the launcher */
    static char buf[1 << 16];
    harness_read_file(flog, buf, sizeof buf);
    assert_non_null(strstr(buf, "line 1\n"));
    assert_non_null(strstr(buf, "done of rank 0\n"));
    const char *after[] = {"logs", job, "--rank", "0", NULL};
    assert_int_equal(edl_cmd(buf, sizeof buf, after), 0);
    assert_non_null(strstr(buf, "done of rank 0\n"));
}

/* What a person mistypes: a job with no logs here, a rank or pod without logs, a bad rank,
 * no job; and --help. Each says what is wrong. */
static void test_logs_errors_name_what_is_missing(void **state)
{
    (void)state;
    char out[8192];
    const char *nojob[] = {"logs", "no-such-job", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, nojob), 1);
    assert_non_null(strstr(out, "no logs of job \"no-such-job\""));
    const char *norank[] = {"logs", "follow", "--rank", "7", NULL}; /* the job of the test above */
    assert_int_equal(edl_cmd(out, sizeof out, norank), 1);
    assert_non_null(strstr(out, "no logs of rank 7"));
    assert_non_null(strstr(out, "ranks with logs: 0"));
    const char *nopod[] = {"logs", "follow", "--pod", "follow-9", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, nopod), 1);
    assert_non_null(strstr(out, "no logs of pod follow-9"));
    const char *badrank[] = {"logs", "follow", "--rank", "x", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, badrank), 2);
    assert_non_null(strstr(out, "--rank x"));
    const char *none[] = {"logs", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, none), 2);
    const char *help[] = {"logs", "--help", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, help), 0);
    assert_non_null(strstr(out, "Usage: edl logs JOB"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scale_down_of_a_dead_agent_finds_its_loss_at_once),
        cmocka_unit_test(test_logs_by_rank_follow_the_rank_across_generations),
        cmocka_unit_test(test_logs_follow_ends_with_the_job),
        cmocka_unit_test(test_logs_errors_name_what_is_missing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* test_edl_failures.c: whole jobs through `edl run` whose trainers fail or lose something: a
 * failing trainer restarted, excluded and finally failing the job, a broken trainer failing
 * within seconds, one that cannot be started failing at once, a script's own bug (a path typo)
 * failing at once with its cause (its last stderr lines) in the last line, a killed agent
 * leaving its generation at once, a rank stuck in a collective seen as a hang, the trainer's
 * error file, restart count and MASTER_PORT, a lost peer spending no restart, and an etcd
 * outage ridden out without killing trainers. Set-up: edl_run_common.c. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "edl/discovery.h"
#include "edl/job.h"
#include "edl/etcd.h"
#include "edl_run_common.h"
#include "harness.h"

#include <cjson/cJSON.h>

static int count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    int n = 0, ch;
    while (f && (ch = fgetc(f)) != EOF)
        n += ch == '\n';
    if (f)
        fclose(f);
    return n;
}

/* What a failing trainer wrote to TORCHELASTIC_ERROR_FILE (torch's @record format) reaches the
 * job's reason, the job server's log and `edl status`; TORCHELASTIC_RESTART_COUNT counts the
 * job's failure restarts; every generation gets a MASTER_PORT of its own, the same on every
 * rank. */
static void test_trainer_error_file_restart_count_and_master_port(void **state)
{
    (void)state;
    const char *job = "errjob";
    const char *opts[] = {"--np", "2", "--etcd", ep(), "--settle-ms", "200", "--max-restarts",
                          "1", "--exclude-after", "5", "--grace-ms", "1000", NULL};
    char script[800];
    snprintf(script, sizeof script,
             "echo \"$EDL_GENERATION $MASTER_PORT $TORCHELASTIC_RESTART_COUNT\" >> %s/ports.$RANK; "
             "if [ \"$RANK\" = 1 ]; then printf '{\"message\":{\"message\":\"ValueError: "
             "bad batch (restart %%s)\",\"extraInfo\":{\"py_callstack\":\"Traceback\\\\n\"}}}' "
             "\"$TORCHELASTIC_RESTART_COUNT\" > \"$TORCHELASTIC_ERROR_FILE\"; exit 1; fi; sleep 1",
             g_dir);
    pid_t run = edl_run(job, opts, script);
    run_exits(job, run, 60000, 1); /* budget of 1 spent */
    edl_generation c = {0};
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_FAILED);
    assert_non_null(strstr(c.reason, "exited with code 1: ValueError: bad batch (restart 1)"));
    const char *st[] = {"status", job, "--etcd", ep(), NULL};
    char out[4096];
    edl_cmd(out, sizeof out, st);
    assert_non_null(strstr(out, "ValueError: bad batch (restart 1)"));
    assert_true(log_has(job, "jobserver", "restart 1 of 1 after",
                        "ValueError: bad batch (restart 0)"));
    long gen[2][2], port[2][2], count[2][2];
    for (int r = 0; r < 2; r++) {
        char path[300];
        snprintf(path, sizeof path, "%s/ports.%d", g_dir, r);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        for (int k = 0; k < 2; k++)
            assert_int_equal(fscanf(f, "%ld %ld %ld", &gen[r][k], &port[r][k], &count[r][k]), 3);
        fclose(f);
    }
    for (int k = 0; k < 2; k++) {
        assert_int_equal(gen[0][k], gen[1][k]);
        assert_int_equal(port[0][k], port[1][k]); /* one MASTER_PORT per generation */
        assert_int_equal(count[0][k], k);          /* failure restarts so far */
    }
    assert_true(gen[0][1] > gen[0][0]);
    assert_true(port[0][1] != port[0][0]); /* a fresh one each generation */
    edl_generation_clear(&c);
}

static void test_failing_trainer_restarted_excluded_then_job_fails(void **state)
{
    (void)state;
    const char *job = "flaky";
    /* the pod named flaky-1 is always killed (as the OOM killer does: from outside, so no
     * script's bug however often it happens); the others run */
    const char *opts[] = {"--np", "2:3", "--etcd", ep(), "--settle-ms", "300",
                          "--max-restarts", "2", "--exclude-after", "2", "--cooldown-ms", "1500",
                          "--grace-ms", "1000", NULL};
    pid_t run = edl_run(job, opts,
                        "if [ \"$EDL_POD_ID\" = flaky-1 ]; then sleep 0.3; kill -KILL $$; fi; "
                        "exec sleep 120");
    int rc = harness_wait_exit(run, 60000);
    assert_int_equal(rc, 1); /* the job failed */
    edl_generation c = {0};
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_FAILED);
    assert_non_null(strstr(c.reason, "restart budget of 2 spent"));
    assert_non_null(strstr(c.reason, "flaky-1"));
    assert_int_equal(c.restarts, 2);
    /* while excluded, the job ran on without it: a generation of 2 members was published */
    char log[300], line[1024];
    snprintf(log, sizeof log, "%s/%s.log", g_dir, job);
    FILE *f = fopen(log, "r");
    bool ran_without = false;
    while (f && fgets(line, sizeof line, f)) {
        char *m = strstr(line, "running: 2 members [");
        char *end = m ? strchr(m, ']') : NULL;
        if (end) {
            *end = '\0';
            ran_without = ran_without || !strstr(m, "flaky-1");
        }
    }
    if (f)
        fclose(f);
    assert_true(ran_without);
    edl_generation_clear(&c);
}

/* A trainer killed from outside at once on every pod (SIGKILL, as the OOM killer sends it) is
 * no pod's fault: the job spends its restart budget (10 by default) without exclusion
 * cool-downs (10 s, doubling, by default) and fails within seconds, as torchrun would. */
static void test_broken_trainer_spends_its_budget_in_seconds(void **state)
{
    (void)state;
    const char *job = "broken";
    const char *opts[] = {"--np", "1", "--etcd", ep(), "--grace-ms", "1000", NULL};
    int64_t t0 = harness_now_ms();
    pid_t run = edl_run(job, opts, "kill -KILL $$");
    int rc = harness_wait_exit(run, 20000);
    if (rc == -1)
        harness_kill(run, SIGKILL);
    int64_t took = harness_now_ms() - t0;
    assert_int_equal(rc, 1); /* the job failed */
    edl_generation c = {0};
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_FAILED);
    assert_int_equal(c.restarts, 10);
    assert_int_equal(c.n_failures, 0); /* nobody was excluded */
    assert_non_null(strstr(c.reason, "restart budget of 10 spent"));
    assert_non_null(strstr(c.reason, "killed by signal 9"));
    print_message("sh -c 'kill -KILL $$' under edl run --np 1: failed after 10 restarts in "
                  "%lld ms\n", (long long)took);
    assert_true(took < 10000); /* the first exclusion alone would wait 10 s */
    edl_generation_clear(&c);
}

/* A trainer that cannot be started (no such file, not in PATH) fails the job at once, with
 * the agent's message in the job's reason and in edl run's output; no restart is spent. */
static void cannot_start_case(const char *job, const char *trainer, const char *says)
{
    const char *opts[] = {"--np", "2", "--etcd", ep(), "--grace-ms", "1000", NULL};
    const char *argv[] = {trainer, "--epochs", "3", NULL};
    int64_t t0 = harness_now_ms();
    pid_t run = edl_run_argv(job, opts, argv);
    int rc = harness_wait_exit(run, 20000);
    if (rc == -1)
        harness_kill(run, SIGKILL);
    int64_t took = harness_now_ms() - t0;
    assert_int_equal(rc, 1);
    edl_generation c = {0};
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_FAILED);
    assert_int_equal(c.restarts, 0);
    assert_non_null(strstr(c.reason, "exited with code 127"));
    assert_non_null(strstr(c.reason, says));
    assert_non_null(strstr(c.reason, "cannot be started"));
    assert_true(log_has(job, "generation", "failed", says));
    print_message("%s under edl run: the job failed in %lld ms: %s\n", trainer, (long long)took,
                  c.reason);
    assert_true(took < 10000);
    edl_generation_clear(&c);
}

static void test_trainer_that_cannot_start_fails_the_job_at_once(void **state)
{
    (void)state;
    cannot_start_case("nofile", "/no/such/trainer", "/no/such/trainer: No such file or directory");
    cannot_start_case("nopath", "no-such-trainer-in-path", "not found in PATH");
}

/* The log's lines holding `what`, and its last line (into last). */
static int log_count(const char *job, const char *what, char *last, size_t len)
{
    char log[300], line[2048];
    snprintf(log, sizeof log, "%s/%s.log", g_dir, job);
    FILE *f = fopen(log, "r");
    int n = 0;
    last[0] = '\0';
    while (f && fgets(line, sizeof line, f)) {
        n += strstr(line, what) != NULL;
        snprintf(last, len, "%s", line);
    }
    if (f)
        fclose(f);
    return n;
}

/* A typo in the script's path (python3 /no/such/train.py: the interpreter starts, then exits
 * 2) fails on every rank by itself: the script's own error, so the job fails at once, without
 * restarts: within 5 s, the interpreter's error printed once per pod, and the cause in `edl
 * run`'s last line. */
static void test_script_path_typo_fails_at_once_printing_its_error_once(void **state)
{
    (void)state;
    const char *job = "typo";
    const char *opts[] = {"--np", "2", "--etcd", ep(), "--grace-ms", "1000", NULL};
    const char *argv[] = {"/usr/bin/python3", "/no/such/train.py", NULL};
    int64_t t0 = harness_now_ms();
    pid_t run = edl_run_argv(job, opts, argv);
    int rc = harness_wait_exit(run, 30000);
    if (rc == -1)
        harness_kill(run, SIGKILL);
    int64_t took = harness_now_ms() - t0;
    assert_int_equal(rc, 1);
    edl_generation c = {0};
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_FAILED);
    assert_int_equal(c.restarts, 0);
    assert_non_null(strstr(c.reason, "every rank (2 of 2) failed by itself"));
    char last[2048];
    /* the interpreter's own line, "[rank 0 typo-0] /usr/bin/python3: can't open file ..." (the
     * reason quotes it too, after "last stderr: ") */
    int n = log_count(job, "] /usr/bin/python3: can't open file '/no/such/train.py'", last,
                      sizeof last);
    print_message("python3 /no/such/train.py under edl run --np 2: failed in %lld ms, its "
                  "error printed %d times; last line: %s", (long long)took, n, last);
    assert_int_equal(n, 2); /* once per pod */
    assert_non_null(strstr(last, "job typo failed after"));
    assert_non_null(strstr(last, "exited with code 2: last stderr: /usr/bin/python3: can't open "
                              "file '/no/such/train.py'"));
    assert_non_null(strstr(last, "the script's own error"));
    assert_true(took < 5000);
    edl_generation_clear(&c);
}

/* A trainer that fails without an error file is reported with its last stderr lines, the last
 * first (a traceback ends with its exception), a last line without its newline included; the
 * lines still reach edl run's output, once each. */
static void test_failure_cause_is_the_last_stderr_lines(void **state)
{
    (void)state;
    const char *job = "tail";
    const char *opts[] = {"--np", "1", "--etcd", ep(), "--grace-ms", "1000", NULL};
    pid_t run = edl_run(job, opts, "echo zero >&2; echo one >&2; echo >&2; echo two >&2; "
                                   "printf 'three, no newline' >&2; exit 4");
    run_exits(job, run, 30000, 1);
    char last[2048];
    assert_int_equal(log_count(job, "] one", last, sizeof last), 1);
    assert_int_equal(log_count(job, "] three, no newline", last, sizeof last), 1);
    if (!strstr(last, "exited with code 4: last stderr: three, no newline (after: one | two)"))
        fail_msg("last line: %s", last);
}

/* An agent SIGKILLed on this machine: the launcher reaps it at once and revokes its lease, so
 * the job server publishes a generation without it within a second, not after the lease's
 * TTL (10 s here). */
static void test_killed_agent_leaves_the_generation_at_once(void **state)
{
    (void)state;
    const char *job = "crash";
    const char *opts[] = {"--np", "2:3", "--etcd", ep(), "--ttl", "10", "--settle-ms", "300",
                          "--grace-ms", "1000", NULL};
    pid_t run = edl_run(job, opts, "exec sleep 120");
    edl_generation c = {0};
    wait_running(job, 3, 20000, &c);
    int64_t g = c.generation;
    char victim[64];
    snprintf(victim, sizeof victim, "%s", c.members[1].pod);
    int64_t t0 = harness_now_ms();
    signal_agent(job, victim, SIGKILL);
    int64_t deadline = t0 + 12000;
    while (harness_now_ms() < deadline &&
           !(read_generation(job, &c) && c.generation > g &&
             !edl_generation_member_named(&c, victim)))
        harness_sleep_ms(10);
    int64_t took = harness_now_ms() - t0;
    print_message("agent SIGKILLed under edl run: a generation without it after %lld ms (lease "
                  "TTL 10 s)\n", (long long)took);
    assert_null(edl_generation_member_named(&c, victim));
    assert_true(took <= 1500);
    assert_int_equal(c.restarts, 0);
    assert_non_null(strstr(c.reason, "left"));
    assert_true(log_has(job, victim, "exited unexpectedly", NULL));
    kill(run, SIGTERM);
    run_exits(job, run, 30000, 143);
    edl_generation_clear(&c);
}

/* One rank stops outside any collective while its peer waits inside one, with a collective
 * timeout far away (10 min): only the hang detection can end it. The waiting rank's agent
 * reports "hung" once the wait passes the progress timeout, the job server restarts the
 * generation, and the job finishes. */
static void test_rank_stuck_in_a_collective_is_a_hang(void **state)
{
    (void)state;
    const char *job = "hang";
    const char *opts[] = {"--np", "2", "--etcd", ep(), "--settle-ms", "300",
                          "--progress-timeout-ms", "2000", "--grace-ms", "1000", NULL};
    char script[600];
    snprintf(script, sizeof script,
             "EDL_COLL_TIMEOUT_MS=600000 EDL_TEST_STUCK_AT=5 EDL_TEST_STEP_MS=20 exec %s "
             "elastic 40", EDL_COLL_WORKER);
    int64_t t0 = harness_now_ms();
    pid_t run = edl_run(job, opts, script);
    run_exits(job, run, 60000, 0);
    edl_generation c = {0};
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_SUCCEEDED);
    assert_int_equal(c.restarts, 1);
    assert_int_equal(c.n_failures, 0); /* a hang blames nobody */
    assert_true(log_has(job, "hung: blocked for", "allreduce #", "waiting on rank 1"));
    print_message("hang found and the job restarted and finished in %lld ms\n",
                  (long long)(harness_now_ms() - t0));
    edl_generation_clear(&c);
}

/* Pod blocked-1's script fails (exit 3) while blocked-0 waits, reporting "running" and no
 * step, as a peer blocked in a collective does (collective timeouts are minutes). The job
 * server cannot tell it from a pod whose agent died, except that its agent renews its lease:
 * it probes the lease, sees the renewal and decides within about a third of the TTL and a
 * second, not after the TTL (--ttl 6: before, 7 s from the exit); --max-restarts 0, so the
 * decision ends the job, blaming blocked-1. */
static void test_a_failure_beside_a_blocked_peer_is_decided_once_its_lease_renews(void **state)
{
    (void)state;
    const char *job = "blocked";
    char marker[300], script[800];
    snprintf(marker, sizeof marker, "%s/blocked.exited", g_dir);
    unlink(marker);
    const char *opts[] = {"--np", "2", "--etcd", ep(), "--settle-ms", "300", "--ttl", "6",
                          "--max-restarts", "0", "--grace-ms", "1000", NULL};
    /* by the pod's name: which pod gets rank 1 is join order, and under load blocked-1 may
     * join first (likely what one ASan CI run hit: its reason did not name blocked-1) */
    snprintf(script, sizeof script, "if [ \"$EDL_POD_ID\" = blocked-1 ]; then sleep 1; "
             "touch %s; exit 3; fi; exec sleep 120", marker);
    pid_t run = edl_run(job, opts, script);
    assert_true(HARNESS_WAIT_UNTIL(access(marker, F_OK) == 0, 30000));
    int64_t t0 = harness_now_ms();
    /* while the job server holds, edl status says so (the hold lasts about 3 s) */
    const char *st[] = {"status", job, "--etcd", ep(), NULL};
    char out[8192] = "";
    if (!HARNESS_WAIT_UNTIL((edl_cmd(out, sizeof out, st), strstr(out, "pending: pod blocked-1 "
                                                                  "(rank ")), 2500))
        fail_msg("edl status during the hold shows no pending failure:\n%s", out);
    assert_non_null(strstr(out, "exited with code 3 in generation"));
    run_exits(job, run, 30000, 1);
    int64_t took = harness_now_ms() - t0;
    print_message("a failure beside a blocked peer: the job ended %lld ms after the exit "
                  "(lease TTL 6 s)\n", (long long)took);
    assert_true(took < 6000); /* before the TTL: the renewal decided it, not the TTL */
    edl_generation c = {0};
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_FAILED);
    if (!strstr(c.reason, "blocked-1"))
        fail_msg("the job's reason does not name blocked-1: %s", c.reason);
    assert_true(log_has(job, "pod blocked-0 renewed its lease after the failure", NULL, NULL));
    edl_generation_clear(&c);
}

/* A pod's agent is SIGKILLed (its trainer dies with it) while the others train. Restart mode:
 * torchrun-style trainers exit 1 when their collective breaks; in-process mode: libedlcoll's
 * trainers declare the generation dead and wait to re-form. Either way the survivors' reaction
 * is the fallout of the loss: the job server waits for the silent pod's lease, publishes no
 * generation that still holds it, spends no restart and blames nobody; the job finishes. */
static void peer_loss_case(const char *job, const char *mode)
{
    char pod[64];
    snprintf(pod, sizeof pod, "%s-2", job);
    const char *opts[] = {"--np", "3", "--etcd", ep(), "--settle-ms", "300", "--ttl", "2",
                          "--grace-ms", "1000", "--elastic-mode", mode, NULL};
    char script[600];
    snprintf(script, sizeof script, "%sEDL_TEST_STEP_MS=40 exec %s elastic 150",
             strcmp(mode, "restart") == 0 ? "EDL_TEST_EXIT_ON_FAILURE=1 " : "", EDL_COLL_WORKER);
    pid_t run = edl_run(job, opts, script);
    edl_generation c = {0};
    wait_running(job, 3, 20000, &c);
    int64_t g = c.generation;
    wait_step(job, pod, 10, 20000); /* training is under way */
    signal_agent(job, pod, SIGKILL);
    run_exits(job, run, 90000, 0);
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_SUCCEEDED);
    assert_true(c.generation > g);
    if (c.restarts != 0 || c.n_failures != 0) { /* say which decision spent it */
        char log[300], line[1024];
        snprintf(log, sizeof log, "%s/%s.log", g_dir, job);
        FILE *f = fopen(log, "r");
        while (f && fgets(line, sizeof line, f))
            if (strstr(line, "jobserver") || strstr(line, "exited") || strstr(line, "signal"))
                print_message("%s", line);
        if (f)
            fclose(f);
    }
    assert_int_equal(c.restarts, 0);
    assert_int_equal(c.n_failures, 0);
    edl_generation_clear(&c);
}

static void test_peer_loss_spends_no_restart(void **state)
{
    (void)state;
    peer_loss_case("loss", "restart");
}

static void test_peer_loss_in_process_spends_no_restart(void **state)
{
    (void)state;
    peer_loss_case("iploss", "inprocess");
}

static void test_etcd_outage_does_not_kill_trainers(void **state)
{
    (void)state;
    const char *job = "outage";
    char starts[300], script[400];
    snprintf(starts, sizeof starts, "%s/outage.starts", g_dir);
    snprintf(script, sizeof script, "echo $$ >> %s; exec sleep 120", starts);
    const char *opts[] = {"--np", "2", "--etcd", ep(), "--ttl", "10", "--settle-ms", "200",
                          "--grace-ms", "1000", NULL};
    pid_t run = edl_run(job, opts, script);
    edl_generation c = {0};
    wait_running(job, 2, 20000, &c);
    int64_t g = c.generation;
    for (int64_t dl = harness_now_ms() + 5000; count_lines(starts) < 2 && harness_now_ms() < dl;)
        harness_sleep_ms(20); /* "running" is reported at fork, the line a moment later */
    assert_int_equal(count_lines(starts), 2);
    edl_etcd_close(g_c);
    assert_int_equal(edl_etcd_server_stop_member(g_srv, 0, false), 0);
    harness_sleep_ms(5000); /* the outage's length is the test */
    assert_int_equal(edl_etcd_server_restart_member(g_srv, 0), 0);
    g_c = harness_client(ep(), 0);
    harness_sleep_ms(3000); /* time for a wrong new generation or restart to show, after it */
    wait_running(job, 2, 10000, &c);
    assert_int_equal(c.generation, g);       /* same generation */
    assert_int_equal(count_lines(starts), 2); /* no trainer was restarted */
    assert_int_equal(harness_wait_exit(run, 0), -1);
    const char *stop[] = {"stop", job, "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(NULL, 0, stop), 0);
    run_exits(job, run, 30000, 4);
    edl_generation_clear(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failing_trainer_restarted_excluded_then_job_fails),
        cmocka_unit_test(test_broken_trainer_spends_its_budget_in_seconds),
        cmocka_unit_test(test_trainer_that_cannot_start_fails_the_job_at_once),
        cmocka_unit_test(test_script_path_typo_fails_at_once_printing_its_error_once),
        cmocka_unit_test(test_failure_cause_is_the_last_stderr_lines),
        cmocka_unit_test(test_killed_agent_leaves_the_generation_at_once),
        cmocka_unit_test(test_rank_stuck_in_a_collective_is_a_hang),
        cmocka_unit_test(test_a_failure_beside_a_blocked_peer_is_decided_once_its_lease_renews),
        cmocka_unit_test(test_trainer_error_file_restart_count_and_master_port),
        cmocka_unit_test(test_peer_loss_spends_no_restart),
        cmocka_unit_test(test_peer_loss_in_process_spends_no_restart),
        cmocka_unit_test(test_etcd_outage_does_not_kill_trainers),
    };
    return cmocka_run_group_tests(tests, edl_run_setup, edl_run_teardown);
}

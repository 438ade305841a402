/* test_edl_resume.c: whole jobs through `edl run` that keep their training across changes:
 * the example trainer finishing with the right answer after being re-formed, an in-process MLP
 * surviving scale and kill without restarts, and a job run again (after edl stop, a SIGKILLed
 * launcher, with --etcd and with its own) resuming from its checkpoints, and --fresh.
 * Set-up: edl_run_common.c. */
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

static void test_example_trainer_survives_reformation(void **state)
{
    (void)state;
    const char *job = "learn";
    char uri[400];
    snprintf(uri, sizeof uri, "file://%s/learn", g_dir);
    const char *argv[] = {EDL_CLI_BIN, "run", "--job", job, "--np", "2:3", "--replicas", "2",
                          "--etcd", ep(), "--settle-ms", "300", "--grace-ms", "1000",
                          "--checkpoint-uri", uri, "--", EDL_EXAMPLE_TRAINER, "--steps", "300",
                          "--step-ms", "20", NULL};
    char log[300];
    snprintf(log, sizeof log, "%s/learn.log", g_dir);
    pid_t run = harness_spawn(argv, log);
    edl_generation c = {0};
    wait_running(job, 2, 20000, &c);
    wait_step(job, "learn-0", 60, 20000); /* a fifth of the steps before it re-forms */
    const char *scale[] = {"scale", job, "3", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(NULL, 0, scale), 0);
    wait_running(job, 3, 20000, &c);
    run_exits(job, run, 90000, 0);
    char path[300], line[256];
    snprintf(path, sizeof path, "%s/learn/shared/result.txt", g_dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    long steps = 0;
    double loss = 1, maxerr = 1;
    assert_int_equal(sscanf(line, "steps %ld loss %lf maxerr %lf", &steps, &loss, &maxerr), 3);
    assert_int_equal(steps, 300);
    assert_true(maxerr < 0.01);
    edl_generation_clear(&c);
}

/* ---- a job run again resumes from its checkpoints ------------------------------------------- */

/* The newest step among the complete checkpoints (ckpt-<step>-g<gen>/manifest.json) in dir,
 * or -1; *count: how many there are (may be NULL). */
static long newest_checkpoint(const char *dir, int *count)
{
    DIR *d = opendir(dir);
    long newest = -1;
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        long step, gen;
        char manifest[700];
        struct stat st;
        snprintf(manifest, sizeof manifest, "%s/%s/manifest.json", dir, e->d_name);
        if (sscanf(e->d_name, "ckpt-%16ld-g%ld", &step, &gen) == 2 && stat(manifest, &st) == 0) {
            n++;
            newest = step > newest ? step : newest;
        }
    }
    if (d)
        closedir(d);
    if (count)
        *count = n;
    return newest;
}

static bool has_checkpoint(const char *dir, long step)
{
    DIR *d = opendir(dir);
    char want[64];
    bool found = false;
    snprintf(want, sizeof want, "ckpt-%016ld-g", step);
    struct dirent *e;
    while (d && !found && (e = readdir(d))) {
        char manifest[700];
        struct stat st;
        snprintf(manifest, sizeof manifest, "%s/%s/manifest.json", dir, e->d_name);
        found = strncmp(e->d_name, want, strlen(want)) == 0 && stat(manifest, &st) == 0;
    }
    if (d)
        closedir(d);
    return found;
}

static long wait_checkpoint(const char *dir, long at_least, int timeout_ms)
{
    int64_t deadline = harness_now_ms() + timeout_ms;
    long newest;
    while ((newest = newest_checkpoint(dir, NULL)) < at_least && harness_now_ms() < deadline)
        harness_sleep_ms(50);
    if (newest < at_least)
        fail_msg("no checkpoint of step %ld in %s after %d ms (newest: %ld)", at_least, dir,
                 timeout_ms, newest);
    return newest;
}

/* The step of the example trainer's nth (from 1) "resuming at step" line in the job's log,
 * waited for; -1 when it did not come. */
static long resumed_at(const char *job, int nth, int timeout_ms)
{
    char log[300], line[2048];
    snprintf(log, sizeof log, "%s/%s.log", g_dir, job);
    for (int64_t deadline = harness_now_ms() + timeout_ms;; harness_sleep_ms(50)) {
        FILE *f = fopen(log, "r");
        int seen = 0;
        long step = -1;
        while (f && seen < nth && fgets(line, sizeof line, f)) {
            const char *at = strstr(line, "resuming at step ");
            if (at && ++seen == nth)
                step = strtol(at + strlen("resuming at step "), NULL, 10);
        }
        if (f)
            fclose(f);
        if (step >= 0 || harness_now_ms() > deadline)
            return step;
    }
}

/* The newest checkpoint's weights are corrupt (a byte flipped in its shard): the example
 * trainer, which reads them once with their digest checked, says so and resumes from the one
 * before, and the job ends as it should. */
static void test_a_corrupt_newest_checkpoint_resumes_from_the_one_before(void **state)
{
    (void)state;
    const char *job = "corrupt";
    char dir[300], uri[320], cmd[900], out[256];
    snprintf(dir, sizeof dir, "%s/corrupt", g_dir);
    snprintf(uri, sizeof uri, "file://%s", dir);
    const char *opts[] = {"--np", "1", "--grace-ms", "1000", "--checkpoint-uri", uri, NULL};
    const char *to30[] = {EDL_EXAMPLE_TRAINER, "--steps", "30", "--step-ms", "5", NULL};
    run_exits(job, edl_run_argv(job, opts, to30), 60000, 0);
    assert_int_equal(newest_checkpoint(dir, NULL), 30);
    snprintf(cmd, sizeof cmd, "f=$(ls -d %s/ckpt-0000000000000030-g*)/rank-0/shard-0; "
             "printf '\\377\\377\\377\\377' | dd of=$f bs=1 seek=8 conv=notrunc status=none && "
             "echo flipped", dir);
    assert_int_equal(harness_shell(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "flipped"));
    const char *to40[] = {EDL_EXAMPLE_TRAINER, "--steps", "40", "--step-ms", "5", NULL};
    run_exits(job, edl_run_argv(job, opts, to40), 60000, 0);
    assert_int_equal(resumed_at(job, 2, 0), 20);
    assert_true(log_has(job, "checkpoint step 30 is unusable", "corrupt", "trying the one before"));
    assert_int_equal(newest_checkpoint(dir, NULL), 40);
}

/* `edl stop` (with --etcd), then the same `edl run` with its own etcd (which knows nothing of
 * the job): the example trainer resumes at the last committed step, and retention keeps the
 * first run's checkpoints until newer ones are complete. A SIGKILLed launcher, then a run to
 * the end: it resumes again. --fresh then starts at step 0 and moves the checkpoints aside. */
static void test_a_job_run_again_resumes_from_its_checkpoints(void **state)
{
    (void)state;
    const char *job = "again";
    char dir[300], uri[320], steps[32];
    snprintf(dir, sizeof dir, "%s/again", g_dir);
    snprintf(uri, sizeof uri, "file://%s", dir);
    const char *with_etcd[] = {"--np", "1", "--grace-ms", "1000", "--etcd", ep(),
                               "--checkpoint-uri", uri, NULL};
    const char *own_etcd[] = {"--np", "1", "--grace-ms", "1000", "--checkpoint-uri", uri, NULL};
    const char *endless[] = {EDL_EXAMPLE_TRAINER, "--steps", "1000000", "--step-ms", "5", NULL};
    pid_t run = edl_run_argv(job, with_etcd, endless);
    assert_int_equal(resumed_at(job, 1, 30000), 0);
    wait_checkpoint(dir, 20, 30000);
    const char *stop[] = {"stop", job, "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(NULL, 0, stop), 0);
    run_exits(job, run, 30000, 4);
    long first = newest_checkpoint(dir, NULL);

    run = edl_run_argv(job, own_etcd, endless);
    assert_int_equal(resumed_at(job, 2, 30000), first);
    wait_checkpoint(dir, first + 10, 30000);
    assert_true(has_checkpoint(dir, first)); /* keep 3: the first run's newest two stay */
    assert_true(has_checkpoint(dir, first - 10));
    harness_kill(run, SIGKILL); /* its etcd, agent and trainer die with it */
    long second = newest_checkpoint(dir, NULL);

    snprintf(steps, sizeof steps, "%ld", second + 20);
    const char *finite[] = {EDL_EXAMPLE_TRAINER, "--steps", steps, "--step-ms", "5", NULL};
    run = edl_run_argv(job, own_etcd, finite);
    long third = resumed_at(job, 3, 30000);
    assert_true(third >= second && third < second + 20);
    run_exits(job, run, 60000, 0);
    int kept = 0;
    assert_int_equal(newest_checkpoint(dir, &kept), second + 20);
    assert_int_equal(kept, 3);

    const char *fresh[] = {"--np", "1", "--grace-ms", "1000", "--checkpoint-uri", uri, "--fresh",
                           NULL};
    const char *short_run[] = {EDL_EXAMPLE_TRAINER, "--steps", "10", "--step-ms", "5", NULL};
    run = edl_run_argv(job, fresh, short_run);
    assert_int_equal(resumed_at(job, 4, 30000), 0);
    run_exits(job, run, 60000, 0);
    assert_true(log_has(job, "--fresh: moved 3 checkpoints of", uri, "/previous-"));
    assert_int_equal(newest_checkpoint(dir, NULL), 10);
}

/* The step a pod's trainer reported last (-1: none yet). */
static int64_t pod_step(const char *job, const char *pod)
{
    char buf[2048], err[128];
    edl_pod_status st = {.step = -1};
    if (!harness_get(g_c, key(job, EDL_KEY_STATUS, pod), buf, sizeof buf) ||
        edl_pod_status_parse(buf, strlen(buf), &st, err, sizeof err) != 0)
        return -1;
    return st.step;
}

/* The trainer's pid of a pod, from its status. */
static long trainer_pid(const char *job, const char *pod)
{
    char buf[1024], err[128];
        edl_pod_status st;
    if (!harness_get(g_c, key(job, EDL_KEY_STATUS, pod), buf, sizeof buf) ||
        edl_pod_status_parse(buf, strlen(buf), &st, err, sizeof err) != 0)
        return -1;
    return st.pid;
}

/* libedlcoll's elastic loop under edl run: scale 2 -> 3, then SIGKILL one trainer. The
 * survivors keep their processes (re-formed in process), and the job ends with the accuracy
 * of an undisturbed run of the same trainer alone. */
static void test_inprocess_mlp_survives_scale_and_kill_without_restarts(void **state)
{
    (void)state;
    const char *job = "mlp";
    char out[300], cmd[700], line[256];
    snprintf(out, sizeof out, "%s/mlp", g_dir);
    mkdir(out, 0755);
    snprintf(cmd, sizeof cmd, "%s --steps 1500 | tail -n 1", EDL_EXAMPLE_MLP);
    FILE *p = popen(cmd, "r");
    assert_non_null(fgets(line, sizeof line, p));
    pclose(p);
    const char *a = strstr(line, "accuracy ");
    assert_non_null(a);
    double ref = atof(a + 9);
    assert_true(ref > 0.9);
    const char *argv[] = {EDL_CLI_BIN, "run", "--job", job, "--np", "2:3", "--replicas", "2",
                          "--etcd", ep(), "--settle-ms", "300", "--grace-ms", "1000",
                          "--elastic-mode", "inprocess", "--", EDL_EXAMPLE_MLP, "--steps",
                          "1500", "--step-ms", "10", "--out", out, NULL};
    char log[300];
    snprintf(log, sizeof log, "%s/mlp.log", g_dir);
    pid_t run = harness_spawn(argv, log);
    edl_generation c = {0};
    wait_running(job, 2, 20000, &c);
    long pid0 = trainer_pid(job, "mlp-0"), pid1 = trainer_pid(job, "mlp-1");
    wait_step(job, "mlp-0", 100, 20000); /* some training first */
    const char *scale[] = {"scale", job, "3", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(NULL, 0, scale), 0);
    int64_t g1 = c.generation;
    wait_running_after(job, g1, 3, 20000, &c);
    assert_int_equal(trainer_pid(job, "mlp-0"), pid0); /* re-formed in process */
    assert_int_equal(trainer_pid(job, "mlp-1"), pid1);
    long pid2 = trainer_pid(job, "mlp-2");
    wait_step(job, "mlp-2", pod_step(job, "mlp-0") + 100, 20000); /* some training in three */
    assert_int_equal(kill((pid_t)pid1, SIGKILL), 0); /* a trainer crashes mid-training */
    run_exits(job, run, 120000, 0);
    char path[400];
    snprintf(path, sizeof path, "%s/result.txt", out);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    long steps = 0;
    double acc = 0, loss = 0;
    assert_int_equal(sscanf(line, "steps %ld accuracy %lf loss %lf", &steps, &acc, &loss), 3);
    print_message("accuracy %.4f after re-forms (undisturbed run: %.4f)\n", acc, ref);
    assert_int_equal(steps, 1500);
    assert_true(fabs(acc - ref) <= 0.02);
    /* The survivors finished in the processes they started in, having re-formed. */
    const long survivors[2] = {pid0, pid2};
    for (int i = 0; i < 2; i++) {
        long rp = 0, fg = 0, lg = 0, reforms = -1;
        snprintf(path, sizeof path, "%s/proc-%ld.txt", out, survivors[i]);
        f = fopen(path, "r");
        assert_non_null(f);
        assert_int_equal(fscanf(f, "pid %ld first_gen %ld last_gen %ld reforms %ld", &rp, &fg,
                                &lg, &reforms), 4);
        fclose(f);
        print_message("pid %ld: generations %ld..%ld, %ld re-forms\n", rp, fg, lg, reforms);
        assert_true(reforms >= 1);
        assert_true(lg > fg);
    }
    edl_generation_clear(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inprocess_mlp_survives_scale_and_kill_without_restarts),
        cmocka_unit_test(test_example_trainer_survives_reformation),
        cmocka_unit_test(test_a_job_run_again_resumes_from_its_checkpoints),
        cmocka_unit_test(test_a_corrupt_newest_checkpoint_resumes_from_the_one_before),
    };
    return cmocka_run_group_tests(tests, edl_run_setup, edl_run_teardown);
}

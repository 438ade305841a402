/* edl_run_common.c: the set-up the `edl run` tests share (test_edl_run.c, test_edl_failures.c,
 * test_edl_resume.c, test_edl_manifest.c, test_edl_roles.c): one etcd and one scratch directory
 * per binary, `edl` run to completion or in the background, and waits on the job's keys. */
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
#include <unistd.h>

#include "edl/discovery.h"
#include "edl/etcd.h"
#include "edl/job.h"
#include "edl_run_common.h"
#include "harness.h"

edl_etcd_server *g_srv;
edl_etcd *g_c;
char g_dir[256];

int edl_run_setup(void **state)
{
    (void)state;
    harness_open_etcd(1, NULL, &g_srv, &g_c);
    harness_scratch_open(g_dir, sizeof g_dir, "/tmp/edl-test-run.XXXXXX", true);
    return 0;
}

int edl_run_teardown(void **state)
{
    (void)state;
    harness_close_etcd(&g_srv, &g_c);
    harness_scratch_close(g_dir);
    return 0;
}

const char *ep(void)
{
    return edl_etcd_server_endpoints(g_srv);
}

/* Run `edl ARGS` to completion with output in a file; returns the exit status. */
int edl_cmd(char *out, size_t outlen, const char *const *args)
{
    return harness_edl(g_dir, 60000, out, outlen, args);
}

/* True when one line of the job's `edl run` log contains a, b and c (NULL: anything). */
bool log_has(const char *job, const char *a, const char *b, const char *c)
{
    char log[300], line[2048];
    snprintf(log, sizeof log, "%s/%s.log", g_dir, job);
    FILE *f = fopen(log, "r");
    bool found = false;
    while (f && !found && fgets(line, sizeof line, f))
        found = strstr(line, a) && (!b || strstr(line, b)) && (!c || strstr(line, c));
    if (f)
        fclose(f);
    return found;
}

/* Start `edl run ... -- TRAINER...` in the background (output appended to <dir>/<job>.log);
 * in a process group of its own when group (as a shell starts a job in a terminal). */
pid_t edl_run_in(const char *job, const char *const *opts, const char *const *trainer,
                 bool group)
{
    const char *argv[48] = {EDL_CLI_BIN, "run", "--job", job};
    size_t n = 4;
    for (size_t i = 0; opts[i]; i++)
        argv[n++] = opts[i];
    argv[n++] = "--";
    for (size_t i = 0; trainer[i]; i++)
        argv[n++] = trainer[i];
    argv[n] = NULL;
    char log[300];
    snprintf(log, sizeof log, "%s/%s.log", g_dir, job);
    pid_t pid = group ? harness_spawn_group(argv, log) : harness_spawn(argv, log);
    assert_true(pid > 0);
    return pid;
}

pid_t edl_run_argv(const char *job, const char *const *opts, const char *const *trainer)
{
    return edl_run_in(job, opts, trainer, false);
}

void run_exits(const char *job, pid_t run, int timeout_ms, int code)
{
    int rc = harness_wait_exit(run, timeout_ms);
    if (rc == code)
        return;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "tail -n 60 %s/%s.log >&2", g_dir, job);
    fprintf(stderr, "edl run of job %s: exit %d, not %d (-1: still running after %d ms); the end "
            "of its log:\n", job, rc, code, timeout_ms);
    fflush(stderr);
    if (system(cmd) != 0)
        fprintf(stderr, "(no log)\n");
    fail_msg("edl run of job %s exited %d, not %d", job, rc, code);
}

/* The same with a shell script as the trainer. */
pid_t edl_run(const char *job, const char *const *opts, const char *script)
{
    const char *trainer[] = {"/bin/sh", "-c", script, NULL};
    return edl_run_argv(job, opts, trainer);
}

/* A key of the job (edl/job.h's builder); a few live at once in one expression. */
char *key(const char *job, edl_job_key_kind kind, const char *pod)
{
    static char buf[4][256];
    static int k;
    return harness_job_key(buf[k++ % 4], 256, job, kind, pod, 0);
}

bool read_generation(const char *job, edl_generation *out)
{
    char buf[65536], err[256];
    edl_generation_clear(out);
    return harness_get(g_c, key(job, EDL_KEY_GENERATION, NULL), buf, sizeof buf) &&
           edl_generation_parse(buf, strlen(buf), out, err, sizeof err) == 0;
}

/* Wait for a running generation newer than `after` with n members in which every member's
 * trainer runs. */
void wait_running_after(const char *job, int64_t after, int n, int timeout_ms,
                        edl_generation *c)
{
    int64_t deadline = harness_now_ms() + timeout_ms;
    while (harness_now_ms() < deadline) {
        if (read_generation(job, c) && c->state == EDL_JOB_RUNNING && (int)c->n_members == n &&
            c->generation > after) {
            int running = 0;
            for (size_t i = 0; i < c->n_members; i++) {
                char buf[1024], err[128];
                                edl_pod_status st;
                if (harness_get(g_c, key(job, EDL_KEY_STATUS, c->members[i].pod), buf,
                                sizeof buf) &&
                    edl_pod_status_parse(buf, strlen(buf), &st, err, sizeof err) == 0 &&
                    st.generation == c->generation && st.state == EDL_TRAINER_RUNNING)
                    running++;
            }
            if (running == n)
                return;
        }
        harness_sleep_ms(20);
    }
    fail_msg("job %s: no running generation with %d members within %d ms (generation %lld, "
             "%zu members, state %s)", job, n, timeout_ms, (long long)c->generation,
             c->n_members, edl_job_state_name(c->state));
}

/* The pid of a pod's agent: it is in the pod's registration. */
pid_t agent_pid(const char *job, const char *pod)
{
    char buf[2048], err[256];
    edl_pod p = {0};
    assert_non_null(harness_get(g_c, key(job, EDL_KEY_POD, pod), buf, sizeof buf));
    assert_int_equal(edl_pod_parse(buf, strlen(buf), &p, err, sizeof err), 0);
    assert_true(p.pid > 1);
    pid_t pid = (pid_t)p.pid;
    edl_pod_clear(&p);
    return pid;
}

/* Signal the agent of a pod. */
void signal_agent(const char *job, const char *pod, int sig)
{
    assert_int_equal(kill(agent_pid(job, pod), sig), 0);
}

void wait_running(const char *job, int n, int timeout_ms, edl_generation *c)
{
    wait_running_after(job, 0, n, timeout_ms, c);
}

/* Wait until a pod's trainer has reported step `step` (edl_agent_link_report_step). */
void wait_step(const char *job, const char *pod, int64_t step, int timeout_ms)
{
    char buf[2048], err[128];
    edl_pod_status st = {.step = -1};
    if (HARNESS_WAIT_UNTIL(harness_get(g_c, key(job, EDL_KEY_STATUS, pod), buf, sizeof buf) &&
                           edl_pod_status_parse(buf, strlen(buf), &st, err, sizeof err) == 0 &&
                           st.step >= step, timeout_ms))
        return;
    fail_msg("%s: no step %lld within %d ms (last %lld)", pod, (long long)step, timeout_ms,
             (long long)st.step);
}

char *env_value(const char *path, const char *name, char *out, size_t n)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    size_t len = strlen(name);
    out[0] = '\0';
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, name, len) == 0 && line[len] == '=') {
            line[strcspn(line, "\n")] = '\0';
            snprintf(out, n, "%s", line + len + 1);
            fclose(f);
            return out;
        }
    }
    if (f)
        fclose(f);
    return NULL;
}


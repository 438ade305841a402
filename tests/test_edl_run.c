/* test_edl_run.c: whole jobs through `edl run`: a real etcd, the real job server, real agents
 * and real trainer processes (small sh scripts). What a user sees: the exact environment of
 * every rank, scale up within the settle window as one generation, graceful leave and SIGKILL,
 * standby promotion, a failing trainer restarted, excluded and finally failing the job, a
 * broken trainer failing within seconds, one that cannot be started failing at once, a
 * script's own bug (a path typo) failing at once with its cause (its last stderr lines) in the
 * last line, an etcd
 * outage ridden out without killing trainers, `edl status/scale/stop`, the example trainer
 * finishing with the right answer after being re-formed, a job run again (after edl stop, a
 * SIGKILLed launcher, with --etcd and with its own) resuming from its checkpoints, --fresh,
 * and a job with parameter servers
 * (--ps: the same trainer in both roles, servers scaled without restarting anyone). */
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
#include "harness.h"

#include <cjson/cJSON.h>

static edl_etcd_server *g_srv;
static edl_etcd *g_c;
static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    harness_open_etcd(1, NULL, &g_srv, &g_c);
    harness_scratch_open(g_dir, sizeof g_dir, "/tmp/edl-test-run.XXXXXX", true);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    harness_close_etcd(&g_srv, &g_c);
    harness_scratch_close(g_dir);
    return 0;
}

static const char *ep(void)
{
    return edl_etcd_server_endpoints(g_srv);
}

/* Run `edl ARGS` to completion with output in a file; returns the exit status. */
static int edl_cmd(char *out, size_t outlen, const char *const *args)
{
    return harness_edl(g_dir, 60000, out, outlen, args);
}

/* True when one line of the job's `edl run` log contains a, b and c (NULL: anything). */
static bool log_has(const char *job, const char *a, const char *b, const char *c)
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
static pid_t edl_run_in(const char *job, const char *const *opts, const char *const *trainer,
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

static pid_t edl_run_argv(const char *job, const char *const *opts, const char *const *trainer)
{
    return edl_run_in(job, opts, trainer, false);
}

/* The same with a shell script as the trainer. */
static pid_t edl_run(const char *job, const char *const *opts, const char *script)
{
    const char *trainer[] = {"/bin/sh", "-c", script, NULL};
    return edl_run_argv(job, opts, trainer);
}

/* Wait until `edl status JOB` (its etcd found through the state file) shows it running with n
 * members. */
static void wait_local_running(const char *job, int n, int timeout_ms)
{
    char out[8192], want[64];
    const char *st[] = {"status", job, NULL};
    snprintf(want, sizeof want, ", %d members", n);
    if (HARNESS_WAIT_UNTIL(edl_cmd(out, sizeof out, st) == 0 &&
                           strstr(out, "running, generation") && strstr(out, want), timeout_ms))
        return;
    fail_msg("local job %s: not running with %d members within %d ms:\n%s", job, n, timeout_ms,
             out);
}

/* The pid of parent's child process named comm (0: none). */
static pid_t child_named(pid_t parent, const char *comm)
{
    char cmd[128], out[64];
    snprintf(cmd, sizeof cmd, "pgrep -P %d -x %s", (int)parent, comm);
    return harness_shell(cmd, out, sizeof out) == 0 ? (pid_t)atol(out) : 0;
}

/* A key of the job (edl/job.h's builder); a few live at once in one expression. */
static char *key(const char *job, edl_job_key_kind kind, const char *pod)
{
    static char buf[4][256];
    static int k;
    return harness_job_key(buf[k++ % 4], 256, job, kind, pod, 0);
}

static bool read_generation(const char *job, edl_generation *out)
{
    char buf[65536], err[256];
    edl_generation_clear(out);
    return harness_get(g_c, key(job, EDL_KEY_GENERATION, NULL), buf, sizeof buf) &&
           edl_generation_parse(buf, strlen(buf), out, err, sizeof err) == 0;
}

/* Wait for a running generation newer than `after` with n members in which every member's
 * trainer runs. */
static void wait_running_after(const char *job, int64_t after, int n, int timeout_ms,
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
static pid_t agent_pid(const char *job, const char *pod)
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
static void signal_agent(const char *job, const char *pod, int sig)
{
    assert_int_equal(kill(agent_pid(job, pod), sig), 0);
}

static void wait_running(const char *job, int n, int timeout_ms, edl_generation *c)
{
    wait_running_after(job, 0, n, timeout_ms, c);
}

/* Wait until a pod's trainer has reported step `step` (edl_agent_link_report_step). */
static void wait_step(const char *job, const char *pod, int64_t step, int timeout_ms)
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

/* ---- environment ------------------------------------------------------------------------ */

static char *env_value(const char *path, const char *name, char *out, size_t n)
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

static void test_every_rank_gets_the_exact_environment(void **state)
{
    (void)state;
    /* edl run with its own etcd (no --etcd); the trainers dump their environment and exit 0 */
    char script[512];
    snprintf(script, sizeof script, "env > %s/env.$EDL_RANK", g_dir);
    const char *opts[] = {"--np", "3", "--settle-ms", "200", NULL};
    pid_t run = edl_run("envjob", opts, script);
    assert_int_equal(harness_wait_exit(run, 60000), 0); /* all exit 0: succeeded */
    char master_addr[64], master_port[16], eps[512], v[512], path[300];
    snprintf(path, sizeof path, "%s/env.0", g_dir);
    assert_non_null(env_value(path, "MASTER_ADDR", master_addr, sizeof master_addr));
    assert_non_null(env_value(path, "MASTER_PORT", master_port, sizeof master_port));
    assert_non_null(env_value(path, "PADDLE_TRAINER_ENDPOINTS", eps, sizeof eps));
    char pods[3][64];
    for (int r = 0; r < 3; r++) {
        snprintf(path, sizeof path, "%s/env.%d", g_dir, r);
        char want[16];
        snprintf(want, sizeof want, "%d", r);
        assert_string_equal(env_value(path, "RANK", v, sizeof v), want);
        assert_string_equal(env_value(path, "EDL_RANK", v, sizeof v), want);
        assert_string_equal(env_value(path, "PADDLE_TRAINER_ID", v, sizeof v), want);
        assert_string_equal(env_value(path, "WORLD_SIZE", v, sizeof v), "3");
        assert_string_equal(env_value(path, "EDL_WORLD_SIZE", v, sizeof v), "3");
        assert_string_equal(env_value(path, "PADDLE_TRAINERS_NUM", v, sizeof v), "3");
        assert_string_equal(env_value(path, "EDL_JOB_ID", v, sizeof v), "envjob");
        assert_string_equal(env_value(path, "TRAINING_ROLE", v, sizeof v), "TRAINER");
        assert_string_equal(env_value(path, "MASTER_ADDR", v, sizeof v), master_addr);
        assert_string_equal(env_value(path, "MASTER_PORT", v, sizeof v), master_port);
        assert_string_equal(env_value(path, "PADDLE_TRAINER_ENDPOINTS", v, sizeof v), eps);
        assert_string_equal(env_value(path, "LOCAL_WORLD_SIZE", v, sizeof v), "3");
        assert_string_equal(env_value(path, "LOCAL_RANK", v, sizeof v), want);
        assert_string_equal(env_value(path, "GROUP_WORLD_SIZE", v, sizeof v), "3");
        assert_string_equal(env_value(path, "ROLE_WORLD_SIZE", v, sizeof v), "3");
        assert_string_equal(env_value(path, "ROLE_RANK", v, sizeof v), want);
        assert_string_equal(env_value(path, "ROLE_NAME", v, sizeof v), "worker");
        assert_string_equal(env_value(path, "TORCHELASTIC_RESTART_COUNT", v, sizeof v), "0");
        assert_string_equal(env_value(path, "TORCHELASTIC_RUN_ID", v, sizeof v), "envjob");
        assert_non_null(env_value(path, "TORCHELASTIC_ERROR_FILE", v, sizeof v));
        assert_non_null(env_value(path, "EDL_GENERATION", v, sizeof v));
        assert_non_null(env_value(path, "EDL_ETCD_ENDPOINTS", v, sizeof v));
        assert_non_null(env_value(path, "EDL_POD_ID", pods[r], sizeof pods[r]));
        /* endpoints list in rank order: entry r is rank r's own endpoint */
        char cur[128];
        assert_non_null(env_value(path, "PADDLE_CURRENT_ENDPOINT", cur, sizeof cur));
        char copy[512], *save = NULL, *tok = NULL;
        snprintf(copy, sizeof copy, "%s", eps);
        tok = strtok_r(copy, ",", &save);
        for (int k = 0; k < r && tok; k++)
            tok = strtok_r(NULL, ",", &save);
        assert_non_null(tok);
        assert_string_equal(tok, cur);
        if (r == 0) { /* MASTER is rank 0's address, on a port of the generation's own */
            char m[128];
            snprintf(m, sizeof m, "%s:", master_addr);
            assert_memory_equal(cur, m, strlen(m));
            assert_string_not_equal(cur + strlen(m), master_port);
        }
    }
    assert_string_not_equal(pods[0], pods[1]);
    assert_string_not_equal(pods[1], pods[2]);
    /* one job secret for the run, the same file for every rank, removed when the run ended */
    char secret[512], other[512];
    snprintf(path, sizeof path, "%s/env.0", g_dir);
    assert_non_null(env_value(path, "EDL_JOB_SECRET_FILE", secret, sizeof secret));
    for (int r = 1; r < 3; r++) {
        snprintf(path, sizeof path, "%s/env.%d", g_dir, r);
        assert_string_equal(env_value(path, "EDL_JOB_SECRET_FILE", other, sizeof other), secret);
    }
    assert_int_equal(access(secret, F_OK), -1);
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
    assert_int_equal(harness_wait_exit(run, 60000), 1); /* budget of 1 spent */
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

/* ---- scaling, leaving, crashing, standbys ------------------------------------------------ */

static void test_scale_leave_kill_and_stop(void **state)
{
    (void)state;
    const char *job = "elastic";
    char starts[300], script[600];
    snprintf(starts, sizeof starts, "%s/elastic.starts", g_dir);
    /* each trainer start appends "generation rank world pid" */
    snprintf(script, sizeof script,
             "echo $EDL_GENERATION $EDL_RANK $EDL_WORLD_SIZE $$ >> %s; exec sleep 120", starts);
    const char *opts[] = {"--np", "2:4", "--replicas", "2", "--etcd", ep(), "--ttl", "2",
                          "--settle-ms", "1000", "--grace-ms", "2000", NULL};
    pid_t run = edl_run(job, opts, script);
    edl_generation c = {0};
    wait_running(job, 2, 20000, &c);
    int64_t g1 = c.generation;

    /* edl status says where each agent serves /metrics, and it answers there */
    const char *st_table[] = {"status", job, "--etcd", ep(), NULL};
    char table[8192];
    assert_int_equal(edl_cmd(table, sizeof table, st_table), 0);
    int scraped = 0;
    for (const char *m = table; (m = strstr(m, "http://127.0.0.1:")); m++) {
        char body[16384];
        int port = atoi(m + strlen("http://127.0.0.1:"));
        assert_int_equal(harness_http_get(port, "/metrics", body, sizeof body), 200);
        assert_non_null(strstr(body, "edl_agent_up 1") ? body : strstr(body, "edl_agent_up{"));
        scraped++;
    }
    assert_int_equal(scraped, 2);

    /* scale 2 -> 4: the two joins form one generation */
    const char *scale4[] = {"scale", job, "4", "--etcd", ep(), NULL};
    char out[8192];
    assert_int_equal(edl_cmd(out, sizeof out, scale4), 0);
    assert_non_null(strstr(out, "replicas 2 -> 4"));
    wait_running_after(job, g1, 4, 20000, &c);
    assert_int_equal(c.generation, g1 + 1);

    /* beyond what edl run starts on one machine: refused, and the job goes on untouched */
    const char *scale_huge[] = {"scale", job, "1025", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, scale_huge), 2);
    assert_non_null(strstr(out, "at most 1024"));
    harness_sleep_ms(500); /* time to change the job, which it must not do */
    int64_t g_before = c.generation;
    assert_true(read_generation(job, &c));
    assert_int_equal(c.generation, g_before);
    assert_int_equal(c.n_members, 4);
    assert_int_equal(c.state, EDL_JOB_RUNNING);

    /* edl status: a table with every rank */
    const char *st[] = {"status", job, NULL}; /* found through the state file */
    assert_int_equal(edl_cmd(out, sizeof out, st), 0);
    assert_non_null(strstr(out, "running, generation"));
    for (size_t i = 0; i < c.n_members; i++)
        assert_non_null(strstr(out, c.members[i].pod));

    /* scale 4 -> 3: the launcher stops the newest agent gracefully: a new generation at once */
    const char *scale3[] = {"scale", job, "3", NULL};
    int64_t g2 = c.generation;
    int64_t t0 = harness_now_ms();
    assert_int_equal(edl_cmd(NULL, 0, scale3), 0);
    wait_running_after(job, g2, 3, 20000, &c);
    printf("# scale 4 -> 3 (graceful leave): trainers running generation %lld after %lld ms\n",
           (long long)c.generation, (long long)(harness_now_ms() - t0));
    int64_t g3 = c.generation;
    char rank0[64];
    snprintf(rank0, sizeof rank0, "%s", c.members[0].pod);

    /* The agent of rank 1 freezes (SIGSTOP: a node that vanished; the launcher sees no exit):
     * noticed when its 2 s lease expires. Thawed, it finds its lease gone and joins again as
     * a new member after the settle window. (An agent that dies is the launcher's to report:
     * test_killed_agent_leaves_the_generation_at_once.) */
    char victim[64];
    snprintf(victim, sizeof victim, "%s", c.members[1].pod);
    pid_t frozen = agent_pid(job, victim);
    t0 = harness_now_ms();
    assert_int_equal(kill(frozen, SIGSTOP), 0);
    int64_t deadline = harness_now_ms() + 10000;
    while (harness_now_ms() < deadline &&
           !(read_generation(job, &c) && c.generation > g3 && !edl_generation_member_named(&c, victim)))
        harness_sleep_ms(20);
    int64_t took = harness_now_ms() - t0;
    assert_null(edl_generation_member_named(&c, victim));
    int64_t g4 = c.generation;
    printf("# agent frozen: out of the generation after %lld ms (lease TTL 2 s)\n",
           (long long)took);
    assert_true(took >= 1000); /* only the lease expiry (TTL after the last renewal) shows it */
    assert_int_equal(kill(frozen, SIGCONT), 0);
    wait_running_after(job, g4 - 1, 3, 20000, &c);
    assert_string_equal(c.members[0].pod, rank0); /* rank 0 kept its pod throughout */

    /* edl stop: the job ends as stopped; edl run exits 4 */
    const char *stop[] = {"stop", job, NULL};
    assert_int_equal(edl_cmd(out, sizeof out, stop), 0);
    assert_non_null(strstr(out, "stopped"));
    assert_int_equal(harness_wait_exit(run, 30000), 4);
    read_generation(job, &c);
    assert_int_equal(c.state, EDL_JOB_STOPPED);
    edl_generation_clear(&c);
}

static void test_standby_promoted_when_a_member_leaves(void **state)
{
    (void)state;
    const char *job = "standby";
    const char *opts[] = {"--np", "2:2", "--replicas", "3", "--etcd", ep(), "--settle-ms", "300",
                          "--grace-ms", "2000", NULL};
    pid_t run = edl_run(job, opts, "exec sleep 120");
    edl_generation c = {0};
    int64_t deadline = harness_now_ms() + 20000;
    while (harness_now_ms() < deadline &&
           !(read_generation(job, &c) && c.n_members == 2 && c.n_standbys == 1))
        harness_sleep_ms(20);
    assert_int_equal(c.n_standbys, 1);
    char standby[64], leaver[64];
    snprintf(standby, sizeof standby, "%s", c.standbys[0]);
    snprintf(leaver, sizeof leaver, "%s", c.members[1].pod);
    int64_t g = c.generation;
    int64_t t0 = harness_now_ms();
    signal_agent(job, leaver, SIGTERM);
    wait_running_after(job, g, 2, 10000, &c);
    assert_true(c.generation > g);
    assert_string_equal(c.members[1].pod, standby); /* promoted into the free rank */
    printf("# standby promoted and running %lld ms after a member's graceful leave\n",
           (long long)(harness_now_ms() - t0));
    kill(run, SIGTERM);
    assert_int_equal(harness_wait_exit(run, 30000), 143);
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
    assert_int_equal(harness_wait_exit(run, 30000), 1);
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
    assert_int_equal(harness_wait_exit(run, 30000), 143);
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
    assert_int_equal(harness_wait_exit(run, 60000), 0);
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
    assert_int_equal(harness_wait_exit(run, 90000), 0);
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
    assert_int_equal(harness_wait_exit(run, 30000), 4);
    edl_generation_clear(&c);
}

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
    assert_int_equal(harness_wait_exit(run, 90000), 0);
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
    assert_int_equal(harness_wait_exit(run, 30000), 4);
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
    assert_int_equal(harness_wait_exit(run, 60000), 0);
    int kept = 0;
    assert_int_equal(newest_checkpoint(dir, &kept), second + 20);
    assert_int_equal(kept, 3);

    const char *fresh[] = {"--np", "1", "--grace-ms", "1000", "--checkpoint-uri", uri, "--fresh",
                           NULL};
    const char *short_run[] = {EDL_EXAMPLE_TRAINER, "--steps", "10", "--step-ms", "5", NULL};
    run = edl_run_argv(job, fresh, short_run);
    assert_int_equal(resumed_at(job, 4, 30000), 0);
    assert_int_equal(harness_wait_exit(run, 60000), 0);
    assert_true(log_has(job, "--fresh: moved 3 checkpoints of", uri, "/previous-"));
    assert_int_equal(newest_checkpoint(dir, NULL), 10);
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
    harness_sleep_ms(1500); /* some training first: elastic_mlp reports no steps to wait for */
    const char *scale[] = {"scale", job, "3", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(NULL, 0, scale), 0);
    int64_t g1 = c.generation;
    wait_running_after(job, g1, 3, 20000, &c);
    assert_int_equal(trainer_pid(job, "mlp-0"), pid0); /* re-formed in process */
    assert_int_equal(trainer_pid(job, "mlp-1"), pid1);
    long pid2 = trainer_pid(job, "mlp-2");
    harness_sleep_ms(1500); /* some training in three first (no steps to wait for) */
    assert_int_equal(kill((pid_t)pid1, SIGKILL), 0); /* a trainer crashes mid-training */
    assert_int_equal(harness_wait_exit(run, 120000), 0);
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

static void test_usage_errors(void **state)
{
    (void)state;
    char out[4096];
    const char *help[] = {"--help", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, help), 0);
    assert_non_null(strstr(out, "scale JOB N"));
    const char *bad_np[] = {"run", "--np", "4:2", "--", "true", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, bad_np), 2);
    assert_non_null(strstr(out, "--np 4:2"));
    const char *no_trainer[] = {"run", "--np", "2", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, no_trainer), 2);
    const char *bad_scale[] = {"scale", "x", "-3", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, bad_scale), 2);
    if (!strstr(out, "non-negative number") || strstr(out, "invalid option"))
        fail_msg("edl scale x -3 does not say the count must be a non-negative number:\n%s", out);
    const char *bad_role[] = {"scale", "x", "3", "--role", "foo", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, bad_role), 2);
    assert_non_null(strstr(out, "unknown role foo (worker, ps or teacher)"));
    const char *no_job[] = {"status", "nosuchjob", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, no_job), 1);
    assert_non_null(strstr(out, "no job \"nosuchjob\""));
    /* no such local job (no state file), as --help says: 1 */
    const char *no_local_job[] = {"status", "nosuchjob", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, no_local_job), 1);
    assert_non_null(strstr(out, "no local job"));
    /* a prefix the agents would refuse is refused before anything starts */
    const char *bad_prefix[] = {"run", "--prefix", "noslash", "--np", "1", "--", "true", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, bad_prefix), 2);
    assert_non_null(strstr(out, "--prefix 'noslash': must start with '/'"));
    assert_null(strstr(out, "started etcd"));
    const char *unknown[] = {"frobnicate", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, unknown), 2);
    /* more agents than one machine's launcher starts: refused up front */
    const char *too_many[] = {"run", "--np", "1:2000", "--", "true", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, too_many), 2);
    assert_non_null(strstr(out, "at most 1024"));
    const char *too_many_replicas[] = {"run", "--np", "2", "--replicas", "1025", "--", "true",
                                       NULL};
    assert_int_equal(edl_cmd(out, sizeof out, too_many_replicas), 2);
    const char *bad_ps[] = {"run", "--np", "2", "--ps", "3:2", "--", "true", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, bad_ps), 2);
    assert_non_null(strstr(out, "--ps 3:2"));
    const char *bad_ps_replicas[] = {"run", "--np", "2", "--ps", "1:2", "--ps-replicas", "3",
                                     "--", "true", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, bad_ps_replicas), 2);
    assert_non_null(strstr(out, "ps.replicas is 3"));
    const char *ps_replicas_alone[] = {"run", "--np", "2", "--ps-replicas", "1", "--", "true",
                                       NULL};
    assert_int_equal(edl_cmd(out, sizeof out, ps_replicas_alone), 2);
    assert_non_null(strstr(out, "needs --ps"));
}

/* `edl status --json` prints one valid JSON document whatever the keys in etcd hold. */
static void test_status_json_is_json_whatever_etcd_holds(void **state)
{
    (void)state;
    const char *job = "oddnames";
    char k[256];
    harness_put(g_c, harness_job_key(k, sizeof k, job, EDL_KEY_SPEC, NULL, 0), "{\"min\":1}");
    const char *pod = "{\"role\":\"worker\",\"addr\":\"127.0.0.1\",\"port\":1}";
    harness_put(g_c, harness_job_key(k, sizeof k, job, EDL_KEY_POD, "ok", 0), pod);
    harness_put(g_c, harness_job_key(k, sizeof k, job, EDL_KEY_POD, "a\"b\\c\n", 0), pod);
    char out[8192];
    const char *status[] = {"status", job, "--json", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, status), 0);
    cJSON *o = cJSON_Parse(out);
    if (!o)
        fail_msg("edl status --json printed no valid JSON:\n%s", out);
    const cJSON *pods = cJSON_GetObjectItemCaseSensitive(o, "pods");
    assert_int_equal(cJSON_GetArraySize(pods), 1); /* the key that is no pod name is left out */
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(pods, 0), "name")
                            ->valuestring, "ok");
    cJSON_Delete(o);
    const char *table[] = {"status", job, "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, table), 0);
    assert_non_null(strstr(out, "1 keys under pods/ are no valid pod name"));
}

/* The state files live in a directory only this user can use: a directory open to others, a
 * link in its place, or a state file that is a link are refused, not followed. */
static void test_state_directory_must_be_private(void **state)
{
    (void)state;
    char saved[300], open_dir[300], link_dir[300], priv[300], file[400], target[400];
    snprintf(saved, sizeof saved, "%s", getenv("EDL_STATE_DIR"));
    snprintf(open_dir, sizeof open_dir, "%s/open-state", g_dir);
    snprintf(priv, sizeof priv, "%s/private-state", g_dir);
    snprintf(link_dir, sizeof link_dir, "%s/link-state", g_dir);
    assert_int_equal(mkdir(open_dir, 0700), 0);
    assert_int_equal(chmod(open_dir, 0777), 0);
    assert_int_equal(mkdir(priv, 0700), 0);
    assert_int_equal(symlink(priv, link_dir), 0);
    char out[4096], buf[256];
    const char *status[] = {"status", "sj", NULL};
    setenv("EDL_STATE_DIR", open_dir, 1);
    assert_int_equal(edl_cmd(out, sizeof out, status), 2);
    assert_non_null(strstr(out, "not a private directory"));
    /* edl run refuses it before it starts anything: a job that edl status, scale and stop
     * could not find would run on */
    const char *run[] = {"run", "--job", "sj", "--np", "1", "--etcd", ep(), "--", "true", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, run), 2);
    assert_non_null(strstr(out, "writable by others"));
    assert_null(harness_get(g_c, key("sj", EDL_KEY_SPEC, NULL), buf, sizeof buf));
    /* a directory of ours that others may read but not write (0755) is safe: the files in it
     * are 0600 and the certificates' directory 0700; it is used */
    char readable[300];
    snprintf(readable, sizeof readable, "%s/readable-state", g_dir);
    assert_int_equal(mkdir(readable, 0755), 0);
    assert_int_equal(chmod(readable, 0755), 0);
    setenv("EDL_STATE_DIR", readable, 1);
    const char *opts[] = {"--np", "1", "--etcd", ep(), NULL};
    pid_t sj = edl_run("sj", opts, "exec sleep 60");
    wait_local_running("sj", 1, 30000);
    const char *stop[] = {"stop", "sj", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, stop), 0);
    assert_int_equal(harness_wait_exit(sj, 30000), 4);
    setenv("EDL_STATE_DIR", link_dir, 1);
    assert_int_equal(edl_cmd(out, sizeof out, status), 2);
    assert_non_null(strstr(out, "symbolic link"));
    /* a private directory, but the state file is a link to somebody's file */
    setenv("EDL_STATE_DIR", priv, 1);
    snprintf(target, sizeof target, "%s/elsewhere", g_dir);
    FILE *f = fopen(target, "w");
    fprintf(f, "%s\n", ep());
    fclose(f);
    snprintf(file, sizeof file, "%s/sj.endpoints", priv);
    assert_int_equal(symlink(target, file), 0);
    assert_int_equal(edl_cmd(out, sizeof out, status), 2);
    assert_non_null(strstr(out, "cannot be read"));
    /* a state file that names a certificate no longer there: said before any connection */
    unlink(file);
    f = fopen(file, "w");
    fprintf(f, "EDL_ETCD_ENDPOINTS=https://127.0.0.1:1\nEDL_ETCD_CACERT=%s/gone/ca.crt\n"
               "EDL_ETCD_CERT=%s/gone/client.crt\nEDL_ETCD_KEY=%s/gone/client.key\n", g_dir,
            g_dir, g_dir);
    fclose(f);
    assert_int_equal(edl_cmd(out, sizeof out, status), 2);
    if (!strstr(out, "the state file of job \"sj\"") || !strstr(out, "/gone/ca.crt") ||
        !strstr(out, "No such file"))
        fail_msg("the missing file is not named as the state file's:\n%s", out);
    setenv("EDL_STATE_DIR", saved, 1);
}

/* ---- a local job: its own etcd, found through the state file ------------------------------ */

/* `edl stop` waits for the job server to record the stop; when the job's own etcd goes away
 * meanwhile (its launcher ended), it says so and returns at once instead of retrying a gone
 * etcd for ever. */
static void test_stop_returns_when_the_jobs_etcd_is_gone(void **state)
{
    (void)state;
    const char *job = "stopgone";
    const char *opts[] = {"--np", "1", "--grace-ms", "1000", NULL};
    pid_t run = edl_run(job, opts, "exec sleep 120");
    wait_local_running(job, 1, 30000);
    pid_t js = child_named(run, "edl-jobserver");
    assert_true(js > 0);
    assert_int_equal(kill(js, SIGSTOP), 0); /* nobody records the stop while etcd lives */
    char log[300], out[8192];
    snprintf(log, sizeof log, "%s/stopgone-stop.log", g_dir);
    const char *argv[] = {EDL_CLI_BIN, "stop", job, NULL};
    pid_t stop = harness_spawn(argv, log);
    assert_true(stop > 0);
    harness_sleep_ms(1500); /* time to return too early, which it must not do */
    assert_int_equal(harness_wait_exit(stop, 0), -1); /* still waiting */
    kill(run, SIGTERM); /* the launcher ends, and its etcd with it */
    assert_int_equal(harness_wait_exit(run, 30000), 143);
    int64_t t0 = harness_now_ms();
    int rc = harness_wait_exit(stop, 15000);
    if (rc == -1) {
        harness_kill(stop, SIGKILL);
        fail_msg("edl stop still waits 15 s after the job's etcd went away:\n%s",
                 harness_read_file(log, out, sizeof out));
    }
    harness_read_file(log, out, sizeof out);
    print_message("edl stop returned %lld ms after the launcher exited: %s",
                  (long long)(harness_now_ms() - t0), out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "etcd is gone"));
}

/* Ctrl-C in the terminal signals the whole foreground process group: edl run stops the agents
 * (and their trainers) first, then the job server, then its etcd, so nobody loses etcd on the
 * way out, and its summary is the last line. */
static void test_ctrl_c_stops_the_job_in_order(void **state)
{
    (void)state;
    const char *job = "ctrlc";
    const char *opts[] = {"--np", "2", "--grace-ms", "2000", NULL};
    const char *trainer[] = {"/bin/sh", "-c", "exec sleep 120", NULL};
    pid_t run = edl_run_in(job, opts, trainer, true);
    wait_local_running(job, 2, 30000);
    int64_t t0 = harness_now_ms();
    assert_int_equal(kill(-run, SIGINT), 0);
    int rc = harness_wait_exit(run, 30000);
    int64_t took = harness_now_ms() - t0;
    char log[300], text[65536];
    snprintf(log, sizeof log, "%s/%s.log", g_dir, job);
    harness_read_file(log, text, sizeof text);
    print_message("Ctrl-C: edl run exited %d after %lld ms\n", rc, (long long)took);
    assert_int_equal(rc, 130);
    if (strstr(text, "Couldn't connect") || strstr(text, "lost"))
        fail_msg("a process lost etcd on the way out:\n%s", text);
    assert_true(took < 5000);
    char *end = text + strlen(text);
    while (end > text && end[-1] == '\n')
        *--end = '\0';
    char *last = strrchr(text, '\n');
    last = last ? last + 1 : text;
    if (!strstr(last, "job ctrlc interrupted after"))
        fail_msg("the summary is not the last line: \"%s\"", last);
}

/* A second `edl run` of a job that runs on this machine is refused (it would take the state
 * file of the first, then delete it); the state left by a launcher that was killed outright is
 * taken over, and said so. */
static void test_second_launcher_of_a_job_is_refused(void **state)
{
    (void)state;
    const char *job = "twice";
    const char *opts[] = {"--np", "1", NULL};
    pid_t first = edl_run(job, opts, "exec sleep 120");
    wait_local_running(job, 1, 30000);
    char out[16384], pid[32];
    const char *again[] = {"run", "--job", job, "--np", "1", "--", "true", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, again), 2);
    snprintf(pid, sizeof pid, "pid %d", (int)first);
    if (!strstr(out, "already running") || !strstr(out, pid))
        fail_msg("no clear refusal naming %s:\n%s", pid, out);
    assert_null(strstr(out, "started etcd"));
    const char *st[] = {"status", job, NULL};
    assert_int_equal(edl_cmd(out, sizeof out, st), 0); /* the first one's state is intact */
    assert_non_null(strstr(out, "running, generation"));
    harness_kill(first, SIGKILL); /* no clean-up: its state file stays */
    assert_int_equal(edl_cmd(out, sizeof out, st), 1); /* not its dead etcd, tried for seconds */
    assert_non_null(strstr(out, "has ended"));
    assert_int_equal(edl_cmd(out, sizeof out, again), 0);
    if (!strstr(out, "taking over"))
        fail_msg("the stale state was not said to be taken over:\n%s", out);
}

/* `edl service list` finds a local job's etcd through its state file, as status does. */
static void test_service_commands_find_a_local_jobs_etcd(void **state)
{
    (void)state;
    const char *job = "svcjob";
    const char *opts[] = {"--np", "1", NULL};
    pid_t run = edl_run(job, opts, "exec sleep 120");
    wait_local_running(job, 1, 30000);
    char out[8192];
    const char *reg[] = {"service", "register", "--service", "lsvc", "--instance", "t1",
                         "--endpoint", "http://127.0.0.1:9", "--job", job, NULL};
    assert_int_equal(edl_cmd(out, sizeof out, reg), 0);
    const char *list[] = {"service", "list", "--service", "lsvc", NULL}; /* the only local job */
    assert_int_equal(edl_cmd(out, sizeof out, list), 0);
    assert_non_null(strstr(out, "http://127.0.0.1:9"));
    const char *stop[] = {"stop", job, NULL};
    assert_int_equal(edl_cmd(out, sizeof out, stop), 0);
    assert_int_equal(harness_wait_exit(run, 30000), 4);
}

/* An agent killed outright leaves nothing behind: its private directory (the trainer's
 * TORCHELASTIC_ERROR_FILE) is in the launcher's directory of this run, removed at the end.
 * Only the job's logs (<job>.logs, for edl logs) stay. */
static void test_killed_agents_leave_no_directories(void **state)
{
    (void)state;
    const char *job = "scratch";
    char tmp[300], cmd[800], out[4096];
    snprintf(tmp, sizeof tmp, "%s/tmp", g_dir);
    assert_int_equal(mkdir(tmp, 0700), 0);
    setenv("TMPDIR", tmp, 1);
    const char *opts[] = {"--np", "1", "--etcd", ep(), "--ttl", "2", "--settle-ms", "300",
                          "--grace-ms", "1000", NULL};
    pid_t run = edl_run(job, opts, "exec sleep 120");
    unsetenv("TMPDIR");
    edl_generation c = {0};
    wait_running(job, 1, 20000, &c);
    signal_agent(job, c.members[0].pod, SIGKILL);
    wait_running_after(job, c.generation, 1, 20000, &c); /* its replacement */
    const char *stop[] = {"stop", job, "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, stop), 0);
    assert_int_equal(harness_wait_exit(run, 30000), 4);
    snprintf(cmd, sizeof cmd, "ls -A %s; ls -A %s | grep '^%s' | grep -vx '%s.logs' || true",
             tmp, getenv("EDL_STATE_DIR"), job, job);
    assert_int_equal(harness_shell(cmd, out, sizeof out), 0);
    if (*out)
        fail_msg("left behind:\n%s", out);
    edl_generation_clear(&c);
}

/* edl status: rows in rank order (workers, then servers, standbys, the rest), each pod's
 * trainer STARTS apart from the job's RESTARTS (failures), and when an exclusion ends. */
static void test_status_rows_in_rank_order_with_starts_and_exclusions(void **state)
{
    (void)state;
    const char *job = "ranked";
    char k[256];
    harness_put(g_c, harness_job_key(k, sizeof k, job, EDL_KEY_SPEC, NULL, 0),
                "{\"min\":2,\"max\":3}");
    const char *pods[] = {"zz-b", "mm-x", "aa-a"}; /* registered in this order */
    for (int i = 0; i < 3; i++) {
        char v[256];
        snprintf(v, sizeof v, "{\"role\":\"worker\",\"addr\":\"127.0.0.1\",\"port\":%d}",
                 7000 + i);
        harness_put(g_c, harness_job_key(k, sizeof k, job, EDL_KEY_POD, pods[i], 0), v);
    }
    harness_put(g_c, harness_job_key(k, sizeof k, job, EDL_KEY_STATUS, "aa-a", 0),
                "{\"generation\":3,\"state\":\"running\",\"step\":5,\"restarts\":2}");
    edl_member m[2] = {{.pod = "aa-a", .rank = 0, .addr = "127.0.0.1", .port = 7002},
                       {.pod = "zz-b", .rank = 1, .addr = "127.0.0.1", .port = 7000}};
    int64_t until = (int64_t)time(NULL) * 1000 + 90000;
    edl_pod_failures f = {.pod = "mm-x", .count = 2, .excluded_until = until};
    edl_generation g = {.generation = 3, .state = EDL_JOB_RUNNING, .reason = "test",
                        .members = m, .n_members = 2, .failures = &f, .n_failures = 1,
                        .restarts = 1};
    char *json = edl_generation_to_json(&g);
    harness_put(g_c, harness_job_key(k, sizeof k, job, EDL_KEY_GENERATION, NULL, 0), json);
    free(json);
    char out[8192];
    const char *st[] = {"status", job, "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, st), 0);
    print_message("%s", out);
    assert_non_null(strstr(out, "1 restarts after trainer failures"));
    assert_non_null(strstr(out, " STARTS "));
    char *a = strstr(out, "\n0      aa-a"), *b = strstr(out, "\n1      zz-b");
    char *x = strstr(out, "\nexcluded mm-x");
    if (!a || !b || !x || !(a < b && b < x))
        fail_msg("rows not in rank order:\n%s", out);
    assert_non_null(strstr(a, " 3        ")); /* aa-a's trainer started 3 times */
    char hhmm[16];
    time_t t = (time_t)(until / 1000);
    strftime(hhmm, sizeof hhmm, "%H:%M:%S", localtime(&t));
    char *line = strstr(out, "mm-x: excluded until ");
    if (!line || !strstr(line, hhmm))
        fail_msg("no \"mm-x: excluded until %s\" in:\n%s", hhmm, out);
}

/* scripts/demo on the build tree as it is: its job succeeds, and the agent it kills is the one
 * whose pid the job registered, not every process of this user with "--pod demo-1" on its
 * command line (another demo's: here a decoy that must survive). */
static void test_demo_kills_only_its_own_agent(void **state)
{
    (void)state;
    char build[600], log[300], out[65536];
    snprintf(build, sizeof build, "%s", EDL_CLI_BIN); /* <build>/bin/edl */
    for (int i = 0; i < 2; i++)
        *strrchr(build, '/') = '\0';
    const char *decoy_argv[] = {"/bin/sh", "-c", "sleep 300; :", "decoy", "--pod", "demo-1",
                                "x", NULL};
    snprintf(log, sizeof log, "%s/decoy.log", g_dir);
    pid_t decoy = harness_spawn_group(decoy_argv, log); /* its sleep goes with its group */
    assert_true(decoy > 0);
    snprintf(log, sizeof log, "%s/demo.log", g_dir);
    const char *demo[] = {EDL_SOURCE_DIR "/scripts/demo", "--no-setup", "--build", build, NULL};
    int rc = harness_run(demo, log, 240000, out, sizeof out);
    bool decoy_alive = harness_wait_exit(decoy, 0) == -1;
    kill(-decoy, SIGKILL);
    harness_wait_exit(decoy, 5000);
    if (rc != 0)
        fail_msg("scripts/demo exited %d:\n%s", rc, out);
    assert_non_null(strstr(out, "demo: the agent of demo-1 is pid "));
    assert_non_null(strstr(out, "demo: OK"));
    if (!decoy_alive)
        fail_msg("scripts/demo killed a process that was not its own");
}

/* ---- manifests (edl run -f) ---------------------------------------------------------------- */

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A TrainingJob whose settings all differ from edl run's defaults, with a trainer that records
 * where it ran and what it was given; the flag beside -f overrides the manifest. */
static void test_manifest_runs_with_its_settings(void **state)
{
    (void)state;
    char path[300], text[3000], wd[300];
    snprintf(wd, sizeof wd, "%s/manifest-wd", g_dir);
    assert_int_equal(mkdir(wd, 0755), 0);
    snprintf(path, sizeof path, "%s/job.yaml", g_dir);
    snprintf(text, sizeof text,
             "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: other}\n---\n"
             "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\n"
             "metadata:\n  name: manifest-job\n  namespace: ml\n"
             "spec:\n  replicas: 2\n  minReplicas: 2\n  maxReplicas: 3\n"
             "  elastic:\n    settleWindow: 300ms\n    leaseTTLSeconds: 4\n"
             "    restartPolicy: ExitCode\n    permanentExitCodes: [3, 42]\n"
             "    maxRestarts: 3\n    exclusion: {afterFailures: 4, cooldown: 2s}\n"
             "  checkpoint:\n    uri: file://%s/ckpt\n"
             "  template:\n    spec:\n      nodeSelector: {gpu: a100}\n      containers:\n"
             "        - name: trainer\n          image: example/trainer:1\n"
             "          command: [/bin/sh, -c]\n"
             "          args: ['pwd > out-$EDL_RANK.txt; echo \"$GREETING\" >> out-$EDL_RANK.txt;"
             " echo \"$EDL_CHECKPOINT_URI\" >> out-$EDL_RANK.txt']\n"
             "          workingDir: %s\n"
             "          env:\n            - {name: GREETING, value: hello manifest}\n"
             "            - name: FROM_CLUSTER\n              valueFrom: {fieldRef: {fieldPath: x}}\n",
             g_dir, wd);
    write_text(path, text);
    char out[16384];
    const char *run[] = {"run", "-f", path, "--etcd", ep(), "--max-restarts", "7", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, run), 0);
    char want[400];
    snprintf(want, sizeof want, "%s:1: skipping a document of kind ConfigMap", path);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof want, "%s:9: ignoring metadata.namespace (only meaningful on a "
             "cluster)", path);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof want, "%s:25: ignoring spec.template.spec.nodeSelector", path);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof want, "%s:28: ignoring spec.template.spec.containers[0].image", path);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "ignoring spec.template.spec.containers[0].env[1].valueFrom"));
    assert_non_null(strstr(out, "job manifest-job: min 2, max 3, replicas 2"));
    assert_non_null(strstr(out, "job manifest-job succeeded"));
    /* the spec the job ran with */
    char buf[4096], err[256];
    edl_job_spec sp;
    edl_spec_init(&sp);
    assert_non_null(harness_get(g_c, key("manifest-job", EDL_KEY_SPEC, NULL), buf, sizeof buf));
    assert_int_equal(edl_spec_parse(buf, strlen(buf), &sp, err, sizeof err), 0);
    assert_int_equal(sp.min, 2);
    assert_int_equal(sp.max, 3);
    assert_int_equal(sp.replicas, 2);
    assert_int_equal(sp.settle_ms, 300);
    assert_int_equal(sp.ttl_s, 4);
    assert_int_equal(sp.restart_policy, EDL_RESTART_EXIT_CODE);
    assert_true(edl_exit_code_in(sp.permanent_codes, 42));
    assert_false(edl_exit_code_in(sp.permanent_codes, 1));
    assert_int_equal(sp.max_restarts, 7); /* the flag, not the manifest's 3 */
    assert_int_equal(sp.exclude_after, 4);
    assert_int_equal(sp.cooldown_ms, 2000);
    snprintf(want, sizeof want, "file://%s/ckpt", g_dir);
    assert_string_equal(sp.checkpoint_uri, want);
    edl_spec_clear(&sp);
    /* each rank ran in workingDir with the manifest's env */
    for (int r = 0; r < 2; r++) {
        char file[400], line[3][400];
        snprintf(file, sizeof file, "%s/out-%d.txt", wd, r);
        FILE *f = fopen(file, "r");
        assert_non_null(f);
        for (int i = 0; i < 3; i++) {
            assert_non_null(fgets(line[i], sizeof line[i], f));
            line[i][strcspn(line[i], "\n")] = '\0';
        }
        fclose(f);
        assert_string_equal(line[0], wd);
        assert_string_equal(line[1], "hello manifest");
        assert_string_equal(line[2], want);
    }
}

/* A bad manifest names file, line and field, exits 2 and starts nothing. */
static void test_manifest_errors_exit_2_and_start_nothing(void **state)
{
    (void)state;
    char path[300], out[8192], want[400];
    snprintf(path, sizeof path, "%s/bad.yaml", g_dir);
    write_text(path, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n"
                     "  name: bad-manifest\nspec:\n  elastic:\n    settleWindow: 1x\n"
                     "  template:\n    spec:\n      containers:\n        - name: t\n"
                     "          command: [/bin/true]\n");
    const char *run[] = {"run", "-f", path, "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, run), 2);
    snprintf(want, sizeof want, "%s:7: spec.elastic.settleWindow: is \"1x\"", path);
    if (!strstr(out, want))
        fail_msg("no \"%s\" in:\n%s", want, out);
    assert_null(strstr(out, "started etcd"));
    char buf[256];
    assert_null(harness_get(g_c, key("bad-manifest", EDL_KEY_SPEC, NULL), buf, sizeof buf));

    /* no command: the error says why edl needs one */
    write_text(path, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n"
                     "  name: bad-manifest\nspec:\n  template:\n    spec:\n      containers:\n"
                     "        - name: t\n          image: x\n");
    assert_int_equal(edl_cmd(out, sizeof out, run), 2);
    snprintf(want, sizeof want, "%s:9: spec.template.spec.containers[0].command: is required",
             path);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "entrypoint"));
    /* a trainer not to be found */
    write_text(path, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n"
                     "  name: bad-manifest\nspec:\n  template:\n    spec:\n      containers:\n"
                     "        - name: t\n          command: [no-such-trainer-xyz]\n");
    assert_int_equal(edl_cmd(out, sizeof out, run), 2);
    assert_non_null(strstr(out, "containers[0].command[0]: \"no-such-trainer-xyz\" is not on "
                                "PATH"));
    /* suspended */
    write_text(path, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n"
                     "  name: bad-manifest\nspec:\n  suspend: true\n  template:\n    spec:\n"
                     "      containers:\n        - name: t\n          command: [/bin/true]\n");
    assert_int_equal(edl_cmd(out, sizeof out, run), 2);
    snprintf(want, sizeof want, "%s:6: spec.suspend: is true", path);
    assert_non_null(strstr(out, want));
    /* a field the CRD does not know (a typo; another operator's runPolicy): refused as kubectl
     * refuses it, not run with the default in its place */
    write_text(path, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n"
                     "  name: bad-manifest\nspec:\n  maxReplica: 3\n  template:\n    spec:\n"
                     "      containers:\n        - name: t\n          command: [/bin/true]\n");
    assert_int_equal(edl_cmd(out, sizeof out, run), 2);
    snprintf(want, sizeof want, "%s:6: spec.maxReplica: unknown field \"spec.maxReplica\"", path);
    if (!strstr(out, want))
        fail_msg("no \"%s\" in:\n%s", want, out);
    write_text(path, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n"
                     "  name: bad-manifest\nspec:\n  runPolicy:\n    cleanPodPolicy: None\n"
                     "  template:\n    spec:\n"
                     "      containers:\n        - name: t\n          command: [/bin/true]\n");
    assert_int_equal(edl_cmd(out, sizeof out, run), 2);
    snprintf(want, sizeof want, "%s:6: spec.runPolicy: unknown field \"spec.runPolicy\"", path);
    assert_non_null(strstr(out, want));
    /* a trainer on the command line as well */
    const char *both[] = {"run", "-f", path, "--", "/bin/true", NULL};
    write_text(path, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n"
                     "  name: bad-manifest\nspec:\n  template:\n    spec:\n"
                     "      containers:\n        - name: t\n          command: [/bin/true]\n");
    assert_int_equal(edl_cmd(out, sizeof out, both), 2);
    assert_non_null(strstr(out, "the trainer's command comes from the manifest"));
    /* YAML errors, a file without a TrainingJob, no file */
    write_text(path, "kind: TrainingJob\nmetadata: {name: a}\nmetadata: {name: b}\n");
    assert_int_equal(edl_cmd(out, sizeof out, run), 2);
    snprintf(want, sizeof want, "%s:3:1: duplicate key \"metadata\"", path);
    assert_non_null(strstr(out, want));
    write_text(path, "apiVersion: v1\nkind: Service\n");
    assert_int_equal(edl_cmd(out, sizeof out, run), 2);
    assert_non_null(strstr(out, "no TrainingJob in it"));
    const char *missing[] = {"run", "-f", "/nonexistent/job.yaml", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, missing), 2);
    assert_non_null(strstr(out, "/nonexistent/job.yaml: No such file"));
    assert_null(harness_get(g_c, key("bad-manifest", EDL_KEY_SPEC, NULL), buf, sizeof buf));
}

/* activeDeadlineSeconds: the job is stopped when it passes and counts as failed. */
static void test_manifest_deadline_fails_the_job(void **state)
{
    (void)state;
    char path[300], out[16384];
    snprintf(path, sizeof path, "%s/deadline.yaml", g_dir);
    write_text(path, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n"
                     "  name: manifest-deadline\nspec:\n  activeDeadlineSeconds: 2\n"
                     "  elastic: {settleWindow: 200ms}\n"
                     "  template:\n    spec:\n      containers:\n        - name: t\n"
                     "          command: [/bin/sleep, '60']\n");
    const char *run[] = {"run", "-f", path, "--etcd", ep(), "--grace-ms", "1000", NULL};
    int64_t t0 = harness_now_ms();
    assert_int_equal(edl_cmd(out, sizeof out, run), 1);
    assert_true(harness_now_ms() - t0 < 30000);
    assert_non_null(strstr(out, "activeDeadlineSeconds (2 s) passed"));
}

/* A file:// checkpoint under a volume the container mounts (the examples' shared claim at a
 * fixed /tmp path) is this user's directory here, not a path every user of the host shares. */
static void test_manifest_volume_is_this_users(void **state)
{
    (void)state;
    char path[300], text[2000], tmp[300], shared[300], want[600], out[16384], buf[4096];
    snprintf(tmp, sizeof tmp, "%s/vtmp", g_dir);
    assert_int_equal(mkdir(tmp, 0700), 0);
    snprintf(shared, sizeof shared, "/tmp/edl-shared-test-%d", (int)getpid());
    snprintf(path, sizeof path, "%s/vol.yaml", g_dir);
    snprintf(text, sizeof text,
             "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: vol-job\n"
             "spec:\n  checkpoint:\n    uri: file://%s/vol-job\n"
             "  template:\n    spec:\n      containers:\n        - name: t\n"
             "          command: [/bin/true]\n"
             "          volumeMounts:\n            - {name: shared, mountPath: %s}\n"
             "      volumes:\n        - name: shared\n"
             "          persistentVolumeClaim: {claimName: team-claim}\n", shared, shared);
    write_text(path, text);
    setenv("TMPDIR", tmp, 1);
    const char *run[] = {"run", "-f", path, "--etcd", ep(), NULL};
    int rc = edl_cmd(out, sizeof out, run);
    unsetenv("TMPDIR");
    if (rc != 0)
        fail_msg("edl run -f exited %d:\n%s", rc, out);
    snprintf(want, sizeof want, "file://%s/edl-volumes-%u/team-claim/vol-job", tmp,
             (unsigned)getuid());
    edl_job_spec sp;
    edl_spec_init(&sp);
    char err[256];
    assert_non_null(harness_get(g_c, key("vol-job", EDL_KEY_SPEC, NULL), buf, sizeof buf));
    assert_int_equal(edl_spec_parse(buf, strlen(buf), &sp, err, sizeof err), 0);
    if (!sp.checkpoint_uri || strcmp(sp.checkpoint_uri, want) != 0)
        fail_msg("checkpoint URI %s, not this user's %s:\n%s", sp.checkpoint_uri, want, out);
    edl_spec_clear(&sp);
    assert_non_null(strstr(out, "spec.checkpoint.uri"));
    assert_non_null(strstr(out, want));
    struct stat st;
    snprintf(want, sizeof want, "%s/edl-volumes-%u", tmp, (unsigned)getuid());
    assert_int_equal(lstat(want, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_not_equal(lstat(shared, &st), 0); /* nothing in the host-wide path */
    /* --checkpoint-uri overrides the manifest's: no volume directory is made for it */
    char own[400], tmp2[300];
    snprintf(tmp2, sizeof tmp2, "%s/vtmp2", g_dir);
    assert_int_equal(mkdir(tmp2, 0700), 0);
    snprintf(own, sizeof own, "file://%s/own-ckpt", g_dir);
    const char *run_own[] = {"run", "-f", path, "--etcd", ep(), "--checkpoint-uri", own, NULL};
    setenv("TMPDIR", tmp2, 1);
    rc = edl_cmd(out, sizeof out, run_own);
    unsetenv("TMPDIR");
    assert_int_equal(rc, 0);
    assert_null(strstr(out, "is on the volume"));
    snprintf(want, sizeof want, "%s/edl-volumes-%u", tmp2, (unsigned)getuid());
    assert_int_not_equal(lstat(want, &st), 0);
}

/* The repository's example manifest runs as it is (the trainer found beside edl's build). */
static void test_manifest_example_runs(void **state)
{
    (void)state;
    char path[600], uri[400], out[32768];
    /* the source tree's own path (not __FILE__, relative to the build directory), so the test
     * passes whatever directory it runs from */
    snprintf(path, sizeof path, "%s/deploy/k8s/examples/elastic-mnist.yaml", EDL_SOURCE_DIR);
    snprintf(uri, sizeof uri, "file://%s/example", g_dir); /* not the shared /tmp path */
    const char *run[] = {"run", "-f", path, "--etcd", ep(), "--checkpoint-uri", uri, NULL};
    int rc = edl_cmd(out, sizeof out, run);
    if (rc != 0)
        fail_msg("edl run -f %s exited %d:\n%s", path, rc, out);
    assert_non_null(strstr(out, "job elastic-mnist succeeded"));
    assert_non_null(strstr(out, "rank 0: done after 200 steps"));
}

/* ---- parameter servers --------------------------------------------------------------------- */

/* The pids (second field) of a starts file's lines, in order; returns how many. */
static int start_pids(const char *path, long *pids, int max)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    int n = 0;
    while (f && n < max && fgets(line, sizeof line, f)) {
        char pod[128];
        if (sscanf(line, "%127s %ld", pod, &pids[n]) == 2)
            n++;
    }
    if (f)
        fclose(f);
    return n;
}

/* Wait for a running generation with n_members workers and n_servers servers. */
static void wait_servers(const char *job, size_t n_servers, int timeout_ms, edl_generation *c)
{
    int64_t deadline = harness_now_ms() + timeout_ms;
    while (harness_now_ms() < deadline) {
        if (read_generation(job, c) && c->state == EDL_JOB_RUNNING && c->n_servers == n_servers)
            return;
        harness_sleep_ms(20);
    }
    fail_msg("job %s: no running generation with %zu servers within %d ms (generation %lld, "
             "%zu servers)", job, n_servers, timeout_ms, (long long)c->generation,
             c->n_servers);
}

/* The pid a pod's status reports for generation gen while running (0: not so). */
static long running_pid(const char *job, const char *pod, int64_t gen)
{
    char buf[2048], err[128];
    edl_pod_status st;
    if (!harness_get(g_c, key(job, EDL_KEY_STATUS, pod), buf, sizeof buf) ||
        edl_pod_status_parse(buf, strlen(buf), &st, err, sizeof err) != 0 ||
        st.generation != gen || st.state != EDL_TRAINER_RUNNING)
        return 0;
    return (long)st.pid;
}

/* `edl run --np 2 --ps 2:3 --ps-replicas 2`: one trainer command in both roles (it reads
 * TRAINING_ROLE); the job runs once two servers are there, the workers see both; `edl scale JOB
 * 3 --role ps` adds a server in a new generation without restarting a worker or a server;
 * the workers exit 0 and the job succeeds, the servers are stopped with it. */
static void test_ps_role_end_to_end(void **state)
{
    (void)state;
    const char *job = "psjob";
    char script[1400], ws[300], ps[300], go[300];
    snprintf(ws, sizeof ws, "%s/w.starts", g_dir);
    snprintf(ps, sizeof ps, "%s/ps.starts", g_dir);
    snprintf(go, sizeof go, "%s/go", g_dir);
    snprintf(script, sizeof script,
             "d=%s; env > $d/env.$EDL_POD_ID; "
             "if [ \"$TRAINING_ROLE\" = PSERVER ]; then "
             "echo \"$EDL_POD_ID $$ $EDL_PS_INDEX $PADDLE_PSERVERS_IP_PORT_LIST $PADDLE_PORT "
             "$POD_IP $PADDLE_TRAINERS_NUM\" >> $d/ps.starts; trap 'exit 0' TERM; "
             "while :; do sleep 0.05; done; fi; "
             "case \"$PADDLE_PSERVERS_IP_PORT_LIST\" in *:*,*:*) ;; *) exit 7;; esac; "
             "echo \"$EDL_POD_ID $$ $EDL_RANK $PADDLE_PSERVERS_IP_PORT_LIST $EDL_PS_SERVERS\" "
             ">> $d/w.starts; while [ ! -f $d/go ]; do sleep 0.05; done; exit 0",
             g_dir);
    const char *opts[] = {"--np", "2", "--ps", "2:3", "--ps-replicas", "2", "--etcd", ep(),
                          "--settle-ms", "300", "--grace-ms", "2000", NULL};
    pid_t run = edl_run(job, opts, script);
    edl_generation c = {0};
    wait_running(job, 2, 30000, &c);
    assert_int_equal(c.n_servers, 2);
    int64_t g1 = c.generation;
    long wp[8], sp[8];
    int64_t end = harness_now_ms() + 5000;
    while (harness_now_ms() < end && (start_pids(ws, wp, 8) < 2 || start_pids(ps, sp, 8) < 2))
        harness_sleep_ms(20);
    assert_int_equal(start_pids(ws, wp, 8), 2);
    assert_int_equal(start_pids(ps, sp, 8), 2);
    /* the workers see both servers in rank order; each server its own index and port */
    char list[256], v[512], path[300];
    snprintf(list, sizeof list, "%s:%d,%s:%d", c.servers[0].addr, c.servers[0].port,
             c.servers[1].addr, c.servers[1].port);
    for (int s = 0; s < 2; s++) {
        snprintf(path, sizeof path, "%s/env.%s", g_dir, c.servers[s].pod);
        assert_non_null(strstr(c.servers[s].pod, "psjob-ps-"));
        assert_string_equal(env_value(path, "TRAINING_ROLE", v, sizeof v), "PSERVER");
        assert_string_equal(env_value(path, "PADDLE_PSERVERS_IP_PORT_LIST", v, sizeof v), list);
        char want[16];
        snprintf(want, sizeof want, "%d", s);
        assert_string_equal(env_value(path, "EDL_PS_INDEX", v, sizeof v), want);
        snprintf(want, sizeof want, "%d", c.servers[s].port);
        assert_string_equal(env_value(path, "PADDLE_PORT", v, sizeof v), want);
        assert_string_equal(env_value(path, "PADDLE_TRAINERS_NUM", v, sizeof v), "2");
        assert_null(env_value(path, "RANK", v, sizeof v));
        assert_null(env_value(path, "PADDLE_TRAINER_ID", v, sizeof v));
    }
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof path, "%s/env.%s", g_dir, c.members[r].pod);
        assert_string_equal(env_value(path, "TRAINING_ROLE", v, sizeof v), "TRAINER");
        assert_string_equal(env_value(path, "PADDLE_PSERVERS_IP_PORT_LIST", v, sizeof v), list);
        assert_string_equal(env_value(path, "EDL_PS_SERVERS", v, sizeof v), "2");
    }

    /* a third server: a new generation, the same workers and servers keep their processes */
    char out[8192];
    const char *scale3[] = {"scale", job, "3", "--role", "ps", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, scale3), 0);
    assert_non_null(strstr(out, "ps replicas 2 -> 3"));
    wait_servers(job, 3, 20000, &c);
    assert_true(c.generation > g1);
    assert_int_equal(c.n_members, 2);
    end = harness_now_ms() + 5000; /* the agents report their trainers in the new generation */
    while (harness_now_ms() < end && !(running_pid(job, c.members[0].pod, c.generation) &&
                                       running_pid(job, c.members[1].pod, c.generation) &&
                                       running_pid(job, c.servers[2].pod, c.generation)))
        harness_sleep_ms(20);
    for (int r = 0; r < 2; r++) {
        long pid = running_pid(job, c.members[r].pod, c.generation);
        assert_true(pid == wp[0] || pid == wp[1]); /* the trainer of the first start */
    }
    for (int s = 0; s < 2; s++) {
        long pid = running_pid(job, c.servers[s].pod, c.generation);
        assert_true(pid == sp[0] || pid == sp[1]);
    }
    harness_sleep_ms(500); /* time to restart a worker, which it must not do */
    assert_int_equal(start_pids(ws, wp, 8), 2); /* no worker restarted */
    assert_int_equal(start_pids(ps, sp, 8), 3); /* only the new server started */
    assert_true(log_has(job, "edl", "3 servers [", NULL));

    /* edl status shows the servers; beyond ps max, or without a ps role: refused */
    const char *st[] = {"status", job, "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, st), 0);
    assert_non_null(strstr(out, "3 servers"));
    assert_non_null(strstr(out, "ps 2"));
    assert_non_null(strstr(out, "ps min 2, max 3, replicas 3"));
    const char *st_json[] = {"status", job, "--json", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, st_json), 0);
    assert_non_null(strstr(out, "\"servers\":["));
    const char *scale9[] = {"scale", job, "9", "--role", "ps", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, scale9), 2);
    assert_non_null(strstr(out, "beyond its ps max 3"));
    harness_put(g_c, key("nops", EDL_KEY_SPEC, NULL), "{\"min\":1}");
    const char *scale_nops[] = {"scale", "nops", "1", "--role", "ps", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, scale_nops), 2);
    assert_non_null(strstr(out, "has no ps role"));
    const char *bad_role[] = {"scale", job, "1", "--role", "teacher", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, bad_role), 2);

    /* the workers finish: success is theirs; the servers are stopped with the job */
    FILE *f = fopen(go, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(harness_wait_exit(run, 30000), 0);
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_SUCCEEDED);
    for (int s = 0; s < 3; s++)
        assert_int_equal(kill((pid_t)sp[s], 0), -1);
    edl_generation_clear(&c);
}

/* ---- teachers ------------------------------------------------------------------------------ */

/* The teachers' records of a service (names into names[], up to max); how many. */
static size_t teacher_names(const char *service, char names[][64], size_t max)
{
    edl_service_instance *list = NULL;
    size_t n = 0;
    int64_t rev;
    if (edl_service_list(g_c, NULL, service, &list, &n, &rev) != 0)
        return 0;
    for (size_t i = 0; i < n && i < max; i++)
        snprintf(names[i], 64, "%s", list[i].name);
    edl_service_list_free(list, n);
    return n;
}

static void wait_teachers(const char *service, size_t n, int timeout_ms)
{
    char names[8][64];
    int64_t end = harness_now_ms() + timeout_ms;
    while (harness_now_ms() < end && teacher_names(service, names, 8) != n)
        harness_sleep_ms(50);
    if (teacher_names(service, names, 8) != n)
        fail_msg("service %s: not %zu teachers within %d ms (%zu)", service, n, timeout_ms,
                 teacher_names(service, names, 8));
}

/* `edl run --np 1 --teachers 1:3 --service tsvc --teacher-replicas 1`: the same command as a
 * teacher (EDL_ROLE_NAME) registers once it serves; `edl scale --role teacher` 1 -> 3 -> 2
 * starts and stops teacher agents, never touching the generation; edl status lists them; bad
 * counts are refused; the job ends by its worker and the teachers leave the service. */
static void test_teacher_role_end_to_end(void **state)
{
    (void)state;
    const char *job = "tjob";
    char script[1400], go[300];
    snprintf(go, sizeof go, "%s/tgo", g_dir); /* not the ps test's */
    snprintf(script, sizeof script,
             "d=%s; if [ \"$EDL_ROLE_NAME\" = teacher ]; then env > $d/env.$EDL_POD_ID; "
             "T_DIR=$d exec %s; fi; while [ ! -f $d/tgo ]; do sleep 0.05; done; exit 0",
             g_dir, EDL_TEACHER_SERVER);
    const char *opts[] = {"--np", "1", "--teachers", "1:3", "--service", "tsvc",
                          "--teacher-replicas", "1", "--etcd", ep(), "--settle-ms", "300",
                          "--grace-ms", "2000", NULL};
    pid_t run = edl_run(job, opts, script);
    edl_generation c = {0};
    wait_running(job, 1, 30000, &c);
    int64_t g1 = c.generation;
    wait_teachers("tsvc", 1, 15000);
    char names[8][64], path[300], v[256];
    assert_int_equal(teacher_names("tsvc", names, 8), 1);
    assert_string_equal(names[0], "tjob-teacher-0");
    snprintf(path, sizeof path, "%s/env.tjob-teacher-0", g_dir);
    assert_string_equal(env_value(path, "EDL_SERVICE", v, sizeof v), "tsvc");
    assert_non_null(env_value(path, "PORT", v, sizeof v));
    assert_null(env_value(path, "RANK", v, sizeof v));

    char out[8192];
    const char *up[] = {"scale", job, "3", "--role", "teacher", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, up), 0);
    assert_non_null(strstr(out, "teacher replicas 1 -> 3"));
    wait_teachers("tsvc", 3, 15000);
    const char *down[] = {"scale", job, "2", "--role", "teacher", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, down), 0);
    wait_teachers("tsvc", 2, 15000);
    assert_int_equal(teacher_names("tsvc", names, 8), 2);
    assert_string_equal(names[0], "tjob-teacher-0"); /* the newest stopped */
    assert_string_equal(names[1], "tjob-teacher-1");
    assert_true(read_generation(job, &c));
    assert_int_equal(c.generation, g1); /* teachers are no members */
    assert_int_equal(c.n_members, 1);
    assert_int_equal(c.n_standbys, 0);

    const char *st[] = {"status", job, "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, st), 0);
    assert_non_null(strstr(out, "teachers: 2 registered in service tsvc"));
    assert_non_null(strstr(out, "tjob-teacher-1"));
    const char *st_json[] = {"status", job, "--json", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, st_json), 0);
    assert_non_null(strstr(out, "\"teachers\":[{"));
    const char *beyond[] = {"scale", job, "4", "--role", "teacher", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, beyond), 2);
    assert_non_null(strstr(out, "outside its teachers min..max 1..3"));
    const char *below[] = {"scale", job, "0", "--role", "teacher", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, below), 2);
    harness_put(g_c, key("noteach", EDL_KEY_SPEC, NULL), "{\"min\":1}");
    const char *none[] = {"scale", "noteach", "1", "--role", "teacher", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, none), 2);
    assert_non_null(strstr(out, "has no teacher role"));
    const char *bad_role[] = {"scale", job, "1", "--role", "student", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, bad_role), 2);

    FILE *f = fopen(go, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(harness_wait_exit(run, 30000), 0);
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_SUCCEEDED);
    assert_int_equal(teacher_names("tsvc", names, 8), 0); /* they left the service */
    edl_generation_clear(&c);

    /* usage: --teachers without --service, --service without --teachers */
    const char *no_svc[] = {"run", "--np", "1", "--teachers", "1", "--", "true", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, no_svc), 2);
    assert_non_null(strstr(out, "--teachers needs --service"));
    const char *no_teach[] = {"run", "--np", "1", "--service", "s", "--", "true", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, no_teach), 2);
}

/* The offset just past the first `needle` in the file at path from offset `from`, waiting up to
 * timeout_ms for it to be written; fails the test otherwise. */
static long wait_in_file(const char *path, const char *needle, long from, int timeout_ms)
{
    int64_t end = harness_now_ms() + timeout_ms;
    static char buf[1 << 20];
    do {
        FILE *f = fopen(path, "r");
        size_t n = 0;
        if (f && fseek(f, from, SEEK_SET) == 0)
            n = fread(buf, 1, sizeof buf - 1, f);
        if (f)
            fclose(f);
        buf[n] = '\0';
        const char *p = strstr(buf, needle);
        if (p)
            return from + (long)(p - buf) + (long)strlen(needle);
        harness_sleep_ms(50);
    } while (harness_now_ms() < end);
    fail_msg("%s: no \"%s\" after byte %ld within %d ms", path, needle, from, timeout_ms);
    return -1;
}

/* examples/distill under `edl run --teachers 1:4 --service mlp`: the worker is the student, the
 * teachers the same program as teachers (EDL_ROLE_NAME). While the student trains, teachers are
 * scaled 1 -> 4 -> 2 and one teacher's server is SIGKILLed (its agent deregisters it at once,
 * then starts it again); the student follows the service each time (edl_discovery), no batch
 * is lost or answered twice, every prediction is the teacher's, and the student learns exactly
 * what the same student learns on labels computed in its own process. */
static void test_distill_student_follows_teachers_that_scale_and_die(void **state)
{
    (void)state;
    const char *job = "distjob";
    char script[1400], out[300], student[400], cmd[1024];
    snprintf(out, sizeof out, "%s/distill.out", g_dir);
    snprintf(script, sizeof script,
             "echo $$ > %s/pid.$EDL_POD_ID; exec %s --epochs 24 --service-time-ms 20 "
             ">>%s.$EDL_POD_ID 2>&1", g_dir, EDL_DISTILL_BIN, out);
    const char *opts[] = {"--np", "1", "--teachers", "1:4", "--service", "mlp",
                          "--teacher-replicas", "1", "--etcd", ep(), "--settle-ms", "300",
                          "--grace-ms", "2000", NULL};
    pid_t run = edl_run(job, opts, script);
    edl_generation c = {0};
    wait_running(job, 1, 30000, &c);
    snprintf(student, sizeof student, "%s.%s", out, c.members[0].pod);
    long at = wait_in_file(student, "teachers now 1 of 1", 0, 30000);
    char o2[8192];
    const char *up[] = {"scale", job, "4", "--role", "teacher", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(o2, sizeof o2, up), 0);
    at = wait_in_file(student, "teachers now 4 of 4", at, 30000);
    const char *down[] = {"scale", job, "2", "--role", "teacher", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(o2, sizeof o2, down), 0);
    at = wait_in_file(student, "teachers now 2 of 2", at, 30000);
    char names[8][64], pidpath[400], pidtext[32] = "";
    assert_int_equal(teacher_names("mlp", names, 8), 2);
    snprintf(pidpath, sizeof pidpath, "%s/pid.%s", g_dir, names[1]);
    FILE *f = fopen(pidpath, "r");
    assert_non_null(f);
    assert_non_null(fgets(pidtext, sizeof pidtext, f));
    fclose(f);
    assert_int_equal(kill((pid_t)atol(pidtext), SIGKILL), 0);
    at = wait_in_file(student, "teachers now 1 of 1", at, 10000); /* deregistered at once */
    at = wait_in_file(student, "teachers now 2 of 2", at, 30000); /* its agent started it again */
    snprintf(cmd, sizeof cmd, "grep -q 'distill: student: test accuracy' %s", student);
    assert_int_not_equal(system(cmd), 0); /* all of it while the student trained */
    assert_int_equal(edl_cmd(o2, sizeof o2, up), 0); /* four again, to finish sooner */
    assert_int_equal(harness_wait_exit(run, 120000), 0);
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_SUCCEEDED);
    assert_int_equal(c.restarts, 0);
    wait_in_file(student, "lost 0, duplicated 0, predictions differing from the local teacher 0",
                 0, 1000);
    f = fopen(student, "r");
    char line[1024];
    double remote = -1, local = -2;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "distill: student: test accuracy %lf on the teachers' labels, %lf",
                   &remote, &local) == 2)
            break;
    if (f)
        fclose(f);
    print_message("distill under edl run, teachers 1 -> 4 -> 2 and one killed: student accuracy "
                  "%.4f, on local labels %.4f\n", remote, local);
    assert_true(remote > 0.9);
    assert_true(remote == local); /* the same labels in the same order: the same student */
    assert_int_equal(teacher_names("mlp", names, 8), 0); /* the teachers left with the job */
    edl_generation_clear(&c);
}


/* The "test AUC" that examples/ctr printed into path (-1: none). */
static double ctr_auc(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    double auc = -1;
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "test AUC ");
        if (p)
            auc = atof(p + 9);
    }
    if (f)
        fclose(f);
    return auc;
}

/* examples/ctr (logistic regression plus embeddings on parameter servers) under edl run with
 * 2 workers and 2 elastic servers whose tables have 2 replicas: a third server joins while the
 * workers train, then one is SIGKILLed; the workers re-route, are never restarted, no shard
 * is lost (each had a backup), and the model learns. */
static void test_ctr_trains_while_servers_join_and_die(void **state)
{
    (void)state;
    const char *job = "ctrjob";
    char script[1024], out[300], ckpt[400];
    snprintf(out, sizeof out, "%s/ctr.out", g_dir);
    snprintf(ckpt, sizeof ckpt, "file://%s/ctr-ckpt", g_dir);
    snprintf(script, sizeof script,
             "exec %s --examples 600000 --test 20000 --replicas 2 --save-every 200 "
             ">>%s.$EDL_POD_ID 2>&1", EDL_CTR_BIN, out);
    const char *opts[] = {"--np", "2", "--ps", "2:3", "--ps-replicas", "2", "--etcd", ep(),
                          "--settle-ms", "300", "--grace-ms", "5000", "--checkpoint-uri", ckpt,
                          NULL};
    pid_t run = edl_run(job, opts, script);
    edl_generation c = {0};
    wait_running(job, 2, 60000, &c);
    for (int r = 0; r < 2; r++) /* training: the tables are on the servers */
        wait_step(job, c.members[r].pod, 20, 60000);
    char w0[256], path[600], cmd[8192];
    snprintf(w0, sizeof w0, "%s", c.members[0].pod);
    const char *scale3[] = {"scale", job, "3", "--role", "ps", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(cmd, sizeof cmd, scale3), 0);
    wait_servers(job, 3, 30000, &c);
    int64_t end = harness_now_ms() + 10000; /* the third server serves: the workers go on */
    while (harness_now_ms() < end && !running_pid(job, c.servers[2].pod, c.generation))
        harness_sleep_ms(20);
    char joined[256];
    snprintf(joined, sizeof joined, "%s", c.servers[2].pod);
    long victim = running_pid(job, c.servers[0].pod, c.generation);
    assert_true(victim > 0);
    for (int r = 0; r < 2; r++) /* still training when a server dies */
        assert_true(running_pid(job, c.members[r].pod, c.generation) > 0);
    snprintf(path, sizeof path, "%s.%s", out, w0);
    assert_true(ctr_auc(path) < 0);
    assert_int_equal(kill((pid_t)victim, SIGKILL), 0);
    assert_int_equal(harness_wait_exit(run, 240000), 0);
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_SUCCEEDED);
    assert_int_equal(c.restarts, 0); /* no worker was restarted */
    snprintf(cmd, sizeof cmd, "grep -q 'sent .* shards to %s' %s.*", joined, out);
    /* the newcomer got its shards from the others */
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "grep -q 'were not handed over' %s.*", out);
    assert_int_not_equal(system(cmd), 0); /* the killed one's shards lived on its backups */
    snprintf(cmd, sizeof cmd, "grep -q 'worker 0 saved [1-9][0-9]* PS checkpoints' %s", path);
    assert_int_equal(system(cmd), 0); /* --save-every: PS checkpoints while servers changed */
    snprintf(cmd, sizeof cmd, "test -n \"$(find %s/ctr-ckpt -type f | head -1)\"", g_dir);
    assert_int_equal(system(cmd), 0);
    double auc = ctr_auc(path);
    print_message("ctr under edl run, 2 replicas, a server joined and one killed: test AUC "
                  "%.4f\n", auc);
    assert_true(auc > 0.72); /* one process learns 0.77 on this data, the planted model 0.84 */
    edl_generation_clear(&c);
}

/* examples/ctr under edl run with 2 workers and 2 servers whose tables have 1 replica (no
 * checkpoint): one server is SIGKILLed while the workers train. The survivor takes the dead
 * one's shards after the hand-over timeout and says so in one line a table (4 tables), each
 * with the dead server's count of its 1,024 shards, none restored, all from initial values,
 * and no line about a single shard (it printed one a shard: 2,088 lines); the job succeeds. */
static void test_ctr_a_server_killed_without_replicas_is_reported_once_a_table(void **state)
{
    (void)state;
    const char *job = "ctrlost";
    char script[1024], out[300], cmd[1024];
    snprintf(out, sizeof out, "%s/ctrlost.out", g_dir);
    snprintf(script, sizeof script, "exec %s --examples 300000 --test 20000 --replicas 1 "
             ">>%s.$EDL_POD_ID 2>&1", EDL_CTR_BIN, out);
    const char *opts[] = {"--np", "2", "--ps", "1:2", "--ps-replicas", "2", "--etcd", ep(),
                          "--settle-ms", "300", "--grace-ms", "5000", NULL};
    pid_t run = edl_run(job, opts, script);
    edl_generation c = {0};
    wait_servers(job, 2, 60000, &c);
    wait_running(job, 2, 60000, &c);
    for (int r = 0; r < 2; r++)
        wait_step(job, c.members[r].pod, 20, 60000);
    const char *names[2] = {c.servers[0].pod, c.servers[1].pod};
    int dead = 0; /* of each table's 1,024 shards, those the victim owned */
    for (uint32_t sh = 0; sh < 1024; sh++)
        dead += edl_ps_shard_owner(names, 2, sh) == 0;
    long victim = running_pid(job, c.servers[0].pod, c.generation);
    assert_true(victim > 0);
    assert_int_equal(kill((pid_t)victim, SIGKILL), 0);
    assert_int_equal(harness_wait_exit(run, 240000), 0);
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_SUCCEEDED);
    snprintf(cmd, sizeof cmd, "cat %s.* | grep -c 'shard [0-9]* of table'", out);
    char got[64] = "";
    harness_shell(cmd, got, sizeof got);
    if (atoi(got) != 0) /* nothing about single shards */
        fail_msg("%d lines about single shards of the killed server", atoi(got));
    for (int t = 0; t < 4; t++) {
        snprintf(cmd, sizeof cmd, "cat %s.* | grep -c 'ps: table %d: %d shards were not handed "
                 "over within 10000 ms (their server died?); no PS checkpoint holds them: 0 "
                 "restored, %d start again from initial values'", out, t, dead, dead);
        harness_shell(cmd, got, sizeof got);
        if (atoi(got) != 1)
            fail_msg("table %d: %d lines saying the %d shards of the killed server start again "
                     "(want 1)", t, atoi(got), dead);
    }
    snprintf(cmd, sizeof cmd, "cat %s.* | grep -c 'were not handed over'", out);
    harness_shell(cmd, got, sizeof got);
    print_message("ctr, 1 replica, a server SIGKILLed: %d lines about its shards (%d of each "
                  "table's 1,024)\n", atoi(got), dead);
    assert_int_equal(atoi(got), 4);
    edl_generation_clear(&c);
}

/* examples/ctr under edl run while workers join and die: a third worker joins, then one is
 * SIGKILLed. Each time the agents restart the workers (restart mode), and the restarted
 * workers resume at the job's progress as the servers count it, sharing the batches not yet
 * trained instead of starting over: the job trains its batches about once (a restart from the
 * first batch would train them up to three times) and the model learns. */
static void test_ctr_resumes_while_workers_join_and_die(void **state)
{
    (void)state;
    const char *job = "ctrwjob";
    char script[1024], out[300], cmd[8192];
    snprintf(out, sizeof out, "%s/ctrw.out", g_dir);
    snprintf(script, sizeof script, "exec %s --examples 1200000 --test 20000 "
             ">>%s.$EDL_POD_ID 2>&1", EDL_CTR_BIN, out);
    const char *opts[] = {"--np", "2:3", "--replicas", "2", "--ps", "2", "--etcd", ep(),
                          "--settle-ms", "300", "--grace-ms", "5000", NULL};
    pid_t run = edl_run(job, opts, script);
    edl_generation c = {0};
    wait_running(job, 2, 60000, &c);
    for (int r = 0; r < 2; r++)
        wait_step(job, c.members[r].pod, 20, 60000);
    const char *scale3[] = {"scale", job, "3", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(cmd, sizeof cmd, scale3), 0);
    wait_running_after(job, c.generation, 3, 30000, &c);
    wait_step(job, c.members[2].pod, 1, 30000); /* the newcomer trains */
    long victim = running_pid(job, c.members[1].pod, c.generation);
    assert_true(victim > 0);
    assert_int_equal(kill((pid_t)victim, SIGKILL), 0);
    assert_int_equal(harness_wait_exit(run, 240000), 0);
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_SUCCEEDED);
    assert_int_equal(c.restarts, 1); /* the kill; the join restarted the workers for free */
    /* 3 workers resumed in each of the two later generations */
    snprintf(cmd, sizeof cmd, "test \"$(cat %s.* | grep -c 'of 3 resumes at batch [1-9]')\" = 6",
             out);
    assert_int_equal(system(cmd), 0);
    char path[600], line[1024];
    snprintf(path, sizeof path, "%s.%s", out, c.members[0].pod);
    long done = -1, total = -1;
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f))
        sscanf(line, "ctr: the job trained %ld batches of its %ld", &done, &total);
    if (f)
        fclose(f);
    print_message("ctr under edl run, a worker joined and one killed: the job trained %ld "
                  "batches of its %ld; test AUC %.4f\n", done, total, ctr_auc(path));
    assert_int_equal(total, 1200000 / 256);
    assert_true(done >= total * 98 / 100 && done <= total * 102 / 100);
    assert_true(ctr_auc(path) > 0.72);
    edl_generation_clear(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inprocess_mlp_survives_scale_and_kill_without_restarts),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_state_directory_must_be_private),
        cmocka_unit_test(test_status_json_is_json_whatever_etcd_holds),
        cmocka_unit_test(test_status_rows_in_rank_order_with_starts_and_exclusions),
        cmocka_unit_test(test_stop_returns_when_the_jobs_etcd_is_gone),
        cmocka_unit_test(test_ctrl_c_stops_the_job_in_order),
        cmocka_unit_test(test_second_launcher_of_a_job_is_refused),
        cmocka_unit_test(test_service_commands_find_a_local_jobs_etcd),
        cmocka_unit_test(test_killed_agents_leave_no_directories),
        cmocka_unit_test(test_demo_kills_only_its_own_agent),
        cmocka_unit_test(test_every_rank_gets_the_exact_environment),
        cmocka_unit_test(test_scale_leave_kill_and_stop),
        cmocka_unit_test(test_standby_promoted_when_a_member_leaves),
        cmocka_unit_test(test_failing_trainer_restarted_excluded_then_job_fails),
        cmocka_unit_test(test_broken_trainer_spends_its_budget_in_seconds),
        cmocka_unit_test(test_trainer_that_cannot_start_fails_the_job_at_once),
        cmocka_unit_test(test_script_path_typo_fails_at_once_printing_its_error_once),
        cmocka_unit_test(test_failure_cause_is_the_last_stderr_lines),
        cmocka_unit_test(test_killed_agent_leaves_the_generation_at_once),
        cmocka_unit_test(test_rank_stuck_in_a_collective_is_a_hang),
        cmocka_unit_test(test_trainer_error_file_restart_count_and_master_port),
        cmocka_unit_test(test_peer_loss_spends_no_restart),
        cmocka_unit_test(test_peer_loss_in_process_spends_no_restart),
        cmocka_unit_test(test_etcd_outage_does_not_kill_trainers),
        cmocka_unit_test(test_example_trainer_survives_reformation),
        cmocka_unit_test(test_a_job_run_again_resumes_from_its_checkpoints),
        cmocka_unit_test(test_manifest_runs_with_its_settings),
        cmocka_unit_test(test_manifest_errors_exit_2_and_start_nothing),
        cmocka_unit_test(test_manifest_deadline_fails_the_job),
        cmocka_unit_test(test_manifest_example_runs),
        cmocka_unit_test(test_manifest_volume_is_this_users),
        cmocka_unit_test(test_ps_role_end_to_end),
        cmocka_unit_test(test_teacher_role_end_to_end),
        cmocka_unit_test(test_distill_student_follows_teachers_that_scale_and_die),
        cmocka_unit_test(test_ctr_trains_while_servers_join_and_die),
        cmocka_unit_test(test_ctr_a_server_killed_without_replicas_is_reported_once_a_table),
        cmocka_unit_test(test_ctr_resumes_while_workers_join_and_die),
    };
    if (getenv("EDL_TEST_FILTER")) /* run only the tests whose names match (cmocka's globs) */
        cmocka_set_test_filter(getenv("EDL_TEST_FILTER"));
    if (getenv("EDL_TEST_FILTER")) /* e.g. EDL_TEST_FILTER='*inprocess*' */
        cmocka_set_test_filter(getenv("EDL_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}

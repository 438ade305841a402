/* test_edl_run.c: whole jobs through `edl run`, the basics a user meets first: a real etcd, the
 * real job server, real agents and real trainer processes (small sh scripts). The exact
 * environment of every rank, scale up within the settle window as one generation, graceful
 * leave and SIGKILL, standby promotion, usage errors, the private state directory,
 * `edl status/scale/stop` (JSON and rows), and a local job with its own etcd found through the
 * state file (stop, Ctrl-C, a second launcher, `edl service`, the demo). The other subjects are
 * in test_edl_failures.c, test_edl_resume.c, test_edl_manifest.c and test_edl_roles.c; the
 * set-up they share is edl_run_common.c's. */
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

/* ---- environment ------------------------------------------------------------------------ */

static void test_every_rank_gets_the_exact_environment(void **state)
{
    (void)state;
    /* edl run with its own etcd (no --etcd); the trainers dump their environment and exit 0 */
    char script[512];
    snprintf(script, sizeof script, "env > %s/env.$EDL_RANK", g_dir);
    const char *opts[] = {"--np", "3", "--settle-ms", "200", NULL};
    pid_t run = edl_run("envjob", opts, script);
    run_exits("envjob", run, 60000, 0); /* all exit 0: succeeded */
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
    run_exits(job, run, 30000, 4);
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
    run_exits(job, run, 30000, 143);
    edl_generation_clear(&c);
}

/* The voluntary context switches of a process's main thread: each one a sleep that ended. */
static long wakeups(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long n = -1;
    while (f && n < 0 && fgets(line, sizeof line, f))
        sscanf(line, "voluntary_ctxt_switches: %ld", &n);
    if (f)
        fclose(f);
    return n;
}

/* An idle running job's launcher sleeps until something is due: its checks are timers, so it
 * does not wake on a period (it woke every 200 ms, 10 times in 2 s). */
static void test_idle_launcher_sleeps_until_something_is_due(void **state)
{
    (void)state;
    const char *job = "idle";
    const char *opts[] = {"--np", "1:1", "--etcd", ep(), NULL};
    pid_t run = edl_run(job, opts, "exec sleep 120");
    edl_generation c = {0};
    wait_running(job, 1, 20000, &c);
    long before = wakeups(run);
    harness_sleep_ms(2000); /* the time is the test: nothing is due in it */
    long woke = wakeups(run) - before;
    kill(run, SIGTERM);
    run_exits(job, run, 30000, 143);
    edl_generation_clear(&c);
    if (before < 0 || woke > 3)
        fail_msg("the idle launcher woke %ld times in 2 s (at most 3 expected)", woke);
}

/* ---- usage, status and the state directory ---------------------------------------------- */

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
    run_exits(job, run, 30000, 143);
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
    run_exits(job, run, 30000, 4);
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
    run_exits(job, run, 30000, 4);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
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
        cmocka_unit_test(test_idle_launcher_sleeps_until_something_is_due),
    };
    return cmocka_run_group_tests(tests, edl_run_setup, edl_run_teardown);
}

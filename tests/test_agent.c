/* test_agent.c: edl-agent as a real process against a real etcd, with /bin/sh trainers.
 *
 * The job server is not part of these tests: each test writes the job's spec and generation
 * documents itself, exactly as a job server would (edl_spec_to_json, edl_generation_to_json), and
 * observes the pods/ and status/ keys, the trainers' environment files and pids, the agent's
 * exit code and its /metrics. Every wait is bounded. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "edl/discovery.h"
#include "edl/job.h"
#include "edl/etcd.h"
#include "harness.h"

static edl_etcd_server *srv;
static edl_etcd *cl;
static char dir[256]; /* this test's scratch directory: trainers write their files here */

#define MAX_AGENTS 8
static pid_t agents[MAX_AGENTS];

/* ---- fixtures ------------------------------------------------------------------------------ */

static int group_setup(void **state)
{
    (void)state;
    harness_open_etcd(1, NULL, &srv, &cl);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    harness_close_etcd(&srv, &cl);
    return 0;
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/edl-agent-test-XXXXXX");
    if (!mkdtemp(dir))
        fail_msg("mkdtemp: %s", strerror(errno));
    memset(agents, 0, sizeof agents);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pid_t etcd = edl_etcd_server_pid(srv, 0);
    if (etcd > 0)
        kill(etcd, SIGCONT); /* a test that froze it and failed */
    for (int i = 0; i < MAX_AGENTS; i++)
        if (agents[i] > 0) {
            kill(agents[i], SIGKILL);
            waitpid(agents[i], NULL, 0);
        }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return 0;
}

/* ---- helpers ------------------------------------------------------------------------------- */

/* A key of the job: "spec", "generation", "pods/<pod>" or "status/<pod>". */
/* What a fake rank 0's agent does for generation gen: publish its MASTER_PORT. */
static void publish_master(const char *job, int64_t gen, const char *port)
{
    char k[256];
    harness_put(cl, harness_job_key(k, sizeof k, job, EDL_KEY_GEN, EDL_GEN_MASTER, gen), port);
}

static char *key(const char *job, const char *what, char *buf, size_t len)
{
    if (strncmp(what, "pods/", 5) == 0)
        return harness_job_key(buf, len, job, EDL_KEY_POD, what + 5, 0);
    if (strncmp(what, "status/", 7) == 0)
        return harness_job_key(buf, len, job, EDL_KEY_STATUS, what + 7, 0);
    return harness_job_key(buf, len, job,
                           strcmp(what, "spec") == 0 ? EDL_KEY_SPEC : EDL_KEY_GENERATION, NULL, 0);
}

static void put_spec_to(const char *job, edl_elastic_mode mode, int max, int64_t ttl_s,
                        const char *checkpoint_uri)
{
    edl_job_spec s;
    edl_spec_init(&s);
    s.min = 1;
    s.max = max;
    s.mode = mode;
    s.ttl_s = ttl_s;
    s.max_restarts = 7;
    s.checkpoint_uri = strdup(checkpoint_uri);
    char *j = edl_spec_to_json(&s), k[256];
    harness_put(cl, key(job, "spec", k, sizeof k), j);
    free(j);
    edl_spec_clear(&s);
}

static void put_spec(const char *job, edl_elastic_mode mode, int max, int64_t ttl_s)
{
    put_spec_to(job, mode, max, ttl_s, "file:///tmp/ckpt");
}

/* Start edl-agent for job/pod running `/bin/sh -c script`, with extra options (NULL-ended),
 * its output appended to log (NULL: the test's own). */
static pid_t start_agent_logged(const char *job, const char *pod, const char *script,
                                const char *const *extra, const char *log)
{
    const char *argv[40];
    int n = 0;
    argv[n++] = EDL_AGENT_BIN;
    argv[n++] = "--etcd";
    argv[n++] = edl_etcd_server_endpoints(srv);
    argv[n++] = "--job";
    argv[n++] = job;
    argv[n++] = "--pod";
    argv[n++] = pod;
    argv[n++] = "--grace-ms";
    argv[n++] = "3000";
    for (int i = 0; extra && extra[i] && n < 30; i++)
        argv[n++] = extra[i];
    argv[n++] = "--";
    argv[n++] = "/bin/sh";
    argv[n++] = "-c";
    argv[n++] = script;
    argv[n] = NULL;
    setenv("T_DIR", dir, 1); /* the agent passes its environment on to the trainer */
    pid_t pid = harness_spawn(argv, log);
    assert_true(pid > 0);
    for (int i = 0; i < MAX_AGENTS; i++)
        if (agents[i] == 0) {
            agents[i] = pid;
            break;
        }
    return pid;
}

static pid_t start_agent(const char *job, const char *pod, const char *script,
                         const char *const *extra)
{
    return start_agent_logged(job, pod, script, extra, NULL);
}

static void forget_agent(pid_t pid)
{
    for (int i = 0; i < MAX_AGENTS; i++)
        if (agents[i] == pid)
            agents[i] = 0;
}

/* The agent's exit status (as the shell shows it: code, or 128+signal); fails after timeout. */
static int wait_exit(pid_t pid, int timeout_ms)
{
    int64_t end = harness_now_ms() + timeout_ms;
    int st;
    while (harness_now_ms() < end) {
        if (waitpid(pid, &st, WNOHANG) == pid) {
            forget_agent(pid);
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        harness_sleep_ms(20);
    }
    fail_msg("agent %d did not exit within %d ms", (int)pid, timeout_ms);
    return -1;
}

/* The kv of a key, waiting up to timeout_ms for it to exist (NULL when it never did). */
static edl_kv *wait_kv(const char *k, int timeout_ms)
{
    int64_t end = harness_now_ms() + timeout_ms;
    do {
        edl_kv *kv;
        if (edl_etcd_get(cl, edl_str(k), &kv, NULL) == 0)
            return kv;
        harness_sleep_ms(25);
    } while (harness_now_ms() < end);
    return NULL;
}

static bool wait_gone(const char *k, int timeout_ms)
{
    int64_t end = harness_now_ms() + timeout_ms;
    do {
        edl_kv *kv;
        int rc = edl_etcd_get(cl, edl_str(k), &kv, NULL);
        if (rc == EDL_ENOTFOUND)
            return true;
        if (rc == 0)
            edl_kv_free(kv);
        harness_sleep_ms(25);
    } while (harness_now_ms() < end);
    return false;
}

static bool get_status(const char *job, const char *pod, edl_pod_status *st)
{
    char k[256], rest[160], v[4096];
    snprintf(rest, sizeof rest, "status/%s", pod);
    if (!harness_get(cl, key(job, rest, k, sizeof k), v, sizeof v))
        return false;
    char err[128];
    return edl_pod_status_parse(v, strlen(v), st, err, sizeof err) == 0;
}

/* Wait for the pod's status to be `state` in generation `gen` (and step >= min_step). */
static edl_pod_status wait_status(const char *job, const char *pod, int64_t gen,
                                  edl_trainer_state state, int64_t min_step, int timeout_ms)
{
    int64_t end = harness_now_ms() + timeout_ms;
    edl_pod_status st = {.state = -1};
    bool seen = false;
    do {
        if ((seen = get_status(job, pod, &st)) && st.generation == gen && st.state == state &&
            st.step >= min_step)
            return st;
        harness_sleep_ms(25);
    } while (harness_now_ms() < end);
    fail_msg("status of %s: wanted %s in generation %lld (step >= %lld), last seen %s in "
             "generation %lld step %lld", pod, edl_trainer_state_name(state), (long long)gen,
             (long long)min_step, seen ? edl_trainer_state_name(st.state) : "nothing",
             (long long)st.generation, (long long)st.step);
    return st;
}

/* `pods` (NULL-ended) as members in rank order, as a job server lists them: addr, port and
 * lease from each pod's registration. Returns how many; free the addrs with free_list. */
static size_t member_list(const char *job, const char *const *pods, edl_member *m)
{
    size_t n = 0;
    for (; pods && pods[n]; n++) {
        char k[256], rest[160];
        snprintf(rest, sizeof rest, "pods/%s", pods[n]);
        edl_kv *kv = wait_kv(key(job, rest, k, sizeof k), 5000);
        if (!kv)
            fail_msg("pod %s never registered", pods[n]);
        edl_pod p = {0};
        char err[128];
        assert_int_equal(edl_pod_parse(kv->value, kv->value_len, &p, err, sizeof err), 0);
        m[n] = (edl_member){.pod = (char *)pods[n], .rank = (int)n, .addr = strdup(p.addr),
                            .port = p.port, .lease = kv->lease};
        edl_pod_clear(&p);
        edl_kv_free(kv);
    }
    return n;
}

static void free_list(edl_member *m, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(m[i].addr);
}

/* Publish a generation with members `pods` and parameter servers `servers` (rank order,
 * NULL-ended), as a job server does; members_gen: the generation the members were formed in
 * (a servers-only change keeps it; 0: this one). */
static void publish_servers(const char *job, int64_t gen, int64_t members_gen,
                            edl_job_state state, const char *const *pods,
                            const char *const *servers)
{
    edl_member m[8], sv[8];
    size_t n = member_list(job, pods, m), ns = member_list(job, servers, sv);
    edl_generation c = {.generation = gen, .members_generation = members_gen, .state = state,
                        .members = m, .n_members = n, .servers = sv, .n_servers = ns,
                        .reason = (char *)"test", .published_ms = edl_wall_ms()};
    char *j = edl_generation_to_json(&c), k[256];
    harness_put(cl, key(job, "generation", k, sizeof k), j);
    free(j);
    free_list(m, n);
    free_list(sv, ns);
}

/* Publish a generation whose members are `pods` in rank order (NULL-ended). */
static void publish(const char *job, int64_t gen, edl_job_state state, const char *const *pods)
{
    publish_servers(job, gen, 0, state, pods, NULL);
}

static void publish_state(const char *job, int64_t gen, edl_job_state state)
{
    publish(job, gen, state, NULL);
}

/* The value of NAME in a file of NAME=value lines (env output), or NULL. */
static char *file_var(const char *path, const char *name, char *out, size_t len)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char line[4096];
    size_t nl = strlen(name);
    char *res = NULL;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, name, nl) == 0 && line[nl] == '=') {
            line[strcspn(line, "\n")] = '\0';
            snprintf(out, len, "%s", line + nl + 1);
            res = out;
            break;
        }
    fclose(f);
    return res;
}

static bool wait_file(const char *path, int timeout_ms)
{
    int64_t end = harness_now_ms() + timeout_ms;
    struct stat sb;
    do {
        if (stat(path, &sb) == 0)
            return true;
        harness_sleep_ms(25);
    } while (harness_now_ms() < end);
    return false;
}

static void assert_var(const char *path, const char *name, const char *want)
{
    char v[1024];
    if (!file_var(path, name, v, sizeof v))
        fail_msg("%s: %s is not set", path, name);
    if (strcmp(v, want) != 0)
        fail_msg("%s: %s=%s, expected %s", path, name, v, want);
}

static void assert_no_var(const char *path, const char *name)
{
    char v[1024];
    if (file_var(path, name, v, sizeof v))
        fail_msg("%s: %s=%s, expected it unset", path, name, v);
}

static long read_long_file(const char *path)
{
    char v[64] = "";
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    if (!fgets(v, sizeof v, f))
        v[0] = '\0';
    fclose(f);
    return strtol(v, NULL, 10);
}

/* How many times needle occurs in text. */
static int count_in(const char *text, const char *needle)
{
    int n = 0;
    for (const char *at = strstr(text, needle); at; at = strstr(at + 1, needle))
        n++;
    return n;
}

static bool pid_alive(pid_t pid)
{
    char path[64], st[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool alive = fgets(st, sizeof st, f) != NULL;
    fclose(f);
    char *p = strrchr(st, ')'); /* a zombie is dead for our purposes */
    return alive && p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

static bool wait_pid_dead(pid_t pid, int timeout_ms)
{
    int64_t end = harness_now_ms() + timeout_ms;
    do {
        if (!pid_alive(pid))
            return true;
        harness_sleep_ms(20);
    } while (harness_now_ms() < end);
    return false;
}

/* The trainer used by most tests: record the first control line, the environment, its pid
 * (sh execs sleep, so the pid stays), one file per pod and generation. */
#define RECORDING_TRAINER                                                                          \
    "f=\"$T_DIR/$EDL_POD_ID.$EDL_GENERATION\"; read -r l <&$EDL_CONTROL_FD; echo \"$l\" > $f.ctl; " \
    "echo $$ > $f.pid; env > $f.tmp && mv $f.tmp $f.env; exec sleep 60"

static char *path_of(const char *pod, int gen, const char *ext, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s.%d.%s", dir, pod, gen, ext);
    return buf;
}

static int count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    int n = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f))
        n++;
    if (f)
        fclose(f);
    return n;
}

/* The set-up of most tests: a job of one pod "a" (restart mode, lease ttl_s) whose agent runs
 * script, and a first generation that lists it. The agent's pid. */
static pid_t start_alone(const char *job, int64_t ttl_s, const char *script)
{
    put_spec(job, EDL_MODE_RESTART, 1, ttl_s);
    pid_t a = start_agent(job, "a", script, NULL);
    publish(job, 1, EDL_JOB_RUNNING, (const char *[]){"a", NULL});
    return a;
}

/* The pid of pod a's RECORDING_TRAINER of generation gen, once it has started. */
static long trainer_of(int gen)
{
    char p[300];
    assert_true(wait_file(path_of("a", gen, "env", p, sizeof p), 5000));
    return read_long_file(path_of("a", gen, "pid", p, sizeof p));
}

/* ---- tests --------------------------------------------------------------------------------- */

static int run_status(const char *const *argv)
{
    return wait_exit(harness_spawn(argv, "/dev/null"), 10000);
}

static void test_help_and_bad_options_exit_codes(void **state)
{
    (void)state;
    const char *help[] = {EDL_AGENT_BIN, "--help", NULL};
    assert_int_equal(run_status(help), 0);
    const char *unknown[] = {EDL_AGENT_BIN, "--etcd", "http://127.0.0.1:1", "--job", "j", "--bogus", "--", "true", NULL};
    assert_int_equal(run_status(unknown), 2);
    const char *no_job[] = {EDL_AGENT_BIN, "--etcd", "http://127.0.0.1:1", "--", "true", NULL};
    assert_int_equal(run_status(no_job), 2);
    const char *no_cmd[] = {EDL_AGENT_BIN, "--etcd", "http://127.0.0.1:1", "--job", "j", NULL};
    assert_int_equal(run_status(no_cmd), 2);
    const char *bad_ttl[] = {EDL_AGENT_BIN, "--etcd", "http://127.0.0.1:1", "--job", "j", "--ttl", "x", "--", "true", NULL};
    assert_int_equal(run_status(bad_ttl), 2);
    const char *bad_name[] = {EDL_AGENT_BIN, "--etcd", "http://127.0.0.1:1", "--job", "a/b", "--", "true", NULL};
    assert_int_equal(run_status(bad_name), 2);
    const char *bad_maddr[] = {EDL_AGENT_BIN, "--etcd", "http://127.0.0.1:1", "--job", "j",
                               "--metrics-port", "9", "--metrics-addr", "localhost", "--", "true",
                               NULL};
    assert_int_equal(run_status(bad_maddr), 2);
    const char *bad_mport[] = {EDL_AGENT_BIN, "--etcd", "http://127.0.0.1:1", "--job", "j",
                               "--metrics-port", "any", "--", "true", NULL};
    assert_int_equal(run_status(bad_mport), 2);
}

static void test_unreachable_etcd_at_startup_exits_3(void **state)
{
    (void)state;
    const char *argv[] = {EDL_AGENT_BIN, "--etcd", "http://127.0.0.1:1", "--job", "j", "--pod", "p",
                          "--startup-timeout", "1", "--", "true", NULL};
    int64_t t0 = harness_now_ms();
    assert_int_equal(run_status(argv), 3);
    assert_true(harness_now_ms() - t0 < 8000);
}

static void test_registers_pod_under_lease_and_waits(void **state)
{
    (void)state;
    const char *job = "reg";
    /* no spec yet: the agent waits for it before registering, with a watch on it (etcd holds
     * one more watcher once it does) */
    double watchers = harness_etcd_metric(srv, "etcd_debugging_mvcc_watcher_total");
    assert_true(watchers >= 0);
    pid_t pid = start_agent(job, "a", "exec sleep 60", (const char *[]){"--port", "7123", NULL});
    char k[256];
    assert_true(HARNESS_WAIT_UNTIL(
        harness_etcd_metric(srv, "etcd_debugging_mvcc_watcher_total") > watchers, 5000));
    assert_null(wait_kv(key(job, "pods/a", k, sizeof k), 0));
    put_spec(job, EDL_MODE_RESTART, 1, 3);
    edl_kv *kv = wait_kv(key(job, "pods/a", k, sizeof k), 5000);
    assert_non_null(kv);
    assert_true(kv->lease != 0);
    edl_pod p = {0};
    char err[128];
    assert_int_equal(edl_pod_parse(kv->value, kv->value_len, &p, err, sizeof err), 0);
    assert_string_equal(p.role, "worker");
    assert_string_equal(p.addr, "127.0.0.1");
    assert_int_equal(p.port, 7123);
    assert_int_equal(p.pid, pid);
    assert_non_null(p.host);
    int64_t ttl, granted;
    assert_int_equal(edl_etcd_lease_ttl(cl, kv->lease, &ttl, &granted), 0);
    assert_int_equal(granted, 3); /* the spec's ttl_s */
    edl_kv *skv = wait_kv(key(job, "status/a", k, sizeof k), 5000);
    assert_non_null(skv);
    assert_true(skv->lease == kv->lease);
    edl_pod_status st = wait_status(job, "a", 0, EDL_TRAINER_WAITING, -1, 2000);
    assert_int_equal(st.step, -1);
    edl_kv_free(skv);
    edl_kv_free(kv);
    edl_pod_clear(&p);
    /* a final state ends the agent: stopped = 4, and the lease goes with it */
    publish_state(job, 1, EDL_JOB_STOPPED);
    assert_int_equal(wait_exit(pid, 5000), 4);
    assert_true(wait_gone(key(job, "pods/a", k, sizeof k), 500));
}

static void test_two_ranks_get_exact_environment(void **state)
{
    (void)state;
    const char *job = "env2";
    put_spec(job, EDL_MODE_RESTART, 2, 5);
    pid_t a = start_agent(job, "a", RECORDING_TRAINER, (const char *[]){"--port", "7201", NULL});
    pid_t b = start_agent(job, "b", RECORDING_TRAINER, (const char *[]){"--port", "7202", NULL});
    /* b is rank 0: MASTER_* must follow the rank, not the start order */
    publish(job, 1, EDL_JOB_RUNNING, (const char *[]){"b", "a", NULL});
    char pa[300], pb[300], ep[64];
    assert_true(wait_file(path_of("a", 1, "env", pa, sizeof pa), 5000));
    assert_true(wait_file(path_of("b", 1, "env", pb, sizeof pb), 5000));
    snprintf(ep, sizeof ep, "%s", edl_etcd_server_endpoints(srv));
    char master[16], mkey[256], want_ctl[64];
    assert_non_null(harness_get(cl, harness_job_key(mkey, sizeof mkey, job, EDL_KEY_GEN,
                                                    EDL_GEN_MASTER, 1), master, sizeof master));
    assert_true(atoi(master) > 0 && strcmp(master, "7202") != 0);
    struct { const char *path, *pod, *rank; } r[2] = {{pb, "b", "0"}, {pa, "a", "1"}};
    for (int i = 0; i < 2; i++) {
        const char *f = r[i].path;
        assert_var(f, "EDL_JOB_ID", job);
        assert_var(f, "EDL_POD_ID", r[i].pod);
        assert_var(f, "EDL_RANK", r[i].rank);
        assert_var(f, "EDL_WORLD_SIZE", "2");
        assert_var(f, "EDL_GENERATION", "1");
        assert_var(f, "EDL_ETCD_ENDPOINTS", ep);
        assert_var(f, "EDL_ETCD_PREFIX", "/edl/v1");
        assert_var(f, "EDL_ELASTIC_MODE", "restart");
        assert_var(f, "EDL_CHECKPOINT_URI", "file:///tmp/ckpt");
        char v[64];
        assert_non_null(file_var(f, "EDL_CONTROL_FD", v, sizeof v));
        assert_non_null(file_var(f, "EDL_PROGRESS_FD", v, sizeof v));
        assert_var(f, "RANK", r[i].rank);
        assert_var(f, "GROUP_RANK", r[i].rank);
        assert_var(f, "LOCAL_RANK", r[i].rank); /* same addr: local ranks follow the ranks */
        assert_var(f, "LOCAL_WORLD_SIZE", "2");
        assert_var(f, "WORLD_SIZE", "2");
        assert_var(f, "MASTER_ADDR", "127.0.0.1");
        assert_var(f, "MASTER_PORT", master); /* rank 0's agent picked it for generation 1 */
        assert_var(f, "TORCHELASTIC_RESTART_COUNT", "0");
        assert_var(f, "TORCHELASTIC_MAX_RESTARTS", "7");
        assert_var(f, "TORCHELASTIC_RUN_ID", job);
        assert_var(f, "PADDLE_TRAINER_ID", r[i].rank);
        assert_var(f, "PADDLE_TRAINERS_NUM", "2");
        assert_var(f, "PADDLE_TRAINER_ENDPOINTS", "127.0.0.1:7202,127.0.0.1:7201");
        assert_var(f, "PADDLE_CURRENT_ENDPOINT", i == 0 ? "127.0.0.1:7202" : "127.0.0.1:7201");
        assert_var(f, "PADDLE_PSERVERS_IP_PORT_LIST", "");
        assert_var(f, "TRAINING_ROLE", "TRAINER");
        assert_var(f, "T_DIR", dir); /* the agent's own environment is inherited */
    }
    /* the first control line names the generation */
    char ctl[300], line[1024];
    FILE *fc = fopen(path_of("a", 1, "ctl", ctl, sizeof ctl), "r");
    assert_non_null(fc);
    assert_non_null(fgets(line, sizeof line, fc));
    fclose(fc);
    assert_non_null(strstr(line, "\"generation\":1"));
    assert_non_null(strstr(line, "\"rank\":1"));
    snprintf(want_ctl, sizeof want_ctl, "\"master_port\":%s", master);
    assert_non_null(strstr(line, want_ctl));
    assert_non_null(strstr(line, "\"world_size\":2"));
    assert_non_null(strstr(line, "\"master_addr\":\"127.0.0.1\""));
    /* the endpoints have one source, the generation (PADDLE_TRAINER_ENDPOINTS above) */
    assert_null(strstr(line, "endpoints"));
    edl_pod_status st = wait_status(job, "a", 1, EDL_TRAINER_RUNNING, -1, 2000);
    assert_int_equal(st.pid, read_long_file(path_of("a", 1, "pid", ctl, sizeof ctl)));
    /* succeeded: both leave with 0 */
    publish_state(job, 1, EDL_JOB_SUCCEEDED);
    assert_int_equal(wait_exit(a, 8000), 0);
    assert_int_equal(wait_exit(b, 8000), 0);
}

static void test_new_generation_restarts_trainer(void **state)
{
    (void)state;
    const char *job = "restart";
    put_spec(job, EDL_MODE_RESTART, 2, 5);
    pid_t a = start_agent(job, "a", RECORDING_TRAINER, NULL);
    publish(job, 1, EDL_JOB_RUNNING, (const char *[]){"a", NULL});
    char p1[300], p2[300];
    assert_true(wait_file(path_of("a", 1, "env", p1, sizeof p1), 5000));
    long pid1 = read_long_file(path_of("a", 1, "pid", p1, sizeof p1));
    assert_var(path_of("a", 1, "env", p1, sizeof p1), "EDL_CHECKPOINT_URI", "file:///tmp/ckpt");
    /* the spec changes while the trainer runs: its next start gets the new one (read on the
     * agent's etcd worker before the start) */
    put_spec_to(job, EDL_MODE_RESTART, 2, 5, "file:///tmp/ckpt-moved");
    /* a second (fake) member joins as rank 0: a moves to rank 1 and must restart */
    char k[256];
    harness_put(cl, key("restart", "pods/z", k, sizeof k), "{\"role\":\"worker\",\"addr\":\"10.1.2.3\",\"port\":9000}");
    publish(job, 2, EDL_JOB_RUNNING, (const char *[]){"z", "a", NULL});
    /* a stopped its trainer for generation 2 (and said so) and waits for its rank 0 (z, faked
     * here) to publish MASTER_PORT */
    wait_status(job, "a", 1, EDL_TRAINER_STOPPED, -1, 5000);
    assert_false(wait_file(path_of("a", 2, "env", p2, sizeof p2), 0));
    publish_master(job, 2, "9123");
    assert_true(wait_file(path_of("a", 2, "env", p2, sizeof p2), 8000));
    long pid2 = read_long_file(path_of("a", 2, "pid", p1, sizeof p1));
    assert_true(pid2 > 0 && pid2 != pid1);
    assert_true(wait_pid_dead((pid_t)pid1, 2000));
    assert_var(p2, "EDL_GENERATION", "2");
    assert_var(p2, "RANK", "1");
    assert_var(p2, "LOCAL_RANK", "0"); /* alone on its address */
    assert_var(p2, "LOCAL_WORLD_SIZE", "1");
    assert_var(p2, "MASTER_ADDR", "10.1.2.3");
    assert_var(p2, "MASTER_PORT", "9123");
    assert_var(p2, "TORCHELASTIC_RESTART_COUNT", "0"); /* a restart for a join, not a failure */
    assert_var(p2, "EDL_CHECKPOINT_URI", "file:///tmp/ckpt-moved");
    edl_pod_status st = wait_status(job, "a", 2, EDL_TRAINER_RUNNING, -1, 2000);
    assert_int_equal(st.pid, pid2);
    assert_int_equal(st.restarts, 1);
    publish_state(job, 2, EDL_JOB_STOPPED);
    assert_int_equal(wait_exit(a, 8000), 4);
    assert_true(wait_pid_dead((pid_t)pid2, 2000));
}

/* Wait up to 3 s for a file to have `want` lines; returns the count, the last line in `last`. */
static int wait_lines(const char *path, int want, char *last, size_t len)
{
    int64_t end = harness_now_ms() + 3000;
    int lines = 0;
    while (harness_now_ms() < end) {
        FILE *f = fopen(path, "r");
        lines = 0;
        while (f && fgets(last, (int)len, f))
            lines++;
        if (f)
            fclose(f);
        if (lines >= want)
            break;
        harness_sleep_ms(25);
    }
    return lines;
}

static void test_inprocess_keeps_trainer_across_generations(void **state)
{
    (void)state;
    const char *job = "inproc";
    put_spec(job, EDL_MODE_INPROCESS, 2, 5);
    /* the trainer, started ahead of membership, says it is ready, then appends every control
     * line it receives; the pod registers only once it is ready */
    pid_t a = start_agent(job, "a",
                          "echo $$ > $T_DIR/pid; env > $T_DIR/env; sleep 0.5; "
                          "echo ready >&$EDL_PROGRESS_FD; "
                          "while read -r l <&$EDL_CONTROL_FD; do echo \"$l\" >> $T_DIR/ctl; done; sleep 60",
                          NULL);
    char ef[300], k0[256];
    snprintf(ef, sizeof ef, "%s/env", dir);
    edl_kv *reg = wait_kv(key(job, "pods/a", k0, sizeof k0), 5000); /* once it said "ready" */
    assert_non_null(reg);
    edl_kv_free(reg);
    assert_var(ef, "EDL_GENERATION", "0"); /* no assignment yet: no rank, no world */
    assert_no_var(ef, "RANK");
    publish(job, 1, EDL_JOB_RUNNING, (const char *[]){"a", NULL});
    char pf[300], cf[300];
    snprintf(pf, sizeof pf, "%s/pid", dir);
    snprintf(cf, sizeof cf, "%s/ctl", dir);
    assert_true(wait_file(pf, 5000));
    long pid1 = read_long_file(pf);
    wait_status(job, "a", 1, EDL_TRAINER_RUNNING, -1, 3000);
    char k[256];
    harness_put(cl, key("inproc", "pods/z", k, sizeof k), "{\"role\":\"worker\",\"addr\":\"10.1.2.3\",\"port\":9000}");
    publish(job, 2, EDL_JOB_RUNNING, (const char *[]){"a", "z", NULL});
    edl_pod_status st = wait_status(job, "a", 2, EDL_TRAINER_RUNNING, -1, 5000);
    assert_int_equal(st.pid, pid1);
    assert_int_equal(st.restarts, 0);
    char line[1024] = "";
    assert_int_equal(wait_lines(cf, 2, line, sizeof line), 2); /* generation 1 assigned it */
    assert_non_null(strstr(line, "\"generation\":2"));
    assert_non_null(strstr(line, "\"rank\":0"));
    assert_non_null(strstr(line, "\"world_size\":2"));
    assert_true(pid_alive((pid_t)pid1));
    /* a rank change keeps the process too: the new rank comes on the control pipe */
    publish(job, 3, EDL_JOB_RUNNING, (const char *[]){"z", "a", NULL});
    publish_master(job, 3, "9124");
    st = wait_status(job, "a", 3, EDL_TRAINER_RUNNING, -1, 8000);
    assert_int_equal(st.pid, pid1);
    assert_int_equal(wait_lines(cf, 3, line, sizeof line), 3);
    assert_non_null(strstr(line, "\"generation\":3"));
    assert_non_null(strstr(line, "\"rank\":1"));
    assert_non_null(strstr(line, "\"master_port\":9124"));
    publish_state(job, 3, EDL_JOB_FAILED);
    assert_int_equal(wait_exit(a, 8000), 1);
}

/* An in-process trainer that says "graceful" and "ready", then records its control lines; on a
 * leave line it records the time and runs on_leave. SIGTERM: it records the time, exits 3. */
#define GRACEFUL_TRAINER(on_leave)                                                               \
    "f=$T_DIR/$EDL_POD_ID; echo $$ > $f.pid; trap 'date +%s%N > $f.term; exit 3' TERM; "         \
    "echo graceful >&$EDL_PROGRESS_FD; echo ready >&$EDL_PROGRESS_FD; "                          \
    "while read -r l <&$EDL_CONTROL_FD; do echo \"$l\" >> $f.ctl; "                               \
    "case $l in *leave*) date +%s%N > $f.left; " on_leave " ;; esac; done; sleep 60"

/* The pod of a running in-process trainer becomes a standby (generation 2 without it). */
static long leave_after_one_generation(const char *job, const char *pod, const char *trainer)
{
    char k[256], p[300];
    put_spec(job, EDL_MODE_INPROCESS, 2, 5);
    start_agent(job, pod, trainer, (const char *[]){"--grace-ms", "1000", NULL});
    snprintf(p, sizeof p, "pods/%s", pod);
    edl_kv *reg = wait_kv(key(job, p, k, sizeof k), 5000); /* once it said "ready" */
    assert_non_null(reg);
    edl_kv_free(reg);
    publish(job, 1, EDL_JOB_RUNNING, (const char *[]){pod, NULL});
    wait_status(job, pod, 1, EDL_TRAINER_RUNNING, -1, 3000);
    snprintf(p, sizeof p, "%s/%s.pid", dir, pod);
    long pid = read_long_file(p);
    assert_true(pid > 0);
    harness_put(cl, key(job, "pods/z", k, sizeof k),
                "{\"role\":\"worker\",\"addr\":\"10.1.2.3\",\"port\":9000}");
    publish(job, 2, EDL_JOB_RUNNING, (const char *[]){"z", NULL});
    snprintf(p, sizeof p, "%s/%s.left", dir, pod);
    assert_true(wait_file(p, 3000));
    return pid;
}

/* The nanoseconds a trainer wrote to path (`date +%s%N`), once the whole line is there (the file
 * exists before its line does); -1 when none came within timeout_ms. */
static long long wait_ns(const char *path, int timeout_ms)
{
    int64_t end = harness_now_ms() + timeout_ms;
    do {
        char line[64] = "";
        FILE *f = fopen(path, "r");
        bool whole = f && fgets(line, sizeof line, f) && strchr(line, '\n');
        if (f)
            fclose(f);
        if (whole)
            return atoll(line);
        harness_sleep_ms(10);
    } while (harness_now_ms() < end);
    return -1;
}

/* In process, a trainer that said "graceful" is told of its pod's leave on the control pipe
 * instead of SIGTERM: it exits 0 at its commit. One that does not exit gets SIGTERM only after
 * the grace period (1 s here). */
static void test_inprocess_graceful_trainer_is_told_to_leave(void **state)
{
    (void)state;
    char p[300], line[256] = "";
    long pid = leave_after_one_generation("leaving", "a", GRACEFUL_TRAINER("exit 0"));
    snprintf(p, sizeof p, "%s/a.ctl", dir);
    assert_int_equal(wait_lines(p, 2, line, sizeof line), 2);
    assert_string_equal(line, "{\"generation\":2,\"leave\":true}\n");
    assert_true(wait_pid_dead((pid_t)pid, 2000));
    snprintf(p, sizeof p, "%s/a.term", dir);
    assert_false(wait_file(p, 0)); /* it left by itself: no SIGTERM */
    publish_state("leaving", 2, EDL_JOB_STOPPED);

    pid = leave_after_one_generation("lingering", "b", GRACEFUL_TRAINER("sleep 30"));
    snprintf(p, sizeof p, "%s/b.left", dir);
    long long left = wait_ns(p, 2000);
    snprintf(p, sizeof p, "%s/b.term", dir);
    long long term = wait_ns(p, 4000);
    assert_true(left > 0 && term > 0);
    print_message("SIGTERM %lld ms after the leave line (grace 1000 ms)\n",
                  (term - left) / 1000000);
    assert_true(term - left >= 900LL * 1000000); /* the grace period, less the clocks' reads */
    assert_true(wait_pid_dead((pid_t)pid, 3000));
    publish_state("lingering", 2, EDL_JOB_STOPPED);
}

/* The spec's mode not given: a trainer that says "inprocess" on its progress pipe (as
 * edl.torch does) is kept across generations and sent each one over its control pipe, and its
 * status says inprocess (for the job server); a trainer that says nothing is restarted. */
static void test_mode_not_given_follows_the_trainer(void **state)
{
    (void)state;
    const char *job = "automode";
    put_spec(job, EDL_MODE_AUTO, 2, 5);
    pid_t a = start_agent(job, "a",
                          "echo $$ > $T_DIR/pid; echo inprocess >&$EDL_PROGRESS_FD; "
                          "while read -r l <&$EDL_CONTROL_FD; do echo \"$l\" >> $T_DIR/ctl; done; "
                          "sleep 60",
                          NULL);
    char k0[256], pf[300], cf[300], line[1024] = "";
    edl_kv *reg = wait_kv(key(job, "pods/a", k0, sizeof k0), 5000);
    assert_non_null(reg); /* registered at once: nobody said in-process yet, nothing ahead */
    edl_kv_free(reg);
    publish(job, 1, EDL_JOB_RUNNING, (const char *[]){"a", NULL});
    snprintf(pf, sizeof pf, "%s/pid", dir);
    snprintf(cf, sizeof cf, "%s/ctl", dir);
    assert_true(wait_file(pf, 5000));
    long pid1 = read_long_file(pf);
    edl_pod_status st = {0};
    for (int64_t end = harness_now_ms() + 3000; harness_now_ms() < end && !st.inprocess;)
        st = wait_status(job, "a", 1, EDL_TRAINER_RUNNING, -1, 3000);
    assert_true(st.inprocess);
    char k[256];
    const char *z = "{\"role\":\"worker\",\"addr\":\"10.1.2.3\",\"port\":9000}";
    harness_put(cl, key(job, "pods/z", k, sizeof k), z);
    publish(job, 2, EDL_JOB_RUNNING, (const char *[]){"a", "z", NULL});
    st = wait_status(job, "a", 2, EDL_TRAINER_RUNNING, -1, 5000);
    assert_int_equal(st.pid, pid1); /* re-formed in process, not restarted */
    assert_int_equal(st.restarts, 0);
    assert_int_equal(wait_lines(cf, 2, line, sizeof line), 2);
    assert_non_null(strstr(line, "\"generation\":2"));
    publish_state(job, 2, EDL_JOB_FAILED);
    assert_int_equal(wait_exit(a, 8000), 1);

    job = "automode2"; /* a trainer that says nothing: restart mode */
    put_spec(job, EDL_MODE_AUTO, 2, 5);
    a = start_agent(job, "a", RECORDING_TRAINER, NULL);
    publish(job, 1, EDL_JOB_RUNNING, (const char *[]){"a", NULL});
    char p1[300], p2[300];
    assert_true(wait_file(path_of("a", 1, "env", p1, sizeof p1), 5000));
    long first = read_long_file(path_of("a", 1, "pid", p2, sizeof p2));
    assert_var(p1, "EDL_ELASTIC_MODE", "auto");
    harness_put(cl, key(job, "pods/z", k, sizeof k), z);
    publish(job, 2, EDL_JOB_RUNNING, (const char *[]){"a", "z", NULL});
    assert_true(wait_file(path_of("a", 2, "env", p2, sizeof p2), 8000));
    assert_true(read_long_file(path_of("a", 2, "pid", p2, sizeof p2)) != first);
    publish_state(job, 2, EDL_JOB_STOPPED);
    assert_int_equal(wait_exit(a, 8000), 4);
}

static void test_standby_waits_then_starts(void **state)
{
    (void)state;
    const char *job = "standby";
    put_spec(job, EDL_MODE_RESTART, 1, 5);
    char k[256], p[300];
    harness_put(cl, key("standby", "pods/z", k, sizeof k), "{\"role\":\"worker\",\"addr\":\"10.1.2.3\",\"port\":9000}");
    pid_t a = start_agent(job, "a", RECORDING_TRAINER, NULL);
    edl_kv *kv = wait_kv(key(job, "status/a", k, sizeof k), 5000);
    assert_non_null(kv);
    edl_kv_free(kv);
    publish(job, 1, EDL_JOB_RUNNING, (const char *[]){"z", NULL});
    wait_status(job, "a", 1, EDL_TRAINER_WAITING, -1, 3000);
    publish(job, 2, EDL_JOB_RUNNING, (const char *[]){"a", NULL});
    assert_true(wait_file(path_of("a", 2, "env", p, sizeof p), 5000));
    assert_var(p, "RANK", "0");
    /* generation 2's trainer is the first start: a standby started none in generation 1 */
    edl_pod_status st = wait_status(job, "a", 2, EDL_TRAINER_RUNNING, -1, 3000);
    assert_int_equal(st.restarts, 0);
    assert_false(wait_file(path_of("a", 1, "env", p, sizeof p), 0));
    /* back to standby: the trainer stops */
    publish(job, 3, EDL_JOB_RUNNING, (const char *[]){"z", NULL});
    wait_status(job, "a", 3, EDL_TRAINER_WAITING, -1, 5000);
    long pid = read_long_file(path_of("a", 2, "pid", p, sizeof p));
    assert_true(wait_pid_dead((pid_t)pid, 2000));
    publish_state(job, 3, EDL_JOB_SUCCEEDED);
    assert_int_equal(wait_exit(a, 5000), 0);
}

static void test_trainer_exit_reported_and_not_restarted(void **state)
{
    (void)state;
    const char *job = "exits";
    pid_t a = start_alone(job, 5,
                          "echo x >> $T_DIR/starts; if [ $EDL_GENERATION = 1 ]; then exit 3; fi; "
                          "kill -9 $$");
    edl_pod_status st = wait_status(job, "a", 1, EDL_TRAINER_EXITED, -1, 5000);
    assert_int_equal(st.exit_code, 3);
    char sf[300];
    snprintf(sf, sizeof sf, "%s/starts", dir);
    assert_int_equal(count_lines(sf), 1); /* the agent waits for the job server instead */
    publish(job, 2, EDL_JOB_RUNNING, (const char *[]){"a", NULL});
    st = wait_status(job, "a", 2, EDL_TRAINER_SIGNALED, -1, 5000);
    assert_int_equal(st.signal, 9);
    /* two starts in all, generation 2's the second: none while generation 1 was over */
    assert_int_equal(st.restarts, 1);
    assert_int_equal(count_lines(sf), 2);
    publish_state(job, 2, EDL_JOB_FAILED);
    assert_int_equal(wait_exit(a, 5000), 1);
}

static void test_sigterm_stops_trainer_and_leaves_at_once(void **state)
{
    (void)state;
    const char *job = "sigterm";
    pid_t a = start_alone(job, 10, RECORDING_TRAINER);
    char k[256];
    long tpid = trainer_of(1);
    int64_t t0 = harness_now_ms();
    kill(a, SIGTERM);
    assert_int_equal(wait_exit(a, 5000), 143);
    assert_true(wait_gone(key(job, "pods/a", k, sizeof k), 0)); /* gone already: revoked */
    assert_true(harness_now_ms() - t0 < 4000); /* well under the 10 s TTL */
    assert_false(pid_alive((pid_t)tpid));
}

static void test_sigint_while_waiting_exits_130(void **state)
{
    (void)state;
    const char *job = "sigint";
    put_spec(job, EDL_MODE_RESTART, 1, 10);
    pid_t a = start_agent(job, "a", RECORDING_TRAINER, NULL);
    char k[256];
    edl_kv *kv = wait_kv(key(job, "pods/a", k, sizeof k), 5000);
    assert_non_null(kv);
    edl_kv_free(kv);
    kill(a, SIGINT);
    assert_int_equal(wait_exit(a, 5000), 130);
    assert_true(wait_gone(k, 0));
}

static void test_sigkilled_agent_takes_trainer_and_lease_expires(void **state)
{
    (void)state;
    const char *job = "sigkill";
    pid_t a = start_alone(job, 2, RECORDING_TRAINER);
    char k[256];
    long tpid = trainer_of(1);
    kill(a, SIGKILL);
    assert_int_equal(wait_exit(a, 2000), 128 + SIGKILL);
    assert_true(wait_pid_dead((pid_t)tpid, 2000)); /* PR_SET_PDEATHSIG */
    assert_true(wait_gone(key(job, "pods/a", k, sizeof k), 5000)); /* after the 2 s TTL */
}

static void test_etcd_outage_keeps_trainer_running(void **state)
{
    (void)state;
    const char *job = "outage";
    pid_t a = start_alone(job, 10,
                          "echo $$ > $T_DIR/pid; i=0; while :; do i=$((i+1)); "
                          "echo \"step $i\" >&$EDL_PROGRESS_FD; sleep 0.1; done");
    edl_pod_status st = wait_status(job, "a", 1, EDL_TRAINER_RUNNING, 1, 5000);
    long tpid = st.pid;
    assert_int_equal(edl_etcd_server_stop_member(srv, 0, false), 0);
    harness_sleep_ms(5000); /* the outage's length is the test: half the lease's TTL */
    assert_true(pid_alive((pid_t)tpid));
    assert_int_equal(edl_etcd_server_restart_member(srv, 0), 0);
    int64_t before = st.step;
    st = wait_status(job, "a", 1, EDL_TRAINER_RUNNING, before + 20, 8000);
    assert_int_equal(st.pid, tpid); /* the same trainer, never restarted */
    char pf[300];
    snprintf(pf, sizeof pf, "%s/pid", dir);
    assert_int_equal(read_long_file(pf), tpid);
    assert_true(pid_alive((pid_t)tpid));
    publish_state(job, 1, EDL_JOB_STOPPED);
    assert_int_equal(wait_exit(a, 8000), 4);
}

/* etcd frozen (SIGSTOP: connections accepted, nothing answered) while the trainer reports a
 * step every 10 ms, so the agent has status to write: its loop still answers /metrics and a
 * SIGTERM within 100 ms (its requests to etcd wait on its worker), and it leaves once etcd
 * thaws. */
static void test_a_frozen_etcd_never_stalls_the_loop(void **state)
{
    (void)state;
    const char *job = "frozen";
    put_spec(job, EDL_MODE_RESTART, 1, 10);
    int mport = harness_free_port();
    char mp[16], term[300], body[65536];
    snprintf(mp, sizeof mp, "%d", mport);
    snprintf(term, sizeof term, "%s/term", dir);
    pid_t a = start_agent(job, "a",
                          "trap 'echo > $T_DIR/term; exit 0' TERM; i=0; while :; do i=$((i+1)); "
                          "echo \"step $i\" >&$EDL_PROGRESS_FD; sleep 0.01; done",
                          (const char *[]){"--metrics-port", mp, "--metrics-addr", "127.0.0.1",
                                           NULL});
    publish(job, 1, EDL_JOB_RUNNING, (const char *[]){"a", NULL});
    wait_status(job, "a", 1, EDL_TRAINER_RUNNING, 3, 5000);
    pid_t etcd = edl_etcd_server_pid(srv, 0);
    assert_true(etcd > 0);
    assert_int_equal(kill(etcd, SIGSTOP), 0);
    /* scrape until the agent counts a failed etcd call: its status write times out after 2 s,
     * so its worker has been stuck on the frozen etcd all along */
    int64_t worst = 0, errors = -1, first = -1, end = harness_now_ms() + 15000;
    while ((first < 0 || errors <= first) && harness_now_ms() < end) {
        int64_t t0 = harness_now_ms();
        assert_int_equal(harness_http_get(mport, "/metrics", body, sizeof body), 200);
        int64_t took = harness_now_ms() - t0;
        worst = took > worst ? took : worst;
        const char *e = strstr(body, "\nedl_agent_etcd_errors_total{");
        assert_non_null(e);
        errors = strtoll(strchr(e, '}') + 1, NULL, 10);
        first = first < 0 ? errors : first;
        harness_sleep_ms(100); /* a scrape every 100 ms: a pace, not a wait */
    }
    assert_true(errors > first);
    if (worst >= 100)
        fail_msg("with etcd frozen, a /metrics scrape took %lld ms", (long long)worst);
    int64_t t0 = harness_now_ms();
    kill(a, SIGTERM);
    assert_true(wait_file(term, 2000));
    int64_t took = harness_now_ms() - t0;
    if (took >= 100)
        fail_msg("with etcd frozen, SIGTERM reached the trainer after %lld ms", (long long)took);
    assert_int_equal(kill(etcd, SIGCONT), 0);
    assert_int_equal(wait_exit(a, 10000), 143); /* the revocation waited on the worker */
    char k[256];
    assert_true(wait_gone(key(job, "pods/a", k, sizeof k), 5000));
}

static void test_lost_lease_stops_trainer_and_reregisters(void **state)
{
    (void)state;
    const char *job = "lost";
    pid_t a = start_alone(job, 3, RECORDING_TRAINER);
    char p[300], k[256];
    long tpid = trainer_of(1);
    edl_kv *kv = wait_kv(key(job, "pods/a", k, sizeof k), 1000);
    assert_non_null(kv);
    int64_t old_lease = kv->lease;
    edl_kv_free(kv);
    assert_int_equal(edl_etcd_lease_revoke(cl, old_lease), 0);
    assert_true(wait_pid_dead((pid_t)tpid, 5000));
    int64_t end = harness_now_ms() + 8000;
    int64_t new_lease = 0;
    while (harness_now_ms() < end && !new_lease) {
        if ((kv = wait_kv(k, 0)) != NULL) {
            if (kv->lease != old_lease)
                new_lease = kv->lease;
            edl_kv_free(kv);
        }
        harness_sleep_ms(25);
    }
    assert_true(new_lease != 0);
    /* the old generation names the old lease: the agent, registered anew, says it is no member
     * of it (waiting) instead of starting a trainer */
    wait_status(job, "a", 1, EDL_TRAINER_WAITING, -1, 5000);
    assert_false(wait_file(path_of("a", 2, "env", p, sizeof p), 0));
    publish(job, 2, EDL_JOB_RUNNING, (const char *[]){"a", NULL});
    assert_true(wait_file(path_of("a", 2, "env", p, sizeof p), 5000));
    assert_var(p, "TORCHELASTIC_RESTART_COUNT", "0"); /* no failure: torchrun would say 0 */
    publish_state(job, 2, EDL_JOB_STOPPED);
    assert_int_equal(wait_exit(a, 5000), 4);
}

static void test_malformed_generation_is_ignored(void **state)
{
    (void)state;
    const char *job = "malformed";
    char p[300], k[256], log[300], out[65536];
    snprintf(log, sizeof log, "%s/agent.log", dir);
    put_spec(job, EDL_MODE_RESTART, 1, 5);
    pid_t a = start_agent_logged(job, "a", RECORDING_TRAINER, NULL, log);
    publish(job, 1, EDL_JOB_RUNNING, (const char *[]){"a", NULL});
    long tpid = trainer_of(1);
    harness_put(cl, key(job, "generation", k, sizeof k), "{not json");
    harness_put(cl, k, "{\"generation\":\"two\",\"state\":\"running\"}");
    harness_put(cl, k, "{\"generation\":5,\"state\":\"exploded\",\"members\":[]}");
    /* the agent has read all three: it said so for each */
    assert_true(HARNESS_WAIT_UNTIL(
        count_in(harness_read_file(log, out, sizeof out), "ignoring a malformed document") == 3,
        5000));
    assert_true(pid_alive((pid_t)tpid));
    edl_pod_status st;
    assert_true(get_status(job, "a", &st));
    assert_int_equal(st.state, EDL_TRAINER_RUNNING);
    assert_int_equal(st.generation, 1);
    assert_int_equal(st.pid, tpid);
    /* and the agent still follows good documents */
    publish(job, 2, EDL_JOB_RUNNING, (const char *[]){"a", NULL});
    assert_true(wait_file(path_of("a", 2, "env", p, sizeof p), 5000));
    publish_state(job, 2, EDL_JOB_SUCCEEDED);
    assert_int_equal(wait_exit(a, 5000), 0);
}

static void test_progress_steps_reach_status_and_metrics(void **state)
{
    (void)state;
    const char *job = "metrics";
    put_spec(job, EDL_MODE_RESTART, 1, 5);
    int mport = harness_free_port();
    char mp[16];
    snprintf(mp, sizeof mp, "%d", mport);
    pid_t a = start_agent(job, "a",
                          "echo 'step 5' >&$EDL_PROGRESS_FD; echo 'garbage' >&$EDL_PROGRESS_FD; "
                          "echo 'step -2' >&$EDL_PROGRESS_FD; "
                          "echo 'checkpoint load 1500 4096' >&$EDL_PROGRESS_FD; "
                          "echo 'checkpoint save 250 1000' >&$EDL_PROGRESS_FD; "
                          "echo 'checkpoint save 30000 2000' >&$EDL_PROGRESS_FD; "
                          "echo 'checkpoint save x 1' >&$EDL_PROGRESS_FD; "
                          "echo 'distill 9 4' >&$EDL_PROGRESS_FD; "
                          "echo 'distill 6 2' >&$EDL_PROGRESS_FD; "
                          "echo 'distill 3 5' >&$EDL_PROGRESS_FD; "
                          "echo 'total 400' >&$EDL_PROGRESS_FD; "
                          "echo 'step 7' >&$EDL_PROGRESS_FD; exec sleep 60",
                          (const char *[]){"--metrics-port", mp, "--metrics-addr", "127.0.0.1",
                                           NULL});
    char k[256];
    edl_kv *kv = wait_kv(key(job, "pods/a", k, sizeof k), 5000);
    assert_non_null(kv);
    edl_pod pod = {0};
    char err[128];
    assert_int_equal(edl_pod_parse(kv->value, kv->value_len, &pod, err, sizeof err), 0);
    assert_int_equal(pod.metrics_port, mport);
    edl_pod_clear(&pod);
    edl_kv_free(kv);
    static char body[65536];
    assert_int_equal(harness_http_get(mport, "/metrics", body, sizeof body), 200);
    assert_non_null(strstr(body, "edl_agent_rank{job=\"metrics\",pod=\"a\"} -1"));
    publish(job, 1, EDL_JOB_RUNNING, (const char *[]){"a", NULL});
    edl_pod_status st = wait_status(job, "a", 1, EDL_TRAINER_RUNNING, 7, 5000);
    assert_int_equal(st.step, 7);
    assert_int_equal(st.total_steps, 400); /* said before step 7: in the same status */
    assert_int_equal(harness_http_get(mport, "/metrics", body, sizeof body), 200);
    assert_non_null(strstr(body, "Content-Type: text/plain; version=0.0.4"));
    const char *want[] = {
        "# HELP edl_agent_generation ", "# TYPE edl_agent_generation gauge",
        "edl_agent_generation{job=\"metrics\",pod=\"a\"} 1\n",
        "edl_agent_rank{job=\"metrics\",pod=\"a\"} 0\n",
        "edl_agent_world_size{job=\"metrics\",pod=\"a\"} 1\n",
        "# TYPE edl_agent_trainer_restarts_total counter",
        "edl_agent_trainer_restarts_total{job=\"metrics\",pod=\"a\"} 0\n",
        "edl_agent_trainer_state{job=\"metrics\",pod=\"a\",state=\"running\"} 1\n",
        "edl_agent_trainer_state{job=\"metrics\",pod=\"a\",state=\"waiting\"} 0\n",
        "edl_agent_trainer_step{job=\"metrics\",pod=\"a\"} 7\n",
        "# TYPE edl_agent_trainer_steps_total counter",
        "edl_agent_trainer_last_step_timestamp_seconds{job=\"metrics\",pod=\"a\"} 1",
        "# TYPE edl_agent_reformation_seconds histogram",
        "edl_agent_reformation_seconds_bucket{job=\"metrics\",pod=\"a\",le=\"+Inf\"} 1\n",
        "edl_agent_reformation_seconds_count{job=\"metrics\",pod=\"a\"} 1\n",
        /* the checkpoint lines came before step 7 on the same pipe */
        "# TYPE edl_agent_checkpoint_save_seconds histogram",
        "edl_agent_checkpoint_save_seconds_bucket{job=\"metrics\",pod=\"a\",le=\"0.25\"} 1\n",
        "edl_agent_checkpoint_save_seconds_bucket{job=\"metrics\",pod=\"a\",le=\"30\"} 2\n",
        "edl_agent_checkpoint_save_seconds_sum{job=\"metrics\",pod=\"a\"} 30.250000\n",
        "edl_agent_checkpoint_save_seconds_count{job=\"metrics\",pod=\"a\"} 2\n",
        "edl_agent_checkpoint_load_seconds_bucket{job=\"metrics\",pod=\"a\",le=\"1\"} 0\n",
        "edl_agent_checkpoint_load_seconds_bucket{job=\"metrics\",pod=\"a\",le=\"2.5\"} 1\n",
        "edl_agent_checkpoint_load_seconds_count{job=\"metrics\",pod=\"a\"} 1\n",
        "# TYPE edl_agent_checkpoint_bytes_total counter",
        "edl_agent_checkpoint_bytes_total{job=\"metrics\",pod=\"a\",op=\"save\"} 3000\n",
        "edl_agent_checkpoint_bytes_total{job=\"metrics\",pod=\"a\",op=\"load\"} 4096\n",
        /* the latest in flight; retries 4, then 2 of a new client (a lower count), then 3
         * more of it */
        "edl_agent_distill_batches_in_flight{job=\"metrics\",pod=\"a\"} 3\n",
        "# TYPE edl_agent_distill_retries_total counter",
        "edl_agent_distill_retries_total{job=\"metrics\",pod=\"a\"} 9\n",
        "edl_agent_etcd_errors_total{job=\"metrics\",pod=\"a\"} 0\n",
        "edl_agent_lease_losses_total{job=\"metrics\",pod=\"a\"} 0\n",
        "edl_agent_up{job=\"metrics\",pod=\"a\"} 1\n", NULL};
    for (int i = 0; want[i]; i++)
        if (!strstr(body, want[i]))
            fail_msg("/metrics lacks '%s':\n%s", want[i], body);
    assert_int_equal(harness_http_get(mport, "/healthz", body, sizeof body), 200);
    assert_non_null(strstr(body, "\r\n\r\nok"));
    assert_int_equal(harness_http_get(mport, "/nope", body, sizeof body), 404);
    char *big = malloc(12000);
    memset(big, 'a', 12000);
    memcpy(big, "GET /", 5);
    int hs = harness_http_request(mport, big, 12000, body, sizeof body);
    assert_true(hs >= 400 && hs < 500); /* the request line does not fit: refused */
    free(big);
    hs = harness_http_request(mport, "BLAH\r\n\r\n", 8, body, sizeof body);
    assert_true(hs == -1 || hs == 400); /* not HTTP: closed (libmicrohttpd) */
    /* still serving after bad clients */
    assert_int_equal(harness_http_get(mport, "/metrics", body, sizeof body), 200);
    publish_state(job, 1, EDL_JOB_SUCCEEDED);
    assert_int_equal(wait_exit(a, 5000), 0);
}

/* ---- the parameter-server role ------------------------------------------------------------- */

static void put_ps_spec(const char *job, edl_elastic_mode mode)
{
    edl_job_spec s;
    edl_spec_init(&s);
    s.max = 2;
    s.mode = mode;
    s.ttl_s = 5;
    s.ps_min = 1;
    s.ps_max = 3;
    char *j = edl_spec_to_json(&s), k[256];
    harness_put(cl, key(job, "spec", k, sizeof k), j);
    free(j);
    edl_spec_clear(&s);
}

/* A fake parameter server's registration (no agent behind it). */
static void fake_server(const char *job, const char *pod, int port)
{
    char k[256], rest[160], v[128];
    snprintf(rest, sizeof rest, "pods/%s", pod);
    snprintf(v, sizeof v, "{\"role\":\"ps\",\"addr\":\"10.1.2.9\",\"port\":%d}", port);
    harness_put(cl, key(job, rest, k, sizeof k), v);
}

/* A generation that changes only the servers keeps a worker's trainer: not restarted (restart
 * mode), no control line (in-process mode); its status follows the new generation, also after
 * the trainer ended. The worker's environment names the servers of its start. */
static void servers_change_keeps_trainer(const char *job, edl_elastic_mode mode)
{
    put_ps_spec(job, mode);
    fake_server(job, "s0", 8100);
    fake_server(job, "s1", 8101);
    pid_t a = start_agent(job, "a",
                          "echo $$ >> $T_DIR/starts; env > $T_DIR/env; "
                          "while read -r l <&$EDL_CONTROL_FD; do echo \"$l\" >> $T_DIR/ctl; "
                          "done; sleep 60",
                          NULL);
    publish_servers(job, 1, 0, EDL_JOB_RUNNING, (const char *[]){"a", NULL},
                         (const char *[]){"s0", NULL});
    char sf[300], ef[300], cf[300];
    snprintf(sf, sizeof sf, "%s/starts", dir);
    snprintf(ef, sizeof ef, "%s/env", dir);
    snprintf(cf, sizeof cf, "%s/ctl", dir);
    edl_pod_status st = wait_status(job, "a", 1, EDL_TRAINER_RUNNING, -1, 5000);
    assert_true(wait_file(ef, 3000));
    char line[1024];
    /* the trainer writes ctl after env: env is whole */
    assert_int_equal(wait_lines(cf, 1, line, sizeof line), 1);
    assert_var(ef, "PADDLE_PSERVERS_IP_PORT_LIST", "10.1.2.9:8100");
    assert_var(ef, "EDL_PS_SERVERS", "1");
    assert_var(ef, "TRAINING_ROLE", "TRAINER");
    long pid = st.pid;
    publish_servers(job, 2, 1, EDL_JOB_RUNNING, (const char *[]){"a", NULL},
                    (const char *[]){"s0", "s1", NULL});
    st = wait_status(job, "a", 2, EDL_TRAINER_RUNNING, -1, 5000);
    assert_int_equal(st.pid, pid);
    assert_int_equal(st.restarts, 0);
    publish_servers(job, 3, 1, EDL_JOB_RUNNING, (const char *[]){"a", NULL},
                    (const char *[]){"s1", NULL});
    st = wait_status(job, "a", 3, EDL_TRAINER_RUNNING, -1, 5000);
    assert_int_equal(st.pid, pid);
    /* with generation 3 taken as well, nothing restarted or signalled the trainer for 2 or 3 */
    assert_true(pid_alive((pid_t)pid));
    assert_int_equal(count_lines(sf), 1);    /* one start */
    assert_int_equal(count_lines(cf), 1);    /* the first control line only */
    /* the trainer ends; a servers-only generation carries how it ended, without a start */
    kill((pid_t)pid, SIGKILL);
    st = wait_status(job, "a", 3, EDL_TRAINER_SIGNALED, -1, 5000);
    publish_servers(job, 4, 1, EDL_JOB_RUNNING, (const char *[]){"a", NULL},
                    (const char *[]){"s0", "s1", NULL});
    st = wait_status(job, "a", 4, EDL_TRAINER_SIGNALED, -1, 5000);
    assert_int_equal(st.signal, 9);
    assert_int_equal(count_lines(sf), 1); /* not started again (counted after generation 5) */
    /* a restart with the same workers (a new members generation) does start it again */
    edl_member m[1], sv[1];
    member_list(job, (const char *[]){"a", NULL}, m);
    member_list(job, (const char *[]){"s0", NULL}, sv);
    edl_generation g = {.generation = 5, .state = EDL_JOB_RUNNING, .members = m, .n_members = 1,
                        .servers = sv, .n_servers = 1, .restarts = 1};
    char *j = edl_generation_to_json(&g), k[256];
    harness_put(cl, key(job, "generation", k, sizeof k), j);
    free(j);
    free_list(m, 1);
    free_list(sv, 1);
    st = wait_status(job, "a", 5, EDL_TRAINER_RUNNING, -1, 5000);
    assert_true(st.pid != pid);
    assert_int_equal(count_lines(sf), 2); /* generation 5's start, and none for 4 */
    publish_state(job, 5, EDL_JOB_SUCCEEDED);
    assert_int_equal(wait_exit(a, 5000), 0);
}

static void test_servers_only_generation_keeps_the_trainer(void **state)
{
    (void)state;
    servers_change_keeps_trainer("psrestart", EDL_MODE_RESTART);
    static const char *const used[] = {"starts", "env", "ctl", NULL};
    for (const char *const *u = used; *u; u++) {
        char f[300];
        snprintf(f, sizeof f, "%s/%s", dir, *u);
        unlink(f);
    }
    servers_change_keeps_trainer("psinproc", EDL_MODE_INPROCESS);
}

/* The parameter server's process: started when the pod is listed in servers (also while the
 * job waits), with Paddle's PSERVER environment; kept, never restarted, through later
 * generations (listed or not); a failure is reported and waits for the job server, which lists
 * the pod again to start it anew; exit 0 is a clean leave: the agent leaves with 0. */
static void test_ps_process_lifecycle(void **state)
{
    (void)state;
    const char *job = "pslife";
    put_ps_spec(job, EDL_MODE_RESTART);
    fake_server(job, "t", 8200);
    char k[256];
    harness_put(cl, key(job, "pods/w", k, sizeof k),
                "{\"role\":\"worker\",\"addr\":\"10.1.2.3\",\"port\":9000}");
    pid_t a = start_agent(job, "s",
                          "f=$T_DIR/s.$EDL_GENERATION; echo $$ >> $T_DIR/starts; env > $f.tmp && "
                          "mv $f.tmp $f.env; while [ ! -f $T_DIR/quit ]; do sleep 0.05; done; "
                          "exit $(cat $T_DIR/quit)",
                          (const char *[]){"--role", "ps", "--port", "8300", NULL});
    edl_kv *kv = wait_kv(key(job, "pods/s", k, sizeof k), 5000);
    assert_non_null(kv);
    assert_non_null(strstr(kv->value, "\"role\":\"ps\""));
    edl_kv_free(kv);
    publish_servers(job, 1, 0, EDL_JOB_WAITING, (const char *[]){"w", NULL},
                         (const char *[]){"t", "s", NULL});
    char ef[300], sf[300], qf[300];
    assert_true(wait_file(path_of("s", 1, "env", ef, sizeof ef), 5000));
    snprintf(sf, sizeof sf, "%s/starts", dir);
    snprintf(qf, sizeof qf, "%s/quit", dir);
    assert_var(ef, "TRAINING_ROLE", "PSERVER");
    assert_var(ef, "PADDLE_PSERVERS_IP_PORT_LIST", "10.1.2.9:8200,127.0.0.1:8300");
    assert_var(ef, "PADDLE_PORT", "8300");
    assert_var(ef, "POD_IP", "127.0.0.1");
    assert_var(ef, "PADDLE_TRAINERS_NUM", "1");
    assert_var(ef, "EDL_PS_INDEX", "1");
    assert_var(ef, "EDL_PS_SERVERS", "2");
    assert_var(ef, "EDL_JOB_ID", job);
    assert_var(ef, "EDL_POD_ID", "s");
    assert_var(ef, "EDL_GENERATION", "1");
    char v[64];
    assert_null(file_var(ef, "RANK", v, sizeof v));
    assert_null(file_var(ef, "PADDLE_TRAINER_ID", v, sizeof v));
    assert_null(file_var(ef, "MASTER_ADDR", v, sizeof v));
    edl_pod_status st = wait_status(job, "s", 1, EDL_TRAINER_RUNNING, -1, 3000);
    long pid = st.pid;
    /* later generations, with the pod listed elsewhere or not at all: the same process */
    publish_servers(job, 2, 0, EDL_JOB_RUNNING, (const char *[]){"w", NULL},
                         (const char *[]){"s", NULL});
    st = wait_status(job, "s", 2, EDL_TRAINER_RUNNING, -1, 5000);
    assert_int_equal(st.pid, pid);
    publish_servers(job, 3, 0, EDL_JOB_RUNNING, (const char *[]){"w", NULL},
                         (const char *[]){"t", NULL});
    publish_servers(job, 4, 0, EDL_JOB_RUNNING, (const char *[]){"w", NULL},
                         (const char *[]){"t", "s", NULL});
    st = wait_status(job, "s", 4, EDL_TRAINER_RUNNING, -1, 5000);
    assert_int_equal(st.pid, pid);
    /* unlisted in generation 3 it was not stopped (it drains by itself) nor started anew */
    assert_true(pid_alive((pid_t)pid));
    assert_int_equal(count_lines(sf), 1);
    /* a failure is reported; the agent waits for the job server */
    FILE *q = fopen(qf, "w");
    fputs("3\n", q);
    fclose(q);
    st = wait_status(job, "s", 4, EDL_TRAINER_EXITED, -1, 5000);
    assert_int_equal(st.exit_code, 3);
    assert_int_equal(unlink(qf), 0);
    publish_servers(job, 5, 0, EDL_JOB_RUNNING, (const char *[]){"w", NULL},
                         (const char *[]){"t", NULL});
    wait_status(job, "s", 5, EDL_TRAINER_WAITING, -1, 5000);
    assert_int_equal(count_lines(sf), 1); /* not restarted after its failure in generation 4 */
    publish_servers(job, 6, 0, EDL_JOB_RUNNING, (const char *[]){"w", NULL},
                         (const char *[]){"t", "s", NULL});
    st = wait_status(job, "s", 6, EDL_TRAINER_RUNNING, -1, 5000);
    assert_true(st.pid != pid); /* listed again: a new process */
    assert_int_equal(count_lines(sf), 2);
    /* exit 0: a clean leave, the agent leaves too (its registration with it) */
    q = fopen(qf, "w");
    fputs("0\n", q);
    fclose(q);
    assert_int_equal(wait_exit(a, 5000), 0);
    assert_true(wait_gone(key(job, "pods/s", k, sizeof k), 0));
}

/* SIGTERM to a ps pod's agent: the registration goes first (the job server publishes the
 * servers without it), then the process gets SIGTERM and may take the grace period to hand
 * its shards over; the agent exits 128+15. A final job state stops the process as a worker's. */
static void test_ps_graceful_leave_deletes_registration_first(void **state)
{
    (void)state;
    const char *job = "psleave";
    put_ps_spec(job, EDL_MODE_RESTART);
    char k[256], script[1024];
    key(job, "pods/s", k, sizeof k);
    /* on SIGTERM: is the registration still there? then "hand over" for 0.5 s and exit 0 */
    snprintf(script, sizeof script,
             "trap 'ETCDCTL_API=3 %s --endpoints=$EDL_ETCD_ENDPOINTS get --print-value-only %s "
             "> $T_DIR/at_term 2>&1 && echo read-ok >> $T_DIR/at_term; sleep 0.5; "
             "echo handed-over > $T_DIR/done; exit 0' TERM; "
             "echo $$ > $T_DIR/pid; while :; do sleep 0.05; done",
             EDL_ETCDCTL_BIN, k);
    pid_t a = start_agent(job, "s", script, (const char *[]){"--role", "ps", NULL});
    publish_servers(job, 1, 0, EDL_JOB_RUNNING, NULL, (const char *[]){"s", NULL});
    edl_pod_status st = wait_status(job, "s", 1, EDL_TRAINER_RUNNING, -1, 5000);
    char pf[300], tf[300], df[300];
    snprintf(pf, sizeof pf, "%s/pid", dir);
    snprintf(tf, sizeof tf, "%s/at_term", dir);
    snprintf(df, sizeof df, "%s/done", dir);
    assert_true(wait_file(pf, 3000));
    kill(a, SIGTERM);
    assert_int_equal(wait_exit(a, 8000), 143);
    assert_true(wait_file(df, 0)); /* it had its time to hand over */
    char v[1024] = "";
    FILE *f = fopen(tf, "r");
    assert_non_null(f);
    size_t got = fread(v, 1, sizeof v - 1, f);
    v[got] = '\0';
    fclose(f);
    if (!strstr(v, "read-ok") || strstr(v, "\"role\""))
        fail_msg("at SIGTERM the registration was still there (or etcd unread): %s", v);
    assert_false(pid_alive((pid_t)st.pid));

    /* a final state stops the server process */
    const char *job2 = "psfinal";
    put_ps_spec(job2, EDL_MODE_RESTART);
    a = start_agent(job2, "s", "echo $$ > $T_DIR/pid2; exec sleep 60",
                    (const char *[]){"--role", "ps", NULL});
    publish_servers(job2, 1, 0, EDL_JOB_RUNNING, NULL, (const char *[]){"s", NULL});
    st = wait_status(job2, "s", 1, EDL_TRAINER_RUNNING, -1, 5000);
    publish_state(job2, 1, EDL_JOB_SUCCEEDED);
    assert_int_equal(wait_exit(a, 5000), 0);
    assert_true(wait_pid_dead((pid_t)st.pid, 2000));
}

/* ---- the teacher role ------------------------------------------------------------------------ */

#define TEACHER_FAST "--health-interval-ms", "100", "--health-timeout-ms", "300", \
                     "--health-failures", "2"

/* The teacher's key in its service (the agent's prefix, the default). */
static char *teacher_key(const char *service, const char *inst, char *buf, size_t len)
{
    snprintf(buf, len, "%s/services/%s/teachers/%s", EDL_DEFAULT_PREFIX, service, inst);
    return buf;
}

/* Start a teacher agent (job NULL: none) running `/bin/sh -c script` with extra options. */
static pid_t start_teacher(const char *job, const char *pod, const char *service, int port,
                           const char *script, const char *const *extra)
{
    static char portbuf[16];
    snprintf(portbuf, sizeof portbuf, "%d", port);
    const char *opts[24] = {"--role", "teacher", "--service", service, "--port", portbuf,
                            TEACHER_FAST};
    int n = 12;
    for (int i = 0; extra && extra[i] && n < 22; i++)
        opts[n++] = extra[i];
    opts[n] = NULL;
    if (job)
        return start_agent(job, pod, script, opts);
    const char *argv[40] = {EDL_AGENT_BIN, "--etcd", edl_etcd_server_endpoints(srv), "--pod",
                            pod};
    int a = 5;
    for (int i = 0; opts[i]; i++)
        argv[a++] = opts[i];
    argv[a++] = "--";
    argv[a++] = "/bin/sh";
    argv[a++] = "-c";
    argv[a++] = script;
    argv[a] = NULL;
    setenv("T_DIR", dir, 1);
    pid_t pid = harness_spawn(argv, NULL);
    assert_true(pid > 0);
    for (int i = 0; i < MAX_AGENTS; i++)
        if (agents[i] == 0) {
            agents[i] = pid;
            break;
        }
    return pid;
}

/* Wait for the teacher's record to exist with this load (< 0: any); parsed into *out. */
static edl_kv *wait_record(const char *k, double load, int timeout_ms, edl_service_instance *out)
{
    int64_t end = harness_now_ms() + timeout_ms;
    do {
        edl_kv *kv = wait_kv(k, 50);
        char err[256];
        edl_service_instance in = {0};
        if (kv && edl_service_instance_parse("x", kv->value, kv->value_len, &in, err,
                                             sizeof err) == 0 &&
            (load < 0 || in.load == load)) {
            if (out)
                *out = in;
            else
                edl_service_instance_clear(&in);
            return kv;
        }
        edl_service_instance_clear(&in);
        edl_kv_free(kv);
        harness_sleep_ms(25);
    } while (harness_now_ms() < end);
    fail_msg("%s: no record (with load %g) within %d ms", k, load, timeout_ms);
    return NULL;
}

/* The pid the teacher_server wrote for pod (waiting for a fresh one != not). */
static pid_t server_pid(const char *pod, pid_t not, int timeout_ms)
{
    char pf[300];
    snprintf(pf, sizeof pf, "%s/%s.pid", dir, pod);
    int64_t end = harness_now_ms() + timeout_ms;
    do {
        long p = read_long_file(pf);
        if (p > 0 && p != not)
            return (pid_t)p;
        harness_sleep_ms(25);
    } while (harness_now_ms() < end);
    fail_msg("no (new) teacher server pid in %s", pf);
    return 0;
}

static void test_teacher_bad_options_exit_2(void **state)
{
    (void)state;
    const char *e = "http://127.0.0.1:1";
    const char *no_service[] = {EDL_AGENT_BIN, "--etcd", e, "--role", "teacher", "--pod", "t",
                                "--", "true", NULL};
    assert_int_equal(run_status(no_service), 2);
    const char *bad_service[] = {EDL_AGENT_BIN, "--etcd", e, "--role", "teacher", "--pod", "t",
                                 "--service", "Bad_Name", "--", "true", NULL};
    assert_int_equal(run_status(bad_service), 2);
    const char *bad_pod[] = {EDL_AGENT_BIN, "--etcd", e, "--role", "teacher", "--pod", "T.1",
                             "--service", "svc", "--", "true", NULL};
    assert_int_equal(run_status(bad_pod), 2);
    const char *bad_cap[] = {EDL_AGENT_BIN, "--etcd", e, "--role", "teacher", "--pod", "t",
                             "--service", "svc", "--capacity", "0", "--", "true", NULL};
    assert_int_equal(run_status(bad_cap), 2);
    const char *bad_path[] = {EDL_AGENT_BIN, "--etcd", e, "--role", "teacher", "--pod", "t",
                              "--service", "svc", "--health-path", "healthz", "--", "true", NULL};
    assert_int_equal(run_status(bad_path), 2);
    const char *worker_service[] = {EDL_AGENT_BIN, "--etcd", e, "--job", "j", "--service", "svc",
                                    "--", "true", NULL};
    assert_int_equal(run_status(worker_service), 2);
}

/* Registered once healthy, with its endpoint, capacity, model, version and the lease of its
 * pod; the load follows the health reply; the environment is a teacher's. */
static void test_teacher_registers_when_healthy(void **state)
{
    (void)state;
    const char *job = "teach";
    put_spec(job, EDL_MODE_RESTART, 2, 10);
    int port = harness_free_port();
    char k[256], pk[256], envf[300], want[64], script[600];
    snprintf(script, sizeof script, "sleep 0.3; exec %s", EDL_TEACHER_SERVER);
    int64_t t0 = harness_now_ms();
    start_teacher(job, "t0", "svc", port, script,
                  (const char *[]){"--model", "mlp", "--model-version", "7", "--capacity", "3",
                                   NULL});
    teacher_key("svc", "t0", k, sizeof k);
    edl_service_instance in;
    edl_kv *kv = wait_record(k, 0, 5000, &in);
    assert_true(harness_now_ms() - t0 >= 300); /* not before the server answers */
    snprintf(want, sizeof want, "http://127.0.0.1:%d", port);
    assert_string_equal(in.endpoint, want);
    assert_int_equal(in.capacity, 3);
    assert_string_equal(in.model, "mlp");
    assert_string_equal(in.version, "7");
    edl_kv *pod = wait_kv(key(job, "pods/t0", pk, sizeof pk), 1000);
    assert_non_null(pod);
    assert_int_equal(kv->lease, pod->lease); /* the agent's lease */
    assert_non_null(strstr(pod->value, "\"teacher\""));
    edl_kv_free(pod);
    edl_kv_free(kv);
    edl_service_instance_clear(&in);
    snprintf(envf, sizeof envf, "%s/t0.env", dir);
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    assert_var(envf, "EDL_ROLE_NAME", "teacher");
    assert_var(envf, "EDL_SERVICE", "svc");
    assert_var(envf, "PORT", portstr);
    assert_var(envf, "EDL_SERVICE_PORT", portstr);
    assert_var(envf, "EDL_JOB_ID", job);
    assert_var(envf, "EDL_POD_ID", "t0");
    char v[64];
    assert_null(file_var(envf, "RANK", v, sizeof v));
    /* the load of the health reply reaches the record */
    char lf[300];
    snprintf(lf, sizeof lf, "%s/t0.load", dir);
    FILE *f = fopen(lf, "w");
    assert_non_null(f);
    fputs("0.5\n", f);
    fclose(f);
    edl_kv_free(wait_record(k, 0.5, 3000, NULL));
}

/* Gone at once when the server is killed, back after the restart (a new process); gone after
 * the failed checks of a stopped server, back when it continues. */
static void test_teacher_server_death_and_health_failures(void **state)
{
    (void)state;
    const char *job = "teachdie";
    put_spec(job, EDL_MODE_RESTART, 2, 10);
    char k[256], script[600];
    snprintf(script, sizeof script, "exec %s", EDL_TEACHER_SERVER);
    start_teacher(job, "t1", "svc", harness_free_port(), script, NULL);
    teacher_key("svc", "t1", k, sizeof k);
    edl_kv_free(wait_record(k, -1, 5000, NULL));
    pid_t s1 = server_pid("t1", 0, 2000);
    kill(s1, SIGKILL);
    int64_t t0 = harness_now_ms();
    assert_true(wait_gone(k, 2000));
    assert_true(harness_now_ms() - t0 < 1000); /* at once, not by a lease */
    pid_t s2 = server_pid("t1", s1, 5000); /* restarted after its backoff */
    edl_kv_free(wait_record(k, -1, 5000, NULL));
    kill(s2, SIGSTOP);
    t0 = harness_now_ms();
    assert_true(wait_gone(k, 3000)); /* 2 checks of 300 ms each */
    assert_true(harness_now_ms() - t0 >= 300);
    assert_true(pid_alive(s2)); /* stopped, not restarted */
    kill(s2, SIGCONT);
    edl_kv_free(wait_record(k, -1, 3000, NULL));
    assert_int_equal(server_pid("t1", 0, 100), s2); /* the same process again */
}

/* SIGTERM: the key is deleted before the server gets its SIGTERM; the agent exits 143. */
static void test_teacher_sigterm_deregisters_first(void **state)
{
    (void)state;
    const char *job = "teachterm";
    put_spec(job, EDL_MODE_RESTART, 2, 10);
    char k[256], script[1200], tf[300];
    teacher_key("svc", "t2", k, sizeof k);
    snprintf(script, sizeof script,
             "trap 'ETCDCTL_API=3 %s --endpoints=$EDL_ETCD_ENDPOINTS get --print-value-only %s "
             "> $T_DIR/at_term 2>&1 && echo read-ok >> $T_DIR/at_term; exit 0' TERM; "
             "%s & wait", EDL_ETCDCTL_BIN, k, EDL_TEACHER_SERVER);
    pid_t a = start_teacher(job, "t2", "svc", harness_free_port(), script, NULL);
    edl_kv_free(wait_record(k, -1, 5000, NULL));
    pid_t s = server_pid("t2", 0, 2000);
    kill(a, SIGTERM);
    assert_int_equal(wait_exit(a, 8000), 143);
    snprintf(tf, sizeof tf, "%s/at_term", dir);
    assert_true(wait_file(tf, 0));
    char v[1024] = "";
    harness_read_file(tf, v, sizeof v);
    if (!strstr(v, "read-ok") || strstr(v, "endpoint"))
        fail_msg("at SIGTERM the teacher's key was still there (or etcd unread): %s", v);
    assert_true(wait_gone(k, 0));
    assert_true(wait_pid_dead(s, 2000));
}

/* A SIGKILLed agent takes its server along; the key goes with the lease. */
static void test_teacher_killed_agent_key_expires(void **state)
{
    (void)state;
    const char *job = "teachkill";
    put_spec(job, EDL_MODE_RESTART, 2, 10);
    char k[256], script[600];
    snprintf(script, sizeof script, "exec %s", EDL_TEACHER_SERVER);
    pid_t a = start_teacher(job, "t3", "svc", harness_free_port(), script,
                            (const char *[]){"--ttl", "2", NULL});
    teacher_key("svc", "t3", k, sizeof k);
    edl_kv_free(wait_record(k, -1, 5000, NULL));
    pid_t s = server_pid("t3", 0, 2000);
    kill(a, SIGKILL);
    assert_int_equal(wait_exit(a, 3000), 128 + SIGKILL);
    int64_t t0 = harness_now_ms();
    assert_true(wait_pid_dead(s, 2000));
    assert_true(wait_gone(k, 6000));
    assert_true(harness_now_ms() - t0 >= 500); /* by the lease, not a delete */
}

/* The job's end: the key goes, the server stops, the agent exits 0 (failed: 0 too); a teacher
 * without a job registers all the same. */
static void test_teacher_ends_with_the_job_and_runs_without_one(void **state)
{
    (void)state;
    const char *job = "teachend";
    put_spec(job, EDL_MODE_RESTART, 2, 10);
    char k[256], script[600];
    snprintf(script, sizeof script, "exec %s", EDL_TEACHER_SERVER);
    pid_t a = start_teacher(job, "t4", "svc", harness_free_port(), script, NULL);
    teacher_key("svc", "t4", k, sizeof k);
    edl_kv_free(wait_record(k, -1, 5000, NULL));
    pid_t s = server_pid("t4", 0, 2000);
    publish_state(job, 1, EDL_JOB_FAILED);
    assert_int_equal(wait_exit(a, 5000), 0);
    assert_true(wait_gone(k, 0));
    assert_true(wait_pid_dead(s, 2000));

    a = start_teacher(NULL, "t5", "other", harness_free_port(), script, NULL);
    teacher_key("other", "t5", k, sizeof k);
    edl_kv_free(wait_record(k, -1, 5000, NULL));
    kill(a, SIGTERM);
    assert_int_equal(wait_exit(a, 8000), 143);
    assert_true(wait_gone(k, 0));
}

/* ---- a reader of the agent's stderr that stops reading -------------------------------------- */

/* Bytes waiting in a pipe (-1: cannot tell). */
static int pipe_queued(int fd)
{
    int n = 0;
    return ioctl(fd, FIONREAD, &n) == 0 ? n : -1;
}

/* Everything until EOF from fd into a growing buffer (the caller frees it); *len its size. */
static char *read_to_eof(int fd, size_t *len, int timeout_ms)
{
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap + 1);
    int64_t end = harness_now_ms() + timeout_ms;
    assert_non_null(buf);
    while (harness_now_ms() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 200) <= 0)
            continue;
        if (n == cap && !(buf = realloc(buf, (cap *= 2) + 1)))
            fail_msg("out of memory");
        ssize_t got = read(fd, buf + n, cap - n);
        if (got <= 0)
            break;
        n += (size_t)got;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Whether the trainer's step on the agent's /metrics is the one seen last time (*last,
 * updated; -1: none seen yet). */
static bool step_stopped(int mport, long long *last)
{
    static char body[65536];
    const char *name = "edl_agent_trainer_step{";
    long long step = -1;
    const char *s;
    if (harness_http_get(mport, "/metrics", body, sizeof body) == 200 &&
        (s = strstr(body, name)) && (s = strstr(s, "} ")))
        step = strtoll(s + 2, NULL, 10);
    bool same = step >= 0 && step == *last;
    *last = step;
    return same;
}

/* The agent's stderr is a pipe nobody reads (a paused terminal, `edl run | less`): once it is
 * full the trainer's lines and the agent's own wait in the agent (then the trainer blocks on
 * its own writes), but the loop goes on: /healthz answers and SIGTERM stops the trainer and
 * revokes the pod's lease. Read again, every line the trainer wrote arrives, in order. */
static void test_a_stalled_stderr_reader_never_stalls_the_loop(void **state)
{
    (void)state;
    const char *job = "stalled";
    put_spec(job, EDL_MODE_RESTART, 1, 10);
    int mport = harness_free_port(), p[2];
    char mp[16], body[4096], k[256];
    snprintf(mp, sizeof mp, "%d", mport);
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    int saved = dup(STDERR_FILENO); /* the agent inherits the pipe as its stderr */
    assert_true(saved >= 0 && dup2(p[1], STDERR_FILENO) == STDERR_FILENO);
    pid_t a = start_agent(job, "a",
                          "i=0; while :; do i=$((i+1)); echo \"step $i\" >&$EDL_PROGRESS_FD; "
                          "echo \"line $i of a trainer that has a lot to say on its stderr, "
                          "more than anybody reads\" >&2; done",
                          (const char *[]){"--metrics-port", mp, "--metrics-addr", "127.0.0.1",
                                           NULL});
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(p[1]);
    publish(job, 1, EDL_JOB_RUNNING, (const char *[]){"a", NULL});
    int cap = fcntl(p[0], F_GETPIPE_SZ);
    assert_true(cap > 0);
    /* full (to within two of its pages: a write that does not fit a page's rest takes the
     * next page): the agent's next writes block */
    if (!HARNESS_WAIT_UNTIL(pipe_queued(p[0]) >= cap - 8192, 30000)) {
        /* say what the agent wrote (one ASan CI run never filled the pipe) */
        char got[4097];
        int queued = pipe_queued(p[0]);
        ssize_t n = read(p[0], got, sizeof got - 1);
        got[n > 0 ? n : 0] = '\0';
        int st = 0;
        bool gone = waitpid(a, &st, WNOHANG) == a;
        fail_msg("the agent's stderr holds %d of %d bytes after 30 s (agent %s, status %d); "
                 "it begins:\n%s", queued, cap, gone ? "exited" : "running", st, got);
    }
    /* the relay takes its megabyte, then the trainer blocks on its stderr: its steps stop */
    long long last = -1;
    assert_true(HARNESS_WAIT_UNTIL(step_stopped(mport, &last), 30000));
    for (int i = 0; i < 5; i++) /* each within the harness's 5 s receive timeout */
        assert_int_equal(harness_http_get(mport, "/healthz", body, sizeof body), 200);
    assert_int_equal(kill(a, SIGTERM), 0);
    assert_true(wait_gone(key(job, "pods/a", k, sizeof k), 10000)); /* revoked: it left */
    size_t len;
    char *out = read_to_eof(p[0], &len, 30000);
    close(p[0]);
    assert_int_equal(wait_exit(a, 10000), 143);
    long next = 1, lines = 0;
    for (char *s = out; (s = strstr(s, "line ")) != NULL; s++) {
        long n = strtol(s + 5, NULL, 10);
        if (n != next)
            fail_msg("stderr line %ld came after line %ld", n, next - 1);
        next++, lines++;
    }
    print_message("%ld trainer lines (%zu bytes) came through once read again\n", lines, len);
    assert_true(lines > 10000); /* more than the pipe and the relay hold */
    free(out);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_help_and_bad_options_exit_codes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unreachable_etcd_at_startup_exits_3, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registers_pod_under_lease_and_waits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_ranks_get_exact_environment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_new_generation_restarts_trainer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inprocess_keeps_trainer_across_generations, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inprocess_graceful_trainer_is_told_to_leave, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_mode_not_given_follows_the_trainer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_standby_waits_then_starts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trainer_exit_reported_and_not_restarted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sigterm_stops_trainer_and_leaves_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sigint_while_waiting_exits_130, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sigkilled_agent_takes_trainer_and_lease_expires, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lost_lease_stops_trainer_and_reregisters, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_generation_is_ignored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_progress_steps_reach_status_and_metrics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_etcd_outage_keeps_trainer_running, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_frozen_etcd_never_stalls_the_loop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_stalled_stderr_reader_never_stalls_the_loop, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_servers_only_generation_keeps_the_trainer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ps_process_lifecycle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ps_graceful_leave_deletes_registration_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_teacher_bad_options_exit_2, setup, teardown),
        cmocka_unit_test_setup_teardown(test_teacher_registers_when_healthy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_teacher_server_death_and_health_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_teacher_sigterm_deregisters_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_teacher_killed_agent_key_expires, setup, teardown),
        cmocka_unit_test_setup_teardown(test_teacher_ends_with_the_job_and_runs_without_one, setup, teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

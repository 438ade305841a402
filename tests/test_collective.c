/* test_collective.c: libedlcoll with real processes over loopback and a real etcd. The test
 * plays the agent: it starts coll_worker processes with the agent's environment, gives each a
 * control pipe (fd 3), and announces new generations on it, as the agent does.
 *   - every collective against a reference, world sizes 1-5, odd sizes, both algorithms;
 *   - a peer SIGKILLed mid-allreduce: the others fail at once (well within the timeout), the
 *     generation is declared dead in etcd, and they re-form without restarting and finish with
 *     the state of an undisturbed run;
 *   - a stopped (hung) peer: the others time out, then all re-form once it is back;
 *   - a worker joining during training gets the state by broadcast;
 *   - mismatched collectives, a stranger on the port and a rendezvous that never completes
 *     give clear errors;
 *   - links are authenticated with the job secret: a stranger who read the endpoints and
 *     tokens in etcd cannot take a rank's slot, a flood of them (held, reset, hellos, garbage,
 *     from four addresses) fails no join nor re-formation while it goes on, a process
 *     with another secret (or none) is refused with a clear error, and a broken link between
 *     two ranks that no barrier step pairs fails the join itself. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "edl/collective.h"
#include "edl/etcd.h"
#include "edl/log.h"
#include "edl/agent_link.h"
#include "edl/proc.h"
#include "edl/secret.h"
#include "harness.h"
#include "internal.h" /* the link protocol's encoder, for the strangers */

#define MAXW 8

typedef struct worker {
    pid_t pid;
    int ctl;        /* write end of its control pipe (-1: none) */
    char log[256];
} worker;

static edl_etcd_server *srv;
static edl_etcd *cl;
static char dir[64];
static int job_seq;
static char job[64];
static char secret_env[128], other_secret_env[128]; /* EDL_JOB_SECRET_FILE=... */

static int setup(void **state)
{
    (void)state;
    edl_log_setup(EDL_LOG_ERROR, EDL_LOG_PLAIN, NULL);
    signal(SIGPIPE, SIG_IGN);
    harness_open_etcd(1, NULL, &srv, &cl);
    snprintf(dir, sizeof dir, "/tmp/edl-coll-XXXXXX");
    assert_non_null(mkdtemp(dir));
    const char *names[2] = {"secret", "other-secret"};
    char *envs[2] = {secret_env, other_secret_env};
    for (int i = 0; i < 2; i++) {
        char path[96], why[256];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (edl_job_secret_generate(path, why, sizeof why) != 0)
            fail_msg("%s", why);
        snprintf(envs[i], sizeof secret_env, EDL_SECRET_FILE_ENV "=%s", path);
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    harness_close_etcd(&srv, &cl);
    if (!getenv("EDL_TEST_KEEP")) /* the ranks' logs, to look at */
        harness_rmtree(dir);
    return 0;
}

static void new_job(void)
{
    snprintf(job, sizeof job, "coll%d-%d", (int)getpid(), ++job_seq);
}

/* Start coll_worker as rank of size in generation gen; extra: "NAME=value" strings. Every
 * worker gets the job's secret file unless extra names EDL_JOB_SECRET_FILE itself. */
static void start(worker *w, const char *mode, const char *arg, int rank, int size,
                  int64_t gen, bool control, const char *const *extra)
{
    int p[2] = {-1, -1};
    if (control)
        assert_int_equal(pipe(p), 0);
    snprintf(w->log, sizeof w->log, "%s/%s-g%lld-r%d-%d.log", dir, job, (long long)gen, rank,
             job_seq);
    char vars[7][320];
    snprintf(vars[0], sizeof vars[0], "EDL_ETCD_ENDPOINTS=%s", edl_etcd_server_endpoints(srv));
    snprintf(vars[1], sizeof vars[1], "EDL_JOB_ID=%s", job);
    snprintf(vars[2], sizeof vars[2], "EDL_RANK=%d", rank);
    snprintf(vars[3], sizeof vars[3], "EDL_WORLD_SIZE=%d", size);
    snprintf(vars[4], sizeof vars[4], "EDL_GENERATION=%lld", (long long)gen);
    snprintf(vars[5], sizeof vars[5], "EDL_CONTROL_FD=%s", control ? "3" : "");
    const char *set[32] = {vars[0], vars[1], vars[2], vars[3], vars[4], vars[5],
                           "PADDLE_CURRENT_ENDPOINT=127.0.0.1:1", "EDL_LOG_LEVEL=info"};
    size_t n = 8;
    bool own_secret = false;
    for (int i = 0; extra && extra[i] && n < 31; i++) {
        set[n++] = extra[i];
        own_secret |= strncmp(extra[i], EDL_SECRET_FILE_ENV "=", strlen(EDL_SECRET_FILE_ENV) + 1)
                      == 0;
    }
    if (!own_secret)
        set[n++] = secret_env;
    char **env = edl_env_build(NULL, NULL, (char *const *)set);
    assert_non_null(env);
    char *argv[] = {(char *)EDL_COLL_WORKER, (char *)mode, (char *)arg, NULL};
    edl_spawn_opts so = {.argv = argv, .envp = env, .log_path = w->log,
                         .fds = {{p[0], 3}}, .n_fds = control ? 1 : 0};
    pid_t pid = -1;
    char err[256];
    int rc = edl_spawn(&so, &pid, err, sizeof err);
    edl_env_free(env);
    if (rc)
        fail_msg("%s", err);
    if (control)
        close(p[0]);
    w->pid = pid;
    w->ctl = p[1];
}

/* Announce generation gen to w as rank of size (what the agent writes on fd 3). */
static void announce(worker *w, int64_t gen, int rank, int size)
{
    edl_assignment g = {.generation = gen, .rank = rank, .world_size = size, .master_port = 1};
    snprintf(g.master_addr, sizeof g.master_addr, "127.0.0.1");
    char *line = edl_assignment_encode(&g);
    assert_non_null(line);
    assert_int_equal(write(w->ctl, line, strlen(line)), (ssize_t)strlen(line));
    free(line);
}

static int finish(worker *w, int timeout_ms)
{
    int st = harness_wait_exit(w->pid, timeout_ms);
    if (w->ctl >= 0)
        close(w->ctl);
    w->ctl = -1;
    return st;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return strdup("");
    char *buf = calloc(1, 1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* The first line of w's log that starts with prefix (copied into out), waiting up to ms. */
static bool wait_line(const worker *w, const char *prefix, char *out, size_t len, int ms)
{
    int64_t end = harness_now_ms() + ms;
    do {
        char *s = slurp(w->log);
        for (char *l = s; l && *l;) {
            char *nl = strchr(l, '\n');
            if (!nl)
                break;
            *nl = '\0';
            if (strncmp(l, prefix, strlen(prefix)) == 0) {
                snprintf(out, len, "%s", l);
                free(s);
                return true;
            }
            l = nl + 1;
        }
        free(s);
        harness_sleep_ms(20);
    } while (harness_now_ms() < end);
    return false;
}

static void dump(const worker *w)
{
    char *s = slurp(w->log);
    fprintf(stderr, "---- %s\n%s", w->log, s);
    free(s);
}

/* As wait_line, but a missing line fails the test after showing the worker's log. */
static void need_line(const worker *w, const char *prefix, char *out, size_t len, int ms)
{
    if (!wait_line(w, prefix, out, len, ms)) {
        dump(w);
        fail_msg("%s: no line starting with '%s' within %d ms", w->log, prefix, ms);
    }
}

/* Training is under way: each of the n workers (started with EDL_TEST_STEP_LINES=1) has
 * committed step `step` of its first generation. */
static void need_step(const worker *w, int n, int step)
{
    char prefix[64], line[512];
    snprintf(prefix, sizeof prefix, "stepped step=%d ", step);
    for (int r = 0; r < n; r++)
        need_line(&w[r], prefix, line, sizeof line, 30000);
}

static long long field(const char *line, const char *name)
{
    char key[40];
    snprintf(key, sizeof key, " %s=", name);
    const char *p = strstr(line, key);
    return p ? strtoll(p + strlen(key), NULL, 0) : -1;
}

static void field_str(const char *line, const char *name, char *out, size_t len)
{
    char key[40];
    snprintf(key, sizeof key, " %s=", name);
    const char *p = strstr(line, key);
    snprintf(out, len, "%.*s", p ? (int)strcspn(p + strlen(key), " \n") : 0,
             p ? p + strlen(key) : "");
}


/* The final state of an undisturbed run: the same worker with no etcd (a group of one). */
static void reference_hash(const char *steps, const char *elems, char *out, size_t len)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "env -u EDL_ETCD_ENDPOINTS EDL_TEST_ELEMS=%s %s elastic %s "
             "2>/dev/null | grep '^done'", elems, EDL_COLL_WORKER, steps);
    FILE *p = popen(cmd, "r");
    char line[512] = "";
    assert_non_null(fgets(line, sizeof line, p));
    pclose(p);
    field_str(line, "hash", out, len);
    assert_int_equal(strlen(out), 16);
}

/* ---- correctness ------------------------------------------------------------------------- */

static void verify_world(int n, const char *const *extra)
{
    new_job();
    worker w[MAXW];
    for (int r = 0; r < n; r++)
        start(&w[r], "verify", NULL, r, n, 1, false, extra);
    for (int r = 0; r < n; r++) {
        int st = finish(&w[r], 120000);
        char line[256];
        if (st != 0 || !wait_line(&w[r], "verify ok", line, sizeof line, 0))
            dump(&w[r]);
        assert_int_equal(st, 0);
    }
}

static void test_collectives_match_reference_world_sizes_1_to_5(void **state)
{
    (void)state;
    for (int n = 1; n <= 5; n++)
        verify_world(n, NULL);
}

/* The ring streams at every size: no latency path, allreduce slices of n blocks of 1000 bytes
 * (many slices, and short last ones with empty blocks), 100-byte reduction chunks, 64-byte
 * socket calls and at most 1000 bytes sent ahead of those received, so blocks are forwarded
 * while they arrive, element boundaries fall inside calls, the window binds all the time,
 * allgather's own block (over the 1000-byte block) goes out from send and is copied into recv
 * a piece at a time as it goes, and with 5 ranks the reduce-scatter reuses its work halves
 * (wait_sent). */
static void test_ring_algorithms_with_tiny_segments(void **state)
{
    (void)state;
    static const char *const extra[] = {"EDL_COLL_SMALL_BYTES=0", "EDL_COLL_BLOCK_BYTES=1000",
                                        "EDL_COLL_SEGMENT_BYTES=100",
                                        "EDL_COLL_IO_BYTES=64", "EDL_COLL_WINDOW_BYTES=1000",
                                        NULL};
    verify_world(3, extra);
    verify_world(4, extra);
    verify_world(5, extra);
    /* with no window, receives run far ahead of sends: the work-half reuse must hold by
     * itself */
    static const char *const unbounded[] = {"EDL_COLL_SMALL_BYTES=0", "EDL_COLL_SEGMENT_BYTES=100",
                                            "EDL_COLL_IO_BYTES=64",
                                            "EDL_COLL_WINDOW_BYTES=1073741824", NULL};
    verify_world(5, unbounded);
}

/* ---- elastic ------------------------------------------------------------------------------ */

/* ms from t0 (CLOCK_MONOTONIC) to the worker's first failed collective. */
static long long failed_after(const worker *w, int64_t t0, const char *event)
{
    char line[512];
    need_line(w, "failed", line, sizeof line, 10000);
    long long t = field(line, "t") - t0;
    print_message("%s failed %lld ms after %s: %s\n", w->log, t, event, strstr(line, "err="));
    return t;
}

/* The generation was declared dead in etcd. */
static void expect_dead_key(int64_t gen)
{
    char key[256], val[512];
    harness_job_key(key, sizeof key, job, EDL_KEY_GEN, EDL_GEN_DEAD, gen);
    assert_non_null(harness_get(cl, key, val, sizeof val));
    print_message("gen/%lld/dead = %s\n", (long long)gen, val);
}

static void start_elastic(worker *w, int n, const char *steps, const char *const *extra)
{
    for (int r = 0; r < n; r++)
        start(&w[r], "elastic", steps, r, n, 1, true, extra);
    char line[512];
    for (int r = 0; r < n; r++) {
        need_line(&w[r], "joined", line, sizeof line, 30000);
    }
}

static void expect_done(worker *w, int n, const char *want_hash, const pid_t *pids)
{
    for (int r = 0; r < n; r++) {
        char line[512], hash[32];
        int st = finish(&w[r], 120000);
        if (st != 0 || !wait_line(&w[r], "done", line, sizeof line, 0))
            dump(&w[r]);
        assert_int_equal(st, 0);
        assert_true(wait_line(&w[r], "done", line, sizeof line, 0));
        field_str(line, "hash", hash, sizeof hash);
        assert_string_equal(hash, want_hash);
        if (pids) /* the same process: it was never restarted */
            assert_int_equal(field(line, "pid"), pids[r]);
    }
}

static void test_peer_killed_mid_allreduce_survivors_reform(void **state)
{
    (void)state;
    new_job();
    char ref[32];
    reference_hash("60", "1000000", ref, sizeof ref);
    static const char *const extra[] = {"EDL_TEST_ELEMS=1000000", "EDL_COLL_TIMEOUT_MS=20000",
                                        "EDL_TEST_STEP_LINES=1", NULL};
    worker w[4];
    start_elastic(w, 4, "60", extra);
    need_step(w, 4, 2); /* steps of 8 MB allreduces are under way */
    int64_t t_kill = harness_now_ms();
    harness_kill(w[2].pid, SIGKILL); /* and reaped */
    worker s[3] = {w[0], w[1], w[3]};
    pid_t pids[3] = {w[0].pid, w[1].pid, w[3].pid};
    for (int i = 0; i < 3; i++) /* the timeout is 20 s: detected, not timed out */
        assert_true(failed_after(&s[i], t_kill, "the kill") < 3000);
    expect_dead_key(1);
    /* The next generation, as the job server would assign it: rank 3 fills the hole. */
    announce(&s[0], 2, 0, 3);
    announce(&s[1], 2, 1, 3);
    announce(&s[2], 2, 2, 3);
    char first[32] = "";
    for (int i = 0; i < 3; i++) {
        char line[512], hash[32];
        need_line(&s[i], "synced gen=2", line, sizeof line, 30000);
        field_str(line, "hash", hash, sizeof hash);
        assert_int_equal(field(line, "rc"), 0);
        assert_int_equal(field(line, "rank"), i);
        if (i == 0)
            snprintf(first, sizeof first, "%s", hash);
        assert_string_equal(hash, first); /* identical restored state everywhere */
    }
    expect_done(s, 3, ref, pids);
}

static void test_hung_peer_times_out_then_all_reform(void **state)
{
    (void)state;
    new_job();
    char ref[32];
    reference_hash("80", "1000", ref, sizeof ref);
    static const char *const extra[] = {"EDL_TEST_STEP_MS=10", "EDL_COLL_TIMEOUT_MS=1000",
                                        "EDL_TEST_STEP_LINES=1", NULL};
    worker w[3];
    start_elastic(w, 3, "80", extra);
    need_step(w, 3, 5); /* some steps under way */
    int64_t t_stop = harness_now_ms();
    harness_kill(w[1].pid, SIGSTOP);
    for (int i = 0; i < 3; i += 2)
        assert_true(failed_after(&w[i], t_stop, "SIGSTOP") < 1000 + 2500);
    expect_dead_key(1);
    harness_kill(w[1].pid, SIGCONT);
    for (int r = 0; r < 3; r++)
        announce(&w[r], 2, r, 3);
    for (int r = 0; r < 3; r++) {
        char line[512];
        need_line(&w[r], "synced gen=2", line, sizeof line, 30000);
    }
    pid_t pids[3] = {w[0].pid, w[1].pid, w[2].pid};
    expect_done(w, 3, ref, pids);
}

static void test_join_during_training_gets_the_state(void **state)
{
    (void)state;
    new_job();
    char ref[32];
    reference_hash("150", "5000", ref, sizeof ref);
    static const char *const extra[] = {"EDL_TEST_STEP_MS=10", "EDL_TEST_ELEMS=5000",
                                        "EDL_TEST_STEP_LINES=1", NULL};
    worker w[3];
    start_elastic(w, 2, "150", extra);
    need_step(w, 2, 30); /* a join in the middle of training */
    start(&w[2], "elastic", "150", 2, 3, 2, true, extra);
    announce(&w[0], 2, 0, 3);
    announce(&w[1], 2, 1, 3);
    char hashes[3][32], line[512];
    long long steps[3];
    for (int r = 0; r < 3; r++) {
        need_line(&w[r], "synced gen=2", line, sizeof line, 30000);
        field_str(line, "hash", hashes[r], sizeof hashes[r]);
        steps[r] = field(line, "step");
    }
    print_message("joined at step %lld\n", steps[0]);
    assert_true(steps[0] > 0); /* the survivors had trained: the newcomer got their state */
    assert_int_equal(steps[1], steps[0]);
    assert_int_equal(steps[2], steps[0]);
    assert_string_equal(hashes[1], hashes[0]);
    assert_string_equal(hashes[2], hashes[0]);
    pid_t pids[3] = {w[0].pid, w[1].pid, w[2].pid};
    expect_done(w, 3, ref, pids);
}

/* ---- bad input ----------------------------------------------------------------------------- */

static void mismatch(const char *kind)
{
    new_job();
    char env[64];
    snprintf(env, sizeof env, "EDL_TEST_MISMATCH=%s", kind);
    const char *const extra[] = {env, "EDL_COLL_TIMEOUT_MS=5000", NULL};
    worker w[2];
    for (int r = 0; r < 2; r++)
        start(&w[r], "mismatch", NULL, r, 2, 1, false, extra);
    int clear = 0;
    for (int r = 0; r < 2; r++) {
        char line[1024];
        int st = finish(&w[r], 30000);
        if (st != 0)
            dump(&w[r]);
        assert_int_equal(st, 0); /* the call failed (and nothing crashed) */
        assert_true(wait_line(&w[r], "mismatch", line, sizeof line, 0));
        if (strstr(line, "do not match")) {
            print_message("%s\n", line);
            clear++;
        }
    }
    assert_true(clear >= 1);
}

static void test_mismatched_counts_and_types_fail_clearly(void **state)
{
    (void)state;
    mismatch("count");
    mismatch("type");
}

/* What rank published in etcd for generation 1 of this job (what any reader of etcd sees):
 * its port and token, waiting up to 10 s for the entry. */
static void read_entry(int rank, int *port, uint64_t *token)
{
    char key[256], val[512], name[32];
    snprintf(name, sizeof name, EDL_GEN_CPU "%d", rank);
    harness_job_key(key, sizeof key, job, EDL_KEY_GEN, name, 1);
    int64_t end = harness_now_ms() + 10000;
    while (!harness_get(cl, key, val, sizeof val) && harness_now_ms() < end)
        harness_sleep_ms(20);
    const char *pp = strstr(val, "\"port\":"), *tp = strstr(val, "\"token\":\"");
    assert_non_null(pp);
    assert_non_null(tp);
    *port = atoi(pp + 7);
    *token = strtoull(tp + 9, NULL, 16);
}

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* A stranger's connection carrying a well-formed hello of this protocol for rank `from` with
 * the token from etcd: everything but the secret. */
static int stranger_hello(int port, int from, int to, int size, uint64_t token)
{
    int fd = connect_to(port);
    coll_hello h = {.version = COLL_PROTO_VERSION, .generation = 1, .from = from, .to = to,
                    .size = size, .token = token};
    memset(h.nonce, 0x5a, sizeof h.nonce);
    uint8_t buf[COLL_HELLO_BYTES];
    coll_hello_encode(&h, buf);
    assert_int_equal(write(fd, buf, sizeof buf), (ssize_t)sizeof buf);
    return fd;
}

static void expect_verified(worker *w, int n)
{
    for (int r = 0; r < n; r++) {
        char line[256];
        int st = finish(&w[r], 60000);
        if (st != 0 || !wait_line(&w[r], "verify ok", line, sizeof line, 0))
            dump(&w[r]);
        assert_int_equal(st, 0);
    }
}

static void test_stranger_on_the_port_is_turned_away(void **state)
{
    (void)state;
    new_job();
    worker w[2];
    start(&w[0], "verify", NULL, 0, 2, 1, false, NULL);
    int port;
    uint64_t token;
    read_entry(0, &port, &token);
    int s[3];
    for (int i = 0; i < 3; i++) /* garbage, a half hello, a silent connection */
        s[i] = connect_to(port);
    assert_true(write(s[0], "GET / HTTP/1.0\r\n\r\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", 46) > 0);
    assert_true(write(s[1], "EDLH", 4) == 4);
    /* the strangers are in place first: their connect() and write() have returned, so they
     * wait in rank 0's accept queue (backlog 512) ahead of rank 1, and rank 0 accepts from
     * it only once rank 1's entry completes the rendezvous */
    start(&w[1], "verify", NULL, 1, 2, 1, false, NULL);
    for (int r = 0; r < 2; r++) {
        int st = finish(&w[r], 60000);
        if (st != 0)
            dump(&w[r]);
        assert_int_equal(st, 0);
    }
    char *log = slurp(w[0].log);
    assert_non_null(strstr(log, "did not start with an edl hello"));
    free(log);
    for (int i = 0; i < 3; i++)
        close(s[i]);
}

/* The handshake's parsers (pure: what a fuzzer will call): round trip, every prefix asks for
 * more, and a wrong magic, version or impossible numbers are refused with a reason. */
static void test_handshake_frames_parse_strictly(void **state)
{
    (void)state;
    coll_hello h = {.version = COLL_PROTO_VERSION, .generation = 7, .from = 2, .to = 0,
                    .size = 3, .token = 0x0123456789abcdefull}, back;
    memset(h.nonce, 0x11, sizeof h.nonce);
    uint8_t buf[COLL_HELLO_BYTES];
    char why[200];
    coll_hello_encode(&h, buf);
    for (size_t n = 0; n < sizeof buf; n++)
        assert_int_equal(coll_hello_parse(buf, n, &back, why, sizeof why), 1);
    assert_int_equal(coll_hello_parse(buf, sizeof buf, &back, why, sizeof why), 0);
    assert_true(back.version == h.version && back.generation == 7 && back.from == 2 &&
                back.to == 0 && back.size == 3 && back.token == h.token);
    assert_memory_equal(back.nonce, h.nonce, sizeof h.nonce);
    uint8_t bad[COLL_HELLO_BYTES];
    memcpy(bad, buf, sizeof bad);
    bad[0] ^= 1;
    assert_int_equal(coll_hello_parse(bad, 4, &back, why, sizeof why), EDL_EPROTO);
    memcpy(bad, buf, sizeof bad);
    bad[4] = 1; /* version 1: the unauthenticated protocol */
    assert_int_equal(coll_hello_parse(bad, 6, &back, why, sizeof why), EDL_EPROTO);
    assert_non_null(strstr(why, "version 1"));
    h.from = 3; /* not a rank of a group of 3 */
    coll_hello_encode(&h, bad);
    assert_int_equal(coll_hello_parse(bad, sizeof bad, &back, why, sizeof why), EDL_EPROTO);
    uint8_t mac[EDL_SECRET_MAC_BYTES], nonce[COLL_NONCE_BYTES], f[64], m2[EDL_SECRET_MAC_BYTES];
    memset(mac, 0x22, sizeof mac);
    memset(nonce, 0x33, sizeof nonce);
    coll_frame_encode(COLL_CHALLENGE_MAGIC, nonce, mac, f);
    size_t fl = coll_frame_bytes(COLL_CHALLENGE_MAGIC);
    uint8_t n2[COLL_NONCE_BYTES];
    assert_int_equal(coll_frame_parse(f, fl - 1, COLL_CHALLENGE_MAGIC, n2, m2), 1);
    assert_int_equal(coll_frame_parse(f, fl, COLL_CHALLENGE_MAGIC, n2, m2), 0);
    assert_memory_equal(n2, nonce, sizeof nonce);
    assert_memory_equal(m2, mac, sizeof mac);
    assert_int_equal(coll_frame_parse(f, fl, COLL_PROOF_MAGIC, NULL, m2), EDL_EPROTO);
}

/* The attack of issue 12: a stranger reads the endpoints and tokens in etcd and sends rank 2's
 * hello to rank 0 before rank 2 does (here rank 2 is slow: its first connection waits 1.5 s),
 * then a made-up proof; another sends rank 2's hello and then nothing. Rank 0 must turn both
 * away and take the real rank 2. */
static void test_stranger_with_the_etcd_token_cannot_take_a_slot(void **state)
{
    (void)state;
    new_job();
    static const char *const extra[] = {"EDL_COLL_RENDEZVOUS_TIMEOUT_MS=15000",
                                        "EDL_COLL_TIMEOUT_MS=5000", NULL};
    static const char *const slow[] = {"EDL_COLL_RENDEZVOUS_TIMEOUT_MS=15000",
                                       "EDL_COLL_TIMEOUT_MS=5000",
                                       "EDL_TEST_CONNECT_DELAY_MS=1500", NULL};
    worker w[3];
    for (int r = 0; r < 3; r++)
        start(&w[r], "verify", NULL, r, 3, 1, false, r == 2 ? slow : extra);
    int port, p2;
    uint64_t token, t2;
    read_entry(0, &port, &token);
    read_entry(2, &p2, &t2); /* the rendezvous is complete: rank 0 is accepting */
    int mute = stranger_hello(port, 2, 0, 3, token), liar = stranger_hello(port, 2, 0, 3, token);
    uint8_t challenge[64], proof[64] = {0};
    size_t clen = coll_frame_bytes(COLL_CHALLENGE_MAGIC);
    size_t got = 0;
    struct pollfd pf = {.fd = liar, .events = POLLIN};
    while (got < clen && poll(&pf, 1, 5000) == 1) {
        ssize_t n = read(liar, challenge + got, clen - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    assert_int_equal(got, clen); /* a well-formed hello is challenged... */
    uint8_t mac[EDL_SECRET_MAC_BYTES];
    memset(mac, 0xa5, sizeof mac);
    coll_frame_encode(COLL_PROOF_MAGIC, NULL, mac, proof);
    size_t plen = coll_frame_bytes(COLL_PROOF_MAGIC);
    assert_int_equal(write(liar, proof, plen), (ssize_t)plen); /* ...and fails */
    expect_verified(w, 3);
    char *log = slurp(w[0].log);
    assert_non_null(strstr(log, "claiming rank 2 failed authentication"));
    free(log);
    close(liar);
    close(mute);
}

/* A peer given another secret is refused, and both sides say why, within the join's time. */
static void test_peer_with_another_secret_is_refused(void **state)
{
    (void)state;
    new_job();
    static const char *const extra[] = {"EDL_COLL_RENDEZVOUS_TIMEOUT_MS=10000", NULL};
    const char *const other[] = {other_secret_env, "EDL_COLL_RENDEZVOUS_TIMEOUT_MS=10000", NULL};
    worker w[2];
    int64_t t0 = harness_now_ms();
    start(&w[0], "verify", NULL, 0, 2, 1, false, extra);
    start(&w[1], "verify", NULL, 1, 2, 1, false, other);
    for (int r = 0; r < 2; r++) {
        int st = finish(&w[r], 30000);
        if (st != 4)
            dump(&w[r]);
        assert_int_equal(st, 4); /* edl_coll_open failed */
    }
    print_message("both refused after %lld ms\n", (long long)(harness_now_ms() - t0));
    char *log1 = slurp(w[1].log), *log0 = slurp(w[0].log);
    assert_non_null(strstr(log1, "did not prove that it holds this job's secret"));
    assert_non_null(strstr(log0, "without answering the challenge"));
    free(log1);
    free(log0);
}

/* 60 silent connections and 60 that send rank 1's hello with the etcd token and then nothing,
 * more than rank 0 holds at once: the real rank 1 still joins. */
static void test_flood_of_strangers_cannot_stop_a_join(void **state)
{
    (void)state;
    new_job();
    static const char *const extra[] = {"EDL_COLL_RENDEZVOUS_TIMEOUT_MS=20000",
                                        "EDL_COLL_TIMEOUT_MS=5000", NULL};
    worker w[2];
    start(&w[0], "verify", NULL, 0, 2, 1, false, extra);
    int port;
    uint64_t token;
    read_entry(0, &port, &token);
    enum { N = 120 };
    int s[N];
    for (int i = 0; i < N; i++)
        s[i] = i % 2 ? connect_to(port) : stranger_hello(port, 1, 0, 2, token);
    /* the strangers are in place first: connected, in rank 0's accept queue ahead of rank 1
     * (rank 0 accepts only once the rendezvous is complete) */
    int64_t t0 = harness_now_ms();
    start(&w[1], "verify", NULL, 1, 2, 1, false, extra);
    expect_verified(w, 2);
    print_message("joined and verified %lld ms after the flood\n",
                  (long long)(harness_now_ms() - t0));
    for (int i = 0; i < N; i++)
        close(s[i]);
}

/* Flood rank r's port (of generation 1, in a group of size) from `floods` threads of
 * strangers whose hellos claim rank r + 1 with r's etcd token (harness_flood.c). */
static void flood_rank(int r, int size, int floods, harness_flood **f)
{
    int port;
    uint64_t token;
    read_entry(r, &port, &token);
    coll_hello h = {.version = COLL_PROTO_VERSION, .generation = 1, .from = r + 1, .to = r,
                    .size = size, .token = token};
    uint8_t hello[COLL_HELLO_BYTES];
    coll_hello_encode(&h, hello);
    for (int i = 0; i < floods; i++)
        assert_non_null(f[i] = harness_flood_start(port, hello, sizeof hello, 100, 15000));
}

/* The flood of issue 39 while a group forms, three times: strangers (silent, reset, a
 * well-formed hello with the etcd token but no secret, garbage; from the ranks' address and
 * three others) flood the ports of both accepting ranks while the connectors connect. Every
 * join succeeds. (Before, an acceptor evicted a connector's connection after the proof was
 * sent and before it was read: "the link between ranks N and N failed the join's check
 * (cannot send on it)" and the generation was declared dead.) */
static void test_joins_succeed_under_a_flood_while_the_group_forms(void **state)
{
    (void)state;
    enum { ROUNDS = 3, SIZE = 3, FLOODS = 2 };
    static const char *const first[] = {"EDL_COLL_RENDEZVOUS_TIMEOUT_MS=20000",
                                        "EDL_COLL_TIMEOUT_MS=5000", NULL};
    static const char *const later[] = {"EDL_COLL_RENDEZVOUS_TIMEOUT_MS=20000",
                                        "EDL_COLL_TIMEOUT_MS=5000",
                                        "EDL_TEST_CONNECT_DELAY_MS=400", NULL};
    long made = 0;
    for (int round = 0; round < ROUNDS; round++) {
        new_job();
        worker w[SIZE];
        harness_flood *f[2 * FLOODS];
        for (int r = 0; r < SIZE; r++)
            start(&w[r], "verify", NULL, r, SIZE, 1, false, r ? later : first);
        for (int r = 0; r < 2; r++) /* the acceptors: ranks 0 and 1 */
            flood_rank(r, SIZE, FLOODS, &f[r * FLOODS]);
        expect_verified(w, SIZE);
        for (int i = 0; i < 2 * FLOODS; i++)
            made += harness_flood_stop(f[i]);
    }
    print_message("%d joins of %d ranks under a flood of %ld strangers\n", ROUNDS, SIZE, made);
}

/* The flood of issue 39 while a training group re-forms, twice, as the job server assigns new
 * generations: every re-formation succeeds in the same processes (no restart spent), and the
 * result is the undisturbed one. */
static void test_reformations_under_a_flood_spend_no_restart(void **state)
{
    (void)state;
    enum { SIZE = 3, FLOODS = 2 };
    new_job();
    char ref[32];
    reference_hash("300", "1000", ref, sizeof ref);
    static const char *const extra[] = {"EDL_TEST_STEP_MS=10", "EDL_COLL_TIMEOUT_MS=5000",
                                        "EDL_COLL_RENDEZVOUS_TIMEOUT_MS=20000", NULL};
    worker w[SIZE];
    start_elastic(w, SIZE, "300", extra);
    harness_flood *f[2 * FLOODS];
    for (int r = 0; r < 2; r++)
        flood_rank(r, SIZE, FLOODS, &f[r * FLOODS]);
    pid_t pids[SIZE];
    for (int r = 0; r < SIZE; r++)
        pids[r] = w[r].pid;
    for (int64_t gen = 2; gen <= 3; gen++) {
        char want[32], line[512];
        for (int r = 0; r < SIZE; r++)
            announce(&w[r], gen, r, SIZE);
        snprintf(want, sizeof want, "synced gen=%lld", (long long)gen);
        for (int r = 0; r < SIZE; r++) {
            need_line(&w[r], want, line, sizeof line, 20000);
            assert_int_equal(field(line, "rc"), 0);
        }
    }
    long made = 0;
    for (int i = 0; i < 2 * FLOODS; i++)
        made += harness_flood_stop(f[i]);
    print_message("2 re-formations of %d ranks under a flood of %ld strangers\n", SIZE, made);
    expect_done(w, SIZE, ref, pids);
}

/* With 3 ranks no barrier step pairs ranks 0 and 2 (recursive doubling folds 0 into 1), so a
 * broken link between them once surfaced only at the first collective that used it. Rank 2's
 * link to rank 0 is cut right after its handshake (coll_worker's EDL_TEST_CUT_LINK): the join
 * itself must fail, on every rank, naming the link. */
static void test_broken_link_between_far_ranks_fails_the_join(void **state)
{
    (void)state;
    new_job();
    static const char *const extra[] = {"EDL_COLL_RENDEZVOUS_TIMEOUT_MS=10000",
                                        "EDL_COLL_TIMEOUT_MS=3000", NULL};
    static const char *const cut[] = {"EDL_COLL_RENDEZVOUS_TIMEOUT_MS=10000",
                                      "EDL_COLL_TIMEOUT_MS=3000", "EDL_TEST_CUT_LINK=2", NULL};
    worker w[3];
    for (int r = 0; r < 3; r++)
        start(&w[r], "verify", NULL, r, 3, 1, false, r == 2 ? cut : extra);
    int named = 0;
    for (int r = 0; r < 3; r++) {
        int st = finish(&w[r], 30000);
        if (st != 4)
            dump(&w[r]);
        assert_int_equal(st, 4); /* edl_coll_open failed: no collective ever ran */
        char *log = slurp(w[r].log);
        named += strstr(log, "the link between ranks 0 and 2") ||
                 strstr(log, "the link between ranks 2 and 0");
        free(log);
    }
    assert_true(named >= 1);
}

/* No secret: a group of more than one rank is refused at once, naming the variable; a group of
 * one needs none. A secret file others can read is refused too. */
static void test_no_secret_is_a_clear_error(void **state)
{
    (void)state;
    new_job();
    static const char *const none[] = {EDL_SECRET_FILE_ENV "=", NULL};
    worker w[2];
    int64_t t0 = harness_now_ms();
    for (int r = 0; r < 2; r++)
        start(&w[r], "verify", NULL, r, 2, 1, false, none);
    for (int r = 0; r < 2; r++) {
        int st = finish(&w[r], 30000);
        if (st != 4)
            dump(&w[r]);
        assert_int_equal(st, 4);
        char *log = slurp(w[r].log);
        assert_non_null(strstr(log, "needs the job secret"));
        assert_non_null(strstr(log, EDL_SECRET_FILE_ENV));
        free(log);
    }
    assert_true(harness_now_ms() - t0 < 10000);
    new_job();
    start(&w[0], "verify", NULL, 0, 1, 1, false, none);
    expect_verified(w, 1);
    char path[96], env[160];
    snprintf(path, sizeof path, "%s/open-secret", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("0123456789abcdef0123456789abcdef0123456789abcdef", f);
    fclose(f);
    chmod(path, 0644);
    snprintf(env, sizeof env, EDL_SECRET_FILE_ENV "=%s", path);
    const char *const open_file[] = {env, NULL};
    new_job();
    start(&w[0], "verify", NULL, 0, 2, 1, false, open_file);
    assert_int_equal(finish(&w[0], 30000), 4);
    char *log = slurp(w[0].log);
    assert_non_null(strstr(log, "readable or writable by group or others"));
    free(log);
}

/* The engine's buffers follow the host: a local link's window is a quarter of a core's L2 per
 * core its ranks can use, shared when ranks outnumber cores; a block is half the L2. On the
 * 2-core, 1 MiB-L2 machine these are the windows measured best there (512 KiB in flight over
 * the host) and its 512 KiB block. */
static void test_buffers_follow_the_hosts_cores_and_l2(void **state)
{
    (void)state;
    coll_host two = {.cores = 2, .l2_bytes = 1u << 20, .l2_known = true};
    assert_int_equal(coll_local_window(&two, 1), 256u << 10);
    assert_int_equal(coll_local_window(&two, 2), 256u << 10);
    assert_int_equal(coll_local_window(&two, 4), 128u << 10);
    assert_int_equal(coll_local_window(&two, 3), (((1u << 20) / 4 * 2 / 3) & ~4095u));
    assert_int_equal(coll_local_window(&two, 64), 64u << 10); /* never below 64 KiB */
    assert_int_equal(coll_default_block(&two), 512u << 10);
    coll_host big = {.cores = 16, .l2_bytes = 2u << 20, .l2_known = true};
    assert_int_equal(coll_local_window(&big, 8), 512u << 10);
    assert_int_equal(coll_local_window(&big, 32), 256u << 10);
    assert_int_equal(coll_default_block(&big), 1u << 20);
    /* this host, as read from sysfs and the affinity mask */
    const coll_host *h = coll_host_get();
    print_message("this host: %d cores, L2 %zu KiB%s\n", h->cores, h->l2_bytes >> 10,
                  h->l2_known ? "" : " (assumed: sysfs does not say)");
    assert_true(h->cores >= 1);
    assert_true(h->l2_bytes >= (64u << 10) && h->l2_bytes <= (64u << 20));
}

static void test_rendezvous_timeout_names_the_missing_rank(void **state)
{
    (void)state;
    new_job();
    static const char *const extra[] = {"EDL_COLL_RENDEZVOUS_TIMEOUT_MS=800", NULL};
    worker w;
    int64_t t0 = harness_now_ms();
    start(&w, "verify", NULL, 0, 3, 1, false, extra);
    int st = finish(&w, 20000);
    int64_t took = harness_now_ms() - t0;
    char *log = slurp(w.log);
    if (st != 4)
        fprintf(stderr, "%s", log);
    assert_int_equal(st, 4); /* edl_coll_open failed */
    assert_non_null(strstr(log, "no entry from rank(s) 1,2"));
    assert_true(took < 5000);
    free(log);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives_match_reference_world_sizes_1_to_5),
        cmocka_unit_test(test_ring_algorithms_with_tiny_segments),
        cmocka_unit_test(test_peer_killed_mid_allreduce_survivors_reform),
        cmocka_unit_test(test_hung_peer_times_out_then_all_reform),
        cmocka_unit_test(test_join_during_training_gets_the_state),
        cmocka_unit_test(test_mismatched_counts_and_types_fail_clearly),
        cmocka_unit_test(test_stranger_on_the_port_is_turned_away),
        cmocka_unit_test(test_rendezvous_timeout_names_the_missing_rank),
        cmocka_unit_test(test_buffers_follow_the_hosts_cores_and_l2),
        cmocka_unit_test(test_handshake_frames_parse_strictly),
        cmocka_unit_test(test_stranger_with_the_etcd_token_cannot_take_a_slot),
        cmocka_unit_test(test_peer_with_another_secret_is_refused),
        cmocka_unit_test(test_flood_of_strangers_cannot_stop_a_join),
        cmocka_unit_test(test_joins_succeed_under_a_flood_while_the_group_forms),
        cmocka_unit_test(test_reformations_under_a_flood_spend_no_restart),
        cmocka_unit_test(test_broken_link_between_far_ranks_fails_the_join),
        cmocka_unit_test(test_no_secret_is_a_clear_error),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

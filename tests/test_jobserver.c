/* test_jobserver.c: real edl-jobserver processes against a real etcd. The test registers pods
 * and writes trainer status itself (as agents would) so that each behaviour of the job server
 * is isolated: one generation for joins within the settle window, a graceful leave at once, a
 * lease expiry after the TTL, leader failover with monotonic generations, a paused (stale)
 * leader fenced out, bad specs and documents ignored with the job intact, success, retired
 * generation data deleted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "edl/job.h"
#include "edl/etcd.h"
#include "harness.h"

static edl_etcd_server *g_srv;
static edl_etcd *g_c;

static int setup(void **state)
{
    (void)state;
    harness_open_etcd(1, NULL, &g_srv, &g_c);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pid_t etcd = edl_etcd_server_pid(g_srv, 0);
    if (etcd > 0)
        kill(etcd, SIGCONT); /* a test that froze it and failed */
    harness_close_etcd(&g_srv, &g_c);
    return 0;
}

/* A key of the job (edl/job.h's builder); a few live at once in one expression. */
static char *key(const char *job, edl_job_key_kind kind, const char *pod)
{
    static char buf[4][256];
    static int k;
    return harness_job_key(buf[k++ % 4], 256, job, kind, pod, 0);
}

/* A job server with its output appended to log (NULL: the test's own). */
static pid_t spawn_js_logged(const char *job, const char *id, const char *extra, const char *log)
{
    const char *argv[] = {EDL_JOBSERVER_BIN, "--etcd", edl_etcd_server_endpoints(g_srv), "--job",
                          job, "--id", id, "--ttl", "2", extra, NULL};
    pid_t pid = harness_spawn(argv, log);
    assert_true(pid > 0);
    return pid;
}

static pid_t spawn_js(const char *job, const char *id, const char *extra)
{
    return spawn_js_logged(job, id, extra, NULL);
}

/* A log file for a job server, in etcd's data directory (removed with it). */
static char *js_log(const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s.log", edl_etcd_server_data_dir(g_srv), name);
    return buf;
}

/* Whether the file holds `text`. */
static bool log_says(const char *path, const char *text)
{
    static char buf[262144];
    return strstr(harness_read_file(path, buf, sizeof buf), text) != NULL;
}

typedef struct pod {
    char name[32];
    int64_t lease;
    edl_lease_keeper *keeper;
} pod;

static void pod_join(const char *job, pod *p, const char *name, int64_t ttl)
{
    snprintf(p->name, sizeof p->name, "%s", name);
    assert_int_equal(edl_etcd_lease_grant(g_c, ttl, 0, &p->lease, NULL), 0);
    edl_put_opts po = {.lease = p->lease};
    const char *doc = "{\"role\":\"worker\",\"addr\":\"127.0.0.1\",\"port\":7000}";
    assert_int_equal(edl_etcd_put(g_c, edl_str(key(job, EDL_KEY_POD, name)), edl_str(doc), &po,
                                  NULL), 0);
    assert_int_equal(edl_lease_keeper_open(g_c, p->lease, ttl, NULL, NULL, &p->keeper), 0);
}

/* Write the pod's trainer status, under its lease, as its agent would. */
static void put_status(const char *job, pod *p, const char *doc)
{
    edl_put_opts po = {.lease = p->lease};
    assert_int_equal(edl_etcd_put(g_c, edl_str(key(job, EDL_KEY_STATUS, p->name)), edl_str(doc),
                                  &po, NULL), 0);
}

static void pod_status(const char *job, pod *p, int64_t gen, const char *state, int code)
{
    char doc[160];
    snprintf(doc, sizeof doc, "{\"generation\":%lld,\"state\":\"%s\",\"exit_code\":%d,\"step\":1}",
             (long long)gen, state, code);
    put_status(job, p, doc);
}

/* Leave: revoke (graceful) or just stop renewing (a crash: expires after the TTL). */
static void pod_leave(pod *p, bool graceful)
{
    edl_lease_keeper_close(p->keeper, graceful);
    p->keeper = NULL;
}

static bool read_generation(const char *job, edl_generation *out)
{
    char buf[65536];
    edl_generation_clear(out);
    if (!harness_get(g_c, key(job, EDL_KEY_GENERATION, NULL), buf, sizeof buf))
        return false;
    char err[256];
    if (edl_generation_parse(buf, strlen(buf), out, err, sizeof err) != 0)
        fail_msg("generation document unreadable: %s", err);
    return true;
}

/* Wait until the job has at least generation `gen` with `members` members (-1: any). */
static void wait_gen(const char *job, int64_t gen, int members, int timeout_ms, edl_generation *out)
{
    int64_t deadline = harness_now_ms() + timeout_ms;
    while (harness_now_ms() < deadline) {
        if (read_generation(job, out) && out->generation >= gen &&
            (members < 0 || (int)out->n_members == members))
            return;
        harness_sleep_ms(10);
    }
    fail_msg("job %s: no generation >= %lld with %d members within %d ms (now %lld, %zu)", job,
             (long long)gen, members, timeout_ms, (long long)out->generation, out->n_members);
}

static void stop_js(pid_t pid)
{
    kill(pid, SIGTERM);
    assert_int_equal(harness_wait_exit(pid, 10000), 0);
}

static void test_scale_up_within_settle_window_is_one_generation(void **state)
{
    (void)state;
    const char *job = "scale";
    harness_put(g_c, key(job, EDL_KEY_SPEC, NULL), "{\"min\":1,\"max\":8,\"settle_ms\":1000}");
    pid_t js = spawn_js(job, "js-a", NULL);
    pod p[4];
    pod_join(job, &p[0], "w0", 10);
    pod_join(job, &p[1], "w1", 10);
    edl_generation c = {0};
    wait_gen(job, 1, 2, 5000, &c);
    assert_int_equal(c.generation, 1);
    assert_string_equal(c.members[0].pod, "w0");
    assert_string_equal(c.leader, "js-a");

    int64_t t0 = harness_now_ms();
    pod_join(job, &p[2], "w2", 10);
    /* the gap is the scenario, not a wait: the second join comes later, inside the window */
    harness_sleep_ms(300);
    pod_join(job, &p[3], "w3", 10);
    wait_gen(job, 2, -1, 5000, &c);
    int64_t took = harness_now_ms() - t0;
    assert_int_equal(c.generation, 2); /* both joins in one generation */
    assert_int_equal(c.n_members, 4);
    assert_true(took >= 950 && took < 2500);
    printf("# joins at 0 and 300 ms -> one generation after %lld ms (settle window 1000 ms)\n",
           (long long)took);

    /* graceful leave: a new generation at once */
    t0 = harness_now_ms();
    pod_leave(&p[1], true);
    wait_gen(job, 3, 3, 5000, &c);
    took = harness_now_ms() - t0;
    assert_true(took < 1000);
    assert_string_equal(c.members[0].pod, "w0"); /* rank 0 kept */
    assert_string_equal(c.members[1].pod, "w3"); /* the highest rank fills the hole */
    printf("# graceful leave -> generation %lld after %lld ms\n", (long long)c.generation,
           (long long)took);

    /* a crash: the lease expires after its TTL, then a new generation */
    pod_leave(&p[3], true);
    wait_gen(job, 4, 2, 5000, &c);
    pod q;
    pod_join(job, &q, "w9", 2);
    wait_gen(job, 5, 3, 5000, &c);
    t0 = harness_now_ms();
    pod_leave(&q, false);
    wait_gen(job, 6, 2, 8000, &c);
    took = harness_now_ms() - t0;
    assert_true(took >= 1000 && took < 5000);
    printf("# lease expiry (TTL 2 s) -> generation %lld after %lld ms\n", (long long)c.generation,
           (long long)took);
    stop_js(js);
    pod_leave(&p[0], true);
    pod_leave(&p[2], true);
    edl_generation_clear(&c);
}

static const char *leader_of(const char *job, char *buf, size_t n)
{
    int64_t deadline = harness_now_ms() + 5000;
    while (harness_now_ms() < deadline) {
        if (harness_get(g_c, key(job, EDL_KEY_LEADER, NULL), buf, n))
            return buf;
        harness_sleep_ms(20);
    }
    fail_msg("no leader for %s", job);
    return NULL;
}

static void test_leader_killed_standby_takes_over(void **state)
{
    (void)state;
    const char *job = "failover";
    harness_put(g_c, key(job, EDL_KEY_SPEC, NULL), "{\"min\":1,\"max\":8,\"settle_ms\":200}");
    pid_t a = spawn_js(job, "js-a", NULL);
    char first[64]; /* a leads before b starts */
    assert_string_equal(leader_of(job, first, sizeof first), "js-a");
    pid_t b = spawn_js(job, "js-b", NULL);
    pod p[3];
    pod_join(job, &p[0], "w0", 10);
    pod_join(job, &p[1], "w1", 10);
    pod_join(job, &p[2], "w2", 10);
    edl_generation c = {0};
    wait_gen(job, 1, 3, 5000, &c);
    char lead[64];
    leader_of(job, lead, sizeof lead);
    assert_string_equal(lead, "js-a");
    int64_t gen = c.generation;

    int64_t t0 = harness_now_ms();
    harness_kill(a, SIGKILL); /* its lease (TTL 2 s) must expire before js-b may lead */
    pod_leave(&p[2], true);
    wait_gen(job, gen + 1, 2, 6000, &c);
    int64_t took = harness_now_ms() - t0;
    assert_string_equal(c.leader, "js-b");
    assert_int_equal(c.generation, gen + 1); /* never older, never skipped */
    assert_true(took < 4500);
    printf("# leader SIGKILLed -> standby published generation %lld after %lld ms (TTL 2 s)\n",
           (long long)c.generation, (long long)took);
    stop_js(b);
    pod_leave(&p[0], true);
    pod_leave(&p[1], true);
    edl_generation_clear(&c);
}

/* A standby that stops must not take the leader's key with it: it only ever resigns its own. */
static void test_stopping_a_standby_leaves_the_leader_alone(void **state)
{
    (void)state;
    const char *job = "standbystop";
    harness_put(g_c, key(job, EDL_KEY_SPEC, NULL), "{\"min\":1,\"max\":8,\"settle_ms\":100}");
    pid_t a = spawn_js(job, "js-a", NULL);
    char lead[64];
    assert_string_equal(leader_of(job, lead, sizeof lead), "js-a");
    edl_kv *before = NULL;
    assert_int_equal(edl_etcd_get(g_c, edl_str(key(job, EDL_KEY_LEADER, NULL)), &before, NULL), 0);
    /* several of the standby's campaign rounds time out: each round opens a watch for the
     * vacancy, so etcd starts at least three watch streams (two rounds over) */
    const char *streams = "grpc_server_started_total{grpc_method=\"Watch\",grpc_service=\"etcdserverpb.Watch\"";
    double started = harness_etcd_metric(g_srv, streams);
    assert_true(started >= 0);
    pid_t b = spawn_js(job, "js-b", NULL);
    assert_true(HARNESS_WAIT_UNTIL(harness_etcd_metric(g_srv, streams) >= started + 3, 8000));
    stop_js(b);
    edl_kv *after = NULL;
    assert_int_equal(edl_etcd_get(g_c, edl_str(key(job, EDL_KEY_LEADER, NULL)), &after, NULL), 0);
    assert_string_equal(after->value, "js-a");
    assert_int_equal(after->create_revision, before->create_revision); /* the same term */
    edl_kv_free(before);
    edl_kv_free(after);
    pod p[1];
    pod_join(job, &p[0], "w0", 10);
    edl_generation c = {0};
    wait_gen(job, 1, 1, 5000, &c); /* and it still leads */
    assert_string_equal(c.leader, "js-a");
    stop_js(a);
    pod_leave(&p[0], true);
    edl_generation_clear(&c);
}

/* A status from outside the range a job server ever publishes (here 2^52, the parser's bound)
 * must not push the job's numbering past what its own parser reads back: it is ignored. */
static void test_absurd_status_generation_does_not_freeze_the_job(void **state)
{
    (void)state;
    const char *job = "absurd";
    harness_put(g_c, key(job, EDL_KEY_SPEC, NULL), "{\"min\":1,\"max\":8,\"settle_ms\":100}");
    pid_t js = spawn_js(job, "js-a", NULL);
    pod p[2];
    pod_join(job, &p[0], "w0", 10);
    edl_generation c = {0};
    wait_gen(job, 1, 1, 5000, &c);
    pod_status(job, &p[0], INT64_C(4503599627370496), "running", 0);
    pod_join(job, &p[1], "w1", 10);
    wait_gen(job, 2, 2, 5000, &c); /* read back by the same parser */
    assert_int_equal(c.generation, 2);
    pod_leave(&p[1], true);
    wait_gen(job, 3, 1, 5000, &c);
    assert_int_equal(c.generation, 3);
    stop_js(js);
    pod_leave(&p[0], true);
    edl_generation_clear(&c);
}

static void test_paused_leader_is_fenced(void **state)
{
    (void)state;
    const char *job = "fence";
    harness_put(g_c, key(job, EDL_KEY_SPEC, NULL), "{\"min\":1,\"max\":8,\"settle_ms\":100}");
    char alog[512];
    pid_t a = spawn_js_logged(job, "js-a", NULL, js_log("fence-js-a", alog, sizeof alog));
    char first[64]; /* a leads before b starts */
    assert_string_equal(leader_of(job, first, sizeof first), "js-a");
    pid_t b = spawn_js(job, "js-b", NULL);
    pod p[4];
    pod_join(job, &p[0], "w0", 20);
    pod_join(job, &p[1], "w1", 20);
    edl_generation c = {0};
    wait_gen(job, 1, 2, 5000, &c);
    char lead[64];
    assert_string_equal(leader_of(job, lead, sizeof lead), "js-a");

    /* every publication from now on, in order */
    edl_kv *kv;
    int64_t rev;
    assert_int_equal(edl_etcd_get(g_c, edl_str(key(job, EDL_KEY_GENERATION, NULL)), &kv, &rev), 0);
    edl_kv_free(kv);
    edl_watch *w;
    edl_watch_opts wo = {.start_revision = rev + 1};
    assert_int_equal(edl_watch_open(g_c, edl_str(key(job, EDL_KEY_GENERATION, NULL)), &wo, &w), 0);

    kill(a, SIGSTOP); /* a stale leader: alive, but its lease runs out */
    int64_t deadline = harness_now_ms() + 8000;
    while (strcmp(leader_of(job, lead, sizeof lead), "js-b") != 0 &&
           harness_now_ms() < deadline)
        harness_sleep_ms(50);
    assert_string_equal(lead, "js-b");
    pod_join(job, &p[2], "w2", 20);
    wait_gen(job, 2, 3, 5000, &c);
    kill(a, SIGCONT); /* wakes with a stale view; its writes must be refused */
    pod_join(job, &p[3], "w3", 20);
    wait_gen(job, 3, 4, 5000, &c);
    /* the stale leader's chance to write, which must be refused, lasts until it knows */
    assert_true(HARNESS_WAIT_UNTIL(log_says(alog, "lost the leadership"), 8000));
    pod_leave(&p[3], true);
    wait_gen(job, 4, 3, 5000, &c);
    /* the same, after generation 4: js-b acts on a later leave and nothing else comes between */
    pod_leave(&p[2], true);
    wait_gen(job, 5, 2, 5000, &c);

    int64_t last = 1;
    int seen = 0;
    edl_watch_event *ev;
    while (edl_watch_next(w, &ev, 200) == 0) {
        if (ev->type == EDL_WATCH_PUT) {
            edl_generation d = {0};
            char err[256];
            assert_int_equal(edl_generation_parse(ev->kv.value, ev->kv.value_len, &d, err,
                                               sizeof err), 0);
            assert_true(d.generation == last + 1 || d.generation == last);
            assert_string_equal(d.leader, "js-b"); /* the paused leader never published */
            last = d.generation;
            seen++;
            edl_generation_clear(&d);
        }
        edl_watch_event_free(ev);
    }
    edl_watch_close(w);
    assert_int_equal(last, 5);
    assert_true(seen >= 4);
    assert_int_equal(harness_wait_exit(a, 0), -1); /* js-a still runs, as a standby */
    stop_js(a);
    stop_js(b);
    for (int i = 0; i < 2; i++)
        pod_leave(&p[i], true);
    edl_generation_clear(&c);
}

static void test_bad_spec_leaves_job_intact(void **state)
{
    (void)state;
    const char *job = "badspec";
    harness_put(g_c, key(job, EDL_KEY_SPEC, NULL), "{\"min\":2,\"max\":4,\"settle_ms\":100}");
    char log[512];
    pid_t js = spawn_js_logged(job, "js-a", NULL, js_log("badspec", log, sizeof log));
    pod p[3];
    pod_join(job, &p[0], "w0", 10);
    pod_join(job, &p[1], "w1", 10);
    edl_generation c = {0};
    wait_gen(job, 1, 2, 5000, &c);
    static const struct {
        const char *spec, *expect;
    } bad[] = {
        {"{\"min\":5,\"max\":2}", "min (5) is greater than max (2)"},
        {"{\"min\":1,\"ttl_s\":-4}", "TTL must be at least 1"},
        {"{\"min\":2,\"max\":", "not valid JSON"},
        {"{\"min\":\"two\"}", "\"min\" must be an integer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        harness_put(g_c, key(job, EDL_KEY_SPEC, NULL), bad[i].spec);
        int64_t deadline = harness_now_ms() + 3000;
        while (harness_now_ms() < deadline &&
               (!read_generation(job, &c) || !c.spec_error || !strstr(c.spec_error, bad[i].expect)))
            harness_sleep_ms(20);
        if (!c.spec_error || !strstr(c.spec_error, bad[i].expect))
            fail_msg("spec %s: spec_error \"%s\"", bad[i].spec, c.spec_error ? c.spec_error : "");
        assert_int_equal(c.generation, 1); /* intact */
        assert_int_equal(c.n_members, 2);
        assert_int_equal(c.state, EDL_JOB_RUNNING);
    }
    /* a malformed registration is ignored; membership still follows the last valid spec */
    harness_put(g_c, key(job, EDL_KEY_POD, "junk"), "{\"role\":7}");
    pod_join(job, &p[2], "w2", 10);
    wait_gen(job, 2, 3, 5000, &c);
    /* fixed: the error clears */
    harness_put(g_c, key(job, EDL_KEY_SPEC, NULL), "{\"min\":2,\"max\":4,\"settle_ms\":100}");
    int64_t deadline = harness_now_ms() + 3000;
    while (harness_now_ms() < deadline && read_generation(job, &c) && c.spec_error)
        harness_sleep_ms(20);
    assert_null(c.spec_error);
    assert_int_equal(c.generation, 2);
    /* a corrupt generation document: the server refuses to guess and stays up */
    harness_put(g_c, key(job, EDL_KEY_GENERATION, NULL), "{\"generation\":\"x\"");
    /* it read the document and said so; it must not have crashed on the way */
    assert_true(HARNESS_WAIT_UNTIL(log_says(log, "is unreadable"), 5000));
    assert_int_equal(harness_wait_exit(js, 0), -1);
    stop_js(js);
    for (int i = 0; i < 3; i++)
        pod_leave(&p[i], true);
    edl_generation_clear(&c);
}

static void test_success_and_retired_generation_data(void **state)
{
    (void)state;
    const char *job = "done";
    harness_put(g_c, key(job, EDL_KEY_SPEC, NULL), "{\"min\":1,\"max\":4,\"settle_ms\":100}");
    pid_t js = spawn_js(job, "js-a", "--exit-when-done");
    pod p[2];
    pod_join(job, &p[0], "w0", 10);
    edl_generation c = {0};
    wait_gen(job, 1, 1, 5000, &c);
    char gk[256];
    harness_job_key(gk, sizeof gk, job, EDL_KEY_GEN, EDL_GEN_NCCL_ID, 1);
    harness_put(g_c, gk, "abc");
    pod_join(job, &p[1], "w1", 10);
    wait_gen(job, 2, 2, 5000, &c);
    char buf[64];
    assert_null(harness_get(g_c, gk, buf, sizeof buf));
    pod_status(job, &p[0], 2, "exited", 0);
    read_generation(job, &c);
    assert_int_equal(c.state, EDL_JOB_RUNNING); /* one rank still runs */
    edl_put_opts po = {.lease = p[1].lease};
    edl_put_result last;
    assert_int_equal(edl_etcd_put(g_c, edl_str(key(job, EDL_KEY_STATUS, "w1")),
                                  edl_str("{\"generation\":2,\"state\":\"exited\",\"exit_code\":0,"
                                          "\"step\":1}"), &po, &last), 0);
    assert_int_equal(harness_wait_exit(js, 5000), 0); /* --exit-when-done: succeeded */
    read_generation(job, &c);
    assert_int_equal(c.state, EDL_JOB_SUCCEEDED);
    assert_int_equal(c.generation, 2);
    /* not too early: the job ended on both ranks' reports, after the last one */
    assert_non_null(strstr(c.reason, "all 2 ranks exited 0"));
    edl_kv *gkv;
    assert_int_equal(edl_etcd_get(g_c, edl_str(key(job, EDL_KEY_GENERATION, NULL)), &gkv, NULL), 0);
    assert_true(gkv->mod_revision > last.revision);
    edl_kv_free(gkv);
    edl_put_result_clear(&last);
    pod_leave(&p[0], true);
    pod_leave(&p[1], true);
    edl_generation_clear(&c);
}

static void test_failure_restarts_generation_then_fails(void **state)
{
    (void)state;
    const char *job = "fail";
    harness_put(g_c, key(job, EDL_KEY_SPEC, NULL),
                "{\"min\":1,\"max\":4,\"settle_ms\":100,\"max_restarts\":1,\"exclude_after\":5}");
    pid_t js = spawn_js(job, "js-a", "--exit-when-done");
    pod p[2];
    pod_join(job, &p[0], "w0", 10);
    pod_join(job, &p[1], "w1", 10);
    edl_generation c = {0};
    wait_gen(job, 1, 2, 5000, &c);
    /* every member fails, one killed from outside (both failing by themselves would be the
     * script's bug: the job would fail at once): the decision waits for both to report, then
     * restarts them, blaming nobody (a member that has not reported would be waited for up to
     * its lease TTL: it may be starting) */
    pod_status(job, &p[1], 1, "exited", 3);
    pod_status(job, &p[0], 1, "signaled", 0);
    wait_gen(job, 2, 2, 5000, &c);
    assert_int_equal(c.restarts, 1);
    assert_int_equal(c.n_failures, 0);
    pod_status(job, &p[1], 2, "exited", 4); /* not the same failure as before: no repeat */
    pod_status(job, &p[0], 2, "signaled", 0);
    assert_int_equal(harness_wait_exit(js, 5000), 1);
    read_generation(job, &c);
    assert_int_equal(c.state, EDL_JOB_FAILED);
    assert_non_null(strstr(c.reason, "restart budget of 1 spent"));
    pod_leave(&p[0], true);
    pod_leave(&p[1], true);
    edl_generation_clear(&c);
}

static void pod_step(const char *job, pod *p, int64_t gen, int64_t step)
{
    char doc[160];
    snprintf(doc, sizeof doc, "{\"generation\":%lld,\"state\":\"running\",\"step\":%lld}",
             (long long)gen, (long long)step);
    put_status(job, p, doc);
}

static void test_stalled_rank_restarts_generation(void **state)
{
    (void)state;
    const char *job = "hang";
    harness_put(g_c, key(job, EDL_KEY_SPEC, NULL),
                "{\"min\":1,\"max\":4,\"settle_ms\":100,\"progress_timeout_ms\":1500}");
    pid_t js = spawn_js(job, "js-a", NULL);
    pod p[2];
    pod_join(job, &p[0], "w0", 10);
    pod_join(job, &p[1], "w1", 10);
    edl_generation c = {0};
    wait_gen(job, 1, 2, 5000, &c);
    /* w0 advances every 200 ms; w1 reports step 5 once and then nothing (a hung collective) */
    pod_step(job, &p[1], 1, 5);
    int64_t t0 = harness_now_ms(), step = 0;
    while (harness_now_ms() - t0 < 6000 && read_generation(job, &c) && c.generation == 1) {
        pod_step(job, &p[0], 1, ++step);
        harness_sleep_ms(200); /* w0's pace: the scenario (it advances, w1 stalls), not a wait */
    }
    int64_t took = harness_now_ms() - t0;
    assert_int_equal(c.generation, 2);
    assert_int_equal(c.restarts, 1);
    assert_non_null(strstr(c.reason, "pod w1 (rank 1) made no progress for 1500 ms"));
    assert_true(took >= 1400 && took < 4000);
    printf("# rank stalled while the other advanced -> restart after %lld ms (timeout 1500 ms)\n",
           (long long)took);
    stop_js(js);
    pod_leave(&p[0], true);
    pod_leave(&p[1], true);
    edl_generation_clear(&c);
}

static pid_t spawn_js_metrics(const char *job, const char *id, int port)
{
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    const char *argv[] = {EDL_JOBSERVER_BIN, "--etcd", edl_etcd_server_endpoints(g_srv), "--job",
                          job, "--id", id, "--ttl", "2", "--metrics-port", p,
                          "--metrics-addr", "127.0.0.1", NULL};
    pid_t pid = harness_spawn(argv, NULL);
    assert_true(pid > 0);
    return pid;
}

/* Poll /metrics until it contains `want` (the standby answers between campaign attempts). */
static void wait_metric(int port, const char *want)
{
    char body[16384] = "";
    int64_t deadline = harness_now_ms() + 5000;
    while (harness_now_ms() < deadline) {
        if (harness_http_get(port, "/metrics", body, sizeof body) == 200 && strstr(body, want))
            return;
        harness_sleep_ms(50);
    }
    fail_msg("/metrics on port %d never showed \"%s\":\n%s", port, want, body);
}

static void test_metrics_of_leader_and_standby(void **state)
{
    (void)state;
    const char *job = "metrics";
    harness_put(g_c, key(job, EDL_KEY_SPEC, NULL), "{\"min\":1,\"max\":4,\"settle_ms\":100}");
    int pa = harness_free_port(), pb = harness_free_port();
    pid_t a = spawn_js_metrics(job, "js-a", pa);
    char lead[64];
    leader_of(job, lead, sizeof lead);
    pid_t b = spawn_js_metrics(job, "js-b", pb);
    pod p[2];
    pod_join(job, &p[0], "w0", 10);
    pod_join(job, &p[1], "w1", 10);
    edl_generation c = {0};
    wait_gen(job, 1, 2, 5000, &c);
    wait_metric(pa, "edl_jobserver_leader{job=\"metrics\",id=\"js-a\"} 1");
    wait_metric(pa, "edl_jobserver_generation{job=\"metrics\",id=\"js-a\"} 1");
    wait_metric(pa, "edl_jobserver_members{job=\"metrics\",id=\"js-a\"} 2");
    wait_metric(pa, "edl_jobserver_job_state{job=\"metrics\",id=\"js-a\",state=\"running\"} 1");
    wait_metric(pa, "# TYPE edl_jobserver_publications_total counter");
    wait_metric(pb, "edl_jobserver_leader{job=\"metrics\",id=\"js-b\"} 0");
    char body[4096];
    assert_int_equal(harness_http_get(pa, "/healthz", body, sizeof body), 200);
    assert_int_equal(harness_http_get(pa, "/nope", body, sizeof body), 404);
    /* the leader resigns on SIGTERM: the standby leads at once and says so */
    stop_js(a);
    wait_metric(pb, "edl_jobserver_leader{job=\"metrics\",id=\"js-b\"} 1");
    stop_js(b);
    pod_leave(&p[0], true);
    pod_leave(&p[1], true);
    edl_generation_clear(&c);
}

/* etcd frozen (SIGSTOP: connections accepted, nothing answered) under a leader with a 2 s
 * lease: the lease runs out and every campaign attempt hangs on etcd, yet /metrics answers
 * within 100 ms throughout (those requests wait on the server's worker, not its loop), and
 * SIGTERM ends it once etcd thaws. */
static void test_a_frozen_etcd_never_stalls_the_loop(void **state)
{
    (void)state;
    const char *job = "frozen";
    harness_put(g_c, key(job, EDL_KEY_SPEC, NULL), "{\"min\":1,\"max\":4,\"settle_ms\":100}");
    int port = harness_free_port();
    pid_t js = spawn_js_metrics(job, "js-f", port);
    pod p;
    pod_join(job, &p, "w0", 30);
    edl_generation c = {0};
    wait_gen(job, 1, 1, 5000, &c);
    wait_metric(port, "edl_jobserver_leader{job=\"frozen\",id=\"js-f\"} 1");
    pid_t etcd = edl_etcd_server_pid(g_srv, 0);
    assert_true(etcd > 0);
    assert_int_equal(kill(etcd, SIGSTOP), 0);
    char body[16384];
    int64_t worst = 0;
    bool stepped_down = false;
    /* past the 2 s TTL (it steps down) and ten scrapes more, into the campaigns */
    int64_t end = harness_now_ms() + 15000;
    for (int after = 0; after < 10 && harness_now_ms() < end; after += stepped_down) {
        int64_t t0 = harness_now_ms();
        assert_int_equal(harness_http_get(port, "/metrics", body, sizeof body), 200);
        int64_t took = harness_now_ms() - t0;
        worst = took > worst ? took : worst;
        stepped_down = stepped_down || strstr(body, "edl_jobserver_leader{job=\"frozen\","
                                                    "id=\"js-f\"} 0");
        harness_sleep_ms(100); /* a scrape every 100 ms through the freeze: a pace, not a wait */
    }
    assert_int_equal(kill(etcd, SIGCONT), 0);
    if (worst >= 100)
        fail_msg("with etcd frozen, a /metrics scrape took %lld ms", (long long)worst);
    assert_true(stepped_down); /* its lease ran out: it knew, and said so */
    kill(js, SIGTERM);
    assert_int_equal(harness_wait_exit(js, 15000), 0);
    pod_leave(&p, true);
    edl_generation_clear(&c);
}

static void test_help_and_bad_options(void **state)
{
    (void)state;
    const char *help[] = {EDL_JOBSERVER_BIN, "--help", NULL};
    pid_t pid = harness_spawn(help, "/dev/null");
    assert_int_equal(harness_wait_exit(pid, 5000), 0);
    const char *bad[] = {EDL_JOBSERVER_BIN, "--etcd", "http://127.0.0.1:1", "--job", "a/b", NULL};
    pid = harness_spawn(bad, "/dev/null");
    assert_int_equal(harness_wait_exit(pid, 5000), 2);
    const char *ttl[] = {EDL_JOBSERVER_BIN, "--job", "x", "--ttl", "-1", NULL};
    pid = harness_spawn(ttl, "/dev/null");
    assert_int_equal(harness_wait_exit(pid, 5000), 2);
    const char *maddr[] = {EDL_JOBSERVER_BIN, "--etcd", "http://127.0.0.1:1", "--job", "x",
                           "--metrics-port", "9", "--metrics-addr", "10.0.0.300", NULL};
    pid = harness_spawn(maddr, "/dev/null");
    assert_int_equal(harness_wait_exit(pid, 5000), 2);
    /* the operator's bound on a job's pods: 1..100000, said so, by edl-operator and by the
     * alias that still starts it for one release (which says it is deprecated) */
    static char out[16384];
    static const char *const counts[] = {"0", "100001", "many"};
    for (size_t i = 0; i < 3; i++) {
        const char *maxrep[] = {EDL_OPERATOR_BIN, "--max-replicas", counts[i], NULL};
        assert_int_equal(harness_run(maxrep, "/tmp/test_jobserver.maxrep.log", 5000, out,
                                     sizeof out), 2);
        assert_non_null(strstr(out, "edl-operator: --max-replicas"));
        assert_non_null(strstr(out, "expected a number of pods, 1 to 100000"));
    }
    const char *alias[] = {EDL_JOBSERVER_BIN, "--kubernetes", "--max-replicas", "0", NULL};
    assert_int_equal(harness_run(alias, "/tmp/test_jobserver.maxrep.log", 5000, out,
                                 sizeof out), 2);
    assert_non_null(strstr(out, "--kubernetes is deprecated"));
    assert_non_null(strstr(out, "edl-operator: --max-replicas 0: expected a number of pods"));
    /* without --kubernetes the job server knows none of the operator's flags */
    const char *jsmax[] = {EDL_JOBSERVER_BIN, "--job", "x", "--max-replicas", "3", NULL};
    assert_int_equal(harness_run(jsmax, "/tmp/test_jobserver.maxrep.log", 5000, out,
                                 sizeof out), 2);
    const char *helped[] = {EDL_JOBSERVER_BIN, "--help", NULL};
    assert_int_equal(harness_run(helped, "/tmp/test_jobserver.maxrep.log", 5000, out,
                                 sizeof out), 0);
    assert_null(strstr(out, "--max-replicas"));
    assert_non_null(strstr(out, "edl-operator"));
    const char *ophelp[] = {EDL_OPERATOR_BIN, "--help", NULL};
    assert_int_equal(harness_run(ophelp, "/tmp/test_jobserver.maxrep.log", 5000, out,
                                 sizeof out), 0);
    assert_non_null(strstr(out, "--max-replicas N"));
    assert_non_null(strstr(out, "Usage: edl-operator"));
    unlink("/tmp/test_jobserver.maxrep.log");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_and_bad_options),
        cmocka_unit_test(test_stopping_a_standby_leaves_the_leader_alone),
        cmocka_unit_test(test_absurd_status_generation_does_not_freeze_the_job),
        cmocka_unit_test(test_scale_up_within_settle_window_is_one_generation),
        cmocka_unit_test(test_leader_killed_standby_takes_over),
        cmocka_unit_test(test_paused_leader_is_fenced),
        cmocka_unit_test(test_bad_spec_leaves_job_intact),
        cmocka_unit_test(test_success_and_retired_generation_data),
        cmocka_unit_test(test_failure_restarts_generation_then_fails),
        cmocka_unit_test(test_stalled_rank_restarts_generation),
        cmocka_unit_test(test_metrics_of_leader_and_standby),
        cmocka_unit_test(test_a_frozen_etcd_never_stalls_the_loop),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

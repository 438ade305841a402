/* test_reconcile.c: the job server's decisions as a pure function (jobserver/reconcile.c):
 * settle window (a join that left before it was published neither opens nor shortens it), losses,
 * waiting below min, failures with restarts, exclusion and its growing
 * cool-down (only for a pod that fails while others run), the restart budget, exit-code
 * policy, trainers that cannot be started, the script's own bug (a failure the trainer marked,
 * every rank failing by itself, a rank repeating its failure: the job fails at once), success
 * (all ranks, or in process rank 0 and a grace), hangs, stop, spec errors; and the
 * parameter-server role: waiting for ps_min servers, server changes as new generations that
 * keep the workers, server failures (no restart), success decided by the workers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/job.h"
#include "reconcile.h"

#define MAXP 16

/* A world the test edits: pods p0..p<n-1> (lease 100+i), statuses, the current generation. */
typedef struct world {
    edl_job_spec spec;
    edl_pod pods[MAXP];
    char names[MAXP][16];
    size_t n;
    edl_pod_status st[MAXP];
    bool has[MAXP];
    edl_generation cur;
    js_memory mem;
    int64_t now, mono;
} world;

static void world_init(world *w, int min, int max)
{
    memset(w, 0, sizeof *w);
    edl_spec_init(&w->spec);
    w->spec.min = min;
    w->spec.max = max;
    w->spec.settle_ms = 1000;
    w->now = 1000000;
    w->mono = 5000;
}

static void add_pod(world *w, int id)
{
    size_t i = w->n++;
    snprintf(w->names[i], sizeof w->names[i], "p%d", id);
    w->pods[i] = (edl_pod){.name = w->names[i], .role = (char *)"worker",
                           .addr = (char *)"10.0.0.1", .port = 7000 + id, .lease = 100 + id,
                           .create_revision = (int64_t)i + 1};
    w->has[i] = false;
}

/* A parameter server s<id> (lease 200+id). */
static void add_ps(world *w, int id)
{
    size_t i = w->n++;
    snprintf(w->names[i], sizeof w->names[i], "s%d", id);
    w->pods[i] = (edl_pod){.name = w->names[i], .role = (char *)"ps",
                           .addr = (char *)"10.0.0.2", .port = 7100 + id, .lease = 200 + id,
                           .create_revision = (int64_t)i + 1};
    w->has[i] = false;
}

static void remove_named(world *w, const char *name)
{
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->pods[i].name, name) == 0) {
            for (size_t j = i; j + 1 < w->n; j++) {
                memcpy(w->names[j], w->names[j + 1], sizeof w->names[j]);
                w->pods[j] = w->pods[j + 1];
                w->pods[j].name = w->names[j];
                w->st[j] = w->st[j + 1];
                w->has[j] = w->has[j + 1];
            }
            w->n--;
            return;
        }
    fail_msg("no pod %s", name);
}

static void remove_pod(world *w, int id)
{
    char name[16];
    snprintf(name, sizeof name, "p%d", id);
    remove_named(w, name);
}

static void set_named_status(world *w, const char *name, edl_trainer_state s, int code,
                             int64_t step)
{
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->pods[i].name, name) == 0) {
            w->st[i] = (edl_pod_status){.generation = w->cur.generation, .state = s,
                                        .exit_code = s == EDL_TRAINER_EXITED ? code : 0,
                                        .signal = s == EDL_TRAINER_SIGNALED ? code : 0,
                                        .step = step};
            w->has[i] = true;
        }
}

static void set_status(world *w, int id, edl_trainer_state s, int code, int64_t step)
{
    char name[16];
    snprintf(name, sizeof name, "p%d", id);
    set_named_status(w, name, s, code, step);
}

static void all_running(world *w)
{
    for (size_t i = 0; i < w->cur.n_members; i++)
        set_status(w, atoi(w->cur.members[i].pod + 1), EDL_TRAINER_RUNNING, 0, -1);
}

static const char *g_dead; /* the current generation's dead key, as trainers published it */
static const bool *g_alive; /* [rank]: its gen/<n>/alive/<rank> key (NULL: none) */
static const bool *g_renewed; /* [pod index]: its lease renewed since the hold began */

/* Run the reconciler; when it publishes, the result becomes the current generation. */
static js_decision step(world *w)
{
    int64_t max_status_gen = 0; /* as the job server reads it from the statuses */
    for (size_t i = 0; i < w->n; i++)
        if (w->has[i] && w->st[i].generation > max_status_gen)
            max_status_gen = w->st[i].generation;
    js_observed o = {.spec = &w->spec, .pods = w->pods, .n_pods = w->n, .status = w->st,
                     .has_status = w->has, .current = &w->cur, .max_status_gen = max_status_gen,
                     .now_ms = w->now, .mono_ms = w->mono, .leader_id = "js", .gen_dead = g_dead,
                     .gen_alive = g_alive, .renewed = g_renewed};
    js_decision d;
    assert_int_equal(js_reconcile(&o, &w->mem, &d), 0);
    if (d.action == JS_PUBLISH) {
        /* round-trip through JSON as the real server does */
        char *j = edl_generation_to_json(&d.next);
        char err[256];
        assert_int_equal(edl_generation_parse(j, strlen(j), &w->cur, err, sizeof err), 0);
        free(j);
    }
    return d;
}

static void advance(world *w, int64_t ms)
{
    w->now += ms;
    w->mono += ms;
}

/* Decide a failure while other members still report running: the server first holds the
 * decision for up to one lease TTL (plus 1 s), in case the failure is the fallout of a peer
 * whose agent died, waking each second to probe the leases of those it waits for (nobody
 * renews here); nobody vanishes either, so it then decides. */
static js_decision step_past_hold(world *w)
{
    js_decision d = step(w);
    int64_t t0 = w->mono;
    while (d.action == JS_NOTHING && d.waiting[0] && d.wake_mono_ms > w->mono) {
        assert_true(d.n_probe > 0 && d.wake_mono_ms - w->mono <= 1000);
        advance(w, d.wake_mono_ms - w->mono);
        js_decision_clear(&d);
        d = step(w);
    }
    assert_true(w->mono - t0 <= w->spec.ttl_s * 1000 + 1000);
    return d;
}

static void world_free(world *w)
{
    edl_generation_clear(&w->cur);
    js_memory_clear(&w->mem);
    edl_spec_clear(&w->spec);
}

static void list_is(const edl_member *m, size_t n, const char *expect)
{
    char got[256] = "";
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(m[i].rank, (int)i);
        strcat(got, i ? " " : "");
        strcat(got, m[i].pod);
    }
    assert_string_equal(got, expect);
}

static void members_are(const world *w, const char *expect)
{
    list_is(w->cur.members, w->cur.n_members, expect);
}

static void servers_are(const world *w, const char *expect)
{
    list_is(w->cur.servers, w->cur.n_servers, expect);
}

static void test_first_generation_after_settle_window(void **state)
{
    (void)state;
    world w;
    world_init(&w, 2, 4);
    add_pod(&w, 0);
    js_decision d = step(&w);
    assert_int_equal(d.action, JS_NOTHING); /* one join: the window opens */
    assert_int_equal(d.wake_mono_ms, w.mono + 1000);
    js_decision_clear(&d);
    advance(&w, 400);
    add_pod(&w, 1);
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    assert_int_equal(d.wake_mono_ms, w.mono + 600); /* still the first join's window */
    js_decision_clear(&d);
    advance(&w, 600);
    d = step(&w);
    assert_int_equal(d.action, JS_PUBLISH);
    assert_true(d.new_generation);
    js_decision_clear(&d);
    assert_int_equal(w.cur.generation, 1);
    assert_int_equal(w.cur.state, EDL_JOB_RUNNING);
    members_are(&w, "p0 p1");
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING); /* level-triggered: nothing more to do */
    js_decision_clear(&d);
    world_free(&w);
}

static void test_scale_up_within_window_is_one_generation(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 8);
    add_pod(&w, 0);
    add_pod(&w, 1);
    js_decision d = step(&w);
    js_decision_clear(&d);
    advance(&w, 1000);
    d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.generation, 1);
    int64_t started = w.cur.started_ms; /* the run's name: its first generation's time */
    assert_true(started > 0 && started == w.cur.published_ms);
    add_pod(&w, 2);
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    js_decision_clear(&d);
    advance(&w, 300);
    add_pod(&w, 3);
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    js_decision_clear(&d);
    advance(&w, 700);
    d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.generation, 2);
    members_are(&w, "p0 p1 p2 p3");
    assert_true(w.cur.started_ms == started && w.cur.published_ms > started); /* one run */
    world_free(&w);
}

static void form(world *w, int n)
{
    for (int i = 0; i < n; i++)
        add_pod(w, i);
    js_decision d = step(w);
    js_decision_clear(&d);
    advance(w, w->spec.settle_ms);
    d = step(w);
    js_decision_clear(&d);
    assert_int_equal(w->cur.state, EDL_JOB_RUNNING);
    all_running(w);
}

/* Trainers declared the generation dead (their group broke) but nobody left: after a grace of
 * at least 1 s, the same members re-form in a new generation, counted as a restart. */
static void test_generation_declared_dead_reforms_same_members(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 8);
    form(&w, 3);
    int64_t g = w.cur.generation;
    int restarts = w.cur.restarts;
    static const bool all_alive[3] = {true, true, true}; /* every rank said it lives on */
    g_dead = "{\"rank\":1,\"reason\":\"no progress for 1000 ms\"}";
    g_alive = all_alive;
    js_decision d = step(&w);
    assert_int_equal(d.action, JS_NOTHING); /* the grace: a trainer's exit may still come */
    assert_true(d.wake_mono_ms > w.mono);
    js_decision_clear(&d);
    advance(&w, 1000);
    d = step(&w);
    assert_int_equal(d.action, JS_PUBLISH);
    js_decision_clear(&d);
    assert_int_equal(w.cur.generation, g + 1);
    assert_int_equal(w.cur.restarts, restarts + 1);
    members_are(&w, "p0 p1 p2");
    assert_non_null(strstr(w.cur.reason, "declared dead"));
    g_dead = NULL; /* the new generation has no dead key */
    g_alive = NULL;
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    js_decision_clear(&d);
    world_free(&w);
}

/* In-process trainers declare their generation dead when a member's agent dies with its
 * trainer; that member says nothing, and its status keeps saying "running". The survivors
 * say they live on; the server waits for the silent one (at most its TTL + 1 s): its lease
 * expires, and the loss is published, costing no restart and holding no silent member. */
static void test_dead_generation_waits_for_its_silent_member(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 8);
    w.spec.mode = EDL_MODE_INPROCESS;
    w.spec.ttl_s = 3;
    form(&w, 3);
    int64_t g = w.cur.generation;
    static const bool survivors[3] = {true, true, false}; /* rank 2 (p2) is silent */
    g_dead = "{\"rank\":0,\"reason\":\"rank 2 is gone (connection closed)\"}";
    g_alive = survivors;
    js_decision d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    assert_int_equal(d.wake_mono_ms, w.mono + 4000); /* TTL + 1 s, not the 1 s grace */
    js_decision_clear(&d);
    advance(&w, 2000);
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING); /* no re-form that holds the silent p2 */
    js_decision_clear(&d);
    remove_pod(&w, 2); /* its lease expired */
    d = step(&w);
    assert_true(d.new_generation);
    js_decision_clear(&d);
    assert_int_equal(w.cur.generation, g + 1);
    assert_int_equal(w.cur.restarts, 0);
    members_are(&w, "p0 p1");
    g_dead = NULL;
    g_alive = NULL;
    world_free(&w);
}

static void test_loss_is_published_at_once(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 8);
    form(&w, 4);
    int64_t g = w.cur.generation;
    remove_pod(&w, 1);
    js_decision d = step(&w);
    assert_int_equal(d.action, JS_PUBLISH);
    js_decision_clear(&d);
    assert_int_equal(w.cur.generation, g + 1);
    members_are(&w, "p0 p3 p2"); /* the highest rank fills the hole */
    assert_non_null(strstr(w.cur.reason, "pod p1 left"));
    world_free(&w);
}

/* After a crash, a replacement pod registers and is scaled away before its join is published:
 * it leaves no settle window behind, so a later real join still waits the whole window. */
static void test_join_that_left_opens_no_settle_window(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 8);
    form(&w, 3);
    remove_pod(&w, 2); /* the crash: published at once */
    js_decision d = step(&w);
    assert_int_equal(d.action, JS_PUBLISH);
    js_decision_clear(&d);
    add_pod(&w, 3); /* the replacement opens a window ... */
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    js_decision_clear(&d);
    advance(&w, 300);
    remove_pod(&w, 3); /* ... and is scaled away before its join is published */
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    assert_int_equal(d.wake_mono_ms, 0); /* nothing pending: no window to wake for */
    js_decision_clear(&d);
    advance(&w, 5000);
    add_pod(&w, 4); /* a real join: the whole window, not at once */
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    assert_int_equal(d.wake_mono_ms, w.mono + 1000);
    js_decision_clear(&d);
    advance(&w, 1000);
    d = step(&w);
    assert_int_equal(d.action, JS_PUBLISH);
    js_decision_clear(&d);
    members_are(&w, "p0 p1 p4");
    world_free(&w);
}

/* Of two pending joins, the first leaves: the window of the one that stays runs from its own
 * join, not from the one that left. */
static void test_join_that_left_does_not_shorten_the_window(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 8);
    form(&w, 2);
    add_pod(&w, 2);
    js_decision d = step(&w);
    assert_int_equal(d.wake_mono_ms, w.mono + 1000);
    js_decision_clear(&d);
    advance(&w, 500);
    add_pod(&w, 3);
    d = step(&w);
    assert_int_equal(d.wake_mono_ms, w.mono + 500); /* one window for both */
    js_decision_clear(&d);
    advance(&w, 100);
    remove_pod(&w, 2);
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    assert_int_equal(d.wake_mono_ms, w.mono + 900); /* p3's own window */
    js_decision_clear(&d);
    advance(&w, 900);
    d = step(&w);
    assert_int_equal(d.action, JS_PUBLISH);
    js_decision_clear(&d);
    members_are(&w, "p0 p1 p3");
    world_free(&w);
}

static void test_below_min_waits_then_resumes(void **state)
{
    (void)state;
    world w;
    world_init(&w, 3, 4);
    form(&w, 3);
    remove_pod(&w, 2);
    js_decision d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_WAITING);
    assert_non_null(strstr(w.cur.reason, "2 of at least 3"));
    add_pod(&w, 5);
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    js_decision_clear(&d);
    advance(&w, 1000);
    d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_RUNNING);
    members_are(&w, "p0 p1 p5");
    world_free(&w);
}

static void test_standby_promoted_on_loss(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 2);
    form(&w, 3);
    members_are(&w, "p0 p1");
    assert_int_equal(w.cur.n_standbys, 1);
    assert_string_equal(w.cur.standbys[0], "p2");
    remove_pod(&w, 0);
    js_decision d = step(&w);
    js_decision_clear(&d);
    members_are(&w, "p2 p1"); /* promoted at once, into the free rank */
    assert_int_equal(w.cur.n_standbys, 0);
    world_free(&w);
}

static void test_failure_restarts_then_excludes_then_fails(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    w.spec.max_restarts = 3;
    w.spec.exclude_after = 2;
    w.spec.cooldown_ms = 10000;
    w.spec.cooldown_max_ms = 25000;
    form(&w, 3);
    int64_t g = w.cur.generation;
    set_status(&w, 1, EDL_TRAINER_EXITED, 3, 10);
    js_decision d = step_past_hold(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.generation, g + 1); /* restart, same members */
    assert_int_equal(w.cur.restarts, 1);
    members_are(&w, "p0 p1 p2");
    assert_non_null(strstr(w.cur.reason, "exited with code 3"));
    all_running(&w);
    set_status(&w, 1, EDL_TRAINER_SIGNALED, 9, 10); /* second failure: excluded for 10 s
                                                      * (a second exit 3 would be a repeat:
                                                      * test_repeated_failure_fails_the_job) */
    d = step_past_hold(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.restarts, 2);
    members_are(&w, "p0 p2");
    assert_int_equal(w.cur.failures[0].count, 2);
    assert_int_equal(w.cur.failures[0].excluded_until, w.now + 10000);
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    assert_int_equal(d.wake_mono_ms, w.mono + 10001); /* wakes when the cool-down ends */
    js_decision_clear(&d);
    advance(&w, 10001);
    d = step(&w); /* back as a join: waits for the window */
    js_decision_clear(&d);
    advance(&w, 1000);
    d = step(&w);
    js_decision_clear(&d);
    members_are(&w, "p0 p2 p1");
    all_running(&w);
    set_status(&w, 1, EDL_TRAINER_SIGNALED, 9, 0); /* third: excluded for 20 s (doubled) */
    d = step_past_hold(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.restarts, 3);
    assert_int_equal(w.cur.failures[0].excluded_until, w.now + 20000);
    all_running(&w);
    set_status(&w, 0, EDL_TRAINER_EXITED, 1, 0); /* budget of 3 spent */
    d = step_past_hold(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_FAILED);
    assert_non_null(strstr(w.cur.reason, "restart budget of 3 spent"));
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING); /* final stays final */
    js_decision_clear(&d);
    world_free(&w);
}

/* In process mode a trainer killed in a live pod costs the survivors only the re-formation: the
 * restart generation leaves the pod out at once (a restart spent, the pod blamed), and it comes
 * back as a join once its agent reports waiting (its replacement trainer is ready). */
static void test_inprocess_failed_pod_sits_out_until_its_replacement_is_ready(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    w.spec.mode = EDL_MODE_INPROCESS;
    form(&w, 3);
    int64_t g = w.cur.generation;
    set_status(&w, 1, EDL_TRAINER_SIGNALED, 9, 10);
    js_decision d = step(&w); /* no hold: in-process survivors keep running by design */
    assert_int_equal(d.action, JS_PUBLISH);
    js_decision_clear(&d);
    assert_int_equal(w.cur.generation, g + 1);
    assert_int_equal(w.cur.restarts, 1);
    members_are(&w, "p0 p2");
    assert_non_null(strstr(w.cur.reason, "killed by signal 9"));
    all_running(&w);
    advance(&w, 5000); /* its replacement is still starting: it stays out */
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    js_decision_clear(&d);
    members_are(&w, "p0 p2");
    set_status(&w, 1, EDL_TRAINER_WAITING, 0, -1); /* ready: a join, after the window */
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    assert_int_equal(d.wake_mono_ms, w.mono + w.spec.settle_ms);
    js_decision_clear(&d);
    advance(&w, w.spec.settle_ms);
    d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.generation, g + 2);
    assert_int_equal(w.cur.restarts, 1);
    members_are(&w, "p0 p2 p1");
    world_free(&w);
}

static void test_exit_code_policy(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    w.spec.restart_policy = EDL_RESTART_EXIT_CODE;
    form(&w, 2);
    set_status(&w, 0, EDL_TRAINER_SIGNALED, 9, 0); /* 137: retryable */
    js_decision d = step_past_hold(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_RUNNING);
    assert_int_equal(w.cur.restarts, 1);
    all_running(&w);
    set_status(&w, 1, EDL_TRAINER_EXITED, 2, 0); /* 2: permanent */
    d = step_past_hold(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_FAILED);
    assert_non_null(strstr(w.cur.reason, "permanent"));
    world_free(&w);
}

static void test_never_policy_fails_at_once(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    w.spec.restart_policy = EDL_RESTART_NEVER;
    form(&w, 2);
    set_status(&w, 1, EDL_TRAINER_EXITED, 200, 0);
    js_decision d = step_past_hold(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_FAILED);
    world_free(&w);
}

static void test_all_ranks_exit_zero_is_success(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    form(&w, 3);
    set_status(&w, 0, EDL_TRAINER_EXITED, 0, 0);
    set_status(&w, 1, EDL_TRAINER_EXITED, 0, 0);
    js_decision d = step(&w);
    assert_int_equal(d.action, JS_NOTHING); /* one still running */
    js_decision_clear(&d);
    set_status(&w, 2, EDL_TRAINER_EXITED, 0, 0);
    d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_SUCCEEDED);
    world_free(&w);
}

static void test_stalled_rank_is_treated_as_failed(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    w.spec.progress_timeout_ms = 3000;
    form(&w, 3);
    for (int t = 0; t < 5; t++) {
        set_status(&w, 0, EDL_TRAINER_RUNNING, 0, t);
        set_status(&w, 1, EDL_TRAINER_RUNNING, 0, 7); /* stuck at step 7 */
        set_status(&w, 2, EDL_TRAINER_RUNNING, 0, t);
        js_decision d = step(&w);
        assert_int_equal(d.action, t < 4 ? JS_NOTHING : JS_PUBLISH);
        if (t < 4)
            assert_true(d.wake_mono_ms > 0);
        js_decision_clear(&d);
        advance(&w, 1000);
    }
    assert_int_equal(w.cur.restarts, 1);
    assert_non_null(strstr(w.cur.reason, "pod p1 (rank 1) made no progress"));
    world_free(&w);
}

static void test_all_stalled_is_not_a_hang(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    w.spec.progress_timeout_ms = 1000;
    form(&w, 2);
    for (int t = 0; t < 5; t++) {
        set_status(&w, 0, EDL_TRAINER_RUNNING, 0, 3);
        set_status(&w, 1, EDL_TRAINER_RUNNING, 0, 3);
        js_decision d = step(&w);
        assert_int_equal(d.action, JS_NOTHING); /* e.g. a long evaluation on every rank */
        js_decision_clear(&d);
        advance(&w, 1000);
    }
    world_free(&w);
}

static void test_stop_request_and_spec_error(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    form(&w, 2);
    int64_t g = w.cur.generation;
    js_observed o = {.spec = &w.spec, .spec_error = "spec: min (5) is greater than max (2)",
                     .pods = w.pods, .n_pods = w.n, .status = w.st, .has_status = w.has,
                     .current = &w.cur, .now_ms = w.now, .mono_ms = w.mono};
    js_decision d;
    assert_int_equal(js_reconcile(&o, &w.mem, &d), 0);
    assert_int_equal(d.action, JS_PUBLISH); /* the error is shown, the generation kept */
    assert_false(d.new_generation);
    assert_int_equal(d.next.generation, g);
    assert_string_equal(d.next.spec_error, o.spec_error);
    js_decision_clear(&d);
    w.spec.stopped = true;
    d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_STOPPED);
    assert_int_equal(w.cur.generation, g);
    world_free(&w);
}

/* The decision owns the generation number: one past the current one, and past any that an
 * agent reports having run (the document was restored from an old backup, or rewritten). */
static void test_new_generation_never_repeats_a_reported_one(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    form(&w, 2);
    assert_int_equal(w.cur.generation, 1);
    w.st[0].generation = 9; /* p0 ran generation 9 of a document since lost */
    remove_pod(&w, 1);
    js_decision d = step(&w);
    assert_int_equal(d.action, JS_PUBLISH);
    assert_true(d.new_generation);
    assert_int_equal(d.next.generation, 10);
    assert_int_equal(w.cur.generation, 10);
    js_decision_clear(&d);
    world_free(&w);
}

/* Two pods join at once with one free place: one will be a member, the other a standby. While
 * the settle window is open, the published generation keeps its members (a refreshed standby
 * list must not carry the pending join into the running generation). */
static void test_settling_joins_do_not_leak_into_the_running_generation(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 3);
    form(&w, 2);
    int64_t g = w.cur.generation;
    add_pod(&w, 2);
    add_pod(&w, 3);
    js_decision d = step(&w);
    if (d.action == JS_PUBLISH) {
        assert_false(d.new_generation);
        assert_int_equal(w.cur.generation, g);
    }
    members_are(&w, "p0 p1");
    js_decision_clear(&d);
    advance(&w, w.spec.settle_ms);
    d = step(&w);
    assert_true(d.new_generation);
    members_are(&w, "p0 p1 p2");
    assert_int_equal(w.cur.n_standbys, 1);
    assert_string_equal(w.cur.standbys[0], "p3");
    js_decision_clear(&d);
    world_free(&w);
}

/* Failure counts stop at the bound a document may hold: counting on never overflows, and what
 * is published always parses back. */
static void test_failure_count_saturates_at_its_bound(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 2);
    w.spec.exclude_after = EDL_RESTARTS_MAX;
    w.spec.max_restarts = EDL_RESTARTS_MAX;
    form(&w, 2);
    for (size_t i = 0; i < w.cur.n_failures; i++)
        free(w.cur.failures[i].pod);
    free(w.cur.failures);
    w.cur.failures = calloc(1, sizeof *w.cur.failures);
    w.cur.failures[0] = (edl_pod_failures){.pod = strdup("p0"), .count = EDL_RESTARTS_MAX};
    w.cur.n_failures = 1;
    w.cur.restarts = 3;
    set_status(&w, 0, EDL_TRAINER_EXITED, 1, 5);
    js_decision d = step_past_hold(&w); /* step() round-trips the document through its parser */
    assert_int_equal(d.action, JS_PUBLISH);
    assert_true(d.new_generation);
    assert_int_equal(w.cur.n_failures, 1);
    assert_int_equal(w.cur.failures[0].count, EDL_RESTARTS_MAX);
    assert_int_equal(w.cur.restarts, 4);
    js_decision_clear(&d);
    world_free(&w);
}

/* A pod's agent dies (SIGKILL, node loss): its status keeps saying "running" until its lease
 * expires, while its peers' trainers exit because their collective broke. The server holds the
 * decision; when the silent pod's registration disappears it is a loss: a new generation
 * without it, no restart spent, nobody blamed or excluded. */
static void test_peer_loss_blames_nobody(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    w.spec.ttl_s = 2;
    form(&w, 3);
    int64_t g = w.cur.generation;
    set_status(&w, 1, EDL_TRAINER_EXITED, 1, 7); /* p0 is silent: still "running" */
    set_status(&w, 2, EDL_TRAINER_EXITED, 1, 7);
    js_decision d = step(&w);
    assert_int_equal(d.action, JS_NOTHING); /* no generation with the silent p0 in it */
    assert_true(d.wake_mono_ms > w.mono && d.wake_mono_ms <= w.mono + 3000);
    js_decision_clear(&d);
    advance(&w, 1500);
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    js_decision_clear(&d);
    remove_pod(&w, 0); /* its lease expired */
    d = step(&w);
    assert_int_equal(d.action, JS_PUBLISH);
    assert_true(d.new_generation);
    js_decision_clear(&d);
    assert_int_equal(w.cur.generation, g + 1);
    members_are(&w, "p2 p1"); /* p2 takes the vacated rank 0: one rank changes, not two */
    assert_int_equal(w.cur.restarts, 0);
    assert_int_equal(w.cur.n_failures, 0);
    assert_non_null(strstr(w.cur.reason, "pod p0 left"));
    world_free(&w);
}

/* Nobody vanishes within the lease TTL (plus 1 s): the failures are real and decided then. */
static void test_failure_hold_ends_after_the_ttl(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    w.spec.ttl_s = 2;
    form(&w, 2);
    set_status(&w, 1, EDL_TRAINER_EXITED, 1, 7);
    js_decision d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    assert_int_equal(d.wake_mono_ms, w.mono + 1000); /* to probe p0's lease */
    assert_int_equal(d.n_probe, 1);
    assert_string_equal(w.pods[d.probe[0]].name, "p0");
    js_decision_clear(&d);
    advance(&w, 2999);
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    assert_int_equal(d.wake_mono_ms, w.mono + 1); /* the TTL + 1 s comes before a probe */
    js_decision_clear(&d);
    advance(&w, 1);
    d = step(&w);
    assert_true(d.new_generation);
    js_decision_clear(&d);
    assert_int_equal(w.cur.restarts, 1);
    assert_int_equal(w.cur.n_failures, 1);
    assert_string_equal(w.cur.failures[0].pod, "p1");
    world_free(&w);
}

/* The peer that still reports running is blocked in a collective, not gone: its agent renewed
 * its lease after the failure (the job server probes the leases of those a hold waits for).
 * The failure is decided on the pass that learns it, not after a lease TTL. */
static void test_a_peer_whose_lease_was_renewed_is_not_waited_for(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    w.spec.ttl_s = 10;
    form(&w, 3);
    set_status(&w, 1, EDL_TRAINER_EXITED, 1, 7);
    js_decision d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    assert_int_equal(d.n_probe, 2); /* p0 and p2 */
    js_decision_clear(&d);
    bool renewed[8] = {false};
    renewed[0] = true; /* p0's agent renewed: p2 is still waited for */
    g_renewed = renewed;
    advance(&w, 1000);
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    assert_int_equal(d.n_probe, 1);
    assert_string_equal(w.pods[d.probe[0]].name, "p2");
    assert_non_null(strstr(d.waiting, "pod p2"));
    js_decision_clear(&d);
    renewed[2] = true;
    advance(&w, 1000);
    d = step(&w); /* 2 s after the failure, not 11 */
    g_renewed = NULL;
    assert_true(d.new_generation);
    js_decision_clear(&d);
    assert_int_equal(w.cur.restarts, 1);
    assert_int_equal(w.cur.n_failures, 1);
    assert_string_equal(w.cur.failures[0].pod, "p1");
    world_free(&w);
}

/* A trainer is killed while its peers' trainers step on (programs that share no collective, or
 * that have not noticed yet): a peer whose agent writes a new step after the failure is alive,
 * so the decision is not held for a lease TTL in case it is silent. The hold samples the steps
 * (running statuses wake nobody) and decides once every peer stepped; one whose step stays
 * put may have lost its agent and is still waited for, and the wait says so. */
static void test_failure_beside_stepping_peers_is_not_held_for_a_ttl(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    w.spec.ttl_s = 10;
    form(&w, 3);
    for (int i = 0; i < 3; i++)
        set_status(&w, i, EDL_TRAINER_RUNNING, 0, 40);
    set_status(&w, 1, EDL_TRAINER_SIGNALED, 9, 40);
    int64_t failed_at = w.mono;
    js_decision d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    assert_true(d.wake_mono_ms > w.mono && d.wake_mono_ms <= w.mono + 250); /* it samples */
    assert_non_null(strstr(d.waiting, "killed by signal 9; waiting up to 11.0 s for pod p0"));
    js_decision_clear(&d);
    advance(&w, 250);
    set_status(&w, 0, EDL_TRAINER_RUNNING, 0, 41); /* p0's agent wrote a step: not silent */
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING); /* p2 has not stepped since */
    assert_non_null(strstr(d.waiting, "for pod p2"));
    js_decision_clear(&d);
    advance(&w, 250);
    set_status(&w, 2, EDL_TRAINER_RUNNING, 0, 42);
    d = step(&w);
    assert_true(d.new_generation);
    js_decision_clear(&d);
    assert_true(w.mono - failed_at < 1000);
    assert_int_equal(w.cur.restarts, 1);
    assert_int_equal(w.cur.n_failures, 1); /* p1 failed while the others ran: it is blamed */
    assert_string_equal(w.cur.failures[0].pod, "p1");
    world_free(&w);
}

/* A peer whose step stays put after a failure may be silent (its agent died after its last
 * step went out): the hold samples it every 250 ms and waits the whole TTL + 1 s for it. */
static void test_failure_beside_a_peer_whose_step_stays_put_is_held_for_the_ttl(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    w.spec.ttl_s = 2;
    form(&w, 2);
    set_status(&w, 0, EDL_TRAINER_RUNNING, 0, 40);
    set_status(&w, 1, EDL_TRAINER_SIGNALED, 9, 40);
    int64_t due = w.mono + 3000;
    int passes = 0;
    js_decision d = step(&w);
    while (d.action == JS_NOTHING && w.mono < due) {
        assert_true(d.wake_mono_ms > w.mono && d.wake_mono_ms <= w.mono + 250);
        passes++;
        advance(&w, d.wake_mono_ms - w.mono);
        js_decision_clear(&d);
        d = step(&w);
    }
    assert_int_equal(w.mono, due); /* decided at the TTL + 1 s, not before */
    assert_true(passes >= 12);
    assert_true(d.new_generation);
    js_decision_clear(&d);
    assert_int_equal(w.cur.restarts, 1);
    world_free(&w);
}

/* A rank blocked in a collective past the progress timeout (its agent reports "hung"): the
 * generation restarts at once (a restart is spent) but the pod is not blamed: it waited on a
 * peer. The hang's message reaches the reason. */
static void test_hung_rank_restarts_without_blame(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    form(&w, 3);
    int64_t g = w.cur.generation;
    set_status(&w, 0, EDL_TRAINER_HUNG, 0, 4);
    snprintf(w.st[0].message, sizeof w.st[0].message,
             "blocked for 3001 ms (progress timeout 3000 ms) in allreduce #9");
    js_decision d = step(&w);
    assert_true(d.new_generation);
    js_decision_clear(&d);
    assert_int_equal(w.cur.generation, g + 1);
    assert_int_equal(w.cur.restarts, 1);
    assert_int_equal(w.cur.n_failures, 0);
    members_are(&w, "p0 p1 p2");
    assert_non_null(strstr(w.cur.reason, "pod p0 (rank 0) hung: blocked for 3001 ms"));
    world_free(&w);
}

/* ---- the parameter-server role ------------------------------------------------------------ */

/* A job with 2 workers and ps 2..3: servers are ranked apart; the job waits until ps_min
 * servers are there (the servers it has are listed, so they can start); ps pods beyond ps_max
 * are standbys. */
static void ps_world(world *w, int min, int max, int ps_min, int ps_max)
{
    world_init(w, min, max);
    w->spec.ps_min = ps_min;
    w->spec.ps_max = ps_max;
}

/* Let pending joins settle into a generation. */
static void settle(world *w)
{
    js_decision d = step(w);
    js_decision_clear(&d);
    advance(w, w->spec.settle_ms);
    d = step(w);
    js_decision_clear(&d);
}

static void servers_running(world *w)
{
    for (size_t i = 0; i < w->cur.n_servers; i++)
        set_named_status(w, w->cur.servers[i].pod, EDL_TRAINER_RUNNING, 0, -1);
}

/* Workers p0.. and servers s0.. join, settle into a generation and run. */
static void start_ps_job(world *w, int workers, int servers)
{
    for (int i = 0; i < workers; i++)
        add_pod(w, i);
    for (int i = 0; i < servers; i++)
        add_ps(w, i);
    settle(w);
    all_running(w);
    servers_running(w);
}

/* Two workers and two servers (ps 1..2) running. */
static void ps_world_start(world *w)
{
    ps_world(w, 1, 2, 1, 2);
    start_ps_job(w, 2, 2);
}

static void test_ps_job_waits_until_ps_min_servers(void **state)
{
    (void)state;
    world w;
    ps_world(&w, 2, 2, 2, 3);
    add_pod(&w, 0);
    add_pod(&w, 1);
    add_ps(&w, 0);
    settle(&w);
    assert_int_equal(w.cur.generation, 1);
    assert_int_equal(w.cur.state, EDL_JOB_WAITING); /* 1 of at least 2 servers */
    members_are(&w, "p0 p1");
    servers_are(&w, "s0");
    assert_non_null(strstr(w.cur.reason, "1 of at least 2 servers"));
    add_ps(&w, 1);
    settle(&w);
    assert_int_equal(w.cur.generation, 2);
    assert_int_equal(w.cur.state, EDL_JOB_RUNNING);
    servers_are(&w, "s0 s1");
    assert_non_null(strstr(w.cur.reason, "server s1 joined"));
    add_ps(&w, 2);
    add_ps(&w, 3);
    settle(&w);
    assert_int_equal(w.cur.generation, 3);
    servers_are(&w, "s0 s1 s2");
    assert_int_equal(w.cur.n_standbys, 1); /* beyond ps.max 3 */
    assert_string_equal(w.cur.standbys[0], "s3");
    /* a pod of a role nobody knows takes no part */
    add_pod(&w, 9);
    w.pods[w.n - 1].role = (char *)"teacher";
    settle(&w);
    assert_int_equal(w.cur.generation, 3);
    members_are(&w, "p0 p1");
    assert_int_equal(w.cur.n_standbys, 1);
    /* without the ps role, ps pods are never servers */
    world v;
    world_init(&v, 1, 2);
    add_pod(&v, 0);
    add_ps(&v, 0);
    settle(&v);
    assert_int_equal(v.cur.state, EDL_JOB_RUNNING);
    assert_int_equal(v.cur.n_servers, 0);
    assert_string_equal(v.cur.standbys[0], "s0");
    world_free(&v);
    world_free(&w);
}

/* A server joining or leaving makes a new generation number whose workers are the same pods,
 * leases and ranks (the agents keep their trainers), and costs no restart; a join waits for the
 * settle window, a loss is published at once. */
static void test_server_change_is_a_new_generation_that_keeps_the_workers(void **state)
{
    (void)state;
    world w;
    ps_world(&w, 2, 2, 1, 3);
    w.spec.max_restarts = 0;
    start_ps_job(&w, 2, 2);
    int64_t g = w.cur.generation;
    edl_member before[2];
    memcpy(before, w.cur.members, sizeof before); /* compared by value below */
    char p0[8], p1[8];
    snprintf(p0, sizeof p0, "%s", before[0].pod);
    snprintf(p1, sizeof p1, "%s", before[1].pod);
    add_ps(&w, 2);
    js_decision d = step(&w);
    assert_int_equal(d.action, JS_NOTHING); /* settling */
    js_decision_clear(&d);
    advance(&w, 1000);
    d = step(&w);
    assert_true(d.new_generation);
    js_decision_clear(&d);
    assert_int_equal(w.cur.generation, g + 1);
    assert_int_equal(edl_generation_of_members(&w.cur), g); /* the workers' group is kept */
    servers_are(&w, "s0 s1 s2");
    members_are(&w, "p0 p1");
    assert_string_equal(w.cur.members[0].pod, p0);
    assert_string_equal(w.cur.members[1].pod, p1);
    assert_true(w.cur.members[0].lease == before[0].lease);
    assert_true(w.cur.members[1].lease == before[1].lease);
    assert_int_equal(w.cur.restarts, 0);
    assert_int_equal(w.cur.state, EDL_JOB_RUNNING);
    /* the agents carry their statuses into the new generation (same workers) */
    all_running(&w);
    servers_running(&w);
    remove_named(&w, "s0"); /* its lease is gone: at once, the highest rank fills the hole */
    d = step(&w);
    assert_true(d.new_generation);
    js_decision_clear(&d);
    assert_int_equal(w.cur.generation, g + 2);
    assert_int_equal(edl_generation_of_members(&w.cur), g);
    servers_are(&w, "s2 s1");
    members_are(&w, "p0 p1");
    assert_int_equal(w.cur.restarts, 0);
    assert_non_null(strstr(w.cur.reason, "server s0 left"));
    /* a worker joining forms a new group */
    add_pod(&w, 2);
    w.spec.max = 3;
    all_running(&w);
    servers_running(&w);
    settle(&w);
    assert_int_equal(w.cur.generation, g + 3);
    assert_int_equal(edl_generation_of_members(&w.cur), g + 3);
    members_are(&w, "p0 p1 p2");
    world_free(&w);
}

/* A server's process failing drops it from the servers at once and counts towards its
 * exclusion, but restarts no worker and spends no restart budget (here 0). It comes back as a
 * newcomer after the settle window; its second failure excludes it. A server exiting 0 leaves
 * cleanly: dropped, no failure counted. */
static void test_server_failure_drops_it_without_restart(void **state)
{
    (void)state;
    world w;
    ps_world(&w, 1, 2, 1, 3);
    w.spec.max_restarts = 0;
    w.spec.exclude_after = 2;
    start_ps_job(&w, 2, 3);
    int64_t g = w.cur.generation;
    set_named_status(&w, "s1", EDL_TRAINER_EXITED, 3, -1);
    js_decision d = step(&w); /* no hold, no settle window */
    assert_true(d.new_generation);
    js_decision_clear(&d);
    assert_int_equal(w.cur.generation, g + 1);
    assert_int_equal(w.cur.state, EDL_JOB_RUNNING);
    assert_int_equal(w.cur.restarts, 0);
    members_are(&w, "p0 p1");
    servers_are(&w, "s0 s2");
    assert_non_null(strstr(w.cur.reason, "pod s1 (server 1) exited with code 3"));
    assert_int_equal(w.cur.n_failures, 1);
    assert_string_equal(w.cur.failures[0].pod, "s1");
    assert_int_equal(w.cur.failures[0].count, 1);
    assert_int_equal(w.cur.failures[0].excluded_until, 0);
    /* its agent reports waiting for the new generation: a newcomer again, after the window */
    all_running(&w);
    servers_running(&w);
    set_named_status(&w, "s1", EDL_TRAINER_WAITING, 0, -1);
    settle(&w);
    assert_int_equal(w.cur.generation, g + 2);
    servers_are(&w, "s0 s2 s1");
    all_running(&w);
    servers_running(&w);
    set_named_status(&w, "s1", EDL_TRAINER_SIGNALED, 9, -1);
    d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.generation, g + 3);
    servers_are(&w, "s0 s2");
    assert_int_equal(w.cur.failures[0].count, 2);
    assert_true(w.cur.failures[0].excluded_until > w.now); /* excluded for the cool-down */
    set_named_status(&w, "s1", EDL_TRAINER_WAITING, 0, -1);
    all_running(&w);
    servers_running(&w);
    settle(&w);
    assert_int_equal(w.cur.generation, g + 3); /* excluded: not back */
    /* exit 0: a clean leave, no failure */
    set_named_status(&w, "s2", EDL_TRAINER_EXITED, 0, -1);
    d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.generation, g + 4);
    servers_are(&w, "s0");
    assert_int_equal(w.cur.n_failures, 1); /* s1's only */
    assert_int_equal(w.cur.restarts, 0);
    assert_int_equal(w.cur.state, EDL_JOB_RUNNING);
    world_free(&w);
}

/* Success is the workers' alone: every rank exited 0 succeeds the job while the servers still
 * run; servers that all exit 0 do not end it (below ps_min it waits). */
/* A pod joined just as rank 0 finished the job's last steps: it waits for rank 0's store,
 * which closed, and reports "running". The job succeeds on rank 0's result once the grace has
 * passed (30 s, within a trainer's 60 s rendezvous timeout), not after a failure and a
 * restart. While a rank is done, joins form no generation. */
static void test_rank0_done_ends_the_job_after_a_grace(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    w.spec.mode = EDL_MODE_INPROCESS;
    form(&w, 2);
    int64_t g = w.cur.generation;
    set_status(&w, 0, EDL_TRAINER_EXITED, 0, 9);
    add_pod(&w, 2); /* a join while rank 0 is done: no generation for it */
    js_decision d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    assert_int_equal(d.wake_mono_ms, w.mono + 30000);
    js_decision_clear(&d);
    advance(&w, 29999);
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    js_decision_clear(&d);
    members_are(&w, "p0 p1");
    advance(&w, 1);
    d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.generation, g);
    assert_int_equal(w.cur.state, EDL_JOB_SUCCEEDED);
    assert_int_equal(w.cur.restarts, 0);
    assert_non_null(strstr(w.cur.reason, "rank 0 (pod p0) exited 0 and 1 other rank still ran"));
    world_free(&w);
}

/* Rank 0 done and another rank gone (its pod left): the job succeeded, at once. A rank that
 * failed is judged as ever, even after rank 0 exited 0: its failure restarts the generation. */
static void test_rank0_done_with_a_failure_or_a_loss(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    w.spec.mode = EDL_MODE_INPROCESS;
    form(&w, 3);
    set_status(&w, 0, EDL_TRAINER_EXITED, 0, 9);
    set_status(&w, 1, EDL_TRAINER_EXITED, 0, 9);
    remove_pod(&w, 2);
    js_decision d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_SUCCEEDED);
    assert_non_null(strstr(w.cur.reason, "the other ranks exited 0 or left"));
    world_free(&w);

    world_init(&w, 1, 4);
    w.spec.mode = EDL_MODE_INPROCESS;
    form(&w, 2);
    int64_t g = w.cur.generation;
    set_status(&w, 0, EDL_TRAINER_EXITED, 0, 9);
    set_status(&w, 1, EDL_TRAINER_EXITED, 1, 9);
    d = step_past_hold(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_RUNNING);
    assert_int_equal(w.cur.generation, g + 1);
    assert_int_equal(w.cur.restarts, 1);
    world_free(&w);
}

/* With parameter servers the workers are independent: rank 1 may train long after rank 0 is
 * done, and nothing ends it (see test_success_is_decided_by_the_workers). Nor in restart mode,
 * which runs any program (ranks with a shard each, sharing no collective). */
static void test_rank0_done_in_a_ps_job_or_restart_mode_waits_for_the_others(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    form(&w, 2);
    set_status(&w, 0, EDL_TRAINER_EXITED, 0, 9);
    advance(&w, 600000);
    js_decision d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_RUNNING);
    world_free(&w);

    ps_world(&w, 2, 2, 1, 2);
    w.spec.mode = EDL_MODE_INPROCESS;
    start_ps_job(&w, 2, 1);
    all_running(&w);
    servers_running(&w);
    set_status(&w, 0, EDL_TRAINER_EXITED, 0, -1);
    advance(&w, 600000);
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_RUNNING);
    world_free(&w);
}

static void test_success_is_decided_by_the_workers(void **state)
{
    (void)state;
    world w;
    ps_world(&w, 2, 2, 1, 2);
    start_ps_job(&w, 2, 1);
    int64_t g = w.cur.generation;
    set_named_status(&w, "s0", EDL_TRAINER_EXITED, 0, -1);
    js_decision d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.generation, g + 1);
    assert_int_equal(w.cur.state, EDL_JOB_WAITING); /* no server left, ps.min 1 */
    assert_int_equal(w.cur.n_servers, 0);
    remove_named(&w, "s0"); /* its agent leaves after a clean exit */
    add_ps(&w, 1);
    settle(&w);
    assert_int_equal(w.cur.state, EDL_JOB_RUNNING);
    servers_are(&w, "s1");
    all_running(&w);
    servers_running(&w);
    set_status(&w, 0, EDL_TRAINER_EXITED, 0, -1);
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING); /* rank 1 still trains */
    js_decision_clear(&d);
    set_status(&w, 1, EDL_TRAINER_EXITED, 0, -1);
    d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_SUCCEEDED); /* s1 still runs: no matter */
    assert_non_null(strstr(w.cur.reason, "all 2 ranks exited 0"));
    world_free(&w);
}

/* A worker failure restarts the workers as before; the servers stay the same pods at the same
 * ranks (their agents keep them running). */
static void test_worker_restart_keeps_the_servers(void **state)
{
    (void)state;
    world w;
    ps_world(&w, 2, 2, 1, 2);
    start_ps_job(&w, 2, 2);
    set_status(&w, 1, EDL_TRAINER_SIGNALED, 9, -1); /* from outside (both failing by
                                                     * themselves would be the script's bug) */
    set_status(&w, 0, EDL_TRAINER_SIGNALED, 9, -1);
    int64_t g = w.cur.generation;
    js_decision d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.restarts, 1);
    assert_int_equal(edl_generation_of_members(&w.cur), g + 1); /* restarted: a new group */
    members_are(&w, "p0 p1");
    servers_are(&w, "s0 s1");
    assert_int_equal(w.cur.state, EDL_JOB_RUNNING);
    world_free(&w);
}

/* In a job with parameter servers the workers share no collective: one worker's failure is no
 * peer's fallout and the others keep running, so it is decided at once (no hold of a lease
 * TTL while the failed worker's share waits). */
static void test_worker_failure_in_a_ps_job_is_decided_at_once(void **state)
{
    (void)state;
    world w;
    ps_world(&w, 2, 3, 1, 2);
    w.spec.ttl_s = 10;
    start_ps_job(&w, 3, 2);
    int64_t g = w.cur.generation;
    set_status(&w, 1, EDL_TRAINER_EXITED, 1, -1); /* p0 and p2 still train */
    js_decision d = step(&w);
    assert_int_equal(d.action, JS_PUBLISH);
    assert_true(d.new_generation);
    js_decision_clear(&d);
    assert_int_equal(w.cur.restarts, 1);
    assert_int_equal(edl_generation_of_members(&w.cur), g + 1);
    assert_string_equal(w.cur.failures[0].pod, "p1");
    servers_are(&w, "s0 s1");
    world_free(&w);
}

/* Teachers (role "teacher") are no members: joining, failing, leaving or being excluded-sized
 * in numbers, they never change a generation, its ranks, its restarts or the job's state. */
static void test_teachers_never_change_ranks_or_generations(void **state)
{
    (void)state;
    world w;
    world_init(&w, 2, 2);
    w.spec.teachers_min = 1;
    w.spec.teachers_max = 3;
    snprintf(w.spec.teachers_service, sizeof w.spec.teachers_service, "svc");
    add_pod(&w, 0);
    add_pod(&w, 1);
    settle(&w);
    all_running(&w);
    settle(&w);
    assert_int_equal(w.cur.state, EDL_JOB_RUNNING);
    int64_t gen = w.cur.generation;
    members_are(&w, "p0 p1");
    for (int id = 5; id < 8; id++) { /* three teachers join (workers' names, teachers' role) */
        add_pod(&w, id);
        w.pods[w.n - 1].role = (char *)EDL_ROLE_TEACHER;
    }
    settle(&w);
    assert_int_equal(w.cur.generation, gen);
    members_are(&w, "p0 p1");
    assert_int_equal(w.cur.n_standbys, 0);
    set_status(&w, 5, EDL_TRAINER_EXITED, 1, -1); /* a teacher's server failed */
    set_status(&w, 6, EDL_TRAINER_SIGNALED, 9, -1);
    settle(&w);
    assert_int_equal(w.cur.generation, gen);
    assert_int_equal(w.cur.restarts, 0);
    assert_int_equal(w.cur.n_failures, 0);
    assert_int_equal(w.cur.state, EDL_JOB_RUNNING);
    remove_pod(&w, 7); /* and one leaves */
    settle(&w);
    assert_int_equal(w.cur.generation, gen);
    members_are(&w, "p0 p1");
    assert_int_equal(w.cur.members[0].rank, 0);
    assert_int_equal(w.cur.members[1].rank, 1);
    /* the workers alone decide success, whatever the teachers do */
    set_status(&w, 0, EDL_TRAINER_EXITED, 0, -1);
    set_status(&w, 1, EDL_TRAINER_EXITED, 0, -1);
    settle(&w);
    assert_int_equal(w.cur.state, EDL_JOB_SUCCEEDED);
    world_free(&w);
}

/* ---- failures that retrying cannot fix --------------------------------------------------- */

/* A trainer that cannot be started (its agent could not execute it and reports 127 with why, or
 * a shell said 126: not executable, 127: not found) fails the job at once, whatever the policy
 * and the budget, with the agent's message: restarting cannot help. No hold either: the other
 * members still running changes nothing. A trainer that reported a step had started, whatever
 * code it exits with: an ordinary failure. */
static void test_trainer_that_cannot_start_fails_the_job_at_once(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    w.spec.ttl_s = 10;
    form(&w, 3);
    set_status(&w, 1, EDL_TRAINER_EXITED, 127, -1);
    snprintf(w.st[1].message, sizeof w.st[1].message,
             "/no/such/trainer: No such file or directory");
    js_decision d = step(&w);
    assert_int_equal(d.action, JS_PUBLISH);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_FAILED);
    assert_int_equal(w.cur.restarts, 0);
    assert_non_null(strstr(w.cur.reason, "pod p1 (rank 1) exited with code 127: /no/such/trainer: "
                                         "No such file or directory"));
    assert_non_null(strstr(w.cur.reason, "cannot be started"));
    world_free(&w);

    world_init(&w, 1, 4); /* 126 from a shell: found, not executable */
    form(&w, 1);
    set_status(&w, 0, EDL_TRAINER_EXITED, 126, -1);
    d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_FAILED);
    assert_non_null(strstr(w.cur.reason, "exited with code 126"));
    world_free(&w);

    world_init(&w, 1, 4); /* it had reported progress: it started; a restart */
    form(&w, 2);
    set_status(&w, 0, EDL_TRAINER_EXITED, 127, 40);
    d = step_past_hold(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_RUNNING);
    assert_int_equal(w.cur.restarts, 1);
    world_free(&w);

    ps_world_start(&w); /* a parameter server that cannot start fails the job too */
    set_named_status(&w, "s1", EDL_TRAINER_EXITED, 127, -1);
    d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_FAILED);
    assert_non_null(strstr(w.cur.reason, "pod s1 (server 1) exited with code 127"));
    world_free(&w);
}

/* Every member is killed from outside (here the only one, SIGKILL as the OOM killer sends
 * it): no pod is to blame, so nobody is excluded and no cool-down is waited: each failure is
 * restarted at once and the job fails when its budget is spent. (Every member failing by
 * itself is the script's bug: test_every_rank_failing_by_itself_fails_the_job.) */
static void test_every_member_failing_spends_the_budget_without_exclusion(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    w.spec.max_restarts = 3;
    w.spec.exclude_after = 2;
    form(&w, 1);
    for (int i = 1; i <= 3; i++) {
        set_status(&w, 0, EDL_TRAINER_SIGNALED, 9, -1);
        js_decision d = step(&w);
        assert_true(d.new_generation); /* at once: no hold, no cool-down */
        js_decision_clear(&d);
        assert_int_equal(w.cur.restarts, i);
        members_are(&w, "p0");
        assert_int_equal(w.cur.n_failures, 0);
        all_running(&w);
    }
    set_status(&w, 0, EDL_TRAINER_SIGNALED, 9, -1);
    js_decision d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_FAILED);
    assert_non_null(strstr(w.cur.reason, "restart budget of 3 spent"));
    world_free(&w);
}

/* Three members all fail, one after another, the later ones not yet started for the
 * generation when the first failure is seen (rank 0 starts first): the decision waits for
 * them to report, then restarts everyone, blaming nobody. One of them killed from outside
 * each time, so this is no script's bug; no rank repeats its failure. */
static void test_all_members_failing_together_blames_nobody(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    w.spec.max_restarts = 5;
    w.spec.exclude_after = 1;
    w.spec.ttl_s = 10;
    form(&w, 3);
    set_status(&w, 0, EDL_TRAINER_SIGNALED, 9, -1);
    set_status(&w, 1, EDL_TRAINER_EXITED, 3, -1);
    set_status(&w, 2, EDL_TRAINER_EXITED, 3, -1);
    js_decision d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.restarts, 1);
    assert_int_equal(w.cur.n_failures, 0);
    members_are(&w, "p0 p1 p2");
    int64_t g = w.cur.generation;
    set_status(&w, 0, EDL_TRAINER_EXITED, 3, -1); /* p1 and p2 report generation g - 1 */
    w.st[1].generation = w.st[2].generation = g - 1;
    d = step(&w);
    assert_int_equal(d.action, JS_NOTHING); /* they may still start and report */
    assert_true(d.wake_mono_ms > w.mono && d.wake_mono_ms <= w.mono + 11000);
    js_decision_clear(&d);
    advance(&w, 100);
    set_status(&w, 1, EDL_TRAINER_EXITED, 4, -1);
    set_status(&w, 2, EDL_TRAINER_SIGNALED, 9, -1);
    d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.restarts, 2);
    assert_int_equal(w.cur.n_failures, 0);
    members_are(&w, "p0 p1 p2");
    assert_non_null(strstr(w.cur.reason, "every member failed"));
    world_free(&w);
}

/* ---- fail fast on the script's own bug ------------------------------------------------------ */

static void set_message(world *w, int id, const char *msg, bool own_error)
{
    char name[16];
    snprintf(name, sizeof name, "p%d", id);
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->pods[i].name, name) == 0) {
            snprintf(w->st[i].message, sizeof w->st[i].message, "%s", msg);
            w->st[i].own_error = own_error;
        }
}

/* edl.torch marks an exception that is no communication failure as the trainer's own error:
 * the job fails at once (no hold for peers, no restart), in either mode, the exception in the
 * reason. */
static void test_trainer_marked_error_fails_the_job_at_once(void **state)
{
    (void)state;
    for (int mode = EDL_MODE_RESTART; mode <= EDL_MODE_INPROCESS; mode++) {
        world w;
        world_init(&w, 1, 4);
        w.spec.mode = (edl_elastic_mode)mode;
        form(&w, 3);
        set_status(&w, 1, EDL_TRAINER_EXITED, 1, 50);
        set_message(&w, 1, "ValueError: boom at step 50", true);
        js_decision d = step(&w);
        assert_int_equal(d.action, JS_PUBLISH);
        js_decision_clear(&d);
        assert_int_equal(w.cur.state, EDL_JOB_FAILED);
        assert_int_equal(w.cur.restarts, 0);
        assert_non_null(strstr(w.cur.reason, "pod p1 (rank 1) exited with code 1: ValueError: "
                                             "boom at step 50"));
        assert_non_null(strstr(w.cur.reason, "own error"));
        world_free(&w);
    }
}

/* Every rank failing by itself (an exit code or a crash; the only rank of a job of one) is the
 * script's bug: the job fails at once. Every rank killed from outside is not (see
 * test_every_member_failing_spends_the_budget_without_exclusion). */
static void test_every_rank_failing_by_itself_fails_the_job(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    form(&w, 1);
    set_status(&w, 0, EDL_TRAINER_EXITED, 1, 50);
    set_message(&w, 0, "Traceback: ValueError: boom", false);
    js_decision d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_FAILED);
    assert_int_equal(w.cur.restarts, 0);
    assert_non_null(strstr(w.cur.reason, "ValueError: boom"));
    assert_non_null(strstr(w.cur.reason, "every rank (1 of 1) failed by itself"));
    world_free(&w);

    world_init(&w, 1, 4); /* two ranks: one exits 1, the other crashes (SIGSEGV) */
    form(&w, 2);
    set_status(&w, 0, EDL_TRAINER_EXITED, 1, 50);
    set_status(&w, 1, EDL_TRAINER_SIGNALED, 11, 50);
    d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_FAILED);
    assert_non_null(strstr(w.cur.reason, "every rank (2 of 2)"));
    world_free(&w);

    world_init(&w, 1, 4); /* a shell's 137 is its child's SIGKILL: from outside, a restart */
    form(&w, 2);
    set_status(&w, 0, EDL_TRAINER_EXITED, 137, 50);
    set_status(&w, 1, EDL_TRAINER_EXITED, 1, 50);
    d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_RUNNING);
    assert_int_equal(w.cur.restarts, 1);
    world_free(&w);
}

/* fail_fast off (`edl run --no-fail-fast`, failFast: false): what would be the script's own
 * error (a marked exception, every rank failing by itself) spends a restart like any failure,
 * until the budget is spent. */
static void test_without_fail_fast_the_scripts_error_spends_restarts(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    w.spec.fail_fast = false;
    w.spec.max_restarts = 1;
    form(&w, 2);
    set_status(&w, 1, EDL_TRAINER_EXITED, 1, 50);
    set_message(&w, 1, "OSError: the bucket is not reachable", true);
    js_decision d = step_past_hold(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_RUNNING);
    assert_int_equal(w.cur.restarts, 1);
    all_running(&w);
    set_status(&w, 0, EDL_TRAINER_EXITED, 1, 60); /* every rank by itself: budget spent */
    set_status(&w, 1, EDL_TRAINER_EXITED, 1, 60);
    d = step_past_hold(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_FAILED);
    assert_non_null(strstr(w.cur.reason, "restart budget of 1 spent"));
    assert_null(strstr(w.cur.reason, "own error"));
    world_free(&w);
}

/* One rank failing twice in a row the same way (exit code and message) while the others ran
 * is the script's bug; a different failure, or a SIGKILL (the OOM killer) twice, restarts. */
static void test_repeated_failure_fails_the_job(void **state)
{
    (void)state;
    world w;
    world_init(&w, 1, 4);
    w.spec.exclude_after = 5;
    form(&w, 3);
    int64_t g = w.cur.generation;
    set_status(&w, 2, EDL_TRAINER_SIGNALED, 9, 30); /* OOM-killed twice: restarts */
    js_decision d = step_past_hold(&w);
    js_decision_clear(&d);
    all_running(&w);
    set_status(&w, 2, EDL_TRAINER_SIGNALED, 9, 30);
    d = step_past_hold(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_RUNNING);
    assert_int_equal(w.cur.restarts, 2);
    all_running(&w);
    set_status(&w, 1, EDL_TRAINER_EXITED, 1, 50);
    set_message(&w, 1, "KeyError: 'x'", false);
    d = step_past_hold(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.restarts, 3); /* the first time: a restart */
    all_running(&w);
    set_status(&w, 1, EDL_TRAINER_EXITED, 1, 50);
    set_message(&w, 1, "KeyError: 'y'", false); /* not the same failure: a restart */
    d = step_past_hold(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.restarts, 4);
    all_running(&w);
    set_status(&w, 1, EDL_TRAINER_EXITED, 1, 50);
    set_message(&w, 1, "KeyError: 'y'", false); /* the same again: the script's bug */
    d = step_past_hold(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_FAILED);
    assert_int_equal(w.cur.restarts, 4);
    char expect[64];
    snprintf(expect, sizeof expect, "rank 1 failed the same way in generation %lld",
             (long long)g + 3);
    if (!strstr(w.cur.reason, expect))
        fail_msg("reason: %s", w.cur.reason);
    assert_non_null(strstr(w.cur.reason, "KeyError: 'y'"));
    world_free(&w);
}

/* The elastic mode not given: the job is in process once every member's trainer said so
 * (status inprocess): a failure is decided at once (in-process survivors keep running, their
 * status says nothing) and rank 0's success ends the job; otherwise, or with restart given
 * explicitly, restart mode's rules hold (the decision waits for silent peers). */
static void test_mode_follows_the_trainers(void **state)
{
    (void)state;
    for (int c = 0; c < 3; c++) { /* 0: all say inprocess; 1: one does not; 2: restart given */
        world w;
        world_init(&w, 1, 4);
        w.spec.ttl_s = 10;
        if (c == 2)
            w.spec.mode = EDL_MODE_RESTART;
        form(&w, 2);
        all_running(&w);
        for (size_t i = 0; i < w.n; i++)
            w.st[i].inprocess = !(c == 1 && i == 0);
        set_status(&w, 1, EDL_TRAINER_SIGNALED, 9, 30);
        w.st[1].inprocess = true;
        js_decision d = step(&w);
        assert_int_equal(d.new_generation, c == 0); /* at once only in process */
        js_decision_clear(&d);
        world_free(&w);
    }
    world w; /* rank 0 done, rank 1 still running: in process, success after the grace */
    world_init(&w, 1, 4);
    form(&w, 2);
    all_running(&w);
    set_status(&w, 0, EDL_TRAINER_EXITED, 0, 90);
    for (size_t i = 0; i < w.n; i++)
        w.st[i].inprocess = true;
    js_decision d = step(&w);
    assert_int_equal(d.action, JS_NOTHING);
    assert_true(d.wake_mono_ms > w.mono);
    advance(&w, d.wake_mono_ms - w.mono);
    js_decision_clear(&d);
    d = step(&w);
    js_decision_clear(&d);
    assert_int_equal(w.cur.state, EDL_JOB_SUCCEEDED);
    world_free(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_generation_never_repeats_a_reported_one),
        cmocka_unit_test(test_trainer_marked_error_fails_the_job_at_once),
        cmocka_unit_test(test_every_rank_failing_by_itself_fails_the_job),
        cmocka_unit_test(test_without_fail_fast_the_scripts_error_spends_restarts),
        cmocka_unit_test(test_repeated_failure_fails_the_job),
        cmocka_unit_test(test_mode_follows_the_trainers),
        cmocka_unit_test(test_peer_loss_blames_nobody),
        cmocka_unit_test(test_dead_generation_waits_for_its_silent_member),
        cmocka_unit_test(test_failure_hold_ends_after_the_ttl),
        cmocka_unit_test(test_a_peer_whose_lease_was_renewed_is_not_waited_for),
        cmocka_unit_test(test_failure_beside_stepping_peers_is_not_held_for_a_ttl),
        cmocka_unit_test(test_failure_beside_a_peer_whose_step_stays_put_is_held_for_the_ttl),
        cmocka_unit_test(test_hung_rank_restarts_without_blame),
        cmocka_unit_test(test_failure_count_saturates_at_its_bound),
        cmocka_unit_test(test_settling_joins_do_not_leak_into_the_running_generation),
        cmocka_unit_test(test_first_generation_after_settle_window),
        cmocka_unit_test(test_scale_up_within_window_is_one_generation),
        cmocka_unit_test(test_loss_is_published_at_once),
        cmocka_unit_test(test_join_that_left_opens_no_settle_window),
        cmocka_unit_test(test_join_that_left_does_not_shorten_the_window),
        cmocka_unit_test(test_generation_declared_dead_reforms_same_members),
        cmocka_unit_test(test_below_min_waits_then_resumes),
        cmocka_unit_test(test_standby_promoted_on_loss),
        cmocka_unit_test(test_failure_restarts_then_excludes_then_fails),
        cmocka_unit_test(test_inprocess_failed_pod_sits_out_until_its_replacement_is_ready),
        cmocka_unit_test(test_exit_code_policy),
        cmocka_unit_test(test_never_policy_fails_at_once),
        cmocka_unit_test(test_all_ranks_exit_zero_is_success),
        cmocka_unit_test(test_stalled_rank_is_treated_as_failed),
        cmocka_unit_test(test_all_stalled_is_not_a_hang),
        cmocka_unit_test(test_stop_request_and_spec_error),
        cmocka_unit_test(test_ps_job_waits_until_ps_min_servers),
        cmocka_unit_test(test_server_change_is_a_new_generation_that_keeps_the_workers),
        cmocka_unit_test(test_server_failure_drops_it_without_restart),
        cmocka_unit_test(test_success_is_decided_by_the_workers),
        cmocka_unit_test(test_worker_restart_keeps_the_servers),
        cmocka_unit_test(test_worker_failure_in_a_ps_job_is_decided_at_once),
        cmocka_unit_test(test_teachers_never_change_ranks_or_generations),
        cmocka_unit_test(test_trainer_that_cannot_start_fails_the_job_at_once),
        cmocka_unit_test(test_every_member_failing_spends_the_budget_without_exclusion),
        cmocka_unit_test(test_all_members_failing_together_blames_nobody),
        cmocka_unit_test(test_rank0_done_ends_the_job_after_a_grace),
        cmocka_unit_test(test_rank0_done_with_a_failure_or_a_loss),
        cmocka_unit_test(test_rank0_done_in_a_ps_job_or_restart_mode_waits_for_the_others),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

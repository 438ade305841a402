/* jobserver.c: the job server of one job. A replica campaigns for `jobs/<job>/leader`; the
 * leader passes over the job (publisher.c: snapshot, decide, publish, fenced by its term) whenever an
 * event under the job can change a decision or reconcile asked to be woken. Its loop never waits
 * for etcd: each campaign attempt, each opening of the watch and each pass is a work
 * (edl/work.h) on the server's etcd worker, one at a time; while one is on its way the loop
 * answers signals and /metrics, and js->job belongs to the worker. The loop is edl/loop.h's:
 * each fd and the due work registered once (loop_open). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "edl/http.h"
#include "edl/job.h"
#include "edl/etcd.h"
#include "edl/log.h"
#include "edl/loop.h"
#include "edl/metrics.h"
#include "edl/work.h"
#include "publisher.h"
#include "jobserver.h"

#define LOG "jobserver"

typedef struct jobserver {
    const js_config *cfg;
    edl_loop *loop;
    bool stop;
    int exit_code;
    edl_etcd *c;                    /* the worker's: every request runs there */
    edl_worker *worker;
    bool busy;                      /* a work is on its way: js->job, keeper, lease are its
                                     * (the loop still polls the keeper while leading: a pass
                                     * never replaces it, only a campaign does) */
    js_publisher job;               /* the job's etcd side (publisher.c) */
    js_job_counters m;              /* job.m as of the last pass: what /metrics shows */
    int64_t lease;
    edl_lease_keeper *keeper;
    bool keeper_dead;               /* the lease is gone: the next campaign drops the keeper */
    edl_metrics_server *metrics; /* /metrics and /healthz (NULL: off) */
    bool leading;
    int64_t terms;
    int64_t next_try_ms;            /* the next campaign attempt (back-off) */
    int lease_failures;             /* in a row: the back-off's attempt */
    edl_watch *w;                   /* leading: the job's keys (NULL: none, see watch_due) */
    bool watch_due;                 /* leading without a watch: open one */
    bool dirty;                     /* leading: an event may change a decision: pass */
    int64_t wake;                   /* leading: pass then even without events (0: none) */
    int final_state;
} jobserver;

/* ---- /metrics (Prometheus text format 0.0.4) ----------------------------------------------- */

static void write_metrics(void *arg, edl_prom *p)
{
    const jobserver *js = arg;
    const char *labels[] = {"job", js->cfg->job, "id", js->cfg->id, NULL};
    p->labels = labels;
    edl_prom_metric(p, "edl_jobserver_leader", "gauge", "1 while this replica leads the job.",
                    js->leading);
    edl_prom_metric(p, "edl_jobserver_generation", "gauge",
                    "Generation last read or published (0: none).", js->m.generation);
    edl_prom_metric(p, "edl_jobserver_members", "gauge", "Members of that generation.",
                    js->m.members);
    edl_prom_metric(p, "edl_jobserver_servers", "gauge",
                    "Parameter servers of that generation.", js->m.servers);
    edl_prom_metric(p, "edl_jobserver_restarts", "gauge",
                    "Generations started because of trainer failures.", js->m.restarts);
    edl_prom_family(p, "edl_jobserver_restarts_left", "gauge",
                    "Restarts the job's budget (spec max_restarts) still allows.");
    if (js->m.max_restarts >= 0)
        edl_prom_sample(p, "edl_jobserver_restarts_left", NULL, NULL,
                        js->m.max_restarts > js->m.restarts ? js->m.max_restarts - js->m.restarts
                                                            : 0);
    edl_prom_family(p, "edl_jobserver_generations_total", "counter",
                    "New generations this replica published, by cause: failure (a restart "
                    "after trainer failures) or membership (joins, leaves, scales).");
    edl_prom_sample(p, "edl_jobserver_generations_total", "reason", "failure",
                    js->m.gens_failure);
    edl_prom_sample(p, "edl_jobserver_generations_total", "reason", "membership",
                    js->m.gens_membership);
    bool ckpt = js->m.ckpt_step >= 0;
    edl_prom_family(p, "edl_jobserver_checkpoint_step", "gauge",
                    "Step of the job's newest committed checkpoint (absent: none).");
    if (ckpt)
        edl_prom_sample(p, "edl_jobserver_checkpoint_step", NULL, NULL, js->m.ckpt_step);
    edl_prom_family(p, "edl_jobserver_checkpoint_timestamp_seconds", "gauge",
                    "When this replica first read that checkpoint, Unix time (absent: none).");
    if (ckpt)
        edl_prom_sample(p, "edl_jobserver_checkpoint_timestamp_seconds", NULL, NULL,
                        js->m.ckpt_seen_ms / 1000);
    edl_prom_metric(p, "edl_jobserver_publications_total", "counter",
                    "Publications by this replica.", js->m.publications);
    edl_prom_metric(p, "edl_jobserver_etcd_errors_total", "counter",
                    "Failed reads and publications.", js->m.etcd_errors);
    edl_prom_metric(p, "edl_jobserver_leader_terms_total", "counter",
                    "Times this replica became leader.", js->terms);
    edl_prom_family(p, "edl_jobserver_job_state", "gauge", "1 for the job's state.");
    for (int st = EDL_JOB_WAITING; st <= EDL_JOB_STOPPED; st++)
        edl_prom_sample(p, "edl_jobserver_job_state", "state",
                        edl_job_state_name((edl_job_state)st), js->m.state == st);
    p->labels = NULL;
}

static void on_signal(edl_loop *l, int sig, void *arg)
{
    (void)l;
    jobserver *js = arg;
    EDL_INFO(LOG, "signal %d: stepping down and exiting", sig);
    js->stop = true;
}

/* ---- the works (on the worker) and their answers (on the loop) ---------------------------- */

typedef struct js_work {
    edl_work w;
    jobserver *js;
    int rc;
    int64_t wake;
    int final_state;
    bool no_lease;                  /* a campaign's grant or keeper failed */
    edl_watch *watch;
    char err[300];
} js_work;

static void start_work(jobserver *js, void (*run)(edl_work *), void (*done)(edl_work *))
{
    js_work *jw = calloc(1, sizeof *jw);
    if (!jw)
        return; /* out of memory: tried again after the next wake-up */
    *jw = (js_work){.w = {run, done}, .js = js};
    if (edl_worker_submit(js->worker, &jw->w) != 0) {
        free(jw);
        return;
    }
    js->busy = true;
}

/* One attempt: a lease (and its keeper) when there is none, then up to 500 ms of campaign. */
static void campaign_run(edl_work *w)
{
    js_work *jw = (js_work *)w;
    jobserver *js = jw->js;
    if (js->keeper && (js->keeper_dead || edl_lease_keeper_status(js->keeper))) {
        edl_lease_keeper_close(js->keeper, false);
        js->keeper = NULL;
    }
    js->keeper_dead = false;
    js_memory_clear(&js->job.mem); /* a later term starts its windows afresh */
    if (!js->keeper) {
        jw->rc = edl_etcd_lease_grant(js->c, js->cfg->ttl_s, 0, &js->lease, NULL);
        if (!jw->rc)
            jw->rc = edl_lease_keeper_open(js->c, js->lease, js->cfg->ttl_s, NULL, NULL,
                                           &js->keeper);
        if (jw->rc) {
            jw->no_lease = true;
            js->job.m.etcd_errors++;
        }
    }
    if (!jw->no_lease) {
        edl_leader_clear(&js->job.leader);
        jw->rc = edl_election_campaign(js->c, edl_str(js->job.k.leader), edl_str(js->cfg->id),
                                       js->lease, 500, &js->job.leader);
        if (jw->rc == EDL_ELEASE)
            js->keeper_dead = true;
    }
    snprintf(jw->err, sizeof jw->err, "%s", edl_etcd_errmsg(js->c)); /* read on the loop */
}

static void campaign_done(edl_work *w)
{
    js_work *jw = (js_work *)w;
    jobserver *js = jw->js;
    js->busy = false;
    js->m = js->job.m;
    int rc = jw->rc;
    int64_t now = edl_monotonic_ms();
    if (rc == 0) {
        js->leading = true;
        js->terms++;
        js->lease_failures = 0;
        js->watch_due = true;
        js->dirty = true;
        js->wake = 0;
        EDL_INFO(LOG, "job %s: %s leads (lease %llx)", js->cfg->job, js->cfg->id,
                 (unsigned long long)js->lease);
    } else if (rc == EDL_EAUTH) { /* retrying will not change the answer */
        EDL_ERROR(LOG, "%s; %s", jw->err, edl_etcd_advice(rc));
        js->exit_code = EDL_EXIT_UNREACHABLE;
        js->stop = true;
    } else if (jw->no_lease) {
        EDL_WARN(LOG, "cannot reach etcd for a lease: %s (%s); retrying (check --etcd "
                 "and, for https, --cacert, --cert and --key)", edl_strerror(rc), jw->err);
        js->next_try_ms = now + edl_http_backoff_ms(js->lease_failures++, 200, 3000, -1);
    } else if (rc != EDL_ETIMEDOUT && rc != EDL_ELEASE) {
        EDL_WARN(LOG, "campaign failed: %s (%s); retrying", edl_strerror(rc), jw->err);
        js->next_try_ms = now + 300;
    }
    free(jw);
}

static void watch_run(edl_work *w)
{
    js_work *jw = (js_work *)w;
    edl_watch_opts wo = {.prefix = true};
    jw->rc = edl_watch_open(jw->js->c, edl_str(jw->js->job.k.job), &wo, &jw->watch);
}

static void watch_done(edl_work *w)
{
    js_work *jw = (js_work *)w;
    jobserver *js = jw->js;
    js->busy = false;
    js->watch_due = false;
    if (jw->rc)
        EDL_WARN(LOG, "watching %s failed: %s; polling instead", js->job.k.job,
                 edl_strerror(jw->rc));
    else if (js->leading)
        js->w = jw->watch;
    else
        edl_watch_close(jw->watch);
    js->dirty = true; /* events may have been missed: read everything again */
    free(jw);
}

static void pass_run(edl_work *w)
{
    js_work *jw = (js_work *)w;
    jw->rc = js_publisher_pass(&jw->js->job, &jw->wake, &jw->final_state);
}

/* Also while a pass is on its way (its fenced writes fail): nothing here is the worker's. */
static void lost_leadership(jobserver *js)
{
    EDL_WARN(LOG, "job %s: lost the leadership; campaigning again", js->cfg->job);
    js->leading = false;
    js->keeper_dead = true; /* read by the next campaign only */
    edl_watch_close(js->w); /* wakes its thread: no wait */
    js->w = NULL;
    js->watch_due = false;
}

static void pass_done(edl_work *w)
{
    js_work *jw = (js_work *)w;
    jobserver *js = jw->js;
    js->busy = false;
    js->m = js->job.m;
    js->wake = jw->wake;
    js->final_state = jw->final_state;
    int64_t poll_at = edl_monotonic_ms() + 1000; /* no watch: pass at least once a second */
    if (!js->w && (!js->wake || js->wake > poll_at))
        js->wake = poll_at;
    if (jw->rc == EDL_ELEASE && js->leading)
        lost_leadership(js);
    else if (js->cfg->exit_when_done && jw->final_state >= 0 &&
             edl_job_state_final((edl_job_state)jw->final_state)) {
        js->exit_code = edl_job_exit_code((edl_job_state)jw->final_state);
        js->stop = true;
    }
    free(jw);
}

/* ---- the loop -------------------------------------------------------------------------------- */

/* Not busy: start whatever is due (a campaign attempt, the watch, a pass). */
static void start_due(jobserver *js, int64_t now)
{
    if (!js->leading) {
        if (now >= js->next_try_ms)
            start_work(js, campaign_run, campaign_done);
    } else if (js->watch_due) {
        start_work(js, watch_run, watch_done);
    } else if (js->dirty || (js->wake && now >= js->wake)) {
        js->dirty = false;
        start_work(js, pass_run, pass_done);
    }
}

/* When the next work is due without any event: a campaign's retry, or a pass reconcile
 * asked for (none while a work is on its way: the worker's fd wakes the loop). */
static int64_t work_due(void *arg)
{
    const jobserver *js = arg;
    if (js->busy)
        return 0;
    if (!js->leading)
        return js->next_try_ms > 0 ? js->next_try_ms : 1;
    return js->wake;
}

static void on_work_due(edl_loop *l, void *arg)
{
    (void)l;
    jobserver *js = arg;
    if (!js->busy && !js->stop)
        start_due(js, edl_monotonic_ms());
}

static int keeper_fd(void *arg, int *events)
{
    (void)events;
    const jobserver *js = arg;
    return js->leading && js->keeper ? edl_lease_keeper_fd(js->keeper) : -1;
}

static void on_keeper(edl_loop *l, int fd, int events, void *arg)
{
    (void)l, (void)fd, (void)events;
    jobserver *js = arg;
    if (js->leading && edl_lease_keeper_status(js->keeper))
        lost_leadership(js);
}

/* The watch's events: whether one can change a decision (any event while a pass runs: the
 * publisher is the worker's then). A dead watch is opened again. */
static void watch_events(jobserver *js)
{
    edl_watch_event *ev;
    while (js->w && edl_watch_next(js->w, &ev, 0) == 0) {
        bool dead = ev->type == EDL_WATCH_ERROR;
        js->dirty = js->dirty || js->busy || js_publisher_event_matters(&js->job, ev);
        edl_watch_event_free(ev);
        if (dead) {
            edl_watch_close(js->w);
            js->w = NULL;
            js->watch_due = true;
        }
    }
}

static int watch_fd(void *arg, int *events)
{
    (void)events;
    const jobserver *js = arg;
    return js->w ? edl_watch_fd(js->w) : -1;
}

static void on_watch(edl_loop *l, int fd, int events, void *arg)
{
    (void)l, (void)fd, (void)events;
    watch_events(arg);
}

/* After every wake-up: stop, or start what is due (a pass after an event, the watch). */
static void after_turn(edl_loop *l, void *arg)
{
    jobserver *js = arg;
    if (js->stop)
        edl_loop_stop(l, js->exit_code);
    else if (!js->busy)
        start_due(js, edl_monotonic_ms());
}

/* The signals, the worker, the lease, the watch, /metrics and the due work, on one loop. */
static int loop_open(jobserver *js)
{
    int rc = edl_loop_open(60000, &js->loop);
    rc = rc ? rc : edl_loop_signals(js->loop, EDL_SIGNALS_STOP, on_signal, js);
    rc = rc ? rc : edl_loop_fd_follow(js->loop, keeper_fd, on_keeper, js);
    rc = rc ? rc : edl_loop_fd_follow(js->loop, watch_fd, on_watch, js);
    rc = rc ? rc : edl_loop_timer_follow(js->loop, work_due, on_work_due, js);
    if (!rc)
        edl_loop_after_turn(js->loop, after_turn, js);
    else
        EDL_ERROR(LOG, "cannot set up its loop: %s", edl_strerror(rc));
    return rc;
}

int js_run(const js_config *cfg)
{
    jobserver js = {.cfg = cfg, .exit_code = EDL_EXIT_USAGE, .final_state = -1};
    if (loop_open(&js) != 0)
        goto out;
    int rc = edl_etcd_open(cfg->etcd, &js.c);
    if (rc) {
        EDL_ERROR(LOG, "etcd settings: %s", edl_strerror(rc));
        goto out;
    }
    if (js_publisher_init(&js.job, js.c, cfg->prefix, cfg->job, cfg->id) != 0)
        goto out;
    js.m = js.job.m;
    if ((rc = edl_worker_open(&js.worker)) != 0 || (rc = edl_loop_worker(js.loop, js.worker))) {
        EDL_ERROR(LOG, "cannot start its etcd worker: %s", edl_strerror(rc));
        goto out;
    }
    if (cfg->metrics_port != 0) {
        edl_metrics_opts mo = {.addr = cfg->metrics_addr,
                               .port = edl_metrics_listen_port(cfg->metrics_port)};
        int hrc = edl_metrics_open(&mo, write_metrics, &js, &js.metrics);
        hrc = hrc ? hrc : edl_metrics_attach(js.metrics, js.loop);
        if (hrc) {
            EDL_ERROR(LOG, "cannot serve /metrics on %s port %d: %s", cfg->metrics_addr ?
                      cfg->metrics_addr : "0.0.0.0", mo.port, edl_strerror(hrc));
            goto out;
        }
        if (cfg->metrics_port == EDL_METRICS_PORT_AUTO)
            EDL_INFO(LOG, "job %s: /metrics at http://%s:%d/metrics", cfg->job,
                     cfg->metrics_addr ? cfg->metrics_addr : "0.0.0.0",
                     edl_metrics_port(js.metrics));
    }
    js.exit_code = EDL_EXIT_SUCCEEDED;
    start_due(&js, edl_monotonic_ms());
    if (edl_loop_run(js.loop) == EDL_EIO)
        js.exit_code = EDL_EXIT_FAILED;
    edl_worker_close(js.worker); /* the work on its way ends (bounded by its requests) */
    js.worker = NULL;
    edl_watch_close(js.w);
    if (js.leading && js.job.leader.kv && js.keeper && !edl_lease_keeper_status(js.keeper))
        edl_election_resign(js.c, &js.job.leader);
    if (js.keeper)
        edl_lease_keeper_close(js.keeper, true); /* a standby takes over at once */
out:
    edl_worker_close(js.worker);
    edl_metrics_close(js.metrics);
    js_publisher_clear(&js.job);
    edl_etcd_close(js.c);
    edl_loop_free(js.loop);
    return js.exit_code;
}

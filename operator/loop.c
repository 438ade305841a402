/* operator/loop.c: the operator's event loop. It campaigns on a coordination.k8s.io Lease; the
 * leader lists and watches TrainingJobs and their pods (informers: a cache each) and every
 * job's keys in etcd, marks the jobs an event concerns, and reconciles each marked job
 * (pass.c): level-triggered, from the caches and a fresh etcd snapshot, so any pass
 * may run again after a crash, a restart or a takeover without doing anything twice. Jobs are
 * kept in a table keyed by namespace/name; no other state is global.
 *
 * The loop never waits on the API server or etcd: the passes over the marked jobs (and the
 * etcd lease and watch they need) run as one round, a work (edl/work.h) on the operator's
 * worker, one round at a time. Meanwhile the loop answers signals and /metrics and leaves the
 * informers' and the watch's events queued: the round owns the caches and the jobs until its
 * answer comes back. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "edl/log.h"
#include "edl/loop.h"
#include "edl/metrics.h"
#include "internal.h"

#define LOG "operator"

/* ---- the job table ----------------------------------------------------------------------- */

op_job *op_job_find(op *o, const char *ns, const char *name, bool create)
{
    for (size_t i = 0; i < o->n_jobs; i++)
        if (strcmp(o->jobs[i]->ns, ns) == 0 && strcmp(o->jobs[i]->name, name) == 0)
            return o->jobs[i];
    if (!create)
        return NULL;
    if (o->n_jobs == o->cap_jobs) {
        size_t cap = o->cap_jobs ? o->cap_jobs * 2 : 64;
        op_job **n = realloc(o->jobs, cap * sizeof *n);
        if (!n)
            return NULL;
        o->jobs = n;
        o->cap_jobs = cap;
    }
    op_job *j = calloc(1, sizeof *j);
    if (!j || !(j->ns = strdup(ns)) || !(j->name = strdup(name)) ||
        !(j->etcd_name = op_etcd_job_name(ns, name)) ||
        !(j->selector = op_selector(name)) ||
        js_publisher_init(&j->etcd, o->c, o->cfg->prefix, j->etcd_name, o->cfg->id) != 0) {
        if (j) {
            free(j->ns);
            free(j->name);
            free(j->etcd_name);
            free(j->selector);
        }
        free(j);
        return NULL;
    }
    o->jobs[o->n_jobs++] = j;
    return j;
}

static op_job *job_by_etcd_name(op *o, const char *etcd_name, size_t len)
{
    for (size_t i = 0; i < o->n_jobs; i++)
        if (strlen(o->jobs[i]->etcd_name) == len && memcmp(o->jobs[i]->etcd_name, etcd_name, len) == 0)
            return o->jobs[i];
    return NULL;
}

void op_job_drop(op *o, op_job *j)
{
    for (size_t i = 0; i < o->n_jobs; i++) {
        if (o->jobs[i] != j)
            continue;
        o->jobs[i] = o->jobs[--o->n_jobs];
        break;
    }
    js_publisher_clear(&j->etcd);
    free(j->ns);
    free(j->name);
    free(j->etcd_name);
    free(j->selector);
    free(j->reported_invalid);
    free(j->create_error);
    free(j->reported_error);
    free(j->pg_spec);
    free(j->pg_missing);
    free(j);
}

/* ---- events from the informers and from etcd --------------------------------------------- */

static void drain_jobs(op *o)
{
    edl_k8s_event ev;
    while (edl_k8s_informer_next(o->tjs, &ev, 0) == 0) {
        if (ev.type == EDL_K8S_SYNCED) {
            for (size_t i = 0; i < o->n_jobs; i++)
                o->jobs[i]->dirty = true;
            continue;
        }
        op_job *j = op_job_find(o, ev.ns ? ev.ns : "default", ev.name, ev.type != EDL_K8S_DELETED);
        if (j)
            j->dirty = true;
    }
}

static void drain_pods(op *o)
{
    edl_k8s_event ev;
    while (edl_k8s_informer_next(o->pods, &ev, 0) == 0) {
        if (ev.type == EDL_K8S_SYNCED)
            continue;
        const char *job = op_label(ev.object, EDL_TJ_LABEL_JOB);
        op_job *j = job && ev.ns ? op_job_find(o, ev.ns, job, false) : NULL;
        if (j)
            j->dirty = true;
    }
}

/* "<prefix>/jobs/<etcd name>/..." → the job; events that cannot change a decision are skipped. */
static void drain_etcd(op *o)
{
    edl_watch_event *ev;
    size_t plen = strlen(o->jobs_prefix);
    while (o->w && edl_watch_next(o->w, &ev, 0) == 0) {
        if (ev->type == EDL_WATCH_ERROR) {
            edl_watch_event_free(ev);
            edl_watch_close(o->w);
            o->w = NULL;
            for (size_t i = 0; i < o->n_jobs; i++)
                o->jobs[i]->dirty = true; /* events may have been missed */
            break;
        }
        if ((ev->type == EDL_WATCH_PUT || ev->type == EDL_WATCH_DELETE) &&
            ev->kv.key_len > plen && memcmp(ev->kv.key, o->jobs_prefix, plen) == 0) {
            const char *name = ev->kv.key + plen;
            const char *slash = memchr(name, '/', ev->kv.key_len - plen);
            op_job *j = slash ? job_by_etcd_name(o, name, (size_t)(slash - name)) : NULL;
            if (j && js_publisher_event_matters(&j->etcd, ev))
                j->dirty = true;
        }
        edl_watch_event_free(ev);
    }
}

/* ---- etcd: one lease for every job's term, one watch over every job ---------------------- */

/* The lease is gone or missing, or the watch: the next round sees to them first. */
static bool etcd_due(op *o)
{
    return !o->keeper || edl_lease_keeper_status(o->keeper) != 0 || !o->w;
}

/* On the worker, in a round. */
static int etcd_ready(op *o)
{
    if (o->keeper && edl_lease_keeper_status(o->keeper) != 0) {
        EDL_WARN(LOG, "our etcd lease expired: every job's term with it");
        edl_lease_keeper_close(o->keeper, false);
        o->keeper = NULL;
        for (size_t i = 0; i < o->n_jobs; i++)
            edl_leader_clear(&o->jobs[i]->etcd.leader);
    }
    if (!o->keeper) {
        int rc = edl_etcd_lease_grant(o->c, o->cfg->ttl_s, 0, &o->lease, NULL);
        if (!rc)
            rc = edl_lease_keeper_open(o->c, o->lease, o->cfg->ttl_s, NULL, NULL, &o->keeper);
        if (rc) {
            EDL_WARN(LOG, "etcd: no lease: %s (%s); retrying", edl_strerror(rc),
                     edl_etcd_errmsg(o->c));
            return rc;
        }
    }
    if (!o->w) {
        edl_watch_opts wo = {.prefix = true};
        if (edl_watch_open(o->c, edl_str(o->jobs_prefix), &wo, &o->w) != 0)
            o->w = NULL; /* passes still run on the informers' events and on wake times */
    }
    return 0;
}

/* ---- metrics (Prometheus text format) ---------------------------------------------------- */

static void write_metrics(void *arg, edl_prom *p)
{
    const op *o = arg;
    edl_k8s_stats ks;
    edl_k8s_get_stats(o->k, &ks);
    const char *labels[] = {"id", o->cfg->id, NULL};
    p->labels = labels;
    edl_k8s_elector_stats es = {0};
    if (o->elector)
        edl_k8s_elector_get_stats(o->elector, &es);
    edl_prom_metric(p, "edl_operator_leader", "gauge", "1 while this replica leads.",
                    edl_k8s_elector_leading(o->elector));
    edl_prom_metric(p, "edl_operator_lease_renewals_total", "counter",
                    "Renewals of the leader's Lease.", es.renewals);
    edl_prom_metric(p, "edl_operator_lease_renewals_late_total", "counter",
                    "Renewals more than two retry periods after the one before.",
                    es.late_renewals);
    const op_counters *m = &o->shown; /* as of the last round: a round may be on its way */
    edl_prom_metric(p, "edl_operator_jobs", "gauge", "TrainingJobs known.",
                    (int64_t)o->shown_jobs);
    edl_prom_metric(p, "edl_operator_reconciles_total", "counter", "Job passes.", m->reconciles);
    edl_prom_metric(p, "edl_operator_pods_created_total", "counter", "Pods created.",
                    m->pods_created);
    edl_prom_metric(p, "edl_operator_pods_deleted_total", "counter", "Pods deleted.",
                    m->pods_deleted);
    edl_prom_metric(p, "edl_operator_status_writes_total", "counter",
                    "TrainingJob status updates.", m->status_writes);
    edl_prom_metric(p, "edl_operator_events_total", "counter", "Events posted.", m->events);
    edl_prom_metric(p, "edl_operator_api_errors_total", "counter",
                    "Kubernetes API calls that failed.", m->api_errors);
    edl_prom_metric(p, "edl_operator_api_requests_total", "counter",
                    "Kubernetes API requests, retries included.", ks.requests);
    p->labels = NULL;
}

/* ---- the loop ---------------------------------------------------------------------------- */

static void on_signal(edl_loop *l, int sig, void *arg)
{
    (void)l;
    EDL_INFO(LOG, "signal %d: stepping down and exiting", sig);
    ((op *)arg)->stop = true;
}

/* The informers', the watch's and the lease keeper's fds, while no round owns them (a round on
 * its way leaves their events queued; its answer comes through the worker's fd). Their events
 * are read after the turn (lead_turn). */
static int tjs_fd(void *arg, int *events)
{
    (void)events;
    op *o = arg;
    return !o->busy && o->tjs ? edl_k8s_informer_fd(o->tjs) : -1;
}

static int pods_fd(void *arg, int *events)
{
    (void)events;
    op *o = arg;
    return !o->busy && o->pods ? edl_k8s_informer_fd(o->pods) : -1;
}

static int watch_fd(void *arg, int *events)
{
    (void)events;
    op *o = arg;
    return !o->busy && o->w ? edl_watch_fd(o->w) : -1;
}

static int keeper_fd(void *arg, int *events)
{
    (void)events;
    op *o = arg;
    return !o->busy && o->keeper ? edl_lease_keeper_fd(o->keeper) : -1;
}

static void read_after_turn(edl_loop *l, int fd, int events, void *arg)
{
    (void)l, (void)fd, (void)events, (void)arg;
}

static void on_elector(edl_loop *l, int fd, int events, void *arg)
{
    (void)l, (void)events, (void)arg;
    uint64_t changes;
    if (read(fd, &changes, sizeof changes) < 0)
        EDL_DEBUG(LOG, "elector fd: %s", strerror(errno));
}

/* Never sleep past the moment our leadership runs out without a renewal. */
static int64_t leadership_due(void *arg)
{
    int64_t valid = edl_k8s_elector_valid_ms(((op *)arg)->elector);
    return valid > 0 ? edl_monotonic_ms() + valid + 1 : 0;
}

static void wake_only(edl_loop *l, void *arg)
{
    (void)l, (void)arg; /* the turn's end looks at what changed */
}

/* What the operator reads of a pod (of its containers, how each ended: whether the agent's
 * died); the rest (the spec: most of a pod) is not kept. */
static const char *const POD_FIELDS[] = {"apiVersion", "kind", "metadata.name",
                                         "metadata.namespace", "metadata.uid",
                                         "metadata.resourceVersion", "metadata.labels",
                                         "metadata.deletionTimestamp", "status.phase",
                                         "status.reason", "status.containerStatuses.name",
                                         "status.containerStatuses.state.terminated.exitCode",
                                         "status.conditions.type", "status.conditions.status",
                                         NULL};

static int start_leading(op *o)
{
    char *tj_path = edl_k8s_path(EDL_TJ_GROUP, EDL_TJ_VERSION, o->cfg->ns, EDL_TJ_PLURAL, NULL,
                                 NULL);
    char *pod_path = edl_k8s_path(NULL, "v1", o->cfg->ns, "pods", NULL, NULL);
    int rc = tj_path && pod_path ? 0 : EDL_ENOMEM;
    if (!rc)
        rc = edl_k8s_informer_open(o->k, tj_path, NULL, &o->tjs);
    if (!rc)
        rc = edl_k8s_informer_open_trimmed(o->k, pod_path, EDL_TJ_LABEL_JOB, POD_FIELDS,
                                           &o->pods);
    free(tj_path);
    free(pod_path);
    return rc;
}

/* Mark the jobs whose wake time has come; the next wake time (0: none). */
static int64_t pass_due(op *o)
{
    int64_t now = edl_monotonic_ms(), next = 0;
    for (size_t i = 0; i < o->n_jobs; i++) {
        op_job *j = o->jobs[i];
        if (j->wake_ms && j->wake_ms <= now)
            j->dirty = true;
        else if (j->wake_ms && (!next || j->wake_ms < next))
            next = j->wake_ms;
    }
    return next;
}

/* One line when the caches first hold everything, and one when each job has had its pass. */
static void report_start(op *o, int64_t since, bool *synced, bool *passed)
{
    if (!*synced) {
        const cJSON *one[1];
        size_t pods = edl_k8s_informer_list(o->pods, one, 0);
        EDL_INFO(LOG, "listed %zu TrainingJobs and %zu pods in %lld ms", o->n_jobs, pods,
                 (long long)(edl_monotonic_ms() - since));
        *synced = true;
        return;
    }
    for (size_t i = 0; i < o->n_jobs; i++)
        if (o->jobs[i]->dirty)
            return;
    EDL_INFO(LOG, "every job passed once, %lld ms after taking the lead",
             (long long)(edl_monotonic_ms() - since));
    *passed = true;
}

/* ---- the round: on the worker, etcd's lease and watch when due, then every marked job ----- */

typedef struct op_round {
    edl_work w;
    op *o;
    bool etcd;                /* see to etcd's lease and watch first */
    int etcd_rc;
} op_round;

static void round_run(edl_work *w)
{
    op_round *r = (op_round *)w;
    if (r->etcd)
        r->etcd_rc = etcd_ready(r->o);
    op_reconcile_dirty(r->o);
}

static void show_counters(op *o)
{
    o->shown = o->m;
    o->shown_jobs = o->n_jobs;
}

static void round_done(edl_work *w)
{
    op_round *r = (op_round *)w;
    op *o = r->o;
    o->busy = false;
    if (r->etcd && r->etcd_rc)
        o->etcd_retry_ms = edl_monotonic_ms() + 1000;
    show_counters(o);
    free(r);
}

/* Not busy: start a round when a job is marked (once the caches are full: until then passes
 * wait for their events) or etcd's lease or watch is due. */
static void start_round(op *o, bool ready)
{
    bool any_dirty = false;
    for (size_t i = 0; ready && i < o->n_jobs && !any_dirty; i++)
        any_dirty = o->jobs[i]->dirty;
    bool etcd = edl_monotonic_ms() >= o->etcd_retry_ms && etcd_due(o);
    if (!any_dirty && !etcd)
        return;
    op_round *r = calloc(1, sizeof *r);
    if (!r)
        return; /* out of memory: tried again after the next wake-up */
    *r = (op_round){.w = {round_run, round_done}, .o = o, .etcd = etcd};
    if (edl_worker_submit(o->worker, &r->w) != 0) {
        free(r);
        return;
    }
    o->busy = true;
}

/* When the loop must wake though nothing happens: a job's wake time or etcd's retry (none while
 * a round is on its way: its answer wakes the loop). */
static int64_t idle_due(void *arg)
{
    op *o = arg;
    if (o->busy)
        return 0;
    int64_t next = pass_due(o), now = edl_monotonic_ms();
    if (o->etcd_retry_ms > now && (!next || o->etcd_retry_ms < next))
        next = o->etcd_retry_ms;
    return next;
}

/* The leader's state between turns: when it took the lead, what it reported of its start. */
typedef struct leader {
    op *o;
    int64_t since;
    bool synced, passed;
} leader;

/* Between turns, while no round is on its way: read the events, mark the jobs they concern
 * (and those whose wake time came) and start a round over them. */
static void lead_turn(edl_loop *l, void *arg)
{
    leader *ld = arg;
    op *o = ld->o;
    if (o->stop || !edl_k8s_elector_leading(o->elector)) {
        edl_loop_stop(l, 0);
        return;
    }
    if (o->busy)
        return;
    if (ld->synced && !ld->passed) /* (the caches stay synced once they are) */
        report_start(o, ld->since, &ld->synced, &ld->passed); /* before new events mark jobs */
    drain_jobs(o);
    drain_pods(o);
    drain_etcd(o);
    pass_due(o);
    bool ready = edl_k8s_informer_synced(o->tjs) && edl_k8s_informer_synced(o->pods);
    if (ready && !ld->synced)
        report_start(o, ld->since, &ld->synced, &ld->passed);
    show_counters(o);
    start_round(o, ready);
}

static void lead(op *o)
{
    leader ld = {.o = o, .since = edl_monotonic_ms()};
    int rc = edl_loop_fd_follow(o->loop, tjs_fd, read_after_turn, o);
    rc = rc ? rc : edl_loop_fd_follow(o->loop, pods_fd, read_after_turn, o);
    rc = rc ? rc : edl_loop_fd_follow(o->loop, watch_fd, read_after_turn, o);
    rc = rc ? rc : edl_loop_fd_follow(o->loop, keeper_fd, read_after_turn, o);
    rc = rc ? rc : edl_loop_timer_follow(o->loop, idle_due, wake_only, o);
    if (rc) {
        EDL_ERROR(LOG, "cannot set up its loop: %s", edl_strerror(rc));
        return;
    }
    edl_loop_after_turn(o->loop, lead_turn, &ld);
    lead_turn(o->loop, &ld);
    edl_loop_run(o->loop);
}

/* Standing by: until a signal or the Lease is ours. */
static void standby_turn(edl_loop *l, void *arg)
{
    op *o = arg;
    if (o->stop || edl_k8s_elector_leading(o->elector))
        edl_loop_stop(l, 0);
}

static void stand_by(op *o)
{
    edl_loop_after_turn(o->loop, standby_turn, o);
    standby_turn(o->loop, o);
    edl_loop_run(o->loop);
}

/* The loop and what it waits on in every role: the signals, the worker (the rounds' answers),
 * the elector's changes, /metrics, and the end of our leadership. */
static int loop_open(op *o)
{
    int rc = edl_loop_open(60000, &o->loop);
    rc = rc ? rc : edl_loop_signals(o->loop, EDL_SIGNALS_STOP, on_signal, o);
    rc = rc ? rc : edl_loop_worker(o->loop, o->worker);
    rc = rc ? rc : edl_loop_fd_add(o->loop, edl_k8s_elector_fd(o->elector), EDL_LOOP_READ,
                                   on_elector, o);
    rc = rc ? rc : edl_loop_timer_follow(o->loop, leadership_due, wake_only, o);
    if (!rc && o->metrics)
        rc = edl_metrics_attach(o->metrics, o->loop);
    if (rc)
        EDL_ERROR(LOG, "cannot set up its loop: %s", edl_strerror(rc));
    return rc;
}

static int op_open(op *o)
{
    int rc = edl_k8s_open(o->cfg->k8s, &o->k);
    if (rc) {
        EDL_ERROR(LOG, "Kubernetes client: %s", edl_strerror(rc));
        return rc;
    }
    if ((rc = edl_worker_open(&o->worker)) != 0) {
        EDL_ERROR(LOG, "cannot start its worker: %s", edl_strerror(rc));
        return rc;
    }
    if ((rc = edl_etcd_open(o->cfg->etcd, &o->c)) != 0) {
        EDL_ERROR(LOG, "etcd settings: %s", edl_strerror(rc));
        return rc;
    }
    char err[512];
    if ((rc = op_etcd_tls_load(&o->etcd_tls, o->cfg->etcd, err, sizeof err)) != 0) {
        EDL_ERROR(LOG, "etcd TLS files for the pods: %s", err);
        return rc;
    }
    edl_job_keys k;
    if (edl_job_keys_init(&k, o->cfg->prefix, "x") != 0)
        return EDL_ENOMEM;
    size_t len = strlen(k.job) - 2; /* "<prefix>/jobs/x/" → "<prefix>/jobs/" */
    o->jobs_prefix = strndup(k.job, len);
    edl_job_keys_clear(&k);
    edl_k8s_elector_opts eo = {.ns = o->cfg->lease_ns, .name = o->cfg->lease_name,
                               .identity = o->cfg->id,
                               .lease_duration_s = o->cfg->lease_duration_s,
                               .renew_deadline_ms = o->cfg->renew_deadline_ms,
                               .retry_period_ms = o->cfg->retry_period_ms};
    o->pod_etcd_endpoints = o->cfg->pod_etcd_endpoints ? strdup(o->cfg->pod_etcd_endpoints)
                                                       : edl_etcd_config_endpoints(o->cfg->etcd);
    if (!o->jobs_prefix || !o->pod_etcd_endpoints ||
        (rc = edl_k8s_elector_start(o->cfg->k8s, &eo, &o->elector)) != 0)
        return rc ? rc : EDL_ENOMEM;
    edl_k8s_elector_fence(o->elector, o->k); /* no write of ours once we do not lead */
    if (o->cfg->metrics_port > 0) {
        edl_metrics_opts mo = {.addr = o->cfg->metrics_addr, .port = o->cfg->metrics_port};
        if ((rc = edl_metrics_open(&mo, write_metrics, o, &o->metrics)) != 0) {
            EDL_ERROR(LOG, "cannot serve /metrics on port %d: %s", o->cfg->metrics_port,
                      edl_strerror(rc));
            return rc;
        }
    }
    return 0;
}

static void op_close(op *o)
{
    edl_worker_close(o->worker); /* the round on its way ends first (bounded by its requests) */
    while (o->n_jobs)
        op_job_drop(o, o->jobs[0]);
    free(o->jobs);
    edl_k8s_informer_close(o->tjs);
    edl_k8s_informer_close(o->pods);
    if (o->w)
        edl_watch_close(o->w);
    if (o->keeper)
        edl_lease_keeper_close(o->keeper, true); /* our terms end now: a standby goes on */
    if (o->elector) {
        edl_k8s_elector_release(o->elector); /* when we lead: a standby goes on at once */
        edl_k8s_elector_close(o->elector);
    }
    edl_metrics_close(o->metrics);
    edl_loop_free(o->loop);
    edl_etcd_close(o->c);
    edl_k8s_close(o->k);
    free(o->jobs_prefix);
    free(o->pod_etcd_endpoints);
    op_etcd_tls_clear(&o->etcd_tls);
}

int op_run(const op_config *cfg)
{
    op o = {.cfg = cfg};
    int exit_code = EDL_EXIT_USAGE;
    if (op_open(&o) != 0 || loop_open(&o) != 0)
        goto out;
    EDL_INFO(LOG, "operator %s serving TrainingJobs of %s on %s; standing by for the Lease "
             "%s/%s", cfg->id, cfg->ns ? cfg->ns : "every namespace", edl_k8s_server(o.k),
             cfg->lease_ns, cfg->lease_name);
    stand_by(&o);
    exit_code = EDL_EXIT_SUCCEEDED;
    if (o.stop)
        goto out;
    EDL_INFO(LOG, "%s leads the operator (Lease %s/%s)", cfg->id, cfg->lease_ns, cfg->lease_name);
    if (start_leading(&o) != 0) {
        EDL_ERROR(LOG, "cannot watch TrainingJobs and pods");
        exit_code = EDL_EXIT_FAILED;
        goto out;
    }
    lead(&o);
    if (!o.stop) {
        EDL_ERROR(LOG, "lost the leadership (Lease %s/%s): exiting so that a fresh replica "
                  "stands by", cfg->lease_ns, cfg->lease_name);
        exit_code = EDL_EXIT_FAILED;
    }
out:
    op_close(&o);
    return exit_code;
}

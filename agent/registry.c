/* registry.c: the agent's etcd side: its lease, the pod and status keys under it, and the
 * watch on the published generation. No call to etcd runs on the loop: each request is a work
 * (edl/work.h) that the agent's etcd worker runs on its own connection, and its result comes
 * back to the loop (the done functions here), so signals, /metrics and the hang check never
 * wait for etcd. One request of a kind is in flight at a time (the *_busy flags); a failure is
 * retried from the loop: etcd being away never stops a trainer; only a lost lease does
 * (agent.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "edl/http.h"
#include "edl/log.h"
#include "edl/net.h"

/* One request to etcd: what run needs (copied from the agent when submitted), what it found.
 * Only done, on the loop, reads or changes the agent. */
typedef struct reg_work {
    edl_work w;
    agent *a;
    edl_etcd *etcd;             /* the worker's connection */
    char *key, *key2, *doc, *doc2; /* owned */
    int64_t lease, ttl_s, gen, rev, old_lease;
    int port, fallback_port, rank;
    unsigned status_seq;        /* a->status_seq when submitted */
    edl_lease_keeper *keeper;
    edl_watch *watch;
    edl_kv *kv;
    int (*call)(edl_etcd *, void *); /* registry_call's */
    void (*call_done)(agent *, void *, int, const char *);
    void *arg;
    const char *what;           /* the failed step ("lease grant"), or NULL */
    int rc;
    char err[300];              /* the connection's message for what */
} reg_work;

static reg_work *work_new(agent *a, void (*run)(edl_work *), void (*done)(edl_work *))
{
    reg_work *r = calloc(1, sizeof *r);
    if (r) {
        r->w = (edl_work){run, done};
        r->a = a;
        r->etcd = a->etcd;
    }
    return r;
}

static void work_free(reg_work *r)
{
    free(r->key);
    free(r->key2);
    free(r->doc);
    free(r->doc2);
    edl_kv_free(r->kv);
    free(r);
}

/* Queue r on the agent's worker: false (r freed) when it could not be. */
static bool submit(agent *a, reg_work *r)
{
    int rc = edl_worker_submit(a->worker, &r->w);
    if (rc == 0)
        return true;
    if (r->keeper) /* a lease to revoke: the worker is closing as the agent exits (the done of a
                    * registration that ended meanwhile), so this thread may wait for etcd */
        edl_lease_keeper_close(r->keeper, rc == EDL_ECLOSED);
    if (rc != EDL_ECLOSED)
        EDL_ERROR("agent", "cannot queue a request to etcd: %s", edl_strerror(rc));
    work_free(r);
    return false;
}

/* On the worker: remember which step failed and why. */
static int step_failed(reg_work *r, int rc, const char *what)
{
    r->rc = rc;
    r->what = what;
    snprintf(r->err, sizeof r->err, "%s", edl_etcd_errmsg(r->etcd));
    return rc;
}

/* On the loop: count and say a failed step. */
static void etcd_failed(agent *a, const reg_work *r)
{
    a->m.etcd_errors++;
    EDL_WARN("agent", "%s: %s", r->what, r->err);
}

/* ---- any other request (teacher.c's service key, agent.c's spec read) ------------------- */

static void call_run(edl_work *w)
{
    reg_work *r = (reg_work *)w;
    int rc = r->call(r->etcd, r->arg);
    if (rc)
        step_failed(r, rc, NULL); /* the caller's done says what failed */
}

static void call_done(edl_work *w)
{
    reg_work *r = (reg_work *)w;
    r->call_done(r->a, r->arg, r->rc, r->err);
    work_free(r);
}

int registry_call(agent *a, int (*call)(edl_etcd *etcd, void *arg),
                  void (*done)(agent *a, void *arg, int rc, const char *err), void *arg)
{
    reg_work *r = work_new(a, call_run, call_done);
    if (!r)
        return EDL_ENOMEM;
    r->call = call;
    r->call_done = done;
    r->arg = arg;
    return submit(a, r) ? 0 : EDL_ENOMEM;
}

/* ---- the generation's master port ---------------------------------------------------------- */

static void master_run(edl_work *w)
{
    reg_work *r = (reg_work *)w;
    int rc;
    if (r->rank == 0) {
        if ((rc = edl_etcd_put(r->etcd, edl_str(r->key), edl_str(r->doc), NULL, NULL)) != 0)
            step_failed(r, rc, "publishing the generation's master port");
        return;
    }
    rc = edl_etcd_get(r->etcd, edl_str(r->key), &r->kv, NULL);
    if (rc) {
        r->rc = rc;
        if (rc != EDL_ENOTFOUND)
            step_failed(r, rc, "reading the generation's master port");
        return;
    }
    char v[16] = "";
    char *end;
    if (r->kv->value_len < sizeof v)
        memcpy(v, r->kv->value, r->kv->value_len);
    long p = strtol(v, &end, 10);
    if (!v[0] || *end || p < 1 || p > 65535) {
        EDL_WARN("agent", "%s holds '%.15s', no port: using rank 0's port", r->key, v);
        p = r->fallback_port;
    }
    r->port = (int)p;
}

static void master_done(edl_work *w)
{
    reg_work *r = (reg_work *)w;
    agent *a = r->a;
    a->master_busy = false;
    if (r->rc == 0) {
        a->master_gen = r->gen;
        a->master_port = r->port;
    } else if (r->what) {
        etcd_failed(a, r);
    }
    work_free(r);
}

/* torchrun gives every round a fresh MASTER_PORT (a port in TIME_WAIT or still held by a dying
 * rank 0 of the last round must not stall the next one). Rank 0's agent picks a free port on
 * its address and publishes it under gen/<n>/master (deleted with the generation); the others
 * read it. Without a free port, rank 0's registered port is used. */
int registry_master_port(agent *a, int rank)
{
    int64_t gen = edl_generation_of_members(&a->generation); /* the workers' rendezvous */
    if (a->master_gen == gen)
        return 0;
    if (a->master_busy)
        return EDL_EBUSY;
    reg_work *r = work_new(a, master_run, master_done);
    if (!r || !(r->key = edl_job_key_gen(&a->keys, gen, EDL_GEN_MASTER))) {
        free(r);
        return EDL_ENOMEM;
    }
    r->gen = gen;
    r->rank = rank;
    r->fallback_port = a->generation.members[0].port;
    if (rank == 0) {
        r->port = edl_free_port(a->o->addr);
        if (!r->port)
            r->port = r->fallback_port;
        if (asprintf(&r->doc, "%d", r->port) < 0) {
            r->doc = NULL;
            work_free(r);
            return EDL_ENOMEM;
        }
    }
    if (!submit(a, r))
        return EDL_ENOMEM;
    a->master_busy = true;
    return EDL_EBUSY;
}

/* ---- registration ------------------------------------------------------------------------ */

static char *pod_json(const agent *a)
{
    edl_pod p = {.role = a->o->role, .addr = a->o->addr, .port = a->o->port,
                 .metrics_port = a->metrics ? edl_metrics_port(a->metrics) : 0,
                 .host = (char *)a->host, .pid = getpid(), .ttl_s = a->ttl_s};
    return edl_pod_to_json(&p);
}

/* edl's jittered back-off: after an etcd outage the agents of a job register again spread
 * over the window, not all at once. reg_attempt counts the attempts since the last success. */
static void schedule_register(agent *a)
{
    a->reg_backoff_ms = edl_http_backoff_ms(a->reg_attempt - 1, 500, 5000, -1);
    a->reg_next_ms = edl_monotonic_ms() + a->reg_backoff_ms;
}

/* On the worker: grant, the pod and status keys under the lease (none for a teacher outside
 * any job: its service key, put under the lease by teacher.c, is all it has), the keeper. A
 * half-made lease is revoked. */
static void register_run(edl_work *w)
{
    reg_work *r = (reg_work *)w;
    int rc = edl_etcd_lease_grant(r->etcd, r->ttl_s, 0, &r->lease, NULL);
    if (rc) {
        step_failed(r, rc, "lease grant");
        r->lease = 0;
        return;
    }
    if (r->key) {
        edl_kv *old = NULL;
        if (edl_etcd_get(r->etcd, edl_str(r->key), &old, NULL) == 0 && old->lease != r->lease)
            r->old_lease = old->lease;
        edl_kv_free(old);
        edl_put_opts po = {.lease = r->lease};
        if ((rc = edl_etcd_put(r->etcd, edl_str(r->key), edl_str(r->doc), &po, NULL)) != 0 ||
            (rc = edl_etcd_put(r->etcd, edl_str(r->key2), edl_str(r->doc2), &po, NULL)) != 0)
            step_failed(r, rc, "registration");
    }
    if (!rc && (rc = edl_lease_keeper_open(r->etcd, r->lease, r->ttl_s, NULL, NULL,
                                          &r->keeper)) != 0)
        r->rc = rc;
    if (rc) {
        if (edl_etcd_lease_revoke(r->etcd, r->lease) != 0)
            EDL_DEBUG("agent", "revoking the half-made lease: %s", edl_etcd_errmsg(r->etcd));
        r->lease = 0;
    }
}

static void unregister_run(edl_work *w)
{
    reg_work *r = (reg_work *)w;
    edl_lease_keeper_close(r->keeper, true);
    r->keeper = NULL;
}

static void unregister_done(edl_work *w)
{
    reg_work *r = (reg_work *)w;
    EDL_INFO("agent", "lease %lld revoked: pod %s left job %s", (long long)r->lease,
             r->a->o->pod, r->a->o->job ? r->a->o->job : "(none)");
    work_free(r);
}

/* Hand a keeper to the worker to stop and revoke its lease there. */
static void revoke_off_loop(agent *a, edl_lease_keeper *keeper, int64_t lease)
{
    reg_work *r = work_new(a, unregister_run, unregister_done);
    if (!r) {
        edl_lease_keeper_close(keeper, false); /* the lease expires by its TTL */
        return;
    }
    r->keeper = keeper;
    r->lease = lease;
    submit(a, r);
}

static void register_done(edl_work *w)
{
    reg_work *r = (reg_work *)w;
    agent *a = r->a;
    a->reg_busy = false;
    if (r->old_lease)
        EDL_WARN("agent", "%s exists under lease %lld (another agent with pod name %s, or this pod "
                 "before a restart): overwriting it", a->k_pod, (long long)r->old_lease, a->o->pod);
    if (r->rc) {
        if (r->what)
            etcd_failed(a, r);
        schedule_register(a);
        EDL_WARN("agent", "registration failed (%s); next attempt in %lld ms", edl_strerror(r->rc),
                 (long long)a->reg_backoff_ms);
    } else if (a->leaving_signal || a->final_exit >= 0) { /* left while it was on its way */
        revoke_off_loop(a, r->keeper, r->lease);
    } else {
        a->keeper = r->keeper;
        a->lease = r->lease;
        a->reg_next_ms = 0;
        a->reg_backoff_ms = 0;
        a->reg_attempt = 0;
        if (a->status_seq == r->status_seq) { /* etcd holds what the loop holds */
            a->status = (edl_pod_status){.state = EDL_TRAINER_WAITING, .step = -1};
            a->status_dirty = false;
        } else { /* a newer status came meanwhile: it goes out next */
            a->status_dirty = true;
            a->status_next_ms = 0;
        }
        a->status_written_ms = edl_monotonic_ms();
        EDL_INFO("agent", "registered %s under lease %lld", a->k_pod ? a->k_pod : a->o->pod,
                 (long long)r->lease);
    }
    work_free(r);
}

int registry_register(agent *a)
{
    if (a->reg_busy || a->keeper)
        return 0;
    a->reg_attempt++;
    EDL_INFO("agent", "registering pod %s of job %s (attempt %d, TTL %llds)", a->o->pod,
             a->o->job ? a->o->job : "(none)", a->reg_attempt, (long long)a->ttl_s);
    edl_pod_status s0 = {.state = EDL_TRAINER_WAITING, .step = -1};
    reg_work *r = work_new(a, register_run, register_done);
    if (!r)
        return EDL_ENOMEM;
    r->ttl_s = a->ttl_s;
    r->status_seq = a->status_seq;
    if (a->k_pod && (!(r->key = strdup(a->k_pod)) || !(r->key2 = strdup(a->k_status)) ||
                     !(r->doc = pod_json(a)) || !(r->doc2 = edl_pod_status_to_json(&s0)))) {
        work_free(r);
        return EDL_ENOMEM;
    }
    if (!submit(a, r))
        return EDL_ENOMEM;
    a->reg_busy = true;
    a->reg_next_ms = 0;
    return 0;
}

void registry_lease_lost(agent *a)
{
    int why = edl_lease_keeper_status(a->keeper);
    EDL_WARN("agent", "lease %lld lost (%s): the job server counts this pod as gone; the trainer "
             "stops and the pod registers again", (long long)a->lease, edl_strerror(why));
    edl_lease_keeper_close(a->keeper, false); /* its thread has ended: no wait */
    a->keeper = NULL;
    a->lease = 0;
    a->m.lease_losses++;
    a->status_dirty = false;
    a->reg_backoff_ms = 0;
    a->reg_next_ms = edl_monotonic_ms(); /* as soon as the trainer is gone */
}

void registry_unregister(agent *a)
{
    if (!a->keeper)
        return;
    revoke_off_loop(a, a->keeper, a->lease);
    a->keeper = NULL;
    a->lease = 0;
}

/* ---- status ------------------------------------------------------------------------------ */

void registry_status_set(agent *a, const edl_pod_status *s)
{
    bool only_step = s->generation == a->status.generation && s->state == a->status.state &&
                     s->pid == a->status.pid && s->exit_code == a->status.exit_code &&
                     s->signal == a->status.signal && s->restarts == a->status.restarts &&
                     s->own_error == a->status.own_error && s->inprocess == a->status.inprocess &&
                     strcmp(s->message, a->status.message) == 0;
    if (only_step && s->step == a->status.step && s->total_steps == a->status.total_steps)
        return; /* a new step or total goes out at most once a second, as below */
    a->status = *s;
    a->status_seq++;
    a->status_dirty = true;
    if (!only_step && !a->status_failures) /* a state change goes out now; steps once a second */
        a->status_next_ms = 0;
    else if (only_step && !a->status_failures && a->status_next_ms == 0)
        a->status_next_ms = a->status_written_ms + 1000;
    registry_status_flush(a);
}

static void status_run(edl_work *w)
{
    reg_work *r = (reg_work *)w;
    edl_put_opts po = {.lease = r->lease};
    int rc = edl_etcd_put(r->etcd, edl_str(r->key), edl_str(r->doc), &po, NULL);
    if (rc)
        step_failed(r, rc, "writing status");
}

static void status_done(edl_work *w)
{
    reg_work *r = (reg_work *)w;
    agent *a = r->a;
    a->status_busy = false;
    int64_t now = edl_monotonic_ms();
    if (r->rc == 0) {
        if (a->status_failures)
            EDL_INFO("agent", "status written again after %d failed attempts", a->status_failures);
        a->status_failures = 0;
        a->status_written_ms = now;
        if (!a->status_dirty)
            a->status_next_ms = 0;
    } else {
        a->status_dirty = true; /* the newest status, whichever it is now, goes out next */
        a->status_failures++;
        a->m.etcd_errors++;
        if (a->status_failures == 1 || a->status_failures % 10 == 0)
            EDL_WARN("agent", "writing status (attempt %d): %s; retrying", a->status_failures,
                     r->err);
        a->status_next_ms = now + edl_http_backoff_ms(a->status_failures, 250, 4000, -1);
    }
    work_free(r);
}

void registry_status_flush(agent *a)
{
    if (!a->status_dirty || a->status_busy || !a->keeper || !a->k_status ||
        edl_monotonic_ms() < a->status_next_ms)
        return;
    reg_work *r = work_new(a, status_run, status_done);
    if (!r || !(r->key = strdup(a->k_status)) || !(r->doc = edl_pod_status_to_json(&a->status))) {
        if (r)
            work_free(r);
        return; /* out of memory: tried again after the next wake-up */
    }
    r->lease = a->lease;
    if (!submit(a, r))
        return;
    a->status_busy = true;
    a->status_dirty = false;
}

bool registry_status_last(agent *a)
{
    if (a->status_busy)
        return !a->status_dirty; /* the write on its way carries the newest */
    a->status_next_ms = 0;
    registry_status_flush(a); /* one try; the lease goes next anyway */
    return true;
}

/* ---- the published generation -------------------------------------------------------------- */

/* Apply a generation document (NULL: the key is absent). Malformed ones are logged and
 * ignored. */
static void apply_generation(agent *a, const char *val, size_t len)
{
    if (!val) {
        if (a->have_generation)
            EDL_WARN("agent", "%s was deleted: waiting for a new generation", a->keys.generation);
        edl_generation_clear(&a->generation);
        a->have_generation = false;
        return;
    }
    edl_generation g = {0};
    char err[256];
    int rc = edl_generation_parse(val, len, &g, err, sizeof err);
    if (rc) {
        EDL_ERROR("agent", "%s: ignoring a malformed document (%s); keeping generation %lld",
                  a->keys.generation, err, (long long)a->generation.generation);
        return;
    }
    edl_generation_clear(&a->generation);
    a->generation = g;
    a->have_generation = true;
}

/* On the worker: the generation as it is now, and a watch from the next revision. */
static void watch_run(edl_work *w)
{
    reg_work *r = (reg_work *)w;
    int rc = edl_etcd_get(r->etcd, edl_str(r->key), &r->kv, &r->rev);
    if (rc && rc != EDL_ENOTFOUND) {
        step_failed(r, rc, "reading the generation");
        return;
    }
    edl_watch_opts wo = {.start_revision = r->rev + 1};
    if ((rc = edl_watch_open(r->etcd, edl_str(r->key), &wo, &r->watch)) != 0)
        step_failed(r, rc, "watching the generation");
}

static void watch_done(edl_work *w)
{
    reg_work *r = (reg_work *)w;
    agent *a = r->a;
    a->watch_busy = false;
    if (r->rc) {
        etcd_failed(a, r);
        a->watch_next_ms = edl_monotonic_ms() + 1000;
    } else {
        a->watch = r->watch;
        apply_generation(a, r->kv ? r->kv->value : NULL, r->kv ? r->kv->value_len : 0);
        a->watch_rev = r->rev;
        a->watch_next_ms = 0;
    }
    work_free(r);
}

int registry_watch_open(agent *a)
{
    if (!a->o->job || a->watch_busy)
        return 0; /* a teacher outside any job follows no generation */
    if (a->watch) {
        edl_watch_close(a->watch); /* wakes its thread: no wait for etcd */
        a->watch = NULL;
    }
    reg_work *r = work_new(a, watch_run, watch_done);
    if (!r || !(r->key = strdup(a->keys.generation))) {
        free(r);
        a->watch_next_ms = edl_monotonic_ms() + 1000;
        return EDL_ENOMEM;
    }
    if (!submit(a, r)) {
        a->watch_next_ms = edl_monotonic_ms() + 1000;
        return EDL_ENOMEM;
    }
    a->watch_busy = true;
    a->watch_next_ms = 0;
    return 0;
}

void registry_watch_events(agent *a)
{
    edl_watch_event *ev;
    while (a->watch && edl_watch_next(a->watch, &ev, 0) == 0) {
        switch (ev->type) {
        case EDL_WATCH_PUT:
            if (ev->revision > a->watch_rev) {
                apply_generation(a, ev->kv.value, ev->kv.value_len);
                a->watch_rev = ev->revision;
            }
            break;
        case EDL_WATCH_DELETE:
            if (ev->revision > a->watch_rev) {
                apply_generation(a, NULL, 0);
                a->watch_rev = ev->revision;
            }
            break;
        case EDL_WATCH_PROGRESS:
            break;
        case EDL_WATCH_COMPACTED:
            EDL_INFO("agent", "watch on %s compacted: reading it again", a->keys.generation);
            edl_watch_event_free(ev);
            registry_watch_open(a);
            continue;
        case EDL_WATCH_ERROR:
            a->m.etcd_errors++;
            EDL_WARN("agent", "watch on %s ended: %s; restarting it", a->keys.generation,
                     edl_strerror(ev->error));
            edl_watch_event_free(ev);
            edl_watch_close(a->watch);
            a->watch = NULL;
            a->watch_next_ms = edl_monotonic_ms() + 1000;
            return;
        }
        edl_watch_event_free(ev);
    }
}

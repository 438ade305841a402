/* registry.c: the agent's etcd side: its lease, the pod and status keys under it, and the
 * watch on the job's published generation. Every call here is bounded by the client's short
 * timeout, and a failure is retried from the loop: etcd being away never stops a trainer; only
 * a lost lease does (agent.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "edl/log.h"

static void etcd_failed(agent *a, const char *what)
{
    a->m.etcd_errors++;
    EDL_WARN("agent", "%s: %s", what, edl_etcd_errmsg(a->etcd));
}

/* ---- the generation's master port ---------------------------------------------------------- */

/* torchrun gives every round a fresh MASTER_PORT (a port in TIME_WAIT or still held by a dying
 * rank 0 of the last round must not stall the next one). Rank 0's agent picks a free port on
 * its address and publishes it under gen/<n>/master (deleted with the generation); the others
 * read it. Without a free port, rank 0's registered port is used. */
int registry_master_port(agent *a, int rank)
{
    int64_t gen = edl_generation_of_members(&a->generation); /* the workers' rendezvous */
    if (a->master_gen == gen)
        return 0;
    char *key = edl_job_key_gen(&a->keys, gen, EDL_GEN_MASTER);
    if (!key)
        return EDL_ENOMEM;
    int rc, port = 0;
    if (rank == 0) {
        port = edl_free_port(a->o->addr);
        if (!port)
            port = a->generation.members[0].port;
        char v[16];
        snprintf(v, sizeof v, "%d", port);
        if ((rc = edl_etcd_put(a->etcd, edl_str(key), edl_str(v), NULL, NULL)) != 0)
            etcd_failed(a, "publishing the generation's master port");
    } else {
        edl_kv *kv = NULL;
        rc = edl_etcd_get(a->etcd, edl_str(key), &kv, NULL);
        if (rc == 0) {
            char v[16] = "";
            char *end;
            if (kv->value_len < sizeof v)
                memcpy(v, kv->value, kv->value_len);
            long p = strtol(v, &end, 10);
            if (!v[0] || *end || p < 1 || p > 65535) {
                EDL_WARN("agent", "%s holds '%.15s', no port: using rank 0's port", key, v);
                p = a->generation.members[0].port;
            }
            port = (int)p;
        } else if (rc != EDL_ENOTFOUND) {
            etcd_failed(a, "reading the generation's master port");
        }
        edl_kv_free(kv);
    }
    free(key);
    if (rc == 0) {
        a->master_gen = gen;
        a->master_port = port;
    }
    return rc;
}

/* ---- registration ------------------------------------------------------------------------ */

static char *pod_json(const agent *a)
{
    edl_pod p = {.role = a->o->role, .addr = a->o->addr, .port = a->o->port,
                 .metrics_port = a->metrics ? edl_metrics_port(a->metrics) : 0,
                 .host = (char *)a->host, .pid = getpid(), .ttl_s = a->ttl_s};
    return edl_pod_to_json(&p);
}

static void schedule_register(agent *a)
{
    a->reg_backoff_ms = a->reg_backoff_ms ? a->reg_backoff_ms * 2 : 500;
    if (a->reg_backoff_ms > 5000)
        a->reg_backoff_ms = 5000;
    a->reg_next_ms = edl_monotonic_ms() + a->reg_backoff_ms;
}

/* The pod and status keys under the lease (none for a teacher outside any job: its service
 * key, put under the lease by teacher.c, is all it has). */
static int put_pod_keys(agent *a, int64_t lease, const edl_pod_status *s0)
{
    if (!a->k_pod)
        return 0;
    edl_kv *old = NULL;
    int rc = edl_etcd_get(a->etcd, edl_str(a->k_pod), &old, NULL);
    if (rc == 0 && old->lease != lease)
        EDL_WARN("agent", "%s exists under lease %lld (another agent with pod name %s, or this pod "
                 "before a restart): overwriting it", a->k_pod, (long long)old->lease, a->o->pod);
    edl_kv_free(old);
    char *doc = pod_json(a), *st = edl_pod_status_to_json(s0);
    edl_put_opts po = {.lease = lease};
    if (!doc || !st)
        rc = EDL_ENOMEM;
    else if ((rc = edl_etcd_put(a->etcd, edl_str(a->k_pod), edl_str(doc), &po, NULL)) != 0 ||
             (rc = edl_etcd_put(a->etcd, edl_str(a->k_status), edl_str(st), &po, NULL)) != 0)
        etcd_failed(a, "registration");
    free(doc);
    free(st);
    return rc;
}

int registry_register(agent *a)
{
    a->reg_attempt++;
    EDL_INFO("agent", "registering pod %s of job %s (attempt %d, TTL %llds)", a->o->pod,
             a->o->job ? a->o->job : "(none)", a->reg_attempt, (long long)a->ttl_s);
    int64_t lease = 0;
    edl_pod_status s0 = {.state = EDL_TRAINER_WAITING, .step = -1};
    int rc = edl_etcd_lease_grant(a->etcd, a->ttl_s, 0, &lease, NULL);
    if (rc) {
        etcd_failed(a, "lease grant");
        goto fail;
    }
    if ((rc = put_pod_keys(a, lease, &s0)) != 0)
        goto fail;
    rc = edl_lease_keeper_open(a->etcd, lease, a->ttl_s, NULL, NULL, &a->keeper);
    if (rc)
        goto fail;
    a->lease = lease;
    a->reg_next_ms = 0;
    a->reg_backoff_ms = 0;
    a->reg_attempt = 0;
    a->status = s0;
    a->status_dirty = false;
    a->status_written_ms = edl_monotonic_ms();
    EDL_INFO("agent", "registered %s under lease %lld", a->k_pod ? a->k_pod : a->o->pod,
             (long long)lease);
    return 0;
fail:
    if (lease && edl_etcd_lease_revoke(a->etcd, lease) != 0)
        EDL_DEBUG("agent", "revoking the half-made lease: %s", edl_etcd_errmsg(a->etcd));
    schedule_register(a);
    EDL_WARN("agent", "registration failed (%s); next attempt in %lld ms", edl_strerror(rc),
             (long long)a->reg_backoff_ms);
    return rc;
}

void registry_lease_lost(agent *a)
{
    int why = edl_lease_keeper_status(a->keeper);
    EDL_WARN("agent", "lease %lld lost (%s): the job server counts this pod as gone; the trainer "
             "stops and the pod registers again", (long long)a->lease, edl_strerror(why));
    edl_lease_keeper_close(a->keeper, false);
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
    edl_lease_keeper_close(a->keeper, true);
    a->keeper = NULL;
    EDL_INFO("agent", "lease %lld revoked: pod %s left job %s", (long long)a->lease, a->o->pod,
             a->o->job ? a->o->job : "(none)");
    a->lease = 0;
}

/* ---- status ------------------------------------------------------------------------------ */

void registry_status_set(agent *a, const edl_pod_status *s)
{
    bool only_step = s->generation == a->status.generation && s->state == a->status.state &&
                     s->pid == a->status.pid && s->exit_code == a->status.exit_code &&
                     s->signal == a->status.signal && s->restarts == a->status.restarts &&
                     strcmp(s->message, a->status.message) == 0;
    if (only_step && s->step == a->status.step)
        return;
    a->status = *s;
    a->status_dirty = true;
    if (!only_step && !a->status_failures) /* a state change goes out now; steps once a second */
        a->status_next_ms = 0;
    else if (only_step && !a->status_failures && a->status_next_ms == 0)
        a->status_next_ms = a->status_written_ms + 1000;
    registry_status_flush(a);
}

void registry_status_flush(agent *a)
{
    if (!a->status_dirty || !a->keeper || !a->k_status || edl_monotonic_ms() < a->status_next_ms)
        return;
    char *doc = edl_pod_status_to_json(&a->status);
    edl_put_opts po = {.lease = a->lease};
    int rc = doc ? edl_etcd_put(a->etcd, edl_str(a->k_status), edl_str(doc), &po, NULL) : EDL_ENOMEM;
    free(doc);
    int64_t now = edl_monotonic_ms();
    if (rc == 0) {
        if (a->status_failures)
            EDL_INFO("agent", "status written again after %d failed attempts", a->status_failures);
        a->status_dirty = false;
        a->status_failures = 0;
        a->status_written_ms = now;
        a->status_next_ms = 0;
        return;
    }
    a->status_failures++;
    a->m.etcd_errors++;
    if (a->status_failures == 1 || a->status_failures % 10 == 0)
        EDL_WARN("agent", "writing status (attempt %d): %s; retrying", a->status_failures,
                 edl_etcd_errmsg(a->etcd));
    int64_t backoff = 250LL << (a->status_failures < 4 ? a->status_failures : 4);
    a->status_next_ms = now + backoff;
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

int registry_watch_open(agent *a)
{
    if (!a->o->job)
        return 0; /* a teacher outside any job follows no generation */
    if (a->watch) {
        edl_watch_close(a->watch);
        a->watch = NULL;
    }
    edl_kv *kv = NULL;
    int64_t rev = 0;
    int rc = edl_etcd_get(a->etcd, edl_str(a->keys.generation), &kv, &rev);
    if (rc && rc != EDL_ENOTFOUND) {
        etcd_failed(a, "reading the generation");
        a->watch_next_ms = edl_monotonic_ms() + 1000;
        return rc;
    }
    edl_watch_opts wo = {.start_revision = rev + 1};
    rc = edl_watch_open(a->etcd, edl_str(a->keys.generation), &wo, &a->watch);
    if (rc) {
        edl_kv_free(kv);
        etcd_failed(a, "watching the generation");
        a->watch_next_ms = edl_monotonic_ms() + 1000;
        return rc;
    }
    apply_generation(a, kv ? kv->value : NULL, kv ? kv->value_len : 0);
    edl_kv_free(kv);
    a->watch_rev = rev;
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

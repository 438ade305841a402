/* elector.c: leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection
 * does it. Each tick reads the Lease and writes it at most once: create it when absent, renew
 * it when we hold it, take it when its holder let it expire (renewTime + leaseDurationSeconds
 * in the past) or released it. Every write carries the resourceVersion read, so of two
 * replicas racing for it one wins and the other gets 409. A leader that could not renew for
 * renew_deadline_ms steps down before its lease can expire for the others.
 *
 * Started (edl_k8s_elector_start), the ticks run on a thread of their own over a connection of
 * their own, so that no work of the caller's (a pass creating thousands of pods) delays a
 * renewal; leading is then a fact of the clock (renewed less than renew_deadline_ms ago), read
 * without a lock before every write of a fenced client (edl_k8s_elector_fence). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "edl/log.h"
#include "internal.h"

#define HELD_BY_OTHER 1 /* try_lease: a valid lease of someone else's */

struct edl_k8s_elector {
    edl_k8s *k;             /* the connection of the ticks (started: our own, owned) */
    char *ns, *name, *identity, *path, *collection;
    int lease_s, deadline_ms, retry_ms;
    atomic_bool leading;
    atomic_llong last_renew_ms; /* monotonic: the start of our last successful write as holder */
    /* started: the thread, its stop flag and wake-up, and the fd the caller polls */
    bool own_k, started, stop;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int efd;
    atomic_llong renewals, late, max_gap_ms;
};


static bool put_field(cJSON *obj, const char *key, cJSON *v)
{
    if (!v)
        return false;
    if (cJSON_GetObjectItemCaseSensitive(obj, key))
        return cJSON_ReplaceItemInObjectCaseSensitive(obj, key, v);
    return cJSON_AddItemToObject(obj, key, v);
}

/* Write holder, duration and times into spec; acquired: a new holder (acquireTime, one more
 * transition). */
static bool fill_spec(cJSON *spec, const char *holder, int duration_s, bool acquired)
{
    char now[40];
    edl_k8s_time(edl_wall_ms(), true, now, sizeof now);
    int64_t transitions = edl_k8s_int(spec, "leaseTransitions", 0);
    bool ok = put_field(spec, "holderIdentity", cJSON_CreateString(holder)) &&
              put_field(spec, "leaseDurationSeconds", cJSON_CreateNumber(duration_s)) &&
              put_field(spec, "renewTime", cJSON_CreateString(now));
    if (ok && acquired)
        ok = put_field(spec, "acquireTime", cJSON_CreateString(now)) &&
             put_field(spec, "leaseTransitions", cJSON_CreateNumber((double)(transitions + 1)));
    return ok;
}

static int create_lease(edl_k8s_elector *e)
{
    cJSON *l = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(l, "metadata"),
          *spec = cJSON_AddObjectToObject(l, "spec");
    bool ok = md && spec && cJSON_AddStringToObject(l, "apiVersion", "coordination.k8s.io/v1") &&
              cJSON_AddStringToObject(l, "kind", "Lease") && cJSON_AddStringToObject(md, "name", e->name) &&
              cJSON_AddStringToObject(md, "namespace", e->ns) && fill_spec(spec, e->identity, e->lease_s, true);
    /* a new Lease starts at 0 transitions */
    ok = ok && put_field(spec, "leaseTransitions", cJSON_CreateNumber(0));
    edl_k8s_reply r;
    int rc = ok ? edl_k8s_create(e->k, e->collection, l, &r) : EDL_ENOMEM;
    if (ok && rc && rc != EDL_ECONFLICT)
        EDL_WARN("k8s", "lease %s/%s: cannot create it: %s", e->ns, e->name, r.message);
    if (ok)
        edl_k8s_reply_clear(&r);
    cJSON_Delete(l);
    return rc;
}

/* Whether the holder's lease has run out on our clock. */
static bool expired(const cJSON *spec, int dflt_s)
{
    const char *renew = edl_k8s_str(spec, "renewTime");
    int64_t at, dur = edl_k8s_int(spec, "leaseDurationSeconds", dflt_s);
    if (!renew || edl_k8s_time_parse(renew, &at) != 0)
        renew = edl_k8s_str(spec, "acquireTime");
    if (!renew || edl_k8s_time_parse(renew, &at) != 0)
        return true; /* a lease that never says when it was renewed holds nothing */
    return at + dur * 1000 < edl_wall_ms();
}

/* One read and at most one write: 0 when we hold the lease now, HELD_BY_OTHER, EDL_ECONFLICT
 * when another replica wrote first, or an error. */
static int try_lease(edl_k8s_elector *e)
{
    edl_k8s_reply r;
    int rc = edl_k8s_get(e->k, e->path, &r);
    if (rc == EDL_ENOTFOUND) {
        edl_k8s_reply_clear(&r);
        return create_lease(e);
    }
    cJSON *spec = rc ? NULL : cJSON_GetObjectItemCaseSensitive(r.body, "spec");
    if (!rc && !cJSON_IsObject(spec) && !(spec = cJSON_AddObjectToObject(r.body, "spec")))
        rc = EDL_EPROTO;
    if (rc) {
        EDL_WARN("k8s", "lease %s/%s: cannot read it: %s", e->ns, e->name, r.message);
        edl_k8s_reply_clear(&r);
        return rc;
    }
    const char *holder = edl_k8s_str(spec, "holderIdentity");
    bool ours = holder && strcmp(holder, e->identity) == 0;
    if (!ours && holder && *holder && !expired(spec, e->lease_s)) {
        edl_k8s_reply_clear(&r);
        return HELD_BY_OTHER;
    }
    if (!ours)
        EDL_INFO("k8s", "lease %s/%s: %s%s; taking it as %s", e->ns, e->name,
                 holder && *holder ? "expired, held by " : "free", holder && *holder ? holder : "", e->identity);
    rc = fill_spec(spec, e->identity, e->lease_s, !ours) ? edl_k8s_update(e->k, e->path, r.body, NULL) : EDL_ENOMEM;
    edl_k8s_reply_clear(&r);
    return rc;
}

/* A successful write as the holder, begun at now: counted, and late when more than twice the
 * retry period passed since the one before. */
static void renewed(edl_k8s_elector *e, int64_t now)
{
    int64_t gap = atomic_load(&e->leading) ? now - atomic_load(&e->last_renew_ms) : 0;
    atomic_store(&e->last_renew_ms, now);
    atomic_fetch_add(&e->renewals, 1);
    if (gap > 2 * (int64_t)e->retry_ms)
        atomic_fetch_add(&e->late, 1);
    if (gap > atomic_load(&e->max_gap_ms))
        atomic_store(&e->max_gap_ms, gap);
}

static void set_leading(edl_k8s_elector *e, bool leading)
{
    if (atomic_exchange(&e->leading, leading) != leading && e->efd >= 0) {
        uint64_t one = 1;
        ssize_t n = write(e->efd, &one, sizeof one);
        (void)n; /* a full counter is already readable */
    }
}

int edl_k8s_elector_tick(edl_k8s_elector *e, bool *leading, int64_t *next_ms)
{
    int64_t now = edl_monotonic_ms();
    int rc = try_lease(e);
    /* renewed as of the start (the lease runs from no later than that); the deadline judged
     * after the attempt, which may have spent seconds on retries */
    bool was = atomic_load(&e->leading);
    if (rc == 0) {
        if (!was)
            EDL_INFO("k8s", "lease %s/%s: %s leads", e->ns, e->name, e->identity);
        renewed(e, now);
        set_leading(e, true);
    } else if (was && (rc == HELD_BY_OTHER ||
                       edl_monotonic_ms() - atomic_load(&e->last_renew_ms) >= e->deadline_ms)) {
        EDL_WARN("k8s", "lease %s/%s: %s no longer leads (%s)", e->ns, e->name, e->identity,
                 rc == HELD_BY_OTHER ? "another replica holds the lease" : "not renewed within the renew deadline");
        set_leading(e, false);
    }
    *leading = atomic_load(&e->leading);
    *next_ms = now + e->retry_ms;
    /* losing (to a valid holder or a faster replica) is an outcome, not an error */
    return rc == HELD_BY_OTHER || rc == EDL_ECONFLICT ? 0 : rc;
}

bool edl_k8s_elector_leading(edl_k8s_elector *e)
{
    return e && atomic_load(&e->leading) &&
           edl_monotonic_ms() - atomic_load(&e->last_renew_ms) < e->deadline_ms;
}

int64_t edl_k8s_elector_valid_ms(edl_k8s_elector *e)
{
    if (!edl_k8s_elector_leading(e))
        return 0;
    return atomic_load(&e->last_renew_ms) + e->deadline_ms - edl_monotonic_ms();
}

void edl_k8s_elector_get_stats(edl_k8s_elector *e, edl_k8s_elector_stats *out)
{
    out->renewals = atomic_load(&e->renewals);
    out->late_renewals = atomic_load(&e->late);
    out->max_gap_ms = atomic_load(&e->max_gap_ms);
}

int edl_k8s_elector_fd(const edl_k8s_elector *e)
{
    return e ? e->efd : -1;
}

static bool fence(void *arg)
{
    return edl_k8s_elector_leading(arg);
}

void edl_k8s_elector_fence(edl_k8s_elector *e, edl_k8s *k)
{
    k8s_set_write_fence(k, e ? fence : NULL, e);
}

/* ---- the thread of a started elector ----------------------------------------------------- */

static void *campaign(void *arg)
{
    edl_k8s_elector *e = arg;
    int64_t next = 0;
    pthread_mutex_lock(&e->mu);
    while (!e->stop) {
        if (edl_monotonic_ms() < next) {
            edl_cond_wait_until(&e->cv, &e->mu, next);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        bool leading;
        int rc = edl_k8s_elector_tick(e, &leading, &next);
        if (rc && !leading)
            EDL_WARN("k8s", "lease %s/%s: %s", e->ns, e->name, edl_strerror(rc));
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* Stop the thread of a started elector (nothing when it was not started). */
static void stop_thread(edl_k8s_elector *e)
{
    if (!e->started)
        return;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->started = false;
}

int edl_k8s_elector_start(const edl_k8s_config *cfg, const edl_k8s_elector_opts *o,
                          edl_k8s_elector **out)
{
    *out = NULL;
    edl_k8s_config c = *cfg;
    edl_k8s *k;
    /* one request may not outlast the renew deadline: bounded by the retry period (min 1 s) */
    int deadline = o && o->renew_deadline_ms > 0 ? o->renew_deadline_ms : 10000;
    c.timeout_ms = deadline / 4 > 1000 ? deadline / 4 : 1000;
    int rc = edl_k8s_open(&c, &k);
    if (rc)
        return rc;
    edl_k8s_elector *e;
    if ((rc = edl_k8s_elector_open(k, o, &e)) != 0) {
        edl_k8s_close(k);
        return rc;
    }
    e->own_k = true;
    e->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_mutex_init(&e->mu, NULL);
    edl_cond_init(&e->cv);
    e->started = e->efd >= 0 && pthread_create(&e->thread, NULL, campaign, e) == 0;
    if (!e->started) {
        edl_k8s_elector_close(e);
        return EDL_ENOMEM;
    }
    *out = e;
    return 0;
}

int edl_k8s_elector_release(edl_k8s_elector *e)
{
    stop_thread(e);
    if (!atomic_load(&e->leading))
        return 0;
    edl_k8s_reply r;
    int rc = edl_k8s_get(e->k, e->path, &r);
    cJSON *spec = rc ? NULL : cJSON_GetObjectItemCaseSensitive(r.body, "spec");
    set_leading(e, false);
    if (rc == EDL_ENOTFOUND || (!rc && !cJSON_IsObject(spec))) {
        edl_k8s_reply_clear(&r);
        return 0;
    }
    const char *holder = rc ? NULL : edl_k8s_str(spec, "holderIdentity");
    if (!rc && holder && strcmp(holder, e->identity) == 0) {
        /* as client-go's ReleaseOnCancel: no holder, a 1 s lease, so a standby takes it at once */
        rc = fill_spec(spec, "", 1, false) ? edl_k8s_update(e->k, e->path, r.body, NULL) : EDL_ENOMEM;
        if (rc == 0)
            EDL_INFO("k8s", "lease %s/%s: released by %s", e->ns, e->name, e->identity);
    }
    edl_k8s_reply_clear(&r);
    return rc;
}

void edl_k8s_elector_close(edl_k8s_elector *e)
{
    if (!e)
        return;
    stop_thread(e);
    if (e->own_k) {
        if (e->efd >= 0)
            close(e->efd);
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv);
        edl_k8s_close(e->k);
    }
    free(e->ns);
    free(e->name);
    free(e->identity);
    free(e->path);
    free(e->collection);
    free(e);
}

int edl_k8s_elector_open(edl_k8s *k, const edl_k8s_elector_opts *o, edl_k8s_elector **out)
{
    *out = NULL;
    if (!k || !o || !o->name || !*o->name || !o->identity || !*o->identity)
        return EDL_EINVAL;
    edl_k8s_elector *e = calloc(1, sizeof *e);
    if (!e)
        return EDL_ENOMEM;
    e->k = k;
    e->efd = -1;
    e->lease_s = o->lease_duration_s > 0 ? o->lease_duration_s : 15;
    e->deadline_ms = o->renew_deadline_ms > 0 ? o->renew_deadline_ms : 10000;
    e->retry_ms = o->retry_period_ms > 0 ? o->retry_period_ms : 2000;
    e->ns = strdup(o->ns ? o->ns : edl_k8s_namespace(k));
    e->name = strdup(o->name);
    e->identity = strdup(o->identity);
    e->path = e->ns ? edl_k8s_path("coordination.k8s.io", "v1", e->ns, "leases", o->name, NULL) : NULL;
    e->collection = e->ns ? edl_k8s_path("coordination.k8s.io", "v1", e->ns, "leases", NULL, NULL) : NULL;
    if (!e->ns || !e->name || !e->identity || !e->path || !e->collection) {
        edl_k8s_elector_close(e);
        return EDL_ENOMEM;
    }
    *out = e;
    return 0;
}

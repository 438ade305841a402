/* lease.c: lease calls, and the lease keeper that renews a lease in the background and
 * reports its loss the moment it happens. */
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "edl/log.h"
#include "internal.h"

static cJSON *lease_req(int64_t id)
{
    cJSON *req = cJSON_CreateObject();
    if (req && !json_add_i64(req, "ID", id)) {
        cJSON_Delete(req);
        return NULL;
    }
    return req;
}

static int lease_fail(edl_etcd *c, int rc, const char *what, int64_t id)
{
    return etcd_fail(c, rc, "%s/v3/lease/%s lease %lld: %s in the reply", edl_etcd_endpoint(c), what,
                     (long long)id, rc == EDL_ENOMEM ? "out of memory" : "unexpected types");
}

int edl_etcd_lease_grant(edl_etcd *c, int64_t ttl_s, int64_t id, int64_t *id_out, int64_t *ttl_out)
{
    if (ttl_s <= 0 || id < 0)
        return etcd_fail(c, EDL_EINVAL, "lease grant: TTL must be > 0 seconds (got %lld)", (long long)ttl_s);
    cJSON *req = lease_req(id), *resp;
    if (!req || !json_add_i64(req, "TTL", ttl_s)) {
        cJSON_Delete(req);
        return EDL_ENOMEM;
    }
    /* Re-sending a grant only risks an extra lease that expires by itself. */
    int rc = etcd_call(c, "/v3/lease/grant", req, &resp, edl_bytes(NULL, 0), true, 0);
    if (rc)
        return rc;
    int64_t got_id, got_ttl;
    rc = json_i64(resp, "ID", &got_id);
    if (!rc)
        rc = json_i64(resp, "TTL", &got_ttl);
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(resp, "error");
    char msg[160] = "";
    if (cJSON_IsString(err) && err->valuestring[0])
        snprintf(msg, sizeof msg, "%s", err->valuestring);
    cJSON_Delete(resp);
    if (msg[0])
        return etcd_fail(c, EDL_ESERVER, "%s/v3/lease/grant: %s", edl_etcd_endpoint(c), msg);
    if (rc || got_id <= 0 || got_ttl <= 0)
        return lease_fail(c, rc ? rc : EDL_EPROTO, "grant", id);
    *id_out = got_id;
    if (ttl_out)
        *ttl_out = got_ttl;
    return 0;
}

static int keepalive_timed(edl_etcd *c, int64_t id, int64_t *ttl_out, int timeout_ms)
{
    cJSON *req = lease_req(id), *resp;
    if (!req)
        return EDL_ENOMEM;
    int rc = etcd_call(c, "/v3/lease/keepalive", req, &resp, edl_bytes(NULL, 0), true, timeout_ms);
    if (rc)
        return rc;
    /* The reply is one stream message: {"result":{"ID":..,"TTL":..}}. */
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(resp, "result");
    int64_t ttl = 0;
    rc = res && !cJSON_IsObject(res) ? EDL_EPROTO : json_i64(res, "TTL", &ttl);
    cJSON_Delete(resp);
    if (rc)
        return lease_fail(c, rc, "keepalive", id);
    if (ttl <= 0) /* an expired or unknown lease answers 200 with no TTL */
        return etcd_fail(c, EDL_ELEASE, "%s: lease %lld expired or was revoked", edl_etcd_endpoint(c),
                         (long long)id);
    if (ttl_out)
        *ttl_out = ttl;
    return 0;
}

int edl_etcd_lease_keepalive(edl_etcd *c, int64_t id, int64_t *ttl_out)
{
    return keepalive_timed(c, id, ttl_out, 0);
}

int edl_etcd_lease_revoke(edl_etcd *c, int64_t id)
{
    cJSON *req = lease_req(id), *resp;
    if (!req)
        return EDL_ENOMEM;
    int rc = etcd_call(c, "/v3/lease/revoke", req, &resp, edl_bytes(NULL, 0), true, 0);
    cJSON_Delete(resp);
    return rc;
}

int edl_etcd_lease_revoke_holder(edl_etcd *c, edl_buf key, int64_t *lease_out)
{
    edl_kv *kv = NULL;
    int rc = edl_etcd_get(c, key, &kv, NULL);
    int64_t lease = rc == 0 ? kv->lease : 0;
    edl_kv_free(kv);
    if (rc == 0 && !lease)
        rc = EDL_ENOTFOUND;
    if (rc == 0)
        rc = edl_etcd_lease_revoke(c, lease);
    if (lease_out)
        *lease_out = rc == 0 ? lease : 0;
    return rc;
}

int edl_etcd_lease_ttl(edl_etcd *c, int64_t id, int64_t *ttl_out, int64_t *granted_out)
{
    cJSON *req = lease_req(id), *resp;
    if (!req)
        return EDL_ENOMEM;
    int rc = etcd_call(c, "/v3/lease/timetolive", req, &resp, edl_bytes(NULL, 0), true, 0);
    if (rc)
        return rc;
    int64_t ttl, granted;
    rc = json_i64(resp, "TTL", &ttl);
    if (!rc)
        rc = json_i64(resp, "grantedTTL", &granted);
    cJSON_Delete(resp);
    if (rc)
        return lease_fail(c, rc, "timetolive", id);
    if (ttl < 0)
        return etcd_fail(c, EDL_ENOTFOUND, "lease %lld not found", (long long)id);
    *ttl_out = ttl;
    if (granted_out)
        *granted_out = granted;
    return 0;
}

/* ---- lease keeper ------------------------------------------------------------------------ */

struct edl_lease_keeper {
    edl_etcd *conn;          /* own connection: renewals never queue behind the owner's calls */
    int64_t lease, ttl_ms;
    edl_lease_lost_fn on_lost;
    void *arg;
    int efd;                 /* eventfd, written once when the lease is lost */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    int status;              /* 0 alive, else why it was lost */
};

static void keeper_lost(edl_lease_keeper *k, int reason)
{
    pthread_mutex_lock(&k->mu);
    k->status = reason;
    pthread_mutex_unlock(&k->mu);
    EDL_WARN("etcd", "lease %lld lost: %s (%s)", (long long)k->lease, edl_strerror(reason),
             edl_etcd_errmsg(k->conn));
    /* the callback first: whoever wakes on the fd may rely on what the callback recorded */
    if (k->on_lost)
        k->on_lost(k->arg, k->lease, reason);
    uint64_t one = 1;
    if (write(k->efd, &one, sizeof one) < 0)
        EDL_ERROR("etcd", "lease keeper: cannot signal its fd");
}

/* Sleep until the monotonic time `until` (ms) or a stop request. Returns true when stopping. */
static bool keeper_wait(edl_lease_keeper *k, int64_t until)
{
    pthread_mutex_lock(&k->mu);
    while (!k->stop) {
        int64_t now = edl_monotonic_ms();
        if (now >= until)
            break;
        edl_cond_wait_ms(&k->cv, &k->mu, until - now);
    }
    bool stop = k->stop;
    pthread_mutex_unlock(&k->mu);
    return stop;
}

static void *keeper_main(void *arg)
{
    edl_lease_keeper *k = arg;
    int64_t last_ok = edl_monotonic_ms(); /* the lease was granted or renewed just before start */
    int64_t interval = k->ttl_ms / 3, next = last_ok + interval;
    for (;;) {
        int64_t deadline = last_ok + k->ttl_ms;
        if (keeper_wait(k, next < deadline ? next : deadline))
            return NULL;
        int64_t sent = edl_monotonic_ms();
        if (sent >= deadline) {
            etcd_fail(k->conn, EDL_ETIMEDOUT, "no renewal succeeded for %lld ms (TTL)", (long long)k->ttl_ms);
            keeper_lost(k, EDL_ETIMEDOUT);
            return NULL;
        }
        /* A renewal that would answer after the deadline is useless: bound it by the deadline. */
        int rc = keepalive_timed(k->conn, k->lease, NULL, (int)(deadline - sent));
        if (rc == 0) {
            last_ok = sent; /* the server's clock restarted no earlier than this */
            next = sent + interval;
        } else if (rc == EDL_ELEASE || rc == EDL_ENOTFOUND) {
            keeper_lost(k, EDL_ELEASE);
            return NULL;
        } else {
            EDL_DEBUG("etcd", "lease %lld renewal failed: %s", (long long)k->lease, edl_etcd_errmsg(k->conn));
            int64_t retry = k->ttl_ms / 10 < 200 ? k->ttl_ms / 10 : 200;
            next = edl_monotonic_ms() + retry;
        }
    }
}

int edl_lease_keeper_open(edl_etcd *c, int64_t lease, int64_t ttl_s, edl_lease_lost_fn on_lost,
                           void *arg, edl_lease_keeper **out)
{
    *out = NULL;
    if (!c || lease <= 0 || ttl_s <= 0)
        return EDL_EINVAL;
    edl_lease_keeper *k = calloc(1, sizeof *k);
    if (!k)
        return EDL_ENOMEM;
    k->lease = lease;
    k->ttl_ms = ttl_s * 1000;
    k->on_lost = on_lost;
    k->arg = arg;
    k->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int rc = k->efd < 0 ? EDL_EIO : edl_etcd_open(&c->cfg, &k->conn);
    if (rc) {
        if (k->efd >= 0)
            close(k->efd);
        free(k);
        return rc;
    }
    pthread_mutex_init(&k->mu, NULL);
    edl_cond_init(&k->cv);
    if (pthread_create(&k->thread, NULL, keeper_main, k) != 0) {
        edl_etcd_close(k->conn);
        close(k->efd);
        free(k);
        return EDL_ENOMEM;
    }
    *out = k;
    return 0;
}

int edl_lease_keeper_fd(const edl_lease_keeper *k)
{
    return k->efd;
}

int edl_lease_keeper_status(const edl_lease_keeper *k)
{
    edl_lease_keeper *m = (edl_lease_keeper *)k;
    pthread_mutex_lock(&m->mu);
    int s = m->status;
    pthread_mutex_unlock(&m->mu);
    return s;
}

int64_t edl_lease_keeper_lease(const edl_lease_keeper *k)
{
    return k->lease;
}

void edl_lease_keeper_close(edl_lease_keeper *k, bool revoke)
{
    if (!k)
        return;
    pthread_mutex_lock(&k->mu);
    k->stop = true;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
    pthread_join(k->thread, NULL);
    if (revoke && edl_etcd_lease_revoke(k->conn, k->lease) != 0 && k->status == 0)
        EDL_WARN("etcd", "revoking lease %lld: %s", (long long)k->lease, edl_etcd_errmsg(k->conn));
    edl_etcd_close(k->conn);
    pthread_cond_destroy(&k->cv);
    pthread_mutex_destroy(&k->mu);
    close(k->efd);
    free(k);
}

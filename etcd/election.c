/* election.c: leader election on one key. The leader is whoever created the key (under
 * its lease); its create_revision identifies its term and fences its writes: a txn that
 * compares CREATE == that revision fails as soon as the key was deleted or re-created. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

void edl_leader_clear(edl_leader *leader)
{
    if (!leader)
        return;
    edl_kv_free(leader->kv);
    leader->kv = NULL;
}

/* Move the first key of a range result into leader (NULL leader: drop it). */
static void take_leader(edl_range_result *r, edl_leader *leader)
{
    if (!leader || r->n_kvs == 0)
        return;
    edl_kv *kv = malloc(sizeof *kv);
    if (!kv)
        return;
    *kv = r->kvs[0];
    memset(&r->kvs[0], 0, sizeof r->kvs[0]);
    edl_leader_clear(leader);
    leader->kv = kv;
}

int edl_election_try(edl_etcd *c, edl_buf key, edl_buf value, int64_t lease, bool *won,
                     edl_leader *leader)
{
    *won = false;
    if (lease <= 0)
        return etcd_fail(c, EDL_EINVAL, "election: a candidate needs a lease");
    edl_txn *t = edl_txn_new();
    if (!t)
        return EDL_ENOMEM;
    edl_put_opts po = {.lease = lease};
    edl_txn_cmp_create(t, key, EDL_CMP_EQUAL, 0);
    edl_txn_put(t, EDL_TXN_SUCCESS, key, value, &po);
    edl_txn_range(t, EDL_TXN_SUCCESS, key, NULL);
    edl_txn_range(t, EDL_TXN_FAILURE, key, NULL);
    int rc;
    for (int attempt = 0; attempt < 10; attempt++) {
        edl_txn_result r;
        if ((rc = edl_etcd_txn(c, t, &r)) != 0)
            break;
        edl_range_result *rr = &r.results[r.n_results - 1].range;
        bool seen = rr->n_kvs > 0;
        /* The key under our own lease is our own earlier attempt, applied although its reply
         * was lost: we lead (waiting for it to go away would wait for ever). */
        *won = r.succeeded || (seen && rr->kvs[0].lease == lease);
        if (seen)
            take_leader(rr, leader);
        edl_txn_result_clear(&r);
        if (*won || seen)
            break;
        /* the leader's key vanished between our compare and our read: the seat is free */
        rc = EDL_ECONFLICT;
    }
    edl_txn_free(t);
    if (rc == EDL_ENOTFOUND)
        return etcd_fail(c, EDL_ELEASE, "election: lease %lld not found", (long long)lease);
    return rc;
}

/* Wait for the key to be deleted (any revision after `after`), up to deadline. */
static int wait_vacancy(edl_etcd *c, edl_buf key, int64_t after, int64_t deadline)
{
    edl_watch_opts wo = {.start_revision = after + 1};
    edl_watch *w;
    int rc = edl_watch_open(c, key, &wo, &w);
    if (rc)
        return rc;
    for (;;) {
        int64_t left = deadline == INT64_MAX ? -1 : deadline - edl_monotonic_ms();
        if (deadline != INT64_MAX && left <= 0) {
            rc = EDL_ETIMEDOUT;
            break;
        }
        edl_watch_event *ev;
        if ((rc = edl_watch_next(w, &ev, (int)(left < 0 || left > 1000000 ? 1000000 : left))) != 0) {
            if (rc == EDL_ETIMEDOUT)
                continue;
            break;
        }
        edl_watch_event_type type = ev->type;
        int err = ev->error;
        edl_watch_event_free(ev);
        if (type == EDL_WATCH_DELETE || type == EDL_WATCH_COMPACTED)
            break; /* vacancy, or we may have missed one: try again either way */
        if (type == EDL_WATCH_ERROR) {
            rc = err;
            break;
        }
    }
    edl_watch_close(w);
    return rc;
}

int edl_election_campaign(edl_etcd *c, edl_buf key, edl_buf value, int64_t lease, int timeout_ms,
                          edl_leader *leader)
{
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : edl_monotonic_ms() + timeout_ms;
    edl_leader cur = {0};
    for (;;) {
        bool won;
        int rc = edl_election_try(c, key, value, lease, &won, &cur);
        if (rc) {
            edl_leader_clear(&cur);
            return rc;
        }
        if (won) {
            if (leader) {
                edl_leader_clear(leader);
                *leader = cur;
            } else {
                edl_leader_clear(&cur);
            }
            return 0;
        }
        int64_t seen = cur.kv ? cur.kv->mod_revision : 0;
        if (edl_monotonic_ms() >= deadline) {
            edl_leader_clear(&cur);
            return EDL_ETIMEDOUT;
        }
        rc = wait_vacancy(c, key, seen, deadline);
        if (rc) {
            edl_leader_clear(&cur); /* someone else's term: never handed out as ours */
            return rc;
        }
    }
}

int edl_election_leader(edl_etcd *c, edl_buf key, edl_leader *leader)
{
    edl_kv *kv;
    int rc = edl_etcd_get(c, key, &kv, NULL);
    if (rc)
        return rc;
    edl_leader_clear(leader);
    leader->kv = kv;
    return 0;
}

void edl_txn_cmp_leader(edl_txn *t, const edl_leader *leader)
{
    edl_buf key = edl_bytes(leader->kv->key, leader->kv->key_len);
    edl_txn_cmp_create(t, key, EDL_CMP_EQUAL, leader->kv->create_revision);
}

/* Run a one-op txn fenced by the leader's term. */
static int fenced(edl_etcd *c, const edl_leader *leader, bool put, edl_buf value)
{
    if (!leader || !leader->kv)
        return EDL_EINVAL;
    edl_buf key = edl_bytes(leader->kv->key, leader->kv->key_len);
    edl_txn *t = edl_txn_new();
    if (!t)
        return EDL_ENOMEM;
    edl_txn_cmp_leader(t, leader);
    edl_put_opts po = {.lease = leader->kv->lease};
    if (put)
        edl_txn_put(t, EDL_TXN_SUCCESS, key, value, &po);
    else
        edl_txn_delete(t, EDL_TXN_SUCCESS, key, NULL);
    edl_txn_result r;
    int rc = edl_etcd_txn(c, t, &r);
    edl_txn_free(t);
    if (rc)
        return rc;
    bool ok = r.succeeded;
    edl_txn_result_clear(&r);
    if (!ok) {
        char ks[96];
        return etcd_fail(c, EDL_ECONFLICT, "election '%s': no longer the leader (term %lld ended)",
                         etcd_key_str(key, ks, sizeof ks), (long long)leader->kv->create_revision);
    }
    return 0;
}

int edl_election_proclaim(edl_etcd *c, const edl_leader *leader, edl_buf value)
{
    return fenced(c, leader, true, value);
}

int edl_election_resign(edl_etcd *c, const edl_leader *leader)
{
    return fenced(c, leader, false, edl_bytes(NULL, 0));
}

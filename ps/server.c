/* server.c: the parameter server's network side. A few event loops (one epoll each, on threads
 * of their own) share the listening socket (EPOLLEXCLUSIVE: one loop accepts each connection)
 * and deal the connections out round robin (through a pipe per loop), so that a client's lanes
 * are served side by side; each loop serves its connections to the end: a link first proves
 * the job secret (handshake of internal.h), then sends frames, each answered in order.
 * Connections that have not proved it yet are bounded apart from the others (each loop holds
 * its share of max_unauthenticated, oldest first, and a newcomer at the bound closes the
 * oldest of the source that holds the most, after reading the proof it may have sent), so
 * strangers that connect and stay silent cannot fill max_connections and lock the trainers
 * out, nor push out a trainer that has proved itself; refusals are logged at most once a
 * second, summed. A
 * connection holds at most one request and one reply at a time: it is not read while its reply
 * waits to go out, so a slow reader cannot make the server queue without bound, and its input
 * buffer grows with the bytes that have arrived, not with the length a header announces.
 * Requests reach the tables (table.c) whose shards have locks of their own: loops never wait
 * for each other on a table. A broken frame (bad magic, over max_message) closes the link after
 * an error frame; a bad request in a good frame gets an error reply and the link goes on. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "edl/log.h"
#include "edl/net.h"
#include "edl/proc.h"
#include "edl/wire.h"
#include "internal.h"
#include "server.h"

#define IN_STEP (1u << 20) /* the input buffer grows by at most this beyond what arrived */
#define ACCEPT_BATCH 32     /* connections accepted in a round of the loop */

enum conn_state { C_HELLO, C_PROOF, C_READY };

typedef struct ps_conn {
    int fd;
    enum conn_state state;
    uint8_t nc[PS_NONCE_BYTES], ns[PS_NONCE_BYTES];
    uint8_t *in;
    size_t in_have, in_cap;
    bool have_hdr;
    ps_hdr hdr;
    uint8_t *out;
    size_t out_len, out_off, out_cap;
    bool closing; /* close once the output is out */
    int64_t deadline; /* of the handshake */
    bool parked;      /* at a sync barrier: not read until it is answered */
    ps_hdr park_hdr;
    uint64_t park_step;
    int64_t park_since;
    struct ps_loop *loop;
    struct ps_conn *prev, *next;   /* every connection of the loop */
    bool pending;                  /* in the loop's queue of unauthenticated ones */
    bool evicted;                  /* out of it to make room: closed after this round */
    struct ps_conn *pprev, *pnext; /* that queue, oldest first (or the evicted ones) */
    uint8_t src[EDL_ADDR_KEY_BYTES]; /* its source (edl_peer_key), for the bound */
} ps_conn;

/* A source address and how many unauthenticated connections of the loop come from it. */
typedef struct ps_source {
    uint8_t key[EDL_ADDR_KEY_BYTES];
    int n;
} ps_source;

typedef struct ps_loop {
    edl_ps_server *s;
    int index, ep, wake_fd;
    ps_conn *conns;
    ps_conn *phead, *ptail; /* unauthenticated connections, oldest first */
    int npending, max_pending;
    ps_source *srcs;        /* [max_pending] the sources of the queue, unordered */
    int nsrcs;
    ps_conn *evicted;       /* to close once this round's events are handled */
} ps_loop;

/* ---- refusals, logged at a bounded rate -------------------------------------------------- */

enum refusal { R_EVICTED, R_TIMED_OUT, R_REFUSED };

#define REPORT_EVERY_MS 1000

/* Count a refusal (why: the reason of an R_REFUSED); report_refusals logs the sums. */
static void note_refusal(edl_ps_server *s, enum refusal kind, const char *why)
{
    atomic_fetch_add(&s->rejected, 1);
    atomic_fetch_add(kind == R_EVICTED ? &s->n_evicted : kind == R_TIMED_OUT ? &s->n_timed_out
                                                                           : &s->n_refused, 1);
    if (why) {
        pthread_mutex_lock(&s->why_mu);
        snprintf(s->last_why, sizeof s->last_why, "%s", why);
        pthread_mutex_unlock(&s->why_mu);
    }
}

/* Log what was refused since the last report, at most once every REPORT_EVERY_MS (whichever
 * loop comes first does it). A flood of strangers costs a few lines, not one per stranger. */
static void report_refusals(edl_ps_server *s)
{
    int64_t now = edl_monotonic_ms(), at = atomic_load(&s->report_at);
    if (now < at || !atomic_compare_exchange_strong(&s->report_at, &at, now + REPORT_EVERY_MS))
        return;
    uint64_t ev = atomic_exchange(&s->n_evicted, 0), to = atomic_exchange(&s->n_timed_out, 0);
    uint64_t re = atomic_exchange(&s->n_refused, 0);
    if (ev)
        EDL_WARN("ps", "closed %llu unauthenticated connection(s) to make room for newer ones "
                 "(more than max_unauthenticated, %d, at once: a flood?)",
                 (unsigned long long)ev, s->o.max_unauthenticated);
    if (to)
        EDL_WARN("ps", "closed %llu connection(s) that did not authenticate within %d ms",
                 (unsigned long long)to, s->o.handshake_timeout_ms);
    if (re) {
        char why[256];
        pthread_mutex_lock(&s->why_mu);
        snprintf(why, sizeof why, "%s", s->last_why);
        pthread_mutex_unlock(&s->why_mu);
        EDL_WARN("ps", "refused %llu connection(s); the last: %s", (unsigned long long)re, why);
    }
}

/* ---- output -------------------------------------------------------------------------------- */

/* Room for n more bytes of output; NULL when out of memory. */
static uint8_t *out_reserve(ps_conn *c, size_t n)
{
    if (c->out_len + n > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < c->out_len + n)
            cap *= 2;
        uint8_t *p = realloc(c->out, cap);
        if (!p)
            return NULL;
        c->out = p;
        c->out_cap = cap;
    }
    uint8_t *at = c->out + c->out_len;
    c->out_len += n;
    return at;
}

static void reply_error(ps_conn *c, const ps_hdr *h, int code,
                        const char *msg)
{
    size_t ml = strnlen(msg, PS_MAX_ERROR);
    ps_hdr r = {.type = PS_ERROR, .table = h ? h->table : 0, .id = h ? h->id : 0,
                .len = (uint32_t)(4 + ml)};
    uint8_t *p = out_reserve(c, PS_HDR_BYTES + r.len);
    if (!p) {
        c->closing = true;
        return;
    }
    ps_hdr_encode(&r, p);
    edl_put32(p + PS_HDR_BYTES, (uint32_t)code);
    memcpy(p + PS_HDR_BYTES + 4, msg, ml);
}

/* A reply's header and body space (len bytes); NULL (and an error reply) when out of memory. */
static uint8_t *reply_begin(ps_conn *c, const ps_hdr *h, uint32_t len)
{
    uint8_t *p = out_reserve(c, PS_HDR_BYTES + (size_t)len);
    if (!p) {
        reply_error(c, h, EDL_ENOMEM, "out of memory for the reply");
        return NULL;
    }
    ps_hdr r = {.type = (uint8_t)(h->type | PS_REPLY), .table = h->table, .id = h->id,
                .len = len};
    ps_hdr_encode(&r, p);
    return p + PS_HDR_BYTES;
}

/* ---- requests ------------------------------------------------------------------------------ */

int ps_server_create_table(edl_ps_server *s, uint16_t id, const edl_ps_table_config *cfg,
                           char *why, size_t whylen)
{
    pthread_mutex_lock(&s->create_mu);
    ps_table *t = atomic_load(&s->tables[id]);
    int rc = 0;
    if (t && !ps_config_equal(ps_table_config(t), cfg)) {
        rc = edl_errf(why, whylen, EDL_ECONFLICT, "table %u exists on this server with another "
                      "config (kind, dim, size, shards, optimizer, init or accessor differ)", id);
    } else if (t && ps_table_track_geo(t, cfg->geo_trainers)) {
        EDL_INFO("ps", "table %u: GEO changes tracked for %u trainers now", id,
                 cfg->geo_trainers);
    } else if (!t && ((rc = ps_table_new(cfg, &t)) != 0 ||
                      (rc = ps_elastic_table_new(s, id, t)) != 0)) {
        ps_table_free(t);
        edl_errf(why, whylen, rc, "no memory for table %u", id);
    } else if (!atomic_load(&s->tables[id])) {
        atomic_store(&s->tables[id], t);
    }
    pthread_mutex_unlock(&s->create_mu);
    return rc;
}

/* The table of a request, of the kind it needs: 0, or EDL_ENOTFOUND / EDL_EINVAL (why). */
static int table_for(edl_ps_server *s, const ps_request *r, edl_ps_table_kind kind,
                     ps_table **out, char *why, size_t whylen)
{
    ps_table *t = atomic_load(&s->tables[r->h.table]);
    if (!t)
        return edl_errf(why, whylen, EDL_ENOTFOUND, "no table %u on this server (create it "
                        "first)", r->h.table);
    if (ps_table_config(t)->kind != kind)
        return edl_errf(why, whylen, EDL_EINVAL, "table %u is %s", r->h.table,
                        kind == EDL_PS_SPARSE ? "dense" : "sparse");
    *out = t;
    return 0;
}

static int serve_sparse(edl_ps_server *s, ps_conn *c, const ps_request *r, char *why,
                        size_t whylen)
{
    ps_table *t = NULL;
    int found = table_for(s, r, EDL_PS_SPARSE, &t, why, whylen);
    if (found || (found = ps_route_check(s, r, t, why, whylen)) != 0)
        return found;
    uint32_t dim = ps_table_config(t)->dim, geo = ps_table_geo_trainers(t);
    if (r->h.type == PS_PUSH_SPARSE) {
        uint32_t width = ps_push_width(ps_table_config(t));
        if (r->dim != width)
            return edl_errf(why, whylen, EDL_EINVAL, "a push of rows of %u floats to table %u, "
                            "whose rows have %u%s", r->dim, r->h.table, dim, width == dim ? ""
                            : " (a CTR table: a push carries show, click and the gradients, "
                            "dim + 2 floats a key)");
        if ((r->h.flags == PS_F_GEO) != (geo > 0) || (geo && r->trainer >= geo))
            return edl_errf(why, whylen, EDL_EINVAL, "a %s push to table %u, %s", r->h.flags ==
                            PS_F_GEO ? "GEO" : "plain", r->h.table, geo ? "a GEO table of "
                            "geo_trainers trainers (a GEO push from one of them)"
                            : "not a GEO table");
        int rc = r->h.flags == PS_F_SYNC ? ps_sync_push(s->sync[PS_SPACE_STEPS], t, r, why, whylen)
                 : geo ? ps_table_geo_add(t, r->keys, r->n, r->values, r->trainer, &r->id)
                       : ps_table_push_sparse(t, r->keys, r->n, r->values, &r->id);
        if (rc == 0) {
            reply_begin(c, &r->h, 0);
            atomic_fetch_add(&s->keys_pushed, r->n);
        }
        return rc;
    }
    uint64_t len = 8 + 4 * (uint64_t)r->n * dim;
    if (len > s->o.max_message)
        return edl_errf(why, whylen, EDL_ETOOBIG, "a pull of %u rows of %u floats would "
                        "answer %llu bytes, over max_message %u", r->n, dim,
                        (unsigned long long)len, s->o.max_message);
    uint8_t *p = reply_begin(c, &r->h, (uint32_t)len);
    if (!p)
        return 0;
    edl_put32(p, r->n);
    edl_put32(p + 4, dim);
    int rc = ps_table_pull_sparse(t, r->keys, r->n, (float *)(void *)(p + 8));
    if (rc)
        c->out_len -= PS_HDR_BYTES + len;
    else
        atomic_fetch_add(&s->keys_pulled, r->n);
    return rc;
}

static int serve_dense(edl_ps_server *s, ps_conn *c, const ps_request *r, char *why,
                       size_t whylen)
{
    ps_table *t = NULL;
    int found = table_for(s, r, EDL_PS_DENSE, &t, why, whylen);
    if (found)
        return found;
    uint64_t size = ps_table_config(t)->size;
    for (uint32_t i = 0; i < r->nseg; i++) {
        uint64_t off, cnt;
        ps_segment_get(r->segs, i, &off, &cnt);
        if (off + cnt > size)
            return edl_errf(why, whylen, EDL_EINVAL, "dense segment %u, [%llu, %llu), is past "
                            "the end of table %u (%llu floats)", i, (unsigned long long)off,
                            (unsigned long long)(off + cnt), r->h.table,
                            (unsigned long long)size);
    }
    if ((found = ps_route_check(s, r, t, why, whylen)) != 0)
        return found;
    bool push = r->h.type == PS_PUSH_DENSE;
    if (push && r->h.flags == PS_F_SYNC) {
        int rc = ps_sync_push(s->sync[PS_SPACE_STEPS], t, r, why, whylen);
        if (rc == 0)
            reply_begin(c, &r->h, 0);
        return rc;
    }
    if (!push && 4 * r->total > s->o.max_message)
        return edl_errf(why, whylen, EDL_ETOOBIG, "a pull of %llu floats is over max_message "
                        "%u bytes", (unsigned long long)r->total, s->o.max_message);
    uint8_t *p = reply_begin(c, &r->h, push ? 0 : (uint32_t)(4 * r->total));
    if (!p)
        return 0;
    uint64_t done = 0;
    int rc = 0;
    for (uint32_t i = 0; i < r->nseg && rc == 0; i++) {
        uint64_t off, cnt;
        ps_segment_get(r->segs, i, &off, &cnt);
        rc = push ? ps_table_push_dense(t, off, cnt, r->values + 4 * done, &r->id)
                  : ps_table_pull_dense(t, off, cnt, (float *)(void *)(p + 4 * done));
        done += cnt;
    }
    if (rc)
        c->out_len -= PS_HDR_BYTES + (push ? 0 : 4 * r->total);
    return rc;
}

static int serve_geo_pull(edl_ps_server *s, ps_conn *c, const ps_request *r, char *why,
                          size_t whylen)
{
    ps_table *t = NULL;
    int found = table_for(s, r, EDL_PS_SPARSE, &t, why, whylen);
    if (found)
        return found;
    const edl_ps_table_config *cfg = ps_table_config(t);
    uint32_t geo = ps_table_geo_trainers(t);
    if (r->trainer >= geo)
        return edl_errf(why, whylen, EDL_EINVAL, "a GEO pull for trainer %u from table %u, "
                        "which tracks %u trainers", r->trainer, r->h.table, geo);
    size_t per = 8 + 4 * (size_t)cfg->dim;
    uint32_t max = (s->o.max_message - PS_GEO_PULL_PREFIX) / per;
    max = r->max < max ? r->max : max;
    uint8_t *p = reply_begin(c, &r->h, (uint32_t)(PS_GEO_PULL_PREFIX + max * per));
    if (!p)
        return 0;
    uint8_t *keys = p + PS_GEO_PULL_PREFIX;
    bool more;
    uint32_t n = ps_table_geo_take(t, r->trainer, max, keys, (float *)(void *)(keys + 8 *
                                   (size_t)max), &more);
    if (n < max) /* the rows follow the keys that came: close the gap */
        memmove(keys + 8 * (size_t)n, keys + 8 * (size_t)max, n * (per - 8));
    uint32_t len = (uint32_t)(PS_GEO_PULL_PREFIX + n * per);
    c->out_len -= (max - n) * per;
    edl_put32(p - 4, len); /* the header's length */
    edl_put32(p, n);
    edl_put32(p + 4, cfg->dim);
    edl_put32(p + 8, more);
    edl_put32(p + 12, 0);
    return 0;
}

static void reply_barrier(ps_conn *c, const ps_hdr *h, bool applied, uint64_t done)
{
    uint8_t *p = reply_begin(c, h, PS_BARRIER_REPLY_BYTES);
    if (p) {
        edl_put32(p, applied);
        edl_put32(p + 4, 0);
        edl_put64(p + 8, done);
    }
}

static void wake_loops(edl_ps_server *s)
{
    uint64_t one = 1;
    for (int i = 0; i < s->nthreads; i++)
        if (write(s->wake_fd[i], &one, sizeof one) < 0) {
            /* full: a wake is pending anyway */
        }
}

static int serve_barrier(edl_ps_server *s, ps_conn *c, const ps_request *r, char *why,
                         size_t whylen)
{
    uint64_t done;
    if (r->h.table >= PS_BARRIER_SPACES)
        return edl_errf(why, whylen, EDL_EPROTO, "barrier space %u (0: sync steps, 1: the "
                        "workers' barrier)", r->h.table);
    int rc = ps_sync_arrive(s->sync[r->h.table], r->h.table == PS_SPACE_STEPS ? s->tables : NULL,
                           r, &done, why, whylen);
    if (rc < 0)
        return rc;
    if (rc == 0) { /* wait for the others: answered by resume_parked */
        c->parked = true;
        c->park_hdr = r->h;
        c->park_step = r->step;
        c->park_since = edl_monotonic_ms();
        return 0;
    }
    reply_barrier(c, &r->h, true, done);
    if (rc == 2)
        wake_loops(s);
    return 0;
}

static bool serves_shard(void *own, uint32_t sh)
{
    return ((const uint8_t *)own)[sh] == PS_SH_OWN;
}

/* SHRINK: on the shards this server owns (every shard without a map). */
static int serve_shrink(edl_ps_server *s, ps_conn *c, const ps_request *r, char *why,
                        size_t whylen)
{
    ps_table *t = NULL;
    uint64_t evicted, left;
    int rc = table_for(s, r, EDL_PS_SPARSE, &t, why, whylen);
    const uint8_t *own = ps_elastic_states(s, r->h.table);
    if (rc == 0 && ps_table_shrink(t, r->token, own ? serves_shard : NULL, (void *)own,
                                   &evicted, &left) != 0)
        rc = edl_errf(why, whylen, EDL_EINVAL, "table %u has no CTR accessor: nothing to "
                      "shrink", r->h.table);
    uint8_t *p = rc ? NULL : reply_begin(c, &r->h, PS_SHRINK_REPLY_BYTES);
    if (p) {
        edl_put64(p, evicted);
        edl_put64(p + 8, left);
    }
    return rc;
}

static int serve_stats(edl_ps_server *s, ps_conn *c, const ps_request *r)
{
    edl_ps_server_stats st;
    edl_ps_server_get_stats(s, &st);
    uint8_t *p = reply_begin(c, &r->h, PS_STATS_BYTES);
    if (p)
        ps_stats_encode(&st, p);
    return 0;
}

/* The requests that touch tables (under the read side of the route lock). */
static int serve_data(edl_ps_server *s, ps_conn *c, const ps_request *r, char *why,
                      size_t whylen)
{
    switch (r->h.type) {
    case PS_PULL_SPARSE:
    case PS_PUSH_SPARSE: return serve_sparse(s, c, r, why, whylen);
    case PS_PULL_DENSE:
    case PS_PUSH_DENSE: return serve_dense(s, c, r, why, whylen);
    case PS_BARRIER: return serve_barrier(s, c, r, why, whylen);
    case PS_SHRINK: return serve_shrink(s, c, r, why, whylen);
    default: return serve_geo_pull(s, c, r, why, whylen);
    }
}

static void serve(edl_ps_server *s, ps_conn *c, const ps_hdr *h, const uint8_t *body)
{
    char why[PS_MAX_ERROR] = "";
    ps_request r;
    atomic_fetch_add(&s->requests, 1);
    int rc = ps_request_parse(h, body, &r, why, sizeof why);
    if (rc == 0 && h->type != PS_STATS && s->o.wait_for_map && !ps_elastic_mapped(s))
        rc = edl_errf(why, sizeof why, EDL_EBUSY, "this server has no map of servers yet");
    else if (rc == 0) {
        switch (h->type) {
        case PS_CREATE:
            if ((rc = ps_server_create_table(s, h->table, &r.cfg, why, sizeof why)) == 0)
                reply_begin(c, h, 0);
            break;
        case PS_PUT_SHARD:
            if ((rc = ps_serve_put_shard(s, &r, why, sizeof why)) == 0)
                reply_begin(c, h, 0);
            break;
        case PS_SAVE:
            if ((rc = ps_serve_save(s, &r, why, sizeof why)) == 0)
                reply_begin(c, h, 0);
            break;
        case PS_STATS: rc = serve_stats(s, c, &r); break;
        default:
            ps_elastic_read_lock(s);
            rc = serve_data(s, c, &r, why, sizeof why);
            ps_elastic_read_unlock(s);
            if (rc == 0 && (h->type == PS_PUSH_SPARSE || h->type == PS_PUSH_DENSE))
                atomic_fetch_add(&s->pushes, 1);
        }
    }
    if (rc) {
        atomic_fetch_add(&s->errors, 1);
        if (!why[0])
            snprintf(why, sizeof why, "%s", edl_strerror(rc));
        reply_error(c, h, rc, why);
    }
}

/* ---- the queue of unauthenticated connections ---------------------------------------------- */

static ps_source *source_of(ps_loop *l, const uint8_t key[EDL_ADDR_KEY_BYTES])
{
    for (int i = 0; i < l->nsrcs; i++)
        if (memcmp(l->srcs[i].key, key, EDL_ADDR_KEY_BYTES) == 0)
            return &l->srcs[i];
    return NULL;
}

/* Count c in (add 1) or out (-1) of its source's share. */
static void source_count(ps_loop *l, const ps_conn *c, int add)
{
    ps_source *src = source_of(l, c->src);
    if (!src && add > 0) { /* room: at most max_pending sources hold a connection */
        src = &l->srcs[l->nsrcs++];
        memcpy(src->key, c->src, EDL_ADDR_KEY_BYTES);
        src->n = 0;
    }
    if (src && (src->n += add) <= 0)
        *src = l->srcs[--l->nsrcs];
}

static void pending_add(ps_loop *l, ps_conn *c)
{
    source_count(l, c, 1);
    c->pending = true;
    c->pnext = NULL;
    c->pprev = l->ptail;
    *(l->ptail ? &l->ptail->pnext : &l->phead) = c;
    l->ptail = c;
    l->npending++;
}

static void pending_remove(ps_loop *l, ps_conn *c)
{
    if (!c->pending)
        return;
    *(c->pprev ? &c->pprev->pnext : &l->phead) = c->pnext;
    *(c->pnext ? &c->pnext->pprev : &l->ptail) = c->pprev;
    c->pending = false;
    l->npending--;
    source_count(l, c, -1);
}

/* ---- the handshake ------------------------------------------------------------------------- */

static void refuse(edl_ps_server *s, ps_conn *c, int code, const char *why)
{
    note_refusal(s, R_REFUSED, why);
    reply_error(c, NULL, code, why);
    c->closing = true;
}

static void on_hello(edl_ps_server *s, ps_conn *c)
{
    char why[256];
    uint8_t mac[EDL_SECRET_MAC_BYTES];
    if (ps_hello_parse(c->in, c->in_have, c->nc, why, sizeof why) != 0)
        return refuse(s, c, EDL_EPROTO, why);
    uint8_t *p = out_reserve(c, PS_CHALLENGE_BYTES);
    if (!p || RAND_bytes(c->ns, PS_NONCE_BYTES) != 1 ||
        ps_link_mac(&s->secret, s->job, PS_MAC_SERVER, c->nc, c->ns, mac) != 0) {
        c->closing = true;
        return;
    }
    ps_challenge_encode(c->ns, mac, p);
    c->state = C_PROOF;
}

static void on_proof(edl_ps_server *s, ps_conn *c)
{
    char why[256];
    uint8_t got[EDL_SECRET_MAC_BYTES], want[EDL_SECRET_MAC_BYTES];
    if (ps_proof_parse(c->in, c->in_have, got, why, sizeof why) != 0)
        return refuse(s, c, EDL_EPROTO, why);
    if (ps_link_mac(&s->secret, s->job, PS_MAC_CLIENT, c->nc, c->ns, want) != 0 ||
        !edl_job_secret_mac_equal(got, want))
        return refuse(s, c, EDL_EAUTH, "authentication failed: the client does not hold this "
                      "job's secret (or serves another job)");
    if (atomic_fetch_add(&s->live, 1) >= s->o.max_connections) {
        atomic_fetch_sub(&s->live, 1);
        snprintf(why, sizeof why, "the server has max_connections (%d) links open",
                 s->o.max_connections);
        return refuse(s, c, EDL_EBUSY, why);
    }
    pending_remove(c->loop, c);
    c->state = C_READY;
    c->deadline = -1;
    reply_begin(c, &(ps_hdr){.type = 0}, 0); /* the link is open: an empty reply of type 0 */
}

/* ---- input --------------------------------------------------------------------------------- */

static size_t conn_need(const ps_conn *c)
{
    switch (c->state) {
    case C_HELLO: return PS_HELLO_BYTES;
    case C_PROOF: return PS_PROOF_BYTES;
    default: return PS_HDR_BYTES + (c->have_hdr ? c->hdr.len : 0);
    }
}

/* One whole message is in c->in: act on it. */
static void conn_message(edl_ps_server *s, ps_conn *c)
{
    char why[256];
    if (c->state == C_HELLO) {
        on_hello(s, c);
    } else if (c->state == C_PROOF) {
        on_proof(s, c);
    } else if (!c->have_hdr) {
        int rc = ps_hdr_parse(c->in, s->o.max_message, &c->hdr, why, sizeof why);
        if (rc) {
            refuse(s, c, rc, why);
            return;
        }
        c->have_hdr = true;
        if (c->hdr.len > 0)
            return; /* now the body */
    }
    if (c->state == C_READY && c->have_hdr) {
        serve(s, c, &c->hdr, c->in + PS_HDR_BYTES);
        c->have_hdr = false;
    }
    c->in_have = 0;
    if (c->in_cap > 2 * IN_STEP) { /* give back what a big request took */
        free(c->in);
        c->in = NULL;
        c->in_cap = 0;
    }
}

static int grow_in(ps_conn *c, size_t need)
{
    size_t cap = c->in_have + IN_STEP < need ? c->in_have + IN_STEP : need;
    if (cap <= c->in_cap)
        return 0;
    cap = cap < 2 * c->in_cap ? (2 * c->in_cap < need ? 2 * c->in_cap : need) : cap;
    uint8_t *p = realloc(c->in, cap);
    if (!p)
        return EDL_ENOMEM;
    c->in = p;
    c->in_cap = cap;
    return 0;
}

/* Read and act until the socket is empty or a reply waits. -1: close the connection. */
static int conn_read(edl_ps_server *s, ps_conn *c)
{
    while (!c->closing && !c->parked && c->out_off == c->out_len) {
        size_t need = conn_need(c);
        if (c->in_have < need) {
            if (grow_in(c, need) != 0)
                return -1;
            ssize_t n = recv(c->fd, c->in + c->in_have, c->in_cap - c->in_have, 0);
            if (n == 0)
                return -1;
            if (n < 0)
                return errno == EAGAIN || errno == EINTR ? 0 : -1;
            c->in_have += (size_t)n;
            continue;
        }
        conn_message(s, c);
    }
    return 0;
}

/* ---- connections --------------------------------------------------------------------------- */

static void conn_close(ps_loop *l, ps_conn *c)
{
    if (c->pending)
        pending_remove(l, c);
    else if (c->state == C_READY)
        atomic_fetch_sub(&l->s->live, 1);
    epoll_ctl(l->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        l->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c->in);
    free(c->out);
    free(c);
}

/* Send what waits; then wait for input again, or for room to send more. -1: close. */
static int conn_flush(ps_loop *l, ps_conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            break;
        if (n <= 0)
            return -1;
        c->out_off += (size_t)n;
    }
    bool pending = c->out_off < c->out_len;
    if (!pending) {
        c->out_off = c->out_len = 0;
        if (c->closing)
            return -1;
    }
    uint32_t events = c->parked ? 0 : pending ? EPOLLOUT : EPOLLIN;
    struct epoll_event ev = {.events = events, .data.ptr = c};
    epoll_ctl(l->ep, EPOLL_CTL_MOD, c->fd, &ev);
    return 0;
}

/* Answer the barriers that wait here: applied, or "not yet" after PS_SYNC_POLL_MS (the
 * trainer asks again, with the trainer count of its generation then). */
static void resume_parked(ps_loop *l)
{
    int64_t now = edl_monotonic_ms();
    for (ps_conn *c = l->conns, *next; c; c = next) {
        next = c->next;
        uint64_t done;
        if (!c->parked)
            continue;
        bool applied = ps_sync_applied(l->s->sync[c->park_hdr.table], c->park_step, &done);
        if (!applied && now - c->park_since < PS_SYNC_POLL_MS)
            continue;
        c->parked = false;
        reply_barrier(c, &c->park_hdr, applied, done);
        if (conn_flush(l, c) != 0 || conn_read(l->s, c) != 0 || conn_flush(l, c) != 0)
            conn_close(l, c);
    }
}

/* Close c after this round (its events may still be in this round's list). */
static void close_later(ps_loop *l, ps_conn *c)
{
    pending_remove(l, c);
    c->evicted = true;
    c->pnext = l->evicted;
    l->evicted = c;
}

/* The connection to make room with: the oldest unauthenticated one of the source that holds
 * the most (the first of the queue from it). So a source holds at most its fair share of the
 * loop's slots when they run out, and strangers from other addresses never take the slot of a
 * trainer that connects alone from its own. */
static ps_conn *eviction_victim(ps_loop *l)
{
    ps_source *top = &l->srcs[0];
    for (int i = 1; i < l->nsrcs; i++)
        if (l->srcs[i].n > top->n)
            top = &l->srcs[i];
    for (ps_conn *c = l->phead; c; c = c->pnext)
        if (memcmp(c->src, top->key, EDL_ADDR_KEY_BYTES) == 0)
            return c;
    return l->phead;
}

/* Free a slot of the loop's queue. A victim that was challenged is read first: one whose proof
 * has arrived is authenticated (and leaves the queue) instead of evicted for a stranger. */
static void make_room(ps_loop *l)
{
    while (l->npending >= l->max_pending) {
        ps_conn *c = eviction_victim(l);
        if (c->state == C_PROOF && (conn_read(l->s, c) != 0 || conn_flush(l, c) != 0)) {
            close_later(l, c);
        } else if (c->pending) {
            note_refusal(l->s, R_EVICTED, NULL);
            close_later(l, c);
        }
    }
}

/* Serve the accepted socket fd on loop l, unauthenticated: at the loop's bound an older
 * unauthenticated connection makes room (make_room). A stranger holding a silent connection
 * is always older than a trainer that connects now and answers within a round trip, so a flood
 * delays trainers by no more than that, where refusing newcomers would lock them out (as the
 * collective's mesh does it: collective/net.c, take_new); a trainer that is displaced anyway
 * (its source floods too) opens again (client.c, link_open). */
static void adopt(ps_loop *l, int fd)
{
    edl_ps_server *s = l->s;
    ps_conn *c = calloc(1, sizeof *c);
    if (!c) {
        note_refusal(s, R_REFUSED, "out of memory for a connection");
        close(fd);
        return;
    }
    make_room(l);
    edl_net_tune(fd);
    *c = (ps_conn){.fd = fd, .state = C_HELLO, .loop = l,
                   .deadline = edl_monotonic_ms() + s->o.handshake_timeout_ms, .next = l->conns};
    edl_peer_key(fd, c->src);
    if (l->conns)
        l->conns->prev = c;
    l->conns = c;
    pending_add(l, c);
    atomic_fetch_add(&s->connections, 1);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(l->ep, EPOLL_CTL_ADD, fd, &ev);
}

/* Take the waiting connections, at most ACCEPT_BATCH a round (the loop reads the others'
 * proofs between batches); each goes to the next loop in turn (this one when that loop's pipe
 * is full). */
static void accept_all(ps_loop *l)
{
    edl_ps_server *s = l->s;
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        int to = (int)(atomic_fetch_add(&s->next_loop, 1) % (unsigned)s->nthreads);
        if (to == l->index || write(s->hand_fd[to][1], &fd, sizeof fd) != sizeof fd)
            adopt(l, fd);
    }
}

/* The connections another loop accepted for this one. */
static void adopt_handed(ps_loop *l)
{
    int fds[64];
    ssize_t n;
    while ((n = read(l->s->hand_fd[l->index][0], fds, sizeof fds)) > 0)
        for (size_t i = 0; i < (size_t)n / sizeof *fds; i++)
            adopt(l, fds[i]);
}

/* Close the connections whose handshake is overdue: the oldest of the queue (every one has
 * the same time to authenticate, so the queue is in the order of the deadlines). */
static void sweep_handshakes(ps_loop *l)
{
    while (l->evicted) {
        ps_conn *c = l->evicted;
        l->evicted = c->pnext;
        conn_close(l, c);
    }
    int64_t now = edl_monotonic_ms();
    while (l->phead && now > l->phead->deadline) {
        note_refusal(l->s, R_TIMED_OUT, NULL);
        conn_close(l, l->phead);
    }
}

static void *loop_main(void *arg)
{
    ps_loop *l = arg;
    edl_ps_server *s = l->s;
    static char stop_tag, hand_tag;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.ptr = NULL}, evs[64];
    epoll_ctl(l->ep, EPOLL_CTL_ADD, s->lfd, &ev);
    ev = (struct epoll_event){.events = EPOLLIN, .data.ptr = &stop_tag};
    epoll_ctl(l->ep, EPOLL_CTL_ADD, s->stop_fd, &ev);
    ev = (struct epoll_event){.events = EPOLLIN, .data.ptr = &l->wake_fd};
    epoll_ctl(l->ep, EPOLL_CTL_ADD, l->wake_fd, &ev);
    ev = (struct epoll_event){.events = EPOLLIN, .data.ptr = &hand_tag};
    epoll_ctl(l->ep, EPOLL_CTL_ADD, s->hand_fd[l->index][0], &ev);
    for (bool stop = false; !stop;) {
        int n = epoll_wait(l->ep, evs, 64, 250);
        for (int i = 0; i < n; i++) {
            ps_conn *c = evs[i].data.ptr;
            uint64_t drained;
            if (evs[i].data.ptr == &stop_tag) {
                stop = true;
            } else if (evs[i].data.ptr == &hand_tag) {
                adopt_handed(l);
            } else if (evs[i].data.ptr == &l->wake_fd) {
                if (read(l->wake_fd, &drained, sizeof drained) < 0) {
                    /* already drained */
                }
            } else if (!c) {
                accept_all(l);
            } else if (c->evicted) {
                /* closed after this round */
            } else if ((evs[i].events & (EPOLLERR | EPOLLHUP) && !(evs[i].events & EPOLLIN)) ||
                       conn_read(s, c) != 0 || conn_flush(l, c) != 0) {
                conn_close(l, c);
            }
        }
        sweep_handshakes(l);
        report_refusals(s);
        resume_parked(l);
    }
    sweep_handshakes(l); /* the evicted ones */
    while (l->conns)
        conn_close(l, l->conns);
    close(l->ep);
    free(l->srcs);
    free(l);
    return NULL;
}

/* ---- the handle ---------------------------------------------------------------------------- */

static int listen_on(edl_ps_server *s, char *why, size_t whylen)
{
    int rc = edl_net_listen(s->addr, s->o.port, &s->lfd, &s->port);
    if (rc == EDL_ECONFIG)
        return edl_errf(why, whylen, rc, "cannot resolve the address to listen on, '%s'", s->addr);
    if (rc)
        return edl_errf(why, whylen, rc, "cannot listen on %s:%d: %s", s->addr, s->o.port,
                        strerror(errno));
    return 0;
}

static int check_options(const edl_ps_server_options *o, char *why, size_t whylen)
{
    if (!o || !o->secret || o->secret->len == 0)
        return edl_errf(why, whylen, EDL_ECONFIG, "the parameter server needs the job secret "
                        "(EDL_JOB_SECRET_FILE): its links are always authenticated");
    if (o->port < 0 || o->port > 65535 || o->threads < 0 || o->threads > PS_MAX_THREADS ||
        o->max_connections < 0 || o->max_unauthenticated < 0 || o->handshake_timeout_ms < 0 ||
        (o->max_message && o->max_message < 4096))
        return edl_errf(why, whylen, EDL_ECONFIG, "bad server options: port %d (0..65535), "
                        "threads %d (0..%d), max_connections %d, max_unauthenticated %d, "
                        "max_message %u (>= 4096)", o->port, o->threads, PS_MAX_THREADS,
                        o->max_connections, o->max_unauthenticated, o->max_message);
    if (strlen(o->job ? o->job : "") >= 256 || strlen(o->listen_addr ? o->listen_addr : "") >= 256)
        return edl_errf(why, whylen, EDL_ECONFIG, "job id or listen address over 255 bytes");
    return 0;
}

int edl_ps_server_open(const edl_ps_server_options *o, edl_ps_server **out, char *why,
                       size_t whylen)
{
    int rc = check_options(o, why, whylen);
    if (rc)
        return rc;
    edl_ps_server *s = calloc(1, sizeof *s);
    if (!s)
        return edl_errf(why, whylen, EDL_ENOMEM, "out of memory");
    s->o = *o;
    int cpus = edl_cpu_count();
    s->nthreads = o->threads ? o->threads : (cpus < 4 ? cpus : 4);
    s->o.max_message = o->max_message ? o->max_message : EDL_PS_DEFAULT_MAX_MESSAGE;
    s->o.max_connections = o->max_connections ? o->max_connections : 1024;
    s->o.max_unauthenticated = o->max_unauthenticated ? o->max_unauthenticated : 256;
    s->o.handshake_timeout_ms = o->handshake_timeout_ms ? o->handshake_timeout_ms : 5000;
    s->o.handover_timeout_ms = o->handover_timeout_ms > 0 ? o->handover_timeout_ms : 10000;
    snprintf(s->job, sizeof s->job, "%s", o->job && *o->job ? o->job : "edl");
    snprintf(s->addr, sizeof s->addr, "%s", o->listen_addr && *o->listen_addr ? o->listen_addr
                                                                             : "127.0.0.1");
    s->secret = *o->secret;
    s->o.secret = &s->secret;
    pthread_mutex_init(&s->create_mu, NULL);
    pthread_mutex_init(&s->why_mu, NULL);
    ps_elastic_init(s);
    s->lfd = -1;
    for (int i = 0; i < PS_MAX_THREADS; i++)
        s->wake_fd[i] = s->hand_fd[i][0] = s->hand_fd[i][1] = -1;
    s->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    for (int i = 0; i < s->nthreads && s->stop_fd >= 0; i++)
        if ((s->wake_fd[i] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0 ||
            pipe2(s->hand_fd[i], O_CLOEXEC | O_NONBLOCK) != 0)
            rc = EDL_EIO;
    if (s->stop_fd < 0 || rc)
        rc = edl_errf(why, whylen, EDL_EIO, "eventfd or pipe: %s", strerror(errno));
    if (ps_ckpt_init(s, o->checkpoint) != 0 ||
        (rc == 0 && (ps_sync_new(&s->sync[0]) != 0 || ps_sync_new(&s->sync[1]) != 0)))
        rc = edl_errf(why, whylen, EDL_ENOMEM, "out of memory");
    if (rc || (rc = listen_on(s, why, whylen)) != 0) {
        edl_ps_server_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

int edl_ps_server_port(const edl_ps_server *s)
{
    return s ? s->port : -1;
}

int edl_ps_server_start(edl_ps_server *s)
{
    for (int i = 0; i < s->nthreads; i++) {
        ps_loop *l = calloc(1, sizeof *l);
        int ep = epoll_create1(EPOLL_CLOEXEC);
        int share = (s->o.max_unauthenticated + s->nthreads - 1) / s->nthreads;
        ps_source *srcs = calloc((size_t)share + 1, sizeof *srcs);
        if (l && ep >= 0 && srcs)
            *l = (ps_loop){.s = s, .index = i, .ep = ep, .wake_fd = s->wake_fd[i],
                           .max_pending = share, .srcs = srcs};
        if (!l || ep < 0 || !srcs || pthread_create(&s->th[i], NULL, loop_main, l) != 0) {
            free(srcs);
            free(l);
            if (ep >= 0)
                close(ep);
            s->nthreads = i; /* close joins the loops that run */
            edl_ps_server_stop(s);
            return EDL_EIO;
        }
        s->started = true;
    }
    return 0;
}

void edl_ps_server_stop(edl_ps_server *s)
{
    uint64_t one = 1;
    if (s && s->stop_fd >= 0 && write(s->stop_fd, &one, sizeof one) < 0) {
        /* the counter is full: a stop is already pending */
    }
}

void edl_ps_server_close(edl_ps_server *s)
{
    if (!s)
        return;
    edl_ps_server_stop(s);
    for (int i = 0; s->started && i < s->nthreads; i++)
        pthread_join(s->th[i], NULL);
    ps_elastic_close(s);
    ps_ckpt_close(s);
    if (s->lfd >= 0)
        close(s->lfd);
    if (s->stop_fd >= 0)
        close(s->stop_fd);
    for (int i = 0; i < PS_MAX_THREADS; i++) {
        int fd;
        if (s->wake_fd[i] >= 0)
            close(s->wake_fd[i]);
        while (s->hand_fd[i][0] >= 0 && read(s->hand_fd[i][0], &fd, sizeof fd) == sizeof fd)
            close(fd); /* handed to a loop that had stopped */
        for (int j = 0; j < 2; j++)
            if (s->hand_fd[i][j] >= 0)
                close(s->hand_fd[i][j]);
    }
    ps_sync_free(s->sync[0]);
    ps_sync_free(s->sync[1]);
    for (int i = 0; i < EDL_PS_MAX_TABLES; i++)
        ps_table_free(atomic_load(&s->tables[i]));
    pthread_mutex_destroy(&s->create_mu);
    pthread_mutex_destroy(&s->why_mu);
    edl_job_secret_clear(&s->secret);
    free(s);
}

void ps_server_key_counts(edl_ps_server *s, uint64_t *pulled, uint64_t *pushed)
{
    *pulled = atomic_load(&s->keys_pulled);
    *pushed = atomic_load(&s->keys_pushed);
}

void edl_ps_server_get_stats(edl_ps_server *s, edl_ps_server_stats *out)
{
    *out = (edl_ps_server_stats){.requests = atomic_load(&s->requests),
                                 .errors = atomic_load(&s->errors),
                                 .connections = atomic_load(&s->connections),
                                 .rejected = atomic_load(&s->rejected),
                                 .shards_in = atomic_load(&s->shards_in),
                                 .shards_out = atomic_load(&s->shards_out),
                                 .shards_lost = atomic_load(&s->shards_lost),
                                 .shards_restored = atomic_load(&s->shards_restored),
                                 .pushes = atomic_load(&s->pushes)};
    for (int i = 0; i < EDL_PS_MAX_TABLES; i++) {
        ps_table *t = atomic_load(&s->tables[i]);
        uint64_t rows, bytes;
        if (!t)
            continue;
        ps_table_stats(t, &rows, &bytes);
        out->tables++;
        out->rows += rows;
        out->bytes += bytes;
    }
}

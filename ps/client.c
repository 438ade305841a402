/* client.c: the trainer's side of the parameter server. Authenticated connections to every
 * server, `lanes` of them each: a big call is cut by shard into a request per lane, which the
 * server's loops serve side by side. A call de-duplicates its keys (a pull fetches each key
 * once; a push sums the gradients of a repeated key and sends the sum once), orders them by
 * owning server and then
 * by shard (the server locks a shard once per run of its keys), and talks to every server at
 * once: requests go out and replies come in on all links in one poll loop, each reply read
 * straight into its place where it can be. A link that fails or times out is closed and the
 * call fails, naming the server. Every push carries this client's token and a sequence number,
 * the same in every try of one push, so that a server applies it once however often it
 * comes. With elastic servers (a `servers` source of maps), a call that a server refused
 * (moved, busy) or whose link broke re-routes on a newer map and is sent again, until its
 * timeout. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <openssl/rand.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "edl/http.h"
#include "edl/net.h"
#include "edl/proc.h"
#include "edl/wire.h"
#include "internal.h"

/* One connection to a server: the server's first lane, or one of its others (lane_index). */
typedef struct ps_link {
    int fd;
    char *ep, *name;
    /* the request of the call in progress */
    uint8_t hdr[PS_HDR_BYTES], pre[8];
    struct iovec *iov;  /* the header, then the body's parts */
    int niov, iov_cap;
    size_t left;        /* request bytes still to send */
    uint8_t want_type;  /* the reply type that means success */
    /* its reply */
    uint8_t rhdr[PS_HDR_BYTES];
    size_t rgot;        /* bytes of header + body read */
    ps_hdr rh;
    uint8_t rpre[8];
    size_t npre;        /* bytes of a success body that go to rpre, the rest to dst */
    struct iovec *dst;  /* where a success body (after npre) goes, in turn; none: body */
    int ndst, dcur;     /* dst[dcur] is being filled; the dst before it hold dbase bytes */
    size_t dst_len, dbase;
    struct iovec one;   /* dst of a single place */
    uint8_t *body;      /* error replies and bodies without a dst */
    size_t body_cap;
    bool busy;
    int rc;             /* the outcome of its part of the last call */
    /* scratch of the call: this link's share */
    size_t first, count; /* sparse: its keys in the sorted order */
    uint8_t *seg;        /* dense: its segments */
    size_t seg_cap;
    struct iovec *places; /* dense: the head's parts, then the segments' places */
    size_t places_cap;
    uint32_t nseg;
    uint64_t total;
} ps_link;

typedef struct client_table {
    bool known;
    edl_ps_table_config cfg;
    int *rep[EDL_PS_MAX_REPLICAS]; /* per shard: the servers of its owner and its backups */
    int *lane[EDL_PS_MAX_REPLICAS]; /* per shard: their links for a call cut into lanes */
    int nrep;   /* min(replicas, servers) */
} client_table;

struct edl_ps_client {
    int n;          /* servers */
    int k, nl;      /* lanes per server; links, n * k: lane_index */
    ps_link *links;
    char job[256];
    edl_job_secret secret;
    int timeout_ms;
    uint32_t max_message, next_id;
    uint64_t sent, received; /* bytes of frames, both ways, since open */
    client_table tables[EDL_PS_MAX_TABLES];
    /* scratch, kept between calls */
    uint64_t *ukeys, *skeys, *hkeys;
    uint32_t *uidx, *rank, *hslot, *order, *tmp, *cnt;
    float *rows;
    size_t ucap, hcap, rows_cap, cnt_cap;
    /* the last sparse plan's keys: a call with the same keys on a table of as many shards
     * (a pull then its push, or the same batch on two tables) reuses the plan */
    uint64_t *plan_keys;
    size_t plan_n, plan_nu, plan_cap;
    uint32_t plan_shards; /* 0: no plan kept (a dense call reuses the links' first/count) */
    int plan_rep;         /* the replicas it placed each key for */
    /* elastic servers */
    int (*servers)(void *arg, int64_t newer_than, edl_ps_servers *out);
    void *servers_arg;
    /* A client and its clones (ps_client_clone) are a family: one map source, called by one
     * member at a time (map_mu, held until its map is copied: it lives until the next call),
     * and the newest map any member follows (family_gen), which the others catch up with at
     * their next call: a member that only pulls gets no refusal to tell it (a server checks
     * the map of pushes only), and members on different maps would split a barrier. */
    pthread_mutex_t map_mu_own, *map_mu;
    _Atomic int64_t family_gen_own, *family_gen;
    int64_t gen;          /* the map the links follow */
    uint64_t token, seq;  /* this client, and its last push */
    int64_t deadline;     /* of the call in progress (monotonic ms; 0: none) */
    char err[1024];
};

static const ps_call_mode plain_call = {0};

/* The link of a server's lane: the first n links are the servers' first lanes (the calls made
 * once on every server use them), then each server's other lanes. */
static int lane_at(int n, int k, int server, int lane)
{
    return lane == 0 ? server : n + server * (k - 1) + lane - 1;
}

static int lane_index(const edl_ps_client *c, int server, int lane)
{
    return lane_at(c->n, c->k, server, lane);
}

static int fail(edl_ps_client *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(edl_ps_client *c, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return rc;
}

static void *grow(void *p, size_t *cap, size_t want, size_t elem)
{
    if (want <= *cap)
        return p;
    size_t n = *cap ? *cap : 256;
    while (n < want)
        n *= 2;
    void *q = realloc(p, n * elem);
    if (q)
        *cap = n;
    return q;
}

/* An error frame whose header is in h16: its message into c->err. */
static int read_error_frame(edl_ps_client *c, ps_link *l, const uint8_t *h16, int64_t deadline)
{
    ps_hdr h;
    char why[256], msg[PS_MAX_ERROR + 1] = "";
    uint8_t body[PS_MAX_ERROR + 4];
    if (ps_hdr_parse(h16, sizeof body, &h, why, sizeof why) == 0 && h.type == PS_REPLY &&
        h.len == 0)
        return 0; /* the link is open */
    if (ps_hdr_parse(h16, sizeof body, &h, why, sizeof why) != 0 || h.type != PS_ERROR ||
        h.len < 4)
        return fail(c, EDL_EPROTO, "server %s: not a parameter server (an unexpected answer "
                    "to the handshake)", l->ep);
    if (edl_net_read_all(l->fd, body, h.len, deadline) != 0)
        return fail(c, EDL_EPROTO, "server %s closed the link during the handshake", l->ep);
    memcpy(msg, body + 4, h.len - 4);
    int code = (int32_t)edl_get32(body);
    return fail(c, code < 0 && code >= -64 ? code : EDL_ESERVER, "server %s refused the link: "
                "%s", l->ep, msg);
}

static int handshake(edl_ps_client *c, ps_link *l, int64_t deadline)
{
    uint8_t nc[PS_NONCE_BYTES], ns[PS_NONCE_BYTES], buf[PS_CHALLENGE_BYTES];
    uint8_t mac[EDL_SECRET_MAC_BYTES], want[EDL_SECRET_MAC_BYTES], proof[PS_PROOF_BYTES];
    char why[256];
    if (RAND_bytes(nc, sizeof nc) != 1)
        return fail(c, EDL_EIO, "no random bytes for the handshake");
    ps_hello_encode(nc, buf);
    int rc = edl_net_write_all(l->fd, buf, PS_HELLO_BYTES, deadline);
    if (rc || (rc = edl_net_read_all(l->fd, buf, PS_HDR_BYTES, deadline)) != 0)
        return fail(c, rc, "server %s did not answer the handshake (%s)", l->ep,
                    rc == EDL_EPEER ? "it closed the link" : edl_strerror(rc));
    if (edl_get32(buf) == PS_FRAME_MAGIC)
        return read_error_frame(c, l, buf, deadline) ?: fail(c, EDL_EPROTO, "server %s: an "
                                "empty answer to the hello", l->ep);
    if (edl_net_read_all(l->fd, buf + PS_HDR_BYTES, sizeof buf - PS_HDR_BYTES, deadline) != 0 ||
        ps_challenge_parse(buf, sizeof buf, ns, mac, why, sizeof why) != 0)
        return fail(c, EDL_EPROTO, "server %s: a bad challenge (%s)", l->ep, why);
    if (ps_link_mac(&c->secret, c->job, PS_MAC_SERVER, nc, ns, want) != 0 ||
        !edl_job_secret_mac_equal(mac, want))
        return fail(c, EDL_EAUTH, "server %s does not hold this job's secret (another job's "
                    "server, or a stranger on its port)", l->ep);
    ps_link_mac(&c->secret, c->job, PS_MAC_CLIENT, nc, ns, mac);
    ps_proof_encode(mac, proof);
    if ((rc = edl_net_write_all(l->fd, proof, sizeof proof, deadline)) != 0 ||
        (rc = edl_net_read_all(l->fd, buf, PS_HDR_BYTES, deadline)) != 0)
        return fail(c, rc, "server %s %s after the proof", l->ep,
                    rc == EDL_EPEER ? "closed the link" : "did not answer");
    return read_error_frame(c, l, buf, deadline);
}

/* ---- a call on every link at once ---------------------------------------------------------- */

static void link_break(ps_link *l)
{
    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
    l->busy = false;
}

/* Room on l for a request of nparts parts (EDL_ENOMEM); every link has room for 7. */
static int link_room(edl_ps_client *c, ps_link *l, int nparts)
{
    size_t cap = (size_t)l->iov_cap;
    struct iovec *iov = nparts + 1 <= l->iov_cap ? l->iov
                        : grow(l->iov, &cap, (size_t)nparts + 1, sizeof *iov);
    if (!iov)
        return fail(c, EDL_ENOMEM, "out of memory for a request of %d parts", nparts);
    l->iov = iov;
    l->iov_cap = (int)cap;
    return 0;
}

/* Queue a request on l: the header, then the body's parts (link_room has made room). */
static void link_request(edl_ps_client *c, ps_link *l, uint8_t type, uint8_t flags,
                         uint32_t table, const struct iovec *parts, int nparts)
{
    ps_hdr h = {.type = type, .flags = flags, .table = (uint16_t)table, .id = ++c->next_id};
    l->niov = 0;
    l->iov[l->niov++] = (struct iovec){l->hdr, PS_HDR_BYTES};
    for (int i = 0; i < nparts; i++)
        if (parts[i].iov_len) {
            l->iov[l->niov++] = parts[i];
            h.len += (uint32_t)parts[i].iov_len;
        }
    ps_hdr_encode(&h, l->hdr);
    l->left = PS_HDR_BYTES + h.len;
    l->want_type = (uint8_t)(type | PS_REPLY);
    l->rgot = 0;
    l->busy = true;
    l->rc = 0;
}

static int link_send(edl_ps_client *c, ps_link *l)
{
    struct msghdr mh = {.msg_iov = l->iov, .msg_iovlen = (size_t)(l->niov < IOV_MAX ? l->niov
                                                                                : IOV_MAX)};
    ssize_t n = sendmsg(l->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0)
        return errno == EAGAIN || errno == EINTR ? 0 : EDL_EPEER;
    l->left -= (size_t)n;
    c->sent += (uint64_t)n;
    while (n > 0 && l->niov > 0) { /* drop what went out */
        size_t k = (size_t)n < l->iov[0].iov_len ? (size_t)n : l->iov[0].iov_len;
        l->iov[0].iov_base = (char *)l->iov[0].iov_base + k;
        l->iov[0].iov_len -= k;
        n -= (ssize_t)k;
        if (l->iov[0].iov_len == 0)
            memmove(l->iov, l->iov + 1, sizeof *l->iov * (size_t)--l->niov);
    }
    return 0;
}

/* Where byte `at` of the reply body goes, and how many bytes of it fit there. */
static uint8_t *body_place(ps_link *l, size_t at, size_t *room)
{
    bool ok = l->rh.type == l->want_type && l->ndst;
    if (ok && at < l->npre) {
        *room = l->npre - at;
        return l->rpre + at;
    }
    if (ok) { /* the bytes arrive in order: the place moves on through dst */
        size_t pos = at - l->npre;
        while (pos >= l->dbase + l->dst[l->dcur].iov_len)
            l->dbase += l->dst[l->dcur++].iov_len;
        *room = l->dbase + l->dst[l->dcur].iov_len - pos;
        return (uint8_t *)l->dst[l->dcur].iov_base + (pos - l->dbase);
    }
    *room = l->rh.len - at;
    return l->body + at;
}

/* Read what has come. 1 when the reply is whole, 0 when more is to come, < 0 on failure. */
static int link_recv(edl_ps_client *c, ps_link *l)
{
    char why[256];
    for (;;) {
        uint8_t *p;
        size_t room;
        if (l->rgot < PS_HDR_BYTES) {
            p = l->rhdr + l->rgot;
            room = PS_HDR_BYTES - l->rgot;
        } else {
            size_t at = l->rgot - PS_HDR_BYTES;
            if (at == l->rh.len)
                return 1;
            p = body_place(l, at, &room);
        }
        ssize_t n = recv(l->fd, p, room, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            return fail(c, EDL_EPEER, "server %s closed the link (%s)", l->ep,
                        n == 0 ? "end of stream" : strerror(errno));
        if (n < 0)
            return 0;
        l->rgot += (size_t)n;
        c->received += (uint64_t)n;
        if (l->rgot == PS_HDR_BYTES) {
            int rc = ps_hdr_parse(l->rhdr, c->max_message, &l->rh, why, sizeof why);
            bool ok = l->rh.type == l->want_type && (!l->ndst || l->rh.len == l->npre + l->dst_len);
            if (rc == 0 && !ok && l->rh.type != PS_ERROR)
                rc = edl_errf(why, sizeof why, EDL_EPROTO, "a reply of type %u and %u bytes",
                              l->rh.type, l->rh.len);
            if (rc)
                return fail(c, EDL_EPROTO, "server %s: %s", l->ep, why);
            if ((!l->ndst || l->rh.type != l->want_type) &&
                !(l->body = grow(l->body, &l->body_cap, l->rh.len + 1, 1)))
                return fail(c, EDL_ENOMEM, "out of memory for a reply of %u bytes", l->rh.len);
        }
    }
}

/* The outcome of l's whole reply: 0, or the server's error. */
static int link_outcome(edl_ps_client *c, ps_link *l, int rc)
{
    if (l->rh.type != PS_ERROR || rc)
        return rc;
    char msg[PS_MAX_ERROR + 1] = "";
    int code = l->rh.len >= 4 ? (int32_t)edl_get32(l->body) : EDL_ESERVER;
    size_t ml = l->rh.len >= 4 ? l->rh.len - 4 : 0;
    memcpy(msg, l->body + 4, ml < PS_MAX_ERROR ? ml : PS_MAX_ERROR);
    return fail(c, code < 0 && code >= -64 ? code : EDL_ESERVER, "server %s: %s", l->ep, msg);
}

/* One link's turn in the poll loop: 1 when its reply is whole, 0 when more is to come, < 0
 * (with c->err set and the link closed) when it failed. */
static int link_step(edl_ps_client *c, ps_link *l)
{
    int rc = l->left ? link_send(c, l) : 0;
    if (rc < 0)
        rc = fail(c, EDL_EPEER, "server %s is gone (sending: %s)", l->ep, strerror(errno));
    else
        rc = link_recv(c, l);
    if (rc < 0)
        link_break(l);
    return rc;
}

/* Run the queued requests of every busy link to their replies. The first failure is the
 * call's (its message kept); the other links still finish, so their streams stay in step. */
static int run_links(edl_ps_client *c)
{
    int64_t deadline = edl_monotonic_ms() + c->timeout_ms;
    struct pollfd pf[c->nl];
    char first_err[sizeof c->err];
    int first = 0, busy;
    for (;;) {
        busy = 0;
        for (int i = 0; i < c->nl; i++) {
            ps_link *l = &c->links[i];
            busy += l->busy;
            pf[i] = (struct pollfd){.fd = l->busy ? l->fd : -1,
                                    .events = (short)(POLLIN | (l->left ? POLLOUT : 0))};
        }
        int64_t left = deadline - edl_monotonic_ms();
        if (!busy || left <= 0 || poll(pf, (nfds_t)c->nl, (int)left) == 0)
            break;
        for (int i = 0; i < c->nl; i++) {
            ps_link *l = &c->links[i];
            int rc = l->busy && pf[i].revents ? link_step(c, l) : 0;
            if (rc == 1) {
                l->busy = false;
                rc = link_outcome(c, l, 0);
            }
            if (rc < 0)
                l->rc = rc;
            if (rc < 0 && !first) {
                first = rc;
                memcpy(first_err, c->err, sizeof first_err);
            }
        }
    }
    for (int i = 0; i < c->nl; i++) /* out of time */
        if (c->links[i].busy) {
            if (!first) {
                first = fail(c, EDL_ETIMEDOUT, "server %s did not answer within %d ms",
                             c->links[i].ep, c->timeout_ms);
                memcpy(first_err, c->err, sizeof first_err);
            }
            c->links[i].rc = EDL_ETIMEDOUT;
            link_break(&c->links[i]);
        }
    if (first)
        memcpy(c->err, first_err, sizeof c->err);
    return first;
}

/* A link that can take a call: open, no call left half done. */
static int link_usable(edl_ps_client *c, ps_link *l)
{
    if (l->fd < 0)
        return fail(c, EDL_EPEER, "the link to server %s broke in an earlier call; %s", l->ep,
                    c->servers ? "no newer map of servers has replaced it yet"
                               : "the client must be reopened");
    return 0;
}

/* What l's reply of success is: npre bytes to rpre, then n places of dst (kept by the caller
 * until the reply is in) of dst_len bytes in all; n 0: all of it to the body buffer. */
static void link_expect_iov(ps_link *l, size_t npre, struct iovec *dst, int n, size_t dst_len)
{
    l->npre = npre;
    l->dst = dst;
    l->ndst = n;
    l->dst_len = dst_len;
    l->dcur = 0;
    l->dbase = 0;
}

/* The same with one place, dst (NULL: the body buffer). */
static void link_expect(ps_link *l, size_t npre, void *dst, size_t dst_len)
{
    l->one = (struct iovec){dst, dst_len};
    link_expect_iov(l, npre, &l->one, dst ? 1 : 0, dst_len);
}

/* Every link must be usable before a call starts (and none has an outcome yet). */
static int links_usable(edl_ps_client *c)
{
    for (int i = 0; i < c->nl; i++)
        c->links[i].rc = 0;
    for (int i = 0; i < c->nl; i++)
        if (link_usable(c, &c->links[i]) != 0)
            return EDL_EPEER;
    return 0;
}

static const client_table *known_table(edl_ps_client *c, uint32_t table, edl_ps_table_kind kind)
{
    if (table >= EDL_PS_MAX_TABLES || !c->tables[table].known) {
        fail(c, EDL_EINVAL, "table %u: call edl_ps_create_table on this client first", table);
        return NULL;
    }
    if (c->tables[table].cfg.kind != kind) {
        fail(c, EDL_EINVAL, "table %u is %s", table,
             kind == EDL_PS_SPARSE ? "dense" : "sparse");
        return NULL;
    }
    return &c->tables[table];
}

/* ---- open, close, create ------------------------------------------------------------------- */

/* Connect and authenticate l (c->err says why not). A server that closed the link during the
 * handshake (it makes room for newer unauthenticated connections when strangers flood its
 * port: server.c, make_room) is tried again, after edl's jittered back-off, until the
 * deadline. */
static int link_open(edl_ps_client *c, ps_link *l, int64_t deadline)
{
    int rc = link_room(c, l, 7);
    for (int attempt = 0; !rc; attempt++) {
        rc = edl_net_dial(l->ep, deadline, &l->fd);
        if (rc)
            return fail(c, rc == EDL_EINVAL ? EDL_EINVAL : EDL_EUNAVAIL,
                        "cannot connect to parameter server %s: %s", l->ep, rc == EDL_EINVAL
                        ? "not host:port" : rc == EDL_ETIMEDOUT ? "timed out"
                        : "refused or unreachable");
        if ((rc = handshake(c, l, deadline)) == 0)
            return 0;
        link_break(l);
        int64_t nap = edl_http_backoff_ms(attempt, 10, 500, -1);
        if (rc != EDL_EPEER || edl_monotonic_ms() + nap >= deadline)
            break;
        usleep((useconds_t)nap * 1000);
        rc = 0;
    }
    return rc;
}

static int open_links(edl_ps_client *c, const edl_ps_client_options *o, char *why,
                      size_t whylen)
{
    int64_t deadline = edl_monotonic_ms() + c->timeout_ms;
    for (int i = 0; i < c->nl; i++)
        c->links[i].fd = -1;
    for (int i = 0; i < c->n; i++)
        for (int j = 0; j < c->k; j++) {
            ps_link *l = &c->links[lane_index(c, i, j)];
            l->ep = strdup(o->endpoints[i]);
            l->name = strdup(o->names ? o->names[i] : o->endpoints[i]);
            if (!l->ep || !l->name)
                return edl_errf(why, whylen, EDL_ENOMEM, "out of memory");
            int rc = link_open(c, l, deadline);
            if (rc)
                return edl_errf(why, whylen, rc, "%s", c->err);
        }
    return 0;
}

int edl_ps_client_open(const edl_ps_client_options *o, edl_ps_client **out, char *why,
                       size_t whylen)
{
    if (!o || !o->secret || o->secret->len == 0)
        return edl_errf(why, whylen, EDL_ECONFIG, "the parameter-server client needs the job "
                        "secret (EDL_JOB_SECRET_FILE)");
    if (o->n_servers < 1 || o->n_servers > 4096 || !o->endpoints)
        return edl_errf(why, whylen, EDL_EINVAL, "%d servers (1..4096)", o->n_servers);
    if (strlen(o->job ? o->job : "") >= 256)
        return edl_errf(why, whylen, EDL_EINVAL, "a job id over 255 bytes");
    if (o->lanes < 0 || o->lanes > EDL_PS_MAX_LANES)
        return edl_errf(why, whylen, EDL_EINVAL, "%d lanes (1..%d; 0: the default)", o->lanes,
                        EDL_PS_MAX_LANES);
    int cpus = edl_cpu_count(), k = o->lanes ? o->lanes : cpus < 4 ? cpus : 4;
    edl_ps_client *c = calloc(1, sizeof *c);
    if (!c || !(c->links = calloc((size_t)o->n_servers * (size_t)k, sizeof *c->links))) {
        free(c);
        return edl_errf(why, whylen, EDL_ENOMEM, "out of memory");
    }
    c->n = o->n_servers;
    c->k = k;
    c->nl = c->n * k;
    snprintf(c->job, sizeof c->job, "%s", o->job && *o->job ? o->job : "edl");
    c->secret = *o->secret;
    c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 30000;
    c->max_message = o->max_message ? o->max_message : EDL_PS_DEFAULT_MAX_MESSAGE;
    c->servers = o->servers;
    c->servers_arg = o->servers_arg;
    pthread_mutex_init(&c->map_mu_own, NULL);
    c->map_mu = &c->map_mu_own;
    atomic_init(&c->family_gen_own, o->generation);
    c->family_gen = &c->family_gen_own;
    if (RAND_bytes((unsigned char *)&c->token, sizeof c->token) != 1) {
        pthread_mutex_destroy(&c->map_mu_own);
        free(c->links);
        free(c);
        return edl_errf(why, whylen, EDL_EIO, "no random bytes for the client's token");
    }
    c->gen = o->generation;
    int rc = open_links(c, o, why, whylen);
    if (rc) {
        edl_ps_client_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

static void link_free(ps_link *l)
{
    if (l->fd >= 0)
        close(l->fd);
    free(l->ep);
    free(l->name);
    free(l->body);
    free(l->seg);
    free(l->iov);
    free(l->places);
}

void edl_ps_client_close(edl_ps_client *c)
{
    if (!c)
        return;
    for (int i = 0; c->links && i < c->nl; i++)
        link_free(&c->links[i]);
    for (int i = 0; i < EDL_PS_MAX_TABLES; i++)
        for (int j = 0; j < EDL_PS_MAX_REPLICAS; j++)
            free(c->tables[i].rep[j]), free(c->tables[i].lane[j]);
    free(c->links);
    free(c->ukeys), free(c->skeys), free(c->hkeys), free(c->uidx), free(c->rank);
    free(c->hslot), free(c->order), free(c->tmp), free(c->cnt), free(c->rows);
    free(c->plan_keys);
    pthread_mutex_destroy(&c->map_mu_own);
    edl_job_secret_clear(&c->secret);
    free(c);
}

const char *edl_ps_client_errmsg(const edl_ps_client *c)
{
    return c ? c->err : "no client";
}

void edl_ps_client_traffic(const edl_ps_client *c, uint64_t *sent, uint64_t *received)
{
    *sent = c->sent;
    *received = c->received;
}

/* Where each shard of t lives: its owner's server (pulls and pushes) and its backups' (pushes),
 * and their links for a call cut into lanes (lane shard % k: a dense piece of a few shards is
 * cut too). */
static int owner_map(edl_ps_client *c, client_table *t)
{
    const char *names[c->n];
    for (int i = 0; i < c->n; i++)
        names[i] = c->links[i].name;
    t->nrep = (int)t->cfg.replicas < c->n ? (int)t->cfg.replicas : c->n;
    for (int j = 0; j < EDL_PS_MAX_REPLICAS; j++) {
        free(t->rep[j]), free(t->lane[j]);
        t->rep[j] = j < t->nrep ? malloc(t->cfg.shards * sizeof *t->rep[j]) : NULL;
        t->lane[j] = j < t->nrep ? malloc(t->cfg.shards * sizeof *t->lane[j]) : NULL;
        if (j < t->nrep && (!t->rep[j] || !t->lane[j]))
            return fail(c, EDL_ENOMEM, "out of memory");
    }
    for (uint32_t s = 0; s < t->cfg.shards; s++) {
        int at[EDL_PS_MAX_REPLICAS];
        edl_ps_shard_replicas(names, c->n, s, t->nrep, at);
        for (int j = 0; j < t->nrep; j++) {
            t->rep[j][s] = at[j];
            t->lane[j][s] = lane_index(c, at[j], (int)(s % (uint32_t)c->k));
        }
    }
    return 0;
}

/* ---- elastic servers: following the map ----------------------------------------------------- */

/* A failure that another try may mend: a server busy for a moment, or (following a map) one
 * that does not serve the data any more or whose link broke. */
static bool retryable(const edl_ps_client *c, int rc)
{
    return rc == EDL_EBUSY ||
           (c->servers && (rc == EDL_EMOVED || rc == EDL_EPEER || rc == EDL_EUNAVAIL));
}

/* A call's deadline, shared by the tries (and the nested calls of a retry) of one call. */
static void follow_family(edl_ps_client *c);

/* The links of t's shards for a call of `amount` keys or floats: every lane of their servers
 * when that is at least per_link for each link, else the servers' first lanes. */
static int *const *split_links(const edl_ps_client *c, const client_table *t, uint64_t amount,
                               uint64_t per_link)
{
    return amount >= (uint64_t)c->nl * per_link ? t->lane : t->rep;
}

static bool call_begin(edl_ps_client *c)
{
    if (c->deadline)
        return false;
    c->deadline = edl_monotonic_ms() + c->timeout_ms;
    follow_family(c);
    return true;
}

static void call_end(edl_ps_client *c, bool own)
{
    if (own)
        c->deadline = 0;
}

/* rc = one try of a call (an expression), tried again while its failure is one a newer map or
 * a moment mends (retryable) and the call's deadline allows (settle): every call's loop. */
#define PS_WITH_RETRIES(c, rc, try_expr)                                                      \
    do {                                                                                       \
        bool own_ = call_begin(c);                                                             \
        while (((rc) = (try_expr)) && retryable((c), (rc)) && !((rc) = settle((c), (rc)))) {   \
        }                                                                                      \
        call_end((c), own_);                                                                   \
    } while (0)

/* A push's identity prefix for its next try: this client, the push, the map it goes by. */
static void push_id(const edl_ps_client *c, uint64_t seq, uint8_t out[PS_ID_PREFIX])
{
    edl_put64(out, c->token);
    edl_put64(out + 8, seq);
    edl_put64(out + 16, (uint64_t)c->gen);
}

/* Create every table this client knows on a link just opened. */
static int link_tables(edl_ps_client *c, ps_link *l)
{
    for (uint32_t id = 0; id < EDL_PS_MAX_TABLES; id++) {
        if (!c->tables[id].known)
            continue;
        uint8_t body[PS_CONFIG_BYTES];
        ps_config_encode(&c->tables[id].cfg, body);
        link_request(c, l, PS_CREATE, 0, id, &(struct iovec){body, sizeof body}, 1);
        link_expect(l, 0, NULL, 0);
        int rc = run_links(c);
        if (rc) {
            link_break(l);
            return rc;
        }
    }
    return 0;
}

/* Open the links that are down (a server back, or new in the map); a server's first lane
 * creates the tables there. */
static void relink(edl_ps_client *c)
{
    int64_t deadline = edl_monotonic_ms() + 2000;
    for (int i = 0; i < c->nl; i++)
        if (c->links[i].fd < 0 && link_open(c, &c->links[i], deadline) == 0 && i < c->n)
            link_tables(c, &c->links[i]);
}

/* Links for map m: those to the same server (name and endpoint) and lane are kept. */
static int apply_map(edl_ps_client *c, const edl_ps_servers *m)
{
    size_t nl = (size_t)m->n * (size_t)c->k;
    ps_link *links = calloc(nl, sizeof *links);
    bool ok = links != NULL;
    for (int i = 0; ok && i < m->n; i++)
        for (int j = 0; ok && j < c->k; j++) {
            ps_link *l = &links[lane_at(m->n, c->k, i, j)];
            l->fd = -1;
            ok = (l->ep = strdup(m->endpoints[i])) && (l->name = strdup(m->names[i]));
        }
    if (!ok) {
        for (size_t i = 0; links && i < nl; i++)
            link_free(&links[i]);
        free(links);
        return fail(c, EDL_ENOMEM, "out of memory for a map of %d servers", m->n);
    }
    for (int i = 0; i < m->n; i++)
        for (int s = 0; s < c->n; s++)
            for (int j = 0; j < c->k; j++) {
                ps_link *o = &c->links[lane_index(c, s, j)];
                ps_link *n = &links[lane_at(m->n, c->k, i, j)];
                if (o->fd < 0 || strcmp(o->ep, n->ep) || strcmp(o->name, n->name))
                    continue;
                ps_link kept = *o; /* its socket and buffers, under the new strings */
                kept.ep = n->ep, kept.name = n->name;
                *n = kept;
                *o = (ps_link){.fd = -1, .ep = o->ep, .name = o->name}; /* freed below */
            }
    for (int j = 0; j < c->nl; j++)
        link_free(&c->links[j]);
    free(c->links);
    c->links = links;
    c->n = m->n;
    c->nl = (int)nl;
    c->gen = m->generation;
    c->plan_shards = 0;
    for (int id = 0; id < EDL_PS_MAX_TABLES; id++)
        if (c->tables[id].known && owner_map(c, &c->tables[id]) != 0)
            return EDL_ENOMEM;
    return 0;
}

/* Follow a newer map when the source has one (EDL_ENOMEM), and tell the family. */
static int follow_map(edl_ps_client *c)
{
    edl_ps_servers m;
    int r = 0;
    pthread_mutex_lock(c->map_mu);
    if (c->servers && c->servers(c->servers_arg, c->gen, &m) == 1 && m.generation > c->gen &&
        m.n >= 1 && m.n <= EDL_PS_MAX_SERVERS)
        r = apply_map(c, &m); /* copies the map's strings */
    int64_t g = atomic_load(c->family_gen);
    while (r == 0 && g < c->gen && !atomic_compare_exchange_weak(c->family_gen, &g, c->gen)) {
    }
    pthread_mutex_unlock(c->map_mu);
    return r;
}

/* The source's newest map now, with links to its servers. */
static void follow_newest(edl_ps_client *c)
{
    int64_t was = c->gen;
    if (c->servers && follow_map(c) == 0 && c->gen != was)
        relink(c);
}

/* At a call's start: a member of the family follows a newer map already, so does this one. */
static void follow_family(edl_ps_client *c)
{
    if (c->servers && atomic_load(c->family_gen) > c->gen)
        follow_newest(c);
}

/* Between two tries of a call: wait a moment, follow a newer map if there is one, reopen the
 * links that are down. 0: try again; rc when the call's time is up. */
static int settle(edl_ps_client *c, int rc)
{
    if (edl_monotonic_ms() >= c->deadline)
        return rc;
    char err[sizeof c->err];
    memcpy(err, c->err, sizeof err);
    nanosleep(&(struct timespec){0, 20 * 1000000L}, NULL);
    int r = follow_map(c);
    if (r)
        return r;
    relink(c);
    memcpy(c->err, err, sizeof err); /* the failure that is being mended */
    return 0;
}

static int create_once(edl_ps_client *c, uint32_t table, const edl_ps_table_config *cfg)
{
    if (links_usable(c) != 0)
        return EDL_EPEER;
    uint8_t body[PS_CONFIG_BYTES];
    ps_config_encode(cfg, body);
    for (int i = 0; i < c->n; i++) {
        link_request(c, &c->links[i], PS_CREATE, 0, table, &(struct iovec){body, sizeof body},
                     1);
        link_expect(&c->links[i], 0, NULL, 0);
    }
    int rc = run_links(c);
    if (rc)
        return rc;
    c->tables[table].cfg = *cfg;
    c->tables[table].known = true;
    return owner_map(c, &c->tables[table]);
}

int edl_ps_create_table(edl_ps_client *c, uint32_t table, const edl_ps_table_config *cfg)
{
    char why[256];
    if (table >= EDL_PS_MAX_TABLES)
        return fail(c, EDL_EINVAL, "table id %u (0..%d)", table, EDL_PS_MAX_TABLES - 1);
    if (edl_ps_table_config_check(cfg, why, sizeof why) != 0)
        return fail(c, EDL_EINVAL, "table %u: %s", table, why);
    int rc;
    PS_WITH_RETRIES(c, rc, create_once(c, table, cfg));
    return rc;
}

static int stats_once(edl_ps_client *c, edl_ps_server_stats *out)
{
    if (links_usable(c) != 0)
        return EDL_EPEER;
    for (int i = 0; i < c->n; i++) {
        link_request(c, &c->links[i], PS_STATS, 0, 0, NULL, 0);
        link_expect(&c->links[i], 0, NULL, 0);
    }
    int rc = run_links(c);
    if (rc)
        return rc;
    *out = (edl_ps_server_stats){0};
    for (int i = 0; i < c->n; i++) {
        edl_ps_server_stats s;
        if (c->links[i].rh.len != PS_STATS_BYTES)
            return fail(c, EDL_EPROTO, "server %s: stats of %u bytes", c->links[i].ep,
                        c->links[i].rh.len);
        ps_stats_parse(c->links[i].body, &s);
        out->tables += s.tables, out->rows += s.rows, out->bytes += s.bytes;
        out->requests += s.requests, out->errors += s.errors;
        out->connections += s.connections, out->rejected += s.rejected;
        out->shards_in += s.shards_in, out->shards_out += s.shards_out;
        out->shards_lost += s.shards_lost, out->shards_restored += s.shards_restored;
        out->pushes += s.pushes;
    }
    return 0;
}

int edl_ps_stats(edl_ps_client *c, edl_ps_server_stats *out)
{
    int rc;
    PS_WITH_RETRIES(c, rc, stats_once(c, out));
    return rc;
}

static int shrink_once(edl_ps_client *c, uint32_t table, uint64_t token, uint64_t *evicted)
{
    uint8_t body[PS_SHRINK_BYTES];
    edl_put64(body, token);
    if (links_usable(c) != 0)
        return EDL_EPEER;
    for (int i = 0; i < c->n; i++) {
        link_request(c, &c->links[i], PS_SHRINK, 0, table, &(struct iovec){body, sizeof body},
                     1);
        link_expect(&c->links[i], 0, NULL, 0);
    }
    int rc = run_links(c);
    *evicted = 0;
    for (int i = 0; rc == 0 && i < c->n; i++) {
        if (c->links[i].rh.len != PS_SHRINK_REPLY_BYTES)
            return fail(c, EDL_EPROTO, "server %s: a shrink reply of %u bytes", c->links[i].ep,
                        c->links[i].rh.len);
        *evicted += edl_get64(c->links[i].body);
    }
    return rc;
}

int edl_ps_shrink(edl_ps_client *c, uint32_t table, uint64_t *evicted)
{
    const client_table *t = known_table(c, table, EDL_PS_SPARSE);
    uint64_t token, ev = 0;
    if (!t || t->cfg.accessor != EDL_PS_ACCESSOR_CTR)
        return t ? fail(c, EDL_EINVAL, "table %u has no CTR accessor: nothing to shrink", table)
                 : EDL_EINVAL;
    if (RAND_bytes((uint8_t *)&token, sizeof token) != 1) /* the same in every try */
        return fail(c, EDL_EIO, "no random bytes for the shrink's token");
    int rc;
    PS_WITH_RETRIES(c, rc, shrink_once(c, table, token, &ev));
    if (evicted)
        *evicted = rc ? 0 : ev;
    return rc;
}

/* ---- sparse -------------------------------------------------------------------------------- */

static bool realloc_to(void **p, size_t bytes)
{
    void *q = realloc(*p, bytes);
    if (q)
        *p = q;
    return q != NULL;
}

/* The per-key scratch of a call of n keys, a hash of hc slots and ncnt counters. */
static int sparse_scratch(edl_ps_client *c, size_t n, size_t hc, size_t ncnt)
{
    bool ok = true;
    if (n > c->ucap) {
        size_t cap = 256;
        while (cap < n)
            cap *= 2;
        size_t ecap = cap * EDL_PS_MAX_REPLICAS; /* a key's places: one per replica */
        ok = realloc_to((void **)&c->ukeys, cap * 8) && realloc_to((void **)&c->skeys, ecap * 8) &&
             realloc_to((void **)&c->uidx, cap * 4) && realloc_to((void **)&c->rank, ecap * 4) &&
             realloc_to((void **)&c->order, cap * 4) && realloc_to((void **)&c->tmp, cap * 4);
        c->ucap = ok ? cap : c->ucap;
    }
    if (ok && hc > c->hcap) {
        ok = realloc_to((void **)&c->hkeys, hc * 8) && realloc_to((void **)&c->hslot, hc * 4);
        c->hcap = ok ? hc : c->hcap;
    }
    if (ok && ncnt > c->cnt_cap) {
        ok = realloc_to((void **)&c->cnt, ncnt * 4);
        c->cnt_cap = ok ? ncnt : c->cnt_cap;
    }
    return ok ? 0 : fail(c, EDL_ENOMEM, "out of memory for a call of %zu keys", n);
}

/* Each distinct key once (c->ukeys, *nu of them; c->uidx[i]: keys[i]'s), placed once for each
 * of its shard's first nrep holders (1: the owner; a push, every replica at once) and ordered
 * by link, then shard: c->rank[r * nu + u] is the place of key u for replica r, c->skeys the
 * keys in that order, and every link's first and count say its share. A call of enough keys
 * goes on every lane of its servers (lane shard % lanes), a small one on the first. */
static int plan_sparse(edl_ps_client *c, const client_table *t, int nrep, const uint64_t *keys,
                       size_t n, size_t *nu_out)
{
    size_t hc = 16, nu = 0, shards = t->cfg.shards;
    if (c->plan_shards == shards && c->plan_rep == nrep && c->plan_n == n &&
        !memcmp(c->plan_keys, keys, n * 8)) {
        *nu_out = c->plan_nu; /* the owner maps of tables of as many shards are the same */
        return 0;
    }
    c->plan_shards = 0;
    while (hc < 2 * n)
        hc *= 2;
    int rc = sparse_scratch(c, n, hc, (shards > (size_t)c->nl ? shards : (size_t)c->nl) + 1);
    if (rc)
        return rc;
    memset(c->hslot, 0, hc * sizeof *c->hslot);
    for (size_t i = 0; i < n; i++) {
        size_t j = ps_mix64(keys[i]) & (hc - 1);
        while (c->hslot[j] && c->hkeys[j] != keys[i])
            j = (j + 1) & (hc - 1);
        if (!c->hslot[j]) {
            c->hkeys[j] = keys[i];
            c->ukeys[nu] = keys[i];
            c->hslot[j] = (uint32_t)++nu;
        }
        c->uidx[i] = c->hslot[j] - 1;
    }
    /* counting sort by shard, then (stable) by holder */
    memset(c->cnt, 0, (shards + 1) * sizeof *c->cnt);
    for (size_t u = 0; u < nu; u++)
        c->cnt[(c->tmp[u] = edl_ps_key_shard(c->ukeys[u], (uint32_t)shards)) + 1]++;
    for (size_t s = 0; s < shards; s++)
        c->cnt[s + 1] += c->cnt[s];
    for (size_t u = 0; u < nu; u++)
        c->order[c->cnt[c->tmp[u]]++] = (uint32_t)u;
    int *const *link = split_links(c, t, n, PS_LANE_MIN_KEYS);
    memset(c->cnt, 0, ((size_t)c->nl + 1) * sizeof *c->cnt);
    for (size_t u = 0; u < nu; u++)
        for (int r = 0; r < nrep; r++)
            c->cnt[link[r][c->tmp[u]] + 1]++;
    for (int i = 0; i < c->nl; i++) {
        c->cnt[i + 1] += c->cnt[i];
        c->links[i].first = c->cnt[i];
        c->links[i].count = c->cnt[i + 1] - c->cnt[i];
    }
    for (size_t k = 0; k < nu; k++) {
        uint32_t u = c->order[k];
        for (int r = 0; r < nrep; r++) {
            uint32_t at = c->cnt[link[r][c->tmp[u]]]++;
            c->rank[(size_t)r * nu + u] = at;
            c->skeys[at] = c->ukeys[u];
        }
    }
    *nu_out = nu;
    uint64_t *kept = grow(c->plan_keys, &c->plan_cap, n, 8);
    if (kept) { /* else no plan is kept, and the old array stays for close to free */
        c->plan_keys = kept;
        memcpy(c->plan_keys, keys, n * 8);
        c->plan_n = n;
        c->plan_nu = nu;
        c->plan_shards = (uint32_t)shards;
        c->plan_rep = nrep;
    }
    return 0;
}

static int rows_scratch(edl_ps_client *c, size_t floats)
{
    if (!(c->rows = grow(c->rows, &c->rows_cap, floats ? floats : 1, sizeof(float))))
        return fail(c, EDL_ENOMEM, "out of memory for %zu floats", floats);
    return 0;
}

static int check_size(edl_ps_client *c, const ps_link *l, uint64_t bytes, const char *what)
{
    if (bytes <= c->max_message)
        return 0;
    return fail(c, EDL_ETOOBIG, "a %s of %zu keys for server %s takes %llu bytes, over "
                "max_message (%u): send fewer keys per call", what, l->count, l->ep,
                (unsigned long long)bytes, c->max_message);
}

static int sparse_call(edl_ps_client *c, uint32_t table, uint32_t dim, bool push,
                       const ps_call_mode *m, uint64_t seq)
{
    uint8_t id[PS_ID_PREFIX];
    push_id(c, seq, id);
    for (int i = 0; i < c->nl; i++) {
        ps_link *l = &c->links[i];
        if (!l->count)
            continue;
        uint64_t req = m->len + 8 + 8 * (uint64_t)l->count +
                       (push ? PS_ID_PREFIX + 4 * (uint64_t)l->count * dim : 0);
        uint64_t rep = push ? 0 : 8 + 4 * (uint64_t)l->count * dim;
        int rc = check_size(c, l, req > rep ? req : rep, push ? "push" : "pull");
        if (rc)
            return rc;
    }
    for (int i = 0; i < c->nl; i++) {
        ps_link *l = &c->links[i];
        if (!l->count)
            continue;
        float *rows = c->rows + l->first * dim;
        size_t rbytes = l->count * dim * sizeof(float);
        edl_put32(l->pre, (uint32_t)l->count);
        edl_put32(l->pre + 4, push ? dim : 0);
        struct iovec parts[] = {{id, push ? sizeof id : 0}, {(void *)m->prefix, m->len},
                                {l->pre, 8}, {c->skeys + l->first, l->count * 8},
                                {push ? rows : NULL, push ? rbytes : 0}};
        link_request(c, l, push ? PS_PUSH_SPARSE : PS_PULL_SPARSE, m->flags, table, parts, 5);
        link_expect(l, push ? 0 : 8, push ? NULL : rows, push ? 0 : rbytes);
    }
    int rc = run_links(c);
    for (int i = 0; rc == 0 && !push && i < c->nl; i++) {
        ps_link *l = &c->links[i];
        if (l->count && (edl_get32(l->rpre) != l->count || edl_get32(l->rpre + 4) != dim))
            rc = fail(c, EDL_EPROTO, "server %s answered %u rows of %u floats for %zu of %u",
                      l->ep, edl_get32(l->rpre), edl_get32(l->rpre + 4), l->count, dim);
    }
    return rc;
}

static int pull_sparse_once(edl_ps_client *c, uint32_t table, const uint64_t *keys, size_t n,
                            float *out)
{
    const client_table *t = known_table(c, table, EDL_PS_SPARSE);
    size_t nu, dim = t ? t->cfg.dim : 0;
    int rc = !t ? EDL_EINVAL : links_usable(c) ? EDL_EPEER : 0;
    if (rc || n == 0)
        return rc;
    if ((rc = plan_sparse(c, t, 1, keys, n, &nu)) || (rc = rows_scratch(c, nu * dim)) ||
        (rc = sparse_call(c, table, (uint32_t)dim, false, &plain_call, 0)))
        return rc;
    for (size_t i = 0; i < n; i++)
        memcpy(out + i * dim, c->rows + (size_t)c->rank[c->uidx[i]] * dim, dim * sizeof *out);
    return 0;
}

int edl_ps_pull_sparse(edl_ps_client *c, uint32_t table, const uint64_t *keys, size_t n,
                       float *out)
{
    int rc;
    PS_WITH_RETRIES(c, rc, pull_sparse_once(c, table, keys, n, out));
    return rc;
}

static int push_sparse_once(edl_ps_client *c, uint32_t table, const uint64_t *keys, size_t n,
                            const float *grads, const ps_call_mode *m, uint64_t seq)
{
    const client_table *t = known_table(c, table, EDL_PS_SPARSE);
    size_t nu, dim = t ? ps_push_width(&t->cfg) : 0; /* floats a key: CTR, dim + 2 */
    int rc = !t ? EDL_EINVAL : links_usable(c) ? EDL_EPEER : 0;
    if (rc || n == 0)
        return rc;
    /* one request per server: the keys it holds as owner or backup (replicas side by side) */
    if ((rc = plan_sparse(c, t, t->nrep, keys, n, &nu)) ||
        (rc = rows_scratch(c, nu * (size_t)t->nrep * dim)))
        return rc;
    memset(c->rows, 0, nu * (size_t)t->nrep * dim * sizeof *c->rows);
    for (size_t i = 0; i < n; i++) { /* a repeated key's gradients are summed */
        float *dst = c->rows + (size_t)c->rank[c->uidx[i]] * dim;
        for (size_t j = 0; j < dim; j++)
            dst[j] += grads[i * dim + j];
    }
    for (int r = 1; r < t->nrep; r++) /* the backups' copies of the sums */
        for (size_t u = 0; u < nu; u++)
            memcpy(c->rows + (size_t)c->rank[(size_t)r * nu + u] * dim,
                   c->rows + (size_t)c->rank[u] * dim, dim * sizeof *c->rows);
    return sparse_call(c, table, (uint32_t)dim, true, m, seq);
}

/* A push is sent again whole until every server has it: those that had it already know
 * it by its sequence number and apply it no second time. */
int ps_client_push_sparse_mode(edl_ps_client *c, uint32_t table, const uint64_t *keys,
                               size_t n, const float *grads, const ps_call_mode *m)
{
    uint64_t seq = ++c->seq;
    int rc;
    PS_WITH_RETRIES(c, rc, push_sparse_once(c, table, keys, n, grads, m, seq));
    return rc;
}

int edl_ps_push_sparse(edl_ps_client *c, uint32_t table, const uint64_t *keys, size_t n,
                       const float *grads)
{
    return ps_client_push_sparse_mode(c, table, keys, n, grads, &plain_call);
}

/* ---- dense --------------------------------------------------------------------------------- */

/* [a, b) onto l's segment list: it extends the last segment when it continues it. */
static int dense_segment(edl_ps_client *c, ps_link *l, uint64_t a, uint64_t b)
{
    uint64_t lo, len;
    if (l->nseg && (ps_segment_get(l->seg, l->nseg - 1, &lo, &len), lo + len == a)) {
        ps_segment_put(l->seg, l->nseg - 1, lo, len + (b - a));
    } else {
        if (!(l->seg = grow(l->seg, &l->seg_cap, 16 * ((size_t)l->nseg + 1), 1)))
            return fail(c, EDL_ENOMEM, "out of memory");
        ps_segment_put(l->seg, l->nseg++, a, b - a);
    }
    l->total += b - a;
    return 0;
}

/* Cut [off, off + n) at shard boundaries; each piece goes to the segment lists of its shard's
 * first nrep holders (1: the owner; a push, every replica at once). */
static int plan_dense(edl_ps_client *c, const client_table *t, int nrep, uint64_t off,
                      uint64_t n)
{
    const edl_ps_table_config *cfg = &t->cfg;
    c->plan_shards = 0; /* the links' first and count are about to change */
    for (int i = 0; i < c->nl; i++)
        c->links[i].nseg = 0, c->links[i].total = 0;
    int *const *link = split_links(c, t, n, PS_LANE_MIN_FLOATS);
    uint32_t s0 = edl_ps_dense_shard(off, cfg->size, cfg->shards);
    uint32_t s1 = edl_ps_dense_shard(off + n - 1, cfg->size, cfg->shards);
    for (int r = 0; r < nrep; r++)
        for (uint32_t s = s0; s <= s1; s++) {
            uint64_t a = edl_ps_dense_shard_start(cfg->size, cfg->shards, s);
            uint64_t b = a + edl_ps_dense_shard_len(cfg->size, cfg->shards, s);
            a = a > off ? a : off;
            b = b < off + n ? b : off + n;
            if (a < b && dense_segment(c, &c->links[link[r][s]], a, b) != 0)
                return EDL_ENOMEM;
        }
    for (int i = 0; i < c->nl; i++)
        c->links[i].count = c->links[i].total; /* for check_size's message */
    return 0;
}

/* l's request parts: `head` left for the request's head, then the places of its segments'
 * values in the caller's range (whose first element is off): a push is sent from them and a
 * pull's reply lands in them, with no copy between. */
static int dense_places(edl_ps_client *c, ps_link *l, uint64_t off, float *range, int head)
{
    size_t cap = l->places_cap;
    struct iovec *v = grow(l->places, &cap, (size_t)head + l->nseg, sizeof *v);
    if (!v)
        return fail(c, EDL_ENOMEM, "out of memory for %u segments", l->nseg);
    l->places = v;
    l->places_cap = cap;
    if (link_room(c, l, head + (int)l->nseg) != 0)
        return EDL_ENOMEM;
    for (uint32_t k = 0; k < l->nseg; k++) {
        uint64_t a, len;
        ps_segment_get(l->seg, k, &a, &len);
        v[head + k] = (struct iovec){range + (a - off), len * sizeof *range};
    }
    return 0;
}

static int dense_call(edl_ps_client *c, uint32_t table, bool push, const ps_call_mode *m,
                      uint64_t seq, uint64_t off, float *range)
{
    uint8_t id[PS_ID_PREFIX];
    push_id(c, seq, id);
    for (int i = 0; i < c->nl; i++) { /* everything checked and made room for, then sent */
        ps_link *l = &c->links[i];
        int rc = l->nseg ? check_size(c, l, PS_ID_PREFIX + m->len + 8 + 16 * (uint64_t)l->nseg +
                                      4 * l->total, push ? "dense push" : "dense pull") : 0;
        if (rc || (l->nseg && (rc = dense_places(c, l, off, range, 4)) != 0))
            return rc;
    }
    for (int i = 0; i < c->nl; i++) {
        ps_link *l = &c->links[i];
        struct iovec *v = l->places;
        if (!l->nseg)
            continue;
        edl_put32(l->pre, l->nseg);
        edl_put32(l->pre + 4, 0);
        v[0] = (struct iovec){id, push ? sizeof id : 0};
        v[1] = (struct iovec){(void *)m->prefix, m->len};
        v[2] = (struct iovec){l->pre, 8};
        v[3] = (struct iovec){l->seg, 16 * (size_t)l->nseg};
        link_request(c, l, push ? PS_PUSH_DENSE : PS_PULL_DENSE, m->flags, table, v,
                     push ? 4 + (int)l->nseg : 4);
        link_expect_iov(l, 0, push ? NULL : v + 4, push ? 0 : (int)l->nseg,
                        push ? 0 : l->total * sizeof(float));
    }
    return run_links(c);
}

/* One piece of a dense call, tried until it is applied, fails for good or the call's time is
 * up. */
static int dense_piece(edl_ps_client *c, uint32_t table, uint64_t off, uint64_t n,
                       float *range, bool push, const ps_call_mode *m)
{
    const client_table *t = &c->tables[table];
    uint64_t seq = push ? ++c->seq : 0; /* each piece a push of its own */
    for (;;) { /* a push goes to every holder at once: its owner's and backups' segments */
        int rc = links_usable(c) ? EDL_EPEER : 0;
        if (rc == 0 && (rc = plan_dense(c, t, push ? t->nrep : 1, off, n)) == 0)
            rc = dense_call(c, table, push, m, seq, off, range);
        if (rc == 0 || !retryable(c, rc) || (rc = settle(c, rc)) != 0)
            return rc;
    }
}

static int dense_op(edl_ps_client *c, uint32_t table, uint64_t off, uint64_t n, float *range,
                    bool push, const ps_call_mode *m)
{
    const client_table *t = known_table(c, table, EDL_PS_DENSE);
    int rc = !t ? EDL_EINVAL : 0;
    if (rc || n == 0)
        return rc;
    if (off > t->cfg.size || n > t->cfg.size - off)
        return fail(c, EDL_EINVAL, "[%llu, %llu) is outside dense table %u (%llu floats)",
                    (unsigned long long)off, (unsigned long long)(off + n), table,
                    (unsigned long long)t->cfg.size);
    /* a range goes in pieces of about PS_DENSE_PIECE floats a link (each element is in one piece,
     * so a push still applies each gradient once): the buffers of both sides stay in cache
     * and small; at most max_message / 8 floats, which leaves room for the segments of up to
     * EDL_PS_MAX_SHARDS shards */
    uint64_t piece = (uint64_t)PS_DENSE_PIECE * (uint64_t)c->nl;
    piece = piece < c->max_message / 8 ? piece : c->max_message / 8;
    bool own = call_begin(c);
    for (uint64_t done = 0; rc == 0 && done < n; done += piece)
        rc = dense_piece(c, table, off + done, n - done < piece ? n - done : piece, range + done,
                         push, m);
    call_end(c, own);
    return rc;
}

int edl_ps_pull_dense(edl_ps_client *c, uint32_t table, uint64_t off, uint64_t n, float *out)
{
    return dense_op(c, table, off, n, out, false, &plain_call);
}

int ps_client_push_dense_mode(edl_ps_client *c, uint32_t table, uint64_t off, uint64_t n,
                              const float *grads, const ps_call_mode *m)
{
    return dense_op(c, table, off, n, (float *)grads, true, m);
}

int edl_ps_push_dense(edl_ps_client *c, uint32_t table, uint64_t off, uint64_t n,
                      const float *grads)
{
    return dense_op(c, table, off, n, (float *)grads, true, &plain_call);
}

/* ---- the modes' calls ---------------------------------------------------------------------- */

int ps_client_lanes(const edl_ps_client *c)
{
    return c->k;
}

const edl_ps_table_config *ps_client_table(const edl_ps_client *c, uint32_t table)
{
    return table < EDL_PS_MAX_TABLES && c->tables[table].known ? &c->tables[table].cfg : NULL;
}

int ps_client_clone(const edl_ps_client *c, edl_ps_client **out, char *why, size_t whylen)
{
    const char **eps = calloc((size_t)c->n, sizeof *eps), **names = calloc((size_t)c->n,
                                                                           sizeof *names);
    int rc = eps && names ? 0 : edl_errf(why, whylen, EDL_ENOMEM, "out of memory");
    for (int i = 0; rc == 0 && i < c->n; i++)
        eps[i] = c->links[i].ep, names[i] = c->links[i].name;
    edl_ps_client_options o = {.endpoints = eps, .names = names, .n_servers = c->n,
                               .job = c->job, .secret = &c->secret, .timeout_ms = c->timeout_ms,
                               .max_message = c->max_message, .lanes = c->k,
                               .servers = c->servers, .servers_arg = c->servers_arg,
                               .generation = c->gen};
    if (rc == 0)
        rc = edl_ps_client_open(&o, out, why, whylen);
    if (rc == 0) /* one family: one map source, one caller at a time, one newest map */
        (*out)->map_mu = c->map_mu, (*out)->family_gen = c->family_gen;
    free(eps);
    free(names);
    return rc;
}

int ps_client_know_table(edl_ps_client *c, uint32_t table, const edl_ps_table_config *cfg)
{
    client_table *t = &c->tables[table];
    if (t->known)
        return 0;
    t->cfg = *cfg;
    int rc = owner_map(c, t);
    t->known = rc == 0;
    return rc;
}

static int barrier_once(edl_ps_client *c, uint32_t space, const ps_arrival *who, uint64_t step,
                        uint32_t trainers, bool *applied, uint64_t *done)
{
    uint8_t body[PS_BARRIER_BYTES];
    edl_put64(body, who->token);
    edl_put64(body + 8, step);
    edl_put32(body + 16, trainers);
    edl_put32(body + 20, who->generation);
    if (links_usable(c) != 0)
        return EDL_EPEER;
    for (int i = 0; i < c->n; i++) {
        link_request(c, &c->links[i], PS_BARRIER, 0, space, &(struct iovec){body, sizeof body},
                     1);
        link_expect(&c->links[i], 0, NULL, 0);
    }
    int rc = run_links(c);
    *applied = true;
    *done = UINT64_MAX;
    for (int i = 0; rc == 0 && i < c->n; i++) {
        ps_link *l = &c->links[i];
        if (l->rh.len != PS_BARRIER_REPLY_BYTES)
            return fail(c, EDL_EPROTO, "server %s: a barrier reply of %u bytes", l->ep,
                        l->rh.len);
        *applied &= edl_get32(l->body) == 1;
        uint64_t d = edl_get64(l->body + 8);
        *done = d < *done ? d : *done;
    }
    return rc;
}

int ps_client_barrier(edl_ps_client *c, uint32_t space, const ps_arrival *who, uint64_t step,
                      uint32_t trainers, bool *applied, uint64_t *done)
{
    int rc;
    /* every trainer at the barrier asks the same servers: those of the newest map (a client
     * that only pulled since a map changed has not been told by a refusal) */
    follow_newest(c);
    PS_WITH_RETRIES(c, rc, barrier_once(c, space, who, step, trainers, applied, done));
    return rc;
}

int ps_client_wait_barrier(edl_ps_client *c, uint32_t space, const ps_arrival *who, uint64_t step,
                           uint32_t (*trainers)(void *arg), void *arg, uint64_t *done)
{
    bool applied = false;
    int rc = 0;
    while (rc == 0 && !applied) {
        rc = ps_client_barrier(c, space, who, step, trainers(arg), &applied, done);
        if (step == UINT64_MAX)
            break;
    }
    return rc;
}

/* One round of GEO pulls on every link; *more when a server had rows left. */
static int geo_round(edl_ps_client *c, uint32_t table, uint32_t trainer, uint32_t dim,
                     void (*fn)(void *, uint64_t, const float *), void *arg, bool *more)
{
    uint32_t max = (c->max_message - PS_GEO_PULL_PREFIX) / (8 + 4 * dim);
    uint8_t body[PS_GEO_PULL_BYTES];
    edl_put32(body, trainer);
    edl_put32(body + 4, max);
    for (int i = 0; i < c->n; i++) {
        link_request(c, &c->links[i], PS_GEO_PULL, 0, table,
                     &(struct iovec){body, sizeof body}, 1);
        link_expect(&c->links[i], 0, NULL, 0);
    }
    int rc = run_links(c);
    *more = false;
    for (int i = 0; i < c->n; i++) { /* the rows a server took out are delivered, always */
        ps_link *l = &c->links[i];
        const uint8_t *b = l->body;
        if (l->rc)
            continue;
        uint32_t n = l->rh.len >= PS_GEO_PULL_PREFIX ? edl_get32(b) : 0;
        if (l->rh.len < PS_GEO_PULL_PREFIX || edl_get32(b + 4) != dim ||
            l->rh.len != PS_GEO_PULL_PREFIX + (uint64_t)n * (8 + 4 * dim))
            return fail(c, EDL_EPROTO, "server %s: a GEO reply of %u bytes", l->ep, l->rh.len);
        *more |= edl_get32(b + 8) != 0;
        const uint8_t *keys = b + PS_GEO_PULL_PREFIX, *rows = keys + 8 * (size_t)n;
        float row[EDL_PS_MAX_DIM];
        for (uint32_t k = 0; k < n; k++) {
            memcpy(row, rows + 4 * (size_t)dim * k, 4 * (size_t)dim);
            fn(arg, edl_get64(keys + 8 * (size_t)k), row);
        }
    }
    return rc;
}

int ps_client_geo_pull(edl_ps_client *c, uint32_t table, uint32_t trainer,
                       void (*fn)(void *arg, uint64_t key, const float *row), void *arg)
{
    const client_table *t = known_table(c, table, EDL_PS_SPARSE);
    if (!t)
        return EDL_EINVAL;
    bool own = call_begin(c), more = true;
    int rc;
    do {
        more = true;
        rc = links_usable(c) ? EDL_EPEER : 0;
        while (rc == 0 && more)
            rc = geo_round(c, table, trainer, t->cfg.dim, fn, arg, &more);
    } while (rc && retryable(c, rc) && !(rc = settle(c, rc)));
    call_end(c, own);
    return rc;
}

/* ---- PS checkpoints ------------------------------------------------------------------------- */

static int save_once(edl_ps_client *c, int64_t step)
{
    if (links_usable(c) != 0)
        return EDL_EPEER;
    uint8_t body[PS_SAVE_BYTES * 64];
    int n = c->n < 64 ? c->n : 64, rc = 0;
    for (int base = 0; rc == 0 && base < c->n; base += n) { /* 64 links at a time */
        for (int i = base; i < c->n && i < base + n; i++) {
            uint8_t *b = body + PS_SAVE_BYTES * (size_t)(i - base);
            edl_put64(b, (uint64_t)step);
            edl_put64(b + 8, (uint64_t)c->gen);
            edl_put32(b + 16, (uint32_t)i);
            edl_put32(b + 20, (uint32_t)c->n);
            link_request(c, &c->links[i], PS_SAVE, 0, 0, &(struct iovec){b, PS_SAVE_BYTES}, 1);
            link_expect(&c->links[i], 0, NULL, 0);
        }
        rc = run_links(c);
    }
    return rc;
}

int edl_ps_save(edl_ps_client *c, int64_t step)
{
    if (step < 0)
        return fail(c, EDL_EINVAL, "checkpoint step %lld", (long long)step);
    int rc;
    PS_WITH_RETRIES(c, rc, save_once(c, step));
    return rc;
}

/* ---- server to server ---------------------------------------------------------------------- */

int ps_client_put_shard(edl_ps_client *c, uint32_t table, const edl_ps_table_config *cfg,
                        uint32_t shard, int64_t gen, const uint8_t *blob, size_t len)
{
    ps_link *l = &c->links[0];
    if (links_usable(c) != 0)
        return EDL_EPEER;
    if (PS_PUT_PREFIX + len > c->max_message)
        return fail(c, EDL_ETOOBIG, "shard %u of table %u takes %zu bytes, over max_message "
                    "(%u)", shard, table, len, c->max_message);
    uint8_t pre[PS_PUT_PREFIX] = {0};
    edl_put64(pre, (uint64_t)gen);
    edl_put32(pre + 8, shard);
    ps_config_encode(cfg, pre + 16);
    struct iovec parts[] = {{pre, sizeof pre}, {(void *)blob, len}};
    link_request(c, l, PS_PUT_SHARD, 0, table, parts, 2);
    link_expect(l, 0, NULL, 0);
    return run_links(c);
}

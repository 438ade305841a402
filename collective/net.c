/* net.c: the TCP side of the CPU group. One listening socket per process (kept across
 * generations), a full mesh of connections per generation (each rank connects to the lower
 * ranks and accepts the higher ones; each link is authenticated with the job secret by a
 * challenge-response, and the join ends with a ready frame both ways on every link), and the
 * engine: coll_stream_run moves a stream of blocks to one peer
 * while another comes in from another peer (a ring or chain step after step; coll_sendrecv is
 * one block each way), on non-blocking sockets, behind a header that the receiver checks. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "edl/http.h"
#include "edl/log.h"
#include "edl/net.h"
#include "internal.h"

int coll_listen(edl_comm *c)
{
    int rc = edl_net_listen(c->listen_addr, 0, &c->lfd, &c->lport);
    if (rc == EDL_ECONFIG)
        coll_set_err(c, "cannot resolve the address to listen on, '%s'", c->listen_addr);
    else if (rc)
        coll_set_err(c, "cannot listen on %s: %s", c->listen_addr, strerror(errno));
    return rc;
}

void coll_close_peers(edl_comm *c)
{
    for (int i = 0; c->fds && i < c->size; i++)
        if (c->fds[i] >= 0) {
            close(c->fds[i]);
            c->fds[i] = -1;
        }
}

static int new_nonce(edl_comm *c, uint8_t nonce[COLL_NONCE_BYTES])
{
    if (RAND_bytes(nonce, COLL_NONCE_BYTES) == 1)
        return 0;
    coll_set_err(c, "no random bytes for a handshake nonce (OpenSSL RAND_bytes failed)");
    return EDL_EIO;
}

enum {
    CONNECT_TRY_MS = 250, /* a connection's first try at its SYN and hello; doubled, to 2 s */
};

static int mac_of(edl_comm *c, const coll_link *l, enum coll_mac_kind kind, uint8_t *out)
{
    int rc = coll_link_mac(&c->secret, c->keys.job, l, kind, out);
    if (rc)
        coll_set_err(c, "cannot compute a link MAC (no job secret?)");
    return rc;
}

/* Read rank j's challenge on fd. An attempt that the acceptor's kernel has not taken by
 * try_until (the hello unacknowledged: its accept queue overflowed under a flood, and TCP's
 * own retransmissions would wait seconds, doubling) ends there with EDL_EPEER, for a fresh
 * connection (EDL_EBUSY); one it holds waits for the acceptor until the join's deadline. */
static int read_challenge(int fd, uint8_t *ch, size_t chlen, int64_t try_until, int64_t deadline)
{
    int rc = edl_net_wait(fd, POLLIN, try_until);
    if (rc == EDL_ETIMEDOUT && try_until < deadline && edl_net_unacked(fd))
        return EDL_EBUSY;
    return rc && rc != EDL_ETIMEDOUT ? rc : edl_net_read_all(fd, ch, chlen, deadline);
}

/* One connection to rank j and the connector's side of the handshake, the connection's own
 * part (its SYN answered, its hello taken by the acceptor's kernel) within try_ms. EDL_EPEER
 * when the acceptor dropped the connection before its challenge, or did not take it in time:
 * worth a retry. */
static int handshake_to(edl_comm *c, int j, const struct sockaddr_storage *sa, socklen_t salen,
                        uint64_t token, int64_t try_ms, int64_t deadline, int *out)
{
    int64_t try_until = edl_monotonic_ms() + try_ms;
    try_until = try_until < deadline ? try_until : deadline;
    int fd = -1, rc = edl_net_dial_addr((const struct sockaddr *)sa, salen, try_until, &fd);
    coll_link *l = &c->links[j];
    *l = (coll_link){.h = {.version = COLL_PROTO_VERSION, .generation = c->gen,
                           .from = c->rank, .to = j, .size = c->size, .token = token}};
    uint8_t hello[COLL_HELLO_BYTES], ch[64], mac[EDL_SECRET_MAC_BYTES], want[EDL_SECRET_MAC_BYTES];
    if (rc == EDL_ETIMEDOUT && try_until < deadline) {
        coll_set_err(c, "rank %d did not answer a connection in %lld ms", j, (long long)try_ms);
        return EDL_EPEER;
    }
    if (rc != 0) {
        coll_set_err(c, "cannot connect to rank %d: %s", j, strerror(errno));
        return rc == EDL_EIO ? rc : EDL_ECLOSED; /* not retried */
    }
    if ((rc = new_nonce(c, l->h.nonce)) != 0) {
        close(fd);
        return rc;
    }
    coll_hello_encode(&l->h, hello);
    size_t chlen = coll_frame_bytes(COLL_CHALLENGE_MAGIC);
    if ((rc = edl_net_write_all(fd, hello, sizeof hello, deadline)) == 0)
        rc = read_challenge(fd, ch, chlen, try_until, deadline);
    if (rc == EDL_EBUSY) {
        coll_set_err(c, "rank %d's host did not take the connection in %lld ms (its listen "
                     "queue full?)", j, (long long)try_ms);
        struct linger reset = {.l_onoff = 1, .l_linger = 0}; /* an RST: its kernel forgets it */
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
        rc = EDL_EPEER;
    } else if (rc) {
        coll_set_err(c, "rank %d closed the connection before its challenge (%s)", j,
                     edl_strerror(rc));
    } else if (coll_frame_parse(ch, chlen, COLL_CHALLENGE_MAGIC, l->nonce_a, mac) != 0) {
        coll_set_err(c, "rank %d answered the hello with something that is not a challenge of "
                     "protocol version %d", j, COLL_PROTO_VERSION);
        rc = EDL_EAUTH;
    } else if ((rc = mac_of(c, l, COLL_MAC_CHALLENGE, want)) == 0 &&
               !edl_job_secret_mac_equal(mac, want)) {
        coll_set_err(c, "rank %d did not prove that it holds this job's secret (from %s): the "
                     "processes were given different secrets, or its endpoint in etcd is not "
                     "an edl process of this job", j, c->secret.source);
        rc = EDL_EAUTH;
    }
    if (!rc && (rc = mac_of(c, l, COLL_MAC_PROOF, mac)) == 0) {
        coll_frame_encode(COLL_PROOF_MAGIC, NULL, mac, ch);
        if (edl_net_write_all(fd, ch, coll_frame_bytes(COLL_PROOF_MAGIC), deadline) != 0) {
            coll_set_err(c, "rank %d closed the connection during the handshake", j);
            rc = EDL_EPEER;
        }
    }
    if (rc) {
        close(fd);
        return rc;
    }
    *out = fd;
    return 0;
}

/* Connect to rank j at c->addrs[j] and authenticate (*fd: the link). A connection the
 * acceptor dropped before challenging it (it had too many unauthenticated connections: see
 * take_new) is tried again, after edl's jittered back-off, until the deadline or until the
 * generation is declared dead. */
static int link_to(edl_comm *c, int j, uint64_t token, int64_t deadline, int *fd)
{
    const coll_addr *a = &c->addrs[j];
    for (int attempt = 0;; attempt++) {
        int64_t try_ms = (int64_t)CONNECT_TRY_MS << (attempt < 3 ? attempt : 3);
        int rc = handshake_to(c, j, &a->sa, a->len, token, try_ms, deadline, fd);
        int64_t nap = edl_http_backoff_ms(attempt, 20, 200, -1);
        if (rc != EDL_EPEER || edl_monotonic_ms() + nap >= deadline || coll_dead_announced(c))
            return rc;
        if (attempt == 0)
            EDL_INFO("coll", "generation %" PRId64 ": %s; trying again", c->gen, c->err);
        usleep((useconds_t)nap * 1000);
    }
}

/* Connect to rank j and authenticate. */
static int connect_peer(edl_comm *c, int j, const char *ep, uint64_t token, int64_t deadline)
{
    coll_addr *a = &c->addrs[j];
    a->len = sizeof a->sa;
    if (edl_net_resolve(ep, &a->sa, &a->len) != 0) {
        coll_set_err(c, "generation %" PRId64 ": rank %d published an endpoint that does not "
                     "resolve, '%s'", c->gen, j, ep);
        return EDL_EPROTO;
    }
    int fd = -1, rc = link_to(c, j, token, deadline, &fd);
    if (rc) {
        char why[sizeof c->err];
        snprintf(why, sizeof why, "%s", c->err);
        coll_set_err(c, "generation %" PRId64 ": rank %d at %s: %s", c->gen, j, ep, why);
        return rc == EDL_EAUTH || rc == EDL_EIO ? rc : EDL_EPEER;
    }
    c->fds[j] = fd;
    return 0;
}

/* An accepted connection that has not proved itself yet. */
typedef struct pending {
    int fd;
    int64_t until;     /* its handshake deadline */
    bool challenged;   /* the hello was good and the challenge sent: reading the proof */
    size_t got;
    uint8_t buf[COLL_HELLO_BYTES];
    coll_link link;
    char from[64];
    uint8_t src[EDL_ADDR_KEY_BYTES]; /* its source (edl_peer_key) */
} pending;

/* The addresses the higher ranks connect from (their published endpoints' hosts): their
 * connections are not evicted for a stranger's while the mesh forms. */
typedef struct members {
    uint8_t (*key)[EDL_ADDR_KEY_BYTES];
    int n;
} members;

/* Does a well-formed hello fit this rank's generation? (why it does not is logged) */
static bool hello_fits(edl_comm *c, const pending *p, const coll_hello *h, uint64_t my_token)
{
    if (h->generation != c->gen) {
        EDL_INFO("coll", "a connection from %s for generation %" PRId64 " while this rank is in "
                 "generation %" PRId64 ": closed", p->from, h->generation, c->gen);
        return false;
    }
    if (h->to != c->rank || h->size != c->size || h->from <= c->rank || h->token != my_token) {
        EDL_WARN("coll", "a hello from %s does not fit generation %" PRId64 " (from rank %d to "
                 "rank %d of %d; this is rank %d of %d%s): closed", p->from, c->gen, h->from,
                 h->to, h->size, c->rank, c->size, h->token != my_token ? "; wrong token" : "");
        return false;
    }
    if (c->fds[h->from] >= 0) {
        EDL_WARN("coll", "a hello for rank %d from %s, which has already joined: closed",
                 h->from, p->from);
        return false;
    }
    return true;
}

/* The hello is complete: challenge the connector. false: drop it. */
static bool send_challenge(edl_comm *c, pending *p, uint64_t my_token)
{
    char why[200];
    int r = coll_hello_parse(p->buf, p->got, &p->link.h, why, sizeof why);
    if (r < 0)
        EDL_WARN("coll", "a connection from %s %s (a stranger, or another program on this "
                 "port): closed", p->from, why);
    if (r != 0 || !hello_fits(c, p, &p->link.h, my_token))
        return false;
    uint8_t mac[EDL_SECRET_MAC_BYTES], frame[64];
    if (new_nonce(c, p->link.nonce_a) || mac_of(c, &p->link, COLL_MAC_CHALLENGE, mac))
        return false;
    coll_frame_encode(COLL_CHALLENGE_MAGIC, p->link.nonce_a, mac, frame);
    size_t len = coll_frame_bytes(COLL_CHALLENGE_MAGIC);
    /* a fresh socket's buffer takes 52 bytes at once; a connection that cannot is dropped */
    if (send(p->fd, frame, len, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)len)
        return false;
    p->challenged = true;
    p->got = 0;
    return true;
}

/* The proof is complete: 1 = authenticated (the slot is taken), 0 = dropped. */
static int check_proof(edl_comm *c, pending *p)
{
    uint8_t mac[EDL_SECRET_MAC_BYTES], want[EDL_SECRET_MAC_BYTES];
    int from = p->link.h.from;
    if (coll_frame_parse(p->buf, p->got, COLL_PROOF_MAGIC, NULL, mac) != 0 ||
        mac_of(c, &p->link, COLL_MAC_PROOF, want) != 0 || !edl_job_secret_mac_equal(mac, want)) {
        EDL_WARN("coll", "a connection from %s claiming rank %d failed authentication (its "
                 "proof does not match this job's secret from %s; a stranger, or a process "
                 "given another secret): closed", p->from, from, c->secret.source);
        return 0;
    }
    if (c->fds[from] >= 0) {
        EDL_WARN("coll", "a second authenticated connection for rank %d (%s): closed", from,
                 p->from);
        return 0;
    }
    c->fds[from] = p->fd;
    c->links[from] = p->link;
    return 1;
}

/* Move one pending connection on: 1 = authenticated, 0 = still pending, -1 = drop it. */
static int step_pending(edl_comm *c, pending *p, uint64_t my_token)
{
    size_t want = p->challenged ? coll_frame_bytes(COLL_PROOF_MAGIC) : COLL_HELLO_BYTES;
    ssize_t n = recv(p->fd, p->buf + p->got, want - p->got, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return 0;
    if (n <= 0) {
        if (p->challenged)
            EDL_WARN("coll", "a connection from %s claiming rank %d closed without answering "
                     "the challenge (a stranger, or a process given another secret)", p->from,
                     p->link.h.from);
        return -1;
    }
    p->got += (size_t)n;
    if (!p->challenged) {
        coll_hello h;
        char why[200];
        if (p->got < want && coll_hello_parse(p->buf, p->got, &h, why, sizeof why) < 0) {
            EDL_WARN("coll", "a connection from %s %s (a stranger, or another program on this "
                     "port): closed", p->from, why);
            return -1; /* no need to wait for the rest of a stranger's bytes */
        }
        return p->got < want ? 0 : send_challenge(c, p, my_token) ? 0 : -1;
    }
    return p->got < want ? 0 : check_proof(c, p) ? 1 : -1;
}

static void describe_peer(int fd, char *out, size_t len)
{
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    char host[128] = "?", port[16] = "?";
    if (getpeername(fd, (struct sockaddr *)&sa, &sl) == 0)
        getnameinfo((struct sockaddr *)&sa, sl, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(out, len, "%s:%s", host, port);
}

enum {
    MAX_PENDING = 64,       /* unauthenticated connections held at once */
    ACCEPT_BATCH = 32,      /* connections accepted between two reads of the pending ones */
    HANDSHAKE_MS = 3000,    /* a connection's time to complete the handshake */
};

static void drop_pending(pending *pend, int *np, int i)
{
    close(pend[i].fd);
    memmove(pend + i, pend + i + 1, sizeof pend[0] * (size_t)(*np - i - 1));
    (*np)--;
}

static bool is_member(const members *m, const uint8_t *src)
{
    for (int i = 0; i < m->n; i++)
        if (memcmp(m->key[i], src, EDL_ADDR_KEY_BYTES) == 0)
            return true;
    return false;
}

/* Connections from src among the pending ones; a member's address counts as none. */
static int weight(const pending *pend, int np, const members *m, const uint8_t *src)
{
    int n = 0;
    if (is_member(m, src))
        return 0;
    for (int i = 0; i < np; i++)
        n += memcmp(pend[i].src, src, EDL_ADDR_KEY_BYTES) == 0;
    return n;
}

/* The pending connection to evict: the oldest of the source that holds the most, where a
 * member's address counts as holding none (so it goes last, the oldest of all then). */
static int victim(const pending *pend, int np, const members *m)
{
    int v = 0, best = -1;
    for (int i = 0; i < np; i++) {
        int w = weight(pend, np, m, pend[i].src);
        if (w > best) {
            best = w;
            v = i;
        }
    }
    return v;
}

/* Free a slot of pend[]: the victim is read first if it was challenged, so a peer whose proof
 * has arrived is authenticated (returns 1: it took its rank's slot) instead of evicted. */
static int make_room(edl_comm *c, pending *pend, int *np, const members *m, uint64_t my_token,
                     int *evicted)
{
    int taken = 0;
    while (*np >= MAX_PENDING) {
        int v = victim(pend, *np, m);
        int r = pend[v].challenged ? step_pending(c, &pend[v], my_token) : 0;
        if (r > 0) {
            taken++;
            memmove(pend + v, pend + v + 1, sizeof pend[0] * (size_t)(*np - v - 1));
            (*np)--;
            continue;
        }
        *evicted += r == 0;
        drop_pending(pend, np, v);
    }
    return taken;
}

/* Take the connections waiting on the listening socket, at most ACCEPT_BATCH (the pending
 * ones are read between batches). At most MAX_PENDING unauthenticated connections are held;
 * when full, one goes (make_room: the oldest of the source that holds the most, a member's
 * address last). That, rather than refusing newcomers, is what lets a real peer in during a
 * flood: strangers who hold silent connections (or connections that stop after the hello) are
 * the old ones, while a real peer sends its hello with the connection, is read at once (below)
 * and answers the challenge within a round trip. A connector whose connection is dropped
 * anyway (strangers flood from its own address) tries again: before its challenge in
 * connect_peer, after its proof in coll_verify_links. Refusing newcomers instead would let
 * MAX_PENDING silent strangers lock a real peer out for a whole HANDSHAKE_MS at a time. */
static int take_new(edl_comm *c, pending *pend, int *np, const members *m, uint64_t my_token,
                    int *evicted)
{
    int taken = 0;
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        int fd = accept4(c->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            return taken;
        taken += make_room(c, pend, np, m, my_token, evicted);
        pending *p = &pend[*np];
        *p = (pending){.fd = fd, .until = edl_monotonic_ms() + HANDSHAKE_MS};
        describe_peer(fd, p->from, sizeof p->from);
        edl_peer_key(fd, p->src);
        (*np)++;
        int r = step_pending(c, p, my_token);
        if (r != 0) {
            if (r > 0)
                taken++;
            else
                close(fd);
            (*np)--;
        }
    }
    return taken;
}

/* Accept until every higher rank has connected and proved it holds the job secret, before the
 * deadline (the join's). A stranger's attempt costs it a pending slot until it fails, its
 * handshake deadline passes or newer connections push it out; it never takes or blocks a
 * rank's slot. */
static int accept_peers(edl_comm *c, const members *m, uint64_t my_token, int64_t deadline)
{
    int need = c->size - 1 - c->rank, np = 0, rc = 0, evicted = 0;
    pending pend[MAX_PENDING];
    while (need > 0) {
        int64_t now = edl_monotonic_ms(), left = deadline - now;
        if (left <= 0) {
            coll_set_err(c, "generation %" PRId64 ": %d higher rank(s) did not connect and "
                         "authenticate in time", c->gen, need);
            rc = EDL_ETIMEDOUT;
            break;
        }
        struct pollfd pf[MAX_PENDING + 2];
        int dfd = c->dead_watch ? edl_watch_fd(c->dead_watch) : -1;
        pf[0] = (struct pollfd){.fd = c->lfd, .events = POLLIN};
        pf[1] = (struct pollfd){.fd = dfd, .events = POLLIN};
        for (int i = 0; i < np; i++)
            pf[i + 2] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
        int r = poll(pf, (nfds_t)np + 2, left > 50 ? 50 : (int)left);
        if (r < 0 && errno != EINTR) {
            rc = EDL_EIO;
            break;
        }
        if (dfd >= 0 && (pf[1].revents & POLLIN) && coll_dead_announced(c)) {
            rc = EDL_EPEER;
            break;
        }
        int np_old = np;
        for (int i = 0; i < np_old && i < np; i++) {
            if (!(pf[i + 2].revents & (POLLIN | POLLERR | POLLHUP)))
                continue;
            int s = step_pending(c, &pend[i], my_token);
            if (s > 0)
                need--;
            if (s != 0) { /* taken (its fd kept) or dropped; keep pf[] aligned */
                if (s < 0)
                    close(pend[i].fd);
                memmove(pend + i, pend + i + 1, sizeof pend[0] * (size_t)(np - i - 1));
                memmove(pf + i + 2, pf + i + 3, sizeof pf[0] * (size_t)(np - i - 1));
                np--;
                np_old--;
                i--;
            }
        }
        if (pf[0].revents & POLLIN)
            need -= take_new(c, pend, &np, m, my_token, &evicted);
        now = edl_monotonic_ms();
        for (int i = 0; i < np; i++)
            if (now >= pend[i].until) {
                EDL_INFO("coll", "a connection from %s did not complete the handshake within "
                         "%d ms: closed", pend[i].from, HANDSHAKE_MS);
                drop_pending(pend, &np, i--);
            }
    }
    if (evicted)
        EDL_WARN("coll", "generation %" PRId64 ": %d unauthenticated connection(s) were closed "
                 "to make room for newer ones (more than %d at once: a flood?)", c->gen,
                 evicted, MAX_PENDING);
    for (int i = 0; i < np; i++)
        close(pend[i].fd);
    return rc;
}

int coll_connect_mesh(edl_comm *c, char **eps, const uint64_t *tokens, uint64_t my_token,
                      int64_t deadline_ms)
{
    if (!c->secret.len) {
        coll_set_err(c, "a group of %d ranks needs the job secret to authenticate its links: "
                     "set " EDL_SECRET_FILE_ENV " to a private file of at least %d random bytes, "
                     "the same for every process of the job (edl run makes one)", c->size,
                     EDL_SECRET_MIN_BYTES);
        return EDL_ECONFIG;
    }
    for (int j = 0; j < c->rank; j++) {
        int rc = connect_peer(c, j, eps[j], tokens[j], deadline_ms);
        if (rc)
            return rc;
    }
    members m = {.key = calloc((size_t)c->size, sizeof *m.key)};
    if (!m.key)
        return EDL_ENOMEM;
    for (int j = c->rank + 1; j < c->size; j++) {
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        if (edl_net_resolve(eps[j], &sa, &len) == 0)
            edl_addr_key(&sa, m.key[m.n++]);
    }
    int rc = accept_peers(c, &m, my_token, deadline_ms);
    free(m.key);
    return rc;
}

/* The ready frame this rank sends to peer p, or expects from it. */
static int ready_frame(edl_comm *c, int p, bool mine, uint8_t *frame)
{
    bool connector = p < c->rank; /* this rank connected to p */
    enum coll_mac_kind k = connector == mine ? COLL_MAC_READY_CONNECTOR : COLL_MAC_READY_ACCEPTOR;
    uint8_t mac[EDL_SECRET_MAC_BYTES];
    int rc = mac_of(c, &c->links[p], k, mac);
    if (!rc)
        coll_frame_encode(COLL_READY_MAGIC, NULL, mac, frame);
    return rc;
}

static int link_broken(edl_comm *c, int p, const char *what)
{
    coll_set_err(c, "generation %" PRId64 ": the link between ranks %d and %d failed the join's "
                 "check (%s)", c->gen, c->rank, p, what);
    return EDL_EPEER;
}

/* Send this rank's ready frame to p. */
static int send_ready(edl_comm *c, int p, int64_t deadline_ms)
{
    uint8_t frame[64];
    int rc = ready_frame(c, p, true, frame);
    if (!rc && edl_net_write_all(c->fds[p], frame, coll_frame_bytes(COLL_READY_MAGIC), deadline_ms) != 0)
        rc = EDL_EPEER;
    return rc;
}

/* The link to lower rank p broke before p's ready frame came (what: how). p may have dropped
 * it before reading the proof, to make room for strangers flooding its port (take_new): then
 * p still waits for this rank's connection, and a new one mends the link. A p that did take
 * the link sent its ready frame first; one that failed since declares the generation dead,
 * which ends the tries (link_to). */
static int relink(edl_comm *c, int p, const char *what, int64_t deadline_ms)
{
    char why[sizeof c->err + 128];
    int fd = -1;
    EDL_INFO("coll", "generation %" PRId64 ": the link to rank %d broke before its ready frame "
             "(%s; dropped unauthenticated during a flood?): connecting again", c->gen, p, what);
    close(c->fds[p]);
    c->fds[p] = -1;
    int rc = link_to(c, p, c->links[p].h.token, deadline_ms, &fd);
    if (rc) {
        snprintf(why, sizeof why, "%s, and connecting again failed: %s", what, c->err);
        return link_broken(c, p, why);
    }
    c->fds[p] = fd;
    return send_ready(c, p, deadline_ms) ? link_broken(c, p, "cannot send on it") : 0;
}

int coll_verify_links(edl_comm *c, int64_t deadline_ms)
{
    int n = c->size, rc = 0;
    size_t flen = coll_frame_bytes(COLL_READY_MAGIC);
    uint8_t (*in)[64] = calloc((size_t)n, sizeof *in);
    size_t *got = calloc((size_t)n, sizeof *got);
    struct pollfd *pf = calloc((size_t)n, sizeof *pf);
    int *who = calloc((size_t)n, sizeof *who);
    if (!in || !got || !pf || !who)
        rc = EDL_ENOMEM;
    for (int p = 0; !rc && p < n; p++) {
        if (p != c->rank && (rc = send_ready(c, p, deadline_ms)) == EDL_EPEER)
            rc = p < c->rank ? relink(c, p, "cannot send on it", deadline_ms)
                             : link_broken(c, p, "cannot send on it");
    }
    for (int left = n - 1; !rc && left > 0;) {
        int np = 0;
        for (int p = 0; p < n; p++)
            if (p != c->rank && got[p] < flen) {
                pf[np] = (struct pollfd){.fd = c->fds[p], .events = POLLIN};
                who[np++] = p;
            }
        int64_t wait = deadline_ms - edl_monotonic_ms();
        if (wait <= 0) {
            rc = link_broken(c, who[0], "no ready frame before the join's deadline");
            break;
        }
        poll(pf, (nfds_t)np, (int)(wait > 1000 ? 1000 : wait));
        for (int i = 0; !rc && i < np; i++) {
            int p = who[i];
            if (!pf[i].revents)
                continue;
            ssize_t r = recv(c->fds[p], in[p] + got[p], flen - got[p], 0);
            if (r < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            if (r <= 0) {
                const char *what = r == 0 ? "rank closed it" : strerror(errno);
                rc = p < c->rank && got[p] == 0 ? relink(c, p, what, deadline_ms)
                                                : link_broken(c, p, what);
                break; /* pf[] is stale now */
            }
            if ((got[p] += (size_t)r) < flen)
                continue;
            uint8_t want[64], mac[EDL_SECRET_MAC_BYTES];
            if ((rc = ready_frame(c, p, false, want)) == 0 &&
                (coll_frame_parse(in[p], flen, COLL_READY_MAGIC, NULL, mac) != 0 ||
                 !edl_job_secret_mac_equal(mac, want + 4)))
                rc = link_broken(c, p, "its ready frame did not verify");
            left--;
        }
    }
    free(in);
    free(got);
    free(pf);
    free(who);
    return rc;
}

/* ---- the message engine ---------------------------------------------------------------- */

const char *coll_kind_name(int k)
{
    switch (k) {
    case COLL_ALLREDUCE: return "allreduce";
    case COLL_BROADCAST: return "broadcast";
    case COLL_ALLGATHER: return "allgather";
    case COLL_REDUCE_SCATTER: return "reduce_scatter";
    case COLL_BARRIER: return "barrier";
    }
    return "unknown";
}

int coll_check_header(edl_comm *c, const coll_op *op, int from, const coll_hdr *h, size_t rlen)
{
    if (h->magic != COLL_MAGIC) {
        coll_set_err(c, "rank %d sent something that is not a collective message (magic "
                     "0x%08x)", from, h->magic);
        return EDL_EPROTO;
    }
    if (h->kind != op->kind || h->dtype != op->dt || h->count != op->count ||
        h->seq != op->seq || (op->kind != COLL_BROADCAST && op->kind != COLL_ALLGATHER &&
                              h->op != op->op) ||
        (op->kind == COLL_BROADCAST && h->root != op->root)) {
        coll_set_err(c, "collectives do not match across ranks: rank %d called %s #%" PRIu64
                     " (count %" PRIu64 ", %s, %s, root %d) while rank %d called %s #%" PRIu64
                     " (count %zu, %s, %s, root %d) in generation %" PRId64,
                     from, coll_kind_name(h->kind), h->seq, h->count,
                     edl_dtype_name((edl_dtype)h->dtype), coll_redop_name((edl_redop)h->op),
                     h->root, c->rank, coll_kind_name(op->kind), op->seq, op->count,
                     edl_dtype_name(op->dt), coll_redop_name(op->op), op->root, c->gen);
        return EDL_EPROTO;
    }
    if (h->len != rlen) {
        coll_set_err(c, "rank %d sent %u bytes where %zu were expected in %s #%" PRIu64, from,
                     h->len, rlen, coll_kind_name(op->kind), op->seq);
        return EDL_EPROTO;
    }
    return 0;
}

/* ---- the streaming engine ------------------------------------------------------------------ */

/* Between processes on one host every byte in flight sits in kernel buffers that both ends
 * touch, and keeping the whole ring's in-flight data in cache matters more than anything else:
 * on the 2-core test machine, ring allreduces of 16-64 MiB ran 2-3 times faster with 512 KiB in
 * flight per host than with 4 MiB socket buffers left to fill, and fell off a cliff past about
 * 600 KiB (bench/allreduce, docs/bench-allreduce.md). So a link to this host gets its share of
 * the host's cache (coll_local_window: host.c); a link to another host gets 4 MiB, a
 * bandwidth-delay product that covers 25-100 Gb/s at tens of microseconds. */
static size_t coll_window(const edl_comm *c, int to, int from)
{
    if (c->window_bytes)
        return c->window_bytes;
    bool local = (to < 0 || c->peer_local[to]) && (from < 0 || c->peer_local[from]);
    return local ? coll_local_window(coll_host_get(), c->local_ranks) : 4u << 20;
}

/* Bytes of send block j that may go now: a block that forwards received data can only go as
 * far as that data has been received (and reduced). */
static size_t stream_ready(const coll_stream *st, int j, int rj, size_t roff)
{
    int k = st->b[j].dep;
    size_t have = k < 0 || k < rj ? SIZE_MAX : k == rj ? roff : 0;
    return have < st->b[j].slen ? have : st->b[j].slen;
}

/* How far the receive may write into block k: as far as what it overwrites has gone out. */
static size_t stream_room(const coll_stream *st, int k, int sj, size_t soff)
{
    int j = st->b[k].wait_sent;
    size_t gone = j < 0 || j < sj ? SIZE_MAX : j == sj ? soff : 0;
    return gone < st->b[k].rlen ? gone : st->b[k].rlen;
}

int coll_stream_run(edl_comm *c, const coll_op *op, const coll_stream *st)
{
    size_t es = edl_dtype_size(op->dt), chunk = c->seg_bytes, stotal = 0, rtotal = 0;
    bool reduces = false;
    for (int j = 0; j < st->nb; j++) {
        stotal += st->b[j].slen;
        rtotal += st->b[j].rlen;
        reduces |= st->b[j].red != NULL;
    }
    /* the header's length is 32 bits: a stream of 4 GiB or more announces UINT32_MAX */
    uint32_t s_wire = stotal > UINT32_MAX ? UINT32_MAX : (uint32_t)stotal;
    uint32_t r_wire = rtotal > UINT32_MAX ? UINT32_MAX : (uint32_t)rtotal;
    chunk = chunk >= es ? chunk / es * es : es;
    char *stage = NULL;
    if (st->from >= 0 && reduces && !(stage = coll_stage(c, chunk)))
        return EDL_ENOMEM;
    coll_hdr sh = {.magic = COLL_MAGIC, .kind = (uint8_t)op->kind, .dtype = (uint8_t)op->dt,
                   .op = (uint8_t)op->op, .seq = op->seq, .count = op->count,
                   .len = s_wire, .root = op->root},
             rh;
    int sfd = st->to >= 0 ? c->fds[st->to] : -1, rfd = st->from >= 0 ? c->fds[st->from] : -1;
    if ((st->to >= 0 && sfd < 0) || (st->from >= 0 && rfd < 0)) {
        coll_set_err(c, "no connection to rank %d", sfd < 0 ? st->to : st->from);
        return EDL_EPEER;
    }
    /* send side: header bytes sent, then block sj at offset soff; receive side likewise, with
     * `fill` bytes waiting in the stage to be reduced into block rj at offset roff */
    size_t sh_done = st->to >= 0 ? 0 : sizeof sh, rh_done = st->from >= 0 ? 0 : sizeof rh;
    int sj = st->to >= 0 ? 0 : st->nb, rj = st->from >= 0 ? 0 : st->nb;
    size_t soff = 0, roff = 0, fill = 0, s_data = 0, r_data = 0;
    size_t window = coll_window(c, st->to, st->from);
    int64_t last = edl_monotonic_ms();
    for (;;) {
        while (sj < st->nb && soff == st->b[sj].slen) {
            sj++;
            soff = 0;
        }
        while (rj < st->nb && roff == st->b[rj].rlen) {
            rj++;
            roff = 0;
        }
        bool s_left = sh_done < sizeof sh || sj < st->nb;
        bool r_left = rh_done < sizeof rh || rj < st->nb;
        if (!s_left && !r_left)
            return 0;
        bool moved = false, s_want = false, r_want = false;
        if (s_left) {
            size_t ready = sj < st->nb ? stream_ready(st, sj, rj, roff) : 0;
            size_t len = ready > soff ? ready - soff : 0;
            len = len < c->io_bytes ? len : c->io_bytes;
            /* at most a window ahead of what came in */
            if (st->from >= 0 && !st->no_window) {
                size_t room = r_data + window > s_data ? r_data + window - s_data : 0;
                len = len < room ? len : room;
            }
            if (sh_done < sizeof sh || len) {
                struct iovec iov[2];
                int niov = 0;
                if (sh_done < sizeof sh)
                    iov[niov++] = (struct iovec){(char *)&sh + sh_done, sizeof sh - sh_done};
                if (len)
                    iov[niov++] = (struct iovec){(char *)st->b[sj].src + soff, len};
                struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
                ssize_t n = sendmsg(sfd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (n > 0) {
                    size_t h = sizeof sh - sh_done < (size_t)n ? sizeof sh - sh_done : (size_t)n;
                    sh_done += h;
                    if ((size_t)n > h && st->b[sj].copy) /* data went: sj is a block */
                        memcpy(st->b[sj].copy + soff, st->b[sj].src + soff, (size_t)n - h);
                    soff += (size_t)n - h;
                    s_data += (size_t)n - h;
                    moved = true;
                } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
                    coll_set_err(c, "rank %d is gone (sending: %s) during %s #%" PRIu64
                                 " of generation %" PRId64, st->to, strerror(errno),
                                 coll_kind_name(op->kind), op->seq, c->gen);
                    return EDL_EPEER;
                } else {
                    s_want = true;
                }
            }
        }
        if (r_left) {
            ssize_t n = -1;
            char *into = NULL;
            size_t want = 0;
            const coll_blk *b = rj < st->nb ? &st->b[rj] : NULL;
            if (rh_done < sizeof rh) {
                into = (char *)&rh + rh_done;
                want = sizeof rh - rh_done;
            } else {
                size_t room = stream_room(st, rj, sj, soff);
                size_t upto = room > roff + fill ? room - roff - fill : 0;
                if (b->red) {
                    into = stage + fill;
                    want = chunk - fill < upto ? chunk - fill : upto;
                } else {
                    into = b->dst + roff;
                    want = c->io_bytes < upto ? c->io_bytes : upto;
                }
            }
            if (want) {
                n = recv(rfd, into, want, MSG_DONTWAIT);
                if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
                    coll_set_err(c, "rank %d is gone (%s) during %s #%" PRIu64
                                 " of generation %" PRId64, st->from,
                                 n == 0 ? "connection closed" : strerror(errno),
                                 coll_kind_name(op->kind), op->seq, c->gen);
                    return EDL_EPEER;
                }
                r_want = n < 0;
            }
            if (n > 0) {
                moved = true;
                if (rh_done < sizeof rh) {
                    if ((rh_done += (size_t)n) == sizeof rh) {
                        int rc = coll_check_header(c, op, st->from, &rh, r_wire);
                        if (rc)
                            return rc;
                    }
                } else if (b->red) {
                    r_data += (size_t)n;
                    fill += (size_t)n;
                    size_t whole = fill / es * es; /* blocks hold whole elements */
                    if (whole) {
                        coll_reduce(b->dst + roff, b->red + roff, stage, whole / es, op->dt,
                                    op->op);
                        if (b->scale)
                            coll_scale_avg(b->dst + roff, whole / es, op->dt, c->size);
                        roff += whole;
                        fill -= whole;
                        if (fill)
                            memmove(stage, stage + whole, fill);
                    }
                } else {
                    r_data += (size_t)n;
                    roff += (size_t)n;
                }
            }
        }
        int64_t now = edl_monotonic_ms();
        if (moved) {
            last = now;
            continue;
        }
        int64_t left = last + c->timeout_ms - now;
        if (left <= 0) {
            coll_set_err(c, "no progress for %d ms in %s #%" PRIu64 " of generation %" PRId64
                         " (waiting on rank %d)", c->timeout_ms, coll_kind_name(op->kind), op->seq,
                         c->gen, r_left ? st->from : st->to);
            return EDL_ETIMEDOUT;
        }
        coll_note_wait(c, r_left ? st->from : st->to);
        struct pollfd pf[3];
        int np = 0;
        if (s_want)
            pf[np++] = (struct pollfd){.fd = sfd, .events = POLLOUT};
        if (r_want) {
            if (np && pf[0].fd == rfd)
                pf[0].events |= POLLIN;
            else
                pf[np++] = (struct pollfd){.fd = rfd, .events = POLLIN};
        }
        int dfd = c->dead_watch ? edl_watch_fd(c->dead_watch) : -1;
        if (dfd >= 0)
            pf[np++] = (struct pollfd){.fd = dfd, .events = POLLIN};
        int r = poll(pf, (nfds_t)np, (int)(left < 1000 ? left : 1000));
        if (r > 0 && dfd >= 0 && (pf[np - 1].revents & POLLIN) && coll_dead_announced(c))
            return EDL_EPEER;
    }
}

int coll_sendrecv(edl_comm *c, const coll_op *op, int to, const void *sbuf, size_t slen,
                  int from, void *rbuf, size_t rlen)
{
    coll_blk b = {.src = sbuf, .slen = to >= 0 ? slen : 0, .dst = rbuf,
                  .rlen = from >= 0 ? rlen : 0, .dep = -1, .wait_sent = -1};
    coll_stream st = {.to = to, .from = from, .b = &b, .nb = 1, .no_window = true};
    return coll_stream_run(c, op, &st);
}

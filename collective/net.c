/* net.c: the TCP side of the CPU group. One listening socket per process (kept across
 * generations), a full mesh of connections per generation (each rank connects to the lower
 * ranks and accepts the higher ones; a hello proves the connector read this generation's
 * rendezvous data), and the engine: coll_stream_run moves a stream of blocks to one peer
 * while another comes in from another peer (a ring or chain step after step; coll_sendrecv is
 * one block each way), on non-blocking sockets, behind a header that the receiver checks. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "edl/log.h"
#include "internal.h"

#define SOCK_BUF_BYTES (4 << 20)

typedef struct coll_hello {
    uint32_t magic;
    uint16_t version, pad;
    int64_t generation;
    int32_t from, to, size, pad2;
    uint64_t token; /* the token the receiver published for this generation */
} coll_hello;

static void tune_socket(int fd)
{
    int one = 1, buf = SOCK_BUF_BYTES;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

static void set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* "host:port" (the last colon splits) into an IPv4/IPv6 address. */
static int resolve(const char *ep, struct sockaddr_storage *sa, socklen_t *salen)
{
    char host[256];
    const char *colon = strrchr(ep, ':');
    if (!colon || (size_t)(colon - ep) >= sizeof host || colon == ep)
        return EDL_EINVAL;
    memcpy(host, ep, (size_t)(colon - ep));
    host[colon - ep] = '\0';
    if (host[0] == '[' && host[strlen(host) - 1] == ']') {
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = '\0';
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &res) != 0 || !res)
        return EDL_EINVAL;
    memcpy(sa, res->ai_addr, res->ai_addrlen);
    *salen = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

int coll_listen(edl_comm *c)
{
    char ep[300];
    snprintf(ep, sizeof ep, "%s:0", c->listen_addr);
    struct sockaddr_storage sa;
    socklen_t salen;
    if (resolve(ep, &sa, &salen) != 0) {
        coll_set_err(c, "cannot resolve the address to listen on, '%s'", c->listen_addr);
        return EDL_ECONFIG;
    }
    int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        coll_set_err(c, "socket: %s", strerror(errno));
        return EDL_EIO;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    tune_socket(fd); /* accepted sockets inherit the buffer sizes (window scaling) */
    if (bind(fd, (struct sockaddr *)&sa, salen) != 0 || listen(fd, 512) != 0) {
        coll_set_err(c, "cannot listen on %s: %s", c->listen_addr, strerror(errno));
        close(fd);
        return EDL_EIO;
    }
    socklen_t len = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &len);
    c->lport = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                              : ((struct sockaddr_in *)&sa)->sin_port);
    set_nonblock(fd);
    c->lfd = fd;
    return 0;
}

void coll_close_peers(edl_comm *c)
{
    for (int i = 0; c->fds && i < c->size; i++)
        if (c->fds[i] >= 0) {
            close(c->fds[i]);
            c->fds[i] = -1;
        }
}

/* Write all of buf to a non-blocking fd before the deadline. */
static int write_all(int fd, const void *buf, size_t len, int64_t deadline)
{
    const char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN)
            return EDL_EIO;
        int64_t left = deadline - edl_monotonic_ms();
        if (left <= 0)
            return EDL_ETIMEDOUT;
        struct pollfd p1 = {.fd = fd, .events = POLLOUT};
        poll(&p1, 1, (int)left);
    }
    return 0;
}

static int connect_peer(edl_comm *c, int j, const char *ep, uint64_t token, int64_t deadline)
{
    struct sockaddr_storage sa;
    socklen_t salen;
    if (resolve(ep, &sa, &salen) != 0) {
        coll_set_err(c, "generation %" PRId64 ": rank %d published an endpoint that does not "
                     "resolve, '%s'", c->gen, j, ep);
        return EDL_EPROTO;
    }
    int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return EDL_EIO;
    tune_socket(fd);
    set_nonblock(fd);
    int rc = connect(fd, (struct sockaddr *)&sa, salen);
    if (rc != 0 && errno == EINPROGRESS) {
        int64_t left = deadline - edl_monotonic_ms();
        struct pollfd p1 = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t el = sizeof err;
        if (left > 0 && poll(&p1, 1, (int)left) == 1 &&
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0)
            rc = 0;
        else
            errno = err ? err : ETIMEDOUT;
    }
    coll_hello h = {.magic = COLL_HELLO_MAGIC, .version = COLL_PROTO_VERSION,
                    .generation = c->gen, .from = c->rank, .to = j, .size = c->size,
                    .token = token};
    if (rc != 0 || write_all(fd, &h, sizeof h, deadline) != 0) {
        coll_set_err(c, "generation %" PRId64 ": cannot connect to rank %d at %s: %s", c->gen, j,
                     ep, strerror(errno));
        close(fd);
        return EDL_EPEER;
    }
    c->fds[j] = fd;
    return 0;
}

typedef struct pending {
    int fd;
    size_t got;
    coll_hello h;
    char from[64];
} pending;

/* Judge a complete hello: 1 = taken, 0 = dropped (and why is logged). */
static int judge_hello(edl_comm *c, pending *p, uint64_t my_token)
{
    const coll_hello *h = &p->h;
    if (h->magic != COLL_HELLO_MAGIC || h->version != COLL_PROTO_VERSION) {
        EDL_WARN("coll", "a connection from %s did not start with an edl hello (a stranger, or "
                 "another program on this port): closed", p->from);
        return 0;
    }
    if (h->generation != c->gen) {
        EDL_INFO("coll", "a connection from %s for generation %" PRId64 " while this rank is in "
                 "generation %" PRId64 ": closed", p->from, h->generation, c->gen);
        return 0;
    }
    if (h->to != c->rank || h->size != c->size || h->from <= c->rank || h->from >= c->size ||
        h->token != my_token) {
        EDL_WARN("coll", "a hello from %s does not fit generation %" PRId64 " (from rank %d to "
                 "rank %d of %d; this is rank %d of %d%s): closed", p->from, c->gen, h->from,
                 h->to, h->size, c->rank, c->size, h->token != my_token ? "; wrong token" : "");
        return 0;
    }
    if (c->fds[h->from] >= 0) {
        EDL_WARN("coll", "a second connection from rank %d (%s): closed", h->from, p->from);
        return 0;
    }
    c->fds[h->from] = p->fd;
    return 1;
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

/* Accept until every higher rank has said hello. Connections that never say anything (a
 * port scanner) cost nothing but a slot until the deadline. */
static int accept_peers(edl_comm *c, uint64_t my_token, int64_t deadline)
{
    int need = c->size - 1 - c->rank;
    enum { MAXP = 256 };
    pending pend[MAXP];
    int np = 0, rc = 0;
    while (need > 0) {
        int64_t left = deadline - edl_monotonic_ms();
        if (left <= 0) {
            coll_set_err(c, "generation %" PRId64 ": %d higher rank(s) did not connect in time",
                         c->gen, need);
            rc = EDL_ETIMEDOUT;
            break;
        }
        struct pollfd pf[MAXP + 1];
        pf[0] = (struct pollfd){.fd = c->lfd, .events = POLLIN};
        for (int i = 0; i < np; i++)
            pf[i + 1] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
        int r = poll(pf, (nfds_t)np + 1, left > 50 ? 50 : (int)left);
        if (r < 0 && errno != EINTR) {
            rc = EDL_EIO;
            break;
        }
        if (pf[0].revents & POLLIN) {
            for (;;) {
                int fd = accept4(c->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (fd < 0)
                    break;
                if (np == MAXP) { /* a flood: drop the oldest silent one */
                    close(pend[0].fd);
                    memmove(pend, pend + 1, sizeof pend[0] * (MAXP - 1));
                    np--;
                }
                pend[np] = (pending){.fd = fd};
                describe_peer(fd, pend[np].from, sizeof pend[np].from);
                np++;
            }
        }
        for (int i = 0; i < np; i++) {
            pending *p = &pend[i];
            ssize_t n = recv(p->fd, (char *)&p->h + p->got, sizeof p->h - p->got, 0);
            if (n < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            bool drop = n <= 0;
            if (n > 0 && (p->got += (size_t)n) == sizeof p->h) {
                if (judge_hello(c, p, my_token)) { /* taken: out of the list, fd kept */
                    need--;
                    pend[i--] = pend[--np];
                    continue;
                }
                drop = true;
            } else if (n > 0 && p->got >= 4 && p->h.magic != COLL_HELLO_MAGIC) {
                drop = true; /* no need to wait for the rest of a stranger's bytes */
                judge_hello(c, p, my_token); /* logs why */
            }
            if (drop) {
                close(p->fd);
                pend[i--] = pend[--np];
            }
        }
    }
    for (int i = 0; i < np; i++)
        close(pend[i].fd);
    return rc;
}

int coll_connect_mesh(edl_comm *c, char **eps, const uint64_t *tokens, uint64_t my_token,
                      int64_t deadline_ms)
{
    for (int j = 0; j < c->rank; j++) {
        int rc = connect_peer(c, j, eps[j], tokens[j], deadline_ms);
        if (rc)
            return rc;
    }
    return accept_peers(c, my_token, deadline_ms);
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

static int check_header(edl_comm *c, const coll_op *op, int from, const coll_hdr *h, size_t rlen)
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
 * 600 KiB (bench/allreduce, docs/bench-allreduce.md). So a link to this host gets a share of
 * 512 KiB; a link to another host gets 4 MiB, a bandwidth-delay product that covers 25-100 Gb/s
 * at tens of microseconds. */
static size_t coll_window(const edl_comm *c, int to, int from)
{
    if (c->window_bytes)
        return c->window_bytes;
    bool local = (to < 0 || c->peer_local[to]) && (from < 0 || c->peer_local[from]);
    if (!local)
        return 4u << 20;
    size_t w = ((512u << 10) / (size_t)(c->local_ranks > 0 ? c->local_ranks : 1)) & ~(size_t)4095;
    return w < (64u << 10) ? 64u << 10 : w;
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
                        int rc = check_header(c, op, st->from, &rh, r_wire);
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

/* harness_proxy.c: a loopback TCP proxy for fail-over, partition and "keeper blocked" tests.
 *
 * One thread polls the listening socket, a wake-up pipe and every connection; nothing else
 * touches the connections. Tests change its state (freeze, drop, target) through a mutex and
 * then wait until the thread has acknowledged the change, so that when harness_proxy_freeze()
 * returns not one more byte moves. Sockets are non-blocking and only fds with something to
 * wait for are polled, so the thread sleeps whenever nothing can move. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

#define PROXY_BUF 16384

typedef struct flow {       /* bytes moving in one direction */
    char buf[PROXY_BUF];
    size_t len;             /* bytes read, not yet written */
    bool eof;               /* the source has shut down its writing side */
    bool done;              /* nothing more goes this way: EOF passed on or destination gone */
} flow;

typedef struct conn {
    int cfd;                /* accepted from the client */
    int sfd;                /* toward the target; -1 until we start connecting */
    int target;
    bool connecting;
    int ci, si;             /* index in this round's pollfd array, or -1 */
    flow up;                /* client -> target */
    flow down;              /* target -> client */
} conn;

struct harness_proxy {
    int listen_fd;
    int port;
    int wake[2];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t acked;
    /* Guarded by mu: what the test asked for, and the thread's acknowledgement. */
    bool frozen;
    bool stop;
    int target;
    unsigned drop_seq;
    unsigned req_seq;
    unsigned ack_seq;
    int accepted;
    /* Owned by the thread. */
    conn **conns;
    size_t nconns;
    size_t cap;
};

/* ---- connections ----------------------------------------------------------------------- */

static void conn_close(conn *c)
{
    close(c->cfd);
    if (c->sfd >= 0)
        close(c->sfd);
    free(c);
}

static void close_all(harness_proxy *p)
{
    for (size_t k = 0; k < p->nconns; k++)
        conn_close(p->conns[k]);
    p->nconns = 0;
}

static void set_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Begin a non-blocking connect to the target; false when it failed at once. */
static bool conn_connect(conn *c)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)c->target),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    c->sfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->sfd < 0)
        return false;
    set_nodelay(c->sfd);
    if (connect(c->sfd, (struct sockaddr *)&a, sizeof a) == 0)
        return true;
    c->connecting = errno == EINPROGRESS;
    return c->connecting;
}

/* Read what src offers into f; a flow whose destination is gone just discards it. */
static bool flow_read(int src, flow *f)
{
    char scratch[PROXY_BUF];
    char *to = f->done ? scratch : f->buf + f->len;
    size_t room = f->done ? sizeof scratch : PROXY_BUF - f->len;
    ssize_t n = recv(src, to, room, MSG_DONTWAIT);
    if (n > 0 && !f->done)
        f->len += (size_t)n;
    else if (n == 0)
        f->eof = true;
    else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return false;
    return true;
}

static bool flow_write(int dst, flow *f)
{
    ssize_t n = send(dst, f->buf, f->len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    memmove(f->buf, f->buf + n, f->len - (size_t)n);
    f->len -= (size_t)n;
    return true;
}

/* Pass a source's EOF on once everything before it has been written. */
static void flow_finish(int dst, flow *f)
{
    if (f->eof && f->len == 0 && !f->done) {
        shutdown(dst, SHUT_WR);
        f->done = true;
    }
}

static short client_events(const conn *c)
{
    short ev = 0;
    if (!c->up.eof && (c->up.done || c->up.len < PROXY_BUF))
        ev |= POLLIN;
    if (c->down.len > 0 && !c->down.done)
        ev |= POLLOUT;
    return ev;
}

static short target_events(const conn *c)
{
    short ev = 0;
    if (c->sfd < 0)
        return 0;
    if (c->connecting)
        return POLLOUT;
    if (!c->down.eof && (c->down.done || c->down.len < PROXY_BUF))
        ev |= POLLIN;
    if (c->up.len > 0 && !c->up.done)
        ev |= POLLOUT;
    return ev;
}

/* Move what can move after poll; false when the connection should be closed. */
static bool conn_service(conn *c, short crev, short srev)
{
    if ((crev | srev) & (POLLERR | POLLNVAL))
        return false;
    if (c->connecting && (srev & (POLLOUT | POLLHUP))) {
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(c->sfd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)
            return false; /* the target refused: the client sees its connection close */
        c->connecting = false;
        srev &= ~POLLOUT;
    }
    if ((crev & POLLIN) && !flow_read(c->cfd, &c->up))
        return false;
    if ((srev & POLLIN) && !flow_read(c->sfd, &c->down))
        return false;
    if (crev & POLLHUP) { /* the client can no longer receive */
        c->down.done = true;
        c->down.len = 0;
    }
    if ((srev & POLLHUP) && !c->connecting) {
        c->up.done = true;
        c->up.len = 0;
    }
    if ((srev & POLLOUT) && !flow_write(c->sfd, &c->up))
        return false;
    if ((crev & POLLOUT) && !flow_write(c->cfd, &c->down))
        return false;
    if (c->sfd >= 0 && !c->connecting)
        flow_finish(c->sfd, &c->up);
    flow_finish(c->cfd, &c->down);
    return !(c->up.done && c->down.done);
}

/* New connections connect onward at the start of the next unfrozen round. */
static void accept_all(harness_proxy *p, int target)
{
    for (;;) {
        int fd = accept4(p->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            /* Out of fds or memory leaves the listener readable: pause instead of spinning. */
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                errno != ECONNABORTED)
                harness_sleep_ms(10);
            return;
        }
        conn *c = calloc(1, sizeof *c);
        if (p->nconns == p->cap) {
            size_t cap = p->cap ? 2 * p->cap : 16;
            conn **grown = realloc(p->conns, cap * sizeof *grown);
            if (grown)
                p->conns = grown, p->cap = cap;
        }
        if (!c || p->nconns == p->cap) {
            free(c);
            close(fd);
            continue;
        }
        set_nodelay(fd);
        c->cfd = fd;
        c->sfd = -1;
        c->target = target;
        p->conns[p->nconns++] = c;
        pthread_mutex_lock(&p->mu);
        p->accepted++;
        pthread_mutex_unlock(&p->mu);
    }
}

/* ---- the thread ------------------------------------------------------------------------ */

typedef struct round_state {
    bool frozen;
    bool stop;
    int target;
    unsigned drops_seen;
} round_state;

/* Apply what the test asked for and acknowledge it. */
static void sync_control(harness_proxy *p, round_state *st)
{
    pthread_mutex_lock(&p->mu);
    st->frozen = p->frozen;
    st->stop = p->stop;
    st->target = p->target;
    if (st->drops_seen != p->drop_seq) {
        close_all(p);
        st->drops_seen = p->drop_seq;
    }
    p->ack_seq = p->req_seq;
    pthread_cond_broadcast(&p->acked);
    pthread_mutex_unlock(&p->mu);
}

static void drain_wake(int fd)
{
    char junk[64];
    while (read(fd, junk, sizeof junk) > 0) {
    }
}

/* Fill fds for one poll round; frozen connections are left out entirely. */
static nfds_t build_pollfds(harness_proxy *p, struct pollfd *fds, bool frozen)
{
    nfds_t n = 0;
    fds[n++] = (struct pollfd){.fd = p->wake[0], .events = POLLIN};
    fds[n++] = (struct pollfd){.fd = p->listen_fd, .events = POLLIN};
    for (size_t k = 0; k < p->nconns; k++) {
        conn *c = p->conns[k];
        short ce = frozen ? 0 : client_events(c), se = frozen ? 0 : target_events(c);
        c->ci = c->si = -1;
        if (ce) {
            c->ci = (int)n;
            fds[n++] = (struct pollfd){.fd = c->cfd, .events = ce};
        }
        if (se) {
            c->si = (int)n;
            fds[n++] = (struct pollfd){.fd = c->sfd, .events = se};
        }
    }
    return n;
}

static void service_all(harness_proxy *p, const struct pollfd *fds)
{
    size_t kept = 0;
    for (size_t k = 0; k < p->nconns; k++) {
        conn *c = p->conns[k];
        short crev = c->ci >= 0 ? fds[c->ci].revents : 0;
        short srev = c->si >= 0 ? fds[c->si].revents : 0;
        bool alive = conn_service(c, crev, srev);
        if (alive)
            p->conns[kept++] = c;
        else
            conn_close(c);
    }
    p->nconns = kept;
}

/* Connections accepted while frozen (or before a thaw) start their onward connect. */
static void connect_pending(harness_proxy *p)
{
    size_t kept = 0;
    for (size_t k = 0; k < p->nconns; k++) {
        conn *c = p->conns[k];
        if (c->sfd < 0 && !conn_connect(c)) {
            conn_close(c);
            continue;
        }
        p->conns[kept++] = c;
    }
    p->nconns = kept;
}

static void *proxy_main(void *arg)
{
    harness_proxy *p = arg;
    round_state st = {.drops_seen = 0};
    struct pollfd *fds = NULL;
    size_t fds_cap = 0;
    for (;;) {
        sync_control(p, &st);
        if (st.stop)
            break;
        if (!st.frozen)
            connect_pending(p);
        if (fds_cap < 2 + 2 * p->nconns) {
            fds_cap = 2 + 2 * p->nconns + 32;
            free(fds);
            fds = calloc(fds_cap, sizeof *fds);
            if (!fds) {
                fprintf(stderr, "harness proxy: out of memory\n");
                break;
            }
        }
        nfds_t n = build_pollfds(p, fds, st.frozen);
        if (poll(fds, n, -1) < 0)
            continue; /* EINTR */
        if (fds[0].revents)
            drain_wake(p->wake[0]);
        if (!st.frozen)
            service_all(p, fds);
        if (fds[1].revents & POLLIN)
            accept_all(p, st.target);
    }
    free(fds);
    close_all(p);
    return NULL;
}

/* ---- public API ------------------------------------------------------------------------ */

/* Change state under the lock, wake the thread and wait until it has taken the change in. */
static void request(harness_proxy *p)
{
    unsigned seq = ++p->req_seq;
    if (write(p->wake[1], "w", 1) < 0) {
        /* pipe full: the thread is awake anyway */
    }
    while ((int)(p->ack_seq - seq) < 0)
        pthread_cond_wait(&p->acked, &p->mu);
}

static int listen_loopback(int *port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &alen) != 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

harness_proxy *harness_proxy_open(int target_port)
{
    harness_proxy *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->target = target_port;
    p->wake[0] = p->wake[1] = -1;
    p->listen_fd = listen_loopback(&p->port);
    if (p->listen_fd < 0 || pipe2(p->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        fprintf(stderr, "harness proxy: cannot listen on loopback: %s\n", strerror(errno));
        goto fail;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->acked, NULL);
    if (pthread_create(&p->thread, NULL, proxy_main, p) != 0) {
        fprintf(stderr, "harness proxy: cannot start its thread\n");
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->acked);
        goto fail;
    }
    return p;
fail:
    if (p->listen_fd >= 0)
        close(p->listen_fd);
    if (p->wake[0] >= 0)
        close(p->wake[0]), close(p->wake[1]);
    free(p);
    return NULL;
}

int harness_proxy_port(const harness_proxy *p)
{
    return p->port;
}

int harness_proxy_accepted(harness_proxy *p)
{
    pthread_mutex_lock(&p->mu);
    int n = p->accepted;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void harness_proxy_freeze(harness_proxy *p, bool on)
{
    pthread_mutex_lock(&p->mu);
    p->frozen = on;
    request(p);
    pthread_mutex_unlock(&p->mu);
}

void harness_proxy_drop(harness_proxy *p)
{
    pthread_mutex_lock(&p->mu);
    p->drop_seq++;
    request(p);
    pthread_mutex_unlock(&p->mu);
}

void harness_proxy_set_target(harness_proxy *p, int target_port)
{
    pthread_mutex_lock(&p->mu);
    p->target = target_port;
    request(p);
    pthread_mutex_unlock(&p->mu);
}

void harness_proxy_close(harness_proxy *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    request(p);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    close(p->listen_fd);
    close(p->wake[0]);
    close(p->wake[1]);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->acked);
    free(p->conns);
    free(p);
}

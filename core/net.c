/* net.c: edl's TCP socket layer (edl/net.h: resolve, listen, dial with a deadline, exact reads
 * and writes with a deadline, one tuning of data sockets) and the small socket helpers of
 * edl/common.h (a free port to hand to a child, the key of a connection's source for
 * per-source bounds). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "edl/common.h"
#include "edl/net.h"

void edl_net_tune(int fd)
{
    int one = 1, buf = EDL_NET_BUF_BYTES;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

int edl_net_set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl >= 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0 ? 0 : EDL_EIO;
}

/* host without its IPv6 brackets into out (false: too long). */
static bool unbracket(const char *host, size_t len, char *out, size_t cap)
{
    if (len >= 2 && host[0] == '[' && host[len - 1] == ']') {
        host++;
        len -= 2;
    }
    if (len >= cap)
        return false;
    memcpy(out, host, len);
    out[len] = '\0';
    return true;
}

static struct addrinfo *lookup(const char *host, size_t hostlen, int port, bool passive)
{
    char h[256], service[16];
    if (!unbracket(host, hostlen, h, sizeof h))
        return NULL;
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0};
    struct addrinfo *res = NULL;
    if (getaddrinfo(h[0] ? h : NULL, service, &hints, &res) != 0)
        return NULL;
    return res;
}

int edl_net_resolve(const char *ep, struct sockaddr_storage *sa, socklen_t *len)
{
    const char *colon = ep ? strrchr(ep, ':') : NULL;
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || colon == ep || colon[1] == '\0' || *end != '\0' || port < 0 || port > 65535)
        return EDL_EINVAL;
    struct addrinfo *res = lookup(ep, (size_t)(colon - ep), (int)port, false);
    if (!res)
        return EDL_EINVAL;
    memcpy(sa, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

static int port_of(int fd)
{
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    if (getsockname(fd, (struct sockaddr *)&sa, &len) != 0)
        return 0;
    return ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                          : ((struct sockaddr_in *)&sa)->sin_port);
}

int edl_net_listen(const char *host, int port, int *fd, int *bound_port)
{
    struct addrinfo *res = lookup(host ? host : "", host ? strlen(host) : 0, port, true);
    if (!res)
        return EDL_ECONFIG;
    int s = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    if (s >= 0) {
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        edl_net_tune(s);
    }
    if (s < 0 || bind(s, res->ai_addr, res->ai_addrlen) != 0 || listen(s, 512) != 0) {
        int e = errno;
        freeaddrinfo(res);
        if (s >= 0)
            close(s);
        errno = e;
        return EDL_EIO;
    }
    freeaddrinfo(res);
    *fd = s;
    if (bound_port)
        *bound_port = port_of(s);
    return 0;
}

int edl_net_wait(int fd, short events, int64_t deadline_ms)
{
    for (;;) {
        int64_t left = deadline_ms - edl_monotonic_ms();
        if (left <= 0)
            return EDL_ETIMEDOUT;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return EDL_EIO;
    }
}

int edl_net_dial_addr(const struct sockaddr *sa, socklen_t len, int64_t deadline_ms, int *fd)
{
    int s = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return EDL_EIO;
    edl_net_tune(s);
    int rc = 0;
    if (connect(s, sa, len) != 0) {
        int err = errno;
        socklen_t el = sizeof err;
        if (err != EINPROGRESS)
            rc = EDL_EUNAVAIL;
        else if ((rc = edl_net_wait(s, POLLOUT, deadline_ms)) != 0)
            err = ETIMEDOUT;
        else if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0)
            rc = EDL_EUNAVAIL;
        errno = err;
    }
    if (rc) {
        int e = errno;
        close(s);
        errno = e;
        return rc;
    }
    *fd = s;
    return 0;
}

bool edl_net_unacked(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    return getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 && ti.tcpi_unacked > 0;
}

int edl_net_dial(const char *ep, int64_t deadline_ms, int *fd)
{
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    int rc = edl_net_resolve(ep, &sa, &len);
    return rc ? rc : edl_net_dial_addr((struct sockaddr *)&sa, len, deadline_ms, fd);
}

/* One exact transfer: out chooses the direction. MSG_DONTWAIT makes a blocking socket behave
 * as a non-blocking one, so the deadline holds for both. */
static int transfer_all(int fd, char *p, size_t len, bool out, int64_t deadline_ms)
{
    while (len) {
        ssize_t n = out ? send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            return EDL_EPEER;
        } else if (errno != EINTR) {
            int rc = edl_net_wait(fd, out ? POLLOUT : POLLIN, deadline_ms);
            if (rc)
                return rc;
        }
    }
    return 0;
}

int edl_net_write_all(int fd, const void *buf, size_t len, int64_t deadline_ms)
{
    return transfer_all(fd, (char *)buf, len, true, deadline_ms);
}

int edl_net_read_all(int fd, void *buf, size_t len, int64_t deadline_ms)
{
    return transfer_all(fd, buf, len, false, deadline_ms);
}

/* The ports edl_free_port handed out last in this process. The kernel's bind to port 0 picks
 * at random among the free ones, and a port handed out is free again until the caller's child
 * binds it, so two picks a moment apart may return the same port (1 in 12,500 pairs on the
 * build machine): a launcher's two children, or an agent's trainer and rendezvous ports,
 * would then clash. A port in this ring is not handed out again while the ring holds it. */
#define RECENT_PORTS 64
#define FREE_PORT_TRIES 16

static struct {
    pthread_mutex_t mu;
    int port[RECENT_PORTS];
    unsigned next;
} recent_ports = {.mu = PTHREAD_MUTEX_INITIALIZER};

static bool port_recent(int port)
{
    for (int i = 0; i < RECENT_PORTS; i++)
        if (recent_ports.port[i] == port)
            return true;
    return false;
}

/* Bind fd to port 0 of sa's address: the port the kernel chose, or 0. */
static int bind_any_port(int fd, struct sockaddr_in sa)
{
    socklen_t len = sizeof sa;
    sa.sin_port = 0;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0)
        return 0;
    return ntohs(sa.sin_port);
}

int edl_free_port(const char *ipv4)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    if (!ipv4 || inet_pton(AF_INET, ipv4, &sa.sin_addr) != 1)
        sa.sin_addr.s_addr = htonl(INADDR_ANY);
    /* a recent port's socket stays bound while the next try runs, so the kernel picks anew */
    int fds[FREE_PORT_TRIES], n = 0, port = 0;
    pthread_mutex_lock(&recent_ports.mu);
    while (n < FREE_PORT_TRIES && !port) {
        if ((fds[n] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
            break;
        int p = bind_any_port(fds[n++], sa);
        if (!p)
            break;
        if (!port_recent(p))
            port = p;
    }
    if (port)
        recent_ports.port[recent_ports.next++ % RECENT_PORTS] = port;
    pthread_mutex_unlock(&recent_ports.mu);
    while (n > 0)
        close(fds[--n]);
    return port;
}

void edl_addr_key(const void *sockaddr, uint8_t key[EDL_ADDR_KEY_BYTES])
{
    const struct sockaddr *sa = sockaddr;
    memset(key, 0, EDL_ADDR_KEY_BYTES);
    if (sa->sa_family == AF_INET) {
        memcpy(key + 12, &((const struct sockaddr_in *)sockaddr)->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sockaddr)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a))
            memcpy(key + 12, a->s6_addr + 12, 4);
        else
            memcpy(key, a->s6_addr, 8);
    }
}

void edl_peer_key(int fd, uint8_t key[EDL_ADDR_KEY_BYTES])
{
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    if (getpeername(fd, (struct sockaddr *)&sa, &len) != 0)
        sa.ss_family = AF_UNSPEC;
    edl_addr_key(&sa, key);
}

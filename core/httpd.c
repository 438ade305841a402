/* httpd.c: a small non-blocking HTTP server for metrics and health endpoints, driven by its
 * owner's poll() loop. Requests are read into a bounded buffer; the response is written as far
 * as the socket takes it and finished on later POLLOUTs; every connection closes after one
 * answer. Nothing here blocks. */
#define _GNU_SOURCE /* accept4 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "edl/httpd.h"
#include "edl/log.h"

typedef struct conn {
    int fd;
    int64_t deadline_ms;
    char *in;       /* request head so far (max_request + 1 bytes) */
    size_t in_len;
    char *out;      /* response being written */
    size_t out_len, out_off;
} conn;

struct edl_httpd {
    int lfd, port;
    size_t max_request;
    int max_conns, idle_ms;
    edl_httpd_handler handler;
    void *arg;
    conn *conns;
    int n_conns;
};

int edl_httpd_new(const edl_httpd_opts *opts, edl_httpd_handler h, void *arg, edl_httpd **out)
{
    *out = NULL;
    edl_httpd_opts o = opts ? *opts : (edl_httpd_opts){0};
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o.port)};
    if (!h || o.port < 0 || o.port > 65535 || inet_pton(AF_INET, o.addr ? o.addr : "0.0.0.0", &sa.sin_addr) != 1)
        return EDL_EINVAL;
    edl_httpd *s = calloc(1, sizeof *s);
    if (!s)
        return EDL_ENOMEM;
    s->max_request = o.max_request ? o.max_request : 8192;
    s->max_conns = o.max_conns > 0 ? o.max_conns : 32;
    s->idle_ms = o.idle_ms > 0 ? o.idle_ms : 5000;
    s->handler = h;
    s->arg = arg;
    s->conns = calloc((size_t)s->max_conns, sizeof *s->conns);
    s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    socklen_t len = sizeof sa;
    if (!s->conns || s->lfd < 0 || setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(s->lfd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(s->lfd, 64) < 0 ||
        getsockname(s->lfd, (struct sockaddr *)&sa, &len) < 0) {
        EDL_ERROR("httpd", "cannot listen on %s:%d: %s", o.addr ? o.addr : "0.0.0.0", o.port,
                  strerror(errno));
        if (s->lfd >= 0)
            close(s->lfd);
        free(s->conns);
        free(s);
        return EDL_EIO;
    }
    s->port = ntohs(sa.sin_port);
    *out = s;
    return 0;
}

static void conn_close(edl_httpd *s, int i)
{
    close(s->conns[i].fd);
    free(s->conns[i].in);
    free(s->conns[i].out);
    s->conns[i] = s->conns[--s->n_conns];
    memset(&s->conns[s->n_conns], 0, sizeof(conn));
}

void edl_httpd_free(edl_httpd *s)
{
    if (!s)
        return;
    while (s->n_conns)
        conn_close(s, s->n_conns - 1);
    close(s->lfd);
    free(s->conns);
    free(s);
}

int edl_httpd_port(const edl_httpd *s)
{
    return s->port;
}

static const char *reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    default: return status < 500 ? "Error" : "Internal Server Error";
    }
}

/* Queue a whole response on the connection. */
static void respond(conn *c, int status, const char *ctype, const char *body, size_t body_len,
                    bool head_only)
{
    char hdr[256];
    int n = snprintf(hdr, sizeof hdr,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     status, reason(status), ctype ? ctype : "text/plain; charset=utf-8", body_len);
    size_t total = (size_t)n + (head_only ? 0 : body_len);
    free(c->out);
    c->out = malloc(total ? total : 1);
    c->out_off = 0;
    c->out_len = 0;
    if (!c->out)
        return;
    memcpy(c->out, hdr, (size_t)n);
    if (!head_only && body_len)
        memcpy(c->out + n, body, body_len);
    c->out_len = total;
}

static void bad_request(conn *c)
{
    static const char msg[] = "bad request\n";
    respond(c, 400, NULL, msg, sizeof msg - 1, false);
}

/* A complete request head is in c->in: parse the request line and answer. */
static void handle_request(edl_httpd *s, conn *c)
{
    char *eol = strstr(c->in, "\r\n");
    if (!eol)
        eol = strchr(c->in, '\n');
    *eol = '\0';
    char *sp1 = strchr(c->in, ' ');
    char *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    if (!sp1 || !sp2 || sp1 == c->in || sp2 == sp1 + 1 || sp1[1] != '/' ||
        strncmp(sp2 + 1, "HTTP/1.", 7) != 0) {
        bad_request(c);
        return;
    }
    *sp1 = '\0';
    *sp2 = '\0';
    const char *method = c->in;
    char *path = sp1 + 1;
    char *q = strchr(path, '?');
    if (q)
        *q = '\0';
    bool head = strcmp(method, "HEAD") == 0;
    if (!head && strcmp(method, "GET") != 0) {
        static const char msg[] = "method not allowed\n";
        respond(c, 405, NULL, msg, sizeof msg - 1, false);
        return;
    }
    edl_http_response r = {.status = 404};
    s->handler(s->arg, method, path, &r);
    if (r.status == 404 && !r.body) {
        static const char msg[] = "not found\n";
        respond(c, 404, NULL, msg, sizeof msg - 1, head);
    } else {
        respond(c, r.status, r.content_type, r.body, r.body_len, head);
    }
    free(r.body);
}

static void conn_read(edl_httpd *s, int i)
{
    conn *c = &s->conns[i];
    for (;;) {
        size_t room = s->max_request - c->in_len;
        if (room == 0) { /* the head does not fit: answer 400 and stop reading */
            bad_request(c);
            return;
        }
        ssize_t n = recv(c->fd, c->in + c->in_len, room, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0) {
            conn_close(s, i);
            return;
        }
        c->in_len += (size_t)n;
        c->in[c->in_len] = '\0';
        if (memchr(c->in, '\0', c->in_len)) {
            bad_request(c);
            return;
        }
        if (strstr(c->in, "\r\n\r\n") || strstr(c->in, "\n\n")) {
            handle_request(s, c);
            return;
        }
    }
}

/* Returns false when the connection was closed. */
static bool conn_write(edl_httpd *s, int i)
{
    conn *c = &s->conns[i];
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return true;
        if (n < 0)
            break;
        c->out_off += (size_t)n;
    }
    /* Unread request bytes would make close() send a reset that can destroy the answer in
     * flight: signal the end, then discard what the client already sent. */
    shutdown(c->fd, SHUT_WR);
    char sink[4096];
    for (int k = 0; k < 16 && recv(c->fd, sink, sizeof sink, MSG_DONTWAIT) > 0; k++)
        ;
    conn_close(s, i);
    return false;
}

static void accept_all(edl_httpd *s)
{
    for (;;) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        if (s->n_conns >= s->max_conns) {
            close(fd);
            continue;
        }
        conn *c = &s->conns[s->n_conns];
        memset(c, 0, sizeof *c);
        c->fd = fd;
        c->deadline_ms = edl_monotonic_ms() + s->idle_ms;
        c->in = malloc(s->max_request + 1);
        if (!c->in) {
            close(fd);
            continue;
        }
        c->in[0] = '\0';
        s->n_conns++;
    }
}

size_t edl_httpd_pollfds(edl_httpd *s, struct pollfd *fds, size_t max)
{
    int64_t now = edl_monotonic_ms();
    for (int i = s->n_conns - 1; i >= 0; i--)
        if (s->conns[i].deadline_ms <= now)
            conn_close(s, i);
    size_t n = 0;
    if (n < max)
        fds[n++] = (struct pollfd){.fd = s->lfd, .events = POLLIN};
    for (int i = 0; i < s->n_conns && n < max; i++) {
        conn *c = &s->conns[i];
        fds[n++] = (struct pollfd){.fd = c->fd, .events = c->out ? POLLOUT : POLLIN};
    }
    return n;
}

void edl_httpd_dispatch(edl_httpd *s, const struct pollfd *fds, size_t n)
{
    /* Work by fd, not index: handling one connection may reorder the array. */
    for (size_t k = 0; k < n; k++) {
        if (!fds[k].revents)
            continue;
        if (fds[k].fd == s->lfd) {
            accept_all(s);
            continue;
        }
        for (int i = 0; i < s->n_conns; i++) {
            if (s->conns[i].fd != fds[k].fd)
                continue;
            if (!s->conns[i].out && (fds[k].revents & (POLLIN | POLLHUP | POLLERR)))
                conn_read(s, i);
            /* conn_read may have closed slot i (and moved another there): look again by fd */
            for (int j = 0; j < s->n_conns; j++)
                if (s->conns[j].fd == fds[k].fd && s->conns[j].out)
                    conn_write(s, j);
            break;
        }
    }
}

int edl_httpd_timeout_ms(const edl_httpd *s)
{
    if (!s->n_conns)
        return -1;
    int64_t now = edl_monotonic_ms(), first = INT64_MAX;
    for (int i = 0; i < s->n_conns; i++)
        if (s->conns[i].deadline_ms < first)
            first = s->conns[i].deadline_ms;
    return first <= now ? 0 : (int)(first - now);
}

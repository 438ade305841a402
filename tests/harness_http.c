/* harness_http.c: a fake HTTP/1.1 server that answers badly on purpose.
 *
 * The etcd client must survive truncated, chunked, missing, endless and huge replies; the real
 * etcd never sends those, so this stand-in does. One thread accepts; each connection gets a
 * thread of its own, which keeps HTTP_HANG and HTTP_HUGE simple. Every wait polls the
 * connection together with a "stop" pipe that is written once and never drained, so that
 * harness_http_close() wakes every thread at once and can join them all. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

#define MAX_PATHS 16
#define MAX_HEAD (64 * 1024)
#define MAX_BODY (16 * 1024 * 1024)
#define HUGE_BLOCK 16384

typedef struct reply {
    char path[128];          /* "" for the default reply */
    int status;
    char *body;
    size_t len;
    enum harness_http_mode mode;
} reply;

typedef struct http_conn {
    harness_http *h;
    int fd;
    pthread_t thread;
    bool finished;           /* guarded by h->mu: the thread may be joined without waiting */
    struct http_conn *next;
} http_conn;

struct harness_http {
    int listen_fd;
    int port;
    int stop_pipe[2];
    char url[40];
    pthread_t accept_thread;
    pthread_mutex_t mu;
    /* Guarded by mu. */
    reply dflt;
    reply paths[MAX_PATHS];
    int npaths;
    size_t huge_limit;
    int requests;
    char last_path[512];
    char *last_body;
    size_t last_body_len;
    http_conn *conns;
};

typedef struct request {
    char path[512];
    size_t head_len;
    size_t body_len;
    bool close;
} request;

typedef struct inbuf {
    char *data;
    size_t len;
    size_t cap;
} inbuf;

/* ---- waiting and sending --------------------------------------------------------------- */

/* Wait until fd is ready for `events`; false once the server is stopping. */
static bool wait_fd(const http_conn *c, short events)
{
    struct pollfd fds[2] = {{.fd = c->fd, .events = events},
                            {.fd = c->h->stop_pipe[0], .events = POLLIN}};
    for (;;) {
        if (poll(fds, 2, -1) < 0 && errno == EINTR)
            continue;
        if (fds[1].revents)
            return false;
        if (fds[0].revents)
            return true;
    }
}

static bool send_all(const http_conn *c, const char *p, size_t len)
{
    while (len > 0) {
        ssize_t n = send(c->fd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            if (!wait_fd(c, POLLOUT))
                return false;
        } else {
            return false; /* the client went away */
        }
    }
    return true;
}

static bool send_chunk(const http_conn *c, const char *p, size_t len)
{
    char size[24];
    int n = snprintf(size, sizeof size, "%zx\r\n", len);
    return send_all(c, size, (size_t)n) && send_all(c, p, len) && send_all(c, "\r\n", 2);
}

/* Hold the connection open, discarding input, until the client leaves or the server stops. */
static void hang(const http_conn *c)
{
    char junk[4096];
    while (wait_fd(c, POLLIN)) {
        ssize_t n = recv(c->fd, junk, sizeof junk, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            return;
    }
}

/* ---- replies --------------------------------------------------------------------------- */

static const char *reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 412: return "Precondition Failed";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    }
    return "Status";
}

static bool send_head(const http_conn *c, int status, const char *framing)
{
    char head[256];
    int n = snprintf(head, sizeof head, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                     "%s\r\n", status, reason(status), framing);
    return send_all(c, head, (size_t)n);
}

/* One chunk per line (newline included), as etcd's gateway streams watch events. */
static bool send_lines_chunked(const http_conn *c, const reply *r)
{
    size_t off = 0;
    while (off < r->len) {
        const char *nl = memchr(r->body + off, '\n', r->len - off);
        size_t n = nl ? (size_t)(nl - (r->body + off)) + 1 : r->len - off;
        if (!send_chunk(c, r->body + off, n))
            return false;
        off += n;
    }
    return true;
}

/* The body over and over, in chunks of whole repetitions of about HUGE_BLOCK bytes, so that
 * a short body does not cost three syscalls per repetition. */
static bool send_huge(const http_conn *c, const reply *r, size_t limit)
{
    const char *unit = r->len ? r->body : "x";
    size_t unit_len = r->len ? r->len : 1, block_len = unit_len, sent = 0;
    char *block = NULL;
    if (unit_len < HUGE_BLOCK && (block = malloc(HUGE_BLOCK)) != NULL) {
        for (block_len = 0; block_len + unit_len <= HUGE_BLOCK; block_len += unit_len)
            memcpy(block + block_len, unit, unit_len);
        unit = block;
    }
    bool ok = true;
    while (ok && (limit == 0 || sent < limit)) {
        size_t n = limit && limit - sent < block_len ? limit - sent : block_len;
        ok = send_chunk(c, unit, n);
        sent += n;
    }
    free(block);
    return ok && send_all(c, "0\r\n\r\n", 5);
}

/* Answer one request as r says; true when the connection may serve another request. */
static bool send_reply(const http_conn *c, const reply *r, bool close_asked, size_t huge_limit)
{
    char framing[96];
    const char *chunked = "Transfer-Encoding: chunked\r\n";
    switch (r->mode) {
    case HTTP_NORMAL:
        snprintf(framing, sizeof framing, "Content-Length: %zu\r\n%s", r->len,
                 close_asked ? "Connection: close\r\n" : "");
        return send_head(c, r->status, framing) && send_all(c, r->body, r->len) && !close_asked;
    case HTTP_TRUNCATED:
        snprintf(framing, sizeof framing, "Content-Length: %zu\r\n", r->len + 100);
        if (send_head(c, r->status, framing))
            send_all(c, r->body, r->len);
        return false;
    case HTTP_CHUNKED:
        return send_head(c, r->status, chunked) && send_lines_chunked(c, r) &&
               send_all(c, "0\r\n\r\n", 5) && !close_asked;
    case HTTP_CHUNKED_HANG:
        if (send_head(c, r->status, chunked) && send_lines_chunked(c, r))
            hang(c);
        return false;
    case HTTP_CLOSE_NO_REPLY:
        return false;
    case HTTP_HANG:
        hang(c);
        return false;
    case HTTP_HUGE:
        return send_head(c, r->status, chunked) && send_huge(c, r, huge_limit) && !close_asked;
    }
    return false;
}

/* ---- requests -------------------------------------------------------------------------- */

static bool header_is(const char *line, const char *name)
{
    size_t n = strlen(name);
    return strncasecmp(line, name, n) == 0 && line[n] == ':';
}

/* Parse the head in buf[0..head_len): request line, Content-Length, Connection. */
static bool parse_head(const char *buf, size_t head_len, request *rq)
{
    char *head = strndup(buf, head_len), *save = NULL;
    bool ok = head != NULL;
    memset(rq, 0, sizeof *rq);
    rq->head_len = head_len;
    char *line = ok ? strtok_r(head, "\r\n", &save) : NULL;
    char *sp1 = line ? strchr(line, ' ') : NULL;
    char *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    ok = sp1 && sp2;
    if (ok) {
        snprintf(rq->path, sizeof rq->path, "%.*s", (int)(sp2 - sp1 - 1), sp1 + 1);
        rq->close = strstr(sp2, "HTTP/1.0") != NULL;
    }
    while (ok && (line = strtok_r(NULL, "\r\n", &save)) != NULL) {
        const char *v = strchr(line, ':');
        v = v ? v + 1 + strspn(v + 1, " \t") : "";
        if (header_is(line, "Content-Length")) {
            char *end;
            unsigned long long n = strtoull(v, &end, 10);
            ok = end != v && n <= MAX_BODY;
            rq->body_len = (size_t)n;
        } else if (header_is(line, "Connection")) {
            rq->close = strcasestr(v, "close") != NULL;
        }
    }
    free(head);
    return ok;
}

/* Read until buf holds one whole request; 1 = got one, 0 = client gone or stopping, -1 = bad. */
static int read_request(const http_conn *c, inbuf *in, request *rq)
{
    for (;;) {
        char *end = in->len ? memmem(in->data, in->len, "\r\n\r\n", 4) : NULL;
        if (end) {
            if (!parse_head(in->data, (size_t)(end - in->data) + 4, rq))
                return -1;
            if (in->len >= rq->head_len + rq->body_len)
                return 1;
        } else if (in->len > MAX_HEAD) {
            return -1;
        }
        if (in->cap - in->len < 4096) {
            size_t cap = in->cap * 2 + 8192;
            char *grown = cap <= 2 * (MAX_HEAD + MAX_BODY) ? realloc(in->data, cap) : NULL;
            if (!grown)
                return -1;
            in->data = grown, in->cap = cap;
        }
        if (!wait_fd(c, POLLIN))
            return 0;
        ssize_t n = recv(c->fd, in->data + in->len, in->cap - in->len, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            return 0;
        if (n > 0)
            in->len += (size_t)n;
    }
}

/* Record the request and copy the reply meant for its path (the test may change it). */
static bool take_reply(harness_http *h, const request *rq, const char *body, reply *out,
                       size_t *huge_limit)
{
    char path[sizeof rq->path];
    snprintf(path, sizeof path, "%s", rq->path);
    path[strcspn(path, "?")] = '\0';
    pthread_mutex_lock(&h->mu);
    h->requests++;
    snprintf(h->last_path, sizeof h->last_path, "%s", rq->path);
    free(h->last_body);
    h->last_body = malloc(rq->body_len + 1);
    h->last_body_len = h->last_body ? rq->body_len : 0;
    if (h->last_body)
        memcpy(h->last_body, body, rq->body_len), h->last_body[rq->body_len] = '\0';
    const reply *r = &h->dflt;
    for (int k = 0; k < h->npaths; k++)
        if (strcmp(h->paths[k].path, path) == 0)
            r = &h->paths[k];
    *out = *r;
    out->body = malloc(r->len + 1);
    if (out->body)
        memcpy(out->body, r->body, r->len);
    *huge_limit = h->huge_limit;
    pthread_mutex_unlock(&h->mu);
    return out->body != NULL;
}

static void *conn_main(void *arg)
{
    http_conn *c = arg;
    harness_http *h = c->h;
    inbuf in = {NULL, 0, 0};
    request rq;
    bool more = true;
    while (more && read_request(c, &in, &rq) == 1) {
        reply r;
        size_t huge_limit;
        if (!take_reply(h, &rq, in.data + rq.head_len, &r, &huge_limit))
            break;
        more = send_reply(c, &r, rq.close, huge_limit);
        free(r.body);
        size_t used = rq.head_len + rq.body_len; /* keep pipelined bytes for the next round */
        memmove(in.data, in.data + used, in.len - used);
        in.len -= used;
    }
    free(in.data);
    close(c->fd);
    pthread_mutex_lock(&h->mu);
    c->finished = true;
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* ---- accepting ------------------------------------------------------------------------- */

/* Join connection threads that have ended, so that a long test does not pile them up. */
static void reap_finished(harness_http *h, bool all)
{
    http_conn **link = &h->conns;
    for (;;) {
        pthread_mutex_lock(&h->mu);
        http_conn *c = *link;
        bool join = c && (all || c->finished);
        if (join)
            *link = c->next;
        pthread_mutex_unlock(&h->mu);
        if (!c)
            return;
        if (!join) {
            link = &c->next;
            continue;
        }
        pthread_join(c->thread, NULL);
        free(c);
    }
}

static void start_conn(harness_http *h, int fd)
{
    http_conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return;
    }
    c->h = h;
    c->fd = fd;
    pthread_mutex_lock(&h->mu);
    if (pthread_create(&c->thread, NULL, conn_main, c) != 0) {
        pthread_mutex_unlock(&h->mu);
        fprintf(stderr, "harness http: cannot start a connection thread\n");
        close(fd);
        free(c);
        return;
    }
    c->next = h->conns;
    h->conns = c;
    pthread_mutex_unlock(&h->mu);
}

static void *accept_main(void *arg)
{
    harness_http *h = arg;
    struct pollfd fds[2] = {{.fd = h->listen_fd, .events = POLLIN},
                            {.fd = h->stop_pipe[0], .events = POLLIN}};
    for (;;) {
        if (poll(fds, 2, -1) < 0)
            continue; /* EINTR */
        if (fds[1].revents)
            return NULL;
        int fd = accept4(h->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            /* Out of fds or memory leaves the listener readable: pause instead of spinning. */
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                errno != ECONNABORTED)
                harness_sleep_ms(10);
            continue;
        }
        reap_finished(h, false);
        start_conn(h, fd);
    }
}

/* ---- public API ------------------------------------------------------------------------ */

static void set_reply(reply *r, const char *path, int status, const char *body, size_t len,
                      enum harness_http_mode mode)
{
    char *copy = malloc(len + 1);
    if (!copy) {
        fprintf(stderr, "harness http: out of memory for a %zu byte reply\n", len);
        abort();
    }
    if (len)
        memcpy(copy, body, len);
    copy[len] = '\0';
    free(r->body);
    snprintf(r->path, sizeof r->path, "%s", path ? path : "");
    r->status = status;
    r->body = copy;
    r->len = len;
    r->mode = mode;
}

harness_http *harness_http_open(void)
{
    harness_http *h = calloc(1, sizeof *h);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    if (!h)
        return NULL;
    h->stop_pipe[0] = h->stop_pipe[1] = -1;
    h->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (h->listen_fd < 0 || bind(h->listen_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(h->listen_fd, 128) != 0 ||
        getsockname(h->listen_fd, (struct sockaddr *)&a, &alen) != 0 ||
        pipe2(h->stop_pipe, O_CLOEXEC) != 0) {
        fprintf(stderr, "harness http: cannot listen on loopback: %s\n", strerror(errno));
        goto fail;
    }
    h->port = ntohs(a.sin_port);
    snprintf(h->url, sizeof h->url, "http://127.0.0.1:%d", h->port);
    pthread_mutex_init(&h->mu, NULL);
    set_reply(&h->dflt, NULL, 200, "{}", 2, HTTP_NORMAL);
    if (pthread_create(&h->accept_thread, NULL, accept_main, h) != 0) {
        fprintf(stderr, "harness http: cannot start its thread\n");
        free(h->dflt.body);
        pthread_mutex_destroy(&h->mu);
        goto fail;
    }
    return h;
fail:
    if (h->listen_fd >= 0)
        close(h->listen_fd);
    if (h->stop_pipe[0] >= 0)
        close(h->stop_pipe[0]), close(h->stop_pipe[1]);
    free(h);
    return NULL;
}

int harness_http_port(const harness_http *h)
{
    return h->port;
}

const char *harness_http_url(const harness_http *h)
{
    return h->url;
}

void harness_http_reply(harness_http *h, int status, const char *body, size_t body_len,
                        enum harness_http_mode mode)
{
    pthread_mutex_lock(&h->mu);
    set_reply(&h->dflt, NULL, status, body, body_len, mode);
    pthread_mutex_unlock(&h->mu);
}

void harness_http_reply_path(harness_http *h, const char *path, int status, const char *body,
                             size_t body_len, enum harness_http_mode mode)
{
    pthread_mutex_lock(&h->mu);
    int k = 0;
    while (k < h->npaths && strcmp(h->paths[k].path, path) != 0)
        k++;
    if (k == MAX_PATHS) {
        fprintf(stderr, "harness http: more than %d reply paths\n", MAX_PATHS);
        abort();
    }
    if (k == h->npaths)
        h->npaths++;
    set_reply(&h->paths[k], path, status, body, body_len, mode);
    pthread_mutex_unlock(&h->mu);
}

void harness_http_huge_limit(harness_http *h, size_t max_bytes)
{
    pthread_mutex_lock(&h->mu);
    h->huge_limit = max_bytes;
    pthread_mutex_unlock(&h->mu);
}

int harness_http_last_request(harness_http *h, char *path, size_t pathlen, char *body,
                              size_t bodylen)
{
    pthread_mutex_lock(&h->mu);
    if (path && pathlen)
        snprintf(path, pathlen, "%s", h->last_path);
    if (body && bodylen) {
        size_t n = h->last_body_len < bodylen - 1 ? h->last_body_len : bodylen - 1;
        if (n)
            memcpy(body, h->last_body, n);
        body[n] = '\0';
    }
    int count = h->requests;
    pthread_mutex_unlock(&h->mu);
    return count;
}

int harness_http_requests(harness_http *h)
{
    return harness_http_last_request(h, NULL, 0, NULL, 0);
}

void harness_http_close(harness_http *h)
{
    if (!h)
        return;
    if (write(h->stop_pipe[1], "s", 1) != 1) /* never drained: wakes every thread */
        fprintf(stderr, "harness http: cannot signal stop: %s\n", strerror(errno));
    pthread_join(h->accept_thread, NULL);
    reap_finished(h, true);
    close(h->listen_fd);
    close(h->stop_pipe[0]);
    close(h->stop_pipe[1]);
    free(h->dflt.body);
    for (int k = 0; k < h->npaths; k++)
        free(h->paths[k].body);
    free(h->last_body);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

/* health.c: a teacher's health check, one HTTP/1.1 GET at a time, non-blocking so the agent's
 * loop never waits on a slow or stopped server (a SIGSTOPped one accepts and never answers:
 * the deadline ends the check). The reply's status line decides; a numeric "load" in a JSON
 * body is what the agent publishes as the teacher's load. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent.h"
#include "edl/json.h"

void health_init(health_probe *h)
{
    memset(h, 0, sizeof *h);
    h->fd = -1;
}

void health_close(health_probe *h)
{
    if (h->fd >= 0)
        close(h->fd);
    health_init(h);
}

int health_start(health_probe *h, const char *addr, int port, const char *path,
                 int64_t timeout_ms)
{
    health_close(h);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
        return EDL_EINVAL;
    int n = snprintf(h->req, sizeof h->req, "GET %s HTTP/1.1\r\nHost: %s:%d\r\n"
                     "Accept: application/json\r\nConnection: close\r\n\r\n", path, addr, port);
    if (n < 0 || (size_t)n >= sizeof h->req)
        return EDL_EINVAL;
    h->req_len = (size_t)n;
    h->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (h->fd < 0)
        return EDL_EIO;
    if (connect(h->fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno != EINPROGRESS) {
        health_close(h);
        return EDL_EIO;
    }
    h->deadline_ms = edl_monotonic_ms() + timeout_ms;
    return 0;
}

short health_events(const health_probe *h)
{
    return h->fd < 0 ? 0 : h->sent ? POLLIN : POLLOUT;
}

/* The reply's numeric "load", else 0 (a body that is no JSON object is fine: no load). */
static double reply_load(const char *body, size_t n)
{
    cJSON *o = cJSON_ParseWithLength(body, n);
    const cJSON *l = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "load") : NULL;
    double load = cJSON_IsNumber(l) && l->valuedouble >= 0 && l->valuedouble < 1e9 ?
                  l->valuedouble : 0;
    cJSON_Delete(o);
    return load;
}

int health_reply(const char *buf, size_t n, bool eof, double *load)
{
    const char *end = memmem(buf, n, "\r\n\r\n", 4);
    if (!end && !eof)
        return 0;
    int code = 0;
    if (n < 12 || memcmp(buf, "HTTP/1.", 7) != 0 || sscanf(buf + 9, "%3d", &code) != 1)
        return -1;
    if (code < 200 || code > 299)
        return -1;
    if (!eof)
        return 0; /* the body ends with the connection */
    *load = end ? reply_load(end + 4, n - (size_t)(end + 4 - buf)) : 0;
    return 1;
}

/* Send what is left of the request once connected. -1 when the connection failed. */
static int send_request(health_probe *h)
{
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(h->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err)
        return -1;
    while (h->req_off < h->req_len) {
        ssize_t w = send(h->fd, h->req + h->req_off, h->req_len - h->req_off, MSG_NOSIGNAL);
        if (w < 0)
            return errno == EAGAIN || errno == EINTR ? 0 : -1;
        h->req_off += (size_t)w;
    }
    h->sent = true;
    return 0;
}

int health_step(health_probe *h, double *load)
{
    if (h->fd < 0)
        return -1;
    if (!h->sent)
        return send_request(h) < 0 ? (health_close(h), -1) : 0;
    for (;;) {
        char scratch[4096];
        bool room = h->len < sizeof h->buf - 1;
        ssize_t r = room ? read(h->fd, h->buf + h->len, sizeof h->buf - 1 - h->len)
                         : read(h->fd, scratch, sizeof scratch); /* the rest is not kept */
        if (r > 0) {
            if (room)
                h->len += (size_t)r;
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EINTR))
            return health_reply(h->buf, h->len, false, load) < 0 ? (health_close(h), -1) : 0;
        int rc = r == 0 ? health_reply(h->buf, h->len, true, load) : -1;
        health_close(h);
        return rc == 1 ? 1 : -1;
    }
}

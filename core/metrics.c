/* metrics.c: edl/metrics.h: the Prometheus text writer, and the /metrics server on top of
 * libmicrohttpd, polled from its owner's loop through MHD's epoll fd. MHD's own timeout is an
 * idle one (a client that sends a byte now and then keeps it off), so the server tracks each
 * connection's start itself (MHD's connection notifications) and shuts down, from the owner's
 * poll, every connection older than the whole-request deadline, and the oldest one when a
 * newcomer passes MAX_CONNS: slow clients cannot hold the scrapes off. */
#define _GNU_SOURCE
#include "edl/loop.h"
#include "edl/metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "edl/log.h"

#define MAX_CONNS 32           /* held at once; a newcomer past it cuts the oldest */
#define MHD_CONNS (2 * MAX_CONNS) /* MHD's own bound: room for the cut ones not yet closed */
#define CONN_TIMEOUT_S 5
#define REQUEST_DEADLINE_MS (CONN_TIMEOUT_S * 1000) /* a connection's whole life */
#define CONN_MEMORY (8 * 1024)

/* ---- the text format ------------------------------------------------------------------- */

static void put(edl_prom *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(edl_prom *p, const char *fmt, ...)
{
    while (!p->oom) {
        va_list ap;
        va_start(ap, fmt);
        int n = p->buf ? vsnprintf(p->buf + p->len, p->cap - p->len, fmt, ap) : -1;
        va_end(ap);
        if (n >= 0 && (size_t)n < p->cap - p->len) {
            p->len += (size_t)n;
            return;
        }
        size_t cap = p->cap ? p->cap * 2 : 4096;
        while (n >= 0 && cap - p->len <= (size_t)n)
            cap *= 2;
        char *b = realloc(p->buf, cap);
        if (!b)
            p->oom = true;
        else
            p->buf = b, p->cap = cap;
    }
}

/* {name="value" or ,name="value", the value escaped as the format requires (\\, \", \n). */
static void put_label(edl_prom *p, bool first, const char *name, const char *value)
{
    put(p, "%s%s=\"", first ? "{" : ",", name);
    for (const char *c = value ? value : ""; *c; c++) {
        if (*c == '\\' || *c == '"')
            put(p, "\\%c", *c);
        else if (*c == '\n')
            put(p, "\\n");
        else
            put(p, "%c", *c);
    }
    put(p, "\"");
}

void edl_prom_family(edl_prom *p, const char *name, const char *type, const char *help)
{
    put(p, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void edl_prom_sample(edl_prom *p, const char *name, const char *label, const char *label_value,
                     int64_t value)
{
    put(p, "%s", name);
    bool first = true;
    for (size_t i = 0; p->labels && p->labels[i] && p->labels[i + 1]; i += 2, first = false)
        put_label(p, first, p->labels[i], p->labels[i + 1]);
    if (label) {
        put_label(p, first, label, label_value);
        first = false;
    }
    put(p, "%s %lld\n", first ? "" : "}", (long long)value);
}

void edl_prom_metric(edl_prom *p, const char *name, const char *type, const char *help,
                     int64_t value)
{
    edl_prom_family(p, name, type, help);
    edl_prom_sample(p, name, NULL, NULL, value);
}

void edl_prom_observe(edl_prom_hist *h, double v)
{
    size_t i = 0;
    while (i < h->n && v > h->bounds[i])
        i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

/* The constant labels, then le="bound", closed. */
static void put_le(edl_prom *p, const char *name, const char *le, uint64_t v)
{
    put(p, "%s_bucket", name);
    bool first = true;
    for (size_t i = 0; p->labels && p->labels[i] && p->labels[i + 1]; i += 2, first = false)
        put_label(p, first, p->labels[i], p->labels[i + 1]);
    put_label(p, first, "le", le);
    put(p, "} %llu\n", (unsigned long long)v);
}

/* The constant labels on a _sum or _count line, or nothing. */
static void put_labels_closed(edl_prom *p)
{
    bool first = true;
    for (size_t i = 0; p->labels && p->labels[i] && p->labels[i + 1]; i += 2, first = false)
        put_label(p, first, p->labels[i], p->labels[i + 1]);
    if (!first)
        put(p, "}");
}

void edl_prom_histogram(edl_prom *p, const char *name, const char *help, const edl_prom_hist *h)
{
    edl_prom_family(p, name, "histogram", help);
    uint64_t cum = 0;
    char le[32];
    for (size_t i = 0; i < h->n && i < EDL_PROM_BUCKETS_MAX; i++) {
        cum += h->counts[i];
        snprintf(le, sizeof le, "%g", h->bounds[i]);
        put_le(p, name, le, cum);
    }
    put_le(p, name, "+Inf", h->count);
    put(p, "%s_sum", name);
    put_labels_closed(p);
    put(p, " %.6f\n%s_count", h->sum, name);
    put_labels_closed(p);
    put(p, " %llu\n", (unsigned long long)h->count);
}

/* ---- the server ------------------------------------------------------------------------ */

/* A connection MHD holds, from its start, oldest first in the server's list. */
typedef struct tracked {
    int fd;
    int64_t started; /* monotonic ms */
    bool cut;        /* shut down: MHD closes it when it next reads */
    struct tracked *prev, *next;
} tracked;

struct edl_metrics_server {
    struct MHD_Daemon *d;
    edl_metrics_fn fn;
    void *arg;
    int port;
    tracked *head, *tail;
    int live; /* tracked and not cut */
};

/* ---- each connection's deadline -------------------------------------------------------- */

/* End a connection that has had its time (or makes room): both directions shut, so MHD sees
 * its end at once, reads nothing more and closes it the usual way. */
static void cut(edl_metrics_server *s, tracked *t)
{
    if (t->cut)
        return;
    shutdown(t->fd, SHUT_RDWR);
    t->cut = true;
    s->live--;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **ctx,
                          enum MHD_ConnectionNotificationCode what)
{
    edl_metrics_server *s = cls;
    tracked *t = *ctx;
    if (what == MHD_CONNECTION_NOTIFY_CLOSED) {
        if (!t)
            return;
        if (!t->cut)
            s->live--;
        *(t->prev ? &t->prev->next : &s->head) = t->next;
        *(t->next ? &t->next->prev : &s->tail) = t->prev;
        free(t);
        *ctx = NULL;
        return;
    }
    const union MHD_ConnectionInfo *i =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!i || !(t = calloc(1, sizeof *t)))
        return; /* untracked: MHD's idle timeout and bound still hold it */
    *t = (tracked){.fd = i->connect_fd, .started = edl_monotonic_ms(), .prev = s->tail};
    *(s->tail ? &s->tail->next : &s->head) = t;
    s->tail = t;
    *ctx = t;
    s->live++;
    for (tracked *o = s->head; o && s->live > MAX_CONNS; o = o->next)
        cut(s, o); /* the oldest make room: a scrape is answered as soon as it arrives */
}

/* Cut every connection past its deadline; the time until the next one's (-1: none). */
static int64_t cut_overdue(edl_metrics_server *s)
{
    int64_t now = edl_monotonic_ms();
    for (tracked *t = s->head; t; t = t->next) {
        if (t->cut)
            continue;
        if (now - t->started < REQUEST_DEADLINE_MS)
            return t->started + REQUEST_DEADLINE_MS - now;
        cut(s, t);
    }
    return -1;
}

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status, const char *type,
                               char *body, size_t len, enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ok = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req_cls)
{
    (void)version, (void)upload_data, (void)upload_data_size, (void)req_cls;
    edl_metrics_server *s = cls;
    static const char text[] = "text/plain; charset=utf-8";
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return respond(conn, MHD_HTTP_METHOD_NOT_ALLOWED, text, (char *)"method not allowed\n",
                       19, MHD_RESPMEM_PERSISTENT);
    if (strcmp(url, "/healthz") == 0)
        return respond(conn, MHD_HTTP_OK, text, (char *)"ok\n", 3, MHD_RESPMEM_PERSISTENT);
    if (strcmp(url, "/metrics") != 0)
        return respond(conn, MHD_HTTP_NOT_FOUND, text, (char *)"not found\n", 10,
                       MHD_RESPMEM_PERSISTENT);
    edl_prom p = {0};
    s->fn(s->arg, &p);
    if (p.oom || !p.buf) {
        free(p.buf);
        return respond(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, text, (char *)"out of memory\n", 14,
                       MHD_RESPMEM_PERSISTENT);
    }
    return respond(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", p.buf, p.len,
                   MHD_RESPMEM_MUST_FREE);
}

__attribute__((format(printf, 2, 0)))
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\n")] = '\0';
    EDL_DEBUG("metrics", "%s", msg);
}

/* The listen address as a sockaddr; false when addr is not an IP literal. */
static bool listen_addr(const char *addr, int port, struct sockaddr_storage *ss, bool *v6)
{
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, addr, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        *v6 = false;
        return true;
    }
    if (inet_pton(AF_INET6, addr, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        *v6 = true;
        return true;
    }
    return false;
}

int edl_metrics_port_parse(const char *s, int *port)
{
    if (s && strcmp(s, "auto") == 0) {
        *port = EDL_METRICS_PORT_AUTO;
        return 0;
    }
    char *end;
    errno = 0;
    long v = s && *s >= '0' && *s <= '9' ? strtol(s, &end, 10) : -1; /* no sign, no space */
    if (v < 0 || *end || errno || v > 65535)
        return EDL_EINVAL;
    *port = (int)v;
    return 0;
}

bool edl_metrics_addr_valid(const char *addr)
{
    struct sockaddr_storage ss;
    bool v6;
    return addr && listen_addr(addr, 0, &ss, &v6);
}

int edl_metrics_open(const edl_metrics_opts *o, edl_metrics_fn fn, void *arg,
                     edl_metrics_server **out)
{
    *out = NULL;
    const char *addr = o && o->addr ? o->addr : "0.0.0.0";
    int port = o ? o->port : 0;
    struct sockaddr_storage ss;
    bool v6;
    if (!fn || port < 0 || port > 65535 || !listen_addr(addr, port, &ss, &v6))
        return EDL_EINVAL;
    edl_metrics_server *s = calloc(1, sizeof *s);
    if (!s)
        return EDL_ENOMEM;
    s->fn = fn;
    s->arg = arg;
    unsigned flags = MHD_USE_EPOLL | MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    s->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)MHD_CONNS,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)CONN_TIMEOUT_S,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONN_MEMORY,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    const union MHD_DaemonInfo *pi = s->d ? MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT)
                                          : NULL;
    if (!pi) {
        EDL_ERROR("metrics", "cannot listen on %s%s%s:%d (is the port taken?)", v6 ? "[" : "",
                  addr, v6 ? "]" : "", port);
        edl_metrics_close(s);
        return EDL_EIO;
    }
    s->port = pi->port;
    *out = s;
    return 0;
}

void edl_metrics_close(edl_metrics_server *s)
{
    if (!s)
        return;
    if (s->d)
        MHD_stop_daemon(s->d);
    free(s);
}

int edl_metrics_port(const edl_metrics_server *s)
{
    return s->port;
}

int edl_metrics_fd(const edl_metrics_server *s)
{
    const union MHD_DaemonInfo *i = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_EPOLL_FD);
    return i ? i->epoll_fd : -1;
}

int edl_metrics_timeout_ms(edl_metrics_server *s)
{
    MHD_UNSIGNED_LONG_LONG t;
    int64_t due = cut_overdue(s);
    if (MHD_get_timeout(s->d, &t) != MHD_YES)
        return (int)due;
    if (due >= 0 && (MHD_UNSIGNED_LONG_LONG)due < t)
        t = (MHD_UNSIGNED_LONG_LONG)due;
    return t > 60000 ? 60000 : (int)t;
}

void edl_metrics_serve(edl_metrics_server *s)
{
    MHD_run(s->d);
    cut_overdue(s);
}

static void serve_ready(edl_loop *l, int fd, int events, void *arg)
{
    (void)l, (void)fd, (void)events;
    edl_metrics_serve(arg);
}

static int64_t serve_due(void *arg)
{
    int t = edl_metrics_timeout_ms(arg);
    return t < 0 ? 0 : edl_monotonic_ms() + t;
}

static void serve_timeout(edl_loop *l, void *arg)
{
    (void)l;
    edl_metrics_serve(arg);
}

int edl_metrics_attach(edl_metrics_server *s, edl_loop *l)
{
    int rc = edl_loop_fd_add(l, edl_metrics_fd(s), EDL_LOOP_READ, serve_ready, s);
    return rc ? rc : edl_loop_timer_follow(l, serve_due, serve_timeout, s);
}

/* edl/metrics.h: the /metrics and /healthz endpoint of edl's daemons (the agent, the job
 * server), and the Prometheus text format they write.
 *
 * The server is libmicrohttpd in "external polling" mode: it has no thread of its own and
 * answers from its owner's poll() loop (one fd, one timeout), so the handler reads the owner's
 * state without locks. It answers GET and HEAD of /metrics (text format 0.0.4) and /healthz
 * ("ok"); other paths 404, other methods 405; every answer closes its connection. Bounded:
 * 32 connections (a newcomer past them closes the oldest), 8 KiB per request, 5 s per
 * connection from its start however it trickles in (closed from the owner's poll: call
 * edl_metrics_serve within edl_metrics_timeout_ms), so a scraper (or a stranger, or 32 slow
 * ones) can neither block the owner's loop, nor make it grow, nor keep the scrapes out. */
#ifndef EDL_METRICS_H
#define EDL_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "edl/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the text format ------------------------------------------------------------------- */

/* An exposition being written. Every sample carries the constant labels (name, value pairs,
 * NULL-terminated, e.g. {"job", "j", "pod", "p", NULL}); label values are escaped. */
typedef struct edl_prom {
    char *buf;
    size_t len, cap;
    bool oom;                  /* a write failed: the exposition is incomplete */
    const char *const *labels; /* constant labels */
} edl_prom;

/* One family with one sample: "# HELP", "# TYPE" and name{labels} value. type: "gauge" or
 * "counter". */
void edl_prom_metric(edl_prom *p, const char *name, const char *type, const char *help,
                     int64_t value);
/* A family's HELP and TYPE lines, for a family of several samples (edl_prom_sample). */
void edl_prom_family(edl_prom *p, const char *name, const char *type, const char *help);
/* One sample with the constant labels and one more label (label NULL: none). */
void edl_prom_sample(edl_prom *p, const char *name, const char *label, const char *label_value,
                     int64_t value);

/* A histogram of observations (seconds, bytes) in fixed buckets: edl_prom_observe counts one,
 * edl_prom_histogram writes the family (_bucket with le, _sum, _count), the buckets cumulative
 * as the format wants. */
#define EDL_PROM_BUCKETS_MAX 16
typedef struct edl_prom_hist {
    const double *bounds; /* upper bounds, ascending, n of them (+Inf is implied) */
    size_t n;             /* <= EDL_PROM_BUCKETS_MAX */
    uint64_t counts[EDL_PROM_BUCKETS_MAX + 1]; /* per bucket, not cumulative; [n]: above all */
    double sum;
    uint64_t count;
} edl_prom_hist;

void edl_prom_observe(edl_prom_hist *h, double v);
void edl_prom_histogram(edl_prom *p, const char *name, const char *help, const edl_prom_hist *h);

/* ---- the server ------------------------------------------------------------------------ */

typedef struct edl_metrics_server edl_metrics_server;

/* Writes the exposition for one GET /metrics. */
typedef void (*edl_metrics_fn)(void *arg, edl_prom *out);

typedef struct edl_metrics_opts {
    const char *addr; /* listen address, IPv4 or IPv6 literal (NULL: "0.0.0.0", every IPv4
                       * address; "::" every address) */
    int port;         /* 0: a free port (edl_metrics_port says which) */
} edl_metrics_opts;

/* A program's --metrics-port: 0..65535 (0: no /metrics), or "auto": a free port the program
 * binds itself and says where (EDL_METRICS_PORT_AUTO). A port picked for a program by another
 * is free only until the program binds it. 0 or EDL_EINVAL. */
enum { EDL_METRICS_PORT_AUTO = -1 };
int edl_metrics_port_parse(const char *s, int *port);
/* The edl_metrics_opts port for a parsed --metrics-port that is not 0. */
static inline int edl_metrics_listen_port(int parsed)
{
    return parsed == EDL_METRICS_PORT_AUTO ? 0 : parsed;
}

/* Whether addr is a listen address the server takes (an IPv4 or IPv6 literal): for checking a
 * command line before anything starts. */
bool edl_metrics_addr_valid(const char *addr);
/* EDL_EINVAL for a bad address or port, EDL_EIO when it cannot listen (the port is taken). */
int edl_metrics_open(const edl_metrics_opts *o, edl_metrics_fn fn, void *arg,
                     edl_metrics_server **out);
void edl_metrics_close(edl_metrics_server *s); /* NULL is fine */
int edl_metrics_port(const edl_metrics_server *s);
/* Poll this fd for POLLIN, no longer than edl_metrics_timeout_ms (-1: no limit), then call
 * edl_metrics_serve, which handles whatever is ready and never blocks. */
int edl_metrics_fd(const edl_metrics_server *s);
int edl_metrics_timeout_ms(edl_metrics_server *s);
void edl_metrics_serve(edl_metrics_server *s);
struct edl_loop;
/* Or let an edl_loop do both: register the fd and the timeout with it. EDL_ENOMEM. */
int edl_metrics_attach(edl_metrics_server *s, struct edl_loop *l);

#ifdef __cplusplus
}
#endif
#endif

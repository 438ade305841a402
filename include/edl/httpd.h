/* edl/httpd.h: a tiny non-blocking HTTP/1.1 server for /metrics and /healthz, driven by the
 * owner's poll() loop (no thread of its own).
 *
 * It serves GET (and HEAD) requests, one per connection ("Connection: close"). A request head
 * over the size limit, a malformed request line or a slow client are answered 400 / dropped,
 * so a scraper can never make the owner's loop block or grow without bound. */
#ifndef EDL_HTTPD_H
#define EDL_HTTPD_H

#include <poll.h>
#include <stddef.h>

#include "edl/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct edl_httpd edl_httpd;

typedef struct edl_http_response {
    int status;               /* 200, 404, ... */
    const char *content_type; /* NULL: "text/plain; charset=utf-8" */
    char *body;               /* malloc'ed by the handler, freed by the server (may be NULL) */
    size_t body_len;
} edl_http_response;

/* Called for every well-formed request; path excludes any "?query". */
typedef void (*edl_httpd_handler)(void *arg, const char *method, const char *path,
                                  edl_http_response *resp);

typedef struct edl_httpd_opts {
    const char *addr;         /* listen address (NULL: "0.0.0.0") */
    int port;                 /* 0: any free port (see edl_httpd_port) */
    size_t max_request;       /* largest request head (0: 8 KiB) */
    int max_conns;            /* connections held at once; more are refused (0: 32) */
    int idle_ms;              /* a connection that has not finished in this long is closed (5000) */
} edl_httpd_opts;

int edl_httpd_new(const edl_httpd_opts *opts, edl_httpd_handler h, void *arg, edl_httpd **out);
void edl_httpd_free(edl_httpd *s);
int edl_httpd_port(const edl_httpd *s);

/* The fds to poll now (listen socket and connections) into fds[0..max); returns the count. */
size_t edl_httpd_pollfds(edl_httpd *s, struct pollfd *fds, size_t max);
/* Handle what poll() reported for the fds that edl_httpd_pollfds() gave (same order). */
void edl_httpd_dispatch(edl_httpd *s, const struct pollfd *fds, size_t n);
/* Milliseconds until the next idle connection must be closed (-1: none). */
int edl_httpd_timeout_ms(const edl_httpd *s);

#ifdef __cplusplus
}
#endif
#endif

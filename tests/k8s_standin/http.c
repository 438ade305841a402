/* http.c: the HTTP server of k8s-standin (libmicrohttpd, one thread per connection so that
 * long watches never block other requests): request bodies (at most 3 MiB, else 413), bearer
 * token checks (401), the non-resource endpoints (/version, /healthz, /readyz, /livez,
 * discovery, /openapi/v3, the test-only /standin/ endpoints), then api.c for resources. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "standin.h"

typedef struct conn_ctx {
    char *body;
    size_t len, cap;
    bool too_big;
} conn_ctx;

/* `299 - "text"`, the text a quoted-string (RFC 7230: \" and \\), as the real server writes it. */
static void add_warning(struct MHD_Response *resp, const char *w, size_t n)
{
    char line[2100] = "299 - \"";
    size_t o = strlen(line);
    for (size_t i = 0; i < n && i < 1000; i++) {
        if (w[i] == '"' || w[i] == '\\')
            line[o++] = '\\';
        line[o++] = w[i];
    }
    line[o++] = '"';
    line[o] = '\0';
    MHD_add_response_header(resp, "Warning", line);
}

int si_send_text(struct MHD_Connection *c, int code, const char *ctype, char *text, size_t len,
                 const char *warning)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", ctype);
    MHD_add_response_header(resp, "Cache-Control", "no-cache, private");
    for (const char *w = warning; w && *w;) {
        size_t n = strcspn(w, "\n");
        add_warning(resp, w, n);
        w += n + (w[n] == '\n');
    }
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)code, resp);
    MHD_destroy_response(resp);
    return rc;
}

int si_send_json(struct MHD_Connection *c, int code, cJSON *body, const char *warning)
{
    char *s = cJSON_PrintUnformatted(body);
    cJSON_Delete(body);
    return si_send_text(c, code, "application/json", s, strlen(s), warning);
}

int si_send_status(struct MHD_Connection *c, int code, const char *reason, const char *message)
{
    return si_send_json(c, code, si_status_new(code, reason, message), NULL);
}

int si_send_result(struct MHD_Connection *c, si_result *res)
{
    int rc = si_send_json(c, res->code, res->body, res->warning);
    res->body = NULL;
    si_result_free(res);
    return rc;
}

static cJSON *version_json(int minor)
{
    char text[16], git[32];
    cJSON *v = cJSON_CreateObject();
    snprintf(text, sizeof text, "%d", minor);
    snprintf(git, sizeof git, "v1.%d.0-standin", minor);
    cJSON_AddStringToObject(v, "major", "1");
    cJSON_AddStringToObject(v, "minor", text);
    cJSON_AddStringToObject(v, "gitVersion", git);
    cJSON_AddStringToObject(v, "gitCommit", "0000000000000000000000000000000000000000");
    cJSON_AddStringToObject(v, "gitTreeState", "clean");
    cJSON_AddStringToObject(v, "buildDate", "2025-01-01T00:00:00Z");
    cJSON_AddStringToObject(v, "goVersion", "go1.22.0 (k8s-standin is written in C)");
    cJSON_AddStringToObject(v, "compiler", "gc");
    cJSON_AddStringToObject(v, "platform", "linux/amd64");
    return v;
}

/* POST/DELETE /standin/faults, GET/DELETE /standin/stats, GET /standin/access, POST
 * /standin/expire. */
static int standin_endpoint(si_server *srv, struct MHD_Connection *c, const char *url,
                            const char *method, conn_ctx *cc)
{
    char err[512];
    if (!strcmp(url, "/standin/faults") && !strcmp(method, "DELETE")) {
        si_faults_clear(srv->faults);
        return si_send_json(c, 200, cJSON_CreateObject(), NULL);
    }
    if (!strcmp(url, "/standin/faults") && !strcmp(method, "POST")) {
        cJSON *spec = cJSON_ParseWithLength(cc->body ? cc->body : "", cc->len), *one;
        int rc = spec ? 0 : -1;
        snprintf(err, sizeof err, "the body must be a JSON fault or an array of them");
        if (cJSON_IsArray(spec))
            cJSON_ArrayForEach(one, spec) rc = rc ? rc : si_faults_add(srv->faults, one, err, sizeof err);
        else if (spec)
            rc = si_faults_add(srv->faults, spec, err, sizeof err);
        cJSON_Delete(spec);
        return rc ? si_send_status(c, 400, "BadRequest", err)
                  : si_send_json(c, 201, cJSON_CreateObject(), NULL);
    }
    if (!strcmp(url, "/standin/stats") && (!strcmp(method, "GET") || !strcmp(method, "DELETE"))) {
        cJSON *stats = si_stats_json(srv->stats, method[0] == 'D');
        pthread_mutex_lock(&srv->store.mu);
        si_peaks_json(&srv->store, stats, method[0] == 'D');
        pthread_mutex_unlock(&srv->store.mu);
        return si_send_json(c, 200, stats, NULL);
    }
    if (!strcmp(url, "/standin/access") && !strcmp(method, "GET"))
        return si_send_json(c, 200, si_stats_json(srv->access, false), NULL);
    if (!strcmp(url, "/standin/expire") && !strcmp(method, "POST")) {
        char rv[32];
        pthread_mutex_lock(&srv->store.mu);
        si_store_expire(&srv->store);
        snprintf(rv, sizeof rv, "%llu", (unsigned long long)srv->store.rv);
        pthread_mutex_unlock(&srv->store.mu);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "resourceVersion", rv);
        return si_send_json(c, 200, o, NULL);
    }
    return si_send_status(c, 404, "NotFound", "the server could not find the requested resource");
}

static bool authorized(si_server *srv, struct MHD_Connection *c)
{
    if (!srv->cfg.token)
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    return h && !strncmp(h, "Bearer ", 7) && !strcmp(h + 7, srv->cfg.token);
}

static int non_resource(si_server *srv, struct MHD_Connection *c, const char *url,
                        const char *method, conn_ctx *cc, bool *handled)
{
    bool found;
    *handled = true;
    if (!strncmp(url, "/standin/", 9))
        return standin_endpoint(srv, c, url, method, cc);
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
        *handled = false;
        return MHD_NO;
    }
    if (!strcmp(url, "/version"))
        return si_send_json(c, 200, version_json(srv->cfg.kube_minor), NULL);
    if (!strcmp(url, "/healthz") || !strcmp(url, "/readyz") || !strcmp(url, "/livez"))
        return si_send_text(c, 200, "text/plain; charset=utf-8", strdup("ok"), 2, NULL);
    if (!strncmp(url, "/openapi/v3", 11)) {
        pthread_mutex_lock(&srv->store.mu);
        cJSON *doc = si_openapi_v3(&srv->store, url, &found);
        pthread_mutex_unlock(&srv->store.mu);
        if (doc)
            return si_send_json(c, 200, doc, NULL);
        return si_send_status(c, 404, "NotFound", "the server could not find the requested resource");
    }
    pthread_mutex_lock(&srv->store.mu);
    cJSON *doc = si_discovery(&srv->store, url, &found);
    pthread_mutex_unlock(&srv->store.mu);
    if (doc && found)
        return si_send_json(c, 200, doc, NULL);
    cJSON_Delete(doc);
    *handled = false;
    return MHD_NO;
}

static int handle(si_server *srv, struct MHD_Connection *c, const char *url, const char *method,
                  conn_ctx *cc)
{
    if (!authorized(srv, c))
        return si_send_status(c, 401, "Unauthorized", "Unauthorized");
    if (cc->too_big)
        return si_send_status(c, 413, "RequestEntityTooLarge",
                              "Request entity too large: limit is 3145728");
    bool handled;
    int rc = non_resource(srv, c, url, method, cc, &handled);
    if (handled)
        return rc;
    return si_api_handle(srv, c, url, method, cc->body ? cc->body : "", cc->len);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **ctx)
{
    si_server *srv = cls;
    conn_ctx *cc = *ctx;
    (void)version;
    if (!cc) {
        *ctx = calloc(1, sizeof(conn_ctx));
        return MHD_YES;
    }
    if (*upload_size) {
        if (cc->len + *upload_size > SI_MAX_BODY) {
            cc->too_big = true;
        } else if (!cc->too_big) {
            if (cc->len + *upload_size + 1 > cc->cap) {
                cc->cap = (cc->len + *upload_size + 1) * 2;
                cc->body = realloc(cc->body, cc->cap);
            }
            memcpy(cc->body + cc->len, upload, *upload_size);
            cc->len += *upload_size;
            cc->body[cc->len] = '\0';
        }
        *upload_size = 0;
        return MHD_YES;
    }
    return handle(srv, c, url, method, cc) == MHD_YES ? MHD_YES : MHD_NO;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **ctx,
                         enum MHD_RequestTerminationCode toe)
{
    conn_ctx *cc = *ctx;
    (void)cls;
    (void)c;
    (void)toe;
    if (cc) {
        free(cc->body);
        free(cc);
        *ctx = NULL;
    }
}

static int listen_on(si_server *srv)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)srv->cfg.port)};
    socklen_t len = sizeof sa;
    if (fd < 0 || inet_pton(AF_INET, srv->cfg.addr, &sa.sin_addr) != 1) {
        fprintf(stderr, "k8s-standin: --addr %s is not an IPv4 address\n", srv->cfg.addr);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 512) ||
        getsockname(fd, (struct sockaddr *)&sa, &len)) {
        fprintf(stderr, "k8s-standin: cannot listen on %s:%d: %m (choose another --port)\n",
                srv->cfg.addr, srv->cfg.port);
        close(fd);
        return -1;
    }
    srv->listen_fd = fd;
    srv->port = ntohs(sa.sin_port);
    return 0;
}

int si_http_start(si_server *srv)
{
    if (listen_on(srv))
        return -1;
    srv->mhd = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL, 0, NULL,
        NULL, on_request, srv, MHD_OPTION_LISTEN_SOCKET, srv->listen_fd,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)4000, MHD_OPTION_END);
    if (!srv->mhd) {
        fprintf(stderr, "k8s-standin: libmicrohttpd did not start on port %d\n", srv->port);
        close(srv->listen_fd);
        return -1;
    }
    return 0;
}

void si_http_stop(si_server *srv)
{
    srv->closing = 1;
    pthread_mutex_lock(&srv->store.mu);
    srv->store.closing = true;
    for (si_watch *w = srv->store.watches; w; w = w->next) {
        pthread_mutex_lock(&w->mu);
        pthread_cond_broadcast(&w->cond);
        pthread_mutex_unlock(&w->mu);
    }
    pthread_mutex_unlock(&srv->store.mu);
    if (srv->mhd)
        MHD_stop_daemon(srv->mhd);
    srv->mhd = NULL;
}

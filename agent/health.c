/* health.c: a teacher's health check, one HTTP GET at a time through libcurl's multi socket
 * interface, so the agent's loop never waits on a slow or stopped server (a SIGSTOPped one
 * accepts and never answers: the check's timeout ends it). libcurl tells which socket to watch
 * and when to call it back; the status decides; a numeric "load" in a JSON body is what the
 * agent publishes as the teacher's load. */
#include <stdio.h>
#include <string.h>

#include "agent.h"
#include "edl/http.h"
#include "edl/json.h"

void health_init(health_probe *h)
{
    memset(h, 0, sizeof *h);
    h->fd = -1;
}

void health_close(health_probe *h)
{
    if (h->easy) {
        curl_multi_remove_handle(h->multi, h->easy);
        curl_easy_cleanup(h->easy);
    }
    curl_slist_free_all(h->headers);
    CURLM *multi = h->multi;
    health_init(h);
    h->multi = multi;
}

void health_free(health_probe *h)
{
    health_close(h);
    if (h->multi)
        curl_multi_cleanup(h->multi);
    health_init(h);
}

static int on_socket(CURL *e, curl_socket_t s, int what, void *arg, void *sockp)
{
    health_probe *h = arg;
    (void)e, (void)sockp;
    if (what == CURL_POLL_REMOVE) {
        if (h->fd == s)
            h->fd = -1, h->events = 0;
        return 0;
    }
    h->fd = s;
    h->events = (short)((what & CURL_POLL_IN ? POLLIN : 0) | (what & CURL_POLL_OUT ? POLLOUT : 0));
    return 0;
}

static int on_timer(CURLM *m, long ms, void *arg)
{
    health_probe *h = arg;
    (void)m;
    h->timer_at_ms = ms < 0 ? 0 : edl_monotonic_ms() + ms;
    return 0;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    health_probe *h = arg;
    size_t room = sizeof h->buf - 1 - h->len, k = size * n < room ? size * n : room;
    memcpy(h->buf + h->len, p, k); /* the rest is not kept */
    h->len += k;
    return size * n;
}

static int make_multi(health_probe *h)
{
    if (h->multi)
        return 0;
    if (!(h->multi = curl_multi_init()))
        return EDL_ENOMEM;
    curl_multi_setopt(h->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(h->multi, CURLMOPT_SOCKETDATA, h);
    curl_multi_setopt(h->multi, CURLMOPT_TIMERFUNCTION, on_timer);
    curl_multi_setopt(h->multi, CURLMOPT_TIMERDATA, h);
    return 0;
}

int health_start(health_probe *h, const char *addr, int port, const char *path,
                 int64_t timeout_ms)
{
    char url[600];
    bool v6 = strchr(addr, ':') != NULL;
    int n = snprintf(url, sizeof url, "http://%s%s%s:%d%s", v6 ? "[" : "", addr, v6 ? "]" : "",
                     port, path);
    health_close(h);
    if (n < 0 || (size_t)n >= sizeof url || path[0] != '/')
        return EDL_EINVAL;
    edl_http_global_init();
    if (make_multi(h) != 0 || !(h->easy = curl_easy_init()) ||
        !(h->headers = curl_slist_append(NULL, "Accept: application/json"))) {
        health_close(h);
        return EDL_ENOMEM;
    }
    edl_http_prepare(h->easy, &(edl_http_opts){.timeout_ms = timeout_ms});
    curl_easy_setopt(h->easy, CURLOPT_URL, url); /* http://, built above */
    curl_easy_setopt(h->easy, CURLOPT_HTTPHEADER, h->headers);
    curl_easy_setopt(h->easy, CURLOPT_FORBID_REUSE, 1L);
    curl_easy_setopt(h->easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h->easy, CURLOPT_WRITEDATA, h);
    if (curl_multi_add_handle(h->multi, h->easy) != CURLM_OK) {
        health_close(h);
        return EDL_ENOMEM;
    }
    h->deadline_ms = edl_monotonic_ms() + timeout_ms;
    int running;
    curl_multi_socket_action(h->multi, CURL_SOCKET_TIMEOUT, 0, &running); /* connects */
    return 0;
}

bool health_busy(const health_probe *h)
{
    return h->easy != NULL;
}

void health_poll_fd(const health_probe *h, struct pollfd *p)
{
    *p = (struct pollfd){.fd = h->easy ? h->fd : -1, .events = h->easy ? h->events : 0};
}

int64_t health_due(const health_probe *h)
{
    if (!h->easy)
        return 0;
    return h->timer_at_ms && h->timer_at_ms < h->deadline_ms ? h->timer_at_ms : h->deadline_ms;
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

int health_step(health_probe *h, short revents, double *load)
{
    int running, left;
    if (!h->easy)
        return -1;
    if (revents && h->fd >= 0)
        curl_multi_socket_action(h->multi, h->fd, (revents & POLLIN ? CURL_CSELECT_IN : 0) |
                                 (revents & POLLOUT ? CURL_CSELECT_OUT : 0) |
                                 (revents & (POLLERR | POLLHUP) ? CURL_CSELECT_ERR : 0),
                                 &running);
    if (h->timer_at_ms && edl_monotonic_ms() >= h->timer_at_ms) {
        h->timer_at_ms = 0;
        curl_multi_socket_action(h->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    }
    CURLMsg *m = curl_multi_info_read(h->multi, &left);
    if (!m || m->msg != CURLMSG_DONE)
        return 0;
    long code = 0;
    curl_easy_getinfo(h->easy, CURLINFO_RESPONSE_CODE, &code);
    bool ok = m->data.result == CURLE_OK && code >= 200 && code <= 299;
    if (ok)
        *load = reply_load(h->buf, h->len);
    health_close(h);
    return ok ? 1 : -1;
}

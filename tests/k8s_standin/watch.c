/* watch.c: the HTTP side of a watch: a chunked response, one JSON event per line
 * (ADDED/MODIFIED/DELETED/BOOKMARK/ERROR), objects or one-row Tables, bookmarks every
 * --bookmark-ms when asked for, an end at timeoutSeconds, at shutdown, when the client hangs
 * up, or when the watcher fell too far behind (its queue overflowed). Runs in the
 * connection's own thread (libmicrohttpd thread-per-connection). */
#define _GNU_SOURCE /* POLLRDHUP */
#include <microhttpd.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

typedef struct stream {
    si_server *srv;
    si_watch *w;
    bool table, bookmarks, hangup;
    int64_t deadline_ms, next_bookmark_ms;
    int fd;
    char *buf;
    size_t len, off;
} stream;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void set_line(stream *st, const char *type, cJSON *obj)
{
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddStringToObject(ev, "type", type);
    cJSON_AddItemToObject(ev, "object", obj);
    char *s = cJSON_PrintUnformatted(ev);
    cJSON_Delete(ev);
    size_t n = strlen(s);
    st->buf = realloc(s, n + 2);
    st->buf[n] = '\n';
    st->buf[n + 1] = '\0';
    st->len = n + 1;
    st->off = 0;
}

char *si_watch_gone_line(uint64_t asked, uint64_t oldest)
{
    char msg[128];
    snprintf(msg, sizeof msg, "too old resource version: %llu (%llu)", (unsigned long long)asked,
             (unsigned long long)oldest);
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddStringToObject(ev, "type", "ERROR");
    cJSON_AddItemToObject(ev, "object", si_status_new(410, "Expired", msg));
    char *s = cJSON_PrintUnformatted(ev), *line = malloc(strlen(s) + 2);
    sprintf(line, "%s\n", s);
    free(s);
    cJSON_Delete(ev);
    return line;
}

static void format_event(stream *st, si_event *e)
{
    static const char *const names[] = {"ADDED", "MODIFIED", "DELETED"};
    cJSON *obj;
    if (st->table) {
        cJSON *one = cJSON_CreateArray();
        char rv[32];
        cJSON_AddItemToArray(one, cJSON_Duplicate(e->obj->json, true));
        snprintf(rv, sizeof rv, "%llu", (unsigned long long)e->rv);
        pthread_mutex_lock(&st->srv->store.mu); /* the CRD's columns may change meanwhile */
        obj = si_table(e->res, one, rv, 1, true);
        pthread_mutex_unlock(&st->srv->store.mu);
        cJSON_Delete(one);
    } else {
        obj = cJSON_Duplicate(e->obj->json, true);
    }
    set_line(st, names[e->type], obj);
}

/* A bookmark at the current version, when nothing older waits in the queue. */
static bool try_bookmark(stream *st)
{
    si_store *s = &st->srv->store;
    char rv[32], av[300];
    pthread_mutex_lock(&s->mu);
    pthread_mutex_lock(&st->w->mu);
    bool empty = st->w->head == NULL;
    pthread_mutex_unlock(&st->w->mu);
    snprintf(rv, sizeof rv, "%llu", (unsigned long long)s->rv);
    pthread_mutex_unlock(&s->mu);
    if (!empty)
        return false;
    si_api_version(st->w->res, av, sizeof av);
    cJSON *obj = cJSON_CreateObject();
    cJSON_AddStringToObject(obj, "kind", st->w->res->kind);
    cJSON_AddStringToObject(obj, "apiVersion", av);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(obj, "metadata"), "resourceVersion", rv);
    set_line(st, "BOOKMARK", obj);
    st->next_bookmark_ms = now_ms() + st->srv->cfg.bookmark_ms;
    return true;
}

static bool client_gone(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* Wait up to 250 ms for an event (or an end). */
static void wait_a_little(si_watch *w)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 250 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&w->mu);
    if (!w->head && !w->overflow && !w->closed)
        pthread_cond_timedwait(&w->cond, &w->mu, &ts);
    pthread_mutex_unlock(&w->mu);
}

static bool next_line(stream *st)
{
    while (st->w && !st->srv->closing) {
        si_event *e = si_watch_pop(st->w);
        if (e) {
            format_event(st, e);
            si_event_unref(e);
            return true;
        }
        if (st->w->overflow || st->w->closed)
            return false;
        int64_t now = now_ms();
        if (st->deadline_ms && now >= st->deadline_ms)
            return false;
        if (st->bookmarks && now >= st->next_bookmark_ms && try_bookmark(st))
            return true;
        wait_a_little(st->w);
        if (client_gone(st->fd)) {
            st->hangup = true;
            return false;
        }
    }
    return false;
}

static ssize_t reader(void *cls, uint64_t pos, char *out, size_t max)
{
    stream *st = cls;
    (void)pos;
    if (st->off >= st->len) {
        free(st->buf);
        st->buf = NULL;
        st->len = st->off = 0;
        if (!next_line(st))
            return st->hangup ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
    }
    size_t n = st->len - st->off < max ? st->len - st->off : max;
    memcpy(out, st->buf + st->off, n);
    st->off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    stream *st = cls;
    if (st->w) {
        pthread_mutex_lock(&st->srv->store.mu);
        si_watch_stop(&st->srv->store, st->w);
        pthread_mutex_unlock(&st->srv->store.mu);
        si_selector_free(st->w->labels);
        si_selector_free(st->w->fields);
        pthread_mutex_destroy(&st->w->mu);
        pthread_cond_destroy(&st->w->cond);
        free(st->w);
    }
    free(st->buf);
    free(st);
}

struct MHD_Response *si_watch_response(si_server *srv, struct MHD_Connection *conn,
                                       si_watch *w, bool table, bool bookmarks, int timeout_s,
                                       const char *error)
{
    stream *st = calloc(1, sizeof *st);
    st->srv = srv;
    st->w = w;
    st->table = table;
    st->bookmarks = bookmarks;
    st->deadline_ms = timeout_s > 0 ? now_ms() + (int64_t)timeout_s * 1000 : 0;
    st->next_bookmark_ms = now_ms() + srv->cfg.bookmark_ms;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    st->fd = ci ? ci->connect_fd : -1;
    if (error) {
        st->buf = strdup(error);
        st->len = strlen(error);
    }
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, reader, st, stream_free);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    MHD_add_response_header(resp, "Cache-Control", "no-cache, private");
    return resp;
}

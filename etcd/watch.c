/* watch.c: streaming watches that never skip an event.
 *
 * Each watch runs one thread with its own connection (a libcurl multi handle, so a stop wakes
 * it at once). The gateway streams newline-delimited {"result":{...}} messages; the thread
 * turns them into events on a bounded queue (a full queue pauses the stream: back-pressure,
 * never drops). It remembers the next revision it owes the caller; when the connection drops
 * it reconnects, on any endpoint, from that revision. When that revision was compacted the
 * caller gets a COMPACTED event and the watch goes on from the oldest revision still kept. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "edl/json.h"
#include "edl/log.h"
#include "edl/queue.h"
#include "internal.h"

struct edl_watch {
    edl_etcd *conn;   /* own client: config, endpoint rotation, auth token */
    char *key, *range_end;
    size_t key_len, range_end_len;
    bool prev_kv, progress_notify;

    pthread_t thread;
    CURLM *multi;
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* creation, stop */
    edl_queue *q;          /* the events, handed to the caller's loop (edl/queue.h) */
    bool stop;
    bool created;          /* the server confirmed the current stream */
    bool ever_created;
    int start_error;       /* why the first creation failed */

    /* owned by the watch thread */
    int64_t next_rev;      /* the first revision not yet delivered (0: from now) */
    edl_bytebuf line;         /* partial stream line */
    bool restart;          /* the stream must be reopened (compaction, auth) */
    bool fatal;
};

static void watch_event_free(edl_watch_event *ev)
{
    if (!ev)
        return;
    kv_clear(&ev->kv);
    edl_kv_free(ev->prev_kv);
    free(ev);
}

void edl_watch_event_free(edl_watch_event *ev)
{
    watch_event_free(ev);
}

/* Queue an event; waits while the queue is full (back-pressure). False when stopping. */
static bool push(edl_watch *w, edl_watch_event *ev)
{
    if (edl_queue_push(w->q, ev))
        return true;
    watch_event_free(ev);
    return false;
}

static bool push_simple(edl_watch *w, edl_watch_event_type type, int64_t rev, int64_t compact, int err)
{
    edl_watch_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return false;
    ev->type = type;
    ev->revision = rev;
    ev->compact_revision = compact;
    ev->error = err;
    return push(w, ev);
}

static void mark_created(edl_watch *w, int error)
{
    pthread_mutex_lock(&w->mu);
    if (error && !w->ever_created)
        w->start_error = error;
    if (!error) {
        w->created = true;
        w->ever_created = true;
    }
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* One event object of a message. */
static int event_parse(const cJSON *j, bool want_prev, edl_watch_event **out)
{
    edl_watch_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return EDL_ENOMEM;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    int rc = 0;
    if (!cJSON_IsObject(j) || (type && !cJSON_IsString(type)))
        rc = EDL_EPROTO;
    else if (type && strcmp(type->valuestring, "DELETE") == 0)
        ev->type = EDL_WATCH_DELETE;
    else if (type && strcmp(type->valuestring, "PUT") != 0)
        rc = EDL_EPROTO;
    if (!rc)
        rc = kv_parse(cJSON_GetObjectItemCaseSensitive(j, "kv"), &ev->kv);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prev_kv");
    if (!rc && want_prev && p && !cJSON_IsNull(p)) {
        if (!(ev->prev_kv = malloc(sizeof *ev->prev_kv)))
            rc = EDL_ENOMEM;
        else if ((rc = kv_parse(p, ev->prev_kv)) != 0) {
            free(ev->prev_kv);
            ev->prev_kv = NULL;
        }
    }
    if (!rc && ev->kv.mod_revision <= 0)
        rc = EDL_EPROTO;
    if (rc) {
        watch_event_free(ev);
        return rc;
    }
    ev->revision = ev->kv.mod_revision;
    *out = ev;
    return 0;
}

static void watch_fatal(edl_watch *w, int code, const char *why)
{
    etcd_fail(w->conn, code, "watch on %s: %s", edl_etcd_endpoint(w->conn), why);
    w->fatal = true;
    mark_created(w, code);
    if (w->ever_created)
        push_simple(w, EDL_WATCH_ERROR, w->next_rev, 0, code);
}

void watch_msg_clear(watch_msg *m)
{
    for (size_t i = 0; i < m->n_events; i++)
        watch_event_free(m->events[i]);
    free(m->events);
    cJSON_Delete(m->root);
    memset(m, 0, sizeof *m);
}

/* The events of a message; all or none (a message is one or more whole revisions). */
static int events_parse(const cJSON *events, bool want_prev, watch_msg *m)
{
    int n = cJSON_GetArraySize(events);
    if (n == 0)
        return 0;
    if (!(m->events = calloc((size_t)n, sizeof *m->events)))
        return EDL_ENOMEM;
    const cJSON *it;
    cJSON_ArrayForEach(it, events) {
        int rc = event_parse(it, want_prev, &m->events[m->n_events]);
        if (rc) {
            while (m->n_events)
                watch_event_free(m->events[--m->n_events]);
            return rc;
        }
        m->n_events++;
    }
    return 0;
}

int watch_msg_parse(const char *line, size_t len, bool want_prev, watch_msg *m, const char **why)
{
    memset(m, 0, sizeof *m);
    *why = "malformed stream message";
    m->root = cJSON_ParseWithLength(line, len);
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(m->root, "result");
    if (!cJSON_IsObject(res)) {
        /* the gateway reports a broken stream as {"error":{...}}: reconnect */
        m->error = cJSON_GetObjectItemCaseSensitive(m->root, "error") != NULL;
        return m->error ? 0 : EDL_EPROTO;
    }
    const cJSON *hdr = cJSON_GetObjectItemCaseSensitive(res, "header");
    *why = "bad header revision";
    if (json_i64(cJSON_IsObject(hdr) ? hdr : NULL, "revision", &m->revision) != 0)
        return EDL_EPROTO;
    json_bool(res, "created", &m->created);
    json_bool(res, "canceled", &m->canceled);
    if (m->canceled) {
        json_i64(res, "compact_revision", &m->compact_revision);
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(res, "cancel_reason");
        m->cancel_reason = cJSON_IsString(r) ? r->valuestring : "";
        return 0;
    }
    const cJSON *events = cJSON_GetObjectItemCaseSensitive(res, "events");
    *why = "events is not an array";
    if (events && !cJSON_IsArray(events))
        return EDL_EPROTO;
    *why = "malformed event in the stream";
    return events ? events_parse(events, want_prev, m) : 0;
}

static void handle_canceled(edl_watch *w, int64_t compact, const char *reason)
{
    w->restart = true;
    if (compact > 0) {
        EDL_WARN("etcd", "watch: revision %lld was compacted (oldest kept %lld); the caller re-reads",
                 (long long)w->next_rev, (long long)compact);
        mark_created(w, 0);
        push_simple(w, EDL_WATCH_COMPACTED, compact, compact, 0);
        w->next_rev = compact;
    } else if (strstr(reason, "auth") || strstr(reason, "token") || strstr(reason, "permission")) {
        /* the token expired (or auth was turned on): renew it and watch again */
        free(w->conn->token);
        w->conn->token = NULL;
        if (strstr(reason, "permission"))
            watch_fatal(w, EDL_EAUTH, reason);
    } else {
        watch_fatal(w, EDL_ESERVER, reason[0] ? reason : "canceled by the server");
    }
}

/* Hand a message's events to the caller, skipping a replay after reconnecting (revisions
 * already delivered). False when stopping. */
static bool deliver(edl_watch *w, watch_msg *m)
{
    for (size_t k = 0; k < m->n_events; k++) {
        edl_watch_event *ev = m->events[k];
        int64_t r = ev->revision;
        if (r < w->next_rev)
            continue; /* freed with the message */
        m->events[k] = NULL; /* push owns it, even when it fails */
        if (!push(w, ev))
            return false;
        if (k == m->n_events - 1 || m->events[k + 1]->revision != r)
            w->next_rev = r + 1;
    }
    return true;
}

/* One stream message. Returns false to close the stream. */
static bool handle_message(edl_watch *w, const char *line, size_t len)
{
    watch_msg m;
    const char *why;
    int rc = watch_msg_parse(line, len, w->prev_kv, &m, &why);
    bool ok = false;
    if (!rc && m.canceled) {
        handle_canceled(w, m.compact_revision, m.cancel_reason);
    } else if (rc || !m.error) {
        if (m.created) { /* also when its events are malformed: the stream was created */
            if (w->next_rev == 0)
                w->next_rev = m.revision + 1; /* "from now": everything after the creation */
            mark_created(w, 0);
        }
        if (rc)
            watch_fatal(w, rc, why);
        else if ((ok = deliver(w, &m)) && m.n_events == 0 && !m.created) {
            /* progress notification: nothing happened up to rev */
            if (m.revision >= w->next_rev)
                w->next_rev = m.revision + 1;
            ok = push_simple(w, EDL_WATCH_PROGRESS, m.revision, 0, 0);
        }
    }
    watch_msg_clear(&m);
    return ok;
}

static bool on_line(void *w, const char *line, size_t len)
{
    return handle_message(w, line, len);
}

static size_t on_stream(char *ptr, size_t size, size_t nmemb, void *arg)
{
    edl_watch *w = arg;
    int rc = edl_lines_feed(&w->line, ptr, size * nmemb, on_line, w);
    if (rc == EDL_ETOOBIG || rc == EDL_ENOMEM)
        watch_fatal(w, EDL_ETOOBIG, "a stream message exceeds the reply size limit");
    return rc ? 0 : size * nmemb; /* 0 closes this stream; the thread decides what comes next */
}

static bool stop_asked(void *arg)
{
    edl_watch *w = arg;
    pthread_mutex_lock(&w->mu);
    bool stop = w->stop;
    pthread_mutex_unlock(&w->mu);
    return stop;
}

static int xfer_check(void *arg, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    (void)a, (void)b, (void)c, (void)d;
    return stop_asked(arg);
}

static char *create_body(edl_watch *w)
{
    cJSON *req = cJSON_CreateObject(), *cr = cJSON_AddObjectToObject(req, "create_request");
    bool ok = cr && json_add_b64(cr, "key", edl_bytes(w->key, w->key_len));
    if (ok && w->range_end_len)
        ok = json_add_b64(cr, "range_end", edl_bytes(w->range_end, w->range_end_len)) != NULL;
    if (ok && w->next_rev > 0)
        ok = json_add_i64(cr, "start_revision", w->next_rev) != NULL;
    if (ok && w->prev_kv)
        ok = cJSON_AddTrueToObject(cr, "prev_kv") != NULL;
    if (ok && w->progress_notify)
        ok = cJSON_AddTrueToObject(cr, "progress_notify") != NULL;
    char *s = ok ? edl_json_print(req, false) : NULL;
    cJSON_Delete(req);
    return s;
}

/* Run one stream until it ends. Returns the curl result and the HTTP status. */
static CURLcode run_stream(edl_watch *w, const char *endpoint, long *status)
{
    char url[512];
    snprintf(url, sizeof url, "%s/v3/watch", endpoint);
    char *body = create_body(w);
    struct curl_slist *hdrs = body ? etcd_headers(w->conn) : NULL;
    CURL *h = curl_easy_init();
    CURLcode cc = CURLE_OUT_OF_MEMORY;
    *status = 0;
    if (body && hdrs && h) {
        etcd_curl_common(w->conn, h);
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_stream);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, w);
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, xfer_check);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, w);
        cc = edl_http_perform(w->multi, h, stop_asked, w);
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    }
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    free(body);
    return cc;
}

static void *watch_main(void *arg)
{
    edl_watch *w = arg;
    int failures = 0; /* in a row, since a stream last worked */
    while (!stop_asked(w) && !w->fatal) {
        edl_etcd *c = w->conn;
        const char *ep = c->cfg.endpoints[c->cur];
        if (c->cfg.username && !c->token) {
            pthread_mutex_lock(&c->mu);
            int rc = etcd_authenticate_locked(c, ep);
            pthread_mutex_unlock(&c->mu);
            if (rc == EDL_EAUTH) {
                watch_fatal(w, rc, c->errmsg);
                break;
            }
        }
        w->restart = false;
        w->line.len = 0;
        pthread_mutex_lock(&w->mu);
        w->created = false;
        pthread_mutex_unlock(&w->mu);
        long status;
        CURLcode cc = run_stream(w, ep, &status);
        if (stop_asked(w) || w->fatal)
            break;
        if (w->restart) {
            failures = 0;
            continue;
        }
        bool was_created = w->created;
        if (status == 401 || status == 403) {
            if (status == 403 || !c->cfg.username) {
                watch_fatal(w, EDL_EAUTH, "permission denied (HTTP 403/401)");
                break;
            }
            free(c->token);
            c->token = NULL;
            continue;
        }
        EDL_INFO("etcd", "watch stream on %s ended (%s, HTTP %ld); resuming from revision %lld",
                 ep, curl_easy_strerror(cc), status, (long long)w->next_rev);
        etcd_fail(c, EDL_EUNAVAIL, "watch on %s: %s", ep, curl_easy_strerror(cc));
        c->cur = (c->cur + 1) % c->cfg.n_endpoints;
        if (was_created)
            failures = 0;
        /* wait before the next try, waking at once on stop */
        int64_t nap = edl_http_backoff_ms(failures++, 50, 1000, -1);
        pthread_mutex_lock(&w->mu);
        if (!w->stop)
            edl_cond_wait_ms(&w->cv, &w->mu, nap);
        pthread_mutex_unlock(&w->mu);
    }
    mark_created(w, EDL_ECLOSED);
    return NULL;
}

static void free_event(void *ev)
{
    watch_event_free(ev);
}

static void watch_destroy(edl_watch *w)
{
    edl_queue_close(w->q, free_event);
    if (w->multi)
        curl_multi_cleanup(w->multi);
    edl_etcd_close(w->conn);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w->line.data);
    free(w->key);
    free(w->range_end);
    free(w);
}

static int watch_init(edl_watch *w, edl_etcd *c, edl_buf key, const edl_watch_opts *o)
{
    pthread_mutex_init(&w->mu, NULL);
    edl_cond_init(&w->cv);
    w->line.max = (size_t)c->cfg.max_response_bytes;
    w->prev_kv = o->prev_kv;
    w->progress_notify = o->progress_notify;
    w->next_rev = o->start_revision;
    int qrc = edl_queue_open(o->max_queued, &w->q);
    if (qrc)
        return qrc;
    if (!(w->multi = curl_multi_init()) || !(w->key = malloc(key.len + 1)))
        return EDL_ENOMEM;
    memcpy(w->key, key.data, key.len);
    w->key_len = key.len;
    int rc = 0;
    if (o->prefix) {
        rc = edl_etcd_prefix_end(key, &w->range_end, &w->range_end_len);
    } else if (o->range_end.len) {
        if (!(w->range_end = malloc(o->range_end.len)))
            return EDL_ENOMEM;
        memcpy(w->range_end, o->range_end.data, o->range_end.len);
        w->range_end_len = o->range_end.len;
    }
    return rc ? rc : edl_etcd_open(&c->cfg, &w->conn);
}

int edl_watch_open(edl_etcd *c, edl_buf key, const edl_watch_opts *opts, edl_watch **out)
{
    edl_watch_opts d = {0};
    char ks[96];
    *out = NULL;
    if (!opts)
        opts = &d;
    if (opts->start_revision < 0)
        return etcd_fail(c, EDL_EINVAL, "watch: negative start revision");
    edl_watch *w = calloc(1, sizeof *w);
    if (!w)
        return EDL_ENOMEM;
    int rc = watch_init(w, c, key, opts);
    if (!rc && pthread_create(&w->thread, NULL, watch_main, w) != 0)
        rc = EDL_ENOMEM;
    if (rc) {
        watch_destroy(w);
        return etcd_fail(c, rc, "watch on key '%s': cannot start (%s)", etcd_key_str(key, ks, sizeof ks),
                         edl_strerror(rc));
    }
    /* Wait for the server to create it: afterwards no write can slip past unseen. */
    int64_t deadline = edl_monotonic_ms() + c->cfg.timeout_ms;
    pthread_mutex_lock(&w->mu);
    while (!w->ever_created && !w->start_error && edl_monotonic_ms() < deadline)
        edl_cond_wait_ms(&w->cv, &w->mu, deadline - edl_monotonic_ms()); /* woken by mark_created */
    rc = w->ever_created ? 0 : w->start_error ? w->start_error : EDL_EUNAVAIL;
    pthread_mutex_unlock(&w->mu);
    if (rc) {
        etcd_fail(c, rc, "watch on key '%s': %s", etcd_key_str(key, ks, sizeof ks),
                  w->conn->errmsg[0] ? w->conn->errmsg : "not created within the timeout");
        edl_watch_close(w);
        return rc;
    }
    *out = w;
    return 0;
}

int edl_watch_next(edl_watch *w, edl_watch_event **ev, int timeout_ms)
{
    void *item;
    int rc = edl_queue_pop(w->q, &item, timeout_ms);
    *ev = rc ? NULL : item;
    return rc;
}

int edl_watch_fd(const edl_watch *w)
{
    return edl_queue_fd(w->q);
}

void edl_watch_close(edl_watch *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    edl_queue_stop(w->q); /* a stream waiting for room gives up */
    curl_multi_wakeup(w->multi);
    pthread_join(w->thread, NULL);
    watch_destroy(w);
}

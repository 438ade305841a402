/* informer.c: list then watch one collection, as client-go's reflector does, feeding a local
 * cache that only the caller's thread touches.
 *
 * A thread of its own (own curl handle in a multi handle, so close wakes it at once) lists
 * (in pages), then watches from the list's resourceVersion, line by line. It never touches the
 * cache: it queues what it read (one event, or a whole list) on an edl_queue, whose fd is readable;
 * edl_k8s_informer_next applies one event at a time on the caller's thread. A watch that ends
 * (the server's timeout) is opened again from the last resourceVersion (bookmarks move it); a
 * 410, as a reply or an in-stream ERROR, relists, and the caller sees the difference (ADDED or
 * MODIFIED for what changed, DELETED for what vanished, then SYNCED). Anything malformed is
 * logged and answered by a relist after a back-off, never by a guess. */
#define _GNU_SOURCE /* asprintf */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "edl/log.h"
#include "edl/queue.h"
#include "internal.h"

#define LIST_PAGE 500
#define WATCH_TIMEOUT_S 300
#define BACKOFF_MIN_MS 200
#define BACKOFF_MAX_MS 5000
#define MAX_QUEUED 65536
#define Q_LIST 0 /* a queue item holding a whole list */
#define Q_MORE -1 /* the marker that keeps the fd readable while a relist is pending */
#define AHEAD_MS 10000 /* how long a write-through outranks the stream's events at most */
#define MAX_TOMBS 1024

typedef struct qitem {
    int type;            /* EDL_K8S_ADDED.., Q_LIST or Q_MORE */
    cJSON *obj;          /* the object, or the list's items (an array) */
} qitem;

static qitem more_marker = {Q_MORE, NULL};

typedef struct pending {
    edl_k8s_event_type type;
    cJSON *obj;          /* owned; NULL for a DELETED of a cached object, and SYNCED */
    char *key;
} pending;

typedef struct tomb { /* an object deleted through edl_k8s_informer_store */
    char *key, *uid;
    int64_t until;       /* monotonic ms */
} tomb;

typedef enum watch_end { W_ENDED, W_GONE, W_BROKEN, W_BAD, W_STOP } watch_end;

struct edl_k8s_informer {
    edl_k8s *k;
    char *path, *selector; /* selector: escaped for a query */
    const char *const *keep; /* the fields kept of each object (NULL: all; the caller's) */
    pthread_t thread;
    bool started;
    CURL *h;
    CURLM *multi;
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* stop, for the thread's back-off waits */
    bool stop;
    edl_queue *q;        /* the thread's lists and events, handed to the caller (edl/queue.h) */

    /* the thread's */
    char *rv;
    edl_bytebuf line;
    watch_end outcome;   /* what the stream's content decided */
    bool got_event;

    /* the caller's */
    k8s_cache cache;
    unsigned mark;
    pending *pend;
    size_t npend, ipend;
    bool marker_queued;  /* more_marker is in the queue */
    cJSON *dropped;      /* the last DELETED object, until the next call */
    bool synced;
    tomb *tombs;         /* deleted through store, until their DELETED comes */
    size_t ntombs;
};

/* ---- the thread's side: queue, list, watch ------------------------------------------------ */

static bool stopped(edl_k8s_informer *inf)
{
    pthread_mutex_lock(&inf->mu);
    bool s = inf->stop;
    pthread_mutex_unlock(&inf->mu);
    return s;
}

/* Hand an item to the caller (obj owned from now on); waits while the queue is full. */
static bool push(edl_k8s_informer *inf, int type, cJSON *obj)
{
    qitem *q = malloc(sizeof *q);
    if (q) {
        *q = (qitem){type, obj};
        if (edl_queue_push(inf->q, q))
            return true;
    }
    cJSON_Delete(obj);
    free(q);
    return false;
}

static void wait_ms(edl_k8s_informer *inf, int ms)
{
    pthread_mutex_lock(&inf->mu);
    if (!inf->stop)
        edl_cond_wait_ms(&inf->cv, &inf->mu, ms);
    pthread_mutex_unlock(&inf->mu);
}

static k8s_conn conn_of(edl_k8s_informer *inf)
{
    return (k8s_conn){inf->h, inf->multi, &inf->mu, &inf->stop};
}

/* path?args[&labelSelector=..][&continue=..] (cont escaped here), malloc'ed. */
static char *query(edl_k8s_informer *inf, const char *args, const char *cont)
{
    char *ec = cont ? curl_easy_escape(inf->h, cont, 0) : NULL;
    char *s = NULL;
    if (asprintf(&s, "%s?%s%s%s%s%s", inf->path, args, inf->selector ? "&labelSelector=" : "",
                 inf->selector ? inf->selector : "", ec ? "&continue=" : "", ec ? ec : "") < 0)
        s = NULL;
    curl_free(ec);
    return s;
}

/* One page's items, checked, moved onto items; its resourceVersion and continue token. */
static const char *take_page(edl_k8s_informer *inf, cJSON *body, cJSON *items, const char **rv,
                             const char **cont)
{
    cJSON *page = cJSON_GetObjectItemCaseSensitive(body, "items");
    *rv = edl_k8s_str(body, "metadata.resourceVersion");
    *cont = edl_k8s_str(body, "metadata.continue");
    if (!cJSON_IsObject(body))
        return "the reply is not a JSON object";
    if (!cJSON_IsArray(page) && !cJSON_IsNull(page) && page)
        return "\"items\" is not a list";
    if (!*rv || !**rv)
        return "the list has no metadata.resourceVersion";
    char key[512];
    const cJSON *it;
    cJSON_ArrayForEach(it, page) {
        if (!k8s_object_key(it, key, sizeof key))
            return "an item has no metadata.name";
    }
    while (page && page->child) { /* (GetArraySize walks the list: quadratic over a page) */
        cJSON *it0 = cJSON_DetachItemViaPointer(page, page->child);
        if (inf->keep) {
            cJSON *trimmed = k8s_trim(it0, inf->keep);
            cJSON_Delete(it0);
            if (!(it0 = trimmed))
                return "out of memory";
        }
        cJSON_AddItemToArray(items, it0);
    }
    return NULL;
}

/* List every page; on success queue the items and remember the resourceVersion. */
static int do_list(edl_k8s_informer *inf)
{
    cJSON *items = cJSON_CreateArray();
    char *cont = NULL, args[32];
    int rc = items ? 0 : EDL_ENOMEM;
    snprintf(args, sizeof args, "limit=%d", LIST_PAGE);
    while (!rc) {
        char *path = query(inf, args, cont);
        edl_k8s_reply r = {0};
        k8s_conn c = conn_of(inf);
        rc = path ? k8s_request_on(inf->k, &c, "GET", path, NULL, NULL, false, &r) : EDL_ENOMEM;
        const char *why = NULL, *rv = NULL, *next = NULL;
        if (!rc && r.status != 200)
            rc = edl_k8s_status_code(r.status);
        else if (!rc && (why = take_page(inf, r.body, items, &rv, &next)))
            rc = EDL_EPROTO;
        if (rc && rc != EDL_ECLOSED)
            EDL_WARN("k8s", "informer: list %s: %s%s%s", path ? path : inf->path,
                     why ? why : edl_strerror(rc), r.message[0] ? ": " : "", r.message);
        free(cont);
        cont = NULL;
        if (!rc && next && *next && !(cont = strdup(next)))
            rc = EDL_ENOMEM;
        if (!rc && !cont) {
            free(inf->rv);
            inf->rv = strdup(rv);
            rc = inf->rv ? 0 : EDL_ENOMEM;
        }
        edl_k8s_reply_clear(&r);
        free(path);
        if (!cont)
            break;
    }
    free(cont);
    if (rc) {
        cJSON_Delete(items);
        return rc;
    }
    return push(inf, Q_LIST, items) ? 0 : EDL_ECLOSED;
}

static bool bad_line(edl_k8s_informer *inf, const char *why, const char *line, size_t len)
{
    EDL_WARN("k8s", "informer: watch %s: %s (line: %.*s%s); relisting", inf->path, why,
             (int)(len < 120 ? len : 120), line, len > 120 ? "..." : "");
    inf->outcome = W_BAD;
    return false;
}

static void move_rv(edl_k8s_informer *inf, const cJSON *obj)
{
    const char *rv = edl_k8s_str(obj, "metadata.resourceVersion");
    char *copy = rv && *rv ? strdup(rv) : NULL;
    if (copy) {
        free(inf->rv);
        inf->rv = copy;
    }
}

/* An in-stream ERROR: a Status. 410 (Expired, Gone) relists at once; others after a back-off. */
static bool stream_error(edl_k8s_informer *inf, const cJSON *status)
{
    int64_t code = edl_k8s_int(status, "code", 0);
    const char *msg = edl_k8s_str(status, "message");
    if (code == 410) {
        EDL_INFO("k8s", "informer: watch %s: resourceVersion %s expired (%s); relisting", inf->path,
                 inf->rv, msg ? msg : "410");
        inf->outcome = W_GONE;
    } else {
        EDL_WARN("k8s", "informer: watch %s: error %lld from the server: %s; relisting", inf->path,
                 (long long)code, msg ? msg : "(no message)");
        inf->outcome = W_BAD;
    }
    return false;
}

k8s_watch_kind k8s_watch_line_parse(const char *line, size_t len, k8s_watch_line *out)
{
    *out = (k8s_watch_line){.kind = K8S_W_BAD};
    cJSON *j = out->root = cJSON_ParseWithLength(line, len);
    const char *type = edl_k8s_str(j, "type");
    cJSON *obj = out->obj = cJSON_GetObjectItemCaseSensitive(j, "object");
    if (!cJSON_IsObject(j))
        out->why = "not a JSON object";
    else if (!type)
        out->why = "an event without a type";
    else if (!cJSON_IsObject(obj))
        out->why = "an event without an object";
    else if (!strcmp(type, "ERROR"))
        out->kind = K8S_W_ERROR;
    else if (!strcmp(type, "BOOKMARK"))
        out->kind = K8S_W_BOOKMARK;
    else if (!(out->type = !strcmp(type, "ADDED") ? EDL_K8S_ADDED : !strcmp(type, "MODIFIED")
                           ? EDL_K8S_MODIFIED : !strcmp(type, "DELETED") ? EDL_K8S_DELETED : 0))
        out->why = "an event of an unknown type";
    else if (!k8s_object_key(obj, out->key, sizeof out->key))
        out->why = "an object without metadata.name";
    else
        out->kind = K8S_W_EVENT;
    return out->kind;
}

void k8s_watch_line_clear(k8s_watch_line *w)
{
    cJSON_Delete(w->root);
    *w = (k8s_watch_line){0};
}

/* One line of the stream: false ends the stream (outcome says why). */
static bool handle_line(edl_k8s_informer *inf, const char *line, size_t len)
{
    k8s_watch_line w;
    bool ok = true;
    switch (k8s_watch_line_parse(line, len, &w)) {
    case K8S_W_BAD: ok = bad_line(inf, w.why, line, len); break;
    case K8S_W_ERROR: ok = stream_error(inf, w.obj); break;
    case K8S_W_BOOKMARK: move_rv(inf, w.obj); break;
    case K8S_W_EVENT: {
        move_rv(inf, w.obj);
        inf->got_event = true;
        cJSON *kept = cJSON_DetachItemViaPointer(w.root, w.obj);
        if (inf->keep) {
            cJSON *trimmed = k8s_trim(kept, inf->keep);
            cJSON_Delete(kept);
            kept = trimmed;
        }
        ok = kept && push(inf, w.type, kept);
        break;
    }
    }
    k8s_watch_line_clear(&w);
    return ok;
}

static bool on_line(void *inf, const char *line, size_t len)
{
    return handle_line(inf, line, len);
}

static size_t on_stream(char *ptr, size_t size, size_t nmemb, void *arg)
{
    edl_k8s_informer *inf = arg;
    size_t n = size * nmemb;
    int rc = edl_lines_feed(&inf->line, ptr, n, on_line, inf);
    if (rc == EDL_ETOOBIG || rc == EDL_ENOMEM) {
        edl_bytebuf_clear(&inf->line); /* keeps max */
        return bad_line(inf, "a line over 16 MiB", "", 0) ? n : 0;
    }
    return rc ? 0 : n;
}

static watch_end do_watch(edl_k8s_informer *inf)
{
    char args[512];
    char *erv = curl_easy_escape(inf->h, inf->rv, 0);
    snprintf(args, sizeof args, "watch=1&resourceVersion=%s&allowWatchBookmarks=true&timeoutSeconds=%d",
             erv ? erv : "", WATCH_TIMEOUT_S + (int)(edl_monotonic_ms() % 60)); /* spread re-watches */
    curl_free(erv);
    char *path = query(inf, args, NULL);
    if (!path)
        return W_BROKEN;
    inf->line.len = 0;
    inf->outcome = W_ENDED;
    inf->got_event = false;
    k8s_xfer x = {.method = "GET", .path = path, .write = on_stream, .arg = inf,
                  .timeout_ms = (WATCH_TIMEOUT_S + 90) * 1000L};
    k8s_conn c = conn_of(inf);
    atomic_fetch_add(&inf->k->watches, 1);
    CURLcode cc = k8s_transfer(inf->k, &c, &x);
    free(path);
    if (stopped(inf))
        return W_STOP;
    if (inf->outcome != W_ENDED)
        return inf->outcome;
    if (x.status == 410)
        return W_GONE;
    if (cc != CURLE_OK || x.status != 200) {
        EDL_WARN("k8s", "informer: watch %s from %s: %s", inf->path, inf->rv,
                 cc != CURLE_OK ? (x.errbuf[0] ? x.errbuf : curl_easy_strerror(cc)) : "not HTTP 200");
        return W_BROKEN;
    }
    return W_ENDED;
}

static void *informer_main(void *arg)
{
    edl_k8s_informer *inf = arg;
    int failures = 0; /* in a row, since a list or a watch last worked */
    bool need_list = true, first = true;
    while (!stopped(inf)) {
        if (need_list) {
            if (!first)
                atomic_fetch_add(&inf->k->relists, 1);
            first = false;
            if (do_list(inf) != 0) {
                wait_ms(inf, (int)edl_http_backoff_ms(failures++, BACKOFF_MIN_MS, BACKOFF_MAX_MS, -1));
                continue;
            }
            need_list = false;
        }
        watch_end end = do_watch(inf);
        if (inf->got_event || end == W_ENDED)
            failures = 0; /* it worked for a while */
        if (end == W_GONE || end == W_BAD)
            need_list = true;
        if (end == W_BROKEN || end == W_BAD)
            wait_ms(inf, (int)edl_http_backoff_ms(failures++, BACKOFF_MIN_MS, BACKOFF_MAX_MS, -1));
    }
    return NULL;
}

/* ---- the caller's side: events applied to the cache --------------------------------------- */

static void event_of(edl_k8s_event *ev, edl_k8s_event_type type, const cJSON *obj)
{
    ev->type = type;
    ev->object = obj;
    ev->ns = edl_k8s_str(obj, "metadata.namespace");
    ev->name = edl_k8s_str(obj, "metadata.name");
}

static bool same_str(const char *a, const char *b)
{
    return a && b && strcmp(a, b) == 0;
}

static void drop_tomb(edl_k8s_informer *inf, size_t i)
{
    free(inf->tombs[i].key);
    free(inf->tombs[i].uid);
    inf->tombs[i] = inf->tombs[--inf->ntombs];
}

static void drop_writes_ahead(edl_k8s_informer *inf)
{
    while (inf->ntombs)
        drop_tomb(inf, 0);
    for (size_t i = 0; i < inf->cache.nbuckets; i++)
        for (k8s_entry *e = inf->cache.buckets[i]; e; e = e->next)
            k8s_entry_await(e, NULL, 0);
}

/* An event the stream sent before a write that the caller stored through already (the
 * stream has not reached the write yet): applied, it would undo the write in the cache (a
 * pod deleted coming back Failed, a status going back a step). resourceVersions are compared
 * for equality only, as Kubernetes allows: an object stored waits for the event carrying its
 * version; an object deleted drops the events of its uid until its DELETED. */
static bool behind_a_write(edl_k8s_informer *inf, edl_k8s_event_type type, const char *key,
                           const cJSON *obj)
{
    int64_t now = edl_monotonic_ms();
    const char *uid = edl_k8s_str(obj, "metadata.uid");
    for (size_t i = 0; i < inf->ntombs; i++) {
        tomb *t = &inf->tombs[i];
        if (strcmp(t->key, key) != 0 || !same_str(t->uid, uid))
            continue;
        if (type == EDL_K8S_DELETED || now >= t->until) {
            drop_tomb(inf, i);
            return false;
        }
        return true;
    }
    k8s_entry *e = k8s_cache_find(&inf->cache, key);
    if (!e || !e->awaited_rv)
        return false;
    const char *cached_uid = edl_k8s_str(e->obj, "metadata.uid");
    if (now >= e->awaited_until || same_str(edl_k8s_str(obj, "metadata.resourceVersion"),
                                            e->awaited_rv)) {
        k8s_entry_await(e, NULL, 0); /* the stream caught up */
        return false;
    }
    if (type == EDL_K8S_DELETED) /* only an earlier object of the same name's */
        return uid && cached_uid && strcmp(uid, cached_uid) != 0;
    return true;
}

/* Apply an event whose object comes with it (owned) to the cache and describe it in ev;
 * EDL_ETIMEDOUT (nothing to say) for an event behind a write-through. */
static int apply(edl_k8s_informer *inf, edl_k8s_event_type type, cJSON *obj, edl_k8s_event *ev)
{
    char key[512];
    cJSON *old = NULL;
    if (!k8s_object_key(obj, key, sizeof key)) { /* checked by the thread already */
        cJSON_Delete(obj);
        return EDL_EPROTO;
    }
    if (behind_a_write(inf, type, key, obj)) {
        cJSON_Delete(obj);
        return EDL_ETIMEDOUT;
    }
    if (type == EDL_K8S_DELETED) {
        cJSON_Delete(k8s_cache_remove(&inf->cache, key));
        inf->dropped = obj;
    } else if (k8s_cache_put(&inf->cache, key, obj, &old) != 0) {
        cJSON_Delete(obj);
        return EDL_ENOMEM;
    }
    cJSON_Delete(old);
    event_of(ev, type, obj);
    return 0;
}

static bool same_version(const cJSON *a, const cJSON *b)
{
    const char *ra = edl_k8s_str(a, "metadata.resourceVersion"), *rb = edl_k8s_str(b, "metadata.resourceVersion");
    return ra && rb && strcmp(ra, rb) == 0;
}

static int add_pending(edl_k8s_informer *inf, size_t cap, edl_k8s_event_type type, cJSON *obj,
                       const char *key)
{
    pending *p = &inf->pend[inf->npend];
    if (inf->npend >= cap || (key && !(p->key = strdup(key)))) {
        cJSON_Delete(obj);
        return EDL_ENOMEM;
    }
    p->type = type;
    p->obj = obj;
    inf->npend++;
    return 0;
}

/* A whole list becomes pending events: what is new or changed, then what vanished, then
 * SYNCED. Objects whose resourceVersion did not change produce nothing. */
static int expand_list(edl_k8s_informer *inf, cJSON *items)
{
    size_t cap = (size_t)cJSON_GetArraySize(items) + inf->cache.count + 1;
    int rc = 0;
    if (!(inf->pend = calloc(cap, sizeof *inf->pend))) {
        cJSON_Delete(items);
        return EDL_ENOMEM;
    }
    inf->npend = inf->ipend = 0;
    inf->mark++;
    drop_writes_ahead(inf); /* a whole list is the server's word on everything */
    char key[512];
    while (!rc && items->child) { /* (GetArraySize walks the list: quadratic over 10,000) */
        cJSON *it = cJSON_DetachItemViaPointer(items, items->child);
        k8s_object_key(it, key, sizeof key);
        k8s_entry *e = k8s_cache_find(&inf->cache, key);
        if (e)
            e->mark = inf->mark;
        if (e && same_version(e->obj, it))
            cJSON_Delete(it);
        else
            rc = add_pending(inf, cap, e ? EDL_K8S_MODIFIED : EDL_K8S_ADDED, it, NULL);
    }
    cJSON_Delete(items);
    for (size_t i = 0; !rc && i < inf->cache.nbuckets; i++)
        for (k8s_entry *e = inf->cache.buckets[i]; !rc && e; e = e->next)
            if (e->mark != inf->mark)
                rc = add_pending(inf, cap, EDL_K8S_DELETED, NULL, e->key);
    return rc ? rc : add_pending(inf, cap, EDL_K8S_SYNCED, NULL, NULL);
}

static void free_pending(edl_k8s_informer *inf)
{
    for (size_t i = inf->ipend; i < inf->npend; i++)
        cJSON_Delete(inf->pend[i].obj);
    for (size_t i = 0; i < inf->npend; i++)
        free(inf->pend[i].key);
    free(inf->pend);
    inf->pend = NULL;
    inf->npend = inf->ipend = 0;
}

/* The next pending event of a relist: 0, or EDL_ETIMEDOUT when none is left. */
static int next_pending(edl_k8s_informer *inf, edl_k8s_event *ev)
{
    while (inf->ipend < inf->npend) {
        pending *p = &inf->pend[inf->ipend++];
        if (p->type == EDL_K8S_SYNCED) {
            inf->synced = true;
            ev->type = EDL_K8S_SYNCED;
            return 0;
        }
        if (p->obj) {
            cJSON *obj = p->obj;
            p->obj = NULL;
            int rc = apply(inf, p->type, obj, ev);
            if (rc != EDL_ETIMEDOUT)
                return rc;
            continue;
        }
        cJSON *gone = k8s_cache_remove(&inf->cache, p->key);
        if (gone) { /* else a write-through delete came first: nothing to say */
            inf->dropped = gone;
            event_of(ev, EDL_K8S_DELETED, gone);
            return 0;
        }
    }
    free_pending(inf);
    return EDL_ETIMEDOUT;
}

/* Take the next queued item, waiting up to timeout_ms; NULL when none came. */
static qitem *pop(edl_k8s_informer *inf, int timeout_ms)
{
    void *item;
    return edl_queue_pop(inf->q, &item, timeout_ms > 0 ? timeout_ms : 0) ? NULL : item;
}

/* The fd stays readable while anything waits, queued or pending: a relist's pending events
 * keep a marker in front of the queue. */
static void update_fd(edl_k8s_informer *inf)
{
    if (inf->ipend < inf->npend && !inf->marker_queued)
        inf->marker_queued = edl_queue_unpop(inf->q, &more_marker);
}

int edl_k8s_informer_next(edl_k8s_informer *inf, edl_k8s_event *ev, int timeout_ms)
{
    memset(ev, 0, sizeof *ev);
    cJSON_Delete(inf->dropped);
    inf->dropped = NULL;
    int rc = next_pending(inf, ev);
    while (rc == EDL_ETIMEDOUT) {
        qitem *q = pop(inf, timeout_ms);
        if (!q)
            break;
        if (q == &more_marker) {
            inf->marker_queued = false;
            continue;
        }
        if (q->type == Q_LIST && (rc = expand_list(inf, q->obj)) == 0)
            rc = next_pending(inf, ev); /* an empty relist still yields SYNCED */
        else if (q->type != Q_LIST)
            rc = apply(inf, (edl_k8s_event_type)q->type, q->obj, ev);
        free(q);
    }
    update_fd(inf);
    return rc;
}

/* ---- open, close and the cache's readers ------------------------------------------------- */

static void free_item(void *item)
{
    qitem *q = item;
    if (q != &more_marker) {
        cJSON_Delete(q->obj);
        free(q);
    }
}

static char *escape_selector(const char *sel)
{
    if (!sel || !*sel)
        return NULL;
    char *e = curl_easy_escape(NULL, sel, 0), *copy = e ? strdup(e) : NULL;
    curl_free(e);
    return copy;
}

int edl_k8s_informer_open(edl_k8s *k, const char *collection_path, const char *label_selector,
                          edl_k8s_informer **out)
{
    return edl_k8s_informer_open_trimmed(k, collection_path, label_selector, NULL, out);
}

int edl_k8s_informer_open_trimmed(edl_k8s *k, const char *collection_path,
                                  const char *label_selector, const char *const *keep,
                                  edl_k8s_informer **out)
{
    *out = NULL;
    if (!k || !collection_path || collection_path[0] != '/' || strchr(collection_path, '?'))
        return EDL_EINVAL;
    edl_k8s_informer *inf = calloc(1, sizeof *inf);
    if (!inf)
        return EDL_ENOMEM;
    inf->k = k;
    inf->keep = keep;
    int rc = edl_queue_open(MAX_QUEUED, &inf->q);
    inf->line.max = K8S_MAX_REPLY;
    pthread_mutex_init(&inf->mu, NULL);
    edl_cond_init(&inf->cv);
    inf->path = strdup(collection_path);
    inf->selector = escape_selector(label_selector);
    inf->h = curl_easy_init();
    inf->multi = curl_multi_init();
    if (!rc && (!inf->path || !inf->h || !inf->multi || (label_selector && *label_selector && !inf->selector)))
        rc = EDL_ENOMEM;
    if (!rc && pthread_create(&inf->thread, NULL, informer_main, inf) != 0)
        rc = EDL_ENOMEM;
    inf->started = rc == 0;
    if (rc) {
        edl_k8s_informer_close(inf);
        return rc;
    }
    *out = inf;
    return 0;
}

void edl_k8s_informer_close(edl_k8s_informer *inf)
{
    if (!inf)
        return;
    pthread_mutex_lock(&inf->mu);
    inf->stop = true;
    pthread_cond_broadcast(&inf->cv);
    pthread_mutex_unlock(&inf->mu);
    if (inf->q)
        edl_queue_stop(inf->q); /* a stream waiting for room gives up */
    if (inf->started) {
        curl_multi_wakeup(inf->multi);
        pthread_join(inf->thread, NULL);
    }
    edl_queue_close(inf->q, free_item);
    free_pending(inf);
    drop_writes_ahead(inf);
    free(inf->tombs);
    k8s_cache_clear(&inf->cache);
    cJSON_Delete(inf->dropped);
    if (inf->multi)
        curl_multi_cleanup(inf->multi);
    curl_easy_cleanup(inf->h);
    pthread_cond_destroy(&inf->cv);
    pthread_mutex_destroy(&inf->mu);
    edl_bytebuf_clear(&inf->line);
    free(inf->rv);
    free(inf->path);
    free(inf->selector);
    free(inf);
}

int edl_k8s_informer_fd(const edl_k8s_informer *inf)
{
    return edl_queue_fd(inf->q);
}

bool edl_k8s_informer_synced(const edl_k8s_informer *inf)
{
    return inf->synced;
}

const cJSON *edl_k8s_informer_get(const edl_k8s_informer *inf, const char *ns, const char *name)
{
    char key[512];
    if (!k8s_key_of(ns, name, key, sizeof key))
        return NULL;
    const k8s_entry *e = k8s_cache_find(&inf->cache, key);
    return e ? e->obj : NULL;
}

size_t edl_k8s_informer_list(const edl_k8s_informer *inf, const cJSON **objs, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < inf->cache.nbuckets; i++)
        for (const k8s_entry *e = inf->cache.buckets[i]; e; e = e->next, n++)
            if (n < max)
                objs[n] = e->obj;
    return n;
}

/* Remember that the object of uid under key was deleted (no uid: the objects of that name
 * cannot be told apart, so nothing is dropped). */
static int add_tomb(edl_k8s_informer *inf, const char *key, const char *uid)
{
    int64_t now = edl_monotonic_ms();
    for (size_t i = inf->ntombs; i-- > 0;)
        if (now >= inf->tombs[i].until || same_str(inf->tombs[i].key, key))
            drop_tomb(inf, i);
    if (!uid)
        return 0;
    if (inf->ntombs == MAX_TOMBS)
        drop_tomb(inf, 0);
    if (!inf->tombs && !(inf->tombs = calloc(MAX_TOMBS, sizeof *inf->tombs)))
        return EDL_ENOMEM;
    tomb *t = &inf->tombs[inf->ntombs];
    if (!(t->key = strdup(key)) || !(t->uid = strdup(uid))) {
        free(t->key);
        return EDL_ENOMEM;
    }
    t->until = now + AHEAD_MS;
    inf->ntombs++;
    return 0;
}

int edl_k8s_informer_store(edl_k8s_informer *inf, const cJSON *obj, bool deleted)
{
    char key[512];
    if (!inf || !k8s_object_key(obj, key, sizeof key))
        return EDL_EINVAL;
    if (deleted) { /* (obj may be the cached object itself) */
        int rc = add_tomb(inf, key, edl_k8s_str(obj, "metadata.uid"));
        cJSON_Delete(k8s_cache_remove(&inf->cache, key));
        return rc;
    }
    cJSON *copy = inf->keep ? k8s_trim(obj, inf->keep) : cJSON_Duplicate(obj, true), *old = NULL;
    if (!copy || k8s_cache_put(&inf->cache, key, copy, &old) != 0) {
        cJSON_Delete(copy);
        return EDL_ENOMEM;
    }
    /* the stream still owes the write's own event, unless the write changed nothing */
    k8s_entry_await(k8s_cache_find(&inf->cache, key),
                    same_version(copy, old) ? NULL : edl_k8s_str(copy, "metadata.resourceVersion"),
                    edl_monotonic_ms() + AHEAD_MS);
    cJSON_Delete(old);
    return 0;
}

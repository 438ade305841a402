/* client.c: the student's client of teachers (edl/distill.h) on one libcurl multi handle. A
 * batch is encoded once at submit, waits in a queue until a teacher has a free slot (in_flight
 * per teacher), and has at most one try in flight at any time: a try that fails (no
 * connection, HTTP error, a reply that does not decode, is not of the shape asked (the
 * batch's rows, the columns the student stated) or holds a value past its bound, timeout_ms)
 * sends the batch back to the queue for another teacher, and a removed teacher's tries are
 * abandoned (their connections closed) before their batches are queued again. So no late
 * answer can ever arrive for a batch, and its first good answer is the only one delivered.
 * Everything happens inside edl_distill_next, on the caller's thread. */
#define _GNU_SOURCE
#include <curl/curl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distill/wire.h"
#include "edl/http.h"
#include "edl/log.h"

#define FAILED_MEMORY 8          /* teachers a batch remembers having failed on */
#define BACKOFF_MIN_MS 50
#define POLL_MAX_MS 200

typedef enum bstate { B_QUEUED, B_FLIGHT, B_READY } bstate;

typedef struct batch {
    uint64_t id;
    char *body; /* the request, encoded */
    size_t len;
    uint32_t rows;
    bstate state;
    int tries;
    uint64_t failed_by[FAILED_MEMORY]; /* serials of the teachers that failed it */
    char why[448];                     /* "<endpoint>: <what was wrong>; ...", once each */
    struct batch *next;                /* in the queue or the ready list */
    edl_distill_result res;            /* once READY */
} batch;

typedef struct teacher {
    char endpoint[128];
    char *url;       /* <endpoint>/v1/models/<model>:predict */
    uint64_t serial; /* never reused: a batch's failed_by outlives a removed teacher */
    int in_flight;
    int fails;       /* consecutive */
    int64_t backoff_until;
} teacher;

typedef struct request {
    CURL *easy;
    batch *b;
    teacher *t;
    char *reply;
    size_t len, cap;
} request;

struct edl_distill {
    edl_distill_opts o;
    char model[128];
    CURLM *multi;
    struct curl_slist *headers;
    teacher **t;
    size_t nt, rr;
    uint64_t serials;
    batch **slot; /* slot[off + i] is batch base + i, NULL once delivered */
    size_t off, nslot, cap_slot;
    uint64_t base, next_id, next_deliver;
    batch *qhead, *qtail, *rhead, *rtail;
    request **req;
    size_t nreq, cap_req;
    edl_distill_stats st;
};

/* ---- batches ----------------------------------------------------------------------------- */

static batch *slot_get(const edl_distill *d, uint64_t id)
{
    if (id < d->base || id - d->base >= d->nslot - d->off)
        return NULL;
    return d->slot[d->off + (id - d->base)];
}

static int slot_push(edl_distill *d, batch *b)
{
    if (d->nslot == d->cap_slot && d->off > d->nslot / 2) {
        memmove(d->slot, d->slot + d->off, (d->nslot - d->off) * sizeof *d->slot);
        d->nslot -= d->off, d->off = 0;
    }
    if (d->nslot == d->cap_slot) {
        size_t cap = d->cap_slot ? 2 * d->cap_slot : 64;
        batch **s = realloc(d->slot, cap * sizeof *s);
        if (!s)
            return EDL_ENOMEM;
        d->slot = s, d->cap_slot = cap;
    }
    d->slot[d->nslot++] = b;
    return 0;
}

static void slot_clear(edl_distill *d, uint64_t id)
{
    d->slot[d->off + (id - d->base)] = NULL;
    while (d->off < d->nslot && !d->slot[d->off])
        d->off++, d->base++;
}

static void queue_push(edl_distill *d, batch *b, bool front)
{
    b->state = B_QUEUED;
    if (front || !d->qhead) {
        b->next = d->qhead;
        d->qhead = b;
        if (!d->qtail)
            d->qtail = b;
    } else {
        b->next = NULL;
        d->qtail->next = b;
        d->qtail = b;
    }
}

static void batch_ready(edl_distill *d, batch *b, teacher *t, int status)
{
    b->state = B_READY;
    b->res.id = b->id;
    b->res.status = status;
    b->res.tries = b->tries;
    snprintf(b->res.teacher, sizeof b->res.teacher, "%s", t ? t->endpoint : "");
    free(b->body);
    b->body = NULL;
    if (status)
        d->st.failed++;
    if (d->o.ordered)
        return;
    b->next = NULL;
    if (d->rtail)
        d->rtail->next = b;
    else
        d->rhead = b;
    d->rtail = b;
}

static void batch_free(batch *b)
{
    if (b) {
        free(b->body);
        free(b->res.out);
        free(b);
    }
}

/* ---- teachers ---------------------------------------------------------------------------- */

static bool failed_on(const batch *b, const teacher *t)
{
    for (int i = 0; i < FAILED_MEMORY; i++)
        if (b->failed_by[i] == t->serial)
            return true;
    return false;
}

static bool teacher_free(const edl_distill *d, const teacher *t, int64_t now)
{
    return t->in_flight < d->o.in_flight && t->backoff_until <= now;
}

/* The teacher for b: a free one that has not failed it, the least busy first; one that has
 * failed it only when every teacher has (a batch waits for an untried teacher that is busy or
 * backing off, at most EDL_DISTILL_BACKOFF_MAX_MS, so its tries spread over the teachers
 * rather than going back to whichever failed first). NULL: wait. */
static teacher *pick(edl_distill *d, const batch *b, int64_t now)
{
    teacher *best = NULL, *best_failed = NULL;
    bool other_untried = false;
    for (size_t k = 0; k < d->nt; k++) {
        teacher *t = d->t[(d->rr + k) % d->nt];
        bool failed = failed_on(b, t);
        if (!failed)
            other_untried = true;
        if (!teacher_free(d, t, now))
            continue;
        teacher **slot = failed ? &best_failed : &best;
        if (!*slot || t->in_flight < (*slot)->in_flight)
            *slot = t;
    }
    if (best)
        return best;
    return other_untried ? NULL : best_failed;
}

static void teacher_failed(teacher *t, batch *b, int64_t now)
{
    t->fails++;
    t->backoff_until = now + edl_http_backoff_ms(t->fails - 1, BACKOFF_MIN_MS,
                                                   EDL_DISTILL_BACKOFF_MAX_MS, -1);
    memmove(b->failed_by + 1, b->failed_by, (FAILED_MEMORY - 1) * sizeof *b->failed_by);
    b->failed_by[0] = t->serial;
}

static void teacher_free_one(teacher *t)
{
    if (t) {
        free(t->url);
        free(t);
    }
}

/* ---- tries ------------------------------------------------------------------------------- */

static size_t on_body(char *data, size_t size, size_t n, void *arg)
{
    request *rq = arg;
    size_t len = size * n;
    if (len > EDL_DISTILL_MAX_BODY - rq->len)
        return 0; /* CURLE_WRITE_ERROR: a reply past the limit is a bad reply */
    if (rq->len + len > rq->cap) {
        size_t cap = rq->cap ? rq->cap : 4096;
        while (cap < rq->len + len)
            cap *= 2;
        char *r = realloc(rq->reply, cap);
        if (!r)
            return 0;
        rq->reply = r, rq->cap = cap;
    }
    memcpy(rq->reply + rq->len, data, len);
    rq->len += len;
    return len;
}

static void request_free(edl_distill *d, request *rq)
{
    for (size_t i = 0; i < d->nreq; i++)
        if (d->req[i] == rq) {
            d->req[i] = d->req[--d->nreq];
            break;
        }
    curl_multi_remove_handle(d->multi, rq->easy);
    curl_easy_cleanup(rq->easy);
    rq->t->in_flight--;
    free(rq->reply);
    free(rq);
}

static CURL *easy_for(edl_distill *d, request *rq)
{
    CURL *e = curl_easy_init();
    if (!e)
        return NULL;
    int connect_ms = d->o.timeout_ms < 3000 ? d->o.timeout_ms : 3000;
    edl_http_prepare(e, &(edl_http_opts){.connect_timeout_ms = connect_ms,
                                         .timeout_ms = d->o.timeout_ms, .nodelay = true});
    curl_easy_setopt(e, CURLOPT_URL, rq->t->url);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, rq->b->body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)rq->b->len);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, d->headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, rq);
    curl_easy_setopt(e, CURLOPT_PRIVATE, rq);
    return e;
}

static int start(edl_distill *d, batch *b, teacher *t)
{
    if (d->nreq == d->cap_req) {
        size_t cap = d->cap_req ? 2 * d->cap_req : 16;
        request **r = realloc(d->req, cap * sizeof *r);
        if (!r)
            return EDL_ENOMEM;
        d->req = r, d->cap_req = cap;
    }
    request *rq = calloc(1, sizeof *rq);
    if (!rq)
        return EDL_ENOMEM;
    rq->b = b, rq->t = t;
    if (!(rq->easy = easy_for(d, rq)) || curl_multi_add_handle(d->multi, rq->easy) != CURLM_OK) {
        curl_easy_cleanup(rq->easy);
        free(rq);
        return EDL_ENOMEM;
    }
    d->req[d->nreq++] = rq;
    t->in_flight++;
    b->state = B_FLIGHT;
    b->tries++;
    return 0;
}

/* Start every queued batch that a teacher can take now. */
static void dispatch(edl_distill *d)
{
    int64_t now = edl_monotonic_ms();
    batch *prev = NULL, *b = d->qhead;
    while (b) {
        bool any = false;
        for (size_t k = 0; k < d->nt && !any; k++)
            any = teacher_free(d, d->t[k], now);
        if (!any)
            return;
        batch *next = b->next;
        teacher *t = pick(d, b, now);
        if (t && start(d, b, t) == 0) {
            *(prev ? &prev->next : &d->qhead) = next;
            if (d->qtail == b)
                d->qtail = prev;
            d->rr++;
        } else
            prev = b;
        b = next;
    }
}

/* Whether a decoded reply is the one the student asked for: its batch's rows, the columns the
 * student stated, every value within its bound. EDL_EPROTO (and why) when not. */
static int reply_fits(const edl_distill *d, const batch *b, const float *x, uint32_t rows,
                      uint32_t cols, char *err, size_t errlen)
{
    if (rows != b->rows)
        return edl_errf(err, errlen, EDL_EPROTO, "%u rows in the reply, %u asked", rows,
                        b->rows);
    if (d->o.cols && cols != d->o.cols)
        return edl_errf(err, errlen, EDL_EPROTO, "%u columns in the reply, the student takes "
                        "%u", cols, d->o.cols);
    for (size_t i = 0; d->o.max_abs > 0 && i < (size_t)rows * cols; i++)
        if (!(fabsf(x[i]) <= d->o.max_abs))
            return edl_errf(err, errlen, EDL_EPROTO, "value %zu of the reply, %g, is past "
                            "+-%g (max_abs)", i, (double)x[i], (double)d->o.max_abs);
    return 0;
}

/* Why a finished try failed (an EDL_E* code, counted, and err), or 0 with its predictions in
 * b->res. */
static int judge(edl_distill *d, request *rq, CURLcode code, char *err, size_t errlen)
{
    long http = 0;
    curl_easy_getinfo(rq->easy, CURLINFO_RESPONSE_CODE, &http);
    int rc = 0;
    if (code == CURLE_OPERATION_TIMEDOUT)
        d->st.timeouts++, rc = EDL_ETIMEDOUT, snprintf(err, errlen, "no answer within %d ms "
                                                        "(timeout_ms)", d->o.timeout_ms);
    else if (code == CURLE_WRITE_ERROR)
        d->st.bad_replies++, rc = EDL_ETOOBIG, snprintf(err, errlen, "reply too big");
    else if (code != CURLE_OK)
        d->st.conn_errors++, rc = EDL_EUNAVAIL, snprintf(err, errlen, "%s",
                                                          curl_easy_strerror(code));
    else if (http < 200 || http > 299)
        d->st.http_errors++, rc = EDL_ESERVER, snprintf(err, errlen, "HTTP %ld", http);
    else {
        float *x = NULL;
        uint32_t rows = 0, cols = 0;
        rc = edl_distill_decode(d->o.format, true, rq->reply ? rq->reply : "", rq->len, &x,
                                &rows, &cols, err, errlen);
        if (rc == 0 && (rc = reply_fits(d, rq->b, x, rows, cols, err, errlen)) != 0)
            free(x);
        if (rc)
            d->st.bad_replies++;
        else
            rq->b->res.out = x, rq->b->res.rows = rows, rq->b->res.cols = cols;
    }
    if (rc)
        edl_log(rq->t->fails ? EDL_LOG_DEBUG : EDL_LOG_WARN, "distill",
                "teacher %s failed batch %llu (try %d): %s", rq->t->endpoint,
                (unsigned long long)rq->b->id, rq->b->tries, err);
    return rc;
}

/* What a teacher did wrong with b, kept once per teacher (its first failure) for the message
 * of a batch that fails. */
static void note_failure(batch *b, const teacher *t, const char *err)
{
    char key[136];
    snprintf(key, sizeof key, "%s: ", t->endpoint);
    size_t at = strlen(b->why);
    if (strstr(b->why, key) || at + 1 >= sizeof b->why)
        return;
    snprintf(b->why + at, sizeof b->why - at, "%s%s%s", at ? "; " : "", key, err);
}

static void finish(edl_distill *d, request *rq, CURLcode code)
{
    batch *b = rq->b;
    teacher *t = rq->t;
    char err[160] = "";
    int rc = judge(d, rq, code, err, sizeof err);
    if (rc == 0) {
        t->fails = 0;
        batch_ready(d, b, t, 0);
    } else {
        teacher_failed(t, b, edl_monotonic_ms());
        note_failure(b, t, err);
        if (b->tries >= d->o.max_tries) {
            snprintf(b->res.error, sizeof b->res.error, "no teacher answered it well in %d "
                     "tries: %s", b->tries, b->why);
            batch_ready(d, b, t, EDL_EPEER);
        } else {
            d->st.retried++;
            queue_push(d, b, true);
        }
    }
    request_free(d, rq);
}

/* Finish every try that libcurl has done with; how many. */
static int reap(edl_distill *d)
{
    CURLMsg *m;
    int left, n = 0;
    while ((m = curl_multi_info_read(d->multi, &left))) {
        if (m->msg != CURLMSG_DONE)
            continue;
        request *rq = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&rq);
        finish(d, rq, m->data.result);
        n++;
    }
    return n;
}

/* ---- the API ----------------------------------------------------------------------------- */

int edl_distill_open(const edl_distill_opts *o, edl_distill **out)
{
    edl_distill_opts def = {0};
    if (!o)
        o = &def;
    if (!out || o->in_flight < 0 || o->timeout_ms < 0 || o->max_tries < 0 ||
        !(o->max_abs >= 0 && isfinite(o->max_abs)) || o->cols > EDL_DISTILL_MAX_COLS ||
        (o->format != EDL_DISTILL_JSON && o->format != EDL_DISTILL_BINARY) ||
        (o->model && (!*o->model || strlen(o->model) >= 128 || strpbrk(o->model, "/?#: "))))
        return EDL_EINVAL;
    edl_http_global_init();
    edl_distill *d = calloc(1, sizeof *d);
    if (!d)
        return EDL_ENOMEM;
    d->o = *o;
    d->o.in_flight = o->in_flight ? o->in_flight : 4;
    d->o.timeout_ms = o->timeout_ms ? o->timeout_ms : 10000;
    d->o.max_tries = o->max_tries ? o->max_tries : 8;
    snprintf(d->model, sizeof d->model, "%s", o->model ? o->model : "default");
    d->o.model = d->model;
    const char *type = o->format == EDL_DISTILL_BINARY ? "Content-Type: " EDL_DISTILL_BINARY_TYPE
                                                       : "Content-Type: " EDL_DISTILL_JSON_TYPE;
    const char *accept = o->format == EDL_DISTILL_BINARY ? "Accept: " EDL_DISTILL_BINARY_TYPE
                                                         : "Accept: " EDL_DISTILL_JSON_TYPE;
    struct curl_slist *h = curl_slist_append(NULL, type);
    if (h && (d->headers = curl_slist_append(h, accept)))
        h = curl_slist_append(d->headers, "Expect:"); /* no 100-continue round trip */
    if (!h || !d->headers || !(d->multi = curl_multi_init())) {
        curl_slist_free_all(d->headers ? d->headers : h);
        free(d);
        return EDL_ENOMEM;
    }
    *out = d;
    return 0;
}

/* "host:port" or "http://host:port/" as "http://host:port"; false when it does not fit. */
static bool endpoint_norm(const char *in, char *out, size_t len)
{
    bool scheme = strncmp(in, "http://", 7) == 0 || strncmp(in, "https://", 8) == 0;
    int n = snprintf(out, len, "%s%s", scheme ? "" : "http://", in);
    if (n < 0 || (size_t)n >= len || !*in)
        return false;
    while (n > 0 && out[n - 1] == '/')
        out[--n] = '\0';
    return n > 8;
}

static teacher *teacher_new(edl_distill *d, const char *endpoint)
{
    teacher *t = calloc(1, sizeof *t);
    if (!t || asprintf(&t->url, "%s/v1/models/%s:predict", endpoint, d->model) < 0) {
        free(t);
        return NULL;
    }
    snprintf(t->endpoint, sizeof t->endpoint, "%s", endpoint);
    t->serial = ++d->serials;
    return t;
}

/* Abandon a leaving teacher's tries; their batches go to the front of the queue. */
static void teacher_leave(edl_distill *d, teacher *t)
{
    for (size_t i = d->nreq; i-- > 0;) {
        request *rq = d->req[i];
        if (rq->t != t)
            continue;
        rq->b->tries--; /* the try did not fail: its teacher left */
        d->st.retried++;
        queue_push(d, rq->b, true);
        request_free(d, rq);
    }
    teacher_free_one(t);
}

static teacher *find(teacher *const *list, size_t n, const char *endpoint)
{
    for (size_t i = 0; i < n; i++)
        if (list[i] && strcmp(list[i]->endpoint, endpoint) == 0)
            return list[i];
    return NULL;
}

static bool listed(char (*ep)[128], size_t n, const char *endpoint)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(ep[i], endpoint) == 0)
            return true;
    return false;
}

/* The new list in three steps, none of which fails after the first: normalise and make the
 * teachers that are new, move over those that stay, let the rest leave. */
int edl_distill_set_teachers(edl_distill *d, const char *const *endpoints, size_t n)
{
    if (!d || (n && !endpoints))
        return EDL_EINVAL;
    teacher **nt = calloc(n ? n : 1, sizeof *nt);
    char (*ep)[128] = calloc(n ? n : 1, sizeof *ep);
    size_t k = 0, i;
    int rc = nt && ep ? 0 : EDL_ENOMEM;
    for (i = 0; i < n && rc == 0; i++) {
        if (!endpoints[i] || !endpoint_norm(endpoints[i], ep[k], sizeof ep[k]))
            rc = EDL_EINVAL;
        else if (listed(ep, k, ep[k]))
            continue; /* named twice */
        else if (!find(d->t, d->nt, ep[k]) && !(nt[k] = teacher_new(d, ep[k])))
            rc = EDL_ENOMEM;
        else
            k++;
    }
    for (i = 0; i < k && rc == 0; i++) {
        teacher *old = nt[i] ? NULL : find(d->t, d->nt, ep[i]);
        for (size_t j = 0; old && j < d->nt; j++)
            if (d->t[j] == old)
                d->t[j] = NULL, nt[i] = old;
    }
    for (i = 0; i < (rc ? k : d->nt); i++) /* failed: the new ones; else: the leavers */
        if (rc)
            teacher_free_one(nt[i]);
        else if (d->t[i])
            teacher_leave(d, d->t[i]);
    free(ep);
    if (rc) {
        free(nt);
        return rc;
    }
    free(d->t);
    d->t = nt, d->nt = k;
    curl_multi_setopt(d->multi, CURLMOPT_MAXCONNECTS, (long)(k * (size_t)d->o.in_flight + 4));
    return 0;
}

int edl_distill_submit(edl_distill *d, const float *in, uint32_t rows, uint32_t cols, uint64_t *id)
{
    if (!d || !in || !id)
        return EDL_EINVAL;
    batch *b = calloc(1, sizeof *b);
    if (!b)
        return EDL_ENOMEM;
    int rc = edl_distill_encode(d->o.format, false, in, rows, cols, &b->body, &b->len);
    if (rc == 0 && (rc = slot_push(d, b)) != 0)
        free(b->body);
    if (rc) {
        free(b);
        return rc;
    }
    b->id = *id = d->next_id++;
    b->rows = rows;
    queue_push(d, b, false);
    d->st.submitted++;
    return 0;
}

/* Hand the next deliverable batch to r: the next id when ordered, else the oldest answered. */
static bool deliver(edl_distill *d, edl_distill_result *r)
{
    batch *b;
    if (d->o.ordered) {
        b = slot_get(d, d->next_deliver);
        if (!b || b->state != B_READY)
            return false;
        d->next_deliver++;
    } else {
        if (!(b = d->rhead))
            return false;
        if (!(d->rhead = b->next))
            d->rtail = NULL;
    }
    *r = b->res;
    b->res.out = NULL;
    slot_clear(d, b->id);
    batch_free(b);
    d->st.delivered++;
    return true;
}

/* How long to sleep: until the deadline, at most POLL_MAX_MS, and no later than the end of a
 * back-off that a queued batch waits on (libcurl's own timers shorten the poll too). */
static int poll_ms(const edl_distill *d, int64_t deadline, int64_t now)
{
    int64_t ms = deadline < 0 ? POLL_MAX_MS : deadline - now;
    if (ms > POLL_MAX_MS)
        ms = POLL_MAX_MS;
    for (size_t k = 0; d->qhead && k < d->nt; k++)
        if (d->t[k]->backoff_until > now && d->t[k]->backoff_until - now < ms)
            ms = d->t[k]->backoff_until - now;
    return ms < 0 ? 0 : (int)ms;
}

int edl_distill_next(edl_distill *d, int timeout_ms, edl_distill_result *r)
{
    if (!d || !r)
        return EDL_EINVAL;
    memset(r, 0, sizeof *r);
    int64_t deadline = edl_deadline_ms(timeout_ms);
    for (;;) {
        if (deliver(d, r))
            return 0;
        dispatch(d);
        int running;
        curl_multi_perform(d->multi, &running);
        if (reap(d) > 0)
            continue; /* answers, and free slots for the queue */
        int64_t now = edl_monotonic_ms();
        if (deadline >= 0 && now >= deadline)
            return EDL_ETIMEDOUT;
        curl_multi_poll(d->multi, NULL, 0, poll_ms(d, deadline, now), NULL);
    }
}

void edl_distill_result_clear(edl_distill_result *r)
{
    if (r) {
        free(r->out);
        memset(r, 0, sizeof *r);
    }
}

size_t edl_distill_pending(const edl_distill *d)
{
    return d ? (size_t)(d->next_id - d->st.delivered) : 0;
}

void edl_distill_get_stats(const edl_distill *d, edl_distill_stats *s)
{
    if (d && s)
        *s = d->st;
}

void edl_distill_close(edl_distill *d)
{
    if (!d)
        return;
    while (d->nreq)
        request_free(d, d->req[d->nreq - 1]);
    for (size_t i = 0; i < d->nt; i++)
        teacher_free_one(d->t[i]);
    for (size_t i = d->off; i < d->nslot; i++)
        batch_free(d->slot[i]);
    curl_multi_cleanup(d->multi);
    curl_slist_free_all(d->headers);
    free(d->t);
    free(d->slot);
    free(d->req);
    free(d);
}

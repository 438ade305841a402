/* distill: knowledge distillation with a teacher served over HTTP, one program in both roles
 * (Paddle style: the role comes from EDL_ROLE_NAME, or --role).
 *
 * teacher  trains examples/elastic_mlp's MLP (examples/mlp.h: 16 -> 64 -> 4, the same data,
 *          steps and learning rate as elastic_mlp run alone, so the same weights) at start,
 *          then serves it with libmicrohttpd, one thread per connection:
 *            POST /v1/models/<model>:predict  {"instances":[[16 floats],...]} ->
 *                 {"predictions":[[4 probabilities],...]}, or edl's binary tensor both ways
 *                 (Content-Type application/x-edl-tensor); docs/distill.md
 *            GET  /v1/models/<model>          TensorFlow Serving's status, plus "load"
 *          on --port, else $PORT, else $EDL_SERVICE_PORT, else 8501 (0: any free port). It
 *          computes one batch at a time, each taking at least --service-time-ms (the bench's
 *          stand-in for a big model), and exits 0 on SIGTERM.
 * student  trains a logistic regression (16 -> 4) on the teacher's soft labels for the
 *          training set, asked from its teachers through libedldistill (ordered delivery;
 *          it states the replies it takes, 4 columns of probabilities, so a teacher answering
 *          another shape or other values is a bad reply and its batch goes elsewhere),
 *          and the same student on the same labels computed in this process (the teacher's
 *          model trained here too): the reference without a network. Prints both accuracies,
 *          the teacher's, and the client's counters. A batch that no teacher answered well
 *          in --max-tries tries ends it at once, as edl.distill.Reader does: it says which
 *          batch, each teacher that failed it and how, and exits 1 (every teacher bad: within
 *          max_tries * (timeout_ms + 2 s), edl/distill.h). Its
 *          teachers: --teachers, or those edl_discovery assigns it in --service / $EDL_SERVICE
 *          (under edl run --teachers, the job's teachers), followed as they come and go.
 *   distill [--role teacher|student] [options]; distill --help */
#define _GNU_SOURCE
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "edl/discovery.h"
#include "edl/distill.h"
#include "edl/log.h"
#include "mlp.h"

typedef struct opts {
    const char *role, *model, *teachers, *service;
    int port, service_ms, steps, epochs, batch, in_flight, timeout_ms, max_tries;
    float lr, student_lr;
    edl_distill_format format;
} opts;

/* The teacher's model, trained as elastic_mlp trains it alone (one rank, batches of BATCH). */
static void train_teacher(const data *d, float *p, int steps, float lr)
{
    static float g[NP];
    init_params(p);
    for (long step = 0; step < steps; step++) {
        memset(g, 0, sizeof g);
        for (int k = 0; k < BATCH; k++) {
            int i = (int)((step * BATCH + k) % NTRAIN), hit;
            sample(p, g, d->x[i], d->y[i], &hit);
        }
        for (int i = 0; i < NP; i++)
            p[i] -= lr * g[i] / BATCH;
    }
}

/* ---- the teacher ------------------------------------------------------------------------- */

typedef struct server {
    const opts *o;
    const float *p;
    char predict[192], status[160];
    pthread_mutex_t busy; /* one batch at a time, as one accelerator computes */
    atomic_int in_flight;
    atomic_ullong served;
} server;

typedef struct upload {
    char *buf;
    size_t len, cap;
    bool too_big;
} upload;

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *type,
                             char *body, size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status, const char *msg)
{
    char *body = NULL;
    int n = asprintf(&body, "{\"error\":\"%s\"}", msg); /* msg: our own text, no quotes */
    return n < 0 ? MHD_NO : reply(c, status, EDL_DISTILL_JSON_TYPE, body, (size_t)n);
}

static bool take_upload(upload *u, const char *bytes, size_t len)
{
    if (u->too_big || len > EDL_DISTILL_MAX_BODY - u->len)
        return !(u->too_big = true);
    if (u->len + len > u->cap) {
        size_t cap = u->cap ? u->cap : 65536;
        while (cap < u->len + len)
            cap *= 2;
        char *b = realloc(u->buf, cap);
        if (!b)
            return !(u->too_big = true);
        u->buf = b, u->cap = cap;
    }
    memcpy(u->buf + u->len, bytes, len);
    u->len += len;
    return true;
}

/* The batch's predictions, in the form it came in. */
static enum MHD_Result predict(server *s, struct MHD_Connection *c, const upload *u)
{
    const char *type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    edl_distill_format f = type && strncmp(type, EDL_DISTILL_BINARY_TYPE,
                                           strlen(EDL_DISTILL_BINARY_TYPE)) == 0
                               ? EDL_DISTILL_BINARY : EDL_DISTILL_JSON;
    float *x = NULL, *y;
    uint32_t rows, cols;
    char err[160];
    if (edl_distill_decode(f, false, u->buf ? u->buf : "", u->len, &x, &rows, &cols, err,
                           sizeof err) != 0)
        return reply_error(c, MHD_HTTP_BAD_REQUEST, "the body is not a tensor in the form "
                           "its Content-Type names");
    if (cols != D || !(y = malloc((size_t)rows * C * sizeof *y))) {
        free(x);
        return reply_error(c, MHD_HTTP_BAD_REQUEST, "instances must have 16 columns");
    }
    pthread_mutex_lock(&s->busy);
    int64_t until = edl_monotonic_ms() + s->o->service_ms;
    for (uint32_t i = 0; i < rows; i++)
        mlp_probs(s->p, x + (size_t)i * D, y + (size_t)i * C);
    for (int64_t now; (now = edl_monotonic_ms()) < until;)
        usleep((useconds_t)(until - now) * 1000);
    pthread_mutex_unlock(&s->busy);
    char *body;
    size_t len;
    int rc = edl_distill_encode(f, true, y, rows, C, &body, &len);
    free(x), free(y);
    if (rc)
        return reply_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "cannot encode the predictions");
    s->served++;
    return reply(c, MHD_HTTP_OK, f == EDL_DISTILL_BINARY ? EDL_DISTILL_BINARY_TYPE
                                                         : EDL_DISTILL_JSON_TYPE, body, len);
}

static enum MHD_Result model_status(server *s, struct MHD_Connection *c)
{
    char *body = NULL;
    int n = asprintf(&body, "{\"model_version_status\":[{\"version\":\"1\",\"state\":"
                     "\"AVAILABLE\",\"status\":{\"error_code\":\"OK\",\"error_message\":\"\"}}],"
                     "\"load\":%d,\"served\":%llu}", atomic_load(&s->in_flight),
                     (unsigned long long)atomic_load(&s->served));
    return n < 0 ? MHD_NO : reply(c, MHD_HTTP_OK, EDL_DISTILL_JSON_TYPE, body, (size_t)n);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *body,
                                  size_t *data_len, void **req_cls)
{
    (void)version;
    server *s = cls;
    bool post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    if (post && strcmp(url, s->predict) == 0) {
        upload *u = *req_cls;
        if (!u) { /* the first call: headers only */
            if (!(u = calloc(1, sizeof *u)))
                return MHD_NO;
            *req_cls = u;
            atomic_fetch_add(&s->in_flight, 1);
            return MHD_YES;
        }
        if (*data_len) {
            take_upload(u, body, *data_len);
            *data_len = 0;
            return MHD_YES;
        }
        if (u->too_big)
            return reply_error(c, MHD_HTTP_CONTENT_TOO_LARGE, "the body is over 256 MiB");
        return predict(s, c, u);
    }
    if (strcmp(method, MHD_HTTP_METHOD_GET) == 0 && strcmp(url, s->status) == 0)
        return model_status(s, c);
    if (post || strcmp(method, MHD_HTTP_METHOD_GET) == 0)
        return reply_error(c, MHD_HTTP_NOT_FOUND, "no such path: POST /v1/models/<model>:predict "
                           "or GET /v1/models/<model>");
    return reply_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "GET or POST");
}

static void on_done(void *cls, struct MHD_Connection *c, void **req_cls,
                    enum MHD_RequestTerminationCode why)
{
    (void)c, (void)why;
    server *s = cls;
    upload *u = *req_cls;
    if (u) {
        atomic_fetch_sub(&s->in_flight, 1);
        free(u->buf);
        free(u);
        *req_cls = NULL;
    }
}

static int teacher(const opts *o, const data *d, const float *p)
{
    server s = {.o = o, .p = p};
    snprintf(s.predict, sizeof s.predict, "/v1/models/%s:predict", o->model);
    snprintf(s.status, sizeof s.status, "/v1/models/%s", o->model);
    pthread_mutex_init(&s.busy, NULL);
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL); /* MHD's threads inherit it; main waits below */
    struct MHD_Daemon *daemon = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG,
        (uint16_t)o->port, NULL, NULL, on_request, &s, MHD_OPTION_NOTIFY_COMPLETED, on_done, &s,
        MHD_OPTION_CONNECTION_TIMEOUT, 120u, MHD_OPTION_END);
    if (!daemon) {
        fprintf(stderr, "distill: teacher: cannot listen on port %d (in use? pass --port)\n",
                o->port);
        return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
    float loss, acc = accuracy(d, p, &loss);
    printf("distill: teacher: test accuracy %.4f; serving model %s on http://127.0.0.1:%u\n",
           acc, o->model, info ? info->port : (unsigned)o->port);
    fflush(stdout);
    int sig;
    sigwait(&sigs, &sig);
    MHD_stop_daemon(daemon);
    printf("distill: teacher: %s: stopped after %llu batches\n", strsignal(sig),
           (unsigned long long)s.served);
    pthread_mutex_destroy(&s.busy);
    return 0;
}

/* ---- the student ------------------------------------------------------------------------- */

typedef struct student {
    float w[C][D], b[C];
} student;

/* One SGD step of softmax regression towards soft labels q (rows x C). */
static void student_step(student *m, const float *x, const float *q, int rows, float lr)
{
    float gw[C][D] = {{0}}, gb[C] = {0};
    for (int i = 0; i < rows; i++) {
        float z[C], mx = -1e30f, s = 0;
        for (int c = 0; c < C; c++) {
            z[c] = m->b[c];
            for (int j = 0; j < D; j++)
                z[c] += m->w[c][j] * x[i * D + j];
            mx = z[c] > mx ? z[c] : mx;
        }
        for (int c = 0; c < C; c++)
            s += z[c] = expf(z[c] - mx);
        for (int c = 0; c < C; c++) {
            float dz = z[c] / s - q[i * C + c];
            gb[c] += dz;
            for (int j = 0; j < D; j++)
                gw[c][j] += dz * x[i * D + j];
        }
    }
    for (int c = 0; c < C; c++) {
        m->b[c] -= lr * gb[c] / rows;
        for (int j = 0; j < D; j++)
            m->w[c][j] -= lr * gw[c][j] / rows;
    }
}

static float student_accuracy(const student *m, const data *d)
{
    int hits = 0;
    for (int i = NTRAIN; i < NTRAIN + NTEST; i++) {
        int arg = 0;
        float best = -1e30f;
        for (int c = 0; c < C; c++) {
            float z = m->b[c];
            for (int j = 0; j < D; j++)
                z += m->w[c][j] * d->x[i][j];
            if (z > best)
                best = z, arg = c;
        }
        hits += arg == d->y[i];
    }
    return (float)hits / NTEST;
}

/* The inputs of batch k: rows consecutive training samples (wrapping around the set). */
static void batch_inputs(const data *d, long k, int rows, float *x)
{
    for (int i = 0; i < rows; i++)
        memcpy(x + i * D, d->x[(k * rows + i) % NTRAIN], sizeof d->x[0]);
}

/* Where the student's teachers come from: a fixed list (--teachers URL,URL or $EDL_TEACHERS),
 * or the teachers of a service (--service NAME or $EDL_SERVICE, which the agent sets for a
 * job with teachers) that edl_discovery assigns this student, followed as they come and go. */
typedef struct source {
    const char *list;
    edl_etcd *etcd;
    edl_discovery *disc;
} source;

static void source_close(source *s)
{
    edl_discovery_close(s->disc);
    edl_etcd_close(s->etcd);
}

static int source_open(const opts *o, source *s)
{
    *s = (source){.list = o->teachers ? o->teachers : getenv("EDL_TEACHERS")};
    const char *svc = o->service ? o->service : getenv("EDL_SERVICE"), *pod = getenv("EDL_POD_ID");
    if (s->list)
        return 0;
    if (!svc) {
        fprintf(stderr, "distill: student: no teachers: pass --teachers or --service\n");
        return EDL_EINVAL;
    }
    char err[512], name[EDL_SERVICE_NAME_MAX + 1];
    snprintf(name, sizeof name, "%s", pod ? pod : "");
    if (!edl_service_name_ok(name)) /* not a DNS label: a name of its own */
        snprintf(name, sizeof name, "student-%d", (int)getpid());
    int rc = edl_etcd_open_env(&s->etcd, err, sizeof err);
    if (rc) {
        fprintf(stderr, "distill: student: etcd: %s\n", err);
        return rc;
    }
    edl_discovery_opts d = {.prefix = getenv("EDL_ETCD_PREFIX"), .service = svc, .student = name};
    if ((rc = edl_discovery_open(s->etcd, &d, &s->disc)) != 0)
        fprintf(stderr, "distill: student: discovering service %s: %s (%s)\n", svc,
                edl_strerror(rc), edl_etcd_errmsg(s->etcd));
    else
        printf("distill: student %s follows service %s\n", name, svc);
    return rc;
}

/* Give the client the student's teachers now (first), or when the service changed them. */
static int source_apply(source *s, edl_distill *dist, bool first)
{
    const char *eps[64];
    size_t n = 0;
    if (!s->disc) {
        if (!first)
            return 0;
        char *copy = strdup(s->list), *save = NULL;
        for (char *t = strtok_r(copy, ",", &save); t && n < 64; t = strtok_r(NULL, ",", &save))
            eps[n++] = t;
        int rc = copy ? edl_distill_set_teachers(dist, eps, n) : EDL_ENOMEM;
        free(copy);
        return rc;
    }
    bool changed = false;
    int rc = edl_discovery_poll(s->disc, 0, &changed);
    if (rc == EDL_ETIMEDOUT)
        rc = 0;
    if (rc || (!changed && !first))
        return rc;
    const edl_service_instance *t = edl_discovery_teachers(s->disc, &n);
    char line[1024] = "";
    for (size_t i = 0; i < n && i < 64; i++) {
        eps[i] = t[i].endpoint;
        size_t at = strlen(line);
        snprintf(line + at, sizeof line - at, "%s%s", i ? " " : "", t[i].name);
    }
    printf("distill: student: teachers now %zu of %zu: %s\n", n < 64 ? n : 64,
           edl_discovery_n_teachers(s->disc), line);
    fflush(stdout);
    return edl_distill_set_teachers(dist, eps, n < 64 ? n : 64);
}

/* The student on labels from its teachers: every batch delivered once, in order. */
static int student_remote(const opts *o, const data *d, const float *tp, student *m,
                          edl_distill_stats *st, long *mismatched, long *dup)
{
    /* the shape and bound it takes: C probabilities a row (it reads r.out as rows x C) */
    edl_distill_opts dopts = {.model = o->model, .format = o->format, .in_flight = o->in_flight,
                              .timeout_ms = o->timeout_ms, .max_tries = o->max_tries,
                              .ordered = true, .cols = C, .max_abs = 1};
    edl_distill *dist = NULL;
    source src = {0};
    int rc = edl_distill_open(&dopts, &dist);
    if (rc == 0 && (rc = source_open(o, &src)) == 0 && (rc = source_apply(&src, dist, true)))
        fprintf(stderr, "distill: student: its teachers: %s\n", edl_strerror(rc));
    long total = (long)o->epochs * (NTRAIN / o->batch), sent = 0, got = 0;
    float *x = malloc((size_t)o->batch * D * sizeof *x), q[C];
    uint8_t *seen = calloc((size_t)total, 1); /* deliveries of each batch */
    int64_t waited = 0;
    while (rc == 0 && x && seen && got < total) {
        while (sent < total && sent - got < 64) {
            uint64_t id;
            batch_inputs(d, sent++, o->batch, x);
            if ((rc = edl_distill_submit(dist, x, (uint32_t)o->batch, D, &id)) != 0)
                break;
        }
        edl_distill_result r;
        int nr = rc ? rc : edl_distill_next(dist, 100, &r);
        if (rc == 0 && (rc = source_apply(&src, dist, false)) != 0)
            fprintf(stderr, "distill: student: following its teachers: %s\n", edl_strerror(rc));
        if (nr == EDL_ETIMEDOUT && (waited += 100) % 5000 == 0)
            printf("distill: student: waiting for teachers (%ld of %ld batches answered)\n",
                   got, total);
        if (nr)
            continue;
        batch_inputs(d, (long)r.id, o->batch, x);
        if (r.id >= (uint64_t)total || seen[r.id]++) { /* never: delivery is exactly once */
            ++*dup;
            edl_distill_result_clear(&r);
            continue;
        }
        if (r.status) { /* every teacher it went to failed it: none left to wait for */
            fprintf(stderr, "distill: student: batch %llu: %s; stopping (check the teachers "
                    "named, or raise --timeout-ms / --max-tries if they are only slow)\n",
                    (unsigned long long)r.id, r.error);
            rc = r.status;
        } else {
            for (int i = 0; i < o->batch; i++) {
                mlp_probs(tp, x + i * D, q);
                for (int c = 0; c < C; c++)
                    *mismatched += fabsf(q[c] - r.out[i * C + c]) > 1e-5f;
            }
            student_step(m, x, r.out, o->batch, o->student_lr);
        }
        got++;
        edl_distill_result_clear(&r);
    }
    edl_distill_get_stats(dist, st);
    edl_distill_close(dist);
    source_close(&src);
    free(x);
    free(seen);
    return rc ? rc : *dup ? EDL_EPEER : 0;
}

/* The reference: the same student on the same batches, the teacher computed here. */
static void student_local(const opts *o, const data *d, const float *tp, student *m)
{
    long total = (long)o->epochs * (NTRAIN / o->batch);
    float *x = malloc((size_t)o->batch * D * sizeof *x);
    float *q = malloc((size_t)o->batch * C * sizeof *q);
    for (long k = 0; x && q && k < total; k++) {
        batch_inputs(d, k, o->batch, x);
        for (int i = 0; i < o->batch; i++)
            mlp_probs(tp, x + i * D, q + i * C);
        student_step(m, x, q, o->batch, o->student_lr);
    }
    free(x);
    free(q);
}

static int student_main(const opts *o, const data *d, const float *tp)
{
    student remote = {0}, local = {0};
    edl_distill_stats st;
    long mismatched = 0, dup = 0;
    int64_t t0 = edl_monotonic_ms();
    int rc = student_remote(o, d, tp, &remote, &st, &mismatched, &dup);
    double secs = (double)(edl_monotonic_ms() - t0) / 1000;
    student_local(o, d, tp, &local);
    float loss, tacc = accuracy(d, tp, &loss);
    printf("distill: student: test accuracy %.4f on the teachers' labels, %.4f on labels "
           "computed here (reference), teacher %.4f\n", student_accuracy(&remote, d),
           student_accuracy(&local, d), tacc);
    printf("distill: student: %llu batches in %.1f s, retried %llu, timeouts %llu, connection "
           "errors %llu, HTTP errors %llu, bad replies %llu, lost %llu, duplicated %ld, "
           "predictions differing from the local teacher %ld\n",
           (unsigned long long)st.delivered, secs, (unsigned long long)st.retried,
           (unsigned long long)st.timeouts, (unsigned long long)st.conn_errors,
           (unsigned long long)st.http_errors, (unsigned long long)st.bad_replies,
           (unsigned long long)(st.submitted - st.delivered + st.failed), dup, mismatched);
    if (rc && rc != EDL_EPEER) /* a failed batch said why already */
        fprintf(stderr, "distill: student: %s\n", edl_strerror(rc));
    return rc ? 1 : 0;
}

/* ---- options ----------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: distill [--role teacher|student] [options]\n"
        "Distillation over HTTP: a teacher serving examples/elastic_mlp's MLP, a student learning\n"
        "from it (the role: --role, else $EDL_ROLE_NAME; \"worker\" means student).\n"
        "  --model NAME          the model's name in the path /v1/models/NAME (default,\n"
        "                        as TensorFlow Serving and edl-agent --model default it)\n"
        "  --steps N             the teacher's training steps, in both roles (1500)\n"
        "  --lr X                the teacher's learning rate (0.2)\n"
        "teacher:\n"
        "  --port P              listen here (else $PORT, $EDL_SERVICE_PORT, 8501; 0: any)\n"
        "  --service-time-ms MS  each batch takes at least this long; one batch at a time (0)\n"
        "student:\n"
        "  --teachers URL,...    the teachers (else $EDL_TEACHERS), e.g. http://127.0.0.1:8501\n"
        "  --service NAME        else: the teachers this student is assigned in the service\n"
        "                        (else $EDL_SERVICE), found in etcd as the agent's environment\n"
        "                        says (EDL_ETCD_*), followed as teachers come and go\n"
        "  --format json|binary  the wire form (json: TensorFlow Serving's REST form)\n"
        "  --epochs N            passes over the training set (5)\n"
        "  --batch N             samples a batch (32)\n"
        "  --in-flight N         batches in flight per teacher (4)\n"
        "  --timeout-ms MS       one try's deadline before the batch goes elsewhere (10000)\n"
        "  --max-tries N         tries of a batch before the student gives up on it (8)\n"
        "  --student-lr X        the student's learning rate (0.5)\n");
}

static bool int_arg(const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end || v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

static int port_default(void)
{
    const char *e = getenv("PORT");
    if (!e || !*e)
        e = getenv("EDL_SERVICE_PORT");
    int p;
    return e && int_arg(e, 0, 65535, &p) ? p : 8501;
}

/* One option with its value; false for a bad one. */
static bool option(opts *o, const char *k, const char *v)
{
    char *end = (char *)"";
    if (strcmp(k, "--role") == 0)
        o->role = v;
    else if (strcmp(k, "--model") == 0)
        o->model = v;
    else if (strcmp(k, "--teachers") == 0)
        o->teachers = v;
    else if (strcmp(k, "--service") == 0)
        o->service = v;
    else if (strcmp(k, "--format") == 0) {
        if (strcmp(v, "json") && strcmp(v, "binary"))
            return false;
        o->format = strcmp(v, "binary") == 0 ? EDL_DISTILL_BINARY : EDL_DISTILL_JSON;
    } else if (strcmp(k, "--lr") == 0)
        o->lr = strtof(v, &end);
    else if (strcmp(k, "--student-lr") == 0)
        o->student_lr = strtof(v, &end);
    else
        return (strcmp(k, "--port") == 0 && int_arg(v, 0, 65535, &o->port)) ||
               (strcmp(k, "--service-time-ms") == 0 && int_arg(v, 0, 600000, &o->service_ms)) ||
               (strcmp(k, "--steps") == 0 && int_arg(v, 1, 10000000, &o->steps)) ||
               (strcmp(k, "--epochs") == 0 && int_arg(v, 1, 100000, &o->epochs)) ||
               (strcmp(k, "--batch") == 0 && int_arg(v, 1, NTRAIN, &o->batch)) ||
               (strcmp(k, "--in-flight") == 0 && int_arg(v, 1, 1024, &o->in_flight)) ||
               (strcmp(k, "--timeout-ms") == 0 && int_arg(v, 1, 3600000, &o->timeout_ms)) ||
               (strcmp(k, "--max-tries") == 0 && int_arg(v, 1, 1000, &o->max_tries));
    return *end == '\0' && *v && (o->lr > 0 && o->student_lr > 0);
}

int main(int argc, char **argv)
{
    opts o = {.role = getenv("EDL_ROLE_NAME"), .model = "default", .port = port_default(),
              .steps = 1500, .epochs = 5, .batch = 32, .in_flight = 4, .timeout_ms = 10000,
              .max_tries = 8, .lr = 0.2f, .student_lr = 0.5f};
    for (int i = 1; i < argc; i += 2) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc || !option(&o, argv[i], argv[i + 1])) {
            fprintf(stderr, "distill: bad option or value: %s %s (see --help)\n", argv[i],
                    i + 1 < argc ? argv[i + 1] : "");
            return 2;
        }
    }
    bool is_teacher = o.role && strcmp(o.role, "teacher") == 0;
    if (!o.role || (!is_teacher && strcmp(o.role, "student") && strcmp(o.role, "worker"))) {
        fprintf(stderr, "distill: no role: pass --role teacher|student or set EDL_ROLE_NAME\n");
        return 2;
    }
    edl_log_setup_from_env();
    data *d = malloc(sizeof *d);
    float *p = malloc(NP * sizeof *p);
    if (!d || !p)
        return 1;
    make_data(d);
    train_teacher(d, p, o.steps, o.lr);
    int rc = is_teacher ? teacher(&o, d, p) : student_main(&o, d, p);
    free(d);
    free(p);
    return rc;
}

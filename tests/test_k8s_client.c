/* test_k8s_client.c: libedlk8s against files and a scripted HTTP server in this file.
 *
 * No Kubernetes API server can be run here, so the server below is a script, not a stand-in
 * for one: each test's handler answers exactly what the test is about (a list, a watch stream
 * fed line by line, 409/429/5xx with Retry-After, a Lease store) and the server records every
 * request (method, raw path and query, token) for the assertions. */
#define _GNU_SOURCE /* vasprintf */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <microhttpd.h>

#include "edl/etcd_server.h"
#include "edl/k8s.h"
#include "edl/log.h"
#include "harness.h"

/* ---- the scripted server ---------------------------------------------------------------- */

#define MAX_LOG 512

typedef struct fake fake;

typedef struct fake_req {
    char method[16];
    char uri[2048];  /* path and raw query */
    char auth[256];
    char content_type[128];
    char user_agent[64];
    char *body;
    size_t body_len;
} fake_req;

typedef struct fake_reply {
    int status;
    char *body;              /* malloc'ed, or NULL */
    size_t body_len;         /* 0: strlen(body) */
    char retry_after[16];
    bool stream;             /* a chunked watch stream fed by fake_push */
} fake_reply;

typedef void (*fake_handler)(fake *f, const fake_req *r, fake_reply *out);

struct fake {
    struct MHD_Daemon *d;
    char url[64];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    fake_handler handler;
    void *state;
    int requests;
    char log[MAX_LOG][2100];   /* "GET /path?query" */
    char auth[MAX_LOG][300];
    char last_ct[128], last_ua[64], last_body[4096];
    /* the watch stream: lines waiting, how far the first one is sent */
    char **lines;
    size_t nlines, cap, sent;
    int end_streams;          /* end this many streams normally */
    int fail_streams;         /* break this many streams */
    int streams_open;
    int stream_seq;           /* the newest stream's number: only it takes lines */
    bool stopping;
};

typedef struct stream_ctx {
    fake *f;
    int id;
} stream_ctx;

static void *uri_log(void *cls, const char *uri, struct MHD_Connection *c)
{
    (void)cls, (void)c;
    fake_req *r = calloc(1, sizeof *r);
    if (r)
        snprintf(r->uri, sizeof r->uri, "%s", uri);
    return r;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t)
{
    (void)cls, (void)c, (void)t;
    fake_req *r = *con_cls;
    if (r) {
        free(r->body);
        free(r);
    }
    *con_cls = NULL;
}

static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    stream_ctx *sc = cls;
    fake *f = sc->f;
    ssize_t n = 0;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        if (f->stopping || sc->id != f->stream_seq || f->fail_streams > 0) {
            if (!f->stopping && sc->id == f->stream_seq)
                f->fail_streams--;
            n = MHD_CONTENT_READER_END_WITH_ERROR;
            break;
        }
        if (f->nlines > 0) {
            size_t len = strlen(f->lines[0]) - f->sent;
            n = (ssize_t)(len < max ? len : max);
            memcpy(buf, f->lines[0] + f->sent, (size_t)n);
            f->sent += (size_t)n;
            if (f->sent == strlen(f->lines[0])) {
                free(f->lines[0]);
                memmove(f->lines, f->lines + 1, (f->nlines - 1) * sizeof *f->lines);
                f->nlines--;
                f->sent = 0;
            }
            break;
        }
        if (f->end_streams > 0) {
            f->end_streams--;
            n = MHD_CONTENT_READER_END_OF_STREAM;
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&f->cv, &f->mu, &ts);
    }
    pthread_mutex_unlock(&f->mu);
    return n;
}

static void stream_done(void *cls)
{
    stream_ctx *sc = cls;
    fake *f = sc->f;
    pthread_mutex_lock(&f->mu);
    f->streams_open--;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    free(sc);
}

static void record(fake *f, const fake_req *r)
{
    pthread_mutex_lock(&f->mu);
    if (f->requests < MAX_LOG) {
        snprintf(f->log[f->requests], sizeof f->log[0], "%s %s", r->method, r->uri);
        snprintf(f->auth[f->requests], sizeof f->auth[0], "%s", r->auth);
    }
    f->requests++;
    snprintf(f->last_ct, sizeof f->last_ct, "%s", r->content_type);
    snprintf(f->last_ua, sizeof f->last_ua, "%s", r->user_agent);
    snprintf(f->last_body, sizeof f->last_body, "%.*s", (int)(r->body_len < 4000 ? r->body_len : 4000),
             r->body ? r->body : "");
    pthread_mutex_unlock(&f->mu);
}

static void header_copy(struct MHD_Connection *c, const char *name, char *dst, size_t len)
{
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
    snprintf(dst, len, "%s", v ? v : "");
}

static enum MHD_Result answer(fake *f, struct MHD_Connection *c, fake_req *r)
{
    fake_reply out = {.status = 200};
    header_copy(c, "Authorization", r->auth, sizeof r->auth);
    header_copy(c, "Content-Type", r->content_type, sizeof r->content_type);
    header_copy(c, "User-Agent", r->user_agent, sizeof r->user_agent);
    f->handler(f, r, &out);
    struct MHD_Response *resp;
    stream_ctx *sc = NULL;
    if (out.stream) {
        /* the newest stream before the request is seen: lines pushed after go to it */
        sc = malloc(sizeof *sc);
        assert_non_null(sc);
        pthread_mutex_lock(&f->mu);
        f->streams_open++;
        *sc = (stream_ctx){f, ++f->stream_seq};
        pthread_mutex_unlock(&f->mu);
    }
    record(f, r);
    if (out.stream) {
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, stream_cb, sc, stream_done);
    } else {
        size_t n = out.body ? (out.body_len ? out.body_len : strlen(out.body)) : 0;
        resp = MHD_create_response_from_buffer(n, out.body ? out.body : (char *)"", MHD_RESPMEM_MUST_COPY);
    }
    free(out.body);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    if (out.retry_after[0])
        MHD_add_response_header(resp, "Retry-After", out.retry_after);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)out.status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    (void)url, (void)version;
    fake_req *r = *con_cls;
    if (!r)
        return MHD_NO;
    if (!r->method[0]) {
        snprintf(r->method, sizeof r->method, "%s", method);
        return MHD_YES;
    }
    if (*upload_size) {
        char *b = realloc(r->body, r->body_len + *upload_size + 1);
        if (!b)
            return MHD_NO;
        memcpy(b + r->body_len, upload, *upload_size);
        r->body = b;
        r->body_len += *upload_size;
        r->body[r->body_len] = '\0';
        *upload_size = 0;
        return MHD_YES;
    }
    return answer(cls, c, r);
}

/* An HTTP server, or HTTPS with the PEM certificate and key given (kept by the caller). */
static fake *fake_open_tls(fake_handler h, void *state, const char *cert, const char *key)
{
    fake *f = calloc(1, sizeof *f);
    assert_non_null(f);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    f->handler = h;
    f->state = state;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION;
    if (cert)
        f->d = MHD_start_daemon(flags | MHD_USE_TLS, 0, NULL, NULL, on_request, f,
                                MHD_OPTION_URI_LOG_CALLBACK, uri_log, NULL,
                                MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
                                MHD_OPTION_HTTPS_MEM_CERT, cert, MHD_OPTION_HTTPS_MEM_KEY, key,
                                MHD_OPTION_END);
    else
        f->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, f, MHD_OPTION_URI_LOG_CALLBACK,
                                uri_log, NULL, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
                                MHD_OPTION_END);
    assert_non_null(f->d);
    const union MHD_DaemonInfo *i = MHD_get_daemon_info(f->d, MHD_DAEMON_INFO_BIND_PORT);
    snprintf(f->url, sizeof f->url, "%s://127.0.0.1:%u", cert ? "https" : "http", (unsigned)i->port);
    return f;
}

static fake *fake_open(fake_handler h, void *state)
{
    return fake_open_tls(h, state, NULL, NULL);
}

static void fake_close(fake *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->mu);
    f->stopping = true;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    MHD_stop_daemon(f->d);
    for (size_t i = 0; i < f->nlines; i++)
        free(f->lines[i]);
    free(f->lines);
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

/* Queue one line (a newline is added) for the watch stream. */
static void fake_push(fake *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fake_push(fake *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *line = NULL;
    int n = vasprintf(&line, fmt, ap);
    va_end(ap);
    assert_true(n >= 0);
    char *withnl = realloc(line, (size_t)n + 2);
    assert_non_null(withnl);
    memcpy(withnl + n, "\n", 2);
    pthread_mutex_lock(&f->mu);
    if (f->nlines == f->cap) {
        f->cap = f->cap ? f->cap * 2 : 16;
        f->lines = realloc(f->lines, f->cap * sizeof *f->lines);
        assert_non_null(f->lines);
    }
    f->lines[f->nlines++] = withnl;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

/* End (ok) or break (!ok) the current watch stream once its queued lines are sent. */
static void fake_end_stream(fake *f, bool ok)
{
    pthread_mutex_lock(&f->mu);
    if (ok)
        f->end_streams++;
    else
        f->fail_streams++;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

static int fake_requests(fake *f)
{
    pthread_mutex_lock(&f->mu);
    int n = f->requests;
    pthread_mutex_unlock(&f->mu);
    return n;
}

/* The i-th request line ("GET /path?query"), copied. */
static void fake_log(fake *f, int i, char *out, size_t len)
{
    pthread_mutex_lock(&f->mu);
    snprintf(out, len, "%s", i >= 0 && i < f->requests && i < MAX_LOG ? f->log[i] : "");
    pthread_mutex_unlock(&f->mu);
}

/* Wait until some request's line contains `what` (from request index `from`); its index. */
static int fake_wait_request(fake *f, int from, const char *what, int timeout_ms)
{
    int64_t end = harness_now_ms() + timeout_ms;
    do {
        pthread_mutex_lock(&f->mu);
        for (int i = from; i < f->requests && i < MAX_LOG; i++)
            if (strstr(f->log[i], what)) {
                pthread_mutex_unlock(&f->mu);
                return i;
            }
        pthread_mutex_unlock(&f->mu);
        harness_sleep_ms(5);
    } while (harness_now_ms() < end);
    return -1;
}

static char *xstrdup(const char *s)
{
    char *d = strdup(s);
    assert_non_null(d);
    return d;
}

static char *xprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    assert_true(n >= 0);
    return s;
}

static edl_k8s *client_for(fake *f)
{
    edl_k8s_config c = {.server = f->url, .token = (char *)"t0k", .timeout_ms = 5000};
    edl_k8s *k;
    assert_int_equal(edl_k8s_open(&c, &k), 0);
    return k;
}

/* ---- files -------------------------------------------------------------------------------- */

static char *make_tmpdir(void)
{
    char tmpl[] = "/tmp/edl-k8s-test-XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    return xstrdup(tmpl);
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[1024];
    assert_true((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) < sizeof path);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* base64 of "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n" and friends */
#define B64_CA "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCkNBCi0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K"
#define B64_CERT "Q0VSVA=="
#define B64_KEY "S0VZ"

static const char *KUBECONFIG_GOOD =
    "apiVersion: v1\n"
    "kind: Config\n"
    "current-context: dev\n"
    "clusters:\n"
    "- name: prod\n"
    "  cluster:\n"
    "    server: https://prod.example:6443\n"
    "    certificate-authority: certs/ca.pem\n"
    "- name: dev\n"
    "  cluster:\n"
    "    server: https://10.1.2.3:6443/\n"
    "    certificate-authority-data: " B64_CA "\n"
    "    insecure-skip-tls-verify: false\n"
    "users:\n"
    "- name: alice\n"
    "  user:\n"
    "    client-certificate-data: " B64_CERT "\n"
    "    client-key-data: " B64_KEY "\n"
    "    token: \"abc.def\"\n"
    "- name: bob\n"
    "  user:\n"
    "    client-certificate: bob.crt\n"
    "    client-key: /abs/bob.key\n"
    "    tokenFile: secrets/token\n"
    "contexts:\n"
    "- name: dev\n"
    "  context: {cluster: dev, user: alice, namespace: team-a}\n"
    "- name: prod\n"
    "  context:\n"
    "    cluster: prod\n"
    "    user: bob\n";

static void test_kubeconfig_data_fields_of_current_context(void **state)
{
    (void)state;
    char *dir = make_tmpdir(), path[1024], err[512] = "";
    write_file(dir, "config", KUBECONFIG_GOOD);
    snprintf(path, sizeof path, "%s/config", dir);
    edl_k8s_config c;
    assert_int_equal(edl_k8s_config_kubeconfig(&c, path, NULL, err, sizeof err), 0);
    assert_string_equal(c.server, "https://10.1.2.3:6443/");
    assert_string_equal(c.ca_data, "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n");
    assert_null(c.ca_file);
    assert_string_equal(c.cert_data, "CERT");
    assert_string_equal(c.key_data, "KEY");
    assert_string_equal(c.token, "abc.def");
    assert_string_equal(c.namespace, "team-a");
    assert_false(c.insecure_skip_tls_verify);
    edl_k8s_config_clear(&c);
    harness_rmtree(dir);
    free(dir);
}

static void test_kubeconfig_files_relative_to_it_in_named_context(void **state)
{
    (void)state;
    char *dir = make_tmpdir(), path[1024], want[1024], err[512] = "";
    write_file(dir, "config", KUBECONFIG_GOOD);
    snprintf(path, sizeof path, "%s/config", dir);
    edl_k8s_config c;
    assert_int_equal(edl_k8s_config_kubeconfig(&c, path, "prod", err, sizeof err), 0);
    assert_string_equal(c.server, "https://prod.example:6443");
    snprintf(want, sizeof want, "%s/certs/ca.pem", dir);
    assert_string_equal(c.ca_file, want);
    snprintf(want, sizeof want, "%s/bob.crt", dir);
    assert_string_equal(c.cert_file, want);
    assert_string_equal(c.key_file, "/abs/bob.key");
    snprintf(want, sizeof want, "%s/secrets/token", dir);
    assert_string_equal(c.token_file, want);
    assert_null(c.token);
    assert_null(c.namespace);
    edl_k8s_config_clear(&c);
    harness_rmtree(dir);
    free(dir);
}

typedef struct kc_case {
    const char *yaml, *context;
    const char *want; /* in the error, after "kubeconfig <path>" */
} kc_case;

static void test_kubeconfig_errors_name_file_and_field(void **state)
{
    (void)state;
    static const kc_case cases[] = {
        {"clusters: []\n", NULL, "current-context: not set"},
        {"current-context: x\ncontexts: []\n", NULL, "contexts: no entry named \"x\""},
        {"current-context: x\ncontexts:\n- name: x\n  context: {user: u}\n", NULL,
         "contexts[0].context.cluster: missing"},
        {"current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  cluster:\n",
         NULL, "clusters[0].cluster: missing"},
        {"current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  cluster: {certificate-authority: a}\n",
         NULL, "clusters[0].cluster.server: missing"},
        {"current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\nclusters:\n- name: c\n  cluster: {server: 'https://a'}\n"
         "users:\n- name: v\n  user: {}\n- name: u\n  user: {client-certificate-data: Q0VSVA==, client-key-data: '@@notb64'}\n",
         NULL, "users[1].user.client-key-data: not base64"},
        {"current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\nclusters:\n- name: c\n  cluster: {server: 'https://a'}\n"
         "users:\n- name: u\n  user:\n    exec:\n      command: aws\n",
         NULL, "users[0].user.exec: credential plugins (exec) are not supported"},
        {"current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\nclusters:\n- name: c\n  cluster: {server: 'https://a'}\n"
         "users:\n- name: u\n  user:\n    auth-provider: {name: gcp}\n",
         NULL, "users[0].user.auth-provider: auth providers are not supported"},
        {"current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\nclusters:\n- name: c\n  cluster: {server: 'https://a'}\n"
         "users:\n- name: u\n  user: {client-certificate: a.crt}\n",
         NULL, "users[0].user: a client certificate needs its key"},
        {"current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  cluster: {server: 'https://a', insecure-skip-tls-verify: maybe}\n",
         NULL, "clusters[0].cluster.insecure-skip-tls-verify: not true or false"},
        {"current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  cluster: {server: [a]}\n",
         NULL, "clusters[0].cluster.server: not a string"},
        {"current-context: x\nclusters: {a: b}\ncontexts:\n- name: x\n  context: {cluster: c}\n", NULL,
         "clusters: not a list"},
        {"current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: nobody}\nclusters:\n- name: c\n  cluster: {server: 'https://a'}\n",
         NULL, "users: no entry named \"nobody\""},
        {"clusters:\n  - name: a\n   bad: indentation\n", NULL, ":3:"},
        {"key: [unclosed\n", NULL, "not valid YAML"},
        {"", NULL, "not a mapping"},
        {"current-context: dev\n", "other", "contexts: no entry named \"other\""},
    };
    char *dir = make_tmpdir(), path[1024], err[512];
    snprintf(path, sizeof path, "%s/config", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_file(dir, "config", cases[i].yaml);
        edl_k8s_config c;
        err[0] = '\0';
        int rc = edl_k8s_config_kubeconfig(&c, path, cases[i].context, err, sizeof err);
        if (rc != EDL_ECONFIG || !strstr(err, path) || !strstr(err, cases[i].want))
            fail_msg("case %zu: rc %d, err \"%s\"; want ECONFIG and \"%s\"", i, rc, err, cases[i].want);
        assert_null(c.server);
    }
    edl_k8s_config c;
    assert_int_equal(edl_k8s_config_kubeconfig(&c, "/nonexistent/kubeconfig", NULL, err, sizeof err), EDL_ENOTFOUND);
    assert_non_null(strstr(err, "/nonexistent/kubeconfig"));
    harness_rmtree(dir);
    free(dir);
}

static void test_in_cluster_config_from_root_dir(void **state)
{
    (void)state;
    char *dir = make_tmpdir(), err[512], want[1024];
    write_file(dir, "token", "sa-token\n");
    write_file(dir, "ca.crt", "PEM");
    write_file(dir, "namespace", "jobs\n");
    edl_k8s_config c;
    unsetenv("KUBERNETES_SERVICE_HOST");
    assert_int_equal(edl_k8s_config_in_cluster(&c, dir, err, sizeof err), EDL_ENOTFOUND);
    setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
    setenv("KUBERNETES_SERVICE_PORT", "443", 1);
    assert_int_equal(edl_k8s_config_in_cluster(&c, dir, err, sizeof err), 0);
    assert_string_equal(c.server, "https://10.96.0.1:443");
    snprintf(want, sizeof want, "%s/token", dir);
    assert_string_equal(c.token_file, want);
    snprintf(want, sizeof want, "%s/ca.crt", dir);
    assert_string_equal(c.ca_file, want);
    assert_string_equal(c.namespace, "jobs");
    edl_k8s_config_clear(&c);
    setenv("KUBERNETES_SERVICE_HOST", "fd00:10:96::1", 1);
    assert_int_equal(edl_k8s_config_in_cluster(&c, dir, err, sizeof err), 0);
    assert_string_equal(c.server, "https://[fd00:10:96::1]:443");
    edl_k8s_config_clear(&c);
    setenv("KUBERNETES_SERVICE_PORT", "https", 1);
    assert_int_equal(edl_k8s_config_in_cluster(&c, dir, err, sizeof err), EDL_ECONFIG);
    assert_non_null(strstr(err, "KUBERNETES_SERVICE_PORT=https"));
    setenv("KUBERNETES_SERVICE_PORT", "443", 1);
    assert_int_equal(edl_k8s_config_in_cluster(&c, "/nonexistent", err, sizeof err), EDL_ECONFIG);
    assert_non_null(strstr(err, "/nonexistent/token"));
    unsetenv("KUBERNETES_SERVICE_HOST");
    unsetenv("KUBERNETES_SERVICE_PORT");
    harness_rmtree(dir);
    free(dir);
}

static void test_config_load_order(void **state)
{
    (void)state;
    char *dir = make_tmpdir(), path[1024], err[512];
    char *old_home = getenv("HOME") ? xstrdup(getenv("HOME")) : NULL;
    write_file(dir, "config", KUBECONFIG_GOOD);
    snprintf(path, sizeof path, "%s/config:/second/ignored", dir);
    setenv("KUBECONFIG", path, 1);
    edl_k8s_config c;
    assert_int_equal(edl_k8s_config_load(&c, NULL, "prod", err, sizeof err), 0);
    assert_string_equal(c.server, "https://prod.example:6443");
    edl_k8s_config_clear(&c);
    unsetenv("KUBECONFIG");
    /* no $KUBECONFIG, no cluster: ~/.kube/config */
    setenv("HOME", dir, 1);
    snprintf(path, sizeof path, "%s/.kube", dir);
    assert_int_equal(mkdir(path, 0700), 0);
    write_file(path, "config", KUBECONFIG_GOOD);
    assert_int_equal(edl_k8s_config_load(&c, NULL, NULL, err, sizeof err), 0);
    assert_string_equal(c.server, "https://10.1.2.3:6443/");
    edl_k8s_config_clear(&c);
    harness_rmtree(path);
    assert_int_equal(edl_k8s_config_load(&c, NULL, NULL, err, sizeof err), EDL_ENOTFOUND);
    assert_non_null(strstr(err, "no Kubernetes configuration"));
    if (old_home)
        setenv("HOME", old_home, 1);
    free(old_home);
    harness_rmtree(dir);
    free(dir);
}

static void test_object_helpers_and_paths(void **state)
{
    (void)state;
    cJSON *o = cJSON_Parse("{\"metadata\":{\"name\":\"a\",\"generation\":7},\"spec\":{\"x\":1.5}}");
    assert_string_equal(edl_k8s_str(o, "metadata.name"), "a");
    assert_null(edl_k8s_str(o, "metadata.generation"));
    assert_null(edl_k8s_str(o, "metadata.name.x"));
    assert_int_equal(edl_k8s_int(o, "metadata.generation", -1), 7);
    assert_int_equal(edl_k8s_int(o, "spec.x", -1), -1);
    assert_int_equal(edl_k8s_int(o, "spec.y", -2), -2);
    cJSON_Delete(o);
    char buf[40];
    int64_t ms;
    assert_string_equal(edl_k8s_time(1795441500123, true, buf, sizeof buf), "2026-11-23T13:45:00.123000Z");
    assert_string_equal(edl_k8s_time(1795441500123, false, buf, sizeof buf), "2026-11-23T13:45:00Z");
    assert_int_equal(edl_k8s_time_parse("2026-11-23T13:45:00.123456Z", &ms), 0);
    assert_int_equal(ms, 1795441500123);
    assert_int_equal(edl_k8s_time_parse("2026-11-23T14:45:00+01:00", &ms), 0);
    assert_int_equal(ms, 1795441500000);
    assert_int_equal(edl_k8s_time_parse("2026-11-23 13:45:00Z", &ms), EDL_EINVAL);
    assert_int_equal(edl_k8s_time_parse("2026-11-23T13:45:00", &ms), EDL_EINVAL);
    char *p = edl_k8s_path("edl.dev", "v1alpha1", "ns1", "trainingjobs", "j", "status");
    assert_string_equal(p, "/apis/edl.dev/v1alpha1/namespaces/ns1/trainingjobs/j/status");
    free(p);
    p = edl_k8s_path(NULL, "v1", NULL, "pods", NULL, NULL);
    assert_string_equal(p, "/api/v1/pods");
    free(p);
}

/* ---- requests ----------------------------------------------------------------------------- */

typedef struct script {
    int statuses[16];        /* replies in order; 0 ends the script (then 200) */
    const char *retry_after; /* sent with every non-200 */
    int next;
    const char *body;        /* for every reply */
} script;

static void scripted(fake *f, const fake_req *r, fake_reply *out)
{
    (void)r;
    script *s = f->state;
    pthread_mutex_lock(&f->mu);
    int st = s->statuses[s->next] ? s->statuses[s->next++] : 200;
    pthread_mutex_unlock(&f->mu);
    out->status = st;
    out->body = xstrdup(s->body ? s->body : "{\"kind\":\"Pod\"}");
    if (st != 200 && s->retry_after)
        snprintf(out->retry_after, sizeof out->retry_after, "%s", s->retry_after);
}

/* A GET through k: whether the fake saw it carry `Bearer <token>`. */
static bool get_carries(edl_k8s *k, fake *f, const char *token)
{
    char want[64];
    snprintf(want, sizeof want, "Bearer %s", token);
    if (edl_k8s_get(k, "/api/v1/pods", NULL) != 0)
        return false;
    pthread_mutex_lock(&f->mu);
    bool carried = f->requests > 0 && strcmp(f->auth[f->requests - 1], want) == 0;
    pthread_mutex_unlock(&f->mu);
    return carried;
}

static void test_token_file_rotation_reread(void **state)
{
    (void)state;
    script s = {{0}};
    fake *f = fake_open(scripted, &s);
    char *dir = make_tmpdir(), err[256];
    write_file(dir, "token", "one\n");
    setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1", 1);
    setenv("KUBERNETES_SERVICE_PORT", "1", 1);
    edl_k8s_config c;
    assert_int_equal(edl_k8s_config_in_cluster(&c, dir, err, sizeof err), 0);
    unsetenv("KUBERNETES_SERVICE_HOST");
    unsetenv("KUBERNETES_SERVICE_PORT");
    free(c.server);
    c.server = xstrdup(f->url);
    c.token_reread_ms = 300;
    edl_k8s *k;
    assert_int_equal(edl_k8s_open(&c, &k), 0);
    edl_k8s_config_clear(&c);
    int64_t t_read = harness_now_ms();
    assert_int_equal(edl_k8s_get(k, "/api/v1/pods", NULL), 0);
    write_file(dir, "token", "two\n");
    assert_int_equal(edl_k8s_get(k, "/api/v1/pods", NULL), 0); /* read less than 300 ms ago */
    /* the new token goes out once the 300 ms the client keeps a token read have passed, and
     * not before: every request until then carried the old one */
    assert_true(HARNESS_WAIT_UNTIL(get_carries(k, f, "two"), 5000));
    assert_true(harness_now_ms() - t_read >= 300);
    for (int i = 0; i < f->requests - 1; i++)
        assert_string_equal(f->auth[i], "Bearer one");
    assert_string_equal(f->last_ua, "edl-operator/0.1");
    edl_k8s_close(k);
    fake_close(f);
    harness_rmtree(dir);
    free(dir);
}

static void test_retries_429_503_then_success_and_give_up(void **state)
{
    (void)state;
    script s = {{429, 503, 0}, .retry_after = "1"};
    fake *f = fake_open(scripted, &s);
    edl_k8s *k = client_for(f);
    edl_k8s_reply r;
    int64_t t0 = harness_now_ms();
    assert_int_equal(edl_k8s_get(k, "/api/v1/namespaces/a/pods/p", &r), 0);
    int64_t took = harness_now_ms() - t0;
    assert_int_equal(r.status, 200);
    assert_string_equal(edl_k8s_str(r.body, "kind"), "Pod");
    edl_k8s_reply_clear(&r);
    assert_true(took >= 1900 && took < 4000); /* Retry-After: 1 honoured, twice */
    edl_k8s_stats st;
    edl_k8s_get_stats(k, &st);
    assert_int_equal(st.requests, 3);
    assert_int_equal(st.retries, 2);
    /* always failing: 1 + 4 retries, then the status comes back */
    script always = {{503, 503, 503, 503, 503, 503, 503, 503}, .retry_after = "0",
                     .body = "{\"kind\":\"Status\",\"reason\":\"ServiceUnavailable\",\"message\":\"etcd is down\"}"};
    f->state = &always;
    assert_int_equal(edl_k8s_get(k, "/api/v1/pods", &r), EDL_ESERVER);
    assert_int_equal(r.status, 503);
    assert_string_equal(r.reason, "ServiceUnavailable");
    assert_string_equal(r.message, "etcd is down");
    edl_k8s_reply_clear(&r);
    edl_k8s_get_stats(k, &st);
    assert_int_equal(st.requests, 8);
    assert_int_equal(st.retries, 6);
    assert_int_equal(fake_requests(f), 8);
    edl_k8s_close(k);
    fake_close(f);
}

static void test_status_codes_and_reasons(void **state)
{
    (void)state;
    script s = {{409, 404, 422, 403, 410, 0},
                .body = "{\"kind\":\"Status\",\"reason\":\"AlreadyExists\",\"message\":\"pods \\\"p\\\" already exists\"}"};
    fake *f = fake_open(scripted, &s);
    edl_k8s *k = client_for(f);
    cJSON *pod = cJSON_Parse("{\"metadata\":{\"name\":\"p\"}}");
    edl_k8s_reply r;
    assert_int_equal(edl_k8s_create(k, "/api/v1/namespaces/a/pods", pod, &r), EDL_ECONFLICT);
    assert_int_equal(r.status, 409);
    assert_string_equal(r.reason, "AlreadyExists");
    assert_string_equal(r.message, "pods \"p\" already exists");
    edl_k8s_reply_clear(&r);
    assert_string_equal(f->last_ct, "application/json");
    assert_string_equal(f->last_body, "{\"metadata\":{\"name\":\"p\"}}");
    assert_int_equal(edl_k8s_get(k, "/x", NULL), EDL_ENOTFOUND);
    assert_int_equal(edl_k8s_update(k, "/x", pod, NULL), EDL_ECONFIG);
    assert_int_equal(edl_k8s_merge_patch(k, "/x", pod, NULL), EDL_EAUTH);
    assert_string_equal(f->last_ct, "application/merge-patch+json");
    assert_int_equal(edl_k8s_delete(k, "/x", "Foreground", 0, NULL), EDL_ECOMPACTED);
    char line[2100];
    fake_log(f, 4, line, sizeof line);
    assert_string_equal(line, "DELETE /x");
    assert_non_null(strstr(f->last_body, "\"propagationPolicy\":\"Foreground\""));
    assert_non_null(strstr(f->last_body, "\"gracePeriodSeconds\":0"));
    assert_int_equal(edl_k8s_delete(k, "/x", NULL, -1, NULL), 0);
    assert_string_equal(f->last_body, "");
    fake_log(f, 2, line, sizeof line);
    assert_string_equal(line, "PUT /x");
    /* not JSON: the start of the text is the message */
    script text = {{500, 0}, .retry_after = "0", .body = "upstream\nexploded"};
    s = text;
    s.statuses[1] = 500, s.statuses[2] = 500, s.statuses[3] = 500, s.statuses[4] = 500;
    assert_int_equal(edl_k8s_get(k, "/y", &r), EDL_ESERVER);
    assert_string_equal(r.message, "upstream exploded");
    assert_null(r.body);
    edl_k8s_reply_clear(&r);
    cJSON_Delete(pod);
    edl_k8s_close(k);
    fake_close(f);
}

static void huge_reply(fake *f, const fake_req *r, fake_reply *out)
{
    (void)f, (void)r;
    size_t n = (16u << 20) + 10;
    out->body = malloc(n + 1);
    assert_non_null(out->body);
    memset(out->body, ' ', n);
    out->body[0] = '{';
    out->body[n - 1] = '}';
    out->body[n] = '\0';
    out->body_len = n;
}

static void test_reply_over_16mib_and_unreachable(void **state)
{
    (void)state;
    fake *f = fake_open(huge_reply, NULL);
    edl_k8s *k = client_for(f);
    edl_k8s_reply r;
    assert_int_equal(edl_k8s_get(k, "/big", &r), EDL_ETOOBIG);
    assert_non_null(strstr(r.message, "/big"));
    edl_k8s_reply_clear(&r);
    edl_k8s_close(k);
    fake_close(f);
    int port = harness_free_port();
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    edl_k8s_config c = {.server = url};
    assert_int_equal(edl_k8s_open(&c, &k), 0);
    assert_int_equal(edl_k8s_get(k, "/api/v1/pods", &r), EDL_EUNAVAIL);
    assert_non_null(strstr(r.message, url));
    edl_k8s_reply_clear(&r);
    edl_k8s_stats st;
    edl_k8s_get_stats(k, &st);
    assert_int_equal(st.requests, 5);
    assert_int_equal(st.retries, 4);
    edl_k8s_close(k);
    edl_k8s_config bad = {.server = (char *)"ftp://x"};
    assert_int_equal(edl_k8s_open(&bad, &k), EDL_EINVAL);
}

static char *slurp(const char *dir, const char *name)
{
    char path[1024], *buf = malloc(16384);
    assert_non_null(buf);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    harness_read_file(path, buf, 16384);
    assert_true(strlen(buf) > 0);
    return buf;
}

static void test_tls_ca_data_file_insecure_and_client_cert_data(void **state)
{
    (void)state;
    char *dir = make_tmpdir(), err[256], path[1024];
    harness_rmtree(dir); /* edl_etcd_tls_make wants to create it */
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(edl_etcd_tls_make(dir, 1, err, sizeof err), 0);
    char *cert = slurp(dir, EDL_ETCD_TLS_SERVER_CERT), *key = slurp(dir, EDL_ETCD_TLS_SERVER_KEY);
    char *ca = slurp(dir, EDL_ETCD_TLS_CA), *ccert = slurp(dir, EDL_ETCD_TLS_CLIENT_CERT),
         *ckey = slurp(dir, EDL_ETCD_TLS_CLIENT_KEY);
    script sc = {{0}};
    fake *f = fake_open_tls(scripted, &sc, cert, key);
    edl_k8s *k;
    edl_k8s_reply r;
    /* CA as data, client certificate and key as data */
    edl_k8s_config c = {.server = f->url, .ca_data = ca, .cert_data = ccert, .key_data = ckey};
    assert_int_equal(edl_k8s_open(&c, &k), 0);
    assert_int_equal(edl_k8s_get(k, "/api/v1/pods", &r), 0);
    assert_int_equal(r.status, 200);
    edl_k8s_reply_clear(&r);
    edl_k8s_close(k);
    /* CA as a file */
    snprintf(path, sizeof path, "%s/%s", dir, EDL_ETCD_TLS_CA);
    edl_k8s_config cf = {.server = f->url, .ca_file = path};
    assert_int_equal(edl_k8s_open(&cf, &k), 0);
    assert_int_equal(edl_k8s_get(k, "/api/v1/pods", NULL), 0);
    edl_k8s_close(k);
    /* the system's CAs do not know it: refused, not retried */
    edl_k8s_config none = {.server = f->url};
    assert_int_equal(edl_k8s_open(&none, &k), 0);
    assert_int_equal(edl_k8s_get(k, "/api/v1/pods", &r), EDL_EAUTH);
    assert_true(strlen(r.message) > 0);
    edl_k8s_reply_clear(&r);
    edl_k8s_stats st;
    edl_k8s_get_stats(k, &st);
    assert_int_equal(st.retries, 0);
    edl_k8s_close(k);
    /* unless told not to check */
    none.insecure_skip_tls_verify = true;
    assert_int_equal(edl_k8s_open(&none, &k), 0);
    assert_int_equal(edl_k8s_get(k, "/api/v1/pods", NULL), 0);
    edl_k8s_close(k);
    fake_close(f);
    free(cert), free(key), free(ca), free(ccert), free(ckey);
    harness_rmtree(dir);
    free(dir);
}

/* ---- informer ---------------------------------------------------------------------------- */

typedef struct lw {
    char *list_body;     /* what a list gets (owned; under the fake's lock) */
    int list_status;
    int watch_410;       /* answer this many watches with HTTP 410 */
    int pages;           /* > 0: serve `pages` pages of 500 generated pods, with continue */
} lw;

static char *pod_json(const char *ns, const char *name, const char *rv)
{
    return xprintf("{\"kind\":\"Pod\",\"metadata\":{\"namespace\":\"%s\",\"name\":\"%s\",\"resourceVersion\":\"%s\"}}",
                   ns, name, rv);
}

/* A PodList of rv with items "name:rv" in namespace ns. */
static char *list_json(const char *rv, const char *const *items)
{
    char *s = xprintf("{\"kind\":\"PodList\",\"metadata\":{\"resourceVersion\":\"%s\"},\"items\":[", rv);
    for (size_t i = 0; items && items[i]; i++) {
        char name[64];
        const char *colon = strchr(items[i], ':');
        snprintf(name, sizeof name, "%.*s", (int)(colon - items[i]), items[i]);
        char *pod = pod_json("ns", name, colon + 1), *next = xprintf("%s%s%s", s, i ? "," : "", pod);
        free(pod);
        free(s);
        s = next;
    }
    char *done = xprintf("%s]}", s);
    free(s);
    return done;
}

static void set_list(fake *f, char *body)
{
    lw *s = f->state;
    pthread_mutex_lock(&f->mu);
    free(s->list_body);
    s->list_body = body;
    pthread_mutex_unlock(&f->mu);
}

/* Page p (from "continue=p<N>") of s->pages pages of 500 pods each. */
static char *page_json(const lw *s, const char *uri)
{
    const char *c = strstr(uri, "continue=p");
    int p = c ? atoi(c + 10) : 0;
    size_t cap = 600 * 120, o = 0;
    char *b = malloc(cap);
    assert_non_null(b);
    o += (size_t)snprintf(b, cap, "{\"kind\":\"PodList\",\"metadata\":{\"resourceVersion\":\"777\"%s", p + 1 < s->pages ? ",\"continue\":\"p" : "");
    if (p + 1 < s->pages)
        o += (size_t)snprintf(b + o, cap - o, "%d\"", p + 1);
    o += (size_t)snprintf(b + o, cap - o, "},\"items\":[");
    for (int i = 0; i < 500; i++)
        o += (size_t)snprintf(b + o, cap - o, "%s{\"metadata\":{\"namespace\":\"ns\",\"name\":\"pod-%d\",\"resourceVersion\":\"%d\"}}",
                              i ? "," : "", p * 500 + i, p * 500 + i + 1);
    snprintf(b + o, cap - o, "]}");
    return b;
}

static void list_watch(fake *f, const fake_req *r, fake_reply *out)
{
    lw *s = f->state;
    pthread_mutex_lock(&f->mu);
    if (strstr(r->uri, "watch=1")) {
        if (s->watch_410 > 0) {
            s->watch_410--;
            out->status = 410;
            out->body = xstrdup("{\"kind\":\"Status\",\"status\":\"Failure\",\"reason\":\"Expired\",\"code\":410}");
        } else {
            out->stream = true;
        }
    } else if (s->pages) {
        out->body = page_json(s, r->uri);
    } else {
        out->status = s->list_status ? s->list_status : 200;
        out->body = xstrdup(s->list_body ? s->list_body : "{}");
    }
    pthread_mutex_unlock(&f->mu);
}

static void expect_event(edl_k8s_informer *inf, edl_k8s_event_type type, const char *name)
{
    edl_k8s_event ev;
    int rc = edl_k8s_informer_next(inf, &ev, 5000);
    if (rc != 0)
        fail_msg("waiting for event %d %s: %s", type, name ? name : "", edl_strerror(rc));
    if (ev.type != type || (name && (!ev.name || strcmp(ev.name, name))) || (!name && ev.name))
        fail_msg("event %d %s, expected %d %s", ev.type, ev.name ? ev.name : "(none)", type, name ? name : "(none)");
    if (name) {
        assert_string_equal(ev.ns, "ns");
        assert_string_equal(edl_k8s_str(ev.object, "metadata.name"), name);
    }
}

static void expect_quiet(edl_k8s_informer *inf, int ms)
{
    edl_k8s_event ev;
    int rc = edl_k8s_informer_next(inf, &ev, ms);
    if (rc != EDL_ETIMEDOUT)
        fail_msg("unexpected event %d %s (rc %d)", ev.type, ev.name ? ev.name : "", rc);
}

static const char *cached_rv(edl_k8s_informer *inf, const char *name)
{
    return edl_k8s_str(edl_k8s_informer_get(inf, "ns", name), "metadata.resourceVersion");
}

static bool fd_readable(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, 0) == 1;
}

/* An informer on ns's pods (no selector) past its first list: pods a and b, then SYNCED. */
static edl_k8s_informer *open_synced_on_a_and_b(edl_k8s *k)
{
    edl_k8s_informer *inf;
    assert_int_equal(edl_k8s_informer_open(k, "/api/v1/namespaces/ns/pods", NULL, &inf), 0);
    expect_event(inf, EDL_K8S_ADDED, "a");
    expect_event(inf, EDL_K8S_ADDED, "b");
    expect_event(inf, EDL_K8S_SYNCED, NULL);
    return inf;
}

static void test_informer_list_watch_in_order_bookmark_moves_rv(void **state)
{
    (void)state;
    lw s = {0};
    fake *f = fake_open(list_watch, &s);
    set_list(f, list_json("10", (const char *[]){"a:5", "b:6", NULL}));
    edl_k8s *k = client_for(f);
    edl_k8s_informer *inf;
    assert_int_equal(edl_k8s_informer_open(k, "/api/v1/namespaces/ns/pods", "edl.dev/job=x", &inf), 0);
    assert_false(edl_k8s_informer_synced(inf));
    expect_event(inf, EDL_K8S_ADDED, "a");
    expect_event(inf, EDL_K8S_ADDED, "b");
    expect_event(inf, EDL_K8S_SYNCED, NULL);
    assert_true(edl_k8s_informer_synced(inf));
    char line[2100];
    fake_log(f, 0, line, sizeof line);
    assert_string_equal(line, "GET /api/v1/namespaces/ns/pods?limit=500&labelSelector=edl.dev%2Fjob%3Dx");
    int w = fake_wait_request(f, 1, "watch=1", 3000);
    assert_true(w > 0);
    fake_log(f, w, line, sizeof line);
    assert_non_null(strstr(line, "GET /api/v1/namespaces/ns/pods?watch=1&resourceVersion=10&allowWatchBookmarks=true&timeoutSeconds="));
    assert_non_null(strstr(line, "&labelSelector=edl.dev%2Fjob%3Dx"));
    fake_push(f, "{\"type\":\"ADDED\",\"object\":%s}", "{\"metadata\":{\"namespace\":\"ns\",\"name\":\"c\",\"resourceVersion\":\"11\"}}");
    fake_push(f, "{\"type\":\"MODIFIED\",\"object\":%s}", "{\"metadata\":{\"namespace\":\"ns\",\"name\":\"a\",\"resourceVersion\":\"12\"}}");
    fake_push(f, "{\"type\":\"DELETED\",\"object\":%s}", "{\"metadata\":{\"namespace\":\"ns\",\"name\":\"b\",\"resourceVersion\":\"13\"}}");
    fake_push(f, "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"Pod\",\"metadata\":{\"resourceVersion\":\"20\"}}}");
    int64_t t0 = harness_now_ms();
    while (!fd_readable(edl_k8s_informer_fd(inf)) && harness_now_ms() - t0 < 3000)
        harness_sleep_ms(5);
    assert_true(fd_readable(edl_k8s_informer_fd(inf)));
    expect_event(inf, EDL_K8S_ADDED, "c");
    expect_event(inf, EDL_K8S_MODIFIED, "a");
    assert_string_equal(cached_rv(inf, "a"), "12");
    expect_event(inf, EDL_K8S_DELETED, "b");
    assert_null(edl_k8s_informer_get(inf, "ns", "b"));
    const cJSON *objs[4];
    assert_int_equal(edl_k8s_informer_list(inf, objs, 4), 2);
    expect_quiet(inf, 100);
    assert_false(fd_readable(edl_k8s_informer_fd(inf)));
    /* the server ends the stream (its timeout): the next watch starts at the bookmark */
    fake_end_stream(f, true);
    w = fake_wait_request(f, w + 1, "watch=1", 3000);
    assert_true(w > 0);
    fake_log(f, w, line, sizeof line);
    assert_non_null(strstr(line, "resourceVersion=20&"));
    edl_k8s_stats st;
    edl_k8s_get_stats(k, &st);
    assert_int_equal(st.watches, 2);
    assert_int_equal(st.relists, 0);
    edl_k8s_informer_close(inf);
    edl_k8s_close(k);
    fake_close(f);
    free(s.list_body);
}

static void test_informer_410_in_stream_and_as_reply_relists(void **state)
{
    (void)state;
    lw s = {0};
    fake *f = fake_open(list_watch, &s);
    set_list(f, list_json("10", (const char *[]){"a:5", "b:6", NULL}));
    edl_k8s *k = client_for(f);
    edl_k8s_informer *inf = open_synced_on_a_and_b(k);
    int w = fake_wait_request(f, 1, "watch=1", 3000);
    assert_true(w > 0);
    /* in the stream: b vanished and c came while we were away; a is unchanged */
    set_list(f, list_json("30", (const char *[]){"a:5", "c:25", NULL}));
    fake_push(f, "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"status\":\"Failure\","
                 "\"message\":\"too old resource version: 10 (25)\",\"reason\":\"Expired\",\"code\":410}}");
    expect_event(inf, EDL_K8S_ADDED, "c");
    expect_event(inf, EDL_K8S_DELETED, "b");
    expect_event(inf, EDL_K8S_SYNCED, NULL);
    assert_string_equal(cached_rv(inf, "a"), "5");
    w = fake_wait_request(f, w + 1, "watch=1&resourceVersion=30&", 3000);
    assert_true(w > 0);
    /* as a reply: the stream ends, the re-watch is answered 410 */
    pthread_mutex_lock(&f->mu);
    s.watch_410 = 1;
    pthread_mutex_unlock(&f->mu);
    set_list(f, list_json("40", (const char *[]){"c:26", "d:39", NULL}));
    fake_end_stream(f, true);
    expect_event(inf, EDL_K8S_MODIFIED, "c");
    expect_event(inf, EDL_K8S_ADDED, "d");
    expect_event(inf, EDL_K8S_DELETED, "a");
    expect_event(inf, EDL_K8S_SYNCED, NULL);
    assert_true(fake_wait_request(f, w + 1, "watch=1&resourceVersion=40&", 3000) > 0);
    edl_k8s_stats st;
    edl_k8s_get_stats(k, &st);
    assert_int_equal(st.relists, 2);
    edl_k8s_informer_close(inf);
    edl_k8s_close(k);
    fake_close(f);
    free(s.list_body);
}

static bool log_has(FILE *log, const char *what)
{
    fflush(log);
    long n = ftell(log);
    char *buf = calloc(1, (size_t)n + 1);
    assert_non_null(buf);
    rewind(log);
    size_t got = fread(buf, 1, (size_t)n, log);
    fseek(log, 0, SEEK_END);
    bool has = got == (size_t)n && strstr(buf, what);
    free(buf);
    return has;
}

/* A bad line: logged, the stream dropped, a relist (nothing changed: just SYNCED), and the
 * informer works on (an event after it arrives). */
static int stream_seq(fake *f)
{
    pthread_mutex_lock(&f->mu);
    int n = f->stream_seq;
    pthread_mutex_unlock(&f->mu);
    return n;
}

/* Until a stream newer than `seq` is open (lines pushed before would go to the old one). */
static void wait_new_stream(fake *f, int seq)
{
    int64_t t0 = harness_now_ms();
    while (stream_seq(f) <= seq && harness_now_ms() - t0 < 5000)
        harness_sleep_ms(5);
    assert_true(stream_seq(f) > seq);
}

static void bad_then_recover(fake *f, edl_k8s_informer *inf, const char *line, const char *rv)
{
    int seq = stream_seq(f);
    fake_push(f, "%s", line);
    expect_event(inf, EDL_K8S_SYNCED, NULL);
    wait_new_stream(f, seq);
    assert_string_equal(cached_rv(inf, "a"), "5");
    assert_non_null(edl_k8s_informer_get(inf, "ns", "b"));
    char *pod = pod_json("ns", "z", rv);
    fake_push(f, "{\"type\":\"MODIFIED\",\"object\":%s}", pod);
    free(pod);
    expect_event(inf, EDL_K8S_MODIFIED, "z");
}

static void test_informer_bad_input_keeps_cache(void **state)
{
    (void)state;
    FILE *log = tmpfile(); /* what the informer says about bad input */
    assert_non_null(log);
    edl_log_setup(EDL_LOG_WARN, EDL_LOG_PLAIN, log);
    lw s = {0};
    fake *f = fake_open(list_watch, &s);
    set_list(f, list_json("10", (const char *[]){"a:5", "b:6", "z:1", NULL}));
    edl_k8s *k = client_for(f);
    edl_k8s_informer *inf;
    assert_int_equal(edl_k8s_informer_open(k, "/api/v1/namespaces/ns/pods", NULL, &inf), 0);
    expect_event(inf, EDL_K8S_ADDED, "a");
    expect_event(inf, EDL_K8S_ADDED, "b");
    expect_event(inf, EDL_K8S_ADDED, "z");
    expect_event(inf, EDL_K8S_SYNCED, NULL);
    wait_new_stream(f, 0); /* the first watch is open */
    bad_then_recover(f, inf, "this is not JSON", "2");
    assert_true(log_has(log, "not a JSON object (line: this is not JSON)"));
    set_list(f, list_json("10", (const char *[]){"a:5", "b:6", "z:2", NULL}));
    bad_then_recover(f, inf, "{\"type\":\"ADDED\"}", "3");
    assert_true(log_has(log, "an event without an object"));
    set_list(f, list_json("10", (const char *[]){"a:5", "b:6", "z:3", NULL}));
    bad_then_recover(f, inf, "{\"type\":\"ADDED\",\"object\":{\"metadata\":{}}}", "4");
    assert_true(log_has(log, "an object without metadata.name"));
    /* a list that is not a list: refused, retried until it is one */
    set_list(f, xstrdup("{\"kind\":\"PodList\",\"metadata\":{\"resourceVersion\":\"11\"},\"items\":{\"a\":1}}"));
    fake_push(f, "[]");
    int64_t t0 = harness_now_ms();
    while (!log_has(log, "\"items\" is not a list") && harness_now_ms() - t0 < 3000)
        harness_sleep_ms(10);
    assert_true(log_has(log, "\"items\" is not a list"));
    assert_string_equal(cached_rv(inf, "a"), "5");
    set_list(f, list_json("10", (const char *[]){"a:5", "b:6", "z:4", NULL}));
    expect_event(inf, EDL_K8S_SYNCED, NULL);
    /* a line over 16 MiB */
    size_t n = (16u << 20) + 100;
    char *pad = malloc(n + 1);
    assert_non_null(pad);
    memset(pad, 'x', n);
    pad[n] = '\0';
    char *huge = xprintf("{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"namespace\":\"ns\",\"name\":\"huge\"},\"pad\":\"%s\"}}", pad);
    free(pad);
    bad_then_recover(f, inf, huge, "5");
    free(huge);
    assert_true(log_has(log, "a line over 16 MiB"));
    assert_null(edl_k8s_informer_get(inf, "ns", "huge"));
    const cJSON *objs[8];
    assert_int_equal(edl_k8s_informer_list(inf, objs, 8), 3);
    edl_k8s_informer_close(inf);
    edl_k8s_close(k);
    fake_close(f);
    free(s.list_body);
    edl_log_setup(EDL_LOG_ERROR, EDL_LOG_PLAIN, NULL);
    fclose(log);
}

static void test_informer_store_writes_through(void **state)
{
    (void)state;
    lw s = {0};
    fake *f = fake_open(list_watch, &s);
    set_list(f, list_json("10", (const char *[]){"a:5", NULL}));
    edl_k8s *k = client_for(f);
    edl_k8s_informer *inf;
    assert_int_equal(edl_k8s_informer_open(k, "/api/v1/namespaces/ns/pods", NULL, &inf), 0);
    expect_event(inf, EDL_K8S_ADDED, "a");
    expect_event(inf, EDL_K8S_SYNCED, NULL);
    cJSON *c = cJSON_Parse("{\"metadata\":{\"namespace\":\"ns\",\"name\":\"c\",\"resourceVersion\":\"50\"}}");
    assert_int_equal(edl_k8s_informer_store(inf, c, false), 0);
    cJSON_Delete(c); /* the cache keeps its own copy */
    assert_string_equal(cached_rv(inf, "c"), "50");
    cJSON *a = cJSON_Parse("{\"metadata\":{\"namespace\":\"ns\",\"name\":\"a\"}}");
    assert_int_equal(edl_k8s_informer_store(inf, a, true), 0);
    cJSON_Delete(a);
    assert_null(edl_k8s_informer_get(inf, "ns", "a"));
    cJSON *noname = cJSON_Parse("{\"metadata\":{}}");
    assert_int_equal(edl_k8s_informer_store(inf, noname, false), EDL_EINVAL);
    cJSON_Delete(noname);
    assert_true(fake_wait_request(f, 1, "watch=1", 3000) > 0);
    /* the write's own event, then a later one */
    fake_push(f, "{\"type\":\"ADDED\",\"object\":%s}", "{\"metadata\":{\"namespace\":\"ns\",\"name\":\"c\",\"resourceVersion\":\"50\"}}");
    fake_push(f, "{\"type\":\"MODIFIED\",\"object\":%s}", "{\"metadata\":{\"namespace\":\"ns\",\"name\":\"c\",\"resourceVersion\":\"51\"}}");
    expect_event(inf, EDL_K8S_ADDED, "c");
    expect_event(inf, EDL_K8S_MODIFIED, "c");
    assert_string_equal(cached_rv(inf, "c"), "51");
    edl_k8s_informer_close(inf);
    edl_k8s_close(k);
    fake_close(f);
    free(s.list_body);
}

static void push_pod(fake *f, const char *type, const char *name, const char *uid, int rv,
                     const char *phase)
{
    fake_push(f, "{\"type\":\"%s\",\"object\":{\"metadata\":{\"namespace\":\"ns\","
              "\"name\":\"%s\",\"uid\":\"%s\",\"resourceVersion\":\"%d\"},"
              "\"status\":{\"phase\":\"%s\"}}}", type, name, uid, rv, phase);
}

static void store_pod(edl_k8s_informer *inf, const char *name, const char *uid, int rv,
                      const char *phase)
{
    char doc[512];
    snprintf(doc, sizeof doc, "{\"metadata\":{\"namespace\":\"ns\",\"name\":\"%s\","
             "\"uid\":\"%s\",\"resourceVersion\":\"%d\",\"deletionTimestamp\":"
             "\"2026-11-28T00:00:00Z\"},\"status\":{\"phase\":\"%s\"}}", name, uid, rv, phase);
    cJSON *o = cJSON_Parse(doc);
    assert_int_equal(edl_k8s_informer_store(inf, o, false), 0);
    cJSON_Delete(o);
}

static const char *cached_phase(edl_k8s_informer *inf, const char *name)
{
    return edl_k8s_str(edl_k8s_informer_get(inf, "ns", name), "status.phase");
}

/* The stream's events from before a write the caller stored through never undo it in the
 * cache (the operator once counted a failed pod twice: the kubelet's "Failed" came after the
 * operator's delete was stored). A stored object waits for the event of its own version; a
 * deleted one drops its uid's events until its DELETED; another object of the same name, a
 * write that changed nothing and a relist are trusted at once. */
static void test_informer_events_behind_a_write_through_do_not_undo_it(void **state)
{
    (void)state;
    lw s = {0};
    fake *f = fake_open(list_watch, &s);
    set_list(f, xstrdup("{\"metadata\":{\"resourceVersion\":\"10\"},\"items\":["
                        "{\"metadata\":{\"namespace\":\"ns\",\"name\":\"a\",\"uid\":\"ua\","
                        "\"resourceVersion\":\"5\"},\"status\":{\"phase\":\"Running\"}},"
                        "{\"metadata\":{\"namespace\":\"ns\",\"name\":\"b\",\"uid\":\"ub\","
                        "\"resourceVersion\":\"6\"},\"status\":{\"phase\":\"Running\"}}]}"));
    edl_k8s *k = client_for(f);
    edl_k8s_informer *inf = open_synced_on_a_and_b(k);
    assert_true(fake_wait_request(f, 1, "watch=1", 3000) > 0);
    /* a: the kubelet says Failed (11); the operator's graceful delete (12) is stored first */
    store_pod(inf, "a", "ua", 12, "Failed");
    push_pod(f, "MODIFIED", "a", "ua", 11, "Failed");
    /* b: Failed (13), deleted at once; the caller stored the delete (of the cached object
     * itself) before either came */
    assert_int_equal(edl_k8s_informer_store(inf, edl_k8s_informer_get(inf, "ns", "b"), true), 0);
    push_pod(f, "MODIFIED", "b", "ub", 13, "Failed");
    push_pod(f, "MODIFIED", "a", "ua", 12, "Failed"); /* the write's own event */
    push_pod(f, "DELETED", "b", "ub", 14, "Failed");
    expect_event(inf, EDL_K8S_MODIFIED, "a"); /* 11 said nothing */
    assert_string_equal(cached_rv(inf, "a"), "12");
    expect_event(inf, EDL_K8S_DELETED, "b"); /* b's 13 never came back */
    assert_null(edl_k8s_informer_get(inf, "ns", "b"));
    /* after the write's event the stream is trusted again; a new b (another uid) at once */
    push_pod(f, "MODIFIED", "a", "ua", 15, "Succeeded");
    push_pod(f, "ADDED", "b", "ub2", 16, "Pending");
    expect_event(inf, EDL_K8S_MODIFIED, "a");
    assert_string_equal(cached_phase(inf, "a"), "Succeeded");
    expect_event(inf, EDL_K8S_ADDED, "b");
    assert_string_equal(cached_phase(inf, "b"), "Pending");
    /* a write that changed nothing (the same version back) waits for no event */
    store_pod(inf, "b", "ub2", 16, "Pending");
    push_pod(f, "MODIFIED", "b", "ub2", 17, "Running");
    expect_event(inf, EDL_K8S_MODIFIED, "b");
    assert_string_equal(cached_phase(inf, "b"), "Running");
    /* a relist is the server's word: a write still ahead of the stream gives way to it */
    store_pod(inf, "b", "ub2", 30, "Failed");
    push_pod(f, "MODIFIED", "b", "ub2", 18, "Running");
    expect_quiet(inf, 200);
    assert_string_equal(cached_phase(inf, "b"), "Failed");
    set_list(f, xstrdup("{\"metadata\":{\"resourceVersion\":\"40\"},\"items\":["
                        "{\"metadata\":{\"namespace\":\"ns\",\"name\":\"b\",\"uid\":\"ub2\","
                        "\"resourceVersion\":\"31\"},\"status\":{\"phase\":\"Succeeded\"}}]}"));
    fake_push(f, "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"code\":410}}");
    expect_event(inf, EDL_K8S_MODIFIED, "b");
    assert_string_equal(cached_phase(inf, "b"), "Succeeded");
    expect_event(inf, EDL_K8S_DELETED, "a");
    expect_event(inf, EDL_K8S_SYNCED, NULL);
    edl_k8s_informer_close(inf);
    edl_k8s_close(k);
    fake_close(f);
    free(s.list_body);
}

/* A trimmed informer keeps only the paths asked, and makes no empty object for one that is
 * absent; a path through an array keeps that part of each element, in order (what the
 * operator keeps of a pod's containers and their states). */
static void test_informer_trims_through_arrays(void **state)
{
    (void)state;
    lw s = {0};
    fake *f = fake_open(list_watch, &s);
    set_list(f, list_json("10", (const char *[]){NULL}));
    edl_k8s *k = client_for(f);
    static const char *const keep[] = {"metadata.name", "metadata.namespace",
                                       "metadata.annotations.a", "status.reason",
                                       "spec.containers.name", "status.containerStatuses.name",
                                       "status.containerStatuses.state.terminated.exitCode",
                                       NULL};
    edl_k8s_informer *inf;
    assert_int_equal(edl_k8s_informer_open_trimmed(k, "/api/v1/namespaces/ns/pods", NULL, keep,
                                                   &inf), 0);
    expect_event(inf, EDL_K8S_SYNCED, NULL);
    cJSON *pod = cJSON_Parse(
        "{\"metadata\":{\"namespace\":\"ns\",\"name\":\"p\",\"uid\":\"u\"},"
        "\"spec\":{\"containers\":[{\"name\":\"t\",\"image\":\"x\",\"env\":[]},"
        "{\"name\":\"side\",\"image\":\"y\"}]},"
        "\"status\":{\"phase\":\"Running\",\"containerStatuses\":["
        "{\"name\":\"side\",\"state\":{\"running\":{\"startedAt\":\"x\"}},\"image\":\"y\"},"
        "{\"name\":\"t\",\"state\":{\"terminated\":{\"exitCode\":137,\"reason\":\"Error\"}},"
        "\"restartCount\":0}]}}");
    assert_int_equal(edl_k8s_informer_store(inf, pod, false), 0);
    cJSON_Delete(pod);
    char *got = cJSON_PrintUnformatted(edl_k8s_informer_get(inf, "ns", "p"));
    assert_string_equal(got, "{\"metadata\":{\"name\":\"p\",\"namespace\":\"ns\"},"
                             "\"spec\":{\"containers\":[{\"name\":\"t\"},{\"name\":\"side\"}]},"
                             "\"status\":{\"containerStatuses\":[{\"name\":\"side\"},"
                             "{\"name\":\"t\",\"state\":{\"terminated\":{\"exitCode\":137}}}]}}");
    free(got);
    edl_k8s_informer_close(inf);
    edl_k8s_close(k);
    fake_close(f);
    free(s.list_body);
}

static void test_informer_close_is_prompt(void **state)
{
    (void)state;
    lw s = {0};
    fake *f = fake_open(list_watch, &s);
    set_list(f, list_json("10", (const char *[]){"a:5", NULL}));
    edl_k8s *k = client_for(f);
    edl_k8s_informer *inf;
    /* in a quiet watch */
    assert_int_equal(edl_k8s_informer_open(k, "/api/v1/namespaces/ns/pods", NULL, &inf), 0);
    assert_true(fake_wait_request(f, 1, "watch=1", 3000) > 0); /* the client waits in it */
    int64_t t0 = harness_now_ms();
    edl_k8s_informer_close(inf);
    assert_true(harness_now_ms() - t0 < 1000);
    /* backing off after failed lists */
    pthread_mutex_lock(&f->mu);
    s.list_status = 500;
    pthread_mutex_unlock(&f->mu);
    pthread_mutex_lock(&f->mu);
    int before = f->requests;
    pthread_mutex_unlock(&f->mu);
    assert_int_equal(edl_k8s_informer_open(k, "/api/v1/namespaces/ns/pods", NULL, &inf), 0);
    /* a second list failed: the informer backs off before the third */
    int first = fake_wait_request(f, before, "GET", 5000);
    assert_true(first >= 0);
    assert_true(fake_wait_request(f, first + 1, "GET", 5000) > first);
    t0 = harness_now_ms();
    edl_k8s_informer_close(inf);
    assert_true(harness_now_ms() - t0 < 1000);
    edl_k8s_close(k);
    fake_close(f);
    free(s.list_body);
}

static void test_informer_10000_objects_in_pages(void **state)
{
    (void)state;
    lw s = {.pages = 20};
    fake *f = fake_open(list_watch, &s);
    edl_k8s *k = client_for(f);
    edl_k8s_informer *inf;
    int64_t t0 = harness_now_ms();
    assert_int_equal(edl_k8s_informer_open(k, "/api/v1/namespaces/ns/pods", NULL, &inf), 0);
    edl_k8s_event ev;
    int added = 0;
    while (edl_k8s_informer_next(inf, &ev, 5000) == 0 && ev.type == EDL_K8S_ADDED)
        added++;
    assert_int_equal(ev.type, EDL_K8S_SYNCED);
    assert_int_equal(added, 10000);
    int64_t took = harness_now_ms() - t0;
    assert_true(took < 8000);
    assert_string_equal(cached_rv(inf, "pod-7777"), "7778");
    assert_int_equal(edl_k8s_informer_list(inf, NULL, 0), 10000);
    char line[2100];
    fake_log(f, 19, line, sizeof line);
    assert_string_equal(line, "GET /api/v1/namespaces/ns/pods?limit=500&continue=p19");
    assert_true(fake_wait_request(f, 20, "watch=1&resourceVersion=777&", 3000) == 20);
    /* a relist of the same 10,000 says only SYNCED */
    pthread_mutex_lock(&f->mu);
    s.watch_410 = 1;
    pthread_mutex_unlock(&f->mu);
    fake_end_stream(f, true);
    expect_event(inf, EDL_K8S_SYNCED, NULL);
    edl_k8s_informer_close(inf);
    edl_k8s_close(k);
    fake_close(f);
}

/* ---- leader election ---------------------------------------------------------------------- */

#define LEASES "/apis/coordination.k8s.io/v1/namespaces/ns/leases"

typedef struct lease_srv {
    cJSON *lease;      /* the stored Lease, or NULL */
    int rv;
    int put_409;       /* answer this many PUTs 409 whatever they carry */
    int post_409;
    bool fail;         /* 500 to everything */
    int writes;
} lease_srv;

static char *status_body(int code, const char *reason)
{
    return xprintf("{\"kind\":\"Status\",\"status\":\"Failure\",\"reason\":\"%s\",\"code\":%d}", reason, code);
}

static void store_lease(lease_srv *s, cJSON *l)
{
    cJSON *md = cJSON_GetObjectItemCaseSensitive(l, "metadata");
    char rv[16];
    snprintf(rv, sizeof rv, "%d", ++s->rv);
    cJSON_DeleteItemFromObjectCaseSensitive(md, "resourceVersion");
    cJSON_AddStringToObject(md, "resourceVersion", rv);
    cJSON_Delete(s->lease);
    s->lease = l;
    s->writes++;
}

static void lease_write(lease_srv *s, const fake_req *r, fake_reply *out)
{
    cJSON *l = cJSON_ParseWithLength(r->body ? r->body : "", r->body_len);
    assert_non_null(l);
    bool post = strcmp(r->method, "POST") == 0;
    const char *rv = edl_k8s_str(l, "metadata.resourceVersion");
    if (post && (s->lease || s->post_409 > 0)) {
        s->post_409 -= s->post_409 > 0;
        out->status = 409, out->body = status_body(409, "AlreadyExists");
    } else if (!post && s->put_409 > 0) {
        s->put_409--;
        out->status = 409, out->body = status_body(409, "Conflict");
    } else if (!post && !s->lease) {
        out->status = 404, out->body = status_body(404, "NotFound");
    } else if (!post && (!rv || strcmp(rv, edl_k8s_str(s->lease, "metadata.resourceVersion")))) {
        out->status = 409, out->body = status_body(409, "Conflict");
    } else {
        store_lease(s, l);
        out->status = post ? 201 : 200;
        out->body = cJSON_PrintUnformatted(s->lease);
        return;
    }
    cJSON_Delete(l);
}

static void lease_handler(fake *f, const fake_req *r, fake_reply *out)
{
    lease_srv *s = f->state;
    pthread_mutex_lock(&f->mu);
    if (s->fail) {
        out->status = 500, out->body = status_body(500, "InternalError");
    } else if (!strcmp(r->method, "GET") && !strcmp(r->uri, LEASES "/lead")) {
        if (s->lease)
            out->body = cJSON_PrintUnformatted(s->lease);
        else
            out->status = 404, out->body = status_body(404, "NotFound");
    } else if ((!strcmp(r->method, "POST") && !strcmp(r->uri, LEASES)) ||
               (!strcmp(r->method, "PUT") && !strcmp(r->uri, LEASES "/lead"))) {
        lease_write(s, r, out);
    } else {
        out->status = 400, out->body = status_body(400, "BadRequest");
    }
    pthread_mutex_unlock(&f->mu);
}

/* A field of the stored lease's spec, copied. */
static void lease_field(fake *f, const char *field, char *out, size_t len)
{
    lease_srv *s = f->state;
    pthread_mutex_lock(&f->mu);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(s->lease, "spec"), field);
    if (cJSON_IsString(v))
        snprintf(out, len, "%s", v->valuestring);
    else if (cJSON_IsNumber(v))
        snprintf(out, len, "%g", v->valuedouble);
    else
        snprintf(out, len, "(none)");
    pthread_mutex_unlock(&f->mu);
}

/* Make the stored lease's renewTime `ago_s` seconds old. */
static void age_lease(fake *f, int ago_s)
{
    lease_srv *s = f->state;
    char t[40];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    edl_k8s_time(((int64_t)ts.tv_sec - ago_s) * 1000, true, t, sizeof t);
    pthread_mutex_lock(&f->mu);
    cJSON *spec = cJSON_GetObjectItemCaseSensitive(s->lease, "spec");
    cJSON_ReplaceItemInObjectCaseSensitive(spec, "renewTime", cJSON_CreateString(t));
    pthread_mutex_unlock(&f->mu);
}

static bool tick(edl_k8s_elector *e)
{
    bool leading = false;
    int64_t next = 0, now = edl_monotonic_ms();
    assert_int_equal(edl_k8s_elector_tick(e, &leading, &next), 0);
    assert_true(next >= now + 1000 && next <= now + 1100 + 1000);
    return leading;
}

static void test_elector_acquire_renew_standby_takeover_release(void **state)
{
    (void)state;
    lease_srv s = {0};
    fake *f = fake_open(lease_handler, &s);
    edl_k8s *k = client_for(f);
    edl_k8s_elector_opts oa = {"ns", "lead", "replica-a", 15, 10000, 1000}, ob = oa;
    ob.identity = "replica-b";
    edl_k8s_elector *a, *b;
    assert_int_equal(edl_k8s_elector_open(k, &oa, &a), 0);
    assert_int_equal(edl_k8s_elector_open(k, &ob, &b), 0);
    char v[64], renew1[64], renew2[64];
    /* absent: created, held by a */
    assert_true(tick(a));
    lease_field(f, "holderIdentity", v, sizeof v);
    assert_string_equal(v, "replica-a");
    lease_field(f, "leaseTransitions", v, sizeof v);
    assert_string_equal(v, "0");
    lease_field(f, "leaseDurationSeconds", v, sizeof v);
    assert_string_equal(v, "15");
    lease_field(f, "renewTime", renew1, sizeof renew1);
    int64_t ms;
    assert_int_equal(edl_k8s_time_parse(renew1, &ms), 0);
    assert_int_equal(strlen(renew1), strlen("2026-11-23T13:45:00.123456Z"));
    /* renewed: a write carrying the resourceVersion read */
    harness_sleep_ms(20);
    assert_true(tick(a));
    lease_field(f, "renewTime", renew2, sizeof renew2);
    assert_true(strcmp(renew2, renew1) > 0);
    assert_int_equal(s.writes, 2);
    /* b does not take a lease that has not expired, and does not write */
    assert_false(tick(b));
    assert_int_equal(s.writes, 2);
    /* expired: b takes it */
    age_lease(f, 20);
    assert_true(tick(b));
    lease_field(f, "holderIdentity", v, sizeof v);
    assert_string_equal(v, "replica-b");
    lease_field(f, "leaseTransitions", v, sizeof v);
    assert_string_equal(v, "1");
    /* a sees it and steps down at once */
    assert_false(tick(a));
    /* expired again, but another replica writes first: 409, not leading */
    age_lease(f, 20);
    pthread_mutex_lock(&f->mu);
    s.put_409 = 1;
    pthread_mutex_unlock(&f->mu);
    assert_false(tick(a));
    lease_field(f, "holderIdentity", v, sizeof v);
    assert_string_equal(v, "replica-b");
    /* b releases: no holder, 1 s; a takes it at the next tick */
    assert_true(tick(b));
    assert_int_equal(edl_k8s_elector_release(b), 0);
    lease_field(f, "holderIdentity", v, sizeof v);
    assert_string_equal(v, "");
    lease_field(f, "leaseDurationSeconds", v, sizeof v);
    assert_string_equal(v, "1");
    assert_true(tick(a));
    lease_field(f, "leaseTransitions", v, sizeof v);
    assert_string_equal(v, "2");
    /* a release by a non-holder changes nothing */
    int writes = s.writes;
    assert_int_equal(edl_k8s_elector_release(b), 0);
    assert_int_equal(s.writes, writes);
    edl_k8s_elector_close(a);
    edl_k8s_elector_close(b);
    edl_k8s_close(k);
    fake_close(f);
    cJSON_Delete(s.lease);
}

static void test_elector_create_race_and_renew_deadline(void **state)
{
    (void)state;
    lease_srv s = {.post_409 = 1};
    fake *f = fake_open(lease_handler, &s);
    edl_k8s *k = client_for(f);
    edl_k8s_elector_opts o = {"ns", "lead", "replica-a", 15, 2500, 1000};
    edl_k8s_elector *a;
    assert_int_equal(edl_k8s_elector_open(k, &o, &a), 0);
    assert_false(tick(a)); /* someone else created it first */
    assert_true(tick(a));
    int64_t renewed = edl_monotonic_ms();
    /* the API server fails: still leading within the renew deadline (each tick retries for
     * 0.75-1.5 s, jittered), then not, and not before */
    pthread_mutex_lock(&f->mu);
    s.fail = true;
    pthread_mutex_unlock(&f->mu);
    bool leading;
    int64_t next;
    assert_int_equal(edl_k8s_elector_tick(a, &leading, &next), EDL_ESERVER);
    assert_true(leading);
    for (int i = 0; i < 10 && leading; i++) {
        assert_int_equal(edl_k8s_elector_tick(a, &leading, &next), EDL_ESERVER);
        if (leading)
            assert_true(edl_monotonic_ms() - renewed < 2500 + 100);
    }
    assert_false(leading);
    assert_true(edl_monotonic_ms() - renewed >= 2500);
    /* back: it leads again (the lease is still its own) */
    pthread_mutex_lock(&f->mu);
    s.fail = false;
    pthread_mutex_unlock(&f->mu);
    assert_true(tick(a));
    edl_k8s_elector_close(a);
    edl_k8s_close(k);
    fake_close(f);
    cJSON_Delete(s.lease);
}

static bool wait_leading(edl_k8s_elector *e, bool want, int timeout_ms)
{
    int64_t end = harness_now_ms() + timeout_ms;
    while (edl_k8s_elector_leading(e) != want && harness_now_ms() < end)
        harness_sleep_ms(5);
    return edl_k8s_elector_leading(e) == want;
}

/* Started, the elector renews on a thread of its own while its caller is busy, and fences the
 * caller's client: when the server stops answering, the leader stops writing the moment its
 * renew deadline passes, its writes refused unsent. */
static void test_started_elector_renews_alone_and_fences_writes(void **state)
{
    (void)state;
    lease_srv s = {0};
    fake *f = fake_open(lease_handler, &s);
    edl_k8s_config cfg = {.server = f->url, .token = (char *)"t0k", .timeout_ms = 5000};
    edl_k8s *k = client_for(f);
    edl_k8s_elector_opts o = {"ns", "lead", "replica-a", 2, 1200, 100};
    edl_k8s_elector *e;
    assert_int_equal(edl_k8s_elector_start(&cfg, &o, &e), 0);
    edl_k8s_elector_fence(e, k);
    assert_true(wait_leading(e, true, 3000));
    assert_true(edl_k8s_elector_fd(e) >= 0);
    /* the caller busy, no tick from it: 8 renewals (every 100 ms), each on time */
    edl_k8s_elector_stats st;
    assert_true(HARNESS_WAIT_UNTIL((edl_k8s_elector_get_stats(e, &st), st.renewals >= 8), 5000));
    assert_int_equal(st.late_renewals, 0);
    assert_true(edl_k8s_elector_valid_ms(e) > 0 && edl_k8s_elector_valid_ms(e) <= 1200);
    cJSON *obj = cJSON_Parse("{\"metadata\":{\"name\":\"lead\"}}");
    edl_k8s_reply r;
    assert_int_not_equal(edl_k8s_create(k, LEASES, obj, &r), EDL_ELEASE); /* sent (409) */
    edl_k8s_reply_clear(&r);
    /* the server fails: not leading within the deadline, writes refused, reads still go */
    pthread_mutex_lock(&f->mu);
    s.fail = true;
    pthread_mutex_unlock(&f->mu);
    int64_t t0 = harness_now_ms();
    assert_true(wait_leading(e, false, 2000));
    assert_true(harness_now_ms() - t0 <= 1300);
    assert_int_equal(edl_k8s_elector_valid_ms(e), 0);
    assert_int_equal(edl_k8s_create(k, LEASES, obj, &r), EDL_ELEASE);
    assert_non_null(strstr(r.message, "no longer leads"));
    edl_k8s_reply_clear(&r);
    assert_int_equal(edl_k8s_get(k, LEASES "/lead", NULL), EDL_ESERVER);
    cJSON_Delete(obj);
    edl_k8s_elector_close(e);
    edl_k8s_close(k);
    fake_close(f);
    cJSON_Delete(s.lease);
}

int main(void)
{
    edl_log_setup(EDL_LOG_ERROR, EDL_LOG_PLAIN, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kubeconfig_data_fields_of_current_context),
        cmocka_unit_test(test_kubeconfig_files_relative_to_it_in_named_context),
        cmocka_unit_test(test_kubeconfig_errors_name_file_and_field),
        cmocka_unit_test(test_in_cluster_config_from_root_dir),
        cmocka_unit_test(test_config_load_order),
        cmocka_unit_test(test_object_helpers_and_paths),
        cmocka_unit_test(test_token_file_rotation_reread),
        cmocka_unit_test(test_retries_429_503_then_success_and_give_up),
        cmocka_unit_test(test_status_codes_and_reasons),
        cmocka_unit_test(test_reply_over_16mib_and_unreachable),
        cmocka_unit_test(test_tls_ca_data_file_insecure_and_client_cert_data),
        cmocka_unit_test(test_informer_list_watch_in_order_bookmark_moves_rv),
        cmocka_unit_test(test_informer_410_in_stream_and_as_reply_relists),
        cmocka_unit_test(test_informer_bad_input_keeps_cache),
        cmocka_unit_test(test_informer_store_writes_through),
        cmocka_unit_test(test_informer_events_behind_a_write_through_do_not_undo_it),
        cmocka_unit_test(test_informer_trims_through_arrays),
        cmocka_unit_test(test_informer_close_is_prompt),
        cmocka_unit_test(test_informer_10000_objects_in_pages),
        cmocka_unit_test(test_elector_acquire_renew_standby_takeover_release),
        cmocka_unit_test(test_elector_create_race_and_renew_deadline),
        cmocka_unit_test(test_started_elector_renews_alone_and_fences_writes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

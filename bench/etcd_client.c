/* etcd_client.c (bench): what the edl etcd client costs over the gateway itself.
 *
 * Starts a local etcd, then measures, on one reused connection each:
 *   put, range and txn operations per second through edl_etcd_*,
 *   the same requests from a minimal libcurl loop (pre-encoded JSON, no parsing): the floor;
 *   p50/p99 latency from a put to the watch event that reports it, through edl_watch_open and
 *   through a bare libcurl watch stream.
 * Each figure is printed beside its floor, with the ratio, from the same run.
 * Usage: etcd_client [--ops N] [--endpoints URL]   (default 2000 ops, own etcd) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>

#include "edl/etcd.h"
#include "edl/etcd_server.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

/* ---- the floor: a bare libcurl POST loop ---------------------------------------------------- */

static size_t sink(char *p, size_t s, size_t n, void *arg)
{
    (void)p, (void)arg;
    return s * n;
}

static double raw_ops(const char *endpoint, const char *path, const char *body, int n)
{
    char url[256];
    snprintf(url, sizeof url, "%s%s", endpoint, path);
    CURL *h = curl_easy_init();
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    double t0 = now_s();
    for (int i = 0; i < n; i++)
        if (curl_easy_perform(h) != CURLE_OK) {
            fprintf(stderr, "raw %s failed\n", path);
            exit(1);
        }
    double t = now_s() - t0;
    curl_slist_free_all(hd);
    curl_easy_cleanup(h);
    return n / t;
}

/* ---- the client ------------------------------------------------------------------------------ */

static void die(edl_etcd *c, const char *what, int rc)
{
    fprintf(stderr, "%s: %s: %s\n", what, edl_strerror(rc), edl_etcd_errmsg(c));
    exit(1);
}

static double edl_put_ops(edl_etcd *c, int n)
{
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        int rc = edl_etcd_put(c, edl_str("bench/put"), edl_str("value-0123456789"), NULL, NULL);
        if (rc)
            die(c, "put", rc);
    }
    return n / (now_s() - t0);
}

static double edl_range_ops(edl_etcd *c, int n)
{
    edl_range_opts o = {.prefix = true};
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        edl_range_result r;
        int rc = edl_etcd_range(c, edl_str("bench/r/"), &o, &r);
        if (rc)
            die(c, "range", rc);
        edl_range_result_clear(&r);
    }
    return n / (now_s() - t0);
}

static double edl_txn_ops(edl_etcd *c, int n)
{
    edl_txn *t = edl_txn_new();
    edl_txn_cmp_version(t, edl_str("bench/txn"), EDL_CMP_GREATER, -1);
    edl_txn_put(t, EDL_TXN_SUCCESS, edl_str("bench/txn"), edl_str("value-0123456789"), NULL);
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        edl_txn_result r;
        int rc = edl_etcd_txn(c, t, &r);
        if (rc)
            die(c, "txn", rc);
        edl_txn_result_clear(&r);
    }
    double ops = n / (now_s() - t0);
    edl_txn_free(t);
    return ops;
}

/* ---- put -> watch latency ------------------------------------------------------------------- */

static void edl_watch_latency(edl_etcd *c, int n, double *lat)
{
    edl_watch *w;
    int rc = edl_watch_open(c, edl_str("bench/w"), NULL, &w);
    if (rc)
        die(c, "watch", rc);
    for (int i = 0; i < n; i++) {
        double t0 = now_s();
        if ((rc = edl_etcd_put(c, edl_str("bench/w"), edl_str("x"), NULL, NULL)) != 0)
            die(c, "put", rc);
        edl_watch_event *ev;
        if ((rc = edl_watch_next(w, &ev, 5000)) != 0)
            die(c, "watch event", rc);
        lat[i] = (now_s() - t0) * 1e3;
        edl_watch_event_free(ev);
    }
    edl_watch_close(w);
}

/* A bare libcurl watch: a thread counts newline-terminated messages and stamps each. */
typedef struct raw_watch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int lines;
    volatile int stop;
} raw_watch;

static size_t raw_watch_data(char *p, size_t s, size_t n, void *arg)
{
    raw_watch *rw = arg;
    int nl = 0;
    for (size_t i = 0; i < s * n; i++)
        nl += p[i] == '\n';
    pthread_mutex_lock(&rw->mu);
    rw->lines += nl;
    pthread_cond_signal(&rw->cv);
    pthread_mutex_unlock(&rw->mu);
    return s * n;
}

static int raw_watch_progress(void *arg, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    (void)a, (void)b, (void)c, (void)d;
    return ((raw_watch *)arg)->stop;
}

static const char *g_endpoint;

static void *raw_watch_main(void *arg)
{
    raw_watch *rw = arg;
    char url[256];
    snprintf(url, sizeof url, "%s/v3/watch", g_endpoint);
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, "{\"create_request\":{\"key\":\"YmVuY2gvcnc=\"}}");
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, raw_watch_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, rw);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, raw_watch_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, rw);
    curl_easy_perform(h);
    curl_easy_cleanup(h);
    return NULL;
}

static void raw_watch_latency(int n, double *lat)
{
    raw_watch rw = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    pthread_t th;
    pthread_create(&th, NULL, raw_watch_main, &rw);
    pthread_mutex_lock(&rw.mu);
    while (rw.lines < 1) /* "created" */
        pthread_cond_wait(&rw.cv, &rw.mu);
    pthread_mutex_unlock(&rw.mu);
    char url[256];
    snprintf(url, sizeof url, "%s/v3/kv/put", g_endpoint);
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, "{\"key\":\"YmVuY2gvcnc=\",\"value\":\"eA==\"}");
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
    for (int i = 0; i < n; i++) {
        double t0 = now_s();
        curl_easy_perform(h);
        pthread_mutex_lock(&rw.mu);
        while (rw.lines < i + 2)
            pthread_cond_wait(&rw.cv, &rw.mu);
        pthread_mutex_unlock(&rw.mu);
        lat[i] = (now_s() - t0) * 1e3;
    }
    curl_easy_cleanup(h);
    rw.stop = 1;
    pthread_join(th, NULL);
}

static void line(const char *what, double edl, double floor, const char *unit)
{
    printf("%-28s edl %10.1f %-6s  raw-libcurl %10.1f %-6s  edl/raw %.2f\n", what, edl, unit, floor, unit,
           edl / floor);
}

int main(int argc, char **argv)
{
    int ops = 2000;
    const char *endpoints = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ops") && i + 1 < argc)
            ops = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--endpoints") && i + 1 < argc)
            endpoints = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--ops N] [--endpoints URL]\n"
                            "Measures the edl etcd client against a bare libcurl loop on the same etcd.\n"
                            "Without --endpoints it starts its own etcd on loopback.\n", argv[0]);
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (ops < 10)
        ops = 10;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    edl_etcd_server *srv = NULL;
    if (!endpoints) {
        edl_etcd_server_opts so = {.quiet = true};
        if (edl_etcd_server_open(&so, &srv) != 0) {
            fprintf(stderr, "cannot start etcd\n");
            return 1;
        }
        endpoints = edl_etcd_server_endpoint(srv, 0);
    }
    g_endpoint = endpoints;
    edl_etcd *c;
    if (edl_etcd_open_endpoints(endpoints, &c) != 0) {
        fprintf(stderr, "bad endpoint %s\n", endpoints);
        return 1;
    }
    for (int i = 0; i < 10; i++) {
        char k[32];
        snprintf(k, sizeof k, "bench/r/%d", i);
        edl_etcd_put(c, edl_str(k), edl_str("value-0123456789"), NULL, NULL);
    }
    printf("etcd client benchmark: %d sequential ops per figure, one connection, etcd at %s\n", ops, endpoints);
    /* warm both paths, then alternate so that drift hits both alike */
    edl_put_ops(c, ops / 10);
    raw_ops(endpoints, "/v3/kv/put", "{\"key\":\"YmVuY2gvcHV0\",\"value\":\"dmFsdWUtMDEyMzQ1Njc4OQ==\"}", ops / 10);
    double e = edl_put_ops(c, ops);
    double r = raw_ops(endpoints, "/v3/kv/put", "{\"key\":\"YmVuY2gvcHV0\",\"value\":\"dmFsdWUtMDEyMzQ1Njc4OQ==\"}", ops);
    line("put", e, r, "ops/s");
    e = edl_range_ops(c, ops);
    r = raw_ops(endpoints, "/v3/kv/range", "{\"key\":\"YmVuY2gvci8=\",\"range_end\":\"YmVuY2gvcjA=\"}", ops);
    line("range (prefix, 10 keys)", e, r, "ops/s");
    e = edl_txn_ops(c, ops);
    r = raw_ops(endpoints, "/v3/kv/txn",
                "{\"compare\":[{\"key\":\"YmVuY2gvdHhu\",\"target\":\"VERSION\",\"result\":\"GREATER\",\"version\":\"-1\"}],"
                "\"success\":[{\"request_put\":{\"key\":\"YmVuY2gvdHhu\",\"value\":\"dmFsdWUtMDEyMzQ1Njc4OQ==\"}}],\"failure\":[]}",
                ops);
    line("txn (1 compare, 1 put)", e, r, "ops/s");
    int n = ops / 4;
    double *le = malloc(sizeof(double) * (size_t)n), *lr = malloc(sizeof(double) * (size_t)n);
    edl_watch_latency(c, n, le);
    raw_watch_latency(n, lr);
    line("put->watch event p50", pct(le, n, 0.5), pct(lr, n, 0.5), "ms");
    line("put->watch event p99", pct(le, n, 0.99), pct(lr, n, 0.99), "ms");
    free(le);
    free(lr);
    edl_etcd_close(c);
    edl_etcd_server_close(srv);
    curl_global_cleanup();
    return 0;
}

/* test_k8s_standin.c: the stand-in Kubernetes API server and kubelet (tests/k8s_standin/)
 * that the operator's tests run against: driven by the real kubectl 1.31 where it is installed
 * (scripts/install-deps puts it in tests/.kube/bin) and by libcurl for exact replies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

typedef struct standin {
    pid_t pid;
    int port;
    char dir[256], kubeconfig[320], cache[320], url[64];
} standin;

/* ---- the server and its clients ------------------------------------------------------- */

static bool have_kubectl(void)
{
    return access(EDL_KUBECTL_BIN, X_OK) == 0;
}

/* Start k8s-standin with extra flags (NULL-terminated); fails the test if it does not come up. */
static void standin_start(standin *s, const char *const *extra)
{
    char ready[320], port[16], log[320], root[300];
    const char *argv[24] = {EDL_K8S_STANDIN_BIN, "--port", "0", "--ready-file", ready};
    int n = 5;
    snprintf(s->dir, sizeof s->dir, "/tmp/edl-k8s-standin-XXXXXX");
    assert_non_null(mkdtemp(s->dir));
    snprintf(ready, sizeof ready, "%s/port", s->dir);
    snprintf(log, sizeof log, "%s/standin.log", s->dir);
    snprintf(root, sizeof root, "%s/kubelet", s->dir);
    mkdir(root, 0755);
    argv[n++] = "--kubelet-root";
    argv[n++] = root;
    for (int i = 0; extra && extra[i] && n < 22; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    s->pid = harness_spawn(argv, log);
    assert_true(s->pid > 0);
    for (int i = 0; i < 500 && !s->port; i++) {
        harness_sleep_ms(10);
        s->port = atoi(harness_read_file(ready, port, sizeof port));
    }
    if (!s->port)
        fail_msg("k8s-standin did not come up (log: %s)", log);
    snprintf(s->url, sizeof s->url, "http://127.0.0.1:%d", s->port);
    snprintf(s->kubeconfig, sizeof s->kubeconfig, "%s/kubeconfig", s->dir);
    snprintf(s->cache, sizeof s->cache, "%s/kube-cache", s->dir);
    FILE *f = fopen(s->kubeconfig, "w");
    assert_non_null(f);
    fprintf(f, "apiVersion: v1\nkind: Config\nclusters:\n- name: s\n  cluster: {server: '%s'}\n"
               "contexts:\n- name: s\n  context: {cluster: s, user: u, namespace: default}\n"
               "current-context: s\nusers:\n- name: u\n  user: {}\n", s->url);
    fclose(f);
}

/* SIGTERM: the stand-in kills its pods and exits 0. */
static void standin_stop(standin *s)
{
    kill(s->pid, SIGTERM);
    assert_int_equal(harness_wait_exit(s->pid, 5000), 0);
    harness_rmtree(s->dir);
}

typedef struct buf {
    char *data;
    size_t len;
} buf;

static size_t collect(char *p, size_t size, size_t n, void *arg)
{
    buf *b = arg;
    b->data = realloc(b->data, b->len + size * n + 1);
    memcpy(b->data + b->len, p, size * n);
    b->len += size * n;
    b->data[b->len] = '\0';
    return size * n;
}

/* One request; the reply body in *out (free it; may be NULL). Returns the HTTP status. */
static long api_full(const standin *s, const char *method, const char *path, const char *ctype,
                     const char *body, size_t body_len, const char *token, long timeout_ms,
                     char **out)
{
    CURL *c = curl_easy_init();
    char url[2048], auth[128];
    struct curl_slist *h = NULL;
    buf b = {calloc(1, 1), 0};
    snprintf(url, sizeof url, "%s%s", s->url, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    if (ctype) {
        char ct[128];
        snprintf(ct, sizeof ct, "Content-Type: %s", ctype);
        h = curl_slist_append(h, ct);
    }
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        h = curl_slist_append(h, auth);
    }
    h = curl_slist_append(h, "Expect:");
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    }
    long code = 0;
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK || rc == CURLE_OPERATION_TIMEDOUT)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (out)
        *out = b.data;
    else
        free(b.data);
    return code;
}

static long api(const standin *s, const char *method, const char *path, const char *ctype,
                const char *body, cJSON **json)
{
    char *out;
    long code = api_full(s, method, path, ctype, body, body ? strlen(body) : 0, NULL, 5000, &out);
    if (json) {
        *json = cJSON_Parse(out);
        if (!*json)
            fail_msg("%s %s: %ld and not JSON: %.300s", method, path, code, out);
    }
    free(out);
    return code;
}

static const char *str_at(const cJSON *j, const char *a, const char *b, const char *c)
{
    const cJSON *x = cJSON_GetObjectItem(j, a);
    if (b)
        x = cJSON_GetObjectItem(x, b);
    if (c)
        x = cJSON_GetObjectItem(x, c);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

static double num_at(const cJSON *j, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItem(cJSON_GetObjectItem(j, a), b);
    return cJSON_IsNumber(x) ? x->valuedouble : -1;
}

/* kubectl --kubeconfig ... args...: its exit status (-1 when killed at timeout_ms). */
static int kubectl(const standin *s, char *out, size_t outlen, int timeout_ms, const char *a1, ...)
{
    const char *argv[32] = {EDL_KUBECTL_BIN, "--kubeconfig", s->kubeconfig, "--cache-dir", s->cache};
    char log[320];
    int n = 5;
    va_list ap;
    va_start(ap, a1);
    for (const char *a = a1; a && n < 31; a = va_arg(ap, const char *))
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    snprintf(log, sizeof log, "%s/kubectl.out", s->dir);
    return harness_run(argv, log, timeout_ms, out, outlen);
}

static char *write_tmp(const standin *s, const char *name, const char *text, char *path, size_t len)
{
    snprintf(path, len, "%s/%s", s->dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* Poll GET path until .a.b equals want (or fail after timeout_ms). */
static cJSON *wait_for(const standin *s, const char *path, const char *a, const char *b,
                       const char *want, int timeout_ms)
{
    int64_t until = harness_now_ms() + timeout_ms;
    for (;;) {
        cJSON *j = NULL;
        api(s, "GET", path, NULL, NULL, &j);
        const char *v = str_at(j, a, b, NULL);
        if (v && !strcmp(v, want))
            return j;
        if (harness_now_ms() > until)
            fail_msg("%s: %s.%s is %s, not %s", path, a, b, v ? v : "(none)", want);
        cJSON_Delete(j);
        harness_sleep_ms(50);
    }
}

static const char TJ_PATH[] = "/apis/edl.dev/v1alpha1/namespaces/default/trainingjobs";

static int setup(void **state)
{
    standin *s = calloc(1, sizeof *s);
    static const char *const extra[] = {"--history", "200", "--bookmark-ms", "200", NULL};
    standin_start(s, extra);
    *state = s;
    return 0;
}

static int teardown(void **state)
{
    standin *s = *state;
    standin_stop(s);
    free(s);
    return 0;
}

/* ---- the API: CRDs, subresources, conflicts, watches -------------------------------- */

static void create_crd(standin *s)
{
    char out[8192];
    if (!have_kubectl()) {
        /* the same CRD through the API, so the rest still runs */
        print_message("kubectl not found at %s (scripts/install-deps): kubectl checks skipped\n",
                      EDL_KUBECTL_BIN);
        return;
    }
    /* plain apply: kubectl validates through ?fieldValidation=Strict on the server */
    int rc = kubectl(s, out, sizeof out, 20000, "apply", "-f", EDL_CRD_YAML, NULL);
    if (rc != 0)
        fail_msg("kubectl apply -f %s: %s", EDL_CRD_YAML, out);
}

static void test_kubectl_applies_the_crd_and_a_trainingjob(void **state)
{
    standin *s = *state;
    char out[8192], path[400];
    create_crd(s);
    if (!have_kubectl())
        skip();
    cJSON *disc;
    assert_int_equal(api(s, "GET", "/apis/edl.dev/v1alpha1", NULL, NULL, &disc), 200);
    char *text = cJSON_PrintUnformatted(disc);
    assert_non_null(strstr(text, "\"trainingjobs/scale\""));
    assert_non_null(strstr(text, "\"shortNames\":[\"tj\"]"));
    free(text);
    cJSON_Delete(disc);
    write_tmp(s, "tj.yaml",
              "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: demo}\n"
              "spec:\n  replicas: 2\n  template:\n    spec:\n      containers:\n"
              "        - {name: trainer, image: edl, command: [sleep, '1']}\n",
              path, sizeof path);
    assert_int_equal(kubectl(s, out, sizeof out, 20000, "apply", "-f", path, NULL), 0);
    assert_int_equal(kubectl(s, out, sizeof out, 20000, "get", "tj", NULL), 0);
    assert_non_null(strstr(out, "DESIRED"));
    assert_non_null(strstr(out, "STATE"));
    assert_non_null(strstr(out, "demo   2 "));
    cJSON *tj;
    assert_int_equal(api(s, "GET", "/apis/edl.dev/v1alpha1/namespaces/default/trainingjobs/demo", NULL, NULL, &tj), 200);
    assert_string_equal(str_at(tj, "spec", "cleanPodPolicy", NULL), "Running"); /* defaults */
    assert_null(cJSON_GetObjectItem(cJSON_GetObjectItem(tj, "spec"), "elastic")); /* no parent, no nested defaults */
    assert_true(num_at(tj, "metadata", "generation") == 1);
    cJSON_Delete(tj);
    assert_int_equal(kubectl(s, out, sizeof out, 20000, "scale", "tj/demo", "--replicas=3", NULL), 0);
    assert_int_equal(api(s, "GET", "/apis/edl.dev/v1alpha1/namespaces/default/trainingjobs/demo/scale", NULL, NULL, &tj), 200);
    assert_string_equal(str_at(tj, "kind", NULL, NULL), "Scale");
    assert_true(num_at(tj, "spec", "replicas") == 3);
    cJSON_Delete(tj);
    assert_int_equal(api(s, "GET", "/apis/edl.dev/v1alpha1/namespaces/default/trainingjobs/demo", NULL, NULL, &tj), 200);
    assert_true(num_at(tj, "spec", "replicas") == 3);
    assert_true(num_at(tj, "metadata", "generation") == 2);
    cJSON_Delete(tj);
    assert_int_equal(kubectl(s, out, sizeof out, 20000, "get", "tj", "demo", "-o", "yaml", NULL), 0);
    assert_non_null(strstr(out, "kind: TrainingJob"));
    assert_int_equal(kubectl(s, out, sizeof out, 20000, "apply", "--server-side", "-f", path, NULL), 0);
    assert_non_null(strstr(out, "serverside-applied"));
}

static void ensure_tj(standin *s, const char *name)
{
    char body[1024];
    if (!have_kubectl()) { /* without kubectl the CRD comes through the API from the test */
        char crd[] = "{\"apiVersion\":\"apiextensions.k8s.io/v1\",\"kind\":\"CustomResourceDefinition\","
                     "\"metadata\":{\"name\":\"trainingjobs.edl.dev\"},\"spec\":{\"group\":\"edl.dev\","
                     "\"scope\":\"Namespaced\",\"names\":{\"plural\":\"trainingjobs\",\"kind\":\"TrainingJob\","
                     "\"shortNames\":[\"tj\"]},\"versions\":[{\"name\":\"v1alpha1\",\"served\":true,\"storage\":true,"
                     "\"subresources\":{\"status\":{},\"scale\":{\"specReplicasPath\":\".spec.replicas\","
                     "\"statusReplicasPath\":\".status.replicas\",\"labelSelectorPath\":\".status.selector\"}},"
                     "\"schema\":{\"openAPIV3Schema\":{\"type\":\"object\",\"properties\":{\"spec\":{\"type\":"
                     "\"object\",\"x-kubernetes-preserve-unknown-fields\":true},\"status\":{\"type\":\"object\","
                     "\"x-kubernetes-preserve-unknown-fields\":true}}}}}]}}";
        api(s, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "application/json", crd, NULL);
    }
    snprintf(body, sizeof body,
             "{\"apiVersion\":\"edl.dev/v1alpha1\",\"kind\":\"TrainingJob\",\"metadata\":{\"name\":\"%s\"},"
             "\"spec\":{\"replicas\":1,\"template\":{\"spec\":{\"containers\":[{\"name\":\"t\"}]}}}}",
             name);
    long code = api(s, "POST", TJ_PATH, "application/json", body, NULL);
    assert_true(code == 201 || code == 409);
}

static void test_status_and_spec_writes_stay_apart(void **state)
{
    standin *s = *state;
    cJSON *j;
    char path[256];
    ensure_tj(s, "apart");
    snprintf(path, sizeof path, "%s/apart/status", TJ_PATH);
    assert_int_equal(api(s, "PATCH", path, "application/merge-patch+json",
                         "{\"spec\":{\"replicas\":7},\"status\":{\"state\":\"Running\"}}", &j), 200);
    assert_true(num_at(j, "spec", "replicas") == 1);
    assert_string_equal(str_at(j, "status", "state", NULL), "Running");
    assert_true(num_at(j, "metadata", "generation") == 1);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/apart", TJ_PATH);
    assert_int_equal(api(s, "PATCH", path, "application/merge-patch+json",
                         "{\"spec\":{\"replicas\":4},\"status\":{\"state\":\"Failed\"}}", &j), 200);
    assert_true(num_at(j, "spec", "replicas") == 4);
    assert_string_equal(str_at(j, "status", "state", NULL), "Running");
    assert_true(num_at(j, "metadata", "generation") == 2);
    cJSON_Delete(j);
    /* a label is metadata: no new generation; a JSON patch works too */
    assert_int_equal(api(s, "PATCH", path, "application/json-patch+json",
                         "[{\"op\":\"add\",\"path\":\"/metadata/labels\",\"value\":{\"a\":\"b\"}}]", &j), 200);
    assert_true(num_at(j, "metadata", "generation") == 2);
    cJSON_Delete(j);
    /* strategic merge patch is not for custom resources (415, like the real server) */
    assert_int_equal(api(s, "PATCH", path, "application/strategic-merge-patch+json", "{}", &j), 415);
    cJSON_Delete(j);
}

static void test_stale_resource_version_put_conflicts(void **state)
{
    standin *s = *state;
    cJSON *j, *after;
    char path[256];
    ensure_tj(s, "stale");
    snprintf(path, sizeof path, "%s/stale", TJ_PATH);
    assert_int_equal(api(s, "GET", path, NULL, NULL, &j), 200);
    char *rv = strdup(str_at(j, "metadata", "resourceVersion", NULL));
    cJSON_SetValuestring(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "metadata"), "resourceVersion"), "2");
    char *body = cJSON_PrintUnformatted(j);
    assert_int_equal(api(s, "PUT", path, "application/json", body, &after), 409);
    assert_string_equal(str_at(after, "reason", NULL, NULL), "Conflict");
    assert_string_equal(str_at(after, "kind", NULL, NULL), "Status");
    cJSON_Delete(after);
    assert_int_equal(api(s, "GET", path, NULL, NULL, &after), 200);
    assert_string_equal(str_at(after, "metadata", "resourceVersion", NULL), rv);
    cJSON_Delete(after);
    free(body);
    free(rv);
    cJSON_Delete(j);
}

static void test_watch_history_expiry_bookmarks_and_labels(void **state)
{
    standin *s = *state;
    cJSON *j;
    char *out, path[512];
    assert_int_equal(api(s, "GET", "/api/v1/namespaces/default/configmaps", NULL, NULL, &j), 200);
    char *rv = strdup(str_at(j, "metadata", "resourceVersion", NULL));
    cJSON_Delete(j);
    api(s, "POST", "/api/v1/namespaces/default/configmaps", "application/json",
        "{\"metadata\":{\"name\":\"w-a\",\"labels\":{\"app\":\"a\"}}}", NULL);
    api(s, "POST", "/api/v1/namespaces/default/configmaps", "application/json",
        "{\"metadata\":{\"name\":\"w-b\",\"labels\":{\"app\":\"b\"}}}", NULL);
    /* from rv: both creations come from the history, only app=a passes the selector */
    snprintf(path, sizeof path, "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=%s"
             "&labelSelector=app%%3Da&allowWatchBookmarks=true&timeoutSeconds=1", rv);
    assert_int_equal(api_full(s, "GET", path, NULL, NULL, 0, NULL, 3000, &out), 200);
    assert_non_null(strstr(out, "{\"type\":\"ADDED\""));
    assert_non_null(strstr(out, "\"name\":\"w-a\""));
    assert_null(strstr(out, "\"name\":\"w-b\""));
    assert_non_null(strstr(out, "{\"type\":\"BOOKMARK\""));
    free(out);
    /* after the history is dropped, a watch from an old version is told to relist */
    assert_int_equal(api(s, "POST", "/standin/expire", NULL, NULL, NULL), 200);
    snprintf(path, sizeof path, "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=%s", rv);
    assert_int_equal(api(s, "GET", path, NULL, NULL, &j), 410);
    assert_string_equal(str_at(j, "reason", NULL, NULL), "Expired");
    cJSON_Delete(j);
    free(rv);
}

static void test_finalizers_hold_a_deletion(void **state)
{
    standin *s = *state;
    cJSON *j;
    static const char p[] = "/api/v1/namespaces/default/configmaps/held";
    assert_int_equal(api(s, "POST", "/api/v1/namespaces/default/configmaps", "application/json",
                         "{\"metadata\":{\"name\":\"held\",\"finalizers\":[\"edl.dev/x\"]}}", NULL), 201);
    assert_int_equal(api(s, "DELETE", p, NULL, NULL, &j), 200);
    assert_non_null(str_at(j, "metadata", "deletionTimestamp", NULL));
    cJSON_Delete(j);
    assert_int_equal(api(s, "GET", p, NULL, NULL, NULL), 200);
    assert_int_equal(api(s, "PATCH", p, "application/merge-patch+json",
                         "{\"metadata\":{\"finalizers\":null}}", NULL), 200);
    assert_int_equal(api(s, "GET", p, NULL, NULL, &j), 404);
    assert_string_equal(str_at(j, "reason", NULL, NULL), "NotFound");
    cJSON_Delete(j);
}

static void create_owned(standin *s, const char *name, const char *owner_uid)
{
    char body[512];
    snprintf(body, sizeof body,
             "{\"metadata\":{\"name\":\"%s\",\"ownerReferences\":[{\"apiVersion\":\"v1\",\"kind\":"
             "\"ConfigMap\",\"name\":\"owner\",\"uid\":\"%s\",\"controller\":true}]}}",
             name, owner_uid);
    assert_int_equal(api(s, "POST", "/api/v1/namespaces/default/configmaps", "application/json", body, NULL), 201);
}

static void test_owner_deletion_cascades_unless_orphaned(void **state)
{
    standin *s = *state;
    cJSON *j;
    static const char cms[] = "/api/v1/namespaces/default/configmaps";
    for (int orphan = 0; orphan < 2; orphan++) {
        assert_int_equal(api(s, "POST", cms, "application/json", "{\"metadata\":{\"name\":\"owner\"}}", &j), 201);
        char *uid = strdup(str_at(j, "metadata", "uid", NULL));
        cJSON_Delete(j);
        create_owned(s, "dep", uid);
        assert_int_equal(api(s, "DELETE", "/api/v1/namespaces/default/configmaps/owner", "application/json",
                             orphan ? "{\"propagationPolicy\":\"Orphan\"}" : "{}", NULL), 200);
        long code = api(s, "GET", "/api/v1/namespaces/default/configmaps/dep", NULL, NULL, &j);
        if (orphan) {
            assert_int_equal(code, 200);
            const cJSON *refs = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "metadata"), "ownerReferences");
            assert_int_equal(cJSON_GetArraySize(refs), 0); /* the reference to the owner is gone */
            api(s, "DELETE", "/api/v1/namespaces/default/configmaps/dep", NULL, NULL, NULL);
        } else {
            assert_int_equal(code, 404);
        }
        cJSON_Delete(j);
        free(uid);
    }
}

static void test_bad_requests_get_statuses_and_change_nothing(void **state)
{
    standin *s = *state;
    cJSON *j;
    static const char cms[] = "/api/v1/namespaces/default/configmaps";
    assert_int_equal(api(s, "GET", cms, NULL, NULL, &j), 200);
    char *rv = strdup(str_at(j, "metadata", "resourceVersion", NULL));
    cJSON_Delete(j);
    assert_int_equal(api(s, "POST", cms, "application/json", "{\"metadata\":{\"name\":", &j), 400);
    assert_string_equal(str_at(j, "reason", NULL, NULL), "BadRequest");
    cJSON_Delete(j);
    assert_int_equal(api(s, "POST", cms, "text/plain", "{\"metadata\":{\"name\":\"x\"}}", &j), 415);
    cJSON_Delete(j);
    assert_int_equal(api(s, "POST", cms, "application/json", "{\"metadata\":{\"name\":\"Bad_Name\"}}", &j), 422);
    assert_string_equal(str_at(j, "reason", NULL, NULL), "Invalid");
    assert_non_null(strstr(str_at(j, "message", NULL, NULL), "RFC 1123"));
    cJSON_Delete(j);
    size_t big = 4u << 20;
    char *huge = malloc(big);
    memset(huge, ' ', big);
    huge[0] = '{';
    huge[big - 1] = '}';
    char *out;
    assert_int_equal(api_full(s, "POST", cms, "application/json", huge, big, NULL, 10000, &out), 413);
    free(out);
    free(huge);
    assert_int_equal(api(s, "GET", "/api/v1/namespaces/default/nothings", NULL, NULL, &j), 404);
    assert_int_equal((int)cJSON_GetObjectItem(j, "code")->valuedouble, 404);
    cJSON_Delete(j);
    assert_int_equal(api(s, "GET", "/apis/edl.dev/v1alpha1/namespaces/nope/trainingjobs/x", NULL, NULL, NULL), 404);
    assert_int_equal(api(s, "GET", cms, NULL, NULL, &j), 200);
    assert_string_equal(str_at(j, "metadata", "resourceVersion", NULL), rv);
    cJSON_Delete(j);
    free(rv);
}

/* ---- the kubelet ----------------------------------------------------------------------- */

static const char POD_FMT[] =
    "{\"metadata\":{\"name\":\"%s\",\"labels\":{\"edl.dev/job\":\"k\"}},\"spec\":{"
    "\"restartPolicy\":\"Never\",\"terminationGracePeriodSeconds\":%d,"
    "\"containers\":[{\"name\":\"c\",\"image\":\"none\",\"command\":[\"sh\",\"-c\"],\"args\":[\"%s\"],"
    "\"env\":[{\"name\":\"ME\",\"valueFrom\":{\"fieldRef\":{\"fieldPath\":\"metadata.name\"}}},"
    "{\"name\":\"JOB\",\"valueFrom\":{\"fieldRef\":{\"fieldPath\":\"metadata.labels['edl.dev/job']\"}}},"
    "{\"name\":\"TOKEN\",\"valueFrom\":{\"secretKeyRef\":{\"name\":\"creds\",\"key\":\"token\"}}},"
    "{\"name\":\"HELLO\",\"value\":\"hi-$(ME)\"}],"
    "\"volumeMounts\":[{\"name\":\"creds\",\"mountPath\":\"/etc/creds\"}]}],"
    "\"volumes\":[{\"name\":\"creds\",\"secret\":{\"secretName\":\"creds\"}}]}}";

static void create_pod(standin *s, const char *name, int grace, const char *script)
{
    char body[4096];
    snprintf(body, sizeof body, POD_FMT, name, grace, script);
    assert_int_equal(api(s, "POST", "/api/v1/namespaces/default/pods", "application/json", body, NULL), 201);
}

static void test_kubelet_runs_a_pod_with_downward_env_and_a_secret_volume(void **state)
{
    standin *s = *state;
    char out[8192];
    long code = api(s, "POST", "/api/v1/namespaces/default/secrets", "application/json",
                    "{\"metadata\":{\"name\":\"creds\"},\"stringData\":{\"token\":\"s3cret\"}}", NULL);
    assert_true(code == 201 || code == 409);
    create_pod(s, "ok", 30, "echo me=$ME job=$JOB token=$TOKEN file=$(cat /etc/creds/token) $(HELLO)");
    create_pod(s, "bad", 30, "exit 3");
    cJSON *j = wait_for(s, "/api/v1/namespaces/default/pods/ok", "status", "phase", "Succeeded", 10000);
    assert_string_equal(str_at(j, "spec", "nodeName", NULL), "standin-node");
    assert_string_equal(str_at(j, "status", "podIP", NULL), "127.0.0.1");
    cJSON_Delete(j);
    j = wait_for(s, "/api/v1/namespaces/default/pods/bad", "status", "phase", "Failed", 10000);
    cJSON *cs = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "status"), "containerStatuses"), 0);
    assert_true(num_at(cJSON_GetObjectItem(cs, "state"), "terminated", "exitCode") == 3);
    assert_string_equal(str_at(cs, "state", "terminated", "reason"), "Error");
    cJSON_Delete(j);
    char *log;
    assert_int_equal(api_full(s, "GET", "/api/v1/namespaces/default/pods/ok/log", NULL, NULL, 0, NULL, 5000, &log), 200);
    assert_non_null(strstr(log, "me=ok job=k token=s3cret file=s3cret hi-ok"));
    free(log);
    if (have_kubectl()) {
        assert_int_equal(kubectl(s, out, sizeof out, 20000, "logs", "ok", NULL), 0);
        assert_non_null(strstr(out, "token=s3cret"));
        assert_int_equal(kubectl(s, out, sizeof out, 20000, "get", "pods", "-l", "edl.dev/job=k", NULL), 0);
        assert_non_null(strstr(out, "READY"));
        assert_non_null(strstr(out, "Completed"));
        assert_non_null(strstr(out, "Error"));
    }
}

static void test_graceful_delete_sends_sigterm_then_sigkill(void **state)
{
    standin *s = *state;
    char out[8192];
    cJSON *j;
    create_pod(s, "stubborn", 3,
               "trap 'echo got-term' TERM; echo armed; while true; do sleep 0.05; done");
    cJSON_Delete(wait_for(s, "/api/v1/namespaces/default/pods/stubborn", "status", "phase", "Running", 10000));
    /* Running comes when the process starts; the trap is set once it says so (a SIGTERM
     * before that would end the shell at once) */
    bool armed = false;
    for (int64_t end = harness_now_ms() + 10000; !armed && harness_now_ms() < end;) {
        char *log = NULL;
        armed = api_full(s, "GET", "/api/v1/namespaces/default/pods/stubborn/log", NULL, NULL, 0,
                         NULL, 3000, &log) == 200 && log && strstr(log, "armed");
        free(log);
        if (!armed)
            harness_sleep_ms(20);
    }
    assert_true(armed);
    int64_t t0 = harness_now_ms();
    assert_int_equal(api(s, "DELETE", "/api/v1/namespaces/default/pods/stubborn", NULL, NULL, &j), 200);
    assert_non_null(str_at(j, "metadata", "deletionTimestamp", NULL));
    cJSON_Delete(j);
    if (have_kubectl()) { /* kubectl get -w with a label selector (it runs until killed) */
        kubectl(s, out, sizeof out, 1500, "get", "pods", "-l", "edl.dev/job=k", "-w", NULL);
        assert_non_null(strstr(out, "stubborn"));
        assert_non_null(strstr(out, "Terminating"));
    }
    while (api(s, "GET", "/api/v1/namespaces/default/pods/stubborn", NULL, NULL, NULL) == 200) {
        assert_true(harness_now_ms() - t0 < 8000);
        harness_sleep_ms(50);
    }
    int64_t took = harness_now_ms() - t0;
    assert_true(took >= 2900); /* it ignored SIGTERM: SIGKILL came after the 3 s grace */
    char path[600], text[4096];
    snprintf(path, sizeof path, "ls %s/kubelet/default_stubborn_*/c.log", s->dir);
    FILE *p = popen(path, "r");
    assert_non_null(p);
    assert_non_null(fgets(path, sizeof path, p));
    pclose(p);
    path[strcspn(path, "\n")] = '\0';
    assert_non_null(strstr(harness_read_file(path, text, sizeof text), "got-term"));
}

/* ---- test-only endpoints and flags ------------------------------------------------------ */

static void test_injected_fault_fails_a_create_and_stats_count_it(void **state)
{
    standin *s = *state;
    cJSON *j, *stats;
    assert_int_equal(api(s, "POST", "/standin/faults", "application/json",
                         "{\"verb\":\"create\",\"resource\":\"configmaps\",\"namespace\":\"default\","
                         "\"code\":403,\"reason\":\"Forbidden\",\"message\":\"exceeded quota: q\",\"count\":1}", NULL), 201);
    assert_int_equal(api(s, "GET", "/standin/stats", NULL, NULL, &stats), 200);
    cJSON *c = cJSON_GetObjectItem(stats, "create configmaps");
    double before = cJSON_IsNumber(c) ? c->valuedouble : 0;
    cJSON_Delete(stats);
    assert_int_equal(api(s, "POST", "/api/v1/namespaces/default/configmaps", "application/json",
                         "{\"metadata\":{\"name\":\"quota\"}}", &j), 403);
    assert_string_equal(str_at(j, "reason", NULL, NULL), "Forbidden");
    assert_string_equal(str_at(j, "message", NULL, NULL), "exceeded quota: q");
    cJSON_Delete(j);
    assert_int_equal(api(s, "POST", "/api/v1/namespaces/default/configmaps", "application/json",
                         "{\"metadata\":{\"name\":\"quota\"}}", NULL), 201);
    assert_int_equal(api(s, "GET", "/standin/stats", NULL, NULL, &stats), 200);
    assert_true(cJSON_GetObjectItem(stats, "create configmaps")->valuedouble == before + 2);
    cJSON_Delete(stats);
    assert_int_equal(api(s, "DELETE", "/standin/faults", NULL, NULL, NULL), 200);
}

static void test_token_and_gone_in_stream(void **state)
{
    standin t = {0};
    static const char *const extra[] = {"--token", "tok", "--gone-in-stream", "--kubelet-mode", "off", NULL};
    char *out;
    (void)state;
    standin_start(&t, extra);
    assert_int_equal(api_full(&t, "GET", "/api/v1/namespaces", NULL, NULL, 0, NULL, 5000, &out), 401);
    assert_non_null(strstr(out, "\"reason\":\"Unauthorized\""));
    free(out);
    assert_int_equal(api_full(&t, "POST", "/standin/expire", NULL, NULL, 0, "tok", 5000, NULL), 200);
    assert_int_equal(api_full(&t, "GET", "/api/v1/namespaces?watch=1&resourceVersion=1", NULL, NULL,
                              0, "tok", 5000, &out), 200);
    assert_memory_equal(out, "{\"type\":\"ERROR\"", 15);
    assert_non_null(strstr(out, "\"code\":410"));
    free(out);
    standin_stop(&t);
}

/* ---- what a real API server does too, and the test-only counters and delays ------------- */

/* The value at a dotted path with [i] indices ("spec.volumes[0].name"), or NULL. */
static const cJSON *jpath(const cJSON *j, const char *path)
{
    char key[128];
    for (const char *p = path; j && *p;) {
        if (*p == '.')
            p++;
        if (*p == '[') {
            j = cJSON_GetArrayItem(j, atoi(p + 1));
            p = strchr(p, ']') + 1;
            continue;
        }
        size_t n = strcspn(p, ".[");
        snprintf(key, sizeof key, "%.*s", (int)n, p);
        j = cJSON_GetObjectItemCaseSensitive(j, key);
        p += n;
    }
    return j;
}

static const char *jstr(const cJSON *j, const char *path)
{
    const cJSON *v = jpath(j, path);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A write that the server must refuse with 422 Invalid: message is the whole Status message,
 * field the first cause's field. */
static void expect_invalid(const standin *s, const char *method, const char *path,
                           const char *ctype, const char *body, const char *message,
                           const char *field)
{
    cJSON *j;
    long code = api(s, method, path, ctype, body, &j);
    if (code != 422)
        fail_msg("%s %s: %ld, not 422: %s", method, path, code, str_at(j, "message", NULL, NULL));
    assert_string_equal(str_at(j, "reason", NULL, NULL), "Invalid");
    assert_string_equal(str_at(j, "message", NULL, NULL), message);
    assert_string_equal(jstr(j, "details.causes[0].field"), field);
    assert_string_equal(jstr(j, "details.causes[0].reason"), "FieldValueInvalid");
    cJSON_Delete(j);
}

static const char DNS1035[] =
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or "
    "'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
static const char RFC1123_LABEL[] =
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
static const char LABEL_VALUE[] =
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

static void test_names_and_label_values_are_checked_per_kind(void **state)
{
    standin *s = *state;
    char msg[1024], body[1024], long_name[70];
    static const char svcs[] = "/api/v1/namespaces/default/services";
    static const char cms[] = "/api/v1/namespaces/default/configmaps";
    static const char pods[] = "/api/v1/namespaces/default/pods";
    /* a Service's name is a DNS-1035 label: no leading digit, no dot, at most 63 */
    snprintf(msg, sizeof msg, "Service \"1job\" is invalid: metadata.name: Invalid value: \"1job\": %s", DNS1035);
    expect_invalid(s, "POST", svcs, "application/json", "{\"metadata\":{\"name\":\"1job\"}}", msg, "metadata.name");
    snprintf(msg, sizeof msg, "Service \"my.job\" is invalid: metadata.name: Invalid value: \"my.job\": %s", DNS1035);
    expect_invalid(s, "POST", svcs, "application/json", "{\"metadata\":{\"name\":\"my.job\"}}", msg, "metadata.name");
    memset(long_name, 'a', 64);
    long_name[64] = '\0';
    snprintf(body, sizeof body, "{\"metadata\":{\"name\":\"%s\"}}", long_name);
    snprintf(msg, sizeof msg, "Service \"%s\" is invalid: metadata.name: Invalid value: \"%s\": must be no more than 63 characters",
             long_name, long_name);
    expect_invalid(s, "POST", svcs, "application/json", body, msg, "metadata.name");
    assert_int_equal(api(s, "POST", svcs, "application/json", "{\"metadata\":{\"name\":\"my-job\"}}", NULL), 201);
    /* other kinds take DNS-1123 subdomains: a leading digit and dots are fine (custom
     * resources too, but the TrainingJob CRD's own CEL rule holds its names to DNS-1035) */
    assert_int_equal(api(s, "POST", cms, "application/json", "{\"metadata\":{\"name\":\"1job.x\"}}", NULL), 201);
    /* namespaces stay DNS-1123 labels */
    snprintf(msg, sizeof msg, "Namespace \"a.b\" is invalid: metadata.name: Invalid value: \"a.b\": %s", RFC1123_LABEL);
    expect_invalid(s, "POST", "/api/v1/namespaces", "application/json", "{\"metadata\":{\"name\":\"a.b\"}}", msg, "metadata.name");
    /* a pod's hostname and subdomain are DNS-1123 labels */
    static const char pod_fmt[] = "{\"metadata\":{\"name\":\"named\"},\"spec\":{\"%s\":\"%s\",\"containers\":"
                                  "[{\"name\":\"c\",\"image\":\"x\",\"command\":[\"true\"]}]}}";
    snprintf(body, sizeof body, pod_fmt, "subdomain", "my.job");
    snprintf(msg, sizeof msg, "Pod \"named\" is invalid: spec.subdomain: Invalid value: \"my.job\": %s", RFC1123_LABEL);
    expect_invalid(s, "POST", pods, "application/json", body, msg, "spec.subdomain");
    snprintf(body, sizeof body, pod_fmt, "hostname", long_name);
    snprintf(msg, sizeof msg, "Pod \"named\" is invalid: spec.hostname: Invalid value: \"%s\": must be no more than 63 characters",
             long_name);
    expect_invalid(s, "POST", pods, "application/json", body, msg, "spec.hostname");
    /* label values on every kind: at most 63, alphanumeric at both ends, or empty */
    snprintf(msg, sizeof msg, "ConfigMap \"lv\" is invalid: metadata.labels: Invalid value: \"-x\": %s", LABEL_VALUE);
    expect_invalid(s, "POST", cms, "application/json", "{\"metadata\":{\"name\":\"lv\",\"labels\":{\"a\":\"-x\"}}}",
                   msg, "metadata.labels");
    snprintf(body, sizeof body, "{\"metadata\":{\"name\":\"lv\",\"labels\":{\"a\":\"%s\"}}}", long_name);
    snprintf(msg, sizeof msg, "ConfigMap \"lv\" is invalid: metadata.labels: Invalid value: \"%s\": must be no more than 63 characters",
             long_name);
    expect_invalid(s, "POST", cms, "application/json", body, msg, "metadata.labels");
    assert_int_equal(api(s, "POST", cms, "application/json",
                         "{\"metadata\":{\"name\":\"lv\",\"labels\":{\"a\":\"\",\"b\":\"My_v.1\"}}}", NULL), 201);
    snprintf(msg, sizeof msg, "ConfigMap \"lv\" is invalid: metadata.labels: Invalid value: \"x y\": %s", LABEL_VALUE);
    expect_invalid(s, "PATCH", "/api/v1/namespaces/default/configmaps/lv", "application/merge-patch+json",
                   "{\"metadata\":{\"labels\":{\"c\":\"x y\"}}}", msg, "metadata.labels");
    ensure_tj(s, "lv-job");
    snprintf(msg, sizeof msg, "TrainingJob.edl.dev \"lv-job\" is invalid: metadata.labels: Invalid value: \"x y\": %s", LABEL_VALUE);
    snprintf(body, sizeof body, "%s/lv-job", TJ_PATH);
    expect_invalid(s, "PATCH", body, "application/merge-patch+json", "{\"metadata\":{\"labels\":{\"c\":\"x y\"}}}",
                   msg, "metadata.labels");
}

static const char SA_PATH[] = "/var/run/secrets/kubernetes.io/serviceaccount";

/* The pod's kube-api-access-<5> volume and every container's read-only mount of it. */
static void assert_token_volume(const cJSON *pod, const char *want_name)
{
    const cJSON *vol = NULL, *v;
    cJSON_ArrayForEach(v, jpath(pod, "spec.volumes"))
    {
        const char *n = jstr(v, "name");
        if (n && !strncmp(n, "kube-api-access-", 16))
            vol = v;
    }
    assert_non_null(vol);
    const char *name = jstr(vol, "name");
    if (want_name) {
        assert_string_equal(name, want_name);
    } else {
        assert_int_equal(strlen(name), 21);
        for (int i = 16; i < 21; i++)
            assert_non_null(strchr("abcdefghijklmnopqrstuvwxyz0123456789", name[i]));
        assert_true(jpath(vol, "projected.defaultMode")->valuedouble == 420);
        assert_true(jpath(vol, "projected.sources[0].serviceAccountToken.expirationSeconds")->valuedouble == 3607);
        assert_string_equal(jstr(vol, "projected.sources[0].serviceAccountToken.path"), "token");
        assert_string_equal(jstr(vol, "projected.sources[1].configMap.name"), "kube-root-ca.crt");
        assert_string_equal(jstr(vol, "projected.sources[1].configMap.items[0].key"), "ca.crt");
        assert_string_equal(jstr(vol, "projected.sources[1].configMap.items[0].path"), "ca.crt");
        assert_string_equal(jstr(vol, "projected.sources[2].downwardAPI.items[0].path"), "namespace");
        assert_string_equal(jstr(vol, "projected.sources[2].downwardAPI.items[0].fieldRef.fieldPath"),
                            "metadata.namespace");
    }
    static const char *const lists[] = {"spec.initContainers", "spec.containers"};
    for (int l = 0; l < 2; l++)
        cJSON_ArrayForEach(v, jpath(pod, lists[l]))
        {
            const cJSON *m, *hit = NULL;
            cJSON_ArrayForEach(m, cJSON_GetObjectItem(v, "volumeMounts"))
                if (!strcmp(jstr(m, "mountPath"), SA_PATH)) hit = m;
            assert_non_null(hit);
            assert_string_equal(jstr(hit, "name"), name);
            assert_true(cJSON_IsTrue(cJSON_GetObjectItem(hit, "readOnly")));
        }
}

/* Create (dry run unless run) a pod; returns the stored or admitted object. */
static cJSON *admit_pod(standin *s, const char *body, bool run)
{
    cJSON *j;
    long code = api(s, "POST", run ? "/api/v1/namespaces/default/pods"
                                   : "/api/v1/namespaces/default/pods?dryRun=All",
                    "application/json", body, &j);
    if (code != 201)
        fail_msg("pod create: %ld %s", code, str_at(j, "message", NULL, NULL));
    return j;
}

static void test_service_account_admission_mounts_a_token_volume(void **state)
{
    standin *s = *state;
    cJSON *j;
    char *log;
    /* every namespace has kube-root-ca.crt, the start-up ones and new ones */
    assert_int_equal(api(s, "GET", "/api/v1/namespaces/kube-system/configmaps/kube-root-ca.crt", NULL, NULL, NULL), 200);
    assert_int_equal(api(s, "POST", "/api/v1/namespaces", "application/json", "{\"metadata\":{\"name\":\"fresh\"}}", NULL), 201);
    assert_int_equal(api(s, "GET", "/api/v1/namespaces/fresh/configmaps/kube-root-ca.crt", NULL, NULL, &j), 200);
    assert_memory_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "data"), "ca.crt")->valuestring,
                        "-----BEGIN CERTIFICATE-----", 27);
    cJSON_Delete(j);
    /* a pod without a service account gets default, and the token volume in every container;
     * the stand-in kubelet writes it (the init container and the container read it) */
    j = admit_pod(s, "{\"metadata\":{\"name\":\"sa-a\"},\"spec\":{\"restartPolicy\":\"Never\","
                     "\"initContainers\":[{\"name\":\"i\",\"image\":\"x\",\"command\":[\"cat\","
                     "\"/var/run/secrets/kubernetes.io/serviceaccount/namespace\"]}],"
                     "\"containers\":[{\"name\":\"c\",\"image\":\"x\",\"command\":[\"sh\",\"-c\","
                     "\"cat /var/run/secrets/kubernetes.io/serviceaccount/namespace; echo; "
                     "head -c 27 /var/run/secrets/kubernetes.io/serviceaccount/ca.crt; echo; "
                     "test -s /var/run/secrets/kubernetes.io/serviceaccount/token && echo token-ok\"]}]}}", true);
    assert_string_equal(jstr(j, "spec.serviceAccountName"), "default");
    assert_string_equal(jstr(j, "spec.serviceAccount"), "default");
    assert_token_volume(j, NULL);
    cJSON_Delete(j);
    cJSON_Delete(wait_for(s, "/api/v1/namespaces/default/pods/sa-a", "status", "phase", "Succeeded", 10000));
    assert_int_equal(api_full(s, "GET", "/api/v1/namespaces/default/pods/sa-a/log", NULL, NULL, 0, NULL, 5000, &log), 200);
    assert_non_null(strstr(log, "default\n-----BEGIN CERTIFICATE-----\ntoken-ok"));
    free(log);
    /* automountServiceAccountToken: false on the pod, or on its ServiceAccount (the pod wins) */
    static const char plain[] = "{\"metadata\":{\"name\":\"sa-b\"},\"spec\":{%s\"containers\":"
                                "[{\"name\":\"c\",\"image\":\"x\",\"command\":[\"true\"]}]}}";
    char body[1024];
    snprintf(body, sizeof body, plain, "\"automountServiceAccountToken\":false,");
    j = admit_pod(s, body, false);
    assert_null(jpath(j, "spec.volumes[0]"));
    assert_null(jpath(j, "spec.containers[0].volumeMounts[0]"));
    cJSON_Delete(j);
    assert_int_equal(api(s, "POST", "/api/v1/namespaces/default/serviceaccounts", "application/json",
                         "{\"metadata\":{\"name\":\"quiet\"},\"automountServiceAccountToken\":false}", NULL), 201);
    snprintf(body, sizeof body, plain, "\"serviceAccountName\":\"quiet\",");
    j = admit_pod(s, body, false);
    assert_null(jpath(j, "spec.volumes[0]"));
    cJSON_Delete(j);
    snprintf(body, sizeof body, plain, "\"serviceAccountName\":\"quiet\",\"automountServiceAccountToken\":true,");
    j = admit_pod(s, body, false);
    assert_token_volume(j, NULL);
    cJSON_Delete(j);
    /* a container that mounts the path itself keeps its mount; a kube-api-access-* volume of
     * the pod's own is the one mounted, and no other is added */
    j = admit_pod(s, "{\"metadata\":{\"name\":\"sa-c\"},\"spec\":{\"volumes\":[{\"name\":\"own\",\"emptyDir\":{}}],"
                     "\"containers\":[{\"name\":\"c\",\"image\":\"x\",\"command\":[\"true\"],\"volumeMounts\":"
                     "[{\"name\":\"own\",\"mountPath\":\"/var/run/secrets/kubernetes.io/serviceaccount\"}]},"
                     "{\"name\":\"d\",\"image\":\"x\",\"command\":[\"true\"]}]}}", false);
    assert_string_equal(jstr(j, "spec.containers[0].volumeMounts[0].name"), "own");
    assert_null(jpath(j, "spec.containers[0].volumeMounts[1]"));
    assert_non_null(strstr(jstr(j, "spec.containers[1].volumeMounts[0].name"), "kube-api-access-"));
    assert_non_null(jpath(j, "spec.volumes[1].projected"));
    cJSON_Delete(j);
    j = admit_pod(s, "{\"metadata\":{\"name\":\"sa-d\"},\"spec\":{\"volumes\":[{\"name\":\"kube-api-access-mine\","
                     "\"emptyDir\":{}}],\"containers\":[{\"name\":\"c\",\"image\":\"x\",\"command\":[\"true\"]}]}}", false);
    assert_token_volume(j, "kube-api-access-mine");
    assert_null(jpath(j, "spec.volumes[1]"));
    cJSON_Delete(j);
    /* a ServiceAccount that does not exist: 403 from the admission plugin */
    snprintf(body, sizeof body, plain, "\"serviceAccountName\":\"nope\",");
    assert_int_equal(api(s, "POST", "/api/v1/namespaces/default/pods", "application/json", body, &j), 403);
    assert_string_equal(str_at(j, "reason", NULL, NULL), "Forbidden");
    assert_string_equal(str_at(j, "message", NULL, NULL),
                        "pods \"sa-b\" is forbidden: error looking up service account default/nope: "
                        "serviceaccount \"nope\" not found");
    cJSON_Delete(j);
}

static const char TJ_FMT[] =
    "{\"apiVersion\":\"edl.dev/v1alpha1\",\"kind\":\"TrainingJob\",\"metadata\":{\"name\":\"%s\"},"
    "\"spec\":{%s\"template\":{\"spec\":{\"containers\":[{\"name\":\"t\"}]}}}}";

static void test_cel_rules_of_the_trainingjob_crd(void **state)
{
    standin *s = *state;
    char body[1024], path[400], out[8192];
    if (!have_kubectl())
        skip();
    snprintf(body, sizeof body, TJ_FMT, "cel-bad", "\"minReplicas\":3,\"maxReplicas\":2,");
    expect_invalid(s, "POST", TJ_PATH, "application/json", body,
                   "TrainingJob.edl.dev \"cel-bad\" is invalid: spec: Invalid value: \"object\": "
                   "minReplicas must not exceed maxReplicas", "spec");
    snprintf(body, sizeof body, TJ_FMT, "cel-ps",
             "\"ps\":{\"replicas\":3,\"maxReplicas\":2,\"template\":{\"spec\":{\"containers\":[{\"name\":\"p\"}]}}},");
    expect_invalid(s, "POST", TJ_PATH, "application/json", body,
                   "TrainingJob.edl.dev \"cel-ps\" is invalid: spec.ps: Invalid value: \"object\": "
                   "ps.replicas must not exceed ps.maxReplicas", "spec.ps");
    snprintf(body, sizeof body, TJ_FMT, "cel-ok", "\"minReplicas\":1,\"maxReplicas\":2,");
    assert_int_equal(api(s, "POST", TJ_PATH, "application/json", body, NULL), 201);
    snprintf(path, sizeof path, "%s/cel-ok", TJ_PATH);
    static const char bad[] = "TrainingJob.edl.dev \"cel-ok\" is invalid: spec: Invalid value: \"object\": "
                              "minReplicas must not exceed maxReplicas";
    expect_invalid(s, "PATCH", path, "application/merge-patch+json", "{\"spec\":{\"minReplicas\":3}}", bad, "spec");
    expect_invalid(s, "PATCH", path, "application/json-patch+json",
                   "[{\"op\":\"replace\",\"path\":\"/spec/maxReplicas\",\"value\":0}]",
                   "TrainingJob.edl.dev \"cel-ok\" is invalid: [spec.maxReplicas: Invalid value: 0: "
                   "spec.maxReplicas in body should be greater than or equal to 1, spec: Invalid value: "
                   "\"object\": minReplicas must not exceed maxReplicas]", "spec.maxReplicas");
    cJSON *j;
    assert_int_equal(api(s, "GET", path, NULL, NULL, &j), 200);
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(j, "spec"), "minReplicas", cJSON_CreateNumber(5));
    char *text = cJSON_PrintUnformatted(j);
    expect_invalid(s, "PUT", path, "application/json", text, bad, "spec");
    free(text);
    cJSON_Delete(j);
    /* a status write does not touch the spec: the rule holds */
    snprintf(path, sizeof path, "%s/cel-ok/status", TJ_PATH);
    assert_int_equal(api(s, "PATCH", path, "application/merge-patch+json", "{\"status\":{\"state\":\"Running\"}}", NULL), 200);
    /* kubectl shows the rule's message */
    write_tmp(s, "bad-tj.yaml",
              "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: cel-kubectl}\n"
              "spec:\n  minReplicas: 4\n  maxReplicas: 2\n  template:\n    spec:\n      containers:\n"
              "        - {name: trainer, image: edl, command: [sleep, '1']}\n", path, sizeof path);
    assert_int_not_equal(kubectl(s, out, sizeof out, 20000, "apply", "-f", path, NULL), 0);
    assert_non_null(strstr(out, "minReplicas must not exceed maxReplicas"));
}

/* A CRD of widgets.cel.test with rules at the root (on metadata.name), under spec and under
 * status; extra goes into spec's x-kubernetes-validations (after its own rules). */
static char *widget_crd(const char *plural, const char *kind, const char *extra)
{
    char *text = malloc(4096);
    snprintf(text, 4096,
             "{\"apiVersion\":\"apiextensions.k8s.io/v1\",\"kind\":\"CustomResourceDefinition\","
             "\"metadata\":{\"name\":\"%s.cel.test\"},\"spec\":{\"group\":\"cel.test\",\"scope\":\"Namespaced\","
             "\"names\":{\"plural\":\"%s\",\"kind\":\"%s\"},\"versions\":[{\"name\":\"v1\",\"served\":true,"
             "\"storage\":true,\"subresources\":{\"status\":{}},\"schema\":{\"openAPIV3Schema\":{\"type\":\"object\","
             "\"x-kubernetes-validations\":["
             "{\"rule\":\"self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')\",\"message\":\"name must be a DNS-1035 label\"},"
             "{\"rule\":\"size(self.metadata.name) <= 10\"}],"
             "\"properties\":{\"spec\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
             "\"b\":{\"type\":\"integer\"},\"s\":{\"type\":\"string\"},\"on\":{\"type\":\"boolean\"}},"
             "\"x-kubernetes-validations\":["
             "{\"rule\":\"!has(self.a) || (self.a >= 0 && self.a < 10)\",\"message\":\"a out of range\"},"
             "{\"rule\":\"self.b > 0\",\"message\":\"b must be positive\"},"
             "{\"rule\":\"!has(self.s) || self.s.matches('^[0-9]+$') && self.s.size() <= 3 || self.s == \\\"none\\\"\"},"
             "{\"rule\":\"has(self.on) == false || self.on != true || self.b >= 2\",\"message\":\"on needs b >= 2\"}%s%s]},"
             "\"status\":{\"type\":\"object\",\"properties\":{\"phase\":{\"type\":\"string\"}},"
             "\"x-kubernetes-validations\":[{\"rule\":\"!(self.phase == 'Bad')\",\"message\":\"phase Bad\"}]}}}}}]}}",
             plural, plural, kind, extra ? "," : "", extra ? extra : "");
    return text;
}

static const char CRDS[] = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

static void test_cel_rules_at_the_root_under_spec_and_status(void **state)
{
    standin *s = *state;
    static const char W[] = "/apis/cel.test/v1/namespaces/default/widgets";
    char *crd = widget_crd("widgets", "Widget", NULL);
    cJSON *j;
    assert_int_equal(api(s, "POST", CRDS, "application/json", crd, &j), 201);
    free(crd);
    cJSON_Delete(j);
    static const char fmt[] = "{\"metadata\":{\"name\":\"%s\"},\"spec\":%s}";
    char body[512];
    snprintf(body, sizeof body, fmt, "9w", "{\"b\":1}");
    expect_invalid(s, "POST", W, "application/json", body,
                   "Widget.cel.test \"9w\" is invalid: <nil>: Invalid value: \"object\": name must be a DNS-1035 label",
                   "<nil>");
    snprintf(body, sizeof body, fmt, "abcdefghijk", "{\"b\":1}");
    expect_invalid(s, "POST", W, "application/json", body,
                   "Widget.cel.test \"abcdefghijk\" is invalid: <nil>: Invalid value: \"object\": failed rule: "
                   "size(self.metadata.name) <= 10", "<nil>");
    snprintf(body, sizeof body, fmt, "w1", "{\"a\":20,\"b\":1}");
    expect_invalid(s, "POST", W, "application/json", body,
                   "Widget.cel.test \"w1\" is invalid: spec: Invalid value: \"object\": a out of range", "spec");
    snprintf(body, sizeof body, fmt, "w2", "{\"a\":1}");
    expect_invalid(s, "POST", W, "application/json", body,
                   "Widget.cel.test \"w2\" is invalid: spec: Invalid value: \"object\": no such key: b evaluating "
                   "rule: b must be positive", "spec");
    snprintf(body, sizeof body, fmt, "w3", "{\"b\":1,\"s\":\"1234\"}");
    expect_invalid(s, "POST", W, "application/json", body,
                   "Widget.cel.test \"w3\" is invalid: spec: Invalid value: \"object\": failed rule: !has(self.s) || "
                   "self.s.matches('^[0-9]+$') && self.s.size() <= 3 || self.s == \"none\"", "spec");
    snprintf(body, sizeof body, fmt, "w4", "{\"b\":1,\"on\":true}");
    expect_invalid(s, "POST", W, "application/json", body,
                   "Widget.cel.test \"w4\" is invalid: spec: Invalid value: \"object\": on needs b >= 2", "spec");
    /* two failures, two causes */
    snprintf(body, sizeof body, fmt, "w5", "{\"a\":-1,\"b\":0}");
    assert_int_equal(api(s, "POST", W, "application/json", body, &j), 422);
    assert_int_equal(cJSON_GetArraySize(jpath(j, "details.causes")), 2);
    cJSON_Delete(j);
    snprintf(body, sizeof body, fmt, "w6", "{\"a\":9,\"b\":2,\"s\":\"123\",\"on\":true}");
    assert_int_equal(api(s, "POST", W, "application/json", body, NULL), 201);
    snprintf(body, sizeof body, fmt, "w7", "{\"b\":2,\"s\":\"none\",\"on\":false}");
    assert_int_equal(api(s, "POST", W, "application/json", body, NULL), 201);
    /* a rule under status applies to /status writes */
    expect_invalid(s, "PATCH", "/apis/cel.test/v1/namespaces/default/widgets/w6/status", "application/merge-patch+json",
                   "{\"status\":{\"phase\":\"Bad\"}}",
                   "Widget.cel.test \"w6\" is invalid: status: Invalid value: \"object\": phase Bad", "status");
    assert_int_equal(api(s, "PATCH", "/apis/cel.test/v1/namespaces/default/widgets/w6/status",
                         "application/merge-patch+json", "{\"status\":{\"phase\":\"Good\"}}", NULL), 200);
    /* a type error blocks the rules, as the real server's hasBlockingErr does */
    snprintf(body, sizeof body, fmt, "w8", "{\"a\":\"x\",\"b\":0}");
    assert_int_equal(api(s, "POST", W, "application/json", body, &j), 422);
    assert_non_null(strstr(str_at(j, "message", NULL, NULL), "some validation rules were not checked"));
    cJSON_Delete(j);
}

/* A CRD whose rules the stand-in cannot compile is refused, naming the rule. */
static void test_cel_rules_that_do_not_compile_refuse_the_crd(void **state)
{
    standin *s = *state;
    static const char *const bad[][2] = {
        {"{\"rule\":\"self.a <=\"}", "self.a <="},
        {"{\"rule\":\"self.nope > 1\"}", "undefined field 'nope'"},
        {"{\"rule\":\"oldSelf.a == self.a\"}", "oldSelf"},
        {"{\"rule\":\"self.s.matches('[')\"}", "self.s.matches('[')"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *crd = widget_crd("bads", "Bad", bad[i][0]);
        cJSON *j;
        assert_int_equal(api(s, "POST", CRDS, "application/json", crd, &j), 422);
        const char *msg = str_at(j, "message", NULL, NULL);
        if (!strstr(msg, bad[i][1]) ||
            !strstr(msg, "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[4].rule"))
            fail_msg("%s: %s", bad[i][0], msg);
        cJSON_Delete(j);
        free(crd);
        assert_int_equal(api(s, "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/bads.cel.test",
                             NULL, NULL, NULL), 404);
    }
}

/* An object stored before a rule existed: from 1.30 on (CRDValidationRatcheting) a write that
 * leaves the failing value unchanged passes; before, every write evaluates every rule. */
static void check_ratcheting(standin *s, bool ratchets)
{
    static const char G[] = "/apis/cel.test/v1/namespaces/default/gadgets";
    char *crd = widget_crd("gadgets", "Gadget", NULL);
    cJSON *j = cJSON_Parse(crd), *spec_rules;
    free(crd);
    spec_rules = (cJSON *)jpath(j, "spec.versions[0].schema.openAPIV3Schema.properties.spec");
    cJSON *rules = cJSON_DetachItemFromObject(spec_rules, "x-kubernetes-validations");
    char *text = cJSON_PrintUnformatted(j);
    assert_int_equal(api(s, "POST", CRDS, "application/json", text, NULL), 201);
    free(text);
    assert_int_equal(api(s, "POST", G, "application/json", "{\"metadata\":{\"name\":\"g1\"},\"spec\":{\"a\":50}}", NULL), 201);
    cJSON *stored;
    assert_int_equal(api(s, "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gadgets.cel.test", NULL, NULL, &stored), 200);
    cJSON_AddItemToObject((cJSON *)jpath(stored, "spec.versions[0].schema.openAPIV3Schema.properties.spec"),
                          "x-kubernetes-validations", rules);
    text = cJSON_PrintUnformatted(stored);
    assert_int_equal(api(s, "PUT", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gadgets.cel.test",
                         "application/json", text, NULL), 200);
    free(text);
    cJSON_Delete(stored);
    cJSON_Delete(j);
    long code = api(s, "PATCH", "/apis/cel.test/v1/namespaces/default/gadgets/g1", "application/merge-patch+json",
                    "{\"metadata\":{\"labels\":{\"x\":\"y\"}}}", NULL);
    assert_int_equal(code, ratchets ? 200 : 422);
    char out[8192];
    if (ratchets && have_kubectl()) { /* the failure comes as a warning */
        assert_int_equal(kubectl(s, out, sizeof out, 20000, "label", "gadgets.cel.test", "g1", "z=w", NULL), 0);
        assert_non_null(strstr(out, "Warning: spec: Invalid value: \"object\": a out of range"));
    }
    code = api(s, "PATCH", "/apis/cel.test/v1/namespaces/default/gadgets/g1/status", "application/merge-patch+json",
               "{\"status\":{\"phase\":\"Good\"}}", NULL);
    assert_int_equal(code, ratchets ? 200 : 422);
    assert_int_equal(api(s, "PATCH", "/apis/cel.test/v1/namespaces/default/gadgets/g1", "application/merge-patch+json",
                         "{\"spec\":{\"a\":60,\"b\":1}}", NULL), 422);
}

static void test_cel_ratcheting_follows_the_kube_version(void **state)
{
    standin t = {0};
    static const char *const v26[] = {"--kube-version", "26", "--kubelet-mode", "off", NULL};
    check_ratcheting(*state, true);
    standin_start(&t, v26);
    check_ratcheting(&t, false);
    standin_stop(&t);
}

static void test_kube_version_24_drops_validation_rules(void **state)
{
    standin t = {0};
    static const char *const v24[] = {"--kube-version", "24", "--kubelet-mode", "off", NULL};
    cJSON *j;
    char *text;
    (void)state;
    standin_start(&t, v24);
    assert_int_equal(api(&t, "GET", "/version", NULL, NULL, &j), 200);
    assert_string_equal(str_at(j, "minor", NULL, NULL), "24");
    assert_memory_equal(str_at(j, "gitVersion", NULL, NULL), "v1.24.", 6);
    cJSON_Delete(j);
    /* even a rule that does not compile: the alpha gate is off, the rules are dropped */
    char *crd = widget_crd("widgets", "Widget", "{\"rule\":\"self.a <=\"}");
    assert_int_equal(api(&t, "POST", CRDS, "application/json", crd, &j), 201);
    free(crd);
    text = cJSON_PrintUnformatted(j);
    assert_null(strstr(text, "x-kubernetes-validations"));
    free(text);
    cJSON_Delete(j);
    assert_int_equal(api(&t, "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.cel.test",
                         NULL, NULL, &j), 200);
    text = cJSON_PrintUnformatted(j);
    assert_null(strstr(text, "x-kubernetes-validations"));
    free(text);
    cJSON_Delete(j);
    assert_int_equal(api(&t, "POST", "/apis/cel.test/v1/namespaces/default/widgets", "application/json",
                         "{\"metadata\":{\"name\":\"9w\"},\"spec\":{\"a\":20}}", NULL), 201);
    standin_stop(&t);
}

static double stat_of(const standin *s, const char *key)
{
    cJSON *j;
    assert_int_equal(api(s, "GET", "/standin/stats", NULL, NULL, &j), 200);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    double n = cJSON_IsNumber(v) ? v->valuedouble : -1;
    cJSON_Delete(j);
    return n;
}

static void sleeper(standin *s, const char *name)
{
    char body[512];
    snprintf(body, sizeof body,
             "{\"metadata\":{\"name\":\"%s\"},\"spec\":{\"restartPolicy\":\"Never\",\"containers\":"
             "[{\"name\":\"c\",\"image\":\"x\",\"command\":[\"sleep\",\"30\"]}]}}", name);
    assert_int_equal(api(s, "POST", "/api/v1/namespaces/peaks/pods", "application/json", body, NULL), 201);
}

static void test_stats_report_live_and_peak_pods_per_namespace(void **state)
{
    standin *s = *state;
    cJSON *j;
    assert_int_equal(api(s, "POST", "/api/v1/namespaces", "application/json", "{\"metadata\":{\"name\":\"peaks\"}}", NULL), 201);
    sleeper(s, "p1");
    sleeper(s, "p2");
    sleeper(s, "p3");
    assert_true(stat_of(s, "live pods peaks") == 3);
    assert_true(stat_of(s, "peak pods peaks") == 3);
    cJSON_Delete(wait_for(s, "/api/v1/namespaces/peaks/pods/p1", "status", "phase", "Running", 10000));
    /* a pod being deleted (deletionTimestamp set, still there) no longer counts */
    assert_int_equal(api(s, "DELETE", "/api/v1/namespaces/peaks/pods/p1", NULL, NULL, &j), 200);
    cJSON_Delete(j);
    assert_int_equal(api(s, "DELETE", "/api/v1/namespaces/peaks/pods/p2?gracePeriodSeconds=0", NULL, NULL, NULL), 200);
    assert_true(stat_of(s, "live pods peaks") == 1);
    assert_true(stat_of(s, "peak pods peaks") == 3);
    assert_int_equal(api(s, "DELETE", "/standin/stats", NULL, NULL, NULL), 200);
    assert_true(stat_of(s, "peak pods peaks") == 1);
    sleeper(s, "p4");
    assert_true(stat_of(s, "live pods peaks") == 2);
    assert_true(stat_of(s, "peak pods peaks") == 2);
    assert_int_equal(api(s, "DELETE", "/api/v1/namespaces/peaks", NULL, NULL, NULL), 200);
}

typedef struct timed {
    standin *s;
    const char *name;
    long code;
    int64_t took;
} timed;

static void *create_cm(void *arg)
{
    timed *t = arg;
    char body[128];
    int64_t t0 = harness_now_ms();
    snprintf(body, sizeof body, "{\"metadata\":{\"name\":\"%s\"}}", t->name);
    t->code = api_full(t->s, "POST", "/api/v1/namespaces/default/configmaps", "application/json",
                       body, strlen(body), NULL, 5000, NULL);
    t->took = harness_now_ms() - t0;
    return NULL;
}

/* A fault with delayMs and no code only delays (count -1: every request), each on its own:
 * concurrent requests wait side by side and others go on meanwhile. */
static void test_a_delay_fault_delays_each_request_on_its_own(void **state)
{
    standin *s = *state;
    timed a = {s, "slow-a", 0, 0}, b = {s, "slow-b", 0, 0};
    pthread_t ta, tb;
    assert_int_equal(api(s, "POST", "/standin/faults", "application/json",
                         "{\"verb\":\"create\",\"resource\":\"configmaps\",\"delayMs\":400,\"count\":-1}", NULL), 201);
    double before = stat_of(s, "create configmaps"); /* -1: none yet */
    before = before < 0 ? 0 : before;
    int64_t t0 = harness_now_ms();
    pthread_create(&ta, NULL, create_cm, &a);
    pthread_create(&tb, NULL, create_cm, &b);
    /* both creates inside their 400 ms delay: the stand-in counts a request before it waits */
    assert_true(HARNESS_WAIT_UNTIL(stat_of(s, "create configmaps") >= before + 2, 5000));
    int64_t g0 = harness_now_ms();
    assert_int_equal(api(s, "GET", "/api/v1/namespaces/default/configmaps", NULL, NULL, NULL), 200);
    int64_t got = harness_now_ms() - g0;
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    int64_t both = harness_now_ms() - t0;
    assert_int_equal(api(s, "DELETE", "/standin/faults", NULL, NULL, NULL), 200);
    assert_int_equal(a.code, 201);
    assert_int_equal(b.code, 201);
    assert_true(a.took >= 400 && b.took >= 400);
    if (both >= 750 || got >= 250)
        fail_msg("the delays were not side by side: both took %lld ms, a get meanwhile %lld ms",
                 (long long)both, (long long)got);
    assert_int_equal(api(s, "GET", "/api/v1/namespaces/default/configmaps/slow-b", NULL, NULL, NULL), 200);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kubectl_applies_the_crd_and_a_trainingjob),
        cmocka_unit_test(test_status_and_spec_writes_stay_apart),
        cmocka_unit_test(test_stale_resource_version_put_conflicts),
        cmocka_unit_test(test_watch_history_expiry_bookmarks_and_labels),
        cmocka_unit_test(test_finalizers_hold_a_deletion),
        cmocka_unit_test(test_owner_deletion_cascades_unless_orphaned),
        cmocka_unit_test(test_bad_requests_get_statuses_and_change_nothing),
        cmocka_unit_test(test_kubelet_runs_a_pod_with_downward_env_and_a_secret_volume),
        cmocka_unit_test(test_graceful_delete_sends_sigterm_then_sigkill),
        cmocka_unit_test(test_injected_fault_fails_a_create_and_stats_count_it),
        cmocka_unit_test(test_token_and_gone_in_stream),
        cmocka_unit_test(test_names_and_label_values_are_checked_per_kind),
        cmocka_unit_test(test_service_account_admission_mounts_a_token_volume),
        cmocka_unit_test(test_cel_rules_of_the_trainingjob_crd),
        cmocka_unit_test(test_cel_rules_at_the_root_under_spec_and_status),
        cmocka_unit_test(test_cel_rules_that_do_not_compile_refuse_the_crd),
        cmocka_unit_test(test_cel_ratcheting_follows_the_kube_version),
        cmocka_unit_test(test_kube_version_24_drops_validation_rules),
        cmocka_unit_test(test_stats_report_live_and_peak_pods_per_namespace),
        cmocka_unit_test(test_a_delay_fault_delays_each_request_on_its_own),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    curl_global_cleanup();
    return rc;
}

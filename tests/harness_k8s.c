/* harness_k8s.c: a stand-in Kubernetes cluster for a test (tests/k8s_standin: the API server
 * stand-in with its kubelet stand-in, started as a real process on a free loopback port) and
 * the real kubectl pointed at it through a kubeconfig of its own. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "harness.h"

struct harness_k8s {
    pid_t pid;
    int port;
    char dir[256];
    char kubeconfig[300];
    char url[64];
};

bool harness_kubectl_available(void)
{
    if (access(EDL_KUBECTL_BIN, X_OK) == 0)
        return true;
    fprintf(stderr, "harness: %s is missing: run scripts/install-deps (kubectl from npm)\n",
            EDL_KUBECTL_BIN);
    return false;
}

static void write_kubeconfig(harness_k8s *k)
{
    FILE *f = fopen(k->kubeconfig, "w");
    if (!f)
        fail_msg("cannot write %s", k->kubeconfig);
    fprintf(f, "apiVersion: v1\nkind: Config\n"
               "clusters:\n- name: standin\n  cluster:\n    server: %s\n"
               "users:\n- name: tester\n  user: {}\n"
               "contexts:\n- name: standin\n  context: {cluster: standin, user: tester, "
               "namespace: default}\n"
               "current-context: standin\n", k->url);
    fclose(f);
}

harness_k8s *harness_k8s_open(const char *const *extra_args)
{
    harness_k8s *k = calloc(1, sizeof *k);
    snprintf(k->dir, sizeof k->dir, "/tmp/edl-k8s-XXXXXX");
    if (!mkdtemp(k->dir))
        fail_msg("mkdtemp failed");
    char ready[300], root[300], log[300];
    snprintf(ready, sizeof ready, "%s/port", k->dir);
    snprintf(root, sizeof root, "%s/kubelet", k->dir);
    snprintf(log, sizeof log, "%s/standin.log", k->dir);
    mkdir(root, 0700);
    const char *argv[32] = {EDL_K8S_STANDIN_BIN, "--port", "0", "--ready-file", ready,
                            "--kubelet-root", root};
    size_t n = 7;
    for (size_t i = 0; extra_args && extra_args[i] && n < 31; i++)
        argv[n++] = extra_args[i];
    k->pid = harness_spawn(argv, log);
    char buf[32] = "";
    for (int i = 0; i < 200 && !buf[0]; i++) {
        harness_sleep_ms(25);
        harness_read_file(ready, buf, sizeof buf);
    }
    k->port = atoi(buf);
    if (k->port <= 0) {
        char out[4096];
        fail_msg("the stand-in API server did not start: %s", harness_read_file(log, out, sizeof out));
    }
    snprintf(k->url, sizeof k->url, "http://127.0.0.1:%d", k->port);
    snprintf(k->kubeconfig, sizeof k->kubeconfig, "%s/kubeconfig", k->dir);
    write_kubeconfig(k);
    return k;
}

const char *harness_k8s_kubeconfig(const harness_k8s *k) { return k->kubeconfig; }
const char *harness_k8s_url(const harness_k8s *k) { return k->url; }
const char *harness_k8s_dir(const harness_k8s *k) { return k->dir; }

int harness_kubectl(harness_k8s *k, char *out, size_t outlen, const char *args_fmt, ...)
{
    char *args = NULL;
    va_list ap;
    va_start(ap, args_fmt);
    int n = vasprintf(&args, args_fmt, ap);
    va_end(ap);
    if (n < 0)
        return -1;
    char *cmd = NULL;
    n = asprintf(&cmd, "%s --kubeconfig %s --cache-dir %s/kcache %s", EDL_KUBECTL_BIN,
                 k->kubeconfig, k->dir, args);
    free(args);
    if (n < 0)
        return -1;
    if (out && outlen)
        out[0] = '\0';
    int rc = harness_shell(cmd, out, outlen);
    free(cmd);
    return rc;
}

void harness_kubectl_wait(harness_k8s *k, const char *what, const char *jsonpath,
                          const char *want, int timeout_ms)
{
    char out[4096] = "";
    if (HARNESS_WAIT_UNTIL(harness_kubectl(k, out, sizeof out, "get %s -o jsonpath='%s' "
                                           "2>/dev/null", what, jsonpath) == 0 &&
                           strcmp(out, want) == 0, timeout_ms))
        return;
    fail_msg("kubectl get %s -o jsonpath='%s': \"%s\", waited %d ms for \"%s\"", what, jsonpath,
             out, timeout_ms, want);
}

/* GET a test-only endpoint of the stand-in, parsed. */
static cJSON *standin_json(harness_k8s *k, const char *path)
{
    static char body[1 << 16];
    if (harness_http_get(k->port, path, body, sizeof body) != 200)
        fail_msg("GET %s failed", path);
    const char *json = strstr(body, "\r\n\r\n");
    return cJSON_Parse(json ? json + 4 : body);
}

void harness_k8s_fault(harness_k8s *k, const char *json)
{
    char req[4096], out[4096];
    int n = json ? snprintf(req, sizeof req, "POST /standin/faults HTTP/1.1\r\nHost: x\r\n"
                            "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                            "Connection: close\r\n\r\n%s", strlen(json), json)
                 : snprintf(req, sizeof req, "DELETE /standin/faults HTTP/1.1\r\nHost: x\r\n"
                            "Connection: close\r\n\r\n");
    int status = harness_http_request(k->port, req, (size_t)n, out, sizeof out);
    if (status < 200 || status > 299)
        fail_msg("stand-in fault %s: HTTP %d: %s", json ? json : "(clear)", status, out);
}

cJSON *harness_k8s_access(harness_k8s *k)
{
    return standin_json(k, "/standin/access");
}

long harness_k8s_stat(harness_k8s *k, const char *counter)
{
    cJSON *j = standin_json(k, "/standin/stats");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, counter);
    long n = cJSON_IsNumber(v) ? (long)v->valuedouble : 0;
    cJSON_Delete(j);
    return n;
}

void harness_k8s_close(harness_k8s *k)
{
    if (!k)
        return;
    if (k->pid > 0) {
        harness_kill(k->pid, SIGTERM); /* it stops its pods */
        if (harness_wait_exit(k->pid, 5000) == -1)
            harness_kill(k->pid, SIGKILL);
    }
    if (!getenv("EDL_TEST_KEEP"))
        harness_rmtree(k->dir);
    free(k);
}

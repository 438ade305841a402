/* test_helm.c: the Helm chart (charts/edl) with the real helm 3.17.3: one CRD source, lint
 * --strict, templates with the default values and each documented option, a typo in the values
 * refused by values.schema.json, the rendered manifests applied with the real kubectl to the
 * stand-in API server, the in-chart etcd's generated certificates serving a real three-member
 * etcd with the StatefulSet's own TLS flags, and those certificates kept by `lookup` when the
 * chart is rendered again against the cluster. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <unistd.h>

#include "edl/etcd.h"

#include <cmocka.h>

#include "harness.h"

#define HELM EDL_SOURCE_DIR "/tests/.kube/bin/helm"
#define CHART EDL_SOURCE_DIR "/charts/edl"

static int helm(char *out, size_t len, const char *args)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", HELM, args);
    return harness_shell(cmd, out, len);
}

static void test_the_chart_holds_the_one_crd(void **state)
{
    (void)state;
    char out[256];
    assert_int_equal(harness_shell("cmp " EDL_SOURCE_DIR "/deploy/k8s/crd.yaml " CHART
                                   "/crds/trainingjobs.edl.dev.yaml", out, sizeof out), 0);
}

/* Names as `helm create`'s charts make them, and as the docs give them: the release's name alone
 * when it holds the chart's ("edl" -> edl-operator, edl-etcd), else release-chart. */
static void test_names_follow_the_release_and_the_docs_say_them(void **state)
{
    (void)state;
    static char out[1 << 17], doc[1 << 16];
    assert_int_equal(helm(out, sizeof out, "template edl " CHART " -n edl-system"), 0);
    assert_non_null(strstr(out, "kind: Deployment\nmetadata:\n  name: edl-operator\n"));
    assert_non_null(strstr(out, "kind: StatefulSet\nmetadata:\n  name: edl-etcd\n"));
    assert_non_null(strstr(out, "--leader-elect-resource-name=edl-operator\n"));
    /* the Deployment runs the operator's own program, not the job server's alias */
    assert_non_null(strstr(out, "command:\n            - edl-operator\n"));
    assert_null(strstr(out, "--kubernetes"));
    assert_null(strstr(out, "edl-edl"));
    assert_int_equal(helm(out, sizeof out, "template my-edl " CHART), 0);
    assert_non_null(strstr(out, "  name: my-edl-operator\n"));
    assert_int_equal(helm(out, sizeof out, "template t " CHART), 0);
    assert_non_null(strstr(out, "  name: t-edl-operator\n"));
    /* what the docs tell a new user to type names what `helm install edl` makes */
    harness_read_file(EDL_SOURCE_DIR "/docs/install.md", doc, sizeof doc);
    assert_non_null(strstr(doc, "rollout status statefulset/edl-etcd\n"));
    assert_non_null(strstr(doc, "rollout status deployment/edl-operator\n"));
    harness_read_file(EDL_SOURCE_DIR "/docs/kubernetes.md", doc, sizeof doc);
    assert_non_null(strstr(doc, "logs deploy/edl-operator"));
    assert_non_null(strstr(doc, "Lease `edl-system/edl-operator`"));
    assert_null(strstr(doc, "edl-edl"));
}

static void test_lint_strict_and_templates_with_each_option(void **state)
{
    (void)state;
    static char out[1 << 17];
    assert_int_equal(helm(out, sizeof out, "lint --strict " CHART), 0);
    assert_int_equal(helm(out, sizeof out, "template t " CHART), 0);
    assert_non_null(strstr(out, "kind: ClusterRole\n"));
    assert_non_null(strstr(out, "--all-namespaces"));
    assert_non_null(strstr(out, "readOnlyRootFilesystem: true"));
    assert_null(strstr(out, "ServiceMonitor"));
    /* the in-chart etcd: three members, TLS on both ports, certificates generated */
    assert_non_null(strstr(out, "kind: StatefulSet"));
    assert_non_null(strstr(out, "--initial-cluster=t-edl-etcd-0=https://t-edl-etcd-0.t-edl-etcd-"
                                "peer.default.svc:2380,t-edl-etcd-1=https://t-edl-etcd-1.t-edl-"
                                "etcd-peer.default.svc:2380,t-edl-etcd-2=https://t-edl-etcd-2.t-"
                                "edl-etcd-peer.default.svc:2380\n"));
    assert_non_null(strstr(out, "--client-cert-auth\n"));
    assert_non_null(strstr(out, "--peer-client-cert-auth\n"));
    assert_non_null(strstr(out, "minAvailable: 2\n"));
    assert_non_null(strstr(out, "name: t-edl-etcd-client-tls"));
    assert_non_null(strstr(out, "value: \"https://t-edl-etcd.default.svc:2379\""));
    assert_non_null(strstr(out, "secretName: t-edl-etcd-client-tls"));
    assert_non_null(strstr(out, "--cert=/etc/edl/etcd/tls.crt"));
    assert_int_equal(helm(out, sizeof out, "template t " CHART " --set etcd.replicas=5 "
                          "--set etcd.storage.storageClassName=fast --set etcd.serverSecret=s "
                          "--set etcd.peerSecret=p --set etcd.clientSecret=c"), 0);
    assert_non_null(strstr(out, "t-edl-etcd-4=https://"));
    assert_non_null(strstr(out, "minAvailable: 3\n"));
    assert_non_null(strstr(out, "storageClassName: fast"));
    assert_non_null(strstr(out, "secretName: s,"));
    assert_non_null(strstr(out, "secretName: p,"));
    assert_null(strstr(out, "kind: Secret")); /* nothing generated */
    assert_int_not_equal(helm(out, sizeof out, "template t " CHART " --set etcd.serverSecret=s"),
                         0);
    assert_non_null(strstr(out, "come together"));
    /* an existing etcd instead */
    assert_int_equal(helm(out, sizeof out, "template t " CHART " --namespace team "
                          "--set operator.allNamespaces=false --set etcd.install=false "
                          "--set etcd.clientSecret=etcd-client "
                          "--set etcd.endpoints=https://etcd:2379 "
                          "--set operator.metrics.serviceMonitor=true"), 0);
    assert_non_null(strstr(out, "kind: Role\n"));
    assert_non_null(strstr(out, "--namespace=team"));
    assert_non_null(strstr(out, "secretName: etcd-client"));
    assert_non_null(strstr(out, "value: \"https://etcd:2379\""));
    assert_non_null(strstr(out, "kind: ServiceMonitor"));
    assert_null(strstr(out, "StatefulSet"));
    assert_int_not_equal(helm(out, sizeof out, "template t " CHART " --set etcd.install=false"),
                         0);
    assert_non_null(strstr(out, "etcd.endpoints"));
    /* the bound on a job's pods: the operator's --max-replicas, 1,024 as the CRD's maximum,
     * raised by a value */
    assert_int_equal(helm(out, sizeof out, "template t " CHART), 0);
    assert_non_null(strstr(out, "- --max-replicas=1024\n"));
    assert_int_equal(helm(out, sizeof out, "template t " CHART
                          " --set operator.maxReplicas=4096"), 0);
    assert_non_null(strstr(out, "- --max-replicas=4096\n"));
    assert_int_not_equal(helm(out, sizeof out, "template t " CHART
                              " --set operator.maxReplicas=0"), 0);
    assert_non_null(strstr(out, "maxReplicas"));
    /* a typo or a wrong type in the values fails with the field named */
    assert_int_not_equal(helm(out, sizeof out, "template t " CHART " --set operator.replicass=2"),
                         0);
    assert_non_null(strstr(out, "replicass"));
    assert_int_not_equal(helm(out, sizeof out, "template t " CHART
                              " --set etcd.endpoints=etcd:2379"), 0);
    assert_non_null(strstr(out, "etcd.endpoints"));
}

static void test_rendered_manifests_apply_to_the_api_server(void **state)
{
    (void)state;
    if (!harness_kubectl_available())
        skip();
    harness_k8s *k = harness_k8s_open(NULL);
    char out[8192], args[1024];
    snprintf(args, sizeof args, "template t " CHART " --include-crds > %s/rendered.yaml",
             harness_k8s_dir(k));
    assert_int_equal(helm(out, sizeof out, args), 0);
    int rc = harness_kubectl(k, out, sizeof out, "apply -f %s/rendered.yaml 2>&1",
                             harness_k8s_dir(k));
    if (rc != 0)
        fail_msg("kubectl apply of the chart: %s", out);
    assert_int_equal(harness_kubectl(k, out, sizeof out, "get crd trainingjobs.edl.dev -o name"),
                     0);
    /* the CRD as served has spec.teachers (a role with its service) and status.teachers */
    assert_int_equal(harness_kubectl(k, out, sizeof out, "get crd trainingjobs.edl.dev -o "
                                     "jsonpath='{.spec.versions[0].schema.openAPIV3Schema"
                                     ".properties.spec.properties.teachers.required}"
                                     "{.spec.versions[0].schema.openAPIV3Schema.properties"
                                     ".status.properties.teachers.properties.ready.type}'"), 0);
    assert_string_equal(out, "[\"service\",\"template\"]integer");
    assert_int_equal(harness_kubectl(k, out, sizeof out, "get clusterrole t-edl-operator "
                                     "-o jsonpath='{.rules[*].resources}'"), 0);
    assert_non_null(strstr(out, "trainingjobs/status"));
    harness_k8s_close(k);
}

/* ---- monitoring (docs/observability.md) ------------------------------------------------- */

/* Each switch renders its one object and nothing else; all off, none: the chart installs
 * without the Prometheus operator's CRDs. */
static void test_monitoring_switches_render_their_objects(void **state)
{
    (void)state;
    static char out[1 << 17];
    static const char *const kinds[] = {"grafana_dashboard: \"1\"", "kind: PodMonitor",
                                        "kind: PrometheusRule"};
    static const char *const sets[] = {"monitoring.dashboard=true", "monitoring.podMonitor=true",
                                       "monitoring.rules.enabled=true"};
    assert_int_equal(helm(out, sizeof out, "template t " CHART), 0);
    for (int k = 0; k < 3; k++)
        assert_null(strstr(out, kinds[k]));
    assert_null(strstr(out, "--agent-metrics-port"));
    for (int s = 0; s < 3; s++) {
        char args[256];
        snprintf(args, sizeof args, "template t " CHART " --set %s", sets[s]);
        assert_int_equal(helm(out, sizeof out, args), 0);
        for (int k = 0; k < 3; k++)
            if ((strstr(out, kinds[k]) != NULL) != (k == s))
                fail_msg("--set %s: '%s' %s", sets[s], kinds[k], k == s ? "missing" : "rendered");
        /* what the PodMonitor scrapes: the operator gives the agents their port */
        assert_true((strstr(out, "- --agent-metrics-port=9400\n") != NULL) == (s == 1));
    }
    assert_int_equal(helm(out, sizeof out, "template t " CHART " --set monitoring.rules.enabled"
                          "=true --set monitoring.rules.stalledSeconds=120 --set "
                          "monitoring.rules.for=1m"), 0);
    assert_non_null(strstr(out, "edl_agent_trainer_last_step_timestamp_seconds) > 120 and"));
    assert_non_null(strstr(out, "for: 1m\n"));
    assert_int_not_equal(helm(out, sizeof out, "template t " CHART
                              " --set monitoring.rules.for=soon"), 0);
    assert_non_null(strstr(out, "for"));
}

/* The dashboard's ConfigMap, the PodMonitor and the PrometheusRule, as a cluster with the
 * Prometheus operator's CRDs takes them: `kubectl apply --dry-run=server`. */
static void test_monitoring_objects_apply_with_the_operators_crds(void **state)
{
    (void)state;
    if (!harness_kubectl_available())
        skip();
    harness_k8s *k = harness_k8s_open(NULL);
    static char out[1 << 16];
    char args[1024];
    snprintf(args, sizeof args, "template t " CHART " --set monitoring.dashboard=true --set "
             "monitoring.podMonitor=true --set monitoring.rules.enabled=true --show-only "
             "templates/monitoring.yaml > %s/monitoring.yaml", harness_k8s_dir(k));
    assert_int_equal(helm(out, sizeof out, args), 0);
    int rc = harness_kubectl(k, out, sizeof out, "apply -f " EDL_SOURCE_DIR
                             "/tests/fixtures/monitoring-crds.yaml 2>&1");
    if (rc != 0)
        fail_msg("kubectl apply of the monitoring CRDs: %s", out);
    rc = harness_kubectl(k, out, sizeof out, "apply --dry-run=server -f %s/monitoring.yaml 2>&1",
                         harness_k8s_dir(k));
    if (rc != 0)
        fail_msg("kubectl apply --dry-run=server of the monitoring objects: %s", out);
    assert_non_null(strstr(out, "configmap/t-edl-dashboard created (server dry run)"));
    assert_non_null(strstr(out, "podmonitor.monitoring.coreos.com/t-edl-jobs created"));
    assert_non_null(strstr(out, "prometheusrule.monitoring.coreos.com/t-edl-alerts "
                                "created"));
    /* a dry run: nothing stays */
    assert_int_not_equal(harness_kubectl(k, out, sizeof out, "get configmap "
                                         "t-edl-dashboard 2>&1"), 0);
    harness_k8s_close(k);
}

/* ---- the in-chart etcd's certificates, for real ---------------------------------------- */

#define ETCD_MEMBERS 3

/* Renders the chart into the stand-in's namespace `sys` and applies it. */
static void apply_chart(harness_k8s *k)
{
    char out[8192], args[1024];
    snprintf(args, sizeof args, "template t " CHART " -n sys --include-crds > %s/rendered.yaml",
             harness_k8s_dir(k));
    assert_int_equal(helm(out, sizeof out, args), 0);
    assert_int_equal(harness_kubectl(k, out, sizeof out, "create namespace sys"), 0);
    if (harness_kubectl(k, out, sizeof out, "apply -n sys -f %s/rendered.yaml 2>&1",
                        harness_k8s_dir(k)) != 0)
        fail_msg("kubectl apply of the chart: %s", out);
}

/* Secret t-edl-etcd-<role>-tls as the pods mount it: <dir>/<role>/{ca.crt,tls.crt,tls.key}. */
static void save_secret(harness_k8s *k, const char *role, const char *dir)
{
    static const char *const keys[][2] = {{"ca.crt", "ca\\.crt"}, {"tls.crt", "tls\\.crt"},
                                          {"tls.key", "tls\\.key"}};
    char out[512], cmd[512];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/%s", dir, role);
    assert_int_equal(harness_shell(cmd, out, sizeof out), 0);
    for (int i = 0; i < 3; i++)
        if (harness_kubectl(k, out, sizeof out, "-n sys get secret t-edl-etcd-%s-tls -o "
                            "jsonpath='{.data.%s}' | base64 -d > %s/%s/%s", role, keys[i][1],
                            dir, role, keys[i][0]) != 0)
            fail_msg("secret t-edl-etcd-%s-tls, key %s: %s", role, keys[i][0], out);
}

/* The StatefulSet's etcd flags that do not name a member: the TLS ones and the rest, with the
 * certificate directories /etc/etcd/<role> moved under dir. */
static int chart_etcd_flags(harness_k8s *k, const char *dir, char flags[][512], int max)
{
    static char out[1 << 14];
    assert_int_equal(harness_kubectl(k, out, sizeof out, "-n sys get statefulset t-edl-etcd -o "
                     "jsonpath='{range .spec.template.spec.containers[0].command[*]}{@}{\"\\n\"}"
                     "{end}'"), 0);
    static const char *const per_member[] = {"--name=", "--data-dir=", "--listen-",
                                             "--advertise-", "--initial-"};
    int n = 0;
    for (char *save = NULL, *l = strtok_r(out, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        bool skip = strncmp(l, "--", 2) != 0;
        for (size_t i = 0; i < sizeof per_member / sizeof per_member[0]; i++)
            skip = skip || strncmp(l, per_member[i], strlen(per_member[i])) == 0;
        if (skip || n == max)
            continue;
        const char *at = strstr(l, "/etc/etcd/");
        if (at)
            snprintf(flags[n++], 512, "%.*s%s/%s", (int)(at - l), l, dir, at + 10);
        else
            snprintf(flags[n++], 512, "%s", l);
    }
    return n;
}

static pid_t start_member(const char *dir, int i, const int ports[][3], char flags[][512],
                          int n_flags)
{
    char own[7][512], cluster[600] = "", log[512];
    for (int m = 0; m < ETCD_MEMBERS; m++)
        snprintf(cluster + strlen(cluster), sizeof cluster - strlen(cluster),
                 "%sm%d=https://127.0.0.1:%d", m ? "," : "", m, ports[m][1]);
    snprintf(own[0], 512, "--name=m%d", i);
    snprintf(own[1], 512, "--data-dir=%s/m%d", dir, i);
    snprintf(own[2], 512, "--listen-client-urls=https://127.0.0.1:%d", ports[i][0]);
    snprintf(own[3], 512, "--advertise-client-urls=https://127.0.0.1:%d", ports[i][0]);
    snprintf(own[4], 512, "--listen-peer-urls=https://127.0.0.1:%d", ports[i][1]);
    snprintf(own[5], 512, "--initial-advertise-peer-urls=https://127.0.0.1:%d", ports[i][1]);
    snprintf(own[6], 512, "--listen-metrics-urls=http://127.0.0.1:%d", ports[i][2]);
    const char *argv[48] = {EDL_ETCD_BIN};
    int n = 1;
    for (int f = 0; f < 7; f++)
        argv[n++] = own[f];
    char initial[700];
    snprintf(initial, sizeof initial, "--initial-cluster=%s", cluster);
    argv[n++] = initial;
    for (int f = 0; f < n_flags && n < 47; f++)
        argv[n++] = flags[f];
    argv[n] = NULL;
    snprintf(log, sizeof log, "%s/m%d.log", dir, i);
    return harness_spawn(argv, log);
}

static edl_etcd *client_of(const int ports[][3], const char *dir, bool with_cert)
{
    char eps[200], ca[300], cert[300], key[300];
    snprintf(eps, sizeof eps, "https://127.0.0.1:%d,https://127.0.0.1:%d", ports[0][0],
             ports[1][0]);
    snprintf(ca, sizeof ca, "%s/client/ca.crt", dir);
    snprintf(cert, sizeof cert, "%s/client/tls.crt", dir);
    snprintf(key, sizeof key, "%s/client/tls.key", dir);
    return harness_tls_client(eps, 3000, ca, with_cert ? cert : NULL, with_cert ? key : NULL);
}

/* The certificates the chart generates, mounted as its StatefulSet mounts them, with every flag
 * of its etcd command that does not name a member: a real three-member etcd forms over peer
 * TLS, serves edl's client certificate, and refuses a client without one. */
static void test_generated_certificates_serve_a_tls_etcd_cluster(void **state)
{
    (void)state;
    if (!harness_kubectl_available())
        skip();
    harness_k8s *k = harness_k8s_open(NULL);
    apply_chart(k);
    char dir[200], out[4096], cmd[1024];
    snprintf(dir, sizeof dir, "%s/etcd", harness_k8s_dir(k));
    save_secret(k, "server", dir);
    save_secret(k, "peer", dir);
    save_secret(k, "client", dir);
    /* one CA signs all; the serving certificate names the Service and every member */
    snprintf(cmd, sizeof cmd, "cd %s && openssl verify -CAfile server/ca.crt server/tls.crt "
             "peer/tls.crt client/tls.crt && openssl x509 -in server/tls.crt -noout -ext "
             "subjectAltName", dir);
    if (harness_shell(cmd, out, sizeof out) != 0)
        fail_msg("openssl: %s", out);
    assert_non_null(strstr(out, "DNS:t-edl-etcd.sys.svc,"));
    assert_non_null(strstr(out, "DNS:*.t-edl-etcd-peer.sys.svc,"));
    static char flags[32][512];
    int n_flags = chart_etcd_flags(k, dir, flags, 32);
    int tls_flags = 0;
    for (int f = 0; f < n_flags; f++)
        tls_flags += !strcmp(flags[f], "--client-cert-auth") ||
                     !strcmp(flags[f], "--peer-client-cert-auth");
    assert_int_equal(tls_flags, 2);
    int ports[ETCD_MEMBERS][3];
    pid_t pids[ETCD_MEMBERS];
    for (int i = 0; i < ETCD_MEMBERS; i++)
        for (int p = 0; p < 3; p++)
            ports[i][p] = harness_free_port();
    for (int i = 0; i < ETCD_MEMBERS; i++)
        pids[i] = start_member(dir, i, ports, flags, n_flags);
    for (int i = 0; i < ETCD_MEMBERS; i++) { /* each member healthy: the cluster formed */
        if (!HARNESS_WAIT_UNTIL(harness_http_get(ports[i][2], "/health", out, sizeof out) == 200
                                && strstr(out, "\"true\""), 20000))
            fail_msg("etcd member %d not healthy (see %s/m%d.log)", i, dir, i);
    }
    edl_etcd *c = client_of(ports, dir, true);
    harness_put(c, "chart/k", "v");
    char v[8];
    assert_string_equal(harness_get(c, "chart/k", v, sizeof v), "v");
    edl_etcd_close(c);
    c = client_of(ports, dir, false);
    edl_kv *kv;
    int rc = edl_etcd_get(c, edl_str("chart/k"), &kv, NULL);
    assert_true(rc == EDL_EAUTH || rc == EDL_EUNAVAIL);
    edl_etcd_close(c);
    for (int i = 0; i < ETCD_MEMBERS; i++) {
        harness_kill(pids[i], SIGKILL);
        harness_wait_exit(pids[i], 5000);
    }
    harness_k8s_close(k);
}

/* The server certificate (base64) that `helm install --dry-run=server` renders. */
static void server_cert_of_dry_run(harness_k8s *k, char *out, size_t len)
{
    const char *d = harness_k8s_dir(k);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "KUBECONFIG=%s HELM_CACHE_HOME=%s/hc HELM_CONFIG_HOME=%s/hcfg "
             "HELM_DATA_HOME=%s/hd %s install t %s -n sys --dry-run=server "
             "--disable-openapi-validation > %s/again.yaml 2>&1", harness_k8s_kubeconfig(k), d,
             d, d, HELM, CHART, d);
    if (harness_shell(cmd, out, len) != 0) {
        snprintf(cmd, sizeof cmd, "%s/again.yaml", d);
        fail_msg("helm install --dry-run=server: %s", harness_read_file(cmd, out, len));
    }
    snprintf(cmd, sizeof cmd, "sed -n '/name: t-edl-etcd-server-tls/,/^---/p' %s/again.yaml "
             "| sed -n 's/^  tls.crt: //p'", d);
    assert_int_equal(harness_shell(cmd, out, len), 0);
}

/* Rendered again against a cluster holding the release's certificate Secrets (an upgrade),
 * the chart keeps them: `lookup`, through the real helm (--dry-run=server looks up; the
 * stand-in serves no /openapi/v2 for helm's validation). */
static void test_upgrade_keeps_the_generated_certificates(void **state)
{
    (void)state;
    if (!harness_kubectl_available())
        skip();
    harness_k8s *k = harness_k8s_open(NULL);
    const char *d = harness_k8s_dir(k);
    char out[4096], args[1024];
    assert_int_equal(harness_kubectl(k, out, sizeof out, "create namespace sys"), 0);
    snprintf(args, sizeof args, "template t " CHART " -n sys --show-only "
             "templates/etcd-certificates.yaml > %s/certs.yaml", d);
    assert_int_equal(helm(out, sizeof out, args), 0);
    assert_int_equal(harness_kubectl(k, out, sizeof out, "apply -n sys -f %s/certs.yaml", d), 0);
    /* what helm install would have written on them: the release owns them */
    assert_int_equal(harness_kubectl(k, out, sizeof out, "-n sys annotate secret -l "
                     "app.kubernetes.io/name=edl-etcd meta.helm.sh/release-name=t "
                     "meta.helm.sh/release-namespace=sys"), 0);
    assert_int_equal(harness_kubectl(k, out, sizeof out, "-n sys label secret -l "
                     "app.kubernetes.io/name=edl-etcd app.kubernetes.io/managed-by=Helm "
                     "--overwrite"), 0);
    char first[4096], again[4096];
    assert_int_equal(harness_kubectl(k, first, sizeof first, "-n sys get secret "
                     "t-edl-etcd-server-tls -o jsonpath='{.data.tls\\.crt}'"), 0);
    assert_true(strlen(first) > 100);
    server_cert_of_dry_run(k, again, sizeof again);
    assert_int_equal(strncmp(again, first, strlen(first)), 0);
    /* without the Secrets (a first install), fresh certificates */
    assert_int_equal(harness_kubectl(k, out, sizeof out, "-n sys delete secret -l "
                     "app.kubernetes.io/name=edl-etcd"), 0);
    server_cert_of_dry_run(k, again, sizeof again);
    assert_true(strlen(again) > 100);
    assert_int_not_equal(strncmp(again, first, strlen(first)), 0);
    harness_k8s_close(k);
}

int main(void)
{
    if (access(HELM, X_OK) != 0) {
        fprintf(stderr, "test_helm: %s is missing: run scripts/install-deps\n", HELM);
        return 77; /* skipped */
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_chart_holds_the_one_crd),
        cmocka_unit_test(test_names_follow_the_release_and_the_docs_say_them),
        cmocka_unit_test(test_lint_strict_and_templates_with_each_option),
        cmocka_unit_test(test_rendered_manifests_apply_to_the_api_server),
        cmocka_unit_test(test_monitoring_switches_render_their_objects),
        cmocka_unit_test(test_monitoring_objects_apply_with_the_operators_crds),
        cmocka_unit_test(test_generated_certificates_serve_a_tls_etcd_cluster),
        cmocka_unit_test(test_upgrade_keeps_the_generated_certificates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

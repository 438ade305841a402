/* test_helm.c: the Helm chart (charts/edl) with the real helm 3.17.3: one CRD source, lint
 * --strict, templates with the default values and each documented option, a typo in the values
 * refused by values.schema.json, and the rendered manifests applied with the real kubectl to
 * the stand-in API server. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    assert_int_equal(helm(out, sizeof out, "template t " CHART " --namespace team "
                          "--set operator.allNamespaces=false --set etcd.clientSecret=etcd-client "
                          "--set etcd.endpoints=https://etcd:2379 "
                          "--set operator.metrics.serviceMonitor=true"), 0);
    assert_non_null(strstr(out, "kind: Role\n"));
    assert_non_null(strstr(out, "--namespace=team"));
    assert_non_null(strstr(out, "--etcd-tls-secret=etcd-client"));
    assert_non_null(strstr(out, "secretName: etcd-client"));
    assert_non_null(strstr(out, "kind: ServiceMonitor"));
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
    assert_int_equal(harness_kubectl(k, out, sizeof out, "get clusterrole t-edl-operator "
                                     "-o jsonpath='{.rules[*].resources}'"), 0);
    assert_non_null(strstr(out, "trainingjobs/status"));
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
        cmocka_unit_test(test_lint_strict_and_templates_with_each_option),
        cmocka_unit_test(test_rendered_manifests_apply_to_the_api_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

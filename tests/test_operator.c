/* test_operator.c: the TrainingJob operator (edl-operator) end to end, driven by
 * the real kubectl against the stand-in API server and kubelet (tests/k8s_standin): pods run as
 * local processes (edl-agent installed by the init container, wrapping the example trainer),
 * with a real etcd. Each test applies the CRD and a job and checks what a user would see (a
 * pod whose agent dies leaving the generation at once, a job deleted and applied again resuming
 * from its checkpoints, a job with parameter servers too, one with teachers, and every example
 * manifest against the schema). The last one checks the Helm
 * chart's RBAC against every request the operator made in them all: each allowed, no rule
 * unused. */
#define _GNU_SOURCE
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "edl/etcd_server.h"
#include "edl/trainingjob.h"
#include "edl/yaml.h"
#include "harness.h"

static cJSON *operator_access; /* {"<verb> <group>/<resource>": count} over every e2e test */
static int e2e_done, e2e_total; /* end-to-end tests run, and there are */

typedef struct cluster {
    edl_etcd_server *etcd;
    harness_k8s *k;
    pid_t op[2];
    int metrics_port[2];
    char ckpt[300];
} cluster;

/* An operator whose terms on the jobs in etcd last ttl seconds. */
static pid_t start_operator_ttl(cluster *c, const char *id, const char *ttl)
{
    char log[400], port[16];
    int slot = id[3] == 'a' ? 0 : 1;
    c->metrics_port[slot] = harness_free_port();
    snprintf(port, sizeof port, "%d", c->metrics_port[slot]);
    snprintf(log, sizeof log, "%s/operator-%s.log", harness_k8s_dir(c->k), id);
    const char *argv[] = {EDL_OPERATOR_BIN, "--kubeconfig",
                          harness_k8s_kubeconfig(c->k), "--etcd",
                          edl_etcd_server_endpoints(c->etcd), "--id", id, "--ttl", ttl,
                          "--agent-image", "edl-test/agent:dev",
                          "--leader-elect-lease-duration", "2s",
                          "--leader-elect-renew-deadline", "1500ms",
                          "--leader-elect-retry-period", "250ms", "--metrics-port", port,
                          "--metrics-addr", "127.0.0.1", NULL};
    pid_t pid = harness_spawn(argv, log);
    assert_true(pid > 0);
    return pid;
}

static pid_t start_operator(cluster *c, const char *id)
{
    return start_operator_ttl(c, id, "2");
}

/* etcd, the stand-in cluster (with these extra flags) with the CRD, and one operator. PATH
 * gains the directory of edl-agent: the stand-in kubelet runs the init container's `edl-agent
 * --install` from it. */
static int setup_with(void **state, const char *const *standin_args)
{
    if (!harness_kubectl_available())
        skip();
    static char path[8192];
    char agent_dir[512];
    snprintf(agent_dir, sizeof agent_dir, "%s", EDL_AGENT_BIN);
    *strrchr(agent_dir, '/') = '\0';
    snprintf(path, sizeof path, "%s:%s", agent_dir, getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
    setenv("PATH", path, 1);
    cluster *c = calloc(1, sizeof *c);
    *state = c;
    c->etcd = harness_etcd_open(1, NULL);
    c->k = harness_k8s_open(standin_args);
    snprintf(c->ckpt, sizeof c->ckpt, "%s/ckpt", harness_k8s_dir(c->k));
    char out[4096];
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "apply -f %s/deploy/k8s/crd.yaml",
                                     EDL_SOURCE_DIR), 0);
    c->op[0] = start_operator(c, "op-a");
    return 0;
}

static int setup(void **state)
{
    return setup_with(state, NULL);
}

/* An API server of Kubernetes 1.24, which drops the CRD's CEL rules without a word. */
static int setup_kube_1_24(void **state)
{
    static const char *const args[] = {"--kube-version", "24", NULL};
    return setup_with(state, args);
}

/* A kubelet that only marks pods Running (no processes): for jobs of a thousand pods. */
static int setup_phase_only(void **state)
{
    static const char *const args[] = {"--kubelet-mode", "phase-only", NULL};
    return setup_with(state, args);
}

/* What the operator asked of the API server in this test, added to operator_access. */
static void keep_operator_access(harness_k8s *k)
{
    static const char me[] = "edl-operator ";
    if (!operator_access)
        operator_access = cJSON_CreateObject();
    cJSON *all = harness_k8s_access(k);
    const cJSON *e;
    cJSON_ArrayForEach(e, all) {
        if (strncmp(e->string, me, sizeof me - 1) != 0)
            continue;
        const char *what = e->string + sizeof me - 1;
        cJSON *had = cJSON_GetObjectItemCaseSensitive(operator_access, what);
        if (had)
            cJSON_SetNumberValue(had, had->valuedouble + e->valuedouble);
        else
            cJSON_AddNumberToObject(operator_access, what, e->valuedouble);
    }
    cJSON_Delete(all);
    e2e_done++;
}

static int teardown(void **state)
{
    cluster *c = *state;
    if (!c)
        return 0;
    /* SIGTERM: an operator steps down and exits 0 (under ASan: without a leak) */
    int status[2] = {0, 0};
    for (int i = 0; i < 2; i++)
        if (c->op[i] > 0)
            kill(c->op[i], SIGTERM);
    for (int i = 0; i < 2; i++)
        if (c->op[i] > 0 && (status[i] = harness_wait_exit(c->op[i], 15000)) == -1)
            harness_kill(c->op[i], SIGKILL);
    keep_operator_access(c->k);
    harness_k8s_close(c->k);
    edl_etcd_server_close(c->etcd);
    free(c);
    assert_int_equal(status[0], 0);
    assert_int_equal(status[1], 0);
    return 0;
}

/* Write a TrainingJob manifest running the example trainer; extra: more spec lines. */
static void write_job(cluster *c, const char *file, const char *name, int replicas,
                      const char *steps, const char *extra)
{
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fprintf(f, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: %s\n"
               "spec:\n  replicas: %d\n  minReplicas: 1\n  maxReplicas: 4\n"
               "  elastic:\n    settleWindow: 300ms\n    leaseTTLSeconds: 3\n"
               "  checkpoint:\n    uri: file://%s/%s\n%s"
               "  template:\n    spec:\n      containers:\n      - name: trainer\n"
               "        image: ghcr.io/edl-dev/edl-examples:0.1.0\n"
               "        command: [\"%s\", \"--steps\", \"%s\", \"--step-ms\", \"20\"]\n",
            name, replicas, c->ckpt, name, extra ? extra : "", EDL_EXAMPLE_TRAINER, steps);
    fclose(f);
}

static void apply_job(cluster *c, const char *name, int replicas, const char *steps,
                      const char *extra)
{
    char file[400], out[4096];
    snprintf(file, sizeof file, "%s/%s.yaml", harness_k8s_dir(c->k), name);
    write_job(c, file, name, replicas, steps, extra);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "apply -f %s", file), 0);
}

/* Names of the job's pods, space-separated, sorted. */
static void live_pods(cluster *c, const char *job, char *out, size_t len)
{
    harness_kubectl(c->k, out, len, "get pods -l edl.dev/job=%s -o jsonpath='{range .items[*]}"
                    "{.metadata.name}{\"\\n\"}{end}' | sort | tr '\\n' ' '", job);
}

static void test_kubectl_drives_a_job_from_apply_to_delete(void **state)
{
    cluster *c = *state;
    char out[8192];
    apply_job(c, "mnist", 2, "400", NULL);
    harness_kubectl_wait(c->k, "tj mnist", "{.status.state}/{.status.memberCount}", "Running/2",
                         30000);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "get tj"), 0);
    assert_non_null(strstr(out, "MEMBERS"));
    assert_non_null(strstr(out, "mnist"));
    assert_non_null(strstr(out, "Running"));
    /* what an HPA reads: the scale subresource with the pods' selector */
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "get --raw /apis/edl.dev/v1alpha1/"
                                     "namespaces/default/trainingjobs/mnist/scale"), 0);
    assert_non_null(strstr(out, "\"selector\":\"edl.dev/job=mnist,edl.dev/role=worker\""));
    /* the operator's Prometheus metrics */
    static char metrics[65536];
    assert_int_equal(harness_http_get(c->metrics_port[0], "/metrics", metrics, sizeof metrics),
                     200);
    assert_non_null(strstr(metrics, "edl_operator_leader{id=\"op-a\"} 1"));
    assert_non_null(strstr(metrics, "edl_operator_jobs{id=\"op-a\"} 1"));
    assert_non_null(strstr(metrics, "edl_operator_pods_created_total{id=\"op-a\"} 2"));
    /* scale up, then down: new generations; the newest pod goes */
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "scale tj/mnist --replicas=3"), 0);
    harness_kubectl_wait(c->k, "tj mnist", "{.status.memberCount}", "3", 30000);
    harness_kubectl_wait(c->k, "tj mnist", "{.status.replicas}", "3", 5000);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "scale tj/mnist --replicas=2"), 0);
    harness_kubectl_wait(c->k, "tj mnist", "{.status.memberCount}", "2", 30000);
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=mnist", "{.items[*].metadata.name}",
                         "mnist-worker-0 mnist-worker-1", 30000);
    /* the trainer ends: the job succeeded */
    harness_kubectl_wait(c->k, "tj mnist", "{.status.state}", "Succeeded", 90000);
    harness_kubectl_wait(c->k, "tj mnist",
                         "{.status.conditions[?(@.type==\"Succeeded\")].status}", "True", 5000);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "get tj mnist"), 0);
    assert_non_null(strstr(out, "Succeeded"));
    /* delete: the pods and the job's etcd keys go */
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "delete tj mnist --wait=true "
                                     "--timeout=30s"), 0);
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=mnist", "{.items[*].metadata.name}", "",
                         30000);
    char keys[4096];
    harness_etcdctl_out(keys, sizeof keys, edl_etcd_server_endpoints(c->etcd), NULL,
                        "get --prefix --keys-only /edl/v1/jobs/default.mnist/");
    assert_string_equal(keys, "");
}

/* The pid of a pod's process whose command line has `exe` in it and whose environment says
 * EDL_POD_ID=<pod> (the agent, or its trainer). */
static pid_t process_of(const char *pod, const char *exe)
{
    char want[300];
    snprintf(want, sizeof want, "EDL_POD_ID=%s", pod);
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t found = -1;
    while (d && (e = readdir(d)) && found < 0) {
        char path[300], env[65536], cmd[4096];
        pid_t pid = atoi(e->d_name);
        if (pid <= 0)
            continue;
        snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
        harness_read_file(path, cmd, sizeof cmd);
        if (!strstr(cmd, exe))
            continue;
        snprintf(path, sizeof path, "/proc/%d/environ", pid);
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(env, 1, sizeof env - 1, f) : 0;
        if (f)
            fclose(f);
        for (size_t i = 0; i < n; i += strlen(env + i) + 1)
            if (strcmp(env + i, want) == 0)
                found = pid;
    }
    if (d)
        closedir(d);
    return found;
}

/* Wait until the job's spec in etcd holds want (what the operator wrote from the TrainingJob). */
static void wait_etcd_spec(cluster *c, const char *job, const char *want)
{
    char spec[4096] = "", cmd[256];
    snprintf(cmd, sizeof cmd, "get --print-value-only /edl/v1/jobs/default.%s/spec", job);
    if (HARNESS_WAIT_UNTIL((harness_etcdctl_out(spec, sizeof spec,
                                                edl_etcd_server_endpoints(c->etcd), NULL, "%s",
                                                cmd), strstr(spec, want)), 20000))
        return;
    fail_msg("the spec of %s in etcd: %s; waited for %s", job, spec, want);
}

#define PS_SPEC(replicas)                                                                        \
    "  ps:\n    replicas: " replicas "\n    minReplicas: 1\n    maxReplicas: 4\n"             \
    "    template:\n      spec:\n        containers:\n        - name: server\n"               \
    "          image: x\n          command: [sleep, \"100000\"]\n"

/* spec.ps: the operator creates the servers' pods beside the workers' (own names, role label,
 * `edl-agent --role ps`), writes the ps bounds to etcd, reports the servers in the status,
 * scales them by a patch of spec.ps.replicas (kubectl scale stays the workers'), and replaces
 * a deleted one. */
static void test_ps_pods_are_created_scaled_and_replaced(void **state)
{
    cluster *c = *state;
    char out[8192];
    apply_job(c, "psj", 2, "100000", PS_SPEC("2"));
    harness_kubectl_wait(c->k, "tj psj", "{.status.state}/{.status.memberCount}/"
                         "{.status.serverCount}", "Running/2/2", 30000);
    live_pods(c, "psj", out, sizeof out);
    assert_string_equal(out, "psj-ps-0 psj-ps-1 psj-worker-0 psj-worker-1 ");
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=psj,edl.dev/role=ps",
                         "{.items[*].metadata.labels.edl\\.dev/index}", "0 1", 5000);
    harness_kubectl(c->k, out, sizeof out, "get pod psj-ps-1 -o jsonpath="
                    "'{.spec.containers[0].command}'");
    assert_non_null(strstr(out, "\"--role\",\"ps\",\"--\",\"sleep\""));
    harness_kubectl_wait(c->k, "tj psj", "{.status.replicas}/{.status.psReplicas}", "2/2", 5000);
    harness_kubectl(c->k, out, sizeof out, "get tj psj -o jsonpath='{.status.servers[*].pod}'");
    assert_true(strstr(out, "psj-ps-0") && strstr(out, "psj-ps-1")); /* in rank order */
    wait_etcd_spec(c, "psj", "\"ps\":{\"min\":1,\"max\":4,\"replicas\":2}");
    /* more servers: a patch of spec.ps.replicas; the workers keep running */
    pid_t w0 = process_of("psj-worker-0", "elastic_trainer");
    assert_true(w0 > 0);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "patch tj psj --type=merge "
                                     "-p '{\"spec\":{\"ps\":{\"replicas\":3}}}'"), 0);
    wait_etcd_spec(c, "psj", "\"replicas\":3}");
    harness_kubectl_wait(c->k, "tj psj", "{.status.serverCount}/{.status.psReplicas}", "3/3",
                         30000);
    live_pods(c, "psj", out, sizeof out);
    assert_string_equal(out, "psj-ps-0 psj-ps-1 psj-ps-2 psj-worker-0 psj-worker-1 ");
    assert_int_equal(process_of("psj-worker-0", "elastic_trainer"), w0);
    /* fewer: the newest go */
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "patch tj psj --type=merge "
                                     "-p '{\"spec\":{\"ps\":{\"replicas\":1}}}'"), 0);
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=psj,edl.dev/role=ps",
                         "{.items[*].metadata.name}", "psj-ps-0", 30000);
    harness_kubectl_wait(c->k, "tj psj", "{.status.serverCount}", "1", 30000);
    /* a deleted server is replaced (a new index), and is no failure */
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "delete pod psj-ps-0 --wait=false"),
                     0);
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=psj,edl.dev/role=ps",
                         "{.items[*].metadata.name}", "psj-ps-3", 30000);
    harness_kubectl_wait(c->k, "tj psj", "{.status.servers[*].pod}", "psj-ps-3", 30000);
    /* kubectl scale is the workers' */
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "scale tj/psj --replicas=3"), 0);
    harness_kubectl_wait(c->k, "tj psj", "{.status.memberCount}/{.status.serverCount}", "3/1",
                         30000);
    live_pods(c, "psj", out, sizeof out);
    assert_string_equal(out, "psj-ps-3 psj-worker-0 psj-worker-1 psj-worker-2 ");
    harness_kubectl_wait(c->k, "tj psj", "{.status.podFailures}", "0", 1000);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "delete tj psj --wait=true "
                                     "--timeout=30s"), 0);
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=psj", "{.items[*].metadata.name}", "",
                         30000);
}

/* spec.teachers: the operator creates the teachers' pods beside the workers' (own names, role
 * label, `edl-agent --role teacher --service ...`), writes the teacher bounds to etcd, reports
 * in status.teachers how many registered in the service, scales them by a patch of
 * spec.teachers.replicas (the newest go first), replaces a failed one without counting it, and
 * the job succeeds when its workers do while the teachers still run. */
static void test_teacher_pods_are_created_scaled_and_replaced(void **state)
{
    cluster *c = *state;
    char out[8192], extra[1024];
    snprintf(extra, sizeof extra, "  teachers:\n    replicas: 1\n    minReplicas: 1\n"
             "    maxReplicas: 4\n    service: kd\n    capacity: 2\n    template:\n"
             "      spec:\n        containers:\n        - name: teacher\n          image: x\n"
             "          command: [\"%s\"]\n          env: [{name: T_DIR, value: \"%s\"}]\n",
             EDL_TEACHER_SERVER, harness_k8s_dir(c->k));
    apply_job(c, "kdj", 2, "1000", extra);
    harness_kubectl_wait(c->k, "tj kdj", "{.status.state}/{.status.memberCount}/"
                         "{.status.teachers.ready}", "Running/2/1", 30000);
    live_pods(c, "kdj", out, sizeof out);
    assert_string_equal(out, "kdj-teacher-0 kdj-worker-0 kdj-worker-1 ");
    harness_kubectl(c->k, out, sizeof out, "get pod kdj-teacher-0 -o jsonpath="
                    "'{.metadata.labels.edl\\.dev/role}{.spec.containers[0].command}'");
    assert_non_null(strstr(out, "teacher[")); /* the label, then the agent's arguments */
    assert_non_null(strstr(out, "\"--role\",\"teacher\",\"--service\",\"kd\",\"--capacity\","
                                "\"2\",\"--\""));
    wait_etcd_spec(c, "kdj", "\"teachers\":{\"min\":1,\"max\":4,\"replicas\":1,"
                             "\"service\":\"kd\"}");
    char keys[4096];
    harness_etcdctl_out(keys, sizeof keys, edl_etcd_server_endpoints(c->etcd), NULL,
                        "get --prefix --keys-only /edl/v1/services/kd/teachers/");
    assert_non_null(strstr(keys, "/edl/v1/services/kd/teachers/kdj-teacher-0"));
    /* more teachers: a patch of spec.teachers.replicas; the workers keep running */
    pid_t w0 = process_of("kdj-worker-0", "elastic_trainer");
    assert_true(w0 > 0);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "patch tj kdj --type=merge "
                                     "-p '{\"spec\":{\"teachers\":{\"replicas\":3}}}'"), 0);
    harness_kubectl_wait(c->k, "tj kdj", "{.status.teachers.desired}/{.status.teachers.replicas}"
                         "/{.status.teachers.ready}", "3/3/3", 30000);
    live_pods(c, "kdj", out, sizeof out);
    assert_string_equal(out, "kdj-teacher-0 kdj-teacher-1 kdj-teacher-2 kdj-worker-0 "
                             "kdj-worker-1 ");
    /* fewer: the newest goes, and its registration with it */
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "patch tj kdj --type=merge "
                                     "-p '{\"spec\":{\"teachers\":{\"replicas\":2}}}'"), 0);
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=kdj,edl.dev/role=teacher",
                         "{.items[*].metadata.name}", "kdj-teacher-0 kdj-teacher-1", 30000);
    harness_kubectl_wait(c->k, "tj kdj", "{.status.teachers.replicas}/{.status.teachers.ready}",
                         "2/2", 30000);
    /* a teacher pod that fails is replaced (a new index), and is no failure of the job */
    pid_t agent = process_of("kdj-teacher-1", "edl-agent");
    assert_true(agent > 0);
    kill(agent, SIGKILL);
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=kdj,edl.dev/role=teacher",
                         "{.items[*].metadata.name}", "kdj-teacher-0 kdj-teacher-3", 30000);
    assert_int_equal(process_of("kdj-worker-0", "elastic_trainer"), w0);
    /* the workers end: the job succeeded, teachers or not; the teachers' pods go */
    harness_kubectl_wait(c->k, "tj kdj", "{.status.state}", "Succeeded", 90000);
    harness_kubectl_wait(c->k, "tj kdj", "{.status.podFailures}/{.status.restarts}", "0/0",
                         1000);
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=kdj,edl.dev/role=teacher",
                         "{.items[*].metadata.name}", "", 30000);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "delete tj kdj --wait=true "
                                     "--timeout=30s"), 0);
}

/* Every manifest of deploy/k8s/examples passes the CRD's schema (the API server's dry run,
 * through the real kubectl) and the operator's reader; a bad spec.ps or spec.teachers does not
 * get past the schema, and one the schema cannot judge (CEL) is named by the operator. */
static void test_examples_pass_the_schema_and_bad_ps_sections_do_not(void **state)
{
    cluster *c = *state;
    char out[8192], dir[512], file[1024], field[256], err[512];
    snprintf(dir, sizeof dir, "%s/deploy/k8s/examples", EDL_SOURCE_DIR);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".yaml") != 0)
            continue;
        snprintf(file, sizeof file, "%s/%s", dir, e->d_name);
        if (harness_kubectl(c->k, out, sizeof out, "apply --dry-run=server -f %s 2>&1", file))
            fail_msg("%s: %s", e->d_name, out);
        edl_yaml *y;
        assert_int_equal(edl_yaml_load_file(file, &y, err, sizeof err), 0);
        edl_trainingjob tj;
        if (edl_trainingjob_parse(edl_yaml_doc(y, 0), &tj, field, sizeof field, err, sizeof err))
            fail_msg("%s: %s: %s", e->d_name, field, err);
        edl_trainingjob_clear(&tj);
        edl_yaml_free(y);
        n++;
    }
    closedir(d);
    assert_true(n >= 3);
    /* every claim an example mounts is made by a manifest of deploy/k8s, which the API server
     * takes */
    snprintf(file, sizeof file, "cat %s/*.yaml | grep -o 'claimName: [a-z0-9-]*' | sort -u | "
             "cut -d' ' -f2", dir);
    assert_int_equal(harness_shell(file, out, sizeof out), 0);
    assert_true(strlen(out) > 0);
    for (char *claim = strtok(out, "\n"); claim; claim = strtok(NULL, "\n")) {
        char cmd[1024], made[256];
        snprintf(cmd, sizeof cmd, "grep -l -A3 'kind: PersistentVolumeClaim' %s/deploy/k8s/*.yaml"
                 " | xargs grep -l 'name: %s$'", EDL_SOURCE_DIR, claim);
        if (harness_shell(cmd, made, sizeof made) != 0)
            fail_msg("the examples mount the claim %s, which no manifest of deploy/k8s makes",
                     claim);
    }
    if (harness_kubectl(c->k, out, sizeof out, "apply --dry-run=server -f %s/deploy/k8s/"
                        "shared-volume.yaml 2>&1", EDL_SOURCE_DIR))
        fail_msg("shared-volume.yaml: %s", out);
    static const struct {
        const char *ps, *says;
    } bad[] = {
        {"  ps:\n    replicas: two\n", "replicas"},
        {"  ps:\n    minReplicas: 0\n    template: {spec: {containers: [{name: s}]}}\n",
         "minReplicas"},
        {"  ps:\n    replicas: 1\n    template: {spec: {containers: []}}\n", "containers"},
        {"  ps:\n    replicas: 1\n    template: {metadata: {}}\n", "spec"},
        {"  teachers:\n    replicas: 1\n    template: {spec: {containers: [{name: s}]}}\n",
         "service"},
        {"  teachers:\n    service: Bad_Name\n    template: {spec: {containers: [{name: s}]}}\n",
         "service"},
        {"  teachers:\n    service: kd\n    replicas: 0\n"
         "    template: {spec: {containers: [{name: s}]}}\n", "replicas"},
    };
    snprintf(file, sizeof file, "%s/badps.yaml", harness_k8s_dir(c->k));
    /* a typo's replicas: the CRD's maximum, 1,024 (EDL_TJ_PODS_MAX), refuses it */
    write_job(c, file, "typo", 100000, "10", NULL);
    if (harness_kubectl(c->k, out, sizeof out, "apply --dry-run=server -f %s 2>&1", file) == 0 ||
        !strstr(out, "spec.replicas in body should be less than or equal to 1024"))
        fail_msg("replicas 100000: kubectl apply --dry-run=server: %s", out);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_job(c, file, "badps", 1, "10", bad[i].ps);
        if (harness_kubectl(c->k, out, sizeof out, "apply -f %s 2>&1", file) == 0 ||
            !strstr(out, bad[i].says))
            fail_msg("case %zu: kubectl apply: %s", i, out);
    }
    /* the CEL rules (Kubernetes 1.25+; test_old_servers_rules_and_names_are_the_operators
     * shows the operator holding them where the server drops them) */
    write_job(c, file, "badps", 1, "10", "  ps:\n    minReplicas: 3\n    maxReplicas: 2\n"
              "    template: {spec: {containers: [{name: s, command: [sleep, \"9\"]}]}}\n");
    if (harness_kubectl(c->k, out, sizeof out, "apply -f %s 2>&1", file) == 0 ||
        !strstr(out, "ps.minReplicas must not exceed ps.maxReplicas"))
        fail_msg("min > max: kubectl apply: %s", out);
    static const char *const names[] = {"1job", "my.job",
        "a-sixty-character-name-that-is-a-fine-label-but-too-long-xyz"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        write_job(c, file, names[i], 1, "10", NULL);
        if (harness_kubectl(c->k, out, sizeof out, "apply -f %s 2>&1", file) == 0 ||
            !strstr(out, "metadata.name must"))
            fail_msg("%s: kubectl apply: %s", names[i], out);
    }
    /* a cluster's administrator raises the CRD's maximum as docs/kubernetes.md says */
    static const char *const bounds[] = {"replicas", "minReplicas", "maxReplicas"};
    for (size_t i = 0; i < 3; i++)
        if (harness_kubectl(c->k, out, sizeof out, "patch crd trainingjobs.edl.dev --type json "
                            "-p '[{\"op\": \"replace\", \"path\": \"/spec/versions/0/schema/"
                            "openAPIV3Schema/properties/spec/properties/%s/maximum\", "
                            "\"value\": 4096}]' 2>&1", bounds[i]))
            fail_msg("raising %s: %s", bounds[i], out);
    write_job(c, file, "big", 2000, "10", NULL);
    if (harness_kubectl(c->k, out, sizeof out, "apply --dry-run=server -f %s 2>&1", file))
        fail_msg("replicas 2000 under a raised maximum: %s", out);
    assert_int_equal(harness_k8s_stat(c->k, "create pods"), 0);
}

static void test_lost_pods_are_replaced_within_the_budget(void **state)
{
    cluster *c = *state;
    char out[4096];
    apply_job(c, "spot", 2, "100000", NULL);
    harness_kubectl_wait(c->k, "tj spot", "{.status.state}/{.status.memberCount}", "Running/2",
                         30000);
    pid_t agent = process_of("spot-worker-0", "edl-agent");
    assert_true(agent > 0);
    kill(agent, SIGKILL); /* the pod fails: replaced, counted */
    harness_kubectl_wait(c->k, "tj spot", "{.status.podFailures}", "1", 30000);
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=spot", "{.items[*].metadata.name}",
                         "spot-worker-1 spot-worker-2", 30000);
    /* a pod deleted by a person is replaced too, and is no failure */
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "delete pod spot-worker-1 "
                                     "--wait=false"), 0);
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=spot", "{.items[*].metadata.name}",
                         "spot-worker-2 spot-worker-3", 30000);
    harness_kubectl_wait(c->k, "tj spot", "{.status.state}/{.status.memberCount}", "Running/2",
                         30000);
    harness_kubectl_wait(c->k, "tj spot", "{.status.podFailures}", "1", 1000);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "delete tj spot --wait=true "
                                     "--timeout=30s"), 0);
}

/* The kubelet sees a pod's agent die (SIGKILL): the operator revokes the lease of the pod's
 * registration in etcd, so a generation without it is published within a second of the kill,
 * not when its lease (10 s here) runs out. Alone in its pod, the agent's death fails the pod,
 * which is replaced; beside a sidecar, its container terminated is enough (the pod runs on). */
static void dead_agent_case(cluster *c, const char *job, const char *sidecar)
{
    char out[4096], file[400], pod[64], key[128];
    snprintf(file, sizeof file, "%s/%s.yaml", harness_k8s_dir(c->k), job);
    snprintf(pod, sizeof pod, "%s-worker-1", job);
    snprintf(key, sizeof key, "/edl/v1/jobs/default.%s/generation", job);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fprintf(f, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: %s}\n"
               "spec:\n  replicas: 3\n  minReplicas: 1\n  maxReplicas: 3\n"
               "  elastic: {settleWindow: 300ms, leaseTTLSeconds: 10}\n"
               "  template:\n    spec:\n      containers:\n      - name: t\n        image: x\n"
               "        command: [sleep, \"100000\"]\n%s", job, sidecar ? sidecar : "");
    fclose(f);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "apply -f %s", file), 0);
    char tj[80];
    snprintf(tj, sizeof tj, "tj %s", job);
    harness_kubectl_wait(c->k, tj, "{.status.state}/{.status.memberCount}", "Running/3", 30000);
    edl_etcd *e = harness_client(edl_etcd_server_endpoints(c->etcd), 2000);
    char doc[65536], err[256];
    edl_generation g = {0};
    assert_non_null(harness_get(e, key, doc, sizeof doc));
    assert_int_equal(edl_generation_parse(doc, strlen(doc), &g, err, sizeof err), 0);
    int64_t before = g.generation;
    assert_non_null(edl_generation_member_named(&g, pod));
    pid_t agent = process_of(pod, "edl-agent");
    assert_true(agent > 0);
    int64_t t0 = harness_now_ms();
    assert_int_equal(kill(agent, SIGKILL), 0);
    bool out_of_it = false;
    while (!out_of_it && harness_now_ms() < t0 + 12000) {
        harness_sleep_ms(10);
        out_of_it = harness_get(e, key, doc, sizeof doc) &&
                    edl_generation_parse(doc, strlen(doc), &g, err, sizeof err) == 0 &&
                    g.generation > before && !edl_generation_member_named(&g, pod);
    }
    int64_t took = harness_now_ms() - t0;
    print_message("agent SIGKILLed under the operator%s: a generation without its pod after "
                  "%lld ms (lease TTL 10 s)\n", sidecar ? " beside a sidecar" : "",
                  (long long)took);
    assert_true(out_of_it);
    assert_true(took <= 1500);
    assert_int_equal(g.restarts, 0);
    edl_generation_clear(&g);
    edl_etcd_close(e);
    if (!sidecar) /* the pod failed: replaced, counted */
        harness_kubectl_wait(c->k, tj, "{.status.podFailures}", "1", 30000);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "delete tj %s --wait=true "
                                     "--timeout=30s", job), 0);
}

static void test_a_dead_agents_pod_leaves_the_generation_at_once(void **state)
{
    cluster *c = *state;
    dead_agent_case(c, "crash", NULL);
    dead_agent_case(c, "crashsc", "      - name: sidecar\n        image: x\n"
                                  "        command: [sleep, \"100000\"]\n");
}

/* suspend deletes the pods and keeps the job; resuming creates them again; the job ends and
 * ttlSecondsAfterFinished deletes it, with its etcd keys. */
static void test_suspend_resume_and_ttl_after_finished(void **state)
{
    cluster *c = *state;
    char out[4096], keys[4096];
    apply_job(c, "pause", 2, "150", "  ttlSecondsAfterFinished: 1\n");
    harness_kubectl_wait(c->k, "tj pause", "{.status.state}/{.status.memberCount}", "Running/2",
                         30000);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "patch tj pause --type=merge "
                                     "-p '{\"spec\":{\"suspend\":true}}'"), 0);
    harness_kubectl_wait(c->k, "tj pause", "{.status.state}", "Suspended", 20000);
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=pause", "{.items[*].metadata.name}", "",
                         30000);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "patch tj pause --type=merge "
                                     "-p '{\"spec\":{\"suspend\":false}}'"), 0);
    harness_kubectl_wait(c->k, "tj pause", "{.status.state}/{.status.memberCount}", "Running/2",
                         30000);
    /* it resumes from its checkpoint, succeeds, and is deleted a second later (too soon, maybe,
     * to see its state: its Events stay) */
    assert_true(HARNESS_WAIT_UNTIL(harness_kubectl(c->k, out, sizeof out,
                                                   "get tj pause 2>/dev/null") != 0, 90000));
    harness_kubectl(c->k, out, sizeof out, "get events --field-selector involvedObject.name=pause "
                    "-o jsonpath='{.items[*].reason}'");
    assert_non_null(strstr(out, "Suspended"));
    assert_non_null(strstr(out, "Succeeded"));
    harness_etcdctl_out(keys, sizeof keys, edl_etcd_server_endpoints(c->etcd), NULL,
                        "get --prefix --keys-only /edl/v1/jobs/default.pause/");
    assert_string_equal(keys, "");
}

/* The newest step among the complete checkpoints in dir (ckpt-<step>-g<gen>/manifest.json). */
static long newest_checkpoint(const char *dir)
{
    char cmd[700], out[256];
    snprintf(cmd, sizeof cmd, "ls %s/ckpt-*/manifest.json 2>/dev/null | sed -n "
             "'s|.*/ckpt-0*\\([0-9][0-9]*\\)-g[0-9]*/manifest.json|\\1|p' | sort -n | tail -1",
             dir);
    out[0] = '\0';
    harness_shell(cmd, out, sizeof out);
    return out[0] ? strtol(out, NULL, 10) : -1;
}

/* A TrainingJob deleted (the operator deletes its etcd keys, the checkpoint pointer with them)
 * and applied again with the same checkpoint.uri resumes from its checkpoints, found in the
 * store, and finishes from there. */
static void test_a_job_applied_again_resumes_from_its_checkpoints(void **state)
{
    cluster *c = *state;
    char out[8192], dir[400], steps[32], cmd[800];
    snprintf(dir, sizeof dir, "%s/again", c->ckpt);
    apply_job(c, "again", 1, "1000000", NULL);
    assert_true(HARNESS_WAIT_UNTIL(newest_checkpoint(dir) >= 20, 60000));
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "delete tj again --wait=true "
                                     "--timeout=30s"), 0);
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=again", "{.items[*].metadata.name}", "",
                         30000);
    long first = newest_checkpoint(dir);
    snprintf(steps, sizeof steps, "%ld", first + 30);
    apply_job(c, "again", 1, steps, NULL);
    harness_kubectl_wait(c->k, "tj again", "{.status.state}", "Succeeded", 90000);
    /* every pod's log of both runs: the newest "resuming at step" is the second run's */
    snprintf(cmd, sizeof cmd, "cat %s/kubelet/*_again-*/*.log | sed -n 's/.*resuming at step "
             "\\([0-9]*\\).*/\\1/p' | sort -n | tail -1", harness_k8s_dir(c->k));
    out[0] = '\0';
    harness_shell(cmd, out, sizeof out);
    long resumed = out[0] ? strtol(out, NULL, 10) : -1;
    if (resumed < first)
        fail_msg("the job applied again resumed at step %ld, not at %ld or later", resumed,
                 first);
    assert_int_equal(newest_checkpoint(dir), first + 30);
}

/* InProcess: removing one pod re-forms the survivors in place: their trainers keep running. */
static void test_inprocess_survivors_keep_running_when_a_pod_goes(void **state)
{
    cluster *c = *state;
    char out[4096], file[400];
    snprintf(file, sizeof file, "%s/inproc.yaml", harness_k8s_dir(c->k));
    FILE *f = fopen(file, "w");
    fprintf(f, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: inproc}\n"
               "spec:\n  replicas: 3\n  minReplicas: 2\n  maxReplicas: 3\n"
               "  elastic: {mode: InProcess, settleWindow: 300ms, leaseTTLSeconds: 3}\n"
               "  template:\n    spec:\n      containers:\n      - name: t\n        image: x\n"
               "        command: [\"%s\", \"--steps\", \"1000000\", \"--step-ms\", \"20\"]\n",
            EDL_EXAMPLE_MLP);
    fclose(f);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "apply -f %s", file), 0);
    harness_kubectl_wait(c->k, "tj inproc", "{.status.state}/{.status.memberCount}", "Running/3",
                         30000);
    pid_t t0 = -1, t1 = -1; /* the generation is out: the agents start their trainers */
    assert_true(HARNESS_WAIT_UNTIL((t0 = process_of("inproc-worker-0", "elastic_mlp")) > 0 &&
                                   (t1 = process_of("inproc-worker-1", "elastic_mlp")) > 0,
                                   10000));
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "delete pod inproc-worker-2 "
                                     "--wait=false"), 0);
    /* replaced by a new pod, and the group grows back to three */
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=inproc", "{.items[*].metadata.name}",
                         "inproc-worker-0 inproc-worker-1 inproc-worker-3", 30000);
    harness_kubectl_wait(c->k, "tj inproc", "{.status.state}/{.status.memberCount}", "Running/3",
                         30000);
    assert_int_equal(process_of("inproc-worker-0", "elastic_mlp"), t0);
    assert_int_equal(process_of("inproc-worker-1", "elastic_mlp"), t1);
    harness_kubectl_wait(c->k, "tj inproc", "{.status.restarts}", "0", 1000);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "delete tj inproc --wait=true "
                                     "--timeout=30s"), 0);
}

/* On a server without CEL (min > max passes it): the operator's own check. */
static void test_invalid_job_gets_a_condition_and_nothing_is_created(void **state)
{
    cluster *c = *state;
    char out[4096];
    apply_job(c, "bad", 2, "10", "  minReplicas: 5\n");
    harness_kubectl_wait(c->k, "tj bad",
                         "{.status.conditions[?(@.type==\"Created\")].reason}", "InvalidSpec",
                         20000);
    harness_kubectl(c->k, out, sizeof out, "get tj bad -o jsonpath="
                    "'{.status.conditions[?(@.type==\"Created\")].message}'");
    assert_non_null(strstr(out, "spec"));
    harness_kubectl(c->k, out, sizeof out, "get events -o jsonpath='{.items[*].reason}'");
    assert_non_null(strstr(out, "InvalidSpec"));
    apply_job(c, "badps", 1, "10", "  ps:\n    minReplicas: 3\n    maxReplicas: 2\n"
              "    template: {spec: {containers: [{name: s, command: [sleep, \"9\"]}]}}\n");
    harness_kubectl_wait(c->k, "tj badps", "{.status.conditions[?(@.type==\"Created\")].message}",
                         "spec.ps: minReplicas (3) is greater than maxReplicas (2)", 20000);
    /* each role within the CRD's maximum, all together past the operator's bound (1,024) */
    apply_job(c, "toomany", 1000, "10", "  ps:\n    replicas: 30\n    maxReplicas: 30\n"
              "    template: {spec: {containers: [{name: s, command: [sleep, \"9\"]}]}}\n");
    harness_kubectl_wait(c->k, "tj toomany", "{.status.conditions[?(@.type==\"Created\")]"
                         ".reason}", "InvalidSpec", 20000);
    harness_kubectl(c->k, out, sizeof out, "get tj toomany -o jsonpath="
                    "'{.status.conditions[?(@.type==\"Created\")].message}'");
    if (!strstr(out, "1000 workers (replicas) + 30 parameter servers + 0 teachers = 1030, are "
                     "more than 1024") || !strstr(out, "--max-replicas"))
        fail_msg("toomany: %s", out);
    assert_int_equal(harness_k8s_stat(c->k, "create pods"), 0);
    /* fixed: it runs */
    apply_job(c, "bad", 1, "10", NULL);
    harness_kubectl_wait(c->k, "tj bad", "{.status.conditions[?(@.type==\"Created\")].status}",
                         "True", 30000);
    harness_kubectl_wait(c->k, "tj bad", "{.status.state}", "Succeeded", 60000);
}

/* Refusals a person must see: a pod the API server will not create (quota), and a template
 * without a command (edl cannot wrap an image's entrypoint it does not know). */
static void test_refused_pods_and_bad_templates_show_in_conditions_and_events(void **state)
{
    cluster *c = *state;
    char out[8192], faults[512];
    snprintf(faults, sizeof faults, "curl -s -X POST -d '{\"verb\":\"create\",\"resource\":"
             "\"pods\",\"code\":403,\"reason\":\"Forbidden\",\"message\":\"exceeded quota: "
             "pods=0\",\"count\":-1}' %s/standin/faults >/dev/null", harness_k8s_url(c->k));
    assert_int_equal(harness_shell(faults, NULL, 0), 0);
    apply_job(c, "quota", 1, "10", NULL);
    harness_kubectl_wait(c->k, "tj quota",
                         "{.status.conditions[?(@.type==\"Created\")].reason}",
                         "PodCreateFailed", 20000);
    harness_kubectl(c->k, out, sizeof out, "get tj quota -o jsonpath="
                    "'{.status.conditions[?(@.type==\"Created\")].message}'");
    assert_non_null(strstr(out, "exceeded quota"));
    harness_kubectl(c->k, out, sizeof out, "describe tj quota");
    assert_non_null(strstr(out, "PodCreateFailed"));
    /* the quota lifted: created within the back-off, the condition clears, the job runs */
    snprintf(faults, sizeof faults, "curl -s -X DELETE %s/standin/faults >/dev/null",
             harness_k8s_url(c->k));
    assert_int_equal(harness_shell(faults, NULL, 0), 0);
    harness_kubectl_wait(c->k, "tj quota",
                         "{.status.conditions[?(@.type==\"Created\")].status}", "True", 40000);
    harness_kubectl_wait(c->k, "tj quota", "{.status.state}", "Succeeded", 60000);
    /* a template without a command: nothing created, the field named */
    char file[400];
    snprintf(file, sizeof file, "%s/nocmd.yaml", harness_k8s_dir(c->k));
    FILE *f = fopen(file, "w");
    fprintf(f, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: nocmd}\n"
               "spec:\n  template:\n    spec:\n      containers: [{name: t, image: x}]\n");
    fclose(f);
    long before = harness_k8s_stat(c->k, "create pods");
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "apply -f %s", file), 0);
    harness_kubectl_wait(c->k, "tj nocmd",
                         "{.status.conditions[?(@.type==\"Created\")].reason}", "InvalidSpec",
                         20000);
    harness_kubectl(c->k, out, sizeof out, "get tj nocmd -o jsonpath="
                    "'{.status.conditions[?(@.type==\"Created\")].message}'");
    assert_non_null(strstr(out, "containers[0].command"));
    assert_int_equal(harness_k8s_stat(c->k, "create pods"), before);
    /* a wrong type never gets past the API server's schema: kubectl says so */
    f = fopen(file, "w");
    fprintf(f, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: typo}\n"
               "spec:\n  replicas: two\n  template:\n    spec:\n      containers: [{name: t, "
               "command: [x]}]\n");
    fclose(f);
    assert_int_not_equal(harness_kubectl(c->k, out, sizeof out, "apply -f %s 2>&1", file), 0);
    assert_non_null(strstr(out, "replicas"));
}

static void test_standby_takes_over_mid_scale_and_nothing_is_done_twice(void **state)
{
    cluster *c = *state;
    char out[4096];
    c->op[1] = start_operator(c, "op-b");
    apply_job(c, "big", 1, "100000", NULL);
    harness_kubectl_wait(c->k, "tj big", "{.status.memberCount}", "1", 30000);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "scale tj/big --replicas=4"), 0);
    harness_sleep_ms(30);
    harness_kill(c->op[0], SIGKILL); /* mid-scale */
    c->op[0] = -1;
    harness_kubectl_wait(c->k, "tj big", "{.status.memberCount}", "4", 40000);
    live_pods(c, "big", out, sizeof out);
    assert_string_equal(out, "big-worker-0 big-worker-1 big-worker-2 big-worker-3 ");
    assert_int_equal(harness_k8s_stat(c->k, "create pods"), 4);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "delete tj big --wait=true "
                                     "--timeout=30s"), 0);
}

/* ---- under a real API server's conditions (latency, takeovers, old versions, refusals) ---- */

/* Wait until the file holds text; fails the test after timeout_ms. */
static void wait_log(const char *path, const char *text, int timeout_ms)
{
    static char buf[1 << 20];
    if (HARNESS_WAIT_UNTIL(strstr(harness_read_file(path, buf, sizeof buf), text), timeout_ms))
        return;
    fail_msg("%s: no \"%s\" within %d ms", path, text, timeout_ms);
}

static void operator_log(cluster *c, const char *id, char *path, size_t len)
{
    snprintf(path, len, "%s/operator-%s.log", harness_k8s_dir(c->k), id);
}

/* The reasons of the job's Events, space-separated, in order. */
static void event_reasons(cluster *c, const char *job, char *out, size_t len)
{
    harness_kubectl(c->k, out, len, "get events --field-selector involvedObject.name=%s "
                    "--sort-by=.metadata.resourceVersion -o jsonpath='{.items[*].reason}'", job);
}

static int count_words(const char *text, const char *word)
{
    int n = 0;
    size_t len = strlen(word);
    for (const char *p = text; (p = strstr(p, word)); p += len)
        n += (p == text || p[-1] == ' ') && (p[len] == ' ' || p[len] == '\0');
    return n;
}

/* The value of the operator's (slot's) metric `name` on its /metrics, -1 when not read. */
static long operator_metric(cluster *c, int slot, const char *name)
{
    static char metrics[65536];
    char key[128];
    snprintf(key, sizeof key, "\n%s{", name);
    if (harness_http_get(c->metrics_port[slot], "/metrics", metrics, sizeof metrics) != 200)
        return -1;
    const char *p = strstr(metrics, key);
    p = p ? strstr(p, "} ") : NULL;
    return p ? strtol(p + 2, NULL, 10) : -1;
}

/* More passes over the jobs (n of them), seen through: twice, each is annotated (an event of
 * the job: a pass at once) and the operator's count of passes moves by n. (The count is as of
 * the last round done; a round already on its way when it is read may make the first move,
 * the second then comes from a round that began after that one.) */
static void pass_again(cluster *c, int slot, const char *const *jobs, int n)
{
    static int pokes;
    char out[4096];
    for (int round = 0; round < 2; round++) {
        long before = operator_metric(c, slot, "edl_operator_reconciles_total");
        assert_true(before >= 0);
        pokes++;
        for (int i = 0; i < n; i++)
            assert_int_equal(harness_kubectl(c->k, out, sizeof out, "annotate --overwrite tj "
                                             "%s test.edl.dev/poke=%d", jobs[i], pokes), 0);
        long now = before;
        if (!HARNESS_WAIT_UNTIL((now = operator_metric(c, slot,
                                                       "edl_operator_reconciles_total")) >=
                                before + n, 30000))
            fail_msg("after annotating %d jobs the operator passed %ld times, not %d", n,
                     now - before, n);
    }
}

/* Sleep until the wall clock is a second past the job's status.startTime + secs: the time
 * itself is the test (a deadline measured from the job's start), only what is left of it. */
static void sleep_past_start(cluster *c, const char *job, int secs)
{
    char out[64];
    struct tm tm = {0};
    harness_kubectl(c->k, out, sizeof out, "get tj %s -o jsonpath='{.status.startTime}'", job);
    if (!strptime(out, "%Y-%m-%dT%H:%M:%SZ", &tm))
        fail_msg("tj %s: no status.startTime (\"%s\")", job, out);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t left = ((int64_t)timegm(&tm) + secs + 1) * 1000 -
                   ((int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000);
    if (left > 0)
        harness_sleep_ms((int)left);
}

/* Two operators, pod creations that take 20 ms each (as on a real API server), a scale to
 * 1,000. The leader renews its Lease on a thread of its own while it creates, so the standby
 * does not take over; frozen (SIGSTOP) for longer than its lease mid-scale, it is taken over,
 * and wakes with its writes fenced: it creates nothing more and exits 1. At no instant are
 * there more pods than replicas (the stand-in's peak counter), and no index is skipped. */
/* Apply job `name` of `replicas` pods that only sleep (up to maxReplicas = replicas). */
static void apply_sleeping_job(cluster *c, const char *name, int replicas)
{
    char out[4096], file[400];
    snprintf(file, sizeof file, "%s/%s.yaml", harness_k8s_dir(c->k), name);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fprintf(f, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: %s}\n"
               "spec:\n  replicas: %d\n  maxReplicas: %d\n  template:\n    spec:\n"
               "      containers: [{name: t, image: x, command: [sleep, \"1000\"]}]\n",
            name, replicas, replicas);
    fclose(f);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "apply -f %s", file), 0);
}

static void test_two_operators_never_make_more_pods_than_replicas(void **state)
{
    cluster *c = *state;
    char out[8192], metrics[16384];
    c->op[1] = start_operator(c, "op-b");
    harness_k8s_fault(c->k, "{\"verb\":\"create\",\"resource\":\"pods\",\"delayMs\":20,"
                            "\"count\":-1}");
    apply_sleeping_job(c, "many", 1000);
    for (int64_t end = harness_now_ms() + 60000;
         harness_k8s_stat(c->k, "create pods") < 300 && harness_now_ms() < end;)
        harness_sleep_ms(50);
    assert_true(harness_k8s_stat(c->k, "create pods") >= 300);
    int lead = -1; /* the leader: renewing on time while it creates */
    for (int i = 0; i < 2 && lead < 0; i++) {
        char want[128], late[128];
        assert_int_equal(harness_http_get(c->metrics_port[i], "/metrics", metrics,
                                          sizeof metrics), 200);
        snprintf(want, sizeof want, "edl_operator_leader{id=\"op-%c\"} 1", 'a' + i);
        snprintf(late, sizeof late, "edl_operator_lease_renewals_late_total{id=\"op-%c\"} 0\n",
                 'a' + i);
        if (strstr(metrics, want) && !strstr(metrics, late))
            fail_msg("the leader renewed late: %s", metrics);
        if (strstr(metrics, want))
            lead = i;
    }
    assert_true(lead >= 0);
    kill(c->op[lead], SIGSTOP); /* longer than its lease: the other takes over */
    if (!HARNESS_WAIT_UNTIL(operator_metric(c, 1 - lead, "edl_operator_leader") == 1, 30000))
        fail_msg("op-%c did not take over from the stopped op-%c", 'a' + 1 - lead, 'a' + lead);
    kill(c->op[lead], SIGCONT);
    assert_int_equal(harness_wait_exit(c->op[lead], 10000), 1);
    c->op[lead] = -1;
    char log[400];
    operator_log(c, lead ? "op-b" : "op-a", log, sizeof log);
    wait_log(log, "lost the leadership", 1000);
    harness_kubectl_wait(c->k, "tj many", "{.status.replicas}", "1000", 180000);
    /* the new leader's next passes, where a pod too many would come: it must not */
    pass_again(c, 1 - lead, (const char *const[]){"many"}, 1);
    assert_int_equal(harness_k8s_stat(c->k, "live pods default"), 1000);
    assert_int_equal(harness_k8s_stat(c->k, "peak pods default"), 1000);
    harness_kubectl(c->k, out, sizeof out, "get pods -l edl.dev/job=many -o jsonpath="
                    "'{.items[*].metadata.labels.edl\\.dev/index}' | tr ' ' '\\n' | sort -n | "
                    "tail -1");
    assert_string_equal(out, "999\n");
    harness_k8s_fault(c->k, NULL);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "delete tj many --wait=true "
                                     "--timeout=60s"), 0);
}

/* GET the operator's (slot 0) /metrics into buf, the slowest answer so far in *worst. */
static bool timed_scrape(cluster *c, char *buf, size_t len, int64_t *worst)
{
    int64_t t0 = harness_now_ms();
    assert_int_equal(harness_http_get(c->metrics_port[0], "/metrics", buf, len), 200);
    int64_t took = harness_now_ms() - t0;
    *worst = took > *worst ? took : *worst;
    return true;
}

/* The loop does not wait for the API server: with every pod create taking a second, the
 * passes' requests run on the operator's worker and /metrics is answered at once meanwhile
 * (it waited behind each request when the passes ran on the loop). */
static void test_a_slow_api_server_never_stalls_the_loop(void **state)
{
    cluster *c = *state;
    char out[8192], metrics[16384];
    harness_k8s_fault(c->k, "{\"verb\":\"create\",\"resource\":\"pods\",\"delayMs\":1000,"
                            "\"count\":-1}");
    apply_sleeping_job(c, "slow", 3);
    int64_t worst = 0;
    /* scrapes while three creates of a second each are on their way, until the operator
     * counts the three done */
    bool created = HARNESS_WAIT_UNTIL(
        timed_scrape(c, metrics, sizeof metrics, &worst) &&
        strstr(metrics, "edl_operator_pods_created_total{id=\"op-a\"} 3\n"), 30000);
    if (!created)
        fail_msg("the operator did not count 3 pods created within 30 s: %s", metrics);
    assert_true(harness_k8s_stat(c->k, "create pods") >= 2); /* the creates did run */
    if (worst >= 300)
        fail_msg("with the API server slow, a /metrics scrape took %lld ms", (long long)worst);
    harness_k8s_fault(c->k, NULL);
    harness_kubectl_wait(c->k, "tj slow", "{.status.replicas}", "3", 30000);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "delete tj slow --wait=true "
                                     "--timeout=60s"), 0);
}

/* Eight jobs scaled down and up together, so that one round of passes deletes pods of one job
 * and then reads the next job's: each pass reads only its own job's pods (a pass that deleted
 * pods freed objects a later pass's search of the pod index read: a heap-use-after-free under
 * ASan, the general protection fault in libcjson seen on a real cluster). */
static void test_jobs_scaled_together_each_get_their_replicas(void **state)
{
    cluster *c = *state;
    char out[8192], file[400];
    snprintf(file, sizeof file, "%s/eight.yaml", harness_k8s_dir(c->k));
    FILE *f = fopen(file, "w");
    for (char j = 'a'; j <= 'h'; j++)
        fprintf(f, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: %c}\n"
                   "spec:\n  replicas: 6\n  maxReplicas: 8\n  template:\n    spec:\n"
                   "      containers: [{name: t, image: x, command: [sleep, \"1000\"]}]\n---\n",
                j);
    fclose(f);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "apply -f %s", file), 0);
    static const int sizes[] = {1, 6, 2, 6, 1};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        assert_int_equal(harness_kubectl(c->k, out, sizeof out, "scale tj a b c d e f g h "
                                         "--replicas=%d", sizes[i]), 0);
        char want[64];
        snprintf(want, sizeof want, "%d %d %d %d %d %d %d %d", sizes[i], sizes[i], sizes[i],
                 sizes[i], sizes[i], sizes[i], sizes[i], sizes[i]);
        harness_kubectl_wait(c->k, "tj", "{.items[*].status.replicas}", want, 30000);
        assert_int_equal(kill(c->op[0], 0), 0); /* alive */
    }
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "delete tj --all --wait=true "
                                     "--timeout=60s"), 0);
}

/* Write a TrainingJob of one image-less container (command: argv), cleanPodPolicy All. */
static void apply_command_job(cluster *c, const char *name, const char *command,
                              const char *extra)
{
    char file[400], out[4096];
    snprintf(file, sizeof file, "%s/%s.yaml", harness_k8s_dir(c->k), name);
    FILE *f = fopen(file, "w");
    fprintf(f, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: %s}\n"
               "spec:\n  replicas: 2\n  cleanPodPolicy: All\n%s"
               "  elastic: {settleWindow: 300ms, leaseTTLSeconds: 3, maxRestarts: 0}\n"
               "  template:\n    spec:\n      containers: [{name: t, image: x, command: %s}]\n",
            name, extra ? extra : "", command);
    fclose(f);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "apply -f %s", file), 0);
}

/* A job's end is durable: after a takeover, a Succeeded job (its pods cleaned up) and a Failed
 * one get no pod, no Event and no new completionTime, and the Succeeded one does not turn
 * Failed when its activeDeadlineSeconds passes. The old leader's terms in etcd outlive its
 * Lease (--ttl 30), so the new leader's first passes cannot read the jobs' generations: what
 * it knows of their ends is what their statuses record. */
static void test_a_takeover_never_undoes_the_end_of_a_job(void **state)
{
    cluster *c = *state;
    char out[8192], done_at[64], failed_at[64], log[400];
    char cmd[600];
    operator_log(c, "op-a", log, sizeof log);
    wait_log(log, "leads the operator", 10000);
    kill(c->op[0], SIGTERM);
    assert_int_equal(harness_wait_exit(c->op[0], 15000), 0);
    c->op[0] = start_operator_ttl(c, "op-a-long", "30");
    snprintf(cmd, sizeof cmd, "[\"%s\", \"--steps\", \"10\", \"--step-ms\", \"20\"]",
             EDL_EXAMPLE_TRAINER);
    char extra[500];
    snprintf(extra, sizeof extra, "  activeDeadlineSeconds: 15\n  checkpoint: {uri: "
             "\"file://%s/done\"}\n", c->ckpt);
    apply_command_job(c, "done", cmd, extra);
    apply_command_job(c, "broken", "[sh, -c, \"echo boom >&2; exit 3\"]", NULL);
    harness_kubectl_wait(c->k, "tj done", "{.status.state}", "Succeeded", 60000);
    harness_kubectl_wait(c->k, "tj broken", "{.status.state}", "Failed", 60000);
    /* the script's own bug (its only rank failed by itself): failed at once, the cause in the
     * Failed condition */
    harness_kubectl(c->k, out, sizeof out, "get tj broken -o jsonpath='{.status.conditions[?("
                    "@.type==\"Failed\")].message}'");
    if (!strstr(out, "exited with code 3: last stderr: boom") || !strstr(out, "every rank"))
        fail_msg("the Failed condition: %s", out);
    harness_kubectl_wait(c->k, "pods -l 'edl.dev/job in (done,broken)'",
                         "{.items[*].metadata.name}", "", 30000);
    harness_kubectl(c->k, done_at, sizeof done_at, "get tj done -o "
                    "jsonpath='{.status.completionTime}'");
    harness_kubectl(c->k, failed_at, sizeof failed_at, "get tj broken -o "
                    "jsonpath='{.status.completionTime}'");
    long pods = harness_k8s_stat(c->k, "create pods");
    char events_done[4096], events_broken[4096];
    event_reasons(c, "done", events_done, sizeof events_done);
    event_reasons(c, "broken", events_broken, sizeof events_broken);
    assert_int_equal(count_words(events_done, "Succeeded"), 1);
    assert_int_equal(count_words(events_broken, "Failed"), 1);
    harness_kill(c->op[0], SIGKILL);
    c->op[0] = start_operator(c, "op-b-takeover"); /* while op-a-long's terms live on */
    operator_log(c, "op-b-takeover", log, sizeof log);
    wait_log(log, "every job passed once", 30000);
    sleep_past_start(c, "done", 15); /* past done's deadline, measured from its start */
    /* op-b-takeover's (slot 1) passes after it */
    pass_again(c, 1, (const char *const[]){"done", "broken"}, 2);
    harness_kubectl_wait(c->k, "tj done", "{.status.state}/{.status.completionTime}",
                         strcat(strcpy(cmd, "Succeeded/"), done_at), 1000);
    harness_kubectl_wait(c->k, "tj broken", "{.status.state}/{.status.completionTime}",
                         strcat(strcpy(cmd, "Failed/"), failed_at), 1000);
    assert_int_equal(harness_k8s_stat(c->k, "create pods"), pods);
    event_reasons(c, "done", out, sizeof out);
    assert_string_equal(out, events_done);
    event_reasons(c, "broken", out, sizeof out);
    assert_string_equal(out, events_broken);
}

/* A server without CEL (Kubernetes 1.24 drops the CRD's rules): the operator holds each rule
 * itself. Names the cluster would refuse for the Service or the pods' hostnames, and min >
 * max: InvalidSpec naming the rule, one Event, nothing created; never a status that claims
 * an object exists. */
static void test_old_servers_rules_and_names_are_the_operators(void **state)
{
    cluster *c = *state;
    char out[8192], file[400], path[512];
    static const char *const names[] = {"1job", "my.job",
        "a-sixty-character-name-that-is-a-fine-label-but-too-long-xyz"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(file, sizeof file, "%s/name-%zu.yaml", harness_k8s_dir(c->k), i);
        write_job(c, file, names[i], 1, "10", NULL);
        assert_int_equal(harness_kubectl(c->k, out, sizeof out, "apply -f %s", file), 0);
    }
    apply_job(c, "minmax", 1, "10", "  minReplicas: 5\n"); /* maxReplicas: 4 */
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(path, sizeof path, "tj %s", names[i]);
        harness_kubectl_wait(c->k, path, "{.status.conditions[?(@.type==\"Created\")].reason}",
                             "InvalidSpec", 20000);
        harness_kubectl(c->k, out, sizeof out, "get %s -o jsonpath="
                        "'{.status.conditions[?(@.type==\"Created\")].message}'", path);
        if (!strstr(out, "metadata.name") || !strstr(out, "DNS-1035"))
            fail_msg("%s: %s", names[i], out);
    }
    harness_kubectl_wait(c->k, "tj minmax", "{.status.conditions[?(@.type==\"Created\")]"
                         ".reason}", "InvalidSpec", 20000);
    pass_again(c, 0, (const char *const[]){names[0], names[1], names[2], "minmax"}, 4);
    /* more passes: still one Event each */
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        event_reasons(c, names[i], out, sizeof out);
        assert_string_equal(out, "InvalidSpec");
    }
    assert_int_equal(harness_k8s_stat(c->k, "create pods"), 0);
    assert_int_equal(harness_k8s_stat(c->k, "create services"), 0);
    assert_int_equal(harness_k8s_stat(c->k, "create secrets"), 0);
}

/* One failure policy: a status the operator may not write (a persistent 403) is retried with
 * a growing wait, not every second, and announced by one Event; an event of the job still
 * gets a pass at once, and once allowed the status is written. */
static void test_a_persistent_403_on_status_backs_off_with_one_event(void **state)
{
    cluster *c = *state;
    char out[8192];
    harness_k8s_fault(c->k, "{\"verb\":\"patch\",\"resource\":\"trainingjobs/status\","
                            "\"code\":403,\"reason\":\"Forbidden\",\"message\":\"denied by "
                            "policy\",\"count\":-1}");
    apply_job(c, "denied", 1, "100000", NULL);
    /* the writes counted in two fixed windows: the back-off's growth is the test */
    harness_sleep_ms(12000);
    long first = harness_k8s_stat(c->k, "patch trainingjobs/status");
    harness_sleep_ms(6000);
    long later = harness_k8s_stat(c->k, "patch trainingjobs/status") - first;
    if (first < 5 || later > 3)
        fail_msg("status writes: %ld in the first 12 s, %ld in the next 6 s", first, later);
    event_reasons(c, "denied", out, sizeof out);
    assert_int_equal(count_words(out, "StatusWriteFailed"), 1);
    harness_k8s_fault(c->k, NULL);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "scale tj/denied --replicas=2"), 0);
    harness_kubectl_wait(c->k, "tj denied", "{.status.replicas}", "2", 10000);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "delete tj denied --wait=true "
                                     "--timeout=30s"), 0);
}

/* ---- gang scheduling, queues, priority (spec.schedulingPolicy, Kueue's label) ----------- */

static void apply_text(cluster *c, const char *name, const char *yaml)
{
    char file[400], out[4096];
    snprintf(file, sizeof file, "%s/%s.yaml", harness_k8s_dir(c->k), name);
    FILE *f = fopen(file, "w");
    fputs(yaml, f);
    fclose(f);
    if (harness_kubectl(c->k, out, sizeof out, "apply -f %s 2>&1", file) != 0)
        fail_msg("kubectl apply %s: %s", name, out);
}

static const char GANG_FMT[] =
    "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: %s}\n"
    "spec:\n  replicas: 3\n  minReplicas: 2\n  maxReplicas: 6\n"
    "  schedulingPolicy: {scheduler: %s, queue: q1, priorityClass: high, "
    "scheduleTimeoutSeconds: 60}\n"
    "  template:\n    spec:\n      containers: [{name: t, image: x, command: [sleep, \"1000\"], "
    "resources: {requests: {cpu: 500m}}}]\n";

/* Volcano's PodGroup, owned by the job: minMember the pods it needs at once, the queue, the
 * priority and the summed requests; every pod marked for it. A scale above the minimum needs
 * no new gang; an edit of minReplicas moves minMember. The coscheduling plugin's, whose CRD the
 * cluster lacks at first: a condition says so and the pods are created all the same; once the
 * CRD is there, the next pass writes the PodGroup. */
static void test_gang_podgroups_follow_the_spec(void **state)
{
    cluster *c = *state;
    char out[8192], yaml[1024];
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "apply -f %s/tests/fixtures/"
                                     "podgroup-volcano.yaml", EDL_SOURCE_DIR), 0);
    snprintf(yaml, sizeof yaml, GANG_FMT, "gang", "volcano");
    apply_text(c, "gang", yaml);
    harness_kubectl_wait(c->k, "podgroups.scheduling.volcano.sh gang",
                         "{.spec.minMember}/{.spec.queue}/{.spec.priorityClassName}/"
                         "{.spec.minResources.cpu}", "2/q1/high/1", 20000);
    harness_kubectl_wait(c->k, "tj gang", "{.status.conditions[?(@.type==\"PodGroup\")].reason}",
                         "PodGroupCreated", 20000);
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=gang",
                         "{.items[*].spec.schedulerName}/{.items[0].spec.priorityClassName}/"
                         "{.items[0].metadata.annotations.scheduling\\.k8s\\.io/group-name}",
                         "volcano volcano volcano/high/gang", 20000);
    harness_kubectl(c->k, out, sizeof out, "get podgroups.scheduling.volcano.sh gang -o "
                    "jsonpath='{.metadata.ownerReferences[0].kind}'");
    assert_string_equal(out, "TrainingJob");
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "scale tj/gang --replicas=5"), 0);
    harness_kubectl_wait(c->k, "tj gang", "{.status.replicas}", "5", 20000);
    harness_kubectl_wait(c->k, "podgroups.scheduling.volcano.sh gang", "{.spec.minMember}", "2",
                         1000);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "patch tj gang --type=merge -p "
                                     "'{\"spec\":{\"minReplicas\":4}}'"), 0);
    harness_kubectl_wait(c->k, "podgroups.scheduling.volcano.sh gang",
                         "{.spec.minMember}/{.spec.minResources.cpu}", "4/2", 20000);
    /* the coscheduling plugin, not installed yet */
    snprintf(yaml, sizeof yaml, GANG_FMT, "cosched", "scheduler-plugins");
    apply_text(c, "cosched", yaml);
    harness_kubectl_wait(c->k, "tj cosched",
                         "{.status.conditions[?(@.type==\"PodGroup\")].reason}",
                         "PodGroupCRDMissing", 20000);
    harness_kubectl(c->k, out, sizeof out, "get tj cosched -o jsonpath="
                    "'{.status.conditions[?(@.type==\"PodGroup\")].message}'");
    assert_non_null(strstr(out, "scheduling.x-k8s.io/v1alpha1"));
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=cosched",
                         "{.items[0].metadata.labels.scheduling\\.x-k8s\\.io/pod-group}",
                         "cosched", 20000);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "apply -f %s/tests/fixtures/"
                                     "podgroup-coscheduling.yaml", EDL_SOURCE_DIR), 0);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "patch tj cosched --type=merge -p "
                                     "'{\"spec\":{\"minReplicas\":3}}'"), 0);
    harness_kubectl_wait(c->k, "podgroups.scheduling.x-k8s.io cosched",
                         "{.spec.minMember}/{.spec.scheduleTimeoutSeconds}", "3/60", 20000);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "patch tj cosched --type=merge -p "
                                     "'{\"spec\":{\"minReplicas\":2}}'"), 0);
    harness_kubectl_wait(c->k, "podgroups.scheduling.x-k8s.io cosched", "{.spec.minMember}", "2",
                         20000);
    harness_kubectl_wait(c->k, "tj cosched",
                         "{.status.conditions[?(@.type==\"PodGroup\")].reason}",
                         "PodGroupCreated", 20000);
}

/* Kueue: a job that names a queue is suspended before anything of it exists; admitted (suspend
 * false, with the node selector and tolerations Kueue puts into its template) it runs with
 * them, and is not suspended again. */
static void test_a_kueue_job_waits_suspended_until_admitted(void **state)
{
    cluster *c = *state;
    char out[8192];
    apply_text(c, "queued", "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\n"
               "metadata: {name: queued, labels: {kueue.x-k8s.io/queue-name: lq}}\n"
               "spec:\n  replicas: 2\n  template:\n    spec:\n      containers: [{name: t, "
               "image: x, command: [sleep, \"1000\"]}]\n");
    harness_kubectl_wait(c->k, "tj queued", "{.spec.suspend}/{.metadata.annotations.edl\\.dev/"
                         "queued}/{.status.state}", "true/lq/Suspended", 20000);
    assert_int_equal(harness_k8s_stat(c->k, "create pods"), 0);
    event_reasons(c, "queued", out, sizeof out);
    assert_non_null(strstr(out, "Queued"));
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "patch tj queued --type=merge -p "
                                     "'{\"spec\":{\"suspend\":false,\"template\":{\"spec\":"
                                     "{\"nodeSelector\":{\"pool\":\"a\"},\"tolerations\":[{\"key\""
                                     ":\"k\",\"operator\":\"Exists\"}]}}}}'"), 0);
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=queued",
                         "{.items[*].spec.nodeSelector.pool}/{.items[0].spec.tolerations[0].key}",
                         "a a/k", 20000);
    pass_again(c, 0, (const char *const[]){"queued"}, 1); /* it must not be suspended again */
    harness_kubectl_wait(c->k, "tj queued", "{.spec.suspend}", "false", 1000);
}

/* A big scale-up ramps at the operator's creation rate (a job: 100 pods a second after a
 * burst of 200) and says so in one RampingUp Event; every pod comes, and no more. */
static void test_a_big_scale_up_ramps_and_says_so(void **state)
{
    cluster *c = *state;
    char out[16384];
    int64_t t0 = harness_now_ms();
    apply_job(c, "wide", 400, "100000", NULL);
    harness_kubectl_wait(c->k, "tj wide", "{.status.replicas}", "400", 60000);
    print_message("400 pods in %lld ms\n", (long long)(harness_now_ms() - t0));
    assert_int_equal(harness_k8s_stat(c->k, "create pods"), 400);
    event_reasons(c, "wide", out, sizeof out);
    assert_int_equal(count_words(out, "RampingUp"), 1);
    harness_kubectl(c->k, out, sizeof out, "get events --field-selector involvedObject.name=wide,"
                    "reason=RampingUp -o jsonpath='{.items[*].message}'");
    if (!strstr(out, "creating 400 worker pods at most 100 a second (and 200 a second over "
                     "every job of this operator): about 3 s"))
        fail_msg("RampingUp: %s", out);
    /* a small scale-up, within the tokens refilled meanwhile, is not announced */
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "scale tj/wide --replicas=402"), 0);
    harness_kubectl_wait(c->k, "tj wide", "{.status.replicas}", "402", 30000);
    event_reasons(c, "wide", out, sizeof out);
    assert_int_equal(count_words(out, "RampingUp"), 1);
}

/* A pod preempted (the scheduler's DisruptionTarget condition) is replaced as a leave: no
 * failure is counted against the job's budget. */
static void test_a_preempted_pod_spends_no_restart(void **state)
{
    cluster *c = *state;
    char out[8192];
    apply_text(c, "prem", "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\n"
               "metadata: {name: prem}\nspec:\n  replicas: 2\n  schedulingPolicy: "
               "{priorityClass: low}\n  template:\n    spec:\n      containers: [{name: t, "
               "image: x, command: [sleep, \"1000\"]}]\n");
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=prem", "{.items[*].status.phase}",
                         "Running Running", 20000);
    assert_int_equal(harness_kubectl(c->k, out, sizeof out, "patch pod prem-worker-0 "
                                     "--subresource=status --type=merge -p '{\"status\":{\"phase\":"
                                     "\"Failed\",\"conditions\":[{\"type\":\"DisruptionTarget\","
                                     "\"status\":\"True\",\"reason\":\"PreemptionByScheduler\"}]}}'"),
                     0);
    harness_kubectl_wait(c->k, "pods -l edl.dev/job=prem", "{.items[*].metadata.name}",
                         "prem-worker-1 prem-worker-2", 20000);
    harness_kubectl_wait(c->k, "tj prem", "{.status.podFailures}", "0", 5000);
    event_reasons(c, "prem", out, sizeof out);
    assert_non_null(strstr(out, "PodPreempted"));
    assert_null(strstr(out, "PodFailed"));
}

/* Every "<verb> <group>/<resource>" that the rules of the chart's Roles and ClusterRoles grant
 * (chart rendered with the real helm). */
static cJSON *chart_grants(void)
{
    char file[] = "/tmp/edl-rbac-XXXXXX", cmd[1024], err[256], out[4096];
    int fd = mkstemp(file);
    assert_true(fd >= 0);
    close(fd);
    snprintf(cmd, sizeof cmd, "%s/tests/.kube/bin/helm template t %s/charts/edl --show-only "
             "templates/rbac.yaml > %s 2>&1", EDL_SOURCE_DIR, EDL_SOURCE_DIR, file);
    if (harness_shell(cmd, out, sizeof out) != 0)
        fail_msg("helm template: %s", harness_read_file(file, out, sizeof out));
    edl_yaml *y;
    if (edl_yaml_load_file(file, &y, err, sizeof err) != 0)
        fail_msg("%s", err);
    unlink(file);
    cJSON *grants = cJSON_CreateObject();
    for (size_t d = 0; d < edl_yaml_count(y); d++) {
        const cJSON *doc = edl_yaml_doc(y, d), *rule, *g, *r, *v;
        const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(doc, "kind"));
        if (!kind || (strcmp(kind, "Role") && strcmp(kind, "ClusterRole")))
            continue;
        cJSON_ArrayForEach(rule, cJSON_GetObjectItem(doc, "rules"))
            cJSON_ArrayForEach(g, cJSON_GetObjectItem(rule, "apiGroups"))
                cJSON_ArrayForEach(r, cJSON_GetObjectItem(rule, "resources"))
                    cJSON_ArrayForEach(v, cJSON_GetObjectItem(rule, "verbs")) {
                        snprintf(cmd, sizeof cmd, "%s %s/%s", v->valuestring, g->valuestring,
                                 r->valuestring);
                        cJSON_AddTrueToObject(grants, cmd);
                    }
    }
    edl_yaml_free(y);
    return grants;
}

/* The chart's RBAC against what the operator did in every test above: least privilege that
 * still works. A request no rule allows would be refused (403) in a cluster; a rule no request
 * used is privilege the operator does not need. */
static void test_the_charts_rbac_allows_each_request_and_no_more(void **state)
{
    (void)state;
    if (e2e_done < e2e_total || access(EDL_SOURCE_DIR "/tests/.kube/bin/helm", X_OK) != 0)
        skip(); /* filtered, or no helm: not every request was seen */
    cJSON *grants = chart_grants();
    const cJSON *e;
    char missing[2048] = "", unused[2048] = "";
    cJSON_ArrayForEach(e, operator_access)
        if (!cJSON_GetObjectItemCaseSensitive(grants, e->string))
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " [%s]",
                     e->string);
    cJSON_ArrayForEach(e, grants)
        if (!cJSON_GetObjectItemCaseSensitive(operator_access, e->string))
            snprintf(unused + strlen(unused), sizeof unused - strlen(unused), " [%s]",
                     e->string);
    if (missing[0] || unused[0])
        fail_msg("chart RBAC: not allowed:%s; never used:%s", missing[0] ? missing : " none",
                 unused[0] ? unused : " none");
    assert_true(cJSON_GetArraySize(grants) >= 10);
    cJSON_Delete(grants);
    cJSON_Delete(operator_access);
    operator_access = NULL;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_kubectl_drives_a_job_from_apply_to_delete, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_lost_pods_are_replaced_within_the_budget, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_dead_agents_pod_leaves_the_generation_at_once,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_suspend_resume_and_ttl_after_finished, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_inprocess_survivors_keep_running_when_a_pod_goes,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_job_gets_a_condition_and_nothing_is_created,
                                        setup_kube_1_24, teardown),
        cmocka_unit_test_setup_teardown(test_two_operators_never_make_more_pods_than_replicas,
                                        setup_phase_only, teardown),
        cmocka_unit_test_setup_teardown(test_a_takeover_never_undoes_the_end_of_a_job, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_slow_api_server_never_stalls_the_loop, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_job_applied_again_resumes_from_its_checkpoints,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_jobs_scaled_together_each_get_their_replicas,
                                        setup_phase_only, teardown),
        cmocka_unit_test_setup_teardown(test_old_servers_rules_and_names_are_the_operators,
                                        setup_kube_1_24, teardown),
        cmocka_unit_test_setup_teardown(test_a_persistent_403_on_status_backs_off_with_one_event,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_gang_podgroups_follow_the_spec, setup_phase_only,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_kueue_job_waits_suspended_until_admitted,
                                        setup_phase_only, teardown),
        cmocka_unit_test_setup_teardown(test_a_preempted_pod_spends_no_restart, setup_phase_only,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_big_scale_up_ramps_and_says_so, setup_phase_only,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_refused_pods_and_bad_templates_show_in_conditions_and_events, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_standby_takes_over_mid_scale_and_nothing_is_done_twice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ps_pods_are_created_scaled_and_replaced, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_teacher_pods_are_created_scaled_and_replaced,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_examples_pass_the_schema_and_bad_ps_sections_do_not, setup, teardown),
        cmocka_unit_test(test_the_charts_rbac_allows_each_request_and_no_more),
    };
    e2e_total = (int)(sizeof tests / sizeof tests[0]) - 1; /* all but the RBAC check */
    return cmocka_run_group_tests(tests, NULL, NULL);
}

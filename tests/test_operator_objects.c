/* test_operator_objects.c: what the operator writes to Kubernetes, checked without a server:
 * the worker pod made from a template (edl-agent wrapping the command, the downward API, the
 * job's Secret, owned by the job, PYTHONPATH naming the injected Python package), the parameter server's pod from spec.ps's template (its own
 * name, role label and `edl-agent --role ps`), the teacher's from spec.teachers's (`edl-agent
 * --role teacher --service ...`, its port from the container's), the Service, the Secret (with the operator's
 * etcd TLS files), Events, and the status with its conditions (transition times kept while a
 * condition does not change), its servers and its teachers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "edl/k8s.h"
#include "edl/trainingjob.h"
#include "operator.h"
#include "status.h"

static const char JOB[] =
    "{\"apiVersion\":\"edl.dev/v1alpha1\",\"kind\":\"TrainingJob\","
    "\"metadata\":{\"name\":\"mnist\",\"namespace\":\"team\",\"uid\":\"u-1\",\"generation\":3},"
    "\"spec\":{\"replicas\":2,\"template\":{\"metadata\":{\"labels\":{\"app\":\"x\"}},"
    "\"spec\":{\"restartPolicy\":\"Always\",\"containers\":[{\"name\":\"t\",\"image\":\"i\","
    "\"command\":[\"python\",\"train.py\"],\"args\":[\"--lr\",\"0.1\"],"
    "\"env\":[{\"name\":\"A\",\"value\":\"1\"}]}]}}}}";

static void parse_job(edl_trainingjob *tj, cJSON **obj)
{
    *obj = cJSON_Parse(JOB);
    char field[128], err[256];
    assert_int_equal(edl_trainingjob_parse(*obj, tj, field, sizeof field, err, sizeof err), 0);
}

static const cJSON *find_named(const cJSON *arr, const char *name)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        const char *n = edl_k8s_str(e, "name");
        if (n && strcmp(n, name) == 0)
            return e;
    }
    return NULL;
}

static void test_pod_wraps_the_command_in_the_agent(void **state)
{
    (void)state;
    edl_trainingjob tj;
    cJSON *obj;
    parse_job(&tj, &obj);
    op_pod_settings s = {.etcd_job = "team.mnist", .etcd_endpoints = "http://etcd:2379",
                         .agent_image = "edl:1"};
    cJSON *pod = op_pod_new(&tj, &s, OP_WORKER, 7);
    assert_string_equal(edl_k8s_str(pod, "metadata.name"), "mnist-worker-7");
    assert_string_equal(edl_k8s_str(pod, "metadata.namespace"), "team");
    const cJSON *labels = cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "metadata"), "labels");
    assert_string_equal(cJSON_GetObjectItem(labels, "edl.dev/job")->valuestring, "mnist");
    assert_string_equal(cJSON_GetObjectItem(labels, "edl.dev/index")->valuestring, "7");
    assert_string_equal(cJSON_GetObjectItem(labels, "edl.dev/role")->valuestring, "worker");
    assert_string_equal(cJSON_GetObjectItem(labels, "app")->valuestring, "x");
    const cJSON *ref = cJSON_GetArrayItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "metadata"), "ownerReferences"), 0);
    assert_string_equal(edl_k8s_str(ref, "uid"), "u-1");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(ref, "controller")));
    const cJSON *spec = cJSON_GetObjectItem(pod, "spec");
    assert_string_equal(edl_k8s_str(spec, "restartPolicy"), "Never");
    assert_string_equal(edl_k8s_str(spec, "subdomain"), "mnist");
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(spec, "containers"), 0);
    char *cmd = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "command"));
    assert_string_equal(cmd, "[\"/edl/bin/edl-agent\",\"--job\",\"team.mnist\",\"--\","
                             "\"python\",\"train.py\",\"--lr\",\"0.1\"]");
    free(cmd);
    assert_null(find_named(cJSON_GetObjectItem(c, "ports"), "edl-metrics")); /* off: none */
    assert_null(cJSON_GetObjectItem(c, "args"));
    const cJSON *env = cJSON_GetObjectItem(c, "env");
    assert_non_null(find_named(env, "A"));
    assert_string_equal(edl_k8s_str(find_named(env, "POD_IP"), "valueFrom.fieldRef.fieldPath"),
                        "status.podIP");
    assert_string_equal(edl_k8s_str(find_named(env, "EDL_ETCD_ENDPOINTS"), "value"),
                        "http://etcd:2379");
    const cJSON *init = cJSON_GetArrayItem(cJSON_GetObjectItem(spec, "initContainers"), 0);
    assert_string_equal(edl_k8s_str(init, "image"), "edl:1");
    const cJSON *vol = find_named(cJSON_GetObjectItem(spec, "volumes"), "edl-secret");
    assert_string_equal(edl_k8s_str(vol, "secret.secretName"), "mnist-edl-secret");
    assert_int_equal(edl_k8s_int(vol, "secret.defaultMode", 0), 0400);
    cJSON_Delete(pod);
    cJSON_Delete(obj);
    edl_trainingjob_clear(&tj);
}

/* The trainer's PYTHONPATH names the package that the init container installed in
 * /edl/bin/python: alone, or after the template's own value. */
static void test_trainer_imports_the_injected_python_package(void **state)
{
    (void)state;
    const char *templates[][2] = {
        {"{\"name\":\"A\",\"value\":\"1\"}", "/edl/bin/python"},
        {"{\"name\":\"PYTHONPATH\",\"value\":\"/app:/lib\"}", "/app:/lib:/edl/bin/python"},
    };
    for (size_t i = 0; i < 2; i++) {
        char job[1024];
        snprintf(job, sizeof job,
                 "{\"apiVersion\":\"edl.dev/v1alpha1\",\"kind\":\"TrainingJob\","
                 "\"metadata\":{\"name\":\"t\",\"namespace\":\"n\",\"uid\":\"u\"},"
                 "\"spec\":{\"replicas\":1,\"template\":{\"spec\":{\"containers\":[{"
                 "\"name\":\"t\",\"image\":\"i\",\"command\":[\"python3\",\"t.py\"],"
                 "\"env\":[%s]}]}}}}", templates[i][0]);
        cJSON *obj = cJSON_Parse(job);
        edl_trainingjob tj;
        char field[128], err[256];
        assert_int_equal(edl_trainingjob_parse(obj, &tj, field, sizeof field, err, sizeof err), 0);
        op_pod_settings s = {.etcd_job = "n.t", .etcd_endpoints = "http://etcd:2379",
                             .agent_image = "edl:1"};
        cJSON *pod = op_pod_new(&tj, &s, OP_WORKER, 0);
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "spec"),
                                                                "containers"), 0);
        const cJSON *env = cJSON_GetObjectItem(c, "env"), *e;
        int n = 0;
        cJSON_ArrayForEach(e, env)
            n += strcmp(edl_k8s_str(e, "name"), "PYTHONPATH") == 0;
        assert_int_equal(n, 1);
        assert_string_equal(edl_k8s_str(find_named(env, "PYTHONPATH"), "value"), templates[i][1]);
        cJSON_Delete(pod);
        cJSON_Delete(obj);
        edl_trainingjob_clear(&tj);
    }
}

static const char PS_JOB[] =
    "{\"apiVersion\":\"edl.dev/v1alpha1\",\"kind\":\"TrainingJob\","
    "\"metadata\":{\"name\":\"ctr\",\"namespace\":\"team\",\"uid\":\"u-2\"},"
    "\"spec\":{\"replicas\":2,\"template\":{\"spec\":{\"containers\":[{\"name\":\"t\","
    "\"command\":[\"ctr\"]}]}},\"ps\":{\"replicas\":2,\"maxReplicas\":4,\"template\":{"
    "\"metadata\":{\"labels\":{\"tier\":\"ps\",\"edl.dev/role\":\"worker\"}},"
    "\"spec\":{\"containers\":[{\"name\":\"server\",\"image\":\"i\",\"command\":[\"ctr\"],"
    "\"args\":[\"--threads\",\"2\"],\"resources\":{\"limits\":{\"memory\":\"8Gi\"}}}]}}}}}";

/* A parameter server's pod: spec.ps's template, its own name and indices, the role in its
 * label (a template's own edl.dev/role cannot override it) and in the agent's command. */
static void test_ps_pod_runs_the_agent_with_role_ps(void **state)
{
    (void)state;
    cJSON *obj = cJSON_Parse(PS_JOB);
    edl_trainingjob tj;
    char field[128], err[256];
    assert_int_equal(edl_trainingjob_parse(obj, &tj, field, sizeof field, err, sizeof err), 0);
    op_pod_settings s = {.etcd_job = "team.ctr", .prefix = "/p", .etcd_endpoints = "http://e:1",
                         .agent_image = "edl:1"};
    cJSON *pod = op_pod_new(&tj, &s, OP_PS, 3);
    assert_string_equal(edl_k8s_str(pod, "metadata.name"), "ctr-ps-3");
    const cJSON *labels = cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "metadata"), "labels");
    assert_string_equal(cJSON_GetObjectItem(labels, "edl.dev/job")->valuestring, "ctr");
    assert_string_equal(cJSON_GetObjectItem(labels, "edl.dev/role")->valuestring, "ps");
    assert_string_equal(cJSON_GetObjectItem(labels, "edl.dev/index")->valuestring, "3");
    assert_string_equal(cJSON_GetObjectItem(labels, "tier")->valuestring, "ps");
    const cJSON *spec = cJSON_GetObjectItem(pod, "spec");
    assert_string_equal(edl_k8s_str(spec, "hostname"), "ctr-ps-3");
    assert_string_equal(edl_k8s_str(spec, "subdomain"), "ctr");
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(spec, "containers"), 0);
    assert_string_equal(edl_k8s_str(c, "name"), "server");
    assert_string_equal(edl_k8s_str(c, "resources.limits.memory"), "8Gi");
    char *cmd = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "command"));
    assert_string_equal(cmd, "[\"/edl/bin/edl-agent\",\"--job\",\"team.ctr\",\"--prefix\","
                             "\"/p\",\"--role\",\"ps\",\"--\",\"ctr\",\"--threads\",\"2\"]");
    free(cmd);
    assert_string_equal(edl_k8s_str(find_named(cJSON_GetObjectItem(c, "env"), "POD_IP"),
                                    "valueFrom.fieldRef.fieldPath"), "status.podIP");
    assert_non_null(find_named(cJSON_GetObjectItem(spec, "volumes"), "edl-secret"));
    cJSON_Delete(pod);
    pod = op_pod_new(&tj, &s, OP_WORKER, 0); /* the workers' pod of the same job */
    assert_string_equal(edl_k8s_str(pod, "metadata.name"), "ctr-worker-0");
    c = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "spec"), "containers"),
                           0);
    cmd = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "command"));
    assert_null(strstr(cmd, "--role"));
    free(cmd);
    cJSON_Delete(pod);
    /* the scale subresource's selector counts the workers only */
    char *sel = op_selector("ctr");
    assert_string_equal(sel, "edl.dev/job=ctr,edl.dev/role=worker");
    free(sel);
    cJSON_Delete(obj);
    edl_trainingjob_clear(&tj);
}

static const char TEACHER_JOB[] =
    "{\"apiVersion\":\"edl.dev/v1alpha1\",\"kind\":\"TrainingJob\","
    "\"metadata\":{\"name\":\"kd\",\"namespace\":\"team\",\"uid\":\"u-3\"},"
    "\"spec\":{\"replicas\":2,\"template\":{\"spec\":{\"containers\":[{\"name\":\"t\","
    "\"command\":[\"distill\"]}]}},"
    "\"teachers\":{\"replicas\":2,\"maxReplicas\":4,\"service\":\"mlp\",\"model\":\"mlp\","
    "\"capacity\":4,\"template\":{\"metadata\":{\"labels\":{\"edl.dev/role\":\"worker\","
    "\"tier\":\"serving\"}},\"spec\":{\"restartPolicy\":\"Always\",\"containers\":[{\"name\":"
    "\"server\",\"image\":\"i\",\"command\":[\"distill\"],\"args\":[\"--steps\",\"300\"],"
    "\"ports\":[{\"containerPort\":8501}],\"env\":[{\"name\":\"A\",\"value\":\"1\"}]}]}}}}}";

/* A teacher's pod: spec.teachers's template, its own name and indices, the role in its label
 * (the template's edl.dev/role cannot override it), `edl-agent --role teacher` with the
 * service, model, capacity and the container's port, the downward API, the job's Secret, the
 * kubelet never restarting it, owned by the job. */
static void test_teacher_pod_runs_the_agent_with_role_teacher(void **state)
{
    (void)state;
    cJSON *obj = cJSON_Parse(TEACHER_JOB);
    edl_trainingjob tj;
    char field[128], err[256];
    assert_int_equal(edl_trainingjob_parse(obj, &tj, field, sizeof field, err, sizeof err), 0);
    op_pod_settings s = {.etcd_job = "team.kd", .etcd_endpoints = "http://e:1",
                         .agent_image = "edl:1", .agent_metrics_port = 9400};
    cJSON *pod = op_pod_new(&tj, &s, OP_TEACHER, 5);
    assert_string_equal(edl_k8s_str(pod, "metadata.name"), "kd-teacher-5");
    assert_string_equal(edl_k8s_str(pod, "metadata.namespace"), "team");
    const cJSON *md = cJSON_GetObjectItem(pod, "metadata");
    const cJSON *labels = cJSON_GetObjectItem(md, "labels");
    assert_string_equal(cJSON_GetObjectItem(labels, "edl.dev/job")->valuestring, "kd");
    assert_string_equal(cJSON_GetObjectItem(labels, "edl.dev/role")->valuestring, "teacher");
    assert_string_equal(cJSON_GetObjectItem(labels, "edl.dev/index")->valuestring, "5");
    assert_string_equal(cJSON_GetObjectItem(labels, "tier")->valuestring, "serving");
    const cJSON *ref = cJSON_GetArrayItem(cJSON_GetObjectItem(md, "ownerReferences"), 0);
    assert_string_equal(edl_k8s_str(ref, "kind"), "TrainingJob");
    assert_string_equal(edl_k8s_str(ref, "name"), "kd");
    assert_string_equal(edl_k8s_str(ref, "uid"), "u-3");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(ref, "controller")));
    const cJSON *spec = cJSON_GetObjectItem(pod, "spec");
    assert_string_equal(edl_k8s_str(spec, "restartPolicy"), "Never");
    assert_string_equal(edl_k8s_str(spec, "hostname"), "kd-teacher-5");
    assert_string_equal(edl_k8s_str(spec, "subdomain"), "kd");
    assert_string_equal(edl_k8s_str(cJSON_GetArrayItem(cJSON_GetObjectItem(spec,
                                                                           "initContainers"), 0),
                                    "image"), "edl:1");
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(spec, "containers"), 0);
    assert_string_equal(edl_k8s_str(c, "name"), "server");
    char *cmd = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "command"));
    assert_string_equal(cmd, "[\"/edl/bin/edl-agent\",\"--job\",\"team.kd\",\"--role\","
                             "\"teacher\",\"--service\",\"mlp\",\"--model\",\"mlp\","
                             "\"--capacity\",\"4\",\"--port\",\"8501\",\"--metrics-port\","
                             "\"9400\",\"--\",\"distill\","
                             "\"--steps\",\"300\"]");
    free(cmd);
    /* the agent's /metrics after the template's port, which stays the teacher's (first) */
    const cJSON *ports = cJSON_GetObjectItem(c, "ports");
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(ports, 0), "containerPort")->valueint,
                     8501);
    assert_int_equal(cJSON_GetObjectItem(find_named(ports, "edl-metrics"),
                                         "containerPort")->valueint, 9400);
    assert_null(cJSON_GetObjectItem(c, "args"));
    const cJSON *env = cJSON_GetObjectItem(c, "env");
    assert_string_equal(edl_k8s_str(find_named(env, "A"), "value"), "1");
    assert_string_equal(edl_k8s_str(find_named(env, "EDL_POD_ID"),
                                    "valueFrom.fieldRef.fieldPath"), "metadata.name");
    assert_string_equal(edl_k8s_str(find_named(env, "POD_IP"), "valueFrom.fieldRef.fieldPath"),
                        "status.podIP");
    assert_string_equal(edl_k8s_str(find_named(env, "EDL_ETCD_ENDPOINTS"), "value"),
                        "http://e:1");
    assert_non_null(find_named(cJSON_GetObjectItem(c, "volumeMounts"), "edl-bin"));
    assert_non_null(find_named(cJSON_GetObjectItem(spec, "volumes"), "edl-secret"));
    cJSON_Delete(pod);
    /* without model, capacity or a containerPort: only the service (the agent's defaults) */
    free(tj.teacher_model);
    tj.teacher_model = NULL;
    tj.teacher_capacity = 0;
    cJSON *ctr = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(
                                        tj.teacher_template, "spec"), "containers"), 0);
    cJSON_DeleteItemFromObject(ctr, "ports");
    pod = op_pod_new(&tj, &s, OP_TEACHER, 0);
    c = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "spec"), "containers"),
                           0);
    cmd = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "command"));
    assert_string_equal(cmd, "[\"/edl/bin/edl-agent\",\"--job\",\"team.kd\",\"--role\","
                             "\"teacher\",\"--service\",\"mlp\",\"--metrics-port\",\"9400\","
                             "\"--\",\"distill\","
                             "\"--steps\",\"300\"]");
    free(cmd);
    cJSON_Delete(pod);
    assert_int_equal(op_role_of("teacher"), OP_TEACHER);
    assert_int_equal(op_role_of("ps"), OP_PS);
    assert_int_equal(op_role_of(NULL), OP_WORKER);
    assert_int_equal(op_role_of("other"), OP_WORKER);
    cJSON_Delete(obj);
    edl_trainingjob_clear(&tj);
}

static void test_service_secret_and_event(void **state)
{
    (void)state;
    edl_trainingjob tj;
    cJSON *obj;
    parse_job(&tj, &obj);
    cJSON *svc = op_service_new(&tj);
    assert_string_equal(edl_k8s_str(svc, "spec.clusterIP"), "None");
    cJSON *a = op_secret_new(&tj, NULL), *b = op_secret_new(&tj, NULL);
    const char *ka = edl_k8s_str(a, "data.job-secret"), *kb = edl_k8s_str(b, "data.job-secret");
    assert_int_equal(strlen(ka), 44); /* 32 bytes in base64 */
    assert_string_not_equal(ka, kb);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(a, "data")), 1);
    cJSON *ev = op_event_new(obj, "Warning", "PodCreateFailed", "quota", "op-1");
    assert_string_equal(edl_k8s_str(ev, "involvedObject.kind"), "TrainingJob");
    assert_string_equal(edl_k8s_str(ev, "involvedObject.uid"), "u-1");
    assert_string_equal(edl_k8s_str(ev, "metadata.generateName"), "mnist.");
    cJSON_Delete(svc);
    cJSON_Delete(a);
    cJSON_Delete(b);
    cJSON_Delete(ev);
    cJSON_Delete(obj);
    edl_trainingjob_clear(&tj);
}

static const char *cond(const cJSON *st, const char *type, const char *field)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(st, "conditions"))
        if (strcmp(edl_k8s_str(c, "type"), type) == 0)
            return edl_k8s_str(c, field);
    return NULL;
}

static void test_conditions_keep_their_transition_times(void **state)
{
    (void)state;
    edl_generation g = {.generation = 4, .state = EDL_JOB_RUNNING, .restarts = 1};
    op_view v = {.state = op_state_of(&g), .replicas = 2, .selector = "edl.dev/job=x",
                 .gen = &g, .observed_generation = 2, .objects_created = true};
    int64_t t0 = INT64_C(1795000000000);
    cJSON *s1 = op_status_new(NULL, &v, t0);
    assert_string_equal(edl_k8s_str(s1, "state"), "Running");
    assert_string_equal(cond(s1, "Running", "status"), "True");
    assert_string_equal(cond(s1, "Created", "reason"), "TrainingJobCreated");
    assert_null(cond(s1, "Succeeded", "status")); /* never true: absent */
    assert_null(cond(s1, "Synced", "status"));    /* never failed: absent */
    /* the same view later: nothing changes, not even the times */
    cJSON *s2 = op_status_new(s1, &v, t0 + 60000);
    assert_true(op_status_same(s1, s2));
    /* success: Running turns False (new time), Succeeded appears */
    g.state = EDL_JOB_SUCCEEDED;
    v.state = op_state_of(&g);
    cJSON *s3 = op_status_new(s2, &v, t0 + 120000);
    assert_string_equal(cond(s3, "Running", "status"), "False");
    assert_string_equal(cond(s3, "Succeeded", "status"), "True");
    assert_string_not_equal(cond(s3, "Running", "lastTransitionTime"),
                            cond(s1, "Running", "lastTransitionTime"));
    assert_string_equal(cond(s3, "Created", "lastTransitionTime"),
                        cond(s1, "Created", "lastTransitionTime"));
    /* an invalid spec: Created False with the field in the message */
    op_view bad = {.state = OP_INVALID, .message = "spec.minReplicas: too big",
                   .selector = "edl.dev/job=x"};
    cJSON *s4 = op_status_new(s3, &bad, t0 + 180000);
    assert_string_equal(cond(s4, "Created", "status"), "False");
    assert_string_equal(cond(s4, "Created", "reason"), "InvalidSpec");
    assert_string_equal(cond(s4, "Created", "message"), "spec.minReplicas: too big");
    cJSON_Delete(s1);
    cJSON_Delete(s2);
    cJSON_Delete(s3);
    cJSON_Delete(s4);
}

/* A status never claims an object that is not there: Created is True only when the Secret and
 * the Service exist and no creation fails; another failure of a pass shows in Synced, which
 * stays (True) once it has appeared. */
static void test_created_and_synced_say_only_what_is_true(void **state)
{
    (void)state;
    op_view v = {.state = OP_CREATED, .selector = "edl.dev/job=x"};
    int64_t t0 = INT64_C(1795000000000);
    cJSON *s1 = op_status_new(NULL, &v, t0);
    assert_string_equal(cond(s1, "Created", "status"), "False");
    assert_string_equal(cond(s1, "Created", "reason"), "Creating");
    v.create_error = "cannot create the job's Service 1job: a DNS-1035 label must ...";
    v.create_reason = "ServiceCreateFailed";
    cJSON *s2 = op_status_new(s1, &v, t0 + 1000);
    assert_string_equal(cond(s2, "Created", "status"), "False");
    assert_string_equal(cond(s2, "Created", "reason"), "ServiceCreateFailed");
    assert_non_null(strstr(cond(s2, "Created", "message"), "DNS-1035"));
    assert_null(cond(s2, "Synced", "status"));
    v.create_error = NULL;
    v.objects_created = true;
    v.error = "cannot write the job's spec to etcd: no endpoint reachable";
    v.error_reason = "EtcdUnavailable";
    cJSON *s3 = op_status_new(s2, &v, t0 + 2000);
    assert_string_equal(cond(s3, "Created", "status"), "True");
    assert_string_equal(cond(s3, "Synced", "status"), "False");
    assert_string_equal(cond(s3, "Synced", "reason"), "EtcdUnavailable");
    v.error = NULL;
    cJSON *s4 = op_status_new(s3, &v, t0 + 3000);
    assert_string_equal(cond(s4, "Synced", "status"), "True");
    assert_string_equal(cond(s4, "Synced", "reason"), "ReconcileSucceeded");
    cJSON_Delete(s1);
    cJSON_Delete(s2);
    cJSON_Delete(s3);
    cJSON_Delete(s4);
}

/* With spec.ps the status carries the servers' pods and the generation's ranked servers;
 * without it, none of those keys. */
static void test_status_reports_the_servers(void **state)
{
    (void)state;
    edl_member members[] = {{.pod = "ctr-worker-0", .rank = 0},
                            {.pod = "ctr-worker-1", .rank = 1}};
    edl_member servers[] = {{.pod = "ctr-ps-1", .rank = 0}, {.pod = "ctr-ps-0", .rank = 1}};
    edl_generation g = {.generation = 2, .state = EDL_JOB_RUNNING, .members = members,
                        .n_members = 2, .servers = servers, .n_servers = 2};
    op_view v = {.state = OP_RUNNING, .replicas = 2, .ps = true, .ps_replicas = 3,
                 .selector = "s", .gen = &g};
    cJSON *st = op_status_new(NULL, &v, INT64_C(1795000000000));
    assert_int_equal(edl_k8s_int(st, "psReplicas", -1), 3);
    assert_int_equal(edl_k8s_int(st, "serverCount", -1), 2);
    assert_int_equal(edl_k8s_int(st, "memberCount", -1), 2);
    const cJSON *sv = cJSON_GetObjectItem(st, "servers");
    assert_int_equal(cJSON_GetArraySize(sv), 2);
    assert_string_equal(edl_k8s_str(cJSON_GetArrayItem(sv, 0), "pod"), "ctr-ps-1");
    assert_int_equal(edl_k8s_int(cJSON_GetArrayItem(sv, 1), "rank", -1), 1);
    cJSON_Delete(st);
    g.n_servers = 0;
    v.ps = false;
    st = op_status_new(NULL, &v, INT64_C(1795000000000));
    assert_null(cJSON_GetObjectItem(st, "psReplicas"));
    assert_null(cJSON_GetObjectItem(st, "servers"));
    cJSON_Delete(st);
}

/* With spec.teachers the status carries status.teachers {desired, replicas, ready}; without
 * it, no such key. */
static void test_status_reports_the_teachers(void **state)
{
    (void)state;
    op_view v = {.state = OP_RUNNING, .replicas = 2, .teachers = true, .teacher_desired = 3,
                 .teacher_replicas = 2, .teachers_ready = 1, .selector = "s"};
    cJSON *st = op_status_new(NULL, &v, INT64_C(1795000000000));
    assert_int_equal(edl_k8s_int(st, "teachers.desired", -1), 3);
    assert_int_equal(edl_k8s_int(st, "teachers.replicas", -1), 2);
    assert_int_equal(edl_k8s_int(st, "teachers.ready", -1), 1);
    assert_int_equal(edl_k8s_int(st, "replicas", -1), 2); /* the workers' */
    assert_null(cJSON_GetObjectItem(st, "psReplicas"));
    cJSON_Delete(st);
    v.teachers = false;
    st = op_status_new(NULL, &v, INT64_C(1795000000000));
    assert_null(cJSON_GetObjectItem(st, "teachers"));
    cJSON_Delete(st);
}

static void test_states_of_generations(void **state)
{
    (void)state;
    assert_int_equal(op_state_of(NULL), OP_CREATED);
    edl_generation g = {.generation = 2, .state = EDL_JOB_WAITING, .reason = "restart 1 of 3"};
    assert_int_equal(op_state_of(&g), OP_RESTARTING);
    g.reason = "waiting for 2 members";
    assert_int_equal(op_state_of(&g), OP_WAITING);
    g.state = EDL_JOB_STOPPED;
    assert_string_equal(op_state_name(op_state_of(&g)), "Stopped");
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The operator's etcd CA and client certificate reach the pods through the job's own Secret
 * (a Secret of another namespace cannot be mounted); bad files are refused, naming them. */
static void test_etcd_tls_files_travel_in_the_job_secret(void **state)
{
    (void)state;
    char dir[] = "/tmp/edl-tls-XXXXXX", ca[64], cert[64], key[64], err[256];
    assert_non_null(mkdtemp(dir));
    snprintf(ca, sizeof ca, "%s/ca.crt", dir);
    snprintf(cert, sizeof cert, "%s/tls.crt", dir);
    snprintf(key, sizeof key, "%s/tls.key", dir);
    write_file(ca, "CA");
    write_file(cert, "CERT");
    edl_etcd_config etcd = {.ca_file = ca, .cert_file = cert, .key_file = key};
    op_etcd_tls tls;
    assert_int_equal(op_etcd_tls_load(&tls, &etcd, err, sizeof err), EDL_EINVAL);
    assert_non_null(strstr(err, key)); /* missing */
    write_file(key, "");
    assert_int_equal(op_etcd_tls_load(&tls, &etcd, err, sizeof err), EDL_EINVAL);
    assert_non_null(strstr(err, "empty"));
    write_file(key, "KEY");
    assert_int_equal(op_etcd_tls_load(&tls, &etcd, err, sizeof err), 0);
    edl_trainingjob tj;
    cJSON *obj;
    parse_job(&tj, &obj);
    cJSON *sec = op_secret_new(&tj, &tls);
    const cJSON *data = cJSON_GetObjectItem(sec, "data"); /* keys hold dots: no paths */
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(data, "etcd-ca.crt")), "Q0E=");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(data, "etcd-tls.crt")),
                        "Q0VSVA==");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(data, "etcd-tls.key")), "S0VZ");
    op_pod_settings s = {.etcd_job = "team.mnist", .etcd_endpoints = "https://etcd:2379",
                         .etcd_tls = &tls, .agent_image = "edl:1"};
    cJSON *pod = op_pod_new(&tj, &s, OP_WORKER, 0);
    const cJSON *c = cJSON_GetArrayItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "spec"), "containers"), 0);
    const cJSON *env = cJSON_GetObjectItem(c, "env");
    assert_string_equal(edl_k8s_str(find_named(env, "EDL_ETCD_CACERT"), "value"),
                        "/edl/secret/etcd-ca.crt");
    assert_string_equal(edl_k8s_str(find_named(env, "EDL_ETCD_KEY"), "value"),
                        "/edl/secret/etcd-tls.key");
    cJSON_Delete(pod);
    cJSON_Delete(sec);
    cJSON_Delete(obj);
    edl_trainingjob_clear(&tj);
    op_etcd_tls_clear(&tls);
    unlink(ca), unlink(cert), unlink(key), rmdir(dir);
}

static const char GANG_JOB[] =
    "{\"apiVersion\":\"edl.dev/v1alpha1\",\"kind\":\"TrainingJob\","
    "\"metadata\":{\"name\":\"big\",\"namespace\":\"team\",\"uid\":\"u-2\","
    "\"labels\":{\"kueue.x-k8s.io/queue-name\":\"lq\"}},"
    "\"spec\":{\"replicas\":4,\"minReplicas\":3,\"maxReplicas\":8,"
    "\"schedulingPolicy\":{\"scheduler\":\"%s\",\"queue\":\"q1\",\"priorityClass\":\"high\","
    "\"scheduleTimeoutSeconds\":90},"
    "\"template\":{\"spec\":{\"containers\":[{\"name\":\"t\",\"command\":[\"x\"],"
    "\"resources\":{\"requests\":{\"cpu\":\"500m\",\"memory\":\"1Gi\"},"
    "\"limits\":{\"nvidia.com/gpu\":\"1\"}}},{\"name\":\"side\",\"image\":\"s\","
    "\"resources\":{\"requests\":{\"cpu\":\"0.25\"}}}]}},"
    "\"ps\":{\"replicas\":2,\"minReplicas\":2,\"template\":{\"spec\":{\"containers\":"
    "[{\"name\":\"s\",\"command\":[\"y\"],\"resources\":{\"requests\":{\"cpu\":\"2\"}}}]}}}}}";

static void parse_gang(edl_trainingjob *tj, cJSON **obj, const char *scheduler)
{
    char json[2048], field[128], err[256];
    snprintf(json, sizeof json, GANG_JOB, scheduler);
    *obj = cJSON_Parse(json);
    assert_non_null(*obj);
    if (edl_trainingjob_parse(*obj, tj, field, sizeof field, err, sizeof err) != 0)
        fail_msg("%s: %s", field, err);
}

/* A gang: the PodGroup of each scheduler (minMember the roles' minimums, minResources their
 * requests), the pods' marks, schedulerName and priority; the queue label read. */
static void test_gang_scheduling_objects(void **state)
{
    (void)state;
    edl_trainingjob tj;
    cJSON *obj;
    parse_gang(&tj, &obj, "volcano");
    assert_int_equal(tj.sched.gang, EDL_GANG_VOLCANO);
    assert_string_equal(tj.sched.kueue_queue, "lq");
    assert_int_equal(edl_trainingjob_min_available(&tj), 5); /* 3 workers + 2 servers */
    cJSON *pg = op_podgroup_new(&tj);
    assert_string_equal(edl_k8s_str(pg, "apiVersion"), "scheduling.volcano.sh/v1beta1");
    assert_string_equal(edl_k8s_str(pg, "metadata.name"), "big");
    assert_int_equal(edl_k8s_int(pg, "spec.minMember", 0), 5);
    assert_string_equal(edl_k8s_str(pg, "spec.queue"), "q1");
    assert_string_equal(edl_k8s_str(pg, "spec.priorityClassName"), "high");
    assert_null(cJSON_GetObjectItem(cJSON_GetObjectItem(pg, "spec"), "scheduleTimeoutSeconds"));
    /* 3 workers of 0.5 + 0.25 cpu, 1Gi and a GPU (a limit standing for its request), 2
     * servers of 2 cpu */
    const cJSON *res = cJSON_GetObjectItem(cJSON_GetObjectItem(pg, "spec"), "minResources");
    assert_string_equal(cJSON_GetObjectItem(res, "cpu")->valuestring, "6250m");
    assert_string_equal(cJSON_GetObjectItem(res, "memory")->valuestring, "3221225472");
    assert_string_equal(cJSON_GetObjectItem(res, "nvidia.com/gpu")->valuestring, "3");
    op_pod_settings set = {.etcd_job = "team.big", .etcd_endpoints = "http://e:2379",
                           .agent_image = "edl:1"};
    cJSON *pod = op_pod_new(&tj, &set, OP_PS, 0);
    assert_string_equal(edl_k8s_str(pod, "spec.schedulerName"), "volcano");
    assert_string_equal(edl_k8s_str(pod, "spec.priorityClassName"), "high");
    const cJSON *ann = cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "metadata"), "annotations");
    assert_string_equal(cJSON_GetObjectItem(ann, "scheduling.k8s.io/group-name")->valuestring,
                        "big");
    cJSON_Delete(pod);
    cJSON_Delete(pg);
    edl_trainingjob_clear(&tj);
    cJSON_Delete(obj);
    parse_gang(&tj, &obj, "scheduler-plugins");
    pg = op_podgroup_new(&tj);
    assert_string_equal(edl_k8s_str(pg, "apiVersion"), "scheduling.x-k8s.io/v1alpha1");
    assert_int_equal(edl_k8s_int(pg, "spec.scheduleTimeoutSeconds", 0), 90);
    assert_null(cJSON_GetObjectItem(cJSON_GetObjectItem(pg, "spec"), "queue"));
    pod = op_pod_new(&tj, &set, OP_WORKER, 3);
    assert_string_equal(edl_k8s_str(pod, "spec.schedulerName"), "scheduler-plugins-scheduler");
    const cJSON *labels = cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "metadata"), "labels");
    assert_string_equal(cJSON_GetObjectItem(labels, "scheduling.x-k8s.io/pod-group")->valuestring,
                        "big");
    cJSON_Delete(pod);
    cJSON_Delete(pg);
    edl_trainingjob_clear(&tj);
    cJSON_Delete(obj);
    parse_gang(&tj, &obj, "default"); /* no gang: no PodGroup, the priority still */
    assert_null(op_podgroup_new(&tj));
    pod = op_pod_new(&tj, &set, OP_WORKER, 0);
    assert_null(edl_k8s_str(pod, "spec.schedulerName"));
    assert_string_equal(edl_k8s_str(pod, "spec.priorityClassName"), "high");
    cJSON_Delete(pod);
    edl_trainingjob_clear(&tj);
    cJSON_Delete(obj);
}

static void test_preempted_pods_are_told_apart(void **state)
{
    (void)state;
    static const struct {
        const char *status;
        bool preempted;
    } cases[] = {
        {"{\"phase\":\"Failed\",\"reason\":\"Evicted\"}", true},
        {"{\"phase\":\"Failed\",\"reason\":\"Preempting\"}", true},
        {"{\"phase\":\"Failed\",\"conditions\":[{\"type\":\"Ready\",\"status\":\"False\"},"
         "{\"type\":\"DisruptionTarget\",\"status\":\"True\"}]}", true},
        {"{\"phase\":\"Failed\",\"conditions\":[{\"type\":\"DisruptionTarget\","
         "\"status\":\"False\"}]}", false},
        {"{\"phase\":\"Failed\",\"reason\":\"Error\"}", false},
        {"{\"phase\":\"Failed\"}", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char json[512];
        snprintf(json, sizeof json, "{\"status\":%s}", cases[i].status);
        cJSON *pod = cJSON_Parse(json);
        if (op_pod_preempted(pod) != cases[i].preempted)
            fail_msg("case %zu: %s", i, cases[i].status);
        cJSON_Delete(pod);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pod_wraps_the_command_in_the_agent),
        cmocka_unit_test(test_trainer_imports_the_injected_python_package),
        cmocka_unit_test(test_ps_pod_runs_the_agent_with_role_ps),
        cmocka_unit_test(test_status_reports_the_servers),
        cmocka_unit_test(test_status_reports_the_teachers),
        cmocka_unit_test(test_teacher_pod_runs_the_agent_with_role_teacher),
        cmocka_unit_test(test_service_secret_and_event),
        cmocka_unit_test(test_etcd_tls_files_travel_in_the_job_secret),
        cmocka_unit_test(test_conditions_keep_their_transition_times),
        cmocka_unit_test(test_created_and_synced_say_only_what_is_true),
        cmocka_unit_test(test_states_of_generations),
        cmocka_unit_test(test_gang_scheduling_objects),
        cmocka_unit_test(test_preempted_pods_are_told_apart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

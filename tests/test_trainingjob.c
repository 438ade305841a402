/* test_trainingjob.c: manifests without a cluster: YAML read into cJSON with the line of every
 * node (and every refusal: aliases, duplicate keys, depth, syntax, empty and huge files), the
 * TrainingJob read with the CRD's defaults and every field mapped (spec.ps and spec.teachers too,
 * their bounds read back from the etcd spec), each bad input named by its field path and code with the output
 * left cleared, the fields only a cluster uses, and durations. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "edl/trainingjob.h"
#include "edl/yaml.h"

static edl_yaml *load_ok(const char *text)
{
    edl_yaml *y = NULL;
    char err[512] = "";
    int rc = edl_yaml_load("t.yaml", text, strlen(text), &y, err, sizeof err);
    if (rc)
        fail_msg("load: %s (%s)", edl_strerror(rc), err);
    return y;
}

/* The code of a refused text; err receives the message. */
static int load_err(const char *text, char *err, size_t errlen)
{
    edl_yaml *y = (edl_yaml *)1;
    int rc = edl_yaml_load("t.yaml", text, strlen(text), &y, err, errlen);
    assert_null(y);
    return rc;
}

/* ---- YAML --------------------------------------------------------------------------------- */

static void test_yaml_scalars_resolve_as_the_core_schema(void **state)
{
    (void)state;
    edl_yaml *y = load_ok("a: 12\nb: -3\nc: 1.5\nd: true\ne: False\nf: ~\ng:\nh: null\n"
                          "i: \"12\"\nj: 'true'\nk: yes\nl: 0x1f\nm: 0o17\nn: 1e3\no: .inf\n"
                          "p: 12abc\nq: !!str 7\nr: |\n  two\n  lines\ns: [1, x, \"\"]\n"
                          "t: {u: v}\n");
    const cJSON *d = edl_yaml_doc(y, 0);
    assert_int_equal(edl_yaml_count(y), 1);
    assert_string_equal(edl_yaml_name(y), "t.yaml");
    assert_true(cJSON_IsNumber(cJSON_GetObjectItem(d, "a")));
    assert_int_equal(cJSON_GetObjectItem(d, "a")->valueint, 12);
    assert_int_equal(cJSON_GetObjectItem(d, "b")->valueint, -3);
    assert_true(cJSON_GetObjectItem(d, "c")->valuedouble == 1.5);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(d, "d")));
    assert_true(cJSON_IsFalse(cJSON_GetObjectItem(d, "e")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(d, "f")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(d, "g")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(d, "h")));
    assert_string_equal(cJSON_GetObjectItem(d, "i")->valuestring, "12");
    assert_string_equal(cJSON_GetObjectItem(d, "j")->valuestring, "true");
    assert_string_equal(cJSON_GetObjectItem(d, "k")->valuestring, "yes"); /* not YAML 1.1 */
    assert_int_equal(cJSON_GetObjectItem(d, "l")->valueint, 31);
    assert_int_equal(cJSON_GetObjectItem(d, "m")->valueint, 15);
    assert_true(cJSON_GetObjectItem(d, "n")->valuedouble == 1000);
    assert_string_equal(cJSON_GetObjectItem(d, "o")->valuestring, ".inf");
    assert_string_equal(cJSON_GetObjectItem(d, "p")->valuestring, "12abc");
    assert_string_equal(cJSON_GetObjectItem(d, "q")->valuestring, "7");
    assert_string_equal(cJSON_GetObjectItem(d, "r")->valuestring, "two\nlines\n");
    const cJSON *s = cJSON_GetObjectItem(d, "s");
    assert_int_equal(cJSON_GetArraySize(s), 3);
    assert_true(cJSON_IsNumber(cJSON_GetArrayItem(s, 0)));
    assert_string_equal(cJSON_GetArrayItem(s, 1)->valuestring, "x");
    assert_string_equal(cJSON_GetArrayItem(s, 2)->valuestring, "");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(d, "t"), "u")->valuestring, "v");
    edl_yaml_free(y);
}

static void test_yaml_lines_of_nested_fields_and_items(void **state)
{
    (void)state;
    edl_yaml *y = load_ok("# comment\n"                  /* 1 */
                          "apiVersion: v1\n"             /* 2 */
                          "spec:\n"                      /* 3 */
                          "  template:\n"                /* 4 */
                          "    spec:\n"                  /* 5 */
                          "      containers:\n"          /* 6 */
                          "        - name: a\n"          /* 7 */
                          "          command:\n"         /* 8 */
                          "            - sh\n"           /* 9 */
                          "            - -c\n"           /* 10 */
                          "        - name: b\n"          /* 11 */
                          "          image: x\n");       /* 12 */
    assert_int_equal(edl_yaml_line(y, 0, "apiVersion"), 2);
    assert_int_equal(edl_yaml_line(y, 0, "spec"), 3);
    assert_int_equal(edl_yaml_line(y, 0, "spec.template.spec"), 5);
    assert_int_equal(edl_yaml_line(y, 0, "spec.template.spec.containers"), 6);
    assert_int_equal(edl_yaml_line(y, 0, "spec.template.spec.containers[0]"), 7);
    assert_int_equal(edl_yaml_line(y, 0, "spec.template.spec.containers[0].command[1]"), 10);
    assert_int_equal(edl_yaml_line(y, 0, "spec.template.spec.containers[1].image"), 12);
    /* absent: the nearest ancestor that exists */
    assert_int_equal(edl_yaml_line(y, 0, "spec.template.spec.containers[1].args[3]"), 11);
    assert_int_equal(edl_yaml_line(y, 0, "spec.replicas"), 3);
    assert_int_equal(edl_yaml_line(y, 0, "metadata.name"), 2); /* the document */
    assert_int_equal(edl_yaml_line(y, 0, ""), 2);
    assert_int_equal(edl_yaml_line(y, 0, NULL), 2);
    assert_int_equal(edl_yaml_line(y, 1, "spec"), 0); /* no such document */
    assert_int_equal(edl_yaml_line(NULL, 0, "spec"), 0);
    edl_yaml_free(y);
}

static void test_yaml_multiple_documents(void **state)
{
    (void)state;
    edl_yaml *y = load_ok("kind: A\n---\nkind: B\nx: 1\n---\n# nothing\n---\n- 1\n");
    assert_int_equal(edl_yaml_count(y), 4);
    assert_string_equal(cJSON_GetObjectItem(edl_yaml_doc(y, 0), "kind")->valuestring, "A");
    assert_string_equal(cJSON_GetObjectItem(edl_yaml_doc(y, 1), "kind")->valuestring, "B");
    assert_int_equal(edl_yaml_line(y, 1, "x"), 4);
    assert_true(cJSON_IsNull(edl_yaml_doc(y, 2)));
    assert_true(cJSON_IsArray(edl_yaml_doc(y, 3)));
    assert_int_equal(edl_yaml_line(y, 3, "[0]"), 8);
    assert_null(edl_yaml_doc(y, 4));
    edl_yaml_free(y);
}

static void test_yaml_refusals_name_file_line_and_column(void **state)
{
    (void)state;
    char err[512];
    assert_int_equal(load_err("a: &x 1\nb: *x\n", err, sizeof err), EDL_EPROTO);
    assert_non_null(strstr(err, "t.yaml:1:4: anchors"));
    assert_int_equal(load_err("a: 1\nb: *x\n", err, sizeof err), EDL_EPROTO);
    assert_non_null(strstr(err, "t.yaml:2:4: aliases")); /* an undefined one: still refused */
    assert_int_equal(load_err("a:\n  b: 1\n  c: 2\n  b: 3\n", err, sizeof err), EDL_EPROTO);
    assert_non_null(strstr(err, "t.yaml:4:3: duplicate key \"b\" (first at line 2)"));
    assert_int_equal(load_err("a: 1\nb:\n\t- x\n", err, sizeof err), EDL_EPROTO);
    assert_non_null(strstr(err, "t.yaml:3:"));
    assert_int_equal(load_err("a: b: c\n", err, sizeof err), EDL_EPROTO);
    assert_non_null(strstr(err, "t.yaml:1:"));
    assert_non_null(strstr(err, "mapping values are not allowed"));
    assert_int_equal(load_err("a: [1, 2\n", err, sizeof err), EDL_EPROTO);
    assert_int_equal(load_err("? [a]\n: 1\n", err, sizeof err), EDL_EPROTO);
    assert_non_null(strstr(err, "a key must be a scalar"));
    assert_int_equal(load_err("kind: X\n?\n", err, sizeof err), EDL_EPROTO); /* fuzz_manifest */
    assert_non_null(strstr(err, "t.yaml:2:2: an empty key"));
    assert_int_equal(load_err("a:\n  \"\": 1\n", err, sizeof err), EDL_EPROTO);
    assert_non_null(strstr(err, "t.yaml:2:3: an empty key"));
    assert_int_equal(load_err("a: !custom 1\n", err, sizeof err), EDL_EPROTO);
    assert_non_null(strstr(err, "tag !custom is not supported"));
    assert_int_equal(load_err("a: !!int x\n", err, sizeof err), EDL_EPROTO);
    assert_int_equal(load_err("a: \"x\\0y\"\n", err, sizeof err), EDL_EPROTO);
    assert_non_null(strstr(err, "NUL"));
    assert_int_equal(load_err("a: 1e999\n", err, sizeof err), EDL_EPROTO);
    assert_int_equal(load_err("", err, sizeof err), EDL_EPROTO);
    assert_non_null(strstr(err, "t.yaml: no YAML document"));
    assert_int_equal(load_err("# only a comment\n", err, sizeof err), EDL_EPROTO);

    /* depth: 64 nested levels are fine, 65 are not */
    char deep[400] = "";
    for (int i = 0; i < 64; i++)
        strcat(deep, "[");
    for (int i = 0; i < 64; i++)
        strcat(deep, "]");
    edl_yaml *y = load_ok(deep);
    edl_yaml_free(y);
    char deeper[400] = "[";
    strcat(deeper, deep);
    strcat(deeper, "]");
    assert_int_equal(load_err(deeper, err, sizeof err), EDL_EPROTO);
    assert_non_null(strstr(err, "t.yaml:1:65: nested deeper than 64"));
}

static void test_yaml_files_missing_and_huge(void **state)
{
    (void)state;
    char err[512], path[] = "/tmp/edl-test-yaml.XXXXXX";
    edl_yaml *y = NULL;
    assert_int_equal(edl_yaml_load_file("/nonexistent/job.yaml", &y, err, sizeof err), EDL_EIO);
    assert_non_null(strstr(err, "/nonexistent/job.yaml: No such file"));
    assert_int_equal(edl_yaml_load_file("/tmp", &y, err, sizeof err), EDL_EIO);
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "a: 1\nb: [x]\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    assert_int_equal(edl_yaml_load_file(path, &y, err, sizeof err), 0);
    assert_string_equal(edl_yaml_name(y), path);
    assert_int_equal(edl_yaml_line(y, 0, "b[0]"), 2);
    edl_yaml_free(y);
    assert_int_equal(ftruncate(fd, (4 << 20) + 1), 0);
    assert_int_equal(edl_yaml_load_file(path, &y, err, sizeof err), EDL_ETOOBIG);
    assert_null(y);
    assert_non_null(strstr(err, "bytes"));
    close(fd);
    unlink(path);
    char *big = calloc(1, (4 << 20) + 2);
    memset(big, '#', (4 << 20) + 1);
    assert_int_equal(edl_yaml_load("big", big, (4 << 20) + 1, &y, err, sizeof err), EDL_ETOOBIG);
    free(big);
}

/* ---- TrainingJob ------------------------------------------------------------------------- */

#define TJ_HEAD "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: mnist\n"
#define TJ_TEMPLATE                                                                              \
    "  template:\n    spec:\n      containers:\n        - name: trainer\n"                     \
    "          command: [python, train.py]\n"

typedef struct parsed {
    edl_yaml *y;
    edl_trainingjob tj;
    int rc;
    char field[256], err[512];
} parsed;

static parsed *parse(const char *text)
{
    parsed *p = calloc(1, sizeof *p);
    p->y = load_ok(text);
    memset(&p->tj, 0xAB, sizeof p->tj); /* the parser must not read what was there */
    p->rc = edl_trainingjob_parse(edl_yaml_doc(p->y, 0), &p->tj, p->field, sizeof p->field,
                                  p->err, sizeof p->err);
    return p;
}

static void parsed_free(parsed *p)
{
    edl_trainingjob_clear(&p->tj);
    edl_yaml_free(p->y);
    free(p);
}

static void test_trainingjob_defaults(void **state)
{
    (void)state;
    parsed *p = parse(TJ_HEAD "spec:\n" TJ_TEMPLATE);
    assert_int_equal(p->rc, 0);
    edl_trainingjob *tj = &p->tj;
    assert_string_equal(tj->name, "mnist");
    assert_string_equal(tj->ns, "default");
    assert_null(tj->uid);
    assert_int_equal(tj->generation, 0);
    assert_false(tj->deleting);
    assert_int_equal(tj->spec.replicas, 1);
    assert_int_equal(tj->spec.min, 1);
    assert_int_equal(tj->spec.max, 1);
    assert_int_equal(tj->spec.settle_ms, 1000);
    assert_int_equal(tj->spec.ttl_s, 10);
    assert_int_equal(tj->spec.max_restarts, 10);
    assert_int_equal(tj->spec.restart_policy, EDL_RESTART_ON_FAILURE);
    assert_true(tj->spec.fail_fast);
    assert_int_equal(tj->spec.mode, EDL_MODE_AUTO); /* not given: the trainer chooses */
    assert_int_equal(tj->spec.progress_timeout_ms, 0);
    assert_int_equal(tj->spec.exclude_after, 2);
    assert_int_equal(tj->spec.cooldown_ms, 10000);
    assert_int_equal(tj->spec.cooldown_max_ms, 300000);
    assert_true(edl_exit_code_in(tj->spec.permanent_codes, 1)); /* edl_spec_init's 1-127 */
    assert_null(tj->spec.checkpoint_uri);
    assert_false(tj->suspend);
    assert_int_equal(tj->clean_pod_policy, EDL_CLEAN_RUNNING);
    assert_int_equal(tj->ttl_after_finished_s, -1);
    assert_int_equal(tj->active_deadline_s, -1);
    assert_int_equal(tj->n_command, 2);
    assert_string_equal(tj->command[0], "python");
    assert_string_equal(tj->command[1], "train.py");
    assert_null(tj->command[2]);
    assert_non_null(tj->pod_template);
    assert_non_null(cJSON_GetObjectItem(tj->pod_template, "spec"));
    assert_string_equal(p->field, "");
    assert_int_equal(tj->spec.ps_max, 0); /* no spec.ps: no parameter servers */
    assert_int_equal(edl_spec_desired_servers(&tj->spec), 0);
    assert_null(tj->ps_template);
    assert_null(tj->ps_command);
    parsed_free(p);

    /* maxReplicas defaults to max(replicas, minReplicas) */
    p = parse(TJ_HEAD "spec:\n  replicas: 4\n  minReplicas: 2\n" TJ_TEMPLATE);
    assert_int_equal(p->rc, 0);
    assert_int_equal(p->tj.spec.max, 4);
    assert_int_equal(edl_spec_desired_pods(&p->tj.spec), 4);
    parsed_free(p);
    p = parse(TJ_HEAD "spec:\n  replicas: 0\n  minReplicas: 3\n" TJ_TEMPLATE);
    assert_int_equal(p->rc, 0);
    assert_int_equal(p->tj.spec.max, 3);
    assert_int_equal(p->tj.spec.replicas, 0);
    parsed_free(p);
}

static void test_trainingjob_every_field_mapped(void **state)
{
    (void)state;
    parsed *p = parse("apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\n"
                      "metadata:\n  name: big-job-1\n  namespace: ml\n  uid: abc-123\n"
                      "  generation: 7\n  deletionTimestamp: \"2024-01-01T00:00:00Z\"\n"
                      "spec:\n  replicas: 5\n  minReplicas: 2\n  maxReplicas: 4\n"
                      "  suspend: true\n  cleanPodPolicy: All\n  ttlSecondsAfterFinished: 60\n"
                      "  activeDeadlineSeconds: 3600\n"
                      "  elastic:\n    mode: InProcess\n    settleWindow: 1.5s\n"
                      "    leaseTTLSeconds: 3\n    restartPolicy: ExitCode\n    maxRestarts: 0\n"
                      "    failFast: false\n"
                      "    permanentExitCodes: [3, 127]\n    progressTimeout: 2m\n"
                      "    exclusion:\n      afterFailures: 5\n      cooldown: 30s\n"
                      "      maxCooldown: 1h\n"
                      "  checkpoint:\n    uri: s3://bucket/ckpt\n"
                      "  template:\n    spec:\n      containers:\n        - name: t\n"
                      "          command: [/bin/trainer]\n          args: [--lr, \"0.1\"]\n");
    assert_int_equal(p->rc, 0);
    edl_trainingjob *tj = &p->tj;
    assert_string_equal(tj->name, "big-job-1");
    assert_string_equal(tj->ns, "ml");
    assert_string_equal(tj->uid, "abc-123");
    assert_int_equal(tj->generation, 7);
    assert_true(tj->deleting);
    assert_int_equal(tj->spec.replicas, 5);
    assert_int_equal(tj->spec.min, 2);
    assert_int_equal(tj->spec.max, 4);
    assert_true(tj->suspend);
    assert_int_equal(tj->clean_pod_policy, EDL_CLEAN_ALL);
    assert_int_equal(tj->ttl_after_finished_s, 60);
    assert_int_equal(tj->active_deadline_s, 3600);
    assert_int_equal(tj->spec.mode, EDL_MODE_INPROCESS);
    assert_int_equal(tj->spec.settle_ms, 1500);
    assert_int_equal(tj->spec.ttl_s, 3);
    assert_int_equal(tj->spec.restart_policy, EDL_RESTART_EXIT_CODE);
    assert_int_equal(tj->spec.max_restarts, 0);
    assert_false(tj->spec.fail_fast);
    for (int c = 0; c < 256; c++)
        assert_int_equal(edl_exit_code_in(tj->spec.permanent_codes, c), c == 3 || c == 127);
    assert_int_equal(tj->spec.progress_timeout_ms, 120000);
    assert_int_equal(tj->spec.exclude_after, 5);
    assert_int_equal(tj->spec.cooldown_ms, 30000);
    assert_int_equal(tj->spec.cooldown_max_ms, 3600000);
    assert_string_equal(tj->spec.checkpoint_uri, "s3://bucket/ckpt");
    assert_int_equal(tj->n_command, 3);
    assert_string_equal(tj->command[0], "/bin/trainer");
    assert_string_equal(tj->command[1], "--lr");
    assert_string_equal(tj->command[2], "0.1");
    assert_null(tj->command[3]);
    parsed_free(p);

    p = parse(TJ_HEAD "spec:\n  cleanPodPolicy: None\n" TJ_TEMPLATE);
    assert_int_equal(p->tj.clean_pod_policy, EDL_CLEAN_NONE);
    parsed_free(p);
}

#define PS_TEMPLATE                                                                              \
    "    template:\n      spec:\n        containers:\n          - name: ps\n"                 \
    "            command: [ctr]\n            args: [--threads, \"2\"]\n"

/* spec.ps: the workers' names and defaults; its own template and command; the spec that goes to
 * etcd carries the bounds and reads back the same. */
static void test_trainingjob_ps_role_round_trip(void **state)
{
    (void)state;
    parsed *p = parse(TJ_HEAD "spec:\n  ps:\n" PS_TEMPLATE TJ_TEMPLATE);
    assert_int_equal(p->rc, 0);
    assert_int_equal(p->tj.spec.ps_replicas, 1);
    assert_int_equal(p->tj.spec.ps_min, 1);
    assert_int_equal(p->tj.spec.ps_max, 1);
    parsed_free(p);
    p = parse(TJ_HEAD "spec:\n  ps:\n    replicas: 3\n    minReplicas: 2\n" PS_TEMPLATE
                      TJ_TEMPLATE);
    assert_int_equal(p->rc, 0);
    assert_int_equal(p->tj.spec.ps_max, 3); /* max(replicas, minReplicas) */
    parsed_free(p);
    p = parse(TJ_HEAD "spec:\n  ps: null\n" TJ_TEMPLATE); /* a merge patch's removal */
    assert_int_equal(p->rc, 0);
    assert_int_equal(p->tj.spec.ps_max, 0);
    parsed_free(p);

    p = parse(TJ_HEAD "spec:\n  replicas: 2\n  ps:\n    replicas: 2\n    minReplicas: 1\n"
                      "    maxReplicas: 4\n" PS_TEMPLATE TJ_TEMPLATE);
    assert_int_equal(p->rc, 0);
    edl_trainingjob *tj = &p->tj;
    assert_int_equal(tj->spec.ps_replicas, 2);
    assert_int_equal(tj->spec.ps_min, 1);
    assert_int_equal(tj->spec.ps_max, 4);
    assert_int_equal(edl_spec_desired_servers(&tj->spec), 2);
    assert_int_equal(tj->n_ps_command, 3);
    assert_string_equal(tj->ps_command[0], "ctr");
    assert_string_equal(tj->ps_command[2], "2");
    assert_null(tj->ps_command[3]);
    assert_string_equal(tj->command[0], "python"); /* the workers' own */
    const cJSON *ctr = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(
                                              tj->ps_template, "spec"), "containers"), 0);
    assert_string_equal(cJSON_GetObjectItem(ctr, "name")->valuestring, "ps");
    char *json = edl_spec_to_json(&tj->spec);
    assert_non_null(strstr(json, "\"ps\":{\"min\":1,\"max\":4,\"replicas\":2}"));
    edl_job_spec back;
    edl_spec_init(&back);
    char err[256];
    assert_int_equal(edl_spec_parse(json, strlen(json), &back, err, sizeof err), 0);
    assert_int_equal(back.ps_min, 1);
    assert_int_equal(back.ps_max, 4);
    assert_int_equal(back.ps_replicas, 2);
    assert_int_equal(back.replicas, 2);
    edl_spec_clear(&back);
    free(json);
    parsed_free(p);
}

#define TEACHER_TEMPLATE                                                                         \
    "    template:\n      spec:\n        containers:\n          - name: teacher\n"             \
    "            command: [distill]\n            args: [--port, \"8501\"]\n"

/* spec.teachers: the workers' names and defaults, a required service (a DNS label), model and
 * capacity for the agent, its own template and command; the spec that goes to etcd carries
 * {min, max, replicas, service} and reads back the same. */
static void test_trainingjob_teachers_role_round_trip(void **state)
{
    (void)state;
    parsed *p = parse(TJ_HEAD "spec:\n" TJ_TEMPLATE);
    assert_int_equal(p->rc, 0);
    assert_int_equal(p->tj.spec.teachers_max, 0); /* no spec.teachers: no teachers */
    assert_int_equal(edl_spec_desired_teachers(&p->tj.spec), 0);
    assert_null(p->tj.teacher_template);
    assert_null(p->tj.teacher_model);
    parsed_free(p);
    p = parse(TJ_HEAD "spec:\n  teachers:\n    service: bert\n" TEACHER_TEMPLATE TJ_TEMPLATE);
    assert_int_equal(p->rc, 0);
    assert_int_equal(p->tj.spec.teachers_replicas, 1);
    assert_int_equal(p->tj.spec.teachers_min, 1);
    assert_int_equal(p->tj.spec.teachers_max, 1);
    assert_string_equal(p->tj.spec.teachers_service, "bert");
    assert_null(p->tj.teacher_model);     /* the agent's default */
    assert_int_equal(p->tj.teacher_capacity, 0);
    parsed_free(p);
    p = parse(TJ_HEAD "spec:\n  teachers:\n    replicas: 3\n    minReplicas: 2\n"
                      "    service: bert\n" TEACHER_TEMPLATE TJ_TEMPLATE);
    assert_int_equal(p->rc, 0);
    assert_int_equal(p->tj.spec.teachers_max, 3); /* max(replicas, minReplicas) */
    parsed_free(p);
    p = parse(TJ_HEAD "spec:\n  teachers: null\n" TJ_TEMPLATE); /* a merge patch's removal */
    assert_int_equal(p->rc, 0);
    assert_int_equal(p->tj.spec.teachers_max, 0);
    parsed_free(p);

    p = parse(TJ_HEAD "spec:\n  replicas: 2\n  teachers:\n    replicas: 2\n"
                      "    minReplicas: 1\n    maxReplicas: 4\n    service: mlp-teachers\n"
                      "    model: mlp\n    capacity: 8\n" TEACHER_TEMPLATE
                      "  ps:\n" PS_TEMPLATE TJ_TEMPLATE);
    assert_int_equal(p->rc, 0);
    edl_trainingjob *tj = &p->tj;
    assert_int_equal(tj->spec.teachers_replicas, 2);
    assert_int_equal(tj->spec.teachers_min, 1);
    assert_int_equal(tj->spec.teachers_max, 4);
    assert_int_equal(edl_spec_desired_teachers(&tj->spec), 2);
    assert_string_equal(tj->teacher_model, "mlp");
    assert_int_equal(tj->teacher_capacity, 8);
    assert_int_equal(tj->n_teacher_command, 3);
    assert_string_equal(tj->teacher_command[0], "distill");
    assert_string_equal(tj->teacher_command[2], "8501");
    assert_null(tj->teacher_command[3]);
    assert_string_equal(tj->ps_command[0], "ctr");   /* each role its own */
    assert_string_equal(tj->command[0], "python");
    const cJSON *ctr = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(
                                              tj->teacher_template, "spec"), "containers"), 0);
    assert_string_equal(cJSON_GetObjectItem(ctr, "name")->valuestring, "teacher");
    char *json = edl_spec_to_json(&tj->spec);
    assert_non_null(strstr(json, "\"teachers\":{\"min\":1,\"max\":4,\"replicas\":2,"
                                 "\"service\":\"mlp-teachers\"}"));
    edl_job_spec back;
    edl_spec_init(&back);
    char err[256];
    assert_int_equal(edl_spec_parse(json, strlen(json), &back, err, sizeof err), 0);
    assert_int_equal(back.teachers_min, 1);
    assert_int_equal(back.teachers_max, 4);
    assert_int_equal(back.teachers_replicas, 2);
    assert_string_equal(back.teachers_service, "mlp-teachers");
    assert_int_equal(back.ps_max, 1); /* spec.ps beside it: both roles in the spec */
    assert_int_equal(back.replicas, 2);
    edl_spec_clear(&back);
    free(json);
    parsed_free(p);
}

typedef struct bad_case {
    const char *spec; /* what follows TJ_HEAD, or a whole document when it starts with '!' */
    int rc;
    const char *field;
    const char *err; /* a part of the message */
} bad_case;

static void test_trainingjob_bad_inputs_name_field_and_code(void **state)
{
    (void)state;
    static const bad_case cases[] = {
        {"spec:\n  replicas: two\n" TJ_TEMPLATE, EDL_EPROTO, "spec.replicas", "integer"},
        {"spec:\n  replicas: 1.5\n" TJ_TEMPLATE, EDL_EPROTO, "spec.replicas", "integer"},
        {"spec:\n  replicas: -1\n" TJ_TEMPLATE, EDL_ECONFIG, "spec.replicas", "0..100000"},
        {"spec:\n  minReplicas: 0\n" TJ_TEMPLATE, EDL_ECONFIG, "spec.minReplicas", "is 0"},
        {"spec:\n  minReplicas: 3\n  maxReplicas: 2\n" TJ_TEMPLATE, EDL_ECONFIG, "spec",
         "minReplicas (3) is greater than maxReplicas (2)"},
        {"spec:\n  suspend: \"yes\"\n" TJ_TEMPLATE, EDL_EPROTO, "spec.suspend", "true or false"},
        {"spec:\n  elastic:\n    failFast: 1\n" TJ_TEMPLATE, EDL_EPROTO, "spec.elastic.failFast",
         "true or false"},
        {"spec:\n  cleanPodPolicy: Some\n" TJ_TEMPLATE, EDL_ECONFIG, "spec.cleanPodPolicy",
         "one of Running, All, None"},
        {"spec:\n  activeDeadlineSeconds: 0\n" TJ_TEMPLATE, EDL_ECONFIG,
         "spec.activeDeadlineSeconds", "is 0"},
        {"spec:\n  elastic: [1]\n" TJ_TEMPLATE, EDL_EPROTO, "spec.elastic", "object"},
        {"spec:\n  elastic:\n    mode: restart\n" TJ_TEMPLATE, EDL_ECONFIG, "spec.elastic.mode",
         "one of Restart, InProcess"},
        {"spec:\n  elastic:\n    settleWindow: 1\n" TJ_TEMPLATE, EDL_EPROTO,
         "spec.elastic.settleWindow", "string"},
        {"spec:\n  elastic:\n    settleWindow: 1x\n" TJ_TEMPLATE, EDL_ECONFIG,
         "spec.elastic.settleWindow", "duration like 1s"},
        {"spec:\n  elastic:\n    settleWindow: 25h\n" TJ_TEMPLATE, EDL_ECONFIG,
         "spec.elastic.settleWindow", "at most 24 hours"},
        {"spec:\n  elastic:\n    restartPolicy: Always\n" TJ_TEMPLATE, EDL_ECONFIG,
         "spec.elastic.restartPolicy", "OnFailure, ExitCode, Never"},
        {"spec:\n  elastic:\n    leaseTTLSeconds: 0\n" TJ_TEMPLATE, EDL_ECONFIG,
         "spec.elastic.leaseTTLSeconds", "is 0"},
        {"spec:\n  elastic:\n    permanentExitCodes: [3, 0]\n" TJ_TEMPLATE, EDL_ECONFIG,
         "spec.elastic.permanentExitCodes[1]", "1..127"},
        {"spec:\n  elastic:\n    permanentExitCodes: [128]\n" TJ_TEMPLATE, EDL_ECONFIG,
         "spec.elastic.permanentExitCodes[0]", "1..127"},
        {"spec:\n  elastic:\n    permanentExitCodes: [\"3\"]\n" TJ_TEMPLATE, EDL_EPROTO,
         "spec.elastic.permanentExitCodes[0]", "integer"},
        {"spec:\n  elastic:\n    permanentExitCodes: 3\n" TJ_TEMPLATE, EDL_EPROTO,
         "spec.elastic.permanentExitCodes", "list"},
        {"spec:\n  elastic:\n    exclusion:\n      cooldown: 10m\n" TJ_TEMPLATE, EDL_ECONFIG,
         "spec.elastic.exclusion", "maxCooldown"},
        {"spec:\n  elastic:\n    exclusion:\n      afterFailures: x\n" TJ_TEMPLATE, EDL_EPROTO,
         "spec.elastic.exclusion.afterFailures", "integer"},
        {"spec:\n  checkpoint:\n    uri: [a]\n" TJ_TEMPLATE, EDL_EPROTO, "spec.checkpoint.uri",
         "string"},
        {"spec:\n  replicas: 1\n", EDL_EPROTO, "spec.template", "is required"},
        {"spec:\n  template:\n    metadata: {}\n", EDL_EPROTO, "spec.template.spec",
         "is required"},
        {"spec:\n  template:\n    spec: {}\n", EDL_EPROTO, "spec.template.spec.containers",
         "is required"},
        {"spec:\n  template:\n    spec:\n      containers: []\n", EDL_ECONFIG,
         "spec.template.spec.containers", "is empty"},
        {"spec:\n  template:\n    spec:\n      containers: [x]\n", EDL_EPROTO,
         "spec.template.spec.containers[0]", "object"},
        {"spec:\n  template:\n    spec:\n      containers:\n        - name: t\n", EDL_EPROTO,
         "spec.template.spec.containers[0].command", "entrypoint"},
        {"spec:\n  template:\n    spec:\n      containers:\n        - name: t\n"
         "          command: []\n", EDL_ECONFIG, "spec.template.spec.containers[0].command",
         "is empty"},
        {"spec:\n  template:\n    spec:\n      containers:\n        - command: [a]\n",
         EDL_EPROTO, "spec.template.spec.containers[0].name", "is required"},
        {"spec:\n  template:\n    spec:\n      containers:\n        - name: t\n"
         "          command: [a, 1]\n", EDL_EPROTO,
         "spec.template.spec.containers[0].command[1]", "string"},
        {"spec:\n  template:\n    spec:\n      containers:\n        - name: t\n"
         "          command: [a]\n          args: [x, {b: c}]\n", EDL_EPROTO,
         "spec.template.spec.containers[0].args[1]", "string"},
        {"spec:\n  template:\n    spec:\n      containers:\n        - name: t\n"
         "          command: [a]\n          env: [{name: A, value: 1}]\n", EDL_EPROTO,
         "spec.template.spec.containers[0].env[0].value", "string"},
        {"spec:\n  ps: [1]\n" TJ_TEMPLATE, EDL_EPROTO, "spec.ps", "object"},
        {"spec:\n  ps:\n    replicas: two\n" PS_TEMPLATE TJ_TEMPLATE, EDL_EPROTO,
         "spec.ps.replicas", "integer"},
        {"spec:\n  ps:\n    replicas: -1\n" PS_TEMPLATE TJ_TEMPLATE, EDL_ECONFIG,
         "spec.ps.replicas", "0..1024"},
        {"spec:\n  ps:\n    minReplicas: 0\n" PS_TEMPLATE TJ_TEMPLATE, EDL_ECONFIG,
         "spec.ps.minReplicas", "1..1024"},
        {"spec:\n  ps:\n    maxReplicas: 1025\n" PS_TEMPLATE TJ_TEMPLATE, EDL_ECONFIG,
         "spec.ps.maxReplicas", "1..1024"},
        {"spec:\n  ps:\n    maxReplicas: \"4\"\n" PS_TEMPLATE TJ_TEMPLATE, EDL_EPROTO,
         "spec.ps.maxReplicas", "integer"},
        {"spec:\n  ps:\n    minReplicas: 3\n    maxReplicas: 2\n" PS_TEMPLATE TJ_TEMPLATE,
         EDL_ECONFIG, "spec.ps", "minReplicas (3) is greater than maxReplicas (2)"},
        {"spec:\n  ps:\n    replicas: 5\n    maxReplicas: 4\n" PS_TEMPLATE TJ_TEMPLATE,
         EDL_ECONFIG, "spec.ps", "replicas (5) is greater than maxReplicas (4)"},
        {"spec:\n  ps:\n    replicas: 1\n" TJ_TEMPLATE, EDL_EPROTO, "spec.ps.template",
         "is required"},
        {"spec:\n  ps:\n    template: []\n" TJ_TEMPLATE, EDL_EPROTO, "spec.ps.template",
         "object"},
        {"spec:\n  ps:\n    template:\n      spec:\n        containers: []\n" TJ_TEMPLATE,
         EDL_ECONFIG, "spec.ps.template.spec.containers", "the parameter server"},
        {"spec:\n  ps:\n    template:\n      spec: {}\n" TJ_TEMPLATE, EDL_EPROTO,
         "spec.ps.template.spec.containers", "is required"},
        {"spec:\n  ps:\n    template:\n      spec:\n        containers: [{name: ps}]\n"
         TJ_TEMPLATE, EDL_EPROTO, "spec.ps.template.spec.containers[0].command", "entrypoint"},
        {"spec:\n  ps:\n    template:\n      spec:\n        containers:\n"
         "          - {name: ps, command: [a], args: [x, 2]}\n" TJ_TEMPLATE, EDL_EPROTO,
         "spec.ps.template.spec.containers[0].args[1]", "string"},
        {"spec:\n  ps:\n    template:\n      spec:\n        containers:\n"
         "          - {name: ps, command: [a], env: [{name: \"A=B\"}]}\n" TJ_TEMPLATE,
         EDL_ECONFIG, "spec.ps.template.spec.containers[0].env[0].name", "variable name"},
        {"spec:\n  teachers: [1]\n" TJ_TEMPLATE, EDL_EPROTO, "spec.teachers", "object"},
        {"spec:\n  teachers:\n    replicas: 1\n" TEACHER_TEMPLATE TJ_TEMPLATE, EDL_EPROTO,
         "spec.teachers.service", "is required"},
        {"spec:\n  teachers:\n    service: Bert\n" TEACHER_TEMPLATE TJ_TEMPLATE, EDL_ECONFIG,
         "spec.teachers.service", "DNS label"},
        {"spec:\n  teachers:\n    service: -b\n" TEACHER_TEMPLATE TJ_TEMPLATE, EDL_ECONFIG,
         "spec.teachers.service", "DNS label"},
        {"spec:\n  teachers:\n    service: 7\n" TEACHER_TEMPLATE TJ_TEMPLATE, EDL_EPROTO,
         "spec.teachers.service", "string"},
        {"spec:\n  teachers:\n    service: b\n    replicas: 0\n" TEACHER_TEMPLATE
         TJ_TEMPLATE, EDL_ECONFIG, "spec.teachers.replicas", "1..1024"},
        {"spec:\n  teachers:\n    service: b\n    replicas: 1.5\n" TEACHER_TEMPLATE
         TJ_TEMPLATE, EDL_EPROTO, "spec.teachers.replicas", "integer"},
        {"spec:\n  teachers:\n    service: b\n    maxReplicas: 1025\n" TEACHER_TEMPLATE
         TJ_TEMPLATE, EDL_ECONFIG, "spec.teachers.maxReplicas", "1..1024"},
        {"spec:\n  teachers:\n    service: b\n    minReplicas: 3\n    maxReplicas: 2\n"
         TEACHER_TEMPLATE TJ_TEMPLATE, EDL_ECONFIG, "spec.teachers",
         "minReplicas (3) is greater than maxReplicas (2)"},
        {"spec:\n  teachers:\n    service: b\n    replicas: 5\n    maxReplicas: 4\n"
         TEACHER_TEMPLATE TJ_TEMPLATE, EDL_ECONFIG, "spec.teachers",
         "replicas (5) is greater than maxReplicas (4)"},
        {"spec:\n  teachers:\n    service: b\n    replicas: 1\n    minReplicas: 2\n"
         "    maxReplicas: 4\n" TEACHER_TEMPLATE TJ_TEMPLATE, EDL_ECONFIG, "spec.teachers",
         "replicas (1) is below minReplicas (2)"},
        {"spec:\n  teachers:\n    service: b\n    capacity: 0\n" TEACHER_TEMPLATE
         TJ_TEMPLATE, EDL_ECONFIG, "spec.teachers.capacity", "1..65535"},
        {"spec:\n  teachers:\n    service: b\n    model: \"a b\"\n" TEACHER_TEMPLATE
         TJ_TEMPLATE, EDL_ECONFIG, "spec.teachers.model", "/v1/models/MODEL"},
        {"spec:\n  teachers:\n    service: b\n    model: [m]\n" TEACHER_TEMPLATE
         TJ_TEMPLATE, EDL_EPROTO, "spec.teachers.model", "string"},
        {"spec:\n  teachers:\n    service: b\n" TJ_TEMPLATE, EDL_EPROTO,
         "spec.teachers.template", "is required"},
        {"spec:\n  teachers:\n    service: b\n    template:\n      spec:\n"
         "        containers: []\n" TJ_TEMPLATE, EDL_ECONFIG,
         "spec.teachers.template.spec.containers", "inference server"},
        {"spec:\n  teachers:\n    service: b\n    template:\n      spec:\n"
         "        containers: [{name: t}]\n" TJ_TEMPLATE, EDL_EPROTO,
         "spec.teachers.template.spec.containers[0].command", "entrypoint"},
        {"spec: 3\n", EDL_EPROTO, "spec", "object"},
        {"spec:\n  schedulingPolicy: {scheduler: slurm}\n" TJ_TEMPLATE, EDL_ECONFIG,
         "spec.schedulingPolicy.scheduler", "volcano"},
        {"spec:\n  schedulingPolicy: {priorityClass: Bad_Name}\n" TJ_TEMPLATE, EDL_ECONFIG,
         "spec.schedulingPolicy.priorityClass", "PriorityClass"},
        {"spec:\n  schedulingPolicy: {minAvailable: 0}\n" TJ_TEMPLATE, EDL_ECONFIG,
         "spec.schedulingPolicy.minAvailable", "1.."},
        {"spec:\n  schedulingPolicy: 3\n" TJ_TEMPLATE, EDL_EPROTO, "spec.schedulingPolicy",
         "object"},
        {"!apiVersion: edl.dev/v1\nkind: TrainingJob\nmetadata: {name: a}\nspec: {}\n",
         EDL_ECONFIG, "apiVersion", "edl.dev/v1alpha1"},
        {"!apiVersion: edl.dev/v1alpha1\nkind: Job\nmetadata: {name: a}\nspec: {}\n",
         EDL_ECONFIG, "kind", "TrainingJob"},
        {"!kind: TrainingJob\nmetadata: {name: a}\nspec: {}\n", EDL_EPROTO, "apiVersion",
         "is required"},
        {"!apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nspec: {}\n", EDL_EPROTO,
         "metadata", "is required"},
        {"!apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {}\nspec: {}\n",
         EDL_EPROTO, "metadata.name", "is required"},
        {"!apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: My_Job}\n",
         EDL_ECONFIG, "metadata.name", "lower-case"},
        {"!apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: -a}\n",
         EDL_ECONFIG, "metadata.name", "lower-case"},
        {"!apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: a.}\n",
         EDL_ECONFIG, "metadata.name", "lower-case"},
        /* the one name rule (EDL_TJ_NAME_RULE): a DNS-1035 label of at most 45 characters,
         * whatever the roles; the names a real API server refused for the Service or the
         * pods' hostnames */
        {"!apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: 1job}\n",
         EDL_ECONFIG, "metadata.name", "start with a letter"},
        {"!apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: my.job}\n",
         EDL_ECONFIG, "metadata.name", "DNS-1035"},
        {"!apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: a.b}\n"
         "spec:\n  teachers:\n    service: b\n" TEACHER_TEMPLATE TJ_TEMPLATE, EDL_ECONFIG,
         "metadata.name", "DNS-1035"},
        {"!apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: "
         "{name: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa}\n" /* 46 */,
         EDL_ECONFIG, "metadata.name", "at most 45"},
        {"!apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: "
         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n",
         EDL_ECONFIG, "metadata.name", "at most 45"},
        {"!apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: a}\n",
         EDL_EPROTO, "spec", "is required"},
        {"![1, 2]\n", EDL_EPROTO, "", "must be an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const bad_case *bc = &cases[i];
        char text[2048];
        if (bc->spec[0] == '!')
            snprintf(text, sizeof text, "%s", bc->spec + 1);
        else
            snprintf(text, sizeof text, TJ_HEAD "%s", bc->spec);
        parsed *p = parse(text);
        if (p->rc != bc->rc || strcmp(p->field, bc->field) != 0 || !strstr(p->err, bc->err))
            fail_msg("case %zu: got %s field \"%s\" err \"%s\"; want %s \"%s\" \"%s\"", i,
                     edl_err_name(p->rc), p->field, p->err, edl_err_name(bc->rc), bc->field,
                     bc->err);
        edl_trainingjob zero = {0};
        assert_memory_equal(&p->tj, &zero, sizeof zero); /* cleared */
        parsed_free(p);
    }
}

/* A job's pods are bounded, each role and all together, by EDL_TJ_PODS_MAX (1,024) or the
 * operator's --max-replicas: replicas: 100000 (a typo) is refused, naming the bound and how it
 * is raised, instead of 13,695 pods in 20 s. */
static void expect_pods_refused(const char *spec, int pods_max, const char *field,
                                const char *words)
{
    edl_yaml *y = load_ok(spec);
    edl_trainingjob tj;
    char f[256], err[512];
    int rc = edl_trainingjob_parse_bounded(edl_yaml_doc(y, 0), pods_max, &tj, f, sizeof f, err,
                                           sizeof err);
    if (rc != EDL_ECONFIG || strcmp(f, field) || !strstr(err, words) ||
        !strstr(err, "--max-replicas"))
        fail_msg("%s: got %d %s: %s; want %s: ...%s... naming --max-replicas", spec, rc, f,
                 err, field, words);
    edl_yaml_free(y);
}

static int pods_accepted(const char *spec, int pods_max)
{
    edl_yaml *y = load_ok(spec);
    edl_trainingjob tj;
    char f[256], err[512];
    int rc = edl_trainingjob_parse_bounded(edl_yaml_doc(y, 0), pods_max, &tj, f, sizeof f, err,
                                           sizeof err);
    if (rc)
        print_error("%s: %s: %s\n", spec, f, err);
    int replicas = rc ? -1 : tj.spec.replicas;
    if (!rc)
        edl_trainingjob_clear(&tj);
    edl_yaml_free(y);
    return replicas;
}

static void test_trainingjob_pods_are_bounded(void **state)
{
    (void)state;
    assert_int_equal(EDL_TJ_PODS_MAX, 1024);
    expect_pods_refused(TJ_HEAD "spec:\n  replicas: 100000\n" TJ_TEMPLATE, EDL_TJ_PODS_MAX,
                        "spec.replicas", "is 100000; at most 1024");
    expect_pods_refused(TJ_HEAD "spec:\n  replicas: 1025\n" TJ_TEMPLATE, 0, "spec.replicas",
                        "is 1025; at most 1024"); /* 0: the default */
    expect_pods_refused(TJ_HEAD "spec:\n  maxReplicas: 1025\n" TJ_TEMPLATE, EDL_TJ_PODS_MAX,
                        "spec.maxReplicas", "at most 1024");
    expect_pods_refused(TJ_HEAD "spec:\n  minReplicas: 1025\n" TJ_TEMPLATE, EDL_TJ_PODS_MAX,
                        "spec.minReplicas", "at most 1024");
    assert_int_equal(pods_accepted(TJ_HEAD "spec:\n  replicas: 1024\n" TJ_TEMPLATE, 0), 1024);
    /* the roles together: the workers' replicas and the servers' and teachers' pods */
    expect_pods_refused(TJ_HEAD "spec:\n  replicas: 1000\n  ps:\n    replicas: 20\n" PS_TEMPLATE
                        "  teachers:\n    service: b\n    replicas: 10\n" TEACHER_TEMPLATE
                        TJ_TEMPLATE, 0, "spec", "1000 workers (replicas) + 20 parameter servers "
                        "+ 10 teachers = 1030, are more than 1024");
    assert_int_equal(pods_accepted(TJ_HEAD "spec:\n  replicas: 994\n  ps:\n    replicas: 20\n"
                                   PS_TEMPLATE "  teachers:\n    service: b\n    replicas: 10\n"
                                   TEACHER_TEMPLATE TJ_TEMPLATE, 0), 994);
    /* a cluster's administrator raises it (--max-replicas 4096) or lowers it (8) */
    assert_int_equal(pods_accepted(TJ_HEAD "spec:\n  replicas: 4000\n" TJ_TEMPLATE, 4096), 4000);
    expect_pods_refused(TJ_HEAD "spec:\n  replicas: 4097\n" TJ_TEMPLATE, 4096, "spec.replicas",
                        "is 4097; at most 4096");
    expect_pods_refused(TJ_HEAD "spec:\n  ps:\n    replicas: 9\n" PS_TEMPLATE TJ_TEMPLATE, 8,
                        "spec.ps.replicas", "is 9; at most 8");
    expect_pods_refused(TJ_HEAD "spec:\n  replicas: 4\n  ps:\n    replicas: 5\n" PS_TEMPLATE
                        TJ_TEMPLATE, 8, "spec", "= 9, are more than 8");
}

/* The CRD's maximum of spec.replicas, minReplicas and maxReplicas is EDL_TJ_PODS_MAX. */
static void test_pods_bound_is_the_crds(void **state)
{
    (void)state;
    edl_yaml *crd = NULL;
    char err[512];
    assert_int_equal(edl_yaml_load_file(EDL_SOURCE_DIR "/deploy/k8s/crd.yaml", &crd, err,
                                        sizeof err), 0);
    const cJSON *at = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(edl_yaml_doc(crd, 0), "spec"), "versions"), 0);
    const char *path[] = {"schema", "openAPIV3Schema", "properties", "spec", "properties"};
    for (size_t i = 0; i < 5; i++)
        at = cJSON_GetObjectItemCaseSensitive(at, path[i]);
    const cJSON *spec = at;
    const char *names[] = {"replicas", "minReplicas", "maxReplicas"};
    for (size_t i = 0; i < 3; i++) {
        const cJSON *max = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(spec, names[i]), "maximum");
        if (!cJSON_IsNumber(max) || max->valuedouble != EDL_TJ_PODS_MAX)
            fail_msg("the CRD's spec.%s has no maximum %d", names[i], EDL_TJ_PODS_MAX);
    }
    edl_yaml_free(crd);
}

static void test_trainingjob_line_of_a_bad_field(void **state)
{
    (void)state;
    parsed *p = parse(TJ_HEAD "spec:\n  template:\n    spec:\n      containers:\n"
                              "        - name: t\n          command:\n            - a\n"
                              "            - 7\n");
    assert_int_equal(p->rc, EDL_EPROTO);
    assert_string_equal(p->field, "spec.template.spec.containers[0].command[1]");
    assert_int_equal(edl_yaml_line(p->y, 0, p->field), 12);
    parsed_free(p);
    p = parse(TJ_HEAD "spec:\n  replicas: 1\n");
    assert_string_equal(p->field, "spec.template");
    assert_int_equal(edl_yaml_line(p->y, 0, p->field), 5); /* "spec:", the nearest */
    parsed_free(p);
}

static void report_field(void *arg, const char *field)
{
    char *buf = arg;
    strcat(buf, field);
    strcat(buf, " ");
}

static void test_cluster_only_fields_reported(void **state)
{
    (void)state;
    edl_yaml *y = load_ok(
        "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\n"
        "metadata:\n  name: a\n  namespace: ml\n"
        "spec:\n  cleanPodPolicy: All\n  ttlSecondsAfterFinished: 5\n"
        "  activeDeadlineSeconds: 60\n"
        "  template:\n    metadata:\n      labels: {x: y}\n"
        "    spec:\n      nodeSelector: {gpu: a100}\n      tolerations: []\n"
        "      volumes: []\n      serviceAccountName: sa\n      initContainers: []\n"
        "      containers:\n        - name: t\n          image: img:1\n"
        "          imagePullPolicy: Always\n          command: [x]\n          args: [y]\n"
        "          workingDir: /w\n          resources: {}\n          volumeMounts: []\n"
        "          ports: []\n          env:\n            - {name: A, value: b}\n"
        "            - name: B\n              valueFrom: {fieldRef: {fieldPath: x}}\n"
        "        - name: sidecar\n          image: s\n"
        "  ps:\n    replicas: 1\n    template:\n      metadata: {labels: {r: ps}}\n"
        "      spec:\n        nodeSelector: {mem: big}\n        containers:\n"
        "          - {name: ps, image: img:1, command: [x], env: [{name: A, value: b}]}\n"
        "  teachers:\n    service: s\n    template:\n"
        "      spec:\n        containers:\n"
        "          - {name: t, image: tf:2, command: [x], ports: [{containerPort: 8501}]}\n");
    char got[2048] = "";
    edl_trainingjob_cluster_only(edl_yaml_doc(y, 0), report_field, got);
    assert_string_equal(got,
                        "metadata.namespace spec.cleanPodPolicy spec.ttlSecondsAfterFinished "
                        "spec.template.metadata.labels spec.template.spec.nodeSelector "
                        "spec.template.spec.tolerations spec.template.spec.volumes "
                        "spec.template.spec.serviceAccountName "
                        "spec.template.spec.initContainers "
                        "spec.template.spec.containers[0].image "
                        "spec.template.spec.containers[0].imagePullPolicy "
                        "spec.template.spec.containers[0].resources "
                        "spec.template.spec.containers[0].volumeMounts "
                        "spec.template.spec.containers[0].ports "
                        "spec.template.spec.containers[0].env[1].valueFrom "
                        "spec.template.spec.containers[1] "
                        "spec.ps.template.metadata.labels spec.ps.template.spec.nodeSelector "
                        "spec.ps.template.spec.containers[0].image "
                        "spec.teachers.template.spec.containers[0].image "
                        "spec.teachers.template.spec.containers[0].ports ");
    edl_yaml_free(y);
    got[0] = '\0';
    edl_trainingjob_cluster_only(NULL, report_field, got); /* nothing, no crash */
    assert_string_equal(got, "");
}

static void test_durations(void **state)
{
    (void)state;
    int64_t ms = -1;
    static const struct {
        const char *s;
        int64_t ms;
    } ok[] = {{"0s", 0},       {"1s", 1000},   {"500ms", 500}, {"1m30s", 90000},
              {"1.5s", 1500},  {"2h", 7200000}, {"1h1m1s1ms", 3661001},
              {"0.5ms", 0},    {"720h", 30 * INT64_C(86400000)}, {"1s1s", 2000}};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        assert_int_equal(edl_duration_parse(ok[i].s, &ms), 0);
        assert_int_equal(ms, ok[i].ms);
    }
    static const char *const bad[] = {"",    "1",   "s",     "-1s", "1.s", ".5s", "1d",
                                      "1 s", "1sx", "721h",  "99999999999999999999h",
                                      "1.5", "1S"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ms = -7;
        if (edl_duration_parse(bad[i], &ms) != EDL_ECONFIG)
            fail_msg("\"%s\" accepted", bad[i]);
        assert_int_equal(ms, -7);
    }
    assert_int_equal(edl_duration_parse(NULL, &ms), EDL_ECONFIG);
}

/* The one name rule: the longest name passes, and the CRD's CEL rules say the same (the CRD
 * in deploy/k8s, which test_helm proves equal to the chart's). */
static void test_name_rule_is_the_crds(void **state)
{
    (void)state;
    char name[EDL_TJ_NAME_MAX + 1];
    memset(name, 'a', EDL_TJ_NAME_MAX);
    name[EDL_TJ_NAME_MAX] = '\0';
    name[EDL_TJ_NAME_MAX - 2] = '-';
    assert_true(edl_tj_name_valid(name));
    assert_false(edl_tj_name_valid("a-"));
    assert_false(edl_tj_name_valid("9a"));
    assert_true(edl_tj_name_valid("a9"));
    FILE *f = fopen(EDL_SOURCE_DIR "/deploy/k8s/crd.yaml", "r");
    assert_non_null(f);
    char line[512], want[64];
    snprintf(want, sizeof want, "size(self.metadata.name) <= %d\"", EDL_TJ_NAME_MAX);
    bool size_rule = false, regex_rule = false;
    while (fgets(line, sizeof line, f)) {
        size_rule = size_rule || strstr(line, want) != NULL;
        regex_rule = regex_rule ||
                     strstr(line, "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')");
    }
    fclose(f);
    assert_true(size_rule);
    assert_true(regex_rule);
}

/* ---- unknown fields: the CRD's schema ------------------------------------------------------ */

/* A manifest with a typo, and the whole runPolicy block of another operator: refused as the API
 * server refuses them, the first one named by its path (whose line the YAML reader knows), with
 * a near name suggested; the same manifest with the field spelled right passes. */
static void test_unknown_fields_are_named(void **state)
{
    (void)state;
    char field[256], err[512];
    edl_yaml *y = load_ok(TJ_HEAD "spec:\n  minReplicas: 1\n  maxReplica: 3\n" TJ_TEMPLATE);
    assert_int_equal(edl_trainingjob_unknown_field(edl_yaml_doc(y, 0), field, sizeof field, err,
                                                   sizeof err), EDL_ECONFIG);
    assert_string_equal(field, "spec.maxReplica");
    assert_non_null(strstr(err, "unknown field \"spec.maxReplica\""));
    assert_non_null(strstr(err, "maxReplicas"));
    assert_int_equal(edl_yaml_line(y, 0, field), 7);
    edl_yaml_free(y);
    y = load_ok(TJ_HEAD "spec:\n  runPolicy:\n    cleanPodPolicy: None\n" TJ_TEMPLATE);
    assert_int_equal(edl_trainingjob_unknown_field(edl_yaml_doc(y, 0), field, sizeof field, err,
                                                   sizeof err), EDL_ECONFIG);
    assert_string_equal(field, "spec.runPolicy");
    edl_yaml_free(y);
    y = load_ok(TJ_HEAD "  labels: {a: b}\nspec:\n  elastic:\n    exclusion: {coolDown: 1s}\n"
                TJ_TEMPLATE);
    assert_int_equal(edl_trainingjob_unknown_field(edl_yaml_doc(y, 0), field, sizeof field, err,
                                                   sizeof err), EDL_ECONFIG);
    assert_string_equal(field, "spec.elastic.exclusion.coolDown");
    assert_non_null(strstr(err, "\"cooldown\""));
    edl_yaml_free(y);
    /* the pod template is the cluster's: anything goes there, as x-kubernetes-preserve-
     * unknown-fields lets it */
    y = load_ok(TJ_HEAD "spec:\n  maxReplicas: 3\n" TJ_TEMPLATE
                "          someFutureField: 1\n      hostNetwork: true\n");
    field[0] = 'x';
    assert_int_equal(edl_trainingjob_unknown_field(edl_yaml_doc(y, 0), field, sizeof field, err,
                                                   sizeof err), 0);
    assert_string_equal(field, "");
    edl_yaml_free(y);
}

/* Every node of the CRD's schema (its openAPIV3Schema at node, at path): into doc, every
 * property it has (objects as objects, the rest null); into closed, the paths of the objects
 * whose properties are all there is (no x-kubernetes-preserve-unknown-fields). The metadata
 * (ObjectMeta, the API server's own) and status (the operator's, never read from a manifest)
 * are left to the reader. */
static void crd_walk(const cJSON *node, const char *path, cJSON *doc, char closed[][128],
                     size_t *n_closed)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(node, "properties");
    if (!cJSON_IsObject(props))
        return;
    if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(node, "x-kubernetes-preserve-unknown-"
                                                             "fields")))
        snprintf(closed[(*n_closed)++], 128, "%s", path);
    for (const cJSON *p = props->child; p; p = p->next) {
        if (!*path && (!strcmp(p->string, "metadata") || !strcmp(p->string, "status")))
            continue;
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
        bool obj = cJSON_IsString(type) && !strcmp(type->valuestring, "object");
        cJSON *child = obj ? cJSON_CreateObject() : cJSON_CreateNull();
        cJSON_AddItemToObject(doc, p->string, child);
        char sub[128];
        snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", p->string);
        if (obj)
            crd_walk(p, sub, child, closed, n_closed);
    }
}

/* The reader's list of known fields is the CRD's: a document holding every property of the
 * schema has no unknown field, and a stray key in any object the schema closes is found. */
static void test_known_fields_are_the_crds(void **state)
{
    (void)state;
    edl_yaml *crd = NULL;
    char err[512], field[256];
    assert_int_equal(edl_yaml_load_file(EDL_SOURCE_DIR "/deploy/k8s/crd.yaml", &crd, err,
                                        sizeof err), 0);
    const cJSON *v = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(
                                            cJSON_GetObjectItemCaseSensitive(edl_yaml_doc(crd, 0),
                                                                             "spec"), "versions"), 0);
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(v, "schema"), "openAPIV3Schema");
    assert_non_null(schema);
    cJSON *doc = cJSON_CreateObject();
    char closed[64][128];
    size_t n_closed = 0;
    crd_walk(schema, "", doc, closed, &n_closed);
    cJSON_AddItemToObject(doc, "metadata", cJSON_CreateObject());
    assert_true(n_closed >= 10); /* the root, spec, elastic, exclusion, checkpoint, 3 roles... */
    if (edl_trainingjob_unknown_field(doc, field, sizeof field, err, sizeof err) != 0)
        fail_msg("a field of the CRD is refused: %s", err);
    for (size_t i = 0; i < n_closed; i++) {
        cJSON *at = doc;
        char path[128], want[160];
        snprintf(path, sizeof path, "%.100s", closed[i]);
        for (char *save = NULL, *t = strtok_r(path, ".", &save); t; t = strtok_r(NULL, ".", &save))
            at = cJSON_GetObjectItemCaseSensitive(at, t);
        assert_non_null(at);
        cJSON_AddNullToObject(at, "notInTheCrd");
        snprintf(want, sizeof want, "%.100s%snotInTheCrd", closed[i], *closed[i] ? "." : "");
        if (edl_trainingjob_unknown_field(doc, field, sizeof field, err, sizeof err) !=
            EDL_ECONFIG || strcmp(field, want) != 0)
            fail_msg("a stray field in %s (a closed object of the CRD) is not found: \"%s\"",
                     *closed[i] ? closed[i] : "the root", field);
        cJSON_DeleteItemFromObjectCaseSensitive(at, "notInTheCrd");
    }
    cJSON_Delete(doc);
    edl_yaml_free(crd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_name_rule_is_the_crds),
        cmocka_unit_test(test_yaml_scalars_resolve_as_the_core_schema),
        cmocka_unit_test(test_yaml_lines_of_nested_fields_and_items),
        cmocka_unit_test(test_yaml_multiple_documents),
        cmocka_unit_test(test_yaml_refusals_name_file_line_and_column),
        cmocka_unit_test(test_yaml_files_missing_and_huge),
        cmocka_unit_test(test_trainingjob_defaults),
        cmocka_unit_test(test_trainingjob_every_field_mapped),
        cmocka_unit_test(test_trainingjob_ps_role_round_trip),
        cmocka_unit_test(test_trainingjob_teachers_role_round_trip),
        cmocka_unit_test(test_trainingjob_bad_inputs_name_field_and_code),
        cmocka_unit_test(test_trainingjob_pods_are_bounded),
        cmocka_unit_test(test_pods_bound_is_the_crds),
        cmocka_unit_test(test_trainingjob_line_of_a_bad_field),
        cmocka_unit_test(test_cluster_only_fields_reported),
        cmocka_unit_test(test_durations),
        cmocka_unit_test(test_unknown_fields_are_named),
        cmocka_unit_test(test_known_fields_are_the_crds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

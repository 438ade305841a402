/* test_edl_manifest.c: `edl run -f JOB.yaml`: a manifest's settings applied, its errors
 * exiting 2 before anything starts, activeDeadlineSeconds failing the job, the volume directory
 * being this user's, and the repository's example manifest running as it is.
 * Set-up: edl_run_common.c. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "edl/discovery.h"
#include "edl/job.h"
#include "edl/etcd.h"
#include "edl_run_common.h"
#include "harness.h"

#include <cjson/cJSON.h>

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A TrainingJob whose settings all differ from edl run's defaults, with a trainer that records
 * where it ran and what it was given; the flag beside -f overrides the manifest. */
static void test_manifest_runs_with_its_settings(void **state)
{
    (void)state;
    char path[300], text[3000], wd[300];
    snprintf(wd, sizeof wd, "%s/manifest-wd", g_dir);
    assert_int_equal(mkdir(wd, 0755), 0);
    snprintf(path, sizeof path, "%s/job.yaml", g_dir);
    snprintf(text, sizeof text,
             "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: other}\n---\n"
             "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\n"
             "metadata:\n  name: manifest-job\n  namespace: ml\n"
             "spec:\n  replicas: 2\n  minReplicas: 2\n  maxReplicas: 3\n"
             "  elastic:\n    settleWindow: 300ms\n    leaseTTLSeconds: 4\n"
             "    restartPolicy: ExitCode\n    permanentExitCodes: [3, 42]\n"
             "    maxRestarts: 3\n    exclusion: {afterFailures: 4, cooldown: 2s}\n"
             "  checkpoint:\n    uri: file://%s/ckpt\n"
             "  template:\n    spec:\n      nodeSelector: {gpu: a100}\n      containers:\n"
             "        - name: trainer\n          image: example/trainer:1\n"
             "          command: [/bin/sh, -c]\n"
             "          args: ['pwd > out-$EDL_RANK.txt; echo \"$GREETING\" >> out-$EDL_RANK.txt;"
             " echo \"$EDL_CHECKPOINT_URI\" >> out-$EDL_RANK.txt']\n"
             "          workingDir: %s\n"
             "          env:\n            - {name: GREETING, value: hello manifest}\n"
             "            - name: FROM_CLUSTER\n              valueFrom: {fieldRef: {fieldPath: x}}\n",
             g_dir, wd);
    write_text(path, text);
    char out[16384];
    const char *run[] = {"run", "-f", path, "--etcd", ep(), "--max-restarts", "7", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, run), 0);
    char want[400];
    snprintf(want, sizeof want, "%s:1: skipping a document of kind ConfigMap", path);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof want, "%s:9: ignoring metadata.namespace (only meaningful on a "
             "cluster)", path);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof want, "%s:25: ignoring spec.template.spec.nodeSelector", path);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof want, "%s:28: ignoring spec.template.spec.containers[0].image", path);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "ignoring spec.template.spec.containers[0].env[1].valueFrom"));
    assert_non_null(strstr(out, "job manifest-job: min 2, max 3, replicas 2"));
    assert_non_null(strstr(out, "job manifest-job succeeded"));
    /* the spec the job ran with */
    char buf[4096], err[256];
    edl_job_spec sp;
    edl_spec_init(&sp);
    assert_non_null(harness_get(g_c, key("manifest-job", EDL_KEY_SPEC, NULL), buf, sizeof buf));
    assert_int_equal(edl_spec_parse(buf, strlen(buf), &sp, err, sizeof err), 0);
    assert_int_equal(sp.min, 2);
    assert_int_equal(sp.max, 3);
    assert_int_equal(sp.replicas, 2);
    assert_int_equal(sp.settle_ms, 300);
    assert_int_equal(sp.ttl_s, 4);
    assert_int_equal(sp.restart_policy, EDL_RESTART_EXIT_CODE);
    assert_true(edl_exit_code_in(sp.permanent_codes, 42));
    assert_false(edl_exit_code_in(sp.permanent_codes, 1));
    assert_int_equal(sp.max_restarts, 7); /* the flag, not the manifest's 3 */
    assert_int_equal(sp.exclude_after, 4);
    assert_int_equal(sp.cooldown_ms, 2000);
    snprintf(want, sizeof want, "file://%s/ckpt", g_dir);
    assert_string_equal(sp.checkpoint_uri, want);
    edl_spec_clear(&sp);
    /* each rank ran in workingDir with the manifest's env */
    for (int r = 0; r < 2; r++) {
        char file[400], line[3][400];
        snprintf(file, sizeof file, "%s/out-%d.txt", wd, r);
        FILE *f = fopen(file, "r");
        assert_non_null(f);
        for (int i = 0; i < 3; i++) {
            assert_non_null(fgets(line[i], sizeof line[i], f));
            line[i][strcspn(line[i], "\n")] = '\0';
        }
        fclose(f);
        assert_string_equal(line[0], wd);
        assert_string_equal(line[1], "hello manifest");
        assert_string_equal(line[2], want);
    }
}

/* A bad manifest names file, line and field, exits 2 and starts nothing. */
static void test_manifest_errors_exit_2_and_start_nothing(void **state)
{
    (void)state;
    char path[300], out[8192], want[400];
    snprintf(path, sizeof path, "%s/bad.yaml", g_dir);
    write_text(path, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n"
                     "  name: bad-manifest\nspec:\n  elastic:\n    settleWindow: 1x\n"
                     "  template:\n    spec:\n      containers:\n        - name: t\n"
                     "          command: [/bin/true]\n");
    const char *run[] = {"run", "-f", path, "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, run), 2);
    snprintf(want, sizeof want, "%s:7: spec.elastic.settleWindow: is \"1x\"", path);
    if (!strstr(out, want))
        fail_msg("no \"%s\" in:\n%s", want, out);
    assert_null(strstr(out, "started etcd"));
    char buf[256];
    assert_null(harness_get(g_c, key("bad-manifest", EDL_KEY_SPEC, NULL), buf, sizeof buf));

    /* no command: the error says why edl needs one */
    write_text(path, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n"
                     "  name: bad-manifest\nspec:\n  template:\n    spec:\n      containers:\n"
                     "        - name: t\n          image: x\n");
    assert_int_equal(edl_cmd(out, sizeof out, run), 2);
    snprintf(want, sizeof want, "%s:9: spec.template.spec.containers[0].command: is required",
             path);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "entrypoint"));
    /* a trainer not to be found */
    write_text(path, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n"
                     "  name: bad-manifest\nspec:\n  template:\n    spec:\n      containers:\n"
                     "        - name: t\n          command: [no-such-trainer-xyz]\n");
    assert_int_equal(edl_cmd(out, sizeof out, run), 2);
    assert_non_null(strstr(out, "containers[0].command[0]: \"no-such-trainer-xyz\" is not on "
                                "PATH"));
    /* suspended */
    write_text(path, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n"
                     "  name: bad-manifest\nspec:\n  suspend: true\n  template:\n    spec:\n"
                     "      containers:\n        - name: t\n          command: [/bin/true]\n");
    assert_int_equal(edl_cmd(out, sizeof out, run), 2);
    snprintf(want, sizeof want, "%s:6: spec.suspend: is true", path);
    assert_non_null(strstr(out, want));
    /* a field the CRD does not know (a typo; another operator's runPolicy): refused as kubectl
     * refuses it, not run with the default in its place */
    write_text(path, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n"
                     "  name: bad-manifest\nspec:\n  maxReplica: 3\n  template:\n    spec:\n"
                     "      containers:\n        - name: t\n          command: [/bin/true]\n");
    assert_int_equal(edl_cmd(out, sizeof out, run), 2);
    snprintf(want, sizeof want, "%s:6: spec.maxReplica: unknown field \"spec.maxReplica\"", path);
    if (!strstr(out, want))
        fail_msg("no \"%s\" in:\n%s", want, out);
    write_text(path, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n"
                     "  name: bad-manifest\nspec:\n  runPolicy:\n    cleanPodPolicy: None\n"
                     "  template:\n    spec:\n"
                     "      containers:\n        - name: t\n          command: [/bin/true]\n");
    assert_int_equal(edl_cmd(out, sizeof out, run), 2);
    snprintf(want, sizeof want, "%s:6: spec.runPolicy: unknown field \"spec.runPolicy\"", path);
    assert_non_null(strstr(out, want));
    /* a trainer on the command line as well */
    const char *both[] = {"run", "-f", path, "--", "/bin/true", NULL};
    write_text(path, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n"
                     "  name: bad-manifest\nspec:\n  template:\n    spec:\n"
                     "      containers:\n        - name: t\n          command: [/bin/true]\n");
    assert_int_equal(edl_cmd(out, sizeof out, both), 2);
    assert_non_null(strstr(out, "the trainer's command comes from the manifest"));
    /* YAML errors, a file without a TrainingJob, no file */
    write_text(path, "kind: TrainingJob\nmetadata: {name: a}\nmetadata: {name: b}\n");
    assert_int_equal(edl_cmd(out, sizeof out, run), 2);
    snprintf(want, sizeof want, "%s:3:1: duplicate key \"metadata\"", path);
    assert_non_null(strstr(out, want));
    write_text(path, "apiVersion: v1\nkind: Service\n");
    assert_int_equal(edl_cmd(out, sizeof out, run), 2);
    assert_non_null(strstr(out, "no TrainingJob in it"));
    const char *missing[] = {"run", "-f", "/nonexistent/job.yaml", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, missing), 2);
    assert_non_null(strstr(out, "/nonexistent/job.yaml: No such file"));
    assert_null(harness_get(g_c, key("bad-manifest", EDL_KEY_SPEC, NULL), buf, sizeof buf));
}

/* activeDeadlineSeconds: the job is stopped when it passes and counts as failed. */
static void test_manifest_deadline_fails_the_job(void **state)
{
    (void)state;
    char path[300], out[16384];
    snprintf(path, sizeof path, "%s/deadline.yaml", g_dir);
    write_text(path, "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n"
                     "  name: manifest-deadline\nspec:\n  activeDeadlineSeconds: 2\n"
                     "  elastic: {settleWindow: 200ms}\n"
                     "  template:\n    spec:\n      containers:\n        - name: t\n"
                     "          command: [/bin/sleep, '60']\n");
    const char *run[] = {"run", "-f", path, "--etcd", ep(), "--grace-ms", "1000", NULL};
    int64_t t0 = harness_now_ms();
    assert_int_equal(edl_cmd(out, sizeof out, run), 1);
    assert_true(harness_now_ms() - t0 < 30000);
    assert_non_null(strstr(out, "activeDeadlineSeconds (2 s) passed"));
}

/* A file:// checkpoint under a volume the container mounts (the examples' shared claim at a
 * fixed /tmp path) is this user's directory here, not a path every user of the host shares. */
static void test_manifest_volume_is_this_users(void **state)
{
    (void)state;
    char path[300], text[2000], tmp[300], shared[300], want[600], out[16384], buf[4096];
    snprintf(tmp, sizeof tmp, "%s/vtmp", g_dir);
    assert_int_equal(mkdir(tmp, 0700), 0);
    snprintf(shared, sizeof shared, "/tmp/edl-shared-test-%d", (int)getpid());
    snprintf(path, sizeof path, "%s/vol.yaml", g_dir);
    snprintf(text, sizeof text,
             "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: vol-job\n"
             "spec:\n  checkpoint:\n    uri: file://%s/vol-job\n"
             "  template:\n    spec:\n      containers:\n        - name: t\n"
             "          command: [/bin/true]\n"
             "          volumeMounts:\n            - {name: shared, mountPath: %s}\n"
             "      volumes:\n        - name: shared\n"
             "          persistentVolumeClaim: {claimName: team-claim}\n", shared, shared);
    write_text(path, text);
    setenv("TMPDIR", tmp, 1);
    const char *run[] = {"run", "-f", path, "--etcd", ep(), NULL};
    int rc = edl_cmd(out, sizeof out, run);
    unsetenv("TMPDIR");
    if (rc != 0)
        fail_msg("edl run -f exited %d:\n%s", rc, out);
    snprintf(want, sizeof want, "file://%s/edl-volumes-%u/team-claim/vol-job", tmp,
             (unsigned)getuid());
    edl_job_spec sp;
    edl_spec_init(&sp);
    char err[256];
    assert_non_null(harness_get(g_c, key("vol-job", EDL_KEY_SPEC, NULL), buf, sizeof buf));
    assert_int_equal(edl_spec_parse(buf, strlen(buf), &sp, err, sizeof err), 0);
    if (!sp.checkpoint_uri || strcmp(sp.checkpoint_uri, want) != 0)
        fail_msg("checkpoint URI %s, not this user's %s:\n%s", sp.checkpoint_uri, want, out);
    edl_spec_clear(&sp);
    assert_non_null(strstr(out, "spec.checkpoint.uri"));
    assert_non_null(strstr(out, want));
    struct stat st;
    snprintf(want, sizeof want, "%s/edl-volumes-%u", tmp, (unsigned)getuid());
    assert_int_equal(lstat(want, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_not_equal(lstat(shared, &st), 0); /* nothing in the host-wide path */
    /* --checkpoint-uri overrides the manifest's: no volume directory is made for it */
    char own[400], tmp2[300];
    snprintf(tmp2, sizeof tmp2, "%s/vtmp2", g_dir);
    assert_int_equal(mkdir(tmp2, 0700), 0);
    snprintf(own, sizeof own, "file://%s/own-ckpt", g_dir);
    const char *run_own[] = {"run", "-f", path, "--etcd", ep(), "--checkpoint-uri", own, NULL};
    setenv("TMPDIR", tmp2, 1);
    rc = edl_cmd(out, sizeof out, run_own);
    unsetenv("TMPDIR");
    assert_int_equal(rc, 0);
    assert_null(strstr(out, "is on the volume"));
    snprintf(want, sizeof want, "%s/edl-volumes-%u", tmp2, (unsigned)getuid());
    assert_int_not_equal(lstat(want, &st), 0);
}

/* The repository's example manifest runs as it is (the trainer found beside edl's build). */
static void test_manifest_example_runs(void **state)
{
    (void)state;
    char path[600], uri[400], out[32768];
    /* the source tree's own path (not __FILE__, relative to the build directory), so the test
     * passes whatever directory it runs from */
    snprintf(path, sizeof path, "%s/deploy/k8s/examples/elastic-mnist.yaml", EDL_SOURCE_DIR);
    snprintf(uri, sizeof uri, "file://%s/example", g_dir); /* not the shared /tmp path */
    const char *run[] = {"run", "-f", path, "--etcd", ep(), "--checkpoint-uri", uri, NULL};
    int rc = edl_cmd(out, sizeof out, run);
    if (rc != 0)
        fail_msg("edl run -f %s exited %d:\n%s", path, rc, out);
    assert_non_null(strstr(out, "job elastic-mnist succeeded"));
    assert_non_null(strstr(out, "rank 0: done after 200 steps"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_manifest_runs_with_its_settings),
        cmocka_unit_test(test_manifest_errors_exit_2_and_start_nothing),
        cmocka_unit_test(test_manifest_deadline_fails_the_job),
        cmocka_unit_test(test_manifest_example_runs),
        cmocka_unit_test(test_manifest_volume_is_this_users),
    };
    return cmocka_run_group_tests(tests, edl_run_setup, edl_run_teardown);
}

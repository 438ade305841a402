/* test_images.c: the images of docker/, for real. Opt-in (EDL_TEST_IMAGES=1): it builds them.
 *
 * docker/build makes both images (podman; its layer cache makes a second build quick) and their
 * docker-archive files; each archive's layers are unpacked here into a root filesystem, in
 * manifest.json's order with whiteouts honoured, as `docker load` would. Then, by chroot
 * (podman run cannot set rlimits on every machine; a chroot shares the host's network):
 * - in the runtime image, as its user 65532, `edl run` runs a real job of two workers (its own
 *   etcd with TLS, the job server, the agents, the demo trainer) to the right answer;
 * - the agent image's launcher and the runtime image's edl-agent (the chart's default agent
 *   image) install the portable agent as the operator's init container does, into a Debian
 *   bullseye root made by mmdebstrap (glibc 2.31, older than the agent's 2.36) and into a root
 *   holding nothing but busybox-static; the injected agents run a job of two pods there against
 *   etcd and edl-jobserver on the host (harness_chroot.c) and the trainers get the right
 *   environment.
 * Skipped (77) unless EDL_TEST_IMAGES=1, as root, with podman, mmdebstrap and busybox-static. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "edl/etcd.h"
#include "edl/job.h"
#include "harness.h"

#define ARCHIVE(name) EDL_SOURCE_DIR "/docker/out/" name "-" EDL_PROJECT_VERSION ".tar"

static char dir[256], runtime[300], agent[300], bullseye[300], busybox[300];
static char mmdebstrap[256], chroot_bin[256], env_bin[256];
static cJSON *runtime_config, *agent_config;
static harness_chroot_job job = {.agent = "/edl/bin/edl-agent", .userspec = "1000:1000",
                                 .log_dir = dir};

/* ---- unpacking an archive -------------------------------------------------------------------- */

/* Apply one layer tar to root: its whiteouts (.wh.NAME removes NAME, .wh..wh..opq empties the
 * directory) first, then its files. */
static void apply_layer(const char *layer, const char *root)
{
    harness_sh("set -e; cd '%s'; tar -tf '%s' | grep -E '(^|/)[.]wh[.]' | while read -r w; do "
               "d=$(dirname \"$w\"); b=$(basename \"$w\"); "
               "if [ \"$b\" = .wh..wh..opq ]; then find \"./$d\" -mindepth 1 -maxdepth 1 "
               "-exec rm -rf {} +; else rm -rf \"./$d/${b#.wh.}\"; fi; done; "
               "tar -xpf '%s' --numeric-owner --exclude='.wh.*'", root, layer, layer);
}

static cJSON *read_json(const char *path)
{
    static char buf[1 << 20];
    cJSON *j = cJSON_Parse(harness_read_file(path, buf, sizeof buf));
    if (!j)
        fail_msg("%s: not JSON", path);
    return j;
}

/* Unpack a docker-archive's image into root: its config (the image's JSON config). */
static cJSON *unpack(const char *archive, const char *root)
{
    char x[400], path[800];
    snprintf(x, sizeof x, "%s.archive", root);
    harness_sh("set -e; mkdir -p '%s' '%s'; tar -xf '%s' -C '%s'", root, x, archive, x);
    snprintf(path, sizeof path, "%s/manifest.json", x);
    cJSON *manifest = read_json(path);
    cJSON *image = cJSON_GetArrayItem(manifest, 0);
    cJSON *layers = cJSON_GetObjectItem(image, "Layers"), *layer;
    assert_true(cJSON_GetArraySize(layers) > 0);
    cJSON_ArrayForEach(layer, layers) {
        snprintf(path, sizeof path, "%s/%s", x, cJSON_GetStringValue(layer));
        apply_layer(path, root);
    }
    snprintf(path, sizeof path, "%s/%s", x, cJSON_GetStringValue(cJSON_GetObjectItem(image,
                                                                                      "Config")));
    cJSON *config = read_json(path);
    cJSON_Delete(manifest);
    harness_rmtree(x);
    return config;
}

/* ---- fixtures -------------------------------------------------------------------------------- */

/* Run a program to its end (at most timeout_s), output in <dir>/<log>.log, printing how long it
 * took; fails the test with the end of its output unless it exits 0. */
static void run_step(const char *what, const char *log_name, const char *const *argv,
                     int timeout_s)
{
    static char out[1 << 16];
    char log[400];
    snprintf(log, sizeof log, "%s/%s.log", dir, log_name);
    int64_t t0 = harness_now_ms();
    int rc = harness_run(argv, log, timeout_s * 1000, out, sizeof out);
    size_t n = strlen(out);
    if (rc != 0)
        fail_msg("%s exited %d:\n%s", what, rc, out + (n > 6000 ? n - 6000 : 0));
    print_message("%s: %.1f s\n", what, (double)(harness_now_ms() - t0) / 1000);
}

static int group_setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/edl-images-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(runtime, sizeof runtime, "%s/runtime", dir);
    snprintf(agent, sizeof agent, "%s/agent", dir);
    snprintf(bullseye, sizeof bullseye, "%s/bullseye", dir);
    snprintf(busybox, sizeof busybox, "%s/busybox", dir);
    const char *build[] = {EDL_SOURCE_DIR "/docker/build", NULL};
    run_step("docker/build", "docker-build", build, 1500);
    int64_t t0 = harness_now_ms();
    runtime_config = unpack(ARCHIVE("edl"), runtime);
    agent_config = unpack(ARCHIVE("edl-agent"), agent);
    print_message("unpacking both archives: %.1f s\n", (double)(harness_now_ms() - t0) / 1000);
    const char *mm[] = {mmdebstrap, "--variant=minbase", "bullseye", bullseye,
                        "deb http://deb.debian.org/debian bullseye main",
                        "deb http://deb.debian.org/debian-security bullseye-security main", NULL};
    run_step("mmdebstrap --variant=minbase bullseye", "mmdebstrap", mm, 600);
    harness_busybox_root(busybox);
    harness_open_etcd(1, NULL, &job.srv, &job.client);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    harness_close_etcd(&job.srv, &job.client);
    cJSON_Delete(runtime_config);
    cJSON_Delete(agent_config);
    harness_rmtree(dir);
    return 0;
}

/* ---- the tests ------------------------------------------------------------------------------- */

/* The string in a JSON config at key (in "config"), or "". */
static const char *config_str(cJSON *config, const char *key)
{
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(config,
                                                                                 "config"), key));
    return s ? s : "";
}

static bool config_env_has(cJSON *config, const char *want)
{
    cJSON *e, *env = cJSON_GetObjectItem(cJSON_GetObjectItem(config, "config"), "Env");
    cJSON_ArrayForEach(e, env) if (strcmp(cJSON_GetStringValue(e), want) == 0) return true;
    return false;
}

static void test_the_images_hold_what_they_should(void **state)
{
    (void)state;
    assert_string_equal(config_str(runtime_config, "User"), "65532:65532");
    assert_string_equal(config_str(agent_config, "User"), "65532:65532");
    assert_true(config_env_has(agent_config, "PATH=/usr/local/bin"));
    harness_sh("set -e; cd '%s'; for f in usr/bin/etcd usr/local/bin/edl usr/local/bin/edl-agent "
               "usr/local/bin/edl-jobserver usr/local/bin/edl-operator usr/local/bin/elastic_trainer "
               "usr/local/bin/edl-ps usr/local/bin/ctr usr/local/bin/distill "
               "usr/local/lib/edl/agent/edl-agent usr/local/lib/edl/agent/lib/libc.so.6 "
               "usr/local/lib/edl/python/edl/__init__.py usr/local/lib/edl/python/edl/torch.py; do "
               "test -x \"$f\" || test -f \"$f\"; done; "
               "test ! -e usr/bin/gcc && test ! -e usr/bin/cmake; "
               "test -z \"$(find var/lib/apt/lists -type f ! -name lock)\"", runtime);
    /* FROM scratch: the launcher, the agent's bundle and the Python package's (with the
     * libraries its module needs beside it), nothing else */
    harness_sh("set -e; cd '%s'; test -x usr/local/bin/edl-agent; "
               "test -x usr/local/lib/edl/agent/lib/ld-linux-x86-64.so.2; "
               "test -f usr/local/lib/edl/python/edl/torch.py; "
               "ls usr/local/lib/edl/python/edl/_edl*.so usr/local/lib/edl/python/edl/_libs/libcurl* "
               ">/dev/null; "
               "test -z \"$(find . ! -type d ! -path ./usr/local/bin/edl-agent "
               "! -path './usr/local/lib/edl/agent/*' ! -path './usr/local/lib/edl/python/*')\"",
               agent);
}

static void test_edl_run_in_the_runtime_image(void **state)
{
    (void)state;
    harness_sh("[ -e '%s/dev/null' ] || mknod -m 0666 '%s/dev/null' c 1 3", runtime, runtime);
    /* the image's own PATH and user; its binaries are not sanitized: no /proc needed */
    const char *argv[] = {env_bin, "-i",
                          "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                          "HOME=/", chroot_bin, "--userspec=65532:65532", runtime, "edl", "run",
                          "--np", "2", "--job", "img", "--checkpoint-uri", "file:///tmp/ckpt", "--",
                          "elastic_trainer", "--steps", "300", "--step-ms", "5", NULL};
    run_step("edl run in the runtime image", "edl-run", argv, 120);
    char path[400], line[256];
    snprintf(path, sizeof path, "%s/tmp/ckpt/shared/result.txt", runtime);
    long steps = 0;
    double loss = 1, maxerr = 1;
    if (sscanf(harness_read_file(path, line, sizeof line), "steps %ld loss %lf maxerr %lf",
               &steps, &loss, &maxerr) != 3 || steps != 300 || !(maxerr < 0.01))
        fail_msg("the demo trainer's result: %s", line);
}

/* Install the agent from image into root as the init container does, run a job of two pods in
 * root and check what the trainers saw. */
static void inject_and_run(const char *image, const char *root, const char *name)
{
    char log[400], out[4096];
    snprintf(log, sizeof log, "%s/%s.install.log", dir, name);
    harness_chroot_install(image, root, log, out, sizeof out);
    assert_non_null(strstr(out, "installed /edl/bin/edl-agent"));
    job.root = root;
    edl_generation g = {0};
    harness_chroot_run(&job, name, HARNESS_CHROOT_ENV_SCRIPT, 0, &g);
    harness_chroot_check_env(&job, name, &g, "1000");
    edl_generation_clear(&g);
}

static void test_agent_image_into_debian_bullseye(void **state)
{
    (void)state;
    harness_sh("test -e '%s/lib/x86_64-linux-gnu/libc-2.31.so'", bullseye); /* glibc 2.31 */
    inject_and_run(agent, bullseye, "agent-image-bullseye");
}

static void test_agent_image_into_busybox_only(void **state)
{
    (void)state;
    inject_and_run(agent, busybox, "agent-image-busybox");
}

static void test_runtime_image_as_agent_image(void **state)
{
    (void)state;
    inject_and_run(runtime, busybox, "runtime-image-busybox");
}

static const char *missing(void)
{
    const char *on = getenv("EDL_TEST_IMAGES");
    if (!on || strcmp(on, "1") != 0)
        return "is opt-in: EDL_TEST_IMAGES=1 (it builds the images: minutes)";
    char podman[256];
    const char *why = harness_chroot_missing();
    if (why)
        return why;
    if (!harness_which("podman", podman, sizeof podman) ||
        !harness_which("mmdebstrap", mmdebstrap, sizeof mmdebstrap))
        return "needs podman and mmdebstrap";
    if (!harness_busybox_static())
        return "needs Debian's busybox-static, a static /bin/busybox (scripts/install-deps)";
    harness_which("chroot", chroot_bin, sizeof chroot_bin);
    harness_which("env", env_bin, sizeof env_bin);
    return NULL;
}

int main(void)
{
    const char *why = missing();
    if (why) {
        printf("SKIP: test_images %s\n", why);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_images_hold_what_they_should),
        cmocka_unit_test(test_edl_run_in_the_runtime_image),
        cmocka_unit_test(test_agent_image_into_debian_bullseye),
        cmocka_unit_test(test_agent_image_into_busybox_only),
        cmocka_unit_test(test_runtime_image_as_agent_image),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

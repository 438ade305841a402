/* test_agent_injection.c: the portable agent, injected the way the Kubernetes operator injects
 * it into an image we do not own, for real but without containers (tests/test_images.c does it
 * with the images of docker/).
 *
 * Two roots under a scratch directory. "image" is FROM scratch like docker/Dockerfile.agent: only
 * the launcher /usr/local/bin/edl-agent and the bundle /usr/local/lib/edl/agent, both made by
 * scripts/bundle-agent from the built agent. "worker" holds nothing but Debian's busybox-static
 * (/bin/busybox, /bin/sh) and /tmp: no C library, no loader. The init container runs
 * `edl-agent --install /edl/bin` chrooted in "image" as user 65532; the worker container runs
 * the installed /edl/bin/edl-agent chrooted in "worker" as user 1000, against a real etcd and
 * the real edl-jobserver on the host's loopback (harness_chroot.c).
 *
 * A third root, "python", holds only Debian's python3 and python3-torch (tests/python-root) and
 * busybox: the image also carries the Python package (scripts/bundle-python, beside the agent's
 * bundle as in docker/), the init container installs it in /edl/bin/python, and two trainers of
 * examples/python/train_elastic.py import edl.torch from there (the PYTHONPATH that the
 * operator sets) and train, with no libmicrohttpd, libxxhash or -dev package in their root.
 *
 * Needs root (chroot), busybox-static and patchelf, and in a sanitized build unshare (see
 * harness_chroot.c): exits 77 (skipped) without them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "edl/etcd.h"
#include "edl/job.h"
#include "harness.h"

static char dir[256], image[300], worker[300];
static harness_chroot_job job_in_worker = {.agent = "/edl/bin/edl-agent",
                                           .userspec = "1000:1000", .root = worker, .log_dir = dir};

static int group_setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/edl-inject-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(image, sizeof image, "%s/image", dir);
    snprintf(worker, sizeof worker, "%s/worker", dir);
    harness_busybox_root(worker);
    harness_sh("mkdir -p '%s/usr/local/bin' '%s/usr/local/lib/edl'", image, image);
    char launcher[400], bundle[400], log[400], out[4096];
    snprintf(launcher, sizeof launcher, "%s/usr/local/bin/edl-agent", image);
    snprintf(bundle, sizeof bundle, "%s/usr/local/lib/edl/agent", image);
    snprintf(log, sizeof log, "%s/bundle.log", dir);
    const char *argv[] = {EDL_SOURCE_DIR "/scripts/bundle-agent", "--launcher", launcher,
                          EDL_AGENT_BIN, bundle, NULL};
    if (harness_run(argv, log, 30000, out, sizeof out) != 0)
        fail_msg("scripts/bundle-agent failed:\n%s", out);
#ifdef EDL_PYTHON_PKG
    char python[400];
    snprintf(python, sizeof python, "%s/usr/local/lib/edl/python", image);
    const char *pyargv[] = {EDL_SOURCE_DIR "/scripts/bundle-python", EDL_PYTHON_PKG, python, NULL};
    if (harness_run(pyargv, log, 30000, out, sizeof out) != 0)
        fail_msg("scripts/bundle-python failed:\n%s", out);
#endif
    harness_open_etcd(1, NULL, &job_in_worker.srv, &job_in_worker.client);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    harness_close_etcd(&job_in_worker.srv, &job_in_worker.client);
    harness_rmtree(dir);
    return 0;
}

static void test_install_from_a_scratch_image(void **state)
{
    (void)state;
    char out[4096], log[400], path[512];
    snprintf(log, sizeof log, "%s/install.log", dir);
    harness_chroot_install(image, worker, log, out, sizeof out);
    assert_non_null(strstr(out, "installed /edl/bin/edl-agent"));
    assert_non_null(strstr(out, "in /edl/bin/lib, from /usr/local/lib/edl/agent"));
    assert_null(strstr(out, "warning"));
    /* a restarted init container installs over what is there */
    harness_sh("mv '%s/edl/bin' '%s/edl/'", worker, image);
    harness_chroot_install(image, worker, log, out, sizeof out);
    struct stat st;
    snprintf(path, sizeof path, "%s/edl/bin/edl-agent", worker);
    assert_int_equal(stat(path, &st), 0);
    assert_true(st.st_uid == 65532 && (st.st_mode & 0777) == 0755);
    snprintf(path, sizeof path, "%s/edl/bin/lib/ld-linux-x86-64.so.2", worker);
    assert_int_equal(stat(path, &st), 0);
    snprintf(path, sizeof path, "%s/edl/bin/lib/libc.so.6", worker);
    assert_int_equal(stat(path, &st), 0);
    /* nothing half-written left, and the worker root has no C library of its own */
    harness_sh("test -z \"$(find '%s/edl/bin' -name '*.tmp.*')\"", worker);
    harness_sh("test \"$(cd '%s' && find . -path ./edl -prune -o -type f -print)\" = "
               "./bin/busybox", worker);
}

static void test_job_runs_in_a_busybox_root(void **state)
{
    (void)state;
    edl_generation g = {0};
    harness_chroot_run(&job_in_worker, "inject-ok", HARNESS_CHROOT_ENV_SCRIPT, 0, &g);
    harness_chroot_check_env(&job_in_worker, "inject-ok", &g, "1000");
    edl_generation_clear(&g);
}

static void test_trainer_exit_code_reaches_the_job(void **state)
{
    (void)state;
    edl_generation g = {0};
    harness_chroot_run(&job_in_worker, "inject-fail", "[ \"$EDL_POD_ID\" != w1 ] || exit 3", 1,
                       &g);
    assert_int_equal(g.state, EDL_JOB_FAILED);
    if (!strstr(g.reason, "pod w1 (rank ") || !strstr(g.reason, "exited with code 3"))
        fail_msg("the failed job's reason: %s", g.reason);
    edl_generation_clear(&g);
}

/* The trainer: edl comes from the injected package, then the example trains on two ranks. */
#define PYTHON_TRAINER_SCRIPT                                                                   \
    "export PYTHONPATH=/edl/bin/python; cd /tmp && "                                            \
    "python3 -c 'import edl; assert edl.__file__ == \"/edl/bin/python/edl/__init__.py\", "       \
    "edl.__file__' && exec python3 /train_elastic.py --epochs 1 --samples 512"

static void test_python_trainer_in_a_root_of_python_and_torch(void **state)
{
    (void)state;
#ifndef EDL_PYTHON_PKG
    skip(); /* the Python package is not built here (python3-dev) */
#else
    char out[4096], log[400], pyroot[300];
    snprintf(pyroot, sizeof pyroot, "%s/python", dir);
    snprintf(log, sizeof log, "%s/python-root.log", dir);
    const char *argv[] = {EDL_SOURCE_DIR "/tests/python-root", pyroot, NULL};
    if (harness_run(argv, log, 60000, out, sizeof out) != 0) {
        print_message("skipped: tests/python-root: %s\n", out); /* no python3-torch here */
        skip();
    }
    harness_busybox_root(pyroot);
    harness_sh("cp '%s/examples/python/train_elastic.py' '%s/'", EDL_SOURCE_DIR, pyroot);
    snprintf(log, sizeof log, "%s/install-python.log", dir);
    harness_chroot_install(image, pyroot, log, out, sizeof out);
    assert_non_null(strstr(out, "installed the Python package edl"));
    harness_sh("test -f '%s/edl/bin/python/edl/_libs/libmicrohttpd.so.12' && "
               "test ! -e '%s/usr/lib/x86_64-linux-gnu/libmicrohttpd.so.12'", pyroot, pyroot);
    harness_chroot_job job = {.agent = "/edl/bin/edl-agent", .userspec = "1000:1000",
                              .root = pyroot, .log_dir = dir, .srv = job_in_worker.srv,
                              .client = job_in_worker.client};
    edl_generation g = {0};
    harness_chroot_run(&job, "inject-python", PYTHON_TRAINER_SCRIPT, 0, &g);
    assert_int_equal(g.state, EDL_JOB_SUCCEEDED);
    edl_generation_clear(&g);
#endif
}

static const char *missing(void)
{
    char path[256];
    const char *why = harness_chroot_missing();
    if (why)
        return why;
    if (!harness_busybox_static())
        return "needs Debian's busybox-static, a static /bin/busybox (scripts/install-deps)";
    if (!harness_which("patchelf", path, sizeof path))
        return "needs patchelf (scripts/install-deps)";
    return NULL;
}

int main(void)
{
    const char *why = missing();
    if (why) {
        printf("SKIP: test_agent_injection %s\n", why);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_install_from_a_scratch_image),
        cmocka_unit_test(test_job_runs_in_a_busybox_root),
        cmocka_unit_test(test_trainer_exit_code_reaches_the_job),
        cmocka_unit_test(test_python_trainer_in_a_root_of_python_and_torch),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

/* test_agent_injection.c: the portable agent, injected the way the Kubernetes operator injects
 * it into an image we do not own, for real but without containers (docker/ and
 * tests/test_images do it with the images themselves).
 *
 * Two roots under a scratch directory. "image" is FROM scratch like docker/Dockerfile.agent: only
 * the launcher /usr/local/bin/edl-agent and the bundle /usr/local/lib/edl/agent, both made by
 * scripts/bundle-agent from the built agent. "worker" holds nothing but Debian's busybox-static
 * (/bin/busybox, /bin/sh), /tmp and /dev/null: no C library, no loader. The init container is
 * `chroot --userspec 65532:65532 image edl-agent --install /edl/bin` with PATH=/usr/local/bin;
 * its /edl/bin (mode 0777, as an emptyDir) then becomes the worker's /edl/bin, as the volume
 * both containers mount would. The worker container is `chroot --userspec 1000:1000 worker
 * /edl/bin/edl-agent ... -- /bin/sh -c ...` with a bare environment, against a real etcd and
 * the real edl-jobserver on the host's loopback (a chroot shares the network).
 *
 * Needs root (chroot), busybox-static and patchelf: exits 77 (skipped) without them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "edl/etcd.h"
#include "edl/job.h"
#include "harness.h"

static edl_etcd_server *srv;
static edl_etcd *cl;
static char dir[256], image[300], worker[300];
static char chroot_bin[256], env_bin[256];

/* ---- helpers ------------------------------------------------------------------------------ */

/* The path of a program on PATH into out (len bytes): false when there is none. */
static bool find_prog(const char *name, char *out, size_t len)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "command -v %s", name);
    if (harness_shell(cmd, out, len) != 0 || out[0] != '/')
        return false;
    out[strcspn(out, "\n")] = '\0';
    return true;
}

/* Run a /bin/sh command line; fail the test when it does not exit 0. */
static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = harness_shell(cmd, NULL, 0);
    if (rc != 0)
        fail_msg("`%s` exited %d", cmd, rc);
}

/* The value of NAME in `env` output (a line NAME=value) into out: false when absent. */
static bool env_get(const char *env, const char *name, char *out, size_t len)
{
    size_t n = strlen(name);
    for (const char *p = env; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, name, n) == 0 && p[n] == '=') {
            snprintf(out, len, "%.*s", (int)strcspn(p + n + 1, "\n"), p + n + 1);
            return true;
        }
    return false;
}

static void assert_env(const char *env, const char *name, const char *want)
{
    char v[256];
    if (!env_get(env, name, v, sizeof v))
        fail_msg("the trainer's environment has no %s:\n%s", name, env);
    if (strcmp(v, want) != 0)
        fail_msg("the trainer's %s is '%s', expected '%s'", name, v, want);
}

/* ---- fixtures: the two roots --------------------------------------------------------------- */

static int group_setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/edl-inject-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(image, sizeof image, "%s/image", dir);
    snprintf(worker, sizeof worker, "%s/worker", dir);
    /* /dev/null as every container runtime provides it (the agent's children's stdin) */
    sh("set -e; mkdir -p '%s/usr/local/bin' '%s/usr/local/lib/edl' '%s/edl/bin' '%s/bin' "
       "'%s/tmp' '%s/edl' '%s/dev'; chmod 0777 '%s/edl/bin'; chmod 1777 '%s/tmp'; "
       "cp /bin/busybox '%s/bin/'; ln -s busybox '%s/bin/sh'; mknod -m 0666 '%s/dev/null' c 1 3",
       image, image, image, worker, worker, worker, worker, image, worker, worker, worker, worker);
    char launcher[400], bundle[400], log[400], out[4096];
    snprintf(launcher, sizeof launcher, "%s/usr/local/bin/edl-agent", image);
    snprintf(bundle, sizeof bundle, "%s/usr/local/lib/edl/agent", image);
    snprintf(log, sizeof log, "%s/bundle.log", dir);
    const char *argv[] = {EDL_SOURCE_DIR "/scripts/bundle-agent", "--launcher", launcher,
                          EDL_AGENT_BIN, bundle, NULL};
    if (harness_run(argv, log, 30000, out, sizeof out) != 0)
        fail_msg("scripts/bundle-agent failed:\n%s", out);
    harness_open_etcd(1, NULL, &srv, &cl);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    harness_close_etcd(&srv, &cl);
    harness_rmtree(dir);
    return 0;
}

/* ---- the init container -------------------------------------------------------------------- */

/* `edl-agent --install /edl/bin` in the FROM-scratch root, as the image's user: its output. */
static void install_in_image(char *out, size_t len)
{
    char log[400];
    snprintf(log, sizeof log, "%s/install.log", dir);
    const char *argv[] = {env_bin, "-i", "PATH=/usr/local/bin", chroot_bin,
                          "--userspec=65532:65532", image, "edl-agent", "--install", "/edl/bin",
                          NULL};
    int rc = harness_run(argv, log, 20000, out, len);
    if (rc != 0)
        fail_msg("edl-agent --install in the scratch root exited %d:\n%s", rc, out);
}

static void test_install_from_a_scratch_image(void **state)
{
    (void)state;
    char out[4096], path[512];
    install_in_image(out, sizeof out);
    assert_non_null(strstr(out, "installed /edl/bin/edl-agent"));
    assert_non_null(strstr(out, "in /edl/bin/lib, from /usr/local/lib/edl/agent"));
    assert_null(strstr(out, "warning"));
    install_in_image(out, sizeof out); /* a restarted init container installs over it */
    /* the emptyDir: what the init container wrote is what the worker container sees */
    snprintf(path, sizeof path, "%s/edl/bin", image);
    char to[512];
    snprintf(to, sizeof to, "%s/edl/bin", worker);
    assert_int_equal(rename(path, to), 0);
    struct stat st;
    snprintf(path, sizeof path, "%s/edl/bin/edl-agent", worker);
    assert_int_equal(stat(path, &st), 0);
    assert_true(st.st_uid == 65532 && (st.st_mode & 0777) == 0755);
    snprintf(path, sizeof path, "%s/edl/bin/lib/ld-linux-x86-64.so.2", worker);
    assert_int_equal(stat(path, &st), 0);
    snprintf(path, sizeof path, "%s/edl/bin/lib/libc.so.6", worker);
    assert_int_equal(stat(path, &st), 0);
    /* nothing half-written left, and the worker root holds no C library of its own */
    sh("test -z \"$(find '%s/edl/bin' -name '*.tmp.*')\"", worker);
    sh("test \"$(cd '%s' && find . -path ./edl -prune -o -type f -print)\" = ./bin/busybox",
       worker);
}

/* ---- the worker container ------------------------------------------------------------------ */

/* Start the injected agent for job/pod in the busybox root, as user 1000, with a bare
 * environment; its output goes to <dir>/<job>.<pod>.log. */
static pid_t start_worker(const char *job, const char *pod, const char *script)
{
    char log[400];
    snprintf(log, sizeof log, "%s/%s.%s.log", dir, job, pod);
    const char *argv[] = {env_bin, "-i", "PATH=/bin", "HOME=/", chroot_bin,
                          "--userspec=1000:1000", worker, "/edl/bin/edl-agent", "--etcd",
                          edl_etcd_server_endpoints(srv), "--job", job, "--pod", pod,
                          "--grace-ms", "1000", "--", "/bin/sh", "-c", script, NULL};
    pid_t pid = harness_spawn(argv, log);
    assert_true(pid > 0);
    return pid;
}

/* The exit status of a process started here; fails the test with its log after 30 s. */
static int wait_done(pid_t pid, const char *what, const char *log)
{
    int rc = harness_wait_exit(pid, 30000);
    if (rc == -1) {
        harness_kill(pid, SIGKILL);
        char buf[8192];
        fail_msg("%s did not finish within 30 s; its log:\n%s", what,
                 harness_read_file(log, buf, sizeof buf));
    }
    return rc;
}

/* Run job with two pods in the busybox root and the real job server: the job's final
 * generation in g; each agent's exit status must be want. */
static void run_job(const char *job, const char *script, int want, edl_generation *g)
{
    char k[256], log[400], buf[8192], err[256];
    harness_put(cl, harness_job_key(k, sizeof k, job, EDL_KEY_SPEC, NULL, 0),
                "{\"min\":2,\"max\":2,\"settle_ms\":100,\"max_restarts\":0}");
    snprintf(log, sizeof log, "%s/%s.jobserver.log", dir, job);
    const char *js_argv[] = {EDL_JOBSERVER_BIN, "--etcd", edl_etcd_server_endpoints(srv), "--job",
                             job, "--id", "js", "--ttl", "2", "--exit-when-done", NULL};
    pid_t js = harness_spawn(js_argv, log);
    assert_true(js > 0);
    pid_t a[2] = {start_worker(job, "w0", script), start_worker(job, "w1", script)};
    for (int i = 0; i < 2; i++) {
        snprintf(log, sizeof log, "%s/%s.w%d.log", dir, job, i);
        int rc = wait_done(a[i], "the injected agent", log);
        if (rc != want)
            fail_msg("the agent of w%d exited %d, expected %d; its log:\n%s", i, rc, want,
                     harness_read_file(log, buf, sizeof buf));
    }
    snprintf(log, sizeof log, "%s/%s.jobserver.log", dir, job);
    wait_done(js, "the job server", log);
    assert_non_null(harness_get(cl, harness_job_key(k, sizeof k, job, EDL_KEY_GENERATION, NULL, 0),
                                buf, sizeof buf));
    assert_int_equal(edl_generation_parse(buf, strlen(buf), g, err, sizeof err), 0);
}

static void test_job_runs_in_a_busybox_root(void **state)
{
    (void)state;
    const char *job = "inject-ok";
    edl_generation g = {0};
    run_job(job, "{ busybox env; echo \"uid=$(busybox id -u)\"; } > /tmp/$EDL_POD_ID.tmp && "
                 "busybox mv /tmp/$EDL_POD_ID.tmp /tmp/$EDL_POD_ID.env", 0, &g);
    assert_int_equal(g.state, EDL_JOB_SUCCEEDED);
    assert_int_equal(g.n_members, 2);
    bool rank_seen[2] = {false, false};
    for (int i = 0; i < 2; i++) {
        char path[512], env[16384], rank[16];
        snprintf(path, sizeof path, "%s/tmp/w%d.env", worker, i);
        harness_read_file(path, env, sizeof env);
        assert_env(env, "uid", "1000");
        assert_env(env, "EDL_JOB_ID", job);
        assert_env(env, "TORCHELASTIC_RUN_ID", job);
        assert_env(env, "WORLD_SIZE", "2");
        assert_env(env, "MASTER_ADDR", "127.0.0.1");
        assert_true(env_get(env, "MASTER_PORT", rank, sizeof rank) && atoi(rank) > 0);
        assert_true(env_get(env, "RANK", rank, sizeof rank));
        const edl_member *m = edl_generation_member_named(&g, i ? "w1" : "w0");
        assert_non_null(m);
        assert_int_equal(atoi(rank), m->rank);
        rank_seen[m->rank] = true;
    }
    assert_true(rank_seen[0] && rank_seen[1]);
    edl_generation_clear(&g);
}

static void test_trainer_exit_code_reaches_the_job(void **state)
{
    (void)state;
    edl_generation g = {0};
    run_job("inject-fail", "[ \"$EDL_POD_ID\" != w1 ] || exit 3", 1, &g);
    assert_int_equal(g.state, EDL_JOB_FAILED);
    if (!strstr(g.reason, "pod w1 (rank ") || !strstr(g.reason, "exited with code 3"))
        fail_msg("the failed job's reason: %s", g.reason);
    edl_generation_clear(&g);
}

/* ---- main ---------------------------------------------------------------------------------- */

static const char *missing(void)
{
    char patchelf[256];
    if (geteuid() != 0)
        return "needs root (chroot)";
    if (harness_shell("LC_ALL=C ldd /bin/busybox 2>&1 | grep -q 'not a dynamic executable'",
                      NULL, 0) != 0)
        return "needs Debian's busybox-static: a static /bin/busybox (scripts/install-deps)";
    if (!find_prog("patchelf", patchelf, sizeof patchelf))
        return "needs patchelf (scripts/install-deps)";
    if (!find_prog("chroot", chroot_bin, sizeof chroot_bin) ||
        !find_prog("env", env_bin, sizeof env_bin))
        return "needs chroot and env (coreutils)";
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
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

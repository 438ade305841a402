/* harness_chroot.c: jobs whose agents run inside another root filesystem, by chroot (which
 * shares the host's network, so they reach etcd and the job server on loopback): the portable
 * agent injected as the Kubernetes operator injects it into images we do not own
 * (tests/test_agent_injection.c, tests/test_images.c). Plain chroot: no mounts, so no more
 * than CAP_SYS_CHROOT is needed and nothing is left behind (a sanitized build aside, below). */
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
#include "harness.h"

void harness_sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = harness_shell(cmd, NULL, 0);
    if (rc != 0)
        fail_msg("`%s` exited %d", cmd, rc);
}

bool harness_which(const char *name, char *out, size_t len)
{
    char cmd[160];
    snprintf(cmd, sizeof cmd, "command -v '%s'", name);
    if (harness_shell(cmd, out, len) != 0 || out[0] != '/')
        return false;
    out[strcspn(out, "\n")] = '\0';
    return true;
}

/* harness_which, or fail the test. */
static const char *which(const char *name, char *out, size_t len)
{
    if (!harness_which(name, out, len))
        fail_msg("%s is not on PATH", name);
    return out;
}

bool harness_busybox_static(void)
{
    return harness_shell("LC_ALL=C ldd /bin/busybox 2>&1 | grep -q 'not a dynamic executable'",
                         NULL, 0) == 0;
}

void harness_busybox_root(const char *dir)
{
    harness_sh("set -e; mkdir -p '%s/bin' '%s/tmp'; chmod 1777 '%s/tmp'; "
               "cp /bin/busybox '%s/bin/'; ln -s busybox '%s/bin/sh'", dir, dir, dir, dir, dir);
}

/* Sanitizers read their options and the process's threads from /proc, which a plain chroot
 * lacks: in a sanitized build the root gets a /proc of its own (unshare --mount-proc, in a mount
 * namespace that ends with the process), and the sanitizer options pass into the bare
 * environment. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

const char *harness_chroot_missing(void)
{
    char path[256];
    if (geteuid() != 0)
        return "needs root (chroot)";
    if (!harness_which("chroot", path, sizeof path) || !harness_which("env", path, sizeof path))
        return "needs chroot and env (coreutils)";
    if (SANITIZED && harness_shell("d=$(mktemp -d) && unshare --mount-proc=\"$d\" true; "
                                   "rc=$?; rmdir \"$d\"; exit $rc", NULL, 0) != 0)
        return "needs, built with sanitizers, unshare --mount-proc (they read /proc)";
    return NULL;
}

/* A command line `env -i VARS... [unshare --mount-proc=ROOT/proc] chroot --userspec=USER ROOT`,
 * to which the command in the root is appended. */
typedef struct chroot_cmd {
    const char *argv[48];
    int n;
    char env[256], unshare[256], chroot[256], user[64], proc[600], san[2][1024];
} chroot_cmd;

static void chroot_cmd_init(chroot_cmd *c, const char *root, const char *user, const char *path)
{
    c->n = 0;
    c->argv[c->n++] = which("env", c->env, sizeof c->env);
    c->argv[c->n++] = "-i";
    c->argv[c->n++] = path;
    c->argv[c->n++] = "HOME=/";
    const char *names[2] = {"ASAN_OPTIONS", "UBSAN_OPTIONS"};
    for (int i = 0; SANITIZED && i < 2; i++)
        if (getenv(names[i])) {
            snprintf(c->san[i], sizeof c->san[i], "%s=%s", names[i], getenv(names[i]));
            c->argv[c->n++] = c->san[i];
        }
    if (SANITIZED) {
        harness_sh("mkdir -p '%s/proc'", root);
        snprintf(c->proc, sizeof c->proc, "--mount-proc=%s/proc", root);
        c->argv[c->n++] = which("unshare", c->unshare, sizeof c->unshare);
        c->argv[c->n++] = c->proc;
    }
    snprintf(c->user, sizeof c->user, "--userspec=%s", user);
    c->argv[c->n++] = which("chroot", c->chroot, sizeof c->chroot);
    c->argv[c->n++] = c->user;
    c->argv[c->n++] = root;
}

static void chroot_cmd_add(chroot_cmd *c, const char *arg)
{
    assert_true(c->n < (int)(sizeof c->argv / sizeof c->argv[0]) - 1);
    c->argv[c->n++] = arg;
    c->argv[c->n] = NULL;
}

void harness_chroot_install(const char *image, const char *root, const char *log, char *out,
                            size_t len)
{
    /* the emptyDir: the kubelet makes it (mode 0777) and mounts it in both containers */
    harness_sh("set -e; mkdir -p '%s/edl/bin' '%s/edl'; chmod 0777 '%s/edl/bin'", image, root,
               image);
    chroot_cmd c;
    chroot_cmd_init(&c, image, "65532:65532", "PATH=/usr/local/bin");
    const char *cmd[] = {"edl-agent", "--install", "/edl/bin"};
    for (size_t i = 0; i < 3; i++)
        chroot_cmd_add(&c, cmd[i]);
    int rc = harness_run(c.argv, log, 20000, out, len);
    if (rc != 0)
        fail_msg("edl-agent --install in %s exited %d:\n%s", image, rc, out);
    harness_sh("set -e; rm -rf '%s/edl/bin'; mv '%s/edl/bin' '%s/edl/bin'", root, image, root);
}

/* Start the agent of job/pod in the job's root; output in <log_dir>/<job>.<pod>.log. */
static pid_t start_agent(const harness_chroot_job *j, const char *job, const char *pod,
                         const char *script)
{
    char log[512];
    snprintf(log, sizeof log, "%s/%s.%s.log", j->log_dir, job, pod);
    chroot_cmd c;
    chroot_cmd_init(&c, j->root, j->userspec, "PATH=/usr/local/bin:/usr/bin:/bin");
    const char *cmd[] = {j->agent, "--etcd", edl_etcd_server_endpoints(j->srv), "--job", job,
                         "--pod", pod, "--grace-ms", "1000", "--", "/bin/sh", "-c", script};
    for (size_t i = 0; i < sizeof cmd / sizeof cmd[0]; i++)
        chroot_cmd_add(&c, cmd[i]);
    pid_t pid = harness_spawn(c.argv, log);
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

void harness_chroot_run(const harness_chroot_job *j, const char *job, const char *script,
                        int want, edl_generation *g)
{
    char k[256], log[512], buf[8192], err[256];
    /* every container runtime gives a container /dev/null (the agent's children's stdin) */
    harness_sh("set -e; mkdir -p '%s/dev'; [ -e '%s/dev/null' ] || "
               "mknod -m 0666 '%s/dev/null' c 1 3", j->root, j->root, j->root);
    harness_put(j->client, harness_job_key(k, sizeof k, job, EDL_KEY_SPEC, NULL, 0),
                "{\"min\":2,\"max\":2,\"settle_ms\":100,\"max_restarts\":0}");
    snprintf(log, sizeof log, "%s/%s.jobserver.log", j->log_dir, job);
    const char *js_argv[] = {EDL_JOBSERVER_BIN, "--etcd", edl_etcd_server_endpoints(j->srv),
                             "--job", job, "--id", "js", "--ttl", "2", "--exit-when-done", NULL};
    pid_t js = harness_spawn(js_argv, log);
    assert_true(js > 0);
    pid_t a[2] = {start_agent(j, job, "w0", script), start_agent(j, job, "w1", script)};
    for (int i = 0; i < 2; i++) {
        snprintf(log, sizeof log, "%s/%s.w%d.log", j->log_dir, job, i);
        int rc = wait_done(a[i], "the agent", log);
        if (rc != want)
            fail_msg("the agent of w%d in %s exited %d, expected %d; its log:\n%s", i, j->root,
                     rc, want, harness_read_file(log, buf, sizeof buf));
    }
    snprintf(log, sizeof log, "%s/%s.jobserver.log", j->log_dir, job);
    wait_done(js, "the job server", log);
    assert_non_null(harness_get(j->client, harness_job_key(k, sizeof k, job, EDL_KEY_GENERATION,
                                                           NULL, 0), buf, sizeof buf));
    assert_int_equal(edl_generation_parse(buf, strlen(buf), g, err, sizeof err), 0);
}

/* The value of NAME in `env` output (lines NAME=value) into out: false when absent. */
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
    if (want && strcmp(v, want) != 0)
        fail_msg("the trainer's %s is '%s', expected '%s'", name, v, want);
}

void harness_chroot_check_env(const harness_chroot_job *j, const char *job,
                              const edl_generation *g, const char *uid)
{
    assert_int_equal(g->state, EDL_JOB_SUCCEEDED);
    assert_int_equal(g->n_members, 2);
    for (int i = 0; i < 2; i++) {
        char pod[8], path[512], env[16384], rank[16];
        snprintf(pod, sizeof pod, "w%d", i);
        snprintf(path, sizeof path, "%s/tmp/%s.%s.env", j->root, job, pod);
        if (!*harness_read_file(path, env, sizeof env))
            fail_msg("the trainer of %s wrote no %s", pod, path);
        const edl_member *m = edl_generation_member_named(g, pod);
        assert_non_null(m);
        snprintf(rank, sizeof rank, "%d", m->rank);
        assert_env(env, "uid", uid);
        assert_env(env, "RANK", rank);
        assert_env(env, "EDL_POD_ID", pod);
        assert_env(env, "EDL_JOB_ID", job);
        assert_env(env, "TORCHELASTIC_RUN_ID", job);
        assert_env(env, "WORLD_SIZE", "2");
        assert_env(env, "MASTER_ADDR", "127.0.0.1");
        assert_env(env, "MASTER_PORT", NULL);
        /* the agent's own loader and libraries stay the agent's: the trainer gets the image's */
        if (strstr(env, "\nLD_") || strncmp(env, "LD_", 3) == 0)
            fail_msg("the trainer's environment has an LD_ variable:\n%s", env);
    }
}

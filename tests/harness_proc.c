/* harness_proc.c: child processes for tests (job servers, agents, launchers): started with
 * edl_spawn (PR_SET_PDEATHSIG) so that a failed test leaves none behind, waited for with a
 * deadline. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "edl/proc.h"
#include "harness.h"

static pid_t spawn(const char *const *argv, const char *log_path, bool group)
{
    edl_spawn_opts so = {.argv = (char *const *)argv, .log_path = log_path, .new_group = group};
    char err[512];
    pid_t pid;
    if (edl_spawn(&so, &pid, err, sizeof err) != 0) {
        fprintf(stderr, "harness_spawn: %s\n", err);
        return -1;
    }
    return pid;
}

pid_t harness_spawn(const char *const *argv, const char *log_path)
{
    return spawn(argv, log_path, false);
}

pid_t harness_spawn_group(const char *const *argv, const char *log_path)
{
    return spawn(argv, log_path, true);
}

int harness_wait_exit(pid_t pid, int timeout_ms)
{
    int64_t deadline = harness_now_ms() + timeout_ms;
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (r < 0 && errno != EINTR)
            return -2;
        if (harness_now_ms() >= deadline)
            return -1;
        harness_sleep_ms(10);
    }
}

void harness_kill(pid_t pid, int sig)
{
    if (pid <= 0)
        return;
    kill(pid, sig);
    if (sig == SIGKILL)
        waitpid(pid, NULL, 0);
}

char *harness_read_file(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, len - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    return buf;
}

int harness_run(const char *const *argv, const char *log_path, int timeout_ms, char *out,
                size_t outlen)
{
    unlink(log_path);
    pid_t pid = harness_spawn(argv, log_path);
    if (pid <= 0)
        return -1;
    int rc = harness_wait_exit(pid, timeout_ms);
    if (rc == -1)
        harness_kill(pid, SIGKILL);
    if (out && outlen)
        harness_read_file(log_path, out, outlen);
    return rc;
}

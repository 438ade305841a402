/* harness_proc.c: child processes for tests (job servers, agents, launchers): spawned with
 * PR_SET_PDEATHSIG so that a failed test leaves none behind, waited for with a deadline. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

pid_t harness_spawn(const char *const *argv, const char *log_path)
{
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("harness_spawn: fork");
        return -1;
    }
    if (pid == 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
            _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        if (log_path) {
            int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
                _exit(127);
            close(fd);
        }
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0 && null != 0) {
            dup2(null, 0);
            close(null);
        }
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "harness_spawn: exec %s: %m\n", argv[0]);
        _exit(127);
    }
    return pid;
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

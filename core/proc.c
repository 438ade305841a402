/* proc.c: edl_spawn (edl/proc.h), the one fork + exec of edl. Everything the child does
 * between fork and exec is async-signal-safe: the caller may have threads (lease keepers,
 * watches), and only such calls are allowed in the child of a threaded process. */
#define _GNU_SOURCE
#include "edl/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

char *edl_spawn_resolve(const char *prog)
{
    if (!prog || !*prog)
        return NULL;
    if (strchr(prog, '/'))
        return access(prog, X_OK) == 0 ? strdup(prog) : NULL;
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path;;) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char *cand = NULL;
        if (asprintf(&cand, "%.*s/%s", (int)n, n ? p : ".", prog) < 0)
            return NULL;
        if (access(cand, X_OK) == 0)
            return cand;
        free(cand);
        if (!end)
            return NULL;
        p = end + 1;
    }
}

/* entry is "NAME=..." (or "NAME") for a NAME in list: either names, or "NAME=value" entries. */
static bool named(const char *entry, const char *const *list)
{
    size_t n = strcspn(entry, "=");
    for (size_t i = 0; list && list[i]; i++)
        if (strncmp(list[i], entry, n) == 0 && (list[i][n] == '=' || list[i][n] == '\0'))
            return true;
    return false;
}

void edl_env_free(char **env)
{
    for (size_t i = 0; env && env[i]; i++)
        free(env[i]);
    free(env);
}

char **edl_env_build(char *const *base, const char *const *unset, char *const *set)
{
    if (!base)
        base = environ;
    size_t n = 0, k = 0;
    for (size_t i = 0; base[i]; i++)
        n++;
    for (size_t i = 0; set && set[i]; i++)
        n++;
    char **env = calloc(n + 1, sizeof *env);
    for (size_t i = 0; env && base[i]; i++)
        if (!named(base[i], unset) && !named(base[i], (const char *const *)set) &&
            !(env[k++] = strdup(base[i])))
            goto oom;
    for (size_t i = 0; env && set && set[i]; i++)
        if (!(env[k++] = strdup(set[i])))
            goto oom;
    return env;
oom:
    edl_env_free(env);
    return NULL;
}

bool edl_die_with_parent(pid_t parent)
{
    return prctl(PR_SET_PDEATHSIG, SIGKILL) == 0 && getppid() == parent;
}

/* Close every fd from `lowest` up, except those in keep[0..n). */
static void close_others(int lowest, const int *keep, size_t n)
{
    int top = lowest - 1;
    for (size_t i = 0; i < n; i++)
        top = keep[i] > top ? keep[i] : top;
    for (int fd = lowest; fd <= top; fd++) {
        bool kept = false;
        for (size_t i = 0; i < n; i++)
            kept = kept || keep[i] == fd;
        if (!kept)
            close(fd);
    }
    if (close_range((unsigned)top + 1, ~0U, 0) == 0)
        return;
    struct rlimit rl;
    long max = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? (long)rl.rlim_cur : 1024;
    for (long fd = top + 1; fd < (max > 65536 ? 65536 : max); fd++)
        close((int)fd);
}

/* stdin, stdout and stderr of the child. */
static int place_stdio(const edl_spawn_opts *o)
{
    int null = open("/dev/null", O_RDWR);
    int log = o->log_path ? open(o->log_path, O_WRONLY | O_CREAT | O_APPEND, 0644) : -1;
    if (null < 0 || (o->log_path && log < 0))
        return -1;
    int in = o->in > 0 ? o->in : null;
    int out = log >= 0 ? log : o->out == EDL_SPAWN_NULL ? null : o->out;
    int err = log >= 0 ? log : o->err == EDL_SPAWN_NULL ? null : o->err;
    if (dup2(in, 0) < 0 || (out > 0 && dup2(out, 1) < 0) || (err > 0 && dup2(err, 2) < 0))
        return -1;
    return 0;
}

/* In the child: never returns. errfd reports a failure (errno) to the parent. */
__attribute__((noreturn)) static void child(const edl_spawn_opts *o, const char *path,
                                            pid_t parent, int errfd)
{
    if (!edl_die_with_parent(parent))
        _exit(127); /* the parent is gone already: nobody would ever stop this child */
    if (o->new_group)
        setpgid(0, 0);
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    for (int sig = 1; sig < NSIG; sig++)
        sigaction(sig, &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* Every fd we must keep goes above the highest target first, so that placing one cannot
     * overwrite another (or the error pipe). */
    int keep[EDL_SPAWN_MAX_FDS + 1], n = 0, moved[EDL_SPAWN_MAX_FDS];
    int high = 10;
    for (size_t i = 0; i < o->n_fds; i++)
        high = o->fds[i][1] >= high ? o->fds[i][1] + 1 : high;
    errfd = fcntl(errfd, F_DUPFD_CLOEXEC, high);
    for (size_t i = 0; i < o->n_fds; i++)
        if ((moved[i] = fcntl(o->fds[i][0], F_DUPFD, high)) < 0)
            goto fail;
    if (errfd < 0 || place_stdio(o) != 0)
        goto fail;
    for (size_t i = 0; i < o->n_fds; i++) {
        if (dup2(moved[i], o->fds[i][1]) < 0)
            goto fail;
        keep[n++] = o->fds[i][1];
    }
    keep[n++] = errfd;
    close_others(3, keep, (size_t)n);
    execve(path, o->argv, o->envp ? o->envp : environ);
fail:;
    int e = errno;
    ssize_t w = write(errfd, &e, sizeof e);
    (void)w;
    _exit(127);
}

static int check_opts(const edl_spawn_opts *o, char *err, size_t errlen)
{
    if (!o || !o->argv || !o->argv[0] || o->n_fds > EDL_SPAWN_MAX_FDS) {
        snprintf(err, errlen, "spawn: no program, or more than %d fds", EDL_SPAWN_MAX_FDS);
        return EDL_EINVAL;
    }
    for (size_t i = 0; i < o->n_fds; i++)
        if (o->fds[i][0] < 0 || o->fds[i][1] < 3) {
            snprintf(err, errlen, "spawn %s: fd %d cannot become fd %d in the child", o->argv[0],
                     o->fds[i][0], o->fds[i][1]);
            return EDL_EINVAL;
        }
    return 0;
}

int edl_spawn(const edl_spawn_opts *o, pid_t *pid_out, char *err, size_t errlen)
{
    char dummy[8];
    if (!err || !errlen)
        err = dummy, errlen = sizeof dummy;
    int rc = check_opts(o, err, errlen);
    if (rc)
        return rc;
    errno = 0;
    char *path = edl_spawn_resolve(o->argv[0]);
    if (!path) {
        if (strchr(o->argv[0], '/'))
            snprintf(err, errlen, "%s: %s", o->argv[0], strerror(errno ? errno : ENOENT));
        else
            snprintf(err, errlen, "%s: not found in PATH (%s)", o->argv[0],
                     getenv("PATH") ? getenv("PATH") : "");
        return EDL_ECONFIG;
    }
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        snprintf(err, errlen, "spawn %s: pipe: %s", o->argv[0], strerror(errno));
        free(path);
        return EDL_EIO;
    }
    pid_t parent = getpid();
    fflush(stdout); /* or the child could print our buffered lines again */
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0)
        child(o, path, parent, pfd[1]);
    int fork_errno = errno;
    close(pfd[1]);
    free(path);
    if (pid < 0) {
        close(pfd[0]);
        snprintf(err, errlen, "spawn %s: fork: %s", o->argv[0], strerror(fork_errno));
        return EDL_EIO;
    }
    if (o->new_group)
        setpgid(pid, pid); /* here too: no race with a signal to the group right after */
    int child_errno = 0;
    ssize_t n;
    while ((n = read(pfd[0], &child_errno, sizeof child_errno)) < 0 && errno == EINTR) {
    }
    close(pfd[0]);
    if (n > 0) { /* exec (or the set-up before it) failed: the child has exited */
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
        }
        snprintf(err, errlen, "cannot execute %s: %s", o->argv[0], strerror(child_errno));
        return EDL_EIO;
    }
    if (pid_out)
        *pid_out = pid;
    return 0;
}

int edl_cpu_count(void)
{
    cpu_set_t set;
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (n < 1)
        n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n;
}

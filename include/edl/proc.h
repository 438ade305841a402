/* edl/proc.h: start a child process the way every edl program does (the agent's trainer, the
 * launcher's agents and job server, the local etcd, the tests' and benchmarks' helpers).
 *
 * fork + exec with the child tied to its parent: PR_SET_PDEATHSIG(SIGKILL) (checked against a
 * parent that died before it took effect), every signal disposition and the signal mask reset
 * (an ignored SIGPIPE would otherwise survive exec), stdin from /dev/null unless given, the
 * chosen fds placed at fixed numbers and every other fd above 2 closed. The program is looked
 * up in PATH before the fork (after a fork in a threaded process only async-signal-safe calls
 * are allowed), and a failed exec is reported to the caller, not only to the child's stderr.
 *
 * PR_SET_PDEATHSIG fires when the *thread* that forked ends: spawn from a thread that lives as
 * long as the child should. Also: the CPUs this process may use (edl_cpu_count). */
#ifndef EDL_PROC_H
#define EDL_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "edl/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EDL_SPAWN_NULL (-1) /* for out/err: /dev/null */
#define EDL_SPAWN_MAX_FDS 8

typedef struct edl_spawn_opts {
    char *const *argv;     /* argv[0]: a path, or a name looked up in PATH */
    char *const *envp;     /* NULL: the caller's environment */
    int in;                /* 0: /dev/null; else this fd becomes stdin */
    int out, err;          /* 0: inherited; EDL_SPAWN_NULL: /dev/null; else this fd */
    const char *log_path;  /* when set, stdout and stderr append to this file (0644) */
    int fds[EDL_SPAWN_MAX_FDS][2]; /* {fd here, fd number in the child (>= 3)} */
    size_t n_fds;
    bool new_group;        /* the child leads a process group of its own (setpgid) */
} edl_spawn_opts;

/* Start the child; *pid (may be NULL) receives its pid. EDL_EINVAL for bad options,
 * EDL_ECONFIG when argv[0] is not found or not executable, EDL_EIO when fork or exec failed;
 * err (may be NULL) then says which program and why. */
int edl_spawn(const edl_spawn_opts *o, pid_t *pid, char *err, size_t errlen);

/* A child's environment: base (NULL: the caller's own) without the names listed in unset and
 * without those that set gives, followed by set's "NAME=value" entries. NULL-terminated and
 * malloc'ed (edl_env_free); NULL when out of memory. */
char **edl_env_build(char *const *base, const char *const *unset, char *const *set);
void edl_env_free(char **env);

/* For a child forked without exec (a test's or benchmark's helper process): die with SIGKILL when
 * the parent dies (PR_SET_PDEATHSIG). false when the parent, whose pid the caller took before
 * the fork, is gone already: the child should exit at once. Async-signal-safe. */
bool edl_die_with_parent(pid_t parent);

/* argv[0] resolved as exec would (a name with no '/' searched in $PATH, default
 * /usr/local/bin:/usr/bin:/bin): a malloc'ed path to an executable file, or NULL. */
char *edl_spawn_resolve(const char *prog);

/* The CPUs this process may run on: its affinity mask (which a container's cpuset or taskset
 * narrows), else the online CPUs; at least 1. What sizes its threads and buffers. */
int edl_cpu_count(void);

#ifdef __cplusplus
}
#endif
#endif

/* edl_run_common.h: the set-up the `edl run` tests share (edl_run_common.c): one etcd (ep())
 * and one scratch directory (g_dir) per test binary, made by edl_run_setup and removed by
 * edl_run_teardown (cmocka's group set-up and teardown). */
#ifndef EDL_RUN_COMMON_H
#define EDL_RUN_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "edl/etcd.h"
#include "edl/etcd_server.h"
#include "edl/job.h"

extern edl_etcd_server *g_srv;
extern edl_etcd *g_c;
extern char g_dir[256];

int edl_run_setup(void **state);
int edl_run_teardown(void **state);
/* The tests' etcd's endpoints. */
const char *ep(void);
/* Run `edl ARGS` to completion with output in a file; returns the exit status. */
int edl_cmd(char *out, size_t outlen, const char *const *args);
/* True when one line of the job's `edl run` log contains a, b and c (NULL: anything). */
bool log_has(const char *job, const char *a, const char *b, const char *c);
/* Start `edl run ... -- TRAINER...` in the background (output appended to <dir>/<job>.log);
 * in a process group of its own when group (as a shell starts a job in a terminal). */
pid_t edl_run_in(const char *job, const char *const *opts, const char *const *trainer,
                 bool group);
/* The same in the test's process group. */
pid_t edl_run_argv(const char *job, const char *const *opts, const char *const *trainer);
/* Wait for `edl run` of job (pid run) to exit with code; otherwise print the end of the job's
 * log (what the launcher, agents and trainers said) and fail. */
void run_exits(const char *job, pid_t run, int timeout_ms, int code);
/* The same with a shell script as the trainer. */
pid_t edl_run(const char *job, const char *const *opts, const char *script);
/* A key of the job (edl/job.h's builder); a few live at once in one expression. */
char *key(const char *job, edl_job_key_kind kind, const char *pod);
/* The job's generation from etcd into *out: false when there is none (yet). */
bool read_generation(const char *job, edl_generation *out);
/* Wait for a running generation newer than `after` with n members in which every member's
 * trainer runs. */
void wait_running_after(const char *job, int64_t after, int n, int timeout_ms,
                        edl_generation *c);
/* The pid of a pod's agent: it is in the pod's registration. */
pid_t agent_pid(const char *job, const char *pod);
/* Signal the agent of a pod. */
void signal_agent(const char *job, const char *pod, int sig);
/* wait_running_after any generation. */
void wait_running(const char *job, int n, int timeout_ms, edl_generation *c);
/* Wait until a pod's trainer has reported step `step` (edl_agent_link_report_step). */
void wait_step(const char *job, const char *pod, int64_t step, int timeout_ms);
/* The value of NAME in a file of NAME=VALUE lines (an `env` dump) into out: out, or NULL. */
char *env_value(const char *path, const char *name, char *out, size_t n);

#endif

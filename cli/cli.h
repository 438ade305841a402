/* cli.h: what the `edl` subcommands share: finding a job's etcd, reading and changing its spec,
 * the exit codes. */
#ifndef EDL_CLI_H
#define EDL_CLI_H

#include <stdbool.h>

#include "edl/job.h"
#include "edl/etcd.h"
#include "edl/trainingjob.h"

/* Exit codes: EDL_EXIT_* of edl/job.h (for run, the job's result; for status, scale and stop,
 * EDL_EXIT_FAILED means no such job). */

/* Options every subcommand takes. */
typedef struct cli_common {
    edl_etcd_config etcd; /* flags (edl/etcd.h), else EDL_ETCD_*, else the local job's state
                           * file; cleared by cli_connect */
    const char *prefix;   /* --prefix (EDL_DEFAULT_PREFIX) */
    bool local;           /* set by cli_connect: the settings came from the state file */
} cli_common;

/* The most agents `edl run` starts on one machine. */
#define CLI_LOCAL_AGENTS_MAX 1024

/* state.c: the files `edl run` leaves for other terminals, in a directory only this user can
 * write: $EDL_STATE_DIR, else $XDG_RUNTIME_DIR/edl, else /tmp/edl-<uid> (see state.c). */
void cli_state_dir(char *buf, size_t n);
/* Whether dir (created 0700 if asked and missing) is a real directory of this user that group
 * and others cannot write, the one rule for edl's directories on a shared host: 0, or
 * EDL_ENOTFOUND / EDL_EIO with the reason and what to do in why. */
int cli_private_dir(const char *dir, bool create, char *why, size_t whylen);
/* Whether the state directory is usable (created if missing): 0, or EDL_EIO with the reason and
 * what to do in why. edl run refuses to start without it. */
int cli_state_check(char *why, size_t whylen);
/* Write / read <state dir>/<job>.endpoints: how to reach the local job's etcd (endpoints, TLS
 * and auth, as EDL_ETCD_* lines); read fills only the settings still unset. 0, or an EDL_E*
 * code with the reason in why (EDL_ENOTFOUND: no such file; EDL_EIO: the directory is not
 * private, the file is a link, ...). */
int cli_state_write(const char *job, const edl_etcd_config *etcd, char *why, size_t whylen);
int cli_state_read(const char *job, edl_etcd_config *etcd, char *why, size_t whylen);
/* New directories (mode 0700) of one run in the state directory, their path in out: for the
 * throwaway certificates of edl run's own etcd (<job>.tls.XXXXXX), and for the agents' own
 * directories (<job>.run.XXXXXX, given to them as --scratch-dir). */
int cli_state_tls_dir(const char *job, char *out, size_t n, char *why, size_t whylen);
int cli_state_scratch_dir(const char *job, char *out, size_t n, char *why, size_t whylen);
/* Delete the certificates (edl_etcd_tls_make's files) and the directory. */
void cli_state_tls_remove(const char *dir);
/* Delete the agents' directory and what they left in it (killed agents leave theirs). */
void cli_state_scratch_remove(const char *dir);
/* Whether this machine runs the job under `edl run` (its state file is there). */
bool cli_state_exists(const char *job);
void cli_state_remove(const char *job);
/* A fresh job secret for this run of `edl run`: <state dir>/<job>-<pid>.secret, 32 random
 * bytes, mode 0600; its path in path. 0, or an EDL_E* code with the reason in why.
 * cli_state_drop_secret() removes it. */
int cli_state_new_secret(const char *job, char *path, size_t n, char *why, size_t whylen);
void cli_state_drop_secret(const char *path);

/* One launcher per job on a machine: edl run holds <state dir>/<job>.lock (flock, with its pid)
 * for its whole life. cli_state_lock takes it: 0 (*fd holds it; *stale_pid > 0, or -1 when
 * unknown, when a launcher that is gone left its state file: cli_state_clean_stale() removes
 * what else it left), EDL_EBUSY while another launcher of the job lives (why names its pid),
 * EDL_EIO. cli_state_unlock removes the file and lets go. */
int cli_state_lock(const char *job, int *fd, long *stale_pid, char *why, size_t whylen);
void cli_state_unlock(const char *job, int fd);
void cli_state_clean_stale(const char *job, long stale_pid);
/* Whether a launcher runs the job here now (its pid in *pid when known). */
typedef enum cli_launcher {
    CLI_LAUNCHER_NONE,    /* no lock file: none runs it (or one older than the lock) */
    CLI_LAUNCHER_ALIVE,   /* it holds the lock */
    CLI_LAUNCHER_GONE,    /* its lock file is there, held by nobody: it died */
    CLI_LAUNCHER_UNKNOWN, /* the directory or the file cannot be used */
} cli_launcher;
cli_launcher cli_state_launcher(const char *job, long *pid);
/* The jobs with a state file here whose launcher is not known to be gone: up to max names,
 * their number in *n. */
int cli_state_jobs(char names[][EDL_NAME_MAX + 1], size_t max, size_t *n);

/* logs.c: edl run keeps each child's output in <state dir>/<job>.logs, a file per pod and
 * rank: <pod>.rank<N>.log (a member of rank N), <pod>.server<N>.log (a parameter server),
 * <pod>.log (no rank; the job server). cli_logs_dir: the directory's path in out, created
 * (0700) when create; 0, or EDL_ENOTFOUND (no logs of the job: why says so) / EDL_EIO with
 * why. cli_logs_reset empties it for a new run. cli_logs_path: one file's path (kind "rank",
 * "server", or NULL for none). */
int cli_logs_dir(const char *job, bool create, char *out, size_t n, char *why, size_t whylen);
int cli_logs_reset(const char *dir);
void cli_logs_path(const char *dir, const char *pod, const char *kind, int num, char *out,
                   size_t n);

/* Connect to the job's etcd (resolving the settings as above, then checked; job NULL: the one
 * job edl run runs on this machine, when there is exactly one). Prints why on failure and
 * returns an exit code: EDL_EXIT_FAILED when there is no such local job or its launcher is
 * gone. Clears co->etcd either way. */
int cli_connect(cli_common *co, const char *job, edl_etcd **out);
/* Hand one of edl/etcd.h's flags to co->etcd: 0, or -1 after printing why. */
int cli_etcd_option(edl_etcd_config *etcd, const char *flag, const char *value);

/* Read the spec (EDL_ENOTFOUND when the job does not exist); *mod: its mod_revision. */
int cli_read_spec(edl_etcd *c, const edl_job_keys *k, edl_job_spec *spec, int64_t *mod);
/* Read the published generation (EDL_ENOTFOUND when there is none yet). */
int cli_read_generation(edl_etcd *c, const edl_job_keys *k, edl_generation *g);
/* Change the spec with a compare on its mod_revision, retrying on races. */
typedef void (*cli_spec_edit)(edl_job_spec *spec, void *arg);
int cli_update_spec(edl_etcd *c, const edl_job_keys *k, cli_spec_edit edit, void *arg,
                    edl_job_spec *before, edl_job_spec *after);

/* manifest.c: `edl run -f FILE`: the file's first TrainingJob, its trainer command resolved
 * (a bare name not on PATH: beside edl, or in its build tree's examples/), a file:// checkpoint
 * URI on a mounted volume moved to this user's directory for it (unless !use_checkpoint: a
 * flag gives the URI), the first container's plain env values and workingDir. Problems, a
 * field the CRD does not have among them, are printed as FILE:LINE: FIELD: what (and the
 * fields only a cluster uses as ignored); returns 0 or EDL_EXIT_USAGE. */
typedef struct cli_manifest {
    edl_trainingjob tj;
    char **env;        /* "NAME=value" (NULL-terminated) */
    char *working_dir; /* NULL: none */
} cli_manifest;
int cli_manifest_load(const char *path, bool use_checkpoint, cli_manifest *m);
void cli_manifest_clear(cli_manifest *m);

int cli_run(int argc, char **argv);
int cli_scale(int argc, char **argv);
int cli_status(int argc, char **argv);
int cli_stop(int argc, char **argv);
int cli_logs(int argc, char **argv);
/* service.c: `edl service register|list|deregister` (distillation's teachers). */
int cli_service(int argc, char **argv);

#endif

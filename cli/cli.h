/* cli.h: what the `edl` subcommands share: finding a job's etcd, reading and changing its spec,
 * the exit codes. */
#ifndef EDL_CLI_H
#define EDL_CLI_H

#include <stdbool.h>

#include "edl/cluster.h"
#include "edl/etcd.h"

/* Exit codes of `edl` (and of edl run: the job's result). */
enum {
    CLI_OK = 0,          /* done; for run: the job succeeded */
    CLI_JOB_FAILED = 1,  /* run: the job failed; status/scale/stop: no such job */
    CLI_USAGE = 2,       /* bad arguments or configuration */
    CLI_ETCD = 3,        /* etcd unreachable or refused */
    CLI_JOB_STOPPED = 4, /* run: the job was stopped (edl stop) */
};

/* Options every subcommand takes. */
typedef struct cli_common {
    const char *etcd;   /* --etcd, else $EDL_ETCD_ENDPOINTS, else the local job's state file */
    const char *prefix; /* --prefix (EDL_DEFAULT_PREFIX) */
} cli_common;

/* Directory of the state files that `edl run` leaves for other terminals:
 * $EDL_STATE_DIR, else $XDG_RUNTIME_DIR/edl, else /tmp/edl-<uid>. */
void cli_state_dir(char *buf, size_t n);
/* Write / remove <state dir>/<job>.endpoints (the local job's etcd endpoints). */
int cli_state_write(const char *job, const char *endpoints);
void cli_state_remove(const char *job);

/* Connect to the job's etcd (resolving the endpoints as above). Prints why on failure. */
int cli_connect(const cli_common *co, const char *job, edl_etcd **out);

/* Read the spec (EDL_ENOTFOUND when the job does not exist); *mod: its mod_revision. */
int cli_read_spec(edl_etcd *c, const char *prefix, const char *job, edl_job_spec *spec,
                  int64_t *mod);
/* Change the spec with a compare on its mod_revision, retrying on races. */
typedef void (*cli_spec_edit)(edl_job_spec *spec, void *arg);
int cli_update_spec(edl_etcd *c, const char *prefix, const char *job, cli_spec_edit edit,
                    void *arg, edl_job_spec *before, edl_job_spec *after);

int cli_run(int argc, char **argv);
int cli_scale(int argc, char **argv);
int cli_status(int argc, char **argv);
int cli_stop(int argc, char **argv);

#endif

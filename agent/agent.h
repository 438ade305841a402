/* agent.h: the parts of edl-agent and how they share its state. Internal to agent/.
 *
 *   main.c         command line, defaults, exit codes
 *   agent.c        start-up, the poll() loop, reacting to generations (the state machine)
 *   registry.c     etcd side: lease, pod and status keys, the watch on the published generation,
 *                  every request run off the loop by the agent's etcd worker (edl/work.h)
 *   trainer_proc.c the trainer process: spawn, stop with grace, reap, progress and control pipes
 *   stderr_relay.c its stderr lines and the agent's log lines written off the loop
 *   env.c          the environment a trainer gets
 *   error_file.c   TORCHELASTIC_ERROR_FILE: the trainer's error, read back after a failure
 *   metrics.c      /metrics and /healthz
 *   teacher.c      --role teacher: the inference server's lifecycle and its service key
 *   health.c       a teacher's health check: one HTTP GET at a time (libcurl multi) */
#ifndef EDL_AGENT_H
#define EDL_AGENT_H

#include <curl/curl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "edl/agent_link.h"
#include "edl/etcd.h"
#include "edl/job.h"
#include "edl/loop.h"
#include "edl/metrics.h"
#include "edl/proc.h"
#include "edl/work.h"

/* Exit codes: EDL_EXIT_* of edl/job.h (documented in --help and docs/agent.md); 128 + N when
 * the agent left gracefully on signal N. */

typedef struct agent_opts {
    edl_etcd_config etcd; /* endpoints, TLS and auth: flags, else EDL_ETCD_* (checked) */
    char *job, *pod, *prefix, *addr, *role, *host;
    int64_t ttl_s;        /* 0: the spec's */
    int port, metrics_port; /* metrics_port 0: off; EDL_METRICS_PORT_AUTO */
    char *metrics_addr;   /* listen address of /metrics (NULL: 0.0.0.0) */
    char *scratch_dir;    /* where the agent makes its own directory (NULL: $TMPDIR, /tmp) */
    int64_t grace_ms;
    int64_t startup_timeout_ms;
    char **argv;          /* the trainer command, NULL-terminated */
    /* --role teacher (NULL / 0 otherwise; main.c fills the defaults) */
    char *service, *health_path, *model, *model_version;
    int capacity, health_failures;
    int64_t health_interval_ms, health_timeout_ms;
} agent_opts;

/* ---- env.c ---------------------------------------------------------------------------- */

typedef struct agent_env_input {
    const char *job, *pod, *prefix, *role;
    const edl_etcd_config *etcd; /* passed on as EDL_ETCD_ENDPOINTS and the TLS/auth names */
    const edl_job_spec *spec;
    const edl_generation *generation; /* the generation the trainer starts for */
    int rank;                   /* this pod's rank in it: in members, or for role "ps" in
                                 * servers; -1: a worker started ahead of membership (no rank,
                                 * no world, EDL_GENERATION=0: its first control line assigns
                                 * them) */
    int master_port;            /* the generation's MASTER_PORT (registry_master_port) */
    const char *error_file;     /* TORCHELASTIC_ERROR_FILE (NULL: none) */
    int control_fd, progress_fd;
} agent_env_input;

/* The trainer's environment: `base` (NULL-terminated, e.g. environ) without the names the agent
 * sets, then the agent's names (a worker's, or with role "ps" a parameter server's).
 * NULL-terminated, malloc'ed; free with edl_env_free(). EDL_EINVAL: rank is not in the list. */
int agent_env_build(const agent_env_input *in, char *const *base, char ***out);
/* Whether a --role names the parameter-server role. */
bool agent_role_is_ps(const char *role);
/* A teacher's environment (no generation, no rank): `base` without the names the agent sets,
 * then EDL_ROLE_NAME=teacher, EDL_SERVICE, PORT and EDL_SERVICE_PORT (port), POD_IP (addr),
 * EDL_POD_ID, EDL_JOB_ID (job may be NULL), EDL_ETCD_PREFIX and the etcd settings. */
typedef struct agent_teacher_env {
    const char *job, *pod, *prefix, *service, *addr;
    int port;
    const edl_etcd_config *etcd;
} agent_teacher_env;
int agent_env_build_teacher(const agent_teacher_env *in, char *const *base, char ***out);
/* This rank's assignment in a generation: what its control line says. */
int agent_assignment(const edl_generation *g, int rank, int master_port, edl_assignment *out);

/* The fds a trainer finds its pipes at (also in EDL_CONTROL_FD / EDL_PROGRESS_FD). */
#define AGENT_CONTROL_FD 3
#define AGENT_PROGRESS_FD 4

/* ---- trainer_proc.c ------------------------------------------------------------------- */

#define TRAINER_TAIL_LINES 3 /* stderr lines a failure's status message quotes */

/* stderr_relay.c: what the agent writes to its stderr (the trainer's stderr lines, its own log
 * lines) written off the loop, on a worker thread of its own, in order; at most
 * STDERR_RELAY_MAX bytes of the trainer's wait (then the loop stops reading the trainer's pipe
 * until they are written). */
#define STDERR_RELAY_MAX (1 << 20)
typedef struct stderr_relay {
    edl_worker *wk;        /* NULL: not open (puts write straight to fd) */
    pthread_mutex_t mu;    /* puts come from any thread (log lines): guards what follows */
    edl_bytebuf waiting;   /* bytes not yet handed to the worker */
    bool writing;          /* a batch is on the worker */
    unsigned long dropped; /* log lines dropped since the last note of it */
    int fd;                /* where they go: the agent's stderr */
} stderr_relay;

/* Open r (zeroed) on loop l, writing to fd. EDL_ENOMEM, EDL_EIO. */
int stderr_relay_open(stderr_relay *r, edl_loop *l, int fd);
/* Queue the trainer's bytes (never blocks once open; not open: written to fd at once; r NULL:
 * written to the agent's stderr at once). */
void stderr_relay_put(stderr_relay *r, const char *data, size_t len);
/* An edl_log_set_sink sink (arg: the relay): a log line, dropped (and counted) once twice
 * STDERR_RELAY_MAX bytes wait. */
void stderr_relay_log(const char *line, size_t len, void *arg);
/* Whether STDERR_RELAY_MAX bytes or more wait: read no more of the trainer's pipe for now. */
bool stderr_relay_full(stderr_relay *r);
/* Write what waits (blocking), stop the worker. Unset the log sink first. */
void stderr_relay_close(stderr_relay *r);

typedef struct trainer_proc {
    pid_t pid;              /* 0: none */
    int progress_fd;        /* our read end (-1: none) */
    int control_fd;         /* our write end (-1: none) */
    char *ctl_buf;          /* control bytes not yet written */
    size_t ctl_len;
    char line[256];         /* partial progress line */
    size_t line_len;
    bool line_skip;         /* dropping an overlong line up to its newline */
    bool stopping;          /* the agent asked it to stop (or to leave at its next commit) */
    int64_t term_at_ms;     /* SIGTERM time of a trainer asked to leave (0: none due) */
    int64_t kill_at_ms;     /* SIGKILL time while stopping (0: none yet / done) */
    int64_t step;           /* latest progress step (-1: none) */
    int64_t total;          /* the step its training ends at, as it said (0: not said) */
    int64_t blocked_since_ms; /* monotonic: when the collective it waits in began (0: none) */
    char blocked_what[EDL_PROGRESS_WHAT_MAX + 1];
    bool ready;             /* started ahead of membership, it said "ready" */
    bool graceful;          /* it said "graceful": it leaves at its next commit when told */
    bool inprocess;         /* it said "inprocess": it re-forms in process */
    int stderr_fd;          /* our read end of its stderr (-1: it writes to ours directly) */
    stderr_relay *relay;    /* passes its stderr lines on (NULL: written here, blocking) */
    char err_line[512];     /* a partial stderr line, passed on when complete (or full) */
    size_t err_line_len;
    char err_tail[TRAINER_TAIL_LINES][240]; /* its last stderr lines (a ring; kept after it
                                             * ended, until the next spawn) */
    unsigned err_tail_next; /* lines taken so far */
    /* for /metrics, kept across trainers (only trainer_init clears them) */
    int64_t steps_total;        /* forward steps seen: what rate() turns into steps per second */
    int64_t last_step_wall_ms;  /* when the step last changed (0: never) */
    int64_t first_step_wall_ms; /* when the current trainer reported its first step */
    unsigned first_steps;       /* first steps seen: one per trainer that stepped */
    edl_prom_hist ckpt_seconds[2]; /* checkpoints the trainers reported: [0] saves, [1] loads */
    int64_t ckpt_bytes[2];         /* and their bytes */
    int64_t distill_in_flight;     /* a student's batches in flight, as last reported (-1: no
                                      trainer of this agent reported any) */
    int64_t distill_retried;       /* its retries: the sum over its trainers */
    int64_t distill_retried_seen;  /* the current trainer's count, as last reported */
} trainer_proc;

void trainer_init(trainer_proc *t);
/* Create the pipes: the agent keeps its ends in t, the child's ends come back (close-on-exec;
 * trainer_spawn moves them to AGENT_CONTROL_FD and AGENT_PROGRESS_FD in the child). With
 * child_err (may be NULL) also one for its stderr, which the agent passes on line by line to
 * its own and keeps the last lines of (trainer_stderr_tail). */
int trainer_pipes(trainer_proc *t, int *child_control, int *child_progress, int *child_err);
/* Start argv with envp in its own process group (edl_spawn); closes the child's pipe ends
 * here (child_err -1: none). On failure err says why, for people ("/no/such: No such file or
 * directory"). */
int trainer_spawn(trainer_proc *t, char *const *argv, char *const *envp, int child_control,
                  int child_progress, int child_err, char *err, size_t errlen);
/* Pass on what the trainer wrote to its stderr (whole lines), keeping the last lines; while
 * its relay is full, nothing more (all: everything, the relay full or not). */
void trainer_read_stderr(trainer_proc *t, bool all);
/* The last stderr lines of the trainer (the running one, else the last one): "<last> (after:
 * <earlier> | <earlier>)" ("" : none). */
void trainer_stderr_tail(const trainer_proc *t, char *out, size_t len);
/* SIGTERM to its process group; SIGKILL after grace_ms (see trainer_tick). */
void trainer_stop(trainer_proc *t, int64_t grace_ms);
/* Ask a graceful trainer to leave at its next commit (line: the leave control line): SIGTERM
 * only after grace_ms, SIGKILL TRAINER_LEAVE_KILL_MS later. EDL_ECLOSED when the control pipe is
 * gone (stop it instead). */
#define TRAINER_LEAVE_KILL_MS 2000
int trainer_leave(trainer_proc *t, const char *line, int64_t grace_ms);
/* SIGKILL now. */
void trainer_kill(trainer_proc *t);
/* Send the SIGTERM of a leave and the SIGKILL when their times come; ms until the next is due
 * (-1: nothing due). */
int trainer_tick(trainer_proc *t);
/* Reap: 1 when the trainer ended (its wait status, and whether the agent had asked it to stop;
 * fds closed, state reset), else 0. */
int trainer_reap(trainer_proc *t, int *wstatus, bool *by_agent);
/* Read progress lines: 1 when the step or the wait in a collective changed. */
int trainer_read_progress(trainer_proc *t);
/* Take n bytes of the progress pipe: each complete line (edl_progress_line) updates the step
 * or the wait; a partial line is kept for the next bytes. 1 when something changed. The pure
 * part of trainer_read_progress. */
int trainer_progress_feed(trainer_proc *t, const char *buf, size_t n);
/* Queue a control line and write what the pipe takes now. */
int trainer_send_control(trainer_proc *t, const char *line);
void trainer_flush_control(trainer_proc *t);
bool trainer_running(const trainer_proc *t);

/* ---- health.c --------------------------------------------------------------------------- */

/* One HTTP GET at a time through libcurl's multi interface, driven by the agent's poll(): start,
 * then step on every turn of the loop (with the revents of health's pollfd), until it answers
 * 1 (a 2xx reply) or -1 (refused, reset, non-2xx, timed out). IPv4 or IPv6 addresses. */
typedef struct health_probe {
    CURLM *multi;          /* made by the first start, kept */
    CURL *easy;            /* the GET in flight; NULL: none */
    struct curl_slist *headers;
    int fd;                /* the socket libcurl wants watched; -1: none now */
    short events;          /* POLLIN / POLLOUT */
    int64_t timer_at_ms;   /* when libcurl wants its timeout action (0: no wish) */
    char buf[8192];        /* the reply's body (what fits) */
    size_t len;
    int64_t deadline_ms;   /* monotonic: the check's end */
} health_probe;

void health_init(health_probe *h);
/* 0, or EDL_EINVAL / EDL_ENOMEM. */
int health_start(health_probe *h, const char *addr, int port, const char *path,
                 int64_t timeout_ms);
bool health_busy(const health_probe *h);
void health_poll_fd(const health_probe *h, struct pollfd *p);
/* When the loop must wake for it (monotonic ms; 0: no wish). */
int64_t health_due(const health_probe *h);
/* 0: in progress; 1: 2xx (*load: the reply's numeric "load" when it has one, else 0); -1. */
int health_step(health_probe *h, short revents, double *load);
/* Ends the GET in flight; health_free also gives the multi handle back. */
void health_close(health_probe *h);
void health_free(health_probe *h);

/* ---- teacher.c -------------------------------------------------------------------------- */

typedef struct teacher_state {
    health_probe probe;
    int64_t next_check_ms;   /* next health check (0: none scheduled) */
    int fails;               /* failed checks in a row */
    bool healthy;            /* the last check passed (and fails < N since) */
    double load;             /* from the last good check */
    bool registered;         /* our key is in etcd */
    int64_t reg_lease;       /* ... under this lease */
    double reg_load;         /* ... with this load */
    bool busy;               /* a request about the record is on its way (registry_call) */
    bool leave_sent;         /* leaving: the record's deletion was asked for */
    int64_t restart_at_ms;   /* start the server then (0: none due) */
    int64_t backoff_ms;      /* the next restart's delay */
    int64_t healthy_since_ms; /* when it last became healthy (a long healthy run resets the
                               * backoff) */
} teacher_state;

/* ---- the agent ------------------------------------------------------------------------ */

typedef struct agent_metrics {
    int64_t etcd_errors, lease_losses;
    edl_prom_hist reformation; /* seconds from a generation's publication to its first step */
    unsigned first_steps_seen; /* tp.first_steps already observed */
} agent_metrics;

typedef struct agent {
    agent_opts *o;
    edl_etcd *etcd;           /* the worker's connection: every request, off the loop (the
                               * loop never calls etcd); start-up's wait for the spec uses it
                               * before the first work is queued */
    edl_worker *worker;       /* runs them (edl/work.h); the loop completes them */
    edl_job_keys keys;
    char *k_pod, *k_status;   /* this pod's two keys */
    edl_job_spec spec;
    int64_t ttl_s;
    char host[256];

    /* registration (registry.c) */
    edl_lease_keeper *keeper; /* NULL: not registered */
    int64_t lease;
    int64_t reg_next_ms;      /* next registration attempt (0: none due) */
    int64_t reg_backoff_ms;
    int reg_attempt;
    bool reg_busy;            /* a registration is on its way */

    /* the published generation (registry.c) */
    edl_watch *watch;
    int64_t watch_rev;        /* events at or below this revision are already known */
    int64_t watch_next_ms;    /* when to (re)start a failed watch (0: none due) */
    bool watch_busy;          /* the generation being read and a watch opened */
    edl_generation generation;
    bool have_generation;

    /* status (registry.c) */
    edl_pod_status status;
    bool status_dirty;
    int64_t status_next_ms;   /* earliest next write (retry or step rate limit) */
    int64_t status_written_ms;
    int status_failures;
    bool status_busy;         /* a write is on its way */
    unsigned status_seq;      /* counts the statuses set */

    /* the trainer (agent.c + trainer_proc.c); with --role ps, the parameter server's process */
    bool ps;                  /* this pod's role is ps: it serves when listed in `servers` */
    bool teacher;             /* --role teacher (teacher.c): no generation, no rank */
    teacher_state t;
    trainer_proc tp;
    stderr_relay relay;       /* the trainer's stderr on its way to ours (tp.relay) */
    int64_t run_gen;          /* generation the running trainer serves (0: none) */
    bool ahead;               /* the running trainer was started ahead of membership (InProcess:
                               * it waits for its first control line) */
    bool ahead_failed;        /* one started ahead ended: none again, the ordinary start follows */
    int64_t ahead_since_ms;   /* monotonic: when the trainer started ahead was started */
    int64_t ahead_register_ms; /* monotonic: at start, the pod registers once its trainer started
                               * ahead says "ready", or by then (0: not waiting) */
    int run_rank;
    int64_t run_members_gen;  /* the members_generation the last trainer was started or
                               * re-formed for: a later generation with the same one changed
                               * only the servers, and keeps the trainer */
    int64_t noted_gen;        /* last generation a draining server's process was logged for */
    int64_t started_gen;      /* last generation a trainer was started for */
    int64_t starts;           /* trainer starts so far */
    int64_t master_gen;       /* the members_generation master_port belongs to (0: none) */
    int master_port;          /* its MASTER_PORT, picked by rank 0's agent */
    int64_t master_retry_ms;  /* when to look for it again (0: not waiting) */
    bool master_busy;         /* it is being published or read */
    int64_t spec_start, spec_gen; /* the start (a->starts + 1) and generation the spec was last
                               * read again for (agent.c, spec_read_for_start) */
    bool spec_busy;           /* that read is on its way */
    bool inprocess;           /* a trainer of this pod said "inprocess" (sticky: the pod runs
                               * one program); with the mode not given, the pod then re-forms
                               * in process (agent.c, in_process) */
    char error_dir[256];      /* private directory of TORCHELASTIC_ERROR_FILE ("" : none) */
    char error_file[300];

    agent_metrics m;
    edl_metrics_server *metrics;

    edl_loop *loop;           /* the one loop (agent.c): every fd and timer above is its */
    bool looping;             /* past start-up: signals are the loop's, not start-up's */
    int leaving_signal;       /* SIGTERM/SIGINT received: leave once the trainer is gone */
    int final_exit;           /* -1, or the exit code of a final job state */
} agent;

/* error_file.c: TORCHELASTIC_ERROR_FILE in a private directory of the agent's; read back (one
 * line, cut to len) after a failure: 0, or EDL_ENOTFOUND when the trainer left nothing. *own
 * (may be NULL): the file says the failure is the script's own ("edl_own_error": true). */
int agent_error_file_open(agent *a);
void agent_error_file_close(agent *a);
int agent_read_error_file(const char *path, char *out, size_t len, bool *own);
/* The pure part: the message in a file's contents buf[0..n) (buf[n] must be '\0'). */
int agent_error_message(const char *buf, size_t n, char *out, size_t len, bool *own);

/* registry.c: every request to etcd runs on a->worker; these only queue them (one of a kind
 * at a time) and their results change the agent when the loop completes them. */
/* The MASTER_PORT of the agent's current generation: rank 0's agent picks a free port on its
 * address and publishes gen/<n>/master, the others read it. 0 with a->master_port set;
 * EDL_EBUSY while it is being published or read (ask again: the answer wakes the loop). */
int registry_master_port(agent *a, int rank);
int registry_register(agent *a);        /* grant, put pod + status, start keeper */
void registry_lease_lost(agent *a);     /* drop the keeper, schedule re-registration */
void registry_unregister(agent *a);     /* stop the keeper and revoke (leaving) */
int registry_watch_open(agent *a);     /* read the generation, watch from the next revision */
void registry_watch_events(agent *a);
void registry_status_set(agent *a, const edl_pod_status *s);
void registry_status_flush(agent *a);   /* write if dirty and due */
/* Run call(the worker's connection, arg) on the worker, then done(a, arg, its result, the
 * connection's message) on the loop; done owns arg. EDL_ENOMEM: nothing queued. */
int registry_call(agent *a, int (*call)(edl_etcd *etcd, void *arg),
                  void (*done)(agent *a, void *arg, int rc, const char *err), void *arg);
/* Before leaving: true once the newest status was given its one write (queued before the
 * revocation that follows); false while a write of an older one is still on its way. */
bool registry_status_last(agent *a);

/* install.c: `edl-agent --install DIR`: copy this binary to DIR/edl-agent; an exit code. */
int agent_install(const char *dir);

/* agent.c */
int agent_run(agent_opts *o);
void agent_reconcile(agent *a);
/* This incarnation of the pod (name and current lease) in a running generation, or NULL: whether
 * the pod is a member now, and at which rank. */
const edl_member *agent_member(const agent *a);
/* For a ps pod: this incarnation among the servers of the generation (running or waiting: a
 * server serves while the workers wait), or NULL. */
const edl_member *agent_server(const agent *a);

/* teacher.c: the teacher role. */
void teacher_init(agent *a);
void teacher_reconcile(agent *a);       /* start, check, (de)register: after every wake-up */
void teacher_on_exit(agent *a, int wstatus, bool by_agent);
void teacher_deregister(agent *a);      /* delete the service key (when it is there) */
/* Leaving: the record's deletion asked for once; true when it is answered (the server may stop
 * then: students stop asking it first). */
bool teacher_leave_ready(agent *a);
int64_t teacher_due(const agent *a);   /* its next timer, monotonic ms (0: none) */
/* The health check's fd (-1: none) and the EDL_LOOP_* events it waits for. */
int teacher_fd(const agent *a, int *events);
void teacher_on_poll(agent *a, int events); /* EDL_LOOP_* ready (0: a timer is due) */

/* metrics.c: writes the agent's /metrics (an edl_metrics_fn; arg is the agent). */
void agent_metrics_write(void *arg, edl_prom *out);
/* After the trainer's progress changed: a first step of the current generation's trainer
 * observes the re-formation time. */
void agent_metrics_progress(agent *a);

#endif

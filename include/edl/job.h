/* edl/job.h: the job model that the agent, the job server, the `edl` command and the
 * collective library share (they meet only through etcd, in these documents):
 *
 *   keys        every etcd key of a job, built and recognised in one place (edl_job_keys);
 *   spec        what the job should be (edl_job_spec), written by the launcher or operator;
 *   pod         one agent's registration (edl_pod), under the agent's lease;
 *   pod status  the state of that pod's trainer process (edl_pod_status), under the same lease;
 *   generation  the membership the job server published (edl_generation): number, members
 *               with their ranks, standbys, failures, the job's state;
 *   ranks       the rank assignment rule (edl_assign_ranks);
 *   exit codes  what every edl program exits with, and a job's final state as one of them.
 *
 * Parsers never trust their input: wrong types, out-of-range numbers, unknown enum names and
 * oversized documents give EDL_EPROTO (EDL_ECONFIG for values that make no sense, EDL_ETOOBIG
 * for sizes) with a message in `err`, and leave the output untouched. Everything here is pure
 * (no etcd calls), so the job server's decisions and the parsers are tested without a server.
 * The trainer's side of the agent protocol has its own header, edl/agent_link.h. */
#ifndef EDL_JOB_H
#define EDL_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "edl/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EDL_DEFAULT_PREFIX "/edl/v1"
#define EDL_NAME_MAX 128          /* job and pod names */
#define EDL_DOC_MAX (1 << 20)     /* largest JSON document accepted from etcd */
#define EDL_MEMBERS_MAX 100000    /* largest membership a generation may list */
#define EDL_GENERATION_MAX (INT64_C(1) << 52) /* highest generation number a document may hold */
#define EDL_RESTARTS_MAX 1000000  /* most restarts a job counts, and failures one pod counts */
#define EDL_HOLD_MARGIN_MS 1000   /* a failure waits for a silent peer its lease TTL + this */
#define EDL_PS_SERVERS_MAX 1024   /* most parameter servers a job may have (spec ps.max) */
#define EDL_TEACHERS_MAX 1024     /* most teachers a job may have (spec teachers.max) */
#define EDL_TEACHER_SERVICE_MAX EDL_DNS_LABEL_MAX /* a teachers' service name: a DNS label */

/* Job and pod names: 1..128 of [A-Za-z0-9._-], not starting with '.' or '-'. Kubernetes pod
 * names (DNS subdomains) always qualify. */
bool edl_name_valid(const char *name);

/* ---- keys ------------------------------------------------------------------------------- */

/* The keys of one job, all under "<prefix>/jobs/<job>/" (prefix default "/edl/v1"):
 *   spec              edl_job_spec     launcher / operator, no lease
 *   pods/<pod>        edl_pod          agent, under the agent's lease
 *   status/<pod>      edl_pod_status   agent, under the agent's lease
 *   leader            job server id    election key, the leader's lease
 *   generation        edl_generation   the leading job server, fenced txn
 *   gen/<n>/<name>    rendezvous data of generation n (trainers' libraries); deleted with it
 *   checkpoint        the checkpoint pointer (edl/checkpoint.h) */
typedef struct edl_job_keys {
    char *job;        /* "<prefix>/jobs/<job>/": the job's whole key space */
    char *spec;
    char *pods;       /* "…/pods/": prefix of every registration */
    char *status;     /* "…/status/": prefix of every trainer status */
    char *leader;
    char *generation;
    char *gens;       /* "…/gen/": prefix of every generation's rendezvous data */
    char *checkpoint;
} edl_job_keys;

/* Names under gen/<n>/: */
#define EDL_GEN_DEAD "dead"       /* the trainers declared generation n dead */
#define EDL_GEN_CPU "cpu/"        /* cpu/<rank>: a rank's collective endpoint */
#define EDL_GEN_NCCL_ID "nccl-id" /* the NCCL unique id of generation n */
#define EDL_GEN_MASTER "master"   /* MASTER_PORT of generation n, picked by rank 0's agent */
#define EDL_GEN_ALIVE "alive/"    /* alive/<rank>: that rank saw its group break and lives on */

/* The one rule for a key prefix (--prefix of every program, EDL_ETCD_PREFIX): an etcd key path,
 * so it starts with '/' (and holds no newline: it is printed and passed in environments). */
#define EDL_PREFIX_RULE "must start with '/'"
bool edl_prefix_valid(const char *prefix);
/* Build every key (prefix NULL: EDL_DEFAULT_PREFIX; trailing slashes are dropped). EDL_EINVAL
 * for an invalid job name or prefix (edl_prefix_valid), EDL_ENOMEM. */
int edl_job_keys_init(edl_job_keys *k, const char *prefix, const char *job);
void edl_job_keys_clear(edl_job_keys *k);
/* pods/<pod>, status/<pod> and gen/<n>/<name> (name "": the generation's prefix "gen/<n>/");
 * malloc'ed, NULL when out of memory. */
char *edl_job_key_pod(const edl_job_keys *k, const char *pod);
char *edl_job_key_status(const edl_job_keys *k, const char *pod);
char *edl_job_key_gen(const edl_job_keys *k, int64_t gen, const char *name);

typedef enum edl_job_key_kind {
    EDL_KEY_OTHER = 0, /* not a key of this job, or none of the kinds below */
    EDL_KEY_SPEC,
    EDL_KEY_POD,        /* name: the pod */
    EDL_KEY_STATUS,     /* name: the pod */
    EDL_KEY_LEADER,
    EDL_KEY_GENERATION,
    EDL_KEY_GEN,        /* gen: n, name: what follows "gen/<n>/" */
    EDL_KEY_CHECKPOINT,
} edl_job_key_kind;

typedef struct edl_job_key_info {
    edl_job_key_kind kind;
    const char *name; /* points into the key; not NUL-terminated */
    size_t name_len;
    int64_t gen;
} edl_job_key_info;

/* What a key read from etcd is. A pod name is returned as it is (check it with
 * edl_name_valid); a generation number must be canonical decimal up to EDL_GENERATION_MAX. */
edl_job_key_kind edl_job_key_parse(const edl_job_keys *k, const char *key, size_t len,
                                   edl_job_key_info *out);
/* True when info names this entry of generation n's rendezvous data. */
bool edl_job_key_is_gen(const edl_job_key_info *info, int64_t gen, const char *name);
/* True when info names a per-rank entry "<prefix><rank>" of generation n (prefix: EDL_GEN_CPU,
 * EDL_GEN_ALIVE), the rank a canonical decimal below 2^31 in *rank. */
bool edl_job_key_gen_rank(const edl_job_key_info *info, int64_t gen, const char *prefix,
                          int *rank);

/* ---- spec ------------------------------------------------------------------------------- */

typedef enum edl_restart_policy {
    EDL_RESTART_ON_FAILURE = 0, /* every non-zero exit restarts the generation (default) */
    EDL_RESTART_EXIT_CODE,      /* permanent codes fail the job at once, others restart */
    EDL_RESTART_NEVER,          /* the first failure fails the job */
} edl_restart_policy;

typedef enum edl_elastic_mode {
    EDL_MODE_RESTART = 0, /* the agent restarts trainers on every membership change */
    EDL_MODE_INPROCESS,   /* running trainers keep running and re-form (rank on fd 3) */
    EDL_MODE_AUTO,        /* not given (the default): the trainer's choice: in process once
                           * it says "inprocess" on its progress pipe (edl.torch does), else
                           * restart (docs/elastic.md, "The mode follows the trainer") */
} edl_elastic_mode;

typedef struct edl_job_spec {
    int min;                    /* fewest members that may train (1) */
    int max;                    /* most members; further pods wait as standbys (min) */
    int replicas;               /* pods the launcher/operator keeps running (-1: max) */
    int64_t settle_ms;          /* joins within this window form one generation (1000) */
    int max_restarts;           /* restart budget of the whole job (10; <= EDL_RESTARTS_MAX) */
    edl_restart_policy restart_policy;
    uint8_t permanent_codes[32]; /* bit i: exit code i is permanent (EXIT_CODE policy); 1-127 */
    int exclude_after;          /* failures of one pod before it is excluded (2) */
    int64_t cooldown_ms;        /* first exclusion; doubles with each further failure (10 s) */
    int64_t cooldown_max_ms;    /* cap of the exclusion (5 min) */
    int64_t progress_timeout_ms; /* a rank whose step stalls this long while others advance
                                  * is treated as failed (0: off) */
    int64_t ttl_s;              /* agents' lease TTL unless the agent is told otherwise (10) */
    edl_elastic_mode mode;      /* EDL_MODE_AUTO unless given ("elastic_mode") */
    char *checkpoint_uri;       /* passed to trainers as EDL_CHECKPOINT_URI (may be NULL) */
    bool stopped;               /* `edl stop`: trainers stop and the job ends as stopped */
    bool fail_fast;             /* the script's own error fails the job at once (true); false:
                                   it spends restarts like any failure ("fail_fast") */
    /* The parameter-server role, JSON "ps": {"min":..,"max":..,"replicas":..}; absent: no
     * servers (ps_max 0). When present 1 <= ps_min <= ps_max <= EDL_PS_SERVERS_MAX. */
    int ps_min;                 /* fewest servers the job trains with (0: no ps role) */
    int ps_max;                 /* most servers; further ps pods wait as standbys */
    int ps_replicas;            /* ps pods the launcher/operator keeps running (-1: ps_max) */
    /* The teacher role (distillation, docs/distill.md), JSON "teachers": {"min":..,"max":..,
     * "replicas":..,"service":".."}; absent: no teachers (teachers_max 0). When present
     * 1 <= teachers_min <= teachers_max <= EDL_TEACHERS_MAX and a service name (a DNS label)
     * is given. Teachers are no members: the job server ignores them; only the launcher and
     * the operator read these, to keep that many teacher pods running. */
    int teachers_min;           /* fewest teacher pods (0: no teacher role) */
    int teachers_max;           /* most teacher pods (the bound of `edl scale --role teacher`) */
    int teachers_replicas;      /* teacher pods kept running (-1: teachers_max) */
    char teachers_service[EDL_TEACHER_SERVICE_MAX + 1]; /* where they register ("" : none) */
} edl_job_spec;

void edl_spec_init(edl_job_spec *s);  /* the defaults above */
void edl_spec_clear(edl_job_spec *s); /* frees what it owns and sets the defaults again */
/* A deep copy into an initialised *dst (whose old contents are freed). */
int edl_spec_copy(edl_job_spec *dst, const edl_job_spec *src);
/* Parse and validate (absent fields keep their defaults). EDL_EPROTO for malformed JSON or a
 * wrong type, EDL_ECONFIG for values that make no sense (min > max, negative TTL, ...). */
int edl_spec_parse(const char *json, size_t len, edl_job_spec *out, char *err, size_t errlen);
int edl_spec_validate(const edl_job_spec *s, char *err, size_t errlen);
/* JSON text (malloc'ed) or NULL when out of memory. */
char *edl_spec_to_json(const edl_job_spec *s);
/* The pods the launcher or operator keeps running: replicas, or max when replicas is -1. */
int edl_spec_desired_pods(const edl_job_spec *s);
/* The ps pods the launcher or operator keeps running: ps_replicas, or ps_max when it is -1
 * (0 for a job without the ps role). */
int edl_spec_desired_servers(const edl_job_spec *s);
/* The teacher pods the launcher or operator keeps running: teachers_replicas, or teachers_max
 * when it is -1 (0 for a job without the teacher role). */
int edl_spec_desired_teachers(const edl_job_spec *s);
/* Whether s is a valid teachers' service name: 1..63 of [a-z0-9-], not starting or ending
 * with '-' (a DNS label, as edl/discovery.h's names). */
bool edl_teacher_service_valid(const char *s);
/* Names of the enums, as the spec's JSON and the `edl run` flags spell them. */
const char *edl_restart_policy_name(edl_restart_policy p);
int edl_restart_policy_parse(const char *s, edl_restart_policy *out); /* EDL_ECONFIG: unknown */
const char *edl_elastic_mode_name(edl_elastic_mode m);
int edl_elastic_mode_parse(const char *s, edl_elastic_mode *out);
/* Parse "1-127,130,200-255" into a code bitmap. */
int edl_exit_codes_parse(const char *s, uint8_t bits[32]);
static inline bool edl_exit_code_in(const uint8_t bits[32], int code)
{
    return code >= 0 && code < 256 && (bits[code / 8] >> (code % 8)) & 1;
}

/* ---- pods ------------------------------------------------------------------------------- */

/* Pod roles: a worker trains (ranks in members), a ps pod serves parameters (ranks in
 * servers), a teacher serves predictions to the students (the job's workers) through a service
 * (edl/discovery.h): no member, no rank; the job server ignores it. */
#define EDL_ROLE_WORKER "worker"
#define EDL_ROLE_PS "ps"
#define EDL_ROLE_TEACHER "teacher"

typedef struct edl_pod {
    char *name;              /* from the key */
    char *role;              /* "worker" (or NULL), "ps" or "teacher" (EDL_ROLE_*); teachers
                              * and unknown roles take no part in the membership */
    char *addr;              /* where peers reach this pod's trainer */
    int port;                /* the trainer's port (rank 0's is MASTER_PORT) */
    int metrics_port;        /* the agent's /metrics (0: none) */
    int gpus;
    char *host;
    int64_t pid;             /* the agent's pid */
    int64_t ttl_s;           /* its lease's TTL: how long it may be silent (0: unknown) */
    int64_t lease;           /* from the key-value, not the JSON */
    int64_t create_revision; /* join order */
} edl_pod;

void edl_pod_clear(edl_pod *p); /* frees what it owns; leaves it zeroed */
/* Parse into *out, keeping out->name, lease and create_revision (they come from the key). */
int edl_pod_parse(const char *json, size_t len, edl_pod *out, char *err, size_t errlen);
char *edl_pod_to_json(const edl_pod *p);

/* ---- trainer status ---------------------------------------------------------------------- */

typedef enum edl_trainer_state {
    EDL_TRAINER_WAITING = 0, /* not in the generation, or the job is waiting */
    EDL_TRAINER_RUNNING,
    EDL_TRAINER_EXITED,      /* exited by itself: exit_code */
    EDL_TRAINER_SIGNALED,    /* killed by a signal the agent did not send: signal */
    EDL_TRAINER_STOPPED,     /* stopped by the agent (generation change, leave) */
    EDL_TRAINER_HUNG,        /* blocked in a collective past the spec's progress timeout */
} edl_trainer_state;

/* The longest message a status carries (what the trainer's error file said, why it hung). */
#define EDL_STATUS_MESSAGE_MAX 1024

typedef struct edl_pod_status {
    int64_t generation;
    edl_trainer_state state;
    int exit_code;
    int signal;
    int64_t pid;       /* the trainer's pid while running */
    int64_t step;      /* last progress the trainer reported (-1: never) */
    int64_t restarts;  /* trainer starts by this agent so far, minus one */
    int64_t total_steps; /* the step the trainer said its training ends at (0: not said);
                          * JSON "total_steps" */
    char message[EDL_STATUS_MESSAGE_MAX]; /* "" or: the trainer's error, or why it hung */
    bool own_error;    /* exited: the trainer said the failure is its own (an exception in the
                        * script, not a peer's loss: edl.torch marks its error file so), and
                        * restarting would repeat it; JSON "own_error" */
    bool inprocess;    /* the pod's trainer said it re-forms in process (edl.torch does): in a
                        * job whose elastic mode is not given, the pod is then in process;
                        * JSON "inprocess" */
} edl_pod_status;

const char *edl_trainer_state_name(edl_trainer_state s);
/* A trainer's failure in words ("exited with code 3", "was killed by signal 9", "hung") into
 * buf; false when the status is no failure (starting, running, stopped, exited 0). */
bool edl_trainer_failure(const edl_pod_status *s, char *buf, size_t len);
int edl_pod_status_parse(const char *json, size_t len, edl_pod_status *out, char *err,
                         size_t errlen);
char *edl_pod_status_to_json(const edl_pod_status *s);

/* ---- generation ---------------------------------------------------------------------------- */

typedef enum edl_job_state {
    EDL_JOB_WAITING = 0, /* fewer than min members: nobody trains */
    EDL_JOB_RUNNING,
    EDL_JOB_SUCCEEDED,   /* every rank of the generation exited 0 */
    EDL_JOB_FAILED,      /* restart budget spent, a permanent exit code, or policy Never */
    EDL_JOB_STOPPED,     /* stopped on request */
} edl_job_state;

const char *edl_job_state_name(edl_job_state s);
static inline bool edl_job_state_final(edl_job_state s)
{
    return s == EDL_JOB_SUCCEEDED || s == EDL_JOB_FAILED || s == EDL_JOB_STOPPED;
}

typedef struct edl_member {
    char *pod;
    int rank;
    char *addr;
    int port;
    int64_t lease;       /* identifies this incarnation of the pod */
} edl_member;

typedef struct edl_pod_failures {
    char *pod;
    int count;               /* failures so far */
    int64_t excluded_until;  /* wall clock, ms since the epoch (0: not excluded) */
} edl_pod_failures;

/* The published generation, with the job's state (they change together, in one txn). */
typedef struct edl_generation {
    int64_t generation;      /* 1, 2, ...; 0 = none published yet */
    int64_t members_generation; /* the generation these members (workers, their ranks and the
                              * restart count) were formed in: a generation that changed only
                              * the servers keeps it, and with it the workers' trainers, their
                              * EDL_GENERATION and their rendezvous gen/<it>/ (JSON
                              * "members_generation", absent when equal; 0 here means equal:
                              * read it with edl_generation_of_members) */
    edl_job_state state;
    char *reason;            /* why the last generation or state change happened */
    edl_member *members;     /* workers, sorted by rank, ranks 0..n-1 */
    size_t n_members;
    edl_member *servers;     /* parameter servers, sorted by rank 0..n-1 (JSON "servers") */
    size_t n_servers;
    char **standbys;         /* live workers beyond max, then ps pods beyond ps max, each in
                              * join order */
    size_t n_standbys;
    edl_pod_failures *failures;
    size_t n_failures;
    int restarts;            /* generations started because of a trainer failure */
    char *spec_error;        /* the spec in etcd is invalid (the last valid one is in force) */
    char *leader;            /* the job server that published this */
    int64_t published_ms;    /* wall clock */
    int64_t started_ms;      /* wall clock when this run of the job published its first
                              * generation, copied into every later one: names the run
                              * (EDL_RUN_ID; JSON "started_ms", absent: 0, a document of an
                              * older job server). A job run again (`edl run` anew, its etcd
                              * keys gone) is another run. */
} edl_generation;

void edl_generation_clear(edl_generation *g); /* frees what it owns; leaves it zeroed */
int edl_generation_parse(const char *json, size_t len, edl_generation *out, char *err,
                         size_t errlen);
char *edl_generation_to_json(const edl_generation *g);
/* The member that is this incarnation of the pod (same name and lease), or NULL. */
const edl_member *edl_generation_member(const edl_generation *g, const char *pod, int64_t lease);
/* The generation the members were formed in (members_generation, else generation). */
int64_t edl_generation_of_members(const edl_generation *g);
/* The server that is this incarnation of the pod (same name and lease), or NULL. */
const edl_member *edl_generation_server(const edl_generation *g, const char *pod, int64_t lease);
/* The member with this pod name, whatever its lease, or NULL. */
const edl_member *edl_generation_member_named(const edl_generation *g, const char *pod);
/* Deep copy of a member list (edl_members_free). */
int edl_members_copy(const edl_member *src, size_t n, edl_member **out);
void edl_members_free(edl_member *m, size_t n);

/* ---- ranks --------------------------------------------------------------------------------- */

/* Rank assignment (deterministic, minimal movement). `prev`: the last generation's members;
 * `cands`: the pods that may be members now, in join order (alive, not excluded); at most
 * `max` become members. Members of prev that are still candidates are chosen first, then
 * newcomers in join order; the rest are standbys. A member that stays keeps its rank when it
 * is < n; free ranks below n are filled by the members with the highest ranks >= n, then by
 * newcomers in join order. So rank 0 keeps its pod whenever that pod survives. A pod matches a
 * previous member only with the same name and lease (a re-registered pod is a newcomer). */
int edl_assign_ranks(const edl_member *prev, size_t n_prev, const edl_pod *cands, size_t n_cands,
                     int max, edl_member **members, size_t *n_members, char ***standbys,
                     size_t *n_standbys);

/* ---- exit codes ------------------------------------------------------------------------ */

/* What edl-agent, edl-jobserver and `edl` exit with (each documents it in --help); a program
 * that leaves on signal N exits 128+N. */
enum {
    EDL_EXIT_SUCCEEDED = 0,   /* the job succeeded, or the command did what it was asked */
    EDL_EXIT_FAILED = 1,      /* the job failed (for `edl status/scale/stop`: no such job) */
    EDL_EXIT_USAGE = 2,       /* bad arguments or configuration */
    EDL_EXIT_UNREACHABLE = 3, /* etcd could not be reached (or started) */
    EDL_EXIT_STOPPED = 4,     /* the job was stopped (edl stop) */
};

/* A job's state as an exit code: succeeded 0, stopped 4, failed (and any other state) 1. */
int edl_job_exit_code(edl_job_state s);

#ifdef __cplusplus
}
#endif
#endif

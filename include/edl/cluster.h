/* edl/cluster.h: the job model that agents, the job server, the `edl` command and (later) the
 * Kubernetes operator share: etcd key names, and the JSON documents stored under them (the
 * job's spec, a pod's registration, a pod's trainer status, the published generation), with
 * strict parsers, encoders and the rank assignment rule.
 *
 * Keys (prefix default "/edl/v1"):
 *   <prefix>/jobs/<job>/spec           edl_job_spec     launcher / operator, no lease
 *   <prefix>/jobs/<job>/pods/<pod>     edl_pod          agent, under the agent's lease
 *   <prefix>/jobs/<job>/status/<pod>   edl_pod_status   agent, under the agent's lease
 *   <prefix>/jobs/<job>/leader         job server id    election key, leader's lease
 *   <prefix>/jobs/<job>/cluster        edl_cluster      leading job server, fenced txn
 *   <prefix>/jobs/<job>/gen/<n>/...    rendezvous data  trainers' libraries
 *   <prefix>/jobs/<job>/checkpoint     checkpoint pointer
 *
 * Parsers never trust their input: wrong types, out-of-range numbers, unknown enum names and
 * oversized documents give EDL_EPROTO (or EDL_ECONFIG for a spec that parses but makes no
 * sense) with a message in `err`, and leave the output untouched. */
#ifndef EDL_CLUSTER_H
#define EDL_CLUSTER_H

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

/* Job and pod names: 1..128 of [A-Za-z0-9._-], not starting with '.' or '-'. Kubernetes pod
 * names (DNS subdomains) always qualify. */
bool edl_name_valid(const char *name);

/* "<prefix>/jobs/<job>/<rest>" (rest may be "" for the job's own prefix "…/<job>/"). malloc'ed;
 * NULL when out of memory. */
char *edl_job_key(const char *prefix, const char *job, const char *rest);

/* ---- spec ------------------------------------------------------------------------------- */

typedef enum edl_restart_policy {
    EDL_RESTART_ON_FAILURE = 0, /* every non-zero exit restarts the generation (default) */
    EDL_RESTART_EXIT_CODE,      /* permanent codes fail the job at once, others restart */
    EDL_RESTART_NEVER,          /* the first failure fails the job */
} edl_restart_policy;

typedef enum edl_elastic_mode {
    EDL_MODE_RESTART = 0, /* the agent restarts trainers on every membership change */
    EDL_MODE_INPROCESS,   /* running trainers keep running and re-form (rank on fd 3) */
} edl_elastic_mode;

typedef struct edl_job_spec {
    int min;                    /* fewest members that may train (1) */
    int max;                    /* most members; further pods wait as standbys (min) */
    int replicas;               /* pods the launcher/operator keeps running (-1: max) */
    int64_t settle_ms;          /* joins within this window form one generation (1000) */
    int max_restarts;           /* restart budget of the whole job (10) */
    edl_restart_policy restart_policy;
    uint8_t permanent_codes[32]; /* bit i: exit code i is permanent (EXIT_CODE policy); 1-127 */
    int exclude_after;          /* failures of one pod before it is excluded (2) */
    int64_t cooldown_ms;        /* first exclusion; doubles with each further failure (10 s) */
    int64_t cooldown_max_ms;    /* cap of the exclusion (5 min) */
    int64_t progress_timeout_ms; /* a rank whose step stalls this long while others advance
                                  * is treated as failed (0: off) */
    int64_t ttl_s;              /* agents' lease TTL unless the agent is told otherwise (10) */
    edl_elastic_mode mode;
    char *checkpoint_uri;       /* passed to trainers as EDL_CHECKPOINT_URI (may be NULL) */
    bool stopped;               /* `edl stop`: trainers stop and the job ends as stopped */
} edl_job_spec;

void edl_spec_init(edl_job_spec *s);
void edl_spec_free(edl_job_spec *s);
/* Parse and validate (absent fields keep their defaults). EDL_EPROTO for malformed JSON or a
 * wrong type, EDL_ECONFIG for values that make no sense (min > max, negative TTL, ...). */
int edl_spec_parse(const char *json, size_t len, edl_job_spec *out, char *err, size_t errlen);
int edl_spec_validate(const edl_job_spec *s, char *err, size_t errlen);
/* JSON text (malloc'ed) or NULL when out of memory. */
char *edl_spec_to_json(const edl_job_spec *s);
/* Parse "1-127,130,200-255" into a code bitmap. */
int edl_exit_codes_parse(const char *s, uint8_t bits[32]);
static inline bool edl_exit_code_in(const uint8_t bits[32], int code)
{
    return code >= 0 && code < 256 && (bits[code / 8] >> (code % 8)) & 1;
}

/* ---- pods ------------------------------------------------------------------------------- */

typedef struct edl_pod {
    char *name;              /* from the key */
    char *role;              /* "worker" (later "ps") */
    char *addr;              /* where peers reach this pod's trainer */
    int port;                /* the trainer's port (rank 0's is MASTER_PORT) */
    int metrics_port;        /* the agent's /metrics (0: none) */
    int gpus;
    char *host;
    int64_t pid;             /* the agent's pid */
    int64_t lease;           /* from the key-value, not the JSON */
    int64_t create_revision; /* join order */
} edl_pod;

void edl_pod_free(edl_pod *p); /* contents only */
int edl_pod_parse(const char *json, size_t len, edl_pod *out, char *err, size_t errlen);
char *edl_pod_to_json(const edl_pod *p);

/* ---- trainer status ---------------------------------------------------------------------- */

typedef enum edl_trainer_state {
    EDL_TRAINER_WAITING = 0, /* not in the generation, or the job is waiting */
    EDL_TRAINER_RUNNING,
    EDL_TRAINER_EXITED,      /* exited by itself: exit_code */
    EDL_TRAINER_SIGNALED,    /* killed by a signal the agent did not send: signal */
    EDL_TRAINER_STOPPED,     /* stopped by the agent (generation change, leave) */
    EDL_TRAINER_HUNG,        /* the agent saw no progress past the timeout (reserved) */
} edl_trainer_state;

typedef struct edl_pod_status {
    int64_t generation;
    edl_trainer_state state;
    int exit_code;
    int signal;
    int64_t pid;       /* the trainer's pid while running */
    int64_t step;      /* last progress the trainer reported (-1: never) */
    int64_t restarts;  /* trainer starts by this agent so far, minus one */
} edl_pod_status;

const char *edl_trainer_state_name(edl_trainer_state s);
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

typedef struct edl_cluster {
    int64_t generation;      /* 1, 2, ...; 0 = none published yet */
    edl_job_state state;
    char *reason;            /* why the last generation or state change happened */
    edl_member *members;     /* sorted by rank, ranks 0..n-1 */
    size_t n_members;
    char **standbys;         /* live pods beyond max, in join order */
    size_t n_standbys;
    edl_pod_failures *failures;
    size_t n_failures;
    int restarts;            /* generations started because of a trainer failure */
    char *spec_error;        /* the spec in etcd is invalid (the last valid one is in force) */
    char *leader;            /* the job server that published this */
    int64_t published_ms;    /* wall clock */
} edl_cluster;

void edl_cluster_free(edl_cluster *c); /* contents only; leaves it zeroed */
int edl_cluster_parse(const char *json, size_t len, edl_cluster *out, char *err, size_t errlen);
char *edl_cluster_to_json(const edl_cluster *c);
/* The member with this pod name, or NULL. */
const edl_member *edl_cluster_member(const edl_cluster *c, const char *pod);
/* Deep copy of a member list. */
int edl_members_copy(const edl_member *src, size_t n, edl_member **out);
void edl_members_free(edl_member *m, size_t n);

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

#ifdef __cplusplus
}
#endif
#endif

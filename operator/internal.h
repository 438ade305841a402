/* operator/internal.h: what the operator's files share: the operator (op), one job's memory
 * (op_job) and the per-job pass (pass.c). */
#ifndef EDL_OPERATOR_INTERNAL_H
#define EDL_OPERATOR_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "edl/etcd.h"
#include "edl/k8s.h"
#include "edl/loop.h"
#include "edl/metrics.h"
#include "edl/trainingjob.h"
#include "edl/work.h"
#include "publisher.h"
#include "operator.h"
#include "status.h"

/* What failed in a pass: the limiter then gates the retries of that kind of write. */
typedef enum op_failure {
    OP_FAIL_NONE = 0,
    OP_FAIL_CREATE,           /* an object of the job (Secret, Service, pod) was not created */
    OP_FAIL_STATUS,           /* the status was not written */
    OP_FAIL_OTHER,            /* anything else (etcd, finalizers, deletions): retried on events */
} op_failure;

/* A token bucket: `rate` tokens a second up to `burst`, full at first (pass.c). */
typedef struct op_bucket {
    double tokens;            /* below 0 after a reservation: the wait for the next token */
    int64_t ms;               /* monotonic: when it was last filled (0: never) */
} op_bucket;

/* What the operator remembers of one job. All of it may be lost (a restart, a takeover): it
 * only saves API calls and repeated Events; every decision is taken again from the caches. */
typedef struct op_job {
    char *ns, *name;
    char *etcd_name;          /* "<ns>.<name>" */
    char *selector;           /* "edl.dev/job=<name>": its pods (status.selector) */
    js_publisher etcd;              /* the job's etcd side */
    bool dirty;               /* an event concerns it: pass over it */
    int64_t wake_ms;          /* monotonic: pass again by then (0: only on events) */
    bool have_secret, have_service;
    size_t pods_lo, pods_hi;  /* its pods in this round's pod index (pass.c) */
    int64_t next_index[OP_ROLES]; /* the next pod index of each role (op_role; beyond every
                                   * index of the role seen) */
    bool primed;              /* the ev_* below hold what the status said or we announced */
    int64_t ev_generation;
    int ev_restarts;
    size_t ev_members;
    op_state ev_state;
    char *reported_invalid;   /* the InvalidSpec message last announced */
    int create_batch[OP_ROLES]; /* pods of a role created in its next batch (1, 2, 4 ...) */
    op_bucket creates;        /* the job's pod creations (OP_CREATE_RATE) */
    bool ramp_told[OP_ROLES]; /* the RampingUp Event of the role's scale-up under way is out */
    /* the failure policy (op_pass_failed, op_pass_settle): the first failure of the pass under
     * way, and the per-job limiter */
    int err;                  /* EDL_E* of the pass's first failure (0: none) */
    const char *err_reason;   /* its CamelCase reason ("PodCreateFailed", "StatusWriteFailed") */
    char err_msg[700];
    op_failure err_kind;
    bool deferred;            /* the pass left a retry to the limiter's time (may_retry) */
    char *create_error;       /* why the job's objects are not all created (NULL: they are) */
    const char *create_reason;
    int failures;             /* passes in a row that failed: the limiter's exponent */
    int64_t retry_ms;         /* monotonic: writes of retry_kind are not retried before then */
    int64_t spec_generation;  /* metadata.generation of the last pass: an edit resets the limiter */
    op_failure retry_kind;
    char *reported_error;     /* the last error announced by an Event (one per distinct error) */
    char *pg_spec;            /* the PodGroup spec last written (JSON; NULL: none yet) */
    char *pg_missing;         /* the cluster serves no PodGroup of the job's kind: why */
} op_job;

/* What the operator counts (its /metrics). */
typedef struct op_counters {
    int64_t reconciles, pods_created, pods_deleted, status_writes, events, api_errors;
} op_counters;

/* The operator. The loop (loop.c) owns it, except while a round is on the worker (busy): the
 * round then owns the jobs, the counters, both clients, the etcd lease and watch and the
 * informers' caches, and the loop touches only what is marked loop's below. */
typedef struct op {
    const op_config *cfg;
    edl_loop *loop;           /* loop's (edl/loop.h) */
    atomic_bool stop;         /* a signal came (set by the loop, read by a round too) */
    edl_worker *worker;       /* runs the rounds (edl/work.h) */
    bool busy;                /* loop's: a round is on its way */
    int64_t etcd_retry_ms;    /* loop's: etcd's lease or watch is tried again then */
    edl_k8s *k;
    edl_etcd *c;
    edl_k8s_elector *elector; /* campaigns on its own thread; fences o->k's writes */
    edl_k8s_informer *tjs, *pods;
    int64_t lease;            /* our etcd lease: every job's term is under it */
    edl_lease_keeper *keeper;
    edl_watch *w;             /* every job's keys */
    char *jobs_prefix;        /* "<prefix>/jobs/" */
    char *pod_etcd_endpoints; /* etcd as pods reach it: --pod-etcd, else the operator's own */
    op_etcd_tls etcd_tls;     /* the operator's etcd TLS files, for each job's Secret */
    op_job **jobs;
    size_t n_jobs, cap_jobs;
    edl_metrics_server *metrics;
    op_bucket requeues;       /* the overall limiter of requeues after errors */
    op_bucket creates;        /* the overall limiter of pod creations (OP_CREATE_RATE_ALL) */
    op_counters m;
    op_counters shown;        /* loop's: m and n_jobs as of the last round, for /metrics */
    size_t shown_jobs;
} op;

/* The failure policy, controller-runtime's rate-limited requeue: a pass that failed is passed
 * again after max(5 ms doubling per failure in a row up to 1,000 s, a token bucket of 10 per
 * second with a burst of 100 shared by every job); a pass that did not resets its job's count. */
#define OP_BACKOFF_BASE_MS 5
#define OP_BACKOFF_MAX_MS 1000000
#define OP_BUCKET_RATE 10.0
#define OP_BUCKET_BURST 100.0

/* Pod creations, bounded per job and over every job (token buckets), so that a big scale-up
 * ramps (announced by a RampingUp Event) instead of flooding the API server: a job creates
 * at most 100 pods a second after a burst of 200, the operator 200 a second after 500. */
#define OP_CREATE_RATE 100.0
#define OP_CREATE_BURST 200.0
#define OP_CREATE_RATE_ALL 200.0
#define OP_CREATE_BURST_ALL 500.0

/* Record that the pass under way failed (the first failure is the one kept): rc, a CamelCase
 * reason, what failed and a message. A creation that failed shows in the Created condition
 * until it succeeds. EDL_ELEASE (we no longer lead) records nothing: the loop ends;
 * EDL_ECONFLICT (the object changed under us) is retried quietly, without an Event. */
void op_pass_failed(op_job *j, int rc, const char *reason, op_failure kind, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* After the pass: the limiter's wait, and one Event per distinct error (loop.c). */
int64_t op_backoff_ms(op *o, op_job *j, int64_t now);

op_job *op_job_find(op *o, const char *ns, const char *name, bool create);
void op_job_drop(op *o, op_job *j);
/* Pass over every job marked dirty (pass.c). */
void op_reconcile_dirty(op *o);
/* metadata.labels[key] of an object, or NULL. */
const char *op_label(const cJSON *obj, const char *key);

#endif

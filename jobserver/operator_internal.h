/* operator_internal.h: what the operator's files share: the operator (op), one job's memory
 * (op_job) and the per-job pass (operator_job.c). */
#ifndef EDL_JOBSERVER_OPERATOR_INTERNAL_H
#define EDL_JOBSERVER_OPERATOR_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "edl/etcd.h"
#include "edl/k8s.h"
#include "edl/metrics.h"
#include "edl/trainingjob.h"
#include "job.h"
#include "operator.h"
#include "operator_status.h"

/* What the operator remembers of one job. All of it may be lost (a restart, a takeover): it
 * only saves API calls and repeated Events; every decision is taken again from the caches. */
typedef struct op_job {
    char *ns, *name;
    char *etcd_name;          /* "<ns>.<name>" */
    char *selector;           /* "edl.dev/job=<name>": its pods (status.selector) */
    js_job etcd;              /* the job's etcd side */
    bool dirty;               /* an event concerns it: pass over it */
    int64_t wake_ms;          /* monotonic: pass again by then (0: only on events) */
    bool have_secret, have_service;
    int64_t next_index[OP_ROLES]; /* the next pod index of each role (op_role; beyond every
                                   * index of the role seen) */
    bool primed;              /* the ev_* below hold what the status said or we announced */
    int64_t ev_generation;
    int ev_restarts;
    size_t ev_members;
    op_state ev_state;
    char *reported_invalid;   /* the InvalidSpec message last announced */
    char *pod_error;          /* why pods cannot be created (NULL: they can) */
    int64_t pod_backoff_ms;   /* the next wait before creating again after an error */
    int64_t pod_retry_ms;     /* monotonic: no creation before then */
} op_job;

typedef struct op {
    const op_config *cfg;
    int sigfd;
    bool stop;
    edl_k8s *k;
    edl_etcd *c;
    edl_k8s_elector *elector;
    bool leading;
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
    struct {
        int64_t reconciles, pods_created, pods_deleted, status_writes, events, api_errors;
    } m;
} op;

op_job *op_job_find(op *o, const char *ns, const char *name, bool create);
void op_job_drop(op *o, op_job *j);
/* Pass over every job marked dirty (operator_job.c). */
void op_reconcile_dirty(op *o);
/* metadata.labels[key] of an object, or NULL. */
const char *op_label(const cJSON *obj, const char *key);

#endif

/* operator/operator.h: edl-operator (main.c), the operator of TrainingJob resources. One process
 * serves every TrainingJob of a namespace (or of the cluster); its replicas elect a leader
 * with a coordination.k8s.io Lease. For each job the leader keeps the worker pods (and the
 * parameter servers' pods of spec.ps, the teachers' of spec.teachers), a headless Service and the job's Secret in line with the
 * spec, writes the job's spec to etcd, runs the job's generation decision (jobserver/publisher.c, the same
 * pass as the job server of one job) and reports status, conditions and Events on the
 * TrainingJob. docs/kubernetes.md tells the whole story. */
#ifndef EDL_OPERATOR_H
#define EDL_OPERATOR_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "edl/etcd.h"
#include "edl/k8s.h"
#include "edl/trainingjob.h"

#define OP_DEFAULT_AGENT_IMAGE "ghcr.io/edl-dev/edl-agent:0.1.0"

typedef struct op_config {
    const edl_etcd_config *etcd;  /* the operator's own etcd settings (checked) */
    const edl_k8s_config *k8s;    /* where the API server is */
    const char *ns;               /* the namespace served (NULL: every namespace) */
    const char *prefix;           /* etcd key prefix */
    const char *id;               /* this replica's identity (hostname-pid) */
    int64_t ttl_s;                /* etcd lease of its terms on each job (10) */
    const char *lease_ns;         /* the Lease of the election (namespace, name) */
    const char *lease_name;
    int lease_duration_s;         /* 15 */
    int renew_deadline_ms;        /* 10000 */
    int retry_period_ms;          /* 2000 */
    const char *agent_image;      /* the init container that installs edl-agent */
    const char *pod_etcd_endpoints; /* etcd as the pods reach it (NULL: the operator's) */
    int metrics_port;             /* 0: no /metrics */
    const char *metrics_addr;
    int agent_metrics_port;       /* the agents' /metrics in the pods, port edl-metrics (0: off) */
    int max_replicas;             /* the most pods of a job, each role and all together
                                   * (--max-replicas; 0: EDL_TJ_PODS_MAX) */
} op_config;

/* Runs until SIGTERM/SIGINT (0) or the leadership is lost (1: the replica exits and is
 * restarted, as client-go's operators do); EDL_EXIT_USAGE for a bad configuration. The
 * signals arrive on its loop's signalfd: block them before any thread starts. */
int op_run(const op_config *cfg);

/* ---- the objects the operator creates (objects.c; pure, tested alone) ------------- */

/* The operator's own etcd TLS files (--cacert, --cert, --key), base64-encoded: each job's
 * Secret carries them to its pods, in the job's own namespace (NULL: that file is not used). */
typedef struct op_etcd_tls {
    char *ca, *cert, *key;
} op_etcd_tls;

typedef struct op_pod_settings {
    const char *etcd_job;      /* the job's name in etcd: "<namespace>.<name>" */
    const char *prefix;        /* etcd key prefix (NULL: the default) */
    const char *etcd_endpoints;
    const op_etcd_tls *etcd_tls; /* which files the job's Secret holds (NULL: none) */
    const char *agent_image;
    int agent_metrics_port;    /* edl-agent --metrics-port and a containerPort edl-metrics (0: none) */
} op_pod_settings;

/* metadata {name, namespace, labels (extra first, then the job's), ownerReferences to the
 * job}: of every object the job owns. */
cJSON *op_owned_metadata(const edl_trainingjob *tj, const char *name, const cJSON *extra);

/* The etcd job name of a TrainingJob: "<namespace>.<name>" (unique in a shared etcd). */
char *op_etcd_job_name(const char *ns, const char *name);
/* The roles of a job's pods, each with its own sequence of indices. */
typedef enum op_role { OP_WORKER = 0, OP_PS = 1, OP_TEACHER = 2, OP_ROLES } op_role;
/* EDL_ROLE_WORKER, EDL_ROLE_PS or EDL_ROLE_TEACHER: the edl.dev/role label and the name's. */
const char *op_role_name(op_role role);
/* The role a pod's edl.dev/role label names (NULL or unknown: a worker). */
op_role op_role_of(const char *label);

/* Pod "<name>-<role>-<index>" of the job: "<name>-worker-<index>" from the workers' template,
 * "<name>-ps-<index>" from spec.ps's, "<name>-teacher-<index>" from spec.teachers's (each role
 * its own sequence of indices): the template with edl-agent wrapping the first container's
 * command (--role ps for a server; --role teacher --service S [--model M] [--capacity N]
 * [--port P, the first container's first containerPort] for a teacher), labels edl.dev/job,
 * edl.dev/role and edl.dev/index, the downward API, the job's Secret and etcd settings, owned
 * by the job. */
cJSON *op_pod_new(const edl_trainingjob *tj, const op_pod_settings *s, op_role role,
                  int64_t index);
/* The container edl-agent runs in, in a pod of the role: the name of the role template's first
 * container (NULL: it has none). */
const char *op_agent_container(const edl_trainingjob *tj, op_role role);
/* The name of a pod of the job: "<job>-worker-<index>", "<job>-ps-<index>" or
 * "<job>-teacher-<index>". */
void op_pod_name(const char *job, op_role role, int64_t index, char *buf, size_t len);
/* The headless Service "<name>" selecting the job's pods (stable names). */
cJSON *op_service_new(const edl_trainingjob *tj);
/* The job's Secret "<name>-edl-secret": 32 fresh random bytes (the collective's key) and the
 * etcd TLS files of tls (NULL: none). */
cJSON *op_secret_new(const edl_trainingjob *tj, const op_etcd_tls *tls);
/* Reads the operator's etcd TLS files into tls (each at most 64 KiB, not empty); 0, or an
 * error with err naming the file. */
int op_etcd_tls_load(op_etcd_tls *tls, const edl_etcd_config *etcd, char *err, size_t errlen);
void op_etcd_tls_clear(op_etcd_tls *tls);
char *op_secret_name(const char *job);
/* "edl.dev/job=<job>,edl.dev/role=worker": the label selector of a job's worker pods (its
 * status.selector, what the scale subresource and an HPA count; the ps pods are not). */
char *op_selector(const char *job);
/* An Event about the job: type "Normal" or "Warning", reason CamelCase. */
cJSON *op_event_new(const cJSON *tj_obj, const char *type, const char *reason,
                    const char *message, const char *reporter);
/* The ownerReferences entry naming the job as controller. */
cJSON *op_owner_ref(const edl_trainingjob *tj);

/* ---- gang scheduling (gang.c; pure) ----------------------------------------------- */

#define OP_VOLCANO_GROUP_ANNOTATION "scheduling.k8s.io/group-name"
/* On a job suspended for Kueue's queue by the operator (its value: the queue). */
#define OP_QUEUED_ANNOTATION "edl.dev/queued"
#define OP_COSCHED_GROUP_LABEL "scheduling.x-k8s.io/pod-group"

/* Where a gang scheduler's PodGroups are served. */
typedef struct op_gang_api {
    const char *group, *version, *api_version, *plural;
} op_gang_api;
const op_gang_api *op_gang_api_of(edl_gang gang); /* NULL for EDL_GANG_NONE */

/* The job's PodGroup (named after the job, owned by it) for its gang scheduler, NULL without
 * one; its spec alone (minMember, minResources, and queue and priorityClassName for Volcano or
 * scheduleTimeoutSeconds for coscheduling), for a merge patch. */
cJSON *op_podgroup_new(const edl_trainingjob *tj);
cJSON *op_podgroup_spec(const edl_trainingjob *tj);
/* The summed requests (limits where no request) of the pods the gang needs at once: minReplicas
 * workers, and the ps and teachers minReplicas, as quantities ({"cpu": "3", "memory": ...}). */
cJSON *op_gang_min_resources(const edl_trainingjob *tj);
/* A pod's schedulerName, priorityClassName and gang mark (annotation or label), as the job's
 * policy asks. */
void op_pod_schedule(cJSON *pod, const edl_trainingjob *tj);
/* A failed pod that was preempted or evicted (status.reason, or a DisruptionTarget condition):
 * no failure of its trainer's, so not counted against the job's budget. */
bool op_pod_preempted(const cJSON *pod);

#endif

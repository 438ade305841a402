/* edl/trainingjob.h: the TrainingJob resource (deploy/k8s/crd.yaml, group edl.dev, version
 * v1alpha1) read into what edl runs: the job spec that goes to etcd (edl_job_spec), the pod
 * templates (the workers', the parameter servers' of spec.ps and the teachers' of
 * spec.teachers), and the settings the operator applies itself (suspend, cleanPodPolicy,
 * ttlSecondsAfterFinished, activeDeadlineSeconds).
 *
 * One reader for both users of the manifest: the operator parses the objects the API server
 * sends, `edl run -f job.yaml` parses the same manifest from a file (edl/yaml.h turns YAML into
 * the same cJSON tree and a field path back into a line). The reader applies the CRD's
 * defaults itself (a stand-in or an old API server may not have), never trusts its input, and
 * names the offending field: field="spec.elastic.settleWindow", err="must be a duration like
 * 1s or 500ms". */
#ifndef EDL_TRAININGJOB_H
#define EDL_TRAININGJOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "edl/job.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EDL_TJ_GROUP "edl.dev"
#define EDL_TJ_VERSION "v1alpha1"
#define EDL_TJ_API_VERSION "edl.dev/v1alpha1"
#define EDL_TJ_KIND "TrainingJob"
#define EDL_TJ_PLURAL "trainingjobs"
#define EDL_TJ_LABEL_JOB "edl.dev/job"     /* on every pod of a job: its name */
#define EDL_TJ_LABEL_ROLE "edl.dev/role"   /* "worker", "ps" or "teacher" (EDL_ROLE_*) */
#define EDL_TJ_LABEL_INDEX "edl.dev/index" /* the pod's index in its role: higher is newer */
#define EDL_TJ_FINALIZER "edl.dev/etcd-cleanup"

/* The one rule for a TrainingJob's name, held by the CRD (CEL, Kubernetes 1.25+), by this
 * reader (every version, and `edl run -f`) and so by the operator: a DNS-1035 label (the
 * headless Service is named after the job) of at most EDL_TJ_NAME_MAX characters, so that every
 * pod's hostname "<name>-teacher-<index>" (the longest role) is a DNS-1123 label of at most 63
 * characters for indices below 10^9. */
#define EDL_TJ_NAME_MAX 45
#define EDL_TJ_STR_(x) #x
#define EDL_TJ_STR(x) EDL_TJ_STR_(x)
#define EDL_TJ_NAME_RULE "a TrainingJob's name must be at most " EDL_TJ_STR(EDL_TJ_NAME_MAX) \
    " characters of lower-case " \
    "letters, digits and '-', start with a letter and end with a letter or digit (a DNS-1035 " \
    "label: the job's Service and its pods' hostnames are named after it)"
bool edl_tj_name_valid(const char *name);

typedef enum edl_clean_pod_policy {
    EDL_CLEAN_RUNNING = 0, /* delete the pods still running when the job ends (default) */
    EDL_CLEAN_ALL,         /* delete every pod */
    EDL_CLEAN_NONE,        /* keep them all */
} edl_clean_pod_policy;

/* spec.schedulingPolicy's gang scheduler: the kind of PodGroup the job owns. */
typedef enum edl_gang {
    EDL_GANG_NONE = 0,     /* the cluster's default scheduler, pod by pod */
    EDL_GANG_VOLCANO,      /* scheduling.volcano.sh/v1beta1 PodGroup, pods annotated
                            * scheduling.k8s.io/group-name */
    EDL_GANG_COSCHEDULING, /* scheduler-plugins' coscheduling: scheduling.x-k8s.io/v1alpha1
                            * PodGroup, pods labelled scheduling.x-k8s.io/pod-group */
} edl_gang;

#define EDL_KUEUE_QUEUE_LABEL "kueue.x-k8s.io/queue-name" /* on the job: Kueue's queue */

/* spec.schedulingPolicy, and Kueue's queue from the job's labels. */
typedef struct edl_scheduling {
    edl_gang gang;                 /* spec.schedulingPolicy.scheduler */
    char *scheduler_name;          /* the pods' schedulerName (NULL: the template's, or for a
                                    * gang "volcano" / "scheduler-plugins-scheduler") */
    int min_available;             /* pods the gang needs at once (0: the default,
                                    * edl_trainingjob_min_available) */
    char *queue;                   /* Volcano's queue (NULL: none) */
    char *priority_class;          /* priorityClassName of every pod and the PodGroup */
    int64_t schedule_timeout_s;    /* scheduleTimeoutSeconds (-1: none) */
    char *kueue_queue;             /* metadata.labels[kueue.x-k8s.io/queue-name] (NULL: none) */
} edl_scheduling;

typedef struct edl_trainingjob {
    char *name, *ns, *uid;         /* metadata (ns: "default" when absent; uid may be NULL) */
    int64_t generation;            /* metadata.generation (0 when absent) */
    bool deleting;                 /* metadata.deletionTimestamp is set */
    edl_job_spec spec;             /* replicas, min, max, ps_* and the elastic settings */
    bool suspend;
    edl_clean_pod_policy clean_pod_policy;
    int64_t ttl_after_finished_s;  /* -1: keep the job */
    int64_t active_deadline_s;     /* -1: no deadline */
    cJSON *pod_template;           /* a copy of spec.template (owned) */
    char **command;                /* the first container's command then args (NULL-terminated,
                                    * owned): what edl-agent wraps */
    size_t n_command;
    /* spec.ps, the parameter servers (NULL/0 without it; spec.ps_* hold its replicas and
     * bounds): its own pod template, whose first container runs under edl-agent --role ps */
    cJSON *ps_template;            /* a copy of spec.ps.template (owned) */
    char **ps_command;             /* its first container's command then args (as command) */
    size_t n_ps_command;
    /* spec.teachers, distillation's teachers (NULL/0 without it; spec.teachers_* hold its
     * replicas, bounds and service): its pod template, whose first container runs under
     * edl-agent --role teacher --service S [--model M] [--capacity N] */
    cJSON *teacher_template;       /* a copy of spec.teachers.template (owned) */
    char **teacher_command;        /* its first container's command then args (as command) */
    size_t n_teacher_command;
    char *teacher_model;           /* spec.teachers.model (NULL: the agent's default) */
    int teacher_capacity;          /* spec.teachers.capacity (0: the agent's default, 1) */
    edl_scheduling sched;          /* spec.schedulingPolicy and Kueue's queue label */
} edl_trainingjob;

/* The pods a gang needs at once: spec.schedulingPolicy.minAvailable, else minReplicas plus the
 * parameter servers' and teachers' minReplicas (for the roles the job has). */
int edl_trainingjob_min_available(const edl_trainingjob *tj);
/* The pods' schedulerName: the policy's, else the gang scheduler's usual one ("volcano",
 * "scheduler-plugins-scheduler"), else NULL (the template's own, or the default). */
const char *edl_trainingjob_scheduler_name(const edl_trainingjob *tj);

/* Read a TrainingJob object. On a problem: EDL_EPROTO (wrong type, missing field) or
 * EDL_ECONFIG (a value out of range, min > max, spec.ps.replicas > spec.ps.maxReplicas, an
 * unknown enum name, a teachers' service that is no DNS label), `field` receives its path
 * ("spec.minReplicas", "spec.template.spec.containers[0].command", "spec.ps.maxReplicas",
 * "spec.teachers.service") and `err` what is wrong
 * with it (without the path); *out is left cleared. *out is written, not read: clear an
 * edl_trainingjob that holds a job before parsing into it again. */
int edl_trainingjob_parse(const cJSON *obj, edl_trainingjob *out, char *field, size_t fieldlen,
                          char *err, size_t errlen);
/* The most pods of a job by default: of each role (spec.replicas, ps and teachers with their
 * bounds) and of its roles together (workers' replicas + the servers' and teachers' desired
 * pods), as the CRD's maximum. A typo (replicas: 100000) is refused, not run. */
#define EDL_TJ_PODS_MAX 1024
/* edl_trainingjob_parse with another bound on a job's pods (the operator's --max-replicas;
 * outside 1..EDL_MEMBERS_MAX: EDL_TJ_PODS_MAX). A value past it is EDL_ECONFIG naming the
 * bound and how the cluster's administrator raises it; edl_trainingjob_parse is this with
 * EDL_TJ_PODS_MAX. (The parameter servers and the teachers keep their own limit, 1,024.) */
int edl_trainingjob_parse_bounded(const cJSON *obj, int pods_max, edl_trainingjob *out,
                                  char *field, size_t fieldlen, char *err, size_t errlen);
void edl_trainingjob_clear(edl_trainingjob *tj);

/* The first field of a TrainingJob object that the CRD's schema does not have, found as the API
 * server's strict field validation (kubectl's default) finds it: EDL_ECONFIG, `field` receives
 * its path ("spec.maxReplica") and `err` 'unknown field "spec.maxReplica"' (with a near known
 * name when there is one); 0 (field "") when there is none. The parts the schema leaves open
 * (x-kubernetes-preserve-unknown-fields: the pod templates' metadata, spec and containers) and
 * status are not looked into; metadata is held to ObjectMeta's fields. edl_trainingjob_parse
 * does not call it: the operator reads what the API server stored, which has been refused or
 * pruned there already; `edl run -f` calls it on a file no server has seen. */
int edl_trainingjob_unknown_field(const cJSON *obj, char *field, size_t fieldlen, char *err,
                                  size_t errlen);

/* A Kubernetes-style duration: one or more <number><unit>, unit ms, s, m or h ("1m30s",
 * "500ms", "1.5s"); EDL_ECONFIG otherwise or when over 30 days. */
int edl_duration_parse(const char *s, int64_t *ms);

/* Fields of the manifest that only mean something on a cluster (spec.template's image,
 * resources, nodeSelector, ...): calls report(arg, field path) for each one present, so that
 * `edl run -f` can say it ignores them. */
void edl_trainingjob_cluster_only(const cJSON *obj, void (*report)(void *arg, const char *field),
                                  void *arg);

#ifdef __cplusplus
}
#endif

#endif

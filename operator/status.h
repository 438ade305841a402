/* operator/status.h: the TrainingJob status the operator writes (status.c). */
#ifndef EDL_OPERATOR_STATUS_H
#define EDL_OPERATOR_STATUS_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "edl/job.h"

/* status.state */
typedef enum op_state {
    OP_CREATED = 0, /* accepted; no generation yet */
    OP_INVALID,     /* the spec is invalid: nothing is created */
    OP_WAITING,     /* fewer than minReplicas members */
    OP_RUNNING,
    OP_RESTARTING,  /* a trainer failed; the next generation is forming */
    OP_SUCCEEDED,
    OP_FAILED,
    OP_STOPPED,     /* `edl stop` */
    OP_SUSPENDED,   /* spec.suspend: no pods */
} op_state;

const char *op_state_name(op_state s);
/* The state an edl generation stands for (NULL or generation 0: Created). */
op_state op_state_of(const edl_generation *g);

/* What the operator knows of one job now. */
typedef struct op_view {
    op_state state;
    const char *reason;       /* the current condition's reason (NULL: from the state) */
    const char *message;      /* and message (NULL: none) */
    int replicas;             /* worker pods that exist and are not being deleted */
    bool ps;                  /* the job has the ps role (spec.ps) */
    int ps_replicas;          /* parameter-server pods that exist and are not being deleted */
    bool teachers;            /* the job has the teacher role (spec.teachers) */
    int teacher_desired;      /* teacher pods wanted (spec.teachers.replicas) */
    int teacher_replicas;     /* teacher pods that exist and are not being deleted */
    int teachers_ready;       /* the job's teachers registered in the service (their server
                               * answers its health check) */
    const char *selector;     /* "edl.dev/job=<name>" */
    const edl_generation *gen; /* the published generation (NULL: none) */
    int64_t observed_generation;
    int64_t start_ms, completion_ms; /* wall clock; 0: none */
    int pod_failures;         /* pods that failed and were replaced */
    bool objects_created;     /* the job's Secret and Service exist and no creation fails */
    const char *create_error; /* why the job's objects are not all created (NULL: none) */
    const char *create_reason; /* its reason: PodCreateFailed, ServiceCreateFailed ... */
    const char *error;        /* another failure of this pass (NULL: none): the Synced
                               * condition, False, with error_reason */
    const char *error_reason;
    bool gang;                /* the job has a gang scheduler: the PodGroup condition */
    const char *podgroup_missing; /* the cluster serves no PodGroup of its kind: why */
} op_view;

/* The status object to write (caller frees), with conditions carried over from old_status
 * (the status read; may be NULL). */
cJSON *op_status_new(const cJSON *old_status, const op_view *v, int64_t now_ms);
bool op_status_same(const cJSON *a, const cJSON *b);

#endif

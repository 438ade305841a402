/* reconcile.h: the job server's decision, as a pure function of what it observed.
 *
 * Level-triggered, in the manner of a Kubernetes controller: given the spec, the live pods, their
 * trainer status and the current generation, say what the generation should be now. No etcd
 * here, so every rule (settle window, failures, exclusion, success, hangs) is unit-tested; the
 * caller (jobserver.c) reads a consistent snapshot, calls js_reconcile, and publishes the result
 * with a fenced txn. The only memory kept between calls (js_memory) is what a new leader may
 * lose without harm: when each pending join was first seen (it then waits one more settle
 * window), when each rank's step last moved (it then waits one more progress timeout), when
 * rank 0 was first seen done (it then waits one more finishing grace), the failures of the last
 * restarted generation (it then allows one more restart before a repeated failure fails the
 * job). */
#ifndef EDL_JOBSERVER_RECONCILE_H
#define EDL_JOBSERVER_RECONCILE_H

#include <stdbool.h>
#include <stdint.h>

#include "edl/job.h"

typedef struct js_observed {
    const edl_job_spec *spec;   /* the spec in force (NULL: none yet: do nothing) */
    const char *spec_error;     /* the spec in etcd is invalid (NULL: it is valid) */
    const edl_pod *pods;        /* live registrations in join order (create_revision) */
    size_t n_pods;
    const edl_pod_status *status; /* status[i] belongs to pods[i] */
    const bool *has_status;
    const edl_generation *current; /* the published generation (generation 0: none yet) */
    int64_t max_status_gen;     /* the highest generation any pod's status reports */
    int64_t now_ms;             /* wall clock, for exclusions stored in the generation */
    int64_t mono_ms;            /* monotonic clock, for windows kept in memory */
    const char *leader_id;
    const char *gen_dead;       /* the current generation's gen/<n>/dead value (NULL: none) */
    const bool *gen_alive;      /* [rank]: gen/<n>/alive/<rank> exists (NULL: none does) */
    const bool *renewed;        /* [i]: pods[i]'s lease was renewed after the current hold on a
                                 * failure began (js_memory.hold_since_mono_ms; probed by the job
                                 * server for the pods of js_decision.probe): its agent is alive,
                                 * so its trainer is no silent peer (NULL: none known) */
} js_observed;

typedef struct js_progress {
    char *pod;
    int64_t generation;
    int64_t step;
    int64_t changed_mono_ms; /* when this step was first seen */
} js_progress;

/* A join not yet published: a member or server of the next generation that the current one
 * lacks (this incarnation: pod name and lease), and when it was first seen. */
typedef struct js_join {
    char *pod;
    int64_t lease;
    int64_t since_mono_ms;
} js_join;

/* One failure as the fail-fast judgement compares it with the next (reconcile.c, script_bug). */
typedef struct js_failure_sig {
    int rank;
    int code;               /* exit code or 128 + signal */
    uint32_t message_hash;  /* of the trainer's message (its error file) */
} js_failure_sig;
#define JS_FAILURES_KEPT 16 /* the failures of one generation remembered (more: not compared) */

typedef struct js_memory {
    js_join *joins;             /* the joins pending now; a pod that left is forgotten */
    size_t n_joins;
    js_progress *progress;
    size_t n_progress;
    int64_t dead_gen;           /* the generation whose dead key was first seen at dead_since */
    int64_t dead_since_mono_ms;
    int64_t hold_gen;           /* the generation whose failures wait for silent peers */
    int64_t hold_since_mono_ms;
    int64_t finish_gen;         /* the generation whose rank 0 was first seen done at */
    int64_t finish_since_mono_ms;
    int64_t failed_gen;         /* the last generation restarted after its members' own failures */
    size_t n_failed;            /* ... and those failures (a new leader forgets them: one more
                                 * restart before a repeat is seen) */
    js_failure_sig failed[JS_FAILURES_KEPT];
} js_memory;

typedef enum js_action {
    JS_NOTHING = 0, /* the published document is right */
    JS_PUBLISH,     /* publish `next` (a new generation, or the same one with new details) */
} js_action;

typedef struct js_decision {
    js_action action;
    edl_generation next;       /* when JS_PUBLISH */
    bool new_generation;    /* next.generation > current (see next_generation_number) */
    int64_t wake_mono_ms;   /* reconcile again by then even without events (0: no need) */
    char waiting[640];      /* JS_NOTHING: why a failure is not decided yet ("": it is not
                             * waiting), for the job server's log */
    size_t *probe;          /* holding: the pods (indexes into js_observed.pods) it waits for,
                             * whose leases the job server probes (js_observed.renewed) */
    size_t n_probe;
} js_decision;

int js_reconcile(const js_observed *obs, js_memory *mem, js_decision *out);
void js_decision_clear(js_decision *d);
void js_memory_clear(js_memory *m);

#endif

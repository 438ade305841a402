/* publisher.h: the generation publisher, one job's etcd side (publisher.c): the state a replica keeps while it leads a job, and one
 * reconcile pass. The job server of one job (jobserver.c) and the operator (operator/), which
 * leads many jobs at once, both drive it; each pass starts from a fresh consistent snapshot. */
#ifndef EDL_JOBSERVER_PUBLISHER_H
#define EDL_JOBSERVER_PUBLISHER_H

#include <stdbool.h>
#include <stdint.h>

#include "edl/etcd.h"
#include "edl/job.h"
#include "reconcile.h"

typedef struct js_job_counters {
    int64_t generation, members, servers, restarts, publications, etcd_errors;
    int64_t max_restarts; /* the spec's budget (-1: no spec yet) */
    int64_t ckpt_step, ckpt_seen_ms; /* the newest checkpoint (-1: none), when first read */
    int64_t gens_failure, gens_membership; /* new generations published, by their cause */
    int state;            /* -1: no generation yet */
} js_job_counters;

/* Leases of pods that a hold on a failure waits for, found renewed after the hold began (their
 * agents live: js_observed.renewed). */
typedef struct js_renewals {
    int64_t hold_gen, hold_since_mono_ms; /* the hold they belong to (js_memory's) */
    int64_t *leases;
    size_t n, cap;
    int64_t probed_mono_ms;               /* the last probe (at most one a second) */
} js_renewals;

typedef struct js_publisher {
    char *name;               /* the job (owned) */
    const char *id;           /* this replica's identity (the caller's) */
    edl_etcd *c;              /* the caller's client */
    edl_job_keys k;
    edl_job_spec spec;        /* the last valid spec seen */
    bool have_spec;
    js_memory mem;
    edl_leader leader;        /* our term on k.leader (kv NULL: we do not lead it) */
    int64_t bad_revs[16];     /* malformed documents already reported (one log line each) */
    unsigned n_bad;
    js_job_counters m;
    edl_generation current;   /* the generation last read or published (0: none) */
    char *spec_error;         /* the spec in etcd is invalid: why (NULL: it is valid or absent) */
    int64_t waiting_gen;      /* the generation whose wait (js_decision.waiting) was logged */
    js_renewals renewals;
} js_publisher;

/* 0, EDL_EINVAL for an invalid job name, EDL_ENOMEM. */
int js_publisher_init(js_publisher *j, edl_etcd *c, const char *prefix, const char *job, const char *id);
void js_publisher_clear(js_publisher *j);
/* One pass: snapshot, decide, publish. *wake: when to pass again without events (0: only on
 * events); *final_state: the job's state after the pass (-1: no generation yet). Returns
 * EDL_ELEASE when this replica no longer leads the job, else 0 (etcd errors are logged,
 * counted and retried by asking to be woken soon). */
int js_publisher_pass(js_publisher *j, int64_t *wake, int *final_state);
/* Whether a watch event under the job can change a decision (see job.c). */
bool js_publisher_event_matters(const js_publisher *j, const edl_watch_event *ev);

#endif

/* operator/status.c: a TrainingJob's status as the operator writes it through /status: the
 * scale subresource's replicas and selector (the workers'), the edl generation with its members
 * (and, with spec.ps, the parameter servers' pods and the generation's servers; with
 * spec.teachers, the teachers' pods wanted, existing and registered), the state,
 * and conditions following the Kubernetes conventions (type CamelCase, status True/False,
 * reason CamelCase, lastTransitionTime kept while the status of a condition does not change).
 * Pure: built from what the operator observed and the status it read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/k8s.h"
#include "status.h"

static const char *const COND_TYPES[] = {"Created", "Running", "Restarting", "Succeeded",
                                         "Failed"};
#define SYNCED "Synced" /* the operator's last pass went through (shown once one did not) */

const char *op_state_name(op_state s)
{
    static const char *const names[] = {"Created",   "Invalid",   "Waiting", "Running",
                                        "Restarting", "Succeeded", "Failed",  "Stopped",
                                        "Suspended"};
    return (unsigned)s < sizeof names / sizeof *names ? names[s] : "Unknown";
}

op_state op_state_of(const edl_generation *g)
{
    if (!g || g->generation == 0)
        return OP_CREATED;
    switch (g->state) {
    case EDL_JOB_WAITING:
        return g->reason && strncmp(g->reason, "restart ", 8) == 0 ? OP_RESTARTING : OP_WAITING;
    case EDL_JOB_RUNNING: return OP_RUNNING;
    case EDL_JOB_SUCCEEDED: return OP_SUCCEEDED;
    case EDL_JOB_FAILED: return OP_FAILED;
    case EDL_JOB_STOPPED: return OP_STOPPED;
    }
    return OP_CREATED;
}

static const cJSON *old_condition(const cJSON *old_status, const char *type)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(old_status, "conditions")) {
        const char *t = edl_k8s_str(c, "type");
        if (t && strcmp(t, type) == 0)
            return c;
    }
    return NULL;
}

/* One condition; the transition time stays what it was unless the status flips. */
static void add_condition(cJSON *conds, const cJSON *old_status, const char *type, bool is_true,
                          const char *reason, const char *message, int64_t observed,
                          const char *now)
{
    const cJSON *old = old_condition(old_status, type);
    const char *status = is_true ? "True" : "False";
    const char *old_st = old ? edl_k8s_str(old, "status") : NULL;
    const char *since = old_st && strcmp(old_st, status) == 0 ?
                        edl_k8s_str(old, "lastTransitionTime") : NULL;
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "type", type);
    cJSON_AddStringToObject(c, "status", status);
    cJSON_AddStringToObject(c, "reason", reason && *reason ? reason : type);
    cJSON_AddStringToObject(c, "message", message ? message : "");
    cJSON_AddStringToObject(c, "lastTransitionTime", since ? since : now);
    cJSON_AddNumberToObject(c, "observedGeneration", (double)observed);
    cJSON_AddItemToArray(conds, c);
}

/* The reason of the condition that is true now, from the state. */
static const char *state_reason(const op_view *v, op_state s)
{
    if (v->reason)
        return v->reason;
    switch (s) {
    case OP_RUNNING: return "GenerationRunning";
    case OP_RESTARTING: return "TrainerFailed";
    case OP_SUCCEEDED: return "TrainingSucceeded";
    case OP_FAILED: return "TrainingFailed";
    default: return op_state_name(s);
    }
}

static void add_conditions(cJSON *st, const cJSON *old_status, const op_view *v, const char *now)
{
    cJSON *conds = cJSON_AddArrayToObject(st, "conditions");
    /* True only for what exists: a status never claims an object that is not there */
    bool invalid = v->state == OP_INVALID, created = !invalid && v->objects_created;
    const char *creason = invalid ? "InvalidSpec" : v->create_error ? v->create_reason :
                          created ? "TrainingJobCreated" : "Creating";
    const char *cmsg = invalid ? v->message : v->create_error ? v->create_error :
                       created ? "the job's Secret and Service exist and its pods are created as the "
                       "spec asks" :
                       "creating the job's Secret, Service and pods";
    add_condition(conds, old_status, "Created", created, creason, cmsg, v->observed_generation,
                  now);
    if (v->gang)
        add_condition(conds, old_status, "PodGroup", !v->podgroup_missing,
                      v->podgroup_missing ? "PodGroupCRDMissing" : "PodGroupCreated",
                      v->podgroup_missing ? v->podgroup_missing
                                          : "the job's PodGroup holds its gang",
                      v->observed_generation, now);
    if (v->error || old_condition(old_status, SYNCED))
        add_condition(conds, old_status, SYNCED, !v->error,
                      v->error ? v->error_reason : "ReconcileSucceeded", v->error ? v->error : "",
                      v->observed_generation, now);
    static const op_state conds_state[] = {OP_CREATED, OP_RUNNING, OP_RESTARTING, OP_SUCCEEDED,
                                           OP_FAILED};
    for (size_t i = 1; i < sizeof COND_TYPES / sizeof *COND_TYPES; i++) {
        bool is_true = v->state == conds_state[i];
        /* a condition appears once it has been true, then stays (False) */
        if (!is_true && !old_condition(old_status, COND_TYPES[i]))
            continue;
        add_condition(conds, old_status, COND_TYPES[i], is_true,
                      is_true ? state_reason(v, v->state) : op_state_name(v->state),
                      is_true ? v->message : "", v->observed_generation, now);
    }
}

/* key: [{pod, rank}] of a generation's members or servers. */
static void add_ranked(cJSON *st, const char *key, const edl_member *m, size_t n)
{
    cJSON *arr = cJSON_AddArrayToObject(st, key);
    for (size_t i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "pod", m[i].pod);
        cJSON_AddNumberToObject(e, "rank", m[i].rank);
        cJSON_AddItemToArray(arr, e);
    }
}

static void add_members(cJSON *st, const edl_generation *g)
{
    add_ranked(st, "members", g ? g->members : NULL, g ? g->n_members : 0);
    if (g && g->n_standbys) {
        cJSON *sb = cJSON_AddArrayToObject(st, "standbys");
        for (size_t i = 0; i < g->n_standbys; i++)
            cJSON_AddItemToArray(sb, cJSON_CreateString(g->standbys[i]));
    }
}

cJSON *op_status_new(const cJSON *old_status, const op_view *v, int64_t now_ms)
{
    char now[40], t[40];
    edl_k8s_time(now_ms, false, now, sizeof now);
    cJSON *st = cJSON_CreateObject();
    cJSON_AddNumberToObject(st, "replicas", v->replicas);
    cJSON_AddStringToObject(st, "selector", v->selector);
    const edl_generation *g = v->gen;
    cJSON_AddNumberToObject(st, "generation", g ? (double)g->generation : 0);
    cJSON_AddNumberToObject(st, "memberCount", g ? (double)g->n_members : 0);
    add_members(st, g);
    if (v->ps || (g && g->n_servers)) { /* the parameter servers: pods, then ranked servers */
        cJSON_AddNumberToObject(st, "psReplicas", v->ps_replicas);
        cJSON_AddNumberToObject(st, "serverCount", g ? (double)g->n_servers : 0);
        add_ranked(st, "servers", g ? g->servers : NULL, g ? g->n_servers : 0);
    }
    if (v->teachers) { /* the teachers: no members, counted only */
        cJSON *tt = cJSON_AddObjectToObject(st, "teachers");
        cJSON_AddNumberToObject(tt, "desired", v->teacher_desired);
        cJSON_AddNumberToObject(tt, "replicas", v->teacher_replicas);
        cJSON_AddNumberToObject(tt, "ready", v->teachers_ready);
    }
    cJSON_AddStringToObject(st, "state", op_state_name(v->state));
    cJSON_AddNumberToObject(st, "restarts", g ? g->restarts : 0);
    cJSON_AddNumberToObject(st, "podFailures", v->pod_failures);
    if (v->start_ms)
        cJSON_AddStringToObject(st, "startTime", edl_k8s_time(v->start_ms, false, t, sizeof t));
    if (v->completion_ms)
        cJSON_AddStringToObject(st, "completionTime",
                                edl_k8s_time(v->completion_ms, false, t, sizeof t));
    cJSON_AddNumberToObject(st, "observedGeneration", (double)v->observed_generation);
    add_conditions(st, old_status, v, now);
    return st;
}

/* Two statuses equal but for the transition times (which we never rewrite alone). */
bool op_status_same(const cJSON *a, const cJSON *b)
{
    if (!a || !b)
        return a == b;
    return cJSON_Compare(a, b, true);
}

/* operator_job.c: one pass over one TrainingJob, in the manner of a Kubernetes controller:
 * read the job and its pods from the caches and the job from etcd (job.c), compare with what
 * the spec asks, act, and write what was seen to the status. Safe to repeat: creations carry
 * names that say their index and are put into the cache at once; a pass after a crash finds
 * what the last one did and does only what is still missing.
 *
 * Order of one pass: the spec (invalid: a condition, nothing created) → deletion (finalizer:
 * the job's etcd keys go, then the finalizer) → our finalizer → the job's etcd side (spec,
 * generation) → the end (cleanPodPolicy, ttlSecondsAfterFinished), suspension, or the pods
 * (failed ones replaced within the budget; then each role, the workers, spec.ps's parameter
 * servers and spec.teachers's teachers, scaled to its replicas on its own: up with new indices,
 * down from the newest) → status and Events. Teachers are no members: a teacher pod that fails
 * is replaced uncounted, and the job ends as its workers do. */
#include <stdarg.h>
#include <stdio.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "edl/log.h"
#include "operator_internal.h"

#define LOG "operator"
#define BACKOFF_MIN_MS 1000
#define BACKOFF_MAX_MS 30000


const char *op_label(const cJSON *obj, const char *key)
{
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(obj, "metadata");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(md, "labels"), key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static void wake_in(op_job *j, int64_t ms)
{
    int64_t t = edl_monotonic_ms() + ms;
    if (!j->wake_ms || t < j->wake_ms)
        j->wake_ms = t;
}

/* The job's own path, or its subresource's (sub NULL: the object); malloc'ed, NULL: no memory. */
static char *tj_path(const op_job *j, const char *sub)
{
    return edl_k8s_path(EDL_TJ_GROUP, EDL_TJ_VERSION, j->ns, EDL_TJ_PLURAL, j->name, sub);
}

static void post_event(op *o, const cJSON *tj, const char *type, const char *reason,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void post_event(op *o, const cJSON *tj, const char *type, const char *reason,
                       const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *ev = op_event_new(tj, type, reason, msg, o->cfg->id);
    char *path = edl_k8s_path(NULL, "v1", edl_k8s_str(tj, "metadata.namespace"), "events",
                              NULL, NULL);
    if (ev && path && edl_k8s_create(o->k, path, ev, NULL) == 0)
        o->m.events++;
    else
        o->m.api_errors++;
    cJSON_Delete(ev);
    free(path);
}

/* ---- the pods of one job ----------------------------------------------------------------- */

typedef struct pod_view {
    const cJSON *obj;
    const char *name, *phase;
    int64_t index;
    op_role role;      /* edl.dev/role: worker, ps or teacher */
    bool terminating;
    bool ended;        /* phase Succeeded or Failed */
} pod_view;

/* A job's pods; the counts by role (op_role). */
typedef struct job_pods {
    pod_view *p;
    size_t n;
    int live[OP_ROLES];       /* neither terminating nor ended */
    int succeeded[OP_ROLES];
    int existing[OP_ROLES];   /* not terminating (status.replicas, psReplicas, teachers) */
} job_pods;

/* Every pod of every job, sorted by namespace then job: built once per round of passes, so
 * that finding one job's pods costs a binary search, not a walk over every pod (10,000 of
 * them with 1,000 jobs). Entries of a job are read only during its own pass, before anything
 * of it changes in the cache. */
typedef struct pod_index {
    const cJSON **pods;
    size_t n;
} pod_index;

static int cmp_job(const char *ns_a, const char *job_a, const char *ns_b, const char *job_b)
{
    int c = strcmp(ns_a ? ns_a : "", ns_b ? ns_b : "");
    return c ? c : strcmp(job_a ? job_a : "", job_b ? job_b : "");
}

static int cmp_pods(const void *a, const void *b)
{
    const cJSON *x = *(const cJSON *const *)a, *y = *(const cJSON *const *)b;
    return cmp_job(edl_k8s_str(x, "metadata.namespace"), op_label(x, EDL_TJ_LABEL_JOB),
                   edl_k8s_str(y, "metadata.namespace"), op_label(y, EDL_TJ_LABEL_JOB));
}

static void pod_index_build(op *o, pod_index *idx)
{
    memset(idx, 0, sizeof *idx);
    for (size_t cap = 1024;;) {
        const cJSON **a = realloc(idx->pods, cap * sizeof *a);
        if (!a)
            break;
        idx->pods = a;
        idx->n = edl_k8s_informer_list(o->pods, idx->pods, cap);
        if (idx->n <= cap)
            break;
        cap = idx->n + 1024;
    }
    if (idx->pods)
        qsort(idx->pods, idx->n, sizeof *idx->pods, cmp_pods);
    else
        idx->n = 0;
}

static void pods_of(op_job *j, const pod_index *idx, job_pods *out)
{
    memset(out, 0, sizeof *out);
    size_t lo = 0, hi = idx->n;
    while (lo < hi) { /* the first pod not before this job's */
        size_t mid = lo + (hi - lo) / 2;
        const cJSON *p = idx->pods[mid];
        if (cmp_job(edl_k8s_str(p, "metadata.namespace"), op_label(p, EDL_TJ_LABEL_JOB), j->ns,
                    j->name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t end = lo;
    while (end < idx->n && cmp_job(edl_k8s_str(idx->pods[end], "metadata.namespace"),
                                   op_label(idx->pods[end], EDL_TJ_LABEL_JOB), j->ns, j->name) == 0)
        end++;
    out->p = calloc(end - lo + 1, sizeof *out->p);
    for (size_t i = lo; out->p && i < end; i++) {
        pod_view *v = &out->p[out->n++];
        v->obj = idx->pods[i];
        v->name = edl_k8s_str(v->obj, "metadata.name");
        v->phase = edl_k8s_str(v->obj, "status.phase");
        const char *num = op_label(v->obj, EDL_TJ_LABEL_INDEX);
        const char *role = op_label(v->obj, EDL_TJ_LABEL_ROLE);
        v->index = num ? strtoll(num, NULL, 10) : 0;
        v->role = op_role_of(role);
        v->terminating = edl_k8s_str(v->obj, "metadata.deletionTimestamp") != NULL;
        if (v->index >= j->next_index[v->role])
            j->next_index[v->role] = v->index + 1;
        v->ended = v->phase && (!strcmp(v->phase, "Succeeded") || !strcmp(v->phase, "Failed"));
        out->live[v->role] += !v->terminating && !v->ended;
        out->succeeded[v->role] += !v->terminating && v->phase && !strcmp(v->phase, "Succeeded");
        out->existing[v->role] += !v->terminating;
    }
}

/* Delete v's pod. The informer then holds its new object (or none), so v's strings are gone:
 * on success v is left terminating, with no object, name or phase. */
static int delete_pod(op *o, op_job *j, pod_view *v)
{
    char *path = edl_k8s_path(NULL, "v1", j->ns, "pods", v->name, NULL);
    edl_k8s_reply r = {0};
    int rc = path ? edl_k8s_delete(o->k, path, NULL, -1, &r) : EDL_ENOMEM;
    free(path);
    if (rc == 0 || rc == EDL_ENOTFOUND) {
        o->m.pods_deleted += rc == 0;
        const char *kind = edl_k8s_str(r.body, "kind");
        if (rc == 0 && kind && strcmp(kind, "Pod") == 0)
            edl_k8s_informer_store(o->pods, r.body, false); /* terminating: do not count it */
        else
            edl_k8s_informer_store(o->pods, v->obj, true);
        *v = (pod_view){.index = v->index, .role = v->role, .terminating = true,
                        .ended = v->ended};
        rc = 0;
    } else {
        o->m.api_errors++;
        EDL_WARN(LOG, "job %s/%s: deleting pod %s: %s (%s)", j->ns, j->name, v->name,
                 edl_strerror(rc), r.message);
    }
    edl_k8s_reply_clear(&r);
    return rc;
}

/* ---- pieces of a pass -------------------------------------------------------------------- */

/* The spec cannot be read: say so once per message, create nothing. */
static void report_invalid(op *o, op_job *j, const cJSON *obj, const char *field, const char *err)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s: %s", field, err);
    if (!j->reported_invalid || strcmp(j->reported_invalid, msg) != 0) {
        EDL_WARN(LOG, "job %s/%s is invalid: %s", j->ns, j->name, msg);
        post_event(o, obj, "Warning", "InvalidSpec", "%s", msg);
        free(j->reported_invalid);
        j->reported_invalid = strdup(msg);
    }
}

static const cJSON *finalizers_of(const cJSON *obj)
{
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(obj, "metadata"),
                                            "finalizers");
}

static bool is_ours(const cJSON *finalizer)
{
    return cJSON_IsString(finalizer) && strcmp(finalizer->valuestring, EDL_TJ_FINALIZER) == 0;
}

/* Set the job's finalizers to list (consumed), fenced by the resourceVersion read: 409 when the
 * job changed since. The reply in *r (clear it). */
static int patch_finalizers(op *o, op_job *j, const cJSON *obj, cJSON *list, edl_k8s_reply *r)
{
    cJSON *patch = cJSON_CreateObject();
    cJSON *md = cJSON_AddObjectToObject(patch, "metadata");
    cJSON_AddItemToObject(md, "finalizers", list);
    cJSON_AddStringToObject(md, "resourceVersion", edl_k8s_str(obj, "metadata.resourceVersion"));
    char *path = tj_path(j, NULL);
    int rc = path ? edl_k8s_merge_patch(o->k, path, patch, r) : EDL_ENOMEM;
    cJSON_Delete(patch);
    free(path);
    return rc;
}

/* The job is being deleted: its etcd keys go, then our finalizer (the pods go with their owner
 * through the garbage collector). */
static void finalize(op *o, op_job *j, const cJSON *obj)
{
    const cJSON *f, *fins = finalizers_of(obj);
    bool ours = false;
    cJSON_ArrayForEach(f, fins) ours = ours || is_ours(f);
    if (!ours)
        return;
    edl_delete_opts dp = {.prefix = true};
    int rc = edl_etcd_delete(o->c, edl_str(j->etcd.k.job), &dp, NULL);
    if (rc) {
        EDL_WARN(LOG, "job %s/%s: removing its etcd keys: %s; retrying", j->ns, j->name,
                 edl_strerror(rc));
        wake_in(j, 1000);
        return;
    }
    edl_leader_clear(&j->etcd.leader);
    cJSON *keep = cJSON_CreateArray();
    cJSON_ArrayForEach(f, fins) if (cJSON_IsString(f) && !is_ours(f))
        cJSON_AddItemToArray(keep, cJSON_CreateString(f->valuestring));
    edl_k8s_reply r = {0};
    rc = patch_finalizers(o, j, obj, keep, &r);
    if (rc == 0)
        EDL_INFO(LOG, "job %s/%s deleted: its etcd keys are gone", j->ns, j->name);
    else if (rc != EDL_ENOTFOUND)
        wake_in(j, 500); /* 409: it changed; the next pass reads it again */
    edl_k8s_reply_clear(&r);
}

/* Our finalizer on the job before anything of it exists. false: not yet (retry later). */
static bool ensure_finalizer(op *o, op_job *j, const cJSON *obj)
{
    const cJSON *f, *fins = finalizers_of(obj);
    cJSON_ArrayForEach(f, fins) if (is_ours(f))
        return true;
    cJSON *list = fins ? cJSON_Duplicate(fins, true) : cJSON_CreateArray();
    cJSON_AddItemToArray(list, cJSON_CreateString(EDL_TJ_FINALIZER));
    edl_k8s_reply r = {0};
    int rc = patch_finalizers(o, j, obj, list, &r);
    if (rc == 0 && r.body)
        edl_k8s_informer_store(o->tjs, r.body, false);
    else if (rc)
        wake_in(j, rc == EDL_ECONFLICT ? 100 : 1000);
    edl_k8s_reply_clear(&r);
    return rc == 0;
}

/* The job's etcd side: our term on it, one generation pass, the spec the TrainingJob asks. */
static void etcd_pass(op *o, op_job *j, const edl_trainingjob *tj, bool stop)
{
    if (!o->keeper)
        return wake_in(j, 1000);
    if (!j->etcd.leader.kv) {
        bool won = false;
        edl_leader l = {0};
        int rc = edl_election_try(o->c, edl_str(j->etcd.k.leader), edl_str(o->cfg->id), o->lease,
                                  &won, &l);
        if (rc == 0 && won)
            j->etcd.leader = l;
        else
            edl_leader_clear(&l); /* another term lives (a replica before us): wait for it */
        if (!won)
            return wake_in(j, 1000);
    }
    int64_t wake = 0;
    int state = -1;
    if (js_job_pass(&j->etcd, &wake, &state) == EDL_ELEASE)
        edl_leader_clear(&j->etcd.leader);
    if (wake)
        wake_in(j, wake - edl_monotonic_ms());
    /* the spec the TrainingJob asks, written when etcd holds another (the pass just read it;
     * its watch event brings the next pass) */
    edl_job_spec want;
    edl_spec_init(&want);
    edl_spec_copy(&want, &tj->spec);
    want.stopped = stop;
    char *json = edl_spec_to_json(&want);
    char *have = j->etcd.have_spec && !j->etcd.spec_error ? edl_spec_to_json(&j->etcd.spec) : NULL;
    edl_spec_clear(&want);
    if (json && (!have || strcmp(json, have) != 0) &&
        edl_etcd_put(o->c, edl_str(j->etcd.k.spec), edl_str(json), NULL, NULL) != 0)
        wake_in(j, 1000);
    free(json);
    free(have);
}

/* Create an object we own (Secret, Service); AlreadyExists counts as done. */
static bool ensure_owned(op *o, op_job *j, const char *plural, cJSON *obj)
{
    char *path = edl_k8s_path(NULL, "v1", j->ns, plural, NULL, NULL);
    edl_k8s_reply r = {0};
    int rc = obj && path ? edl_k8s_create(o->k, path, obj, &r) : EDL_ENOMEM;
    bool done = rc == 0 || (rc == EDL_ECONFLICT && !strcmp(r.reason, "AlreadyExists"));
    if (!done) {
        o->m.api_errors++;
        EDL_WARN(LOG, "job %s/%s: creating its %s: %s (%s)", j->ns, j->name, plural,
                 edl_strerror(rc), r.message);
        wake_in(j, 2000);
    }
    edl_k8s_reply_clear(&r);
    cJSON_Delete(obj);
    free(path);
    return done;
}

/* A pod could not be created: a condition and an Event (once per message), then back off. */
static void pod_create_failed(op *o, op_job *j, const cJSON *obj, const char *pod,
                              const edl_k8s_reply *r, int rc)
{
    char msg[700];
    snprintf(msg, sizeof msg, "cannot create pod %s: %s", pod,
             r->message[0] ? r->message : edl_strerror(rc));
    if (!j->pod_error || strcmp(j->pod_error, msg) != 0) {
        EDL_WARN(LOG, "job %s/%s: %s", j->ns, j->name, msg);
        post_event(o, obj, "Warning", "PodCreateFailed", "%s", msg);
        free(j->pod_error);
        j->pod_error = strdup(msg);
    }
    j->pod_backoff_ms = j->pod_backoff_ms ? j->pod_backoff_ms * 2 : BACKOFF_MIN_MS;
    if (j->pod_backoff_ms > BACKOFF_MAX_MS)
        j->pod_backoff_ms = BACKOFF_MAX_MS;
    j->pod_retry_ms = edl_monotonic_ms() + j->pod_backoff_ms;
    wake_in(j, j->pod_backoff_ms);
}

/* n new pods of a role, with the role's next indices. */
static void create_pods(op *o, op_job *j, const edl_trainingjob *tj, const cJSON *obj,
                        op_role role, int n)
{
    op_pod_settings s = {.etcd_job = j->etcd_name,
                         .prefix = strcmp(o->cfg->prefix, EDL_DEFAULT_PREFIX) ? o->cfg->prefix
                                                                              : NULL,
                         .etcd_endpoints = o->pod_etcd_endpoints,
                         .etcd_tls = &o->etcd_tls,
                         .agent_image = o->cfg->agent_image};
    char *path = edl_k8s_path(NULL, "v1", j->ns, "pods", NULL, NULL);
    for (int i = 0; i < n && path; i++) {
        cJSON *pod = op_pod_new(tj, &s, role, j->next_index[role]);
        const char *name = edl_k8s_str(pod, "metadata.name");
        edl_k8s_reply r = {0};
        int rc = edl_k8s_create(o->k, path, pod, &r);
        if (rc == 0 && r.body) {
            o->m.pods_created++;
            edl_k8s_informer_store(o->pods, r.body, false); /* counted from now on */
            post_event(o, obj, "Normal", "PodCreated", "created pod %s", name);
            j->next_index[role]++;
            free(j->pod_error);
            j->pod_error = NULL;
            j->pod_backoff_ms = 0;
        } else if (rc == EDL_ECONFLICT && !strcmp(r.reason, "AlreadyExists")) {
            j->next_index[role]++; /* a pod of that name exists that we have not seen yet */
            i--;
        } else {
            o->m.api_errors++;
            pod_create_failed(o, j, obj, name ? name : "?", &r, rc);
            edl_k8s_reply_clear(&r);
            cJSON_Delete(pod);
            break;
        }
        edl_k8s_reply_clear(&r);
        cJSON_Delete(pod);
    }
    free(path);
}

static int by_index_desc(const void *a, const void *b)
{
    const pod_view *x = a, *y = b;
    return x->index < y->index ? 1 : x->index > y->index ? -1 : 0;
}

/* One role to its replicas: new pods take the role's next indices, surplus pods go newest
 * first (like `edl run`). A worker pod that succeeded means the job is ending: nothing more is
 * created then, of any role. A parameter server or a teacher that succeeded left cleanly (its
 * agent exited 0 by itself): its pod is deleted, uncounted, and replaced while the job runs. */
static void scale_role(op *o, op_job *j, const edl_trainingjob *tj, const cJSON *obj,
                       job_pods *pods, op_role role)
{
    for (size_t i = 0; role != OP_WORKER && pods->succeeded[OP_WORKER] == 0 && i < pods->n;
         i++) {
        pod_view *v = &pods->p[i];
        if (v->role == role && !v->terminating && v->phase && !strcmp(v->phase, "Succeeded") &&
            delete_pod(o, j, v) == 0)
            pods->succeeded[role]--;
    }
    int have = pods->live[role] + pods->succeeded[role];
    int want = role == OP_PS ? edl_spec_desired_servers(&tj->spec) :
               role == OP_TEACHER ? edl_spec_desired_teachers(&tj->spec) : tj->spec.replicas;
    if (have < want && pods->succeeded[OP_WORKER] == 0) {
        if (edl_monotonic_ms() >= j->pod_retry_ms)
            create_pods(o, j, tj, obj, role, want - have);
        else
            wake_in(j, j->pod_retry_ms - edl_monotonic_ms());
    } else if (have > want) {
        qsort(pods->p, pods->n, sizeof *pods->p, by_index_desc);
        int surplus = have - want;
        for (size_t i = 0; i < pods->n && surplus > 0; i++) {
            pod_view *v = &pods->p[i];
            if (v->role != role || v->terminating || v->ended)
                continue;
            if (delete_pod(o, j, v) == 0)
                surplus--;
        }
    }
}

/* Failed pods of any role are replaced (the failure counted, but a teacher's: teachers never
 * fail the job); then each role is scaled to its replicas (spec.replicas, spec.ps.replicas,
 * spec.teachers.replicas). Returns the failures. */
static int manage_pods(op *o, op_job *j, const edl_trainingjob *tj, const cJSON *obj,
                       job_pods *pods)
{
    int failures = 0;
    for (size_t i = 0; i < pods->n; i++) {
        pod_view *v = &pods->p[i];
        if (v->terminating || !v->phase || strcmp(v->phase, "Failed") != 0)
            continue;
        const char *why = edl_k8s_str(v->obj, "status.reason");
        post_event(o, obj, "Warning", "PodFailed", "pod %s failed%s%s; replacing it", v->name,
                   why ? ": " : "", why ? why : "");
        if (delete_pod(o, j, v) == 0 && v->role != OP_TEACHER)
            failures++;
    }
    scale_role(o, j, tj, obj, pods, OP_WORKER);
    scale_role(o, j, tj, obj, pods, OP_PS);      /* none wanted without spec.ps: any left go */
    scale_role(o, j, tj, obj, pods, OP_TEACHER); /* the same without spec.teachers */
    return failures;
}

/* The job ended: its pods go per cleanPodPolicy, the job itself after its TTL. */
static void finish(op *o, op_job *j, const edl_trainingjob *tj, job_pods *pods,
                   int64_t completion_ms)
{
    for (size_t i = 0; i < pods->n && tj->clean_pod_policy != EDL_CLEAN_NONE; i++) {
        pod_view *v = &pods->p[i];
        bool running = !v->phase || !strcmp(v->phase, "Running") || !strcmp(v->phase, "Pending");
        if (!v->terminating && (tj->clean_pod_policy == EDL_CLEAN_ALL || running))
            delete_pod(o, j, v);
    }
    if (tj->ttl_after_finished_s < 0 || !completion_ms)
        return;
    int64_t left = completion_ms + tj->ttl_after_finished_s * 1000 - edl_wall_ms();
    if (left > 0)
        return wake_in(j, left);
    char *path = tj_path(j, NULL);
    if (path && edl_k8s_delete(o->k, path, "Background", -1, NULL) == 0)
        EDL_INFO(LOG, "job %s/%s: deleted %llds after it ended (ttlSecondsAfterFinished)",
                 j->ns, j->name, (long long)tj->ttl_after_finished_s);
    free(path);
}

/* The job's teachers registered in its service: keys <prefix>/services/<service>/teachers/
 * <job>-teacher-* (a registration means the server answered its health check; teachers of
 * other jobs or Deployments in the same service are not counted). Registrations change without
 * any Kubernetes event: the job is passed again in a second while they fall short of the
 * desired count, every 10 s otherwise. -1: etcd could not be read. */
static int teachers_registered(op *o, op_job *j, const edl_trainingjob *tj, int desired)
{
    char key[512];
    size_t plen = strlen(o->cfg->prefix);
    while (plen > 1 && o->cfg->prefix[plen - 1] == '/')
        plen--;
    snprintf(key, sizeof key, "%.*s/services/%s/teachers/%s-teacher-", (int)plen, o->cfg->prefix,
             tj->spec.teachers_service, tj->name);
    edl_range_opts ro = {.prefix = true, .count_only = true};
    edl_range_result r = {0};
    int rc = edl_etcd_range(o->c, edl_str(key), &ro, &r);
    int n = rc ? -1 : (int)r.count;
    edl_range_result_clear(&r);
    wake_in(j, n == desired ? 10000 : 1000);
    return n;
}

/* ---- status and Events ------------------------------------------------------------------- */

static op_state state_named(const char *s)
{
    for (int i = OP_CREATED; s && i <= OP_SUSPENDED; i++)
        if (!strcmp(op_state_name((op_state)i), s))
            return (op_state)i;
    return OP_CREATED;
}

/* Events for what changed since the last pass (or since the status we found, after a start). */
static void announce(op *o, op_job *j, const cJSON *obj, const op_view *v, int desired)
{
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(obj, "status");
    if (!j->primed) {
        j->ev_generation = edl_k8s_int(st, "generation", 0);
        j->ev_restarts = (int)edl_k8s_int(st, "restarts", 0);
        j->ev_members = (size_t)edl_k8s_int(st, "memberCount", 0);
        j->ev_state = state_named(edl_k8s_str(st, "state"));
        j->primed = true;
    }
    const edl_generation *g = v->gen;
    if (g && g->generation > j->ev_generation) {
        if (g->n_members < j->ev_members && desired >= (int)j->ev_members)
            post_event(o, obj, "Warning", "MemberLost", "generation %lld has %zu members, %zu "
                       "before: %s", (long long)g->generation, g->n_members, j->ev_members,
                       g->reason ? g->reason : "");
        char servers[48] = "";
        if (g->n_servers)
            snprintf(servers, sizeof servers, ", %zu servers", g->n_servers);
        post_event(o, obj, "Normal", "GenerationPublished", "generation %lld: %zu members%s "
                   "(%s)", (long long)g->generation, g->n_members, servers,
                   g->reason ? g->reason : "");
        j->ev_generation = g->generation;
        j->ev_members = g->n_members;
    }
    if (g && g->restarts > j->ev_restarts) {
        post_event(o, obj, "Warning", "Restart", "%d restarts: %s", g->restarts,
                   g->reason ? g->reason : "");
        j->ev_restarts = g->restarts;
    }
    if (v->state != j->ev_state && (v->state == OP_SUCCEEDED || v->state == OP_FAILED ||
                                    v->state == OP_STOPPED || v->state == OP_SUSPENDED)) {
        bool bad = v->state == OP_FAILED;
        post_event(o, obj, bad ? "Warning" : "Normal", op_state_name(v->state), "the job %s%s%s",
                   v->state == OP_SUCCEEDED ? "succeeded" : v->state == OP_FAILED ? "failed" :
                   v->state == OP_STOPPED ? "was stopped" : "is suspended",
                   v->message ? ": " : "", v->message ? v->message : "");
    }
    j->ev_state = v->state;
}

/* Write the status through /status when it changed (a merge patch; keys we no longer report
 * are removed with null). */
static void write_status(op *o, op_job *j, const cJSON *obj, const op_view *v)
{
    const cJSON *old = cJSON_GetObjectItemCaseSensitive(obj, "status");
    cJSON *st = op_status_new(old, v, edl_wall_ms());
    if (!st || op_status_same(old, st)) {
        cJSON_Delete(st);
        return;
    }
    const cJSON *f;
    cJSON_ArrayForEach(f, old) if (f->string && !cJSON_GetObjectItemCaseSensitive(st, f->string))
        cJSON_AddNullToObject(st, f->string);
    cJSON *patch = cJSON_CreateObject();
    cJSON_AddItemToObject(patch, "status", st);
    char *path = tj_path(j, "status");
    edl_k8s_reply r = {0};
    int rc = path ? edl_k8s_merge_patch(o->k, path, patch, &r) : EDL_ENOMEM;
    if (rc == 0) {
        o->m.status_writes++;
        if (r.body)
            edl_k8s_informer_store(o->tjs, r.body, false);
    } else if (rc != EDL_ENOTFOUND) {
        o->m.api_errors++;
        EDL_WARN(LOG, "job %s/%s: writing the status: %s (%s)", j->ns, j->name,
                 edl_strerror(rc), r.message);
        wake_in(j, 1000);
    }
    edl_k8s_reply_clear(&r);
    cJSON_Delete(patch);
    free(path);
}

/* ---- one pass ---------------------------------------------------------------------------- */

/* An end the operator itself decided (deadline, pod failures beyond the budget): it stays. */
static const char *operator_failure(const cJSON *obj)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(
                              cJSON_GetObjectItemCaseSensitive(obj, "status"), "conditions")) {
        const char *t = edl_k8s_str(c, "type"), *s = edl_k8s_str(c, "status"),
                   *r = edl_k8s_str(c, "reason");
        if (t && s && r && !strcmp(t, "Failed") && !strcmp(s, "True") &&
            (!strcmp(r, "DeadlineExceeded") || !strcmp(r, "BackoffLimitExceeded")))
            return r;
    }
    return NULL;
}

static void pass_valid(op *o, op_job *j, const cJSON *obj, const edl_trainingjob *tj,
                       const pod_index *idx)
{
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(obj, "status");
    int64_t now = edl_wall_ms(), start_ms = 0, completion_ms = 0;
    const char *t = edl_k8s_str(st, "startTime");
    if (!t || edl_k8s_time_parse(t, &start_ms) != 0)
        start_ms = now;
    if ((t = edl_k8s_str(st, "completionTime")))
        edl_k8s_time_parse(t, &completion_ms);
    int pod_failures = (int)edl_k8s_int(st, "podFailures", 0);
    const char *op_failed = operator_failure(obj);
    char msg[600] = "";
    if (!op_failed && tj->active_deadline_s > 0 && now - start_ms > tj->active_deadline_s * 1000) {
        op_failed = "DeadlineExceeded";
        snprintf(msg, sizeof msg, "the job ran longer than activeDeadlineSeconds (%llds)",
                 (long long)tj->active_deadline_s);
    }
    etcd_pass(o, j, tj, op_failed != NULL);
    op_state state = op_failed ? OP_FAILED : op_state_of(&j->etcd.current);
    job_pods pods;
    pods_of(j, idx, &pods);
    bool final = state == OP_SUCCEEDED || state == OP_FAILED || state == OP_STOPPED;
    if (!final && tj->suspend) {
        state = OP_SUSPENDED;
        for (size_t i = 0; i < pods.n; i++)
            if (!pods.p[i].terminating)
                delete_pod(o, j, &pods.p[i]);
    } else if (!final) {
        j->have_secret = j->have_secret || ensure_owned(o, j, "secrets", op_secret_new(tj, &o->etcd_tls));
        j->have_service = j->have_service || ensure_owned(o, j, "services", op_service_new(tj));
        if (j->have_secret)
            pod_failures += manage_pods(o, j, tj, obj, &pods);
        if (pod_failures > tj->spec.max_restarts) {
            op_failed = "BackoffLimitExceeded";
            state = OP_FAILED;
            final = true;
            snprintf(msg, sizeof msg, "%d pods failed, more than maxRestarts (%d)", pod_failures,
                     tj->spec.max_restarts);
            wake_in(j, 0); /* the next pass stops the trainers through etcd */
        }
        if (tj->active_deadline_s > 0)
            wake_in(j, start_ms + tj->active_deadline_s * 1000 - now + 10);
    }
    if (final) {
        if (!completion_ms)
            completion_ms = now;
        finish(o, j, tj, &pods, completion_ms);
    } else {
        completion_ms = 0;
    }
    int teacher_desired = edl_spec_desired_teachers(&tj->spec), teachers_ready = 0;
    if (teacher_desired > 0 && !final) {
        teachers_ready = teachers_registered(o, j, tj, teacher_desired);
        if (teachers_ready < 0) /* unknown: keep what the status said */
            teachers_ready = (int)edl_k8s_int(st, "teachers.ready", 0);
    }
    const edl_generation *g = j->etcd.current.generation ? &j->etcd.current : NULL;
    if (!msg[0] && g && g->reason)
        snprintf(msg, sizeof msg, "%s", g->reason);
    op_view v = {.state = state, .reason = op_failed, .message = msg[0] ? msg : NULL,
                 .replicas = pods.existing[OP_WORKER], .ps = tj->spec.ps_max > 0,
                 .ps_replicas = pods.existing[OP_PS], .teachers = tj->spec.teachers_max > 0,
                 .teacher_desired = teacher_desired,
                 .teacher_replicas = pods.existing[OP_TEACHER],
                 .teachers_ready = teachers_ready, .selector = j->selector, .gen = g,
                 .observed_generation = tj->generation, .start_ms = start_ms,
                 .completion_ms = completion_ms, .pod_failures = pod_failures,
                 .pod_error = j->pod_error};
    announce(o, j, obj, &v, tj->spec.replicas);
    write_status(o, j, obj, &v);
    free(pods.p);
}

static void pass(op *o, op_job *j, const pod_index *idx)
{
    j->dirty = false;
    j->wake_ms = 0;
    o->m.reconciles++;
    const cJSON *obj = edl_k8s_informer_get(o->tjs, j->ns, j->name);
    if (!obj) { /* gone: its keys went with our finalizer (or it never had any) */
        op_job_drop(o, j);
        return;
    }
    edl_trainingjob tj;
    char field[256], err[512];
    int rc = edl_trainingjob_parse(obj, &tj, field, sizeof field, err, sizeof err);
    if (edl_k8s_str(obj, "metadata.deletionTimestamp")) {
        finalize(o, j, obj);
    } else if (rc) {
        report_invalid(o, j, obj, field, err);
        char msg[800];
        snprintf(msg, sizeof msg, "%s: %s", field, err);
        op_view v = {.state = OP_INVALID, .reason = "InvalidSpec", .message = msg,
                     .selector = j->selector,
                     .observed_generation = edl_k8s_int(obj, "metadata.generation", 0)};
        write_status(o, j, obj, &v);
    } else if (ensure_finalizer(o, j, obj)) {
        free(j->reported_invalid);
        j->reported_invalid = NULL;
        obj = edl_k8s_informer_get(o->tjs, j->ns, j->name); /* the patched one */
        if (obj)
            pass_valid(o, j, obj, &tj, idx);
    }
    if (!rc)
        edl_trainingjob_clear(&tj);
}

void op_reconcile_dirty(op *o)
{
    bool any = false;
    for (size_t i = 0; i < o->n_jobs && !any; i++)
        any = o->jobs[i]->dirty;
    if (!any)
        return;
    pod_index idx;
    pod_index_build(o, &idx);
    size_t passes = 0;
    for (size_t i = 0; i < o->n_jobs;) {
        op_job *j = o->jobs[i];
        if (!j->dirty) {
            i++;
            continue;
        }
        size_t before = o->n_jobs;
        pass(o, j, &idx);
        passes++;
        if (o->n_jobs == before)
            i++; /* else j was dropped and another job took its slot */
    }
    free(idx.pods);
    /* after a large round (a start, a relist, many pods at once) give the freed heap back: the
     * informers' threads parse in arenas of their own, which otherwise keep their peak */
    if (passes >= 100)
        malloc_trim(0);
}

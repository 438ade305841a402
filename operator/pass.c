/* operator/pass.c: one pass over one TrainingJob, in the manner of a Kubernetes controller:
 * read the job and its pods from the caches and the job from etcd (jobserver/publisher.c), compare with what
 * the spec asks, act, and write what was seen to the status. Safe to repeat: creations carry
 * names that say their index and are put into the cache at once; a pass after a crash finds
 * what the last one did and does only what is still missing.
 *
 * Order of one pass: the spec (invalid: a condition, nothing created) → deletion (finalizer:
 * the job's etcd keys go, then the finalizer) → our finalizer → the job's etcd side (spec,
 * generation) → the end (cleanPodPolicy, ttlSecondsAfterFinished), suspension, or the pods
 * (a dead agent's etcd lease revoked, failed pods replaced within the budget; then each
 * role, the workers, spec.ps's parameter servers and spec.teachers's teachers, scaled to its
 * replicas on its own: up with new indices, down from the newest) → status and Events.
 * Teachers are no members: a teacher pod that fails is replaced uncounted, and the job ends as
 * its workers do. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "edl/json.h"
#include "edl/log.h"
#include "internal.h"

#define LOG "operator"
#define CREATE_BATCH_MAX 64 /* pods created in one pass at most, before yielding to the loop */


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

/* ---- the failure policy ------------------------------------------------------------------ */

void op_pass_failed(op_job *j, int rc, const char *reason, op_failure kind, const char *fmt, ...)
{
    if (rc == EDL_ELEASE || j->err)
        return;
    j->err = rc;
    j->err_reason = reason;
    j->err_kind = kind;
    bool creating = kind == OP_FAIL_CREATE;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->err_msg, sizeof j->err_msg, fmt, ap);
    va_end(ap);
    if (creating && rc != EDL_ECONFLICT) {
        free(j->create_error);
        j->create_error = strdup(j->err_msg);
        j->create_reason = reason;
    }
}

/* Whether a write of this kind may be tried now: after a failure of the same kind, once the
 * limiter's wait is over (the events that pass over the job meanwhile do not retry it). */
static bool may_retry(op_job *j, op_failure kind)
{
    int64_t left = j->retry_ms - edl_monotonic_ms();
    if (j->retry_kind != kind || left <= 0)
        return true;
    j->deferred = true;
    wake_in(j, left);
    return false;
}

/* Fill the bucket up to now; its tokens. */
static double bucket_fill(op_bucket *b, double rate, double burst, int64_t now)
{
    if (!b->ms) {
        b->tokens = burst;
        b->ms = now;
    }
    b->tokens += (double)(now - b->ms) * rate / 1000;
    if (b->tokens > burst)
        b->tokens = burst;
    b->ms = now;
    return b->tokens;
}

/* Milliseconds until the bucket holds a whole token (0: it does). */
static int64_t bucket_wait_ms(const op_bucket *b, double rate)
{
    return b->tokens >= 1 ? 0 : (int64_t)((1 - b->tokens) * 1000 / rate) + 1;
}

int64_t op_backoff_ms(op *o, op_job *j, int64_t now)
{
    int64_t mine = OP_BACKOFF_MAX_MS;
    if (j->failures < 28 && ((int64_t)OP_BACKOFF_BASE_MS << j->failures) < OP_BACKOFF_MAX_MS)
        mine = (int64_t)OP_BACKOFF_BASE_MS << j->failures;
    j->failures++;
    /* a reservation: below 0, the wait for the token */
    double left = bucket_fill(&o->requeues, OP_BUCKET_RATE, OP_BUCKET_BURST, now) - 1;
    o->requeues.tokens = left;
    int64_t shared = left >= 0 ? 0 : (int64_t)(-left * 1000 / OP_BUCKET_RATE);
    return mine > shared ? mine : shared;
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

/* Every pod of every job, sorted by namespace then job, and each job's range in it: built once
 * per round of passes, so that finding one job's pods costs nothing (10,000 of them with 1,000
 * jobs). The ranges are found while every entry is valid: a pass then reads only its own job's
 * entries, and before anything of it changes in the cache (a pass that deletes a pod replaces
 * that pod's object in the cache, freeing the one the index points to: a later pass searching
 * the index would read it). */
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

/* Each job's [pods_lo, pods_hi) in the sorted index (empty for a job without pods). */
static void pod_index_ranges(op *o, const pod_index *idx)
{
    for (size_t i = 0; i < o->n_jobs; i++)
        o->jobs[i]->pods_lo = o->jobs[i]->pods_hi = 0;
    for (size_t lo = 0, hi; lo < idx->n; lo = hi) {
        const char *ns = edl_k8s_str(idx->pods[lo], "metadata.namespace");
        const char *job = op_label(idx->pods[lo], EDL_TJ_LABEL_JOB);
        for (hi = lo + 1; hi < idx->n && cmp_job(ns, job,
                                                  edl_k8s_str(idx->pods[hi], "metadata.namespace"),
                                                  op_label(idx->pods[hi], EDL_TJ_LABEL_JOB)) == 0;)
            hi++;
        op_job *j = ns && job ? op_job_find(o, ns, job, false) : NULL;
        if (j) {
            j->pods_lo = lo;
            j->pods_hi = hi;
        }
    }
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
    pod_index_ranges(o, idx);
}

static void pods_of(op_job *j, const pod_index *idx, job_pods *out)
{
    memset(out, 0, sizeof *out);
    size_t lo = j->pods_lo, end = j->pods_hi <= idx->n ? j->pods_hi : lo;
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
        /* a pod given time to stop comes back terminating; one removed at once (a Failed or
         * Succeeded pod, grace 0) comes back as it was, Failed still: gone for the cache, or
         * the next pass would count its failure again */
        const char *kind = edl_k8s_str(r.body, "kind");
        if (rc == 0 && kind && strcmp(kind, "Pod") == 0 &&
            edl_k8s_str(r.body, "metadata.deletionTimestamp"))
            edl_k8s_informer_store(o->pods, r.body, false);
        else
            edl_k8s_informer_store(o->pods, v->obj, true);
        *v = (pod_view){.index = v->index, .role = v->role, .terminating = true,
                        .ended = v->ended};
        rc = 0;
    } else {
        o->m.api_errors++;
        op_pass_failed(j, rc, "PodDeleteFailed", OP_FAIL_OTHER, "cannot delete pod %s: %s", v->name,
                       r.message[0] ? r.message : edl_strerror(rc));
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
        op_pass_failed(j, rc, "EtcdCleanupFailed", OP_FAIL_OTHER, "cannot remove the job's etcd keys: %s",
                       edl_strerror(rc));
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
    else if (rc != EDL_ENOTFOUND) /* 409: it changed; the next pass reads it again */
        op_pass_failed(j, rc, "FinalizerUpdateFailed", OP_FAIL_OTHER, "cannot remove our finalizer: %s",
                       r.message[0] ? r.message : edl_strerror(rc));
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
        op_pass_failed(j, rc, "FinalizerUpdateFailed", OP_FAIL_OTHER, "cannot add our finalizer: %s",
                       r.message[0] ? r.message : edl_strerror(rc));
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
        if (rc)
            op_pass_failed(j, rc, "EtcdUnavailable", OP_FAIL_OTHER, "cannot take the job's term in "
                           "etcd: %s", edl_strerror(rc));
        else if (!won)
            wake_in(j, 1000); /* its lease runs out within its TTL */
        if (!won)
            return;
    }
    int64_t wake = 0;
    int state = -1;
    if (js_publisher_pass(&j->etcd, &wake, &state) == EDL_ELEASE)
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
    int rc = 0;
    if (json && (!have || strcmp(json, have) != 0) &&
        (rc = edl_etcd_put(o->c, edl_str(j->etcd.k.spec), edl_str(json), NULL, NULL)) != 0)
        op_pass_failed(j, rc, "EtcdUnavailable", OP_FAIL_OTHER, "cannot write the job's spec to etcd: "
                       "%s", edl_strerror(rc));
    free(json);
    free(have);
}

/* Create an object we own (kind "Secret" or "Service"); AlreadyExists counts as done. */
static bool ensure_owned(op *o, op_job *j, const char *kind, cJSON *obj)
{
    const char *plural = strcmp(kind, "Secret") ? "services" : "secrets";
    if (!may_retry(j, OP_FAIL_CREATE)) {
        cJSON_Delete(obj);
        return false;
    }
    char *path = edl_k8s_path(NULL, "v1", j->ns, plural, NULL, NULL);
    edl_k8s_reply r = {0};
    int rc = obj && path ? edl_k8s_create(o->k, path, obj, &r) : EDL_ENOMEM;
    bool done = rc == 0 || (rc == EDL_ECONFLICT && !strcmp(r.reason, "AlreadyExists"));
    if (!done) {
        o->m.api_errors++;
        op_pass_failed(j, rc, strcmp(kind, "Secret") ? "ServiceCreateFailed" :
                       "SecretCreateFailed", OP_FAIL_CREATE, "cannot create the job's %s %s: %s", kind,
                       edl_k8s_str(obj, "metadata.name"), r.message[0] ? r.message :
                       edl_strerror(rc));
    }
    edl_k8s_reply_clear(&r);
    cJSON_Delete(obj);
    free(path);
    return done;
}

/* A pod of the name we tried exists (409 AlreadyExists). Ours (it carries the job's label): our
 * cache is behind, as when another leader created it; it goes into the cache and the batch ends
 * (1). Someone else's: its index is skipped (0). An error when it cannot be read. (Read by a
 * list with a field selector: the verb the operator's role grants.) */
static int pod_exists(op *o, op_job *j, const char *name)
{
    char *pods = edl_k8s_path(NULL, "v1", j->ns, "pods", NULL, NULL), *path = NULL;
    if (pods && asprintf(&path, "%s?fieldSelector=metadata.name%%3D%s", pods, name) < 0)
        path = NULL;
    edl_k8s_reply r = {0};
    int rc = path ? edl_k8s_get(o->k, path, &r) : EDL_ENOMEM;
    free(pods);
    free(path);
    const cJSON *pod = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r.body, "items"), 0);
    const char *job = pod ? op_label(pod, EDL_TJ_LABEL_JOB) : NULL;
    if (rc == 0 && !pod) {
        rc = 1; /* gone meanwhile: count again */
    } else if (rc == 0 && job && strcmp(job, j->name) == 0) {
        edl_k8s_informer_store(o->pods, pod, false);
        rc = 1;
    } else if (rc == 0) {
        EDL_WARN(LOG, "job %s/%s: pod %s exists but is not the job's: skipping its index",
                 j->ns, j->name, name);
    }
    edl_k8s_reply_clear(&r);
    return rc;
}

/* The pods the job may create now: whole tokens in both its bucket and the operator's. None:
 * the job is woken when both hold one. */
static int creations_allowed(op *o, op_job *j)
{
    int64_t now = edl_monotonic_ms();
    double mine = bucket_fill(&j->creates, OP_CREATE_RATE, OP_CREATE_BURST, now);
    double all = bucket_fill(&o->creates, OP_CREATE_RATE_ALL, OP_CREATE_BURST_ALL, now);
    double both = mine < all ? mine : all;
    if (both >= 1)
        return (int)both;
    int64_t wait_mine = bucket_wait_ms(&j->creates, OP_CREATE_RATE);
    int64_t wait_all = bucket_wait_ms(&o->creates, OP_CREATE_RATE_ALL);
    wake_in(j, wait_mine > wait_all ? wait_mine : wait_all);
    return 0;
}

/* A scale-up of n pods that the creation rate spreads out (more than the tokens there are
 * now) is said once, in an Event: how many pods, how fast, about how long. */
static void announce_ramp(op *o, op_job *j, const cJSON *obj, op_role role, int n, int allowed)
{
    if (n <= allowed || j->ramp_told[role])
        return;
    j->ramp_told[role] = true;
    post_event(o, obj, "Normal", "RampingUp", "creating %d %s pods at most %.0f a second (and "
               "%.0f a second over every job of this operator): about %.0f s", n,
               op_role_name(role), OP_CREATE_RATE, OP_CREATE_RATE_ALL,
               (double)(n - allowed) / OP_CREATE_RATE + 1);
}

/* Up to n new pods of a role, with the role's next indices, in one batch of the slow start
 * (ReplicaSet's: 1, 2, 4 ... pods, doubling after a batch that went through, back to 1 after
 * one that did not). A batch ends at its first failure; what remains waits for the next pass,
 * which comes at once when the batch went through: between two batches the loop serves the
 * watches, the other jobs and the signals. A name that exists (409) is never replaced by
 * another index while the pod is ours: two leaders creating the same index collide. */
static void create_pods(op *o, op_job *j, const edl_trainingjob *tj, const cJSON *obj,
                        op_role role, int n)
{
    if (!may_retry(j, OP_FAIL_CREATE))
        return;
    op_pod_settings s = {.etcd_job = j->etcd_name,
                         .prefix = strcmp(o->cfg->prefix, EDL_DEFAULT_PREFIX) ? o->cfg->prefix
                                                                              : NULL,
                         .etcd_endpoints = o->pod_etcd_endpoints,
                         .etcd_tls = &o->etcd_tls,
                         .agent_image = o->cfg->agent_image,
                         .agent_metrics_port = o->cfg->agent_metrics_port};
    int allowed = creations_allowed(o, j);
    announce_ramp(o, j, obj, role, n, allowed);
    if (allowed == 0)
        return; /* woken when a creation is allowed */
    int *size = &j->create_batch[role];
    if (*size < 1)
        *size = 1;
    int batch = n < *size ? n : *size, made = 0;
    if (batch > allowed)
        batch = allowed;
    bool again = true; /* nothing failed: the rest at once */
    char *path = edl_k8s_path(NULL, "v1", j->ns, "pods", NULL, NULL);
    for (int stop = !path; made < batch && !stop;) {
        cJSON *pod = op_pod_new(tj, &s, role, j->next_index[role]);
        const char *name = edl_k8s_str(pod, "metadata.name");
        edl_k8s_reply r = {0};
        int rc = name ? edl_k8s_create(o->k, path, pod, &r) : EDL_ENOMEM;
        if (rc == 0 && r.body) {
            o->m.pods_created++;
            edl_k8s_informer_store(o->pods, r.body, false); /* counted from now on */
            post_event(o, obj, "Normal", "PodCreated", "created pod %s", name);
            j->next_index[role]++;
            made++;
        } else if (rc == EDL_ECONFLICT && !strcmp(r.reason, "AlreadyExists")) {
            int ex = pod_exists(o, j, name);
            if (ex == 0)
                j->next_index[role]++;
            else if (ex < 0)
                op_pass_failed(j, ex, "PodCreateFailed", OP_FAIL_CREATE, "cannot read pod %s, which "
                               "exists: %s", name, edl_strerror(ex));
            stop = ex != 0;
            again = ex > 0;
        } else {
            o->m.api_errors++;
            op_pass_failed(j, rc, "PodCreateFailed", OP_FAIL_CREATE, "cannot create pod %s: %s",
                           name ? name : "?", r.message[0] ? r.message : edl_strerror(rc));
            stop = 1;
            again = false;
        }
        edl_k8s_reply_clear(&r);
        cJSON_Delete(pod);
    }
    free(path);
    j->creates.tokens -= made;
    o->creates.tokens -= made;
    *size = made < batch ? 1 : *size * 2 > CREATE_BATCH_MAX ? CREATE_BATCH_MAX : *size * 2;
    if (again && made < n)
        wake_in(j, 0); /* the rest in the next batch, after the loop's other work */
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
    if (have < want && pods->succeeded[OP_WORKER] == 0)
        create_pods(o, j, tj, obj, role, want - have);
    else {
        j->create_batch[role] = 1; /* the next scale-up starts slow again */
        j->ramp_told[role] = false;
    }
    if (have > want) {
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

/* The pod's agent ended without leaving the job: the pod failed, or the agent's container
 * (op_agent_container: named in the role's template) terminated with a non-zero code while
 * others of the pod still run. (An agent that exits 0 has revoked its lease itself.) */
static bool agent_died(const edl_trainingjob *tj, const pod_view *v)
{
    if (v->phase && !strcmp(v->phase, "Failed"))
        return true;
    const char *agent = op_agent_container(tj, v->role);
    const cJSON *cs;
    cJSON_ArrayForEach(cs, cJSON_GetObjectItemCaseSensitive(
                               cJSON_GetObjectItemCaseSensitive(v->obj, "status"),
                               "containerStatuses")) {
        const char *name = edl_k8s_str(cs, "name");
        if (agent && name && !strcmp(name, agent))
            return edl_k8s_int(cs, "state.terminated.exitCode", 0) != 0;
    }
    return false;
}

/* The kubelet saw the pod's agent die: its registration in etcd goes now (the lease of its pod
 * key revoked, with everything under it), so the job server publishes the loss at once
 * instead of when the lease runs out, as `edl run` does for an agent it reaped. A pod name
 * is never reused, so the key holds this pod's agent or nobody. */
static void revoke_dead_agent(op *o, op_job *j, const pod_view *v)
{
    char *key = edl_job_key_pod(&j->etcd.k, v->name);
    int64_t lease = 0;
    int rc = key ? edl_etcd_lease_revoke_holder(o->c, edl_str(key), &lease) : EDL_ENOMEM;
    if (rc == 0)
        EDL_INFO(LOG, "job %s/%s: the agent of pod %s died: its etcd lease %llx revoked", j->ns,
                 j->name, v->name, (unsigned long long)lease);
    else if (rc != EDL_ENOTFOUND) /* the lease runs out by itself */
        EDL_WARN(LOG, "job %s/%s: cannot revoke the etcd lease of pod %s: %s", j->ns, j->name,
                 v->name, edl_strerror(rc));
    free(key);
}

/* Failed pods of any role are replaced (the failure counted, but a teacher's: teachers never
 * fail the job), their agents' leases revoked first; then each role is scaled to its replicas
 * (spec.replicas, spec.ps.replicas, spec.teachers.replicas). Returns the failures. */
static int manage_pods(op *o, op_job *j, const edl_trainingjob *tj, const cJSON *obj,
                       job_pods *pods)
{
    int failures = 0;
    for (size_t i = 0; i < pods->n; i++) {
        pod_view *v = &pods->p[i];
        if (!v->terminating && agent_died(tj, v))
            revoke_dead_agent(o, j, v);
        if (v->terminating || !v->phase || strcmp(v->phase, "Failed") != 0)
            continue;
        const char *why = edl_k8s_str(v->obj, "status.reason");
        bool preempted = op_pod_preempted(v->obj); /* an elastic leave, as a lost spot node */
        post_event(o, obj, preempted ? "Normal" : "Warning", preempted ? "PodPreempted" :
                   "PodFailed", "pod %s %s%s%s; replacing it", v->name,
                   preempted ? "was preempted or evicted" : "failed", why ? ": " : "",
                   why ? why : "");
        if (delete_pod(o, j, v) == 0 && v->role != OP_TEACHER && !preempted)
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
    if (!st || op_status_same(old, st) || !may_retry(j, OP_FAIL_STATUS)) {
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
        op_pass_failed(j, rc, "StatusWriteFailed", OP_FAIL_STATUS, "cannot write the status: %s",
                       r.message[0] ? r.message : edl_strerror(rc));
    }
    edl_k8s_reply_clear(&r);
    cJSON_Delete(patch);
    free(path);
}

/* ---- one pass ---------------------------------------------------------------------------- */

/* The end the job's status records: the type of its True Succeeded or Failed condition (NULL
 * while it runs), and that condition's reason. Durable whoever leads: no pass moves a job out
 * of it, and a new leader, which remembers nothing, reads it here. */
static const char *recorded_end(const cJSON *obj, const char **reason)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(
                              cJSON_GetObjectItemCaseSensitive(obj, "status"), "conditions")) {
        const char *t = edl_k8s_str(c, "type"), *s = edl_k8s_str(c, "status");
        if (t && s && !strcmp(s, "True") && (!strcmp(t, "Succeeded") || !strcmp(t, "Failed"))) {
            *reason = edl_k8s_str(c, "reason");
            return t;
        }
    }
    return NULL;
}

/* A job that ended: nothing is created, announced or rewritten; its pods go per
 * cleanPodPolicy and the job after its TTL, from the completionTime recorded. An end the
 * operator decided (deadline, pod failures beyond the budget) also stops the trainers through
 * etcd. */
static void pass_ended(op *o, op_job *j, const cJSON *obj, const edl_trainingjob *tj,
                       const pod_index *idx, const char *end, const char *reason)
{
    if (!strcmp(end, "Failed") && reason &&
        (!strcmp(reason, "DeadlineExceeded") || !strcmp(reason, "BackoffLimitExceeded")))
        etcd_pass(o, j, tj, true);
    int64_t completion_ms = 0;
    const char *t = edl_k8s_str(cJSON_GetObjectItemCaseSensitive(obj, "status"),
                                "completionTime");
    if (!t || edl_k8s_time_parse(t, &completion_ms) != 0)
        completion_ms = 0; /* none recorded: kept until one is */
    job_pods pods;
    pods_of(j, idx, &pods);
    finish(o, j, tj, &pods, completion_ms);
    free(pods.p);
}

/* The job's PodGroup for its gang scheduler, written when its spec (minMember, ...) is not the
 * one last written: created, or merge-patched when it exists (a new leader knows nothing of
 * what the last one wrote). A cluster that serves no PodGroup of that kind (the scheduler is
 * not installed) is said in the PodGroup condition, looked at again every half minute; the pods
 * are created all the same. */
static void ensure_podgroup(op *o, op_job *j, const edl_trainingjob *tj)
{
    const op_gang_api *api = op_gang_api_of(tj->sched.gang);
    if (!api)
        return;
    cJSON *spec = op_podgroup_spec(tj);
    char *want = edl_json_print(spec, false);
    if (want && j->pg_spec && !strcmp(want, j->pg_spec)) {
        free(want);
        cJSON_Delete(spec);
        return;
    }
    char *coll = edl_k8s_path(api->group, api->version, j->ns, api->plural, NULL, NULL);
    cJSON *pg = op_podgroup_new(tj);
    edl_k8s_reply r = {0};
    int rc = coll && pg ? edl_k8s_create(o->k, coll, pg, &r) : EDL_ENOMEM;
    if (rc == EDL_ECONFLICT && !strcmp(r.reason, "AlreadyExists")) {
        char *path = edl_k8s_path(api->group, api->version, j->ns, api->plural, j->name, NULL);
        cJSON *patch = cJSON_CreateObject();
        cJSON_AddItemToObject(patch, "spec", cJSON_Duplicate(spec, true));
        edl_k8s_reply_clear(&r);
        rc = path ? edl_k8s_merge_patch(o->k, path, patch, &r) : EDL_ENOMEM;
        cJSON_Delete(patch);
        free(path);
    }
    free(j->pg_missing);
    j->pg_missing = NULL;
    if (rc == 0) {
        free(j->pg_spec);
        j->pg_spec = want;
        want = NULL;
    } else if (rc == EDL_ENOTFOUND) {
        char msg[300];
        snprintf(msg, sizeof msg, "the cluster serves no %s PodGroup (is %s installed?): the "
                 "pods are created without their gang", api->api_version,
                 tj->sched.gang == EDL_GANG_VOLCANO ? "Volcano" : "the coscheduling plugin");
        j->pg_missing = strdup(msg);
        wake_in(j, 30000);
    } else {
        op_pass_failed(j, rc, "PodGroupFailed", OP_FAIL_OTHER, "cannot write PodGroup %s: %s",
                       j->name, r.message[0] ? r.message : edl_strerror(rc));
    }
    edl_k8s_reply_clear(&r);
    cJSON_Delete(pg);
    cJSON_Delete(spec);
    free(coll);
    free(want);
}

/* A job in Kueue's queue (the label kueue.x-k8s.io/queue-name) that has not started is
 * suspended before anything of it exists, and marked so (annotation edl.dev/queued): Kueue
 * admits it by setting suspend to false, and it is never suspended by us again. true: the job
 * was suspended now (the pass ends: its next one sees it). */
static bool queue_for_kueue(op *o, op_job *j, const edl_trainingjob *tj, const cJSON *obj)
{
    const cJSON *ann = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(obj, "metadata"), "annotations");
    if (!tj->sched.kueue_queue || tj->suspend ||
        cJSON_GetObjectItemCaseSensitive(ann, OP_QUEUED_ANNOTATION) ||
        edl_k8s_str(obj, "status.startTime"))
        return false;
    cJSON *patch = cJSON_CreateObject();
    cJSON *md = cJSON_AddObjectToObject(patch, "metadata");
    cJSON_AddStringToObject(md, "resourceVersion", edl_k8s_str(obj, "metadata.resourceVersion"));
    cJSON_AddStringToObject(cJSON_AddObjectToObject(md, "annotations"), OP_QUEUED_ANNOTATION,
                            tj->sched.kueue_queue);
    cJSON_AddBoolToObject(cJSON_AddObjectToObject(patch, "spec"), "suspend", true);
    char *path = tj_path(j, NULL);
    edl_k8s_reply r = {0};
    int rc = path ? edl_k8s_merge_patch(o->k, path, patch, &r) : EDL_ENOMEM;
    if (rc == 0) {
        post_event(o, obj, "Normal", "Queued", "suspended until Kueue's queue %s admits it",
                   tj->sched.kueue_queue);
        if (r.body) /* (replaces obj, freed now; no watch event will come for it) */
            edl_k8s_informer_store(o->tjs, r.body, false);
        wake_in(j, 0); /* the next pass reads it suspended and says so */
    } else {
        op_pass_failed(j, rc, "QueueFailed", OP_FAIL_OTHER, "cannot suspend the job for Kueue: "
                       "%s", r.message[0] ? r.message : edl_strerror(rc));
    }
    edl_k8s_reply_clear(&r);
    cJSON_Delete(patch);
    free(path);
    return true;
}

/* The Secret and the Service, then each role's pods (unless suspended: then none). The pod
 * failures of this pass are added to *pod_failures. */
static void manage_objects(op *o, op_job *j, const edl_trainingjob *tj, const cJSON *obj,
                           job_pods *pods, int *pod_failures)
{
    if (!j->have_secret)
        j->have_secret = ensure_owned(o, j, "Secret", op_secret_new(tj, &o->etcd_tls));
    if (!j->have_service)
        j->have_service = ensure_owned(o, j, "Service", op_service_new(tj));
    ensure_podgroup(o, j, tj);
    if (j->have_secret)
        *pod_failures += manage_pods(o, j, tj, obj, pods);
}

static void pass_valid(op *o, op_job *j, const cJSON *obj, const edl_trainingjob *tj,
                       const pod_index *idx)
{
    const char *end_reason = NULL, *end = recorded_end(obj, &end_reason);
    if (end)
        return pass_ended(o, j, obj, tj, idx, end, end_reason);
    if (queue_for_kueue(o, j, tj, obj))
        return;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(obj, "status");
    int64_t now = edl_wall_ms(), start_ms = 0, completion_ms = 0;
    const char *t = edl_k8s_str(st, "startTime");
    if (!t || edl_k8s_time_parse(t, &start_ms) != 0)
        start_ms = now;
    int pod_failures = (int)edl_k8s_int(st, "podFailures", 0);
    const char *op_failed = NULL;
    char msg[600] = "";
    if (tj->active_deadline_s > 0 && now - start_ms > tj->active_deadline_s * 1000) {
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
        manage_objects(o, j, tj, obj, &pods, &pod_failures);
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
        completion_ms = now;
        finish(o, j, tj, &pods, completion_ms);
    }
    int teacher_desired = edl_spec_desired_teachers(&tj->spec), teachers_ready = 0;
    if (teacher_desired > 0 && !final) {
        teachers_ready = teachers_registered(o, j, tj, teacher_desired);
        if (teachers_ready < 0) /* unknown: keep what the status said */
            teachers_ready = (int)edl_k8s_int(st, "teachers.ready", 0);
    }
    if (j->err_kind != OP_FAIL_CREATE && !j->deferred && j->have_secret && j->have_service) {
        free(j->create_error); /* everything asked was created (or nothing was to be) */
        j->create_error = NULL;
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
                 .objects_created = j->have_secret && j->have_service && !j->create_error,
                 .create_error = j->create_error, .create_reason = j->create_reason,
                 .error = j->err && j->err_kind != OP_FAIL_CREATE && j->err != EDL_ECONFLICT ?
                          j->err_msg : NULL,
                 .error_reason = j->err_reason,
                 .gang = tj->sched.gang != EDL_GANG_NONE && j->have_secret,
                 .podgroup_missing = j->pg_missing};
    announce(o, j, obj, &v, tj->spec.replicas);
    write_status(o, j, obj, &v);
    free(pods.p);
}

/* After a pass: one that failed is passed again after the limiter's wait (creations not
 * before then), and its error is announced by one Event per distinct error; one that did not
 * fail resets the limiter. */
static void settle(op *o, op_job *j)
{
    if (!j->err) {
        if (j->deferred) /* what failed was not tried again: still failing, for all we know */
            return;
        j->failures = 0;
        j->retry_ms = 0;
        j->retry_kind = OP_FAIL_NONE;
        free(j->reported_error);
        j->reported_error = NULL;
        return;
    }
    int64_t now = edl_monotonic_ms(), wait = op_backoff_ms(o, j, now);
    j->retry_ms = now + wait;
    j->retry_kind = j->err_kind;
    wake_in(j, wait);
    if (j->err == EDL_ECONFLICT || (j->reported_error && !strcmp(j->reported_error, j->err_msg)))
        return;
    EDL_WARN(LOG, "job %s/%s: %s (passing it again in %lld ms)", j->ns, j->name, j->err_msg,
             (long long)wait);
    const cJSON *obj = edl_k8s_informer_get(o->tjs, j->ns, j->name);
    if (obj)
        post_event(o, obj, "Warning", j->err_reason, "%s", j->err_msg);
    free(j->reported_error);
    j->reported_error = strdup(j->err_msg);
}

static void pass(op *o, op_job *j, const pod_index *idx)
{
    j->dirty = false;
    j->wake_ms = 0;
    j->err = 0;
    j->err_kind = OP_FAIL_NONE;
    j->deferred = false;
    o->m.reconciles++;
    const cJSON *obj = edl_k8s_informer_get(o->tjs, j->ns, j->name);
    if (!obj) { /* gone: its keys went with our finalizer (or it never had any) */
        op_job_drop(o, j);
        return;
    }
    int64_t generation = edl_k8s_int(obj, "metadata.generation", 0);
    if (generation != j->spec_generation) { /* an edit: a new chance for what failed */
        j->spec_generation = generation;
        j->retry_ms = 0;
        j->failures = 0;
    }
    edl_trainingjob tj;
    char field[256], err[512];
    int rc = edl_trainingjob_parse_bounded(obj, o->cfg->max_replicas, &tj, field, sizeof field,
                                           err, sizeof err);
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
    settle(o, j);
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
    for (size_t i = 0; i < o->n_jobs && edl_k8s_elector_leading(o->elector) && !o->stop;) {
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

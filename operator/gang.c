/* operator/gang.c: what a TrainingJob with spec.schedulingPolicy asks of a gang scheduler, as
 * Kubernetes objects (pure: no API calls; tested alone in test_operator_objects).
 *
 *   volcano            a scheduling.volcano.sh/v1beta1 PodGroup named after the job (minMember,
 *                      minResources, queue, priorityClassName); every pod annotated
 *                      scheduling.k8s.io/group-name and scheduled by "volcano";
 *   scheduler-plugins  a scheduling.x-k8s.io/v1alpha1 PodGroup (minMember, minResources,
 *                      scheduleTimeoutSeconds) of the coscheduling plugin; every pod labelled
 *                      scheduling.x-k8s.io/pod-group and scheduled by
 *                      "scheduler-plugins-scheduler".
 *
 * minMember is the pods the job needs at once (edl_trainingjob_min_available); minResources
 * the requests of that many pods of each role (a container's limits stand for requests it does
 * not give, as the API server defaults them). Growing above minMember needs no new gang; a job
 * below it is the ordinary elastic path. priorityClassName goes to every pod of every role. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/k8s.h"
#include "operator.h"

/* ---- resource quantities ----------------------------------------------------------------- */

/* A Kubernetes quantity ("500m", "2", "1.5Gi", "128974848", "1e3") in thousandths of its unit:
 * 0 and *milli, or -1 when it is none. */
static int quantity_milli(const char *s, double *milli)
{
    static const struct {
        const char *suffix;
        double factor;
    } units[] = {{"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", 1073741824.0},
                 {"Ti", 1099511627776.0}, {"Pi", 1125899906842624.0},
                 {"Ei", 1152921504606846976.0}, {"m", 1e-3}, {"k", 1e3}, {"M", 1e6},
                 {"G", 1e9}, {"T", 1e12}, {"P", 1e15}, {"E", 1e18}, {"", 1.0}};
    char *end;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v < 0)
        return -1;
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (strcmp(end, units[i].suffix) == 0) {
            *milli = v * units[i].factor * 1000.0;
            return 0;
        }
    return -1;
}

/* A quantity of milli thousandths, as the API server would print it back. */
static void quantity_format(double milli, char *buf, size_t len)
{
    double whole = round(milli / 1000.0);
    if (fabs(whole * 1000.0 - milli) < 0.5)
        snprintf(buf, len, "%.0f", whole);
    else
        snprintf(buf, len, "%.0fm", ceil(milli));
}

/* Add n pods' worth of the template's container requests to sums (resource name -> milli). */
static void add_requests(cJSON *sums, const cJSON *tmpl, int n)
{
    const cJSON *ctrs = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(tmpl, "spec"), "containers"), *c;
    cJSON_ArrayForEach(c, ctrs) {
        const cJSON *res = cJSON_GetObjectItemCaseSensitive(c, "resources");
        const cJSON *req = cJSON_GetObjectItemCaseSensitive(res, "requests");
        const cJSON *lim = cJSON_GetObjectItemCaseSensitive(res, "limits"), *q;
        for (int pass = 0; pass < 2; pass++) { /* requests, then limits standing for them */
            const cJSON *list = pass ? lim : req;
            cJSON_ArrayForEach(q, list) {
                double m;
                if ((pass && cJSON_GetObjectItemCaseSensitive(req, q->string)) ||
                    !cJSON_IsString(q) || quantity_milli(q->valuestring, &m) != 0)
                    continue;
                cJSON *sum = cJSON_GetObjectItemCaseSensitive(sums, q->string);
                if (!sum)
                    cJSON_AddNumberToObject(sums, q->string, m * n);
                else
                    cJSON_SetNumberValue(sum, sum->valuedouble + m * n);
            }
        }
    }
}

cJSON *op_gang_min_resources(const edl_trainingjob *tj)
{
    cJSON *sums = cJSON_CreateObject(), *out = cJSON_CreateObject(), *s;
    const edl_job_spec *sp = &tj->spec;
    add_requests(sums, tj->pod_template, sp->min);
    if (sp->ps_max > 0)
        add_requests(sums, tj->ps_template, sp->ps_min);
    if (sp->teachers_max > 0)
        add_requests(sums, tj->teacher_template, sp->teachers_min);
    cJSON_ArrayForEach(s, sums) {
        char q[64];
        quantity_format(s->valuedouble, q, sizeof q);
        cJSON_AddStringToObject(out, s->string, q);
    }
    cJSON_Delete(sums);
    return out;
}

/* ---- the PodGroup and the pods' marks ---------------------------------------------------- */

const op_gang_api *op_gang_api_of(edl_gang gang)
{
    static const op_gang_api volcano = {"scheduling.volcano.sh", "v1beta1",
                                        "scheduling.volcano.sh/v1beta1", "podgroups"};
    static const op_gang_api cosched = {"scheduling.x-k8s.io", "v1alpha1",
                                        "scheduling.x-k8s.io/v1alpha1", "podgroups"};
    return gang == EDL_GANG_VOLCANO ? &volcano : gang == EDL_GANG_COSCHEDULING ? &cosched : NULL;
}

cJSON *op_podgroup_spec(const edl_trainingjob *tj)
{
    const edl_scheduling *s = &tj->sched;
    cJSON *spec = cJSON_CreateObject();
    cJSON_AddNumberToObject(spec, "minMember", edl_trainingjob_min_available(tj));
    cJSON *res = op_gang_min_resources(tj);
    if (cJSON_GetArraySize(res) > 0)
        cJSON_AddItemToObject(spec, "minResources", res);
    else
        cJSON_Delete(res);
    if (s->gang == EDL_GANG_VOLCANO && s->queue)
        cJSON_AddStringToObject(spec, "queue", s->queue);
    if (s->gang == EDL_GANG_VOLCANO && s->priority_class)
        cJSON_AddStringToObject(spec, "priorityClassName", s->priority_class);
    if (s->gang == EDL_GANG_COSCHEDULING && s->schedule_timeout_s > 0)
        cJSON_AddNumberToObject(spec, "scheduleTimeoutSeconds", (double)s->schedule_timeout_s);
    return spec;
}

cJSON *op_podgroup_new(const edl_trainingjob *tj)
{
    const op_gang_api *api = op_gang_api_of(tj->sched.gang);
    if (!api)
        return NULL;
    cJSON *pg = cJSON_CreateObject();
    cJSON_AddStringToObject(pg, "apiVersion", api->api_version);
    cJSON_AddStringToObject(pg, "kind", "PodGroup");
    cJSON_AddItemToObject(pg, "metadata", op_owned_metadata(tj, tj->name, NULL));
    cJSON_AddItemToObject(pg, "spec", op_podgroup_spec(tj));
    return pg;
}

static void set_str(cJSON *obj, const char *key, const char *v)
{
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
    cJSON_AddStringToObject(obj, key, v);
}

static cJSON *object_of(cJSON *obj, const char *key)
{
    cJSON *o = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsObject(o)) {
        cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
        o = cJSON_AddObjectToObject(obj, key);
    }
    return o;
}

void op_pod_schedule(cJSON *pod, const edl_trainingjob *tj)
{
    cJSON *md = object_of(pod, "metadata"), *spec = object_of(pod, "spec");
    const char *sched = edl_trainingjob_scheduler_name(tj);
    if (sched)
        set_str(spec, "schedulerName", sched);
    if (tj->sched.priority_class)
        set_str(spec, "priorityClassName", tj->sched.priority_class);
    if (tj->sched.gang == EDL_GANG_VOLCANO)
        set_str(object_of(md, "annotations"), OP_VOLCANO_GROUP_ANNOTATION, tj->name);
    else if (tj->sched.gang == EDL_GANG_COSCHEDULING)
        set_str(object_of(md, "labels"), OP_COSCHED_GROUP_LABEL, tj->name);
}

bool op_pod_preempted(const cJSON *pod)
{
    static const char *const reasons[] = {"Preempting", "Preempted", "Evicted", NULL};
    const char *reason = edl_k8s_str(pod, "status.reason");
    for (const char *const *r = reasons; reason && *r; r++)
        if (strcmp(reason, *r) == 0)
            return true;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(
                              cJSON_GetObjectItemCaseSensitive(pod, "status"), "conditions")) {
        const char *type = edl_k8s_str(c, "type"), *st = edl_k8s_str(c, "status");
        if (type && st && !strcmp(type, "DisruptionTarget") && !strcmp(st, "True"))
            return true; /* preempted, evicted, or its node going: no fault of the trainer's */
    }
    return false;
}

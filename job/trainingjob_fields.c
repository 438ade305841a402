/* trainingjob_fields.c: the fields a TrainingJob may have (edl/trainingjob.h,
 * edl_trainingjob_unknown_field). The API server refuses a field that the CRD's structural
 * schema (deploy/k8s/crd.yaml) does not have wherever the schema closes an object (kubectl's
 * strict field validation); `edl run -f` reads files no server has seen, so it asks here and
 * refuses them the same way instead of running a typo's default. The lists below are the
 * schema's properties (test_trainingjob checks them against the CRD), plus ObjectMeta's for
 * metadata; the objects the schema leaves open (the pod templates' metadata, spec and
 * containers) and status are not looked into. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "edl/trainingjob.h"

static const char *const root_fields[] = {"apiVersion", "kind", "metadata", "spec", "status",
                                          NULL};
/* ObjectMeta: the API server's own type, closed as well */
static const char *const meta_fields[] = {
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels",
    "annotations", "ownerReferences", "finalizers", "managedFields", NULL};
static const char *const spec_fields[] = {
    "replicas", "minReplicas", "maxReplicas", "suspend", "cleanPodPolicy",
    "ttlSecondsAfterFinished", "activeDeadlineSeconds", "elastic", "checkpoint", "template", "ps",
    "teachers", "schedulingPolicy", NULL};
static const char *const scheduling_fields[] = {
    "scheduler", "schedulerName", "minAvailable", "queue", "priorityClass",
    "scheduleTimeoutSeconds", NULL};
static const char *const elastic_fields[] = {
    "mode", "settleWindow", "leaseTTLSeconds", "restartPolicy", "maxRestarts", "failFast",
    "permanentExitCodes", "progressTimeout", "exclusion", NULL};
static const char *const exclusion_fields[] = {"afterFailures", "cooldown", "maxCooldown", NULL};
static const char *const checkpoint_fields[] = {"uri", NULL};
static const char *const template_fields[] = {"metadata", "spec", NULL};
static const char *const ps_fields[] = {"replicas", "minReplicas", "maxReplicas", "template",
                                        NULL};
static const char *const teachers_fields[] = {"replicas", "minReplicas", "maxReplicas",
                                              "service",  "model",       "capacity",
                                              "template", NULL};

/* The objects the schema closes, by path, and the fields each may hold. */
static const struct {
    const char *path;
    const char *const *fields;
} closed[] = {
    {"", root_fields},
    {"metadata", meta_fields},
    {"spec", spec_fields},
    {"spec.elastic", elastic_fields},
    {"spec.elastic.exclusion", exclusion_fields},
    {"spec.checkpoint", checkpoint_fields},
    {"spec.template", template_fields},
    {"spec.ps", ps_fields},
    {"spec.ps.template", template_fields},
    {"spec.teachers", teachers_fields},
    {"spec.teachers.template", template_fields},
    {"spec.schedulingPolicy", scheduling_fields},
};

static const char *const *fields_of(const char *path)
{
    for (size_t i = 0; i < sizeof closed / sizeof *closed; i++)
        if (strcmp(closed[i].path, path) == 0)
            return closed[i].fields;
    return NULL;
}

/* Edits (insert, delete, replace) from a to b when at most budget, else budget + 1. */
static int edits(const char *a, const char *b, int budget)
{
    while (*a && *a == *b)
        a++, b++;
    if (!*a || !*b) {
        size_t rest = strlen(a) + strlen(b);
        return rest > (size_t)budget ? budget + 1 : (int)rest;
    }
    if (budget == 0)
        return 1;
    int best = budget + 1;
    int tries[3] = {edits(a + 1, b, budget - 1), edits(a, b + 1, budget - 1),
                    edits(a + 1, b + 1, budget - 1)};
    for (int i = 0; i < 3; i++)
        if (tries[i] + 1 < best)
            best = tries[i] + 1;
    return best;
}

/* A known field the unknown one is probably meant to be: the same but for case, or at most two
 * edits away. NULL: none. */
static const char *near_field(const char *const *fields, const char *name)
{
    for (const char *const *f = fields; *f; f++)
        if (strcasecmp(*f, name) == 0)
            return *f;
    for (const char *const *f = fields; *f; f++)
        if (strlen(*f) > 3 && edits(*f, name, 2) <= 2)
            return *f;
    return NULL;
}

static int unknown_in(const cJSON *obj, const char *path, char *field, size_t fieldlen,
                      char *err, size_t errlen)
{
    const char *const *fields = fields_of(path);
    if (!fields || !cJSON_IsObject(obj))
        return 0; /* open, or of the wrong type (the reader says so) */
    for (const cJSON *it = obj->child; it; it = it->next) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", it->string);
        bool known = false;
        for (const char *const *f = fields; *f && !known; f++)
            known = strcmp(*f, it->string) == 0;
        if (!known) {
            const char *near = near_field(fields, it->string);
            snprintf(field, fieldlen, "%s", sub);
            snprintf(err, errlen, "unknown field \"%s\"%s%s%s", sub, near ? "; did you mean \"" :
                     " (a TrainingJob has no such field: deploy/k8s/crd.yaml)", near ? near : "",
                     near ? "\"?" : "");
            return EDL_ECONFIG;
        }
        int rc = unknown_in(it, sub, field, fieldlen, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

int edl_trainingjob_unknown_field(const cJSON *obj, char *field, size_t fieldlen, char *err,
                                  size_t errlen)
{
    char f[256], e[512];
    int rc = unknown_in(obj, "", f, sizeof f, e, sizeof e);
    if (field && fieldlen)
        snprintf(field, fieldlen, "%s", rc ? f : "");
    if (err && errlen && rc)
        snprintf(err, errlen, "%s", e);
    return rc;
}

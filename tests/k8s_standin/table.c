/* table.c: the meta.k8s.io/v1 Table that `kubectl get` asks for (Accept: ...;as=Table): Name
 * and Age for most kinds, NAME READY STATUS RESTARTS AGE (+ wide columns) for pods, and Name
 * plus the CRD's additionalPrinterColumns for custom resources (type date as an age, as the
 * real server's CR table converter does). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

static void column(cJSON *cols, const char *name, const char *type, const char *format,
                   const char *desc, int priority)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "name", name);
    cJSON_AddStringToObject(c, "type", type);
    cJSON_AddStringToObject(c, "format", format ? format : "");
    cJSON_AddStringToObject(c, "description", desc ? desc : "");
    cJSON_AddNumberToObject(c, "priority", priority);
    cJSON_AddItemToArray(cols, c);
}

static cJSON *columns_of(const si_resource *r)
{
    cJSON *cols = cJSON_CreateArray(), *c;
    column(cols, "Name", "string", "name", "Name must be unique within a namespace.", 0);
    if (r->table == SI_TABLE_POD) {
        column(cols, "Ready", "string", "", "The aggregate readiness state of this pod for accepting traffic.", 0);
        column(cols, "Status", "string", "", "The aggregate status of the containers in this pod.", 0);
        column(cols, "Restarts", "string", "", "The number of times the containers in this pod have been restarted.", 0);
        column(cols, "Age", "string", "", "CreationTimestamp of the object.", 0);
        column(cols, "IP", "string", "", "IP address allocated to the pod.", 1);
        column(cols, "Node", "string", "", "Name of the node this pod is assigned to.", 1);
        column(cols, "Nominated Node", "string", "", "Name of the node the pod is nominated to.", 1);
        column(cols, "Readiness Gates", "string", "", "Pod readiness gates.", 1);
    } else if (r->table == SI_TABLE_CR && cJSON_GetArraySize(r->columns)) {
        cJSON_ArrayForEach(c, r->columns)
        {
            const cJSON *p = cJSON_GetObjectItem(c, "priority");
            column(cols, si_str(c, "name") ? si_str(c, "name") : "", si_str(c, "type") ? si_str(c, "type") : "string",
                   si_str(c, "format"), si_str(c, "description"), cJSON_IsNumber(p) ? p->valueint : 0);
        }
    } else if (!r->is_crd && !strcmp(r->plural, "customresourcedefinitions")) {
        column(cols, "Created At", "date", "", "", 0);
    } else {
        if (!r->is_crd && !strcmp(r->plural, "namespaces"))
            column(cols, "Status", "string", "", "The status of the namespace", 0);
        column(cols, "Age", r->is_crd ? "date" : "string", "", "CreationTimestamp of the object.", 0);
    }
    return cols;
}

static cJSON *age_cell(const cJSON *obj)
{
    char age[32];
    time_t t = si_parse_time(si_str(obj, "metadata.creationTimestamp"));
    if (t < 0)
        return cJSON_CreateString("<unknown>");
    si_age(t, age, sizeof age);
    return cJSON_CreateString(age);
}

/* The STATUS word kubectl shows for a pod (a condensed printPod). */
static const char *pod_reason(const cJSON *pod, int *ready, int *total, long *restarts)
{
    const char *reason = si_str(pod, "status.reason");
    if (!reason)
        reason = si_str(pod, "status.phase") ? si_str(pod, "status.phase") : "Pending";
    const cJSON *cs;
    *ready = *total = 0;
    *restarts = 0;
    cJSON_ArrayForEach(cs, si_get(pod, "status.containerStatuses"))
    {
        const cJSON *rc = cJSON_GetObjectItem(cs, "restartCount");
        *restarts += cJSON_IsNumber(rc) ? (long)rc->valuedouble : 0;
        if (si_str(cs, "state.waiting.reason") && *si_str(cs, "state.waiting.reason"))
            reason = si_str(cs, "state.waiting.reason");
        else if (si_str(cs, "state.terminated.reason") && *si_str(cs, "state.terminated.reason"))
            reason = si_str(cs, "state.terminated.reason");
        if (cJSON_IsTrue(cJSON_GetObjectItem(cs, "ready")) && si_get(cs, "state.running"))
            (*ready)++;
    }
    *total = cJSON_GetArraySize(si_get(pod, "spec.containers"));
    if (si_get(pod, "metadata.deletionTimestamp"))
        reason = "Terminating";
    return reason;
}

static void pod_cells(cJSON *cells, const cJSON *pod)
{
    int ready, total;
    long restarts;
    char buf[64];
    const char *reason = pod_reason(pod, &ready, &total, &restarts);
    snprintf(buf, sizeof buf, "%d/%d", ready, total);
    cJSON_AddItemToArray(cells, cJSON_CreateString(buf));
    cJSON_AddItemToArray(cells, cJSON_CreateString(reason));
    snprintf(buf, sizeof buf, "%ld", restarts);
    cJSON_AddItemToArray(cells, cJSON_CreateString(buf));
    cJSON_AddItemToArray(cells, age_cell(pod));
    const char *ip = si_str(pod, "status.podIP"), *node = si_str(pod, "spec.nodeName");
    cJSON_AddItemToArray(cells, cJSON_CreateString(ip ? ip : "<none>"));
    cJSON_AddItemToArray(cells, cJSON_CreateString(node ? node : "<none>"));
    cJSON_AddItemToArray(cells, cJSON_CreateString("<none>"));
    cJSON_AddItemToArray(cells, cJSON_CreateString("<none>"));
}

static cJSON *cr_cell(const cJSON *col, const cJSON *obj)
{
    const char *type = si_str(col, "type"), *path = si_str(col, "jsonPath");
    const cJSON *v = path ? si_get(obj, path) : NULL;
    if (!v || cJSON_IsNull(v))
        return cJSON_CreateNull();
    if (type && !strcmp(type, "date")) {
        char age[32];
        time_t t = si_parse_time(cJSON_IsString(v) ? v->valuestring : NULL);
        if (t < 0)
            return cJSON_CreateString("<invalid>");
        si_age(t, age, sizeof age);
        return cJSON_CreateString(age);
    }
    if (type && !strcmp(type, "string") && !cJSON_IsString(v)) {
        char *s = cJSON_PrintUnformatted(v);
        cJSON *c = cJSON_CreateString(s ? s : "");
        free(s);
        return c;
    }
    if (type && (!strcmp(type, "integer") || !strcmp(type, "number")) && !cJSON_IsNumber(v))
        return cJSON_CreateNull();
    return cJSON_Duplicate(v, true);
}

static cJSON *cells_of(const si_resource *r, const cJSON *obj)
{
    cJSON *cells = cJSON_CreateArray(), *c;
    const char *name = si_str(obj, "metadata.name");
    cJSON_AddItemToArray(cells, cJSON_CreateString(name ? name : ""));
    if (r->table == SI_TABLE_POD) {
        pod_cells(cells, obj);
    } else if (r->table == SI_TABLE_CR && cJSON_GetArraySize(r->columns)) {
        cJSON_ArrayForEach(c, r->columns) cJSON_AddItemToArray(cells, cr_cell(c, obj));
    } else if (!r->is_crd && !strcmp(r->plural, "customresourcedefinitions")) {
        const char *ts = si_str(obj, "metadata.creationTimestamp");
        cJSON_AddItemToArray(cells, cJSON_CreateString(ts ? ts : ""));
    } else {
        if (!r->is_crd && !strcmp(r->plural, "namespaces")) {
            const char *phase = si_str(obj, "status.phase");
            cJSON_AddItemToArray(cells, cJSON_CreateString(phase ? phase : ""));
        }
        cJSON_AddItemToArray(cells, age_cell(obj));
    }
    return cells;
}

static cJSON *row_object(const cJSON *obj, int include)
{
    if (include == 2)
        return cJSON_Duplicate(obj, true);
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "kind", "PartialObjectMetadata");
    cJSON_AddStringToObject(p, "apiVersion", "meta.k8s.io/v1");
    cJSON_AddItemToObject(p, "metadata", cJSON_Duplicate(cJSON_GetObjectItem(obj, "metadata"), true));
    return p;
}

cJSON *si_table(si_resource *r, const cJSON *objs, const char *rv, int include, bool columns)
{
    cJSON *t = cJSON_CreateObject(), *rows;
    const cJSON *o;
    cJSON_AddStringToObject(t, "kind", "Table");
    cJSON_AddStringToObject(t, "apiVersion", "meta.k8s.io/v1");
    cJSON *meta = cJSON_AddObjectToObject(t, "metadata");
    if (rv)
        cJSON_AddStringToObject(meta, "resourceVersion", rv);
    cJSON_AddItemToObject(t, "columnDefinitions", columns ? columns_of(r) : cJSON_CreateArray());
    rows = cJSON_AddArrayToObject(t, "rows");
    cJSON_ArrayForEach(o, objs)
    {
        cJSON *row = cJSON_CreateObject();
        cJSON_AddItemToObject(row, "cells", cells_of(r, o));
        if (include)
            cJSON_AddItemToObject(row, "object", row_object(o, include));
        cJSON_AddItemToArray(rows, row);
    }
    return t;
}

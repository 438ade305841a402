/* status.c: results of the verbs and the metav1.Status objects that every error reply carries
 * (kind, apiVersion, metadata, status, message, reason, details, code), worded as the real
 * API server words them. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

cJSON *si_status_new(int code, const char *reason, const char *message)
{
    cJSON *st = cJSON_CreateObject();
    cJSON_AddStringToObject(st, "kind", "Status");
    cJSON_AddStringToObject(st, "apiVersion", "v1");
    cJSON_AddItemToObject(st, "metadata", cJSON_CreateObject());
    cJSON_AddStringToObject(st, "status", code < 400 ? "Success" : "Failure");
    if (message)
        cJSON_AddStringToObject(st, "message", message);
    if (reason && *reason)
        cJSON_AddStringToObject(st, "reason", reason);
    cJSON_AddItemToObject(st, "details", cJSON_CreateObject());
    cJSON_AddNumberToObject(st, "code", code);
    return st;
}

void si_qualified_kind(const si_resource *r, char *buf, size_t len)
{
    if (r->group[0])
        snprintf(buf, len, "%s.%s", r->kind, r->group);
    else
        snprintf(buf, len, "%s", r->kind);
}

void si_qualified_plural(const si_resource *r, char *buf, size_t len)
{
    if (r->group[0])
        snprintf(buf, len, "%s.%s", r->plural, r->group);
    else
        snprintf(buf, len, "%s", r->plural);
}

static void add_details(cJSON *st, const si_resource *r, const char *name, bool kind_is_plural)
{
    cJSON *d = cJSON_GetObjectItem(st, "details");
    if (name && *name)
        cJSON_AddStringToObject(d, "name", name);
    if (r) {
        if (r->group[0])
            cJSON_AddStringToObject(d, "group", r->group);
        cJSON_AddStringToObject(d, "kind", kind_is_plural ? r->plural : r->kind);
    }
}

si_result si_fail(int code, const char *reason, const si_resource *r, const char *name,
                  const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *st = si_status_new(code, reason, msg);
    /* NotFound, AlreadyExists and Conflict name the resource (plural); Invalid names the kind */
    add_details(st, r, name, code != 422);
    return (si_result){.code = code, .body = st};
}

si_result si_ok(int code, cJSON *body)
{
    return (si_result){.code = code, .body = body};
}

void si_cause(cJSON *causes, const char *reason, const char *field, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "reason", reason);
    cJSON_AddStringToObject(c, "message", msg);
    cJSON_AddStringToObject(c, "field", field);
    cJSON_AddItemToArray(causes, c);
}

/* 422 Invalid: `Kind.group "name" is invalid: [field: message, ...]`. Takes causes. */
si_result si_invalid(const si_resource *r, const char *name, cJSON *causes)
{
    char kind[300], msg[4096];
    si_qualified_kind(r, kind, sizeof kind);
    int n = cJSON_GetArraySize(causes);
    size_t off = (size_t)snprintf(msg, sizeof msg, "%s \"%s\" is invalid: %s", kind,
                                  name ? name : "", n > 1 ? "[" : "");
    int i = 0;
    for (cJSON *c = causes->child; c && off < sizeof msg; c = c->next, i++)
        off += (size_t)snprintf(msg + off, sizeof msg - off, "%s%s: %s", i ? ", " : "",
                                si_str(c, "field"), si_str(c, "message"));
    if (n > 1 && off < sizeof msg - 1)
        snprintf(msg + off, sizeof msg - off, "]");
    cJSON *st = si_status_new(422, "Invalid", msg);
    add_details(st, r, name, false);
    cJSON_AddItemToObject(cJSON_GetObjectItem(st, "details"), "causes", causes);
    return (si_result){.code = 422, .body = st};
}

void si_result_free(si_result *res)
{
    cJSON_Delete(res->body);
    free(res->warning);
    res->body = NULL;
    res->warning = NULL;
}

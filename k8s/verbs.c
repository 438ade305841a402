/* verbs.c: one call per API verb over edl_k8s_request, HTTP statuses mapped to EDL_E* codes,
 * and the REST paths of resources. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/json.h"
#include "internal.h"

int edl_k8s_status_code(long s)
{
    if (s >= 200 && s <= 299)
        return 0;
    switch (s) {
    case 0: return EDL_EUNAVAIL;
    case 400:
    case 422: return EDL_ECONFIG;
    case 401:
    case 403: return EDL_EAUTH;
    case 404: return EDL_ENOTFOUND;
    case 409: return EDL_ECONFLICT;
    case 410: return EDL_ECOMPACTED;
    case 413: return EDL_ETOOBIG;
    default: return EDL_ESERVER;
    }
}

/* A request whose reply the caller may not want: the status as a code. */
static int verb(edl_k8s *k, const char *method, const char *path, const char *ct, char *body,
                edl_k8s_reply *out)
{
    edl_k8s_reply r;
    int rc = edl_k8s_request(k, method, path, ct, body, &r);
    free(body);
    if (rc == 0)
        rc = edl_k8s_status_code(r.status);
    if (out)
        *out = r;
    else
        edl_k8s_reply_clear(&r);
    return rc;
}

static char *print(const cJSON *obj)
{
    return edl_json_print(obj, false);
}

int edl_k8s_get(edl_k8s *k, const char *path, edl_k8s_reply *out)
{
    return verb(k, "GET", path, NULL, NULL, out);
}

int edl_k8s_create(edl_k8s *k, const char *collection_path, const cJSON *obj, edl_k8s_reply *out)
{
    char *body = print(obj);
    if (out)
        memset(out, 0, sizeof *out);
    return body ? verb(k, "POST", collection_path, NULL, body, out) : EDL_EINVAL;
}

int edl_k8s_update(edl_k8s *k, const char *path, const cJSON *obj, edl_k8s_reply *out)
{
    char *body = print(obj);
    if (out)
        memset(out, 0, sizeof *out);
    return body ? verb(k, "PUT", path, NULL, body, out) : EDL_EINVAL;
}

int edl_k8s_merge_patch(edl_k8s *k, const char *path, const cJSON *patch, edl_k8s_reply *out)
{
    char *body = print(patch);
    if (out)
        memset(out, 0, sizeof *out);
    return body ? verb(k, "PATCH", path, "application/merge-patch+json", body, out) : EDL_EINVAL;
}

int edl_k8s_delete(edl_k8s *k, const char *path, const char *propagation, int64_t grace_s,
                   edl_k8s_reply *out)
{
    char *body = NULL;
    if (propagation || grace_s >= 0) {
        cJSON *o = cJSON_CreateObject();
        bool ok = o && cJSON_AddStringToObject(o, "kind", "DeleteOptions") &&
                  cJSON_AddStringToObject(o, "apiVersion", "v1");
        if (ok && propagation)
            ok = cJSON_AddStringToObject(o, "propagationPolicy", propagation) != NULL;
        if (ok && grace_s >= 0)
            ok = cJSON_AddNumberToObject(o, "gracePeriodSeconds", (double)grace_s) != NULL;
        body = ok ? edl_json_print(o, false) : NULL;
        cJSON_Delete(o);
        if (!body) {
            if (out)
                memset(out, 0, sizeof *out);
            return EDL_ENOMEM;
        }
    }
    return verb(k, "DELETE", path, NULL, body, out);
}

char *edl_k8s_path(const char *group, const char *version, const char *ns, const char *plural,
                   const char *name, const char *sub)
{
    if (!version || !plural)
        return NULL;
    bool core = !group || !group[0];
    size_t n = 32 + (core ? 0 : strlen(group)) + strlen(version) + (ns ? strlen(ns) : 0) +
               strlen(plural) + (name ? strlen(name) : 0) + (sub ? strlen(sub) : 0);
    char *p = malloc(n);
    if (!p)
        return NULL;
    int o = core ? snprintf(p, n, "/api/%s", version) : snprintf(p, n, "/apis/%s/%s", group, version);
    if (ns)
        o += snprintf(p + o, n - (size_t)o, "/namespaces/%s", ns);
    o += snprintf(p + o, n - (size_t)o, "/%s", plural);
    if (name)
        o += snprintf(p + o, n - (size_t)o, "/%s", name);
    if (name && sub)
        snprintf(p + o, n - (size_t)o, "/%s", sub);
    return p;
}

/* resources.c: which resources k8s-standin serves (the built-in ones, and one per served
 * version of every CustomResourceDefinition), and the documents that describe them: legacy
 * discovery (/api, /api/v1, /apis, /apis/<group>[/<version>]) and a minimal OpenAPI v3 that
 * tells kubectl each PATCH takes ?fieldValidation (so kubectl validates on the server side). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

typedef struct builtin {
    const char *group, *version, *plural, *singular, *kind, *shorts, *cats;
    bool namespaced, status;
} builtin;

static const builtin BUILTINS[] = {
    {"", "v1", "namespaces", "namespace", "Namespace", "ns", "", false, true},
    {"", "v1", "pods", "pod", "Pod", "po", "all", true, true},
    {"", "v1", "services", "service", "Service", "svc", "all", true, true},
    {"", "v1", "secrets", "secret", "Secret", "", "", true, false},
    {"", "v1", "configmaps", "configmap", "ConfigMap", "cm", "", true, false},
    {"", "v1", "events", "event", "Event", "ev", "", true, false},
    {"", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount", "sa", "", true, false},
    {"", "v1", "nodes", "node", "Node", "no", "", false, true},
    {"", "v1", "persistentvolumes", "persistentvolume", "PersistentVolume", "pv", "", false, true},
    {"", "v1", "persistentvolumeclaims", "persistentvolumeclaim", "PersistentVolumeClaim", "pvc",
     "", true, true},
    {"coordination.k8s.io", "v1", "leases", "lease", "Lease", "", "", true, false},
    {"apiextensions.k8s.io", "v1", "customresourcedefinitions", "customresourcedefinition",
     "CustomResourceDefinition", "crd,crds", "api-extensions", false, true},
    {"apps", "v1", "deployments", "deployment", "Deployment", "deploy", "all", true, true},
    {"apps", "v1", "statefulsets", "statefulset", "StatefulSet", "sts", "all", true, true},
    {"policy", "v1", "poddisruptionbudgets", "poddisruptionbudget", "PodDisruptionBudget", "pdb",
     "", true, true},
    {"rbac.authorization.k8s.io", "v1", "roles", "role", "Role", "", "", true, false},
    {"rbac.authorization.k8s.io", "v1", "rolebindings", "rolebinding", "RoleBinding", "", "", true,
     false},
    {"rbac.authorization.k8s.io", "v1", "clusterroles", "clusterrole", "ClusterRole", "", "",
     false, false},
    {"rbac.authorization.k8s.io", "v1", "clusterrolebindings", "clusterrolebinding",
     "ClusterRoleBinding", "", "", false, false},
};

static void copy(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src ? src : "");
}

static void add_words(const char *csv, char out[][32], int *n, int max)
{
    char buf[128];
    copy(buf, sizeof buf, csv);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && *n < max;
         t = strtok_r(NULL, ",", &save))
        copy(out[(*n)++], 32, t);
}

static si_resource *add_resource(si_store *s, const char *group, const char *version,
                                 const char *plural)
{
    si_resource *r = calloc(1, sizeof *r), **pp = &s->resources;
    copy(r->group, sizeof r->group, group);
    copy(r->version, sizeof r->version, version);
    copy(r->plural, sizeof r->plural, plural);
    while (*pp)
        pp = &(*pp)->next;
    *pp = r; /* in order: discovery lists them as they came */
    return r;
}

int si_resources_init(si_server *srv)
{
    for (size_t i = 0; i < sizeof BUILTINS / sizeof BUILTINS[0]; i++) {
        const builtin *b = &BUILTINS[i];
        si_resource *r = add_resource(&srv->store, b->group, b->version, b->plural);
        copy(r->singular, sizeof r->singular, b->singular);
        copy(r->kind, sizeof r->kind, b->kind);
        snprintf(r->list_kind, sizeof r->list_kind, "%sList", b->kind);
        add_words(b->shorts, r->short_names, &r->n_short, 8);
        add_words(b->cats, r->categories, &r->n_cat, 4);
        r->namespaced = b->namespaced;
        r->has_status = b->status;
        r->served = true;
        r->has_log = !strcmp(b->plural, "pods");
        r->table = r->has_log ? SI_TABLE_POD : SI_TABLE_GENERIC;
    }
    return 0;
}

si_resource *si_resource_find(si_store *s, const char *group, const char *version,
                              const char *plural)
{
    for (si_resource *r = s->resources; r; r = r->next)
        if (r->served && !strcmp(r->group, group) && !strcmp(r->version, version) &&
            !strcmp(r->plural, plural))
            return r;
    return NULL;
}

si_resource *si_builtin(si_store *s, const char *group, const char *plural)
{
    return si_resource_find(s, group, group[0] ? "v1" : "v1", plural);
}

void si_api_version(const si_resource *r, char *buf, size_t len)
{
    if (r->group[0])
        snprintf(buf, len, "%s/%s", r->group, r->version);
    else
        snprintf(buf, len, "%s", r->version);
}

si_resource *si_resource_by_kind(si_store *s, const char *api_version, const char *kind)
{
    char av[300];
    for (si_resource *r = s->resources; r && api_version && kind; r = r->next) {
        si_api_version(r, av, sizeof av);
        if (r->served && !strcmp(av, api_version) && !strcmp(r->kind, kind))
            return r;
    }
    return NULL;
}

static void sync_version(si_store *s, const cJSON *crd, const cJSON *v, bool served)
{
    const cJSON *names = si_get(crd, "spec.names");
    const char *group = si_str(crd, "spec.group"), *plural = si_str(names, "plural");
    const char *version = si_str(v, "name");
    if (!group || !plural || !version)
        return;
    si_resource *r = NULL;
    for (si_resource *x = s->resources; x; x = x->next)
        if (x->is_crd && !strcmp(x->group, group) && !strcmp(x->version, version) &&
            !strcmp(x->plural, plural))
            r = x;
    if (!r)
        r = add_resource(s, group, version, plural);
    r->is_crd = true;
    r->served = served && !cJSON_IsFalse(cJSON_GetObjectItem(v, "served"));
    copy(r->crd_name, sizeof r->crd_name, si_str(crd, "metadata.name"));
    copy(r->kind, sizeof r->kind, si_str(names, "kind"));
    copy(r->singular, sizeof r->singular, si_str(names, "singular"));
    if (!r->singular[0]) {
        copy(r->singular, sizeof r->singular, r->kind);
        for (char *p = r->singular; *p; p++)
            *p = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
    }
    snprintf(r->list_kind, sizeof r->list_kind, "%s",
             si_str(names, "listKind") ? si_str(names, "listKind") : "");
    if (!r->list_kind[0])
        snprintf(r->list_kind, sizeof r->list_kind, "%sList", r->kind);
    r->namespaced = !si_str(crd, "spec.scope") || strcmp(si_str(crd, "spec.scope"), "Cluster");
    r->n_short = r->n_cat = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(names, "shortNames")) if (cJSON_IsString(it) &&
                                                                        r->n_short < 8)
        copy(r->short_names[r->n_short++], 32, it->valuestring);
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(names, "categories")) if (cJSON_IsString(it) &&
                                                                        r->n_cat < 4)
        copy(r->categories[r->n_cat++], 32, it->valuestring);
    r->has_status = si_get(v, "subresources.status") != NULL;
    const cJSON *scale = si_get(v, "subresources.scale");
    r->has_scale = scale != NULL;
    copy(r->spec_replicas, sizeof r->spec_replicas, si_str(scale, "specReplicasPath"));
    copy(r->status_replicas, sizeof r->status_replicas, si_str(scale, "statusReplicasPath"));
    copy(r->selector_path, sizeof r->selector_path, si_str(scale, "labelSelectorPath"));
    cJSON_Delete(r->schema);
    cJSON_Delete(r->columns);
    r->schema = cJSON_Duplicate(si_get(v, "schema.openAPIV3Schema"), true);
    r->columns = cJSON_Duplicate(cJSON_GetObjectItem(v, "additionalPrinterColumns"), true);
    r->table = SI_TABLE_CR;
}

void si_crd_sync(si_store *s, const cJSON *crd, bool served)
{
    const cJSON *v;
    cJSON_ArrayForEach(v, si_get(crd, "spec.versions")) sync_version(s, crd, v, served);
    /* versions dropped from the CRD stop being served */
    for (si_resource *r = s->resources; r; r = r->next) {
        if (!r->is_crd || strcmp(r->crd_name, si_str(crd, "metadata.name")))
            continue;
        bool listed = false;
        cJSON_ArrayForEach(v, si_get(crd, "spec.versions")) if (si_str(v, "name") &&
                                                               !strcmp(si_str(v, "name"),
                                                                       r->version)) listed = true;
        if (!listed)
            r->served = false;
    }
}

/* ---- discovery ---------------------------------------------------------------------------- */

static cJSON *strings(const char *const *v, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateString(v[i]));
    return a;
}

static cJSON *resource_entry(const si_resource *r, const char *sub)
{
    static const char *const all[] = {"create", "delete", "deletecollection", "get",
                                      "list",   "patch",  "update",           "watch"};
    static const char *const subverbs[] = {"get", "patch", "update"};
    char name[300];
    snprintf(name, sizeof name, "%s%s%s", r->plural, sub ? "/" : "", sub ? sub : "");
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", name);
    cJSON_AddStringToObject(e, "singularName", sub ? "" : r->singular);
    cJSON_AddBoolToObject(e, "namespaced", r->namespaced);
    if (sub && !strcmp(sub, "scale")) {
        cJSON_AddStringToObject(e, "group", "autoscaling");
        cJSON_AddStringToObject(e, "version", "v1");
    }
    cJSON_AddStringToObject(e, "kind", sub && !strcmp(sub, "scale") ? "Scale" : r->kind);
    if (sub && !strcmp(sub, "log"))
        cJSON_AddItemToObject(e, "verbs", strings(subverbs, 1));
    else
        cJSON_AddItemToObject(e, "verbs", sub ? strings(subverbs, 3) : strings(all, 8));
    if (!sub && r->n_short) {
        const char *v[8];
        for (int i = 0; i < r->n_short; i++)
            v[i] = r->short_names[i];
        cJSON_AddItemToObject(e, "shortNames", strings(v, r->n_short));
    }
    if (!sub && r->n_cat) {
        const char *v[4];
        for (int i = 0; i < r->n_cat; i++)
            v[i] = r->categories[i];
        cJSON_AddItemToObject(e, "categories", strings(v, r->n_cat));
    }
    return e;
}

static cJSON *resource_list(si_store *s, const char *group, const char *version, bool *found)
{
    cJSON *list = cJSON_CreateObject(), *res = cJSON_CreateArray();
    char gv[300];
    snprintf(gv, sizeof gv, "%s%s%s", group, group[0] ? "/" : "", version);
    cJSON_AddStringToObject(list, "kind", "APIResourceList");
    cJSON_AddStringToObject(list, "apiVersion", "v1");
    cJSON_AddStringToObject(list, "groupVersion", gv);
    for (si_resource *r = s->resources; r; r = r->next) {
        if (!r->served || strcmp(r->group, group) || strcmp(r->version, version))
            continue;
        *found = true;
        cJSON_AddItemToArray(res, resource_entry(r, NULL));
        if (r->has_status)
            cJSON_AddItemToArray(res, resource_entry(r, "status"));
        if (r->has_scale)
            cJSON_AddItemToArray(res, resource_entry(r, "scale"));
        if (r->has_log)
            cJSON_AddItemToArray(res, resource_entry(r, "log"));
    }
    cJSON_AddItemToObject(list, "resources", res);
    return list;
}

static bool seen_before(si_store *s, si_resource *upto, const char *group, const char *version)
{
    for (si_resource *r = s->resources; r != upto; r = r->next)
        if (r->served && !strcmp(r->group, group) && (!version || !strcmp(r->version, version)))
            return true;
    return false;
}

/* One APIGroup: its served versions in the order they were added, the first preferred. */
static cJSON *api_group(si_store *s, const char *group)
{
    cJSON *g = cJSON_CreateObject(), *versions = cJSON_CreateArray(), *pref = NULL;
    cJSON_AddStringToObject(g, "name", group);
    for (si_resource *r = s->resources; r; r = r->next) {
        if (!r->served || strcmp(r->group, group) || seen_before(s, r, group, r->version))
            continue;
        cJSON *v = cJSON_CreateObject();
        char gv[300];
        snprintf(gv, sizeof gv, "%s/%s", group, r->version);
        cJSON_AddStringToObject(v, "groupVersion", gv);
        cJSON_AddStringToObject(v, "version", r->version);
        if (!pref)
            pref = cJSON_Duplicate(v, true);
        cJSON_AddItemToArray(versions, v);
    }
    cJSON_AddItemToObject(g, "versions", versions);
    cJSON_AddItemToObject(g, "preferredVersion", pref ? pref : cJSON_CreateObject());
    return g;
}

static cJSON *group_list(si_store *s)
{
    cJSON *list = cJSON_CreateObject(), *groups = cJSON_CreateArray();
    cJSON_AddStringToObject(list, "kind", "APIGroupList");
    cJSON_AddStringToObject(list, "apiVersion", "v1");
    for (si_resource *r = s->resources; r; r = r->next)
        if (r->served && r->group[0] && !seen_before(s, r, r->group, NULL))
            cJSON_AddItemToArray(groups, api_group(s, r->group));
    cJSON_AddItemToObject(list, "groups", groups);
    return list;
}

cJSON *si_discovery(si_store *s, const char *path, bool *found)
{
    char group[128] = "", version[64] = "";
    *found = true;
    if (!strcmp(path, "/api")) {
        cJSON *v = cJSON_CreateObject();
        static const char *const one[] = {"v1"};
        cJSON_AddStringToObject(v, "kind", "APIVersions");
        cJSON_AddItemToObject(v, "versions", strings(one, 1));
        cJSON_AddItemToObject(v, "serverAddressByClientCIDRs", cJSON_CreateArray());
        return v;
    }
    if (!strcmp(path, "/apis"))
        return group_list(s);
    *found = false;
    if (!strcmp(path, "/api/v1"))
        return resource_list(s, "", "v1", found);
    int n = 0;
    if (sscanf(path, "/apis/%127[^/]/%63[^/]%n", group, version, &n) == 2 && !path[n])
        return resource_list(s, group, version, found);
    n = 0;
    if (sscanf(path, "/apis/%127[^/]%n", group, &n) == 1 && !path[n]) {
        for (si_resource *r = s->resources; r; r = r->next)
            if (r->served && !strcmp(r->group, group)) {
                cJSON *g = api_group(s, group);
                cJSON_AddStringToObject(g, "kind", "APIGroup");
                cJSON_AddStringToObject(g, "apiVersion", "v1");
                *found = true;
                return g;
            }
    }
    return NULL;
}

/* ---- OpenAPI v3 (just enough for kubectl's server-side field validation check) ------------ */

static unsigned gv_hash(si_store *s, const char *group, const char *version)
{
    unsigned h = 2166136261u;
    for (si_resource *r = s->resources; r; r = r->next)
        if (r->served && !strcmp(r->group, group) && !strcmp(r->version, version))
            for (const char *p = r->plural; *p; p++)
                h = (h ^ (unsigned char)*p) * 16777619u;
    return h;
}

static cJSON *openapi_root(si_store *s)
{
    cJSON *root = cJSON_CreateObject(), *paths = cJSON_AddObjectToObject(root, "paths");
    for (si_resource *r = s->resources; r; r = r->next) {
        char key[300], url[400];
        if (!r->served || seen_before(s, r, r->group, r->version))
            continue;
        if (r->group[0])
            snprintf(key, sizeof key, "apis/%s/%s", r->group, r->version);
        else
            snprintf(key, sizeof key, "api/%s", r->version);
        snprintf(url, sizeof url, "/openapi/v3/%s?hash=%08X", key, gv_hash(s, r->group, r->version));
        cJSON *e = cJSON_AddObjectToObject(paths, key);
        cJSON_AddStringToObject(e, "serverRelativeURL", url);
    }
    return root;
}

static cJSON *patch_operation(const si_resource *r)
{
    cJSON *op = cJSON_CreateObject(), *gvk = cJSON_AddObjectToObject(op, "x-kubernetes-group-version-kind");
    cJSON_AddStringToObject(gvk, "group", r->group);
    cJSON_AddStringToObject(gvk, "version", r->version);
    cJSON_AddStringToObject(gvk, "kind", r->kind);
    cJSON *params = cJSON_AddArrayToObject(op, "parameters");
    static const char *const names[] = {"dryRun", "fieldManager", "fieldValidation", "force"};
    for (size_t i = 0; i < 4; i++) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "name", names[i]);
        cJSON_AddStringToObject(p, "in", "query");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(p, "schema"), "type", "string");
        cJSON_AddItemToArray(params, p);
    }
    cJSON_AddStringToObject(cJSON_AddObjectToObject(cJSON_AddObjectToObject(op, "responses"), "200"),
                            "description", "OK");
    return op;
}

static cJSON *openapi_gv(si_store *s, const char *group, const char *version, bool *found)
{
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "openapi", "3.0.0");
    cJSON *info = cJSON_AddObjectToObject(doc, "info");
    cJSON_AddStringToObject(info, "title", "Kubernetes (k8s-standin)");
    cJSON_AddStringToObject(info, "version", "v1.31.9");
    cJSON *paths = cJSON_AddObjectToObject(doc, "paths");
    for (si_resource *r = s->resources; r; r = r->next) {
        if (!r->served || strcmp(r->group, group) || strcmp(r->version, version))
            continue;
        char p[600], base[300];
        if (group[0])
            snprintf(base, sizeof base, "/apis/%s/%s", group, version);
        else
            snprintf(base, sizeof base, "/api/%s", version);
        snprintf(p, sizeof p, "%s/%s%s/{name}", base, r->namespaced ? "namespaces/{namespace}/" : "",
                 r->plural);
        cJSON_AddItemToObject(cJSON_AddObjectToObject(paths, p), "patch", patch_operation(r));
        *found = true;
    }
    cJSON_AddObjectToObject(cJSON_AddObjectToObject(doc, "components"), "schemas");
    return doc;
}

cJSON *si_openapi_v3(si_store *s, const char *path, bool *found)
{
    char group[128], version[64];
    *found = true;
    if (!strcmp(path, "/openapi/v3") || !strcmp(path, "/openapi/v3/"))
        return openapi_root(s);
    *found = false;
    cJSON *doc = NULL;
    int n = 0, m = 0;
    if (sscanf(path, "/openapi/v3/apis/%127[^/]/%63[^/]%n", group, version, &n) == 2 && !path[n])
        doc = openapi_gv(s, group, version, found);
    else if (sscanf(path, "/openapi/v3/api/%63[^/]%n", version, &m) == 1 && !path[m])
        doc = openapi_gv(s, "", version, found);
    if (doc && !*found) {
        cJSON_Delete(doc);
        doc = NULL;
    }
    return doc;
}

/* objects.c: the verbs that write and read objects (create, update, patch, get, list) with the
 * real server's rules: server-set metadata (uid, creationTimestamp, generation,
 * resourceVersion), generateName, names per kind and label values (names.c), 409
 * AlreadyExists and Conflict, the status and scale subresources, CRD schema
 * defaults/pruning/checks and CEL rules (rules.c), no-op updates that change nothing. The
 * store mutex is held by the caller. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

static si_result nothing(void)
{
    return (si_result){0};
}

/* apiVersion and kind of the body must be the resource's (filled in when absent). */
static si_result check_identity(const si_resource *r, cJSON *body)
{
    char av[300];
    si_api_version(r, av, sizeof av);
    if (!cJSON_IsObject(body))
        return si_fail(400, "BadRequest", NULL, NULL, "the body of the request is not a JSON object");
    const char *bav = si_str(body, "apiVersion"), *kind = si_str(body, "kind");
    if (bav && strcmp(bav, av))
        return si_fail(400, "BadRequest", NULL, NULL,
                       "the API version in the data (%s) does not match the expected API version (%s)",
                       bav, av);
    if (kind && strcmp(kind, r->kind))
        return si_fail(400, "BadRequest", NULL, NULL,
                       "the kind in the data (%s) does not match the expected kind (%s)", kind,
                       r->kind);
    si_set_str(body, "apiVersion", av);
    si_set_str(body, "kind", r->kind);
    return nothing();
}

static si_result check_namespace(si_server *srv, const si_resource *r, const char *ns, cJSON *meta,
                                 bool create)
{
    const char *bns = si_str(meta, "namespace");
    if (!r->namespaced) {
        cJSON_DeleteItemFromObjectCaseSensitive(meta, "namespace");
        return nothing();
    }
    if (bns && *bns && strcmp(bns, ns))
        return si_fail(400, "BadRequest", NULL, NULL,
                       "the namespace of the provided object does not match the namespace sent on "
                       "the request");
    si_set_str(meta, "namespace", ns);
    si_resource *nsr = si_builtin(&srv->store, "", "namespaces");
    si_obj *nso = si_store_get(&srv->store, nsr, "", ns);
    if (!nso)
        return si_fail(404, "NotFound", nsr, ns, "namespaces \"%s\" not found", ns);
    if (create && si_get(nso->json, "metadata.deletionTimestamp"))
        return si_fail(403, "Forbidden", r, si_str(meta, "name"),
                       "unable to create new content in namespace %s because it is being terminated",
                       ns);
    return nothing();
}

static void generate_name(si_store *s, const si_resource *r, const char *ns, cJSON *meta)
{
    const char *prefix = si_str(meta, "generateName");
    char name[300], suffix[6];
    for (int tries = 0; tries < 100; tries++) {
        si_random_suffix(suffix);
        snprintf(name, sizeof name, "%s%s", prefix, suffix);
        if (!si_store_get(s, r, ns, name))
            break;
    }
    si_set_str(meta, "name", name);
}

static si_result check_name(const si_resource *r, const char *name)
{
    cJSON *causes = cJSON_CreateArray();
    if (!name || !*name)
        si_cause(causes, "FieldValueRequired", "metadata.name",
                 "Required value: name or generateName is required");
    else
        si_check_name(si_name_rule_of(r), name, "metadata.name", causes);
    if (cJSON_GetArraySize(causes))
        return si_invalid(r, name, causes);
    cJSON_Delete(causes);
    return nothing();
}

/* Unknown fields (already dropped): an error under fieldValidation=Strict, a warning under
 * Warn (the default), nothing under Ignore. Takes unknown. */
static si_result unknown_fields(const si_resource *r, cJSON *unknown, const si_req_opts *o,
                                char **warning)
{
    const char *fv = o && o->field_validation ? o->field_validation : "Warn";
    char msg[2048] = "";
    cJSON *u;
    bool strict = !strcmp(fv, "Strict");
    cJSON_ArrayForEach(u, unknown) snprintf(msg + strlen(msg), sizeof msg - strlen(msg),
                                            "%sunknown field \"%s\"", msg[0] ? (strict ? ", " : "\n") : "",
                                            u->valuestring);
    bool any = cJSON_GetArraySize(unknown) > 0;
    cJSON_Delete(unknown);
    if (any && strict)
        return si_fail(400, "BadRequest", NULL, NULL,
                       "%s in version \"%s\" cannot be handled as a %s: strict decoding error: %s",
                       r->kind, r->version, r->kind, msg);
    if (any && !strcmp(fv, "Warn") && warning && !*warning)
        *warning = strdup(msg);
    return nothing();
}

/* Prune, default and check a custom resource against its CRD's schema and rules (old: NULL
 * on create); causes gets the 422 errors. A result only for unknown fields under
 * fieldValidation=Strict. */
static si_result admit_custom(si_server *srv, const si_resource *r, cJSON *obj, const cJSON *old,
                              const si_req_opts *o, char **warning, cJSON *causes)
{
    if (!r->is_crd || !r->schema)
        return nothing();
    cJSON *unknown = cJSON_CreateArray();
    si_schema_prune(r->schema, obj, "", unknown);
    si_result res = unknown_fields(r, unknown, o, warning);
    if (res.code)
        return res;
    si_schema_default(r->schema, obj);
    si_schema_check(r->schema, obj, "", causes);
    si_rules_validate(r->schema, obj, old, srv->cfg.kube_minor >= 30, causes, warning);
    return nothing();
}

static si_result admit(si_server *srv, const si_resource *r, cJSON *obj, const cJSON *old,
                       const si_req_opts *o, char **warning)
{
    char err[512];
    bool create = !old;
    cJSON *causes = cJSON_CreateArray(), *unknown = cJSON_CreateArray();
    if (si_builtin_prepare(srv, r, obj, create, causes, unknown, err, sizeof err)) {
        cJSON_Delete(causes);
        cJSON_Delete(unknown);
        return si_fail(400, "BadRequest", NULL, NULL, "%s", err);
    }
    si_result res = unknown_fields(r, unknown, o, warning);
    if (!res.code && create && !r->is_crd && !r->group[0] && !strcmp(r->plural, "pods"))
        si_sa_admit(srv, obj, &res);
    si_check_labels(obj, causes);
    if (!res.code)
        res = admit_custom(srv, r, obj, old, o, warning, causes);
    if (!res.code && cJSON_GetArraySize(causes))
        return si_invalid(r, si_str(obj, "metadata.name"), causes);
    cJSON_Delete(causes);
    return res;
}

/* Side effects of a stored write: CRDs start (or change) serving, namespaces get what the
 * real controllers make in them (serviceaccount.c). */
static void after_write(si_server *srv, si_resource *r, const cJSON *obj, bool created)
{
    if (!r->is_crd && !strcmp(r->plural, "customresourcedefinitions"))
        si_crd_sync(&srv->store, obj, true);
    if (created && !r->is_crd && !r->group[0] && !strcmp(r->plural, "namespaces"))
        si_namespace_created(srv, si_str(obj, "metadata.name"));
}

si_result si_create(si_server *srv, si_resource *r, const char *ns, cJSON *body,
                    const si_req_opts *o)
{
    char uid[37], now[32], *warning = NULL;
    si_result res = check_identity(r, body);
    cJSON *meta = res.code ? NULL : si_obj_child(body, "metadata");
    if (!res.code)
        res = check_namespace(srv, r, ns, meta, true);
    if (!res.code && !si_str(meta, "name") && si_str(meta, "generateName"))
        generate_name(&srv->store, r, r->namespaced ? ns : "", meta);
    const char *name = meta ? si_str(meta, "name") : NULL;
    if (!res.code)
        res = check_name(r, name);
    if (!res.code && si_store_get(&srv->store, r, r->namespaced ? ns : "", name)) {
        char q[300];
        si_qualified_plural(r, q, sizeof q);
        res = si_fail(409, "AlreadyExists", r, name, "%s \"%s\" already exists", q, name);
    }
    if (res.code) {
        cJSON_Delete(body);
        return res;
    }
    si_new_uid(uid);
    si_set_str(meta, "uid", uid);
    si_set_str(meta, "creationTimestamp", si_rfc3339(time(NULL), now));
    si_set_num(meta, "generation", 1);
    static const char *const server_set[] = {"resourceVersion", "deletionTimestamp",
                                             "deletionGracePeriodSeconds", "managedFields",
                                             "selfLink"};
    for (size_t i = 0; i < 5; i++)
        cJSON_DeleteItemFromObjectCaseSensitive(meta, server_set[i]);
    if (r->is_crd && r->has_status)
        cJSON_DeleteItemFromObjectCaseSensitive(body, "status");
    res = admit(srv, r, body, NULL, o, &warning);
    if (res.code) {
        free(warning);
        cJSON_Delete(body);
        return res;
    }
    if (o && o->dry_run)
        return (si_result){.code = 201, .body = body, .warning = warning};
    si_obj *stored = si_store_put(&srv->store, r, body);
    after_write(srv, r, stored->json, true);
    return (si_result){.code = 201, .body = cJSON_Duplicate(stored->json, true), .warning = warning};
}

static cJSON *without(const cJSON *obj, bool meta, bool status)
{
    cJSON *c = cJSON_Duplicate(obj, true);
    if (meta)
        cJSON_DeleteItemFromObjectCaseSensitive(c, "metadata");
    else {
        cJSON *m = cJSON_GetObjectItem(c, "metadata");
        cJSON_DeleteItemFromObjectCaseSensitive(m, "resourceVersion");
        cJSON_DeleteItemFromObjectCaseSensitive(m, "managedFields");
    }
    if (status)
        cJSON_DeleteItemFromObjectCaseSensitive(c, "status");
    return c;
}

static bool differ(const cJSON *a, const cJSON *b, bool meta, bool status)
{
    cJSON *x = without(a, meta, status), *y = without(b, meta, status);
    bool d = !si_json_equal(x, y);
    cJSON_Delete(x);
    cJSON_Delete(y);
    return d;
}

static void keep_field(cJSON *dst, const cJSON *src, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(src, key);
    cJSON_DeleteItemFromObjectCaseSensitive(dst, key);
    if (v)
        cJSON_AddItemToObject(dst, key, cJSON_Duplicate(v, true));
}

/* The object an update asks for: the body for the main resource (status kept from cur when
 * the status subresource exists), cur with the body's status for /status. */
static cJSON *merge_update(const si_resource *r, const cJSON *cur, cJSON *body, const char *sub)
{
    if (sub && !strcmp(sub, "status")) {
        cJSON *n = cJSON_Duplicate(cur, true);
        keep_field(n, body, "status");
        cJSON_Delete(body);
        return n;
    }
    if (r->has_status)
        keep_field(body, cur, "status");
    cJSON *meta = si_obj_child(body, "metadata");
    const cJSON *cmeta = cJSON_GetObjectItem(cur, "metadata");
    static const char *const kept[] = {"uid", "creationTimestamp", "generation",
                                       "deletionTimestamp", "deletionGracePeriodSeconds",
                                       "namespace", "name"};
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++)
        keep_field(meta, cmeta, kept[i]);
    return body;
}

static si_result check_update(si_resource *r, const cJSON *cur, cJSON *body, const char *name)
{
    const char *bname = si_str(body, "metadata.name");
    if (bname && strcmp(bname, name))
        return si_fail(400, "BadRequest", NULL, NULL,
                       "the name of the object (%s) does not match the name on the URL (%s)", bname,
                       name);
    const char *rv = si_str(body, "metadata.resourceVersion");
    char q[300];
    si_qualified_plural(r, q, sizeof q);
    if (rv && *rv && strcmp(rv, si_str(cur, "metadata.resourceVersion")))
        return si_fail(409, "Conflict", r, name,
                       "Operation cannot be fulfilled on %s \"%s\": the object has been modified; "
                       "please apply your changes to the latest version and try again",
                       q, name);
    if ((!rv || !*rv) && r->is_crd) {
        cJSON *causes = cJSON_CreateArray();
        si_cause(causes, "FieldValueInvalid", "metadata.resourceVersion",
                 "Invalid value: 0x0: must be specified for an update");
        return si_invalid(r, name, causes);
    }
    return nothing();
}

si_result si_update(si_server *srv, si_resource *r, const char *ns, const char *name,
                    const char *sub, cJSON *body, const si_req_opts *o)
{
    si_obj *cur = si_store_get(&srv->store, r, r->namespaced ? ns : "", name);
    char q[300], *warning = NULL;
    si_qualified_plural(r, q, sizeof q);
    si_result res = cur ? check_identity(r, body)
                        : si_fail(404, "NotFound", r, name, "%s \"%s\" not found", q, name);
    if (!res.code)
        res = check_update(r, cur->json, body, name);
    if (!res.code)
        res = check_namespace(srv, r, ns, si_obj_child(body, "metadata"), false);
    if (res.code) {
        cJSON_Delete(body);
        return res;
    }
    cJSON *n = merge_update(r, cur->json, body, sub);
    res = admit(srv, r, n, cur->json, o, &warning);
    if (res.code) {
        free(warning);
        cJSON_Delete(n);
        return res;
    }
    if (!differ(n, cur->json, false, false) || (o && o->dry_run)) {
        cJSON_Delete(n);
        return (si_result){.code = 200, .body = cJSON_Duplicate(cur->json, true), .warning = warning};
    }
    if (differ(n, cur->json, true, r->has_status)) {
        const cJSON *g = si_get(cur->json, "metadata.generation");
        si_set_num(si_obj_child(n, "metadata"), "generation", (cJSON_IsNumber(g) ? g->valuedouble : 0) + 1);
    }
    si_obj *stored = si_store_put(&srv->store, r, n);
    res = (si_result){.code = 200, .body = cJSON_Duplicate(stored->json, true), .warning = warning};
    after_write(srv, r, stored->json, false);
    si_maybe_finish_delete(srv, r, stored->json);
    return res;
}

/* ---- scale subresource -------------------------------------------------------------------- */

static cJSON *scale_json(const si_resource *r, const cJSON *obj)
{
    cJSON *s = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(s, "metadata");
    cJSON_AddStringToObject(s, "kind", "Scale");
    cJSON_AddStringToObject(s, "apiVersion", "autoscaling/v1");
    static const char *const keys[] = {"name", "namespace", "uid", "resourceVersion",
                                       "creationTimestamp"};
    for (size_t i = 0; i < 5; i++)
        keep_field(meta, cJSON_GetObjectItem(obj, "metadata"), keys[i]);
    const cJSON *spec = si_get(obj, r->spec_replicas), *st = si_get(obj, r->status_replicas);
    const char *sel = r->selector_path[0] ? si_str(obj, r->selector_path) : NULL;
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(s, "spec"), "replicas",
                            cJSON_IsNumber(spec) ? spec->valuedouble : 0);
    cJSON *status = cJSON_AddObjectToObject(s, "status");
    cJSON_AddNumberToObject(status, "replicas", cJSON_IsNumber(st) ? st->valuedouble : 0);
    if (sel && *sel)
        cJSON_AddStringToObject(status, "selector", sel);
    return s;
}

static si_result scale_update(si_server *srv, si_resource *r, const char *ns, const char *name,
                              const cJSON *cur, cJSON *scale, const si_req_opts *o)
{
    const cJSON *rep = si_get(scale, "spec.replicas");
    const char *rv = si_str(scale, "metadata.resourceVersion");
    char q[300];
    si_qualified_plural(r, q, sizeof q);
    si_result res = nothing();
    if (!cJSON_IsNumber(rep) || rep->valuedouble < 0 || rep->valuedouble != (double)(int64_t)rep->valuedouble) {
        cJSON *causes = cJSON_CreateArray();
        si_cause(causes, "FieldValueInvalid", "spec.replicas",
                 "Invalid value: %s: must be greater than or equal to 0",
                 cJSON_IsNumber(rep) ? "negative or fractional" : "missing");
        res = si_invalid(r, name, causes);
    } else if (rv && *rv && strcmp(rv, si_str(cur, "metadata.resourceVersion"))) {
        res = si_fail(409, "Conflict", r, name,
                      "Operation cannot be fulfilled on %s \"%s\": the object has been modified; "
                      "please apply your changes to the latest version and try again",
                      q, name);
    }
    if (res.code) {
        cJSON_Delete(scale);
        return res;
    }
    cJSON *n = cJSON_Duplicate(cur, true);
    si_set(n, r->spec_replicas, cJSON_CreateNumber(rep->valuedouble));
    cJSON_Delete(scale);
    res = si_update(srv, r, ns, name, NULL, n, o);
    if (res.code == 200) {
        cJSON *s = scale_json(r, res.body);
        cJSON_Delete(res.body);
        res.body = s;
    }
    return res;
}

si_result si_get_obj(si_server *srv, si_resource *r, const char *ns, const char *name,
                     const char *sub)
{
    si_obj *cur = si_store_get(&srv->store, r, r->namespaced ? ns : "", name);
    char q[300];
    si_qualified_plural(r, q, sizeof q);
    if (!cur)
        return si_fail(404, "NotFound", r, name, "%s \"%s\" not found", q, name);
    if (sub && !strcmp(sub, "scale"))
        return si_ok(200, scale_json(r, cur->json));
    return si_ok(200, cJSON_Duplicate(cur->json, true));
}

/* ---- patch -------------------------------------------------------------------------------- */

static bool is_type(const char *ctype, const char *want)
{
    size_t n = strlen(want);
    return ctype && !strncmp(ctype, want, n) && (ctype[n] == '\0' || ctype[n] == ';');
}

static si_result apply_patch(si_resource *r, cJSON **target, const char *ctype, const cJSON *patch)
{
    char err[512];
    if (is_type(ctype, "application/merge-patch+json") ||
        is_type(ctype, "application/apply-patch+yaml"))
        return si_merge_patch(target, patch) ? si_fail(422, "Invalid", NULL, NULL, "merge patch failed")
                                             : nothing();
    if (is_type(ctype, "application/strategic-merge-patch+json")) {
        if (r->is_crd)
            return si_fail(415, "UnsupportedMediaType", NULL, NULL,
                           "the body of the request was in an unknown format - accepted media types "
                           "include: application/json-patch+json, application/merge-patch+json, "
                           "application/apply-patch+yaml");
        si_strategic_patch(target, patch);
        return nothing();
    }
    if (is_type(ctype, "application/json-patch+json")) {
        int rc = si_json_patch(target, patch, err, sizeof err);
        return rc == 0      ? nothing()
               : rc == -400 ? si_fail(400, "BadRequest", NULL, NULL, "%s", err)
                            : si_fail(422, "Invalid", NULL, NULL, "%s", err);
    }
    return si_fail(415, "UnsupportedMediaType", NULL, NULL,
                   "the body of the request was in an unknown format - accepted media types "
                   "include: application/json-patch+json, application/merge-patch+json, "
                   "application/apply-patch+yaml%s",
                   r->is_crd ? "" : ", application/strategic-merge-patch+json");
}

si_result si_patch(si_server *srv, si_resource *r, const char *ns, const char *name,
                   const char *sub, const char *ctype, const char *body, size_t len,
                   const si_req_opts *o)
{
    bool apply = is_type(ctype, "application/apply-patch+yaml");
    cJSON *patch = cJSON_ParseWithLength(body, len);
    if (!patch)
        return si_fail(400, "BadRequest", NULL, NULL,
                       apply ? "the stand-in takes apply patches written as JSON only (kubectl "
                               "sends JSON): %.*s"
                             : "error decoding patch: invalid JSON: %.*s",
                       (int)(len > 80 ? 80 : len), body);
    si_obj *cur = si_store_get(&srv->store, r, r->namespaced ? ns : "", name);
    if (!cur && apply && !sub)
        return si_create(srv, r, ns, patch, o);
    char q[300];
    si_qualified_plural(r, q, sizeof q);
    if (!cur) {
        cJSON_Delete(patch);
        return si_fail(404, "NotFound", r, name, "%s \"%s\" not found", q, name);
    }
    bool scale = sub && !strcmp(sub, "scale");
    cJSON *target = scale ? scale_json(r, cur->json) : cJSON_Duplicate(cur->json, true);
    si_result res = apply_patch(r, &target, ctype, patch);
    cJSON_Delete(patch);
    if (res.code) {
        cJSON_Delete(target);
        return res;
    }
    if (scale)
        return scale_update(srv, r, ns, name, cur->json, target, o);
    return si_update(srv, r, ns, name, sub, target, o);
}

si_result si_put_scale(si_server *srv, si_resource *r, const char *ns, const char *name,
                       cJSON *scale, const si_req_opts *o)
{
    si_obj *cur = si_store_get(&srv->store, r, r->namespaced ? ns : "", name);
    char q[300];
    si_qualified_plural(r, q, sizeof q);
    if (!cur) {
        cJSON_Delete(scale);
        return si_fail(404, "NotFound", r, name, "%s \"%s\" not found", q, name);
    }
    return scale_update(srv, r, ns, name, cur->json, scale, o);
}

cJSON *si_list_json(si_server *srv, si_resource *r, const char *ns, const si_selector *labels,
                    const si_selector *fields)
{
    return si_list_page(srv, r, ns, labels, fields, 0, 0);
}

cJSON *si_list_page(si_server *srv, si_resource *r, const char *ns, const si_selector *labels,
                    const si_selector *fields, long from, long limit)
{
    char av[300], rv[32];
    size_t n;
    si_obj **all = si_store_list(&srv->store, r, r->namespaced ? ns : "", &n);
    cJSON *list = cJSON_CreateObject(), *items;
    si_api_version(r, av, sizeof av);
    cJSON_AddStringToObject(list, "kind", r->list_kind);
    cJSON_AddStringToObject(list, "apiVersion", av);
    snprintf(rv, sizeof rv, "%llu", (unsigned long long)srv->store.rv);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(list, "metadata"), "resourceVersion", rv);
    items = cJSON_AddArrayToObject(list, "items");
    long matched = 0;
    for (size_t i = 0; i < n; i++) {
        if (!si_selector_match(labels, all[i]->json) || !si_selector_match(fields, all[i]->json))
            continue;
        if (matched >= from && (limit <= 0 || matched < from + limit))
            cJSON_AddItemToArray(items, cJSON_Duplicate(all[i]->json, true));
        matched++;
    }
    free(all);
    if (limit > 0 && matched > from + limit) {
        char token[64];
        snprintf(token, sizeof token, "offset-%ld", from + limit);
        cJSON *md = cJSON_GetObjectItem(list, "metadata");
        cJSON_AddStringToObject(md, "continue", token);
        cJSON_AddNumberToObject(md, "remainingItemCount", (double)(matched - from - limit));
    }
    return list;
}

/* delete.c: deletion as the real server does it: preconditions, finalizers that hold an object
 * (deletionTimestamp set, removed once an update empties metadata.finalizers), graceful pod
 * deletion handed to the stand-in kubelet, garbage collection of dependents through
 * ownerReferences (Background and Foreground both delete them at once; Orphan strips the
 * reference), namespaces and CRDs that take their contents with them. The store mutex is
 * held by the caller. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

static bool is_builtin(const si_resource *r, const char *group, const char *plural)
{
    return !r->is_crd && !strcmp(r->group, group) && !strcmp(r->plural, plural);
}

static const char *ns_of(const cJSON *obj)
{
    const char *ns = si_str(obj, "metadata.namespace");
    return ns ? ns : "";
}

static bool has_finalizers(const cJSON *obj)
{
    return cJSON_GetArraySize(si_get(obj, "metadata.finalizers")) > 0;
}

/* A pod whose containers the stand-in kubelet must stop before the object goes. */
static bool held_by_kubelet(si_server *srv, const si_resource *r, const cJSON *obj, long grace)
{
    const char *phase = si_str(obj, "status.phase");
    return is_builtin(r, "", "pods") && srv->cfg.kubelet_mode == SI_KUBELET_PROCESS && grace > 0 &&
           si_str(obj, "spec.nodeName") && !(phase && (!strcmp(phase, "Succeeded") ||
                                                       !strcmp(phase, "Failed")));
}

/* Every object that names uid among its ownerReferences. */
static si_obj **dependents(si_server *srv, const char *uid, size_t *n)
{
    size_t all;
    si_obj **objs = si_store_list(&srv->store, NULL, NULL, &all);
    size_t k = 0;
    for (size_t i = 0; i < all; i++) {
        const cJSON *ref;
        bool hit = false;
        cJSON_ArrayForEach(ref, si_get(objs[i]->json, "metadata.ownerReferences")) if (
            si_str(ref, "uid") && !strcmp(si_str(ref, "uid"), uid)) hit = true;
        if (hit) {
            __atomic_add_fetch(&objs[i]->refs, 1, __ATOMIC_ACQ_REL);
            objs[k++] = objs[i];
        }
    }
    *n = k;
    return objs;
}

static si_resource *resource_of(si_server *srv, const cJSON *obj)
{
    return si_resource_by_kind(&srv->store, si_str(obj, "apiVersion"), si_str(obj, "kind"));
}

static void collect_garbage(si_server *srv, const char *uid, bool orphan)
{
    size_t n;
    if (!si_store_is_owner(&srv->store, uid))
        return;
    si_obj **deps = dependents(srv, uid, &n);
    for (size_t i = 0; i < n; i++) {
        const cJSON *d = deps[i]->json;
        si_resource *r = resource_of(srv, d);
        const char *name = si_str(d, "metadata.name");
        if (!r || !si_store_get(&srv->store, r, ns_of(d), name)) {
            si_obj_unref(deps[i]);
            continue;
        }
        if (orphan) {
            cJSON *c = cJSON_Duplicate(d, true), *refs = si_get(c, "metadata.ownerReferences");
            for (cJSON *ref = refs ? refs->child : NULL, *next; ref; ref = next) {
                next = ref->next;
                if (si_str(ref, "uid") && !strcmp(si_str(ref, "uid"), uid))
                    cJSON_Delete(cJSON_DetachItemViaPointer(refs, ref));
            }
            si_store_put(&srv->store, r, c);
        } else {
            si_delete_opts o = {.grace = -1, .propagation = "Background"};
            si_result res = si_delete(srv, r, ns_of(d), name, &o);
            si_result_free(&res);
        }
        si_obj_unref(deps[i]);
    }
    free(deps);
}

static bool resource_empty(si_server *srv, const char *crd_name)
{
    for (si_resource *r = srv->store.resources; r; r = r->next) {
        if (!r->is_crd || strcmp(r->crd_name, crd_name))
            continue;
        size_t n;
        free(si_store_list(&srv->store, r, NULL, &n));
        if (n)
            return false;
    }
    return true;
}

static bool namespace_empty(si_server *srv, const char *ns)
{
    size_t n;
    free(si_store_list(&srv->store, NULL, ns, &n));
    return n == 0;
}

static void remove_now(si_server *srv, si_resource *r, const cJSON *obj, bool orphan);

/* A terminating namespace or CRD goes once what it holds is gone. */
static void reap_containers(si_server *srv, const si_resource *r, const cJSON *removed)
{
    if (r->namespaced && *ns_of(removed)) {
        si_resource *nsr = si_builtin(&srv->store, "", "namespaces");
        si_obj *ns = si_store_get(&srv->store, nsr, "", ns_of(removed));
        if (ns && si_get(ns->json, "metadata.deletionTimestamp") && !has_finalizers(ns->json) &&
            namespace_empty(srv, ns_of(removed)))
            remove_now(srv, nsr, ns->json, false);
    }
    if (r->is_crd) {
        si_resource *crdr = si_builtin(&srv->store, "apiextensions.k8s.io", "customresourcedefinitions");
        si_obj *crd = si_store_get(&srv->store, crdr, "", r->crd_name);
        if (crd && si_get(crd->json, "metadata.deletionTimestamp") && !has_finalizers(crd->json) &&
            resource_empty(srv, r->crd_name))
            remove_now(srv, crdr, crd->json, false);
    }
}

static void remove_now(si_server *srv, si_resource *r, const cJSON *obj, bool orphan)
{
    cJSON *copy = cJSON_Duplicate(obj, true);
    const char *uid = si_str(copy, "metadata.uid");
    si_store_remove(&srv->store, r, ns_of(copy), si_str(copy, "metadata.name"));
    if (is_builtin(r, "apiextensions.k8s.io", "customresourcedefinitions"))
        si_crd_sync(&srv->store, copy, false);
    if (uid)
        collect_garbage(srv, uid, orphan);
    reap_containers(srv, r, copy);
    cJSON_Delete(copy);
}

static bool holds_contents(const si_resource *r)
{
    return is_builtin(r, "", "namespaces") ||
           is_builtin(r, "apiextensions.k8s.io", "customresourcedefinitions");
}

/* Namespaces and CRDs delete what they hold first. */
static void delete_contents(si_server *srv, si_resource *r, const cJSON *obj)
{
    bool ns = is_builtin(r, "", "namespaces");
    if (!ns && !is_builtin(r, "apiextensions.k8s.io", "customresourcedefinitions"))
        return;
    const char *name = si_str(obj, "metadata.name");
    for (si_resource *x = srv->store.resources; x; x = x->next) {
        if (ns ? !x->namespaced : (!x->is_crd || strcmp(x->crd_name, name)))
            continue;
        size_t n;
        si_obj **objs = si_store_list(&srv->store, x, ns ? name : NULL, &n);
        for (size_t i = 0; i < n; i++)
            __atomic_add_fetch(&objs[i]->refs, 1, __ATOMIC_ACQ_REL);
        for (size_t i = 0; i < n; i++) {
            si_delete_opts o = {.grace = -1};
            si_result res = si_delete(srv, x, ns_of(objs[i]->json),
                                      si_str(objs[i]->json, "metadata.name"), &o);
            si_result_free(&res);
            si_obj_unref(objs[i]);
        }
        free(objs);
    }
}

/* Mark the object as being deleted (deletionTimestamp, grace, generation+1 for custom
 * resources as the real server does) and store it. */
static const cJSON *mark_deleting(si_server *srv, si_resource *r, const cJSON *cur, long grace)
{
    char ts[32];
    cJSON *c = cJSON_Duplicate(cur, true), *meta = si_obj_child(c, "metadata");
    if (!si_get(cur, "metadata.deletionTimestamp") || grace == 0) {
        si_set_str(meta, "deletionTimestamp", si_rfc3339(time(NULL) + grace, ts));
        if (r->is_crd) {
            const cJSON *g = cJSON_GetObjectItem(meta, "generation");
            si_set_num(meta, "generation", (cJSON_IsNumber(g) ? g->valuedouble : 0) + 1);
        }
    }
    si_set_num(meta, "deletionGracePeriodSeconds", (double)grace);
    if (is_builtin(r, "", "namespaces"))
        si_set_str(si_obj_child(c, "status"), "phase", "Terminating");
    return si_store_put(&srv->store, r, c)->json;
}

static si_result check_preconditions(const si_resource *r, const cJSON *cur, const char *name,
                                     const si_delete_opts *o)
{
    const char *uid = si_str(cur, "metadata.uid"), *rv = si_str(cur, "metadata.resourceVersion");
    char q[300];
    si_qualified_plural(r, q, sizeof q);
    if (o->pre_uid && *o->pre_uid && strcmp(o->pre_uid, uid))
        return si_fail(409, "Conflict", r, name,
                       "Operation cannot be fulfilled on %s \"%s\": Precondition failed: UID in "
                       "precondition: %s, UID in object meta: %s",
                       q, name, o->pre_uid, uid);
    if (o->pre_rv && *o->pre_rv && strcmp(o->pre_rv, rv))
        return si_fail(409, "Conflict", r, name,
                       "Operation cannot be fulfilled on %s \"%s\": Precondition failed: "
                       "ResourceVersion in precondition: %s, ResourceVersion in object meta: %s",
                       q, name, o->pre_rv, rv);
    return (si_result){0};
}

static long pod_grace(si_server *srv, const si_resource *r, const cJSON *cur, long asked)
{
    if (!is_builtin(r, "", "pods"))
        return 0;
    if (asked >= 0)
        return asked;
    const cJSON *g = si_get(cur, "spec.terminationGracePeriodSeconds");
    (void)srv;
    return cJSON_IsNumber(g) ? (long)g->valuedouble : 30;
}

si_result si_delete(si_server *srv, si_resource *r, const char *ns, const char *name,
                    const si_delete_opts *o)
{
    si_obj *cur = si_store_get(&srv->store, r, r->namespaced ? ns : "", name);
    char q[300];
    si_qualified_plural(r, q, sizeof q);
    if (!cur)
        return si_fail(404, "NotFound", r, name, "%s \"%s\" not found", q, name);
    si_result res = check_preconditions(r, cur->json, name, o);
    if (res.code)
        return res;
    bool orphan = o->propagation && !strcmp(o->propagation, "Orphan");
    long grace = pod_grace(srv, r, cur->json, o->grace);
    bool held = held_by_kubelet(srv, r, cur->json, grace);
    const cJSON *d = si_get(cur->json, "metadata.deletionGracePeriodSeconds");
    bool deleting = si_get(cur->json, "metadata.deletionTimestamp") != NULL;
    if (orphan && si_str(cur->json, "metadata.uid")) {
        char uid[64];
        snprintf(uid, sizeof uid, "%s", si_str(cur->json, "metadata.uid"));
        collect_garbage(srv, uid, true);
        cur = si_store_get(&srv->store, r, r->namespaced ? ns : "", name);
    }
    if (held || has_finalizers(cur->json) || holds_contents(r)) {
        const cJSON *now = cur->json;
        if (!deleting || (held && cJSON_IsNumber(d) && grace < d->valuedouble) ||
            (!held && cJSON_IsNumber(d) && d->valuedouble > 0))
            now = mark_deleting(srv, r, cur->json, held ? grace : 0);
        cJSON *out = cJSON_Duplicate(now, true);
        if (!deleting)
            delete_contents(srv, r, out);
        si_maybe_finish_delete(srv, r, out);
        return si_ok(200, out);
    }
    cJSON *out = cJSON_Duplicate(cur->json, true);
    remove_now(srv, r, out, orphan);
    return si_ok(200, out);
}

void si_maybe_finish_delete(si_server *srv, si_resource *r, const cJSON *obj)
{
    if (!si_get(obj, "metadata.deletionTimestamp") || has_finalizers(obj))
        return;
    const char *name = si_str(obj, "metadata.name");
    si_obj *cur = si_store_get(&srv->store, r, ns_of(obj), name);
    if (!cur)
        return;
    const cJSON *d = si_get(cur->json, "metadata.deletionGracePeriodSeconds");
    if (held_by_kubelet(srv, r, cur->json, cJSON_IsNumber(d) ? (long)d->valuedouble : 0))
        return;
    if (is_builtin(r, "", "namespaces") && !namespace_empty(srv, name))
        return;
    if (is_builtin(r, "apiextensions.k8s.io", "customresourcedefinitions") &&
        !resource_empty(srv, name))
        return;
    remove_now(srv, r, cur->json, false);
}

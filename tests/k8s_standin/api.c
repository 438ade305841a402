/* api.c: requests for resources: the path (/api/v1/[namespaces/<ns>/]<plural>[/<name>[/<sub>]]
 * and the same under /apis/<group>/<version>), the verb it means (get, list, watch, create,
 * update, patch, delete, deletecollection), request counts and injected faults, then the verb
 * under the store mutex, and the reply (an object, a list, a Table, a Status, a watch). */
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "standin.h"

typedef struct route {
    si_resource *r;
    char group[128], version[64], plural[128], ns[256], name[256], sub[32];
    const char *verb;
} route;

static const char *query(struct MHD_Connection *c, const char *key)
{
    return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, key);
}

static const char *header(struct MHD_Connection *c, const char *key)
{
    return MHD_lookup_connection_value(c, MHD_HEADER_KIND, key);
}

static int split(const char *url, char seg[8][256])
{
    int n = 0;
    for (const char *p = url; *p;) {
        while (*p == '/')
            p++;
        if (!*p)
            break;
        size_t len = strcspn(p, "/");
        if (n == 8 || len >= 256)
            return -1;
        memcpy(seg[n], p, len);
        seg[n++][len] = '\0';
        p += len;
    }
    return n;
}

/* Copy, cut to fit (a cut name then matches nothing). */
static void copy(char *dst, size_t len, const char *src)
{
    size_t n = strnlen(src, len - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static int parse_path(const char *url, route *rt)
{
    char seg[8][256];
    int n = split(url, seg), i;
    if (n >= 2 && !strcmp(seg[0], "api")) {
        copy(rt->version, sizeof rt->version, seg[1]);
        i = 2;
    } else if (n >= 3 && !strcmp(seg[0], "apis")) {
        copy(rt->group, sizeof rt->group, seg[1]);
        copy(rt->version, sizeof rt->version, seg[2]);
        i = 3;
    } else {
        return -1;
    }
    int rest = n - i;
    bool ns_sub = rest == 3 && !rt->group[0] &&
                  (!strcmp(seg[i + 2], "status") || !strcmp(seg[i + 2], "finalize"));
    if (rest >= 3 && !strcmp(seg[i], "namespaces") && !ns_sub) {
        copy(rt->ns, sizeof rt->ns, seg[i + 1]);
        i += 2;
        rest -= 2;
    }
    if (rest < 1 || rest > 3)
        return -1;
    copy(rt->plural, sizeof rt->plural, seg[i]);
    if (rest >= 2)
        copy(rt->name, sizeof rt->name, seg[i + 1]);
    if (rest == 3)
        copy(rt->sub, sizeof rt->sub, seg[i + 2]);
    return 0;
}

static bool sub_ok(const route *rt)
{
    const si_resource *r = rt->r;
    return !rt->sub[0] || (!strcmp(rt->sub, "status") && r->has_status) ||
           (!strcmp(rt->sub, "scale") && r->has_scale) || (!strcmp(rt->sub, "log") && r->has_log);
}

static const char *verb_of(struct MHD_Connection *c, const char *method, const route *rt)
{
    const char *w = query(c, "watch");
    bool watch = w && (!strcmp(w, "1") || !strcmp(w, "true"));
    bool named = rt->name[0] != '\0', sub = rt->sub[0] != '\0';
    if (!strcmp(method, "GET") || !strcmp(method, "HEAD"))
        return named ? (watch ? NULL : "get") : (watch ? "watch" : "list");
    if (!strcmp(method, "POST"))
        return named ? NULL : "create";
    if (!strcmp(method, "PUT"))
        return named && strcmp(rt->sub, "log") ? "update" : NULL;
    if (!strcmp(method, "PATCH"))
        return named && strcmp(rt->sub, "log") ? "patch" : NULL;
    if (!strcmp(method, "DELETE"))
        return sub ? NULL : named ? "delete" : "deletecollection";
    return NULL;
}

static bool wants_table(struct MHD_Connection *c)
{
    const char *a = header(c, "Accept");
    return a && strstr(a, "as=Table");
}

static int include_mode(struct MHD_Connection *c)
{
    const char *inc = query(c, "includeObject");
    return !inc ? 1 : !strcmp(inc, "None") ? 0 : !strcmp(inc, "Object") ? 2 : 1;
}

static int parse_selectors(struct MHD_Connection *c, si_selector **labels, si_selector **fields)
{
    char err[512];
    *labels = si_selector_parse(query(c, "labelSelector"), false, err, sizeof err);
    if (*labels == (si_selector *)-1) {
        *labels = NULL;
        return si_send_status(c, 400, "BadRequest", err);
    }
    *fields = si_selector_parse(query(c, "fieldSelector"), true, err, sizeof err);
    if (*fields == (si_selector *)-1) {
        si_selector_free(*labels);
        *fields = *labels = NULL;
        return si_send_status(c, 400, "BadRequest", err);
    }
    return -1;
}

/* limit and continue: one page of the list. The stand-in's token is the offset of the next
 * item in the current list (the real server's is a snapshot at the first page's
 * resourceVersion); an object created or deleted between two pages may shift the rest by one,
 * which an informer's relist absorbs. */
static void page_args(struct MHD_Connection *c, long *from, long *limit)
{
    const char *lim = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
    const char *cont = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "continue");
    *limit = lim ? strtol(lim, NULL, 10) : 0;
    *from = cont && strncmp(cont, "offset-", 7) == 0 ? strtol(cont + 7, NULL, 10) : 0;
    if (*from < 0 || *limit < 0)
        *from = *limit = 0;
}

static int do_list(si_server *srv, struct MHD_Connection *c, route *rt)
{
    si_selector *labels, *fields;
    int rc = parse_selectors(c, &labels, &fields);
    if (rc != -1)
        return rc;
    long from, limit;
    page_args(c, &from, &limit);
    pthread_mutex_lock(&srv->store.mu);
    cJSON *list = si_list_page(srv, rt->r, rt->ns, labels, fields, from, limit);
    if (wants_table(c)) {
        cJSON *t = si_table(rt->r, cJSON_GetObjectItem(list, "items"),
                            si_str(list, "metadata.resourceVersion"), include_mode(c), true);
        cJSON_Delete(list);
        list = t;
    }
    pthread_mutex_unlock(&srv->store.mu);
    si_selector_free(labels);
    si_selector_free(fields);
    return si_send_json(c, 200, list, NULL);
}

static int do_watch(si_server *srv, struct MHD_Connection *c, route *rt)
{
    si_watch *w = calloc(1, sizeof *w);
    int rc = parse_selectors(c, &w->labels, &w->fields);
    if (rc != -1) {
        free(w);
        return rc;
    }
    w->res = rt->r;
    copy(w->ns, sizeof w->ns, rt->ns);
    const char *rvs = query(c, "resourceVersion"), *to = query(c, "timeoutSeconds");
    const char *bm = query(c, "allowWatchBookmarks");
    char *end = NULL;
    unsigned long long rv = rvs && *rvs ? strtoull(rvs, &end, 10) : 0;
    if (end && *end) {
        si_selector_free(w->labels);
        si_selector_free(w->fields);
        free(w);
        return si_send_status(c, 400, "BadRequest", "invalid resource version: not a number");
    }
    pthread_mutex_lock(&srv->store.mu);
    rc = si_watch_start(&srv->store, w, rv, rv == 0, SI_WATCH_QUEUE_MAX);
    uint64_t floor = srv->store.floor;
    pthread_mutex_unlock(&srv->store.mu);
    if (rc == -410) {
        si_selector_free(w->labels);
        si_selector_free(w->fields);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cond);
        free(w);
        char *line = si_watch_gone_line(rv, floor + 1);
        if (srv->cfg.gone_in_stream) {
            struct MHD_Response *resp = si_watch_response(srv, c, NULL, false, false, 0, line);
            free(line);
            enum MHD_Result r = MHD_queue_response(c, 200, resp);
            MHD_destroy_response(resp);
            return r;
        }
        cJSON *ev = cJSON_Parse(line), *st = cJSON_DetachItemFromObject(ev, "object");
        free(line);
        cJSON_Delete(ev);
        return si_send_json(c, 410, st, NULL);
    }
    bool bookmarks = bm && (!strcmp(bm, "true") || !strcmp(bm, "1"));
    struct MHD_Response *resp =
        si_watch_response(srv, c, w, wants_table(c), bookmarks, to ? atoi(to) : 0, NULL);
    enum MHD_Result r = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return r;
}

static int do_log(si_server *srv, struct MHD_Connection *c, route *rt)
{
    pthread_mutex_lock(&srv->store.mu);
    si_result res = si_get_obj(srv, rt->r, rt->ns, rt->name, NULL);
    pthread_mutex_unlock(&srv->store.mu);
    if (res.code != 200)
        return si_send_result(c, &res);
    const char *container = query(c, "container");
    const cJSON *cs = si_get(res.body, "spec.containers");
    if (!container && cJSON_GetArraySize(cs) > 1) {
        char msg[1024] = "";
        const cJSON *x;
        cJSON_ArrayForEach(x, cs) snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "%s%s",
                                           msg[0] ? " " : "", si_str(x, "name"));
        char full[1400];
        snprintf(full, sizeof full,
                 "a container name must be specified for pod %s, choose one of: [%s]", rt->name, msg);
        si_result_free(&res);
        return si_send_status(c, 400, "BadRequest", full);
    }
    size_t len = 0;
    char *text = si_kubelet_log(srv, res.body, container ? container : "", &len);
    if (!text) {
        char msg[600];
        snprintf(msg, sizeof msg, "container \"%s\" in pod \"%s\" is not available",
                 container ? container : "", rt->name);
        si_result_free(&res);
        return si_send_status(c, 400, "BadRequest", msg);
    }
    si_result_free(&res);
    return si_send_text(c, 200, "text/plain", text, len, NULL);
}

static bool is_json(const char *ctype)
{
    return ctype && !strncmp(ctype, "application/json", 16) &&
           (ctype[16] == '\0' || ctype[16] == ';');
}

static si_req_opts req_opts(struct MHD_Connection *c)
{
    const char *dry = query(c, "dryRun");
    return (si_req_opts){.field_validation = query(c, "fieldValidation"),
                         .dry_run = dry && !strcmp(dry, "All")};
}

/* create and update (PUT) take a JSON object. */
static si_result do_write(si_server *srv, struct MHD_Connection *c, route *rt, const char *body,
                          size_t len)
{
    const char *ctype = header(c, "Content-Type");
    if (!is_json(ctype))
        return si_fail(415, "UnsupportedMediaType", NULL, NULL,
                       "the body of the request was in an unknown format (%s) - accepted media "
                       "types include: application/json (k8s-standin reads neither YAML nor "
                       "protobuf)",
                       ctype ? ctype : "no Content-Type");
    cJSON *obj = cJSON_ParseWithLength(body, len);
    if (!cJSON_IsObject(obj)) {
        cJSON_Delete(obj);
        return si_fail(400, "BadRequest", NULL, NULL,
                       "the object provided is unrecognized (must be of type %s): couldn't get "
                       "version/kind; json parse error: invalid JSON",
                       rt->r->kind);
    }
    si_req_opts o = req_opts(c);
    if (!strcmp(rt->verb, "create"))
        return si_create(srv, rt->r, rt->ns, obj, &o);
    if (!strcmp(rt->sub, "scale"))
        return si_put_scale(srv, rt->r, rt->ns, rt->name, obj, &o);
    return si_update(srv, rt->r, rt->ns, rt->name, rt->sub[0] ? rt->sub : NULL, obj, &o);
}

/* DeleteOptions from the body and the query (the query wins). */
static int delete_opts(struct MHD_Connection *c, const char *body, size_t len, si_delete_opts *o,
                       cJSON **opts)
{
    *o = (si_delete_opts){.grace = -1};
    *opts = len ? cJSON_ParseWithLength(body, len) : NULL;
    if (len && !cJSON_IsObject(*opts))
        return -1;
    const cJSON *g = cJSON_GetObjectItem(*opts, "gracePeriodSeconds");
    if (cJSON_IsNumber(g))
        o->grace = (long)g->valuedouble;
    o->propagation = si_str(*opts, "propagationPolicy");
    if (!o->propagation && cJSON_IsTrue(cJSON_GetObjectItem(*opts, "orphanDependents")))
        o->propagation = "Orphan";
    o->pre_uid = si_str(*opts, "preconditions.uid");
    o->pre_rv = si_str(*opts, "preconditions.resourceVersion");
    if (query(c, "gracePeriodSeconds"))
        o->grace = atol(query(c, "gracePeriodSeconds"));
    if (query(c, "propagationPolicy"))
        o->propagation = query(c, "propagationPolicy");
    return 0;
}

static si_result delete_collection(si_server *srv, struct MHD_Connection *c, route *rt,
                                   const si_delete_opts *o)
{
    char err[512];
    si_selector *labels = si_selector_parse(query(c, "labelSelector"), false, err, sizeof err);
    if (labels == (si_selector *)-1)
        return si_fail(400, "BadRequest", NULL, NULL, "%s", err);
    cJSON *list = si_list_json(srv, rt->r, rt->ns, labels, NULL), *it;
    si_selector_free(labels);
    cJSON *gone = cJSON_CreateArray();
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(list, "items"))
    {
        const char *ns = si_str(it, "metadata.namespace");
        si_result res = si_delete(srv, rt->r, ns ? ns : "", si_str(it, "metadata.name"), o);
        if (res.code == 200) {
            cJSON_AddItemToArray(gone, res.body);
            res.body = NULL;
        }
        si_result_free(&res);
    }
    cJSON_ReplaceItemInObject(list, "items", gone);
    return si_ok(200, list);
}

static si_result do_delete(si_server *srv, struct MHD_Connection *c, route *rt, const char *body,
                           size_t len)
{
    si_delete_opts o;
    cJSON *opts;
    if (delete_opts(c, body, len, &o, &opts)) {
        cJSON_Delete(opts);
        return si_fail(400, "BadRequest", NULL, NULL, "the DeleteOptions in the body are not JSON");
    }
    const char *dry = query(c, "dryRun");
    si_result res;
    if (dry && !strcmp(dry, "All"))
        res = si_get_obj(srv, rt->r, rt->ns, rt->name, NULL);
    else if (!strcmp(rt->verb, "deletecollection"))
        res = delete_collection(srv, c, rt, &o);
    else
        res = si_delete(srv, rt->r, rt->ns, rt->name, &o);
    cJSON_Delete(opts);
    return res;
}

static int dispatch(si_server *srv, struct MHD_Connection *c, route *rt, const char *body,
                    size_t len)
{
    if (!strcmp(rt->verb, "list"))
        return do_list(srv, c, rt);
    if (!strcmp(rt->verb, "watch"))
        return do_watch(srv, c, rt);
    if (!strcmp(rt->sub, "log"))
        return do_log(srv, c, rt);
    si_result res;
    si_req_opts o = req_opts(c);
    pthread_mutex_lock(&srv->store.mu);
    if (!strcmp(rt->verb, "get"))
        res = si_get_obj(srv, rt->r, rt->ns, rt->name, rt->sub[0] ? rt->sub : NULL);
    else if (!strcmp(rt->verb, "patch"))
        res = si_patch(srv, rt->r, rt->ns, rt->name, rt->sub[0] ? rt->sub : NULL,
                       header(c, "Content-Type"), body, len, &o);
    else if (!strcmp(rt->verb, "delete") || !strcmp(rt->verb, "deletecollection"))
        res = do_delete(srv, c, rt, body, len);
    else
        res = do_write(srv, c, rt, body, len);
    if (res.code == 200 && !strcmp(rt->verb, "get") && !rt->sub[0] && wants_table(c)) {
        cJSON *one = cJSON_CreateArray();
        cJSON_AddItemToArray(one, res.body);
        res.body = si_table(rt->r, one, si_str(res.body, "metadata.resourceVersion"),
                            include_mode(c), true);
        cJSON_Delete(one);
    }
    pthread_mutex_unlock(&srv->store.mu);
    return si_send_result(c, &res);
}

static int route_request(si_server *srv, struct MHD_Connection *c, const char *url,
                         const char *method, route *rt)
{
    static const char nf[] = "the server could not find the requested resource";
    if (parse_path(url, rt))
        return si_send_status(c, 404, "NotFound", nf);
    pthread_mutex_lock(&srv->store.mu);
    rt->r = si_resource_find(&srv->store, rt->group, rt->version, rt->plural);
    pthread_mutex_unlock(&srv->store.mu);
    if (!rt->r || (rt->r->namespaced && !rt->ns[0] && rt->name[0]) ||
        (!rt->r->namespaced && rt->ns[0]) || !sub_ok(rt))
        return si_send_status(c, 404, "NotFound", nf);
    rt->verb = verb_of(c, method, rt);
    if (!rt->verb)
        return si_send_status(c, 405, "MethodNotAllowed",
                              "the server does not allow this method on the requested resource");
    return -1;
}

/* What an authorizer would be asked, by client (the User-Agent's product): the request itself,
 * and, for an object whose ownerReferences set blockOwnerDeletion, `update` on each owner's
 * finalizers subresource (the OwnerReferencesPermissionEnforcement admission plugin's check). */
static void record_access(si_server *srv, struct MHD_Connection *c, const route *rt,
                          const char *resource, const char *body, size_t len)
{
    const char *ua = header(c, "User-Agent");
    char agent[64], key[400];
    snprintf(agent, sizeof agent, "%.*s", ua ? (int)strcspn(ua, "/ ") : 1, ua ? ua : "-");
    snprintf(key, sizeof key, "%s %s %s/%s", agent, rt->verb, rt->group, resource);
    si_stats_count(srv->access, "", key);
    if (strcmp(rt->verb, "create") && strcmp(rt->verb, "update"))
        return;
    cJSON *obj = body ? cJSON_ParseWithLength(body, len) : NULL;
    const cJSON *ref;
    cJSON_ArrayForEach(ref, si_get(obj, "metadata.ownerReferences")) {
        if (!cJSON_IsTrue(cJSON_GetObjectItem(ref, "blockOwnerDeletion")))
            continue;
        pthread_mutex_lock(&srv->store.mu);
        const si_resource *owner = si_resource_by_kind(&srv->store, si_str(ref, "apiVersion"),
                                                       si_str(ref, "kind"));
        if (owner)
            snprintf(key, sizeof key, "%s update %s/%s/finalizers", agent, owner->group,
                     owner->plural);
        pthread_mutex_unlock(&srv->store.mu);
        if (owner)
            si_stats_count(srv->access, "", key);
    }
    cJSON_Delete(obj);
}

int si_api_handle(si_server *srv, struct MHD_Connection *c, const char *url, const char *method,
                  const char *body, size_t len)
{
    route rt = {0};
    int rc = route_request(srv, c, url, method, &rt);
    if (rc != -1)
        return rc;
    char resource[200];
    snprintf(resource, sizeof resource, "%s%s%s", rt.plural, rt.sub[0] ? "/" : "", rt.sub);
    si_stats_count(srv->stats, rt.verb, resource);
    record_access(srv, c, &rt, resource, body, len);
    int delay_ms;
    cJSON *fault = si_faults_check(srv->faults, rt.verb, resource, rt.ns, rt.name, &delay_ms);
    if (delay_ms > 0)
        usleep((useconds_t)delay_ms * 1000);
    if (fault) {
        const cJSON *code = cJSON_GetObjectItem(fault, "code");
        return si_send_json(c, code->valueint, fault, NULL);
    }
    return dispatch(srv, c, &rt, body, len);
}

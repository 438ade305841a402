/* builtin.c: what the real API server's strategies do to built-in objects on create and
 * update, as far as the stand-in needs it: pod, service, secret and namespace defaults, the
 * few validations the operator meets (containers need a name and an image, a pod's hostname
 * and subdomain are DNS-1123 labels, ...), and the CustomResourceDefinition checks (its CEL
 * rules: rules.c) and status (Established, NamesAccepted). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

static bool is(const si_resource *r, const char *group, const char *plural)
{
    return !r->is_crd && !strcmp(r->group, group) && !strcmp(r->plural, plural);
}

static void default_str(cJSON *obj, const char *key, const char *value)
{
    if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(obj, key)))
        si_set_str(obj, key, value);
}

static void pod_defaults(cJSON *pod, bool create)
{
    cJSON *spec = si_obj_child(pod, "spec"), *c;
    default_str(spec, "restartPolicy", "Always");
    default_str(spec, "dnsPolicy", "ClusterFirst");
    default_str(spec, "schedulerName", "default-scheduler");
    const char *sa = si_str(spec, "serviceAccountName"), *alias = si_str(spec, "serviceAccount");
    if ((!sa || !*sa) && alias && *alias) /* the deprecated field names it too */
        si_set_str(spec, "serviceAccountName", alias);
    default_str(spec, "serviceAccountName", "default");
    si_set_str(spec, "serviceAccount", si_str(spec, "serviceAccountName"));
    if (!cJSON_GetObjectItem(spec, "terminationGracePeriodSeconds"))
        si_set_num(spec, "terminationGracePeriodSeconds", 30);
    static const char *const lists[] = {"initContainers", "containers"};
    for (int i = 0; i < 2; i++)
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(spec, lists[i]))
        {
            if (!cJSON_IsObject(c))
                continue;
            default_str(c, "terminationMessagePath", "/dev/termination-log");
            default_str(c, "terminationMessagePolicy", "File");
            default_str(c, "imagePullPolicy", "IfNotPresent");
            if (!cJSON_GetObjectItem(c, "resources"))
                cJSON_AddItemToObject(c, "resources", cJSON_CreateObject());
        }
    if (create) {
        cJSON *st = cJSON_CreateObject();
        cJSON_AddStringToObject(st, "phase", "Pending");
        cJSON_AddStringToObject(st, "qosClass", "BestEffort");
        if (cJSON_GetObjectItem(pod, "status"))
            cJSON_ReplaceItemInObjectCaseSensitive(pod, "status", st);
        else
            cJSON_AddItemToObject(pod, "status", st);
    }
}

static void pod_validate(const cJSON *pod, cJSON *causes)
{
    const cJSON *spec = cJSON_GetObjectItem(pod, "spec"), *c;
    const cJSON *containers = cJSON_GetObjectItem(spec, "containers");
    if (cJSON_GetArraySize(containers) == 0)
        si_cause(causes, "FieldValueRequired", "spec.containers", "Required value");
    static const char *const lists[] = {"initContainers", "containers"};
    for (int i = 0; i < 2; i++) {
        int k = 0;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(spec, lists[i]))
        {
            char f[128];
            const char *name = si_str(c, "name");
            snprintf(f, sizeof f, "spec.%s[%d].name", lists[i], k);
            if (!name || !*name)
                si_cause(causes, "FieldValueRequired", f, "Required value");
            else
                si_check_name(SI_DNS1123_LABEL, name, f, causes);
            snprintf(f, sizeof f, "spec.%s[%d].image", lists[i], k++);
            if (!si_str(c, "image") || !*si_str(c, "image"))
                si_cause(causes, "FieldValueRequired", f, "Required value");
        }
    }
    static const char *const dns[] = {"hostname", "subdomain"};
    for (int i = 0; i < 2; i++) {
        char f[32];
        const char *v = si_str(spec, dns[i]);
        snprintf(f, sizeof f, "spec.%s", dns[i]);
        if (v && *v)
            si_check_name(SI_DNS1123_LABEL, v, f, causes);
    }
    const char *rp = si_str(spec, "restartPolicy");
    if (rp && strcmp(rp, "Always") && strcmp(rp, "OnFailure") && strcmp(rp, "Never"))
        si_cause(causes, "FieldValueNotSupported", "spec.restartPolicy",
                 "Unsupported value: \"%s\": supported values: \"Always\", \"OnFailure\", \"Never\"",
                 rp);
}

static void service_defaults(si_store *s, cJSON *svc, bool create)
{
    cJSON *spec = si_obj_child(svc, "spec"), *p;
    default_str(spec, "type", "ClusterIP");
    default_str(spec, "sessionAffinity", "None");
    if (create && !cJSON_IsString(cJSON_GetObjectItem(spec, "clusterIP"))) {
        char ip[32];
        uint64_t n = ++s->next_ip;
        snprintf(ip, sizeof ip, "10.96.%u.%u", (unsigned)(n / 250) % 250, (unsigned)(n % 250) + 1);
        si_set_str(spec, "clusterIP", ip);
        cJSON *ips = cJSON_CreateArray();
        cJSON_AddItemToArray(ips, cJSON_CreateString(ip));
        cJSON_AddItemToObject(spec, "clusterIPs", ips);
    }
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(spec, "ports"))
    {
        default_str(p, "protocol", "TCP");
        cJSON *port = cJSON_GetObjectItem(p, "port");
        if (cJSON_IsNumber(port) && !cJSON_GetObjectItem(p, "targetPort"))
            si_set_num(p, "targetPort", port->valuedouble);
    }
    if (!cJSON_GetObjectItem(svc, "status"))
        cJSON_AddObjectToObject(cJSON_AddObjectToObject(svc, "status"), "loadBalancer");
}

/* stringData is write-only: it is merged into data (base64) like the real server does. */
static int secret_defaults(cJSON *sec, char *err, size_t errlen)
{
    default_str(sec, "type", "Opaque");
    cJSON *string_data = cJSON_DetachItemFromObjectCaseSensitive(sec, "stringData"), *it;
    cJSON *data = si_obj_child(sec, "data");
    cJSON_ArrayForEach(it, string_data) if (cJSON_IsString(it))
    {
        char *b = si_base64_encode((const unsigned char *)it->valuestring, strlen(it->valuestring));
        si_set_str(data, it->string, b);
        free(b);
    }
    cJSON_Delete(string_data);
    cJSON_ArrayForEach(it, data)
    {
        size_t n;
        unsigned char *raw = cJSON_IsString(it) ? si_base64_decode(it->valuestring, &n) : NULL;
        if (!raw) {
            snprintf(err, errlen, "Secret in version \"v1\" cannot be handled as a Secret: illegal "
                                  "base64 data in data[\"%s\"]", it->string);
            return -1;
        }
        free(raw);
    }
    return 0;
}

static void crd_validate(const cJSON *crd, cJSON *causes)
{
    const char *group = si_str(crd, "spec.group"), *plural = si_str(crd, "spec.names.plural");
    const char *kind = si_str(crd, "spec.names.kind"), *name = si_str(crd, "metadata.name");
    const char *scope = si_str(crd, "spec.scope");
    char want[512];
    if (!group || !*group)
        si_cause(causes, "FieldValueRequired", "spec.group", "Required value");
    if (!plural || !*plural)
        si_cause(causes, "FieldValueRequired", "spec.names.plural", "Required value");
    if (!kind || !*kind)
        si_cause(causes, "FieldValueRequired", "spec.names.kind", "Required value");
    snprintf(want, sizeof want, "%s.%s", plural ? plural : "", group ? group : "");
    if (name && group && plural && strcmp(name, want))
        si_cause(causes, "FieldValueInvalid", "metadata.name",
                 "Invalid value: \"%s\": must be spec.names.plural+\".\"+spec.group", name);
    if (!scope || (strcmp(scope, "Namespaced") && strcmp(scope, "Cluster")))
        si_cause(causes, "FieldValueNotSupported", "spec.scope",
                 "Unsupported value: \"%s\": supported values: \"Cluster\", \"Namespaced\"",
                 scope ? scope : "");
    int storage = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, si_get(crd, "spec.versions")) storage +=
        cJSON_IsTrue(cJSON_GetObjectItem(v, "storage"));
    if (cJSON_GetArraySize(si_get(crd, "spec.versions")) == 0)
        si_cause(causes, "FieldValueRequired", "spec.versions", "Required value");
    else if (storage != 1)
        si_cause(causes, "FieldValueInvalid", "spec.versions",
                 "Invalid value: %d: must have exactly one version marked as storage version",
                 storage);
}

/* The fields of JSONSchemaProps: anything else in a CRD's schema is an unknown field, which
 * the real server rejects under fieldValidation=Strict and drops otherwise. */
static const char *const SCHEMA_KEYS[] = {
    "id", "$schema", "$ref", "description", "type", "format", "title", "default", "maximum",
    "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength", "minLength", "pattern",
    "maxItems", "minItems", "uniqueItems", "multipleOf", "enum", "maxProperties",
    "minProperties", "required", "items", "allOf", "oneOf", "anyOf", "not", "properties",
    "additionalProperties", "patternProperties", "dependencies", "additionalItems",
    "definitions", "externalDocs", "example", "nullable", "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource", "x-kubernetes-int-or-string", "x-kubernetes-list-map-keys",
    "x-kubernetes-list-type", "x-kubernetes-map-type", "x-kubernetes-validations"};

static bool schema_key(const char *k)
{
    for (size_t i = 0; i < sizeof SCHEMA_KEYS / sizeof SCHEMA_KEYS[0]; i++)
        if (!strcmp(SCHEMA_KEYS[i], k))
            return true;
    return false;
}

static void schema_fields(cJSON *node, const char *path, cJSON *unknown);

static void schema_map(cJSON *map, const char *path, cJSON *unknown)
{
    char sub[1024];
    cJSON *v;
    cJSON_ArrayForEach(v, map)
    {
        if (snprintf(sub, sizeof sub, "%s.%s", path, v->string) < (int)sizeof sub)
            schema_fields(v, sub, unknown);
    }
}

static void schema_fields(cJSON *node, const char *path, cJSON *unknown)
{
    char sub[1024];
    if (!cJSON_IsObject(node))
        return;
    for (cJSON *v = node->child, *next; v; v = next) {
        next = v->next;
        if (snprintf(sub, sizeof sub, "%s.%s", path, v->string) >= (int)sizeof sub)
            continue;
        if (!schema_key(v->string)) {
            cJSON_AddItemToArray(unknown, cJSON_CreateString(sub));
            cJSON_Delete(cJSON_DetachItemViaPointer(node, v));
        } else if (!strcmp(v->string, "properties") || !strcmp(v->string, "patternProperties") ||
                   !strcmp(v->string, "definitions")) {
            schema_map(v, sub, unknown);
        } else if (!strcmp(v->string, "items") || !strcmp(v->string, "not") ||
                   !strcmp(v->string, "additionalProperties")) {
            schema_fields(v, sub, unknown);
        } else if (!strcmp(v->string, "allOf") || !strcmp(v->string, "oneOf") ||
                   !strcmp(v->string, "anyOf")) {
            int i = 0;
            cJSON *x;
            cJSON_ArrayForEach(x, v)
            {
                if (snprintf(sub, sizeof sub, "%s.%s[%d]", path, v->string, i++) < (int)sizeof sub)
                    schema_fields(x, sub, unknown);
            }
        }
    }
}

static void crd_unknown_fields(cJSON *crd, cJSON *unknown)
{
    cJSON *v;
    int i = 0;
    cJSON_ArrayForEach(v, si_get(crd, "spec.versions"))
    {
        char path[128];
        snprintf(path, sizeof path, "spec.versions[%d].schema.openAPIV3Schema", i++);
        schema_fields(si_get(v, "schema.openAPIV3Schema"), path, unknown);
    }
}

static cJSON *condition(const char *type, const char *reason, const char *message)
{
    char now[32];
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "type", type);
    cJSON_AddStringToObject(c, "status", "True");
    cJSON_AddStringToObject(c, "lastTransitionTime", si_rfc3339(time(NULL), now));
    cJSON_AddStringToObject(c, "reason", reason);
    cJSON_AddStringToObject(c, "message", message);
    return c;
}

static void crd_defaults(cJSON *crd)
{
    cJSON *names = si_obj_child(si_obj_child(crd, "spec"), "names");
    const char *kind = si_str(names, "kind");
    char buf[300];
    if (kind && !si_str(names, "singular")) {
        size_t i = 0;
        for (; kind[i] && i < sizeof buf - 1; i++)
            buf[i] = (char)tolower((unsigned char)kind[i]);
        buf[i] = '\0';
        si_set_str(names, "singular", buf);
    }
    if (kind && !si_str(names, "listKind")) {
        snprintf(buf, sizeof buf, "%sList", kind);
        si_set_str(names, "listKind", buf);
    }
    cJSON *st = cJSON_CreateObject(), *conds = cJSON_GetObjectItem(si_get(crd, "status"), "conditions");
    if (conds) { /* an update keeps the conditions (and their times) */
        cJSON_AddItemToObject(st, "conditions", cJSON_Duplicate(conds, true));
    } else {
        conds = cJSON_AddArrayToObject(st, "conditions");
        cJSON_AddItemToArray(conds, condition("NamesAccepted", "NoConflicts", "no conflicts found"));
        cJSON_AddItemToArray(conds, condition("Established", "InitialNamesAccepted",
                                              "the initial names have been accepted"));
    }
    cJSON_AddItemToObject(st, "acceptedNames", cJSON_Duplicate(names, true));
    cJSON *stored = cJSON_AddArrayToObject(st, "storedVersions"), *v;
    cJSON_ArrayForEach(v, si_get(crd, "spec.versions")) if (cJSON_IsTrue(cJSON_GetObjectItem(v, "storage")))
        cJSON_AddItemToArray(stored, cJSON_CreateString(si_str(v, "name") ? si_str(v, "name") : ""));
    cJSON_DeleteItemFromObjectCaseSensitive(crd, "status");
    cJSON_AddItemToObject(crd, "status", st);
}

/* Defaults and checks of built-in kinds; causes gets 422 errors, err a 400 message. */
int si_builtin_prepare(si_server *srv, const si_resource *r, cJSON *obj, bool create,
                       cJSON *causes, cJSON *unknown, char *err, size_t errlen)
{
    if (r->is_crd)
        return 0;
    if (is(r, "", "pods")) {
        pod_defaults(obj, create);
        pod_validate(obj, causes);
    } else if (is(r, "", "services")) {
        service_defaults(&srv->store, obj, create);
    } else if (is(r, "", "secrets")) {
        return secret_defaults(obj, err, errlen);
    } else if (is(r, "", "namespaces")) {
        cJSON *labels = si_obj_child(si_obj_child(obj, "metadata"), "labels");
        si_set_str(labels, "kubernetes.io/metadata.name", si_str(obj, "metadata.name"));
        if (create) {
            cJSON_DeleteItemFromObjectCaseSensitive(obj, "status");
            si_set_str(si_obj_child(obj, "status"), "phase", "Active");
        }
    } else if (is(r, "apiextensions.k8s.io", "customresourcedefinitions")) {
        crd_unknown_fields(obj, unknown);
        crd_validate(obj, causes);
        si_rules_crd(srv->cfg.kube_minor, obj, causes);
        crd_defaults(obj);
    }
    return 0;
}

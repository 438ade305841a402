/* schema.c: what k8s-standin does with a CRD's openAPIV3Schema: apply `default`s (nested
 * objects too, once their parent exists, as the real server does), prune fields the schema
 * does not declare (unless x-kubernetes-preserve-unknown-fields), and check type, required,
 * enum, minimum/maximum, minLength/maxLength, minItems/maxItems and pattern. CEL rules
 * (x-kubernetes-validations) are rules.c's; formats, oneOf/anyOf/allOf/not are not checked. */
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

static const cJSON *prop(const cJSON *schema, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(schema, "properties"),
                                            key);
}

static const cJSON *additional(const cJSON *schema)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(schema, "additionalProperties");
    return cJSON_IsObject(a) ? a : NULL;
}

static bool preserves(const cJSON *schema)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(schema, "x-kubernetes-preserve-unknown-fields"));
}

void si_schema_default(const cJSON *schema, cJSON *obj)
{
    if (!schema || !obj)
        return;
    if (cJSON_IsObject(obj)) {
        const cJSON *p;
        cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(schema, "properties"))
        {
            const cJSON *def = cJSON_GetObjectItemCaseSensitive(p, "default");
            if (def && !cJSON_GetObjectItemCaseSensitive(obj, p->string))
                cJSON_AddItemToObject(obj, p->string, cJSON_Duplicate(def, true));
            si_schema_default(p, cJSON_GetObjectItemCaseSensitive(obj, p->string));
        }
        const cJSON *a = additional(schema);
        cJSON *v;
        if (a)
            cJSON_ArrayForEach(v, obj) si_schema_default(a, v);
    } else if (cJSON_IsArray(obj)) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(schema, "items");
        cJSON *v;
        cJSON_ArrayForEach(v, obj) si_schema_default(items, v);
    }
}

static void join(char *out, size_t len, const char *path, const char *key)
{
    snprintf(out, len, "%s%s%s", path, *path ? "." : "", key);
}

void si_schema_prune(const cJSON *schema, cJSON *obj, const char *path, cJSON *unknown)
{
    char sub[1024];
    if (!schema || !obj)
        return;
    if (cJSON_IsArray(obj)) {
        cJSON *v;
        int i = 0;
        cJSON_ArrayForEach(v, obj)
        {
            snprintf(sub, sizeof sub, "%s[%d]", path, i++);
            si_schema_prune(cJSON_GetObjectItemCaseSensitive(schema, "items"), v, sub, unknown);
        }
        return;
    }
    if (!cJSON_IsObject(obj))
        return;
    const cJSON *a = additional(schema);
    bool keep = preserves(schema) ||
                cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(schema, "additionalProperties"));
    for (cJSON *v = obj->child, *next; v; v = next) {
        next = v->next;
        join(sub, sizeof sub, path, v->string);
        bool root_meta = !*path && (!strcmp(v->string, "apiVersion") ||
                                    !strcmp(v->string, "kind") || !strcmp(v->string, "metadata"));
        const cJSON *ps = prop(schema, v->string);
        if (root_meta)
            continue;
        if (ps || a) {
            si_schema_prune(ps ? ps : a, v, sub, unknown);
        } else if (!keep) {
            if (unknown)
                cJSON_AddItemToArray(unknown, cJSON_CreateString(sub));
            cJSON_Delete(cJSON_DetachItemViaPointer(obj, v));
        }
    }
}

static void value_text(const cJSON *v, char *buf, size_t len)
{
    char *s = cJSON_PrintUnformatted(v);
    snprintf(buf, len, "%s", s ? s : "null");
    free(s);
}

static bool type_ok(const char *type, const cJSON *v)
{
    if (!strcmp(type, "object"))
        return cJSON_IsObject(v);
    if (!strcmp(type, "array"))
        return cJSON_IsArray(v);
    if (!strcmp(type, "string"))
        return cJSON_IsString(v);
    if (!strcmp(type, "boolean"))
        return cJSON_IsBool(v);
    if (!strcmp(type, "number"))
        return cJSON_IsNumber(v);
    if (!strcmp(type, "integer"))
        return cJSON_IsNumber(v) && floor(v->valuedouble) == v->valuedouble;
    return true;
}

static bool pattern_ok(const char *pattern, const char *s)
{
    regex_t re;
    if (regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB))
        return true; /* a pattern POSIX cannot compile is not checked */
    bool ok = regexec(&re, s, 0, NULL, 0) == 0;
    regfree(&re);
    return ok;
}

static void check_enum(const cJSON *schema, const cJSON *obj, const char *path, cJSON *causes)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(schema, "enum"), *it;
    if (!cJSON_IsArray(e))
        return;
    cJSON_ArrayForEach(it, e) if (si_json_equal(it, obj)) return;
    char val[256], list[1024] = "";
    value_text(obj, val, sizeof val);
    cJSON_ArrayForEach(it, e)
    {
        char one[128];
        value_text(it, one, sizeof one);
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", list[0] ? ", " : "", one);
    }
    si_cause(causes, "FieldValueNotSupported", path, "Unsupported value: %s: supported values: %s",
             val, list);
}

static void check_bounds(const cJSON *schema, const cJSON *obj, const char *path, cJSON *causes)
{
    char val[256];
    value_text(obj, val, sizeof val);
    const cJSON *min = cJSON_GetObjectItemCaseSensitive(schema, "minimum");
    const cJSON *max = cJSON_GetObjectItemCaseSensitive(schema, "maximum");
    if (cJSON_IsNumber(obj) && cJSON_IsNumber(min) && obj->valuedouble < min->valuedouble)
        si_cause(causes, "FieldValueInvalid", path,
                 "Invalid value: %s: %s in body should be greater than or equal to %g", val, path,
                 min->valuedouble);
    if (cJSON_IsNumber(obj) && cJSON_IsNumber(max) && obj->valuedouble > max->valuedouble)
        si_cause(causes, "FieldValueInvalid", path,
                 "Invalid value: %s: %s in body should be less than or equal to %g", val, path,
                 max->valuedouble);
    const cJSON *mini = cJSON_GetObjectItemCaseSensitive(schema, "minItems");
    const cJSON *maxi = cJSON_GetObjectItemCaseSensitive(schema, "maxItems");
    int n = cJSON_GetArraySize(obj);
    if (cJSON_IsArray(obj) && cJSON_IsNumber(mini) && n < mini->valueint)
        si_cause(causes, "FieldValueInvalid", path,
                 "Invalid value: %d: %s in body should have at least %d items", n, path,
                 mini->valueint);
    if (cJSON_IsArray(obj) && cJSON_IsNumber(maxi) && n > maxi->valueint)
        si_cause(causes, "FieldValueTooMany", path, "Too many: %d: must have at most %d items", n,
                 maxi->valueint);
    const cJSON *minl = cJSON_GetObjectItemCaseSensitive(schema, "minLength");
    const cJSON *maxl = cJSON_GetObjectItemCaseSensitive(schema, "maxLength");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(schema, "pattern");
    if (!cJSON_IsString(obj))
        return;
    int len = (int)strlen(obj->valuestring);
    if (cJSON_IsNumber(minl) && len < minl->valueint)
        si_cause(causes, "FieldValueInvalid", path,
                 "Invalid value: %s: %s in body should be at least %d chars long", val, path,
                 minl->valueint);
    if (cJSON_IsNumber(maxl) && len > maxl->valueint)
        si_cause(causes, "FieldValueTooLong", path, "Too long: may not be more than %d bytes",
                 maxl->valueint);
    if (cJSON_IsString(pat) && !pattern_ok(pat->valuestring, obj->valuestring))
        si_cause(causes, "FieldValueInvalid", path, "Invalid value: %s: %s in body should match '%s'",
                 val, path, pat->valuestring);
}

static void check_children(const cJSON *schema, const cJSON *obj, const char *path, cJSON *causes)
{
    char sub[1024];
    const cJSON *it;
    if (cJSON_IsObject(obj)) {
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(schema, "required"))
        {
            if (!cJSON_IsString(it) || cJSON_GetObjectItemCaseSensitive(obj, it->valuestring))
                continue;
            join(sub, sizeof sub, path, it->valuestring);
            si_cause(causes, "FieldValueRequired", sub, "Required value");
        }
        const cJSON *a = additional(schema);
        cJSON_ArrayForEach(it, obj)
        {
            const cJSON *ps = prop(schema, it->string);
            if (!*path && !strcmp(it->string, "metadata"))
                continue;
            join(sub, sizeof sub, path, it->string);
            if (ps || a)
                si_schema_check(ps ? ps : a, it, sub, causes);
        }
    } else if (cJSON_IsArray(obj)) {
        int i = 0;
        cJSON_ArrayForEach(it, obj)
        {
            snprintf(sub, sizeof sub, "%s[%d]", path, i++);
            si_schema_check(cJSON_GetObjectItemCaseSensitive(schema, "items"), it, sub, causes);
        }
    }
}

void si_schema_check(const cJSON *schema, const cJSON *obj, const char *path, cJSON *causes)
{
    if (!schema || !obj)
        return;
    const char *type = si_str(schema, "type");
    bool int_or_string =
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(schema, "x-kubernetes-int-or-string"));
    if (cJSON_IsNull(obj) && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(schema, "nullable")))
        return;
    if (int_or_string ? !(cJSON_IsString(obj) || type_ok("integer", obj))
                      : (type && !type_ok(type, obj))) {
        char val[256];
        value_text(obj, val, sizeof val);
        si_cause(causes, "FieldValueTypeInvalid", path, "Invalid value: %s: %s in body must be of type %s: %s",
                 val, path, int_or_string ? "integer or string" : type, val);
        return;
    }
    check_enum(schema, obj, path, causes);
    check_bounds(schema, obj, path, causes);
    check_children(schema, obj, path, causes);
}

/* rules.c: CRD validation rules (x-kubernetes-validations, in cel.c's CEL subset) as the real
 * API server applies them, by --kube-version: below 25 (the alpha gate off) they are dropped
 * from a stored CRD without a word; from 25 every rule of a created or updated CRD must
 * compile (else 422 naming it), and every write of a custom resource (create, update, patch,
 * /status, /scale) evaluates each rule whose value is present, with self = that value: false is
 * `<path>: Invalid value: "<type>": <message, else "failed rule: <rule>">` (path `<nil>` at the
 * root), an error is `... <error> evaluating rule: <message, else rule>`. A type, required,
 * enum or size error of the schema leaves the rules unevaluated (hasBlockingErr). From 30
 * (CRDValidationRatcheting) a rule that fails on an update where its value did not change is
 * a warning, not an error. messageExpression, reason and fieldPath are not read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

#define RULES "x-kubernetes-validations"

/* ---- the CRD ------------------------------------------------------------------------------ */

typedef void (*visit_fn)(cJSON *schema, const char *path, bool root, cJSON *causes);

/* fn on schema and every schema below it that rules may sit in. */
static void visit(cJSON *s, const char *path, bool root, visit_fn fn, cJSON *causes)
{
    char sub[1024];
    cJSON *p;
    if (!cJSON_IsObject(s))
        return;
    fn(s, path, root, causes);
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(s, "properties"))
    {
        if (snprintf(sub, sizeof sub, "%s.properties[%s]", path, p->string) < (int)sizeof sub)
            visit(p, sub, false, fn, causes);
    }
    static const char *const subs[] = {"items", "additionalProperties"};
    for (int i = 0; i < 2; i++)
        if (snprintf(sub, sizeof sub, "%s.%s", path, subs[i]) < (int)sizeof sub)
            visit(cJSON_GetObjectItem(s, subs[i]), sub, false, fn, causes);
}

static void drop(cJSON *schema, const char *path, bool root, cJSON *causes)
{
    (void)path, (void)root, (void)causes;
    cJSON_DeleteItemFromObjectCaseSensitive(schema, RULES);
}

static void compile(cJSON *schema, const char *path, bool root, cJSON *causes)
{
    const cJSON *rule;
    int i = 0;
    cJSON_ArrayForEach(rule, cJSON_GetObjectItem(schema, RULES))
    {
        char field[1200], err[400];
        const char *text = si_str(rule, "rule");
        snprintf(field, sizeof field, "%s.%s[%d].rule", path, RULES, i++);
        if (!text || !*text) {
            si_cause(causes, "FieldValueRequired", field, "Required value");
            continue;
        }
        si_cel *c = si_cel_parse(text, err, sizeof err);
        if (c && !si_cel_check(c, schema, root, err, sizeof err)) {
            si_cel_free(c);
            continue;
        }
        si_cel_free(c);
        si_cause(causes, "FieldValueInvalid", field,
                 "Invalid value: \"%s\": compilation failed: ERROR: %s", text, err);
    }
}

void si_rules_crd(int kube_minor, cJSON *crd, cJSON *causes)
{
    cJSON *v;
    int i = 0;
    cJSON_ArrayForEach(v, si_get(crd, "spec.versions"))
    {
        char path[128];
        snprintf(path, sizeof path, "spec.versions[%d].schema.openAPIV3Schema", i++);
        visit(si_get(v, "schema.openAPIV3Schema"), path, true, kube_minor < 25 ? drop : compile,
              causes);
    }
}

/* ---- the custom resources ----------------------------------------------------------------- */

typedef struct walk {
    bool ratchet;
    cJSON *causes;
    char **warning;
} walk;

static void report(walk *w, const char *path, const cJSON *schema, const char *detail, bool same)
{
    const char *field = *path ? path : "<nil>", *type = si_str(schema, "type");
    if (!w->ratchet || !same) {
        si_cause(w->causes, "FieldValueInvalid", field, "Invalid value: \"%s\": %s",
                 type ? type : "", detail);
        return;
    }
    char line[1600];
    snprintf(line, sizeof line, "%s: Invalid value: \"%s\": %s", field, type ? type : "", detail);
    size_t had = *w->warning ? strlen(*w->warning) : 0;
    char *text = realloc(*w->warning, had + strlen(line) + 2);
    sprintf(text + had, "%s%s", had ? "\n" : "", line);
    *w->warning = text;
}

static void eval_rules(walk *w, const cJSON *schema, const cJSON *v, const char *path, bool same)
{
    const cJSON *rule;
    cJSON_ArrayForEach(rule, cJSON_GetObjectItem(schema, RULES))
    {
        char err[400], detail[1400];
        const char *text = si_str(rule, "rule"), *msg = si_str(rule, "message");
        si_cel *c = text ? si_cel_parse(text, err, sizeof err) : NULL;
        int r = c ? si_cel_eval(c, v, err, sizeof err) : 1; /* checked when the CRD was stored */
        si_cel_free(c);
        if (r == 1)
            continue;
        if (r == 0 && msg && *msg)
            snprintf(detail, sizeof detail, "%s", msg);
        else if (r == 0)
            snprintf(detail, sizeof detail, "failed rule: %s", text);
        else
            snprintf(detail, sizeof detail, "%s evaluating rule: %s", err, msg && *msg ? msg : text);
        report(w, path, schema, detail, same);
    }
}

static void walk_node(walk *w, const cJSON *schema, const cJSON *v, const cJSON *old, bool same,
                      const char *path);

/* An object's fields: a field is correlated with the old object's when its parent is (else it
 * is as unchanged as its nearest correlated parent). */
static void walk_fields(walk *w, const cJSON *schema, const cJSON *v, const cJSON *old, bool same,
                        const char *path)
{
    char sub[1024];
    const cJSON *f, *a = cJSON_GetObjectItem(schema, "additionalProperties");
    cJSON_ArrayForEach(f, v)
    {
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItem(schema, "properties"), f->string);
        if ((!*path && !strcmp(f->string, "metadata")) || (!ps && !cJSON_IsObject(a)))
            continue;
        if (ps)
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", f->string);
        else
            snprintf(sub, sizeof sub, "%s[%s]", path, f->string);
        const cJSON *of = old ? cJSON_GetObjectItemCaseSensitive(old, f->string) : NULL;
        bool s = old ? of && si_json_equal(f, of) : same;
        walk_node(w, ps ? ps : a, f, of, s, sub);
    }
}

static void walk_node(walk *w, const cJSON *schema, const cJSON *v, const cJSON *old, bool same,
                      const char *path)
{
    char sub[1024];
    const cJSON *it, *list = cJSON_IsArray(v) ? v : NULL;
    int i = 0;
    if (!cJSON_IsObject(schema) || !v || cJSON_IsNull(v))
        return;
    eval_rules(w, schema, v, path, same);
    if (cJSON_IsObject(v))
        walk_fields(w, schema, v, old, same, path);
    cJSON_ArrayForEach(it, list)
    {
        snprintf(sub, sizeof sub, "%s[%d]", path, i++);
        walk_node(w, cJSON_GetObjectItem(schema, "items"), it, NULL, same, sub);
    }
}

static bool has_rules(const cJSON *s)
{
    const cJSON *p;
    if (!cJSON_IsObject(s))
        return false;
    if (cJSON_GetArraySize(cJSON_GetObjectItem(s, RULES)))
        return true;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(s, "properties")) if (has_rules(p)) return true;
    return has_rules(cJSON_GetObjectItem(s, "items")) ||
           has_rules(cJSON_GetObjectItem(s, "additionalProperties"));
}

/* hasBlockingErr: the object has not the shape the rules were written for. */
static bool blocked(const cJSON *causes)
{
    static const char *const blocking[] = {"FieldValueNotSupported", "FieldValueRequired",
                                           "FieldValueTooLong", "FieldValueTooMany",
                                           "FieldValueTypeInvalid"};
    const cJSON *c;
    cJSON_ArrayForEach(c, causes)
    {
        const char *reason = si_str(c, "reason");
        for (size_t i = 0; reason && i < sizeof blocking / sizeof blocking[0]; i++)
            if (!strcmp(reason, blocking[i]))
                return true;
    }
    return false;
}

void si_rules_validate(const cJSON *schema, const cJSON *obj, const cJSON *old, bool ratchet,
                       cJSON *causes, char **warning)
{
    if (!has_rules(schema))
        return;
    if (blocked(causes)) {
        si_cause(causes, "FieldValueInvalid", "<nil>",
                 "Invalid value: \"null\": some validation rules were not checked because the "
                 "object was invalid; correct the existing errors to complete validation");
        return;
    }
    walk w = {ratchet && old, causes, warning};
    walk_node(&w, schema, obj, old, old && si_json_equal(obj, old), "");
}

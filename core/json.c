/* json.c: the strict JSON field reader of edl/json.h, shared by every parser of documents that
 * come from outside: the job's documents in etcd, checkpoint manifests, the agent's control
 * line, the collective's rendezvous entries. One place decides what "an integer", "a lease ID"
 * or "too long" means, and how the message that names the bad field reads. */
#include "edl/json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cJSON *edl_json_parse_object(const char *json, size_t len, size_t max_len, const char *doc,
                             char *err, size_t errlen, int *rc)
{
    if (!json) {
        edl_errf(err, errlen, 0, "%s: no document", doc);
        *rc = EDL_EINVAL;
        return NULL;
    }
    if (len > max_len) {
        edl_errf(err, errlen, 0, "%s: document of %zu bytes exceeds the %zu-byte limit", doc, len,
                max_len);
        *rc = EDL_ETOOBIG;
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, false);
    if (!root) {
        size_t at = end && end >= json ? (size_t)(end - json) : 0;
        edl_errf(err, errlen, 0, "%s: not valid JSON near byte %zu (malformed or truncated)", doc, at);
        *rc = EDL_EPROTO;
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        edl_errf(err, errlen, 0, "%s: not a JSON object", doc);
        *rc = EDL_EPROTO;
        return NULL;
    }
    /* one object and nothing after it but white space: two documents run together, or one
     * with bytes appended, is not taken for its first part */
    size_t at = end ? (size_t)(end - json) : len;
    while (at < len && json[at] && strchr(" \t\r\n", json[at]))
        at++;
    if (at < len) {
        cJSON_Delete(root);
        edl_errf(err, errlen, 0, "%s: bytes after the JSON object, from byte %zu", doc, at);
        *rc = EDL_EPROTO;
        return NULL;
    }
    *rc = 0;
    return root;
}

void edl_json_fail(edl_json_reader *r, int rc, const char *name, const char *what)
{
    if (r->rc)
        return;
    r->rc = rc;
    edl_errf(r->err, r->errlen, 0, "%s: field \"%s\" %s", r->doc, name, what);
}

const cJSON *edl_json_field(const edl_json_reader *r, const char *name)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(r->obj, name);
    return (f && !cJSON_IsNull(f)) ? f : NULL;
}

bool edl_json_require(edl_json_reader *r, const char *name)
{
    if (r->rc)
        return false;
    if (edl_json_field(r, name))
        return true;
    edl_json_fail(r, EDL_EPROTO, name, "is required");
    return false;
}

/* The field when the reader is still good and the field is present (or required). */
static const cJSON *take(edl_json_reader *r, const char *name)
{
    if (r->rc || (r->required && !edl_json_require(r, name)))
        return NULL;
    return edl_json_field(r, name);
}

bool edl_json_i64(edl_json_reader *r, const char *name, int64_t lo, int64_t hi, int64_t *out)
{
    const cJSON *f = take(r, name);
    if (!f)
        return false;
    double d = cJSON_IsNumber(f) ? f->valuedouble : NAN;
    if (!isfinite(d) || d != floor(d)) {
        edl_json_fail(r, EDL_EPROTO, name, "must be an integer");
        return false;
    }
    if (d < (double)lo || d > (double)hi) {
        char msg[96];
        snprintf(msg, sizeof msg, fabs(d) < 1e18 ? "is %.0f, outside %lld..%lld" :
                 "is %g, outside %lld..%lld", d, (long long)lo, (long long)hi);
        edl_json_fail(r, EDL_ECONFIG, name, msg);
        return false;
    }
    *out = (int64_t)d;
    return true;
}

bool edl_json_int(edl_json_reader *r, const char *name, int lo, int hi, int *out)
{
    int64_t v;
    if (!edl_json_i64(r, name, lo, hi, &v))
        return false;
    *out = (int)v;
    return true;
}

bool edl_json_bool(edl_json_reader *r, const char *name, bool *out)
{
    const cJSON *f = take(r, name);
    if (!f)
        return false;
    if (!cJSON_IsBool(f)) {
        edl_json_fail(r, EDL_EPROTO, name, "must be true or false");
        return false;
    }
    *out = cJSON_IsTrue(f);
    return true;
}

bool edl_json_cstr(edl_json_reader *r, const char *name, size_t max_len, const char **out)
{
    const cJSON *f = take(r, name);
    if (!f)
        return false;
    if (!cJSON_IsString(f)) {
        edl_json_fail(r, EDL_EPROTO, name, "must be a string");
        return false;
    }
    if (strlen(f->valuestring) > max_len) {
        char msg[64];
        snprintf(msg, sizeof msg, "is too long (more than %zu bytes)", max_len);
        edl_json_fail(r, EDL_ETOOBIG, name, msg);
        return false;
    }
    *out = f->valuestring;
    return true;
}

bool edl_json_str(edl_json_reader *r, const char *name, size_t max_len, char **out)
{
    const char *v;
    if (!edl_json_cstr(r, name, max_len, &v))
        return false;
    char *s = strdup(v);
    if (!s) {
        edl_json_fail(r, EDL_ENOMEM, name, "could not be copied");
        return false;
    }
    free(*out);
    *out = s;
    return true;
}

bool edl_json_enum(edl_json_reader *r, const char *name, const char *const *names, int n,
                   int *out)
{
    const char *s;
    if (!edl_json_cstr(r, name, 64, &s))
        return false;
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return true;
        }
    char msg[160];
    snprintf(msg, sizeof msg, "has unknown value \"%.64s\"", s);
    edl_json_fail(r, EDL_ECONFIG, name, msg);
    return false;
}

bool edl_json_hex64(edl_json_reader *r, const char *name, int64_t *out)
{
    const cJSON *f = take(r, name);
    if (!f)
        return false;
    const char *s = cJSON_IsString(f) ? f->valuestring : NULL;
    char *end = NULL;
    errno = 0;
    unsigned long long v = s ? strtoull(s, &end, 16) : 0;
    if (!s || !*s || *end || errno || strlen(s) > 16 || strspn(s, "0123456789abcdefABCDEF") !=
        strlen(s)) {
        edl_json_fail(r, EDL_EPROTO, name, "must be a lease ID in hexadecimal");
        return false;
    }
    *out = (int64_t)v;
    return true;
}

const cJSON *edl_json_array(edl_json_reader *r, const char *name, int max_items)
{
    const cJSON *f = take(r, name);
    if (!f)
        return NULL;
    if (!cJSON_IsArray(f)) {
        edl_json_fail(r, EDL_EPROTO, name, "must be an array");
        return NULL;
    }
    if (cJSON_GetArraySize(f) > max_items) {
        char msg[64];
        snprintf(msg, sizeof msg, "holds more than %d items", max_items);
        edl_json_fail(r, EDL_ETOOBIG, name, msg);
        return NULL;
    }
    return f;
}

const cJSON *edl_json_object(edl_json_reader *r, const char *name)
{
    const cJSON *f = take(r, name);
    if (f && !cJSON_IsObject(f)) {
        edl_json_fail(r, EDL_EPROTO, name, "must be an object");
        return NULL;
    }
    return f;
}

/* Each number of the tree that cJSON's 15 digits would round becomes raw text with 17 (which
 * reads back to the same double) while the tree is printed, and a number again after (a raw
 * node of the caller's has valuedouble 0 == valueint, so is left alone). NaN and infinities
 * stay numbers (cJSON writes them as null). */
static bool exact_numbers(cJSON *node, bool back_to_numbers)
{
    for (cJSON *c = node->child; c; c = c->next)
        if (!exact_numbers(c, back_to_numbers) && !back_to_numbers)
            return false;
    if (back_to_numbers) {
        if (cJSON_IsRaw(node) && node->valuedouble != (double)node->valueint) {
            free(node->valuestring);
            node->valuestring = NULL;
            node->type = cJSON_Number | (node->type & ~0xFF);
        }
        return true;
    }
    double d = node->valuedouble, back = 0;
    char text[32];
    if (!cJSON_IsNumber(node) || !isfinite(d) || d == (double)node->valueint)
        return true;
    snprintf(text, sizeof text, "%1.15g", d);
    if (sscanf(text, "%lg", &back) == 1 && back == d)
        return true;
    snprintf(text, sizeof text, "%1.17g", d);
    if (!(node->valuestring = strdup(text)))
        return false;
    node->type = cJSON_Raw | (node->type & ~0xFF);
    return true;
}

char *edl_json_print(const cJSON *o, bool pretty)
{
    cJSON *tree = (cJSON *)o; /* changed while printed, as it was on return */
    if (!tree)
        return NULL;
    char *s = exact_numbers(tree, false) ? (pretty ? cJSON_Print(tree) : cJSON_PrintUnformatted(tree))
                                         : NULL;
    exact_numbers(tree, true);
    return s;
}

char *edl_json_print_consume(cJSON *o)
{
    char *s = edl_json_print(o, false);
    cJSON_Delete(o);
    return s;
}

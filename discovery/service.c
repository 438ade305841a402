/* service.c: a teacher's record in etcd: its JSON form (written by edl_service_instance_to_json,
 * read strictly by edl_service_instance_parse, since any writer may put anything there), and
 * registering, deregistering and listing the teachers of a service. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/job.h"
#include "edl/json.h"
#include "edl/log.h"
#include "internal.h"

#define ENDPOINT_MAX 1024 /* bytes of a teacher's endpoint */
#define LABEL_MAX 256     /* bytes of its model or version */

bool edl_service_name_ok(const char *s)
{
    return edl_dns_label_valid(s);
}

/* ---- keys ---------------------------------------------------------------------------------- */

char *disc_key(const char *prefix, const char *service, const char *kind, const char *name)
{
    if (!prefix)
        prefix = EDL_DEFAULT_PREFIX;
    size_t plen = strlen(prefix);
    while (plen > 0 && prefix[plen - 1] == '/')
        plen--;
    size_t n = plen + strlen(service) + strlen(kind) + (name ? strlen(name) : 0) + 16;
    char *key = malloc(n);
    if (key)
        snprintf(key, n, "%.*s/services/%s/%s%s", (int)plen, prefix, service, kind,
                 name ? name : "");
    return key;
}

bool disc_key_name(const edl_kv *kv, const char *dir, char out[EDL_SERVICE_NAME_MAX + 1])
{
    size_t dlen = strlen(dir);
    if (kv->key_len <= dlen || kv->key_len - dlen > EDL_SERVICE_NAME_MAX ||
        memcmp(kv->key, dir, dlen) != 0 || memchr(kv->key + dlen, '\0', kv->key_len - dlen))
        return false; /* keys are binary: a NUL must not cut a name short */
    memcpy(out, kv->key + dlen, kv->key_len - dlen);
    out[kv->key_len - dlen] = '\0';
    return edl_service_name_ok(out);
}

/* ---- the record ---------------------------------------------------------------------------- */

/* Why an endpoint is refused, or NULL: "http://host[:port][/path]" (or https). */
static const char *endpoint_problem(const char *e)
{
    if (!e || !*e)
        return "is required";
    if (strlen(e) > ENDPOINT_MAX)
        return "is too long";
    const char *host = !strncmp(e, "http://", 7) ? e + 7 : !strncmp(e, "https://", 8) ? e + 8 : NULL;
    if (!host)
        return "must be an http:// or https:// URL";
    if (!*host || *host == '/' || *host == ':')
        return "has no host";
    for (const char *p = e; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == 0x7f)
            return "must not hold spaces or control characters";
    return NULL;
}

int edl_service_instance_to_json(const edl_service_instance *in, char **json)
{
    *json = NULL;
    if (!in || endpoint_problem(in->endpoint) || in->capacity < 1 || in->capacity > 65535 ||
        !(in->load >= 0 && isfinite(in->load)) ||
        (in->model && strlen(in->model) > LABEL_MAX) ||
        (in->version && strlen(in->version) > LABEL_MAX))
        return EDL_EINVAL;
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddStringToObject(o, "endpoint", in->endpoint) ||
        !cJSON_AddNumberToObject(o, "capacity", in->capacity) ||
        !cJSON_AddStringToObject(o, "model", in->model ? in->model : "") ||
        !cJSON_AddStringToObject(o, "version", in->version ? in->version : "") ||
        !cJSON_AddNumberToObject(o, "load", in->load)) {
        cJSON_Delete(o);
        return EDL_ENOMEM;
    }
    *json = edl_json_print_consume(o);
    if (!*json)
        return EDL_ENOMEM;
    if (strlen(*json) > EDL_SERVICE_RECORD_MAX) {
        free(*json);
        *json = NULL;
        return EDL_EINVAL;
    }
    return 0;
}

/* load: a finite number >= 0 (json.h reads no doubles). */
static void read_load(edl_json_reader *r, double *out)
{
    const cJSON *f = edl_json_field(r, "load");
    if (!f || r->rc)
        return;
    if (!cJSON_IsNumber(f))
        edl_json_fail(r, EDL_EPROTO, "load", "must be a number");
    else if (!(f->valuedouble >= 0) || !isfinite(f->valuedouble))
        edl_json_fail(r, EDL_EPROTO, "load", "must be a finite number >= 0");
    else
        *out = f->valuedouble;
}

static void read_record(edl_json_reader *r, edl_service_instance *p)
{
    r->required = true;
    edl_json_str(r, "endpoint", ENDPOINT_MAX, &p->endpoint);
    r->required = false;
    edl_json_int(r, "capacity", 1, 65535, &p->capacity);
    edl_json_str(r, "model", LABEL_MAX, &p->model);
    edl_json_str(r, "version", LABEL_MAX, &p->version);
    read_load(r, &p->load);
    const char *why = r->rc ? NULL : endpoint_problem(p->endpoint);
    if (why)
        edl_json_fail(r, EDL_EPROTO, "endpoint", why);
}

int edl_service_instance_parse(const char *name, const char *json, size_t len,
                               edl_service_instance *out, char *err, size_t errlen)
{
    char doc[EDL_SERVICE_NAME_MAX + 32];
    snprintf(doc, sizeof doc, "teacher %.63s", name ? name : "?");
    int rc;
    cJSON *root = edl_json_parse_object(json, len, EDL_SERVICE_RECORD_MAX, doc, err, errlen, &rc);
    if (!root)
        return rc == EDL_ENOMEM || rc == EDL_EINVAL ? rc : EDL_EPROTO;
    edl_service_instance p = {.capacity = 1};
    edl_json_reader r = {root, doc, err, errlen, 0, false};
    read_record(&r, &p);
    cJSON_Delete(root);
    if (!r.rc && (!(p.name = strdup(name ? name : "")) || (!p.model && !(p.model = strdup(""))) ||
                  (!p.version && !(p.version = strdup("")))))
        r.rc = EDL_ENOMEM;
    if (r.rc) {
        edl_service_instance_clear(&p);
        return r.rc == EDL_ENOMEM ? r.rc : EDL_EPROTO;
    }
    edl_service_instance_clear(out);
    *out = p;
    return 0;
}

void edl_service_instance_clear(edl_service_instance *in)
{
    if (!in)
        return;
    free(in->name);
    free(in->endpoint);
    free(in->model);
    free(in->version);
    memset(in, 0, sizeof *in);
}

/* ---- registration -------------------------------------------------------------------------- */

int edl_service_register(edl_etcd *c, const char *prefix, const char *service,
                         const edl_service_instance *in, int64_t lease)
{
    if (!c || !in || !edl_service_name_ok(service) || !edl_service_name_ok(in->name))
        return EDL_EINVAL;
    char *json = NULL;
    int rc = edl_service_instance_to_json(in, &json);
    if (rc)
        return rc;
    char *key = disc_key(prefix, service, "teachers/", in->name);
    if (!key) {
        free(json);
        return EDL_ENOMEM;
    }
    edl_put_opts po = {.lease = lease};
    rc = edl_etcd_put(c, edl_str(key), edl_str(json), &po, NULL);
    free(key);
    free(json);
    return rc;
}

int edl_service_deregister(edl_etcd *c, const char *prefix, const char *service,
                           const char *instance)
{
    if (!c || !edl_service_name_ok(service) || !edl_service_name_ok(instance))
        return EDL_EINVAL;
    char *key = disc_key(prefix, service, "teachers/", instance);
    if (!key)
        return EDL_ENOMEM;
    edl_delete_result r;
    int rc = edl_etcd_delete(c, edl_str(key), NULL, &r);
    free(key);
    if (rc)
        return rc;
    rc = r.deleted > 0 ? 0 : EDL_ENOTFOUND;
    edl_delete_result_clear(&r);
    return rc;
}

/* ---- listing ------------------------------------------------------------------------------- */

int disc_teacher_from_kv(const edl_kv *kv, const char *dir, edl_service_instance *out)
{
    char name[EDL_SERVICE_NAME_MAX + 1], err[256];
    if (!disc_key_name(kv, dir, name)) {
        EDL_WARN("discovery", "skipping %.200s: not <service>/teachers/<name> with a valid name",
                 kv->key);
        return EDL_EPROTO;
    }
    int rc = edl_service_instance_parse(name, kv->value, kv->value_len, out, err, sizeof err);
    if (rc) {
        EDL_WARN("discovery", "skipping the record %s: %s", kv->key, err);
        return rc;
    }
    out->lease = kv->lease;
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const edl_service_instance *)a)->name,
                  ((const edl_service_instance *)b)->name);
}

/* The parsed teachers of r's keys under dir, sorted by name; bad records are skipped. */
static int teachers_of(const edl_range_result *r, const char *dir, edl_service_instance **out,
                       size_t *n)
{
    edl_service_instance *list = calloc(r->n_kvs ? r->n_kvs : 1, sizeof *list);
    if (!list)
        return EDL_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < r->n_kvs; i++) {
        int rc = disc_teacher_from_kv(&r->kvs[i], dir, &list[k]);
        if (rc == EDL_ENOMEM) {
            edl_service_list_free(list, k);
            return rc;
        }
        k += rc == 0;
    }
    qsort(list, k, sizeof *list, by_name);
    *out = list;
    *n = k;
    return 0;
}

int edl_service_list(edl_etcd *c, const char *prefix, const char *service,
                     edl_service_instance **out, size_t *n, int64_t *rev)
{
    *out = NULL;
    *n = 0;
    if (!c || !edl_service_name_ok(service))
        return EDL_EINVAL;
    char *dir = disc_key(prefix, service, "teachers/", NULL);
    if (!dir)
        return EDL_ENOMEM;
    edl_range_opts ro = {.prefix = true, .limit = EDL_SERVICE_MAX_INSTANCES};
    edl_range_result r;
    int rc = edl_etcd_range(c, edl_str(dir), &ro, &r);
    if (!rc) {
        if (r.more)
            EDL_WARN("discovery", "%s holds %lld keys: reading the first %d", dir,
                     (long long)r.count, EDL_SERVICE_MAX_INSTANCES);
        rc = teachers_of(&r, dir, out, n);
        if (!rc && rev)
            *rev = r.revision;
        edl_range_result_clear(&r);
    }
    free(dir);
    return rc;
}

void edl_service_list_free(edl_service_instance *list, size_t n)
{
    for (size_t i = 0; list && i < n; i++)
        edl_service_instance_clear(&list[i]);
    free(list);
}

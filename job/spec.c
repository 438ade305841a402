/* spec.c: the job's spec document (edl/job.h): defaults, validation, the strict parser and the
 * encoder, and the names of its enums, which `edl run` and the JSON spell the same way. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/job.h"
#include "edl/json.h"

static const char *const policy_names[] = {"OnFailure", "ExitCode", "Never"};
static const char *const mode_names[] = {"restart", "inprocess", "auto"};

static int name_index(const char *s, const char *const *names, int n)
{
    for (int i = 0; s && i < n; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

const char *edl_restart_policy_name(edl_restart_policy p)
{
    return (unsigned)p < 3 ? policy_names[p] : "unknown";
}

int edl_restart_policy_parse(const char *s, edl_restart_policy *out)
{
    int i = name_index(s, policy_names, 3);
    if (i < 0)
        return EDL_ECONFIG;
    *out = (edl_restart_policy)i;
    return 0;
}

const char *edl_elastic_mode_name(edl_elastic_mode m)
{
    return (unsigned)m < 3 ? mode_names[m] : "unknown";
}

int edl_elastic_mode_parse(const char *s, edl_elastic_mode *out)
{
    int i = name_index(s, mode_names, 3);
    if (i < 0)
        return EDL_ECONFIG;
    *out = (edl_elastic_mode)i;
    return 0;
}

void edl_spec_init(edl_job_spec *s)
{
    memset(s, 0, sizeof *s);
    s->min = 1;
    s->max = 1;
    s->replicas = -1;
    s->settle_ms = 1000;
    s->max_restarts = 10;
    s->restart_policy = EDL_RESTART_ON_FAILURE;
    edl_exit_codes_parse("1-127", s->permanent_codes);
    s->exclude_after = 2;
    s->fail_fast = true;
    s->cooldown_ms = 10000;
    s->cooldown_max_ms = 300000;
    s->ttl_s = 10;
    s->mode = EDL_MODE_AUTO;
    s->ps_replicas = -1; /* ps_min = ps_max = 0: no parameter servers */
    s->teachers_replicas = -1; /* teachers_min = teachers_max = 0: no teachers */
}

void edl_spec_clear(edl_job_spec *s)
{
    free(s->checkpoint_uri);
    edl_spec_init(s);
}

int edl_spec_copy(edl_job_spec *dst, const edl_job_spec *src)
{
    char *uri = src->checkpoint_uri ? strdup(src->checkpoint_uri) : NULL;
    if (src->checkpoint_uri && !uri)
        return EDL_ENOMEM;
    free(dst->checkpoint_uri);
    *dst = *src;
    dst->checkpoint_uri = uri;
    return 0;
}

int edl_spec_desired_pods(const edl_job_spec *s)
{
    return s->replicas < 0 ? s->max : s->replicas;
}

int edl_spec_desired_servers(const edl_job_spec *s)
{
    if (s->ps_max <= 0)
        return 0;
    return s->ps_replicas < 0 ? s->ps_max : s->ps_replicas;
}

int edl_spec_desired_teachers(const edl_job_spec *s)
{
    if (s->teachers_max <= 0)
        return 0;
    return s->teachers_replicas < 0 ? s->teachers_max : s->teachers_replicas;
}

bool edl_teacher_service_valid(const char *s)
{
    return edl_dns_label_valid(s);
}

int edl_exit_codes_parse(const char *s, uint8_t bits[32])
{
    uint8_t b[32] = {0};
    const char *p = s;
    if (!s)
        return EDL_EINVAL;
    while (*p) {
        char *end;
        long lo = strtol(p, &end, 10), hi;
        if (end == p || lo < 0 || lo > 255)
            return EDL_ECONFIG;
        p = end;
        hi = lo;
        if (*p == '-') {
            p++;
            hi = strtol(p, &end, 10);
            if (end == p || hi < lo || hi > 255)
                return EDL_ECONFIG;
            p = end;
        }
        for (long i = lo; i <= hi; i++)
            b[i / 8] |= (uint8_t)(1u << (i % 8));
        if (*p == ',')
            p++;
        else if (*p)
            return EDL_ECONFIG;
    }
    memcpy(bits, b, sizeof b);
    return 0;
}

static char *exit_codes_format(const uint8_t bits[32])
{
    char buf[1200];
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < 256; i++) {
        if (!edl_exit_code_in(bits, i))
            continue;
        int j = i;
        while (j + 1 < 256 && edl_exit_code_in(bits, j + 1))
            j++;
        n += (size_t)snprintf(buf + n, sizeof buf - n, j > i ? "%s%d-%d" : "%s%d", n ? "," : "", i,
                              j);
        i = j;
    }
    return strdup(buf);
}

/* A role beside the workers (ps, teachers): none (min = max = 0, replicas -1 or 0), or
 * 1 <= min <= max <= hi with replicas -1 (= max) or lo..max. `what` names its members. */
static int validate_role(const char *role, const char *what, int min, int max, int replicas,
                         int hi, int lo, char *err, size_t errlen)
{
    if (min == 0 && max == 0)
        return replicas <= 0 && replicas >= -1 ? 0 :
               edl_errf(err, errlen, EDL_ECONFIG, "spec: %s.replicas is %d but the job has no "
                        "%s role (%s.max 0)", role, replicas, role, role);
    if (min < 1)
        return edl_errf(err, errlen, EDL_ECONFIG, "spec: %s.min is %d; it must be at least 1 "
                        "(leave out \"%s\" for a job without %s)", role, min, role, what);
    if (max < min)
        return edl_errf(err, errlen, EDL_ECONFIG, "spec: %s.min (%d) is greater than %s.max "
                        "(%d)", role, min, role, max);
    if (max > hi)
        return edl_errf(err, errlen, EDL_ECONFIG, "spec: %s.max is %d; a job has at most %d %s",
                        role, max, hi, what);
    if (replicas < -1 || (replicas != -1 && (replicas < lo || replicas > max)))
        return edl_errf(err, errlen, EDL_ECONFIG, "spec: %s.replicas is %d; it must be -1 (= "
                        "%s.max) or %d..%d", role, replicas, role, lo, max);
    return 0;
}

/* The ps role: replicas may be 0 (servers stopped); teachers: min..max, and a service name. */
static int validate_roles(const edl_job_spec *s, char *err, size_t errlen)
{
    int rc = validate_role("ps", "parameter servers", s->ps_min, s->ps_max, s->ps_replicas,
                           EDL_PS_SERVERS_MAX, 0, err, errlen);
    if (rc == 0)
        rc = validate_role("teachers", "teachers", s->teachers_min, s->teachers_max,
                           s->teachers_replicas, EDL_TEACHERS_MAX, s->teachers_min, err, errlen);
    if (rc == 0 && s->teachers_max > 0 && !edl_teacher_service_valid(s->teachers_service))
        rc = edl_errf(err, errlen, EDL_ECONFIG, "spec: teachers.service \"%s\" is not a "
                      "service name: 1-63 of [a-z0-9-], not starting or ending with '-'",
                      s->teachers_service);
    return rc;
}

int edl_spec_validate(const edl_job_spec *s, char *err, size_t errlen)
{
    if (s->min < 1)
        return edl_errf(err, errlen, EDL_ECONFIG, "spec: min is %d; it must be at least 1",
                        s->min);
    if (s->max < s->min)
        return edl_errf(err, errlen, EDL_ECONFIG, "spec: min (%d) is greater than max (%d)",
                        s->min, s->max);
    if (s->ttl_s < 1)
        return edl_errf(err, errlen, EDL_ECONFIG, "spec: ttl_s is %lld; a lease TTL must be at "
                        "least 1 second", (long long)s->ttl_s);
    if (s->cooldown_max_ms < s->cooldown_ms)
        return edl_errf(err, errlen, EDL_ECONFIG, "spec: cooldown_max_ms (%lld) is below "
                        "cooldown_ms (%lld)", (long long)s->cooldown_max_ms,
                        (long long)s->cooldown_ms);
    if (s->max_restarts < 0 || s->max_restarts > EDL_RESTARTS_MAX)
        return edl_errf(err, errlen, EDL_ECONFIG, "spec: max_restarts is %d; it must be 0..%d",
                        s->max_restarts, EDL_RESTARTS_MAX);
    return validate_roles(s, err, errlen);
}

/* A role's optional object (key: "ps", "teachers"): min is required, max defaults to min,
 * replicas to -1; ranges are checked by validate_roles. *rr is left open on the object for the
 * role's own fields (false: no such object). `absent` says what leaving it out means. */
static bool read_role(edl_json_reader *r, const char *key, const char *path, const char *absent,
                      int *min, int *max, int *replicas, edl_json_reader *rr)
{
    const cJSON *o = edl_json_object(r, key);
    if (!o || r->rc)
        return false;
    *rr = (edl_json_reader){o, path, r->err, r->errlen, 0, true};
    edl_json_int(rr, "min", INT_MIN, INT_MAX, min);
    rr->required = false;
    *max = *min;
    edl_json_int(rr, "max", INT_MIN, INT_MAX, max);
    edl_json_int(rr, "replicas", INT_MIN, INT_MAX, replicas);
    if (!rr->rc && *min < 1) /* 0 would read as "no such role" */
        edl_json_fail(rr, EDL_ECONFIG, "min", absent);
    return true;
}

/* {"min": N, "max": M, "replicas": R}. */
static void read_ps(edl_json_reader *r, edl_job_spec *s)
{
    edl_json_reader pr;
    if (read_role(r, "ps", "spec.ps", "must be at least 1 (leave out \"ps\" for a job without "
                  "parameter servers)", &s->ps_min, &s->ps_max, &s->ps_replicas, &pr))
        r->rc = pr.rc;
}

/* {"min": N, "max": M, "replicas": R, "service": "name"}: the service is required too. */
static void read_teachers(edl_json_reader *r, edl_job_spec *s)
{
    edl_json_reader tr;
    if (!read_role(r, "teachers", "spec.teachers", "must be at least 1 (leave out \"teachers\" "
                   "for a job without teachers)", &s->teachers_min, &s->teachers_max,
                   &s->teachers_replicas, &tr))
        return;
    const char *svc = NULL;
    tr.required = true;
    if (edl_json_cstr(&tr, "service", EDL_TEACHER_SERVICE_MAX, &svc))
        snprintf(s->teachers_service, sizeof s->teachers_service, "%s", svc);
    r->rc = tr.rc;
}

/* Every field of the document into s (absent ones keep their defaults). */
static void read_spec(edl_json_reader *r, edl_job_spec *s)
{
    const int64_t day = 86400000;
    edl_json_int(r, "min", INT_MIN, EDL_MEMBERS_MAX, &s->min);
    if (!edl_json_int(r, "max", INT_MIN, EDL_MEMBERS_MAX, &s->max) && edl_json_field(r, "min"))
        s->max = s->min;
    edl_json_int(r, "replicas", -1, EDL_MEMBERS_MAX, &s->replicas);
    edl_json_i64(r, "settle_ms", 0, day, &s->settle_ms);
    edl_json_int(r, "max_restarts", 0, EDL_RESTARTS_MAX, &s->max_restarts);
    int v = (int)s->restart_policy;
    if (edl_json_enum(r, "restart_policy", policy_names, 3, &v))
        s->restart_policy = (edl_restart_policy)v;
    const char *codes = NULL;
    if (edl_json_cstr(r, "permanent_exit_codes", 1024, &codes) &&
        edl_exit_codes_parse(codes, s->permanent_codes) != 0)
        edl_json_fail(r, EDL_ECONFIG, "permanent_exit_codes",
                      "must look like \"1-127,200\" (codes 0-255)");
    edl_json_int(r, "exclude_after", 1, EDL_RESTARTS_MAX, &s->exclude_after);
    edl_json_i64(r, "cooldown_ms", 0, day, &s->cooldown_ms);
    edl_json_i64(r, "cooldown_max_ms", 0, day, &s->cooldown_max_ms);
    edl_json_i64(r, "progress_timeout_ms", 0, day, &s->progress_timeout_ms);
    edl_json_i64(r, "ttl_s", INT32_MIN, 86400, &s->ttl_s);
    v = (int)s->mode;
    if (edl_json_enum(r, "elastic_mode", mode_names, 3, &v))
        s->mode = (edl_elastic_mode)v;
    edl_json_str(r, "checkpoint_uri", 4096, &s->checkpoint_uri);
    edl_json_bool(r, "stopped", &s->stopped);
    edl_json_bool(r, "fail_fast", &s->fail_fast);
    read_ps(r, s);
    read_teachers(r, s);
}

int edl_spec_parse(const char *json, size_t len, edl_job_spec *out, char *err, size_t errlen)
{
    int rc;
    cJSON *root = edl_json_parse_object(json, len, EDL_DOC_MAX, "spec", err, errlen, &rc);
    if (!root)
        return rc;
    edl_job_spec s;
    edl_spec_init(&s);
    edl_json_reader r = {root, "spec", err, errlen, 0};
    read_spec(&r, &s);
    cJSON_Delete(root);
    if (!r.rc)
        r.rc = edl_spec_validate(&s, err, errlen);
    if (r.rc) {
        edl_spec_clear(&s);
        return r.rc;
    }
    free(out->checkpoint_uri);
    *out = s;
    return 0;
}

char *edl_spec_to_json(const edl_job_spec *s)
{
    cJSON *o = cJSON_CreateObject();
    char *codes = exit_codes_format(s->permanent_codes);
    if (!o || !codes) {
        cJSON_Delete(o);
        free(codes);
        return NULL;
    }
    cJSON_AddNumberToObject(o, "min", s->min);
    cJSON_AddNumberToObject(o, "max", s->max);
    cJSON_AddNumberToObject(o, "replicas", s->replicas);
    cJSON_AddNumberToObject(o, "settle_ms", (double)s->settle_ms);
    cJSON_AddNumberToObject(o, "max_restarts", s->max_restarts);
    cJSON_AddStringToObject(o, "restart_policy", edl_restart_policy_name(s->restart_policy));
    cJSON_AddStringToObject(o, "permanent_exit_codes", codes);
    cJSON_AddNumberToObject(o, "exclude_after", s->exclude_after);
    cJSON_AddNumberToObject(o, "cooldown_ms", (double)s->cooldown_ms);
    cJSON_AddNumberToObject(o, "cooldown_max_ms", (double)s->cooldown_max_ms);
    cJSON_AddNumberToObject(o, "progress_timeout_ms", (double)s->progress_timeout_ms);
    cJSON_AddNumberToObject(o, "ttl_s", (double)s->ttl_s);
    cJSON_AddStringToObject(o, "elastic_mode", edl_elastic_mode_name(s->mode));
    if (s->checkpoint_uri)
        cJSON_AddStringToObject(o, "checkpoint_uri", s->checkpoint_uri);
    cJSON_AddBoolToObject(o, "stopped", s->stopped);
    cJSON_AddBoolToObject(o, "fail_fast", s->fail_fast);
    if (s->ps_max > 0) {
        cJSON *ps = cJSON_AddObjectToObject(o, "ps");
        cJSON_AddNumberToObject(ps, "min", s->ps_min);
        cJSON_AddNumberToObject(ps, "max", s->ps_max);
        cJSON_AddNumberToObject(ps, "replicas", s->ps_replicas);
    }
    if (s->teachers_max > 0) {
        cJSON *t = cJSON_AddObjectToObject(o, "teachers");
        cJSON_AddNumberToObject(t, "min", s->teachers_min);
        cJSON_AddNumberToObject(t, "max", s->teachers_max);
        cJSON_AddNumberToObject(t, "replicas", s->teachers_replicas);
        cJSON_AddStringToObject(t, "service", s->teachers_service);
    }
    free(codes);
    return edl_json_print_consume(o);
}

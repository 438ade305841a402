/* trainingjob.c: the TrainingJob resource (edl/trainingjob.h, deploy/k8s/crd.yaml) read into the
 * job spec, the pod templates (the workers', spec.ps's and spec.teachers's) and the operator's
 * own settings, with the CRD's defaults applied here (an old API server, or `edl run -f`, has not applied them).
 *
 * Every problem names the field by its path ("spec.template.spec.containers[0].args[2]") and
 * says what is wrong without repeating the path, so that `edl run -f` can put the manifest's
 * line in front and the operator can put the object's name. Bounds are those of the CRD, and
 * never wider than what edl_spec_parse accepts back from etcd (a day for every duration), so a
 * manifest that reads here never yields a spec the job server refuses. */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/json.h"
#include "edl/trainingjob.h"

#define DAY_MS INT64_C(86400000)
#define DURATION_MAX_MS (30 * DAY_MS)
#define COMMAND_MAX 4096     /* elements of command + args */
#define STRING_MAX 65536     /* one argument */

typedef struct tj_ctx {
    char *field;
    size_t fieldlen;
    char *err;
    size_t errlen;
    int rc;
    int pods_max;   /* the most pods of a job, each role and all together (EDL_TJ_PODS_MAX) */
} tj_ctx;

/* Record the first problem: field = pre.name (pre alone when name is NULL). */
static bool fail(tj_ctx *c, int rc, const char *pre, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static bool fail(tj_ctx *c, int rc, const char *pre, const char *name, const char *fmt, ...)
{
    if (c->rc)
        return false;
    c->rc = rc;
    if (c->field && c->fieldlen)
        snprintf(c->field, c->fieldlen, "%s%s%s", pre, name && *pre ? "." : "", name ? name : "");
    if (c->err && c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->errlen, fmt, ap);
        va_end(ap);
    }
    return false;
}

static void path_of(char *buf, size_t n, const char *pre, const char *name)
{
    snprintf(buf, n, "%s%s%s", pre, *pre ? "." : "", name);
}

/* The field when the context is still good and it is present (not null). */
static const cJSON *field(tj_ctx *c, const cJSON *obj, const char *pre, const char *name,
                          bool required)
{
    if (c->rc)
        return NULL;
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (f && cJSON_IsNull(f))
        f = NULL;
    if (!f && required)
        fail(c, EDL_EPROTO, pre, name, "is required");
    return f;
}

static bool get_i64(tj_ctx *c, const cJSON *obj, const char *pre, const char *name, int64_t lo,
                    int64_t hi, int64_t *out)
{
    const cJSON *f = field(c, obj, pre, name, false);
    if (!f)
        return false;
    double d = cJSON_IsNumber(f) ? f->valuedouble : NAN;
    if (!isfinite(d) || d != floor(d))
        return fail(c, EDL_EPROTO, pre, name, "must be an integer");
    if (d < (double)lo || d > (double)hi)
        return fail(c, EDL_ECONFIG, pre, name, "is %.0f; it must be %lld..%lld", d,
                    (long long)lo, (long long)hi);
    *out = (int64_t)d;
    return true;
}

static bool get_int(tj_ctx *c, const cJSON *obj, const char *pre, const char *name, int lo,
                    int hi, int *out)
{
    int64_t v;
    if (!get_i64(c, obj, pre, name, lo, hi, &v))
        return false;
    *out = (int)v;
    return true;
}

#define PODS_MAX_HOW "this cluster's bound on a job's pods: the operator's --max-replicas, " \
    "the chart value maxReplicas and the CRD's maximum, which its administrator may raise " \
    "(docs/kubernetes.md)"

/* A role's replicas or bound: lo..hard (the role's own limit), and at most the cluster's
 * bound on a job's pods, which a refusal names as such. */
static bool get_pods(tj_ctx *c, const cJSON *obj, const char *pre, const char *name, int lo,
                     int hard, int *out)
{
    int v;
    if (!get_int(c, obj, pre, name, lo, hard, &v))
        return false;
    if (v > c->pods_max)
        return fail(c, EDL_ECONFIG, pre, name, "is %d; at most %d (" PODS_MAX_HOW ")", v,
                    c->pods_max);
    *out = v;
    return true;
}

static bool get_bool(tj_ctx *c, const cJSON *obj, const char *pre, const char *name, bool *out)
{
    const cJSON *f = field(c, obj, pre, name, false);
    if (!f)
        return false;
    if (!cJSON_IsBool(f))
        return fail(c, EDL_EPROTO, pre, name, "must be true or false");
    *out = cJSON_IsTrue(f);
    return true;
}

static bool get_str(tj_ctx *c, const cJSON *obj, const char *pre, const char *name,
                    bool required, size_t max_len, const char **out)
{
    const cJSON *f = field(c, obj, pre, name, required);
    if (!f)
        return false;
    if (!cJSON_IsString(f))
        return fail(c, EDL_EPROTO, pre, name, "must be a string");
    if (strlen(f->valuestring) > max_len)
        return fail(c, EDL_ETOOBIG, pre, name, "is longer than %zu bytes", max_len);
    *out = f->valuestring;
    return true;
}

static bool get_enum(tj_ctx *c, const cJSON *obj, const char *pre, const char *name,
                     const char *const *names, int n, int *out)
{
    const char *s = NULL;
    if (!get_str(c, obj, pre, name, false, 64, &s))
        return false;
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return true;
        }
    char list[160] = "";
    for (int i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", names[i]);
    return fail(c, EDL_ECONFIG, pre, name, "is \"%s\"; it must be one of %s", s, list);
}

static bool get_duration(tj_ctx *c, const cJSON *obj, const char *pre, const char *name,
                         int64_t max_ms, int64_t *out)
{
    const char *s = NULL;
    int64_t ms;
    if (!get_str(c, obj, pre, name, false, 64, &s))
        return false;
    if (edl_duration_parse(s, &ms) != 0)
        return fail(c, EDL_ECONFIG, pre, name, "is \"%s\"; it must be a duration like 1s, "
                    "500ms or 1m30s", s);
    if (ms > max_ms)
        return fail(c, EDL_ECONFIG, pre, name, "is \"%s\"; it must be at most %lld hours", s,
                    (long long)(max_ms / 3600000));
    *out = ms;
    return true;
}

static const cJSON *get_obj(tj_ctx *c, const cJSON *obj, const char *pre, const char *name,
                            bool required)
{
    const cJSON *f = field(c, obj, pre, name, required);
    if (f && !cJSON_IsObject(f)) {
        fail(c, EDL_EPROTO, pre, name, "must be an object (a mapping)");
        return NULL;
    }
    return f;
}

static const cJSON *get_arr(tj_ctx *c, const cJSON *obj, const char *pre, const char *name,
                            bool required)
{
    const cJSON *f = field(c, obj, pre, name, required);
    if (f && !cJSON_IsArray(f)) {
        fail(c, EDL_EPROTO, pre, name, "must be a list");
        return NULL;
    }
    return f;
}

/* ---- durations -------------------------------------------------------------------------- */

int edl_duration_parse(const char *s, int64_t *ms)
{
    if (!s || !*s)
        return EDL_ECONFIG;
    int64_t total = 0;
    const char *p = s;
    while (*p) {
        int64_t ip = 0, fp = 0, scale = 1;
        const char *start = p;
        for (; *p >= '0' && *p <= '9'; p++) {
            if (ip > DURATION_MAX_MS) /* far past any bound; stop before overflow */
                return EDL_ECONFIG;
            ip = ip * 10 + (*p - '0');
        }
        if (p == start)
            return EDL_ECONFIG;
        if (*p == '.') {
            const char *f = ++p;
            for (; *p >= '0' && *p <= '9'; p++)
                if (scale < 1000000000) { /* further digits are below a nanosecond */
                    fp = fp * 10 + (*p - '0');
                    scale *= 10;
                }
            if (p == f)
                return EDL_ECONFIG;
        }
        int64_t unit;
        if (p[0] == 'm' && p[1] == 's')
            unit = 1, p += 2;
        else if (*p == 's')
            unit = 1000, p++;
        else if (*p == 'm')
            unit = 60000, p++;
        else if (*p == 'h')
            unit = 3600000, p++;
        else
            return EDL_ECONFIG;
        if (ip > DURATION_MAX_MS / unit)
            return EDL_ECONFIG;
        total += ip * unit + fp * unit / scale;
        if (total > DURATION_MAX_MS)
            return EDL_ECONFIG;
    }
    *ms = total;
    return 0;
}

/* ---- metadata ------------------------------------------------------------------------------ */

bool edl_tj_name_valid(const char *s)
{
    return s[0] >= 'a' && s[0] <= 'z' && strlen(s) <= EDL_TJ_NAME_MAX && edl_dns_label_valid(s);
}

static void read_metadata(tj_ctx *c, const cJSON *obj, edl_trainingjob *tj)
{
    const cJSON *md = get_obj(c, obj, "", "metadata", true);
    const char *name = NULL, *ns = "default", *uid = NULL;
    if (get_str(c, md, "metadata", "name", true, 253, &name) && !edl_tj_name_valid(name))
        fail(c, EDL_ECONFIG, "metadata", "name", "is \"%s\"; " EDL_TJ_NAME_RULE, name);
    if (get_str(c, md, "metadata", "namespace", false, 63, &ns) && !edl_dns_label_valid(ns))
        fail(c, EDL_ECONFIG, "metadata", "namespace", "is \"%s\"; not a valid namespace", ns);
    get_str(c, md, "metadata", "uid", false, 128, &uid);
    get_i64(c, md, "metadata", "generation", 0, EDL_JSON_MAX_EXACT, &tj->generation);
    const char *ts = NULL;
    tj->deleting = get_str(c, md, "metadata", "deletionTimestamp", false, 64, &ts);
    if (c->rc)
        return;
    tj->name = strdup(name);
    tj->ns = strdup(ns);
    tj->uid = uid ? strdup(uid) : NULL;
    if (!tj->name || !tj->ns || (uid && !tj->uid))
        fail(c, EDL_ENOMEM, "metadata", NULL, "out of memory");
}

/* ---- spec ------------------------------------------------------------------------------------ */

static const char *const policy_names[] = {"OnFailure", "ExitCode", "Never"};
static const char *const mode_names[] = {"Restart", "InProcess"};
static const char *const clean_names[] = {"Running", "All", "None"}; /* edl_clean_pod_policy */

static void read_exit_codes(tj_ctx *c, const cJSON *el, edl_job_spec *s)
{
    const char *pre = "spec.elastic";
    const cJSON *codes = get_arr(c, el, pre, "permanentExitCodes", false);
    if (!codes)
        return;
    uint8_t bits[32] = {0};
    int i = 0;
    for (const cJSON *it = codes->child; it && !c->rc; it = it->next, i++) {
        char name[48];
        snprintf(name, sizeof name, "permanentExitCodes[%d]", i);
        double d = cJSON_IsNumber(it) ? it->valuedouble : NAN;
        if (!isfinite(d) || d != floor(d))
            fail(c, EDL_EPROTO, pre, name, "must be an integer");
        else if (d < 1 || d > 127)
            fail(c, EDL_ECONFIG, pre, name, "is %.0f; an exit code that fails the job must be "
                 "1..127 (128 and above are deaths by signal)", d);
        else
            bits[(int)d / 8] |= (uint8_t)(1u << ((int)d % 8));
    }
    if (!c->rc)
        memcpy(s->permanent_codes, bits, sizeof bits);
}

static void read_elastic(tj_ctx *c, const cJSON *spec, edl_job_spec *s)
{
    const char *pre = "spec.elastic";
    const cJSON *el = get_obj(c, spec, "spec", "elastic", false);
    if (!el)
        return;
    int v = (int)s->mode;
    if (get_enum(c, el, pre, "mode", mode_names, 2, &v))
        s->mode = (edl_elastic_mode)v;
    get_duration(c, el, pre, "settleWindow", DAY_MS, &s->settle_ms);
    get_i64(c, el, pre, "leaseTTLSeconds", 1, 86400, &s->ttl_s);
    v = (int)s->restart_policy;
    if (get_enum(c, el, pre, "restartPolicy", policy_names, 3, &v))
        s->restart_policy = (edl_restart_policy)v;
    get_int(c, el, pre, "maxRestarts", 0, EDL_RESTARTS_MAX, &s->max_restarts);
    get_bool(c, el, pre, "failFast", &s->fail_fast);
    /* like `edl run --permanent-exit-codes`: accepted with any policy, used by ExitCode */
    read_exit_codes(c, el, s);
    get_duration(c, el, pre, "progressTimeout", DAY_MS, &s->progress_timeout_ms);
    const char *ex = "spec.elastic.exclusion";
    const cJSON *exc = get_obj(c, el, pre, "exclusion", false);
    if (exc) {
        get_int(c, exc, ex, "afterFailures", 1, EDL_RESTARTS_MAX, &s->exclude_after);
        get_duration(c, exc, ex, "cooldown", DAY_MS, &s->cooldown_ms);
        get_duration(c, exc, ex, "maxCooldown", DAY_MS, &s->cooldown_max_ms);
    }
}

/* spec.ps, the parameter servers: replicas and bounds spelled and defaulted as the workers'
 * (replicas 1, minReplicas 1, maxReplicas max(replicas, minReplicas)); its template is read by
 * read_template. Absent (or null): no ps role (ps_max stays 0). */
static void read_ps(tj_ctx *c, const cJSON *spec, edl_job_spec *s)
{
    const char *pre = "spec.ps";
    const cJSON *ps = get_obj(c, spec, "spec", "ps", false);
    if (!ps)
        return;
    int replicas = 1, min = 1, max = 0;
    get_pods(c, ps, pre, "replicas", 0, EDL_PS_SERVERS_MAX, &replicas);
    get_pods(c, ps, pre, "minReplicas", 1, EDL_PS_SERVERS_MAX, &min);
    if (!get_pods(c, ps, pre, "maxReplicas", 1, EDL_PS_SERVERS_MAX, &max))
        max = replicas > min ? replicas : min;
    s->ps_replicas = replicas;
    s->ps_min = min;
    s->ps_max = max;
}

/* spec.teachers, distillation's teachers: replicas and bounds spelled and defaulted as the
 * workers' (replicas 1, minReplicas 1, maxReplicas max(replicas, minReplicas)), the service
 * they register in (required, a DNS label), the model and capacity the agent publishes; its
 * template is read by read_template. Absent (or null): no teacher role (teachers_max stays
 * 0). The teacher pods' names are their instance names in the service: DNS labels, as every
 * job name makes them (EDL_TJ_NAME_RULE). */
static void read_teachers(tj_ctx *c, const cJSON *spec, edl_trainingjob *tj)
{
    const char *pre = "spec.teachers";
    edl_job_spec *s = &tj->spec;
    const cJSON *t = get_obj(c, spec, "spec", "teachers", false);
    if (!t)
        return;
    int replicas = 1, min = 1, max = 0;
    get_pods(c, t, pre, "replicas", 1, EDL_TEACHERS_MAX, &replicas);
    get_pods(c, t, pre, "minReplicas", 1, EDL_TEACHERS_MAX, &min);
    if (!get_pods(c, t, pre, "maxReplicas", 1, EDL_TEACHERS_MAX, &max))
        max = replicas > min ? replicas : min;
    const char *svc = NULL, *model = NULL;
    if (get_str(c, t, pre, "service", true, 253, &svc) && !edl_teacher_service_valid(svc))
        fail(c, EDL_ECONFIG, pre, "service", "is \"%s\"; it must be a DNS label: 1-63 of "
             "[a-z0-9-], not starting or ending with '-'", svc);
    if (get_str(c, t, pre, "model", false, 253, &model) && !edl_name_valid(model))
        fail(c, EDL_ECONFIG, pre, "model", "is \"%s\"; it must be 1-128 of [A-Za-z0-9._-], not "
             "starting with '.' or '-' (it goes into the path /v1/models/MODEL)", model);
    get_int(c, t, pre, "capacity", 1, 65535, &tj->teacher_capacity);
    if (c->rc)
        return;
    if (model && !(tj->teacher_model = strdup(model))) {
        fail(c, EDL_ENOMEM, pre, "model", "out of memory");
        return;
    }
    s->teachers_replicas = replicas;
    s->teachers_min = min;
    s->teachers_max = max;
    snprintf(s->teachers_service, sizeof s->teachers_service, "%s", svc);
}

static const char *const gang_names[] = {"default", "volcano", "scheduler-plugins"};

static char *dup_or_fail(tj_ctx *c, const char *pre, const char *name, const char *v)
{
    char *s = v ? strdup(v) : NULL;
    if (v && !s)
        fail(c, EDL_ENOMEM, pre, name, "out of memory");
    return s;
}

/* spec.schedulingPolicy (gang scheduling, queues, priority) and Kueue's queue label. */
static void read_scheduling(tj_ctx *c, const cJSON *obj, const cJSON *spec, edl_trainingjob *tj)
{
    const char *pre = "spec.schedulingPolicy";
    edl_scheduling *s = &tj->sched;
    s->schedule_timeout_s = -1;
    const cJSON *labels = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(obj, "metadata"), "labels");
    const cJSON *kq = cJSON_GetObjectItemCaseSensitive(labels, EDL_KUEUE_QUEUE_LABEL);
    if (cJSON_IsString(kq) && kq->valuestring[0])
        s->kueue_queue = dup_or_fail(c, "metadata.labels", EDL_KUEUE_QUEUE_LABEL, kq->valuestring);
    const cJSON *sp = get_obj(c, spec, "spec", "schedulingPolicy", false);
    if (!sp)
        return;
    int gang = EDL_GANG_NONE;
    if (get_enum(c, sp, pre, "scheduler", gang_names, 3, &gang))
        s->gang = (edl_gang)gang;
    const char *name = NULL, *queue = NULL, *prio = NULL;
    if (get_str(c, sp, pre, "schedulerName", false, 253, &name) && !edl_dns_label_valid(name))
        fail(c, EDL_ECONFIG, pre, "schedulerName", "is \"%s\"; not a scheduler's name", name);
    get_str(c, sp, pre, "queue", false, 253, &queue);
    if (get_str(c, sp, pre, "priorityClass", false, 253, &prio) && !edl_dns_label_valid(prio))
        fail(c, EDL_ECONFIG, pre, "priorityClass", "is \"%s\"; not a PriorityClass's name", prio);
    get_int(c, sp, pre, "minAvailable", 1, EDL_MEMBERS_MAX, &s->min_available);
    get_i64(c, sp, pre, "scheduleTimeoutSeconds", 1, INT32_MAX, &s->schedule_timeout_s);
    if (c->rc)
        return;
    s->scheduler_name = dup_or_fail(c, pre, "schedulerName", name);
    s->queue = dup_or_fail(c, pre, "queue", queue);
    s->priority_class = dup_or_fail(c, pre, "priorityClass", prio);
}

int edl_trainingjob_min_available(const edl_trainingjob *tj)
{
    if (tj->sched.min_available > 0)
        return tj->sched.min_available;
    const edl_job_spec *s = &tj->spec;
    return s->min + (s->ps_max > 0 ? s->ps_min : 0) + (s->teachers_max > 0 ? s->teachers_min : 0);
}

const char *edl_trainingjob_scheduler_name(const edl_trainingjob *tj)
{
    if (tj->sched.scheduler_name)
        return tj->sched.scheduler_name;
    return tj->sched.gang == EDL_GANG_VOLCANO ? "volcano"
           : tj->sched.gang == EDL_GANG_COSCHEDULING ? "scheduler-plugins-scheduler"
                                                     : NULL;
}

static void read_spec(tj_ctx *c, const cJSON *spec, edl_trainingjob *tj)
{
    edl_job_spec *s = &tj->spec;
    int replicas = 1, min = 1, max = 0;
    get_pods(c, spec, "spec", "replicas", 0, EDL_MEMBERS_MAX, &replicas);
    get_pods(c, spec, "spec", "minReplicas", 1, EDL_MEMBERS_MAX, &min);
    if (!get_pods(c, spec, "spec", "maxReplicas", 1, EDL_MEMBERS_MAX, &max))
        max = replicas > min ? replicas : min;
    s->replicas = replicas;
    s->min = min;
    s->max = max;
    get_bool(c, spec, "spec", "suspend", &tj->suspend);
    int v = EDL_CLEAN_RUNNING;
    if (get_enum(c, spec, "spec", "cleanPodPolicy", clean_names, 3, &v))
        tj->clean_pod_policy = (edl_clean_pod_policy)v;
    get_i64(c, spec, "spec", "ttlSecondsAfterFinished", 0, INT32_MAX, &tj->ttl_after_finished_s);
    get_i64(c, spec, "spec", "activeDeadlineSeconds", 1, EDL_JSON_MAX_EXACT / 1000,
            &tj->active_deadline_s);
    read_elastic(c, spec, s);
    read_ps(c, spec, s);
    read_teachers(c, spec, tj);
    const cJSON *ck = get_obj(c, spec, "spec", "checkpoint", false);
    const char *uri = NULL;
    if (ck && get_str(c, ck, "spec.checkpoint", "uri", false, 4096, &uri) &&
        !(s->checkpoint_uri = strdup(uri)))
        fail(c, EDL_ENOMEM, "spec.checkpoint", "uri", "out of memory");
}

/* A role's bounds in the manifest's words (spec.ps, spec.teachers): false after a failure.
 * below_min: replicas may not be under minReplicas. */
static bool check_role(tj_ctx *c, const char *path, const char *what, int min, int max,
                       int replicas, bool below_min)
{
    if (max <= 0)
        return true;
    if (min > max)
        fail(c, EDL_ECONFIG, path, NULL, "minReplicas (%d) is greater than maxReplicas (%d)",
             min, max);
    else if (replicas > max)
        fail(c, EDL_ECONFIG, path, NULL, "replicas (%d) is greater than maxReplicas (%d): a "
             "job runs at most maxReplicas %s (raise maxReplicas too)", replicas, max, what);
    else if (below_min && replicas < min)
        fail(c, EDL_ECONFIG, path, NULL, "replicas (%d) is below minReplicas (%d)", replicas,
             min);
    return c->rc == 0;
}

/* The rules between fields, in the manifest's words; edl_spec_validate checks the rest. */
static void check_spec(tj_ctx *c, const edl_job_spec *s)
{
    if (c->rc)
        return;
    if (s->min > s->max) {
        fail(c, EDL_ECONFIG, "spec", NULL, "minReplicas (%d) is greater than maxReplicas (%d)",
             s->min, s->max);
        return;
    }
    if (!check_role(c, "spec.ps", "parameter servers", s->ps_min, s->ps_max, s->ps_replicas,
                    false) ||
        !check_role(c, "spec.teachers", "teachers", s->teachers_min, s->teachers_max,
                    s->teachers_replicas, true))
        return;
    int servers = edl_spec_desired_servers(s), teachers = edl_spec_desired_teachers(s);
    if (s->replicas + servers + teachers > c->pods_max) {
        fail(c, EDL_ECONFIG, "spec", NULL, "the job's pods, %d workers (replicas) + %d "
             "parameter servers + %d teachers = %d, are more than %d (" PODS_MAX_HOW ")",
             s->replicas, servers, teachers, s->replicas + servers + teachers, c->pods_max);
        return;
    }
    if (s->cooldown_max_ms < s->cooldown_ms) {
        fail(c, EDL_ECONFIG, "spec.elastic.exclusion", NULL, "maxCooldown (%lld ms) is below "
             "cooldown (%lld ms; maxCooldown defaults to 5m)", (long long)s->cooldown_max_ms,
             (long long)s->cooldown_ms);
        return;
    }
    char msg[256];
    int rc = edl_spec_validate(s, msg, sizeof msg);
    if (rc)
        fail(c, rc, "spec", NULL, "%s", strncmp(msg, "spec: ", 6) == 0 ? msg + 6 : msg);
}

/* ---- the pod template --------------------------------------------------------------------- */

/* A pod template read: where its copy and its first container's command go. */
typedef struct tj_template {
    const char *what;              /* what its first container runs: "trainer", ... */
    cJSON **tmpl;
    char ***command;
    size_t *n_command;
} tj_template;

/* Every element of a list of strings at pre.name, appended to the template's command. */
static void add_strings(tj_ctx *c, const cJSON *arr, const char *pre, const char *name,
                        const tj_template *t)
{
    int i = 0;
    for (const cJSON *it = arr ? arr->child : NULL; it && !c->rc; it = it->next, i++) {
        char el[64];
        snprintf(el, sizeof el, "%s[%d]", name, i);
        if (!cJSON_IsString(it)) {
            fail(c, EDL_EPROTO, pre, el, "must be a string");
        } else if (strlen(it->valuestring) > STRING_MAX) {
            fail(c, EDL_ETOOBIG, pre, el, "is longer than %d bytes", STRING_MAX);
        } else if (*t->n_command >= COMMAND_MAX) {
            fail(c, EDL_ETOOBIG, pre, el, "command and args hold more than %d strings",
                 COMMAND_MAX);
        } else if (!((*t->command)[*t->n_command] = strdup(it->valuestring))) {
            fail(c, EDL_ENOMEM, pre, el, "out of memory");
        } else {
            (*t->n_command)++;
        }
    }
}

/* env: a list of {name, value} (valueFrom entries are the cluster's business). */
static void check_env(tj_ctx *c, const cJSON *ctr, const char *pre)
{
    const cJSON *env = get_arr(c, ctr, pre, "env", false);
    int i = 0;
    for (const cJSON *e = env ? env->child : NULL; e && !c->rc; e = e->next, i++) {
        char at[96];
        const char *s = NULL;
        snprintf(at, sizeof at, "%s.env[%d]", pre, i);
        if (!cJSON_IsObject(e)) {
            fail(c, EDL_EPROTO, at, NULL, "must be an object with name and value");
            return;
        }
        if (get_str(c, e, at, "name", true, 4096, &s) && (!*s || strchr(s, '=')))
            fail(c, EDL_ECONFIG, at, "name", "is \"%s\"; not a valid variable name", s);
        get_str(c, e, at, "value", false, STRING_MAX, &s);
    }
}

/* The pod template at pre.template (pre: "spec" for the workers, "spec.ps" for the servers,
 * "spec.teachers" for the teachers): its first container runs under edl-agent, so it needs a
 * command. */
static void read_template(tj_ctx *c, const cJSON *parent, const char *pre, const tj_template *t)
{
    char at[32], tp[48], cp[64];
    snprintf(at, sizeof at, "%s.template", pre);
    snprintf(tp, sizeof tp, "%s.spec", at);
    snprintf(cp, sizeof cp, "%s.containers[0]", tp);
    const cJSON *tmpl = get_obj(c, parent, pre, "template", true);
    const cJSON *ps = get_obj(c, tmpl, at, "spec", true);
    const cJSON *ctrs = get_arr(c, ps, tp, "containers", true);
    if (c->rc)
        return;
    if (!ctrs->child) {
        fail(c, EDL_ECONFIG, tp, "containers", "is empty; the first container runs the %s",
             t->what);
        return;
    }
    const cJSON *ctr = ctrs->child;
    if (!cJSON_IsObject(ctr)) {
        fail(c, EDL_EPROTO, cp, NULL, "must be an object (a mapping)");
        return;
    }
    const char *name = NULL;
    get_str(c, ctr, cp, "name", true, 253, &name);
    const cJSON *cmd = get_arr(c, ctr, cp, "command", false);
    const cJSON *args = get_arr(c, ctr, cp, "args", false);
    if (!c->rc && !cmd)
        fail(c, EDL_EPROTO, cp, "command", "is required: edl-agent runs the trainer as its "
             "child, so edl must know the command (an image's entrypoint is not visible to "
             "it); give the trainer's command here, and args are appended to it");
    else if (!c->rc && !cmd->child)
        fail(c, EDL_ECONFIG, cp, "command", "is empty; give the trainer's command");
    const char *wd = NULL;
    get_str(c, ctr, cp, "workingDir", false, 4096, &wd);
    check_env(c, ctr, cp);
    if (c->rc)
        return;
    size_t n = (size_t)cJSON_GetArraySize(cmd) + (size_t)cJSON_GetArraySize(args);
    *t->command = calloc((n < COMMAND_MAX ? n : COMMAND_MAX) + 1, sizeof **t->command);
    if (!*t->command) {
        fail(c, EDL_ENOMEM, cp, NULL, "out of memory");
        return;
    }
    add_strings(c, cmd, cp, "command", t);
    add_strings(c, args, cp, "args", t);
    if (!c->rc && !(*t->tmpl = cJSON_Duplicate(tmpl, true)))
        fail(c, EDL_ENOMEM, at, NULL, "out of memory");
}

/* Every template: the workers', spec.ps's with the ps role, spec.teachers's with teachers. */
static void read_templates(tj_ctx *c, const cJSON *spec, edl_trainingjob *tj)
{
    tj_template workers = {"trainer", &tj->pod_template, &tj->command, &tj->n_command};
    read_template(c, spec, "spec", &workers);
    tj_template servers = {"parameter server", &tj->ps_template, &tj->ps_command,
                           &tj->n_ps_command};
    if (tj->spec.ps_max > 0)
        read_template(c, cJSON_GetObjectItemCaseSensitive(spec, "ps"), "spec.ps", &servers);
    tj_template teachers = {"teacher's inference server", &tj->teacher_template,
                            &tj->teacher_command, &tj->n_teacher_command};
    if (tj->spec.teachers_max > 0)
        read_template(c, cJSON_GetObjectItemCaseSensitive(spec, "teachers"), "spec.teachers",
                      &teachers);
}

/* ---- the object ---------------------------------------------------------------------------- */

static void check_type(tj_ctx *c, const cJSON *obj)
{
    const char *av = NULL, *kind = NULL;
    if (get_str(c, obj, "", "apiVersion", true, 128, &av) && strcmp(av, EDL_TJ_API_VERSION))
        fail(c, EDL_ECONFIG, "", "apiVersion", "is \"%s\"; a TrainingJob is "
             EDL_TJ_API_VERSION, av);
    if (get_str(c, obj, "", "kind", true, 128, &kind) && strcmp(kind, EDL_TJ_KIND))
        fail(c, EDL_ECONFIG, "", "kind", "is \"%s\"; expected " EDL_TJ_KIND, kind);
}

int edl_trainingjob_parse(const cJSON *obj, edl_trainingjob *out, char *field, size_t fieldlen,
                          char *err, size_t errlen)
{
    return edl_trainingjob_parse_bounded(obj, EDL_TJ_PODS_MAX, out, field, fieldlen, err,
                                         errlen);
}

int edl_trainingjob_parse_bounded(const cJSON *obj, int pods_max, edl_trainingjob *out,
                                  char *field, size_t fieldlen, char *err, size_t errlen)
{
    if (pods_max < 1 || pods_max > EDL_MEMBERS_MAX)
        pods_max = EDL_TJ_PODS_MAX;
    tj_ctx c = {field, fieldlen, err, errlen, 0, pods_max};
    edl_trainingjob tj = {0};
    edl_spec_init(&tj.spec);
    tj.ttl_after_finished_s = -1;
    tj.active_deadline_s = -1;
    tj.clean_pod_policy = EDL_CLEAN_RUNNING;
    if (!cJSON_IsObject(obj)) {
        fail(&c, EDL_EPROTO, "", NULL, "a TrainingJob must be an object (a mapping)");
    } else {
        check_type(&c, obj);
        read_metadata(&c, obj, &tj);
        const cJSON *spec = get_obj(&c, obj, "", "spec", true);
        if (spec) {
            read_spec(&c, spec, &tj);
            check_spec(&c, &tj.spec);
            read_templates(&c, spec, &tj);
            read_scheduling(&c, obj, spec, &tj);
        }
    }
    if (c.rc) {
        edl_trainingjob_clear(&tj);
        *out = tj;
        return c.rc;
    }
    if (field && fieldlen)
        field[0] = '\0';
    *out = tj;
    return 0;
}

void edl_trainingjob_clear(edl_trainingjob *tj)
{
    free(tj->name);
    free(tj->ns);
    free(tj->uid);
    edl_spec_clear(&tj->spec);
    cJSON_Delete(tj->pod_template);
    for (size_t i = 0; tj->command && i < tj->n_command; i++)
        free(tj->command[i]);
    free(tj->command);
    cJSON_Delete(tj->ps_template);
    for (size_t i = 0; tj->ps_command && i < tj->n_ps_command; i++)
        free(tj->ps_command[i]);
    free(tj->ps_command);
    cJSON_Delete(tj->teacher_template);
    for (size_t i = 0; tj->teacher_command && i < tj->n_teacher_command; i++)
        free(tj->teacher_command[i]);
    free(tj->teacher_command);
    free(tj->teacher_model);
    free(tj->sched.scheduler_name);
    free(tj->sched.queue);
    free(tj->sched.priority_class);
    free(tj->sched.kueue_queue);
    memset(tj, 0, sizeof *tj);
}

/* ---- fields only a cluster uses -------------------------------------------------------------- */

static void report_keys(const cJSON *obj, const char *pre, const char *const *keep,
                        void (*report)(void *, const char *), void *arg)
{
    for (const cJSON *it = cJSON_IsObject(obj) ? obj->child : NULL; it; it = it->next) {
        bool kept = false;
        for (const char *const *k = keep; *k && !kept; k++)
            kept = strcmp(it->string, *k) == 0;
        if (!kept && !cJSON_IsNull(it)) {
            char path[512];
            path_of(path, sizeof path, pre, it->string);
            report(arg, path);
        }
    }
}

/* The fields of the pod template at pre ("spec.template", "spec.ps.template") that only a
 * cluster uses: all but the first container's name, command, args, env values and workingDir. */
static void report_template(const cJSON *tmpl, const char *pre,
                            void (*report)(void *, const char *), void *arg)
{
    static const char *const none[] = {NULL};
    static const char *const pod_keep[] = {"containers", NULL};
    static const char *const ctr_keep[] = {"name", "command", "args", "env", "workingDir", NULL};
    char at[64];
    snprintf(at, sizeof at, "%s.metadata", pre);
    report_keys(cJSON_GetObjectItemCaseSensitive(tmpl, "metadata"), at, none, report, arg);
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(tmpl, "spec");
    snprintf(at, sizeof at, "%s.spec", pre);
    report_keys(ps, at, pod_keep, report, arg);
    const cJSON *ctrs = cJSON_GetObjectItemCaseSensitive(ps, "containers");
    int i = 0;
    for (const cJSON *ctr = cJSON_IsArray(ctrs) ? ctrs->child : NULL; ctr; ctr = ctr->next, i++) {
        char cp[96];
        snprintf(cp, sizeof cp, "%s.spec.containers[%d]", pre, i);
        if (i > 0) {
            report(arg, cp);
            continue;
        }
        report_keys(ctr, cp, ctr_keep, report, arg);
        const cJSON *env = cJSON_GetObjectItemCaseSensitive(ctr, "env");
        int j = 0;
        for (const cJSON *e = cJSON_IsArray(env) ? env->child : NULL; e; e = e->next, j++)
            if (cJSON_GetObjectItemCaseSensitive(e, "valueFrom")) {
                char path[160];
                snprintf(path, sizeof path, "%s.env[%d].valueFrom", cp, j);
                report(arg, path);
            }
    }
}

void edl_trainingjob_cluster_only(const cJSON *obj, void (*report)(void *arg, const char *field),
                                  void *arg)
{
    static const char *const spec_cluster[] = {"cleanPodPolicy", "ttlSecondsAfterFinished",
                                               "schedulingPolicy"};
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(obj, "metadata");
    if (cJSON_GetObjectItemCaseSensitive(md, "namespace"))
        report(arg, "metadata.namespace");
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(obj, "spec");
    for (size_t i = 0; i < sizeof spec_cluster / sizeof *spec_cluster; i++)
        if (cJSON_GetObjectItemCaseSensitive(spec, spec_cluster[i])) {
            char path[64];
            path_of(path, sizeof path, "spec", spec_cluster[i]);
            report(arg, path);
        }
    report_template(cJSON_GetObjectItemCaseSensitive(spec, "template"), "spec.template", report,
                    arg);
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(spec, "ps");
    report_template(cJSON_GetObjectItemCaseSensitive(ps, "template"), "spec.ps.template", report,
                    arg);
    const cJSON *teachers = cJSON_GetObjectItemCaseSensitive(spec, "teachers");
    report_template(cJSON_GetObjectItemCaseSensitive(teachers, "template"),
                    "spec.teachers.template", report, arg);
}

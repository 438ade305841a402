/* cluster.c: the job model's JSON documents (spec, pod, trainer status, generation), key names
 * and rank assignment. Everything here is pure: no etcd calls, so the job server's decisions and
 * the parsers can be tested without a server. Documents come from etcd, which anyone with write
 * access can fill with anything: every field is type- and range-checked. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/cluster.h"

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

bool edl_name_valid(const char *name)
{
    if (!name || !*name || name[0] == '.' || name[0] == '-')
        return false;
    size_t n = 0;
    for (const char *p = name; *p; p++, n++) {
        char ch = *p;
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                  ch == '.' || ch == '_' || ch == '-';
        if (!ok || n >= EDL_NAME_MAX)
            return false;
    }
    return true;
}

char *edl_job_key(const char *prefix, const char *job, const char *rest)
{
    if (!prefix)
        prefix = EDL_DEFAULT_PREFIX;
    size_t plen = strlen(prefix);
    while (plen && prefix[plen - 1] == '/')
        plen--;
    size_t n = plen + strlen("/jobs/") + strlen(job) + 1 + strlen(rest ? rest : "") + 1;
    char *k = malloc(n);
    if (k)
        snprintf(k, n, "%.*s/jobs/%s/%s", (int)plen, prefix, job, rest ? rest : "");
    return k;
}

/* ---- JSON field readers: absent = keep the default, wrong type = error ---------------------- */

typedef struct reader {
    const cJSON *obj;
    const char *doc; /* "spec", "pod", ... for messages */
    char *err;
    size_t errlen;
    int rc;
} reader;

static const cJSON *field(reader *r, const char *name)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(r->obj, name);
    return (f && !cJSON_IsNull(f)) ? f : NULL;
}

static void fail(reader *r, int rc, const char *name, const char *what)
{
    if (r->rc)
        return;
    r->rc = rc;
    set_err(r->err, r->errlen, "%s: field \"%s\" %s", r->doc, name, what);
}

static void get_i64(reader *r, const char *name, int64_t lo, int64_t hi, int64_t *out)
{
    const cJSON *f = field(r, name);
    if (!f)
        return;
    double d = cJSON_IsNumber(f) ? f->valuedouble : NAN;
    if (!cJSON_IsNumber(f) || d != floor(d) || !isfinite(d)) {
        fail(r, EDL_EPROTO, name, "must be an integer");
        return;
    }
    if (d < (double)lo || d > (double)hi) {
        char msg[96];
        if (fabs(d) < 1e18)
            snprintf(msg, sizeof msg, "is %.0f, outside %lld..%lld", d, (long long)lo, (long long)hi);
        else
            snprintf(msg, sizeof msg, "is %g, outside %lld..%lld", d, (long long)lo, (long long)hi);
        fail(r, EDL_ECONFIG, name, msg);
        return;
    }
    *out = (int64_t)d;
}

/* Lease IDs use all 64 bits, more than a JSON number (a double) holds exactly: they travel as
 * hexadecimal strings, as etcdctl prints them. */
static void get_lease(reader *r, const char *name, int64_t *out)
{
    const cJSON *f = field(r, name);
    if (!f)
        return;
    const char *s = cJSON_IsString(f) ? f->valuestring : NULL;
    char *end = NULL;
    errno = 0;
    unsigned long long v = s ? strtoull(s, &end, 16) : 0;
    if (!s || !*s || *end || errno || strlen(s) > 16 || s[0] == '-' || s[0] == '+' || s[0] == ' ')
        fail(r, EDL_EPROTO, name, "must be a lease ID in hexadecimal");
    else
        *out = (int64_t)v;
}

static void get_int(reader *r, const char *name, int lo, int hi, int *out)
{
    int64_t v = *out;
    get_i64(r, name, lo, hi, &v);
    *out = (int)v;
}

static void get_bool(reader *r, const char *name, bool *out)
{
    const cJSON *f = field(r, name);
    if (!f)
        return;
    if (!cJSON_IsBool(f))
        fail(r, EDL_EPROTO, name, "must be true or false");
    else
        *out = cJSON_IsTrue(f);
}

/* A string of at most maxlen bytes; replaces *out (freeing the old one). */
static void get_str(reader *r, const char *name, size_t maxlen, char **out)
{
    const cJSON *f = field(r, name);
    if (!f)
        return;
    if (!cJSON_IsString(f)) {
        fail(r, EDL_EPROTO, name, "must be a string");
        return;
    }
    if (strlen(f->valuestring) > maxlen) {
        fail(r, EDL_ETOOBIG, name, "is too long");
        return;
    }
    char *s = strdup(f->valuestring);
    if (!s) {
        fail(r, EDL_ENOMEM, name, "could not be copied");
        return;
    }
    free(*out);
    *out = s;
}

/* Index of the string in names[] (n entries); -1 with an error when unknown. */
static int get_enum(reader *r, const char *name, const char *const *names, int n, int *out)
{
    char *s = NULL;
    get_str(r, name, 64, &s);
    if (!s)
        return -1;
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            free(s);
            return i;
        }
    char msg[160];
    snprintf(msg, sizeof msg, "has unknown value \"%.64s\"", s);
    free(s);
    fail(r, EDL_ECONFIG, name, msg);
    return -1;
}

/* Parse the top of a document: an object within the size limit. */
static cJSON *parse_doc(const char *json, size_t len, const char *doc, char *err, size_t errlen,
                        int *rc)
{
    if (!json) {
        set_err(err, errlen, "%s: no document", doc);
        *rc = EDL_EINVAL;
        return NULL;
    }
    if (len > EDL_DOC_MAX) {
        set_err(err, errlen, "%s: document of %zu bytes exceeds the %d-byte limit", doc, len,
                EDL_DOC_MAX);
        *rc = EDL_ETOOBIG;
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, false);
    if (!root) {
        size_t at = end && end >= json ? (size_t)(end - json) : 0;
        set_err(err, errlen, "%s: malformed JSON near byte %zu", doc, at);
        *rc = EDL_EPROTO;
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        set_err(err, errlen, "%s: expected a JSON object", doc);
        *rc = EDL_EPROTO;
        return NULL;
    }
    *rc = 0;
    return root;
}

/* ---- spec ------------------------------------------------------------------------------- */

static const char *const policy_names[] = {"OnFailure", "ExitCode", "Never"};
static const char *const mode_names[] = {"restart", "inprocess"};

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
    s->cooldown_ms = 10000;
    s->cooldown_max_ms = 300000;
    s->ttl_s = 10;
    s->mode = EDL_MODE_RESTART;
}

void edl_spec_free(edl_job_spec *s)
{
    free(s->checkpoint_uri);
    s->checkpoint_uri = NULL;
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

int edl_spec_validate(const edl_job_spec *s, char *err, size_t errlen)
{
    if (s->min < 1) {
        set_err(err, errlen, "spec: min is %d; it must be at least 1", s->min);
        return EDL_ECONFIG;
    }
    if (s->max < s->min) {
        set_err(err, errlen, "spec: min (%d) is greater than max (%d)", s->min, s->max);
        return EDL_ECONFIG;
    }
    if (s->ttl_s < 1) {
        set_err(err, errlen, "spec: ttl_s is %lld; a lease TTL must be at least 1 second",
                (long long)s->ttl_s);
        return EDL_ECONFIG;
    }
    if (s->cooldown_max_ms < s->cooldown_ms) {
        set_err(err, errlen, "spec: cooldown_max_ms (%lld) is below cooldown_ms (%lld)",
                (long long)s->cooldown_max_ms, (long long)s->cooldown_ms);
        return EDL_ECONFIG;
    }
    return 0;
}

int edl_spec_parse(const char *json, size_t len, edl_job_spec *out, char *err, size_t errlen)
{
    int rc;
    cJSON *root = parse_doc(json, len, "spec", err, errlen, &rc);
    if (!root)
        return rc;
    edl_job_spec s;
    edl_spec_init(&s);
    reader r = {root, "spec", err, errlen, 0};
    const int64_t day = 86400000;
    get_int(&r, "min", INT_MIN, EDL_MEMBERS_MAX, &s.min);
    get_int(&r, "max", INT_MIN, EDL_MEMBERS_MAX, &s.max);
    if (!field(&r, "max") && field(&r, "min"))
        s.max = s.min;
    get_int(&r, "replicas", -1, EDL_MEMBERS_MAX, &s.replicas);
    get_i64(&r, "settle_ms", 0, day, &s.settle_ms);
    get_int(&r, "max_restarts", 0, INT_MAX, &s.max_restarts);
    int v = (int)s.restart_policy;
    get_enum(&r, "restart_policy", policy_names, 3, &v);
    s.restart_policy = (edl_restart_policy)v;
    char *codes = NULL;
    get_str(&r, "permanent_exit_codes", 1024, &codes);
    if (codes && edl_exit_codes_parse(codes, s.permanent_codes) != 0)
        fail(&r, EDL_ECONFIG, "permanent_exit_codes", "must look like \"1-127,200\" (codes 0-255)");
    free(codes);
    get_int(&r, "exclude_after", 1, INT_MAX, &s.exclude_after);
    get_i64(&r, "cooldown_ms", 0, day, &s.cooldown_ms);
    get_i64(&r, "cooldown_max_ms", 0, day, &s.cooldown_max_ms);
    get_i64(&r, "progress_timeout_ms", 0, day, &s.progress_timeout_ms);
    get_i64(&r, "ttl_s", INT32_MIN, 86400, &s.ttl_s);
    v = (int)s.mode;
    get_enum(&r, "elastic_mode", mode_names, 2, &v);
    s.mode = (edl_elastic_mode)v;
    get_str(&r, "checkpoint_uri", 4096, &s.checkpoint_uri);
    get_bool(&r, "stopped", &s.stopped);
    cJSON_Delete(root);
    if (!r.rc)
        r.rc = edl_spec_validate(&s, err, errlen);
    if (r.rc) {
        edl_spec_free(&s);
        return r.rc;
    }
    edl_spec_free(out);
    *out = s;
    return 0;
}

static char *print_and_free(cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
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
    cJSON_AddStringToObject(o, "restart_policy", policy_names[s->restart_policy]);
    cJSON_AddStringToObject(o, "permanent_exit_codes", codes);
    cJSON_AddNumberToObject(o, "exclude_after", s->exclude_after);
    cJSON_AddNumberToObject(o, "cooldown_ms", (double)s->cooldown_ms);
    cJSON_AddNumberToObject(o, "cooldown_max_ms", (double)s->cooldown_max_ms);
    cJSON_AddNumberToObject(o, "progress_timeout_ms", (double)s->progress_timeout_ms);
    cJSON_AddNumberToObject(o, "ttl_s", (double)s->ttl_s);
    cJSON_AddStringToObject(o, "elastic_mode", mode_names[s->mode]);
    if (s->checkpoint_uri)
        cJSON_AddStringToObject(o, "checkpoint_uri", s->checkpoint_uri);
    cJSON_AddBoolToObject(o, "stopped", s->stopped);
    free(codes);
    return print_and_free(o);
}

/* ---- pod ---------------------------------------------------------------------------------- */

void edl_pod_free(edl_pod *p)
{
    free(p->name);
    free(p->role);
    free(p->addr);
    free(p->host);
    memset(p, 0, sizeof *p);
}

int edl_pod_parse(const char *json, size_t len, edl_pod *out, char *err, size_t errlen)
{
    int rc;
    cJSON *root = parse_doc(json, len, "pod", err, errlen, &rc);
    if (!root)
        return rc;
    edl_pod p = {0};
    reader r = {root, "pod", err, errlen, 0};
    get_str(&r, "role", 32, &p.role);
    get_str(&r, "addr", 256, &p.addr);
    get_int(&r, "port", 0, 65535, &p.port);
    get_int(&r, "metrics_port", 0, 65535, &p.metrics_port);
    get_int(&r, "gpus", 0, 1024, &p.gpus);
    get_str(&r, "host", 256, &p.host);
    get_i64(&r, "pid", 0, INT32_MAX, &p.pid);
    cJSON_Delete(root);
    if (!r.rc && (!p.role || !p.addr))
        fail(&r, EDL_EPROTO, p.role ? "addr" : "role", "is required");
    if (!r.rc && !p.role) {
        p.role = strdup("worker");
        if (!p.role)
            r.rc = EDL_ENOMEM;
    }
    if (r.rc) {
        edl_pod_free(&p);
        return r.rc;
    }
    p.name = out->name; /* the name comes from the key: keep the caller's */
    p.lease = out->lease;
    p.create_revision = out->create_revision;
    out->name = NULL;
    edl_pod_free(out);
    *out = p;
    return 0;
}

char *edl_pod_to_json(const edl_pod *p)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "role", p->role ? p->role : "worker");
    cJSON_AddStringToObject(o, "addr", p->addr ? p->addr : "127.0.0.1");
    cJSON_AddNumberToObject(o, "port", p->port);
    cJSON_AddNumberToObject(o, "metrics_port", p->metrics_port);
    cJSON_AddNumberToObject(o, "gpus", p->gpus);
    if (p->host)
        cJSON_AddStringToObject(o, "host", p->host);
    cJSON_AddNumberToObject(o, "pid", (double)p->pid);
    return print_and_free(o);
}

/* ---- trainer status ---------------------------------------------------------------------- */

static const char *const trainer_state_names[] = {"waiting", "running", "exited",
                                                  "signaled", "stopped", "hung"};

const char *edl_trainer_state_name(edl_trainer_state s)
{
    return (unsigned)s < 6 ? trainer_state_names[s] : "unknown";
}

int edl_pod_status_parse(const char *json, size_t len, edl_pod_status *out, char *err,
                         size_t errlen)
{
    int rc;
    cJSON *root = parse_doc(json, len, "status", err, errlen, &rc);
    if (!root)
        return rc;
    edl_pod_status s = {0};
    s.step = -1;
    reader r = {root, "status", err, errlen, 0};
    get_i64(&r, "generation", 0, INT64_C(1) << 52, &s.generation);
    int v = 0;
    if (get_enum(&r, "state", trainer_state_names, 6, &v) < 0 && !r.rc)
        fail(&r, EDL_EPROTO, "state", "is required");
    s.state = (edl_trainer_state)v;
    get_int(&r, "exit_code", 0, 255, &s.exit_code);
    get_int(&r, "signal", 0, 128, &s.signal);
    get_i64(&r, "pid", 0, INT32_MAX, &s.pid);
    get_i64(&r, "step", -1, INT64_C(1) << 52, &s.step);
    get_i64(&r, "restarts", 0, INT64_C(1) << 52, &s.restarts);
    cJSON_Delete(root);
    if (r.rc)
        return r.rc;
    *out = s;
    return 0;
}

char *edl_pod_status_to_json(const edl_pod_status *s)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddNumberToObject(o, "generation", (double)s->generation);
    cJSON_AddStringToObject(o, "state", edl_trainer_state_name(s->state));
    if (s->state == EDL_TRAINER_EXITED)
        cJSON_AddNumberToObject(o, "exit_code", s->exit_code);
    if (s->state == EDL_TRAINER_SIGNALED)
        cJSON_AddNumberToObject(o, "signal", s->signal);
    if (s->pid)
        cJSON_AddNumberToObject(o, "pid", (double)s->pid);
    cJSON_AddNumberToObject(o, "step", (double)s->step);
    cJSON_AddNumberToObject(o, "restarts", (double)s->restarts);
    return print_and_free(o);
}

/* ---- generation ---------------------------------------------------------------------------- */

static const char *const job_state_names[] = {"waiting", "running", "succeeded", "failed",
                                              "stopped"};

const char *edl_job_state_name(edl_job_state s)
{
    return (unsigned)s < 5 ? job_state_names[s] : "unknown";
}

void edl_members_free(edl_member *m, size_t n)
{
    for (size_t i = 0; m && i < n; i++) {
        free(m[i].pod);
        free(m[i].addr);
    }
    free(m);
}

int edl_members_copy(const edl_member *src, size_t n, edl_member **out)
{
    edl_member *m = calloc(n ? n : 1, sizeof *m);
    if (!m)
        return EDL_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        m[i] = src[i];
        m[i].pod = strdup(src[i].pod);
        m[i].addr = src[i].addr ? strdup(src[i].addr) : NULL;
        if (!m[i].pod || (src[i].addr && !m[i].addr)) {
            edl_members_free(m, i + 1);
            return EDL_ENOMEM;
        }
    }
    *out = m;
    return 0;
}

static void strv_free(char **v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i]);
    free(v);
}

void edl_cluster_free(edl_cluster *c)
{
    free(c->reason);
    edl_members_free(c->members, c->n_members);
    strv_free(c->standbys, c->n_standbys);
    for (size_t i = 0; i < c->n_failures; i++)
        free(c->failures[i].pod);
    free(c->failures);
    free(c->spec_error);
    free(c->leader);
    memset(c, 0, sizeof *c);
}

const edl_member *edl_cluster_member(const edl_cluster *c, const char *pod)
{
    for (size_t i = 0; i < c->n_members; i++)
        if (strcmp(c->members[i].pod, pod) == 0)
            return &c->members[i];
    return NULL;
}

static int parse_members(reader *r, const cJSON *arr, edl_cluster *c)
{
    size_t n = (size_t)cJSON_GetArraySize(arr);
    if (n > EDL_MEMBERS_MAX) {
        fail(r, EDL_ETOOBIG, "members", "lists too many members");
        return r->rc;
    }
    c->members = calloc(n ? n : 1, sizeof *c->members);
    if (!c->members)
        return r->rc = EDL_ENOMEM;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        if (!cJSON_IsObject(it)) {
            fail(r, EDL_EPROTO, "members", "must hold objects");
            return r->rc;
        }
        edl_member *m = &c->members[c->n_members++];
        m->rank = -1;
        reader mr = {it, "cluster.members[]", r->err, r->errlen, 0};
        get_str(&mr, "pod", EDL_NAME_MAX, &m->pod);
        get_int(&mr, "rank", 0, EDL_MEMBERS_MAX, &m->rank);
        get_str(&mr, "addr", 256, &m->addr);
        get_int(&mr, "port", 0, 65535, &m->port);
        get_lease(&mr, "lease", &m->lease);
        if (!mr.rc && (!m->pod || !edl_name_valid(m->pod)))
            fail(&mr, EDL_EPROTO, "pod", "is missing or not a valid name");
        if (!mr.rc && m->rank != (int)(c->n_members - 1))
            fail(&mr, EDL_EPROTO, "rank", "must run 0..n-1 in order");
        if (mr.rc)
            return r->rc = mr.rc;
    }
    return 0;
}

static int parse_standbys(reader *r, const cJSON *arr, edl_cluster *c)
{
    size_t n = (size_t)cJSON_GetArraySize(arr);
    if (n > EDL_MEMBERS_MAX) {
        fail(r, EDL_ETOOBIG, "standbys", "lists too many pods");
        return r->rc;
    }
    c->standbys = calloc(n ? n : 1, sizeof *c->standbys);
    if (!c->standbys)
        return r->rc = EDL_ENOMEM;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        if (!cJSON_IsString(it) || !edl_name_valid(it->valuestring)) {
            fail(r, EDL_EPROTO, "standbys", "must hold pod names");
            return r->rc;
        }
        if (!(c->standbys[c->n_standbys] = strdup(it->valuestring)))
            return r->rc = EDL_ENOMEM;
        c->n_standbys++;
    }
    return 0;
}

static int parse_failures(reader *r, const cJSON *arr, edl_cluster *c)
{
    size_t n = (size_t)cJSON_GetArraySize(arr);
    if (n > EDL_MEMBERS_MAX) {
        fail(r, EDL_ETOOBIG, "failures", "lists too many pods");
        return r->rc;
    }
    c->failures = calloc(n ? n : 1, sizeof *c->failures);
    if (!c->failures)
        return r->rc = EDL_ENOMEM;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        if (!cJSON_IsObject(it)) {
            fail(r, EDL_EPROTO, "failures", "must hold objects");
            return r->rc;
        }
        edl_pod_failures *f = &c->failures[c->n_failures++];
        reader fr = {it, "cluster.failures[]", r->err, r->errlen, 0};
        get_str(&fr, "pod", EDL_NAME_MAX, &f->pod);
        get_int(&fr, "count", 0, INT_MAX, &f->count);
        get_i64(&fr, "excluded_until", 0, INT64_C(1) << 52, &f->excluded_until);
        if (!fr.rc && !f->pod)
            fail(&fr, EDL_EPROTO, "pod", "is required");
        if (fr.rc)
            return r->rc = fr.rc;
    }
    return 0;
}

static const cJSON *array_field(reader *r, const char *name)
{
    const cJSON *f = field(r, name);
    if (f && !cJSON_IsArray(f)) {
        fail(r, EDL_EPROTO, name, "must be an array");
        return NULL;
    }
    return f;
}

int edl_cluster_parse(const char *json, size_t len, edl_cluster *out, char *err, size_t errlen)
{
    int rc;
    cJSON *root = parse_doc(json, len, "cluster", err, errlen, &rc);
    if (!root)
        return rc;
    edl_cluster c = {0};
    reader r = {root, "cluster", err, errlen, 0};
    get_i64(&r, "generation", 0, INT64_C(1) << 52, &c.generation);
    int v = 0;
    get_enum(&r, "state", job_state_names, 5, &v);
    c.state = (edl_job_state)v;
    get_str(&r, "reason", 4096, &c.reason);
    get_int(&r, "restarts", 0, INT_MAX, &c.restarts);
    get_str(&r, "spec_error", 4096, &c.spec_error);
    get_str(&r, "leader", 256, &c.leader);
    get_i64(&r, "published_ms", 0, INT64_C(1) << 52, &c.published_ms);
    const cJSON *a;
    if (!r.rc && (a = array_field(&r, "members")))
        parse_members(&r, a, &c);
    if (!r.rc && (a = array_field(&r, "standbys")))
        parse_standbys(&r, a, &c);
    if (!r.rc && (a = array_field(&r, "failures")))
        parse_failures(&r, a, &c);
    cJSON_Delete(root);
    if (r.rc) {
        edl_cluster_free(&c);
        return r.rc;
    }
    edl_cluster_free(out);
    *out = c;
    return 0;
}

char *edl_cluster_to_json(const edl_cluster *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *mem = cJSON_AddArrayToObject(o, "members");
    cJSON *sb = cJSON_AddArrayToObject(o, "standbys");
    cJSON *fl = cJSON_AddArrayToObject(o, "failures");
    if (!o || !mem || !sb || !fl) {
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddNumberToObject(o, "generation", (double)c->generation);
    cJSON_AddStringToObject(o, "state", edl_job_state_name(c->state));
    cJSON_AddStringToObject(o, "reason", c->reason ? c->reason : "");
    for (size_t i = 0; i < c->n_members; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(mem, m);
        cJSON_AddStringToObject(m, "pod", c->members[i].pod);
        cJSON_AddNumberToObject(m, "rank", c->members[i].rank);
        cJSON_AddStringToObject(m, "addr", c->members[i].addr ? c->members[i].addr : "");
        cJSON_AddNumberToObject(m, "port", c->members[i].port);
        char lease[24];
        snprintf(lease, sizeof lease, "%llx", (unsigned long long)c->members[i].lease);
        cJSON_AddStringToObject(m, "lease", lease);
    }
    for (size_t i = 0; i < c->n_standbys; i++)
        cJSON_AddItemToArray(sb, cJSON_CreateString(c->standbys[i]));
    for (size_t i = 0; i < c->n_failures; i++) {
        cJSON *f = cJSON_CreateObject();
        cJSON_AddItemToArray(fl, f);
        cJSON_AddStringToObject(f, "pod", c->failures[i].pod);
        cJSON_AddNumberToObject(f, "count", c->failures[i].count);
        cJSON_AddNumberToObject(f, "excluded_until", (double)c->failures[i].excluded_until);
    }
    cJSON_AddNumberToObject(o, "restarts", c->restarts);
    if (c->spec_error)
        cJSON_AddStringToObject(o, "spec_error", c->spec_error);
    if (c->leader)
        cJSON_AddStringToObject(o, "leader", c->leader);
    cJSON_AddNumberToObject(o, "published_ms", (double)c->published_ms);
    return print_and_free(o);
}

/* ---- rank assignment ---------------------------------------------------------------------- */

static const edl_member *prev_match(const edl_member *prev, size_t n_prev, const edl_pod *p)
{
    for (size_t i = 0; i < n_prev; i++)
        if (strcmp(prev[i].pod, p->name) == 0 && prev[i].lease == p->lease)
            return &prev[i];
    return NULL;
}

static int fill_member(edl_member *m, const edl_pod *p, int rank)
{
    m->pod = strdup(p->name);
    m->addr = strdup(p->addr ? p->addr : "");
    m->port = p->port;
    m->lease = p->lease;
    m->rank = rank;
    return (m->pod && m->addr) ? 0 : EDL_ENOMEM;
}

int edl_assign_ranks(const edl_member *prev, size_t n_prev, const edl_pod *cands, size_t n_cands,
                     int max, edl_member **members, size_t *n_members, char ***standbys,
                     size_t *n_standbys)
{
    if (max < 0 || (n_cands && !cands))
        return EDL_EINVAL;
    size_t n = n_cands < (size_t)max ? n_cands : (size_t)max;
    /* chosen[k]: index into cands of the k-th member picked; survivors first, then newcomers */
    size_t *chosen = calloc(n_cands ? n_cands : 1, sizeof *chosen);
    int *rank = calloc(n_cands ? n_cands : 1, sizeof *rank);
    bool *picked = calloc(n_cands ? n_cands : 1, sizeof *picked);
    bool *taken = calloc(n ? n : 1, sizeof *taken); /* rank r < n already used */
    edl_member *out = calloc(n ? n : 1, sizeof *out);
    char **sb = calloc(n_cands ? n_cands : 1, sizeof *sb);
    size_t *by_rank = NULL;
    int rc = EDL_ENOMEM;
    size_t k = 0, n_sb = 0;
    if (!chosen || !rank || !picked || !taken || !out || !sb)
        goto done;
    /* survivors, by their previous rank (so the lowest ranks survive a cut to max) */
    by_rank = malloc((n_prev ? n_prev : 1) * sizeof *by_rank);
    if (!by_rank)
        goto done;
    for (size_t r = 0; r < n_prev; r++)
        by_rank[r] = SIZE_MAX;
    for (size_t i = 0; i < n_cands; i++) {
        const edl_member *pm = prev_match(prev, n_prev, &cands[i]);
        if (pm && pm->rank >= 0 && (size_t)pm->rank < n_prev && by_rank[pm->rank] == SIZE_MAX)
            by_rank[pm->rank] = i;
    }
    for (size_t r = 0; r < n_prev && k < n; r++) {
        size_t i = by_rank[r];
        if (i == SIZE_MAX)
            continue;
        picked[i] = true;
        rank[k] = r < n ? (int)r : -1;
        if (rank[k] >= 0)
            taken[r] = true;
        chosen[k++] = i;
    }
    size_t n_surv = k;
    for (size_t i = 0; i < n_cands && k < n; i++)
        if (!picked[i]) {
            picked[i] = true;
            rank[k] = -1;
            chosen[k++] = i;
        }
    /* holes: first the survivors with ranks >= n, highest first, then newcomers in join order */
    size_t hole = 0;
    for (size_t j = n_surv; j-- > 0;) {
        if (rank[j] >= 0)
            continue;
        while (taken[hole])
            hole++;
        rank[j] = (int)hole;
        taken[hole] = true;
    }
    for (size_t j = n_surv; j < k; j++) {
        while (taken[hole])
            hole++;
        rank[j] = (int)hole;
        taken[hole] = true;
    }
    for (size_t j = 0; j < k; j++)
        if (fill_member(&out[rank[j]], &cands[chosen[j]], rank[j]) != 0)
            goto done;
    for (size_t i = 0; i < n_cands; i++)
        if (!picked[i] && !(sb[n_sb++] = strdup(cands[i].name)))
            goto done;
    rc = 0;
done:
    if (rc) {
        edl_members_free(out, n);
        strv_free(sb, n_sb);
    } else {
        *members = out;
        *n_members = k;
        *standbys = sb;
        *n_standbys = n_sb;
    }
    free(by_rank);
    free(chosen);
    free(rank);
    free(picked);
    free(taken);
    return rc;
}

/* generation.c: the generation document (edl/job.h) that the leading job server publishes:
 * the members (workers) and servers (parameter servers) with their ranks, the standbys, per-pod failures and the job's state, and the
 * job's state as an exit code. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/job.h"
#include "edl/json.h"

static const char *const job_state_names[] = {"waiting", "running", "succeeded", "failed",
                                              "stopped"};

const char *edl_job_state_name(edl_job_state s)
{
    return (unsigned)s < 5 ? job_state_names[s] : "unknown";
}

int edl_job_exit_code(edl_job_state s)
{
    return s == EDL_JOB_SUCCEEDED ? EDL_EXIT_SUCCEEDED
           : s == EDL_JOB_STOPPED ? EDL_EXIT_STOPPED
                                  : EDL_EXIT_FAILED;
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

void edl_generation_clear(edl_generation *g)
{
    free(g->reason);
    edl_members_free(g->members, g->n_members);
    edl_members_free(g->servers, g->n_servers);
    for (size_t i = 0; i < g->n_standbys; i++)
        free(g->standbys[i]);
    free(g->standbys);
    for (size_t i = 0; i < g->n_failures; i++)
        free(g->failures[i].pod);
    free(g->failures);
    free(g->spec_error);
    free(g->leader);
    memset(g, 0, sizeof *g);
}

static const edl_member *find_named(const edl_member *m, size_t n, const char *pod)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(m[i].pod, pod) == 0)
            return &m[i];
    return NULL;
}

const edl_member *edl_generation_member_named(const edl_generation *g, const char *pod)
{
    return find_named(g->members, g->n_members, pod);
}

const edl_member *edl_generation_member(const edl_generation *g, const char *pod, int64_t lease)
{
    const edl_member *m = edl_generation_member_named(g, pod);
    return m && m->lease == lease ? m : NULL;
}

int64_t edl_generation_of_members(const edl_generation *g)
{
    return g->members_generation > 0 ? g->members_generation : g->generation;
}

const edl_member *edl_generation_server(const edl_generation *g, const char *pod, int64_t lease)
{
    const edl_member *m = find_named(g->servers, g->n_servers, pod);
    return m && m->lease == lease ? m : NULL;
}

/* ---- parsing ------------------------------------------------------------------------------ */

static void read_member(edl_json_reader *r, void *item, size_t index)
{
    edl_member *m = item;
    m->rank = -1;
    edl_json_str(r, "pod", EDL_NAME_MAX, &m->pod);
    edl_json_int(r, "rank", 0, EDL_MEMBERS_MAX, &m->rank);
    edl_json_str(r, "addr", 256, &m->addr);
    edl_json_int(r, "port", 0, 65535, &m->port);
    edl_json_hex64(r, "lease", &m->lease);
    if (!r->rc && (!m->pod || !edl_name_valid(m->pod)))
        edl_json_fail(r, EDL_EPROTO, "pod", "is missing or not a valid name");
    if (!r->rc && m->rank != (int)index)
        edl_json_fail(r, EDL_EPROTO, "rank", "must run 0..n-1 in order");
}

static void read_failure(edl_json_reader *r, void *item, size_t index)
{
    edl_pod_failures *f = item;
    (void)index;
    r->required = true;
    edl_json_str(r, "pod", EDL_NAME_MAX, &f->pod);
    r->required = false;
    edl_json_int(r, "count", 0, EDL_RESTARTS_MAX, &f->count);
    edl_json_i64(r, "excluded_until", 0, EDL_GENERATION_MAX, &f->excluded_until);
}

typedef void (*read_item_fn)(edl_json_reader *r, void *item, size_t index);

/* Each element of arr (objects) read into a new array of items of item_size bytes. */
static int read_objects(edl_json_reader *r, const cJSON *arr, const char *what, read_item_fn read,
                        void **items, size_t *n, size_t item_size)
{
    size_t cap = (size_t)cJSON_GetArraySize(arr);
    char *v = calloc(cap ? cap : 1, item_size);
    if (!(*items = v))
        return r->rc = EDL_ENOMEM;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        if (!cJSON_IsObject(it)) {
            edl_json_fail(r, EDL_EPROTO, what, "must hold objects");
            return r->rc;
        }
        char doc[64];
        snprintf(doc, sizeof doc, "generation.%s[]", what);
        edl_json_reader er = {it, doc, r->err, r->errlen, 0};
        size_t at = (*n)++; /* counted first: a half-read item is freed with the rest */
        read(&er, v + at * item_size, at);
        if (er.rc)
            return r->rc = er.rc;
    }
    return 0;
}

static int read_standbys(edl_json_reader *r, const cJSON *arr, edl_generation *g)
{
    g->standbys = calloc((size_t)cJSON_GetArraySize(arr) + 1, sizeof *g->standbys);
    if (!g->standbys)
        return r->rc = EDL_ENOMEM;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        if (!cJSON_IsString(it) || !edl_name_valid(it->valuestring)) {
            edl_json_fail(r, EDL_EPROTO, "standbys", "must hold pod names");
            return r->rc;
        }
        if (!(g->standbys[g->n_standbys] = strdup(it->valuestring)))
            return r->rc = EDL_ENOMEM;
        g->n_standbys++;
    }
    return 0;
}

int edl_generation_parse(const char *json, size_t len, edl_generation *out, char *err,
                         size_t errlen)
{
    int rc;
    cJSON *root = edl_json_parse_object(json, len, EDL_DOC_MAX, "generation", err, errlen, &rc);
    if (!root)
        return rc;
    edl_generation g = {0};
    edl_json_reader r = {root, "generation", err, errlen, 0};
    edl_json_i64(&r, "generation", 0, EDL_GENERATION_MAX, &g.generation);
    if (edl_json_i64(&r, "members_generation", 1, EDL_GENERATION_MAX, &g.members_generation) &&
        g.members_generation > g.generation)
        edl_json_fail(&r, EDL_EPROTO, "members_generation", "is after the generation itself");
    int v = 0;
    if (edl_json_enum(&r, "state", job_state_names, 5, &v))
        g.state = (edl_job_state)v;
    edl_json_str(&r, "reason", 4096, &g.reason);
    edl_json_int(&r, "restarts", 0, EDL_RESTARTS_MAX, &g.restarts);
    edl_json_str(&r, "spec_error", 4096, &g.spec_error);
    edl_json_str(&r, "leader", 256, &g.leader);
    edl_json_i64(&r, "published_ms", 0, EDL_GENERATION_MAX, &g.published_ms);
    edl_json_i64(&r, "started_ms", 0, EDL_GENERATION_MAX, &g.started_ms);
    const cJSON *a;
    if ((a = edl_json_array(&r, "members", EDL_MEMBERS_MAX)))
        read_objects(&r, a, "members", read_member, (void **)&g.members, &g.n_members, sizeof(edl_member));
    if ((a = edl_json_array(&r, "servers", EDL_PS_SERVERS_MAX)))
        read_objects(&r, a, "servers", read_member, (void **)&g.servers, &g.n_servers,
                     sizeof(edl_member));
    if ((a = edl_json_array(&r, "standbys", EDL_MEMBERS_MAX)))
        read_standbys(&r, a, &g);
    if ((a = edl_json_array(&r, "failures", EDL_MEMBERS_MAX)))
        read_objects(&r, a, "failures", read_failure, (void **)&g.failures, &g.n_failures,
                     sizeof(edl_pod_failures));
    cJSON_Delete(root);
    if (r.rc) {
        edl_generation_clear(&g);
        return r.rc;
    }
    edl_generation_clear(out);
    *out = g;
    return 0;
}

/* ---- encoding ----------------------------------------------------------------------------- */

static void add_members(cJSON *arr, const edl_member *ms, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const edl_member *m = &ms[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, o);
        cJSON_AddStringToObject(o, "pod", m->pod);
        cJSON_AddNumberToObject(o, "rank", m->rank);
        cJSON_AddStringToObject(o, "addr", m->addr ? m->addr : "");
        cJSON_AddNumberToObject(o, "port", m->port);
        char lease[24];
        snprintf(lease, sizeof lease, "%llx", (unsigned long long)m->lease);
        cJSON_AddStringToObject(o, "lease", lease);
    }
}

static void add_failures(cJSON *arr, const edl_generation *g)
{
    for (size_t i = 0; i < g->n_failures; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, o);
        cJSON_AddStringToObject(o, "pod", g->failures[i].pod);
        cJSON_AddNumberToObject(o, "count", g->failures[i].count);
        cJSON_AddNumberToObject(o, "excluded_until", (double)g->failures[i].excluded_until);
    }
}

char *edl_generation_to_json(const edl_generation *g)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *mem = cJSON_AddArrayToObject(o, "members");
    cJSON *sb = cJSON_AddArrayToObject(o, "standbys");
    cJSON *fl = cJSON_AddArrayToObject(o, "failures");
    /* absent when there are none: documents of jobs without the ps role stay as they were */
    cJSON *srv = g->n_servers ? cJSON_AddArrayToObject(o, "servers") : NULL;
    if (!o || !mem || !sb || !fl || (g->n_servers && !srv)) {
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddNumberToObject(o, "generation", (double)g->generation);
    if (g->members_generation > 0 && g->members_generation != g->generation)
        cJSON_AddNumberToObject(o, "members_generation", (double)g->members_generation);
    cJSON_AddStringToObject(o, "state", edl_job_state_name(g->state));
    cJSON_AddStringToObject(o, "reason", g->reason ? g->reason : "");
    add_members(mem, g->members, g->n_members);
    add_members(srv, g->servers, g->n_servers);
    for (size_t i = 0; i < g->n_standbys; i++)
        cJSON_AddItemToArray(sb, cJSON_CreateString(g->standbys[i]));
    add_failures(fl, g);
    cJSON_AddNumberToObject(o, "restarts", g->restarts);
    if (g->spec_error)
        cJSON_AddStringToObject(o, "spec_error", g->spec_error);
    if (g->leader)
        cJSON_AddStringToObject(o, "leader", g->leader);
    cJSON_AddNumberToObject(o, "published_ms", (double)g->published_ms);
    if (g->started_ms > 0)
        cJSON_AddNumberToObject(o, "started_ms", (double)g->started_ms);
    return edl_json_print_consume(o);
}

/* discovery.c: a student's view of its service (edl_discovery): its own presence under a kept
 * lease, every teacher and student it sees (one listing, then one watch on the service's keys)
 * and, recomputed with edl_assign after every change, the teachers that serve it. Level
 * triggered: a lost or compacted watch is answered with a fresh listing, never by guessing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/log.h"
#include "internal.h"

struct edl_discovery {
    edl_etcd *c;
    char *dir;          /* <prefix>/services/<service>/ */
    char *teachers_dir; /* dir + "teachers/" */
    char *students_dir; /* dir + "students/" */
    char *own_key;      /* students_dir + student */
    char *student;
    int ttl_s;
    int64_t lease;
    edl_lease_keeper *keeper;
    edl_watch *watch;
    edl_service_instance *teachers; /* every valid teacher, sorted by name */
    size_t nt;
    char **students; /* every student, sorted */
    size_t ns;
    edl_service_instance *mine; /* this student's teachers (copies), sorted by name */
    size_t n_mine;
};

/* ---- sorted sets ----------------------------------------------------------------------------- */

/* Index of name in a sorted array of n elements of size sz whose first member is the name
 * pointer; *found says whether it is there (else the index is where it would go). */
static size_t find_name(const void *base, size_t n, size_t sz, const char *name, bool *found)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(*(char *const *)((const char *)base + mid * sz), name);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

/* Put or replace a teacher (takes *in's contents). */
static int teacher_put(edl_discovery *d, edl_service_instance *in)
{
    bool found;
    size_t at = find_name(d->teachers, d->nt, sizeof *d->teachers, in->name, &found);
    if (found) {
        edl_service_instance_clear(&d->teachers[at]);
        d->teachers[at] = *in;
        return 0;
    }
    if (d->nt >= EDL_SERVICE_MAX_INSTANCES)
        return EDL_ETOOBIG;
    edl_service_instance *t = realloc(d->teachers, (d->nt + 1) * sizeof *t);
    if (!t)
        return EDL_ENOMEM;
    d->teachers = t;
    memmove(t + at + 1, t + at, (d->nt - at) * sizeof *t);
    t[at] = *in;
    d->nt++;
    return 0;
}

static void teacher_drop(edl_discovery *d, const char *name)
{
    bool found;
    size_t at = find_name(d->teachers, d->nt, sizeof *d->teachers, name, &found);
    if (!found)
        return;
    edl_service_instance_clear(&d->teachers[at]);
    memmove(d->teachers + at, d->teachers + at + 1, (d->nt - at - 1) * sizeof *d->teachers);
    d->nt--;
}

static int student_put(edl_discovery *d, const char *name)
{
    bool found;
    size_t at = find_name(d->students, d->ns, sizeof *d->students, name, &found);
    if (found)
        return 0;
    if (d->ns >= EDL_SERVICE_MAX_INSTANCES)
        return EDL_ETOOBIG;
    char **s = realloc(d->students, (d->ns + 1) * sizeof *s), *copy = strdup(name);
    if (s)
        d->students = s;
    if (!s || !copy) {
        free(copy);
        return EDL_ENOMEM;
    }
    memmove(s + at + 1, s + at, (d->ns - at) * sizeof *s);
    s[at] = copy;
    d->ns++;
    return 0;
}

static void student_drop(edl_discovery *d, const char *name)
{
    bool found;
    size_t at = find_name(d->students, d->ns, sizeof *d->students, name, &found);
    if (!found)
        return;
    free(d->students[at]);
    memmove(d->students + at, d->students + at + 1, (d->ns - at - 1) * sizeof *d->students);
    d->ns--;
}

static void sets_clear(edl_discovery *d)
{
    edl_service_list_free(d->teachers, d->nt);
    for (size_t i = 0; i < d->ns; i++)
        free(d->students[i]);
    free(d->students);
    d->teachers = NULL;
    d->students = NULL;
    d->nt = d->ns = 0;
}

/* ---- what the keys say ----------------------------------------------------------------------- */

/* A key-value of the service put (or, with deleted, removed). Bad teachers' records are logged
 * and count as absent: a teacher whose record turns bad stops being used. */
static int apply_kv(edl_discovery *d, const edl_kv *kv, bool deleted)
{
    char name[EDL_SERVICE_NAME_MAX + 1];
    if (disc_key_name(kv, d->students_dir, name)) {
        if (deleted)
            student_drop(d, name);
        return deleted ? 0 : student_put(d, name);
    }
    if (!disc_key_name(kv, d->teachers_dir, name))
        return 0; /* another key under the service: not ours to read */
    edl_service_instance in = {0};
    if (deleted || disc_teacher_from_kv(kv, d->teachers_dir, &in) != 0) {
        teacher_drop(d, name);
        return 0;
    }
    int rc = teacher_put(d, &in);
    if (rc)
        edl_service_instance_clear(&in);
    return rc;
}

static int copy_instance(edl_service_instance *to, const edl_service_instance *from)
{
    *to = *from;
    to->name = strdup(from->name);
    to->endpoint = strdup(from->endpoint);
    to->model = strdup(from->model);
    to->version = strdup(from->version);
    if (to->name && to->endpoint && to->model && to->version)
        return 0;
    edl_service_instance_clear(to);
    return EDL_ENOMEM;
}

static bool same_teachers(const edl_service_instance *a, size_t na, const edl_service_instance *b,
                          size_t nb)
{
    if (na != nb)
        return false;
    for (size_t i = 0; i < na; i++)
        if (strcmp(a[i].name, b[i].name) || strcmp(a[i].endpoint, b[i].endpoint) ||
            strcmp(a[i].model, b[i].model) || strcmp(a[i].version, b[i].version) ||
            a[i].capacity != b[i].capacity)
            return false;
    return true;
}

/* This student's teachers by edl_assign over everything seen (none while its own key is not
 * seen: every other student computes without it too). */
static int teachers_of_student(const edl_discovery *d, const edl_teacher_assignment *a,
                               edl_service_instance **out, size_t *n)
{
    bool found;
    size_t me = find_name(d->students, d->ns, sizeof *d->students, d->student, &found);
    *out = calloc(d->nt + 1, sizeof **out);
    *n = 0;
    if (!*out)
        return EDL_ENOMEM;
    for (size_t k = 0; found && k < a->n; k++) {
        if (a->pairs[k].student != me)
            continue;
        int rc = copy_instance(&(*out)[*n], &d->teachers[a->pairs[k].teacher]);
        if (rc) {
            edl_service_list_free(*out, *n);
            *out = NULL;
            return rc;
        }
        (*n)++;
    }
    return 0;
}

/* Recompute the assignment; *changed: whether this student's teachers changed. */
static int reassign(edl_discovery *d, bool *changed)
{
    const char **names = malloc((d->nt + 1) * sizeof *names);
    int *cap = malloc((d->nt + 1) * sizeof *cap);
    edl_teacher_assignment a = {0};
    edl_service_instance *mine = NULL;
    size_t n_mine = 0;
    int rc = names && cap ? 0 : EDL_ENOMEM;
    for (size_t t = 0; !rc && t < d->nt; t++) {
        names[t] = d->teachers[t].name;
        cap[t] = d->teachers[t].capacity;
    }
    if (!rc)
        rc = edl_assign((const char *const *)d->students, d->ns, names, cap, d->nt, &a);
    if (!rc)
        rc = teachers_of_student(d, &a, &mine, &n_mine);
    if (!rc) {
        *changed = !same_teachers(mine, n_mine, d->mine, d->n_mine);
        edl_service_list_free(d->mine, d->n_mine);
        d->mine = mine;
        d->n_mine = n_mine;
    }
    edl_teacher_assignment_clear(&a);
    free(names);
    free(cap);
    return rc;
}

/* ---- listing and watching ------------------------------------------------------------------ */

/* Read every key of the service afresh and watch from the revision after that read. */
static int resync(edl_discovery *d)
{
    if (d->watch) {
        edl_watch_close(d->watch);
        d->watch = NULL;
    }
    edl_range_opts ro = {.prefix = true, .limit = 3 * EDL_SERVICE_MAX_INSTANCES};
    edl_range_result r;
    int rc = edl_etcd_range(d->c, edl_str(d->dir), &ro, &r);
    if (rc) {
        EDL_WARN("discovery", "listing %s: %s", d->dir, edl_etcd_errmsg(d->c));
        return rc;
    }
    if (r.more)
        EDL_WARN("discovery", "%s holds %lld keys: reading the first %zu", d->dir,
                 (long long)r.count, r.n_kvs);
    sets_clear(d);
    for (size_t i = 0; i < r.n_kvs && rc != EDL_ENOMEM; i++)
        if ((rc = apply_kv(d, &r.kvs[i], false)) == EDL_ETOOBIG)
            EDL_WARN("discovery", "%s: more than %d teachers or students: %s ignored", d->dir,
                     EDL_SERVICE_MAX_INSTANCES, r.kvs[i].key);
    edl_watch_opts wo = {.prefix = true, .start_revision = r.revision + 1};
    edl_range_result_clear(&r);
    if (rc != EDL_ENOMEM)
        rc = edl_watch_open(d->c, edl_str(d->dir), &wo, &d->watch);
    if (rc)
        EDL_WARN("discovery", "watching %s: %s", d->dir, edl_strerror(rc));
    return rc;
}

/* Apply the events that wait (the first one waited for up to timeout_ms); *dirty when any
 * changed the sets. A watch that cannot go on is replaced by a fresh listing. */
static int drain(edl_discovery *d, int timeout_ms, bool *dirty)
{
    int64_t deadline = edl_deadline_ms(timeout_ms);
    for (int n = 0; n < 4 * EDL_SERVICE_MAX_INSTANCES; n++) {
        int64_t left = deadline < 0 ? -1 : deadline - edl_monotonic_ms();
        int wait = *dirty ? 0 : left < 0 && deadline >= 0 ? 0 : (int)left;
        edl_watch_event *ev = NULL;
        int rc = edl_watch_next(d->watch, &ev, wait);
        if (rc == EDL_ETIMEDOUT)
            return 0;
        if (!rc && (ev->type == EDL_WATCH_PUT || ev->type == EDL_WATCH_DELETE)) {
            rc = apply_kv(d, &ev->kv, ev->type == EDL_WATCH_DELETE);
            *dirty = true;
            edl_watch_event_free(ev);
            if (rc == EDL_ENOMEM)
                return rc;
            continue;
        }
        bool lost = rc || ev->type == EDL_WATCH_COMPACTED || ev->type == EDL_WATCH_ERROR;
        edl_watch_event_free(ev);
        if (lost) {
            EDL_INFO("discovery", "the watch on %s was lost or compacted: listing afresh", d->dir);
            *dirty = true;
            return resync(d);
        }
    }
    return 0;
}

/* ---- the student's own key ----------------------------------------------------------------- */

/* Grant a lease, put the student's key under it, and keep it alive. */
static int join(edl_discovery *d)
{
    int64_t lease = 0;
    int rc = edl_etcd_lease_grant(d->c, d->ttl_s, 0, &lease, NULL);
    edl_put_opts po = {.lease = lease};
    if (!rc)
        rc = edl_etcd_put(d->c, edl_str(d->own_key), edl_str("{}"), &po, NULL);
    if (!rc)
        rc = edl_lease_keeper_open(d->c, lease, d->ttl_s, NULL, NULL, &d->keeper);
    if (rc) {
        EDL_WARN("discovery", "registering %s: %s (%s)", d->own_key, edl_strerror(rc),
                 edl_etcd_errmsg(d->c));
        if (lease)
            edl_etcd_lease_revoke(d->c, lease);
        return rc;
    }
    d->lease = lease;
    return 0;
}

/* A lost lease (etcd away for a whole TTL) took the student's key: register again. */
static int rejoin_if_lost(edl_discovery *d)
{
    if (d->keeper && edl_lease_keeper_status(d->keeper) == 0)
        return 0;
    if (d->keeper) {
        EDL_WARN("discovery", "lease %lld of %s lost (%s): registering again",
                 (long long)d->lease, d->own_key,
                 edl_strerror(edl_lease_keeper_status(d->keeper)));
        edl_lease_keeper_close(d->keeper, false);
        d->keeper = NULL;
    }
    return join(d);
}

/* ---- the public calls ------------------------------------------------------------------------ */

static int keys_init(edl_discovery *d, const edl_discovery_opts *o)
{
    d->dir = disc_key(o->prefix, o->service, "", NULL);
    d->teachers_dir = disc_key(o->prefix, o->service, "teachers/", NULL);
    d->students_dir = disc_key(o->prefix, o->service, "students/", NULL);
    d->own_key = disc_key(o->prefix, o->service, "students/", o->student);
    d->student = strdup(o->student);
    return d->dir && d->teachers_dir && d->students_dir && d->own_key && d->student
               ? 0
               : EDL_ENOMEM;
}

int edl_discovery_open(edl_etcd *c, const edl_discovery_opts *o, edl_discovery **out)
{
    *out = NULL;
    if (!c || !o || !edl_service_name_ok(o->service) || !edl_service_name_ok(o->student) ||
        o->ttl_s < 0 || o->ttl_s > 3600)
        return EDL_EINVAL;
    edl_discovery *d = calloc(1, sizeof *d);
    if (!d)
        return EDL_ENOMEM;
    d->c = c;
    d->ttl_s = o->ttl_s ? o->ttl_s : EDL_SERVICE_DEFAULT_TTL_S;
    bool changed;
    int rc = keys_init(d, o);
    if (!rc)
        rc = join(d);
    if (!rc)
        rc = resync(d);
    if (!rc)
        rc = reassign(d, &changed);
    if (rc) {
        edl_discovery_close(d);
        return rc;
    }
    *out = d;
    return 0;
}

int edl_discovery_fd(const edl_discovery *d)
{
    return d && d->watch ? edl_watch_fd(d->watch) : -1;
}

int edl_discovery_poll(edl_discovery *d, int timeout_ms, bool *changed)
{
    if (changed)
        *changed = false;
    if (!d)
        return EDL_EINVAL;
    bool dirty = false, ch = false;
    int rc_join = rejoin_if_lost(d);
    int rc = d->watch ? drain(d, timeout_ms, &dirty) : (dirty = true, resync(d));
    if (dirty) {
        int rc2 = reassign(d, &ch);
        rc = rc ? rc : rc2;
    }
    if (changed)
        *changed = ch;
    return rc ? rc : rc_join;
}

const edl_service_instance *edl_discovery_teachers(const edl_discovery *d, size_t *n)
{
    *n = d ? d->n_mine : 0;
    return d ? d->mine : NULL;
}

size_t edl_discovery_n_teachers(const edl_discovery *d)
{
    return d ? d->nt : 0;
}

size_t edl_discovery_n_students(const edl_discovery *d)
{
    return d ? d->ns : 0;
}

void edl_discovery_close(edl_discovery *d)
{
    if (!d)
        return;
    if (d->watch)
        edl_watch_close(d->watch);
    if (d->keeper) { /* a clean leave: gone at once, not after the TTL */
        if (edl_etcd_delete(d->c, edl_str(d->own_key), NULL, NULL) != 0)
            EDL_DEBUG("discovery", "deleting %s: %s", d->own_key, edl_etcd_errmsg(d->c));
        edl_lease_keeper_close(d->keeper, true);
    }
    sets_clear(d);
    edl_service_list_free(d->mine, d->n_mine);
    free(d->dir);
    free(d->teachers_dir);
    free(d->students_dir);
    free(d->own_key);
    free(d->student);
    free(d);
}

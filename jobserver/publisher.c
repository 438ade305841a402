/* publisher.c: the generation publisher, one job's etcd side, shared by the job server of one
 * job (jobserver.c) and the operator that serves many (operator/). A pass reads the whole job in one txn (a consistent
 * snapshot), asks js_reconcile what the generation should be, and publishes it with a txn that
 * holds only while this replica still leads the job and nobody changed the generation document
 * since the snapshot. It never relies on having seen an event: each pass starts afresh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "edl/etcd.h"
#include "edl/job.h"
#include "edl/log.h"
#include "publisher.h"
#include "reconcile.h"

#define LOG "jobserver"

/* How far a pod's status may run ahead of the published generation and still count: it runs
 * ahead only when the generation document was restored from an older copy, by a few
 * generations. A status further ahead is ignored (reported once). */
#define GENERATION_LEAD_MAX (INT64_C(1) << 20)

/* One consistent read of the job. */
typedef struct snapshot {
    int64_t revision;
    char spec_error[512];
    bool spec_present;
    edl_pod *pods;
    size_t n_pods;
    edl_pod_status *status;
    bool *has_status;
    edl_generation current;   /* the published generation (generation 0: none) */
    int64_t current_mod;      /* its mod revision (0: absent) */
    bool current_bad;
    char current_error[512];
    int64_t max_status_gen;
    int64_t ckpt_step;        /* the checkpoint pointer's step (-1: none) */
    char *gen_dead; /* gen/<current>/dead, as trainers published it (NULL: none) */
    bool *gen_alive; /* [current.n_members]: gen/<current>/alive/<rank> exists (NULL: none) */
} snapshot;


static void snapshot_free(snapshot *s)
{
    for (size_t i = 0; i < s->n_pods; i++)
        edl_pod_clear(&s->pods[i]);
    free(s->pods);
    free(s->status);
    free(s->has_status);
    edl_generation_clear(&s->current);
    free(s->gen_dead);
    free(s->gen_alive);
    memset(s, 0, sizeof *s);
}

/* A malformed document is reported once per revision, not on every pass: true the first time. */
static bool first_report(js_publisher *j, int64_t mod_revision)
{
    for (unsigned i = 0; i < 16 && i < j->n_bad; i++)
        if (j->bad_revs[i] == mod_revision)
            return false;
    j->bad_revs[j->n_bad++ % 16] = mod_revision;
    return true;
}

static void report_bad(js_publisher *j, const edl_kv *kv, const char *err)
{
    if (first_report(j, kv->mod_revision))
        EDL_ERROR(LOG, "ignoring %s: %s", kv->key, err);
}

static void read_spec(js_publisher *j, const edl_range_result *r, snapshot *s)
{
    if (r->n_kvs == 0)
        return;
    s->spec_present = true;
    edl_job_spec sp;
    edl_spec_init(&sp);
    int rc = edl_spec_parse(r->kvs[0].value, r->kvs[0].value_len, &sp, s->spec_error,
                            sizeof s->spec_error);
    if (rc) {
        if (first_report(j, r->kvs[0].mod_revision))
            EDL_ERROR(LOG, "job %s: invalid spec (%s); %s", j->name, s->spec_error,
                      j->have_spec ? "keeping the last valid one" : "waiting for a valid one");
        edl_spec_clear(&sp);
        return;
    }
    s->spec_error[0] = '\0';
    edl_spec_clear(&j->spec);
    j->spec = sp;
    j->have_spec = true;
}

/* A pod of a role this job server does not know (a newer agent's?) takes no part: it is
 * ignored, with one log line per revision. Teachers (read_pods) take no part either, silently:
 * they serve the students through their service, outside the membership. */
static bool known_role(const edl_pod *p, char *err, size_t errlen)
{
    if (!p->role || strcmp(p->role, EDL_ROLE_WORKER) == 0 || strcmp(p->role, EDL_ROLE_PS) == 0)
        return true;
    snprintf(err, errlen, "pod role \"%s\" is unknown (worker or ps): the pod takes no part",
             p->role);
    return false;
}

static int read_pods(js_publisher *j, const edl_range_result *r, snapshot *s)
{
    s->pods = calloc(r->n_kvs + 1, sizeof *s->pods);
    s->status = calloc(r->n_kvs + 1, sizeof *s->status);
    s->has_status = calloc(r->n_kvs + 1, sizeof *s->has_status);
    if (!s->pods || !s->status || !s->has_status)
        return EDL_ENOMEM;
    /* join order: the range is sorted by create_revision */
    for (size_t i = 0; i < r->n_kvs; i++) {
        const edl_kv *kv = &r->kvs[i];
        edl_job_key_info ki;
        char err[256];
        if (edl_job_key_parse(&j->k, kv->key, kv->key_len, &ki) != EDL_KEY_POD ||
            strlen(kv->key) != kv->key_len || !edl_name_valid(ki.name)) {
            report_bad(j, kv, "not a valid pod name");
            continue;
        }
        edl_pod *p = &s->pods[s->n_pods];
        memset(p, 0, sizeof *p);
        if (!(p->name = strdup(ki.name)))
            return EDL_ENOMEM;
        p->lease = kv->lease;
        p->create_revision = kv->create_revision;
        int prc = edl_pod_parse(kv->value, kv->value_len, p, err, sizeof err);
        if (!prc && p->role && strcmp(p->role, EDL_ROLE_TEACHER) == 0) {
            edl_pod_clear(p); /* a teacher serves the students: no member, no part here */
            continue;
        }
        if (prc || !known_role(p, err, sizeof err)) {
            report_bad(j, kv, err);
            edl_pod_clear(p);
            continue;
        }
        s->n_pods++;
    }
    return 0;
}

static void read_status(js_publisher *j, const edl_range_result *r, snapshot *s)
{
    for (size_t i = 0; i < r->n_kvs; i++) {
        const edl_kv *kv = &r->kvs[i];
        edl_job_key_info ki;
        if (edl_job_key_parse(&j->k, kv->key, kv->key_len, &ki) != EDL_KEY_STATUS)
            continue;
        for (size_t p = 0; p < s->n_pods; p++) {
            /* the status of this incarnation: same name, same lease */
            if (strlen(s->pods[p].name) != ki.name_len ||
                memcmp(s->pods[p].name, ki.name, ki.name_len) != 0 || s->pods[p].lease != kv->lease)
                continue;
            char err[256];
            if (edl_pod_status_parse(kv->value, kv->value_len, &s->status[p], err, sizeof err)) {
                report_bad(j, kv, err);
                break;
            }
            if (s->status[p].generation > s->current.generation + GENERATION_LEAD_MAX) {
                /* beyond anything a job server of this job published: corrupt, and following
                 * it would soon run the numbers out */
                report_bad(j, kv, "its generation is far ahead of the published one");
                memset(&s->status[p], 0, sizeof s->status[p]);
                break;
            }
            s->has_status[p] = true;
            if (s->status[p].generation > s->max_status_gen)
                s->max_status_gen = s->status[p].generation;
            break;
        }
    }
}

/* Trainers (libedlcoll) declare a generation dead when its collective group broke; with every
 * member still alive nothing else would start the next one. */
static void read_dead(js_publisher *j, const edl_range_result *r, snapshot *s)
{
    for (size_t i = 0; i < r->n_kvs; i++) {
        const edl_kv *kv = &r->kvs[i];
        edl_job_key_info ki;
        edl_job_key_parse(&j->k, kv->key, kv->key_len, &ki);
        if (edl_job_key_is_gen(&ki, edl_generation_of_members(&s->current), EDL_GEN_DEAD)) {
            size_t len = kv->value_len > 300 ? 300 : kv->value_len;
            s->gen_dead = strndup(kv->value, len);
        }
        int rank;
        if (edl_job_key_gen_rank(&ki, edl_generation_of_members(&s->current), EDL_GEN_ALIVE,
                                 &rank)) {
            if ((size_t)rank >= s->current.n_members)
                continue; /* not one of ours: ignored */
            if (!s->gen_alive && !(s->gen_alive = calloc(s->current.n_members, sizeof(bool))))
                continue;
            s->gen_alive[rank] = true;
        }
    }
}

/* The newest checkpoint's step in the pointer (edl/checkpoint.h's document; -1: none). Only
 * /metrics reads it: a malformed pointer is the checkpoint library's to report. */
static int64_t checkpoint_step(const edl_range_result *r)
{
    if (r->n_kvs == 0)
        return -1;
    cJSON *o = cJSON_ParseWithLength(r->kvs[0].value, r->kvs[0].value_len);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step");
    int64_t step = cJSON_IsNumber(s) && s->valuedouble >= 0 ? (int64_t)s->valuedouble : -1;
    cJSON_Delete(o);
    return step;
}

static int take_snapshot(js_publisher *j, snapshot *s)
{
    memset(s, 0, sizeof *s);
    edl_txn *t = edl_txn_new();
    if (!t)
        return EDL_ENOMEM;
    edl_range_opts by_join = {.prefix = true, .sort_order = EDL_SORT_ASCEND,
                              .sort_target = EDL_SORT_CREATE};
    edl_range_opts prefix = {.prefix = true};
    edl_txn_range(t, EDL_TXN_SUCCESS, edl_str(j->k.spec), NULL);
    edl_txn_range(t, EDL_TXN_SUCCESS, edl_str(j->k.pods), &by_join);
    edl_txn_range(t, EDL_TXN_SUCCESS, edl_str(j->k.status), &prefix);
    edl_txn_range(t, EDL_TXN_SUCCESS, edl_str(j->k.generation), NULL);
    edl_txn_range(t, EDL_TXN_SUCCESS, edl_str(j->k.gens), &prefix); /* rendezvous: small */
    edl_txn_range(t, EDL_TXN_SUCCESS, edl_str(j->k.checkpoint), NULL); /* for /metrics only */
    edl_txn_result r;
    int rc = edl_etcd_txn(j->c, t, &r);
    edl_txn_free(t);
    if (rc)
        return rc;
    if (r.n_results != 6) {
        edl_txn_result_clear(&r);
        return EDL_EPROTO;
    }
    s->revision = r.revision;
    read_spec(j, &r.results[0].range, s);
    rc = read_pods(j, &r.results[1].range, s);
    const edl_range_result *cr = &r.results[3].range;
    if (!rc && cr->n_kvs) {
        s->current_mod = cr->kvs[0].mod_revision;
        if (edl_generation_parse(cr->kvs[0].value, cr->kvs[0].value_len, &s->current,
                                 s->current_error, sizeof s->current_error) != 0) {
            s->current_bad = true;
            if (first_report(j, cr->kvs[0].mod_revision))
                EDL_ERROR(LOG, "job %s: the published generation at %s is unreadable (%s); "
                          "not acting until it is fixed or deleted",
                          j->name, j->k.generation, s->current_error);
        }
    }
    if (!rc)
        read_status(j, &r.results[2].range, s); /* after the generation: bounded by it */
    if (!rc && s->current.generation > 0)
        read_dead(j, &r.results[4].range, s);
    s->ckpt_step = checkpoint_step(&r.results[5].range);
    edl_txn_result_clear(&r);
    if (rc)
        snapshot_free(s);
    return rc;
}

/* Remember the generation (a copy through its document: the one codec there is). */
static void keep_current(js_publisher *j, const edl_generation *g)
{
    edl_generation_clear(&j->current);
    char *json = g->generation ? edl_generation_to_json(g) : NULL;
    char err[128];
    if (json && edl_generation_parse(json, strlen(json), &j->current, err, sizeof err) != 0)
        edl_generation_clear(&j->current);
    free(json);
}

/* Publish `next` if we still lead and the generation document is as we read it.
 * 0: published; EDL_ECONFLICT: someone changed it (re-read); EDL_ELEASE: we no longer lead. */
static int publish(js_publisher *j, const snapshot *s, const js_decision *d)
{
    char *json = edl_generation_to_json(&d->next);
    edl_txn *t = edl_txn_new();
    if (!json || !t) {
        free(json);
        edl_txn_free(t);
        return EDL_ENOMEM;
    }
    /* Never write what this same code could not read back: that would stop the job for good. */
    edl_generation check = {0};
    char err[256];
    int prc = edl_generation_parse(json, strlen(json), &check, err, sizeof err);
    edl_generation_clear(&check);
    if (prc) {
        EDL_ERROR(LOG, "job %s: not publishing generation %lld: the document would not parse "
                  "back (%s)", j->name, (long long)d->next.generation, err);
        free(json);
        edl_txn_free(t);
        return EDL_EPROTO;
    }
    edl_txn_cmp_leader(t, &j->leader);
    if (s->current_mod)
        edl_txn_cmp_mod(t, edl_str(j->k.generation), EDL_CMP_EQUAL, s->current_mod);
    else
        edl_txn_cmp_create(t, edl_str(j->k.generation), EDL_CMP_EQUAL, 0);
    edl_txn_put(t, EDL_TXN_SUCCESS, edl_str(j->k.generation), edl_str(json), NULL);
    char *k_gen = NULL;
    int64_t members_gen = edl_generation_of_members(&s->current);
    if (d->new_generation && s->current.generation > 0 &&
        edl_generation_of_members(&d->next) != members_gen) {
        /* the retired workers' rendezvous data goes with them (a generation that changed only
         * the servers keeps the workers, and their rendezvous under gen/<members_generation>/) */
        k_gen = edl_job_key_gen(&j->k, members_gen, "");
        edl_delete_opts dp = {.prefix = true};
        if (k_gen)
            edl_txn_delete(t, EDL_TXN_SUCCESS, edl_str(k_gen), &dp);
    }
    edl_txn_range(t, EDL_TXN_FAILURE, edl_str(j->k.leader), NULL);
    edl_txn_result r;
    int rc = edl_etcd_txn(j->c, t, &r);
    edl_txn_free(t);
    free(k_gen);
    free(json);
    if (rc)
        return rc;
    if (!r.succeeded) {
        const edl_range_result *lr = &r.results[0].range;
        bool still = lr->n_kvs && lr->kvs[0].create_revision == j->leader.kv->create_revision;
        edl_txn_result_clear(&r);
        return still ? EDL_ECONFLICT : EDL_ELEASE;
    }
    edl_txn_result_clear(&r);
    return 0;
}

/* "a b c" of a member list into buf (bounded). */
static void pod_names(const edl_member *m, size_t n, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? " " : "", m[i].pod);
}

static void log_publish(const js_publisher *j, const js_decision *d)
{
    const edl_generation *n = &d->next;
    char ranks[512], servers[256];
    pod_names(n->members, n->n_members, ranks, sizeof ranks);
    pod_names(n->servers, n->n_servers, servers, sizeof servers);
    EDL_INFO(LOG, "job %s: generation %lld %s, %zu members [%s]%s%s%s%s%s (%s)", j->name,
             (long long)n->generation, edl_job_state_name(n->state), n->n_members, ranks,
             n->n_servers ? ", servers [" : "", servers, n->n_servers ? "]" : "",
             n->n_standbys ? ", standbys " : "", n->n_standbys ? n->standbys[0] : "",
             n->reason ? n->reason : "");
}

/* ---- the leases a hold waits for -------------------------------------------------------- */

static bool renewed_since_hold(const js_renewals *r, int64_t lease)
{
    for (size_t k = 0; k < r->n; k++)
        if (r->leases[k] == lease)
            return true;
    return false;
}

/* The renewals seen for the current hold (js_memory's): a new hold forgets the last one's. */
static js_renewals *renewals_of_hold(js_publisher *j)
{
    js_renewals *r = &j->renewals;
    if (r->hold_gen != j->mem.hold_gen || r->hold_since_mono_ms != j->mem.hold_since_mono_ms) {
        r->hold_gen = j->mem.hold_gen;
        r->hold_since_mono_ms = j->mem.hold_since_mono_ms;
        r->n = 0;
    }
    return r;
}

/* [i]: pods[i]'s lease was seen renewed since the current hold began (NULL: none was, or out of
 * memory: the hold then waits as without probes). */
static bool *renewed_flags(js_publisher *j, const snapshot *s)
{
    js_renewals *r = renewals_of_hold(j);
    bool *f = r->n ? calloc(s->n_pods + 1, sizeof *f) : NULL;
    for (size_t i = 0; f && i < s->n_pods; i++)
        f[i] = renewed_since_hold(r, s->pods[i].lease);
    return f;
}

/* Ask etcd how long each lease the hold waits for has left (at most once a second). A lease
 * with more left than its TTL less the whole seconds since the hold began was renewed since:
 * its agent lives (its trainer is blocked in a collective, not gone). True when one was found
 * (decide again at once). */
static bool probe_renewals(js_publisher *j, const snapshot *s, const js_decision *d)
{
    js_renewals *r = renewals_of_hold(j); /* the hold may have begun in this pass */
    int64_t now = edl_monotonic_ms();
    if (!d->n_probe || now - r->probed_mono_ms < 900)
        return false;
    r->probed_mono_ms = now;
    int64_t held_s = (now - j->mem.hold_since_mono_ms) / 1000;
    bool found = false;
    for (size_t k = 0; k < d->n_probe; k++) {
        const edl_pod *p = &s->pods[d->probe[k]];
        int64_t left_s, granted_s;
        if (renewed_since_hold(r, p->lease) ||
            edl_etcd_lease_ttl(j->c, p->lease, &left_s, &granted_s) != 0 ||
            left_s <= granted_s - held_s)
            continue;
        if (r->n == r->cap) {
            size_t cap = r->cap ? 2 * r->cap : 8;
            int64_t *l = realloc(r->leases, cap * sizeof *l);
            if (!l)
                return found;
            r->leases = l, r->cap = cap;
        }
        r->leases[r->n++] = p->lease;
        found = true;
        EDL_INFO(LOG, "job %s: pod %s renewed its lease after the failure: its agent lives (its "
                 "trainer waits in a collective, it is not gone); not waiting for it", j->name,
                 p->name);
    }
    return found;
}

int js_publisher_pass(js_publisher *j, int64_t *wake, int *final_state)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        snapshot s;
        int rc = take_snapshot(j, &s);
        if (rc) {
            j->m.etcd_errors++;
            EDL_WARN(LOG, "job %s: reading the job failed: %s (%s)", j->name,
                     edl_strerror(rc), edl_etcd_errmsg(j->c));
            *wake = edl_monotonic_ms() + 500;
            return 0;
        }
        if (s.current_bad) {
            snapshot_free(&s);
            *wake = 0;
            return 0;
        }
        *final_state = s.current.generation ? (int)s.current.state : -1;
        keep_current(j, &s.current);
        free(j->spec_error);
        j->spec_error = s.spec_present && s.spec_error[0] ? strdup(s.spec_error) : NULL;
        j->m.generation = s.current.generation;
        j->m.members = (int64_t)s.current.n_members;
        j->m.servers = (int64_t)s.current.n_servers;
        j->m.restarts = s.current.restarts;
        j->m.max_restarts = j->have_spec ? j->spec.max_restarts : -1;
        if (s.ckpt_step != j->m.ckpt_step) { /* its age counts from when we saw it */
            j->m.ckpt_step = s.ckpt_step;
            j->m.ckpt_seen_ms = s.ckpt_step >= 0 ? edl_wall_ms() : 0;
        }
        j->m.state = *final_state;
        js_observed o = {
            .spec = j->have_spec ? &j->spec : NULL,
            .spec_error = s.spec_present && s.spec_error[0] ? s.spec_error : NULL,
            .pods = s.pods, .n_pods = s.n_pods, .status = s.status, .has_status = s.has_status,
            .current = &s.current, .max_status_gen = s.max_status_gen,
            .now_ms = edl_wall_ms(), .mono_ms = edl_monotonic_ms(),
            .leader_id = j->id, .gen_dead = s.gen_dead, .gen_alive = s.gen_alive,
            .renewed = renewed_flags(j, &s),
        };
        js_decision d;
        rc = js_reconcile(&o, &j->mem, &d);
        free((bool *)o.renewed);
        *wake = d.wake_mono_ms;
        if (!rc && d.action == JS_NOTHING && probe_renewals(j, &s, &d))
            *wake = edl_monotonic_ms(); /* a member found alive: decide again now */
        if (!rc && d.waiting[0] && j->waiting_gen != s.current.generation) {
            j->waiting_gen = s.current.generation; /* once a generation: the wait is bounded */
            EDL_INFO(LOG, "job %s: generation %lld: %s", j->name,
                     (long long)s.current.generation, d.waiting);
        }
        if (rc || d.action == JS_NOTHING) {
            js_decision_clear(&d);
            snapshot_free(&s);
            return rc;
        }
        rc = publish(j, &s, &d);
        if (rc == 0) {
            log_publish(j, &d);
            keep_current(j, &d.next);
            *final_state = (int)d.next.state;
            j->m.publications++;
            if (d.next.generation != j->m.generation) /* a new world, not a new state */
                *(d.next.restarts > j->m.restarts ? &j->m.gens_failure
                                                  : &j->m.gens_membership) += 1;
            j->m.generation = d.next.generation;
            j->m.members = (int64_t)d.next.n_members;
            j->m.servers = (int64_t)d.next.n_servers;
            j->m.restarts = d.next.restarts;
            j->m.state = *final_state;
        }
        js_decision_clear(&d);
        snapshot_free(&s);
        if (rc == EDL_ECONFLICT)
            continue; /* the document moved under us: decide again on a fresh read */
        if (rc == EDL_ELEASE)
            return rc;
        if (rc) {
            j->m.etcd_errors++;
            EDL_WARN(LOG, "job %s: publishing failed: %s (%s); retrying", j->name,
                     edl_strerror(rc), edl_etcd_errmsg(j->c));
            *wake = edl_monotonic_ms() + 500;
            return 0;
        }
        *wake = edl_monotonic_ms(); /* look again: the next step may already be due */
        return 0;
    }
    *wake = edl_monotonic_ms() + 100;
    return 0;
}

/* Whether an event can change a decision. A trainer's status matters only when it has ended
 * (failure or success) or waits (a pod whose trainer failed in process mode is a candidate
 * again once it reports waiting: reconcile.c); "running" and step updates, a status write per
 * pod per second and a burst of them at every generation change, would otherwise each cost a full snapshot. Hangs
 * are judged at the times reconcile asks to be woken, from the steps it reads then. */
bool js_publisher_event_matters(const js_publisher *j, const edl_watch_event *ev)
{
    if (ev->type != EDL_WATCH_PUT && ev->type != EDL_WATCH_DELETE)
        return ev->type != EDL_WATCH_PROGRESS;
    edl_job_key_info ki;
    edl_job_key_kind kind = edl_job_key_parse(&j->k, ev->kv.key, ev->kv.key_len, &ki);
    if (kind == EDL_KEY_GEN) /* rendezvous data: only a generation declared dead matters */
        return ev->type == EDL_WATCH_PUT && edl_job_key_is_gen(&ki, ki.gen, EDL_GEN_DEAD);
    if (kind != EDL_KEY_STATUS)
        return true;
    if (ev->type == EDL_WATCH_DELETE)
        return false; /* the pod's own key goes with it */
    edl_pod_status st;
    char err[64];
    if (edl_pod_status_parse(ev->kv.value, ev->kv.value_len, &st, err, sizeof err) != 0)
        return true;
    return st.state == EDL_TRAINER_EXITED || st.state == EDL_TRAINER_SIGNALED ||
           st.state == EDL_TRAINER_WAITING;
}


int js_publisher_init(js_publisher *j, edl_etcd *c, const char *prefix, const char *job, const char *id)
{
    memset(j, 0, sizeof *j);
    j->c = c;
    j->id = id;
    j->m.state = -1;
    j->m.max_restarts = -1;
    j->m.ckpt_step = -1;
    edl_spec_init(&j->spec);
    if (!(j->name = strdup(job)))
        return EDL_ENOMEM;
    int rc = edl_job_keys_init(&j->k, prefix, job);
    if (rc)
        js_publisher_clear(j);
    return rc;
}

void js_publisher_clear(js_publisher *j)
{
    edl_leader_clear(&j->leader);
    js_memory_clear(&j->mem);
    edl_spec_clear(&j->spec);
    edl_job_keys_clear(&j->k);
    edl_generation_clear(&j->current);
    free(j->spec_error);
    free(j->name);
    free(j->renewals.leases);
    memset(j, 0, sizeof *j);
}

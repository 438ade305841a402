/* jobserver.c: the job server's etcd side. A replica campaigns for `jobs/<job>/leader`; the
 * leader reads the whole job in one txn (a consistent snapshot), asks js_reconcile what the
 * generation should be, and publishes it with a txn that holds only while it still leads and
 * nobody changed the generation document since the snapshot. Any event under the job wakes it;
 * it never relies on having seen an event: each pass starts from a fresh snapshot. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include "edl/job.h"
#include "edl/etcd.h"
#include "edl/log.h"
#include "edl/metrics.h"
#include "jobserver.h"
#include "reconcile.h"

#define LOG "jobserver"

/* How far a pod's status may run ahead of the published generation and still count: it runs
 * ahead only when the generation document was restored from an older copy, by a few
 * generations. A status further ahead is ignored (reported once). */
#define GENERATION_LEAD_MAX (INT64_C(1) << 20)

typedef struct jobserver {
    const js_config *cfg;
    int sigfd;
    bool stop;
    edl_etcd *c;
    edl_job_keys k;
    edl_job_spec spec;        /* the last valid spec seen */
    bool have_spec;
    js_memory mem;
    int64_t lease;
    edl_lease_keeper *keeper;
    edl_leader leader;
    int64_t bad_revs[16];     /* malformed documents already reported (one log line each) */
    unsigned n_bad;
    edl_metrics_server *metrics; /* /metrics and /healthz (NULL: off) */
    struct {
        bool leader;
        int64_t generation, members, restarts, publications, etcd_errors, terms;
        int state;            /* -1: no generation yet */
    } m;
} jobserver;

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
    char *gen_dead; /* gen/<current>/dead, as trainers published it (NULL: none) */
    bool *gen_alive; /* [current.n_members]: gen/<current>/alive/<rank> exists (NULL: none) */
} snapshot;

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

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
static bool first_report(jobserver *js, int64_t mod_revision)
{
    for (unsigned i = 0; i < 16 && i < js->n_bad; i++)
        if (js->bad_revs[i] == mod_revision)
            return false;
    js->bad_revs[js->n_bad++ % 16] = mod_revision;
    return true;
}

static void report_bad(jobserver *js, const edl_kv *kv, const char *err)
{
    if (first_report(js, kv->mod_revision))
        EDL_ERROR(LOG, "ignoring %s: %s", kv->key, err);
}

static void read_spec(jobserver *js, const edl_range_result *r, snapshot *s)
{
    if (r->n_kvs == 0)
        return;
    s->spec_present = true;
    edl_job_spec sp;
    edl_spec_init(&sp);
    int rc = edl_spec_parse(r->kvs[0].value, r->kvs[0].value_len, &sp, s->spec_error,
                            sizeof s->spec_error);
    if (rc) {
        if (first_report(js, r->kvs[0].mod_revision))
            EDL_ERROR(LOG, "job %s: invalid spec (%s); %s", js->cfg->job, s->spec_error,
                      js->have_spec ? "keeping the last valid one" : "waiting for a valid one");
        edl_spec_clear(&sp);
        return;
    }
    s->spec_error[0] = '\0';
    edl_spec_clear(&js->spec);
    js->spec = sp;
    js->have_spec = true;
}

static int read_pods(jobserver *js, const edl_range_result *r, snapshot *s)
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
        if (edl_job_key_parse(&js->k, kv->key, kv->key_len, &ki) != EDL_KEY_POD ||
            strlen(kv->key) != kv->key_len || !edl_name_valid(ki.name)) {
            report_bad(js, kv, "not a valid pod name");
            continue;
        }
        edl_pod *p = &s->pods[s->n_pods];
        memset(p, 0, sizeof *p);
        if (!(p->name = strdup(ki.name)))
            return EDL_ENOMEM;
        p->lease = kv->lease;
        p->create_revision = kv->create_revision;
        if (edl_pod_parse(kv->value, kv->value_len, p, err, sizeof err) != 0) {
            report_bad(js, kv, err);
            edl_pod_clear(p);
            continue;
        }
        s->n_pods++;
    }
    return 0;
}

static void read_status(jobserver *js, const edl_range_result *r, snapshot *s)
{
    for (size_t i = 0; i < r->n_kvs; i++) {
        const edl_kv *kv = &r->kvs[i];
        edl_job_key_info ki;
        if (edl_job_key_parse(&js->k, kv->key, kv->key_len, &ki) != EDL_KEY_STATUS)
            continue;
        for (size_t p = 0; p < s->n_pods; p++) {
            /* the status of this incarnation: same name, same lease */
            if (strlen(s->pods[p].name) != ki.name_len ||
                memcmp(s->pods[p].name, ki.name, ki.name_len) != 0 || s->pods[p].lease != kv->lease)
                continue;
            char err[256];
            if (edl_pod_status_parse(kv->value, kv->value_len, &s->status[p], err, sizeof err)) {
                report_bad(js, kv, err);
                break;
            }
            if (s->status[p].generation > s->current.generation + GENERATION_LEAD_MAX) {
                /* beyond anything a job server of this job published: corrupt, and following
                 * it would soon run the numbers out */
                report_bad(js, kv, "its generation is far ahead of the published one");
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
static void read_dead(jobserver *js, const edl_range_result *r, snapshot *s)
{
    for (size_t i = 0; i < r->n_kvs; i++) {
        const edl_kv *kv = &r->kvs[i];
        edl_job_key_info ki;
        edl_job_key_parse(&js->k, kv->key, kv->key_len, &ki);
        if (edl_job_key_is_gen(&ki, s->current.generation, EDL_GEN_DEAD)) {
            size_t len = kv->value_len > 300 ? 300 : kv->value_len;
            s->gen_dead = strndup(kv->value, len);
        }
        int rank;
        if (edl_job_key_gen_rank(&ki, s->current.generation, EDL_GEN_ALIVE, &rank)) {
            if ((size_t)rank >= s->current.n_members)
                continue; /* not one of ours: ignored */
            if (!s->gen_alive && !(s->gen_alive = calloc(s->current.n_members, sizeof(bool))))
                continue;
            s->gen_alive[rank] = true;
        }
    }
}

static int take_snapshot(jobserver *js, snapshot *s)
{
    memset(s, 0, sizeof *s);
    edl_txn *t = edl_txn_new();
    if (!t)
        return EDL_ENOMEM;
    edl_range_opts by_join = {.prefix = true, .sort_order = EDL_SORT_ASCEND,
                              .sort_target = EDL_SORT_CREATE};
    edl_range_opts prefix = {.prefix = true};
    edl_txn_range(t, EDL_TXN_SUCCESS, edl_str(js->k.spec), NULL);
    edl_txn_range(t, EDL_TXN_SUCCESS, edl_str(js->k.pods), &by_join);
    edl_txn_range(t, EDL_TXN_SUCCESS, edl_str(js->k.status), &prefix);
    edl_txn_range(t, EDL_TXN_SUCCESS, edl_str(js->k.generation), NULL);
    edl_txn_range(t, EDL_TXN_SUCCESS, edl_str(js->k.gens), &prefix); /* rendezvous: small */
    edl_txn_result r;
    int rc = edl_etcd_txn(js->c, t, &r);
    edl_txn_free(t);
    if (rc)
        return rc;
    if (r.n_results != 5) {
        edl_txn_result_clear(&r);
        return EDL_EPROTO;
    }
    s->revision = r.revision;
    read_spec(js, &r.results[0].range, s);
    rc = read_pods(js, &r.results[1].range, s);
    const edl_range_result *cr = &r.results[3].range;
    if (!rc && cr->n_kvs) {
        s->current_mod = cr->kvs[0].mod_revision;
        if (edl_generation_parse(cr->kvs[0].value, cr->kvs[0].value_len, &s->current,
                                 s->current_error, sizeof s->current_error) != 0) {
            s->current_bad = true;
            if (first_report(js, cr->kvs[0].mod_revision))
                EDL_ERROR(LOG, "job %s: the published generation at %s is unreadable (%s); "
                          "not acting until it is fixed or deleted",
                          js->cfg->job, js->k.generation, s->current_error);
        }
    }
    if (!rc)
        read_status(js, &r.results[2].range, s); /* after the generation: bounded by it */
    if (!rc && s->current.generation > 0)
        read_dead(js, &r.results[4].range, s);
    edl_txn_result_clear(&r);
    if (rc)
        snapshot_free(s);
    return rc;
}

/* Publish `next` if we still lead and the generation document is as we read it.
 * 0: published; EDL_ECONFLICT: someone changed it (re-read); EDL_ELEASE: we no longer lead. */
static int publish(jobserver *js, const snapshot *s, const js_decision *d)
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
                  "back (%s)", js->cfg->job, (long long)d->next.generation, err);
        free(json);
        edl_txn_free(t);
        return EDL_EPROTO;
    }
    edl_txn_cmp_leader(t, &js->leader);
    if (s->current_mod)
        edl_txn_cmp_mod(t, edl_str(js->k.generation), EDL_CMP_EQUAL, s->current_mod);
    else
        edl_txn_cmp_create(t, edl_str(js->k.generation), EDL_CMP_EQUAL, 0);
    edl_txn_put(t, EDL_TXN_SUCCESS, edl_str(js->k.generation), edl_str(json), NULL);
    char *k_gen = NULL;
    if (d->new_generation && s->current.generation > 0) {
        /* the retired generation's rendezvous data goes with it */
        k_gen = edl_job_key_gen(&js->k, s->current.generation, "");
        edl_delete_opts dp = {.prefix = true};
        if (k_gen)
            edl_txn_delete(t, EDL_TXN_SUCCESS, edl_str(k_gen), &dp);
    }
    edl_txn_range(t, EDL_TXN_FAILURE, edl_str(js->k.leader), NULL);
    edl_txn_result r;
    int rc = edl_etcd_txn(js->c, t, &r);
    edl_txn_free(t);
    free(k_gen);
    free(json);
    if (rc)
        return rc;
    if (!r.succeeded) {
        const edl_range_result *lr = &r.results[0].range;
        bool still = lr->n_kvs && lr->kvs[0].create_revision == js->leader.kv->create_revision;
        edl_txn_result_clear(&r);
        return still ? EDL_ECONFLICT : EDL_ELEASE;
    }
    edl_txn_result_clear(&r);
    return 0;
}

static void log_publish(const jobserver *js, const js_decision *d)
{
    const edl_generation *n = &d->next;
    char ranks[512];
    size_t used = 0;
    ranks[0] = '\0';
    for (size_t i = 0; i < n->n_members && used < sizeof ranks; i++)
        used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%s", i ? " " : "",
                                 n->members[i].pod);
    EDL_INFO(LOG, "job %s: generation %lld %s, %zu members [%s]%s%s (%s)", js->cfg->job,
             (long long)n->generation, edl_job_state_name(n->state), n->n_members, ranks,
             n->n_standbys ? ", standbys " : "", n->n_standbys ? n->standbys[0] : "",
             n->reason ? n->reason : "");
}

/* One pass: snapshot, decide, publish. *wake: when to pass again without events.
 * Returns EDL_ELEASE when leadership is lost, 1 when exit_when_done and the job is final. */
static int reconcile_once(jobserver *js, int64_t *wake, int *final_state)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        snapshot s;
        int rc = take_snapshot(js, &s);
        if (rc) {
            js->m.etcd_errors++;
            EDL_WARN(LOG, "job %s: reading the job failed: %s (%s)", js->cfg->job,
                     edl_strerror(rc), edl_etcd_errmsg(js->c));
            *wake = edl_monotonic_ms() + 500;
            return 0;
        }
        if (s.current_bad) {
            snapshot_free(&s);
            *wake = 0;
            return 0;
        }
        *final_state = s.current.generation ? (int)s.current.state : -1;
        js->m.generation = s.current.generation;
        js->m.members = (int64_t)s.current.n_members;
        js->m.restarts = s.current.restarts;
        js->m.state = *final_state;
        js_observed o = {
            .spec = js->have_spec ? &js->spec : NULL,
            .spec_error = s.spec_present && s.spec_error[0] ? s.spec_error : NULL,
            .pods = s.pods, .n_pods = s.n_pods, .status = s.status, .has_status = s.has_status,
            .current = &s.current, .max_status_gen = s.max_status_gen, .now_ms = wall_ms(),
            .mono_ms = edl_monotonic_ms(),
            .leader_id = js->cfg->id, .gen_dead = s.gen_dead, .gen_alive = s.gen_alive,
        };
        js_decision d;
        rc = js_reconcile(&o, &js->mem, &d);
        *wake = d.wake_mono_ms;
        if (rc || d.action == JS_NOTHING) {
            js_decision_clear(&d);
            snapshot_free(&s);
            return rc;
        }
        rc = publish(js, &s, &d);
        if (rc == 0) {
            log_publish(js, &d);
            *final_state = (int)d.next.state;
            js->m.publications++;
            js->m.generation = d.next.generation;
            js->m.members = (int64_t)d.next.n_members;
            js->m.restarts = d.next.restarts;
            js->m.state = *final_state;
        }
        js_decision_clear(&d);
        snapshot_free(&s);
        if (rc == EDL_ECONFLICT)
            continue; /* the document moved under us: decide again on a fresh read */
        if (rc == EDL_ELEASE)
            return rc;
        if (rc) {
            js->m.etcd_errors++;
            EDL_WARN(LOG, "job %s: publishing failed: %s (%s); retrying", js->cfg->job,
                     edl_strerror(rc), edl_etcd_errmsg(js->c));
            *wake = edl_monotonic_ms() + 500;
            return 0;
        }
        *wake = edl_monotonic_ms(); /* look again: the next step may already be due */
        return 0;
    }
    *wake = edl_monotonic_ms() + 100;
    return 0;
}

/* ---- /metrics (Prometheus text format 0.0.4) ----------------------------------------------- */

static void write_metrics(void *arg, edl_prom *p)
{
    const jobserver *js = arg;
    const char *labels[] = {"job", js->cfg->job, "id", js->cfg->id, NULL};
    p->labels = labels;
    edl_prom_metric(p, "edl_jobserver_leader", "gauge", "1 while this replica leads the job.",
                    js->m.leader);
    edl_prom_metric(p, "edl_jobserver_generation", "gauge",
                    "Generation last read or published (0: none).", js->m.generation);
    edl_prom_metric(p, "edl_jobserver_members", "gauge", "Members of that generation.",
                    js->m.members);
    edl_prom_metric(p, "edl_jobserver_restarts", "gauge",
                    "Generations started because of trainer failures.", js->m.restarts);
    edl_prom_metric(p, "edl_jobserver_publications_total", "counter",
                    "Publications by this replica.", js->m.publications);
    edl_prom_metric(p, "edl_jobserver_etcd_errors_total", "counter",
                    "Failed reads and publications.", js->m.etcd_errors);
    edl_prom_metric(p, "edl_jobserver_leader_terms_total", "counter",
                    "Times this replica became leader.", js->m.terms);
    edl_prom_family(p, "edl_jobserver_job_state", "gauge", "1 for the job's state.");
    for (int st = EDL_JOB_WAITING; st <= EDL_JOB_STOPPED; st++)
        edl_prom_sample(p, "edl_jobserver_job_state", "state",
                        edl_job_state_name((edl_job_state)st), js->m.state == st);
    p->labels = NULL;
}

/* Serve whatever /metrics requests are ready, without waiting. */
static void serve_http(jobserver *js)
{
    if (js->metrics)
        edl_metrics_serve(js->metrics);
}

static bool signalled(jobserver *js)
{
    struct signalfd_siginfo si;
    while (read(js->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        EDL_INFO(LOG, "signal %u: stepping down and exiting", si.ssi_signo);
        js->stop = true;
    }
    return js->stop;
}

/* Whether an event can change a decision. A trainer's status matters only when it has ended
 * (failure or success); "running" and step updates, a status write per pod per second and a
 * burst of them at every generation change, would otherwise each cost a full snapshot. Hangs
 * are judged at the times reconcile asks to be woken, from the steps it reads then. */
static bool event_matters(const jobserver *js, const edl_watch_event *ev)
{
    if (ev->type != EDL_WATCH_PUT && ev->type != EDL_WATCH_DELETE)
        return ev->type != EDL_WATCH_PROGRESS;
    edl_job_key_info ki;
    edl_job_key_kind kind = edl_job_key_parse(&js->k, ev->kv.key, ev->kv.key_len, &ki);
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
    return st.state == EDL_TRAINER_EXITED || st.state == EDL_TRAINER_SIGNALED;
}

/* Lead until the lease is lost, a signal comes, or (exit_when_done) the job ends. */
static int lead(jobserver *js, int *exit_code)
{
    edl_watch *w = NULL;
    edl_watch_opts wo = {.prefix = true};
    int rc = edl_watch_open(js->c, edl_str(js->k.job), &wo, &w);
    if (rc) {
        EDL_WARN(LOG, "watching %s failed: %s; polling instead", js->k.job, edl_strerror(rc));
        w = NULL;
    }
    int64_t wake = 0;
    int final_state = -1;
    bool dirty = true;
    while (!signalled(js)) {
        if (dirty || (wake && edl_monotonic_ms() >= wake)) {
            dirty = false;
            rc = reconcile_once(js, &wake, &final_state);
        }
        if (rc == EDL_ELEASE)
            break;
        if (js->cfg->exit_when_done && final_state >= 0 &&
            edl_job_state_final((edl_job_state)final_state)) {
            *exit_code = edl_job_exit_code((edl_job_state)final_state);
            js->stop = true;
            break;
        }
        int64_t now = edl_monotonic_ms();
        int timeout = w ? -1 : 1000;
        if (wake)
            timeout = wake <= now ? 0 : (int)(wake - now > 60000 ? 60000 : wake - now);
        struct pollfd pf[4] = {{js->sigfd, POLLIN, 0},
                               {edl_lease_keeper_fd(js->keeper), POLLIN, 0},
                               {w ? edl_watch_fd(w) : -1, POLLIN, 0},
                               {js->metrics ? edl_metrics_fd(js->metrics) : -1, POLLIN, 0}};
        int ht = js->metrics ? edl_metrics_timeout_ms(js->metrics) : -1;
        if (ht >= 0 && (timeout < 0 || ht < timeout))
            timeout = ht;
        if (poll(pf, 4, timeout) < 0 && errno != EINTR)
            break;
        serve_http(js);
        if (edl_lease_keeper_status(js->keeper)) {
            rc = EDL_ELEASE;
            break;
        }
        edl_watch_event *ev;
        if (!w)
            dirty = true; /* no watch: poll */
        while (w && edl_watch_next(w, &ev, 0) == 0) {
            bool dead = ev->type == EDL_WATCH_ERROR;
            dirty = dirty || event_matters(js, ev);
            edl_watch_event_free(ev);
            if (dead) {
                edl_watch_close(w);
                w = NULL;
                if (edl_watch_open(js->c, edl_str(js->k.job), &wo, &w) != 0)
                    w = NULL;
                dirty = true; /* events may have been missed: read everything again */
                break;
            }
        }
    }
    if (w)
        edl_watch_close(w);
    js->m.leader = false;
    if (rc == EDL_ELEASE)
        EDL_WARN(LOG, "job %s: lost the leadership; campaigning again", js->cfg->job);
    return rc == EDL_ELEASE ? rc : 0;
}

/* Grant a lease and campaign until we lead or a signal comes. */
static int campaign(jobserver *js)
{
    int64_t backoff = 200;
    while (!signalled(js)) {
        if (!js->keeper) {
            int rc = edl_etcd_lease_grant(js->c, js->cfg->ttl_s, 0, &js->lease, NULL);
            if (!rc)
                rc = edl_lease_keeper_open(js->c, js->lease, js->cfg->ttl_s, NULL, NULL,
                                            &js->keeper);
            if (rc == EDL_EAUTH) { /* retrying will not change the answer */
                EDL_ERROR(LOG, "%s; %s", edl_etcd_errmsg(js->c), edl_etcd_advice(rc));
                return rc;
            }
            if (rc) {
                js->m.etcd_errors++;
                serve_http(js);
                EDL_WARN(LOG, "cannot reach etcd for a lease: %s (%s); retrying (check --etcd "
                         "and, for https, --cacert, --cert and --key)", edl_strerror(rc),
                         edl_etcd_errmsg(js->c));
                usleep((useconds_t)backoff * 1000);
                backoff = backoff < 3000 ? backoff * 2 : 3000;
                continue;
            }
        }
        edl_leader_clear(&js->leader);
        serve_http(js);
        int rc = edl_election_campaign(js->c, edl_str(js->k.leader), edl_str(js->cfg->id),
                                       js->lease, 500, &js->leader);
        if (rc == 0) {
            js->m.leader = true;
            js->m.terms++;
            EDL_INFO(LOG, "job %s: %s leads (lease %llx)", js->cfg->job, js->cfg->id,
                     (unsigned long long)js->lease);
            return 0;
        }
        if (rc == EDL_ETIMEDOUT)
            continue;
        if (rc == EDL_ELEASE || edl_lease_keeper_status(js->keeper)) {
            edl_lease_keeper_close(js->keeper, false);
            js->keeper = NULL;
            continue;
        }
        EDL_WARN(LOG, "campaign failed: %s (%s); retrying", edl_strerror(rc),
                 edl_etcd_errmsg(js->c));
        usleep(300 * 1000);
    }
    return EDL_ECLOSED;
}

int js_run(const js_config *cfg, int sigfd)
{
    jobserver js = {.cfg = cfg, .sigfd = sigfd, .m.state = -1};
    edl_spec_init(&js.spec);
    int exit_code = EDL_EXIT_USAGE;
    if (edl_job_keys_init(&js.k, cfg->prefix, cfg->job) != 0)
        goto out;
    if (cfg->metrics_port > 0) {
        edl_metrics_opts mo = {.addr = cfg->metrics_addr, .port = cfg->metrics_port};
        int hrc = edl_metrics_open(&mo, write_metrics, &js, &js.metrics);
        if (hrc) {
            EDL_ERROR(LOG, "cannot serve /metrics on %s port %d: %s", cfg->metrics_addr ?
                      cfg->metrics_addr : "0.0.0.0", cfg->metrics_port, edl_strerror(hrc));
            goto out;
        }
    }
    int rc = edl_etcd_open(cfg->etcd, &js.c);
    if (rc) {
        EDL_ERROR(LOG, "etcd settings: %s", edl_strerror(rc));
        goto out;
    }
    exit_code = EDL_EXIT_SUCCEEDED;
    while (!js.stop && (rc = campaign(&js)) == 0) {
        if (lead(&js, &exit_code) == EDL_ELEASE) {
            edl_lease_keeper_close(js.keeper, false);
            js.keeper = NULL;
            js_memory_clear(&js.mem); /* a later term starts its windows afresh */
        }
    }
    if (rc == EDL_EAUTH)
        exit_code = EDL_EXIT_UNREACHABLE;
    if (js.leader.kv && js.keeper && !edl_lease_keeper_status(js.keeper))
        edl_election_resign(js.c, &js.leader);
    if (js.keeper)
        edl_lease_keeper_close(js.keeper, true); /* a standby takes over at once */
out:
    edl_leader_clear(&js.leader);
    js_memory_clear(&js.mem);
    edl_spec_clear(&js.spec);
    edl_job_keys_clear(&js.k);
    edl_etcd_close(js.c);
    edl_metrics_close(js.metrics);
    return exit_code;
}

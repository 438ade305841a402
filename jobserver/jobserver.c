/* jobserver.c: the job server of one job. A replica campaigns for `jobs/<job>/leader`; the
 * leader passes over the job (publisher.c: snapshot, decide, publish, fenced by its term) whenever an
 * event under the job can change a decision or reconcile asked to be woken. */
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
#include "publisher.h"
#include "jobserver.h"

#define LOG "jobserver"

typedef struct jobserver {
    const js_config *cfg;
    int sigfd;
    bool stop;
    edl_etcd *c;
    js_publisher job;               /* the job's etcd side (publisher.c) */
    int64_t lease;
    edl_lease_keeper *keeper;
    edl_metrics_server *metrics; /* /metrics and /healthz (NULL: off) */
    bool leading;
    int64_t terms;
} jobserver;

/* ---- /metrics (Prometheus text format 0.0.4) ----------------------------------------------- */

static void write_metrics(void *arg, edl_prom *p)
{
    const jobserver *js = arg;
    const char *labels[] = {"job", js->cfg->job, "id", js->cfg->id, NULL};
    p->labels = labels;
    edl_prom_metric(p, "edl_jobserver_leader", "gauge", "1 while this replica leads the job.",
                    js->leading);
    edl_prom_metric(p, "edl_jobserver_generation", "gauge",
                    "Generation last read or published (0: none).", js->job.m.generation);
    edl_prom_metric(p, "edl_jobserver_members", "gauge", "Members of that generation.",
                    js->job.m.members);
    edl_prom_metric(p, "edl_jobserver_servers", "gauge",
                    "Parameter servers of that generation.", js->job.m.servers);
    edl_prom_metric(p, "edl_jobserver_restarts", "gauge",
                    "Generations started because of trainer failures.", js->job.m.restarts);
    edl_prom_metric(p, "edl_jobserver_publications_total", "counter",
                    "Publications by this replica.", js->job.m.publications);
    edl_prom_metric(p, "edl_jobserver_etcd_errors_total", "counter",
                    "Failed reads and publications.", js->job.m.etcd_errors);
    edl_prom_metric(p, "edl_jobserver_leader_terms_total", "counter",
                    "Times this replica became leader.", js->terms);
    edl_prom_family(p, "edl_jobserver_job_state", "gauge", "1 for the job's state.");
    for (int st = EDL_JOB_WAITING; st <= EDL_JOB_STOPPED; st++)
        edl_prom_sample(p, "edl_jobserver_job_state", "state",
                        edl_job_state_name((edl_job_state)st), js->job.m.state == st);
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

/* Lead until the lease is lost, a signal comes, or (exit_when_done) the job ends. */
static int lead(jobserver *js, int *exit_code)
{
    edl_watch *w = NULL;
    edl_watch_opts wo = {.prefix = true};
    int rc = edl_watch_open(js->c, edl_str(js->job.k.job), &wo, &w);
    if (rc) {
        EDL_WARN(LOG, "watching %s failed: %s; polling instead", js->job.k.job, edl_strerror(rc));
        w = NULL;
    }
    int64_t wake = 0;
    int final_state = -1;
    bool dirty = true;
    while (!signalled(js)) {
        if (dirty || (wake && edl_monotonic_ms() >= wake)) {
            dirty = false;
            rc = js_publisher_pass(&js->job, &wake, &final_state);
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
            dirty = dirty || js_publisher_event_matters(&js->job, ev);
            edl_watch_event_free(ev);
            if (dead) {
                edl_watch_close(w);
                w = NULL;
                if (edl_watch_open(js->c, edl_str(js->job.k.job), &wo, &w) != 0)
                    w = NULL;
                dirty = true; /* events may have been missed: read everything again */
                break;
            }
        }
    }
    if (w)
        edl_watch_close(w);
    js->leading = false;
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
                js->job.m.etcd_errors++;
                serve_http(js);
                EDL_WARN(LOG, "cannot reach etcd for a lease: %s (%s); retrying (check --etcd "
                         "and, for https, --cacert, --cert and --key)", edl_strerror(rc),
                         edl_etcd_errmsg(js->c));
                usleep((useconds_t)backoff * 1000);
                backoff = backoff < 3000 ? backoff * 2 : 3000;
                continue;
            }
        }
        edl_leader_clear(&js->job.leader);
        serve_http(js);
        int rc = edl_election_campaign(js->c, edl_str(js->job.k.leader), edl_str(js->cfg->id),
                                       js->lease, 500, &js->job.leader);
        if (rc == 0) {
            js->leading = true;
            js->terms++;
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
    jobserver js = {.cfg = cfg, .sigfd = sigfd};
    int exit_code = EDL_EXIT_USAGE;
    int rc = edl_etcd_open(cfg->etcd, &js.c);
    if (rc) {
        EDL_ERROR(LOG, "etcd settings: %s", edl_strerror(rc));
        goto out;
    }
    if (js_publisher_init(&js.job, js.c, cfg->prefix, cfg->job, cfg->id) != 0)
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
    exit_code = EDL_EXIT_SUCCEEDED;
    while (!js.stop && (rc = campaign(&js)) == 0) {
        if (lead(&js, &exit_code) == EDL_ELEASE) {
            edl_lease_keeper_close(js.keeper, false);
            js.keeper = NULL;
            js_memory_clear(&js.job.mem); /* a later term starts its windows afresh */
        }
    }
    if (rc == EDL_EAUTH)
        exit_code = EDL_EXIT_UNREACHABLE;
    if (js.job.leader.kv && js.keeper && !edl_lease_keeper_status(js.keeper))
        edl_election_resign(js.c, &js.job.leader);
    if (js.keeper)
        edl_lease_keeper_close(js.keeper, true); /* a standby takes over at once */
out:
    edl_metrics_close(js.metrics);
    js_publisher_clear(&js.job);
    edl_etcd_close(js.c);
    return exit_code;
}

/* metrics.c: the agent's /metrics (Prometheus text format 0.0.4) and /healthz, served by the
 * poll-driven edl_httpd in the agent's loop. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"

typedef struct out {
    char *buf;
    size_t len, cap;
} out;

static void put(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out *o, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = o->buf ? vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap) : -1;
        va_end(ap);
        if (n >= 0 && (size_t)n < o->cap - o->len) {
            o->len += (size_t)n;
            return;
        }
        size_t cap = o->cap ? o->cap * 2 : 4096;
        char *b = realloc(o->buf, cap);
        if (!b)
            return;
        o->buf = b;
        o->cap = cap;
    }
}

static void metric(out *o, const agent *a, const char *name, const char *type, const char *help,
                   long long v)
{
    put(o, "# HELP %s %s\n# TYPE %s %s\n%s{job=\"%s\",pod=\"%s\"} %lld\n", name, help, name, type,
        name, a->o->job, a->o->pod, v);
}

char *metrics_render(const agent *a)
{
    out o = {0};
    const edl_member *m = NULL;
    if (a->have_cluster && a->keeper && a->cluster.state == EDL_JOB_RUNNING) {
        m = edl_cluster_member(&a->cluster, a->o->pod);
        if (m && m->lease != a->lease)
            m = NULL;
    }
    metric(&o, a, "edl_agent_up", "gauge", "1 while the agent runs.", 1);
    metric(&o, a, "edl_agent_generation", "gauge", "Latest cluster generation the agent has seen.",
           a->have_cluster ? (long long)a->cluster.generation : 0);
    metric(&o, a, "edl_agent_rank", "gauge", "This pod's rank in that generation (-1: not a member).",
           m ? m->rank : -1);
    metric(&o, a, "edl_agent_world_size", "gauge", "Members of that generation.",
           a->have_cluster ? (long long)a->cluster.n_members : 0);
    metric(&o, a, "edl_agent_trainer_restarts_total", "counter",
           "Trainer starts by this agent after the first.", a->starts > 0 ? (long long)a->starts - 1 : 0);
    put(&o, "# HELP edl_agent_trainer_state 1 for the trainer's current state, 0 for the others.\n"
            "# TYPE edl_agent_trainer_state gauge\n");
    for (int s = EDL_TRAINER_WAITING; s <= EDL_TRAINER_HUNG; s++)
        put(&o, "edl_agent_trainer_state{job=\"%s\",pod=\"%s\",state=\"%s\"} %d\n", a->o->job,
            a->o->pod, edl_trainer_state_name((edl_trainer_state)s), a->status.state == (edl_trainer_state)s);
    metric(&o, a, "edl_agent_trainer_step", "gauge", "Last step the trainer reported (-1: none).",
           (long long)a->tp.step);
    metric(&o, a, "edl_agent_etcd_errors_total", "counter", "Failed etcd calls of the agent.",
           (long long)a->m.etcd_errors);
    metric(&o, a, "edl_agent_lease_losses_total", "counter", "Times the agent's lease was lost.",
           (long long)a->m.lease_losses);
    return o.buf;
}

void metrics_handler(void *arg, const char *method, const char *path, edl_http_response *r)
{
    (void)method;
    const agent *a = arg;
    if (strcmp(path, "/metrics") == 0) {
        r->body = metrics_render(a);
        r->status = r->body ? 200 : 500;
        r->body_len = r->body ? strlen(r->body) : 0;
        r->content_type = "text/plain; version=0.0.4; charset=utf-8";
    } else if (strcmp(path, "/healthz") == 0) {
        r->body = strdup("ok\n");
        r->status = r->body ? 200 : 500;
        r->body_len = r->body ? 3 : 0;
    }
}

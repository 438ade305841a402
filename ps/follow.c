/* follow.c: elastic servers under edl's agent. The map of servers is the `servers` list of
 * the job's published generation in etcd (the job server's): servers follow it (their shards
 * move when it changes), clients re-route on it, and a server that is told to stop leaves
 * gracefully: it waits until a map without it is published and it has handed every shard
 * over. Everything comes from the environment the agent gives (EDL_ETCD_*, EDL_ETCD_PREFIX,
 * EDL_JOB_ID, EDL_POD_ID, EDL_CHECKPOINT_URI). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "edl/etcd.h"
#include "edl/job.h"
#include "edl/log.h"
#include "edl/proc.h"
#include "internal.h"
#include "server.h"

#define FOLLOW_POLL_MS 200

struct ps_follow {
    edl_etcd *etcd;
    edl_job_keys keys;
    char self[EDL_NAME_MAX + 1];
    pthread_mutex_t mu;
    edl_generation g;        /* the newest read: its servers back the map handed out */
    char **eps;              /* "addr:port" of g's servers */
    const char **names;
    edl_ckpt_config ck;      /* EDL_CHECKPOINT_URI through this etcd */
    bool has_ck;
};

int ps_follow_open(ps_follow **out, char *why, size_t whylen)
{
    const char *job = getenv("EDL_JOB_ID"), *pod = getenv("EDL_POD_ID");
    const char *uri = getenv("EDL_CHECKPOINT_URI");
    edl_etcd *etcd = NULL;
    int rc = edl_etcd_open_env(&etcd, why, whylen);
    if (rc)
        return rc; /* EDL_ENOTFOUND: not under an agent */
    ps_follow *f = calloc(1, sizeof *f);
    if (!f || !job || edl_job_keys_init(&f->keys, getenv("EDL_ETCD_PREFIX"), job) != 0) {
        edl_etcd_close(etcd);
        free(f);
        return edl_errf(why, whylen, EDL_ECONFIG, "EDL_JOB_ID='%s' is not a job name",
                        job ? job : "");
    }
    f->etcd = etcd;
    snprintf(f->self, sizeof f->self, "%s", pod ? pod : "");
    pthread_mutex_init(&f->mu, NULL);
    edl_ckpt_config_init(&f->ck);
    f->ck.uri = uri, f->ck.etcd = etcd, f->ck.job = job, f->ck.prefix = getenv("EDL_ETCD_PREFIX");
    f->has_ck = uri && *uri;
    *out = f;
    return 0;
}

static void drop_map(ps_follow *f)
{
    for (size_t i = 0; f->eps && i < f->g.n_servers; i++)
        free(f->eps[i]);
    free(f->eps);
    free(f->names);
    f->eps = NULL;
    f->names = NULL;
    edl_generation_clear(&f->g);
}

void ps_follow_close(ps_follow *f)
{
    if (!f)
        return;
    drop_map(f);
    edl_job_keys_clear(&f->keys);
    edl_etcd_close(f->etcd);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

const char *ps_follow_self(const ps_follow *f) { return f->self; }
const edl_ckpt_config *ps_follow_checkpoint(const ps_follow *f)
{
    return f->has_ck ? &f->ck : NULL;
}

/* Keep g (read from etcd) and the map strings that point into it. */
static int keep(ps_follow *f, edl_generation *g)
{
    char **eps = calloc(g->n_servers + 1, sizeof *eps);
    const char **names = calloc(g->n_servers + 1, sizeof *names);
    bool ok = eps && names;
    for (size_t i = 0; ok && i < g->n_servers; i++) {
        ok = asprintf(&eps[i], "%s:%d", g->servers[i].addr ? g->servers[i].addr : "",
                      g->servers[i].port) >= 0;
        eps[i] = ok ? eps[i] : NULL;
        names[i] = g->servers[i].pod;
    }
    if (!ok) {
        for (size_t i = 0; eps && i < g->n_servers; i++)
            free(eps[i]);
        free(eps), free(names);
        return EDL_ENOMEM;
    }
    drop_map(f);
    f->g = *g;
    *g = (edl_generation){0};
    f->eps = eps;
    f->names = names;
    return 0;
}

/* The generation in etcd, when it is newer than the one kept or ends the job. */
static int refresh(ps_follow *f)
{
    edl_kv *kv = NULL;
    edl_generation g = {0};
    char err[256];
    int rc = edl_etcd_get(f->etcd, edl_str(f->keys.generation), &kv, NULL);
    if (rc == 0)
        rc = edl_generation_parse(kv->value, kv->value_len, &g, err, sizeof err);
    if (rc == 0 && (g.generation > f->g.generation ||
                    (g.generation == f->g.generation && g.state != f->g.state)))
        rc = keep(f, &g); /* a new map, or the job's end in the same generation */
    edl_generation_clear(&g);
    edl_kv_free(kv);
    return rc;
}

int ps_follow_read(void *arg, int64_t newer_than, edl_ps_servers *out)
{
    ps_follow *f = arg;
    pthread_mutex_lock(&f->mu);
    int rc = refresh(f);
    bool newer = f->g.generation > newer_than && f->g.n_servers > 0 &&
                 f->g.n_servers <= EDL_PS_MAX_SERVERS;
    if (newer)
        *out = (edl_ps_servers){.generation = f->g.generation, .n = (int)f->g.n_servers,
                                .names = f->names, .endpoints = (const char *const *)f->eps};
    pthread_mutex_unlock(&f->mu);
    return rc && rc != EDL_ENOTFOUND ? rc : newer;
}

bool ps_follow_job_over(ps_follow *f)
{
    pthread_mutex_lock(&f->mu);
    bool over = edl_job_state_final(f->g.state);
    pthread_mutex_unlock(&f->mu);
    return over;
}

/* ---- a server that follows ------------------------------------------------------------------ */

/* Whether another server of the map has applied pushes: then this one joins a running job and
 * its shards come from them (no push applies anywhere before every server of the clients' map
 * has its first map: a client pushes only to tables it created on all of them, which a server
 * refuses until it has a map). Tables or rows alone say nothing: pulls make rows, and they are
 * the same made again. Servers that do not answer hold nothing that can come. */
static bool peers_pushed(edl_ps_server *s, const edl_ps_servers *m, const char *self)
{
    for (int i = 0; i < m->n; i++) {
        if (strcmp(m->names[i], self) == 0)
            continue;
        edl_ps_client_options o = {.endpoints = &m->endpoints[i], .names = &m->names[i],
                                   .n_servers = 1, .job = s->job, .secret = &s->secret,
                                   .timeout_ms = 3000, .lanes = 1};
        edl_ps_client *c = NULL;
        edl_ps_server_stats st = {0};
        char why[256];
        bool holds = edl_ps_client_open(&o, &c, why, sizeof why) == 0 &&
                     edl_ps_stats(c, &st) == 0 && st.pushes > 0;
        edl_ps_client_close(c);
        if (holds)
            return true;
    }
    return false;
}

/* Follow the newest map, if there is one newer than *gen. */
static void follow_map(edl_ps_server *s, ps_follow *f, int64_t *gen)
{
    edl_ps_servers m;
    if (ps_follow_read(f, *gen, &m) != 1)
        return;
    pthread_mutex_lock(&f->mu); /* m points into f's kept generation */
    bool joining = *gen == 0 && peers_pushed(s, &m, f->self);
    if (edl_ps_server_set_map(s, &m, f->self, joining) == 0)
        *gen = m.generation;
    pthread_mutex_unlock(&f->mu);
}

static bool in_map(ps_follow *f)
{
    bool in = false;
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->g.n_servers; i++)
        in |= strcmp(f->g.servers[i].pod, f->self) == 0;
    pthread_mutex_unlock(&f->mu);
    return in;
}

int ps_follow_serve(edl_ps_server *s, ps_follow *f, ps_waiter *w, int drain_timeout_ms)
{
    int64_t gen = 0, leave_by = 0;
    for (;;) {
        int sig = ps_wait_signal(w, FOLLOW_POLL_MS);
        if (sig > 0 && !leave_by) {
            EDL_INFO("ps", "%s: leaving: handing the shards over first (up to %d ms)",
                     strsignal(sig), drain_timeout_ms);
            leave_by = edl_monotonic_ms() + drain_timeout_ms;
        } else if (sig > 0) {
            return sig; /* told twice: go now */
        }
        follow_map(s, f, &gen);
        if (leave_by && (ps_follow_job_over(f) || (gen && !in_map(f) &&
                                                   edl_ps_server_drained(s))))
            return 0;
        if (leave_by && edl_monotonic_ms() > leave_by) {
            EDL_WARN("ps", "leaving before every shard was handed over (%d ms passed)",
                     drain_timeout_ms);
            return 0;
        }
    }
}

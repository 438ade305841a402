/* fleet.c: roles from the environment, as Paddle's Fleet API gives them (edl_fleet, ps.h):
 * which role this process plays, the servers, the workers, and the calls that start each.
 * Under edl's agent the servers are elastic: both roles follow the job's map in etcd
 * (follow.c); elsewhere they are the fixed PADDLE_PSERVERS_IP_PORT_LIST. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "edl/log.h"
#include "edl/loop.h"
#include "internal.h"

#define FLEET_MAX_SERVERS 1024

struct edl_fleet {
    bool server;
    int worker_index, worker_num, n_servers, port;
    char *endpoints[FLEET_MAX_SERVERS];
    char job[256], ip[256];
    edl_job_secret secret;
    edl_ps_trainer_options topts;
    int lanes;              /* EDL_PS_LANES (0: the client's default) */
    edl_ps_client *client;
    edl_ps_trainer *trainer;
    uint64_t token, barriers;
    ps_follow *follow;      /* under the agent: the job's map of servers (NULL: fixed) */
};

static int env_int(const char *name, long lo, long hi, long dflt, long *out, char *why,
                   size_t whylen)
{
    const char *v = getenv(name);
    char *end;
    if (!v || !*v) {
        *out = dflt;
        return dflt < lo ? edl_errf(why, whylen, EDL_ECONFIG, "%s is not set", name) : 0;
    }
    long n = strtol(v, &end, 10);
    if (*end || n < lo || n > hi)
        return edl_errf(why, whylen, EDL_ECONFIG, "%s='%s': want an integer in %ld..%ld", name,
                        v, lo, hi);
    *out = n;
    return 0;
}

static int parse_servers(edl_fleet *f, char *why, size_t whylen)
{
    const char *list = getenv("PADDLE_PSERVERS_IP_PORT_LIST");
    if (!list || !*list)
        return edl_errf(why, whylen, EDL_ECONFIG, "PADDLE_PSERVERS_IP_PORT_LIST is not set "
                        "(the servers, \"ip:port,ip:port\")");
    char *copy = strdup(list), *save = NULL;
    int rc = copy ? 0 : EDL_ENOMEM;
    for (char *t = copy ? strtok_r(copy, ",", &save) : NULL; t && rc == 0;
         t = strtok_r(NULL, ",", &save)) {
        const char *colon = strrchr(t, ':');
        if (!colon || colon == t || !colon[1] || f->n_servers == FLEET_MAX_SERVERS)
            rc = edl_errf(why, whylen, EDL_ECONFIG, "PADDLE_PSERVERS_IP_PORT_LIST: '%s' is not "
                          "ip:port (or more than %d servers)", t, FLEET_MAX_SERVERS);
        else if (!(f->endpoints[f->n_servers++] = strdup(t)))
            rc = EDL_ENOMEM;
    }
    free(copy);
    if (rc == 0 && f->n_servers == 0)
        rc = edl_errf(why, whylen, EDL_ECONFIG, "PADDLE_PSERVERS_IP_PORT_LIST names no server");
    return rc;
}

static int parse_mode(edl_fleet *f, char *why, size_t whylen)
{
    const char *m = getenv("EDL_PS_MODE");
    long every = 10, threads = 1, lanes = 0;
    f->topts.mode = EDL_PS_MODE_ASYNC;
    if (m && *m && edl_ps_mode_parse(m, &f->topts.mode) != 0)
        return edl_errf(why, whylen, EDL_ECONFIG, "EDL_PS_MODE='%s': sync, async, half_async or "
                        "geo", m);
    int rc = env_int("EDL_PS_GEO_EVERY", 1, 1000000, 10, &every, why, whylen);
    if (rc == 0)
        rc = env_int("EDL_PS_THREADS", 1, 1024, 1, &threads, why, whylen);
    if (rc == 0)
        rc = env_int("EDL_PS_LANES", 0, EDL_PS_MAX_LANES, 0, &lanes, why, whylen);
    f->lanes = (int)lanes;
    f->topts.geo_every = (int)every;
    f->topts.threads = (int)threads;
    return rc;
}

static int parse_role(edl_fleet *f, char *why, size_t whylen)
{
    const char *role = getenv("TRAINING_ROLE"), *ip = getenv("POD_IP");
    long n, id, port;
    if (!role || (strcmp(role, "TRAINER") && strcmp(role, "PSERVER")))
        return edl_errf(why, whylen, EDL_ECONFIG, "TRAINING_ROLE='%s': TRAINER or PSERVER",
                        role ? role : "");
    f->server = !strcmp(role, "PSERVER");
    int rc = env_int("PADDLE_TRAINERS_NUM", 1, 1 << 20, 0, &n, why, whylen);
    if (rc == 0)
        rc = env_int("PADDLE_TRAINER_ID", 0, n - 1, f->server ? 0 : -1, &id, why, whylen);
    if (rc == 0 && f->server)
        rc = env_int("PADDLE_PORT", 0, 65535, -1, &port, why, whylen);
    long gen = 0; /* the agent's: a later generation's barriers leave this one's behind */
    if (rc == 0 && !f->server)
        rc = env_int("EDL_GENERATION", 0, UINT32_MAX, 0, &gen, why, whylen);
    if (rc)
        return rc;
    f->topts.generation = (uint32_t)gen;
    f->worker_num = (int)n;
    f->worker_index = f->server ? -1 : (int)id;
    f->port = f->server ? (int)port : 0;
    snprintf(f->ip, sizeof f->ip, "%s", ip && *ip ? ip : "127.0.0.1");
    return 0;
}

int edl_fleet_init(edl_fleet **out, char *why, size_t whylen)
{
    edl_fleet *f = calloc(1, sizeof *f);
    if (!f)
        return edl_errf(why, whylen, EDL_ENOMEM, "out of memory");
    const char *job = getenv("EDL_JOB_ID");
    snprintf(f->job, sizeof f->job, "%s", job && *job ? job : "edl");
    edl_job_secret_init(&f->secret);
    int rc = parse_role(f, why, whylen);
    if (rc == 0)
        rc = parse_servers(f, why, whylen);
    if (rc == 0)
        rc = parse_mode(f, why, whylen);
    if (rc == 0 && (rc = ps_follow_open(&f->follow, why, whylen)) == EDL_ENOTFOUND)
        rc = 0;
    if (rc == 0 && (rc = edl_job_secret_load(&f->secret, why, whylen)) == EDL_ENOTFOUND)
        rc = edl_errf(why, whylen, EDL_ECONFIG, "no job secret: set EDL_JOB_SECRET_FILE (the "
                      "parameter server's links are always authenticated)");
    if (rc) {
        edl_fleet_free(f);
        return rc == EDL_ENOMEM ? rc : EDL_ECONFIG;
    }
    *out = f;
    return 0;
}

void edl_fleet_free(edl_fleet *f)
{
    if (!f)
        return;
    edl_fleet_stop_worker(f);
    ps_follow_close(f->follow);
    for (int i = 0; i < f->n_servers; i++)
        free(f->endpoints[i]);
    edl_job_secret_clear(&f->secret);
    free(f);
}

bool edl_fleet_is_worker(const edl_fleet *f) { return !f->server; }
bool edl_fleet_is_server(const edl_fleet *f) { return f->server; }
int edl_fleet_worker_index(const edl_fleet *f) { return f->worker_index; }
int edl_fleet_worker_num(const edl_fleet *f) { return f->worker_num; }
int edl_fleet_server_num(const edl_fleet *f) { return f->n_servers; }
edl_ps_mode edl_fleet_mode(const edl_fleet *f) { return f->topts.mode; }
uint32_t edl_fleet_generation(const edl_fleet *f) { return f->topts.generation; }
edl_ps_client *edl_fleet_client(edl_fleet *f) { return f->client; }
edl_ps_trainer *edl_fleet_trainer(edl_fleet *f) { return f->trainer; }

int edl_fleet_set_mode(edl_fleet *f, edl_ps_mode mode, int geo_every, int threads)
{
    if (f->trainer || mode < EDL_PS_MODE_SYNC || mode > EDL_PS_MODE_GEO || geo_every < 0 ||
        geo_every > 1000000 || threads < 0 || threads > 1024)
        return EDL_EINVAL;
    f->topts.mode = mode;
    f->topts.geo_every = geo_every ? geo_every : f->topts.geo_every;
    f->topts.threads = threads ? threads : f->topts.threads;
    return 0;
}

const char *edl_fleet_server_endpoint(const edl_fleet *f, int i)
{
    return i >= 0 && i < f->n_servers ? f->endpoints[i] : NULL;
}

/* A client of the job's newest map, which re-routes as it changes; servers that are starting
 * (refused, or not answering yet) are waited for up to the client's timeout. */
static int open_following(edl_fleet *f, edl_ps_client_options *co, char *why, size_t whylen)
{
    int64_t until = edl_monotonic_ms() + 30000;
    for (;;) {
        edl_ps_servers m;
        if (ps_follow_read(f->follow, 0, &m) == 1) {
            co->endpoints = m.endpoints, co->names = m.names, co->n_servers = m.n;
            co->generation = m.generation;
            co->servers = ps_follow_read, co->servers_arg = f->follow;
        }
        int rc = edl_ps_client_open(co, &f->client, why, whylen);
        if (rc != EDL_EUNAVAIL || edl_monotonic_ms() > until)
            return rc;
        nanosleep(&(struct timespec){0, 100 * 1000000L}, NULL);
    }
}

int edl_fleet_init_worker(edl_fleet *f, char *why, size_t whylen)
{
    if (f->server)
        return edl_errf(why, whylen, EDL_EINVAL, "this process is a server (TRAINING_ROLE="
                        "PSERVER)");
    edl_ps_client_options co = {.endpoints = (const char *const *)f->endpoints,
                                .n_servers = f->n_servers, .job = f->job,
                                .secret = &f->secret, .lanes = f->lanes};
    int rc = f->follow ? open_following(f, &co, why, whylen)
                       : edl_ps_client_open(&co, &f->client, why, whylen);
    if (rc)
        return rc;
    f->topts.trainer_id = f->worker_index;
    f->topts.trainers = f->worker_num;
    f->token = ps_mix64((uint64_t)edl_monotonic_ms() ^ (uint64_t)(uintptr_t)f ^
                        ((uint64_t)f->worker_index << 40));
    if ((rc = edl_ps_trainer_open(f->client, &f->topts, &f->trainer, why, whylen)) != 0) {
        edl_ps_client_close(f->client);
        f->client = NULL;
    }
    return rc;
}

static uint32_t worker_count(void *arg)
{
    return (uint32_t)((edl_fleet *)arg)->worker_num;
}

int edl_fleet_barrier_worker(edl_fleet *f)
{
    uint64_t done;
    if (!f->client)
        return EDL_EINVAL;
    int rc = 0;
    ps_arrival who = {f->token, f->topts.generation};
    if (f->barriers == 0) /* a worker that joins late starts where the others are */
        rc = ps_client_wait_barrier(f->client, PS_SPACE_WORKERS, &who, UINT64_MAX, worker_count,
                                    f, &f->barriers);
    if (rc == 0)
        rc = ps_client_wait_barrier(f->client, PS_SPACE_WORKERS, &who, f->barriers,
                                    worker_count, f, &done);
    if (rc == 0)
        f->barriers++;
    return rc;
}

int edl_fleet_stop_worker(edl_fleet *f)
{
    int rc = edl_ps_trainer_close(f->trainer);
    edl_ps_client_close(f->client);
    f->trainer = NULL;
    f->client = NULL;
    return rc;
}

int edl_fleet_run_server(edl_fleet *f, char *why, size_t whylen)
{
    if (!f->server)
        return edl_errf(why, whylen, EDL_EINVAL, "this process is a worker (TRAINING_ROLE="
                        "TRAINER)");
    sigset_t sigs;
    edl_loop_block_signals(EDL_SIGNALS_STOP, &sigs); /* before the loops start: they inherit it */
    edl_ps_server_options o = {.listen_addr = f->ip, .port = f->port, .job = f->job,
                               .secret = &f->secret, .wait_for_map = f->follow != NULL,
                               .checkpoint = f->follow ? ps_follow_checkpoint(f->follow) : NULL};
    edl_ps_server *s = NULL;
    int rc = edl_ps_server_open(&o, &s, why, whylen);
    if (rc == 0 && (rc = edl_ps_server_start(s)) != 0)
        edl_errf(why, whylen, rc, "cannot start the event loops");
    if (rc == 0) {
        int sig;
        EDL_INFO("ps", "serving on %s:%d%s", f->ip, edl_ps_server_port(s),
                 f->follow ? ", following the job's map of servers" : "");
        ps_waiter w;
        if (f->follow && ps_waiter_open(&w) == 0)
            ps_follow_serve(s, f->follow, &w, PS_DRAIN_TIMEOUT_MS);
        else
            sigwait(&sigs, &sig); /* no loop: the signal ends it at once (no hand-over) */
        if (f->follow)
            ps_waiter_close(&w);
    }
    edl_ps_server_close(s);
    return rc;
}

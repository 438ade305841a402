/* env.c: the environment a trainer gets: edl's own names plus those of the PyTorch and Paddle
 * launchers, so unmodified training scripts run under the agent; and the environment of a
 * parameter server (role ps): edl's names and Paddle's PSERVER names, none of a worker's rank.
 * Pure: no I/O. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"

/* Names the agent sets (or removes): inherited values of these never reach the trainer. */
static const char *const owned[] = {
    "EDL_JOB_ID", "EDL_POD_ID", "EDL_RANK", "EDL_WORLD_SIZE", "EDL_GENERATION", "EDL_RUN_ID",
    EDL_ETCD_ENV_NAMES, "EDL_ETCD_PREFIX", "EDL_ELASTIC_MODE", "EDL_CHECKPOINT_URI",
    "EDL_CONTROL_FD", "EDL_PROGRESS_FD", "RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
    "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "PADDLE_TRAINER_ID",
    "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ENDPOINTS", "PADDLE_CURRENT_ENDPOINT",
    "PADDLE_PSERVERS_IP_PORT_LIST", "TRAINING_ROLE", "PADDLE_PORT", "POD_IP", "EDL_PS_INDEX",
    "EDL_PS_SERVERS", "EDL_ROLE_NAME", "EDL_SERVICE", NULL};

/* What a teacher's server gets besides: its port (and none of the worker's names, inherited
 * or not; EDL_SERVICE is both roles'). */
static const char *const teacher_owned[] = {"EDL_SERVICE_PORT", "PORT", NULL};

typedef struct strv {
    char **v;
    size_t n, cap;
    bool oom;
} strv;

static void strv_push(strv *s, char *str)
{
    if (!str || s->oom) {
        s->oom = true;
        free(str);
        return;
    }
    if (s->n + 2 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        char **v = realloc(s->v, cap * sizeof *v);
        if (!v) {
            s->oom = true;
            free(str);
            return;
        }
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = str;
    s->v[s->n] = NULL;
}

static void setf(strv *s, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void setf(strv *s, const char *name, const char *fmt, ...)
{
    char *val = NULL, *entry = NULL;
    va_list ap;
    va_start(ap, fmt);
    int rc = vasprintf(&val, fmt, ap);
    va_end(ap);
    if (rc < 0) {
        strv_push(s, NULL);
        return;
    }
    if (asprintf(&entry, "%s=%s", name, val) < 0)
        entry = NULL;
    free(val);
    strv_push(s, entry);
}

/* "addr:port,..." of a member list in rank order (malloc'ed): PADDLE_TRAINER_ENDPOINTS for the
 * members, PADDLE_PSERVERS_IP_PORT_LIST for the servers ("" for none). */
static char *endpoints(const edl_member *m, size_t n)
{
    size_t cap = 1;
    for (size_t i = 0; i < n; i++)
        cap += strlen(m[i].addr ? m[i].addr : "") + 8;
    char *s = malloc(cap), *p = s;
    if (!s)
        return NULL;
    *p = '\0';
    for (size_t i = 0; i < n; i++)
        p += snprintf(p, cap - (size_t)(p - s), "%s%s:%d", i ? "," : "",
                      m[i].addr ? m[i].addr : "", m[i].port);
    return s;
}

int agent_assignment(const edl_generation *g, int rank, int master_port, edl_assignment *out)
{
    memset(out, 0, sizeof *out);
    if (rank < 0 || (size_t)rank >= g->n_members)
        return EDL_EINVAL;
    out->generation = edl_generation_of_members(g); /* the workers' (kept across servers-only
                                                     * generations) */
    out->rank = rank;
    out->world_size = (int)g->n_members;
    snprintf(out->master_addr, sizeof out->master_addr, "%s",
             g->members[0].addr ? g->members[0].addr : "");
    out->master_port = master_port > 0 ? master_port : g->members[0].port;
    return 0;
}

static bool same_addr(const edl_member *a, const edl_member *b)
{
    return strcmp(a->addr ? a->addr : "", b->addr ? b->addr : "") == 0;
}

/* LOCAL_RANK and LOCAL_WORLD_SIZE: this rank's place among the members on its address. */
static void local_ranks(const edl_generation *g, int rank, int *local_rank, int *local_world)
{
    *local_rank = *local_world = 0;
    for (size_t i = 0; i < g->n_members; i++)
        if (same_addr(&g->members[i], &g->members[rank])) {
            if ((int)i < rank)
                (*local_rank)++;
            (*local_world)++;
        }
}

/* The etcd settings, so that libedlcoll and checkpoints connect as the agent does. */
static void set_etcd(strv *s, const edl_etcd_config *cfg)
{
    char **env = NULL;
    if (edl_etcd_config_env(cfg, &env) != 0) {
        strv_push(s, NULL);
        return;
    }
    for (char **e = env; *e; e++)
        strv_push(s, strdup(*e));
    edl_env_free(env);
}

/* edl's own names, of both roles. */
static void set_edl(strv *s, const agent_env_input *in)
{
    setf(s, "EDL_JOB_ID", "%s", in->job);
    setf(s, "EDL_POD_ID", "%s", in->pod);
    setf(s, "EDL_ROLE_NAME", "%s", in->role ? in->role : EDL_ROLE_WORKER);
    /* a worker's is the generation its members were formed in (the same on every rank, whatever
     * servers-only generations came since); a server's is the one it starts in */
    int64_t gen = agent_role_is_ps(in->role) ? in->generation->generation
                  : in->rank < 0 ? 0 /* started ahead: no generation yet */
                                 : edl_generation_of_members(in->generation);
    setf(s, "EDL_GENERATION", "%lld", (long long)gen);
    if (in->generation->started_ms > 0) /* the run: a checkpoint's ranks name it (checkpoint.h) */
        setf(s, "EDL_RUN_ID", "%lld", (long long)in->generation->started_ms);
    setf(s, "EDL_PS_SERVERS", "%zu", in->generation->n_servers);
    set_etcd(s, in->etcd);
    setf(s, "EDL_ETCD_PREFIX", "%s", in->prefix);
    setf(s, "EDL_ELASTIC_MODE", "%s", edl_elastic_mode_name(in->spec->mode));
    if (in->spec->checkpoint_uri)
        setf(s, "EDL_CHECKPOINT_URI", "%s", in->spec->checkpoint_uri);
    if (in->spec->teachers_service[0]) /* the job's teachers: where its students find them */
        setf(s, "EDL_SERVICE", "%s", in->spec->teachers_service);
    setf(s, "EDL_CONTROL_FD", "%d", in->control_fd);
    setf(s, "EDL_PROGRESS_FD", "%d", in->progress_fd);
}

/* The names of PyTorch's launcher (torchrun / torch.distributed.elastic). Each agent runs one
 * worker, so a pod is a torchrun node: groups and ranks coincide. */
static void set_torch(strv *s, const agent_env_input *in, const edl_assignment *a)
{
    int local_rank, local_world;
    local_ranks(in->generation, in->rank, &local_rank, &local_world);
    setf(s, "RANK", "%d", in->rank);
    setf(s, "GROUP_RANK", "%d", in->rank);
    setf(s, "GROUP_WORLD_SIZE", "%d", a->world_size);
    setf(s, "ROLE_NAME", "%s", in->role ? in->role : "worker");
    setf(s, "ROLE_RANK", "%d", in->rank);
    setf(s, "ROLE_WORLD_SIZE", "%d", a->world_size);
    setf(s, "LOCAL_RANK", "%d", local_rank);
    setf(s, "LOCAL_WORLD_SIZE", "%d", local_world);
    setf(s, "WORLD_SIZE", "%d", a->world_size);
    setf(s, "MASTER_ADDR", "%s", a->master_addr);
    setf(s, "MASTER_PORT", "%d", a->master_port);
    /* as torchrun counts: restarts after failures (the job's), not every start */
    setf(s, "TORCHELASTIC_RESTART_COUNT", "%d", in->generation->restarts);
    setf(s, "TORCHELASTIC_MAX_RESTARTS", "%d", in->spec->max_restarts);
    setf(s, "TORCHELASTIC_RUN_ID", "%s", in->job);
    if (in->error_file)
        setf(s, "TORCHELASTIC_ERROR_FILE", "%s", in->error_file);
}

/* The names of Paddle's launcher (paddle.distributed.launch) for a trainer. */
static void set_paddle(strv *s, const agent_env_input *in, const char *endpoints,
                       const char *servers)
{
    const edl_member *me = &in->generation->members[in->rank];
    setf(s, "PADDLE_TRAINER_ID", "%d", in->rank);
    setf(s, "PADDLE_TRAINERS_NUM", "%zu", in->generation->n_members);
    setf(s, "PADDLE_TRAINER_ENDPOINTS", "%s", endpoints);
    setf(s, "PADDLE_CURRENT_ENDPOINT", "%s:%d", me->addr ? me->addr : "", me->port);
    setf(s, "PADDLE_PSERVERS_IP_PORT_LIST", "%s", servers);
    setf(s, "TRAINING_ROLE", "%s", "TRAINER");
    setf(s, "POD_IP", "%s", me->addr ? me->addr : "");
}

/* A worker: edl's names with its rank, torchrun's and Paddle's TRAINER names. */
static int worker_env(const agent_env_input *in, strv *set)
{
    edl_assignment a;
    int rc = agent_assignment(in->generation, in->rank, in->master_port, &a);
    const edl_generation *g = in->generation;
    char *eps = rc ? NULL : endpoints(g->members, g->n_members);
    char *srv = rc ? NULL : endpoints(g->servers, g->n_servers);
    if (!rc && (!eps || !srv))
        rc = EDL_ENOMEM;
    if (!rc) {
        setf(set, "EDL_RANK", "%d", in->rank);
        setf(set, "EDL_WORLD_SIZE", "%zu", g->n_members);
        set_torch(set, in, &a);
        set_paddle(set, in, eps, srv);
    }
    free(eps);
    free(srv);
    return rc;
}

/* A parameter server: Paddle's PSERVER names and its server rank. The worker names (EDL_RANK,
 * EDL_WORLD_SIZE, RANK, MASTER_*, PADDLE_TRAINER_ID, ...) are not set, and inherited values
 * of them are removed. */
static int server_env(const agent_env_input *in, strv *set)
{
    const edl_generation *g = in->generation;
    if (in->rank < 0 || (size_t)in->rank >= g->n_servers)
        return EDL_EINVAL;
    const edl_member *me = &g->servers[in->rank];
    char *srv = endpoints(g->servers, g->n_servers);
    if (!srv)
        return EDL_ENOMEM;
    setf(set, "EDL_PS_INDEX", "%d", in->rank);
    setf(set, "TRAINING_ROLE", "%s", "PSERVER");
    setf(set, "PADDLE_PSERVERS_IP_PORT_LIST", "%s", srv);
    setf(set, "PADDLE_PORT", "%d", me->port);
    setf(set, "POD_IP", "%s", me->addr ? me->addr : "");
    setf(set, "PADDLE_TRAINERS_NUM", "%zu", g->n_members);
    free(srv);
    return 0;
}

bool agent_role_is_ps(const char *role)
{
    return role && strcmp(role, EDL_ROLE_PS) == 0;
}

int agent_env_build(const agent_env_input *in, char *const *base, char ***out)
{
    *out = NULL;
    strv set = {0};
    set_edl(&set, in);
    int rc = agent_role_is_ps(in->role) ? server_env(in, &set)
             : in->rank < 0 ? 0 /* ahead of membership: the first control line assigns it */
                            : worker_env(in, &set);
    char **env = rc || set.oom ? NULL : edl_env_build(base, owned, set.v);
    edl_env_free(set.v);
    if (rc || !env)
        return rc ? rc : EDL_ENOMEM;
    *out = env;
    return 0;
}

/* owned and teacher_owned as one list (malloc'ed; the strings are borrowed). */
static const char **teacher_names(void)
{
    size_t n = 0, m = 0;
    while (owned[n])
        n++;
    while (teacher_owned[m])
        m++;
    const char **v = calloc(n + m + 1, sizeof *v);
    if (v) {
        memcpy(v, owned, n * sizeof *v);
        memcpy(v + n, teacher_owned, m * sizeof *v);
    }
    return v;
}

int agent_env_build_teacher(const agent_teacher_env *in, char *const *base, char ***out)
{
    *out = NULL;
    strv set = {0};
    if (in->job)
        setf(&set, "EDL_JOB_ID", "%s", in->job);
    setf(&set, "EDL_POD_ID", "%s", in->pod);
    setf(&set, "EDL_ROLE_NAME", "%s", EDL_ROLE_TEACHER);
    setf(&set, "EDL_SERVICE", "%s", in->service);
    setf(&set, "PORT", "%d", in->port);
    setf(&set, "EDL_SERVICE_PORT", "%d", in->port);
    setf(&set, "POD_IP", "%s", in->addr);
    set_etcd(&set, in->etcd);
    setf(&set, "EDL_ETCD_PREFIX", "%s", in->prefix);
    const char **names = teacher_names();
    char **env = set.oom || !names ? NULL : edl_env_build(base, names, set.v);
    free(names);
    edl_env_free(set.v);
    if (!env)
        return EDL_ENOMEM;
    *out = env;
    return 0;
}

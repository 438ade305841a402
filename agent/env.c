/* env.c: the environment a trainer gets: edl's own names plus those of the PyTorch and Paddle
 * launchers, so unmodified training scripts run under the agent. Pure: no I/O. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"

/* Names the agent sets (or removes): inherited values of these never reach the trainer. */
static const char *const owned[] = {
    "EDL_JOB_ID", "EDL_POD_ID", "EDL_RANK", "EDL_WORLD_SIZE", "EDL_GENERATION",
    "EDL_ETCD_ENDPOINTS", "EDL_ETCD_PREFIX", "EDL_ELASTIC_MODE", "EDL_CHECKPOINT_URI",
    "EDL_CONTROL_FD", "EDL_PROGRESS_FD", "RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "PADDLE_TRAINER_ID",
    "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ENDPOINTS", "PADDLE_CURRENT_ENDPOINT",
    "PADDLE_PSERVERS_IP_PORT_LIST", "TRAINING_ROLE", NULL};

static bool is_owned(const char *entry)
{
    const char *eq = strchr(entry, '=');
    size_t n = eq ? (size_t)(eq - entry) : strlen(entry);
    for (int i = 0; owned[i]; i++)
        if (strlen(owned[i]) == n && strncmp(owned[i], entry, n) == 0)
            return true;
    return false;
}

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

void agent_env_free(char **env)
{
    for (size_t i = 0; env && env[i]; i++)
        free(env[i]);
    free(env);
}

/* "addr:port,..." of every member in rank order (malloc'ed). */
static char *endpoints(const edl_cluster *c)
{
    size_t cap = 1;
    for (size_t i = 0; i < c->n_members; i++)
        cap += strlen(c->members[i].addr ? c->members[i].addr : "") + 8;
    char *s = malloc(cap), *p = s;
    if (!s)
        return NULL;
    *p = '\0';
    for (size_t i = 0; i < c->n_members; i++)
        p += snprintf(p, cap - (size_t)(p - s), "%s%s:%d", i ? "," : "",
                      c->members[i].addr ? c->members[i].addr : "", c->members[i].port);
    return s;
}

int agent_generation_info(const edl_cluster *c, int rank, edl_trainer_generation *g)
{
    memset(g, 0, sizeof *g);
    if (rank < 0 || (size_t)rank >= c->n_members)
        return EDL_EINVAL;
    g->generation = c->generation;
    g->rank = rank;
    g->world_size = (int)c->n_members;
    snprintf(g->master_addr, sizeof g->master_addr, "%s",
             c->members[0].addr ? c->members[0].addr : "");
    g->master_port = c->members[0].port;
    g->endpoints = endpoints(c);
    return g->endpoints ? 0 : EDL_ENOMEM;
}

static bool same_addr(const edl_member *a, const edl_member *b)
{
    return strcmp(a->addr ? a->addr : "", b->addr ? b->addr : "") == 0;
}

int agent_env_build(const agent_env_input *in, char *const *base, char ***out)
{
    *out = NULL;
    const edl_cluster *c = in->cluster;
    if (in->rank < 0 || (size_t)in->rank >= c->n_members)
        return EDL_EINVAL;
    const edl_member *me = &c->members[in->rank];
    int local_rank = 0, local_world = 0;
    for (size_t i = 0; i < c->n_members; i++)
        if (same_addr(&c->members[i], me)) {
            if ((int)i < in->rank)
                local_rank++;
            local_world++;
        }
    edl_trainer_generation g;
    int rc = agent_generation_info(c, in->rank, &g);
    if (rc)
        return rc;

    strv s = {0};
    for (size_t i = 0; base && base[i]; i++)
        if (!is_owned(base[i]))
            strv_push(&s, strdup(base[i]));
    int world = (int)c->n_members;
    setf(&s, "EDL_JOB_ID", "%s", in->job);
    setf(&s, "EDL_POD_ID", "%s", in->pod);
    setf(&s, "EDL_RANK", "%d", in->rank);
    setf(&s, "EDL_WORLD_SIZE", "%d", world);
    setf(&s, "EDL_GENERATION", "%lld", (long long)c->generation);
    setf(&s, "EDL_ETCD_ENDPOINTS", "%s", in->etcd_endpoints);
    setf(&s, "EDL_ETCD_PREFIX", "%s", in->prefix);
    setf(&s, "EDL_ELASTIC_MODE", "%s", in->spec->mode == EDL_MODE_INPROCESS ? "inprocess" : "restart");
    if (in->spec->checkpoint_uri)
        setf(&s, "EDL_CHECKPOINT_URI", "%s", in->spec->checkpoint_uri);
    setf(&s, "EDL_CONTROL_FD", "%d", in->control_fd);
    setf(&s, "EDL_PROGRESS_FD", "%d", in->progress_fd);
    /* PyTorch (torchrun / torch.distributed.elastic) */
    setf(&s, "RANK", "%d", in->rank);
    setf(&s, "GROUP_RANK", "%d", in->rank);
    setf(&s, "LOCAL_RANK", "%d", local_rank);
    setf(&s, "LOCAL_WORLD_SIZE", "%d", local_world);
    setf(&s, "WORLD_SIZE", "%d", world);
    setf(&s, "MASTER_ADDR", "%s", g.master_addr);
    setf(&s, "MASTER_PORT", "%d", g.master_port);
    setf(&s, "TORCHELASTIC_RESTART_COUNT", "%lld", (long long)in->restart_count);
    setf(&s, "TORCHELASTIC_MAX_RESTARTS", "%d", in->spec->max_restarts);
    setf(&s, "TORCHELASTIC_RUN_ID", "%s", in->job);
    /* Paddle (paddle.distributed.launch) */
    setf(&s, "PADDLE_TRAINER_ID", "%d", in->rank);
    setf(&s, "PADDLE_TRAINERS_NUM", "%d", world);
    setf(&s, "PADDLE_TRAINER_ENDPOINTS", "%s", g.endpoints);
    setf(&s, "PADDLE_CURRENT_ENDPOINT", "%s:%d", me->addr ? me->addr : "", me->port);
    setf(&s, "PADDLE_PSERVERS_IP_PORT_LIST", "%s", "");
    setf(&s, "TRAINING_ROLE", "%s", "TRAINER");
    free(g.endpoints);
    if (s.oom || !s.v) {
        agent_env_free(s.v);
        return EDL_ENOMEM;
    }
    *out = s.v;
    return 0;
}

/* comm.c: the elastic communicator. It joins one generation at a time: publish this rank's
 * endpoint under jobs/<job>/gen/<n>/cpu/<rank>, watch gen/<n>/ until every rank has, connect
 * the mesh (every link authenticated with the job secret), (NCCL: build the device
 * communicator), check every link of the mesh. A failed collective breaks the communicator,
 * closes its sockets (so peers blocked on this rank fail at once) and publishes gen/<n>/dead;
 * edl_coll_check() then waits for the next generation from the agent's control pipe and joins
 * it. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "edl/http.h"
#include "edl/job.h"
#include "edl/json.h"
#include "edl/log.h"
#include "internal.h"

void coll_set_err(edl_comm *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
}

static void *grow(char **buf, size_t *cap, size_t bytes)
{
    if (*cap >= bytes)
        return *buf;
    char *p = realloc(*buf, bytes);
    if (!p)
        return NULL;
    *buf = p;
    *cap = bytes;
    return p;
}

void *coll_stage(edl_comm *c, size_t bytes)
{
    return grow(&c->stage, &c->stage_cap, bytes);
}

void *coll_work(edl_comm *c, size_t bytes)
{
    return grow(&c->work, &c->work_cap, bytes);
}

coll_blk *coll_plan(edl_comm *c, int nb)
{
    return (coll_blk *)grow(&c->plan, &c->plan_cap, (size_t)(nb > 0 ? nb : 1) * sizeof(coll_blk));
}

static uint64_t random64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
        v = (uint64_t)edl_monotonic_ms() * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    return v;
}

static long env_num(const char *name, long dflt, long lo, long hi, int *bad)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (*end || errno || n < lo || n > hi) {
        EDL_ERROR("coll", "%s=%s: expected a whole number in [%ld, %ld]", name, v, lo, hi);
        *bad = 1;
        return dflt;
    }
    return n;
}

/* ---- etcd keys of the generation ----------------------------------------------------------- */

static void stop_watch(edl_comm *c)
{
    if (c->dead_watch)
        edl_watch_close(c->dead_watch);
    c->dead_watch = NULL;
}

static char *gen_key(const edl_comm *c, int64_t gen, const char *name)
{
    return edl_job_key_gen(&c->keys, gen, name);
}

/* A key under gen/<n>/ of the current generation: EDL_GEN_DEAD (1), cpu/<rank> (2, *rank set),
 * anything else (0). */
enum { GEN_OTHER = 0, GEN_DEAD, GEN_CPU };

static int gen_entry(const edl_comm *c, const edl_kv *kv, long *rank)
{
    edl_job_key_info ki;
    if (edl_job_key_parse(&c->keys, kv->key, kv->key_len, &ki) != EDL_KEY_GEN || ki.gen != c->gen)
        return GEN_OTHER;
    if (edl_job_key_is_gen(&ki, c->gen, EDL_GEN_DEAD))
        return GEN_DEAD;
    int r;
    if (!edl_job_key_gen_rank(&ki, c->gen, EDL_GEN_CPU, &r))
        return GEN_OTHER;
    *rank = r;
    return GEN_CPU;
}

/* The dead key appeared: say so (the trainers' reason) in c->err. */
static void note_dead(edl_comm *c, const edl_kv *kv)
{
    coll_set_err(c, "generation %" PRId64 " was declared dead: %.*s", c->gen,
                 (int)(kv->value_len > 300 ? 300 : kv->value_len), kv->value);
}

int coll_dead_announced(edl_comm *c)
{
    if (!c->dead_watch)
        return 0;
    edl_watch_event *ev = NULL;
    int dead = 0;
    long rank;
    while (edl_watch_next(c->dead_watch, &ev, 0) == 0) {
        if (ev->type == EDL_WATCH_PUT && gen_entry(c, &ev->kv, &rank) == GEN_DEAD) {
            note_dead(c, &ev->kv);
            dead = 1;
        } else if (ev->type == EDL_WATCH_ERROR) {
            EDL_WARN("coll", "the watch on generation %" PRId64 "'s dead key stopped (%s); "
                     "peer failures are still detected on the sockets", c->gen,
                     edl_strerror(ev->error));
            edl_watch_event_free(ev);
            stop_watch(c);
            return dead;
        }
        edl_watch_event_free(ev);
    }
    if (dead)
        c->dead_seen = true;
    return dead;
}

static void publish_dead(edl_comm *c, const char *reason)
{
    if (!c->etcd || c->dead_seen || c->size <= 1)
        return;
    c->dead_seen = true;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", c->rank);
    cJSON_AddNumberToObject(o, "pid", (double)getpid());
    cJSON_AddStringToObject(o, "reason", reason);
    char *v = edl_json_print(o, false), *k = gen_key(c, c->gen, EDL_GEN_DEAD);
    cJSON_Delete(o);
    if (v && k) {
        int rc = edl_etcd_put(c->etcd, edl_str(k), edl_str(v), NULL, NULL);
        if (rc)
            EDL_WARN("coll", "could not publish generation %" PRId64 " dead (%s); peers learn "
                     "it from their sockets or timeouts", c->gen, edl_strerror(rc));
    }
    free(v);
    free(k);
}

/* This rank saw its group break and lives on, waiting to re-form: the job server tells the
 * survivors of a dead generation from a silent member (whose agent may have died) by these. */
static void publish_alive(edl_comm *c)
{
    if (!c->etcd || c->size <= 1)
        return;
    char name[32];
    snprintf(name, sizeof name, "%s%d", EDL_GEN_ALIVE, c->rank);
    char *k = gen_key(c, c->gen, name);
    if (k && edl_etcd_put(c->etcd, edl_str(k), edl_str(""), NULL, NULL) != 0)
        EDL_DEBUG("coll", "could not publish %s", k);
    free(k);
}

int coll_fail(edl_comm *c, int rc)
{
    if (c->broken)
        return rc;
    c->broken = true;
    coll_close_peers(c); /* first: the peers learn from their sockets at once */
    EDL_WARN("coll", "rank %d of generation %" PRId64 ": %s (%s); the group must re-form",
             c->rank, c->gen, c->err, edl_strerror(rc));
    publish_dead(c, c->err);
    publish_alive(c);
    return rc;
}

int edl_coll_abort(edl_comm *c, const char *reason)
{
    if (!c)
        return EDL_EINVAL;
    coll_set_err(c, "aborted by the trainer: %s", reason ? reason : "no reason given");
    coll_fail(c, EDL_EPEER);
    return 0;
}

/* ---- the control pipe ------------------------------------------------------------------- */

/* Take every generation line the agent has written (non-blocking). */
static void read_control(edl_comm *c)
{
    if (!c->link || c->agent_gone)
        return;
    for (;;) {
        edl_assignment g;
        int rc = edl_agent_link_poll(c->link, &g);
        if (rc == 1) {
            c->have_next = true;
            c->next_gen = g.generation;
            c->next_rank = g.rank;
            c->next_size = g.world_size;
            continue;
        }
        if (rc < 0) {
            EDL_INFO("coll", "the agent closed the control pipe (%s)", edl_strerror(rc));
            c->agent_gone = true;
        }
        return;
    }
}

static bool superseded(edl_comm *c)
{
    read_control(c);
    return c->have_next && c->next_gen > c->gen;
}

static int control_fd(const edl_comm *c)
{
    return c->link && !c->agent_gone ? edl_agent_link_fd(c->link) : -1;
}

/* ---- rendezvous -------------------------------------------------------------------------- */

typedef struct rdv_entry {
    bool have;
    char ep[320];
    uint64_t token;
    int64_t nccl_gen; /* the generation of the member's live NCCL communicator, or -1 */
    int nccl_rank;    /* its rank in that communicator */
    bool nccl_broken; /* a collective failed on it */
} rdv_entry;

/* Read rank r's rendezvous entry into e (EDL_EPROTO, with c->err, when it is malformed). */
static int parse_entry(edl_comm *c, long r, const edl_kv *kv, rdv_entry *e)
{
    char doc[64];
    snprintf(doc, sizeof doc, "the rendezvous entry of rank %ld", r);
    int rc;
    cJSON *o = edl_json_parse_object(kv->value, kv->value_len, 4096, doc, c->err, sizeof c->err,
                                     &rc);
    if (!o)
        return EDL_EPROTO;
    const char *addr = NULL, *tok = NULL;
    int port = 0;
    int64_t ngen = -1;
    edl_json_reader rd = {o, doc, c->err, sizeof c->err, 0, true};
    edl_json_cstr(&rd, "addr", 255, &addr);
    edl_json_int(&rd, "port", 1, 65535, &port);
    edl_json_cstr(&rd, "token", 16, &tok);
    rd.required = false; /* only a member that holds an NCCL communicator names it */
    edl_json_i64(&rd, "nccl_generation", -1, EDL_GENERATION_MAX, &ngen);
    e->nccl_rank = -1;
    edl_json_int(&rd, "nccl_rank", -1, INT_MAX, &e->nccl_rank);
    edl_json_bool(&rd, "nccl_broken", &e->nccl_broken);
    if (!rd.rc && (strlen(tok) != 16 || strspn(tok, "0123456789abcdef") != 16))
        edl_json_fail(&rd, EDL_EPROTO, "token", "must be 16 lowercase hex digits");
    if (!rd.rc) {
        e->have = true;
        snprintf(e->ep, sizeof e->ep, "%s:%d", addr, port);
        e->token = strtoull(tok, NULL, 16);
        e->nccl_gen = ngen;
    }
    cJSON_Delete(o);
    return rd.rc ? EDL_EPROTO : 0;
}

/* A key of the current generation's rendezvous: 1 = an entry taken, 2 = the dead key, 0 =
 * other (also a rank beyond this generation's size), <0 malformed. */
static int take_kv(edl_comm *c, const edl_kv *kv, rdv_entry *e)
{
    long r = -1;
    switch (gen_entry(c, kv, &r)) {
    case GEN_DEAD:
        note_dead(c, kv);
        return 2;
    case GEN_CPU:
        if (r < 0 || r >= c->size)
            return 0;
        return parse_entry(c, r, kv, &e[r]) == 0 ? 1 : EDL_EPROTO;
    default:
        return 0;
    }
}

static int missing(const rdv_entry *e, int n, char *list, size_t len)
{
    int miss = 0;
    size_t used = 0;
    list[0] = '\0';
    for (int i = 0; i < n; i++)
        if (!e[i].have) {
            if (miss < 16 && used < len)
                used += (size_t)snprintf(list + used, len - used, "%s%d", miss ? "," : "", i);
            miss++;
        }
    return miss;
}

/* Wait for every rank's entry; the watch on gen/<n>/ then stays as the dead-key watch. */
static int await_entries(edl_comm *c, rdv_entry *e, int64_t deadline)
{
    char *prefix = gen_key(c, c->gen, "");
    if (!prefix)
        return EDL_ENOMEM;
    edl_range_opts ro = {.prefix = true};
    edl_range_result res = {0};
    int rc = edl_etcd_range(c->etcd, edl_str(prefix), &ro, &res);
    if (rc) {
        coll_set_err(c, "reading the rendezvous of generation %" PRId64 ": %s", c->gen,
                     edl_etcd_errmsg(c->etcd));
        free(prefix);
        return rc;
    }
    for (size_t i = 0; i < res.n_kvs && rc >= 0; i++) {
        int t = take_kv(c, &res.kvs[i], e);
        rc = t == 2 ? EDL_EPEER : t < 0 ? t : 0;
    }
    edl_watch_opts wo = {.prefix = true, .start_revision = res.revision + 1};
    edl_range_result_clear(&res);
    if (!rc && (rc = edl_watch_open(c->etcd, edl_str(prefix), &wo, &c->dead_watch)))
        coll_set_err(c, "watching the rendezvous of generation %" PRId64 ": %s", c->gen,
                     edl_etcd_errmsg(c->etcd));
    free(prefix);
    int64_t next_log = edl_monotonic_ms() + 10000;
    char list[128];
    while (!rc && missing(e, c->size, list, sizeof list) > 0) {
        if (superseded(c)) {
            coll_set_err(c, "generation %" PRId64 " was superseded by %" PRId64 " during its "
                         "rendezvous", c->gen, c->next_gen);
            return EDL_EPEER;
        }
        int64_t now = edl_monotonic_ms();
        if (now >= deadline) {
            coll_set_err(c, "rendezvous of generation %" PRId64 " timed out after %d ms: no "
                         "entry from rank(s) %s", c->gen, c->rdv_timeout_ms, list);
            return EDL_ETIMEDOUT;
        }
        if (now >= next_log) {
            EDL_INFO("coll", "generation %" PRId64 ": waiting for rank(s) %s to join", c->gen,
                     list);
            next_log = now + 10000;
        }
        struct pollfd pf[2] = {{.fd = edl_watch_fd(c->dead_watch), .events = POLLIN},
                               {.fd = control_fd(c), .events = POLLIN}};
        int64_t left = deadline - now;
        poll(pf, 2, (int)(left > 1000 ? 1000 : left));
        edl_watch_event *ev;
        while (!rc && edl_watch_next(c->dead_watch, &ev, 0) == 0) {
            if (ev->type == EDL_WATCH_PUT) {
                int t = take_kv(c, &ev->kv, e);
                rc = t == 2 ? EDL_EPEER : t < 0 ? t : 0;
            } else if (ev->type == EDL_WATCH_ERROR || ev->type == EDL_WATCH_COMPACTED) {
                coll_set_err(c, "the rendezvous watch of generation %" PRId64 " failed (%s)",
                             c->gen, edl_strerror(ev->error));
                rc = EDL_EUNAVAIL;
            }
            edl_watch_event_free(ev);
        }
        if (rc == EDL_EPEER)
            c->dead_seen = true;
    }
    return rc;
}

static int publish_entry(edl_comm *c, uint64_t token)
{
    char tok[17], name[32], *v = NULL;
    snprintf(tok, sizeof tok, "%016" PRIx64, token);
    snprintf(name, sizeof name, EDL_GEN_CPU "%d", c->rank);
    char *key = gen_key(c, c->gen, name);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "addr", c->listen_addr);
    cJSON_AddNumberToObject(o, "port", c->lport);
    cJSON_AddStringToObject(o, "token", tok);
    cJSON_AddNumberToObject(o, "pid", (double)getpid());
    cJSON_AddNumberToObject(o, "prev_generation", (double)c->prev_gen);
    cJSON_AddNumberToObject(o, "prev_rank", c->prev_rank);
    cJSON_AddNumberToObject(o, "nccl_generation", c->nccl ? (double)c->nccl_gen : -1);
    cJSON_AddNumberToObject(o, "nccl_rank", c->nccl ? c->nccl_rank : -1);
#ifdef EDL_HAVE_NCCL
    cJSON_AddBoolToObject(o, "nccl_broken", coll_nccl_is_broken(c->nccl));
#endif
    v = edl_json_print(o, false);
    cJSON_Delete(o);
    int rc = EDL_ENOMEM;
    if (key && v) {
        rc = edl_etcd_put(c->etcd, edl_str(key), edl_str(v), NULL, NULL);
        if (rc)
            coll_set_err(c, "publishing this rank's endpoint for generation %" PRId64 ": %s",
                         c->gen, edl_etcd_errmsg(c->etcd));
    }
    free(key);
    free(v);
    return rc;
}

#ifdef EDL_HAVE_NCCL
static int kv_put_cb(void *arg, const char *name, const void *value, size_t len)
{
    edl_comm *c = arg;
    if (!c->etcd)
        return 0;
    char *k = gen_key(c, c->gen, name);
    int rc = k ? edl_etcd_put(c->etcd, edl_str(k), edl_bytes(value, len), NULL, NULL)
               : EDL_ENOMEM;
    free(k);
    return rc;
}

static int kv_wait_cb(void *arg, const char *name, char **value, size_t *len, int timeout_ms)
{
    edl_comm *c = arg;
    char *k = gen_key(c, c->gen, name);
    if (!k)
        return EDL_ENOMEM;
    int64_t deadline = edl_monotonic_ms() + timeout_ms;
    int rc;
    for (int attempt = 0;; attempt++) {
        edl_kv *kv = NULL;
        rc = c->etcd ? edl_etcd_get(c->etcd, edl_str(k), &kv, NULL) : EDL_ENOTFOUND;
        if (rc == 0) {
            *value = malloc(kv->value_len + 1);
            if (*value) {
                memcpy(*value, kv->value, kv->value_len);
                (*value)[kv->value_len] = '\0';
                *len = kv->value_len;
            }
            rc = *value ? 0 : EDL_ENOMEM;
            edl_kv_free(kv);
            break;
        }
        if (rc != EDL_ENOTFOUND)
            break;
        if (superseded(c) || coll_dead_announced(c)) {
            rc = EDL_EPEER;
            break;
        }
        if (edl_monotonic_ms() >= deadline) {
            rc = EDL_ETIMEDOUT;
            break;
        }
        usleep((useconds_t)edl_http_backoff_ms(attempt, 2, 16, -1) * 1000); /* 1-2, ... 8-16 ms */
    }
    free(k);
    return rc;
}

static void nccl_waiting(void *arg)
{
    coll_note_wait(arg, -1);
}

static int open_nccl(edl_comm *c, const int *prev_rank)
{
    coll_nccl_ctx ctx = {.rank = c->rank, .size = c->size, .generation = c->gen,
                         .device = c->device, .timeout_ms = c->rdv_timeout_ms,
                         .kv_put = kv_put_cb, .kv_wait = kv_wait_cb, .arg = c,
                         .on_wait = nccl_waiting,
                         .prev_rank = prev_rank};
    coll_nccl *prev = c->nccl;
    c->nccl = NULL;
    int rc = coll_nccl_open(&ctx, prev, &c->nccl, c->err, sizeof c->err);
    if (!rc) {
        c->nccl_gen = c->gen;
        c->nccl_rank = c->rank;
    }
    return rc;
}

/* The table of the fast paths: every member's rank in the NCCL communicator of one earlier
 * generation, the one this process still holds; NULL when someone does not hold it (new, or
 * re-initialised since). With every member at its old rank and nobody gone, coll_nccl_open
 * keeps the communicator, which a failed collective rules out: then NULL too (all init afresh).
 * Every member reads the same entries, so all of them take the same path; coll_nccl_open
 * decides the rest (order kept, same device) the same way everywhere. */
static int *shrink_table(const edl_comm *c, const rdv_entry *e)
{
    if (!c->nccl)
        return NULL;
    bool same = c->size == coll_nccl_size(c->nccl), broken = false;
    for (int i = 0; i < c->size; i++) {
        if (e[i].nccl_gen != c->nccl_gen || e[i].nccl_rank < 0)
            return NULL;
        same = same && e[i].nccl_rank == i;
        broken = broken || e[i].nccl_broken;
    }
    if (same && broken)
        return NULL;
    int *t = malloc(sizeof *t * (size_t)c->size);
    for (int i = 0; t && i < c->size; i++)
        t[i] = e[i].nccl_rank;
    return t;
}
#endif

/* A barrier on the CPU group that also counts the ranks it reached (*sum). */
static int cpu_barrier(edl_comm *c, int32_t *sum)
{
    int32_t one = 1;
    coll_op op = {.kind = COLL_BARRIER, .dt = EDL_INT32, .op = EDL_SUM, .count = 1,
                  .seq = ++c->seq};
    return coll_cpu_allreduce(c, &op, &one, sum);
}

/* "host:port" endpoints with the same host part. */
static bool same_host(const char *a, const char *b)
{
    const char *ca = strrchr(a, ':'), *cb = strrchr(b, ':');
    return ca && cb && ca - a == cb - b && memcmp(a, b, (size_t)(ca - a)) == 0;
}

/* Join generation c->gen as c->rank of c->size. */
static int join(edl_comm *c)
{
    int64_t deadline = edl_monotonic_ms() + c->rdv_timeout_ms;
    c->seq = 0;
    c->broken = false;
    c->dead_seen = false;
    free(c->fds);
    free(c->peer_local);
    free(c->links);
    free(c->addrs);
    c->fds = malloc(sizeof *c->fds * (size_t)c->size);
    c->peer_local = calloc((size_t)c->size, sizeof *c->peer_local);
    c->links = calloc((size_t)c->size, sizeof *c->links);
    c->addrs = calloc((size_t)c->size, sizeof *c->addrs);
    if (!c->fds || !c->peer_local || !c->links || !c->addrs)
        return EDL_ENOMEM;
    for (int i = 0; i < c->size; i++)
        c->fds[i] = -1;
    c->peer_local[c->rank] = true;
    c->local_ranks = 1;
    int rc = 0;
    int *shrink = NULL;
    if (c->etcd && c->size > 1) {
        rdv_entry *e = calloc((size_t)c->size, sizeof *e);
        char **eps = malloc(sizeof *eps * (size_t)c->size);
        uint64_t *tokens = malloc(sizeof *tokens * (size_t)c->size), token = random64();
        rc = e && eps && tokens ? publish_entry(c, token) : EDL_ENOMEM;
        if (!rc)
            rc = await_entries(c, e, deadline);
        if (!rc) {
            for (int i = 0; i < c->size; i++) {
                eps[i] = e[i].ep;
                tokens[i] = e[i].token;
            }
            for (int i = 0; i < c->size; i++)
                if (i != c->rank && same_host(eps[i], eps[c->rank]))
                    c->peer_local[i] = true, c->local_ranks++;
            rc = coll_connect_mesh(c, eps, tokens, token, deadline);
#ifdef EDL_HAVE_NCCL
            if (!rc && strcmp(c->backend, "nccl") == 0)
                shrink = shrink_table(c, e);
#endif
        }
        free(e);
        free(eps);
        free(tokens);
    }
#ifdef EDL_HAVE_NCCL
    if (!rc && strcmp(c->backend, "nccl") == 0)
        rc = open_nccl(c, shrink);
#endif
    free(shrink);
    if (!rc && c->size > 1) /* every link of the mesh, not only those a barrier would use */
        rc = coll_verify_links(c, deadline);
    return rc;
}

/* Join the newest known generation, and the next ones while a join fails; block for the
 * agent's next generation when there is none. first: an initial join that fails for good
 * returns instead of waiting (edl_coll_open). */
static int join_loop(edl_comm *c, bool first)
{
    int64_t waited_since = edl_monotonic_ms(), next_log = waited_since + 10000;
    for (;;) {
        read_control(c);
        if (c->have_next && c->next_gen > c->gen) {
            stop_watch(c);
            coll_close_peers(c); /* with the old size: fds[] belongs to the old generation */
            c->prev_gen = c->gen;
            c->prev_rank = c->rank;
            c->gen = c->next_gen;
            c->rank = c->next_rank;
            c->size = c->next_size;
            c->have_next = false;
            first = false; /* a newer generation: keep going */
        } else if (!first) {
            if (c->agent_gone) {
                coll_set_err(c, "the agent closed the control pipe: no further generation");
                return EDL_EIO;
            }
            int64_t now = edl_monotonic_ms();
            if (now >= next_log) {
                EDL_INFO("coll", "waiting for a generation after %" PRId64 " (%lld s)", c->gen,
                         (long long)((now - waited_since) / 1000));
                next_log = now + 10000;
            }
            struct pollfd pf = {.fd = control_fd(c), .events = POLLIN};
            if (pf.fd < 0) {
                coll_set_err(c, "generation %" PRId64 " broke and there is no agent to announce "
                             "the next one", c->gen);
                return EDL_EPEER;
            }
            poll(&pf, 1, 1000);
            continue;
        }
        int64_t t0 = edl_monotonic_ms();
        int rc = join(c);
        if (rc == 0) {
            EDL_INFO("coll", "generation %" PRId64 ": rank %d of %d joined in %lld ms (%s)",
                     c->gen, c->rank, c->size, (long long)(edl_monotonic_ms() - t0), c->backend);
            return 0;
        }
        EDL_WARN("coll", "generation %" PRId64 ": joining failed: %s", c->gen, c->err);
        coll_close_peers(c);
        if (rc == EDL_ENOMEM || rc == EDL_ECONFIG || rc == EDL_EAUTH) /* no retry helps */
            return rc;
        publish_dead(c, c->err);
        c->broken = true;
        if (first && rc != EDL_EPEER)
            return rc;
        first = false;
    }
}

/* ---- life cycle ------------------------------------------------------------------------- */

static int configure(edl_comm *c, const edl_coll_options *o)
{
    int bad = 0;
    const char *b = o && o->backend ? o->backend : getenv("EDL_COLL_BACKEND");
    if (!b || !*b)
        b = "cpu";
    if (strcmp(b, "cpu") != 0 && strcmp(b, "nccl") != 0) {
        EDL_ERROR("coll", "unknown collective back end '%s' (use cpu or nccl)", b);
        return EDL_ECONFIG;
    }
#ifndef EDL_HAVE_NCCL
    if (strcmp(b, "nccl") == 0) {
        EDL_ERROR("coll", "the nccl back end was not built (CMake did not find CUDA and NCCL)");
        return EDL_ECONFIG;
    }
#else
    if (strcmp(b, "nccl") == 0 && !coll_nccl_usable()) {
        EDL_ERROR("coll", "the nccl back end needs a CUDA device, and none can be used here "
                  "(use EDL_COLL_BACKEND=cpu)");
        return EDL_ECONFIG;
    }
#endif
    snprintf(c->backend, sizeof c->backend, "%s", b);
    c->timeout_ms = o && o->timeout_ms > 0
                        ? o->timeout_ms
                        : (int)env_num("EDL_COLL_TIMEOUT_MS", 30000, 1, INT_MAX / 2, &bad);
    c->rdv_timeout_ms =
        o && o->rendezvous_timeout_ms > 0
            ? o->rendezvous_timeout_ms
            : (int)env_num("EDL_COLL_RENDEZVOUS_TIMEOUT_MS", 60000, 1, INT_MAX / 2, &bad);
    c->device = o && o->device >= 0 ? o->device : (int)env_num("LOCAL_RANK", 0, 0, 1024, &bad);
    c->seg_bytes = (size_t)env_num("EDL_COLL_SEGMENT_BYTES", 512 << 10, 64, 64 << 20, &bad);
    c->small_bytes = (size_t)env_num("EDL_COLL_SMALL_BYTES", 256 << 10, 0, 64 << 20, &bad);
    c->block_bytes = (size_t)env_num("EDL_COLL_BLOCK_BYTES",
                                     (long)coll_default_block(coll_host_get()), 8, 1 << 30, &bad);
    c->io_bytes = (size_t)env_num("EDL_COLL_IO_BYTES", 4 << 20, 64, 1 << 30, &bad);
    c->window_bytes = (size_t)env_num("EDL_COLL_WINDOW_BYTES", 0, 0, 1 << 30, &bad);
    const char *addr = getenv("EDL_COLL_ADDR"), *cur = getenv("PADDLE_CURRENT_ENDPOINT");
    if (addr && *addr)
        snprintf(c->listen_addr, sizeof c->listen_addr, "%s", addr);
    else if (cur && strrchr(cur, ':') && strrchr(cur, ':') != cur)
        snprintf(c->listen_addr, sizeof c->listen_addr, "%.*s",
                 (int)(strrchr(cur, ':') - cur), cur);
    else
        snprintf(c->listen_addr, sizeof c->listen_addr, "127.0.0.1");
    return bad ? EDL_ECONFIG : 0;
}

/* The job secret, if the environment names one: a group of more than one rank needs it
 * (coll_connect_mesh says so); a named secret that cannot be used is an error at once. */
static int load_secret(edl_comm *c)
{
    char why[512];
    int rc = edl_job_secret_load(&c->secret, why, sizeof why);
    if (rc == EDL_ENOTFOUND)
        return 0;
    if (rc)
        EDL_ERROR("coll", "%s", why);
    return rc;
}

/* A trainer the agent started ahead of its pod's membership (EDL_GENERATION=0, the control
 * pipe open) waits here for its first assignment; the link then holds it. */
static int first_assignment(edl_agent_link *l)
{
    if (edl_agent_link_generation(l) > 0 || edl_agent_link_fd(l) < 0)
        return 0;
    EDL_INFO("coll", "started ahead of membership: waiting for the first generation");
    edl_agent_link_report_ready(l);
    for (;;) {
        edl_assignment a;
        int rc = edl_agent_link_poll(l, &a);
        if (rc != 0)
            return rc < 0 ? rc : 0;
        struct pollfd pf = {edl_agent_link_fd(l), POLLIN, 0};
        if (poll(&pf, 1, 1000) < 0 && errno != EINTR)
            return EDL_EIO;
    }
}

int edl_coll_open(const edl_coll_options *opts, edl_comm **out)
{
    if (!out)
        return EDL_EINVAL;
    *out = NULL;
    edl_comm *c = calloc(1, sizeof *c);
    if (!c)
        return EDL_ENOMEM;
    c->lfd = -1;
    c->prev_gen = -1;
    c->prev_rank = -1;
    c->nccl_gen = -1;
    c->nccl_rank = -1;
    edl_job_secret_init(&c->secret);
    int rc = configure(c, opts);
    if (!rc)
        rc = load_secret(c);
    if (!rc && opts && opts->link) {
        c->link = opts->link;
    } else if (!rc) {
        rc = edl_agent_link_open(&c->link);
        c->own_link = rc == 0;
    }
    if (!rc)
        rc = first_assignment(c->link);
    if (rc) {
        edl_coll_close(c);
        return rc;
    }
    c->gen = edl_agent_link_generation(c->link);
    c->rank = edl_agent_link_rank(c->link);
    c->size = edl_agent_link_world_size(c->link);
    const char *eps = getenv("EDL_ETCD_ENDPOINTS");
    if (eps && *eps) {
        const char *job = getenv("EDL_JOB_ID"), *prefix = getenv("EDL_ETCD_PREFIX");
        if (!job || !*job || strchr(job, '/')) {
            EDL_ERROR("coll", "EDL_ETCD_ENDPOINTS is set but EDL_JOB_ID is %s",
                      job && *job ? "not a valid job name" : "not");
            rc = EDL_ECONFIG;
        } else if (c->size < 1 || c->rank < 0 || c->rank >= c->size) {
            EDL_ERROR("coll", "EDL_RANK=%d is not within EDL_WORLD_SIZE=%d", c->rank, c->size);
            rc = EDL_ECONFIG;
        } else {
            char err[600] = "";
            rc = edl_job_keys_init(&c->keys, prefix && *prefix ? prefix : NULL, job);
            if (!rc)
                rc = edl_etcd_open_env(&c->etcd, err, sizeof err); /* the agent's TLS and auth */
            if (rc)
                EDL_ERROR("coll", "cannot use etcd at %s: %s", eps, err[0] ? err : edl_strerror(rc));
        }
    } else {
        c->rank = 0; /* no rendezvous possible: a group of one */
        c->size = 1;
    }
    if (!rc && c->etcd)
        rc = coll_listen(c);
    if (!rc) {
        c->have_next = true; /* the generation from the environment */
        c->next_gen = c->gen;
        c->next_rank = c->rank;
        c->next_size = c->size;
        c->gen = -1;
        rc = join_loop(c, true);
    }
    if (rc) {
        if (c->err[0])
            EDL_ERROR("coll", "%s", c->err);
        edl_coll_close(c);
        return rc;
    }
    c->first_check = true;
    *out = c;
    return 0;
}

void edl_coll_close(edl_comm *c)
{
    if (!c)
        return;
#ifdef EDL_HAVE_NCCL
    coll_nccl_abort(c->nccl);
#endif
    stop_watch(c);
    coll_close_peers(c);
    if (c->lfd >= 0)
        close(c->lfd);
    edl_etcd_close(c->etcd);
    if (c->own_link)
        edl_agent_link_close(c->link);
    free(c->fds);
    free(c->peer_local);
    free(c->links);
    free(c->addrs);
    edl_job_secret_clear(&c->secret);
    edl_job_keys_clear(&c->keys);
    free(c->stage);
    free(c->work);
    free(c->plan);
    free(c);
}

int edl_coll_rank(const edl_comm *c) { return c ? c->rank : -1; }
int edl_coll_size(const edl_comm *c) { return c ? c->size : 0; }
int64_t edl_coll_generation(const edl_comm *c) { return c ? c->gen : -1; }
const char *edl_coll_backend(const edl_comm *c) { return c ? c->backend : "none"; }
edl_agent_link *edl_coll_agent_link(edl_comm *c) { return c ? c->link : NULL; }
const char *edl_coll_errmsg(const edl_comm *c) { return c ? c->err : "no communicator"; }

int edl_coll_check(edl_comm *c)
{
    if (!c)
        return EDL_EINVAL;
    if (c->first_check) { /* every rank syncs once at the start: a newcomer gets the state */
        c->first_check = false;
        return EDL_COLL_REFORMED;
    }
    if (!c->etcd)
        return 0;
    read_control(c);
    bool newer = c->have_next && c->next_gen > c->gen;
    if (!c->broken && !newer && coll_dead_announced(c)) {
        EDL_WARN("coll", "%s", c->err);
        c->broken = true;
        coll_close_peers(c);
    }
    if (!c->broken && !newer)
        return c->agent_gone ? EDL_EIO : 0;
    int rc = join_loop(c, false);
    return rc ? rc : EDL_COLL_REFORMED;
}

/* ---- collectives ------------------------------------------------------------------------ */

/* The arguments of a collective, checked before anything is sent (EDL_EINVAL, c->err set). */
static int check_args(edl_comm *c, enum coll_kind kind, const void *send, const void *recv,
                      size_t count, edl_dtype dt, edl_redop op, int root)
{
    size_t es = edl_dtype_size(dt);
    const char *what = kind == COLL_BROADCAST ? "broadcast" : kind == COLL_ALLGATHER ? "allgather"
                       : kind == COLL_REDUCE_SCATTER ? "reduce_scatter" : "allreduce";
    if (!es) {
        coll_set_err(c, "%s: unknown data type %d", what, (int)dt);
        return EDL_EINVAL;
    }
    if ((unsigned)op > EDL_MAX) {
        coll_set_err(c, "%s: unknown reduction %d", what, (int)op);
        return EDL_EINVAL;
    }
    if (dt == EDL_UINT8 && (kind == COLL_ALLREDUCE || kind == COLL_REDUCE_SCATTER)) {
        coll_set_err(c, "%s: uint8 is for broadcast and allgather only", what);
        return EDL_EINVAL;
    }
    if (kind == COLL_BROADCAST && (root < 0 || root >= c->size)) {
        coll_set_err(c, "broadcast: root %d is not a rank of this generation (size %d)", root,
                     c->size);
        return EDL_EINVAL;
    }
    if (count > (SIZE_MAX / 4) / es / (size_t)c->size || count > ((uint64_t)1 << 40)) {
        coll_set_err(c, "%s: count %zu is too large", what, count);
        return EDL_EINVAL;
    }
    if (count && (!recv || (!send && kind != COLL_BROADCAST))) {
        coll_set_err(c, "%s: NULL buffer for %zu elements", what, count);
        return EDL_EINVAL;
    }
    return 0;
}

void coll_note_wait(edl_comm *c, int peer)
{
    if (c->wait_reported || !c->link || !c->call_start_ms)
        return; /* reported already, no agent, or not in a call (the join has its deadline) */
    int64_t waited = edl_monotonic_ms() - c->call_start_ms;
    if (waited < COLL_WAIT_REPORT_MS)
        return;
    char what[EDL_PROGRESS_WHAT_MAX + 1], on[32] = "";
    if (peer >= 0)
        snprintf(on, sizeof on, ", waiting on rank %d", peer);
    snprintf(what, sizeof what, "%s #%" PRIu64 " of generation %" PRId64 "%s",
             coll_kind_name(c->call_kind), c->seq, c->gen, on);
    edl_agent_link_report_blocked(c->link, waited, what);
    c->wait_reported = true;
}

/* Every collective starts and ends here: the agent learns of long waits (coll_note_wait). */
static void begin_call(edl_comm *c, enum coll_kind kind)
{
    c->call_start_ms = edl_monotonic_ms();
    c->call_kind = kind;
    c->wait_reported = false;
}

static int end_call(edl_comm *c, int rc)
{
    c->call_start_ms = 0;
    if (c->wait_reported) {
        edl_agent_link_report_unblocked(c->link);
        c->wait_reported = false;
    }
    return rc;
}

static int run_call(edl_comm *c, enum coll_kind kind, const void *send, void *recv,
                    size_t count, edl_dtype dt, edl_redop op, int root);

static int run(edl_comm *c, enum coll_kind kind, const void *send, void *recv, size_t count,
               edl_dtype dt, edl_redop op, int root)
{
    if (!c)
        return EDL_EINVAL;
    begin_call(c, kind);
    return end_call(c, run_call(c, kind, send, recv, count, dt, op, root));
}

static int run_call(edl_comm *c, enum coll_kind kind, const void *send, void *recv,
                    size_t count, edl_dtype dt, edl_redop op, int root)
{
    if (!c)
        return EDL_EINVAL;
    if (kind == COLL_BROADCAST && c->rank == root && !send)
        send = recv; /* the root broadcasts in place */
    int rc = check_args(c, kind, send, recv, count, dt, op, root);
    if (rc)
        return rc;
    if (c->broken) {
        coll_set_err(c, "the communicator of generation %" PRId64 " is broken; call "
                     "edl_coll_check() to re-form it", c->gen);
        return EDL_EPEER;
    }
    coll_op o = {.kind = kind, .dt = dt, .op = op, .count = count, .root = root, .seq = ++c->seq};
#ifdef EDL_HAVE_NCCL
    if (c->nccl) {
        switch (kind) {
        case COLL_BROADCAST:
            rc = coll_nccl_broadcast(c->nccl, send, recv, count, dt, root, c->timeout_ms, c->err,
                                     sizeof c->err);
            break;
        case COLL_ALLGATHER:
            rc = coll_nccl_allgather(c->nccl, send, recv, count, dt, c->timeout_ms, c->err,
                                     sizeof c->err);
            break;
        case COLL_REDUCE_SCATTER:
            rc = coll_nccl_reduce_scatter(c->nccl, send, recv, count, dt, op, c->timeout_ms,
                                          c->err, sizeof c->err);
            break;
        default:
            rc = coll_nccl_allreduce(c->nccl, send, recv, count, dt, op, c->timeout_ms, c->err,
                                     sizeof c->err);
        }
        return rc && rc != EDL_EINVAL ? coll_fail(c, rc) : rc;
    }
#endif
    switch (kind) {
    case COLL_BROADCAST: rc = coll_cpu_broadcast(c, &o, send, recv); break;
    case COLL_ALLGATHER: rc = coll_cpu_allgather(c, &o, send, recv); break;
    case COLL_REDUCE_SCATTER: rc = coll_cpu_reduce_scatter(c, &o, send, recv); break;
    default: rc = coll_cpu_allreduce(c, &o, send, recv);
    }
    if (rc == EDL_ENOMEM)
        coll_set_err(c, "out of memory for work buffers");
    return rc && rc != EDL_EINVAL ? coll_fail(c, rc) : rc;
}

int edl_allreduce(edl_comm *c, const void *send, void *recv, size_t count, edl_dtype dt,
                  edl_redop op)
{
    return run(c, COLL_ALLREDUCE, send, recv, count, dt, op, 0);
}

int edl_broadcast(edl_comm *c, const void *send, void *recv, size_t count, edl_dtype dt, int root)
{
    return run(c, COLL_BROADCAST, send, recv, count, dt, EDL_SUM, root);
}

int edl_allgather(edl_comm *c, const void *send, void *recv, size_t count, edl_dtype dt)
{
    return run(c, COLL_ALLGATHER, send, recv, count, dt, EDL_SUM, 0);
}

int edl_reduce_scatter(edl_comm *c, const void *send, void *recv, size_t count, edl_dtype dt,
                       edl_redop op)
{
    return run(c, COLL_REDUCE_SCATTER, send, recv, count, dt, op, 0);
}

int edl_barrier(edl_comm *c)
{
    if (!c)
        return EDL_EINVAL;
    if (c->broken) {
        coll_set_err(c, "the communicator is broken; call edl_coll_check() to re-form it");
        return EDL_EPEER;
    }
    int32_t sum;
    begin_call(c, COLL_BARRIER);
    int rc = cpu_barrier(c, &sum);
    return end_call(c, rc ? coll_fail(c, rc) : 0);
}

/* The CPU group, for state.c (host buffers even under NCCL). */
int coll_cpu_allreduce_host(edl_comm *c, const void *send, void *recv, size_t count,
                            edl_dtype dt, edl_redop op)
{
    if (c->broken)
        return EDL_EPEER;
    coll_op o = {.kind = COLL_ALLREDUCE, .dt = dt, .op = op, .count = count, .seq = ++c->seq};
    begin_call(c, COLL_ALLREDUCE);
    int rc = coll_cpu_allreduce(c, &o, send, recv);
    return end_call(c, rc ? coll_fail(c, rc) : 0);
}

int coll_cpu_broadcast_host(edl_comm *c, void *buf, size_t bytes, int root)
{
    if (c->broken)
        return EDL_EPEER;
    coll_op o = {.kind = COLL_BROADCAST, .dt = EDL_UINT8, .count = bytes, .root = root,
                 .seq = ++c->seq};
    begin_call(c, COLL_BROADCAST);
    int rc = coll_cpu_broadcast(c, &o, buf, buf);
    return end_call(c, rc ? coll_fail(c, rc) : 0);
}

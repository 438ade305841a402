/* trainer.c: the update modes on the trainer's side (edl_ps_trainer, see ps.h). In async and
 * half_async a sparse push is appended to a log; the sender folds the logs into the merge
 * buffers. The buffers that merge gradients and the GEO local copies are tables of table.c
 * kept here: a merge buffer is an SGD table with lr -1 and zero rows (a push adds), a GEO copy
 * a table whose rows hold the local copy, the synced copy and a mark: touched since the sync.
 * The client is used by one thread at a time (client_mu). The async sender has a client of its
 * own (ps_client_clone), so the caller's pulls do not wait for its pushes; without one (it
 * could not connect) the two take turns on the caller's. A CTR table's buffers are as wide as
 * its pushes (show, click, gradients: ps_sum_config); GEO refuses CTR tables. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/log.h"
#include "edl/wire.h"
#include "internal.h"

#define SEND_CHUNK 65536 /* rows of one push of a merge buffer */
#define LOG_MAX (1u << 18) /* keys a table's log holds before the pushing thread folds it */

/* Sparse pushes of async and half_async, as they came (keys, then width floats a key): the
 * pushing thread only appends; the sender folds them into the merge buffer (a hash, the costly
 * part) on its own thread. */
typedef struct push_log {
    uint64_t *keys;
    float *vals;
    size_t n, cap;
} push_log;

struct edl_ps_trainer {
    edl_ps_client *c;
    edl_ps_client *sc; /* async: the sender's own client (NULL: it shares c, under client_mu) */
    ps_prefetch *pf;   /* async: pulls ahead (NULL: none) */
    edl_ps_trainer_options o;
    uint64_t token, step;
    pthread_mutex_t client_mu;
    pthread_mutex_t mu; /* merge buffers, the sender's state, the half_async barrier */
    pthread_cond_t cv;
    ps_table *merge[EDL_PS_MAX_TABLES], *spare[EDL_PS_MAX_TABLES]; /* spare: sent, emptied */
    push_log logs[2][EDL_PS_MAX_TABLES]; /* logs[cur]: appended to (under mu), with merge[] */
    int cur;
    bool queued, sending, stop, has_sender;
    pthread_t sender;
    int send_rc;
    uint64_t round;
    int arrived;
    ps_table *local[EDL_PS_MAX_TABLES]; /* geo */
    char err[1024];
};

int edl_ps_mode_parse(const char *s, edl_ps_mode *out)
{
    static const struct { const char *name; edl_ps_mode m; } names[] = {
        {"sync", EDL_PS_MODE_SYNC}, {"async", EDL_PS_MODE_ASYNC},
        {"half_async", EDL_PS_MODE_HALF_ASYNC}, {"half-async", EDL_PS_MODE_HALF_ASYNC},
        {"geo", EDL_PS_MODE_GEO}};
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) {
            *out = names[i].m;
            return 0;
        }
    return EDL_EINVAL;
}

const char *edl_ps_mode_name(edl_ps_mode m)
{
    switch (m) {
    case EDL_PS_MODE_SYNC: return "sync";
    case EDL_PS_MODE_ASYNC: return "async";
    case EDL_PS_MODE_HALF_ASYNC: return "half_async";
    case EDL_PS_MODE_GEO: return "geo";
    }
    return "unknown";
}

const char *edl_ps_trainer_errmsg(const edl_ps_trainer *t)
{
    return t ? t->err : "no trainer";
}

/* A call's outcome on client c: its message kept on failure. */
static int took_from(edl_ps_trainer *t, const edl_ps_client *c, int rc)
{
    if (rc)
        snprintf(t->err, sizeof t->err, "%s", edl_ps_client_errmsg(c));
    return rc;
}

static int took(edl_ps_trainer *t, int rc)
{
    return took_from(t, t->c, rc);
}

static const edl_ps_table_config *table_of(edl_ps_trainer *t, uint32_t table)
{
    const edl_ps_table_config *cfg = ps_client_table(t->c, table);
    if (!cfg)
        snprintf(t->err, sizeof t->err, "table %u: create it on the client first", table);
    return cfg;
}

/* A table of table.c shaped like `table`'s pushes (CTR: show, click, gradients), its rows
 * `width` times as wide plus `extra` floats: a merge buffer (1, 0), or a GEO local copy (2, 1:
 * local, synced, touched since the sync). A push adds. */
static ps_table *own_table(edl_ps_trainer *t, uint32_t table, uint32_t width, uint32_t extra)
{
    const edl_ps_table_config *cfg = table_of(t, table);
    if (!cfg)
        return NULL;
    edl_ps_table_config c;
    ps_sum_config(cfg, &c);
    c.dim = c.dim * width + extra;
    c.shards = 1; /* one owner at a time (t->mu, or the trainer's thread): one lock a call */
    ps_table *own = NULL;
    if (ps_table_new(&c, &own) != 0)
        snprintf(t->err, sizeof t->err, "out of memory for table %u's buffer", table);
    return own;
}

/* ---- sending a buffer of summed gradients ----------------------------------------------------- */

typedef struct gather {
    edl_ps_trainer *t;
    edl_ps_client *c; /* the client that sends */
    uint32_t table, dim;
    uint64_t *keys, start; /* start: dense, the run's first element */
    float *vals;
    size_t n, cap;
    const ps_call_mode *mode;
    int rc;
} gather;

static int gather_push(gather *g)
{
    int rc = 0;
    if (g->n && !g->keys)
        rc = ps_client_push_dense_mode(g->c, g->table, g->start, g->n, g->vals, g->mode);
    else if (g->n)
        rc = ps_client_push_sparse_mode(g->c, g->table, g->keys, g->n, g->vals, g->mode);
    g->n = 0;
    return took_from(g->t, g->c, rc);
}

static int gather_room(gather *g, size_t more, bool keys)
{
    if (g->n + more <= g->cap)
        return 0;
    size_t cap = g->cap ? g->cap : 1024;
    while (cap < g->n + more)
        cap *= 2;
    float *v = realloc(g->vals, cap * g->dim * sizeof *v);
    if (v)
        g->vals = v;
    uint64_t *k = keys && v ? realloc(g->keys, cap * sizeof *k) : NULL;
    if (k)
        g->keys = k;
    if (!v || (keys && !k))
        return EDL_ENOMEM;
    g->cap = cap;
    return 0;
}

/* foreach callback: sparse rows go out SEND_CHUNK at a time; dense runs while contiguous. */
static int gather_rows(void *arg, const uint64_t *keys, uint64_t start, float *rows, size_t n,
                       size_t stride)
{
    gather *g = arg;
    int rc;
    if (!keys && g->n && g->start + g->n != start && (rc = gather_push(g)))
        return rc;
    if (!keys && !g->n)
        g->start = start;
    if (gather_room(g, n, keys != NULL)) {
        snprintf(g->t->err, sizeof g->t->err, "out of memory sending table %u", g->table);
        return EDL_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        if (keys)
            g->keys[g->n] = keys[i];
        memcpy(g->vals + g->n++ * g->dim, rows + i * stride, g->dim * sizeof *rows);
        if (keys && g->n == SEND_CHUNK && (rc = gather_push(g)))
            return rc;
    }
    return 0;
}

/* Every row of buf through fn (which gathers into g) into pushes; frees g's arrays. */
static int send_table(ps_table *buf, ps_rows_fn fn, void *fn_arg, gather *g)
{
    int rc = ps_table_foreach(buf, fn, fn_arg);
    if (rc == 0)
        rc = gather_push(g);
    free(g->keys);
    free(g->vals);
    return rc;
}

/* Send merge buffers taken from the trainer and empty them: on the sender's own client, or on
 * the caller's under client_mu. */
static int send_merged(edl_ps_trainer *t, ps_table **bufs)
{
    static const ps_call_mode plain = {0};
    edl_ps_client *c = t->sc ? t->sc : t->c;
    int rc = 0;
    if (!t->sc)
        pthread_mutex_lock(&t->client_mu);
    for (uint32_t i = 0; i < EDL_PS_MAX_TABLES; i++) {
        gather g = {.t = t, .c = c, .table = i, .mode = &plain};
        const edl_ps_table_config *cfg = bufs[i] ? ps_client_table(t->c, i) : NULL;
        if (bufs[i] && rc == 0 && t->sc && (rc = ps_client_know_table(c, i, cfg)) != 0)
            snprintf(t->err, sizeof t->err, "out of memory for table %u's map", i);
        if (bufs[i] && rc == 0) {
            g.dim = ps_push_width(cfg);
            rc = send_table(bufs[i], gather_rows, &g, &g);
        }
        if (bufs[i])
            ps_table_reset(bufs[i]);
    }
    if (!t->sc)
        pthread_mutex_unlock(&t->client_mu);
    return rc;
}

/* ---- async: the sender thread ---------------------------------------------------------------- */

/* The log's pushes into buf (its merge buffer), summed per key; the log emptied. */
static int fold(ps_table *buf, push_log *lg)
{
    int rc = lg->n ? ps_table_push_sparse(buf, (const uint8_t *)lg->keys, (uint32_t)lg->n,
                                          (const uint8_t *)lg->vals, NULL) : 0;
    lg->n = 0;
    return rc;
}

static int log_append(push_log *lg, const uint64_t *keys, size_t n, const float *vals,
                      size_t width)
{
    if (lg->n + n > lg->cap) {
        size_t cap = lg->cap ? 2 * lg->cap : 4096;
        while (cap < lg->n + n)
            cap *= 2;
        uint64_t *k = realloc(lg->keys, cap * sizeof *k);
        if (k)
            lg->keys = k;
        float *v = k ? realloc(lg->vals, cap * width * sizeof *v) : NULL;
        if (v)
            lg->vals = v;
        if (!k || !v)
            return EDL_ENOMEM;
        lg->cap = cap;
    }
    memcpy(lg->keys + lg->n, keys, n * sizeof *keys);
    memcpy(lg->vals + lg->n * width, vals, n * width * sizeof *vals);
    lg->n += n;
    return 0;
}

/* Send what is queued: called, and returns, with t->mu held (released while folding the logs
 * and sending). The buffers sent are emptied and kept as the spares for the round after next. */
static int send_queued(edl_ps_trainer *t)
{
    ps_table *bufs[EDL_PS_MAX_TABLES];
    push_log *logs = t->logs[t->cur];
    memcpy(bufs, t->merge, sizeof bufs);
    memcpy(t->merge, t->spare, sizeof bufs);
    memset(t->spare, 0, sizeof t->spare);
    t->cur ^= 1;
    t->queued = false;
    t->sending = true;
    pthread_mutex_unlock(&t->mu);
    int rc = 0;
    for (int i = 0; i < EDL_PS_MAX_TABLES; i++)
        if (bufs[i] && rc == 0 && (rc = fold(bufs[i], &logs[i])) != 0)
            snprintf(t->err, sizeof t->err, "out of memory merging table %d's pushes", i);
    if (rc == 0)
        rc = send_merged(t, bufs);
    pthread_mutex_lock(&t->mu);
    memcpy(t->spare, bufs, sizeof bufs);
    t->sending = false;
    t->send_rc = t->send_rc ? t->send_rc : rc;
    pthread_cond_broadcast(&t->cv);
    return rc;
}

static void *sender_main(void *arg)
{
    edl_ps_trainer *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->stop && !t->queued)
            pthread_cond_wait(&t->cv, &t->mu);
        if (!t->queued)
            break;
        send_queued(t);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* Add gradients to the merge buffer of `table`. */
static int merge_push(edl_ps_trainer *t, uint32_t table, const uint64_t *keys, size_t n,
                      uint64_t off, const float *grads)
{
    const edl_ps_table_config *cfg = table_of(t, table);
    if (!cfg)
        return EDL_EINVAL;
    pthread_mutex_lock(&t->mu);
    int rc = t->send_rc;
    push_log *lg = &t->logs[t->cur][table];
    if (rc == 0 && !t->merge[table] && !(t->merge[table] = own_table(t, table, 1, 0)))
        rc = EDL_ENOMEM;
    if (rc == 0 && keys && lg->n + n > LOG_MAX) /* the sender is behind: fold here */
        rc = fold(t->merge[table], lg);
    if (rc == 0 && keys && n > LOG_MAX)
        rc = ps_table_push_sparse(t->merge[table], (const uint8_t *)keys, (uint32_t)n,
                                  (const uint8_t *)grads, NULL);
    else if (rc == 0 && keys)
        rc = log_append(lg, keys, n, grads, ps_push_width(cfg));
    else if (rc == 0)
        rc = ps_table_push_dense(t->merge[table], off, n, (const uint8_t *)grads, NULL);
    if (rc == 0) {
        t->queued = true;
        pthread_cond_broadcast(&t->cv);
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* ---- half_async: the threads' barrier -------------------------------------------------------- */

static int half_async_step(edl_ps_trainer *t)
{
    pthread_mutex_lock(&t->mu);
    uint64_t round = t->round;
    if (++t->arrived < t->o.threads) {
        while (t->round == round)
            pthread_cond_wait(&t->cv, &t->mu);
    } else {
        send_queued(t);
        t->arrived = 0;
        t->round++;
        pthread_cond_broadcast(&t->cv);
    }
    int rc = t->send_rc;
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* ---- sync -------------------------------------------------------------------------------------- */

static ps_call_mode sync_mode(const edl_ps_trainer *t)
{
    ps_call_mode m = {.flags = PS_F_SYNC, .len = PS_SYNC_PREFIX};
    edl_put64(m.prefix, t->token);
    edl_put64(m.prefix + 8, t->step);
    return m;
}

static uint32_t trainer_count(void *arg)
{
    edl_ps_trainer *t = arg;
    pthread_mutex_lock(&t->mu);
    uint32_t n = (uint32_t)t->o.trainers;
    pthread_mutex_unlock(&t->mu);
    return n;
}

/* Wait at the barrier of `step` until every server has applied it. The client is held for the
 * whole wait: in sync mode only this thread uses it. */
static int sync_barrier(edl_ps_trainer *t, uint64_t step, uint64_t *done)
{
    pthread_mutex_lock(&t->client_mu);
    ps_arrival who = {t->token, t->o.generation};
    int rc = took(t, ps_client_wait_barrier(t->c, PS_SPACE_STEPS, &who, step, trainer_count, t,
                                            done));
    pthread_mutex_unlock(&t->client_mu);
    return rc;
}

/* ---- geo --------------------------------------------------------------------------------------- */

/* A sparse table GEO can train: not CTR (its local copies are plain rows). */
static const edl_ps_table_config *geo_table(edl_ps_trainer *t, uint32_t table)
{
    const edl_ps_table_config *cfg = table_of(t, table);
    if (cfg && cfg->accessor == EDL_PS_ACCESSOR_CTR) {
        snprintf(t->err, sizeof t->err, "table %u has the CTR accessor: geo mode trains local "
                 "copies of plain rows and keeps no show/click statistics (use sync, async or "
                 "half_async)", table);
        return NULL;
    }
    return cfg;
}

/* The local rows of keys (fetched from the servers, local = synced = theirs, when new). */
static int geo_rows(edl_ps_trainer *t, uint32_t table, const uint64_t *keys, size_t n)
{
    const edl_ps_table_config *cfg = geo_table(t, table);
    if (!cfg)
        return EDL_EINVAL;
    if (!t->local[table] && !(t->local[table] = own_table(t, table, 2, 1)))
        return EDL_ENOMEM;
    size_t dim = cfg->dim, nm = 0;
    uint64_t *miss = malloc((n ? n : 1) * sizeof *miss);
    float *rows = malloc((n ? n : 1) * dim * sizeof *rows);
    int rc = miss && rows ? 0 : EDL_ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (!ps_table_row(t->local[table], keys[i], false))
            miss[nm++] = keys[i];
    if (rc == 0 && nm)
        rc = took(t, edl_ps_pull_sparse(t->c, table, miss, nm, rows));
    for (size_t i = 0; rc == 0 && i < nm; i++) {
        if (ps_table_row(t->local[table], miss[i], false))
            continue; /* a key repeated in the call: its row came with its first place */
        float *row = ps_table_row(t->local[table], miss[i], true);
        if (!row) {
            rc = EDL_ENOMEM;
            break;
        }
        memcpy(row, rows + i * dim, dim * sizeof *row);
        memcpy(row + dim, rows + i * dim, dim * sizeof *row);
        row[2 * dim] = 0;
    }
    free(miss);
    free(rows);
    return rc;
}

typedef struct geo_ctx {
    edl_ps_trainer *t;
    uint32_t dim;
    gather *g;
    ps_table *local;
} geo_ctx;

/* foreach callback: the delta (local - synced) / trainers of every row touched since the last
 * sync, added to the synced copy and gathered for the push. The rest of a row's change stays
 * local until the row is touched again (so a row is sent once per sync in which it trained). */
static int geo_deltas(void *arg, const uint64_t *keys, uint64_t start, float *rows, size_t n,
                      size_t stride)
{
    (void)start;
    geo_ctx *x = arg;
    float inv = 1.0f / (float)x->t->o.trainers, delta[EDL_PS_MAX_DIM];
    for (size_t i = 0; i < n; i++) {
        float *local = rows + i * stride, *synced = local + x->dim, *touched = synced + x->dim;
        bool changed = false;
        if (!*touched)
            continue;
        *touched = 0;
        for (uint32_t j = 0; j < x->dim; j++) {
            delta[j] = (local[j] - synced[j]) * inv;
            changed |= delta[j] != 0;
        }
        if (!changed)
            continue;
        for (uint32_t j = 0; j < x->dim; j++)
            synced[j] += delta[j];
        int rc = gather_rows(x->g, keys + i, 0, delta, 1, x->dim);
        if (rc)
            return rc;
    }
    return 0;
}

/* A row another trainer changed: local moves by (server - synced), computed as server plus
 * this trainer's own change since the sync, so that a row it did not change becomes exactly
 * the server's (local += server - synced would leave rounding behind, a "change" that would go
 * back to the servers at the next sync, and back and forth between the trainers for ever). */
static void geo_take(void *arg, uint64_t key, const float *server)
{
    geo_ctx *x = arg;
    float *row = ps_table_row(x->local, key, false);
    for (uint32_t j = 0; row && j < x->dim; j++) {
        float own = row[j] - row[x->dim + j];
        row[j] = own == 0 ? server[j] : server[j] + own;
        row[x->dim + j] = server[j];
    }
}

static int geo_sync(edl_ps_trainer *t)
{
    ps_call_mode m = {.flags = PS_F_GEO, .len = PS_GEO_PREFIX};
    edl_put32(m.prefix, (uint32_t)t->o.trainer_id);
    int rc = 0;
    for (uint32_t i = 0; i < EDL_PS_MAX_TABLES && rc == 0; i++) {
        if (!t->local[i])
            continue;
        uint32_t dim = ps_client_table(t->c, i)->dim;
        gather g = {.t = t, .c = t->c, .table = i, .dim = dim, .mode = &m};
        geo_ctx x = {.t = t, .dim = dim, .g = &g, .local = t->local[i]};
        rc = send_table(t->local[i], geo_deltas, &x, &g);
        if (rc == 0)
            rc = took(t, ps_client_geo_pull(t->c, i, (uint32_t)t->o.trainer_id, geo_take, &x));
    }
    return rc;
}

static int geo_push(edl_ps_trainer *t, uint32_t table, const uint64_t *keys, size_t n,
                    const float *grads)
{
    int rc = geo_rows(t, table, keys, n);
    const edl_ps_table_config *cfg = ps_client_table(t->c, table);
    for (size_t i = 0; rc == 0 && i < n; i++) { /* local SGD */
        float *row = ps_table_row(t->local[table], keys[i], false);
        for (uint32_t j = 0; j < cfg->dim; j++)
            row[j] -= cfg->lr * grads[i * cfg->dim + j];
        row[2 * cfg->dim] = 1; /* touched */
    }
    return rc;
}

/* ---- the calls --------------------------------------------------------------------------------- */

int edl_ps_trainer_open(edl_ps_client *c, const edl_ps_trainer_options *o,
                        edl_ps_trainer **out, char *why, size_t whylen)
{
    if (!c || !o || o->mode < EDL_PS_MODE_SYNC || o->mode > EDL_PS_MODE_GEO ||
        o->trainers < 1 || o->trainer_id < 0 || o->trainer_id >= o->trainers ||
        o->threads < 0 || o->geo_every < 0 ||
        (o->mode == EDL_PS_MODE_GEO && o->trainers > EDL_PS_MAX_GEO_TRAINERS))
        return edl_errf(why, whylen, EDL_EINVAL, "trainer options: mode %d, trainer %d of %d, "
                        "%d threads, geo_every %d (geo: at most %d trainers)",
                        o ? (int)o->mode : 0, o ? o->trainer_id : 0, o ? o->trainers : 0,
                        o ? o->threads : 0, o ? o->geo_every : 0, EDL_PS_MAX_GEO_TRAINERS);
    edl_ps_trainer *t = calloc(1, sizeof *t);
    if (!t)
        return edl_errf(why, whylen, EDL_ENOMEM, "out of memory");
    *t = (edl_ps_trainer){.c = c, .o = *o};
    t->o.threads = o->threads ? o->threads : 1;
    t->o.geo_every = o->geo_every ? o->geo_every : 10;
    pthread_mutex_init(&t->client_mu, NULL);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    int rc = 0;
    if (o->mode == EDL_PS_MODE_SYNC) { /* a token of its own; the step the servers are at */
        t->token = ps_mix64((uint64_t)edl_monotonic_ms() ^ (uint64_t)(uintptr_t)t ^
                            ((uint64_t)o->trainer_id << 48));
        rc = sync_barrier(t, UINT64_MAX, &t->step);
    } else if (o->mode == EDL_PS_MODE_ASYNC) {
        char err[256];
        if (ps_client_clone(c, &t->sc, err, sizeof err) != 0)
            EDL_WARN("ps", "the async sender shares the trainer's client: %s", err);
        if (ps_prefetch_open(c, &t->pf, err, sizeof err) != 0)
            EDL_WARN("ps", "no pulls ahead: %s", err);
        rc = pthread_create(&t->sender, NULL, sender_main, t) ? EDL_EIO : 0;
        t->has_sender = rc == 0;
    }
    if (rc) {
        edl_errf(why, whylen, rc, "%s", t->err[0] ? t->err : "cannot start the sender");
        edl_ps_trainer_close(t);
        return rc;
    }
    *out = t;
    return 0;
}

int edl_ps_trainer_close(edl_ps_trainer *t)
{
    if (!t)
        return 0;
    int rc = edl_ps_trainer_flush(t);
    if (t->has_sender) {
        pthread_mutex_lock(&t->mu);
        t->stop = true;
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->sender, NULL);
    }
    edl_ps_client_close(t->sc);
    ps_prefetch_close(t->pf);
    for (int i = 0; i < EDL_PS_MAX_TABLES; i++) {
        ps_table_free(t->merge[i]);
        ps_table_free(t->spare[i]);
        for (int j = 0; j < 2; j++)
            free(t->logs[j][i].keys), free(t->logs[j][i].vals);
        ps_table_free(t->local[i]);
    }
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    pthread_mutex_destroy(&t->client_mu);
    free(t);
    return rc;
}

int edl_ps_trainer_pull_sparse(edl_ps_trainer *t, uint32_t table, const uint64_t *keys,
                               size_t n, float *out)
{
    if (t->o.mode == EDL_PS_MODE_GEO) {
        int rc = geo_rows(t, table, keys, n);
        uint32_t dim = rc ? 0 : ps_client_table(t->c, table)->dim;
        for (size_t i = 0; rc == 0 && i < n; i++)
            memcpy(out + i * dim, ps_table_row(t->local[table], keys[i], false),
                   dim * sizeof *out);
        return rc;
    }
    const edl_ps_table_config *cfg = t->pf ? table_of(t, table) : NULL;
    if (cfg && ps_prefetch_take(t->pf, table, keys, n, out, cfg->dim))
        return 0;
    pthread_mutex_lock(&t->client_mu);
    int rc = took(t, edl_ps_pull_sparse(t->c, table, keys, n, out));
    pthread_mutex_unlock(&t->client_mu);
    return rc;
}

int edl_ps_trainer_prefetch_sparse(edl_ps_trainer *t, uint32_t table, const uint64_t *keys,
                                   size_t n)
{
    const edl_ps_table_config *cfg = table_of(t, table);
    if (!cfg)
        return EDL_EINVAL;
    if (cfg->kind != EDL_PS_SPARSE) {
        snprintf(t->err, sizeof t->err, "table %u is dense", table);
        return EDL_EINVAL;
    }
    int rc = t->pf && n ? ps_prefetch_start(t->pf, table, cfg, keys, n) : 0;
    if (rc)
        snprintf(t->err, sizeof t->err, "out of memory to pull %zu keys ahead", n);
    return rc;
}

int edl_ps_trainer_pull_dense(edl_ps_trainer *t, uint32_t table, uint64_t off, uint64_t n,
                              float *out)
{
    pthread_mutex_lock(&t->client_mu);
    int rc = took(t, edl_ps_pull_dense(t->c, table, off, n, out));
    pthread_mutex_unlock(&t->client_mu);
    return rc;
}

/* A push in sync mode, or a dense one in geo mode: sent now. */
static int push_now(edl_ps_trainer *t, uint32_t table, const uint64_t *keys, size_t n,
                    uint64_t off, const float *grads)
{
    ps_call_mode m = t->o.mode == EDL_PS_MODE_SYNC ? sync_mode(t) : (ps_call_mode){0};
    pthread_mutex_lock(&t->client_mu);
    int rc = keys ? ps_client_push_sparse_mode(t->c, table, keys, n, grads, &m)
                  : ps_client_push_dense_mode(t->c, table, off, n, grads, &m);
    pthread_mutex_unlock(&t->client_mu);
    return took(t, rc);
}

int edl_ps_trainer_push_sparse(edl_ps_trainer *t, uint32_t table, const uint64_t *keys,
                               size_t n, const float *grads)
{
    if (!table_of(t, table))
        return EDL_EINVAL;
    switch (t->o.mode) {
    case EDL_PS_MODE_SYNC: return push_now(t, table, keys, n, 0, grads);
    case EDL_PS_MODE_GEO: return geo_push(t, table, keys, n, grads);
    default: return merge_push(t, table, keys, n, 0, grads);
    }
}

int edl_ps_trainer_push_dense(edl_ps_trainer *t, uint32_t table, uint64_t off, uint64_t n,
                              const float *grads)
{
    if (!table_of(t, table))
        return EDL_EINVAL;
    if (t->o.mode == EDL_PS_MODE_SYNC || t->o.mode == EDL_PS_MODE_GEO)
        return push_now(t, table, NULL, n, off, grads);
    return merge_push(t, table, NULL, n, off, grads);
}

int edl_ps_trainer_step(edl_ps_trainer *t)
{
    uint64_t done;
    int rc = 0;
    switch (t->o.mode) {
    case EDL_PS_MODE_SYNC:
        if ((rc = sync_barrier(t, t->step, &done)) == 0)
            t->step++;
        return rc;
    case EDL_PS_MODE_HALF_ASYNC: return half_async_step(t);
    case EDL_PS_MODE_GEO: return ++t->step % (uint64_t)t->o.geo_every ? 0 : geo_sync(t);
    default: return 0;
    }
}

int edl_ps_trainer_flush(edl_ps_trainer *t)
{
    if (t->o.mode == EDL_PS_MODE_GEO)
        return geo_sync(t);
    pthread_mutex_lock(&t->mu);
    if (t->o.mode == EDL_PS_MODE_HALF_ASYNC && t->queued) /* what no step has sent yet */
        send_queued(t);
    while (t->has_sender && (t->queued || t->sending))
        pthread_cond_wait(&t->cv, &t->mu);
    int rc = t->send_rc;
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int edl_ps_trainer_shrink(edl_ps_trainer *t, uint32_t table, uint64_t *evicted)
{
    pthread_mutex_lock(&t->client_mu);
    int rc = took(t, edl_ps_shrink(t->c, table, evicted));
    pthread_mutex_unlock(&t->client_mu);
    return rc;
}

int edl_ps_trainer_save(edl_ps_trainer *t, int64_t step)
{
    int rc = edl_ps_trainer_flush(t);
    if (rc)
        return rc;
    pthread_mutex_lock(&t->client_mu);
    rc = took(t, edl_ps_save(t->c, step));
    pthread_mutex_unlock(&t->client_mu);
    return rc;
}

void edl_ps_trainer_traffic(edl_ps_trainer *t, uint64_t *sent, uint64_t *received)
{
    uint64_t s = 0, r = 0;
    pthread_mutex_lock(&t->mu); /* with mu held and no send in flight, the sender waits */
    while (t->sending)
        pthread_cond_wait(&t->cv, &t->mu);
    if (t->sc)
        edl_ps_client_traffic(t->sc, &s, &r);
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_lock(&t->client_mu);
    edl_ps_client_traffic(t->c, sent, received);
    pthread_mutex_unlock(&t->client_mu);
    *sent += s;
    *received += r;
    if (t->pf) {
        ps_prefetch_traffic(t->pf, &s, &r);
        *sent += s;
        *received += r;
    }
}

int edl_ps_trainer_set_trainers(edl_ps_trainer *t, int trainer_id, int trainers)
{
    if (trainers < 1 || trainer_id < 0 || trainer_id >= trainers ||
        (t->o.mode == EDL_PS_MODE_GEO && trainers > EDL_PS_MAX_GEO_TRAINERS))
        return EDL_EINVAL;
    pthread_mutex_lock(&t->mu);
    t->o.trainer_id = trainer_id;
    t->o.trainers = trainers;
    pthread_mutex_unlock(&t->mu);
    return 0;
}

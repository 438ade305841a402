/* checkpoint.c: saving and loading checkpoints (edl/checkpoint.h).
 *
 * The commit protocol makes "the newest complete checkpoint" well defined after a crash at
 * any moment: shards first, then each rank's done.json, then the manifest, and only then the
 * etcd pointer, advanced by a txn that compares the pointer's mod_revision (or its absence)
 * and refuses to go backwards in step. A checkpoint the pointer does not name does not exist
 * for a reader; garbage left by a crash is deleted by a later commit. A lost pointer (the job's
 * etcd keys went) is rebuilt from the store's listing first (checkpoint_recover.c).
 *
 * Saves run on one background thread per edl_ckpt with a storage handle of its own, so the
 * caller's thread only copies its buffers, into staging memory the handle keeps
 * (checkpoint_stage.c). */
#define _GNU_SOURCE
#include "checkpoint_internal.h"
#include "edl/http.h"
#include "edl/job.h"
#include "edl/log.h"
#include "edl/proc.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define POINTER_TRIES 64
#define POLL_MIN_MS 50
#define PARALLEL_SHARDS 4      /* edl_ckpt_config.parallel_shards when 0 */
#define PARALLEL_SHARDS_MAX 64
#define POLL_MAX_MS 1000
#define COPY_THREADS_DEFAULT_MAX 8 /* copy_threads 0: the CPUs this process may use, up to this */
#define COPY_THREADS_MAX 64
#define SINGLE_PUT_MAX (1ull << 30) /* multipart_threshold 0: one PUT per shard up to this */

typedef struct pending_shard {
    char *name;
    void *data;
    size_t len;
    void (*free_fn)(void *, void *);
    void *free_arg;
} pending_shard;

struct edl_ckpt_pending {
    edl_ckpt *ck;
    int64_t step, generation;
    pending_shard *shards; /* data: the caller's (handed over) or in stage (copied) */
    size_t n;
    ckpt_stage *stage; /* the staging area of the copied shards (NULL: none copied) */
    ckpt_snapshot *snap; /* their copy into it (NULL: none copied) */
    char *metadata;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;         /* the caller's handle and the worker */
    bool done;
    int rc;
    char errmsg[1024];
    edl_ckpt_pending *next;
};

struct edl_ckpt {
    char *uri, *job, *pointer_key;
    char *run;             /* edl_ckpt_config.run; NULL: none */
    int rank, world_size, committer, keep;
    int64_t commit_timeout_ms;
    bool verify;
    int copy_threads;
    bool background; /* snapshot_in_background */
    edl_etcd *etcd;
    edl_storage *fg, *bg;  /* caller's thread (= down[0]); worker thread (= up[0]) */
    edl_storage **up;      /* one per shard upload in flight: parallel_shards handles */
    edl_storage **down;    /* one per shard read at once by the caller's thread: as many */
    int n_up;              /* handles in up, and in down */
    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    edl_ckpt_pending *head, *tail;
    ckpt_stages stages;  /* staging memory, kept and reused by every save */
    bool stopping;
    char errmsg[1024];
};

/* ---- small helpers -------------------------------------------------------------------- */

static void sleep_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static bool label_ok(const char *s)
{
    if (!s || !s[0] || strlen(s) > 128)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '_' || *s == '-'))
            return false;
    return true;
}

/* ---- open and close ------------------------------------------------------------------- */

void edl_ckpt_config_init(edl_ckpt_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->world_size = 1;
    cfg->keep = 3;
    cfg->commit_timeout_ms = 600000;
    cfg->verify_on_load = true;
    cfg->parallel_shards = PARALLEL_SHARDS;
}

edl_storage_config ckpt_store_config(const edl_ckpt_config *cfg)
{
    edl_storage_config sc;
    if (cfg->storage)
        sc = *cfg->storage;
    else
        edl_storage_config_init(&sc);
    sc.uri = cfg->uri;
    return sc;
}

static void *worker_main(void *arg);

static int default_copy_threads(void)
{
    int n = edl_cpu_count();
    return n > COPY_THREADS_DEFAULT_MAX ? COPY_THREADS_DEFAULT_MAX : n;
}

static void ckpt_free(edl_ckpt *ck)
{
    for (int i = 0; ck->up && i < ck->n_up; i++)
        edl_storage_close(ck->up[i]);
    for (int i = 0; ck->down && i < ck->n_up; i++)
        edl_storage_close(ck->down[i]);
    free(ck->up);
    free(ck->down);
    free(ck->uri);
    free(ck->job);
    free(ck->pointer_key);
    free(ck->run);
    ckpt_stages_clear(&ck->stages);
    free(ck);
}

int edl_ckpt_open(const edl_ckpt_config *cfg, edl_ckpt **out, char *errbuf, size_t errlen)
{
    char dummy[8];
    if (!errbuf || !errlen)
        errbuf = dummy, errlen = sizeof dummy;
    errbuf[0] = '\0';
    if (!out)
        return EDL_EINVAL;
    *out = NULL;
    if (!cfg || !cfg->uri || !cfg->etcd)
        return edl_errf(errbuf, errlen, EDL_EINVAL, "checkpoint config needs a uri and an etcd client");
    if (!edl_name_valid(cfg->job))
        return edl_errf(errbuf, errlen, EDL_EINVAL, "checkpoint job id \"%.80s\" must be 1-128 "
                    "letters, digits and \"._-\", not starting with \".\" or \"-\"",
                    cfg->job ? cfg->job : "(null)");
    if (cfg->world_size < 1 || cfg->world_size > CKPT_MAX_WORLD || cfg->rank < 0 ||
        cfg->rank >= cfg->world_size || cfg->committer_rank < 0 ||
        cfg->committer_rank >= cfg->world_size)
        return edl_errf(errbuf, errlen, EDL_EINVAL, "checkpoint ranks: rank %d, committer %d and "
                    "world size %d do not fit (0 <= rank < world size <= %d)", cfg->rank,
                    cfg->committer_rank, cfg->world_size, CKPT_MAX_WORLD);
    if (cfg->keep < 1 || cfg->keep > 1000)
        return edl_errf(errbuf, errlen, EDL_EINVAL, "checkpoint keep=%d: keep 1..1000", cfg->keep);
    if (cfg->parallel_shards < 0 || cfg->parallel_shards > PARALLEL_SHARDS_MAX)
        return edl_errf(errbuf, errlen, EDL_EINVAL, "checkpoint parallel_shards=%d: 1..%d (0: %d)",
                        cfg->parallel_shards, PARALLEL_SHARDS_MAX, PARALLEL_SHARDS);
    if (cfg->copy_threads < 0 || cfg->copy_threads > COPY_THREADS_MAX)
        return edl_errf(errbuf, errlen, EDL_EINVAL, "checkpoint copy_threads=%d: 1..%d (0: the "
                        "CPUs this process may use, at most %d)", cfg->copy_threads,
                        COPY_THREADS_MAX, COPY_THREADS_DEFAULT_MAX);
    const char *run = cfg->run ? cfg->run : getenv("EDL_RUN_ID");
    if (run && strlen(run) > CKPT_MAX_RUN)
        return edl_errf(errbuf, errlen, EDL_EINVAL, "checkpoint run \"%.80s\" is longer than %d "
                        "characters", run, CKPT_MAX_RUN);
    edl_ckpt *ck = calloc(1, sizeof *ck);
    if (!ck)
        return EDL_ENOMEM;
    ckpt_stages_init(&ck->stages);
    if (run && run[0] && !(ck->run = strdup(run))) {
        ckpt_free(ck);
        return EDL_ENOMEM;
    }
    edl_job_keys keys;
    ck->uri = strdup(cfg->uri);
    ck->job = strdup(cfg->job);
    if (!ck->uri || !ck->job || edl_job_keys_init(&keys, cfg->prefix, cfg->job) != 0) {
        ckpt_free(ck);
        return EDL_ENOMEM;
    }
    ck->pointer_key = keys.checkpoint; /* the one key a checkpoint needs */
    keys.checkpoint = NULL;
    edl_job_keys_clear(&keys);
    ck->rank = cfg->rank;
    ck->world_size = cfg->world_size;
    ck->committer = cfg->committer_rank;
    ck->keep = cfg->keep;
    ck->commit_timeout_ms = cfg->commit_timeout_ms > 0 ? cfg->commit_timeout_ms : 600000;
    ck->verify = cfg->verify_on_load;
    ck->copy_threads = cfg->copy_threads ? cfg->copy_threads : default_copy_threads();
    ck->background = cfg->snapshot_in_background;
    ck->etcd = cfg->etcd;
    edl_storage_config sc = ckpt_store_config(cfg);
    if (!sc.multipart_threshold) /* shards in flight are the parallel streams already */
        sc.multipart_threshold = SINGLE_PUT_MAX;
    int lanes = cfg->parallel_shards ? cfg->parallel_shards : PARALLEL_SHARDS, rc = 0;
    if (!(ck->up = calloc((size_t)lanes, sizeof *ck->up)) ||
        !(ck->down = calloc((size_t)lanes, sizeof *ck->down)))
        rc = EDL_ENOMEM;
    for (; rc == 0 && ck->n_up < lanes; ck->n_up++)
        if ((rc = edl_storage_open(&sc, &ck->up[ck->n_up], errbuf, errlen)) == 0)
            rc = edl_storage_open(&sc, &ck->down[ck->n_up], errbuf, errlen);
    ck->bg = rc == 0 ? ck->up[0] : NULL;
    ck->fg = rc == 0 ? ck->down[0] : NULL;
    if (rc != 0) {
        ckpt_free(ck);
        return rc;
    }
    pthread_mutex_init(&ck->mu, NULL);
    edl_cond_init(&ck->cv);
    if (pthread_create(&ck->worker, NULL, worker_main, ck) != 0) {
        pthread_mutex_destroy(&ck->mu);
        pthread_cond_destroy(&ck->cv);
        ckpt_free(ck);
        return edl_errf(errbuf, errlen, EDL_ENOMEM, "cannot start the checkpoint upload thread");
    }
    *out = ck;
    return 0;
}

void edl_ckpt_close(edl_ckpt *ck)
{
    if (!ck)
        return;
    pthread_mutex_lock(&ck->mu);
    ck->stopping = true;
    pthread_cond_broadcast(&ck->cv);
    pthread_mutex_unlock(&ck->mu);
    pthread_join(ck->worker, NULL);
    pthread_mutex_destroy(&ck->mu);
    pthread_cond_destroy(&ck->cv);
    ckpt_free(ck);
}

const char *edl_ckpt_errmsg(const edl_ckpt *ck)
{
    return ck ? ck->errmsg : "no checkpoint handle";
}

/* ---- pending saves ---------------------------------------------------------------------- */

static void release_shard(pending_shard *s)
{
    if (s->free_fn)
        s->free_fn(s->data, s->free_arg);
    s->data = NULL;
    s->free_fn = NULL;
}

/* The staging area goes back to the handle, for the next save. */
static void release_stage(edl_ckpt_pending *p)
{
    ckpt_stage_give(&p->ck->stages, p->stage);
    p->stage = NULL;
}

static void pending_unref(edl_ckpt_pending *p)
{
    pthread_mutex_lock(&p->mu);
    bool last = --p->refs == 0;
    pthread_mutex_unlock(&p->mu);
    if (!last)
        return;
    for (size_t i = 0; i < p->n; i++) {
        release_shard(&p->shards[i]);
        free(p->shards[i].name);
    }
    ckpt_snapshot_free(p->snap); /* its threads write into the stage */
    release_stage(p);
    free(p->shards);
    free(p->metadata);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

/* The metadata must be a JSON object: checked now so the caller hears at once, not when the
 * committer writes the manifest. */
static bool metadata_ok(const char *json)
{
    if (!json)
        return true;
    if (strlen(json) > (1u << 20))
        return false;
    cJSON *o = cJSON_Parse(json);
    bool ok = cJSON_IsObject(o);
    cJSON_Delete(o);
    return ok;
}

/* Round a shard's place in the staging area up to a cache line. */
static size_t stage_len(size_t len)
{
    return (len + 63) / 64 * 64;
}

/* Take the handed-over shards as they are and copy the others into one staging area (pinned
 * when a device shard is among them): the copy is the only time the training step waits for,
 * and not even that in the background (the memory was faulted in by an earlier save or
 * edl_ckpt_stage_reserve). */
static int stage_shards(edl_ckpt *ck, edl_ckpt_pending *p, const edl_ckpt_shard *shards,
                        char *err, size_t errlen)
{
    size_t need = 0, n_copies = 0;
    bool device = false;
    for (size_t i = 0; i < p->n; i++) {
        need += shards[i].free_fn ? 0 : stage_len(shards[i].len);
        n_copies += !shards[i].free_fn;
        device |= shards[i].device && shards[i].len; /* nothing to copy from an empty one */
    }
    char *mem = NULL;
    if (need && !(p->stage = ckpt_stage_take(&ck->stages, need, false, &mem)))
        return edl_errf(err, errlen, EDL_ENOMEM, "no memory for %zu bytes of staging", need);
    int rc = device ? ckpt_stage_pin(p->stage, err, errlen) : 0;
    ckpt_copy *copies = calloc(n_copies ? n_copies : 1, sizeof *copies);
    if (rc == 0 && !copies)
        rc = edl_errf(err, errlen, EDL_ENOMEM, "no memory to copy the shards");
    for (size_t i = 0, c = 0; rc == 0 && i < p->n; i++) {
        pending_shard *s = &p->shards[i];
        s->len = shards[i].len;
        if (shards[i].free_fn) {
            s->data = (void *)shards[i].data;
            s->free_fn = shards[i].free_fn;
            s->free_arg = shards[i].free_arg;
            continue;
        }
        s->data = mem;
        copies[c++] = (ckpt_copy){mem, shards[i].data, shards[i].len,
                                  shards[i].device && shards[i].len};
        mem += stage_len(shards[i].len);
    }
    if (rc != 0 || !n_copies) {
        free(copies);
        return rc;
    }
    return ckpt_snapshot_start(copies, n_copies, ck->copy_threads, ck->background, &p->snap, err,
                               errlen);
}

int edl_ckpt_stage_reserve(edl_ckpt *ck, size_t bytes)
{
    if (!ck)
        return EDL_EINVAL;
    char *mem;
    ckpt_stage *a = bytes ? ckpt_stage_take(&ck->stages, bytes, true, &mem) : NULL;
    if (bytes && !a)
        return edl_errf(ck->errmsg, sizeof ck->errmsg, EDL_ENOMEM, "no memory for %zu bytes of "
                        "checkpoint staging", bytes);
    ckpt_stage_give(&ck->stages, a);
    return 0;
}

int edl_ckpt_save_async(edl_ckpt *ck, int64_t step, int64_t generation, const edl_ckpt_shard *shards,
                        size_t n_shards, const char *metadata_json, edl_ckpt_pending **out)
{
    if (!ck || !out || (n_shards && !shards))
        return EDL_EINVAL;
    *out = NULL;
    if (step < 0 || step > CKPT_MAX_STEP || generation < 0 || generation > CKPT_MAX_STEP)
        return edl_errf(ck->errmsg, sizeof ck->errmsg, EDL_EINVAL, "checkpoint step %" PRId64
                    " / generation %" PRId64 " must be in 0..2^53-1", step, generation);
    if (n_shards > 100000)
        return edl_errf(ck->errmsg, sizeof ck->errmsg, EDL_EINVAL, "%zu shards in one rank: at most "
                    "100000", n_shards);
    if (!metadata_ok(metadata_json))
        return edl_errf(ck->errmsg, sizeof ck->errmsg, EDL_EINVAL, "checkpoint metadata must be a "
                    "JSON object under 1 MiB");
    for (size_t i = 0; i < n_shards; i++) {
        if ((shards[i].name && shards[i].name[0] && !label_ok(shards[i].name)) ||
            (!shards[i].data && shards[i].len))
            return edl_errf(ck->errmsg, sizeof ck->errmsg, EDL_EINVAL, "shard %zu: the name must be "
                        "letters, digits and \"._-\" and the data non-NULL", i);
        if (shards[i].device && shards[i].free_fn)
            return edl_errf(ck->errmsg, sizeof ck->errmsg, EDL_EINVAL, "shard %zu: a device shard "
                            "is always copied, so it cannot be handed over (free_fn)", i);
    }
    edl_ckpt_pending *p = calloc(1, sizeof *p);
    if (!p || !(p->shards = calloc(n_shards ? n_shards : 1, sizeof *p->shards))) {
        free(p);
        return EDL_ENOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    edl_cond_init(&p->cv);
    p->refs = 2;
    p->ck = ck;
    p->step = step;
    p->generation = generation;
    p->n = n_shards;
    bool nomem = metadata_json && !(p->metadata = strdup(metadata_json));
    for (size_t i = 0; i < n_shards && !nomem; i++)
        nomem = !(p->shards[i].name = strdup(shards[i].name ? shards[i].name : ""));
    int rc = nomem ? EDL_ENOMEM : stage_shards(ck, p, shards, ck->errmsg, sizeof ck->errmsg);
    if (rc != 0) {
        if (nomem)
            snprintf(ck->errmsg, sizeof ck->errmsg, "no memory to queue the save");
        p->refs = 1;
        pending_unref(p);
        return rc;
    }
    pthread_mutex_lock(&ck->mu);
    if (ck->tail)
        ck->tail->next = p;
    else
        ck->head = p;
    ck->tail = p;
    pthread_cond_broadcast(&ck->cv);
    pthread_mutex_unlock(&ck->mu);
    *out = p;
    return 0;
}

int edl_ckpt_wait(edl_ckpt_pending *p, int64_t timeout_ms)
{
    if (!p)
        return EDL_EINVAL;
    int64_t deadline = edl_deadline_ms(timeout_ms);
    pthread_mutex_lock(&p->mu);
    while (!p->done && edl_cond_wait_until(&p->cv, &p->mu, deadline)) {
    }
    int rc = p->done ? p->rc : EDL_ETIMEDOUT;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int edl_ckpt_snapshot_wait(edl_ckpt_pending *p, int64_t timeout_ms)
{
    return p ? ckpt_snapshot_wait(p->snap, timeout_ms) : EDL_EINVAL;
}

bool edl_ckpt_save_done(edl_ckpt_pending *p)
{
    pthread_mutex_lock(&p->mu);
    bool d = p->done;
    pthread_mutex_unlock(&p->mu);
    return d;
}

const char *edl_ckpt_save_errmsg(edl_ckpt_pending *p)
{
    return p ? p->errmsg : "no save handle";
}

void edl_ckpt_save_free(edl_ckpt_pending *p)
{
    if (p)
        pending_unref(p);
}

static void borrowed(void *data, void *arg)
{
    (void)data, (void)arg;
}

int edl_ckpt_save(edl_ckpt *ck, int64_t step, int64_t generation, const edl_ckpt_shard *shards,
                  size_t n_shards, const char *metadata_json)
{
    if (!ck || (n_shards && !shards))
        return EDL_EINVAL;
    /* The caller waits for the upload, so its buffers stay as they are: lend them, no copy. */
    edl_ckpt_shard *lent = malloc((n_shards ? n_shards : 1) * sizeof *lent);
    if (!lent)
        return EDL_ENOMEM;
    for (size_t i = 0; i < n_shards; i++) {
        lent[i] = shards[i];
        if (!lent[i].free_fn && !lent[i].device)
            lent[i].free_fn = borrowed;
    }
    edl_ckpt_pending *p;
    int rc = edl_ckpt_save_async(ck, step, generation, lent, n_shards, metadata_json, &p);
    free(lent);
    if (rc != 0)
        return rc;
    rc = edl_ckpt_wait(p, -1);
    if (rc != 0)
        snprintf(ck->errmsg, sizeof ck->errmsg, "%s", p->errmsg);
    edl_ckpt_save_free(p);
    return rc;
}

/* ---- the commit (on the committer rank) --------------------------------------------------- */

/* The pointer is absent (the job's etcd keys went: a new run, an etcd that lost its data) or
 * names another URI (stale_rev: its mod_revision; 0 when absent): rebuild it from the store's
 * listing and put it in the state it was read in, so that every rank agrees on one lineage.
 * 0 when there is a pointer now (ours or another rank's); EDL_ENOTFOUND when the store holds
 * no checkpoint either (a stale pointer is then deleted); a store or etcd error. */
static int recover_pointer(edl_ckpt *ck, edl_storage *st, int64_t stale_rev, char *err,
                           size_t errlen)
{
    char *doc = NULL;
    ckpt_pointer_entry newest;
    size_t found;
    int rc = ckpt_pointer_from_store(st, ck->uri, ck->keep, &doc, &newest, &found, err, errlen);
    if (rc != 0 && (rc != EDL_ENOTFOUND || !stale_rev))
        return rc;
    edl_txn *t = edl_txn_new();
    if (!t) {
        free(doc);
        return EDL_ENOMEM;
    }
    if (stale_rev)
        edl_txn_cmp_mod(t, edl_str(ck->pointer_key), EDL_CMP_EQUAL, stale_rev);
    else
        edl_txn_cmp_create(t, edl_str(ck->pointer_key), EDL_CMP_EQUAL, 0);
    if (doc)
        edl_txn_put(t, EDL_TXN_SUCCESS, edl_str(ck->pointer_key), edl_str(doc), NULL);
    else
        edl_txn_delete(t, EDL_TXN_SUCCESS, edl_str(ck->pointer_key), NULL);
    edl_txn_result res = {0};
    int trc = edl_etcd_txn(ck->etcd, t, &res);
    if (trc != 0)
        rc = edl_errf(err, errlen, trc, "cannot seed the checkpoint pointer %s from %s: %s",
                      ck->pointer_key, ck->uri, edl_etcd_errmsg(ck->etcd));
    else if (res.succeeded && doc)
        EDL_INFO("checkpoint", "job %s: no checkpoint pointer for %s in etcd; found %zu "
                 "complete checkpoint%s in the store, the newest %s (step %" PRId64 ")", ck->job,
                 ck->uri, found, found == 1 ? "" : "s", newest.dir, newest.step);
    edl_txn_result_clear(&res);
    edl_txn_free(t);
    free(doc);
    return rc;
}

/* Read the pointer: 0 (found), EDL_ENOTFOUND, or an error. *kv is the caller's. A pointer
 * that is absent or names another URI is first rebuilt from the store through st (the calling
 * thread's handle), unless st is NULL: when the commit advances the pointer, the listing would
 * show the manifest it has just written (the commit rebuilt it before writing that). */
static int read_pointer(edl_ckpt *ck, edl_storage *st, edl_kv **kv, ckpt_pointer *p, char *err,
                        size_t errlen)
{
    for (int attempt = 0;; attempt++) {
        *kv = NULL;
        memset(p, 0, sizeof *p);
        int rc = edl_etcd_get(ck->etcd, edl_str(ck->pointer_key), kv, NULL);
        if (rc != 0 && rc != EDL_ENOTFOUND)
            return edl_errf(err, errlen, rc, "cannot read the checkpoint pointer %s from etcd: "
                            "%s", ck->pointer_key, edl_etcd_errmsg(ck->etcd));
        char why[256];
        if (rc == 0 && (rc = ckpt_pointer_parse((*kv)->value, (*kv)->value_len, p, why,
                                                 sizeof why)) != 0) {
            edl_kv_free(*kv);
            *kv = NULL;
            return edl_errf(err, errlen, rc, "the checkpoint pointer %s is malformed: %s (delete "
                            "it: it is then rebuilt from the checkpoints in %s)", ck->pointer_key,
                            why, ck->uri);
        }
        bool ours = rc == 0 && (!p->uri || strcmp(p->uri, ck->uri) == 0);
        if (ours || !st || (rc == EDL_ENOTFOUND && attempt > 0))
            return rc;
        if (attempt == POINTER_TRIES) {
            edl_kv_free(*kv);
            *kv = NULL;
            ckpt_pointer_clear(p);
            return edl_errf(err, errlen, EDL_ECONFLICT, "the checkpoint pointer %s kept changing "
                            "while it was rebuilt from %s", ck->pointer_key, ck->uri);
        }
        int64_t stale_rev = rc == 0 ? (*kv)->mod_revision : 0;
        if (rc == 0)
            EDL_WARN("checkpoint", "the checkpoint pointer %s names %s, not %s: rebuilding it "
                     "from %s", ck->pointer_key, p->uri, ck->uri, ck->uri);
        edl_kv_free(*kv);
        *kv = NULL;
        ckpt_pointer_clear(p);
        if ((rc = recover_pointer(ck, st, stale_rev, err, errlen)) != 0)
            return rc;
    }
}

/* One poll of rank r's done.json: 0 and *out when it is there and agrees; EDL_ENOTFOUND while
 * it is not there or does not parse yet (some stores, s3rver among them, show an object while
 * its PUT is still streaming in), with the reason in why; another error from the store. */
static int poll_rank(edl_ckpt *ck, edl_ckpt_pending *p, edl_ckpt_manifest *all, int r,
                     edl_ckpt_manifest **out, char *why, size_t whylen)
{
    char key[128];
    snprintf(key, sizeof key, "%s/rank-%d/done.json", all->dir, r);
    void *doc;
    size_t len;
    int rc = edl_storage_get(ck->bg, key, CKPT_MAX_DOC, &doc, &len);
    if (rc == EDL_ENOTFOUND)
        return rc;
    if (rc != 0)
        return edl_errf(p->errmsg, sizeof p->errmsg, rc, "commit of %s: %s", all->dir,
                        edl_storage_errmsg(ck->bg));
    char reason[256];
    rc = ckpt_rank_doc_parse(doc, len, r, all, out, reason, sizeof reason);
    free(doc);
    if (rc != 0) {
        snprintf(why, whylen, "%s/%s is unusable: %s", ck->uri, key, reason);
        return EDL_ENOTFOUND;
    }
    return 0;
}

/* Wait until every rank's done.json is there and agrees; assemble the whole shard list. A
 * document that stays unusable until the deadline fails the commit with its reason. */
static int gather_ranks(edl_ckpt *ck, edl_ckpt_pending *p, edl_ckpt_manifest *all)
{
    edl_ckpt_manifest **got = calloc((size_t)ck->world_size, sizeof *got);
    if (!got)
        return EDL_ENOMEM;
    int64_t deadline = edl_monotonic_ms() + ck->commit_timeout_ms;
    int missing = ck->world_size, rc = 0, attempt = 0;
    char why[512] = "";
    while (rc == 0 && missing > 0) {
        why[0] = '\0';
        for (int r = 0; r < ck->world_size && rc == 0; r++) {
            if (got[r])
                continue;
            rc = poll_rank(ck, p, all, r, &got[r], why, sizeof why);
            if (rc == 0)
                missing--;
            else if (rc == EDL_ENOTFOUND)
                rc = 0;
        }
        int64_t wait = edl_http_backoff_ms(attempt++, POLL_MIN_MS, POLL_MAX_MS, -1);
        if (rc == 0 && missing > 0) {
            /* give up at the deadline, not before: a last look when it comes */
            int64_t left = deadline - edl_monotonic_ms();
            if (left <= 0) {
                if (why[0])
                    rc = edl_errf(p->errmsg, sizeof p->errmsg, EDL_EPROTO, "commit of %s: %s",
                                  all->dir, why);
                else
                    rc = edl_errf(p->errmsg, sizeof p->errmsg, EDL_ETIMEDOUT, "commit of %s: %d "
                                  "of %d ranks had not finished their shards after %" PRId64
                                  " ms", all->dir, missing, ck->world_size, ck->commit_timeout_ms);
                break;
            }
            sleep_ms(wait < left ? wait : left);
        }
    }
    size_t total = 0;
    for (int r = 0; rc == 0 && r < ck->world_size; r++)
        total += got[r]->n_shards;
    if (rc == 0 && total > CKPT_MAX_SHARDS)
        rc = edl_errf(p->errmsg, sizeof p->errmsg, EDL_ETOOBIG, "commit of %s: %zu shards, more than "
                  "%d", all->dir, total, CKPT_MAX_SHARDS);
    if (rc == 0 && !(all->shards = calloc(total ? total : 1, sizeof *all->shards)))
        rc = EDL_ENOMEM;
    for (int r = 0; rc == 0 && r < ck->world_size; r++) {
        memcpy(all->shards + all->n_shards, got[r]->shards, got[r]->n_shards * sizeof *all->shards);
        all->n_shards += got[r]->n_shards;
        got[r]->n_shards = 0; /* the strings moved */
    }
    for (int r = 0; r < ck->world_size; r++)
        edl_ckpt_manifest_free(got[r]);
    free(got);
    return rc;
}

/* Every shard is there with the size its rank reported (a rank's done.json is written after its
 * shards, so this only fails when something else removed or replaced them). */
static int check_sizes(edl_ckpt *ck, edl_ckpt_pending *p, const edl_ckpt_manifest *all)
{
    for (size_t i = 0; i < all->n_shards; i++) {
        edl_storage_stat st;
        int rc = edl_storage_stat_key(ck->bg, all->shards[i].key, &st);
        if (rc != 0)
            return edl_errf(p->errmsg, sizeof p->errmsg, rc, "commit of %s: %s", all->dir,
                        edl_storage_errmsg(ck->bg));
        if (st.size != all->shards[i].size)
            return edl_errf(p->errmsg, sizeof p->errmsg, EDL_EPROTO, "commit of %s: %s holds %" PRIu64
                        " bytes, its rank wrote %" PRIu64, all->dir, all->shards[i].key,
                        st.size, all->shards[i].size);
    }
    return 0;
}

/* Delete every checkpoint directory older than the new one that the pointer no longer keeps:
 * committed ones beyond `keep` and leftovers of saves that crashed or lost the race. */
static void collect_garbage(edl_ckpt *ck, const char *new_pointer, int64_t step)
{
    ckpt_pointer ptr;
    char why[128];
    if (ckpt_pointer_parse(new_pointer, strlen(new_pointer), &ptr, why, sizeof why) != 0)
        return;
    char **keys = NULL;
    size_t n = 0, deleted = 0;
    if (edl_storage_list(ck->bg, "ckpt-", &keys, &n) != 0) {
        EDL_WARN("checkpoint", "cannot list %s to delete old checkpoints: %s", ck->uri,
                 edl_storage_errmsg(ck->bg));
        n = 0;
    }
    for (size_t i = 0; i < n; i++) {
        const char *slash = strchr(keys[i], '/');
        int64_t s, g;
        if (!slash || !ckpt_dir_parse(keys[i], (size_t)(slash - keys[i]), &s, &g) || s >= step)
            continue;
        bool kept = false;
        for (size_t k = 0; k < ptr.n && !kept; k++)
            kept = strncmp(ptr.entries[k].dir, keys[i], (size_t)(slash - keys[i])) == 0 &&
                   ptr.entries[k].dir[slash - keys[i]] == '\0';
        if (kept)
            continue;
        if (edl_storage_delete(ck->bg, keys[i]) != 0)
            EDL_WARN("checkpoint", "cannot delete old checkpoint object %s/%s: %s", ck->uri,
                     keys[i], edl_storage_errmsg(ck->bg));
        else
            deleted++;
    }
    if (deleted)
        EDL_DEBUG("checkpoint", "deleted %zu objects of old checkpoints in %s", deleted, ck->uri);
    edl_storage_list_free(keys, n);
    ckpt_pointer_clear(&ptr);
}

/* Advance the pointer to (step, generation); EDL_ECONFLICT when it is already there or beyond. */
static int advance_pointer(edl_ckpt *ck, edl_ckpt_pending *p, const char *dir, char **doc_out)
{
    for (int attempt = 0; attempt < POINTER_TRIES; attempt++) {
        edl_kv *kv;
        ckpt_pointer old;
        int rc = read_pointer(ck, NULL, &kv, &old, p->errmsg, sizeof p->errmsg);
        if (rc != 0 && rc != EDL_ENOTFOUND)
            return rc;
        if (rc == 0 && strcmp(old.entries[0].dir, dir) == 0) {
            /* a reader rebuilt a lost pointer from the store between our manifest and this
             * advance: it names our checkpoint already */
            *doc_out = strndup(kv->value, kv->value_len);
            edl_kv_free(kv);
            ckpt_pointer_clear(&old);
            return *doc_out ? 0 : EDL_ENOMEM;
        }
        if (rc == 0 && old.entries[0].step >= p->step) {
            rc = edl_errf(p->errmsg, sizeof p->errmsg, EDL_ECONFLICT, "checkpoint %s not committed: "
                      "the pointer already names step %" PRId64 " (%s), and steps never go back",
                      dir, old.entries[0].step, old.entries[0].dir);
            edl_kv_free(kv);
            ckpt_pointer_clear(&old);
            return rc;
        }
        char *doc = ckpt_pointer_doc(ck->uri, kv ? &old : NULL, p->step, p->generation, ck->keep);
        edl_txn *t = doc ? edl_txn_new() : NULL;
        if (t) {
            if (kv)
                edl_txn_cmp_mod(t, edl_str(ck->pointer_key), EDL_CMP_EQUAL, kv->mod_revision);
            else
                edl_txn_cmp_create(t, edl_str(ck->pointer_key), EDL_CMP_EQUAL, 0);
            edl_txn_put(t, EDL_TXN_SUCCESS, edl_str(ck->pointer_key), edl_str(doc), NULL);
        }
        edl_kv_free(kv);
        ckpt_pointer_clear(&old);
        if (!t) {
            free(doc);
            return EDL_ENOMEM;
        }
        edl_txn_result res;
        rc = edl_etcd_txn(ck->etcd, t, &res);
        edl_txn_free(t);
        if (rc != 0) {
            free(doc);
            return edl_errf(p->errmsg, sizeof p->errmsg, rc, "checkpoint %s: cannot advance the "
                        "pointer %s: %s", dir, ck->pointer_key, edl_etcd_errmsg(ck->etcd));
        }
        bool ok = res.succeeded;
        edl_txn_result_clear(&res);
        if (ok) {
            *doc_out = doc;
            return 0;
        }
        free(doc); /* someone moved the pointer between our read and our txn: read again */
    }
    return edl_errf(p->errmsg, sizeof p->errmsg, EDL_ECONFLICT, "checkpoint %s: the pointer %s kept "
                "changing under %d attempts", dir, ck->pointer_key, POINTER_TRIES);
}

static int commit(edl_ckpt *ck, edl_ckpt_pending *p, const char *dir)
{
    /* Refuse early, before waiting for other ranks, when a newer checkpoint is committed (a
     * lost pointer is rebuilt here, before this checkpoint's manifest shows in a listing). */
    edl_kv *kv;
    ckpt_pointer old;
    int rc = read_pointer(ck, ck->bg, &kv, &old, p->errmsg, sizeof p->errmsg);
    if (rc != 0 && rc != EDL_ENOTFOUND)
        return rc;
    int64_t cur = rc == 0 ? old.entries[0].step : -1;
    edl_kv_free(kv);
    ckpt_pointer_clear(&old);
    if (cur >= p->step)
        return edl_errf(p->errmsg, sizeof p->errmsg, EDL_ECONFLICT, "checkpoint %s not committed: the "
                    "pointer already names step %" PRId64 ", and steps never go back", dir, cur);

    edl_ckpt_manifest all = {.step = p->step, .generation = p->generation,
                             .world_size = ck->world_size, .metadata_json = p->metadata,
                             .run = ck->run};
    if (!(all.dir = strdup(dir)))
        return EDL_ENOMEM;
    rc = gather_ranks(ck, p, &all);
    if (rc == 0)
        rc = check_sizes(ck, p, &all);
    char *doc = NULL, key[128];
    if (rc == 0 && !(doc = ckpt_manifest_doc(&all)))
        rc = edl_errf(p->errmsg, sizeof p->errmsg, EDL_EINVAL, "checkpoint %s: the metadata is not "
                  "a valid JSON object", dir);
    snprintf(key, sizeof key, "%s/manifest.json", dir);
    if (rc == 0 && (rc = edl_storage_put(ck->bg, key, doc, strlen(doc))) != 0)
        edl_errf(p->errmsg, sizeof p->errmsg, rc, "checkpoint %s: %s", dir, edl_storage_errmsg(ck->bg));
    free(doc);
    all.metadata_json = NULL; /* the pending save's */
    free(all.dir);
    all.dir = NULL;
    for (size_t i = 0; i < all.n_shards; i++)
        free(all.shards[i].name), free(all.shards[i].key);
    free(all.shards);
    if (rc != 0)
        return rc;
    char *ptr = NULL;
    rc = advance_pointer(ck, p, dir, &ptr);
    if (rc == 0) {
        EDL_DEBUG("checkpoint", "committed %s/%s (step %" PRId64 ", generation %" PRId64 ")",
                 ck->uri, dir, p->step, p->generation);
        collect_garbage(ck, ptr, p->step);
    }
    free(ptr);
    return rc;
}

/* ---- the worker ------------------------------------------------------------------------ */

/* The store shows the bytes as it writes them: the digest is taken in the same pass. */
static void digest_observe(void *arg, const void *data, size_t len)
{
    ckpt_hasher_update(arg, data, len); /* fails only without a state, which init excluded */
}

/* Store one shard and record its XXH3-128 digest, computed while it is written. */
static int put_shard(edl_storage *st, const pending_shard *s, edl_ckpt_shard_info *info)
{
    ckpt_hasher h;
    int rc = ckpt_hasher_init(&h, EDL_CKPT_XXH3_128);
    if (rc == 0)
        rc = edl_storage_put_observed(st, info->key, s->data, s->len, digest_observe, &h);
    if (rc == 0)
        rc = ckpt_hasher_final(&h, info->digest);
    info->hash = EDL_CKPT_XXH3_128;
    ckpt_hasher_clear(&h);
    return rc;
}

/* Items 0..n-1 (shards to upload or read), run by up to n_st lanes at once: each lane takes
 * the next item not yet taken and runs fn on it with a store handle of its own; the calling
 * thread is one lane. The first failure stops the items not yet started, and its text (what
 * fn wrote into err) is the one kept. done (may be NULL) runs after each item, one call at a
 * time. */
typedef int (*lane_fn)(void *ctx, edl_storage *st, size_t i, char *err, size_t errlen);
typedef void (*lane_done_fn)(void *ctx, size_t i);

typedef struct lanes {
    lane_fn fn;
    lane_done_fn done;
    void *ctx;
    size_t n;
    pthread_mutex_t mu;
    size_t next;      /* the next item to take */
    int rc;           /* the first failure */
    char *err;        /* its text */
    size_t errlen;
} lanes;

typedef struct lane {
    lanes *ls;
    edl_storage *st;
    pthread_t thread;
} lane;

static void *lane_main(void *arg)
{
    lane *l = arg;
    lanes *ls = l->ls;
    for (;;) {
        pthread_mutex_lock(&ls->mu);
        size_t i = ls->next++;
        bool go = i < ls->n && ls->rc == 0;
        pthread_mutex_unlock(&ls->mu);
        if (!go)
            break;
        char err[1024] = "";
        int rc = ls->fn(ls->ctx, l->st, i, err, sizeof err);
        pthread_mutex_lock(&ls->mu);
        if (rc != 0 && ls->rc == 0) {
            ls->rc = rc;
            snprintf(ls->err, ls->errlen, "%s", err);
        }
        if (ls->done)
            ls->done(ls->ctx, i);
        pthread_mutex_unlock(&ls->mu);
    }
    return NULL;
}

static int run_lanes(edl_storage **st, int n_st, size_t n, lane_fn fn, lane_done_fn done,
                     void *ctx, char *err, size_t errlen)
{
    lanes ls = {.fn = fn, .done = done, .ctx = ctx, .n = n, .err = err, .errlen = errlen};
    lane l[PARALLEL_SHARDS_MAX];
    int k = n < (size_t)n_st ? (int)n : n_st, started = 1;
    if (k == 0)
        return 0;
    pthread_mutex_init(&ls.mu, NULL);
    for (int j = 0; j < k; j++)
        l[j] = (lane){.ls = &ls, .st = st[j]};
    for (; started < k; started++) /* a lane that cannot start leaves its share to the others */
        if (pthread_create(&l[started].thread, NULL, lane_main, &l[started]) != 0)
            break;
    lane_main(&l[0]);
    for (int j = 1; j < started; j++)
        pthread_join(l[j].thread, NULL);
    pthread_mutex_destroy(&ls.mu);
    return ls.rc;
}

/* Uploading a rank's shards. */
typedef struct upload {
    edl_ckpt *ck;
    edl_ckpt_pending *p;
    edl_ckpt_manifest *mine;
} upload;

static int upload_one(void *ctx, edl_storage *st, size_t i, char *err, size_t errlen)
{
    upload *u = ctx;
    int rc = put_shard(st, &u->p->shards[i], &u->mine->shards[i]);
    if (rc != 0)
        edl_errf(err, errlen, rc, "checkpoint %s, rank %d: %s", u->mine->dir, u->ck->rank,
                 edl_storage_errmsg(st));
    return rc;
}

/* Uploaded: a handed-over buffer goes back now (one at a time: a free_fn need not be
 * thread-safe). */
static void upload_done(void *ctx, size_t i)
{
    upload *u = ctx;
    release_shard(&u->p->shards[i]);
}

/* Upload every shard of the save, parallel_shards at a time (the worker is one lane). */
static int upload_shards(edl_ckpt *ck, edl_ckpt_pending *p, edl_ckpt_manifest *mine)
{
    upload u = {.ck = ck, .p = p, .mine = mine};
    return run_lanes(ck->up, ck->n_up, p->n, upload_one, upload_done, &u, p->errmsg,
                     sizeof p->errmsg);
}

/* This rank's part of the save: its shards, then done.json listing them with their digests. */
static int upload_rank(edl_ckpt *ck, edl_ckpt_pending *p, const char *dir)
{
    edl_ckpt_manifest mine = {.step = p->step, .generation = p->generation,
                              .world_size = ck->world_size, .dir = (char *)dir, .run = ck->run};
    mine.shards = calloc(p->n ? p->n : 1, sizeof *mine.shards);
    int rc = mine.shards ? 0 : EDL_ENOMEM;
    for (size_t i = 0; i < p->n && rc == 0; i++) {
        edl_ckpt_shard_info *info = &mine.shards[i];
        info->rank = ck->rank;
        info->index = (int)i;
        info->name = p->shards[i].name;
        info->size = p->shards[i].len;
        if (asprintf(&info->key, "%s/rank-%d/shard-%zu", dir, ck->rank, i) < 0) {
            info->key = NULL;
            rc = EDL_ENOMEM;
            break;
        }
        mine.n_shards++;
    }
    if (rc == 0)
        rc = upload_shards(ck, p, &mine);
    char *doc = rc == 0 ? ckpt_rank_doc(&mine, ck->rank) : NULL;
    if (rc == 0 && !doc)
        rc = EDL_ENOMEM;
    if (rc == 0) {
        char key[128];
        snprintf(key, sizeof key, "%s/rank-%d/done.json", dir, ck->rank);
        if ((rc = edl_storage_put(ck->bg, key, doc, strlen(doc))) != 0)
            edl_errf(p->errmsg, sizeof p->errmsg, rc, "checkpoint %s, rank %d: %s", dir, ck->rank,
                 edl_storage_errmsg(ck->bg));
    }
    free(doc);
    for (size_t i = 0; i < mine.n_shards; i++)
        free(mine.shards[i].key);
    free(mine.shards);
    return rc;
}

static void run_save(edl_ckpt *ck, edl_ckpt_pending *p)
{
    char dir[64];
    ckpt_dir_name(p->step, p->generation, dir, sizeof dir);
    int rc = ckpt_snapshot_wait(p->snap, -1);
    if (rc != 0)
        snprintf(p->errmsg, sizeof p->errmsg, "copying the shards into staging: %s",
                 ckpt_snapshot_errmsg(p->snap));
    else
        rc = upload_rank(ck, p, dir);
    release_stage(p); /* the next save may copy into it while this one commits */
    if (rc == 0 && ck->rank == ck->committer)
        rc = commit(ck, p, dir);
    if (rc != 0 && rc != EDL_ECONFLICT)
        EDL_WARN("checkpoint", "save of step %" PRId64 " failed: %s", p->step, p->errmsg);
    else if (rc == EDL_ECONFLICT)
        EDL_INFO("checkpoint", "%s", p->errmsg);
    pthread_mutex_lock(&p->mu);
    p->rc = rc;
    p->done = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void *worker_main(void *arg)
{
    edl_ckpt *ck = arg;
    pthread_mutex_lock(&ck->mu);
    for (;;) {
        while (!ck->head && !ck->stopping)
            pthread_cond_wait(&ck->cv, &ck->mu);
        edl_ckpt_pending *p = ck->head;
        if (!p)
            break; /* stopping, and the queue is drained */
        ck->head = p->next;
        if (!ck->head)
            ck->tail = NULL;
        pthread_mutex_unlock(&ck->mu);
        run_save(ck, p);
        pending_unref(p);
        pthread_mutex_lock(&ck->mu);
    }
    pthread_mutex_unlock(&ck->mu);
    return NULL;
}

/* ---- load ------------------------------------------------------------------------------ */

typedef struct hash_sink {
    ckpt_hasher h;
    bool keep;        /* read_shard: keep the bytes */
    edl_bytebuf data; /* grown as bytes arrive, never sized from the manifest */
    uint64_t len, max;
} hash_sink;

static int hash_write(void *arg, const void *data, size_t len)
{
    hash_sink *h = arg;
    if (len > h->max - h->len) /* more bytes than the manifest says: stop at once */
        return EDL_ETOOBIG;
    int rc = ckpt_hasher_update(&h->h, data, len);
    if (rc == 0 && h->keep)
        rc = edl_bytebuf_append(&h->data, data, len);
    if (rc == 0)
        h->len += len;
    return rc;
}

/* The digest of bytes already in the caller's buffer, made while they are in cache. */
static void hash_observe(void *arg, const void *data, size_t len)
{
    hash_sink *h = arg;
    ckpt_hasher_update(&h->h, data, len); /* fails only without a state, which init excluded */
    h->len += len;
}

/* Fetch shard s and check its size and digest (whichever algorithm its manifest names) as
 * the bytes arrive; with keep, hand the bytes to the caller in a new buffer; with into, read
 * them straight there (it holds s->size bytes: no copy through a buffer of ours). */
static int fetch_shard(edl_storage *st, const edl_ckpt_shard_info *s, void **keep, void *into,
                       char *err, size_t errlen)
{
    hash_sink h = {.max = s->size, .keep = keep != NULL};
    int rc = ckpt_hasher_init(&h.h, s->hash);
    if (rc == 0 && into)
        rc = edl_storage_get_into(st, s->key, into, (size_t)s->size, hash_observe, &h, NULL);
    else if (rc == 0)
        rc = edl_storage_get_stream(st, s->key, hash_write, &h, NULL);
    if (rc == EDL_ETOOBIG)
        rc = edl_errf(err, errlen, EDL_EPROTO, "shard %s is larger than the %" PRIu64 " bytes its "
                  "manifest lists", s->key, s->size);
    else if (rc == EDL_ENOTFOUND)
        rc = edl_errf(err, errlen, EDL_EPROTO, "shard %s is missing", s->key);
    else if (rc != 0)
        edl_errf(err, errlen, rc, "%s", edl_storage_errmsg(st));
    if (rc == 0 && h.len != s->size)
        rc = edl_errf(err, errlen, EDL_EPROTO, "shard %s holds %" PRIu64 " bytes, its manifest "
                      "lists %" PRIu64, s->key, h.len, s->size);
    char hex[65];
    if (rc == 0 && (rc = ckpt_hasher_final(&h.h, hex)) == 0 && strcmp(hex, s->digest) != 0)
        rc = edl_errf(err, errlen, EDL_EPROTO, "shard %s is corrupt: its %s digest is not the "
                      "one in the manifest", s->key, ckpt_hash_name(s->hash));
    ckpt_hasher_clear(&h.h);
    if (rc == 0 && keep && !h.data.data)
        rc = edl_bytebuf_append(&h.data, "", 0); /* an empty shard is still a buffer */
    if (rc == 0 && keep)
        *keep = h.data.data;
    else
        edl_bytebuf_clear(&h.data);
    return rc;
}

/* Shards read (and verified) by lanes: into the caller's buffers, or only digested (r NULL:
 * every shard of m). The first failure's text goes to err. */
typedef struct shard_reads {
    const edl_ckpt_manifest *m;
    const edl_ckpt_read *r;
} shard_reads;

#define HUGE_PAGE ((uintptr_t)2 << 20)

/* A new tensor's memory is not faulted in yet: the read faults it, 4 KiB at a time, each page
 * zeroed first, which costs as much as the copy itself (256 MiB: ~0.10 s against ~0.03 s in
 * 2 MiB pages, measured). Ask for huge pages over the whole 2 MiB pages inside [p, p + len):
 * advice only, ignored where transparent huge pages are off; memory already faulted stays. */
static void prefer_huge_pages(void *p, size_t len)
{
#ifdef MADV_HUGEPAGE
    uintptr_t start = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    uintptr_t end = ((uintptr_t)p + len) & ~(HUGE_PAGE - 1);
    if (end > start)
        (void)madvise((void *)start, end - start, MADV_HUGEPAGE);
#else
    (void)p;
    (void)len;
#endif
}

static int read_one(void *ctx, edl_storage *st, size_t i, char *err, size_t errlen)
{
    shard_reads *rd = ctx;
    const edl_ckpt_shard_info *s = &rd->m->shards[rd->r ? rd->r[i].index : i];
    if (rd->r && s->size)
        prefer_huge_pages(rd->r[i].dst, (size_t)s->size);
    return fetch_shard(st, s, NULL, rd->r ? rd->r[i].dst : NULL, err, errlen);
}

static int read_lanes(edl_ckpt *ck, const edl_ckpt_manifest *m, const edl_ckpt_read *r,
                      size_t n, char *err, size_t errlen)
{
    shard_reads rd = {.m = m, .r = r};
    return run_lanes(ck->down, ck->n_up, n, read_one, NULL, &rd, err, errlen);
}

/* Load and verify one committed checkpoint. EDL_EPROTO (with why) when it is incomplete or
 * corrupt; other codes when the store could not be asked. */
static int load_one(edl_ckpt *ck, const ckpt_pointer_entry *e, edl_ckpt_manifest **out, char *why,
                    size_t whylen)
{
    char key[128];
    void *doc;
    size_t len;
    snprintf(key, sizeof key, "%s/manifest.json", e->dir);
    int rc = edl_storage_get(ck->fg, key, CKPT_MAX_DOC, &doc, &len);
    if (rc == EDL_ENOTFOUND || rc == EDL_ETOOBIG)
        return edl_errf(why, whylen, EDL_EPROTO, "%s/%s is %s", ck->uri, key,
                    rc == EDL_ENOTFOUND ? "missing" : "too large");
    if (rc != 0)
        return edl_errf(why, whylen, rc, "%s", edl_storage_errmsg(ck->fg));
    edl_ckpt_manifest *m;
    char perr[256];
    rc = edl_ckpt_manifest_parse(doc, len, &m, perr, sizeof perr);
    free(doc);
    if (rc == EDL_EPROTO)
        return edl_errf(why, whylen, rc, "%s/%s: %s", ck->uri, key, perr);
    if (rc != 0)
        return rc;
    if (m->step != e->step || m->generation != e->generation)
        rc = edl_errf(why, whylen, EDL_EPROTO, "%s/%s is for another step or generation", ck->uri, key);
    if (rc == 0 && ck->verify)
        rc = read_lanes(ck, m, NULL, m->n_shards, why, whylen);
    for (size_t i = 0; rc == 0 && !ck->verify && i < m->n_shards; i++) {
        edl_storage_stat st;
        rc = edl_storage_stat_key(ck->fg, m->shards[i].key, &st);
        if (rc == EDL_ENOTFOUND)
            rc = edl_errf(why, whylen, EDL_EPROTO, "shard %s is missing", m->shards[i].key);
        else if (rc != 0)
            edl_errf(why, whylen, rc, "%s", edl_storage_errmsg(ck->fg));
        else if (st.size != m->shards[i].size)
            rc = edl_errf(why, whylen, EDL_EPROTO, "shard %s holds %" PRIu64 " bytes, its manifest "
                      "lists %" PRIu64, m->shards[i].key, st.size, m->shards[i].size);
    }
    if (rc != 0) {
        edl_ckpt_manifest_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* The pointer's newest `bad` entries are corrupt (their load failed for good): drop them, so
 * that the lineage goes on from the checkpoint that was loaded and saves after it commit again
 * (else every save up to the corrupt one's step would be refused as "going back"). A txn on
 * the revision that was read: when the pointer moved meanwhile (a newer commit), it stays. */
static void drop_corrupt(edl_ckpt *ck, const edl_kv *kv, const ckpt_pointer *ptr, size_t bad)
{
    ckpt_pointer rest = {.entries = ptr->entries + bad + 1, .n = ptr->n - bad - 1};
    const ckpt_pointer_entry *good = &ptr->entries[bad];
    char *doc = ckpt_pointer_doc(ck->uri, &rest, good->step, good->generation, ck->keep);
    edl_txn *t = doc ? edl_txn_new() : NULL;
    edl_txn_result res = {0};
    int rc = t ? 0 : EDL_ENOMEM;
    if (!rc) {
        edl_txn_cmp_mod(t, edl_str(ck->pointer_key), EDL_CMP_EQUAL, kv->mod_revision);
        edl_txn_put(t, EDL_TXN_SUCCESS, edl_str(ck->pointer_key), edl_str(doc), NULL);
        rc = edl_etcd_txn(ck->etcd, t, &res);
    }
    if (!rc && res.succeeded)
        EDL_WARN("checkpoint", "%zu corrupt checkpoint%s dropped from the pointer: it names %s "
                 "(step %" PRId64 ") again, and saves after that step commit", bad,
                 bad == 1 ? "" : "s", good->dir, good->step);
    else
        EDL_INFO("checkpoint", "the corrupt checkpoints stay in the pointer (%s)",
                 rc ? edl_etcd_errmsg(ck->etcd) : "it changed meanwhile");
    edl_txn_result_clear(&res);
    edl_txn_free(t);
    free(doc);
}

/* Load the newest intact checkpoint among ptr's entries from `first` on, falling back over
 * corrupt ones (dropped from the pointer once an older one loads). EDL_EPROTO when none is
 * intact (errmsg lists why each failed); a store's or etcd's error as it is. */
static int load_from(edl_ckpt *ck, const edl_kv *kv, const ckpt_pointer *ptr, size_t first,
                     edl_ckpt_manifest **out)
{
    size_t used = 0;
    int rc = EDL_EPROTO;
    ck->errmsg[0] = '\0';
    for (size_t i = first; i < ptr->n; i++) {
        char why[512];
        rc = load_one(ck, &ptr->entries[i], out, why, sizeof why);
        if (rc == 0) {
            (*out)->skipped = (int)i;
            if (i > 0)
                drop_corrupt(ck, kv, ptr, i);
            break;
        }
        if (rc != EDL_EPROTO) { /* the store cannot be asked: no verdict on the checkpoint */
            edl_errf(ck->errmsg, sizeof ck->errmsg, rc, "cannot load checkpoint %s: %s",
                 ptr->entries[i].dir, why);
            break;
        }
        if (i + 1 < ptr->n)
            EDL_WARN("checkpoint", "checkpoint %s (step %" PRId64 ") is incomplete or corrupt: "
                     "%s; falling back to %s (step %" PRId64 ")", ptr->entries[i].dir,
                     ptr->entries[i].step, why, ptr->entries[i + 1].dir, ptr->entries[i + 1].step);
        else
            EDL_WARN("checkpoint", "checkpoint %s (step %" PRId64 ") is incomplete or corrupt: "
                     "%s; no older checkpoint is kept", ptr->entries[i].dir, ptr->entries[i].step,
                     why);
        used += (size_t)snprintf(ck->errmsg + used, sizeof ck->errmsg - used, "%s%s: %s",
                                 used ? "; " : "no intact checkpoint: ", ptr->entries[i].dir, why);
        if (used >= sizeof ck->errmsg)
            used = sizeof ck->errmsg - 1;
    }
    return rc;
}

int edl_ckpt_load_latest(edl_ckpt *ck, edl_ckpt_manifest **out)
{
    if (!ck || !out)
        return EDL_EINVAL;
    *out = NULL;
    edl_kv *kv;
    ckpt_pointer ptr;
    int rc = read_pointer(ck, ck->fg, &kv, &ptr, ck->errmsg, sizeof ck->errmsg);
    if (rc == EDL_ENOTFOUND)
        return edl_errf(ck->errmsg, sizeof ck->errmsg, rc, "job %s has no committed checkpoint "
                    "(%s is absent and %s holds none): start from scratch", ck->job,
                    ck->pointer_key, ck->uri);
    if (rc != 0)
        return rc;
    rc = load_from(ck, kv, &ptr, 0, out);
    edl_kv_free(kv);
    ckpt_pointer_clear(&ptr);
    return rc;
}

int edl_ckpt_load_older(edl_ckpt *ck, int64_t step, edl_ckpt_manifest **out)
{
    if (!ck || !out)
        return EDL_EINVAL;
    *out = NULL;
    edl_kv *kv;
    ckpt_pointer ptr;
    int rc = read_pointer(ck, ck->fg, &kv, &ptr, ck->errmsg, sizeof ck->errmsg);
    if (rc != 0)
        return rc;
    size_t i = 0;
    while (i < ptr.n && ptr.entries[i].step >= step)
        i++;
    if (i == ptr.n)
        rc = edl_errf(ck->errmsg, sizeof ck->errmsg, EDL_ENOTFOUND, "job %s keeps no committed "
                      "checkpoint older than step %" PRId64, ck->job, step);
    else
        rc = load_from(ck, kv, &ptr, i, out);
    edl_kv_free(kv);
    ckpt_pointer_clear(&ptr);
    return rc;
}

int edl_ckpt_read_shard(edl_ckpt *ck, const edl_ckpt_manifest *m, size_t i, void **data,
                        size_t *len)
{
    if (!ck || !m || !data || !len || i >= m->n_shards)
        return EDL_EINVAL;
    *data = NULL;
    *len = 0;
    int rc = fetch_shard(ck->fg, &m->shards[i], data, NULL, ck->errmsg, sizeof ck->errmsg);
    if (rc == 0)
        *len = (size_t)m->shards[i].size;
    return rc;
}

int edl_ckpt_read_shard_into(edl_ckpt *ck, const edl_ckpt_manifest *m, size_t i, void *dst,
                             size_t cap)
{
    edl_ckpt_read one = {.index = i, .dst = dst, .cap = cap};
    return edl_ckpt_read_shards_into(ck, m, &one, 1);
}

int edl_ckpt_read_shards_into(edl_ckpt *ck, const edl_ckpt_manifest *m,
                              const edl_ckpt_read *reads, size_t n)
{
    if (!ck || !m || (n && !reads))
        return EDL_EINVAL;
    for (size_t k = 0; k < n; k++) {
        const edl_ckpt_shard_info *s = reads[k].index < m->n_shards ? &m->shards[reads[k].index]
                                                                     : NULL;
        if (!s || (!reads[k].dst && s->size))
            return edl_errf(ck->errmsg, sizeof ck->errmsg, EDL_EINVAL, "read %zu: no shard %zu "
                            "in the manifest, or no buffer", k, reads[k].index);
        if (s->size > reads[k].cap)
            return edl_errf(ck->errmsg, sizeof ck->errmsg, EDL_ETOOBIG, "shard %s holds %" PRIu64
                            " bytes, more than the %zu of the buffer given", s->key, s->size,
                            reads[k].cap);
    }
    return read_lanes(ck, m, reads, n, ck->errmsg, sizeof ck->errmsg);
}

long edl_ckpt_find_shard(const edl_ckpt_manifest *m, int rank, int index)
{
    for (size_t i = 0; m && i < m->n_shards; i++)
        if (m->shards[i].rank == rank && m->shards[i].index == index)
            return (long)i;
    return -1;
}

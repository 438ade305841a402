/* edl/checkpoint.h: checkpoints on remote storage that elastic pods save and reload.
 *
 * A checkpoint is a directory <uri>/ckpt-<step>-g<generation>/ of shards plus a manifest
 * (manifest.json: step, generation, world size, every shard with its size and digest, the
 * caller's metadata). A shard's digest is XXH3-128, computed while its bytes are written (and
 * checked while they are read); checkpoints written before XXH3 carry SHA-256 and still
 * load. A checkpoint becomes visible only when the pointer <prefix>/jobs/<job>/checkpoint in
 * etcd is advanced by a txn that refuses to go backwards in step; so no crash at any moment
 * leaves the job without a complete checkpoint.
 *
 * The pointer only speeds up finding them: when it is absent (the job run again after its etcd
 * keys went: a new `edl run`, a TrainingJob deleted and applied again, an etcd that lost its
 * data) or names another URI, the first load or commit rebuilds it from a listing of the URI
 * (the ckpt-* directories that hold a manifest.json, newest first, `keep` of them) and seeds
 * it with a create-if-absent txn, so all ranks agree. The job then goes on from the newest of
 * them: it loads as below, and its saves continue the step series (a save at a step at or
 * below the newest checkpoint's is refused, EDL_ECONFLICT, as ever), so retention deletes an
 * earlier run's checkpoints only once newer complete ones are committed.
 *
 * Save (every rank, concurrently):
 *   1. the rank uploads its shards to ckpt-<step>-g<gen>/rank-<r>/shard-<i>,
 *   2. then rank-<r>/done.json listing them with sizes and checksums;
 *   3. the committer (rank 0 unless configured) waits for all world_size done.json objects,
 *      checks them and the shards' sizes, writes manifest.json, then advances the pointer,
 *      and deletes checkpoints older than the newest `keep`.
 * The caller's buffers are copied (or handed over) and uploaded by a background thread; the
 * caller is blocked only for the copy, into staging memory that the handle keeps and reuses
 * (allocated and faulted once), made by several threads at memory speed, and learns the
 * outcome from edl_ckpt_wait(). With snapshot_in_background it is not blocked even for the
 * copy: the copy overlaps the caller's next forward and backward passes (as CheckFreq
 * pipelines its snapshot), and edl_ckpt_snapshot_wait() before the optimizer writes the
 * buffers is the only wait. CUDA device buffers are staged through pinned host memory with
 * asynchronous copies (edl_ckpt_shard.device).
 *
 * Load: follow the pointer, read the manifest, verify every shard's size and (by default)
 * digest; when the newest is incomplete or corrupt, fall back to the previous committed one
 * (the pointer keeps the last `keep`) with a warning in the log. Any rank may read any shard:
 * loading in another world size than the save is the caller's re-sharding choice. */
#ifndef EDL_CHECKPOINT_H
#define EDL_CHECKPOINT_H

#include <stdbool.h>
#include <stdint.h>

#include "edl/common.h"
#include "edl/etcd.h"
#include "edl/storage.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct edl_ckpt edl_ckpt;

typedef struct edl_ckpt_config {
    const char *uri;          /* required: where checkpoints live (EDL_CHECKPOINT_URI) */
    edl_etcd *etcd;           /* required: holds the pointer; borrowed, must outlive the ckpt */
    const char *prefix;       /* etcd key prefix (NULL: "/edl/v1") */
    const char *job;          /* required: job id (EDL_JOB_ID); letters, digits, "._-" */
    int rank;                 /* this process's rank (EDL_RANK) */
    int world_size;           /* ranks that save each checkpoint (EDL_WORLD_SIZE) */
    int committer_rank;       /* the rank that writes the manifest and the pointer (0) */
    int keep;                 /* committed checkpoints kept, older ones deleted (3; >= 1) */
    int64_t commit_timeout_ms; /* how long the committer waits for other ranks' shards (600000) */
    bool verify_on_load;      /* digest every shard in edl_ckpt_load_latest (true by init) */
    int parallel_shards;      /* a rank's shards uploaded (and read, and verified) at once, each
                                 through a store handle of its own (4; 0 means 4; 1: one after
                                 another; <= 64) */
    const edl_storage_config *storage; /* options for the store (NULL: defaults + AWS_* env);
                                          its uri field is ignored; a multipart_threshold of 0
                                          becomes 1 GiB: one PUT per shard, several shards in
                                          flight, up to that size */
    int copy_threads;         /* threads copying shards into staging (0: the CPUs this process
                                 may use, at most 8; the calling thread is one of them) */
    const char *run;          /* the run of the job this process is part of (EDL_RUN_ID, which
                                 the agent sets; NULL: read from the environment; "" or unset:
                                 none): each rank names it in its done.json, and the committer
                                 takes only done.json files of its own run, so a save that an
                                 earlier run left half done at the same step and generation
                                 never lends its files to this one (at most 63 characters) */
    bool snapshot_in_background; /* false: edl_ckpt_save_async returns once the copied shards
                                    are copied. true: it returns at once and the copy runs on
                                    the checkpoint's threads; the caller may read its buffers
                                    but must not write them before edl_ckpt_snapshot_wait() */
} edl_ckpt_config;

void edl_ckpt_config_init(edl_ckpt_config *cfg);

/* Validate the config and open the store (a handle for the caller's thread and one for each
 * upload in flight). errbuf (may be NULL) receives the reason of a failure. */
int edl_ckpt_open(const edl_ckpt_config *cfg, edl_ckpt **out, char *errbuf, size_t errlen);
/* Waits for every queued save to finish (they keep their own deadlines), then frees. */
void edl_ckpt_close(edl_ckpt *ck);
/* What the last failed call on the caller's side (open aside) did wrong. Never NULL. */
const char *edl_ckpt_errmsg(const edl_ckpt *ck);

/* ---- save ------------------------------------------------------------------------------ */

typedef struct edl_ckpt_shard {
    const char *name;   /* the caller's label ("model", "optim"; may be NULL): "._-" letters */
    const void *data;
    size_t len;
    /* NULL: the data is copied (into the handle's staging memory) before edl_ckpt_save_async
     * returns, or after it with snapshot_in_background (see edl_ckpt_snapshot_wait);
     * edl_ckpt_save lends host data instead (no copy). Otherwise the checkpoint takes the
     * buffer as it is (no copy) and calls free_fn(data, free_arg) once uploaded (from one of
     * its upload threads, one call at a time); the caller must not touch it in between. */
    void (*free_fn)(void *data, void *arg);
    void *free_arg;
    /* data is CUDA device memory: it is always copied, with cudaMemcpyAsync into pinned staging
     * on a stream of the checkpoint's (free_fn must be NULL). The copy waits for nothing the
     * caller queued on its own streams: synchronize them (or the device) before saving. Fails
     * with EDL_ENOTSUP in a build without CUDA, EDL_EUNAVAIL where no CUDA runtime or device
     * answers. */
    bool device;
} edl_ckpt_shard;

typedef struct edl_ckpt_pending edl_ckpt_pending;

/* Queue this rank's part of checkpoint `step` (saves run one after another, in order).
 * metadata_json (may be NULL) must be a JSON object; it is stored in the manifest by the
 * committer (other ranks' metadata is ignored). Returns at once with a handle to wait on. */
int edl_ckpt_save_async(edl_ckpt *ck, int64_t step, int64_t generation, const edl_ckpt_shard *shards,
                        size_t n_shards, const char *metadata_json, edl_ckpt_pending **out);
/* Wait up to timeout_ms (-1: for ever) for the save. Returns the save's outcome, or
 * EDL_ETIMEDOUT while it is still running (wait again later). Outcomes:
 *   0               this rank's shards are stored; on the committer, the pointer now names
 *                   this checkpoint;
 *   EDL_ECONFLICT   the pointer already names a checkpoint of this step or a later one (a
 *                   newer writer won); nothing was changed;
 *   EDL_ETIMEDOUT   the committer gave up waiting for the other ranks (commit_timeout_ms);
 *   others          from the store or etcd; edl_ckpt_save_errmsg() says what and where. */
int edl_ckpt_wait(edl_ckpt_pending *sv, int64_t timeout_ms);
/* Wait up to timeout_ms (-1: for ever) until every copied shard of the save is in staging:
 * from then on the caller may write its buffers again. 0 at once for a save that copied
 * nothing or copied before edl_ckpt_save_async returned; EDL_ETIMEDOUT while copying; the
 * save's error when the copy failed (the save then fails too). */
int edl_ckpt_snapshot_wait(edl_ckpt_pending *sv, int64_t timeout_ms);
/* Nonzero once the save is finished (never blocks). */
bool edl_ckpt_save_done(edl_ckpt_pending *sv);
const char *edl_ckpt_save_errmsg(edl_ckpt_pending *sv); /* valid once done, until freed */
/* Release the handle; a save still running goes on and frees itself when finished. */
void edl_ckpt_save_free(edl_ckpt_pending *sv);
/* Save and wait: edl_ckpt_save_async + edl_ckpt_wait(-1) + free; errmsg via edl_ckpt_errmsg.
 * Host shards are not copied: the caller's buffers are used as they are until it returns. */
int edl_ckpt_save(edl_ckpt *ck, int64_t step, int64_t generation, const edl_ckpt_shard *shards,
                  size_t n_shards, const char *metadata_json);

/* Allocate and fault in staging memory for `bytes` of copied shards now, so that not even the
 * first edl_ckpt_save_async pays for it (optional: a save allocates what it lacks). Every page
 * is written, which takes longer than a save's own fault-in but leaves nothing for the first
 * copy, even where a virtual machine's host backs memory lazily. Staging is
 * kept until edl_ckpt_close and reused by every later save that fits; a save queued while
 * another still uploads from it gets a second area, also kept. */
int edl_ckpt_stage_reserve(edl_ckpt *ck, size_t bytes);

/* ---- load ------------------------------------------------------------------------------ */

/* How a shard's bytes are checked. */
typedef enum edl_ckpt_hash {
    EDL_CKPT_XXH3_128 = 0, /* "xxh3-128": every new checkpoint */
    EDL_CKPT_SHA256,       /* "sha256": checkpoints written before XXH3 (loaded, not written) */
} edl_ckpt_hash;

typedef struct edl_ckpt_shard_info {
    int rank;             /* the rank that saved it */
    int index;            /* its position in that rank's shard list */
    char *name;           /* the caller's label ("" when none) */
    char *key;            /* storage key, relative to the URI */
    uint64_t size;
    edl_ckpt_hash hash;   /* the algorithm of digest */
    char digest[65];      /* lowercase hex: 32 digits (XXH3-128) or 64 (SHA-256) */
} edl_ckpt_shard_info;

typedef struct edl_ckpt_manifest {
    int64_t step;
    int64_t generation;
    int world_size;
    char *dir;            /* "ckpt-<step>-g<generation>" */
    char *metadata_json;  /* the saver's metadata ("{}" when none) */
    char *run;            /* the run that saved it (edl_ckpt_config.run; NULL: none named) */
    edl_ckpt_shard_info *shards; /* ordered by rank, then index */
    size_t n_shards;
    int skipped;          /* newer committed checkpoints that were corrupt and passed over */
} edl_ckpt_manifest;

/* The newest complete checkpoint. EDL_ENOTFOUND when the job has none (start from scratch);
 * EDL_EPROTO when checkpoints are committed but none is complete and intact (the message
 * lists why each failed). Store or etcd errors (EDL_EUNAVAIL, EDL_EAUTH, ...) are returned as
 * they are: the caller keeps its in-memory state and may try again. */
int edl_ckpt_load_latest(edl_ckpt *ck, edl_ckpt_manifest **out);
void edl_ckpt_manifest_free(edl_ckpt_manifest *m);
/* The newest complete checkpoint older than step: for a caller that found step's checkpoint
 * malformed in a way only it can see (edl.checkpoint's structure shard). The newer ones are
 * dropped from the pointer as corrupt ones are by load_latest. EDL_ENOTFOUND when none older
 * is kept; EDL_EPROTO when none older is intact (the message says why the last failed). */
int edl_ckpt_load_older(edl_ckpt *ck, int64_t step, edl_ckpt_manifest **out);


/* Read shard i of m into a new buffer (caller frees), checking its size and digest
 * (EDL_EPROTO when they do not match). */
int edl_ckpt_read_shard(edl_ckpt *ck, const edl_ckpt_manifest *m, size_t i, void **data,
                        size_t *len);
/* Read shard i of m into the caller's buffer of cap bytes (a model's own memory, allocated
 * once: no page faults, no copy out of a new buffer), checking size and digest as the bytes
 * arrive. EDL_ETOOBIG when the shard is larger than cap (nothing read); after EDL_EPROTO the
 * buffer holds whatever arrived. */
int edl_ckpt_read_shard_into(edl_ckpt *ck, const edl_ckpt_manifest *m, size_t i, void *dst,
                             size_t cap);
/* Several shards at once, each into its own buffer: parallel_shards of them read at a time,
 * each through a store handle of its own (as saves upload them). 0, or the first failure
 * (edl_ckpt_errmsg names the shard); every index and size is checked before anything is read. */
typedef struct edl_ckpt_read {
    size_t index; /* the shard's index in the manifest */
    void *dst;
    size_t cap;
} edl_ckpt_read;
int edl_ckpt_read_shards_into(edl_ckpt *ck, const edl_ckpt_manifest *m,
                              const edl_ckpt_read *reads, size_t n);
/* The index in m of the shard (rank, index), or -1. */
long edl_ckpt_find_shard(const edl_ckpt_manifest *m, int rank, int index);

/* ---- starting over ------------------------------------------------------------------------ */

/* Move the job's checkpoints aside on purpose (edl run --fresh): delete the pointer, then
 * rename every ckpt-* directory of cfg->uri into <uri>/previous-<UTC time>/ (named in where,
 * may be NULL), which no listing finds; *moved: the directories moved. Only file:// URIs:
 * EDL_ENOTSUP (with what to do in err) for others. Needs uri, etcd, prefix and job of cfg. */
int edl_ckpt_set_aside(const edl_ckpt_config *cfg, char *where, size_t wherelen, size_t *moved,
                       char *err, size_t errlen);

/* Parse and validate a manifest (what load does with manifest.json): exposed for tests and
 * tools. EDL_EPROTO with a reason in errbuf for anything malformed or hostile. */
int edl_ckpt_manifest_parse(const char *json, size_t len, edl_ckpt_manifest **out, char *errbuf,
                            size_t errlen);

#ifdef __cplusplus
}
#endif
#endif

/* checkpoint_internal.h: the JSON documents of a checkpoint (checkpoint_docs.c) as
 * checkpoint.c uses them: the per-rank shard list, the manifest and the etcd pointer. */
#ifndef EDL_CHECKPOINT_INTERNAL_H
#define EDL_CHECKPOINT_INTERNAL_H

#include "edl/checkpoint.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <xxhash.h>

/* The documents this code writes (shards with "hash" and "digest"), and those of checkpoints
 * written before XXH3 (shards with "sha256"), which it still reads. */
#define CKPT_FORMAT "edl-checkpoint/2"
#define CKPT_RANK_FORMAT "edl-checkpoint-rank/2"
#define CKPT_FORMAT_V1 "edl-checkpoint/1"
#define CKPT_RANK_FORMAT_V1 "edl-checkpoint-rank/1"
#define CKPT_MAX_STEP 9007199254740991LL  /* 2^53 - 1: exact in every JSON reader */
#define CKPT_MAX_RUN 63                    /* characters of a run's name (EDL_RUN_ID) */
#define CKPT_MAX_WORLD 65536
#define CKPT_MAX_SHARDS 1000000
#define CKPT_MAX_SHARD_SIZE (1ULL << 50)   /* 1 PiB: anything larger is a hostile manifest */
#define CKPT_MAX_DOC (64u << 20)           /* manifest, rank list and pointer documents */

/* "ckpt-<step, 16 digits>-g<generation>" */
void ckpt_dir_name(int64_t step, int64_t generation, char *out, size_t len);
/* Parse a directory name back; false when it is not one of ours. */
bool ckpt_dir_parse(const char *name, size_t len, int64_t *step, int64_t *generation);

/* One rank's shards (done.json) or the whole manifest: both hold a manifest structure. */
/* The store settings of cfg: its storage options (defaults and AWS_* without), at its uri. */
edl_storage_config ckpt_store_config(const edl_ckpt_config *cfg);
char *ckpt_rank_doc(const edl_ckpt_manifest *m, int rank);
int ckpt_rank_doc_parse(const char *json, size_t len, int rank, const edl_ckpt_manifest *expect,
                        edl_ckpt_manifest **out, char *err, size_t errlen);
char *ckpt_manifest_doc(const edl_ckpt_manifest *m);

/* The pointer: the newest committed checkpoint first, then older ones still kept. */
typedef struct ckpt_pointer_entry {
    int64_t step;
    int64_t generation;
    char dir[64];
} ckpt_pointer_entry;

typedef struct ckpt_pointer {
    ckpt_pointer_entry *entries; /* newest first; n >= 1 */
    size_t n;
    char *uri; /* the URI it was written for (NULL: the document names none) */
} ckpt_pointer;

int ckpt_pointer_parse(const char *json, size_t len, ckpt_pointer *p, char *err, size_t errlen);
/* The pointer after committing (step, generation): the new entry, then up to keep - 1 older
 * ones from old (may be NULL). */
char *ckpt_pointer_doc(const char *uri, const ckpt_pointer *old, int64_t step, int64_t generation,
                       int keep);
void ckpt_pointer_clear(ckpt_pointer *p);
/* The pointer rebuilt from a listing of the store (checkpoint_recover.c): its complete
 * checkpoints (ckpt-<step>-g<gen>/ with a manifest.json), newest first, keep of them, as a
 * new document in *doc; *newest and *found (how many the store holds) say what it found.
 * EDL_ENOTFOUND when the store holds none; a store error (in err). */
int ckpt_pointer_from_store(edl_storage *st, const char *uri, int keep, char **doc,
                            ckpt_pointer_entry *newest, size_t *found, char *err, size_t errlen);

/* Digests of shards (checkpoint_hash.c): "xxh3-128" for new checkpoints, "sha256" for old. */
const char *ckpt_hash_name(edl_ckpt_hash alg);
size_t ckpt_hash_hex_len(edl_ckpt_hash alg);
bool ckpt_hash_parse(const char *name, edl_ckpt_hash *alg);

/* A digest computed as bytes stream by: init, update (any number of times), final (lowercase
 * hex of ckpt_hash_hex_len digits), clear (also after a failed init). */
typedef struct ckpt_hasher {
    edl_ckpt_hash alg;
    XXH3_state_t *xxh;
    EVP_MD_CTX *md;
} ckpt_hasher;

int ckpt_hasher_init(ckpt_hasher *h, edl_ckpt_hash alg);
int ckpt_hasher_update(ckpt_hasher *h, const void *data, size_t len);
int ckpt_hasher_final(ckpt_hasher *h, char out[65]);
void ckpt_hasher_clear(ckpt_hasher *h);

/* Staging memory for copied shards (checkpoint_stage.c): areas kept by a handle, mapped and
 * faulted in once, reused by later saves. take: a free area of at least bytes, busy until
 * given back, its memory in *mem (NULL without memory); give: free again (NULL is fine). */
typedef struct ckpt_stage ckpt_stage;
typedef struct ckpt_stages {
    pthread_mutex_t mu;
    ckpt_stage *list;
} ckpt_stages;

void ckpt_stages_init(ckpt_stages *st);
ckpt_stage *ckpt_stage_take(ckpt_stages *st, size_t bytes, bool every_page, char **mem);
void ckpt_stage_give(ckpt_stages *st, ckpt_stage *a);
void ckpt_stages_clear(ckpt_stages *st); /* every area given back */
/* Pin a busy area for CUDA's asynchronous copies (once: it stays pinned while it is kept). */
int ckpt_stage_pin(ckpt_stage *a, char *err, size_t errlen);

/* The snapshot of a save (checkpoint_copy.c): copies into staging, the host ones split over
 * threads, the device ones queued on a CUDA stream. start takes copies (an array from malloc,
 * freed with the snapshot, or at once when no snapshot could be made); in the foreground it
 * returns once everything is copied (or failed), in the background at once. *out is set
 * whenever a snapshot was made, even when start then fails (free it). wait: 0, EDL_ETIMEDOUT,
 * or the copy's error (errmsg says what). free: joins the copying threads first. */
typedef struct ckpt_copy {
    char *dst;
    const void *src;
    size_t len;
    bool device;
} ckpt_copy;

typedef struct ckpt_snapshot ckpt_snapshot;
int ckpt_snapshot_start(ckpt_copy *copies, size_t n, int threads, bool background,
                        ckpt_snapshot **out, char *err, size_t errlen);
int ckpt_snapshot_wait(ckpt_snapshot *s, int64_t timeout_ms);
const char *ckpt_snapshot_errmsg(const ckpt_snapshot *s);
void ckpt_snapshot_free(ckpt_snapshot *s);

/* CUDA (checkpoint_cuda.c; the runtime is loaded at first use). copy_async queues a device to
 * host copy on *stream (created on first use); sync waits for the stream; EDL_ENOTSUP in a
 * build without CUDA, EDL_EUNAVAIL without a runtime or a device. */
int ckpt_cuda_copy_async(void **stream, void *dst, const void *src, size_t len, char *err,
                         size_t errlen);
int ckpt_cuda_sync(void *stream, char *err, size_t errlen);
void ckpt_cuda_stream_free(void *stream);
int ckpt_cuda_pin(void *mem, size_t len, char *err, size_t errlen);
void ckpt_cuda_unpin(void *mem);

#endif

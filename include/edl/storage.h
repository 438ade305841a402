/* edl/storage.h: one API over the remote stores that checkpoints live on.
 *
 *   file:///path          a shared filesystem (a Kubernetes PersistentVolume: NFS, CephFS).
 *                          Every put is atomic: temporary file, fsync, rename, fsync of the
 *                          directory, so a reader sees the old object or the whole new one.
 *                          Write-back is streamed in 8 MiB windows, dropped from the page
 *                          cache behind the writer.
 *   s3://bucket[/prefix]   any S3-compatible store (AWS S3, MinIO, Ceph RGW) through libcurl,
 *                          signed with libcurl's own AWS SigV4 (CURLOPT_AWS_SIGV4). Large
 *                          objects go up as multipart uploads whose parts are sent concurrently
 *                          (the upload is aborted on failure); 5xx replies and connection errors
 *                          are retried with exponential back-off.
 *
 * Keys are relative to the URI's root ("ckpt-1/rank-0/shard-0"): letters, digits and "._-",
 * segments joined by "/", no empty, "." or ".." segment, at most 512 bytes.
 *
 * A handle is used by one thread at a time (open one per thread); edl_storage_errmsg() then
 * says what the last failed call did wrong: the URI, the key, the server's own error code. */
#ifndef EDL_STORAGE_H
#define EDL_STORAGE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "edl/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct edl_storage edl_storage;

typedef enum edl_s3_addressing {
    EDL_S3_AUTO = 0,  /* path style with a custom endpoint (MinIO needs it), else virtual host */
    EDL_S3_PATH,      /* http://endpoint/bucket/key */
    EDL_S3_VIRTUAL,   /* http://bucket.endpoint/key */
} edl_s3_addressing;

typedef struct edl_storage_config {
    const char *uri;               /* required: file:///abs/path or s3://bucket[/prefix] */
    /* s3 only. NULL fields are taken from the standard AWS environment variables when the
     * handle is opened: AWS_ENDPOINT_URL_S3, then AWS_ENDPOINT_URL (default
     * https://s3.<region>.amazonaws.com); AWS_REGION, then AWS_DEFAULT_REGION (default
     * us-east-1); AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN. */
    const char *endpoint;
    const char *region;
    const char *access_key_id;
    const char *secret_access_key;
    const char *session_token;
    edl_s3_addressing addressing;  /* EDL_S3_AUTO; env EDL_S3_ADDRESSING=path|virtual too */
    int64_t timeout_ms;            /* one HTTP request, transfer included (300000) */
    int64_t connect_timeout_ms;    /* one connection attempt (3000) */
    int max_retries;               /* retries of one request after a 5xx or a network error (4) */
    int64_t retry_base_ms;         /* first back-off, doubled each retry, jittered (200) */
    size_t part_size;              /* a multipart upload's parts (16 MiB; at least 5 MiB,
                                      S3's minimum) */
    size_t multipart_threshold;    /* a buffer larger than this goes up in parts, a smaller
                                      one in one PUT (0: part_size; at most 5 GiB, S3's
                                      largest PUT); a stream goes in parts past part_size */
    int parallel_parts;            /* parts in flight at once (4) */
} edl_storage_config;

/* Defaults; uri and the s3 fields NULL. */
void edl_storage_config_init(edl_storage_config *cfg);

/* Parse the URI and prepare the back end. Nothing is contacted yet: the first call that
 * needs the store reports unreachable stores and bad credentials (EDL_EUNAVAIL, EDL_EAUTH).
 * EDL_EINVAL for a URI that is not file:///... or s3://bucket/...; EDL_ECONFIG when an s3
 * URI has no credentials anywhere. errbuf (may be NULL) receives the reason. */
int edl_storage_open(const edl_storage_config *cfg, edl_storage **out, char *errbuf,
                     size_t errlen);
void edl_storage_close(edl_storage *s);
/* What the last failed call on this handle did wrong. Never NULL. */
const char *edl_storage_errmsg(const edl_storage *s);
/* The URI the handle was opened with. */
const char *edl_storage_uri(const edl_storage *s);

/* Store len bytes under key, replacing any object there. */
int edl_storage_put(edl_storage *s, const char *key, const void *data, size_t len);

/* Sees the bytes of a put once each, in order, as they are written or sent: a digest computed
 * in the same pass as the write, not in a second pass over the buffer. */
typedef void (*edl_storage_observe_fn)(void *arg, const void *buf, size_t len);
/* edl_storage_put that shows every byte to observe (may be NULL) just before it is written
 * (file://, in pieces of 1 MiB) or first sent (s3://, one part at a time; a retried request
 * is not shown again). */
int edl_storage_put_observed(edl_storage *s, const char *key, const void *data, size_t len,
                             edl_storage_observe_fn observe, void *arg);

/* A source of bytes: fill buf with up to len bytes, return how many (0 = end) or a negative
 * EDL_E* code to abort the put. */
typedef ssize_t (*edl_storage_read_fn)(void *arg, void *buf, size_t len);
/* Store what the source yields until its end. Memory: up to parallel_parts * part_size. */
int edl_storage_put_stream(edl_storage *s, const char *key, edl_storage_read_fn read, void *arg);

/* The whole object into a new buffer (*data, caller frees; NUL-terminated for convenience).
 * EDL_ENOTFOUND when absent, EDL_ETOOBIG when larger than max_bytes (nothing returned). */
int edl_storage_get(edl_storage *s, const char *key, size_t max_bytes, void **data, size_t *len);

/* A sink of bytes: return 0, or a negative EDL_E* code to abort the get. */
typedef int (*edl_storage_write_fn)(void *arg, const void *buf, size_t len);
/* Stream the object to the sink. An interrupted s3 download resumes where it stopped (a Range
 * request), so the sink sees every byte once, in order. *size_out (may be NULL): bytes given. */
int edl_storage_get_stream(edl_storage *s, const char *key, edl_storage_write_fn write, void *arg,
                           uint64_t *size_out);

/* The whole object straight into dst (cap bytes), with no buffer between the store and dst
 * where the back end can (file://: read(2) into dst; s3://: a copy out of each piece received).
 * observe (may be NULL) sees each piece just after it lands in dst, in order: a digest made
 * while the bytes are in the CPU's cache. EDL_ENOTFOUND when absent; EDL_ETOOBIG when the
 * object is larger than cap (dst holds part of it, or nothing). *size_out (may be NULL): the
 * bytes written to dst. */
int edl_storage_get_into(edl_storage *s, const char *key, void *dst, size_t cap,
                         edl_storage_observe_fn observe, void *arg, uint64_t *size_out);

typedef struct edl_storage_stat {
    uint64_t size;
    int64_t mtime;  /* seconds since the epoch (0 when the store does not say) */
} edl_storage_stat;

/* Size of an object; EDL_ENOTFOUND when absent. */
int edl_storage_stat_key(edl_storage *s, const char *key, edl_storage_stat *st);

/* Every key that starts with prefix ("" = all), sorted bytewise. Free with
 * edl_storage_list_free. A prefix need not end at a "/" ("ckpt-" matches "ckpt-1/x"). */
int edl_storage_list(edl_storage *s, const char *prefix, char ***keys, size_t *n);
void edl_storage_list_free(char **keys, size_t n);

/* Delete one object; deleting an absent one is not an error. */
int edl_storage_delete(edl_storage *s, const char *key);

/* True when key is a valid key (see the top of this file). */
bool edl_storage_key_valid(const char *key);

#ifdef __cplusplus
}
#endif
#endif

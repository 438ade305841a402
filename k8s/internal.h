/* internal.h (k8s/): what the Kubernetes client's files share and the public header hides. */
#ifndef EDL_K8S_INTERNAL_H
#define EDL_K8S_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "edl/http.h"
#include "edl/k8s.h"

#define K8S_MAX_REPLY (16u << 20)   /* a reply, or one line of a watch stream */
#define K8S_TOKEN_REREAD_MS 60000   /* a token file is read again after this long */
#define K8S_RETRIES 4
#define K8S_RETRY_BASE_MS 100
#define K8S_RETRY_MAX_MS 2000 /* also the cap on a server's Retry-After */

struct edl_k8s {
    edl_k8s_config cfg;       /* deep copy, owned */
    pthread_mutex_t mu;       /* serialises edl_k8s_request on curl (one connection) */
    CURL *curl;
    pthread_mutex_t token_mu; /* the token read from cfg.token_file, shared with informers */
    char *file_token;
    int64_t file_token_ms;    /* when it was read (monotonic); 0: never */
    atomic_llong requests, retries, watches, relists;
    /* writes (every method but GET) are refused with EDL_ELEASE while this says no */
    bool (*_Atomic may_write)(void *arg);
    void *_Atomic may_write_arg;
};
/* Fence k's writes with may_write(arg) (NULL: unfenced); see edl_k8s_elector_fence. */
void k8s_set_write_fence(edl_k8s *k, bool (*may_write)(void *), void *arg);

/* Where a transfer runs: the client's easy handle (multi NULL), or an informer's handle in
 * its own multi handle, so that close wakes it at once (stop is read under stop_mu). */
typedef struct k8s_conn {
    CURL *h;
    CURLM *multi;
    pthread_mutex_t *stop_mu;
    const bool *stop;
} k8s_conn;

/* One HTTP exchange with no retry. write/arg receive the body (NULL: into r's buffer, bounded
 * at K8S_MAX_REPLY). timeout_ms 0: none (watches). Fills *status (0 when none came), the
 * Retry-After delay in ms (-1 when absent) and errbuf (CURL_ERROR_SIZE) on failure. */
typedef struct k8s_xfer {
    const char *method, *path, *content_type, *body;
    curl_write_callback write;
    void *arg;
    long timeout_ms;
    edl_bytebuf buf;          /* the body when write is NULL (the caller frees buf.data) */
    long status;
    int64_t retry_after_ms;
    char errbuf[CURL_ERROR_SIZE];
} k8s_xfer;
CURLcode k8s_transfer(edl_k8s *k, const k8s_conn *c, k8s_xfer *x);
bool k8s_stopped(const k8s_conn *c);
/* One request with its reply parsed (as edl_k8s_request), retried when retry is set. */
int k8s_request_on(edl_k8s *k, const k8s_conn *c, const char *method, const char *path,
                   const char *content_type, const char *body, bool retry, edl_k8s_reply *out);

/* A small file, NUL-terminated, trailing white space cut: EDL_ENOTFOUND, EDL_EIO,
 * EDL_ETOOBIG over max bytes, EDL_ENOMEM. */
int k8s_read_file(const char *path, size_t max, char **out);

/* Strict base64 (standard alphabet, padding required; ASCII white space ignored): a
 * NUL-terminated malloc'ed copy. EDL_EPROTO when not base64, EDL_ENOMEM. */
int k8s_b64_decode(const char *in, size_t n, char **out, size_t *outlen);

/* ---- one line of a watch stream (informer.c): pure, fuzzed ---------------------------- */

typedef enum k8s_watch_kind {
    K8S_W_BAD = 0,  /* not a watch event: why says how (the informer relists) */
    K8S_W_EVENT,    /* ADDED, MODIFIED or DELETED of an object with a name: type, key */
    K8S_W_BOOKMARK, /* obj carries the resourceVersion to watch from */
    K8S_W_ERROR,    /* obj is a Status (410: relist at once) */
} k8s_watch_kind;
typedef struct k8s_watch_line {
    k8s_watch_kind kind;
    int type;        /* K8S_W_EVENT: EDL_K8S_ADDED, EDL_K8S_MODIFIED or EDL_K8S_DELETED */
    cJSON *root;     /* the line parsed (NULL when it is not JSON); freed by _clear */
    cJSON *obj;      /* its "object", inside root */
    char key[512];   /* K8S_W_EVENT: the object's "ns/name" (k8s_object_key) */
    const char *why; /* K8S_W_BAD */
} k8s_watch_line;
/* Read one line of a watch stream (without its '\n'): its kind, and *out filled; call
 * k8s_watch_line_clear after, whatever the kind. */
k8s_watch_kind k8s_watch_line_parse(const char *line, size_t len, k8s_watch_line *out);
void k8s_watch_line_clear(k8s_watch_line *w);

/* ---- the informer's cache (cache.c): objects keyed by "ns/name" ------------------------ */

typedef struct k8s_entry {
    char *key;
    cJSON *obj;
    uint32_t hash;
    unsigned mark;            /* relist generation that saw it */
    char *awaited_rv;         /* written through, ahead of the stream: the write's version */
    int64_t awaited_until;    /* monotonic ms after which the stream is trusted again */
    struct k8s_entry *next;
} k8s_entry;

typedef struct k8s_cache {
    k8s_entry **buckets;
    size_t nbuckets, count;
} k8s_cache;

/* The key of an object ("ns/name", or "name" when cluster-scoped) into buf; false when the
 * object has no metadata.name or the key does not fit. */
bool k8s_object_key(const cJSON *obj, char *buf, size_t len);
/* A copy of obj with only the fields at the dotted paths in keep (object.c); NULL: no memory. */
cJSON *k8s_trim(const cJSON *obj, const char *const *keep);
bool k8s_key_of(const char *ns, const char *name, char *buf, size_t len);
k8s_entry *k8s_cache_find(const k8s_cache *c, const char *key);
/* Put obj (owned from now on) under key, replacing and returning the old object (caller
 * frees) in *old. EDL_ENOMEM (obj not taken). */
int k8s_cache_put(k8s_cache *c, const char *key, cJSON *obj, cJSON **old);
/* Remove key: its object (caller frees), or NULL. */
cJSON *k8s_cache_remove(k8s_cache *c, const char *key);
void k8s_cache_clear(k8s_cache *c);
/* Mark e as ahead of the stream until the event carrying rv comes (or until); rv NULL: not. */
void k8s_entry_await(k8s_entry *e, const char *rv, int64_t until);

#endif

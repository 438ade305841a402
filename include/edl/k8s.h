/* edl/k8s.h: a Kubernetes API client in C over libcurl, written to the documented API (not to
 * any one server): what the operator (edl-operator) needs and nothing more.
 *
 *   config     where the API server is and who we are: in-cluster (service-account token, re-read
 *              as it rotates; CA; namespace) or a kubeconfig file (libyaml: server, CA data or
 *              file, client certificate and key data or files, token), or flags;
 *   requests   one call per verb; 429 and 5xx are retried with back-off (Retry-After honoured),
 *              bounded; every reply's Status (reason, message) is kept for the caller;
 *   informer   list then watch one collection (resourceVersion, bookmarks; 410 relists), a
 *              local cache keyed by namespace/name fed by it, events delivered through a pollable
 *              fd so that a single-threaded event loop drives any number of them;
 *   election   leader election on a coordination.k8s.io/v1 Lease, as client-go does it.
 *
 * Objects are cJSON trees. Errors: EDL_E* codes; HTTP replies are not errors of the transport:
 * edl_k8s_request returns 0 with the status in the reply, the verb helpers map it (404
 * EDL_ENOTFOUND, 409 EDL_ECONFLICT (AlreadyExists too: check reply->reason), 401/403 EDL_EAUTH,
 * 422/400 EDL_ECONFIG, 410 EDL_ECOMPACTED, other 4xx/5xx EDL_ESERVER, unreachable EDL_EUNAVAIL). */
#ifndef EDL_K8S_H
#define EDL_K8S_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "edl/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- configuration ---------------------------------------------------------------------- */

typedef struct edl_k8s_config {
    char *server;          /* "https://10.0.0.1:443" or "http://127.0.0.1:8080" */
    char *ca_file;         /* PEM bundle verifying the server (NULL: the system's) */
    char *ca_data;         /* or the PEM itself (kubeconfig certificate-authority-data, decoded) */
    char *cert_file, *key_file; /* client certificate and key, PEM files */
    char *cert_data, *key_data; /* or the PEM themselves (kubeconfig *-data, decoded) */
    char *token;           /* bearer token */
    char *token_file;      /* or a file holding it, re-read at least every minute (rotation) */
    char *namespace;       /* the default namespace (in-cluster: the pod's own) */
    bool insecure_skip_tls_verify;
    int timeout_ms;        /* per request, not for watches (default 30000) */
    int token_reread_ms;   /* how old a token read from token_file may get (0: 60000) */
} edl_k8s_config;

/* In-cluster: $KUBERNETES_SERVICE_HOST/PORT, /var/run/secrets/kubernetes.io/serviceaccount/
 * {token,ca.crt,namespace} (root: that directory; NULL: the standard one; tests point it
 * elsewhere). EDL_ENOTFOUND when not in a cluster. */
int edl_k8s_config_in_cluster(edl_k8s_config *c, const char *root, char *err, size_t errlen);
/* A kubeconfig file: the current context (context NULL) or the named one. Errors name the
 * file and the field: "kubeconfig /x: users[0].user.client-key-data: not base64". */
int edl_k8s_config_kubeconfig(edl_k8s_config *c, const char *path, const char *context,
                              char *err, size_t errlen);
/* What kubectl would use: the kubeconfig path given (NULL: $KUBECONFIG, then in-cluster, then
 * ~/.kube/config). */
int edl_k8s_config_load(edl_k8s_config *c, const char *kubeconfig, const char *context,
                        char *err, size_t errlen);
void edl_k8s_config_clear(edl_k8s_config *c);

/* ---- client and requests ---------------------------------------------------------------- */

typedef struct edl_k8s edl_k8s;

int edl_k8s_open(const edl_k8s_config *c, edl_k8s **out);
void edl_k8s_close(edl_k8s *k);
const char *edl_k8s_namespace(const edl_k8s *k); /* the config's, or "default" */
const char *edl_k8s_server(const edl_k8s *k);

typedef struct edl_k8s_reply {
    long status;       /* HTTP status (0: none came) */
    cJSON *body;       /* the parsed JSON body (NULL: none or not JSON) */
    char reason[64];   /* a Status reply's reason ("AlreadyExists", "Conflict", "Expired") */
    char message[512]; /* a Status reply's message, or a transport error's text */
} edl_k8s_reply;
void edl_k8s_reply_clear(edl_k8s_reply *r);

/* Counters of what this client sent, for metrics and the benchmark. */
typedef struct edl_k8s_stats {
    int64_t requests;  /* every HTTP request, retries included */
    int64_t retries;   /* of those, retries after 429/5xx/unreachable */
    int64_t watches;   /* watch requests opened */
    int64_t relists;   /* lists after a 410 or a broken watch */
} edl_k8s_stats;
void edl_k8s_get_stats(const edl_k8s *k, edl_k8s_stats *out);

/* One request: method "GET"/"POST"/"PUT"/"PATCH"/"DELETE", path "/api/v1/namespaces/x/pods"
 * (with any query), content_type for the body (NULL: application/json). 429 and 5xx are
 * retried up to 4 times with exponential back-off from 100 ms (Retry-After honoured, capped
 * at 2 s). Returns 0 when a reply came (any status), else a transport error
 * (EDL_EUNAVAIL, EDL_ETIMEDOUT, EDL_ETOOBIG for a reply over 16 MiB, EDL_ENOMEM). */
int edl_k8s_request(edl_k8s *k, const char *method, const char *path, const char *content_type,
                    const char *body, edl_k8s_reply *out);

/* Verb helpers: 0 for 2xx, else the code in the header comment (the reply says more). out
 * may be NULL; when given it receives the reply (clear it). */
int edl_k8s_get(edl_k8s *k, const char *path, edl_k8s_reply *out);
int edl_k8s_create(edl_k8s *k, const char *collection_path, const cJSON *obj, edl_k8s_reply *out);
int edl_k8s_update(edl_k8s *k, const char *path, const cJSON *obj, edl_k8s_reply *out);
/* application/merge-patch+json */
int edl_k8s_merge_patch(edl_k8s *k, const char *path, const cJSON *patch, edl_k8s_reply *out);
/* propagation: "Background", "Foreground", "Orphan" or NULL; grace_s < 0: the default. */
int edl_k8s_delete(edl_k8s *k, const char *path, const char *propagation, int64_t grace_s,
                   edl_k8s_reply *out);
/* The code for an HTTP status (0 for 2xx). */
int edl_k8s_status_code(long http_status);

/* Paths. group NULL or "": the core group ("/api/v1/..."). ns NULL: cluster-wide or
 * cluster-scoped. name NULL: the collection. sub: a subresource ("status", "scale") or NULL.
 * malloc'ed; NULL when out of memory. Names are not escaped: they must be valid DNS names. */
char *edl_k8s_path(const char *group, const char *version, const char *ns, const char *plural,
                   const char *name, const char *sub);

/* ---- informer: list + watch + cache ----------------------------------------------------- */

typedef enum edl_k8s_event_type {
    EDL_K8S_ADDED = 1,
    EDL_K8S_MODIFIED,
    EDL_K8S_DELETED,
    EDL_K8S_SYNCED,   /* the cache holds a full list now (after the first list and each relist);
                       * objects that vanished in between came as DELETED before it */
} edl_k8s_event_type;

typedef struct edl_k8s_event {
    edl_k8s_event_type type;
    const char *ns, *name;  /* valid until the next call on the informer */
    const cJSON *object;    /* the new object (DELETED: the last one known); same lifetime */
} edl_k8s_event;

typedef struct edl_k8s_informer edl_k8s_informer;

/* Start listing and watching `collection_path` (e.g. edl_k8s_path("edl.dev", "v1alpha1", ns,
 * "trainingjobs", NULL, NULL), ns NULL for every namespace) with an optional label selector. A
 * thread of its own with its own connection does the HTTP; the cache changes only in
 * edl_k8s_informer_next, on the caller's thread, so what the caller reads is stable between
 * calls. A broken watch re-watches from the last resourceVersion seen; a 410 (as a reply or
 * an in-stream ERROR) relists; failures back off (200 ms doubling to 5 s). It uses k (token,
 * counters) from its thread: close it before k. */
int edl_k8s_informer_open(edl_k8s *k, const char *collection_path, const char *label_selector,
                          edl_k8s_informer **out);
/* The same, keeping of each object only the fields at the dotted paths in keep (NULL-
 * terminated; e.g. "metadata", "status.phase"), as client-go's transform does: 10,000 pods
 * cost a fraction of their full size in the cache. A path through an array keeps the rest of
 * the path of each element ("status.containerStatuses.name": every status's name). keep NULL:
 * whole objects. */
int edl_k8s_informer_open_trimmed(edl_k8s *k, const char *collection_path,
                                  const char *label_selector, const char *const *keep,
                                  edl_k8s_informer **out);
void edl_k8s_informer_close(edl_k8s_informer *inf);
/* Readable while events wait. */
int edl_k8s_informer_fd(const edl_k8s_informer *inf);
/* The next event (0), EDL_ETIMEDOUT when none came within timeout_ms (0: do not wait). */
int edl_k8s_informer_next(edl_k8s_informer *inf, edl_k8s_event *ev, int timeout_ms);
/* True once the first list has been applied to the cache (after its SYNCED event). */
bool edl_k8s_informer_synced(const edl_k8s_informer *inf);
/* The cached object, or NULL. */
const cJSON *edl_k8s_informer_get(const edl_k8s_informer *inf, const char *ns, const char *name);
/* Every cached object, in no particular order: fills up to max pointers, returns the count
 * (which may exceed max: call again with a larger array). */
size_t edl_k8s_informer_list(const edl_k8s_informer *inf, const cJSON **objs, size_t max);
/* Put an object we just wrote (the reply of a create or update) into the cache at once, so a
 * pass that runs before its watch event does not act on it twice (client-go's "expectations").
 * The stream's events from before the write are dropped until the write's own event comes
 * (its resourceVersion, compared for equality only) and replaces it; deleted: drop the object
 * instead, and its uid's events until its DELETED. A relist, or 10 s without that event,
 * trusts the stream again. */
int edl_k8s_informer_store(edl_k8s_informer *inf, const cJSON *obj, bool deleted);

/* ---- leader election on a coordination.k8s.io/v1 Lease ---------------------------------- */

typedef struct edl_k8s_elector edl_k8s_elector;

typedef struct edl_k8s_elector_opts {
    const char *ns, *name;   /* the Lease */
    const char *identity;    /* holderIdentity: unique per replica (hostname-pid) */
    int lease_duration_s;    /* 15 */
    int renew_deadline_ms;   /* a leader that has not renewed for this long steps down (10000) */
    int retry_period_ms;     /* how often to try or renew (2000) */
} edl_k8s_elector_opts;

int edl_k8s_elector_open(edl_k8s *k, const edl_k8s_elector_opts *o, edl_k8s_elector **out);
/* Try to acquire or renew if due (call at least every retry period; does at most one
 * read and one write). *leading says whether we lead now; *next_ms (monotonic) when to call
 * again. A lease held by another is taken only when renewTime + leaseDurationSeconds has
 * passed, by an update carrying its resourceVersion (409: someone else won). */
int edl_k8s_elector_tick(edl_k8s_elector *e, bool *leading, int64_t *next_ms);
/* Step down: clear holderIdentity if we hold it, so a standby takes over at once (a started
 * elector's thread stops first). */
int edl_k8s_elector_release(edl_k8s_elector *e);
/* Stops a started elector's thread (without releasing) and frees it. */
void edl_k8s_elector_close(edl_k8s_elector *e);

/* Campaign and renew on a thread of its own, over a connection of its own made from cfg (each
 * request bounded by a quarter of the renew deadline, at least 1 s), every retry period: no
 * work of the caller's can delay a renewal. */
int edl_k8s_elector_start(const edl_k8s_config *cfg, const edl_k8s_elector_opts *o,
                          edl_k8s_elector **out);
/* Whether we lead now: the Lease was renewed less than renew_deadline_ms ago (judged on this
 * clock at each call, so a leader stops the moment its deadline passes, whatever its thread
 * is doing). Lock-free: cheap enough to ask before every write. */
bool edl_k8s_elector_leading(edl_k8s_elector *e);
/* How long we still lead without another renewal, in ms (0: we do not lead). */
int64_t edl_k8s_elector_valid_ms(edl_k8s_elector *e);
/* A started elector's eventfd: readable when leading changes by a tick (a passed deadline
 * raises nothing: ask edl_k8s_elector_leading, at the latest after edl_k8s_elector_valid_ms). */
int edl_k8s_elector_fd(const edl_k8s_elector *e);
/* Fence k: from now on each of its writes (every verb but GET, retries included) is refused
 * with EDL_ELEASE, unsent, unless e leads at that moment (e NULL: unfenced). The split-brain
 * guard of client-go's operators, made one check in the client instead of one per call site. */
void edl_k8s_elector_fence(edl_k8s_elector *e, edl_k8s *k);

typedef struct edl_k8s_elector_stats {
    int64_t renewals;        /* successful writes as the holder */
    int64_t late_renewals;   /* of those, more than two retry periods after the previous one */
    int64_t max_gap_ms;      /* the longest time between two renewals while leading */
} edl_k8s_elector_stats;
void edl_k8s_elector_get_stats(edl_k8s_elector *e, edl_k8s_elector_stats *out);

/* ---- small object helpers --------------------------------------------------------------- */

/* The string at a dotted path ("metadata.name", "status.phase"), or NULL. */
const char *edl_k8s_str(const cJSON *obj, const char *path);
/* The integer at a dotted path, or dflt when absent or not an integer. */
int64_t edl_k8s_int(const cJSON *obj, const char *path, int64_t dflt);
/* RFC 3339 UTC ("2026-11-23T13:45:00Z") of a wall-clock time in ms, into buf (>= 32 bytes);
 * micro: with six decimals (the MicroTime of Leases and Events). */
const char *edl_k8s_time(int64_t wall_ms, bool micro, char *buf, size_t len);
/* Parse RFC 3339 (with or without fraction, Z or an offset) into wall-clock ms. */
int edl_k8s_time_parse(const char *s, int64_t *wall_ms);

#ifdef __cplusplus
}
#endif

#endif

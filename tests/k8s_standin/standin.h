/* standin.h: the shared declarations of k8s-standin, a stand-in Kubernetes API server with a
 * stand-in kubelet for edl's tests (see README.md in this folder for what it does and does not
 * implement). One store guarded by one mutex; the HTTP side (http.c) and the kubelet thread
 * (kubelet.c) call the verb functions (objects.c, delete.c) with that mutex held. */
#ifndef K8S_STANDIN_H
#define K8S_STANDIN_H

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define SI_MAX_BODY (3u << 20)       /* request bodies beyond this get 413 */
#define SI_WATCH_QUEUE_MAX 100000    /* live events queued for one watcher before it is cut */
#define SI_NODE_NAME "standin-node"

enum si_kubelet_mode { SI_KUBELET_OFF, SI_KUBELET_PHASE_ONLY, SI_KUBELET_PROCESS };

typedef struct si_config {
    const char *addr;
    int port;
    const char *kubelet_root;
    enum si_kubelet_mode kubelet_mode;
    const char *token;
    int history;
    int bookmark_ms;
    bool gone_in_stream;
    const char *ready_file;
    int kube_minor; /* --kube-version: the Kubernetes 1.x it acts as (CEL rules, /version) */
} si_config;

/* ---- resources (resources.c) ------------------------------------------------------------ */

enum si_table_kind { SI_TABLE_GENERIC, SI_TABLE_POD, SI_TABLE_CR };

/* A served resource, built in or made from a CRD version. Never freed before exit: events and
 * watchers point at it; a deleted CRD only clears `served`. */
typedef struct si_resource {
    struct si_resource *next;
    char group[128], version[64], plural[128], singular[128], kind[128], list_kind[160];
    bool namespaced, served, is_crd, has_status, has_scale, has_log;
    char short_names[8][32];
    int n_short;
    char categories[4][32];
    int n_cat;
    char spec_replicas[128], status_replicas[128], selector_path[128];
    cJSON *schema;  /* openAPIV3Schema (CRDs), owned */
    cJSON *columns; /* additionalPrinterColumns (CRDs), owned */
    char crd_name[256];
    enum si_table_kind table;
} si_resource;

/* ---- objects, events, watchers (store.c) ------------------------------------------------ */

/* A stored object: immutable once stored, shared by the store and the events (refcounted). */
typedef struct si_obj {
    int refs;
    cJSON *json;
} si_obj;

enum si_event_type { SI_ADDED, SI_MODIFIED, SI_DELETED };

typedef struct si_event {
    int refs;
    enum si_event_type type;
    uint64_t rv;
    si_resource *res;
    si_obj *obj;
} si_event;

typedef struct si_selector si_selector;

typedef struct si_qnode {
    struct si_qnode *next;
    si_event *ev;
} si_qnode;

/* One watch: the store pushes matching events into its queue (under the store mutex, then the
 * watch's own mutex); the HTTP stream (watch.c) or the kubelet pops them. */
typedef struct si_watch {
    struct si_watch *next;
    si_resource *res;
    char ns[256]; /* "" = all namespaces */
    si_selector *labels, *fields;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    si_qnode *head, *tail;
    size_t queued, limit;
    bool overflow, closed;
} si_watch;

typedef struct si_entry si_entry;
typedef struct si_peaks si_peaks;
struct owner_ref;
#define SI_OWNER_BUCKETS 4096

typedef struct si_store {
    pthread_mutex_t mu;
    uint64_t rv;
    si_entry **buckets;
    size_t nbuckets, count;
    si_event **ring;
    size_t ring_cap, ring_len, ring_head;
    uint64_t floor; /* events with rv > floor are all retained */
    si_watch *watches;
    si_resource *resources;
    bool closing;
    uint64_t next_ip;
    struct owner_ref *owners[SI_OWNER_BUCKETS];
    si_peaks *peaks; /* live and peak pods per namespace (peaks.c) */
    struct {                /* the last sorted list, kept while nothing is written (paging) */
        si_entry **entries;
        size_t n;
        const si_resource *res;
        char *ns;
        uint64_t rv;        /* 0: none */
    } list_cache;
} si_store;

void si_obj_unref(si_obj *o);
void si_event_unref(si_event *e);
int si_store_init(si_store *s, size_t history);
void si_store_free(si_store *s);
si_obj *si_store_get(si_store *s, const si_resource *r, const char *ns, const char *name);
/* Store json (taken) as the object's new state: bumps the resourceVersion, records an event
 * (ADDED when new, else MODIFIED). Returns the stored object (owned by the store). */
si_obj *si_store_put(si_store *s, si_resource *r, cJSON *json);
/* Remove the object: bumps the resourceVersion and records DELETED with the final state. */
void si_store_remove(si_store *s, si_resource *r, const char *ns, const char *name);
/* Every object of r (ns NULL or "" = all namespaces, r NULL = every resource) sorted by
 * namespace and name; free the array (not the objects) with free(). */
si_obj **si_store_list(si_store *s, const si_resource *r, const char *ns, size_t *n);
void si_store_expire(si_store *s);
/* Whether some stored object names uid among its ownerReferences. */
bool si_store_is_owner(si_store *s, const char *uid);
/* Start a watch from rv (0 = ADDED for every object first). -410 when rv is older than the
 * history; the watch is registered either way only on success. limit 0 = unbounded. */
int si_watch_start(si_store *s, si_watch *w, uint64_t rv, bool from_list, size_t limit);
void si_watch_stop(si_store *s, si_watch *w);
/* Pop the next event (NULL when none); the caller owns the reference. */
si_event *si_watch_pop(si_watch *w);
bool si_watch_matches(const si_watch *w, const si_resource *r, const cJSON *obj);

/* peaks.c (store mutex held): a write of r from before to after (NULL: none) */
void si_peaks_note(si_store *s, const si_resource *r, const cJSON *before, const cJSON *after);
/* "live pods <ns>" and "peak pods <ns>" into `into`; reset: each peak becomes the live count. */
void si_peaks_json(si_store *s, cJSON *into, bool reset);
void si_peaks_free(si_store *s);

/* ---- selectors (selector.c) ------------------------------------------------------------- */

si_selector *si_selector_parse(const char *text, bool fields, char *err, size_t errlen);
bool si_selector_match(const si_selector *sel, const cJSON *obj);
void si_selector_free(si_selector *sel);

/* ---- JSON helpers (util.c) -------------------------------------------------------------- */

const char *si_str(const cJSON *obj, const char *path); /* dotted path; NULL when not a string */
cJSON *si_get(const cJSON *obj, const char *path);       /* ".a.b[0]['k']" or "a.b" */
int si_set(cJSON *obj, const char *path, cJSON *value);  /* creates objects; takes value */
cJSON *si_obj_child(cJSON *obj, const char *key);        /* child object, created if absent */
void si_set_str(cJSON *obj, const char *key, const char *value);
void si_set_num(cJSON *obj, const char *key, double value);
char *si_rfc3339(time_t t, char buf[32]);
time_t si_parse_time(const char *s); /* -1 on error */
void si_age(time_t since, char *buf, size_t len); /* kubectl's HumanDuration */
void si_new_uid(char out[37]);
void si_random_suffix(char out[6]); /* 5 of [bcdfghjklmnpqrstvwxz2456789] */
char *si_base64_encode(const unsigned char *in, size_t len);
unsigned char *si_base64_decode(const char *in, size_t *outlen); /* NULL when invalid */
bool si_json_equal(const cJSON *a, const cJSON *b);

/* ---- names and labels (names.c) -------------------------------------------------------- */

enum si_name_rule {
    SI_DNS1123_LABEL,     /* [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 */
    SI_DNS1123_SUBDOMAIN, /* such labels joined by '.', at most 253 */
    SI_DNS1035_LABEL,     /* [a-z]([-a-z0-9]*[a-z0-9])?, at most 63 */
    SI_PATH_SEGMENT,      /* not '.' or '..', no '/' or '%' (RBAC names) */
    SI_LABEL_VALUE        /* (([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?, at most 63 */
};

bool si_name_ok(enum si_name_rule rule, const char *s);
/* 422 causes `field: Invalid value: "value": <the real server's message>` (none when valid). */
void si_check_name(enum si_name_rule rule, const char *value, const char *field, cJSON *causes);
enum si_name_rule si_name_rule_of(const si_resource *r); /* the rule of r's metadata.name */
void si_check_labels(const cJSON *obj, cJSON *causes);   /* metadata.labels values */

/* ---- results and Status objects (status.c) ---------------------------------------------- */

typedef struct si_result {
    int code;    /* HTTP status */
    cJSON *body; /* the object, a list, or a Status */
    char *warning;
} si_result;

cJSON *si_status_new(int code, const char *reason, const char *message);
si_result si_fail(int code, const char *reason, const si_resource *r, const char *name,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
si_result si_ok(int code, cJSON *body);
si_result si_invalid(const si_resource *r, const char *name, cJSON *causes);
void si_cause(cJSON *causes, const char *reason, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void si_result_free(si_result *res);
/* "TrainingJob.edl.dev" or "Pod" as Kubernetes names a kind in messages. */
void si_qualified_kind(const si_resource *r, char *buf, size_t len);
void si_qualified_plural(const si_resource *r, char *buf, size_t len);

/* ---- the server as a whole -------------------------------------------------------------- */

typedef struct si_faults si_faults;
typedef struct si_stats si_stats;
typedef struct si_kubelet si_kubelet;

typedef struct si_server {
    si_config cfg;
    si_store store;
    si_faults *faults;
    si_stats *stats;
    si_stats *access; /* "<agent> <verb> <group>/<resource>": what RBAC would have to allow */
    si_kubelet *kubelet;
    struct MHD_Daemon *mhd;
    int listen_fd, port;
    time_t started;
    volatile int closing;
} si_server;

/* resources.c */
int si_resources_init(si_server *srv);
si_resource *si_resource_find(si_store *s, const char *group, const char *version,
                              const char *plural);
si_resource *si_resource_by_kind(si_store *s, const char *api_version, const char *kind);
si_resource *si_builtin(si_store *s, const char *group, const char *plural);
/* Serve (or stop serving) the versions of a stored CRD object. */
void si_crd_sync(si_store *s, const cJSON *crd, bool served);
cJSON *si_discovery(si_store *s, const char *path, bool *found); /* /api, /apis, ... */
cJSON *si_openapi_v3(si_store *s, const char *path, bool *found);
void si_api_version(const si_resource *r, char *buf, size_t len);

/* serviceaccount.c: the ServiceAccount admission plugin on a pod create (0, or a 403 in
 * *res), and what kube-controller-manager makes in a new namespace. */
int si_sa_admit(si_server *srv, cJSON *pod, si_result *res);
void si_namespace_created(si_server *srv, const char *ns);

/* builtin.c: defaults and checks of built-in kinds (causes: 422 errors; unknown: paths of
 * unknown fields, already dropped; err: a 400 message). */
int si_builtin_prepare(si_server *srv, const si_resource *r, cJSON *obj, bool create,
                       cJSON *causes, cJSON *unknown, char *err, size_t errlen);

/* schema.c: CRD schema defaults, pruning and checks; causes get the errors. */
void si_schema_default(const cJSON *schema, cJSON *obj);
void si_schema_prune(const cJSON *schema, cJSON *obj, const char *path, cJSON *unknown);
void si_schema_check(const cJSON *schema, const cJSON *obj, const char *path, cJSON *causes);

/* cel.c: a CEL subset for x-kubernetes-validations (err gets "<input>:1:<col>: <what>") */
typedef struct si_cel si_cel;
si_cel *si_cel_parse(const char *rule, char *err, size_t errlen); /* NULL on error */
/* The fields c selects must be declared in schema (the rule's); root: the schema's root. */
int si_cel_check(const si_cel *c, const cJSON *schema, bool root, char *err, size_t errlen);
int si_cel_eval(const si_cel *c, const cJSON *self, char *err, size_t errlen); /* 1, 0, -1 */
void si_cel_free(si_cel *c);

/* rules.c: x-kubernetes-validations. A CRD's rules are dropped (kube_minor < 25) or must
 * compile (causes); a custom resource's are evaluated (old: NULL on create; ratchet: a failure
 * of an unchanged value is a warning line). */
void si_rules_crd(int kube_minor, cJSON *crd, cJSON *causes);
void si_rules_validate(const cJSON *schema, const cJSON *obj, const cJSON *old, bool ratchet,
                       cJSON *causes, char **warning);

/* patch.c */
int si_merge_patch(cJSON **target, const cJSON *patch); /* RFC 7386; 0 or -1 */
int si_json_patch(cJSON **target, const cJSON *ops, char *err, size_t errlen); /* RFC 6902 */
int si_strategic_patch(cJSON **target, const cJSON *patch); /* approximation */

/* objects.c: the verbs; the store mutex must be held. */
typedef struct si_req_opts {
    const char *field_validation; /* Strict, Warn, Ignore */
    bool dry_run;
} si_req_opts;
si_result si_create(si_server *srv, si_resource *r, const char *ns, cJSON *body,
                    const si_req_opts *o);
si_result si_update(si_server *srv, si_resource *r, const char *ns, const char *name,
                    const char *sub, cJSON *body, const si_req_opts *o);
si_result si_get_obj(si_server *srv, si_resource *r, const char *ns, const char *name,
                     const char *sub);
si_result si_patch(si_server *srv, si_resource *r, const char *ns, const char *name,
                   const char *sub, const char *ctype, const char *body, size_t len,
                   const si_req_opts *o);
si_result si_put_scale(si_server *srv, si_resource *r, const char *ns, const char *name,
                       cJSON *scale, const si_req_opts *o);
cJSON *si_list_json(si_server *srv, si_resource *r, const char *ns, const si_selector *labels,
                    const si_selector *fields);
/* One page of it: items [from, from + limit) of those that match (limit 0: all), with
 * metadata.continue ("offset-<n>") and remainingItemCount when more follow. */
cJSON *si_list_page(si_server *srv, si_resource *r, const char *ns, const si_selector *labels,
                    const si_selector *fields, long from, long limit);

/* delete.c */
typedef struct si_delete_opts {
    long grace; /* -1 = the default */
    const char *propagation;
    const char *pre_uid, *pre_rv;
} si_delete_opts;
si_result si_delete(si_server *srv, si_resource *r, const char *ns, const char *name,
                    const si_delete_opts *o);
/* Remove the object now if it is being deleted and nothing holds it any more. */
void si_maybe_finish_delete(si_server *srv, si_resource *r, const cJSON *obj);

/* table.c */
/* A meta.k8s.io/v1 Table of objs (an array); include: 0 None, 1 Metadata, 2 Object. */
cJSON *si_table(si_resource *r, const cJSON *objs, const char *rv, int include, bool columns);

/* watch.c */
struct MHD_Connection;
struct MHD_Response;
/* A chunked stream of w's events (w started, taken); with w NULL, just the line `error`. */
struct MHD_Response *si_watch_response(si_server *srv, struct MHD_Connection *conn,
                                       si_watch *w, bool table, bool bookmarks, int timeout_s,
                                       const char *error);
/* {"type":"ERROR","object":<Status 410 Expired>} for a watch from a too old version. */
char *si_watch_gone_line(uint64_t asked, uint64_t oldest);

/* faults.c: injected failures and request counts (the /standin/ endpoints). */
si_faults *si_faults_new(void);
void si_faults_free(si_faults *f);
int si_faults_add(si_faults *f, const cJSON *spec, char *err, size_t errlen);
void si_faults_clear(si_faults *f);
/* A matching fault: its Status (and *delay_ms), or NULL after any delay it asks for. */
cJSON *si_faults_check(si_faults *f, const char *verb, const char *resource, const char *ns,
                       const char *name, int *delay_ms);
si_stats *si_stats_new(void);
void si_stats_free(si_stats *st);
void si_stats_count(si_stats *st, const char *verb, const char *resource);
cJSON *si_stats_json(si_stats *st, bool reset);

/* http.c: replies (each returns libmicrohttpd's MHD_YES/MHD_NO; takes body/text) */
int si_http_start(si_server *srv);
void si_http_stop(si_server *srv);
int si_send_text(struct MHD_Connection *c, int code, const char *ctype, char *text, size_t len,
                 const char *warning);
int si_send_json(struct MHD_Connection *c, int code, cJSON *body, const char *warning);
int si_send_status(struct MHD_Connection *c, int code, const char *reason, const char *message);
int si_send_result(struct MHD_Connection *c, si_result *res);

/* api.c: a request for /api/v1/... or /apis/<group>/<version>/... */
int si_api_handle(si_server *srv, struct MHD_Connection *c, const char *url, const char *method,
                  const char *body, size_t len);

/* kubelet.c */
si_kubelet *si_kubelet_start(si_server *srv);
void si_kubelet_stop(si_kubelet *k);
/* The log of one container ("" container = the first), or NULL. */
char *si_kubelet_log(si_server *srv, const cJSON *pod, const char *container, size_t *len);

#endif

/* internal.h (etcd/): what the etcd client's files share and the public header hides. */
#ifndef EDL_ETCD_INTERNAL_H
#define EDL_ETCD_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "edl/etcd.h"
#include "edl/http.h"

struct edl_etcd {
    edl_etcd_config cfg; /* deep copy, owned */
    pthread_mutex_t mu;  /* serialises calls: one connection, one request at a time */
    CURL *curl;
    size_t cur;          /* index of the endpoint in use */
    char *token;         /* auth token, when cfg.username is set */
    char errmsg[1024];
};

int etcd_config_copy(edl_etcd_config *dst, const edl_etcd_config *src);

/* POST req (consumed) to path and parse the JSON reply into *resp. key names the key in error
 * messages (may be {0}). idempotent: safe to send again on another endpoint after a failure
 * that may have reached the server. timeout_ms 0 = the client's. */
int etcd_call(edl_etcd *c, const char *path, cJSON *req, cJSON **resp, edl_buf key,
              bool idempotent, int timeout_ms);
/* Record an error for edl_etcd_errmsg() and return code. */
int etcd_fail(edl_etcd *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Apply URL-independent options (timeouts, TLS, keep-alive) to a curl handle. */
void etcd_curl_common(edl_etcd *c, CURL *h);
/* Headers for a request (Content-Type, auth token): caller frees with curl_slist_free_all. */
struct curl_slist *etcd_headers(edl_etcd *c);
/* Fetch a token (cfg.username set): called with c->mu held. */
int etcd_authenticate_locked(edl_etcd *c, const char *endpoint);
/* A printable, truncated rendering of a binary key for messages. */
const char *etcd_key_str(edl_buf key, char *out, size_t outlen);

/* JSON helpers: a missing field reads as zero/false/empty (the gateway omits zero values);
 * a present field of the wrong type or an unparsable number is EDL_EPROTO. */
int json_i64(const cJSON *obj, const char *name, int64_t *out);
int json_bool(const cJSON *obj, const char *name, bool *out);
int json_b64(const cJSON *obj, const char *name, char **out, size_t *len);
cJSON *json_add_b64(cJSON *obj, const char *name, edl_buf b);
cJSON *json_add_i64(cJSON *obj, const char *name, int64_t v);
int b64_encode(const char *in, size_t n, char **out);
int b64_decode(const char *in, size_t n, char **out, size_t *outlen);
int kv_parse(const cJSON *j, edl_kv *kv);
void kv_clear(edl_kv *kv);
int kv_array_parse(const cJSON *arr, edl_kv **kvs, size_t *n);
void kv_array_free(edl_kv *kvs, size_t n);

/* Request bodies and reply parsers shared by the plain calls and transactions. */
int range_req(cJSON *req, edl_buf key, const edl_range_opts *o);
int put_req(cJSON *req, edl_buf key, edl_buf value, const edl_put_opts *o);
int delete_req(cJSON *req, edl_buf key, const edl_delete_opts *o);
int range_parse(const cJSON *resp, edl_range_result *r);
int put_parse(const cJSON *resp, edl_put_result *r);
int delete_parse(const cJSON *resp, edl_delete_result *r);
/* A txn reply; expect_ops: the operations of the branch that ran. On failure r keeps what it
 * parsed, for edl_txn_result_clear. */
int txn_parse(const cJSON *resp, size_t expect_ops, edl_txn_result *r);

/* One message of the watch stream (watch.c), decoded without touching the watch: the pure
 * part, which the fuzzer feeds. */
typedef struct watch_msg {
    cJSON *root;               /* owns cancel_reason */
    bool error;                /* the gateway's {"error":..}: the stream broke, reconnect */
    bool created, canceled;
    int64_t revision;          /* the header's */
    int64_t compact_revision;  /* canceled: the oldest revision kept, 0 when not compacted */
    const char *cancel_reason; /* canceled: never NULL */
    edl_watch_event **events;  /* all of the message's events, or none */
    size_t n_events;
} watch_msg;
/* 0, or an error (EDL_EPROTO, EDL_ENOMEM) with *why saying what was wrong. m (always to be
 * cleared) keeps created when only the events were malformed. */
int watch_msg_parse(const char *line, size_t len, bool want_prev, watch_msg *m, const char **why);
void watch_msg_clear(watch_msg *m);

#endif

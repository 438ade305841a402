/* edl/http.h: what every HTTP client of edl shares over libcurl — the etcd gateway client and
 * its watches, the Kubernetes API client and its informers, the S3 store, the distillation
 * client. One global set-up, one way to prepare a handle (no signals, http and https only,
 * deadlines, TCP keep-alive, TLS from files or PEM text), one transfer that another thread can
 * stop (the watches'), one reading of libcurl's failures
 * (what never reached the server, what TLS refused, which EDL_E* code) and one retry back-off
 * for them (doubling, capped, jittered, Retry-After honoured). Each client keeps only its
 * protocol; the back-off is also the one of every other retry in edl (the agent's
 * registration, the PS client's handshake, the collective's connects). */
#ifndef EDL_HTTP_H
#define EDL_HTTP_H

#include <stdbool.h>
#include <stdint.h>

#include <curl/curl.h>

#ifdef __cplusplus
extern "C" {
#endif

/* libcurl's global set-up, done once whoever calls first (libcurl before 7.84 needs it before
 * threads use it). Every client calls it when it opens. */
void edl_http_global_init(void);

typedef struct edl_http_opts {
    long connect_timeout_ms;  /* 0: libcurl's default */
    long timeout_ms;          /* the whole transfer; 0: none (a stream) */
    bool nodelay;             /* small requests (etcd's) go out at once */
    bool keepalive;           /* a dead peer on a quiet connection is noticed within a minute:
                               * probes after 10 s idle, every 5 s */
    const char *user_agent;
    /* TLS: each from a file or from PEM text (the text wins); NULL: the system's CAs, no
     * client certificate */
    const char *ca_file, *ca_pem;
    const char *cert_file, *cert_pem;
    const char *key_file, *key_pem;
    bool insecure;            /* no check of the server's certificate and name */
} edl_http_opts;

/* Set what o says, signals off and the protocols to http and https, on h (after
 * curl_easy_reset, or on a new handle). */
void edl_http_prepare(CURL *h, const edl_http_opts *o);

/* Run h's transfer to its end inside multi (which holds no other handle), so that another
 * thread can end it at once: it makes stopped(arg) true, then calls curl_multi_wakeup(multi).
 * stopped is asked before the transfer starts and after every wake-up, at least once a second.
 * multi NULL: a plain curl_easy_perform, which only ends by itself. The transfer's result;
 * CURLE_ABORTED_BY_CALLBACK when stopped first. h is out of multi again on return. */
CURLcode edl_http_perform(CURLM *multi, CURL *h, bool (*stopped)(void *arg), void *arg);

/* The request never reached the server (no connection, no name, the TLS handshake failed):
 * safe to send again whatever it was. */
bool edl_http_not_sent(CURLcode cc);
/* TLS said no: the server's certificate is not trusted, or ours is unusable. */
bool edl_http_tls_refused(CURLcode cc);
/* The EDL_E* code of a failed transfer: EDL_ETIMEDOUT, EDL_ENOMEM, EDL_EAUTH (TLS refused),
 * EDL_ECLOSED (a callback stopped it), else EDL_EUNAVAIL. */
int edl_http_code(CURLcode cc);

/* The reply's Retry-After in ms (seconds form; a date is ignored), or -1. */
int64_t edl_http_retry_after_ms(CURL *h);
/* How long to wait before try attempt+1 (attempt from 0): base_ms doubled per attempt up to
 * max_ms, then 50-100 % of that at random (peers that failed together do not retry
 * together); a server's Retry-After (>= 0) instead, capped at max_ms. */
int64_t edl_http_backoff_ms(int attempt, int64_t base_ms, int64_t max_ms, int64_t retry_after_ms);

#ifdef __cplusplus
}
#endif
#endif

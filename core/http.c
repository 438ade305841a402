/* http.c: the libcurl plumbing every HTTP client of edl shares (edl/http.h): the global set-up,
 * a handle's common options, a stoppable transfer, the reading of libcurl's failures and the
 * retry back-off. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "edl/common.h"
#include "edl/http.h"

static pthread_once_t global_once = PTHREAD_ONCE_INIT;

static void global_setup(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

void edl_http_global_init(void)
{
    pthread_once(&global_once, global_setup);
}

static void set_pem(CURL *h, CURLoption opt, const char *pem)
{
    struct curl_blob b = {(void *)pem, strlen(pem), CURL_BLOB_COPY};
    curl_easy_setopt(h, opt, &b);
}

static void prepare_tls(CURL *h, const edl_http_opts *o)
{
    if (o->ca_pem)
        set_pem(h, CURLOPT_CAINFO_BLOB, o->ca_pem);
    else if (o->ca_file)
        curl_easy_setopt(h, CURLOPT_CAINFO, o->ca_file);
    if (o->cert_pem)
        set_pem(h, CURLOPT_SSLCERT_BLOB, o->cert_pem);
    else if (o->cert_file)
        curl_easy_setopt(h, CURLOPT_SSLCERT, o->cert_file);
    if (o->key_pem)
        set_pem(h, CURLOPT_SSLKEY_BLOB, o->key_pem);
    else if (o->key_file)
        curl_easy_setopt(h, CURLOPT_SSLKEY, o->key_file);
    if (o->insecure) {
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
    }
}

void edl_http_prepare(CURL *h, const edl_http_opts *o)
{
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(h, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    if (o->connect_timeout_ms > 0)
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, o->connect_timeout_ms);
    if (o->timeout_ms > 0)
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, o->timeout_ms);
    if (o->nodelay)
        curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    if (o->keepalive) {
        curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
        curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 10L);
        curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 5L);
    }
    if (o->user_agent)
        curl_easy_setopt(h, CURLOPT_USERAGENT, o->user_agent);
    prepare_tls(h, o);
}

CURLcode edl_http_perform(CURLM *multi, CURL *h, bool (*stopped)(void *arg), void *arg)
{
    if (!multi)
        return curl_easy_perform(h);
    if (curl_multi_add_handle(multi, h) != CURLM_OK)
        return CURLE_OUT_OF_MEMORY;
    int running = 1;
    while (running && !stopped(arg)) {
        if (curl_multi_perform(multi, &running) != CURLM_OK)
            break;
        if (running)
            curl_multi_poll(multi, NULL, 0, 1000, NULL);
    }
    CURLcode cc = CURLE_ABORTED_BY_CALLBACK;
    int left;
    CURLMsg *m;
    while ((m = curl_multi_info_read(multi, &left)))
        if (m->msg == CURLMSG_DONE)
            cc = m->data.result;
    curl_multi_remove_handle(multi, h);
    return cc;
}

bool edl_http_tls_refused(CURLcode cc)
{
    return cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CACERT_BADFILE ||
           cc == CURLE_SSL_CERTPROBLEM || cc == CURLE_SSL_ISSUER_ERROR;
}

bool edl_http_not_sent(CURLcode cc)
{
    return cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST ||
           cc == CURLE_COULDNT_RESOLVE_PROXY || cc == CURLE_SSL_CONNECT_ERROR ||
           edl_http_tls_refused(cc);
}

int edl_http_code(CURLcode cc)
{
    if (edl_http_tls_refused(cc))
        return EDL_EAUTH;
    switch (cc) {
    case CURLE_OPERATION_TIMEDOUT: return EDL_ETIMEDOUT;
    case CURLE_OUT_OF_MEMORY: return EDL_ENOMEM;
    case CURLE_ABORTED_BY_CALLBACK: return EDL_ECLOSED;
    default: return EDL_EUNAVAIL;
    }
}

int64_t edl_http_retry_after_ms(CURL *h)
{
    struct curl_header *hh;
    if (curl_easy_header(h, "Retry-After", 0, CURLH_HEADER, -1, &hh) != CURLHE_OK)
        return -1;
    char *end;
    long s = strtol(hh->value, &end, 10);
    return end != hh->value && *end == '\0' && s >= 0 ? (int64_t)s * 1000 : -1;
}

int64_t edl_http_backoff_ms(int attempt, int64_t base_ms, int64_t max_ms, int64_t retry_after_ms)
{
    if (retry_after_ms >= 0)
        return retry_after_ms < max_ms ? retry_after_ms : max_ms;
    int64_t ms = base_ms << (attempt < 0 ? 0 : attempt < 20 ? attempt : 20);
    if (ms > max_ms || ms <= 0)
        ms = max_ms;
    static _Thread_local unsigned seed;
    if (!seed)
        seed = (unsigned)edl_monotonic_ms() ^ (unsigned)getpid() ^ (unsigned)(uintptr_t)&seed;
    return ms / 2 + (int64_t)((unsigned)rand_r(&seed) % (unsigned)(ms / 2 + 1));
}

/* client.c: the Kubernetes client's transport. One keep-alive libcurl connection per client
 * (informers bring their own), TLS and the bearer token from the config (a token file is read
 * again as it rotates), bounded replies, a Status reply's reason and message kept for the
 * caller, and 429/5xx/unreachable retried with exponential back-off (Retry-After honoured). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "edl/log.h"
#include "internal.h"

#define DEFAULT_TIMEOUT_MS 30000
#define CONNECT_TIMEOUT_MS 5000



/* ---- open and close ---------------------------------------------------------------------- */

static int dup_opt(char **dst, const char *src)
{
    *dst = NULL;
    return src && !(*dst = strdup(src)) ? EDL_ENOMEM : 0;
}

static int config_copy(edl_k8s_config *d, const edl_k8s_config *s)
{
    memset(d, 0, sizeof *d);
    d->insecure_skip_tls_verify = s->insecure_skip_tls_verify;
    d->timeout_ms = s->timeout_ms > 0 ? s->timeout_ms : DEFAULT_TIMEOUT_MS;
    d->token_reread_ms = s->token_reread_ms > 0 ? s->token_reread_ms : K8S_TOKEN_REREAD_MS;
    if (dup_opt(&d->server, s->server) || dup_opt(&d->ca_file, s->ca_file) ||
        dup_opt(&d->ca_data, s->ca_data) || dup_opt(&d->cert_file, s->cert_file) ||
        dup_opt(&d->key_file, s->key_file) || dup_opt(&d->cert_data, s->cert_data) ||
        dup_opt(&d->key_data, s->key_data) || dup_opt(&d->token, s->token) ||
        dup_opt(&d->token_file, s->token_file) || dup_opt(&d->namespace, s->namespace)) {
        edl_k8s_config_clear(d);
        return EDL_ENOMEM;
    }
    size_t n = strlen(d->server);
    while (n > 0 && d->server[n - 1] == '/') /* paths start with '/' */
        d->server[--n] = '\0';
    return 0;
}

static bool config_valid(const edl_k8s_config *c)
{
    if (!c || !c->server || (strncmp(c->server, "https://", 8) && strncmp(c->server, "http://", 7))) {
        EDL_ERROR("k8s", "API server '%s': expected https://host:port or http://host:port",
                  c && c->server ? c->server : "(none)");
        return false;
    }
    if ((!c->cert_file && !c->cert_data) != (!c->key_file && !c->key_data)) {
        EDL_ERROR("k8s", "a client certificate needs its key (cert_file/cert_data with key_file/key_data)");
        return false;
    }
    return true;
}

int edl_k8s_open(const edl_k8s_config *c, edl_k8s **out)
{
    *out = NULL;
    edl_http_global_init();
    if (!config_valid(c))
        return EDL_EINVAL;
    edl_k8s *k = calloc(1, sizeof *k);
    if (!k)
        return EDL_ENOMEM;
    if (config_copy(&k->cfg, c) != 0 || !(k->curl = curl_easy_init())) {
        edl_k8s_config_clear(&k->cfg);
        free(k);
        return EDL_ENOMEM;
    }
    pthread_mutex_init(&k->mu, NULL);
    pthread_mutex_init(&k->token_mu, NULL);
    *out = k;
    return 0;
}

void edl_k8s_close(edl_k8s *k)
{
    if (!k)
        return;
    curl_easy_cleanup(k->curl);
    pthread_mutex_destroy(&k->mu);
    pthread_mutex_destroy(&k->token_mu);
    edl_k8s_config_clear(&k->cfg);
    if (k->file_token)
        explicit_bzero(k->file_token, strlen(k->file_token));
    free(k->file_token);
    free(k);
}

const char *edl_k8s_namespace(const edl_k8s *k)
{
    return k->cfg.namespace && k->cfg.namespace[0] ? k->cfg.namespace : "default";
}

const char *edl_k8s_server(const edl_k8s *k)
{
    return k->cfg.server;
}

void edl_k8s_get_stats(const edl_k8s *k, edl_k8s_stats *out)
{
    edl_k8s_stats s = {
        .requests = atomic_load(&((edl_k8s *)k)->requests),
        .retries = atomic_load(&((edl_k8s *)k)->retries),
        .watches = atomic_load(&((edl_k8s *)k)->watches),
        .relists = atomic_load(&((edl_k8s *)k)->relists),
    };
    *out = s;
}

void edl_k8s_reply_clear(edl_k8s_reply *r)
{
    if (!r)
        return;
    cJSON_Delete(r->body);
    memset(r, 0, sizeof *r);
}

/* ---- credentials and headers ------------------------------------------------------------- */

/* The token to send now (malloc'ed) or NULL. A token file wins over a token, as in client-go,
 * and is read again once the copy we hold is older than token_reread_ms: projected
 * service-account tokens rotate. A failed re-read keeps the old token. */
static char *current_token(edl_k8s *k)
{
    if (!k->cfg.token_file)
        return k->cfg.token ? strdup(k->cfg.token) : NULL;
    pthread_mutex_lock(&k->token_mu);
    int64_t now = edl_monotonic_ms();
    if (!k->file_token || now - k->file_token_ms >= k->cfg.token_reread_ms) {
        char *t = NULL;
        int rc = k8s_read_file(k->cfg.token_file, 64 << 10, &t);
        if (rc == 0 && !strpbrk(t, "\r\n")) {
            free(k->file_token);
            k->file_token = t;
            k->file_token_ms = now;
        } else {
            EDL_WARN("k8s", "token file %s: cannot read it (%s)%s", k->cfg.token_file,
                     rc ? edl_strerror(rc) : "holds a line break", k->file_token ? "; keeping the last token" : "");
            free(t);
        }
    }
    char *copy = k->file_token ? strdup(k->file_token) : NULL;
    pthread_mutex_unlock(&k->token_mu);
    return copy;
}

static struct curl_slist *add_header(struct curl_slist *h, const char *line)
{
    struct curl_slist *n = h ? curl_slist_append(h, line) : NULL;
    if (!n)
        curl_slist_free_all(h);
    return n;
}

static struct curl_slist *request_headers(edl_k8s *k, const char *content_type)
{
    struct curl_slist *h = curl_slist_append(NULL, "Accept: application/json");
    h = add_header(h, "Expect:"); /* no 100-continue round trip for larger bodies */
    if (content_type) {
        char line[160];
        snprintf(line, sizeof line, "Content-Type: %s", content_type);
        h = add_header(h, line);
    }
    char *tok = current_token(k);
    if (tok && h) {
        size_t n = strlen(tok) + 32;
        char *line = malloc(n);
        if (line) {
            snprintf(line, n, "Authorization: Bearer %s", tok);
            h = add_header(h, line);
            explicit_bzero(line, n);
        }
        free(line);
    }
    if (tok)
        explicit_bzero(tok, strlen(tok));
    free(tok);
    return h;
}

/* ---- one exchange ------------------------------------------------------------------------- */

bool k8s_stopped(const k8s_conn *c)
{
    if (!c->stop)
        return false;
    pthread_mutex_lock(c->stop_mu);
    bool s = *c->stop;
    pthread_mutex_unlock(c->stop_mu);
    return s;
}

static bool stop_asked(void *c)
{
    return k8s_stopped(c);
}

/* Run the transfer; in a multi handle when there is one, so a stop (curl_multi_wakeup) ends
 * it at once. */
static CURLcode perform(const k8s_conn *c)
{
    return edl_http_perform(c->multi, c->h, stop_asked, (void *)c);
}

static void set_method(CURL *h, const char *method, const char *body)
{
    if (strcmp(method, "GET") == 0) {
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
        return;
    }
    if (strcmp(method, "POST") != 0)
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    if (body || strcmp(method, "DELETE") != 0) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? strlen(body) : 0));
    }
}

CURLcode k8s_transfer(edl_k8s *k, const k8s_conn *c, k8s_xfer *x)
{
    size_t ulen = strlen(k->cfg.server) + strlen(x->path) + 1;
    char *url = malloc(ulen);
    struct curl_slist *hdrs = request_headers(k, x->body ? (x->content_type ? x->content_type : "application/json") : NULL);
    CURL *h = c->h;
    CURLcode cc = CURLE_OUT_OF_MEMORY;
    x->status = 0;
    x->retry_after_ms = -1;
    x->errbuf[0] = '\0';
    x->buf.max = K8S_MAX_REPLY;
    if (url && hdrs) {
        snprintf(url, ulen, "%s%s", k->cfg.server, x->path);
        curl_easy_reset(h); /* keeps the connection; drops the last request's options */
        curl_easy_setopt(h, CURLOPT_URL, url);
        const edl_k8s_config *tls = &k->cfg;
        edl_http_prepare(h, &(edl_http_opts){
            .connect_timeout_ms = CONNECT_TIMEOUT_MS, .timeout_ms = x->timeout_ms,
            .keepalive = true, .user_agent = "edl-operator/0.1",
            .ca_file = tls->ca_file, .ca_pem = tls->ca_data, .cert_file = tls->cert_file,
            .cert_pem = tls->cert_data, .key_file = tls->key_file, .key_pem = tls->key_data,
            .insecure = tls->insecure_skip_tls_verify});
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, x->errbuf);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, x->write ? x->write : edl_bytebuf_curl_write);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, x->write ? x->arg : &x->buf);
        set_method(h, x->method, x->body);
        atomic_fetch_add(&k->requests, 1);
        cc = perform(c);
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &x->status);
        if (x->status)
            x->retry_after_ms = edl_http_retry_after_ms(h);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
    }
    curl_slist_free_all(hdrs);
    free(url);
    return cc;
}

/* ---- replies and retries ------------------------------------------------------------------ */

static void copy_printable(char *dst, size_t len, const char *src, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 1 < len; i++)
        dst[o++] = src[i] >= 0x20 && src[i] < 0x7f ? src[i] : ' ';
    dst[o] = '\0';
}

/* The reply: status, the JSON body, a Status object's reason and message (or, for an error
 * that is not JSON, the start of its text). */
static void fill_reply(edl_k8s_reply *r, long status, edl_bytebuf *b)
{
    memset(r, 0, sizeof *r);
    r->status = status;
    if (b->len)
        r->body = cJSON_ParseWithLength(b->data, b->len);
    const char *kind = edl_k8s_str(r->body, "kind");
    if (kind && strcmp(kind, "Status") == 0) {
        const char *reason = edl_k8s_str(r->body, "reason"), *msg = edl_k8s_str(r->body, "message");
        snprintf(r->reason, sizeof r->reason, "%s", reason ? reason : "");
        snprintf(r->message, sizeof r->message, "%s", msg ? msg : "");
    } else if (!r->body && (status < 200 || status > 299) && b->len) {
        copy_printable(r->message, sizeof r->message, b->data, b->len < 200 ? b->len : 200);
    }
    if (!r->message[0] && (status < 200 || status > 299))
        snprintf(r->message, sizeof r->message, "HTTP %ld", status);
}

static int transport_error(edl_k8s *k, const char *method, const char *path, CURLcode cc,
                           const k8s_xfer *x, edl_k8s_reply *out)
{
    int code = x->buf.overflow ? EDL_ETOOBIG : edl_http_code(cc);
    memset(out, 0, sizeof *out);
    if (x->buf.overflow)
        snprintf(out->message, sizeof out->message, "%s %s%s: reply over %u bytes", method,
                 k->cfg.server, path, K8S_MAX_REPLY);
    else
        snprintf(out->message, sizeof out->message, "%s %s%s: %s", method, k->cfg.server, path,
                 x->errbuf[0] ? x->errbuf : curl_easy_strerror(cc));
    return code;
}

/* Whether to try again, and after how long. */
static bool should_retry(const char *method, CURLcode cc, const k8s_xfer *x, int attempt,
                         int64_t *wait_ms)
{
    *wait_ms = edl_http_backoff_ms(attempt, K8S_RETRY_BASE_MS, K8S_RETRY_MAX_MS,
                                   cc == CURLE_OK ? x->retry_after_ms : -1);
    if (cc == CURLE_OK)
        return x->status == 429 || x->status >= 500;
    if (x->buf.overflow || cc == CURLE_ABORTED_BY_CALLBACK || edl_http_code(cc) == EDL_EAUTH)
        return false;
    /* a request that may have reached the server is sent again only when reading */
    return edl_http_not_sent(cc) || strcmp(method, "GET") == 0;
}

void k8s_set_write_fence(edl_k8s *k, bool (*may_write)(void *), void *arg)
{
    atomic_store(&k->may_write_arg, arg);
    atomic_store(&k->may_write, may_write);
}

/* A write that the fence refuses now (checked before each attempt: a retry may come late). */
static bool fenced(edl_k8s *k, const char *method, const char *path, edl_k8s_reply *out)
{
    bool (*may_write)(void *) = atomic_load(&k->may_write);
    if (!may_write || strcmp(method, "GET") == 0 || may_write(atomic_load(&k->may_write_arg)))
        return false;
    snprintf(out->message, sizeof out->message, "%s %s: not sent: this replica no longer "
             "leads", method, path);
    return true;
}

int k8s_request_on(edl_k8s *k, const k8s_conn *c, const char *method, const char *path,
                   const char *content_type, const char *body, bool retry, edl_k8s_reply *out)
{
    for (int attempt = 0;; attempt++) {
        if (fenced(k, method, path, out))
            return EDL_ELEASE;
        k8s_xfer x = {.method = method, .path = path, .content_type = content_type, .body = body,
                      .timeout_ms = k->cfg.timeout_ms};
        CURLcode cc = k8s_transfer(k, c, &x);
        int64_t wait_ms;
        bool again = retry && attempt < K8S_RETRIES && should_retry(method, cc, &x, attempt, &wait_ms) &&
                     !k8s_stopped(c);
        if (!again) {
            int rc = 0;
            if (cc != CURLE_OK)
                rc = transport_error(k, method, path, cc, &x, out);
            else
                fill_reply(out, x.status, &x.buf);
            edl_bytebuf_clear(&x.buf);
            return rc;
        }
        EDL_DEBUG("k8s", "%s %s: %s; retrying in %lld ms", method, path,
                  cc == CURLE_OK ? "server busy or failing" : curl_easy_strerror(cc), (long long)wait_ms);
        edl_bytebuf_clear(&x.buf);
        atomic_fetch_add(&k->retries, 1);
        nanosleep(&(struct timespec){wait_ms / 1000, (wait_ms % 1000) * 1000000}, NULL);
    }
}

int edl_k8s_request(edl_k8s *k, const char *method, const char *path, const char *content_type,
                    const char *body, edl_k8s_reply *out)
{
    edl_k8s_reply tmp;
    if (!out)
        out = &tmp;
    memset(out, 0, sizeof *out);
    if (!k || !method || !path || path[0] != '/')
        return EDL_EINVAL;
    pthread_mutex_lock(&k->mu);
    k8s_conn c = {.h = k->curl};
    int rc = k8s_request_on(k, &c, method, path, content_type, body, true, out);
    pthread_mutex_unlock(&k->mu);
    if (out == &tmp)
        edl_k8s_reply_clear(&tmp);
    return rc;
}

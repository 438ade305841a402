/* client.c: the etcd client's transport. One keep-alive libcurl connection per client,
 * JSON POSTs to the v3 gateway, fail-over across endpoints within the call's deadline,
 * token authentication renewed on expiry, and errors mapped to EDL_E* codes with messages
 * that name the endpoint and the key. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stddef.h>

#include "edl/json.h"
#include "edl/log.h"
#include "internal.h"

#define DEFAULT_TIMEOUT_MS 5000
#define DEFAULT_CONNECT_TIMEOUT_MS 1000
#define DEFAULT_MAX_RESPONSE (64u << 20)



/* ---- configuration --------------------------------------------------------------------- */

void edl_etcd_config_init(edl_etcd_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->timeout_ms = DEFAULT_TIMEOUT_MS;
    cfg->connect_timeout_ms = DEFAULT_CONNECT_TIMEOUT_MS;
    cfg->max_response_bytes = DEFAULT_MAX_RESPONSE;
}

static void free_endpoints(edl_etcd_config *cfg)
{
    for (size_t i = 0; i < cfg->n_endpoints; i++)
        free(cfg->endpoints[i]);
    free(cfg->endpoints);
    cfg->endpoints = NULL;
    cfg->n_endpoints = 0;
}

void edl_etcd_config_clear(edl_etcd_config *cfg)
{
    if (!cfg)
        return;
    free_endpoints(cfg);
    free(cfg->ca_file);
    free(cfg->cert_file);
    free(cfg->key_file);
    free(cfg->username);
    if (cfg->password)
        explicit_bzero(cfg->password, strlen(cfg->password));
    free(cfg->password);
    free(cfg->password_file);
    memset(cfg, 0, sizeof *cfg);
}

/* An endpoint is http(s)://host[:port] with no path; a trailing '/' is dropped. */
static int endpoint_valid(const char *s, size_t n)
{
    size_t skip = 0;
    if (n > 7 && strncmp(s, "http://", 7) == 0)
        skip = 7;
    else if (n > 8 && strncmp(s, "https://", 8) == 0)
        skip = 8;
    if (!skip || n - skip > 255)
        return 0;
    for (size_t i = skip; i < n; i++)
        if (s[i] == '/' || isspace((unsigned char)s[i]))
            return 0;
    return 1;
}

int edl_etcd_config_set_endpoints(edl_etcd_config *cfg, const char *csv)
{
    if (!cfg || !csv)
        return EDL_EINVAL;
    char **list = NULL;
    size_t n = 0;
    const char *p = csv;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        while (len && isspace((unsigned char)*p)) {
            p++;
            len--;
        }
        while (len && isspace((unsigned char)p[len - 1]))
            len--;
        if (len && p[len - 1] == '/')
            len--;
        if (!endpoint_valid(p, len)) {
            EDL_ERROR("etcd", "invalid etcd endpoint '%.*s' in '%s': expected http://host:port or https://host:port",
                      (int)len, p, csv);
            goto invalid;
        }
        char **grown = realloc(list, (n + 1) * sizeof *list);
        if (!grown)
            goto nomem;
        list = grown;
        if (!(list[n] = strndup(p, len)))
            goto nomem;
        n++;
        p += len;
        while (*p && *p != ',')
            p++;
        if (*p == ',')
            p++;
    }
    if (n == 0) {
        EDL_ERROR("etcd", "no etcd endpoint in '%s'", csv);
        goto invalid;
    }
    free_endpoints(cfg);
    cfg->endpoints = list;
    cfg->n_endpoints = n;
    return 0;
nomem:
    for (size_t i = 0; i < n; i++)
        free(list[i]);
    free(list);
    return EDL_ENOMEM;
invalid:
    for (size_t i = 0; i < n; i++)
        free(list[i]);
    free(list);
    return EDL_EINVAL;
}

static int dup_opt(char **dst, const char *src)
{
    *dst = NULL;
    if (src && !(*dst = strdup(src)))
        return EDL_ENOMEM;
    return 0;
}

int etcd_config_copy(edl_etcd_config *dst, const edl_etcd_config *src)
{
    edl_etcd_config_init(dst);
    if (src->timeout_ms > 0)
        dst->timeout_ms = src->timeout_ms;
    if (src->connect_timeout_ms > 0)
        dst->connect_timeout_ms = src->connect_timeout_ms;
    if (src->max_response_bytes > 0)
        dst->max_response_bytes = src->max_response_bytes;
    dst->endpoints = calloc(src->n_endpoints, sizeof *dst->endpoints);
    if (!dst->endpoints)
        goto nomem;
    for (size_t i = 0; i < src->n_endpoints; i++) {
        if (!(dst->endpoints[i] = strdup(src->endpoints[i])))
            goto nomem;
        dst->n_endpoints = i + 1;
    }
    if (dup_opt(&dst->ca_file, src->ca_file) || dup_opt(&dst->cert_file, src->cert_file) ||
        dup_opt(&dst->key_file, src->key_file) || dup_opt(&dst->username, src->username) ||
        dup_opt(&dst->password, src->password) ||
        dup_opt(&dst->password_file, src->password_file))
        goto nomem;
    return 0;
nomem:
    edl_etcd_config_clear(dst);
    return EDL_ENOMEM;
}

/* ---- client ------------------------------------------------------------------------------ */

int edl_etcd_open(const edl_etcd_config *cfg, edl_etcd **out)
{
    *out = NULL;
    edl_http_global_init();
    if (!cfg || cfg->n_endpoints == 0) {
        EDL_ERROR("etcd", "no etcd endpoint configured");
        return EDL_EINVAL;
    }
    for (size_t i = 0; i < cfg->n_endpoints; i++)
        if (!cfg->endpoints[i] || !endpoint_valid(cfg->endpoints[i], strlen(cfg->endpoints[i]))) {
            EDL_ERROR("etcd", "invalid etcd endpoint '%s': expected http://host:port or https://host:port",
                      cfg->endpoints[i] ? cfg->endpoints[i] : "(null)");
            return EDL_EINVAL;
        }
    if ((cfg->cert_file == NULL) != (cfg->key_file == NULL) ||
        (cfg->username == NULL) != (cfg->password == NULL)) {
        EDL_ERROR("etcd", "%s", (cfg->cert_file == NULL) != (cfg->key_file == NULL)
                                    ? "a TLS client certificate needs its key (cert_file with key_file)"
                                    : "etcd auth needs both username and password");
        return EDL_EINVAL;
    }
    edl_etcd *c = calloc(1, sizeof *c);
    if (!c)
        return EDL_ENOMEM;
    if (etcd_config_copy(&c->cfg, cfg) != 0 || !(c->curl = curl_easy_init())) {
        edl_etcd_config_clear(&c->cfg);
        free(c);
        return EDL_ENOMEM;
    }
    pthread_mutex_init(&c->mu, NULL);
    etcd_curl_common(c, c->curl);
    *out = c;
    return 0;
}

int edl_etcd_open_endpoints(const char *endpoints_csv, edl_etcd **out)
{
    edl_etcd_config cfg;
    edl_etcd_config_init(&cfg);
    int rc = edl_etcd_config_set_endpoints(&cfg, endpoints_csv);
    if (rc == 0)
        rc = edl_etcd_open(&cfg, out);
    edl_etcd_config_clear(&cfg);
    return rc;
}

void edl_etcd_close(edl_etcd *c)
{
    if (!c)
        return;
    curl_easy_cleanup(c->curl);
    pthread_mutex_destroy(&c->mu);
    edl_etcd_config_clear(&c->cfg);
    free(c->token);
    free(c);
}

const char *edl_etcd_errmsg(const edl_etcd *c)
{
    return c ? c->errmsg : "no client";
}

const char *edl_etcd_endpoint(const edl_etcd *c)
{
    return c->cfg.endpoints[c->cur];
}

int etcd_fail(edl_etcd *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
    va_end(ap);
    EDL_DEBUG("etcd", "%s (%s)", c->errmsg, edl_strerror(code));
    return code;
}

const char *etcd_key_str(edl_buf key, char *out, size_t outlen)
{
    size_t o = 0;
    for (size_t i = 0; i < key.len; i++) {
        unsigned char ch = (unsigned char)key.data[i];
        size_t need = ch >= 0x20 && ch < 0x7f ? 1 : 4;
        if (o + need + 4 > outlen) { /* keep room for "..." and the NUL */
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        if (need == 1)
            out[o++] = (char)ch;
        else
            o += (size_t)snprintf(out + o, outlen - o, "\\x%02x", ch);
    }
    out[o] = '\0';
    return out;
}

/* ---- transport --------------------------------------------------------------------------- */

void etcd_curl_common(edl_etcd *c, CURL *h)
{
    /* keep-alive: a dead peer on a quiet connection (a watch with no events) is noticed */
    edl_http_prepare(h, &(edl_http_opts){.connect_timeout_ms = c->cfg.connect_timeout_ms,
                                         .nodelay = true, .keepalive = true,
                                         .ca_file = c->cfg.ca_file, .cert_file = c->cfg.cert_file,
                                         .key_file = c->cfg.cert_file ? c->cfg.key_file : NULL});
}

struct curl_slist *etcd_headers(edl_etcd *c)
{
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    /* No "Expect: 100-continue" round trip for larger bodies. */
    h = h ? curl_slist_append(h, "Expect:") : NULL;
    if (h && c->token) {
        size_t n = strlen(c->token) + 32;
        char *line = malloc(n);
        if (line) {
            snprintf(line, n, "Authorization: %s", c->token);
            struct curl_slist *h2 = curl_slist_append(h, line);
            free(line);
            if (!h2) {
                curl_slist_free_all(h);
                return NULL;
            }
            h = h2;
        }
    }
    return h;
}

typedef struct http_reply {
    CURLcode cc;
    long status;
    edl_bytebuf body;
    char curl_err[CURL_ERROR_SIZE];
} http_reply;

/* One POST on the client's connection. */
static void http_post(edl_etcd *c, const char *endpoint, const char *path, const char *body,
                      long timeout_ms, http_reply *r)
{
    char url[512];
    snprintf(url, sizeof url, "%s%s", endpoint, path);
    memset(r, 0, sizeof *r);
    r->body.max = (size_t)c->cfg.max_response_bytes;
    struct curl_slist *hdrs = etcd_headers(c);
    CURL *h = c->curl;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, edl_bytebuf_curl_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r->body);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, r->curl_err);
    r->cc = curl_easy_perform(h);
    if (r->cc == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
    curl_slist_free_all(hdrs);
}

/* The server ended the TLS session with an alert about our certificate (none, or one it does
 * not trust): with TLS 1.3 this comes after the handshake, as a failed read or send. */
static bool tls_alert(const http_reply *r)
{
    return strstr(r->curl_err, "certificate required") || strstr(r->curl_err, "bad certificate") ||
           strstr(r->curl_err, "unknown ca") || strstr(r->curl_err, "certificate unknown");
}

/* An https server that ended the session of a client without a certificate, with an alert or
 * without a word (libcurl then says "getpeername() failed with errno 107"), requires one: every
 * member would say the same, so it is said at once, in words a person can act on. */
static bool client_cert_missing(const edl_etcd *c, const char *endpoint, const http_reply *r)
{
    return !c->cfg.cert_file && strncmp(endpoint, "https://", 8) == 0 &&
           (tls_alert(r) || strstr(r->curl_err, "getpeername"));
}

/* The server's own words from an error body: {"error":..,"message":..,"code":..} (3.4) or
 * without "error" (3.6). Never trusts the body to be JSON. */
static void server_message(const edl_bytebuf *b, char *out, size_t outlen)
{
    out[0] = '\0';
    cJSON *j = b->data ? cJSON_ParseWithLength(b->data, b->len) : NULL;
    const cJSON *m = j ? cJSON_GetObjectItemCaseSensitive(j, "message") : NULL;
    if (!cJSON_IsString(m) && j)
        m = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (cJSON_IsString(m))
        snprintf(out, outlen, "%s", m->valuestring);
    else if (b->data)
        snprintf(out, outlen, "%.200s", b->data);
    cJSON_Delete(j);
}

static int status_code(long status, const char *msg)
{
    /* "request is too large" (over --max-request-bytes), "received message larger than max"
     * (over the gateway's gRPC limit, HTTP 429), "too many operations in txn request" */
    if (status == 429 || strstr(msg, "too large") || strstr(msg, "larger than max") ||
        strstr(msg, "too many operations"))
        return EDL_ETOOBIG;
    if (strstr(msg, "compacted"))
        return EDL_ECOMPACTED;
    /* auth is on and the request carries no usable identity (3.4 answers 400/412 for some) */
    if (strstr(msg, "user name is empty") || strstr(msg, "permission denied") ||
        strstr(msg, "invalid auth token") || strstr(msg, "authentication failed"))
        return EDL_EAUTH;
    switch (status) {
    case 401:
    case 403: return EDL_EAUTH;
    case 404: return EDL_ENOTFOUND;
    case 408:
    case 504: return EDL_ETIMEDOUT;
    }
    return EDL_ESERVER;
}

int etcd_authenticate_locked(edl_etcd *c, const char *endpoint)
{
    cJSON *req = cJSON_CreateObject();
    if (!req || !cJSON_AddStringToObject(req, "name", c->cfg.username) ||
        !cJSON_AddStringToObject(req, "password", c->cfg.password)) {
        cJSON_Delete(req);
        return EDL_ENOMEM;
    }
    char *body = edl_json_print(req, false);
    cJSON_Delete(req);
    if (!body)
        return EDL_ENOMEM;
    free(c->token);
    c->token = NULL;
    http_reply r;
    http_post(c, endpoint, "/v3/auth/authenticate", body, c->cfg.timeout_ms, &r);
    free(body);
    int rc = 0;
    char msg[256];
    if (r.cc != CURLE_OK) {
        rc = etcd_fail(c, edl_http_not_sent(r.cc) ? EDL_EUNAVAIL : EDL_ETIMEDOUT,
                       "%s: authenticate as '%s': %s", endpoint, c->cfg.username,
                       r.curl_err[0] ? r.curl_err : curl_easy_strerror(r.cc));
    } else if (r.status != 200) {
        server_message(&r.body, msg, sizeof msg);
        rc = etcd_fail(c, EDL_EAUTH, "%s: authenticate as '%s' failed (HTTP %ld): %s", endpoint,
                       c->cfg.username, r.status, msg);
    } else {
        cJSON *j = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "token");
        if (cJSON_IsString(t) && t->valuestring[0] && !strpbrk(t->valuestring, "\r\n"))
            c->token = strdup(t->valuestring);
        else
            rc = etcd_fail(c, EDL_EPROTO, "%s: authenticate: reply has no token", endpoint);
        if (!rc && !c->token)
            rc = EDL_ENOMEM;
        cJSON_Delete(j);
    }
    free(r.body.data);
    return rc;
}

/* Decide what one attempt's outcome means. Returns 0 with *resp on success; otherwise a code
 * and whether another endpoint may be tried (*retry). */
static int judge(edl_etcd *c, const char *endpoint, const char *path, edl_buf key,
                 bool idempotent, http_reply *r, cJSON **resp, bool *retry)
{
    char ks[96], msg[256];
    etcd_key_str(key, ks, sizeof ks);
    const char *kl = key.len ? " key '" : "", *kr = key.len ? "'" : "";
    *retry = false;
    if (r->cc != CURLE_OK) {
        if (r->body.overflow)
            return etcd_fail(c, EDL_ETOOBIG, "%s%s%s%s%s: reply exceeds %lld bytes", endpoint, path,
                             kl, ks, kr, (long long)c->cfg.max_response_bytes);
        if (client_cert_missing(c, endpoint, r))
            return etcd_fail(c, EDL_EAUTH, "%s%s%s%s%s: etcd requires a client certificate and "
                             "none was given: pass --cert FILE and --key FILE (or set "
                             "EDL_ETCD_CERT and EDL_ETCD_KEY) (%s)", endpoint, path, kl, ks, kr,
                             r->curl_err[0] ? r->curl_err : curl_easy_strerror(r->cc));
        *retry = edl_http_not_sent(r->cc) || idempotent;
        int code = r->cc == CURLE_OPERATION_TIMEDOUT ? EDL_ETIMEDOUT
                   : edl_http_tls_refused(r->cc) || tls_alert(r) ? EDL_EAUTH
                                                     : EDL_EUNAVAIL;
        return etcd_fail(c, code, "%s%s%s%s%s: %s%s", endpoint, path, kl, ks, kr,
                         r->curl_err[0] ? r->curl_err : curl_easy_strerror(r->cc),
                         edl_http_not_sent(r->cc) || idempotent ? "" : " (the request may have been applied)");
    }
    if (r->status != 200) {
        server_message(&r->body, msg, sizeof msg);
        /* 503: no leader or shutting down; nothing was applied, another member may serve it. */
        *retry = r->status == 503 || r->status == 502;
        return etcd_fail(c, *retry ? EDL_EUNAVAIL : status_code(r->status, msg),
                         "%s%s%s%s%s: HTTP %ld: %s", endpoint, path, kl, ks, kr, r->status,
                         msg[0] ? msg : "(no message)");
    }
    const char *end = NULL;
    /* the buffer's own NUL is included so that trailing garbage is refused */
    *resp = cJSON_ParseWithLengthOpts(r->body.data ? r->body.data : "", r->body.len + 1, &end, 1);
    if (!*resp || !cJSON_IsObject(*resp)) {
        size_t at = end && r->body.data ? (size_t)(end - r->body.data) : 0;
        cJSON_Delete(*resp);
        *resp = NULL;
        return etcd_fail(c, EDL_EPROTO, "%s%s%s%s%s: malformed JSON reply (%zu bytes, error near byte %zu)",
                         endpoint, path, kl, ks, kr, r->body.len, at);
    }
    return 0;
}

int etcd_call(edl_etcd *c, const char *path, cJSON *req, cJSON **resp, edl_buf key,
              bool idempotent, int timeout_ms)
{
    *resp = NULL;
    char *body = edl_json_print(req, false);
    cJSON_Delete(req);
    if (!body)
        return etcd_fail(c, EDL_ENOMEM, "%s: out of memory building the request", path);
    pthread_mutex_lock(&c->mu);
    c->errmsg[0] = '\0';
    int64_t deadline = edl_monotonic_ms() + (timeout_ms > 0 ? timeout_ms : c->cfg.timeout_ms);
    int rc = EDL_ETIMEDOUT, rounds = 0;
    bool reauthed = false;
    size_t tried = 0, refused = 0;
    for (;;) {
        int64_t left = deadline - edl_monotonic_ms();
        if (left <= 0)
            break;
        const char *ep = c->cfg.endpoints[c->cur];
        if (c->cfg.username && !c->token && (rc = etcd_authenticate_locked(c, ep)) != 0) {
            if (rc == EDL_EAUTH)
                break;
            goto next_endpoint;
        }
        http_reply r;
        http_post(c, ep, path, body, (long)left, &r);
        bool retry;
        if (r.cc == CURLE_OK && r.status == 401 && c->cfg.username && !reauthed) {
            /* the token expired (simple tokens live 300 s): fetch a new one, send again */
            free(r.body.data);
            free(c->token);
            c->token = NULL;
            reauthed = true;
            continue;
        }
        rc = judge(c, ep, path, key, idempotent, &r, resp, &retry);
        free(r.body.data);
        /* a TLS refusal (untrusted server, certificate refused) is not cured by waiting: another
         * member may be configured right, but once every member has refused, that is the answer */
        if (rc == 0 || !retry || (rc == EDL_EAUTH && ++refused >= c->cfg.n_endpoints))
            break;
    next_endpoint:
        EDL_DEBUG("etcd", "%s; trying the next endpoint", c->errmsg);
        c->cur = (c->cur + 1) % c->cfg.n_endpoints;
        if (++tried % c->cfg.n_endpoints == 0) {
            /* every endpoint failed once: back off before the next round */
            int64_t nap = edl_http_backoff_ms(rounds++, 25, 500, -1), left_ms = deadline - edl_monotonic_ms();
            if (nap > left_ms)
                nap = left_ms;
            if (nap > 0)
                nanosleep(&(struct timespec){nap / 1000, (nap % 1000) * 1000000}, NULL);
        }
    }
    if (rc == EDL_ETIMEDOUT && !c->errmsg[0])
        etcd_fail(c, rc, "%s: no reply within %lld ms", path,
                  (long long)(timeout_ms > 0 ? timeout_ms : c->cfg.timeout_ms));
    pthread_mutex_unlock(&c->mu);
    free(body);
    return rc;
}

/* s3.c: the s3:// back end of edl/storage.h, for AWS S3, MinIO, Ceph RGW and friends.
 *
 * Requests are signed by libcurl itself (CURLOPT_AWS_SIGV4), so no crypto is written here.
 * Two details make that portable across libcurl versions: every request carries
 * x-amz-content-sha256 (UNSIGNED-PAYLOAD: S3 requires the header, libcurl signs what it says,
 * and the checkpoint layer checks a digest of every shard itself), and query strings are
 * built already canonical (sorted, percent-encoded, "uploads=") because libcurl before 8.x
 * signs the query exactly as given.
 *
 * A buffer up to multipart_threshold (a stream up to part_size) goes up in one PUT; a larger
 * one as a multipart upload whose parts are sent parallel_parts at a time on one libcurl multi
 * handle, the upload being aborted when any part fails for good. 5xx replies and connection
 * errors are retried with jittered back-off. */
#define _GNU_SOURCE
#include "edl/http.h"
#include "internal.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_ERROR_BODY (64u << 10)  /* error and XML replies we keep */
#define MAX_XML_BODY (16u << 20)    /* a list page is ~1000 keys, far below this */
#define MAX_PARTS 10000             /* S3's limit */
#define MIN_PART_SIZE (5u << 20)    /* S3's minimum for all parts but the last */
#define MAX_SINGLE_PUT (5ull << 30) /* S3's largest object in one PUT */
#define MAX_BACKOFF_MS 10000

typedef struct s3_store {
    char *scheme;    /* "http" or "https" */
    char *authority; /* host[:port] */
    char *bucket;
    char *prefix;    /* "" or "dir/sub/" */
    char *sigv4;     /* "aws:amz:<region>:s3" */
    char *access_key, *secret_key;
    char *token_hdr; /* "x-amz-security-token: ..." or NULL */
    bool path_style;
    int64_t timeout_ms, connect_timeout_ms, retry_base_ms;
    int max_retries, parallel;
    size_t part_size;
    size_t threshold; /* a buffer larger than this goes up in parts */
    CURL *easy;      /* kept for its connection: sequential requests reuse it */
} s3_store;

typedef struct s3_req {
    const char *method;
    char *url;
    /* upload body (PUT via read callback, POST via postfields) */
    const char *body;
    size_t body_len, body_off;
    bool has_body;
    /* download: to a sink (2xx only), else into resp */
    edl_storage_write_fn sink;
    void *sink_arg;
    uint64_t delivered; /* bytes given to the sink, over all attempts */
    uint64_t skip;      /* bytes to drop when a resume got the whole object again */
    int sink_rc;
    bool head;
    /* reply */
    CURL *h;
    long status;
    char etag[256];
    char *resp;
    size_t resp_len, resp_max;
    bool resp_cut;
    char curl_err[CURL_ERROR_SIZE];
    struct curl_slist *hdrs;
} s3_req;

/* ---- configuration ------------------------------------------------------------------- */

static const char *pick(const char *cfg_value, const char *env1, const char *env2)
{
    if (cfg_value && cfg_value[0])
        return cfg_value;
    const char *v = env1 ? getenv(env1) : NULL;
    if (v && v[0])
        return v;
    v = env2 ? getenv(env2) : NULL;
    return v && v[0] ? v : NULL;
}

static bool bucket_valid(const char *b, size_t n)
{
    if (n < 3 || n > 63)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9') || b[i] == '-' ||
              b[i] == '.' || b[i] == '_'))
            return false;
    return true;
}

static void s3_close(edl_storage *s)
{
    s3_store *st = s->impl;
    if (!st)
        return;
    if (st->easy)
        curl_easy_cleanup(st->easy);
    free(st->scheme);
    free(st->authority);
    free(st->bucket);
    free(st->prefix);
    free(st->sigv4);
    free(st->access_key);
    free(st->secret_key);
    free(st->token_hdr);
    free(st);
    s->impl = NULL;
}

static int parse_endpoint(edl_storage *s, s3_store *st, const char *ep)
{
    const char *sep = strstr(ep, "://");
    if (!sep || (strncmp(ep, "http", 4) != 0) || (sep - ep != 4 && sep - ep != 5) ||
        (sep - ep == 5 && ep[4] != 's'))
        return storage_fail(s, EDL_ECONFIG, "S3 endpoint \"%.200s\" must be http://host[:port] "
                            "or https://host[:port]", ep);
    const char *auth = sep + 3;
    size_t n = strcspn(auth, "/?#");
    if (n == 0 || (auth[n] && strcmp(auth + n, "/") != 0))
        return storage_fail(s, EDL_ECONFIG, "S3 endpoint \"%.200s\" must have a host and no path",
                            ep);
    st->scheme = strndup(ep, (size_t)(sep - ep));
    st->authority = strndup(auth, n);
    return st->scheme && st->authority ? 0 : EDL_ENOMEM;
}

static int s3_open(edl_storage *s, const edl_storage_config *cfg, const char *rest)
{
    edl_http_global_init();
    size_t blen = strcspn(rest, "/");
    if (!bucket_valid(rest, blen))
        return storage_fail(s, EDL_EINVAL, "S3 URI \"%.200s\": the bucket name must be 3-63 "
                            "lowercase letters, digits, '.', '-' (s3://bucket/prefix)", s->uri);
    s3_store *st = calloc(1, sizeof *st);
    if (!st)
        return EDL_ENOMEM;
    s->impl = st;
    const char *pfx = rest[blen] ? rest + blen + 1 : "";
    size_t plen = strlen(pfx);
    while (plen && pfx[plen - 1] == '/')
        plen--;
    st->bucket = strndup(rest, blen);
    if (!st->bucket || asprintf(&st->prefix, "%.*s%s", (int)plen, pfx, plen ? "/" : "") < 0) {
        st->prefix = NULL;
        return EDL_ENOMEM;
    }
    char *bare = strndup(pfx, plen);
    bool ok = bare && (plen == 0 || edl_storage_key_valid(bare));
    free(bare);
    if (!ok)
        return storage_fail(s, EDL_EINVAL, "S3 URI \"%.200s\": the prefix must be a valid key "
                            "(letters, digits, \"._-\", segments joined by \"/\")", s->uri);

    const char *region = pick(cfg->region, "AWS_REGION", "AWS_DEFAULT_REGION");
    if (!region)
        region = "us-east-1";
    const char *ep = pick(cfg->endpoint, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL");
    char *default_ep = NULL;
    if (!ep && asprintf(&default_ep, "https://s3.%s.amazonaws.com", region) < 0)
        return EDL_ENOMEM;
    int rc = parse_endpoint(s, st, ep ? ep : default_ep);
    free(default_ep);
    if (rc)
        return rc;

    edl_s3_addressing mode = cfg->addressing;
    const char *env_mode = getenv("EDL_S3_ADDRESSING");
    if (mode == EDL_S3_AUTO && env_mode && env_mode[0]) {
        if (strcmp(env_mode, "path") == 0)
            mode = EDL_S3_PATH;
        else if (strcmp(env_mode, "virtual") == 0)
            mode = EDL_S3_VIRTUAL;
        else
            return storage_fail(s, EDL_ECONFIG, "EDL_S3_ADDRESSING=\"%.40s\": use path or virtual",
                                env_mode);
    }
    st->path_style = mode == EDL_S3_PATH || (mode == EDL_S3_AUTO && ep != NULL);
    if (!st->path_style && strchr(st->bucket, '.') && strcmp(st->scheme, "https") == 0)
        st->path_style = true; /* a dotted bucket breaks the wildcard certificate */

    const char *ak = pick(cfg->access_key_id, "AWS_ACCESS_KEY_ID", NULL);
    const char *sk = pick(cfg->secret_access_key, "AWS_SECRET_ACCESS_KEY", NULL);
    const char *tok = pick(cfg->session_token, "AWS_SESSION_TOKEN", NULL);
    if (!ak || !sk)
        return storage_fail(s, EDL_ECONFIG, "no S3 credentials for %s: set AWS_ACCESS_KEY_ID and "
                            "AWS_SECRET_ACCESS_KEY (or the config's access_key_id and "
                            "secret_access_key)", s->uri);
    if (strpbrk(region, ":\r\n") || (tok && strpbrk(tok, "\r\n")))
        return storage_fail(s, EDL_ECONFIG, "invalid AWS region or session token");
    st->access_key = strdup(ak);
    st->secret_key = strdup(sk);
    if (!st->access_key || !st->secret_key ||
        asprintf(&st->sigv4, "aws:amz:%s:s3", region) < 0 ||
        (tok && asprintf(&st->token_hdr, "x-amz-security-token: %s", tok) < 0))
        return EDL_ENOMEM;
    st->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 300000;
    st->connect_timeout_ms = cfg->connect_timeout_ms > 0 ? cfg->connect_timeout_ms : 3000;
    st->retry_base_ms = cfg->retry_base_ms > 0 ? cfg->retry_base_ms : 200;
    st->max_retries = cfg->max_retries >= 0 ? cfg->max_retries : 4;
    st->parallel = cfg->parallel_parts > 0 ? cfg->parallel_parts : 4;
    if (st->parallel > 64)
        st->parallel = 64;
    st->part_size = cfg->part_size >= MIN_PART_SIZE ? cfg->part_size : MIN_PART_SIZE;
    st->threshold = cfg->multipart_threshold ? cfg->multipart_threshold : st->part_size;
    if (st->threshold > MAX_SINGLE_PUT)
        st->threshold = MAX_SINGLE_PUT;
    if (!(st->easy = curl_easy_init()))
        return EDL_ENOMEM;
    return 0;
}

/* ---- URLs ---------------------------------------------------------------------------- */

/* The URL of an object (key relative to the URI's root, NULL: the bucket itself) with an
 * optional query that must already be canonical. */
static char *object_url(s3_store *st, const char *key, const char *query)
{
    char *url = NULL;
    const char *q = query ? "?" : "", *qs = query ? query : "";
    int r;
    if (st->path_style)
        r = asprintf(&url, "%s://%s/%s%s%s%s%s", st->scheme, st->authority, st->bucket,
                     key ? "/" : "", key ? st->prefix : "", key ? key : "", "");
    else
        r = asprintf(&url, "%s://%s.%s/%s%s", st->scheme, st->bucket, st->authority,
                     key ? st->prefix : "", key ? key : "");
    if (r < 0)
        return NULL;
    char *full = NULL;
    r = asprintf(&full, "%s%s%s", url, q, qs);
    free(url);
    return r < 0 ? NULL : full;
}

static char *escape(const char *s)
{
    char *e = curl_easy_escape(NULL, s, 0);
    char *copy = e ? strdup(e) : NULL;
    curl_free(e);
    return copy;
}

/* ---- one request --------------------------------------------------------------------- */

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
    s3_req *r = arg;
    size_t len = size * n;
    if (len >= 5 && strncmp(p, "HTTP/", 5) == 0) {
        r->etag[0] = '\0';
        /* A resumed GET (Range: bytes=N-) that got 200 instead of 206 carries the object
         * from its first byte again: drop what the sink already has. */
        long code = 0;
        char line[64];
        snprintf(line, sizeof line, "%.*s", (int)(len < 63 ? len : 63), p);
        sscanf(line, "HTTP/%*s %ld", &code);
        r->skip = r->sink && r->delivered > 0 && code == 200 ? r->delivered : 0;
    } else if (len > 5 && strncasecmp(p, "ETag:", 5) == 0) {
        const char *v = p + 5;
        size_t vl = len - 5;
        while (vl && (*v == ' ' || *v == '\t'))
            v++, vl--;
        while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
            vl--;
        if (vl < sizeof r->etag && !memchr(v, '<', vl) && !memchr(v, '&', vl)) {
            memcpy(r->etag, v, vl);
            r->etag[vl] = '\0';
        }
    }
    return len;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    s3_req *r = arg;
    size_t len = size * n;
    long status = 0;
    curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &status);
    if (r->sink && status >= 200 && status < 300) {
        if (r->skip) {
            size_t drop = r->skip < len ? (size_t)r->skip : len;
            r->skip -= drop;
            p += drop;
            len -= drop;
            if (len == 0)
                return size * n;
        }
        int rc = r->sink(r->sink_arg, p, len);
        if (rc != 0) {
            r->sink_rc = rc;
            return 0; /* abort the transfer */
        }
        r->delivered += len;
        return size * n;
    }
    if (r->resp_len + len > r->resp_max) {
        r->resp_cut = true;
        return size * n; /* keep the start: that is where the error code is */
    }
    char *b = realloc(r->resp, r->resp_len + len + 1);
    if (!b)
        return 0;
    r->resp = b;
    memcpy(r->resp + r->resp_len, p, len);
    r->resp_len += len;
    r->resp[r->resp_len] = '\0';
    return size * n;
}

static size_t on_read(char *buf, size_t size, size_t n, void *arg)
{
    s3_req *r = arg;
    size_t want = size * n, left = r->body_len - r->body_off;
    if (want > left)
        want = left;
    memcpy(buf, r->body + r->body_off, want);
    r->body_off += want;
    return want;
}

/* Prepare h for r (one attempt). Returns false when out of memory. */
static bool setup_request(s3_store *st, CURL *h, s3_req *r)
{
    curl_easy_reset(h);
    r->h = h;
    r->status = 0;
    r->etag[0] = '\0';
    r->resp_len = 0;
    r->resp_cut = false;
    r->curl_err[0] = '\0';
    r->body_off = 0;
    r->sink_rc = 0;
    if (!r->resp_max)
        r->resp_max = MAX_ERROR_BODY;
    curl_slist_free_all(r->hdrs);
    r->hdrs = NULL;
    struct curl_slist *l = curl_slist_append(NULL, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (l)
        l = curl_slist_append(l, "Expect:"); /* no 100-continue round trip before each part */
    if (l && st->token_hdr)
        l = curl_slist_append(l, st->token_hdr);
    if (!l)
        return false;
    r->hdrs = l;
    curl_easy_setopt(h, CURLOPT_URL, r->url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, r->hdrs);
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, st->sigv4);
    curl_easy_setopt(h, CURLOPT_USERNAME, st->access_key);
    curl_easy_setopt(h, CURLOPT_PASSWORD, st->secret_key);
    edl_http_prepare(h, &(edl_http_opts){.connect_timeout_ms = (long)st->connect_timeout_ms,
                                         .timeout_ms = (long)st->timeout_ms, .keepalive = true});
    /* A stalled transfer (frozen network) fails long before the whole-request timeout. */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 30L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, r->curl_err);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_PRIVATE, r);
    if (strcmp(r->method, "PUT") == 0) {
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(h, CURLOPT_READDATA, r);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->body_len);
    } else if (strcmp(r->method, "POST") == 0) {
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, r->has_body ? r->body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(r->has_body ? r->body_len : 0));
    } else if (r->head) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
        curl_easy_setopt(h, CURLOPT_FILETIME, 1L);
    } else if (strcmp(r->method, "GET") != 0) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r->method);
    }
    if (r->sink && r->delivered > 0) {
        char range[48];
        snprintf(range, sizeof range, "%llu-", (unsigned long long)r->delivered);
        curl_easy_setopt(h, CURLOPT_RANGE, range);
    }
    return true;
}

static void req_clear(s3_req *r)
{
    curl_slist_free_all(r->hdrs);
    free(r->resp);
    free(r->url);
    memset(r, 0, sizeof *r);
}

static bool retryable(CURLcode cc, long status, const s3_req *r)
{
    if (r->sink_rc)
        return false;
    if (cc != CURLE_OK)
        return cc != CURLE_ABORTED_BY_CALLBACK && cc != CURLE_OUT_OF_MEMORY &&
               cc != CURLE_UNSUPPORTED_PROTOCOL && cc != CURLE_URL_MALFORMAT;
    return status >= 500 || status == 429;
}

/* Turn a finished attempt into 0 or an EDL_E* code with a message naming what and why. */
static int classify(edl_storage *s, CURLcode cc, s3_req *r, const char *what)
{
    if (r->sink_rc)
        return storage_fail(s, r->sink_rc, "%s: the caller's sink stopped the download: %s", what,
                            edl_strerror(r->sink_rc));
    if (cc != CURLE_OK) {
        int code = EDL_EUNAVAIL;
        if (cc == CURLE_OPERATION_TIMEDOUT)
            code = EDL_ETIMEDOUT;
        else if (cc == CURLE_OUT_OF_MEMORY)
            code = EDL_ENOMEM;
        return storage_fail(s, code, "%s: cannot reach the S3 endpoint: %s (check "
                            "AWS_ENDPOINT_URL and that the store is up)", what,
                            r->curl_err[0] ? r->curl_err : curl_easy_strerror(cc));
    }
    long st = r->status;
    if (st >= 200 && st < 300)
        return 0;
    char code[128] = "", msg[256] = "";
    s3_xml_text(r->resp, "Code", code, sizeof code);
    s3_xml_text(r->resp, "Message", msg, sizeof msg);
    const char *sep = code[0] ? ": " : "";
    if (st == 403 || st == 401)
        return storage_fail(s, EDL_EAUTH, "%s: S3 refused the credentials (HTTP %ld %s%s%s); check "
                            "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN and the "
                            "bucket's policy", what, st, code, sep, msg);
    if (st == 404 && strcmp(code, "NoSuchBucket") == 0)
        return storage_fail(s, EDL_ECONFIG, "%s: the bucket does not exist (HTTP 404 %s%s%s)",
                            what, code, sep, msg);
    if (st == 404)
        return storage_fail(s, EDL_ENOTFOUND, "%s: no such object (HTTP 404%s%s)", what,
                            code[0] ? " " : "", code);
    return storage_fail(s, EDL_ESERVER, "%s: S3 answered HTTP %ld%s%s%s%s", what, st,
                        code[0] ? " " : "", code, sep, msg);
}

/* When to try a failed request again (a 503 SlowDown may say, in Retry-After). */
static int64_t backoff_ms(s3_store *st, CURL *h, int attempt)
{
    return edl_http_backoff_ms(attempt, st->retry_base_ms, MAX_BACKOFF_MS, edl_http_retry_after_ms(h));
}

static void backoff_sleep(s3_store *st, int attempt)
{
    int64_t ms = backoff_ms(st, st->easy, attempt);
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Perform r on the store's easy handle, retrying what may be retried. */
static int perform(edl_storage *s, s3_req *r, const char *what)
{
    s3_store *st = s->impl;
    for (int attempt = 0;; attempt++) {
        if (!setup_request(st, st->easy, r))
            return EDL_ENOMEM;
        CURLcode cc = curl_easy_perform(st->easy);
        curl_easy_getinfo(st->easy, CURLINFO_RESPONSE_CODE, &r->status);
        if (attempt < st->max_retries && retryable(cc, r->status, r)) {
            backoff_sleep(st, attempt);
            continue;
        }
        return classify(s, cc, r, what);
    }
}

/* ---- simple operations --------------------------------------------------------------- */

static int s3_get_stream(edl_storage *s, const char *key, edl_storage_write_fn write_fn, void *arg,
                         uint64_t *size_out)
{
    s3_store *st = s->impl;
    s3_req r = {.method = "GET", .sink = write_fn, .sink_arg = arg};
    char what[700];
    snprintf(what, sizeof what, "GET %s/%s", s->uri, key);
    if (!(r.url = object_url(st, key, NULL)))
        return EDL_ENOMEM;
    int rc = perform(s, &r, what);
    *size_out = r.delivered;
    req_clear(&r);
    return rc;
}

static int s3_stat(edl_storage *s, const char *key, edl_storage_stat *stt)
{
    s3_store *st = s->impl;
    s3_req r = {.method = "HEAD", .head = true};
    char what[700];
    snprintf(what, sizeof what, "HEAD %s/%s", s->uri, key);
    if (!(r.url = object_url(st, key, NULL)))
        return EDL_ENOMEM;
    int rc = perform(s, &r, what);
    if (rc == 0) {
        curl_off_t len = -1;
        long ft = -1;
        curl_easy_getinfo(st->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &len);
        curl_easy_getinfo(st->easy, CURLINFO_FILETIME, &ft);
        if (len < 0)
            rc = storage_fail(s, EDL_EPROTO, "%s: the reply has no Content-Length", what);
        stt->size = len > 0 ? (uint64_t)len : 0;
        stt->mtime = ft > 0 ? ft : 0;
    }
    req_clear(&r);
    return rc;
}

static int s3_delete(edl_storage *s, const char *key)
{
    s3_store *st = s->impl;
    s3_req r = {.method = "DELETE"};
    char what[700];
    snprintf(what, sizeof what, "DELETE %s/%s", s->uri, key);
    if (!(r.url = object_url(st, key, NULL)))
        return EDL_ENOMEM;
    int rc = perform(s, &r, what);
    if (rc == EDL_ENOTFOUND)
        rc = 0;
    req_clear(&r);
    return rc;
}

static int put_single(edl_storage *s, const char *key, const char *data, size_t len)
{
    s3_store *st = s->impl;
    s3_req r = {.method = "PUT", .body = data, .body_len = len, .has_body = true};
    char what[700];
    snprintf(what, sizeof what, "PUT %s/%s", s->uri, key);
    if (!(r.url = object_url(st, key, NULL)))
        return EDL_ENOMEM;
    int rc = perform(s, &r, what);
    req_clear(&r);
    return rc;
}

/* ---- list ---------------------------------------------------------------------------- */

static int s3_list(edl_storage *s, const char *prefix, char ***keys, size_t *n, size_t *cap)
{
    s3_store *st = s->impl;
    char *full = NULL, *token = NULL;
    if (asprintf(&full, "%s%s", st->prefix, prefix) < 0)
        return EDL_ENOMEM;
    char *efull = escape(full);
    free(full);
    if (!efull)
        return EDL_ENOMEM;
    int rc = 0;
    for (int page = 0; rc == 0; page++) {
        char *etok = token ? escape(token) : NULL, *query = NULL;
        if ((token && !etok) ||
            asprintf(&query, "%s%s%slist-type=2&prefix=%s", etok ? "continuation-token=" : "",
                     etok ? etok : "", etok ? "&" : "", efull) < 0) {
            free(etok);
            rc = EDL_ENOMEM;
            break;
        }
        free(etok);
        s3_req r = {.method = "GET", .resp_max = MAX_XML_BODY};
        r.url = object_url(st, NULL, query);
        free(query);
        char what[700];
        snprintf(what, sizeof what, "list %s (prefix \"%s\")", s->uri, prefix);
        rc = r.url ? perform(s, &r, what) : EDL_ENOMEM;
        if (rc == 0 && r.resp_cut)
            rc = storage_fail(s, EDL_ETOOBIG, "%s: a reply over %u bytes", what, MAX_XML_BODY);
        char next[1024] = "", why[256];
        bool more = false;
        if (rc == 0 && (rc = s3_list_page_parse(r.resp, st->prefix, keys, n, cap, &more, next,
                                                sizeof next, why, sizeof why)) != 0)
            rc = storage_fail(s, rc, "%s: %s", what, rc == EDL_ENOMEM ? "out of memory" : why);
        req_clear(&r);
        free(token);
        token = NULL;
        if (rc || !more)
            break;
        if (page > 100000) {
            rc = storage_fail(s, EDL_ETOOBIG, "list of %s: more than 100000 pages", s->uri);
            break;
        }
        if (!(token = strdup(next)))
            rc = EDL_ENOMEM;
    }
    free(token);
    free(efull);
    return rc;
}

/* ---- multipart upload ---------------------------------------------------------------- */

typedef struct part_slot {
    CURL *h;
    s3_req r;
    char *own;          /* buffer for a stream's part (NULL for buffer sources) */
    int part_no;        /* 0: idle */
    int attempts;
    int64_t retry_at_ms; /* > 0: waiting to be sent again */
} part_slot;

typedef struct multipart {
    edl_storage *s;
    s3_store *st;
    const char *key;
    char upload_id[1100];
    char *eid;          /* upload id, escaped for a query */
    char **etags;       /* by part number - 1 */
    int n_parts;        /* parts started */
    size_t etag_cap;
    part_slot *slots;
    CURLM *multi;
} multipart;

static int mp_create(multipart *m)
{
    edl_storage *s = m->s;
    s3_req r = {.method = "POST"};
    char what[700];
    snprintf(what, sizeof what, "start multipart upload of %s/%s", s->uri, m->key);
    if (!(r.url = object_url(m->st, m->key, "uploads=")))
        return EDL_ENOMEM;
    int rc = perform(s, &r, what);
    if (rc == 0 && (s3_xml_text(r.resp, "UploadId", m->upload_id, sizeof m->upload_id) != 1 ||
                    !m->upload_id[0] || strlen(m->upload_id) > 1024))
        rc = storage_fail(s, EDL_EPROTO, "%s: the reply has no usable UploadId", what);
    req_clear(&r);
    if (rc == 0 && !(m->eid = escape(m->upload_id)))
        rc = EDL_ENOMEM;
    return rc;
}

static void mp_abort(multipart *m)
{
    edl_storage *s = m->s;
    char *query = NULL, saved[sizeof s->errmsg];
    memcpy(saved, s->errmsg, sizeof saved); /* keep the reason the upload failed */
    if (asprintf(&query, "uploadId=%s", m->eid) >= 0) {
        s3_req r = {.method = "DELETE"};
        r.url = object_url(m->st, m->key, query);
        if (r.url)
            perform(s, &r, "abort multipart upload");
        req_clear(&r);
    }
    free(query);
    memcpy(s->errmsg, saved, sizeof saved);
}

static int mp_complete(multipart *m)
{
    edl_storage *s = m->s;
    size_t cap = 128 + (size_t)m->n_parts * 360, off = 0;
    char *xml = malloc(cap), *query = NULL;
    if (!xml)
        return EDL_ENOMEM;
    off += (size_t)snprintf(xml + off, cap - off, "<CompleteMultipartUpload>");
    for (int i = 0; i < m->n_parts; i++)
        off += (size_t)snprintf(xml + off, cap - off, "<Part><PartNumber>%d</PartNumber>"
                                "<ETag>%s</ETag></Part>", i + 1, m->etags[i]);
    off += (size_t)snprintf(xml + off, cap - off, "</CompleteMultipartUpload>");
    if (asprintf(&query, "uploadId=%s", m->eid) < 0) {
        free(xml);
        return EDL_ENOMEM;
    }
    s3_req r = {.method = "POST", .body = xml, .body_len = off, .has_body = true};
    r.url = object_url(m->st, m->key, query);
    free(query);
    char what[700];
    snprintf(what, sizeof what, "complete multipart upload of %s/%s", s->uri, m->key);
    int rc = r.url ? perform(s, &r, what) : EDL_ENOMEM;
    /* S3 may answer 200 and still fail, with an <Error> in the body. */
    if (rc == 0 && (!r.resp || strstr(r.resp, "<Error>"))) {
        char code[128] = "", msg[256] = "";
        s3_xml_text(r.resp, "Code", code, sizeof code);
        s3_xml_text(r.resp, "Message", msg, sizeof msg);
        rc = storage_fail(s, EDL_ESERVER, "%s: %s %s", what, code[0] ? code : "empty reply", msg);
    }
    req_clear(&r);
    free(xml);
    return rc;
}

static int mp_start_part(multipart *m, part_slot *sl)
{
    char *query = NULL;
    if (asprintf(&query, "partNumber=%d&uploadId=%s", sl->part_no, m->eid) < 0)
        return EDL_ENOMEM;
    free(sl->r.url);
    sl->r.url = object_url(m->st, m->key, query);
    free(query);
    if (!sl->r.url || !setup_request(m->st, sl->h, &sl->r))
        return EDL_ENOMEM;
    sl->retry_at_ms = 0;
    return curl_multi_add_handle(m->multi, sl->h) == CURLM_OK ? 0 : EDL_ENOMEM;
}

/* Give the next part to an idle slot: 1 when started, 0 at the end of the source. */
static int mp_next_part(multipart *m, part_slot *sl, storage_source *src, const char *first,
                        size_t first_len, size_t *consumed)
{
    const char *data;
    size_t len;
    if (!src->read) {
        if (*consumed >= src->len)
            return 0;
        data = src->buf + *consumed;
        len = src->len - *consumed < m->st->part_size ? src->len - *consumed : m->st->part_size;
        storage_source_observe(src, data, len);
    } else if (first) {
        memcpy(sl->own, first, first_len); /* the part read to decide single vs multipart */
        data = sl->own;
        len = first_len;
    } else {
        ssize_t n = storage_source_fill(m->s, src, sl->own, m->st->part_size);
        if (n < 0)
            return (int)n;
        if (n == 0)
            return 0;
        data = sl->own;
        len = (size_t)n;
    }
    *consumed += len;
    if (m->n_parts >= MAX_PARTS)
        return storage_fail(m->s, EDL_ETOOBIG, "%s/%s: more than %d parts of %zu bytes; raise "
                            "part_size", m->s->uri, m->key, MAX_PARTS, m->st->part_size);
    if ((size_t)m->n_parts >= m->etag_cap) {
        size_t ncap = m->etag_cap ? m->etag_cap * 2 : 64;
        char **e = realloc(m->etags, ncap * sizeof *e);
        if (!e)
            return EDL_ENOMEM;
        memset(e + m->etag_cap, 0, (ncap - m->etag_cap) * sizeof *e);
        m->etags = e;
        m->etag_cap = ncap;
    }
    sl->part_no = ++m->n_parts;
    sl->attempts = 0;
    sl->r.method = "PUT";
    sl->r.body = data;
    sl->r.body_len = len;
    sl->r.has_body = true;
    int rc = mp_start_part(m, sl);
    return rc ? rc : 1;
}

/* A part's transfer ended: record its ETag, schedule a retry, or fail. */
static int mp_part_done(multipart *m, part_slot *sl, CURLcode cc)
{
    curl_multi_remove_handle(m->multi, sl->h);
    curl_easy_getinfo(sl->h, CURLINFO_RESPONSE_CODE, &sl->r.status);
    if (cc == CURLE_OK && sl->r.status >= 200 && sl->r.status < 300) {
        if (!sl->r.etag[0])
            return storage_fail(m->s, EDL_EPROTO, "upload of part %d of %s/%s: no ETag in the "
                                "reply", sl->part_no, m->s->uri, m->key);
        if (!(m->etags[sl->part_no - 1] = strdup(sl->r.etag)))
            return EDL_ENOMEM;
        sl->part_no = 0;
        return 0;
    }
    if (sl->attempts < m->st->max_retries && retryable(cc, sl->r.status, &sl->r)) {
        sl->retry_at_ms = edl_monotonic_ms() + backoff_ms(m->st, sl->h, sl->attempts++);
        return 0;
    }
    char what[700];
    snprintf(what, sizeof what, "upload of part %d of %s/%s", sl->part_no, m->s->uri, m->key);
    return classify(m->s, cc, &sl->r, what);
}

static int mp_run(multipart *m, storage_source *src, const char *first, size_t first_len)
{
    size_t consumed = 0;
    bool src_done = false;
    int rc = 0;
    while (rc == 0) {
        int busy = 0;
        int64_t now = edl_monotonic_ms();
        for (int i = 0; i < m->st->parallel && rc == 0; i++) {
            part_slot *sl = &m->slots[i];
            if (sl->part_no && sl->retry_at_ms && sl->retry_at_ms <= now)
                rc = mp_start_part(m, sl);
            if (!sl->part_no && !src_done) {
                int r = mp_next_part(m, sl, src, first, first_len, &consumed);
                first = NULL;
                if (r < 0)
                    rc = r;
                src_done = r == 0;
            }
            busy += sl->part_no != 0;
        }
        if (rc || busy == 0)
            break;
        int running = 0;
        if (curl_multi_perform(m->multi, &running) != CURLM_OK)
            rc = storage_fail(m->s, EDL_ENOMEM, "libcurl multi handle failed");
        CURLMsg *msg;
        int left;
        while (rc == 0 && (msg = curl_multi_info_read(m->multi, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            for (int i = 0; i < m->st->parallel; i++)
                if (m->slots[i].h == msg->easy_handle) {
                    rc = mp_part_done(m, &m->slots[i], msg->data.result);
                    break;
                }
        }
        if (rc == 0)
            curl_multi_poll(m->multi, NULL, 0, 50, NULL);
    }
    return rc;
}

static void mp_free(multipart *m)
{
    for (int i = 0; m->slots && i < m->st->parallel; i++) {
        part_slot *sl = &m->slots[i];
        if (sl->h) {
            curl_multi_remove_handle(m->multi, sl->h);
            curl_easy_cleanup(sl->h);
        }
        free(sl->own);
        req_clear(&sl->r);
    }
    free(m->slots);
    for (int i = 0; i < m->n_parts; i++)
        free(m->etags[i]);
    free(m->etags);
    free(m->eid);
    if (m->multi)
        curl_multi_cleanup(m->multi);
}

static int put_multipart(edl_storage *s, const char *key, storage_source *src, const char *first,
                         size_t first_len)
{
    s3_store *st = s->impl;
    multipart m = {.s = s, .st = st, .key = key};
    int rc = 0;
    m.slots = calloc((size_t)st->parallel, sizeof *m.slots);
    m.multi = curl_multi_init();
    if (!m.slots || !m.multi)
        rc = EDL_ENOMEM;
    for (int i = 0; rc == 0 && i < st->parallel; i++) {
        if (!(m.slots[i].h = curl_easy_init()) ||
            (src->read && !(m.slots[i].own = malloc(st->part_size))))
            rc = EDL_ENOMEM;
    }
    if (rc == 0)
        rc = mp_create(&m);
    if (rc == 0) {
        rc = mp_run(&m, src, first, first_len);
        if (rc == 0)
            rc = mp_complete(&m);
        if (rc != 0)
            mp_abort(&m); /* no orphaned parts that the bucket would bill for */
    }
    mp_free(&m);
    return rc;
}

static int s3_put(edl_storage *s, const char *key, storage_source *src)
{
    s3_store *st = s->impl;
    if (!src->read && src->len <= st->threshold) {
        storage_source_observe(src, src->buf, src->len);
        return put_single(s, key, src->buf, src->len);
    }
    if (!src->read)
        return put_multipart(s, key, src, NULL, 0);
    /* A stream: read one part's worth to learn whether it fits a single PUT. */
    char *first = malloc(st->part_size);
    if (!first)
        return EDL_ENOMEM;
    ssize_t n = storage_source_fill(s, src, first, st->part_size);
    int rc;
    if (n < 0)
        rc = (int)n;
    else if ((size_t)n < st->part_size)
        rc = put_single(s, key, first, (size_t)n);
    else
        rc = put_multipart(s, key, src, first, (size_t)n);
    free(first);
    return rc;
}

const storage_backend storage_s3_backend = {
    .scheme = "s3",
    .open = s3_open,
    .close = s3_close,
    .put = s3_put,
    .get_stream = s3_get_stream,
    .stat_key = s3_stat,
    .list = s3_list,
    .del = s3_delete,
};

/* storage.c: the URI-based storage API of edl/storage.h: argument and key checks, dispatch to
 * the file:// and s3:// back ends, and the pieces they share (errors, byte sources, lists). */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_KEY_LEN 512

void edl_storage_config_init(edl_storage_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->timeout_ms = 300000;
    cfg->connect_timeout_ms = 3000;
    cfg->max_retries = 4;
    cfg->retry_base_ms = 200;
    cfg->part_size = 16u << 20;
    cfg->parallel_parts = 4;
}

int storage_fail(edl_storage *s, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->errmsg, sizeof s->errmsg, fmt, ap);
    va_end(ap);
    return code;
}

unsigned storage_rand(edl_storage *s)
{
    return (unsigned)rand_r(&s->rand_state);
}

int storage_list_add(char ***keys, size_t *n, size_t *cap, const char *key, size_t len)
{
    if (*n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 64;
        char **k = realloc(*keys, ncap * sizeof *k);
        if (!k)
            return EDL_ENOMEM;
        *keys = k;
        *cap = ncap;
    }
    if (!((*keys)[*n] = strndup(key, len)))
        return EDL_ENOMEM;
    (*n)++;
    return 0;
}

void storage_source_observe(const storage_source *src, const void *p, size_t len)
{
    if (src->observe && len)
        src->observe(src->observe_arg, p, len);
}

ssize_t storage_source_fill(edl_storage *s, storage_source *src, char *dst, size_t cap)
{
    size_t got = 0;
    while (got < cap) {
        ssize_t n = src->read(src->arg, dst + got, cap - got);
        if (n < 0)
            return storage_fail(s, (int)n, "the caller's data source failed: %s",
                                edl_strerror((int)n));
        if (n == 0)
            break;
        if ((size_t)n > cap - got)
            return storage_fail(s, EDL_EINVAL, "the data source returned more bytes than asked");
        got += (size_t)n;
    }
    return (ssize_t)got;
}

bool edl_storage_key_valid(const char *key)
{
    if (!key || !key[0] || key[0] == '/' || strlen(key) > MAX_KEY_LEN)
        return false;
    const char *seg = key;
    for (const char *p = key;; p++) {
        if (*p == '/' || *p == '\0') {
            size_t n = (size_t)(p - seg);
            if (n == 0 || (n == 1 && seg[0] == '.') || (n == 2 && seg[0] == '.' && seg[1] == '.'))
                return false;
            if (*p == '\0')
                return true;
            seg = p + 1;
        } else if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                     (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-')) {
            return false;
        }
    }
}

/* A list prefix is empty, a key, or a key followed by "/". */
static bool prefix_valid(const char *prefix)
{
    size_t n = strlen(prefix);
    if (n == 0)
        return true;
    if (n > MAX_KEY_LEN)
        return false;
    if (prefix[n - 1] != '/')
        return edl_storage_key_valid(prefix);
    char tmp[MAX_KEY_LEN + 1];
    memcpy(tmp, prefix, n - 1);
    tmp[n - 1] = '\0';
    return edl_storage_key_valid(tmp);
}

static int check_key(edl_storage *s, const char *key)
{
    if (!edl_storage_key_valid(key))
        return storage_fail(s, EDL_EINVAL, "invalid key \"%.80s\" for %s: use letters, digits and "
                            "\"._-\" in segments joined by \"/\" (no \"..\", at most %d bytes)",
                            key ? key : "(null)", s->uri, MAX_KEY_LEN);
    return 0;
}

int edl_storage_open(const edl_storage_config *cfg, edl_storage **out, char *errbuf, size_t errlen)
{
    static const storage_backend *const backends[] = {&storage_file_backend, &storage_s3_backend};
    if (errbuf && errlen)
        errbuf[0] = '\0';
    if (!cfg || !cfg->uri || !out) {
        if (errbuf)
            snprintf(errbuf, errlen, "edl_storage_open: no URI given");
        return EDL_EINVAL;
    }
    *out = NULL;
    const storage_backend *be = NULL;
    const char *rest = NULL;
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++) {
        size_t n = strlen(backends[i]->scheme);
        if (strncmp(cfg->uri, backends[i]->scheme, n) == 0 && strncmp(cfg->uri + n, "://", 3) == 0) {
            be = backends[i];
            rest = cfg->uri + n + 3;
        }
    }
    if (!be) {
        if (errbuf)
            snprintf(errbuf, errlen, "storage URI \"%.200s\" is neither file:///path nor "
                     "s3://bucket/prefix", cfg->uri);
        return EDL_EINVAL;
    }
    edl_storage *s = calloc(1, sizeof *s);
    if (!s || !(s->uri = strdup(cfg->uri))) {
        free(s);
        return EDL_ENOMEM;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s->rand_state = (unsigned)ts.tv_nsec ^ (unsigned)getpid() ^ (unsigned)(uintptr_t)s;
    s->be = be;
    int rc = be->open(s, cfg, rest);
    if (rc != 0) {
        if (errbuf)
            snprintf(errbuf, errlen, "%s", s->errmsg);
        be->close(s); /* what the back end set up before it failed */
        free(s->uri);
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void edl_storage_close(edl_storage *s)
{
    if (!s)
        return;
    s->be->close(s);
    free(s->uri);
    free(s);
}

const char *edl_storage_errmsg(const edl_storage *s)
{
    return s ? s->errmsg : "no storage handle";
}

const char *edl_storage_uri(const edl_storage *s)
{
    return s ? s->uri : "";
}

int edl_storage_put(edl_storage *s, const char *key, const void *data, size_t len)
{
    return edl_storage_put_observed(s, key, data, len, NULL, NULL);
}

int edl_storage_put_observed(edl_storage *s, const char *key, const void *data, size_t len,
                             edl_storage_observe_fn observe, void *arg)
{
    if (!s || (!data && len))
        return EDL_EINVAL;
    int rc = check_key(s, key);
    storage_source src = {.buf = data ? data : "", .len = len, .observe = observe,
                          .observe_arg = arg};
    return rc ? rc : s->be->put(s, key, &src);
}

int edl_storage_put_stream(edl_storage *s, const char *key, edl_storage_read_fn read, void *arg)
{
    if (!s || !read)
        return EDL_EINVAL;
    int rc = check_key(s, key);
    storage_source src = {.read = read, .arg = arg};
    return rc ? rc : s->be->put(s, key, &src);
}

int edl_storage_get_stream(edl_storage *s, const char *key, edl_storage_write_fn write, void *arg,
                           uint64_t *size_out)
{
    if (!s || !write)
        return EDL_EINVAL;
    uint64_t dummy;
    int rc = check_key(s, key);
    return rc ? rc : s->be->get_stream(s, key, write, arg, size_out ? size_out : &dummy);
}

/* edl_storage_get_into for a back end without its own: each piece copied out of the stream. */
typedef struct into_sink {
    char *dst;
    size_t cap, len;
    edl_storage_observe_fn observe;
    void *arg;
} into_sink;

static int into_write(void *arg, const void *buf, size_t len)
{
    into_sink *t = arg;
    if (len == 0)
        return 0;
    if (len > t->cap - t->len)
        return EDL_ETOOBIG;
    memcpy(t->dst + t->len, buf, len);
    if (t->observe)
        t->observe(t->arg, t->dst + t->len, len);
    t->len += len;
    return 0;
}

int edl_storage_get_into(edl_storage *s, const char *key, void *dst, size_t cap,
                         edl_storage_observe_fn observe, void *arg, uint64_t *size_out)
{
    uint64_t dummy;
    size_out = size_out ? size_out : &dummy;
    *size_out = 0;
    if (!s || (!dst && cap))
        return EDL_EINVAL;
    int rc = check_key(s, key);
    if (rc != 0 || s->be->get_into)
        return rc ? rc : s->be->get_into(s, key, dst, cap, observe, arg, size_out);
    into_sink t = {.dst = dst, .cap = cap, .observe = observe, .arg = arg};
    rc = s->be->get_stream(s, key, into_write, &t, &dummy);
    if (rc == EDL_ETOOBIG)
        storage_fail(s, rc, "%s/%s is larger than the %zu bytes of the buffer given", s->uri,
                     key, cap);
    *size_out = t.len;
    return rc;
}

/* A sink into a byte buffer whose max is the caller's max_bytes (0: an empty object only). */
static int bytebuf_write(void *arg, const void *buf, size_t len)
{
    edl_bytebuf *b = arg;
    return b->max == 0 && len ? EDL_ETOOBIG : edl_bytebuf_append(b, buf, len);
}

int edl_storage_get(edl_storage *s, const char *key, size_t max_bytes, void **data, size_t *len)
{
    if (!s || !data || !len)
        return EDL_EINVAL;
    *data = NULL;
    *len = 0;
    edl_bytebuf m = {.max = max_bytes};
    int rc = edl_storage_get_stream(s, key, bytebuf_write, &m, NULL);
    if (rc == EDL_ETOOBIG)
        storage_fail(s, rc, "%s/%s is larger than the %zu bytes allowed", s->uri, key, max_bytes);
    if (rc == 0 && !m.data)
        rc = edl_bytebuf_append(&m, "", 0); /* an empty object is still a buffer */
    if (rc != 0) {
        edl_bytebuf_clear(&m);
        return rc;
    }
    *data = m.data;
    *len = m.len;
    return 0;
}

int edl_storage_stat_key(edl_storage *s, const char *key, edl_storage_stat *st)
{
    if (!s || !st)
        return EDL_EINVAL;
    int rc = check_key(s, key);
    memset(st, 0, sizeof *st);
    return rc ? rc : s->be->stat_key(s, key, st);
}

static int cmp_keys(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int edl_storage_list(edl_storage *s, const char *prefix, char ***keys, size_t *n)
{
    if (!s || !keys || !n)
        return EDL_EINVAL;
    *keys = NULL;
    *n = 0;
    if (!prefix)
        prefix = "";
    if (!prefix_valid(prefix))
        return storage_fail(s, EDL_EINVAL, "invalid list prefix \"%.80s\" for %s", prefix, s->uri);
    size_t cap = 0;
    int rc = s->be->list(s, prefix, keys, n, &cap);
    if (rc != 0) {
        edl_storage_list_free(*keys, *n);
        *keys = NULL;
        *n = 0;
        return rc;
    }
    if (*n)
        qsort(*keys, *n, sizeof **keys, cmp_keys);
    return 0;
}

void edl_storage_list_free(char **keys, size_t n)
{
    for (size_t i = 0; keys && i < n; i++)
        free(keys[i]);
    free(keys);
}

int edl_storage_delete(edl_storage *s, const char *key)
{
    if (!s)
        return EDL_EINVAL;
    int rc = check_key(s, key);
    return rc ? rc : s->be->del(s, key);
}

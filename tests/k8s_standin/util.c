/* util.c: small helpers of k8s-standin: JSON paths (the simple JSONPath subset that printer
 * columns and scale paths use), times as Kubernetes writes them, uids, random name
 * suffixes, base64 and JSON equality. */
#define _GNU_SOURCE /* strptime */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "standin.h"

/* One step of a path: a key (".a", "['a']", "[\"a\"]") or an index ("[0]"). Returns the rest
 * of the path, NULL on syntax error. */
static const char *path_step(const char *p, char *key, size_t keylen, int *index)
{
    *index = -1;
    key[0] = '\0';
    if (*p == '.')
        p++;
    if (*p == '[') {
        p++;
        if (*p == '\'' || *p == '"') {
            char q = *p++;
            const char *end = strchr(p, q);
            if (!end || end[1] != ']' || (size_t)(end - p) >= keylen)
                return NULL;
            memcpy(key, p, (size_t)(end - p));
            key[end - p] = '\0';
            return end + 2;
        }
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || *end != ']')
            return NULL;
        *index = (int)v;
        return end + 1;
    }
    size_t n = strcspn(p, ".[");
    if (n == 0 || n >= keylen)
        return NULL;
    memcpy(key, p, n);
    key[n] = '\0';
    return p + n;
}

cJSON *si_get(const cJSON *obj, const char *path)
{
    const cJSON *cur = obj;
    const char *p = path;
    char key[256];
    int index;
    while (cur && *p) {
        p = path_step(p, key, sizeof key, &index);
        if (!p)
            return NULL;
        if (index >= 0)
            cur = cJSON_IsArray(cur) ? cJSON_GetArrayItem(cur, index) : NULL;
        else
            cur = cJSON_IsObject(cur) ? cJSON_GetObjectItemCaseSensitive(cur, key) : NULL;
    }
    return (cJSON *)cur;
}

const char *si_str(const cJSON *obj, const char *path)
{
    const cJSON *v = si_get(obj, path);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

cJSON *si_obj_child(cJSON *obj, const char *key)
{
    cJSON *c = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (cJSON_IsObject(c))
        return c;
    c = cJSON_CreateObject();
    if (cJSON_GetObjectItemCaseSensitive(obj, key))
        cJSON_ReplaceItemInObjectCaseSensitive(obj, key, c);
    else
        cJSON_AddItemToObject(obj, key, c);
    return c;
}

static void set_item(cJSON *obj, const char *key, cJSON *value)
{
    if (cJSON_GetObjectItemCaseSensitive(obj, key))
        cJSON_ReplaceItemInObjectCaseSensitive(obj, key, value);
    else
        cJSON_AddItemToObject(obj, key, value);
}

int si_set(cJSON *obj, const char *path, cJSON *value)
{
    char key[256];
    int index;
    const char *p = path;
    cJSON *cur = obj;
    for (;;) {
        p = path_step(p, key, sizeof key, &index);
        if (!p || index >= 0 || !cJSON_IsObject(cur)) {
            cJSON_Delete(value);
            return -1;
        }
        if (*p == '\0') {
            set_item(cur, key, value);
            return 0;
        }
        cur = si_obj_child(cur, key);
    }
}

void si_set_str(cJSON *obj, const char *key, const char *value)
{
    set_item(obj, key, cJSON_CreateString(value));
}

void si_set_num(cJSON *obj, const char *key, double value)
{
    set_item(obj, key, cJSON_CreateNumber(value));
}

char *si_rfc3339(time_t t, char buf[32])
{
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

time_t si_parse_time(const char *s)
{
    struct tm tm = {0};
    if (!s)
        return -1;
    const char *end = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!end)
        return -1;
    return timegm(&tm);
}

/* The same words as k8s.io/apimachinery/pkg/util/duration.HumanDuration. */
void si_age(time_t since, char *buf, size_t len)
{
    long d = (long)(time(NULL) - since);
    if (d < -1) {
        snprintf(buf, len, "<invalid>");
        return;
    }
    if (d < 0)
        d = 0;
    long m = d / 60, h = d / 3600, days = h / 24;
    if (d < 120)
        snprintf(buf, len, "%lds", d);
    else if (m < 10)
        snprintf(buf, len, d % 60 ? "%ldm%lds" : "%ldm", m, d % 60);
    else if (m < 180)
        snprintf(buf, len, "%ldm", m);
    else if (h < 8)
        snprintf(buf, len, m % 60 ? "%ldh%ldm" : "%ldh", h, m % 60);
    else if (h < 48)
        snprintf(buf, len, "%ldh", h);
    else if (h < 24 * 8)
        snprintf(buf, len, h % 24 ? "%ldd%ldh" : "%ldd", days, h % 24);
    else if (days < 365 * 2)
        snprintf(buf, len, "%ldd", days);
    else if (days < 365 * 8)
        snprintf(buf, len, days % 365 ? "%ldy%ldd" : "%ldy", days / 365, days % 365);
    else
        snprintf(buf, len, "%ldy", days / 365);
}

void si_new_uid(char out[37])
{
    unsigned char b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        for (size_t i = 0; i < sizeof b; i++)
            b[i] = (unsigned char)rand();
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

/* Five characters as k8s.io/apimachinery/pkg/util/rand.String picks them (no vowels, no
 * 0, 1 or 3), for generateName and kube-api-access-<suffix>. */
void si_random_suffix(char out[6])
{
    static const char alphabet[] = "bcdfghjklmnpqrstvwxz2456789";
    unsigned char b[5];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        for (size_t i = 0; i < sizeof b; i++)
            b[i] = (unsigned char)rand();
    for (int i = 0; i < 5; i++)
        out[i] = alphabet[b[i] % (sizeof alphabet - 1)];
    out[5] = '\0';
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *si_base64_encode(const unsigned char *in, size_t len)
{
    char *out = malloc(4 * ((len + 2) / 3) + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < len; i += 3) {
        unsigned v = (unsigned)in[i] << 16;
        if (i + 1 < len)
            v |= (unsigned)in[i + 1] << 8;
        if (i + 2 < len)
            v |= in[i + 2];
        *o++ = B64[(v >> 18) & 63];
        *o++ = B64[(v >> 12) & 63];
        *o++ = i + 1 < len ? B64[(v >> 6) & 63] : '=';
        *o++ = i + 2 < len ? B64[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

unsigned char *si_base64_decode(const char *in, size_t *outlen)
{
    size_t len = strlen(in);
    unsigned char *out = malloc(len / 4 * 3 + 3);
    if (!out || len % 4)
        goto bad;
    size_t n = 0;
    for (size_t i = 0; i < len; i += 4) {
        unsigned v = 0;
        int pad = 0;
        for (int j = 0; j < 4; j++) {
            const char *c = in[i + j] ? strchr(B64, in[i + j]) : NULL;
            if (in[i + j] == '=' && i + 4 == len && j >= 2) {
                pad++;
                v <<= 6;
                continue;
            }
            if (!c || pad)
                goto bad;
            v = (v << 6) | (unsigned)(c - B64);
        }
        out[n++] = (unsigned char)(v >> 16);
        if (pad < 2)
            out[n++] = (unsigned char)(v >> 8);
        if (pad < 1)
            out[n++] = (unsigned char)v;
    }
    out[n] = '\0';
    *outlen = n;
    return out;
bad:
    free(out);
    return NULL;
}

bool si_json_equal(const cJSON *a, const cJSON *b)
{
    if (!a || !b)
        return a == b;
    return cJSON_Compare(a, b, true);
}

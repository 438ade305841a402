/* codec.c: reading and writing the etcd gateway's JSON: base64 bytes, 64-bit integers
 * carried as strings, and key-value records. Everything from the network is checked: a wrong
 * type, a bad number or invalid base64 is EDL_EPROTO, never a crash or a silent zero. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "internal.h"

int b64_encode(const char *in, size_t n, char **out)
{
    if (n > (size_t)INT_MAX / 4 * 3 - 3)
        return EDL_ETOOBIG;
    size_t olen = 4 * ((n + 2) / 3);
    char *s = malloc(olen + 1);
    if (!s)
        return EDL_ENOMEM;
    EVP_EncodeBlock((unsigned char *)s, (const unsigned char *)in, (int)n);
    s[olen] = '\0';
    *out = s;
    return 0;
}

static bool b64_char(unsigned char ch)
{
    return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
           ch == '+' || ch == '/';
}

/* Strict standard base64 with padding, as the gateway writes it. OpenSSL's decoder skips
 * white space and reports padded lengths, so the shape is checked here first. */
int b64_decode(const char *in, size_t n, char **out, size_t *outlen)
{
    if (n % 4 != 0 || n > (size_t)INT_MAX)
        return EDL_EPROTO;
    size_t pad = 0;
    if (n >= 1 && in[n - 1] == '=')
        pad++;
    if (n >= 2 && in[n - 2] == '=')
        pad++;
    for (size_t i = 0; i < n - pad; i++)
        if (!b64_char((unsigned char)in[i]))
            return EDL_EPROTO;
    char *s = malloc(n / 4 * 3 + 1);
    if (!s)
        return EDL_ENOMEM;
    int got = n ? EVP_DecodeBlock((unsigned char *)s, (const unsigned char *)in, (int)n) : 0;
    if (got < 0 || (size_t)got < pad) {
        free(s);
        return EDL_EPROTO;
    }
    *outlen = (size_t)got - pad;
    s[*outlen] = '\0';
    *out = s;
    return 0;
}

int json_i64(const cJSON *obj, const char *name, int64_t *out)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, name);
    *out = 0;
    if (!f || cJSON_IsNull(f))
        return 0;
    if (cJSON_IsString(f)) {
        const char *s = f->valuestring;
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (errno || end == s || *end != '\0')
            return EDL_EPROTO;
        *out = v;
        return 0;
    }
    if (cJSON_IsNumber(f)) {
        double d = f->valuedouble;
        if (!isfinite(d) || d != floor(d) || fabs(d) > 9007199254740992.0)
            return EDL_EPROTO;
        *out = (int64_t)d;
        return 0;
    }
    return EDL_EPROTO;
}

int json_bool(const cJSON *obj, const char *name, bool *out)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, name);
    *out = false;
    if (!f || cJSON_IsNull(f))
        return 0;
    if (!cJSON_IsBool(f))
        return EDL_EPROTO;
    *out = cJSON_IsTrue(f);
    return 0;
}

int json_b64(const cJSON *obj, const char *name, char **out, size_t *len)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!f || cJSON_IsNull(f))
        return b64_decode("", 0, out, len);
    if (!cJSON_IsString(f))
        return EDL_EPROTO;
    return b64_decode(f->valuestring, strlen(f->valuestring), out, len);
}

cJSON *json_add_b64(cJSON *obj, const char *name, edl_buf b)
{
    char *s;
    if (b64_encode(b.data ? b.data : "", b.len, &s) != 0)
        return NULL;
    cJSON *r = cJSON_AddStringToObject(obj, name, s);
    free(s);
    return r;
}

cJSON *json_add_i64(cJSON *obj, const char *name, int64_t v)
{
    char s[24];
    snprintf(s, sizeof s, "%lld", (long long)v);
    return cJSON_AddStringToObject(obj, name, s);
}

void kv_clear(edl_kv *kv)
{
    free(kv->key);
    free(kv->value);
    memset(kv, 0, sizeof *kv);
}

void edl_kv_free(edl_kv *kv)
{
    if (!kv)
        return;
    kv_clear(kv);
    free(kv);
}

int kv_parse(const cJSON *j, edl_kv *kv)
{
    memset(kv, 0, sizeof *kv);
    if (!cJSON_IsObject(j))
        return EDL_EPROTO;
    int rc = json_b64(j, "key", &kv->key, &kv->key_len);
    if (!rc)
        rc = json_b64(j, "value", &kv->value, &kv->value_len);
    if (!rc)
        rc = json_i64(j, "create_revision", &kv->create_revision);
    if (!rc)
        rc = json_i64(j, "mod_revision", &kv->mod_revision);
    if (!rc)
        rc = json_i64(j, "version", &kv->version);
    if (!rc)
        rc = json_i64(j, "lease", &kv->lease);
    if (rc)
        kv_clear(kv);
    return rc;
}

void kv_array_free(edl_kv *kvs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kv_clear(&kvs[i]);
    free(kvs);
}

int kv_array_parse(const cJSON *arr, edl_kv **kvs, size_t *n)
{
    *kvs = NULL;
    *n = 0;
    if (!arr || cJSON_IsNull(arr))
        return 0;
    if (!cJSON_IsArray(arr))
        return EDL_EPROTO;
    int count = cJSON_GetArraySize(arr);
    if (count == 0)
        return 0;
    edl_kv *v = calloc((size_t)count, sizeof *v);
    if (!v)
        return EDL_ENOMEM;
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        int rc = kv_parse(it, &v[i]);
        if (rc) {
            kv_array_free(v, i);
            return rc;
        }
        i++;
    }
    *kvs = v;
    *n = i;
    return 0;
}

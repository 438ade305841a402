/* object.c: small helpers over Kubernetes objects as cJSON trees: fields at dotted paths, and
 * the RFC 3339 times (Time and MicroTime) of the API. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

/* The node at a dotted path, descending through objects only. */
static const cJSON *at_path(const cJSON *obj, const char *path)
{
    const cJSON *cur = obj;
    while (cur && path && *path) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        const cJSON *next = NULL, *it;
        if (!cJSON_IsObject(cur))
            return NULL;
        cJSON_ArrayForEach(it, cur) {
            if (it->string && strlen(it->string) == n && memcmp(it->string, path, n) == 0) {
                next = it;
                break;
            }
        }
        cur = next;
        path = dot ? dot + 1 : NULL;
    }
    return cur;
}

const char *edl_k8s_str(const cJSON *obj, const char *path)
{
    const cJSON *j = at_path(obj, path);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

int64_t edl_k8s_int(const cJSON *obj, const char *path, int64_t dflt)
{
    const cJSON *j = at_path(obj, path);
    if (!cJSON_IsNumber(j))
        return dflt;
    double v = j->valuedouble;
    /* exact integers only: 2^53 is where doubles stop holding every integer */
    if (v != v || v < -9007199254740992.0 || v > 9007199254740992.0 || v != (double)(int64_t)v)
        return dflt;
    return (int64_t)v;
}

const char *edl_k8s_time(int64_t wall_ms, bool micro, char *buf, size_t len)
{
    time_t s = (time_t)(wall_ms >= 0 ? wall_ms / 1000 : (wall_ms - 999) / 1000);
    int64_t frac = wall_ms - (int64_t)s * 1000;
    struct tm tm;
    if (!buf || len == 0)
        return buf;
    if (!gmtime_r(&s, &tm)) {
        buf[0] = '\0';
        return buf;
    }
    size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
    if (n == 0) {
        buf[0] = '\0';
        return buf;
    }
    if (micro)
        snprintf(buf + n, len - n, ".%06lldZ", (long long)frac * 1000);
    else
        snprintf(buf + n, len - n, "Z");
    return buf;
}

/* n decimal digits at *p into *out. */
static bool digits(const char **p, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        char ch = (*p)[i];
        if (ch < '0' || ch > '9')
            return false;
        v = v * 10 + (ch - '0');
    }
    *p += n;
    *out = v;
    return true;
}

static bool expect(const char **p, const char *set)
{
    if (**p && strchr(set, **p)) {
        (*p)++;
        return true;
    }
    return false;
}

int edl_k8s_time_parse(const char *s, int64_t *wall_ms)
{
    struct tm tm = {0};
    int y, mo, d, h, mi, sec, ms = 0;
    const char *p = s;
    if (!s || !digits(&p, 4, &y) || !expect(&p, "-") || !digits(&p, 2, &mo) ||
        !expect(&p, "-") || !digits(&p, 2, &d) || !expect(&p, "Tt") || !digits(&p, 2, &h) ||
        !expect(&p, ":") || !digits(&p, 2, &mi) || !expect(&p, ":") || !digits(&p, 2, &sec))
        return EDL_EINVAL;
    if (*p == '.') {
        int scale = 100, nd = 0;
        for (p++; *p >= '0' && *p <= '9'; p++, nd++) {
            ms += (*p - '0') * scale;
            scale /= 10;
        }
        if (nd == 0 || nd > 9)
            return EDL_EINVAL;
    }
    int offset_min = 0;
    if (expect(&p, "Zz")) {
    } else if (*p == '+' || *p == '-') {
        int sign = *p++ == '-' ? -1 : 1, oh, om;
        if (!digits(&p, 2, &oh) || !expect(&p, ":") || !digits(&p, 2, &om) || oh > 23 || om > 59)
            return EDL_EINVAL;
        offset_min = sign * (oh * 60 + om);
    } else {
        return EDL_EINVAL;
    }
    if (*p || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
        return EDL_EINVAL;
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = sec;
    time_t t = timegm(&tm);
    *wall_ms = ((int64_t)t - (int64_t)offset_min * 60) * 1000 + ms;
    return 0;
}

static int copy_path(const cJSON *src, cJSON *dst, const char *path);

/* An array on the way: the rest of the path is kept of each of its elements, in order, into
 * dst's array `part` (one object per element), so that "status.containerStatuses.name" keeps
 * every container status's name and nothing else of it. */
static int copy_each(const cJSON *arr, cJSON *dst, const char *part, const char *rest)
{
    cJSON *have = cJSON_GetObjectItemCaseSensitive(dst, part);
    bool made = !have, kept = false;
    if (made && !(have = cJSON_CreateArray()))
        return EDL_ENOMEM;
    if (!cJSON_IsArray(have))
        return 0;
    cJSON *slot = have->child;
    const cJSON *e;
    int rc = 0;
    cJSON_ArrayForEach(e, arr) {
        if (!slot && (slot = cJSON_CreateObject()) != NULL)
            cJSON_AddItemToArray(have, slot);
        if (!slot) {
            rc = EDL_ENOMEM;
            break;
        }
        if (cJSON_IsObject(e) && cJSON_IsObject(slot) && (rc = copy_path(e, slot, rest)) != 0)
            break;
        kept = kept || slot->child != NULL;
        slot = slot->next;
    }
    if (made && (rc || !kept))
        cJSON_Delete(have);
    else if (made)
        cJSON_AddItemToObject(dst, part, have);
    return rc;
}

/* Copy the field at a dotted path from src into dst, creating the objects on the way when it
 * exists (and, through an array, keeping the rest of the path of each element: copy_each). */
static int copy_path(const cJSON *src, cJSON *dst, const char *path)
{
    char part[128];
    const char *dot = strchr(path, '.');
    size_t n = dot ? (size_t)(dot - path) : strlen(path);
    if (n == 0 || n >= sizeof part)
        return 0;
    memcpy(part, path, n);
    part[n] = '\0';
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(src, part);
    if (!v)
        return 0;
    cJSON *have = cJSON_GetObjectItemCaseSensitive(dst, part);
    if (!dot) {
        if (have)
            return 0;
        cJSON *copy = cJSON_Duplicate(v, true);
        return copy && cJSON_AddItemToObject(dst, part, copy) ? 0 : EDL_ENOMEM;
    }
    if (cJSON_IsArray(v))
        return copy_each(v, dst, part, dot + 1);
    if (!cJSON_IsObject(v))
        return 0;
    bool made = !have; /* kept only when something under it is */
    if (made && !(have = cJSON_CreateObject()))
        return EDL_ENOMEM;
    int rc = cJSON_IsObject(have) ? copy_path(v, have, dot + 1) : 0;
    if (made && (rc || !have->child))
        cJSON_Delete(have);
    else if (made)
        cJSON_AddItemToObject(dst, part, have);
    return rc;
}

cJSON *k8s_trim(const cJSON *obj, const char *const *keep)
{
    cJSON *out = cJSON_CreateObject();
    for (size_t i = 0; out && keep[i]; i++)
        if (copy_path(obj, out, keep[i]) != 0) {
            cJSON_Delete(out);
            return NULL;
        }
    return out;
}

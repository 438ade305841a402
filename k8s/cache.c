/* cache.c: the informer's local copy of a collection, a hash table of objects keyed by
 * "namespace/name" (chained, FNV-1a, doubled at load 1), so that tens of thousands of objects
 * are found, replaced and relisted in constant time each. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

bool k8s_key_of(const char *ns, const char *name, char *buf, size_t len)
{
    if (!name || !*name)
        return false;
    int n = ns && *ns ? snprintf(buf, len, "%s/%s", ns, name) : snprintf(buf, len, "%s", name);
    return n > 0 && (size_t)n < len;
}

bool k8s_object_key(const cJSON *obj, char *buf, size_t len)
{
    return k8s_key_of(edl_k8s_str(obj, "metadata.namespace"), edl_k8s_str(obj, "metadata.name"), buf, len);
}

static uint32_t fnv1a(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

k8s_entry *k8s_cache_find(const k8s_cache *c, const char *key)
{
    if (!c->nbuckets)
        return NULL;
    uint32_t h = fnv1a(key);
    for (k8s_entry *e = c->buckets[h & (c->nbuckets - 1)]; e; e = e->next)
        if (e->hash == h && strcmp(e->key, key) == 0)
            return e;
    return NULL;
}

static int grow(k8s_cache *c)
{
    size_t n = c->nbuckets ? c->nbuckets * 2 : 64;
    k8s_entry **b = calloc(n, sizeof *b);
    if (!b)
        return EDL_ENOMEM;
    for (size_t i = 0; i < c->nbuckets; i++) {
        for (k8s_entry *e = c->buckets[i], *next; e; e = next) {
            next = e->next;
            e->next = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
        }
    }
    free(c->buckets);
    c->buckets = b;
    c->nbuckets = n;
    return 0;
}

int k8s_cache_put(k8s_cache *c, const char *key, cJSON *obj, cJSON **old)
{
    *old = NULL;
    k8s_entry *e = k8s_cache_find(c, key);
    if (e) {
        *old = e->obj;
        e->obj = obj;
        return 0;
    }
    if (c->count >= c->nbuckets && grow(c) != 0)
        return EDL_ENOMEM;
    if (!(e = calloc(1, sizeof *e)) || !(e->key = strdup(key))) {
        free(e);
        return EDL_ENOMEM;
    }
    e->obj = obj;
    e->hash = fnv1a(key);
    e->next = c->buckets[e->hash & (c->nbuckets - 1)];
    c->buckets[e->hash & (c->nbuckets - 1)] = e;
    c->count++;
    return 0;
}

cJSON *k8s_cache_remove(k8s_cache *c, const char *key)
{
    if (!c->nbuckets)
        return NULL;
    uint32_t h = fnv1a(key);
    for (k8s_entry **p = &c->buckets[h & (c->nbuckets - 1)]; *p; p = &(*p)->next) {
        k8s_entry *e = *p;
        if (e->hash == h && strcmp(e->key, key) == 0) {
            cJSON *obj = e->obj;
            *p = e->next;
            free(e->awaited_rv);
            free(e->key);
            free(e);
            c->count--;
            return obj;
        }
    }
    return NULL;
}

void k8s_cache_clear(k8s_cache *c)
{
    for (size_t i = 0; i < c->nbuckets; i++) {
        for (k8s_entry *e = c->buckets[i], *next; e; e = next) {
            next = e->next;
            cJSON_Delete(e->obj);
            free(e->awaited_rv);
            free(e->key);
            free(e);
        }
    }
    free(c->buckets);
    memset(c, 0, sizeof *c);
}

void k8s_entry_await(k8s_entry *e, const char *rv, int64_t until)
{
    free(e->awaited_rv);
    e->awaited_rv = rv ? strdup(rv) : NULL; /* no memory: trust the stream, as before */
    e->awaited_until = until;
}

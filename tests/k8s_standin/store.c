/* store.c: the object store of k8s-standin: objects by (resource, namespace, name) in a hash
 * table, one global resourceVersion counter, the ring of recent watch events (--history), the
 * watchers that events are pushed to, and the pod counts of peaks.c, told of every write.
 * Every function here expects the store mutex held, except si_watch_pop (the watch's own
 * mutex) and the reference counting (atomic). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

struct si_entry {
    si_entry *next;
    si_resource *res;
    char *ns, *name;
    si_obj *obj;
};

/* The owner index: how many stored objects name each uid in their ownerReferences, so that
 * deleting an object nobody owns skips the garbage collector's scan (10,000 pods). */
typedef struct owner_ref {
    struct owner_ref *next;
    char *uid;
    long count;
} owner_ref;

static owner_ref **owner_slot(si_store *s, const char *uid)
{
    size_t h = 2166136261u;
    for (const char *p = uid; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    owner_ref **pp = &s->owners[h % SI_OWNER_BUCKETS];
    while (*pp && strcmp((*pp)->uid, uid))
        pp = &(*pp)->next;
    return pp;
}

static void index_owners(si_store *s, const cJSON *obj, long delta)
{
    const cJSON *ref;
    cJSON_ArrayForEach(ref, si_get(obj, "metadata.ownerReferences"))
    {
        const char *uid = si_str(ref, "uid");
        if (!uid)
            continue;
        owner_ref **pp = owner_slot(s, uid);
        if (!*pp) {
            if (delta < 0)
                continue;
            *pp = calloc(1, sizeof **pp);
            (*pp)->uid = strdup(uid);
        }
        (*pp)->count += delta;
        if ((*pp)->count <= 0) {
            owner_ref *gone = *pp;
            *pp = gone->next;
            free(gone->uid);
            free(gone);
        }
    }
}

bool si_store_is_owner(si_store *s, const char *uid)
{
    return *owner_slot(s, uid) != NULL;
}

void si_obj_unref(si_obj *o)
{
    if (o && __atomic_sub_fetch(&o->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        cJSON_Delete(o->json);
        free(o);
    }
}

void si_event_unref(si_event *e)
{
    if (e && __atomic_sub_fetch(&e->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        si_obj_unref(e->obj);
        free(e);
    }
}

static si_event *event_new(enum si_event_type type, uint64_t rv, si_resource *r, si_obj *o)
{
    si_event *e = calloc(1, sizeof *e);
    e->refs = 1;
    e->type = type;
    e->rv = rv;
    e->res = r;
    e->obj = o;
    __atomic_add_fetch(&o->refs, 1, __ATOMIC_ACQ_REL);
    return e;
}

int si_store_init(si_store *s, size_t history)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    s->nbuckets = 1 << 14;
    s->buckets = calloc(s->nbuckets, sizeof *s->buckets);
    s->ring_cap = history ? history : 1;
    s->ring = calloc(s->ring_cap, sizeof *s->ring);
    s->rv = 1;
    s->floor = 1;
    return s->buckets && s->ring ? 0 : -1;
}

static size_t hash_key(const si_resource *r, const char *ns, const char *name)
{
    size_t h = (size_t)(uintptr_t)r * 31;
    for (const char *p = ns; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    h = (h ^ '/') * 16777619u;
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    return h;
}

static si_entry **find_slot(si_store *s, const si_resource *r, const char *ns, const char *name)
{
    si_entry **pp = &s->buckets[hash_key(r, ns, name) & (s->nbuckets - 1)];
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->res == r && !strcmp((*pp)->ns, ns) && !strcmp((*pp)->name, name))
            return pp;
    return pp;
}

/* Double the table when it gets crowded, so 10,000 pods stay cheap to find. */
static void maybe_grow(si_store *s)
{
    if (s->count < s->nbuckets)
        return;
    size_t n = s->nbuckets * 2;
    si_entry **b = calloc(n, sizeof *b);
    if (!b)
        return;
    for (size_t i = 0; i < s->nbuckets; i++)
        for (si_entry *e = s->buckets[i], *next; e; e = next) {
            next = e->next;
            size_t h = hash_key(e->res, e->ns, e->name) & (n - 1);
            e->next = b[h];
            b[h] = e;
        }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = n;
}

si_obj *si_store_get(si_store *s, const si_resource *r, const char *ns, const char *name)
{
    si_entry **pp = find_slot(s, r, ns ? ns : "", name);
    return *pp ? (*pp)->obj : NULL;
}

static void ring_add(si_store *s, si_event *e)
{
    if (s->ring_len == s->ring_cap) {
        si_event *old = s->ring[s->ring_head];
        s->floor = old->rv;
        si_event_unref(old);
        s->ring[s->ring_head] = e;
        s->ring_head = (s->ring_head + 1) % s->ring_cap;
    } else {
        s->ring[(s->ring_head + s->ring_len) % s->ring_cap] = e;
        s->ring_len++;
    }
}

static void watch_push(si_watch *w, si_event *e)
{
    pthread_mutex_lock(&w->mu);
    if (w->closed || w->overflow) {
        pthread_mutex_unlock(&w->mu);
        si_event_unref(e);
        return;
    }
    if (w->limit && w->queued >= w->limit) {
        w->overflow = true; /* too slow: the stream is closed, as the real server does */
        pthread_cond_broadcast(&w->cond);
        pthread_mutex_unlock(&w->mu);
        si_event_unref(e);
        return;
    }
    si_qnode *n = malloc(sizeof *n);
    n->next = NULL;
    n->ev = e;
    if (w->tail)
        w->tail->next = n;
    else
        w->head = n;
    w->tail = n;
    w->queued++;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->mu);
}

bool si_watch_matches(const si_watch *w, const si_resource *r, const cJSON *obj)
{
    if (w->res != r)
        return false;
    if (w->ns[0] && strcmp(w->ns, si_str(obj, "metadata.namespace") ? si_str(obj, "metadata.namespace") : ""))
        return false;
    return si_selector_match(w->labels, obj) && si_selector_match(w->fields, obj);
}

/* Deliver e to every watcher that selects it; an object that moves into or out of a watcher's
 * selection arrives as ADDED or DELETED, as with the real server. */
static void fan_out(si_store *s, si_event *e, const cJSON *old)
{
    for (si_watch *w = s->watches; w; w = w->next) {
        if (w->res != e->res)
            continue;
        bool now = si_watch_matches(w, e->res, e->obj->json);
        bool before = old && si_watch_matches(w, e->res, old);
        if (e->type != SI_MODIFIED || (now && before)) {
            if (now) {
                __atomic_add_fetch(&e->refs, 1, __ATOMIC_ACQ_REL);
                watch_push(w, e);
            }
        } else if (now || before) {
            watch_push(w, event_new(now ? SI_ADDED : SI_DELETED, e->rv, e->res, e->obj));
        }
    }
}

static void record(si_store *s, enum si_event_type type, si_resource *r, si_obj *o,
                   const cJSON *old)
{
    si_event *e = event_new(type, s->rv, r, o);
    fan_out(s, e, old);
    ring_add(s, e);
}

static void stamp_rv(si_store *s, cJSON *json)
{
    char rv[32];
    snprintf(rv, sizeof rv, "%llu", (unsigned long long)++s->rv);
    si_set_str(si_obj_child(json, "metadata"), "resourceVersion", rv);
}

si_obj *si_store_put(si_store *s, si_resource *r, cJSON *json)
{
    const char *ns = si_str(json, "metadata.namespace"), *name = si_str(json, "metadata.name");
    stamp_rv(s, json);
    si_obj *o = calloc(1, sizeof *o);
    o->refs = 1;
    o->json = json;
    si_entry **pp = find_slot(s, r, ns ? ns : "", name ? name : "");
    index_owners(s, json, 1);
    if (*pp) {
        si_obj *old = (*pp)->obj;
        index_owners(s, old->json, -1);
        si_peaks_note(s, r, old->json, json);
        (*pp)->obj = o;
        record(s, SI_MODIFIED, r, o, old->json);
        si_obj_unref(old);
        return o;
    }
    si_entry *e = calloc(1, sizeof *e);
    e->res = r;
    e->ns = strdup(ns ? ns : "");
    e->name = strdup(name ? name : "");
    e->obj = o;
    *pp = e;
    s->count++;
    si_peaks_note(s, r, NULL, json);
    record(s, SI_ADDED, r, o, NULL);
    maybe_grow(s);
    return o;
}

void si_store_remove(si_store *s, si_resource *r, const char *ns, const char *name)
{
    s->list_cache.rv = 0; /* it may hold this entry */
    si_entry **pp = find_slot(s, r, ns ? ns : "", name), *e = *pp;
    if (!e)
        return;
    *pp = e->next;
    s->count--;
    index_owners(s, e->obj->json, -1);
    si_peaks_note(s, r, e->obj->json, NULL);
    cJSON *json = cJSON_Duplicate(e->obj->json, true);
    stamp_rv(s, json);
    si_obj *o = calloc(1, sizeof *o);
    o->refs = 1;
    o->json = json;
    record(s, SI_DELETED, r, o, NULL);
    si_obj_unref(o);
    si_obj_unref(e->obj);
    free(e->ns);
    free(e->name);
    free(e);
}

/* Sorted by namespace and name through the entries' own copies of them: a list of 10,000 pods
 * sorts without a lookup in any object. */
static int by_ns_name(const void *a, const void *b)
{
    const si_entry *x = *(si_entry *const *)a, *y = *(si_entry *const *)b;
    int c = strcmp(x->ns, y->ns);
    return c ? c : strcmp(x->name, y->name);
}

/* The sorted entries of a resource (in ns, "" for all), reused while nothing was written: the
 * pages of one list (limit/continue) sort once. */
static si_entry **sorted_entries(si_store *s, const si_resource *r, const char *ns, size_t *n)
{
    const char *want = ns ? ns : "";
    if (s->list_cache.rv == s->rv && s->list_cache.res == r && s->list_cache.ns &&
        strcmp(s->list_cache.ns, want) == 0) {
        *n = s->list_cache.n;
        return s->list_cache.entries;
    }
    si_entry **found = malloc((s->count + 1) * sizeof *found);
    size_t k = 0;
    for (size_t i = 0; found && i < s->nbuckets; i++)
        for (si_entry *e = s->buckets[i]; e; e = e->next)
            if ((!r || e->res == r) && (!*want || !strcmp(e->ns, want)))
                found[k++] = e;
    if (found)
        qsort(found, k, sizeof *found, by_ns_name);
    free(s->list_cache.entries);
    free(s->list_cache.ns);
    s->list_cache.entries = found;
    s->list_cache.n = found ? k : 0;
    s->list_cache.res = r;
    s->list_cache.ns = strdup(want);
    s->list_cache.rv = found ? s->rv : 0;
    *n = s->list_cache.n;
    return found;
}

si_obj **si_store_list(si_store *s, const si_resource *r, const char *ns, size_t *n)
{
    size_t k = 0;
    si_entry **found = sorted_entries(s, r, ns, &k);
    si_obj **out = malloc((k + 1) * sizeof *out);
    for (size_t i = 0; out && found && i < k; i++)
        out[i] = found[i]->obj;
    *n = out && found ? k : 0;
    return out;
}

void si_store_expire(si_store *s)
{
    for (size_t i = 0; i < s->ring_len; i++)
        si_event_unref(s->ring[(s->ring_head + i) % s->ring_cap]);
    s->ring_len = 0;
    s->ring_head = 0;
    s->floor = s->rv;
}

int si_watch_start(si_store *s, si_watch *w, uint64_t rv, bool from_list, size_t limit)
{
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cond, NULL);
    if (!from_list && rv < s->floor)
        return -410;
    size_t n0 = 0;
    if (from_list) {
        size_t n;
        si_obj **all = si_store_list(s, w->res, w->ns, &n);
        for (size_t i = 0; i < n; i++)
            if (si_watch_matches(w, w->res, all[i]->json)) {
                si_event *e = event_new(SI_ADDED, s->rv, w->res, all[i]);
                watch_push(w, e);
                n0++;
            }
        free(all);
    } else {
        for (size_t i = 0; i < s->ring_len; i++) {
            si_event *e = s->ring[(s->ring_head + i) % s->ring_cap];
            if (e->rv > rv && si_watch_matches(w, e->res, e->obj->json)) {
                __atomic_add_fetch(&e->refs, 1, __ATOMIC_ACQ_REL);
                watch_push(w, e);
                n0++;
            }
        }
    }
    w->limit = limit ? n0 + limit : 0;
    w->next = s->watches;
    s->watches = w;
    return 0;
}

void si_watch_stop(si_store *s, si_watch *w)
{
    for (si_watch **pp = &s->watches; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    pthread_mutex_lock(&w->mu);
    w->closed = true;
    while (w->head) {
        si_qnode *n = w->head;
        w->head = n->next;
        si_event_unref(n->ev);
        free(n);
    }
    w->tail = NULL;
    w->queued = 0;
    pthread_mutex_unlock(&w->mu);
}

si_event *si_watch_pop(si_watch *w)
{
    pthread_mutex_lock(&w->mu);
    si_qnode *n = w->head;
    si_event *e = NULL;
    if (n) {
        w->head = n->next;
        if (!w->head)
            w->tail = NULL;
        w->queued--;
        e = n->ev;
        free(n);
    }
    pthread_mutex_unlock(&w->mu);
    return e;
}

void si_store_free(si_store *s)
{
    free(s->list_cache.entries);
    free(s->list_cache.ns);
    for (size_t i = 0; i < s->nbuckets; i++)
        for (si_entry *e = s->buckets[i], *next; e; e = next) {
            next = e->next;
            si_obj_unref(e->obj);
            free(e->ns);
            free(e->name);
            free(e);
        }
    free(s->buckets);
    for (size_t i = 0; i < SI_OWNER_BUCKETS; i++)
        for (owner_ref *o = s->owners[i], *next; o; o = next) {
            next = o->next;
            free(o->uid);
            free(o);
        }
    si_peaks_free(s);
    si_store_expire(s);
    free(s->ring);
    for (si_resource *r = s->resources, *next; r; r = next) {
        next = r->next;
        cJSON_Delete(r->schema);
        cJSON_Delete(r->columns);
        free(r);
    }
    pthread_mutex_destroy(&s->mu);
}

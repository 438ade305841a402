/* faults.c: the test-only side of k8s-standin: injected failures (POST /standin/faults: the
 * matching requests fail with the given Status, or wait delayMs first, count times or until
 * cleared) and request counts by verb and resource (GET /standin/stats), which tests use to
 * prove that nothing was done twice. Each has its own mutex. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "standin.h"

typedef struct fault {
    struct fault *next;
    char verb[32], resource[160], ns[256], name[256], reason[64];
    char *message;
    int code, count, delay_ms;
} fault;

struct si_faults {
    pthread_mutex_t mu;
    fault *list;
};

typedef struct stat_entry {
    struct stat_entry *next;
    char *key;
    long count;
} stat_entry;

struct si_stats {
    pthread_mutex_t mu;
    stat_entry *list;
};

si_faults *si_faults_new(void)
{
    si_faults *f = calloc(1, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    return f;
}

void si_faults_clear(si_faults *f)
{
    pthread_mutex_lock(&f->mu);
    for (fault *x = f->list, *next; x; x = next) {
        next = x->next;
        free(x->message);
        free(x);
    }
    f->list = NULL;
    pthread_mutex_unlock(&f->mu);
}

void si_faults_free(si_faults *f)
{
    if (!f)
        return;
    si_faults_clear(f);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

static void field(char *dst, size_t len, const cJSON *spec, const char *key)
{
    const char *v = si_str(spec, key);
    snprintf(dst, len, "%s", v && strcmp(v, "*") ? v : "");
}

int si_faults_add(si_faults *f, const cJSON *spec, char *err, size_t errlen)
{
    const cJSON *code = cJSON_GetObjectItem(spec, "code"), *count = cJSON_GetObjectItem(spec, "count");
    const cJSON *delay = cJSON_GetObjectItem(spec, "delayMs");
    if (!cJSON_IsObject(spec) || (code && (!cJSON_IsNumber(code) || code->valueint < 100 ||
                                           code->valueint > 599)) ||
        (!code && !cJSON_IsNumber(delay))) {
        snprintf(err, errlen, "a fault needs \"code\" (100-599) or \"delayMs\"; optional \"verb\", "
                              "\"resource\", \"namespace\", \"name\", \"reason\", \"message\", \"count\"");
        return -1;
    }
    fault *x = calloc(1, sizeof *x);
    field(x->verb, sizeof x->verb, spec, "verb");
    field(x->resource, sizeof x->resource, spec, "resource");
    field(x->ns, sizeof x->ns, spec, "namespace");
    field(x->name, sizeof x->name, spec, "name");
    field(x->reason, sizeof x->reason, spec, "reason");
    x->message = strdup(si_str(spec, "message") ? si_str(spec, "message") : "injected by k8s-standin");
    x->code = code ? code->valueint : 0;
    x->count = cJSON_IsNumber(count) ? count->valueint : 1;
    x->delay_ms = cJSON_IsNumber(delay) ? delay->valueint : 0;
    pthread_mutex_lock(&f->mu);
    fault **pp = &f->list;
    while (*pp)
        pp = &(*pp)->next;
    *pp = x;
    pthread_mutex_unlock(&f->mu);
    return 0;
}

static bool matches(const fault *x, const char *verb, const char *resource, const char *ns,
                    const char *name)
{
    return (!x->verb[0] || !strcmp(x->verb, verb)) &&
           (!x->resource[0] || !strcmp(x->resource, resource)) &&
           (!x->ns[0] || (ns && !strcmp(x->ns, ns))) && (!x->name[0] || (name && !strcmp(x->name, name)));
}

cJSON *si_faults_check(si_faults *f, const char *verb, const char *resource, const char *ns,
                       const char *name, int *delay_ms)
{
    cJSON *st = NULL;
    *delay_ms = 0;
    pthread_mutex_lock(&f->mu);
    for (fault **pp = &f->list; *pp; pp = &(*pp)->next) {
        fault *x = *pp;
        if (x->count == 0 || !matches(x, verb, resource, ns, name))
            continue;
        *delay_ms = x->delay_ms;
        if (x->code)
            st = si_status_new(x->code, x->reason[0] ? x->reason : NULL, x->message);
        if (x->count > 0)
            x->count--;
        break;
    }
    pthread_mutex_unlock(&f->mu);
    return st;
}

si_stats *si_stats_new(void)
{
    si_stats *st = calloc(1, sizeof *st);
    pthread_mutex_init(&st->mu, NULL);
    return st;
}

static void stats_reset(si_stats *st)
{
    for (stat_entry *e = st->list, *next; e; e = next) {
        next = e->next;
        free(e->key);
        free(e);
    }
    st->list = NULL;
}

void si_stats_free(si_stats *st)
{
    if (!st)
        return;
    stats_reset(st);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

void si_stats_count(si_stats *st, const char *verb, const char *resource)
{
    char key[256];
    snprintf(key, sizeof key, "%s%s%s", verb, *verb ? " " : "", resource);
    pthread_mutex_lock(&st->mu);
    stat_entry **pp = &st->list;
    for (; *pp && strcmp((*pp)->key, key); pp = &(*pp)->next)
        ;
    if (!*pp) {
        *pp = calloc(1, sizeof **pp);
        (*pp)->key = strdup(key);
    }
    (*pp)->count++;
    pthread_mutex_unlock(&st->mu);
}

/* The counts as {"create pods": 7, ...}; reset: start again from nothing. */
cJSON *si_stats_json(si_stats *st, bool reset)
{
    cJSON *o = cJSON_CreateObject();
    pthread_mutex_lock(&st->mu);
    for (stat_entry *e = st->list; e; e = e->next)
        cJSON_AddNumberToObject(o, e->key, (double)e->count);
    if (reset)
        stats_reset(st);
    pthread_mutex_unlock(&st->mu);
    return o;
}

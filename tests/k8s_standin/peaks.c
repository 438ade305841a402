/* peaks.c: live and peak pod counts per namespace, for tests (GET /standin/stats reports them
 * as "live pods <ns>" and "peak pods <ns>"). A pod is live from its creation until it gets a
 * deletionTimestamp or goes; the peak is the most pods live at once since start or since the
 * last reset (DELETE /standin/stats: the peak becomes the live count). The store calls
 * si_peaks_note on every write, with the store mutex held. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

struct si_peaks {
    struct si_peaks *next;
    char *ns;
    long live, peak;
};

static bool live_pod(const si_resource *r, const cJSON *obj)
{
    return obj && !r->is_crd && !r->group[0] && !strcmp(r->plural, "pods") &&
           !si_get(obj, "metadata.deletionTimestamp");
}

static si_peaks *slot(si_store *s, const char *ns)
{
    si_peaks **pp = &s->peaks;
    for (; *pp; pp = &(*pp)->next)
        if (!strcmp((*pp)->ns, ns))
            return *pp;
    *pp = calloc(1, sizeof **pp);
    (*pp)->ns = strdup(ns);
    return *pp;
}

void si_peaks_note(si_store *s, const si_resource *r, const cJSON *before, const cJSON *after)
{
    int delta = (int)live_pod(r, after) - (int)live_pod(r, before);
    if (!delta)
        return;
    const char *ns = si_str(after ? after : before, "metadata.namespace");
    si_peaks *p = slot(s, ns ? ns : "");
    p->live += delta;
    if (p->live > p->peak)
        p->peak = p->live;
}

void si_peaks_json(si_store *s, cJSON *into, bool reset)
{
    char key[300];
    for (si_peaks *p = s->peaks; p; p = p->next) {
        snprintf(key, sizeof key, "live pods %s", p->ns);
        cJSON_AddNumberToObject(into, key, (double)p->live);
        snprintf(key, sizeof key, "peak pods %s", p->ns);
        cJSON_AddNumberToObject(into, key, (double)p->peak);
        if (reset)
            p->peak = p->live;
    }
}

void si_peaks_free(si_store *s)
{
    for (si_peaks *p = s->peaks, *next; p; p = next) {
        next = p->next;
        free(p->ns);
        free(p);
    }
    s->peaks = NULL;
}

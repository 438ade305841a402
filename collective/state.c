/* state.c: commit / restore / sync of plain host buffers for the elastic loop. A commit is a
 * private copy of every registered buffer; after a re-form, the ranks agree (over the CPU
 * group) on the newest commit and the lowest rank holding it broadcasts it to all. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/log.h"
#include "internal.h"

typedef struct state_buf {
    char *name;
    void *buf;
    size_t bytes;
    char *saved;
} state_buf;

struct edl_coll_state {
    state_buf *v;
    size_t n;
    int64_t step; /* of the last commit; -1: none */
};

int edl_coll_state_new(edl_coll_state **out)
{
    if (!out)
        return EDL_EINVAL;
    *out = calloc(1, sizeof **out);
    if (!*out)
        return EDL_ENOMEM;
    (*out)->step = -1;
    return 0;
}

void edl_coll_state_free(edl_coll_state *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++) {
        free(s->v[i].name);
        free(s->v[i].saved);
    }
    free(s->v);
    free(s);
}

int edl_coll_state_add(edl_coll_state *s, const char *name, void *buf, size_t bytes)
{
    if (!s || !name || (!buf && bytes))
        return EDL_EINVAL;
    state_buf *v = realloc(s->v, (s->n + 1) * sizeof *v);
    if (!v)
        return EDL_ENOMEM;
    s->v = v;
    state_buf *b = &v[s->n];
    *b = (state_buf){.name = strdup(name), .buf = buf, .bytes = bytes,
                     .saved = malloc(bytes ? bytes : 1)};
    if (!b->name || !b->saved) {
        free(b->name);
        free(b->saved);
        return EDL_ENOMEM;
    }
    s->n++;
    return 0;
}

int edl_coll_state_commit(edl_coll_state *s, int64_t step)
{
    if (!s || step < 0)
        return EDL_EINVAL;
    for (size_t i = 0; i < s->n; i++)
        memcpy(s->v[i].saved, s->v[i].buf, s->v[i].bytes);
    s->step = step;
    return 0;
}

int edl_coll_state_restore(edl_coll_state *s, int64_t *step)
{
    if (!s)
        return EDL_EINVAL;
    if (s->step >= 0)
        for (size_t i = 0; i < s->n; i++)
            memcpy(s->v[i].buf, s->v[i].saved, s->v[i].bytes);
    if (step)
        *step = s->step;
    return 0;
}

/* FNV-1a over names and sizes: the layout every rank must share. */
static int64_t layout_hash(const edl_coll_state *s)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < s->n; i++) {
        for (const char *p = s->v[i].name; *p; p++)
            h = (h ^ (unsigned char)*p) * 1099511628211ull;
        uint64_t b = s->v[i].bytes;
        for (int k = 0; k < 8; k++)
            h = (h ^ ((b >> (8 * k)) & 0xff)) * 1099511628211ull;
    }
    return (int64_t)(h >> 1); /* non-negative, so max and -max compare it */
}

int edl_coll_state_sync(edl_coll_state *s, edl_comm *c, int64_t *step)
{
    if (!s || !c)
        return EDL_EINVAL;
    edl_coll_state_restore(s, NULL);
    int n = edl_coll_size(c), r = edl_coll_rank(c);
    if (n > 1) {
        /* A first allreduce(max) answers two questions: [0] the newest step, [1]/[2] whether
         * every layout is the same (max(h) == -max(-h)); a second one, which needs the newest
         * step to ask, finds the lowest rank holding it (as max(n - rank)). */
        int64_t h = layout_hash(s), in[3] = {s->step, h, -h}, out[3];
        int rc = coll_cpu_allreduce_host(c, in, out, 3, EDL_INT64, EDL_MAX);
        if (rc)
            return rc;
        if (out[1] != -out[2]) {
            coll_set_err(c, "edl_coll_state_sync: the ranks registered different buffers (names "
                         "or sizes differ; this rank has %zu buffers)", s->n);
            return coll_fail(c, EDL_EPROTO);
        }
        int64_t who = s->step == out[0] ? n - r : 0, root;
        if ((rc = coll_cpu_allreduce_host(c, &who, &root, 1, EDL_INT64, EDL_MAX)))
            return rc;
        root = n - root;
        for (size_t i = 0; i < s->n; i++)
            if ((rc = coll_cpu_broadcast_host(c, s->v[i].buf, s->v[i].bytes, (int)root)))
                return rc;
        if (out[0] >= 0)
            edl_coll_state_commit(s, out[0]);
        EDL_INFO("coll", "generation %" PRId64 ": state of step %" PRId64 " synchronised from "
                 "rank %d", edl_coll_generation(c), out[0], (int)root);
    }
    if (step)
        *step = s->step;
    return 0;
}

/* ranks.c: the rank assignment rule of edl/job.h (deterministic, minimal movement): which
 * live pods become members of the next generation, at which ranks, and which wait as
 * standbys. Pure, so the job server's decisions are tested without etcd. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "edl/job.h"

static void strv_free(char **v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i]);
    free(v);
}

static const edl_member *prev_match(const edl_member *prev, size_t n_prev, const edl_pod *p)
{
    for (size_t i = 0; i < n_prev; i++)
        if (strcmp(prev[i].pod, p->name) == 0 && prev[i].lease == p->lease)
            return &prev[i];
    return NULL;
}

static int fill_member(edl_member *m, const edl_pod *p, int rank)
{
    m->pod = strdup(p->name);
    m->addr = strdup(p->addr ? p->addr : "");
    m->port = p->port;
    m->lease = p->lease;
    m->rank = rank;
    return (m->pod && m->addr) ? 0 : EDL_ENOMEM;
}

/* The picks of one assignment: chosen[j] is the index into cands of the j-th member picked
 * (survivors first, by their previous rank, then newcomers in join order), rank[j] its rank. */
typedef struct picks {
    size_t n;        /* members the generation will have */
    size_t k;        /* picked so far */
    size_t n_surv;   /* the first n_surv picks are survivors */
    size_t *chosen;
    int *rank;       /* -1: no rank yet */
    bool *picked;    /* [n_cands] */
    bool *taken;     /* [n] rank r is used */
} picks;

/* Survivors by their previous rank, so that the lowest ranks survive a cut to max; each keeps
 * its rank when it is below n. */
static int pick_survivors(picks *p, const edl_member *prev, size_t n_prev, const edl_pod *cands,
                          size_t n_cands)
{
    size_t *by_rank = malloc((n_prev ? n_prev : 1) * sizeof *by_rank);
    if (!by_rank)
        return EDL_ENOMEM;
    for (size_t r = 0; r < n_prev; r++)
        by_rank[r] = SIZE_MAX;
    for (size_t i = 0; i < n_cands; i++) {
        const edl_member *pm = prev_match(prev, n_prev, &cands[i]);
        if (pm && pm->rank >= 0 && (size_t)pm->rank < n_prev && by_rank[pm->rank] == SIZE_MAX)
            by_rank[pm->rank] = i;
    }
    for (size_t r = 0; r < n_prev && p->k < p->n; r++) {
        size_t i = by_rank[r];
        if (i == SIZE_MAX)
            continue;
        p->picked[i] = true;
        p->rank[p->k] = r < p->n ? (int)r : -1;
        if (r < p->n)
            p->taken[r] = true;
        p->chosen[p->k++] = i;
    }
    p->n_surv = p->k;
    free(by_rank);
    return 0;
}

/* Newcomers in join order, then the ranks: the free ones below n go first to the survivors
 * whose rank is too high (highest first), then to the newcomers in join order. */
static void pick_newcomers_and_fill(picks *p, size_t n_cands)
{
    for (size_t i = 0; i < n_cands && p->k < p->n; i++)
        if (!p->picked[i]) {
            p->picked[i] = true;
            p->rank[p->k] = -1;
            p->chosen[p->k++] = i;
        }
    size_t hole = 0;
    for (size_t j = p->n_surv; j-- > 0;) {
        if (p->rank[j] >= 0)
            continue;
        while (p->taken[hole])
            hole++;
        p->rank[j] = (int)hole;
        p->taken[hole] = true;
    }
    for (size_t j = p->n_surv; j < p->k; j++) {
        while (p->taken[hole])
            hole++;
        p->rank[j] = (int)hole;
        p->taken[hole] = true;
    }
}

static void picks_free(picks *p)
{
    free(p->chosen);
    free(p->rank);
    free(p->picked);
    free(p->taken);
}

int edl_assign_ranks(const edl_member *prev, size_t n_prev, const edl_pod *cands, size_t n_cands,
                     int max, edl_member **members, size_t *n_members, char ***standbys,
                     size_t *n_standbys)
{
    if (max < 0 || (n_cands && !cands))
        return EDL_EINVAL;
    size_t cap = n_cands ? n_cands : 1;
    picks p = {.n = n_cands < (size_t)max ? n_cands : (size_t)max};
    p.chosen = calloc(cap, sizeof *p.chosen);
    p.rank = calloc(cap, sizeof *p.rank);
    p.picked = calloc(cap, sizeof *p.picked);
    p.taken = calloc(p.n ? p.n : 1, sizeof *p.taken);
    edl_member *out = calloc(p.n ? p.n : 1, sizeof *out);
    char **sb = calloc(cap, sizeof *sb);
    size_t n_sb = 0;
    int rc = p.chosen && p.rank && p.picked && p.taken && out && sb ? 0 : EDL_ENOMEM;
    if (!rc)
        rc = pick_survivors(&p, prev, n_prev, cands, n_cands);
    if (!rc)
        pick_newcomers_and_fill(&p, n_cands);
    for (size_t j = 0; !rc && j < p.k; j++)
        rc = fill_member(&out[p.rank[j]], &cands[p.chosen[j]], p.rank[j]);
    for (size_t i = 0; !rc && i < n_cands; i++)
        if (!p.picked[i] && !(sb[n_sb++] = strdup(cands[i].name)))
            rc = EDL_ENOMEM;
    if (rc) {
        edl_members_free(out, p.n);
        strv_free(sb, n_sb);
    } else {
        *members = out;
        *n_members = p.k;
        *standbys = sb;
        *n_standbys = n_sb;
    }
    picks_free(&p);
    return rc;
}

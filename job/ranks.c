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

int edl_assign_ranks(const edl_member *prev, size_t n_prev, const edl_pod *cands, size_t n_cands,
                     int max, edl_member **members, size_t *n_members, char ***standbys,
                     size_t *n_standbys)
{
    if (max < 0 || (n_cands && !cands))
        return EDL_EINVAL;
    size_t n = n_cands < (size_t)max ? n_cands : (size_t)max;
    /* chosen[k]: index into cands of the k-th member picked; survivors first, then newcomers */
    size_t *chosen = calloc(n_cands ? n_cands : 1, sizeof *chosen);
    int *rank = calloc(n_cands ? n_cands : 1, sizeof *rank);
    bool *picked = calloc(n_cands ? n_cands : 1, sizeof *picked);
    bool *taken = calloc(n ? n : 1, sizeof *taken); /* rank r < n already used */
    edl_member *out = calloc(n ? n : 1, sizeof *out);
    char **sb = calloc(n_cands ? n_cands : 1, sizeof *sb);
    size_t *by_rank = NULL;
    int rc = EDL_ENOMEM;
    size_t k = 0, n_sb = 0;
    if (!chosen || !rank || !picked || !taken || !out || !sb)
        goto done;
    /* survivors, by their previous rank (so the lowest ranks survive a cut to max) */
    by_rank = malloc((n_prev ? n_prev : 1) * sizeof *by_rank);
    if (!by_rank)
        goto done;
    for (size_t r = 0; r < n_prev; r++)
        by_rank[r] = SIZE_MAX;
    for (size_t i = 0; i < n_cands; i++) {
        const edl_member *pm = prev_match(prev, n_prev, &cands[i]);
        if (pm && pm->rank >= 0 && (size_t)pm->rank < n_prev && by_rank[pm->rank] == SIZE_MAX)
            by_rank[pm->rank] = i;
    }
    for (size_t r = 0; r < n_prev && k < n; r++) {
        size_t i = by_rank[r];
        if (i == SIZE_MAX)
            continue;
        picked[i] = true;
        rank[k] = r < n ? (int)r : -1;
        if (rank[k] >= 0)
            taken[r] = true;
        chosen[k++] = i;
    }
    size_t n_surv = k;
    for (size_t i = 0; i < n_cands && k < n; i++)
        if (!picked[i]) {
            picked[i] = true;
            rank[k] = -1;
            chosen[k++] = i;
        }
    /* holes: first the survivors with ranks >= n, highest first, then newcomers in join order */
    size_t hole = 0;
    for (size_t j = n_surv; j-- > 0;) {
        if (rank[j] >= 0)
            continue;
        while (taken[hole])
            hole++;
        rank[j] = (int)hole;
        taken[hole] = true;
    }
    for (size_t j = n_surv; j < k; j++) {
        while (taken[hole])
            hole++;
        rank[j] = (int)hole;
        taken[hole] = true;
    }
    for (size_t j = 0; j < k; j++)
        if (fill_member(&out[rank[j]], &cands[chosen[j]], rank[j]) != 0)
            goto done;
    for (size_t i = 0; i < n_cands; i++)
        if (!picked[i] && !(sb[n_sb++] = strdup(cands[i].name)))
            goto done;
    rc = 0;
done:
    if (rc) {
        edl_members_free(out, n);
        strv_free(sb, n_sb);
    } else {
        *members = out;
        *n_members = k;
        *standbys = sb;
        *n_standbys = n_sb;
    }
    free(by_rank);
    free(chosen);
    free(rank);
    free(picked);
    free(taken);
    return rc;
}

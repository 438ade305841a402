/* assign.c: which teachers serve which student (edl_assign), a pure function that every student
 * computes alike from the same sorted names, so no coordinator has to publish it.
 *
 * One side is spread over the other: students over teachers when there are no more teachers
 * than students (each student gets one teacher; a teacher's load is its share of the students
 * in proportion to its capacity, floor or ceil), teachers over students otherwise (each teacher
 * serves one student; a student gets floor or ceil of T/S teachers). Each (student, teacher)
 * pair has a fixed 64-bit rendezvous score from the two names; pairs are taken greedily in
 * descending score, first while every bin stays within the floor of its share, then once more
 * for the items left, each into a bin with a fractional share. With scores common to both sides
 * that greedy is the stable matching of those bounds, so a join or leave moves only the pairs
 * along the chains of displacement it starts (docs/distill.md gives the measured figures). */
#include <stdlib.h>
#include <string.h>

#include "edl/discovery.h"

#define INDEX_BITS 24 /* a pair's index (item * n_bins + bin) in the low bits of its sort key */

/* FNV-1a, then the splitmix64 finaliser: the same on every machine. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

static uint64_t name_hash(const char *s, uint64_t seed)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325) ^ seed;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * UINT64_C(0x100000001b3);
    return mix64(h);
}

static uint64_t pair_score(uint64_t student, uint64_t teacher)
{
    return mix64(student ^ mix64(teacher + UINT64_C(0x9e3779b97f4a7c15)));
}

/* The problem, in the side-neutral form: items each go to one bin; bin b holds floor[b], or
 * floor[b] + 1 when extra[b]. */
typedef struct spread {
    size_t n_items, n_bins;
    uint64_t *keys;    /* score (high bits) | item * n_bins + bin, descending */
    uint32_t *floor;
    bool *extra;
    uint32_t *load;
    int32_t *bin_of;   /* per item: its bin, -1 while unplaced */
} spread;

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Every pair's key, sorted best first. item_is_student says which side the items are. */
static void score_pairs(spread *p, const uint64_t *h_items, const uint64_t *h_bins,
                        bool item_is_student)
{
    uint64_t mask = (UINT64_C(1) << INDEX_BITS) - 1;
    for (size_t i = 0; i < p->n_items; i++)
        for (size_t b = 0; b < p->n_bins; b++) {
            uint64_t s = item_is_student ? pair_score(h_items[i], h_bins[b])
                                         : pair_score(h_bins[b], h_items[i]);
            uint64_t idx = (uint64_t)i * p->n_bins + b;
            p->keys[idx] = (s & ~mask) | idx;
        }
    qsort(p->keys, p->n_items * p->n_bins, sizeof *p->keys, cmp_desc);
}

/* One greedy pass: a pair is taken when its item is unplaced and its bin below its bound
 * (floor, or floor + 1 in the second pass). */
static void greedy(spread *p, bool second)
{
    uint64_t mask = (UINT64_C(1) << INDEX_BITS) - 1;
    size_t n = p->n_items * p->n_bins;
    for (size_t k = 0; k < n; k++) {
        uint64_t idx = p->keys[k] & mask;
        size_t i = idx / p->n_bins, b = idx % p->n_bins;
        uint32_t bound = p->floor[b] + (second && p->extra[b]);
        if (p->bin_of[i] < 0 && p->load[b] < bound) {
            p->bin_of[i] = (int32_t)b;
            p->load[b]++;
        }
    }
}

/* Shares in proportion to weight: floor and whether there is a fractional part. */
static void shares(spread *p, const int *weight)
{
    uint64_t total = 0;
    for (size_t b = 0; b < p->n_bins; b++)
        total += weight ? (uint64_t)weight[b] : 1;
    for (size_t b = 0; b < p->n_bins; b++) {
        uint64_t part = (uint64_t)p->n_items * (weight ? (uint64_t)weight[b] : 1);
        p->floor[b] = (uint32_t)(part / total);
        p->extra[b] = part % total != 0;
    }
}

static void spread_free(spread *p)
{
    free(p->keys);
    free(p->floor);
    free(p->extra);
    free(p->load);
    free(p->bin_of);
}

/* Place every item; weight (may be NULL: equal) per bin. */
static int spread_run(spread *p, const uint64_t *h_items, const uint64_t *h_bins,
                      const int *weight, bool item_is_student)
{
    p->keys = malloc(p->n_items * p->n_bins * sizeof *p->keys);
    p->floor = calloc(p->n_bins, sizeof *p->floor);
    p->extra = calloc(p->n_bins, sizeof *p->extra);
    p->load = calloc(p->n_bins, sizeof *p->load);
    p->bin_of = malloc(p->n_items * sizeof *p->bin_of);
    if (!p->keys || !p->floor || !p->extra || !p->load || !p->bin_of)
        return EDL_ENOMEM;
    memset(p->bin_of, 0xff, p->n_items * sizeof *p->bin_of);
    shares(p, weight);
    score_pairs(p, h_items, h_bins, item_is_student);
    greedy(p, false);
    greedy(p, true);
    return 0;
}

static int cmp_pair(const void *a, const void *b)
{
    const edl_assign_pair *x = a, *y = b;
    if (x->student != y->student)
        return x->student < y->student ? -1 : 1;
    return x->teacher < y->teacher ? -1 : x->teacher > y->teacher;
}

static int check_input(const char *const *students, size_t ns, const char *const *teachers,
                       const int *capacity, size_t nt)
{
    if ((ns && !students) || (nt && (!teachers || !capacity)))
        return EDL_EINVAL;
    if (ns > EDL_SERVICE_MAX_INSTANCES || nt > EDL_SERVICE_MAX_INSTANCES)
        return EDL_ETOOBIG; /* also keeps ns * nt within INDEX_BITS */
    for (size_t i = 0; i < ns; i++)
        if (!students[i])
            return EDL_EINVAL;
    for (size_t t = 0; t < nt; t++)
        if (!teachers[t] || capacity[t] < 1 || capacity[t] > 65535)
            return EDL_EINVAL;
    return 0;
}

/* The pairs of a finished spread, sorted by student then teacher. */
static int collect(const spread *p, bool item_is_student, edl_teacher_assignment *out)
{
    out->pairs = malloc(p->n_items * sizeof *out->pairs);
    if (!out->pairs)
        return EDL_ENOMEM;
    for (size_t i = 0; i < p->n_items; i++) {
        uint32_t b = (uint32_t)p->bin_of[i];
        out->pairs[i] = item_is_student ? (edl_assign_pair){(uint32_t)i, b}
                                        : (edl_assign_pair){b, (uint32_t)i};
    }
    out->n = p->n_items;
    if (!item_is_student)
        qsort(out->pairs, out->n, sizeof *out->pairs, cmp_pair);
    return 0;
}

static uint64_t *hash_names(const char *const *names, size_t n)
{
    uint64_t *h = malloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; h && i < n; i++)
        h[i] = name_hash(names[i], 0);
    return h;
}

int edl_assign(const char *const *students, size_t n_students, const char *const *teachers,
               const int *capacity, size_t n_teachers, edl_teacher_assignment *out)
{
    if (!out)
        return EDL_EINVAL;
    memset(out, 0, sizeof *out);
    int rc = check_input(students, n_students, teachers, capacity, n_teachers);
    if (rc || !n_students || !n_teachers)
        return rc; /* nobody to serve or nobody serving: no pairs */
    uint64_t *hs = hash_names(students, n_students), *ht = hash_names(teachers, n_teachers);
    bool by_student = n_teachers <= n_students;
    spread p = {.n_items = by_student ? n_students : n_teachers,
                .n_bins = by_student ? n_teachers : n_students};
    rc = hs && ht ? 0 : EDL_ENOMEM;
    if (!rc)
        rc = by_student ? spread_run(&p, hs, ht, capacity, true)
                        : spread_run(&p, ht, hs, NULL, false);
    if (!rc)
        rc = collect(&p, by_student, out);
    if (!rc) {
        uint64_t total = 0;
        for (size_t t = 0; t < n_teachers; t++)
            total += (uint64_t)capacity[t];
        out->overcommitted = total < n_students;
    }
    spread_free(&p);
    free(hs);
    free(ht);
    return rc;
}

void edl_teacher_assignment_clear(edl_teacher_assignment *a)
{
    if (!a)
        return;
    free(a->pairs);
    memset(a, 0, sizeof *a);
}

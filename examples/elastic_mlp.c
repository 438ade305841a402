/* elastic_mlp: data-parallel training of a small MLP with libedlcoll's elastic loop.
 *
 * The data has a known answer: 16-dimensional inputs, uniform in [-1, 1], labelled with the
 * argmax of a fixed random linear "teacher" (4 classes); 4096 training and 1024 test samples
 * come from a fixed seed, so every process generates the same set. The model is
 * 16 -> 64 (ReLU) -> 4 with softmax cross-entropy, trained by SGD on a fixed global batch of
 * 32 samples per step: sample k of a step goes to rank k % size, gradients are summed with
 * edl_allreduce, so a step computes the same update whatever the world size (up to float
 * summation order).
 *
 * Run under `edl run --elastic-mode inprocess`: when pods join or leave, this process keeps
 * running, re-forms its group (edl_coll_check), restores its last committed weights and
 * re-syncs them from a surviving rank. Standalone (no agent) it trains alone: that is the
 * undisturbed reference. Rank 0 writes <out>/result.txt at the end ("steps N accuracy A loss
 * L"); every process writes <out>/proc-<pid>.txt ("pid P first_gen G last_gen G reforms R").
 *   elastic_mlp [--steps N] [--step-ms MS] [--lr X] [--out DIR] */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "edl/collective.h"
#include "edl/log.h"

enum { D = 16, H = 64, C = 4, NTRAIN = 4096, NTEST = 1024, BATCH = 32 };
enum { NP = H * D + H + C * H + C }; /* W1, b1, W2, b2 in one vector */

typedef struct data {
    float x[NTRAIN + NTEST][D];
    int y[NTRAIN + NTEST];
} data;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float uniform(void) /* [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (2.0 / 16777216.0) - 1.0);
}

static void make_data(data *d)
{
    float teacher[C][D];
    rng_state = 20261122;
    for (int c = 0; c < C; c++)
        for (int j = 0; j < D; j++)
            teacher[c][j] = uniform();
    for (int i = 0; i < NTRAIN + NTEST; i++) {
        float best = -1e30f;
        for (int j = 0; j < D; j++)
            d->x[i][j] = uniform();
        for (int c = 0; c < C; c++) {
            float z = 0;
            for (int j = 0; j < D; j++)
                z += teacher[c][j] * d->x[i][j];
            if (z > best) {
                best = z;
                d->y[i] = c;
            }
        }
    }
}

static void init_params(float *p)
{
    rng_state = 42;
    for (int i = 0; i < H * D; i++)
        p[i] = uniform() / sqrtf(D);
    for (int i = 0; i < C * H; i++)
        p[H * D + H + i] = uniform() / sqrtf(H);
}

/* Forward one sample; with g, add its gradient. Returns its loss; *hit = prediction right. */
static float sample(const float *p, float *g, const float *x, int y, int *hit)
{
    const float *w1 = p, *b1 = p + H * D, *w2 = b1 + H, *b2 = w2 + C * H;
    float h[H], z[C], m = -1e30f, s = 0;
    for (int k = 0; k < H; k++) {
        float a = b1[k];
        for (int j = 0; j < D; j++)
            a += w1[k * D + j] * x[j];
        h[k] = a > 0 ? a : 0;
    }
    int arg = 0;
    for (int c = 0; c < C; c++) {
        z[c] = b2[c];
        for (int k = 0; k < H; k++)
            z[c] += w2[c * H + k] * h[k];
        if (z[c] > m) {
            m = z[c];
            arg = c;
        }
    }
    for (int c = 0; c < C; c++)
        s += expf(z[c] - m);
    *hit = arg == y;
    float loss = logf(s) - (z[y] - m);
    if (!g)
        return loss;
    float *gw1 = g, *gb1 = g + H * D, *gw2 = gb1 + H, *gb2 = gw2 + C * H, dh[H] = {0};
    for (int c = 0; c < C; c++) {
        float dz = expf(z[c] - m) / s - (c == y);
        gb2[c] += dz;
        for (int k = 0; k < H; k++) {
            gw2[c * H + k] += dz * h[k];
            dh[k] += dz * w2[c * H + k];
        }
    }
    for (int k = 0; k < H; k++) {
        if (h[k] <= 0)
            continue;
        gb1[k] += dh[k];
        for (int j = 0; j < D; j++)
            gw1[k * D + j] += dh[k] * x[j];
    }
    return loss;
}

static float accuracy(const data *d, const float *p, float *loss)
{
    int hits = 0;
    double l = 0;
    for (int i = NTRAIN; i < NTRAIN + NTEST; i++) {
        int hit;
        l += sample(p, NULL, d->x[i], d->y[i], &hit);
        hits += hit;
    }
    *loss = (float)(l / NTEST);
    return (float)hits / NTEST;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: elastic_mlp [--steps N] [--step-ms MS] [--lr X] [--out DIR]\n"
               "Data-parallel MLP training with libedlcoll's elastic loop (see the file's "
               "header).\nRun it under `edl run --elastic-mode inprocess`, or alone for the "
               "undisturbed reference.\n");
}

int main(int argc, char **argv)
{
    long steps = 1500, step_ms = 0;
    float lr = 0.2f;
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            usage(stderr);
            return 2;
        }
        char *end;
        if (strcmp(argv[i], "--steps") == 0)
            steps = strtol(argv[++i], &end, 10);
        else if (strcmp(argv[i], "--step-ms") == 0)
            step_ms = strtol(argv[++i], &end, 10);
        else if (strcmp(argv[i], "--lr") == 0)
            lr = strtof(argv[++i], &end);
        else if (strcmp(argv[i], "--out") == 0)
            out = argv[++i], end = (char *)"";
        else {
            usage(stderr);
            return 2;
        }
        if (*end || steps < 1 || step_ms < 0 || !(lr > 0)) {
            fprintf(stderr, "elastic_mlp: bad value for %s: %s\n", argv[i - 1], argv[i]);
            return 2;
        }
    }
    edl_log_setup_from_env();
    data *d = malloc(sizeof *d);
    float *p = malloc(NP * sizeof *p), *g = malloc(NP * sizeof *g);
    if (!d || !p || !g)
        return 1;
    make_data(d);
    init_params(p);

    edl_comm *c;
    int rc = edl_coll_open(NULL, &c);
    if (rc) {
        fprintf(stderr, "elastic_mlp: cannot join the group: %s\n", edl_strerror(rc));
        return 1;
    }
    edl_coll_state *st;
    int64_t step = 0, first_gen = edl_coll_generation(c), reforms = 0;
    if (edl_coll_state_new(&st) || edl_coll_state_add(st, "params", p, sizeof(float) * NP))
        return 1;
    edl_coll_state_commit(st, 0);
    while (step < steps) {
        rc = edl_coll_check(c);
        if (rc == EDL_COLL_REFORMED) {
            if (edl_coll_state_sync(st, c, &step) != 0)
                continue; /* broke again while syncing: the next check re-forms */
            if (reforms++ > 0 || edl_coll_rank(c) == 0)
                printf("elastic_mlp: generation %" PRId64 ": rank %d of %d, resuming at step %"
                       PRId64 "\n", edl_coll_generation(c), edl_coll_rank(c), edl_coll_size(c),
                       step);
        } else if (rc < 0) {
            fprintf(stderr, "elastic_mlp: %s\n", edl_coll_errmsg(c));
            return 1;
        }
        int rank = edl_coll_rank(c), size = edl_coll_size(c);
        memset(g, 0, NP * sizeof *g);
        for (int k = rank; k < BATCH; k += size) {
            int i = (int)((step * BATCH + k) % NTRAIN), hit;
            sample(p, g, d->x[i], d->y[i], &hit);
        }
        if (edl_allreduce(c, g, g, NP, EDL_FLOAT32, EDL_SUM) != 0)
            continue; /* a peer failed: the next check re-forms, restores and re-syncs */
        for (int i = 0; i < NP; i++)
            p[i] -= lr * g[i] / BATCH;
        step++;
        edl_coll_state_commit(st, step);
        edl_agent_link_report_step(edl_coll_agent_link(c), step);
        if (rank == 0 && step % 250 == 0) {
            float loss, acc = accuracy(d, p, &loss);
            printf("elastic_mlp: step %" PRId64 " of %ld: test accuracy %.4f, loss %.4f (%d "
                   "ranks)\n", step, steps, acc, loss, size);
        }
        if (step_ms)
            usleep((useconds_t)step_ms * 1000);
    }
    float loss, acc = accuracy(d, p, &loss);
    printf("elastic_mlp: done: %" PRId64 " steps, test accuracy %.4f, loss %.4f; rank %d of %d, "
           "%" PRId64 " re-forms in this process\n", step, acc, loss, edl_coll_rank(c),
           edl_coll_size(c), reforms > 0 ? reforms - 1 : 0);
    if (out) {
        char path[4096];
        snprintf(path, sizeof path, "%s/proc-%d.txt", out, (int)getpid());
        FILE *f = fopen(path, "w");
        if (f) {
            fprintf(f, "pid %d first_gen %" PRId64 " last_gen %" PRId64 " reforms %" PRId64 "\n",
                    (int)getpid(), first_gen, edl_coll_generation(c), reforms - 1);
            fclose(f);
        }
        if (edl_coll_rank(c) == 0) {
            snprintf(path, sizeof path, "%s/result.txt", out);
            f = fopen(path, "w");
            if (!f) {
                fprintf(stderr, "elastic_mlp: cannot write %s: %s\n", path, strerror(errno));
                return 1;
            }
            fprintf(f, "steps %" PRId64 " accuracy %.4f loss %.4f\n", step, acc, loss);
            fclose(f);
        }
    }
    edl_coll_state_free(st);
    edl_coll_close(c);
    free(d);
    free(p);
    free(g);
    return 0;
}

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
#include "mlp.h"

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

/* elastic_trainer.c: a small data-parallel trainer that survives being restarted at any world
 * size, for `edl run` (see scripts/demo).
 *
 * It fits a linear model y = X w* + noise (8 features, 4096 samples generated from a fixed
 * seed, so every rank has the same data without files) by minibatch SGD. Step s uses the
 * global batch of 64 samples starting at (s * 64) mod N; rank r takes every world_size-th of
 * them, writes its partial gradient to the shared directory, waits for the other ranks' files,
 * and applies the sum (added in rank order, so every rank holds the same weights). Rank 0
 * checkpoints the weights every few steps and every start resumes from the newest checkpoint:
 * under an agent through edl/checkpoint.h (EDL_CHECKPOINT_URI, asynchronous saves committed by
 * the etcd pointer; each save once committed and each load reported to the agent as a
 * "checkpoint" progress line), standalone to a file in DIR.
 * Because a step's batch depends only on the step number, the result does not depend on how
 * often the job was re-formed or at which sizes: it is checked against the true weights.
 *
 * Usage: elastic_trainer [--dir DIR] [--steps N] [--step-ms MS] [--lr LR]
 *   DIR defaults to the path of EDL_CHECKPOINT_URI (file:///path). Rank and world size come
 *   from EDL_RANK / EDL_WORLD_SIZE (1 process when absent). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "edl/checkpoint.h"
#include "edl/etcd.h"

#define D 8
#define N 4096
#define BATCH 64
#define CKPT_EVERY 10

typedef struct trainer {
    const char *dir;
    long steps;
    long step_ms;
    double lr;
    int rank, world;
    long gen;
    int progress_fd;
    edl_etcd *etcd;         /* with ckpt: checkpoints through edl/checkpoint.h */
    edl_ckpt *ckpt;
    edl_ckpt_pending *saving;
    int64_t saving_since_ms; /* when it was queued; 0: reported to the agent (or none) */
} trainer;

static double true_w(int j)
{
    return 0.5 * (j + 1) - 2.0;
}

/* Deterministic data: sample i's features and label from a hash of i. */
static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static double unit(uint64_t h) /* in [-1, 1) */
{
    return (double)(h >> 11) / (double)(1ULL << 52) - 1.0;
}

static void sample(long i, double x[D], double *y)
{
    *y = 0;
    for (int j = 0; j < D; j++) {
        x[j] = unit(mix((uint64_t)i * 131 + (uint64_t)j + 1));
        *y += x[j] * true_w(j);
    }
    *y += 0.01 * unit(mix((uint64_t)i * 7919 + 12345)); /* noise */
}

static double loss_of(const double w[D])
{
    double s = 0;
    for (long i = 0; i < N; i++) {
        double x[D], y, p = 0;
        sample(i, x, &y);
        for (int j = 0; j < D; j++)
            p += x[j] * w[j];
        s += (p - y) * (p - y);
    }
    return s / N;
}

static int write_atomic(const char *path, const void *buf, size_t len)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, buf, len);
    if (n != (ssize_t)len || fsync(fd) != 0) {
        close(fd);
        unlink(tmp);
        return -1;
    }
    close(fd);
    return rename(tmp, path);
}

static int load_checkpoint(const trainer *t, long *step, double w[D])
{
    char path[4200], buf[2048];
    snprintf(path, sizeof path, "%s/checkpoint.txt", t->dir);
    FILE *f = fopen(path, "r");
    *step = 0;
    for (int j = 0; j < D; j++)
        w[j] = 0;
    if (!f)
        return 0;
    int ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    char *p = buf;
    if (!ok || sscanf(p, "step %ld", step) != 1 || !(p = strchr(p, 'w')))
        return -1;
    p++;
    for (int j = 0; j < D; j++) {
        char *end;
        w[j] = strtod(p, &end);
        if (end == p)
            return -1;
        p = end;
    }
    return 0;
}

static void save_checkpoint(const trainer *t, long step, const double w[D])
{
    char path[4200], buf[2048];
    size_t n = (size_t)snprintf(buf, sizeof buf, "step %ld w", step);
    for (int j = 0; j < D; j++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, " %.17g", w[j]);
    n += (size_t)snprintf(buf + n, sizeof buf - n, "\n");
    snprintf(path, sizeof path, "%s/checkpoint.txt", t->dir);
    if (write_atomic(path, buf, n) != 0)
        fprintf(stderr, "rank %d: checkpoint %s: %s\n", t->rank, path, strerror(errno));
}

/* Under an agent: checkpoints in EDL_CHECKPOINT_URI, committed through etcd. Only rank 0
 * saves (every rank holds the same weights), so it opens the checkpoint as a world of one. */
static int ckpt_open(trainer *t)
{
    const char *uri = getenv("EDL_CHECKPOINT_URI"), *ep = getenv("EDL_ETCD_ENDPOINTS"),
               *job = getenv("EDL_JOB_ID");
    if (!uri || !ep || !job)
        return 0;
    char err[512];
    edl_ckpt_config cfg;
    edl_ckpt_config_init(&cfg);
    cfg.uri = uri;
    cfg.job = job;
    cfg.etcd = NULL; /* set below, once connected */
    cfg.verify_on_load = false; /* ckpt_load's one read of the weights checks their digest */
    cfg.prefix = getenv("EDL_ETCD_PREFIX");
    cfg.rank = 0;
    cfg.world_size = 1;
    cfg.keep = 3;
    int rc = edl_etcd_open_env(&t->etcd, err, sizeof err); /* as the agent connects */
    cfg.etcd = t->etcd;
    if (rc)
        fprintf(stderr, "rank %d: etcd at %s: %s\n", t->rank, ep, err);
    else if ((rc = edl_ckpt_open(&cfg, &t->ckpt, err, sizeof err)) != 0)
        fprintf(stderr, "rank %d: checkpoints at %s: %s\n", t->rank, uri, err);
    return rc;
}

static void report_line(const trainer *t, const char *line, int n)
{
    if (t->progress_fd < 0 || n <= 0)
        return;
    ssize_t w = write(t->progress_fd, line, (size_t)n);
    (void)w; /* progress is advisory: a full or closed pipe never stops training */
}

/* A checkpoint saved or loaded since since_ms, to the agent (its /metrics). */
static void report_checkpoint(const trainer *t, bool load, int64_t since_ms)
{
    char line[80];
    report_line(t, line, snprintf(line, sizeof line, "checkpoint %s %lld %zu\n",
                                  load ? "load" : "save",
                                  (long long)(edl_monotonic_ms() - since_ms),
                                  sizeof(double) * D));
}

/* The weights of checkpoint m, read straight into w (size and digest checked). */
static int read_weights(trainer *t, const edl_ckpt_manifest *m, double w[D])
{
    long i = edl_ckpt_find_shard(m, 0, 0);
    if (i < 0 || m->shards[i].size != sizeof(double) * D) {
        fprintf(stderr, "rank %d: checkpoint step %" PRId64 " holds no weights of this model\n",
                t->rank, m->step);
        return EDL_EPROTO;
    }
    return edl_ckpt_read_shard_into(t->ckpt, m, (size_t)i, w, sizeof(double) * D);
}

/* The newest checkpoint whose weights read back intact: a corrupt one (EDL_EPROTO) falls back
 * to the one before it, as edl_ckpt_load_latest's own check would have. */
static int ckpt_load(trainer *t, long *step, double w[D])
{
    int64_t t0 = edl_monotonic_ms();
    edl_ckpt_manifest *m = NULL;
    *step = 0;
    int rc = edl_ckpt_load_latest(t->ckpt, &m);
    if (rc == EDL_ENOTFOUND)
        return 0;
    while (!rc && (rc = read_weights(t, m, w)) == EDL_EPROTO) {
        int64_t bad = m->step;
        edl_ckpt_manifest_free(m);
        m = NULL;
        fprintf(stderr, "rank %d: checkpoint step %" PRId64 " is unusable (%s): trying the one "
                "before\n", t->rank, bad, edl_ckpt_errmsg(t->ckpt));
        if ((rc = edl_ckpt_load_older(t->ckpt, bad, &m)) == EDL_ENOTFOUND)
            rc = EDL_EPROTO; /* none intact: an error, not "no checkpoint yet" */
    }
    if (!rc) {
        *step = (long)m->step;
        report_checkpoint(t, true, t0);
    } else {
        fprintf(stderr, "rank %d: loading the latest checkpoint: %s (%s)\n", t->rank,
                edl_strerror(rc), edl_ckpt_errmsg(t->ckpt));
    }
    if (rc)
        for (int j = 0; j < D; j++)
            w[j] = 0; /* a failed read may have left part of a shard */
    edl_ckpt_manifest_free(m);
    return rc;
}

/* Once the save under way is committed, tell the agent how long it took (checked each step:
 * the time is right to a step). */
static void ckpt_note_saved(trainer *t)
{
    if (t->saving && t->saving_since_ms && edl_ckpt_save_done(t->saving) &&
        edl_ckpt_wait(t->saving, 0) == 0) {
        report_checkpoint(t, false, t->saving_since_ms);
        t->saving_since_ms = 0;
    }
}

/* Finish the previous save (it had a whole step interval to run), then queue this one. */
static void ckpt_save(trainer *t, long step, const double w[D], bool wait)
{
    if (t->saving) {
        int rc = edl_ckpt_wait(t->saving, -1);
        ckpt_note_saved(t);
        if (rc && rc != EDL_ECONFLICT)
            fprintf(stderr, "rank 0: checkpoint failed: %s\n", edl_ckpt_save_errmsg(t->saving));
        edl_ckpt_save_free(t->saving);
        t->saving = NULL;
    }
    if (step < 0)
        return;
    edl_ckpt_shard sh = {.name = "weights", .data = w, .len = sizeof(double) * D};
    t->saving_since_ms = edl_monotonic_ms();
    if (edl_ckpt_save_async(t->ckpt, step, t->gen, &sh, 1, NULL, &t->saving) != 0)
        fprintf(stderr, "rank 0: cannot queue checkpoint %ld: %s\n", step,
                edl_ckpt_errmsg(t->ckpt));
    else if (wait)
        ckpt_save(t, -1, w, false);
}

/* This rank's share of step s's gradient (sum over its samples). */
static void partial_gradient(const trainer *t, long s, const double w[D], double g[D])
{
    for (int j = 0; j < D; j++)
        g[j] = 0;
    for (int b = t->rank; b < BATCH; b += t->world) {
        long i = (s * BATCH + b) % N;
        double x[D], y, p = 0;
        sample(i, x, &y);
        for (int j = 0; j < D; j++)
            p += x[j] * w[j];
        for (int j = 0; j < D; j++)
            g[j] += 2 * (p - y) * x[j];
    }
}

static void step_path(const trainer *t, long s, int r, char *buf, size_t n)
{
    if (r < 0)
        snprintf(buf, n, "%s/exchange/g%ld/s%ld", t->dir, t->gen, s);
    else
        snprintf(buf, n, "%s/exchange/g%ld/s%ld/r%d", t->dir, t->gen, s, r);
}

static void remove_step(const trainer *t, long s)
{
    char p[4200];
    for (int r = 0; r < t->world; r++) {
        step_path(t, s, r, p, sizeof p);
        unlink(p);
    }
    step_path(t, s, -1, p, sizeof p);
    rmdir(p);
}

/* Exchange partial gradients through the shared directory: a file-based allreduce. */
static int allreduce(const trainer *t, long s, double g[D])
{
    char p[4200];
    step_path(t, s, -1, p, sizeof p);
    mkdir(p, 0755);
    step_path(t, s, t->rank, p, sizeof p);
    if (write_atomic(p, g, sizeof(double) * D) != 0)
        return -1;
    double sum[D] = {0};
    for (int r = 0; r < t->world; r++) {
        step_path(t, s, r, p, sizeof p);
        double part[D];
        for (int waited = 0;; waited++) {
            FILE *f = fopen(p, "rb");
            size_t got = f ? fread(part, sizeof(double), D, f) : 0;
            if (f)
                fclose(f);
            if (got == D)
                break;
            if (waited > 120000) {
                fprintf(stderr, "rank %d: no gradient from rank %d for step %ld after 120 s\n",
                        t->rank, r, s);
                return -1;
            }
            usleep(1000);
        }
        for (int j = 0; j < D; j++)
            sum[j] += part[j];
    }
    memcpy(g, sum, sizeof sum);
    return 0;
}

static void report_progress(const trainer *t, long step)
{
    char line[32];
    report_line(t, line, snprintf(line, sizeof line, "step %ld\n", step));
}

static void mkdirs(const char *dir)
{
    char p[4200];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            mkdir(p, 0755);
            *s = '/';
        }
    mkdir(p, 0755);
}

static long env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : dflt;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"dir", required_argument, 0, 'd'},   {"steps", required_argument, 0, 's'},
        {"step-ms", required_argument, 0, 'm'}, {"lr", required_argument, 0, 'l'},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0},
    };
    trainer t = {.steps = 300, .step_ms = 20, .lr = 0.05};
    const char *uri = getenv("EDL_CHECKPOINT_URI");
    char xbase[4200];
    if (uri && strncmp(uri, "file://", 7) == 0) {
        snprintf(xbase, sizeof xbase, "%s/shared", uri + 7);
        t.dir = xbase; /* beside the checkpoints, not among them */
    }
    int ch;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'd': t.dir = optarg; break;
        case 's': t.steps = strtol(optarg, NULL, 10); break;
        case 'm': t.step_ms = strtol(optarg, NULL, 10); break;
        case 'l': t.lr = strtod(optarg, NULL); break;
        case 'h':
            printf("Usage: elastic_trainer [--dir DIR] [--steps N] [--step-ms MS] [--lr LR]\n"
                   "DIR: shared directory (default: the path of EDL_CHECKPOINT_URI=file://...)\n");
            return 0;
        default: return 2;
        }
    }
    if (!t.dir || t.steps < 1 || t.step_ms < 0 || !(t.lr > 0)) {
        fprintf(stderr, "elastic_trainer: need --dir (or EDL_CHECKPOINT_URI=file:///path), "
                        "--steps >= 1, --step-ms >= 0, --lr > 0\n");
        return 2;
    }
    t.rank = (int)env_long("EDL_RANK", 0);
    t.world = (int)env_long("EDL_WORLD_SIZE", 1);
    t.gen = env_long("EDL_GENERATION", 0);
    t.progress_fd = (int)env_long("EDL_PROGRESS_FD", -1);
    if (t.world < 1 || t.rank < 0 || t.rank >= t.world) {
        fprintf(stderr, "elastic_trainer: bad rank %d of %d\n", t.rank, t.world);
        return 2;
    }
    char xdir[4200];
    snprintf(xdir, sizeof xdir, "%s/exchange/g%ld", t.dir, t.gen);
    mkdirs(xdir);

    double w[D];
    long step;
    if (ckpt_open(&t) != 0)
        return 3;
    if (t.ckpt ? ckpt_load(&t, &step, w) != 0 : load_checkpoint(&t, &step, w) != 0) {
        fprintf(stderr, "rank %d: unreadable checkpoint\n", t.rank);
        return 3;
    }
    char total[40]; /* the agent's pod status, and edl status --watch's time to the end */
    report_line(&t, total, snprintf(total, sizeof total, "total %ld\n", t.steps));
    if (t.rank == 0)
        printf("rank 0: generation %ld, world size %d, resuming at step %ld (loss %.6f)\n", t.gen,
               t.world, step, loss_of(w));
    fflush(stdout);
    while (step < t.steps) {
        double g[D];
        partial_gradient(&t, step, w, g);
        if (t.step_ms)
            usleep((useconds_t)t.step_ms * 1000); /* stands in for the real compute */
        if (allreduce(&t, step, g) != 0)
            return 3;
        for (int j = 0; j < D; j++)
            w[j] -= t.lr * g[j] / BATCH;
        if (t.rank == 0 && step >= 2)
            remove_step(&t, step - 2);
        step++;
        report_progress(&t, step);
        ckpt_note_saved(&t);
        if (t.rank == 0 && (step % CKPT_EVERY == 0 || step == t.steps)) {
            if (t.ckpt)
                ckpt_save(&t, step, w, step == t.steps);
            else
                save_checkpoint(&t, step, w);
        }
        if (t.rank == 0 && step % 50 == 0) {
            printf("rank 0: step %ld loss %.6f (world size %d, generation %ld)\n", step,
                   loss_of(w), t.world, t.gen);
            fflush(stdout);
        }
    }
    double err = 0;
    for (int j = 0; j < D; j++)
        err = fmax(err, fabs(w[j] - true_w(j)));
    if (t.rank == 0) {
        printf("rank 0: done after %ld steps: loss %.6f, max |w - w*| = %.6f\n", step, loss_of(w),
               err);
        char path[4200], buf[256];
        int n = snprintf(buf, sizeof buf, "steps %ld loss %.9f maxerr %.9f\n", step, loss_of(w),
                         err);
        snprintf(path, sizeof path, "%s/result.txt", t.dir);
        write_atomic(path, buf, (size_t)n);
    }
    edl_ckpt_close(t.ckpt);
    edl_etcd_close(t.etcd);
    return 0;
}

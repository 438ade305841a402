/* bench/checkpoint.c: checkpoint save and load throughput beside bounds measured in the same run.
 *
 *   checkpoint [--size BYTES[K|M|G]] [--shards N] [--repeat N] [--dir PATH]
 *              [--s3-endpoint URL | --no-s3] [--part-size BYTES[K|M|G]] [--parallel-parts N]
 *              [--copy-threads N]
 *
 * Saves and loads --size bytes (default 1 GiB) in --shards shards (8) through edl/checkpoint.h,
 * with its own loopback etcd, on file:// (under --dir, default $TMPDIR) and on s3:// (the server
 * at --s3-endpoint, whose bucket edl-bench must exist, with AWS_* credentials; or else an s3rver
 * started from tests/.s3rver, see scripts/install-deps). Each throughput is measured --repeat
 * times (3), alternating with its bound on the same number of bytes (bound, ours, bound, ...):
 *   file:// save   `dd conv=fsync` into the same directory;
 *   file:// load   read(2) in 1 MiB chunks, into one reused buffer, of the checkpoint's own
 *                  shard files;
 *   s3:// save     `curl -T` (one PUT) to the same server;  s3:// load  `curl` GET of that object.
 * Every timed read, the bound's and ours, starts from a cold page cache: each file under the
 * bench's directory is fsynced and dropped (POSIX_FADV_DONTNEED) first. One line per figure:
 * our median over the bound's, then both medians with their spread (max - min, in percent of
 * the median, printed "±").
 * Then how long asynchronous saves block the caller, beside the save's wall time (until
 * edl_ckpt_wait returns), as medians of --repeat saves: the first save (alone: it allocates the
 * handle's staging memory); the first save of a handle that reserved its staging first (alone,
 * the reserve's time beside it); saves that reuse it (the copy only: its GB/s beside a memcpy into
 * pre-faulted memory on one thread and on as many threads as the checkpoint copies with); saves
 * with snapshot_in_background in a training-like loop (save_async, a pass reading every byte as
 * forward and backward would, edl_ckpt_snapshot_wait, a pass writing every word as the optimizer
 * would: blocked is the time inside save_async and snapshot_wait, after a warm-up save; the
 * step's time is printed beside one without a save); one save with the buffers handed over
 * (free_fn: no copy).
 * Memory: the state (--size), at most one staging area of that size, and about one shard. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "edl/checkpoint.h"
#include "edl/proc.h"
#include "edl/etcd_server.h"
#include "edl/log.h"

#define MAX_REPEAT 50
#define MAX_SHARDS 256
#define DEFAULT_COPY_THREADS_MAX 8 /* as edl_ckpt_config.copy_threads = 0: the CPUs, at most 8 */
#define COPY_THREADS_MAX 64        /* edl_ckpt_config.copy_threads's own bound */
#define READ_CHUNK (1u << 20)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int rm_entry(const char *p, const struct stat *st, int f, struct FTW *w)
{
    (void)st, (void)f, (void)w;
    remove(p);
    return 0;
}

/* Run a shell command and time it; -1 when it failed. */
static double timed_shell(const char *cmd)
{
    double t0 = now_s();
    int rc = system(cmd);
    if (rc != 0) {
        fprintf(stderr, "checkpoint bench: `%s` failed (%d)\n", cmd, rc);
        return -1;
    }
    return now_s() - t0;
}

static double mib_s(uint64_t bytes, double secs)
{
    return (double)bytes / 1048576.0 / secs;
}

/* ---- figures: repeated measurements, their median and spread ---------------------------- */

typedef struct series {
    double v[MAX_REPEAT];
    int n;
} series;

static void add(series *s, double v)
{
    if (s->n < MAX_REPEAT)
        s->v[s->n++] = v;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const series *s)
{
    if (s->n == 0)
        return 0;
    double v[MAX_REPEAT];
    memcpy(v, s->v, (size_t)s->n * sizeof *v);
    qsort(v, (size_t)s->n, sizeof *v, cmp_double);
    return s->n % 2 ? v[s->n / 2] : (v[s->n / 2 - 1] + v[s->n / 2]) / 2;
}

/* max - min in percent of the median. */
static double spread(const series *s)
{
    double lo = s->n ? s->v[0] : 0, hi = lo, med = median(s);
    for (int i = 1; i < s->n; i++) {
        lo = s->v[i] < lo ? s->v[i] : lo;
        hi = s->v[i] > hi ? s->v[i] : hi;
    }
    return med > 0 ? 100.0 * (hi - lo) / med : 0;
}

/* "<what>  0.97x  (median of 3; ours 612 MiB/s ±8%, bound 630 ±12%)": higher is better. */
static void ratio_line(const char *what, const series *ours, const series *bound, const char *unit,
                       int prec)
{
    double o = median(ours), b = median(bound);
    if (bound->n == 0) {
        printf("%-46s   --    (median of %d; ours %.*f %s ±%.0f%%, bound failed)\n", what,
               ours->n, prec, o, unit, spread(ours));
        return;
    }
    printf("%-46s %5.2fx  (median of %d; ours %.*f %s ±%.0f%%, bound %.*f ±%.0f%%)\n", what,
           o / b, ours->n, prec, o, unit, spread(ours), prec, b, spread(bound));
}

/* "<label> <what>  0.110 s blocked of 2.300 s total (4.8%)" with medians, then tail. */
static void stall_line(const char *label, const char *what, const series *blocked,
                       const series *total, const char *tail)
{
    char w[96];
    snprintf(w, sizeof w, "%s %s", label, what);
    double b = median(blocked), t = median(total);
    printf("%-46s %6.3f s blocked of %.3f s total (%.1f%%)", w, b, t, 100.0 * b / t);
    if (blocked->n > 1)
        printf(" (median of %d, ±%.0f%%)", blocked->n, spread(blocked));
    printf("%s\n", tail ? tail : "");
}

/* ---- files: the page cache and the plain sequential read -------------------------------- */

typedef void (*visit_fn)(const char *path, const struct stat *st, void *arg);

/* fn for every regular file under dir (symbolic links not followed). */
static void walk_tree(const char *dir, visit_fn fn, void *arg)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char p[PATH_MAX];
        struct stat st;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
            (size_t)snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= sizeof p ||
            lstat(p, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode))
            walk_tree(p, fn, arg);
        else if (S_ISREG(st.st_mode))
            fn(p, &st, arg);
    }
    closedir(d);
}

/* Write the file's dirty pages out, then drop all its pages from the page cache. */
static void evict_file(const char *path, const struct stat *st, void *arg)
{
    (void)st, (void)arg;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    fsync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

typedef struct file_list {
    char **paths;
    size_t n;
    uint64_t bytes;
} file_list;

static void add_shard_file(const char *path, const struct stat *st, void *arg)
{
    file_list *fl = arg;
    const char *base = strrchr(path, '/');
    if (strncmp(base ? base + 1 : path, "shard-", 6) != 0)
        return;
    char **grown = realloc(fl->paths, (fl->n + 1) * sizeof *grown);
    if (!grown)
        return;
    fl->paths = grown;
    if ((fl->paths[fl->n] = strdup(path)) != NULL) {
        fl->n++;
        fl->bytes += (uint64_t)st->st_size;
    }
}

static void file_list_free(file_list *fl)
{
    for (size_t i = 0; i < fl->n; i++)
        free(fl->paths[i]);
    free(fl->paths);
}

/* read(2) every file through in READ_CHUNK pieces into one buffer: seconds, -1 on failure. */
static double seq_read(const file_list *fl, uint64_t *bytes)
{
    char *buf = malloc(READ_CHUNK);
    uint64_t got = 0;
    bool ok = buf != NULL;
    double t0 = now_s();
    for (size_t i = 0; ok && i < fl->n; i++) {
        int fd = open(fl->paths[i], O_RDONLY | O_CLOEXEC);
        ssize_t n = 0;
        while (fd >= 0 && (n = read(fd, buf, READ_CHUNK)) > 0)
            got += (uint64_t)n;
        ok = fd >= 0 && n == 0;
        if (fd >= 0)
            close(fd);
    }
    double t = now_s() - t0;
    free(buf);
    *bytes = got;
    return ok ? t : -1;
}

/* ---- memcpy: the bound of the staging copy ---------------------------------------------- */

static int copy_threads_opt; /* --copy-threads (0: as the checkpoint's default) */

/* The copy threads of the checkpoints under test and of the memcpy bound: --copy-threads, else
 * what copy_threads = 0 gives (the CPUs this process may use, at most 8). Handed to the
 * checkpoint explicitly, so that both sides copy on the same number of threads. */
static int copy_threads(void)
{
    if (copy_threads_opt)
        return copy_threads_opt;
    int n = edl_cpu_count();
    return n > DEFAULT_COPY_THREADS_MAX ? DEFAULT_COPY_THREADS_MAX : n;
}

typedef struct copy_part {
    char *const *src;
    int n_src;
    char *dst;
    size_t off, len;
} copy_part;

/* Copy bytes [off, off+len) of every source buffer into the same bytes of dst. */
static void *copy_range(void *arg)
{
    copy_part *c = arg;
    for (int i = 0; i < c->n_src; i++) {
        memcpy(c->dst + c->off, c->src[i] + c->off, c->len);
        __asm__ volatile("" : : "r"(c->dst) : "memory"); /* the copy is not optimised away */
    }
    return NULL;
}

/* memcpy of every shard by `threads` threads (the caller one of them), each a slice of each
 * shard, into pre-faulted memory of one shard's size (reused), as the staging is (4 KiB pages:
 * it does not ask for huge pages). GB/s; 0 on failure. */
static double memcpy_speed(char *const *bufs, int shards, size_t per, int threads)
{
    char *dst = mmap(NULL, per, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (dst == MAP_FAILED)
        return 0;
    memset(dst, 1, per);
    copy_part parts[COPY_THREADS_MAX];
    pthread_t tid[COPY_THREADS_MAX];
    size_t slice = (per / (size_t)threads + 4095) & ~(size_t)4095;
    for (int t = 0; t < threads; t++) {
        size_t off = (size_t)t * slice < per ? (size_t)t * slice : per;
        parts[t] = (copy_part){bufs, shards, dst, off, per - off < slice ? per - off : slice};
    }
    int started = 0;
    double t0 = now_s();
    while (started + 1 < threads &&
           pthread_create(&tid[started], NULL, copy_range, &parts[started + 1]) == 0)
        started++;
    for (int t = started + 1; t < threads; t++) /* threads that did not start: done here */
        copy_range(&parts[t]);
    copy_range(&parts[0]);
    for (int t = 0; t < started; t++)
        pthread_join(tid[t], NULL);
    double secs = now_s() - t0;
    munmap(dst, per);
    return (double)per * shards / secs / 1e9;
}

/* ---- the checkpoint ---------------------------------------------------------------------- */

typedef struct run {
    edl_etcd *etcd;
    const char *uri;
    const char *job;
    edl_storage_config sc;
    size_t size;
    int shards;
    int repeat;
    char **bufs;
    int64_t step;          /* the last step saved: every save takes the next one */
    const char *root;      /* the bench's directory: evicted before every timed read */
    const char *files;     /* file://: the checkpoint's local directory (else NULL) */
    const char *save_cmd;  /* the save's bound: a shell command writing size bytes */
    const char *save_what; /* its label */
    const char *load_cmd;  /* s3://: the load's bound (file:// reads the shard files) */
    const char *load_what;
} run;

static size_t shard_len(const run *r)
{
    return r->size / (size_t)r->shards;
}

static edl_ckpt *open_ck(run *r, bool in_background)
{
    edl_ckpt_config cfg;
    edl_ckpt_config_init(&cfg);
    cfg.uri = r->uri;
    cfg.etcd = r->etcd;
    cfg.job = r->job;
    cfg.keep = 1; /* the disk holds one checkpoint (and the one being saved) */
    cfg.verify_on_load = false; /* the reads verify every shard as they read it */
    cfg.storage = &r->sc;
    cfg.snapshot_in_background = in_background;
    cfg.copy_threads = copy_threads();
    edl_ckpt *ck;
    char err[512];
    if (edl_ckpt_open(&cfg, &ck, err, sizeof err) != 0) {
        fprintf(stderr, "checkpoint bench: %s\n", err);
        exit(1);
    }
    return ck;
}

/* The bench's buffers outlive every save: nothing to free once a handed-over one is stored. */
static void keep_buffer(void *data, void *arg)
{
    (void)data, (void)arg;
}

static void fill_state(run *r)
{
    for (int i = 0; i < r->shards; i++) {
        uint64_t *p = (uint64_t *)r->bufs[i];
        for (size_t k = 0; k < shard_len(r) / 8; k++)
            p[k] = k * 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0xBF58476D1CE4E5B9ull;
    }
}

static void make_shards(const run *r, edl_ckpt_shard *sh, bool hand_over)
{
    for (int i = 0; i < r->shards; i++)
        sh[i] = (edl_ckpt_shard){.name = "shard", .data = r->bufs[i], .len = shard_len(r),
                                 .free_fn = hand_over ? keep_buffer : NULL};
}

/* A synchronous save of the next step (the buffers lent, no copy): seconds, -1 on failure. */
static double save_once(edl_ckpt *ck, run *r, const char *label)
{
    edl_ckpt_shard sh[MAX_SHARDS];
    make_shards(r, sh, false);
    double t0 = now_s();
    if (edl_ckpt_save(ck, ++r->step, 1, sh, (size_t)r->shards, NULL) != 0) {
        fprintf(stderr, "checkpoint bench: save on %s: %s\n", label, edl_ckpt_errmsg(ck));
        return -1;
    }
    return now_s() - t0;
}

/* load_latest, then read (and verify) every shard into the state buffers (as a trainer loads
 * into its model's memory), parallel_shards at a time: seconds, -1 on failure. */
static double load_once(edl_ckpt *ck, run *r, const char *label, uint64_t *bytes)
{
    double t0 = now_s();
    edl_ckpt_manifest *m = NULL;
    int rc = edl_ckpt_load_latest(ck, &m);
    bool loaded = rc == 0;
    *bytes = 0;
    size_t per = r->size / (size_t)r->shards;
    edl_ckpt_read *rd = rc == 0 ? calloc(m->n_shards + 1, sizeof *rd) : NULL;
    for (size_t i = 0; rd && i < m->n_shards; i++) {
        rd[i] = (edl_ckpt_read){.index = i, .dst = r->bufs[i % (size_t)r->shards], .cap = per};
        *bytes += m->shards[i].size;
    }
    if (rc == 0)
        rc = rd ? edl_ckpt_read_shards_into(ck, m, rd, m->n_shards) : EDL_ENOMEM;
    free(rd);
    double t = now_s() - t0;
    if (rc != 0)
        fprintf(stderr, "checkpoint bench: load on %s: %s\n", label, edl_ckpt_errmsg(ck));
    if (loaded)
        edl_ckpt_manifest_free(m);
    return rc == 0 ? t : -1;
}

/* ---- throughput: ours alternating with the bound ----------------------------------------- */

/* The save, each repeat after its bound: one ratio line. */
static int save_series(edl_ckpt *ck, run *r, const char *label)
{
    series ours = {0}, bound = {0};
    for (int k = 0; k < r->repeat; k++) {
        double t = timed_shell(r->save_cmd);
        if (t > 0)
            add(&bound, mib_s(r->size, t));
        if ((t = save_once(ck, r, label)) < 0)
            return -1;
        add(&ours, mib_s(r->size, t));
    }
    char what[96];
    snprintf(what, sizeof what, "%s save / %s", label, r->save_what);
    ratio_line(what, &ours, &bound, "MiB/s", 0);
    return 0;
}

/* The shard files of the newest checkpoint in the file:// store's directory. */
static int shard_files(edl_ckpt *ck, const run *r, file_list *fl)
{
    edl_ckpt_manifest *m;
    if (edl_ckpt_load_latest(ck, &m) != 0) {
        fprintf(stderr, "checkpoint bench: load: %s\n", edl_ckpt_errmsg(ck));
        return -1;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s", r->files, m->dir);
    edl_ckpt_manifest_free(m);
    walk_tree(dir, add_shard_file, fl);
    if (fl->bytes != r->size)
        fprintf(stderr, "checkpoint bench: the shard files under %s hold %llu bytes, not %zu\n",
                dir, (unsigned long long)fl->bytes, r->size);
    return 0;
}

/* The load's bound once, from a cold page cache: seconds (-1 on failure) and bytes read. */
static double load_bound(const run *r, const file_list *fl, uint64_t *bytes)
{
    walk_tree(r->root, evict_file, NULL);
    if (!r->load_cmd)
        return seq_read(fl, bytes);
    *bytes = r->size;
    return timed_shell(r->load_cmd);
}

/* The load, each repeat after its bound, both from a cold page cache: one ratio line. */
static int load_series(edl_ckpt *ck, run *r, const char *label)
{
    file_list fl = {0};
    if (!r->load_cmd && shard_files(ck, r, &fl) != 0)
        return -1;
    series ours = {0}, bound = {0};
    int rc = 0;
    for (int k = 0; rc == 0 && k < r->repeat; k++) {
        uint64_t bytes;
        double t = load_bound(r, &fl, &bytes);
        if (t > 0)
            add(&bound, mib_s(bytes, t));
        walk_tree(r->root, evict_file, NULL);
        if ((t = load_once(ck, r, label, &bytes)) < 0)
            rc = -1;
        else
            add(&ours, mib_s(bytes, t));
    }
    file_list_free(&fl);
    char what[96];
    snprintf(what, sizeof what, "%s load / %s", label, r->load_what);
    if (rc == 0)
        ratio_line(what, &ours, &bound, "MiB/s", 0);
    return rc;
}

/* ---- the stall of asynchronous saves ----------------------------------------------------- */

/* One asynchronous save of the next step: the time the caller is blocked and the wall time. */
static int async_save(edl_ckpt *ck, run *r, bool hand_over, double *t_stall, double *t_total)
{
    edl_ckpt_shard sh[MAX_SHARDS];
    make_shards(r, sh, hand_over);
    edl_ckpt_pending *p;
    double t0 = now_s();
    int rc = edl_ckpt_save_async(ck, ++r->step, 1, sh, (size_t)r->shards, NULL, &p);
    *t_stall = now_s() - t0;
    if (rc != 0) {
        fprintf(stderr, "checkpoint bench: async save: %s\n", edl_ckpt_errmsg(ck));
        return rc;
    }
    rc = edl_ckpt_wait(p, -1);
    *t_total = now_s() - t0;
    if (rc != 0)
        fprintf(stderr, "checkpoint bench: async save: %s\n", edl_ckpt_save_errmsg(p));
    edl_ckpt_save_free(p);
    return rc;
}

/* The copy's GB/s beside memcpy on as many threads as the checkpoint's copy, and on one. */
static void copy_lines(const char *label, const series *copy, const series *mem_n,
                       const series *mem_1, int threads)
{
    char what[96];
    if (threads > 1) {
        snprintf(what, sizeof what, "%s copy / memcpy, %d threads", label, threads);
        ratio_line(what, copy, mem_n, "GB/s", 2);
    }
    snprintf(what, sizeof what, "%s copy / memcpy, 1 thread", label);
    ratio_line(what, copy, mem_1, "GB/s", 2);
}

/* The caller's copy: the first save (it allocates the staging), then saves that reuse it,
 * each after its bounds (memcpy on one thread and on copy_threads()). */
static int stall_reused(edl_ckpt *ck, run *r, const char *label)
{
    series blocked = {0}, total = {0}, copy = {0}, mem_1 = {0}, mem_n = {0};
    int threads = copy_threads();
    double b, t, gbs;
    int rc = async_save(ck, r, false, &b, &t);
    if (rc != 0)
        return rc;
    add(&blocked, b);
    add(&total, t);
    stall_line(label, "async save, first (allocates staging)", &blocked, &total, NULL);
    blocked.n = total.n = 0;
    for (int k = 0; rc == 0 && k < r->repeat; k++) {
        if ((gbs = memcpy_speed(r->bufs, r->shards, shard_len(r), 1)) > 0)
            add(&mem_1, gbs);
        if (threads > 1 && (gbs = memcpy_speed(r->bufs, r->shards, shard_len(r), threads)) > 0)
            add(&mem_n, gbs);
        if ((rc = async_save(ck, r, false, &b, &t)) == 0) {
            add(&blocked, b);
            add(&total, t);
            add(&copy, (double)r->size / b / 1e9);
        }
    }
    if (rc != 0)
        return rc;
    stall_line(label, "async save, staging reused", &blocked, &total, NULL);
    copy_lines(label, &copy, &mem_n, &mem_1, threads);
    return 0;
}

static volatile uint64_t forward_sum; /* keeps the forward pass's reads live */

/* Forward and backward: read every byte of the state. */
static void forward_backward(const run *r)
{
    uint64_t sum = 0;
    for (int i = 0; i < r->shards; i++) {
        const uint64_t *p = (const uint64_t *)r->bufs[i];
        for (size_t k = 0; k < shard_len(r) / 8; k++)
            sum += p[k];
    }
    forward_sum += sum;
}

/* The optimizer: write every word of the state. */
static void optimizer(run *r)
{
    for (int i = 0; i < r->shards; i++) {
        uint64_t *p = (uint64_t *)r->bufs[i];
        for (size_t k = 0; k < shard_len(r) / 8; k++)
            p[k] += 1;
    }
}

/* A training step without a save: seconds. */
static double train_step(run *r)
{
    double t0 = now_s();
    forward_backward(r);
    optimizer(r);
    return now_s() - t0;
}

/* A training step that saves the next step with the snapshot in the background: save_async,
 * forward and backward, snapshot_wait, optimizer; then wait for the save. Blocked is the time
 * inside save_async and snapshot_wait, total the save's wall time, step the step's. */
static int pipelined_save(edl_ckpt *ck, run *r, double *blocked, double *total, double *step)
{
    edl_ckpt_shard sh[MAX_SHARDS];
    make_shards(r, sh, false);
    edl_ckpt_pending *p;
    double t0 = now_s();
    int rc = edl_ckpt_save_async(ck, ++r->step, 1, sh, (size_t)r->shards, NULL, &p);
    double t_async = now_s() - t0;
    if (rc != 0) {
        fprintf(stderr, "checkpoint bench: pipelined save: %s\n", edl_ckpt_errmsg(ck));
        return rc;
    }
    forward_backward(r);
    double t1 = now_s();
    int snap = edl_ckpt_snapshot_wait(p, -1);
    double t_snap = now_s() - t1;
    optimizer(r);
    *step = now_s() - t0;
    rc = edl_ckpt_wait(p, -1);
    *total = now_s() - t0;
    *blocked = t_async + t_snap;
    if (rc == 0 && snap != 0)
        rc = snap;
    if (rc != 0)
        fprintf(stderr, "checkpoint bench: pipelined save: %s\n", edl_ckpt_save_errmsg(p));
    edl_ckpt_save_free(p);
    return rc;
}

/* Pipelined saves on a handle of their own (snapshot_in_background), after a warm-up save
 * that allocates its staging; each after a step without a save, for reference. */
static int stall_pipelined(run *r, const char *label)
{
    edl_ckpt *ck = open_ck(r, true);
    series blocked = {0}, total = {0}, with = {0}, without = {0};
    double b, t, s;
    int rc = pipelined_save(ck, r, &b, &t, &s);
    for (int k = 0; rc == 0 && k < r->repeat; k++) {
        add(&without, train_step(r));
        if ((rc = pipelined_save(ck, r, &b, &t, &s)) == 0) {
            add(&blocked, b);
            add(&total, t);
            add(&with, s);
        }
    }
    edl_ckpt_close(ck);
    if (rc == 0) {
        char tail[96];
        snprintf(tail, sizeof tail, "; step %.3f s (%.3f s without)", median(&with),
                 median(&without));
        stall_line(label, "async save, pipelined", &blocked, &total, tail);
    }
    return rc;
}

/* One save with the buffers handed over (free_fn): no copy. */
static int stall_handed_over(run *r, const char *label)
{
    edl_ckpt *ck = open_ck(r, false);
    series blocked = {0}, total = {0};
    double b, t;
    int rc = async_save(ck, r, true, &b, &t);
    edl_ckpt_close(ck);
    if (rc == 0) {
        add(&blocked, b);
        add(&total, t);
        stall_line(label, "async save, handed over", &blocked, &total, NULL);
    }
    return rc;
}

/* The first save of a handle whose staging was reserved at start-up (edl_ckpt_stage_reserve):
 * it should block for the copy alone, as a save that reuses staging does. */
static int stall_after_reserve(run *r, const char *label)
{
    edl_ckpt *ck = open_ck(r, false);
    double t0 = now_s(), b, t;
    int rc = edl_ckpt_stage_reserve(ck, r->size + 64 * (size_t)r->shards);
    double reserve_s = now_s() - t0;
    if (rc != 0)
        fprintf(stderr, "checkpoint bench: reserve: %s\n", edl_ckpt_errmsg(ck));
    else
        rc = async_save(ck, r, false, &b, &t);
    edl_ckpt_close(ck);
    if (rc != 0)
        return rc;
    series blocked = {0}, total = {0};
    add(&blocked, b);
    add(&total, t);
    char tail[64];
    snprintf(tail, sizeof tail, " (the reserve took %.3f s)", reserve_s);
    stall_line(label, "async save, first after reserve", &blocked, &total, tail);
    return 0;
}

/* Every figure of one store. Each handle is closed before the next opens: one staging area
 * of --size at most is held at a time. */
static int bench_store(run *r, const char *label)
{
    edl_ckpt *ck = open_ck(r, false);
    int rc = save_series(ck, r, label);
    if (rc == 0)
        rc = load_series(ck, r, label);
    if (rc == 0)
        rc = stall_reused(ck, r, label);
    edl_ckpt_close(ck);
    if (rc == 0)
        rc = stall_after_reserve(r, label);
    if (rc == 0)
        rc = stall_pipelined(r, label);
    if (rc == 0)
        rc = stall_handed_over(r, label);
    return rc;
}

/* ---- the stores -------------------------------------------------------------------------- */

static void bench_file(run *r)
{
    char dd[1200], dir[600], uri[700];
    snprintf(dd, sizeof dd, "dd if=/dev/zero of=%s/dd.bin bs=1M count=%zu iflag=count_bytes "
             "conv=fsync status=none", r->root, r->size);
    snprintf(dir, sizeof dir, "%s/ckpt", r->root);
    snprintf(uri, sizeof uri, "file://%s", dir);
    r->uri = uri;
    r->job = "bench-file";
    r->files = dir;
    r->save_cmd = dd;
    r->save_what = "dd conv=fsync";
    r->load_cmd = NULL;
    r->load_what = "sequential read";
    edl_storage_config_init(&r->sc);
    bench_store(r, "file://");
    r->files = NULL;
}

static int free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &alen) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* s3rver from tests/.s3rver (found from the working directory or the source tree). */
static pid_t start_s3rver(const char *datadir, int port)
{
    const char *cands[] = {"tests/.s3rver/node_modules/s3rver/bin/s3rver.js",
                           "../tests/.s3rver/node_modules/s3rver/bin/s3rver.js",
                           EDL_SOURCE_DIR "/tests/.s3rver/node_modules/s3rver/bin/s3rver.js"};
    const char *js = NULL;
    for (size_t i = 0; i < 3 && !js; i++)
        if (access(cands[i], R_OK) == 0)
            js = cands[i];
    if (!js)
        return -1;
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    char *argv[] = {"node", (char *)js, "-d", (char *)datadir, "-a", "127.0.0.1", "-p", p, "-s",
                    "--configure-bucket", "edl-bench", NULL};
    edl_spawn_opts so = {.argv = argv, .out = EDL_SPAWN_NULL};
    char err[512];
    pid_t pid;
    if (edl_spawn(&so, &pid, err, sizeof err) != 0) {
        fprintf(stderr, "checkpoint: %s\n", err);
        return -1;
    }
    char url[128];
    snprintf(url, sizeof url, "curl -s -o /dev/null -f 'http://127.0.0.1:%d/edl-bench?list-type=2'",
             port);
    for (int i = 0; i < 200; i++) {
        if (system(url) == 0)
            return pid;
        usleep(100000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

typedef struct opts {
    size_t size, part_size;
    int shards, repeat, parallel_parts;
    const char *dir, *s3_endpoint;
    bool no_s3;
} opts;

/* The bounds (curl PUT of dd's file as curl.bin, curl GET of it) and our store's options. */
static void bench_s3_at(run *r, const opts *o, const char *endpoint)
{
    const char *ak = o->s3_endpoint ? getenv("AWS_ACCESS_KEY_ID") : "S3RVER";
    const char *sk = o->s3_endpoint ? getenv("AWS_SECRET_ACCESS_KEY") : "S3RVER";
    const char *region = getenv("AWS_REGION") ? getenv("AWS_REGION") : "us-east-1";
    char curl[600], put[1600], get[1600], bin[600];
    snprintf(curl, sizeof curl, "curl -sS -f -o /dev/null --aws-sigv4 'aws:amz:%s:s3' "
             "--user '%s:%s' -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD'", region,
             ak ? ak : "", sk ? sk : "");
    snprintf(bin, sizeof bin, "%s/dd.bin", r->root);
    snprintf(put, sizeof put, "%s -T %s '%s/edl-bench/curl.bin'", curl, bin, endpoint);
    snprintf(get, sizeof get, "%s '%s/edl-bench/curl.bin'", curl, endpoint);
    r->save_cmd = put;
    r->save_what = "curl -T (one PUT)";
    r->load_cmd = get;
    r->load_what = "curl GET";
    edl_storage_config_init(&r->sc);
    r->sc.endpoint = endpoint;
    if (o->part_size)
        r->sc.part_size = o->part_size;
    if (o->parallel_parts)
        r->sc.parallel_parts = o->parallel_parts;
    if (!o->s3_endpoint)
        r->sc.access_key_id = r->sc.secret_access_key = "S3RVER";
    r->uri = "s3://edl-bench/ckpt";
    r->job = "bench-s3";
    file_list dd = {.paths = (char *[]){bin}, .n = 1}; /* curl -T reads it from the page cache */
    uint64_t ignored;
    seq_read(&dd, &ignored);
    bench_store(r, "s3://");
}

static void bench_s3(run *r, const opts *o)
{
    char endpoint[256], s3dir[600];
    pid_t pid = -1;
    if (o->no_s3) {
        printf("s3:// skipped (--no-s3)\n");
        return;
    }
    if (o->s3_endpoint) {
        snprintf(endpoint, sizeof endpoint, "%s", o->s3_endpoint);
    } else {
        snprintf(s3dir, sizeof s3dir, "%s/s3rver", r->root);
        mkdir(s3dir, 0700);
        int port = free_port();
        if ((pid = start_s3rver(s3dir, port)) < 0) {
            printf("s3:// skipped: no --s3-endpoint and no s3rver in tests/.s3rver\n");
            return;
        }
        snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d", port);
    }
    bench_s3_at(r, o, endpoint);
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
}

/* ---- options ----------------------------------------------------------------------------- */

static void usage(FILE *f, const char *argv0)
{
    fprintf(f, "usage: %s [--size BYTES[K|M|G] (1G)] [--shards N (8)] [--repeat N (3)]\n"
            "       [--dir PATH ($TMPDIR)] [--s3-endpoint URL | --no-s3]\n"
            "       [--part-size BYTES[K|M|G]] [--parallel-parts N] [--copy-threads N]\n", argv0);
}

/* BYTES with an optional binary suffix K, M or G ("8G"). */
static bool parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    int shift = 0;
    if (end == s || errno != 0 || s[0] == '-')
        return false;
    if (*end == 'K' || *end == 'k')
        shift = 10;
    else if (*end == 'M' || *end == 'm')
        shift = 20;
    else if (*end == 'G' || *end == 'g')
        shift = 30;
    end += shift != 0;
    if (*end != '\0' || v > (SIZE_MAX >> shift))
        return false;
    *out = (size_t)v << shift;
    return true;
}

static bool parse_int(const char *s, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0 || v < INT_MIN || v > INT_MAX)
        return false;
    *out = (int)v;
    return true;
}

/* One option with its value v (NULL when none follows): false when unknown or malformed. */
static bool parse_opt(const char *a, const char *v, opts *o)
{
    if (!v)
        return false;
    if (strcmp(a, "--size") == 0)
        return parse_size(v, &o->size);
    if (strcmp(a, "--part-size") == 0)
        return parse_size(v, &o->part_size);
    if (strcmp(a, "--shards") == 0)
        return parse_int(v, &o->shards);
    if (strcmp(a, "--repeat") == 0)
        return parse_int(v, &o->repeat);
    if (strcmp(a, "--parallel-parts") == 0)
        return parse_int(v, &o->parallel_parts);
    if (strcmp(a, "--copy-threads") == 0)
        return parse_int(v, &copy_threads_opt) && copy_threads_opt >= 1 &&
               copy_threads_opt <= COPY_THREADS_MAX;
    if (strcmp(a, "--dir") == 0)
        o->dir = v;
    else if (strcmp(a, "--s3-endpoint") == 0)
        o->s3_endpoint = v;
    else
        return false;
    return true;
}

/* -1: go on; else the exit status (0 after --help, 2 for a bad option). */
static int parse_args(int argc, char **argv, opts *o)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout, argv[0]);
            return 0;
        }
        if (strcmp(argv[i], "--no-s3") == 0) {
            o->no_s3 = true;
        } else if (!parse_opt(argv[i], i + 1 < argc ? argv[i + 1] : NULL, o)) {
            usage(stderr, argv[0]);
            return 2;
        } else {
            i++;
        }
    }
    if (o->shards < 1 || o->shards > MAX_SHARDS || o->size < (size_t)o->shards * 8 ||
        o->repeat < 1 || o->repeat > MAX_REPEAT) {
        fprintf(stderr, "checkpoint bench: --shards 1..%d, --size of at least 8 bytes each, "
                "--repeat 1..%d\n", MAX_SHARDS, MAX_REPEAT);
        return 2;
    }
    return -1;
}

int main(int argc, char **argv)
{
    opts o = {.size = 1ull << 30, .shards = 8, .repeat = 3};
    int status = parse_args(argc, argv, &o);
    if (status >= 0)
        return status;
    size_t size = o.size / ((size_t)o.shards * 8) * ((size_t)o.shards * 8);
    edl_log_setup(EDL_LOG_WARN, EDL_LOG_PLAIN, NULL);
    setvbuf(stdout, NULL, _IOLBF, 0); /* children (dd, curl, s3rver) must not repeat our lines */
    const char *tmp = getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp";
    char root[512];
    snprintf(root, sizeof root, "%s/edl-bench-ckpt-XXXXXX", o.dir ? o.dir : tmp);
    if (!mkdtemp(root)) {
        fprintf(stderr, "checkpoint bench: mkdtemp %s: %s\n", root, strerror(errno));
        return 1;
    }
    edl_etcd_server_opts eo = {.quiet = true};
    edl_etcd_server *srv;
    edl_etcd *etcd;
    if (edl_etcd_server_open(&eo, &srv) != 0 ||
        edl_etcd_open_endpoints(edl_etcd_server_endpoints(srv), &etcd) != 0) {
        fprintf(stderr, "checkpoint bench: cannot start etcd (install etcd-server)\n");
        return 1;
    }
    run r = {.etcd = etcd, .size = size, .shards = o.shards, .repeat = o.repeat, .root = root};
    r.bufs = calloc((size_t)o.shards, sizeof *r.bufs);
    for (int i = 0; r.bufs && i < o.shards; i++)
        if (!(r.bufs[i] = malloc(shard_len(&r)))) {
            fprintf(stderr, "checkpoint bench: cannot allocate %zu bytes\n", size);
            return 1;
        }
    fill_state(&r);
    printf("checkpoint bench: %.0f MiB in %d shards, %d copy threads; figures: median of %d, "
           "± (max - min) in %% of it\n", size / 1048576.0, o.shards, copy_threads(), o.repeat);
    bench_file(&r);
    bench_s3(&r, &o);
    for (int i = 0; i < o.shards; i++)
        free(r.bufs[i]);
    free(r.bufs);
    edl_etcd_close(etcd);
    edl_etcd_server_close(srv);
    nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

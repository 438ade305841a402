/* bench/checkpoint.c: checkpoint save and load throughput next to the store's own speed.
 *
 *   checkpoint [--size BYTES] [--shards N] [--dir PATH] [--s3-endpoint URL | --no-s3]
 *
 * Saves and loads --size bytes (default 1 GiB) in --shards shards (8) through edl/checkpoint.h,
 * with its own loopback etcd. file:// (under --dir, default $TMPDIR) is printed next to
 * `dd ... conv=fsync` of the same size to the same directory; s3:// next to a plain `curl -T`
 * of the same bytes to the same server. The S3 server is --s3-endpoint (bucket edl-bench must
 * exist; AWS_* credentials), or else an s3rver started from tests/.s3rver (scripts/install-deps).
 * Last, the training stall of asynchronous saves: how long save_async blocks the caller against
 * the save's total time, for the first save (which allocates the handle's staging memory), the
 * next one (which reuses it: the stall is the copy, printed in GB/s beside a plain memcpy of
 * the same bytes into pre-faulted memory) and one with the buffers handed over. One line per
 * figure. */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
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

static void line(const char *what, size_t bytes, double secs)
{
    printf("%-44s %8.1f MiB/s  (%.0f MiB in %.2f s)\n", what, bytes / 1048576.0 / secs,
           bytes / 1048576.0, secs);
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

typedef struct run {
    edl_etcd *etcd;
    const char *uri;
    const char *job;
    edl_storage_config sc;
    size_t size;
    int shards;
    char **bufs;
} run;

static edl_ckpt *open_ck(run *r, bool verify)
{
    edl_ckpt_config cfg;
    edl_ckpt_config_init(&cfg);
    cfg.uri = r->uri;
    cfg.etcd = r->etcd;
    cfg.job = r->job;
    cfg.keep = 1;
    cfg.verify_on_load = verify;
    cfg.storage = &r->sc;
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

static void fill_shards(run *r, edl_ckpt_shard *sh, int64_t step)
{
    size_t per = r->size / (size_t)r->shards;
    for (int i = 0; i < r->shards; i++) {
        uint64_t *p = (uint64_t *)r->bufs[i];
        for (size_t k = 0; k < per / 8; k++)
            p[k] = (uint64_t)step * 0x9E3779B97F4A7C15ull ^ (k * 0xBF58476D1CE4E5B9ull + (uint64_t)i);
        sh[i] = (edl_ckpt_shard){.name = "shard", .data = r->bufs[i], .len = per};
    }
}

/* One asynchronous save of step: the time the caller is blocked and the save's wall time. */
static int async_save(edl_ckpt *ck, run *r, edl_ckpt_shard *sh, int64_t step, bool hand_over,
                      double *t_stall, double *t_total)
{
    fill_shards(r, sh, step);
    for (int i = 0; hand_over && i < r->shards; i++)
        sh[i].free_fn = keep_buffer;
    edl_ckpt_pending *p;
    double t0 = now_s();
    int rc = edl_ckpt_save_async(ck, step, 1, sh, (size_t)r->shards, NULL, &p);
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

/* "blocked of total (%)", and the copy's speed when gbs > 0. */
static void stall_line(const char *label, const char *what, double t_stall, double t_total,
                       double gbs)
{
    char w[96];
    snprintf(w, sizeof w, "%s %s", label, what);
    printf("%-44s %8.3f s blocked of %.3f s total (%.1f%%)", w, t_stall, t_total,
           100.0 * t_stall / t_total);
    if (gbs > 0)
        printf(", copy %.2f GB/s", gbs);
    printf("\n");
}

/* A plain memcpy of the shards into pre-faulted memory (one shard's worth, reused), with
 * transparent huge pages asked for or not: the bound of the staging copy (which asks for
 * them), measured in the same run. GB/s. */
static double memcpy_speed(const run *r, bool huge)
{
    size_t per = r->size / (size_t)r->shards;
    char *dst = mmap(NULL, per, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (dst == MAP_FAILED)
        return 0;
    if (huge)
        madvise(dst, per, MADV_HUGEPAGE);
    memset(dst, 1, per);
    double t0 = now_s();
    for (int i = 0; i < r->shards; i++) {
        memcpy(dst, r->bufs[i], per);
        __asm__ volatile("" : : "r"(dst) : "memory"); /* the copy is not optimised away */
    }
    double t = now_s() - t0;
    munmap(dst, per);
    return (double)r->size / t / 1e9;
}

/* Save (sync, no copy), load + read every shard, then asynchronous saves for the stall. */
static int bench_store(run *r, const char *label)
{
    edl_ckpt_shard sh[256];
    char what[96];
    fill_shards(r, sh, 1);
    edl_ckpt *ck = open_ck(r, false);
    double t0 = now_s();
    int rc = edl_ckpt_save(ck, 1, 1, sh, (size_t)r->shards, NULL); /* lends the buffers */
    double t_save = now_s() - t0;
    if (rc != 0) {
        fprintf(stderr, "checkpoint bench: save on %s: %s\n", label, edl_ckpt_errmsg(ck));
        edl_ckpt_close(ck);
        return rc;
    }
    snprintf(what, sizeof what, "%s checkpoint save (XXH3, commit)", label);
    line(what, r->size, t_save);

    t0 = now_s();
    edl_ckpt_manifest *m;
    rc = edl_ckpt_load_latest(ck, &m);
    size_t got = 0;
    for (size_t i = 0; rc == 0 && i < m->n_shards; i++) {
        void *data;
        size_t len;
        rc = edl_ckpt_read_shard(ck, m, i, &data, &len);
        got += len;
        free(data);
    }
    double t_load = now_s() - t0;
    if (rc != 0) {
        fprintf(stderr, "checkpoint bench: load on %s: %s\n", label, edl_ckpt_errmsg(ck));
        edl_ckpt_close(ck);
        return rc;
    }
    edl_ckpt_manifest_free(m);
    snprintf(what, sizeof what, "%s checkpoint load (read, XXH3 verify)", label);
    line(what, got, t_load);

    /* asynchronous saves: the first allocates the handle's staging, the second reuses it */
    double t_stall, t_total;
    rc = async_save(ck, r, sh, 2, false, &t_stall, &t_total);
    if (rc == 0)
        stall_line(label, "async save, first (allocates staging)", t_stall, t_total, 0);
    double memcpy_small = rc == 0 ? memcpy_speed(r, false) : 0;
    double memcpy_huge = rc == 0 ? memcpy_speed(r, true) : 0;
    if (rc == 0 && (rc = async_save(ck, r, sh, 3, false, &t_stall, &t_total)) == 0) {
        stall_line(label, "async save, staging reused", t_stall, t_total, r->size / t_stall / 1e9);
        snprintf(what, sizeof what, "%s  (memcpy into pre-faulted memory)", label);
        printf("%-44s %8.2f GB/s (4 KiB pages), %.2f GB/s (huge pages)\n", what, memcpy_small,
               memcpy_huge);
    }

    /* the same with the buffers handed over (free_fn): no copy at all */
    if (rc == 0 && (rc = async_save(ck, r, sh, 4, true, &t_stall, &t_total)) == 0)
        stall_line(label, "async save, handed over", t_stall, t_total, 0);
    edl_ckpt_close(ck);
    return rc;
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
    snprintf(url, sizeof url, "curl -s -o /dev/null -f 'http://127.0.0.1:%d/edl-bench?list-type=2'", port);
    for (int i = 0; i < 200; i++) {
        if (system(url) == 0)
            return pid;
        usleep(100000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

int main(int argc, char **argv)
{
    size_t size = 1ull << 30;
    int shards = 8;
    const char *dir = NULL, *s3_endpoint = NULL;
    bool no_s3 = false;
    size_t part_size = 0;
    int parallel_parts = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--size") == 0 && i + 1 < argc)
            size = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--shards") == 0 && i + 1 < argc)
            shards = atoi(argv[++i]);
        else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
            dir = argv[++i];
        else if (strcmp(argv[i], "--s3-endpoint") == 0 && i + 1 < argc)
            s3_endpoint = argv[++i];
        else if (strcmp(argv[i], "--part-size") == 0 && i + 1 < argc)
            part_size = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--parallel-parts") == 0 && i + 1 < argc)
            parallel_parts = atoi(argv[++i]);
        else if (strcmp(argv[i], "--no-s3") == 0)
            no_s3 = true;
        else {
            fprintf(stderr, "usage: %s [--size BYTES (1 GiB)] [--shards N (8)] [--dir PATH] "
                    "[--s3-endpoint URL | --no-s3]\n", argv[0]);
            return 2;
        }
    }
    if (shards < 1 || shards > 256 || size < (size_t)shards * 8) {
        fprintf(stderr, "checkpoint bench: --shards 1..256 and --size of at least 8 bytes each\n");
        return 2;
    }
    size = size / ((size_t)shards * 8) * ((size_t)shards * 8);
    edl_log_setup(EDL_LOG_WARN, EDL_LOG_PLAIN, NULL);
    setvbuf(stdout, NULL, _IOLBF, 0); /* children (dd, curl, s3rver) must not repeat our lines */
    const char *tmp = getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp";
    char root[512];
    snprintf(root, sizeof root, "%s/edl-bench-ckpt-XXXXXX", dir ? dir : tmp);
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
    run r = {.etcd = etcd, .size = size, .shards = shards};
    r.bufs = calloc((size_t)shards, sizeof *r.bufs);
    for (int i = 0; i < shards; i++)
        r.bufs[i] = malloc(size / (size_t)shards);
    printf("checkpoint bench: %.0f MiB in %d shards\n", size / 1048576.0, shards);

    /* file:// next to dd */
    char cmd[1200], uri[600], bin[600];
    snprintf(cmd, sizeof cmd, "dd if=/dev/zero of=%s/dd.bin bs=1M count=%zu conv=fsync "
             "status=none", root, size >> 20 ? size >> 20 : 1);
    double t_dd = timed_shell(cmd);
    snprintf(bin, sizeof bin, "%s/dd.bin", root);
    if (t_dd > 0)
        line("file:// dd conv=fsync (the disk's own speed)", (size >> 20 ? size >> 20 : 1) << 20,
             t_dd);
    snprintf(uri, sizeof uri, "file://%s/ckpt", root);
    r.uri = uri;
    r.job = "bench-file";
    edl_storage_config_init(&r.sc);
    bench_store(&r, "file://");

    /* s3:// next to curl -T */
    char s3dir[600], endpoint[256];
    pid_t s3pid = -1;
    if (no_s3) {
        printf("s3:// skipped (--no-s3)\n");
    } else if (s3_endpoint) {
        snprintf(endpoint, sizeof endpoint, "%s", s3_endpoint);
    } else {
        snprintf(s3dir, sizeof s3dir, "%s/s3rver", root);
        mkdir(s3dir, 0700);
        int port = free_port();
        s3pid = start_s3rver(s3dir, port);
        snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d", port);
    }
    if (!no_s3 && !s3_endpoint && s3pid < 0) {
        printf("s3:// skipped: no --s3-endpoint and no s3rver in tests/.s3rver\n");
    } else if (!no_s3) {
        const char *ak = s3_endpoint ? getenv("AWS_ACCESS_KEY_ID") : "S3RVER";
        const char *sk = s3_endpoint ? getenv("AWS_SECRET_ACCESS_KEY") : "S3RVER";
        const char *region = getenv("AWS_REGION") ? getenv("AWS_REGION") : "us-east-1";
        snprintf(cmd, sizeof cmd, "curl -sS -f -o /dev/null --aws-sigv4 'aws:amz:%s:s3' "
                 "--user '%s:%s' -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' -T %s "
                 "'%s/edl-bench/curl.bin'", region, ak ? ak : "", sk ? sk : "", bin, endpoint);
        double t_curl = timed_shell(cmd);
        if (t_curl > 0)
            line("s3:// curl -T (one PUT, same server)", (size >> 20 ? size >> 20 : 1) << 20,
                 t_curl);
        edl_storage_config_init(&r.sc);
        r.sc.endpoint = endpoint;
        if (part_size)
            r.sc.part_size = part_size;
        if (parallel_parts)
            r.sc.parallel_parts = parallel_parts;
        if (!s3_endpoint)
            r.sc.access_key_id = r.sc.secret_access_key = "S3RVER";
        r.uri = "s3://edl-bench/ckpt";
        r.job = "bench-s3";
        bench_store(&r, "s3://");
    }
    if (s3pid > 0) {
        kill(s3pid, SIGKILL);
        waitpid(s3pid, NULL, 0);
    }
    for (int i = 0; i < shards; i++)
        free(r.bufs[i]);
    free(r.bufs);
    edl_etcd_close(etcd);
    edl_etcd_server_close(srv);
    nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

/* test_checkpoint_crash.c: SIGKILL a saving process at every stage of a save and check that
 * the job always keeps a complete checkpoint and that its step never goes backwards.
 *
 * A child process plays a trainer: it loads the latest checkpoint (checking its bytes), then
 * saves step after step. On file:// the parent watches the checkpoint directory and kills the
 * child as soon as it sees a stage begin: before any shard, while a shard is being written
 * (a temporary file exists), after a shard is in place, after the rank's done.json (before the
 * manifest), after the manifest (before the pointer), and at a random later moment. On s3://
 * the kills come at random moments. After each kill a fresh reader must load a complete,
 * intact checkpoint whose step is at least the previous one. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "edl/checkpoint.h"
#include "edl/log.h"
#include "edl/proc.h"
#include "harness.h"

#define N_SHARDS 3

typedef struct fixture {
    edl_etcd_server *srv;
    edl_etcd *cl;
    harness_s3 *s3;
    char dir[256];
} fixture;

static fixture *fx;

static int setup(void **state)
{
    (void)state;
    edl_log_setup(EDL_LOG_ERROR, EDL_LOG_PLAIN, NULL);
    fx = calloc(1, sizeof *fx);
    harness_open_etcd(1, NULL, &fx->srv, &fx->cl);
    snprintf(fx->dir, sizeof fx->dir, "/tmp/edl-crash-XXXXXX");
    assert_non_null(mkdtemp(fx->dir));
    if (harness_s3_available())
        fx->s3 = harness_s3_open();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    harness_s3_close(fx->s3);
    harness_close_etcd(&fx->srv, &fx->cl);
    harness_rmtree(fx->dir);
    free(fx);
    return 0;
}

static void fill(char *p, size_t n, int64_t step, int shard)
{
    for (size_t i = 0; i < n; i += 8)
        memcpy(p + i, (int64_t[]){step * 1000003 + shard * 7 + (int64_t)i}, n - i < 8 ? n - i : 8);
}

static edl_ckpt *open_ck(edl_etcd *cl, const char *uri, const edl_storage_config *sc)
{
    edl_ckpt_config cfg;
    edl_ckpt_config_init(&cfg);
    cfg.uri = uri;
    cfg.etcd = cl;
    cfg.job = strncmp(uri, "s3:", 3) == 0 ? "crash-s3" : "crash-file";
    cfg.keep = 2;
    cfg.storage = sc;
    edl_ckpt *ck = NULL;
    char err[512];
    if (edl_ckpt_open(&cfg, &ck, err, sizeof err) != 0)
        fprintf(stderr, "open %s: %s\n", uri, err);
    return ck;
}

/* 0 when the checkpoint's every shard holds what its step's saver wrote. */
static int check_content(edl_ckpt *ck, const edl_ckpt_manifest *m, size_t shard_size)
{
    if (m->n_shards != N_SHARDS)
        return -1;
    char *want = malloc(shard_size);
    int bad = 0;
    for (size_t i = 0; i < m->n_shards && !bad; i++) {
        void *data;
        size_t len;
        if (edl_ckpt_read_shard(ck, m, i, &data, &len) != 0)
            return -1;
        fill(want, shard_size, m->step, (int)i);
        bad = len != shard_size || memcmp(data, want, len) != 0;
        free(data);
    }
    free(want);
    return bad ? -1 : 0;
}

/* The trainer: resume from the latest checkpoint, then save for ever (until killed). */
__attribute__((noreturn))
static void child(const char *uri, const edl_storage_config *sc, size_t shard_size, pid_t parent)
{
    if (!edl_die_with_parent(parent))
        _exit(2);
    edl_etcd *cl = harness_client(edl_etcd_server_endpoints(fx->srv), 0);
    edl_ckpt *ck = open_ck(cl, uri, sc);
    if (!ck)
        _exit(2);
    edl_ckpt_manifest *m;
    int64_t step = 0, gen = 0;
    int rc = edl_ckpt_load_latest(ck, &m);
    if (rc == 0) {
        if (check_content(ck, m, shard_size) != 0)
            _exit(3);
        step = m->step;
        gen = m->generation;
        edl_ckpt_manifest_free(m);
    } else if (rc != EDL_ENOTFOUND) {
        _exit(4);
    }
    gen++; /* a restarted trainer belongs to a new generation */
    char *bufs[N_SHARDS];
    for (int i = 0; i < N_SHARDS; i++)
        bufs[i] = malloc(shard_size);
    for (int k = 0; k < 200; k++) {
        step++;
        edl_ckpt_shard sh[N_SHARDS];
        for (int i = 0; i < N_SHARDS; i++) {
            fill(bufs[i], shard_size, step, i);
            sh[i] = (edl_ckpt_shard){.name = "s", .data = bufs[i], .len = shard_size};
        }
        if (edl_ckpt_save(ck, step, gen, sh, N_SHARDS, "{\"trainer\":\"crash-test\"}") != 0)
            _exit(5);
    }
    _exit(0);
}

/* Has the directory of (step, any generation) reached this stage? */
enum stage { AT_START, SHARD_WRITING, SHARD_DONE, RANK_DONE, MANIFEST, RANDOM, LATE, N_STAGES };
static const char *const stage_names[] = {"before any shard", "during a shard upload",
                                          "after a shard upload", "before the manifest",
                                          "after the manifest, before the pointer",
                                          "at a random moment",
                                          "after two commits"};

static bool reached(const char *root, int64_t step, enum stage st)
{
    char prefix[64], path[600];
    snprintf(prefix, sizeof prefix, "ckpt-%016lld-g", (long long)step);
    DIR *d = opendir(root);
    bool hit = false;
    for (struct dirent *e; d && !hit && (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            continue;
        if (st == SHARD_WRITING) {
            snprintf(path, sizeof path, "%s/%s/rank-0", root, e->d_name);
            DIR *r = opendir(path);
            for (struct dirent *f; r && !hit && (f = readdir(r));)
                hit = strncmp(f->d_name, ".edl-tmp-shard", 14) == 0;
            if (r)
                closedir(r);
            continue;
        }
        const char *file = st == SHARD_DONE ? "rank-0/shard-0" : st == RANK_DONE ? "rank-0/done.json"
                                                                                 : "manifest.json";
        snprintf(path, sizeof path, "%s/%s/%s", root, e->d_name, file);
        hit = access(path, F_OK) == 0;
    }
    if (d)
        closedir(d);
    return hit;
}

/* Whether a fresh reader's latest checkpoint is past step `past`: the trainer committed since. */
static bool committed_past(const char *uri, const edl_storage_config *sc, int64_t past)
{
    edl_ckpt *ck = open_ck(fx->cl, uri, sc);
    edl_ckpt_manifest *m;
    bool is_past = false;
    if (ck && edl_ckpt_load_latest(ck, &m) == 0) {
        is_past = m->step > past;
        edl_ckpt_manifest_free(m);
    }
    edl_ckpt_close(ck);
    return is_past;
}

/* One kill; returns the step the reader then loads (0 when nothing is committed yet). */
static int64_t kill_and_check(const char *uri, const edl_storage_config *sc, const char *root,
                              size_t shard_size, enum stage st, int64_t last)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0)
        child(uri, sc, shard_size, parent);
    assert_true(pid > 0);
    int64_t deadline = harness_now_ms() + 20000;
    if (st == LATE) {
        /* the other stages all kill before a commit: let two happen */
        if (!HARNESS_WAIT_UNTIL(committed_past(uri, sc, last + 1), 20000))
            fail_msg("no commit past step %lld within 20 s", (long long)last + 1);
    } else if (st == RANDOM || !root) {
        harness_sleep_ms(rand() % 600);
    } else if (st != AT_START) {
        while (!reached(root, last + 1, st) && harness_now_ms() < deadline) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL))
        fail_msg("the trainer ended by itself (status %d: 3 = bad content, 4 = load failed, "
                 "5 = save failed) instead of being killed %s", WEXITSTATUS(status),
                 stage_names[st]);
    edl_ckpt *ck = open_ck(fx->cl, uri, sc);
    assert_non_null(ck);
    edl_ckpt_manifest *m;
    int rc = edl_ckpt_load_latest(ck, &m);
    int64_t step = 0;
    if (rc == 0) {
        step = m->step;
        if (check_content(ck, m, shard_size) != 0)
            fail_msg("checkpoint step %lld does not hold what was saved", (long long)step);
        assert_int_equal(m->skipped, 0); /* a crash never leaves a committed checkpoint broken */
        edl_ckpt_manifest_free(m);
    } else if (rc != EDL_ENOTFOUND || last > 0) {
        fail_msg("after a kill %s: load_latest: %s: %s", stage_names[st], edl_strerror(rc),
                 edl_ckpt_errmsg(ck));
    }
    edl_ckpt_close(ck);
    if (step < last)
        fail_msg("the step went back from %lld to %lld", (long long)last, (long long)step);
    print_message("killed %-40s -> latest step %lld\n", stage_names[st], (long long)step);
    return step;
}

static void test_file_sigkill_at_every_stage_keeps_a_complete_checkpoint(void **state)
{
    (void)state;
    char root[300], uri[320];
    snprintf(root, sizeof root, "%s/file", fx->dir);
    snprintf(uri, sizeof uri, "file://%s", root);
    edl_storage_config sc;
    edl_storage_config_init(&sc);
    srand((unsigned)getpid());
    int64_t last = 0;
    for (int round = 0; round < 2; round++)
        for (int st = 0; st < N_STAGES; st++)
            last = kill_and_check(uri, &sc, root, 4u << 20, (enum stage)st, last);
    assert_true(last > 0);
}

static void test_s3_sigkill_at_random_moments_keeps_a_complete_checkpoint(void **state)
{
    (void)state;
    if (!harness_s3_available()) {
        print_message("SKIP: s3rver is not installed (run scripts/install-deps)\n");
        skip();
    }
    assert_non_null(fx->s3);
    char uri[300];
    harness_s3_uri(fx->s3, "crash", uri, sizeof uri);
    edl_storage_config sc;
    harness_s3_config(fx->s3, &sc, uri);
    sc.part_size = 5u << 20;
    int64_t last = 0;
    /* first some commits, so that every later kill has something to fall back to */
    last = kill_and_check(uri, &sc, NULL, 2u << 20, LATE, last);
    assert_true(last > 0);
    for (int i = 0; i < 8; i++)
        last = kill_and_check(uri, &sc, NULL, 2u << 20, RANDOM, last);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_sigkill_at_every_stage_keeps_a_complete_checkpoint),
        cmocka_unit_test(test_s3_sigkill_at_random_moments_keeps_a_complete_checkpoint),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

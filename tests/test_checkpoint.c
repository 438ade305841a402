/* test_checkpoint.c: checkpoints (edl/checkpoint.h) against a real etcd and both stores:
 * multi-rank round trips read back in another world size, keep-K deletion, steps that never go
 * back, corrupt shards and truncated manifests detected and skipped, hostile manifests refused,
 * the pointer race between writers, the pointer rebuilt from the store when etcd lost it, a
 * missing rank, staging memory reused by asynchronous saves,
 * snapshots copied in the background and on several threads, device shards refused clearly
 * where no CUDA answers (test_checkpoint_cuda stages real ones where a GPU is),
 * checkpoints written before XXH3 (SHA-256) that still load, and clear errors for an
 * unreachable store and wrong credentials. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "edl/checkpoint.h"
#include "edl/log.h"
#include "harness.h"

typedef struct fixture {
    edl_etcd_server *srv;
    edl_etcd *cl;
    harness_s3 *s3;
    char dir[256];
    int seq;
} fixture;

static fixture *fx;

static int setup(void **state)
{
    (void)state;
    edl_log_setup(EDL_LOG_ERROR, EDL_LOG_PLAIN, NULL); /* fallback warnings are expected here */
    fx = calloc(1, sizeof *fx);
    harness_open_etcd(1, NULL, &fx->srv, &fx->cl);
    snprintf(fx->dir, sizeof fx->dir, "/tmp/edl-ckpt-XXXXXX");
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

typedef struct place {
    char uri[300];
    char job[64];
    edl_storage_config sc;
    bool s3;
} place;

static void file_place(place *pl, const char *name)
{
    snprintf(pl->uri, sizeof pl->uri, "file://%s/%s-%d", fx->dir, name, ++fx->seq);
    snprintf(pl->job, sizeof pl->job, "%s-%d", name, fx->seq);
    edl_storage_config_init(&pl->sc);
    pl->s3 = false;
}

static void s3_place(place *pl, const char *name)
{
    if (!harness_s3_available()) {
        print_message("SKIP: s3rver is not installed (run scripts/install-deps)\n");
        skip();
    }
    if (!fx->s3)
        fail_msg("s3rver is installed but did not start (see stderr)");
    harness_s3_uri(fx->s3, name, pl->uri, sizeof pl->uri);
    harness_s3_config(fx->s3, &pl->sc, pl->uri);
    pl->sc.part_size = 5u << 20;
    snprintf(pl->job, sizeof pl->job, "%s-%d", name, ++fx->seq);
    pl->s3 = true;
}

/* The defaults, at pl, with this test's etcd and a 20 s commit timeout. */
static void config_at(const place *pl, edl_ckpt_config *cfg)
{
    edl_ckpt_config_init(cfg);
    cfg->uri = pl->uri;
    cfg->etcd = fx->cl;
    cfg->job = pl->job;
    cfg->commit_timeout_ms = 20000;
    cfg->storage = &pl->sc;
}

static edl_ckpt *open_cfg(const edl_ckpt_config *cfg)
{
    edl_ckpt *ck;
    char err[512];
    int rc = edl_ckpt_open(cfg, &ck, err, sizeof err);
    if (rc != 0)
        fail_msg("edl_ckpt_open(%s): %s: %s", cfg->uri, edl_strerror(rc), err);
    return ck;
}

static edl_ckpt *open_ck(const place *pl, int rank, int world, int keep)
{
    edl_ckpt_config cfg;
    config_at(pl, &cfg);
    cfg.rank = rank;
    cfg.world_size = world;
    cfg.keep = keep;
    return open_cfg(&cfg);
}

static char *pattern(size_t n, unsigned seed)
{
    char *p = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        p[i] = (char)((i * 2654435761u + seed * 40503u) >> 11);
    return p;
}

static edl_ckpt_manifest *load_ok(edl_ckpt *ck)
{
    edl_ckpt_manifest *m;
    int rc = edl_ckpt_load_latest(ck, &m);
    if (rc != 0)
        fail_msg("load_latest: %s: %s", edl_strerror(rc), edl_ckpt_errmsg(ck));
    return m;
}

/* Save step on `world` ranks at once (each its own handle, as separate pods would be): rank r
 * saves r+1 shards of size base*(r+1)+i, filled from seed step*100+r*10+i. */
static int save_all(const place *pl, int world, int64_t step, size_t base, int keep)
{
    edl_ckpt *ck[8];
    edl_ckpt_pending *p[8];
    char meta[64];
    snprintf(meta, sizeof meta, "{\"lr\":0.5,\"step\":%lld}", (long long)step);
    for (int r = world - 1; r >= 0; r--) { /* the committer starts last: it must wait */
        ck[r] = open_ck(pl, r, world, keep);
        edl_ckpt_shard sh[8];
        char *bufs[8], names[8][16];
        for (int i = 0; i <= r; i++) {
            bufs[i] = pattern(base * (size_t)(r + 1) + (size_t)i, (unsigned)(step * 100 + r * 10 + i));
            snprintf(names[i], sizeof names[i], "part%d", i);
            sh[i] = (edl_ckpt_shard){.name = names[i], .data = bufs[i],
                                     .len = base * (size_t)(r + 1) + (size_t)i};
        }
        int rc = edl_ckpt_save_async(ck[r], step, 7, sh, (size_t)r + 1, meta, &p[r]);
        for (int i = 0; i <= r; i++) {
            memset(bufs[i], 0, sh[i].len); /* the save owns a copy: the caller may reuse this */
            free(bufs[i]);
        }
        if (rc != 0)
            fail_msg("save_async: %s: %s", edl_strerror(rc), edl_ckpt_errmsg(ck[r]));
    }
    int rc0 = 0;
    for (int r = 0; r < world; r++) {
        int rc = edl_ckpt_wait(p[r], 60000);
        if (rc != 0 && r == 0)
            print_message("rank %d: %s: %s\n", r, edl_strerror(rc), edl_ckpt_save_errmsg(p[r]));
        if (r == 0)
            rc0 = rc;
        else if (rc != 0)
            fail_msg("rank %d save: %s: %s", r, edl_strerror(rc), edl_ckpt_save_errmsg(p[r]));
        edl_ckpt_save_free(p[r]);
        edl_ckpt_close(ck[r]);
    }
    return rc0;
}

static void check_loaded(edl_ckpt *ck, const edl_ckpt_manifest *m, int world, int64_t step,
                         size_t base)
{
    assert_int_equal(m->step, step);
    assert_int_equal(m->generation, 7);
    assert_int_equal(m->world_size, world);
    assert_non_null(strstr(m->metadata_json, "\"lr\""));
    assert_int_equal(m->n_shards, (size_t)(world * (world + 1) / 2));
    for (int r = 0; r < world; r++)
        for (int i = 0; i <= r; i++) {
            long k = edl_ckpt_find_shard(m, r, i);
            assert_true(k >= 0);
            char name[16];
            snprintf(name, sizeof name, "part%d", i);
            assert_string_equal(m->shards[k].name, name);
            void *data;
            size_t len, want = base * (size_t)(r + 1) + (size_t)i;
            int rc = edl_ckpt_read_shard(ck, m, (size_t)k, &data, &len);
            if (rc != 0)
                fail_msg("read_shard %d/%d: %s: %s", r, i, edl_strerror(rc), edl_ckpt_errmsg(ck));
            assert_int_equal(len, want);
            char *exp = pattern(want, (unsigned)(step * 100 + r * 10 + i));
            assert_memory_equal(data, exp, want);
            free(exp);
            free(data);
        }
    assert_int_equal(edl_ckpt_find_shard(m, world, 0), -1);
}

static void round_trip(place *pl, size_t base)
{
    assert_int_equal(save_all(pl, 3, 100, base, 3), 0);
    /* a reader in another world size (here 5, rank 4) reads every shard */
    edl_ckpt *reader = open_ck(pl, 4, 5, 3);
    edl_ckpt_manifest *m = load_ok(reader);
    check_loaded(reader, m, 3, 100, base);
    assert_int_equal(m->skipped, 0);
    edl_ckpt_manifest_free(m);
    edl_ckpt_close(reader);
}

static void test_file_round_trip_in_another_world_size(void **state)
{
    (void)state;
    place pl;
    file_place(&pl, "rt");
    round_trip(&pl, 100000);
}

static void test_s3_round_trip_in_another_world_size(void **state)
{
    (void)state;
    place pl;
    s3_place(&pl, "rt");
    round_trip(&pl, 3u << 20); /* rank 2's shards are ~9 MiB: multipart */
}

static void test_no_checkpoint_yet_is_not_found(void **state)
{
    (void)state;
    place pl;
    file_place(&pl, "none");
    edl_ckpt *ck = open_ck(&pl, 0, 1, 3);
    edl_ckpt_manifest *m;
    assert_int_equal(edl_ckpt_load_latest(ck, &m), EDL_ENOTFOUND);
    assert_non_null(strstr(edl_ckpt_errmsg(ck), "no committed checkpoint"));
    edl_ckpt_close(ck);
}

static size_t count_dirs(const place *pl)
{
    edl_storage *s;
    assert_int_equal(edl_storage_open(&(edl_storage_config){.uri = pl->uri}, &s, NULL, 0), 0);
    char **keys;
    size_t n, dirs = 0;
    assert_int_equal(edl_storage_list(s, "", &keys, &n), 0);
    for (size_t i = 0; i < n; i++)
        if (strstr(keys[i], "/manifest.json"))
            dirs++;
    edl_storage_list_free(keys, n);
    edl_storage_close(s);
    return dirs;
}

static void test_keep_deletes_older_checkpoints_after_the_pointer_moves(void **state)
{
    (void)state;
    place pl;
    file_place(&pl, "keep");
    for (int step = 1; step <= 4; step++)
        assert_int_equal(save_all(&pl, 2, step, 1000, 2), 0);
    assert_int_equal(count_dirs(&pl), 2);
    char key[256], val[1024];
    harness_job_key(key, sizeof key, pl.job, EDL_KEY_CHECKPOINT, NULL, 0);
    assert_non_null(harness_get(fx->cl, key, val, sizeof val));
    assert_non_null(strstr(val, "\"step\":4"));
    assert_non_null(strstr(val, "ckpt-0000000000000003-g7"));
    assert_null(strstr(val, "ckpt-0000000000000002-g7"));
}

static void test_step_never_goes_backwards(void **state)
{
    (void)state;
    place pl;
    file_place(&pl, "back");
    edl_ckpt *ck = open_ck(&pl, 0, 1, 3);
    edl_ckpt_shard sh = {.name = "m", .data = "abc", .len = 3};
    assert_int_equal(edl_ckpt_save(ck, 5, 1, &sh, 1, NULL), 0);
    assert_int_equal(edl_ckpt_save(ck, 3, 2, &sh, 1, NULL), EDL_ECONFLICT);
    assert_non_null(strstr(edl_ckpt_errmsg(ck), "never go back"));
    assert_int_equal(edl_ckpt_save(ck, 5, 2, &sh, 1, NULL), EDL_ECONFLICT); /* same step too */
    edl_ckpt_manifest *m = load_ok(ck);
    assert_int_equal(m->step, 5);
    assert_int_equal(m->generation, 1);
    edl_ckpt_manifest_free(m);
    assert_int_equal(edl_ckpt_save(ck, 6, 2, &sh, 1, "{}"), 0);
    m = load_ok(ck);
    assert_int_equal(m->step, 6);
    edl_ckpt_manifest_free(m);
    edl_ckpt_close(ck);
}

/* A caller that finds the newest checkpoint malformed (edl.checkpoint's structure shard) loads
 * the one before it; the newer ones leave the pointer, so saves after the older step commit. */
static void test_load_older_passes_over_newer_ones_and_saves_go_on(void **state)
{
    (void)state;
    place pl;
    file_place(&pl, "older");
    edl_ckpt *ck = open_ck(&pl, 0, 1, 3);
    edl_ckpt_shard sh = {.name = "m", .data = "abc", .len = 3};
    for (int64_t step = 1; step <= 3; step++)
        assert_int_equal(edl_ckpt_save(ck, step, 1, &sh, 1, NULL), 0);
    edl_ckpt_manifest *m;
    assert_int_equal(edl_ckpt_load_older(ck, 3, &m), 0);
    assert_int_equal(m->step, 2);
    assert_int_equal(m->skipped, 1);
    edl_ckpt_manifest_free(m);
    m = load_ok(ck);
    assert_int_equal(m->step, 2); /* step 3 left the pointer */
    edl_ckpt_manifest_free(m);
    assert_int_equal(edl_ckpt_load_older(ck, 1, &m), EDL_ENOTFOUND);
    assert_non_null(strstr(edl_ckpt_errmsg(ck), "older than step 1"));
    assert_int_equal(edl_ckpt_save(ck, 3, 2, &sh, 1, NULL), 0); /* step 3 again: not "going back" */
    m = load_ok(ck);
    assert_int_equal(m->step, 3);
    assert_int_equal(m->generation, 2);
    edl_ckpt_manifest_free(m);
    edl_ckpt_close(ck);
}

static void overwrite(const place *pl, const char *key, const void *data, size_t len)
{
    edl_storage *s;
    edl_storage_config c = pl->sc;
    c.uri = pl->uri;
    assert_int_equal(edl_storage_open(&c, &s, NULL, 0), 0);
    int rc = edl_storage_put(s, key, data, len);
    if (rc)
        fail_msg("overwrite %s: %s", key, edl_storage_errmsg(s));
    edl_storage_close(s);
}

/* Flip one shard of step 3 (same size) and truncate the manifest of step 2. */
static void corrupt_steps_3_and_2(place *pl)
{
    char *bad = pattern(10001, 999);
    overwrite(pl, "ckpt-0000000000000003-g7/rank-1/shard-1", bad, 10001);
    free(bad);
    overwrite(pl, "ckpt-0000000000000002-g7/manifest.json", "{\"format\":\"edl-checkpoint/1\",\"st",
              32);
}

static void corrupt_then_fall_back(place *pl)
{
    for (int step = 1; step <= 3; step++)
        assert_int_equal(save_all(pl, 2, step, 5000, 3), 0);
    corrupt_steps_3_and_2(pl);
    edl_ckpt *ck = open_ck(pl, 0, 2, 3);
    edl_ckpt_manifest *m = load_ok(ck);
    assert_int_equal(m->step, 1);
    assert_int_equal(m->skipped, 2);
    check_loaded(ck, m, 2, 1, 5000);
    edl_ckpt_manifest_free(m);
    /* training goes on from step 1, and its saves commit: the corrupt checkpoints left the
     * pointer with the fallback (else every save up to step 3 would be refused as going back,
     * and a crash now would lose everything since step 1) */
    assert_int_equal(save_all(pl, 2, 2, 5000, 3), 0);
    assert_int_equal(save_all(pl, 2, 3, 5000, 3), 0);
    m = load_ok(ck);
    assert_int_equal(m->step, 3);
    assert_int_equal(m->skipped, 0);
    check_loaded(ck, m, 2, 3, 5000);
    edl_ckpt_manifest_free(m);
    /* all three broken: nothing intact is left, and the message says why for each */
    corrupt_steps_3_and_2(pl);
    overwrite(pl, "ckpt-0000000000000001-g7/rank-0/shard-0", "x", 1);
    assert_int_equal(edl_ckpt_load_latest(ck, &m), EDL_EPROTO);
    const char *msg = edl_ckpt_errmsg(ck);
    assert_non_null(strstr(msg, "corrupt"));
    assert_non_null(strstr(msg, "not valid JSON"));
    assert_non_null(strstr(msg, "holds 1 bytes"));
    edl_ckpt_close(ck);
}

static void test_file_corrupt_shard_and_truncated_manifest_are_skipped(void **state)
{
    (void)state;
    place pl;
    file_place(&pl, "corrupt");
    corrupt_then_fall_back(&pl);
}

static void test_s3_corrupt_shard_and_truncated_manifest_are_skipped(void **state)
{
    (void)state;
    place pl;
    s3_place(&pl, "corrupt");
    corrupt_then_fall_back(&pl);
}

/* ---- a job run again: the pointer rebuilt from the store ----------------------------------- */

static void delete_pointer(const place *pl)
{
    char key[256];
    harness_job_key(key, sizeof key, pl->job, EDL_KEY_CHECKPOINT, NULL, 0);
    assert_int_equal(edl_etcd_delete(fx->cl, edl_str(key), NULL, NULL), 0);
}

static bool has_dir(const place *pl, int step)
{
    edl_storage *s;
    edl_storage_config c = pl->sc;
    c.uri = pl->uri;
    assert_int_equal(edl_storage_open(&c, &s, NULL, 0), 0);
    char key[128];
    edl_storage_stat st;
    snprintf(key, sizeof key, "ckpt-%016d-g7/manifest.json", step);
    bool found = edl_storage_stat_key(s, key, &st) == 0;
    edl_storage_close(s);
    return found;
}

/* The job's etcd keys went (a new run, an etcd that lost its data): the newest complete
 * checkpoint is found from the store, the corrupt newest one passed over as ever, and every
 * rank agrees on the pointer that the first load seeded. */
static void lost_pointer_found_from_the_store(place *pl)
{
    for (int step = 1; step <= 3; step++)
        assert_int_equal(save_all(pl, 2, step, 3000, 3), 0);
    char *bad = pattern(6001, 999);
    overwrite(pl, "ckpt-0000000000000003-g7/rank-1/shard-1", bad, 6001);
    free(bad);
    overwrite(pl, "ckpt-0000000000000004-g7/rank-0/shard-0", "a crashed save", 14); /* no manifest */
    delete_pointer(pl);
    edl_ckpt *ck = open_ck(pl, 0, 2, 3);
    edl_ckpt_manifest *m = load_ok(ck);
    assert_int_equal(m->step, 2);
    assert_int_equal(m->skipped, 1);
    check_loaded(ck, m, 2, 2, 3000);
    edl_ckpt_manifest_free(m);
    char key[256], val[1024];
    harness_job_key(key, sizeof key, pl->job, EDL_KEY_CHECKPOINT, NULL, 0);
    assert_non_null(harness_get(fx->cl, key, val, sizeof val));
    assert_non_null(strstr(val, "\"step\":2"));
    edl_ckpt *other = open_ck(pl, 1, 2, 3);
    m = load_ok(other);
    assert_int_equal(m->step, 2);
    edl_ckpt_manifest_free(m);
    edl_ckpt_close(other);
    edl_ckpt_close(ck);
}

static void test_file_lost_pointer_is_rebuilt_from_the_store(void **state)
{
    (void)state;
    place pl;
    file_place(&pl, "lost");
    lost_pointer_found_from_the_store(&pl);
}

static void test_s3_lost_pointer_is_rebuilt_from_the_store(void **state)
{
    (void)state;
    place pl;
    s3_place(&pl, "lost");
    lost_pointer_found_from_the_store(&pl);
}

/* A new run's saves continue the step series: one at or below the newest checkpoint is
 * refused, and retention keeps the earlier run's checkpoints until newer ones are committed. */
static void test_a_commit_after_recovery_keeps_the_earlier_runs_checkpoints(void **state)
{
    (void)state;
    place pl;
    file_place(&pl, "again");
    for (int step = 1; step <= 3; step++)
        assert_int_equal(save_all(&pl, 1, step, 1000, 3), 0);
    delete_pointer(&pl);
    assert_int_equal(save_all(&pl, 1, 2, 1000, 3), EDL_ECONFLICT);
    for (int step = 1; step <= 3; step++)
        assert_true(has_dir(&pl, step));
    assert_int_equal(save_all(&pl, 1, 4, 1000, 3), 0);
    assert_false(has_dir(&pl, 1)); /* keep 3: the fourth-newest goes once step 4 is complete */
    for (int step = 2; step <= 4; step++)
        assert_true(has_dir(&pl, step));
    /* a pointer left for another URI (the job's checkpoint URI changed) is not followed */
    char key[256];
    harness_job_key(key, sizeof key, pl.job, EDL_KEY_CHECKPOINT, NULL, 0);
    harness_put(fx->cl, key, "{\"step\":9,\"generation\":1,\"uri\":\"file:///elsewhere\","
                "\"dir\":\"ckpt-0000000000000009-g1\",\"history\":[{\"step\":9,"
                "\"generation\":1,\"dir\":\"ckpt-0000000000000009-g1\"}]}");
    edl_ckpt *ck = open_ck(&pl, 0, 1, 3);
    edl_ckpt_manifest *m = load_ok(ck);
    assert_int_equal(m->step, 4);
    edl_ckpt_manifest_free(m);
    edl_ckpt_close(ck);
    assert_int_equal(save_all(&pl, 1, 5, 1000, 3), 0);
}

/* edl run --fresh: the checkpoints move under previous-<time>/, and the job starts over. */
static void test_set_aside_moves_checkpoints_and_the_job_starts_over(void **state)
{
    (void)state;
    place pl;
    file_place(&pl, "fresh");
    for (int step = 1; step <= 2; step++)
        assert_int_equal(save_all(&pl, 1, step, 1000, 3), 0);
    edl_ckpt_config cfg;
    config_at(&pl, &cfg);
    char where[512], err[512];
    size_t moved = 0;
    int rc = edl_ckpt_set_aside(&cfg, where, sizeof where, &moved, err, sizeof err);
    if (rc)
        fail_msg("set_aside: %s: %s", edl_strerror(rc), err);
    assert_int_equal(moved, 2);
    assert_non_null(strstr(where, "/previous-"));
    char path[600];
    snprintf(path, sizeof path, "%s/ckpt-0000000000000002-g7/manifest.json", where + 7);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    edl_ckpt *ck = open_ck(&pl, 0, 1, 3);
    edl_ckpt_manifest *m;
    assert_int_equal(edl_ckpt_load_latest(ck, &m), EDL_ENOTFOUND);
    edl_ckpt_close(ck);
    assert_int_equal(save_all(&pl, 1, 1, 1000, 3), 0); /* step 1 again: a new lineage */
    cfg.uri = "s3://bucket/x";
    assert_int_equal(edl_ckpt_set_aside(&cfg, NULL, 0, &moved, err, sizeof err), EDL_ENOTSUP);
    assert_non_null(strstr(err, "only file://"));
}

/* ---- checkpoints written before XXH3 ------------------------------------------------------ */

/* Two NIST test vectors and their SHA-256: the shards of a checkpoint as edl wrote it before
 * XXH3 (format /1, "sha256" per shard), laid out by hand so no SHA-256 code is needed here. */
#define V1_A "abc"
#define V1_A_SUM "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
#define V1_B "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
#define V1_B_SUM "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"

static void put_v1_checkpoint(const place *pl, int step)
{
    char dir[64], key[128], doc[2048];
    snprintf(dir, sizeof dir, "ckpt-%016d-g1", step);
    snprintf(key, sizeof key, "%s/rank-0/shard-0", dir);
    overwrite(pl, key, V1_A, strlen(V1_A));
    snprintf(key, sizeof key, "%s/rank-0/shard-1", dir);
    overwrite(pl, key, V1_B, strlen(V1_B));
    int n = snprintf(doc, sizeof doc,
        "{\n\t\"format\":\t\"edl-checkpoint/1\",\n\t\"step\":\t%d,\n\t\"generation\":\t1,\n"
        "\t\"world_size\":\t1,\n\t\"dir\":\t\"%s\",\n\t\"metadata\":\t{\"lr\":0.1},\n"
        "\t\"shards\":\t[{\"rank\":0,\"index\":0,\"name\":\"model\",\"key\":\"%s/rank-0/shard-0\","
        "\"size\":3,\"sha256\":\"" V1_A_SUM "\"},{\"rank\":0,\"index\":1,\"name\":\"optim\","
        "\"key\":\"%s/rank-0/shard-1\",\"size\":56,\"sha256\":\"" V1_B_SUM "\"}]\n}",
        step, dir, dir, dir);
    snprintf(key, sizeof key, "%s/manifest.json", dir);
    overwrite(pl, key, doc, (size_t)n);
}

static void check_v1_loaded(edl_ckpt *ck, int step)
{
    edl_ckpt_manifest *m = load_ok(ck);
    assert_int_equal(m->step, step);
    assert_int_equal(m->n_shards, 2);
    const char *want[] = {V1_A, V1_B};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(m->shards[i].hash, EDL_CKPT_SHA256);
        void *data;
        size_t len;
        assert_int_equal(edl_ckpt_read_shard(ck, m, i, &data, &len), 0);
        assert_int_equal(len, strlen(want[i]));
        assert_memory_equal(data, want[i], len);
        free(data);
    }
    edl_ckpt_manifest_free(m);
}

static void test_checkpoints_with_sha256_still_load_and_new_ones_use_xxh3(void **state)
{
    (void)state;
    place pl;
    file_place(&pl, "v1");
    put_v1_checkpoint(&pl, 1);
    put_v1_checkpoint(&pl, 2);
    overwrite(&pl, "ckpt-0000000000000002-g1/rank-0/shard-1", V1_A V1_B, strlen(V1_B)); /* bad */
    char key[256];
    harness_job_key(key, sizeof key, pl.job, EDL_KEY_CHECKPOINT, NULL, 0);
    harness_put(fx->cl, key, "{\"step\":2,\"generation\":1,\"dir\":\"ckpt-0000000000000002-g1\","
                "\"history\":[{\"step\":2,\"generation\":1,\"dir\":\"ckpt-0000000000000002-g1\"},"
                "{\"step\":1,\"generation\":1,\"dir\":\"ckpt-0000000000000001-g1\"}]}");
    edl_ckpt *ck = open_ck(&pl, 0, 1, 3);
    check_v1_loaded(ck, 1); /* step 2's SHA-256 does not match: it falls back to step 1 */
    /* a new save on top of the old lineage: XXH3-128, and both kinds load side by side */
    edl_ckpt_shard sh = {.name = "model", .data = V1_B, .len = strlen(V1_B)};
    assert_int_equal(edl_ckpt_save(ck, 3, 1, &sh, 1, NULL), 0);
    edl_ckpt_manifest *m = load_ok(ck);
    assert_int_equal(m->step, 3);
    assert_int_equal(m->shards[0].hash, EDL_CKPT_XXH3_128);
    assert_int_equal(strlen(m->shards[0].digest), 32);
    edl_ckpt_manifest_free(m);
    overwrite(&pl, "ckpt-0000000000000003-g1/rank-0/shard-0", V1_A V1_B, strlen(V1_B));
    check_v1_loaded(ck, 1); /* XXH3 caught the flipped bytes; step 1 (SHA-256) still loads */
    edl_ckpt_close(ck);
}

static void test_hostile_manifests_are_refused_with_reasons(void **state)
{
    (void)state;
#define HEAD "{\"format\":\"edl-checkpoint/1\",\"step\":5,\"generation\":1,\"world_size\":2," \
             "\"dir\":\"ckpt-0000000000000005-g1\","
#define SUM "\"sha256\":\"" \
            "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\""
#define SHARD(rank, idx, size, key) \
    "{\"rank\":" #rank ",\"index\":" #idx ",\"name\":\"m\",\"key\":\"" key "\",\"size\":" size "," SUM "}"
#define KEY0 "ckpt-0000000000000005-g1/rank-0/shard-0"
    const char *good = HEAD "\"metadata\":{\"a\":1},\"shards\":[" SHARD(0, 0, "10", KEY0) "]}";
    edl_ckpt_manifest *m;
    char err[256];
    assert_int_equal(edl_ckpt_manifest_parse(good, strlen(good), &m, err, sizeof err), 0);
    assert_int_equal(m->n_shards, 1);
    assert_int_equal(m->shards[0].size, 10);
    assert_int_equal(m->shards[0].hash, EDL_CKPT_SHA256);
    edl_ckpt_manifest_free(m);
#define HEAD2 "{\"format\":\"edl-checkpoint/2\",\"step\":5,\"generation\":1,\"world_size\":2," \
              "\"dir\":\"ckpt-0000000000000005-g1\",\"shards\":[{\"rank\":0,\"index\":0,\"name\":" \
              "\"m\",\"key\":\"" KEY0 "\",\"size\":10,"
    const char *good2 =
        HEAD2 "\"hash\":\"xxh3-128\",\"digest\":\"0123456789abcdef0123456789abcdef\"}]}";
    assert_int_equal(edl_ckpt_manifest_parse(good2, strlen(good2), &m, err, sizeof err), 0);
    assert_int_equal(m->shards[0].hash, EDL_CKPT_XXH3_128);
    assert_string_equal(m->shards[0].digest, "0123456789abcdef0123456789abcdef");
    edl_ckpt_manifest_free(m);
    struct { const char *doc, *why; } cases[] = {
        {HEAD2 "\"hash\":\"md5\",\"digest\":\"0123456789abcdef0123456789abcdef\"}]}", "no known"},
        {HEAD2 "\"hash\":\"xxh3-128\",\"digest\":\"" "0123456789abcdef0123456789abcdef"
               "0123456789abcdef0123456789abcdef\"}]}", "not 32 lowercase hex"},
        {HEAD2 "\"hash\":\"xxh3-128\"}]}", "\"digest\""},
        {HEAD2 "\"digest\":\"0123456789abcdef0123456789abcdef\"}]}", "\"sha256\""},
        {"{\"format\":\"edl-checkpoint/3\"}", "format"},
        {"", "not valid JSON"},
        {"[1,2]", "not a JSON object"},
        {"{\"format\":\"other/1\"}", "format"},
        {HEAD "\"shards\":[" SHARD(0, 0, "10", KEY0), "not valid JSON"}, /* truncated */
        {"{\"format\":\"edl-checkpoint/1\",\"step\":\"5\"}", "\"step\""},
        {"{\"format\":\"edl-checkpoint/1\",\"step\":5.5}", "\"step\""},
        {"{\"format\":\"edl-checkpoint/1\",\"step\":1e300}", "\"step\""},
        {"{\"format\":\"edl-checkpoint/1\",\"step\":5,\"generation\":1,\"world_size\":0}", "world_size"},
        {"{\"format\":\"edl-checkpoint/1\",\"step\":5,\"generation\":1,\"world_size\":2,\"dir\":\"ckpt-9\"}", "\"dir\""},
        {HEAD "\"shards\":{}}", "\"shards\""},
        {HEAD "\"shards\":[" SHARD(0, 0, "-1", KEY0) "]}", "\"size\""},
        {HEAD "\"shards\":[" SHARD(0, 0, "1152921504606846976", KEY0) "]}", "\"size\""},
        {HEAD "\"shards\":[" SHARD(0, 0, "10.5", KEY0) "]}", "\"size\""},
        {HEAD "\"shards\":[" SHARD(2, 0, "10", KEY0) "]}", "\"rank\""},
        {HEAD "\"shards\":[" SHARD(0, 0, "10", "elsewhere/x") "]}", "outside"},
        {HEAD "\"shards\":[" SHARD(0, 0, "10", "ckpt-0000000000000005-g1/../x") "]}", "\"key\""},
        {HEAD "\"shards\":[" SHARD(0, 0, "10", KEY0) "," SHARD(0, 0, "10", KEY0) "]}", "twice"},
        {HEAD "\"shards\":[{\"rank\":0,\"index\":0,\"name\":\"m\",\"key\":\"" KEY0 "\",\"size\":1,"
              "\"sha256\":\"abc\"}]}", "sha256"},
        {HEAD "\"shards\":[" SHARD(0, 0, "10", KEY0) "],\"metadata\":[1]}", "metadata"},
        {HEAD "\"shards\":[7]}", "not an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        m = (edl_ckpt_manifest *)1;
        int rc = edl_ckpt_manifest_parse(cases[i].doc, strlen(cases[i].doc), &m, err, sizeof err);
        if (rc != EDL_EPROTO || !strstr(err, cases[i].why))
            fail_msg("case %zu: rc %d, message \"%s\" (wanted \"%s\")", i, rc, err, cases[i].why);
        assert_null(m);
    }
}

/* ---- the pointer race ------------------------------------------------------------------ */

typedef struct racer {
    const place *pl;
    int first_step;
    int committed, refused;
} racer;

static void *race(void *arg)
{
    racer *r = arg;
    edl_ckpt *ck = open_ck(r->pl, 0, 1, 2);
    edl_ckpt_shard sh = {.name = "m", .data = "0123456789", .len = 10};
    for (int step = r->first_step; step < r->first_step + 40; step += 2) {
        int rc = edl_ckpt_save(ck, step, 1, &sh, 1, NULL);
        if (rc == 0)
            r->committed++;
        else if (rc == EDL_ECONFLICT)
            r->refused++;
        else
            fprintf(stderr, "racer: %s: %s\n", edl_strerror(rc), edl_ckpt_errmsg(ck));
    }
    edl_ckpt_close(ck);
    return NULL;
}

static void test_pointer_race_between_two_writers_never_goes_back(void **state)
{
    (void)state;
    place pl;
    file_place(&pl, "race");
    char key[256];
    harness_job_key(key, sizeof key, pl.job, EDL_KEY_CHECKPOINT, NULL, 0);
    edl_watch *w;
    assert_int_equal(edl_watch_open(fx->cl, edl_str(key), NULL, &w), 0);
    racer a = {.pl = &pl, .first_step = 1}, b = {.pl = &pl, .first_step = 2};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, race, &a);
    pthread_create(&tb, NULL, race, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(a.committed + a.refused, 20);
    assert_int_equal(b.committed + b.refused, 20);
    /* every change of the pointer moved it forward. The watch delivers the commits as fast as
     * the machine lets it: wait for as many changes as commits (a loaded machine may leave
     * seconds between two), then 300 ms more to see none came beyond them. */
    long long last = -1;
    int changes = 0, commits = a.committed + b.committed;
    int64_t deadline = harness_now_ms() + 30000;
    for (;;) {
        edl_watch_event *ev;
        int64_t left = deadline - harness_now_ms();
        int wait_ms = changes < commits ? (int)(left > 0 ? left : 0) : 300;
        if (edl_watch_next(w, &ev, wait_ms) != 0)
            break;
        if (ev->type == EDL_WATCH_PUT) {
            long long step = -1;
            const char *s = strstr(ev->kv.value, "\"step\":");
            assert_non_null(s);
            step = atoll(s + 7);
            assert_true(step > last);
            last = step;
            changes++;
        }
        edl_watch_event_free(ev);
    }
    edl_watch_close(w);
    assert_int_equal(changes, commits);
    assert_int_equal(last, 40);
    edl_ckpt *ck = open_ck(&pl, 0, 1, 2);
    edl_ckpt_manifest *m = load_ok(ck);
    assert_int_equal(m->step, 40);
    edl_ckpt_manifest_free(m);
    edl_ckpt_close(ck);
}

static void test_commit_waits_for_every_rank_then_times_out(void **state)
{
    (void)state;
    place pl;
    file_place(&pl, "missing");
    edl_ckpt_config cfg;
    config_at(&pl, &cfg);
    cfg.world_size = 2;
    cfg.commit_timeout_ms = 400;
    edl_ckpt *ck = open_cfg(&cfg);
    edl_ckpt_shard sh = {.data = "x", .len = 1};
    int64_t t0 = harness_now_ms();
    assert_int_equal(edl_ckpt_save(ck, 1, 1, &sh, 1, NULL), EDL_ETIMEDOUT);
    /* not before the timeout: a poll's back-off that would cross it is cut short, never
     * taken as the end (it gave up at 350 ms, or sooner with a jittered back-off, under load) */
    assert_true(harness_now_ms() - t0 >= 400);
    assert_non_null(strstr(edl_ckpt_errmsg(ck), "1 of 2 ranks"));
    edl_ckpt_manifest *m;
    assert_int_equal(edl_ckpt_load_latest(ck, &m), EDL_ENOTFOUND);
    edl_ckpt_close(ck);
}

/* A save that an earlier run of the job left half done (rank 1's done.json of step 5,
 * generation 1, then the run ended) has the directory this run's save of step 5 gets in its
 * generation 1. The committer of this run must not take the earlier run's done.json for rank
 * 1's: until this run's rank 1 writes its own it waits, and at its deadline it says whose the
 * file was; once rank 1 has saved, the checkpoint holds this run's bytes only. */
static void test_a_half_done_save_of_an_earlier_run_is_not_taken_for_this_runs(void **state)
{
    (void)state;
    place pl;
    file_place(&pl, "runs");
    edl_ckpt_config cfg;
    config_at(&pl, &cfg);
    cfg.world_size = 2;
    cfg.rank = 1;
    cfg.run = "1764300000000";
    edl_ckpt *old1 = open_cfg(&cfg);
    edl_ckpt_shard sh = {.data = "old rank 1", .len = 10};
    assert_int_equal(edl_ckpt_save(old1, 5, 1, &sh, 1, NULL), 0); /* no committer: half done */
    edl_ckpt_close(old1);

    cfg.run = "1764300099999"; /* the job run again */
    cfg.rank = 0;
    cfg.commit_timeout_ms = 600;
    edl_ckpt *new0 = open_cfg(&cfg);
    sh = (edl_ckpt_shard){.data = "new rank 0", .len = 10};
    assert_int_equal(edl_ckpt_save(new0, 5, 1, &sh, 1, NULL), EDL_EPROTO);
    assert_non_null(strstr(edl_ckpt_errmsg(new0), "rank-1/done.json is unusable: it was written "
                           "by run 1764300000000 of the job, not by this run (1764300099999)"));
    edl_ckpt_manifest *m;
    assert_int_equal(edl_ckpt_load_latest(new0, &m), EDL_ENOTFOUND);

    cfg.rank = 1;
    edl_ckpt *new1 = open_cfg(&cfg);
    edl_ckpt_shard sh1 = {.data = "new rank 1", .len = 10};
    assert_int_equal(edl_ckpt_save(new1, 5, 1, &sh1, 1, NULL), 0);
    assert_int_equal(edl_ckpt_save(new0, 5, 1, &sh, 1, NULL), 0);
    m = load_ok(new0);
    assert_int_equal(m->step, 5);
    assert_string_equal(m->run, "1764300099999");
    assert_int_equal(m->n_shards, 2);
    for (int r = 0; r < 2; r++) {
        void *got = NULL;
        size_t len = 0;
        assert_int_equal(edl_ckpt_read_shard(new0, m, (size_t)edl_ckpt_find_shard(m, r, 0), &got,
                                             &len), 0);
        assert_int_equal(len, 10);
        assert_memory_equal(got, r ? "new rank 1" : "new rank 0", 10);
        free(got);
    }
    edl_ckpt_manifest_free(m);
    edl_ckpt_close(new1);
    edl_ckpt_close(new0);
}

static void count_free(void *data, void *arg)
{
    (*(int *)arg)++;
    free(data);
}

static void test_async_save_takes_handed_over_buffers(void **state)
{
    (void)state;
    place pl;
    file_place(&pl, "handover");
    edl_ckpt *ck = open_ck(&pl, 0, 1, 3);
    int freed = 0;
    edl_ckpt_shard sh[2] = {
        {.name = "a", .data = pattern(1 << 20, 1), .len = 1 << 20, .free_fn = count_free, .free_arg = &freed},
        {.name = "b", .data = pattern(1000, 2), .len = 1000},
    };
    edl_ckpt_pending *p;
    assert_int_equal(edl_ckpt_save_async(ck, 1, 1, sh, 2, "{\"k\":\"v\"}", &p), 0);
    free((void *)sh[1].data); /* copied: ours again at once */
    assert_int_equal(edl_ckpt_wait(p, 30000), 0);
    assert_true(edl_ckpt_save_done(p));
    edl_ckpt_save_free(p);
    assert_int_equal(freed, 1);
    /* bad arguments are refused before anything is queued */
    assert_int_equal(edl_ckpt_save_async(ck, -1, 1, sh, 1, NULL, &p), EDL_EINVAL);
    edl_ckpt_shard badname = {.name = "no/slash", .data = "x", .len = 1};
    assert_int_equal(edl_ckpt_save_async(ck, 2, 1, &badname, 1, NULL, &p), EDL_EINVAL);
    assert_int_equal(edl_ckpt_save_async(ck, 2, 1, sh + 1, 0, "[not an object]", &p), EDL_EINVAL);
    /* a handle released before the save ends: the save completes on its own */
    edl_ckpt_shard small = {.data = "tiny", .len = 4};
    assert_int_equal(edl_ckpt_save_async(ck, 2, 1, &small, 1, NULL, &p), 0);
    edl_ckpt_save_free(p);
    edl_ckpt_close(ck); /* waits for it */
    ck = open_ck(&pl, 0, 1, 3);
    edl_ckpt_manifest *m = load_ok(ck);
    assert_int_equal(m->step, 2);
    edl_ckpt_manifest_free(m);
    edl_ckpt_close(ck);
}

/* The bytes stored under key are exactly want (staging mixed up would not be caught by the
 * digest, which is taken from whatever was written). */
static void stored_equal(const place *pl, const char *key, const char *want, size_t len)
{
    harness_stored_equal(&pl->sc, pl->uri, key, want, len);
}

static void test_staging_is_reused_and_queued_saves_keep_their_own_bytes(void **state)
{
    (void)state;
    place pl;
    file_place(&pl, "stage");
    edl_ckpt *ck = open_ck(&pl, 0, 1, 5);
    assert_int_equal(edl_ckpt_stage_reserve(ck, 3u << 20), 0);
    /* three saves queued at once: the first copies into the reserved area, the others (queued
     * while it is busy) into areas of their own; the caller refills its buffers in between */
    size_t len[3] = {3u << 20, 5u << 20, 1u << 20};
    char *want[3];
    edl_ckpt_pending *p[3];
    char *buf = malloc(5u << 20);
    for (int i = 0; i < 3; i++) {
        want[i] = pattern(len[i], 50 + (unsigned)i);
        memcpy(buf, want[i], len[i]);
        edl_ckpt_shard sh[2] = {{.name = "a", .data = buf, .len = len[i] / 2},
                                {.name = "b", .data = buf + len[i] / 2, .len = len[i] - len[i] / 2}};
        assert_int_equal(edl_ckpt_save_async(ck, i + 1, 1, sh, 2, NULL, &p[i]), 0);
        memset(buf, 0xee, 5u << 20);
    }
    free(buf);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(edl_ckpt_wait(p[i], 30000), 0);
        edl_ckpt_save_free(p[i]);
        char key[128];
        snprintf(key, sizeof key, "ckpt-%016d-g1/rank-0/shard-0", i + 1);
        stored_equal(&pl, key, want[i], len[i] / 2);
        snprintf(key, sizeof key, "ckpt-%016d-g1/rank-0/shard-1", i + 1);
        stored_equal(&pl, key, want[i] + len[i] / 2, len[i] - len[i] / 2);
    }
    /* and again, one at a time: every save reuses what the first ones left */
    for (int i = 0; i < 3; i++) {
        edl_ckpt_shard sh = {.name = "a", .data = want[i], .len = len[i]};
        assert_int_equal(edl_ckpt_save_async(ck, 10 + i, 1, &sh, 1, NULL, &p[0]), 0);
        assert_int_equal(edl_ckpt_wait(p[0], 30000), 0);
        edl_ckpt_save_free(p[0]);
    }
    edl_ckpt_manifest *m = load_ok(ck);
    void *data;
    size_t n;
    assert_int_equal(edl_ckpt_read_shard(ck, m, 0, &data, &n), 0);
    assert_int_equal(n, len[2]);
    assert_memory_equal(data, want[2], n);
    free(data);
    edl_ckpt_manifest_free(m);
    for (int i = 0; i < 3; i++)
        free(want[i]);
    edl_ckpt_close(ck);
}

static edl_ckpt *open_ck_copying(const place *pl, bool background, int threads)
{
    edl_ckpt_config cfg;
    config_at(pl, &cfg);
    cfg.keep = 5;
    cfg.snapshot_in_background = background;
    cfg.copy_threads = threads;
    return open_cfg(&cfg);
}

/* Shards of odd sizes, 40 MiB in all: the copy is split over three threads at byte offsets
 * that fall inside shards, not at their edges. */
#define SNAP_SHARDS 3
static const size_t snap_len[SNAP_SHARDS] = {(17u << 20) + 1, (13u << 20) - 7, (10u << 20) + 6};

static void check_snapshot_saves(const place *pl, bool background)
{
    edl_ckpt *ck = open_ck_copying(pl, background, 3);
    size_t total = 0;
    for (int i = 0; i < SNAP_SHARDS; i++)
        total += snap_len[i];
    char *buf = malloc(total);
    for (int step = 1; step <= 2; step++) { /* the second reuses the first one's staging */
        char *want = pattern(total, 70 + (unsigned)step);
        memcpy(buf, want, total);
        edl_ckpt_shard sh[SNAP_SHARDS];
        for (size_t i = 0, off = 0; i < SNAP_SHARDS; off += snap_len[i], i++)
            sh[i] = (edl_ckpt_shard){.name = "s", .data = buf + off, .len = snap_len[i]};
        edl_ckpt_pending *p;
        assert_int_equal(edl_ckpt_save_async(ck, step, 1, sh, SNAP_SHARDS, NULL, &p), 0);
        assert_int_equal(edl_ckpt_snapshot_wait(p, 30000), 0);
        memset(buf, 0xee, total); /* the optimizer step: the saved bytes must not change */
        assert_int_equal(edl_ckpt_wait(p, 30000), 0);
        assert_int_equal(edl_ckpt_snapshot_wait(p, 0), 0);
        edl_ckpt_save_free(p);
        for (size_t i = 0, off = 0; i < SNAP_SHARDS; off += snap_len[i], i++) {
            char key[128];
            snprintf(key, sizeof key, "ckpt-%016d-g1/rank-0/shard-%zu", step, i);
            stored_equal(pl, key, want + off, snap_len[i]);
        }
        free(want);
    }
    free(buf);
    edl_ckpt_close(ck);
}

static void test_snapshots_in_the_background_and_on_many_threads_keep_their_bytes(void **state)
{
    (void)state;
    place pl;
    file_place(&pl, "snap-bg");
    check_snapshot_saves(&pl, true);
    file_place(&pl, "snap-fg");
    check_snapshot_saves(&pl, false);
    /* a save that copies nothing has no snapshot to wait for */
    edl_ckpt *ck = open_ck_copying(&pl, true, 0);
    int freed = 0;
    edl_ckpt_shard own = {.data = pattern(100, 3), .len = 100, .free_fn = count_free,
                          .free_arg = &freed};
    edl_ckpt_pending *p;
    assert_int_equal(edl_ckpt_save_async(ck, 9, 1, &own, 1, NULL, &p), 0);
    assert_int_equal(edl_ckpt_snapshot_wait(p, 0), 0);
    assert_int_equal(edl_ckpt_wait(p, 30000), 0);
    edl_ckpt_save_free(p);
    assert_int_equal(freed, 1);
    assert_int_equal(edl_ckpt_snapshot_wait(NULL, 0), EDL_EINVAL);
    edl_ckpt_close(ck);
}

/* A shard read into the caller's own buffer: the bytes, a buffer too small (refused before
 * anything is read), and a shard changed on the store (caught by its digest). */
static void test_a_shard_reads_into_the_callers_buffer_with_its_digest_checked(void **state)
{
    (void)state;
    place pl;
    file_place(&pl, "into");
    edl_ckpt *ck = open_ck(&pl, 0, 1, 3);
    size_t len = (3u << 20) + 5;
    char *want = pattern(len, 9);
    edl_ckpt_shard sh[2] = {{.name = "empty", .data = "", .len = 0},
                            {.name = "w", .data = want, .len = len}};
    assert_int_equal(edl_ckpt_save(ck, 1, 1, sh, 2, NULL), 0);
    edl_ckpt_manifest *m = load_ok(ck);
    char *buf = malloc(len + 10);
    assert_int_equal(edl_ckpt_read_shard_into(ck, m, 0, NULL, 0), 0);
    assert_int_equal(edl_ckpt_read_shard_into(ck, m, 1, buf, len + 10), 0);
    assert_memory_equal(buf, want, len);
    memset(buf, 0x5a, len + 10);
    assert_int_equal(edl_ckpt_read_shard_into(ck, m, 1, buf, len - 1), EDL_ETOOBIG);
    assert_non_null(strstr(edl_ckpt_errmsg(ck), "more than the"));
    assert_int_equal((unsigned char)buf[0], 0x5a);
    assert_int_equal(edl_ckpt_read_shard_into(ck, m, 2, buf, len), EDL_EINVAL);
    /* several at once (on parallel_shards lanes): every index and size is checked first */
    char *more = malloc(len);
    edl_ckpt_read rd[3] = {{.index = 1, .dst = buf, .cap = len}, {.index = 0, .dst = NULL},
                           {.index = 1, .dst = more, .cap = len}};
    assert_int_equal(edl_ckpt_read_shards_into(ck, m, rd, 3), 0);
    assert_memory_equal(buf, want, len);
    assert_memory_equal(more, want, len);
    memset(more, 0x5a, len);
    rd[0].cap = len - 1;
    assert_int_equal(edl_ckpt_read_shards_into(ck, m, rd, 3), EDL_ETOOBIG);
    assert_int_equal((unsigned char)more[0], 0x5a); /* refused before anything was read */
    rd[0].cap = len;
    rd[1].index = 7;
    assert_int_equal(edl_ckpt_read_shards_into(ck, m, rd, 3), EDL_EINVAL);
    free(more);
    /* one byte changed in the middle of the stored shard */
    char path[600];
    snprintf(path, sizeof path, "%s/%s", pl.uri + strlen("file://"), m->shards[1].key);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, (long)(len / 2), SEEK_SET);
    fputc(want[len / 2] ^ 1, f);
    fclose(f);
    assert_int_equal(edl_ckpt_read_shard_into(ck, m, 1, buf, len), EDL_EPROTO);
    assert_non_null(strstr(edl_ckpt_errmsg(ck), "corrupt"));
    edl_ckpt_manifest_free(m);
    free(buf);
    free(want);
    edl_ckpt_close(ck);
}

/* A device shard where no CUDA answers (this build without CUDA, or no runtime or GPU on the
 * host), or that is host memory after all: a clear error, and the handle saves on as before. */
static void test_device_shards_without_cuda_and_bad_copy_options_are_clear_errors(void **state)
{
    (void)state;
    place pl;
    file_place(&pl, "device");
    edl_ckpt_config cfg;
    config_at(&pl, &cfg);
    cfg.copy_threads = 65;
    edl_ckpt *ck;
    char err[512];
    assert_int_equal(edl_ckpt_open(&cfg, &ck, err, sizeof err), EDL_EINVAL);
    assert_non_null(strstr(err, "copy_threads=65"));

    ck = open_ck_copying(&pl, false, 2);
    char host[4096];
    memset(host, 7, sizeof host);
    edl_ckpt_shard dev = {.name = "w", .data = host, .len = sizeof host, .device = true};
    edl_ckpt_pending *p = (edl_ckpt_pending *)&dev;
    int rc = edl_ckpt_save_async(ck, 1, 1, &dev, 1, NULL, &p);
    print_message("device shard of host memory: %s: %s\n", edl_strerror(rc), edl_ckpt_errmsg(ck));
    assert_true(rc == EDL_ENOTSUP || rc == EDL_EUNAVAIL || rc == EDL_EINVAL);
    assert_null(p);
    assert_true(strstr(edl_ckpt_errmsg(ck), "CUDA") || strstr(edl_ckpt_errmsg(ck), "device"));
    dev.free_fn = count_free;
    assert_int_equal(edl_ckpt_save_async(ck, 1, 1, &dev, 1, NULL, &p), EDL_EINVAL);
    assert_non_null(strstr(edl_ckpt_errmsg(ck), "handed over"));
    assert_int_equal(edl_ckpt_save(ck, 1, 1, &dev, 1, NULL), EDL_EINVAL);
    /* an empty device shard has nothing to copy: it saves anywhere */
    edl_ckpt_shard empty = {.name = "e", .data = NULL, .len = 0, .device = true};
    assert_int_equal(edl_ckpt_save(ck, 1, 1, &empty, 1, NULL), 0);
    /* nothing else was queued or committed: the next save is the second checkpoint */
    edl_ckpt_shard ok = {.name = "w", .data = host, .len = sizeof host};
    assert_int_equal(edl_ckpt_save(ck, 2, 1, &ok, 1, NULL), 0);
    edl_ckpt_manifest *m = load_ok(ck);
    assert_int_equal(m->step, 2);
    assert_int_equal(m->n_shards, 1);
    assert_int_equal(m->shards[0].size, sizeof host);
    edl_ckpt_manifest_free(m);
    edl_ckpt_close(ck);
}

static void test_unreachable_store_is_a_clear_error_and_state_is_kept(void **state)
{
    (void)state;
    place pl;
    snprintf(pl.uri, sizeof pl.uri, "s3://edl-test/down");
    snprintf(pl.job, sizeof pl.job, "down-%d", ++fx->seq);
    edl_storage_config_init(&pl.sc);
    harness_http *h = harness_http_open();
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", harness_http_port(h));
    harness_http_close(h); /* nobody listens there now */
    pl.sc.endpoint = ep;
    pl.sc.access_key_id = pl.sc.secret_access_key = "k";
    pl.sc.max_retries = 1;
    pl.sc.retry_base_ms = 10;
    edl_ckpt *ck = open_ck(&pl, 0, 1, 3);
    char state_buf[64] = "the model's weights";
    edl_ckpt_shard sh = {.data = state_buf, .len = sizeof state_buf};
    assert_int_equal(edl_ckpt_save(ck, 1, 1, &sh, 1, NULL), EDL_EUNAVAIL);
    assert_non_null(strstr(edl_ckpt_errmsg(ck), "cannot reach"));
    assert_string_equal(state_buf, "the model's weights");
    /* a pointer exists (written by an earlier, healthy store) but the store is down now */
    char key[256];
    harness_job_key(key, sizeof key, pl.job, EDL_KEY_CHECKPOINT, NULL, 0);
    harness_put(fx->cl, key, "{\"step\":1,\"history\":[{\"step\":1,\"generation\":1,"
                "\"dir\":\"ckpt-0000000000000001-g1\"}]}");
    edl_ckpt_manifest *m;
    assert_int_equal(edl_ckpt_load_latest(ck, &m), EDL_EUNAVAIL);
    assert_non_null(strstr(edl_ckpt_errmsg(ck), "cannot reach"));
    edl_ckpt_close(ck);
}

static void test_wrong_credentials_is_a_clear_error(void **state)
{
    (void)state;
    place pl;
    s3_place(&pl, "creds");
    pl.sc.access_key_id = "NOT-A-KEY";
    pl.sc.secret_access_key = "wrong";
    edl_ckpt *ck = open_ck(&pl, 0, 1, 3);
    edl_ckpt_shard sh = {.data = "x", .len = 1};
    assert_int_equal(edl_ckpt_save(ck, 1, 1, &sh, 1, NULL), EDL_EAUTH);
    assert_non_null(strstr(edl_ckpt_errmsg(ck), "credentials"));
    /* six handed-over shards on four upload lanes: the save fails with the store's reason, and
     * every buffer goes back once, uploaded or not */
    int freed = 0;
    edl_ckpt_shard six[6];
    for (int i = 0; i < 6; i++)
        six[i] = (edl_ckpt_shard){.data = pattern(1000, (unsigned)i), .len = 1000,
                                  .free_fn = count_free, .free_arg = &freed};
    edl_ckpt_pending *p;
    assert_int_equal(edl_ckpt_save_async(ck, 2, 1, six, 6, NULL, &p), 0);
    assert_int_equal(edl_ckpt_wait(p, 30000), EDL_EAUTH);
    assert_non_null(strstr(edl_ckpt_save_errmsg(p), "credentials"));
    edl_ckpt_save_free(p);
    edl_ckpt_close(ck);
    assert_int_equal(freed, 6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_round_trip_in_another_world_size),
        cmocka_unit_test(test_s3_round_trip_in_another_world_size),
        cmocka_unit_test(test_no_checkpoint_yet_is_not_found),
        cmocka_unit_test(test_keep_deletes_older_checkpoints_after_the_pointer_moves),
        cmocka_unit_test(test_step_never_goes_backwards),
        cmocka_unit_test(test_load_older_passes_over_newer_ones_and_saves_go_on),
        cmocka_unit_test(test_file_corrupt_shard_and_truncated_manifest_are_skipped),
        cmocka_unit_test(test_s3_corrupt_shard_and_truncated_manifest_are_skipped),
        cmocka_unit_test(test_file_lost_pointer_is_rebuilt_from_the_store),
        cmocka_unit_test(test_s3_lost_pointer_is_rebuilt_from_the_store),
        cmocka_unit_test(test_a_commit_after_recovery_keeps_the_earlier_runs_checkpoints),
        cmocka_unit_test(test_set_aside_moves_checkpoints_and_the_job_starts_over),
        cmocka_unit_test(test_checkpoints_with_sha256_still_load_and_new_ones_use_xxh3),
        cmocka_unit_test(test_hostile_manifests_are_refused_with_reasons),
        cmocka_unit_test(test_pointer_race_between_two_writers_never_goes_back),
        cmocka_unit_test(test_commit_waits_for_every_rank_then_times_out),
        cmocka_unit_test(test_a_half_done_save_of_an_earlier_run_is_not_taken_for_this_runs),
        cmocka_unit_test(test_async_save_takes_handed_over_buffers),
        cmocka_unit_test(test_staging_is_reused_and_queued_saves_keep_their_own_bytes),
        cmocka_unit_test(test_snapshots_in_the_background_and_on_many_threads_keep_their_bytes),
        cmocka_unit_test(test_device_shards_without_cuda_and_bad_copy_options_are_clear_errors),
        cmocka_unit_test(test_a_shard_reads_into_the_callers_buffer_with_its_digest_checked),
        cmocka_unit_test(test_unreachable_store_is_a_clear_error_and_state_is_kept),
        cmocka_unit_test(test_wrong_credentials_is_a_clear_error),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

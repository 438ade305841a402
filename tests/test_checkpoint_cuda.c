/* test_checkpoint_cuda.c: device shards (edl_ckpt_shard.device) staged through pinned memory
 * on a real GPU: an asynchronous save in the background, the device buffer overwritten as soon
 * as edl_ckpt_snapshot_wait() returns, and the stored bytes are those of the snapshot; a device
 * shard beside host shards; the next save reusing the pinned staging. The CUDA runtime is
 * opened with dlopen, as libedlstorage does: on a host without a GPU (or a build without CUDA)
 * every test here is skipped with the reason, and test_checkpoint checks the clear errors. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/checkpoint.h"
#include "edl/log.h"
#include "harness.h"

/* The few runtime calls the test needs (an int is cudaError_t; 0 is cudaSuccess). */
typedef struct cuda {
    int (*device_count)(int *);
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*memcpy_)(void *, const void *, size_t, int); /* kind 1: host to device */
    int (*memset_)(void *, int, size_t);
    int (*sync)(void);
} cuda;

static cuda cu;
static edl_etcd_server *srv;
static edl_etcd *cl;
static char dir[64];

static const char *open_cuda(void)
{
    void *h = dlopen("libcudart.so", RTLD_NOW);
    if (!h)
        h = dlopen("libcudart.so.13", RTLD_NOW);
    if (!h)
        h = dlopen("libcudart.so.12", RTLD_NOW);
    if (!h)
        return "no CUDA runtime (libcudart.so)";
    *(void **)&cu.device_count = dlsym(h, "cudaGetDeviceCount");
    *(void **)&cu.malloc_ = dlsym(h, "cudaMalloc");
    *(void **)&cu.free_ = dlsym(h, "cudaFree");
    *(void **)&cu.memcpy_ = dlsym(h, "cudaMemcpy");
    *(void **)&cu.memset_ = dlsym(h, "cudaMemset");
    *(void **)&cu.sync = dlsym(h, "cudaDeviceSynchronize");
    int n = 0;
    if (!cu.device_count || !cu.malloc_ || !cu.free_ || !cu.memcpy_ || !cu.memset_ || !cu.sync)
        return "the CUDA runtime lacks a call";
    if (cu.device_count(&n) != 0 || n == 0)
        return "no CUDA device";
    return NULL;
}

static void need_gpu(void)
{
    static const char *why = "";
    if (why && !why[0])
        why = open_cuda();
    if (why) {
        print_message("SKIP: %s\n", why);
        skip();
    }
}

static int setup(void **state)
{
    (void)state;
    edl_log_setup(EDL_LOG_ERROR, EDL_LOG_PLAIN, NULL);
    harness_open_etcd(1, NULL, &srv, &cl);
    snprintf(dir, sizeof dir, "/tmp/edl-ckcuda-XXXXXX");
    assert_non_null(mkdtemp(dir));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    harness_close_etcd(&srv, &cl);
    harness_rmtree(dir);
    return 0;
}

static char *pattern(size_t n, unsigned seed)
{
    char *p = malloc(n);
    for (size_t i = 0; i < n; i++)
        p[i] = (char)((i * 2654435761u + seed * 40503u) >> 11);
    return p;
}

static void test_device_shards_are_snapshotted_through_pinned_staging(void **state)
{
    (void)state;
    need_gpu();
    char uri[128];
    snprintf(uri, sizeof uri, "file://%s/gpu", dir);
    edl_ckpt_config cfg;
    edl_ckpt_config_init(&cfg);
    cfg.uri = uri;
    cfg.etcd = cl;
    cfg.job = "gpu";
    cfg.keep = 3;
    cfg.snapshot_in_background = true;
    edl_ckpt *ck;
    char err[512];
    assert_int_equal(edl_ckpt_open(&cfg, &ck, err, sizeof err), 0);
    size_t dlen = (64u << 20) + 1000, hlen = 3u << 20;
    void *dev;
    assert_int_equal(cu.malloc_(&dev, dlen), 0);
    char *host = malloc(hlen);
    for (int step = 1; step <= 2; step++) {
        char *want_d = pattern(dlen, 10 + (unsigned)step), *want_h = pattern(hlen, 20 + (unsigned)step);
        assert_int_equal(cu.memcpy_(dev, want_d, dlen, 1), 0);
        memcpy(host, want_h, hlen);
        edl_ckpt_shard sh[2] = {{.name = "weights", .data = dev, .len = dlen, .device = true},
                                {.name = "meta", .data = host, .len = hlen}};
        edl_ckpt_pending *p;
        int rc = edl_ckpt_save_async(ck, step, 1, sh, 2, NULL, &p);
        if (rc != 0)
            fail_msg("save_async: %s: %s", edl_strerror(rc), edl_ckpt_errmsg(ck));
        assert_int_equal(edl_ckpt_snapshot_wait(p, 60000), 0);
        assert_int_equal(cu.memset_(dev, 0xee, dlen), 0); /* training goes on at once */
        assert_int_equal(cu.sync(), 0);
        memset(host, 0xee, hlen);
        assert_int_equal(edl_ckpt_wait(p, 60000), 0);
        edl_ckpt_save_free(p);
        char key[128];
        snprintf(key, sizeof key, "ckpt-%016d-g1/rank-0/shard-0", step);
        harness_stored_equal(NULL, uri, key, want_d, dlen);
        snprintf(key, sizeof key, "ckpt-%016d-g1/rank-0/shard-1", step);
        harness_stored_equal(NULL, uri, key, want_h, hlen);
        free(want_d);
        free(want_h);
    }
    free(host);
    cu.free_(dev);
    edl_ckpt_close(ck);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_shards_are_snapshotted_through_pinned_staging),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

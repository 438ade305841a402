/* test_nccl.c: the NCCL back end of libedlcoll (collective/nccl_backend.h) in one process on one GPU:
 * collectives of a one-rank communicator on device buffers checked against host references,
 * rebuilding for a new generation (the shrink fast path where NCCL has it), a pending init
 * aborted at its deadline, and a unique id that never arrives. The per-generation keys live
 * in an in-memory store standing in for the core's etcd callbacks. Without a CUDA device the
 * program says so and exits 77 (ctest: skipped). */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
/* nccl.h declares a few functions as f() (not f(void)): keep -Wstrict-prototypes for ours. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h> /* NCCL's: its include directory precedes collective/ (see nccl.cmake) */
#pragma GCC diagnostic pop

#include "../collective/nccl_backend.h"

/* CUDA's runtime maps memory inside the range that AddressSanitizer reserves as the shadow
 * gap on some drivers; let it (read only when the test is built with -fsanitize=address). */
#if defined(__SANITIZE_ADDRESS__)
#define EDL_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EDL_TEST_ASAN 1
#endif
#endif
#ifdef EDL_TEST_ASAN
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "protect_shadow_gap=0";
}
#endif

/* ---- the per-generation keys: gen/<n>/<name> of one generation ------------------------------ */

typedef struct fake_kv {
    int64_t generation;
    char name[32];
    char *value;
    size_t len;
    int puts;
} fake_kv;

static int kv_put(void *arg, const char *name, const void *value, size_t len)
{
    fake_kv *kv = arg;
    if (kv->value || strlen(name) >= sizeof kv->name)
        return EDL_ECONFLICT; /* each key is written once per generation */
    kv->value = malloc(len);
    if (!kv->value)
        return EDL_ENOMEM;
    memcpy(kv->value, value, len);
    kv->len = len;
    snprintf(kv->name, sizeof kv->name, "%s", name);
    kv->puts++;
    return 0;
}

/* Nobody else writes in this process: a missing key stays missing for the whole wait. */
static int kv_wait(void *arg, const char *name, char **value, size_t *len, int timeout_ms)
{
    fake_kv *kv = arg;
    if (kv->value && strcmp(kv->name, name) == 0) {
        *value = malloc(kv->len);
        if (!*value)
            return EDL_ENOMEM;
        memcpy(*value, kv->value, kv->len);
        *len = kv->len;
        return 0;
    }
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
    return EDL_ETIMEDOUT;
}

static void kv_clear(fake_kv *kv)
{
    free(kv->value);
    memset(kv, 0, sizeof *kv);
}

static coll_nccl_ctx ctx_for(fake_kv *kv, int64_t gen, int rank, int size, int timeout_ms)
{
    kv->generation = gen;
    coll_nccl_ctx ctx = {.rank = rank, .size = size, .generation = gen, .device = 0,
                         .timeout_ms = timeout_ms, .kv_put = kv_put, .kv_wait = kv_wait,
                         .arg = kv, .prev_rank = NULL};
    return ctx;
}

static coll_nccl *open_ok(const coll_nccl_ctx *ctx, coll_nccl *prev)
{
    coll_nccl *n = NULL;
    char msg[512] = "";
    int rc = coll_nccl_open(ctx, prev, &n, msg, sizeof msg);
    if (rc != 0)
        fail_msg("coll_nccl_open(generation %lld, rank %d of %d): %s: %s",
                 (long long)ctx->generation, ctx->rank, ctx->size, edl_strerror(rc), msg);
    assert_non_null(n);
    return n;
}

/* ---- host data and references -------------------------------------------------------------- */

static size_t esize(edl_dtype dt)
{
    switch (dt) {
    case EDL_FLOAT32: case EDL_INT32: return 4;
    case EDL_FLOAT16: case EDL_BFLOAT16: return 2;
    case EDL_INT64: return 8;
    case EDL_UINT8: return 1;
    }
    return 0;
}

static const char *type_name(edl_dtype dt)
{
    static const char *const names[] = {"float32", "float16", "bfloat16", "int32", "int64",
                                        "uint8"};
    return (unsigned)dt < sizeof names / sizeof names[0] ? names[dt] : "?";
}

/* binary16 bits of a float that binary16 represents exactly (the test's values all are). */
static uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    if ((u & 0x7fffffff) == 0)
        return sign;
    int exp = (int)((u >> 23) & 0xff) - 127 + 15;
    return (uint16_t)(sign | (uint16_t)(exp << 10) | (uint16_t)((u >> 13) & 0x3ff));
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16); /* exact for the test's values: no rounding needed */
}

/* Element i of rank `rank`'s input: small multiples of 1/4 (exact in every type) with both
 * signs, so a wrong offset, type or operation shows. */
static void fill(edl_dtype dt, void *buf, size_t count, int rank, int salt)
{
    for (size_t i = 0; i < count; i++) {
        int v = (int)((i * 7 + (size_t)rank * 13 + (size_t)salt * 31) % 101) - 50;
        float f = (float)v * 0.25f;
        switch (dt) {
        case EDL_FLOAT32: ((float *)buf)[i] = f; break;
        case EDL_FLOAT16: ((uint16_t *)buf)[i] = f32_to_f16(f); break;
        case EDL_BFLOAT16: ((uint16_t *)buf)[i] = f32_to_bf16(f); break;
        case EDL_INT32: ((int32_t *)buf)[i] = v * 1000; break;
        case EDL_INT64: ((int64_t *)buf)[i] = (int64_t)v * 4000000000LL; break;
        case EDL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
        }
    }
}

/* The reduction of `nranks` inputs made by fill(). Exact here: the sums of a few multiples of
 * 1/4 below 2^8 are representable in every floating type; integer AVG truncates. */
static void reference(edl_dtype dt, edl_redop op, void *out, size_t count, int nranks, int salt)
{
    for (size_t i = 0; i < count; i++) {
        double acc = 0;
        int64_t iacc = 0;
        for (int r = 0; r < nranks; r++) {
            int v = (int)((i * 7 + (size_t)r * 13 + (size_t)salt * 31) % 101) - 50;
            int64_t iv = dt == EDL_INT32 ? (int64_t)v * 1000 : (int64_t)v * 4000000000LL;
            double fv = v * 0.25;
            if (op == EDL_MAX) {
                acc = r == 0 || fv > acc ? fv : acc;
                iacc = r == 0 || iv > iacc ? iv : iacc;
            } else {
                acc += fv;
                iacc += iv;
            }
        }
        if (op == EDL_AVG) {
            acc /= nranks;
            iacc /= nranks;
        }
        switch (dt) {
        case EDL_FLOAT32: ((float *)out)[i] = (float)acc; break;
        case EDL_FLOAT16: ((uint16_t *)out)[i] = f32_to_f16((float)acc); break;
        case EDL_BFLOAT16: ((uint16_t *)out)[i] = f32_to_bf16((float)acc); break;
        case EDL_INT32: ((int32_t *)out)[i] = (int32_t)iacc; break;
        case EDL_INT64: ((int64_t *)out)[i] = iacc; break;
        case EDL_UINT8: break;
        }
    }
}

/* ---- device buffers ------------------------------------------------------------------------ */

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess)
        fail_msg("cudaMalloc(%zu): %s", bytes, cudaGetErrorString(e));
    return p;
}

static void to_dev(void *d, const void *h, size_t bytes)
{
    cudaError_t e = cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess)
        fail_msg("cudaMemcpy to device: %s", cudaGetErrorString(e));
}

static void expect_dev(const void *d, const void *want, size_t bytes, const char *what,
                       edl_dtype dt, size_t count)
{
    char *h = malloc(bytes ? bytes : 1);
    assert_non_null(h);
    cudaError_t e = cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess)
        fail_msg("cudaMemcpy to host: %s", cudaGetErrorString(e));
    if (memcmp(h, want, bytes) != 0) {
        size_t es = esize(dt), i = 0;
        while (i < count && memcmp(h + i * es, (const char *)want + i * es, es) == 0)
            i++;
        fail_msg("%s (%s, count %zu): element %zu differs from the host reference", what,
                 type_name(dt), count, i);
    }
    free(h);
}

static void coll_ok(int rc, const char *what, const char *msg)
{
    if (rc != 0)
        fail_msg("%s: %s: %s", what, edl_strerror(rc), msg);
}

/* Every collective of a one-rank communicator on `count` elements of `dt`, out of place and
 * in place, against the host reference. */
static void check_collectives(coll_nccl *n, edl_dtype dt, size_t count)
{
    const int T = 10000;
    size_t bytes = count * esize(dt);
    char *h_in = malloc(bytes), *h_want = malloc(bytes);
    assert_non_null(h_in);
    assert_non_null(h_want);
    void *d_send = dev_alloc(bytes), *d_recv = dev_alloc(bytes);
    char msg[512] = "";
    fill(dt, h_in, count, 0, (int)dt);
    to_dev(d_send, h_in, bytes);

    static const edl_redop ops[] = {EDL_SUM, EDL_AVG, EDL_MAX};
    static const char *const names[] = {"allreduce sum", "allreduce avg", "allreduce max"};
    for (size_t k = 0; k < 3; k++) {
        coll_ok(coll_nccl_allreduce(n, d_send, d_recv, count, dt, ops[k], T, msg, sizeof msg),
                names[k], msg);
        reference(dt, ops[k], h_want, count, 1, (int)dt);
        expect_dev(d_recv, h_want, bytes, names[k], dt, count);
    }
    to_dev(d_recv, h_in, bytes); /* in place */
    coll_ok(coll_nccl_allreduce(n, d_recv, d_recv, count, dt, EDL_SUM, T, msg, sizeof msg),
            "allreduce in place", msg);
    expect_dev(d_recv, h_in, bytes, "allreduce in place", dt, count);

    cudaMemset(d_recv, 0, bytes);
    coll_ok(coll_nccl_broadcast(n, d_send, d_recv, count, dt, 0, T, msg, sizeof msg),
            "broadcast", msg);
    expect_dev(d_recv, h_in, bytes, "broadcast", dt, count);

    cudaMemset(d_recv, 0, bytes);
    coll_ok(coll_nccl_allgather(n, d_send, d_recv, count, dt, T, msg, sizeof msg),
            "allgather", msg);
    expect_dev(d_recv, h_in, bytes, "allgather", dt, count);

    cudaMemset(d_recv, 0, bytes);
    coll_ok(coll_nccl_reduce_scatter(n, d_send, d_recv, count, dt, EDL_SUM, T, msg, sizeof msg),
            "reduce_scatter", msg);
    reference(dt, EDL_SUM, h_want, count, 1, (int)dt);
    expect_dev(d_recv, h_want, bytes, "reduce_scatter", dt, count);

    cudaFree(d_send);
    cudaFree(d_recv);
    free(h_in);
    free(h_want);
}

static void check_all_types(coll_nccl *n)
{
    static const edl_dtype types[] = {EDL_FLOAT32, EDL_FLOAT16, EDL_BFLOAT16, EDL_INT32,
                                      EDL_INT64};
    static const size_t counts[] = {1, 7, 1000003};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
            check_collectives(n, types[t], counts[c]);
}

/* ---- tests --------------------------------------------------------------------------------- */

static void test_world_of_one_collectives_match_host_reference(void **state)
{
    (void)state;
    fake_kv kv = {0};
    coll_nccl_ctx ctx = ctx_for(&kv, 1, 0, 1, 20000);
    coll_nccl *n = open_ok(&ctx, NULL);
    assert_int_equal(kv.puts, 1); /* rank 0 published the id under its generation */
    assert_int_equal(kv.len, sizeof(ncclUniqueId));
    check_all_types(n);
    coll_nccl_abort(n);
    kv_clear(&kv);
}

static void test_uint8_is_moved_not_reduced(void **state)
{
    (void)state;
    fake_kv kv = {0};
    coll_nccl_ctx ctx = ctx_for(&kv, 1, 0, 1, 20000);
    coll_nccl *n = open_ok(&ctx, NULL);
    char msg[512] = "", h[7];
    fill(EDL_UINT8, h, sizeof h, 0, 3);
    void *d_send = dev_alloc(sizeof h), *d_recv = dev_alloc(sizeof h);
    to_dev(d_send, h, sizeof h);
    coll_ok(coll_nccl_broadcast(n, d_send, d_recv, sizeof h, EDL_UINT8, 0, 10000, msg,
                                sizeof msg), "broadcast uint8", msg);
    expect_dev(d_recv, h, sizeof h, "broadcast uint8", EDL_UINT8, sizeof h);
    coll_ok(coll_nccl_allgather(n, d_send, d_recv, sizeof h, EDL_UINT8, 10000, msg, sizeof msg),
            "allgather uint8", msg);
    expect_dev(d_recv, h, sizeof h, "allgather uint8", EDL_UINT8, sizeof h);
    assert_int_equal(coll_nccl_allreduce(n, d_send, d_recv, sizeof h, EDL_UINT8, EDL_SUM, 10000,
                                         msg, sizeof msg), EDL_EINVAL);
    assert_int_equal(coll_nccl_broadcast(n, d_send, d_recv, 1, EDL_FLOAT32, 1, 10000, msg,
                                         sizeof msg), EDL_EINVAL); /* root 1 of 1 */
    /* EDL_EINVAL sends nothing: the communicator still works. */
    coll_ok(coll_nccl_broadcast(n, d_send, d_recv, sizeof h, EDL_UINT8, 0, 10000, msg,
                                sizeof msg), "broadcast after EINVAL", msg);
    cudaFree(d_send);
    cudaFree(d_recv);
    coll_nccl_abort(n);
    kv_clear(&kv);
}

static void test_new_generation_rebuilds_from_previous(void **state)
{
    (void)state;
    fake_kv kv1 = {0}, kv2 = {0}, kv3 = {0};
    coll_nccl_ctx c1 = ctx_for(&kv1, 1, 0, 1, 20000);
    coll_nccl *n1 = open_ok(&c1, NULL);

    /* Every member survived at its rank (prev_rank = {0}): nothing to rebuild, the
     * communicator is kept (NCCL refuses to shrink by nobody), and no new id is made. */
    static const int prev_rank[] = {0};
    coll_nccl_ctx c2 = ctx_for(&kv2, 2, 0, 1, 20000);
    c2.prev_rank = prev_rank;
    coll_nccl *n2 = open_ok(&c2, n1); /* n1 is consumed */
    assert_ptr_equal(n2, n1);
    assert_int_equal(kv2.puts, 0);
    check_collectives(n2, EDL_FLOAT32, 1000003);
    check_collectives(n2, EDL_INT64, 7);

    /* Someone new (prev_rank NULL): a fresh id under generation 3. */
    coll_nccl_ctx c3 = ctx_for(&kv3, 3, 0, 1, 20000);
    coll_nccl *n3 = open_ok(&c3, n2);
    assert_int_equal(kv3.puts, 1);
    check_collectives(n3, EDL_BFLOAT16, 1000003);
    coll_nccl_abort(n3);
    kv_clear(&kv1);
    kv_clear(&kv2);
    kv_clear(&kv3);
}

static void test_init_of_missing_member_is_aborted_at_deadline(void **state)
{
    (void)state;
    const int timeout_ms = 2000;
    fake_kv kv = {0};
    coll_nccl_ctx ctx = ctx_for(&kv, 5, 0, 2, timeout_ms); /* rank 1 never comes */
    coll_nccl *n = NULL;
    char msg[512] = "";
    int64_t t0 = edl_monotonic_ms();
    int rc = coll_nccl_open(&ctx, NULL, &n, msg, sizeof msg);
    int64_t took = edl_monotonic_ms() - t0;
    print_message("pending init: %s after %lld ms: %s\n", edl_strerror(rc), (long long)took,
                  msg);
    assert_int_equal(rc, EDL_ETIMEDOUT);
    assert_null(n);
    assert_true(took >= timeout_ms - 50 && took <= timeout_ms + 1000);
    assert_non_null(strstr(msg, "ncclCommInitRankConfig"));

    /* The process is still fine: a new communicator works. */
    fake_kv kv2 = {0};
    coll_nccl_ctx c2 = ctx_for(&kv2, 6, 0, 1, 20000);
    coll_nccl *n2 = open_ok(&c2, NULL);
    check_collectives(n2, EDL_INT32, 1000003);
    coll_nccl_abort(n2);
    kv_clear(&kv);
    kv_clear(&kv2);
}

static void test_unique_id_that_never_arrives_times_out(void **state)
{
    (void)state;
    fake_kv kv = {0}; /* rank 0 never publishes */
    coll_nccl_ctx ctx = ctx_for(&kv, 7, 1, 2, 500);
    coll_nccl *n = NULL;
    char msg[512] = "";
    int64_t t0 = edl_monotonic_ms();
    int rc = coll_nccl_open(&ctx, NULL, &n, msg, sizeof msg);
    int64_t took = edl_monotonic_ms() - t0;
    assert_int_equal(rc, EDL_ETIMEDOUT);
    assert_null(n);
    assert_true(took <= 1500);
    assert_non_null(strstr(msg, "unique id"));
    kv_clear(&kv);
}

static void test_abort_of_null_is_harmless(void **state)
{
    (void)state;
    coll_nccl_abort(NULL);
}

int main(void)
{
    if (!coll_nccl_usable()) {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        printf("test_nccl: skipped: no CUDA device (cudaGetDeviceCount: %s, %d devices)\n",
               cudaGetErrorString(e), n);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_abort_of_null_is_harmless),
        cmocka_unit_test(test_world_of_one_collectives_match_host_reference),
        cmocka_unit_test(test_uint8_is_moved_not_reduced),
        cmocka_unit_test(test_new_generation_rebuilds_from_previous),
        cmocka_unit_test(test_init_of_missing_member_is_aborted_at_deadline),
        cmocka_unit_test(test_unique_id_that_never_arrives_times_out),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

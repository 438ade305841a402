/* coll_worker: a trainer process for test_collective. Modes:
 *   verify        every collective, type, reduction and odd size against a local reference
 *                 (data is a function of rank and index), plus bad arguments; prints
 *                 "verify ok: N checks" or the first wrong element, exit 0 / 1.
 *   elastic STEPS an elastic loop: each step allreduces the contributions of a fixed global
 *                 batch of 12 samples (sample k on rank k % size) into int64 state, commits, and
 *                 re-forms / re-syncs when told; the final state does not depend on how often
 *                 or at which sizes the group re-formed. Prints event lines (see below).
 *   mismatch      rank 0 calls allreduce of 10 int32, rank 1 of 11 (or float32 with
 *                 EDL_TEST_MISMATCH=type); prints the error.
 * Event lines: "joined", "failed", "synced", "done" with key=value fields, flushed at once;
 * with EDL_TEST_STEP_LINES=1 also "stepped step=S gen=G rank=R" after each step, for a test
 * to wait on training being under way.
 * EDL_TEST_ELEMS: elements of the elastic state (default 1000); EDL_TEST_STEP_MS: a pause per
 * step; EDL_TEST_STUCK_AT=S: in a first start (TORCHELASTIC_RESTART_COUNT 0) the last rank stops
 * at step S for ever, outside any collective, so its peers wait inside one (a hang);
 * EDL_TEST_EXIT_ON_FAILURE=1: a failed collective ends the process with exit 1, as an
 * unmodified torchrun trainer does, instead of re-forming in process. EDL_TEST_CUT_LINK=N: a
 * broken link (see __wrap_send below). */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "edl/collective.h"

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- verify ------------------------------------------------------------------------------- */

static int value(int r, size_t i)
{
    return (int)((r * 7 + i * 13) % 17) - 8; /* small integers: exact in every type */
}

static double get(const void *p, edl_dtype dt, size_t i)
{
    switch (dt) {
    case EDL_FLOAT32: return ((const float *)p)[i];
    case EDL_INT32: return ((const int32_t *)p)[i];
    case EDL_INT64: return (double)((const int64_t *)p)[i];
    case EDL_UINT8: return ((const uint8_t *)p)[i];
    case EDL_FLOAT16: {
        uint16_t h = ((const uint16_t *)p)[i];
        int e = (h >> 10) & 0x1f, m = h & 0x3ff;
        double v = e ? (1024 + m) * ldexp(1.0, e - 25) : m * ldexp(1.0, -24);
        return (h & 0x8000) ? -v : v;
    }
    case EDL_BFLOAT16: {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    }
    return 0;
}

/* Small integers only (|v| < 2048), which every type holds exactly. */
static void put(void *p, edl_dtype dt, size_t i, int v)
{
    switch (dt) {
    case EDL_FLOAT32: ((float *)p)[i] = (float)v; break;
    case EDL_INT32: ((int32_t *)p)[i] = v; break;
    case EDL_INT64: ((int64_t *)p)[i] = v; break;
    case EDL_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case EDL_FLOAT16: {
        uint16_t h = 0;
        if (v) {
            unsigned a = (unsigned)abs(v);
            int e = 0;
            while ((a >> e) > 1)
                e++;
            h = (uint16_t)(((e + 15) << 10) | ((a << (10 - e)) & 0x3ff));
            if (v < 0)
                h |= 0x8000;
        }
        ((uint16_t *)p)[i] = h;
        break;
    }
    case EDL_BFLOAT16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
        break;
    }
    }
}

static long checks;
static int failures;

static void expect(bool ok, const char *what, size_t i, double got, double want)
{
    checks++;
    if (!ok && failures++ < 5)
        printf("verify FAIL %s at [%zu]: got %g, want %g\n", what, i, got, want);
}

static double reduce_ref(int n, size_t i, edl_redop op, edl_dtype dt)
{
    double s = 0, m = -1e300;
    for (int r = 0; r < n; r++) {
        s += value(r, i);
        m = value(r, i) > m ? value(r, i) : m;
    }
    if (op == EDL_MAX)
        return m;
    if (op == EDL_AVG)
        return dt == EDL_INT32 || dt == EDL_INT64 ? (double)((long)s / n) : s / n;
    return s;
}

static bool close_to(double got, double want, edl_dtype dt, edl_redop op)
{
    if (op != EDL_AVG || dt == EDL_INT32 || dt == EDL_INT64 || dt == EDL_FLOAT32)
        return op == EDL_AVG && dt == EDL_FLOAT32 ? fabs(got - want) <= 1e-6 * (1 + fabs(want))
                                                  : got == want;
    return fabs(got - want) <= (dt == EDL_FLOAT16 ? 2e-3 : 1.6e-2) * (1 + fabs(want));
}

static void verify_allreduce(edl_comm *c, edl_dtype dt, edl_redop op, size_t count, bool inplace)
{
    int n = edl_coll_size(c), r = edl_coll_rank(c);
    size_t es = edl_dtype_size(dt);
    char *in = malloc(count * es + 1), *out = inplace ? in : malloc(count * es + 1);
    for (size_t i = 0; i < count; i++)
        put(in, dt, i, value(r, i));
    char what[96];
    snprintf(what, sizeof what, "allreduce %s %s count %zu%s", edl_dtype_name(dt),
             op == EDL_SUM ? "sum" : op == EDL_AVG ? "avg" : "max", count,
             inplace ? " in place" : "");
    int rc = edl_allreduce(c, in, out, count, dt, op);
    expect(rc == 0, what, 0, rc, 0);
    for (size_t i = 0; rc == 0 && i < count; i++) {
        double want = reduce_ref(n, i, op, dt), got = get(out, dt, i);
        if (!close_to(got, want, dt, op)) {
            expect(false, what, i, got, want);
            break;
        }
    }
    checks++;
    if (!inplace)
        free(out);
    free(in);
}

static void verify_broadcast(edl_comm *c, edl_dtype dt, size_t count, int root)
{
    int r = edl_coll_rank(c);
    size_t es = edl_dtype_size(dt);
    char *buf = malloc(count * es + 1), *src = malloc(count * es + 1);
    for (size_t i = 0; i < count; i++) {
        put(src, dt, i, dt == EDL_UINT8 ? (value(root, i) + 8) : value(root, i));
        put(buf, dt, i, 99);
    }
    char what[96];
    snprintf(what, sizeof what, "broadcast %s count %zu root %d", edl_dtype_name(dt), count, root);
    int rc = edl_broadcast(c, r == root ? src : NULL, buf, count, dt, root);
    expect(rc == 0, what, 0, rc, 0);
    if (rc == 0 && count && memcmp(buf, src, count * es) != 0)
        expect(false, what, 0, get(buf, dt, 0), get(src, dt, 0));
    free(buf);
    free(src);
}

static void verify_allgather(edl_comm *c, edl_dtype dt, size_t count)
{
    int n = edl_coll_size(c), r = edl_coll_rank(c);
    size_t es = edl_dtype_size(dt);
    char *in = malloc(count * es + 1), *out = malloc(count * es * (size_t)n + 1);
    for (size_t i = 0; i < count; i++)
        put(in, dt, i, value(r, i));
    char what[96];
    snprintf(what, sizeof what, "allgather %s count %zu", edl_dtype_name(dt), count);
    int rc = edl_allgather(c, in, out, count, dt);
    expect(rc == 0, what, 0, rc, 0);
    for (int b = 0; rc == 0 && b < n; b++)
        for (size_t i = 0; i < count; i++)
            if (get(out, dt, (size_t)b * count + i) != value(b, i)) {
                expect(false, what, (size_t)b * count + i, get(out, dt, (size_t)b * count + i),
                       value(b, i));
                b = n;
                break;
            }
    checks++;
    free(in);
    free(out);
}

static void verify_reduce_scatter(edl_comm *c, edl_dtype dt, edl_redop op, size_t count)
{
    int n = edl_coll_size(c), r = edl_coll_rank(c);
    size_t es = edl_dtype_size(dt), total = count * (size_t)n;
    char *in = malloc(total * es + 1), *out = malloc(count * es + 1);
    for (size_t i = 0; i < total; i++)
        put(in, dt, i, value(r, i));
    char what[96];
    snprintf(what, sizeof what, "reduce_scatter %s %s count %zu", edl_dtype_name(dt),
             op == EDL_SUM ? "sum" : op == EDL_AVG ? "avg" : "max", count);
    int rc = edl_reduce_scatter(c, in, out, count, dt, op);
    expect(rc == 0, what, 0, rc, 0);
    for (size_t i = 0; rc == 0 && i < count; i++) {
        double want = reduce_ref(n, (size_t)r * count + i, op, dt), got = get(out, dt, i);
        if (!close_to(got, want, dt, op)) {
            expect(false, what, i, got, want);
            break;
        }
    }
    checks++;
    free(in);
    free(out);
}

/* Bad arguments fail with EDL_EINVAL before anything is sent, and the group stays usable. */
static void verify_bad_args(edl_comm *c)
{
    float f[4] = {0};
    int n = edl_coll_size(c);
    expect(edl_allreduce(c, f, f, 4, (edl_dtype)42, EDL_SUM) == EDL_EINVAL, "bad dtype", 0, 0, 0);
    expect(edl_allreduce(c, f, f, 4, EDL_FLOAT32, (edl_redop)9) == EDL_EINVAL, "bad op", 0, 0, 0);
    expect(edl_allreduce(c, f, f, 4, EDL_UINT8, EDL_SUM) == EDL_EINVAL, "uint8 sum", 0, 0, 0);
    expect(edl_allreduce(c, NULL, f, 4, EDL_FLOAT32, EDL_SUM) == EDL_EINVAL, "NULL", 0, 0, 0);
    expect(edl_broadcast(c, f, f, 4, EDL_FLOAT32, n) == EDL_EINVAL, "bad root", 0, 0, 0);
    expect(edl_broadcast(c, f, f, 4, EDL_FLOAT32, -1) == EDL_EINVAL, "bad root", 0, 0, 0);
    expect(edl_allreduce(c, f, f, (size_t)1 << 62, EDL_FLOAT32, EDL_SUM) == EDL_EINVAL,
           "hostile count", 0, 0, 0);
    expect(edl_allreduce(NULL, f, f, 4, EDL_FLOAT32, EDL_SUM) == EDL_EINVAL, "NULL comm", 0, 0, 0);
}

static int run_verify(edl_comm *c)
{
    static const edl_dtype types[] = {EDL_FLOAT32, EDL_FLOAT16, EDL_BFLOAT16, EDL_INT32, EDL_INT64};
    static const size_t counts[] = {0, 1, 3, 7, 1000, 12289, 100003};
    verify_bad_args(c);
    for (size_t t = 0; t < 5; t++)
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
            for (int op = EDL_SUM; op <= EDL_MAX; op++) {
                verify_allreduce(c, types[t], (edl_redop)op, counts[k], false);
                verify_allreduce(c, types[t], (edl_redop)op, counts[k], true);
            }
    for (int root = 0; root < edl_coll_size(c); root++) {
        verify_broadcast(c, EDL_UINT8, 1, root);
        verify_broadcast(c, EDL_FLOAT32, 7, root);
        verify_broadcast(c, EDL_INT64, 100003, root);
    }
    for (size_t t = 0; t < 5; t++) {
        verify_allgather(c, types[t], 1);
        verify_allgather(c, types[t], 7);
        verify_allgather(c, types[t], 30001);
        for (int op = EDL_SUM; op <= EDL_MAX; op++) {
            verify_reduce_scatter(c, types[t], (edl_redop)op, 1);
            verify_reduce_scatter(c, types[t], (edl_redop)op, 30001);
        }
    }
    expect(edl_barrier(c) == 0, "barrier", 0, 0, 0);
    verify_bad_args(c); /* still usable after a whole matrix */
    float one = 1, sum = 0;
    expect(edl_allreduce(c, &one, &sum, 1, EDL_FLOAT32, EDL_SUM) == 0 &&
               sum == (float)edl_coll_size(c), "allreduce after bad arguments", 0, sum,
           edl_coll_size(c));
    if (failures) {
        printf("verify FAILED: %d of %ld checks\n", failures, checks);
        return 1;
    }
    printf("verify ok: %ld checks, rank %d of %d\n", checks, edl_coll_rank(c), edl_coll_size(c));
    return 0;
}

/* ---- elastic ------------------------------------------------------------------------------ */

static uint64_t hash64(const int64_t *w, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint64_t)w[i]) * 1099511628211ull;
    return h;
}

static bool stuck_here(int64_t step, int rank, int size)
{
    const char *at = getenv("EDL_TEST_STUCK_AT"), *rc = getenv("TORCHELASTIC_RESTART_COUNT");
    return at && rc && strcmp(rc, "0") == 0 && size > 1 && rank == size - 1 && step == atol(at);
}

static int run_elastic(edl_comm *c, long steps)
{
    const char *e = getenv("EDL_TEST_ELEMS"), *p = getenv("EDL_TEST_STEP_MS");
    size_t n = e ? (size_t)atol(e) : 1000;
    int pause_ms = p ? atoi(p) : 0;
    bool step_lines = getenv("EDL_TEST_STEP_LINES") != NULL;
    int64_t *w = calloc(n, sizeof *w), *g = calloc(n, sizeof *g), step = 0;
    edl_coll_state *st;
    edl_coll_state_new(&st);
    edl_coll_state_add(st, "w", w, n * sizeof *w);
    edl_coll_state_commit(st, 0);
    printf("joined gen=%" PRId64 " rank=%d size=%d pid=%d\n", edl_coll_generation(c),
           edl_coll_rank(c), edl_coll_size(c), (int)getpid());
    fflush(stdout);
    while (step < steps) {
        int rc = edl_coll_check(c);
        if (rc == EDL_COLL_REFORMED) {
            int64_t t0 = now_ms();
            rc = edl_coll_state_sync(st, c, &step);
            printf("synced gen=%" PRId64 " rank=%d size=%d step=%" PRId64 " hash=%016" PRIx64
                   " ms=%" PRId64 " rc=%d t=%" PRId64 "\n", edl_coll_generation(c),
                   edl_coll_rank(c), edl_coll_size(c), step, hash64(w, n), now_ms() - t0, rc,
                   now_ms());
            fflush(stdout);
            if (rc)
                continue; /* the group broke again: the next check re-forms */
        } else if (rc < 0) {
            printf("stopped rc=%d (%s)\n", rc, edl_coll_errmsg(c));
            return 3;
        }
        int size = edl_coll_size(c), rank = edl_coll_rank(c);
        if (stuck_here(step, rank, size))
            for (;;)
                pause(); /* for ever: only a signal that ends the process ends this */
        memset(g, 0, n * sizeof *g);
        for (int k = rank; k < 12; k += size)
            for (size_t i = 0; i < n; i++)
                g[i] += (int64_t)((step * 31 + k * 17 + (int64_t)i) % 11) - 5;
        int64_t t0 = now_ms();
        rc = edl_allreduce(c, g, g, n, EDL_INT64, EDL_SUM);
        if (rc) {
            printf("failed gen=%" PRId64 " rank=%d step=%" PRId64 " rc=%d t=%" PRId64
                   " waited=%" PRId64 " err=%s\n", edl_coll_generation(c), rank, step, rc,
                   now_ms(), now_ms() - t0, edl_coll_errmsg(c));
            fflush(stdout);
            if (getenv("EDL_TEST_EXIT_ON_FAILURE")) {
                step = -1; /* out of the loop, and reported as failed below */
                break;
            }
            continue;
        }
        for (size_t i = 0; i < n; i++)
            w[i] += g[i] * (int64_t)(1 + step % 3);
        step++;
        edl_coll_state_commit(st, step);
        edl_agent_link_report_step(edl_coll_agent_link(c), step);
        if (step_lines) {
            printf("stepped step=%" PRId64 " gen=%" PRId64 " rank=%d\n", step,
                   edl_coll_generation(c), rank);
            fflush(stdout);
        }
        if (pause_ms)
            usleep((useconds_t)pause_ms * 1000);
    }
    if (step >= 0)
        printf("done gen=%" PRId64 " rank=%d size=%d step=%" PRId64 " hash=%016" PRIx64
               " pid=%d\n", edl_coll_generation(c), edl_coll_rank(c), edl_coll_size(c), step,
               hash64(w, n), (int)getpid());
    fflush(stdout);
    edl_coll_state_free(st);
    free(w);
    free(g);
    return step >= 0 ? 0 : 1;
}

static int run_mismatch(edl_comm *c)
{
    bool type = getenv("EDL_TEST_MISMATCH") && strcmp(getenv("EDL_TEST_MISMATCH"), "type") == 0;
    int32_t buf[11] = {0};
    int r = edl_coll_rank(c);
    int rc = edl_allreduce(c, buf, buf, type ? 10 : (size_t)(10 + (r == 1)),
                           type && r == 1 ? EDL_FLOAT32 : EDL_INT32, EDL_SUM);
    printf("mismatch rank=%d rc=%d err=%s\n", r, rc, edl_coll_errmsg(c));
    return rc ? 0 : 1;
}

/* ---- fault injection ------------------------------------------------------------------------ */

/* This program is linked with --wrap=connect and --wrap=send, which reroute libedlcoll's own
 * calls (libcurl's, in a shared library, are not affected). With EDL_TEST_CUT_LINK=N the first
 * connection libedlcoll opens (this rank's link to rank 0) is shut down right after its N-th
 * send: the handshake (hello, proof: N = 2) reaches rank 0, then the link is dead, as when a
 * middlebox drops it or rank 0 holds a connection that is not this process. With
 * EDL_TEST_CONNECT_DELAY_MS=M the first connection waits M ms first (a slow peer). */
int __real_connect(int fd, const struct sockaddr *sa, socklen_t len);
ssize_t __real_send(int fd, const void *buf, size_t len, int flags);
static int cut_fd = -1, cut_sends;
static bool cut_armed = true;

int __wrap_connect(int fd, const struct sockaddr *sa, socklen_t len);
int __wrap_connect(int fd, const struct sockaddr *sa, socklen_t len)
{
    static bool delayed;
    const char *delay = getenv("EDL_TEST_CONNECT_DELAY_MS");
    if (!delayed && delay) {
        delayed = true;
        usleep((useconds_t)atoi(delay) * 1000);
    }
    if (cut_armed && getenv("EDL_TEST_CUT_LINK")) {
        cut_fd = fd;
        cut_armed = false;
    }
    return __real_connect(fd, sa, len);
}

ssize_t __wrap_send(int fd, const void *buf, size_t len, int flags);
ssize_t __wrap_send(int fd, const void *buf, size_t len, int flags)
{
    ssize_t n = __real_send(fd, buf, len, flags);
    if (fd == cut_fd && ++cut_sends == atoi(getenv("EDL_TEST_CUT_LINK"))) {
        shutdown(fd, SHUT_RDWR);
        cut_fd = -1;
    }
    return n;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: coll_worker verify|elastic STEPS|mismatch\n");
        return 2;
    }
    edl_comm *c;
    int rc = edl_coll_open(NULL, &c);
    if (rc) {
        printf("init failed rc=%d (%s)\n", rc, edl_strerror(rc));
        return 4;
    }
    if (strcmp(argv[1], "verify") == 0)
        rc = run_verify(c);
    else if (strcmp(argv[1], "elastic") == 0 && argc > 2)
        rc = run_elastic(c, atol(argv[2]));
    else if (strcmp(argv[1], "mismatch") == 0)
        rc = run_mismatch(c);
    else
        rc = 2;
    edl_coll_close(c);
    return rc;
}

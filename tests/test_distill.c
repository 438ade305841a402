/* test_distill.c: the student's client of teachers (libedldistill) against real teachers
 * (examples/distill --role teacher processes on loopback) and hostile ones (harness_http):
 * every batch is delivered exactly once with the teacher's predictions (checked against the
 * same model trained in this process), in order when asked, when teachers are killed, hang,
 * answer garbage or errors, close connections, appear late or are removed; a batch that no
 * teacher answers ends with a status that names the teachers and what each did, and the
 * example's student whose every teacher is bad (NaN, hanging) stops within its budget. Then
 * the wire forms byte by byte, and the teacher's own HTTP surface. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "edl/distill.h"
#include "harness.h"
#include "mlp.h"

#define ROWS 8      /* samples a batch */
#define MAX_IDS 1024

/* ---- the teacher's model, trained here as examples/distill trains it ----------------------- */

static data *g_data;
static float g_params[NP];

static void train_reference(void)
{
    static float g[NP];
    g_data = malloc(sizeof *g_data);
    assert_non_null(g_data);
    make_data(g_data);
    init_params(g_params);
    for (long step = 0; step < 1500; step++) {
        memset(g, 0, sizeof g);
        for (int k = 0; k < BATCH; k++) {
            int i = (int)((step * BATCH + k) % NTRAIN), hit;
            sample(g_params, g, g_data->x[i], g_data->y[i], &hit);
        }
        for (int i = 0; i < NP; i++)
            g_params[i] -= 0.2f * g[i] / BATCH;
    }
}

static void batch_inputs(uint64_t id, float *x)
{
    for (int i = 0; i < ROWS; i++)
        memcpy(x + i * D, g_data->x[(id * ROWS + (uint64_t)i) % NTRAIN], sizeof g_data->x[0]);
}

/* ---- teachers as processes --------------------------------------------------------------- */

typedef struct teacher {
    pid_t pid;
    char url[64], log[128];
} teacher;

static void teacher_start(teacher *t, int service_ms)
{
    static int n;
    char ms[16];
    snprintf(ms, sizeof ms, "%d", service_ms);
    snprintf(t->log, sizeof t->log, "/tmp/test_distill.%d.%d.log", (int)getpid(), n++);
    unlink(t->log);
    const char *argv[] = {EDL_DISTILL_BIN, "--role", "teacher", "--port", "0",
                          "--service-time-ms", ms, NULL};
    t->pid = harness_spawn(argv, t->log);
    assert_true(t->pid > 0);
    char buf[4096];
    for (int64_t end = harness_now_ms() + 30000; harness_now_ms() < end; harness_sleep_ms(20)) {
        const char *at = strstr(harness_read_file(t->log, buf, sizeof buf), "on http://");
        if (at && strchr(at, '\n')) {
            snprintf(t->url, sizeof t->url, "%.*s", (int)strcspn(at + 3, "\n"), at + 3);
            return;
        }
    }
    fail_msg("teacher did not come up; its log: %s", buf);
}

static void teacher_stop(teacher *t)
{
    if (t->pid > 0) {
        kill(t->pid, SIGCONT);
        harness_kill(t->pid, SIGKILL);
        unlink(t->log);
    }
    t->pid = 0;
}

/* ---- delivery bookkeeping ---------------------------------------------------------------- */

typedef struct tally {
    edl_distill *d;
    int submitted, delivered;
    bool ordered;
    uint8_t seen[MAX_IDS];
    char teacher[MAX_IDS][128]; /* who answered each batch */
} tally;

static edl_distill *open_client(tally *t, edl_distill_opts o, const char *const *eps, size_t n)
{
    memset(t, 0, sizeof *t);
    t->ordered = o.ordered;
    if (!o.model)
        o.model = "default";
    assert_int_equal(edl_distill_open(&o, &t->d), 0);
    assert_int_equal(edl_distill_set_teachers(t->d, eps, n), 0);
    return t->d;
}

static void submit(tally *t, int n)
{
    float x[ROWS * D];
    for (int i = 0; i < n; i++) {
        uint64_t id;
        batch_inputs((uint64_t)t->submitted, x);
        assert_int_equal(edl_distill_submit(t->d, x, ROWS, D, &id), 0);
        assert_int_equal(id, t->submitted++);
    }
}

/* One delivered batch: a new id (in order when asked) with the model's predictions. */
static void check(tally *t, const edl_distill_result *r)
{
    assert_int_equal(r->status, 0);
    assert_true(r->id < (uint64_t)t->submitted);
    assert_int_equal(t->seen[r->id], 0);
    if (t->ordered)
        assert_int_equal(r->id, t->delivered);
    t->seen[r->id] = 1;
    snprintf(t->teacher[r->id], sizeof t->teacher[0], "%s", r->teacher);
    assert_int_equal(r->rows, ROWS);
    assert_int_equal(r->cols, C);
    float x[ROWS * D], q[C];
    batch_inputs(r->id, x);
    for (int i = 0; i < ROWS; i++) {
        mlp_probs(g_params, x + i * D, q);
        for (int c = 0; c < C; c++)
            assert_float_equal(q[c], r->out[i * C + c], 1e-5);
    }
    t->delivered++;
}

/* Deliver until `upto` batches are, within timeout_ms; fails the test otherwise. */
static void drain(tally *t, int upto, int timeout_ms)
{
    int64_t end = harness_now_ms() + timeout_ms;
    while (t->delivered < upto) {
        edl_distill_result r;
        int rc = edl_distill_next(t->d, 200, &r);
        if (rc == 0) {
            check(t, &r);
            edl_distill_result_clear(&r);
        } else
            assert_int_equal(rc, EDL_ETIMEDOUT);
        if (harness_now_ms() > end)
            fail_msg("%d of %d batches delivered in %d ms", t->delivered, upto, timeout_ms);
    }
}

static int answered_by(const tally *t, const char *url)
{
    int n = 0;
    for (int i = 0; i < t->submitted; i++)
        n += strcmp(t->teacher[i], url) == 0;
    return n;
}

static void done(tally *t)
{
    edl_distill_result r;
    assert_int_equal(edl_distill_pending(t->d), 0);
    assert_int_equal(edl_distill_next(t->d, 50, &r), EDL_ETIMEDOUT); /* nothing twice */
    edl_distill_stats s;
    edl_distill_get_stats(t->d, &s);
    assert_int_equal(s.submitted, t->submitted);
    assert_int_equal(s.delivered, t->submitted);
    assert_int_equal(s.failed, 0);
    edl_distill_close(t->d);
}

/* ---- delivery ---------------------------------------------------------------------------- */

static void test_batches_through_three_teachers_exactly_once_in_both_forms(void **state)
{
    (void)state;
    teacher th[3];
    for (int i = 0; i < 3; i++)
        teacher_start(&th[i], 0);
    const char *eps[] = {th[0].url, th[1].url, th[2].url};
    for (int f = EDL_DISTILL_JSON; f <= EDL_DISTILL_BINARY; f++) {
        tally *t = calloc(1, sizeof *t);
        open_client(t, (edl_distill_opts){.format = (edl_distill_format)f}, eps, 3);
        submit(t, 300);
        drain(t, 300, 30000);
        for (int i = 0; i < 3; i++)
            assert_true(answered_by(t, th[i].url) > 0); /* spread over every teacher */
        edl_distill_stats s;
        edl_distill_get_stats(t->d, &s);
        assert_int_equal(s.retried, 0);
        done(t);
        free(t);
    }
    for (int i = 0; i < 3; i++)
        teacher_stop(&th[i]);
}

static void test_ordered_delivery_follows_submission_order(void **state)
{
    (void)state;
    teacher fast, slow;
    teacher_start(&fast, 0);
    teacher_start(&slow, 30); /* its answers come late: later ids are ready before them */
    const char *eps[] = {fast.url, slow.url};
    tally *t = calloc(1, sizeof *t);
    open_client(t, (edl_distill_opts){.ordered = true, .format = EDL_DISTILL_BINARY}, eps, 2);
    submit(t, 100);
    drain(t, 100, 30000); /* check() asserts id == number delivered before */
    assert_true(answered_by(t, slow.url) > 0);
    done(t);
    free(t);
    teacher_stop(&fast);
    teacher_stop(&slow);
}

static void test_teacher_killed_with_batches_in_flight(void **state)
{
    (void)state;
    teacher th[3];
    for (int i = 0; i < 3; i++)
        teacher_start(&th[i], 20);
    const char *eps[] = {th[0].url, th[1].url, th[2].url};
    tally *t = calloc(1, sizeof *t);
    open_client(t, (edl_distill_opts){0}, eps, 3);
    submit(t, 240);
    drain(t, 30, 30000);
    harness_kill(th[0].pid, SIGKILL); /* with batches in flight there: 4 per teacher */
    th[0].pid = 0;
    unlink(th[0].log);
    drain(t, 240, 60000);
    edl_distill_stats s;
    edl_distill_get_stats(t->d, &s);
    assert_true(s.retried >= 1);
    assert_true(s.conn_errors >= 1);
    assert_true(answered_by(t, th[1].url) + answered_by(t, th[2].url) >= 240 - 30 - 8);
    done(t);
    free(t);
    for (int i = 0; i < 3; i++)
        teacher_stop(&th[i]);
}

static void test_hung_teacher_batches_go_elsewhere_after_timeout(void **state)
{
    (void)state;
    teacher th[2];
    for (int i = 0; i < 2; i++)
        teacher_start(&th[i], 5);
    const char *eps[] = {th[0].url, th[1].url};
    tally *t = calloc(1, sizeof *t);
    open_client(t, (edl_distill_opts){.timeout_ms = 500}, eps, 2);
    submit(t, 120);
    drain(t, 10, 30000);
    kill(th[0].pid, SIGSTOP); /* accepts connections (the kernel does), answers nothing */
    int64_t t0 = harness_now_ms();
    drain(t, 120, 30000);
    edl_distill_stats s;
    edl_distill_get_stats(t->d, &s);
    assert_true(s.timeouts >= 1);
    assert_true(s.retried >= s.timeouts);
    assert_true(harness_now_ms() - t0 < 15000);
    done(t);
    free(t);
    for (int i = 0; i < 2; i++)
        teacher_stop(&th[i]);
}

static void test_bad_answers_are_counted_and_batches_go_elsewhere(void **state)
{
    (void)state;
    teacher good;
    teacher_start(&good, 0);
    harness_http *garbage = harness_http_open(), *rows = harness_http_open(),
                 *err = harness_http_open(), *closer = harness_http_open();
    assert_non_null(garbage && rows && err && closer);
    harness_http_reply(garbage, 200, "{\"predictions\":[[0.1,", 21, HTTP_NORMAL);
    static const char one_row[] = "{\"predictions\":[[0.25,0.25,0.25,0.25]]}";
    harness_http_reply(rows, 200, one_row, sizeof one_row - 1, HTTP_NORMAL);
    harness_http_reply(err, 500, "{\"error\":\"boom\"}", 16, HTTP_NORMAL);
    harness_http_reply(closer, 200, "", 0, HTTP_CLOSE_NO_REPLY); /* a stranger hanging up */
    const char *eps[] = {harness_http_url(garbage), harness_http_url(rows),
                         harness_http_url(err), harness_http_url(closer), good.url};
    tally *t = calloc(1, sizeof *t);
    open_client(t, (edl_distill_opts){0}, eps, 5);
    submit(t, 100);
    drain(t, 100, 30000);
    edl_distill_stats s;
    edl_distill_get_stats(t->d, &s);
    assert_true(harness_http_requests(garbage) >= 1 && harness_http_requests(rows) >= 1);
    assert_true(harness_http_requests(err) >= 1 && harness_http_requests(closer) >= 1);
    assert_true(s.bad_replies >= 2);   /* the garbage and the wrong row count */
    assert_true(s.http_errors >= 1);   /* the 500 */
    assert_true(s.conn_errors >= 1);   /* the hang-up */
    assert_int_equal(s.retried, s.bad_replies + s.http_errors + s.conn_errors + s.timeouts);
    assert_int_equal(answered_by(t, good.url), 100); /* only real predictions were taken */
    done(t);
    free(t);
    harness_http_close(garbage), harness_http_close(rows);
    harness_http_close(err), harness_http_close(closer);
    teacher_stop(&good);
}

/* A reply of ROWS x cols floats, all 0.25 but for `odd` at index 3, in the given form (JSON
 * written by hand: the encoder refuses what is not finite). */
static size_t bad_reply(edl_distill_format f, uint32_t cols, float odd, char *out, size_t cap)
{
    size_t n = 0;
    if (f == EDL_DISTILL_BINARY) {
        uint32_t head[4] = {0, 1, ROWS, cols};
        memcpy(head, "EDLT", 4);
        memcpy(out, head, sizeof head); /* little-endian host: the build refuses others */
        for (uint32_t i = 0; i < ROWS * cols; i++) {
            float v = i == 3 ? odd : 0.25f;
            memcpy(out + 16 + 4 * i, &v, 4);
        }
        return 16 + 4 * (size_t)ROWS * cols;
    }
    n += (size_t)snprintf(out, cap, "{\"predictions\":[");
    for (uint32_t r = 0; r < ROWS; r++)
        for (uint32_t c = 0; c < cols; c++)
            n += (size_t)snprintf(out + n, cap - n, "%s%s%.9g%s", c ? "" : r ? ",[" : "[",
                                  c ? "," : "", r * cols + c == 3 ? (double)odd : 0.25,
                                  c + 1 == cols ? "]" : "");
    n += (size_t)snprintf(out + n, cap - n, "]}");
    return n;
}

/* A student that states its shape (C columns) and bound (probabilities: 1) takes no reply of
 * 1 or 7 columns, with NaN or infinity (binary) or with 3e38: each is a bad reply, counted, its
 * batch sent to another teacher, and every batch is delivered once from the good one. Under
 * ASan nothing reads past a result. */
static void test_replies_of_another_shape_or_with_bad_values_are_bad_replies(void **state)
{
    (void)state;
    teacher good;
    teacher_start(&good, 0);
    for (int f = EDL_DISTILL_JSON; f <= EDL_DISTILL_BINARY; f++) {
        const float odd[] = {0.25f, 0.25f, 3e38f, NAN, INFINITY};
        const uint32_t cols[] = {1, 7, C, C, C};
        int nbad = f == EDL_DISTILL_BINARY ? 5 : 3; /* JSON cannot carry NaN or infinity */
        harness_http *bad[5];
        const char *eps[6];
        char body[4096];
        for (int i = 0; i < nbad; i++) {
            assert_non_null(bad[i] = harness_http_open());
            size_t len = bad_reply((edl_distill_format)f, cols[i], odd[i], body, sizeof body);
            harness_http_reply(bad[i], 200, body, len, HTTP_NORMAL);
            eps[i] = harness_http_url(bad[i]);
        }
        eps[nbad] = good.url;
        tally *t = calloc(1, sizeof *t);
        open_client(t, (edl_distill_opts){.format = (edl_distill_format)f, .cols = C,
                                          .max_abs = 1}, eps, (size_t)nbad + 1);
        submit(t, 60);
        drain(t, 60, 30000);
        edl_distill_stats s;
        edl_distill_get_stats(t->d, &s);
        for (int i = 0; i < nbad; i++)
            if (harness_http_requests(bad[i]) < 1)
                fail_msg("form %d: bad teacher %d was never asked", f, i);
        print_message("form %d: %llu bad replies counted, %llu retried\n", f,
                      (unsigned long long)s.bad_replies, (unsigned long long)s.retried);
        assert_true(s.bad_replies >= (uint64_t)nbad);
        assert_int_equal(s.retried, s.bad_replies + s.http_errors + s.conn_errors + s.timeouts);
        assert_int_equal(answered_by(t, good.url), 60); /* only the good teacher's were taken */
        done(t);
        free(t);
        for (int i = 0; i < nbad; i++)
            harness_http_close(bad[i]);
    }
    teacher_stop(&good);
}

static void test_no_teachers_waits_then_a_teacher_appears(void **state)
{
    (void)state;
    tally *t = calloc(1, sizeof *t);
    open_client(t, (edl_distill_opts){0}, NULL, 0);
    submit(t, 20);
    edl_distill_result r;
    assert_int_equal(edl_distill_next(t->d, 300, &r), EDL_ETIMEDOUT);
    assert_int_equal(edl_distill_pending(t->d), 20);
    teacher th;
    teacher_start(&th, 0);
    const char *eps[] = {th.url};
    assert_int_equal(edl_distill_set_teachers(t->d, eps, 1), 0);
    drain(t, 20, 30000);
    done(t);
    free(t);
    teacher_stop(&th);
}

static void test_removed_teachers_batches_are_sent_again_at_once(void **state)
{
    (void)state;
    teacher slow, fast;
    teacher_start(&slow, 5000);
    teacher_start(&fast, 0);
    const char *eps[] = {slow.url};
    tally *t = calloc(1, sizeof *t);
    open_client(t, (edl_distill_opts){0}, eps, 1);
    submit(t, 8); /* 4 in flight at the slow teacher, 4 queued */
    edl_distill_result r;
    assert_int_equal(edl_distill_next(t->d, 300, &r), EDL_ETIMEDOUT);
    const char *now[] = {fast.url, fast.url}; /* a name twice counts once */
    int64_t t0 = harness_now_ms();
    assert_int_equal(edl_distill_set_teachers(t->d, now, 2), 0);
    drain(t, 8, 30000);
    assert_true(harness_now_ms() - t0 < 2500); /* not after the slow teacher's 5 s */
    assert_int_equal(answered_by(t, fast.url), 8);
    edl_distill_stats s;
    edl_distill_get_stats(t->d, &s);
    assert_int_equal(s.retried, 4);
    done(t);
    free(t);
    teacher_stop(&slow);
    teacher_stop(&fast);
}

static void test_a_batch_no_teacher_answers_ends_with_a_status(void **state)
{
    (void)state;
    harness_http *err = harness_http_open();
    assert_non_null(err);
    harness_http_reply(err, 503, "{}", 2, HTTP_NORMAL);
    const char *eps[] = {harness_http_url(err)};
    tally *t = calloc(1, sizeof *t);
    open_client(t, (edl_distill_opts){.max_tries = 3}, eps, 1);
    submit(t, 5);
    bool got[5] = {0};
    for (int n = 0; n < 5; n++) {
        edl_distill_result r;
        assert_int_equal(edl_distill_next(t->d, 10000, &r), 0);
        assert_int_equal(r.status, EDL_EPEER);
        assert_int_equal(r.tries, 3);
        assert_null(r.out);
        /* why, in words: the teacher and what it did */
        char want[160];
        snprintf(want, sizeof want, "no teacher answered it well in 3 tries: %s: HTTP 503",
                 harness_http_url(err));
        assert_string_equal(r.error, want);
        assert_false(got[r.id]);
        got[r.id] = true;
    }
    edl_distill_stats s;
    edl_distill_get_stats(t->d, &s);
    assert_int_equal(s.failed, 5);
    assert_int_equal(s.http_errors, 15);
    assert_int_equal(harness_http_requests(err), 15);
    assert_int_equal(edl_distill_pending(t->d), 0);
    edl_distill_close(t->d);
    free(t);
    harness_http_close(err);
}

/* ---- a student whose every teacher is bad ------------------------------------------------ */

/* examples/distill's student against two bad teachers (binary form, --timeout-ms 300,
 * --max-tries 3): it must end by itself within its budget, 3 * (300 ms + the longest back-off)
 * plus its start, exit 1, and say which batch failed, naming both teachers and `why`. */
static void student_fails_fast(harness_http *bad[2], const char *why)
{
    char teachers[160], out[16384];
    snprintf(teachers, sizeof teachers, "%s,%s", harness_http_url(bad[0]),
             harness_http_url(bad[1]));
    const char *argv[] = {EDL_DISTILL_BIN, "--role", "student", "--format", "binary",
                          "--teachers", teachers, "--timeout-ms", "300", "--max-tries", "3",
                          NULL};
    char log[128];
    snprintf(log, sizeof log, "/tmp/test_distill.%d.student.log", (int)getpid());
    int budget_ms = 3 * (300 + EDL_DISTILL_BACKOFF_MAX_MS);
    int64_t t0 = harness_now_ms();
    int rc = harness_run(argv, log, budget_ms + 8000, out, sizeof out);
    int64_t took = harness_now_ms() - t0;
    unlink(log);
    print_message("student ended (%d) after %lld ms (budget %d ms):\n%s\n", rc,
                  (long long)took, budget_ms, out);
    assert_int_equal(rc, 1);
    assert_true(took < budget_ms + 5000); /* 5 s: the process's start and its reference run */
    assert_non_null(strstr(out, "batch 0: no teacher answered it well in 3 tries: "));
    for (int i = 0; i < 2; i++) {
        char named[96];
        snprintf(named, sizeof named, "%s: %s", harness_http_url(bad[i]), why);
        assert_non_null(strstr(out, named));
    }
}

static void test_student_with_only_nan_teachers_fails_within_its_budget(void **state)
{
    (void)state;
    float row[4] = {0.25f, 0.25f, 0.25f, 0.25f};
    char *body = NULL;
    size_t len = 0;
    assert_int_equal(edl_distill_encode(EDL_DISTILL_BINARY, true, row, 1, 4, &body, &len), 0);
    uint32_t nan_bits = 0x7fc00000u; /* a quiet NaN, in the reply's first value */
    memcpy(body + len - 4 * sizeof(float), &nan_bits, sizeof nan_bits);
    harness_http *bad[2];
    for (int i = 0; i < 2; i++) {
        assert_non_null(bad[i] = harness_http_open());
        harness_http_reply(bad[i], 200, body, len, HTTP_NORMAL);
    }
    free(body);
    student_fails_fast(bad, "binary tensor: value 0 is not finite");
    for (int i = 0; i < 2; i++)
        harness_http_close(bad[i]);
}

static void test_student_with_only_hanging_teachers_fails_within_its_budget(void **state)
{
    (void)state;
    harness_http *bad[2];
    for (int i = 0; i < 2; i++) {
        assert_non_null(bad[i] = harness_http_open());
        harness_http_reply(bad[i], 200, "{}", 2, HTTP_HANG);
    }
    student_fails_fast(bad, "no answer within 300 ms (timeout_ms)");
    for (int i = 0; i < 2; i++)
        harness_http_close(bad[i]);
}

/* ---- the wire forms ---------------------------------------------------------------------- */

static int decode(edl_distill_format f, bool reply, const char *body, size_t len, uint32_t *rows,
                  uint32_t *cols, float **x)
{
    char err[160] = "";
    float *tmp = NULL;
    int rc = edl_distill_decode(f, reply, body, len, x ? x : &tmp, rows, cols, err, sizeof err);
    if (rc)
        assert_true(err[0] != '\0'); /* a refusal says why */
    free(tmp);
    return rc;
}

static int json(bool reply, const char *text)
{
    uint32_t r, c;
    return decode(EDL_DISTILL_JSON, reply, text, strlen(text), &r, &c, NULL);
}

static void test_binary_form_is_exact_and_refuses_bad_heads(void **state)
{
    (void)state;
    const float x[6] = {1.5f, -0.0f, 3.25e-38f, 1e30f, -7, 0.1f};
    char *b;
    size_t len;
    assert_int_equal(edl_distill_encode(EDL_DISTILL_BINARY, false, x, 2, 3, &b, &len), 0);
    assert_int_equal(len, 16 + 24);
    static const unsigned char head[16] = {'E', 'D', 'L', 'T', 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0};
    assert_memory_equal(b, head, 16);
    assert_memory_equal(b + 16, "\x00\x00\xc0\x3f", 4); /* 1.5f, little-endian */
    uint32_t r, c;
    float *y;
    assert_int_equal(decode(EDL_DISTILL_BINARY, true, b, len, &r, &c, &y), 0);
    assert_true(r == 2 && c == 3);
    assert_memory_equal(x, y, sizeof x);
    free(y);
    assert_int_equal(decode(EDL_DISTILL_BINARY, true, b, len - 1, &r, &c, NULL), EDL_EPROTO);
    b[0] = 'X';
    assert_int_equal(decode(EDL_DISTILL_BINARY, true, b, len, &r, &c, NULL), EDL_EPROTO);
    b[0] = 'E', b[4] = 2; /* version 2 */
    assert_int_equal(decode(EDL_DISTILL_BINARY, true, b, len, &r, &c, NULL), EDL_EPROTO);
    b[4] = 1, b[8] = 0; /* no rows */
    assert_int_equal(decode(EDL_DISTILL_BINARY, true, b, len, &r, &c, NULL), EDL_EPROTO);
    /* a head claiming 65537 x 65536 floats in 40 bytes: refused before anything is allocated */
    memcpy(b + 8, "\x01\x00\x01\x00\x00\x00\x01\x00", 8);
    assert_int_equal(decode(EDL_DISTILL_BINARY, true, b, len, &r, &c, NULL), EDL_ETOOBIG);
    free(b);
    assert_int_equal(edl_distill_encode(EDL_DISTILL_BINARY, false, x, 0, 3, &b, &len), EDL_EINVAL);
    /* NaN and infinity travel in neither form: refused when encoded and when decoded */
    const float odd[2] = {NAN, -INFINITY};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(edl_distill_encode(EDL_DISTILL_BINARY, true, &odd[i], 1, 1, &b, &len),
                         EDL_EINVAL);
        char nan[20] = {'E', 'D', 'L', 'T', 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0};
        memcpy(nan + 16, &odd[i], 4);
        assert_int_equal(decode(EDL_DISTILL_BINARY, true, nan, 20, &r, &c, NULL), EDL_EPROTO);
    }
}

static void test_json_form_is_tensorflow_servings_and_strict(void **state)
{
    (void)state;
    const float x[4] = {0.1f, -2.5e-7f, 3, 1e30f};
    char *b;
    size_t len;
    assert_int_equal(edl_distill_encode(EDL_DISTILL_JSON, false, x, 2, 2, &b, &len), 0);
    assert_string_equal(b, "{\"instances\":[[0.100000001,-2.49999999e-07],[3,1.00000002e+30]]}");
    uint32_t r, c;
    float *y;
    assert_int_equal(decode(EDL_DISTILL_JSON, false, b, len, &r, &c, &y), 0);
    assert_memory_equal(x, y, sizeof x); /* every float read back exactly */
    free(y);
    assert_int_equal(decode(EDL_DISTILL_JSON, true, b, len, &r, &c, NULL), EDL_EPROTO);
    free(b);
    float nan = NAN;
    assert_int_equal(edl_distill_encode(EDL_DISTILL_JSON, true, &nan, 1, 1, &b, &len), EDL_EINVAL);
    /* what TensorFlow Serving clients send and servers answer */
    assert_int_equal(json(false, " {\"signature_name\":\"serving_default\",\n"
                                 "  \"instances\": [ [1, 2.5e3], [-0.0, 4E-2] ] } "), 0);
    assert_int_equal(json(true, "{\"predictions\":[0.5,0.25,1]}"), 0); /* one column, flat */
    assert_int_equal(decode(EDL_DISTILL_JSON, true, "{\"predictions\":[0.5,0.25,1]}", 28, &r, &c,
                            NULL), 0);
    assert_true(r == 3 && c == 1);
    const char *bad[] = {"", "[]", "{}", "{\"predictions\":[]}", "{\"predictions\":[[]]}",
                         "{\"predictions\":[[1],[1,2]]}", "{\"predictions\":[[1],2]}",
                         "{\"predictions\":[[1]]} x", "{\"predictions\":[[1]],}",
                         "{\"predictions\":[[01]]}", "{\"predictions\":[[1.]]}",
                         "{\"predictions\":[[NaN]]}", "{\"predictions\":[[1e999]]}",
                         "{\"predictions\":[[\"1\"]]}", "{\"predictions\":[[[1]]]}",
                         "{\"predictions\":[[1]],\"predictions\":[[1]]}",
                         "{\"outputs\":[[1]]}", "{\"pred\\u0069ctions\":[[1]]}",
                         "{\"predictions\":[[1]]", "{\"predictions\":[[1, ]]}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (json(true, bad[i]) != EDL_EPROTO)
            fail_msg("accepted: %s", bad[i]);
    char big[128]; /* a number of 70 digits */
    snprintf(big, sizeof big, "{\"predictions\":[[1%070d]]}", 0);
    assert_int_equal(json(true, big), EDL_EPROTO);
}

/* ---- the teacher's HTTP surface ---------------------------------------------------------- */

static int port_of(const teacher *t)
{
    return atoi(strrchr(t->url, ':') + 1);
}

static int http(const teacher *t, const char *method, const char *path, const char *body,
                char *out, size_t outlen)
{
    char req[1024];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s", method,
                     path, strlen(body), body);
    return harness_http_request(port_of(t), req, (size_t)n, out, outlen);
}

static void test_teacher_serves_status_refuses_bad_requests_and_stops_on_sigterm(void **state)
{
    (void)state;
    teacher th;
    teacher_start(&th, 0);
    char out[4096];
    assert_int_equal(http(&th, "GET", "/v1/models/default", "", out, sizeof out), 200);
    assert_non_null(strstr(out, "\"state\":\"AVAILABLE\""));
    assert_non_null(strstr(out, "\"load\":0"));
    assert_int_equal(http(&th, "POST", "/v1/models/default:predict",
                          "{\"instances\":[[1,2,3]]}", out, sizeof out), 400); /* 3 columns */
    assert_non_null(strstr(out, "16 columns"));
    assert_int_equal(http(&th, "POST", "/v1/models/default:predict", "{\"instances\":", out,
                          sizeof out), 400);
    assert_int_equal(http(&th, "POST", "/v1/models/other:predict", "{}", out, sizeof out), 404);
    assert_int_equal(http(&th, "DELETE", "/v1/models/default", "", out, sizeof out), 405);
    kill(th.pid, SIGTERM);
    assert_int_equal(harness_wait_exit(th.pid, 10000), 0);
    th.pid = 0;
    unlink(th.log);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_binary_form_is_exact_and_refuses_bad_heads),
        cmocka_unit_test(test_json_form_is_tensorflow_servings_and_strict),
        cmocka_unit_test(test_teacher_serves_status_refuses_bad_requests_and_stops_on_sigterm),
        cmocka_unit_test(test_batches_through_three_teachers_exactly_once_in_both_forms),
        cmocka_unit_test(test_ordered_delivery_follows_submission_order),
        cmocka_unit_test(test_teacher_killed_with_batches_in_flight),
        cmocka_unit_test(test_hung_teacher_batches_go_elsewhere_after_timeout),
        cmocka_unit_test(test_bad_answers_are_counted_and_batches_go_elsewhere),
        cmocka_unit_test(test_replies_of_another_shape_or_with_bad_values_are_bad_replies),
        cmocka_unit_test(test_no_teachers_waits_then_a_teacher_appears),
        cmocka_unit_test(test_removed_teachers_batches_are_sent_again_at_once),
        cmocka_unit_test(test_a_batch_no_teacher_answers_ends_with_a_status),
        cmocka_unit_test(test_student_with_only_nan_teachers_fails_within_its_budget),
        cmocka_unit_test(test_student_with_only_hanging_teachers_fails_within_its_budget),
    };
    signal(SIGPIPE, SIG_IGN);
    train_reference();
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    free(g_data);
    return rc;
}

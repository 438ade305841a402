/* distill.c: the student's client of teachers (libedldistill) against examples/distill
 * teacher processes on loopback, each taking a fixed --service-ms per batch, one batch at a
 * time (a stand-in for a big model on one accelerator).
 *
 *   distill [--teachers 1,2,4,8] [--service-ms 20] [--rows 64] [--seconds 2] [--in-flight 2]
 *           [--format json|binary] [--quick]
 *
 * scaling  for each teacher count n: batches/s delivered to one student that keeps enough
 *          batches submitted, beside ideal linear scaling from the 1-teacher rate measured in
 *          the same run (ratio), and beside the bound n * 1000 / service-ms.
 * kill     4 teachers (or the largest count below it); one is SIGKILLed mid-run: the time from
 *          the kill until the last batch that had to be sent again (tries > 1) was delivered,
 *          and the rate in the second after the kill against 3 teachers' ideal.
 * Every run drains all it submitted; the last line counts batches lost (submitted, never
 * delivered with predictions) and duplicated (an id delivered twice): both must be 0. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "edl/distill.h"
#include "edl/proc.h"

#define MAX_TEACHERS 16

typedef struct opts {
    int counts[8], n_counts, service_ms, rows, in_flight;
    double seconds;
    edl_distill_format format;
} opts;

typedef struct teacher {
    pid_t pid;
    char url[64], log[128];
} teacher;

typedef struct run {
    edl_distill *d;
    float *x;
    int rows, window;
    uint8_t *seen; /* deliveries of each id */
    size_t cap;
    uint64_t submitted, delivered, lost, duplicated;
    uint64_t kill_id, before_kill;  /* batches submitted before the kill; those delivered */
    int64_t all_before_kill_ms;     /* when the last of them was delivered */
} run;

static void die(const char *what)
{
    fprintf(stderr, "distill: %s\n", what);
    exit(1);
}

/* ---- teachers ---------------------------------------------------------------------------- */

static void teacher_start(teacher *t, int service_ms, int n)
{
    char ms[16], err[256], buf[4096];
    snprintf(ms, sizeof ms, "%d", service_ms);
    snprintf(t->log, sizeof t->log, "/tmp/bench_distill.%d.%d.log", (int)getpid(), n);
    unlink(t->log);
    char *argv[] = {(char *)EDL_DISTILL_BIN, "--role", "teacher", "--port", "0",
                    "--service-time-ms", ms, NULL};
    edl_spawn_opts so = {.argv = argv, .log_path = t->log};
    if (edl_spawn(&so, &t->pid, err, sizeof err) != 0)
        die(err);
    for (int64_t end = edl_monotonic_ms() + 30000; edl_monotonic_ms() < end; usleep(20000)) {
        FILE *f = fopen(t->log, "r");
        size_t len = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        buf[len] = '\0';
        const char *at = strstr(buf, "on http://");
        if (at && strchr(at, '\n')) {
            snprintf(t->url, sizeof t->url, "%.*s", (int)strcspn(at + 3, "\n"), at + 3);
            return;
        }
    }
    die("a teacher did not come up (examples/distill --role teacher)");
}

static void teacher_stop(teacher *t)
{
    if (t->pid > 0) {
        kill(t->pid, SIGKILL);
        waitpid(t->pid, NULL, 0);
        unlink(t->log);
    }
    t->pid = 0;
}

/* ---- the student ------------------------------------------------------------------------- */

static void run_open(run *r, const opts *o, teacher *th, int n)
{
    memset(r, 0, sizeof *r);
    edl_distill_opts dopts = {.model = "default", .format = o->format, .in_flight = o->in_flight,
                              .timeout_ms = 5000};
    const char *eps[MAX_TEACHERS];
    for (int i = 0; i < n; i++)
        eps[i] = th[i].url;
    if (edl_distill_open(&dopts, &r->d) || edl_distill_set_teachers(r->d, eps, (size_t)n))
        die("cannot open the client");
    r->rows = o->rows;
    r->window = 2 * n * o->in_flight;
    if (!(r->x = malloc((size_t)o->rows * 16 * sizeof *r->x)))
        die("out of memory");
    for (int i = 0; i < o->rows * 16; i++)
        r->x[i] = (float)((i * 37) % 200 - 100) / 100;
}

/* Keep the window submitted; deliver one batch within 100 ms and account for it. */
static void run_step(run *r, bool submit_more)
{
    while (submit_more && r->submitted - r->delivered < (uint64_t)r->window) {
        uint64_t id;
        if (edl_distill_submit(r->d, r->x, (uint32_t)r->rows, 16, &id))
            die("submit failed");
        if (id >= r->cap) {
            size_t cap = r->cap ? 2 * r->cap : 4096;
            if (!(r->seen = realloc(r->seen, cap)))
                die("out of memory");
            memset(r->seen + r->cap, 0, cap - r->cap);
            r->cap = cap;
        }
        r->submitted++;
    }
    edl_distill_result res;
    if (edl_distill_next(r->d, 100, &res) != 0)
        return;
    r->delivered++;
    if (res.status != 0 || res.rows != (uint32_t)r->rows)
        r->lost++;
    if (r->seen[res.id]++)
        r->duplicated++;
    if (res.id < r->kill_id && ++r->before_kill == r->kill_id)
        r->all_before_kill_ms = edl_monotonic_ms();
    edl_distill_result_clear(&res);
}

/* Deliver everything submitted; what never came is lost. */
static void run_close(run *r, uint64_t *lost, uint64_t *dup)
{
    for (int64_t end = edl_monotonic_ms() + 30000; r->delivered < r->submitted &&
                                                   edl_monotonic_ms() < end;)
        run_step(r, false);
    *lost += r->lost + (r->submitted - r->delivered);
    *dup += r->duplicated;
    edl_distill_close(r->d);
    free(r->x);
    free(r->seen);
}

/* Batches per second over `seconds`, after a warm-up of a fifth of it. */
static double run_rate(run *r, double seconds)
{
    for (int64_t end = edl_monotonic_ms() + (int64_t)(seconds * 200); edl_monotonic_ms() < end;)
        run_step(r, true);
    uint64_t d0 = r->delivered;
    int64_t t0 = edl_monotonic_ms(), end = t0 + (int64_t)(seconds * 1000);
    while (edl_monotonic_ms() < end)
        run_step(r, true);
    return (double)(r->delivered - d0) * 1000 / (double)(edl_monotonic_ms() - t0);
}

/* ---- the figures ------------------------------------------------------------------------- */

static double scaling(const opts *o, teacher *th, uint64_t *lost, uint64_t *dup)
{
    double one = 0;
    printf("%-9s %12s %14s %7s %14s %7s\n", "teachers", "batches/s", "ideal (x 1)", "ratio",
           "bound", "ratio");
    for (int k = 0; k < o->n_counts; k++) {
        int n = o->counts[k];
        run r;
        run_open(&r, o, th, n);
        double rate = run_rate(&r, o->seconds);
        run_close(&r, lost, dup);
        if (k == 0)
            one = rate / n;
        double bound = n * 1000.0 / o->service_ms;
        printf("%-9d %12.1f %14.1f %6.0f %% %14.1f %6.0f %%\n", n, rate, one * n,
               100 * rate / (one * n), bound, 100 * rate / bound);
    }
    return one;
}

static void kill_one(const opts *o, teacher *th, int n, double one, uint64_t *lost, uint64_t *dup)
{
    run r;
    run_open(&r, o, th, n);
    run_rate(&r, o->seconds / 2);
    /* the batches outstanding now include those in flight at the teacher about to die */
    r.kill_id = r.submitted;
    for (uint64_t id = 0; id < r.kill_id; id++)
        r.before_kill += r.seen[id] > 0;
    uint64_t outstanding = r.kill_id - r.before_kill;
    kill(th[0].pid, SIGKILL);
    int64_t t_kill = edl_monotonic_ms();
    uint64_t d0 = r.delivered;
    while (edl_monotonic_ms() - t_kill < 1000)
        run_step(&r, true);
    double rate = (double)(r.delivered - d0) * 1000 / (double)(edl_monotonic_ms() - t_kill);
    edl_distill_stats s;
    edl_distill_get_stats(r.d, &s);
    run_close(&r, lost, dup);
    waitpid(th[0].pid, NULL, 0);
    unlink(th[0].log);
    th[0].pid = 0;
    /* what the outstanding batches would take without a failure: the window at n teachers */
    double drain_ms = (double)outstanding * 1000 / (one * n);
    printf("kill: 1 of %d teachers SIGKILLed: the %llu batches outstanding (up to %d in flight "
           "at it among them) all delivered %lld ms after the kill (%.0f ms to drain them at %d "
           "teachers); %llu tries sent again (%llu failed to connect); %.1f batches/s in the "
           "second after the kill, %.0f %% of %d teachers' ideal\n", n,
           (unsigned long long)outstanding, o->in_flight,
           r.all_before_kill_ms ? (long long)(r.all_before_kill_ms - t_kill) : -1LL, drain_ms, n,
           (unsigned long long)s.retried, (unsigned long long)s.conn_errors, rate,
           100 * rate / (one * (n - 1)), n - 1);
}

static void usage(FILE *f)
{
    fprintf(f, "Usage: distill [--teachers 1,2,4,8] [--service-ms 20] [--rows 64] [--seconds 2]\n"
               "               [--in-flight 2] [--format json|binary] [--quick]\n"
               "A student's batches/s against the number of teacher processes (examples/distill),\n"
               "beside linear scaling; the time to re-serve a killed teacher's share; batches lost\n"
               "and duplicated (see the file's header).\n");
}

static void parse_counts(opts *o, const char *s)
{
    o->n_counts = 0;
    for (const char *p = s; *p && o->n_counts < 8; p += strcspn(p, ","), p += *p == ',') {
        int n = atoi(p);
        if (n < 1 || n > MAX_TEACHERS)
            die("--teachers: counts from 1 to 16, comma-separated");
        o->counts[o->n_counts++] = n;
    }
}

static void parse(opts *o, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(k, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(k, "--quick") == 0) {
            parse_counts(o, "1,2,4");
            o->seconds = 0.5;
            continue;
        } else if (!v) {
            usage(stderr);
            exit(2);
        } else if (strcmp(k, "--teachers") == 0)
            parse_counts(o, v);
        else if (strcmp(k, "--service-ms") == 0)
            o->service_ms = atoi(v);
        else if (strcmp(k, "--rows") == 0)
            o->rows = atoi(v);
        else if (strcmp(k, "--seconds") == 0)
            o->seconds = atof(v);
        else if (strcmp(k, "--in-flight") == 0)
            o->in_flight = atoi(v);
        else if (strcmp(k, "--format") == 0)
            o->format = strcmp(v, "binary") == 0 ? EDL_DISTILL_BINARY : EDL_DISTILL_JSON;
        else {
            usage(stderr);
            exit(2);
        }
        i++;
    }
    if (o->service_ms < 1 || o->rows < 1 || o->rows > 65536 || !(o->seconds > 0) ||
        o->in_flight < 1)
        die("bad value (see --help)");
}

int main(int argc, char **argv)
{
    opts o = {.service_ms = 20, .rows = 64, .seconds = 2, .in_flight = 2,
              .format = EDL_DISTILL_BINARY};
    parse_counts(&o, "1,2,4,8");
    parse(&o, argc, argv);
    signal(SIGPIPE, SIG_IGN);
    int most = 0;
    for (int k = 0; k < o.n_counts; k++)
        most = o.counts[k] > most ? o.counts[k] : most;
    teacher th[MAX_TEACHERS] = {0};
    for (int i = 0; i < most; i++)
        teacher_start(&th[i], o.service_ms, i);
    printf("bench/distill: %d teacher processes (examples/distill, %d ms a batch, one at a "
           "time), batches of %d x 16 floats, %s form, %d in flight per teacher, %d CPUs\n",
           most, o.service_ms, o.rows, o.format == EDL_DISTILL_BINARY ? "binary" : "JSON",
           o.in_flight, edl_cpu_count());
    uint64_t lost = 0, dup = 0;
    double one = scaling(&o, th, &lost, &dup);
    int n = most >= 4 ? 4 : most;
    if (n >= 2)
        kill_one(&o, th, n, one, &lost, &dup);
    printf("lost %llu, duplicated %llu\n", (unsigned long long)lost, (unsigned long long)dup);
    for (int i = 0; i < most; i++)
        teacher_stop(&th[i]);
    return lost || dup ? 1 : 0;
}

/* reform.c: re-formation latency of an elastic job, and what the agent and job server cost.
 *
 * For N agents (4, 16, 64 by default) with a trivial trainer (sleep) on a local etcd and one
 * job server, repeated trials of three events, each timed until every surviving member's agent
 * reports its trainer running in the new generation:
 *   leave   SIGTERM to an agent (graceful: its lease is revoked at once)
 *   join    a new agent; timed from its registration, minus the settle window
 *   crash   SIGKILL to an agent that its launcher sees die: reaped at once and its lease
 *           revoked (edl_etcd_lease_revoke_holder on its pod key), as `edl run` does for an
 *           agent it reaped and the operator for a pod whose agent container terminated;
 *           timed from the kill, to the new generation's publication and to survivors running
 *   kill    SIGKILL to an agent nobody sees die (a node that vanished); timed from the kill.
 *           Only the lease's expiry reveals it, which comes between 2/3 TTL and TTL after the
 *           kill (renewals every TTL/3), so what is beyond the TTL is the cost of detection and
 *           re-formation
 * Then the agents' resident memory (what it is made of: their own memory, the shared libraries'
 * pages, beside the floors of processes that hold libc alone, OpenSSL alone (linked, then
 * initialised as libcurl does), and the agent's libraries with libcurl initialised) and CPU
 * use while idle, and the job server's time to publish
 * a generation of 1,000 members registered directly by this program (with js_reconcile's own
 * time measured in-process beside it).
 *
 * For comparison (a documented default, not measured here): TorchElastic's c10d/etcd rendezvous
 * waits a last-call window of 30 s after a join before the new round starts.
 *
 * Usage: reform [--sizes 4,16,64] [--trials 10] [--ttl 2] [--settle-ms 500] [--idle-only]
 * (--idle-only: form each size's job and measure its idle agents only) */
#define _GNU_SOURCE
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "edl/job.h"
#include "edl/etcd.h"
#include "edl/etcd_server.h"
#include "edl/http.h"
#include "edl/log.h"
#include "edl/proc.h"
#include "proc_usage.h"
#include "reconcile.h"

#define MAX_AGENTS 256

typedef struct bench {
    edl_etcd_server *srv;
    edl_etcd *c;
    const char *ep;
    char agent_bin[512], js_bin[512];
    int ttl;
    int settle_ms;
    int trials;
    char job[32];
    pid_t js;
    pid_t agents[MAX_AGENTS];
    char names[MAX_AGENTS][48];
    int n_agents;
    int next;
    int64_t published_at;
    edl_watch *w; /* the job's generation key */
    edl_job_keys k; /* of job */
} bench;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A child with its output thrown away, dying with us. */
static pid_t spawn(char *const *argv)
{
    edl_spawn_opts so = {.argv = argv, .out = EDL_SPAWN_NULL, .err = EDL_SPAWN_NULL};
    char err[512];
    pid_t pid = -1;
    if (edl_spawn(&so, &pid, err, sizeof err) != 0) {
        fprintf(stderr, "reform: %s\n", err);
        exit(1);
    }
    return pid;
}

/* Name the job of the next run, "<base><n>" (its keys with it). */
static void set_job(bench *b, const char *base, int n)
{
    snprintf(b->job, sizeof b->job, "%s%d", base, n);
    edl_job_keys_clear(&b->k);
    if (edl_job_keys_init(&b->k, NULL, b->job) != 0) {
        fprintf(stderr, "reform: out of memory\n");
        exit(1);
    }
}

static void start_agent(bench *b)
{
    int i = b->n_agents++;
    snprintf(b->names[i], sizeof b->names[i], "%s-%d", b->job, b->next++);
    char *argv[] = {b->agent_bin, "--etcd", (char *)b->ep, "--job", b->job, "--pod", b->names[i],
                    "--grace-ms", "1000", "--", "/bin/sleep", "100000", NULL};
    b->agents[i] = spawn(argv);
}

/* Drop agent i from the list (it has exited and been reaped). */
static void forget_agent(bench *b, int i)
{
    b->agents[i] = b->agents[b->n_agents - 1];
    memcpy(b->names[i], b->names[b->n_agents - 1], sizeof b->names[i]);
    b->n_agents--;
}

static void remove_agent(bench *b, int i, int sig)
{
    kill(b->agents[i], sig);
    waitpid(b->agents[i], NULL, 0);
    forget_agent(b, i);
}

/* What a launcher does when an agent dies: reap it and revoke its pod's lease at once. */
static void crash_agent(bench *b, int i)
{
    kill(b->agents[i], SIGKILL);
    waitpid(b->agents[i], NULL, 0);
    char *k = edl_job_key_pod(&b->k, b->names[i]);
    if (!k || edl_etcd_lease_revoke_holder(b->c, edl_str(k), NULL) != 0) {
        fprintf(stderr, "reform: cannot revoke the lease of %s\n", b->names[i]);
        exit(1);
    }
    free(k);
    forget_agent(b, i);
}

/* Generation in force, if every member's trainer runs in it with n members (else 0). */
static int64_t all_running(bench *b, int n, int64_t *published)
{
    const char *kc = b->k.generation, *ks = b->k.status;
    edl_kv *kv = NULL;
    int64_t gen = 0;
    edl_range_result r = {0};
    edl_range_opts o = {.prefix = true};
    if (edl_etcd_get(b->c, edl_str(kc), &kv, NULL) == 0 &&
        edl_etcd_range(b->c, edl_str(ks), &o, &r) == 0) {
        edl_generation cl = {0};
        char err[256];
        if (edl_generation_parse(kv->value, kv->value_len, &cl, err, sizeof err) == 0)
            *published = cl.generation;
        if ((int)cl.n_members == n && cl.state == EDL_JOB_RUNNING) {
            int ok = 0;
            for (size_t i = 0; i < r.n_kvs; i++) {
                edl_pod_status st;
                if (edl_pod_status_parse(r.kvs[i].value, r.kvs[i].value_len, &st, err,
                                         sizeof err) == 0 &&
                    st.generation == cl.generation && st.state == EDL_TRAINER_RUNNING)
                    ok++;
            }
            if (ok == n)
                gen = cl.generation;
        }
        edl_generation_clear(&cl);
    }
    edl_range_result_clear(&r);
    edl_kv_free(kv);
    return gen;
}

/* Wait until n members run a generation newer than `after`; returns the time it happened.
 * b->published_at: when the new generation was first seen published. */
static int64_t wait_formed(bench *b, int n, int64_t after, int64_t *gen)
{
    int64_t deadline = edl_monotonic_ms() + 60000;
    b->published_at = 0;
    while (edl_monotonic_ms() < deadline) {
        /* the publication is timed by the watch event, as an agent sees it */
        edl_watch_event *ev;
        while (!b->published_at && edl_watch_next(b->w, &ev, 20) == 0) {
            edl_generation cl = {0};
            char err[256];
            if (ev->type == EDL_WATCH_PUT &&
                edl_generation_parse(ev->kv.value, ev->kv.value_len, &cl, err, sizeof err) == 0 &&
                cl.generation > after)
                b->published_at = edl_monotonic_ms();
            edl_generation_clear(&cl);
            edl_watch_event_free(ev);
        }
        if (b->published_at)
            usleep(20000); /* each poll reads every status: keep the load it adds small */
        int64_t pub = 0;
        int64_t g = all_running(b, n, &pub);
        if (g > after) {
            *gen = g;
            return edl_monotonic_ms();
        }
    }
    fprintf(stderr, "reform: job %s did not re-form with %d members within 60 s\n", b->job, n);
    exit(1);
}

/* Time of the newest pod's registration (creation of its key), by polling. */
static int64_t wait_registered(bench *b, const char *pod)
{
    char *k = edl_job_key_pod(&b->k, pod);
    int64_t deadline = edl_monotonic_ms() + 30000;
    while (edl_monotonic_ms() < deadline) {
        edl_kv *kv = NULL;
        if (edl_etcd_get(b->c, edl_str(k), &kv, NULL) == 0) {
            edl_kv_free(kv);
            free(k);
            return edl_monotonic_ms();
        }
        usleep(500);
    }
    fprintf(stderr, "reform: %s never registered\n", pod);
    exit(1);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static void report(int n, const char *event, int64_t *v, int k, const char *note)
{
    qsort(v, (size_t)k, sizeof *v, cmp_i64);
    int64_t p50 = v[k / 2], p99 = v[(k * 99 + 99) / 100 - 1 < k ? (k * 99 + 99) / 100 - 1 : k - 1];
    printf("reform N=%-3d %-6s p50 %5lld ms  p99 %5lld ms  (%d trials; %s)\n", n, event,
           (long long)p50, (long long)p99, k, note);
    fflush(stdout);
}

static void run_size(bench *b, int n, int trials)
{
    set_job(b, "bench", n);
    char spec[256];
    snprintf(spec, sizeof spec, "{\"min\":1,\"max\":%d,\"settle_ms\":%d,\"ttl_s\":%d}", n + 8,
             b->settle_ms, b->ttl);
    edl_etcd_put(b->c, edl_str(b->k.spec), edl_str(spec), NULL, NULL);
    char *jsv[] = {b->js_bin, "--etcd", (char *)b->ep, "--job", b->job, "--ttl", "5", NULL};
    b->js = spawn(jsv);
    b->n_agents = 0;
    b->next = 0;
    edl_watch_opts wo = {0};
    if (edl_watch_open(b->c, edl_str(b->k.generation), &wo, &b->w) != 0) {
        fprintf(stderr, "reform: cannot watch %s\n", b->k.generation);
        exit(1);
    }
    for (int i = 0; i < n; i++)
        start_agent(b);
    int64_t gen = 0;
    wait_formed(b, n, 0, &gen);
    if (trials == 0) {
        edl_watch_close(b->w);
        b->w = NULL;
        return;
    }
    int64_t leave[64], join[64], killv[64], pub_leave[64], crash[64], pub_crash[64];
    int t;
    for (t = 0; t < trials && t < 64; t++) {
        int victim = 1 + t % (n - 1); /* never the pod of rank 0 */
        int64_t t0 = edl_monotonic_ms();
        remove_agent(b, victim, SIGTERM);
        leave[t] = wait_formed(b, n - 1, gen, &gen) - t0;
        pub_leave[t] = b->published_at - t0;
        start_agent(b);
        t0 = wait_registered(b, b->names[b->n_agents - 1]);
        join[t] = wait_formed(b, n, gen, &gen) - t0 - b->settle_ms;
        victim = 1 + (t + 1) % (n - 1);
        t0 = edl_monotonic_ms();
        crash_agent(b, victim);
        crash[t] = wait_formed(b, n - 1, gen, &gen) - t0;
        pub_crash[t] = b->published_at - t0;
        start_agent(b);
        wait_formed(b, n, gen, &gen);
        victim = 1 + (t + 2) % (n - 1);
        t0 = edl_monotonic_ms();
        remove_agent(b, victim, SIGKILL);
        killv[t] = wait_formed(b, n - 1, gen, &gen) - t0;
        start_agent(b);
        wait_formed(b, n, gen, &gen);
    }
    edl_watch_close(b->w);
    b->w = NULL;
    report(n, "leave", leave, t, "SIGTERM -> all survivors running the new generation");
    report(n, "leave", pub_leave, t, "SIGTERM -> the new generation published (watch event)");
    report(n, "join", join, t, "after the settle window closes");
    report(n, "crash", crash, t, "SIGKILL seen by the launcher (lease revoked) -> all "
           "survivors running the new generation");
    report(n, "crash", pub_crash, t, "SIGKILL seen by the launcher (lease revoked) -> the new "
           "generation published (watch event)");
    char note[160];
    snprintf(note, sizeof note, "SIGKILL -> survivors running; the lease expires %d-%d ms after "
             "the kill (last renewal up to TTL/3 before it)", b->ttl * 2000 / 3, b->ttl * 1000);
    report(n, "kill", killv, t, note);
}

/* The floor under an agent's memory: this program's process with the same libraries (libcurl
 * and its dependencies, libmicrohttpd, libcjson, OpenSSL) loaded and libcurl initialised, as
 * every agent does before it reaches etcd, and nothing else. */
static int libcurl_floor(void)
{
    edl_http_global_init();
    pause();
    return 0;
}

static void print_memory(const char *what, int n, proc_mem sum, long max_rss)
{
    printf("%s (N=%d): RSS %.1f MiB (max %.1f): own memory (anonymous) %.1f MiB, mapped files "
           "(shared library code) %.1f MiB; PSS %.1f MiB\n", what, n,
           (double)sum.rss / n / 1024.0, (double)max_rss / 1024.0, (double)sum.anon / n / 1024.0,
           (double)(sum.rss - sum.anon) / n / 1024.0, (double)sum.pss / n / 1024.0);
}

/* The floors an agent's memory stands on, each a process that waits to be measured: libc alone
 * (sleep), OpenSSL linked (then initialised as libcurl does: tls_floor, beside this program),
 * and everything an agent links with libcurl initialised (this program, --libcurl-floor). */
enum { FLOORS = 4 };
static const char *const floor_names[FLOORS] = {
    "floor: libc alone (sleep)",
    "floor: OpenSSL linked, not initialised",
    "floor: OpenSSL initialised as libcurl does",
    "floor: the same libraries, libcurl initialised, nothing else",
};

static void spawn_floors(pid_t *pids)
{
    char sleep_[] = "sleep", forever[] = "3600", self[] = "/proc/self/exe";
    char tls[] = EDL_BENCH_DIR "/tls_floor", loaded[] = "--loaded", lc[] = "--libcurl-floor";
    char *argv[FLOORS][3] = {{sleep_, forever, NULL}, {tls, loaded, NULL}, {tls, NULL, NULL},
                             {self, lc, NULL}};
    for (int i = 0; i < FLOORS; i++)
        pids[i] = spawn(argv[i]);
}

static void print_floors(const pid_t *pids)
{
    for (int i = 0; i < FLOORS; i++) {
        proc_mem f = proc_memory(pids[i]);
        print_memory(floor_names[i], 1, f, f.rss);
        kill(pids[i], SIGKILL);
        waitpid(pids[i], NULL, 0);
    }
}

static void idle_cost(bench *b, int seconds)
{
    long t0[MAX_AGENTS], total0 = 0, total1 = 0, r;
    for (int i = 0; i < b->n_agents; i++) {
        proc_usage(b->agents[i], &t0[i], &r);
        total0 += t0[i];
    }
    pid_t floors[FLOORS];
    spawn_floors(floors);
    sleep((unsigned)seconds);
    long max_rss = 0;
    proc_mem sum = {0, 0, 0};
    for (int i = 0; i < b->n_agents; i++) {
        long t1;
        proc_usage(b->agents[i], &t1, &r);
        total1 += t1;
        proc_mem m = proc_memory(b->agents[i]);
        sum.rss += m.rss;
        sum.pss += m.pss;
        sum.anon += m.anon;
        if (m.rss > max_rss)
            max_rss = m.rss;
    }
    double cpu = (double)(total1 - total0) / (double)sysconf(_SC_CLK_TCK) / seconds /
                 b->n_agents * 100.0;
    printf("agent idle (N=%d, %d s): RSS mean %.1f MiB, max %.1f MiB; CPU %.3f %% of a core "
           "each (lease renewals every TTL/3 = %.1f s, one watch)\n",
           b->n_agents, seconds, (double)sum.rss / b->n_agents / 1024.0,
           (double)max_rss / 1024.0, cpu, b->ttl / 3.0);
    print_memory("agent idle", b->n_agents, sum, max_rss);
    print_floors(floors);
}

static void stop_all(bench *b)
{
    while (b->n_agents)
        remove_agent(b, 0, SIGKILL);
    kill(b->js, SIGKILL);
    waitpid(b->js, NULL, 0);
}

/* 1,000 members registered directly; time until the job server has published them. */
static void big_generation(bench *b, int members)
{
    set_job(b, "big", members);
    char spec[128];
    snprintf(spec, sizeof spec, "{\"min\":1,\"max\":%d,\"settle_ms\":0}", members);
    edl_etcd_put(b->c, edl_str(b->k.spec), edl_str(spec), NULL, NULL);
    int64_t lease;
    edl_etcd_lease_grant(b->c, 60, 0, &lease, NULL);
    /* all but the last in batches (etcd allows 128 operations per txn) */
    for (int i = 0; i < members - 1;) {
        edl_txn *t = edl_txn_new();
        for (int k = 0; k < 100 && i < members - 1; k++, i++) {
            char name[16], doc[128];
            snprintf(name, sizeof name, "p%04d", i);
            snprintf(doc, sizeof doc, "{\"role\":\"worker\",\"addr\":\"10.0.%d.%d\",\"port\":29500}",
                     i / 250, i % 250);
            char *k2 = edl_job_key_pod(&b->k, name);
            edl_put_opts po = {.lease = lease};
            edl_txn_put(t, EDL_TXN_SUCCESS, edl_str(k2), edl_str(doc), &po);
            free(k2);
        }
        edl_txn_result r;
        edl_etcd_txn(b->c, t, &r);
        edl_txn_result_clear(&r);
        edl_txn_free(t);
    }
    char *jsv[] = {b->js_bin, "--etcd", (char *)b->ep, "--job", b->job, NULL};
    b->js = spawn(jsv);
    int64_t g0 = 0;
    const char *kc = b->k.generation;
    for (int64_t dl = edl_monotonic_ms() + 30000; edl_monotonic_ms() < dl && !g0;) {
        edl_kv *kv = NULL;
        if (edl_etcd_get(b->c, edl_str(kc), &kv, NULL) == 0)
            g0 = 1;
        edl_kv_free(kv);
        usleep(5000);
    }
    /* now the last member joins: time from its registration to the published generation */
    char *kl = edl_job_key_pod(&b->k, "p9999");
    edl_put_opts po = {.lease = lease};
    double t0 = now_s();
    edl_etcd_put(b->c, edl_str(kl), edl_str("{\"role\":\"worker\",\"addr\":\"10.9.9.9\"}"), &po,
                 NULL);
    double took = -1;
    for (int64_t dl = edl_monotonic_ms() + 30000; edl_monotonic_ms() < dl;) {
        edl_kv *kv = NULL;
        edl_generation cl = {0};
        char err[256];
        if (edl_etcd_get(b->c, edl_str(kc), &kv, NULL) == 0 &&
            edl_generation_parse(kv->value, kv->value_len, &cl, err, sizeof err) == 0 &&
            (int)cl.n_members == members) {
            took = now_s() - t0;
            edl_generation_clear(&cl);
            edl_kv_free(kv);
            break;
        }
        edl_generation_clear(&cl);
        edl_kv_free(kv);
        usleep(1000);
    }
    free(kl);
    kill(b->js, SIGKILL);
    waitpid(b->js, NULL, 0);
    edl_etcd_lease_revoke(b->c, lease);

    /* the decision alone, in-process, on the same shape of input */
    edl_job_spec sp;
    edl_spec_init(&sp);
    sp.max = members;
    sp.settle_ms = 0;
    edl_pod *pods = calloc((size_t)members, sizeof *pods);
    edl_pod_status *st = calloc((size_t)members, sizeof *st);
    bool *has = calloc((size_t)members, sizeof *has);
    char (*names)[16] = calloc((size_t)members, sizeof *names);
    for (int i = 0; i < members; i++) {
        snprintf(names[i], sizeof names[i], "p%04d", i);
        pods[i] = (edl_pod){.name = names[i], .role = "worker", .addr = "10.0.0.1",
                            .port = 29500, .lease = 1000 + i, .create_revision = i + 1};
    }
    edl_generation cur = {0};
    js_memory mem = {0};
    js_observed o = {.spec = &sp, .pods = pods, .n_pods = (size_t)members - 1, .status = st,
                     .has_status = has, .current = &cur, .now_ms = 1, .mono_ms = 1};
    js_decision d;
    js_reconcile(&o, &mem, &d); /* the first generation, with all but one */
    edl_generation_clear(&cur);
    cur = d.next;
    memset(&d.next, 0, sizeof d.next);
    js_decision_clear(&d);
    o.n_pods = (size_t)members;
    double r0 = now_s();
    int reps = 20;
    for (int i = 0; i < reps; i++) {
        js_reconcile(&o, &mem, &d);
        char *json = edl_generation_to_json(&d.next);
        free(json);
        js_decision_clear(&d);
    }
    double per = (now_s() - r0) / reps;
    printf("jobserver: %d registered members -> generation published %.1f ms after the last "
           "join (js_reconcile + JSON alone: %.2f ms)\n",
           members, took * 1000.0, per * 1000.0);
    edl_generation_clear(&cur);
    js_memory_clear(&mem);
    free(pods);
    free(st);
    free(has);
    free(names);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"sizes", required_argument, 0, 's'},  {"trials", required_argument, 0, 't'},
        {"ttl", required_argument, 0, 'l'},    {"settle-ms", required_argument, 0, 'w'},
        {"idle-only", no_argument, 0, 'i'},    {"libcurl-floor", no_argument, 0, 'f'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0},
    };
    bench b = {.ttl = 2, .settle_ms = 500, .trials = 10};
    char sizes[128] = "4,16,64";
    bool idle_only = false; /* form each size's job and measure the idle agents, no events */
    int ch;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 's': snprintf(sizes, sizeof sizes, "%s", optarg); break;
        case 't': b.trials = atoi(optarg); break;
        case 'l': b.ttl = atoi(optarg); break;
        case 'w': b.settle_ms = atoi(optarg); break;
        case 'i': idle_only = true; break;
        case 'f': return libcurl_floor();
        case 'h':
            printf("Usage: reform [--sizes 4,16,64] [--trials 10] [--ttl 2] [--settle-ms 500] "
                   "[--idle-only]\n");
            return 0;
        default: return 2;
        }
    }
    if (b.trials < 1 || b.ttl < 1 || b.settle_ms < 0) {
        fprintf(stderr, "reform: --trials and --ttl must be >= 1, --settle-ms >= 0\n");
        return 2;
    }
    edl_log_setup(EDL_LOG_ERROR, EDL_LOG_PLAIN, NULL);
    const char *bin = getenv("EDL_BIN_DIR") ? getenv("EDL_BIN_DIR") : EDL_BIN_DIR;
    snprintf(b.agent_bin, sizeof b.agent_bin, "%s/edl-agent", bin);
    snprintf(b.js_bin, sizeof b.js_bin, "%s/edl-jobserver", bin);
    edl_etcd_server_opts so = {.quiet = true};
    if (edl_etcd_server_open(&so, &b.srv) != 0) {
        fprintf(stderr, "reform: cannot start etcd\n");
        return 1;
    }
    b.ep = edl_etcd_server_endpoints(b.srv);
    edl_etcd_open_endpoints(b.ep, &b.c);
    printf("reform: local etcd, one job server, trivial trainers; settle window %d ms, lease "
           "TTL %d s\n", b.settle_ms, b.ttl);
    printf("reference: TorchElastic's default rendezvous waits a 30 s last-call window after a "
           "join (documented default, not measured here)\n");
    for (char *s = strtok(sizes, ","); s; s = strtok(NULL, ",")) {
        int n = atoi(s);
        if (n < 2 || n > MAX_AGENTS - 8) {
            fprintf(stderr, "reform: size %d out of range 2..%d\n", n, MAX_AGENTS - 8);
            continue;
        }
        run_size(&b, n, idle_only ? 0 : b.trials);
        if (n == 16 || idle_only)
            idle_cost(&b, 10);
        stop_all(&b);
    }
    if (!idle_only)
        big_generation(&b, 1000);
    edl_etcd_close(b.c);
    edl_etcd_server_close(b.srv);
    return 0;
}

/* rebuild.c: how long an elastic job's collective group takes to re-form in process.
 *
 * Runs a real job with `edl run --elastic-mode inprocess` (its own etcd, job server, agents)
 * whose trainers are this program in trainer mode: an elastic loop (libedlcoll) doing a
 * 1 KiB allreduce every 2 ms. After each re-form, a trainer notes the time of its first
 * successful allreduce in the new generation in <dir>/g<gen>-r<rank>. Events, for N = 4 and 16:
 *   kill-trainer  SIGKILL to one trainer (its pod stays: the agent reports the death, the job
 *                 server restarts that rank into the next generation)
 *   kill-pod      SIGKILL to one agent and its trainer: only the lease's expiry reveals it
 *   scale-up      `edl scale JOB N+1`: a new pod joins after the settle window
 * For each: the time to the first allreduce that every member of the new generation completed,
 * the detection time (until the job server published the new generation), and the difference:
 * what re-forming the group costs beyond detection (target: under 500 ms).
 *
 * Usage: rebuild [--sizes 4,16] [--trials 5] [--settle-ms 200] [--ttl 2] */
#define _GNU_SOURCE
#include <dirent.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "edl/job.h"
#include "edl/collective.h"
#include "edl/etcd.h"
#include "edl/etcd_server.h"
#include "edl/log.h"
#include "edl/proc.h"

/* ---- trainer mode --------------------------------------------------------------------------- */

static int trainer(const char *dir)
{
    edl_comm *c;
    if (edl_coll_open(NULL, &c) != 0)
        return 1;
    float buf[256] = {0};
    edl_coll_state *st;
    edl_coll_state_new(&st);
    edl_coll_state_add(st, "buf", buf, sizeof buf);
    bool noted = true;
    int64_t step = 0;
    for (;;) {
        int rc = edl_coll_check(c);
        if (rc == EDL_COLL_REFORMED) {
            if (edl_coll_state_sync(st, c, &step) != 0)
                continue;
            noted = false;
        } else if (rc < 0) {
            break;
        }
        if (edl_allreduce(c, buf, buf, 256, EDL_FLOAT32, EDL_MAX) != 0)
            continue;
        if (!noted) {
            char path[4096];
            snprintf(path, sizeof path, "%s/g%lld-r%d", dir, (long long)edl_coll_generation(c),
                     edl_coll_rank(c));
            FILE *f = fopen(path, "w");
            if (f) {
                fprintf(f, "%lld\n", (long long)edl_monotonic_ms());
                fclose(f);
            }
            noted = true;
        }
        edl_coll_state_commit(st, ++step);
        edl_agent_link_report_step(edl_coll_agent_link(c), step);
        usleep(2000);
    }
    edl_coll_state_free(st);
    edl_coll_close(c);
    return 0;
}

/* ---- the orchestrator ----------------------------------------------------------------------- */

typedef struct bench {
    edl_etcd_server *srv;
    edl_etcd *c;
    const char *ep;
    char self[4096], edl[4096], dir[64], job[32];
    int settle_ms, ttl, trials;
    pid_t run;
    edl_job_keys k; /* of job */
} bench;

/* A child with its output thrown away, dying with us. */
static pid_t spawn_quiet(char *const *argv)
{
    edl_spawn_opts so = {.argv = argv, .out = EDL_SPAWN_NULL, .err = EDL_SPAWN_NULL};
    char err[512];
    pid_t pid = -1;
    if (edl_spawn(&so, &pid, err, sizeof err) != 0)
        fprintf(stderr, "rebuild: %s\n", err);
    return pid;
}

static bool read_generation(bench *b, edl_generation *g)
{
    char err[128];
    edl_kv *kv = NULL;
    bool ok = edl_etcd_get(b->c, edl_str(b->k.generation), &kv, NULL) == 0;
    edl_generation_clear(g);
    ok = ok && edl_generation_parse(kv->value, kv->value_len, g, err, sizeof err) == 0;
    edl_kv_free(kv);
    return ok;
}

static long member_pid(bench *b, const char *pod, bool agent)
{
    char err[128];
    char *k = agent ? edl_job_key_pod(&b->k, pod) : edl_job_key_status(&b->k, pod);
    edl_kv *kv = NULL;
    long pid = -1;
    if (edl_etcd_get(b->c, edl_str(k), &kv, NULL) == 0) {
        if (agent) {
            edl_pod p = {0};
            if (edl_pod_parse(kv->value, kv->value_len, &p, err, sizeof err) == 0)
                pid = (long)p.pid;
            edl_pod_clear(&p);
        } else {
            edl_pod_status st;
            if (edl_pod_status_parse(kv->value, kv->value_len, &st, err, sizeof err) == 0)
                pid = (long)st.pid;
        }
    }
    edl_kv_free(kv);
    free(k);
    return pid;
}

/* The latest first-allreduce time of generation gen over ranks 0..n-1, or -1 if one is
 * missing. */
static int64_t formed_at(bench *b, int64_t gen, int n)
{
    int64_t last = 0;
    for (int r = 0; r < n; r++) {
        char path[256];
        snprintf(path, sizeof path, "%s/g%lld-r%d", b->dir, (long long)gen, r);
        FILE *f = fopen(path, "r");
        long long t = -1;
        if (!f || fscanf(f, "%lld", &t) != 1)
            t = -1;
        if (f)
            fclose(f);
        if (t < 0)
            return -1;
        last = t > last ? t : last;
    }
    return last;
}

/* Wait (up to ms) for a generation after `after` with n members (n < 0: -n or -n+1) that
 * formed its group. *t_pub: when the first newer generation (without pod `gone`) appeared. */
static bool wait_formed(bench *b, int64_t after, int n, int ms, const char *gone, int64_t *gen,
                        int64_t *t_pub, int64_t *t_formed)
{
    int64_t end = edl_monotonic_ms() + ms, seen = after;
    edl_generation cl = {0};
    *t_pub = -1;
    while (edl_monotonic_ms() < end) {
        if (read_generation(b, &cl) && cl.generation > seen) {
            if (*t_pub < 0 && (!gone || !edl_generation_member_named(&cl, gone)))
                *t_pub = edl_monotonic_ms();
            seen = cl.generation;
        }
        bool size_ok = n > 0 ? (int)cl.n_members == n
                             : (int)cl.n_members == -n || (int)cl.n_members == -n + 1;
        if (seen > after && size_ok && cl.state == EDL_JOB_RUNNING) {
            int64_t t = formed_at(b, cl.generation, (int)cl.n_members);
            if (t > 0) {
                *gen = cl.generation;
                *t_formed = t;
                edl_generation_clear(&cl);
                return true;
            }
        }
        usleep(2000);
    }
    edl_generation_clear(&cl);
    return false;
}

static int cmp_i64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, c = *(const int64_t *)y;
    return (a > c) - (a < c);
}

static void report(int n, const char *event, int64_t *total, int64_t *detect, int k)
{
    if (k == 0) {
        printf("rebuild N=%-3d %-13s no successful trial\n", n, event);
        return;
    }
    int64_t beyond[64];
    for (int i = 0; i < k; i++)
        beyond[i] = total[i] - detect[i];
    qsort(total, (size_t)k, sizeof *total, cmp_i64);
    qsort(detect, (size_t)k, sizeof *detect, cmp_i64);
    qsort(beyond, (size_t)k, sizeof *beyond, cmp_i64);
    printf("rebuild N=%-3d %-13s to first allreduce p50 %5lld ms max %5lld | detection p50 %5lld "
           "ms | beyond detection p50 %4lld ms max %4lld ms (%d trials)\n", n, event,
           (long long)total[k / 2], (long long)total[k - 1], (long long)detect[k / 2],
           (long long)beyond[k / 2], (long long)beyond[k - 1], k);
    fflush(stdout);
}

static void scale(bench *b, int n)
{
    char num[16];
    snprintf(num, sizeof num, "%d", n);
    char *argv[] = {b->edl, "scale", b->job, num, "--etcd", (char *)b->ep, NULL};
    pid_t p = spawn_quiet(argv);
    waitpid(p, NULL, 0);
}

/* Back to n members, formed, quiet for a moment. */
static bool steady(bench *b, int n, int64_t *gen)
{
    int64_t tp, tf;
    edl_generation cl = {0};
    int64_t cur = read_generation(b, &cl) ? cl.generation : 0;
    edl_generation_clear(&cl);
    if (!wait_formed(b, cur - 1, n, 30000, NULL, gen, &tp, &tf))
        return false;
    usleep(500000);
    if (read_generation(b, &cl) && cl.generation != *gen) { /* moved on meanwhile: again */
        edl_generation_clear(&cl);
        return steady(b, n, gen);
    }
    edl_generation_clear(&cl);
    return true;
}

static void run_size(bench *b, int n)
{
    snprintf(b->job, sizeof b->job, "rebuild%d", n);
    edl_job_keys_clear(&b->k);
    if (edl_job_keys_init(&b->k, NULL, b->job) != 0) {
        printf("rebuild N=%d: out of memory\n", n);
        return;
    }
    char np[32], reps[16], settle[16], ttl[16];
    snprintf(np, sizeof np, "1:%d", n + 1);
    snprintf(reps, sizeof reps, "%d", n);
    snprintf(settle, sizeof settle, "%d", b->settle_ms);
    snprintf(ttl, sizeof ttl, "%d", b->ttl);
    char *argv[] = {b->edl, "run", "--job", b->job, "--etcd", (char *)b->ep, "--np", np,
                    "--replicas", reps, "--settle-ms", settle, "--ttl", ttl, "--grace-ms",
                    "1000", "--max-restarts", "1000", "--exclude-after", "1000",
                    "--elastic-mode", "inprocess", "--", b->self, "--trainer", b->dir, NULL};
    b->run = spawn_quiet(argv);
    int64_t gen;
    if (!steady(b, n, &gen)) {
        printf("rebuild N=%d: the job did not form\n", n);
        goto out;
    }
    static const char *const events[] = {"kill-trainer", "kill-pod", "scale-up"};
    for (int e = 0; e < 3; e++) {
        int64_t total[64], detect[64];
        int k = 0;
        for (int t = 0; t < b->trials && t < 64; t++) {
            edl_generation cl = {0};
            if (!read_generation(b, &cl) || cl.n_members < 2) {
                edl_generation_clear(&cl);
                break;
            }
            const char *victim = cl.members[1 + t % (cl.n_members - 1)].pod;
            char victim_name[128];
            snprintf(victim_name, sizeof victim_name, "%s", victim);
            long pid = e == 2 ? 0 : member_pid(b, victim, e == 1);
            int64_t t0 = edl_monotonic_ms(), tp, tf, g;
            if (e == 2)
                scale(b, n + 1);
            else if (pid > 1)
                kill((pid_t)pid, SIGKILL);
            edl_generation_clear(&cl);
            /* kill-pod: the launcher starts a replacement pod at once, which may be in the
             * generation that drops the dead one (n members) or in a later one (n - 1 first) */
            int want = e == 0 ? n : e == 1 ? -(n - 1) : n + 1;
            if (wait_formed(b, gen, want, 30000, e == 1 ? victim_name : NULL, &g, &tp, &tf)) {
                total[k] = tf - t0;
                detect[k] = tp - t0;
                k++;
            }
            if (e == 2)
                scale(b, n);
            if (!steady(b, n, &gen)) {
                printf("rebuild N=%d: no steady state after %s\n", n, events[e]);
                break;
            }
        }
        report(n, events[e], total, detect, k);
    }
out:
    kill(b->run, SIGTERM);
    waitpid(b->run, NULL, 0);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--trainer") == 0)
        return trainer(argv[2]);
    static const struct option opts[] = {
        {"sizes", required_argument, 0, 's'}, {"trials", required_argument, 0, 't'},
        {"settle-ms", required_argument, 0, 'w'}, {"ttl", required_argument, 0, 'l'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    bench b = {.settle_ms = 200, .ttl = 2, .trials = 5};
    char sizes[128] = "4,16";
    int ch;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 's': snprintf(sizes, sizeof sizes, "%s", optarg); break;
        case 't': b.trials = atoi(optarg); break;
        case 'w': b.settle_ms = atoi(optarg); break;
        case 'l': b.ttl = atoi(optarg); break;
        case 'h':
            printf("Usage: rebuild [--sizes 4,16] [--trials 5] [--settle-ms 200] [--ttl 2]\n"
                   "Times in-process re-formation of libedlcoll groups under edl run.\n");
            return 0;
        default: return 2;
        }
    }
    if (b.trials < 1 || b.trials > 64 || b.ttl < 1 || b.settle_ms < 0) {
        fprintf(stderr, "rebuild: --trials 1..64, --ttl >= 1, --settle-ms >= 0\n");
        return 2;
    }
    edl_log_setup(EDL_LOG_ERROR, EDL_LOG_PLAIN, NULL);
    if (readlink("/proc/self/exe", b.self, sizeof b.self - 1) < 0)
        return 1;
    const char *bin = getenv("EDL_BIN_DIR") ? getenv("EDL_BIN_DIR") : EDL_BIN_DIR;
    snprintf(b.edl, sizeof b.edl, "%s/edl", bin);
    snprintf(b.dir, sizeof b.dir, "/tmp/edl-rebuild-XXXXXX");
    if (!mkdtemp(b.dir))
        return 1;
    edl_etcd_server_opts so = {.quiet = true};
    if (edl_etcd_server_open(&so, &b.srv) != 0) {
        fprintf(stderr, "rebuild: cannot start etcd\n");
        return 1;
    }
    b.ep = edl_etcd_server_endpoints(b.srv);
    edl_etcd_open_endpoints(b.ep, &b.c);
    printf("rebuild: edl run --elastic-mode inprocess, local etcd, settle window %d ms, lease TTL "
           "%d s, 1 KiB allreduce every 2 ms; all processes on this machine (%ld cores)\n",
           b.settle_ms, b.ttl, sysconf(_SC_NPROCESSORS_ONLN));
    for (char *s = strtok(sizes, ","); s; s = strtok(NULL, ",")) {
        int n = atoi(s);
        if (n < 2 || n > 64) {
            fprintf(stderr, "rebuild: size %d out of range 2..64\n", n);
            continue;
        }
        run_size(&b, n);
    }
    edl_etcd_close(b.c);
    edl_etcd_server_close(b.srv);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", b.dir);
    if (system(cmd) != 0)
        return 1;
    return 0;
}

/* operator.c: what the TrainingJob operator (edl-operator) costs, measured
 * against the stand-in API server and kubelet of tests/k8s_standin with a real etcd.
 *
 *   scale     `kubectl scale` of a running job by one pod (its kubelet runs real agents and
 *             trainers), repeated: the operator's reaction (scale request → the pod created),
 *             and its decision (the new agent registered in etcd → the generation published,
 *             minus the settle window); what lies between is the pod's own start, which the
 *             operator does not control. Beside them the API requests the operator made per
 *             scale event (the stand-in's counters).
 *   split     two operator replicas, every pod create delayed 20 ms (a real API server's
 *             10-40 ms), one job scaled to 1,000 pods: the time to reach them, the most pods
 *             that existed at once (goal: never above the replicas), the Lease's holders and
 *             its renewals that came late (goal: none; a pass creating pods once starved them
 *             for 17 s and two leaders made 3,092 pods for 2,500).
 *   many      1,000 TrainingJobs of 10 pods each (a kubelet that only marks pods Running): the
 *             operator's resident memory and CPU while it manages them, then the time a fresh
 *             operator takes to list them all and pass over each job once (goals: under
 *             100 MiB, under 2 s).
 *
 * Usage: operator [--trials 5] [--jobs 1000] [--pods 10] [--split-pods 1000] [--only S]   (from the build directory: it finds
 * bin/ and tests/ beside itself; the real kubectl from tests/.kube of the source tree) */
#define _GNU_SOURCE
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "edl/etcd.h"
#include "edl/etcd_server.h"
#include "edl/job.h"
#include "edl/k8s.h"
#include "edl/log.h"
#include "edl/proc.h"
#include "proc_usage.h"

typedef struct bench {
    edl_etcd_server *srv;
    edl_etcd *c;
    char dir[128], kubeconfig[256], standin_log[256];
    pid_t standin, op, op2;
    int port;
    edl_k8s *k;
} bench;

static int64_t now_ms(void) { return edl_monotonic_ms(); }


static void die(const char *what)
{
    fprintf(stderr, "bench operator: %s\n", what);
    exit(1);
}

static pid_t spawn(const char *const *argv, const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        int fd = log ? open(log, O_WRONLY | O_CREAT | O_APPEND, 0644) : -1;
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static void start_standin(bench *b, const char *mode)
{
    char ready[256], root[256];
    snprintf(ready, sizeof ready, "%s/port-%s", b->dir, mode);
    snprintf(root, sizeof root, "%s/kubelet", b->dir);
    mkdir(root, 0700);
    unlink(ready);
    const char *argv[] = {EDL_K8S_STANDIN_BIN, "--port", "0", "--ready-file", ready,
                          "--kubelet-root", root, "--kubelet-mode", mode, NULL};
    b->standin = spawn(argv, b->standin_log);
    for (int i = 0; i < 400 && b->port <= 0; i++) {
        usleep(25000);
        FILE *f = fopen(ready, "r");
        if (f && fscanf(f, "%d", &b->port) != 1)
            b->port = 0;
        if (f)
            fclose(f);
    }
    if (b->port <= 0)
        die("the stand-in API server did not start");
    snprintf(b->kubeconfig, sizeof b->kubeconfig, "%s/kubeconfig", b->dir);
    FILE *f = fopen(b->kubeconfig, "w");
    fprintf(f, "apiVersion: v1\nkind: Config\nclusters:\n- name: s\n  cluster:\n    server: "
               "http://127.0.0.1:%d\nusers:\n- name: u\n  user: {}\ncontexts:\n- name: s\n"
               "  context: {cluster: s, user: u, namespace: default}\ncurrent-context: s\n",
            b->port);
    fclose(f);
    edl_k8s_config kc = {0};
    char err[256];
    if (edl_k8s_config_kubeconfig(&kc, b->kubeconfig, NULL, err, sizeof err) ||
        edl_k8s_open(&kc, &b->k))
        die(err);
    edl_k8s_config_clear(&kc);
}

static void kubectl(bench *b, const char *args)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/tests/.kube/bin/kubectl --kubeconfig %s --cache-dir %s/kc %s "
             ">/dev/null", EDL_SOURCE_DIR, b->kubeconfig, b->dir, args);
    if (system(cmd) != 0)
        die(cmd);
}

#define METRICS_PORT 19464 /* the first operator's /metrics; a second one's is the next port */

static pid_t spawn_operator(bench *b, const char *id, int port, const char *log_name)
{
    char log[256], ports[16];
    snprintf(log, sizeof log, "%s/%s", b->dir, log_name);
    snprintf(ports, sizeof ports, "%d", port);
    const char *argv[] = {EDL_BIN_DIR "/edl-operator", "--kubeconfig",
                          b->kubeconfig, "--etcd", edl_etcd_server_endpoints(b->srv), "--id", id,
                          "--ttl", "5", "--metrics-port", ports, "--metrics-addr", "127.0.0.1",
                          "--leader-elect-retry-period", "200ms", "--log-level",
                          getenv("EDL_BENCH_LOG_LEVEL") ? getenv("EDL_BENCH_LOG_LEVEL") : "info", NULL};
    return spawn(argv, log);
}

static void start_operator(bench *b, const char *id)
{
    b->op = spawn_operator(b, id, METRICS_PORT, "operator.log");
}

/* A metric of the /metrics on port (-1: not reachable). */
static double metric_at(int port, const char *name)
{
    char cmd[256], line[512];
    snprintf(cmd, sizeof cmd, "curl -s --max-time 1 http://127.0.0.1:%d/metrics", port);
    FILE *p = popen(cmd, "r");
    double v = -1;
    while (p && fgets(line, sizeof line, p))
        if (strncmp(line, name, strlen(name)) == 0 && (line[strlen(name)] == '{' ||
                                                        line[strlen(name)] == ' '))
            v = atof(strrchr(line, ' ') + 1);
    if (p)
        pclose(p);
    return v;
}

static double op_metric(const char *name)
{
    return metric_at(METRICS_PORT, name);
}

static long standin_stat(bench *b, const char *counter)
{
    edl_k8s_reply r = {0};
    long n = 0;
    if (edl_k8s_get(b->k, "/standin/stats", &r) == 0)
        n = (long)edl_k8s_int(r.body, counter, 0);
    edl_k8s_reply_clear(&r);
    return n;
}

static long operator_requests(bench *b)
{
    (void)b;
    return (long)op_metric("edl_operator_api_requests_total");
}

/* Stop the operators (SIGTERM: they release the Lease) and the stand-in. */
static void stop_cluster(bench *b)
{
    pid_t ops[] = {b->op, b->op2};
    for (int i = 0; i < 2; i++)
        if (ops[i] > 0)
            kill(ops[i], SIGTERM);
    for (int i = 0; i < 2; i++)
        if (ops[i] > 0)
            waitpid(ops[i], NULL, 0);
    b->op = b->op2 = 0;
    kill(b->standin, SIGTERM);
    waitpid(b->standin, NULL, 0);
    edl_k8s_close(b->k);
    b->k = NULL;
    b->port = 0;
}

/* ---- scale: one pod more, then one less ------------------------------------------------- */

static const char JOB_YAML[] =
    "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: scale}\n"
    "spec:\n  replicas: 2\n  minReplicas: 1\n  maxReplicas: 16\n"
    "  elastic: {settleWindow: 100ms, leaseTTLSeconds: 5}\n"
    "  template:\n    spec:\n      containers:\n      - name: t\n        image: none\n"
    "        command: [sleep, \"100000\"]\n";

/* Wait until the job's generation has n members: its publication time (wall ms). */
static int64_t wait_members(bench *b, edl_job_keys *k, size_t n)
{
    for (int64_t end = now_ms() + 60000; now_ms() < end; usleep(5000)) {
        edl_kv *kv = NULL;
        if (edl_etcd_get(b->c, edl_str(k->generation), &kv, NULL) != 0)
            continue;
        edl_generation g = {0};
        char err[128];
        int rc = edl_generation_parse(kv->value, kv->value_len, &g, err, sizeof err);
        int64_t at = g.published_ms;
        bool ok = rc == 0 && g.n_members == n && g.state == EDL_JOB_RUNNING;
        edl_generation_clear(&g);
        edl_kv_free(kv);
        if (ok)
            return at;
    }
    die("the generation did not form");
    return 0;
}

/* When the pod appeared in etcd (its agent registered): wall ms from the key's revision is not
 * kept, so this polls for it. */
static int64_t wait_registered(bench *b, edl_job_keys *k, const char *pod)
{
    char *key = edl_job_key_pod(k, pod);
    for (int64_t end = now_ms() + 60000; now_ms() < end; usleep(2000)) {
        edl_kv *kv = NULL;
        int rc = edl_etcd_get(b->c, edl_str(key), &kv, NULL);
        edl_kv_free(kv);
        if (rc == 0) {
            free(key);
            return edl_wall_ms();
        }
    }
    die("the new pod's agent did not register");
    return 0;
}

/* When the pod object was created (wall ms), polled through the API. */
static int64_t wait_pod(bench *b, const char *pod)
{
    char path[256];
    snprintf(path, sizeof path, "/api/v1/namespaces/default/pods/%s", pod);
    for (int64_t end = now_ms() + 30000; now_ms() < end; usleep(1000)) {
        edl_k8s_reply r = {0};
        int rc = edl_k8s_get(b->k, path, &r);
        edl_k8s_reply_clear(&r);
        if (rc == 0)
            return edl_wall_ms();
    }
    die("the operator did not create the pod");
    return 0;
}

static void bench_scale(bench *b, int trials)
{
    start_standin(b, "process");
    kubectl(b, "apply -f " EDL_SOURCE_DIR "/deploy/k8s/crd.yaml");
    start_operator(b, "bench-op");
    char file[256];
    snprintf(file, sizeof file, "%s/scale.yaml", b->dir);
    FILE *f = fopen(file, "w");
    fputs(JOB_YAML, f);
    fclose(f);
    char args[512];
    snprintf(args, sizeof args, "apply -f %s", file);
    kubectl(b, args);
    edl_job_keys k;
    edl_job_keys_init(&k, NULL, "default.scale");
    wait_members(b, &k, 2);
    double react = 0, decide = 0, start = 0, total = 0;
    long reqs = 0;
    for (int t = 0; t < trials; t++) {
        int n = 3 + t;
        char pod[64];
        snprintf(pod, sizeof pod, "scale-worker-%d", n - 1);
        long r0 = operator_requests(b);
        snprintf(args, sizeof args, "scale tj/scale --replicas=%d", n);
        int64_t t0 = edl_wall_ms();
        kubectl(b, args);
        int64_t t_scaled = edl_wall_ms(); /* kubectl returned: the API server has the new spec */
        int64_t t_created = wait_pod(b, pod);
        int64_t t_reg = wait_registered(b, &k, pod);
        int64_t t_gen = wait_members(b, &k, (size_t)n);
        usleep(300000); /* let status writes and Events settle before counting */
        reqs += operator_requests(b) - r0;
        react += (double)(t_created - t_scaled);
        decide += (double)(t_gen - t_reg - 100);
        start += (double)(t_reg - t_created);
        total += (double)(t_gen - t0);
    }
    printf("scale: operator reaction (scale -> pod created)     %7.1f ms  (mean of %d)\n",
           react / trials, trials);
    printf("scale: operator decision (registered -> generation) %7.1f ms  beyond the 100 ms "
           "settle window\n", decide / trials);
    printf("scale: operator total added beyond pod start        %7.1f ms  (goal < 100 ms)\n",
           (react + decide) / trials);
    printf("scale: pod start (created -> agent registered)      %7.1f ms  (stand-in kubelet; "
           "not the operator's)\n", start / trials);
    printf("scale: kubectl scale -> generation published         %7.1f ms\n", total / trials);
    printf("scale: API requests by the operator per scale event %7.1f\n", (double)reqs / trials);
    edl_job_keys_clear(&k);
    stop_cluster(b);
}

/* ---- split: two replicas, slow creates, one big scale ---------------------------------------- */

static void bench_split(bench *b, int pods)
{
    start_standin(b, "phase-only");
    kubectl(b, "apply -f " EDL_SOURCE_DIR "/deploy/k8s/crd.yaml");
    static const char fault[] = "{\"verb\":\"create\",\"resource\":\"pods\",\"delayMs\":20,"
                                "\"count\":-1}";
    edl_k8s_reply r = {0};
    if (edl_k8s_request(b->k, "POST", "/standin/faults", NULL, fault, &r) || r.status != 201)
        die("the stand-in refused the latency fault");
    edl_k8s_reply_clear(&r);
    b->op = spawn_operator(b, "split-a", METRICS_PORT, "operator-a.log");
    b->op2 = spawn_operator(b, "split-b", METRICS_PORT + 1, "operator-b.log");
    for (int64_t end = now_ms() + 30000; metric_at(METRICS_PORT, "edl_operator_leader") +
         metric_at(METRICS_PORT + 1, "edl_operator_leader") < 1; usleep(20000))
        if (now_ms() > end)
            die("no operator took the lead");
    char json[1024];
    snprintf(json, sizeof json, "{\"apiVersion\":\"edl.dev/v1alpha1\",\"kind\":\"TrainingJob\","
             "\"metadata\":{\"name\":\"split\"},\"spec\":{\"replicas\":%d,\"maxReplicas\":%d,"
             "\"template\":{\"spec\":{\"containers\":[{\"name\":\"t\",\"image\":\"none\","
             "\"command\":[\"sleep\",\"1000\"]}]}}}}", pods, pods);
    cJSON *obj = cJSON_Parse(json);
    char *path = edl_k8s_path("edl.dev", "v1alpha1", "default", "trainingjobs", NULL, NULL);
    int64_t t0 = now_ms();
    if (edl_k8s_create(b->k, path, obj, NULL) != 0)
        die("creating the TrainingJob failed");
    cJSON_Delete(obj);
    free(path);
    while (standin_stat(b, "live pods default") < pods) {
        if (now_ms() - t0 > 600000)
            die("the operators did not reach the replicas within 10 minutes");
        usleep(20000);
    }
    double secs = (double)(now_ms() - t0) / 1000;
    sleep(2); /* would a second leader add more? */
    printf("split: 2 replicas, 20 ms per pod create: %d pods in %.1f s (%.0f pods/s; a create "
           "costs at least 20 ms: %.1f s serial)\n", pods, secs, pods / secs, pods * 0.02);
    printf("split: most pods at once %ld, now %ld, for %d replicas (goal: never above)\n",
           standin_stat(b, "peak pods default"), standin_stat(b, "live pods default"), pods);
    edl_k8s_reply lease = {0};
    int64_t transitions = -1;
    if (edl_k8s_get(b->k, "/apis/coordination.k8s.io/v1/namespaces/default/leases/edl-operator",
                    &lease) == 0)
        transitions = edl_k8s_int(lease.body, "spec.leaseTransitions", -1);
    edl_k8s_reply_clear(&lease);
    double late = metric_at(METRICS_PORT, "edl_operator_lease_renewals_late_total") +
                  metric_at(METRICS_PORT + 1, "edl_operator_lease_renewals_late_total");
    double renewals = metric_at(METRICS_PORT, "edl_operator_lease_renewals_total") +
                      metric_at(METRICS_PORT + 1, "edl_operator_lease_renewals_total");
    printf("split: Lease renewals %.0f, late (> 2 retry periods apart) %.0f, holder changes "
           "%lld (goal: 0 late, 0 changes)\n", renewals, late, (long long)transitions);
    stop_cluster(b);
}

/* ---- many: 1,000 jobs of 10 pods ---------------------------------------------------------- */

static void create_jobs(bench *b, int jobs, int pods)
{
    char *path = edl_k8s_path("edl.dev", "v1alpha1", "default", "trainingjobs", NULL,
                              NULL);
    for (int i = 0; i < jobs; i++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{\"apiVersion\":\"edl.dev/v1alpha1\",\"kind\":\"TrainingJob\","
                 "\"metadata\":{\"name\":\"job-%d\"},\"spec\":{\"replicas\":%d,"
                 "\"minReplicas\":1,\"template\":{\"spec\":{\"containers\":[{\"name\":\"t\","
                 "\"image\":\"none\",\"command\":[\"sleep\",\"1000\"]}]}}}}", i, pods);
        cJSON *obj = cJSON_Parse(json);
        if (edl_k8s_create(b->k, path, obj, NULL) != 0)
            die("creating a TrainingJob failed");
        cJSON_Delete(obj);
    }
    free(path);
}

/* Until the operator's metric reaches at least want (or the timeout): ms waited, -1 timed out. */
static int64_t wait_metric(const char *name, double want, int timeout_ms)
{
    int64_t t0 = now_ms();
    while (now_ms() - t0 < timeout_ms) {
        if (op_metric(name) >= want)
            return now_ms() - t0;
        usleep(200000); /* (the operator answers /metrics while its round runs: a scrape every
                         * 20 ms took 0.8 s of CPU from a 3 s round on 2 cores) */
    }
    return -1;
}

/* The last "<what> ... N ms" figure the operator logged (its own account of a restart). */
static long logged_ms(bench *b, const char *what)
{
    char path[300], line[1024];
    snprintf(path, sizeof path, "%s/operator.log", b->dir);
    FILE *f = fopen(path, "r");
    long ms = -1;
    while (f && fgets(line, sizeof line, f)) {
        char *p = strstr(line, what), *q = strstr(line, " ms");
        if (p && q) {
            while (q > line && q[-1] >= '0' && q[-1] <= '9')
                q--;
            ms = atol(q);
        }
    }
    if (f)
        fclose(f);
    return ms;
}

static void bench_many(bench *b, int jobs, int pods)
{
    start_standin(b, "phase-only");
    kubectl(b, "apply -f " EDL_SOURCE_DIR "/deploy/k8s/crd.yaml");
    int64_t t0 = now_ms();
    create_jobs(b, jobs, pods);
    printf("many: %d TrainingJobs created in %.1f s\n", jobs, (double)(now_ms() - t0) / 1000);
    start_operator(b, "many-a");
    t0 = now_ms();
    for (;;) {
        long created = standin_stat(b, "create pods");
        if (created >= (long)jobs * pods)
            break;
        if (now_ms() - t0 > 600000)
            die("the operator did not create every pod within 10 minutes");
        usleep(200000);
    }
    printf("many: %d pods created in %.1f s\n", jobs * pods, (double)(now_ms() - t0) / 1000);
    sleep(3); /* the last status writes */
    long rss0, tk0, rss1, tk1;
    proc_usage(b->op, &tk0, &rss0);
    sleep(10);
    proc_usage(b->op, &tk1, &rss1);
    long hz = sysconf(_SC_CLK_TCK);
    printf("many: operator RSS managing %d jobs of %d pods  %7.1f MiB  (goal < 100 MiB)\n",
           jobs, pods, (double)rss1 / 1024);
    printf("many: operator CPU while idle                     %7.2f %% of one core\n",
           100.0 * (double)(tk1 - tk0) / (double)hz / 10.0);
    kill(b->op, SIGTERM); /* releases the Lease: the next one leads at once */
    waitpid(b->op, NULL, 0);
    if (getenv("EDL_BENCH_PAUSE")) /* look at the stand-in by hand */
        sleep((unsigned)atoi(getenv("EDL_BENCH_PAUSE")));
    start_operator(b, "many-b");
    int64_t ms = wait_metric("edl_operator_reconciles_total", jobs, 60000);
    if (ms < 0)
        printf("many: relist after a restart: not done within 60 s\n");
    else
        printf("many: restart -> every job listed and passed once %7.1f ms  (goal < 2000 ms; "
               "from the process start, as /metrics saw it)\n", (double)ms);
    usleep(200000);
    long listed = logged_ms(b, "operator: listed "), passed = logged_ms(b, "every job passed once");
    printf("many:   of which listing %d jobs and %d pods      %7ld ms  (the stand-in serves %d "
           "pages of 500 pods)\n", jobs, jobs * pods, listed, (jobs * pods + 499) / 500);
    printf("many:   and the first pass over every job        %7ld ms  (etcd: a term and a "
           "snapshot per job)\n", passed - listed);
    long rss2, tk2;
    proc_usage(b->op, &tk2, &rss2);
    printf("many: RSS of the restarted operator               %7.1f MiB\n", (double)rss2 / 1024);
    kill(b->op, SIGTERM);
    waitpid(b->op, NULL, 0);
    kill(b->standin, SIGTERM);
    waitpid(b->standin, NULL, 0);
}

int main(int argc, char **argv)
{
    int trials = 5, jobs = 1000, pods = 10, split_pods = 1000;
    const char *only = NULL;
    static const struct option opts[] = {{"trials", required_argument, 0, 't'},
                                          {"jobs", required_argument, 0, 'j'},
                                          {"pods", required_argument, 0, 'p'},
                                          {"split-pods", required_argument, 0, 's'},
                                          {"only", required_argument, 0, 'o'},
                                          {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 't': trials = atoi(optarg); break;
        case 'j': jobs = atoi(optarg); break;
        case 'p': pods = atoi(optarg); break;
        case 's': split_pods = atoi(optarg); break;
        case 'o': only = optarg; break;
        case 'h':
            printf("Usage: operator [--trials 5] [--jobs 1000] [--pods 10] [--split-pods 1000] "
                   "[--only scale|split|many]\n");
            return 0;
        default: return 2;
        }
    }
    if (trials < 1 || jobs < 1 || pods < 1 || split_pods < 1)
        die("--trials, --jobs, --pods and --split-pods must be at least 1");
    if (only && strcmp(only, "scale") && strcmp(only, "split") && strcmp(only, "many"))
        die("--only takes scale, split or many");
    edl_log_setup(EDL_LOG_WARN, EDL_LOG_PLAIN, NULL);
    char path[8192];
    snprintf(path, sizeof path, "%s:%s", EDL_BIN_DIR, getenv("PATH") ? getenv("PATH") : "/bin");
    setenv("PATH", path, 1); /* the stand-in kubelet runs `edl-agent --install` from PATH */
    signal(SIGPIPE, SIG_IGN);
    bench b = {0};
    snprintf(b.dir, sizeof b.dir, "/tmp/edl-bench-operator-XXXXXX");
    if (!mkdtemp(b.dir))
        die("mkdtemp");
    snprintf(b.standin_log, sizeof b.standin_log, "%s/standin.log", b.dir);
    edl_etcd_server_opts so = {.quiet = true};
    if (edl_etcd_server_open(&so, &b.srv) != 0 ||
        edl_etcd_open_endpoints(edl_etcd_server_endpoints(b.srv), &b.c) != 0)
        die("cannot start etcd");
    if (!only || !strcmp(only, "scale"))
        bench_scale(&b, trials);
    if (!only || !strcmp(only, "split"))
        bench_split(&b, split_pods);
    if (!only || !strcmp(only, "many"))
        bench_many(&b, jobs, pods);
    edl_etcd_close(b.c);
    edl_etcd_server_close(b.srv);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", b.dir);
    if (getenv("EDL_BENCH_KEEP"))
        printf("kept %s (EDL_BENCH_KEEP)\n", b.dir);
    else if (system(cmd) != 0)
        return 1;
    return 0;
}

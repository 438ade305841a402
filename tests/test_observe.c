/* test_observe.c: seeing a job. `edl status --watch` under a pseudo-terminal redraws one screen
 * in place through a scale and a killed trainer, and prints plain blocks off a terminal; and a
 * real Prometheus (Debian's 2.42, on a free loopback port) scrapes a live `edl run` job and an
 * edl-ps through file-based discovery: every endpoint passes `promtool check metrics`, every
 * query of the chart's dashboard and every alert of its PrometheusRule (rendered by the real
 * helm, thresholds lowered) returns data after a scale and a kill, the stalled-trainer alert
 * fires for a trainer stopped with SIGSTOP, and `promtool check rules` passes. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "edl/etcd.h"
#include "edl/job.h"
#include "harness.h"

#define HELM EDL_SOURCE_DIR "/tests/.kube/bin/helm"
#define CHART EDL_SOURCE_DIR "/charts/edl"
#define DASHBOARD CHART "/dashboards/edl-job.json"

static edl_etcd_server *g_srv;
static edl_etcd *g_c;
static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    harness_open_etcd(1, NULL, &g_srv, &g_c);
    harness_scratch_open(g_dir, sizeof g_dir, "/tmp/edl-test-observe.XXXXXX", false);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    harness_close_etcd(&g_srv, &g_c);
    harness_scratch_close(g_dir);
    return 0;
}

static const char *ep(void)
{
    return edl_etcd_server_endpoints(g_srv);
}

/* ---- the job -------------------------------------------------------------------------------- */

/* `edl run` of the example trainer on the test's etcd: 2 to 3 members, 3 agents. */
static pid_t start_job(const char *job)
{
    char ckpt[300], log[300];
    snprintf(ckpt, sizeof ckpt, "file://%s/%s-ckpt", g_dir, job);
    snprintf(log, sizeof log, "%s/%s.log", g_dir, job);
    const char *argv[] = {EDL_CLI_BIN, "run", "--job", job, "--np", "2:3", "--replicas", "3",
                          "--etcd", ep(), "--settle-ms", "300", "--grace-ms", "2000",
                          "--checkpoint-uri", ckpt, "--", EDL_EXAMPLE_TRAINER, "--steps",
                          "100000000", "--step-ms", "50", NULL};
    pid_t pid = harness_spawn(argv, log);
    assert_true(pid > 0);
    return pid;
}

static int edl_cmd(const char *const *args)
{
    char out[4096];
    return harness_edl(g_dir, 30000, out, sizeof out, args);
}

static char *key(const char *job, edl_job_key_kind kind, const char *pod)
{
    static char buf[4][256];
    static int k;
    return harness_job_key(buf[k++ % 4], 256, job, kind, pod, 0);
}

/* The pod's status as its agent wrote it (false: none yet). */
static bool pod_status(const char *job, const char *pod, edl_pod_status *st)
{
    char buf[4096], err[128];
    return harness_get(g_c, key(job, EDL_KEY_STATUS, pod), buf, sizeof buf) &&
           edl_pod_status_parse(buf, strlen(buf), st, err, sizeof err) == 0;
}

/* Wait for a running generation with n members and at least `restarts`, whose every trainer
 * has stepped in it. */
static void wait_stepping(const char *job, int n, int restarts, edl_generation *g)
{
    int64_t end = harness_now_ms() + 60000; /* a loaded machine: three trainers start slowly */
    while (harness_now_ms() < end) {
        char buf[65536], err[256];
        edl_generation_clear(g);
        if (harness_get(g_c, key(job, EDL_KEY_GENERATION, NULL), buf, sizeof buf) &&
            edl_generation_parse(buf, strlen(buf), g, err, sizeof err) == 0 &&
            g->state == EDL_JOB_RUNNING && (int)g->n_members == n && g->restarts >= restarts) {
            int stepping = 0;
            for (size_t i = 0; i < g->n_members; i++) {
                edl_pod_status st;
                stepping += pod_status(job, g->members[i].pod, &st) &&
                            st.generation == edl_generation_of_members(g) && st.step > 0;
            }
            if (stepping == n)
                return;
        }
        harness_sleep_ms(50);
    }
    fail_msg("job %s: no generation of %d stepping members (restarts >= %d) within 60 s", job, n,
             restarts);
}

static pid_t trainer_pid(const char *job, const char *pod)
{
    edl_pod_status st;
    assert_true(pod_status(job, pod, &st));
    assert_true(st.pid > 0);
    return (pid_t)st.pid;
}

static void scale(const char *job, const char *n)
{
    const char *args[] = {"scale", job, n, "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(args), 0);
}

static void stop_job(const char *job, pid_t run)
{
    const char *args[] = {"stop", job, "--etcd", ep(), NULL};
    edl_cmd(args);
    if (harness_wait_exit(run, 30000) < 0)
        harness_kill(run, SIGKILL);
}

/* ---- the watch under a pseudo-terminal ------------------------------------------------------ */

typedef struct term {
    int fd;
    pid_t pid;
    char *buf; /* everything it wrote */
    size_t len, cap;
} term;

static void term_read(term *t)
{
    char chunk[8192];
    ssize_t n;
    while ((n = read(t->fd, chunk, sizeof chunk)) > 0) {
        if (t->len + (size_t)n + 1 > t->cap) {
            t->cap = (t->len + (size_t)n + 1) * 2;
            t->buf = realloc(t->buf, t->cap);
            assert_non_null(t->buf);
        }
        memcpy(t->buf + t->len, chunk, (size_t)n);
        t->len += (size_t)n;
        t->buf[t->len] = '\0';
    }
}

/* The last complete screen: between the last two clear-screen sequences. */
static const char *last_screen(const term *t, char *out, size_t n)
{
    static const char clear[] = "\033[H\033[2J";
    const char *last = NULL, *prev = NULL;
    for (const char *p = t->buf; p && (p = strstr(p, clear)); p += sizeof clear - 1)
        prev = last, last = p;
    out[0] = '\0';
    if (prev)
        snprintf(out, n, "%.*s", (int)(last - prev), prev + sizeof clear - 1);
    return out;
}

/* Wait until one screen shows every string of want (NULL-ended). */
static void term_wait(term *t, const char *const *want, const char *what)
{
    static char screen[65536];
    int64_t end = harness_now_ms() + 30000;
    while (harness_now_ms() < end) {
        term_read(t);
        last_screen(t, screen, sizeof screen);
        bool all = true;
        for (size_t i = 0; want[i] && all; i++)
            all = strstr(screen, want[i]) != NULL;
        if (all)
            return;
        harness_sleep_ms(50);
    }
    fail_msg("the watch never showed %s; its last screen:\n%s", what, screen);
}

static void test_watch_redraws_a_scale_and_a_kill_in_place(void **state)
{
    (void)state;
    const char *job = "watched";
    pid_t run = start_job(job);
    edl_generation g = {0};
    wait_stepping(job, 3, 0, &g);
    term t = {0};
    struct winsize ws = {.ws_row = 50, .ws_col = 160};
    t.pid = forkpty(&t.fd, NULL, NULL, &ws);
    assert_true(t.pid >= 0);
    if (t.pid == 0) {
        execl(EDL_CLI_BIN, "edl", "status", job, "-w", "--interval", "0.2", "--etcd", ep(),
              (char *)NULL);
        _exit(127);
    }
    fcntl(t.fd, F_SETFL, O_NONBLOCK);
    term_wait(&t, (const char *[]){"world size 3", "STEP/S", "LAST STEP", " s ago",
                                   "newest checkpoint: step", NULL}, "three stepping ranks");
    /* the trainers said their total ("total" progress line): the time to the end */
    term_wait(&t, (const char *[]){"time to the end: step ", " of 100000000, about ", "h ",
                                   " steps/s", NULL}, "the time to the end");
    char left[EDL_NAME_MAX + 16];
    scale(job, "2");
    wait_stepping(job, 2, 0, &g);
    snprintf(left, sizeof left, "pod %s-2 left", job); /* the newest pod goes first */
    term_wait(&t, (const char *[]){"world size 2", left, "formed in", NULL},
              "the scale to two with its re-formation time");
    assert_int_equal(kill(trainer_pid(job, g.members[1].pod), SIGKILL), 0);
    wait_stepping(job, 2, 1, &g);
    term_wait(&t, (const char *[]){"world size 2, 1 restarts", "restart 1 of", NULL},
              "the restart after the killed trainer");
    char screen[65536];
    last_screen(&t, screen, sizeof screen);
    print_message("the watch's screen after the scale and the kill:\n%s\n", screen);
    stop_job(job, run);
    int64_t end = harness_now_ms() + 10000; /* the job is over: the watch ends by itself */
    int status = -1;
    while (harness_now_ms() < end && waitpid(t.pid, &status, WNOHANG) == 0) {
        term_read(&t);
        harness_sleep_ms(50);
    }
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* off a terminal: plain blocks, no escape sequences, and the end of a stopped job */
    char cmd[1024], out[65536];
    snprintf(cmd, sizeof cmd, "%s status %s --watch --etcd %s", EDL_CLI_BIN, job, ep());
    assert_int_equal(harness_shell(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "--- "));
    assert_non_null(strstr(out, "stopped, generation"));
    assert_null(strchr(out, '\033'));
    close(t.fd);
    free(t.buf);
    edl_generation_clear(&g);
}

/* ---- a real Prometheus ---------------------------------------------------------------------- */

typedef struct prom {
    pid_t pid;
    int port;
} prom;

/* The chart's PrometheusRule as a rules file, thresholds low enough that each alert holds. */
static void render_rules(const char *path)
{
    char cmd[2048], out[256];
    snprintf(cmd, sizeof cmd,
             "%s template t %s --set monitoring.rules.enabled=true --set monitoring.rules.for=2s"
             " --set monitoring.rules.stalledSeconds=3 --set monitoring.rules.reformations=0"
             " --set monitoring.rules.restartsLeft=100"
             " --set monitoring.rules.checkpointAgeSeconds=0 --set monitoring.rules.shardsLost=-1"
             " --show-only templates/monitoring.yaml | awk '/^spec:/{f=1;next} f{sub(/^  /,\"\");"
             " print}' > %s && promtool check rules %s", HELM, CHART, path, path);
    if (harness_shell(cmd, out, sizeof out) != 0)
        fail_msg("rendering or checking the rules failed: %s", out);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static prom start_prometheus(const char *targets, const char *rules)
{
    char cfg[300], text[2048], tsdb[300], addr[64], log[300];
    prom p = {.port = harness_free_port()};
    snprintf(cfg, sizeof cfg, "%s/prometheus.yml", g_dir);
    snprintf(text, sizeof text,
             "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
             "rule_files: [%s]\n"
             "scrape_configs:\n"
             "  - job_name: edl\n"
             "    honor_labels: true\n" /* the samples' own job label names the edl job */
             "    file_sd_configs: [{files: [%s], refresh_interval: 1s}]\n", rules, targets);
    write_file(cfg, text);
    snprintf(tsdb, sizeof tsdb, "--storage.tsdb.path=%s/tsdb", g_dir);
    snprintf(addr, sizeof addr, "--web.listen-address=127.0.0.1:%d", p.port);
    snprintf(cfg, sizeof cfg, "--config.file=%s/prometheus.yml", g_dir);
    snprintf(log, sizeof log, "%s/prometheus.log", g_dir);
    const char *argv[] = {"prometheus", cfg, tsdb, addr, "--log.level=warn", NULL};
    p.pid = harness_spawn(argv, log);
    assert_true(p.pid > 0);
    char body[1024];
    if (!HARNESS_WAIT_UNTIL(harness_http_get(p.port, "/-/ready", body, sizeof body) == 200,
                            20000))
        fail_msg("prometheus not ready within 20 s (its log: %s): %s", log, body);
    return p;
}

/* An instant query's first sample: true with its labels and value when the result has one. */
static bool query(const prom *p, const char *expr, char *labels, size_t ln, char *value,
                  size_t vn)
{
    char qf[300], cmd[600];
    static char out[1 << 20];
    snprintf(qf, sizeof qf, "%s/query", g_dir);
    write_file(qf, expr);
    snprintf(cmd, sizeof cmd, "curl -sf --data-urlencode query@%s http://127.0.0.1:%d/api/v1/query",
             qf, p->port);
    if (harness_shell(cmd, out, sizeof out) != 0)
        fail_msg("query refused: %s\n%s", expr, out);
    cJSON *o = cJSON_Parse(out);
    const cJSON *r = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "data"), "result");
    const cJSON *first = cJSON_GetArrayItem(r, 0);
    const cJSON *v = cJSON_GetArrayItem(cJSON_GetObjectItem(first, "value"), 1);
    bool ok = cJSON_IsString(v) && strcmp(v->valuestring, "NaN") != 0;
    if (ok) {
        char *l = cJSON_PrintUnformatted(cJSON_GetObjectItem(first, "metric"));
        snprintf(labels, ln, "%s", l ? l : "");
        snprintf(value, vn, "%s", v->valuestring);
        free(l);
    }
    cJSON_Delete(o);
    return ok;
}

/* Poll the query until it returns a sample (a rate needs two scrapes). */
static void query_wait(const prom *p, const char *expr, const char *what, char *value, size_t vn)
{
    char labels[1024];
    if (!HARNESS_WAIT_UNTIL(query(p, expr, labels, sizeof labels, value, vn), 20000))
        fail_msg("%s: no data from %s", what, expr);
    print_message("%s | %s | %s %s\n", what, expr, labels, value);
}

/* Every target of the file: up, and its /metrics passes promtool. */
static void check_endpoints(const char *const *urls)
{
    for (size_t i = 0; urls[i]; i++) {
        char cmd[512], out[4096];
        snprintf(cmd, sizeof cmd, "curl -sf %s/metrics | promtool check metrics 2>&1", urls[i]);
        if (harness_shell(cmd, out, sizeof out) != 0 || out[0])
            fail_msg("promtool check metrics on %s: %s", urls[i], out);
    }
}

/* The job server's /metrics port, from its line in `edl run`'s output (the last: a job server
 * that `edl run` restarted binds another). */
static int jobserver_port(const char *job)
{
    static const char said[] = "/metrics at http://127.0.0.1:";
    char path[300], text[65536];
    snprintf(path, sizeof path, "%s/%s.log", g_dir, job);
    assert_non_null(harness_read_file(path, text, sizeof text));
    const char *p = strstr(text, said), *last = NULL;
    for (; p; p = strstr(p + 1, said))
        last = p;
    assert_non_null(last);
    return atoi(last + strlen(said));
}

static int agent_port(const char *job, const char *pod)
{
    char buf[4096], err[128];
    edl_pod p = {0};
    assert_non_null(harness_get(g_c, key(job, EDL_KEY_POD, pod), buf, sizeof buf));
    assert_int_equal(edl_pod_parse(buf, strlen(buf), &p, err, sizeof err), 0);
    int port = p.metrics_port;
    edl_pod_clear(&p);
    assert_true(port > 0);
    return port;
}

/* A standalone parameter server of the job with its /metrics. */
static pid_t start_ps(const char *job, int mport)
{
    char port[16], log[300];
    snprintf(port, sizeof port, "%d", mport);
    snprintf(log, sizeof log, "%s/ps.log", g_dir);
    setenv("EDL_JOB_SECRET", "0123456789abcdef0123456789abcdef", 1);
    setenv("EDL_POD_ID", "observed-ps-0", 1);
    const char *argv[] = {EDL_PS_BIN, "--job", job, "--metrics-port", port, "--metrics-addr",
                          "127.0.0.1", "--threads", "1", NULL};
    pid_t pid = harness_spawn(argv, log);
    unsetenv("EDL_POD_ID"); /* the job's own processes get theirs from edl run */
    unsetenv("EDL_JOB_SECRET");
    assert_true(pid > 0);
    return pid;
}

/* Every query of every panel of the dashboard, $job replaced. */
static void check_panels(const prom *p, const char *job)
{
    char text[1 << 16], expr[2048], value[64];
    assert_non_null(harness_read_file(DASHBOARD, text, sizeof text));
    cJSON *d = cJSON_Parse(text), *panel;
    assert_non_null(d);
    int n = 0;
    cJSON_ArrayForEach(panel, cJSON_GetObjectItem(d, "panels")) {
        const cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(panel, "targets")) {
            const char *e = cJSON_GetObjectItem(t, "expr")->valuestring;
            size_t o = 0;
            for (const char *c = e; *c && o < sizeof expr - 64; c++) {
                if (strncmp(c, "$job", 4) == 0) {
                    o += (size_t)snprintf(expr + o, 64, "%s", job);
                    c += 3;
                } else {
                    expr[o++] = *c;
                }
            }
            expr[o] = '\0';
            query_wait(p, expr, cJSON_GetObjectItem(panel, "title")->valuestring, value,
                       sizeof value);
            n++;
        }
    }
    cJSON_Delete(d);
    assert_true(n >= 12);
}

/* Every alert's expression returns data (the thresholds make them hold). */
static void check_alert_exprs(const prom *p, const char *rules)
{
    char text[16384], value[64];
    assert_non_null(harness_read_file(rules, text, sizeof text));
    int n = 0;
    for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n")) {
        char *e = strstr(l, "expr: ");
        if (e) {
            query_wait(p, e + strlen("expr: "), "alert", value, sizeof value);
            n++;
        }
    }
    assert_int_equal(n, 5);
}

/* Whether /api/v1/alerts lists the alert firing for the pod. */
static bool firing(const char *body, const char *alert, const char *pod)
{
    const char *json = strstr(body, "\r\n\r\n");
    cJSON *o = json ? cJSON_Parse(json + 4) : NULL, *a;
    bool found = false;
    cJSON_ArrayForEach(a, cJSON_GetObjectItem(cJSON_GetObjectItem(o, "data"), "alerts")) {
        const cJSON *l = cJSON_GetObjectItem(a, "labels");
        const cJSON *name = cJSON_GetObjectItem(l, "alertname"), *p = cJSON_GetObjectItem(l, "pod");
        const cJSON *st = cJSON_GetObjectItem(a, "state");
        found |= cJSON_IsString(name) && strcmp(name->valuestring, alert) == 0 &&
                 cJSON_IsString(p) && strcmp(p->valuestring, pod) == 0 && cJSON_IsString(st) &&
                 strcmp(st->valuestring, "firing") == 0;
    }
    cJSON_Delete(o);
    return found;
}

static void wait_firing(const prom *p, const char *alert, const char *pod)
{
    static char body[1 << 18];
    if (!HARNESS_WAIT_UNTIL(harness_http_get(p->port, "/api/v1/alerts", body, sizeof body) ==
                            200 && firing(body, alert, pod), 20000))
        fail_msg("%s never fired for %s:\n%s", alert, pod, body);
    print_message("%s fired for %s\n", alert, pod);
}

/* EDL_OBSERVE_PNG=path: the dashboard drawn from this Prometheus (docs/observability.md's
 * picture) by scripts/render-dashboard. */
static void render_png(const prom *p, const char *job)
{
    const char *png = getenv("EDL_OBSERVE_PNG");
    if (!png)
        return;
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, EDL_SOURCE_DIR "/scripts/render-dashboard http://127.0.0.1:%d %s "
             "%s 2>&1", p->port, job, png);
    if (harness_shell(cmd, out, sizeof out) != 0)
        fail_msg("scripts/render-dashboard: %s", out);
}

static void test_prometheus_sees_every_panel_and_alert(void **state)
{
    (void)state;
    char which[256];
    if (access(HELM, X_OK) != 0 || !harness_which("prometheus", which, sizeof which) ||
        !harness_which("promtool", which, sizeof which)) {
        print_message("no helm, prometheus or promtool (scripts/install-deps installs them)\n");
        skip();
    }
    const char *job = "observed";
    char rules[300], targets[300], text[2048], urls[5][64];
    snprintf(rules, sizeof rules, "%s/rules.yaml", g_dir);
    snprintf(targets, sizeof targets, "%s/targets.json", g_dir);
    render_rules(rules);
    int ps_port = harness_free_port();
    pid_t ps = start_ps(job, ps_port);
    pid_t run = start_job(job);
    edl_generation g = {0};
    wait_stepping(job, 3, 0, &g);
    int ports[5] = {jobserver_port(job), ps_port};
    for (int i = 0; i < 3; i++)
        ports[2 + i] = agent_port(job, g.members[i].pod);
    size_t o = (size_t)snprintf(text, sizeof text, "[{\"targets\": [");
    for (int i = 0; i < 5; i++) {
        snprintf(urls[i], sizeof urls[i], "http://127.0.0.1:%d", ports[i]);
        o += (size_t)snprintf(text + o, sizeof text - o, "%s\"127.0.0.1:%d\"", i ? ", " : "",
                              ports[i]);
    }
    snprintf(text + o, sizeof text - o, "]}]\n");
    write_file(targets, text);
    check_endpoints((const char *[]){urls[0], urls[1], urls[2], urls[3], urls[4], NULL});
    prom p = start_prometheus(targets, rules);
    char value[64];
    query_wait(&p, "count(up == 1) == 5", "every target up", value, sizeof value);
    scale(job, "2");
    wait_stepping(job, 2, 0, &g);
    assert_int_equal(kill(trainer_pid(job, g.members[1].pod), SIGKILL), 0);
    wait_stepping(job, 2, 1, &g);
    check_panels(&p, job);
    pid_t stopped = trainer_pid(job, g.members[0].pod);
    assert_int_equal(kill(stopped, SIGSTOP), 0);
    wait_firing(&p, "EdlTrainerStalled", g.members[0].pod);
    check_alert_exprs(&p, rules);
    kill(stopped, SIGCONT);
    render_png(&p, job);
    harness_kill(p.pid, SIGTERM);
    harness_wait_exit(p.pid, 10000);
    stop_job(job, run);
    harness_kill(ps, SIGTERM);
    harness_wait_exit(ps, 10000);
    edl_generation_clear(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_watch_redraws_a_scale_and_a_kill_in_place, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_prometheus_sees_every_panel_and_alert, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_edl_roles.c: `edl run` with roles beside the workers: parameter servers (--ps: the same
 * trainer in both roles, servers scaled without restarting anyone), teachers registered in a
 * service, a distillation student following teachers that scale and die, and examples/ctr
 * training while servers and workers join and die. Set-up: edl_run_common.c. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "edl/discovery.h"
#include "edl/job.h"
#include "edl/etcd.h"
#include "edl_run_common.h"
#include "harness.h"

#include <cjson/cJSON.h>

/* ---- parameter servers --------------------------------------------------------------------- */

/* The pids (second field) of a starts file's lines, in order; returns how many. */
static int start_pids(const char *path, long *pids, int max)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    int n = 0;
    while (f && n < max && fgets(line, sizeof line, f)) {
        char pod[128];
        if (sscanf(line, "%127s %ld", pod, &pids[n]) == 2)
            n++;
    }
    if (f)
        fclose(f);
    return n;
}

/* Wait for a running generation with n_members workers and n_servers servers. */
static void wait_servers(const char *job, size_t n_servers, int timeout_ms, edl_generation *c)
{
    int64_t deadline = harness_now_ms() + timeout_ms;
    while (harness_now_ms() < deadline) {
        if (read_generation(job, c) && c->state == EDL_JOB_RUNNING && c->n_servers == n_servers)
            return;
        harness_sleep_ms(20);
    }
    fail_msg("job %s: no running generation with %zu servers within %d ms (generation %lld, "
             "%zu servers)", job, n_servers, timeout_ms, (long long)c->generation,
             c->n_servers);
}

/* The pid a pod's status reports for generation gen while running (0: not so). */
static long running_pid(const char *job, const char *pod, int64_t gen)
{
    char buf[2048], err[128];
    edl_pod_status st;
    if (!harness_get(g_c, key(job, EDL_KEY_STATUS, pod), buf, sizeof buf) ||
        edl_pod_status_parse(buf, strlen(buf), &st, err, sizeof err) != 0 ||
        st.generation != gen || st.state != EDL_TRAINER_RUNNING)
        return 0;
    return (long)st.pid;
}

/* `edl run --np 2 --ps 2:3 --ps-replicas 2`: one trainer command in both roles (it reads
 * TRAINING_ROLE); the job runs once two servers are there, the workers see both; `edl scale JOB
 * 3 --role ps` adds a server in a new generation without restarting a worker or a server;
 * the workers exit 0 and the job succeeds, the servers are stopped with it. */
static void test_ps_role_end_to_end(void **state)
{
    (void)state;
    const char *job = "psjob";
    char script[1400], ws[300], ps[300], go[300];
    snprintf(ws, sizeof ws, "%s/w.starts", g_dir);
    snprintf(ps, sizeof ps, "%s/ps.starts", g_dir);
    snprintf(go, sizeof go, "%s/go", g_dir);
    snprintf(script, sizeof script,
             "d=%s; env > $d/env.$EDL_POD_ID; "
             "if [ \"$TRAINING_ROLE\" = PSERVER ]; then "
             "echo \"$EDL_POD_ID $$ $EDL_PS_INDEX $PADDLE_PSERVERS_IP_PORT_LIST $PADDLE_PORT "
             "$POD_IP $PADDLE_TRAINERS_NUM\" >> $d/ps.starts; trap 'exit 0' TERM; "
             "while :; do sleep 0.05; done; fi; "
             "case \"$PADDLE_PSERVERS_IP_PORT_LIST\" in *:*,*:*) ;; *) exit 7;; esac; "
             "echo \"$EDL_POD_ID $$ $EDL_RANK $PADDLE_PSERVERS_IP_PORT_LIST $EDL_PS_SERVERS\" "
             ">> $d/w.starts; while [ ! -f $d/go ]; do sleep 0.05; done; exit 0",
             g_dir);
    const char *opts[] = {"--np", "2", "--ps", "2:3", "--ps-replicas", "2", "--etcd", ep(),
                          "--settle-ms", "300", "--grace-ms", "2000", NULL};
    pid_t run = edl_run(job, opts, script);
    edl_generation c = {0};
    wait_running(job, 2, 30000, &c);
    assert_int_equal(c.n_servers, 2);
    int64_t g1 = c.generation;
    long wp[8], sp[8];
    int64_t end = harness_now_ms() + 5000;
    while (harness_now_ms() < end && (start_pids(ws, wp, 8) < 2 || start_pids(ps, sp, 8) < 2))
        harness_sleep_ms(20);
    assert_int_equal(start_pids(ws, wp, 8), 2);
    assert_int_equal(start_pids(ps, sp, 8), 2);
    /* the workers see both servers in rank order; each server its own index and port */
    char list[256], v[512], path[300];
    snprintf(list, sizeof list, "%s:%d,%s:%d", c.servers[0].addr, c.servers[0].port,
             c.servers[1].addr, c.servers[1].port);
    for (int s = 0; s < 2; s++) {
        snprintf(path, sizeof path, "%s/env.%s", g_dir, c.servers[s].pod);
        assert_non_null(strstr(c.servers[s].pod, "psjob-ps-"));
        assert_string_equal(env_value(path, "TRAINING_ROLE", v, sizeof v), "PSERVER");
        assert_string_equal(env_value(path, "PADDLE_PSERVERS_IP_PORT_LIST", v, sizeof v), list);
        char want[16];
        snprintf(want, sizeof want, "%d", s);
        assert_string_equal(env_value(path, "EDL_PS_INDEX", v, sizeof v), want);
        snprintf(want, sizeof want, "%d", c.servers[s].port);
        assert_string_equal(env_value(path, "PADDLE_PORT", v, sizeof v), want);
        assert_string_equal(env_value(path, "PADDLE_TRAINERS_NUM", v, sizeof v), "2");
        assert_null(env_value(path, "RANK", v, sizeof v));
        assert_null(env_value(path, "PADDLE_TRAINER_ID", v, sizeof v));
    }
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof path, "%s/env.%s", g_dir, c.members[r].pod);
        assert_string_equal(env_value(path, "TRAINING_ROLE", v, sizeof v), "TRAINER");
        assert_string_equal(env_value(path, "PADDLE_PSERVERS_IP_PORT_LIST", v, sizeof v), list);
        assert_string_equal(env_value(path, "EDL_PS_SERVERS", v, sizeof v), "2");
    }

    /* a third server: a new generation, the same workers and servers keep their processes */
    char out[8192];
    const char *scale3[] = {"scale", job, "3", "--role", "ps", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, scale3), 0);
    assert_non_null(strstr(out, "ps replicas 2 -> 3"));
    wait_servers(job, 3, 20000, &c);
    assert_true(c.generation > g1);
    assert_int_equal(c.n_members, 2);
    end = harness_now_ms() + 5000; /* the agents report their trainers in the new generation */
    while (harness_now_ms() < end && !(running_pid(job, c.members[0].pod, c.generation) &&
                                       running_pid(job, c.members[1].pod, c.generation) &&
                                       running_pid(job, c.servers[2].pod, c.generation)))
        harness_sleep_ms(20);
    for (int r = 0; r < 2; r++) {
        long pid = running_pid(job, c.members[r].pod, c.generation);
        assert_true(pid == wp[0] || pid == wp[1]); /* the trainer of the first start */
    }
    for (int s = 0; s < 2; s++) {
        long pid = running_pid(job, c.servers[s].pod, c.generation);
        assert_true(pid == sp[0] || pid == sp[1]);
    }
    harness_sleep_ms(500); /* time to restart a worker, which it must not do */
    assert_int_equal(start_pids(ws, wp, 8), 2); /* no worker restarted */
    assert_int_equal(start_pids(ps, sp, 8), 3); /* only the new server started */
    assert_true(log_has(job, "edl", "3 servers [", NULL));

    /* edl status shows the servers; beyond ps max, or without a ps role: refused */
    const char *st[] = {"status", job, "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, st), 0);
    assert_non_null(strstr(out, "3 servers"));
    assert_non_null(strstr(out, "ps 2"));
    assert_non_null(strstr(out, "ps min 2, max 3, replicas 3"));
    const char *st_json[] = {"status", job, "--json", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, st_json), 0);
    assert_non_null(strstr(out, "\"servers\":["));
    const char *scale9[] = {"scale", job, "9", "--role", "ps", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, scale9), 2);
    assert_non_null(strstr(out, "beyond its ps max 3"));
    harness_put(g_c, key("nops", EDL_KEY_SPEC, NULL), "{\"min\":1}");
    const char *scale_nops[] = {"scale", "nops", "1", "--role", "ps", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, scale_nops), 2);
    assert_non_null(strstr(out, "has no ps role"));
    const char *bad_role[] = {"scale", job, "1", "--role", "teacher", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, bad_role), 2);

    /* the workers finish: success is theirs; the servers are stopped with the job */
    FILE *f = fopen(go, "w");
    assert_non_null(f);
    fclose(f);
    run_exits(job, run, 30000, 0);
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_SUCCEEDED);
    for (int s = 0; s < 3; s++)
        assert_int_equal(kill((pid_t)sp[s], 0), -1);
    edl_generation_clear(&c);
}

/* ---- teachers ------------------------------------------------------------------------------ */

/* The teachers' records of a service (names into names[], up to max); how many. */
static size_t teacher_names(const char *service, char names[][64], size_t max)
{
    edl_service_instance *list = NULL;
    size_t n = 0;
    int64_t rev;
    if (edl_service_list(g_c, NULL, service, &list, &n, &rev) != 0)
        return 0;
    for (size_t i = 0; i < n && i < max; i++)
        snprintf(names[i], 64, "%s", list[i].name);
    edl_service_list_free(list, n);
    return n;
}

static void wait_teachers(const char *service, size_t n, int timeout_ms)
{
    char names[8][64];
    int64_t end = harness_now_ms() + timeout_ms;
    while (harness_now_ms() < end && teacher_names(service, names, 8) != n)
        harness_sleep_ms(50);
    if (teacher_names(service, names, 8) != n)
        fail_msg("service %s: not %zu teachers within %d ms (%zu)", service, n, timeout_ms,
                 teacher_names(service, names, 8));
}

/* `edl run --np 1 --teachers 1:3 --service tsvc --teacher-replicas 1`: the same command as a
 * teacher (EDL_ROLE_NAME) registers once it serves; `edl scale --role teacher` 1 -> 3 -> 2
 * starts and stops teacher agents, never touching the generation; edl status lists them; bad
 * counts are refused; the job ends by its worker and the teachers leave the service. */
static void test_teacher_role_end_to_end(void **state)
{
    (void)state;
    const char *job = "tjob";
    char script[1400], go[300];
    snprintf(go, sizeof go, "%s/tgo", g_dir); /* not the ps test's */
    snprintf(script, sizeof script,
             "d=%s; if [ \"$EDL_ROLE_NAME\" = teacher ]; then env > $d/env.$EDL_POD_ID; "
             "T_DIR=$d exec %s; fi; while [ ! -f $d/tgo ]; do sleep 0.05; done; exit 0",
             g_dir, EDL_TEACHER_SERVER);
    const char *opts[] = {"--np", "1", "--teachers", "1:3", "--service", "tsvc",
                          "--teacher-replicas", "1", "--etcd", ep(), "--settle-ms", "300",
                          "--grace-ms", "2000", NULL};
    pid_t run = edl_run(job, opts, script);
    edl_generation c = {0};
    wait_running(job, 1, 30000, &c);
    int64_t g1 = c.generation;
    wait_teachers("tsvc", 1, 15000);
    char names[8][64], path[300], v[256];
    assert_int_equal(teacher_names("tsvc", names, 8), 1);
    assert_string_equal(names[0], "tjob-teacher-0");
    snprintf(path, sizeof path, "%s/env.tjob-teacher-0", g_dir);
    assert_string_equal(env_value(path, "EDL_SERVICE", v, sizeof v), "tsvc");
    assert_non_null(env_value(path, "PORT", v, sizeof v));
    assert_null(env_value(path, "RANK", v, sizeof v));

    char out[8192];
    const char *up[] = {"scale", job, "3", "--role", "teacher", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, up), 0);
    assert_non_null(strstr(out, "teacher replicas 1 -> 3"));
    wait_teachers("tsvc", 3, 15000);
    const char *down[] = {"scale", job, "2", "--role", "teacher", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, down), 0);
    wait_teachers("tsvc", 2, 15000);
    assert_int_equal(teacher_names("tsvc", names, 8), 2);
    assert_string_equal(names[0], "tjob-teacher-0"); /* the newest stopped */
    assert_string_equal(names[1], "tjob-teacher-1");
    assert_true(read_generation(job, &c));
    assert_int_equal(c.generation, g1); /* teachers are no members */
    assert_int_equal(c.n_members, 1);
    assert_int_equal(c.n_standbys, 0);

    const char *st[] = {"status", job, "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, st), 0);
    assert_non_null(strstr(out, "teachers: 2 registered in service tsvc"));
    assert_non_null(strstr(out, "tjob-teacher-1"));
    const char *st_json[] = {"status", job, "--json", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, st_json), 0);
    assert_non_null(strstr(out, "\"teachers\":[{"));
    const char *beyond[] = {"scale", job, "4", "--role", "teacher", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, beyond), 2);
    assert_non_null(strstr(out, "outside its teachers min..max 1..3"));
    const char *below[] = {"scale", job, "0", "--role", "teacher", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, below), 2);
    harness_put(g_c, key("noteach", EDL_KEY_SPEC, NULL), "{\"min\":1}");
    const char *none[] = {"scale", "noteach", "1", "--role", "teacher", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, none), 2);
    assert_non_null(strstr(out, "has no teacher role"));
    const char *bad_role[] = {"scale", job, "1", "--role", "student", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(out, sizeof out, bad_role), 2);

    FILE *f = fopen(go, "w");
    assert_non_null(f);
    fclose(f);
    run_exits(job, run, 30000, 0);
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_SUCCEEDED);
    assert_int_equal(teacher_names("tsvc", names, 8), 0); /* they left the service */
    edl_generation_clear(&c);

    /* usage: --teachers without --service, --service without --teachers */
    const char *no_svc[] = {"run", "--np", "1", "--teachers", "1", "--", "true", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, no_svc), 2);
    assert_non_null(strstr(out, "--teachers needs --service"));
    const char *no_teach[] = {"run", "--np", "1", "--service", "s", "--", "true", NULL};
    assert_int_equal(edl_cmd(out, sizeof out, no_teach), 2);
}

/* The offset just past the first `needle` in the file at path from offset `from`, waiting up to
 * timeout_ms for it to be written; fails the test otherwise. */
static long wait_in_file(const char *path, const char *needle, long from, int timeout_ms)
{
    int64_t end = harness_now_ms() + timeout_ms;
    static char buf[1 << 20];
    do {
        FILE *f = fopen(path, "r");
        size_t n = 0;
        if (f && fseek(f, from, SEEK_SET) == 0)
            n = fread(buf, 1, sizeof buf - 1, f);
        if (f)
            fclose(f);
        buf[n] = '\0';
        const char *p = strstr(buf, needle);
        if (p)
            return from + (long)(p - buf) + (long)strlen(needle);
        harness_sleep_ms(50);
    } while (harness_now_ms() < end);
    fail_msg("%s: no \"%s\" after byte %ld within %d ms", path, needle, from, timeout_ms);
    return -1;
}

/* examples/distill under `edl run --teachers 1:4 --service mlp`: the worker is the student, the
 * teachers the same program as teachers (EDL_ROLE_NAME). While the student trains, teachers are
 * scaled 1 -> 4 -> 2 and one teacher's server is SIGKILLed (its agent deregisters it at once,
 * then starts it again); the student follows the service each time (edl_discovery), no batch
 * is lost or answered twice, every prediction is the teacher's, and the student learns exactly
 * what the same student learns on labels computed in its own process. */
static void test_distill_student_follows_teachers_that_scale_and_die(void **state)
{
    (void)state;
    const char *job = "distjob";
    char script[1400], out[300], student[400], cmd[1024];
    snprintf(out, sizeof out, "%s/distill.out", g_dir);
    snprintf(script, sizeof script,
             "echo $$ > %s/pid.$EDL_POD_ID; exec %s --epochs 24 --service-time-ms 20 "
             ">>%s.$EDL_POD_ID 2>&1", g_dir, EDL_DISTILL_BIN, out);
    const char *opts[] = {"--np", "1", "--teachers", "1:4", "--service", "mlp",
                          "--teacher-replicas", "1", "--etcd", ep(), "--settle-ms", "300",
                          "--grace-ms", "2000", NULL};
    pid_t run = edl_run(job, opts, script);
    edl_generation c = {0};
    wait_running(job, 1, 30000, &c);
    snprintf(student, sizeof student, "%s.%s", out, c.members[0].pod);
    long at = wait_in_file(student, "teachers now 1 of 1", 0, 30000);
    char o2[8192];
    const char *up[] = {"scale", job, "4", "--role", "teacher", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(o2, sizeof o2, up), 0);
    at = wait_in_file(student, "teachers now 4 of 4", at, 30000);
    const char *down[] = {"scale", job, "2", "--role", "teacher", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(o2, sizeof o2, down), 0);
    at = wait_in_file(student, "teachers now 2 of 2", at, 30000);
    char names[8][64], pidpath[400], pidtext[32] = "";
    assert_int_equal(teacher_names("mlp", names, 8), 2);
    snprintf(pidpath, sizeof pidpath, "%s/pid.%s", g_dir, names[1]);
    FILE *f = fopen(pidpath, "r");
    assert_non_null(f);
    assert_non_null(fgets(pidtext, sizeof pidtext, f));
    fclose(f);
    assert_int_equal(kill((pid_t)atol(pidtext), SIGKILL), 0);
    at = wait_in_file(student, "teachers now 1 of 1", at, 10000); /* deregistered at once */
    at = wait_in_file(student, "teachers now 2 of 2", at, 30000); /* its agent started it again */
    snprintf(cmd, sizeof cmd, "grep -q 'distill: student: test accuracy' %s", student);
    assert_int_not_equal(system(cmd), 0); /* all of it while the student trained */
    assert_int_equal(edl_cmd(o2, sizeof o2, up), 0); /* four again, to finish sooner */
    run_exits(job, run, 120000, 0);
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_SUCCEEDED);
    assert_int_equal(c.restarts, 0);
    wait_in_file(student, "lost 0, duplicated 0, predictions differing from the local teacher 0",
                 0, 1000);
    f = fopen(student, "r");
    char line[1024];
    double remote = -1, local = -2;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "distill: student: test accuracy %lf on the teachers' labels, %lf",
                   &remote, &local) == 2)
            break;
    if (f)
        fclose(f);
    print_message("distill under edl run, teachers 1 -> 4 -> 2 and one killed: student accuracy "
                  "%.4f, on local labels %.4f\n", remote, local);
    assert_true(remote > 0.9);
    assert_true(remote == local); /* the same labels in the same order: the same student */
    assert_int_equal(teacher_names("mlp", names, 8), 0); /* the teachers left with the job */
    edl_generation_clear(&c);
}

/* The "test AUC" that examples/ctr printed into path (-1: none). */
static double ctr_auc(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    double auc = -1;
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "test AUC ");
        if (p)
            auc = atof(p + 9);
    }
    if (f)
        fclose(f);
    return auc;
}

/* examples/ctr under edl run with `args`, each pod's output appended to <dir>/<name>.out.<pod>
 * (out: that path without the pod), once `servers` servers serve (0: any), its 2 workers run
 * and both have stepped 20 times (the tables are on the servers then): c is that generation. */
static pid_t ctr_run(const char *job, const char *name, const char *args,
                     const char *const *opts, size_t servers, char *out, size_t outlen,
                     edl_generation *c)
{
    char script[1024];
    snprintf(out, outlen, "%s/%s.out", g_dir, name);
    snprintf(script, sizeof script, "exec %s %s >>%s.$EDL_POD_ID 2>&1", EDL_CTR_BIN, args, out);
    pid_t run = edl_run(job, opts, script);
    if (servers)
        wait_servers(job, servers, 60000, c);
    wait_running(job, 2, 60000, c);
    for (int r = 0; r < 2; r++)
        wait_step(job, c->members[r].pod, 20, 60000);
    return run;
}

/* examples/ctr (logistic regression plus embeddings on parameter servers) under edl run with
 * 2 workers and 2 elastic servers whose tables have 2 replicas: a third server joins while the
 * workers train, then one is SIGKILLed; the workers re-route, are never restarted, no shard
 * is lost (each had a backup), and the model learns. */
static void test_ctr_trains_while_servers_join_and_die(void **state)
{
    (void)state;
    const char *job = "ctrjob";
    char out[300], ckpt[400];
    snprintf(ckpt, sizeof ckpt, "file://%s/ctr-ckpt", g_dir);
    const char *opts[] = {"--np", "2", "--ps", "2:3", "--ps-replicas", "2", "--etcd", ep(),
                          "--settle-ms", "300", "--grace-ms", "5000", "--checkpoint-uri", ckpt,
                          NULL};
    edl_generation c = {0};
    pid_t run = ctr_run(job, "ctr", "--examples 600000 --test 20000 --replicas 2 --save-every 200",
                        opts, 0, out, sizeof out, &c);
    char w0[256], path[600], cmd[8192];
    snprintf(w0, sizeof w0, "%s", c.members[0].pod);
    const char *scale3[] = {"scale", job, "3", "--role", "ps", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(cmd, sizeof cmd, scale3), 0);
    wait_servers(job, 3, 30000, &c);
    int64_t end = harness_now_ms() + 10000; /* the third server serves: the workers go on */
    while (harness_now_ms() < end && !running_pid(job, c.servers[2].pod, c.generation))
        harness_sleep_ms(20);
    char joined[256];
    snprintf(joined, sizeof joined, "%s", c.servers[2].pod);
    long victim = running_pid(job, c.servers[0].pod, c.generation);
    assert_true(victim > 0);
    for (int r = 0; r < 2; r++) /* still training when a server dies */
        assert_true(running_pid(job, c.members[r].pod, c.generation) > 0);
    snprintf(path, sizeof path, "%s.%s", out, w0);
    assert_true(ctr_auc(path) < 0);
    assert_int_equal(kill((pid_t)victim, SIGKILL), 0);
    run_exits(job, run, 240000, 0);
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_SUCCEEDED);
    assert_int_equal(c.restarts, 0); /* no worker was restarted */
    snprintf(cmd, sizeof cmd, "grep -q 'sent .* shards to %s' %s.*", joined, out);
    /* the newcomer got its shards from the others */
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "grep -q 'were not handed over' %s.*", out);
    assert_int_not_equal(system(cmd), 0); /* the killed one's shards lived on its backups */
    snprintf(cmd, sizeof cmd, "grep -q 'worker 0 saved [1-9][0-9]* PS checkpoints' %s", path);
    assert_int_equal(system(cmd), 0); /* --save-every: PS checkpoints while servers changed */
    snprintf(cmd, sizeof cmd, "test -n \"$(find %s/ctr-ckpt -type f | head -1)\"", g_dir);
    assert_int_equal(system(cmd), 0);
    double auc = ctr_auc(path);
    print_message("ctr under edl run, 2 replicas, a server joined and one killed: test AUC "
                  "%.4f\n", auc);
    assert_true(auc > 0.72); /* one process learns 0.77 on this data, the planted model 0.84 */
    edl_generation_clear(&c);
}

/* examples/ctr under edl run with 2 workers and 2 servers whose tables have 1 replica (no
 * checkpoint): one server is SIGKILLed while the workers train. The survivor takes the dead
 * one's shards after the hand-over timeout and says so in one line a table (4 tables), each
 * with the dead server's count of its 1,024 shards, none restored, all from initial values,
 * and no line about a single shard (it printed one a shard: 2,088 lines); the job succeeds. */
static void test_ctr_a_server_killed_without_replicas_is_reported_once_a_table(void **state)
{
    (void)state;
    const char *job = "ctrlost";
    char out[300], cmd[1024];
    const char *opts[] = {"--np", "2", "--ps", "1:2", "--ps-replicas", "2", "--etcd", ep(),
                          "--settle-ms", "300", "--grace-ms", "5000", NULL};
    edl_generation c = {0};
    pid_t run = ctr_run(job, "ctrlost", "--examples 300000 --test 20000 --replicas 1", opts, 2,
                        out, sizeof out, &c);
    const char *names[2] = {c.servers[0].pod, c.servers[1].pod};
    int dead = 0; /* of each table's 1,024 shards, those the victim owned */
    for (uint32_t sh = 0; sh < 1024; sh++)
        dead += edl_ps_shard_owner(names, 2, sh) == 0;
    long victim = running_pid(job, c.servers[0].pod, c.generation);
    assert_true(victim > 0);
    assert_int_equal(kill((pid_t)victim, SIGKILL), 0);
    run_exits(job, run, 240000, 0);
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_SUCCEEDED);
    snprintf(cmd, sizeof cmd, "cat %s.* | grep -c 'shard [0-9]* of table'", out);
    char got[64] = "";
    harness_shell(cmd, got, sizeof got);
    if (atoi(got) != 0) /* nothing about single shards */
        fail_msg("%d lines about single shards of the killed server", atoi(got));
    for (int t = 0; t < 4; t++) {
        snprintf(cmd, sizeof cmd, "cat %s.* | grep -c 'ps: table %d: %d shards were not handed "
                 "over within 10000 ms (their server died?); no PS checkpoint holds them: 0 "
                 "restored, %d start again from initial values'", out, t, dead, dead);
        harness_shell(cmd, got, sizeof got);
        if (atoi(got) != 1)
            fail_msg("table %d: %d lines saying the %d shards of the killed server start again "
                     "(want 1)", t, atoi(got), dead);
    }
    snprintf(cmd, sizeof cmd, "cat %s.* | grep -c 'were not handed over'", out);
    harness_shell(cmd, got, sizeof got);
    print_message("ctr, 1 replica, a server SIGKILLed: %d lines about its shards (%d of each "
                  "table's 1,024)\n", atoi(got), dead);
    assert_int_equal(atoi(got), 4);
    edl_generation_clear(&c);
}

/* examples/ctr under edl run while workers join and die: a third worker joins, then one is
 * SIGKILLed. Each time the agents restart the workers (restart mode), and the restarted
 * workers resume at the job's progress as the servers count it, sharing the batches not yet
 * trained instead of starting over: the job trains its batches about once (a restart from the
 * first batch would train them up to three times) and the model learns. */
static void test_ctr_resumes_while_workers_join_and_die(void **state)
{
    (void)state;
    const char *job = "ctrwjob";
    char out[300], cmd[8192];
    const char *opts[] = {"--np", "2:3", "--replicas", "2", "--ps", "2", "--etcd", ep(),
                          "--settle-ms", "300", "--grace-ms", "5000", NULL};
    edl_generation c = {0};
    pid_t run = ctr_run(job, "ctrw", "--examples 1200000 --test 20000", opts, 0, out,
                        sizeof out, &c);
    const char *scale3[] = {"scale", job, "3", "--etcd", ep(), NULL};
    assert_int_equal(edl_cmd(cmd, sizeof cmd, scale3), 0);
    wait_running_after(job, c.generation, 3, 30000, &c);
    wait_step(job, c.members[2].pod, 1, 30000); /* the newcomer trains */
    long victim = running_pid(job, c.members[1].pod, c.generation);
    assert_true(victim > 0);
    assert_int_equal(kill((pid_t)victim, SIGKILL), 0);
    run_exits(job, run, 240000, 0);
    assert_true(read_generation(job, &c));
    assert_int_equal(c.state, EDL_JOB_SUCCEEDED);
    assert_int_equal(c.restarts, 1); /* the kill; the join restarted the workers for free */
    /* 3 workers resumed in each of the two later generations */
    snprintf(cmd, sizeof cmd, "test \"$(cat %s.* | grep -c 'of 3 resumes at batch [1-9]')\" = 6",
             out);
    assert_int_equal(system(cmd), 0);
    char path[600], line[1024];
    snprintf(path, sizeof path, "%s.%s", out, c.members[0].pod);
    long done = -1, total = -1;
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f))
        sscanf(line, "ctr: the job trained %ld batches of its %ld", &done, &total);
    if (f)
        fclose(f);
    print_message("ctr under edl run, a worker joined and one killed: the job trained %ld "
                  "batches of its %ld; test AUC %.4f\n", done, total, ctr_auc(path));
    assert_int_equal(total, 1200000 / 256);
    assert_true(done >= total * 98 / 100 && done <= total * 102 / 100);
    assert_true(ctr_auc(path) > 0.72);
    edl_generation_clear(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ps_role_end_to_end),
        cmocka_unit_test(test_teacher_role_end_to_end),
        cmocka_unit_test(test_distill_student_follows_teachers_that_scale_and_die),
        cmocka_unit_test(test_ctr_trains_while_servers_join_and_die),
        cmocka_unit_test(test_ctr_a_server_killed_without_replicas_is_reported_once_a_table),
        cmocka_unit_test(test_ctr_resumes_while_workers_join_and_die),
    };
    return cmocka_run_group_tests(tests, edl_run_setup, edl_run_teardown);
}

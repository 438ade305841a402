/* test_discovery.c: distillation's services in a real etcd: teachers' records registered,
 * listed and deregistered (bad records skipped, never fatal), a teacher's lease running out,
 * students that see teachers come and go within a second and agree on the assignment (100
 * students and 40 teachers in one process), and `edl service` against the same etcd. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "edl/discovery.h"
#include "harness.h"

static edl_etcd_server *srv;
static edl_etcd *cl;

static int setup(void **state)
{
    (void)state;
    harness_open_etcd(1, NULL, &srv, &cl);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    harness_close_etcd(&srv, &cl);
    return 0;
}

#define PREFIX "/edl/v1"

static edl_service_instance teacher(const char *name, const char *endpoint, int capacity)
{
    return (edl_service_instance){.name = (char *)name, .endpoint = (char *)endpoint,
                                  .capacity = capacity, .model = "mlp", .version = "3"};
}

static void reg(const char *svc, const char *name, int capacity, int64_t lease)
{
    char ep[96];
    snprintf(ep, sizeof ep, "http://10.0.0.1:%d", 8000 + (int)(strlen(name) % 100));
    edl_service_instance in = teacher(name, ep, capacity);
    assert_int_equal(edl_service_register(cl, PREFIX, svc, &in, lease), 0);
}

/* The names listed, space-separated, into buf. */
static char *listed(const char *svc, char *buf, size_t len)
{
    edl_service_instance *l;
    size_t n;
    int64_t rev = 0;
    assert_int_equal(edl_service_list(cl, PREFIX, svc, &l, &n, &rev), 0);
    assert_true(rev > 0);
    buf[0] = '\0';
    for (size_t i = 0; i < n; i++)
        snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", i ? " " : "", l[i].name);
    edl_service_list_free(l, n);
    return buf;
}

static void test_register_list_deregister_round_trip(void **state)
{
    (void)state;
    int64_t lease;
    assert_int_equal(edl_etcd_lease_grant(cl, 30, 0, &lease, NULL), 0);
    edl_service_instance b = teacher("t-b", "http://10.0.0.7:8500", 4);
    b.load = 0.25;
    assert_int_equal(edl_service_register(cl, PREFIX, "rt", &b, lease), 0);
    reg("rt", "t-a", 2, 0);
    edl_service_instance *l;
    size_t n;
    assert_int_equal(edl_service_list(cl, PREFIX, "rt", &l, &n, NULL), 0);
    assert_int_equal(n, 2);
    assert_string_equal(l[0].name, "t-a"); /* sorted by name */
    assert_int_equal(l[0].lease, 0);
    assert_string_equal(l[1].name, "t-b");
    assert_string_equal(l[1].endpoint, "http://10.0.0.7:8500");
    assert_int_equal(l[1].capacity, 4);
    assert_string_equal(l[1].model, "mlp");
    assert_string_equal(l[1].version, "3");
    assert_true(l[1].load == 0.25);
    assert_int_equal(l[1].lease, lease);
    edl_service_list_free(l, n);
    /* invalid names and records are refused and write nothing */
    edl_service_instance bad = teacher("t-c", "ftp://10.0.0.7", 1);
    assert_int_equal(edl_service_register(cl, PREFIX, "rt", &bad, 0), EDL_EINVAL);
    bad = teacher("t-c", "http://10.0.0.7", 0);
    assert_int_equal(edl_service_register(cl, PREFIX, "rt", &bad, 0), EDL_EINVAL);
    bad = teacher("T_C", "http://10.0.0.7", 1);
    assert_int_equal(edl_service_register(cl, PREFIX, "rt", &bad, 0), EDL_EINVAL);
    assert_int_equal(edl_service_register(cl, PREFIX, "r/t", &b, 0), EDL_EINVAL);
    char buf[256];
    assert_string_equal(listed("rt", buf, sizeof buf), "t-a t-b");
    assert_int_equal(edl_service_deregister(cl, PREFIX, "rt", "t-a"), 0);
    assert_int_equal(edl_service_deregister(cl, PREFIX, "rt", "t-a"), EDL_ENOTFOUND);
    assert_string_equal(listed("rt", buf, sizeof buf), "t-b");
    assert_int_equal(edl_etcd_lease_revoke(cl, lease), 0);
    assert_string_equal(listed("rt", buf, sizeof buf), "");
    assert_string_equal(listed("nothing-here", buf, sizeof buf), "");
}

/* The parser names what is wrong, and leaves out untouched. */
static void expect_parse_error(const char *json, const char *words)
{
    char err[256] = "";
    edl_service_instance out = {.capacity = 7};
    assert_int_equal(edl_service_instance_parse("t-x", json, strlen(json), &out, err, sizeof err),
                     EDL_EPROTO);
    if (!strstr(err, words))
        fail_msg("parsing %s said \"%s\", not \"%s\"", json, err, words);
    assert_int_equal(out.capacity, 7);
    assert_null(out.name);
}

static void test_parse_names_the_problem(void **state)
{
    (void)state;
    expect_parse_error("{\"capacity\":2}", "\"endpoint\" is required");
    expect_parse_error("{\"endpoint\":7}", "\"endpoint\"");
    expect_parse_error("{\"endpoint\":\"ftp://a\"}", "http");
    expect_parse_error("{\"endpoint\":\"http://\"}", "no host");
    expect_parse_error("{\"endpoint\":\"http://a\",\"capacity\":0}", "\"capacity\"");
    expect_parse_error("{\"endpoint\":\"http://a\",\"capacity\":65536}", "\"capacity\"");
    expect_parse_error("{\"endpoint\":\"http://a\",\"capacity\":\"4\"}", "\"capacity\"");
    expect_parse_error("{\"endpoint\":\"http://a\",\"load\":-1}", "\"load\"");
    expect_parse_error("{\"endpoint\":\"http://a\",\"model\":[]}", "\"model\"");
    expect_parse_error("{\"endpoint\":\"http://a\"", "not valid JSON");
    expect_parse_error("[1]", "not a JSON object");
    char big[EDL_SERVICE_RECORD_MAX + 64];
    snprintf(big, sizeof big, "{\"endpoint\":\"http://a\",\"model\":\"%0*d\"}",
             EDL_SERVICE_RECORD_MAX, 0);
    expect_parse_error(big, "");
    edl_service_instance out = {0};
    const char *ok = "{\"endpoint\":\"https://h:1/x\",\"future\":{\"a\":1}}";
    assert_int_equal(edl_service_instance_parse("t-x", ok, strlen(ok), &out, NULL, 0), 0);
    assert_int_equal(out.capacity, 1);
    assert_string_equal(out.model, "");
    assert_string_equal(out.name, "t-x");
    edl_service_instance_clear(&out);
}

static void test_malformed_records_are_skipped(void **state)
{
    (void)state;
    const char *ep = edl_etcd_server_endpoints(srv);
    reg("mal", "t-good", 3, 0);
    const char *dir = PREFIX "/services/mal/teachers/";
    assert_int_equal(harness_etcdctl(ep, NULL, "put %st-json '{\"endpoint\":'", dir), 0);
    assert_int_equal(harness_etcdctl(ep, NULL, "put %st-type '{\"endpoint\":\"http://a\","
                                     "\"capacity\":\"lots\"}'", dir), 0);
    assert_int_equal(harness_etcdctl(ep, NULL, "put %st-ftp '{\"endpoint\":\"ftp://a\"}'", dir), 0);
    assert_int_equal(harness_etcdctl(ep, NULL, "put %sT_BAD '{\"endpoint\":\"http://a\"}'", dir), 0);
    assert_int_equal(harness_etcdctl(ep, NULL, "put %snested/t-x '{\"endpoint\":\"http://a\"}'",
                                     dir), 0);
    char *huge = malloc(100000);
    assert_non_null(huge);
    snprintf(huge, 100000, "{\"endpoint\":\"http://a\",\"model\":\"%0*d\"}", 90000, 0);
    harness_put(cl, PREFIX "/services/mal/teachers/t-huge", huge);
    free(huge);
    const char nul_key[] = PREFIX "/services/mal/teachers/t-good\0x";
    assert_int_equal(edl_etcd_put(cl, edl_bytes(nul_key, sizeof nul_key - 1),
                                  edl_str("{\"endpoint\":\"http://evil\"}"), NULL, NULL), 0);
    reg("mal", "t-zz", 1, 0);
    char buf[256];
    assert_string_equal(listed("mal", buf, sizeof buf), "t-good t-zz");
    /* students see the same two, and the bad records stay where they are */
    edl_discovery_opts o = {.service = "mal", .student = "s-0"};
    edl_discovery *d;
    assert_int_equal(edl_discovery_open(cl, &o, &d), 0);
    assert_int_equal(edl_discovery_n_teachers(d), 2);
    assert_int_equal(edl_discovery_n_students(d), 1);
    size_t n;
    const edl_service_instance *mine = edl_discovery_teachers(d, &n);
    assert_int_equal(n, 2); /* more teachers than students: the one student gets both */
    assert_string_equal(mine[0].name, "t-good");
    assert_string_equal(mine[0].endpoint, "http://10.0.0.1:8006"); /* not the NUL key's */
    assert_string_equal(mine[1].name, "t-zz");
    edl_discovery_close(d);
    char v[64];
    assert_non_null(harness_get(cl, PREFIX "/services/mal/teachers/t-type", v, sizeof v));
}

/* Poll d until it sees want teachers: the milliseconds it took, or -1 after timeout_ms. */
static int64_t until_teachers(edl_discovery *d, size_t want, int timeout_ms)
{
    int64_t t0 = harness_now_ms();
    while (edl_discovery_n_teachers(d) != want) {
        if (harness_now_ms() - t0 > timeout_ms)
            return -1;
        edl_discovery_poll(d, 50, NULL);
    }
    return harness_now_ms() - t0;
}

static void test_lease_expiry_removes_teacher(void **state)
{
    (void)state;
    reg("exp", "t-stays", 2, 0);
    int64_t lease;
    assert_int_equal(edl_etcd_lease_grant(cl, 2, 0, &lease, NULL), 0);
    int64_t granted = harness_now_ms();
    reg("exp", "t-dies", 2, lease); /* nobody keeps this lease alive: a pod that died */
    edl_discovery_opts o = {.service = "exp", .student = "s-0", .ttl_s = 2};
    edl_discovery *d;
    assert_int_equal(edl_discovery_open(cl, &o, &d), 0);
    assert_int_equal(edl_discovery_n_teachers(d), 2);
    int64_t took = until_teachers(d, 1, 5000);
    assert_true(took >= 0);
    int64_t since_grant = harness_now_ms() - granted;
    printf("a teacher's 2 s lease ran out: gone for the student %lld ms after the grant\n",
           (long long)since_grant);
    assert_true(since_grant <= 3000);
    size_t n;
    const edl_service_instance *mine = edl_discovery_teachers(d, &n);
    assert_int_equal(n, 1);
    assert_string_equal(mine[0].name, "t-stays");
    /* the student's own 2 s lease is kept alive by its keeper, well past its TTL: a 2 s lease
     * granted now (later than the student's), that nobody renews, expires first */
    assert_true(harness_etcd_outlive_lease(cl, 2, 8000));
    char v[16];
    assert_non_null(harness_get(cl, PREFIX "/services/exp/students/s-0", v, sizeof v));
    edl_discovery_close(d);
    assert_null(harness_get(cl, PREFIX "/services/exp/students/s-0", v, sizeof v));
}

static void test_watch_delivers_new_teacher_within_a_second(void **state)
{
    (void)state;
    edl_discovery_opts o = {.service = "late", .student = "s-0"};
    edl_discovery *d;
    assert_int_equal(edl_discovery_open(cl, &o, &d), 0);
    size_t n;
    edl_discovery_teachers(d, &n);
    assert_int_equal(n, 0); /* no teacher yet: no pairs, and open still succeeds */
    bool changed = true;
    assert_int_equal(edl_discovery_poll(d, 100, &changed), 0);
    assert_false(changed);
    int64_t t0 = harness_now_ms();
    reg("late", "t-new", 1, 0);
    while (!changed && harness_now_ms() - t0 < 1000)
        assert_int_equal(edl_discovery_poll(d, 100, &changed), 0);
    int64_t took = harness_now_ms() - t0;
    printf("a new teacher reached the student in %lld ms\n", (long long)took);
    assert_true(changed);
    assert_true(took <= 1000);
    const edl_service_instance *mine = edl_discovery_teachers(d, &n);
    assert_int_equal(n, 1);
    assert_string_equal(mine[0].name, "t-new");
    assert_string_equal(mine[0].endpoint, "http://10.0.0.1:8005");
    /* a record turned bad counts as gone */
    harness_put(cl, PREFIX "/services/late/teachers/t-new", "{\"endpoint\":1}");
    assert_true(until_teachers(d, 0, 1000) >= 0);
    edl_discovery_teachers(d, &n);
    assert_int_equal(n, 0);
    edl_discovery_close(d);
}

#define N_S 100
#define N_T 43 /* t-00..t-42: 40 at first, then 5 leave and 3 join */

typedef struct crowd {
    edl_discovery *d[N_S];
    char student[N_S][16], teacher[N_T][16];
    bool present[N_T];
} crowd;

/* Whether every student's view is the assignment of the full sets. */
static bool crowd_agrees(crowd *c, size_t loads[N_T])
{
    const char *st[N_S], *te[N_T];
    int cap[N_T], idx[N_T];
    size_t nt = 0;
    for (int s = 0; s < N_S; s++)
        st[s] = c->student[s];
    for (int t = 0; t < N_T; t++)
        if (c->present[t]) {
            idx[nt] = t;
            cap[nt] = 4;
            te[nt++] = c->teacher[t];
        }
    edl_teacher_assignment a;
    assert_int_equal(edl_assign(st, N_S, te, cap, nt, &a), 0);
    bool ok = true;
    memset(loads, 0, N_T * sizeof *loads);
    for (size_t k = 0, s = 0; ok && s < N_S; s++) {
        size_t n;
        const edl_service_instance *mine = edl_discovery_teachers(c->d[s], &n);
        ok = edl_discovery_n_teachers(c->d[s]) == nt && edl_discovery_n_students(c->d[s]) == N_S;
        for (size_t j = 0; ok && j < n; j++, k++)
            ok = k < a.n && a.pairs[k].student == s && !strcmp(mine[j].name, te[a.pairs[k].teacher]);
        ok = ok && n >= 1 && (k == a.n || a.pairs[k].student != s);
    }
    for (size_t k = 0; ok && k < a.n; k++)
        loads[idx[a.pairs[k].teacher]]++;
    edl_teacher_assignment_clear(&a);
    return ok;
}

/* Poll every student until all agree: milliseconds taken, -1 after timeout_ms. */
static int64_t crowd_converge(crowd *c, size_t loads[N_T], int timeout_ms)
{
    int64_t t0 = harness_now_ms();
    for (;;) {
        for (int s = 0; s < N_S; s++)
            assert_int_equal(edl_discovery_poll(c->d[s], 0, NULL), 0);
        if (crowd_agrees(c, loads))
            return harness_now_ms() - t0;
        if (harness_now_ms() - t0 > timeout_ms)
            return -1;
        harness_sleep_ms(5);
    }
}

static void check_loads(const crowd *c, const size_t loads[N_T])
{
    for (int t = 0; t < N_T; t++)
        if (c->present[t] && (loads[t] < 2 || loads[t] > 3))
            fail_msg("%s serves %zu students, not 2 or 3", c->teacher[t], loads[t]);
        else if (!c->present[t])
            assert_int_equal(loads[t], 0);
}

static void test_hundred_students_forty_teachers_agree(void **state)
{
    (void)state;
    static crowd c;
    int64_t lease;
    assert_int_equal(edl_etcd_lease_grant(cl, 60, 0, &lease, NULL), 0);
    for (int t = 0; t < N_T; t++) {
        snprintf(c.teacher[t], sizeof c.teacher[t], "t-%02d", t);
        if ((c.present[t] = t < 40))
            reg("crowd", c.teacher[t], 4, lease);
    }
    int64_t t0 = harness_now_ms();
    for (int s = 0; s < N_S; s++) {
        snprintf(c.student[s], sizeof c.student[s], "s-%03d", s);
        edl_discovery_opts o = {.prefix = PREFIX, .service = "crowd", .student = c.student[s]};
        assert_int_equal(edl_discovery_open(cl, &o, &c.d[s]), 0);
    }
    size_t loads[N_T];
    int64_t took = crowd_converge(&c, loads, 5000);
    printf("100 students opened in %lld ms, agreed %lld ms later\n",
           (long long)(harness_now_ms() - t0 - took), (long long)took);
    assert_true(took >= 0);
    check_loads(&c, loads);
    /* 5 teachers leave and 3 join: every student agrees again within a second */
    t0 = harness_now_ms();
    for (int t = 0; t < 5; t++) {
        assert_int_equal(edl_service_deregister(cl, PREFIX, "crowd", c.teacher[t]), 0);
        c.present[t] = false;
    }
    for (int t = 40; t < N_T; t++) {
        reg("crowd", c.teacher[t], 4, lease);
        c.present[t] = true;
    }
    took = crowd_converge(&c, loads, 1000);
    printf("after 5 teachers left and 3 joined, the students agreed again in %lld ms (%lld ms "
           "after the first change)\n", (long long)took, (long long)(harness_now_ms() - t0));
    assert_true(took >= 0);
    check_loads(&c, loads);
    for (int s = 0; s < N_S; s++)
        edl_discovery_close(c.d[s]);
    edl_range_opts ro = {.prefix = true, .count_only = true};
    edl_range_result r;
    assert_int_equal(edl_etcd_range(cl, edl_str(PREFIX "/services/crowd/students/"), &ro, &r), 0);
    assert_int_equal(r.count, 0); /* every student's clean leave deleted its key */
    edl_range_result_clear(&r);
    assert_int_equal(edl_etcd_lease_revoke(cl, lease), 0);
}

/* `edl service ...` with --etcd for this test's etcd: its exit status, stdout into out. */
static int edl_service(char *out, size_t outlen, const char *args)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s service %s --etcd %s", EDL_CLI_BIN, args,
             edl_etcd_server_endpoints(srv));
    return harness_shell(cmd, out, outlen);
}

static void test_cli_register_list_deregister(void **state)
{
    (void)state;
    static char out[16384];
    assert_int_equal(edl_service(out, sizeof out, "register --service cli --instance t-hand "
                                 "--endpoint http://10.1.2.3:8500 --capacity 3 --model big "
                                 "--version 7"), 0);
    char buf[256];
    assert_string_equal(listed("cli", buf, sizeof buf), "t-hand");
    /* bad input: refused with the usage code, and nothing changes */
    assert_int_equal(edl_service(out, sizeof out, "register --service cli --instance t-bad "
                                 "--endpoint ftp://x"), EDL_EXIT_USAGE);
    assert_int_equal(edl_service(out, sizeof out, "register --service cli --instance t-bad "
                                 "--endpoint http://x --capacity 0"), EDL_EXIT_USAGE);
    assert_int_equal(edl_service(out, sizeof out, "register --service Cli --instance t-bad "
                                 "--endpoint http://x"), EDL_EXIT_USAGE);
    assert_int_equal(edl_service(out, sizeof out, "list --service cli -o yaml"), EDL_EXIT_USAGE);
    assert_string_equal(listed("cli", buf, sizeof buf), "t-hand");
    assert_int_equal(edl_service(out, sizeof out, "list --service cli"), 0);
    assert_non_null(strstr(out, "INSTANCE"));
    assert_non_null(strstr(out, "t-hand"));
    assert_non_null(strstr(out, "http://10.1.2.3:8500"));
    assert_int_equal(edl_service(out, sizeof out, "list --service cli -o json"), 0);
    cJSON *arr = cJSON_Parse(out);
    assert_true(cJSON_IsArray(arr) && cJSON_GetArraySize(arr) == 1);
    cJSON *t = cJSON_GetArrayItem(arr, 0);
    assert_string_equal(cJSON_GetObjectItem(t, "instance")->valuestring, "t-hand");
    assert_int_equal(cJSON_GetObjectItem(t, "capacity")->valueint, 3);
    assert_string_equal(cJSON_GetObjectItem(t, "model")->valuestring, "big");
    assert_string_equal(cJSON_GetObjectItem(t, "version")->valuestring, "7");
    assert_string_equal(cJSON_GetObjectItem(t, "lease")->valuestring, "0");
    cJSON_Delete(arr);
    assert_int_equal(edl_service(out, sizeof out, "deregister --service cli --instance t-hand"), 0);
    assert_string_equal(listed("cli", buf, sizeof buf), "");
    assert_int_equal(edl_service(out, sizeof out, "deregister --service cli --instance t-hand"),
                     EDL_EXIT_FAILED);
    assert_int_equal(harness_shell(EDL_CLI_BIN " service list --service cli --etcd "
                                   "http://127.0.0.1:1", out, sizeof out), EDL_EXIT_UNREACHABLE);
}

/* With --ttl the command holds the lease well past its TTL, and SIGTERM deregisters at once. */
static void test_cli_register_with_ttl_holds_until_sigterm(void **state)
{
    (void)state;
    const char *argv[] = {EDL_CLI_BIN, "service", "register", "--service", "held",
                          "--instance", "t-fg", "--endpoint", "http://10.1.2.3:8500", "--ttl",
                          "2", "--etcd", edl_etcd_server_endpoints(srv), NULL};
    pid_t pid = harness_spawn(argv, NULL);
    assert_true(pid > 0);
    char buf[256];
    int64_t t0 = harness_now_ms();
    while (strcmp(listed("held", buf, sizeof buf), "t-fg") && harness_now_ms() - t0 < 5000)
        harness_sleep_ms(50);
    assert_string_equal(buf, "t-fg");
    /* beyond the 2 s TTL: a 2 s lease granted after the command's, unrenewed, expires */
    assert_true(harness_etcd_outlive_lease(cl, 2, 8000));
    assert_string_equal(listed("held", buf, sizeof buf), "t-fg");
    edl_service_instance *l;
    size_t n;
    assert_int_equal(edl_service_list(cl, PREFIX, "held", &l, &n, NULL), 0);
    assert_true(l[0].lease != 0);
    edl_service_list_free(l, n);
    harness_kill(pid, SIGTERM);
    assert_int_equal(harness_wait_exit(pid, 5000), 0);
    assert_string_equal(listed("held", buf, sizeof buf), "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register_list_deregister_round_trip),
        cmocka_unit_test(test_parse_names_the_problem),
        cmocka_unit_test(test_malformed_records_are_skipped),
        cmocka_unit_test(test_lease_expiry_removes_teacher),
        cmocka_unit_test(test_watch_delivers_new_teacher_within_a_second),
        cmocka_unit_test(test_hundred_students_forty_teachers_agree),
        cmocka_unit_test(test_cli_register_list_deregister),
        cmocka_unit_test(test_cli_register_with_ttl_holds_until_sigterm),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

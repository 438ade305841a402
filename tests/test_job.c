/* test_job.c: the job model without a server: rank assignment (deterministic, minimal
 * movement, rank 0 kept), and the JSON documents (round trips, and hostile input rejected with
 * a clear message while the caller's struct stays as it was). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "edl/agent_link.h"
#include "edl/job.h"
#include "edl/secret.h"

/* Candidate pods p<i> with lease 100+i, join order as given. */
static edl_pod *pods(const char *const *names, size_t n)
{
    edl_pod *p = calloc(n ? n : 1, sizeof *p);
    for (size_t i = 0; i < n; i++) {
        p[i].name = (char *)names[i];
        p[i].addr = (char *)"10.0.0.1";
        p[i].port = 1000 + (int)i;
        p[i].lease = 100 + (names[i][1] - '0');
        p[i].create_revision = (int64_t)i + 1;
    }
    return p;
}

typedef struct assignment {
    edl_member *m;
    size_t n;
    char **sb;
    size_t n_sb;
} assignment;

static assignment assign(const assignment *prev, const char *const *names, size_t n, int max)
{
    assignment a = {0};
    edl_pod *p = pods(names, n);
    assert_int_equal(edl_assign_ranks(prev ? prev->m : NULL, prev ? prev->n : 0, p, n, max, &a.m,
                                      &a.n, &a.sb, &a.n_sb),
                     0);
    free(p);
    return a;
}

static void assignment_free(assignment *a)
{
    edl_members_free(a->m, a->n);
    for (size_t i = 0; i < a->n_sb; i++)
        free(a->sb[i]);
    free(a->sb);
}

/* "p0 p3 p1" = pods in rank order */
static void assert_ranks(const assignment *a, const char *expect)
{
    char got[256] = "";
    for (size_t i = 0; i < a->n; i++) {
        assert_int_equal(a->m[i].rank, (int)i);
        strcat(got, i ? " " : "");
        strcat(got, a->m[i].pod);
    }
    assert_string_equal(got, expect);
}

static void test_first_generation_ranks_in_join_order(void **state)
{
    (void)state;
    const char *n[] = {"p2", "p0", "p1"};
    assignment a = assign(NULL, n, 3, 8);
    assert_ranks(&a, "p2 p0 p1");
    assert_int_equal(a.n_sb, 0);
    assert_int_equal(a.m[0].port, 1000);
    assert_int_equal(a.m[0].lease, 102);
    assignment_free(&a);
}

static void test_leave_fills_hole_with_highest_rank(void **state)
{
    (void)state;
    const char *n1[] = {"p0", "p1", "p2", "p3", "p4"};
    assignment a = assign(NULL, n1, 5, 8);
    const char *n2[] = {"p0", "p2", "p3", "p4"}; /* p1 (rank 1) leaves */
    assignment b = assign(&a, n2, 4, 8);
    assert_ranks(&b, "p0 p4 p2 p3");
    assignment_free(&a);
    assignment_free(&b);
}

static void test_rank0_survives_scale_down(void **state)
{
    (void)state;
    const char *n1[] = {"p0", "p1", "p2", "p3"};
    assignment a = assign(NULL, n1, 4, 8);
    const char *n2[] = {"p3", "p0"}; /* p1, p2 gone; order of candidates does not matter */
    assignment b = assign(&a, n2, 2, 8);
    assert_ranks(&b, "p0 p3");
    assignment_free(&a);
    assignment_free(&b);
}

static void test_newcomers_fill_holes_then_append(void **state)
{
    (void)state;
    const char *n1[] = {"p0", "p1", "p2"};
    assignment a = assign(NULL, n1, 3, 8);
    const char *n2[] = {"p0", "p2", "p5", "p6"}; /* p1 leaves, p5 and p6 join */
    assignment b = assign(&a, n2, 4, 8);
    assert_ranks(&b, "p0 p5 p2 p6");
    assignment_free(&a);
    assignment_free(&b);
}

static void test_beyond_max_are_standbys_and_promoted(void **state)
{
    (void)state;
    const char *n1[] = {"p0", "p1", "p2", "p3"};
    assignment a = assign(NULL, n1, 4, 3);
    assert_ranks(&a, "p0 p1 p2");
    assert_int_equal(a.n_sb, 1);
    assert_string_equal(a.sb[0], "p3");
    const char *n2[] = {"p0", "p2", "p3"}; /* p1 lost: the standby is promoted into its rank */
    assignment b = assign(&a, n2, 3, 3);
    assert_ranks(&b, "p0 p3 p2");
    assert_int_equal(b.n_sb, 0);
    assignment_free(&a);
    assignment_free(&b);
}

static void test_reregistered_pod_is_a_newcomer(void **state)
{
    (void)state;
    const char *n1[] = {"p0", "p1", "p2"};
    assignment a = assign(NULL, n1, 3, 8);
    a.m[0].lease = 999; /* p0 came back under a new lease: not the old rank-0 member */
    const char *n2[] = {"p0", "p1", "p2"};
    assignment b = assign(&a, n2, 3, 2); /* survivors first: p0 is the one left out */
    assert_ranks(&b, "p2 p1");
    assert_int_equal(b.n_sb, 1);
    assert_string_equal(b.sb[0], "p0");
    assignment_free(&a);
    assignment_free(&b);
}

static void test_assignment_is_deterministic(void **state)
{
    (void)state;
    const char *n1[] = {"p0", "p1", "p2", "p3", "p4", "p5"};
    assignment a = assign(NULL, n1, 6, 6);
    const char *n2[] = {"p5", "p1", "p3", "p7", "p8"};
    assignment b = assign(&a, n2, 5, 4), c = assign(&a, n2, 5, 4);
    assert_int_equal(b.n, c.n);
    for (size_t i = 0; i < b.n; i++)
        assert_string_equal(b.m[i].pod, c.m[i].pod);
    /* survivors p1 p3 p5 first (by old rank), then p7; p5 (old rank 5 >= 4) fills hole 0 */
    assert_ranks(&b, "p5 p1 p7 p3");
    assert_int_equal(b.n_sb, 1);
    assert_string_equal(b.sb[0], "p8");
    assignment_free(&a);
    assignment_free(&b);
    assignment_free(&c);
}

static void test_spec_parse_and_round_trip(void **state)
{
    (void)state;
    edl_job_spec s;
    edl_spec_init(&s);
    char err[256];
    const char *j = "{\"min\":2,\"max\":4,\"replicas\":3,\"settle_ms\":500,\"restart_policy\":"
                    "\"ExitCode\",\"permanent_exit_codes\":\"1-10,42\",\"elastic_mode\":"
                    "\"inprocess\",\"checkpoint_uri\":\"file:///tmp/ck\",\"ttl_s\":3,"
                    "\"fail_fast\":false}";
    assert_int_equal(edl_spec_parse(j, strlen(j), &s, err, sizeof err), 0);
    assert_int_equal(s.min, 2);
    assert_int_equal(s.max, 4);
    assert_int_equal(s.replicas, 3);
    assert_int_equal(s.settle_ms, 500);
    assert_int_equal(s.restart_policy, EDL_RESTART_EXIT_CODE);
    assert_true(edl_exit_code_in(s.permanent_codes, 42));
    assert_true(edl_exit_code_in(s.permanent_codes, 10));
    assert_false(edl_exit_code_in(s.permanent_codes, 11));
    assert_int_equal(s.mode, EDL_MODE_INPROCESS);
    assert_string_equal(s.checkpoint_uri, "file:///tmp/ck");
    assert_false(s.fail_fast);
    char *out = edl_spec_to_json(&s);
    edl_job_spec t;
    edl_spec_init(&t);
    assert_int_equal(edl_spec_parse(out, strlen(out), &t, err, sizeof err), 0);
    assert_memory_equal(s.permanent_codes, t.permanent_codes, 32);
    assert_int_equal(t.ttl_s, 3);
    assert_false(t.fail_fast);
    assert_string_equal(t.checkpoint_uri, "file:///tmp/ck");
    free(out);
    edl_spec_clear(&s);
    edl_spec_clear(&t);
}

static void test_bad_specs_rejected_with_reason(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        int rc;
        const char *msg;
    } cases[] = {
        {"{\"min\":5,\"max\":2}", EDL_ECONFIG, "min (5) is greater than max (2)"},
        {"{\"min\":1,\"ttl_s\":-3}", EDL_ECONFIG, "lease TTL must be at least 1"},
        {"{\"min\":0}", EDL_ECONFIG, "at least 1"},
        {"{\"min\":\"two\"}", EDL_EPROTO, "\"min\" must be an integer"},
        {"{\"min\":1.5}", EDL_EPROTO, "\"min\" must be an integer"},
        {"{\"min\":1e300}", EDL_ECONFIG, "outside"},
        {"{\"min\":2,", EDL_EPROTO, "not valid JSON"},
        {"[1,2]", EDL_EPROTO, "not a JSON object"},
        {"{\"restart_policy\":\"Sometimes\"}", EDL_ECONFIG, "unknown value \"Sometimes\""},
        {"{\"permanent_exit_codes\":\"1-999\"}", EDL_ECONFIG, "permanent_exit_codes"},
        {"{\"stopped\":\"yes\"}", EDL_EPROTO, "true or false"},
        {"{\"fail_fast\":0}", EDL_EPROTO, "fail_fast"},
        {"{\"settle_ms\":-1}", EDL_ECONFIG, "settle_ms"},
        {"{\"max_restarts\":2147483647}", EDL_ECONFIG, "max_restarts"},
        {"{\"exclude_after\":2147483647}", EDL_ECONFIG, "exclude_after"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        edl_job_spec s;
        edl_spec_init(&s);
        s.min = 7;
        s.max = 9;
        char err[256] = "";
        int rc = edl_spec_parse(cases[i].json, strlen(cases[i].json), &s, err, sizeof err);
        if (rc != cases[i].rc || !strstr(err, cases[i].msg))
            fail_msg("case %zu (%s): rc %d, err \"%s\"", i, cases[i].json, rc, err);
        assert_int_equal(s.min, 7); /* untouched */
        assert_int_equal(s.max, 9);
        edl_spec_clear(&s);
    }
    /* a huge document is refused before parsing */
    size_t big = EDL_DOC_MAX + 10;
    char *huge = malloc(big);
    memset(huge, ' ', big);
    huge[0] = '{';
    huge[big - 1] = '}';
    edl_job_spec s;
    edl_spec_init(&s);
    char err[256];
    assert_int_equal(edl_spec_parse(huge, big, &s, err, sizeof err), EDL_ETOOBIG);
    free(huge);
}

/* The ps role: "ps": {"min","max","replicas"} read, defaulted, validated and written back;
 * absent, the job has no parameter servers. */
static void test_spec_ps_role_round_trip(void **state)
{
    (void)state;
    char err[256];
    edl_job_spec s;
    edl_spec_init(&s);
    const char *none = "{\"min\":2}";
    assert_int_equal(edl_spec_parse(none, strlen(none), &s, err, sizeof err), 0);
    assert_int_equal(s.ps_max, 0);
    assert_int_equal(edl_spec_desired_servers(&s), 0);
    char *out = edl_spec_to_json(&s);
    assert_null(strstr(out, "\"ps\"")); /* no role, no object */
    free(out);
    const char *j = "{\"min\":2,\"max\":4,\"ps\":{\"min\":2,\"max\":3,\"replicas\":-1}}";
    assert_int_equal(edl_spec_parse(j, strlen(j), &s, err, sizeof err), 0);
    assert_int_equal(s.ps_min, 2);
    assert_int_equal(s.ps_max, 3);
    assert_int_equal(s.ps_replicas, -1);
    assert_int_equal(edl_spec_desired_servers(&s), 3); /* -1 = max, as for workers */
    assert_int_equal(edl_spec_desired_pods(&s), 4);
    s.ps_replicas = 2;
    out = edl_spec_to_json(&s);
    edl_job_spec t;
    edl_spec_init(&t);
    assert_int_equal(edl_spec_parse(out, strlen(out), &t, err, sizeof err), 0);
    assert_int_equal(t.ps_min, 2);
    assert_int_equal(t.ps_max, 3);
    assert_int_equal(t.ps_replicas, 2);
    assert_int_equal(edl_spec_desired_servers(&t), 2);
    edl_job_spec u;
    edl_spec_init(&u);
    assert_int_equal(edl_spec_copy(&u, &t), 0);
    assert_int_equal(u.ps_replicas, 2);
    free(out);
    const char *only_min = "{\"ps\":{\"min\":3}}"; /* max defaults to min */
    assert_int_equal(edl_spec_parse(only_min, strlen(only_min), &s, err, sizeof err), 0);
    assert_int_equal(s.ps_min, 3);
    assert_int_equal(s.ps_max, 3);
    assert_int_equal(edl_spec_desired_servers(&s), 3);
    edl_spec_clear(&s);
    edl_spec_clear(&t);
    edl_spec_clear(&u);
}

static void test_bad_ps_specs_rejected_with_reason(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        int rc;
        const char *msg;
    } cases[] = {
        {"{\"ps\":3}", EDL_EPROTO, "\"ps\" must be an object"},
        {"{\"ps\":[1]}", EDL_EPROTO, "\"ps\" must be an object"},
        {"{\"ps\":{}}", EDL_EPROTO, "spec.ps: field \"min\" is required"},
        {"{\"ps\":{\"min\":\"two\"}}", EDL_EPROTO, "\"min\" must be an integer"},
        {"{\"ps\":{\"min\":1,\"max\":true}}", EDL_EPROTO, "\"max\" must be an integer"},
        {"{\"ps\":{\"min\":1,\"replicas\":1.5}}", EDL_EPROTO, "\"replicas\" must be an integer"},
        {"{\"ps\":{\"min\":0}}", EDL_ECONFIG, "\"min\" must be at least 1"},
        {"{\"ps\":{\"min\":-1,\"max\":2}}", EDL_ECONFIG, "\"min\" must be at least 1"},
        {"{\"ps\":{\"min\":3,\"max\":2}}", EDL_ECONFIG, "ps.min (3) is greater than ps.max (2)"},
        {"{\"ps\":{\"min\":1,\"max\":1025}}", EDL_ECONFIG, "at most 1024"},
        {"{\"ps\":{\"min\":1,\"max\":2,\"replicas\":3}}", EDL_ECONFIG, "ps.replicas is 3"},
        {"{\"ps\":{\"min\":1,\"max\":2,\"replicas\":-2}}", EDL_ECONFIG, "ps.replicas is -2"},
        {"{\"ps\":{\"min\":1e300}}", EDL_ECONFIG, "outside"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        edl_job_spec s;
        edl_spec_init(&s);
        s.ps_min = 7;
        s.ps_max = 9;
        char err[256] = "";
        int rc = edl_spec_parse(cases[i].json, strlen(cases[i].json), &s, err, sizeof err);
        if (rc != cases[i].rc || !strstr(err, cases[i].msg))
            fail_msg("case %zu (%s): rc %d, err \"%s\"", i, cases[i].json, rc, err);
        assert_int_equal(s.ps_min, 7); /* untouched */
        assert_int_equal(s.ps_max, 9);
        edl_spec_clear(&s);
    }
}

/* The teacher role: "teachers": {"min","max","replicas","service"} read, defaulted, validated
 * and written back; absent, the job has no teachers. */
static void test_spec_teachers_round_trip(void **state)
{
    (void)state;
    char err[256];
    edl_job_spec s, t;
    edl_spec_init(&s);
    edl_spec_init(&t);
    const char *none = "{\"min\":2}";
    assert_int_equal(edl_spec_parse(none, strlen(none), &s, err, sizeof err), 0);
    assert_int_equal(edl_spec_desired_teachers(&s), 0);
    char *out = edl_spec_to_json(&s);
    assert_null(strstr(out, "\"teachers\""));
    free(out);
    const char *j = "{\"teachers\":{\"min\":1,\"max\":4,\"service\":\"bert-large\"}}";
    assert_int_equal(edl_spec_parse(j, strlen(j), &s, err, sizeof err), 0);
    assert_int_equal(s.teachers_min, 1);
    assert_int_equal(s.teachers_max, 4);
    assert_int_equal(s.teachers_replicas, -1);
    assert_string_equal(s.teachers_service, "bert-large");
    assert_int_equal(edl_spec_desired_teachers(&s), 4);
    s.teachers_replicas = 2;
    out = edl_spec_to_json(&s);
    assert_int_equal(edl_spec_parse(out, strlen(out), &t, err, sizeof err), 0);
    free(out);
    assert_int_equal(t.teachers_replicas, 2);
    assert_int_equal(edl_spec_desired_teachers(&t), 2);
    assert_string_equal(t.teachers_service, "bert-large");
    edl_job_spec u;
    edl_spec_init(&u);
    assert_int_equal(edl_spec_copy(&u, &t), 0);
    assert_string_equal(u.teachers_service, "bert-large");
    const char *only_min = "{\"teachers\":{\"min\":3,\"service\":\"t\"}}";
    assert_int_equal(edl_spec_parse(only_min, strlen(only_min), &s, err, sizeof err), 0);
    assert_int_equal(s.teachers_max, 3);
    assert_true(edl_teacher_service_valid("a-1"));
    assert_false(edl_teacher_service_valid("-a"));
    assert_false(edl_teacher_service_valid("A"));
    assert_false(edl_teacher_service_valid(""));
    edl_spec_clear(&s);
    edl_spec_clear(&t);
    edl_spec_clear(&u);
}

static void test_bad_teacher_specs_rejected_with_reason(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        int rc;
        const char *msg;
    } cases[] = {
        {"{\"teachers\":2}", EDL_EPROTO, "\"teachers\" must be an object"},
        {"{\"teachers\":{\"service\":\"s\"}}", EDL_EPROTO, "field \"min\" is required"},
        {"{\"teachers\":{\"min\":1}}", EDL_EPROTO, "field \"service\" is required"},
        {"{\"teachers\":{\"min\":0,\"service\":\"s\"}}", EDL_ECONFIG, "at least 1"},
        {"{\"teachers\":{\"min\":3,\"max\":2,\"service\":\"s\"}}", EDL_ECONFIG,
         "teachers.min (3) is greater than teachers.max (2)"},
        {"{\"teachers\":{\"min\":1,\"max\":1025,\"service\":\"s\"}}", EDL_ECONFIG,
         "at most 1024 teachers"},
        {"{\"teachers\":{\"min\":2,\"max\":3,\"replicas\":1,\"service\":\"s\"}}", EDL_ECONFIG,
         "teachers.replicas is 1"},
        {"{\"teachers\":{\"min\":1,\"max\":3,\"replicas\":4,\"service\":\"s\"}}", EDL_ECONFIG,
         "teachers.replicas is 4"},
        {"{\"teachers\":{\"min\":1,\"service\":\"Big_Model\"}}", EDL_ECONFIG,
         "is not a service name"},
        {"{\"teachers\":{\"min\":1,\"service\":7}}", EDL_EPROTO, "\"service\" must be a string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        edl_job_spec s;
        edl_spec_init(&s);
        s.teachers_min = 7;
        char err[256] = "";
        int rc = edl_spec_parse(cases[i].json, strlen(cases[i].json), &s, err, sizeof err);
        if (rc != cases[i].rc || !strstr(err, cases[i].msg))
            fail_msg("case %zu (%s): rc %d, err \"%s\"", i, cases[i].json, rc, err);
        assert_int_equal(s.teachers_min, 7); /* untouched */
        edl_spec_clear(&s);
    }
}

static void test_generation_round_trip(void **state)
{
    (void)state;
    edl_member m[2] = {{(char *)"a", 0, (char *)"10.0.0.1", 7000, 11},
                       {(char *)"b", 1, (char *)"10.0.0.2", 7001, INT64_C(0x7a4d8b3e1234abcd)}};
    char *sb[1] = {(char *)"c"};
    edl_pod_failures f[1] = {{(char *)"d", 3, 1234567}};
    edl_generation c = {.generation = 7, .state = EDL_JOB_RUNNING, .reason = (char *)"join",
                     .members = m, .n_members = 2, .standbys = sb, .n_standbys = 1,
                     .failures = f, .n_failures = 1, .restarts = 2, .leader = (char *)"js-1",
                     .published_ms = 42, .started_ms = 1764300000123};
    char *j = edl_generation_to_json(&c);
    edl_generation d = {0};
    char err[256];
    assert_int_equal(edl_generation_parse(j, strlen(j), &d, err, sizeof err), 0);
    assert_int_equal(d.generation, 7);
    assert_true(d.published_ms == 42 && d.started_ms == 1764300000123); /* the run's name */
    assert_int_equal(d.state, EDL_JOB_RUNNING);
    assert_int_equal(d.n_members, 2);
    assert_string_equal(d.members[1].pod, "b");
    assert_int_equal(d.members[1].port, 7001);
    assert_true(d.members[1].lease == INT64_C(0x7a4d8b3e1234abcd)); /* all 64 bits survive */
    assert_string_equal(d.standbys[0], "c");
    assert_int_equal(d.failures[0].count, 3);
    assert_int_equal(d.failures[0].excluded_until, 1234567);
    assert_int_equal(d.restarts, 2);
    const edl_member *a = edl_generation_member_named(&d, "a");
    assert_non_null(a);
    assert_ptr_equal(edl_generation_member(&d, "a", a->lease), a);
    assert_null(edl_generation_member(&d, "a", a->lease + 1)); /* another incarnation */
    assert_null(edl_generation_member_named(&d, "c"));
    free(j);
    edl_generation_clear(&d);
}

static void test_bad_generation_documents_rejected(void **state)
{
    (void)state;
    static const char *bad[] = {
        "{\"generation\":\"x\"}",
        "{\"generation\":3,\"members\":{}}",
        "{\"generation\":3,\"members\":[{\"pod\":\"a\",\"rank\":1}]}",  /* ranks must run 0.. */
        "{\"generation\":3,\"members\":[{\"pod\":\"../x\",\"rank\":0}]}",
        "{\"generation\":3,\"members\":[7]}",
        "{\"generation\":3,\"members\":[{\"pod\":\"a\",\"rank\":0,\"lease\":12}]}",
        "{\"generation\":3,\"members\":[{\"pod\":\"a\",\"rank\":0,\"lease\":\"xyz\"}]}",
        "{\"generation\":3,\"state\":\"dancing\"}",
        "{\"generation\":3,\"standbys\":[1]}",
        "{\"generation\":-1}",
        "",
        "{\"generation\":3,\"members\":[{\"pod\":\"a\",\"rank\":0,\"port\":70000}]}",
        /* counters beyond what a job server writes: incremented, they would overflow */
        "{\"generation\":3,\"restarts\":2147483647}",
        "{\"generation\":3,\"failures\":[{\"pod\":\"a\",\"count\":2147483647}]}",
        "{\"generation\":3,\"failures\":[{\"count\":1}]}", /* whose failures? */
        "{\"generation\":3,\"members_generation\":4}",  /* after itself */
        "{\"generation\":3,\"members_generation\":0}",
        "{\"generation\":3,\"members_generation\":\"2\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        edl_generation c = {.generation = 5};
        char err[256] = "";
        int rc = edl_generation_parse(bad[i], strlen(bad[i]), &c, err, sizeof err);
        if (rc == 0 || !err[0])
            fail_msg("case %zu (%s) accepted", i, bad[i]);
        assert_int_equal(c.generation, 5);
    }
}

/* "servers": the parameter servers, member objects ranked 0..n-1, found by incarnation;
 * absent when there are none. */
static void test_generation_servers_round_trip(void **state)
{
    (void)state;
    edl_member m[1] = {{(char *)"w0", 0, (char *)"10.0.0.1", 7000, 11}};
    edl_member sv[2] = {{(char *)"s0", 0, (char *)"10.0.0.3", 7100, 21},
                        {(char *)"s1", 1, (char *)"10.0.0.4", 7101, INT64_C(0x7a4d8b3e1234abce)}};
    edl_generation c = {.generation = 4, .state = EDL_JOB_RUNNING, .members = m, .n_members = 1,
                        .servers = sv, .n_servers = 2};
    char *j = edl_generation_to_json(&c);
    assert_non_null(strstr(j, "\"servers\":["));
    edl_generation d = {0};
    char err[256];
    assert_int_equal(edl_generation_parse(j, strlen(j), &d, err, sizeof err), 0);
    free(j);
    assert_int_equal(d.n_members, 1);
    assert_int_equal(d.n_servers, 2);
    assert_string_equal(d.servers[1].pod, "s1");
    assert_int_equal(d.servers[1].rank, 1);
    assert_string_equal(d.servers[1].addr, "10.0.0.4");
    assert_int_equal(d.servers[1].port, 7101);
    assert_true(d.servers[1].lease == INT64_C(0x7a4d8b3e1234abce));
    assert_ptr_equal(edl_generation_server(&d, "s0", 21), &d.servers[0]);
    assert_null(edl_generation_server(&d, "s0", 22));  /* another incarnation */
    assert_null(edl_generation_server(&d, "w0", 11));  /* a worker is no server */
    assert_null(edl_generation_member(&d, "s0", 21));  /* nor a server a worker */
    assert_int_equal(edl_generation_of_members(&d), 4); /* absent: this generation */
    c.members_generation = 2; /* only the servers changed since generation 2 */
    j = edl_generation_to_json(&c);
    assert_non_null(strstr(j, "\"members_generation\":2"));
    assert_int_equal(edl_generation_parse(j, strlen(j), &d, err, sizeof err), 0);
    free(j);
    assert_int_equal(d.members_generation, 2);
    assert_int_equal(edl_generation_of_members(&d), 2);
    c.members_generation = 0;
    c.n_servers = 0;
    j = edl_generation_to_json(&c);
    assert_null(strstr(j, "servers")); /* none: absent, as before the ps role */
    assert_int_equal(edl_generation_parse(j, strlen(j), &d, err, sizeof err), 0);
    assert_int_equal(d.n_servers, 0);
    assert_null(d.servers);
    free(j);
    edl_generation_clear(&d);
}

/* The servers list gets the members' checks: objects, valid names, dense ranks in order,
 * bounded size, hexadecimal leases. */
static void test_bad_generation_servers_rejected(void **state)
{
    (void)state;
    static const char *bad[] = {
        "{\"generation\":3,\"servers\":{}}",
        "{\"generation\":3,\"servers\":[7]}",
        "{\"generation\":3,\"servers\":[{\"pod\":\"a\",\"rank\":1}]}",
        "{\"generation\":3,\"servers\":[{\"pod\":\"a\",\"rank\":0},{\"pod\":\"b\",\"rank\":0}]}",
        "{\"generation\":3,\"servers\":[{\"pod\":\"../x\",\"rank\":0}]}",
        "{\"generation\":3,\"servers\":[{\"rank\":0}]}",
        "{\"generation\":3,\"servers\":[{\"pod\":\"a\",\"rank\":0,\"lease\":12}]}",
        "{\"generation\":3,\"servers\":[{\"pod\":\"a\",\"rank\":0,\"port\":-1}]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        edl_generation c = {.generation = 5};
        char err[256] = "";
        int rc = edl_generation_parse(bad[i], strlen(bad[i]), &c, err, sizeof err);
        if (rc == 0 || !strstr(err, "servers"))
            fail_msg("case %zu (%s): rc %d, err \"%s\"", i, bad[i], rc, err);
        assert_int_equal(c.generation, 5);
    }
    /* more than EDL_PS_SERVERS_MAX entries is refused before any is read */
    size_t cap = 16 + (EDL_PS_SERVERS_MAX + 1) * 4;
    char *doc = malloc(cap), *p = doc;
    p += sprintf(p, "{\"servers\":[");
    for (int i = 0; i <= EDL_PS_SERVERS_MAX; i++)
        p += sprintf(p, "%s{}", i ? "," : "");
    sprintf(p, "]}");
    edl_generation c = {.generation = 5};
    char err[256] = "";
    assert_int_equal(edl_generation_parse(doc, strlen(doc), &c, err, sizeof err), EDL_ETOOBIG);
    assert_int_equal(c.generation, 5);
    free(doc);
}

static void test_pod_and_status_documents(void **state)
{
    (void)state;
    edl_pod p = {.name = strdup("w1"), .lease = 5};
    char err[256];
    const char *j = "{\"role\":\"worker\",\"addr\":\"10.1.2.3\",\"port\":29500,\"pid\":77}";
    assert_int_equal(edl_pod_parse(j, strlen(j), &p, err, sizeof err), 0);
    assert_string_equal(p.name, "w1");
    assert_int_equal(p.lease, 5);
    assert_string_equal(p.addr, "10.1.2.3");
    assert_int_equal(p.port, 29500);
    assert_int_equal(edl_pod_parse("{\"role\":\"worker\"}", 17, &p, err, sizeof err), EDL_EPROTO);
    assert_non_null(strstr(err, "addr"));
    assert_string_equal(p.addr, "10.1.2.3");
    edl_pod_clear(&p);

    edl_pod_status s = {.generation = 3, .state = EDL_TRAINER_EXITED, .exit_code = 3, .step = 9,
                        .own_error = true, .inprocess = true, .total_steps = 400};
    char *t = edl_pod_status_to_json(&s);
    edl_pod_status u;
    assert_int_equal(edl_pod_status_parse(t, strlen(t), &u, err, sizeof err), 0);
    assert_int_equal(u.state, EDL_TRAINER_EXITED);
    assert_int_equal(u.exit_code, 3);
    assert_int_equal(u.step, 9);
    assert_int_equal(u.total_steps, 400);
    assert_true(u.own_error && u.inprocess);
    free(t);
    assert_int_equal(edl_pod_status_parse("{\"generation\":1}", 16, &u, err, sizeof err),
                     EDL_EPROTO);
    /* found by fuzz/fuzz_job_docs: a signal or exit code outside its state is not kept (the
     * writer drops it, so parse, write and parse again gave another status) */
    const char *odd = "{\"generation\":2,\"state\":\"running\",\"signal\":9,\"exit_code\":3}";
    assert_int_equal(edl_pod_status_parse(odd, strlen(odd), &u, err, sizeof err), 0);
    assert_int_equal(u.state, EDL_TRAINER_RUNNING);
    assert_int_equal(u.signal, 0);
    assert_int_equal(u.exit_code, 0);
    /* own_error belongs to an exit, as an exit code does */
    odd = "{\"generation\":2,\"state\":\"signaled\",\"signal\":9,\"own_error\":true}";
    assert_int_equal(edl_pod_status_parse(odd, strlen(odd), &u, err, sizeof err), 0);
    assert_false(u.own_error);
}

static void test_names_and_keys(void **state)
{
    (void)state;
    assert_true(edl_name_valid("job-1.a_b"));
    assert_false(edl_name_valid(""));
    assert_false(edl_name_valid("a/b"));
    assert_false(edl_name_valid("-x"));
    assert_false(edl_name_valid("a b"));
    char longname[200];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    assert_false(edl_name_valid(longname));
}

static void test_keys_are_built_and_recognised_in_one_place(void **state)
{
    (void)state;
    edl_job_keys k;
    /* the one prefix rule every program's --prefix is held to */
    assert_false(edl_prefix_valid("noslash"));
    assert_false(edl_prefix_valid("/a\nb"));
    assert_true(edl_prefix_valid("/"));
    assert_int_equal(edl_job_keys_init(&k, "noslash", "j"), EDL_EINVAL);
    assert_int_equal(edl_job_keys_init(&k, "/edl/v1/", "j"), 0); /* trailing '/' dropped */
    assert_string_equal(k.job, "/edl/v1/jobs/j/");
    assert_string_equal(k.spec, "/edl/v1/jobs/j/spec");
    assert_string_equal(k.generation, "/edl/v1/jobs/j/generation");
    assert_string_equal(k.checkpoint, "/edl/v1/jobs/j/checkpoint");
    char *pod = edl_job_key_pod(&k, "p"), *st = edl_job_key_status(&k, "p");
    char *dead = edl_job_key_gen(&k, 12, EDL_GEN_DEAD), *gen = edl_job_key_gen(&k, 12, "");
    assert_string_equal(pod, "/edl/v1/jobs/j/pods/p");
    assert_string_equal(st, "/edl/v1/jobs/j/status/p");
    assert_string_equal(dead, "/edl/v1/jobs/j/gen/12/dead");
    assert_string_equal(gen, "/edl/v1/jobs/j/gen/12/");
    /* every key built is recognised as what it is */
    edl_job_key_info ki;
    assert_int_equal(edl_job_key_parse(&k, pod, strlen(pod), &ki), EDL_KEY_POD);
    assert_int_equal(ki.name_len, 1);
    assert_memory_equal(ki.name, "p", 1);
    assert_int_equal(edl_job_key_parse(&k, st, strlen(st), &ki), EDL_KEY_STATUS);
    assert_int_equal(edl_job_key_parse(&k, dead, strlen(dead), &ki), EDL_KEY_GEN);
    assert_true(edl_job_key_is_gen(&ki, 12, EDL_GEN_DEAD));
    assert_false(edl_job_key_is_gen(&ki, 11, EDL_GEN_DEAD));
    assert_false(edl_job_key_is_gen(&ki, 12, "dea"));
    /* per-rank entries: canonical ranks only */
    int rank = -1;
    assert_false(edl_job_key_gen_rank(&ki, 12, EDL_GEN_ALIVE, &rank)); /* "dead" */
    const char *ranked[][2] = {{"alive/3", "3"}, {"alive/0", "0"}, {"alive/2147483647", "max"},
                               {"alive/", NULL}, {"alive/03", NULL}, {"alive/-1", NULL},
                               {"alive/+1", NULL}, {"alive/2147483648", NULL}, {"alive/1x", NULL},
                               {"cpu/3", NULL}};
    for (size_t i = 0; i < sizeof ranked / sizeof ranked[0]; i++) {
        char *key = edl_job_key_gen(&k, 12, ranked[i][0]);
        assert_int_equal(edl_job_key_parse(&k, key, strlen(key), &ki), EDL_KEY_GEN);
        bool ok = edl_job_key_gen_rank(&ki, 12, EDL_GEN_ALIVE, &rank);
        if (ok != (ranked[i][1] != NULL))
            fail_msg("%s: %s", ranked[i][0], ok ? "accepted" : "refused");
        if (ok)
            assert_int_equal(rank, strcmp(ranked[i][1], "max") ? atoi(ranked[i][1]) : INT32_MAX);
        assert_false(edl_job_key_gen_rank(&ki, 11, EDL_GEN_ALIVE, &rank)); /* other generation */
        free(key);
    }
    assert_int_equal(edl_job_key_parse(&k, k.spec, strlen(k.spec), &ki), EDL_KEY_SPEC);
    assert_int_equal(edl_job_key_parse(&k, k.leader, strlen(k.leader), &ki), EDL_KEY_LEADER);
    assert_int_equal(edl_job_key_parse(&k, k.generation, strlen(k.generation), &ki),
                     EDL_KEY_GENERATION);
    /* strangers: other jobs, bare prefixes, non-canonical or oversized generation numbers */
    const char *others[] = {"/edl/v1/jobs/j2/spec", "/edl/v1/jobs/j/pods/", "/edl/v1/jobs/j/gen/",
                            "/edl/v1/jobs/j/gen/012/dead", "/edl/v1/jobs/j/gen/-1/dead",
                            "/edl/v1/jobs/j/gen/x/dead", "/edl/v1/jobs/j/gen/12",
                            "/edl/v1/jobs/j/gen/99999999999999999/dead", "/edl/v1/jobs/j/spec2",
                            "/edl/v1/jobs/j/generationx", ""};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
        if (edl_job_key_parse(&k, others[i], strlen(others[i]), &ki) != EDL_KEY_OTHER)
            fail_msg("\"%s\" was taken for a key of job j (kind %d)", others[i], (int)ki.kind);
    free(pod);
    free(st);
    free(dead);
    free(gen);
    edl_job_keys_clear(&k);
    assert_int_equal(edl_job_keys_init(&k, NULL, "a/b"), EDL_EINVAL); /* a name, not a path */
    assert_null(k.job);
    assert_int_equal(edl_job_keys_init(&k, NULL, "j"), 0);
    assert_string_equal(k.spec, EDL_DEFAULT_PREFIX "/jobs/j/spec");
    edl_job_keys_clear(&k);
}

static void test_exit_codes_and_names_have_one_source(void **state)
{
    (void)state;
    assert_int_equal(edl_job_exit_code(EDL_JOB_SUCCEEDED), EDL_EXIT_SUCCEEDED);
    assert_int_equal(edl_job_exit_code(EDL_JOB_FAILED), EDL_EXIT_FAILED);
    assert_int_equal(edl_job_exit_code(EDL_JOB_STOPPED), EDL_EXIT_STOPPED);
    assert_int_equal(edl_job_exit_code(EDL_JOB_RUNNING), EDL_EXIT_FAILED);
    assert_int_equal(EDL_EXIT_STOPPED, 4);
    edl_restart_policy p;
    assert_int_equal(edl_restart_policy_parse("ExitCode", &p), 0);
    assert_int_equal(p, EDL_RESTART_EXIT_CODE);
    assert_string_equal(edl_restart_policy_name(p), "ExitCode");
    assert_int_equal(edl_restart_policy_parse("exitcode", &p), EDL_ECONFIG);
    edl_elastic_mode m;
    assert_int_equal(edl_elastic_mode_parse("inprocess", &m), 0);
    assert_string_equal(edl_elastic_mode_name(m), "inprocess");
    assert_int_equal(edl_elastic_mode_parse("in-process", &m), EDL_ECONFIG);
    edl_job_spec d; /* not given: the trainer's choice, told apart from an explicit restart */
    edl_spec_init(&d);
    assert_int_equal(d.mode, EDL_MODE_AUTO);
    char err[128];
    const char *rs = "{\"elastic_mode\":\"restart\"}";
    assert_int_equal(edl_spec_parse(rs, strlen(rs), &d, err, sizeof err), 0);
    assert_int_equal(d.mode, EDL_MODE_RESTART);
    edl_spec_clear(&d);
    edl_job_spec a, b;
    edl_spec_init(&a);
    edl_spec_init(&b);
    a.max = 4;
    assert_int_equal(edl_spec_desired_pods(&a), 4); /* replicas -1: max */
    a.replicas = 6;
    assert_int_equal(edl_spec_desired_pods(&a), 6);
    a.checkpoint_uri = strdup("s3://b/p");
    assert_int_equal(edl_spec_copy(&b, &a), 0);
    assert_true(b.checkpoint_uri != a.checkpoint_uri); /* a deep copy */
    assert_string_equal(b.checkpoint_uri, "s3://b/p");
    edl_spec_clear(&a);
    assert_null(a.checkpoint_uri);
    assert_int_equal(a.min, 1); /* cleared back to the defaults */
    assert_string_equal(b.checkpoint_uri, "s3://b/p");
    edl_spec_clear(&b);
}

static int progress(const char *line, edl_progress_line *pl)
{
    return edl_progress_line_parse(line, strlen(line), pl);
}

/* The progress lines a trainer writes, as the agent reads them; anything else is refused. */
static void test_progress_lines(void **state)
{
    (void)state;
    edl_progress_line pl;
    assert_int_equal(progress("step 42", &pl), 0);
    assert_int_equal(pl.kind, EDL_PROGRESS_STEP);
    assert_int_equal(pl.value, 42);
    assert_int_equal(progress("blocked 1500 allreduce #9 of generation 2, waiting on rank 1", &pl),
                     0);
    assert_int_equal(pl.kind, EDL_PROGRESS_BLOCKED);
    assert_int_equal(pl.value, 1500);
    assert_string_equal(pl.what, "allreduce #9 of generation 2, waiting on rank 1");
    assert_int_equal(progress("blocked 7", &pl), 0);
    assert_string_equal(pl.what, "");
    assert_int_equal(progress("unblocked", &pl), 0);
    assert_int_equal(pl.kind, EDL_PROGRESS_UNBLOCKED);
    assert_int_equal(progress("graceful", &pl), 0);
    assert_int_equal(pl.kind, EDL_PROGRESS_GRACEFUL);
    assert_int_equal(progress("inprocess", &pl), 0);
    assert_int_equal(pl.kind, EDL_PROGRESS_INPROCESS);
    assert_int_equal(progress("checkpoint save 1250 1048576", &pl), 0);
    assert_int_equal(pl.kind, EDL_PROGRESS_CHECKPOINT_SAVE);
    assert_int_equal(pl.value, 1250);
    assert_int_equal(pl.value2, 1048576);
    assert_int_equal(progress("checkpoint load 0 7", &pl), 0);
    assert_int_equal(pl.kind, EDL_PROGRESS_CHECKPOINT_LOAD);
    assert_int_equal(pl.value, 0);
    assert_int_equal(pl.value2, 7);
    assert_int_equal(progress("total 400", &pl), 0);
    assert_int_equal(pl.kind, EDL_PROGRESS_TOTAL);
    assert_int_equal(pl.value, 400);
    assert_int_equal(progress("distill 12 3", &pl), 0);
    assert_int_equal(pl.kind, EDL_PROGRESS_DISTILL);
    assert_int_equal(pl.value, 12);
    assert_int_equal(pl.value2, 3);
    char big[400];
    snprintf(big, sizeof big, "blocked 5 %0*d", EDL_PROGRESS_WHAT_MAX + 1, 0);
    const char *bad[] = {"", "step", "step ", "step -1", "step 1x", "step 99999999999999999999",
                         "blocked", "blocked x y", "blocked 1 a\tb", "unblocked ", "hello",
                         "graceful ", "gracefully", "inprocess ", "in process",
                         "checkpoint", "checkpoint save", "checkpoint save 1", "checkpoint save 1 ",
                         "checkpoint save  1 2", "checkpoint save 1  2", "checkpoint save 1 2 3",
                         "checkpoint save -1 2", "checkpoint load 1 -2", "checkpoint store 1 2",
                         "checkpoint load 1 99999999999999999999", "checkpoint save 1 2x",
                         "distill", "distill ", "distill 1", "distill 1 ", "distill -1 2",
                         "distill 1 2 3", "distill x 2", "distill  1 2", "total", "total ",
                         "total 0", "total -1", "total 1 2", "totals 1", big};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (progress(bad[i], &pl) != EDL_EPROTO)
            fail_msg("accepted: \"%s\"", bad[i]);
}

/* ---- the job secret --------------------------------------------------------------------- */

static void write_file(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(path, mode), 0);
}

static void test_secret_generated_loads_and_macs(void **state)
{
    (void)state;
    char dir[] = "/tmp/edl-secret-XXXXXX", path[64], why[512];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/s", dir);
    assert_int_equal(edl_job_secret_generate(path, why, sizeof why), 0);
    assert_int_equal(edl_job_secret_generate(path, why, sizeof why), EDL_EIO); /* never reused */
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(st.st_size, 32);
    edl_job_secret a, b;
    edl_job_secret_init(&a);
    edl_job_secret_init(&b);
    setenv(EDL_SECRET_FILE_ENV, path, 1);
    unsetenv(EDL_SECRET_ENV);
    assert_int_equal(edl_job_secret_load(&a, why, sizeof why), 0);
    assert_int_equal(a.len, 32);
    unsetenv(EDL_SECRET_FILE_ENV);
    setenv(EDL_SECRET_ENV, "0123456789abcdef0123456789abcdef", 1);
    assert_int_equal(edl_job_secret_load(&b, why, sizeof why), 0);
    uint8_t m1[EDL_SECRET_MAC_BYTES], m2[EDL_SECRET_MAC_BYTES], m3[EDL_SECRET_MAC_BYTES];
    assert_int_equal(edl_job_secret_mac(&a, "msg", 3, m1), 0);
    assert_int_equal(edl_job_secret_mac(&a, "msg", 3, m2), 0);
    assert_int_equal(edl_job_secret_mac(&b, "msg", 3, m3), 0);
    assert_true(edl_job_secret_mac_equal(m1, m2));
    assert_false(edl_job_secret_mac_equal(m1, m3)); /* another secret, another MAC */
    edl_job_secret_clear(&a);
    assert_int_equal(a.len, 0);
    assert_int_equal(edl_job_secret_mac(&a, "msg", 3, m1), EDL_EINVAL);
    unsetenv(EDL_SECRET_ENV);
    unlink(path);
    rmdir(dir);
}

static void test_secret_refuses_what_is_unsafe(void **state)
{
    (void)state;
    char dir[] = "/tmp/edl-secret-XXXXXX", path[64], why[512];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/s", dir);
    edl_job_secret s;
    edl_job_secret_init(&s);
    unsetenv(EDL_SECRET_FILE_ENV);
    unsetenv(EDL_SECRET_ENV);
    assert_int_equal(edl_job_secret_load(&s, why, sizeof why), EDL_ENOTFOUND);
    assert_non_null(strstr(why, EDL_SECRET_FILE_ENV));
    write_file(path, "0123456789abcdef0123456789abcdef", 0644); /* others can read it */
    assert_int_equal(edl_job_secret_load_file(&s, path, why, sizeof why), EDL_ECONFIG);
    assert_non_null(strstr(why, "group or others"));
    write_file(path, "too short", 0600);
    assert_int_equal(edl_job_secret_load_file(&s, path, why, sizeof why), EDL_ECONFIG);
    assert_non_null(strstr(why, "holds 9 bytes"));
    assert_int_equal(edl_job_secret_load_file(&s, dir, why, sizeof why), EDL_ECONFIG);
    assert_int_equal(edl_job_secret_load_file(&s, "/nonexistent/x", why, sizeof why),
                     EDL_ECONFIG);
    setenv(EDL_SECRET_FILE_ENV, path, 1);
    setenv(EDL_SECRET_ENV, "0123456789abcdef0123456789abcdef", 1);
    assert_int_equal(edl_job_secret_load(&s, why, sizeof why), EDL_ECONFIG); /* both */
    unsetenv(EDL_SECRET_FILE_ENV);
    setenv(EDL_SECRET_ENV, "short", 1);
    assert_int_equal(edl_job_secret_load(&s, why, sizeof why), EDL_ECONFIG);
    assert_int_equal(s.len, 0); /* untouched on error */
    unsetenv(EDL_SECRET_ENV);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_progress_lines),
        cmocka_unit_test(test_secret_generated_loads_and_macs),
        cmocka_unit_test(test_secret_refuses_what_is_unsafe),
        cmocka_unit_test(test_first_generation_ranks_in_join_order),
        cmocka_unit_test(test_leave_fills_hole_with_highest_rank),
        cmocka_unit_test(test_rank0_survives_scale_down),
        cmocka_unit_test(test_newcomers_fill_holes_then_append),
        cmocka_unit_test(test_beyond_max_are_standbys_and_promoted),
        cmocka_unit_test(test_reregistered_pod_is_a_newcomer),
        cmocka_unit_test(test_assignment_is_deterministic),
        cmocka_unit_test(test_spec_parse_and_round_trip),
        cmocka_unit_test(test_bad_specs_rejected_with_reason),
        cmocka_unit_test(test_spec_ps_role_round_trip),
        cmocka_unit_test(test_bad_ps_specs_rejected_with_reason),
        cmocka_unit_test(test_spec_teachers_round_trip),
        cmocka_unit_test(test_bad_teacher_specs_rejected_with_reason),
        cmocka_unit_test(test_generation_round_trip),
        cmocka_unit_test(test_bad_generation_documents_rejected),
        cmocka_unit_test(test_generation_servers_round_trip),
        cmocka_unit_test(test_bad_generation_servers_rejected),
        cmocka_unit_test(test_pod_and_status_documents),
        cmocka_unit_test(test_names_and_keys),
        cmocka_unit_test(test_keys_are_built_and_recognised_in_one_place),
        cmocka_unit_test(test_exit_codes_and_names_have_one_source),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_agent_env.c: the pure parts of the agent: the trainer's environment (every name, local
 * ranks across addresses, inherited values overridden), a parameter server's environment and a
 * worker's view of the servers, and the trainer's side of the agent
 * protocol, edl/agent_link.h (progress lines, control lines, standalone mode, malformed and
 * oversized input). */
#define _GNU_SOURCE /* pipe2 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"
#include "edl/agent_link.h"

static const char *var(char **env, const char *name)
{
    size_t n = strlen(name);
    const char *found = NULL;
    for (size_t i = 0; env[i]; i++)
        if (strncmp(env[i], name, n) == 0 && env[i][n] == '=') {
            assert_null(found); /* each name exactly once */
            found = env[i] + n + 1;
        }
    return found;
}

static void assert_var(char **env, const char *name, const char *want)
{
    const char *v = var(env, name);
    if (!v)
        fail_msg("%s is not set", name);
    if (strcmp(v, want) != 0)
        fail_msg("%s=%s, expected %s", name, v, want);
}

static void test_environment_names_and_local_ranks(void **state)
{
    (void)state;
    edl_member m[4] = {{(char *)"p0", 0, (char *)"10.0.0.1", 7000, 1},
                       {(char *)"p1", 1, (char *)"10.0.0.2", 7001, 2},
                       {(char *)"p2", 2, (char *)"10.0.0.1", 7002, 3},
                       {(char *)"p3", 3, (char *)"10.0.0.1", 7003, 4}};
    edl_generation c = {.generation = 9, .state = EDL_JOB_RUNNING, .members = m, .n_members = 4,
                        .restarts = 2, .started_ms = 1764300000123};
    edl_job_spec s;
    edl_spec_init(&s);
    s.max_restarts = 3;
    s.mode = EDL_MODE_INPROCESS;
    char *base[] = {(char *)"PATH=/bin", (char *)"RANK=99", (char *)"EDL_CHECKPOINT_URI=s3://old",
                    (char *)"KEEP=me", (char *)"TORCHELASTIC_ERROR_FILE=/old", NULL};
    edl_etcd_config ec;
    edl_etcd_config_init(&ec);
    assert_int_equal(edl_etcd_config_set_endpoints(&ec, "http://e:2379"), 0);
    agent_env_input in = {.job = "j", .pod = "p3", .etcd = &ec,
                          .prefix = "/edl/v1", .role = "worker", .spec = &s, .generation = &c,
                          .rank = 3, .master_port = 41234, .error_file = "/run/e/error.json",
                          .control_fd = 3, .progress_fd = 4};
    char **env;
    assert_int_equal(agent_env_build(&in, base, &env), 0);
    assert_var(env, "PATH", "/bin");
    assert_var(env, "KEEP", "me");
    assert_null(var(env, "EDL_CHECKPOINT_URI")); /* none in the spec: not inherited either */
    assert_var(env, "EDL_JOB_ID", "j");
    assert_var(env, "EDL_POD_ID", "p3");
    assert_var(env, "EDL_RANK", "3");
    assert_var(env, "EDL_WORLD_SIZE", "4");
    assert_var(env, "EDL_GENERATION", "9");
    assert_var(env, "EDL_RUN_ID", "1764300000123"); /* the run, for checkpoints */
    assert_var(env, "EDL_ETCD_ENDPOINTS", "http://e:2379");
    assert_var(env, "EDL_ETCD_PREFIX", "/edl/v1");
    assert_var(env, "EDL_ELASTIC_MODE", "inprocess");
    assert_var(env, "EDL_CONTROL_FD", "3");
    assert_var(env, "EDL_PROGRESS_FD", "4");
    assert_var(env, "RANK", "3");
    assert_var(env, "GROUP_RANK", "3");
    assert_var(env, "LOCAL_RANK", "2");       /* third of the three on 10.0.0.1 */
    assert_var(env, "LOCAL_WORLD_SIZE", "3");
    assert_var(env, "WORLD_SIZE", "4");
    assert_var(env, "MASTER_ADDR", "10.0.0.1");
    assert_var(env, "MASTER_PORT", "41234"); /* the generation's own, not rank 0's pod port */
    assert_var(env, "GROUP_WORLD_SIZE", "4");
    assert_var(env, "ROLE_NAME", "worker");
    assert_var(env, "ROLE_RANK", "3");
    assert_var(env, "ROLE_WORLD_SIZE", "4");
    assert_var(env, "TORCHELASTIC_RESTART_COUNT", "2"); /* the job's failure restarts */
    assert_var(env, "TORCHELASTIC_MAX_RESTARTS", "3");
    assert_var(env, "TORCHELASTIC_RUN_ID", "j");
    assert_var(env, "TORCHELASTIC_ERROR_FILE", "/run/e/error.json");
    assert_var(env, "PADDLE_TRAINER_ID", "3");
    assert_var(env, "PADDLE_TRAINERS_NUM", "4");
    assert_var(env, "PADDLE_TRAINER_ENDPOINTS", "10.0.0.1:7000,10.0.0.2:7001,10.0.0.1:7002,10.0.0.1:7003");
    assert_var(env, "PADDLE_CURRENT_ENDPOINT", "10.0.0.1:7003");
    assert_var(env, "PADDLE_PSERVERS_IP_PORT_LIST", ""); /* no servers */
    assert_var(env, "EDL_PS_SERVERS", "0");
    assert_var(env, "TRAINING_ROLE", "TRAINER");
    assert_var(env, "POD_IP", "10.0.0.1");
    edl_env_free(env);

    in.rank = 1;
    in.pod = "p1";
    s.checkpoint_uri = strdup("s3://bucket/ckpt");
    assert_int_equal(agent_env_build(&in, base, &env), 0);
    assert_var(env, "LOCAL_RANK", "0");
    assert_var(env, "LOCAL_WORLD_SIZE", "1");
    assert_var(env, "EDL_CHECKPOINT_URI", "s3://bucket/ckpt");
    edl_env_free(env);
    in.master_port = 0; /* none published: rank 0's registered port */
    in.error_file = NULL;
    assert_int_equal(agent_env_build(&in, base, &env), 0);
    assert_var(env, "MASTER_PORT", "7000");
    assert_null(var(env, "TORCHELASTIC_ERROR_FILE")); /* the inherited one is not passed on */
    edl_env_free(env);
    in.rank = 4; /* not a rank of this generation */
    assert_int_equal(agent_env_build(&in, base, &env), EDL_EINVAL);
    edl_spec_clear(&s);
    edl_etcd_config_clear(&ec);
}

/* The agent's etcd TLS and auth settings reach the trainer under the names libedlcoll and the
 * checkpoint code read (the password only as its file); inherited ones never do. */
static void test_etcd_security_settings_are_passed_on(void **state)
{
    (void)state;
    edl_member m[1] = {{(char *)"p0", 0, (char *)"10.0.0.1", 7000, 1}};
    edl_generation g = {.generation = 1, .state = EDL_JOB_RUNNING, .members = m, .n_members = 1};
    edl_job_spec s;
    edl_spec_init(&s);
    char *base[] = {(char *)"EDL_ETCD_CERT=/stale/cert", (char *)"EDL_ETCD_USER=intruder",
                    (char *)"EDL_ETCD_PASSWORD_FILE=/stale/pw", NULL};
    edl_etcd_config ec;
    edl_etcd_config_init(&ec);
    assert_int_equal(edl_etcd_config_set_endpoints(&ec, "https://a:2379,https://b:2379"), 0);
    agent_env_input in = {.job = "j", .pod = "p0", .etcd = &ec, .prefix = "/edl/v1", .spec = &s,
                          .generation = &g, .rank = 0, .control_fd = 3, .progress_fd = 4};
    char **env;
    assert_int_equal(agent_env_build(&in, base, &env), 0);
    assert_var(env, "EDL_ETCD_ENDPOINTS", "https://a:2379,https://b:2379");
    assert_null(var(env, "EDL_ETCD_CERT")); /* the agent has none: the inherited one goes */
    assert_null(var(env, "EDL_ETCD_USER"));
    assert_null(var(env, "EDL_ETCD_PASSWORD_FILE"));
    edl_env_free(env);
    ec.ca_file = strdup("/s/ca.crt");
    ec.cert_file = strdup("/s/client.crt");
    ec.key_file = strdup("/s/client.key");
    ec.username = strdup("trainer");
    ec.password = strdup("s3cret");
    ec.password_file = strdup("/s/pw");
    assert_int_equal(agent_env_build(&in, base, &env), 0);
    assert_var(env, "EDL_ETCD_CACERT", "/s/ca.crt");
    assert_var(env, "EDL_ETCD_CERT", "/s/client.crt");
    assert_var(env, "EDL_ETCD_KEY", "/s/client.key");
    assert_var(env, "EDL_ETCD_USER", "trainer");
    assert_var(env, "EDL_ETCD_PASSWORD_FILE", "/s/pw");
    for (size_t i = 0; env[i]; i++)
        assert_null(strstr(env[i], "s3cret"));
    edl_env_free(env);
    edl_etcd_config_clear(&ec);
    edl_spec_clear(&s);
}

/* A worker of a job with parameter servers sees them in rank order; a ps process gets Paddle's
 * PSERVER names and its server rank, and none of a worker's (inherited ones removed). */
static void test_ps_and_worker_environments(void **state)
{
    (void)state;
    edl_member m[2] = {{(char *)"w0", 0, (char *)"10.0.0.1", 7000, 1},
                       {(char *)"w1", 1, (char *)"10.0.0.2", 7001, 2}};
    edl_member sv[3] = {{(char *)"s0", 0, (char *)"10.0.1.1", 8000, 11},
                        {(char *)"s1", 1, (char *)"10.0.1.2", 8001, 12},
                        {(char *)"s2", 2, (char *)"10.0.1.3", 8002, 13}};
    edl_generation g = {.generation = 6, .members_generation = 4, .state = EDL_JOB_RUNNING,
                        .members = m, .n_members = 2, .servers = sv, .n_servers = 3,
                        .restarts = 1};
    edl_job_spec s;
    edl_spec_init(&s);
    s.ps_min = 2;
    s.ps_max = 3;
    char *base[] = {(char *)"PATH=/bin", (char *)"RANK=5", (char *)"MASTER_ADDR=10.9.9.9",
                    (char *)"PADDLE_TRAINER_ID=4", (char *)"POD_IP=10.9.9.8",
                    (char *)"PADDLE_PORT=1", (char *)"EDL_PS_INDEX=7", NULL};
    edl_etcd_config ec;
    edl_etcd_config_init(&ec);
    assert_int_equal(edl_etcd_config_set_endpoints(&ec, "http://e:2379"), 0);
    agent_env_input in = {.job = "j", .pod = "w1", .etcd = &ec, .prefix = "/p", .role = "worker",
                          .spec = &s, .generation = &g, .rank = 1, .master_port = 40000,
                          .control_fd = 3, .progress_fd = 4};
    char **env;
    assert_int_equal(agent_env_build(&in, base, &env), 0);
    assert_var(env, "TRAINING_ROLE", "TRAINER");
    assert_var(env, "PADDLE_PSERVERS_IP_PORT_LIST", "10.0.1.1:8000,10.0.1.2:8001,10.0.1.3:8002");
    assert_var(env, "EDL_PS_SERVERS", "3");
    assert_var(env, "RANK", "1");
    assert_var(env, "PADDLE_TRAINER_ID", "1");
    assert_var(env, "PADDLE_TRAINERS_NUM", "2");
    assert_var(env, "POD_IP", "10.0.0.2");
    /* the generation its members were formed in: the same on every rank since */
    assert_var(env, "EDL_GENERATION", "4");
    edl_assignment as;
    assert_int_equal(agent_assignment(&g, 1, 40000, &as), 0);
    assert_int_equal(as.generation, 4);
    assert_null(var(env, "PADDLE_PORT"));  /* a server's name: the inherited one goes */
    assert_null(var(env, "EDL_PS_INDEX"));
    edl_env_free(env);

    in.pod = "s2";
    in.role = "ps";
    in.rank = 2; /* its rank among the servers */
    assert_int_equal(agent_env_build(&in, base, &env), 0);
    assert_var(env, "PATH", "/bin");
    assert_var(env, "EDL_JOB_ID", "j");
    assert_var(env, "EDL_POD_ID", "s2");
    assert_var(env, "EDL_GENERATION", "6"); /* a server's: the one it starts in */
    assert_var(env, "EDL_ETCD_ENDPOINTS", "http://e:2379");
    assert_var(env, "EDL_ETCD_PREFIX", "/p");
    assert_var(env, "TRAINING_ROLE", "PSERVER");
    assert_var(env, "PADDLE_PSERVERS_IP_PORT_LIST", "10.0.1.1:8000,10.0.1.2:8001,10.0.1.3:8002");
    assert_var(env, "PADDLE_PORT", "8002");
    assert_var(env, "POD_IP", "10.0.1.3");
    assert_var(env, "PADDLE_TRAINERS_NUM", "2");
    assert_var(env, "EDL_PS_INDEX", "2");
    assert_var(env, "EDL_PS_SERVERS", "3");
    static const char *const worker_only[] = {
        "RANK", "EDL_RANK", "EDL_WORLD_SIZE", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK",
        "MASTER_ADDR", "MASTER_PORT", "PADDLE_TRAINER_ID", "PADDLE_TRAINER_ENDPOINTS",
        "PADDLE_CURRENT_ENDPOINT", "ROLE_NAME", "TORCHELASTIC_ERROR_FILE", NULL};
    for (const char *const *n = worker_only; *n; n++)
        if (var(env, *n))
            fail_msg("a parameter server got %s=%s", *n, var(env, *n));
    edl_env_free(env);
    in.rank = 3; /* not a server of this generation */
    assert_int_equal(agent_env_build(&in, base, &env), EDL_EINVAL);
    edl_spec_clear(&s);
    edl_etcd_config_clear(&ec);
}

static void test_agent_link_standalone_does_nothing(void **state)
{
    (void)state;
    unsetenv("EDL_PROGRESS_FD");
    unsetenv("EDL_CONTROL_FD");
    unsetenv("EDL_RANK");
    unsetenv("EDL_WORLD_SIZE");
    unsetenv("EDL_GENERATION");
    edl_agent_link *t;
    assert_int_equal(edl_agent_link_open(&t), 0);
    assert_int_equal(edl_agent_link_report_step(t, 5), 0);
    edl_assignment g;
    assert_int_equal(edl_agent_link_poll(t, &g), 0);
    assert_int_equal(edl_agent_link_rank(t), 0);
    assert_int_equal(edl_agent_link_world_size(t), 1);
    assert_int_equal(edl_agent_link_generation(t), 0);
    edl_agent_link_close(t);
    setenv("EDL_PROGRESS_FD", "987", 1); /* not an open fd */
    assert_int_equal(edl_agent_link_open(&t), EDL_ECONFIG);
    unsetenv("EDL_PROGRESS_FD");
}

static void test_agent_link_protocol_over_pipes(void **state)
{
    (void)state;
    int ctl[2], prog[2];
    assert_int_equal(pipe(ctl), 0);
    assert_int_equal(pipe(prog), 0);
    char v[16];
    snprintf(v, sizeof v, "%d", ctl[0]);
    setenv("EDL_CONTROL_FD", v, 1);
    snprintf(v, sizeof v, "%d", prog[1]);
    setenv("EDL_PROGRESS_FD", v, 1);
    setenv("EDL_RANK", "1", 1);
    setenv("EDL_WORLD_SIZE", "2", 1);
    setenv("EDL_GENERATION", "4", 1);
    edl_agent_link *t;
    assert_int_equal(edl_agent_link_open(&t), 0);
    assert_int_equal(edl_agent_link_rank(t), 1);
    assert_int_equal(edl_agent_link_world_size(t), 2);
    assert_int_equal(edl_agent_link_generation(t), 4);
    assert_true(fcntl(ctl[0], F_GETFL) & O_NONBLOCK);
    assert_true(fcntl(ctl[0], F_GETFD) & FD_CLOEXEC);

    assert_int_equal(edl_agent_link_report_step(t, 12), 0);
    assert_int_equal(edl_agent_link_report_step(t, -1), EDL_EINVAL);
    char buf[64] = "";
    assert_int_equal(read(prog[0], buf, sizeof buf - 1), 8);
    assert_string_equal(buf, "step 12\n");

    edl_assignment g;
    assert_int_equal(edl_agent_link_poll(t, &g), 0); /* nothing yet */
    /* an old generation, a malformed line, then a newer one split across writes */
    edl_assignment out = {.generation = 3, .rank = 0, .world_size = 1, .master_port = 1};
    snprintf(out.master_addr, sizeof out.master_addr, "a");
    char *old = edl_assignment_encode(&out);
    out = (edl_assignment){.generation = 5, .rank = 0, .world_size = 3, .master_port = 7000};
    snprintf(out.master_addr, sizeof out.master_addr, "10.0.0.1");
    char *line = edl_assignment_encode(&out);
    assert_int_equal(write(ctl[1], old, strlen(old)), (ssize_t)strlen(old));
    assert_int_equal(write(ctl[1], "{\"generation\":\"x\"}\nnot json\n", 29), 29);
    size_t half = strlen(line) / 2;
    assert_int_equal(write(ctl[1], line, half), (ssize_t)half);
    assert_int_equal(edl_agent_link_poll(t, &g), 0);
    assert_int_equal(write(ctl[1], line + half, strlen(line) - half), (ssize_t)(strlen(line) - half));
    assert_int_equal(edl_agent_link_poll(t, &g), 1);
    assert_int_equal(g.generation, 5);
    assert_int_equal(g.rank, 0);
    assert_int_equal(g.world_size, 3);
    assert_string_equal(g.master_addr, "10.0.0.1");
    assert_int_equal(g.master_port, 7000);
    assert_int_equal(edl_agent_link_rank(t), 0);
    assert_int_equal(edl_agent_link_generation(t), 5);
    assert_int_equal(edl_agent_link_poll(t, &g), 0);
    free(old);
    free(line);
    /* the pod leaves: a trainer that said "graceful" reads the leave line, and keeps its place
     * (rank, world size) until it exits */
    assert_int_equal(edl_agent_link_report_graceful(t), 0);
    memset(buf, 0, sizeof buf);
    assert_int_equal(read(prog[0], buf, sizeof buf - 1), 9);
    assert_string_equal(buf, "graceful\n");
    out = (edl_assignment){.generation = 6, .leave = true};
    line = edl_assignment_encode(&out);
    assert_string_equal(line, "{\"generation\":6,\"leave\":true}\n");
    assert_int_equal(write(ctl[1], line, strlen(line)), (ssize_t)strlen(line));
    free(line);
    assert_int_equal(edl_agent_link_poll(t, &g), 1);
    assert_true(g.leave);
    assert_int_equal(g.generation, 6);
    assert_int_equal(edl_agent_link_generation(t), 6);
    assert_int_equal(edl_agent_link_world_size(t), 3);
    /* the agent goes away */
    close(ctl[1]);
    assert_int_equal(edl_agent_link_poll(t, &g), EDL_EIO);
    edl_agent_link_close(t);
    close(prog[0]);
    unsetenv("EDL_CONTROL_FD");
    unsetenv("EDL_PROGRESS_FD");
    unsetenv("EDL_RANK");
    unsetenv("EDL_WORLD_SIZE");
    unsetenv("EDL_GENERATION");
}

/* A leave line holds its generation and "leave":true, nothing more; an assignment never leaves. */
static void test_leave_line_is_parsed_strictly(void **state)
{
    (void)state;
    edl_assignment a;
    const char *ok = "{\"leave\":true,\"generation\":9}";
    assert_int_equal(edl_assignment_parse(ok, strlen(ok), &a), 0);
    assert_true(a.leave);
    assert_int_equal(a.generation, 9);
    const char *assign = "{\"generation\":2,\"rank\":0,\"world_size\":1,\"master_addr\":\"a\","
                         "\"master_port\":1}";
    assert_int_equal(edl_assignment_parse(assign, strlen(assign), &a), 0);
    assert_false(a.leave);
    const char *bad[] = {"{\"leave\":false,\"generation\":9}", "{\"leave\":true}",
                         "{\"leave\":1,\"generation\":9}", "{\"leave\":true,\"generation\":0}",
                         "{\"leave\":true,\"generation\":9,\"rank\":0}",
                         "{\"leave\":null,\"generation\":9}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (edl_assignment_parse(bad[i], strlen(bad[i]), &a) != EDL_EPROTO)
            fail_msg("accepted: %s", bad[i]);
}

static void test_agent_link_drops_oversized_control_line(void **state)
{
    (void)state;
    int ctl[2];
    assert_int_equal(pipe2(ctl, 0), 0);
    fcntl(ctl[1], F_SETFL, O_NONBLOCK);
    char v[16];
    snprintf(v, sizeof v, "%d", ctl[0]);
    setenv("EDL_CONTROL_FD", v, 1);
    edl_agent_link *t;
    assert_int_equal(edl_agent_link_open(&t), 0);
    edl_assignment g;
    /* stream more than the limit without a newline, polling as a trainer would */
    static char junk[65536];
    memset(junk, 'x', sizeof junk);
    size_t sent = 0;
    while (sent < (size_t)EDL_AGENT_LINE_MAX + 100000) {
        ssize_t n = write(ctl[1], junk, sizeof junk);
        if (n > 0)
            sent += (size_t)n;
        assert_true(edl_agent_link_poll(t, &g) >= 0);
    }
    edl_assignment out = {.generation = 2, .rank = 0, .world_size = 1, .master_port = 1};
    snprintf(out.master_addr, sizeof out.master_addr, "a");
    char *line = edl_assignment_encode(&out);
    assert_int_equal(write(ctl[1], "\n", 1), 1);
    assert_int_equal(write(ctl[1], line, strlen(line)), (ssize_t)strlen(line));
    assert_int_equal(edl_agent_link_poll(t, &g), 1);
    assert_int_equal(g.generation, 2);
    free(line);
    close(ctl[1]);
    edl_agent_link_close(t);
    unsetenv("EDL_CONTROL_FD");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_environment_names_and_local_ranks),
        cmocka_unit_test(test_etcd_security_settings_are_passed_on),
        cmocka_unit_test(test_ps_and_worker_environments),
        cmocka_unit_test(test_agent_link_standalone_does_nothing),
        cmocka_unit_test(test_agent_link_protocol_over_pipes),
        cmocka_unit_test(test_leave_line_is_parsed_strictly),
        cmocka_unit_test(test_agent_link_drops_oversized_control_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

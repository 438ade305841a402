/* test_config.c: the YAML configuration loader against a realistic job schema: every type,
 * every error message with its position, the struct left intact on error, hostile input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "edl/common.h"
#include "edl/config.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct tls_cfg {
    char *cert;
    char *key;
    bool enabled;
} tls_cfg;

typedef struct etcd_cfg {
    char **endpoints;
    size_t n_endpoints;
    int64_t timeout_ms;
    int64_t max_retries;
    tls_cfg tls;
} etcd_cfg;

typedef struct job_cfg {
    char *name;
    int64_t min_workers;
    int64_t seed;
    double learning_rate;
    bool elastic;
    int64_t heartbeat_ms;
} job_cfg;

typedef struct app_cfg {
    job_cfg job;
    etcd_cfg etcd;
    char *log_level;
    char **tags;
    size_t n_tags;
} app_cfg;

static const edl_cfg_field tls_fields[] = {
    {"cert", EDL_CFG_STRING, offsetof(tls_cfg, cert), .required = true, .help = "PEM client certificate"},
    {"key", EDL_CFG_STRING, offsetof(tls_cfg, key)},
    {"enabled", EDL_CFG_BOOL, offsetof(tls_cfg, enabled)},
    EDL_CFG_END,
};

static const edl_cfg_field etcd_fields[] = {
    {"endpoints", EDL_CFG_STRING_LIST, offsetof(etcd_cfg, endpoints), .count_offset = offsetof(etcd_cfg, n_endpoints),
     .help = "client URLs"},
    {"timeout", EDL_CFG_DURATION_MS, offsetof(etcd_cfg, timeout_ms), .min = 100, .max = 60000},
    {"max_retries", EDL_CFG_INT, offsetof(etcd_cfg, max_retries), .min = 0, .max = 100},
    {"tls", EDL_CFG_OBJECT, offsetof(etcd_cfg, tls), .fields = tls_fields},
    EDL_CFG_END,
};

static const edl_cfg_field job_fields[] = {
    {"name", EDL_CFG_STRING, offsetof(job_cfg, name), .required = true},
    {"min_workers", EDL_CFG_INT, offsetof(job_cfg, min_workers), .min = 1, .max = 1024},
    {"seed", EDL_CFG_INT, offsetof(job_cfg, seed)},
    {"learning_rate", EDL_CFG_DOUBLE, offsetof(job_cfg, learning_rate)},
    {"elastic", EDL_CFG_BOOL, offsetof(job_cfg, elastic)},
    {"heartbeat", EDL_CFG_DURATION_MS, offsetof(job_cfg, heartbeat_ms)},
    EDL_CFG_END,
};

static const edl_cfg_field app_fields[] = {
    {"job", EDL_CFG_OBJECT, offsetof(app_cfg, job), .fields = job_fields, .required = true},
    {"etcd", EDL_CFG_OBJECT, offsetof(app_cfg, etcd), .fields = etcd_fields},
    {"log_level", EDL_CFG_STRING, offsetof(app_cfg, log_level), .help = "debug, info, warn or error"},
    {"tags", EDL_CFG_STRING_LIST, offsetof(app_cfg, tags), .count_offset = offsetof(app_cfg, n_tags)},
    EDL_CFG_END,
};

static const char full_yaml[] = "# a complete job file\n"
                                "job:\n"
                                "  name: resnet50-imagenet\n"
                                "  min_workers: 4\n"
                                "  seed: -0x10\n"
                                "  learning_rate: 0.125\n"
                                "  elastic: yes\n"
                                "  heartbeat: 1.5s\n"
                                "etcd:\n"
                                "  endpoints:\n"
                                "    - http://10.0.0.1:2379\n"
                                "    - \"http://10.0.0.2:2379\"\n"
                                "  timeout: 2s\n"
                                "  max_retries: 7\n"
                                "  tls:\n"
                                "    cert: /etc/edl/client.pem\n"
                                "    enabled: true\n"
                                "log_level: debug\n"
                                "tags: [vision, \"nightly run\"]\n";

static char **make_list(const char *a, const char *b, size_t *n)
{
    char **l = calloc(3, sizeof *l);
    assert_non_null(l);
    l[0] = strdup(a);
    l[1] = b ? strdup(b) : NULL;
    *n = b ? 2 : 1;
    return l;
}

/* Defaults as a program would set them: heap strings, since the struct owns them. */
static void make_defaults(app_cfg *c)
{
    memset(c, 0, sizeof *c);
    c->job.min_workers = 1;
    c->job.seed = 42;
    c->job.learning_rate = 0.01;
    c->job.heartbeat_ms = 3000;
    c->etcd.endpoints = make_list("http://127.0.0.1:2379", NULL, &c->etcd.n_endpoints);
    c->etcd.timeout_ms = 5000;
    c->etcd.max_retries = 3;
    c->log_level = strdup("info");
    c->tags = make_list("default", "dev", &c->n_tags);
}

/* Same values, same allocations: nothing was replaced, freed or half-written. */
static void assert_untouched(const app_cfg *now, const app_cfg *before)
{
    assert_ptr_equal(now->job.name, before->job.name);
    assert_int_equal(now->job.min_workers, before->job.min_workers);
    assert_int_equal(now->job.seed, before->job.seed);
    assert_true(now->job.learning_rate == before->job.learning_rate);
    assert_int_equal(now->job.elastic, before->job.elastic);
    assert_int_equal(now->job.heartbeat_ms, before->job.heartbeat_ms);
    assert_ptr_equal(now->etcd.endpoints, before->etcd.endpoints);
    assert_int_equal(now->etcd.n_endpoints, before->etcd.n_endpoints);
    assert_int_equal(now->etcd.timeout_ms, before->etcd.timeout_ms);
    assert_int_equal(now->etcd.max_retries, before->etcd.max_retries);
    assert_ptr_equal(now->etcd.tls.cert, before->etcd.tls.cert);
    assert_ptr_equal(now->etcd.tls.key, before->etcd.tls.key);
    assert_int_equal(now->etcd.tls.enabled, before->etcd.tls.enabled);
    assert_ptr_equal(now->log_level, before->log_level);
    assert_ptr_equal(now->tags, before->tags);
    assert_int_equal(now->n_tags, before->n_tags);
    /* and the memory is still alive (ASan would object otherwise) */
    assert_string_equal(now->log_level, "info");
    assert_string_equal(now->etcd.endpoints[0], "http://127.0.0.1:2379");
    assert_string_equal(now->tags[1], "dev");
}

static void assert_contains(const char *text, const char *want)
{
    if (!strstr(text, want)) fail_msg("expected \"%s\" in \"%s\"", want, text);
}

/* Load yaml over the defaults, expect the error code and message text, and an intact struct. */
static void expect_error(const char *yaml, int code, const char *want)
{
    app_cfg cfg, before;
    char err[512];
    make_defaults(&cfg);
    before = cfg;
    int rc = edl_config_load_string(yaml, strlen(yaml), "cfg.yaml", app_fields, &cfg, err, sizeof err);
    if (rc != code) fail_msg("rc %d (%s), wanted %d, for:\n%s", rc, err, code, yaml);
    assert_contains(err, want);
    assert_untouched(&cfg, &before);
    edl_config_free(app_fields, &cfg);
}

static app_cfg load_ok(const char *yaml)
{
    app_cfg cfg;
    char err[512];
    make_defaults(&cfg);
    int rc = edl_config_load_string(yaml, strlen(yaml), "cfg.yaml", app_fields, &cfg, err, sizeof err);
    if (rc != 0) fail_msg("rc %d: %s, for:\n%s", rc, err, yaml);
    assert_string_equal(err, "");
    return cfg;
}

static char *write_temp(const char *text, size_t len)
{
    char *path = strdup("/tmp/edl-test-config-XXXXXX");
    assert_non_null(path);
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);
    return path;
}

static void assert_full_config(const app_cfg *cfg)
{
    assert_string_equal(cfg->job.name, "resnet50-imagenet");
    assert_int_equal(cfg->job.min_workers, 4);
    assert_int_equal(cfg->job.seed, -16);
    assert_true(cfg->job.learning_rate == 0.125);
    assert_true(cfg->job.elastic);
    assert_int_equal(cfg->job.heartbeat_ms, 1500);
    assert_int_equal(cfg->etcd.n_endpoints, 2);
    assert_string_equal(cfg->etcd.endpoints[0], "http://10.0.0.1:2379");
    assert_string_equal(cfg->etcd.endpoints[1], "http://10.0.0.2:2379");
    assert_null(cfg->etcd.endpoints[2]);
    assert_int_equal(cfg->etcd.timeout_ms, 2000);
    assert_int_equal(cfg->etcd.max_retries, 7);
    assert_string_equal(cfg->etcd.tls.cert, "/etc/edl/client.pem");
    assert_null(cfg->etcd.tls.key);
    assert_true(cfg->etcd.tls.enabled);
    assert_string_equal(cfg->log_level, "debug");
    assert_int_equal(cfg->n_tags, 2);
    assert_string_equal(cfg->tags[0], "vision");
    assert_string_equal(cfg->tags[1], "nightly run");
}

static void test_full_file_fills_every_field(void **state)
{
    (void)state;
    char *path = write_temp(full_yaml, strlen(full_yaml));
    app_cfg cfg;
    char err[512];
    make_defaults(&cfg);
    assert_int_equal(edl_config_load_file(path, app_fields, &cfg, err, sizeof err), 0);
    assert_string_equal(err, "");
    assert_full_config(&cfg);
    edl_config_free(app_fields, &cfg);
    unlink(path);
    free(path);
}

static void test_string_load_fills_every_field(void **state)
{
    (void)state;
    app_cfg cfg = load_ok(full_yaml);
    assert_full_config(&cfg);
    edl_config_free(app_fields, &cfg);
}

static void test_absent_fields_keep_their_defaults(void **state)
{
    (void)state;
    app_cfg cfg;
    char err[256];
    make_defaults(&cfg);
    char *log_level = cfg.log_level;
    const char *yaml = "job: {name: tiny}\netcd: {max_retries: 0}\n";
    assert_int_equal(edl_config_load_string(yaml, strlen(yaml), NULL, app_fields, &cfg, err, sizeof err), 0);
    assert_string_equal(cfg.job.name, "tiny");
    assert_int_equal(cfg.etcd.max_retries, 0);
    assert_int_equal(cfg.etcd.timeout_ms, 5000);
    assert_int_equal(cfg.job.heartbeat_ms, 3000);
    assert_true(cfg.job.learning_rate == 0.01);
    assert_ptr_equal(cfg.log_level, log_level);
    assert_string_equal(cfg.etcd.endpoints[0], "http://127.0.0.1:2379");
    assert_int_equal(cfg.n_tags, 2);
    edl_config_free(app_fields, &cfg);
}

static void test_loading_twice_replaces_and_frees_old_values(void **state)
{
    (void)state;
    app_cfg cfg = load_ok(full_yaml);
    char err[256];
    const char *yaml = "job: {name: second}\ntags: solo\nlog_level: warn\n";
    assert_int_equal(edl_config_load_string(yaml, strlen(yaml), NULL, app_fields, &cfg, err, sizeof err), 0);
    assert_string_equal(cfg.job.name, "second");
    assert_string_equal(cfg.log_level, "warn");
    assert_int_equal(cfg.n_tags, 1); /* a single scalar is a list of one */
    assert_string_equal(cfg.tags[0], "solo");
    assert_null(cfg.tags[1]);
    assert_int_equal(cfg.etcd.n_endpoints, 2); /* untouched by the second file */
    edl_config_free(app_fields, &cfg);
}

static void test_free_releases_and_clears(void **state)
{
    (void)state;
    app_cfg cfg = load_ok(full_yaml);
    edl_config_free(app_fields, &cfg);
    assert_null(cfg.job.name);
    assert_null(cfg.etcd.endpoints);
    assert_int_equal(cfg.etcd.n_endpoints, 0);
    assert_null(cfg.etcd.tls.cert);
    assert_null(cfg.tags);
    assert_int_equal(cfg.n_tags, 0);
    assert_int_equal(cfg.etcd.timeout_ms, 2000); /* numbers are left alone */
    edl_config_free(app_fields, &cfg);           /* twice is harmless */
}

static void test_empty_list_is_allowed(void **state)
{
    (void)state;
    app_cfg cfg = load_ok("job: {name: x}\ntags: []\n");
    assert_int_equal(cfg.n_tags, 0);
    assert_null(cfg.tags);
    edl_config_free(app_fields, &cfg);
}

static void test_duration_forms(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int64_t ms;
    } cases[] = {
        {"1500", 1500}, {"1.5s", 1500}, {"500ms", 500},   {"2m", 120000}, {"1h", 3600000},
        {"1h30m", 5400000}, {"0.25s", 250}, {"0", 0}, {"\"750ms\"", 750}, {"1m0.5s", 60500},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char yaml[128];
        snprintf(yaml, sizeof yaml, "job: {name: x, heartbeat: %s}\n", cases[i].text);
        app_cfg cfg = load_ok(yaml);
        if (cfg.job.heartbeat_ms != cases[i].ms)
            fail_msg("%s: got %lld ms, wanted %lld", cases[i].text, (long long)cfg.job.heartbeat_ms,
                     (long long)cases[i].ms);
        edl_config_free(app_fields, &cfg);
    }
}

static void test_int_and_bool_forms(void **state)
{
    (void)state;
    app_cfg cfg = load_ok("job: {name: x, seed: 0x7fffffffffffffff, elastic: On}\n");
    assert_int_equal(cfg.job.seed, INT64_MAX);
    assert_true(cfg.job.elastic);
    edl_config_free(app_fields, &cfg);
    cfg = load_ok("job: {name: x, seed: -9223372036854775808, elastic: NO}\n");
    assert_true(cfg.job.seed == INT64_MIN);
    assert_false(cfg.job.elastic);
    edl_config_free(app_fields, &cfg);
    cfg = load_ok("job: {name: 12345, seed: +7, learning_rate: 1e-3}\n");
    assert_string_equal(cfg.job.name, "12345"); /* a number is fine where text is wanted */
    assert_int_equal(cfg.job.seed, 7);
    assert_true(cfg.job.learning_rate == 1e-3);
    edl_config_free(app_fields, &cfg);
}

static void test_bad_values_name_file_line_column_and_field(void **state)
{
    (void)state;
    expect_error("job:\n  name: x\netcd:\n  timeout: abc\n", EDL_ECONFIG,
                 "cfg.yaml:4:12: field 'etcd.timeout': expected a duration (e.g. 500ms, 2s), got \"abc\"");
    expect_error("job:\n  name: x\n  min_workers: lots\n", EDL_ECONFIG,
                 "cfg.yaml:3:16: field 'job.min_workers': expected an integer, got \"lots\"");
    expect_error("job: {name: x, seed: 9223372036854775808}\n", EDL_ECONFIG,
                 "cfg.yaml:1:22: field 'job.seed': \"9223372036854775808\" does not fit in a 64-bit integer");
    expect_error("job: {name: x, elastic: maybe}\n", EDL_ECONFIG,
                 "cfg.yaml:1:25: field 'job.elastic': expected true or false (or yes/no, on/off), got \"maybe\"");
    expect_error("job: {name: x, learning_rate: 1.2.3}\n", EDL_ECONFIG,
                 "field 'job.learning_rate': expected a finite number, got \"1.2.3\"");
    expect_error("job: {name: x, learning_rate: nan}\n", EDL_ECONFIG, "expected a finite number, got \"nan\"");
    expect_error("job: {name: x, heartbeat: 1.5}\n", EDL_ECONFIG, "got \"1.5\"; units are ms, s, m, h");
    expect_error("job: {name: x, heartbeat: -2s}\n", EDL_ECONFIG, "field 'job.heartbeat': duration \"-2s\" is negative");
    expect_error("job: {name: x, heartbeat: 0.5ms}\n", EDL_ECONFIG, "is finer than a millisecond");
    expect_error("job: {name: x, heartbeat: 9999999999999999h}\n", EDL_ECONFIG, "is too long");
}

static void test_out_of_range_names_min_and_max(void **state)
{
    (void)state;
    expect_error("job:\n  name: x\n  min_workers: 0\n", EDL_ECONFIG,
                 "cfg.yaml:3:16: field 'job.min_workers': 0 is out of range (min 1, max 1024)");
    expect_error("job: {name: x}\netcd:\n  timeout: 2m\n", EDL_ECONFIG,
                 "cfg.yaml:3:12: field 'etcd.timeout': 120000ms is out of range (min 100ms, max 60000ms)");
}

static void test_wrong_shapes_are_type_errors(void **state)
{
    (void)state;
    expect_error("job:\n  name: {first: a}\n", EDL_ECONFIG,
                 "cfg.yaml:2:9: field 'job.name': expected a string, got a mapping");
    expect_error("job:\n  name: [a, b]\n", EDL_ECONFIG, "cfg.yaml:2:9: field 'job.name': expected a string, got a list");
    expect_error("job: {name: x}\nlog_level:\n", EDL_ECONFIG,
                 "cfg.yaml:2:11: field 'log_level': expected a string, got nothing (null)");
    expect_error("job: fast\n", EDL_ECONFIG, "cfg.yaml:1:6: field 'job': expected a mapping of fields, got \"fast\"");
    expect_error("job: {name: x}\netcd:\n  endpoints: [a, {b: c}]\n", EDL_ECONFIG,
                 "cfg.yaml:3:18: field 'etcd.endpoints[1]': expected a string, got a mapping");
    expect_error("job: {name: x}\ntags: {a: b}\n", EDL_ECONFIG,
                 "cfg.yaml:2:7: field 'tags': expected a list of strings, got a mapping");
    expect_error("job: {name: \"a\\0b\"}\n", EDL_ECONFIG, "field 'job.name': expected a string, got text with a NUL byte");
    expect_error("- just\n- a list\n", EDL_ECONFIG, "cfg.yaml:1:1: the top level must be a mapping of field names, got a list");
    expect_error("? [a, b]\n: c\n", EDL_ECONFIG, "cfg.yaml:1:3: expected a field name, got a list");
}

static void test_unknown_field_lists_known_ones(void **state)
{
    (void)state;
    expect_error("job: {name: x}\netcd:\n  endpoitns: [a]\n", EDL_ECONFIG,
                 "cfg.yaml:3: unknown field 'etcd.endpoitns' (known fields: endpoints, timeout, max_retries, tls)");
    expect_error("jobs: {name: x}\n", EDL_ECONFIG,
                 "cfg.yaml:1: unknown field 'jobs' (known fields: job, etcd, log_level, tags)");
}

static void test_missing_required_fields(void **state)
{
    (void)state;
    expect_error("job:\n  min_workers: 2\n", EDL_ECONFIG, "cfg.yaml: missing required field 'job.name'");
    expect_error("job:\n", EDL_ECONFIG, "cfg.yaml: missing required field 'job.name'");
    expect_error("log_level: warn\n", EDL_ECONFIG, "cfg.yaml: missing required field 'job'");
    /* tls is optional, but once it appears its cert is required */
    expect_error("job: {name: x}\netcd:\n  tls: {enabled: true}\n", EDL_ECONFIG,
                 "cfg.yaml: missing required field 'etcd.tls.cert'");
}

static void test_empty_document_means_defaults(void **state)
{
    (void)state;
    static const char *const empties[] = {"", "# nothing here\n", "---\n", "~\n"};
    for (size_t i = 0; i < sizeof empties / sizeof *empties; i++) {
        /* with a required field the only error is that one... */
        expect_error(empties[i], EDL_ECONFIG, "cfg.yaml: missing required field 'job'");
        /* ...and without one every default stays */
        etcd_cfg e = {.timeout_ms = 777};
        char err[128];
        assert_int_equal(edl_config_load_string(empties[i], strlen(empties[i]), "e.yaml", etcd_fields, &e, err,
                                                sizeof err),
                         0);
        assert_int_equal(e.timeout_ms, 777);
        assert_null(e.endpoints);
    }
}

static void test_duplicate_key_is_an_error(void **state)
{
    (void)state;
    expect_error("job:\n  name: x\netcd:\n  timeout: 1s\n  timeout: 2s\n", EDL_ECONFIG,
                 "cfg.yaml:5:3: duplicate field 'etcd.timeout' (first set on line 4)");
    expect_error("job:\n  name: x\njob: {name: y}\n", EDL_ECONFIG,
                 "cfg.yaml:3:1: duplicate field 'job' (first set on line 1)");
}

static void test_yaml_syntax_errors_give_position(void **state)
{
    (void)state;
    expect_error("job:\n  name: x\n   bad: indent\n", EDL_ECONFIG, "cfg.yaml:3:7: YAML syntax error: ");
    expect_error("job: {name: x\n", EDL_ECONFIG, "cfg.yaml:2:1: YAML syntax error: ");
    expect_error("job: {name: x}\n---\njob: {name: y}\n", EDL_ECONFIG,
                 "cfg.yaml:2:1: a second YAML document; a configuration file holds exactly one");
    expect_error("job: {name: \"\xff\xfe\"}\n", EDL_ECONFIG, "cfg.yaml: not readable as YAML text at byte");
}

static void test_error_late_in_file_leaves_struct_intact(void **state)
{
    (void)state;
    /* Everything before the last line is valid and would replace strings and lists. */
    expect_error("job: {name: new, min_workers: 9}\n"
                 "log_level: error\n"
                 "tags: [x, y, z]\n"
                 "etcd:\n"
                 "  endpoints: [http://a:1]\n"
                 "  tls: {cert: c.pem, key: k.pem}\n"
                 "  timeout: forever\n",
                 EDL_ECONFIG, "cfg.yaml:7:12: field 'etcd.timeout'");
}

static void test_aliases_are_refused(void **state)
{
    (void)state;
    expect_error("job: {name: x}\n"
                 "tags: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
                 "etcd:\n"
                 "  endpoints: [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n",
                 EDL_ECONFIG, "cfg.yaml:4:15: YAML aliases (*a) are not allowed in edl configuration");
    expect_error("job: &j {name: x}\nlog_level: *j\n", EDL_ECONFIG, "cfg.yaml:2:12: YAML aliases (*j) are not allowed");
}

static char *repeat(const char *head, char c, size_t n, const char *tail)
{
    size_t hl = strlen(head), tl = strlen(tail);
    char *s = malloc(hl + n + tl + 1);
    assert_non_null(s);
    memcpy(s, head, hl);
    memset(s + hl, c, n);
    memcpy(s + hl + n, tail, tl + 1);
    return s;
}

static void test_deep_nesting_is_refused_early(void **state)
{
    (void)state;
    char *open = repeat("job: {name: x}\netcd: ", '[', 1000, "");
    char *yaml = repeat(open, ']', 1000, "\n");
    expect_error(yaml, EDL_ECONFIG, "cfg.yaml:2:7: field 'etcd': expected a mapping of fields, got a list");
    free(open);
    free(yaml);

    /* 1000 nested mappings under a known object stop at the first unknown key */
    size_t n = 1000, len = 0;
    char *deep = malloc(n * 5 + 64);
    assert_non_null(deep);
    len += (size_t)sprintf(deep, "job: {name: x}\netcd: ");
    for (size_t i = 0; i < n; i++) len += (size_t)sprintf(deep + len, "{a: ");
    len += (size_t)sprintf(deep + len, "1");
    for (size_t i = 0; i < n; i++) deep[len++] = '}';
    deep[len] = '\0';
    expect_error(deep, EDL_ECONFIG, "cfg.yaml:2: unknown field 'etcd.a'");
    free(deep);
}

/* A schema that nests without end (a node holding a node): only the depth cap stops it. */
typedef struct node_cfg {
    int64_t v;
} node_cfg;

static const edl_cfg_field node_fields[] = {
    {"v", EDL_CFG_INT, offsetof(node_cfg, v)},
    {"child", EDL_CFG_OBJECT, 0, .fields = node_fields},
    EDL_CFG_END,
};

static void test_depth_cap_holds_for_endless_schema(void **state)
{
    (void)state;
    size_t n = 1000, len = 0;
    char *deep = malloc(n * 10 + 16);
    assert_non_null(deep);
    for (size_t i = 0; i < n; i++) len += (size_t)sprintf(deep + len, "{child: ");
    len += (size_t)sprintf(deep + len, "{v: 1");
    for (size_t i = 0; i <= n; i++) deep[len++] = '}';
    deep[len] = '\0';

    node_cfg node = {.v = 5};
    char err[256];
    assert_int_equal(edl_config_load_string(deep, len, "deep.yaml", node_fields, &node, err, sizeof err), EDL_ECONFIG);
    assert_contains(err, "deep.yaml:1:");
    assert_contains(err, "nested deeper than 32 levels");
    assert_int_equal(node.v, 5);
    free(deep);

    const char *ok = "{child: {child: {v: 3}}}";
    assert_int_equal(edl_config_load_string(ok, strlen(ok), "ok.yaml", node_fields, &node, err, sizeof err), 0);
    assert_int_equal(node.v, 3);
}

static void test_oversized_input_is_refused(void **state)
{
    (void)state;
    size_t big = 10u * 1024 * 1024;
    char *yaml = repeat("job: {name: x}\nlog_level: \"", 'x', big, "\"\n");
    app_cfg cfg, before;
    char err[256];
    make_defaults(&cfg);
    before = cfg;
    assert_int_equal(edl_config_load_string(yaml, strlen(yaml), "big.yaml", app_fields, &cfg, err, sizeof err),
                     EDL_ETOOBIG);
    assert_contains(err, "big.yaml: ");
    assert_contains(err, "limit");
    assert_untouched(&cfg, &before);

    char *path = write_temp(yaml, strlen(yaml));
    assert_int_equal(edl_config_load_file(path, app_fields, &cfg, err, sizeof err), EDL_ETOOBIG);
    assert_contains(err, path);
    assert_contains(err, "larger than the 4194304-byte limit");
    assert_untouched(&cfg, &before);
    unlink(path);
    free(path);
    free(yaml);
    edl_config_free(app_fields, &cfg);
}

static void test_large_scalar_is_quoted_briefly(void **state)
{
    (void)state;
    char *yaml = repeat("job: {name: x, seed: ", '7', 3u * 1024 * 1024, "}\n");
    app_cfg cfg, before;
    char err[512];
    make_defaults(&cfg);
    before = cfg;
    assert_int_equal(edl_config_load_string(yaml, strlen(yaml), "big.yaml", app_fields, &cfg, err, sizeof err),
                     EDL_ECONFIG);
    assert_contains(err, "field 'job.seed': \"7777777777");
    assert_contains(err, "...\" (3145728 bytes) does not fit in a 64-bit integer");
    assert_untouched(&cfg, &before);
    edl_config_free(app_fields, &cfg);
    free(yaml);
}

static void test_file_that_cannot_be_read(void **state)
{
    (void)state;
    app_cfg cfg, before;
    char err[256];
    make_defaults(&cfg);
    before = cfg;
    assert_int_equal(edl_config_load_file("/nonexistent/edl.yaml", app_fields, &cfg, err, sizeof err), EDL_EIO);
    assert_contains(err, "/nonexistent/edl.yaml: cannot open: No such file or directory");
    assert_untouched(&cfg, &before);
    assert_int_equal(edl_config_load_file("/tmp", app_fields, &cfg, err, sizeof err), EDL_EIO);
    assert_contains(err, "/tmp: cannot read: ");
    edl_config_free(app_fields, &cfg);
}

static void test_error_text_is_optional_and_bounded(void **state)
{
    (void)state;
    app_cfg cfg;
    char err[12];
    make_defaults(&cfg);
    const char *yaml = "job: {name: x, seed: abc}\n";
    assert_int_equal(edl_config_load_string(yaml, strlen(yaml), "cfg.yaml", app_fields, &cfg, NULL, 0), EDL_ECONFIG);
    assert_int_equal(edl_config_load_string(yaml, strlen(yaml), "cfg.yaml", app_fields, &cfg, err, sizeof err),
                     EDL_ECONFIG);
    assert_string_equal(err, "cfg.yaml:1:");
    assert_int_equal(edl_config_load_string(NULL, 0, NULL, NULL, &cfg, err, sizeof err), EDL_EINVAL);
    edl_config_free(app_fields, &cfg);
}

static void test_help_lists_every_field(void **state)
{
    (void)state;
    FILE *fp = tmpfile();
    assert_non_null(fp);
    edl_config_print_help(app_fields, fp);
    long n = ftell(fp);
    rewind(fp);
    char *text = calloc(1, (size_t)n + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    assert_contains(text, "job.name");
    assert_contains(text, "string, required");
    assert_contains(text, "etcd.timeout");
    assert_contains(text, "duration 100..60000ms");
    assert_contains(text, "etcd.tls.cert");
    assert_contains(text, "PEM client certificate");
    assert_contains(text, "tags");
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_file_fills_every_field),
        cmocka_unit_test(test_string_load_fills_every_field),
        cmocka_unit_test(test_absent_fields_keep_their_defaults),
        cmocka_unit_test(test_loading_twice_replaces_and_frees_old_values),
        cmocka_unit_test(test_free_releases_and_clears),
        cmocka_unit_test(test_empty_list_is_allowed),
        cmocka_unit_test(test_duration_forms),
        cmocka_unit_test(test_int_and_bool_forms),
        cmocka_unit_test(test_bad_values_name_file_line_column_and_field),
        cmocka_unit_test(test_out_of_range_names_min_and_max),
        cmocka_unit_test(test_wrong_shapes_are_type_errors),
        cmocka_unit_test(test_unknown_field_lists_known_ones),
        cmocka_unit_test(test_missing_required_fields),
        cmocka_unit_test(test_empty_document_means_defaults),
        cmocka_unit_test(test_duplicate_key_is_an_error),
        cmocka_unit_test(test_yaml_syntax_errors_give_position),
        cmocka_unit_test(test_error_late_in_file_leaves_struct_intact),
        cmocka_unit_test(test_aliases_are_refused),
        cmocka_unit_test(test_deep_nesting_is_refused_early),
        cmocka_unit_test(test_depth_cap_holds_for_endless_schema),
        cmocka_unit_test(test_oversized_input_is_refused),
        cmocka_unit_test(test_large_scalar_is_quoted_briefly),
        cmocka_unit_test(test_file_that_cannot_be_read),
        cmocka_unit_test(test_error_text_is_optional_and_bounded),
        cmocka_unit_test(test_help_lists_every_field),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

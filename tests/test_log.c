/* test_log.c: the log line formats, level filtering, name parsing and environment setup. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "edl/common.h"
#include "edl/log.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TS_RE "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z"

static int open_log(void **state)
{
    FILE *fp = tmpfile();
    assert_non_null(fp);
    unsetenv("EDL_LOG_LEVEL");
    unsetenv("EDL_LOG_FORMAT");
    edl_log_setup(EDL_LOG_INFO, EDL_LOG_PLAIN, fp);
    *state = fp;
    return 0;
}

static int close_log(void **state)
{
    edl_log_setup(EDL_LOG_INFO, EDL_LOG_PLAIN, NULL);
    fclose(*state);
    return 0;
}

/* Everything written so far; the caller frees. */
static char *read_all(FILE *fp)
{
    long n;
    fflush(fp);
    assert_int_equal(fseek(fp, 0, SEEK_END), 0);
    n = ftell(fp);
    assert_true(n >= 0);
    rewind(fp);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
    buf[n] = '\0';
    return buf;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static void assert_matches(const char *text, const char *pattern)
{
    regex_t re;
    assert_int_equal(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0);
    int rc = regexec(&re, text, 0, NULL, 0);
    regfree(&re);
    if (rc != 0) fail_msg("\"%s\" does not match /%s/", text, pattern);
}

static void test_plain_line_has_utc_millis_level_and_component(void **state)
{
    edl_log(EDL_LOG_INFO, "etcd", "connected to %s after %d tries", "127.0.0.1:2379", 3);
    EDL_ERROR("agent", "lost lease");
    char *text = read_all(*state);
    assert_matches(text, "^" TS_RE " INFO  etcd: connected to 127\\.0\\.0\\.1:2379 after 3 tries\n" TS_RE
                         " ERROR agent: lost lease\n$");
    free(text);
}

static void test_level_filters_lower_levels(void **state)
{
    edl_log_setup(EDL_LOG_WARN, EDL_LOG_PLAIN, *state);
    assert_false(edl_log_enabled(EDL_LOG_DEBUG));
    assert_false(edl_log_enabled(EDL_LOG_INFO));
    assert_true(edl_log_enabled(EDL_LOG_WARN));
    assert_true(edl_log_enabled(EDL_LOG_ERROR));
    assert_false(edl_log_enabled(EDL_LOG_OFF));
    EDL_DEBUG("t", "debug");
    EDL_INFO("t", "info");
    EDL_WARN("t", "warn");
    EDL_ERROR("t", "error");
    char *text = read_all(*state);
    assert_int_equal(count_lines(text), 2);
    assert_null(strstr(text, "t: info"));
    assert_non_null(strstr(text, "WARN  t: warn\n"));
    assert_non_null(strstr(text, "ERROR t: error\n"));
    free(text);
}

static void test_level_off_writes_nothing(void **state)
{
    edl_log_setup(EDL_LOG_OFF, EDL_LOG_JSON, *state);
    EDL_ERROR("t", "not even errors");
    edl_log(EDL_LOG_OFF, "t", "nor OFF itself");
    char *text = read_all(*state);
    assert_string_equal(text, "");
    free(text);
}

static void test_json_line_keeps_quotes_newlines_and_control_chars(void **state)
{
    const char *msg = "say \"hi\"\\ then\nnext line\ttab \x01\x1f end";
    edl_log_setup(EDL_LOG_DEBUG, EDL_LOG_JSON, *state);
    EDL_DEBUG("etcd", "%s", msg);
    EDL_INFO("job \"x\"", "second");
    char *text = read_all(*state);
    assert_int_equal(count_lines(text), 2);

    char *nl = strchr(text, '\n');
    *nl = '\0';
    cJSON *obj = cJSON_Parse(text);
    assert_non_null(obj);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(obj, "msg")), msg);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(obj, "level")), "debug");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(obj, "component")), "etcd");
    assert_matches(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(obj, "ts")), "^" TS_RE "$");
    cJSON_Delete(obj);

    obj = cJSON_Parse(nl + 1);
    assert_non_null(obj);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(obj, "component")), "job \"x\"");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(obj, "level")), "info");
    cJSON_Delete(obj);
    free(text);
}

static void test_plain_line_escapes_control_chars_to_stay_one_line(void **state)
{
    EDL_WARN("t", "a\nb\rc\x01");
    char *text = read_all(*state);
    assert_int_equal(count_lines(text), 1);
    assert_non_null(strstr(text, "WARN  t: a\\nb\\rc\\x01\n"));
    free(text);
}

static void test_long_message_is_cut_not_lost(void **state)
{
    size_t n = 200 * 1024;
    char *big = malloc(n + 1);
    assert_non_null(big);
    memset(big, 'x', n);
    big[n] = '\0';
    EDL_INFO("t", "%s", big);
    free(big);
    char *text = read_all(*state);
    assert_int_equal(count_lines(text), 1);
    assert_true(strlen(text) < 65 * 1024);
    assert_non_null(strstr(text, "xxx...\n"));
    free(text);
}

static void test_parse_accepts_known_names_and_rejects_others(void **state)
{
    (void)state;
    edl_log_level lv = EDL_LOG_ERROR;
    edl_log_format fmt = EDL_LOG_JSON;

    assert_int_equal(edl_log_level_parse("debug", &lv), 0);
    assert_int_equal(lv, EDL_LOG_DEBUG);
    assert_int_equal(edl_log_level_parse("WARN", &lv), 0);
    assert_int_equal(lv, EDL_LOG_WARN);
    assert_int_equal(edl_log_level_parse("off", &lv), 0);
    assert_int_equal(lv, EDL_LOG_OFF);
    assert_int_equal(edl_log_level_parse("verbose", &lv), EDL_ECONFIG);
    assert_int_equal(edl_log_level_parse("", &lv), EDL_ECONFIG);
    assert_int_equal(edl_log_level_parse("info ", &lv), EDL_ECONFIG);
    assert_int_equal(edl_log_level_parse(NULL, &lv), EDL_EINVAL);
    assert_int_equal(lv, EDL_LOG_OFF); /* untouched by the failures */

    assert_int_equal(edl_log_format_parse("plain", &fmt), 0);
    assert_int_equal(fmt, EDL_LOG_PLAIN);
    assert_int_equal(edl_log_format_parse("JSON", &fmt), 0);
    assert_int_equal(fmt, EDL_LOG_JSON);
    assert_int_equal(edl_log_format_parse("xml", &fmt), EDL_ECONFIG);
    assert_int_equal(edl_log_format_parse("", &fmt), EDL_ECONFIG);
    assert_int_equal(edl_log_format_parse(NULL, &fmt), EDL_EINVAL);
    assert_int_equal(fmt, EDL_LOG_JSON);
}

static void test_env_applies_level_and_format(void **state)
{
    setenv("EDL_LOG_LEVEL", "error", 1);
    setenv("EDL_LOG_FORMAT", "json", 1);
    assert_int_equal(edl_log_setup_from_env(), 0);
    assert_false(edl_log_enabled(EDL_LOG_WARN));
    EDL_ERROR("t", "now json");
    char *text = read_all(*state);
    assert_non_null(strstr(text, "\"msg\":\"now json\""));
    free(text);
}

static void test_env_bad_value_changes_nothing(void **state)
{
    edl_log_setup(EDL_LOG_WARN, EDL_LOG_PLAIN, *state);
    setenv("EDL_LOG_LEVEL", "debug", 1);
    setenv("EDL_LOG_FORMAT", "xml", 1);
    assert_int_equal(edl_log_setup_from_env(), EDL_ECONFIG);
    assert_false(edl_log_enabled(EDL_LOG_DEBUG)); /* the good level was not applied either */

    setenv("EDL_LOG_LEVEL", "loud", 1);
    setenv("EDL_LOG_FORMAT", "json", 1);
    assert_int_equal(edl_log_setup_from_env(), EDL_ECONFIG);
    assert_false(edl_log_enabled(EDL_LOG_INFO));

    EDL_WARN("t", "still plain");
    char *text = read_all(*state);
    /* Two error lines that name the bad variable, then ours, all plain. */
    assert_int_equal(count_lines(text), 3);
    assert_non_null(strstr(text, "ERROR log: EDL_LOG_FORMAT=\"xml\""));
    assert_non_null(strstr(text, "ERROR log: EDL_LOG_LEVEL=\"loud\""));
    assert_non_null(strstr(text, "WARN  t: still plain\n"));
    assert_null(strchr(text, '{'));
    free(text);
}

#define THREADS 4
#define LINES_PER_THREAD 300

static void *log_many(void *arg)
{
    char body[600];
    memset(body, 'a' + (int)(intptr_t)arg, sizeof body - 1);
    body[sizeof body - 1] = '\0';
    for (int i = 0; i < LINES_PER_THREAD; i++) EDL_INFO("t", "%s", body);
    return NULL;
}

/* A sink takes each whole line, in order, instead of the stream; NULL gives the stream back. */
static void sink_to_buf(const char *line, size_t len, void *arg)
{
    strncat(arg, line, len);
}

static void test_a_sink_takes_the_lines_instead_of_the_stream(void **state)
{
    char got[512] = "";
    edl_log_set_sink(sink_to_buf, got);
    EDL_INFO("agent", "first");
    EDL_WARN("agent", "second");
    edl_log_set_sink(NULL, NULL);
    EDL_INFO("agent", "third");
    assert_matches(got, "^" TS_RE " INFO  agent: first\n" TS_RE " WARN  agent: second\n$");
    char *text = read_all(*state);
    assert_matches(text, "^" TS_RE " INFO  agent: third\n$");
    free(text);
}

static void test_lines_from_threads_never_interleave(void **state)
{
    pthread_t th[THREADS];
    for (intptr_t i = 0; i < THREADS; i++) assert_int_equal(pthread_create(&th[i], NULL, log_many, (void *)i), 0);
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);

    char *text = read_all(*state);
    assert_int_equal(count_lines(text), THREADS * LINES_PER_THREAD);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        const char *body = strstr(line, "INFO  t: ");
        assert_non_null(body);
        body += strlen("INFO  t: ");
        assert_int_equal(strlen(body), 599);
        assert_int_equal(strspn(body, (char[]){body[0], '\0'}), 599);
    }
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_plain_line_has_utc_millis_level_and_component, open_log, close_log),
        cmocka_unit_test_setup_teardown(test_level_filters_lower_levels, open_log, close_log),
        cmocka_unit_test_setup_teardown(test_level_off_writes_nothing, open_log, close_log),
        cmocka_unit_test_setup_teardown(test_json_line_keeps_quotes_newlines_and_control_chars, open_log, close_log),
        cmocka_unit_test_setup_teardown(test_plain_line_escapes_control_chars_to_stay_one_line, open_log, close_log),
        cmocka_unit_test_setup_teardown(test_long_message_is_cut_not_lost, open_log, close_log),
        cmocka_unit_test(test_parse_accepts_known_names_and_rejects_others),
        cmocka_unit_test_setup_teardown(test_env_applies_level_and_format, open_log, close_log),
        cmocka_unit_test_setup_teardown(test_env_bad_value_changes_nothing, open_log, close_log),
        cmocka_unit_test_setup_teardown(test_lines_from_threads_never_interleave, open_log, close_log),
        cmocka_unit_test_setup_teardown(test_a_sink_takes_the_lines_instead_of_the_stream, open_log,
                                        close_log),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

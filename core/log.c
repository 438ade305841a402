/* log.c: levelled log lines to one stream, as plain text or JSON lines (see edl/log.h).
 *
 * The level, format and stream are the one piece of process-wide mutable state edl allows:
 * every library logs, and threading a logger through every call would buy nothing. Reads of
 * the level are atomic so edl_log_enabled() is cheap; a line is formatted outside the lock and
 * written with one fwrite under it, so lines from different threads never interleave. */
#include "edl/log.h"

#include "edl/common.h"
#include "edl/json.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <strings.h>
#include <time.h>

/* Longer messages are cut here and end in "...": a log line is not a data channel. */
#define LOG_MSG_MAX (64 * 1024)
#define LOG_STACK_BUF 1024

static _Atomic int log_level = EDL_LOG_INFO;
static _Atomic int log_format = EDL_LOG_PLAIN;
static FILE *log_out; /* NULL means stderr; guarded by log_lock */
static edl_log_sink_fn log_sink; /* when set, lines go there instead; guarded by log_lock */
static void *log_sink_arg;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};
/* Plain lines pad the level to five columns so the components line up. */
static const char *const level_tags[] = {"DEBUG", "INFO ", "WARN ", "ERROR", "OFF  "};

void edl_log_setup(edl_log_level level, edl_log_format format, FILE *out)
{
    if (level < EDL_LOG_DEBUG || level > EDL_LOG_OFF) level = EDL_LOG_INFO;
    if (format != EDL_LOG_JSON) format = EDL_LOG_PLAIN;
    pthread_mutex_lock(&log_lock);
    log_out = out;
    atomic_store(&log_level, (int)level);
    atomic_store(&log_format, (int)format);
    pthread_mutex_unlock(&log_lock);
}

void edl_log_set_sink(edl_log_sink_fn sink, void *arg)
{
    pthread_mutex_lock(&log_lock);
    log_sink = sink;
    log_sink_arg = arg;
    pthread_mutex_unlock(&log_lock);
}

int edl_log_level_parse(const char *s, edl_log_level *out)
{
    if (!s || !out) return EDL_EINVAL;
    for (int i = EDL_LOG_DEBUG; i <= EDL_LOG_OFF; i++) {
        if (strcasecmp(s, level_names[i]) == 0) {
            *out = (edl_log_level)i;
            return 0;
        }
    }
    if (strcasecmp(s, "warning") == 0) {
        *out = EDL_LOG_WARN;
        return 0;
    }
    return EDL_ECONFIG;
}

int edl_log_format_parse(const char *s, edl_log_format *out)
{
    if (!s || !out) return EDL_EINVAL;
    if (strcasecmp(s, "plain") == 0 || strcasecmp(s, "text") == 0) {
        *out = EDL_LOG_PLAIN;
        return 0;
    }
    if (strcasecmp(s, "json") == 0) {
        *out = EDL_LOG_JSON;
        return 0;
    }
    return EDL_ECONFIG;
}

int edl_log_setup_from_env(void)
{
    edl_log_level level = (edl_log_level)atomic_load(&log_level);
    edl_log_format format = (edl_log_format)atomic_load(&log_format);
    const char *lv = getenv("EDL_LOG_LEVEL");
    const char *fv = getenv("EDL_LOG_FORMAT");

    /* Check both before applying either, so a bad value changes nothing. */
    if (lv && *lv && edl_log_level_parse(lv, &level) != 0) {
        edl_log(EDL_LOG_ERROR, "log", "EDL_LOG_LEVEL=\"%s\" is not one of debug, info, warn, error, off", lv);
        return EDL_ECONFIG;
    }
    if (fv && *fv && edl_log_format_parse(fv, &format) != 0) {
        edl_log(EDL_LOG_ERROR, "log", "EDL_LOG_FORMAT=\"%s\" is not one of plain, json", fv);
        return EDL_ECONFIG;
    }
    atomic_store(&log_level, (int)level);
    atomic_store(&log_format, (int)format);
    return 0;
}

int edl_log_enabled(edl_log_level level)
{
    return level >= EDL_LOG_DEBUG && level < EDL_LOG_OFF && (int)level >= atomic_load(&log_level);
}

/* 2026-11-22T13:05:34.123Z: UTC with milliseconds, sortable as text. */
static void format_time(char *buf, size_t len)
{
    struct timespec ts;
    struct tm tm;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, len - n, ".%03ldZ", ts.tv_nsec / 1000000L);
}

/* Format into stack when it fits, else into a malloc'd buffer (capped at LOG_MSG_MAX).
 * Returns the message; *heap is set when the caller must free it. */
__attribute__((format(printf, 4, 0)))
static char *format_message(char *stack, size_t stacklen, char **heap, const char *fmt, va_list ap)
{
    va_list copy;
    va_copy(copy, ap);
    int n = vsnprintf(stack, stacklen, fmt, copy);
    va_end(copy);
    *heap = NULL;
    if (n < 0) return strcpy(stack, "(unformattable log message)");
    if ((size_t)n < stacklen) return stack;

    size_t want = (size_t)n < LOG_MSG_MAX ? (size_t)n + 1 : LOG_MSG_MAX;
    char *buf = malloc(want);
    if (!buf) return stack; /* already truncated to stacklen - 1 */
    vsnprintf(buf, want, fmt, ap);
    if ((size_t)n >= want) memcpy(buf + want - 4, "...", 4);
    *heap = buf;
    return buf;
}

/* Plain lines stay one line: control characters in the message are written as escapes. */
static size_t escaped_len(const char *msg)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)msg; *p; p++)
        n += (*p < 0x20 && *p != '\t') || *p == 0x7f ? 4 : 1;
    return n;
}

static char *escape_control(char *dst, const char *msg)
{
    for (const unsigned char *p = (const unsigned char *)msg; *p; p++) {
        if (*p == '\n') dst += sprintf(dst, "\\n");
        else if (*p == '\r') dst += sprintf(dst, "\\r");
        else if ((*p < 0x20 && *p != '\t') || *p == 0x7f) dst += sprintf(dst, "\\x%02x", *p);
        else *dst++ = (char)*p;
    }
    return dst;
}

static char *build_plain(const char *ts, edl_log_level level, const char *component, const char *msg)
{
    size_t len = strlen(ts) + 1 + 5 + 1 + strlen(component) + 2 + escaped_len(msg) + 2;
    char *line = malloc(len);
    if (!line) return NULL;
    char *p = line + sprintf(line, "%s %s %s: ", ts, level_tags[level], component);
    p = escape_control(p, msg);
    *p++ = '\n';
    *p = '\0';
    return line;
}

static char *build_json(const char *ts, edl_log_level level, const char *component, const char *msg)
{
    cJSON *obj = cJSON_CreateObject();
    char *line = NULL;

    if (obj && cJSON_AddStringToObject(obj, "ts", ts) && cJSON_AddStringToObject(obj, "level", level_names[level]) &&
        cJSON_AddStringToObject(obj, "component", component) && cJSON_AddStringToObject(obj, "msg", msg)) {
        char *text = edl_json_print(obj, false);
        if (text) {
            size_t n = strlen(text);
            line = malloc(n + 2);
            if (line) {
                memcpy(line, text, n);
                memcpy(line + n, "\n", 2);
            }
            cJSON_free(text);
        }
    }
    cJSON_Delete(obj);
    return line;
}

static void write_line(const char *line)
{
    pthread_mutex_lock(&log_lock);
    if (log_sink) {
        log_sink(line, strlen(line), log_sink_arg);
    } else {
        FILE *out = log_out ? log_out : stderr;
        fwrite(line, 1, strlen(line), out);
        fflush(out);
    }
    pthread_mutex_unlock(&log_lock);
}

void edl_log(edl_log_level level, const char *component, const char *fmt, ...)
{
    if (!edl_log_enabled(level) || !fmt) return;
    if (!component) component = "-";

    char stack[LOG_STACK_BUF], ts[40];
    char *heap;
    va_list ap;
    va_start(ap, fmt);
    const char *msg = format_message(stack, sizeof stack, &heap, fmt, ap);
    va_end(ap);
    format_time(ts, sizeof ts);

    char *line = atomic_load(&log_format) == EDL_LOG_JSON ? build_json(ts, level, component, msg)
                                                          : build_plain(ts, level, component, msg);
    /* Out of memory: still say something, without the message that did not fit. */
    write_line(line ? line : "edl log: out of memory formatting a log line\n");
    free(line);
    free(heap);
}

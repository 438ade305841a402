/* edl/log.h: levelled logging to stderr, as plain text or JSON lines.
 *
 * The level and format are process-wide settings chosen once in main() (flags or the
 * EDL_LOG_LEVEL / EDL_LOG_FORMAT environment variables); every library logs through here. */
#ifndef EDL_LOG_H
#define EDL_LOG_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum edl_log_level {
    EDL_LOG_DEBUG = 0,
    EDL_LOG_INFO = 1,
    EDL_LOG_WARN = 2,
    EDL_LOG_ERROR = 3,
    EDL_LOG_OFF = 4,
} edl_log_level;

typedef enum edl_log_format {
    EDL_LOG_PLAIN = 0, /* 2026-11-22T13:05:34.123Z INFO  etcd: message */
    EDL_LOG_JSON = 1,  /* {"ts":"...","level":"info","component":"etcd","msg":"..."} */
} edl_log_format;

/* Set the level, format and stream (NULL = stderr). Safe to call again at any time.
 * Defaults before any call: EDL_LOG_INFO, EDL_LOG_PLAIN, stderr. The stream is not closed
 * by edl; each line is flushed as it is written. */
void edl_log_setup(edl_log_level level, edl_log_format format, FILE *out);
/* Hand each line (with its newline) to sink instead of writing it to the stream, in order,
 * under the log's lock (sink must not log); NULL: back to the stream. For a program whose
 * stderr may block (a reader that stopped reading) and whose loop must not: the agent. */
typedef void (*edl_log_sink_fn)(const char *line, size_t len, void *arg);
void edl_log_set_sink(edl_log_sink_fn sink, void *arg);
/* Apply EDL_LOG_LEVEL (debug|info|warn|error|off) and EDL_LOG_FORMAT (plain|json) if set.
 * Returns 0, or EDL_ECONFIG for a value it does not know (then nothing changes, and one
 * error line naming the variable is logged with the settings in force). Empty = unset. */
int edl_log_setup_from_env(void);
/* Names are case-insensitive ("warning" = warn, "text" = plain). EDL_ECONFIG for an unknown
 * name, EDL_EINVAL for NULL arguments; *out is written only on success. */
int edl_log_level_parse(const char *s, edl_log_level *out);
int edl_log_format_parse(const char *s, edl_log_format *out);
/* Nonzero when a line at this level would be written (lets callers skip costly arguments). */
int edl_log_enabled(edl_log_level level);

/* One line: component names the part of edl speaking ("etcd", "agent", ...). Plain lines
 * write control characters in the message as escapes (\n, \x01) so a record stays one line;
 * JSON lines keep them, escaped by the JSON encoder. Messages over 64 KiB are cut. */
void edl_log(edl_log_level level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define EDL_DEBUG(comp, ...) edl_log(EDL_LOG_DEBUG, comp, __VA_ARGS__)
#define EDL_INFO(comp, ...) edl_log(EDL_LOG_INFO, comp, __VA_ARGS__)
#define EDL_WARN(comp, ...) edl_log(EDL_LOG_WARN, comp, __VA_ARGS__)
#define EDL_ERROR(comp, ...) edl_log(EDL_LOG_ERROR, comp, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif

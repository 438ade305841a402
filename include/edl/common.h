/* edl/common.h: error codes, byte buffers and other types shared by every edl library. */
#ifndef EDL_COMMON_H
#define EDL_COMMON_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every edl call returns 0 on success or one of these negative codes. The table is the one
 * place a code is defined: it generates the enum, edl_strerror() and edl_err_name().
 *   X(name, value, text) */
#define EDL_ERRNO_MAP(X)                                                                        \
    X(EINVAL, -1, "invalid argument")                  /* from the caller */                   \
    X(ENOMEM, -2, "out of memory")                                                             \
    X(ENOTFOUND, -3, "not found")                      /* key, lease or object */              \
    X(EUNAVAIL, -4, "no endpoint reachable")                                                   \
    X(ETIMEDOUT, -5, "timed out")                      /* the call's deadline passed */        \
    X(EPROTO, -6, "malformed reply from server")       /* or unexpected input */               \
    X(EAUTH, -7, "authentication failed or permission denied")                                 \
    X(ECOMPACTED, -8, "revision compacted")                                                    \
    X(ELEASE, -9, "lease expired or revoked")                                                  \
    X(ETOOBIG, -10, "size limit exceeded")             /* a request or reply */                \
    X(ESERVER, -11, "request refused by server")                                               \
    X(ECONFLICT, -12, "compare failed (state changed concurrently)")                           \
    X(ECONFIG, -13, "invalid configuration")                                                   \
    X(ECLOSED, -14, "closed")                          /* the object was stopped or closed */  \
    X(EIO, -15, "I/O error")                           /* files, pipes, processes */           \
    X(EPEER, -16, "a peer failed or the generation is over (re-form the group)")              \
    X(ENOTSUP, -17, "not supported by this build")     /* e.g. CUDA buffers without CUDA */ \
    X(EMOVED, -18, "not served here: the data moved (re-route on a newer map)")                \
    X(EBUSY, -19, "busy for a moment: try again")      /* e.g. a shard being handed over */

enum {
    EDL_OK = 0,
#define EDL_ERRNO_ENUM(name, value, text) EDL_##name = value,
    EDL_ERRNO_MAP(EDL_ERRNO_ENUM)
#undef EDL_ERRNO_ENUM
};

/* Text for an EDL_E* code (or 0): "timed out". Never NULL ("unknown error"). */
const char *edl_strerror(int code);
/* The code's name: "EDL_ETIMEDOUT" ("EDL_OK" for 0). Never NULL ("EDL_E?" when unknown). */
const char *edl_err_name(int code);

/* Write a message into a caller's error buffer (err NULL or errlen 0: nothing is written) and
 * return code: how the functions that take (char *err, size_t errlen) report a problem. */
int edl_errf(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Milliseconds on CLOCK_MONOTONIC: what every deadline and timeout in edl is measured on. */
int64_t edl_monotonic_ms(void);
/* Milliseconds since the epoch (CLOCK_REALTIME): for times written into documents (published
 * at, renewTime, Event timestamps), never for measuring an interval. */
int64_t edl_wall_ms(void);

/* A DNS-1123 label: 1..63 of [a-z0-9-], starting and ending with a letter or digit (pod,
 * service and instance names). */
#define EDL_DNS_LABEL_MAX 63
bool edl_dns_label_valid(const char *s);
/* A condition variable that waits on CLOCK_MONOTONIC, and a wait of at most ms on it (spurious
 * wake-ups included: callers re-check their condition). */
void edl_cond_init(pthread_cond_t *cv);
void edl_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t ms);
/* One wait on cv until the deadline (edl_monotonic_ms; -1: none, wait for a signal): false,
 * without waiting, once the deadline has passed. For loops of
 *   while (!ready && edl_cond_wait_until(cv, mu, deadline)) {} */
bool edl_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t deadline_ms);
/* The deadline timeout_ms from now (-1 for a negative timeout: none). */
int64_t edl_deadline_ms(int64_t timeout_ms);

/* A borrowed byte string: keys and values in etcd are binary-safe. */
typedef struct edl_buf {
    const char *data;
    size_t len;
} edl_buf;

static inline edl_buf edl_str(const char *s)
{
    edl_buf b = {s, s ? strlen(s) : 0};
    return b;
}

static inline edl_buf edl_bytes(const void *p, size_t n)
{
    edl_buf b = {(const char *)p, n};
    return b;
}

/* A growable byte buffer for bytes that arrive in pieces (replies, streams), kept
 * NUL-terminated after its bytes. At most max bytes (0: no bound), so hostile input cannot make
 * it grow past what its reader allows. Zero-initialised it is empty. */
typedef struct edl_bytebuf {
    char *data;
    size_t len, cap;
    size_t max;
    bool overflow; /* an append was refused for going past max */
} edl_bytebuf;

/* Append n bytes: EDL_ETOOBIG (overflow set, nothing appended) past max, EDL_ENOMEM. */
int edl_bytebuf_append(edl_bytebuf *b, const void *p, size_t n);
/* Free the bytes; the buffer is empty again (max stays). */
void edl_bytebuf_clear(edl_bytebuf *b);
/* libcurl's CURLOPT_WRITEFUNCTION into the edl_bytebuf given as CURLOPT_WRITEDATA: a short
 * count (which aborts the transfer) when the reply would go past max, so it is refused, not
 * buffered. */
size_t edl_bytebuf_curl_write(char *ptr, size_t size, size_t nmemb, void *bytebuf);
/* A stream of one message a line ('\n'; a watch's body): each whole line of the n bytes at p
 * goes to on_line (without its '\n'; empty lines skipped); the unfinished last line waits in
 * held (its bound is the longest line) until its end arrives. 0 when every line was taken;
 * EDL_ECLOSED when on_line returned false (the rest is left unread); EDL_ETOOBIG (a line
 * outgrew held) or EDL_ENOMEM: the stream cannot go on as it was. */
typedef bool (*edl_line_fn)(void *arg, const char *line, size_t len);
int edl_lines_feed(edl_bytebuf *held, const char *p, size_t n, edl_line_fn on_line, void *arg);

/* Read the whole regular file at path, at most max bytes, into *out (NUL-terminated after its
 * bytes; the caller frees it) and *len. EDL_EIO when it cannot be read or is not a regular
 * file, EDL_ETOOBIG when it holds more than max bytes (even if it grew since it was opened),
 * EDL_ENOMEM; err says which, naming the file. */
int edl_file_read(const char *path, size_t max, char **out, size_t *len, char *err,
                  size_t errlen);

#ifdef __cplusplus
}
#endif
#endif

/* distill.h: the student's client of teachers (libedldistill). It sends batches of inputs to
 * the student's teachers (edl/discovery.h says which), keeps several in flight per teacher,
 * sends a batch whose teacher failed, timed out or answered garbage to another, and delivers
 * each batch's predictions exactly once (in submission order when asked).
 *
 * Wire forms (docs/distill.md), both POST <endpoint>/v1/models/<model>:predict:
 *   json    TensorFlow Serving's REST form: {"instances":[[f,...],...]} -> {"predictions":[[...]]},
 *           so any server that speaks it is a teacher;
 *   binary  Content-Type application/x-edl-tensor: a 16-byte head (magic "EDLT", version 1,
 *           rows u32, cols u32, little-endian) and rows*cols float32; the reply the same. */
#ifndef EDL_DISTILL_H
#define EDL_DISTILL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "edl/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EDL_DISTILL_MAX_ROWS 65536
#define EDL_DISTILL_MAX_COLS 65536
#define EDL_DISTILL_MAX_BODY (256u << 20) /* bytes of one request or reply */
#define EDL_DISTILL_BACKOFF_MAX_MS 2000    /* longest back-off of a teacher after failures */

typedef enum edl_distill_format { EDL_DISTILL_JSON = 0, EDL_DISTILL_BINARY = 1 } edl_distill_format;

typedef struct edl_distill_opts {
    const char *model;        /* the path's model name (NULL: "default") */
    edl_distill_format format;
    int in_flight;            /* batches in flight per teacher (0: 4) */
    int timeout_ms;           /* one try's deadline (0: 10 s); then the batch goes elsewhere */
    bool ordered;             /* deliver in submission order */
    int max_tries;            /* tries of one batch before it fails with EDL_EPEER (0: 8); a
                                 batch that every teacher fails is so delivered within its
                                 budget, max_tries * (timeout_ms + EDL_DISTILL_BACKOFF_MAX_MS) */
    uint32_t cols;            /* the columns every reply must have (0: any): a reply of
                                 another shape is a bad reply, so the caller may read
                                 rows x cols floats of every result without looking */
    float max_abs;            /* a reply holding a value past +-max_abs is a bad reply (0: any
                                 finite value; values that are not finite are always bad) */
} edl_distill_opts;

typedef struct edl_distill edl_distill;

/* One delivered batch: its id (from submit), rows x cols predictions (malloc'd, the caller
 * frees with edl_distill_result_clear) and which teacher answered. */
typedef struct edl_distill_result {
    uint64_t id;
    int status;      /* 0, or the error that ended the batch after max_tries */
    float *out;
    uint32_t rows, cols;
    int tries;       /* tries it took: 1 when the first teacher answered */
    char teacher[128];
    char error[512]; /* with a status: "no teacher answered it well in N tries: " and each
                        teacher that failed it with what was wrong ("http://h:p: no answer
                        within 10000 ms (timeout_ms); ..."); "" with status 0 */
} edl_distill_result;

int edl_distill_open(const edl_distill_opts *o, edl_distill **out);
/* Replace the set of teachers (endpoints "http://host:port"). Batches in flight at a removed
 * teacher go to the others (their late answers, if any, are dropped). With no teacher, batches
 * wait. */
int edl_distill_set_teachers(edl_distill *d, const char *const *endpoints, size_t n);
/* Queue a batch (the inputs are copied); *id numbers batches from 0 in submission order. */
int edl_distill_submit(edl_distill *d, const float *in, uint32_t rows, uint32_t cols, uint64_t *id);
/* Make progress and deliver one answered batch within timeout_ms: 0 and *r filled,
 * EDL_ETIMEDOUT when none is ready. */
int edl_distill_next(edl_distill *d, int timeout_ms, edl_distill_result *r);
void edl_distill_result_clear(edl_distill_result *r);
/* Batches submitted and not yet delivered. */
size_t edl_distill_pending(const edl_distill *d);
/* Counters for status and the bench. */
typedef struct edl_distill_stats {
    uint64_t submitted, delivered;
    uint64_t retried;      /* tries sent again: after a failure, or a removed teacher's */
    uint64_t timeouts;     /* tries past timeout_ms */
    uint64_t conn_errors;  /* tries that could not connect or lost the connection */
    uint64_t http_errors;  /* replies with HTTP status >= 400 */
    uint64_t bad_replies;  /* replies that did not decode, were of another shape than asked
                              (rows, opts.cols) or held a value past opts.max_abs */
    uint64_t failed;       /* batches delivered with a status after max_tries */
} edl_distill_stats;
void edl_distill_get_stats(const edl_distill *d, edl_distill_stats *s);
void edl_distill_close(edl_distill *d);

/* ---- the wire forms, for teachers written with edl, tests and fuzzing ------------------ */

#define EDL_DISTILL_BINARY_TYPE "application/x-edl-tensor"
#define EDL_DISTILL_JSON_TYPE "application/json"

/* Encode rows x cols floats as a request (reply false: {"instances":...}) or a reply
 * (reply true: {"predictions":...}); the binary form is the same both ways. *body is
 * malloc'd. EDL_EINVAL for a shape out of the limits or a value that is not finite (neither
 * form carries NaN or infinity). */
int edl_distill_encode(edl_distill_format f, bool reply, const float *x, uint32_t rows,
                       uint32_t cols, char **body, size_t *len);
/* Decode strictly: the shape is checked against the limits before anything is allocated;
 * EDL_ETOOBIG past them, EDL_EPROTO (and why, in err) for anything else that is not exactly
 * the form, a value that is not finite included. *x is malloc'd (rows * cols floats). */
int edl_distill_decode(edl_distill_format f, bool reply, const char *body, size_t len,
                       float **x, uint32_t *rows, uint32_t *cols, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif

/* fuzz.h: what the fuzz targets share: an assertion that reports through libFuzzer (abort is
 * a crash it saves), logging at its most verbose into /dev/null (every log line a parser
 * writes about bad input is formatted, and checked by the sanitizers, without flooding the
 * fuzzer's output), and a NUL-terminated copy of an input. */
#ifndef EDL_FUZZ_H
#define EDL_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "edl/log.h"

#define FUZZ_CHECK(cond)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);         \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

static inline void fuzz_log_setup(void)
{
    static FILE *sink;
    if (!sink && (sink = fopen("/dev/null", "w")))
        edl_log_setup(EDL_LOG_DEBUG, EDL_LOG_PLAIN, sink);
}

/* The input with a NUL after it, for the callers that need a C string (caller frees). */
static inline char *fuzz_cstr(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        abort();
    if (size)
        memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

/* The input is one JSON value and nothing after it but white space (cJSON's strict mode):
 * what every document the strict reader (edl/json.h) takes must be. */
static inline int fuzz_one_json(const uint8_t *data, size_t size)
{
    char *s = fuzz_cstr(data, size);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(s, size + 1, &end, 1);
    cJSON_Delete(j);
    free(s);
    return j != NULL;
}

/* Two strings equal, or both NULL. */
static inline int fuzz_streq(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif

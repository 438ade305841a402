/* edl/json.h: a strict reader of JSON documents that come from outside (etcd, remote storage, a
 * pipe): every field is checked for type and range before the caller sees it.
 *
 * A reader walks one object. Each call reads one field into the caller's variable; a field
 * that is absent (or null) leaves the variable as it was, so defaults live in the variable.
 * The first problem is kept (code and one message naming the document and the field) and
 * every later call does nothing, so a parser reads all its fields and checks r.rc once (with
 * r.required set, a field that is absent is a problem too):
 *
 *     edl_json_reader r = {obj, "spec", err, errlen};
 *     edl_json_int(&r, "min", 1, 100000, &spec.min);
 *     edl_json_str(&r, "checkpoint_uri", 4096, &spec.checkpoint_uri);
 *     if (r.rc) ...                  // err: "spec: field \"min\" must be an integer"
 *
 * Codes: a wrong type is EDL_EPROTO, a number out of range or an unknown enum name
 * EDL_ECONFIG, a string over its bound EDL_ETOOBIG, a missing required field EDL_EPROTO. */
#ifndef EDL_JSON_H
#define EDL_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "edl/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EDL_JSON_MAX_EXACT (INT64_C(1) << 53) /* integers above this lose bits in a double */

typedef struct edl_json_reader {
    const cJSON *obj; /* the object being read */
    const char *doc;  /* its name in messages ("spec", "generation.members[]") */
    char *err;        /* receives the first problem (may be NULL) */
    size_t errlen;
    int rc;           /* 0, or the first problem's EDL_E* code */
    bool required;    /* every field read from now on must be present ("is required") */
} edl_json_reader;

/* Parse text (not NUL-terminated, at most max_len bytes) that must hold one JSON object and
 * nothing after it but white space. NULL with *rc and a message naming doc: EDL_ETOOBIG over
 * max_len, EDL_EPROTO for text that is not valid JSON ("not valid JSON near byte N"), not an
 * object ("not a JSON object") or followed by more ("bytes after the JSON object"),
 * EDL_EINVAL for NULL text. The caller frees the tree with cJSON_Delete. */
cJSON *edl_json_parse_object(const char *json, size_t len, size_t max_len, const char *doc,
                             char *err, size_t errlen, int *rc);

/* Record a problem with a field ("<doc>: field \"<name>\" <what>") unless one is recorded. */
void edl_json_fail(edl_json_reader *r, int rc, const char *name, const char *what);
/* The field, or NULL when it is absent or null. */
const cJSON *edl_json_field(const edl_json_reader *r, const char *name);
/* Fail with "is required" when the field is absent; true when it is there. */
bool edl_json_require(edl_json_reader *r, const char *name);

/* Each returns true when the field was present and valid (and *out was written). */
bool edl_json_i64(edl_json_reader *r, const char *name, int64_t lo, int64_t hi, int64_t *out);
bool edl_json_int(edl_json_reader *r, const char *name, int lo, int hi, int *out);
bool edl_json_bool(edl_json_reader *r, const char *name, bool *out);
/* A string of at most max_len bytes, copied; replaces (and frees) *out. */
bool edl_json_str(edl_json_reader *r, const char *name, size_t max_len, char **out);
/* A string of at most max_len bytes, borrowed from the tree (valid while it lives). */
bool edl_json_cstr(edl_json_reader *r, const char *name, size_t max_len, const char **out);
/* One of names[0..n): *out = its index. */
bool edl_json_enum(edl_json_reader *r, const char *name, const char *const *names, int n,
                   int *out);
/* A 64-bit value carried as a hexadecimal string (lease IDs: a JSON number would round it). */
bool edl_json_hex64(edl_json_reader *r, const char *name, int64_t *out);
/* An array (NULL when absent, or with a failure when the field is not an array), holding at
 * most max_items (more: EDL_ETOOBIG). */
const cJSON *edl_json_array(edl_json_reader *r, const char *name, int max_items);
/* A nested object (NULL when absent, or with a failure when it is not an object). */
const cJSON *edl_json_object(edl_json_reader *r, const char *name);

/* The document's text (malloc'ed; NULL when out of memory), every number exactly: cJSON
 * prints a number with 15 significant digits whenever those come within a relative
 * DBL_EPSILON of it, so 0.1 + 2^-56 came back as 0.1 and the integer 2^53 - 1 as 2^53 - 2.
 * Each number that would not read back to the same double is printed with 17 digits (the
 * tree is changed while it is printed and is as it was on return). pretty: indented, as
 * people read it (manifests), else on one line. */
char *edl_json_print(const cJSON *o, bool pretty);
/* edl_json_print(o, false) then cJSON_Delete. */
char *edl_json_print_consume(cJSON *o);

#ifdef __cplusplus
}
#endif
#endif

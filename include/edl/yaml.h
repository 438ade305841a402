/* edl/yaml.h: YAML documents (libyaml) read into cJSON trees, keeping where each node was, so
 * that an error found later in the tree names the file, the line and the field.
 *
 * Scalars resolve as Kubernetes' YAML does (YAML 1.2 core schema in practice): plain
 * true/false, null/~/empty, integers and floats become JSON booleans, null and numbers;
 * everything quoted, and every other plain scalar, is a string. Anchors and aliases are
 * refused (a hostile manifest could expand them without bound), as are tags other than the
 * standard ones, duplicate keys, non-scalar keys, and nesting deeper than 64. */
#ifndef EDL_YAML_H
#define EDL_YAML_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "edl/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct edl_yaml edl_yaml; /* one or more documents and their node positions */

/* Parse a file (at most 4 MiB) or a buffer (name: what messages call it). On a syntax error:
 * EDL_EPROTO and err "job.yaml:12:3: mapping values are not allowed here"; EDL_EIO when the
 * file cannot be read, EDL_ETOOBIG when it is too large. */
int edl_yaml_load_file(const char *path, edl_yaml **out, char *err, size_t errlen);
int edl_yaml_load(const char *name, const char *text, size_t len, edl_yaml **out, char *err,
                  size_t errlen);
void edl_yaml_free(edl_yaml *y);

size_t edl_yaml_count(const edl_yaml *y);               /* documents ("---" separated) */
const cJSON *edl_yaml_doc(const edl_yaml *y, size_t i); /* owned by y */
const char *edl_yaml_name(const edl_yaml *y);           /* the file name given */
/* The line (1-based) of the node at a field path of document i ("spec.template.spec.
 * containers[0].image"); the nearest ancestor that exists when the field itself is absent; 0
 * when not even the document is known. */
int edl_yaml_line(const edl_yaml *y, size_t i, const char *field);

#ifdef __cplusplus
}
#endif

#endif

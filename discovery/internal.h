/* internal.h: what the files of libedldiscovery share: the keys of a service. */
#ifndef EDL_DISCOVERY_INTERNAL_H
#define EDL_DISCOVERY_INTERNAL_H

#include "edl/discovery.h"

/* "<prefix>/services/<service>/" (prefix NULL: EDL_DEFAULT_PREFIX; trailing slashes dropped),
 * then `kind` ("teachers/", "students/" or "") and name (may be NULL): malloc'ed, NULL when out
 * of memory. Names are not checked here. */
char *disc_key(const char *prefix, const char *service, const char *kind, const char *name);

/* The instance name of a key under `dir` (a key disc_key(..., kind, NULL) gave): the part after
 * it, copied into out; false when the key is not directly below dir or the name is not valid. */
bool disc_key_name(const edl_kv *kv, const char *dir, char out[EDL_SERVICE_NAME_MAX + 1]);

/* A teacher from its key-value under dir: 0, or (logged, *out untouched) EDL_EPROTO for a bad
 * key or record, EDL_ENOMEM. */
int disc_teacher_from_kv(const edl_kv *kv, const char *dir, edl_service_instance *out);

#endif

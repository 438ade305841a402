/* teacher_service.h: the agent's two calls into libedldiscovery, behind a header of their own:
 * edl/discovery.h and edl/agent_link.h both name a type edl_assignment, so no file includes
 * both (teacher_service.c includes only the first). Internal to agent/. */
#ifndef EDL_AGENT_TEACHER_SERVICE_H
#define EDL_AGENT_TEACHER_SERVICE_H

#include <stdint.h>

#include "edl/etcd.h"

typedef struct teacher_record {
    const char *prefix, *service, *instance, *endpoint, *model, *version;
    int capacity;
    double load;
} teacher_record;

/* edl_service_register under lease / edl_service_deregister (EDL_ENOTFOUND: no key). */
int teacher_service_put(edl_etcd *c, const teacher_record *r, int64_t lease);
int teacher_service_delete(edl_etcd *c, const char *prefix, const char *service,
                           const char *instance);

#endif

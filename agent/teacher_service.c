/* teacher_service.c: a teacher's record in its service (edl/discovery.h), for teacher.c. */
#include "teacher_service.h"

#include "edl/discovery.h"

int teacher_service_put(edl_etcd *c, const teacher_record *r, int64_t lease)
{
    edl_service_instance in = {.name = (char *)r->instance, .endpoint = (char *)r->endpoint,
                               .capacity = r->capacity, .model = (char *)r->model,
                               .version = (char *)r->version, .load = r->load};
    return edl_service_register(c, r->prefix, r->service, &in, lease);
}

int teacher_service_delete(edl_etcd *c, const char *prefix, const char *service,
                           const char *instance)
{
    return edl_service_deregister(c, prefix, service, instance);
}

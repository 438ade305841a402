/* discovery.h: distillation's services in etcd (libedldiscovery). Teachers (any inference server)
 * register under a lease; students register too, watch the service, and each computes alike,
 * from what it sees, which teachers serve which student (edl_assign): no coordinator, so
 * teachers run in any job, in a Deployment or by hand (`edl service register`).
 *
 * Keys, under the etcd prefix every edl program takes (--prefix; NULL: EDL_DEFAULT_PREFIX,
 * "/edl/v1", as for jobs; trailing slashes are dropped):
 *   <prefix>/services/<service>/teachers/<instance>   a teacher's record (JSON, below)
 *   <prefix>/services/<service>/students/<student>    a student's presence ("{}"), its lease
 * Both are bound to their owner's lease, so a pod that dies vanishes within the lease's TTL;
 * a clean leave deletes the key at once. Names are DNS labels ([a-z0-9-], 1..63). */
#ifndef EDL_DISCOVERY_H
#define EDL_DISCOVERY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "edl/common.h"
#include "edl/etcd.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EDL_SERVICE_NAME_MAX EDL_DNS_LABEL_MAX /* a service, instance or student name */
#define EDL_SERVICE_RECORD_MAX 4096    /* bytes of one teacher record */
#define EDL_SERVICE_MAX_INSTANCES 4096 /* teachers (and students) of one service read at once */
#define EDL_SERVICE_DEFAULT_TTL_S 5    /* the lease of a registration made by these calls */

/* A teacher's record: the JSON value of its key,
 *   {"endpoint":"http://10.0.0.7:8500","capacity":4,"model":"mlp","version":"3","load":0.25}
 * endpoint is where predictions are asked (docs/distill.md: POST <endpoint>/v1/models/<model>:predict,
 * TensorFlow Serving's REST form, or edl's binary form); capacity the most students it serves
 * at once (>= 1); load its live load, requests in flight / capacity, kept fresh by the agent. */
typedef struct edl_service_instance {
    char *name;     /* the instance: the key's last segment */
    char *endpoint; /* "http://host:port" */
    int capacity;   /* 1..65535 */
    char *model;    /* may be "" */
    char *version;  /* may be "" */
    double load;    /* >= 0 */
    int64_t lease;  /* from etcd when listed; 0 when unknown */
} edl_service_instance;

/* True when s is a valid service, instance or student name. */
bool edl_service_name_ok(const char *s);
/* The record's JSON (malloc'd, NUL-terminated). EDL_EINVAL for an invalid record. */
int edl_service_instance_to_json(const edl_service_instance *in, char **json);
/* Parse a record (the key's value) strictly: wrong types, a missing or non-http(s) endpoint,
 * capacity out of range, a negative load or a document over EDL_SERVICE_RECORD_MAX give
 * EDL_EPROTO and a message in err (out untouched). Absent: capacity 1, model and version "",
 * load 0; unknown fields are ignored (newer writers). name is copied into out->name. */
int edl_service_instance_parse(const char *name, const char *json, size_t len,
                               edl_service_instance *out, char *err, size_t errlen);
void edl_service_instance_clear(edl_service_instance *in);

/* Put the record under lease (0: no lease, the key stays until deregistered). EDL_EINVAL for an
 * invalid name or record (nothing is written). */
int edl_service_register(edl_etcd *c, const char *prefix, const char *service,
                         const edl_service_instance *in, int64_t lease);
/* Delete a teacher's key; EDL_ENOTFOUND when there was none. */
int edl_service_deregister(edl_etcd *c, const char *prefix, const char *service,
                           const char *instance);
/* The teachers of a service, sorted by name, with the revision read. Records that do not parse
 * are skipped (and logged), never fatal: one bad writer cannot blind every student. */
int edl_service_list(edl_etcd *c, const char *prefix, const char *service,
                     edl_service_instance **out, size_t *n, int64_t *rev);
void edl_service_list_free(edl_service_instance *list, size_t n);

/* ---- the assignment ------------------------------------------------------------------------ */

/* Which teachers serve which student, computed by every student alike from the same sorted
 * names (a pure function: same input, same output, on any machine):
 *   - every student gets at least one teacher; with more teachers than students they are
 *     shared out, every teacher to one student, as evenly as possible;
 *   - every teacher serves about as many students as the others, in proportion to capacity
 *     (ceil of its share), and never more than its capacity unless the service's capacity
 *     altogether is below the number of students (then out->overcommitted is set and the
 *     excess is spread in proportion to capacity);
 *   - a teacher or a student joining or leaving moves few pairs: each student prefers teachers
 *     by rendezvous hash of (student, teacher), and a pair is kept whenever the bounds allow.
 * Pairs are sorted by student, then teacher. With no teachers (or no students) there are no
 * pairs and the call succeeds. EDL_EINVAL for NULL names or a capacity out of 1..65535,
 * EDL_ETOOBIG for more than EDL_SERVICE_MAX_INSTANCES on a side (out is then empty). The
 * algorithm and its measured movement: docs/distill.md. */
typedef struct edl_assign_pair {
    uint32_t student; /* index into students */
    uint32_t teacher; /* index into teachers */
} edl_assign_pair;

typedef struct edl_teacher_assignment {
    edl_assign_pair *pairs;
    size_t n;
    bool overcommitted;
} edl_teacher_assignment;

int edl_assign(const char *const *students, size_t n_students, const char *const *teachers,
               const int *capacity, size_t n_teachers, edl_teacher_assignment *out);
void edl_teacher_assignment_clear(edl_teacher_assignment *a);

/* ---- a student's view ---------------------------------------------------------------------- */

/* A student's discovery: registers the student under its own lease (kept alive by a keeper
 * thread), watches the service, and keeps the student's own teachers up to date. Single
 * threaded for the caller: poll edl_discovery_fd() and call edl_discovery_poll(). */
typedef struct edl_discovery edl_discovery;

typedef struct edl_discovery_opts {
    const char *prefix;  /* NULL: EDL_DEFAULT_PREFIX ("/edl/v1") */
    const char *service; /* required */
    const char *student; /* required: this student's name, unique in the service */
    int ttl_s;           /* the student's lease (0: EDL_SERVICE_DEFAULT_TTL_S) */
} edl_discovery_opts;

/* c is borrowed and must outlive d. Returns after the first listing, the student registered. */
int edl_discovery_open(edl_etcd *c, const edl_discovery_opts *o, edl_discovery **out);
/* Readable when a watch event waits; -1 while no watch runs (etcd away: keep calling poll with
 * a timeout). A lost watch is replaced, so take the fd afresh after every poll. */
int edl_discovery_fd(const edl_discovery *d);
/* Apply what the watch delivered within timeout_ms; *changed (may be NULL) tells whether the
 * student's teachers changed (names, endpoints, models, versions, capacities; not load). A lost
 * watch is re-opened from a fresh listing, a lost lease (etcd away for a whole TTL) taken again
 * with the student's key. On an error the view stays the last one seen; call again later. */
int edl_discovery_poll(edl_discovery *d, int timeout_ms, bool *changed);
/* The student's teachers (borrowed until the next poll), sorted by name. */
const edl_service_instance *edl_discovery_teachers(const edl_discovery *d, size_t *n);
/* Every teacher and student seen (for status and tests). */
size_t edl_discovery_n_teachers(const edl_discovery *d);
size_t edl_discovery_n_students(const edl_discovery *d);
/* Deletes the student's key and revokes its lease. */
void edl_discovery_close(edl_discovery *d);

#ifdef __cplusplus
}
#endif
#endif

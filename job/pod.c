/* pod.c: the two documents an agent writes under its lease (edl/job.h): the pod's registration
 * (pods/<pod>) and its trainer's status (status/<pod>). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/job.h"
#include "edl/json.h"

void edl_pod_clear(edl_pod *p)
{
    free(p->name);
    free(p->role);
    free(p->addr);
    free(p->host);
    memset(p, 0, sizeof *p);
}

int edl_pod_parse(const char *json, size_t len, edl_pod *out, char *err, size_t errlen)
{
    int rc;
    cJSON *root = edl_json_parse_object(json, len, EDL_DOC_MAX, "pod", err, errlen, &rc);
    if (!root)
        return rc;
    edl_pod p = {0};
    edl_json_reader r = {root, "pod", err, errlen, 0, true};
    edl_json_str(&r, "role", 32, &p.role);
    edl_json_str(&r, "addr", 256, &p.addr);
    r.required = false;
    edl_json_int(&r, "port", 0, 65535, &p.port);
    edl_json_int(&r, "metrics_port", 0, 65535, &p.metrics_port);
    edl_json_int(&r, "gpus", 0, 1024, &p.gpus);
    edl_json_str(&r, "host", 256, &p.host);
    edl_json_i64(&r, "pid", 0, INT32_MAX, &p.pid);
    edl_json_i64(&r, "ttl_s", 0, 86400, &p.ttl_s);
    cJSON_Delete(root);
    if (r.rc) {
        edl_pod_clear(&p);
        return r.rc;
    }
    p.name = out->name; /* the name comes from the key: keep the caller's */
    p.lease = out->lease;
    p.create_revision = out->create_revision;
    out->name = NULL;
    edl_pod_clear(out);
    *out = p;
    return 0;
}

char *edl_pod_to_json(const edl_pod *p)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "role", p->role ? p->role : "worker");
    cJSON_AddStringToObject(o, "addr", p->addr ? p->addr : "127.0.0.1");
    cJSON_AddNumberToObject(o, "port", p->port);
    cJSON_AddNumberToObject(o, "metrics_port", p->metrics_port);
    cJSON_AddNumberToObject(o, "gpus", p->gpus);
    if (p->host)
        cJSON_AddStringToObject(o, "host", p->host);
    cJSON_AddNumberToObject(o, "pid", (double)p->pid);
    if (p->ttl_s)
        cJSON_AddNumberToObject(o, "ttl_s", (double)p->ttl_s);
    return edl_json_print_consume(o);
}

/* ---- trainer status ---------------------------------------------------------------------- */

static const char *const trainer_state_names[] = {"waiting", "running", "exited",
                                                  "signaled", "stopped", "hung"};

const char *edl_trainer_state_name(edl_trainer_state s)
{
    return (unsigned)s < 6 ? trainer_state_names[s] : "unknown";
}

bool edl_trainer_failure(const edl_pod_status *s, char *buf, size_t len)
{
    if (s->state == EDL_TRAINER_EXITED && s->exit_code != 0)
        snprintf(buf, len, "exited with code %d", s->exit_code);
    else if (s->state == EDL_TRAINER_SIGNALED)
        snprintf(buf, len, "was killed by signal %d", s->signal);
    else if (s->state == EDL_TRAINER_HUNG)
        snprintf(buf, len, "hung");
    else
        return false;
    return true;
}

int edl_pod_status_parse(const char *json, size_t len, edl_pod_status *out, char *err,
                         size_t errlen)
{
    int rc;
    cJSON *root = edl_json_parse_object(json, len, EDL_DOC_MAX, "status", err, errlen, &rc);
    if (!root)
        return rc;
    edl_pod_status s = {.step = -1};
    edl_json_reader r = {root, "status", err, errlen, 0};
    edl_json_i64(&r, "generation", 0, EDL_GENERATION_MAX, &s.generation);
    int v = 0;
    r.required = true;
    if (edl_json_enum(&r, "state", trainer_state_names, 6, &v))
        s.state = (edl_trainer_state)v;
    r.required = false;
    edl_json_int(&r, "exit_code", 0, 255, &s.exit_code);
    edl_json_int(&r, "signal", 0, 128, &s.signal);
    edl_json_i64(&r, "pid", 0, INT32_MAX, &s.pid);
    edl_json_i64(&r, "step", -1, EDL_GENERATION_MAX, &s.step);
    edl_json_i64(&r, "restarts", 0, EDL_GENERATION_MAX, &s.restarts);
    edl_json_i64(&r, "total_steps", 0, EDL_GENERATION_MAX, &s.total_steps);
    const char *msg = NULL;
    if (edl_json_cstr(&r, "message", sizeof s.message - 1, &msg))
        snprintf(s.message, sizeof s.message, "%s", msg);
    edl_json_bool(&r, "own_error", &s.own_error);
    edl_json_bool(&r, "inprocess", &s.inprocess);
    cJSON_Delete(root);
    if (r.rc)
        return r.rc;
    /* an exit code or a signal means something only in its state, as the writer has it */
    if (s.state != EDL_TRAINER_EXITED)
        s.exit_code = 0;
    if (s.state != EDL_TRAINER_SIGNALED)
        s.signal = 0;
    if (s.state != EDL_TRAINER_EXITED)
        s.own_error = false;
    *out = s;
    return 0;
}

char *edl_pod_status_to_json(const edl_pod_status *s)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddNumberToObject(o, "generation", (double)s->generation);
    cJSON_AddStringToObject(o, "state", edl_trainer_state_name(s->state));
    if (s->state == EDL_TRAINER_EXITED)
        cJSON_AddNumberToObject(o, "exit_code", s->exit_code);
    if (s->state == EDL_TRAINER_SIGNALED)
        cJSON_AddNumberToObject(o, "signal", s->signal);
    if (s->pid)
        cJSON_AddNumberToObject(o, "pid", (double)s->pid);
    cJSON_AddNumberToObject(o, "step", (double)s->step);
    cJSON_AddNumberToObject(o, "restarts", (double)s->restarts);
    if (s->total_steps > 0)
        cJSON_AddNumberToObject(o, "total_steps", (double)s->total_steps);
    if (s->message[0])
        cJSON_AddStringToObject(o, "message", s->message);
    if (s->own_error && s->state == EDL_TRAINER_EXITED)
        cJSON_AddBoolToObject(o, "own_error", 1);
    if (s->inprocess)
        cJSON_AddBoolToObject(o, "inprocess", 1);
    return edl_json_print_consume(o);
}

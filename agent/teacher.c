/* teacher.c: the agent's teacher role (distillation, docs/distill.md). The supervised process
 * is an inference server: it starts at once (no generation to wait for: a teacher is no
 * member), and while it answers its health check the agent keeps its record in the service,
 *   <prefix>/services/<service>/teachers/<pod>  {endpoint, capacity, model, version, load}
 * under the agent's lease (edl/discovery.h). The record is deleted at once when the server
 * exits, when --health-failures checks in a row fail (it comes back when the server answers
 * again), on SIGTERM (before the server is stopped) and when the job ends; a killed agent's
 * record goes with its lease.
 *
 * Teachers are stateless, so the agent restarts a server that exited, after a backoff (1 s,
 * doubling to 30 s; back to 1 s after 10 s of good health): unlike a trainer, whose restarts
 * are the job server's decision, a teacher's restart decides nothing for anyone else, and
 * restarting it here keeps its pod, port and lease (students see one instance come and go). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "agent.h"
#include "edl/log.h"
#include "edl/discovery.h"

extern char **environ;

#define BACKOFF_FIRST_MS 1000
#define BACKOFF_MAX_MS 30000
#define BACKOFF_RESET_MS 10000 /* healthy this long: the next restart is quick again */

void teacher_init(agent *a)
{
    memset(&a->t, 0, sizeof a->t);
    health_init(&a->t.probe);
    a->t.backoff_ms = BACKOFF_FIRST_MS;
}

static void set_state(agent *a, edl_trainer_state st, int code, int sig)
{
    edl_pod_status s = {.state = st, .exit_code = code, .signal = sig, .step = -1,
                        .pid = st == EDL_TRAINER_RUNNING ? a->tp.pid : 0,
                        .restarts = a->starts > 0 ? a->starts - 1 : 0};
    registry_status_set(a, &s);
}

static void schedule_restart(agent *a)
{
    int64_t now = edl_monotonic_ms();
    if (a->t.healthy_since_ms && now - a->t.healthy_since_ms >= BACKOFF_RESET_MS)
        a->t.backoff_ms = BACKOFF_FIRST_MS;
    a->t.restart_at_ms = now + a->t.backoff_ms;
    EDL_INFO("agent", "teacher: restarting the server in %lld ms", (long long)a->t.backoff_ms);
    a->t.backoff_ms = a->t.backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : a->t.backoff_ms * 2;
}

static void start_server(agent *a)
{
    agent_teacher_env in = {.job = a->o->job, .pod = a->o->pod, .prefix = a->o->prefix,
                            .service = a->o->service, .addr = a->o->addr, .port = a->o->port,
                            .etcd = &a->o->etcd};
    int child_ctl, child_prog;
    char **env = NULL, err[512] = "";
    a->t.restart_at_ms = 0;
    int rc = trainer_pipes(&a->tp, &child_ctl, &child_prog, NULL);
    if (!rc && (rc = agent_env_build_teacher(&in, environ, &env)) != 0) {
        close(child_ctl);
        close(child_prog);
    } else if (!rc) {
        rc = trainer_spawn(&a->tp, a->o->argv, env, child_ctl, child_prog, -1, err, sizeof err);
    }
    edl_env_free(env);
    a->starts++;
    if (rc) {
        EDL_ERROR("agent", "teacher: the server could not be started: %s",
                  err[0] ? err : edl_strerror(rc));
        set_state(a, EDL_TRAINER_EXITED, 127, 0);
        schedule_restart(a);
        return;
    }
    EDL_INFO("agent", "teacher: server %d started on %s:%d (start %lld); registering in service "
             "%s once GET %s answers", (int)a->tp.pid, a->o->addr, a->o->port,
             (long long)a->starts, a->o->service, a->o->health_path);
    a->t.fails = 0;
    a->t.healthy = false;
    a->t.healthy_since_ms = 0;
    a->t.next_check_ms = edl_monotonic_ms();
    set_state(a, EDL_TRAINER_RUNNING, 0, 0);
}

/* ---- the service key ------------------------------------------------------------------------ */

/* A request about the record, run on the agent's etcd worker (registry_call): what it needs,
 * copied. */
typedef struct svc_req {
    char endpoint[300];
    const char *prefix, *service, *pod, *model, *version; /* the agent's options: constant */
    int capacity;
    double load;
    int64_t lease;
} svc_req;

static int put_record(edl_etcd *etcd, void *arg)
{
    svc_req *q = arg;
    edl_service_instance r = {.name = (char *)q->pod, .endpoint = q->endpoint,
                              .model = (char *)q->model, .version = (char *)q->version,
                              .capacity = q->capacity, .load = q->load};
    return edl_service_register(etcd, q->prefix, q->service, &r, q->lease);
}

static void record_put(agent *a, void *arg, int rc, const char *err)
{
    svc_req *q = arg;
    a->t.busy = false;
    if (rc) {
        a->m.etcd_errors++;
        EDL_WARN("agent", "teacher: registering in service %s: %s (%s); retrying", q->service,
                 edl_strerror(rc), err);
    } else {
        if (!a->t.registered || a->t.reg_lease != q->lease)
            EDL_INFO("agent", "teacher: registered %s in service %s (%s, lease %lld)", q->pod,
                     q->service, q->endpoint, (long long)q->lease);
        a->t.registered = true;
        a->t.reg_lease = q->lease;
        a->t.reg_load = q->load;
    }
    free(q);
}

static svc_req *request(agent *a)
{
    svc_req *q = calloc(1, sizeof *q);
    if (q)
        *q = (svc_req){.prefix = a->o->prefix, .service = a->o->service, .pod = a->o->pod,
                       .model = a->o->model, .version = a->o->model_version,
                       .capacity = a->o->capacity, .load = a->t.load, .lease = a->lease};
    return q;
}

static void do_register(agent *a)
{
    svc_req *q = request(a);
    if (!q)
        return;
    snprintf(q->endpoint, sizeof q->endpoint, "http://%s:%d", a->o->addr, a->o->port);
    if (registry_call(a, put_record, record_put, q) != 0) {
        free(q);
        return;
    }
    a->t.busy = true;
}

static int delete_record(edl_etcd *etcd, void *arg)
{
    svc_req *q = arg;
    return edl_service_deregister(etcd, q->prefix, q->service, q->pod);
}

static void record_deleted(agent *a, void *arg, int rc, const char *err)
{
    svc_req *q = arg;
    a->t.busy = false;
    if (rc && rc != EDL_ENOTFOUND) {
        a->m.etcd_errors++;
        EDL_WARN("agent", "teacher: deregistering from service %s: %s (%s); retrying",
                 q->service, edl_strerror(rc), err);
    } else {
        EDL_INFO("agent", "teacher: deregistered %s from service %s", q->pod, q->service);
        a->t.registered = false;
    }
    free(q);
}

void teacher_deregister(agent *a)
{
    if (!a->t.registered || a->t.busy)
        return;
    if (!a->keeper) { /* the key went with the lease */
        a->t.registered = false;
        return;
    }
    svc_req *q = request(a);
    if (!q || registry_call(a, delete_record, record_deleted, q) != 0) {
        free(q);
        return;
    }
    a->t.busy = true;
}

bool teacher_leave_ready(agent *a)
{
    if (a->t.busy)
        return false; /* a request on its way: its answer first */
    if (!a->t.leave_sent) {
        a->t.leave_sent = true;
        teacher_deregister(a);
    }
    return !a->t.busy;
}

/* The record should be in etcd: a server that runs, answers, and a lease to put it under. */
static bool should_register(const agent *a)
{
    return a->keeper && trainer_running(&a->tp) && !a->tp.stopping && a->t.healthy;
}

static void sync_registration(agent *a)
{
    if (a->t.busy)
        return; /* the answer to the last request first */
    if (!a->keeper)
        a->t.registered = false;
    bool want = should_register(a);
    if (want && (!a->t.registered || a->t.reg_lease != a->lease || a->t.reg_load != a->t.load))
        do_register(a);
    else if (!want && a->t.registered)
        teacher_deregister(a);
}

/* ---- health ---------------------------------------------------------------------------------- */

static void check_done(agent *a, bool ok, double load)
{
    int64_t now = edl_monotonic_ms();
    a->t.next_check_ms = now + a->o->health_interval_ms;
    if (ok) {
        if (!a->t.healthy)
            EDL_INFO("agent", "teacher: the server answers GET %s", a->o->health_path);
        if (!a->t.healthy)
            a->t.healthy_since_ms = now;
        a->t.healthy = true;
        a->t.fails = 0;
        a->t.load = load;
        return;
    }
    a->t.fails++;
    if (a->t.healthy && a->t.fails >= a->o->health_failures) {
        EDL_WARN("agent", "teacher: %d health checks in a row failed: leaving the service until "
                 "the server answers again", a->t.fails);
        a->t.healthy = false;
        a->t.healthy_since_ms = 0;
    }
}

static void check_tick(agent *a)
{
    health_probe *h = &a->t.probe;
    int64_t now = edl_monotonic_ms();
    if (health_busy(h) && now >= h->deadline_ms) {
        health_close(h);
        check_done(a, false, 0);
    }
    if (health_busy(h) || !a->t.next_check_ms || now < a->t.next_check_ms)
        return;
    if (health_start(h, a->o->addr, a->o->port, a->o->health_path,
                     a->o->health_timeout_ms) != 0)
        check_done(a, false, 0);
}

void teacher_on_poll(agent *a, int events)
{
    double load = 0;
    short revents = (short)(((events & EDL_LOOP_READ) ? POLLIN : 0) |
                            ((events & EDL_LOOP_WRITE) ? POLLOUT : 0));
    int rc = health_busy(&a->t.probe) ? health_step(&a->t.probe, revents, &load) : 0;
    if (rc)
        check_done(a, rc > 0, load);
}

int teacher_fd(const agent *a, int *events)
{
    struct pollfd p;
    health_poll_fd(&a->t.probe, &p);
    *events = ((p.events & POLLIN) ? EDL_LOOP_READ : 0) | ((p.events & POLLOUT) ? EDL_LOOP_WRITE : 0);
    return p.fd;
}

static int64_t sooner(int64_t a, int64_t b)
{
    return !a ? b : !b || a < b ? a : b;
}

int64_t teacher_due(const agent *a)
{
    int64_t c = 0;
    if (trainer_running(&a->tp))
        c = health_busy(&a->t.probe) ? health_due(&a->t.probe) : a->t.next_check_ms;
    return sooner(a->t.restart_at_ms, c);
}

/* ---- the lifecycle ---------------------------------------------------------------------------- */

void teacher_on_exit(agent *a, int wstatus, bool by_agent)
{
    health_close(&a->t.probe);
    a->t.next_check_ms = 0;
    a->t.healthy = false;
    teacher_deregister(a); /* before anything else: students stop asking it now */
    if (by_agent) {
        EDL_INFO("agent", "teacher: server stopped");
        set_state(a, EDL_TRAINER_STOPPED, 0, 0);
        return;
    }
    if (WIFEXITED(wstatus)) {
        EDL_WARN("agent", "teacher: server exited with code %d", WEXITSTATUS(wstatus));
        set_state(a, EDL_TRAINER_EXITED, WEXITSTATUS(wstatus), 0);
    } else {
        EDL_WARN("agent", "teacher: server killed by signal %d", WTERMSIG(wstatus));
        set_state(a, EDL_TRAINER_SIGNALED, 0, WTERMSIG(wstatus));
    }
    schedule_restart(a);
}

void teacher_reconcile(agent *a)
{
    if (!trainer_running(&a->tp)) {
        if (a->starts == 0 || (a->t.restart_at_ms && edl_monotonic_ms() >= a->t.restart_at_ms))
            start_server(a);
    } else if (!a->tp.stopping) {
        check_tick(a);
        if (a->status.state != EDL_TRAINER_RUNNING) /* re-registered: the status said waiting */
            set_state(a, EDL_TRAINER_RUNNING, 0, 0);
    }
    sync_registration(a);
}

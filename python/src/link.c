/* link.c: edl._edl.Link (the trainer's side of the agent protocol, edl/agent_link.h: the
 * generations the agent announces and the steps reported back), generation() (the job's
 * generation document from its etcd), and wait_listening() (a TCP probe that lets the ranks of
 * a new generation connect to rank 0's store the moment it listens, instead of after torch's
 * one-second retry). Outside edl a Link is inactive and every call works and does nothing. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "edl/agent_link.h"
#include "edl/etcd.h"
#include "edl/job.h"
#include "edl/net.h"
#include "internal.h"

typedef struct {
    PyObject_HEAD
    edl_agent_link *l;
    int calls; /* wait()s in flight, the GIL released over the link: close() refuses then */
} Link;

static PyObject *assignment_dict(const edl_assignment *a)
{
    if (a->leave) /* this pod leaves: stop at the next commit that moves to this generation */
        return Py_BuildValue("{s:L,s:O}", "generation", (long long)a->generation, "leave",
                             Py_True);
    return Py_BuildValue("{s:L,s:i,s:i,s:s,s:i}", "generation", (long long)a->generation, "rank",
                         a->rank, "world_size", a->world_size, "master_addr", a->master_addr,
                         "master_port", a->master_port);
}

static int link_init(PyObject *self, PyObject *args, PyObject *kw)
{
    Link *k = (Link *)self;
    if (!PyArg_ParseTuple(args, "") || (kw && PyDict_Size(kw) > 0)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "Link() takes no arguments");
        return -1;
    }
    if (k->l)
        return 0;
    int rc = edl_agent_link_open(&k->l);
    if (rc) {
        edl_py_raise(rc, "the agent's pipes (EDL_CONTROL_FD, EDL_PROGRESS_FD): %s",
                     edl_strerror(rc));
        return -1;
    }
    return 0;
}

static void link_dealloc(PyObject *self)
{
    Link *k = (Link *)self;
    edl_agent_link_close(k->l); /* no wait() runs: each holds a reference */
    PyTypeObject *tp = Py_TYPE(self);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

static edl_agent_link *need(PyObject *self)
{
    Link *k = (Link *)self;
    if (!k->l)
        edl_py_raise(EDL_ECLOSED, "the link is closed");
    return k->l;
}

/* poll() -> dict or None: a newer generation's assignment, when one arrived. */
static PyObject *link_poll(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    edl_agent_link *l = need(self);
    edl_assignment a;
    int rc = l ? edl_agent_link_poll(l, &a) : 0;
    if (!l)
        return NULL;
    if (rc < 0)
        return edl_py_raise(rc, "reading the agent's control pipe: %s (the agent is gone: the "
                            "job is over or this pod left it)", edl_strerror(rc));
    if (rc == 0)
        Py_RETURN_NONE;
    return assignment_dict(&a);
}

/* As poll(), waiting up to timeout_ms with the GIL released between polls. */
static PyObject *wait_for(edl_agent_link *l, long long timeout)
{
    int64_t end = timeout < 0 ? -1 : edl_monotonic_ms() + timeout;
    for (;;) {
        edl_assignment a;
        int rc = edl_agent_link_poll(l, &a);
        if (rc < 0)
            return edl_py_raise(rc, "waiting for the next generation: %s (the agent is gone: "
                                "the job is over or this pod left it)", edl_strerror(rc));
        if (rc > 0)
            return assignment_dict(&a);
        int fd = edl_agent_link_fd(l), left = -1;
        if (end >= 0 && (left = (int)(end - edl_monotonic_ms())) <= 0)
            Py_RETURN_NONE;
        if (fd < 0)
            Py_RETURN_NONE; /* standalone: no generation ever comes */
        struct pollfd pf = {fd, POLLIN, 0};
        int n;
        Py_BEGIN_ALLOW_THREADS
        n = poll(&pf, 1, left > 200 || left < 0 ? 200 : left);
        Py_END_ALLOW_THREADS
        if (n < 0 && errno != EINTR)
            return edl_py_raise(EDL_EIO, "poll: %s", strerror(errno));
        if (PyErr_CheckSignals() < 0) /* Ctrl-C while waiting */
            return NULL;
    }
}

/* wait(timeout_ms=-1) -> dict or None: as poll(), waiting up to timeout_ms (GIL released; the
 * link stays open meanwhile: close() from another thread refuses with EDL_EBUSY). */
static PyObject *link_wait(PyObject *self, PyObject *args)
{
    long long timeout = -1;
    if (!PyArg_ParseTuple(args, "|L", &timeout))
        return NULL;
    edl_agent_link *l = need(self);
    if (!l)
        return NULL;
    Link *k = (Link *)self;
    k->calls++;
    PyObject *ret = wait_for(l, timeout);
    k->calls--;
    return ret;
}

static PyObject *link_report_step(PyObject *self, PyObject *args)
{
    long long step;
    if (!PyArg_ParseTuple(args, "L", &step))
        return NULL;
    edl_agent_link *l = need(self);
    int rc = l ? edl_agent_link_report_step(l, step) : 0;
    if (!l)
        return NULL;
    if (rc && rc != EDL_EIO) /* EDL_EIO: the agent is gone; the next poll says so */
        return edl_py_raise(rc, "reporting step %lld: %s", step, edl_strerror(rc));
    Py_RETURN_NONE;
}

static PyObject *link_report_checkpoint(PyObject *self, PyObject *args)
{
    int load;
    long long ms, bytes;
    if (!PyArg_ParseTuple(args, "pLL", &load, &ms, &bytes))
        return NULL;
    edl_agent_link *l = need(self);
    if (!l)
        return NULL;
    int rc = edl_agent_link_report_checkpoint(l, load, ms, bytes);
    if (rc && rc != EDL_EIO) /* EDL_EIO: the agent is gone; the next poll says so */
        return edl_py_raise(rc, "reporting a checkpoint %s of %lld bytes in %lld ms: %s",
                            load ? "load" : "save", bytes, ms, edl_strerror(rc));
    Py_RETURN_NONE;
}

static PyObject *link_report_distill(PyObject *self, PyObject *args)
{
    long long in_flight, retried;
    if (!PyArg_ParseTuple(args, "LL", &in_flight, &retried))
        return NULL;
    edl_agent_link *l = need(self);
    if (!l)
        return NULL;
    int rc = edl_agent_link_report_distill(l, in_flight, retried);
    if (rc && rc != EDL_EIO) /* EDL_EIO: the agent is gone; the next poll says so */
        return edl_py_raise(rc, "reporting %lld batches in flight and %lld retries: %s",
                            in_flight, retried, edl_strerror(rc));
    Py_RETURN_NONE;
}

static PyObject *link_report_blocked(PyObject *self, PyObject *args)
{
    long long ms;
    const char *what;
    if (!PyArg_ParseTuple(args, "Ls", &ms, &what))
        return NULL;
    edl_agent_link *l = need(self);
    if (!l)
        return NULL;
    edl_agent_link_report_blocked(l, ms, what);
    Py_RETURN_NONE;
}

static PyObject *link_report_unblocked(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    edl_agent_link *l = need(self);
    if (!l)
        return NULL;
    edl_agent_link_report_unblocked(l);
    Py_RETURN_NONE;
}

static PyObject *link_report_ready(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    edl_agent_link *l = need(self);
    if (!l)
        return NULL;
    edl_agent_link_report_ready(l);
    Py_RETURN_NONE;
}

static PyObject *link_report_graceful(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    edl_agent_link *l = need(self);
    if (!l)
        return NULL;
    edl_agent_link_report_graceful(l);
    Py_RETURN_NONE;
}

static PyObject *link_report_inprocess(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    edl_agent_link *l = need(self);
    if (!l)
        return NULL;
    edl_agent_link_report_inprocess(l);
    Py_RETURN_NONE;
}

static PyObject *link_close(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    Link *k = (Link *)self;
    if (k->calls > 0)
        return edl_py_raise(EDL_EBUSY, "close(): wait() still runs on this link in another "
                            "thread; close it once that returns (give wait() a timeout)");
    edl_agent_link_close(k->l);
    k->l = NULL;
    Py_RETURN_NONE;
}

static PyObject *link_get(PyObject *self, void *what)
{
    edl_agent_link *l = need(self);
    if (!l)
        return NULL;
    switch ((int)(intptr_t)what) {
    case 0: return PyLong_FromLong(edl_agent_link_rank(l));
    case 1: return PyLong_FromLong(edl_agent_link_world_size(l));
    case 2: return PyLong_FromLongLong(edl_agent_link_generation(l));
    case 3: return PyLong_FromLong(edl_agent_link_fd(l));
    default: return PyBool_FromLong(edl_agent_link_fd(l) >= 0);
    }
}

static PyMethodDef LINK_METHODS[] = {
    {"poll", link_poll, METH_NOARGS,
     "poll() -> dict or None: the assignment of a newer generation (generation, rank, "
     "world_size, master_addr, master_port), or a leave (generation, leave=True), when the "
     "agent announced one; never blocks."},
    {"wait", link_wait, METH_VARARGS,
     "wait(timeout_ms=-1) -> dict or None: as poll(), waiting up to timeout_ms for it."},
    {"report_step", link_report_step, METH_VARARGS,
     "report_step(step): tell the agent a step finished (its progress and hang checks)."},
    {"report_checkpoint", link_report_checkpoint, METH_VARARGS,
     "report_checkpoint(load, ms, bytes): a checkpoint was saved (load False) or loaded in ms "
     "milliseconds, bytes in size (the agent's /metrics)."},
    {"report_distill", link_report_distill, METH_VARARGS,
     "report_distill(in_flight, retried): a distillation student's batches in flight and its "
     "retries so far (the agent's /metrics)."},
    {"report_blocked", link_report_blocked, METH_VARARGS,
     "report_blocked(ms, what): a collective has waited ms on its peers."},
    {"report_unblocked", link_report_unblocked, METH_NOARGS,
     "report_unblocked(): that collective returned."},
    {"report_ready", link_report_ready, METH_NOARGS,
     "report_ready(): started ahead of membership (generation 0), this trainer is ready for "
     "its first assignment: the agent registers the pod now."},
    {"report_graceful", link_report_graceful, METH_NOARGS,
     "report_graceful(): this trainer stops at its next commit when its pod leaves: the agent "
     "then sends a leave ({'generation': N, 'leave': True} from poll/wait) instead of SIGTERM."},
    {"report_inprocess", link_report_inprocess, METH_NOARGS,
     "report_inprocess(): this trainer re-forms in process (reads new generations and keeps "
     "running): in a job whose elastic mode is not given, the agent then keeps it running."},
    {"close", link_close, METH_NOARGS,
     "close(): close the pipes (edl.Error EDL_EBUSY while another thread's wait() runs)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef LINK_GETSET[] = {
    {"rank", link_get, NULL, "this trainer's rank in its current generation (0 standalone)",
     (void *)0},
    {"world_size", link_get, NULL, "the generation's members (1 standalone)", (void *)1},
    {"generation", link_get, NULL, "the current generation (0 standalone)", (void *)2},
    {"fd", link_get, NULL, "the control pipe's fd, for select/poll (-1 standalone)", (void *)3},
    {"active", link_get, NULL, "True under an agent", (void *)4},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot LINK_SLOTS[] = {
    {Py_tp_doc, (void *)"Link(): this trainer's link to its edl-agent (edl/agent_link.h). "
                        "Outside edl it is inactive: rank 0 of a world of 1, no generation."},
    {Py_tp_init, (void *)link_init},
    {Py_tp_dealloc, (void *)link_dealloc},
    {Py_tp_methods, LINK_METHODS},
    {Py_tp_getset, LINK_GETSET},
    {Py_tp_new, (void *)PyType_GenericNew},
    {0, NULL},
};

static PyType_Spec LINK_SPEC = {"edl._edl.Link", sizeof(Link), 0, Py_TPFLAGS_DEFAULT, LINK_SLOTS};

int edl_py_link_init(PyObject *m)
{
    PyObject *t = PyType_FromSpec(&LINK_SPEC);
    return t && PyModule_AddObject(m, "Link", t) == 0 ? 0 : -1;
}

/* ---- the generation document ------------------------------------------------------------- */

static PyObject *members_list(const edl_member *m, size_t n)
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *t = Py_BuildValue("(si)", m[i].pod, m[i].rank);
        if (!t) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SetItem(list, (Py_ssize_t)i, t);
    }
    return list;
}

static PyObject *generation_dict(const edl_generation *g)
{
    PyObject *members = members_list(g->members, g->n_members);
    PyObject *servers = members ? members_list(g->servers, g->n_servers) : NULL;
    PyObject *d = servers ? Py_BuildValue("{s:L,s:s,s:s,s:O,s:O,s:i}", "generation",
                                          (long long)g->generation, "state",
                                          edl_job_state_name(g->state), "reason",
                                          g->reason ? g->reason : "", "members", members,
                                          "servers", servers, "restarts", g->restarts)
                          : NULL;
    Py_XDECREF(members);
    Py_XDECREF(servers);
    return d;
}

/* Read and parse jobs/<job>/generation with the GIL released. */
static int read_generation(const char *job, edl_generation *g, char *err, size_t errlen)
{
    edl_etcd *c = NULL;
    edl_job_keys k;
    int rc = edl_etcd_open_env(&c, err, errlen);
    if (rc)
        return rc;
    if ((rc = edl_job_keys_init(&k, getenv("EDL_ETCD_PREFIX"), job)) != 0) {
        edl_etcd_close(c);
        snprintf(err, errlen, "job %s: %s", job, edl_strerror(rc));
        return rc;
    }
    edl_kv *kv = NULL;
    rc = edl_etcd_get(c, edl_str(k.generation), &kv, NULL);
    if (rc)
        snprintf(err, errlen, "reading %s: %s", k.generation, edl_etcd_errmsg(c));
    else
        rc = edl_generation_parse(kv->value, kv->value_len, g, err, errlen);
    edl_kv_free(kv);
    edl_job_keys_clear(&k);
    edl_etcd_close(c);
    return rc;
}

PyObject *edl_py_generation(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    const char *job = getenv("EDL_JOB_ID");
    if (!job || !getenv("EDL_ETCD_ENDPOINTS"))
        return edl_py_raise(EDL_ECONFIG, "not under edl: EDL_JOB_ID and EDL_ETCD_ENDPOINTS are "
                            "not set (the agent sets them)");
    edl_generation g = {0};
    char err[512] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = read_generation(job, &g, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc)
        return edl_py_raise(rc, "the generation of job %s: %s", job, err);
    PyObject *d = generation_dict(&g);
    edl_generation_clear(&g);
    return d;
}

/* ---- a listening port -------------------------------------------------------------------- */

static int probe(const char *host, int port, int64_t timeout_ms, char *err, size_t errlen)
{
    char ep[300];
    snprintf(ep, sizeof ep, "%s:%d", host, port);
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    if (edl_net_resolve(ep, &sa, &len) != 0) {
        snprintf(err, errlen, "%s: not a host name or address that resolves", host);
        return EDL_ECONFIG;
    }
    int64_t end = edl_monotonic_ms() + timeout_ms;
    int rc, fd = -1;
    while ((rc = edl_net_dial_addr((struct sockaddr *)&sa, len, end, &fd)) == EDL_EUNAVAIL &&
           edl_monotonic_ms() < end)
        nanosleep(&(struct timespec){0, 5 * 1000000}, NULL);
    int e = errno;
    if (rc == 0)
        close(fd);
    else
        snprintf(err, errlen, "%s:%d did not accept a connection within %lld ms (%s)", host, port,
                 (long long)timeout_ms, strerror(rc == EDL_ETIMEDOUT ? ETIMEDOUT : e));
    return rc ? EDL_ETIMEDOUT : 0;
}

PyObject *edl_py_wait_listening(PyObject *self, PyObject *args)
{
    (void)self;
    const char *host;
    int port;
    long long timeout_ms;
    if (!PyArg_ParseTuple(args, "siL", &host, &port, &timeout_ms))
        return NULL;
    if (port < 1 || port > 65535)
        return edl_py_raise(EDL_EINVAL, "port %d: not a TCP port", port);
    char err[512] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = probe(host, port, timeout_ms, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc)
        return edl_py_raise(rc, "%s", err);
    Py_RETURN_NONE;
}

/* fleet.c (python/src/): edl._edl.Fleet, Paddle Fleet's roles for Python over edl_fleet
 * (edl/ps.h): the role and the servers from the environment that Paddle's launchers and edl's
 * agent give, the mode a strategy chose, a worker's client and trainer (lent to one PsWorker,
 * ps.c), and run_server(): the same server as edl-ps, in this process, until SIGTERM or
 * SIGINT, the GIL released.
 *
 * Signals: edl_fleet_run_server waits for SIGTERM and SIGINT blocked in its own thread, as
 * edl-ps's main() does. A Python process has other threads that do not block them (threading's,
 * torch's), and while the server's thread is not inside its wait (before it starts waiting;
 * under edl, while it reads the job's map from etcd between waits) the kernel hands a
 * process's signal to one of those: SIGTERM's default action would then kill the server
 * without its graceful leave, and Python's SIGINT handler would run where nobody looks. So
 * while it serves, a handler forwards the two signals to the serving thread, where they wait
 * for the server's next wait; Python's handlers come back after.
 * A signal handler reaches its target only through a global: the serving thread (one server a
 * process), the one piece of global state of the module. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "edl/ps.h"
#include "internal.h"

typedef struct {
    PyObject_HEAD
    edl_fleet *f;
    bool lent;        /* a PsWorker holds this fleet's client and trainer */
    bool started;     /* init_worker succeeded (and stop_worker has not run) */
} Fleet;

static PyObject *fleet_type;

static struct {
    pthread_t thread;
    volatile sig_atomic_t on;
} serving;

static int fleet_init(PyObject *self, PyObject *args, PyObject *kw)
{
    Fleet *fl = (Fleet *)self;
    if (!PyArg_ParseTuple(args, "") || (kw && PyDict_Size(kw) > 0)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "Fleet() takes no arguments: its roles come from "
                                             "the environment");
        return -1;
    }
    if (fl->f)
        return 0;
    char why[1024] = "";
    int rc = edl_fleet_init(&fl->f, why, sizeof why);
    if (rc) {
        edl_py_raise(rc, "the fleet's roles from the environment: %s", why);
        return -1;
    }
    return 0;
}

static void fleet_dealloc(PyObject *self)
{
    Fleet *fl = (Fleet *)self;
    if (fl->f) {
        PyThreadState *ts = PyEval_SaveThread();
        edl_fleet_free(fl->f); /* flushes a worker still running */
        PyEval_RestoreThread(ts);
    }
    PyTypeObject *tp = Py_TYPE(self);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

edl_fleet *edl_py_fleet_get(PyObject *o)
{
    return ((Fleet *)o)->f;
}

int edl_py_fleet_lend(PyObject *o, edl_ps_client **c, edl_ps_trainer **t, edl_ps_mode *mode)
{
    if (!PyObject_TypeCheck(o, (PyTypeObject *)fleet_type)) {
        PyErr_SetString(PyExc_TypeError, "fleet: an edl._edl.Fleet");
        return -1;
    }
    Fleet *fl = (Fleet *)o;
    if (!fl->started || fl->lent) {
        edl_py_raise(fl->lent ? EDL_EBUSY : EDL_EINVAL, "%s",
                     fl->lent ? "the fleet's worker is already open (edl.fleet.worker())"
                              : "the fleet's worker has not started: init_worker() first");
        return -1;
    }
    *c = edl_fleet_client(fl->f);
    *t = edl_fleet_trainer(fl->f);
    *mode = edl_fleet_mode(fl->f);
    fl->lent = true;
    return 0;
}

void edl_py_fleet_unlend(PyObject *o)
{
    Fleet *fl = (Fleet *)o;
    fl->lent = false;
    fl->started = false; /* the PsWorker's close stopped it (edl_fleet_stop_worker) */
}

static PyObject *fleet_roles(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    edl_fleet *f = ((Fleet *)self)->f;
    if (!f)
        return edl_py_raise(EDL_ECLOSED, "the fleet is not initialised");
    int n = edl_fleet_server_num(f);
    PyObject *eps = PyList_New(n);
    for (int i = 0; eps && i < n; i++) {
        PyObject *s = PyUnicode_FromString(edl_fleet_server_endpoint(f, i));
        if (!s) {
            Py_CLEAR(eps);
            break;
        }
        PyList_SetItem(eps, i, s);
    }
    if (!eps)
        return NULL;
    PyObject *d = Py_BuildValue("{s:O,s:i,s:i,s:i,s:O,s:s,s:I}", "server",
                                edl_fleet_is_server(f) ? Py_True : Py_False, "worker_index",
                                edl_fleet_worker_index(f), "worker_num",
                                edl_fleet_worker_num(f), "server_num", n, "server_endpoints",
                                eps, "mode", edl_ps_mode_name(edl_fleet_mode(f)),
                                "generation", (unsigned int)edl_fleet_generation(f));
    Py_DECREF(eps);
    return d;
}

static PyObject *fleet_set_mode(PyObject *self, PyObject *args)
{
    edl_fleet *f = ((Fleet *)self)->f;
    const char *name;
    int geo_every = 0, threads = 0;
    edl_ps_mode m;
    if (!PyArg_ParseTuple(args, "s|ii", &name, &geo_every, &threads))
        return NULL;
    if (edl_ps_mode_parse(name, &m) != 0)
        return PyErr_Format(PyExc_ValueError, "mode '%s': sync, async, half_async or geo", name);
    if (!f)
        return edl_py_raise(EDL_ECLOSED, "the fleet is not initialised");
    if (edl_fleet_set_mode(f, m, geo_every, threads) != 0)
        return PyErr_Format(PyExc_ValueError, "mode %s, geo_every %d, threads %d: want "
                            "geo_every 1..1000000 and threads 1..1024, before init_worker()",
                            name, geo_every, threads);
    Py_RETURN_NONE;
}

static PyObject *fleet_init_worker(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    Fleet *fl = (Fleet *)self;
    if (!fl->f)
        return edl_py_raise(EDL_ECLOSED, "the fleet is not initialised");
    if (fl->started)
        return edl_py_raise(EDL_EINVAL, "init_worker(): the worker has started already");
    char why[1024] = "";
    PyThreadState *ts = PyEval_SaveThread();
    int rc = edl_fleet_init_worker(fl->f, why, sizeof why);
    PyEval_RestoreThread(ts);
    if (rc)
        return edl_py_raise(rc, "init_worker(): %s", why);
    fl->started = true;
    Py_RETURN_NONE;
}

/* ---- the server --------------------------------------------------------------------------- */

static void forward_signal(int sig)
{
    if (serving.on && !pthread_equal(pthread_self(), serving.thread))
        pthread_kill(serving.thread, sig);
}

static PyObject *fleet_run_server(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    Fleet *fl = (Fleet *)self;
    if (!fl->f)
        return edl_py_raise(EDL_ECLOSED, "the fleet is not initialised");
    if (!edl_fleet_is_server(fl->f))
        return edl_py_raise(EDL_EINVAL, "run_server(): this process is a worker "
                            "(TRAINING_ROLE=TRAINER)");
    if (serving.on)
        return edl_py_raise(EDL_EBUSY, "run_server(): a server already runs in this process");
    sigset_t sigs, old_mask;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    /* blocked here first: a signal that comes before the server waits stays pending for it */
    pthread_sigmask(SIG_BLOCK, &sigs, &old_mask);
    serving.thread = pthread_self();
    serving.on = 1;
    struct sigaction fwd = {.sa_handler = forward_signal, .sa_flags = SA_RESTART}, old_term,
                     old_int;
    sigemptyset(&fwd.sa_mask);
    sigaction(SIGTERM, &fwd, &old_term);
    sigaction(SIGINT, &fwd, &old_int);
    char why[1024] = "";
    PyThreadState *ts = PyEval_SaveThread();
    int rc = edl_fleet_run_server(fl->f, why, sizeof why);
    PyEval_RestoreThread(ts);
    serving.on = 0;
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGINT, &old_int, NULL);
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    if (rc)
        return edl_py_raise(rc, "run_server(): %s", why);
    Py_RETURN_NONE;
}

static PyMethodDef FLEET_METHODS[] = {
    {"roles", fleet_roles, METH_NOARGS,
     "roles() -> dict: server (bool), worker_index, worker_num, server_num, "
     "server_endpoints, mode, generation"},
    {"set_mode", fleet_set_mode, METH_VARARGS,
     "set_mode(mode, geo_every=0, threads=0): a strategy's mode, before init_worker()"},
    {"init_worker", fleet_init_worker, METH_NOARGS,
     "init_worker(): connect to the servers and open the trainer of the mode"},
    {"run_server", fleet_run_server, METH_NOARGS,
     "run_server(): serve until SIGTERM or SIGINT (under edl: follow the job's servers)"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot FLEET_SLOTS[] = {
    {Py_tp_doc, (void *)"Fleet(): Paddle Fleet's roles from the environment (edl_fleet)."},
    {Py_tp_init, (void *)fleet_init},
    {Py_tp_dealloc, (void *)fleet_dealloc},
    {Py_tp_methods, FLEET_METHODS},
    {Py_tp_new, (void *)PyType_GenericNew},
    {0, NULL},
};

static PyType_Spec FLEET_SPEC = {"edl._edl.Fleet", sizeof(Fleet), 0, Py_TPFLAGS_DEFAULT,
                                 FLEET_SLOTS};

int edl_py_fleet_init(PyObject *m)
{
    fleet_type = PyType_FromSpec(&FLEET_SPEC);
    if (!fleet_type)
        return -1;
    Py_INCREF(fleet_type); /* the module holds one reference, the lending check another */
    return PyModule_AddObject(m, "Fleet", fleet_type) == 0 ? 0 : -1;
}

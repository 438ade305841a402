/* distill.c (python/src/): edl._edl.Distill, a student's client of teachers for Python: an
 * edl_distill (edl/distill.h: batches in flight across the teachers, sent elsewhere on failure,
 * delivered exactly once, in order when asked, replies of another shape or with values that are
 * not finite refused as bad replies) and, when the teachers are a service's, the student's
 * edl_discovery (edl/discovery.h) on the etcd of the agent's environment, which says which
 * teachers this student has as they come and go. Inputs cross as (address, nbytes) of float32
 * memory the caller keeps alive for the call (the client copies them); predictions come back as
 * a bytearray of rows x cols float32. Every call that waits releases the GIL; the calls of
 * several threads take turns. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "edl/discovery.h"
#include "edl/distill.h"
#include "edl/etcd.h"
#include "internal.h"

typedef struct {
    PyObject_HEAD
    edl_distill *d;
    edl_etcd *etcd;       /* with disc */
    edl_discovery *disc;  /* NULL: the teachers are set by the caller */
    int calls;
    pthread_mutex_t mu;
    /* the client's counters as the last call left them, read by pending() and stats() under
     * the GIL: the client's own change under mu while a call runs (next() for seconds) */
    edl_distill_stats st;
    size_t pending;
} Distill;

static PyObject *distill_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    (void)args, (void)kw;
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    PyObject *self = alloc(tp, 0);
    if (self && pthread_mutex_init(&((Distill *)self)->mu, NULL) != 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return self;
}

static int distill_init(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"model", "binary", "in_flight", "timeout_ms", "ordered",
                             "max_tries", "cols", "max_abs", NULL};
    Distill *s = (Distill *)self;
    edl_distill_opts o = {0};
    int binary = 1, ordered = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zpiipiIf", kwlist, &o.model, &binary,
                                     &o.in_flight, &o.timeout_ms, &ordered, &o.max_tries,
                                     &o.cols, &o.max_abs))
        return -1;
    if (s->d) {
        PyErr_SetString(PyExc_RuntimeError, "Distill.__init__: already open");
        return -1;
    }
    if (o.in_flight < 0 || o.timeout_ms < 0 || o.max_tries < 0 || o.cols > EDL_DISTILL_MAX_COLS ||
        !(o.max_abs >= 0)) {
        PyErr_Format(PyExc_ValueError, "in_flight, timeout_ms and max_tries >= 0, cols 0..%d, "
                     "max_abs >= 0 (0: no bound)", EDL_DISTILL_MAX_COLS);
        return -1;
    }
    o.format = binary ? EDL_DISTILL_BINARY : EDL_DISTILL_JSON;
    o.ordered = ordered;
    int rc = edl_distill_open(&o, &s->d);
    if (rc) {
        edl_py_raise(rc, "the distillation client: %s", edl_strerror(rc));
        return -1;
    }
    return 0;
}

static void close_all(Distill *s)
{
    edl_discovery_close(s->disc); /* deletes the student's key */
    edl_etcd_close(s->etcd);
    edl_distill_close(s->d);
    s->disc = NULL, s->etcd = NULL, s->d = NULL;
}

static PyObject *distill_close(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    Distill *s = (Distill *)self;
    if (s->calls > 0)
        return edl_py_raise(EDL_EBUSY, "close(): another thread's call still runs");
    PyThreadState *ts = PyEval_SaveThread();
    close_all(s);
    PyEval_RestoreThread(ts);
    Py_RETURN_NONE;
}

static void distill_dealloc(PyObject *self)
{
    Distill *s = (Distill *)self;
    close_all(s);
    pthread_mutex_destroy(&s->mu);
    PyTypeObject *tp = Py_TYPE(self);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

/* A call's turn: the GIL released, the client taken. */
static PyThreadState *enter(Distill *s)
{
    if (!s->d) {
        edl_py_raise(EDL_ECLOSED, "the distillation client is closed");
        return NULL;
    }
    s->calls++;
    PyThreadState *ts = PyEval_SaveThread();
    pthread_mutex_lock(&s->mu);
    return ts;
}

static void leave(Distill *s, PyThreadState *ts)
{
    edl_distill_stats st;
    edl_distill_get_stats(s->d, &st);
    size_t pending = edl_distill_pending(s->d);
    pthread_mutex_unlock(&s->mu);
    PyEval_RestoreThread(ts);
    s->st = st, s->pending = pending; /* published with the GIL held */
    s->calls--;
}

/* set_teachers([endpoint, ...]) */
static PyObject *distill_set_teachers(PyObject *self, PyObject *arg)
{
    Distill *s = (Distill *)self;
    PyObject *fast = PySequence_Fast(arg, "teachers: a list of \"http://host:port\"");
    if (!fast)
        return NULL;
    Py_ssize_t n = PySequence_Size(fast);
    const char **eps = calloc(n > 0 ? (size_t)n : 1, sizeof *eps);
    for (Py_ssize_t i = 0; eps && i < n; i++)
        if (!edl_py_item_str(fast, i, &eps[i]))
            break;
    PyObject *ret = NULL;
    PyThreadState *ts;
    if (!eps)
        PyErr_NoMemory();
    else if (!PyErr_Occurred() && s->disc)
        edl_py_raise(EDL_EINVAL, "set_teachers(): this student follows a service");
    else if (!PyErr_Occurred() && (ts = enter(s)) != NULL) {
        int rc = edl_distill_set_teachers(s->d, eps, (size_t)n);
        leave(s, ts);
        if (rc)
            edl_py_raise(rc, "set_teachers(): %s", edl_strerror(rc));
        else
            Py_INCREF(ret = Py_None);
    }
    free(eps);
    Py_DECREF(fast);
    return ret;
}

/* follow(service, student, prefix=None, ttl_s=0): the teachers that edl_discovery assigns this
 * student in the service, on the etcd of the environment (EDL_ETCD_*). */
static PyObject *distill_follow(PyObject *self, PyObject *args)
{
    Distill *s = (Distill *)self;
    edl_discovery_opts o = {0};
    if (!PyArg_ParseTuple(args, "ss|zi", &o.service, &o.student, &o.prefix, &o.ttl_s))
        return NULL;
    if (!edl_service_name_ok(o.service) || !edl_service_name_ok(o.student))
        return PyErr_Format(PyExc_ValueError, "service '%s', student '%s': each a DNS label "
                            "(1-63 of [a-z0-9-])", o.service, o.student);
    char err[1024] = "";
    PyThreadState *ts = enter(s);
    if (!ts)
        return NULL;
    int rc = 0;
    if (s->disc) { /* looked at in the turn: another thread's follow() may have just set it */
        rc = EDL_EINVAL;
        snprintf(err, sizeof err, "this student follows a service already");
    } else if ((rc = edl_etcd_open_env(&s->etcd, err, sizeof err)) == 0 &&
               (rc = edl_discovery_open(s->etcd, &o, &s->disc)) != 0) {
        snprintf(err, sizeof err, "discovering service %s: %s (%s)", o.service,
                 edl_strerror(rc), edl_etcd_errmsg(s->etcd));
        edl_etcd_close(s->etcd);
        s->etcd = NULL;
    }
    leave(s, ts);
    if (rc)
        return edl_py_raise(rc, "follow(%s): %s", o.service, err);
    Py_RETURN_NONE;
}

/* [(name, endpoint)] of n teachers copied as "name\0endpoint\0" pairs into text. */
static PyObject *teacher_list(const char *text, size_t n)
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        const char *name = text, *ep = name + strlen(name) + 1;
        text = ep + strlen(ep) + 1;
        PyObject *p = Py_BuildValue("(ss)", name, ep);
        if (!p) {
            Py_CLEAR(list);
            break;
        }
        PyList_SetItem(list, (Py_ssize_t)i, p);
    }
    return list;
}

/* The teachers' names and endpoints copied (the discovery's own change at its next poll). */
static char *copy_teachers(const edl_service_instance *t, size_t n)
{
    size_t len = 1;
    for (size_t i = 0; i < n; i++)
        len += strlen(t[i].name) + strlen(t[i].endpoint) + 2;
    char *text = malloc(len), *at = text;
    for (size_t i = 0; text && i < n; i++) {
        at += strlen(strcpy(at, t[i].name)) + 1;
        at += strlen(strcpy(at, t[i].endpoint)) + 1;
    }
    return text;
}

/* poll(timeout_ms=0, first=False) -> [(name, endpoint)] when the service gave this student
 * other teachers (then the client has them; first: give them now in any case), else None. */
static PyObject *distill_poll(PyObject *self, PyObject *args)
{
    Distill *s = (Distill *)self;
    int timeout_ms = 0, first = 0;
    if (!PyArg_ParseTuple(args, "|ip", &timeout_ms, &first))
        return NULL;
    if (!s->disc)
        Py_RETURN_NONE;
    PyThreadState *ts = enter(s);
    if (!ts)
        return NULL;
    bool changed = false;
    size_t n = 0;
    char *text = NULL;
    int rc = edl_discovery_poll(s->disc, timeout_ms, &changed);
    if (rc == EDL_ETIMEDOUT)
        rc = 0; /* etcd away for a moment: the view stays the last one seen */
    changed = changed || first;
    if (rc == 0 && changed) {
        const edl_service_instance *t = edl_discovery_teachers(s->disc, &n);
        const char **eps = calloc(n ? n : 1, sizeof *eps);
        for (size_t i = 0; eps && i < n; i++)
            eps[i] = t[i].endpoint;
        rc = eps && (text = copy_teachers(t, n)) ? edl_distill_set_teachers(s->d, eps, n)
                                                 : EDL_ENOMEM;
        free(eps);
    }
    leave(s, ts);
    PyObject *ret = NULL;
    if (rc)
        edl_py_raise(rc, "following the service's teachers: %s", edl_strerror(rc));
    else if (!changed)
        Py_INCREF(ret = Py_None);
    else
        ret = teacher_list(text, n);
    free(text);
    return ret;
}

/* submit(addr, nbytes, rows, cols) -> id (the inputs are copied) */
static PyObject *distill_submit(PyObject *self, PyObject *args)
{
    Distill *s = (Distill *)self;
    unsigned long long addr, nbytes;
    unsigned int rows, cols;
    if (!PyArg_ParseTuple(args, "KKII", &addr, &nbytes, &rows, &cols))
        return NULL;
    if (rows < 1 || cols < 1 || rows > EDL_DISTILL_MAX_ROWS || cols > EDL_DISTILL_MAX_COLS ||
        nbytes != (unsigned long long)rows * cols * sizeof(float) || !addr)
        return PyErr_Format(PyExc_ValueError, "a batch of %u x %u float32 in %llu bytes: want "
                            "1..%d rows, 1..%d columns, exactly rows x cols x 4 bytes", rows,
                            cols, nbytes, EDL_DISTILL_MAX_ROWS, EDL_DISTILL_MAX_COLS);
    uint64_t id = 0;
    PyThreadState *ts = enter(s);
    if (!ts)
        return NULL;
    int rc = edl_distill_submit(s->d, (const float *)(uintptr_t)addr, rows, cols, &id);
    leave(s, ts);
    if (rc)
        return edl_py_raise(rc, "submitting a batch of %u x %u: %s", rows, cols,
                            edl_strerror(rc));
    return PyLong_FromUnsignedLongLong(id);
}

/* next(timeout_ms) -> (id, status, rows, cols, tries, teacher, predictions, error) or None
 * (error: why a batch with a status failed, naming its teachers; "" without a status). */
static PyObject *distill_next(PyObject *self, PyObject *args)
{
    Distill *s = (Distill *)self;
    int timeout_ms;
    if (!PyArg_ParseTuple(args, "i", &timeout_ms))
        return NULL;
    edl_distill_result r = {0};
    PyThreadState *ts = enter(s);
    if (!ts)
        return NULL;
    int rc = edl_distill_next(s->d, timeout_ms, &r);
    leave(s, ts);
    if (rc == EDL_ETIMEDOUT)
        Py_RETURN_NONE;
    if (rc)
        return edl_py_raise(rc, "waiting for the teachers: %s", edl_strerror(rc));
    size_t nbytes = r.status == 0 && r.out ? (size_t)r.rows * r.cols * sizeof(float) : 0;
    PyObject *out = PyByteArray_FromStringAndSize((const char *)r.out, (Py_ssize_t)nbytes);
    PyObject *ret = out ? Py_BuildValue("(KiIIisOs)", (unsigned long long)r.id, r.status,
                                        r.rows, r.cols, r.tries, r.teacher, out, r.error)
                        : NULL;
    Py_XDECREF(out);
    edl_distill_result_clear(&r);
    return ret;
}

static PyObject *distill_pending(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    Distill *s = (Distill *)self;
    if (!s->d)
        return edl_py_raise(EDL_ECLOSED, "the distillation client is closed");
    return PyLong_FromSize_t(s->pending);
}

static PyObject *distill_stats(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    Distill *s = (Distill *)self;
    if (!s->d)
        return edl_py_raise(EDL_ECLOSED, "the distillation client is closed");
    const edl_distill_stats st = s->st;
    const char *names[] = {"submitted", "delivered", "retried", "timeouts", "conn_errors",
                           "http_errors", "bad_replies", "failed"};
    uint64_t values[] = {st.submitted, st.delivered, st.retried, st.timeouts, st.conn_errors,
                         st.http_errors, st.bad_replies, st.failed};
    return edl_py_counters(names, values, sizeof values / sizeof values[0]);
}

static PyMethodDef DISTILL_METHODS[] = {
    {"set_teachers", distill_set_teachers, METH_O,
     "set_teachers([endpoint, ...]): the student's teachers, \"http://host:port\""},
    {"follow", distill_follow, METH_VARARGS,
     "follow(service, student, prefix=None, ttl_s=0): the teachers the service assigns"},
    {"poll", distill_poll, METH_VARARGS,
     "poll(timeout_ms=0, first=False) -> [(name, endpoint)] when the teachers changed"},
    {"submit", distill_submit, METH_VARARGS, "submit(addr, nbytes, rows, cols) -> id"},
    {"next", distill_next, METH_VARARGS,
     "next(timeout_ms) -> (id, status, rows, cols, tries, teacher, predictions, error) or "
     "None"},
    {"pending", distill_pending, METH_NOARGS,
     "pending() -> batches not delivered yet, as the last call returned left them (never "
     "waits for another thread's next())"},
    {"stats", distill_stats, METH_NOARGS,
     "stats() -> dict of the client's counters, as the last call returned left them"},
    {"close", distill_close, METH_NOARGS, "close(): the client, and the student's key"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot DISTILL_SLOTS[] = {
    {Py_tp_doc, (void *)"Distill(model=None, binary=True, in_flight=0, timeout_ms=0, "
                        "ordered=False, max_tries=0, cols=0, max_abs=0): edl/distill.h."},
    {Py_tp_new, (void *)distill_new},
    {Py_tp_init, (void *)distill_init},
    {Py_tp_dealloc, (void *)distill_dealloc},
    {Py_tp_methods, DISTILL_METHODS},
    {0, NULL},
};

static PyType_Spec DISTILL_SPEC = {"edl._edl.Distill", sizeof(Distill), 0, Py_TPFLAGS_DEFAULT,
                                   DISTILL_SLOTS};

int edl_py_distill_init(PyObject *m)
{
    PyObject *t = PyType_FromSpec(&DISTILL_SPEC);
    return t && PyModule_AddObject(m, "Distill", t) == 0 ? 0 : -1;
}

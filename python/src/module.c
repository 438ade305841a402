/* module.c: the extension module edl._edl: its exception, edl.Error, and its table of
 * functions. Every C failure becomes edl.Error with the EDL_E* code, its name and the message;
 * nothing is printed and ignored. */
#include <stdarg.h>
#include <stdio.h>

#include "edl/common.h"
#include "edl/log.h"
#include "internal.h"

PyObject *edl_py_error;

/* A new edl.Error with its code and name (NULL with an exception set). */
static PyObject *new_error(int code, const char *msg)
{
    PyObject *e = PyObject_CallFunction(edl_py_error, "s", msg);
    if (!e)
        return NULL;
    PyObject *c = PyLong_FromLong(code), *n = PyUnicode_FromString(edl_err_name(code));
    int rc = c && n && PyObject_SetAttrString(e, "code", c) == 0 &&
             PyObject_SetAttrString(e, "name", n) == 0 ? 0 : -1;
    Py_XDECREF(c);
    Py_XDECREF(n);
    if (rc) {
        Py_DECREF(e);
        return NULL;
    }
    return e;
}

PyObject *edl_py_raise(int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    PyObject *e = new_error(code, msg);
    if (e) {
        PyErr_SetObject(edl_py_error, e);
        Py_DECREF(e);
    }
    return NULL;
}

int edl_py_item_str(PyObject *seq, Py_ssize_t i, const char **out)
{
    PyObject *item = PySequence_GetItem(seq, i);
    int ok = item && PyArg_Parse(item, "s", out);
    Py_XDECREF(item); /* the sequence keeps it, and with it the string */
    return ok;
}

int edl_py_uint(PyObject *o, void *arg)
{
    edl_py_uint_arg *a = arg;
    if (!PyLong_Check(o) || PyBool_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s=%R: want an int", a->name, o);
        return 0;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o); /* OverflowError when < 0 or huge */
    if ((v == (unsigned long long)-1 && PyErr_Occurred()) || v > a->max) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s=%R is out of range: want 0..%llu", a->name, o,
                     a->max);
        return 0;
    }
    a->value = v;
    return 1;
}

PyObject *edl_py_counters(const char *const *names, const uint64_t *values, size_t n)
{
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(values[i]);
        if (!v || PyDict_SetItemString(d, names[i], v) != 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

/* error(code, message) -> edl.Error: for the Python side's own refusals. */
static PyObject *py_error(PyObject *self, PyObject *args)
{
    (void)self;
    int code;
    const char *msg;
    if (!PyArg_ParseTuple(args, "is", &code, &msg))
        return NULL;
    return new_error(code, msg);
}

static PyObject *py_strerror(PyObject *self, PyObject *args)
{
    (void)self;
    int code;
    if (!PyArg_ParseTuple(args, "i", &code))
        return NULL;
    return Py_BuildValue("(ss)", edl_err_name(code), edl_strerror(code));
}

static PyMethodDef METHODS[] = {
    {"error", py_error, METH_VARARGS,
     "error(code, message) -> edl.Error with that EDL_E* code and its name."},
    {"strerror", py_strerror, METH_VARARGS,
     "strerror(code) -> (name, text) of an EDL_E* code."},
    {"wait_listening", edl_py_wait_listening, METH_VARARGS,
     "wait_listening(host, port, timeout_ms): return once a TCP connection to host:port is "
     "accepted (a server listens there), probing every few milliseconds; edl.Error "
     "EDL_ETIMEDOUT after timeout_ms."},
    {"generation", edl_py_generation, METH_NOARGS,
     "generation() -> dict: the job's published generation, read from its etcd (the "
     "agent's environment): generation, state, members [(pod, rank)], servers, restarts. "
     "edl.Error outside edl."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "edl._edl",
    "The C side of the edl package: bindings of edl's C libraries (see python/edl/).", -1,
    METHODS, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__edl(void)
{
    PyObject *m = PyModule_Create(&MODULE);
    if (!m)
        return NULL;
    edl_log_setup_from_env(); /* EDL_LOG_LEVEL, as every edl program */
    edl_py_error = PyErr_NewExceptionWithDoc(
        "edl.Error",
        "An error of edl's C libraries: .code (the EDL_E* number), .name (\"EDL_ENOTFOUND\") "
        "and the message (str(e)), which says what failed.",
        NULL, NULL);
    if (!edl_py_error || PyModule_AddObject(m, "Error", edl_py_error) != 0 ||
        edl_py_link_init(m) != 0 || edl_py_ckpt_init(m) != 0 || edl_py_ps_init(m) != 0 ||
        edl_py_fleet_init(m) != 0 || edl_py_distill_init(m) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(edl_py_error); /* the module holds one reference, the C side another */
#define EDL_PY_CONSTANT(name, value, text) \
    if (PyModule_AddIntConstant(m, "EDL_" #name, value) != 0) { \
        Py_DECREF(m); \
        return NULL; \
    }
    EDL_ERRNO_MAP(EDL_PY_CONSTANT) /* edl._edl.EDL_ENOTFOUND, ...: the one table's codes */
#undef EDL_PY_CONSTANT
    return m;
}

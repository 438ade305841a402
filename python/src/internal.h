/* internal.h (python/src/): what the files of edl's extension module (_edl) share. The module
 * is written to CPython's limited API of Python 3.9 (one abi3 build serves every later version)
 * and only binds the C libraries: edl/agent_link.h (the trainer's side of the agent protocol),
 * edl/job.h and edl/etcd.h (the job's generation), edl/checkpoint.h (checkpoints of tensors). */
#ifndef EDL_PYTHON_INTERNAL_H
#define EDL_PYTHON_INTERNAL_H

#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x03090000
#include <Python.h>

/* edl.Error (set up by the module). */
extern PyObject *edl_py_error;

/* Raise edl.Error(code, name, message) for an EDL_E* code; returns NULL for `return`. The
 * message says what failed (the caller's words, then the C library's). */
PyObject *edl_py_raise(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Register each part's types and functions in the module: 0, or -1 with an exception set. */
int edl_py_link_init(PyObject *m);
int edl_py_ckpt_init(PyObject *m);

/* The module's plain functions of each part, for its method table. */
PyObject *edl_py_wait_listening(PyObject *self, PyObject *args);
PyObject *edl_py_generation(PyObject *self, PyObject *args);

#endif

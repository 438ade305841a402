/* internal.h (python/src/): what the files of edl's extension module (_edl) share. The module
 * is written to CPython's limited API of Python 3.9 (one abi3 build serves every later version)
 * and only binds the C libraries: edl/agent_link.h (the trainer's side of the agent protocol),
 * edl/job.h and edl/etcd.h (the job's generation), edl/checkpoint.h (checkpoints of tensors),
 * edl/ps.h (the parameter server's client, trainer and Fleet roles) and edl/distill.h with
 * edl/discovery.h (a distillation student's teachers). */
#ifndef EDL_PYTHON_INTERNAL_H
#define EDL_PYTHON_INTERNAL_H

#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x03090000
#include <Python.h>

#include "edl/ps.h"

/* edl.Error (set up by the module). */
extern PyObject *edl_py_error;

/* Raise edl.Error(code, name, message) for an EDL_E* code; returns NULL for `return`. The
 * message says what failed (the caller's words, then the C library's). */
PyObject *edl_py_raise(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Item i of a sequence as a C string that lives as long as the sequence holds the item: 1, or
 * 0 with an exception set. */
int edl_py_item_str(PyObject *seq, Py_ssize_t i, const char **out);

/* An unsigned integer argument checked against its C type's range: "O&" with edl_py_uint and
 * an edl_py_uint_arg (its name and maximum): the value lands in .value; a negative, too
 * large or non-int one raises, naming the argument and the value as given ("dim=2**40" is
 * not silently dim 0). 1, or 0 with an exception set (a converter's contract). */
typedef struct edl_py_uint_arg {
    const char *name;
    unsigned long long max;
    unsigned long long value;
} edl_py_uint_arg;
int edl_py_uint(PyObject *o, void *arg);
#define EDL_PY_U32(n) ((edl_py_uint_arg){.name = (n), .max = UINT32_MAX})
#define EDL_PY_U64(n) ((edl_py_uint_arg){.name = (n), .max = UINT64_MAX})

/* A dict of n named counters (NULL with an exception set). */
PyObject *edl_py_counters(const char *const *names, const uint64_t *values, size_t n);

/* Register each part's types and functions in the module: 0, or -1 with an exception set. */
int edl_py_link_init(PyObject *m);
int edl_py_ckpt_init(PyObject *m);
int edl_py_ps_init(PyObject *m);
int edl_py_fleet_init(PyObject *m);
int edl_py_distill_init(PyObject *m);

/* fleet.c, for ps.c: a Fleet's edl_fleet; lend its started worker's client and trainer to one
 * PsWorker (0, or -1 with an exception: not a Fleet, not started, lent already), and take them
 * back once that worker stopped it (edl_fleet_stop_worker). */
edl_fleet *edl_py_fleet_get(PyObject *fleet);
int edl_py_fleet_lend(PyObject *fleet, edl_ps_client **c, edl_ps_trainer **t,
                      edl_ps_mode *mode);
void edl_py_fleet_unlend(PyObject *fleet);

/* The module's plain functions of each part, for its method table. */
PyObject *edl_py_wait_listening(PyObject *self, PyObject *args);
PyObject *edl_py_generation(PyObject *self, PyObject *args);

#endif

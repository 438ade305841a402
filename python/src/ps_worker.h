/* ps_worker.h (python/src/): what ps.c (edl._edl.PsWorker: the type, its tables and its turns)
 * and ps_calls.c (its calls) share. A worker is an edl_ps_client and, in a mode, the
 * edl_ps_trainer over it; a client is one thread's, so the calls take turns on the worker's
 * lock, except the trainer's own calls in async and half_async, which share it. */
#ifndef EDL_PYTHON_PS_WORKER_H
#define EDL_PYTHON_PS_WORKER_H

#include <pthread.h>
#include <stdbool.h>

#include "internal.h"

typedef struct {
    PyObject_HEAD
    edl_ps_client *c;
    edl_ps_trainer *t;       /* NULL: the client's own calls, no mode */
    PyObject *fleet;         /* the Fleet that c and t belong to (NULL: this worker's own) */
    edl_ps_mode mode;        /* with t */
    int calls;               /* calls in flight (the GIL released); close refuses while any */
    pthread_rwlock_t turns;  /* shared: the trainer's async calls; exclusive: the rest */
    edl_ps_table_config cfg[EDL_PS_MAX_TABLES];
    bool made[EDL_PS_MAX_TABLES]; /* tables created (or checked) through this worker */
} PsWorker;

/* A call in flight: entered with the GIL, which it releases; the lock is taken without it. */
typedef struct turn {
    PsWorker *w;
    PyThreadState *ts;
} turn;

/* Enter a call (0; -1 with edl.Error EDL_ECLOSED for a closed worker): the GIL released, the
 * lock taken shared or alone. Leave it: the lock given back, the GIL taken again. */
int edl_py_psw_enter(PsWorker *w, bool shared, turn *tn);
void edl_py_psw_leave(turn *tn);
/* The trainer's calls share the worker in async and half_async. */
bool edl_py_psw_shares(const PsWorker *w);
/* The last failure's message (the trainer's or the client's), copied inside the turn. */
void edl_py_psw_why(const PsWorker *w, bool trainer, char *why, size_t whylen);
/* A table created through this worker, of that kind (NULL with a ValueError otherwise). */
edl_ps_table_config *edl_py_psw_table(PsWorker *w, unsigned int table, edl_ps_table_kind kind);

/* ps_calls.c: the methods. */
PyObject *edl_py_psw_pull_sparse(PyObject *self, PyObject *args);
PyObject *edl_py_psw_push_sparse(PyObject *self, PyObject *args);
PyObject *edl_py_psw_prefetch_sparse(PyObject *self, PyObject *args);
PyObject *edl_py_psw_pull_dense(PyObject *self, PyObject *args);
PyObject *edl_py_psw_push_dense(PyObject *self, PyObject *args);
PyObject *edl_py_psw_step(PyObject *self, PyObject *noargs);
PyObject *edl_py_psw_flush(PyObject *self, PyObject *noargs);
PyObject *edl_py_psw_barrier(PyObject *self, PyObject *noargs);
PyObject *edl_py_psw_save(PyObject *self, PyObject *args);
PyObject *edl_py_psw_set_trainers(PyObject *self, PyObject *args);
PyObject *edl_py_psw_shrink(PyObject *self, PyObject *args);
PyObject *edl_py_psw_stats(PyObject *self, PyObject *noargs);
PyObject *edl_py_psw_time_sparse(PyObject *self, PyObject *args);

#endif

/* ps.c (python/src/): edl._edl.PsWorker, the parameter server's client for Python (edl/ps.h):
 * an edl_ps_client and, in one of the four modes, the edl_ps_trainer over it, opened from
 * endpoints (edl.ps.Worker) or borrowed from an edl_fleet (fleet.c, edl.fleet.init_worker).
 * This file is the type: opening and closing, the tables created through it, the turns its
 * calls take; the calls are ps_calls.c's. Keys, rows and gradients cross as (address, nbytes)
 * of memory the caller keeps alive for the call (a numpy array's or a tensor's: no copy). Every
 * call releases the GIL. A client is used by one thread at a time: the calls take turns on a
 * lock, except the trainer's own calls in async and half_async, which edl_ps_trainer makes
 * thread-safe (they share it). */
#include <stdlib.h>
#include <string.h>

#include "ps_worker.h"

/* ---- opening ------------------------------------------------------------------------------ */

static int open_client(PsWorker *w, PyObject *endpoints, const char *job, const char *secret_file,
                       int timeout_ms, int lanes)
{
    PyObject *fast = PySequence_Fast(endpoints, "endpoints: a list of \"host:port\"");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Size(fast);
    const char **eps = n > 0 ? calloc((size_t)n, sizeof *eps) : NULL;
    for (Py_ssize_t i = 0; eps && i < n; i++)
        if (!edl_py_item_str(fast, i, &eps[i]))
            break;
    int rc = -1;
    if (n <= 0)
        PyErr_SetString(PyExc_ValueError, "endpoints: name at least one server (\"host:port\")");
    else if (!eps)
        PyErr_NoMemory();
    else if (!PyErr_Occurred()) {
        edl_job_secret secret;
        edl_job_secret_init(&secret);
        char why[1024] = "";
        int e = secret_file ? edl_job_secret_load_file(&secret, secret_file, why, sizeof why)
                            : edl_job_secret_load(&secret, why, sizeof why);
        if (e == EDL_ENOTFOUND)
            snprintf(why, sizeof why, "no job secret: give secret_file= or set "
                     "EDL_JOB_SECRET_FILE (the parameter server's links are authenticated)");
        edl_ps_client_options o = {.endpoints = eps, .n_servers = (int)n, .job = job,
                                   .secret = &secret, .timeout_ms = timeout_ms, .lanes = lanes};
        PyThreadState *ts = PyEval_SaveThread();
        if (e == 0)
            e = edl_ps_client_open(&o, &w->c, why, sizeof why);
        PyEval_RestoreThread(ts);
        edl_job_secret_clear(&secret);
        rc = e ? -1 : 0;
        if (e)
            edl_py_raise(e, "the parameter servers %s: %s", eps[0], why);
    }
    free(eps);
    Py_DECREF(fast);
    return rc;
}

static int open_trainer(PsWorker *w, const char *mode, edl_ps_trainer_options *o)
{
    if (edl_ps_mode_parse(mode, &o->mode) != 0) {
        PyErr_Format(PyExc_ValueError, "mode '%s': sync, async, half_async or geo", mode);
        return -1;
    }
    char why[1024] = "";
    PyThreadState *ts = PyEval_SaveThread();
    int rc = edl_ps_trainer_open(w->c, o, &w->t, why, sizeof why);
    PyEval_RestoreThread(ts);
    if (rc) {
        edl_py_raise(rc, "the %s trainer: %s", mode, why);
        return -1;
    }
    w->mode = o->mode;
    return 0;
}

static int worker_init(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"endpoints", "fleet", "job", "secret_file", "timeout_ms", "lanes",
                             "mode", "trainer_id", "trainers", "threads", "geo_every",
                             "generation", NULL};
    PsWorker *w = (PsWorker *)self;
    PyObject *endpoints = Py_None, *fleet = Py_None;
    const char *job = "edl", *secret_file = NULL, *mode = NULL;
    int timeout_ms = 0, lanes = 0;
    edl_py_uint_arg generation = EDL_PY_U32("generation");
    edl_ps_trainer_options o = {.trainers = 1, .threads = 1, .geo_every = 10};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOszii$ziiiiO&", kwlist, &endpoints, &fleet,
                                     &job, &secret_file, &timeout_ms, &lanes, &mode,
                                     &o.trainer_id, &o.trainers, &o.threads, &o.geo_every,
                                     edl_py_uint, &generation))
        return -1;
    if (w->c || w->fleet) {
        PyErr_SetString(PyExc_RuntimeError, "PsWorker.__init__: already open");
        return -1;
    }
    o.generation = (uint32_t)generation.value;
    if (fleet != Py_None) { /* the fleet's client and trainer (edl.fleet.init_worker) */
        if (edl_py_fleet_lend(fleet, &w->c, &w->t, &w->mode) != 0)
            return -1;
        Py_INCREF(fleet);
        w->fleet = fleet;
        return 0;
    }
    if (endpoints == Py_None) {
        PyErr_SetString(PyExc_TypeError, "PsWorker(endpoints=[...]) or PsWorker(fleet=...)");
        return -1;
    }
    if (open_client(w, endpoints, job, secret_file, timeout_ms, lanes) != 0)
        return -1;
    if (mode && open_trainer(w, mode, &o) != 0) {
        edl_ps_client_close(w->c);
        w->c = NULL;
        return -1;
    }
    return 0;
}

/* Flush and close what this worker holds (the GIL released): the fleet's worker through the
 * fleet, else the trainer, then the client. */
static int close_parts(edl_ps_client *c, edl_ps_trainer *t, PyObject *fleet, char *why,
                       size_t whylen)
{
    int rc = 0;
    if (fleet) {
        edl_fleet *f = edl_py_fleet_get(fleet);
        rc = edl_fleet_stop_worker(f);
        if (rc)
            snprintf(why, whylen, "stopping the worker: flushing its pushes");
        return rc;
    }
    if (t && (rc = edl_ps_trainer_close(t)) != 0)
        snprintf(why, whylen, "flushing the trainer's pushes: %s", edl_strerror(rc));
    edl_ps_client_close(c);
    return rc;
}

static PyObject *worker_close(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    PsWorker *w = (PsWorker *)self;
    if (w->calls > 0)
        return edl_py_raise(EDL_EBUSY, "close(): %d call(s) of another thread still run on this "
                            "worker; close it once they return", w->calls);
    edl_ps_client *c = w->c;
    edl_ps_trainer *t = w->t;
    PyObject *fleet = w->fleet;
    w->c = NULL, w->t = NULL, w->fleet = NULL; /* closed for every caller from here */
    if (!c && !fleet)
        Py_RETURN_NONE;
    char why[512] = "";
    PyThreadState *ts = PyEval_SaveThread();
    int rc = close_parts(c, t, fleet, why, sizeof why);
    PyEval_RestoreThread(ts);
    if (fleet) {
        edl_py_fleet_unlend(fleet);
        Py_DECREF(fleet);
    }
    if (rc)
        return edl_py_raise(rc, "closing the parameter-server worker: %s", why);
    Py_RETURN_NONE;
}

static void worker_dealloc(PyObject *self)
{
    PsWorker *w = (PsWorker *)self;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb); /* an exception on its way must survive the close */
    PyObject *r = worker_close(self, NULL); /* no call runs: each holds a reference */
    if (!r)
        PyErr_Clear(); /* nowhere to report it: close() explicitly to see it */
    Py_XDECREF(r);
    PyErr_Restore(type, value, tb);
    pthread_rwlock_destroy(&w->turns);
    PyTypeObject *tp = Py_TYPE(self);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

static PyObject *worker_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    (void)args, (void)kw;
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    PyObject *self = alloc(tp, 0);
    if (self && pthread_rwlock_init(&((PsWorker *)self)->turns, NULL) != 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return self;
}

/* ---- taking turns ------------------------------------------------------------------------- */

int edl_py_psw_enter(PsWorker *w, bool shared, turn *tn)
{
    if (!w->c && !w->fleet) {
        edl_py_raise(EDL_ECLOSED, "the parameter-server worker is closed");
        return -1;
    }
    w->calls++;
    tn->w = w;
    tn->ts = PyEval_SaveThread();
    if (shared)
        pthread_rwlock_rdlock(&w->turns);
    else
        pthread_rwlock_wrlock(&w->turns);
    return 0;
}

void edl_py_psw_leave(turn *tn)
{
    pthread_rwlock_unlock(&tn->w->turns);
    PyEval_RestoreThread(tn->ts);
    tn->w->calls--;
}

/* The trainer's calls share the worker in async and half_async; the rest take it alone. */
bool edl_py_psw_shares(const PsWorker *w)
{
    return w->t && (w->mode == EDL_PS_MODE_ASYNC || w->mode == EDL_PS_MODE_HALF_ASYNC);
}

/* The last failure's message, copied before the turn ends (another call may overwrite it). */
void edl_py_psw_why(const PsWorker *w, bool trainer, char *why, size_t whylen)
{
    snprintf(why, whylen, "%s", trainer ? edl_ps_trainer_errmsg(w->t)
                                        : edl_ps_client_errmsg(w->c));
}

/* ---- tables ------------------------------------------------------------------------------- */

edl_ps_table_config *edl_py_psw_table(PsWorker *w, unsigned int table, edl_ps_table_kind kind)
{
    if (table >= EDL_PS_MAX_TABLES || !w->made[table] || w->cfg[table].kind != kind) {
        PyErr_Format(PyExc_ValueError, "table %u: no %s table of that id was created through "
                     "this worker (create it first: edl.ps.%s)", table,
                     kind == EDL_PS_SPARSE ? "sparse" : "dense",
                     kind == EDL_PS_SPARSE ? "SparseTable" : "DenseTable");
        return NULL;
    }
    return &w->cfg[table];
}

static int ctr_of(PyObject *ctr, edl_ps_ctr_config *c)
{
    if (ctr == Py_None)
        return 0;
    edl_py_uint_arg days = EDL_PY_U32("ctr's delete_after_unseen_days");
    if (!PyArg_ParseTuple(ctr, "fffffO&", &c->nonclk_coeff, &c->click_coeff,
                          &c->embedx_threshold, &c->show_click_decay_rate,
                          &c->delete_threshold, edl_py_uint, &days))
        return -1;
    c->delete_after_unseen_days = (uint32_t)days.value;
    return 0;
}

/* create_table(table, kind, dim, size, ...): on every server, or checked against the one there. */
static PyObject *worker_create_table(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"table", "kind", "dim", "size", "shards", "optimizer", "lr",
                             "beta1", "beta2", "eps", "init", "init_scale", "seed",
                             "geo_trainers", "accessor", "replicas", "ctr", NULL};
    PsWorker *w = (PsWorker *)self;
    edl_ps_table_config cfg;
    edl_ps_table_config_init(&cfg);
    edl_py_uint_arg tb = EDL_PY_U32("table"), kind = EDL_PY_U32("kind"), dim = EDL_PY_U32("dim"),
                    size = EDL_PY_U64("size"), shards = EDL_PY_U32("shards"),
                    opt = EDL_PY_U32("optimizer"), init = EDL_PY_U32("init"),
                    seed = EDL_PY_U64("seed"), geo = EDL_PY_U32("geo_trainers"),
                    acc = EDL_PY_U32("accessor"), replicas = EDL_PY_U32("replicas");
    kind.value = cfg.kind, dim.value = cfg.dim, shards.value = cfg.shards;
    opt.value = cfg.optimizer, init.value = cfg.init, geo.value = cfg.geo_trainers;
    acc.value = cfg.accessor, replicas.value = cfg.replicas;
    PyObject *ctr = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|$O&O&O&O&O&ffffO&fO&O&O&O&O", kwlist,
                                     edl_py_uint, &tb, edl_py_uint, &kind, edl_py_uint, &dim,
                                     edl_py_uint, &size, edl_py_uint, &shards, edl_py_uint, &opt,
                                     &cfg.lr, &cfg.beta1, &cfg.beta2, &cfg.eps, edl_py_uint,
                                     &init, &cfg.init_scale, edl_py_uint, &seed, edl_py_uint,
                                     &geo, edl_py_uint, &acc, edl_py_uint, &replicas, &ctr) ||
        ctr_of(ctr, &cfg.ctr) != 0)
        return NULL;
    unsigned int table = (unsigned int)tb.value;
    cfg.kind = (edl_ps_table_kind)kind.value, cfg.optimizer = (edl_ps_optimizer)opt.value;
    cfg.init = (edl_ps_init)init.value, cfg.accessor = (edl_ps_accessor)acc.value;
    cfg.dim = (uint32_t)dim.value, cfg.shards = (uint32_t)shards.value;
    cfg.geo_trainers = (uint32_t)geo.value, cfg.replicas = (uint32_t)replicas.value;
    cfg.size = size.value, cfg.seed = seed.value;
    char why[1024] = "";
    if (table >= EDL_PS_MAX_TABLES)
        return PyErr_Format(PyExc_ValueError, "table %u: ids are 0..%d", table,
                            EDL_PS_MAX_TABLES - 1);
    if (edl_ps_table_config_check(&cfg, why, sizeof why) != 0)
        return PyErr_Format(PyExc_ValueError, "table %u: %s", table, why);
    turn tn;
    if (edl_py_psw_enter(w, false, &tn) != 0)
        return NULL;
    int rc = edl_ps_create_table(w->c, table, &cfg);
    if (rc)
        edl_py_psw_why(w, false, why, sizeof why);
    edl_py_psw_leave(&tn);
    if (rc)
        return edl_py_raise(rc, "creating table %u: %s", table, why);
    w->cfg[table] = cfg;
    w->made[table] = true;
    Py_RETURN_NONE;
}

static PyObject *worker_get(PyObject *self, void *what)
{
    PsWorker *w = (PsWorker *)self;
    if ((intptr_t)what == 0)
        return PyBool_FromLong(!w->c && !w->fleet);
    if (!w->t)
        Py_RETURN_NONE;
    return PyUnicode_FromString(edl_ps_mode_name(w->mode));
}

static PyMethodDef WORKER_METHODS[] = {
    {"create_table", (PyCFunction)(void (*)(void))worker_create_table,
     METH_VARARGS | METH_KEYWORDS,
     "create_table(table, *, kind, dim, size, shards, optimizer, lr, beta1, beta2, eps, init, "
     "init_scale, seed, geo_trainers, accessor, replicas, ctr): the table on every server, or "
     "checked against the one there (edl.Error EDL_ECONFLICT for another config)."},
    {"pull_sparse", edl_py_psw_pull_sparse, METH_VARARGS,
     "pull_sparse(table, keys_addr, keys_nbytes, out_addr, out_nbytes, direct=False)"},
    {"push_sparse", edl_py_psw_push_sparse, METH_VARARGS,
     "push_sparse(table, keys_addr, keys_nbytes, grads_addr, grads_nbytes)"},
    {"prefetch_sparse", edl_py_psw_prefetch_sparse, METH_VARARGS,
     "prefetch_sparse(table, keys_addr, keys_nbytes): async: pull these keys ahead"},
    {"pull_dense", edl_py_psw_pull_dense, METH_VARARGS,
     "pull_dense(table, offset, out_addr, out_nbytes, direct=False)"},
    {"push_dense", edl_py_psw_push_dense, METH_VARARGS,
     "push_dense(table, offset, grads_addr, grads_nbytes)"},
    {"step", edl_py_psw_step, METH_NOARGS, "step(): the end of a training step in the mode"},
    {"flush", edl_py_psw_flush, METH_NOARGS, "flush(): every push so far applied on the servers"},
    {"barrier", edl_py_psw_barrier, METH_NOARGS, "barrier(): the fleet's barrier of all workers"},
    {"save", edl_py_psw_save, METH_VARARGS, "save(step): a PS checkpoint (after a flush)"},
    {"set_trainers", edl_py_psw_set_trainers, METH_VARARGS,
     "set_trainers(trainer_id, trainers): a new generation's count"},
    {"shrink", edl_py_psw_shrink, METH_VARARGS, "shrink(table) -> rows evicted (CTR tables)"},
    {"stats", edl_py_psw_stats, METH_NOARGS, "stats() -> dict: the servers' totals, this worker's "
     "bytes sent and received"},
    {"time_sparse", edl_py_psw_time_sparse, METH_VARARGS,
     "time_sparse(table, push, keys_addr, keys_nbytes, batch, buf_addr, buf_nbytes, seconds) "
     "-> (calls, seconds): the C client's loop, for the benchmark"},
    {"close", worker_close, METH_NOARGS, "close(): flush, then close the trainer and client"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef WORKER_GETSET[] = {
    {"closed", worker_get, NULL, "True once closed", (void *)0},
    {"mode", worker_get, NULL, "the trainer's mode (None: the client's own calls)", (void *)1},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot WORKER_SLOTS[] = {
    {Py_tp_doc, (void *)"PsWorker(endpoints=[...], *, mode=...) or PsWorker(fleet=f): a "
                        "parameter-server client and its trainer (edl/ps.h)."},
    {Py_tp_new, (void *)worker_new},
    {Py_tp_init, (void *)worker_init},
    {Py_tp_dealloc, (void *)worker_dealloc},
    {Py_tp_methods, WORKER_METHODS},
    {Py_tp_getset, WORKER_GETSET},
    {0, NULL},
};

static PyType_Spec WORKER_SPEC = {"edl._edl.PsWorker", sizeof(PsWorker), 0, Py_TPFLAGS_DEFAULT,
                                  WORKER_SLOTS};

int edl_py_ps_init(PyObject *m)
{
    PyObject *t = PyType_FromSpec(&WORKER_SPEC);
    return t && PyModule_AddObject(m, "PsWorker", t) == 0 ? 0 : -1;
}

/* ps.c (python/src/): edl._edl.PsWorker, the parameter server's client for Python (edl/ps.h):
 * an edl_ps_client and, in one of the four modes, the edl_ps_trainer over it, opened from
 * endpoints (edl.ps.Worker) or borrowed from an edl_fleet (fleet.c, edl.fleet.init_worker).
 * Keys, rows and gradients cross as (address, nbytes) of memory the caller keeps alive for the
 * call (a numpy array's or a tensor's: no copy); the sizes are checked against the tables this
 * worker created. Every call releases the GIL. A client is used by one thread at a time: the
 * calls take turns on a lock, except the trainer's own calls in async and half_async, which
 * edl_ps_trainer makes thread-safe (they share it). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "edl/ps.h"
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
    unsigned int generation = 0;
    edl_ps_trainer_options o = {.trainers = 1, .threads = 1, .geo_every = 10};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOszii$ziiiiI", kwlist, &endpoints, &fleet,
                                     &job, &secret_file, &timeout_ms, &lanes, &mode,
                                     &o.trainer_id, &o.trainers, &o.threads, &o.geo_every,
                                     &generation))
        return -1;
    if (w->c || w->fleet) {
        PyErr_SetString(PyExc_RuntimeError, "PsWorker.__init__: already open");
        return -1;
    }
    o.generation = generation;
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

/* A call in flight: entered with the GIL, which it releases; the lock is taken without it. */
typedef struct turn {
    PsWorker *w;
    PyThreadState *ts;
} turn;

static int enter(PsWorker *w, bool shared, turn *tn)
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

static void leave(turn *tn)
{
    pthread_rwlock_unlock(&tn->w->turns);
    PyEval_RestoreThread(tn->ts);
    tn->w->calls--;
}

/* The trainer's calls share the worker in async and half_async; the rest take it alone. */
static bool shares(const PsWorker *w)
{
    return w->t && (w->mode == EDL_PS_MODE_ASYNC || w->mode == EDL_PS_MODE_HALF_ASYNC);
}

/* The last failure's message, copied before the turn ends (another call may overwrite it). */
static void why_of(const PsWorker *w, bool trainer, char *why, size_t whylen)
{
    snprintf(why, whylen, "%s", trainer ? edl_ps_trainer_errmsg(w->t)
                                        : edl_ps_client_errmsg(w->c));
}

/* ---- tables ------------------------------------------------------------------------------- */

static edl_ps_table_config *table_of(PsWorker *w, unsigned int table, edl_ps_table_kind kind)
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
    return PyArg_ParseTuple(ctr, "fffffI", &c->nonclk_coeff, &c->click_coeff,
                            &c->embedx_threshold, &c->show_click_decay_rate,
                            &c->delete_threshold, &c->delete_after_unseen_days) ? 0 : -1;
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
    unsigned int table, kind = cfg.kind, opt = cfg.optimizer, init = cfg.init, acc = cfg.accessor;
    unsigned long long size = 0, seed = 0;
    PyObject *ctr = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "I|$IIKIIffffIfKIIIO", kwlist, &table, &kind,
                                     &cfg.dim, &size, &cfg.shards, &opt, &cfg.lr, &cfg.beta1,
                                     &cfg.beta2, &cfg.eps, &init, &cfg.init_scale, &seed,
                                     &cfg.geo_trainers, &acc, &cfg.replicas, &ctr) ||
        ctr_of(ctr, &cfg.ctr) != 0)
        return NULL;
    cfg.kind = (edl_ps_table_kind)kind, cfg.optimizer = (edl_ps_optimizer)opt;
    cfg.init = (edl_ps_init)init, cfg.accessor = (edl_ps_accessor)acc;
    cfg.size = size, cfg.seed = seed;
    char why[1024] = "";
    if (table >= EDL_PS_MAX_TABLES)
        return PyErr_Format(PyExc_ValueError, "table %u: ids are 0..%d", table,
                            EDL_PS_MAX_TABLES - 1);
    if (edl_ps_table_config_check(&cfg, why, sizeof why) != 0)
        return PyErr_Format(PyExc_ValueError, "table %u: %s", table, why);
    turn tn;
    if (enter(w, false, &tn) != 0)
        return NULL;
    int rc = edl_ps_create_table(w->c, table, &cfg);
    if (rc)
        why_of(w, false, why, sizeof why);
    leave(&tn);
    if (rc)
        return edl_py_raise(rc, "creating table %u: %s", table, why);
    w->cfg[table] = cfg;
    w->made[table] = true;
    Py_RETURN_NONE;
}

/* ---- memory arguments --------------------------------------------------------------------- */

/* (address, nbytes) of float32 memory holding exactly `want` floats. */
static int floats_at(unsigned long long addr, unsigned long long nbytes, uint64_t want,
                     const char *what, float **out)
{
    if (nbytes != want * sizeof(float)) {
        PyErr_Format(PyExc_ValueError, "%s: %llu bytes, want %llu (%llu float32 values)", what,
                     nbytes, (unsigned long long)(want * sizeof(float)),
                     (unsigned long long)want);
        return -1;
    }
    if (!addr && nbytes) {
        PyErr_Format(PyExc_ValueError, "%s: address 0", what);
        return -1;
    }
    *out = (float *)(uintptr_t)addr;
    return 0;
}

static int keys_at(unsigned long long addr, unsigned long long nbytes, const uint64_t **keys,
                   size_t *n)
{
    if (nbytes % sizeof(uint64_t) || (!addr && nbytes)) {
        PyErr_Format(PyExc_ValueError, "keys: %llu bytes at %#llx: not 64-bit keys", nbytes,
                     addr);
        return -1;
    }
    *keys = (const uint64_t *)(uintptr_t)addr;
    *n = (size_t)(nbytes / sizeof(uint64_t));
    return 0;
}

/* The floats a key of a sparse push carries: dim, a CTR table's dim + 2 (show, click). */
static uint32_t push_width(const edl_ps_table_config *cfg)
{
    return cfg->dim + (cfg->accessor == EDL_PS_ACCESSOR_CTR ? 2 : 0);
}

/* ---- sparse and dense calls --------------------------------------------------------------- */

enum { OP_PULL, OP_PUSH, OP_PREFETCH };

/* A sparse call: through the trainer (its mode) when there is one and not direct; direct: the
 * servers' rows on the client, after the trainer's queued pushes are applied. */
static int sparse_call(PsWorker *w, int op, unsigned int table, const uint64_t *keys, size_t n,
                       float *rows, bool direct, char *why, size_t whylen)
{
    bool trainer = w->t && !direct, flushed = direct && w->t;
    turn tn;
    if (enter(w, trainer && shares(w), &tn) != 0)
        return 1; /* the exception is set */
    int rc = flushed ? edl_ps_trainer_flush(w->t) : 0;
    bool failed_in_trainer = rc != 0;
    if (rc == 0 && op == OP_PREFETCH)
        rc = w->t ? edl_ps_trainer_prefetch_sparse(w->t, table, keys, n) : 0;
    else if (rc == 0 && trainer)
        rc = op == OP_PULL ? edl_ps_trainer_pull_sparse(w->t, table, keys, n, rows)
                           : edl_ps_trainer_push_sparse(w->t, table, keys, n, rows);
    else if (rc == 0)
        rc = op == OP_PULL ? edl_ps_pull_sparse(w->c, table, keys, n, rows)
                           : edl_ps_push_sparse(w->c, table, keys, n, rows);
    if (rc)
        why_of(w, failed_in_trainer || trainer || op == OP_PREFETCH, why, whylen);
    leave(&tn);
    return rc;
}

/* pull_sparse(table, keys_addr, keys_nbytes, out_addr, out_nbytes, direct=False) and
 * push_sparse(table, keys_addr, keys_nbytes, grads_addr, grads_nbytes) */
static PyObject *sparse(PyObject *self, PyObject *args, int op)
{
    PsWorker *w = (PsWorker *)self;
    unsigned int table;
    unsigned long long ka, kn, ra = 0, rn = 0;
    int direct = 0;
    if (!PyArg_ParseTuple(args, op == OP_PREFETCH ? "IKK" : "IKKKK|p", &table, &ka, &kn, &ra,
                          &rn, &direct))
        return NULL;
    const uint64_t *keys;
    size_t n;
    float *rows = NULL;
    edl_ps_table_config *cfg = table_of(w, table, EDL_PS_SPARSE);
    if (!cfg || keys_at(ka, kn, &keys, &n) != 0)
        return NULL;
    uint32_t width = op == OP_PUSH ? push_width(cfg) : cfg->dim;
    if (op != OP_PREFETCH &&
        floats_at(ra, rn, (uint64_t)n * width, op == OP_PULL ? "out" : "grads", &rows) != 0)
        return NULL;
    char why[1024] = "";
    int rc = sparse_call(w, op, table, keys, n, rows, direct, why, sizeof why);
    if (rc == 1)
        return NULL;
    if (rc)
        return edl_py_raise(rc, "%s of %zu keys of table %u: %s",
                            op == OP_PULL ? "pull" : op == OP_PUSH ? "push" : "prefetch", n,
                            table, why);
    Py_RETURN_NONE;
}

static PyObject *worker_pull_sparse(PyObject *self, PyObject *args)
{
    return sparse(self, args, OP_PULL);
}

static PyObject *worker_push_sparse(PyObject *self, PyObject *args)
{
    return sparse(self, args, OP_PUSH);
}

static PyObject *worker_prefetch_sparse(PyObject *self, PyObject *args)
{
    return sparse(self, args, OP_PREFETCH);
}

/* pull_dense(table, offset, addr, nbytes, direct=False), push_dense(table, offset, addr, nbytes) */
static PyObject *dense(PyObject *self, PyObject *args, int op)
{
    PsWorker *w = (PsWorker *)self;
    unsigned int table;
    unsigned long long off, addr, nbytes;
    int direct = 0;
    if (!PyArg_ParseTuple(args, "IKKK|p", &table, &off, &addr, &nbytes, &direct))
        return NULL;
    edl_ps_table_config *cfg = table_of(w, table, EDL_PS_DENSE);
    uint64_t n = nbytes / sizeof(float);
    float *v;
    if (!cfg || floats_at(addr, nbytes, n, op == OP_PULL ? "out" : "grads", &v) != 0)
        return NULL;
    if (off > cfg->size || n > cfg->size - off)
        return PyErr_Format(PyExc_ValueError, "table %u: elements [%llu, %llu) are past its "
                            "%llu", table, off, (unsigned long long)(off + n),
                            (unsigned long long)cfg->size);
    bool trainer = w->t && !direct;
    turn tn;
    if (enter(w, trainer && shares(w), &tn) != 0)
        return NULL;
    int rc = direct && w->t ? edl_ps_trainer_flush(w->t) : 0;
    if (rc == 0 && trainer)
        rc = op == OP_PULL ? edl_ps_trainer_pull_dense(w->t, table, off, n, v)
                           : edl_ps_trainer_push_dense(w->t, table, off, n, v);
    else if (rc == 0)
        rc = op == OP_PULL ? edl_ps_pull_dense(w->c, table, off, n, v)
                           : edl_ps_push_dense(w->c, table, off, n, v);
    char why[1024] = "";
    if (rc)
        why_of(w, w->t != NULL && (trainer || direct), why, sizeof why);
    leave(&tn);
    if (rc)
        return edl_py_raise(rc, "%s of elements [%llu, %llu) of table %u: %s",
                            op == OP_PULL ? "pull" : "push", off, (unsigned long long)(off + n),
                            table, why);
    Py_RETURN_NONE;
}

static PyObject *worker_pull_dense(PyObject *self, PyObject *args)
{
    return dense(self, args, OP_PULL);
}

static PyObject *worker_push_dense(PyObject *self, PyObject *args)
{
    return dense(self, args, OP_PUSH);
}

/* ---- the trainer's steps and the rest ----------------------------------------------------- */

enum { T_STEP, T_FLUSH, T_BARRIER, T_SAVE };

static PyObject *trainer_call(PsWorker *w, int what, long long arg)
{
    static const char *const names[] = {"step", "flush", "barrier_worker", "save"};
    if (what == T_BARRIER && !w->fleet)
        return edl_py_raise(EDL_EINVAL, "barrier_worker(): only the fleet's worker has one "
                            "(edl.fleet.init_worker)");
    turn tn;
    if (enter(w, what == T_STEP && shares(w), &tn) != 0)
        return NULL;
    int rc = 0;
    if (what == T_BARRIER)
        rc = edl_fleet_barrier_worker(edl_py_fleet_get(w->fleet));
    else if (!w->t)
        rc = what == T_SAVE ? edl_ps_save(w->c, arg) : 0; /* no mode: nothing queued */
    else if (what == T_STEP)
        rc = edl_ps_trainer_step(w->t);
    else
        rc = what == T_FLUSH ? edl_ps_trainer_flush(w->t) : edl_ps_trainer_save(w->t, arg);
    char why[1024] = "";
    if (rc)
        why_of(w, w->t && what != T_BARRIER, why, sizeof why);
    leave(&tn);
    if (rc)
        return edl_py_raise(rc, "%s: %s", names[what], why);
    Py_RETURN_NONE;
}

static PyObject *worker_step(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    return trainer_call((PsWorker *)self, T_STEP, 0);
}

static PyObject *worker_flush(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    return trainer_call((PsWorker *)self, T_FLUSH, 0);
}

static PyObject *worker_barrier(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    return trainer_call((PsWorker *)self, T_BARRIER, 0);
}

static PyObject *worker_save(PyObject *self, PyObject *args)
{
    long long step;
    if (!PyArg_ParseTuple(args, "L", &step))
        return NULL;
    return trainer_call((PsWorker *)self, T_SAVE, step);
}

static PyObject *worker_set_trainers(PyObject *self, PyObject *args)
{
    PsWorker *w = (PsWorker *)self;
    int id, n;
    if (!PyArg_ParseTuple(args, "ii", &id, &n))
        return NULL;
    if (n < 1 || id < 0 || id >= n)
        return PyErr_Format(PyExc_ValueError, "set_trainers(%d, %d): want 0 <= id < n", id, n);
    turn tn;
    if (enter(w, false, &tn) != 0)
        return NULL;
    int rc = w->t ? edl_ps_trainer_set_trainers(w->t, id, n) : EDL_EINVAL;
    leave(&tn);
    if (rc)
        return edl_py_raise(rc, "set_trainers(%d, %d): %s", id, n,
                            w->t ? edl_strerror(rc) : "this worker has no mode");
    Py_RETURN_NONE;
}

static PyObject *worker_shrink(PyObject *self, PyObject *args)
{
    PsWorker *w = (PsWorker *)self;
    unsigned int table;
    if (!PyArg_ParseTuple(args, "I", &table) || !table_of(w, table, EDL_PS_SPARSE))
        return NULL;
    uint64_t evicted = 0;
    char why[1024] = "";
    turn tn;
    if (enter(w, false, &tn) != 0)
        return NULL;
    int rc = w->t ? edl_ps_trainer_shrink(w->t, table, &evicted)
                  : edl_ps_shrink(w->c, table, &evicted);
    if (rc)
        why_of(w, w->t != NULL, why, sizeof why);
    leave(&tn);
    if (rc)
        return edl_py_raise(rc, "shrinking table %u: %s", table, why);
    return PyLong_FromUnsignedLongLong(evicted);
}

static PyObject *worker_stats(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    PsWorker *w = (PsWorker *)self;
    edl_ps_server_stats s;
    uint64_t sent = 0, received = 0;
    char why[1024] = "";
    turn tn;
    if (enter(w, false, &tn) != 0)
        return NULL;
    int rc = edl_ps_stats(w->c, &s);
    if (rc)
        why_of(w, false, why, sizeof why);
    else if (w->t)
        edl_ps_trainer_traffic(w->t, &sent, &received);
    else
        edl_ps_client_traffic(w->c, &sent, &received);
    leave(&tn);
    if (rc)
        return edl_py_raise(rc, "the servers' stats: %s", why);
    const char *names[] = {"tables", "rows", "bytes", "requests", "errors", "connections",
                           "rejected", "shards_in", "shards_out", "shards_lost",
                           "shards_restored", "pushes", "sent", "received"};
    uint64_t values[] = {s.tables, s.rows, s.bytes, s.requests, s.errors, s.connections,
                         s.rejected, s.shards_in, s.shards_out, s.shards_lost,
                         s.shards_restored, s.pushes, sent, received};
    return edl_py_counters(names, values, sizeof values / sizeof values[0]);
}

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* time_sparse(table, push, keys_addr, keys_nbytes, batch, buf_addr, buf_nbytes, seconds)
 * -> (calls, elapsed): bench/ps_python.py's measure of the C path: the client's own pulls (or
 * pushes) of consecutive batches of `batch` keys, cycling over the keys, in a C loop for
 * about `seconds`, on the same client the Python path uses. */
static PyObject *worker_time_sparse(PyObject *self, PyObject *args)
{
    PsWorker *w = (PsWorker *)self;
    unsigned int table, batch;
    int push;
    unsigned long long ka, kn, ba, bn;
    double seconds;
    if (!PyArg_ParseTuple(args, "IpKKIKKd", &table, &push, &ka, &kn, &batch, &ba, &bn,
                          &seconds))
        return NULL;
    const uint64_t *keys;
    size_t n;
    float *buf;
    edl_ps_table_config *cfg = table_of(w, table, EDL_PS_SPARSE);
    if (!cfg || keys_at(ka, kn, &keys, &n) != 0 ||
        floats_at(ba, bn, (uint64_t)batch * cfg->dim, "buf", &buf) != 0)
        return NULL;
    if (batch == 0 || n < batch || cfg->accessor != EDL_PS_ACCESSOR_PLAIN)
        return PyErr_Format(PyExc_ValueError, "time_sparse: want 1 <= batch <= keys, a plain "
                            "table");
    turn tn;
    if (enter(w, false, &tn) != 0)
        return NULL;
    int64_t t0 = now_us(), elapsed = 0;
    long long calls = 0;
    int rc = 0;
    for (size_t at = 0; rc == 0 && elapsed < (int64_t)(seconds * 1e6); calls++) {
        if (at + batch > n)
            at = 0;
        rc = push ? edl_ps_push_sparse(w->c, table, keys + at, batch, buf)
                  : edl_ps_pull_sparse(w->c, table, keys + at, batch, buf);
        at += batch;
        elapsed = now_us() - t0;
    }
    char why[1024] = "";
    if (rc)
        why_of(w, false, why, sizeof why);
    leave(&tn);
    if (rc)
        return edl_py_raise(rc, "time_sparse: %s", why);
    return Py_BuildValue("(Ld)", calls, (double)elapsed / 1e6);
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
    {"pull_sparse", worker_pull_sparse, METH_VARARGS,
     "pull_sparse(table, keys_addr, keys_nbytes, out_addr, out_nbytes, direct=False)"},
    {"push_sparse", worker_push_sparse, METH_VARARGS,
     "push_sparse(table, keys_addr, keys_nbytes, grads_addr, grads_nbytes)"},
    {"prefetch_sparse", worker_prefetch_sparse, METH_VARARGS,
     "prefetch_sparse(table, keys_addr, keys_nbytes): async: pull these keys ahead"},
    {"pull_dense", worker_pull_dense, METH_VARARGS,
     "pull_dense(table, offset, out_addr, out_nbytes, direct=False)"},
    {"push_dense", worker_push_dense, METH_VARARGS,
     "push_dense(table, offset, grads_addr, grads_nbytes)"},
    {"step", worker_step, METH_NOARGS, "step(): the end of a training step in the mode"},
    {"flush", worker_flush, METH_NOARGS, "flush(): every push so far applied on the servers"},
    {"barrier", worker_barrier, METH_NOARGS, "barrier(): the fleet's barrier of all workers"},
    {"save", worker_save, METH_VARARGS, "save(step): a PS checkpoint (after a flush)"},
    {"set_trainers", worker_set_trainers, METH_VARARGS,
     "set_trainers(trainer_id, trainers): a new generation's count"},
    {"shrink", worker_shrink, METH_VARARGS, "shrink(table) -> rows evicted (CTR tables)"},
    {"stats", worker_stats, METH_NOARGS, "stats() -> dict: the servers' totals, this worker's "
     "bytes sent and received"},
    {"time_sparse", worker_time_sparse, METH_VARARGS,
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

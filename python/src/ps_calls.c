/* ps_calls.c (python/src/): the calls of edl._edl.PsWorker (ps.c): sparse and dense pulls and
 * pushes, pulls ahead, the trainer's steps, flushes, barriers and saves, the servers' stats, and
 * the benchmark's loop of the C client. Memory crosses as (address, nbytes), checked against the
 * table's dim (or size) before the C client reads or writes it in place. Each call takes its
 * turn (ps_worker.h) with the GIL released. */
#include <stdio.h>
#include <time.h>

#include "ps_worker.h"

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
    if (edl_py_psw_enter(w, trainer && edl_py_psw_shares(w), &tn) != 0)
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
        edl_py_psw_why(w, failed_in_trainer || trainer || op == OP_PREFETCH, why, whylen);
    edl_py_psw_leave(&tn);
    return rc;
}

/* pull_sparse(table, keys_addr, keys_nbytes, out_addr, out_nbytes, direct=False) and
 * push_sparse(table, keys_addr, keys_nbytes, grads_addr, grads_nbytes) */
static PyObject *sparse(PyObject *self, PyObject *args, int op)
{
    PsWorker *w = (PsWorker *)self;
    edl_py_uint_arg tb = EDL_PY_U32("table");
    unsigned long long ka, kn, ra = 0, rn = 0;
    int direct = 0;
    if (!PyArg_ParseTuple(args, op == OP_PREFETCH ? "O&KK" : "O&KKKK|p", edl_py_uint, &tb, &ka,
                          &kn, &ra, &rn, &direct))
        return NULL;
    unsigned int table = (unsigned int)tb.value;
    const uint64_t *keys;
    size_t n;
    float *rows = NULL;
    edl_ps_table_config *cfg = edl_py_psw_table(w, table, EDL_PS_SPARSE);
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

PyObject *edl_py_psw_pull_sparse(PyObject *self, PyObject *args)
{
    return sparse(self, args, OP_PULL);
}

PyObject *edl_py_psw_push_sparse(PyObject *self, PyObject *args)
{
    return sparse(self, args, OP_PUSH);
}

PyObject *edl_py_psw_prefetch_sparse(PyObject *self, PyObject *args)
{
    return sparse(self, args, OP_PREFETCH);
}

/* pull_dense(table, offset, addr, nbytes, direct=False), push_dense(table, offset, addr, nbytes) */
static PyObject *dense(PyObject *self, PyObject *args, int op)
{
    PsWorker *w = (PsWorker *)self;
    edl_py_uint_arg tb = EDL_PY_U32("table"), offset = EDL_PY_U64("offset");
    unsigned long long addr, nbytes;
    int direct = 0;
    if (!PyArg_ParseTuple(args, "O&O&KK|p", edl_py_uint, &tb, edl_py_uint, &offset, &addr,
                          &nbytes, &direct))
        return NULL;
    unsigned int table = (unsigned int)tb.value;
    unsigned long long off = offset.value;
    edl_ps_table_config *cfg = edl_py_psw_table(w, table, EDL_PS_DENSE);
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
    if (edl_py_psw_enter(w, trainer && edl_py_psw_shares(w), &tn) != 0)
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
        edl_py_psw_why(w, w->t != NULL && (trainer || direct), why, sizeof why);
    edl_py_psw_leave(&tn);
    if (rc)
        return edl_py_raise(rc, "%s of elements [%llu, %llu) of table %u: %s",
                            op == OP_PULL ? "pull" : "push", off, (unsigned long long)(off + n),
                            table, why);
    Py_RETURN_NONE;
}

PyObject *edl_py_psw_pull_dense(PyObject *self, PyObject *args)
{
    return dense(self, args, OP_PULL);
}

PyObject *edl_py_psw_push_dense(PyObject *self, PyObject *args)
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
    if (edl_py_psw_enter(w, what == T_STEP && edl_py_psw_shares(w), &tn) != 0)
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
        edl_py_psw_why(w, w->t && what != T_BARRIER, why, sizeof why);
    edl_py_psw_leave(&tn);
    if (rc)
        return edl_py_raise(rc, "%s: %s", names[what], why);
    Py_RETURN_NONE;
}

PyObject *edl_py_psw_step(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    return trainer_call((PsWorker *)self, T_STEP, 0);
}

PyObject *edl_py_psw_flush(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    return trainer_call((PsWorker *)self, T_FLUSH, 0);
}

PyObject *edl_py_psw_barrier(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    return trainer_call((PsWorker *)self, T_BARRIER, 0);
}

PyObject *edl_py_psw_save(PyObject *self, PyObject *args)
{
    long long step;
    if (!PyArg_ParseTuple(args, "L", &step))
        return NULL;
    return trainer_call((PsWorker *)self, T_SAVE, step);
}

PyObject *edl_py_psw_set_trainers(PyObject *self, PyObject *args)
{
    PsWorker *w = (PsWorker *)self;
    int id, n;
    if (!PyArg_ParseTuple(args, "ii", &id, &n))
        return NULL;
    if (n < 1 || id < 0 || id >= n)
        return PyErr_Format(PyExc_ValueError, "set_trainers(%d, %d): want 0 <= id < n", id, n);
    turn tn;
    if (edl_py_psw_enter(w, false, &tn) != 0)
        return NULL;
    int rc = w->t ? edl_ps_trainer_set_trainers(w->t, id, n) : EDL_EINVAL;
    edl_py_psw_leave(&tn);
    if (rc)
        return edl_py_raise(rc, "set_trainers(%d, %d): %s", id, n,
                            w->t ? edl_strerror(rc) : "this worker has no mode");
    Py_RETURN_NONE;
}

PyObject *edl_py_psw_shrink(PyObject *self, PyObject *args)
{
    PsWorker *w = (PsWorker *)self;
    edl_py_uint_arg tb = EDL_PY_U32("table");
    if (!PyArg_ParseTuple(args, "O&", edl_py_uint, &tb) ||
        !edl_py_psw_table(w, (unsigned int)tb.value, EDL_PS_SPARSE))
        return NULL;
    unsigned int table = (unsigned int)tb.value;
    uint64_t evicted = 0;
    char why[1024] = "";
    turn tn;
    if (edl_py_psw_enter(w, false, &tn) != 0)
        return NULL;
    int rc = w->t ? edl_ps_trainer_shrink(w->t, table, &evicted)
                  : edl_ps_shrink(w->c, table, &evicted);
    if (rc)
        edl_py_psw_why(w, w->t != NULL, why, sizeof why);
    edl_py_psw_leave(&tn);
    if (rc)
        return edl_py_raise(rc, "shrinking table %u: %s", table, why);
    return PyLong_FromUnsignedLongLong(evicted);
}

PyObject *edl_py_psw_stats(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    PsWorker *w = (PsWorker *)self;
    edl_ps_server_stats s;
    uint64_t sent = 0, received = 0;
    char why[1024] = "";
    turn tn;
    if (edl_py_psw_enter(w, false, &tn) != 0)
        return NULL;
    int rc = edl_ps_stats(w->c, &s);
    if (rc)
        edl_py_psw_why(w, false, why, sizeof why);
    else if (w->t)
        edl_ps_trainer_traffic(w->t, &sent, &received);
    else
        edl_ps_client_traffic(w->c, &sent, &received);
    edl_py_psw_leave(&tn);
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
PyObject *edl_py_psw_time_sparse(PyObject *self, PyObject *args)
{
    PsWorker *w = (PsWorker *)self;
    edl_py_uint_arg tb = EDL_PY_U32("table"), bt = EDL_PY_U32("batch");
    int push;
    unsigned long long ka, kn, ba, bn;
    double seconds;
    if (!PyArg_ParseTuple(args, "O&pKKO&KKd", edl_py_uint, &tb, &push, &ka, &kn, edl_py_uint,
                          &bt, &ba, &bn, &seconds))
        return NULL;
    unsigned int table = (unsigned int)tb.value, batch = (unsigned int)bt.value;
    const uint64_t *keys;
    size_t n;
    float *buf;
    edl_ps_table_config *cfg = edl_py_psw_table(w, table, EDL_PS_SPARSE);
    if (!cfg || keys_at(ka, kn, &keys, &n) != 0 ||
        floats_at(ba, bn, (uint64_t)batch * cfg->dim, "buf", &buf) != 0)
        return NULL;
    if (batch == 0 || n < batch || cfg->accessor != EDL_PS_ACCESSOR_PLAIN)
        return PyErr_Format(PyExc_ValueError, "time_sparse: want 1 <= batch <= keys, a plain "
                            "table");
    turn tn;
    if (edl_py_psw_enter(w, false, &tn) != 0)
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
        edl_py_psw_why(w, false, why, sizeof why);
    edl_py_psw_leave(&tn);
    if (rc)
        return edl_py_raise(rc, "time_sparse: %s", why);
    return Py_BuildValue("(Ld)", calls, (double)elapsed / 1e6);
}


/* ckpt.c: edl._edl.Checkpoint, Pending and Manifest: edl/checkpoint.h for Python. Shards are
 * handed over as (name, address, nbytes, on_device) of memory the caller keeps alive (a
 * tensor's storage: no copy on the way in) or as (name, bytes); a load reads each shard
 * straight into the memory of a tensor the caller allocated. Every call that waits releases
 * the GIL. The job's etcd (which holds the pointer to the newest checkpoint) and the job are
 * the agent's environment: outside edl, Checkpoint() raises. */
#include <stdlib.h>
#include <string.h>

#include "edl/checkpoint.h"
#include "edl/etcd.h"
#include "internal.h"

typedef struct {
    PyObject_HEAD
    edl_ckpt *ck;
    edl_etcd *etcd;
} Checkpoint;

typedef struct {
    PyObject_HEAD
    edl_ckpt_pending *sv;
    PyObject *keep;   /* what the shards' memory belongs to, until the save is done */
    PyObject *owner;  /* the Checkpoint */
} Pending;

typedef struct {
    PyObject_HEAD
    edl_ckpt_manifest *m;
    PyObject *owner;
} Manifest;

static PyObject *pending_type, *manifest_type;

static void free_self(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

/* ---- Checkpoint ------------------------------------------------------------------------- */

static int open_ckpt(Checkpoint *c, edl_ckpt_config *cfg, char *err, size_t errlen)
{
    int rc = edl_etcd_open_env(&c->etcd, err, errlen);
    if (rc)
        return rc;
    cfg->etcd = c->etcd;
    return edl_ckpt_open(cfg, &c->ck, err, errlen);
}

static int ckpt_init(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"uri", "rank", "world_size", "keep", "snapshot_in_background",
                             "verify", NULL};
    Checkpoint *c = (Checkpoint *)self;
    edl_ckpt_config cfg;
    edl_ckpt_config_init(&cfg);
    int background = 0, verify = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|iiipp", kwlist, &cfg.uri, &cfg.rank,
                                     &cfg.world_size, &cfg.keep, &background, &verify))
        return -1;
    if (c->ck)
        return 0;
    cfg.snapshot_in_background = background;
    cfg.verify_on_load = verify;
    cfg.job = getenv("EDL_JOB_ID");
    cfg.prefix = getenv("EDL_ETCD_PREFIX");
    if (!cfg.job || !getenv("EDL_ETCD_ENDPOINTS")) {
        edl_py_raise(EDL_ECONFIG, "checkpoints of %s need the job's etcd, which holds the "
                     "pointer to the newest one: run under edl (EDL_JOB_ID and "
                     "EDL_ETCD_ENDPOINTS are not set)", cfg.uri);
        return -1;
    }
    char err[1024] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = open_ckpt(c, &cfg, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc) {
        edl_py_raise(rc, "checkpoints at %s: %s", cfg.uri, err);
        return -1;
    }
    return 0;
}

static void ckpt_dealloc(PyObject *self)
{
    Checkpoint *c = (Checkpoint *)self;
    Py_BEGIN_ALLOW_THREADS
    edl_ckpt_close(c->ck); /* waits for queued saves */
    edl_etcd_close(c->etcd);
    Py_END_ALLOW_THREADS
    free_self(self);
}

/* One shard from (name, address, nbytes, on_device) or (name, bytes). */
static int shard_of(PyObject *item, edl_ckpt_shard *s)
{
    memset(s, 0, sizeof *s);
    PyObject *data = NULL;
    unsigned long long addr = 0, len = 0;
    int device = 0;
    if (PyTuple_Check(item) && PyTuple_Size(item) == 2) {
        if (!PyArg_ParseTuple(item, "zO!", &s->name, &PyBytes_Type, &data))
            return -1;
        char *p;
        Py_ssize_t n;
        if (PyBytes_AsStringAndSize(data, &p, &n) != 0)
            return -1;
        s->data = p;
        s->len = (size_t)n;
        return 0;
    }
    if (!PyTuple_Check(item) ||
        !PyArg_ParseTuple(item, "zKKp", &s->name, &addr, &len, &device)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "a shard is (name, address, nbytes, on_device) "
                                             "or (name, bytes)");
        return -1;
    }
    if (!addr && len) {
        PyErr_SetString(PyExc_ValueError, "a shard of nbytes > 0 at address 0");
        return -1;
    }
    s->data = (const void *)(uintptr_t)addr;
    s->len = (size_t)len;
    s->device = device;
    return 0;
}

/* The shards of any iterable, malloc'ed (NULL with an exception set). Their names and bytes
 * point into the items of *items, a tuple of them (a list could be changed by another thread,
 * a generator's items exist only in what it made): the caller keeps *items alive for as long
 * as the save reads the shards. */
static edl_ckpt_shard *shards_of(PyObject *seq, PyObject **items, size_t *n)
{
    PyObject *t = PySequence_Tuple(seq);
    if (!t)
        return NULL;
    Py_ssize_t len = PyTuple_Size(t);
    edl_ckpt_shard *s = calloc(len > 0 ? (size_t)len : 1, sizeof *s);
    for (Py_ssize_t i = 0; s && i < len; i++) {
        if (shard_of(PyTuple_GetItem(t, i), &s[i]) != 0) {
            free(s);
            s = NULL;
        }
    }
    if (!s && !PyErr_Occurred())
        PyErr_NoMemory();
    if (!s)
        Py_CLEAR(t);
    *items = t;
    *n = (size_t)(len > 0 ? len : 0);
    return s;
}

/* save(step, generation, shards, metadata_json=None): save and wait; the shards' memory is
 * read in place while it runs. */
/* An opened Checkpoint, or NULL with an exception (Checkpoint.__new__ without __init__). */
static Checkpoint *opened(PyObject *self)
{
    Checkpoint *c = (Checkpoint *)self;
    if (!c->ck)
        edl_py_raise(EDL_EINVAL, "the Checkpoint is not open");
    return c->ck ? c : NULL;
}

static PyObject *ckpt_save(PyObject *self, PyObject *args)
{
    Checkpoint *c = opened(self);
    if (!c)
        return NULL;
    long long step, gen;
    PyObject *seq;
    const char *meta = NULL;
    if (!PyArg_ParseTuple(args, "LLO|z", &step, &gen, &seq, &meta))
        return NULL;
    size_t n;
    PyObject *items;
    edl_ckpt_shard *s = shards_of(seq, &items, &n);
    if (!s)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = edl_ckpt_save(c->ck, step, gen, s, n, meta);
    Py_END_ALLOW_THREADS
    free(s);
    Py_DECREF(items);
    if (rc)
        return edl_py_raise(rc, "saving checkpoint step %lld: %s", step, edl_ckpt_errmsg(c->ck));
    Py_RETURN_NONE;
}

/* save_async(step, generation, shards, metadata_json=None, keep=None) -> Pending: returns once
 * the shards are copied (at once with snapshot_in_background: see Pending.snapshot_wait);
 * the shards (their bytes objects are read in place) and keep are held until the save is done,
 * well or not. */
static PyObject *ckpt_save_async(PyObject *self, PyObject *args)
{
    Checkpoint *c = opened(self);
    if (!c)
        return NULL;
    long long step, gen;
    PyObject *seq, *keep = Py_None;
    const char *meta = NULL;
    if (!PyArg_ParseTuple(args, "LLO|zO", &step, &gen, &seq, &meta, &keep))
        return NULL;
    size_t n;
    PyObject *items;
    edl_ckpt_shard *s = shards_of(seq, &items, &n);
    if (!s)
        return NULL;
    Pending *p = (Pending *)PyObject_CallObject(pending_type, NULL);
    PyObject *held = p ? PyTuple_Pack(2, items, keep) : NULL;
    Py_DECREF(items);
    if (!held) {
        Py_XDECREF(p);
        free(s);
        return NULL;
    }
    p->keep = held;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = edl_ckpt_save_async(c->ck, step, gen, s, n, meta, &p->sv);
    Py_END_ALLOW_THREADS
    free(s);
    if (rc) {
        Py_DECREF(p);
        return edl_py_raise(rc, "queueing checkpoint step %lld: %s", step,
                            edl_ckpt_errmsg(c->ck));
    }
    Py_INCREF(self);
    p->owner = self;
    return (PyObject *)p;
}

/* A Manifest of what a load returned, or None (EDL_ENOTFOUND), or NULL with an exception. */
static PyObject *manifest_of(PyObject *self, int rc, edl_ckpt_manifest *m, const char *what)
{
    Checkpoint *c = (Checkpoint *)self;
    if (rc == EDL_ENOTFOUND)
        Py_RETURN_NONE;
    if (rc)
        return edl_py_raise(rc, "loading %s: %s", what, edl_ckpt_errmsg(c->ck));
    Manifest *mf = (Manifest *)PyObject_CallObject(manifest_type, NULL);
    if (!mf) {
        edl_ckpt_manifest_free(m);
        return NULL;
    }
    mf->m = m;
    Py_INCREF(self);
    mf->owner = self;
    return (PyObject *)mf;
}

/* load_latest() -> Manifest, or None when the job has no checkpoint. */
static PyObject *ckpt_load_latest(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    Checkpoint *c = opened(self);
    if (!c)
        return NULL;
    edl_ckpt_manifest *m = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = edl_ckpt_load_latest(c->ck, &m);
    Py_END_ALLOW_THREADS
    return manifest_of(self, rc, m, "the newest checkpoint");
}

/* load_older(step) -> Manifest of the newest complete checkpoint before step, or None. */
static PyObject *ckpt_load_older(PyObject *self, PyObject *args)
{
    long long step;
    if (!PyArg_ParseTuple(args, "L", &step))
        return NULL;
    Checkpoint *c = opened(self);
    if (!c)
        return NULL;
    edl_ckpt_manifest *m = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = edl_ckpt_load_older(c->ck, step, &m);
    Py_END_ALLOW_THREADS
    return manifest_of(self, rc, m, "a checkpoint older than the malformed one");
}

/* reserve(nbytes): allocate and fault in the staging memory of copied shards now. */
static PyObject *ckpt_reserve(PyObject *self, PyObject *args)
{
    unsigned long long n;
    if (!PyArg_ParseTuple(args, "K", &n))
        return NULL;
    Checkpoint *c = opened(self);
    if (!c)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = edl_ckpt_stage_reserve(c->ck, (size_t)n);
    Py_END_ALLOW_THREADS
    if (rc)
        return edl_py_raise(rc, "reserving %llu bytes of staging: %s", n, edl_ckpt_errmsg(c->ck));
    Py_RETURN_NONE;
}

static PyMethodDef CKPT_METHODS[] = {
    {"reserve", ckpt_reserve, METH_VARARGS,
     "reserve(nbytes): allocate and fault in staging memory for that many bytes of copied "
     "shards now, so that no save_async pays for it."},
    {"save", ckpt_save, METH_VARARGS,
     "save(step, generation, shards, metadata_json=None): save this rank's shards and wait "
     "(the committer also advances the job's pointer). A shard is (name, address, nbytes, "
     "on_device) of memory kept alive by the caller, or (name, bytes)."},
    {"save_async", ckpt_save_async, METH_VARARGS,
     "save_async(step, generation, shards, metadata_json=None, keep=None) -> Pending."},
    {"load_latest", ckpt_load_latest, METH_NOARGS,
     "load_latest() -> Manifest of the newest complete checkpoint (a corrupt newer one is "
     "passed over), or None when the job has none."},
    {"load_older", ckpt_load_older, METH_VARARGS,
     "load_older(step) -> Manifest of the newest complete checkpoint before step (which the "
     "caller found malformed: the newer ones are dropped from the pointer), or None when none "
     "is kept; EDL_EPROTO when none older is intact."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot CKPT_SLOTS[] = {
    {Py_tp_doc, (void *)"Checkpoint(uri, rank=0, world_size=1, keep=3, "
                        "snapshot_in_background=False, verify=True): the job's checkpoints at "
                        "uri (file:///... or s3://bucket/...), edl/checkpoint.h."},
    {Py_tp_init, (void *)ckpt_init},
    {Py_tp_dealloc, (void *)ckpt_dealloc},
    {Py_tp_methods, CKPT_METHODS},
    {Py_tp_new, (void *)PyType_GenericNew},
    {0, NULL},
};

/* ---- Pending ---------------------------------------------------------------------------- */

static void pending_dealloc(PyObject *self)
{
    Pending *p = (Pending *)self;
    if (p->sv && p->keep && !edl_ckpt_save_done(p->sv)) {
        /* a snapshot in the background may still read the memory held: let it finish */
        Py_BEGIN_ALLOW_THREADS
        edl_ckpt_snapshot_wait(p->sv, -1);
        Py_END_ALLOW_THREADS
    }
    edl_ckpt_save_free(p->sv); /* a save still running goes on and frees itself */
    Py_XDECREF(p->keep);
    Py_XDECREF(p->owner);
    free_self(self);
}

/* Wait with the GIL released: True when done (raises the save's error), False on timeout. */
static PyObject *pending_wait_for(PyObject *self, PyObject *args, bool snapshot)
{
    Pending *p = (Pending *)self;
    long long timeout = -1;
    if (!PyArg_ParseTuple(args, "|L", &timeout))
        return NULL;
    if (!p->sv)
        return edl_py_raise(EDL_EINVAL, "no save behind this handle");
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = snapshot ? edl_ckpt_snapshot_wait(p->sv, timeout) : edl_ckpt_wait(p->sv, timeout);
    Py_END_ALLOW_THREADS
    if (rc == EDL_ETIMEDOUT && !edl_ckpt_save_done(p->sv))
        Py_RETURN_FALSE;
    if (edl_ckpt_save_done(p->sv))
        Py_CLEAR(p->keep); /* stored or failed: nothing reads the memory any more */
    if (rc)
        return edl_py_raise(rc, "%s", edl_ckpt_save_done(p->sv) ? edl_ckpt_save_errmsg(p->sv)
                                                               : edl_strerror(rc));
    Py_RETURN_TRUE;
}

static PyObject *pending_wait(PyObject *self, PyObject *args)
{
    return pending_wait_for(self, args, false);
}

static PyObject *pending_snapshot_wait(PyObject *self, PyObject *args)
{
    return pending_wait_for(self, args, true);
}

static PyObject *pending_done(PyObject *self, void *unused)
{
    (void)unused;
    Pending *p = (Pending *)self;
    return PyBool_FromLong(p->sv && edl_ckpt_save_done(p->sv));
}

static PyMethodDef PENDING_METHODS[] = {
    {"wait", pending_wait, METH_VARARGS,
     "wait(timeout_ms=-1) -> bool: True once the save is stored (and, on the committer, "
     "committed); False while it runs past the timeout; edl.Error when it failed "
     "(EDL_ECONFLICT: a newer checkpoint was committed first)."},
    {"snapshot_wait", pending_snapshot_wait, METH_VARARGS,
     "snapshot_wait(timeout_ms=-1) -> bool: True once the shards are copied (their memory "
     "may be written again)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef PENDING_GETSET[] = {
    {"done", pending_done, NULL, "True once the save finished, well or not", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot PENDING_SLOTS[] = {
    {Py_tp_doc, (void *)"A save under way (Checkpoint.save_async)."},
    {Py_tp_dealloc, (void *)pending_dealloc},
    {Py_tp_methods, PENDING_METHODS},
    {Py_tp_getset, PENDING_GETSET},
    {Py_tp_new, (void *)PyType_GenericNew},
    {0, NULL},
};

/* ---- Manifest --------------------------------------------------------------------------- */

static void manifest_dealloc(PyObject *self)
{
    Manifest *mf = (Manifest *)self;
    edl_ckpt_manifest_free(mf->m);
    Py_XDECREF(mf->owner);
    free_self(self);
}

/* A Manifest made by load_latest (not by calling the type), or NULL with an exception. */
static Manifest *loaded(PyObject *self)
{
    Manifest *mf = (Manifest *)self;
    if (!mf->m || !mf->owner) {
        edl_py_raise(EDL_EINVAL, "a Manifest comes from Checkpoint.load_latest()");
        return NULL;
    }
    return mf;
}

static PyObject *manifest_get(PyObject *self, void *what)
{
    Manifest *mf = loaded(self);
    if (!mf)
        return NULL;
    const edl_ckpt_manifest *m = mf->m;
    switch ((int)(intptr_t)what) {
    case 0: return PyLong_FromLongLong(m->step);
    case 1: return PyLong_FromLongLong(m->generation);
    case 2: return PyLong_FromLong(m->world_size);
    case 3: return PyUnicode_FromString(m->metadata_json ? m->metadata_json : "{}");
    case 4: return PyLong_FromLong(m->skipped);
    case 6:
        if (!m->run)
            Py_RETURN_NONE;
        return PyUnicode_FromString(m->run);
    default: break;
    }
    PyObject *list = PyList_New((Py_ssize_t)m->n_shards);
    for (size_t i = 0; list && i < m->n_shards; i++) {
        const edl_ckpt_shard_info *s = &m->shards[i];
        PyObject *t = Py_BuildValue("(iisK)", s->rank, s->index, s->name,
                                    (unsigned long long)s->size);
        if (!t) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SetItem(list, (Py_ssize_t)i, t);
    }
    return list;
}

/* read(i) -> bytes: shard i, size and digest checked. */
static PyObject *manifest_read(PyObject *self, PyObject *args)
{
    Manifest *mf = loaded(self);
    Py_ssize_t i;
    if (!mf || !PyArg_ParseTuple(args, "n", &i))
        return NULL;
    if (i < 0 || (size_t)i >= mf->m->n_shards)
        return edl_py_raise(EDL_EINVAL, "shard %zd: the checkpoint has %zu", i, mf->m->n_shards);
    Checkpoint *c = (Checkpoint *)mf->owner;
    void *data = NULL;
    size_t len = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = edl_ckpt_read_shard(c->ck, mf->m, (size_t)i, &data, &len);
    Py_END_ALLOW_THREADS
    if (rc)
        return edl_py_raise(rc, "reading shard %zd of checkpoint step %lld: %s", i,
                            (long long)mf->m->step, edl_ckpt_errmsg(c->ck));
    PyObject *b = PyBytes_FromStringAndSize(data, (Py_ssize_t)len);
    free(data);
    return b;
}

/* read_into([(index, address, capacity), ...]): shards straight into the caller's memory,
 * several at once, each checked. */
static PyObject *manifest_read_into(PyObject *self, PyObject *args)
{
    Manifest *mf = loaded(self);
    PyObject *seq;
    if (!mf || !PyArg_ParseTuple(args, "O", &seq))
        return NULL;
    PyObject *fast = PySequence_Fast(seq, "read_into takes a sequence of (index, address, "
                                          "capacity)");
    if (!fast)
        return NULL;
    Py_ssize_t n = PySequence_Size(fast);
    edl_ckpt_read *r = calloc(n > 0 ? (size_t)n : 1, sizeof *r);
    for (Py_ssize_t i = 0; r && i < n; i++) {
        PyObject *item = PySequence_GetItem(fast, i);
        unsigned long long addr = 0, cap = 0;
        Py_ssize_t index = 0;
        int ok = item && PyArg_ParseTuple(item, "nKK", &index, &addr, &cap);
        Py_XDECREF(item);
        if (!ok || index < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "a negative shard index");
            free(r);
            Py_DECREF(fast);
            return NULL;
        }
        r[i] = (edl_ckpt_read){.index = (size_t)index, .dst = (void *)(uintptr_t)addr,
                               .cap = (size_t)cap};
    }
    Py_DECREF(fast);
    if (!r)
        return PyErr_NoMemory();
    Checkpoint *c = (Checkpoint *)mf->owner;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = edl_ckpt_read_shards_into(c->ck, mf->m, r, (size_t)n);
    Py_END_ALLOW_THREADS
    free(r);
    if (rc)
        return edl_py_raise(rc, "reading checkpoint step %lld: %s", (long long)mf->m->step,
                            edl_ckpt_errmsg(c->ck));
    Py_RETURN_NONE;
}

static PyMethodDef MANIFEST_METHODS[] = {
    {"read", manifest_read, METH_VARARGS, "read(i) -> bytes of shard i, checked."},
    {"read_into", manifest_read_into, METH_VARARGS,
     "read_into([(index, address, capacity), ...]): shards straight into memory the caller "
     "allocated (a tensor's), several at once, each checked."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef MANIFEST_GETSET[] = {
    {"step", manifest_get, NULL, "the checkpoint's step", (void *)0},
    {"generation", manifest_get, NULL, "the generation that saved it", (void *)1},
    {"world_size", manifest_get, NULL, "the ranks that saved it", (void *)2},
    {"metadata", manifest_get, NULL, "the saver's metadata (a JSON object, as text)", (void *)3},
    {"skipped", manifest_get, NULL, "newer checkpoints passed over as corrupt", (void *)4},
    {"shards", manifest_get, NULL, "[(rank, index, name, size)] in manifest order", (void *)5},
    {"run", manifest_get, NULL, "the run of the job that saved it (EDL_RUN_ID; None: not named)",
     (void *)6},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot MANIFEST_SLOTS[] = {
    {Py_tp_doc, (void *)"A committed checkpoint (Checkpoint.load_latest)."},
    {Py_tp_dealloc, (void *)manifest_dealloc},
    {Py_tp_methods, MANIFEST_METHODS},
    {Py_tp_getset, MANIFEST_GETSET},
    {Py_tp_new, (void *)PyType_GenericNew},
    {0, NULL},
};

static PyType_Spec CKPT_SPEC = {"edl._edl.Checkpoint", sizeof(Checkpoint), 0,
                                Py_TPFLAGS_DEFAULT, CKPT_SLOTS};
static PyType_Spec PENDING_SPEC = {"edl._edl.Pending", sizeof(Pending), 0, Py_TPFLAGS_DEFAULT,
                                   PENDING_SLOTS};
static PyType_Spec MANIFEST_SPEC = {"edl._edl.Manifest", sizeof(Manifest), 0,
                                    Py_TPFLAGS_DEFAULT, MANIFEST_SLOTS};

int edl_py_ckpt_init(PyObject *m)
{
    PyObject *ck = PyType_FromSpec(&CKPT_SPEC);
    pending_type = PyType_FromSpec(&PENDING_SPEC);
    manifest_type = PyType_FromSpec(&MANIFEST_SPEC);
    if (!ck || !pending_type || !manifest_type || PyModule_AddObject(m, "Checkpoint", ck) != 0)
        return -1;
    Py_INCREF(pending_type);
    Py_INCREF(manifest_type);
    if (PyModule_AddObject(m, "Pending", pending_type) != 0 ||
        PyModule_AddObject(m, "Manifest", manifest_type) != 0)
        return -1;
    return 0;
}

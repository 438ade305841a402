"""edl.ps: the parameter server's tables from Python, over libedlps (edl/ps.h, docs/ps.md).

    import edl.fleet as fleet, edl.ps as ps
    fleet.init(); fleet.init_worker()                    # the job's servers, in its mode
    emb = ps.SparseTable(1, dim=8, optimizer="adagrad", lr=0.05)
    rows = emb.pull(keys)                                # (n, 8) float32, in the keys' order
    emb.push(keys, grads)                                # applied on the servers in the mode
    w = ps.DenseTable(2, size=22); w.pull(out); w.push(grads)

Keys are 64-bit ids (int64 or uint64); rows and gradients are contiguous float32. Both may be
numpy arrays or CPU torch tensors: the C client reads and writes their memory in place, no
copy on the way (a tensor of another dtype or a strided view is refused, saying so). Repeated
keys are the client's business: a pull fetches each once, a push sums their gradients first.

A table's calls go through a Worker: the fleet's (``edl.fleet.init_worker()``; the default),
or one opened on servers named by hand, ``Worker(["127.0.0.1:7000"], mode="async")``; with
``mode=None`` its calls are the client's own, no mode.
"""
import os

import numpy as np

from . import _edl

__all__ = ["Worker", "SparseTable", "DenseTable", "MODES"]

MODES = ("sync", "async", "half_async", "geo")
_OPTIMIZERS = {"sgd": 1, "adagrad": 2, "adam": 3}
_INITS = {"zero": 1, "uniform": 2}
_ACCESSORS = {"plain": 0, "ctr": 1}


# ---- memory of arrays and tensors -----------------------------------------------------------

def _is_tensor(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def _memory(x, what, kinds, writable=False):
    """(address, nbytes, count) of a contiguous array or CPU tensor of one of kinds
    ("float32", "int64", "uint64"); TypeError or ValueError, saying which, otherwise."""
    if isinstance(x, np.ndarray):
        if x.dtype not in _DTYPES[kinds]:  # (dtype objects: .name costs a string a call)
            if x.dtype.byteorder == ">" and x.dtype.newbyteorder("=") in _DTYPES[kinds]:
                raise TypeError(f"edl.ps: {what} is a numpy array of big-endian "
                                f"{x.dtype.name}; the servers take the machine's byte order: "
                                f"pass {what}.astype(np.{x.dtype.name})")
            raise TypeError(f"edl.ps: {what} is a numpy array of {x.dtype.name}; want "
                            f"{' or '.join(kinds)} (convert it: .astype(np.{kinds[0]}))")
        if not x.flags.c_contiguous:
            raise ValueError(f"edl.ps: {what} is not contiguous (a strided view of shape "
                             f"{x.shape}); pass np.ascontiguousarray({what})")
        if writable and not x.flags.writeable:
            raise ValueError(f"edl.ps: {what} is read-only; pull into a writable array")
        return x.ctypes.data, x.nbytes, x.size
    if _is_tensor(x):
        name = str(x.dtype).replace("torch.", "")
        if name not in kinds:
            raise TypeError(f"edl.ps: {what} is a torch tensor of {name}; want "
                            f"{' or '.join(k for k in kinds if k != 'uint64')} "
                            f"(convert it: .to(torch.{kinds[0]}))")
        if x.device.type != "cpu":
            raise ValueError(f"edl.ps: {what} is on {x.device}; the servers' rows travel "
                             f"through host memory: pass a CPU tensor ({what}.cpu())")
        if not x.is_contiguous():
            raise ValueError(f"edl.ps: {what} is not contiguous (strides {tuple(x.stride())}); "
                             f"pass {what}.contiguous()")
        return x.data_ptr(), x.numel() * x.element_size(), x.numel()
    raise TypeError(f"edl.ps: {what} is a {type(x).__name__}; want a numpy array or a torch "
                    f"tensor")


_KEYS = ("int64", "uint64")
_FLOATS = ("float32",)
_DTYPES = {k: tuple(np.dtype(n) for n in k) for k in (_KEYS, _FLOATS)}


def _new_rows(like, shape):
    """A float32 array for pulled rows: a tensor when the keys are a tensor, else numpy."""
    if _is_tensor(like):
        import torch
        return torch.empty(shape, dtype=torch.float32)
    return np.empty(shape, dtype=np.float32)


# ---- the worker -----------------------------------------------------------------------------

class Worker:
    """A client of every server and, with a mode, the trainer of that mode (edl_ps_trainer).

    ``Worker(endpoints, mode="async", trainer_id=0, trainers=1, threads=1, geo_every=10,
    generation=0, job="edl", secret_file=None, timeout_ms=30000, lanes=0)``: endpoints are
    "host:port" of every server (the fixed set, as ``edl-ps`` processes started by hand); the
    job secret comes from secret_file or EDL_JOB_SECRET_FILE. ``mode=None``: no mode, the
    client's own calls (pushes applied before they return). The fleet's worker is made by
    ``edl.fleet.init_worker()`` and follows the job's servers under edl.
    """

    def __init__(self, endpoints=None, mode="async", *, trainer_id=0, trainers=1, threads=1,
                 geo_every=10, generation=0, job=None, secret_file=None, timeout_ms=0, lanes=0,
                 _fleet=None):
        if _fleet is not None:
            self._w = _edl.PsWorker(fleet=_fleet)
            self.trainers = None
            return
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e]
        if mode is not None and mode not in MODES:
            raise ValueError(f"edl.ps.Worker: mode {mode!r}: one of {', '.join(MODES)} or None")
        self._w = _edl.PsWorker(endpoints, job=job or os.environ.get("EDL_JOB_ID", "edl"),
                                secret_file=secret_file, timeout_ms=timeout_ms, lanes=lanes,
                                mode=mode, trainer_id=trainer_id, trainers=trainers,
                                threads=threads, geo_every=geo_every, generation=generation)
        self.trainers = trainers

    @property
    def mode(self):
        """"sync", "async", "half_async", "geo", or None (the client's own calls)."""
        return self._w.mode

    @property
    def closed(self):
        return self._w.closed

    def step(self):
        """The end of a training step: sync's barrier, half_async's send, geo's sync every
        geo_every steps; nothing in async."""
        self._w.step()

    def flush(self):
        """Every push so far is applied on the servers (geo: the local changes pushed now)."""
        self._w.flush()

    def save(self, step):
        """A PS checkpoint of step (the servers keep it where EDL_CHECKPOINT_URI says)."""
        self._w.save(step)

    def set_trainers(self, trainer_id, trainers):
        """A new generation: this trainer's index and the trainer count."""
        self._w.set_trainers(trainer_id, trainers)
        self.trainers = trainers

    def stats(self):
        """The servers' totals (rows, bytes, pushes, shards moved and lost, ...) and this
        worker's bytes sent and received."""
        return self._w.stats()

    def close(self):
        """Flush, then close the trainer and the connections."""
        self._w.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"edl.ps.Worker(mode={self.mode!r}{', closed' if self.closed else ''})"


def _default_worker(worker):
    if worker is not None:
        return worker
    from . import fleet
    return fleet.worker()


# ---- tables ---------------------------------------------------------------------------------

class _Table:
    def __init__(self, table, kind, worker, optimizer, lr, init, init_scale, seed, shards,
                 replicas, beta1, beta2, eps, **more):
        if not isinstance(table, int) or not 0 <= table < 256:
            raise ValueError(f"edl.ps: table id {table!r}: an int in 0..255")
        if optimizer not in _OPTIMIZERS:
            raise ValueError(f"edl.ps: optimizer {optimizer!r}: sgd, adagrad or adam")
        if init not in _INITS:
            raise ValueError(f"edl.ps: init {init!r}: zero or uniform")
        self.id, self.worker = table, _default_worker(worker)
        self.optimizer, self.lr = optimizer, lr
        self.worker._w.create_table(table, kind=kind, optimizer=_OPTIMIZERS[optimizer], lr=lr,
                                    init=_INITS[init], init_scale=init_scale, seed=seed,
                                    shards=shards, replicas=replicas, beta1=beta1, beta2=beta2,
                                    eps=eps, **more)


class SparseTable(_Table):
    """A sparse table: a 64-bit key maps to a row of ``dim`` floats, made on first touch,
    updated on the servers by the optimizer (sgd, adagrad, adam; lr, beta1, beta2, eps).
    Initial values: ``init="uniform"`` in +-init_scale (a function of seed, key and column: the
    same on any server), or "zero". ``replicas``: servers that apply each update (1-3).
    ``accessor="ctr"`` keeps Paddle's CTR statistics (docs/ps.md; pushes carry show and click
    before the gradients, ``ctr=(nonclk_coeff, click_coeff, embedx_threshold,
    show_click_decay_rate, delete_threshold, delete_after_unseen_days)``). In GEO mode the table
    tracks the worker's trainer count unless geo_trainers says otherwise. Every worker that uses
    the table creates it with the same settings (the servers refuse another: edl.Error
    EDL_ECONFLICT)."""

    def __init__(self, table, dim=8, *, worker=None, optimizer="sgd", lr=0.01, init="uniform",
                 init_scale=0.01, seed=0, shards=1024, replicas=1, beta1=0.9, beta2=0.999,
                 eps=1e-8, accessor="plain", ctr=None, geo_trainers=None):
        if accessor not in _ACCESSORS:
            raise ValueError(f"edl.ps: accessor {accessor!r}: plain or ctr")
        worker = _default_worker(worker)
        if geo_trainers is None:
            geo_trainers = (worker.trainers or _fleet_workers()) if worker.mode == "geo" else 0
        super().__init__(table, 2, worker, optimizer, lr, init, init_scale, seed, shards,
                         replicas, beta1, beta2, eps, dim=dim, geo_trainers=geo_trainers,
                         accessor=_ACCESSORS[accessor], ctr=ctr)
        self.dim = dim
        self.width = dim + 2 if accessor == "ctr" else dim  # floats a key of a push carries

    def pull(self, keys, out=None, *, direct=False):
        """The rows of keys (n keys: n x dim float32) into out, or into a new array (a tensor
        when keys is one). Through the worker's mode: geo's local copies, async's rows pulled
        ahead. ``direct=True``: the servers' rows themselves, after this worker's queued pushes
        are applied (to evaluate the servers' model)."""
        ka, kb, n = _memory(keys, "keys", _KEYS)
        if out is None:
            out = _new_rows(keys, (n, self.dim))
        oa, ob, _ = _memory(out, "out", _FLOATS, writable=True)
        self.worker._w.pull_sparse(self.id, ka, kb, oa, ob, direct)
        return out

    def push(self, keys, grads):
        """Gradients of keys (n x dim float32; a CTR table's n x (dim + 2): show, click, then
        the gradients), applied on the servers in the worker's mode; a repeated key's
        gradients are summed first."""
        ka, kb, _ = _memory(keys, "keys", _KEYS)
        ga, gb, _ = _memory(grads, "grads", _FLOATS)
        self.worker._w.push_sparse(self.id, ka, kb, ga, gb)

    def prefetch(self, keys):
        """async: the keys of a coming pull (the next batch's), pulled now on a thread of
        their own; the next pull of the same keys takes those rows. Other modes: nothing."""
        ka, kb, _ = _memory(keys, "keys", _KEYS)
        self.worker._w.prefetch_sparse(self.id, ka, kb)

    def shrink(self):
        """A CTR table's shrink step on every server: the rows it evicted."""
        return self.worker._w.shrink(self.id)

    def __repr__(self):
        return f"edl.ps.SparseTable({self.id}, dim={self.dim}, optimizer={self.optimizer!r})"


class DenseTable(_Table):
    """A dense table of ``size`` floats, cut into the shards' ranges over the servers and
    updated there by the optimizer; ``init="zero"`` by default."""

    def __init__(self, table, size, *, worker=None, optimizer="sgd", lr=0.01, init="zero",
                 init_scale=0.01, seed=0, shards=1024, replicas=1, beta1=0.9, beta2=0.999,
                 eps=1e-8):
        super().__init__(table, 1, worker, optimizer, lr, init, init_scale, seed, shards,
                         replicas, beta1, beta2, eps, dim=1, size=size)
        self.size = size

    def pull(self, out=None, offset=0, *, direct=False):
        """Elements [offset, offset + len(out)) into out (float32), or the whole table into
        a new numpy array."""
        if out is None:
            out = np.empty(self.size - offset, dtype=np.float32)
        a, b, _ = _memory(out, "out", _FLOATS, writable=True)
        self.worker._w.pull_dense(self.id, offset, a, b, direct)
        return out

    def push(self, grads, offset=0):
        """Gradients of elements [offset, offset + len(grads))."""
        a, b, _ = _memory(grads, "grads", _FLOATS)
        self.worker._w.push_dense(self.id, offset, a, b)

    def __repr__(self):
        return f"edl.ps.DenseTable({self.id}, size={self.size}, optimizer={self.optimizer!r})"


def _fleet_workers():
    from . import fleet
    return fleet.worker_num()

"""edl.checkpoint: checkpoints of PyTorch state (nested dicts, lists and tuples of tensors and
plain values: ``model.state_dict()``, ``optimizer.state_dict()``, counters) on ``file://`` and
``s3://``, through edl's checkpoint library (edl/checkpoint.h).

    edl.checkpoint.save({"model": m.state_dict(), "step": 7}, 7, "s3://bucket/run1")
    obj, step = edl.checkpoint.load_latest("s3://bucket/run1") or (None, 0)

Each tensor is one shard whose memory the C side reads in place (a CPU tensor's storage; a
CUDA tensor goes through pinned staging on the device path); the structure around them is one
more shard. A checkpoint is complete or invisible: the job's etcd names the newest committed
one, and a corrupt newest one is passed over for the one before (load_latest says how many
were skipped in the log). ``save_async`` returns once the tensors are copied (or at once with
``snapshot_in_background=True``: then ``snapshot_wait()`` before the next optimizer step) and
uploads in the background. Checkpoints need the job's etcd: outside edl these functions raise
``edl.Error`` (EDL_ECONFIG).

By default loading rebuilds only containers, numbers, strings, bytes and tensors (no code runs
from a checkpoint's bytes); ``trusted=True`` accepts any pickled object, as torch.load does.
"""
import json
import pickle
import sys
import time

import torch

from . import _edl, _link, _structure as _structure_reader, context

__all__ = ["save", "save_async", "wait", "reserve", "load", "load_latest"]

_FORMAT = "edl.torch/1"
_STRUCTURE = "structure"

_handles = {}     # (uri, background, verify) -> _edl.Checkpoint: staging kept between saves
_pending = []     # saves under way (save_async)


class _Ref:
    """Stands for tensor i in the pickled structure."""

    def __init__(self, i, dtype, shape, device):
        self.i, self.dtype, self.shape, self.device = i, dtype, shape, device

    def __reduce__(self):
        return (_Ref, (self.i, self.dtype, self.shape, self.device))


def _handle(url, background=False, verify=True):
    key = (url, background, verify)
    if key not in _handles:
        _handles[key] = _edl.Checkpoint(url, snapshot_in_background=background, verify=verify)
    return _handles[key]


def _loader(url):
    """The handle loads go through. Its load_latest checks that every shard is there, of its
    size, but digests none: _load reads each shard it uses once, straight into its tensor, and
    the digest is checked in that pass (a mismatch is EDL_EPROTO, which falls back as a
    corrupt checkpoint does). Verifying first would read the whole checkpoint twice."""
    return _handle(url, verify=False)


def _split(obj, tensors, path="obj"):
    """obj with every tensor replaced by a _Ref; the tensors (contiguous) appended."""
    if torch.is_tensor(obj):
        t = obj.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        tensors.append(t)
        return _Ref(len(tensors) - 1, str(t.dtype).replace("torch.", ""), tuple(t.shape),
                    t.device.type)
    if isinstance(obj, dict):
        return type(obj)((k, _split(v, tensors, f"{path}[{k!r}]")) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_split(v, tensors, f"{path}[{i}]") for i, v in enumerate(obj))
    try:
        pickle.dumps(obj)
    except Exception as e:  # noqa: BLE001 - any refusal of pickle
        raise TypeError(f"edl.checkpoint: {path} is a {type(obj).__name__}, which cannot be "
                        f"saved ({e}); a checkpoint holds tensors, containers and picklable "
                        f"values") from None
    return obj


def _shards(obj):
    tensors = []
    structure = pickle.dumps(_split(obj, tensors), protocol=4)
    shards = [(_STRUCTURE, structure)]
    for i, t in enumerate(tensors):
        nbytes = t.numel() * t.element_size()
        shards.append((f"t{i}", t.data_ptr() if nbytes else 0, nbytes, t.is_cuda))
    if any(t.is_cuda for t in tensors):
        torch.cuda.synchronize()  # the copy waits for nothing queued on the caller's streams
    meta = json.dumps({"format": _FORMAT, "tensors": len(tensors)})
    return shards, meta, tensors


def _report(load, began, nbytes):
    """Tell the agent how long a save or a load took since `began` (time.monotonic()) and its
    bytes: its /metrics (edl_agent_checkpoint_*); nothing outside edl."""
    _link().report_checkpoint(load, int((time.monotonic() - began) * 1000), nbytes)


def _size(shards):
    return sum(len(s[1]) if len(s) == 2 else s[2] for s in shards)


def _generation(generation):
    return context().generation if generation is None else generation


def save(obj, step, url, generation=None):
    """Save obj as checkpoint `step` of the job at url and wait until it is committed."""
    began = time.monotonic()
    shards, meta, tensors = _shards(obj)
    _handle(url).save(step, _generation(generation), shards, meta)
    del tensors
    _report(False, began, _size(shards))


class Pending:
    """A save under way (save_async)."""

    def __init__(self, p, began, nbytes):
        self._p = p
        self._began, self._bytes = began, nbytes  # reported to the agent once committed

    def wait(self, timeout=None):
        """True once committed; False while it runs past timeout (seconds); edl.Error when it
        failed (once: then, as once it is stored, the save is forgotten and its tensors are
        released)."""
        try:
            done = self._p.wait(-1 if timeout is None else int(timeout * 1000))
            if done and self._bytes is not None:
                _report(False, self._began, self._bytes)
                self._bytes = None
            return done
        finally:
            if self._p.done and self in _pending:
                _pending.remove(self)

    def snapshot_wait(self, timeout=None):
        """True once the tensors are copied: from then on they may be written again."""
        return self._p.snapshot_wait(-1 if timeout is None else int(timeout * 1000))

    @property
    def done(self):
        return self._p.done


def save_async(obj, step, url, generation=None, snapshot_in_background=False):
    """Queue checkpoint `step`; returns a Pending once the tensors are copied (at once with
    snapshot_in_background: do not write them before Pending.snapshot_wait())."""
    began = time.monotonic()
    shards, meta, tensors = _shards(obj)
    p = Pending(_handle(url, snapshot_in_background).save_async(
        step, _generation(generation), shards, meta, tensors), began, _size(shards))
    _pending.append(p)
    return p


def reserve(url, obj, snapshot_in_background=False):
    """Allocate (and fault in) the staging memory that save_async of obj (or of that many
    bytes) copies into, now, before training starts: no save pays for it later."""
    if not isinstance(obj, int):
        shards = _shards(obj)[0]  # what save_async copies: the structure and the CPU tensors
        obj = sum(len(s[1]) if len(s) == 2 else (0 if s[3] else s[2]) for s in shards)
        obj += 64 * len(shards)  # each shard's place is rounded up to a cache line
    _handle(url, snapshot_in_background).reserve(obj)


def wait(timeout=None):
    """Wait for every save this process queued; then raise edl.Error for the first that
    failed. Each failure is raised once: a later wait() waits only for later saves."""
    failed = None
    for p in list(_pending):
        try:
            p.wait(timeout)
        except _edl.Error as e:
            failed = failed or e
    if failed is not None:
        raise failed


def _join(obj, tensors):
    if isinstance(obj, _Ref):
        return tensors[obj.i]
    if isinstance(obj, dict):
        return type(obj)((k, _join(v, tensors)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_join(v, tensors) for v in obj)
    return obj


def _malformed(m, why):
    return _edl.error(_edl.EDL_EPROTO, f"checkpoint step {m.step} is malformed: {why}")


def _structure(m, trusted):
    """The structure's object and its tensor references, each checked against its shard
    (EDL_EPROTO for anything malformed: edl._structure says what is refused)."""
    shards = m.shards
    index = next((i for i, s in enumerate(shards) if s[2] == _STRUCTURE), None)
    try:
        meta = json.loads(m.metadata or "{}")
    except ValueError:
        meta = None
    form = meta.get("format") if isinstance(meta, dict) else None
    if form != _FORMAT:
        # another writer's checkpoint is not corrupt: no fall-back (which would drop it and
        # every newer one from the job's pointer)
        e = _edl.error(_edl.EDL_EPROTO, f"checkpoint step {m.step} was not saved by "
                       f"edl.checkpoint (format {form!r})")
        e.foreign = True
        raise e
    if index is None:
        raise _malformed(m, "it has no structure shard")
    raw = m.read(index)
    try:
        obj = pickle.loads(raw) if trusted else _structure_reader.load(raw)
        refs = _structure_reader.tensor_refs(obj, _Ref, raw)
    except _structure_reader.Malformed as e:
        raise _malformed(m, e) from None
    except Exception as e:  # noqa: BLE001 - a trusted pickle may raise anything
        raise _malformed(m, f"{type(e).__name__}: {e}") from None
    return obj, refs


def _reads(m, refs):
    """[(shard index, nbytes)] of each reference: the shard named for it, of its size."""
    by_name = {}
    for i, s in enumerate(m.shards):
        if s[2] in by_name:
            raise _malformed(m, f"two shards are named {s[2]!r}")
        by_name[s[2]] = i
    out = []
    for r in refs:
        index = by_name.get(f"t{r.i}")
        nbytes = _structure_reader.nbytes(r)
        if index is None or m.shards[index][3] != nbytes:
            raise _malformed(m, f"tensor {r.i} ({r.dtype} {list(r.shape)}) has no shard of "
                             f"{nbytes} bytes")
        out.append((index, nbytes))
    return out


def _load(m, map_location, trusted):
    structure, refs = _structure(m, trusted)
    places = _reads(m, refs)  # everything checked before the first allocation
    tensors, reads = {}, []
    for r, (index, nbytes) in zip(refs, places):
        t = torch.empty(r.shape, dtype=getattr(torch, r.dtype))
        tensors[r.i] = t
        if nbytes:
            reads.append((index, t.data_ptr(), nbytes))
    m.read_into(reads)
    for r in refs:
        where = r.device if map_location == "as_saved" else map_location
        if where != "cpu":
            tensors[r.i] = tensors[r.i].to(where)
    return _join(structure, tensors), m.step


def load_latest(url, map_location="cpu", trusted=False):
    """(obj, step) of the newest complete checkpoint at url, or None when the job has none.
    Tensors are read straight into new CPU tensors, then moved to map_location when it is
    not "cpu" ("as_saved": where they were saved). A malformed checkpoint (EDL_EPROTO) is
    passed over for the one before it, as a corrupt one is; one that another writer saved
    (not edl.checkpoint's format) is refused as it is."""
    began = time.monotonic()
    h = _loader(url)
    m = h.load_latest()
    why = []
    while m is not None:
        try:
            got = _load(m, map_location, trusted)
            _report(True, began, sum(s[3] for s in m.shards))
            return got
        except _edl.Error as e:
            if e.code != _edl.EDL_EPROTO or getattr(e, "foreign", False):
                raise
            why.append(str(e))
            print(f"edl.checkpoint: {e}; falling back to the checkpoint before it",
                  file=sys.stderr, flush=True)
        m = h.load_older(m.step)
    if not why:
        return None
    raise _edl.error(_edl.EDL_EPROTO, f"no intact checkpoint at {url}: {'; '.join(why)}")


def load(url, map_location="cpu", trusted=False):
    """obj of the newest complete checkpoint at url (edl.Error EDL_ENOTFOUND when none)."""
    got = load_latest(url, map_location, trusted)
    if got is None:
        raise _edl.error(_edl.EDL_ENOTFOUND, f"no checkpoint at {url} for job {context().job}")
    return got[0]

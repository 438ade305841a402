"""edl.torch: elastic PyTorch in one long-lived process per rank (Horovod Elastic's shape).

    import edl.torch as et
    state = et.State(model=model, optimizer=opt, sampler=sampler, epoch=0,
                     checkpoint="s3://bucket/run1", every=100)   # optional: rank 0 saves

    @et.elastic
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for idx in sampler.batches(state.epoch):     # this rank's share of a global batch
                ...forward, backward...
                et.allreduce_gradients(model)            # averaged over the ranks
                opt.step()
                state.commit()

    train(state)

DDP scripts keep theirs: ``model = et.DistributedDataParallel(model)`` (torch's DDP, built again
on each generation's group), ``et.DataLoader(dataset, batch_sampler=sampler, num_workers=2)``
(the sampler's position is what the loop took, not what the workers prefetched) and
``@et.elastic(state)`` over a function of no arguments (examples/python/train_ddp_elastic.py).

When the agent announces a new generation (a pod joined or left; ``edl run`` and the operator
in ``InProcess`` mode), the trainer is not restarted: at the next ``state.commit()`` every rank
agrees to stop, torch's default process group is rebuilt in place for the new world, and
``train`` is entered again with the state synchronised from a rank that has the newest commit
(a joining rank receives it). When a peer dies inside a collective (torch raises), each
survivor waits for the next generation, restores its last commit and does the same. A rank
whose pod leaves (scaled down, its pod deleted or preempted) is told so by its agent: it stops
at the next ``state.commit()`` together with the others, closes the group and exits 0, and the
survivors re-form from that commit with nothing redone. Outside edl the group is a world of one
and the script runs as a single process. With ``checkpoint=url`` trainers that start with no
state in the job resume from the newest checkpoint there (State says which shape it reads and
writes; one it cannot resume from raises CheckpointMismatch).

What edl's C side does here: the agent's announcements (edl/agent_link.h, through edl._edl) and
the probe that lets ranks connect to the new store the moment it listens. torch does the
collectives (gloo; nccl on GPUs) and this module only orders them.

``SparseEmbedding`` (edl/_embedding.py) is the parameter server's side: an EmbeddingBag whose
rows live on the servers (edl.ps, edl.fleet).
"""
import collections
import contextlib
import copy
import datetime
import functools
import gc
import json
import os
import sys
import time
import traceback
import weakref

import torch
import torch.distributed as dist

from . import Error, _edl, _link
from ._embedding import SparseEmbedding  # rows on the parameter server (edl.ps)

__all__ = ["State", "elastic", "ElasticSampler", "DataLoader", "DistributedDataParallel",
           "allreduce_gradients", "HostsUpdated", "CheckpointMismatch", "world", "SparseEmbedding"]

# The exceptions torch raises when a peer fails inside a collective or the store: torch 2.x
# names them (DistBackendError, DistNetworkError, DistStoreError, all DistError); torch 1.13
# raises a bare RuntimeError, recognised by its words as the last resort.
_COMM_TYPES = tuple(t for t in (getattr(dist, n, None) for n in (
    "DistError", "DistBackendError", "DistNetworkError", "DistStoreError")) if isinstance(t, type))
_COMM_WORDS = ("connection", "gloo", "nccl", "closed", "reset", "timed out", "timeout",
               "broken pipe", "peer", "socket", "abort", "unbound buffer", "transport")


class _Superseded(Exception):
    """A newer generation was announced while forming the group for an older one."""

    def __init__(self, assignment):
        super().__init__(f"generation {assignment['generation']} was announced")
        self.assignment = assignment


class HostsUpdated(Exception):
    """Raised by State.commit() on every rank at once when a new generation exists (its number
    in .generation): the elastic function is entered again in the new world."""

    def __init__(self, generation):
        super().__init__(f"generation {generation} was announced")
        self.generation = generation


class CheckpointMismatch(Error):
    """The newest checkpoint of State(checkpoint=url) does not fit the State: it is no dict, it
    lacks the model's or the optimizer's state dict, or one of them does not load. Every rank
    raises it, with the same message, in State.sync(); it is no communication failure, so
    elastic() lets it escape and the trainer fails with it instead of training from scratch
    (.name "EDL_EPROTO", as every edl.Error)."""

    def __init__(self, message):
        super().__init__(message)
        self.code, self.name = _edl.EDL_EPROTO, "EDL_EPROTO"


def _seconds(name, default):
    return float(os.environ.get(name, default))


def _log(msg):
    """One line on stderr, as the C libraries log (EDL_LOG_LEVEL=warn or error: silent)."""
    if os.environ.get("EDL_LOG_LEVEL", "info") in ("debug", "info"):
        print(f"edl.torch: {msg}", file=sys.stderr, flush=True)


class _World:
    """torch's default process group for the current generation, re-formed in place."""

    def __init__(self):
        self.link = _link()
        self.link.report_inprocess()  # the job then runs in process without --elastic-mode
        self.generation = None   # the generation the group is formed for
        self.rank, self.world_size = 0, 1
        self.pending = None      # the newest assignment the agent announced, not formed yet
        self.store = None
        self.timeout = datetime.timedelta(seconds=_seconds("EDL_TORCH_TIMEOUT_S", 60))
        self.backend = os.environ.get("EDL_TORCH_BACKEND") or (
            "nccl" if torch.cuda.is_available() else "gloo")
        self.device = torch.device("cuda", torch.cuda.current_device()) \
            if self.backend == "nccl" else torch.device("cpu")
        self.reforms = []        # seconds each re-formation took (for benchmarks and logs)
        self.on_destroy = []     # weak methods that drop what holds the group (DDP modules)
        self.link.report_graceful()  # a leave reaches this process as a control line, not SIGTERM

    # ---- what the agent says -------------------------------------------------------------

    def _initial(self):
        """The assignment the trainer was started with (its environment)."""
        return {"generation": self.link.generation, "rank": self.link.rank,
                "world_size": self.link.world_size,
                "master_addr": os.environ.get("MASTER_ADDR", "127.0.0.1"),
                "master_port": int(os.environ.get("MASTER_PORT", "0") or 0)}

    def poll(self):
        """The newest announced generation beyond the formed one (None: none): an assignment,
        or this pod's leave ({"generation": N, "leave": True}, the agent's last word)."""
        while True:
            a = self.link.poll()
            if a is None:
                break
            self.pending = a
        if self.pending and self.pending["generation"] <= (self.generation or 0):
            self.pending = None
        return self.pending

    def wait_beyond(self, generation, timeout_s):
        """Block until the agent announces a generation beyond `generation`, or this pod's
        leave (None: none came within timeout_s, or there is no agent)."""
        end = time.monotonic() + timeout_s
        while True:
            a = self.poll()
            if a and (a.get("leave") or a["generation"] > generation):
                return a
            left = end - time.monotonic()
            if left <= 0 or not self.link.active:
                return None
            a = self.link.wait(int(min(left, 1.0) * 1000))
            if a:
                self.pending = a

    # ---- forming the group ---------------------------------------------------------------

    def _destroy(self):
        if not dist.is_initialized():
            return
        for drop in [d for d in self.on_destroy if d() is not None]:
            drop()()  # a DDP module built on the group lets go of it, so that its sockets close
        self.on_destroy = [d for d in self.on_destroy if d() is not None]
        if self.backend == "nccl":  # an NCCL communicator with a dead peer is aborted, not waited for
            abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
            try:
                if abort:
                    abort()
                else:
                    dist.group.WORLD._get_backend(self.device).abort()
            except Exception:  # noqa: BLE001 - aborting a broken group may fail; destroy anyway
                pass
        dist.destroy_process_group()
        self.store = None
        gc.collect()  # the group's last references go now: its sockets close, its peers see it

    def _newer(self, than):
        """Raise _Superseded when the agent announced a generation beyond `than`."""
        a = self.poll()
        if a and a["generation"] > than:
            raise _Superseded(a)

    def _store(self, a):
        """The generation's store: rank 0 opens it (listening before anyone connects, so no one
        waits for torch's one-second retry); the others connect once it listens."""
        rank, size = a["rank"], a["world_size"]
        if size == 1:
            return dist.HashStore()
        addr, port = a["master_addr"], a["master_port"]
        if rank == 0:
            return dist.TCPStore(host_name=addr, port=port, world_size=size, is_master=True,
                                 timeout=self.timeout, wait_for_workers=False)
        end = time.monotonic() + self.timeout.total_seconds()
        while True:  # rank 0 may never open it (dead): a newer generation replaces it then
            try:
                _edl.wait_listening(addr, port, 200)
                break
            except Error as e:
                if e.name != "EDL_ETIMEDOUT":
                    raise
                if time.monotonic() > end:
                    raise _edl.error(_edl.EDL_ETIMEDOUT, f"generation {a['generation']}: rank 0's "
                                     f"store at {addr}:{port} did not open within "
                                     f"{self.timeout.total_seconds():.0f} s") from None
                self._newer(a["generation"])
        return dist.TCPStore(host_name=addr, port=port, world_size=size, is_master=False,
                             timeout=self.timeout)

    def _gather(self, store, a):
        """Wait until every rank of the generation reached its store (so that the group's
        initialisation, which cannot be interrupted, does not wait for a rank that died): a
        newer generation announced meanwhile ends the wait."""
        if a["world_size"] == 1:
            return
        key = f"edl/joined/{a['generation']}"
        store.add(key, 1)
        end = time.monotonic() + self.timeout.total_seconds()
        while store.add(key, 0) < a["world_size"]:
            self._newer(a["generation"])
            if time.monotonic() > end:
                raise RuntimeError(f"generation {a['generation']}: timed out waiting for every "
                                   f"rank at its store")
            time.sleep(0.005)

    def _form_once(self, a):
        self._destroy()
        self.store = self._store(a)
        self._gather(self.store, a)
        dist.init_process_group(self.backend, store=self.store, rank=a["rank"],
                                world_size=a["world_size"], timeout=self.timeout)

    def _leave(self, a):
        """This pod left the job at generation a: close the group (every rank agreed to move on
        at a commit, so none waits in it) and end the process with 0."""
        _log(f"generation {a['generation']}: this pod leaves the job; rank {self.rank} of "
             f"generation {self.generation} stops at this commit and exits 0")
        self._destroy()
        try:  # its interpreter's teardown yields the CPU to the survivors' re-formation
            os.nice(19)
        except OSError:
            pass
        raise SystemExit(0)

    def form(self, a):
        """Build the default process group for assignment a (the old one destroyed first), or
        for a newer one announced while forming; a leave ends the process (_leave)."""
        t0 = time.monotonic()
        while True:
            if a.get("leave"):
                self._leave(a)
            try:
                self._form_once(a)
                break
            except _Superseded as s:
                a = s.assignment
            except RuntimeError:  # rank 0's store went away with its generation
                newer = self.wait_beyond(a["generation"], 1.0)
                if newer is None:
                    raise
                a = newer
        first = self.generation is None
        self.generation, self.rank, self.world_size = a["generation"], a["rank"], a["world_size"]
        self.pending = None
        self.reforms.append(time.monotonic() - t0)
        if self.link.active:
            _log(f"generation {self.generation}: rank {self.rank} of {self.world_size} (pid "
                 f"{os.getpid()}), {'formed' if first else 're-formed in place'} in "
                 f"{self.reforms[-1]:.3f} s")

    def ensure(self):
        """Form the group for the newest generation, if not formed yet. A trainer the agent
        started ahead of its pod's membership (generation 0: it has imported torch while the
        job decided) waits here for its first assignment."""
        if self.generation is not None:
            return
        first = self.poll()
        if first is None and self.link.active and self.link.generation == 0:
            _log("started ahead of membership: waiting for the first generation")
            self.link.report_ready()
            while first is None:
                first = self.link.wait(1000)
        self.form(first or self._initial())

    # ---- agreeing to move on -------------------------------------------------------------

    def agreed_generation(self):
        """Every rank's newest announced generation, agreed by one small allreduce."""
        seen = self.poll()
        t = torch.tensor([seen["generation"] if seen else self.generation], dtype=torch.int64,
                         device=self.device)
        if self.world_size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def reform_to(self, generation, timeout_s):
        """Re-form for the announced generation `generation` or a later one (or leave, when
        this pod's leave was announced: the others may have agreed on a later generation)."""
        p = self.pending
        a = p if p and (p.get("leave") or p["generation"] >= generation) else \
            self.wait_beyond(generation - 1, timeout_s)
        if a is None:
            raise _edl.error(_edl.EDL_ETIMEDOUT, f"generation {generation} was agreed on but the "
                             f"agent did not announce it within {timeout_s:.0f} s")
        self.form(a)


_the_world = None


def world():
    """The process group's keeper (its generation, rank, world size, re-formation times)."""
    global _the_world
    if _the_world is None:
        _the_world = _World()
    return _the_world


def _is_comm_error(e):
    """e is torch's report of a failed collective or store (a peer died or left): one of
    torch's distributed exception types, or (torch 1.13) a RuntimeError naming the transport."""
    if isinstance(e, _COMM_TYPES):
        return True
    if type(e) is not RuntimeError:  # its subclasses (NotImplementedError...) are the script's
        return False
    text = str(e).lower()
    return any(w in text for w in _COMM_WORDS)


def _record_own_error(e):
    """Leave the script's own exception (no communication failure) in TORCHELASTIC_ERROR_FILE,
    as torch's ``@record`` writes it, marked ``edl_own_error``: the agent puts its type and
    message in the pod's status and the job server fails the job at once instead of restarting
    it into the same exception (docs/elastic.md, "How failures are judged")."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or isinstance(e, Error):  # edl's own errors (etcd, storage) are not the script's
        return
    doc = {"message": {"message": f"{type(e).__name__}: {e}",
                       "extraInfo": {"py_callstack": traceback.format_exc(),
                                     "timestamp": str(int(time.time()))}},
           "edl_own_error": True}
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f)
    except OSError as err:
        _log(f"cannot write the error file {path}: {err}")


# ---- the elastic state --------------------------------------------------------------------

def _stateful(v):
    return callable(getattr(v, "state_dict", None)) and \
        callable(getattr(v, "load_state_dict", None))


def _snapshot_tensors(d):
    return {k: (v.detach().clone() if torch.is_tensor(v) else copy.deepcopy(v))
            for k, v in d.items()}


_PARTS = ("model", "optimizer", "sampler")  # what a State holds besides its counters
_REQUIRED = ("model", "optimizer")           # what a checkpoint must hold to resume a State
_SHAPE = ("{'model': model.state_dict(), 'optimizer': optimizer.state_dict(), <counter>: value, "
          "...}, as state.save() and edl.checkpoint.save write it")


class State:
    """What survives a re-formation: a model, an optimizer, an ElasticSampler and any counters
    given as keywords (``State(model=m, optimizer=o, epoch=0, batch=0)``; read and set them as
    attributes: ``state.epoch``). ``commit()`` keeps a copy in memory; after a failure every
    rank goes back to its last commit, and after any re-formation the ranks take the state of
    the lowest rank holding the newest commit.

    Checkpoints: ``State(..., checkpoint=url, every=N)`` saves every N-th commit to url (with
    no url, every does nothing: ``checkpoint=os.environ.get("EDL_CHECKPOINT_URI")`` runs in a
    job with a checkpoint URI and without), and ``state.save()`` saves the last commit now.
    Rank 0 saves, alone (after a commit every rank holds the same state), as step
    ``state.commits``; the checkpoint is the dict
    ``{"model": ..., "optimizer": ..., "sampler": ..., <counter>: value, ...}``, the shape
    docs/python.md shows for edl.checkpoint.save. When no rank holds any state (a trainer of
    restart mode, or every trainer started again), rank 0 loads the newest checkpoint of url,
    the others receive it, and the commit count goes on from its step. A checkpoint of another
    shape is loaded as far as it fits: the model's and the optimizer's state dicts are needed
    (when the State has them), the sampler's position and the counters are taken when present
    (top-level keys naming the State's counters), other keys are ignored; what it lacks or what
    does not load is refused with CheckpointMismatch on every rank."""

    _OWN = ("model", "optimizer", "sampler", "checkpoint", "every")

    def __init__(self, model=None, optimizer=None, sampler=None, checkpoint=None, every=0,
                 **counters):
        if not isinstance(every, int) or every < 0:
            raise ValueError(f"State(every={every!r}): every is how many commits apart "
                             f"checkpoints are saved, an int >= 0 (0: only state.save())")
        object.__setattr__(self, "_parts", {"model": model, "optimizer": optimizer,
                                            "sampler": sampler, "checkpoint": checkpoint,
                                            "every": every})
        object.__setattr__(self, "_counters", dict(counters))
        object.__setattr__(self, "_saved", None)   # the last commit
        object.__setattr__(self, "_commits", -1)   # its number (-1: none)
        object.__setattr__(self, "_stored", -1)    # the step of the last checkpoint saved
        object.__setattr__(self, "_saves", [])     # saves under way (every=N)
        object.__setattr__(self, "_resets", [])    # register_reset_callbacks()

    def __getattr__(self, name):
        parts = object.__getattribute__(self, "_parts")
        if name in parts:
            return parts[name]
        counters = object.__getattribute__(self, "_counters")
        if name in counters:
            return counters[name]
        raise AttributeError(f"State has no counter {name!r} (give it as State({name}=...))")

    def __setattr__(self, name, value):
        if name in self._OWN:
            self._parts[name] = value
        else:
            self._counters[name] = value

    @property
    def commits(self):
        """How many commits this state has had (-1: none yet); a resumed State goes on from
        its checkpoint's step."""
        return self._commits

    # ---- local copies ----------------------------------------------------------------------

    def register_reset_callbacks(self, callbacks):
        """Call each of `callbacks` (no arguments) after every re-formation, once the state is
        synchronised and before the elastic function is entered again: for what a script
        rebuilds for a new world (an LR scaled by world().world_size, a DataLoader)."""
        self._resets.extend(callbacks)

    def _reset(self):
        for callback in self._resets:
            callback()

    def _counter_values(self):
        """The counters as plain values: a counter with state_dict()/load_state_dict() (an LR
        scheduler, a GradScaler) is kept as its state dict."""
        return {k: copy.deepcopy(v.state_dict() if _stateful(v) else v)
                for k, v in self._counters.items()}

    def _set_counters(self, values, only=False):
        """Take counter values (_counter_values' shape); only=False also drops plain counters
        the values lack, as a restore to a commit does."""
        if not only:
            for k in [k for k, v in self._counters.items() if k not in values and not _stateful(v)]:
                del self._counters[k]
        for k, v in values.items():
            if _stateful(self._counters.get(k)):
                self._counters[k].load_state_dict(copy.deepcopy(v))
            else:
                self._counters[k] = copy.deepcopy(v)

    def _capture(self):
        p = self._parts
        return {"model": _snapshot_tensors(p["model"].state_dict()) if p["model"] else None,
                "optimizer": copy.deepcopy(p["optimizer"].state_dict()) if p["optimizer"] else None,
                "sampler": p["sampler"].state_dict() if p["sampler"] else None,
                "counters": self._counter_values()}

    def _apply(self, saved):
        p = self._parts
        if p["model"] is not None and saved["model"] is not None:
            p["model"].load_state_dict(saved["model"])
        if p["optimizer"] is not None and saved["optimizer"] is not None:
            p["optimizer"].load_state_dict(saved["optimizer"])
        if p["sampler"] is not None and saved["sampler"] is not None:
            p["sampler"].load_state_dict(saved["sampler"])
        self._set_counters(saved["counters"])

    def _keep(self, commits):
        object.__setattr__(self, "_saved", self._capture())
        object.__setattr__(self, "_commits", commits)

    def restore(self):
        """Go back to the last commit (nothing when there is none)."""
        if self._saved is not None:
            self._apply(self._saved)

    def commit(self):
        """Keep this state as the one to go back to (and save it, every N-th commit of
        State(every=N)); then, if the agent announced a new generation, stop every rank here
        together (HostsUpdated) to re-form."""
        self._keep(self._commits + 1)
        self._save_every()
        w = world()
        w.link.report_step(self._commits)
        target = w.agreed_generation()
        if target > w.generation:
            raise HostsUpdated(target)

    # ---- checkpoints -----------------------------------------------------------------------

    def save(self, url=None, wait=True):
        """Save the last commit as checkpoint step ``state.commits`` of url (the State's
        checkpoint url by default). Rank 0 saves; on the other ranks, and for a commit already
        saved, it does nothing and returns None. wait=False returns an edl.checkpoint.Pending
        once the state is handed over (the upload goes on in the background; state.wait()
        waits for every save of this State)."""
        from . import checkpoint
        url = url or self._parts["checkpoint"]
        if not url:
            raise ValueError("State.save(): no url: give save(url) or State(checkpoint=url)")
        if self._saved is None:
            raise ValueError("State.save(): nothing committed yet: call state.commit() (or "
                             "run train under @edl.torch.elastic) first")
        if world().rank != 0 or self._commits <= self._stored:
            return None
        obj = {k: self._saved[k] for k in _PARTS if self._saved[k] is not None}
        obj.update(self._saved["counters"])
        step = self._commits
        object.__setattr__(self, "_stored", step)
        if wait:
            checkpoint.save(obj, step, url)
            return None
        pending = checkpoint.save_async(obj, step, url)
        self._saves.append((step, pending))
        return pending

    def _save_every(self):
        every = self._parts["every"]
        if not every or self._commits % every or not self._parts["checkpoint"] or world().rank:
            return
        for step, pending in [s for s in self._saves if s[1].done]:
            self._saves.remove((step, pending))
            try:
                pending.wait()
            except Error as e:  # a storage outage costs a checkpoint, not the training
                _log(f"checkpoint step {step} was not saved: {e}")
        self.save(wait=False)

    def wait(self):
        """Wait for this State's saves under way (edl.Error for the first that failed).
        elastic() calls it when the training function returns."""
        while self._saves:
            _, pending = self._saves.pop(0)
            pending.wait()

    def _resume_from(self, obj, step, url):
        """Take checkpoint obj as far as it fits (see the class); CheckpointMismatch names
        what it lacks or what does not load."""
        where = f"checkpoint step {step} at {url}"
        if not isinstance(obj, dict):
            raise CheckpointMismatch(f"{where} holds a {type(obj).__name__}, not the dict "
                                     f"State resumes from ({_SHAPE})")
        p = self._parts
        missing = [k for k in _REQUIRED if p[k] is not None and k not in obj]
        if missing:
            raise CheckpointMismatch(
                f"{where} has no {' and no '.join(map(repr, missing))} (its keys: "
                f"{', '.join(map(repr, obj)) or 'none'}): State resumes from {_SHAPE}; give "
                f"State(checkpoint=) another URI, or save the state in that shape")
        for k in _PARTS:
            if p[k] is not None and k in obj:
                try:
                    p[k].load_state_dict(obj[k])
                except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
                    raise CheckpointMismatch(f"{where}: its {k!r} does not fit this State's "
                                             f"{k}: {e}") from None
        taken = [k for k in self._counters if k in obj]
        self._set_counters({k: obj[k] for k in taken}, only=True)
        absent = [k for k in ("sampler",) if p[k] is not None and k not in obj]
        absent += [k for k in self._counters if k not in taken]
        ignored = [k for k in obj if (k not in _PARTS or p[k] is None) and k not in taken]
        _log(f"resumed from {where}" +
             (f"; not in it, kept as they were: {', '.join(absent)}" if absent else "") +
             (f"; ignored: {', '.join(map(str, ignored))}" if ignored else ""))

    def _load_checkpoint(self):
        """The newest checkpoint's step after taking it (-1: there is none)."""
        from . import checkpoint
        url = self._parts["checkpoint"]
        got = checkpoint.load_latest(url)
        if got is None:
            return -1
        obj, step = got
        self._resume_from(obj, step, url)
        return step

    def _resume(self, w):
        """Rank 0 loads the newest checkpoint; every rank learns its step (-1: none), or
        raises the same error when rank 0's load failed (none trains from scratch)."""
        outcome, failure = [None], None
        if w.rank == 0:
            try:
                outcome = [(self._load_checkpoint(), None)]
            except Exception as e:  # noqa: BLE001 - every rank must hear of any failure
                failure = e
                outcome = [(-1, (isinstance(e, CheckpointMismatch), getattr(e, "code", None),
                                 str(e) if isinstance(e, Error) else f"{type(e).__name__}: {e}"))]
        if w.world_size > 1:
            dist.broadcast_object_list(outcome, src=0,
                                       device=w.device if w.backend == "nccl" else None)
        if failure is not None:
            raise failure
        step, refused = outcome[0]
        if refused is not None:
            mismatch, code, message = refused
            raise CheckpointMismatch(message) if mismatch else \
                _edl.error(code or _edl.EDL_EIO, f"rank 0 could not load the checkpoint: "
                           f"{message}")
        return step

    # ---- synchronising the ranks -------------------------------------------------------------

    def _holder(self, w):
        """(newest commit number over the ranks, lowest rank holding it)."""
        t = torch.tensor([self._commits], dtype=torch.int64, device=w.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        newest = int(t.item())
        r = torch.tensor([w.rank if self._commits == newest else w.world_size],
                         dtype=torch.int64, device=w.device)
        dist.all_reduce(r, op=dist.ReduceOp.MIN)
        return newest, int(r.item())

    def sync(self):
        """Every rank takes the state of the lowest rank with the newest commit (rank 0's when
        nobody committed, after rank 0 loaded the newest checkpoint when one is configured),
        and commits it. Collective: every rank of the group calls it."""
        w = world()
        newest, holder = (self._commits, 0) if w.world_size == 1 else self._holder(w)
        if newest < 0 and self._parts["checkpoint"]:
            newest = self._resume(w)
            object.__setattr__(self, "_stored", newest)
        if w.world_size > 1:
            self._broadcast(holder, w)
        self._keep(max(newest, 0))

    def _broadcast(self, holder, w):
        if w.rank == holder and self._saved is not None and self._commits >= 0:
            self._apply(self._saved)  # what the others receive is the commit itself
        model = self._parts["model"]
        if model is not None:
            with torch.no_grad():
                for t in list(model.state_dict(keep_vars=True).values()):
                    data = t.data if t.device == w.device else t.data.to(w.device)
                    dist.broadcast(data, src=holder)
                    if data is not t.data:
                        t.data.copy_(data)
        rest = [None]
        if w.rank == holder:
            p = self._parts
            rest = [{"optimizer": p["optimizer"].state_dict() if p["optimizer"] else None,
                     "sampler": p["sampler"].state_dict() if p["sampler"] else None,
                     "counters": self._counter_values()}]
        dist.broadcast_object_list(rest, src=holder,
                                   device=w.device if w.backend == "nccl" else None)
        if w.rank != holder:
            got = rest[0]
            self._apply({"model": None, "optimizer": got["optimizer"],
                         "sampler": got["sampler"], "counters": got["counters"]})


def elastic(func):
    """Run func(state, ...) elastically: on a new generation (agreed at a commit) or a peer's
    failure inside a collective, re-form the group in place and call it again with the state
    synchronised. Outside edl it simply calls func once, in a world of one. ``@elastic(state)``
    does the same for a function that takes no state (its caller calls ``train()``)."""
    if isinstance(func, State):
        return functools.partial(_elastic_on, func)

    @functools.wraps(func)
    def run(state, *args, **kwargs):
        w = world()
        w.ensure()
        reformed = False
        while True:
            target, failure = None, None
            try:  # the sync too: a peer may die in its broadcasts (then it is recovered from)
                state.sync()
                if reformed:
                    state._reset()
                done = func(state, *args, **kwargs)
                state.wait()  # its last checkpoint is committed before the trainer ends
                return done
            except HostsUpdated as h:
                target = h.generation
            except Exception as e:  # noqa: BLE001 - recorded and raised again unless torch's
                if not _is_comm_error(e):
                    _record_own_error(e)
                    raise
                failure = f"{type(e).__name__}: {e}"
            reformed = True
            # (out of the except blocks: their tracebacks would keep the broken group, and with
            # it the sockets its peers wait on, alive through the re-formation)
            if failure is None:
                w.reform_to(target, _seconds("EDL_TORCH_REFORM_TIMEOUT_S", 120))
            else:
                _log(f"generation {w.generation}: a collective failed ({failure}); going back "
                     f"to commit {state.commits}")
                _recover(w, failure)
                state.restore()

    return run


def _elastic_on(state, func):
    """@elastic(state): func() run as elastic runs func(state)."""
    run = elastic(lambda _state, *args, **kwargs: func(*args, **kwargs))

    @functools.wraps(func)
    def call(*args, **kwargs):
        return run(state, *args, **kwargs)

    return call


def _recover(w, failure):
    """A collective failed: wait for the generation that replaces the broken one, re-form."""
    a = w.wait_beyond(w.generation, _seconds("EDL_TORCH_REFORM_TIMEOUT_S", 120))
    if a is None:
        raise RuntimeError(f"a collective failed ({failure}) and no new generation came")
    w.form(a)


# ---- gradients ------------------------------------------------------------------------------

def allreduce_gradients(model, average=True):
    """Average (as DDP does; average=False: sum) every parameter's gradient over the ranks, in
    one flat buffer. Averaging suits a loss that is a mean over the rank's own batch (the
    default nn.MSELoss(), nn.CrossEntropyLoss()); a loss already divided by the global batch
    (sum over the rank's samples / global batch size) needs average=False."""
    w = world()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if w.world_size == 1 or not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    if average:
        flat /= w.world_size
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset:offset + n].view_as(g))
        offset += n


class DistributedDataParallel(torch.nn.Module):
    """torch's DistributedDataParallel on the current generation's group, built again from the
    same module (no parameter copies) after every re-formation: gradients are bucketed and
    their allreduce overlaps the backward pass. Every keyword (find_unused_parameters,
    bucket_cap_mb, gradient_as_bucket_view, device_ids...) goes to torch's DDP; no_sync()
    and .module work as there, and state_dict() has its "module." keys."""

    def __init__(self, module, **kwargs):
        super().__init__()
        self.module = module
        object.__setattr__(self, "_kwargs", kwargs)
        object.__setattr__(self, "_ddp", None)        # torch's DDP (no submodule: no new keys)
        object.__setattr__(self, "_generation", None)
        world().on_destroy.append(weakref.WeakMethod(self._drop))

    def _drop(self):
        object.__setattr__(self, "_ddp", None)

    def _current(self):
        """torch's DDP for the formed generation (built on the first use after a formation:
        collective, as every rank's first forward is)."""
        w = world()
        w.ensure()
        if self._ddp is None or self._generation != w.generation:
            kwargs = dict(self._kwargs)
            if w.backend == "nccl" and "device_ids" not in kwargs:
                kwargs["device_ids"] = [w.device.index]
            object.__setattr__(self, "_ddp", None)
            object.__setattr__(self, "_ddp", torch.nn.parallel.DistributedDataParallel(
                self.module, **kwargs))
            object.__setattr__(self, "_generation", w.generation)
        return self._ddp

    def forward(self, *args, **kwargs):
        return self._current()(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally (torch's DDP.no_sync())."""
        with self._current().no_sync():
            yield


# ---- data -----------------------------------------------------------------------------------

class ElasticSampler:
    """Each sample of an epoch exactly once across re-formations: the epoch's order is a
    seeded permutation, and the position in it (how many samples the job has consumed) is part
    of the State. Each step consumes one global batch, split among the ranks of the current
    world; with ``global_batch_size`` it keeps its size whatever the world's (so training with
    joins and leaves computes what it computes without them), else it is ``batch_size`` per
    rank.

    Two ways to draw: ``for idx in sampler.batches(epoch)`` in the loop, or as the
    ``batch_sampler`` of ``edl.torch.DataLoader`` (torch's, with workers and prefetching) after
    ``sampler.set_epoch(epoch)``. There the position advances as the loop takes each batch, not
    as the workers prefetch, so a commit keeps what the loop consumed."""

    def __init__(self, dataset, batch_size=None, global_batch_size=None, shuffle=True, seed=0,
                 drop_last=False, epoch=0):
        if (batch_size is None) == (global_batch_size is None):
            raise ValueError("give batch_size (per rank) or global_batch_size, not both")
        for name, v in (("batch_size", batch_size), ("global_batch_size", global_batch_size)):
            if v is not None and not _count(v, 1):
                raise ValueError(f"ElasticSampler: {name}={v!r}; give a positive integer "
                                 f"(a batch of none would never advance)")
        self.n = dataset if isinstance(dataset, int) else len(dataset)
        self.batch_size, self.global_batch_size = batch_size, global_batch_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        if not _count(epoch, 0):
            raise ValueError(f"ElasticSampler: epoch={epoch!r}; give an integer >= 0")
        self.epoch, self.position = epoch, 0
        self.batch_total = 0   # samples in the current global batch, over every rank
        self._ahead = collections.deque()  # [start, end) of batches drawn, not yet taken
        self._deferred = False  # DataLoader says when the loop takes a batch (_taken)

    def state_dict(self):
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, d):
        for name in ("epoch", "position"):
            if not _count(d[name], 0):
                raise ValueError(f"ElasticSampler.load_state_dict: {name}={d[name]!r}; give an "
                                 f"integer >= 0 (a negative one would repeat samples)")
        self.epoch, self.position = d["epoch"], d["position"]

    def _order(self, epoch):
        if not self.shuffle:
            return torch.arange(self.n)
        g = torch.Generator()
        g.manual_seed(self.seed + epoch)
        return torch.randperm(self.n, generator=g)

    def set_epoch(self, epoch):
        """Draw `epoch` next (a new epoch starts at its beginning; the current one goes on
        from its position), as DistributedSampler.set_epoch."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def batches(self, epoch):
        """This rank's indices of each remaining global batch of `epoch`, the position
        advanced as each is drawn (the loop takes it at once)."""
        self.set_epoch(epoch)
        return self._walk(deferred=False)

    def __iter__(self):
        """The batches of the current epoch (set_epoch) from the position: a batch sampler."""
        return self._walk(deferred=self._deferred)

    def _walk(self, deferred):
        order = self._order(self.epoch)
        start = self.position
        self._ahead.clear()
        while start < self.n:
            w = world()
            size = self.global_batch_size or self.batch_size * w.world_size
            end = min(start + size, self.n)
            if end - start < size and self.drop_last:
                break
            mine = _share(end - start, w.rank, w.world_size)
            if deferred:
                self._ahead.append((start, end))
            else:  # counted before the step: a commit after it keeps it
                self.batch_total, self.position = end - start, end
            yield order[start + mine[0]:start + mine[1]].tolist()
            start = end

    def _taken(self):
        """The loop took the oldest batch drawn (DataLoader calls it)."""
        start, end = self._ahead.popleft()
        self.batch_total, self.position = end - start, end

    def __len__(self):
        size = self.global_batch_size or self.batch_size * world().world_size
        return (self.n // size) if self.drop_last else -(-self.n // size)


class DataLoader(torch.utils.data.DataLoader):
    """torch's DataLoader (every argument as there) that, given an ElasticSampler as its
    batch_sampler, moves the sampler's position as the loop takes each batch: with
    num_workers > 0 the workers prefetch prefetch_factor x num_workers batches ahead, and a
    commit must keep only what the loop consumed (exactly once across re-formations)."""

    def __iter__(self):
        sampler = self.batch_sampler
        if not isinstance(sampler, ElasticSampler):
            yield from super().__iter__()
            return
        sampler._deferred = True
        try:
            for batch in super().__iter__():
                sampler._taken()
                yield batch
        finally:
            sampler._deferred = False


def _count(v, least):
    """v is an integer (Python's or numpy's, not a bool) of at least `least`."""
    return not isinstance(v, bool) and hasattr(v, "__index__") and v.__index__() >= least


def _share(count, rank, size):
    """[begin, end) of rank's part of count items split as evenly as possible."""
    base, extra = divmod(count, size)
    begin = rank * base + min(rank, extra)
    return begin, begin + base + (1 if rank < extra else 0)

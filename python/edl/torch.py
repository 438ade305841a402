"""edl.torch: elastic PyTorch in one long-lived process per rank (Horovod Elastic's shape).

    import edl.torch as et
    state = et.State(model=model, optimizer=opt, sampler=sampler, epoch=0)

    @et.elastic
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for idx in sampler.batches(state.epoch):     # this rank's share of a global batch
                ...forward, backward...
                et.allreduce_gradients(model)            # sum over the ranks
                opt.step()
                state.commit()

    train(state)

When the agent announces a new generation (a pod joined or left; ``edl run`` and the operator
in ``InProcess`` mode), the trainer is not restarted: at the next ``state.commit()`` every rank
agrees to stop, torch's default process group is rebuilt in place for the new world, and
``train`` is entered again with the state synchronised from a rank that has the newest commit
(a joining rank receives it). When a peer dies inside a collective (torch raises), each
survivor waits for the next generation, restores its last commit and does the same. Outside
edl the group is a world of one and the script runs as a single process.

What edl's C side does here: the agent's announcements (edl/agent_link.h, through edl._edl) and
the probe that lets ranks connect to the new store the moment it listens. torch does the
collectives (gloo; nccl on GPUs) and this module only orders them.

``SparseEmbedding`` (edl/_embedding.py) is the parameter server's side: an EmbeddingBag whose
rows live on the servers (edl.ps, edl.fleet).
"""
import copy
import datetime
import functools
import gc
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

from . import Error, _edl, _link
from ._embedding import SparseEmbedding  # rows on the parameter server (edl.ps)

__all__ = ["State", "elastic", "ElasticSampler", "allreduce_gradients", "HostsUpdated",
           "world", "SparseEmbedding"]

# Words of the exceptions torch raises when a peer fails inside a collective.
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

    # ---- what the agent says -------------------------------------------------------------

    def _initial(self):
        """The assignment the trainer was started with (its environment)."""
        return {"generation": self.link.generation, "rank": self.link.rank,
                "world_size": self.link.world_size,
                "master_addr": os.environ.get("MASTER_ADDR", "127.0.0.1"),
                "master_port": int(os.environ.get("MASTER_PORT", "0") or 0)}

    def poll(self):
        """The newest announced generation beyond the formed one (None: none)."""
        while True:
            a = self.link.poll()
            if a is None:
                break
            self.pending = a
        if self.pending and self.pending["generation"] <= (self.generation or 0):
            self.pending = None
        return self.pending

    def wait_beyond(self, generation, timeout_s):
        """Block until the agent announces a generation beyond `generation` (None: none came
        within timeout_s, or there is no agent)."""
        end = time.monotonic() + timeout_s
        while True:
            a = self.poll()
            if a and a["generation"] > generation:
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

    def form(self, a):
        """Build the default process group for assignment a (the old one destroyed first), or
        for a newer one announced while forming."""
        t0 = time.monotonic()
        while True:
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
        """Re-form for the announced generation `generation` or a later one."""
        a = self.pending if self.pending and self.pending["generation"] >= generation else \
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

def _snapshot_tensors(d):
    return {k: (v.detach().clone() if torch.is_tensor(v) else copy.deepcopy(v))
            for k, v in d.items()}


class State:
    """What survives a re-formation: a model, an optimizer, an ElasticSampler and any counters
    given as keywords (``State(model=m, optimizer=o, epoch=0, batch=0)``; read and set them as
    attributes: ``state.epoch``). ``commit()`` keeps a copy in memory; after a failure every
    rank goes back to its last commit, and after any re-formation the ranks take the state of
    the lowest rank holding the newest commit. With ``checkpoint=url`` and no rank holding any
    state (a whole job restarted), rank 0 loads the newest checkpoint of url first."""

    _OWN = ("model", "optimizer", "sampler", "checkpoint")

    def __init__(self, model=None, optimizer=None, sampler=None, checkpoint=None, **counters):
        object.__setattr__(self, "_parts", {"model": model, "optimizer": optimizer,
                                            "sampler": sampler, "checkpoint": checkpoint})
        object.__setattr__(self, "_counters", dict(counters))
        object.__setattr__(self, "_saved", None)   # the last commit
        object.__setattr__(self, "_commits", -1)   # its number (-1: none)

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
        """How many commits this state has had (-1: none yet)."""
        return self._commits

    # ---- local copies ----------------------------------------------------------------------

    def _capture(self):
        p = self._parts
        return {"model": _snapshot_tensors(p["model"].state_dict()) if p["model"] else None,
                "optimizer": copy.deepcopy(p["optimizer"].state_dict()) if p["optimizer"] else None,
                "sampler": p["sampler"].state_dict() if p["sampler"] else None,
                "counters": copy.deepcopy(self._counters)}

    def _apply(self, saved):
        p = self._parts
        if p["model"] is not None and saved["model"] is not None:
            p["model"].load_state_dict(saved["model"])
        if p["optimizer"] is not None and saved["optimizer"] is not None:
            p["optimizer"].load_state_dict(saved["optimizer"])
        if p["sampler"] is not None and saved["sampler"] is not None:
            p["sampler"].load_state_dict(saved["sampler"])
        self._counters.clear()
        self._counters.update(copy.deepcopy(saved["counters"]))

    def _keep(self, commits):
        object.__setattr__(self, "_saved", self._capture())
        object.__setattr__(self, "_commits", commits)

    def restore(self):
        """Go back to the last commit (nothing when there is none)."""
        if self._saved is not None:
            self._apply(self._saved)

    def commit(self):
        """Keep this state as the one to go back to; then, if the agent announced a new
        generation, stop every rank here together (HostsUpdated) to re-form."""
        self._keep(self._commits + 1)
        w = world()
        w.link.report_step(self._commits)
        target = w.agreed_generation()
        if target > w.generation:
            raise HostsUpdated(target)

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

    def _load_checkpoint(self):
        from . import checkpoint
        got = checkpoint.load_latest(self._parts["checkpoint"])
        if got is not None:
            obj, step = got
            self._apply(obj)

    def sync(self):
        """Every rank takes the state of the lowest rank with the newest commit (rank 0's when
        nobody committed, after rank 0 loaded the newest checkpoint when one is configured),
        and commits it. Collective: every rank of the group calls it."""
        w = world()
        newest, holder = (self._commits, 0) if w.world_size == 1 else self._holder(w)
        if newest < 0 and w.rank == 0 and self._parts["checkpoint"]:
            self._load_checkpoint()
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
                     "counters": self._counters}]
        dist.broadcast_object_list(rest, src=holder,
                                   device=w.device if w.backend == "nccl" else None)
        if w.rank != holder:
            got = rest[0]
            self._apply({"model": None, "optimizer": got["optimizer"],
                         "sampler": got["sampler"], "counters": got["counters"]})


def elastic(func):
    """Run func(state, ...) elastically: on a new generation (agreed at a commit) or a peer's
    failure inside a collective, re-form the group in place and call it again with the state
    synchronised. Outside edl it simply calls func once, in a world of one."""

    @functools.wraps(func)
    def run(state, *args, **kwargs):
        w = world()
        w.ensure()
        state.sync()
        while True:
            target, failure = None, None
            try:
                return func(state, *args, **kwargs)
            except HostsUpdated as h:
                target = h.generation
            except RuntimeError as e:
                if isinstance(e, Error) or not _is_comm_error(e):
                    _record_own_error(e)
                    raise
                failure = str(e)
            except Exception as e:  # noqa: BLE001 - recorded and raised again
                _record_own_error(e)
                raise
            # (out of the except blocks: their tracebacks would keep the broken group, and with
            # it the sockets its peers wait on, alive through the re-formation)
            if failure is None:
                w.reform_to(target, _seconds("EDL_TORCH_REFORM_TIMEOUT_S", 120))
            else:
                _recover(w, failure)
                state.restore()
            state.sync()

    return run


def _recover(w, failure):
    """A collective failed: wait for the generation that replaces the broken one, re-form."""
    a = w.wait_beyond(w.generation, _seconds("EDL_TORCH_REFORM_TIMEOUT_S", 120))
    if a is None:
        raise RuntimeError(f"a collective failed ({failure}) and no new generation came")
    w.form(a)


# ---- gradients ------------------------------------------------------------------------------

def allreduce_gradients(model, average=False):
    """Sum (or average) every parameter's gradient over the ranks, in one flat buffer."""
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


# ---- data -----------------------------------------------------------------------------------

class ElasticSampler:
    """Each sample of an epoch exactly once across re-formations: the epoch's order is a
    seeded permutation, and the position in it (how many samples the job has consumed) is part
    of the State. Each step consumes one global batch, split among the ranks of the current
    world; with ``global_batch_size`` it keeps its size whatever the world's (so training with
    joins and leaves computes what it computes without them), else it is ``batch_size`` per
    rank."""

    def __init__(self, dataset, batch_size=None, global_batch_size=None, shuffle=True, seed=0,
                 drop_last=False):
        if (batch_size is None) == (global_batch_size is None):
            raise ValueError("give batch_size (per rank) or global_batch_size, not both")
        self.n = dataset if isinstance(dataset, int) else len(dataset)
        self.batch_size, self.global_batch_size = batch_size, global_batch_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch, self.position = 0, 0
        self.batch_total = 0   # samples in the current global batch, over every rank

    def state_dict(self):
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, d):
        self.epoch, self.position = d["epoch"], d["position"]

    def _order(self, epoch):
        if not self.shuffle:
            return torch.arange(self.n)
        g = torch.Generator()
        g.manual_seed(self.seed + epoch)
        return torch.randperm(self.n, generator=g)

    def batches(self, epoch):
        """This rank's indices of each remaining global batch of `epoch` (a new epoch starts
        at its beginning; the current one goes on from its position)."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0
        order = self._order(epoch)
        while self.position < self.n:
            w = world()
            size = self.global_batch_size or self.batch_size * w.world_size
            end = min(self.position + size, self.n)
            if end - self.position < size and self.drop_last:
                break
            mine = _share(end - self.position, w.rank, w.world_size)
            start = self.position
            self.batch_total = end - start
            self.position = end  # counted before the step: a commit after it keeps it
            yield order[start + mine[0]:start + mine[1]].tolist()

    def __len__(self):
        size = self.global_batch_size or self.batch_size * world().world_size
        return (self.n // size) if self.drop_last else -(-self.n // size)


def _share(count, rank, size):
    """[begin, end) of rank's part of count items split as evenly as possible."""
    base, extra = divmod(count, size)
    begin = rank * base + min(rank, extra)
    return begin, begin + base + (1 if rank < extra else 0)

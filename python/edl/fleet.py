"""edl.fleet: Paddle Fleet's role API for parameter-server jobs, over edl_fleet (edl/ps.h).

    import edl.fleet as fleet
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True                        # async (the default); False: sync
    strategy.a_sync_configs = {"k_steps": 10}     # k_steps > 0: geo, syncing every 10 steps
    fleet.init(strategy=strategy)
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()                        # edl-ps's server in this process
    else:
        fleet.init_worker()                       # connect; the trainer of the mode
        ...edl.ps tables, edl.torch.SparseEmbedding; fleet.step() after each batch...
        fleet.barrier_worker()
        fleet.stop_worker()

The roles come from the environment that Paddle's launchers and edl's agent give both roles
(TRAINING_ROLE, PADDLE_PSERVERS_IP_PORT_LIST, PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ID, POD_IP,
PADDLE_PORT, EDL_JOB_SECRET_FILE; docs/ps.md), so a script runs unchanged under ``edl run
--ps`` and on Kubernetes. Under edl the servers are elastic: both roles follow the job's map of
servers in etcd, servers hand their shards over when they leave, and the workers re-route.
"""
from . import _edl
from .ps import MODES, Worker

__all__ = ["DistributedStrategy", "Strategy", "init", "is_worker", "is_server", "is_first_worker",
           "worker_index", "worker_num", "server_num", "server_endpoints", "mode",
           "init_worker", "init_server", "run_server", "stop_worker", "barrier_worker", "step",
           "worker"]

_fleet = None       # the _edl.Fleet of init()
_worker = None      # the edl.ps.Worker of init_worker()


class DistributedStrategy:
    """The update mode of the job's trainers: ``mode`` is "sync", "async", "half_async" or
    "geo" (``geo_every``: GEO's steps between syncs; ``threads``: half_async's threads that push
    and step). Paddle's spelling works too: ``a_sync = False`` is sync, ``a_sync = True`` async,
    and ``a_sync_configs = {"k_steps": k}`` with k > 0 geo every k steps. Without a strategy the
    mode is EDL_PS_MODE's (async by default)."""

    def __init__(self, mode="async", geo_every=10, threads=1):
        self.mode, self.geo_every, self.threads = mode, geo_every, threads
        self._check()

    def _check(self):
        if self.mode not in MODES:
            raise ValueError(f"edl.fleet: mode {self.mode!r}: one of {', '.join(MODES)}")
        if not isinstance(self.geo_every, int) or self.geo_every < 1:
            raise ValueError(f"edl.fleet: geo_every {self.geo_every!r}: an int >= 1")
        if not isinstance(self.threads, int) or self.threads < 1:
            raise ValueError(f"edl.fleet: threads {self.threads!r}: an int >= 1")

    @property
    def a_sync(self):
        return self.mode != "sync"

    @a_sync.setter
    def a_sync(self, value):
        if not value:
            self.mode = "sync"
        elif self.mode == "sync":
            self.mode = "async"

    @property
    def a_sync_configs(self):
        return {"k_steps": self.geo_every if self.mode == "geo" else 0}

    @a_sync_configs.setter
    def a_sync_configs(self, configs):
        k = configs.get("k_steps", 0)
        if k and k > 0:
            self.mode, self.geo_every = "geo", int(k)
        elif self.mode == "geo":
            self.mode = "async"
        self._check()

    def __repr__(self):
        extra = f", geo_every={self.geo_every}" if self.mode == "geo" else ""
        return f"edl.fleet.DistributedStrategy(mode={self.mode!r}{extra})"


Strategy = DistributedStrategy


def init(role_maker=None, is_collective=False, strategy=None):
    """Read this process's role and the job's servers from the environment; a strategy picks
    the mode (else EDL_PS_MODE). edl.Error EDL_ECONFIG names a missing or bad variable."""
    global _fleet
    if is_collective:
        raise ValueError("edl.fleet is the parameter-server side; collective training is "
                         "edl.torch's (torch.distributed re-formed in place)")
    if role_maker is not None:
        raise ValueError("edl.fleet: the roles come from the environment (Paddle's "
                         "PaddleCloudRoleMaker's variables); pass no role_maker")
    if _fleet is None:
        _fleet = _edl.Fleet()
    if strategy is not None:
        strategy._check()
        _fleet.set_mode(strategy.mode, strategy.geo_every, strategy.threads)


def _need():
    if _fleet is None:
        raise _edl.error(_edl.EDL_EINVAL, "edl.fleet: call edl.fleet.init() first")
    return _fleet


def _roles():
    return _need().roles()


def is_worker():
    return not _roles()["server"]


def is_server():
    return _roles()["server"]


def is_first_worker():
    return is_worker() and worker_index() == 0


def worker_index():
    """This worker's index (PADDLE_TRAINER_ID); -1 for a server."""
    return _roles()["worker_index"]


def worker_num():
    return _roles()["worker_num"]


def server_num():
    return _roles()["server_num"]


def server_endpoints(to_string=False):
    """The servers "ip:port" the job started with (under edl the workers follow the job's
    newer maps by themselves)."""
    eps = _roles()["server_endpoints"]
    return ",".join(eps) if to_string else eps


def mode():
    """The workers' mode: "sync", "async", "half_async" or "geo"."""
    return _roles()["mode"]


def init_worker():
    """Connect to every server and open the trainer of the mode: the worker that tables and
    SparseEmbedding use by default (``worker()``)."""
    global _worker
    f = _need()
    if _worker is not None and not _worker.closed:
        return
    f.init_worker()
    _worker = Worker(_fleet=f)
    _worker.trainers = worker_num()


def init_server(*args, **kwargs):
    """Paddle loads a model here; edl's servers load their shards from the job's newest PS
    checkpoint by themselves (EDL_CHECKPOINT_URI), so this only checks the role."""
    if args or kwargs:
        raise ValueError("edl.fleet.init_server(): takes nothing; the servers restore from "
                         "the job's PS checkpoints (EDL_CHECKPOINT_URI) by themselves")
    if not is_server():
        raise _edl.error(_edl.EDL_EINVAL, "init_server(): this process is a worker "
                         "(TRAINING_ROLE=TRAINER)")


def run_server():
    """Serve the tables, the same server as edl-ps, in this process (its loops on threads of
    their own, the GIL released) until SIGTERM or SIGINT; under edl, follow the job's map of
    servers and hand the shards over before leaving."""
    _need().run_server()


def worker():
    """The fleet's edl.ps.Worker (init_worker() first)."""
    if _worker is None or _worker.closed:
        raise _edl.error(_edl.EDL_EINVAL, "edl.fleet: no worker: call edl.fleet.init_worker() "
                         "first (or give the tables a worker=edl.ps.Worker(...))")
    return _worker


def step():
    """The end of a training step in the mode (sync's barrier, half_async's send, geo's sync
    every geo_every steps; nothing to wait for in async). Paddle does this inside its executor;
    a PyTorch loop calls it after each batch's pushes."""
    worker().step()


def barrier_worker():
    """Wait here until every worker has arrived (through the servers)."""
    worker()._w.barrier()


def stop_worker():
    """Flush the pushes still queued, then close the trainer and the connections."""
    global _worker
    if _worker is not None:
        w, _worker = _worker, None
        w.close()

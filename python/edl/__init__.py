"""edl for Python trainers: the elastic deep-learning control plane's C libraries, from Python.

    import edl
    ctx = edl.context()          # this process's job, rank, world size, generation, role
    edl.torch                    # PyTorch re-formed in place: State, elastic, ElasticSampler
    edl.checkpoint               # checkpoints of tensors on file:// and s3://

Outside edl (a script started by hand) the context is a world of one: rank 0, world size 1,
generation 0, and ``bool(edl.context())`` is False; the script runs unchanged as one process.
Every failure of the C side is an ``edl.Error`` whose ``.name`` is the EDL_E* code's name
("EDL_ENOTFOUND") and whose message says what failed.
"""
import os

from . import _edl
from ._edl import Error

__all__ = ["Error", "Context", "context"]
__version__ = "0.1.0"

_the_link = None


def _link():
    """The process's one link to its edl-agent (inactive outside edl)."""
    global _the_link
    if _the_link is None:
        _the_link = _edl.Link()
    return _the_link


class Context:
    """Where this process stands in its job, as its agent told it.

    ``rank``, ``world_size`` and ``generation`` follow the re-formations of an in-process job
    (they are read from the agent's link each time). ``members`` reads the job's generation
    from its etcd: [(pod, rank)] of the workers.
    """

    def __init__(self, link):
        self._link = link

    @property
    def active(self):
        """True under an edl agent."""
        return self._link.active

    def __bool__(self):
        return self.active

    @property
    def job(self):
        return os.environ.get("EDL_JOB_ID") if self.active else None

    @property
    def pod(self):
        return os.environ.get("EDL_POD_ID") if self.active else None

    @property
    def role(self):
        """"worker", "ps" or "teacher"."""
        return os.environ.get("EDL_ROLE_NAME", "worker") if self.active else "worker"

    @property
    def rank(self):
        return self._link.rank

    @property
    def world_size(self):
        return self._link.world_size

    @property
    def generation(self):
        return self._link.generation

    @property
    def elastic_mode(self):
        """"inprocess" (the trainer is re-formed in place), "restart", or "auto" (not given:
        the trainer's choice; edl.torch tells its agent it re-forms in process)."""
        return os.environ.get("EDL_ELASTIC_MODE", "restart")

    @property
    def members(self):
        if not self.active:
            return [(None, 0)]
        return [tuple(m) for m in _edl.generation()["members"]]

    def __repr__(self):
        if not self.active:
            return "edl.Context(outside edl: rank 0 of 1)"
        return (f"edl.Context(job={self.job!r}, pod={self.pod!r}, role={self.role!r}, "
                f"rank={self.rank}, world_size={self.world_size}, "
                f"generation={self.generation})")


def context():
    """This process's place in its edl job (a world of one outside edl)."""
    return Context(_link())
